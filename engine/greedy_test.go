package engine_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"ds4go/engine"
)

// pipeBackend is a GreedyPipeliner made of a host backend: HeadGreedy runs
// Head into one of two logit buffers and queues Greedy's choice, which the
// next EmbedGreedy embeds. It checks the engine's use of the interface (the
// order of the calls, what is committed and what is discarded); the CUDA
// backend's own implementation is tested against the CPU on the GPU.
type pipeBackend struct {
	engine.Backend
	p *pipeState
}

type pipeState struct {
	logits  [2][]float32
	heads   int
	pending []int32
	latest  int32
	embeds  int // EmbedGreedy calls
}

func newPipe(be engine.Backend) pipeBackend {
	V := be.Config().Vocab
	return pipeBackend{be, &pipeState{logits: [2][]float32{make([]float32, V), make([]float32, V)}}}
}

func (p pipeBackend) HeadGreedy(b engine.Batch) error {
	buf := p.p.logits[p.p.heads%2]
	if err := p.Head(b, []int{0}, buf); err != nil {
		return err
	}
	p.p.heads++
	p.p.latest = engine.Greedy(buf)
	p.p.pending = append(p.p.pending, p.p.latest)
	return nil
}

func (p pipeBackend) EmbedGreedy(b engine.Batch, pos int) error {
	if p.p.heads == 0 {
		return errors.New("no HeadGreedy before EmbedGreedy")
	}
	p.p.embeds++
	return p.Embed(b, pos, []int32{p.p.latest})
}

func (p pipeBackend) GreedyToken(engine.Batch) (int32, error) {
	if len(p.p.pending) == 0 {
		return 0, errors.New("no pending choice")
	}
	c := p.p.pending[0]
	p.p.pending = p.p.pending[1:]
	return c, nil
}

func (p pipeBackend) GreedyLogits(_ engine.Batch, back int, dst []float32) error {
	if back > 1 || p.p.heads-1-back < 0 {
		return errors.New("no such logits")
	}
	copy(dst, p.p.logits[(p.p.heads-1-back)%2])
	return nil
}

// TestDecodeGreedyPipelined: DecodeGreedy through a GreedyPipeliner leaves
// the session exactly as the one-step-at-a-time loop on the plain backend
// does — the tokens offered, the count, the session's tokens and logits,
// and the state a further decode step reads — when it runs to max, when
// emit refuses a token, and when the context fills up.
func TestDecodeGreedyPipelined(t *testing.T) {
	be := tinyBackend(t, nil)
	ctx := context.Background()
	prompt := tokens(40, be.Config().Vocab)
	cases := []struct {
		name       string
		max        int
		refuseAt   int // offered tokens accepted before a refusal (−1: none)
		maxContext int
	}{
		{"to max", 12, -1, 256},
		{"one", 1, -1, 256},
		{"refuse first", 8, 0, 256},
		{"refuse second", 8, 1, 256},
		{"refuse later", 20, 9, 256},
		{"context fills", 30, -1, 47},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := func(b engine.Backend) (offered []int32, n int, err error, s *engine.Session) {
				s = prefilled(t, b, engine.Options{ChunkSize: 16, MaxContext: c.maxContext}, prompt)
				n, err = s.DecodeGreedy(ctx, c.max, func(tok int32) bool {
					offered = append(offered, tok)
					return c.refuseAt < 0 || len(offered) <= c.refuseAt
				})
				return offered, n, err, s
			}
			pb := newPipe(be)
			wo, wn, werr, ws := run(be)
			go_, gn, gerr, gs := run(pb)
			if !slices.Equal(go_, wo) || gn != wn || (gerr == nil) != (werr == nil) ||
				errors.Is(gerr, engine.ErrContextFull) != errors.Is(werr, engine.ErrContextFull) {
				t.Fatalf("pipelined: offered %v, %d decoded, err %v; plain: %v, %d, %v", go_, gn, gerr, wo, wn, werr)
			}
			if c.max > 1 && c.refuseAt != 0 && pb.p.embeds == 0 {
				t.Errorf("the pipelined path was not taken")
			}
			sameSessions(t, gs, ws, c.maxContext)
		})
	}
}

// TestDecodeGreedyCancel: a cancelled context stops DecodeGreedy with the
// session consistent: its logits are those a fresh session computes for
// its tokens.
func TestDecodeGreedyCancel(t *testing.T) {
	be := tinyBackend(t, nil)
	prompt := tokens(20, be.Config().Vocab)
	opts := engine.Options{ChunkSize: 16, MaxContext: 256}
	for _, b := range []engine.Backend{be, newPipe(be)} {
		s := prefilled(t, b, opts, prompt)
		ctx, cancel := context.WithCancel(context.Background())
		offered := 0
		n, err := s.DecodeGreedy(ctx, 50, func(int32) bool {
			offered++
			if offered == 4 {
				cancel()
			}
			return true
		})
		if !errors.Is(err, context.Canceled) || n < 3 || n > 4 || s.Pos() != len(prompt)+n {
			t.Fatalf("%T: %d decoded, %d offered, pos %d, err %v", b, n, offered, s.Pos(), err)
		}
		if !slices.Equal(s.Logits(), prefilled(t, be, opts, s.Tokens()).Logits()) {
			t.Errorf("%T: the logits after the cancel are not those of the session's tokens", b)
		}
	}
}

// prefilled returns a session on b with opts that has prefilled toks
// (closed when the test ends).
func prefilled(t *testing.T, b engine.Backend, opts engine.Options, toks []int32) *engine.Session {
	t.Helper()
	s, err := engine.NewSession(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Prefill(context.Background(), toks); err != nil {
		t.Fatal(err)
	}
	return s
}

// sameSessions fails unless a pipelined session got ends as its one-step
// twin want did: the same tokens and logits, and (room left in maxContext)
// the same logits after one more decode step, so that no discarded step's
// state writes show.
func sameSessions(t *testing.T, got, want *engine.Session, maxContext int) {
	t.Helper()
	if !slices.Equal(got.Tokens(), want.Tokens()) || !slices.Equal(got.Logits(), want.Logits()) {
		t.Fatalf("sessions differ: %d vs %d tokens, logits equal %v", got.Pos(), want.Pos(), slices.Equal(got.Logits(), want.Logits()))
	}
	if got.Pos() >= maxContext {
		return
	}
	ctx := context.Background()
	tok := int32(3)
	if err := got.Decode(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if err := want.Decode(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Logits(), want.Logits()) {
		t.Errorf("logits differ after one more decode step")
	}
}
