package cuda

import (
	"fmt"
	"log/slog"
	"math"
	"time"
	"unsafe"

	"ds4go/engine"
	"ds4go/model"
	"ds4go/quant"
)

// The forward-pass ops (engine.Backend), each the device version of the
// same op of backend/cpu: hc.go, attention.go, compressor.go, indexer.go and
// moe.go there describe the math; this file only sequences the kernels.
// Every op queues its work on the batch's stream and returns; Head waits for
// the logits.

// linJob is one product of linear: y[t·ldy + r] = W[r]·x_t.
type linJob struct {
	w   *Weight
	y   Ptr
	ldy int
	// half: y receives f16 rows (ldy halves apart) by MatMulHalfH, which
	// only the products MatMulHalf takes can give (Backend.half)
	half bool
}

// linear computes several products that share their input x (n rows of k
// floats, ldx apart) on the batch's main stream: quantized weights dot the
// input quantized once per activation format (bit-exactly as
// quant.Activation.Set does); float weights read x directly.
func (be *Backend) linear(b *batch, x Ptr, ldx, n int, jobs ...linJob) error {
	return be.linearOn(b, b.s, "act.", x, ldx, n, jobs...)
}

// linearOn is linear on stream s, its quantized activations in scratch
// buffers named tag + format (work on two streams at once uses two tags).
func (be *Backend) linearOn(b *batch, s Stream, tag string, x Ptr, ldx, n int, jobs ...linJob) error {
	if n == 0 || len(jobs) == 0 {
		return nil
	}
	d := be.dev
	k := jobs[0].w.Cols
	isX := be.isInput(b, x, ldx)
	if len(jobs) == 1 && !(isX && b.xq8 != 0) && !jobs[0].half {
		// (x's Q8_0 rows, when HCPre formed them, are used as they are)
		if ok, err := be.matVecF32(b, s, tag, jobs[0].w, x, ldx, 0, 0, jobs[0].y, jobs[0].ldy, n, false); ok {
			return err
		}
	}
	acts := map[quant.Type]Ptr{}
	var xh Ptr // x in f16, for the products MatMulHalf takes (fast mode, chunks)
	for _, j := range jobs {
		if j.w.Cols != k {
			return fmt.Errorf("cuda: linear: weights of %d and %d columns", k, j.w.Cols)
		}
		if j.half && !be.half(j.w, quant.F16, n) {
			return fmt.Errorf("cuda: linear: f16 output of a %v product of %d tokens without an f16 path", j.w.Type, n)
		}
		if be.half(j.w, quant.F16, n) {
			if xh == 0 && isX && b.xh != 0 {
				xh = b.xh // formed by HCPre
			}
			if xh == 0 {
				var err error
				if xh, err = b.sc.get(tag+"f16", 2*int64(k)*int64(n)); err != nil {
					return err
				}
				if err := d.ToHalf(s, x, ldx, k, n, xh); err != nil {
					return err
				}
			}
			if j.half {
				if err := d.MatMulHalfH(s, j.w, 1, xh, int64(k), 0, n, j.y, int64(j.ldy), 0); err != nil {
					return err
				}
				continue
			}
			if err := d.MatMulHalf(s, j.w, 1, xh, quant.F16, int64(k), 0, n, j.y, int64(j.ldy), 0); err != nil {
				return err
			}
			continue
		}
		act, actTok := x, int64(4*ldx)
		if !isFloatType(j.w.Type) {
			at, err := d.ActType(j.w.Type)
			if err != nil {
				return err
			}
			p, ok := acts[at]
			if !ok {
				if p, _, err = be.inputAct(b, s, tag, at, x, ldx, k, n); err != nil {
					return err
				}
				acts[at] = p
			}
			act, actTok = p, d.ActBytes(at, k)
		}
		if err := d.MatMulEx(s, j.w, 0, 1, act, actTok, 0, 1, n, j.y, int64(j.ldy), 0, be.exact()); err != nil {
			return err
		}
	}
	return nil
}

// isInput reports whether x with rows ldx floats apart is the sub-block
// input b.x (whose f16 and Q8_0 forms HCPre may have made: b.xh, b.xq8).
func (be *Backend) isInput(b *batch, x Ptr, ldx int) bool { return x == b.x && ldx == be.cfg.Embed }

// inputAct returns n rows of x (ldx floats apart, cols values each) in the
// activation format at of quantized weights, with the rows' stride in
// bytes: x's Q8_0 rows as HCPre formed them when x is the sub-block input,
// else x quantized on stream s into the scratch buffer tag + format.
func (be *Backend) inputAct(b *batch, s Stream, tag string, at quant.Type, x Ptr, ldx, cols, n int) (Ptr, int64, error) {
	ab := be.dev.ActBytes(at, cols)
	if at == quant.Q8_0 && be.isInput(b, x, ldx) && b.xq8 != 0 {
		return b.xq8, ab, nil
	}
	p, err := b.sc.get(tag+at.String(), ab*int64(n))
	if err != nil {
		return 0, 0, err
	}
	return p, ab, be.dev.Quantize(s, at, x, ldx, p, cols, n)
}

// matVecF32 runs the product of a single Q8_0 matrix w with n float rows x
// (ldx floats apart; y's rows ldy apart) through MatVecF32 — their
// quantization (after RMSNorm with weights nw, scratch xn, when nw is set)
// in the pipelined kernel's launch where that kernel takes the product —
// its fallback's activations in the scratch buffer tag + "Q8_0". ok reports
// whether w, n and the strides allowed it (one token; two to
// passTokensMax with rows contiguous, at most matVecTwoCols columns — in
// exact mode too since v67, where the library's exact two-token products
// take them, OptMVTwo's bit 2); else nothing was queued.
func (be *Backend) matVecF32(b *batch, s Stream, tag string, w *Weight, x Ptr, ldx int, nw, xn, y Ptr, ldy, n int, room bool) (ok bool, err error) {
	if w.Type != quant.Q8_0 || w.Mats != 1 {
		return false, nil
	}
	if n != 1 && (n > passTokensMax || ldx != w.Cols || ldy != w.Rows || w.Cols > matVecTwoCols) {
		return false, nil
	}
	act, err := b.sc.get(tag+quant.Q8_0.String(), int64(n)*be.dev.ActBytes(quant.Q8_0, w.Cols))
	if err != nil {
		return true, err
	}
	return true, be.dev.MatVecF32(s, w, x, nw, be.cfg.NormEps, xn, act, y, be.exact(), room, n)
}

// matVecTwoCols bounds the rows of two tokens that matVecF32 gives the
// pipelined kernel to form in each CTA: q_b's 1024 columns gain (its norm
// and quantization launches off the chain, −5 µs a layer), wo_b's 8192 lose
// (64 KB of floats read by each of its CTAs: +4.5 µs against a quantize
// launch; cuda/NOTES.md v46).
const matVecTwoCols = 2048

// passTokensMax is the most tokens of a chunk that the library's products
// of a few tokens take in one pipelined launch, the weights streamed once
// (MatVecF32, MatMulQ8Out; OptMVTwo's bits): a speculative pass of up to
// three drafts (engine.Options.DraftDepth).
const passTokensMax = 4

// quantAct quantizes n rows of cols floats at x (cols apart) on stream s
// into the batch's scratch buffer name, in the activation format of
// weights w; it returns the rows and their stride in bytes.
func (b *batch) quantAct(d *Device, s Stream, name string, w *Weight, x Ptr, cols, n int) (Ptr, int64, error) {
	at, err := d.ActType(w.Type)
	if err != nil {
		return 0, 0, err
	}
	ab := d.ActBytes(at, cols)
	p, err := b.sc.get(name, ab*int64(n))
	if err != nil {
		return 0, 0, err
	}
	return p, ab, d.Quantize(s, at, x, cols, p, cols, n)
}

// half reports whether the product of w for a chunk of n tokens with
// inputs of type xt (F16: ToHalf's rows; F32: floats) goes through
// MatMulHalf: fast mode only, and only chunks (the library's options
// decide the rest).
func (be *Backend) half(w *Weight, xt quant.Type, n int) bool {
	if w.Type == quant.Q8_0 && int64(w.Rows)*int64(w.Cols)*int64(w.Mats) > halfMaxQ8 {
		return false
	}
	return !be.exact() && n >= 8 && be.dev.HalfOK(w.Type, xt, n)
}

