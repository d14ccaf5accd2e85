package server

import "ds4go/engine"

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

// sampler draws a request's tokens: engine.Sampler's filters (temperature,
// top-k, min-p, top-p; their order does not change the kept set) on one
// seeded random stream, with the request's settings at each call.
type sampler struct {
	s *engine.Sampler
}

func newSampler(seed uint64) *sampler {
	return &sampler{s: engine.NewSampler(engine.SamplerOptions{Seed: seed})}
}

// greedy reports whether every token of a request is the greedy choice.
func (p SamplingParams) greedy() bool { return p.Temperature <= 0 || p.TopK == 1 }

// options are p's sampler options.
func (p SamplingParams) options() engine.SamplerOptions {
	return engine.SamplerOptions{
		Temperature: float32(p.Temperature), TopK: max(p.TopK, 0), TopP: float32(p.TopP), MinP: float32(max(p.MinP, 0)),
	}
}

// filter is the filter whose candidates serve p's draws (engine.FilterFor;
// nil: none does).
func (p SamplingParams) filter() *engine.PickFilter {
	if p.greedy() {
		return nil
	}
	return engine.FilterFor(p.options())
}

// sample picks the next token. greedy forces temperature 0 (DSML structure).
func (s *sampler) sample(l *engine.Logits, p SamplingParams, greedy bool) int32 {
	if greedy || p.greedy() {
		return l.Greedy()
	}
	return s.s.SampleLogits(l, p.options())
}
