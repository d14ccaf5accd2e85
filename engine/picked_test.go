package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"ds4go/engine"
)

// pickBackend is a PickPipeliner made of a host backend, as a device would
// run it: after EmbedPicked every op on the batch is queued, not run, until
// SupplyToken gives the token (then the embed and the queued ops run in
// order). PickedLogits of a head still queued fails, where a device would
// wait forever; so does a second EmbedPicked while one waits, and an op
// queued behind a wait that is never released shows as pending. It checks
// the engine's use of the interface; the CUDA backend's own implementation
// is tested against its one-step loop on the GPU.
type pickBackend struct {
	engine.Backend
	p *pickState
}

type pickState struct {
	logits  [2][]float32
	heads   int // HeadPicked calls
	ran     int // … of which have run
	taken   int // … of which PickedLogits returned
	waitPos int // the position of the EmbedPicked waiting (−1: none)
	queued  []func() error
	err     error // the first error of a queued op
	embeds  int   // EmbedPicked calls
	supply  []int32
	// failEvery: every failEvery-th EmbedPicked's step fails with
	// ErrPickAhead at its third op (0: never), as a step that must wait for
	// the device does on the GPU
	failEvery int
	dropped   int
}

func newPick(be engine.Backend) pickBackend {
	V := be.Config().Vocab
	return pickBackend{be, &pickState{logits: [2][]float32{make([]float32, V), make([]float32, V)}, waitPos: -1}}
}

// do runs f, or queues it behind a waiting EmbedPicked.
func (p pickBackend) do(f func() error) error {
	if p.p.waitPos >= 0 {
		if p.p.failEvery > 0 && p.p.embeds%p.p.failEvery == 0 && len(p.p.queued) == 2 {
			p.p.queued, p.p.waitPos = nil, -1
			p.p.dropped++
			return fmt.Errorf("fake: grow a buffer: %w", engine.ErrPickAhead)
		}
		p.p.queued = append(p.p.queued, f)
		return nil
	}
	return f()
}

func (p pickBackend) Embed(b engine.Batch, pos int, toks []int32) error {
	if p.p.waitPos >= 0 {
		return errors.New("Embed while an EmbedPicked waits for its token")
	}
	p.p.taken = p.p.heads
	return p.Backend.Embed(b, pos, toks)
}

func (p pickBackend) HCPre(b engine.Batch, l int, sub engine.SubBlock) error {
	return p.do(func() error { return p.Backend.HCPre(b, l, sub) })
}

func (p pickBackend) Attention(b engine.Batch, st engine.State, l int) error {
	return p.do(func() error { return p.Backend.Attention(b, st, l) })
}

func (p pickBackend) FFN(b engine.Batch, l int) error {
	return p.do(func() error { return p.Backend.FFN(b, l) })
}

func (p pickBackend) HCPost(b engine.Batch, l int, sub engine.SubBlock) error {
	return p.do(func() error { return p.Backend.HCPost(b, l, sub) })
}

func (p pickBackend) HeadPicked(b engine.Batch) error {
	if p.p.heads-p.p.taken >= 2 {
		return errors.New("two heads' logits not taken")
	}
	buf := p.p.logits[p.p.heads%2]
	p.p.heads++
	return p.do(func() error {
		p.p.ran++
		return p.Head(b, []int{0}, buf)
	})
}

func (p pickBackend) EmbedPicked(b engine.Batch, pos int) error {
	if p.p.waitPos >= 0 {
		return errors.New("a second EmbedPicked while one waits")
	}
	p.p.embeds++
	p.p.waitPos = pos
	return nil
}

func (p pickBackend) SupplyToken(b engine.Batch, tok int32) error {
	if p.p.waitPos < 0 {
		return errors.New("SupplyToken with no EmbedPicked waiting")
	}
	p.p.supply = append(p.p.supply, tok)
	pos := p.p.waitPos
	p.p.waitPos = -1
	q := p.p.queued
	p.p.queued = nil
	if err := p.Backend.Embed(b, pos, []int32{tok}); err != nil {
		return err
	}
	for _, f := range q {
		if err := f(); err != nil && p.p.err == nil {
			p.p.err = err
		}
	}
	return nil
}

func (p pickBackend) PickedLogits(engine.Batch) ([]float32, error) {
	if p.p.taken >= p.p.heads {
		return nil, errors.New("no HeadPicked to take")
	}
	if p.p.taken >= p.p.ran {
		return nil, errors.New("the head waits for a token that was not given (a device would hang)")
	}
	if p.p.err != nil {
		return nil, p.p.err
	}
	k := p.p.taken
	p.p.taken++
	return p.p.logits[k%2], nil
}

// pickSampler draws from logits with a seeded sampler, recording what it saw.
type pickSampler struct {
	sm      *engine.Sampler
	offered []int32
	first   []float32 // the first logit of every call
}

func (ps *pickSampler) pick(refuseAt int) func([]float32) (int32, bool) {
	return func(lg []float32) (int32, bool) {
		ps.first = append(ps.first, lg[0])
		if refuseAt >= 0 && len(ps.offered) >= refuseAt {
			return 0, false
		}
		t := ps.sm.Sample(lg)
		ps.offered = append(ps.offered, t)
		return t, true
	}
}

