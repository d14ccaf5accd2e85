package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"ds4go/quant"
)

// TestAttentionCluster holds fast single tokens' split attention with its
// combine in the same launch (OptAttnCluster: k_attn_split_cl's clusters of
// 8 splits) to the split kernel followed by the combine launch
// (OptAttnCluster 0), on Flash's shape (64 heads of 512, window 128), with
// the inverse rotation and the Q8_0 activation fused and without:
//   - up to 256 keys the clusters take the same 32-key chunks and their
//     empty splits add nothing, so the output and the activation are the
//     same bits;
//   - at 440 keys (two chunks a split instead of one) the splits differ, so
//     within the bound TestAttentionFast holds the split form to;
//   - at 640 keys the flash kernel takes the split (OptAttnSplit 2), which
//     the option leaves alone: the same bits.
//
// One and two tokens (two: 16 clusters, 128 CTAs).
func TestAttentionCluster(t *testing.T) {
	d := gpu(t)
	restoreAttnOptions(t, d)
	must(t, d.SetOption(OptAttnSplit, DefaultAttnSplit))
	const H, HD = attnH, attnHD
	const rd, roff, qseg = 64, HD - 64, 4096
	freqp := uploadFreqs(t, d, rd/2, 0.013)
	defer d.Free(freqp)
	for _, c := range []struct {
		pos0, ratio, K int
		same           bool    // the same bits expected
		bound          float64 // else the largest row error allowed
	}{
		{700, 128, 0, true, 0},       // 128 + 5 keys
		{700, 4, 64, true, 0},        // 192 keys
		{16380, 128, 0, true, 0},     // 128 + 128 keys
		{40000, 128, 0, false, 1e-4}, // 128 + 312 keys: 2 chunks a split
		{12000, 4, 512, true, 0},     // 640 keys: the flash kernel
	} {
		for _, nt := range []int{1, 2} {
			in := newDecAttn(t, d, c.pos0, c.ratio, c.K, nt, 31)
			maxKeys := in.maxKeys
			run := func(cluster int, fused bool) (out []float32, act []byte) {
				must(t, d.SetOption(OptAttnCluster, cluster))
				a := in.args(t, d)
				a.Fast = true
				return attentionOut(t, d, a, fused, freqp, rd, roff, qseg)
			}
			for _, fused := range []bool{false, true} {
				label := fmt.Sprintf("pos0 %d, ratio %d, %d keys, %d tokens, fused %v", c.pos0, c.ratio, maxKeys, nt, fused)
				ref, refAct := run(0, fused)
				got, gotAct := run(DefaultAttnCluster, fused)
				if c.same {
					if i, ok := firstBitDiff(ref, got); !ok {
						t.Fatalf("%s: output value %d (head %d): %v, the two launches %v", label, i, i/HD, got[i], ref[i])
					}
					if i := firstByteDiff(refAct, gotAct); i >= 0 {
						t.Fatalf("%s: activation byte %d differs", label, i)
					}
					continue
				}
				worst := 0.0
				for row := 0; row < nt*H; row++ {
					e := rowErr(ref[row*HD:(row+1)*HD], got[row*HD:(row+1)*HD])
					if !(e <= c.bound) {
						t.Fatalf("%s: token %d head %d: error %g of the row's largest magnitude (bound %g)", label, row/H, row%H, e, c.bound)
					}
					worst = max(worst, e)
				}
				t.Logf("%s: largest row error against the two launches %.3g", label, worst)
			}
			in.free(d)
		}
	}
}

// decAttn is one single-token attention case's inputs on the device,
// Flash's shape (attnH heads of attnHD, window attnW): nt tokens' queries
// and KV rows, a window ring of 2·attnW rows, the compressed rows up to
// pos0 + nt, the sinks, and for ratio 4 up to K random picks a token; work
// holds the scores of maxKeys keys.
type decAttn struct {
	pos0, ratio, k, nt, maxKeys              int
	q, kv, win, comp, sinks, sel, nsel, work Ptr
}

const attnH, attnHD, attnW = 64, 512, 128 // (decAttn's shape: Flash's)

