package cuda

import (
	"fmt"

	"ds4go/engine"
	"ds4go/model"
)

// The MTP block (engine.Drafter): its transformer block runs through the
// layer ops as layer Config.Layers (be.layer), its input and head here.

// dhead is a hyper-connection head: its mixing weights, scale (one float)
// and base, and the final norm.
type dhead struct {
	fn          *Weight
	scale, base Ptr
	norm        Ptr
}

// dmtp is the MTP block on the device.
type dmtp struct {
	block        dlayer
	eProj, hProj *Weight
	enorm, hnorm Ptr
	head         dhead
}

// layer returns block l: a layer, or the MTP block (l = Config.Layers).
func (be *Backend) layer(l int) *dlayer {
	if l == len(be.layers) && be.mtp != nil {
		return &be.mtp.block
	}
	return &be.layers[l]
}

// prepareMTP uploads the MTP block.
func (be *Backend) prepareMTP(m *model.MTP, hc hcPrep, comp compPrep) error {
	c := &be.cfg
	D, HC := c.Embed, c.HC
	mt := &dmtp{}
	if _, _, err := be.prepareLayer(&mt.block, &m.Block, hc, comp); err != nil {
		return fmt.Errorf("MTP block: %w", err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"e_proj", func() (e error) { mt.eProj, e = be.mat(m.EProj, 1, D, D); return }},
		{"h_proj", func() (e error) { mt.hProj, e = be.mat(m.HProj, 1, D, D); return }},
		{"enorm", func() (e error) { mt.enorm, _, e = be.vec(m.ENorm, D); return }},
		{"hnorm", func() (e error) { mt.hnorm, _, e = be.vec(m.HNorm, D); return }},
		{"norm", func() (e error) { mt.head.norm, _, e = be.vec(m.Norm, D); return }},
		{"hc_head_fn", func() (e error) { mt.head.fn, e = be.mat(m.HCHeadFn, 1, HC, HC*D); return }},
		{"hc_head_base", func() (e error) { mt.head.base, _, e = be.vec(m.HCHeadBase, HC); return }},
		{"hc_head_scale", func() (e error) { mt.head.scale, _, e = be.vec(m.HCHeadScale, 1); return }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("cuda: MTP %s: %w", s.what, err)
		}
	}
	be.mtp = mt
	return nil
}

// HasMTP reports whether the weights carry an MTP block (engine.Drafter).
func (be *Backend) HasMTP() bool { return be.mtp != nil }

// Verification passes' costs on the H200 with the full-size q2 synth at 8k,
// for a pass that commits no draft, in the paused policy's passes (one-token
// steps, every 4th checking its draft). Fast mode: 1.25 (cuda/NOTES.md v47:
// 128 tok/s verifying every draft at 0 %, 162 paused, 171 plain). Exact
// mode (v68, one process each against plain decoding of the same tokens):
// verifying every draft at 0 % ×0.707 of plain (106.74 against 151.02 tok/s),
// paused ×0.945 and ×0.939 (143.11 / 151.46, 138.98 / 147.99): ≈ 1.33.
const (
	draftCostFast  = 1.25
	draftCostExact = 1.33
)

// Verifying passes of deeper drafts (engine.Options.DraftDepth) on the
// device's pipelined pass (engine.DeepSpecPipeliner), in the same unit:
// each mode's one-draft cost times a pass's time against a one-draft
// pass's, all drafts committed so that every pass is full (cuda/NOTES.md
// v72, one process each, 8k, 512 tokens, with the few-token Q8_0 products
// in two stages, OptMVFewNSFast / OptMVFewNSEx 2222): fast 253.81 tok/s
// with one draft (7.88 ms a pass), 299.34 with two (10.02 ms: ×1.272),
// 333.05 with three (12.01 ms: ×1.524); exact, in another call, 224.19
// with one (8.92 ms), 252.50 with two (11.88 ms: ×1.332), 285.39 with
// three (14.02 ms: ×1.571). Deeper than passDrafts they are not measured
// (0: not chosen).
var (
	draftDepthCostExact = [...]float64{2: 1.77, 3: 2.09}
	draftDepthCostFast  = [...]float64{2: 1.59, 3: 1.91}
)

// DraftDepthCost is engine.DraftDepthCoster's: what a verifying pass of k
// drafts costs in this backend's mode (one draft: DraftPassCost), 0 where
// it was not measured (four drafts and more), so that a session drafts
// deeper only where that pays: by the engine's policy (a pass of k drafts
// taken to commit 1 + a + … + a^k tokens at rate a): in exact mode three
// drafts from ≈ 76 % of drafts committed (two are never the best), in
// fast mode two from ≈ 68 % and three from ≈ 78 %.
func (be *Backend) DraftDepthCost(k int) float64 {
	costs := draftDepthCostFast[:]
	if be.exact() {
		costs = draftDepthCostExact[:]
	}
	switch {
	case k == 1:
		return be.DraftPassCost()
	case k > 1 && k < len(costs):
		return costs[k]
	}
	return 0
}

