package quant

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

var allSupported = []Type{F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS, Q8_K}

func randRow(r *rand.Rand, n int, kind int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch kind {
		case 0:
			x[i] = float32(r.NormFloat64())
		case 1:
			x[i] = float32(r.NormFloat64() * 0.02)
		case 2:
			x[i] = float32(r.NormFloat64())
			if r.IntN(100) == 0 {
				x[i] *= 20
			}
		case 3:
			if r.IntN(10) == 0 {
				x[i] = float32(r.NormFloat64())
			}
		default:
			x[i] = float32(r.Float64()*2000 - 1000)
		}
	}
	return x
}

// TestF16Exhaustive checks the f16 decoding table against the bit-level
// decoder and that every finite half survives a float32 round trip.
func TestF16Exhaustive(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		if math.Float32bits(f) != math.Float32bits(f16ToF32Slow(uint16(h))) {
			t.Fatalf("table mismatch at %04x", h)
		}
		if f != f {
			if got := F32ToF16(f); got&0x7fff != 0x7e00 || got&0x8000 != uint16(h)&0x8000 {
				t.Fatalf("NaN %04x -> %04x", h, got)
			}
			continue
		}
		if got := F32ToF16(f); got != uint16(h) {
			t.Fatalf("round trip %04x -> %g -> %04x", h, f, got)
		}
	}
}

// TestF32ToF16Rounding checks round-to-nearest-even against a float64
// computation of the two neighbouring halves.
func TestF32ToF16Rounding(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(f float32) {
		h := F32ToF16(f)
		got := float64(F16ToF32(h))
		v := float64(f)
		if math.IsInf(got, 0) {
			if math.Abs(v) < 65520 {
				t.Fatalf("%g -> inf", f)
			}
			return
		}
		err := math.Abs(got - v)
		// neighbours of h toward zero and away from zero
		for _, nb := range []uint16{h - 1, h + 1} {
			if nb&0x7fff >= 0x7c00 || (h&0x7fff == 0 && nb == h-1) {
				continue
			}
			alt := float64(F16ToF32(nb))
			e := math.Abs(alt - v)
			if e < err || (e == err && h&1 == 1) {
				t.Fatalf("%g (%08x) -> %04x (%g), but %04x (%g) is nearer or even", f, math.Float32bits(f), h, got, nb, alt)
			}
		}
	}
	for i := 0; i < 200000; i++ {
		// random bit patterns across the half range, including subnormals
		// and exact ties
		e := 100 + r.IntN(45)
		m := r.Uint32() & 0x7fffff
		if i%4 == 0 {
			m &^= 0xfff
			m |= 0x1000 // a tie for normals
		}
		f := math.Float32frombits(uint32(e)<<23 | m | uint32(r.IntN(2))<<31)
		check(f)
	}
	for _, f := range []float32{0, 65504, 65519.99, 6.1035156e-05, 5.9604645e-08, 2.9802322e-08, 2.98023259e-08} {
		check(f)
		check(-f)
	}
}

func TestBF16(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80},
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up
		{0x3f808001, 0x3f81},
		{0x7f800000, 0x7f80},
		{0x7f800001, 0x7fc0}, // signalling NaN made quiet
		{0xff812345, 0xffc1},
		{0x7f7fffff, 0x7f80}, // overflows to inf
	}
	for _, c := range cases {
		if got := F32ToBF16(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("F32ToBF16(%08x) = %04x, want %04x", c.in, got, c.want)
		}
	}
	for h := 0; h < 1<<16; h++ {
		f := BF16ToF32(uint16(h))
		if f != f {
			continue
		}
		if got := F32ToBF16(f); got != uint16(h) {
			t.Fatalf("bf16 round trip %04x -> %04x", h, got)
		}
	}
}

func TestNearestInt(t *testing.T) {
	for _, f := range []float32{0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.49, 127.5, -127.5, 3.7, -3.7, 4194303} {
		want := int32(math.RoundToEven(float64(f)))
		if got := nearestInt(f); got != want {
			t.Errorf("nearestInt(%g) = %d, want %d", f, got, want)
		}
	}
}

