package cuda

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"ds4go/model"
	"ds4go/quant"
	"ds4go/synth"
)

// TestHCPostMix: HCPostMix leaves the streams HCPost leaves, bit for bit,
// and its parts add up to the mixing products fn·flat(h) and the streams'
// sum of squares (float64 reference; bound 1e-5 of the sum of the terms'
// magnitudes); HCPre with those parts gives the x and post/comb HCPre gives
// with the logits computed on the host (relative 1e-5), the same bits with
// its stream loads hoisted (OptHCHoist) as without, for the Flash shape
// (24 rows, D 4096), the head's (4 rows) and tiny ones (D 64 and 96: two
// warps a part and one); for one token and for two (speculative decoding's
// verification: each token's streams, parts and HCPre at its own offsets).
// HCPostMixMoE (the sub-block output each token's MoE sum, with and without
// a shared expert's row) leaves the streams and parts that MoECombine and
// then HCPostMix leave, bit for bit.
func TestHCPostMix(t *testing.T) {
	d := gpu(t)
	for _, c := range []struct {
		D, M int
		typ  quant.Type
	}{
		{4096, 24, quant.F16}, {4096, 4, quant.F16}, {4096, 24, quant.F32}, {4096, 24, quant.BF16}, {64, 24, quant.F16},
		{96, 24, quant.F16}, {96, 4, quant.F32},
	} {
		for _, n := range []int{1, 2} {
			t.Run(fmt.Sprintf("D%d_M%d_%v_n%d", c.D, c.M, c.typ, n), func(t *testing.T) { hcPostMixCase(t, d, c.D, c.M, c.typ, n) })
		}
	}
}

// hcPostMixCase is one case of TestHCPostMix: n tokens, D values, M rows
// of type typ.
func hcPostMixCase(t *testing.T, d *Device, D, M int, typ quant.Type, n int) {
	const hc = 4
	raw := randomWeights(typ, weightBytes(typ, M, hc*D)/int64(typ.BlockBytes()), 77)
	fn := uploadWeight(t, d, typ, M, hc*D, 1, raw)
	fnf := make([]float32, M*hc*D)
	if err := quant.Dequantize(typ, raw, fnf); err != nil {
		t.Fatal(err)
	}
	parts := HCPostMixParts(hc, D, fn)
	if parts == 0 {
		t.Fatalf("HCPostMixParts refused D %d, %d rows", D, M)
	}
	h0 := gaussian(n*hc*D, 1)
	out := upload(t, d, gaussian(n*D, 2))
	post := upload(t, d, gaussian(n*hc, 3))
	comb := upload(t, d, gaussian(n*hc*hc, 4))
	hA, hB := upload(t, d, h0), upload(t, d, h0)
	part := alloc(t, d, int64(4*n*parts*(M+1)))
	must(t, d.HCPost(0, hA, out, post, comb, hc, D, n))
	must(t, d.HCPostMix(0, hB, out, post, comb, hc, D, fn, parts, part, n))
	want, got := download(t, d, hA, n*hc*D), download(t, d, hB, n*hc*D)
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			t.Fatalf("stream value %d: %v, HCPost %v", i, got[i], want[i])
		}
	}
	ps := download(t, d, part, n*parts*(M+1))
	hcPostMixMoECase(t, d, D, fn, parts, n, h0, post, comb)
	check := func(what string, got, want, mag float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-5*mag {
			t.Errorf("%s: %g, want %g (terms' magnitude %g)", what, got, want, mag)
		}
	}
	logits := make([]float32, n*M)
	for tok := 0; tok < n; tok++ {
		ht := want[tok*hc*D : (tok+1)*hc*D]
		var ss float64
		for _, v := range ht {
			ss += float64(v) * float64(v)
		}
		sums := make([]float64, M+1)
		for p := 0; p < parts; p++ {
			for r := 0; r <= M; r++ {
				sums[r] += float64(ps[(tok*parts+p)*(M+1)+r])
			}
		}
		check(fmt.Sprintf("token %d sum of squares", tok), sums[M], ss, ss)
		for r := 0; r < M; r++ {
			var dot, mag float64
			for i, v := range ht {
				dot += float64(fnf[r*hc*D+i]) * float64(v)
				mag += math.Abs(float64(fnf[r*hc*D+i]) * float64(v))
			}
			check(fmt.Sprintf("token %d row %d", tok, r), sums[r], dot, mag)
			logits[tok*M+r] = float32(dot)
		}
	}
	// HCPre from the parts against HCPre from the host's logits (the
	// head's variant for 4 rows, the Sinkhorn split for 24)
	if M != 24 && M != hc {
		return
	}
	mix := upload(t, d, logits)
	pre := hcPreRunner(t, d, M, D, n, hB, 5)
	ref := pre(HCPreArgs{Mix: mix, RawMix: true})
	fromParts := pre(HCPreArgs{Mix: part, Parts: parts})
	// the stream loads issued before the parts are added: the same bits
	must(t, d.SetOption(OptHCHoist, 0))
	unhoisted := pre(HCPreArgs{Mix: part, Parts: parts})
	must(t, d.SetOption(OptHCHoist, 1))
	for i := range unhoisted {
		if math.Float32bits(unhoisted[i]) != math.Float32bits(fromParts[i]) {
			t.Fatalf("HCPre from the parts, value %d: %v with the loads hoisted, %v without", i, fromParts[i], unhoisted[i])
		}
	}
	var num, den float64
	for i := range ref {
		num += (float64(fromParts[i]) - float64(ref[i])) * (float64(fromParts[i]) - float64(ref[i]))
		den += float64(ref[i]) * float64(ref[i])
	}
	if rel := math.Sqrt(num / den); !(rel < 1e-5) {
		t.Errorf("HCPre from the parts: relative difference %.3g from HCPre of the host's logits", rel)
	} else {
		t.Logf("HCPre from the parts: relative difference %.3g", rel)
	}
}

