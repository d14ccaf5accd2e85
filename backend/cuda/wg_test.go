package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"ds4go/quant"
)

// halfTerms decodes one row of IQ2_XXS or Q2_K weights into its values w
// (exact, in float64) and, per value, the magnitude m that bounds the f16
// dequantization of MatMulGroupedHalf: IQ2_XXS |w| (d·(2s+1) rounded to
// f16, then its product with the grid magnitude: two roundings of
// relative 2^-11); Q2_K |d·sc·q| + |dmin·m| (the two f16 scale terms and
// the fused multiply-add's result, each rounded once).
func halfTerms(t testing.TB, typ quant.Type, row []byte, cols int) (w, m []float64) {
	t.Helper()
	w, m = make([]float64, cols), make([]float64, cols)
	switch typ {
	case quant.IQ2_XXS:
		buf := make([]float32, cols)
		must(t, quant.Dequantize(typ, row, buf)) // exact: d·(2s+1)/8·g needs 22 bits
		for i, v := range buf {
			w[i], m[i] = float64(v), math.Abs(float64(v))
		}
	case quant.Q2_K:
		for b := 0; b < cols/256; b++ {
			blk := row[84*b : 84*(b+1)]
			d := float64(quant.F16ToF32(binary.LittleEndian.Uint16(blk[80:])))
			dmin := float64(quant.F16ToF32(binary.LittleEndian.Uint16(blk[82:])))
			for i := 0; i < 256; i++ {
				h, j, l := i/128, (i%128)/32, i%32 // half, plane, value in the plane
				q := float64((blk[16+32*h+l] >> (2 * j)) & 3)
				sc := blk[8*h+2*j+l/16]
				a, c := d*float64(sc&15)*q, dmin*float64(sc>>4)
				w[256*b+i], m[256*b+i] = a-c, math.Abs(a)+math.Abs(c)
			}
		}
	default:
		t.Fatalf("halfTerms: type %s", typ)
	}
	return w, m
}

// bigScalesIQ2 returns a randomMatsEdit edit for IQ2_XXS matrices: every
// third block's scale d set in [2, 24) (seeded), so that sub-block scales
// d·(2s+1) reach 744, past what the fused f16 decode (1024 + g)·s − 1024·s
// holds, and the RS kernels take their unfused form for those blocks' warps.
func bigScalesIQ2(seed uint64) func(w []byte) {
	return func(w []byte) {
		r := rand.New(rand.NewPCG(seed, 9))
		bb := quant.IQ2_XXS.BlockBytes()
		for b := 0; b*bb < len(w); b += 3 {
			binary.LittleEndian.PutUint16(w[b*bb:], quant.F32ToF16(float32(2+22*r.Float64())))
		}
	}
}

// TestGroupedHalf checks fast mode's wgmma products of grouped selections
// (MatMulGroupedHalf: f16 activations, weights dequantized to f16) against
// float64 sums over the exact weights and the same f16 activations. The
// bound, per output: 1.5e-3 · Σ m_i·|x_i| (halfTerms' m): the f16 weights'
// rounding (≤ 2·2^-11 of m) plus f32 sums of up to 2048 terms in any order
// (≤ 2048·2^-24); a wrong byte, scale, sign, slot or tile breaks it by
// orders of magnitude. Tiles of at most 64 selections (m64n64), of more
// (m64n128) and experts over two tiles; row counts that leave part of the
// last 256-row block empty; an id out of range gives NaN rows.
func TestGroupedHalf(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptWGMoE, DefaultWGMoE) })
	must(t, d.SetOption(OptWGMoE, 1))
	if inf := d.Info(); !d.GroupedHalfOK(quant.IQ2_XXS, 256, 1024) {
		if inf.Major == 9 && inf.Minor == 0 {
			t.Fatalf("no wgmma product on %s (compute capability 9.0): library built without sm_90a code? (scripts/cuda/build-lib.sh)", inf.Name)
		}
		t.Skipf("no wgmma product on %s (compute capability %d.%d)", inf.Name, inf.Major, inf.Minor)
	}
	variants := []int{1, 2, 3, 4, 5, 6, 7}
	if env := os.Getenv("DS4_CUDA_TEST_WG"); env != "" { // e.g. "4", one variant (compute-sanitizer runs)
		variants = nil
		for _, f := range strings.Split(env, ",") {
			v, err := strconv.Atoi(f)
			must(t, err)
			variants = append(variants, v)
		}
	}
	for _, v := range variants {
		must(t, d.SetOption(OptWGMoE, v))
		t.Run(fmt.Sprintf("wg_moe=%d", v), func(t *testing.T) { groupedHalfCases(t, d, v) })
	}
}