// TestDecodePickedPipelined: DecodePicked through a PickPipeliner leaves the
// session exactly as the one-step-at-a-time loop on the plain backend does —
// the tokens drawn, the logits pick saw, the count, the session's tokens
// and logits, and the state a further decode step reads — when it runs to
// max, when pick refuses, and when the context fills up; and no step is
// left waiting for its token.
func TestDecodePickedPipelined(t *testing.T) {
	be := tinyBackend(t, nil)
	ctx := context.Background()
	prompt := tokens(40, be.Config().Vocab)
	cases := []struct {
		name       string
		max        int
		refuseAt   int // tokens drawn before a refusal (−1: none)
		maxContext int
		failEvery  int // (pickState.failEvery)
	}{
		{"to max", 12, -1, 256, 0},
		{"one", 1, -1, 256, 0},
		{"refuse first", 8, 0, 256, 0},
		{"refuse second", 8, 1, 256, 0},
		{"refuse later", 20, 9, 256, 0},
		{"context fills", 30, -1, 47, 0},
		{"steps dropped", 20, -1, 256, 3},
		{"every step dropped", 10, -1, 256, 1},
		{"dropped then refused", 20, 7, 256, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := func(b engine.Backend) (*pickSampler, int, error, *engine.Session) {
				s, e := engine.NewSession(b, engine.Options{ChunkSize: 16, MaxContext: c.maxContext})
				if e != nil {
					t.Fatal(e)
				}
				t.Cleanup(s.Close)
				if e := s.Prefill(ctx, prompt); e != nil {
					t.Fatal(e)
				}
				ps := &pickSampler{sm: engine.NewSampler(engine.SamplerOptions{Temperature: 1.5, Seed: 7})}
				n, err := s.DecodePicked(ctx, c.max, ps.pick(c.refuseAt))
				return ps, n, err, s
			}
			pb := newPick(be)
			pb.p.failEvery = c.failEvery
			wp, wn, werr, ws := run(be)
			gp, gn, gerr, gs := run(pb)
			if !slices.Equal(gp.offered, wp.offered) || !slices.Equal(gp.first, wp.first) || gn != wn || (gerr == nil) != (werr == nil) {
				t.Fatalf("pipelined: drew %v, %d decoded, err %v; plain: %v, %d, %v", gp.offered, gn, gerr, wp.offered, wn, werr)
			}
			if c.max > 1 && c.refuseAt != 0 && pb.p.embeds == 0 {
				t.Errorf("the pipelined path was not taken")
			}
			if c.failEvery > 0 && pb.p.dropped == 0 {
				t.Errorf("no step was dropped")
			}
			if pb.p.waitPos >= 0 || len(pb.p.queued) > 0 {
				t.Fatalf("a step still waits for its token (%d ops queued)", len(pb.p.queued))
			}
			if pb.p.err != nil {
				t.Fatal(pb.p.err)
			}
			sameSessions(t, gs, ws, c.maxContext)
		})
	}
}

// TestDecodePickedErrors: a cancelled context stops DecodePicked with the
// session consistent (its logits those a fresh session computes for its
// tokens), a token outside the vocabulary is ErrBadToken, and neither
// leaves a step waiting for its token.
func TestDecodePickedErrors(t *testing.T) {
	be := tinyBackend(t, nil)
	prompt := tokens(20, be.Config().Vocab)
	opts := engine.Options{ChunkSize: 16, MaxContext: 256}
	check := func(b engine.Backend, s *engine.Session) {
		t.Helper()
		if pb, ok := b.(pickBackend); ok && (pb.p.waitPos >= 0 || len(pb.p.queued) > 0) {
			t.Fatalf("a step still waits for its token")
		}
		ref, err := engine.NewSession(be, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer ref.Close()
		if err := ref.Prefill(context.Background(), s.Tokens()); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.Logits(), ref.Logits()) {
			t.Errorf("%T: the logits are not those of the session's tokens", b)
		}
	}
	for _, b := range []engine.Backend{be, newPick(be)} {
		s, err := engine.NewSession(b, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Prefill(context.Background(), prompt); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		drawn := 0
		n, err := s.DecodePicked(ctx, 50, func(lg []float32) (int32, bool) {
			drawn++
			if drawn == 4 {
				cancel()
			}
			return engine.Greedy(lg), true
		})
		if !errors.Is(err, context.Canceled) || n < 3 || n > 4 || s.Pos() != len(prompt)+n {
			t.Fatalf("%T: %d decoded, %d drawn, pos %d, err %v", b, n, drawn, s.Pos(), err)
		}
		check(b, s)

		drawn = 0
		n, err = s.DecodePicked(context.Background(), 50, func([]float32) (int32, bool) {
			drawn++
			if drawn == 3 {
				return int32(be.Config().Vocab), true
			}
			return 5, true
		})
		if !errors.Is(err, engine.ErrBadToken) || n != 2 {
			t.Fatalf("%T: a token outside the vocabulary: %d decoded, err %v", b, n, err)
		}
		check(b, s)
	}
}