// TestHCPostMixModel: fast mode's decode with the mixing products formed in
// HCPost (the default) against fast mode without (DS4_CUDA_HC_POST_MIX=0),
// through four Flash-shaped layers with float weights, one token at a time:
// the products' float order moves the logits by rounding only (the bound
// is TestKernelVariants' attn_split bound, median 1e-3 and top-1 0.99; a
// lost part or row moves the hc weights by percents), and the path is
// taken (the logits are not all bit-identical).
func TestHCPostMixModel(t *testing.T) {
	gpu(t)
	if testing.Short() {
		t.Skip("short")
	}
	// Flash(4) with float weights is ≈ 50 GB of host memory; without it the
	// process is killed, and every test after this one with it.
	const need = 64 << 30
	if avail, ok := hostMemAvailable(); ok && avail < need {
		t.Skipf("needs ≈ %d GiB of host memory, %d GiB available (a model file in /dev/shm counts against it)",
			need>>30, avail>>30)
	}
	flash := synth.Flash(4)
	w := synthWeights(t, flash, model.SchemeF16)
	toks := testTokens(300, flash.Vocab)
	var on, off [][]float32
	withBackend(t, w, Options{Fast: true}, func(be *Backend) {
		on = allLogits(t, be, 1, toks)
		be.hcPostMix = false
		off = allLogits(t, be, 1, toks)
	})
	a := agree(off, on)
	t.Logf("hc_post_mix against the product kernels: %v", a)
	if a.median > 1e-3 || a.top1 < 0.99 {
		t.Errorf("hc_post_mix: median %g, top-1 %g: outside median 1e-3, top-1 0.99", a.median, a.top1)
	}
	if a.identical == a.rows {
		t.Errorf("hc_post_mix: every row bit-identical: the fused path was not taken")
	}
}

// hostMemAvailable returns the host memory the kernel reports available
// (MemAvailable of /proc/meminfo) in bytes; false where it cannot be read.
func hostMemAvailable() (uint64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "MemAvailable:" && f[2] == "kB" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// TestHostMemAvailable: on Linux the guard of the large model tests reads a
// plausible figure (more than 64 MiB, less than 64 TiB).
func TestHostMemAvailable(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/meminfo")
	}
	n, ok := hostMemAvailable()
	if !ok || n < 64<<20 || n > 64<<40 {
		t.Fatalf("MemAvailable: %d bytes (read: %v)", n, ok)
	}
}

