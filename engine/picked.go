package engine

import (
	"context"
	"errors"
)

// DecodePicked decodes up to max tokens, each chosen by pick from the
// current logits (a sampler's draw, say: Sampler.SampleLogits). pick
// returns the token and whether to decode it; a refusal ends the run.
// pick's logits are valid only during the call. It returns how many tokens
// it decoded. The session ends as if Decode(ctx, tok) had run for each
// accepted token, so the tokens are those of the loop
//
//	for { tok, ok := pick(DenseLogits(s.Logits())); if !ok { break }; s.Decode(ctx, tok) }
//
// and pick sees the same logits in the same order. With a filter (FilterFor
// the draws' options) a backend may send min-p's candidates instead of all
// the logits (Logits.Candidates; All fetches the rest when asked). A
// backend's error leaves the session without logits, holding the tokens
// whose steps are known to have completed (on a pipelined backend the step
// queued before the failing one may be left out); Rewind or Prefill go on
// from there. A picked token outside the vocabulary ends the run with
// ErrBadToken, the session as it was before that pick (its logits
// included).
//
// On a backend that implements PickPipeliner (and without Options.Trace)
// each step is queued before its token is chosen, and waits for it on the
// device: while the device runs step k the host records and queues step
// k+1, then picks its token from step k's logits. A refused token, or a
// cancelled ctx, then costs one step of discarded work, as in DecodeGreedy.
//
// With Options.Draft it decodes speculatively instead
// (decodePickedSpeculative): each pass drafts the token after the picked
// one with the MTP block (and, with Options.DraftDepth, the tokens after
// that), decodes them together, and keeps a draft when pick, given the
// logits after the token before it, chooses it. pick still sees plain
// decoding's logits in the same order (with f, on a backend that
// implements SpecCandidater, min-p's candidates of the verification's
// rows), so a seeded sampler draws the same tokens; Stats counts the
// drafts, and the pausing policy is DecodeGreedy's.
func (s *Session) DecodePicked(ctx context.Context, max int, f *PickFilter, pick func(l *Logits) (int32, bool)) (int, error) {
	if s.closed {
		return 0, ErrClosed
	}
	if s.mtp != nil && !s.mtp.off {
		return s.decodePickedSpeculative(ctx, max, f, pick)
	}
	n := 0
	if pp, ok := s.be.(PickPipeliner); ok && s.pipelinable(max) {
		var done bool
		var err error
		if n, done, err = s.pickPipelined(ctx, pp, max, f, pick); done || err != nil {
			return n, err
		}
	}
	return s.stepLoop(ctx, n, max, func(logits []float32) (int32, bool) { return pick(DenseLogits(logits)) })
}

// pickPipelined is DecodePicked on a PickPipeliner. At most two steps are
// queued: the latest committed one, whose logits the host waits for and
// picks from, and the next, which waits on the device for that pick. done
// reports that the run is over (max decoded, a token refused, ctx cancelled
// or an error); when it is not, the caller goes on one step at a time (the
// context is about to fill or the rings cannot continue), with the
// session's tokens and logits consistent and no token picked from them yet.
func (s *Session) pickPipelined(ctx context.Context, pp PickPipeliner, max int, f *PickFilter, pick func(*Logits) (int32, bool)) (n int, done bool, err error) {
	pos := len(s.tokens)
	if pos+2 > s.opts.MaxContext {
		return 0, false, nil
	}
	if err := s.ensureContinuable(ctx); err != nil {
		return 0, true, err
	}
	tok, ok := pick(DenseLogits(s.logits))
	if !ok {
		return 0, true, nil
	}
	if err := s.checkTokens([]int32{tok}); err != nil {
		return 0, true, err
	}
	// waiting: a queued step waits on the device for its token. However the
	// run ends, it is given one (and discarded), or the device would wait
	// for it until the backend's time limit.
	waiting := false
	defer func() {
		if waiting {
			_ = pp.SupplyToken(s.b, 0)
		}
	}()
	// step queues the one-token chunk at p: the token from the host (first)
	// or one the device waits for.
	step := func(p int, first bool) error {
		s.ret.written(p, 1)
		if first {
			if err := s.be.Embed(s.b, p, []int32{tok}); err != nil {
				return s.opError(p, "embed", -1, err)
			}
		} else {
			if err := pp.EmbedPicked(s.b, p); err != nil {
				return s.opError(p, "embed", -1, err)
			}
			waiting = true
		}
		if err := s.blocks(ctx, p, func(Stage, int) {}); err != nil {
			return err
		}
		if err := pp.HeadPicked(s.b, f); err != nil {
			return s.opError(p, "head", -1, err)
		}
		return nil
	}
	s.logitsOK = false
	if err := step(pos, true); err != nil {
		return 0, true, err
	}
	in := tok // the token the queued step at pos consumes
	for {
		// the next step, queued before its token is picked (ahead), unless
		// the backend finds it cannot be: then it runs after the pick
		spec := n+1 < max && pos+2 <= s.opts.MaxContext && ctx.Err() == nil && s.ret.continuable(pos+1)
		ahead := false
		if spec {
			err := step(pos+1, false)
			switch {
			case err == nil:
				ahead = true
			case errors.Is(err, ErrPickAhead):
				waiting = false // (the backend dropped the step)
			default:
				return n, true, err
			}
		}
		dense, cand, err := pp.PickedLogits(s.b)
		if err != nil {
			return n, true, s.opError(pos, "head", -1, err)
		}
		s.tokens = append(s.tokens, in)
		n++
		pos++
		// the step's logits: all of them, or candidates with the rest
		// fetched into the session's buffer when pick asks for them
		lg := &Logits{dense: dense, cand: cand}
		if dense == nil {
			lg.fetch = func() ([]float32, error) {
				if err := pp.PickedAll(s.b, s.logits); err != nil {
					return nil, s.opError(pos-1, "head", -1, err)
				}
				return s.logits, nil
			}
		}
		// commit makes them the session's (a step committed after them
		// replaces them)
		commit := func() error {
			if dense != nil {
				copy(s.logits, dense)
			} else if lg.All() == nil {
				return lg.Err()
			}
			s.logitsOK = true
			return nil
		}
		if !spec {
			if err := commit(); err != nil {
				return n, true, err
			}
			if err := ctx.Err(); err != nil {
				return n, true, err
			}
			return n, n >= max, nil
		}
		var c int32
		ok := false
		if ctx.Err() == nil {
			c, ok = pick(lg)
		}
		if err := lg.Err(); err != nil {
			return n, true, err
		}
		if ok {
			if err := s.checkTokens([]int32{c}); err != nil {
				// the step queued for c is discarded
				if e := commit(); e != nil {
					return n, true, e
				}
				return n, true, err
			}
		}
		if !ok {
			// the step queued for the refused token is discarded
			if err := commit(); err != nil {
				return n, true, err
			}
			return n, true, ctx.Err()
		}
		in = c
		if !ahead {
			tok = c
			if err := step(pos, true); err != nil {
				return n, true, err
			}
			continue
		}
		if err := pp.SupplyToken(s.b, c); err != nil {
			return n, true, s.opError(pos, "embed", -1, err)
		}
		waiting = false
	}
}
