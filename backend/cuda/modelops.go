package cuda

import (
	"fmt"
	"time"
	"unsafe"

	"ds4go/quant"
)

// Wrappers of the forward-pass operations of cuda/model.cu. Every pointer
// is a device address and every stride counts float32 elements; cuda/model.cu
// defines each operation (they mirror backend/cpu step by step). They queue
// work on stream s and return without waiting.

// MatMulEx is the general product of cuda/ds4cuda.h (ds4c_matmul_ex): for
// selection i < nsel and token t < ntok, y[i·ySel + t·yTok + r] =
// W_m[r]·act(i, t) with act(i, t) at act + (i/actDiv)·actSel + t·actTok
// bytes, m = ids[i] when ids ≠ 0, else i when nsel > 1, else 0. actTok 0
// means ActBytes; yTok 0 means w.Rows. exact sums every row in the order of
// quant.Dot / backend/cpu (bit-identical results, slower).
func (d *Device) MatMulEx(s Stream, w *Weight, ids Ptr, nsel int, act Ptr, actTok, actSel int64, actDiv, ntok int, y Ptr, yTok, ySel int64, exact bool) error {
	return d.matMulEx(s, w, ids, nsel, act, actTok, actSel, actDiv, ntok, y, yTok, ySel, mmFlags(exact))
}

// MatVecF32 is n tokens' (1 or 2) products y = w · act(x) of a single Q8_0
// or F16 matrix with the float rows x (w.Cols values, a multiple of 32; rows
// w.Cols apart, y's w.Rows apart, xn's and act's likewise; two tokens: the
// pipelined kernel forms both activations (Q8_0; in exact mode with
// OptMVTwo's bit 2, since v67), else the separate steps). F16: act(x)
// is RMSNormRef(x) with weights nw and eps when nw is set, else x, and act
// is unused; in fast mode with nw set one launch normalises and multiplies
// (OptMVF32 bit 2; xn not written), else RMSNormRef writes xn and MatMulEx
// runs; the same bits either way. Q8_0: act(x) is the
// Q8_0 activation of RMSNormRef(x) with weights nw and eps when nw is set,
// else of x. Where the pipelined kernel takes the product (OptMVF32) its
// CTAs form act(x) themselves, one launch; otherwise RMSNormRef writes xn
// (w.Cols floats; unused without nw), Quantize writes act
// (ActBytes(Q8_0, w.Cols) bytes) and MatMulEx runs. The same bits either
// way; x is not written. room: the pipelined kernel runs one CTA an SM and
// leaves part of each SM's shared memory free (DS4C_MM_ROOM), for kernels
// queued beside it on other streams; the same results.
func (d *Device) MatVecF32(s Stream, w *Weight, x, nw Ptr, eps float32, xn, act, y Ptr, exact, room bool, n int) error {
	if w.Mats != 1 {
		return fmt.Errorf("cuda: MatVecF32: %d matrices", w.Mats)
	}
	flags := mmFlags(exact)
	if room {
		flags |= mmRoom
	}
	return d.l.call("matvec_f32", func() int32 {
		return d.l.matvecF32(int32(w.Type), uintptr(w.Ptr), int64(w.Rows), int64(w.Cols), uintptr(x), uintptr(nw), eps,
			uintptr(xn), uintptr(act), uintptr(y), flags, int32(n), uintptr(s))
	})
}

// MatMulLate is MatMulEx of one selection of w (ntok tokens, activation
// rows actTok bytes apart, outputs yTok floats apart) queued so that the
// kernels after it launch only once everything before it is complete
// (DS4C_MM_LATE): the next kernel may then read this product's input
// before its own wait (HCPreArgs.HDone).
func (d *Device) MatMulLate(s Stream, w *Weight, act Ptr, actTok int64, ntok int, y Ptr, yTok int64, exact bool) error {
	return d.matMulEx(s, w, 0, 1, act, actTok, 0, 1, ntok, y, yTok, 0, mmFlags(exact)|mmLate)
}

// The flags of ds4c_matmul_ex (DS4C_MM_*).
const (
	mmExact int32 = 1
	mmLate  int32 = 2
	mmHalf  int32 = 4
	mmRoom  int32 = 8
)

// swigluFast is ds4c_swiglu_q8k's DS4C_SWIGLU_FAST flag.
const swigluFast int32 = 1

// mmFlags is DS4C_MM_EXACT when exact.
func mmFlags(exact bool) int32 {
	if exact {
		return mmExact
	}
	return 0
}

// matMulEx calls ds4c_matmul_ex with flags.
func (d *Device) matMulEx(s Stream, w *Weight, ids Ptr, nsel int, act Ptr, actTok, actSel int64, actDiv, ntok int, y Ptr, yTok, ySel int64, flags int32) error {
	return d.l.call("matmul_ex", func() int32 {
		return d.l.matmulEx(int32(w.Type), uintptr(w.Ptr), int64(w.Rows), int64(w.Cols), int64(w.Mats), uintptr(ids), int32(nsel),
			uintptr(act), actTok, actSel, int32(actDiv), int32(ntok), uintptr(y), yTok, ySel, flags, uintptr(s))
	})
}

// MatMulQ8Out is MatMulEx of ntok tokens (1 or 2; activation rows actTok
// bytes apart) without ids (nsel selections, selection s through matrix s
// when nsel > 1, its activation at act + (s/actDiv)·actSel bytes) into
// token t's y[t·nsel·w.Rows + s·w.Rows + r] (w.Rows a multiple of 32) that
// also writes yq, each token's Q8_0 activation of its row of nsel·w.Rows
// values (Quantize's bytes, ActBytes(Q8_0, nsel·w.Rows) of them a token,
// token 1's after token 0's): the input of the product after it (a decode
// step's or a verification pass's wo_b). Where the pipelined Q8_0 kernel
// takes the product (two tokens: in exact mode, OptMVTwo's bit 4), each
// CTA multiplies one block of 32 rows and quantizes it (one launch); else
// MatMulEx, then Quantize. The same bits either way.
func (d *Device) MatMulQ8Out(s Stream, w *Weight, nsel int, act Ptr, actTok, actSel int64, actDiv, ntok int, y, yq Ptr, exact bool) error {
	return d.l.call("matmul_q8out", func() int32 {
		return d.l.matmulQ8Out(int32(w.Type), uintptr(w.Ptr), int64(w.Rows), int64(w.Cols), int64(w.Mats), int32(nsel),
			uintptr(act), actTok, actSel, int32(actDiv), int32(ntok), uintptr(y), uintptr(yq), mmFlags(exact), uintptr(s))
	})
}