// hcPostMixMoECase: HCPostMixMoE of n tokens' MoE sums (6 experts each, one
// id repeated, in no order) against MoECombine, then HCPostMix: the same
// streams and parts, bit for bit, with and without the shared expert's row.
func hcPostMixMoECase(t *testing.T, d *Device, D int, fn *Weight, parts, n int, h0 []float32, post, comb Ptr) {
	t.Helper()
	const hc, K = 4, hcTestExperts
	ye, sel := hcMoEInputs(t, d, n, D, 11)
	M := fn.Rows
	for _, ysh := range []Ptr{0, upload(t, d, gaussian(n*D, 12))} {
		sum := alloc(t, d, int64(4*n*D))
		hA, hB := upload(t, d, h0), upload(t, d, h0)
		partA, partB := alloc(t, d, int64(4*n*parts*(M+1))), alloc(t, d, int64(4*n*parts*(M+1)))
		must(t, d.MoECombine(0, ye, sel, ysh, sum, n, K, D))
		must(t, d.HCPostMix(0, hA, sum, post, comb, hc, D, fn, parts, partA, n))
		must(t, d.HCPostMixMoE(0, hB, ye, sel, ysh, K, post, comb, hc, D, fn, parts, partB, n))
		want := append(download(t, d, hA, n*hc*D), download(t, d, partA, n*parts*(M+1))...)
		got := append(download(t, d, hB, n*hc*D), download(t, d, partB, n*parts*(M+1))...)
		if i, ok := firstBitDiff(want, got); !ok {
			t.Fatalf("HCPostMixMoE (shared row %v), value %d of streams and parts: %v, MoECombine then HCPostMix %v", ysh != 0, i, got[i], want[i])
		}
	}
}

// TestHCPostMixEx: exact mode's HCPostMixEx leaves the streams HCPost
// leaves, bit for bit, and HCPre from its parts (PartsEx) gives the x and
// post/comb, bit for bit, that HCPre gives from the logits quant's
// float-weight order computes on the host from those streams
// (quant.DotFloatRow, the CPU backend's products) — with and without the
// stream loads hoisted — for Flash's shape in each float type, the head's
// 4 rows, one token and two. The MoE form (each token's MoE sum as the
// sub-block output, with and without a shared expert's row) leaves the
// streams and parts of MoECombine then HCPostMixEx. Two tokens run in one
// CTA a part (OptMVTwo's bit 8), and leave the bits of a CTA a token.
func TestHCPostMixEx(t *testing.T) {
	d := gpu(t)
	for _, c := range []struct {
		M   int
		typ quant.Type
	}{{24, quant.F16}, {24, quant.F32}, {24, quant.BF16}, {4, quant.F16}} {
		for _, n := range []int{1, 2} {
			t.Run(fmt.Sprintf("M%d_%v_n%d", c.M, c.typ, n), func(t *testing.T) { hcPostMixExCase(t, d, c.M, c.typ, n) })
		}
	}
}

