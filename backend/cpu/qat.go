package cpu

import "math"

// The low-precision simulations that V4 applies to its attention state
// (quantisation-aware training semantics). Facts from the official
// kernel.py (act_quant / fp4_act_quant with power-of-two "ue8m0" scales) as
// docs/forward-reference.md §2 spells them out; ds4.c rounds the same way.

// Block sizes of the simulations.
const (
	fp8Block = 64 // KV nope dims
	fp4Block = 32 // indexer q and rows, after the Hadamard transform
)

// pow2Ceil returns the smallest power of two ≥ v for a positive normal v,
// exactly (from the exponent, no logarithm).
func pow2Ceil(v float32) float32 {
	m, e := math.Frexp(float64(v))
	if m == 0.5 {
		e--
	}
	return float32(math.Ldexp(1, e))
}

// roundE4M3 rounds |y| ≤ 448 to the nearest FP8 e4m3fn value (3 mantissa
// bits, exponent ≥ −6 with subnormals below), ties to even.
func roundE4M3(y float32) float32 {
	a := float64(abs32(y))
	_, e := math.Frexp(a) // a = m·2^e, m in [0.5, 1)
	q := math.Ldexp(1, max(e-1, -6)-3)
	return float32(math.Copysign(math.RoundToEven(a/q)*q, float64(y)))
}

// roundE2M1 rounds |y| ≤ 6 to the nearest FP4 e2m1 value
// {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to even.
func roundE2M1(y float32) float32 {
	a := float64(abs32(y))
	q := 2.0
	if a < 2 {
		q = 0.5
	} else if a < 4 {
		q = 1
	}
	return float32(math.Copysign(math.RoundToEven(a/q)*q, float64(y)))
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

var (
	inv448 = float32(1.0 / 448.0)
	inv6   = float32(1.0 / 6.0)
)

// fp8Simulate replaces x (a multiple of 64 values) by its FP8 e4m3
// quantise-dequantise in blocks of 64: scale = 2^ceil(log2(amax/448)) with
// amax ≥ 1e-4, values clamped to ±448 and rounded.
func fp8Simulate(x []float32) {
	for b := 0; b+fp8Block <= len(x); b += fp8Block {
		blk := x[b : b+fp8Block]
		amax := float32(1e-4)
		for _, v := range blk {
			amax = max(amax, abs32(v))
		}
		s := pow2Ceil(amax * inv448)
		for i, v := range blk {
			y := min(max(v/s, -448), 448)
			blk[i] = roundE4M3(y) * s
		}
	}
}

// fp4Simulate replaces x (a multiple of 32 values) by its FP4 e2m1
// quantise-dequantise in blocks of 32: scale = 2^ceil(log2(amax/6)) with
// amax ≥ 6·2^−126, values clamped to ±6 and rounded.
func fp4Simulate(x []float32) {
	minAmax := float32(6 * math.Ldexp(1, -126))
	for b := 0; b+fp4Block <= len(x); b += fp4Block {
		blk := x[b : b+fp4Block]
		amax := minAmax
		for _, v := range blk {
			amax = max(amax, abs32(v))
		}
		s := pow2Ceil(amax * inv6)
		for i, v := range blk {
			y := min(max(v/s, -6), 6)
			blk[i] = roundE2M1(y) * s
		}
	}
}

// hadamard applies the normalised Walsh–Hadamard transform to x (a power
// of two long) in place: butterflies with strides 1, 2, 4, … (Sylvester
// order), then a multiplication by f32(n^−1/2).
func hadamard(x []float32) {
	n := len(x)
	for s := 1; s < n; s *= 2 {
		for j := 0; j < n; j += 2 * s {
			for k := j; k < j+s; k++ {
				a, b := x[k], x[k+s]
				x[k], x[k+s] = a+b, a-b
			}
		}
	}
	scale := float32(math.Pow(float64(n), -0.5))
	for i := range x {
		x[i] *= scale
	}
}
