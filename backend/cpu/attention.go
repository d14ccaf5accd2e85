package cpu

import (
	"math"

	"ds4go/engine"
	"ds4go/model"
)

// The attention sub-block (official model.py: Attention.forward and the
// sparse_attn kernel). For each token t at position p = pos+t:
//
//	qr  = q_norm(wq_a·x)                         (query LoRA)
//	q   = wq_b·qr as Heads×HeadDim; each head × rsqrt(mean(q²)+eps); RoPE(p)
//	kv  = kv_norm(wkv·x); RoPE(p); FP8 simulation of the nope dims
//	keys: the window p−Window+1 … p (the raw ring and this chunk's rows),
//	      plus, on compressed layers, compressed rows i < (p+1)/r: all of them
//	      for ratio 128, the indexer's top-k for ratio 4
//	o_h = Σ_k softmax_k(q_h·k·HeadDim^−½ ; sink_h) · k  (the sink logit only
//	      enters the denominator; keys double as values)
//	o_h ← inverse RoPE(p) on its last RopeDim values
//	out = wo_b · concat_g(wo_a[g]·o_g)          (grouped low-rank output)
//
// The chunk's compressor rows and indexer picks are produced before the
// attention, so a row completed at position p is visible to p itself.

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
	L := &be.layers[layer]
	tabs := st.layers[layer]
	n, D, H, HD, QL, rd := b.n, c.Embed, c.Heads, c.HeadDim, c.QLoraRank, c.RopeDim
	nope := HD - rd
	sc := &b.sc

	// Every projection of the sub-block input, in one pass over x.
	qr := sc.f32("attn.qr", n*QL)
	kv := sc.f32("attn.kv", n*HD)
	jobs := []linJob{{L.qa, qr, QL}, {L.kv, kv, HD}}
	// The indexer only scores when some token sees more compressed rows
	// than it keeps; otherwise every visible row is picked (exactly what a
	// top-k of all of them gives) and its query and weight projections are
	// not needed.
	scoring := L.idx != nil && (b.pos+n)/L.ratio > c.IndexerTopK
	var ckv, csc, ikv, isc, iw []float32
	if L.comp != nil {
		cw := L.comp.coff * HD
		ckv, csc = sc.f32("attn.ckv", n*cw), sc.f32("attn.csc", n*cw)
		jobs = append(jobs, linJob{L.comp.kv, ckv, cw}, linJob{L.comp.gate, csc, cw})
	}
	if L.idx != nil {
		cw := 2 * c.IndexerHeadDim
		ikv, isc = sc.f32("idx.ckv", n*cw), sc.f32("idx.csc", n*cw)
		jobs = append(jobs, linJob{L.idx.comp.kv, ikv, cw}, linJob{L.idx.comp.gate, isc, cw})
		if scoring {
			iw = sc.f32("idx.w", n*c.IndexerHeads)
			jobs = append(jobs, linJob{L.idx.proj, iw, c.IndexerHeads})
		}
	}
	be.linear(sc, b.x, D, n, jobs...)

	// Query LoRA: q_norm, then wq_b (and the indexer's q projection, which
	// reads the same normed LoRA activation).
	for t := 0; t < n; t++ {
		rmsNorm(qr[t*QL:(t+1)*QL], qr[t*QL:(t+1)*QL], L.qNorm, c.NormEps)
	}
	q := sc.f32("attn.q", n*H*HD)
	var iq []float32
	qjobs := []linJob{{L.qb, q, H * HD}}
	if scoring {
		w := c.IndexerHeads * c.IndexerHeadDim
		iq = sc.f32("idx.q", n*w)
		qjobs = append(qjobs, linJob{L.idx.qb, iq, w})
	}
	be.linear(sc, qr, QL, n, qjobs...)

	// Rotations of the chunk's positions.
	cs := sc.f32("attn.rot", n*rd)
	for t := 0; t < n; t++ {
		rotation(cs[t*rd:(t+1)*rd], L.freqs, b.pos+t)
	}
	be.pool.run(n*H, 8, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			t := j / H
			qh := q[j*HD : (j+1)*HD]
			rmsNormPlain(qh, c.NormEps)
			rotate(qh[nope:], cs[t*rd:(t+1)*rd])
		}
	})
	for t := 0; t < n; t++ {
		row := kv[t*HD : (t+1)*HD]
		rmsNorm(row, row, L.kvNorm, c.NormEps)
		rotate(row[nope:], cs[t*rd:(t+1)*rd])
		fp8Simulate(row[:nope])
	}

	// Compressed rows completed by this chunk, then the indexer's picks.
	if L.comp != nil {
		be.compress(b, L.comp, L.freqs, ckv, csc,
			tabs[engine.PartCompKV], tabs[engine.PartCompScore], tabs[engine.PartComp],
			func(row []float32) { fp8Simulate(row[:nope]) })
	}
	var sel []int32
	var nsel []int32
	if L.idx != nil {
		sel, nsel = be.index(b, L, tabs, iq, ikv, isc, iw, cs)
	}

	// Sparse attention with sinks, head by head.
	o := sc.f32("attn.o", n*H*HD)
	win := tabs[engine.PartWindow]
	comp := tabs[engine.PartComp]
	scale := float32(1 / math.Sqrt(float64(HD)))
	attnSeg := AttnSegmentKeys
	if be.opts.AttnSerial {
		attnSeg = 0
	}
	be.pool.run(n*H, 1, func(lo, hi int) {
		var keys [][]float32
		var scores []float32
		for j := lo; j < hi; j++ {
			t, h := j/H, j%H
			p := b.pos + t
			keys = keys[:0]
			for qp := max(0, p-c.Window+1); qp <= p; qp++ {
				if qp >= b.pos {
					keys = append(keys, kv[(qp-b.pos)*HD:(qp-b.pos+1)*HD])
				} else {
					keys = append(keys, win.entry(qp))
				}
			}
			switch L.ratio {
			case model.RatioDense:
				for i := 0; i < (p+1)/L.ratio; i++ {
					keys = append(keys, comp.entry(i))
				}
			case model.RatioIndexed:
				for _, i := range sel[t*c.IndexerTopK : t*c.IndexerTopK+int(nsel[t])] {
					keys = append(keys, comp.entry(int(i)))
				}
			}
			if cap(scores) < len(keys) {
				scores = make([]float32, len(keys), 2*len(keys))
			}
			scores = scores[:len(keys)]
			oh := o[j*HD : (j+1)*HD]
			AttendHead(oh, q[j*HD:(j+1)*HD], keys, scores, L.sinks[h], scale, attnSeg)
			rotateInv(oh[nope:], cs[t*rd:(t+1)*rd])
		}
	})

	// Grouped output projection: group g of heads through wo_a[g], then wo_b.
	G, OL := c.OGroups, c.OLoraRank
	seg := H * HD / G
	oa := sc.f32("attn.oa", n*G*OL)
	for g := 0; g < G; g++ {
		be.linear(sc, o[g*seg:], H*HD, n, linJob{L.outA.sub(g*OL, OL), oa[g*OL:], G * OL})
	}
	be.linear(sc, oa, G*OL, n, linJob{L.outB, b.out, D})

	// The chunk's KV rows enter the window ring (after the attention, which
	// still needed the rows they overwrite).
	for t := max(0, n-win.cap); t < n; t++ {
		copy(win.entry(b.pos+t), kv[t*HD:(t+1)*HD])
	}
	return nil
}

