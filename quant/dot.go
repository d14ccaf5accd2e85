package quant

import (
	"fmt"
)

// checkDot validates a weight row of type t against activation a.
func checkDot(t Type, nbytes int, a *Activation) error {
	if a == nil {
		return fmt.Errorf("quant: nil activation")
	}
	if err := checkRow(t, nbytes, a.n); err != nil {
		return err
	}
	ok := false
	switch t {
	case Q8_0:
		ok = a.t == Q8_0
	case Q2_K, Q4_K, IQ2_XXS:
		ok = a.t == Q8_K
	case F32, F16, BF16:
		ok = a.t == F32 || a.t == F16 || a.t == BF16
	}
	if !ok {
		return fmt.Errorf("quant: no dot product of %s weights with a %s activation", t, a.t)
	}
	return nil
}

// Dot returns the dot product of one weight row of type t with the
// activation a, computed as ggml's CPU vec_dot does: exact integer sums per
// block, then float32 scaling and accumulation (the order of the float
// additions may differ from ggml's SIMD kernels by a few ulps). Float rows
// (F32, F16, BF16) are multiplied with a's float32 values directly, in the
// float-weight order (floatdot.go).
func Dot(t Type, row []byte, a *Activation) (float32, error) {
	if err := checkDot(t, len(row), a); err != nil {
		return 0, fmt.Errorf("dot: %w", err)
	}
	return dotUnchecked(t, row, a), nil
}

// MatVec computes out[r] = Dot(t, w[r], a) for the len(out) rows of the
// row-major weight matrix w, each row holding a.Len() values of type t. It
// runs on the calling goroutine; callers parallelise by splitting rows.
func MatVec(t Type, w []byte, a *Activation, out []float32) error {
	if a == nil {
		return fmt.Errorf("matvec: nil activation")
	}
	rb, err := t.RowBytes(int64(a.n))
	if err != nil {
		return fmt.Errorf("matvec: %w", err)
	}
	if int64(len(w)) != rb*int64(len(out)) {
		return fmt.Errorf("matvec: %d rows of %d %s values take %d bytes, got %d", len(out), a.n, t, rb*int64(len(out)), len(w))
	}
	if len(out) == 0 {
		return nil
	}
	if err := checkDot(t, int(rb), a); err != nil {
		return fmt.Errorf("matvec: %w", err)
	}
	for r := range out {
		out[r] = dotUnchecked(t, w[int64(r)*rb:int64(r+1)*rb], a)
	}
	return nil
}

func dotUnchecked(t Type, row []byte, a *Activation) float32 {
	switch t {
	case F32, F16, BF16:
		return DotFloatRow(t, row, a.f)
	case Q8_0:
		return dotQ8_0(row, a)
	case Q2_K:
		return dotQ2K(row, a)
	case Q4_K:
		return dotQ4K(row, a)
	case IQ2_XXS:
		return dotIQ2XXS(row, a)
	}
	return 0
}

// dotI8x32 is the exact integer dot product of 32 int8 weights (as bytes)
// with 32 int8 activations.
func dotI8x32(w *[32]byte, q *[32]int8) int32 {
	var s0, s1 int32
	for j := 0; j < 32; j += 8 {
		s0 += int32(int8(w[j]))*int32(q[j]) + int32(int8(w[j+1]))*int32(q[j+1]) +
			int32(int8(w[j+2]))*int32(q[j+2]) + int32(int8(w[j+3]))*int32(q[j+3])
		s1 += int32(int8(w[j+4]))*int32(q[j+4]) + int32(int8(w[j+5]))*int32(q[j+5]) +
			int32(int8(w[j+6]))*int32(q[j+6]) + int32(int8(w[j+7]))*int32(q[j+7])
	}
	return s0 + s1
}

