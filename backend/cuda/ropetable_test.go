package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestRopeTable holds the rotation table of a decode step or a
// speculative pass (RopeTable of n = 1 or 2 positions) to the per-pair
// trigonometry it replaces, bit for bit (and the norms' copy of the KV
// rows into the window ring):
//   - the table against float64 cosine and sine of the float angle, each
//     rounded to float (rope_cs's definition), within one float ulp (Go's
//     and CUDA's float64 trigonometry may differ in their last bits);
//   - NormRopePairTable with the table against NormRopePair: the same query
//     heads and KV rows, and each token's KV row in its slot of a ring of
//     5 (wrapping at position 1000003 + 1) the same as the row;
//   - Attention with the table (AttentionArgs.RopeTable) against without,
//     the inverse rotation and the Q8_0 activation fused, on Flash's shape
//     through each single-token form — the fp32 split kernel in clusters
//     and with its combine launch, the tensor-core split (640 keys), exact
//     mode — and for two tokens.
func TestRopeTable(t *testing.T) {
	d := gpu(t)
	restoreAttnOptions(t, d)
	const H, HD, W = 64, 512, 128
	const rd, roff, qseg, fp8 = 64, HD - 64, 4096, HD - 64
	const eps = 1e-6
	const ringCap = 5
	freqs := make([]float32, rd/2)
	for i := range freqs {
		freqs[i] = float32(math.Pow(10000, -float64(2*i)/rd)) // (Flash's base: pair 0 turns a radian a position)
	}
	freqp := upload(t, d, freqs)
	tab := upload(t, d, make([]float32, 2*rd))
	for _, n := range []int{1, 2} {
		for _, pos := range []int{0, 700, 8191, 40000, 1000003} {
			label := fmt.Sprintf("%d tokens at position %d", n, pos)
			must(t, d.RopeTable(0, freqp, rd, int64(pos), n, tab))
			got := download(t, d, tab, n*rd)
			for tok := range n {
				for j := range rd / 2 {
					a := float64(float32(pos+tok) * freqs[j])
					for k, want := range []float32{float32(math.Cos(a)), float32(math.Sin(a))} {
						g := got[tok*rd+2*j+k]
						if g != want && math.Abs(float64(g-want)) > math.Abs(float64(math.Nextafter32(want, 2)-want)) {
							t.Fatalf("%s: token %d pair %d: table value %d %v, float64 trigonometry %v", label, tok, j, k, g, want)
						}
					}
				}
			}
			// the norms
			qh, kvh := gaussian(n*H*HD, 51+uint64(pos)), gaussian(n*HD, 52)
			kvw := gaussian(HD, 53)
			kvwp := upload(t, d, kvw)
			var outs [2][]float32
			ring := upload(t, d, make([]float32, ringCap*HD))
			for i, cs := range []Ptr{0, tab} {
				q, kv := upload(t, d, qh), upload(t, d, kvh)
				r := Ptr(0)
				if i == 1 {
					r = ring
				}
				must(t, d.NormRopePairTable(0, q, H, 0, 0, kv, 1, kvwp, fp8, HD, eps, roff, freqp, rd, int64(pos), n, cs, r, ringCap))
				outs[i] = append(download(t, d, q, n*H*HD), download(t, d, kv, n*HD)...)
			}
			if i, ok := firstBitDiff(outs[0], outs[1]); !ok {
				t.Fatalf("%s: norms with the table: value %d %v, without %v", label, i, outs[1][i], outs[0][i])
			}
			slots := download(t, d, ring, ringCap*HD)
			for tok := range n {
				slot := (pos + tok) % ringCap
				if i, ok := firstBitDiff(outs[0][n*H*HD+tok*HD:][:HD], slots[slot*HD:][:HD]); !ok {
					t.Fatalf("%s: token %d's KV row in ring slot %d differs at value %d", label, tok, slot, i)
				}
			}
		}
	}
	sinks := upload(t, d, gaussian(H, 35))
	for _, c := range []struct {
		pos0, ratio, K int
		fast           bool
		cluster        int
		n              int
	}{
		{700, 128, 0, true, DefaultAttnCluster, 1}, // 128 + 5 keys: clusters
		{700, 128, 0, true, 0, 1},                  // the split kernel, then its combine
		{40000, 128, 0, true, DefaultAttnCluster, 1},
		{12000, 4, 512, true, DefaultAttnCluster, 1},  // 640 keys: the tensor-core split and its combine
		{700, 128, 0, false, DefaultAttnCluster, 1},   // exact mode
		{12000, 4, 512, false, DefaultAttnCluster, 1}, // exact mode, 640 keys
		{60, 0, 0, true, DefaultAttnCluster, 1},       // window keys only
		{700, 128, 0, true, DefaultAttnCluster, 2},    // a speculative pass's two tokens
		{12000, 4, 512, true, DefaultAttnCluster, 2},
		{700, 128, 0, false, DefaultAttnCluster, 2},
	} {
		must(t, d.SetOption(OptAttnCluster, c.cluster))
		must(t, d.SetOption(OptAttnSplit, DefaultAttnSplit))
		n := c.n
		label := fmt.Sprintf("%d tokens, pos0 %d, ratio %d, fast %v, clusters %d", n, c.pos0, c.ratio, c.fast, c.cluster)
		nComp := 0
		if c.ratio > 0 {
			nComp = (c.pos0 + n) / c.ratio
		}
		q, kv := upload(t, d, gaussian(n*H*HD, 31)), upload(t, d, gaussian(n*HD, 32))
		win := upload(t, d, gaussian(W*HD, 33))
		comp := upload(t, d, gaussian(max(nComp, 1)*HD, 34))
		K := max(c.K, 1)
		maxKeys := min(W, c.pos0+n) + nComp
		sel, nsel := make([]int32, n*K), make([]int32, n)
		if c.ratio == 4 {
			r := rand.New(rand.NewPCG(36, 36))
			for tok := range n {
				nsel[tok] = int32(min(c.K, (c.pos0+tok+1)/c.ratio))
				for k := range int(nsel[tok]) {
					sel[tok*K+k] = int32(r.IntN(int(nsel[tok])))
				}
			}
			maxKeys = min(W, c.pos0+n) + c.K
		}
		selp, nselp := tempAlloc(t, d, int64(4*n*K)), tempAlloc(t, d, int64(4*n))
		t.Cleanup(func() { d.Free(selp); d.Free(nselp) })
		must(t, UploadSlice(d, selp, sel))
		must(t, UploadSlice(d, nselp, nsel))
		must(t, d.RopeTable(0, freqp, rd, int64(c.pos0), n, tab))
		nw := max(1, AttentionWork(n, H, HD, maxKeys))
		work := upload(t, d, make([]float32, nw))
		var outs [2][]float32
		var acts [2][]byte
		for i, cs := range []Ptr{0, tab} {
			poison(t, d, work, nw)
			a := &AttentionArgs{Q: q, KV: kv, Win: win, WCap: W, Comp: comp, Ratio: c.ratio, Sel: selp, NSel: nselp,
				K: K, Sinks: sinks, Pos0: c.pos0, N: n, H: H, HD: HD, W: W, Scale: 0.044, MaxKeys: maxKeys,
				Work: work, Fast: c.fast, RopeTable: cs}
			outs[i], acts[i] = attentionOut(t, d, a, true, freqp, rd, roff, qseg)
		}
		if i, ok := firstBitDiff(outs[0], outs[1]); !ok {
			t.Fatalf("%s: output value %d (token %d head %d): %v with the table, %v without", label, i, i/(H*HD), i/HD%H, outs[1][i], outs[0][i])
		}
		if i := firstByteDiff(acts[0], acts[1]); i >= 0 {
			t.Fatalf("%s: activation byte %d differs", label, i)
		}
	}
}