// groupedHalfCases runs TestGroupedHalf's cases with OptWGMoE v (set).
func groupedHalfCases(t *testing.T, d *Device, v int) {
	cases := []struct {
		typ        quant.Type
		rows, cols int
		big        bool // IQ2_XXS: every third block's d in [2, 24) (the RS kernels' unfused decode)
	}{
		{quant.IQ2_XXS, 300, 512, false},
		{quant.IQ2_XXS, 520, 2048, false},
		{quant.Q2_K, 300, 512, false},
		{quant.Q2_K, 520, 2048, false},
		{quant.IQ2_XXS, 264, 1024, true},
	}
	worst := 0.0
	for ci, c := range cases {
		if v == 3 && c.typ == quant.Q2_K { // variant 3 leaves Q2_K to the int8 kernels
			if d.GroupedHalfOK(c.typ, c.cols, 1024) {
				t.Errorf("wg_moe 3 offers the wgmma product for Q2_K")
			}
			continue
		}
		if c.big && v < 5 { // (the other variants' large-scale forms are not checked here)
			continue
		}
		const mats, K = 5, 3
		var edit func([]byte)
		if c.big {
			edit = bigScalesIQ2(uint64(4100 + ci))
		}
		mat, dw, _ := randomMatsEdit(t, d, c.typ, c.rows, c.cols, mats, uint64(4100+ci), edit)
		rb := int(weightBytes(c.typ, 1, c.cols))
		// The rows checked: both ends, and three of every 37 (every warp's
		// lanes and both halves of its m16 tiles across the row blocks).
		var checked []int
		for k := 0; k < c.rows; k++ {
			if k < 16 || k >= c.rows-16 || k%37 < 3 {
				checked = append(checked, k)
			}
		}
		terms := make([]map[int][2][]float64, mats) // matrix → row → (w, m)
		for m := range terms {
			terms[m] = map[int][2][]float64{}
			for _, k := range checked {
				wr, mr := halfTerms(t, c.typ, mat(m)[k*rb:(k+1)*rb], c.cols)
				terms[m][k] = [2][]float64{wr, mr}
			}
		}
		for _, ntok := range []int{40, 150, 400} { // ≈ 24, 90, 240 selections an expert
			nsel := ntok * K
			lay := d.GroupedHalf(c.typ, c.cols, nsel)
			if want := map[bool]HalfLayout{false: HalfRows, true: HalfPerm32}[v >= 5]; lay != want {
				t.Fatalf("%s %d columns, %d selections: GroupedHalf %d, want %d", c.typ, c.cols, nsel, lay, want)
			}
			ids, idp, grp := groupedIDs(t, d, nsel, mats, uint64(ci), uint64(ntok)) // the middle id out of range
			for _, div := range []int{K, 1} {
				na := nsel / div
				x := gaussian(na*c.cols, uint64(4200+ci+ntok+div))
				xh := make([]float64, len(x)) // what ToHalf makes of x
				for i, v := range x {
					xh[i] = float64(quant.F16ToF32(quant.F32ToF16(v)))
				}
				act := alloc(t, d, int64(2*na*c.cols))
				must(t, d.ToHalfAs(0, upload(t, d, x), c.cols, c.cols, na, act, lay))
				ys := int64(c.rows + 5)
				y := alloc(t, d, 4*ys*int64(nsel))
				poison(t, d, y, int(ys)*nsel)
				must(t, d.MatMulGroupedHalf(0, dw, idp, nsel, act, int64(2*c.cols), div, y, ys, grp))
				got := download(t, d, y, int(ys)*nsel)
				var mu sync.Mutex
				bad := 0
				parallel(nsel, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						row := got[int64(i)*ys : int64(i)*ys+int64(c.rows)]
						name := fmt.Sprintf("%s %dx%d nsel=%d div=%d sel %d", c.typ, c.rows, c.cols, nsel, div, i)
						if ids[i] == mats {
							for k, v := range row {
								if !math.IsNaN(float64(v)) {
									mu.Lock()
									t.Errorf("%s (id out of range): row %d = %v, want NaN", name, k, v)
									bad++
									mu.Unlock()
									break
								}
							}
							continue
						}
						xa := xh[(i/div)*c.cols : (i/div+1)*c.cols]
						for _, k := range checked {
							tm := terms[int(ids[i])][k]
							var want, mag float64
							for j, v := range xa {
								want += tm[0][j] * v
								mag += tm[1][j] * math.Abs(v)
							}
							e := math.Abs(float64(row[k])-want) / (mag + 1e-30)
							mu.Lock()
							worst = max(worst, e)
							if !(e <= 1.5e-3) {
								if bad < 3 {
									t.Errorf("%s row %d: got %v, want %v (error %.3g of Σ m·|x| = %.4g)", name, k, row[k], want, e, mag)
								}
								bad++
							}
							mu.Unlock()
						}
					}
				})
				if bad > 0 {
					t.Errorf("%s %dx%d nsel=%d div=%d: %d outputs beyond the bound", c.typ, c.rows, c.cols, nsel, div, bad)
				}
			}
		}
	}
	t.Logf("grouped f16 products: largest error %.3g of Σ m·|x| (bound 1.5e-3)", worst)
}

