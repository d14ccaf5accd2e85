package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// pairTree sums v as a complete binary tree of adjacent pairs.
func pairTree(v []float32) float32 {
	if len(v) == 1 {
		return v[0]
	}
	h := len(v) / 2
	return pairTree(v[:h]) + pairTree(v[h:])
}

// floatOrderRef is the float-weight order written from its definition:
// product i joins sum (i/FloatRun) mod FloatSums, then the pair tree.
func floatOrderRef(w, x []float32) float32 {
	s := make([]float32, FloatSums)
	for i := range w {
		j := (i / FloatRun) % FloatSums
		s[j] = s[j] + float32(w[i]*x[i])
	}
	return pairTree(s)
}

// TestFloatDotOrder: every float-weight dot (F32, F16, BF16, through Dot,
// DotFloatRow and DotFloat32) is bit-identical to the order's
// definition, for lengths that are and are not multiples of the run and of
// a whole period of sums, and close to the float64 value.
func TestFloatDotOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 7, 8, 100, 256, 2048, 2056, 4096, 5000, 16384} {
		x := randRow(r, n, 0)
		w := randRow(r, n, 1)
		for _, ty := range []Type{F32, F16, BF16} {
			row := make([]byte, n*ty.BlockBytes())
			wq := make([]float32, n)
			for i, v := range w {
				switch ty {
				case F32:
					binary.LittleEndian.PutUint32(row[4*i:], math.Float32bits(v))
				case F16:
					binary.LittleEndian.PutUint16(row[2*i:], F32ToF16(v))
				case BF16:
					binary.LittleEndian.PutUint16(row[2*i:], F32ToBF16(v))
				}
			}
			if err := Dequantize(ty, row, wq); err != nil {
				t.Fatal(err)
			}
			want := floatOrderRef(wq, x)
			a, err := NewActivation(F32, n)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Set(x); err != nil {
				t.Fatal(err)
			}
			got, err := Dot(ty, row, a)
			if err != nil {
				t.Fatal(err)
			}
			if math.Float32bits(got) != math.Float32bits(want) {
				t.Errorf("%s n=%d: Dot %v, definition %v", ty, n, got, want)
			}
			if g := DotFloat32(wq, x); math.Float32bits(g) != math.Float32bits(want) {
				t.Errorf("%s n=%d: DotFloat32 %v, definition %v", ty, n, g, want)
			}
			if g := DotFloatRow(ty, row, x); math.Float32bits(g) != math.Float32bits(want) {
				t.Errorf("%s n=%d: DotFloatRow %v, definition %v", ty, n, g, want)
			}
			var ref, mag float64
			for i := range x {
				ref += float64(wq[i]) * float64(x[i])
				mag += math.Abs(float64(wq[i]) * float64(x[i]))
			}
			if d := math.Abs(float64(want) - ref); d > 1e-5*mag+1e-30 {
				t.Errorf("%s n=%d: %v vs float64 %v (|terms| %v)", ty, n, want, ref, mag)
			}
		}
	}
}
