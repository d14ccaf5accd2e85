package server

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Sampling defaults, as ds4 (and the DeepSeek API) use them.
const (
	DefaultTemperature = 1.0
	DefaultTopP        = 1.0
	DefaultMinP        = 0.05
)

// SamplingParams are a request's sampling settings.
type SamplingParams struct {
	Temperature float64 // ≤ 0: greedy
	TopK        int     // ≤ 0: no cap
	TopP        float64 // ≥ 1: off
	MinP        float64 // ≤ 0: off
}

// DefaultSampling returns ds4's defaults: temperature 1, top_p 1, min_p 0.05,
// no top-k cap.
func DefaultSampling() SamplingParams {
	return SamplingParams{Temperature: DefaultTemperature, TopP: DefaultTopP, MinP: DefaultMinP}
}

// sampler draws tokens from logits. It keeps scratch buffers between calls.
type sampler struct {
	rng  *rand.Rand
	cand []cand
}

type cand struct {
	id int32
	p  float64
}

func newSampler(seed uint64) *sampler {
	return &sampler{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// argmax returns the index of the largest logit (the first on ties).
func argmax(logits []float32) int32 {
	best := 0
	bv := float32(math.Inf(-1))
	for i, v := range logits {
		if v > bv {
			bv, best = v, i
		}
	}
	return int32(best)
}

// sample picks the next token. greedy forces temperature 0 (DSML structure).
func (s *sampler) sample(logits []float32, p SamplingParams, greedy bool) int32 {
	if greedy || p.Temperature <= 0 || p.TopK == 1 {
		return argmax(logits)
	}
	maxv := float32(math.Inf(-1))
	for _, v := range logits {
		if v > maxv {
			maxv = v
		}
	}
	if math.IsInf(float64(maxv), -1) || math.IsNaN(float64(maxv)) {
		return argmax(logits)
	}
	invT := 1 / p.Temperature
	// Relative probabilities exp((l-max)/T) lie in (0, 1]; min-p keeps
	// those ≥ min_p (the maximum is 1).
	floor := 0.0
	if p.MinP > 0 {
		floor = p.MinP
	}
	// Logits below cutoff cannot pass min-p: skip their exp.
	cutoff := float32(math.Inf(-1))
	if floor > 0 {
		cutoff = maxv + float32(p.Temperature*math.Log(floor)) - 1e-3
	}
	c := s.cand[:0]
	for i, v := range logits {
		if v < cutoff {
			continue
		}
		q := math.Exp(float64(v-maxv) * invT)
		if q >= floor && q > 0 {
			c = append(c, cand{int32(i), q})
		}
	}
	if len(c) == 0 {
		s.cand = c
		return argmax(logits)
	}
	needSort := (p.TopK > 0 && p.TopK < len(c)) || (p.TopP > 0 && p.TopP < 1)
	if needSort {
		slices.SortFunc(c, func(a, b cand) int {
			switch {
			case a.p > b.p:
				return -1
			case a.p < b.p:
				return 1
			}
			return int(a.id - b.id)
		})
		if p.TopK > 0 && p.TopK < len(c) {
			c = c[:p.TopK]
		}
		if p.TopP > 0 && p.TopP < 1 {
			total := 0.0
			for _, x := range c {
				total += x.p
			}
			acc := 0.0
			for i, x := range c {
				acc += x.p
				if acc >= p.TopP*total {
					c = c[:i+1]
					break
				}
			}
		}
	}
	total := 0.0
	for _, x := range c {
		total += x.p
	}
	r := s.rng.Float64() * total
	pick := c[len(c)-1].id
	for _, x := range c {
		r -= x.p
		if r < 0 {
			pick = x.id
			break
		}
	}
	s.cand = c[:0]
	return pick
}
