package cuda

import (
	"fmt"
	"math"
	"testing"

	"ds4go/quant"
)

// TestMatVecFastQ8 checks fast mode's pipelined Q8_0 products
// (OptMVFast: the segments' dp4a sums reduced by warps, not quant.Dot's
// block order) against quant.MatVec within compare's float32 ulps of the
// rows' Σ|w·x| — a lost segment, block or scale is an error of the size
// of the row's own terms — on Flash's shapes: q_b (1024 columns, one
// segment a row), wo_b (8192: eight), wo_a's eight selections of one
// matrix each with their own activation rows (4096), a partial last tile,
// and ids with one out of range (NaN rows). Each is run twice (the same
// bits: the segments are added in order), again with two stages of
// taller tiles, four of shorter ones, the tallest tiles (OptMVEven off)
// and stage counts and CTAs an SM by class of columns (OptMVQ8NSEx, …), the
// same bits too, and exact mode is checked to keep quant.Dot's bits with
// the option on — on fast mode's items since v57 (OptMVExQ8:
// the terms stored and added in block order, by the last warp or, 2, by a
// ninth), under each of those shapes and with OptMVExQ8 off. MatVecF32
// (the activation formed in the kernel, with q_b's RMSNorm) is compared
// the same way, exact mode's bit for bit with quant.Dot of RMSNormRef's
// row.
func TestMatVecFastQ8(t *testing.T) {
	d := gpu(t)
	pipeEverywhere(t, d)
	must(t, d.SetOption(OptMVFast, DefaultMVFast))
	t.Cleanup(func() { d.SetOption(OptMVFast, DefaultMVFast) })
	cases := []struct {
		name       string
		rows, cols int
		mats       int
		ids        []int32 // nil: selections are matrices 0 … nsel − 1 (or the one matrix)
		nsel       int
	}{
		{"q_b", 16384, 1024, 1, nil, 1},
		{"wo_b", 4096, 8192, 1, nil, 1},
		{"wo_a", 1024, 4096, 8, nil, 8},
		{"partial", 300, 2048, 1, nil, 1},
		{"ids", 300, 1024, 3, []int32{2, 7, 0}, 3},
	}
	for ci, c := range cases {
		mat, dw, ab := randomMats(t, d, quant.Q8_0, c.rows, c.cols, c.mats, uint64(5100+ci))
		x := gaussian(c.nsel*c.cols, uint64(5200+ci))
		act := quantizeOnDevice(t, d, quant.Q8_0, x, c.cols, c.nsel)
		var idp Ptr
		if c.ids != nil {
			idp = alloc(t, d, 4*int64(len(c.ids)))
			must(t, UploadSlice(d, idp, c.ids))
		}
		n := c.rows * c.nsel
		y := alloc(t, d, 4*int64(n))
		run := func(exact bool) []float32 {
			poison(t, d, y, n)
			must(t, d.MatMulEx(0, dw, idp, c.nsel, act, ab, ab, 1, 1, y, int64(c.rows), int64(c.rows), exact))
			return download(t, d, y, n)
		}
		fast := run(false)
		if k, ok := firstBitDiff(fast, run(false)); !ok {
			t.Errorf("%s: two fast runs differ at %d: %v, %v", c.name, k, fast[k], run(false)[k])
		}
		exact := run(true)
		for s := 0; s < c.nsel; s++ {
			m := s
			if c.ids != nil {
				m = int(c.ids[s])
			}
			got, ex := fast[s*c.rows:(s+1)*c.rows], exact[s*c.rows:(s+1)*c.rows]
			if m >= c.mats {
				for r, v := range got {
					if !math.IsNaN(float64(v)) || !math.IsNaN(float64(ex[r])) {
						t.Fatalf("%s: selection %d (id %d out of range): row %d = %v (exact %v), want NaN", c.name, s, m, r, v, ex[r])
					}
				}
				continue
			}
			want, mag := reference(t, quant.Q8_0, mat(m), c.rows, c.cols, x[s*c.cols:(s+1)*c.cols])
			compare(t, fmt.Sprintf("%s %dx%d selection %d fast", c.name, c.rows, c.cols, s), got, want, mag, nterms(quant.Q8_0, c.cols))
			if k, ok := firstBitDiff(ex, want); !ok {
				t.Errorf("%s selection %d: exact mode with mv_fast on: row %d = %v, want quant.Dot's %v", c.name, s, k, ex[k], want[k])
			}
		}
		// the launch's shape (two stages of taller tiles, four of shorter
		// ones; the tallest tiles that fit) moves rows between CTAs, and
		// the items a warp forms at once and the warp that adds the row
		// sums reorder instructions, not the bits, in either mode; exact
		// mode's k_mv_pipe units (OptMVExQ8 0) give its bits too
		for _, o := range []struct{ key, v, def int }{{OptMVStages, 2, 3}, {OptMVStages, 4, 3}, {OptMVEven, 0, 1},
			{OptMVILP, 1, DefaultMVILP}, {OptMVILP, 2, DefaultMVILP}, {OptMVILP, 3, DefaultMVILP},
			{OptMVSumW, 1 - DefaultMVSumW, DefaultMVSumW}, {OptMVExQ8, 0, DefaultMVExQ8}, {OptMVExQ8, 1, DefaultMVExQ8},
			{OptMVExQ8, 2, DefaultMVExQ8}, {OptMVQ8NSEx, 0, DefaultMVQ8NSEx}, {OptMVQ8NSEx, 2222, DefaultMVQ8NSEx},
			{OptMVQ8NSEx, 4345, DefaultMVQ8NSEx}, {OptMVQ8NSFast, 2222, 0}, {OptMVQ8NSFast, 4345, 0}, {OptMVQ8CTAsEx, 1111, 0}, {OptMVQ8CTAsFast, 1111, 0}} {
			must(t, d.SetOption(o.key, o.v))
			got, gotEx := run(false), run(true)
			must(t, d.SetOption(o.key, o.def))
			if k, ok := firstBitDiff(got, fast); !ok {
				t.Errorf("%s: option %d = %d changed row %d: %v against %v", c.name, o.key, o.v, k, got[k], fast[k])
			}
			if k, ok := firstBitDiff(gotEx, exact); !ok {
				t.Errorf("%s: option %d = %d changed exact mode's row %d: %v against %v", c.name, o.key, o.v, k, gotEx[k], exact[k])
			}
		}
		// the option off: fast mode takes the exact terms
		must(t, d.SetOption(OptMVFast, 0))
		if k, ok := firstBitDiff(run(false), exact); !ok {
			t.Errorf("%s: mv_fast 0 in fast mode differs from exact mode at %d", c.name, k)
		}
		must(t, d.SetOption(OptMVFast, DefaultMVFast))
		d.FreeWeight(dw)
	}

	t.Run("MatVecF32", func(t *testing.T) {
		const rows, cols, eps = 16384, 1024, 1e-6
		mat, dw, ab := randomMats(t, d, quant.Q8_0, rows, cols, 1, 5300)
		defer d.FreeWeight(dw)
		x := gaussian(cols, 5301)
		dx, nw := upload(t, d, x), upload(t, d, gaussian(cols, 5302))
		xn := alloc(t, d, 4*cols)
		must(t, d.RMSNormRef(0, dx, cols, nw, xn, cols, cols, 1, eps))
		want, mag := reference(t, quant.Q8_0, mat(0), rows, cols, download(t, d, xn, cols))
		y, xn2, act := alloc(t, d, 4*rows), alloc(t, d, 4*cols), alloc(t, d, ab)
		// f32 runs MatVecF32 with option key set to v (key 0: none)
		f32 := func(exact, room bool, key, v, def int) []float32 {
			if key != 0 {
				must(t, d.SetOption(key, v))
				defer d.SetOption(key, def)
			}
			poison(t, d, y, rows)
			must(t, d.MatVecF32(0, dw, dx, nw, eps, xn2, act, y, exact, room, 1))
			return download(t, d, y, rows)
		}
		got := f32(false, false, 0, 0, 0)
		compare(t, "MatVecF32 fast", got, want, mag, nterms(quant.Q8_0, cols))
		// with room (one CTA an SM, taller tiles; or OptMVRoom's bit 1:
		// two CTAs an SM within the room's budget): the same bits
		for _, opt := range []int{0, 1} {
			if i, ok := firstBitDiff(f32(false, true, OptMVRoom, opt, DefaultMVRoom), got); !ok {
				t.Errorf("MatVecF32 fast with room (OptMVRoom %d) differs at row %d", opt, i)
			}
		}
		// exact mode: quant.Dot's bits of RMSNormRef's row quantized (the
		// reference), on fast mode's items with the rows added by a ninth
		// warp (2) or the last (1), and on k_mv_pipe's units (0)
		for _, v := range []int{2, 1, 0} {
			if i, ok := firstBitDiff(f32(true, false, OptMVExQ8, v, DefaultMVExQ8), want); !ok {
				t.Errorf("MatVecF32 exact (OptMVExQ8 %d) differs from quant.Dot at row %d", v, i)
			}
		}
	})

	// Two tokens (speculative decoding's verification): both rows'
	// activations formed by the pipelined kernel, each token's products
	// those of its one-token call bit for bit, in both modes (exact mode's
	// through OptMVTwo's bit 2 since v67), with and without the norm,
	// and with room (one CTA an SM, or OptMVRoom's bit 2: two within the
	// room's budget); the rows between two outputs untouched is not asked
	// (y is contiguous).
	t.Run("MatVecF32Two", func(t *testing.T) {
		must(t, d.SetOption(OptMVTwo, DefaultMVTwo))
		t.Cleanup(func() { d.SetOption(OptMVRoom, DefaultMVRoom) })
		for _, c := range []struct{ rows, cols int }{{32768, 1024}, {4096, 8192}, {300, 2048}} {
			const eps = 1e-6
			_, dw, ab := randomMats(t, d, quant.Q8_0, c.rows, c.cols, 1, 5310)
			x := gaussian(2*c.cols, 5311)
			dx, nw := upload(t, d, x), upload(t, d, gaussian(c.cols, 5312))
			xn, act := alloc(t, d, 4*int64(2*c.cols)), alloc(t, d, 2*ab)
			y := alloc(t, d, 4*int64(2*c.rows))
			for _, v := range []struct {
				norm Ptr
				room bool
				opt  int
			}{{nw, false, 0}, {0, false, 0}, {nw, true, 0}, {nw, true, 2}} {
				for _, exact := range []bool{false, true} {
					must(t, d.SetOption(OptMVRoom, v.opt))
					poison(t, d, y, 2*c.rows)
					must(t, d.MatVecF32(0, dw, dx, v.norm, eps, xn, act, y, exact, v.room, 2))
					two := download(t, d, y, 2*c.rows)
					must(t, d.SetOption(OptMVRoom, DefaultMVRoom))
					for tok := 0; tok < 2; tok++ {
						poison(t, d, y, c.rows)
						must(t, d.MatVecF32(0, dw, dx+Ptr(4*tok*c.cols), v.norm, eps, xn, act, y, exact, false, 1))
						one := download(t, d, y, c.rows)
						if k, ok := firstBitDiff(two[tok*c.rows:(tok+1)*c.rows], one); !ok {
							t.Errorf("%dx%d exact %v norm %v room %v (OptMVRoom %d) token %d: row %d = %v, one-token %v", c.rows, c.cols, exact, v.norm != 0, v.room, v.opt, tok, k, two[tok*c.rows+k], one[k])
						}
					}
				}
			}
			d.FreeWeight(dw)
		}
	})
}

