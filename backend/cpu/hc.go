package cpu

import (
	"fmt"

	"ds4go/engine"
	"ds4go/quant"
)

// Embedding, hyper-connections and the output head (official model.py:
// Transformer.forward, Block.hc_pre/hc_post, ParallelHead.hc_head, and the
// kernel hc_split_sinkhorn).

// Embed copies each token's embedding row into all HC streams.
func (be *Backend) Embed(bi engine.Batch, pos int, tokens []int32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if len(tokens) == 0 || len(tokens) > b.cap {
		return fmt.Errorf("cpu: chunk of %d tokens for a batch of %d", len(tokens), b.cap)
	}
	c := &be.cfg
	D, HC := c.Embed, c.HC
	b.n, b.pos = len(tokens), pos
	copy(b.tokens, tokens)
	for t, tok := range tokens {
		if tok < 0 || int(tok) >= c.Vocab {
			return fmt.Errorf("cpu: token %d out of range", tok)
		}
		h := b.h[t*HC*D : (t+1)*HC*D]
		if err := quant.Dequantize(be.embd.t, be.embd.row(int(tok)), h[:D]); err != nil {
			return err
		}
		for j := 1; j < HC; j++ {
			copy(h[j*D:(j+1)*D], h[:D])
		}
	}
	return nil
}

// mixes computes, for every token of the chunk, fn·flat(h_t) ·
// rsqrt(mean(h_t²) + NormEps) over the flattened streams: the
// hyper-connection mixing logits (rows of fn) of hc_pre and hc_head.
func (be *Backend) mixes(b *batch, fn *mat, out []float32) {
	c := &be.cfg
	HCD := c.HC * c.Embed
	rows := fn.rows
	be.linear(&b.sc, b.h, HCD, b.n, linJob{fn, out, rows})
	for t := 0; t < b.n; t++ {
		r := rmsScale(b.h[t*HCD:(t+1)*HCD], c.NormEps)
		for i := range out[t*rows : (t+1)*rows] {
			out[t*rows+i] *= r
		}
	}
}

// sinkhorn splits one token's mixing logits m (HCMixes values) into the
// pre-weights, post-weights and the combination matrix comb[j·HC+k]:
//
//	pre_j  = sigmoid(m_j·scale0 + base_j) + eps
//	post_j = 2·sigmoid(m_{HC+j}·scale1 + base_{HC+j})
//	comb   = row-softmax(m_{2HC+j·HC+k}·scale2 + base_…) + eps,
//	         then columns divided by (column sum + eps),
//	         then (iters−1)× rows by (row sum + eps), columns by (column sum + eps).
func sinkhorn(pre, post, comb, m, scale, base []float32, hc, iters int, eps float32) {
	for j := 0; j < hc; j++ {
		pre[j] = sigmoid(m[j]*scale[0]+base[j]) + eps
		post[j] = 2 * sigmoid(m[hc+j]*scale[1]+base[hc+j])
	}
	for j := 0; j < hc; j++ {
		row := comb[j*hc : (j+1)*hc]
		mx := float32(0)
		for k := range row {
			i := 2*hc + j*hc + k
			row[k] = m[i]*scale[2] + base[i]
			if k == 0 || row[k] > mx {
				mx = row[k]
			}
		}
		var sum float32
		for k := range row {
			row[k] = expf(row[k] - mx)
			sum += row[k]
		}
		for k := range row {
			row[k] = row[k]/sum + eps
		}
	}
	normCols := func() {
		for k := 0; k < hc; k++ {
			var s float32
			for j := 0; j < hc; j++ {
				s += comb[j*hc+k]
			}
			s += eps
			for j := 0; j < hc; j++ {
				comb[j*hc+k] /= s
			}
		}
	}
	normRows := func() {
		for j := 0; j < hc; j++ {
			var s float32
			for k := 0; k < hc; k++ {
				s += comb[j*hc+k]
			}
			s += eps
			for k := 0; k < hc; k++ {
				comb[j*hc+k] /= s
			}
		}
	}
	normCols()
	for it := 1; it < iters; it++ {
		normRows()
		normCols()
	}
}

func (L *layer) hcOf(sub engine.SubBlock) (*hcWeights, []float32) {
	if sub == engine.AttnSub {
		return &L.hcAttn, L.attnNorm
	}
	return &L.hcFFN, L.ffnNorm
}