// TestToHalfPerm32 checks ToHalfAs's permuted layout (HalfPerm32) value by
// value against its definition: position 16s+8h+2q+e of each 32-value
// block holds value 8q+4s+2h+e of the row, rounded to f16 (saturated), on
// rows ld floats apart; and that a layout it cannot write is refused.
func TestToHalfPerm32(t *testing.T) {
	d := gpu(t)
	const cols, ntok, ld = 96, 5, 100
	x := gaussian(ntok*ld, 77)
	x[3], x[ld+40] = 1e6, -7e4 // saturated
	xh := alloc(t, d, 2*cols*ntok)
	must(t, d.ToHalfAs(0, upload(t, d, x), ld, cols, ntok, xh, HalfPerm32))
	raw := make([]byte, 2*cols*ntok)
	must(t, d.Synchronize())
	must(t, d.Download(raw, xh))
	bad := 0
	for tok := 0; tok < ntok; tok++ {
		for pos := 0; pos < cols; pos++ {
			l := pos % 32
			s, h, q, e := l>>4, (l>>3)&1, (l>>1)&3, l&1
			src := pos - l + 8*q + 4*s + 2*h + e
			want := quant.F32ToF16(halfSat(x[tok*ld+src]))
			if got := binary.LittleEndian.Uint16(raw[2*(tok*cols+pos):]); got != want && bad < 5 {
				t.Errorf("token %d position %d: got f16 %#04x, want %#04x (value %d)", tok, pos, got, want, src)
				bad++
			}
		}
	}
	if err := d.ToHalfAs(0, upload(t, d, x), ld, 40, 2, xh, HalfPerm32); err == nil {
		t.Errorf("ToHalfAs HalfPerm32 with 40 columns: no error")
	}
}

// swigluInputs draws n gate values (gaussian, seed, times 6: many past
// the clamps the tests use) and n up values (gaussian, seed + 1).
func swigluInputs(n int, seed uint64) (g, u []float32) {
	g, u = gaussian(n, seed), gaussian(n, seed+1)
	for i := range g {
		g[i] *= 6
	}
	return g, u
}

// TestSwiGLUHalf checks SwiGLUHalf against SwiGLURef's values rounded by
// ToHalfAs, in both layouts, with and without the clamp and the per-row
// weights: its float silu is within a few float ulps of the reference's,
// so each f16 is the same or one f16 ulp (2^-10 of it) away; a value from
// the wrong position, row or weight is off by O(1).
func TestSwiGLUHalf(t *testing.T) {
	d := gpu(t)
	const n, rows = 160, 7
	g, u := swigluInputs(n*rows, 91)
	g[5], u[9] = 3e4, 2e4 // a product past f16's range (saturated)
	wts := gaussian(rows, 93)
	dg, du, dw := upload(t, d, g), upload(t, d, u), upload(t, d, wts)
	ref := alloc(t, d, 4*n*rows)
	want, got := alloc(t, d, 2*n*rows), alloc(t, d, 2*n*rows)
	for _, lay := range []HalfLayout{HalfRows, HalfPerm32} {
		for _, lim := range []float32{0, 7} {
			for _, w := range []Ptr{0, dw} {
				must(t, d.SwiGLURef(0, dg, du, ref, n, rows, lim, w))
				must(t, d.ToHalfAs(0, ref, n, n, rows, want, lay))
				must(t, d.SwiGLUHalf(0, dg, du, got, n, rows, lim, w, lay))
				a, b := make([]byte, 2*n*rows), make([]byte, 2*n*rows)
				must(t, d.Synchronize())
				must(t, d.Download(a, want))
				must(t, d.Download(b, got))
				same := 0
				for i := 0; i < n*rows; i++ {
					wa := quant.F16ToF32(binary.LittleEndian.Uint16(a[2*i:]))
					gb := quant.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
					if wa == gb {
						same++
					} else if diff := math.Abs(float64(gb - wa)); !(diff <= math.Abs(float64(wa))/1024+1e-7) {
						t.Errorf("layout %d, clamp %g, weights %v: value %d = %v, want %v", lay, lim, w != 0, i, gb, wa)
						break
					}
				}
				if same < n*rows*9/10 {
					t.Errorf("layout %d, clamp %g, weights %v: only %d of %d values equal to the reference's", lay, lim, w != 0, same, n*rows)
				}
			}
		}
	}
}