// ixSide reports whether Attention runs the indexer's query path of a
// batch of n tokens on the side stream (ixSideMax).
func (be *Backend) ixSide(n int) bool { return n < be.ixSideMax }

// halfMaxQ8 bounds the Q8_0 tensors MatMulHalf takes (their f16 copy is
// scratch of 2 bytes a value): Flash's largest, q_b, wo_a and wo_b, are 32M
// values; the output head (129280 × 4096) keeps the int8 kernels.
const halfMaxQ8 = 64 << 20

// Embed copies each token's embedding row into all HC streams.
func (be *Backend) Embed(bi engine.Batch, pos int, tokens []int32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if len(tokens) == 0 || len(tokens) > b.cap {
		return fmt.Errorf("cuda: chunk of %d tokens for a batch of %d", len(tokens), b.cap)
	}
	c := &be.cfg
	for _, tok := range tokens {
		if tok < 0 || int(tok) >= c.Vocab {
			return fmt.Errorf("cuda: token %d out of range", tok)
		}
	}
	return be.embed(b, pos, len(tokens), tokens)
}

// embed starts a chunk of n tokens at pos: tokens from the host, or (nil)
// the one token already in b.tokens (EmbedGreedy). Host tokens discard the
// greedy choices GreedyToken has not returned and the picked logits
// PickedLogits has not.
func (be *Backend) embed(b *batch, pos, n int, tokens []int32) error {
	return be.embedFrom(b, pos, n, tokens, false)
}

// embedFrom is embed; picked: the one token is the one SupplyToken will
// publish for b.pq.seq (EmbedPicked), waited for on the device.
func (be *Backend) embedFrom(b *batch, pos, n int, tokens []int32, picked bool) error {
	c := &be.cfg
	b.releasePick()
	b.abortGraph()
	b.n, b.pos = n, pos
	b.xq8, b.xh = 0, 0
	b.mixFn = nil
	if n == 1 && be.profileAt > 0 {
		if be.decoded.Add(1) == int64(be.profileAt) {
			if err := be.dev.Profiler(true); err != nil {
				return err
			}
			b.profiling = true
		}
	}
	if tokens != nil {
		b.gq.onDevice = false
		b.gq.taken = b.gq.heads
		b.pq.taken = b.pq.heads
		if err := b.setTokens(tokens); err != nil {
			return err
		}
	}
	if n <= graphMaxTokens && be.opts.GraphLayers > 0 {
		if err := b.beginGraph(); err != nil {
			return err
		}
	}
	if picked {
		q := &b.pq
		b.g.shape = append(b.g.shape, 'W')
		if err := be.dev.WaitToken(b.s, unsafe.Pointer(q.wordPtr()), unsafe.Pointer(q.flagPtr()), q.seq, q.timeout, b.tokens); err != nil {
			return err
		}
		q.waiting = true
	}
	D, HC := int64(c.Embed), int64(c.HC)
	return be.dev.GetRows(b.s, be.embd, b.tokens, b.n, b.h, HC*D, c.HC, D)
}

// mixOut is where HCPre finds its mixing logits (mixes).
type mixOut struct {
	ptr   Ptr  // the logits, or HCPostMix's parts
	raw   bool // HCPreArgs.RawMix
	late  bool // HCPreArgs.HDone
	parts int  // HCPreArgs.Parts
	ex    bool // HCPreArgs.PartsEx
}

// mixes computes the hyper-connection mixing logits fn·flat(h_t) into out
// [n][fn.Rows], or finds them formed by the HCPost before (HCPostMix's
// parts for fn). raw: they still need HCPre's scaling by
// rsqrt(mean(h_t²)+eps) (HCPreArgs.RawMix) — all forms but fast mode's
// HCMixes, which applies it in the same pass over the streams. late: the
// product was queued late (MatMulLate: float weights, no activation to
// quantize), so that the HCPre queued next may read the streams before its
// wait (HCPreArgs.HDone).
func (be *Backend) mixes(b *batch, fn *Weight, out Ptr) (mixOut, error) {
	if b.mixFn != nil && b.mixFn == fn {
		b.mixFn = nil
		return mixOut{ptr: b.mixPart, raw: true, parts: b.mixParts, ex: b.mixEx}, nil
	}
	b.mixFn = nil
	HCD := be.cfg.HC * be.cfg.Embed
	if !be.exact() && fn.Cols == HCD && be.dev.HCMixesOK(fn.Type, fn.Rows, HCD, b.n) {
		return mixOut{ptr: out}, be.dev.HCMixes(b.s, fn, b.h, b.n, be.cfg.NormEps, out)
	}
	if be.half(fn, quant.F32, b.n) {
		// fast mode's chunks: the streams as they are (float range: they
		// are not normalised) on the TF32 tensor cores through cuBLAS
		return mixOut{ptr: out, raw: true}, be.dev.MatMulHalf(b.s, fn, 1, b.h, quant.F32, int64(HCD), 0, b.n, out, int64(fn.Rows), 0)
	}
	if isFloatType(fn.Type) && be.hcEarly {
		return mixOut{ptr: out, raw: true, late: true}, be.dev.MatMulLate(b.s, fn, b.h, int64(4*HCD), b.n, out, int64(fn.Rows), be.exact())
	}
	return mixOut{ptr: out, raw: true}, be.linear(b, b.h, HCD, b.n, linJob{w: fn, y: out, ldy: fn.Rows})
}

// postMixParts returns the parts in which HCPost after the sub-block forms
// the next HCPre's mixing products (HCPostMix: fast mode's decode steps;
// ex, HCPostMixEx: exact mode's, Flash's shapes), or 0 where it does not.
func (be *Backend) postMixParts(b *batch, layer int, sub engine.SubBlock) (parts int, ex bool) {
	if !be.hcPostMix || b.n > be.postMixMax {
		return 0, false
	}
	fn := be.nextMixFn(layer, sub)
	if be.exact() {
		if be.hcPostMixEx && HCPostMixExOK(be.cfg.HC, be.cfg.Embed, fn) {
			return HCPostMixExParts, true
		}
		return 0, false
	}
	return HCPostMixParts(be.cfg.HC, be.cfg.Embed, fn), false
}

// nextMixFn is the mixing weight of the HCPre that follows HCPost(layer,
// sub): the layer's FFN one, the next layer's attention one, or the head's.
func (be *Backend) nextMixFn(layer int, sub engine.SubBlock) *Weight {
	switch {
	case sub == engine.AttnSub:
		return be.layer(layer).hcFFN.fn
	case layer+1 < len(be.layers):
		return be.layers[layer+1].hcAttn.fn
	case layer == len(be.layers):
		return be.mtp.head.fn // the MTP block's FFN: its head
	}
	return be.head.fn
}

func (L *dlayer) hcOf(sub engine.SubBlock) (*dhc, Ptr) {
	if sub == engine.AttnSub {
		return &L.hcAttn, L.attnNorm
	}
	return &L.hcFFN, L.ffnNorm
}

// HCPre computes the sub-block input and keeps post/comb for HCPost.
func (be *Backend) HCPre(bi engine.Batch, layer int, sub engine.SubBlock) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	c := &be.cfg
	L := be.layer(layer)
	hw, normW := L.hcOf(sub)
	M := c.HCMixes()
	mx, err := b.sc.f32("hc.mixes", b.n*M)
	if err != nil {
		return err
	}
	mo, err := be.mixes(b, hw.fn, mx)
	if err != nil {
		return err
	}
	// The sub-block's first Q8_0 products (query/KV, shared expert) read x
	// quantized, or in f16 where they go through MatMulHalf (fast chunks):
	// hc_pre forms that row too (linearOn takes it).
	first := L.qa
	if sub == engine.FFNSub {
		first = L.gateSh
	}
	b.xq8, b.xh = 0, 0
	var xq Ptr
	xhalf := first != nil && be.half(first, quant.F16, b.n)
	switch {
	case xhalf:
		if xq, err = b.sc.get("x.f16", 2*int64(c.Embed)*int64(b.n)); err != nil {
			return err
		}
	case first != nil && first.Type == quant.Q8_0:
		if xq, err = b.sc.get("x.q8_0", be.dev.ActBytes(quant.Q8_0, c.Embed)*int64(b.n)); err != nil {
			return err
		}
	}
	if err := be.dev.HCPre(b.s, &HCPreArgs{
		Mix: mo.ptr, RawMix: mo.raw, M: M, Scale: hw.scale, Base: hw.base, HC: c.HC, Iters: c.SinkhornIters, HCEps: c.HCEps,
		H: b.h, D: c.Embed, NormW: normW, NormEps: c.NormEps, X: b.x, Post: b.post, Comb: b.comb, XQ: xq, XHalf: xhalf, N: b.n,
		HDone: mo.late, Parts: mo.parts, PartsEx: mo.ex,
	}); err != nil {
		return err
	}
	if xhalf {
		b.xh = xq
	} else {
		b.xq8 = xq
	}
	return nil
}