// hcPostMixExCase is one case of TestHCPostMixEx: n tokens, M rows of type
// typ, Flash's 4 streams of HCPostMixExD values.
func hcPostMixExCase(t *testing.T, d *Device, M int, typ quant.Type, n int) {
	const hc, D = 4, HCPostMixExD
	raw := randomWeights(typ, weightBytes(typ, M, hc*D)/int64(typ.BlockBytes()), 78)
	fn := uploadWeight(t, d, typ, M, hc*D, 1, raw)
	if !HCPostMixExOK(hc, D, fn) {
		t.Fatalf("HCPostMixExOK refused %d rows of %v", M, typ)
	}
	rb := len(raw) / M
	h0 := gaussian(n*hc*D, 21)
	out := upload(t, d, gaussian(n*D, 22))
	post := upload(t, d, gaussian(n*hc, 23))
	comb := upload(t, d, gaussian(n*hc*hc, 24))
	hA, hB := upload(t, d, h0), upload(t, d, h0)
	pf := HCPostMixExFloats(M)
	part := alloc(t, d, int64(4*n*pf))
	must(t, d.HCPost(0, hA, out, post, comb, hc, D, n))
	must(t, d.HCPostMixEx(0, hB, out, 0, 0, 0, 0, post, comb, hc, D, fn, part, n))
	want, got := download(t, d, hA, n*hc*D), download(t, d, hB, n*hc*D)
	if i, ok := firstBitDiff(want, got); !ok {
		t.Fatalf("stream value %d: %v, HCPost %v", i, got[i], want[i])
	}
	if n == 2 { // two tokens in one CTA a part (OptMVTwo's bit 8) against a CTA a token
		hE, partE := upload(t, d, h0), alloc(t, d, int64(4*n*pf))
		must(t, d.SetOption(OptMVTwo, DefaultMVTwo&^8))
		must(t, d.HCPostMixEx(0, hE, out, 0, 0, 0, 0, post, comb, hc, D, fn, partE, n))
		must(t, d.SetOption(OptMVTwo, DefaultMVTwo))
		a := append(download(t, d, hE, n*hc*D), download(t, d, partE, n*pf)...)
		b := append(got, download(t, d, part, n*pf)...)
		if i, ok := firstBitDiff(a, b); !ok {
			t.Fatalf("two tokens a CTA, value %d of streams and parts: %v, a CTA a token %v", i, b[i], a[i])
		}
	}
	// the MoE form
	const K = hcTestExperts
	ye, sel := hcMoEInputs(t, d, n, D, 25)
	for _, ysh := range []Ptr{0, upload(t, d, gaussian(n*D, 26))} {
		sum := alloc(t, d, int64(4*n*D))
		hC, hD := upload(t, d, h0), upload(t, d, h0)
		partC, partD := alloc(t, d, int64(4*n*pf)), alloc(t, d, int64(4*n*pf))
		must(t, d.MoECombine(0, ye, sel, ysh, sum, n, K, D))
		must(t, d.HCPostMixEx(0, hC, sum, 0, 0, 0, 0, post, comb, hc, D, fn, partC, n))
		must(t, d.HCPostMixEx(0, hD, 0, ye, sel, ysh, K, post, comb, hc, D, fn, partD, n))
		a := append(download(t, d, hC, n*hc*D), download(t, d, partC, n*pf)...)
		b := append(download(t, d, hD, n*hc*D), download(t, d, partD, n*pf)...)
		if i, ok := firstBitDiff(a, b); !ok {
			t.Fatalf("MoE form (shared row %v), value %d of streams and parts: %v, MoECombine then HCPostMixEx %v", ysh != 0, i, b[i], a[i])
		}
		if n == 2 { // the MoE form a CTA a token
			hF, partF := upload(t, d, h0), alloc(t, d, int64(4*n*pf))
			must(t, d.SetOption(OptMVTwo, DefaultMVTwo&^8))
			must(t, d.HCPostMixEx(0, hF, 0, ye, sel, ysh, K, post, comb, hc, D, fn, partF, n))
			must(t, d.SetOption(OptMVTwo, DefaultMVTwo))
			f := append(download(t, d, hF, n*hc*D), download(t, d, partF, n*pf)...)
			if i, ok := firstBitDiff(f, b); !ok {
				t.Fatalf("MoE form (shared row %v) two tokens a CTA, value %d: %v, a CTA a token %v", ysh != 0, i, b[i], f[i])
			}
		}
	}
	// HCPre from the parts against HCPre from the host's logits in the
	// float-weight order
	logits := make([]float32, n*M)
	for tok := range n {
		for r := range M {
			logits[tok*M+r] = quant.DotFloatRow(typ, raw[r*rb:(r+1)*rb], want[tok*hc*D:(tok+1)*hc*D])
		}
	}
	pre := hcPreRunner(t, d, M, D, n, hB, 27)
	ref := pre(HCPreArgs{Mix: upload(t, d, logits), RawMix: true})
	for _, hoist := range []int{1, 0} {
		must(t, d.SetOption(OptHCHoist, hoist))
		got := pre(HCPreArgs{Mix: part, Parts: HCPostMixExParts, PartsEx: true})
		if i, ok := firstBitDiff(ref, got); !ok {
			t.Errorf("HCPre from the exact parts (hoist %d), value %d: %v, from the host's logits %v", hoist, i, got[i], ref[i])
		}
	}
	must(t, d.SetOption(OptHCHoist, 1))
}

