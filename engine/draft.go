package engine

import (
	"context"
	"errors"
	"fmt"
)

// Speculative decoding with the model's MTP block (Options.Draft).
//
// The MTP block at position i reads the main model's output streams h_i
// and the token t_{i+1}, and its logits predict t_{i+2}; its attention is a
// sliding window over its own KV rows. The session keeps the block in step
// with the forward pass: every chunk stages its rows' h (those the next
// draft's window can reach: positions ≥ the run's end − Window), and once
// the token after a staged row is known the row goes through the block,
// which writes its KV row. Only the last row, whose next token is not
// chosen yet, stays staged.
//
// DecodeGreedy then decodes two tokens per pass when the draft holds: with
// t the greedy choice at position P and h_{P−1} staged, the block drafts d
// (for position P+1), and one two-token chunk [t, d] at P, P+1 gives the
// logits after t and after d. t is committed as always; d is committed when
// it is the greedy choice after t, and the logits after d are then the next
// ones. Otherwise the chunk's second position is dropped: every part of the
// KV state is addressed by position (Backend), so the next token at P+1
// overwrites what d wrote there. The tokens are those plain greedy decoding
// gives, on a backend whose two-token chunks compute what one-token steps
// do (backend/cpu: bit for bit).

// With Options.DraftDepth k > 1 the block drafts d_1 … d_k: after d_1, the
// block's own output streams of its last row stand in for the main model's
// at the next position (which only the verification computes), with the
// draft before as its token (draftChain). The chunk [t, d_1, …, d_k]
// commits the drafts up to the first that is not the greedy choice after
// the token before it; the rest of its positions are dropped as d's is
// above. A DeepSpecPipeliner runs these passes on the device up to its
// PassDrafts (specPassDeep: the host reads the drafts and choices once a
// pass); deeper ones, and every backend without it, take the host path
// (the logits of every row read by the host).

// drafts is a session's MTP block state.
type drafts struct {
	be     Drafter
	b      Batch // the block's chunk, with the staged rows
	st     State // the block's KV state (a window ring)
	next   int   // position of the oldest staged row
	staged int   // staged rows: positions next … next+staged−1
	logits []float32
	off    bool // SetSpeculate(false): DecodeGreedy decodes one token a pass
	policy draftPolicy
}

// draftPolicy decides pass by pass whether speculative decoding verifies
// its draft (a two-token pass) or pauses and only checks it against the
// greedy choice of a one-token pass, from the drafts' acceptance rate (an
// exponential average over passes, weight draftRateWeight, starting at
// draftRateStart): it pauses below draftPauseBelow and verifies again
// above draftResumeAbove. The bounds bracket where verification pays on
// the CUDA backend (cuda/NOTES.md v47: a verifying pass that commits no
// draft costs ≈ 1.25 one-token checking passes, so it pays from ≈ 25 %
// acceptance); the gap between them keeps the policy from switching back
// and forth around either. A backend that reports its own cost
// (DraftCoster, e.g. CUDA's exact mode) moves both bounds (withCost).
type draftPolicy struct {
	// pauseBelow and resumeAbove: the bounds (zero: draftPauseBelow and
	// draftResumeAbove)
	pauseBelow, resumeAbove float64
	rate                    float64
	paused                  bool
	seen                    bool // rate holds an observation
	// plain counts the one-token steps since the last checking pass while
	// paused: only every draftCheckEvery-th token drafts and checks (the
	// MTP block then runs over the rows staged since, in one chunk), the
	// others are plain steps that only stage their row.
	plain int
	// depthCost: the backend's cost of a verifying pass of k drafts
	// (DraftDepthCoster; nil: none), for depthFor
	depthCost func(k int) float64
	// deep is the acceptance rate depthFor reads: a slower estimate than
	// rate's (the pause's), because the depths' values cross near the
	// rates drafts commit at (CUDA: ≈ 0.7–0.8), where rate's spread (≈ ±0.07
	// at 0.8) sent one pass in three or four to the shallower depth. It
	// starts as the mean of draftDepthPrior observations at draftRateStart
	// and those seen (deepN of them), and becomes an exponential average of
	// weight draftDepthWeight once the mean's weight falls to it.
	deep  float64
	deepN int
}

const (
	draftRateWeight  = 1.0 / 16
	draftRateStart   = 0.5
	draftDepthWeight = 1.0 / 64
	draftDepthPrior  = 2
	draftPauseBelow  = 0.25
	draftResumeAbove = 0.35
	draftCheckEvery  = 4
)

// withCost sets the bounds for a backend whose verifying pass costs cost
// paused passes (DraftCoster): pausing below the break-even acceptance cost − 1,
// resuming 0.1 above it (draftPauseBelow and draftResumeAbove's gap),
// within [0.05, 0.85]; a cost outside (1, 2) keeps the defaults.
func (p *draftPolicy) withCost(cost float64) {
	if !(cost > 1 && cost < 2) {
		return
	}
	p.pauseBelow = min(max(cost-1, 0.05), 0.85)
	p.resumeAbove = p.pauseBelow + (draftResumeAbove - draftPauseBelow)
}