// HCPost folds the sub-block output back into the streams.
func (be *Backend) HCPost(bi engine.Batch, layer int, sub engine.SubBlock) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	c := &be.cfg
	// an FFN's MoE sum left to this call (moeFold)
	moe := b.moe
	b.moe = moeSum{}
	if sub != engine.FFNSub {
		moe = moeSum{}
	}
	// Decode steps: the next HCPre's mixing products formed here, in
	// parts, instead of by a product kernel of their own (exact mode:
	// their running sums in the products' order).
	b.mixFn = nil
	next := be.nextMixFn(layer, sub)
	if parts, ex := be.postMixParts(b, layer, sub); parts > 0 {
		size := b.n * parts * (next.Rows + 1)
		if ex {
			size = b.n * HCPostMixExFloats(next.Rows)
		}
		part, err := b.sc.f32("hc.parts", size)
		if err != nil {
			return err
		}
		switch {
		case ex && moe.k > 0:
			err = be.dev.HCPostMixEx(b.s, b.h, 0, moe.ye, moe.sel, moe.ysh, moe.k, b.post, b.comb, c.HC, c.Embed, next, part, b.n)
		case ex:
			err = be.dev.HCPostMixEx(b.s, b.h, b.out, 0, 0, 0, 0, b.post, b.comb, c.HC, c.Embed, next, part, b.n)
		case moe.k > 0:
			err = be.dev.HCPostMixMoE(b.s, b.h, moe.ye, moe.sel, moe.ysh, moe.k, b.post, b.comb, c.HC, c.Embed, next, parts, part, b.n)
		default:
			err = be.dev.HCPostMix(b.s, b.h, b.out, b.post, b.comb, c.HC, c.Embed, next, parts, part, b.n)
		}
		if err != nil {
			return err
		}
		b.mixFn, b.mixPart, b.mixParts, b.mixEx = next, part, parts, ex
	} else {
		if moe.k > 0 { // (not expected: FFN asks postMixParts)
			b.moe = moe
			if err := be.formMoE(b); err != nil {
				return err
			}
		}
		if err := be.dev.HCPost(b.s, b.h, b.out, b.post, b.comb, c.HC, c.Embed, b.n); err != nil {
			return err
		}
	}
	if sub == engine.FFNSub {
		return b.segment(layer)
	}
	return nil
}

// Head computes the head input of every chunk row and the logits of the
// requested rows.
func (be *Backend) Head(bi engine.Batch, rows []int, logits []float32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	return be.headRows(b, rows, logits, &be.head)
}

// headRows is Head with the hyper-connection head and final norm hw (the
// model's, or the MTP block's).
func (be *Backend) headRows(b *batch, rows []int, logits []float32, hw *dhead) error {
	var err error
	d := be.dev
	D, V := be.cfg.Embed, be.cfg.Vocab
	if len(logits) < len(rows)*V {
		return fmt.Errorf("cuda: head: %d rows need %d logits, got %d", len(rows), len(rows)*V, len(logits))
	}
	for i, r := range rows {
		if r < 0 || r >= b.n || (i > 0 && r <= rows[i-1]) {
			return fmt.Errorf("cuda: head rows %v: not ascending rows of the chunk of %d", rows, b.n)
		}
	}
	if err := be.headIn(b, hw); err != nil {
		return err
	}
	if len(rows) == 0 {
		if err := b.finish(); err != nil {
			return err
		}
		return d.SyncStream(b.s)
	}
	// Gather the requested rows (device indices) unless they are
	// consecutive (the whole chunk, or a run of it: an offset into headIn,
	// no round trip to the host), then the vocabulary projection.
	in := b.headIn
	if rows[len(rows)-1]-rows[0] == len(rows)-1 {
		in += Ptr(4 * int64(rows[0]*D))
	} else {
		if in, err = b.sc.f32("head.in", len(rows)*D); err != nil {
			return err
		}
		idx, err := b.sc.get("head.rows", 4*int64(len(rows)))
		if err != nil {
			return err
		}
		ids := make([]int32, len(rows))
		for i, r := range rows {
			ids[i] = int32(r)
		}
		if err := b.flush(); err != nil {
			return err
		}
		if err := d.SyncStream(b.s); err != nil {
			return err
		}
		if err := UploadSlice(d, idx, ids); err != nil {
			return err
		}
		hin := &Weight{Type: quant.F32, Rows: b.n, Cols: D, Mats: 1, Ptr: b.headIn}
		if err := d.GetRows(b.s, hin, idx, len(rows), in, int64(D), 1, 0); err != nil {
			return err
		}
	}
	lg, err := b.sc.f32("head.logits", len(rows)*V)
	if err != nil {
		return err
	}
	if err := be.linear(b, in, D, len(rows), linJob{w: be.out, y: lg, ldy: V}); err != nil {
		return err
	}
	graph := b.g.capturing
	if err := b.finish(); err != nil {
		return err
	}
	// A few rows (decode) come back through pinned memory, the copy queued
	// behind the projection: no second round trip after the sync, and no
	// staging of a pageable copy.
	nb := 4 * len(rows) * V
	if len(rows) <= headPinRows {
		if b.logPin == nil {
			if b.logPin, err = d.MallocHost(4 * headPinRows * V); err != nil {
				return err
			}
		}
		if err := d.DownloadAsync(b.logPin[:nb], lg, b.s); err != nil {
			return err
		}
	}
	t0 := time.Now()
	if err := d.SyncStream(b.s); err != nil {
		return err
	}
	if b.profiling {
		b.profiling = false
		if err := d.Profiler(false); err != nil {
			return err
		}
	}
	if graph {
		be.gstats.waitNs.Add(int64(time.Since(t0)))
	}
	if len(rows) <= headPinRows {
		copy(AsBytes(logits[:len(rows)*V]), b.logPin[:nb])
		return nil
	}
	return DownloadSlice(d, logits[:len(rows)*V], lg)
}

// headIn forms the head's input of every chunk row (the hyper-connection
// head and the final norm) into b.headIn.
func (be *Backend) headIn(b *batch, hw *dhead) error {
	c := &be.cfg
	mx, err := b.sc.f32("head.mixes", b.n*c.HC)
	if err != nil {
		return err
	}
	mo, err := be.mixes(b, hw.fn, mx)
	if err != nil {
		return err
	}
	return be.dev.HCPre(b.s, &HCPreArgs{
		Head: true, Mix: mo.ptr, RawMix: mo.raw, M: c.HC, Scale: hw.scale, Base: hw.base, HC: c.HC, HCEps: c.HCEps,
		H: b.h, D: c.Embed, NormW: hw.norm, NormEps: c.NormEps, X: b.headIn, N: b.n, HDone: mo.late, Parts: mo.parts,
		PartsEx: mo.ex,
	})
}

// headPinRows is the most rows of logits Head returns through pinned memory
// (4 × 129280 floats: 2 MiB per batch).
const headPinRows = 4

