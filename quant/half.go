package quant

import "math"

// f16Table maps every IEEE half-precision bit pattern to its float32 value.
// A 256 KiB table is faster than the bit arithmetic in the dot-product loops.
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = f16ToF32Slow(uint16(i))
	}
	return &t
}()

// f16ToF32Slow converts by bit manipulation; it is exact for every input.
func f16ToF32Slow(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0:
		// Zero or subnormal: mant * 2^-24, exact in float32.
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	default:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
}

// F16ToF32 converts an IEEE 754 binary16 value (given as its bits) to float32.
// The conversion is exact.
func F16ToF32(h uint16) float32 { return f16Table[h] }

// F32ToF16 converts f to IEEE 754 binary16 bits, rounding to nearest with
// ties to even, as ggml's GGML_FP32_TO_FP16 does. Values too large for a half
// become infinities and every NaN becomes the quiet NaN 0x7e00 (with f's sign).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00
	case abs >= 0x477ff000: // >= 65520: rounds to infinity
		return sign | 0x7c00
	case abs >= 0x38800000: // >= 2^-14: a normal half
		// Round the 23-bit mantissa to 10 bits (ties to even); a carry
		// correctly bumps the exponent. Then rebias 127 -> 15.
		r := abs + 0xfff + (abs>>13)&1
		return sign | uint16((r-(112<<23))>>13)
	}
	e := abs >> 23
	if e < 102 { // below 2^-25: rounds to zero
		return sign
	}
	// Subnormal half: count units of 2^-24. The value is m * 2^(e-150).
	m := abs&0x7fffff | 0x800000
	shift := 126 - e // 14..24
	q := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	return sign | uint16(q)
}

// BF16ToF32 converts bfloat16 bits to float32 (exact).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts f to bfloat16 bits, rounding to nearest with ties to
// even; a NaN stays a NaN and is made quiet, as ggml's
// ggml_compute_fp32_to_bf16 does.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// RoundF16 returns f rounded to the nearest half-precision value.
func RoundF16(f float32) float32 { return F16ToF32(F32ToF16(f)) }

// RoundBF16 returns f rounded to the nearest bfloat16 value.
func RoundBF16(f float32) float32 { return BF16ToF32(F32ToBF16(f)) }