// dotQ8_0 follows ggml_vec_dot_q8_0_q8_0: per block the exact int sum times
// (d_w * d_a), accumulated in float32.
func dotQ8_0(row []byte, a *Activation) float32 {
	var sum float32
	for b, da := range a.d {
		blk := (*[q8_0Bytes]byte)(row[q8_0Bytes*b:])
		dw := f16Table[uint16(blk[0])|uint16(blk[1])<<8]
		si := dotI8x32((*[32]byte)(blk[2:]), (*[32]int8)(a.q[32*b:]))
		sum += float32(si) * (dw * da)
	}
	return sum
}

// dotQ2K follows ggml_vec_dot_q2_K_q8_K: the 4-bit sub-block scales weight
// exact int sums of 2-bit quants times int8 activations; the 4-bit mins are
// applied through the activation's 16-value sums.
func dotQ2K(row []byte, a *Activation) float32 {
	var sum float32
	for b, da := range a.d {
		blk := (*[q2KBytes]byte)(row[q2KBytes*b:])
		q8 := (*[QK_K]int8)(a.q[QK_K*b:])
		bs := (*[16]int16)(a.bsums[16*b:])
		sc := (*[16]byte)(blk[q2KScales:])
		var summs int32
		for j, s := range bs {
			summs += int32(s) * int32(sc[j]>>4)
		}
		var isum int32
		for half := 0; half < 2; half++ {
			qs := (*[32]byte)(blk[q2KQs+32*half:])
			for plane := 0; plane < 4; plane++ {
				shift := uint(2 * plane)
				a8 := (*[32]int8)(q8[128*half+32*plane:])
				var s0, s1 int32
				for l := 0; l < 16; l += 2 {
					s0 += int32(a8[l])*int32((qs[l]>>shift)&3) + int32(a8[l+1])*int32((qs[l+1]>>shift)&3)
					s1 += int32(a8[16+l])*int32((qs[16+l]>>shift)&3) + int32(a8[17+l])*int32((qs[17+l]>>shift)&3)
				}
				isum += int32(sc[8*half+2*plane]&0xf)*s0 + int32(sc[8*half+2*plane+1]&0xf)*s1
			}
		}
		dall := da * f16Table[uint16(blk[q2KD])|uint16(blk[q2KD+1])<<8]
		dmin := da * f16Table[uint16(blk[q2KDmin])|uint16(blk[q2KDmin+1])<<8]
		sum += float32(dall*float32(isum)) - float32(dmin*float32(summs))
	}
	return sum
}

// dotQ4K follows ggml_vec_dot_q4_K_q8_K: 6-bit scales weight exact int sums
// of 4-bit quants times int8 activations; 6-bit mins use the 16-value sums.
func dotQ4K(row []byte, a *Activation) float32 {
	var sum float32
	for b, da := range a.d {
		blk := (*[q4KBytes]byte)(row[q4KBytes*b:])
		q8 := (*[QK_K]int8)(a.q[QK_K*b:])
		bs := (*[16]int16)(a.bsums[16*b:])
		scales := (*[12]byte)(blk[q4KScales:])
		var isum, summ int32
		for c := 0; c < 4; c++ {
			q := (*[32]byte)(blk[q4KQs+32*c:])
			lo := (*[32]int8)(q8[64*c:])
			hi := (*[32]int8)(q8[64*c+32:])
			var sl0, sl1, sh0, sh1 int32
			for l := 0; l < 32; l += 2 {
				b0, b1 := q[l], q[l+1]
				sl0 += int32(lo[l]) * int32(b0&0xf)
				sl1 += int32(lo[l+1]) * int32(b1&0xf)
				sh0 += int32(hi[l]) * int32(b0>>4)
				sh1 += int32(hi[l+1]) * int32(b1>>4)
			}
			sc1, m1 := q4KScaleMin(scales, 2*c)
			sc2, m2 := q4KScaleMin(scales, 2*c+1)
			isum += int32(sc1)*(sl0+sl1) + int32(sc2)*(sh0+sh1)
			summ += int32(m1)*(int32(bs[4*c])+int32(bs[4*c+1])) + int32(m2)*(int32(bs[4*c+2])+int32(bs[4*c+3]))
		}
		d := da * f16Table[uint16(blk[q4KD])|uint16(blk[q4KD+1])<<8]
		dmin := da * f16Table[uint16(blk[q4KDmin])|uint16(blk[q4KDmin+1])<<8]
		sum += float32(d*float32(isum)) - float32(dmin*float32(summ))
	}
	return sum
}