// DraftPassCost is engine.DraftCoster's: what a verifying pass costs in this
// backend's mode, so that the session's policy pauses speculation below
// its break-even acceptance (≈ 25 % fast, ≈ 33 % exact).
func (be *Backend) DraftPassCost() float64 {
	if be.exact() {
		return draftCostExact
	}
	return draftCostFast
}

// stageBuf holds an MTP batch's staged rows: main-model streams waiting for
// MTPEmbed, in rows [head, head+count) of a buffer of twice the batch's
// capacity (compacted to the front when an append would not fit).
type stageBuf struct {
	rows        Ptr // [2·cap][HC·Embed]
	head, count int
	// staged is recorded on the source batch's stream after a copy in,
	// used on the MTP batch's stream after its reads of the rows: each
	// stream waits for the other's before touching the rows.
	staged, used Event
	// post (ones) and comb (identity) make HCPost add e_proj's row to
	// every stream: h_k ← 1·e + Σ_j δ_jk·h_j.
	post, comb Ptr
}

func (st *stageBuf) release(d *Device) {
	for _, p := range []Ptr{st.rows, st.post, st.comb} {
		if p != 0 {
			d.Free(p)
		}
	}
	for _, e := range []Event{st.staged, st.used} {
		if e != 0 {
			d.DestroyEvent(e)
		}
	}
}

// mtpBatch returns bi's staging buffer, allocating it on first use.
func (be *Backend) mtpBatch(bi engine.Batch) (*batch, *stageBuf, error) {
	if be.mtp == nil {
		return nil, nil, fmt.Errorf("cuda: the model has no MTP block")
	}
	b, err := be.batchOf(bi)
	if err != nil {
		return nil, nil, err
	}
	if b.stage != nil {
		return b, b.stage, nil
	}
	d, c := be.dev, &be.cfg
	HC, w := c.HC, int64(c.HC*c.Embed)
	st := &stageBuf{}
	fail := func(err error) (*batch, *stageBuf, error) {
		st.release(d)
		return nil, nil, err
	}
	if st.rows, err = d.Malloc(4 * 2 * int64(b.cap) * w); err != nil {
		return fail(err)
	}
	post := make([]float32, b.cap*HC)
	comb := make([]float32, b.cap*HC*HC)
	for t := 0; t < b.cap; t++ {
		for j := 0; j < HC; j++ {
			post[t*HC+j] = 1
			comb[t*HC*HC+j*HC+j] = 1
		}
	}
	if st.post, err = be.upF32(post); err != nil {
		return fail(err)
	}
	if st.comb, err = be.upF32(comb); err != nil {
		return fail(err)
	}
	for _, e := range []*Event{&st.staged, &st.used} {
		if *e, err = d.NewEvent(); err != nil {
			return fail(err)
		}
	}
	b.stage = st
	return b, st, nil
}

// StageMTP appends rows [first, first+n) of src's streams to mb's staged
// rows (engine.Drafter). The copy runs on src's stream, after its chunk's
// work and before its next chunk's.
func (be *Backend) StageMTP(mbi, srci engine.Batch, first, n int) error {
	mb, st, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	src, err := be.batchOf(srci)
	if err != nil {
		return err
	}
	if first < 0 || n < 0 || first+n > src.n {
		return fmt.Errorf("cuda: stage rows [%d, %d) of a chunk of %d", first, first+n, src.n)
	}
	if st.count+n > mb.cap {
		return fmt.Errorf("cuda: staging %d rows after %d in a batch of %d", n, st.count, mb.cap)
	}
	if n == 0 {
		return nil
	}
	d := be.dev
	w := 4 * int64(be.cfg.HC*be.cfg.Embed)
	if st.head+st.count+n > 2*mb.cap {
		// head > cap ≥ count: the rows move to the front without overlap
		if err := d.CopyAsync(st.rows, st.rows+Ptr(int64(st.head)*w), int64(st.count)*w, mb.s); err != nil {
			return err
		}
		if err := d.Record(st.used, mb.s); err != nil {
			return err
		}
		st.head = 0
	}
	// A capture in progress on src ends here: the copy and the events stay
	// out of its graph.
	if err := src.flush(); err != nil {
		return err
	}
	if err := d.StreamWait(src.s, st.used); err != nil {
		return err
	}
	if err := d.CopyAsync(st.rows+Ptr(int64(st.head+st.count)*w), src.h+Ptr(int64(first)*w), int64(n)*w, src.s); err != nil {
		return err
	}
	if err := d.Record(st.staged, src.s); err != nil {
		return err
	}
	if err := d.StreamWait(mb.s, st.staged); err != nil {
		return err
	}
	st.count += n
	return nil
}