// hcPreRunner returns a function that runs HCPre of n tokens on the 4
// streams of D values at h with M mixing rows (the head's variant when M is
// 4, else the Sinkhorn split), random scale, base and norm weights from
// seed, and a's mixing input, and returns x, then post and comb.
func hcPreRunner(t *testing.T, d *Device, M, D, n int, h Ptr, seed uint64) func(a HCPreArgs) []float32 {
	const hc = 4
	head := M == hc
	scale := upload(t, d, []float32{0.5, 0.7, 0.9})
	base := upload(t, d, gaussian(M, seed))
	normw := upload(t, d, gaussian(D, seed+1))
	return func(a HCPreArgs) []float32 {
		x := alloc(t, d, int64(4*n*D))
		a.Head, a.M, a.Scale, a.Base, a.HC, a.Iters, a.HCEps = head, M, scale, base, hc, 20, 1e-6
		a.H, a.D, a.NormW, a.NormEps, a.X, a.N = h, D, normw, 1e-6, x, n
		if !head {
			a.Post, a.Comb = alloc(t, d, 4*int64(n*hc)), alloc(t, d, 4*int64(n*hc*hc))
		}
		must(t, d.HCPre(0, &a))
		r := download(t, d, x, n*D)
		if !head {
			r = append(r, download(t, d, a.Post, n*hc)...)
			r = append(r, download(t, d, a.Comb, n*hc*hc)...)
		}
		return r
	}
}

// hcTestExperts is the routed experts a token of hcMoEInputs.
const hcTestExperts = 6

// hcMoEInputs uploads n tokens' routed outputs ye [n][6][D] (random, from
// seed) and their expert ids (one id repeated, in no order), for the MoE
// sum's tests.
func hcMoEInputs(t *testing.T, d *Device, n, D int, seed uint64) (ye, sel Ptr) {
	const K = hcTestExperts
	ye = upload(t, d, gaussian(n*K*D, seed))
	ids := make([]int32, n*K)
	for tok := range n {
		copy(ids[tok*K:], []int32{200, 3, 77 + int32(tok), 3, 150, 9})
	}
	sel = tempAlloc(t, d, int64(4*n*K))
	t.Cleanup(func() { d.Free(sel) })
	must(t, UploadSlice(d, sel, ids))
	return ye, sel
}

// TestHCPostMixShapes (no GPU): which mixing weights and embeddings the
// hc_post forms take — fast mode's parts for 4 streams of D a multiple of
// 32 and float rows of 4·D, at most 24 of them; exact mode's only for
// Flash's D (HCPostMixExD) — and the exact parts' size, which hc_pre's
// kernel reads (M × 256 running sums, then HCPostMixExParts doubles).
func TestHCPostMixShapes(t *testing.T) {
	w := func(typ quant.Type, rows, cols int) *Weight {
		return &Weight{Type: typ, Rows: rows, Cols: cols, Mats: 1}
	}
	for _, c := range []struct {
		hc, D int
		fn    *Weight
		parts int
		exact bool
		what  string
	}{
		{4, 4096, w(quant.F16, 24, 4*4096), 32, true, "Flash's mixing rows"},
		{4, 4096, w(quant.F32, 4, 4*4096), 32, true, "the head's"},
		{4, 4096, w(quant.BF16, 24, 4*4096), 32, true, "bf16"},
		{4, 4096, w(quant.Q8_0, 24, 4*4096), 0, false, "a quantized weight"},
		{4, 4096, w(quant.F16, 25, 4*4096), 0, false, "25 rows"},
		{4, 4096, w(quant.F16, 24, 4096), 0, false, "columns not 4·D"},
		{4, 2048, w(quant.F16, 24, 4*2048), 16, false, "D 2048"},
		{4, 96, w(quant.F16, 24, 4*96), 3, false, "D 96"},
		{2, 4096, w(quant.F16, 8, 2*4096), 0, false, "2 streams"},
		{4, 4096, nil, 0, false, "no weight"},
	} {
		if got := HCPostMixParts(c.hc, c.D, c.fn); got != c.parts {
			t.Errorf("%s: HCPostMixParts = %d, want %d", c.what, got, c.parts)
		}
		if got := HCPostMixExOK(c.hc, c.D, c.fn); got != c.exact {
			t.Errorf("%s: HCPostMixExOK = %v, want %v", c.what, got, c.exact)
		}
	}
	if got, want := HCPostMixExFloats(24), 24*256+2*HCPostMixExParts; got != want {
		t.Errorf("HCPostMixExFloats(24) = %d, want %d", got, want)
	}
}