// TestQuantizeRoundTrip checks that re-quantizing dequantized values gives
// blocks with the same dequantized values (F16, BF16, Q8_0, IQ2_XXS), or
// close ones (Q2_K, Q4_K).
func TestQuantizeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 1024
	for _, ty := range []Type{F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS} {
		for kind := 0; kind < 5; kind++ {
			x := randRow(r, n, kind)
			rb, _ := ty.RowBytes(n)
			q := make([]byte, rb)
			if err := Quantize(ty, x, q); err != nil {
				t.Fatal(err)
			}
			y := make([]float32, n)
			if err := Dequantize(ty, q, y); err != nil {
				t.Fatal(err)
			}
			q2 := make([]byte, rb)
			if err := Quantize(ty, y, q2); err != nil {
				t.Fatal(err)
			}
			y2 := make([]float32, n)
			if err := Dequantize(ty, q2, y2); err != nil {
				t.Fatal(err)
			}
			if ty == Q2_K || ty == Q4_K {
				// ggml's K-quant search is not idempotent: re-quantizing
				// may pick other blocks, but must stay close.
				if e0, e1 := rmse(x, y), rmse(y, y2); e1 > 0.5*e0 {
					t.Errorf("%s kind %d: re-quantization moves values by rmse %g, first quantization %g", ty, kind, e1, e0)
				}
				continue
			}
			bad := 0
			for i := range y {
				if math.Float32bits(y[i]) != math.Float32bits(y2[i]) {
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("%s kind %d: %d of %d values change on re-quantization (rmse %g)", ty, kind, bad, n, rmse(y, y2))
			}
		}
	}
}

// TestIQ2XXSRoundTripArbitrary re-quantizes the dequantization of
// arbitrary blocks (random codebook points, signs and scales).
func TestIQ2XXSRoundTripArbitrary(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for it := 0; it < 200; it++ {
		blk := make([]byte, iq2xxsBytes)
		for i := range blk {
			blk[i] = byte(r.Uint32())
		}
		// a positive normal f16 scale
		d := F32ToF16(float32(math.Ldexp(1+r.Float64(), r.IntN(20)-14)))
		blk[0], blk[1] = byte(d), byte(d>>8)
		y := make([]float32, QK_K)
		if err := Dequantize(IQ2_XXS, blk, y); err != nil {
			t.Fatal(err)
		}
		q := make([]byte, iq2xxsBytes)
		if err := Quantize(IQ2_XXS, y, q); err != nil {
			t.Fatal(err)
		}
		y2 := make([]float32, QK_K)
		if err := Dequantize(IQ2_XXS, q, y2); err != nil {
			t.Fatal(err)
		}
		for i := range y {
			if y[i] != y2[i] {
				t.Fatalf("block %d: value %d %g re-quantizes to %g", it, i, y[i], y2[i])
			}
		}
	}
}

// TestQuantizeErrorRandom bounds the relative RMSE of each format on
// Gaussian data (loose bounds from the formats' bit widths).
func TestQuantizeErrorRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	limits := map[Type]float64{F32: 0, F16: 1e-3, BF16: 4e-3, Q8_0: 0.01, Q8_K: 0.01, Q4_K: 0.12, Q2_K: 0.45, IQ2_XXS: 0.55}
	for _, ty := range allSupported {
		x := randRow(r, 4096, 0)
		rb, _ := ty.RowBytes(4096)
		q := make([]byte, rb)
		if err := Quantize(ty, x, q); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, len(x))
		if err := Dequantize(ty, q, y); err != nil {
			t.Fatal(err)
		}
		var s2 float64
		for _, v := range x {
			s2 += float64(v) * float64(v)
		}
		rel := rmse(x, y) / math.Sqrt(s2/float64(len(x)))
		t.Logf("%s: relative RMSE %.4f", ty, rel)
		if rel > limits[ty] {
			t.Errorf("%s: relative RMSE %.4f above %.4f", ty, rel, limits[ty])
		}
	}
}

// TestDotAgainstDequantized checks every dot product against the float64 dot
// of the dequantized operands, and MatVec and DotF32 against Dot.
func TestDotAgainstDequantized(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const n, rows = 1024, 3
	for _, ty := range []Type{F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS} {
		at, err := ActivationType(ty)
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := ty.RowBytes(n)
		w := make([]byte, rb*rows)
		wf := make([]float32, n*rows)
		for i := 0; i < rows; i++ {
			x := randRow(r, n, i%5)
			if err := Quantize(ty, x, w[rb*int64(i):rb*int64(i+1)]); err != nil {
				t.Fatal(err)
			}
		}
		if err := Dequantize(ty, w, wf); err != nil {
			t.Fatal(err)
		}
		x := randRow(r, n, 0)
		a, err := NewActivation(at, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Set(x); err != nil {
			t.Fatal(err)
		}
		ab := a.AppendBytes(nil)
		ad := make([]float32, n)
		if err := Dequantize(at, ab, ad); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, rows)
		if err := MatVec(ty, w, a, out); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < rows; i++ {
			row := w[rb*int64(i) : rb*int64(i+1)]
			got, err := Dot(ty, row, a)
			if err != nil {
				t.Fatal(err)
			}
			if got != out[i] {
				t.Errorf("%s row %d: MatVec %g, Dot %g", ty, i, out[i], got)
			}
			wr := wf[n*i : n*(i+1)]
			var mag float64
			for j := range wr {
				mag += math.Abs(float64(wr[j]) * float64(ad[j]))
			}
			if ref := exactDot(wr, ad); math.Abs(float64(got)-ref) > 16*mag*0x1p-24 {
				t.Errorf("%s row %d: Dot %g, exact %g", ty, i, got, ref)
			}
			// DotF32 uses the unquantized activation.
			f, err := DotF32(ty, row, x)
			if err != nil {
				t.Fatal(err)
			}
			if ref := exactDot(wr, x); math.Abs(float64(f)-ref) > 1e-6*(1+math.Abs(ref)) {
				t.Errorf("%s row %d: DotF32 %g, exact %g", ty, i, f, ref)
			}
		}
	}
}

func TestActivationBytesRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, at := range []Type{F32, F16, BF16, Q8_0, Q8_K} {
		a, err := NewActivation(at, 512)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Set(randRow(r, 512, 2)); err != nil {
			t.Fatal(err)
		}
		b := a.AppendBytes(nil)
		if rb, _ := at.RowBytes(512); int64(len(b)) != rb {
			t.Fatalf("%s: %d bytes, want %d", at, len(b), rb)
		}
		a2, _ := NewActivation(at, 512)
		if err := a2.SetBytes(b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a2.AppendBytes(nil), b) {
			t.Errorf("%s: bytes change through SetBytes", at)
		}
		if a2.Type() != at || a2.Len() != 512 {
			t.Errorf("%s: Type/Len = %s/%d", at, a2.Type(), a2.Len())
		}
	}
}

func TestZeroAndSpecialInputs(t *testing.T) {
	for _, ty := range allSupported {
		x := make([]float32, 256)
		rb, _ := ty.RowBytes(256)
		q := make([]byte, rb)
		if err := Quantize(ty, x, q); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, 256)
		if err := Dequantize(ty, q, y); err != nil {
			t.Fatal(err)
		}
		for i, v := range y {
			if v != 0 {
				t.Fatalf("%s: zero row dequantizes to %g at %d", ty, v, i)
			}
		}
		// NaN and Inf must not panic.
		x[3] = float32(math.NaN())
		x[7] = float32(math.Inf(1))
		x[9] = float32(math.Inf(-1))
		if err := Quantize(ty, x, q); err != nil {
			t.Fatal(err)
		}
		if err := Dequantize(ty, q, y); err != nil {
			t.Fatal(err)
		}
	}
}

func TestErrors(t *testing.T) {
	mustFail := func(name string, err error, substr string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", name)
		} else if !strings.Contains(err.Error(), substr) {
			t.Errorf("%s: error %q lacks %q", name, err, substr)
		}
	}
	f := make([]float32, 256)
	mustFail("unknown type", Dequantize(Type(99), nil, f), "unknown")
	mustFail("unsupported type", Dequantize(Q6_K, make([]byte, 210), f), "not supported")
	mustFail("short buffer", Dequantize(Q4_K, make([]byte, 143), f), "144 bytes")
	mustFail("long buffer", Dequantize(Q8_0, make([]byte, 8*34+1), f), "bytes")
	mustFail("partial block", Dequantize(Q2_K, make([]byte, 84), f[:100]), "multiple")
	mustFail("quantize short", Quantize(IQ2_XXS, f, make([]byte, 65)), "66 bytes")
	mustFail("quantize partial", Quantize(Q8_0, f[:31], make([]byte, 34)), "multiple")

	_, err := NewActivation(Q4_K, 256)
	mustFail("activation type", err, "not an activation format")
	_, err = NewActivation(Q8_K, 100)
	mustFail("activation length", err, "multiple")
	_, err = NewActivation(F32, 0)
	mustFail("activation zero", err, "out of range")
	_, err = NewActivation(F32, MaxActivationLen+1)
	mustFail("activation huge", err, "out of range")
	_, err = ActivationType(Q6_K)
	mustFail("activation for Q6_K", err, "no dot product")

	a, _ := NewActivation(Q8_0, 256)
	mustFail("set length", a.Set(f[:32]), "set from 32")
	mustFail("set bytes", a.SetBytes(make([]byte, 10)), "bytes")
	_, err = Dot(Q8_0, make([]byte, 8*34), nil)
	mustFail("nil activation", err, "nil")
	_, err = Dot(Q4_K, make([]byte, 144), a)
	mustFail("mismatched activation", err, "no dot product")
	_, err = Dot(Q8_0, make([]byte, 7*34), a)
	mustFail("short row", err, "bytes")
	mustFail("matvec size", MatVec(Q8_0, make([]byte, 8*34*2+1), a, make([]float32, 2)), "bytes")
	mustFail("matvec nil", MatVec(Q8_0, nil, nil, nil), "nil")
	_, err = DotF32(Q2_K, make([]byte, 84), f[:255])
	mustFail("dotf32 length", err, "multiple")
	if err := MatVec(Q8_0, nil, a, nil); err != nil {
		t.Errorf("empty matvec: %v", err)
	}
}
