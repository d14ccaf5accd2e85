package engine

import (
	"math"

	"ds4go/model"
)

// RopeFrequencies returns the RoPE frequency of each of the RopeDim/2
// rotated pairs of layer l, as the official model.py's precompute_freqs_cis
// computes them in float32 (every backend rotates with these values, the
// angle of pair i at position p being float32(p)·freq[i] rounded to f32):
//
//   - uncompressed layers (ratio 0): base RopeBase, no YaRN;
//   - compressed layers: base CompressRopeBase with YaRN (factor RopeScale,
//     original context RopeOrigCtx, β fast/slow), for every rotation in the
//     layer (window q/kv, compressed rows, indexer q and rows).
//
// freq_i = 1 / base^(2i/rd); with YaRN, low/high are the correction dims of
// β_fast/β_slow (floor/ceil of rd·ln(orig/(β·2π))/(2·ln base), clamped to
// [0, rd−1]), ramp_i = clamp((i−low)/(high−low), 0, 1), smooth = 1−ramp and
// freq_i = freq_i/factor·(1−smooth) + freq_i·smooth.
func RopeFrequencies(c *model.Config, layer int) []float32 {
	rd := c.RopeDim
	base := c.RopeBase
	yarn := false
	if c.Ratio(layer) != model.RatioNone {
		base = c.CompressRopeBase
		yarn = c.RopeOrigCtx > 0
	}
	freqs := make([]float32, rd/2)
	for i := range freqs {
		e := float32(2*i) / float32(rd)
		freqs[i] = 1 / float32(math.Pow(float64(base), float64(e)))
	}
	if !yarn {
		return freqs
	}
	corr := func(rot float64) float64 {
		return float64(rd) * math.Log(float64(c.RopeOrigCtx)/(rot*2*math.Pi)) / (2 * math.Log(float64(base)))
	}
	low := max(math.Floor(corr(float64(c.YarnBetaFast))), 0)
	high := min(math.Ceil(corr(float64(c.YarnBetaSlow))), float64(rd-1))
	if low == high {
		high += 0.001
	}
	factor := c.RopeScale
	for i := range freqs {
		ramp := (float32(i) - float32(low)) / float32(high-low)
		ramp = min(max(ramp, 0), 1)
		smooth := 1 - ramp
		freqs[i] = float32(freqs[i]/factor*(1-smooth)) + float32(freqs[i]*smooth)
	}
	return freqs
}