// depthFor returns how many drafts a verifying pass makes, at most limit:
// limit, unless the backend reports the cost of one draft and of some
// deeper ones (depthCost), when it is the depth among those with the most
// tokens per cost at the measured acceptance rate a (deepRate: a pass of k
// drafts taken to commit 1 + a + … + a^k tokens, each draft as likely as
// the rate once the one before it holds); ties go to the shallower pass.
func (p *draftPolicy) depthFor(limit int) int {
	if limit <= 1 || p.depthCost == nil || !(p.depthCost(1) > 0) {
		return limit
	}
	a := p.deepRate()
	best, bestK, known := 0.0, 1, false
	e, ak := 1.0, 1.0
	for k := 1; k <= limit; k++ {
		ak *= a
		e += ak
		c := p.depthCost(k)
		if !(c > 0) {
			continue // (not measured: not chosen)
		}
		known = known || k > 1
		if v := e / c; v > best*(1+1e-9) {
			best, bestK = v, k
		}
	}
	if !known {
		return limit // no deeper pass measured: as asked
	}
	return bestK
}

// bounds returns the policy's pause and resume bounds.
func (p *draftPolicy) bounds() (pause, resume float64) {
	if p.pauseBelow == 0 {
		return draftPauseBelow, draftResumeAbove
	}
	return p.pauseBelow, p.resumeAbove
}

// deepRate returns the acceptance rate the depth is chosen by (deep;
// draftRateStart before any observation).
func (p *draftPolicy) deepRate() float64 {
	if p.deepN == 0 {
		return draftRateStart
	}
	return p.deep
}

// observe adds one draft's outcome (it matched the greedy choice, or was
// committed) to the rates and updates paused.
func (p *draftPolicy) observe(hit bool) {
	if !p.seen {
		p.rate, p.seen = draftRateStart, true
	}
	x := 0.0
	if hit {
		x = 1
	}
	p.rate += (x - p.rate) * draftRateWeight
	if p.deepN == 0 {
		p.deep = draftRateStart
	}
	p.deepN++
	p.deep += (x - p.deep) * max(draftDepthWeight, 1/float64(draftDepthPrior+p.deepN))
	pause, resume := p.bounds()
	switch {
	case p.paused && p.rate > resume:
		p.paused = false
	case !p.paused && p.rate < pause:
		p.paused = true
	}
}

// checking reports whether the session's next pass only checks its draft
// (the policy paused speculation, and Options.DraftAlways is off).
func (s *Session) checking() bool {
	return !s.opts.DraftAlways && s.mtp.policy.paused
}

// plainStep reports whether the session's next token, speculation paused,
// is a plain step that drafts nothing (all but every draftCheckEvery-th),
// and counts it.
func (s *Session) plainStep() bool {
	p := &s.mtp.policy
	if !s.checking() || p.plain+1 >= draftCheckEvery {
		p.plain = 0
		return false
	}
	p.plain++
	return true
}

// observeDraft counts a pass's draft d of the token at pos against c, the
// greedy choice there (ForceAccept may accept it anyway), in Stats and the
// policy, and reports whether it holds. checked: the pass only checked it.
func (s *Session) observeDraft(pos int, d, c int32, checked bool) bool {
	ok := c == d || (s.opts.ForceAccept != nil && s.opts.ForceAccept(pos))
	if checked {
		s.stats.Checked++
		if ok {
			s.stats.CheckAccepted++
		}
	} else {
		s.stats.Drafted++
		if ok {
			s.stats.Accepted++
		}
	}
	s.mtp.policy.observe(ok)
	return ok
}

func newDrafts(be Backend, layout *StateLayout) (*drafts, error) {
	d, ok := be.(Drafter)
	if !ok || !d.HasMTP() {
		return nil, fmt.Errorf("engine: %s backend: drafting needs a model with an MTP block (model.MTP)", be.Name())
	}
	ml := *layout
	ml.MTP = true
	st, err := be.NewState(&ml)
	if err != nil {
		return nil, fmt.Errorf("engine: %s backend: MTP state: %w", be.Name(), err)
	}
	// A run stages at most Window rows after the one left from before
	// (stageMTP).
	b, err := be.NewBatch(layout.Config.Window + 2)
	if err != nil {
		st.Release()
		return nil, fmt.Errorf("engine: %s backend: MTP batch: %w", be.Name(), err)
	}
	m := &drafts{be: d, b: b, st: st, logits: make([]float32, layout.Config.Vocab)}
	if c, ok := be.(DraftCoster); ok {
		m.policy.withCost(c.DraftPassCost())
	}
	if c, ok := be.(DraftDepthCoster); ok {
		m.policy.depthCost = c.DraftDepthCost
	}
	return m, nil
}

func (m *drafts) release() {
	m.b.Release()
	m.st.Release()
}

// forgetStaged drops the staged rows (the sequence changed under them).
func (s *Session) forgetStaged() {
	if s.mtp != nil {
		s.mtp.staged = 0
	}
}

// stageMTP stages the rows of the chunk at pos (n tokens) that the next
// draft's window reaches, after the layers and before the head.
func (s *Session) stageMTP(pos, n int) error {
	m := s.mtp
	if m == nil {
		return nil
	}
	first := max(pos, s.runEnd-s.cfg.Window)
	if first >= pos+n {
		return nil
	}
	if m.staged > 0 && m.next+m.staged != first {
		m.staged = 0 // not contiguous: the older rows are of no use
	}
	if m.staged == 0 {
		if err := m.be.DropStagedMTP(m.b, 0); err != nil {
			return s.opError(pos, "MTP stage", -1, err)
		}
		m.next = first
	}
	if err := m.be.StageMTP(m.b, s.b, first-pos, pos+n-first); err != nil {
		return s.opError(pos, "MTP stage", -1, err)
	}
	m.staged += pos + n - first
	return nil
}

