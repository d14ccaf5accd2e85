package cuda

import (
	"fmt"
	"math"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/model"
)

// TestIndexScoresExact holds exact mode's indexer scores of prompt chunks
// with OptIXExact 1 and 2 — the dots on the f16 tensor cores
// (k_index_flash_exact; 2 from f16 copies of the rows, k_ix_rows_half),
// each kept where its query head's and row's exponent spans make it exact
// in float, formed again in dotRef's operations where not, the heads added
// in order — to the CPU's operations bit for bit, on five kinds of input:
// the model's (queries and rows through the FP4 simulation: e2m1 values
// times a power-of-two block scale), gaussian ones (more mantissa bits than
// e2m1's: every dot fails the check), FP4 ones with one block of every
// seventh row scaled by 2^20 (past what f16 holds: those rows' dots fail,
// the others pass), FP4 rows whose blocks are scaled by 2^0 … 2^5 at
// random (spans on both sides of the check's limit: dots kept with the
// widest spans it allows, where the tensor cores' FP32 accumulation must
// still be exact) and rows built at the check's limit whose dots need every
// one of float's 24 bits (ixEdgeRows). OptIXExact 5 and 6 (1 and 2 with
// bit 4) make a dot that fails the check +inf, so they show which path
// each took: no score of the FP4 or edge inputs non-finite (all kept),
// every gaussian one non-finite, on the scaled kind exactly the scaled
// rows' scores, on the spread kind some of each (logged). Option 0 (the CUDA cores' FP32 tiles) is held to the
// same bits.
func TestIndexScoresExact(t *testing.T) {
	d := gpu(t)
	const IH, IHD, ratio = 64, 128, 4
	t.Cleanup(func() { d.SetOption(OptIXExact, DefaultIXExact) })
	for _, c := range []struct {
		pos0, n int
		kind    string
	}{{300, 40, "fp4"}, {1000, 71, "fp4"}, {31, 9, "fp4"}, {300, 40, "gauss"}, {1000, 71, "wide"}, {2000, 64, "spread"},
		{9000, 8, "spread"}, {3000, 16, "edge"}} {
		maxR := (c.pos0 + c.n) / ratio
		q := gaussian(c.n*IH*IHD, uint64(c.pos0+c.n))
		w := gaussian(c.n*IH, 7)
		rows := gaussian(maxR*IHD, 9)
		qp, wp, rp := tempUpload(t, d, q), tempUpload(t, d, w), tempUpload(t, d, rows)
		scaled := func(i int) bool { return c.kind == "wide" && i%7 == 3 }
		if c.kind == "edge" { // (ixEdgeRows: built at the check's limit, not FP4-simulated)
			q, rows = ixEdgeRows(c.n*IH, -4), ixEdgeRows(maxR, -5)
			qp, rp = tempUpload(t, d, q), tempUpload(t, d, rows)
		} else if c.kind != "gauss" {
			must(t, d.FP4Sim(0, qp, IHD, c.n*IH, IHD))
			must(t, d.FP4Sim(0, rp, IHD, maxR, IHD))
			q, rows = download(t, d, qp, len(q)), download(t, d, rp, len(rows))
			if c.kind == "wide" { // (still e2m1 values times a power of two)
				for i := 0; i < maxR; i++ {
					if scaled(i) {
						for j := 32; j < 64; j++ {
							rows[i*IHD+j] *= 0x1p20
						}
					}
				}
				rp = tempUpload(t, d, rows)
			}
			if c.kind == "spread" {
				sc := gaussian(maxR*IHD/32, 11)
				for i := range rows {
					rows[i] = float32(math.Ldexp(float64(rows[i]), int(math.Abs(float64(sc[i/32]))*2.5)%6))
				}
				rp = tempUpload(t, d, rows)
			}
		}
		want := indexRefs(q, rows, w, c.pos0, c.n, ratio, maxR, IH, IHD).want
		for _, fm := range []int{0, 1, 2, 5, 6} {
			must(t, d.SetOption(OptIXExact, fm))
			scores := tempAlloc(t, d, int64(4*c.n*maxR))
			poison(t, d, scores, c.n*maxR)
			must(t, d.IndexScores(0, qp, wp, rp, IH, IHD, c.pos0, ratio, c.n, scores, int64(maxR), false))
			got := download(t, d, scores, c.n*maxR)
			fused, failed := 0, 0
			for tok := 0; tok < c.n; tok++ {
				for i := 0; i < (c.pos0+tok+1)/ratio; i++ {
					g, wt := got[tok*maxR+i], want[tok*maxR+i]
					if fm&4 == 0 {
						if math.Float32bits(g) != math.Float32bits(wt) {
							t.Fatalf("%s, pos0 %d, %d tokens, ix_exact %d: token %d row %d: %v, want %v", c.kind, c.pos0, c.n, fm, tok, i, g, wt)
						}
						continue
					}
					inf := math.IsInf(float64(g), 0) || math.IsNaN(float64(g))
					switch {
					case c.kind == "spread":
						if !inf && math.Float32bits(g) != math.Float32bits(wt) {
							t.Fatalf("spread, pos0 %d, %d tokens, ix_exact %d: token %d row %d: kept %v, want %v", c.pos0, c.n, fm, tok, i, g, wt)
						}
					case c.kind == "gauss" && !inf:
						t.Fatalf("gaussian inputs, ix_exact %d: token %d row %d: %v kept (more mantissa bits than e2m1's must fail)", fm, tok, i, g)
					case c.kind != "gauss" && inf != scaled(i):
						t.Fatalf("%s, pos0 %d, %d tokens, ix_exact %d: token %d row %d: %v (scaled %v)", c.kind, c.pos0, c.n, fm, tok, i, g, scaled(i))
					case !inf && math.Float32bits(g) != math.Float32bits(wt):
						t.Fatalf("%s, pos0 %d, %d tokens, ix_exact %d: token %d row %d: kept %v, want %v", c.kind, c.pos0, c.n, fm, tok, i, g, wt)
					}
					if inf {
						failed++
					} else {
						fused++
					}
				}
			}
			if fm&4 != 0 {
				t.Logf("%s, pos0 %d, %d tokens, ix_exact %d: %d scores with every dot kept, %d with dots formed again", c.kind, c.pos0, c.n, fm, fused, failed)
				if c.kind == "spread" && (fused == 0 || failed == 0) {
					t.Errorf("spread, pos0 %d, %d tokens: %d kept, %d formed again: want some of each", c.pos0, c.n, fused, failed)
				}
			}
		}
	}
}