// Attention runs the attention sub-block on b.x into b.out.
func (be *Backend) Attention(bi engine.Batch, si engine.State, layer int) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	st, err := be.stateOf(si)
	if err != nil {
		return err
	}
	c := &be.cfg
	d, s := be.dev, b.s
	L := be.layer(layer)
	tabs := st.layers[layer]
	n, D, H, HD, QL, rd := b.n, c.Embed, c.Heads, c.HeadDim, c.QLoraRank, c.RopeDim
	nope := HD - rd
	var e error
	buf := func(name string, cnt int) Ptr { return b.sc.getE(&e, name, 4*int64(cnt)) }

	// Every projection of the sub-block input: the query and KV ones on the
	// main stream, the compressors' on the side stream (below). qr stays the
	// raw q_a product; qrn is its RMSNorm.
	qr, qrn, kv := buf("attn.qr", n*QL), buf("attn.qrn", n*QL), buf("attn.kv", n*HD)
	jobs := []linJob{{w: L.qa, y: qr, ldy: QL}, {w: L.kv, y: kv, ldy: HD}}
	// kvSide: a decode step's (or a speculative pass's) KV product on the
	// side stream (below)
	kvSide := be.kvSide && n <= be.stepMax && b.side != b.s
	if kvSide {
		jobs = jobs[:1]
	}
	var sideJobs []linJob
	scoring := L.idx != nil && (b.pos+n)/L.ratio > c.IndexerTopK
	b.markRatio(L.ratio)
	b.mark(scoring)
	// The indexer's query path (its own norm of q_a's row, its product,
	// rotation and scale, the scores and their top-k) runs on the side
	// stream, behind the compressors, beside q_b and the query norms on the
	// main stream (decode steps: ixSideMax).
	ixSide := scoring && be.ixSide(n) && b.side != b.s
	// ixPar: that path on a stream of its own (side2), forked right after
	// q_a, beside the compressors (the indexer's compressor first on the
	// side stream, marked), with the head weights' product; the scores wait
	// for the mark.
	ixPar := ixSide && be.ixPar && b.side2 != b.side
	var ckv, csc, ikv, isc, iw Ptr
	var ixJobs []linJob // (the indexer compressor's products)
	if L.comp != nil {
		cw := L.comp.coff * HD
		ckv, csc = buf("attn.ckv", n*cw), buf("attn.csc", n*cw)
		sideJobs = append(sideJobs, linJob{w: L.comp.kv, y: ckv, ldy: cw}, linJob{w: L.comp.gate, y: csc, ldy: cw})
	}
	if L.idx != nil {
		cw := 2 * c.IndexerHeadDim
		ikv, isc = buf("idx.ckv", n*cw), buf("idx.csc", n*cw)
		ixJobs = []linJob{{w: L.idx.comp.kv, y: ikv, ldy: cw}, {w: L.idx.comp.gate, y: isc, ldy: cw}}
		if !ixPar {
			sideJobs, ixJobs = append(sideJobs, ixJobs...), nil
		}
		if scoring {
			iw = buf("idx.w", n*c.IndexerHeads)
			if !ixPar { // (ixPar: on side2, below)
				jobs = append(jobs, linJob{w: L.idx.proj, y: iw, ldy: c.IndexerHeads})
			}
		}
	}
	q := buf("attn.q", n*H*HD)
	var iq, ixqr Ptr
	if scoring {
		iq = buf("idx.q", n*c.IndexerHeads*c.IndexerHeadDim)
	}
	if ixSide { // (the indexer query's own norm of q_a's row: ixHead)
		ixqr = buf("idx.qr", n*QL)
	}
	// Fast chunks of the flash kernel: the queries go in and the output
	// (rotated back) comes out as f16 rows, the output projection's input.
	halfOA := be.half(L.outA, quant.F16, n)
	hio := 0 // AttentionHalfIO's form
	if halfOA {
		hio = d.AttentionHalfIO(n, H, HD, rd, nope, !be.exact())
	}
	if hio == 3 && !be.half(L.qb, quant.F16, n) {
		hio = 2 // (form 3: q_b's product with f16 output, on the f16 copy)
	}
	halfIO := hio > 0
	var o, qh, oh Ptr
	if halfIO {
		var err error
		if hio == 1 || hio == 3 {
			if qh, err = b.sc.get("attn.q.f16", 2*int64(n*H*HD)); err != nil {
				return err
			}
		}
		if oh, err = b.sc.get("attn.oa.f16", 2*int64(n*H*HD)); err != nil {
			return err
		}
	} else {
		o = buf("attn.o", n*H*HD)
	}
	if e != nil {
		return e
	}
	// Side stream: the compressors (products, pooling of completed rows,
	// post-processing), which only the attention and the indexer's scores
	// read; joined before those.
	if len(sideJobs)+len(ixJobs) > 0 || kvSide {
		var ws []*Weight
		for _, j := range append(ixJobs, sideJobs...) {
			ws = append(ws, j.w)
		}
		if kvSide {
			ws = append(ws, L.kv)
		}
		if err := be.reserveActs(b, "side.", n, ws...); err != nil {
			return err
		}
		if ixPar { // (side2's, before any fork too)
			if err := be.reserveActs(b, "side2.", n, L.idx.qb, L.idx.proj); err != nil {
				return err
			}
		}
		if err := b.fork(); err != nil {
			return err
		}
	}
	// The main stream's products are queued before the side stream's work:
	// a captured graph gives the programmatic (early) launch edge from the
	// kernel before the fork to the first of its children queued, which
	// should be the main stream's, the path to the attention.
	if ixPar {
		// q_a, then side2's fork (its path reads q_a's row), then the KV
		// product
		if err := be.linear(b, b.x, D, n, jobs[0]); err != nil {
			return err
		}
		if err := b.fork2(); err != nil {
			return err
		}
		jobs = jobs[1:]
	}
	if err := be.linear(b, b.x, D, n, jobs...); err != nil {
		return err
	}
	// kvSide: the KV product first on the side stream, marked for the
	// norms (the main stream goes from q_a straight to q_b); ropeTab: the
	// rotation's table at the chunk's positions before it, for the norms
	// and the attention's inverse rotation (their per-pair trigonometry,
	// ≈ 1.7 µs of float64 sine and cosine, off the layer's chain)
	var ropeTab Ptr
	if kvSide {
		if be.ropeTable {
			if ropeTab, err = b.sc.f32("attn.rope", n*rd); err != nil {
				return err
			}
			if err := d.RopeTable(b.side, L.freqs, rd, int64(b.pos), n, ropeTab); err != nil {
				return err
			}
		}
		if err := be.linearOn(b, b.side, "side.", b.x, D, n, linJob{w: L.kv, y: kv, ldy: HD}); err != nil {
			return err
		}
		if err := b.markOn(b.evKV); err != nil {
			return err
		}
	}
	if len(ixJobs) > 0 { // ixPar: the indexer's compressor first, marked for side2
		if err := be.linearOn(b, b.side, "side.", b.x, D, n, ixJobs...); err != nil {
			return err
		}
		if err := be.indexRows(b, b.side, st, L, tabs, ikv, isc); err != nil {
			return err
		}
		if err := b.markSide(); err != nil {
			return err
		}
	}
	// Query LoRA: RMSNorm, then q_b (and the indexer's query product).
	qjobs := []linJob{{w: L.qb, y: q, ldy: H * HD}}
	ixJob := linJob{y: iq, ldy: c.IndexerHeads * c.IndexerHeadDim} // (w: the indexer's q_b when scoring)
	if scoring {
		ixJob.w = L.idx.qb
	}
	// ixHead queues the indexer query's own norm of q_a's row (the main
	// stream's may be inside q_b's launch, below) and its product on
	// stream xs: a decode step's F16 product through MatVecF32, which in
	// fast mode normalises the row in the product's own launch.
	ixHead := func(xs Stream, tag string) error {
		if w := ixJob.w; n == 1 && w != nil && w.Type == quant.F16 && w.Mats == 1 {
			return d.MatVecF32(xs, w, qr, L.qNorm, c.NormEps, ixqr, 0, ixJob.y, be.exact(), false, 1)
		}
		if err := d.RMSNormRef(xs, qr, int64(QL), L.qNorm, ixqr, int64(QL), QL, n, c.NormEps); err != nil {
			return err
		}
		return be.linearOn(b, xs, tag, ixqr, QL, n, ixJob)
	}
	// ixPar: side2 starts with them.
	if ixPar {
		if err := ixHead(b.side2, "side2."); err != nil {
			return err
		}
	}
	if len(sideJobs) > 0 {
		if err := be.linearOn(b, b.side, "side.", b.x, D, n, sideJobs...); err != nil {
			return err
		}
		if L.comp != nil {
			if err := be.compress(b, b.side, st, L, L.comp, ckv, csc, tabs[engine.PartCompKV], tabs[engine.PartCompScore], tabs[engine.PartComp],
				CompPostFP8, nope, 0); err != nil {
				return err
			}
		}
		if L.idx != nil && !ixPar {
			if err := be.indexRows(b, b.side, st, L, tabs, ikv, isc); err != nil {
				return err
			}
		}
	}

	// The indexer's query path on the side stream (ixSide, above; ixPar:
	// side2, begun above); the join below waits for it.
	var sel, nsel Ptr
	if ixSide {
		xs, tag := b.side2, "side2."
		if ixPar { // the head weights' product, also read only by the scores
			if err := be.linearOn(b, xs, tag, b.x, D, n, linJob{w: L.idx.proj, y: iw, ldy: c.IndexerHeads}); err != nil {
				return err
			}
		} else {
			xs, tag = b.side, "side."
			if err := be.reserveActs(b, tag, n, ixJob.w); err != nil {
				return err
			}
			if err := b.fork(); err != nil {
				return err
			}
			if err := ixHead(xs, tag); err != nil {
				return err
			}
		}
		if err := be.indexQuery(b, xs, L, iq, iw); err != nil {
			return err
		}
		// the indexer's compressed rows, when this batch completes one:
		// the scores read no other write of its compressor, and a join
		// costs the scores their early launch (≈ 5 µs at a decode step)
		if i0, i1 := b.rowsDone(L.idx.comp.ratio); ixPar && (i1 > i0 || be.ixMarkAll) {
			if err := b.side2WaitMark(); err != nil {
				return err
			}
		}
		if sel, nsel, err = be.indexPick(b, xs, L, tabs, iq, iw, scoring); err != nil {
			return err
		}
	} else if scoring {
		qjobs = append(qjobs, ixJob)
	}
	// a decode step's norm, quantization and q_b in one launch where the
	// pipelined kernel takes q_b (matVecF32)
	// (a scoring decode step: q_b leaves room on each SM for the indexer's
	// path on side2 to run beside it, qbRoom)
	fused := false
	if len(qjobs) == 1 {
		if fused, err = be.matVecF32(b, s, "act.", L.qb, qr, QL, L.qNorm, qrn, q, qjobs[0].ldy, n, ixSide && be.qbRoom); err != nil {
			return err
		}
	}
	if fused && hio == 3 {
		hio = 2 // (q holds the float rows)
	}
	if !fused {
		if err := d.RMSNormRef(s, qr, int64(QL), L.qNorm, qrn, int64(QL), QL, n, c.NormEps); err != nil {
			return err
		}
		if hio == 3 {
			// q_b's output as f16 rows (cuBLAS rounds the f32 sums), which
			// the attention normalises and rotates: half the bytes written
			// here and read there
			qjobs[0] = linJob{w: L.qb, y: qh, ldy: H * HD, half: true}
		}
		if err := be.linear(b, qrn, QL, n, qjobs...); err != nil {
			return err
		}
	}
	// Per-head query norm and rotation; the KV row's norm, rotation and
	// FP8 rounding of its non-rotated part.
	if kvSide {
		if err := b.waitMark(b.evKV); err != nil {
			return err
		}
	}
	kvDone := false   // (with the queries' by NormRopePair)
	var ringDone bool // a decode step's KV rows written into the window ring by NormRopePair (Backend.ringNorm)
	switch hio {
	case 2, 3: // in the attention kernel
	case 1:
		if err := d.NormRopeHalf(s, q, H, int64(HD), HD, 0, c.NormEps, int64(nope), L.freqs, rd, int64(b.pos), 0, n, qh); err != nil {
			return err
		}
	default:
		if be.nrPair {
			// both in one launch (decode steps)
			var ring Ptr
			win := tabs[engine.PartWindow]
			if n <= be.stepMax && be.ringNorm && ringBeforeAttention(win.cap, c.Window, b.pos, n) {
				ring, ringDone = win.p, true
			}
			if err := d.NormRopePairTable(s, q, H, 0, 0, kv, 1, L.kvNorm, nope, HD, c.NormEps, int64(nope), L.freqs, rd, int64(b.pos), n, ropeTab, ring, win.cap); err != nil {
				return err
			}
			kvDone = true
			break
		}
		if err := d.NormRope(s, q, H, int64(HD), HD, 0, c.NormEps, int64(nope), L.freqs, rd, int64(b.pos), 0, n); err != nil {
			return err
		}
	}
	if !kvDone {
		if err := d.NormRope(s, kv, 1, int64(HD), HD, L.kvNorm, c.NormEps, int64(nope), L.freqs, rd, int64(b.pos), nope, n); err != nil {
			return err
		}
	}

	// The compressed rows are complete; the indexer's picks.
	if err := b.joinAll(); err != nil {
		return err
	}
	K := c.IndexerTopK
	if L.idx != nil && !ixSide {
		if sel, nsel, err = be.index(b, s, L, tabs, iq, iw, scoring); err != nil {
			return err
		}
	}

	// Sparse attention with sinks, then the inverse rotation.
	maxKeys := min(c.Window, b.pos+n)
	comp := Ptr(0)
	switch L.ratio {
	case model.RatioDense:
		maxKeys += (b.pos + n) / L.ratio
		comp = tabs[engine.PartComp].p
	case model.RatioIndexed:
		maxKeys += K
		comp = tabs[engine.PartComp].p
	}
	win := tabs[engine.PartWindow]
	var work Ptr
	if nw := d.AttentionWorkFor(n, H, HD, maxKeys, !be.exact()); nw > 0 {
		if work, err = b.sc.f32("attn.work", nw); err != nil {
			return err
		}
	}
	// The grouped output projection's activation (group g of heads through
	// wo_a[g], then wo_b): a Q8_0 one comes out of the attention call itself.
	G, OL := c.OGroups, c.OLoraRank
	seg := H * HD / G
	act, actTok, actSel := o, int64(4*H*HD), int64(4*seg)
	var at quant.Type
	if !isFloatType(L.outA.Type) && !halfOA { // (halfOA: o in f16, by the attention itself or converted after it)
		if at, err = d.ActType(L.outA.Type); err != nil {
			return err
		}
		ab := d.ActBytes(at, seg)
		if act, err = b.sc.get("attn.oa.act", ab*int64(n*G)); err != nil {
			return err
		}
		actTok, actSel = ab*int64(G), ab
	}
	aa := &AttentionArgs{
		Q: q, KV: kv, Win: win.p, WCap: win.cap, Comp: comp, Ratio: L.ratio, Sel: sel, NSel: nsel, K: K,
		Sinks: L.sinks, Out: o, Pos0: b.pos, N: n, H: H, HD: HD, W: c.Window,
		Scale: float32(1 / math.Sqrt(float64(HD))), MaxKeys: maxKeys, Work: work,
		RopeFreqs: L.freqs, RopeDim: rd, RopeOff: nope, // the inverse rotation of the output
		Fast: !be.exact(), RopeTable: ropeTab,
	}
	switch hio {
	case 1:
		aa.Q, aa.QHalf, aa.Out, aa.OutHalf = qh, true, oh, true
	case 2:
		aa.QNorm, aa.QEps, aa.Out, aa.OutHalf = true, c.NormEps, oh, true
	case 3:
		aa.Q, aa.QHalf, aa.QNorm, aa.QEps, aa.Out, aa.OutHalf = qh, true, true, c.NormEps, oh, true
	}
	if act != o && at == quant.Q8_0 && seg%32 == 0 {
		aa.QAct, aa.QSeg = act, seg
	}
	if err := d.Attention(s, aa); err != nil {
		return err
	}
	if act != o && aa.QAct == 0 {
		if err := d.Quantize(s, at, o, seg, act, seg, n*G); err != nil {
			return err
		}
	}
	if halfOA && !halfIO { // o converted to f16 after the attention
		if oh, err = b.sc.get("attn.oa.f16", 2*int64(n*H*HD)); err != nil {
			return err
		}
		if err := d.ToHalf(s, o, H*HD, H*HD, n, oh); err != nil {
			return err
		}
	}
	if halfOA && be.halfChain && be.half(L.outB, quant.F16, n) {
		// wo_a's output in f16 straight from cuBLAS, wo_b's input
		oa, err := b.sc.get("attn.oa2.f16", 2*int64(n*G*OL))
		if err != nil {
			return err
		}
		if err := d.MatMulHalfH(s, L.outA, G, oh, int64(H*HD), int64(seg), n, oa, int64(G*OL), int64(OL)); err != nil {
			return err
		}
		if err := d.MatMulHalf(s, L.outB, 1, oa, quant.F16, int64(G*OL), 0, n, b.out, int64(D), 0); err != nil {
			return err
		}
	} else {
		oa, err := b.sc.f32("attn.oa", n*G*OL)
		if err != nil {
			return err
		}
		if n <= passTokensMax && !halfOA && be.woQ8 && at == quant.Q8_0 && L.outA.Type == quant.Q8_0 &&
			L.outB.Type == quant.Q8_0 && L.outB.Cols == G*OL && OL%32 == 0 {
			// wo_a's CTAs quantize their blocks of its output for wo_b
			// (MatMulQ8Out; a verification pass's two to passTokensMax
			// tokens too in exact mode, where the library's few-token form
			// takes them), which
			// then copies that row instead of reading wo_a's floats and
			// quantizing them in every CTA or in a launch of their own
			qb := d.ActBytes(quant.Q8_0, G*OL)
			oq, err := b.sc.get("attn.oa.q8", qb*int64(n))
			if err != nil {
				return err
			}
			if err := d.MatMulQ8Out(s, L.outA, G, act, actTok, actSel, 1, n, oa, oq, be.exact()); err != nil {
				return err
			}
			if err := d.MatMulEx(s, L.outB, 0, 1, oq, qb, 0, 1, n, b.out, int64(D), 0, be.exact()); err != nil {
				return err
			}
		} else {
			if halfOA {
				if err := d.MatMulHalf(s, L.outA, G, oh, quant.F16, int64(H*HD), int64(seg), n, oa, int64(G*OL), int64(OL)); err != nil {
					return err
				}
			} else if err := d.MatMulEx(s, L.outA, 0, G, act, actTok, actSel, 1, n, oa, int64(G*OL), int64(OL), be.exact()); err != nil {
				return err
			}
			if err := be.linear(b, oa, G*OL, n, linJob{w: L.outB, y: b.out, ldy: D}); err != nil {
				return err
			}
		}
	}

	// The chunk's KV rows enter the window ring (ringDone: a decode step's
	// or a pass's rows went in with their norm, before the attention:
	// ringBeforeAttention).
	if ringDone {
		return nil
	}
	return d.RingWrite(s, win.p, win.cap, HD, kv, int64(HD), b.pos, n)
}