// GroupBytes is the size of the scratch buffer that Group and MatMulGrouped
// use for nsel selections over nmat matrices.
func (d *Device) GroupBytes(nsel, nmat int) int64 {
	return int64(d.l.groupBytes(int32(nsel), int64(nmat)))
}

// Group sorts nsel selections by their matrix ids (device int32) into
// scratch (GroupBytes bytes): the tile table of MatMulGrouped.
func (d *Device) Group(s Stream, ids Ptr, nsel, nmat int, scratch Ptr) error {
	return d.l.call("group", func() int32 {
		return d.l.group(uintptr(ids), int32(nsel), int64(nmat), uintptr(scratch), uintptr(s))
	})
}

// MatMulGrouped computes y[i·ySel + r] = W_ids[i][r]·act(i), act(i) at act +
// (i/actDiv)·actSel bytes, for i < nsel, from the tile table that Group
// built for the same ids into scratch: each matrix is read once per 32 of
// its selections (tensor cores; results bit-identical to quant.Dot in
// either mode). Below OptTCMinSel selections, or for a type without a
// tensor-core product, it runs MatMulEx in the given mode instead.
func (d *Device) MatMulGrouped(s Stream, w *Weight, ids Ptr, nsel int, act Ptr, actSel int64, actDiv int, y Ptr, ySel int64, scratch Ptr, exact bool) error {
	flags := mmFlags(exact)
	return d.l.call("matmul_grouped", func() int32 {
		return d.l.matmulGroup(int32(w.Type), uintptr(w.Ptr), int64(w.Rows), int64(w.Cols), int64(w.Mats), uintptr(ids), int32(nsel),
			uintptr(act), actSel, int32(actDiv), uintptr(y), ySel, uintptr(scratch), flags, uintptr(s))
	})
}

// MatMulGroupedSwiGLU is MatMulGrouped (actDiv 1) of the Q8_K activation
// rows of SwiGLU(g, u) (nsel rows of w.Cols floats at g and u, as
// SwiGLUQ8K with lim and the selections' weights wts, its fast form unless
// exact): a routed down product after its gate and up. Where the product
// runs as one launch of the decode kernel (IQ2_XXS, Q2_K; OptMVDec) its
// CTAs form the activation themselves and act is not written; otherwise
// SwiGLUQ8K into act (ActBytes(Q8_K, w.Cols) a row) and MatMulGrouped.
// The same bits either way.
func (d *Device) MatMulGroupedSwiGLU(s Stream, w *Weight, ids Ptr, nsel int, g, u Ptr, lim float32, wts, act, y Ptr, ySel int64, scratch Ptr, exact bool) error {
	flags := mmFlags(exact)
	return d.l.call("matmul_grouped_swiglu", func() int32 {
		return d.l.matmulSwiGLU(int32(w.Type), uintptr(w.Ptr), int64(w.Rows), int64(w.Cols), int64(w.Mats), uintptr(ids), int32(nsel),
			uintptr(g), uintptr(u), lim, uintptr(wts), uintptr(act), uintptr(y), ySel, uintptr(scratch), flags, uintptr(s))
	})
}

// MatMulGroupedPair is MatMulGrouped through two tensors of the same type
// and shape with the same ids, activations and scratch (a routed gate and
// up), outputs at y1 and y2: one launch where both run as single-token
// products of the decode kernel (IQ2_XXS, Q2_K; OptMVDec) or, for one
// selection of one Q8_0 or Q4_K matrix (a shared expert's gate and up), as
// one grid of the plain product kernel (OptMVPair); else the two calls.
// Same results either way.
func (d *Device) MatMulGroupedPair(s Stream, w1, w2 *Weight, ids Ptr, nsel int, act Ptr, actSel int64, actDiv int, y1, y2 Ptr, ySel int64, scratch Ptr, exact bool) error {
	if w1.Type != w2.Type || w1.Rows != w2.Rows || w1.Cols != w2.Cols || w1.Mats != w2.Mats {
		return fmt.Errorf("cuda: matmul pair: tensors of different types or shapes")
	}
	flags := mmFlags(exact)
	return d.l.call("matmul_grouped_pair", func() int32 {
		return d.l.matmulPair(int32(w1.Type), uintptr(w1.Ptr), uintptr(w2.Ptr), int64(w1.Rows), int64(w1.Cols), int64(w1.Mats), uintptr(ids), int32(nsel),
			uintptr(act), actSel, int32(actDiv), uintptr(y1), uintptr(y2), ySel, uintptr(scratch), flags, uintptr(s))
	})
}

// HalfLayout is the layout of the f16 activation rows MatMulGroupedHalf
// reads (GroupedHalf's answer; ToHalfAs writes it).
type HalfLayout int32

const (
	// HalfNone: MatMulGroupedHalf does not take the product.
	HalfNone HalfLayout = 0
	// HalfRows: ToHalf's rows as they are.
	HalfRows HalfLayout = 1
	// HalfPerm32: each 32-value block permuted so that position
	// 16s+8h+2q+e holds value 8q+4s+2h+e (the RS form's order, OptWGMoE
	// 5 and 6).
	HalfPerm32 HalfLayout = 2
)

// GroupedHalf reports whether, and with which activation layout,
// MatMulGroupedHalf takes weights of type t with rows of cols values for
// nsel selections (OptWGMoE on and offering the type — value 3 declines
// Q2_K —, a compute capability 9.0 device and a library built with
// sm_90a code, IQ2_XXS or Q2_K, cols a multiple of 256, nsel at least
// OptTCMinSel so that Group built the tile table).
func (d *Device) GroupedHalf(t quant.Type, cols, nsel int) HalfLayout {
	switch v := d.l.groupedHalfOK(int32(t), int64(cols), int32(nsel)); v {
	case 1, 2:
		return HalfLayout(v)
	}
	return HalfNone
}

// GroupedHalfOK reports whether MatMulGroupedHalf takes the product
// (GroupedHalf is not HalfNone).
func (d *Device) GroupedHalfOK(t quant.Type, cols, nsel int) bool {
	return d.GroupedHalf(t, cols, nsel) != HalfNone
}

// HCMixesOK reports whether HCMixes takes a mixer of type t with m rows of
// k values for n tokens (OptHCMix on, F32 or F16, 0 < m ≤ 32, k a
// multiple of 256, n ≥ 8).
func (d *Device) HCMixesOK(t quant.Type, m, k, n int) bool {
	return d.l.hcMixesOK(int32(t), int32(m), int64(k), int32(n)) == 1
}