// TestMatVecDecFast checks fast mode's decode products of the routed
// experts (k_mv_dec with OptMVFast's bit 2: each lane's shares of its
// units' terms, then the warp's tree sum) against quant.MatVec within
// compare's ulps of Σ|w·x|: a decode step's gate and up pair (IQ2_XXS,
// 4096 columns, one activation for the token's six selections) and its
// down (Q2_K, 2048 columns, one activation each), with one id out of
// range (NaN rows). Each is run twice (the same bits), exact mode keeps
// quant.Dot's bits, and with the bit off fast mode takes exact mode's.
func TestMatVecDecFast(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptMVFast, DefaultMVFast) })
	const mats = 16
	ids := []int32{3, 15, 0, 7, mats, 9} // (mats: out of range)
	for ci, c := range []struct {
		typ        quant.Type
		rows, cols int
		div        int // selections an activation row
	}{{quant.IQ2_XXS, 2048, 4096, 6}, {quant.Q2_K, 4096, 2048, 1}} {
		mat1, dw1, ab := randomMats(t, d, c.typ, c.rows, c.cols, mats, uint64(5400+ci))
		mat2, dw2, _ := randomMats(t, d, c.typ, c.rows, c.cols, mats, uint64(5500+ci))
		nsel, nact := len(ids), len(ids)/c.div
		x := gaussian(nact*c.cols, uint64(5600+ci))
		act := quantizeOnDevice(t, d, c.typ, x, c.cols, nact)
		idp := alloc(t, d, 4*int64(nsel))
		must(t, UploadSlice(d, idp, ids))
		n := c.rows * nsel
		y1, y2 := alloc(t, d, 4*int64(n)), alloc(t, d, 4*int64(n))
		// the pair (gate and up) when the activation is shared, else one product
		run := func(exact bool) [2][]float32 {
			poison(t, d, y1, n)
			poison(t, d, y2, n)
			if c.div > 1 {
				must(t, d.MatMulGroupedPair(0, dw1, dw2, idp, nsel, act, ab, c.div, y1, y2, int64(c.rows), 0, exact))
				return [2][]float32{download(t, d, y1, n), download(t, d, y2, n)}
			}
			must(t, d.MatMulEx(0, dw1, idp, nsel, act, ab, ab, 1, 1, y1, int64(c.rows), int64(c.rows), exact))
			return [2][]float32{download(t, d, y1, n), nil}
		}
		must(t, d.SetOption(OptMVFast, DefaultMVFast))
		fast, exact := run(false), run(true)
		again := run(false)
		for k, mat := range []func(int) []byte{mat1, mat2} {
			if fast[k] == nil {
				continue
			}
			if i, ok := firstBitDiff(fast[k], again[k]); !ok {
				t.Errorf("%s tensor %d: two fast runs differ at %d", c.typ, k, i)
			}
			for s, e := range ids {
				got, ex := fast[k][s*c.rows:(s+1)*c.rows], exact[k][s*c.rows:(s+1)*c.rows]
				if e >= mats {
					for r, v := range got {
						if !math.IsNaN(float64(v)) {
							t.Fatalf("%s tensor %d: id out of range: row %d = %v, want NaN", c.typ, k, r, v)
						}
					}
					continue
				}
				a := s / c.div
				want, mag := reference(t, c.typ, mat(int(e)), c.rows, c.cols, x[a*c.cols:(a+1)*c.cols])
				compare(t, fmt.Sprintf("%s tensor %d selection %d fast", c.typ, k, s), got, want, mag, nterms(c.typ, c.cols))
				if i, ok := firstBitDiff(ex, want); !ok {
					t.Errorf("%s tensor %d selection %d: exact mode row %d = %v, want quant.Dot's %v", c.typ, k, s, i, ex[i], want[i])
				}
			}
		}
		must(t, d.SetOption(OptMVFast, DefaultMVFast&^2))
		off := run(false)
		for k := range off {
			if i, ok := firstBitDiff(off[k], exact[k]); !ok {
				t.Errorf("%s tensor %d: OptMVFast without bit 2 differs from exact mode at %d", c.typ, k, i)
			}
		}
		d.FreeWeight(dw1)
		d.FreeWeight(dw2)
	}
}