// TestSwiGLUQ8K checks SwiGLUQ8K byte for byte against SwiGLURef followed
// by Quantize to Q8_K, with and without the clamp and the per-row weights,
// on rows with a tie for the largest magnitude, an all-zero block and
// magnitudes past the clamp; its fast form within one quant step.
func TestSwiGLUQ8K(t *testing.T) {
	d := gpu(t)
	const n, rows = 2048, 7
	g, u := swigluInputs(n*rows, 94)
	for i := 256; i < 512; i++ { // row 0, block 1: all zero
		g[i], u[i] = 0, 0
	}
	g[n+3], u[n+3], g[n+40], u[n+40] = 5, 4, 5, 4 // row 1: a tie
	wts := gaussian(rows, 96)
	dg, du, dw := upload(t, d, g), upload(t, d, u), upload(t, d, wts)
	ab := d.ActBytes(quant.Q8_K, n)
	ref := alloc(t, d, 4*n*rows)
	want, got := alloc(t, d, ab*rows), alloc(t, d, ab*rows)
	for _, lim := range []float32{0, 7} {
		for _, w := range []Ptr{0, dw} {
			must(t, d.SwiGLURef(0, dg, du, ref, n, rows, lim, w))
			must(t, d.Quantize(0, quant.Q8_K, ref, n, want, n, rows))
			must(t, d.MemsetAsync(got, 0x5a, ab*rows, 0))
			must(t, d.SwiGLUQ8K(0, dg, du, got, ab, n, rows, lim, w, false))
			a, b := make([]byte, ab*rows), make([]byte, ab*rows)
			must(t, d.Synchronize())
			must(t, d.Download(a, want))
			must(t, d.Download(b, got))
			if i := firstByteDiff(a, b); i >= 0 {
				t.Errorf("clamp %g, weights %v: byte %d (row %d) = %#x, want %#x", lim, w != 0, i, int64(i)/ab, b[i], a[i])
			}
			// fast mode's values: the same scales within float rounding,
			// each quant the same or one step away
			must(t, d.SwiGLUQ8K(0, dg, du, got, ab, n, rows, lim, w, true))
			must(t, d.Synchronize())
			must(t, d.Download(b, got))
			nb := n / 256
			for r := 0; r < rows; r++ {
				ra, rb := a[int64(r)*ab:int64(r+1)*ab], b[int64(r)*ab:int64(r+1)*ab]
				for k := 0; k < nb; k++ {
					da := math.Float32frombits(binary.LittleEndian.Uint32(ra[n+4*k:]))
					db := math.Float32frombits(binary.LittleEndian.Uint32(rb[n+4*k:]))
					if math.Abs(float64(da-db)) > 1e-5*math.Abs(float64(da)) {
						t.Errorf("fast, clamp %g, weights %v: row %d block %d scale %g, exact %g", lim, w != 0, r, k, db, da)
					}
				}
				for i := 0; i < n; i++ {
					if q := int(int8(ra[i])) - int(int8(rb[i])); q < -1 || q > 1 {
						t.Fatalf("fast, clamp %g, weights %v: row %d value %d quant %d, exact %d", lim, w != 0, r, i, int8(rb[i]), int8(ra[i]))
					}
				}
			}
		}
	}
	if err := d.SwiGLUQ8K(0, dg, du, got, ab, 200, 1, 0, 0, false); err == nil {
		t.Errorf("SwiGLUQ8K with 200 values a row: no error")
	}
}

