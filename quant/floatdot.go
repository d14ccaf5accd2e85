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

// DotFloat32 returns the dot product of the float32 weights w with x
// (len(x) ≥ len(w)) in the float-weight order.
func DotFloat32(w, x []float32) float32 {
	x = x[:len(w)]
	var s floatSums
	for i0 := 0; i0 < len(w); i0 += FloatRun {
		j := (i0 / FloatRun) % FloatSums
		acc := s[j]
		end := min(i0+FloatRun, len(w))
		for i := i0; i < end; i++ {
			acc += float32(w[i] * x[i])
		}
		s[j] = acc
	}
	return s.total()
}

// DotF16 returns the dot product of a row of little-endian F16 weights with
// x (len(x) ≥ len(row)/2) in the float-weight order.
func DotF16(row []byte, x []float32) float32 {
	n := len(row) / 2
	x = x[:n]
	tab := f16Table
	var s floatSums
	i0 := 0
	for ; i0+FloatRun <= n; i0 += FloatRun {
		b, v := (*[2 * FloatRun]byte)(row[2*i0:]), (*[FloatRun]float32)(x[i0:])
		j := (i0 / FloatRun) % FloatSums
		acc := s[j]
		for e := 0; e < FloatRun; e++ {
			acc += float32(tab[uint16(b[2*e])|uint16(b[2*e+1])<<8] * v[e])
		}
		s[j] = acc
	}
	if i0 < n {
		j := (i0 / FloatRun) % FloatSums
		for i := i0; i < n; i++ {
			s[j] += float32(tab[binary.LittleEndian.Uint16(row[2*i:])] * x[i])
		}
	}
	return s.total()
}

// DotBF16 returns the dot product of a row of little-endian BF16 weights
// with x (len(x) ≥ len(row)/2) in the float-weight order.
func DotBF16(row []byte, x []float32) float32 {
	n := len(row) / 2
	x = x[:n]
	var s floatSums
	for i0 := 0; i0 < n; i0 += FloatRun {
		j := (i0 / FloatRun) % FloatSums
		acc := s[j]
		end := min(i0+FloatRun, n)
		for i := i0; i < end; i++ {
			acc += float32(BF16ToF32(binary.LittleEndian.Uint16(row[2*i:])) * x[i])
		}
		s[j] = acc
	}
	return s.total()
}

// dotF32Bytes is DotFloat32 for a row of little-endian F32 bytes.
func dotF32Bytes(row []byte, x []float32) float32 {
	n := len(row) / 4
	x = x[:n]
	var s floatSums
	for i0 := 0; i0 < n; i0 += FloatRun {
		j := (i0 / FloatRun) % FloatSums
		acc := s[j]
		end := min(i0+FloatRun, n)
		for i := i0; i < end; i++ {
			acc += float32(math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:])) * x[i])
		}
		s[j] = acc
	}
	return s.total()
}
