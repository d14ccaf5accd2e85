// Package engineadapter serves ds4go's engine (package engine on a backend)
// through the server's narrow Engine/Session interface, for a model opened
// by package loader (a GGUF file or the built-in demo model, on the CPU or
// CUDA backend).
package engineadapter

import (
	"context"
	"errors"
	"fmt"
	"io"

	"ds4go/engine"
	"ds4go/loader"
	"ds4go/model"
	"ds4go/quant"
	"ds4go/server"
	"ds4go/tokenizer"
)

// Engine adapts an engine.Backend to server.Engine.
type Engine struct {
	Backend engine.Backend
	Tok     *tokenizer.Tokenizer
	// Opts configure every session (MaxContext is the served context).
	Opts engine.Options
	// Quant is the routed experts' quantization in bits (2, 4, 8; 0
	// unknown), recorded in disk KV cache headers.
	Quant uint8
}

// QuantBits implements server.CacheModel.
func (e *Engine) QuantBits() uint8 { return e.Quant }

// expertQuantBits names the routed experts' quantization the way ds4's
// cache header does: 2 for the q2 files (IQ2_XXS/Q2_K), 4 for Q4_K, 8 for
// Q8_0, 16 for F16/BF16, 0 otherwise.
func expertQuantBits(w *model.Weights) uint8 {
	if len(w.Layers) == 0 || w.Layers[0].DownExps == nil {
		return 0
	}
	switch w.Layers[0].DownExps.Type {
	case quant.Q2_K, quant.IQ2_XXS:
		return 2
	case quant.Q4_K:
		return 4
	case quant.Q8_0:
		return 8
	case quant.F16, quant.BF16:
		return 16
	}
	return 0
}

// Tokenizer implements server.Engine.
func (e *Engine) Tokenizer() *tokenizer.Tokenizer { return e.Tok }

// ContextSize implements server.Engine.
func (e *Engine) ContextSize() int {
	if e.Opts.MaxContext > 0 {
		return e.Opts.MaxContext
	}
	return e.Backend.Config().ContextLen
}

// NewSession implements server.Engine.
func (e *Engine) NewSession() (server.Session, error) {
	s, err := engine.NewSession(e.Backend, e.Opts)
	if err != nil {
		return nil, err
	}
	return &session{s: s}, nil
}

// session keeps its own copy of the token list (engine.Session.Tokens
// copies on every call) and maps engine errors to the server's.
type session struct {
	s    *engine.Session
	toks []int32
}

func (x *session) Tokens() []int32 { return x.toks }

// DraftStats implements server.DraftSession: the session's draft counts.
func (x *session) DraftStats() engine.Stats { return x.s.Stats() }

func (x *session) sync() { x.toks = x.s.Tokens() }

func (x *session) Rewind(ctx context.Context, n int) error {
	err := x.s.Rewind(ctx, n)
	x.sync()
	return err
}

func (x *session) Prefill(ctx context.Context, toks []int32) error {
	if err := x.s.Prefill(ctx, toks); err != nil {
		x.sync()
		if errors.Is(err, engine.ErrContextFull) {
			return fmt.Errorf("%w: %w", server.ErrContextFull, err)
		}
		return err
	}
	x.toks = append(x.toks, toks...)
	return nil
}

// DecodePicked implements server.PickSession: engine.Session.DecodePicked,
// the token list kept in step as in DecodeGreedy.
func (x *session) DecodePicked(ctx context.Context, max int, f *engine.PickFilter, pick func(*engine.Logits) (int32, bool)) (int, error) {
	return x.tracked(func(catchUp func(), took func(int32)) (int, error) {
		return x.s.DecodePicked(ctx, max, f, func(l *engine.Logits) (int32, bool) {
			catchUp()
			t, ok := pick(l)
			if ok {
				took(t)
			}
			return t, ok
		})
	})
}

// DecodeGreedy implements server.GreedySession: engine.Session.DecodeGreedy,
// the token list kept in step.
func (x *session) DecodeGreedy(ctx context.Context, max int, emit func(int32) bool) (int, error) {
	return x.tracked(func(catchUp func(), took func(int32)) (int, error) {
		return x.s.DecodeGreedy(ctx, max, func(t int32) bool {
			catchUp()
			if !emit(t) {
				return false
			}
			took(t)
			return true
		})
	})
}

// tracked runs a decode whose callbacks call catchUp first and report
// each accepted token through took, keeping x's token list in step: an
// accepted token joins it once the session holds it (before the next
// callback, which may read the list, and at the end).
func (x *session) tracked(decode func(catchUp func(), took func(int32)) (int, error)) (int, error) {
	var accepted []int32 // accepted, not yet in x.toks
	catchUp := func() {
		for len(x.toks) < x.s.Pos() && len(accepted) > 0 {
			x.toks = append(x.toks, accepted[0])
			accepted = accepted[1:]
		}
	}
	n, err := decode(catchUp, func(t int32) { accepted = append(accepted, t) })
	catchUp()
	if len(x.toks) != x.s.Pos() {
		x.sync()
	}
	if errors.Is(err, engine.ErrContextFull) {
		return n, fmt.Errorf("%w: %w", server.ErrContextFull, err)
	}
	return n, err
}

func (x *session) Logits() []float32 { return x.s.Logits() }

// PayloadSize implements server.PayloadSession.
func (x *session) PayloadSize() int64 { return x.s.PayloadSize() }

// WritePayload implements server.PayloadSession (the DSV4 payload).
func (x *session) WritePayload(w io.Writer) error { return x.s.WritePayload(w) }

// ReadPayload implements server.PayloadSession.
func (x *session) ReadPayload(r io.Reader, n int64) error {
	err := x.s.ReadPayload(r, n)
	x.sync()
	return err
}

func (x *session) Close() { x.s.Close() }

// New serves a model opened by package loader (with a backend). ctx is the
// served context size (the model's when ≤ 0 or larger than the model's).
func New(m *loader.Model, ctx int) (*Engine, error) {
	if m.Backend == nil {
		return nil, errors.New("engineadapter: the model was opened without a backend")
	}
	return &Engine{Backend: m.Backend, Tok: m.Tokenizer, Opts: engine.Options{MaxContext: m.ContextSize(ctx)}, Quant: expertQuantBits(m.Weights)}, nil
}