// HCMixes is fast mode's mixing logits of a chunk: mix[t][r] = (fn_r · h_t)
// · rsqrt(mean(h_t²) + eps) for the n rows h_t of fn.Cols floats at h (16-
// byte aligned), products as three TF32 terms (about float32's accuracy),
// sums in any order. Only where HCMixesOK says so; otherwise an error with
// nothing queued.
func (d *Device) HCMixes(s Stream, fn *Weight, h Ptr, n int, eps float32, mix Ptr) error {
	return d.l.call("hc_mixes", func() int32 {
		return d.l.hcMixes(int32(fn.Type), uintptr(fn.Ptr), int32(fn.Rows), int64(fn.Cols), uintptr(h), int32(n), eps, uintptr(mix), uintptr(s))
	})
}

// GroupedGLUOK reports whether MatMulGroupedGLU takes gate and up weights
// of type t (rows × cols each) for nsel selections.
func (d *Device) GroupedGLUOK(t quant.Type, rows, cols, nsel int) bool {
	return d.l.gluOK(int32(t), int64(rows), int64(cols), int32(nsel)) == 1
}

// MatMulGroupedGLU is the routed experts' gate and up products
// (MatMulGroupedHalf of gate and up for the same selections, activations
// in HalfPerm32) and SwiGLUHalf of their outputs with the selections'
// weights wts and clamp lim, in one launch: yh[i] = f16 rows of gate.Rows
// values in layout lay, the same bits as the three calls. Only where
// GroupedGLUOK says so; otherwise an error with nothing queued.
func (d *Device) MatMulGroupedGLU(s Stream, gate, up *Weight, ids Ptr, nsel int, act Ptr, actSel int64, actDiv int, wts Ptr, lim float32, yh Ptr, lay HalfLayout, scratch Ptr) error {
	if up.Type != gate.Type || up.Rows != gate.Rows || up.Cols != gate.Cols || up.Mats != gate.Mats {
		return fmt.Errorf("cuda: gate/up product: gate %s %d×%d×%d, up %s %d×%d×%d", gate.Type, gate.Mats, gate.Rows, gate.Cols, up.Type, up.Mats, up.Rows, up.Cols)
	}
	perm := int32(0)
	if lay == HalfPerm32 {
		perm = 1
	}
	return d.l.call("matmul_grouped_glu", func() int32 {
		return d.l.matmulGLU(int32(gate.Type), uintptr(gate.Ptr), uintptr(up.Ptr), int64(gate.Rows), int64(gate.Cols), int64(gate.Mats),
			uintptr(ids), int32(nsel), uintptr(act), actSel, int32(actDiv), uintptr(wts), lim, uintptr(yh), perm, uintptr(scratch), uintptr(s))
	})
}

// MatMulGroupedHalf is fast mode's MatMulGrouped with f16 activation rows
// (ToHalfAs's, in GroupedHalf's layout) on the wgmma tensor cores: each weight dequantized to f16 with
// its scales, f32 sums (not bit-identical to quant.Dot). Only where
// GroupedHalfOK says so; otherwise an error with nothing queued.
func (d *Device) MatMulGroupedHalf(s Stream, w *Weight, ids Ptr, nsel int, act Ptr, actSel int64, actDiv int, y Ptr, ySel int64, scratch Ptr) error {
	return d.l.call("matmul_grouped_half", func() int32 {
		return d.l.matmulGroup(int32(w.Type), uintptr(w.Ptr), int64(w.Rows), int64(w.Cols), int64(w.Mats), uintptr(ids), int32(nsel),
			uintptr(act), actSel, int32(actDiv), uintptr(y), ySel, uintptr(scratch), mmHalf, uintptr(s))
	})
}

// GetRows dequantizes rows ids[i] (device int32) of w (F32, F16, BF16 or
// Q8_0) into dst + i·dstStride + k·copyStride for k < copies.
func (d *Device) GetRows(s Stream, w *Weight, ids Ptr, n int, dst Ptr, dstStride int64, copies int, copyStride int64) error {
	return d.l.call("get_rows", func() int32 {
		return d.l.getRows(int32(w.Type), uintptr(w.Ptr), int64(w.Rows)*int64(w.Mats), int64(w.Cols), uintptr(ids), int32(n),
			uintptr(dst), dstStride, int32(copies), copyStride, uintptr(s))
	})
}

// ArgmaxWork is the size of Argmax's work area.
const ArgmaxWork = 16

// Argmax sets *out (a device int32) to the id of the largest of n logits at
// x, as engine.Greedy picks it (the lowest id on ties, never a NaN unless
// every value is one). work is ArgmaxWork bytes, zero before the first call;
// each call leaves it zero, so a replayed graph may repeat it.
func (d *Device) Argmax(s Stream, x Ptr, n int, work, out Ptr) error {
	return d.l.call("argmax", func() int32 {
		return d.l.argmax(uintptr(x), int64(n), uintptr(work), uintptr(out), uintptr(s))
	})
}

// CandidateCTAs is the words of PickCandidates' counts area.
const CandidateCTAs = 1024

// CandidateWords is the int32 words of PickCandidates' output for cap
// candidates: a header of 4 (their count, even past cap; the greedy choice;
// its logit's bits; 0), then cap ids, then cap logits.
func CandidateWords(cap int) int { return 4 + 2*cap }

// PickCandidates writes min-p's candidates of the n logits at x to out
// (CandidateWords(cap) words): the greedy choice (Argmax, with its work area
// work, into the device int32 top), then in id order every id whose logit
// reaches a threshold a margin below the choice's logit + temp·ln(minP) −
// 1e-3 (a superset of engine.Sampler's min-p prefilter), and the choice.
// counts is CandidateCTAs words of work. temp and minP must be positive.
func (d *Device) PickCandidates(s Stream, x Ptr, n int, temp, minP float32, work, top, counts, out Ptr, cap int) error {
	return d.l.call("pick_candidates", func() int32 {
		return d.l.pickCands(uintptr(x), int64(n), temp, minP, uintptr(work), uintptr(top), uintptr(counts), uintptr(out), int32(cap), uintptr(s))
	})
}

// WaitToken queues a wait on s for a token the host gives later: one thread
// polls the 8-byte word at word (pinned host memory from MallocHost, 8-byte
// aligned) until its high half is seq, then sets *out (a device int32) to
// its low half. The host publishes a token with one 8-byte store of
// seq<<32 | token. After timeout it gives up: *out = 0 (a token in range,
// so that the step's kernels run as usual; its work is to be discarded)
// and seq is stored in the 4-byte word at flag (pinned host memory).
func (d *Device) WaitToken(s Stream, word, flag unsafe.Pointer, seq uint32, timeout time.Duration, out Ptr) error {
	return d.l.call("wait_token", func() int32 {
		return d.l.waitToken(uintptr(word), uintptr(flag), seq, int64(timeout), uintptr(out), uintptr(s))
	})
}

