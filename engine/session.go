package engine

import (
	"context"
	"errors"
	"fmt"

	"ds4go/model"
)

// Errors a Session returns (wrapped, with details); test with errors.Is.
var (
	// ErrBadToken: a token id outside [0, Vocab).
	ErrBadToken = errors.New("engine: token id out of range")
	// ErrContextFull: the tokens would exceed the session's maximum context.
	ErrContextFull = errors.New("engine: context is full")
	// ErrNoLogits: there are no logits for the next token (empty session, or
	// the last call failed before producing them).
	ErrNoLogits = errors.New("engine: no logits")
	// ErrClosed: the session has been closed.
	ErrClosed = errors.New("engine: session is closed")
)

// Defaults of Options.
const (
	DefaultChunkSize   = 128
	DefaultRewindSlack = 64
)

// Options configures a Session. The zero value is usable.
type Options struct {
	// ChunkSize is the number of tokens a prefill processes per pass through
	// the layers (when ≤ 0: the backend's ChunkSizer preference, else
	// DefaultChunkSize). Larger chunks amortise weight reads over more tokens
	// and need more activation memory.
	ChunkSize int
	// MaxContext bounds the session's positions (the model's ContextLen when
	// ≤ 0).
	MaxContext int
	// RewindSlack is how many positions beyond what the forward pass needs
	// the window and compressor rings keep (DefaultRewindSlack when 0, none
	// when negative). A rewind of up to about this many tokens is exact and
	// cheap; a longer one re-prefills the kept prefix (see Rewind).
	RewindSlack int
	// Trace, if set, is called after every op of the forward pass with a
	// reader for the chunk's activations (needs a backend that implements
	// Inspector). For tests and debugging; it slows the pass down.
	Trace func(TraceEvent)
	// Draft runs the model's MTP block beside the forward pass, and
	// DecodeGreedy then decodes speculatively: each step verifies the
	// block's draft of the token after next in the same pass (see
	// DecodeGreedy). Needs a backend that implements Drafter, with an MTP
	// block in its weights.
	Draft bool
	// DraftOverride, with Draft, replaces each of the block's greedy drafts
	// (of the token at pos) with its result. Benchmarks use it to measure
	// speculative decoding at a chosen acceptance rate on random weights,
	// whose drafts the model never accepts; tests, to reach every path.
	DraftOverride func(pos int, draft int32) int32
	// ForceAccept, with Draft, commits the draft of the token at pos when
	// it returns true, whatever the model's greedy choice there: the tokens
	// are then not greedy decoding's. Benchmarks use it to time a chosen
	// acceptance rate on random weights (a pass costs the same whichever
	// token it commits).
	ForceAccept func(pos int) bool
	// DraftAlways, with Draft, verifies every draft. Otherwise speculative
	// decoding pauses while the drafts' measured acceptance is too low to
	// pay for their verification: its passes then decode one token and
	// only check the draft against the greedy choice (Stats.Checked),
	// which keeps the MTP block in step and measures the acceptance on,
	// until it is high enough to verify again (see DecodeGreedy).
	DraftAlways bool
	// DraftDepth, with Draft, is how many tokens the MTP block drafts for a
	// pass of greedy decoding (DecodeGreedy): 0 or 1 drafts one (a pass of
	// two tokens); k > 1 drafts the next k − 1 by running the block again,
	// each time over its own output streams of the row before (its
	// stand-in for the main model's, which only the verification computes)
	// and the draft before, as ds4.c's --mtp-draft k+1 does. A pass then
	// verifies k + 1 tokens and commits the drafts up to the first one
	// that is not the greedy choice: the same tokens as plain greedy
	// decoding. Sampled decoding (DecodePicked) drafts as deep (since v73),
	// each draft taken only when the pick's own draw lands on it; the
	// paused policy's checking passes draft one. A DeepSpecPipeliner runs
	// passes up to its PassDrafts on the device, deeper ones take the
	// engine's host path. On a backend that
	// reports what deeper passes cost (DraftDepthCoster) a pass drafts only
	// as deep as pays at the measured acceptance rate (one draft where
	// deeper passes do not pay), unless DraftAlways.
	DraftDepth int
}

