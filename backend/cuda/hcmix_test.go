package cuda

import (
	"math"
	"testing"

	"ds4go/quant"
)

// TestHCMixes checks HCMixes against a float64 reference of
// (fn_r · h_t) · rsqrt(mean(h_t²) + eps), for F32 and F16 mixers of Flash's
// shape (24 rows of 16384) and the head's (4 rows), token counts that leave
// a partial tile of 16, and streams of very different magnitudes. The
// products are three TF32 terms (the missing lo·lo term is below 2^-22 of
// each product) summed in float32: every logit within 2e-6 of Σ|w·h|·r; a
// wrong fragment, K range, row or token breaks that by orders of magnitude.
// Chunks of up to 1024 tokens run k_hc_mix_tf32_cl (K split over a
// cluster's 8 CTAs), larger ones and OptHCMix 2 k_hc_mix_tf32: each case
// runs both ways, and one chunk of 1100 tokens the second way by size.
func TestHCMixes(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptHCMix, 1) })
	const K, eps = 16384, 1e-6
	cases := []struct {
		typ  quant.Type
		m, n int
		opt  int
	}{
		{quant.F16, 24, 37, 1}, {quant.F32, 24, 16, 1}, {quant.F16, 4, 21, 1}, {quant.F32, 30, 9, 1},
		{quant.F16, 24, 37, 2}, {quant.F32, 24, 16, 2}, {quant.F16, 4, 21, 2}, {quant.F32, 30, 9, 2},
		{quant.F16, 24, 1100, 1},
	}
	for ci, c := range cases {
		must(t, d.SetOption(OptHCMix, c.opt))
		if !d.HCMixesOK(c.typ, c.m, K, c.n) {
			t.Fatalf("HCMixesOK(%s, %d, %d, %d) false", c.typ, c.m, K, c.n)
		}
		mat, dw, _ := randomMats(t, d, c.typ, c.m, K, 1, uint64(5100+ci))
		wf := make([]float32, c.m*K)
		must(t, quant.Dequantize(c.typ, mat(0), wf))
		h := gaussian(c.n*K, uint64(5200+ci))
		for tok := 0; tok < c.n; tok++ { // streams of magnitudes 1e-3 … 1e3
			sc := float32(math.Pow(10, float64(tok%7-3)))
			for i := tok * K; i < (tok+1)*K; i++ {
				h[i] *= sc
			}
		}
		y := alloc(t, d, int64(4*c.m*c.n))
		poison(t, d, y, c.m*c.n)
		must(t, d.HCMixes(0, dw, upload(t, d, h), c.n, eps, y))
		got := download(t, d, y, c.m*c.n)
		worst := 0.0
		for tok := 0; tok < c.n; tok++ {
			ht := h[tok*K : (tok+1)*K]
			var ss float64
			for _, v := range ht {
				ss += float64(v) * float64(v)
			}
			r := 1 / math.Sqrt(ss/K+eps)
			for m := 0; m < c.m; m++ {
				var dot, mag float64
				for k, v := range ht {
					p := float64(wf[m*K+k]) * float64(v)
					dot += p
					mag += math.Abs(p)
				}
				e := math.Abs(float64(got[tok*c.m+m])-dot*r) / (mag*r + 1e-30)
				worst = max(worst, e)
				if !(e <= 2e-6) {
					t.Errorf("%s %d rows (option %d), token %d row %d: got %v, want %v (error %.3g of Σ|w·h|·r)", c.typ, c.m, c.opt, tok, m, got[tok*c.m+m], dot*r, e)
					return
				}
			}
		}
		t.Logf("%s %d rows × %d tokens (option %d): worst error %.3g of Σ|w·h|·r", c.typ, c.m, c.n, c.opt, worst)
	}
	if d.HCMixesOK(quant.F16, 24, 1000, 64) || d.HCMixesOK(quant.Q8_0, 24, K, 64) || d.HCMixesOK(quant.F16, 33, K, 64) {
		t.Errorf("HCMixesOK takes a shape or type it should not")
	}
}

// TestHadamardWarp checks the warp-a-row Hadamard transforms (OptHadWarp 1)
// bit for bit against the CTA-a-row kernel (0), alone and with the FP4
// simulation after them (HadamardFP4 against Hadamard then FP4Sim), for
// every row length the warp form takes and rows with NaNs and zeros.
func TestHadamardWarp(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptHadWarp, 1) })
	for _, n := range []int{32, 64, 128, 256, 512} {
		const rows = 37
		stride := n + 4
		x := gaussian(rows*stride, uint64(6000+n))
		x[3] = float32(math.NaN())
		for i := 0; i < n; i++ { // a row of zeros, and one all NaN in its first block
			x[5*stride+i] = 0
			if i < 32 {
				x[7*stride+i] = float32(math.NaN())
			}
		}
		run := func(v int, fp4 bool) []float32 {
			must(t, d.SetOption(OptHadWarp, v))
			p := upload(t, d, x)
			if fp4 {
				must(t, d.HadamardFP4(0, p, int64(stride), rows, n, 0.125))
			} else {
				must(t, d.Hadamard(0, p, int64(stride), rows, n, 0.125))
			}
			return download(t, d, p, rows*stride)
		}
		for _, fp4 := range []bool{false, true} {
			want, got := run(0, fp4), run(1, fp4)
			for i := range want {
				if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
					t.Errorf("n %d, fp4 %v: value %d (row %d) = %v, want %v", n, fp4, i, i/stride, got[i], want[i])
					break
				}
			}
		}
	}
}

// TestIndexQuery checks IndexQuery's one launch (OptIXQuery 1) bit for bit
// against Rope, HadamardFP4 and Scale (0) on the indexer's query rows:
// three tokens at a large position, head dims 64 … 512 with Flash's 64
// rotated dims, queries and weights both compared.
func TestIndexQuery(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptIXQuery, 1) })
	const heads, ntok, rd, pos0 = 64, 3, 64, 12345
	freqs := make([]float32, rd/2)
	for i := range freqs {
		freqs[i] = float32(math.Pow(10000, -2*float64(i)/rd))
	}
	fp := upload(t, d, freqs)
	for _, hd := range []int{64, 128, 256, 512} {
		q := gaussian(ntok*heads*hd, uint64(6100+hd))
		w := gaussian(ntok*heads, uint64(6200+hd))
		run := func(v int) ([]float32, []float32) {
			must(t, d.SetOption(OptIXQuery, v))
			qp, wp := upload(t, d, q), upload(t, d, w)
			must(t, d.IndexQuery(0, qp, wp, heads, hd, rd, fp, pos0, ntok, 0.0884, 0.011))
			return download(t, d, qp, len(q)), download(t, d, wp, len(w))
		}
		wq, ww := run(0)
		gq, gw := run(1)
		for _, c := range []struct {
			name      string
			got, want []float32
		}{{"query", gq, wq}, {"weight", gw, ww}} {
			for i := range c.want {
				if math.Float32bits(c.got[i]) != math.Float32bits(c.want[i]) {
					t.Fatalf("hd %d: %s value %d = %v, want %v", hd, c.name, i, c.got[i], c.want[i])
				}
			}
		}
		if math.Float32bits(gq[0]) == math.Float32bits(q[0]) && math.Float32bits(gw[0]) == math.Float32bits(w[0]) {
			t.Fatalf("hd %d: the rows were not changed", hd)
		}
	}
}
