package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"testing"

	"ds4go/quant"
)

// TestPrefillProducts times the tensor-core products of one prefill chunk
// on Flash's shapes (DS4_CUDA_BENCH=1): the routed experts' grouped
// products (2048 tokens, or DS4_CUDA_BENCH_GTOK, × 6 distinct random
// experts of 256: IQ2_XXS gate,
// Q2_K down, each OptTCStage variant) and dense Q8_0 products of 2048
// tokens (each OptTCQ8W variant), exact F16 products of 2048 tokens on four
// Flash shapes, and the quantization of two chunk-sized
// activations (each OptQuantVec variant), a chunk's attention and indexer
// scores in exact and fast mode. It prints µs a call and the
// multiply-adds' rate (T MAC/s, useful products only). DS4_CUDA_BENCH_TC
// (a regex) keeps only the rows whose name matches, e.g. for one launch
// under ncu.
func TestPrefillProducts(t *testing.T) {
	if os.Getenv("DS4_CUDA_BENCH") == "" {
		t.Skip("set DS4_CUDA_BENCH=1 to run the prefill products' benchmark")
	}
	d := gpu(t)
	gt := newGraphTimer(t, d)
	s := gt.s
	keep := regexp.MustCompile(os.Getenv("DS4_CUDA_BENCH_TC"))
	t.Cleanup(func() { d.SetOption(OptTCStage, 3) })
	const (
		ntok  = 2048
		k     = 6
		mats  = 256
		calls = 4 // launches per timed graph
	)
	// The grouped rows' tokens: ntok, or DS4_CUDA_BENCH_GTOK (fast mode
	// prefills in chunks of 4096: ≈ 96 selections an expert instead of 48).
	gtok := ntok
	if v := os.Getenv("DS4_CUDA_BENCH_GTOK"); v != "" {
		n, err := strconv.Atoi(v)
		must(t, err)
		gtok = n
	}
	emit := func(line string) {
		t.Log(line)
		fmt.Println(line)
	}
	report := func(name string, macs float64, us float64) {
		emit(fmt.Sprintf("prefill product %-44s %9.1f µs %7.1f T MAC/s", name, us, macs/us/1e6))
	}
	// plain times calls launches on s without a graph (MatMulHalf refuses
	// captured streams): µs a call, as gt.time.
	plain := func(launch func() error) float64 {
		return gt.rounds(calls, func() {
			for i := 0; i < calls; i++ {
				must(t, launch())
			}
		})
	}
	t.Cleanup(func() { d.SetOption(OptHalfMM, DefaultHalfMM) })
	// grouped: gtok tokens × k distinct random experts, drawn evenly or,
	// with DS4_CUDA_BENCH_SKEW=s, with weights ∝ 1/(1+e)^s (Zipf), the
	// uneven routing of a real prompt (more tiles for the same selections)
	r := rand.New(rand.NewPCG(51, 52))
	ids := make([]int32, gtok*k)
	skew := 0.0
	if v := os.Getenv("DS4_CUDA_BENCH_SKEW"); v != "" {
		var err error
		skew, err = strconv.ParseFloat(v, 64)
		must(t, err)
	}
	cum := make([]float64, mats)
	for e := range mats {
		cum[e] = math.Pow(float64(1+e), -skew)
		if e > 0 {
			cum[e] += cum[e-1]
		}
	}
	for i := 0; i < gtok; i++ {
		row := ids[i*k : (i+1)*k]
		for j := range row {
			for {
				e := int32(sort.SearchFloat64s(cum, r.Float64()*cum[mats-1]))
				if !slices.Contains(row[:j], e) {
					row[j] = e
					break
				}
			}
		}
	}
	nsel := len(ids)
	per := make([]int, mats)
	for _, e := range ids {
		per[e]++
	}
	tiles := 0
	for _, c := range per {
		tiles += (c + groupTile - 1) / groupTile
	}
	emit(fmt.Sprintf("prefill products: %d selections over %d experts (skew %g): %d tiles of up to %d, most %d an expert", nsel, mats, skew, tiles, groupTile, slices.Max(per)))
	idp := alloc(t, d, int64(4*nsel))
	must(t, UploadSlice(d, idp, ids))
	grp := alloc(t, d, d.GroupBytes(nsel, mats))
	must(t, d.Group(0, idp, nsel, mats, grp))
	grouped := func(name string, typ quant.Type, rows, cols, div int) {
		mb := weightBytes(typ, rows, cols)
		w := randomWeights(typ, mats*mb/int64(typ.BlockBytes()), 53)
		dw := uploadWeight(t, d, typ, rows, cols, mats, w)
		defer d.FreeWeight(dw)
		at, _ := d.ActType(typ)
		ab := d.ActBytes(at, cols)
		na := nsel / div
		act := alloc(t, d, ab*int64(na))
		must(t, d.Quantize(0, at, upload(t, d, gaussian(na*cols, 54)), cols, act, cols, na))
		y := alloc(t, d, int64(4*rows*nsel))
		for _, st := range []int{3, 2, 1, 0} {
			label := fmt.Sprintf("%s %s %dx%d sel %d stage %d", name, typ, rows, cols, nsel, st)
			if !keep.MatchString(label) {
				continue
			}
			must(t, d.SetOption(OptTCStage, st))
			us := gt.time(calls, func(int) error {
				return d.MatMulGrouped(s, dw, idp, nsel, act, ab, div, y, int64(rows), grp, true)
			})
			report(label, float64(nsel)*float64(rows)*float64(cols), us)
		}
		// fast mode's wgmma product (f16 activations: ToHalf's, timed apart)
		for _, v := range []int{1, 2, 3, 4, 5, 6, 7} {
			label := fmt.Sprintf("%s %s %dx%d sel %d wg %d", name, typ, rows, cols, nsel, v)
			must(t, d.SetOption(OptWGMoE, v))
			lay := d.GroupedHalf(typ, cols, nsel)
			if !keep.MatchString(label) || lay == HalfNone {
				continue
			}
			x := upload(t, d, gaussian(na*cols, 54))
			xh := alloc(t, d, int64(2*na*cols))
			us := plain(func() error { return d.ToHalfAs(s, x, cols, cols, na, xh, lay) })
			emit(fmt.Sprintf("prefill to_half %-44s %9.1f µs", label, us))
			us = gt.time(calls, func(int) error {
				return d.MatMulGroupedHalf(s, dw, idp, nsel, xh, int64(2*cols), div, y, int64(rows), grp)
			})
			report(label, float64(nsel)*float64(rows)*float64(cols), us)
		}
		must(t, d.SetOption(OptWGMoE, DefaultWGMoE))
	}
	grouped("experts gate", quant.IQ2_XXS, 2048, 4096, k)
	grouped("experts down", quant.Q2_K, 4096, 2048, 1)
	must(t, d.SetOption(OptTCStage, 3))
	// dense Q8_0: 2048 tokens through one matrix, each OptTCQ8W variant
	t.Cleanup(func() { d.SetOption(OptTCQ8W, 2) })
	dense := func(name string, rows, cols int) {
		mb := weightBytes(quant.Q8_0, rows, cols)
		w := randomWeights(quant.Q8_0, mb/int64(quant.Q8_0.BlockBytes()), 55)
		dw := uploadWeight(t, d, quant.Q8_0, rows, cols, 1, w)
		defer d.FreeWeight(dw)
		at, _ := d.ActType(quant.Q8_0)
		ab := d.ActBytes(at, cols)
		act := alloc(t, d, ab*ntok)
		must(t, d.Quantize(0, at, upload(t, d, gaussian(ntok*cols, 56)), cols, act, cols, ntok))
		y := alloc(t, d, int64(4*rows*ntok))
		for _, q8w := range []int{1, 0} {
			label := fmt.Sprintf("%s Q8_0 %dx%d nt %d q8w %d", name, rows, cols, ntok, q8w)
			if !keep.MatchString(label) {
				continue
			}
			must(t, d.SetOption(OptTCQ8W, q8w))
			us := gt.time(calls, func(int) error {
				return d.MatMulEx(s, dw, 0, 1, act, ab, 0, 1, ntok, y, int64(rows), 0, true)
			})
			report(label, float64(ntok)*float64(rows)*float64(cols), us)
		}
		// fast mode through cuBLAS: the activation to f16, then the product
		// (the Q8_0 weights to f16 and the GEMM)
		if label := fmt.Sprintf("%s Q8_0 %dx%d nt %d half", name, rows, cols, ntok); keep.MatchString(label) {
			must(t, d.SetOption(OptHalfMM, 1))
			x := upload(t, d, gaussian(ntok*cols, 56))
			xh := alloc(t, d, int64(2*ntok*cols))
			us := plain(func() error { return d.ToHalf(s, x, cols, cols, ntok, xh) })
			emit(fmt.Sprintf("prefill to_half %-44s %9.1f µs", label, us))
			us = plain(func() error { return d.MatMulHalf(s, dw, 1, xh, quant.F16, int64(cols), 0, ntok, y, int64(rows), 0) })
			report(label, float64(ntok)*float64(rows)*float64(cols), us)
		}
	}
	dense("attn_q_b", 32768, 1024)
	dense("attn_out_b", 4096, 8192)
	dense("ffn_up_shexp", 2048, 4096)
	dense("rows_8192", 8192, 1024) // not a Flash Q8_0 matrix: a second shape of 1024 columns for OptTCQ8W 2
	dense("attn_q_a", 1024, 4096)

	// exact 16-bit-weight products of 2048 tokens (k_fexact_tile_wv, and
	// k_fexact_tile_wr with OptFXWReg 1): the
	// indexer's query (main stream, ratio-4 layers), a compressor's KV, a
	// hyper-connection mixer, the router. Exact mode rounds every product and
	// sum, so the FP32 floor is 2 instructions a multiply-add.
	// Then the same in fast mode (k_float_tc: TF32 tensor cores).
	float16 := func(name string, rows, cols int) {
		mb := weightBytes(quant.F16, rows, cols)
		w := randomWeights(quant.F16, mb/int64(quant.F16.BlockBytes()), 58)
		dw := uploadWeight(t, d, quant.F16, rows, cols, 1, w)
		defer d.FreeWeight(dw)
		x := upload(t, d, gaussian(ntok*cols, 59))
		y := alloc(t, d, int64(4*rows*ntok))
		for _, m := range []struct {
			mode  string
			exact bool
			wreg  int // OptFXWReg (exact mode's tiled kernels)
		}{{"exact", true, DefaultFXWReg}, {"exact fx_wreg 1", true, 1}, {"fast", false, DefaultFXWReg}} {
			label := fmt.Sprintf("%s F16 %dx%d nt %d %s", name, rows, cols, ntok, m.mode)
			if !keep.MatchString(label) {
				continue
			}
			must(t, d.SetOption(OptFXWReg, m.wreg))
			us := gt.time(calls, func(int) error {
				return d.MatMulEx(s, dw, 0, 1, x, int64(4*cols), 0, 1, ntok, y, int64(rows), 0, m.exact)
			})
			must(t, d.SetOption(OptFXWReg, DefaultFXWReg))
			report(label, float64(ntok)*float64(rows)*float64(cols), us)
		}
		if label := fmt.Sprintf("%s F16 %dx%d nt %d half", name, rows, cols, ntok); keep.MatchString(label) {
			must(t, d.SetOption(OptHalfMM, 2))
			xh := alloc(t, d, int64(2*ntok*cols))
			must(t, d.ToHalf(s, x, cols, cols, ntok, xh))
			us := plain(func() error { return d.MatMulHalf(s, dw, 1, xh, quant.F16, int64(cols), 0, ntok, y, int64(rows), 0) })
			report(label, float64(ntok)*float64(rows)*float64(cols), us)
		}
		if label := fmt.Sprintf("%s F16 %dx%d nt %d tf32", name, rows, cols, ntok); keep.MatchString(label) {
			must(t, d.SetOption(OptHalfMM, 3))
			us := plain(func() error { return d.MatMulHalf(s, dw, 1, x, quant.F32, int64(cols), 0, ntok, y, int64(rows), 0) })
			report(label, float64(ntok)*float64(rows)*float64(cols), us)
		}
	}
	float16("indexer_q_b", 8192, 1024)
	float16("compressor_kv", 1024, 4096)
	float16("hc_attn_fn", 24, 16384)
	float16("router", 256, 4096)

	// activation quantization of a chunk, each OptQuantVec variant: the
	// attention output (2048 tokens × 8 groups of 4096) to Q8_0, the
	// experts' down input (12288 selections × 2048) to Q8_K
	t.Cleanup(func() { d.SetOption(OptQuantVec, 1) })
	quantize := func(name string, at quant.Type, rows, cols int) {
		x := upload(t, d, gaussian(rows*cols, 57))
		act := alloc(t, d, d.ActBytes(at, cols)*int64(rows))
		for _, vec := range []int{1, 0} {
			label := fmt.Sprintf("%s %s %dx%d vec %d", name, at, rows, cols, vec)
			if !keep.MatchString(label) {
				continue
			}
			must(t, d.SetOption(OptQuantVec, vec))
			us := gt.time(calls, func(int) error { return d.Quantize(s, at, x, cols, act, cols, rows) })
			emit(fmt.Sprintf("prefill quantize %-43s %9.1f µs %7.1f GB/s read", label, us, float64(4*rows*cols)/us/1e3))
		}
	}
	quantize("attn out", quant.Q8_0, 8*ntok, 4096)
	quantize("experts down in", quant.Q8_K, k*ntok, 2048)

	// A chunk's attention (2048 tokens from position 6144, Flash's 64 heads
	// of 512, the 128-token window): a ratio-4 layer (512 picks: 640 keys a
	// token) and a ratio-128 layer (48–63 compressed rows), in exact mode
	// and in fast mode with each chunk form (OptAttnFlash 2, the default:
	// the f16 kernel fed f16 row copies; 1: it rounds the float rows; 0: the
	// three TF32-split kernels, and with OptAttnTC off the exact-order
	// ones), launched on the stream (OptAttnFlash 2 allocates stream-ordered
	// scratch, which a captured stream does not take); then the indexer's
	// scores (64 heads of 128 against up to 2048 compressed rows), exact and
	// fast with each OptIXFlash. The rate counts the score and weighted-sum
	// multiply-adds.
	const H, HD, W, pos0, topK, IH, IHD = 64, 512, 128, 6144, 512, 64, 128
	R := (pos0 + ntok) / 4
	aq, akv := upload(t, d, gaussian(ntok*H*HD, 61)), upload(t, d, gaussian(ntok*HD, 62))
	win := upload(t, d, gaussian(2*W*HD, 63))
	comp := upload(t, d, gaussian(R*HD, 64))
	sinks, out := upload(t, d, gaussian(H, 65)), alloc(t, d, int64(4*ntok*H*HD))
	asel := make([]int32, ntok*topK)
	ansel := make([]int32, ntok)
	for tok := range ntok {
		ansel[tok] = topK
		for j, row := range r.Perm((pos0 + tok + 1) / 4)[:topK] {
			asel[tok*topK+j] = int32(row)
		}
	}
	selp, nselp := alloc(t, d, int64(4*len(asel))), alloc(t, d, int64(4*ntok))
	must(t, UploadSlice(d, selp, asel))
	must(t, UploadSlice(d, nselp, ansel))
	t.Cleanup(func() {
		d.SetOption(OptAttnTC, 1)
		d.SetOption(OptAttnFlash, DefaultAttnFlash)
		d.SetOption(OptIXFlash, DefaultIXFlash)
	})
	for _, ratio := range []int{4, 128} {
		maxKeys, keys := W+topK, float64(W+topK)
		if ratio == 128 {
			maxKeys, keys = W+(pos0+ntok)/128, W+(float64(pos0)+ntok/2)/128
		}
		work := alloc(t, d, int64(4*AttentionWork(ntok, H, HD, maxKeys)))
		for _, v := range []struct {
			mode      string
			fast      bool
			tc, flash int
		}{{"exact", false, 1, DefaultAttnFlash}, {"fast attn_flash 3", true, 1, 3}, {"fast attn_flash 2", true, 1, 2}, {"fast attn_flash 1", true, 1, 1},
			{"fast attn_flash 0", true, 1, 0}, {"fast attn_flash 0 attn_tc 0", true, 0, 0}} {
			label := fmt.Sprintf("attention ratio %d (%d keys) %s", ratio, maxKeys, v.mode)
			if !keep.MatchString(label) {
				continue
			}
			must(t, d.SetOption(OptAttnTC, v.tc))
			must(t, d.SetOption(OptAttnFlash, v.flash))
			a := &AttentionArgs{Q: aq, KV: akv, Win: win, WCap: 2 * W, Comp: comp, Ratio: ratio, Sel: selp, NSel: nselp,
				K: topK, Sinks: sinks, Out: out, Pos0: pos0, N: ntok, H: H, HD: HD, W: W, Scale: 0.044, MaxKeys: maxKeys, Work: work, Fast: v.fast}
			us := plain(func() error { return d.Attention(s, a) })
			report(label, 2*float64(ntok)*H*keys*HD, us)
		}
		must(t, d.SetOption(OptAttnTC, 1))
		must(t, d.SetOption(OptAttnFlash, DefaultAttnFlash))
	}
	// (the indexer's rows from DS4_CUDA_BENCH_IXPOS, default pos0: a
	// chunk deep in a long context)
	ipos := pos0
	if v := os.Getenv("DS4_CUDA_BENCH_IXPOS"); v != "" {
		var err error
		if ipos, err = strconv.Atoi(v); err != nil || ipos < 0 {
			t.Fatalf("DS4_CUDA_BENCH_IXPOS=%q: want a position", v)
		}
	}
	IR := (ipos + ntok) / 4
	iq, iw := upload(t, d, gaussian(ntok*IH*IHD, 66)), upload(t, d, gaussian(ntok*IH, 67))
	irows := upload(t, d, gaussian(IR*IHD, 68))
	// FP4-simulated, as the model's queries and rows are: exact mode's
	// tensor-core dots are taken where such values make them exact, and
	// Gaussian floats would send every dot to the CUDA cores' fallback
	must(t, d.FP4Sim(0, iq, IHD, ntok*IH, IHD))
	must(t, d.FP4Sim(0, irows, IHD, IR, IHD))
	must(t, d.Synchronize())
	iscores := alloc(t, d, int64(4*ntok*IR))
	for _, v := range []struct {
		fast  bool
		flash int
	}{{false, 1}, {true, 4}, {true, 3}, {true, 2}, {true, 1}, {true, 0}} {
		label := fmt.Sprintf("index scores %d rows fast %v ix_flash %d", IR, v.fast, v.flash)
		if !keep.MatchString(label) {
			continue
		}
		must(t, d.SetOption(OptIXFlash, v.flash))
		launch := func() error {
			return d.IndexScores(s, iq, iw, irows, IH, IHD, ipos, 4, ntok, iscores, int64(IR), v.fast)
		}
		var us float64
		if v.flash >= 2 || !v.fast { // (stream-ordered scratch, also exact mode's f16 rows: launched on the stream)
			us = plain(launch)
		} else {
			us = gt.time(calls, func(int) error { return launch() })
		}
		report(label, float64(ntok)*IH*(float64(ipos)+ntok/2)/4*IHD, us)
	}
	must(t, d.SetOption(OptIXFlash, DefaultIXFlash))
	// then the top-k of those scores (512 of each token's rows, any order,
	// as fast mode asks) with each prefill form (OptTopKWide; the cluster
	// kernel takes only launches of few tokens)
	tsel, tnsel := alloc(t, d, int64(4*ntok*topK)), alloc(t, d, int64(4*ntok))
	t.Cleanup(func() { d.SetOption(OptTopKWide, DefaultTopKWide) })
	for _, wide := range []int{0, 1} {
		label := fmt.Sprintf("top-k %d of %d rows topk_wide %d", topK, IR, wide)
		if !keep.MatchString(label) {
			continue
		}
		must(t, d.SetOption(OptTopKWide, wide))
		us := gt.time(calls, func(int) error {
			return d.TopK(s, iscores, int64(IR), 0, ipos, 4, topK, TopKAllIfFew|TopKRowOrder, tsel, tnsel, ntok)
		})
		report(label, 0, us)
	}
	must(t, d.SetOption(OptTopKWide, DefaultTopKWide))
}