// AttnSegmentKeys is the segment of AttendHead's segmented order: 64 keys.
const AttnSegmentKeys = 64

// AttendHead computes one head's attention output over the keys (which are
// also the values) with a sink logit in the softmax denominator, in the
// exact order that the CUDA backend's exact mode reproduces bit for bit.
// scores needs room for len(keys) values; out gets len(q) values. Each
// score is dotF32(q, key)·scale. seg selects the summation order:
//
//   - 0, the serial order: the maximum M of the sink and the scores,
//     e_k = exp(s_k − M), their sum L = exp(sink − M) + e_0 + e_1 + … added
//     in key order, p_k = e_k / L, and out = Σ p_k·key_k added in key order.
//   - AttnSegmentKeys, the segmented order (flash decoding's, fixed so that
//     it does not depend on how a GPU splits the work): the keys in segments
//     of seg (the last one shorter); per segment j its maximum m_j, e_k =
//     exp(s_k − m_j), l_j = e's sum in key order and o_j = Σ e_k·key_k in key
//     order; then M = the maximum of the sink and the m_j, c_j = exp(m_j −
//     M), L = exp(sink − M) + l_0·c_0 + l_1·c_1 + … and out = (c_0·o_0 +
//     c_1·o_1 + …) / L, the sums in segment order. Its chains are a segment
//     long, so a GPU sums the segments at once.
//
// Every product is rounded before its addition (no fused multiply-add).
func AttendHead(out, q []float32, keys [][]float32, scores []float32, sink, scale float32, seg int) {
	if seg > 0 {
		attendHeadSegmented(out, q, keys, scores, sink, scale, seg)
		return
	}
	mx := sink
	for k, row := range keys {
		s := dotF32(q, row) * scale
		scores[k] = s
		mx = max(mx, s)
	}
	sum := expf(sink - mx)
	for k, s := range scores {
		e := expf(s - mx)
		scores[k] = e
		sum += e
	}
	for d := range out {
		out[d] = 0
	}
	for k, row := range keys {
		axpy(out, scores[k]/sum, row)
	}
}