// ringBeforeAttention reports whether n KV rows from position pos may
// enter a window ring of capacity slots before the attention of those n
// tokens reads it: no row's slot holds a key of some token's window of w
// (position pos+n−1 evicts pos+n−1−capacity, which must lie before the
// first token's window, pos−w+1), or the ring has not wrapped.
func ringBeforeAttention(capacity, w, pos, n int) bool {
	return capacity >= w+n-1 || pos+n <= capacity
}

// compress adds the chunk's entries (kv, sc: n rows of coff·width values,
// sc without the ape bias) to a compressor and emits every row whose block
// completes: pooled, RMS-normed, rotated at the block's first position and
// post-processed (post, fp8n, hadScale: CompEmitArgs'), in one launch
// where a decode step completes one row (CompEmit).
func (be *Backend) compress(b *batch, s Stream, st *state, L *dlayer, cp *dcomp, kv, sc Ptr, kvT, scT, rows *dtable,
	post CompPost, fp8n int, hadScale float32) error {
	c := &be.cfg
	d := be.dev
	r, cw, w := cp.ratio, cp.coff*cp.width, cp.width
	if err := d.AddAPE(s, sc, cp.ape, cw, r, b.pos, b.n); err != nil {
		return err
	}
	i0, i1 := b.rowsDone(r)
	b.mark(i1 > i0)
	if i1 == i0 {
		// only the rings: the ring writes' own entry points, which take
		// purego's direct calls (CompEmit would do the same writes, but its
		// float arguments take the reflective call path, ≈ 1.5 µs of host
		// time, on every step)
		if kvT.cap != scT.cap {
			if err := d.RingWrite(s, kvT.p, kvT.cap, cw, kv, int64(cw), b.pos, b.n); err != nil {
				return err
			}
			return d.RingWrite(s, scT.p, scT.cap, cw, sc, int64(cw), b.pos, b.n)
		}
		return d.RingWrite2(s, kvT.p, scT.p, kvT.cap, cw, kv, sc, int64(cw), b.pos, b.n)
	}
	if !rows.ring && i1 > rows.alloc {
		// Growing the table synchronises the device.
		if err := b.flush(); err != nil {
			return err
		}
	}
	if err := st.ensureRows(rows, i1); err != nil {
		return err
	}
	return d.CompEmit(s, &CompEmitArgs{
		KV: kv, SC: sc, KVRing: kvT.p, SCRing: scT.p, KVCap: kvT.cap, SCCap: scT.cap, CW: cw, Pos0: b.pos, N: b.n,
		R: r, Coff: cp.coff, W: w, I0: i0, NRows: i1 - i0, Rows: rows.entry(i0), Norm: cp.norm, Eps: c.NormEps,
		Freqs: L.freqs, RD: c.RopeDim, Post: post, FP8N: fp8n, HadScale: hadScale,
	})
}