// RMSNormRef sets y_r = w ⊙ (x_r·rsqrt(mean(x_r²)+eps)) for rows rows of n
// values, rounding as backend/cpu does (w may be 0: no weight).
func (d *Device) RMSNormRef(s Stream, x Ptr, xStride int64, w, y Ptr, yStride int64, n, rows int, eps float32) error {
	return d.l.call("rmsnorm_ref", func() int32 {
		return d.l.rmsnormRef(uintptr(x), xStride, uintptr(w), uintptr(y), yStride, int64(n), int32(rows), eps, uintptr(s))
	})
}

// HCPreArgs are the arguments of HCPre.
type HCPreArgs struct {
	Head          bool // the output head's variant (no Sinkhorn, no post/comb)
	Mix           Ptr  // [n][M] mixing logits, RMS-scaled unless RawMix
	RawMix        bool // Mix holds fn·flat(h): scale by rsqrt(mean(h²)+NormEps) first (M ≤ 288)
	M             int
	Scale, Base   Ptr // hc scale (3 values; head: 1) and base (M values)
	HC, Iters     int
	HCEps         float32
	H             Ptr // [n][HC][D] streams
	D             int
	NormW         Ptr
	NormEps       float32
	X, Post, Comb Ptr // outputs: [n][D], [n][HC], [n][HC·HC]
	// XQ, when set, also receives x's Q8_0 activation ([n] rows of
	// ActBytes(Q8_0, D)), as Quantize would form it (HCPre only); with
	// XHalf instead x in f16 ([n] rows of D, as ToHalf would form them).
	XQ    Ptr
	XHalf bool
	N     int
	// HDone (with RawMix): H is complete when the kernel launches, because
	// Mix came from MatMulLate queued right before; the kernel sums H's
	// squares before waiting for that product.
	HDone bool
	// Parts > 0 (at most HCPostMixMaxTokens tokens): Mix holds HCPostMix's
	// parts [N][Parts][M+1], added in order for each token's raw logits and
	// streams' sum of squares; with PartsEx, HCPostMixEx's running sums
	// and squares (Parts is HCPostMixExParts), whose tree it completes in
	// the float-weight order (exact mode).
	Parts   int
	PartsEx bool
}

// HCPre computes the sub-block (or head) input from the streams.
func (d *Device) HCPre(s Stream, a *HCPreArgs) error {
	mode := int32(0)
	if a.Head {
		mode = 1
	}
	if a.RawMix {
		mode |= 2
		if a.HDone {
			mode |= 4
		}
	}
	if a.XHalf {
		mode |= 8
	}
	if a.Parts > 0 {
		mode |= 2 | int32(a.Parts)<<16
		if a.PartsEx {
			mode |= 16
		}
	}
	return d.l.call("hc_pre", func() int32 {
		return d.l.hcPre(mode, uintptr(a.Mix), int32(a.M), uintptr(a.Scale), uintptr(a.Base), int32(a.HC), int32(a.Iters), a.HCEps,
			uintptr(a.H), int64(a.D), uintptr(a.NormW), a.NormEps, uintptr(a.X), uintptr(a.Post), uintptr(a.Comb), uintptr(a.XQ), int32(a.N), uintptr(s))
	})
}

// HCPost folds out back into the streams h (in place).
func (d *Device) HCPost(s Stream, h, out, post, comb Ptr, hc, D, n int) error {
	return d.l.call("hc_post", func() int32 {
		return d.l.hcPost(uintptr(h), uintptr(out), uintptr(post), uintptr(comb), int32(hc), int64(D), int32(n), uintptr(s))
	})
}

// HCPostMixThreads is the slice of d one part of HCPostMix covers.
const HCPostMixThreads = 128

// HCPostMixParts returns how many parts HCPostMix forms for an embedding
// of D values and a mixing weight fn, or 0 when it does not take them
// (it needs 4 streams, at most 24 float rows of 4·D values, and D a
// multiple of 32).
func HCPostMixParts(hc, D int, fn *Weight) int {
	if hc != 4 || fn == nil || fn.Rows > 24 || fn.Mats != 1 || fn.Cols != hc*D ||
		(fn.Type != quant.F16 && fn.Type != quant.BF16 && fn.Type != quant.F32) {
		return 0
	}
	for _, t := range []int{HCPostMixThreads, 64, 32} {
		if D%t == 0 {
			return D / t
		}
	}
	return 0
}

// HCPostMix is HCPost of n tokens (1 … HCPostMixMaxTokens; the same
// streams) that also forms the next HCPre's raw mixing logits fn·flat(h)
// and the streams' sum of squares in parts (token t's [parts][fn.Rows+1]
// floats at part + t·parts·(fn.Rows+1); parts from HCPostMixParts), for
// HCPreArgs.Parts. The products' float order is not the product kernels'
// (fast mode).
func (d *Device) HCPostMix(s Stream, h, out, post, comb Ptr, hc, D int, fn *Weight, parts int, part Ptr, n int) error {
	return d.l.call("hc_post_mix", func() int32 {
		return d.l.hcPostMix(uintptr(h), uintptr(out), uintptr(post), uintptr(comb), int32(hc), int64(D), int32(fn.Type),
			uintptr(fn.Ptr), int32(fn.Rows), int32(parts), uintptr(part), int32(n), uintptr(s))
	})
}

// HCPostMixMaxTokens is the most tokens HCPostMix takes in one call.
const HCPostMixMaxTokens = 4

// HCPostMixMoE is HCPostMix of n tokens whose sub-block output is each
// token's MoE sum, formed in the kernel as MoECombine forms it (the same
// bits): token t's k routed outputs ye [n][k][D] added in ascending expert
// id of sel [n][k], then ysh [n][D] (0: none).
func (d *Device) HCPostMixMoE(s Stream, h, ye, sel, ysh Ptr, k int, post, comb Ptr, hc, D int, fn *Weight, parts int, part Ptr, n int) error {
	return d.l.call("hc_post_mix_moe", func() int32 {
		return d.l.hcPostMixMoE(uintptr(h), uintptr(ye), uintptr(sel), uintptr(ysh), int32(k), uintptr(post), uintptr(comb), int32(hc), int64(D),
			int32(fn.Type), uintptr(fn.Ptr), int32(fn.Rows), int32(parts), uintptr(part), int32(n), uintptr(s))
	})
}

// HCPostMixExParts is the number of parts (CTAs a token) of HCPostMixEx,
// and HCPostMixExD the embedding it takes (Flash's; cuda/ds4cuda.h
// DS4C_HC_EX_PARTS, DS4C_HC_EX_D).
const (
	HCPostMixExParts = 128
	HCPostMixExD     = 4096
)

