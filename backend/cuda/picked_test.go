package cuda

import (
	"context"
	"errors"
	"math"
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
// seed, and leaves the session as that loop does, bit for bit — with min-p
// (the draws from the candidates the device finds, PickCandidates) and
// without (the logits whole); with one graph a step, per-layer graphs (a
// queued step is launched whole either way) and plain launches (no step can
// be queued ahead: each runs after its draw); run to the end, with steps
// dropped where the row tables grow (ErrPickAhead), and stopped by a
// refusal.
func TestPickPipeline(t *testing.T) {
	gpu(t)
	eachTinyModel(t, func(t *testing.T, cfg model.Config, w *model.Weights, ref *cpu.Backend) {
		const gen = 256
		prompt := testTokens(40, cfg.Vocab)
		// min-p (the device sends candidates, or the logits whole past
		// pickCandCap), and top-p alone (the logits whole)
		opts := []engine.SamplerOptions{
			{Temperature: 1.2, MinP: 0.02, TopP: 0.97, Seed: 11},
			{Temperature: 0.4, MinP: 0.2, Seed: 12},
			{Temperature: 0.9, TopP: 0.9, Seed: 13},
			{Temperature: 8, MinP: 0.0001, Seed: 14}, // more candidates than sent: the logits fetched whole
		}
		for _, gl := range []int{1 << 20, 1, -1} {
			be := testBackend(t, w, Options{GraphLayers: gl})
			ctx := context.Background()
			cands := 0 // draws from candidates
			for oi, o := range opts {
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
				n, err := s.DecodePicked(ctx, gen, engine.FilterFor(o), func(lg *engine.Logits) (int32, bool) {
					if c := lg.Candidates(); c != nil {
						cands++
						if o.MinP == 0 {
							t.Fatalf("candidates for options without min-p")
						}
					}
					tok := sm.SampleLogits(lg, o)
					got = append(got, tok)
					return tok, true
				})
				if err != nil || n != gen {
					t.Fatalf("graph layers %d, %+v: %d decoded: %v", gl, o, n, err)
				}
				if !slices.Equal(got, want) {
					i := 0
					for i < gen && got[i] == want[i] {
						i++
					}
					t.Errorf("graph layers %d, %+v: DecodePicked's draws differ from the one-step loop's at token %d", gl, o, i)
				}
				if !slices.Equal(s.Tokens(), plain.Tokens()) || !sameBits(s.Logits(), plain.Logits()) {
					t.Errorf("graph layers %d, %+v: the session after DecodePicked differs from the one-step loop's", gl, o)
				}
				if oi > 0 {
					continue
				}
				// stopped by a refusal: the discarded step leaves no trace
				s2 := session(t, be, 64)
				if err := s2.Prefill(ctx, prompt); err != nil {
					t.Fatal(err)
				}
				sm2 := engine.NewSampler(o)
				drawn := 0
				n, err = s2.DecodePicked(ctx, gen, engine.FilterFor(o), func(lg *engine.Logits) (int32, bool) {
					if drawn == 100 {
						return 0, false
					}
					drawn++
					return sm2.SampleLogits(lg, o), true
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
			st := be.GraphStats()
			t.Logf("graph layers %d: %d steps queued ahead, %d dropped, %d heads taken, %d draws from candidates, %d overflows",
				gl, st.PickAhead, st.PickDropped, st.PickedHeads, cands, st.PickOverflows)
			if gl > 0 && (st.PickAhead < gen || st.PickDropped == 0 || cands == 0) {
				t.Errorf("graph layers %d: %d steps queued ahead, %d dropped, %d draws from candidates: want most queued ahead, some dropped (the row tables grow) and some candidates", gl, st.PickAhead, st.PickDropped, cands)
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
		be := testBackend(t, w, Options{})
		be.pickTimeout = 50 * time.Millisecond
		ctx := context.Background()
		prompt := testTokens(40, cfg.Vocab)
		s := session(t, be, 64)
		if err := s.Prefill(ctx, prompt); err != nil {
			t.Fatal(err)
		}
		drawn := 0
		n, err := s.DecodePicked(ctx, 20, nil, func(lg *engine.Logits) (int32, bool) {
			drawn++
			if drawn == 5 {
				time.Sleep(300 * time.Millisecond)
			}
			return lg.Greedy(), true
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

// TestPickCandidates: PickCandidates' greedy choice is engine.Greedy's, its
// candidates come in id order with their logits, hold every token the
// sampler's min-p prefilter keeps (a superset, no further than a small
// margin below its cut), and the sampler draws from them what it draws
// from all the logits; past the cap the header still counts them all —
// flat and peaked logits, ties, NaN and −inf, several temperatures and
// min-p values.
func TestPickCandidates(t *testing.T) {
	d := gpu(t)
	const V = 129280
	work := alloc(t, d, ArgmaxWork)
	must(t, d.MemsetAsync(work, 0, ArgmaxWork, 0))
	top, counts := alloc(t, d, 4), alloc(t, d, 4*CandidateCTAs)
	for trial, c := range []struct {
		scale, shift float32
		peaks        int
		f            engine.PickFilter
		cap          int
	}{
		{1, 0, 0, engine.PickFilter{Temperature: 1, MinP: 0.05}, pickCandCap},
		{2, -6, 8, engine.PickFilter{Temperature: 1, MinP: 0.05}, pickCandCap},
		{2, -6, 8, engine.PickFilter{Temperature: 0.6, MinP: 0.01}, pickCandCap},
		{3, 1, 3, engine.PickFilter{Temperature: 1.5, MinP: 0.2}, pickCandCap},
		{1, 0, 0, engine.PickFilter{Temperature: 1, MinP: 0.05}, 64}, // past the cap
		{0, 0, 0, engine.PickFilter{Temperature: 1, MinP: 0.05}, 64}, // all ties: every token
	} {
		x := gaussian(V, uint64(100+trial))
		for i := range x {
			x[i] = x[i]*c.scale + c.shift
		}
		for k := 0; k < c.peaks; k++ {
			x[(k*7919+13)%V] = 9 + float32(k%3)
		}
		x[5], x[V-3] = float32(math.NaN()), float32(math.Inf(-1))
		xp := upload(t, d, x)
		outW := CandidateWords(c.cap)
		out := alloc(t, d, int64(4*outW))
		must(t, d.PickCandidates(0, xp, V, c.f.Temperature, c.f.MinP, work, top, counts, out, c.cap))
		raw := download(t, d, out, outW)
		w := make([]int32, outW)
		for i, v := range raw {
			w[i] = int32(math.Float32bits(v))
		}
		n, tp := int(w[0]), w[1]
		want := engine.Greedy(x)
		if tp != want || math.Float32bits(math.Float32frombits(uint32(w[2]))) != math.Float32bits(x[want]) {
			t.Fatalf("trial %d: greedy choice %d (logit %v), want %d (%v)", trial, tp, math.Float32frombits(uint32(w[2])), want, x[want])
		}
		lt := float64(x[want])
		cut := lt + float64(c.f.Temperature)*math.Log(float64(c.f.MinP)) - 1e-3
		need := 0 // the prefilter's tokens (a float32 cut at least cut)
		for i, v := range x {
			if float64(v) >= cut || int32(i) == want {
				need++
			}
		}
		if n < need {
			t.Fatalf("trial %d: %d candidates counted, the prefilter keeps %d", trial, n, need)
		}
		if n > c.cap {
			t.Logf("trial %d: %d candidates past the cap of %d (the prefilter keeps %d)", trial, n, c.cap, need)
			continue
		}
		ids := w[4 : 4+n]
		vals := raw[4+c.cap : 4+c.cap+n]
		for k, id := range ids {
			if k > 0 && id <= ids[k-1] {
				t.Fatalf("trial %d: candidates not in id order at %d: %d after %d", trial, k, id, ids[k-1])
			}
			if math.Float32bits(vals[k]) != math.Float32bits(x[id]) {
				t.Fatalf("trial %d: candidate %d's logit %v, want %v", trial, id, vals[k], x[id])
			}
			if id != want && !(float64(x[id]) >= cut-0.01) {
				t.Fatalf("trial %d: candidate %d (logit %v) far below the cut %v", trial, id, x[id], cut)
			}
		}
		in := map[int32]bool{}
		for _, id := range ids {
			in[id] = true
		}
		for i, v := range x {
			if (float64(v) >= cut || int32(i) == want) && !in[int32(i)] {
				t.Fatalf("trial %d: token %d (logit %v, cut %v) kept by the prefilter is not a candidate", trial, i, v, cut)
			}
		}
		o := engine.SamplerOptions{Temperature: c.f.Temperature, MinP: c.f.MinP, Seed: uint64(trial)}
		cand := &engine.Candidates{Filter: c.f, Top: tp, TopLogit: x[tp], IDs: ids, Values: vals}
		a, b := engine.NewSampler(o), engine.NewSampler(o)
		for k := 0; k < 20; k++ {
			if g, wv := a.SampleLogits(engine.CandidateLogits(cand), o), b.SampleWith(x, o); g != wv {
				t.Fatalf("trial %d draw %d: %d from the candidates, %d from the logits", trial, k, g, wv)
			}
		}
		t.Logf("trial %d: %d candidates (the prefilter keeps %d)", trial, n, need)
	}
}