// TestMatVecF32Half checks MatVecF32 with F16 weights (the indexer's query
// product from q_a's row): fast mode with a norm takes k_mv_f16_norm
// (OptMVF32 bit 2) — one launch, xn left as it was — and gives the bits of
// RMSNormRef then MatMulEx on Flash's shape (8192 × 1024, where k_matvec
// takes a row a warp); other shapes (4096 and 2048 columns, a partial
// CTA) are held to compare's ulps of Σ|w·x| against quant.MatVec of the
// normalised row. With the bit off, in exact mode and without a norm it
// runs the separate launches (xn written; exact mode quant.Dot's bits).
func TestMatVecF32Half(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptMVF32, DefaultMVF32) })
	if DefaultMVF32&2 == 0 {
		t.Fatal("DefaultMVF32 leaves the fused F16 form off")
	}
	const eps = 1e-6
	for ci, c := range []struct {
		rows, cols int
		same       bool // the two launches' bits (k_matvec's row-a-warp launch)
	}{{8192, 1024, true}, {300, 4096, false}, {1000, 2048, false}} {
		mat, dw, _ := randomMats(t, d, quant.F16, c.rows, c.cols, 1, uint64(5900+ci))
		x := gaussian(c.cols, uint64(6000+ci))
		dx, nw := upload(t, d, x), upload(t, d, gaussian(c.cols, uint64(6100+ci)))
		xn := alloc(t, d, 4*int64(c.cols))
		must(t, d.RMSNormRef(0, dx, int64(c.cols), nw, xn, int64(c.cols), c.cols, 1, eps))
		xnh := download(t, d, xn, c.cols)
		want, mag := reference(t, quant.F16, mat(0), c.rows, c.cols, xnh)
		y, xn2 := alloc(t, d, 4*int64(c.rows)), alloc(t, d, 4*int64(c.cols))
		run := func(opt int, exact bool, norm Ptr) ([]float32, bool) {
			must(t, d.SetOption(OptMVF32, opt))
			poison(t, d, y, c.rows)
			poison(t, d, xn2, c.cols)
			must(t, d.MatVecF32(0, dw, dx, norm, eps, xn2, 0, y, exact, false, 1))
			return download(t, d, y, c.rows), math.IsNaN(float64(download(t, d, xn2, 1)[0]))
		}
		name := fmt.Sprintf("%dx%d", c.rows, c.cols)
		fused, untouched := run(DefaultMVF32, false, nw)
		if !untouched {
			t.Errorf("%s: fast mode with the norm wrote xn: not the one-launch form", name)
		}
		compare(t, name+" fused", fused, want, mag, nterms(quant.F16, c.cols))
		two, untouched := run(DefaultMVF32&^2, false, nw)
		if untouched {
			t.Errorf("%s: OptMVF32 without bit 2 did not write xn", name)
		}
		if i, ok := firstBitDiff(fused, two); c.same && !ok {
			t.Errorf("%s: fused row %d = %v, the two launches give %v", name, i, fused[i], two[i])
		}
		compare(t, name+" two launches", two, want, mag, nterms(quant.F16, c.cols))
		ex, _ := run(DefaultMVF32, true, nw)
		if i, ok := firstBitDiff(ex, want); !ok {
			t.Errorf("%s: exact mode row %d = %v, want quant.Dot's %v", name, i, ex[i], want[i])
		}
		// without a norm: x itself is the activation
		plain, _ := run(DefaultMVF32, false, 0)
		wantx, magx := reference(t, quant.F16, mat(0), c.rows, c.cols, x)
		compare(t, name+" without a norm", plain, wantx, magx, nterms(quant.F16, c.cols))
		for i, v := range download(t, d, dx, c.cols) {
			if math.Float32bits(v) != math.Float32bits(x[i]) {
				t.Fatalf("%s: x[%d] changed to %v", name, i, v)
			}
		}
		d.FreeWeight(dw)
	}
}

