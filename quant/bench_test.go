package quant

import (
	"math/rand/v2"
	"testing"
)

const (
	benchCols = 4096
	benchRows = 64
)

// benchMatrix returns benchRows rows of benchCols Gaussian values quantized
// as t.
func benchMatrix(b *testing.B, t Type) []byte {
	b.Helper()
	r := rand.New(rand.NewPCG(1, 1))
	rb, err := t.RowBytes(benchCols)
	if err != nil {
		b.Fatal(err)
	}
	w := make([]byte, rb*benchRows)
	for i := 0; i < benchRows; i++ {
		if err := Quantize(t, randRow(r, benchCols, 0), w[rb*int64(i):rb*int64(i+1)]); err != nil {
			b.Fatal(err)
		}
	}
	return w
}

var benchTypes = []Type{F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS}

// BenchmarkDequantize reports throughput in weight bytes per second.
func BenchmarkDequantize(b *testing.B) {
	for _, t := range benchTypes {
		b.Run(t.String(), func(b *testing.B) {
			w := benchMatrix(b, t)
			out := make([]float32, benchCols*benchRows)
			b.SetBytes(int64(len(w)))
			b.ResetTimer()
			for b.Loop() {
				if err := Dequantize(t, w, out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(out))*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
		})
	}
}

// BenchmarkMatVec reports the throughput of a single-goroutine
// matrix-vector product (64 rows x 4096) in weight bytes per second,
// excluding activation quantization.
func BenchmarkMatVec(b *testing.B) {
	for _, t := range benchTypes {
		b.Run(t.String(), func(b *testing.B) {
			w := benchMatrix(b, t)
			at, err := ActivationType(t)
			if err != nil {
				b.Fatal(err)
			}
			a, err := NewActivation(at, benchCols)
			if err != nil {
				b.Fatal(err)
			}
			if err := a.Set(randRow(rand.New(rand.NewPCG(2, 2)), benchCols, 0)); err != nil {
				b.Fatal(err)
			}
			out := make([]float32, benchRows)
			b.SetBytes(int64(len(w)))
			b.ResetTimer()
			for b.Loop() {
				if err := MatVec(t, w, a, out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(benchCols*benchRows)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
		})
	}
}

// BenchmarkDotF32 measures the dequantize-on-the-fly reference dot.
func BenchmarkDotF32(b *testing.B) {
	for _, t := range benchTypes {
		b.Run(t.String(), func(b *testing.B) {
			w := benchMatrix(b, t)
			rb, _ := t.RowBytes(benchCols)
			x := randRow(rand.New(rand.NewPCG(2, 2)), benchCols, 0)
			b.SetBytes(rb)
			b.ResetTimer()
			for b.Loop() {
				if _, err := DotF32(t, w[:rb], x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkQuantize reports the time to quantize one 4096-value row; the
// throughput is in input (float32) bytes per second.
func BenchmarkQuantize(b *testing.B) {
	for _, t := range append(benchTypes, Q8_K) {
		b.Run(t.String(), func(b *testing.B) {
			x := randRow(rand.New(rand.NewPCG(3, 3)), benchCols, 0)
			rb, _ := t.RowBytes(benchCols)
			dst := make([]byte, rb)
			if err := Quantize(t, x, dst); err != nil { // warm the IQ2 tables
				b.Fatal(err)
			}
			b.SetBytes(4 * benchCols)
			b.ResetTimer()
			for b.Loop() {
				if err := Quantize(t, x, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkActivationSet measures activation quantization of 4096 values.
func BenchmarkActivationSet(b *testing.B) {
	for _, t := range []Type{F32, F16, Q8_0, Q8_K} {
		b.Run(t.String(), func(b *testing.B) {
			x := randRow(rand.New(rand.NewPCG(4, 4)), benchCols, 0)
			a, err := NewActivation(t, benchCols)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(4 * benchCols)
			for b.Loop() {
				if err := a.Set(x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