// HCPostMixExOK reports whether HCPostMixEx takes an embedding of D
// values in hc streams and the mixing weight fn (4 streams of
// HCPostMixExD, at most 24 float rows of 4·D values).
func HCPostMixExOK(hc, D int, fn *Weight) bool {
	return hc == 4 && D == HCPostMixExD && fn != nil && fn.Rows <= 24 && fn.Mats == 1 && fn.Cols == hc*D &&
		(fn.Type == quant.F16 || fn.Type == quant.BF16 || fn.Type == quant.F32)
}

// HCPostMixExFloats is the floats of HCPostMixEx's parts for one token
// and m mixing rows: the [m][256] running sums, then HCPostMixExParts
// doubles.
func HCPostMixExFloats(m int) int { return 256*m + 2*HCPostMixExParts }

// HCPostMixEx is HCPostMix for exact mode (HCPostMixExOK shapes; n tokens,
// 1 … HCPostMixMaxTokens): the streams HCPost forms, and the next
// HCPre's raw mixing products in quant's float-weight order as their 256
// running sums, with the new streams' squares summed in double in
// HCPostMixExParts partial sums (token t's HCPostMixExFloats(fn.Rows)
// floats at part + t·that; part 8-byte aligned), for HCPreArgs.PartsEx:
// the same logits as the exact product. ye set (out 0): the sub-block
// output is each token's MoE sum as HCPostMixMoE forms it.
func (d *Device) HCPostMixEx(s Stream, h, out, ye, sel, ysh Ptr, k int, post, comb Ptr, hc, D int, fn *Weight, part Ptr, n int) error {
	return d.l.call("hc_post_mix_ex", func() int32 {
		return d.l.hcPostMixEx(uintptr(h), uintptr(out), uintptr(ye), uintptr(sel), uintptr(ysh), int32(k), uintptr(post), uintptr(comb),
			int32(hc), int64(D), int32(fn.Type), uintptr(fn.Ptr), int32(fn.Rows), uintptr(part), int32(n), uintptr(s))
	})
}

// Rope rotates x[t][j][off : off+rd] for t < ntok, j < heads (strides in
// floats) at position pos0 + t·posStep with the rd/2 frequencies at freqs
// (inverse: the conjugate rotation).
func (d *Device) Rope(s Stream, x Ptr, tokStride int64, heads int, headStride, off int64, freqs Ptr, rd int, pos0, posStep int64, ntok int, inverse bool) error {
	inv := int32(0)
	if inverse {
		inv = 1
	}
	return d.l.call("rope", func() int32 {
		return d.l.rope(uintptr(x), tokStride, int32(heads), headStride, off, uintptr(freqs), int32(rd), pos0, posStep, int32(ntok), inv, uintptr(s))
	})
}

// NormRope normalises every row x[t][j][0:hd] (t < ntok, j < heads;
// heads contiguous, headStride floats apart) by its RMS (times w unless w is
// 0), rotates its pairs from off to position pos0 + t, and rounds its first
// fp8n values through FP8 (fp8n > 0 only with one head): RMSNormRef, Rope
// and FP8Sim in one kernel, the same results.
func (d *Device) NormRope(s Stream, x Ptr, heads int, headStride int64, hd int, w Ptr, eps float32, off int64, freqs Ptr, rd int, pos0 int64, fp8n, ntok int) error {
	return d.l.call("norm_rope", func() int32 {
		return d.l.normRope(uintptr(x), int64(heads)*headStride, int32(heads), headStride, int32(hd), uintptr(w), eps, off, uintptr(freqs), int32(rd), pos0, int32(fp8n), int32(ntok), uintptr(s))
	})
}

// NormRopePair is NormRope of two tensors of contiguous rows of hd values
// (heads1 and heads2 rows a token, each with its weights and FP8 count)
// that share eps, off and the rotation: one launch for fewer than 8 tokens
// (a decode step's query heads and KV row), else two. The same bits.
func (d *Device) NormRopePair(s Stream, x1 Ptr, heads1 int, w1 Ptr, fp8n1 int, x2 Ptr, heads2 int, w2 Ptr, fp8n2 int, hd int, eps float32, off int64, freqs Ptr, rd int, pos0 int64, ntok int) error {
	return d.NormRopePairTable(s, x1, heads1, w1, fp8n1, x2, heads2, w2, fp8n2, hd, eps, off, freqs, rd, pos0, ntok, 0, 0, 0)
}

// NormRopePairTable is NormRopePair that, with cs set, reads the
// rotation's (cosine, sine) of each pair from RopeTable's table of the ntok
// positions from pos0 instead of computing them (the same values), and
// with ring set also writes x2's normed rows into that ring of ringCap
// slots of heads2·hd floats, token t's into slot (pos0 + t) mod ringCap, as
// RingWrite would (the KV rows of a decode step or a speculative pass into
// the window ring).
func (d *Device) NormRopePairTable(s Stream, x1 Ptr, heads1 int, w1 Ptr, fp8n1 int, x2 Ptr, heads2 int, w2 Ptr, fp8n2 int, hd int, eps float32, off int64, freqs Ptr, rd int, pos0 int64, ntok int, cs, ring Ptr, ringCap int) error {
	return d.l.call("norm_rope_pair", func() int32 {
		return d.l.normRopeP(uintptr(x1), int32(heads1), uintptr(w1), int32(fp8n1), uintptr(x2), int32(heads2), uintptr(w2), int32(fp8n2), int32(hd), eps, off, uintptr(freqs), int32(rd), pos0, int32(ntok), uintptr(cs), uintptr(ring), int64(ringCap), uintptr(s))
	})
}

// RopeTable writes the rotation's (cosine, sine) of each of the rd/2
// pairs of freqs at positions pos … pos+n−1 into cs (n·rd floats, position
// pos+t from float t·rd): the values Rope, NormRope and Attention's inverse
// rotation compute per pair, for the calls that take a table
// (NormRopePairTable, AttentionArgs.RopeTable) — so that a decode step or a
// speculative pass computes them once, off the layer's chain.
func (d *Device) RopeTable(s Stream, freqs Ptr, rd int, pos int64, n int, cs Ptr) error {
	return d.l.call("rope_table", func() int32 { return d.l.ropeTable(uintptr(freqs), int32(rd), pos, int32(n), uintptr(cs), uintptr(s)) })
}

// NormRopeHalf is NormRope (the chunk form: hd a multiple of 128 up to
// 1024, off even) writing the rows as f16 (as ToHalf rounds them) to xh,
// rows of hd values, instead of in place: x is left unchanged. Its output is
// AttentionArgs.Q for QHalf.
func (d *Device) NormRopeHalf(s Stream, x Ptr, heads int, headStride int64, hd int, w Ptr, eps float32, off int64, freqs Ptr, rd int, pos0 int64, fp8n, ntok int, xh Ptr) error {
	return d.l.call("norm_rope_half", func() int32 {
		return d.l.normRopeH(uintptr(x), int64(heads)*headStride, int32(heads), headStride, int32(hd), uintptr(w), eps, off, uintptr(freqs), int32(rd), pos0, int32(fp8n), int32(ntok), uintptr(xh), uintptr(s))
	})
}

