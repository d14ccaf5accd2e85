package cuda

import (
	"encoding/binary"
	"fmt"
	"time"

	"ds4go/engine"
)

// Speculative decoding's pass with its greedy choices on the device
// (engine.SpecPipeliner). The MTP block's head ends with Argmax into the
// main batch's result word i (the pass's i-th draft), which EmbedDraft
// copies into the verification chunk's token slots after the first, after
// an event; the verification's head ends with Argmax of each row r into
// word passDrafts + r and one copy of the words to pinned memory. A pass
// then waits on the host once, for those bytes, instead of downloading its
// rows of logits (≈ 0.5 MB each) and taking their argmax on the host; the
// MTP head's row is read in place (no gather through the host). A pass of
// several drafts (engine.DeepSpecPipeliner) runs the block again for each
// next draft with its token copied from the word of the draft before.

var (
	_ engine.SpecPipeliner     = (*Backend)(nil)
	_ engine.DeepSpecPipeliner = (*Backend)(nil)
)

// passDrafts is the most drafts a pipelined pass embeds: its verification
// is a chunk of at most passTokensMax tokens, the library's few-token
// products and the recorded graphs' largest.
const passDrafts = passTokensMax - 1

// resWords is the result words of a pass: the drafts, then the choices
// after each of the verification's rows.
const resWords = 2*passDrafts + 1

// specQueue is a main batch's state for the pipelined pass, made on first
// use.
type specQueue struct {
	logits   Ptr // the verification's rows of logits [passDrafts+1][Vocab]
	dlogits  Ptr // the MTP head's row [Vocab] (the MTP batch's stream)
	work     Ptr // Argmax's work area on the main stream
	dwork    Ptr // … on the MTP batch's stream
	res      Ptr // [resWords] int32: the drafts, the choices after each row
	pin      []byte
	drafted  Event // the latest draft's Argmax done (MTP stream)
	done     Event // the result's copy done (main stream)
	verified bool  // a HeadVerify whose result VerifyResult has not read
	drafts   int   // MTPHeadDraft's drafts not yet embedded by EmbedDraft
	vdrafts  int   // the drafts the latest verification chunk embedded
	vrows    int   // … its rows
	cq       candQueue
}

// candQueue is a main batch's state for the verification rows' min-p
// candidates (engine.SpecCandidater), made on the first SetVerifyFilter.
type candQueue struct {
	filt  *engine.PickFilter     // SetVerifyFilter's (nil: none)
	vfilt *engine.PickFilter     // the latest HeadVerify's (its candidates in pin)
	vrows int                    // … its rows
	work  Ptr                    // PickCandidates' argmax work area
	top   Ptr                    // … its greedy choice (int32)
	cnt   Ptr                    // … its counts (CandidateCTAs words)
	cand  [passDrafts + 1]Ptr    // … its output for each row of a pass (CandidateWords(pickCandCap) words each)
	pin   [passDrafts + 1][]byte // pinned: the rows' candidates
}

func (c *candQueue) init(d *Device) error {
	var err error
	words := 4 * int64(CandidateWords(pickCandCap))
	allocs := []devAlloc{{&c.work, ArgmaxWork}, {&c.top, 16}, {&c.cnt, 4 * CandidateCTAs}}
	for i := range c.cand {
		allocs = append(allocs, devAlloc{&c.cand[i], words})
	}
	if err := mallocEach(d, allocs); err != nil {
		return err
	}
	if err := d.Upload(c.work, make([]byte, ArgmaxWork)); err != nil {
		return err
	}
	for i := range c.pin {
		if c.pin[i], err = d.MallocHost(int(words)); err != nil {
			return err
		}
	}
	return nil
}

func (c *candQueue) release(d *Device) {
	for _, p := range append([]Ptr{c.work, c.top, c.cnt}, c.cand[:]...) {
		if p != 0 {
			d.Free(p)
		}
	}
	for _, p := range c.pin {
		if p != nil {
			d.FreeHost(p)
		}
	}
	*c = candQueue{}
}

func (q *specQueue) ready() bool { return q.res != 0 }

// devAlloc is one device allocation of mallocEach: n bytes into *p.
type devAlloc struct {
	p *Ptr
	n int64
}

// mallocEach makes each allocation in turn, stopping at the first that
// fails (those made before stay set, for the caller's release).
func mallocEach(d *Device, allocs []devAlloc) error {
	for _, a := range allocs {
		var err error
		if *a.p, err = d.Malloc(a.n); err != nil {
			return err
		}
	}
	return nil
}

