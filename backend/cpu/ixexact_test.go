package cpu

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"ds4go/quant"
)

// ixSpan mirrors what the CUDA kernel k_index_flash_exact (cuda/model.cu
// ifx_span, DS4C_OPT_IX_EXACT) learns of a row: its largest nonzero
// exponent field less its smallest (one below for a power of two; 0 for a
// row of zeros), or ixBad where a value has more mantissa bits than
// e2m1's one or lies where f16 does not hold such values.
func ixSpan(x []float32) int {
	umax, kmin, mant := uint32(0), uint32(math.MaxUint32), uint32(0)
	for _, v := range x {
		b := math.Float32bits(v)
		m := b & 0x7fffffff
		umax = max(umax, m)
		kmin = min(kmin, m-1)
		mant |= b
	}
	if umax == 0 {
		return 0
	}
	emax, emin := int(umax>>23), int(kmin>>23)
	if mant&(1<<22-1) != 0 || emin < 127-23 || emax > 127+15 {
		return ixBad
	}
	return emax - emin
}

// ixBad and ixLim mirror the kernel's IFX_BAD and IFX_LIM (dots of 128).
const ixBad, ixLim = 64, 13

// TestIXSpanExactSound checks the reasoning behind exact mode's
// tensor-core indexer (k_index_flash_exact) on the CPU: for FP4-simulated
// rows (as the indexer's queries and compressed rows are) whose spans add
// to at most ixLim, f16 holds every value, and dotF32 — the CPU's and exact
// mode's order — gives the exact sum of the products, as does a running sum
// in any order (here forward and backward one product at a time, and in
// groups of 16 as the tensor cores' k-steps), so the kernel's sums are
// dotF32's bits. Block scales are spread by up to spread binary places; it
// also reports how many pairs pass (after the Hadamard transform the
// model's blocks are alike: spread 0 is its case, where all must pass), and
// requires that pairs that fail exist at wide spreads whose dotF32 differs
// from the exact sum, so the check is not vacuous.
func TestIXSpanExactSound(t *testing.T) {
	const D, trials = 128, 3000
	rng := rand.New(rand.NewPCG(1, 2))
	row := func(spread int) []float32 {
		x := make([]float32, D)
		for b := 0; b < D; b += fp4Block {
			s := math.Ldexp(1, rng.IntN(2*spread+1)-spread)
			for i := b; i < b+fp4Block; i++ {
				x[i] = float32(rng.NormFloat64() * s)
			}
		}
		hadamardIf := spread == 0
		if hadamardIf {
			hadamard(x)
		}
		fp4Simulate(x)
		return x
	}
	exact := func(a, b []float32) float32 {
		s := new(big.Float).SetPrec(2000)
		for i := range a {
			p := new(big.Float).SetPrec(2000).SetFloat64(float64(a[i]))
			p.Mul(p, new(big.Float).SetFloat64(float64(b[i])))
			s.Add(s, p)
		}
		f, _ := s.Float32()
		return f
	}
	// sum: a running sum in float32, each step adding g products' exact
	// sum (float64 holds a product of two FP4 values exactly, and here the
	// sums of 16 too) rounded once
	sum := func(a, b []float32, g int, backward bool) float32 {
		var c float32
		for k := 0; k < len(a); k += g {
			var p float64
			for i := k; i < k+g; i++ {
				j := i
				if backward {
					j = len(a) - 1 - i
				}
				p += float64(a[j]) * float64(b[j])
			}
			c = float32(p + float64(c))
		}
		return c
	}
	inexactSeen := false
	for _, spread := range []int{0, 2, 4, 6, 12} {
		pass := 0
		for range trials {
			a, b := row(spread), row(spread)
			sa, sb := ixSpan(a), ixSpan(b)
			if sa == ixBad || sb == ixBad {
				t.Fatalf("spread %d: an FP4-simulated row fails the mantissa or f16 check", spread)
			}
			want := exact(a, b)
			got := dotF32(a, b)
			if sa+sb > ixLim {
				if math.Float32bits(got) != math.Float32bits(want) {
					inexactSeen = true
				}
				continue
			}
			pass++
			if math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("spread %d: a pair passes the check but dotF32 %v differs from the exact sum %v", spread, got, want)
			}
			for _, v := range append(append([]float32{}, a...), b...) {
				if quant.RoundF16(v) != v {
					t.Fatalf("spread %d: a pair passes the check but f16 does not hold %v", spread, v)
				}
			}
			for _, g := range []int{1, 16} {
				for _, bw := range []bool{false, true} {
					if f := sum(a, b, g, bw); math.Float32bits(f) != math.Float32bits(want) {
						t.Fatalf("spread %d: a pair passes the check but a sum in groups of %d (backward %v) %v differs from %v", spread, g, bw, f, want)
					}
				}
			}
		}
		t.Logf("block scales spread by up to %d binary places: %d of %d pairs pass", spread, pass, trials)
		if spread == 0 && pass != trials {
			t.Errorf("the model's case (Hadamard, then FP4): %d of %d pairs pass, want all", pass, trials)
		}
	}
	if !inexactSeen {
		t.Error("no failing pair's dotF32 differed from the exact sum: the check was never needed here")
	}
	// the GPU test's edge rows (backend/cuda ixEdgeRows): 6 but for one
	// 1.5·2^e; a query's e = -4 and a row's e = -5 sit at the limit, and
	// where the odd values meet the exact dot needs all 24 of float's bits
	edge := func(x, e int) []float32 {
		r := make([]float32, D)
		for i := range r {
			r[i] = 6
		}
		r[16*(x%8)+5*(x%8)%16] = float32(math.Ldexp(1.5, e))
		return r
	}
	for x := 0; x < 8; x++ {
		a, b := edge(x, -4), edge(x, -5)
		if sa, sb := ixSpan(a), ixSpan(b); sa+sb != ixLim {
			t.Fatalf("edge rows %d: spans %d + %d, want the limit %d", x, sa, sb, ixLim)
		}
		want := exact(a, b)
		if v := float64(want) * 0x1p11; v != math.Trunc(v) || math.Mod(v, 2) != 1 || v < 0x1p23 || v >= 0x1p24 {
			t.Fatalf("edge rows %d: the exact dot %v does not need exactly 24 bits", x, want)
		}
		if got := dotF32(a, b); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("edge rows %d: dotF32 %v, want the exact %v", x, got, want)
		}
		if f := sum(a, b, 16, true); math.Float32bits(f) != math.Float32bits(want) {
			t.Fatalf("edge rows %d: a sum in groups of 16 %v, want %v", x, f, want)
		}
	}
	// gaussian values fail on their mantissas, FP4 values past f16's range
	// or below its least bit on the range check
	g := make([]float32, D)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	if ixSpan(g) != ixBad {
		t.Error("gaussian values pass the mantissa check")
	}
	for _, v := range []float32{0x1.8p15, 0x1p16, 0x1.8p-23, 0x1p-24} {
		x := make([]float32, D)
		x[0], x[1] = 1, v
		if got, want := ixSpan(x) != ixBad, quant.RoundF16(v) == v && v >= 0x1p-23; got != want {
			t.Errorf("a row holding 1 and %v passes the range check: %v, want %v", v, got, want)
		}
	}
}
