package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"ds4go/quant"
)

// TestOpLatency times the small decode kernels that are chains of
// latencies rather than streams of weights (router, indexer scores, top-k,
// attention) on Flash's shapes at an 8k and a 32k context, each with the
// library options that switch its variants, and prints µs per call. Like
// TestBandwidth it runs only with DS4_CUDA_BENCH=1; each figure is the
// median of 7 replays of a graph of 50 back-to-back calls (the calls'
// launches overlap as in the decode graph, with PDL).
func TestOpLatency(t *testing.T) {
	if os.Getenv("DS4_CUDA_BENCH") == "" {
		t.Skip("set DS4_CUDA_BENCH=1 to run the latency benchmark")
	}
	d := gpu(t)
	gt := newGraphTimer(t, d)
	s := gt.s
	const n = 50
	// (the options whose default is not 1, restored to it)
	defaults := map[int]int{OptAttnSplit: DefaultAttnSplit, OptIXTile: DefaultIXTile, OptTopKCl: DefaultTopKCl}
	report := func(name string, opt, val int, launch func(int) error) {
		if opt > 0 {
			must(t, d.SetOption(opt, val))
			def, ok := defaults[opt]
			if !ok {
				def = 1
			}
			defer d.SetOption(opt, def)
		}
		us := gt.time(n, launch)
		line := fmt.Sprintf("op latency %-40s %8.2f µs", name, us)
		t.Log(line)
		fmt.Println(line)
	}

	// Router: 256 experts, 6 picked, learned (biased top-k) and hashed.
	const E, K, vocab = 256, 6, 1024
	logits, bias := upload(t, d, gaussian(E, 1)), upload(t, d, gaussian(E, 2))
	tid := make([]int32, vocab*K)
	r := rand.New(rand.NewPCG(3, 3))
	for i := range tid {
		tid[i] = int32(r.IntN(E))
	}
	tidp := alloc(t, d, int64(4*len(tid)))
	must(t, UploadSlice(d, tidp, tid))
	tok := alloc(t, d, 4)
	must(t, UploadSlice(d, tok, []int32{17}))
	sel, wts := alloc(t, d, 4*K), alloc(t, d, 4*K)
	for v := 1; v >= 0; v-- {
		report(fmt.Sprintf("router learned router_warp=%d", v), OptRouterWarp, v, func(int) error {
			return d.Router(s, logits, E, bias, 0, 0, K, true, 1.5, sel, wts, 1)
		})
	}
	report("router hashed", 0, 0, func(int) error { return d.Router(s, logits, E, bias, tidp, tok, K, true, 1.5, sel, wts, 1) })

	// Hyper-connections: the 24 mixing logits of 4 streams of 4096 (an
	// exact F16 product), then hc_pre (Sinkhorn, mixing, RMSNorm, x's Q8_0
	// activation).
	const HC, D = 4, 4096
	const M = HC * (2 + HC)
	fn := uploadWeight(t, d, quant.F16, M, HC*D, 1, randomWeights(quant.F16, int64(M*HC*D/quant.F16.BlockSize()), 13))
	h := upload(t, d, gaussian(HC*D, 14))
	mix := alloc(t, d, 4*M)
	report("hc mixes (exact F16 24×16384)", 0, 0, func(int) error {
		return d.MatMulEx(s, fn, 0, 1, h, 4*HC*D, 0, 1, 1, mix, M, 0, true)
	})
	scale, base := upload(t, d, []float32{0.5, 0.5, 0.5}), upload(t, d, gaussian(M, 15))
	normW := upload(t, d, gaussian(D, 16))
	x, post, comb := alloc(t, d, 4*D), alloc(t, d, 4*HC), alloc(t, d, 4*HC*HC)
	xq := alloc(t, d, d.ActBytes(quant.Q8_0, D))
	for _, v := range []int{1, 0} {
		report(fmt.Sprintf("hc_pre hc_two=%d", v), OptHCTwo, v, func(int) error {
			return d.HCPre(s, &HCPreArgs{Mix: mix, RawMix: true, M: M, Scale: scale, Base: base, HC: HC, Iters: 20, HCEps: 1e-6,
				H: h, D: D, NormW: normW, NormEps: 1e-6, X: x, Post: post, Comb: comb, XQ: xq, N: 1})
		})
	}
	// the head's form: x alone (no Sinkhorn split, no post): against the
	// above, what the split costs hc_pre beside x (cuda/NOTES.md v29)
	report("hc_pre, x alone (the head's form)", 0, 0, func(int) error {
		return d.HCPre(s, &HCPreArgs{Head: true, Mix: mix, RawMix: true, M: HC, Scale: scale, Base: base, HC: HC, Iters: 20, HCEps: 1e-6,
			H: h, D: D, NormW: normW, NormEps: 1e-6, X: x, XQ: xq, N: 1})
	})

	// the router with the routed experts' Q8_K activation against the
	// router and the quantize launch
	xab := d.ActBytes(quant.Q8_K, D)
	xact := alloc(t, d, xab)
	report("router + quantize Q8_K (two launches)", 0, 0, func(int) error {
		if err := d.Router(s, logits, E, bias, 0, 0, K, true, 1.5, sel, wts, 1); err != nil {
			return err
		}
		return d.Quantize(s, quant.Q8_K, x, D, xact, D, 1)
	})
	report("router with the Q8_K activation", 0, 0, func(int) error {
		return d.RouterQ8K(s, logits, E, bias, 0, 0, K, true, 1.5, sel, wts, 1, x, D, xact, xab)
	})

	// Indexer scores and top-k at ratio 4 (64 heads of 128, 512 picks).
	const IH, IHD, TopK = 64, 128, 512
	for _, ctx := range []int{8192, 32768, 131072} {
		R := ctx / 4
		// (freed at the end of each context: tempAlloc, tempUpload)
		q, w := tempUpload(t, d, gaussian(IH*IHD, 4)), tempUpload(t, d, gaussian(IH, 5))
		rows := tempUpload(t, d, gaussian(R*IHD, 6))
		scores := tempAlloc(t, d, int64(4*R))
		isel, insel := tempAlloc(t, d, 4*TopK), tempAlloc(t, d, 4)
		for v := 1; v >= 0; v-- {
			report(fmt.Sprintf("index scores R=%d ix_tile=%d", R, v), OptIXTile, v, func(int) error {
				return d.IndexScores(s, q, w, rows, IH, IHD, ctx-1, 4, 1, scores, int64(R), false)
			})
		}
		report(fmt.Sprintf("index scores R=%d ix_tile=2 fast", R), OptIXTile, 2, func(int) error {
			return d.IndexScores(s, q, w, rows, IH, IHD, ctx-1, 4, 1, scores, int64(R), true)
		})
		must(t, d.SetOption(OptTopKCl, 0)) // the one-CTA kernels first
		for _, v := range []int{1, 2, 0} {
			report(fmt.Sprintf("top-k %d of %d topk_warp=%d", TopK, R, v), OptTopKWarp, v, func(int) error {
				return d.TopK(s, scores, int64(R), 0, ctx-1, 4, TopK, TopKAllIfFew, isel, insel, 1)
			})
		}
		report(fmt.Sprintf("top-k %d of %d topk_warp=1 row order", TopK, R), OptTopKWarp, 1, func(int) error {
			return d.TopK(s, scores, int64(R), 0, ctx-1, 4, TopK, TopKAllIfFew|TopKRowOrder, isel, insel, 1)
		})
		for _, flags := range []int{TopKAllIfFew, TopKAllIfFew | TopKRowOrder} {
			report(fmt.Sprintf("top-k %d of %d topk_cl (flags %d)", TopK, R, flags), OptTopKCl, 1, func(int) error {
				return d.TopK(s, scores, int64(R), 0, ctx-1, 4, TopK, flags, isel, insel, 1)
			})
		}
		must(t, d.SetOption(OptTopKCl, DefaultTopKCl))

		// Attention of one query, 64 heads of 512: the 128-key window and
		// the 512 picks of a ratio-4 layer; the window and R/32 rows of a
		// ratio-128 layer.
		const H, HD, W = 64, 512, 128
		aq, akv := tempUpload(t, d, gaussian(H*HD, 7)), tempUpload(t, d, gaussian(HD, 8))
		win := tempUpload(t, d, gaussian(2*W*HD, 9))
		comp := tempUpload(t, d, gaussian(R*HD, 10))
		sinks, out := tempUpload(t, d, gaussian(H, 11)), tempAlloc(t, d, 4*H*HD)
		for _, ratio := range []int{4, 128} {
			maxKeys := W + TopK
			if ratio == 128 {
				maxKeys = W + ctx/128
			}
			work := tempAlloc(t, d, int64(4*AttentionWork(1, H, HD, maxKeys)))
			a := &AttentionArgs{Q: aq, KV: akv, Win: win, WCap: 2 * W, Comp: comp, Ratio: ratio, Sel: isel, NSel: insel,
				K: TopK, Sinks: sinks, Out: out, Pos0: ctx - 1, N: 1, H: H, HD: HD, W: W, Scale: 0.044, MaxKeys: maxKeys, Work: work}
			for v := 1; v >= 0; v-- {
				report(fmt.Sprintf("attention ctx=%d ratio=%d attn_po=%d", ctx, ratio, v), OptAttnPO, v, func(int) error {
					return d.Attention(s, a)
				})
			}
			report(fmt.Sprintf("attention ctx=%d ratio=%d attn_ecache=0", ctx, ratio), OptAttnECache, 0, func(int) error {
				return d.Attention(s, a)
			})
			// fast mode: split over the keys (OptAttnSplit 2 on the tensor
			// cores, 1), then one pass (0)
			fa := *a
			fa.Fast = true
			for v := 2; v >= 0; v-- {
				report(fmt.Sprintf("attention ctx=%d ratio=%d fast attn_split=%d", ctx, ratio, v), OptAttnSplit, v, func(int) error {
					return d.Attention(s, &fa)
				})
			}
			d.Free(work)
		}
		for _, p := range []Ptr{q, w, rows, scores, isel, insel, aq, akv, win, comp, sinks, out} {
			d.Free(p)
		}
	}

	// A decode step's compressed row (CompEmit) at ratio 4: the
	// attention's compressor (512 values, FP8) and the indexer's (128,
	// Hadamard and FP4), in one launch and apart; then the pooling alone.
	{
		const r, coff, cap, rd, pos0 = 4, 2, 8, 64, 8191
		freqs := make([]float32, rd/2)
		for i := range freqs {
			freqs[i] = float32(i+1) / rd
		}
		freqp := upload(t, d, freqs)
		for _, c := range []struct {
			w    int
			post CompPost
			fp8n int
		}{{512, CompPostFP8, 448}, {128, CompPostHadamardFP4, 0}} {
			cw := coff * c.w
			kv, sc := upload(t, d, gaussian(cw, 51)), upload(t, d, gaussian(cw, 52))
			kvr, scr := upload(t, d, gaussian(cap*cw, 53)), upload(t, d, gaussian(cap*cw, 54))
			norm, rowp := upload(t, d, gaussian(c.w, 55)), alloc(t, d, int64(4*c.w))
			a := &CompEmitArgs{KV: kv, SC: sc, KVRing: kvr, SCRing: scr, KVCap: cap, SCCap: cap, CW: cw, Pos0: pos0, N: 1,
				R: r, Coff: coff, W: c.w, I0: pos0 / r, NRows: 1, Rows: rowp, Norm: norm, Eps: 1e-6, Freqs: freqp, RD: rd,
				Post: c.post, FP8N: c.fp8n, HadScale: 0.088}
			for v := 1; v >= 0; v-- {
				report(fmt.Sprintf("comp_emit width %d comp_emit=%d", c.w, v), OptCompEmit, v, func(int) error {
					return d.CompEmit(s, a)
				})
			}
			report(fmt.Sprintf("comp_pool width %d", c.w), 0, 0, func(int) error {
				return d.CompPool(s, &CompPoolArgs{KV: kv, SC: sc, KVRing: kvr, SCRing: scr, Cap: cap, CW: cw, Pos0: pos0,
					R: r, Coff: coff, W: c.w, I0: pos0 / r, NRows: 1, Rows: rowp})
			})
			report(fmt.Sprintf("rmsnorm_ref width %d", c.w), 0, 0, func(int) error {
				return d.RMSNormRef(s, rowp, int64(c.w), norm, rowp, int64(c.w), c.w, 1, 1e-6)
			})
			report(fmt.Sprintf("rope width %d", c.w), 0, 0, func(int) error {
				return d.Rope(s, rowp, int64(c.w), 1, int64(c.w), int64(c.w-rd), freqp, rd, pos0-3, r, 1, false)
			})
			report(fmt.Sprintf("ring_write2 width %d", cw), 0, 0, func(int) error {
				return d.RingWrite2(s, kvr, scr, cap, cw, kv, sc, int64(cw), pos0, 1)
			})
		}
	}
}