// TestMatMulGroupedSwiGLU checks MatMulGroupedSwiGLU (a routed down
// product that forms its Q8_K activation from the gate and up rows) bit
// for bit against SwiGLUQ8K then MatMulGrouped, in both modes, with and
// without the clamp: decode's few selections (k_mv_dec's prologue, the
// activation buffer left unwritten) with rows that put a CTA's warps in one
// or two selections and in up to four, with OptMVDec off (the two
// launches), and a chunk's many selections (the tensor-core call); one id
// out of range (NaN rows).
func TestMatMulGroupedSwiGLU(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptMVDec, DefaultMVDec) })
	const mats = 9
	for ci, c := range []struct {
		typ        quant.Type
		rows, cols int
	}{{quant.Q2_K, 4096, 2048}, {quant.IQ2_XXS, 4096, 2048}, {quant.Q2_K, 3, 4096}, {quant.IQ2_XXS, 5, 2048}} {
		_, dw, ab := randomMats(t, d, c.typ, c.rows, c.cols, mats, uint64(3700+ci))
		for _, nsel := range []int{6, 1, 40} {
			_, idp, grp := groupedIDs(t, d, nsel, mats, uint64(ci), uint64(nsel))
			g, u := swigluInputs(nsel*c.cols, uint64(3800+ci))
			dg, du, dwt := upload(t, d, g), upload(t, d, u), upload(t, d, gaussian(nsel, uint64(3900+ci)))
			ref, act := alloc(t, d, ab*int64(nsel)), alloc(t, d, ab*int64(nsel))
			ys := int64(c.rows + 3)
			want, got := alloc(t, d, 4*ys*int64(nsel)), alloc(t, d, 4*ys*int64(nsel))
			for _, dec := range []int{DefaultMVDec, 0} {
				must(t, d.SetOption(OptMVDec, dec))
				for _, exact := range []bool{true, false} {
					for _, lim := range []float32{0, 7} {
						name := fmt.Sprintf("%s %dx%d nsel %d mv_dec %d exact %v clamp %g", c.typ, c.rows, c.cols, nsel, dec, exact, lim)
						must(t, d.SwiGLUQ8K(0, dg, du, ref, ab, c.cols, nsel, lim, dwt, !exact))
						poison(t, d, want, int(ys)*nsel)
						poison(t, d, got, int(ys)*nsel)
						must(t, d.MatMulGrouped(0, dw, idp, nsel, ref, ab, 1, want, ys, grp, exact))
						must(t, d.MemsetAsync(act, 0x5a, ab*int64(nsel), 0))
						must(t, d.MatMulGroupedSwiGLU(0, dw, idp, nsel, dg, du, lim, dwt, act, got, ys, grp, exact))
						a, b := download(t, d, want, int(ys)*nsel), download(t, d, got, int(ys)*nsel)
						if i, same := firstBitDiff(a, b); !same {
							t.Fatalf("%s: selection %d row %d: got %v, want %v", name, int64(i)/ys, int64(i)%ys, b[i], a[i])
						}
						// the activation is formed in the product's CTAs
						// exactly where k_mv_dec takes it
						raw := make([]byte, ab*int64(nsel))
						must(t, d.Download(raw, act))
						untouched := true
						for _, v := range raw {
							untouched = untouched && v == 0x5a
						}
						if fused := dec != 0 && nsel < 32; untouched != fused {
							t.Errorf("%s: activation buffer untouched %v, want %v", name, untouched, fused)
						}
					}
				}
			}
		}
		d.FreeWeight(dw)
	}
	if err := d.MatMulGroupedSwiGLU(0, &Weight{Type: quant.Q8_0, Rows: 8, Cols: 1024, Mats: 1}, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, true); err == nil {
		t.Errorf("MatMulGroupedSwiGLU of Q8_0 weights (Q8_0 activations): no error")
	}
}