// indexRows runs the indexer's compressor of a ratio-4 layer on stream s
// (its completed rows Hadamard-rotated and FP4-rounded).
func (be *Backend) indexRows(b *batch, s Stream, st *state, L *dlayer, tabs []*dtable, ikv, isc Ptr) error {
	ix := L.idx
	return be.compress(b, s, st, L, &ix.comp, ikv, isc, tabs[engine.PartIndexKV], tabs[engine.PartIndexScore], tabs[engine.PartIndex],
		CompPostHadamardFP4, 0, ix.hadScale)
}

// index picks the compressed rows of a ratio-4 layer each token attends
// (indexRows has run): when some token sees more rows than it keeps, the
// indexer's scores and their top-k; it returns the picks sel [n][TopK] and
// their counts nsel [n], queued on stream s.
func (be *Backend) index(b *batch, s Stream, L *dlayer, tabs []*dtable, iq, iw Ptr, scoring bool) (sel, nsel Ptr, err error) {
	if scoring {
		if err := be.indexQuery(b, s, L, iq, iw); err != nil {
			return 0, 0, err
		}
	}
	return be.indexPick(b, s, L, tabs, iq, iw, scoring)
}

// indexQuery readies the indexer's queries iq and head weights iw of the
// batch's tokens for the scores (rotation, Hadamard and FP4 rounding, the
// weights' scale), on stream s; it reads no compressed row.
func (be *Backend) indexQuery(b *batch, s Stream, L *dlayer, iq, iw Ptr) error {
	c := &be.cfg
	d := be.dev
	n, IH, IHD, rd := b.n, c.IndexerHeads, c.IndexerHeadDim, c.RopeDim
	wscale := float32(math.Pow(float64(IHD), -0.5) * math.Pow(float64(IH), -0.5))
	return d.IndexQuery(s, iq, iw, IH, IHD, rd, L.freqs, int64(b.pos), n, L.idx.hadScale, wscale)
}

// indexPick is index's second half: the scores against the compressed
// rows and their top-k (indexQuery has run when scoring).
func (be *Backend) indexPick(b *batch, s Stream, L *dlayer, tabs []*dtable, iq, iw Ptr, scoring bool) (sel, nsel Ptr, err error) {
	c := &be.cfg
	d := be.dev
	n, IH, IHD, K := b.n, c.IndexerHeads, c.IndexerHeadDim, c.IndexerTopK
	rows := tabs[engine.PartIndex]
	if sel, err = b.sc.get("idx.sel", 4*int64(n*K)); err != nil {
		return 0, 0, err
	}
	if nsel, err = b.sc.get("idx.nsel", 4*int64(n)); err != nil {
		return 0, 0, err
	}
	ratio := L.ratio
	if !scoring {
		// No token sees more than K rows: each picks all it sees.
		return sel, nsel, d.TopK(s, 0, 0, 0, b.pos, ratio, K, TopKAllIfFew, sel, nsel, n)
	}
	maxRows := (b.pos + n) / ratio
	scores, err := b.sc.f32("idx.scores", n*maxRows)
	if err != nil {
		return 0, 0, err
	}
	if err := d.IndexScores(s, iq, iw, rows.p, IH, IHD, b.pos, ratio, n, scores, int64(maxRows), !be.exact()); err != nil {
		return 0, 0, err
	}
	// the picks in row order, as the CPU backend's indexer gives them (the
	// attention adds them in that order; the sort was half the top-k's
	// instructions); best first with DS4_CUDA_TOPK_ANY=0, for timing
	flags := TopKAllIfFew
	if be.topkRows {
		flags |= TopKRowOrder
	}
	return sel, nsel, d.TopK(s, scores, int64(maxRows), 0, b.pos, ratio, K, flags, sel, nsel, n)
}