// Stage identifies the point of the forward pass a TraceEvent reports.
type Stage uint8

// Trace stages, in the order the forward pass reaches them. Layer-less
// stages (StageEmbed, StageHead) report layer −1.
const (
	StageEmbed    Stage = iota // streams = embeddings
	StageAttnIn                // ActSubIn = attention input (after hc_pre + attn_norm)
	StageAttnOut               // ActSubOut = attention output
	StageFFNIn                 // ActSubIn = FFN input (after hc_pre + ffn_norm)
	StageFFNOut                // ActSubOut = FFN output
	StageBlockOut              // ActStreams = the block's output streams
	StageHead                  // ActHeadIn = the head's input (after hc_head + norm)
)

// TraceEvent is one observation of a chunk's forward pass.
type TraceEvent struct {
	Stage Stage
	Layer int
	Pos   int // position of the chunk's first token
	N     int // tokens in the chunk
	// Read copies an activation of the chunk (N rows) into dst.
	Read func(a Activation, dst []float32) error
}

// Stats counts work a session did beyond the tokens it was given.
type Stats struct {
	// Rederived counts positions recomputed because the KV rings no longer
	// held what a rewind (or a continuation after a cancelled chunk) needed.
	Rederived int
	// Rederivations counts those re-prefills.
	Rederivations int
	// Drafted counts the MTP drafts verified by speculative decoding, and
	// Accepted those the model's greedy choice confirmed (with
	// Options.DraftDepth: a pass's drafts up to its first rejected one; the
	// drafts after it are not counted).
	Drafted, Accepted int
	// Checked counts the drafts only checked against the greedy choice
	// while speculation paused (Options.DraftAlways), and CheckAccepted
	// those the choice matched (or ForceAccept accepted).
	Checked, CheckAccepted int
}

// Session is one sequence being processed by a model: its tokens, its KV
// state (held by the backend) and the logits for its next token. It is not
// safe for concurrent use; several sessions may share a backend.
type Session struct {
	be     Backend
	cfg    *model.Config
	opts   Options
	layout *StateLayout
	st     State
	b      Batch

	tokens   []int32    // processed tokens; len = position of the next one
	ret      *retention // which positions the KV rings still hold
	logits   []float32  // logits after tokens[len−1] when logitsOK
	logitsOK bool
	rows     []int     // scratch: chunk rows whose logits Head computes
	buf      []float32 // scratch: Head output
	stats    Stats
	closed   bool
	runEnd   int     // position after the tokens of the current run
	mtp      *drafts // nil unless Options.Draft
}

