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
func (s *Sampler) Sample(logits []float32) int32 {
	o := s.opts
	if o.Temperature <= 0 || len(logits) == 0 {
		return Greedy(logits)
	}
	// Candidates sorted by logit, descending (ties by id).
	s.idx = s.idx[:0]
	for i, v := range logits {
		if v == v && !math.IsInf(float64(v), -1) {
			s.idx = append(s.idx, int32(i))
		}
	}
	if len(s.idx) == 0 {
		return Greedy(logits)
	}
	slices.SortFunc(s.idx, func(a, b int32) int {
		switch la, lb := logits[a], logits[b]; {
		case la > lb:
			return -1
		case la < lb:
			return 1
		}
		return int(a) - int(b)
	})
	if o.TopK > 0 && o.TopK < len(s.idx) {
		s.idx = s.idx[:o.TopK]
	}
	// Softmax at the temperature, in float64.
	invT := 1 / float64(o.Temperature)
	top := float64(logits[s.idx[0]])
	s.prob = s.prob[:0]
	var sum float64
	for _, id := range s.idx {
		p := math.Exp((float64(logits[id]) - top) * invT)
		s.prob = append(s.prob, p)
		sum += p
	}
	for i := range s.prob {
		s.prob[i] /= sum
	}
	n := len(s.idx)
	if o.MinP > 0 {
		th := float64(o.MinP) * s.prob[0]
		for n > 1 && s.prob[n-1] < th {
			n--
		}
	}
	if o.TopP > 0 && o.TopP < 1 {
		var c float64
		for i := 0; i < n; i++ {
			c += s.prob[i]
			if c >= float64(o.TopP) {
				n = i + 1
				break
			}
		}
	}
	var total float64
	for _, p := range s.prob[:n] {
		total += p
	}
	u := s.rng.Float64() * total
	for i, p := range s.prob[:n] {
		u -= p
		if u < 0 {
			return s.idx[i]
		}
	}
	return s.idx[n-1]
}