func (q *specQueue) init(d *Device, vocab int) error {
	var err error
	allocs := []devAlloc{{&q.logits, 4 * int64(passDrafts+1) * int64(vocab)}, {&q.dlogits, 4 * int64(vocab)},
		{&q.work, ArgmaxWork}, {&q.dwork, ArgmaxWork}, {&q.res, 4 * resWords}}
	if err := mallocEach(d, allocs); err != nil {
		return err
	}
	for _, w := range []Ptr{q.work, q.dwork} {
		if err := d.Upload(w, make([]byte, ArgmaxWork)); err != nil {
			return err
		}
	}
	if err := d.Upload(q.res, make([]byte, 4*resWords)); err != nil {
		return err
	}
	if q.pin, err = d.MallocHost(4 * resWords); err != nil {
		return err
	}
	for _, e := range []*Event{&q.drafted, &q.done} {
		if *e, err = d.NewEvent(); err != nil {
			return err
		}
	}
	return nil
}

// release frees what init allocated (the batch's stream is idle; the MTP
// batch's work on the buffers is waited for here).
func (q *specQueue) release(d *Device) {
	if q.drafted != 0 {
		_ = d.SyncEvent(q.drafted)
	}
	for _, p := range []Ptr{q.logits, q.dlogits, q.work, q.dwork, q.res} {
		if p != 0 {
			d.Free(p)
		}
	}
	if q.pin != nil {
		d.FreeHost(q.pin)
	}
	for _, e := range []Event{q.drafted, q.done} {
		if e != 0 {
			d.DestroyEvent(e)
		}
	}
	q.cq.release(d)
	*q = specQueue{}
}

// MTPHeadDraft is MTPHead for one row of the MTP batch's chunk whose greedy
// choice, made on the device, is the next draft of the next EmbedDraft on b
// (engine.SpecPipeliner; after passDrafts drafts not embedded it fails).
func (be *Backend) MTPHeadDraft(mbi, bi engine.Batch, row int) error {
	mb, _, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if b == mb {
		return fmt.Errorf("cuda: MTP draft head: the MTP batch as the main one")
	}
	if row < 0 || row >= mb.n {
		return fmt.Errorf("cuda: MTP draft head: row %d of a chunk of %d", row, mb.n)
	}
	q := &b.sq
	if err := b.readyQueue(q, "MTP draft head"); err != nil {
		return err
	}
	if mb.draftStart { // a pass's first draft: none before it in this pass
		q.drafts, mb.draftStart = 0, false
	}
	if q.drafts >= passDrafts {
		return fmt.Errorf("cuda: MTP draft head: %d drafts not embedded (at most %d a pass)", q.drafts, passDrafts)
	}
	d := be.dev
	D, V := be.cfg.Embed, be.cfg.Vocab
	if err := be.headIn(mb, &be.mtp.head); err != nil {
		return err
	}
	in := mb.headIn + Ptr(4*int64(row*D))
	if err := be.linear(mb, in, D, 1, linJob{w: be.out, y: q.dlogits, ldy: V}); err != nil {
		return err
	}
	if err := mb.finish(); err != nil {
		return err
	}
	// the result words are read by the main stream's copy of the pass
	// before (VerifyResult waited for it; the wait orders the streams too)
	if err := d.StreamWait(mb.s, q.done); err != nil {
		return err
	}
	if err := d.Argmax(mb.s, q.dlogits, V, q.dwork, q.res+Ptr(4*q.drafts)); err != nil {
		return err
	}
	if err := d.Record(q.drafted, mb.s); err != nil {
		return err
	}
	q.drafts++
	return nil
}

// PassDrafts is the most drafts a pipelined pass embeds
// (engine.DeepSpecPipeliner).
func (be *Backend) PassDrafts() int { return passDrafts }

// MTPEmbedNext is MTPEmbedDraft of the one-token chunk at pos whose token
// is the latest MTPHeadDraft's draft for b, copied on the MTP batch's
// stream from its result word (engine.DeepSpecPipeliner).
func (be *Backend) MTPEmbedNext(mbi, bi engine.Batch, pos int) error {
	b, err := be.draftedBatch(bi, "MTP embed of the next draft")
	if err != nil {
		return err
	}
	return be.mtpEmbed(mbi, pos, nil, b.sq.res+Ptr(4*(b.sq.drafts-1)), true)
}

// draftedBatch returns bi's batch, whose speculative queue must hold an
// MTP draft (what: the caller's step, for the error).
func (be *Backend) draftedBatch(bi engine.Batch, what string) (*batch, error) {
	b, err := be.batchOf(bi)
	if err != nil {
		return nil, err
	}
	if b.sq.drafts == 0 {
		return nil, fmt.Errorf("cuda: %s: no MTP draft queued", what)
	}
	return b, nil
}