// ixEdgeRows returns n rows of 128 values, each 6 (1.1b·2^2) but for one
// 1.5·2^e at position 16(x%8) + 5(x%8)%16 of row x. A query head's row of
// e = -4 and a compressed row of e = -5 have spans 6 and 7: their sum 13
// is the check's limit, so the dot is kept, and where the two odd values
// meet (h%8 == r%8) it is 127·36 + 2.25·2^-9, whose bits run from 2^12 to
// 2^-11: all 24 of float's, the worst case of the argument, which an adder
// keeping fewer bits below its largest addend gets wrong
// (TestIXSpanExactSound checks the construction on the CPU).
func ixEdgeRows(n, e int) []float32 {
	x := make([]float32, n*128)
	for r := 0; r < n; r++ {
		for i := 0; i < 128; i++ {
			x[r*128+i] = 6
		}
		x[r*128+16*(r%8)+5*(r%8)%16] = float32(math.Ldexp(1.5, e))
	}
	return x
}

// TestFlashLayersIndexerExact runs Flash-shaped layers (flashLayers4's:
// the ratio-4 layer's indexer has Flash's 64 heads of 128, its top-k
// lowered to 8 so that it chooses from the 9th compressed row on) in exact
// mode through prompt chunks of 16 tokens, with OptIXExact 0, 1, 2, 5 and
// 6: the logits of every row must be the same bits under all five, and
// within the reference bounds of the CPU's. Options 5 and 6 turn a dot
// that fails the exactness check into +inf (a different choice of rows,
// different logits), so equal logits there say that every dot of the model's own
// FP4-simulated queries and rows passed the check and was kept from the
// tensor cores.
func TestFlashLayersIndexerExact(t *testing.T) {
	d := gpu(t)
	if testing.Short() {
		t.Skip("short")
	}
	c := flash4(8)
	w := synthWeights(t, c, model.SchemeQ2)
	toks := testTokens(96, c.Vocab)
	ref, err := cpu.New(w, cpu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	want := allLogits(t, ref, 16, toks)
	be := testBackend(t, w, Options{})
	t.Cleanup(func() { d.SetOption(OptIXExact, DefaultIXExact) })
	var base [][]float32
	for _, v := range []int{0, 1, 2, 5, 6} {
		must(t, d.SetOption(OptIXExact, v))
		got := allLogits(t, be, 16, toks)
		checkAgree(t, fmt.Sprintf("ix_exact %d", v), want, got)
		if base == nil {
			base = got
			continue
		}
		for p := range got {
			for i := range got[p] {
				if math.Float32bits(got[p][i]) != math.Float32bits(base[p][i]) {
					t.Fatalf("ix_exact %d: token %d logit %d: %v, want option 0's %v", v, p, i, got[p][i], base[p][i])
				}
			}
		}
	}
}