// FFN runs the MoE sub-block on b.x into b.out.
func (be *Backend) FFN(bi engine.Batch, layer int) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	c := &be.cfg
	d, s := be.dev, b.s
	L := be.layer(layer)
	n, D, E, K, FF := b.n, c.Embed, c.Experts, c.ExpertsUsed, c.ExpertFF
	nk := n * K
	b.moe = moeSum{}
	if nk > 65535 {
		return fmt.Errorf("cuda: %d tokens × %d experts exceed 65535 selections", n, K)
	}
	var e error
	buf := func(name string, bytes int64) Ptr { return b.sc.getE(&e, name, bytes) }
	f4 := func(cnt int) int64 { return 4 * int64(cnt) }
	lg, shg, shu := buf("moe.s", f4(n*E)), buf("moe.shg", f4(n*FF)), buf("moe.shu", f4(n*FF))
	sel, wts := buf("moe.sel", f4(nk)), buf("moe.w", f4(nk))
	ye := buf("moe.ye", f4(nk*D))
	ysh := buf("moe.ysh", f4(n*D))
	if e != nil {
		return e
	}
	// The shared expert runs on the side stream, beside the router and the
	// routed experts (its activation buffers sized first: a buffer growing
	// inside the fork would synchronise).
	if err := be.reserveActs(b, "side.", n, L.gateSh, L.downSh); err != nil {
		return err
	}
	// Routed experts: every (token, expert) pair is one selection. Fast
	// mode multiplies chunks with f16 activations on the wgmma tensor cores
	// where the library offers it (OptWGMoE, asked per product, with the
	// activation layout it reads: the default takes both expert types with
	// permuted rows), else with the weights' own activation type.
	half, halfDown := HalfNone, HalfNone
	if !be.exact() && nk >= be.wgMinTok*E {
		half, halfDown = d.GroupedHalf(L.gateExps.Type, D, nk), d.GroupedHalf(L.downExps.Type, FF, nk)
	}
	act, actSel := b.x, f4(D)
	// actSide: a decode step's quantized activation formed on the side
	// stream, ahead of the shared expert and beside the router (marked;
	// its buffer sized before the fork)
	quantized := half == HalfNone && !isFloatType(L.gateExps.Type)
	actSide := be.actSide && quantized && n == 1 && b.side != b.s
	if actSide {
		at, err := d.ActType(L.gateExps.Type)
		if err != nil {
			return err
		}
		if _, err := b.sc.get("moe.xact", d.ActBytes(at, D)*int64(n)); err != nil {
			return err
		}
	}
	// routerQ: the Q8_K activation formed by the router's launch
	// (RouterQ8K) instead of a quantize launch after it
	var xact Ptr
	var xab int64
	routerQ := be.routerAct && quantized && !actSide && half == HalfNone && D%256 == 0
	if routerQ {
		at, err := d.ActType(L.gateExps.Type)
		if err != nil {
			return err
		}
		if routerQ = at == quant.Q8_K; routerQ {
			xab = d.ActBytes(at, D)
			if xact, err = b.sc.get("moe.xact", xab*int64(n)); err != nil {
				return err
			}
		}
	}
	if err := b.fork(); err != nil {
		return err
	}
	if actSide {
		var err error
		if act, actSel, err = b.quantAct(d, b.side, "moe.xact", L.gateExps, b.x, D, n); err != nil {
			return err
		}
		if err := b.markOn(b.evAct); err != nil {
			return err
		}
	}
	if err := be.sharedExpert(b, L, shg, shu, ysh); err != nil {
		return err
	}
	if err := be.linear(b, b.x, D, n, linJob{w: L.gate, y: lg, ldy: E}); err != nil {
		return err
	}
	tid := Ptr(0)
	if L.hash {
		tid = L.tid2eid
	}
	if routerQ {
		err = d.RouterQ8K(s, lg, E, L.bias, tid, b.tokens, K, c.ExpertWeightsNorm, c.ExpertWeightsScale, sel, wts, n, b.x, D, xact, xab)
	} else {
		err = d.Router(s, lg, E, L.bias, tid, b.tokens, K, c.ExpertWeightsNorm, c.ExpertWeightsScale, sel, wts, n)
	}
	if err != nil {
		return err
	}
	if be.sameRoute && n == 2 { // (a measurement: token 1 routed as token 0)
		if err := d.CopyAsync(sel+Ptr(4*K), sel, f4(K), s); err != nil {
			return err
		}
		if err := d.CopyAsync(wts+Ptr(4*K), wts, f4(K), s); err != nil {
			return err
		}
	}
	if be.moeStats && n >= 8 {
		if err := be.logRouting(b, layer, sel, nk); err != nil {
			return err
		}
	}

	if half != HalfNone {
		var err error
		if act, err = b.sc.get("moe.xh", 2*int64(D)*int64(n)); err != nil {
			return err
		}
		if err := d.ToHalfAs(s, b.x, D, D, n, act, half); err != nil {
			return err
		}
		actSel = 2 * int64(D)
	} else if actSide {
		if err := b.waitMark(b.evAct); err != nil {
			return err
		}
	} else if routerQ {
		act, actSel = xact, xab
	} else if quantized {
		var err error
		if act, actSel, err = b.quantAct(d, s, "moe.xact", L.gateExps, b.x, D, n); err != nil {
			return err
		}
	}
	// The selections sorted by expert once, for the three grouped products
	// (each reads an expert once per 32 of its tokens; below
	// OptTCMinSel selections they run as MatMulEx and scratch is unused).
	grp, err := b.sc.get("moe.group", d.GroupBytes(nk, E))
	if err != nil {
		return err
	}
	if err := d.Group(s, sel, nk, E, grp); err != nil {
		return err
	}
	if L.upExps.Type != L.gateExps.Type {
		return fmt.Errorf("cuda: layer %d: gate and up experts of different types", layer)
	}
	var act2 Ptr
	var glu gluRows
	act2Sel := f4(FF)
	if half == HalfPerm32 && halfDown != HalfNone && d.GroupedGLUOK(L.gateExps.Type, FF, D, nk) {
		// gate, up and SwiGLU in one launch, straight to the down
		// product's f16 rows
		if act2, err = b.sc.get("moe.gh", 2*int64(FF)*int64(nk)); err != nil {
			return err
		}
		if err := d.MatMulGroupedGLU(s, L.gateExps, L.upExps, sel, nk, act, actSel, K, wts, L.clamp, act2, halfDown, grp); err != nil {
			return err
		}
		act2Sel = 2 * int64(FF)
	} else if glu, err = be.gateUp(b, L, half, act, actSel, sel, nk, wts, halfDown, grp, &act2, &act2Sel); err != nil {
		return err
	}
	if glu.g != 0 {
		// the down product forms its activation from the gate and up
		// outputs (act2: the activation rows where it cannot)
		if err := d.MatMulGroupedSwiGLU(s, L.downExps, sel, nk, glu.g, glu.u, L.clamp, wts, act2, ye, int64(D), grp, be.exact()); err != nil {
			return err
		}
	} else if err := be.grouped(b, halfDown, L.downExps, sel, nk, act2, act2Sel, 1, ye, int64(D), grp); err != nil {
		return err
	}

	// The routed and shared experts' sum: formed by the HCPost after
	// (moeFold: a decode step whose HCPost forms the next mixes, below),
	// else here.
	if err := b.join(); err != nil {
		return err
	}
	if parts, _ := be.postMixParts(b, layer, engine.FFNSub); be.moeFold && n <= be.stepMax && parts > 0 {
		b.moe = moeSum{ye: ye, sel: sel, ysh: ysh, k: K}
		return nil
	}
	return d.MoECombine(s, ye, sel, ysh, b.out, n, K, D)
}

// grouped runs a routed experts' product of nk selections sel through w:
// MatMulGroupedHalf with f16 activations in layout half, else MatMulGrouped.
func (be *Backend) grouped(b *batch, half HalfLayout, w *Weight, sel Ptr, nk int, act Ptr, actSel int64, actDiv int, y Ptr, ySel int64, grp Ptr) error {
	if half != HalfNone {
		return be.dev.MatMulGroupedHalf(b.s, w, sel, nk, act, actSel, actDiv, y, ySel, grp)
	}
	return be.dev.MatMulGrouped(b.s, w, sel, nk, act, actSel, actDiv, y, ySel, grp, be.exact())
}

