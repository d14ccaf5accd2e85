package engine

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSelectionMatchesSorting checks the quickselect top-k and nucleus sets
// against sorting, on distributions with many ties.
func TestSelectionMatchesSorting(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		n := 1 + r.IntN(300)
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = float32(r.IntN(12)) // ties on purpose
		}
		better := func(a, b int32) bool {
			if logits[a] != logits[b] {
				return logits[a] > logits[b]
			}
			return a < b
		}
		sorted := make([]int32, n)
		for i := range sorted {
			sorted[i] = int32(i)
		}
		slices.SortFunc(sorted, func(a, b int32) int {
			if better(a, b) {
				return -1
			}
			return 1
		})
		k := 1 + r.IntN(n)
		ids := slices.Clone(sorted)
		r.Shuffle(n, func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		keysOf := func(ids []int32) []uint64 {
			keys := make([]uint64, len(ids))
			for i, id := range ids {
				keys[i] = orderKey(logits[id], id)
			}
			return keys
		}
		idsOf := func(keys []uint64) []int32 {
			ids := make([]int32, len(keys))
			for i, k := range keys {
				ids[i] = keyID(k)
			}
			return ids
		}
		keys := keysOf(ids)
		selectBest(keys, k)
		got, want := idsOf(keys[:k]), slices.Clone(sorted[:k])
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("top-%d of %d: %v, want %v", k, n, got, want)
		}

		w := make([]float64, n)
		var total float64
		for i := range w {
			w[i] = float64(logits[i]+1) / 13
			total += w[i]
		}
		need := r.Float64() * total
		wantN := 0
		for acc := 0.0; wantN < n; {
			acc += w[sorted[wantN]]
			wantN++
			if acc >= need {
				break
			}
		}
		r.Shuffle(n, func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		keys = keysOf(ids)
		gotN := nucleus(keys, w, need)
		got, want = idsOf(keys[:gotN]), slices.Clone(sorted[:wantN])
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("nucleus need %g of %g: %v, want %v", need, total, got, want)
		}
	}
}

// benchSample times one sampler draw over a 129280-token vocabulary of
// normal(0,1)·scale + shift logits, with peaks raised above them (an LM's
// shape) when peaks > 0.
func benchSample(b *testing.B, o SamplerOptions, scale, shift float64, peaks int) {
	r := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, 129280)
	for i := range logits {
		logits[i] = float32(r.NormFloat64()*scale + shift)
	}
	for k := 0; k < peaks; k++ {
		logits[r.IntN(len(logits))] = float32(8 + r.NormFloat64())
	}
	s := NewSampler(o)
	for b.Loop() {
		s.Sample(logits)
	}
}

// BenchmarkSamplePeaked: logits shaped like a language model's (a few
// tokens far above a broad tail), the usual top-p setting.
func BenchmarkSamplePeaked(b *testing.B) {
	benchSample(b, SamplerOptions{Temperature: 0.6, TopP: 0.95, Seed: 1}, 2, -6, 8)
}

// BenchmarkSampleMinP: the CLI's default filter (min-p 0.05 at temperature
// 1) on flat logits.
func BenchmarkSampleMinP(b *testing.B) {
	benchSample(b, SamplerOptions{Temperature: 1, MinP: 0.05, Seed: 1}, 1, 0, 0)
}

// BenchmarkSampleServer: ds4-server's defaults (temperature 1, min-p 0.05,
// top-p 1) on logits shaped like a language model's.
func BenchmarkSampleServer(b *testing.B) {
	benchSample(b, SamplerOptions{Temperature: 1, MinP: 0.05, TopP: 1, Seed: 1}, 2, -6, 8)
}

// BenchmarkSampleFlat: top-p over flat logits, the worst case for the
// nucleus (most of the vocabulary is in it).
func BenchmarkSampleFlat(b *testing.B) {
	benchSample(b, SamplerOptions{Temperature: 0.6, TopP: 0.95, Seed: 1}, 1, 0, 0)
}

// TestSampleExtremeOptions: options out of the usual ranges still give a
// valid token (min-p above 1 keeps the best token; top-p tiny keeps one).
func TestSampleExtremeOptions(t *testing.T) {
	logits := []float32{0.5, 3, 2.9, -1, float32(math.Inf(-1)), float32(math.NaN())}
	s := NewSampler(SamplerOptions{Seed: 3})
	for _, o := range []SamplerOptions{
		{Temperature: 1, MinP: 5},
		{Temperature: 1, MinP: 1},
		{Temperature: 1e-6, TopP: 1e-9},
		{Temperature: 100, TopK: 1, MinP: 0.9, TopP: 0.5},
	} {
		for range 50 {
			if got := s.SampleWith(logits, o); got != 1 {
				t.Fatalf("%+v: token %d, want the best (1)", o, got)
			}
		}
	}
}

func TestTopK(t *testing.T) {
	nan := float32(math.NaN())
	logits := []float32{1, 3, nan, 3, -2, 5, 1}
	for k, want := range [][]int32{{}, {5}, {5, 1}, {5, 1, 3}, {5, 1, 3, 0}, {5, 1, 3, 0, 6, 4}} {
		kk := k
		if k == 5 {
			kk = 100 // more than there are: all finite ids
		}
		if got := TopK(logits, kk); !slices.Equal(got, want) {
			t.Errorf("TopK(%d) = %v, want %v", kk, got, want)
		}
	}
}

// TestLeastFloat32AtLeast: v ≥ leastFloat32AtLeast(x) is float64(v) ≥ x for
// float32 values around x (the neighbours of its roundings), x random,
// halfway between two float32s, beyond the float32 range, infinite or NaN.
func TestLeastFloat32AtLeast(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	xs := []float64{0, math.Copysign(0, -1), 1e-50, -1e-50, math.MaxFloat64, -math.MaxFloat64, 1e39, -1e39,
		math.Inf(1), math.Inf(-1), math.NaN(), 1 + 0x1p-24, -(1 + 0x1p-24)}
	for i := 0; i < 2000; i++ {
		xs = append(xs, r.NormFloat64()*math.Pow(10, float64(r.IntN(20)-10)))
	}
	for _, x := range xs {
		c := leastFloat32AtLeast(x)
		f := float32(x)
		for _, v := range []float32{f, math.Nextafter32(f, float32(math.Inf(1))), math.Nextafter32(f, float32(math.Inf(-1))),
			c, math.Nextafter32(c, float32(math.Inf(-1))), float32(math.Inf(1)), float32(math.Inf(-1))} {
			if got, want := v >= c, float64(v) >= x; got != want {
				t.Fatalf("x=%v: v=%v ≥ %v is %v, float64(v) ≥ x is %v", x, v, c, got, want)
			}
		}
	}
}
