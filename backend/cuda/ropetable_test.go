package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestRopeTable holds a decode step's rotation table (RopeTable) to the
// per-pair trigonometry it replaces, bit for bit (and the norms' second
// copy of the KV row):
//   - the table against float64 cosine and sine of the float angle, each
//     rounded to float (rope_cs's definition), within one float ulp (Go's
//     and CUDA's float64 trigonometry may differ in their last bits);
//   - NormRopePairTable with the table against NormRopePair: the same query
//     heads and KV row, and the KV row's second copy (the window-ring
//     slot a decode step writes with it) the same as the row;
//   - Attention with the table (AttentionArgs.RopeTable) against without,
//     the inverse rotation and the Q8_0 activation fused, on Flash's shape
//     through each single-token form: the fp32 split kernel in clusters
//     and with its combine launch, the tensor-core split (640 keys), and
//     exact mode.
func TestRopeTable(t *testing.T) {
	d := gpu(t)
	restoreAttnOptions(t, d)
	const H, HD, W = 64, 512, 128
	const rd, roff, qseg, fp8 = 64, HD - 64, 4096, HD - 64
	const eps = 1e-6
	freqs := make([]float32, rd/2)
	for i := range freqs {
		freqs[i] = float32(math.Pow(10000, -float64(2*i)/rd)) // (Flash's base: pair 0 turns a radian a position)
	}
	freqp := upload(t, d, freqs)
	tab := upload(t, d, make([]float32, rd))
	for _, pos := range []int{0, 700, 8191, 40000, 1000003} {
		must(t, d.RopeTable(0, freqp, rd, int64(pos), tab))
		got := download(t, d, tab, rd)
		for j := range rd / 2 {
			a := float64(float32(pos) * freqs[j])
			for k, want := range []float32{float32(math.Cos(a)), float32(math.Sin(a))} {
				g := got[2*j+k]
				if g != want && math.Abs(float64(g-want)) > math.Abs(float64(math.Nextafter32(want, 2)-want)) {
					t.Fatalf("position %d pair %d: table value %d %v, float64 trigonometry %v", pos, j, k, g, want)
				}
			}
		}
		// the norms
		qh, kvh := gaussian(H*HD, 51+uint64(pos)), gaussian(HD, 52)
		kvw := gaussian(HD, 53)
		kvwp := upload(t, d, kvw)
		var outs [2][]float32
		ring2 := upload(t, d, make([]float32, HD))
		for i, cs := range []Ptr{0, tab} {
			q, kv := upload(t, d, qh), upload(t, d, kvh)
			r2 := Ptr(0)
			if i == 1 {
				r2 = ring2
			}
			must(t, d.NormRopePairTable(0, q, H, 0, 0, kv, 1, kvwp, fp8, HD, eps, roff, freqp, rd, int64(pos), 1, cs, r2))
			outs[i] = append(download(t, d, q, H*HD), download(t, d, kv, HD)...)
		}
		if i, ok := firstBitDiff(outs[0], outs[1]); !ok {
			t.Fatalf("position %d: norms with the table: value %d %v, without %v", pos, i, outs[1][i], outs[0][i])
		}
		if i, ok := firstBitDiff(outs[0][H*HD:], download(t, d, ring2, HD)); !ok {
			t.Fatalf("position %d: the KV row's second copy differs at value %d", pos, i)
		}
	}
	sinks := upload(t, d, gaussian(H, 35))
	for _, c := range []struct {
		pos0, ratio, K int
		fast           bool
		cluster        int
	}{
		{700, 128, 0, true, DefaultAttnCluster}, // 128 + 5 keys: clusters
		{700, 128, 0, true, 0},                  // the split kernel, then its combine
		{40000, 128, 0, true, DefaultAttnCluster},
		{12000, 4, 512, true, DefaultAttnCluster}, // 640 keys: the tensor-core split and its combine
		{700, 128, 0, false, DefaultAttnCluster},  // exact mode
		{60, 0, 0, true, DefaultAttnCluster},      // window keys only
	} {
		must(t, d.SetOption(OptAttnCluster, c.cluster))
		must(t, d.SetOption(OptAttnSplit, DefaultAttnSplit))
		label := fmt.Sprintf("pos0 %d, ratio %d, fast %v, clusters %d", c.pos0, c.ratio, c.fast, c.cluster)
		nComp := 0
		if c.ratio > 0 {
			nComp = (c.pos0 + 1) / c.ratio
		}
		q, kv := upload(t, d, gaussian(H*HD, 31)), upload(t, d, gaussian(HD, 32))
		win := upload(t, d, gaussian(W*HD, 33))
		comp := upload(t, d, gaussian(max(nComp, 1)*HD, 34))
		K := max(c.K, 1)
		maxKeys := min(W, c.pos0+1) + nComp
		sel, nsel := make([]int32, K), []int32{0}
		if c.ratio == 4 {
			r := rand.New(rand.NewPCG(36, 36))
			nsel[0] = int32(min(c.K, nComp))
			for k := range int(nsel[0]) {
				sel[k] = int32(r.IntN(nComp))
			}
			maxKeys = min(W, c.pos0+1) + c.K
		}
		selp, nselp := tempAlloc(t, d, int64(4*K)), tempAlloc(t, d, 4)
		t.Cleanup(func() { d.Free(selp); d.Free(nselp) })
		must(t, UploadSlice(d, selp, sel))
		must(t, UploadSlice(d, nselp, nsel))
		must(t, d.RopeTable(0, freqp, rd, int64(c.pos0), tab))
		work := upload(t, d, make([]float32, max(1, AttentionWork(1, H, HD, maxKeys))))
		var outs [2][]float32
		var acts [2][]byte
		for i, cs := range []Ptr{0, tab} {
			poison(t, d, work, max(1, AttentionWork(1, H, HD, maxKeys)))
			a := &AttentionArgs{Q: q, KV: kv, Win: win, WCap: W, Comp: comp, Ratio: c.ratio, Sel: selp, NSel: nselp,
				K: K, Sinks: sinks, Pos0: c.pos0, N: 1, H: H, HD: HD, W: W, Scale: 0.044, MaxKeys: maxKeys,
				Work: work, Fast: c.fast, RopeTable: cs}
			outs[i], acts[i] = attentionOut(t, d, a, true, freqp, rd, roff, qseg)
		}
		if i, ok := firstBitDiff(outs[0], outs[1]); !ok {
			t.Fatalf("%s: output value %d (head %d): %v with the table, %v without", label, i, i/HD, outs[1][i], outs[0][i])
		}
		if i := firstByteDiff(acts[0], acts[1]); i >= 0 {
			t.Fatalf("%s: activation byte %d differs", label, i)
		}
	}
}