// FP8Sim applies the FP8 e4m3 simulation (blocks of 64) to x[r][0:n].
func (d *Device) FP8Sim(s Stream, x Ptr, stride int64, rows, n int) error {
	return d.l.call("fp8_sim", func() int32 { return d.l.fp8Sim(uintptr(x), stride, int32(rows), int64(n), uintptr(s)) })
}

// FP4Sim applies the FP4 e2m1 simulation (blocks of 32) to x[r][0:n].
func (d *Device) FP4Sim(s Stream, x Ptr, stride int64, rows, n int) error {
	return d.l.call("fp4_sim", func() int32 { return d.l.fp4Sim(uintptr(x), stride, int32(rows), int64(n), uintptr(s)) })
}

// Hadamard applies the Walsh–Hadamard transform to rows of n values, then
// multiplies by scale.
func (d *Device) Hadamard(s Stream, x Ptr, stride int64, rows, n int, scale float32) error {
	return d.l.call("hadamard", func() int32 { return d.l.hadamard(uintptr(x), stride, int32(rows), int32(n), scale, uintptr(s)) })
}

// HadamardFP4 is Hadamard then FP4Sim on the same rows (n a multiple of
// 32), in one kernel where n is 32 … 512 (the same bits).
func (d *Device) HadamardFP4(s Stream, x Ptr, stride int64, rows, n int, scale float32) error {
	return d.l.call("hadamard_fp4", func() int32 {
		return d.l.hadamardFP4(uintptr(x), stride, int32(rows), int32(n), scale, uintptr(s))
	})
}

// IndexQuery readies the indexer's queries q [n][heads][hd] and head
// weights w [n][heads] for IndexScores: Rope of each row's last rd dims at
// position pos0 + t, HadamardFP4 of each row with hadScale, Scale of w by
// wScale — in one launch where the library offers it (OptIXQuery), the
// same bits either way.
func (d *Device) IndexQuery(s Stream, q, w Ptr, heads, hd, rd int, freqs Ptr, pos0 int64, n int, hadScale, wScale float32) error {
	return d.l.call("index_query", func() int32 {
		return d.l.indexQuery(uintptr(q), uintptr(w), int32(heads), int32(hd), int32(rd), uintptr(freqs), pos0, int32(n), hadScale, wScale, uintptr(s))
	})
}

// Scale multiplies n floats by f.
func (d *Device) Scale(s Stream, x Ptr, n int, f float32) error {
	return d.l.call("scale", func() int32 { return d.l.scaleVec(uintptr(x), int64(n), f, uintptr(s)) })
}

// AddAPE adds ape[(pos0+t) mod r] to rows t < n of dst (width values each).
func (d *Device) AddAPE(s Stream, dst, ape Ptr, width, r int, pos0, n int) error {
	return d.l.call("add_ape", func() int32 {
		return d.l.addAPE(uintptr(dst), uintptr(ape), int64(width), int32(r), int64(pos0), int32(n), uintptr(s))
	})
}

// RingWrite2 is RingWrite of two rings of the same shape in one launch:
// ringA from srcA and ringB from srcB.
func (d *Device) RingWrite2(s Stream, ringA, ringB Ptr, cap, width int, srcA, srcB Ptr, srcStride int64, pos0, n int) error {
	return d.l.call("ring_write2", func() int32 {
		return d.l.ringWrite2(uintptr(ringA), uintptr(ringB), int64(cap), int64(width), uintptr(srcA), uintptr(srcB), srcStride,
			int64(pos0), int32(n), uintptr(s))
	})
}

// RingWrite stores rows t of src at slot (pos0+t) mod cap of a ring of
// width-wide entries (only the last cap rows of n).
func (d *Device) RingWrite(s Stream, ring Ptr, cap, width int, src Ptr, srcStride int64, pos0, n int) error {
	return d.l.call("ring_write", func() int32 {
		return d.l.ringWrite(uintptr(ring), int64(cap), int64(width), uintptr(src), srcStride, int64(pos0), int32(n), uintptr(s))
	})
}

// CompPoolArgs are the arguments of CompPool.
type CompPoolArgs struct {
	KV, SC         Ptr // this chunk's entries, [n][CW]
	KVRing, SCRing Ptr // frontier rings, [Cap][CW]
	Cap, CW        int
	Pos0           int // position of the chunk's first entry
	R, Coff, W     int
	I0, NRows      int // rows to pool
	Rows           Ptr // output: NRows rows of W
}

// CompPool pools compressed rows I0 … I0+NRows−1.
func (d *Device) CompPool(s Stream, a *CompPoolArgs) error {
	return d.l.call("comp_pool", func() int32 {
		return d.l.compPool(uintptr(a.KV), uintptr(a.SC), uintptr(a.KVRing), uintptr(a.SCRing), int64(a.Cap), int64(a.CW), int64(a.Pos0),
			int32(a.R), int32(a.Coff), int64(a.W), int64(a.I0), int32(a.NRows), uintptr(a.Rows), uintptr(s))
	})
}

// CompEmitArgs are the arguments of CompEmit.
type CompEmitArgs struct {
	KV, SC         Ptr // this chunk's entries, [N][CW] (SC with the APE bias)
	KVRing, SCRing Ptr // frontier rings, [KVCap][CW] and [SCCap][CW]
	KVCap, SCCap   int
	CW             int // entry width: Coff·W
	Pos0, N        int // the chunk's first position and its entries
	R, Coff, W     int
	I0, NRows      int // the rows that complete (NRows may be 0)
	Rows           Ptr // output: NRows rows of W
	Norm           Ptr // the rows' RMSNorm weights
	Eps            float32
	Freqs          Ptr // rotation frequencies of the last RD values
	RD             int
	Post           CompPost
	FP8N           int     // CompPostFP8: the values rounded through FP8 (a multiple of 64)
	HadScale       float32 // CompPostHadamardFP4: the transform's scale
}

// CompPost is the post-processing of a compressor's emitted rows.
type CompPost int32

// The post-processing of CompEmit's rows.
const (
	CompPostNone        CompPost = 0 // as pooled, normalised and rotated
	CompPostFP8         CompPost = 1 // the first FP8N values through FP8 (FP8Sim): the attention's compressor
	CompPostHadamardFP4 CompPost = 2 // HadamardFP4 of the whole row: the indexer's compressor
)

