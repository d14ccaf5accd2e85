package engine

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refSampler is the sampler as it was before its comparisons became integer
// keys and its weights parallel (comparator closures over the logits, one
// goroutine): the executable statement of what a draw must be.
type refSampler struct {
	rng  *rand.Rand
	idx  []int32
	prob []float64
}

func (s *refSampler) sampleWith(logits []float32, o SamplerOptions) int32 {
	if o.Temperature <= 0 || len(logits) == 0 {
		return Greedy(logits)
	}
	s.idx = s.idx[:0]
	for i, v := range logits {
		if v == v && !math.IsInf(float64(v), -1) {
			s.idx = append(s.idx, int32(i))
		}
	}
	if len(s.idx) == 0 {
		return Greedy(logits)
	}
	better := refLogitOrder(logits)
	if o.TopK > 0 && o.TopK < len(s.idx) {
		refSelectBest(s.idx, o.TopK, better)
		s.idx = s.idx[:o.TopK]
	}
	top := s.idx[0]
	for _, id := range s.idx[1:] {
		if better(id, top) {
			top = id
		}
	}
	// Weights at the temperature relative to the best token (which has 1).
	invT := 1 / float64(o.Temperature)
	lt := float64(logits[top])
	if o.MinP > 0 {
		// Logits this far below the best cannot reach min-p's weight:
		// drop them before their exp (the exact test follows).
		cut := lt + float64(o.Temperature)*math.Log(float64(o.MinP)) - 1e-3
		n := 0
		for _, id := range s.idx {
			if float64(logits[id]) >= cut || id == top {
				s.idx[n] = id
				n++
			}
		}
		s.idx = s.idx[:n]
	}
	s.prob = s.prob[:0]
	for _, id := range s.idx {
		s.prob = append(s.prob, math.Exp((float64(logits[id])-lt)*invT))
	}
	// min-p keeps weights ≥ MinP (the best token's weight is 1).
	if o.MinP > 0 {
		n := 0
		for i, id := range s.idx {
			if s.prob[i] >= float64(o.MinP) || id == top {
				s.idx[n], s.prob[n] = id, s.prob[i]
				n++
			}
		}
		s.idx, s.prob = s.idx[:n], s.prob[:n]
	}
	if o.TopP > 0 && o.TopP < 1 {
		var total float64
		for _, p := range s.prob {
			total += p
		}
		n := refNucleus(s.idx, s.prob, float64(o.TopP)*total, better)
		s.idx, s.prob = s.idx[:n], s.prob[:n]
	}
	var total float64
	for _, p := range s.prob {
		total += p
	}
	u := s.rng.Float64() * total
	for i, p := range s.prob {
		u -= p
		if u < 0 {
			return s.idx[i]
		}
	}
	return s.idx[len(s.idx)-1]
}

func refPartition(ids []int32, w []float64, lo, hi int, better func(a, b int32) bool) int {
	swap := func(i, j int) {
		ids[i], ids[j] = ids[j], ids[i]
		if w != nil {
			w[i], w[j] = w[j], w[i]
		}
	}
	// Median of three as the pivot, moved to hi-1.
	m := lo + (hi-lo)/2
	a, b, c := lo, m, hi-1
	if better(ids[b], ids[a]) {
		a, b = b, a
	}
	if better(ids[c], ids[b]) {
		b = c
		if better(ids[b], ids[a]) {
			b = a
		}
	}
	swap(b, hi-1)
	pv := ids[hi-1]
	store := lo
	for i := lo; i < hi-1; i++ {
		if better(ids[i], pv) {
			swap(i, store)
			store++
		}
	}
	swap(store, hi-1)
	return store
}

func refSelectBest(ids []int32, k int, better func(a, b int32) bool) {
	lo, hi := 0, len(ids)
	for hi-lo > 1 {
		p := refPartition(ids, nil, lo, hi, better)
		switch {
		case p == k || p == k-1:
			return
		case p > k:
			hi = p
		default:
			lo = p + 1
		}
	}
}