// HCPre computes the sub-block input x_t = norm(Σ_j pre_j·h_t,j) and keeps
// post/comb for HCPost.
func (be *Backend) HCPre(bi engine.Batch, layer int, sub engine.SubBlock) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	c := &be.cfg
	L := &be.layers[layer]
	hw, normW := L.hcOf(sub)
	D, HC, M := c.Embed, c.HC, c.HCMixes()
	mx := b.sc.f32("hc.mixes", b.n*M)
	be.mixes(b, hw.fn, mx)
	pre := make([]float32, HC)
	for t := 0; t < b.n; t++ {
		sinkhorn(pre, b.post[t*HC:(t+1)*HC], b.comb[t*HC*HC:(t+1)*HC*HC], mx[t*M:(t+1)*M],
			hw.scale, hw.base, HC, c.SinkhornIters, c.HCEps)
		x := b.x[t*D : (t+1)*D]
		h := b.h[t*HC*D : (t+1)*HC*D]
		for d := range x {
			var s float32
			for j := 0; j < HC; j++ {
				s += pre[j] * h[j*D+d]
			}
			x[d] = s
		}
		rmsNorm(x, x, normW, c.NormEps)
	}
	return nil
}

// HCPost folds the sub-block output back: h'_k = post_k·out + Σ_j comb[j][k]·h_j.
func (be *Backend) HCPost(bi engine.Batch, layer int, sub engine.SubBlock) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	c := &be.cfg
	D, HC := c.Embed, c.HC
	tmp := b.sc.f32("hc.post", HC*D)
	for t := 0; t < b.n; t++ {
		h := b.h[t*HC*D : (t+1)*HC*D]
		o := b.out[t*D : (t+1)*D]
		post, comb := b.post[t*HC:(t+1)*HC], b.comb[t*HC*HC:(t+1)*HC*HC]
		for k := 0; k < HC; k++ {
			dst := tmp[k*D : (k+1)*D]
			for d := range dst {
				var s float32
				for j := 0; j < HC; j++ {
					s += comb[j*HC+k] * h[j*D+d]
				}
				dst[d] = post[k]*o[d] + s
			}
		}
		copy(h, tmp)
	}
	return nil
}

// Head computes, for every chunk row, the head input norm(Σ_j pre_j·h_j)
// with pre_j = sigmoid(mix_j·scale + base_j) + HCEps (no Sinkhorn), and the
// logits of the requested rows.
func (be *Backend) Head(bi engine.Batch, rows []int, logits []float32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	return be.head(b, rows, logits, be.hcHeadFn, be.hcHeadScale, be.hcHeadBase, be.outNorm)
}

// head is Head with the given hyper-connection head and final norm (the
// model's, or the MTP block's).
func (be *Backend) head(b *batch, rows []int, logits []float32, fn *mat, scale float32, base, norm []float32) error {
	c := &be.cfg
	D, HC, V := c.Embed, c.HC, c.Vocab
	if len(logits) < len(rows)*V {
		return fmt.Errorf("cpu: head: %d rows need %d logits, got %d", len(rows), len(rows)*V, len(logits))
	}
	mx := b.sc.f32("head.mixes", b.n*HC)
	be.mixes(b, fn, mx)
	pre := make([]float32, HC)
	for t := 0; t < b.n; t++ {
		x := b.headIn[t*D : (t+1)*D]
		h := b.h[t*HC*D : (t+1)*HC*D]
		for j := range pre {
			pre[j] = sigmoid(mx[t*HC+j]*scale+base[j]) + c.HCEps
		}
		for d := range x {
			var s float32
			for j := 0; j < HC; j++ {
				s += pre[j] * h[j*D+d]
			}
			x[d] = s
		}
		rmsNorm(x, x, norm, c.NormEps)
	}
	in := b.sc.f32("head.in", len(rows)*D)
	for i, r := range rows {
		if r < 0 || r >= b.n {
			return fmt.Errorf("cpu: head row %d outside the chunk of %d", r, b.n)
		}
		copy(in[i*D:(i+1)*D], b.headIn[r*D:(r+1)*D])
	}
	be.linear(&b.sc, in, D, len(rows), linJob{be.out, logits, V})
	return nil
}