// gluRows are the routed gate and up outputs whose SwiGLU the down product
// forms itself (MatMulGroupedSwiGLU); g zero: none.
type gluRows struct{ g, u Ptr }

// gateUp runs the routed experts' gate and up products apart (grouped or,
// half set, MatMulGroupedHalf) and their SwiGLU: into the down product's
// f16 rows when halfDown is set, else in place into the gate's floats (and
// their activation for quantized down weights); it sets *act2 and *act2Sel
// to the down product's input. With downGLU and a Q8_K down activation it
// runs no SwiGLU: it returns the gate and up rows for
// MatMulGroupedSwiGLU, *act2 the activation rows that call may write.
func (be *Backend) gateUp(b *batch, L *dlayer, half HalfLayout, act Ptr, actSel int64, sel Ptr, nk int, wts Ptr, halfDown HalfLayout, grp Ptr, act2 *Ptr, act2Sel *int64) (gluRows, error) {
	d, s := be.dev, b.s
	c := &be.cfg
	K, FF := c.ExpertsUsed, c.ExpertFF
	ge, err := b.sc.get("moe.ge", 4*int64(nk)*int64(FF))
	if err != nil {
		return gluRows{}, err
	}
	ue, err := b.sc.get("moe.ue", 4*int64(nk)*int64(FF))
	if err != nil {
		return gluRows{}, err
	}
	if half == HalfNone && be.pairs { // one launch where the library can
		if err := d.MatMulGroupedPair(s, L.gateExps, L.upExps, sel, nk, act, actSel, K, ge, ue, int64(FF), grp, be.exact()); err != nil {
			return gluRows{}, err
		}
	} else {
		if err := be.grouped(b, half, L.gateExps, sel, nk, act, actSel, K, ge, int64(FF), grp); err != nil {
			return gluRows{}, err
		}
		if err := be.grouped(b, half, L.upExps, sel, nk, act, actSel, K, ue, int64(FF), grp); err != nil {
			return gluRows{}, err
		}
	}
	*act2, *act2Sel = ge, 4*int64(FF)
	if halfDown != HalfNone {
		// SwiGLU straight to the down product's f16 rows
		gh, err := b.sc.get("moe.gh", 2*int64(FF)*int64(nk))
		if err != nil {
			return gluRows{}, err
		}
		*act2, *act2Sel = gh, 2*int64(FF)
		return gluRows{}, d.SwiGLUHalf(s, ge, ue, gh, FF, nk, L.clamp, wts, halfDown)
	}
	if at, _ := d.ActType(L.downExps.Type); at == quant.Q8_K && FF%256 == 0 {
		// SwiGLU straight to the down product's activation rows
		ab := d.ActBytes(at, FF)
		p, err := b.sc.get("moe.gact", ab*int64(nk))
		if err != nil {
			return gluRows{}, err
		}
		*act2, *act2Sel = p, ab
		if be.downGLU {
			return gluRows{g: ge, u: ue}, nil
		}
		return gluRows{}, d.SwiGLUQ8K(s, ge, ue, p, ab, FF, nk, L.clamp, wts, !be.exact())
	}
	if err := d.SwiGLURef(s, ge, ue, ge, FF, nk, L.clamp, wts); err != nil {
		return gluRows{}, err
	}
	if !isFloatType(L.downExps.Type) {
		*act2, *act2Sel, err = b.quantAct(d, s, "moe.gact", L.downExps, ge, FF, nk)
	}
	return gluRows{}, err
}

// logRouting logs the routing of a chunk's nk selections sel (device int32)
// in layer: how the selections spread over the experts, and the tiles of
// up to groupTile selections of one expert that the grouped products run
// (each tile decodes its rows of the expert's weights once), against the
// tiles of an even spread. It waits for the stream.
func (be *Backend) logRouting(b *batch, layer int, sel Ptr, nk int) error {
	if err := b.flush(); err != nil {
		return err
	}
	if err := be.dev.SyncStream(b.s); err != nil {
		return err
	}
	ids := make([]int32, nk)
	if err := DownloadSlice(be.dev, ids, sel); err != nil {
		return err
	}
	E := be.cfg.Experts
	cnt := make([]int, E)
	for _, e := range ids {
		if e >= 0 && int(e) < E {
			cnt[e]++
		}
	}
	used, tiles, most := 0, 0, 0
	for _, c := range cnt {
		if c > 0 {
			used++
		}
		tiles += (c + groupTile - 1) / groupTile
		most = max(most, c)
	}
	per := (nk + E - 1) / E // an even spread: ⌈nk/E⌉ selections an expert
	even := min(E, nk) * ((per + groupTile - 1) / groupTile)
	slog.Info("routing", "layer", layer, "tokens", b.n, "selections", nk, "experts", used, "mean", float64(nk)/float64(E),
		"most", most, "tiles", tiles, "even_tiles", even)
	return nil
}

// groupTile is the library's TC_TILE: the most selections of one matrix in
// a tile of the grouped products.
const groupTile = 128

// sharedExpert queues the shared expert of layer L on the side stream:
// ysh = down(swiglu(gate·x, up·x)).
func (be *Backend) sharedExpert(b *batch, L *dlayer, shg, shu, ysh Ptr) error {
	c := &be.cfg
	n, D, FF := b.n, c.Embed, c.ExpertFF
	if err := be.sharedGateUp(b, L, shg, shu); err != nil {
		return err
	}
	shLim := float32(0)
	if be.opts.ClampSharedExpert {
		shLim = L.clamp
	}
	if be.halfChain && !be.exact() && be.half(L.downSh, quant.F16, n) {
		// SwiGLU straight to the down product's f16 rows (fast mode's
		// float silu)
		shh, err := b.sc.get("side.shh", 2*int64(n)*int64(FF))
		if err != nil {
			return err
		}
		if err := be.dev.SwiGLUHalf(b.side, shg, shu, shh, FF, n, shLim, 0, HalfRows); err != nil {
			return err
		}
		return be.dev.MatMulHalf(b.side, L.downSh, 1, shh, quant.F16, int64(FF), 0, n, ysh, int64(D), 0)
	}
	if err := be.dev.SwiGLURef(b.side, shg, shu, shg, FF, n, shLim, 0); err != nil {
		return err
	}
	return be.linearOn(b, b.side, "side.", shg, FF, n, linJob{w: L.downSh, y: ysh, ldy: D})
}

// sharedGateUp runs the shared expert's gate and up products of b.x into
// shg and shu on the side stream: a decode step's as one MatMulGroupedPair
// (one launch where the library offers it, OptMVPair), else through
// linearOn.
func (be *Backend) sharedGateUp(b *batch, L *dlayer, shg, shu Ptr) error {
	c := &be.cfg
	n, D, FF := b.n, c.Embed, c.ExpertFF
	g, u := L.gateSh, L.upSh
	if n != 1 || isFloatType(g.Type) || g.Type != u.Type || g.Rows != u.Rows || g.Cols != u.Cols || g.Mats != 1 || u.Mats != 1 {
		return be.linearOn(b, b.side, "side.", b.x, D, n, linJob{w: g, y: shg, ldy: FF}, linJob{w: u, y: shu, ldy: FF})
	}
	at, err := be.dev.ActType(g.Type)
	if err != nil {
		return err
	}
	act, _, err := be.inputAct(b, b.side, "side.", at, b.x, D, D, n)
	if err != nil {
		return err
	}
	return be.dev.MatMulGroupedPair(b.side, g, u, 0, 1, act, 0, 1, shg, shu, 0, 0, be.exact())
}

// reserveActs sizes the activation buffers (named tag + format) that
// linearOn needs for n rows of each weight's input.
func (be *Backend) reserveActs(b *batch, tag string, n int, ws ...*Weight) error {
	need := map[string]int64{}
	for _, w := range ws {
		if isFloatType(w.Type) {
			continue
		}
		at, err := be.dev.ActType(w.Type)
		if err != nil {
			return err
		}
		name := tag + at.String()
		need[name] = max(need[name], be.dev.ActBytes(at, w.Cols)*int64(n))
	}
	for name, bytes := range need {
		if _, err := b.sc.get(name, bytes); err != nil {
			return err
		}
	}
	return nil
}
