package engine

import (
	"math"
	"math/rand/v2"
	"slices"
)

// SamplerOptions chooses how the next token is drawn from the logits.
// The zero value is greedy decoding.
type SamplerOptions struct {
	// Temperature divides the logits; ≤ 0 means greedy (argmax, the lowest
	// id on ties), ignoring the other fields.
	Temperature float32
	// TopK keeps the K most likely tokens (0: all).
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches TopP (0 or ≥ 1: all).
	TopP float32
	// MinP keeps tokens whose probability is at least MinP times the most
	// likely token's (0: all).
	MinP float32
	// Seed seeds the sampler's random generator: the same seed, options and
	// logits give the same tokens.
	Seed uint64
}

// Sampler draws tokens from logits. The filters apply in the order
// temperature → top-k → softmax → min-p → top-p, then one token is drawn
// from the renormalised distribution. It is not safe for concurrent use.
type Sampler struct {
	opts SamplerOptions
	rng  *rand.Rand
	idx  []int32
	prob []float64
}

// NewSampler returns a sampler.
func NewSampler(o SamplerOptions) *Sampler {
	return &Sampler{opts: o, rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))}
}

// Options returns the sampler's options.
func (s *Sampler) Options() SamplerOptions { return s.opts }

// Greedy returns the id of the largest logit (the lowest id on ties; NaNs
// are never chosen unless every logit is NaN).
func Greedy(logits []float32) int32 {
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

// Sample draws a token id from logits.
//
// It never sorts the vocabulary: top-k and top-p pick their sets by
// quickselect over the order (logit descending, lower id first), expected
// linear time, and the draw walks the chosen set in the order the
// selection left it (any fixed order draws from the same distribution).
func (s *Sampler) Sample(logits []float32) int32 {
	return s.SampleWith(logits, s.opts)
}

// SampleWith draws a token id from logits with other options than the
// sampler's (their Seed is ignored: the draw uses the sampler's random
// stream). A server uses it to apply each request's settings to one seeded
// stream.
func (s *Sampler) SampleWith(logits []float32, o SamplerOptions) int32 {
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
	better := logitOrder(logits)
	if o.TopK > 0 && o.TopK < len(s.idx) {
		selectBest(s.idx, o.TopK, better)
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
		n := nucleus(s.idx, s.prob, float64(o.TopP)*total, better)
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

// partition rearranges ids[lo:hi] (and w alongside, when not nil) around a
// pivot chosen from the middle: the ids better than it, then the pivot, then
// the rest. It returns the pivot's final index.
func partition(ids []int32, w []float64, lo, hi int, better func(a, b int32) bool) int {
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

// logitOrder orders token ids by logit, largest first, ties by lower id.
func logitOrder(logits []float32) func(a, b int32) bool {
	return func(a, b int32) bool {
		if la, lb := logits[a], logits[b]; la != lb {
			return la > lb
		}
		return a < b
	}
}

// TopK returns the ids of the k largest logits (NaNs excluded), largest
// first, ties by lower id — the order greedy sampling ranks them in.
func TopK(logits []float32, k int) []int32 {
	ids := make([]int32, 0, len(logits))
	for i, v := range logits {
		if v == v {
			ids = append(ids, int32(i))
		}
	}
	better := logitOrder(logits)
	k = min(max(k, 0), len(ids))
	selectBest(ids, k, better)
	ids = ids[:k]
	slices.SortFunc(ids, func(a, b int32) int {
		if better(a, b) {
			return -1
		}
		return 1
	})
	return ids
}

// selectBest moves the k best ids (by better) to ids[:k], in no order.
func selectBest(ids []int32, k int, better func(a, b int32) bool) {
	lo, hi := 0, len(ids)
	for hi-lo > 1 {
		p := partition(ids, nil, lo, hi, better)
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

// nucleus rearranges ids and w so that ids[:n] is the smallest set of the
// best ids whose weights reach need (all of them if they never do), and
// returns n.
func nucleus(ids []int32, w []float64, need float64, better func(a, b int32) bool) int {
	lo, hi := 0, len(ids)
	for hi > lo {
		if hi-lo == 1 {
			return hi
		}
		p := partition(ids, w, lo, hi, better)
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
