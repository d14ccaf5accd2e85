package server

import (
	"context"
	"errors"

	"ds4go/engine"
	"ds4go/tokenizer"
)

// Engine is the model the server drives. It is deliberately narrow: what an
// autoregressive runtime offers anyway (a tokenizer, a context limit and
// sessions that take tokens in and give logits out). Sampling, DSML parsing,
// stop sequences and prefix reuse all live in the server, so any backend that
// can prefill, rewind and report logits can be served.
type Engine interface {
	// Tokenizer returns the model's tokenizer (rendered prompts contain the
	// chat protocol's special-token strings; EncodeWithSpecial is used).
	Tokenizer() *tokenizer.Tokenizer
	// ContextSize is the maximum number of tokens a session can hold.
	ContextSize() int
	// NewSession starts an empty session. The server keeps one live session
	// per scheduler slot (one today) for its whole life.
	NewSession() (Session, error)
}

// Session is one token sequence with its KV state and the logits for the
// next token. It is used by one goroutine at a time (the scheduler's worker
// for its slot).
type Session interface {
	// Tokens returns the processed tokens (the live prefix). The caller
	// must not modify the slice.
	Tokens() []int32
	// Rewind keeps the first n tokens (0 ≤ n ≤ len(Tokens())) and makes
	// Logits describe the token after them.
	Rewind(ctx context.Context, n int) error
	// Prefill appends tokens and computes the logits after the last one.
	// Decoding is Prefill of one sampled token. On error (including a
	// cancelled ctx) the session holds some prefix of what it had plus what
	// was processed; Tokens tells what.
	Prefill(ctx context.Context, tokens []int32) error
	// Logits returns the next-token logits (vocabulary-sized; owned by the
	// session, valid until the next call), or nil when there are none.
	Logits() []float32
	// Close releases the session.
	Close()
}

// GreedySession is a Session that can decode greedily by itself
// (engine.Session.DecodeGreedy): it offers each token, the greedy choice of
// its logits, to emit before decoding it; a refused token is not decoded
// and ends the run. It returns how many tokens it decoded. The server uses
// it for requests whose every token is greedy: on the CUDA backend each
// token is then chosen on the device and the next step queued before the
// host reads it.
type GreedySession interface {
	Session
	DecodeGreedy(ctx context.Context, max int, emit func(tok int32) bool) (int, error)
}

// DraftSession is a Session that may decode requests speculatively
// (engine.Options.Draft) and counts its drafts (engine.Session.Stats): the
// server logs each generation's.
type DraftSession interface {
	Session
	DraftStats() engine.Stats
}

// PickSession is a Session that decodes tokens chosen by a callback
// (engine.Session.DecodePicked): pick gets each step's logits (valid during
// the call; with a filter, possibly min-p's candidates only) and returns
// the token and whether to decode it; a refusal ends the run. It returns
// how many tokens it decoded. The server uses it for sampled requests: on
// the CUDA backend each step is queued before the host has drawn its
// token, and waits for it on the device.
type PickSession interface {
	Session
	DecodePicked(ctx context.Context, max int, f *engine.PickFilter, pick func(l *engine.Logits) (tok int32, ok bool)) (int, error)
}

// ErrContextFull may be returned (wrapped) by Session.Prefill when the
// tokens would not fit; the server checks the limit itself beforehand.
var ErrContextFull = errors.New("context is full")