// DropStagedMTP keeps only the first keep staged rows (engine.Drafter).
func (be *Backend) DropStagedMTP(mbi engine.Batch, keep int) error {
	_, st, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	if keep < 0 {
		return fmt.Errorf("cuda: keep %d staged rows", keep)
	}
	st.count = min(st.count, keep)
	if st.count == 0 {
		st.head = 0
	}
	return nil
}

// MTPEmbed forms the MTP block's input streams from the oldest staged rows
// and the next tokens (engine.Drafter):
//
//	x_t,j = e_proj·enorm(embed(tokens[t])) + h_proj·hnorm(staged_t,j)
func (be *Backend) MTPEmbed(mbi engine.Batch, pos int, tokens []int32) error {
	return be.mtpEmbed(mbi, pos, tokens, 0, false)
}

// MTPEmbedDraft is MTPEmbed of a chunk that ends with MTPHeadDraft
// (engine.SpecPipeliner): with DS4_CUDA_MTP_GRAPH=1 the block's layer and
// head run as a graph, as a main chunk's layers do.
func (be *Backend) MTPEmbedDraft(mbi engine.Batch, pos int, tokens []int32) error {
	return be.mtpEmbed(mbi, pos, tokens, 0, true)
}

// mtpEmbed is MTPEmbed; graph: the work after it is recorded until the
// chunk's head (MTPHeadDraft) launches it. With at ≠ 0 (tokens nil) the
// chunk is one token, copied on the batch's stream from that device word
// (MTPEmbedNext); otherwise the chunk starts a pass's drafts
// (b.draftStart: its MTPHeadDraft is the pass's first).
func (be *Backend) mtpEmbed(mbi engine.Batch, pos int, tokens []int32, at Ptr, graph bool) error {
	b, st, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	n := len(tokens)
	if at != 0 {
		n = 1
	}
	if n == 0 || n > st.count || n > b.cap {
		return fmt.Errorf("cuda: MTP chunk of %d tokens with %d staged rows", n, st.count)
	}
	c, m, d := &be.cfg, be.mtp, be.dev
	for _, tok := range tokens {
		if tok < 0 || int(tok) >= c.Vocab {
			return fmt.Errorf("cuda: token %d out of range", tok)
		}
	}
	D, HC := c.Embed, c.HC
	b.releasePick()
	b.abortGraph()
	b.n, b.pos = n, pos
	b.xq8, b.xh = 0, 0
	b.mixFn = nil
	b.gq.onDevice = false
	b.gq.taken = b.gq.heads
	b.pq.taken = b.pq.heads
	b.draftStart = at == 0
	if at != 0 {
		if err := d.CopyAsync(b.tokens, at, 4, b.s); err != nil {
			return err
		}
	} else if err := b.setTokens(tokens); err != nil {
		return err
	}
	var e error
	buf := func(name string, cnt int) Ptr { return b.sc.getE(&e, name, 4*int64(cnt)) }
	emb, en, hn, ep := buf("mtp.e", n*D), buf("mtp.en", n*D), buf("mtp.hn", n*HC*D), buf("mtp.ep", n*D)
	if e != nil {
		return e
	}
	if err := d.GetRows(b.s, be.embd, b.tokens, n, emb, int64(D), 1, 0); err != nil {
		return err
	}
	if err := d.RMSNormRef(b.s, emb, int64(D), m.enorm, en, int64(D), D, n, c.NormEps); err != nil {
		return err
	}
	rows := st.rows + Ptr(4*int64(st.head)*int64(HC*D))
	if err := d.RMSNormRef(b.s, rows, int64(D), m.hnorm, hn, int64(D), D, n*HC, c.NormEps); err != nil {
		return err
	}
	if err := d.Record(st.used, b.s); err != nil {
		return err
	}
	if err := be.linear(b, en, D, n, linJob{w: m.eProj, y: ep, ldy: D}); err != nil {
		return err
	}
	if err := be.linear(b, hn, D, n*HC, linJob{w: m.hProj, y: b.h, ldy: D}); err != nil {
		return err
	}
	if err := d.HCPost(b.s, b.h, ep, st.post, st.comb, HC, D, n); err != nil {
		return err
	}
	st.head += n
	st.count -= n
	if st.count == 0 {
		st.head = 0
	}
	if graph && be.mtpGraph && n <= graphMaxTokens && be.opts.GraphLayers > 0 {
		return b.startSegment()
	}
	return nil
}

// MTPHead computes the MTP block's logits for the listed chunk rows
// (engine.Drafter).
func (be *Backend) MTPHead(mbi engine.Batch, rows []int, logits []float32) error {
	b, _, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	return be.headRows(b, rows, logits, &be.mtp.head)
}

var _ engine.Drafter = (*Backend)(nil)
var _ engine.DraftCoster = (*Backend)(nil)
