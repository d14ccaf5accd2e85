package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Quantize encodes the values src as type t into dst, which must be exactly
// t.RowBytes(len(src)) bytes; len(src) must be a whole number of blocks.
//
// F32, F16, BF16, Q8_0 and Q8_K produce ggml's bytes exactly (Q8_0 as
// ggml's reference quantize_row_q8_0_ref, which ggml uses to write model
// files). Q2_K and Q4_K follow ggml's reference (no importance matrix)
// algorithm. IQ2_XXS uses this package's own search over the ggml codebook
// (see quantIQ2XXSBlock); it need not choose ggml's blocks.
//
// Quantize uses no goroutines and allocates nothing; callers parallelise
// over rows.
func Quantize(t Type, src []float32, dst []byte) error {
	if err := checkRow(t, len(dst), len(src)); err != nil {
		return fmt.Errorf("quantize: %w", err)
	}
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
	case Q8_0:
		for b := 0; b < len(src)/32; b++ {
			quantQ8_0Ref((*[32]float32)(src[32*b:]), (*[q8_0Bytes]byte)(dst[q8_0Bytes*b:]))
		}
	case Q8_K:
		for b := 0; b < len(src)/QK_K; b++ {
			blk := dst[q8KBytes*b:]
			var q [QK_K]int8
			var bs [16]int16
			d := quantQ8KBlock((*[QK_K]float32)(src[QK_K*b:]), &q, &bs)
			binary.LittleEndian.PutUint32(blk[q8KD:], math.Float32bits(d))
			for i, v := range q {
				blk[q8KQs+i] = byte(v)
			}
			for i, v := range bs {
				binary.LittleEndian.PutUint16(blk[q8KBsums+2*i:], uint16(v))
			}
		}
	case Q2_K:
		for b := 0; b < len(src)/QK_K; b++ {
			quantQ2KBlock((*[QK_K]float32)(src[QK_K*b:]), (*[q2KBytes]byte)(dst[q2KBytes*b:]))
		}
	case Q4_K:
		for b := 0; b < len(src)/QK_K; b++ {
			quantQ4KBlock((*[QK_K]float32)(src[QK_K*b:]), (*[q4KBytes]byte)(dst[q4KBytes*b:]))
		}
	case IQ2_XXS:
		for b := 0; b < len(src)/QK_K; b++ {
			quantIQ2XXSBlock((*[QK_K]float32)(src[QK_K*b:]), (*[iq2xxsBytes]byte)(dst[iq2xxsBytes*b:]))
		}
	}
	return nil
}

// quantQ8_0Ref quantizes 32 values like ggml's quantize_row_q8_0_ref:
// d = amax/127, multiplier 1/d, round half away from zero.
func quantQ8_0Ref(x *[32]float32, out *[q8_0Bytes]byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(out[0:], F32ToF16(d))
	for i, v := range x {
		out[2+i] = byte(clampI8(int32(math.Round(float64(v * id)))))
	}
}

// groupMaxEps is ggml's GROUP_MAX_EPS: groups whose magnitude is below it
// quantize to zero.
const groupMaxEps = 1e-15

// fitScaleMin fits x[i] ≈ scale*L[i] - m with integer L[i] in [0, nmax] and
// m >= 0, minimising the weighted squared (or absolute, when mad) error. It
// is the algorithm of ggml's make_qkx2_quants: start from the min/max
// range, then try nstep+1 slightly different grid spacings, each followed by
// a weighted least-squares solve for scale and min. laux is scratch space of
// len(x).
func fitScaleMin(x, w []float32, L, laux []uint8, nmax int32, rmin, rdelta float32, nstep int, mad bool) (scale, m float32) {
	n := len(x)
	w = w[:n]
	L = L[:n]
	laux = laux[:n]
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		lo = min(lo, x[i])
		hi = max(hi, x[i])
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	lo = min(lo, 0)
	if hi == lo {
		clear(L)
		return 0, -lo
	}
	errOf := func(d float32) float32 {
		if mad {
			return abs32(d)
		}
		return float32(d * d)
	}
	quant := func(iscale, v float32) uint8 {
		return uint8(max(0, min(nmax, nearestInt(iscale*(v-lo)))))
	}
	iscale := float32(nmax) / (hi - lo)
	scale = 1 / iscale
	var best float32
	for i, v := range x {
		l := quant(iscale, v)
		L[i] = l
		best += float32(w[i] * errOf(float32(float32(scale*float32(l))+lo)-v))
	}
	for is := 0; is <= nstep; is++ {
		iscale = float32(rmin+float32(rdelta*float32(is))+float32(nmax)) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := quant(iscale, v)
			laux[i] = l
			fl := float32(l)
			wl := w[i] * fl
			sumL += wl
			sumL2 += float32(wl * fl)
			sumXL += float32(wl * v)
		}
		den := float32(sumW*sumL2) - float32(sumL*sumL)
		if den <= 0 {
			continue
		}
		thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / den
		thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / den
		if thisMin > 0 {
			thisMin = 0
			thisScale = sumXL / sumL2
		}
		var cur float32
		for i, v := range x {
			cur += float32(w[i] * errOf(float32(float32(thisScale*float32(laux[i]))+thisMin)-v))
		}
		if cur < best {
			copy(L, laux)
			best, scale, lo = cur, thisScale, thisMin
		}
	}
	return scale, -lo
}