// CompEmit is a compressor's step after its entries' APE bias (AddAPE):
// the rows I0 … I0+NRows−1 that complete pooled (CompPool), RMS-normalised
// (RMSNormRef), their last RD values rotated at position i·R (Rope) and
// post-processed, then the chunk's N entries written into the rings
// (RingWrite2). A decode step's single row takes one launch where the
// library's OptCompEmit allows it; the same bits either way.
func (d *Device) CompEmit(s Stream, a *CompEmitArgs) error {
	return d.l.call("comp_emit", func() int32 {
		return d.l.compEmit(uintptr(a.KV), uintptr(a.SC), uintptr(a.KVRing), uintptr(a.SCRing), int64(a.KVCap), int64(a.SCCap),
			int64(a.CW), int64(a.Pos0), int32(a.N), int32(a.R), int32(a.Coff), int64(a.W), int64(a.I0), int32(a.NRows),
			uintptr(a.Rows), uintptr(a.Norm), a.Eps, uintptr(a.Freqs), int32(a.RD), int32(a.Post), int32(a.FP8N), a.HadScale, uintptr(s))
	})
}

// IndexScores scores the indexer rows for each of n tokens. fast lets
// chunks of 8 or more tokens take the dots on the tensor cores (ds4cuda.h's
// DS4C_FAST: ≈ 2^-21 of Σ|q·k| from backend/cpu's order).
func (d *Device) IndexScores(s Stream, q, w, rows Ptr, ih, ihd, pos0, ratio, n int, scores Ptr, scStride int64, fast bool) error {
	return d.l.call("index_scores", func() int32 {
		return d.l.indexScores(uintptr(q), uintptr(w), uintptr(rows), int32(ih), int32(ihd), int64(pos0), int32(ratio), int32(n),
			uintptr(scores), scStride, fastFlag(fast), uintptr(s))
	})
}

// TopK's flags (ds4c_topk's DS4C_TOPK_ALL and DS4C_TOPK_ROWS).
const (
	// TopKAllIfFew: with R ≤ k, all R rows in order.
	TopKAllIfFew = 1
	// TopKRowOrder: the same picks in row order (ascending index), as the
	// CPU backend's indexer gives them and the attention adds them; the
	// radix kernels then skip their sort, half their instructions (past
	// 1024 picks the ranking kernel's are reordered after it; k at most
	// 12288 there).
	TopKRowOrder = 2
)

// TopK picks, per token t < n, the min(k, R) best scores (ties: lower
// index) best first (TopKRowOrder: in row order) into sel[t][…] and the
// count into nsel[t] (nsel may be 0); R is rFixed, or (pos0+t+1)/ratio
// when rFixed is 0. flags: TopKAllIfFew, TopKRowOrder.
func (d *Device) TopK(s Stream, scores Ptr, stride int64, rFixed, pos0, ratio, k int, flags int, sel, nsel Ptr, n int) error {
	return d.l.call("topk", func() int32 {
		return d.l.topk(uintptr(scores), stride, int64(rFixed), int64(pos0), int32(ratio), int32(k), int32(flags), uintptr(sel), uintptr(nsel), int32(n), uintptr(s))
	})
}

// AttentionArgs are the arguments of Attention.
type AttentionArgs struct {
	Q, KV     Ptr // [n][H][HD], [n][HD]
	Win       Ptr // window ring [WCap][HD]
	WCap      int
	Comp      Ptr // compressed rows, or 0
	Ratio     int
	Sel, NSel Ptr // indexer picks (ratio 4)
	K         int
	Sinks     Ptr
	Out       Ptr // [n][H][HD]
	Pos0, N   int
	H, HD, W  int
	Scale     float32
	MaxKeys   int // the most keys any token of the chunk has
	Work      Ptr // AttentionWork(N, H, HD, MaxKeys) floats: scores and probabilities, or fast single tokens' partial sums
	// RopeFreqs, when set, rotates the output's dims RopeOff…RopeOff+RopeDim
	// back (inverse RoPE in pairs at each token's position), as Rope with
	// inverse would after the call.
	RopeFreqs        Ptr
	RopeDim, RopeOff int
	// QAct, when set, also receives the output's Q8_0 activation, as
	// Quantize(Q8_0) of the flat [N][H][HD] output in rows of QSeg values
	// (ActBytes(Q8_0, QSeg) apart) would form it, after the rotation.
	QAct Ptr
	QSeg int
	// Fast lets the fast-mode kernels run (DS4C_FAST): chunks of 8 or more
	// tokens compute their scores and weighted sums on the tensor cores, and
	// chunks and single tokens take float exponentials, lane-sum softmax
	// denominators and fused multiply-adds. Otherwise every operation
	// rounds as backend/cpu's.
	Fast bool
	// QHalf: Q holds f16 rows (NormRopeHalf's); QNorm: Q holds the query
	// rows before NormRope (no weight, QEps, the rotation of RopeFreqs),
	// which the kernel applies itself; both: Q holds those rows as f16
	// (the same operations on their float values); OutHalf: Out receives
	// f16 rows, the inverse rotation applied (QAct must be 0) — the values
	// that the float output rotated and passed through ToHalf would hold.
	// Only in the form AttentionHalfIO names.
	QHalf, QNorm, OutHalf bool
	QEps                  float32
	// RopeTable: RopeTable's table of the N positions from Pos0 for
	// RopeFreqs and RopeDim, which the inverse rotation reads instead of
	// computing its (cosine, sine) per pair: the same values.
	RopeTable Ptr
}

// AttentionHalfIO is the form of f16 queries and output that Attention
// takes for n tokens of h heads of hd with the rotation of dims roff …
// roff+rd and the fast flag (fast chunks through the flash kernel;
// OptAttnHalf): 0 none, 1 QHalf with OutHalf, 2 QNorm with OutHalf, 3 QHalf
// and QNorm with OutHalf.
func (d *Device) AttentionHalfIO(n, h, hd, rd, roff int, fast bool) int {
	return int(d.l.attnHalfOK(int32(n), int32(h), int32(hd), int32(rd), int32(roff), fastFlag(fast)))
}

// flags are ds4c_attention's flags for a.
func (a *AttentionArgs) flags() int32 {
	f := fastFlag(a.Fast)
	if a.QHalf {
		f |= 2 // DS4C_ATTN_QH
	}
	if a.OutHalf {
		f |= 4 // DS4C_ATTN_OH
	}
	if a.QNorm {
		f |= 8 // DS4C_ATTN_QN
	}
	return f
}

// fastFlag is DS4C_FAST when fast is set.
func fastFlag(fast bool) int32 {
	if fast {
		return 1
	}
	return 0
}

