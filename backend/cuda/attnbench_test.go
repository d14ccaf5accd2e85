package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

// TestChunkAttention times the attention of one 2048-token chunk on
// Flash's shapes (64 heads of 512, the 128-key window) at the end of an 8k
// prompt: a ratio-4 layer (512 picks a token) and a ratio-128 layer (the
// 64 compressed rows), in exact mode and in fast mode with each chunk form
// (OptAttnFlash 1: one kernel with f16 operands; 0: the three TF32-split
// kernels), then the ratio-4 layer's indexer scores (64 heads of 128
// against the 2048 compressed rows; OptIXFlash 1: f16, 0: TF32-split
// tiles). Like TestOpLatency it runs only with DS4_CUDA_BENCH=1 and prints
// the median µs a call of 7 timed rounds of 4 calls (the attention's
// launched on the stream, the indexer's as a graph).
func TestChunkAttention(t *testing.T) {
	if os.Getenv("DS4_CUDA_BENCH") == "" {
		t.Skip("set DS4_CUDA_BENCH=1 to run the chunk attention benchmark")
	}
	d := gpu(t)
	gt := newGraphTimer(t, d)
	t.Cleanup(func() { d.SetOption(OptAttnFlash, DefaultAttnFlash); d.SetOption(OptIXFlash, 1) })
	const H, HD, W, n, pos0, K = 64, 512, 128, 2048, 6144, 512
	R := (pos0 + n) / 4
	q, kv := tempUpload(t, d, gaussian(n*H*HD, 31)), tempUpload(t, d, gaussian(n*HD, 32))
	win := tempUpload(t, d, gaussian(2*W*HD, 33))
	comp := tempUpload(t, d, gaussian(R*HD, 34))
	sinks, out := tempUpload(t, d, gaussian(H, 35)), tempAlloc(t, d, int64(4*n*H*HD))
	sel, nsel := make([]int32, n*K), make([]int32, n)
	r := rand.New(rand.NewPCG(36, 36))
	for tok := range n {
		rows := (pos0 + tok + 1) / 4
		nsel[tok] = int32(min(K, rows))
		for k := range min(K, rows) {
			sel[tok*K+k] = int32(r.IntN(rows))
		}
	}
	selp, nselp := tempAlloc(t, d, int64(4*len(sel))), tempAlloc(t, d, int64(4*n))
	must(t, UploadSlice(d, selp, sel))
	must(t, UploadSlice(d, nselp, nsel))
	for _, ratio := range []int{4, 128} {
		maxKeys := W + K
		if ratio == 128 {
			maxKeys = W + (pos0+n)/128
		}
		work := tempAlloc(t, d, int64(4*AttentionWork(n, H, HD, maxKeys)))
		a := &AttentionArgs{Q: q, KV: kv, Win: win, WCap: 2 * W, Comp: comp, Ratio: ratio, Sel: selp, NSel: nselp,
			K: K, Sinks: sinks, Out: out, Pos0: pos0, N: n, H: H, HD: HD, W: W, Scale: 0.044, MaxKeys: maxKeys, Work: work}
		for _, v := range []struct {
			name  string
			fast  bool
			flash int
		}{{"exact", false, 1}, {"fast attn_flash=0", true, 0}, {"fast attn_flash=1", true, 1}, {"fast attn_flash=2", true, 2}} {
			must(t, d.SetOption(OptAttnFlash, v.flash))
			fa := *a
			fa.Fast = v.fast
			// (launched, not captured: attn_flash 2 allocates stream-ordered
			// scratch, which a captured stream does not take)
			us := gt.rounds(4, func() {
				for range 4 {
					must(t, d.Attention(gt.s, &fa))
				}
			})
			line := fmt.Sprintf("chunk attention %d tokens at %d ratio=%d %-18s %9.1f µs", n, pos0, ratio, v.name, us)
			t.Log(line)
			fmt.Println(line)
		}
		d.Free(work)
	}
	const IH, IHD = 64, 128
	iq, iw := tempUpload(t, d, gaussian(n*IH*IHD, 37)), tempUpload(t, d, gaussian(n*IH, 38))
	irows, isc := tempUpload(t, d, gaussian(R*IHD, 39)), tempAlloc(t, d, int64(4*n*R))
	for _, v := range []struct {
		name  string
		fast  bool
		flash int
	}{{"exact", false, 1}, {"fast ix_flash=0", true, 0}, {"fast ix_flash=1", true, 1}} {
		must(t, d.SetOption(OptIXFlash, v.flash))
		us := gt.time(4, func(int) error {
			return d.IndexScores(gt.s, iq, iw, irows, IH, IHD, pos0, 4, n, isc, int64(R), v.fast)
		})
		line := fmt.Sprintf("chunk index scores %d tokens at %d, %d rows %-18s %9.1f µs", n, pos0, R, v.name, us)
		t.Log(line)
		fmt.Println(line)
	}
	for _, p := range []Ptr{q, kv, win, comp, sinks, out, selp, nselp, iq, iw, irows, isc} {
		d.Free(p)
	}
}