func refNucleus(ids []int32, w []float64, need float64, better func(a, b int32) bool) int {
	lo, hi := 0, len(ids)
	for hi > lo {
		if hi-lo == 1 {
			return hi
		}
		p := refPartition(ids, w, lo, hi, better)
		var mass float64
		for _, x := range w[lo:p] {
			mass += x
		}
		switch {
		case mass >= need:
			hi = p
		case mass+w[p] >= need:
			return p + 1
		default:
			need -= mass + w[p]
			lo = p + 1
		}
	}
	return max(lo, 1)
}

func refLogitOrder(logits []float32) func(a, b int32) bool {
	return func(a, b int32) bool {
		if la, lb := logits[a], logits[b]; la != lb {
			return la > lb
		}
		return a < b
	}
}

// TestSampleMatchesReference: the same seeds, options and logits draw the
// same tokens as refSampler — vocabularies large enough for the parallel
// weights, ties, negative zeros, infinities and NaNs included.
func TestSampleMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	opts := []SamplerOptions{
		{Temperature: 0.6, TopP: 0.95},
		{Temperature: 1, TopK: 40},
		{Temperature: 0.8, MinP: 0.05},
		{Temperature: 1.3, TopK: 500, TopP: 0.9, MinP: 0.01},
		{Temperature: 0.2},
		{Temperature: 1, TopP: 0.5, TopK: 3},
	}
	for trial := 0; trial < 24; trial++ {
		n := 1 + r.IntN(300)
		if trial%3 == 0 {
			n = 40000 + r.IntN(100000)
		}
		logits := make([]float32, n)
		peaked := trial%2 == 0
		for i := range logits {
			switch {
			case r.IntN(50) == 0:
				logits[i] = float32(r.IntN(5)) // ties
			case peaked:
				logits[i] = float32(r.NormFloat64()*3 - 8)
			default:
				logits[i] = float32(r.NormFloat64())
			}
		}
		if peaked {
			for k := 0; k < 5; k++ {
				logits[r.IntN(n)] = float32(6 + r.IntN(4))
			}
		}
		logits[r.IntN(n)] = float32(math.Copysign(0, -1))
		logits[r.IntN(n)] = 0
		logits[r.IntN(n)] = float32(math.NaN())
		logits[r.IntN(n)] = float32(math.Inf(-1))
		o := opts[trial%len(opts)]
		o.Seed = uint64(trial)
		s := NewSampler(o)
		ref := &refSampler{rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))}
		for d := 0; d < 30; d++ {
			if got, want := s.Sample(logits), ref.sampleWith(logits, o); got != want {
				t.Fatalf("trial %d (%d logits, %+v) draw %d: token %d, the reference draws %d", trial, n, o, d, got, want)
			}
		}
	}
}

// refGreedy is Greedy as first written: one pass, NaNs skipped.
func refGreedy(logits []float32) int32 {
	best := -1
	for i, v := range logits {
		if v != v {
			continue
		}
		if best < 0 || v > logits[best] {
			best = i
		}
	}
	return int32(max(best, 0))
}

// TestGreedyMatchesReference: the four-lane Greedy picks refGreedy's token
// on short and long inputs full of ties, signed zeros, NaNs and infinities.
func TestGreedyMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 3}
	for trial := 0; trial < 3000; trial++ {
		n := r.IntN(12)
		if trial%10 == 0 {
			n = r.IntN(5000)
		}
		logits := make([]float32, n)
		for i := range logits {
			if r.IntN(3) == 0 {
				logits[i] = specials[r.IntN(len(specials))]
			} else {
				logits[i] = float32(r.IntN(4))
			}
		}
		if got, want := Greedy(logits), refGreedy(logits); got != want {
			t.Fatalf("%v: %d, want %d", logits, got, want)
		}
	}
	if got := Greedy(nil); got != 0 {
		t.Fatalf("empty: %d", got)
	}
}

// BenchmarkGreedy: one decode step's argmax over the vocabulary.
func BenchmarkGreedy(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, 129280)
	for i := range logits {
		logits[i] = float32(r.NormFloat64())
	}
	for b.Loop() {
		Greedy(logits)
	}
}
