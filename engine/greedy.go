package engine

import (
	"context"
	"fmt"
)

// DecodeGreedy decodes up to max tokens greedily. Each token is the greedy
// choice (Greedy) of the current logits and is offered to emit first; a
// token emit refuses is not decoded and ends the run. It returns how many
// tokens it decoded. The session ends as if Decode(ctx, Greedy(Logits()))
// had run for each accepted token. An error leaves it without logits,
// holding the tokens whose steps are known to have completed (on a
// pipelined backend the step queued before the failing one may be left
// out); Rewind or Prefill go on from there.
//
// On a backend that implements GreedyPipeliner (and without Options.Trace)
// the choices are made on the device, and each step is queued before the
// host has read the token it consumes, so the device never waits for the
// host between tokens. A refused token, or a cancelled ctx, then costs one
// step of discarded work: it wrote the KV state of a position the session
// does not hold, which the next token there overwrites (the Backend
// contract addresses all state by position).
//
// With Options.Draft it decodes speculatively
// instead, one pass for the token and the MTP block's draft of the next
// (decodeSpeculative; Options.DraftDepth: the next k drafts): the same
// tokens, up to two (k + 1) a pass. Stats counts the
// drafts and those accepted. Unless Options.DraftAlways, a run pauses
// speculation while the drafts' acceptance, measured pass by pass, is too
// low to pay for verifying them (draftPolicy): its passes then decode one
// token and only check the draft against the greedy choice — still the
// same tokens.
func (s *Session) DecodeGreedy(ctx context.Context, max int, emit func(tok int32) bool) (int, error) {
	if s.closed {
		return 0, ErrClosed
	}
	if s.mtp != nil && !s.mtp.off {
		return s.decodeSpeculative(ctx, max, emit)
	}
	n := 0
	if gp, ok := s.be.(GreedyPipeliner); ok && s.pipelinable(max) {
		var done bool
		var err error
		if n, done, err = s.greedyPipelined(ctx, gp, max, emit); done || err != nil {
			return n, err
		}
	}
	return s.stepLoop(ctx, n, max, func(logits []float32) (int32, bool) {
		tok := Greedy(logits)
		return tok, emit(tok)
	})
}

// pipelinable reports whether a decode run of max tokens may queue its
// steps ahead on a pipelining backend (DecodeGreedy, DecodePicked): more
// than one step, no trace to record each step's work, and the session's
// logits current.
func (s *Session) pipelinable(max int) bool {
	return s.opts.Trace == nil && max > 1 && s.logitsOK
}

// stepLoop decodes from the n-th token to the max-th one step at a time,
// each token chosen by pick from the session's logits (a refusal ends the
// run), and returns the count reached.
func (s *Session) stepLoop(ctx context.Context, n, max int, pick func([]float32) (int32, bool)) (int, error) {
	for ; n < max; n++ {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if !s.logitsOK {
			return n, ErrNoLogits
		}
		tok, ok := pick(s.logits)
		if !ok {
			return n, nil
		}
		if err := s.Decode(ctx, tok); err != nil {
			return n, err
		}
	}
	return n, nil
}

// greedyPipelined is DecodeGreedy on a GreedyPipeliner. At most two steps
// are queued: the latest committed one's choice is read while the next
// step, which consumes it on the device, runs. done reports that the run is
// over (max decoded, a token refused, ctx cancelled or an error); when it is
// not, the caller goes on one step at a time (the context is about to fill
// or the rings cannot continue), with the session's tokens and logits
// consistent and the pending choice not yet offered to emit.
func (s *Session) greedyPipelined(ctx context.Context, gp GreedyPipeliner, max int, emit func(int32) bool) (n int, done bool, err error) {
	pos := len(s.tokens)
	if pos+2 > s.opts.MaxContext {
		return 0, false, nil
	}
	if err := s.ensureContinuable(ctx); err != nil {
		return 0, true, err
	}
	tok := Greedy(s.logits)
	if !emit(tok) {
		return 0, true, nil
	}
	// step queues the one-token chunk at p: the token from the host (first)
	// or the previous step's choice on the device.
	step := func(p int, first bool) error {
		s.ret.written(p, 1)
		var err error
		if first {
			err = s.be.Embed(s.b, p, []int32{tok})
		} else {
			err = gp.EmbedGreedy(s.b, p)
		}
		if err != nil {
			return s.opError(p, "embed", -1, err)
		}
		if err := s.blocks(ctx, p, func(Stage, int) {}); err != nil {
			return err
		}
		if err := gp.HeadGreedy(s.b); err != nil {
			return s.opError(p, "head", -1, err)
		}
		return nil
	}
	s.logitsOK = false
	if err := s.checkTokens([]int32{tok}); err != nil {
		return 0, true, err
	}
	if err := step(pos, true); err != nil {
		return 0, true, err
	}
	in := tok // the token the queued step at pos consumes
	logits := func(back int) error {
		if err := gp.GreedyLogits(s.b, back, s.logits); err != nil {
			return s.opError(len(s.tokens)-1, "head", -1, err)
		}
		s.logitsOK = true
		return nil
	}
	for {
		// the next step, queued before the host reads the token it consumes
		spec := n+1 < max && pos+2 <= s.opts.MaxContext && ctx.Err() == nil && s.ret.continuable(pos+1)
		if spec {
			if err := step(pos+1, false); err != nil {
				return n, true, err
			}
		}
		c, err := gp.GreedyToken(s.b)
		if err != nil {
			return n, true, s.opError(pos, "head", -1, err)
		}
		if c < 0 || int(c) >= s.cfg.Vocab {
			return n, true, fmt.Errorf("engine: %s backend: greedy choice %d at position %d: %w", s.be.Name(), c, pos, ErrBadToken)
		}
		s.tokens = append(s.tokens, in)
		n++
		pos++
		if !spec {
			if err := logits(0); err != nil {
				return n, true, err
			}
			if err := ctx.Err(); err != nil {
				return n, true, err
			}
			return n, n >= max, nil
		}
		if err := ctx.Err(); err != nil || !emit(c) {
			// the step queued for c is discarded
			if e := logits(1); e != nil {
				return n, true, e
			}
			return n, true, err
		}
		in = c
	}
}
