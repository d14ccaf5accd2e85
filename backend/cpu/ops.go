package cpu

import "math"

// Scalar and vector math shared by the ops. Everything is f32 with the
// roundings of the official model.py where they matter; transcendental
// functions are evaluated in float64 and rounded once.

// rmsScale returns rsqrt(mean(x²) + eps) as the reference computes it:
// the mean of squares in f32 (accumulated here in float64), plus eps in f32,
// then the reciprocal square root rounded to f32.
func rmsScale(x []float32, eps float32) float32 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	ms := float32(s / float64(len(x)))
	return float32(1 / math.Sqrt(float64(ms+eps)))
}

// rmsNorm writes w ⊙ (x · rsqrt(mean(x²)+eps)) to out (out may be x).
func rmsNorm(out, x, w []float32, eps float32) {
	r := rmsScale(x, eps)
	w = w[:len(x)]
	out = out[:len(x)]
	for i, v := range x {
		out[i] = w[i] * (v * r)
	}
}

// rmsNormPlain scales x in place by rsqrt(mean(x²)+eps) (no weight).
func rmsNormPlain(x []float32, eps float32) {
	r := rmsScale(x, eps)
	for i := range x {
		x[i] *= r
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// silu is x·sigmoid(x), as torch.nn.functional.silu: x / (1 + e^−x).
func silu(x float32) float32 { return float32(float64(x) / (1 + math.Exp(-float64(x)))) }

// softplus is log(1 + e^x), as torch.nn.functional.softplus with β = 1 and
// threshold 20 (x itself above the threshold).
func softplus(x float32) float32 {
	if x > 20 {
		return x
	}
	return float32(math.Log1p(math.Exp(float64(x))))
}

func expf(x float32) float32 { return float32(math.Exp(float64(x))) }

// axpy adds a·x to y.
func axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}
