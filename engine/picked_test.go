package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
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
	filter    [2]*engine.PickFilter // the filter of the head writing logits[k]
	lastTaken int
	fetched   int // PickedAll calls
	// overflowEvery: every overflowEvery-th PickedLogits of a filtered head
	// sends neither logits nor candidates (too many candidates; 0: never)
	overflowEvery int
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

func (p pickBackend) HeadPicked(b engine.Batch, f *engine.PickFilter) error {
	if p.p.heads-p.p.taken >= 2 {
		return errors.New("two heads' logits not taken")
	}
	k := p.p.heads % 2
	buf := p.p.logits[k]
	p.p.filter[k] = f
	p.p.heads++
	return p.do(func() error {
		p.p.ran++
		return p.Head(b, []int{0}, buf)
	})
}

// candidates are min-p's candidates of logits under f as a device may send
// them: a superset of the sampler's prefilter (a margin of 0.25 below its
// cut), in id order.
func candidates(logits []float32, f *engine.PickFilter) *engine.Candidates {
	top := engine.Greedy(logits)
	c := &engine.Candidates{Filter: *f, Top: top, TopLogit: logits[top]}
	cut := float64(logits[top]) + float64(f.Temperature)*math.Log(float64(f.MinP)) - 1e-3 - 0.25
	for i, v := range logits {
		if float64(v) >= cut || int32(i) == top {
			c.IDs = append(c.IDs, int32(i))
			c.Values = append(c.Values, v)
		}
	}
	return c
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

func (p pickBackend) PickedLogits(engine.Batch) ([]float32, *engine.Candidates, error) {
	if p.p.taken >= p.p.heads {
		return nil, nil, errors.New("no HeadPicked to take")
	}
	if p.p.taken >= p.p.ran {
		return nil, nil, errors.New("the head waits for a token that was not given (a device would hang)")
	}
	if p.p.err != nil {
		return nil, nil, p.p.err
	}
	k := p.p.taken % 2
	p.p.taken++
	p.p.lastTaken = k
	if f := p.p.filter[k]; f != nil {
		if p.p.overflowEvery > 0 && p.p.taken%p.p.overflowEvery == 0 {
			return nil, nil, nil // too many candidates: PickedAll fetches them
		}
		return nil, candidates(p.p.logits[k], f), nil
	}
	return p.p.logits[k], nil, nil
}

func (p pickBackend) PickedAll(_ engine.Batch, dst []float32) error {
	if p.p.taken == 0 {
		return errors.New("no logits taken")
	}
	if p.p.ran > p.p.taken {
		return errors.New("a later step ran: its head replaced the logits on the device")
	}
	p.p.fetched++
	copy(dst, p.p.logits[p.p.lastTaken])
	return nil
}

// pickSampler draws from logits with a seeded sampler, recording what it saw.
type pickSampler struct {
	sm      *engine.Sampler
	o       engine.SamplerOptions
	offered []int32
	top     []int32 // the greedy choice of every call's logits
}

func (ps *pickSampler) pick(refuseAt int) func(*engine.Logits) (int32, bool) {
	return func(lg *engine.Logits) (int32, bool) {
		ps.top = append(ps.top, lg.Greedy())
		if refuseAt >= 0 && len(ps.offered) >= refuseAt {
			return 0, false
		}
		t := ps.sm.SampleLogits(lg, ps.o)
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
		failEvery  int  // (pickState.failEvery)
		minP       bool // draws with min-p: the backend sends candidates
	}{
		{"to max", 12, -1, 256, 0, false},
		{"to max, candidates", 12, -1, 256, 0, true},
		{"one", 1, -1, 256, 0, false},
		{"refuse first", 8, 0, 256, 0, true},
		{"refuse second", 8, 1, 256, 0, false},
		{"refuse later", 20, 9, 256, 0, false},
		{"refuse later, candidates", 20, 9, 256, 0, true},
		{"context fills", 30, -1, 47, 0, true},
		{"steps dropped", 20, -1, 256, 3, true},
		{"every step dropped", 10, -1, 256, 1, false},
		{"dropped then refused", 20, 7, 256, 2, true},
		{"candidates overflow", 20, -1, 256, 0, true},
		{"candidates overflow, steps dropped", 20, -1, 256, 3, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := func(b engine.Backend) (*pickSampler, int, error, *engine.Session) {
				s := prefilled(t, b, engine.Options{ChunkSize: 16, MaxContext: c.maxContext}, prompt)
				o := engine.SamplerOptions{Temperature: 1.5, TopP: 0.95, Seed: 7}
				if c.minP {
					o.MinP = 0.05
				}
				ps := &pickSampler{sm: engine.NewSampler(o), o: o}
				n, err := s.DecodePicked(ctx, c.max, engine.FilterFor(o), ps.pick(c.refuseAt))
				return ps, n, err, s
			}
			pb := newPick(be)
			pb.p.failEvery = c.failEvery
			if strings.HasPrefix(c.name, "candidates overflow") {
				pb.p.overflowEvery = 4
			}
			wp, wn, werr, ws := run(be)
			gp, gn, gerr, gs := run(pb)
			if !slices.Equal(gp.offered, wp.offered) || !slices.Equal(gp.top, wp.top) || gn != wn || (gerr == nil) != (werr == nil) {
				t.Fatalf("pipelined: drew %v, %d decoded, err %v; plain: %v, %d, %v", gp.offered, gn, gerr, wp.offered, wn, werr)
			}
			if c.max > 1 && c.refuseAt != 0 && pb.p.embeds == 0 {
				t.Errorf("the pipelined path was not taken")
			}
			if pb.p.fetched > 1 && pb.p.overflowEvery == 0 {
				t.Errorf("all the logits fetched %d times: the draws should need only the candidates", pb.p.fetched)
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
		if !slices.Equal(s.Logits(), prefilled(t, be, opts, s.Tokens()).Logits()) {
			t.Errorf("%T: the logits are not those of the session's tokens", b)
		}
	}
	for _, b := range []engine.Backend{be, newPick(be)} {
		s := prefilled(t, b, opts, prompt)
		ctx, cancel := context.WithCancel(context.Background())
		drawn := 0
		n, err := s.DecodePicked(ctx, 50, nil, func(lg *engine.Logits) (int32, bool) {
			drawn++
			if drawn == 4 {
				cancel()
			}
			return lg.Greedy(), true
		})
		if !errors.Is(err, context.Canceled) || n < 3 || n > 4 || s.Pos() != len(prompt)+n {
			t.Fatalf("%T: %d decoded, %d drawn, pos %d, err %v", b, n, drawn, s.Pos(), err)
		}
		check(b, s)

		drawn = 0
		n, err = s.DecodePicked(context.Background(), 50, nil, func(*engine.Logits) (int32, bool) {
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