// dotIQ2XXS follows ggml_vec_dot_iq2_xxs_q8_K: per 32-value sub-block the
// exact sum of grid magnitude x sign x int8 activation, weighted by the odd
// integer 2*scale+1, then d_w*d_a, and a final factor 1/8.
func dotIQ2XXS(row []byte, a *Activation) float32 {
	var sum float32
	for b, da := range a.d {
		blk := (*[iq2xxsBytes]byte)(row[iq2xxsBytes*b:])
		q8 := (*[QK_K]int8)(a.q[QK_K*b:])
		var bsum int32
		for ib := 0; ib < 8; ib++ {
			sub := (*[8]byte)(blk[iq2xxsQs+8*ib:])
			aux := uint32(sub[4]) | uint32(sub[5])<<8 | uint32(sub[6])<<16 | uint32(sub[7])<<24
			var sumi int32
			for g := 0; g < 4; g++ {
				grid := &iq2GridBytes[sub[g]]
				signs := uint32(iq2SignTable[(aux>>(7*g))&127])
				a8 := (*[8]int8)(q8[32*ib+8*g:])
				// p*sign as (p ^ m) - m with m = 0 or -1
				m0, m1 := -int32(signs&1), -int32(signs>>1&1)
				m2, m3 := -int32(signs>>2&1), -int32(signs>>3&1)
				m4, m5 := -int32(signs>>4&1), -int32(signs>>5&1)
				m6, m7 := -int32(signs>>6&1), -int32(signs>>7&1)
				sumi += (int32(grid[0])*int32(a8[0]) ^ m0 - m0) + (int32(grid[1])*int32(a8[1]) ^ m1 - m1) +
					(int32(grid[2])*int32(a8[2]) ^ m2 - m2) + (int32(grid[3])*int32(a8[3]) ^ m3 - m3) +
					(int32(grid[4])*int32(a8[4]) ^ m4 - m4) + (int32(grid[5])*int32(a8[5]) ^ m5 - m5) +
					(int32(grid[6])*int32(a8[6]) ^ m6 - m6) + (int32(grid[7])*int32(a8[7]) ^ m7 - m7)
			}
			bsum += sumi * int32(2*(aux>>28)+1)
		}
		d := f16Table[uint16(blk[iq2xxsD])|uint16(blk[iq2xxsD+1])<<8] * da
		sum += d * float32(bsum)
	}
	return 0.125 * sum
}

// DotF32 returns the dot product of one row of type t with the float32
// vector x, dequantizing block by block without allocating. It is the
// reference for the quantized-activation dots (it has no activation
// rounding) and accumulates in float64.
func DotF32(t Type, row []byte, x []float32) (float32, error) {
	if err := checkRow(t, len(row), len(x)); err != nil {
		return 0, fmt.Errorf("dot f32: %w", err)
	}
	var buf [QK_K]float32
	bs, bb := t.BlockSize(), t.BlockBytes()
	if bs == 1 {
		bs, bb = QK_K, QK_K*bb
	}
	var sum float64
	for i := 0; i < len(x); i += bs {
		n := min(bs, len(x)-i)
		nb := n / t.BlockSize() * t.BlockBytes()
		blk := row[i/bs*bb:][:nb]
		if err := Dequantize(t, blk, buf[:n]); err != nil {
			return 0, fmt.Errorf("dot f32: %w", err)
		}
		for j, v := range buf[:n] {
			sum += float64(v) * float64(x[i+j])
		}
	}
	return float32(sum), nil
}
