package cpu

import "math"

// RoPE as the official model.py applies it: the LAST RopeDim values of a
// head are rotated, as interleaved pairs (2i, 2i+1) viewed as one complex
// number, by the angle f32(p)·freq_i (rounded to f32) at position p; the
// inverse rotation (complex conjugate) undoes it on the attention output.
// The frequencies come from engine.RopeFrequencies (YaRN on compressed
// layers only).

// rotation fills cs with the (cos, sin) pairs of position p.
func rotation(cs []float32, freqs []float32, p int) {
	fp := float32(p)
	for i, f := range freqs {
		a := float64(fp * f)
		cs[2*i] = float32(math.Cos(a))
		cs[2*i+1] = float32(math.Sin(a))
	}
}

// rotate multiplies each pair of x (len(cs) values) by cos + i·sin.
func rotate(x, cs []float32) {
	x = x[:len(cs)]
	for i := 0; i < len(cs); i += 2 {
		c, s := cs[i], cs[i+1]
		a, b := x[i], x[i+1]
		x[i] = a*c - b*s
		x[i+1] = a*s + b*c
	}
}

// rotateInv multiplies each pair of x by cos − i·sin.
func rotateInv(x, cs []float32) {
	x = x[:len(cs)]
	for i := 0; i < len(cs); i += 2 {
		c, s := cs[i], cs[i+1]
		a, b := x[i], x[i+1]
		x[i] = a*c + b*s
		x[i+1] = b*c - a*s
	}
}