// advanceMTP runs the block over the staged rows whose next token is known
// (all but a last one at the session's final position).
func (s *Session) advanceMTP(ctx context.Context) error {
	m := s.mtp
	if m == nil || m.staged == 0 {
		return nil
	}
	k := min(m.staged, len(s.tokens)-1-m.next)
	if k <= 0 {
		return nil
	}
	return s.runMTP(ctx, s.tokens[m.next+1:m.next+1+k], -1)
}

// runMTP runs the block over the oldest len(toks) staged rows with their
// next tokens toks, and when head ≥ 0 computes the logits of chunk row head
// into m.logits.
func (s *Session) runMTP(ctx context.Context, toks []int32, head int) error {
	m := s.mtp
	pos := m.next
	if err := s.mtpChunk(ctx, len(toks), func(mb Batch, pos int) error { return m.be.MTPEmbed(mb, pos, toks) }); err != nil {
		return err
	}
	if head >= 0 {
		if err := m.be.MTPHead(m.b, []int{head}, m.logits); err != nil {
			return s.opError(pos+head, "MTP head", -1, err)
		}
	}
	return nil
}

// mtpChunk runs the block over its oldest n staged rows, embed starting
// the chunk at their position (MTPEmbed, or a SpecPipeliner's forms of it):
// its layer ops, then the rows consumed.
func (s *Session) mtpChunk(ctx context.Context, n int, embed func(mb Batch, pos int) error) error {
	m := s.mtp
	pos := m.next
	if err := embed(m.b, pos); err != nil {
		return s.opError(pos, "MTP embed", -1, err)
	}
	L := s.cfg.Layers
	if err := s.runBlocks(ctx, m.b, m.st, L, L+1, pos, func(Stage, int) {}); err != nil {
		return err
	}
	m.next += n
	m.staged -= n
	return nil
}

// canDraft reports whether the block can draft after the token chosen at
// the session's position: the rows up to the last position are staged.
func (s *Session) canDraft() bool {
	m := s.mtp
	return m != nil && m.staged > 0 && m.next+m.staged == len(s.tokens)
}

// draftInput returns the tokens of a draft's chunk over the staged rows:
// each row's next token, tok (the token chosen for the session's position)
// the last row's.
func (s *Session) draftInput(tok int32) []int32 {
	m := s.mtp
	return append(append(make([]int32, 0, m.staged), s.tokens[m.next+1:]...), tok)
}

// draft runs the block over the staged rows, the last with tok (the token
// chosen for the session's position), and returns its greedy draft of the
// token after tok.
func (s *Session) draft(ctx context.Context, tok int32) (int32, error) {
	m := s.mtp
	toks := s.draftInput(tok)
	if err := s.runMTP(ctx, toks, len(toks)-1); err != nil {
		return 0, err
	}
	d := Greedy(m.logits)
	if f := s.opts.DraftOverride; f != nil {
		d = f(len(s.tokens)+1, d)
	}
	return d, nil
}

// MaxDraftDepth is the most tokens Options.DraftDepth drafts a pass (a
// pass of 16 tokens, ds4.c's limit).
const MaxDraftDepth = 15

// depth returns the drafts a verifying pass of greedy decoding makes
// (Options.DraftDepth, at least 1), within the session's chunk and the
// block's window.
func (s *Session) depth() int {
	return max(1, min(s.opts.DraftDepth, s.opts.ChunkSize-1, s.cfg.Window-1))
}

// passDepth returns the drafts of the next verifying pass: as asked
// (depth) with Options.DraftAlways, otherwise as the policy picks by the
// backend's costs at the measured rate (DraftDepthCoster).
func (s *Session) passDepth() int {
	want := s.depth()
	if s.opts.DraftAlways {
		return want
	}
	return s.mtp.policy.depthFor(want)
}

// passDrafts returns the drafts of a verifying pass at position P with
// left tokens still to decode: passDepth, within them and the context, and
// within dp's PassDrafts (dp not nil).
func (s *Session) passDrafts(left, P int, dp DeepSpecPipeliner) int {
	k := min(s.passDepth(), left-1, s.opts.MaxContext-P-1)
	if dp != nil {
		k = min(k, dp.PassDrafts())
	}
	return k
}

// devicePasses reports whether a run on sp takes the device's pass at this
// run's depth (passDepth): one draft on a SpecPipeliner, up to PassDrafts
// on a DeepSpecPipeliner, which it returns (nil for any other sp).
func (s *Session) devicePasses(sp SpecPipeliner) (DeepSpecPipeliner, bool) {
	deep, _ := sp.(DeepSpecPipeliner)
	most := 1
	if deep != nil {
		most = deep.PassDrafts()
	}
	return deep, s.passDepth() <= most
}