// TestGroupedGLU checks MatMulGroupedGLU (the routed gate and up products
// in one launch with SwiGLU in its epilogue) bit for bit against
// MatMulGroupedHalf of gate and up then SwiGLUHalf, for both expert types,
// row counts of 2 and 3 CTA row blocks, tiles of a few and of more than 128
// selections (two tiles a matrix), with and without the clamp, and both
// output layouts; also that GroupedGLUOK follows its conditions.
func TestGroupedGLU(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptWGMoE, DefaultWGMoE); d.SetOption(OptWGGLU, 1) })
	must(t, d.SetOption(OptWGMoE, DefaultWGMoE))
	if !d.GroupedHalfOK(quant.IQ2_XXS, 512, 1024) {
		t.Skip("no wgmma product on this device")
	}
	if !d.GroupedGLUOK(quant.IQ2_XXS, 256, 512, 1024) || d.GroupedGLUOK(quant.IQ2_XXS, 200, 512, 1024) {
		t.Errorf("GroupedGLUOK: want rows a multiple of 128")
	}
	must(t, d.SetOption(OptWGGLU, 0))
	if d.GroupedGLUOK(quant.IQ2_XXS, 256, 512, 1024) {
		t.Errorf("GroupedGLUOK with OptWGGLU 0")
	}
	must(t, d.SetOption(OptWGGLU, 1))
	must(t, d.SetOption(OptWGMoE, 3))
	if d.GroupedGLUOK(quant.IQ2_XXS, 256, 512, 1024) {
		t.Errorf("GroupedGLUOK with OptWGMoE 3")
	}
	must(t, d.SetOption(OptWGMoE, DefaultWGMoE))
	const mats, K, cols = 3, 2, 512
	for ci, c := range []struct {
		typ  quant.Type
		rows int
	}{{quant.IQ2_XXS, 256}, {quant.Q2_K, 384}} {
		_, gate, _ := randomMats(t, d, c.typ, c.rows, cols, mats, uint64(4300+ci))
		_, up, _ := randomMats(t, d, c.typ, c.rows, cols, mats, uint64(4400+ci))
		for _, ntok := range []int{40, 300} { // ≈ 27 and 200 selections a matrix
			nsel := ntok * K
			r := rand.New(rand.NewPCG(uint64(ci), uint64(ntok)))
			ids := make([]int32, nsel)
			for i := range ids {
				ids[i] = int32(r.IntN(mats))
			}
			idp := alloc(t, d, int64(4*nsel))
			must(t, UploadSlice(d, idp, ids))
			grp := alloc(t, d, d.GroupBytes(nsel, mats))
			must(t, d.Group(0, idp, nsel, mats, grp))
			xh := alloc(t, d, int64(2*ntok*cols))
			must(t, d.ToHalfAs(0, upload(t, d, gaussian(ntok*cols, uint64(4500+ntok))), cols, cols, ntok, xh, HalfPerm32))
			wts := upload(t, d, gaussian(nsel, uint64(4600+ntok)))
			ge, ue := alloc(t, d, int64(4*nsel*c.rows)), alloc(t, d, int64(4*nsel*c.rows))
			must(t, d.MatMulGroupedHalf(0, gate, idp, nsel, xh, int64(2*cols), K, ge, int64(c.rows), grp))
			must(t, d.MatMulGroupedHalf(0, up, idp, nsel, xh, int64(2*cols), K, ue, int64(c.rows), grp))
			for _, lim := range []float32{0, 2} {
				for _, lay := range []HalfLayout{HalfPerm32, HalfRows} {
					want, got := alloc(t, d, int64(2*nsel*c.rows)), alloc(t, d, int64(2*nsel*c.rows))
					poison(t, d, got, nsel*c.rows/2)
					must(t, d.SwiGLUHalf(0, ge, ue, want, c.rows, nsel, lim, wts, lay))
					must(t, d.MatMulGroupedGLU(0, gate, up, idp, nsel, xh, int64(2*cols), K, wts, lim, got, lay, grp))
					w, g := make([]uint16, nsel*c.rows), make([]uint16, nsel*c.rows)
					must(t, DownloadSlice(d, w, want))
					must(t, DownloadSlice(d, g, got))
					if n := countHalfDiff(w, g); n != 0 {
						i := 0
						for w[i] == g[i] {
							i++
						}
						t.Errorf("%s %d rows, %d selections, clamp %v, layout %d: %d of %d values differ from the products and SwiGLUHalf (first: selection %d, position %d: %#04x, want %#04x)", c.typ, c.rows, nsel, lim, lay, n, len(w), i/c.rows, i%c.rows, g[i], w[i])
					}
					d.Free(want)
					d.Free(got)
				}
			}
		}
	}
}