// firstBitDiff reports whether a and b hold the same bits, and else the
// first index where they differ (the shorter length when one is a prefix
// of the other).
func firstBitDiff(a, b []float32) (int, bool) {
	n := min(len(a), len(b))
	for i := range n {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i, false
		}
	}
	return n, len(a) == len(b)
}

// TestMatMulQ8Out checks MatMulQ8Out (a product that also writes its
// output's Q8_0 activation; a decode step's wo_a for wo_b) against the two
// steps it replaces, MatMulEx then Quantize, bit for bit — y and the
// activation's bytes — in both modes where the pipelined kernel takes it
// (each CTA one block of 32 rows: wo_a's eight selections, one matrix of
// 4096 rows, tiles shorter than a block; exact mode's terms since v57,
// OptMVExQ8) and where it does not (columns not whole 1024-value
// segments), for one token and for two to four (a verification pass's: in
// exact mode the few-token kernel where OptMVTwo has bits 2 and 4, each
// token's block quantized by its own warp; else the separate steps); and
// that rows that are not whole blocks, and five tokens, are refused.
func TestMatMulQ8Out(t *testing.T) {
	d := gpu(t)
	pipeEverywhere(t, d)
	t.Cleanup(func() { d.SetOption(OptMVTwo, DefaultMVTwo) })
	cases := []struct {
		name             string
		rows, cols, mats int
		nsel             int
	}{
		{"wo_a", 1024, 4096, 8, 8},
		{"one", 4096, 8192, 1, 1},
		{"short tiles", 96, 16384, 2, 2},
		{"unpipelined", 256, 2080, 3, 3},
	}
	for ci, c := range cases {
		_, dw, ab := randomMats(t, d, quant.Q8_0, c.rows, c.cols, c.mats, uint64(5300+ci))
		x := gaussian(4*c.nsel*c.cols, uint64(5400+ci))
		act := quantizeOnDevice(t, d, quant.Q8_0, x, c.cols, 4*c.nsel)
		actTok := ab * int64(c.nsel)
		n := c.rows * c.nsel
		qb := d.ActBytes(quant.Q8_0, n)
		y, yq := alloc(t, d, 16*int64(n)), alloc(t, d, 4*qb)
		yRef, yqRef := alloc(t, d, 16*int64(n)), alloc(t, d, 4*qb)
		for _, v := range []struct{ ntok, two int }{{1, DefaultMVTwo}, {2, DefaultMVTwo}, {2, DefaultMVTwo &^ 4}, {2, 0},
			{3, DefaultMVTwo}, {4, DefaultMVTwo}, {4, 0}} { // (three and four tokens: deeper drafts' passes)
			must(t, d.SetOption(OptMVTwo, v.two))
			for _, exact := range []bool{false, true} {
				name := fmt.Sprintf("%s exact=%v tokens=%d OptMVTwo=%d", c.name, exact, v.ntok, v.two)
				poison(t, d, y, v.ntok*n)
				must(t, d.MemsetAsync(yq, 0x5a, int64(v.ntok)*qb, 0))
				must(t, d.MatMulQ8Out(0, dw, c.nsel, act, actTok, ab, 1, v.ntok, y, yq, exact))
				must(t, d.MatMulEx(0, dw, 0, c.nsel, act, actTok, ab, 1, v.ntok, yRef, int64(n), int64(c.rows), exact))
				must(t, d.Quantize(0, quant.Q8_0, yRef, n, yqRef, n, v.ntok))
				got, want := download(t, d, y, v.ntok*n), download(t, d, yRef, v.ntok*n)
				if k, ok := firstBitDiff(got, want); !ok {
					t.Errorf("%s: token %d y[%d] = %v, MatMulEx's %v", name, k/n, k%n, got[k], want[k])
				}
				// (the quants and the scales; not the row's padding to 16
				// bytes, which neither writes)
				gq, wq := make([]byte, int64(v.ntok)*qb), make([]byte, int64(v.ntok)*qb)
				must(t, d.Download(gq, yq))
				must(t, d.Download(wq, yqRef))
				for tok := range v.ntok {
					o := int64(tok) * qb
					for i := range int64(n + n/32*4) {
						if gq[o+i] != wq[o+i] {
							t.Errorf("%s: token %d activation byte %d of %d = %#x, Quantize's %#x", name, tok, i, qb, gq[o+i], wq[o+i])
							break
						}
					}
				}
			}
		}
	}
	_, dw, ab := randomMats(t, d, quant.Q8_0, 48, 1024, 1, 5399)
	buf := alloc(t, d, 4*48+d.ActBytes(quant.Q8_0, 48))
	if err := d.MatMulQ8Out(0, dw, 1, buf, 0, ab, 1, 1, buf, buf, false); err == nil {
		t.Errorf("48 rows (not whole blocks of 32): no error")
	}
	_, dw64, ab64 := randomMats(t, d, quant.Q8_0, 64, 1024, 1, 5398)
	buf64 := alloc(t, d, 5*(4*64+d.ActBytes(quant.Q8_0, 64)))
	if err := d.MatMulQ8Out(0, dw64, 1, buf64, ab64, ab64, 1, 5, buf64, buf64, false); err == nil {
		t.Errorf("five tokens: no error")
	}
}