// newDecAttn uploads a case's inputs, random from seeds seed … seed+5.
func newDecAttn(t *testing.T, d *Device, pos0, ratio, k, nt int, seed uint64) *decAttn {
	t.Helper()
	in := &decAttn{pos0: pos0, ratio: ratio, k: max(k, 1), nt: nt}
	nComp := (pos0 + nt) / ratio
	in.q, in.kv = tempUpload(t, d, gaussian(nt*attnH*attnHD, seed)), tempUpload(t, d, gaussian(nt*attnHD, seed+1))
	in.win = tempUpload(t, d, gaussian(2*attnW*attnHD, seed+2))
	in.comp = tempUpload(t, d, gaussian(nComp*attnHD, seed+3))
	in.sinks = tempUpload(t, d, gaussian(attnH, seed+4))
	sel := make([]int32, nt*in.k)
	nsel := make([]int32, nt)
	r := rand.New(rand.NewPCG(seed+5, seed+5))
	for tok := range nt {
		R := (pos0 + tok + 1) / 4
		nsel[tok] = int32(min(k, R))
		for j := range int(nsel[tok]) {
			sel[tok*in.k+j] = int32(r.IntN(R))
		}
	}
	in.sel, in.nsel = tempAlloc(t, d, int64(4*len(sel))), tempAlloc(t, d, int64(4*nt))
	must(t, UploadSlice(d, in.sel, sel))
	must(t, UploadSlice(d, in.nsel, nsel))
	in.maxKeys = attnW + k
	if ratio == 128 {
		in.maxKeys = attnW + nComp
	}
	in.work = tempAlloc(t, d, int64(4*AttentionWork(nt, attnH, attnHD, in.maxKeys)))
	return in
}

// args poisons the scores' work buffer and returns the case's exact-mode
// arguments (no output yet: attentionOut sets it).
func (in *decAttn) args(t *testing.T, d *Device) *AttentionArgs {
	t.Helper()
	poison(t, d, in.work, AttentionWork(in.nt, attnH, attnHD, in.maxKeys))
	return &AttentionArgs{Q: in.q, KV: in.kv, Win: in.win, WCap: 2 * attnW, Comp: in.comp, Ratio: in.ratio, Sel: in.sel,
		NSel: in.nsel, K: in.k, Sinks: in.sinks, Pos0: in.pos0, N: in.nt, H: attnH, HD: attnHD, W: attnW, Scale: 0.044,
		MaxKeys: in.maxKeys, Work: in.work}
}

// free releases the case's device buffers.
func (in *decAttn) free(d *Device) {
	for _, p := range []Ptr{in.q, in.kv, in.win, in.comp, in.sinks, in.sel, in.nsel, in.work} {
		d.Free(p)
	}
}

// uploadFreqs uploads n rotation frequencies step·(i+1).
func uploadFreqs(t *testing.T, d *Device, n int, step float32) Ptr {
	t.Helper()
	freqs := make([]float32, n)
	for i := range freqs {
		freqs[i] = step * float32(i+1)
	}
	return tempUpload(t, d, freqs)
}

// attentionOut runs a into a fresh output (poisoned first) and, fused,
// with the inverse rotation of dims roff … roff+rd (freqs) and the Q8_0
// activation in rows of qseg values: it returns the output and the
// activation's bytes (nil unfused).
func attentionOut(t *testing.T, d *Device, a *AttentionArgs, fused bool, freqs Ptr, rd, roff, qseg int) ([]float32, []byte) {
	t.Helper()
	n := a.N * a.H * a.HD
	o := tempAlloc(t, d, int64(4*n))
	defer d.Free(o)
	poison(t, d, o, n)
	a.Out = o
	if !fused {
		must(t, d.Attention(0, a))
		return download(t, d, o, n), nil
	}
	actBytes := int64(n/qseg) * d.ActBytes(quant.Q8_0, qseg)
	qa := tempAlloc(t, d, actBytes)
	defer d.Free(qa)
	a.RopeFreqs, a.RopeDim, a.RopeOff, a.QAct, a.QSeg = freqs, rd, roff, qa, qseg
	must(t, d.Attention(0, a))
	out := download(t, d, o, n)
	act := make([]byte, actBytes)
	must(t, DownloadSlice(d, act, qa))
	return out, act
}

// restoreAttnOptions sets the attention options a test changes back to
// their defaults when it ends.
func restoreAttnOptions(t *testing.T, d *Device) {
	t.Cleanup(func() {
		d.SetOption(OptAttnCluster, DefaultAttnCluster)
		d.SetOption(OptAttnSplit, DefaultAttnSplit)
	})
}