// attnSplits is the library's DEC_SPLITS: fast mode's attention of fewer
// than 8 tokens splits the keys into at most this many parts, and each part
// leaves HD + 2 floats per (token, head) in the work buffer.
const attnSplits = 64

// attnSegKeys is the library's AP_SEG: the segmented attention order's keys
// a segment (cpu.AttnSegmentKeys), which sizes its side rows and partial
// sums in AttentionWork.
const attnSegKeys = 64

// AttentionWorkFor is the number of floats of AttentionArgs.Work that
// Attention needs for n tokens, h heads of hd, maxKeys keys and the fast
// flag under the library's current options (0: none, Work may be 0 —
// fast chunks of Flash's shape, whose one kernel keeps the scores on chip).
// AttentionWork is the most any form needs.
func (d *Device) AttentionWorkFor(n, h, hd, maxKeys int, fast bool) int {
	return int(d.l.attnWork(int32(n), int32(h), int32(hd), int64(maxKeys), fastFlag(fast)))
}

// AttentionWork is the number of floats of AttentionArgs.Work: the scores of
// every (token, head, key) and the segmented order's side rows (2·S + 1 a
// (token, head), S = ⌈maxKeys/64⌉ segments: k_attn_softmax_seg's), or, for
// fewer than 8 tokens, the partial sums of fast mode's split attention or
// of the segmented order's (the scores, then HD + 2 a segment, token and
// head) if those need more. ds4c_attention_work's rule.
func AttentionWork(n, h, hd, maxKeys int) int {
	nseg := (maxKeys + attnSegKeys - 1) / attnSegKeys
	w := n*h*maxKeys + n*h*(2*nseg+1)
	if n < 8 {
		w = max(w, n*h*attnSplits*(hd+2), n*h*maxKeys+nseg*n*h*(hd+2))
	}
	return w
}

// Attention runs sparse attention with sinks for every token and head.
func (d *Device) Attention(s Stream, a *AttentionArgs) error {
	return d.l.call("attention", func() int32 {
		return d.l.attention(uintptr(a.Q), uintptr(a.KV), uintptr(a.Win), int64(a.WCap), uintptr(a.Comp), int32(a.Ratio),
			uintptr(a.Sel), uintptr(a.NSel), int32(a.K), uintptr(a.Sinks), uintptr(a.Out), int64(a.Pos0), int32(a.N),
			int32(a.H), int32(a.HD), int32(a.W), a.Scale, int64(a.MaxKeys), uintptr(a.Work),
			uintptr(a.RopeFreqs), int32(a.RopeDim), int32(a.RopeOff), uintptr(a.QAct), int64(a.QSeg), a.QEps, uintptr(a.RopeTable), a.flags(), uintptr(s))
	})
}

// Router turns router logits [n][e] into k experts and weights per token.
func (d *Device) Router(s Stream, logits Ptr, e int, bias, tid2eid, tokens Ptr, k int, norm bool, wscale float32, sel, w Ptr, n int) error {
	return d.RouterQ8K(s, logits, e, bias, tid2eid, tokens, k, norm, wscale, sel, w, n, 0, 0, 0, 0)
}

// RouterQ8K is Router that also quantizes the tokens' input rows x [n][cols]
// (cols a multiple of 256, 16-byte aligned) to Q8_K activation rows act
// (actStride bytes apart), the bytes Quantize would form, in the same launch
// (x 0: none).
func (d *Device) RouterQ8K(s Stream, logits Ptr, e int, bias, tid2eid, tokens Ptr, k int, norm bool, wscale float32, sel, w Ptr, n int,
	x Ptr, cols int, act Ptr, actStride int64) error {
	nv := int32(0)
	if norm {
		nv = 1
	}
	return d.l.call("router", func() int32 {
		return d.l.router(uintptr(logits), int32(e), uintptr(bias), uintptr(tid2eid), uintptr(tokens), int32(k), nv, wscale,
			uintptr(sel), uintptr(w), int32(n), uintptr(x), int64(cols), uintptr(act), actStride, uintptr(s))
	})
}

// SwiGLURef sets y = w_r·(silu(g)·u) over rows rows of n values, with the
// clamp lim (none when ≤ 0) and per-row weights w (0: none).
func (d *Device) SwiGLURef(s Stream, g, u, y Ptr, n, rows int, lim float32, w Ptr) error {
	return d.l.call("swiglu_ref", func() int32 {
		return d.l.swigluRef(uintptr(g), uintptr(u), uintptr(y), int64(n), int32(rows), lim, uintptr(w), uintptr(s))
	})
}

// SwiGLUQ8K writes SwiGLURef's rows (n values, a multiple of 256)
// quantized to Q8_K activation rows actStride bytes apart: the bytes that
// SwiGLURef followed by Quantize would give, in one launch; with fast, fast
// mode's values instead (silu in float with the fast exponential, as
// SwiGLUHalf's, within a few float ulps).
func (d *Device) SwiGLUQ8K(s Stream, g, u, act Ptr, actStride int64, n, rows int, lim float32, w Ptr, fast bool) error {
	var flags int32
	if fast {
		flags = swigluFast
	}
	return d.l.call("swiglu_q8k", func() int32 {
		return d.l.swigluQ8K(uintptr(g), uintptr(u), uintptr(act), actStride, int64(n), int32(rows), lim, uintptr(w), flags, uintptr(s))
	})
}

// SwiGLUHalf is fast mode's SwiGLURef (silu in float with the fast
// exponential, within a few float ulps) with its values rounded to f16 rows
// of n at yh (as ToHalf) in layout lay (HalfPerm32: as ToHalfAs), in one
// pass: the down product's f16 input (n a multiple of 32).
func (d *Device) SwiGLUHalf(s Stream, g, u, yh Ptr, n, rows int, lim float32, w Ptr, lay HalfLayout) error {
	var flags int32
	if lay == HalfPerm32 {
		flags = 1
	}
	return d.l.call("swiglu_half", func() int32 {
		return d.l.swigluHalf(uintptr(g), uintptr(u), uintptr(yh), int64(n), int32(rows), lim, uintptr(w), flags, uintptr(s))
	})
}

// MoECombine sums each token's k expert outputs in ascending expert id, then
// adds the shared expert's output (ysh may be 0).
func (d *Device) MoECombine(s Stream, ye, sel, ysh, y Ptr, n, k, D int) error {
	return d.l.call("moe_combine", func() int32 {
		return d.l.moeCombine(uintptr(ye), uintptr(sel), uintptr(ysh), uintptr(y), int32(n), int32(k), int64(D), uintptr(s))
	})
}

// isFloatType reports whether products with weights of type t read float32
// activations directly.
func isFloatType(t quant.Type) bool { return t == quant.F32 || t == quant.F16 || t == quant.BF16 }
