package score

import (
	"context"
	"fmt"

	"ds4go/engine"
)

// Row is one row of logits a run produces. Logits is valid only during the
// callback that receives it.
type Row struct {
	Index  int       // row number, from 0
	Pos    int       // index of the last token consumed
	Logits []float32 // next-token logits, one per vocabulary entry
}

// RunOptions configures a run.
type RunOptions struct {
	// ChunkSize is the prefill chunk size (the engine's default when ≤ 0).
	ChunkSize int
	// Progress, if set, is called after each step with the tokens consumed
	// so far and their total.
	Progress func(done, total int)
}

// RunSeq runs a sequence on a backend: it prefills seq.Tokens[:Prefill] (in
// chunks of opts.ChunkSize), then decodes the remaining tokens one at a
// time, calling fn with the logits after the prefill and after each decode
// step. It stops at the first error from fn or the session, or when ctx is
// cancelled (returning ctx.Err()).
func RunSeq(ctx context.Context, be engine.Backend, seq *Seq, opts RunOptions, fn func(Row) error) error {
	cfg := be.Config()
	if err := seq.Validate(cfg.Vocab); err != nil {
		return err
	}
	s, err := engine.NewSession(be, engine.Options{ChunkSize: opts.ChunkSize, MaxContext: len(seq.Tokens)})
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	defer s.Close()
	total := len(seq.Tokens)
	if err := s.Prefill(ctx, seq.Tokens[:seq.Prefill]); err != nil {
		return fmt.Errorf("score: prefill of %d tokens: %w", seq.Prefill, err)
	}
	if opts.Progress != nil {
		opts.Progress(seq.Prefill, total)
	}
	if err := fn(Row{Index: 0, Pos: seq.Prefill - 1, Logits: s.Logits()}); err != nil {
		return err
	}
	for i, t := range seq.Tokens[seq.Prefill:] {
		if err := ctx.Err(); err != nil {
			return err
		}
		pos := seq.Prefill + i
		if err := s.Decode(ctx, t); err != nil {
			return fmt.Errorf("score: decode at position %d: %w", pos, err)
		}
		if opts.Progress != nil {
			opts.Progress(pos+1, total)
		}
		if err := fn(Row{Index: i + 1, Pos: pos, Logits: s.Logits()}); err != nil {
			return err
		}
	}
	return nil
}
