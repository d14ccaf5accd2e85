package cuda

import (
	"fmt"
	"math"
	"testing"
)

// TestCompEmit holds a decode step's compressed row in one launch
// (OptCompEmit: k_comp_emit) to the kernels it replaces (OptCompEmit 0:
// CompPool, RMSNormRef, Rope, FP8Sim or HadamardFP4, RingWrite2), bit for
// bit: the emitted row and both rings afterwards. Flash's compressors: the
// attention's at ratio 4 (overlapping blocks, FP8 of the first 448 of 512
// values) and 128 (one block), the indexer's at ratio 4 (128 values,
// Hadamard and FP4); the first row (no block before it), later rows, one
// and two entries in the chunk (the rest from the rings), the ring wrapped.
func TestCompEmit(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptCompEmit, DefaultCompEmit) })
	const rd = 64
	freqs := make([]float32, rd/2)
	for i := range freqs {
		freqs[i] = float32(math.Pow(10000, -2*float64(i)/rd))
	}
	freqp := tempUpload(t, d, freqs)
	defer d.Free(freqp)
	for _, c := range []struct {
		name       string
		r, coff, w int
		cap        int
		post       CompPost
		fp8n       int
		pos0, n    int // the chunk; its last entry completes a row
		hadScale   float32
	}{
		{"attn r4 first", 4, 2, 512, 8, CompPostFP8, 448, 3, 1, 0},
		{"attn r4", 4, 2, 512, 8, CompPostFP8, 448, 4*1234 + 3, 1, 0},
		{"attn r4 two", 4, 2, 512, 8, CompPostFP8, 448, 4*77 + 2, 2, 0},
		{"attn r128", 128, 1, 512, 128, CompPostFP8, 448, 128*9 + 127, 1, 0},
		{"index r4", 4, 2, 128, 8, CompPostHadamardFP4, 0, 4*500 + 3, 1, 0.088388},
		{"index r4 first", 4, 2, 128, 8, CompPostHadamardFP4, 0, 3, 1, 0.088388},
		{"none r4", 4, 2, 256, 8, CompPostNone, 0, 4*9 + 3, 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cw := c.coff * c.w
			kv, sc := gaussian(c.n*cw, 41), gaussian(c.n*cw, 42)
			kvRing, scRing := gaussian(c.cap*cw, 43), gaussian(c.cap*cw, 44)
			norm := gaussian(c.w, 45)
			for i := range sc { // scores of a softmax's range
				sc[i] *= 3
			}
			kvp, scp, normp := tempUpload(t, d, kv), tempUpload(t, d, sc), tempUpload(t, d, norm)
			kvr, scr := tempAlloc(t, d, int64(4*len(kvRing))), tempAlloc(t, d, int64(4*len(scRing)))
			rows := tempAlloc(t, d, int64(4*c.w))
			defer func() {
				for _, p := range []Ptr{kvp, scp, normp, kvr, scr, rows} {
					d.Free(p)
				}
			}()
			i0 := (c.pos0+c.n)/c.r - 1
			run := func(opt int) (row, kr, sr []float32) {
				must(t, d.SetOption(OptCompEmit, opt))
				must(t, UploadSlice(d, kvr, kvRing))
				must(t, UploadSlice(d, scr, scRing))
				poison(t, d, rows, c.w)
				must(t, d.CompEmit(0, &CompEmitArgs{KV: kvp, SC: scp, KVRing: kvr, SCRing: scr, KVCap: c.cap, SCCap: c.cap,
					CW: cw, Pos0: c.pos0, N: c.n, R: c.r, Coff: c.coff, W: c.w, I0: i0, NRows: 1, Rows: rows, Norm: normp,
					Eps: 1e-6, Freqs: freqp, RD: rd, Post: c.post, FP8N: c.fp8n, HadScale: c.hadScale}))
				return download(t, d, rows, c.w), download(t, d, kvr, len(kvRing)), download(t, d, scr, len(scRing))
			}
			refRow, refKV, refSC := run(0)
			gotRow, gotKV, gotSC := run(DefaultCompEmit)
			for i, v := range refRow {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("separate kernels: value %d of the row is %v", i, v)
				}
			}
			for _, x := range []struct {
				what     string
				ref, got []float32
			}{{"row", refRow, gotRow}, {"kv ring", refKV, gotKV}, {"score ring", refSC, gotSC}} {
				if i, ok := firstBitDiff(x.ref, x.got); !ok {
					t.Fatalf("%s value %d: one launch %v, separate kernels %v", x.what, i, x.got[i], x.ref[i])
				}
			}
			// the chunk's last entry sits in its slot of both rings
			slot := (c.pos0 + c.n - 1) % c.cap
			if fmt.Sprint(gotKV[slot*cw:(slot+1)*cw]) != fmt.Sprint(kv[(c.n-1)*cw:]) {
				t.Fatalf("kv ring slot %d does not hold the chunk's last entry", slot)
			}
		})
	}
}
