package engine

import (
	"math"
	"math/rand/v2"
	"testing"
)

// hostCandidates builds the candidates a backend may send for logits under
// f: every id whose logit reaches Sampler's cut less margin (a superset),
// plus extra ids drawn at the rate extra, plus the greedy choice, in id
// order.
func hostCandidates(logits []float32, f PickFilter, margin, extra float64, r *rand.Rand) *Candidates {
	top := Greedy(logits)
	c := &Candidates{Filter: f, Top: top, TopLogit: logits[top]}
	cut := float64(logits[top]) + float64(f.Temperature)*math.Log(float64(f.MinP)) - 1e-3 - margin
	for i, v := range logits {
		if float64(v) >= cut || int32(i) == top || r.Float64() < extra {
			c.IDs = append(c.IDs, int32(i))
			c.Values = append(c.Values, v)
		}
	}
	return c
}

// TestSampleCandidates: drawing from min-p's candidates (any superset of
// the prefilter's, in id order) gives SampleWith's draws over all the
// logits, seed for seed — flat and peaked logits, ties, ±0, NaN and
// infinities, top-p on top of min-p — and options the candidates do not
// serve (another min-p, a top-k cap) fall back to all the logits.
func TestSampleCandidates(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	opts := []SamplerOptions{
		{Temperature: 1, MinP: 0.05},
		{Temperature: 0.7, MinP: 0.1, TopP: 0.9},
		{Temperature: 1.5, MinP: 0.01, TopP: 0.5},
		{Temperature: 0.3, MinP: 0.5},
		{Temperature: 2, MinP: 1},
	}
	for trial := 0; trial < 40; trial++ {
		n := 1 + r.IntN(400)
		if trial%4 == 0 {
			n = 129280
		}
		logits := make([]float32, n)
		peaked := trial%2 == 0
		for i := range logits {
			switch {
			case r.IntN(40) == 0:
				logits[i] = float32(r.IntN(4)) // ties
			case peaked:
				logits[i] = float32(r.NormFloat64()*2 - 6)
			default:
				logits[i] = float32(r.NormFloat64())
			}
		}
		if peaked {
			for k := 0; k < 6; k++ {
				logits[r.IntN(n)] = float32(7 + r.IntN(3))
			}
		}
		logits[r.IntN(n)] = float32(math.Copysign(0, -1))
		logits[r.IntN(n)] = float32(math.NaN())
		logits[r.IntN(n)] = float32(math.Inf(-1))
		if trial%10 == 3 {
			logits[r.IntN(n)] = float32(math.Inf(1))
		}
		o := opts[trial%len(opts)]
		o.Seed = uint64(trial)
		c := hostCandidates(logits, *FilterFor(o), r.Float64()*0.5, 0.01*r.Float64(), r)
		ref, got := NewSampler(o), NewSampler(o)
		for d := 0; d < 30; d++ {
			want := ref.SampleWith(logits, o)
			if g := got.SampleLogits(&Logits{cand: c, fetch: func() ([]float32, error) {
				t.Fatalf("trial %d: the candidates serve %+v, but the logits were fetched", trial, o)
				return nil, nil
			}}, o); g != want {
				t.Fatalf("trial %d (%d logits, %d candidates, %+v) draw %d: token %d, SampleWith draws %d", trial, n, len(c.IDs), o, d, g, want)
			}
		}
		// options the candidates do not serve: all the logits, fetched
		for _, o2 := range []SamplerOptions{{Temperature: o.Temperature, MinP: o.MinP / 2, Seed: 5}, {Temperature: o.Temperature, MinP: o.MinP, TopK: 7, Seed: 5}} {
			fetched := false
			l := &Logits{cand: c, fetch: func() ([]float32, error) { fetched = true; return logits, nil }}
			if g, w := NewSampler(o2).SampleLogits(l, o2), NewSampler(o2).SampleWith(logits, o2); g != w || !fetched {
				t.Fatalf("trial %d, %+v: token %d (fetched %v), SampleWith draws %d", trial, o2, g, fetched, w)
			}
		}
		if g := (&Logits{cand: c}).Greedy(); g != Greedy(logits) {
			t.Fatalf("trial %d: greedy %d from the candidates, %d from the logits", trial, g, Greedy(logits))
		}
	}
	// no logit above −inf: the greedy choice, as SampleWith
	all := []float32{float32(math.Inf(-1)), float32(math.NaN()), float32(math.Inf(-1))}
	o := SamplerOptions{Temperature: 1, MinP: 0.05}
	c := hostCandidates(all, *FilterFor(o), 0, 0, r)
	if g, w := NewSampler(o).SampleLogits(&Logits{cand: c}, o), NewSampler(o).SampleWith(all, o); g != w {
		t.Fatalf("no finite logit: %d, SampleWith %d", g, w)
	}
}

// TestKeyValue: keyValue reads back orderKey's logit (−0 as +0).
func TestKeyValue(t *testing.T) {
	for _, v := range []float32{0, 1, -1, 3.4e38, -3.4e38, 1e-45, -1e-45, float32(math.Inf(1)), float32(math.Inf(-1)), 7.25} {
		if got := keyValue(orderKey(v, 9)); got != v || math.Signbit(float64(got)) != math.Signbit(float64(v)) {
			t.Errorf("keyValue(orderKey(%v)) = %v", v, got)
		}
	}
	if got := keyValue(orderKey(float32(math.Copysign(0, -1)), 3)); got != 0 || math.Signbit(float64(got)) {
		t.Errorf("−0 comes back as %v, want +0", got)
	}
}