// EmbedDraft is Embed of the chunk [tok, d_1, …, d_k] at pos, the drafts
// being the choices of the MTPHeadDraft calls since the last embed, on the
// device (engine.SpecPipeliner, engine.DeepSpecPipeliner).
func (be *Backend) EmbedDraft(bi engine.Batch, pos int, tok int32) error {
	return be.embedDraft(bi, pos, tok, false)
}

// EmbedAfterDraft is Embed of the one-token chunk [tok] at pos after the
// latest MTPHeadDraft, whose draft the next VerifyResult returns
// (engine.SpecPipeliner): a pass that only checks the draft.
func (be *Backend) EmbedAfterDraft(bi engine.Batch, pos int, tok int32) error {
	return be.embedDraft(bi, pos, tok, true)
}

// embedDraft is EmbedDraft (the chunk of tok and its drafts) and, check,
// EmbedAfterDraft (tok alone, one draft): either way the main stream waits
// for the drafts' Argmax, whose words the verification's result copy
// reads.
func (be *Backend) embedDraft(bi engine.Batch, pos int, tok int32, check bool) error {
	b, err := be.draftedBatch(bi, "draft embed")
	if err != nil {
		return err
	}
	q := &b.sq
	n := 1 + q.drafts
	if check {
		n = 1
	}
	if check && q.drafts != 1 {
		return fmt.Errorf("cuda: draft embed: %d drafts only checked (one a pass)", q.drafts)
	}
	if b.cap < n {
		return fmt.Errorf("cuda: draft embed: a batch of %d tokens", b.cap)
	}
	if tok < 0 || int(tok) >= be.cfg.Vocab {
		return fmt.Errorf("cuda: token %d out of range", tok)
	}
	b.releasePick()
	b.abortGraph()
	b.gq.onDevice = false
	b.gq.taken = b.gq.heads
	b.pq.taken = b.pq.heads
	if err := b.setTokens([]int32{tok}); err != nil {
		return err
	}
	d := be.dev
	if err := d.StreamWait(b.s, q.drafted); err != nil {
		return err
	}
	if n >= 2 {
		if err := d.CopyAsync(b.tokens+4, q.res, 4*int64(n-1), b.s); err != nil {
			return err
		}
	}
	q.vdrafts, q.drafts = q.drafts, 0
	return be.embedFrom(b, pos, n, nil, false)
}

// HeadVerify is Head for every row of the chunk (1 + its drafts after
// EmbedDraft, one after EmbedAfterDraft or a one-token Embed), the logits
// kept on the device and the greedy choice after each row queued for
// VerifyResult (engine.SpecPipeliner).
func (be *Backend) HeadVerify(bi engine.Batch) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	n := b.n
	if n < 1 || n > passDrafts+1 {
		return fmt.Errorf("cuda: verification head of a chunk of %d tokens (1 to %d)", n, passDrafts+1)
	}
	q := &b.sq
	if !q.ready() {
		return fmt.Errorf("cuda: verification head: no draft head before it")
	}
	c := &q.cq
	f := c.filt // (a row's candidates each: n ≤ passDrafts + 1 = len(c.cand))
	d := be.dev
	D, V := be.cfg.Embed, be.cfg.Vocab
	if err := be.headIn(b, &be.head); err != nil {
		return err
	}
	if err := be.linear(b, b.headIn, D, n, linJob{w: be.out, y: q.logits, ldy: V}); err != nil {
		return err
	}
	for r := 0; r < n; r++ {
		if err := d.Argmax(b.s, q.logits+Ptr(4*int64(r*V)), V, q.work, q.res+Ptr(4*(passDrafts+r))); err != nil {
			return err
		}
	}
	c.vfilt = nil
	if f != nil { // each row's min-p candidates (SetVerifyFilter)
		for r := 0; r < n; r++ {
			if err := d.PickCandidates(b.s, q.logits+Ptr(4*int64(r*V)), V, f.Temperature, f.MinP, c.work, c.top, c.cnt, c.cand[r], pickCandCap); err != nil {
				return err
			}
		}
		b.g.shape = append(b.g.shape, 'c')
	}
	b.g.shape = append(b.g.shape, 'V')
	if err := b.finish(); err != nil {
		return err
	}
	if err := d.DownloadAsync(q.pin[:4*resWords], q.res, b.s); err != nil {
		return err
	}
	if f != nil {
		for r := 0; r < n; r++ {
			if err := d.DownloadAsync(c.pin[r], c.cand[r], b.s); err != nil {
				return err
			}
		}
		c.vfilt, c.vrows = f, n
	}
	if err := d.Record(q.done, b.s); err != nil {
		return err
	}
	q.verified = true
	q.vrows = n
	be.gstats.specHeads.Add(1)
	return b.stopProfiler()
}