// draftChain returns k ≥ 1 greedy drafts after tok, the token chosen for
// the session's position P: the first as draft makes it (the block over
// the staged rows), each next one by the block run again at the next
// position over its own output streams of the row before — its stand-in
// for the main model's streams there, which only the verification
// computes — with the draft before as its token (ds4.c's recursive
// drafting). Those runs write the block's KV rows at P, P+1, … ahead of
// the main model; the rows the verification stages go through the block
// again before any draft reads them (every part of the KV state is
// addressed by position). No staged row is left: the verification's chunk
// stages its own.
func (s *Session) draftChain(ctx context.Context, tok int32, k int) ([]int32, error) {
	m := s.mtp
	last := m.staged - 1 // the first run's last row (draft: every staged row, the last with tok)
	d, err := s.draft(ctx, tok)
	if err != nil {
		return nil, err
	}
	ds := append(make([]int32, 0, k), d)
	P := len(s.tokens)
	for len(ds) < k {
		if err := s.restageMTP(last); err != nil {
			return nil, err
		}
		if err := s.runMTP(ctx, ds[len(ds)-1:], 0); err != nil {
			return nil, err
		}
		last = 0
		d := Greedy(m.logits)
		if f := s.opts.DraftOverride; f != nil {
			d = f(P+1+len(ds), d)
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// restageMTP stages the block's own output streams of row last of its
// latest chunk as the next position's row: a deeper draft's stand-in for
// the main model's streams there (draftChain, specPassDeep).
func (s *Session) restageMTP(last int) error {
	m := s.mtp
	if err := m.be.StageMTP(m.b, m.b, last, 1); err != nil {
		return s.opError(m.next, "MTP stage", -1, err)
	}
	m.staged++
	return nil
}

// SetSpeculate turns speculative decoding off (DecodeGreedy then decodes
// one token a pass, on the backend's pipelined path where it has one) or
// back on, for a session with Options.Draft; it reports whether the session
// drafts at all. The MTP block stays in step with the prompts either way.
func (s *Session) SetSpeculate(on bool) bool {
	if s.mtp == nil {
		return false
	}
	s.mtp.off = !on
	return true
}

// decodeSpeculative is DecodeGreedy with drafts (Options.Draft).
func (s *Session) decodeSpeculative(ctx context.Context, max int, emit func(int32) bool) (int, error) {
	// the device's pass where it takes this run's depth
	if sp, ok := s.be.(SpecPipeliner); ok && s.opts.DraftOverride == nil && s.opts.Trace == nil {
		if _, on := s.devicePasses(sp); on {
			return s.specPipelined(ctx, sp, max, emit)
		}
	}
	n := 0
	// rows[i]: the logits after the verification's token i (the session's
	// after its last); as many as the deepest pass so far needs
	var rows [][]float32
	for n < max {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if !s.logitsOK {
			return n, ErrNoLogits
		}
		tok := Greedy(s.logits)
		if !emit(tok) {
			return n, nil
		}
		P := len(s.tokens)
		k := s.passDrafts(max-n, P, nil) // the drafts of this pass
		if k < 1 || !s.canDraft() {
			if err := s.Decode(ctx, tok); err != nil {
				return n, err
			}
			n++
			continue
		}
		if s.plainStep() { // paused: a step that stages its row, no draft
			if err := s.Decode(ctx, tok); err != nil {
				return n, err
			}
			n++
			continue
		}
		if s.checking() { // a one-token step; the draft only checked
			d, err := s.draft(ctx, tok)
			if err != nil {
				s.logitsOK = false
				return n, err
			}
			if err := s.Decode(ctx, tok); err != nil {
				return n, err
			}
			n++
			s.observeDraft(P+1, d, Greedy(s.logits), true)
			continue
		}
		ds, err := s.hostPass(ctx, tok, k, &rows)
		if err != nil {
			s.logitsOK = false
			return n, err
		}
		c, refused := s.commitDrafts(P, ds, func(i int) int32 { return Greedy(rows[i]) }, emit)
		n += 1 + c
		if c == k {
			continue // the session's logits are those after the last draft
		}
		// Keep tok and the committed drafts: the logits after the last of
		// them, their staged rows.
		copy(s.logits, rows[c])
		if err := s.keepDrafts(P, c); err != nil {
			s.logitsOK = false
			return n, err
		}
		if refused {
			return n, nil // emit refused a confirmed draft
		}
	}
	return n, nil
}

// commitDrafts emits a pass's drafts ds, those after the token at P, up to
// the first that is not choice(i) — the greedy choice after the pass's
// token i — or that emit refuses, each one examined counted in Stats and
// the policy (observeDraft); it returns the drafts committed and whether
// emit refused one.
func (s *Session) commitDrafts(P int, ds []int32, choice func(int) int32, emit func(int32) bool) (c int, refused bool) {
	for c < len(ds) && s.observeDraft(P+1+c, ds[c], choice(c), false) {
		if !emit(ds[c]) {
			return c, true
		}
		c++
	}
	return c, false
}

// keepDrafts keeps the token at P and the first c drafts of its pass, and
// their staged rows; the pass's later positions are dropped (every part of
// the KV state is addressed by position: the next tokens overwrite them).
func (s *Session) keepDrafts(P, c int) error {
	s.tokens = s.tokens[:P+1+c]
	s.mtp.staged = c + 1
	if err := s.mtp.be.DropStagedMTP(s.mtp.b, c+1); err != nil {
		return s.opError(P, "MTP stage", -1, err)
	}
	return nil
}

// verify runs the chunk [tok, d] at the session's position, leaving the
// logits after tok in row0 and those after d as the session's.
func (s *Session) verify(ctx context.Context, tok, d int32, row0 []float32) error {
	return s.verifyChain(ctx, []int32{tok, d}, [][]float32{row0})
}

// verifyChain runs the chunk toks at the session's position, leaving the
// logits after toks[i] in rows[i] (len(toks) − 1 rows) and those after the
// last token as the session's.
func (s *Session) verifyChain(ctx context.Context, toks []int32, rows [][]float32) error {
	if err := s.checkTokens(toks); err != nil {
		return err
	}
	P := len(s.tokens)
	s.runEnd = P + len(toks)
	if err := s.ensureContinuable(ctx); err != nil {
		return err
	}
	return s.chunk(ctx, toks, P, func(pos int, l []float32) {
		if i := pos - P; i >= 0 && i < len(rows) {
			copy(rows[i], l)
		}
	})
}

// specPipelined is decodeSpeculative on a SpecPipeliner: the drafts and
// the greedy choices after the verification's rows are made on the device,
// and the session's logits are fetched only when the run ends. On a
// DeepSpecPipeliner a pass drafts as deep as decodeSpeculative's would,
// within PassDrafts. The tokens, drafts and acceptances are those of
// decodeSpeculative.
func (s *Session) specPipelined(ctx context.Context, sp SpecPipeliner, max int, emit func(int32) bool) (n int, err error) {
	if !s.logitsOK {
		return 0, ErrNoLogits
	}
	deep, _ := sp.(DeepSpecPipeliner)
	// pending ≥ 0: the logits after the session's last token are row
	// pending of the latest verification, still on the device.
	pending := -1
	defer func() { s.fetchPending(sp, pending, &err) }()
	var ds, cs []int32 // a deep pass's drafts and choices
	tok := Greedy(s.logits)
	for n < max {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if !emit(tok) {
			return n, nil
		}
		P := len(s.tokens)
		if n+2 > max || P+2 > s.opts.MaxContext || !s.canDraft() {
			pending = -1 // Decode writes the logits after tok
			if err := s.Decode(ctx, tok); err != nil {
				return n, err
			}
			n++
			tok = Greedy(s.logits)
			continue
		}
		pending = -1
		s.logitsOK = false
		if s.plainStep() { // paused: a step that stages its row, no draft
			c0, err := s.stepPass(ctx, sp, tok)
			if err != nil {
				return n, err
			}
			n++
			tok, pending = c0, 0
			continue
		}
		check := s.checking()
		if k := s.passDrafts(max-n, P, deep); deep != nil && !check && k > 1 {
			ds, cs = passBuffers(ds, cs, k)
			if err := s.specPassDeep(ctx, deep, tok, ds, cs); err != nil {
				return n, err
			}
			c, refused := s.commitDrafts(P, ds, func(i int) int32 { return cs[i] }, emit)
			n += 1 + c
			pending, tok = c, cs[c]
			if c == k {
				continue // the logits after the last draft are row k
			}
			// Keep tok and the committed drafts: the logits after the last
			// of them (row c), their staged rows.
			if err := s.keepDrafts(P, c); err != nil {
				return n, err
			}
			if refused {
				return n, nil // emit refused a confirmed draft
			}
			continue
		}
		d, c0, c1, err := s.specPass(ctx, sp, tok, check)
		if err != nil {
			return n, err
		}
		n++
		ok := s.observeDraft(P+1, d, c0, check)
		if check { // the session holds tok; the logits after it are row 0
			pending = 0
			tok = c0
			continue
		}
		if ok {
			if emit(d) {
				n++
				tok, pending = c1, 1
				continue
			}
		}
		// Keep t only: the logits after it (row 0), its staged row.
		pending = 0
		if err := s.keepDrafts(P, 0); err != nil {
			return n, err
		}
		if ok {
			return n, nil // emit refused the confirmed draft
		}
		tok = c0
	}
	return n, nil
}

// fetchPending makes row pending (≥ 0; < 0: none) of the latest
// verification on sp the session's logits as a pipelined run ends; a
// failure leaves the session without logits and becomes *err unless it
// holds one already.
func (s *Session) fetchPending(sp SpecPipeliner, pending int, err *error) {
	if pending < 0 {
		return
	}
	if e := sp.VerifyLogits(s.b, pending, s.logits); e != nil {
		s.logitsOK = false
		if *err == nil {
			*err = s.opError(len(s.tokens)-1, "head", -1, e)
		}
		return
	}
	s.logitsOK = true
}

// stepPass queues a one-token step on the device for tok, the greedy choice
// at the session's position P, that stages its row for the MTP block and
// drafts nothing, and returns the greedy choice after tok (HeadVerify and
// VerifyResult of the plain chunk). The session then holds tok.
func (s *Session) stepPass(ctx context.Context, sp SpecPipeliner, tok int32) (int32, error) {
	if err := s.checkTokens([]int32{tok}); err != nil {
		return 0, err
	}
	P := len(s.tokens)
	embed := func(b Batch, pos int) error { return s.be.Embed(b, pos, []int32{tok}) }
	_, c0, _, err := s.verifyChunk(ctx, sp, 1, embed)
	if err == nil {
		err = s.validChoices(P, c0)
	}
	if err != nil {
		return 0, err
	}
	s.tokens = append(s.tokens, tok)
	return c0, nil
}

// verifyChunk queues the chunk of n tokens at the session's position P that
// embed puts on the batch, its layers, the staging of its rows for the MTP
// block and HeadVerify, and returns VerifyResult's draft and greedy
// choices (unchecked: validChoices).
func (s *Session) verifyChunk(ctx context.Context, sp SpecPipeliner, n int, embed func(Batch, int) error) (d, c0, c1 int32, err error) {
	P := len(s.tokens)
	if err := s.queueVerify(ctx, sp, n, embed); err != nil {
		return 0, 0, 0, err
	}
	if d, c0, c1, err = sp.VerifyResult(s.b); err != nil {
		return 0, 0, 0, s.opError(P, "head", -1, err)
	}
	return d, c0, c1, nil
}

// queueVerify queues verifyChunk's work up to its HeadVerify.
func (s *Session) queueVerify(ctx context.Context, sp SpecPipeliner, n int, embed func(Batch, int) error) error {
	P := len(s.tokens)
	s.runEnd = P + n
	if err := s.ensureContinuable(ctx); err != nil {
		return err
	}
	s.ret.written(P, n)
	if err := embed(s.b, P); err != nil {
		return s.opError(P, "embed", -1, err)
	}
	if err := s.blocks(ctx, P, func(Stage, int) {}); err != nil {
		return err
	}
	if err := s.stageMTP(P, n); err != nil {
		return err
	}
	if err := sp.HeadVerify(s.b); err != nil {
		return s.opError(P, "head", -1, err)
	}
	return nil
}

// validChoices reports a device's choice (a draft, a greedy token) of the
// pass at pos that is not a token of the vocabulary.
func (s *Session) validChoices(pos int, cs ...int32) error {
	for _, c := range cs {
		if c < 0 || int(c) >= s.cfg.Vocab {
			return fmt.Errorf("engine: %s backend: greedy choice %d at position %d: %w", s.be.Name(), c, pos, ErrBadToken)
		}
	}
	return nil
}

// specPass queues one pass on the device for tok, the greedy choice at the
// session's position P: the MTP block's draft d for P+1, then the chunk
// [tok, d] at P, and returns d and the greedy choices after tok and after
// d. The session then holds tok and d. check: the chunk is [tok] alone
// (the draft only checked against c0; c1 meaningless), and the session
// then holds tok.
func (s *Session) specPass(ctx context.Context, sp SpecPipeliner, tok int32, check bool) (d, c0, c1 int32, err error) {
	if _, err := s.deviceDraft(ctx, sp, tok); err != nil {
		return 0, 0, 0, err
	}
	// the verification (check: the one-token step)
	n, embed := 2, sp.EmbedDraft
	if check {
		n, embed = 1, sp.EmbedAfterDraft
	}
	P := len(s.tokens)
	at := func(b Batch, pos int) error { return embed(b, pos, tok) }
	if d, c0, c1, err = s.verifyChunk(ctx, sp, n, at); err != nil {
		return 0, 0, 0, err
	}
	if err := s.validChoices(P, []int32{d, c0, c1}[:n+1]...); err != nil {
		return 0, 0, 0, err
	}
	if check {
		s.tokens = append(s.tokens, tok)
		return d, c0, -1, nil
	}
	s.tokens = append(s.tokens, tok, d)
	return d, c0, c1, nil
}

// deviceDraft queues a pass's first draft on the device for tok, the greedy
// choice at the session's position: the block over the staged rows, the
// last with tok (MTPEmbedDraft), and MTPHeadDraft of that row, which it
// returns (the chunk's last).
func (s *Session) deviceDraft(ctx context.Context, sp SpecPipeliner, tok int32) (last int, err error) {
	m := s.mtp
	if err := s.checkTokens([]int32{tok}); err != nil {
		return 0, err
	}
	toks := s.draftInput(tok)
	mpos := m.next
	if err := s.mtpChunk(ctx, len(toks), func(mb Batch, pos int) error { return sp.MTPEmbedDraft(mb, pos, toks) }); err != nil {
		return 0, err
	}
	last = len(toks) - 1
	if err := sp.MTPHeadDraft(m.b, s.b, last); err != nil {
		return 0, s.opError(mpos+last, "MTP head", -1, err)
	}
	return last, nil
}

// specPassDeep queues one pass of len(ds) ≥ 2 drafts on the device for
// tok, the greedy choice at the session's position P: the MTP block's
// drafts d_1 … d_k for P+1 … P+k (draftChain's, made on the device), then
// the chunk [tok, d_1, …, d_k] at P, and leaves the drafts in ds and the
// greedy choices after each of the chunk's tokens in cs (k + 1). The
// session then holds tok and the drafts.
func (s *Session) specPassDeep(ctx context.Context, sp DeepSpecPipeliner, tok int32, ds, cs []int32) error {
	m := s.mtp
	last, err := s.deviceDraft(ctx, sp, tok)
	if err != nil {
		return err
	}
	// each next one: the block at the next position over its own streams
	// of the row before, the draft before as its token
	for i := 1; i < len(ds); i++ {
		pos := m.next
		if err := s.restageMTP(last); err != nil {
			return err
		}
		next := func(mb Batch, pos int) error { return sp.MTPEmbedNext(mb, s.b, pos) }
		if err := s.mtpChunk(ctx, 1, next); err != nil {
			return err
		}
		last = 0
		if err := sp.MTPHeadDraft(m.b, s.b, 0); err != nil {
			return s.opError(pos, "MTP head", -1, err)
		}
	}
	P := len(s.tokens)
	embed := func(b Batch, pos int) error { return sp.EmbedDraft(b, pos, tok) }
	if err := s.queueVerify(ctx, sp, len(ds)+1, embed); err != nil {
		return err
	}
	if err := sp.VerifyResults(s.b, ds, cs); err != nil {
		return s.opError(P, "head", -1, err)
	}
	if err := s.validChoices(P, ds...); err != nil {
		return err
	}
	if err := s.validChoices(P, cs...); err != nil {
		return err
	}
	s.tokens = append(append(s.tokens, tok), ds...)
	return nil
}

// decodePickedSpeculative is DecodePicked with drafts (Options.Draft). A
// pass takes tok, the token pick chose at the session's position P: the MTP
// block drafts d greedily for P+1, the chunk [tok, d] gives the logits after
// tok and after d, and pick gets the logits after tok. When it chooses d,
// d is decoded already and pick then gets the logits after d; otherwise
// d's position is dropped and its choice goes into the next pass. pick sees
// plain DecodePicked's logits in the same order, so a sampler's draws are
// plain decoding's draw for draw: the same tokens from the same seed. This
// is speculative sampling with a one-token proposal: a draft taken exactly
// when the pick's own draw lands on it leaves the distribution unchanged,
// and it is taken with the pick's probability of d — what rejection
// sampling (accept with min(1, p(d)/q(d)) for the draft's q = 1) would
// give. The passes are the greedy loop's (draftPolicy included), and as
// deep (Options.DraftDepth): a pass of k drafts d_1 … d_k (draftChain's)
// verifies [tok, d_1, …, d_k], and pick gets the logits after tok, then
// after each draft it chose, until it chooses another token than the
// draft (which goes into the next pass) or every draft is taken — each
// draft, given those before it taken, is taken with the pick's
// probability of it, so the tokens are still plain decoding's draws. On a
// SpecPipeliner the drafts are made on the device (several on a
// DeepSpecPipeliner, up to its PassDrafts; a deeper depth takes the host
// path, as in DecodeGreedy), and a pass then fetches the rows pick reads
// (one, and one more for each draft taken) — with f, on a SpecCandidater,
// only their min-p candidates, the session's logits then fetched when the
// run ends.
func (s *Session) decodePickedSpeculative(ctx context.Context, max int, f *PickFilter, pick func(*Logits) (int32, bool)) (n int, err error) {
	sp, _ := s.be.(SpecPipeliner)
	if s.opts.DraftOverride != nil || s.opts.Trace != nil {
		sp = nil
	}
	// the device's pass where it takes this run's depth (decodeSpeculative's
	// rule), else the host path
	var deep DeepSpecPipeliner
	if sp != nil {
		var on bool
		if deep, on = s.devicePasses(sp); !on {
			sp, deep = nil, nil
		}
	}
	var sc SpecCandidater
	if sp != nil && f != nil {
		if c, ok := sp.(SpecCandidater); ok && c.SetVerifyFilter(s.b, f) == nil {
			sc = c
			defer func() { _ = sc.SetVerifyFilter(s.b, nil) }()
		}
	}
	// pending ≥ 0: the session's logits are row pending of the latest
	// verification, still on the device (only candidates came).
	pending := -1
	defer func() { s.fetchPending(sp, pending, &err) }()
	row0 := make([]float32, s.cfg.Vocab)
	// rowLogits offers row of the latest verification to pick: its
	// candidates when they came, else the row fetched into dst.
	rowLogits := func(row int, dst []float32) (*Logits, bool, error) {
		if sc != nil {
			c, err := sc.VerifyCandidates(s.b, row)
			if err != nil {
				return nil, false, err
			}
			if c != nil {
				fetch := func() ([]float32, error) {
					if err := sp.VerifyLogits(s.b, row, dst); err != nil {
						return nil, s.opError(len(s.tokens)-1, "head", -1, err)
					}
					return dst, nil
				}
				return &Logits{cand: c, fetch: fetch}, false, nil
			}
		}
		if err := sp.VerifyLogits(s.b, row, dst); err != nil {
			return nil, false, err
		}
		return DenseLogits(dst), true, nil
	}
	var tok int32
	// choose is pick, failing when it asked for logits that could not be
	// fetched (the session then has none)
	choose := func(l *Logits) (int32, bool, error) {
		t, ok := pick(l)
		if err := l.Err(); err != nil {
			pending, s.logitsOK = -1, false
			return 0, false, err
		}
		return t, ok, nil
	}
	have := false    // tok chosen by pick, not yet decoded
	var next *Logits // what the next pick reads (nil: the session's logits)
	// a deep pass's rows of logits on the host path (hostPass), and its
	// drafts and greedy choices on the device's (specPassDeep)
	var rows [][]float32
	var ds, dcs []int32
	for n < max {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if !have {
			l := next
			if l == nil {
				if !s.logitsOK {
					return n, ErrNoLogits
				}
				l = DenseLogits(s.logits)
			}
			t, ok, err := choose(l)
			if err != nil || !ok {
				return n, err
			}
			tok, have, next = t, true, nil
		}
		if err := s.checkTokens([]int32{tok}); err != nil {
			return n, err
		}
		P := len(s.tokens)
		pending = -1 // a pass or step writes the logits after tok
		single := n+2 > max || P+2 > s.opts.MaxContext || !s.canDraft()
		paused := !single && s.plainStep() // paused: a step that stages its row, no draft
		if single || (paused && sp == nil) {
			if err := s.Decode(ctx, tok); err != nil {
				return n, err
			}
			n, have = n+1, false
			continue
		}
		if paused {
			s.logitsOK = false
			if _, err := s.stepPass(ctx, sp, tok); err != nil {
				return n, err
			}
			l, dense, err := rowLogits(0, s.logits)
			if err != nil {
				return n, s.opError(P, "head", -1, err)
			}
			if pending = 0; dense {
				pending, s.logitsOK = -1, true
			}
			n, have, next = n+1, false, l
			continue
		}
		check := s.checking()
		if k := s.passDrafts(max-n, P, deep); !check && k > 1 && (sp == nil || deep != nil) {
			// a pass of k drafts: pick reads the row after tok, then the
			// row after each draft it takes
			var err error
			if deep != nil {
				ds, dcs = passBuffers(ds, dcs, k)
				err = s.specPassDeep(ctx, deep, tok, ds, dcs)
			} else {
				ds, err = s.hostPass(ctx, tok, k, &rows)
			}
			if err != nil {
				s.logitsOK = false
				return n, err
			}
			n, have = n+1, false // tok is decoded
			c := 0
			for ; ; c++ {
				var l *Logits
				if deep == nil {
					l = DenseLogits(s.logits) // (after the last draft: the session's)
					if c < k {
						l = DenseLogits(rows[c])
					}
				} else {
					lc, dense, err := rowLogits(c, s.logits)
					if err != nil {
						err = s.opError(P+c, "head", -1, err)
						s.logitsOK = false
						return n, errors.Join(err, s.keepDrafts(P, c))
					}
					l, pending, s.logitsOK = lc, c, false
					if dense {
						pending, s.logitsOK = -1, true
					}
				}
				if c == k {
					next = l // every draft taken: the next pick reads the row after the last
					if deep == nil {
						next = nil
					}
					break
				}
				x, ok, err := choose(l)
				if err != nil {
					return n, errors.Join(err, s.keepDrafts(P, c))
				}
				if !ok || !s.observeDraft(P+1+c, ds[c], x, false) {
					// Keep tok and the drafts taken: the logits after the
					// last of them (row c), their staged rows.
					if err := s.keepDrafts(P, c); err != nil {
						s.logitsOK = false
						return n, err
					}
					if deep == nil {
						copy(s.logits, rows[c])
						s.logitsOK = true
					}
					if !ok {
						return n, nil
					}
					tok, have = x, true
					break
				}
				n++ // ds[c] is decoded (ForceAccept may commit it over another choice)
			}
			continue
		}
		d, l0, err := s.pickPass(ctx, sp, tok, check, row0, rowLogits)
		if err != nil {
			s.logitsOK = false
			return n, err
		}
		n, have = n+1, false // tok is decoded
		x, ok, err := choose(l0)
		if err != nil {
			return n, err
		}
		if check || !ok || !s.observeDraft(P+1, d, x, false) {
			if !check {
				// Keep tok only: the logits after it (row 0), its staged row.
				if err := s.keepDrafts(P, 0); err != nil {
					s.logitsOK = false
					return n, err
				}
			}
			if sp != nil {
				pending = 0
			} else {
				copy(s.logits, row0)
				s.logitsOK = true
			}
			if !ok {
				return n, nil
			}
			if check {
				s.observeDraft(P+1, d, x, true)
			}
			tok, have = x, true
			continue
		}
		// d is decoded (ForceAccept may commit it over another choice); on
		// the host path the session's logits are those after it already
		if sp != nil {
			l1, dense, err := rowLogits(1, s.logits)
			if err != nil {
				return n, s.opError(P+1, "head", -1, err)
			}
			if pending = 1; dense {
				pending, s.logitsOK = -1, true
			}
			next = l1
		}
		n++
	}
	return n, nil
}

// passBuffers returns ds and cs resized for a device pass of k drafts (k
// drafts, k + 1 choices), reusing their arrays when they hold that many.
func passBuffers(ds, cs []int32, k int) ([]int32, []int32) {
	if cap(ds) < k || cap(cs) < k+1 {
		ds, cs = make([]int32, k), make([]int32, k+1)
	}
	return ds[:k], cs[:k+1]
}

// hostPass runs a pass of k drafts for tok at the session's position on
// the host path — draftChain, then verifyChain — and returns the drafts:
// the logits after tok and after each draft but the last are left in
// (*rows)[0 … k−1] (grown as needed), those after the last draft are the
// session's, and the session holds tok and the drafts.
func (s *Session) hostPass(ctx context.Context, tok int32, k int, rows *[][]float32) ([]int32, error) {
	ds, err := s.draftChain(ctx, tok, k)
	if err != nil {
		return nil, err
	}
	for len(*rows) < k {
		*rows = append(*rows, make([]float32, s.cfg.Vocab))
	}
	if err := s.verifyChain(ctx, append([]int32{tok}, ds...), (*rows)[:k]); err != nil {
		return nil, err
	}
	return ds, nil
}

// pickPass runs one pass of decodePickedSpeculative for tok at the
// session's position P and returns the draft d and the logits after tok:
// the block's draft, then the chunk [tok, d] (check: [tok] alone). The
// session then holds tok and d (check: tok). On the host path (sp nil) the
// logits after tok are row0, and after d the session's; on sp's the
// verification's rows stay on the device, rowLogits offering row 0.
func (s *Session) pickPass(ctx context.Context, sp SpecPipeliner, tok int32, check bool, row0 []float32,
	rowLogits func(int, []float32) (*Logits, bool, error)) (int32, *Logits, error) {
	P := len(s.tokens)
	if sp == nil {
		d, err := s.draft(ctx, tok)
		if err != nil {
			return 0, nil, err
		}
		if check {
			if err := s.Decode(ctx, tok); err != nil {
				return 0, nil, err
			}
			copy(row0, s.logits)
		} else if err := s.verify(ctx, tok, d, row0); err != nil {
			return 0, nil, err
		}
		return d, DenseLogits(row0), nil
	}
	s.logitsOK = false
	d, _, _, err := s.specPass(ctx, sp, tok, check)
	if err != nil {
		return 0, nil, err
	}
	l0, _, err := rowLogits(0, row0)
	if err != nil {
		return 0, nil, s.opError(P, "head", -1, err)
	}
	return d, l0, nil
}