// NewSession starts an empty session on a backend.
func NewSession(be Backend, opts Options) (*Session, error) {
	cfg := be.Config()
	if opts.ChunkSize <= 0 {
		opts.ChunkSize = DefaultChunkSize
		if cs, ok := be.(ChunkSizer); ok && cs.PreferredChunk() > 0 {
			opts.ChunkSize = cs.PreferredChunk()
		}
	}
	if opts.MaxContext <= 0 {
		opts.MaxContext = cfg.ContextLen
	}
	if opts.MaxContext <= 0 {
		return nil, fmt.Errorf("engine: the model has no context length; set Options.MaxContext")
	}
	if opts.DraftDepth < 0 || opts.DraftDepth > MaxDraftDepth {
		return nil, fmt.Errorf("engine: draft depth %d outside [0, %d]", opts.DraftDepth, MaxDraftDepth)
	}
	switch {
	case opts.RewindSlack == 0:
		opts.RewindSlack = DefaultRewindSlack
	case opts.RewindSlack < 0:
		opts.RewindSlack = 0
	}
	layout, err := NewStateLayout(cfg, opts.MaxContext, opts.RewindSlack)
	if err != nil {
		return nil, err
	}
	st, err := be.NewState(layout)
	if err != nil {
		return nil, fmt.Errorf("engine: %s backend: new state: %w", be.Name(), err)
	}
	b, err := be.NewBatch(opts.ChunkSize)
	if err != nil {
		st.Release()
		return nil, fmt.Errorf("engine: %s backend: new batch: %w", be.Name(), err)
	}
	s := &Session{be: be, cfg: cfg, opts: opts, layout: layout, st: st, b: b,
		ret: newRetention(layout), logits: make([]float32, cfg.Vocab)}
	if opts.Draft {
		if s.mtp, err = newDrafts(be, layout); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close releases the session's backend memory.
func (s *Session) Close() {
	if s.closed {
		return
	}
	s.closed = true
	s.st.Release()
	s.b.Release()
	if s.mtp != nil {
		s.mtp.release()
	}
}

// Backend returns the session's backend.
func (s *Session) Backend() Backend { return s.be }

// State returns the session's backend state handle (for inspection with
// Backend.ReadState; the session owns it).
func (s *Session) State() State { return s.st }

// Layout returns the session's state layout.
func (s *Session) Layout() *StateLayout { return s.layout }

// Pos returns the number of tokens processed: the position of the next one.
func (s *Session) Pos() int { return len(s.tokens) }

// Tokens returns a copy of the processed tokens.
func (s *Session) Tokens() []int32 { return append([]int32(nil), s.tokens...) }

// Stats returns the session's work counters.
func (s *Session) Stats() Stats { return s.stats }

// Logits returns the logits for the token after the processed ones (Vocab
// values; the slice is the session's and changes with the next call), or
// nil when there are none (empty session, or a failed call; Rewind(ctx,
// Pos()) recomputes them).
func (s *Session) Logits() []float32 {
	if !s.logitsOK {
		return nil
	}
	return s.logits
}

// Prefill processes tokens in chunks of Options.ChunkSize. Cancellation is
// checked between chunks and between layers. On error the session holds
// the chunks that completed (Pos tells how many tokens).
func (s *Session) Prefill(ctx context.Context, tokens []int32) error {
	return s.run(ctx, tokens, 0, nil)
}

// PrefillAll is Prefill that also reports the logits after every token:
// fn(p, logits) for each position p of the new tokens, in order (the slice
// is reused after fn returns). It costs a vocabulary projection per token.
func (s *Session) PrefillAll(ctx context.Context, tokens []int32, fn func(pos int, logits []float32)) error {
	return s.run(ctx, tokens, 0, fn)
}

// PrefillFrom is PrefillAll reporting only the positions ≥ from (absolute
// positions): the vocabulary projection is computed for those rows (and the
// last one) only. Scoring the second half of a window costs half the head
// work of PrefillAll.
func (s *Session) PrefillFrom(ctx context.Context, tokens []int32, from int, fn func(pos int, logits []float32)) error {
	return s.run(ctx, tokens, from, fn)
}

// Decode processes one token.
func (s *Session) Decode(ctx context.Context, token int32) error {
	return s.run(ctx, []int32{token}, 0, nil)
}

// Sample draws the next token from the current logits.
func (s *Session) Sample(sm *Sampler) (int32, error) {
	if !s.logitsOK {
		return 0, ErrNoLogits
	}
	return sm.Sample(s.logits), nil
}

// Rewind shortens the session to its first n tokens and recomputes the
// logits for token n. Rewinding to n > 0 re-runs token n−1 (one decode
// step). When the KV rings still hold what position n−1 needs (a rewind of
// up to about Options.RewindSlack tokens past the window/frontier needs) the
// state is truncated in place; otherwise the kept prefix is re-prefilled
// from scratch, which costs as much as prefilling n−1 tokens (Stats counts
// it). Compressed rows are indexed by row and never need recomputation.
// If ctx is cancelled during a re-prefill the session holds the prefix
// processed so far.
func (s *Session) Rewind(ctx context.Context, n int) error {
	if s.closed {
		return ErrClosed
	}
	if n < 0 || n > len(s.tokens) {
		return fmt.Errorf("engine: rewind to %d: the session has %d tokens", n, len(s.tokens))
	}
	if n == len(s.tokens) && (s.logitsOK || n == 0) {
		return nil
	}
	s.logitsOK = false
	s.forgetStaged()
	if n == 0 {
		s.tokens = s.tokens[:0]
		return nil
	}
	last := s.tokens[n-1]
	s.tokens = s.tokens[:n-1]
	return s.run(ctx, []int32{last}, 0, nil)
}

// Reset empties the session (as Rewind(ctx, 0)).
func (s *Session) Reset() {
	s.tokens = s.tokens[:0]
	s.logitsOK = false
	s.forgetStaged()
}

func (s *Session) checkTokens(tokens []int32) error {
	for i, t := range tokens {
		if t < 0 || int(t) >= s.cfg.Vocab {
			return fmt.Errorf("%w: token %d (index %d) is not in [0, %d)", ErrBadToken, t, i, s.cfg.Vocab)
		}
	}
	if len(s.tokens)+len(tokens) > s.opts.MaxContext {
		return fmt.Errorf("%w: %d tokens + %d new > max context %d", ErrContextFull, len(s.tokens), len(tokens), s.opts.MaxContext)
	}
	return nil
}

// run processes tokens after the current ones, chunk by chunk.
func (s *Session) run(ctx context.Context, tokens []int32, from int, fn func(int, []float32)) error {
	if s.closed {
		return ErrClosed
	}
	if err := s.checkTokens(tokens); err != nil {
		return err
	}
	s.runEnd = len(s.tokens) + len(tokens)
	if err := s.ensureContinuable(ctx); err != nil {
		return err
	}
	for off := 0; off < len(tokens); off += s.opts.ChunkSize {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.chunk(ctx, tokens[off:min(off+s.opts.ChunkSize, len(tokens))], from, fn); err != nil {
			return err
		}
		if err := s.advanceMTP(ctx); err != nil {
			return err
		}
	}
	return nil
}

// ensureContinuable re-derives the state by re-prefilling the kept tokens
// when the rings no longer hold what the next position needs.
func (s *Session) ensureContinuable(ctx context.Context) error {
	pos := len(s.tokens)
	if s.ret.continuable(pos) {
		return nil
	}
	keep := append([]int32(nil), s.tokens...)
	s.tokens = s.tokens[:0]
	s.ret.reset()
	s.logitsOK = false
	s.stats.Rederivations++
	s.stats.Rederived += len(keep)
	for off := 0; off < len(keep); off += s.opts.ChunkSize {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("engine: re-deriving the KV state: %w", err)
		}
		if err := s.chunk(ctx, keep[off:min(off+s.opts.ChunkSize, len(keep))], 0, nil); err != nil {
			return fmt.Errorf("engine: re-deriving the KV state: %w", err)
		}
	}
	return nil
}

// chunk runs one chunk through every layer and the head. The session's
// tokens and logits change only when it succeeds; the rings may have been
// written either way (the retention record says so).
func (s *Session) chunk(ctx context.Context, toks []int32, from int, fn func(int, []float32)) error {
	be, b := s.be, s.b
	pos, n := len(s.tokens), len(toks)
	s.ret.written(pos, n)
	trace := s.tracer(pos, n)
	if err := be.Embed(b, pos, toks); err != nil {
		return s.opError(pos, "embed", -1, err)
	}
	trace(StageEmbed, -1)
	if err := s.blocks(ctx, pos, trace); err != nil {
		return err
	}
	if err := s.stageMTP(pos, n); err != nil {
		return err
	}
	// Head rows: those fn reports (positions ≥ from), and always the last
	// (the session's next-token logits).
	s.rows = s.rows[:0]
	if fn != nil {
		for r := max(0, from-pos); r < n-1; r++ {
			s.rows = append(s.rows, r)
		}
	}
	s.rows = append(s.rows, n-1)
	V := s.cfg.Vocab
	// Only the next token's row and no fn (decode, plain prefill): Head
	// writes the session's logits in place (no copy of a vocabulary row per
	// token); they are invalid until it succeeds.
	direct := fn == nil && len(s.rows) == 1
	var out []float32
	if direct {
		out = s.logits
		s.logitsOK = false
	} else {
		if need := len(s.rows) * V; cap(s.buf) < need {
			s.buf = make([]float32, need)
		}
		out = s.buf[:len(s.rows)*V]
	}
	if err := be.Head(b, s.rows, out); err != nil {
		return s.opError(pos, "head", -1, err)
	}
	trace(StageHead, -1)
	if !direct {
		copy(s.logits, out[len(out)-V:])
	}
	s.logitsOK = true
	s.tokens = append(s.tokens, toks...)
	if fn != nil {
		for i, r := range s.rows {
			if pos+r >= from {
				fn(pos+r, out[i*V:(i+1)*V])
			}
		}
	}
	return nil
}

// blocks runs every layer's two sub-blocks on the chunk embedded at pos.
func (s *Session) blocks(ctx context.Context, pos int, trace func(Stage, int)) error {
	return s.runBlocks(ctx, s.b, s.st, 0, s.cfg.Layers, pos, trace)
}

// runBlocks runs blocks [from, to) on batch b with state st (the layers,
// or the MTP block alone).
func (s *Session) runBlocks(ctx context.Context, b Batch, st State, from, to, pos int, trace func(Stage, int)) error {
	return RunBlocks(ctx, s.be, b, st, from, to, pos, trace)
}

// RunBlocks runs blocks [from, to) on be's batch b, embedded at pos, with
// state st: each block's two sub-blocks, HCPre, the mixer (Attention or
// FFN), HCPost, in the order a session runs them (the layers 0 …
// Config().Layers−1; the MTP block is block Config().Layers). trace, when
// set, is called after each stage. It stops at the first error, wrapped
// with the op, the layer and pos, or when ctx is done.
func RunBlocks(ctx context.Context, be Backend, b Batch, st State, from, to, pos int, trace func(Stage, int)) error {
	if trace == nil {
		trace = func(Stage, int) {}
	}
	for l := from; l < to; l++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := be.HCPre(b, l, AttnSub); err != nil {
			return opError(be, pos, "hc_pre attn", l, err)
		}
		trace(StageAttnIn, l)
		if err := be.Attention(b, st, l); err != nil {
			return opError(be, pos, "attention", l, err)
		}
		trace(StageAttnOut, l)
		if err := be.HCPost(b, l, AttnSub); err != nil {
			return opError(be, pos, "hc_post attn", l, err)
		}
		if err := be.HCPre(b, l, FFNSub); err != nil {
			return opError(be, pos, "hc_pre ffn", l, err)
		}
		trace(StageFFNIn, l)
		if err := be.FFN(b, l); err != nil {
			return opError(be, pos, "ffn", l, err)
		}
		trace(StageFFNOut, l)
		if err := be.HCPost(b, l, FFNSub); err != nil {
			return opError(be, pos, "hc_post ffn", l, err)
		}
		trace(StageBlockOut, l)
	}
	return nil
}

// opError wraps a backend op's error with the op, the layer (−1: none) and
// the chunk's position.
func (s *Session) opError(pos int, op string, layer int, err error) error {
	return opError(s.be, pos, op, layer, err)
}

// opError is Session.opError for backend be.
func opError(be Backend, pos int, op string, layer int, err error) error {
	if layer < 0 {
		return fmt.Errorf("engine: %s backend: %s at position %d: %w", be.Name(), op, pos, err)
	}
	return fmt.Errorf("engine: %s backend: layer %d %s at position %d: %w", be.Name(), layer, op, pos, err)
}

func (s *Session) tracer(pos, n int) func(Stage, int) {
	insp, ok := s.be.(Inspector)
	if s.opts.Trace == nil || !ok {
		return func(Stage, int) {}
	}
	read := func(a Activation, dst []float32) error { return insp.ReadActivation(s.b, a, dst) }
	return func(st Stage, layer int) {
		s.opts.Trace(TraceEvent{Stage: st, Layer: layer, Pos: pos, N: n, Read: read})
	}
}