// TestMatVecFastQ8Two checks fast mode's products of two tokens
// (OptMVTwo), and of three and four (deeper drafts' verification passes:
// the same forms). Q8_0 ones run as one pipelined product (the weights streamed
// once, both tokens' activations in shared memory): each token's row
// equals, bit for bit, its own one-token product (the same items, partials
// and order). Flash's shapes: q_b (1024 columns), wo_b (8192), q_a and the
// shared expert (4096), a partial last tile (2048 columns), the grouped
// wo_a (8 selections, each its own matrix and activation row) and a small
// grouped product whose tiles end inside a selection. F16 ones with
// few rows split each row over warps (the mixers, the router, a
// compressor). Every token's rows are within compare's bound of
// quant.MatVec, the second token's at y's token stride (here wider than
// the rows, the rows between untouched); with the option off the generic
// two-token kernel is too. Exact mode's products of two tokens (OptMVTwo's
// bit 2: Q8_0 pipelined, each token's block terms added in block order;
// F16 on k_fexact_warp, the weights loaded once; and with the bit off, the
// generic kernels) give each token its one-token exact product's bits, and
// for Q8_0 quant.Dot's. Fast mode's three- and four-token Q8_0 items with
// their trees unpacked (without MVTwoPack, the default's), and both
// modes' few-token forms without their registers bounded for two CTAs an SM
// (OptMVOcc), give the default forms' bits.
func TestMatVecFastQ8Two(t *testing.T) {
	d := gpu(t)
	pipeEverywhere(t, d)
	must(t, d.SetOption(OptMVTwo, DefaultMVTwo))
	t.Cleanup(func() { d.SetOption(OptMVTwo, DefaultMVTwo) })
	// (dense products of 5 tokens and more take the tensor cores: here
	// never below, whatever the default)
	must(t, d.SetOption(OptTCMinTokens, 5))
	t.Cleanup(func() { d.SetOption(OptTCMinTokens, DefaultTCMinTokens) })
	cases := []struct {
		name       string
		typ        quant.Type
		rows, cols int
		sel        int // selections, each its own matrix and activation (the grouped wo_a); 0: one
	}{
		{"q_b", quant.Q8_0, 32768, 1024, 0}, {"wo_b", quant.Q8_0, 4096, 8192, 0}, {"q_a", quant.Q8_0, 1024, 4096, 0},
		{"shexp", quant.Q8_0, 2048, 4096, 0}, {"partial", quant.Q8_0, 300, 2048, 0}, {"wo_a", quant.Q8_0, 1024, 4096, 8},
		{"wo_a partial", quant.Q8_0, 300, 2048, 3},
		{"hc_attn_fn", quant.F16, 24, 16384, 0}, {"router", quant.F16, 256, 4096, 0}, {"compressor", quant.F16, 1024, 4096, 0},
		{"ix_query", quant.F16, 512, 1024, 0},
	}
	for ci, c := range cases {
		G := max(c.sel, 1)
		mat, dw, ab := randomMats(t, d, c.typ, c.rows, c.cols, G, uint64(5300+ci))
		for _, nt := range []int{2, 3, 4} { // (three and four: deeper drafts' passes)
			// x: token-major, each token's G selections' rows (the attention's
			// output for wo_a), as act
			x := gaussian(nt*G*c.cols, uint64(5400+ci))
			act := quantizeOnDevice(t, d, c.typ, x, c.cols, nt*G)
			ldy := G*c.rows + 40 // a token's outputs: its G selections' rows, c.rows apart
			y := alloc(t, d, 4*int64(nt*ldy))
			two := func() []float32 {
				poison(t, d, y, nt*ldy)
				must(t, d.MatMulEx(0, dw, 0, G, act, int64(G)*ab, ab, 1, nt, y, int64(ldy), int64(c.rows), false))
				return download(t, d, y, nt*ldy)
			}
			got := two()
			if nt > 2 && c.typ == quant.Q8_0 { // the trees unpacked (without MVTwoPack): the same bits
				must(t, d.SetOption(OptMVTwo, DefaultMVTwo&^MVTwoPack))
				unpacked := two()
				must(t, d.SetOption(OptMVTwo, DefaultMVTwo))
				if k, ok := firstBitDiff(unpacked, got); !ok {
					t.Errorf("%s, %d tokens, trees unpacked: y[%d] = %v, packed %v", c.name, nt, k, unpacked[k], got[k])
				}
			}
			if c.typ == quant.Q8_0 { // the forms not bounded for two CTAs an SM (OptMVOcc without bit 1): the same bits
				must(t, d.SetOption(OptMVOcc, DefaultMVOcc&^1))
				unbounded := two()
				must(t, d.SetOption(OptMVOcc, DefaultMVOcc))
				if k, ok := firstBitDiff(unbounded, got); !ok {
					t.Errorf("%s, %d tokens, unbounded: y[%d] = %v, bounded %v", c.name, nt, k, unbounded[k], got[k])
				}
				// other stage counts of the few-token forms (OptMVFewNSFast):
				// other tiles, the same bits
				for _, ns := range []int{0, 4444} { // (0: the one-token products' stages)
					must(t, d.SetOption(OptMVFewNSFast, ns))
					staged := two()
					must(t, d.SetOption(OptMVFewNSFast, DefaultMVFewNSFast))
					if k, ok := firstBitDiff(staged, got); !ok {
						t.Errorf("%s, %d tokens, OptMVFewNSFast %d: y[%d] = %v, default %v", c.name, nt, ns, k, staged[k], got[k])
					}
				}
			}
			for tok := 0; tok < nt; tok++ {
				if c.typ == quant.Q8_0 {
					poison(t, d, y, ldy)
					must(t, d.MatMulEx(0, dw, 0, G, act+Ptr(int64(tok*G)*ab), int64(G)*ab, ab, 1, 1, y, int64(ldy), int64(c.rows), false))
					one := download(t, d, y, G*c.rows)
					if k, ok := firstBitDiff(got[tok*ldy:tok*ldy+G*c.rows], one); !ok {
						t.Errorf("%s %dx%d, %d tokens, token %d: row %d = %v, its one-token product %v", c.name, c.rows, c.cols, nt, tok, k, got[tok*ldy+k], one[k])
					}
				}
				for g := 0; g < G; g++ {
					xs := x[(tok*G+g)*c.cols : (tok*G+g+1)*c.cols]
					want, mag := reference(t, c.typ, mat(g), c.rows, c.cols, xs)
					o := tok*ldy + g*c.rows
					compare(t, fmt.Sprintf("%s %dx%d token %d selection %d of %d tokens", c.name, c.rows, c.cols, tok, g, nt), got[o:o+c.rows], want, mag, nterms(c.typ, c.cols))
				}
			}
			for r := G * c.rows; r < ldy; r++ { // the rows between the tokens untouched (poison)
				if !math.IsNaN(float64(got[r])) {
					t.Fatalf("%s, %d tokens: y[%d], between the tokens' rows, written: %v", c.name, nt, r, got[r])
				}
			}
			if k, ok := firstBitDiff(two(), got); !ok {
				t.Errorf("%s, %d tokens: two runs differ at %d", c.name, nt, k)
			}
			// exact mode: each token's rows its one-token exact product's (and
			// for Q8_0 quant.Dot's) bits, two tokens pipelined or on
			// k_fexact_warp (OptMVTwo's bit 2) and on the generic kernels (the
			// bit off)
			exOne := make([]float32, nt*ldy)
			for tok := 0; tok < nt; tok++ {
				poison(t, d, y, ldy)
				must(t, d.MatMulEx(0, dw, 0, G, act+Ptr(int64(tok*G)*ab), int64(G)*ab, ab, 1, 1, y, int64(ldy), int64(c.rows), true))
				copy(exOne[tok*ldy:], download(t, d, y, G*c.rows))
				// (the one-token product with its row staged a float4 a
				// thread at a time: the same bits)
				must(t, d.SetOption(OptFXLive, DefaultFXLive&^2))
				poison(t, d, y, ldy)
				must(t, d.MatMulEx(0, dw, 0, G, act+Ptr(int64(tok*G)*ab), int64(G)*ab, ab, 1, 1, y, int64(ldy), int64(c.rows), true))
				must(t, d.SetOption(OptFXLive, DefaultFXLive))
				if k, ok := firstBitDiff(download(t, d, y, G*c.rows), exOne[tok*ldy:tok*ldy+G*c.rows]); !ok {
					t.Errorf("%s exact, token %d alone, staged a float4 at a time (OptFXLive %d): row %d differs", c.name, tok, DefaultFXLive&^2, k)
				}
			}
			// (and without OptMVOcc's bit 2: the forms not bounded for two
			// CTAs an SM)
			// (and with other stage counts, OptMVFewNSEx; and the F16 rows
			// staged a float4 a thread at a time, OptFXLive without bits 2
			// and 8, or two at once, without bit 8 — the default copies
			// them by cp.async — for the tokens together and, above, alone)
			for _, v := range []struct{ opt, occ, ns, fx int }{{DefaultMVTwo, DefaultMVOcc, DefaultMVFewNSEx, DefaultFXLive}, {1, DefaultMVOcc, DefaultMVFewNSEx, DefaultFXLive},
				{DefaultMVTwo, DefaultMVOcc &^ 2, DefaultMVFewNSEx, DefaultFXLive}, {DefaultMVTwo, DefaultMVOcc, 0, DefaultFXLive}, {DefaultMVTwo, DefaultMVOcc, 4444, DefaultFXLive},
				{DefaultMVTwo, DefaultMVOcc, DefaultMVFewNSEx, DefaultFXLive &^ 10}, {DefaultMVTwo, DefaultMVOcc, DefaultMVFewNSEx, DefaultFXLive &^ 8}} {
				opt := v.opt
				must(t, d.SetOption(OptMVTwo, opt))
				must(t, d.SetOption(OptMVOcc, v.occ))
				must(t, d.SetOption(OptMVFewNSEx, v.ns))
				must(t, d.SetOption(OptFXLive, v.fx))
				poison(t, d, y, nt*ldy)
				must(t, d.MatMulEx(0, dw, 0, G, act, int64(G)*ab, ab, 1, nt, y, int64(ldy), int64(c.rows), true))
				ex := download(t, d, y, nt*ldy)
				must(t, d.SetOption(OptMVTwo, DefaultMVTwo))
				must(t, d.SetOption(OptMVOcc, DefaultMVOcc))
				must(t, d.SetOption(OptMVFewNSEx, DefaultMVFewNSEx))
				must(t, d.SetOption(OptFXLive, DefaultFXLive))
				for tok := 0; tok < nt; tok++ {
					o := tok * ldy
					if k, ok := firstBitDiff(ex[o:o+G*c.rows], exOne[o:o+G*c.rows]); !ok {
						t.Errorf("%s exact, %d tokens (OptMVTwo %d, OptMVOcc %d, OptMVFewNSEx %d, OptFXLive %d), token %d: row %d = %v, its one-token exact product %v",
							c.name, nt, opt, v.occ, v.ns, v.fx, tok, k, ex[o+k], exOne[o+k])
					}
					if c.typ != quant.Q8_0 {
						continue
					}
					for g := 0; g < G; g++ {
						want, _ := reference(t, c.typ, mat(g), c.rows, c.cols, x[(tok*G+g)*c.cols:(tok*G+g+1)*c.cols])
						o := tok*ldy + g*c.rows
						if k, ok := firstBitDiff(ex[o:o+c.rows], want); !ok {
							t.Errorf("%s exact, %d tokens (OptMVTwo %d), token %d selection %d: row %d = %v, quant.Dot's %v",
								c.name, nt, opt, tok, g, k, ex[o+k], want[k])
						}
					}
				}
				for r := G * c.rows; r < ldy; r++ {
					if !math.IsNaN(float64(ex[r])) {
						t.Fatalf("%s exact: y[%d], between the tokens' rows, written: %v", c.name, r, ex[r])
					}
				}
			}
			must(t, d.SetOption(OptMVTwo, 0))
			off := two()
			must(t, d.SetOption(OptMVTwo, DefaultMVTwo))
			for tok := 0; tok < nt; tok++ {
				for g := 0; g < G; g++ {
					xs := x[(tok*G+g)*c.cols : (tok*G+g+1)*c.cols]
					want, mag := reference(t, c.typ, mat(g), c.rows, c.cols, xs)
					o := tok*ldy + g*c.rows
					compare(t, fmt.Sprintf("%s token %d selection %d of %d generic", c.name, tok, g, nt), off[o:o+c.rows], want, mag, nterms(c.typ, c.cols))
				}
			}
		}
		d.FreeWeight(dw)
	}
}