// VerifyResult waits for the latest HeadVerify and returns its chunk's
// draft and the greedy choices after its rows (after a one-token chunk,
// after1 is the word a pass before left) (engine.SpecPipeliner).
func (be *Backend) VerifyResult(bi engine.Batch) (draft, after0, after1 int32, err error) {
	b, err := be.batchOf(bi)
	if err != nil {
		return 0, 0, 0, err
	}
	q, err := be.verifyWait(b)
	if err != nil {
		return 0, 0, 0, err
	}
	return q.word(0), q.word(passDrafts), q.word(passDrafts + 1), nil
}

// VerifyResults waits for the latest HeadVerify and copies its chunk's
// drafts and the greedy choices after its rows into drafts and choices
// (engine.DeepSpecPipeliner).
func (be *Backend) VerifyResults(bi engine.Batch, drafts, choices []int32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if q := &b.sq; len(drafts) > q.vdrafts || len(choices) > q.vrows {
		return fmt.Errorf("cuda: verification results: %d drafts and %d choices of a chunk of %d drafts, %d rows", len(drafts), len(choices), q.vdrafts, q.vrows)
	}
	q, err := be.verifyWait(b)
	if err != nil {
		return err
	}
	for i := range drafts {
		drafts[i] = q.word(i)
	}
	for r := range choices {
		choices[r] = q.word(passDrafts + r)
	}
	return nil
}

// verifyWait waits for the latest HeadVerify's result copy on b.
func (be *Backend) verifyWait(b *batch) (*specQueue, error) {
	q := &b.sq
	if !q.verified {
		return nil, fmt.Errorf("cuda: verification result: none queued")
	}
	t0 := time.Now()
	if err := be.dev.SyncEvent(q.done); err != nil {
		return nil, err
	}
	be.gstats.waitNs.Add(int64(time.Since(t0)))
	q.verified = false
	return q, nil
}

// word is result word i of the latest verification (pinned memory).
func (q *specQueue) word(i int) int32 { return int32(binary.LittleEndian.Uint32(q.pin[4*i:])) }

// VerifyLogits waits for the batch's work and copies the logits of row
// (below its chunk's rows) of the latest HeadVerify into dst
// (engine.SpecPipeliner).
func (be *Backend) VerifyLogits(bi engine.Batch, row int, dst []float32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	q := &b.sq
	V := be.cfg.Vocab
	if !q.ready() || row < 0 || row >= max(q.vrows, 1) {
		return fmt.Errorf("cuda: verification logits of row %d: none queued", row)
	}
	if len(dst) < V {
		return fmt.Errorf("cuda: verification logits: %d values for a vocabulary of %d", len(dst), V)
	}
	if err := be.dev.SyncStream(b.s); err != nil {
		return err
	}
	return DownloadSlice(be.dev, dst[:V], q.logits+Ptr(4*int64(row*V)))
}

var _ engine.SpecCandidater = (*Backend)(nil)

// SetVerifyFilter makes the following HeadVerify calls on bi find each
// row's min-p candidates under f (PickCandidates, as HeadPicked does) and
// download them with the pass's result; nil, or a filter without a
// temperature and min-p, stops it (engine.SpecCandidater).
func (be *Backend) SetVerifyFilter(bi engine.Batch, f *engine.PickFilter) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	c := &b.sq.cq
	if f == nil || !(f.Temperature > 0 && f.MinP > 0) {
		c.filt = nil
		return nil
	}
	if c.pin[0] == nil {
		if err := b.flush(); err != nil {
			return err
		}
		if err := c.init(be.dev); err != nil {
			c.release(be.dev)
			return fmt.Errorf("cuda: verification candidates: %w", err)
		}
	}
	fc := *f
	c.filt = &fc
	return nil
}

// VerifyCandidates returns the min-p candidates of row (below its chunk's
// rows: 1 + its drafts) of the latest HeadVerify on bi, after VerifyResult: in pinned memory, valid
// until the next HeadVerify; nil when that head had no filter or found more
// than pickCandCap (engine.SpecCandidater).
func (be *Backend) VerifyCandidates(bi engine.Batch, row int) (*engine.Candidates, error) {
	b, err := be.batchOf(bi)
	if err != nil {
		return nil, err
	}
	q := &b.sq
	c := &q.cq
	if c.vfilt == nil || row < 0 || row >= c.vrows {
		return nil, nil
	}
	if q.verified {
		return nil, fmt.Errorf("cuda: verification candidates before VerifyResult")
	}
	cs, err := be.candidatesIn(c.pin[row], *c.vfilt)
	if err != nil {
		return nil, fmt.Errorf("cuda: verification %w", err)
	}
	return cs, nil
}
