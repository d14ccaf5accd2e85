package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"ds4go/backend/cpu"
)

// TestAttentionSegmented holds exact mode's attention in the segmented
// order to cpu.AttendHead's segmented order bit for bit, on Flash's shape:
// single tokens through OptAttnOrder 1 (k_attn_po_cl's stats_seg and
// po_seg_mac; past the exponentials' cache, 2471 keys, the split below), 2,
// 3 and 4 (split over the segments: k_attn_seg of 128, 64 or 32 dims a
// CTA, then k_attn_seg_combine; for 2 and 5 both of its forms, OptSegComb),
// 5 (k_attn_seg_cl: 3 with the scores
// formed in the kernel by a cluster of the 8 dim slices; compiled for no
// occupancy, for 4 CTAs an SM — the default — and 5, OptAttnSegOcc; its
// segments walked by fewer CTAs, OptAttnSegWalk), and prompt chunks of 8
// and 16 tokens (k_attn_softmax_seg, then k_attn_out_tile<false,
// true>, whatever the option's value): 133 keys (two whole segments and a short one), 640 (a
// ratio-4 layer's window and top-k), 1299, 2042 (the last of 32 segments
// short) and 2471, the key rows in the kernels' order (the window's
// positions from the chunk's rows or the ring, then the compressed rows
// picked or all). A chunk with the tiled kernels off, which have no
// segmented form, fails instead of summing in the serial order.
// DS4_CUDA_SEG_ONLY runs only the cases whose label holds it (ncu of one
// shape's launches: e.g. "ratio 4, 4 tokens").
func TestAttentionSegmented(t *testing.T) {
	d := gpu(t)
	restoreAttnOptions(t, d)
	t.Cleanup(func() {
		d.SetOption(OptAttnOrder, DefaultAttnOrder)
		d.SetOption(OptSegComb, 1)
		d.SetOption(OptAttnSegOcc, DefaultAttnSegOcc)
		d.SetOption(OptAttnSegWalk, DefaultAttnSegWalk)
		d.SetOption(OptAttnSegForm, DefaultAttnSegForm)
	})
	const H, HD, W = attnH, attnHD, attnW
	const wcap = 2 * W
	const scale = float32(0.044)
	const rd, roff, qseg = 64, HD - 64, 4096
	freqp := uploadFreqs(t, d, rd/2, 0.011)
	for _, c := range []struct{ pos0, ratio, K, nt int }{
		{700, 128, 0, 1}, {12000, 4, 512, 1}, {150000, 128, 0, 1}, {245000, 128, 0, 1}, {300000, 128, 0, 1},
		{700, 128, 0, 2}, {12000, 4, 512, 2}, {12000, 4, 512, 3}, {12000, 4, 512, 4}, {700, 128, 0, 8}, {12000, 4, 512, 16}, {245000, 128, 0, 8},
	} {
		label := fmt.Sprintf("pos0 %d, ratio %d, %d tokens", c.pos0, c.ratio, c.nt)
		if only := os.Getenv("DS4_CUDA_SEG_ONLY"); only != "" && !strings.Contains(label, only) {
			continue // (one case's launches alone, for ncu: e.g. "ratio 4, 4 tokens")
		}
		seed := uint64(c.pos0 + c.nt)
		nComp := (c.pos0 + c.nt) / c.ratio
		q, kv := gaussian(c.nt*H*HD, seed), gaussian(c.nt*HD, seed+1)
		win, comp := gaussian(wcap*HD, seed+2), gaussian(nComp*HD, seed+3)
		sinks := gaussian(H, seed+4)
		K := max(c.K, 1)
		sel, nsel := make([]int32, c.nt*K), make([]int32, c.nt)
		r := rand.New(rand.NewPCG(seed+5, seed+5))
		for tok := range c.nt {
			R := (c.pos0 + tok + 1) / 4
			nsel[tok] = int32(min(c.K, R))
			for j := range int(nsel[tok]) {
				sel[tok*K+j] = int32(r.IntN(R))
			}
		}
		maxKeys := W + c.K
		if c.ratio == 128 {
			maxKeys = W + nComp
		}
		selp, nselp := tempAlloc(t, d, int64(4*len(sel))), tempAlloc(t, d, int64(4*c.nt))
		must(t, UploadSlice(d, selp, sel))
		must(t, UploadSlice(d, nselp, nsel))
		work := tempAlloc(t, d, int64(4*AttentionWork(c.nt, H, HD, maxKeys)))
		a := &AttentionArgs{Q: tempUpload(t, d, q), KV: tempUpload(t, d, kv), Win: tempUpload(t, d, win), WCap: wcap,
			Comp: tempUpload(t, d, comp), Ratio: c.ratio, Sel: selp, NSel: nselp, K: K, Sinks: tempUpload(t, d, sinks),
			Pos0: c.pos0, N: c.nt, H: H, HD: HD, W: W, Scale: scale, MaxKeys: maxKeys, Work: work}
		must(t, d.SetOption(OptAttnOrder, 0))
		serial, _ := attentionOut(t, d, a, false, 0, 0, 0, 0)
		want := make([]float32, len(serial))
		var keys [][]float32
		var scores []float32
		for tok := range c.nt {
			p := c.pos0 + tok
			keys = keys[:0]
			nwin := min(p+1, W)
			for k := range nwin {
				qp := p - nwin + 1 + k
				if qp >= c.pos0 {
					keys = append(keys, kv[(qp-c.pos0)*HD:(qp-c.pos0+1)*HD])
				} else {
					keys = append(keys, win[(qp%wcap)*HD:(qp%wcap+1)*HD])
				}
			}
			if c.ratio == 4 {
				for _, i := range sel[tok*K : tok*K+int(nsel[tok])] {
					keys = append(keys, comp[int(i)*HD:(int(i)+1)*HD])
				}
			} else {
				for i := range (p + 1) / c.ratio {
					keys = append(keys, comp[i*HD:(i+1)*HD])
				}
			}
			scores = make([]float32, len(keys))
			for h := range H {
				o := (tok*H + h) * HD
				cpu.AttendHead(want[o:o+HD], q[o:o+HD], keys, scores, sinks[h], scale, cpu.AttnSegmentKeys)
			}
		}
		if _, ok := firstBitDiff(serial, want); ok {
			t.Errorf("%s: the segmented order's output is the serial order's bit for bit", label)
		}
		// each order, orders 2 and 5 with the v66 combine (OptSegComb 0),
		// 5 compiled for 4 and 5 CTAs an SM (OptAttnSegOcc), and 5's
		// segments walked by fewer CTAs (OptAttnSegWalk: single tokens;
		// every count, as few CTAs as fill a wave at 4 and 3 CTAs an SM;
		// 1, 3 and 12 segments a CTA), and 5's score and sum forms
		// (OptAttnSegForm, in both kernels, at 4 and 3 CTAs an SM)
		type variant struct{ order, comb, occ, walk, form int }
		for _, v := range []variant{{1, 1, 0, 0, 0}, {2, 1, 0, 0, 0}, {3, 1, 0, 0, 0}, {4, 1, 0, 0, 0}, {5, 1, 0, 0, 0}, {2, 0, 0, 0, 0}, {5, 0, 0, 0, 0},
			{5, 1, 4, 0, 0}, {5, 1, 5, 0, 0}, {5, 1, 4, 1, 0}, {5, 1, 4, 2, 0}, {5, 1, 3, 2, 0}, {5, 1, 4, 3, 0}, {5, 1, 4, 5, 0}, {5, 1, 4, 14, 0},
			{5, 1, 4, 0, 1}, {5, 1, 4, 0, 2}, {5, 1, 4, 0, 4}, {5, 1, 4, 0, 5}, {5, 1, 4, 0, 6}, {5, 1, 3, 0, 6},
			{5, 1, 4, 2, 1}, {5, 1, 4, 2, 2}, {5, 1, 4, 2, 4}, {5, 1, 4, 2, 6}, {5, 1, 3, 2, 5}, {5, 1, 4, 14, 6}} {
			must(t, d.SetOption(OptAttnOrder, v.order))
			must(t, d.SetOption(OptSegComb, v.comb))
			must(t, d.SetOption(OptAttnSegOcc, v.occ))
			must(t, d.SetOption(OptAttnSegWalk, v.walk))
			must(t, d.SetOption(OptAttnSegForm, v.form))
			got, _ := attentionOut(t, d, a, false, 0, 0, 0, 0)
			if i, ok := firstBitDiff(want, got); !ok {
				t.Fatalf("%s, %d keys, order %d, combine %d, occupancy %d, walk %d, form %d: output %d (token %d head %d) %v, cpu.AttendHead's segmented order %v",
					label, len(keys), v.order, v.comb, v.occ, v.walk, v.form, i, i/(H*HD), i/HD%H, got[i], want[i])
			}
		}
		must(t, d.SetOption(OptSegComb, 1))
		must(t, d.SetOption(OptAttnSegOcc, DefaultAttnSegOcc))
		must(t, d.SetOption(OptAttnSegWalk, DefaultAttnSegWalk))
		must(t, d.SetOption(OptAttnSegForm, DefaultAttnSegForm))
		// fused (the inverse rotation and the Q8_0 activation in the output
		// kernels): orders 2's and 5's combine (both forms) as order 1's kernel
		if maxKeys <= 2048 && c.nt < 8 {
			var outs [4][]float32
			var acts [4][]byte
			vs := []variant{{1, 1, 0, 0, 0}, {2, 1, 0, 0, 0}, {5, 1, 0, 0, 0}, {5, 0, 0, 0, 0}}
			for i, v := range vs {
				must(t, d.SetOption(OptAttnOrder, v.order))
				must(t, d.SetOption(OptSegComb, v.comb))
				outs[i], acts[i] = attentionOut(t, d, a, true, freqp, rd, roff, qseg)
			}
			must(t, d.SetOption(OptSegComb, 1))
			for i := 1; i < len(vs); i++ {
				if j, ok := firstBitDiff(outs[0], outs[i]); !ok {
					t.Fatalf("%s, fused: output %d: order %d combine %d %v, order 1 %v", label, j, vs[i].order, vs[i].comb,
						outs[i][j], outs[0][j])
				}
				if j := firstByteDiff(acts[0], acts[i]); j >= 0 {
					t.Fatalf("%s, fused: order %d combine %d: activation byte %d differs", label, vs[i].order, vs[i].comb, j)
				}
			}
		}
		must(t, d.SetOption(OptAttnOrder, 0))
	}
	// where no kernel has the order: an error, not the serial order's sums
	t.Cleanup(func() { d.SetOption(OptAttnTile, DefaultAttnTile) })
	must(t, d.SetOption(OptAttnTile, 0))
	for order := 1; order <= 5; order++ {
		must(t, d.SetOption(OptAttnOrder, order))
		in := newDecAttn(t, d, 700, 128, 0, 8, 77)
		a := in.args(t, d)
		a.Out = tempAlloc(t, d, int64(4*8*H*HD))
		if err := d.Attention(0, a); err == nil {
			t.Errorf("8 tokens in order %d with the tiled kernels off: no error", order)
		}
	}
	must(t, d.SetOption(OptAttnTile, DefaultAttnTile))
	must(t, d.SetOption(OptAttnOrder, 0))
}

// TestAttnSegKeys: the work buffer's rule sizes the segmented order's rows
// with the CPU's segment (no GPU needed).
func TestAttnSegKeys(t *testing.T) {
	if attnSegKeys != cpu.AttnSegmentKeys {
		t.Fatalf("attnSegKeys %d, cpu.AttnSegmentKeys %d", attnSegKeys, cpu.AttnSegmentKeys)
	}
}
