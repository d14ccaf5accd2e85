package cuda

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"ds4go/backend/cpu"
	"ds4go/engine"
	"ds4go/model"
)

// sampledLoop decodes gen tokens one step at a time, each the draw of a
// sampler seeded with seed from the downloaded logits, and returns them.
func sampledLoop(t *testing.T, s *engine.Session, o engine.SamplerOptions, gen int) []int32 {
	t.Helper()
	sm := engine.NewSampler(o)
	var out []int32
	for range gen {
		tok, err := s.Sample(sm)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Decode(context.Background(), tok); err != nil {
			t.Fatal(err)
		}
		out = append(out, tok)
	}
	return out
}

// oneByOne returns a session that prefilled prompt, then decoded toks one
// step at a time.
func oneByOne(t *testing.T, be engine.Backend, prompt, toks []int32) *engine.Session {
	t.Helper()
	s := session(t, be, 64)
	ctx := context.Background()
	if err := s.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks {
		if err := s.Decode(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// TestPickPipeline: Session.DecodePicked on the CUDA backend (each step
// queued before the host draws its token, the device waiting for it) draws
// the tokens the one-step loop draws on the same backend with the same
// seed, and leaves the session as that loop does, bit for bit — with one
// graph a step, per-layer graphs (a queued step is launched whole either
// way) and plain launches (no step can be queued ahead: each runs after
// its draw); run to the end, with steps dropped where the row tables grow
// (ErrPickAhead), and stopped by a refusal.
func TestPickPipeline(t *testing.T) {
	gpu(t)
	eachTinyModel(t, func(t *testing.T, cfg model.Config, w *model.Weights, ref *cpu.Backend) {
		const gen = 256
		prompt := testTokens(40, cfg.Vocab)
		o := engine.SamplerOptions{Temperature: 1.2, MinP: 0.02, TopP: 0.97, Seed: 11}
		for _, gl := range []int{1 << 20, 1, -1} {
			be, err := New(w, Options{GraphLayers: gl})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			ctx := context.Background()
			plain := session(t, be, 64)
			if err := plain.Prefill(ctx, prompt); err != nil {
				t.Fatal(err)
			}
			want := sampledLoop(t, plain, o, gen)

			s := session(t, be, 64)
			if err := s.Prefill(ctx, prompt); err != nil {
				t.Fatal(err)
			}
			sm := engine.NewSampler(o)
			var got []int32
			n, err := s.DecodePicked(ctx, gen, func(lg []float32) (int32, bool) {
				tok := sm.Sample(lg)
				got = append(got, tok)
				return tok, true
			})
			if err != nil || n != gen {
				t.Fatalf("graph layers %d: %d decoded: %v", gl, n, err)
			}
			st := be.GraphStats()
			t.Logf("graph layers %d: %d steps queued ahead, %d dropped, %d heads taken", gl, st.PickAhead, st.PickDropped, st.PickedHeads)
			if gl > 0 && (st.PickAhead < gen/2 || st.PickDropped == 0) {
				t.Errorf("graph layers %d: %d steps queued ahead and %d dropped: want most queued ahead and some dropped (the row tables grow)", gl, st.PickAhead, st.PickDropped)
			}
			if !slices.Equal(got, want) {
				i := 0
				for i < gen && got[i] == want[i] {
					i++
				}
				t.Errorf("graph layers %d: DecodePicked's draws differ from the one-step loop's at token %d", gl, i)
			}
			if !slices.Equal(s.Tokens(), plain.Tokens()) || !sameBits(s.Logits(), plain.Logits()) {
				t.Errorf("graph layers %d: the session after DecodePicked differs from the one-step loop's", gl)
			}

			// stopped by a refusal: the discarded step leaves no trace
			s2 := session(t, be, 64)
			if err := s2.Prefill(ctx, prompt); err != nil {
				t.Fatal(err)
			}
			sm2 := engine.NewSampler(o)
			drawn := 0
			n, err = s2.DecodePicked(ctx, gen, func(lg []float32) (int32, bool) {
				if drawn == 100 {
					return 0, false
				}
				drawn++
				return sm2.Sample(lg), true
			})
			if err != nil || n != 100 {
				t.Fatalf("graph layers %d: refused at 101: %d decoded: %v", gl, n, err)
			}
			if !slices.Equal(s2.Tokens(), plain.Tokens()[:len(prompt)+100]) {
				t.Fatalf("graph layers %d: the tokens after the refusal differ", gl)
			}
			for _, tok := range want[100:103] {
				if err := s2.Decode(ctx, tok); err != nil {
					t.Fatal(err)
				}
			}
			if !sameBits(s2.Logits(), oneByOne(t, be, prompt, want[:103]).Logits()) {
				t.Errorf("graph layers %d: after the refusal and three steps the logits differ from the one-step loop's", gl)
			}
		}
	})
}

// TestPickTimeout: a queued step whose token comes later than the backend's
// limit goes on without it, DecodePicked fails with ErrPickTimeout, and the
// session recovers: rewound to its tokens and decoding on, it gives what
// the one-step loop gives.
func TestPickTimeout(t *testing.T) {
	gpu(t)
	eachTinyModel(t, func(t *testing.T, cfg model.Config, w *model.Weights, ref *cpu.Backend) {
		be, err := New(w, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer be.Close()
		be.pickTimeout = 50 * time.Millisecond
		ctx := context.Background()
		prompt := testTokens(40, cfg.Vocab)
		s := session(t, be, 64)
		if err := s.Prefill(ctx, prompt); err != nil {
			t.Fatal(err)
		}
		drawn := 0
		n, err := s.DecodePicked(ctx, 20, func(lg []float32) (int32, bool) {
			drawn++
			if drawn == 5 {
				time.Sleep(300 * time.Millisecond)
			}
			return engine.Greedy(lg), true
		})
		if !errors.Is(err, ErrPickTimeout) {
			t.Fatalf("%d decoded, %d drawn: err %v, want ErrPickTimeout", n, drawn, err)
		}
		t.Logf("%d decoded, %d drawn: %v", n, drawn, err)
		if err := s.Rewind(ctx, s.Pos()); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := s.Decode(ctx, engine.Greedy(s.Logits())); err != nil {
				t.Fatal(err)
			}
		}
		if !sameBits(s.Logits(), oneByOne(t, be, prompt, s.Tokens()[len(prompt):]).Logits()) {
			t.Errorf("after the time-out the session's logits differ from the one-step loop's")
		}
	})
}