// attendHeadSegmented is AttendHead's segmented order (seg keys a segment).
func attendHeadSegmented(out, q []float32, keys [][]float32, scores []float32, sink, scale float32, seg int) {
	nk := len(keys)
	for k, row := range keys {
		scores[k] = dotF32(q, row) * scale
	}
	for d := range out {
		out[d] = 0
	}
	if nk == 0 {
		return
	}
	nseg := (nk + seg - 1) / seg
	// (on the stack for up to 160 segments and 512 dims: Flash's at 1M
	// context; no allocation a head)
	var mbuf, sbuf [160]float32
	var obuf [512]float32
	segMax, segSum, o := mbuf[:0], sbuf[:0], obuf[:0]
	if nseg > len(mbuf) {
		segMax, segSum = make([]float32, 0, nseg), make([]float32, 0, nseg)
	}
	if len(out) > len(obuf) {
		o = make([]float32, 0, len(out))
	}
	segMax, segSum, o = segMax[:nseg], segSum[:nseg], o[:len(out)]
	M := sink
	for j := range nseg {
		lo, hi := j*seg, min(nk, (j+1)*seg)
		m := scores[lo]
		for _, s := range scores[lo+1 : hi] {
			m = max(m, s)
		}
		var l float32
		for k := lo; k < hi; k++ {
			e := expf(scores[k] - m)
			scores[k] = e
			l += e
		}
		segMax[j], segSum[j] = m, l
		M = max(M, m)
	}
	L := expf(sink - M)
	for j := range nseg {
		c := expf(segMax[j] - M)
		L += float32(segSum[j] * c)
		for d := range o {
			o[d] = 0
		}
		for k := j * seg; k < min(nk, (j+1)*seg); k++ {
			e, row := scores[k], keys[k][:len(o)]
			for d := range o {
				o[d] += float32(e * row[d])
			}
		}
		for d := range out {
			out[d] += float32(c * o[d])
		}
	}
	for d := range out {
		out[d] /= L
	}
}

// dotF32 returns w·x (len(x) ≥ len(w)) with four running sums over i mod 4
// (each product rounded before its addition), combined as (s0+s1)+(s2+s3):
// the order of the attention and indexer scores, which the CUDA kernels
// reproduce.
func dotF32(w, x []float32) float32 {
	x = x[:len(w)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(w); i += 4 {
		w4, x4 := (*[4]float32)(w[i:]), (*[4]float32)(x[i:])
		s0 += float32(w4[0] * x4[0])
		s1 += float32(w4[1] * x4[1])
		s2 += float32(w4[2] * x4[2])
		s3 += float32(w4[3] * x4[3])
	}
	for ; i < len(w); i++ {
		s0 += float32(w[i] * x[i])
	}
	return (s0 + s1) + (s2 + s3)
}