// quantQ2KBlock quantizes 256 values to Q2_K like ggml's
// quantize_row_q2_K_ref: per 16-value sub-block a (scale, min) fit with
// |x| weights, the 16 scales and mins quantized to 4 bits against f16
// super-block scales, then the 2-bit quants recomputed with the final scales.
func quantQ2KBlock(x *[QK_K]float32, out *[q2KBytes]byte) {
	var L [QK_K]uint8
	var laux [16]uint8
	var w [16]float32
	var scales, mins [16]float32
	var maxScale, maxMin float32
	for j := 0; j < 16; j++ {
		xs := x[16*j : 16*j+16]
		for l, v := range xs {
			w[l] = abs32(v)
		}
		scales[j], mins[j] = fitScaleMin(xs, w[:], L[16*j:], laux[:], 3, -0.5, 0.1, 15, true)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	sc := (*[16]byte)(out[q2KScales:])
	var dh, mh uint16
	if maxScale > 0 {
		is := 15 / maxScale
		for j := range sc {
			sc[j] = uint8(nearestInt(is * scales[j]))
		}
		dh = F32ToF16(maxScale / 15)
	} else {
		*sc = [16]byte{}
	}
	if maxMin > 0 {
		im := 15 / maxMin
		for j := range sc {
			sc[j] |= uint8(nearestInt(im*mins[j])) << 4
		}
		mh = F32ToF16(maxMin / 15)
	}
	binary.LittleEndian.PutUint16(out[q2KD:], dh)
	binary.LittleEndian.PutUint16(out[q2KDmin:], mh)
	df, mf := F16ToF32(dh), F16ToF32(mh)
	for j := 0; j < 16; j++ {
		d := df * float32(sc[j]&0xf)
		if d == 0 {
			continue
		}
		dm := mf * float32(sc[j]>>4)
		for i := 16 * j; i < 16*j+16; i++ {
			L[i] = uint8(max(0, min(3, nearestInt((x[i]+dm)/d))))
		}
	}
	qs := (*[64]byte)(out[q2KQs:])
	for h := 0; h < 2; h++ {
		for l := 0; l < 32; l++ {
			j := 128*h + l
			qs[32*h+l] = L[j] | L[j+32]<<2 | L[j+64]<<4 | L[j+96]<<6
		}
	}
}

// quantQ4KBlock quantizes 256 values to Q4_K like ggml's
// quantize_row_q4_K_ref: per 32-value sub-block a (scale, min) fit with
// weights rms+|x|, the 8 scales and mins quantized to 6 bits against f16
// super-block scales, then the 4-bit quants recomputed.
func quantQ4KBlock(x *[QK_K]float32, out *[q4KBytes]byte) {
	var L [QK_K]uint8
	var laux [32]uint8
	var w [32]float32
	var scales, mins [8]float32
	var maxScale, maxMin float32
	for j := 0; j < 8; j++ {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		av := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			w[l] = av + abs32(v)
		}
		scales[j], mins[j] = fitScaleMin(xs, w[:], L[32*j:], laux[:], 15, -1, 0.1, 20, false)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	s := (*[12]byte)(out[q4KScales:])
	*s = [12]byte{}
	for j := 0; j < 8; j++ {
		ls := min(63, uint8(nearestInt(invScale*scales[j])))
		lm := min(63, uint8(nearestInt(invMin*mins[j])))
		if j < 4 {
			s[j] = ls
			s[j+4] = lm
		} else {
			s[j+4] = ls&0xf | (lm&0xf)<<4
			s[j-4] |= (ls >> 4) << 6
			s[j] |= (lm >> 4) << 6
		}
	}
	dh, mh := F32ToF16(maxScale/63), F32ToF16(maxMin/63)
	binary.LittleEndian.PutUint16(out[q4KD:], dh)
	binary.LittleEndian.PutUint16(out[q4KDmin:], mh)
	df, mf := F16ToF32(dh), F16ToF32(mh)
	for j := 0; j < 8; j++ {
		sc, m := q4KScaleMin(s, j)
		d := df * float32(sc)
		if d == 0 {
			continue
		}
		dm := mf * float32(m)
		for i := 32 * j; i < 32*j+32; i++ {
			L[i] = uint8(max(0, min(15, nearestInt((x[i]+dm)/d))))
		}
	}
	for c := 0; c < 4; c++ {
		for l := 0; l < 32; l++ {
			out[q4KQs+32*c+l] = L[64*c+l] | L[64*c+32+l]<<4
		}
	}
}