// TestAttentionWideChunk holds fast chunks' attention of more tokens than
// the GPU has SMs (one CTA a token for k_attn_flash and k_attn_wg, so
// tokens of a second wave: TestAttentionFast's 40 fit one) to
// TestAttentionFast's 2e-3 of a row's largest magnitude against exact
// mode, for OptAttnFlash 2 and 3, both ratios, 300 tokens at 700.
func TestAttentionWideChunk(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptAttnFlash, DefaultAttnFlash) })
	const H, HD, n = wideH, wideHD, wideN
	in := uploadAttnInputs(t, d, n, H, HD, wideW, widePos0, wideK, 41, 53, 7)
	defer in.free(d)
	for _, ratio := range []int{4, 128} {
		maxKeys := wideChunkKeys(ratio)
		work := tempAlloc(t, d, int64(4*AttentionWork(n, H, HD, maxKeys)))
		run := func(fast bool, flash int) []float32 {
			must(t, d.SetOption(OptAttnFlash, flash))
			wk := work
			if d.AttentionWorkFor(n, H, HD, maxKeys, fast) == 0 {
				wk = 0
			}
			out, _ := attentionOut(t, d, in.wideChunkArgs(ratio, wk, fast), false, 0, 0, 0, 0)
			return out
		}
		exact := run(false, DefaultAttnFlash)
		for _, flash := range []int{2, 3} {
			fast := run(true, flash)
			worst := 0.0
			for row := 0; row < n*H; row++ {
				worst = max(worst, rowErr(exact[row*HD:(row+1)*HD], fast[row*HD:(row+1)*HD]))
			}
			if !(worst <= 2e-3) {
				t.Errorf("ratio %d, %d tokens, attn_flash %d: largest row error %g of the row's largest magnitude against exact mode (bound 2e-3)", ratio, n, flash, worst)
			}
			t.Logf("ratio %d, %d tokens, attn_flash %d: largest row error %.3g against exact", ratio, n, flash, worst)
		}
		d.Free(work)
	}
}

// The wide chunk of TestAttentionWideChunk and TestAttentionTileStaging:
// more tokens (wideN) than an H100's or H200's 132 SMs, Flash's heads, at
// widePos0 with a window of wideW and wideK picks a token.
const wideH, wideHD, wideW, widePos0, wideK, wideN = 64, 512, 128, 700, 64, 300

// wideChunkKeys is the wide chunk's most keys a token at a ratio: the
// window and the picks (4), or the window and every compressed row (128).
func wideChunkKeys(ratio int) int {
	if ratio == 128 {
		return wideW + (widePos0+wideN)/128
	}
	return wideW + wideK
}

// wideChunkArgs is the wide chunk's attention over in at a ratio.
func (in attnInputs) wideChunkArgs(ratio int, work Ptr, fast bool) *AttentionArgs {
	return &AttentionArgs{Q: in.q, KV: in.kv, Win: in.win, WCap: 2 * wideW, Comp: in.comp, Ratio: ratio, Sel: in.sel, NSel: in.nsel,
		K: wideK, Sinks: in.sinks, Pos0: widePos0, N: wideN, H: wideH, HD: wideHD, W: wideW, Scale: 0.044,
		MaxKeys: wideChunkKeys(ratio), Work: work, Fast: fast}
}

// attnInputs are a chunk attention's inputs on the device (uploadAttnInputs).
type attnInputs struct{ q, kv, win, comp, sinks, sel, nsel Ptr }

// uploadAttnInputs uploads the inputs of n tokens' attention at pos0 for H
// heads of HD: gaussian queries, chunk rows, a window ring of 2W rows, the
// ratio-4 compressed rows and sinks (seeds from seed on), and K picks a
// token, pick k of token tok the row (k·mul + tok·add) mod the token's
// rows.
func uploadAttnInputs(t *testing.T, d *Device, n, H, HD, W, pos0, K int, seed uint64, mul, add int) attnInputs {
	t.Helper()
	in := attnInputs{
		q: tempUpload(t, d, gaussian(n*H*HD, seed)), kv: tempUpload(t, d, gaussian(n*HD, seed+1)),
		win: tempUpload(t, d, gaussian(2*W*HD, seed+2)), comp: tempUpload(t, d, gaussian((pos0+n)/4*HD, seed+3)),
		sinks: tempUpload(t, d, gaussian(H, seed+4)),
	}
	sel := make([]int32, n*K)
	nsel := make([]int32, n)
	for tok := range n {
		R := (pos0 + tok + 1) / 4
		nsel[tok] = int32(K)
		for k := range K {
			sel[tok*K+k] = int32((k*mul + tok*add) % R)
		}
	}
	in.sel, in.nsel = tempAlloc(t, d, int64(4*len(sel))), tempAlloc(t, d, int64(4*n))
	must(t, UploadSlice(d, in.sel, sel))
	must(t, UploadSlice(d, in.nsel, nsel))
	return in
}

