package cuda

import (
	"fmt"
	"math"
	"os"
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
func TestHCMixes(t *testing.T) {
	d := gpu(t)
	const K, eps = 16384, 1e-6
	cases := []struct {
		typ  quant.Type
		m, n int
	}{
		{quant.F16, 24, 37}, {quant.F32, 24, 16}, {quant.F16, 4, 21}, {quant.F32, 30, 9},
	}
	for ci, c := range cases {
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
					t.Errorf("%s %d rows, token %d row %d: got %v, want %v (error %.3g of Σ|w·h|·r)", c.typ, c.m, tok, m, got[tok*c.m+m], dot*r, e)
					return
				}
			}
		}
		t.Logf("%s %d rows × %d tokens: worst error %.3g of Σ|w·h|·r", c.typ, c.m, c.n, worst)
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

// TestHCPostMixes checks HCPostMixes against HCPost then a float64
// reference of the mixing logits: the new streams bit for bit (the same
// operations per value as HCPost, in place), the logits within HCMixes'
// bound of 2e-6 of Σ|w·h|·r (the same three-term products over the values
// in another order), for F16 and F32 mixers of Flash's shapes (24 and 4
// rows over 4 streams of 4096), token counts that leave a partial tile of
// 16 and streams of very different magnitudes.
func TestHCPostMixes(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptHCPostMix, 1) })
	const HC, D, eps = 4, 4096, 1e-6
	const K = HC * D
	cases := []struct {
		typ  quant.Type
		m, n int
		v    int // OptHCPostMix: 1 or 2 (the same kernel at two CTAs an SM)
	}{{quant.F16, 24, 37, 1}, {quant.F32, 4, 21, 1}, {quant.F16, 24, 8, 1}, {quant.F16, 24, 37, 2}}
	for ci, c := range cases {
		must(t, d.SetOption(OptHCPostMix, c.v))
		if !d.HCPostMixesOK(c.typ, c.m, HC, D, c.n) {
			t.Fatalf("HCPostMixesOK(%s, %d, %d, %d, %d) false", c.typ, c.m, HC, D, c.n)
		}
		mat, dw, _ := randomMats(t, d, c.typ, c.m, K, 1, uint64(5300+ci))
		wf := make([]float32, c.m*K)
		must(t, quant.Dequantize(c.typ, mat(0), wf))
		h := gaussian(c.n*K, uint64(5400+ci))
		for tok := 0; tok < c.n; tok++ { // streams of magnitudes 1e-3 … 1e3
			sc := float32(math.Pow(10, float64(tok%7-3)))
			for i := tok * K; i < (tok+1)*K; i++ {
				h[i] *= sc
			}
		}
		out := upload(t, d, gaussian(c.n*D, uint64(5500+ci)))
		post := upload(t, d, gaussian(c.n*HC, uint64(5600+ci)))
		comb := upload(t, d, gaussian(c.n*HC*HC, uint64(5700+ci)))
		ha, hb := upload(t, d, h), upload(t, d, h)
		must(t, d.HCPost(0, ha, out, post, comb, HC, D, c.n))
		y := alloc(t, d, int64(4*c.m*c.n))
		poison(t, d, y, c.m*c.n)
		must(t, d.HCPostMixes(0, dw, hb, out, post, comb, HC, D, c.n, eps, y))
		want, gotH := download(t, d, ha, c.n*K), download(t, d, hb, c.n*K)
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(gotH[i]) {
				t.Fatalf("%s %d rows × %d tokens, hc_post_mix %d: stream value %d (token %d) %v, HCPost gives %v", c.typ, c.m, c.n, c.v, i, i/K, gotH[i], want[i])
			}
		}
		got := download(t, d, y, c.m*c.n)
		worst := 0.0
		for tok := 0; tok < c.n; tok++ {
			ht := want[tok*K : (tok+1)*K]
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
					t.Fatalf("%s %d rows, token %d row %d: got %v, want %v (error %.3g of Σ|w·h|·r)", c.typ, c.m, tok, m, got[tok*c.m+m], dot*r, e)
				}
			}
		}
		t.Logf("%s %d rows × %d tokens, hc_post_mix %d: streams identical to HCPost's, worst logit error %.3g of Σ|w·h|·r", c.typ, c.m, c.n, c.v, worst)
	}
	if d.HCPostMixesOK(quant.F16, 24, 3, D, 64) || d.HCPostMixesOK(quant.F16, 24, HC, 4000, 64) || d.HCPostMixesOK(quant.F16, 24, HC, D, 4) {
		t.Errorf("HCPostMixesOK takes a shape it should not")
	}
	must(t, d.SetOption(OptHCPostMix, 0))
	if d.HCPostMixesOK(quant.F16, 24, HC, D, 64) {
		t.Errorf("HCPostMixesOK with OptHCPostMix 0")
	}
}

// TestHCPassBench times a fast chunk's hc passes at Flash's shape (4096
// tokens, 4 streams of 4096, 24 F16 mixer rows; DS4_CUDA_BENCH=1): HCPost
// then HCMixes, against HCPostMixes with each OptHCPostMix.
func TestHCPassBench(t *testing.T) {
	if os.Getenv("DS4_CUDA_BENCH") == "" {
		t.Skip("set DS4_CUDA_BENCH=1 to run the hc passes' benchmark")
	}
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptHCPostMix, 1) })
	gt := newGraphTimer(t, d)
	const HC, D, M, n, eps = 4, 4096, 24, 4096, 1e-6
	_, dw, _ := randomMats(t, d, quant.F16, M, HC*D, 1, 5800)
	h := upload(t, d, gaussian(n*HC*D, 5801))
	out := upload(t, d, gaussian(n*D, 5802))
	post := upload(t, d, gaussian(n*HC, 5803))
	comb := upload(t, d, gaussian(n*HC*HC, 5804))
	mix := alloc(t, d, int64(4*M*n))
	us := gt.time(4, func(int) error {
		if err := d.HCPost(gt.s, h, out, post, comb, HC, D, n); err != nil {
			return err
		}
		return d.HCMixes(gt.s, dw, h, n, eps, mix)
	})
	fmt.Printf("hc passes: HCPost + HCMixes %9.1f µs\n", us)
	for _, v := range []int{1, 2} {
		must(t, d.SetOption(OptHCPostMix, v))
		us := gt.time(4, func(int) error { return d.HCPostMixes(gt.s, dw, h, out, post, comb, HC, D, n, eps, mix) })
		fmt.Printf("hc passes: HCPostMixes (hc_post_mix %d) %9.1f µs\n", v, us)
	}
}
