package quant

import (
	"encoding/binary"
	"math"
)

// Float-weight dot products (F32, F16, BF16 rows with float32 inputs) add
// their terms in one fixed order, shared by every backend so that their
// results are bit-identical:
//
//   - element i's product w[i]·x[i] is rounded to float32 (never fused with
//     the addition) and added to running sum (i/FloatRun) mod FloatSums, the
//     sums starting at +0 and taking their elements in ascending i;
//   - the FloatSums sums are then combined as a complete binary tree of
//     adjacent pairs: ((s0+s1)+(s2+s3)) + … in index order.
//
// The order is chosen for parallel hardware: a GPU gives each running sum
// to one thread, whose 8 consecutive elements are one 16-byte load of F16
// weights, and the tree is a warp's xor-shuffle reduction followed by one
// across the 8 warps of a 256-thread block. A product of k columns is a
// serial chain of only k/FloatSums additions, where a few running sums
// would make it one of k/4.
const (
	// FloatSums is the number of running sums of a float-weight dot product.
	FloatSums = 256
	// FloatRun is the number of consecutive elements a running sum takes
	// before the next sum takes over.
	FloatRun = 8
)

// floatSums is the running state of one float-weight dot product.
type floatSums [FloatSums]float32

// total combines the running sums in the tree order.
func (s *floatSums) total() float32 {
	for w := 1; w < FloatSums; w *= 2 {
		for j := 0; j < FloatSums; j += 2 * w {
			s[j] += s[j+w]
		}
	}
	return s[0]
}

// add32 adds the products of the 32 elements i0 … i0+31 (i0 a multiple of
// 32) to their four running sums j … j+3 (j = i0/8 mod FloatSums), the four
// chains interleaved so that their additions overlap.
func (s *floatSums) add32(j int, w, x *[32]float32) {
	a0, a1, a2, a3 := s[j], s[j+1], s[j+2], s[j+3]
	for e := 0; e < FloatRun; e++ {
		a0 += float32(w[e] * x[e])
		a1 += float32(w[8+e] * x[8+e])
		a2 += float32(w[16+e] * x[16+e])
		a3 += float32(w[24+e] * x[24+e])
	}
	s[j], s[j+1], s[j+2], s[j+3] = a0, a1, a2, a3
}

// tail adds the products of elements i0, i0+1, … (w and x start there) one
// by one to their running sums.
func (s *floatSums) tail(i0 int, w, x []float32) {
	for i := range w {
		j := ((i0 + i) / FloatRun) % FloatSums
		s[j] += float32(w[i] * x[i])
	}
}

// DotFloat32 returns the dot product of the float32 weights w with x
// (len(x) ≥ len(w)) in the float-weight order.
func DotFloat32(w, x []float32) float32 {
	n := len(w)
	x = x[:n]
	var s floatSums
	i0 := 0
	for ; i0+32 <= n; i0 += 32 {
		s.add32((i0/FloatRun)%FloatSums, (*[32]float32)(w[i0:]), (*[32]float32)(x[i0:]))
	}
	s.tail(i0, w[i0:], x[i0:])
	return s.total()
}

// DotFloatRow returns the dot product of one row of little-endian F32, F16
// or BF16 weights (t) with x (len(x) ≥ the row's values) in the
// float-weight order: whole groups of 32 weights decoded in place (one loop
// per type, so that the decoding stays inside it), the rest by Dequantize.
func DotFloatRow(t Type, row []byte, x []float32) float32 {
	es := t.BlockBytes() // bytes per value: float types have blocks of one
	n := len(row) / es
	x = x[:n]
	full := n &^ 31
	var s floatSums
	var buf [32]float32
	group := func(i0 int) { s.add32((i0/FloatRun)%FloatSums, &buf, (*[32]float32)(x[i0:])) }
	switch t {
	case F16:
		tab := f16Table
		for i0 := 0; i0 < full; i0 += 32 {
			h := (*[64]byte)(row[2*i0:])
			for e := range buf {
				buf[e] = tab[uint16(h[2*e])|uint16(h[2*e+1])<<8]
			}
			group(i0)
		}
	case BF16:
		for i0 := 0; i0 < full; i0 += 32 {
			h := (*[64]byte)(row[2*i0:])
			for e := range buf {
				buf[e] = math.Float32frombits(uint32(h[2*e])<<16 | uint32(h[2*e+1])<<24)
			}
			group(i0)
		}
	case F32:
		for i0 := 0; i0 < full; i0 += 32 {
			w := (*[128]byte)(row[4*i0:])
			for e := range buf {
				buf[e] = math.Float32frombits(binary.LittleEndian.Uint32(w[4*e:]))
			}
			group(i0)
		}
	}
	if full < n {
		_ = Dequantize(t, row[full*es:], buf[:n-full])
		s.tail(full, buf[:n-full], x[full:])
	}
	return s.total()
}