func (in attnInputs) free(d *Device) {
	for _, p := range []Ptr{in.q, in.kv, in.win, in.comp, in.sinks, in.sel, in.nsel} {
		d.Free(p)
	}
}

// TestAttentionPOVec holds exact mode's single-token attention with the
// key rows found once a CTA and the key slices read four keys a load
// (OptAttnPOVec 1, k_attn_po), with the slices' staging swizzled and the
// serial loops' loads a group ahead (2), with that and the weighted sums of
// two heads a warp (3), with 2's loops and the softmax statistics formed
// once a head in a cluster of CTAs (4, k_attn_po_cl; past the exponentials'
// cache option 2), to the kernel's earlier form (0), bit for bit: output and Q8_0
// activation, one and two tokens, on Flash's shape with 133, 640, 1299
// (past the 1024 staged rows) and 2471 keys (past the exponentials'
// shared-memory cache too, so recomputed and summed from the per-chunk
// rows).
func TestAttentionPOVec(t *testing.T) {
	d := gpu(t)
	restoreAttnOptions(t, d)
	t.Cleanup(func() { d.SetOption(OptAttnPOVec, DefaultAttnPOVec); d.SetOption(OptAttnOrder, DefaultAttnOrder) })
	must(t, d.SetOption(OptAttnOrder, 0)) // (the serial order's kernels)
	const HD = attnHD
	const rd, roff, qseg = 64, HD - 64, 4096
	freqp := uploadFreqs(t, d, rd/2, 0.011)
	defer d.Free(freqp)
	for _, c := range []struct{ pos0, ratio, K int }{
		{700, 128, 0}, {12000, 4, 512}, {150000, 128, 0}, {300000, 128, 0},
	} {
		for _, nt := range []int{1, 2} {
			in := newDecAttn(t, d, c.pos0, c.ratio, c.K, nt, 41)
			maxKeys := in.maxKeys
			run := func(vec int, fused bool) (out []float32, act []byte) {
				must(t, d.SetOption(OptAttnPOVec, vec))
				return attentionOut(t, d, in.args(t, d), fused, freqp, rd, roff, qseg)
			}
			for _, fused := range []bool{false, true} {
				label := fmt.Sprintf("pos0 %d, ratio %d, %d keys, %d tokens, fused %v", c.pos0, c.ratio, maxKeys, nt, fused)
				ref, refAct := run(0, fused)
				for _, vec := range []int{1, 2, 3, 4} {
					got, gotAct := run(vec, fused)
					if i, ok := firstBitDiff(ref, got); !ok {
						t.Fatalf("%s, option %d: output value %d (head %d): %v, the earlier form %v", label, vec, i, i/HD, got[i], ref[i])
					}
					if i := firstByteDiff(refAct, gotAct); i >= 0 {
						t.Fatalf("%s, option %d: activation byte %d differs", label, vec, i)
					}
				}
			}
			in.free(d)
		}
	}
}

// TestAttentionTileStaging holds exact chunks' attention with the scores
// tiles' slices staged by cp.async (OptAttnTile 2, the default) to the
// register staging (1), bit for bit: 300 tokens of 64 heads of 512 at 700,
// both ratios, in the serial and the segmented order.
func TestAttentionTileStaging(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() {
		d.SetOption(OptAttnTile, DefaultAttnTile)
		d.SetOption(OptAttnOrder, DefaultAttnOrder)
	})
	in := uploadAttnInputs(t, d, wideN, wideH, wideHD, wideW, widePos0, wideK, 43, 59, 11)
	defer in.free(d)
	for _, order := range []int{0, DefaultAttnOrder} {
		must(t, d.SetOption(OptAttnOrder, order))
		for _, ratio := range []int{4, 128} {
			work := tempAlloc(t, d, int64(4*AttentionWork(wideN, wideH, wideHD, wideChunkKeys(ratio))))
			run := func(tile int) []float32 {
				must(t, d.SetOption(OptAttnTile, tile))
				out, _ := attentionOut(t, d, in.wideChunkArgs(ratio, work, false), false, 0, 0, 0, 0)
				return out
			}
			regs, async := run(1), run(2)
			diff := 0
			for i := range regs {
				if math.Float32bits(regs[i]) != math.Float32bits(async[i]) {
					diff++
				}
			}
			if diff != 0 {
				t.Errorf("order %d, ratio %d: %d of %d outputs differ between the staging forms", order, ratio, diff, len(regs))
			}
			d.Free(work)
		}
	}
}
