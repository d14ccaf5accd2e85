package cpu

import (
	"math"
	"slices"

	"ds4go/engine"
)

// The indexer of ratio-4 layers (official model.py: Indexer.forward). For
// the token at position p:
//
//	q   = indexer.wq_b·qr as IH heads of IHD; RoPE(p) on the last RopeDim;
//	      Hadamard (IHD wide, normalised); FP4 simulation
//	w   = weights_proj·x · (IHD^−½ · IH^−½)
//	score_i = Σ_h relu(q_h·k_i)·w_h over the indexer's own compressed rows
//	      i < (p+1)/4 (its compressor: Hadamard + FP4 rows)
//	picks = the min(IndexerTopK, visible) best rows (ties: lower row first),
//	      in row order (the attention adds them in that order, as it does
//	      the window's and a dense layer's rows); all visible rows when
//	      there are at most IndexerTopK of them (then nothing needs
//	      scoring: ds4.c skips it too)
//
// index returns the picks of every chunk token: rows sel[t·TopK : t·TopK+nsel[t]].
func (be *Backend) index(b *batch, L *layer, tabs []*table, iq, ikv, isc, iw, cs []float32) (sel, nsel []int32) {
	c := &be.cfg
	n, IH, IHD, rd, K := b.n, c.IndexerHeads, c.IndexerHeadDim, c.RopeDim, c.IndexerTopK
	ix := L.idx

	rows := tabs[engine.PartIndex]
	be.compress(b, &ix.comp, L.freqs, ikv, isc, tabs[engine.PartIndexKV], tabs[engine.PartIndexScore], rows,
		func(row []float32) {
			hadamard(row)
			fp4Simulate(row)
		})
	sel = b.sc.i32("idx.sel", n*K)
	nsel = b.sc.i32("idx.nsel", n)
	ratio := L.ratio
	if iq == nil {
		// No token sees more than K rows: each picks all it sees.
		for t := 0; t < n; t++ {
			R := (b.pos + t + 1) / ratio
			nsel[t] = int32(R)
			for i := 0; i < R; i++ {
				sel[t*K+i] = int32(i)
			}
		}
		be.reportPicks(L, b, sel, nsel)
		return sel, nsel
	}
	be.pool.run(n*IH, 4, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			t := j / IH
			qh := iq[j*IHD : (j+1)*IHD]
			rotate(qh[IHD-rd:], cs[t*rd:(t+1)*rd])
			hadamard(qh)
			fp4Simulate(qh)
		}
	})
	wscale := float32(math.Pow(float64(IHD), -0.5) * math.Pow(float64(IH), -0.5))
	for i := range iw[:n*IH] {
		iw[i] *= wscale
	}

	maxRows := (b.pos + n) / ratio
	score := func(t int, scores []float32, lo, hi int) {
		qt := iq[t*IH*IHD : (t+1)*IH*IHD]
		wt := iw[t*IH : (t+1)*IH]
		for i := lo; i < hi; i++ {
			k := rows.entry(i)
			var s float32
			for h := 0; h < IH; h++ {
				d := dotF32(qt[h*IHD:(h+1)*IHD], k)
				if d > 0 {
					s += d * wt[h]
				}
			}
			scores[i] = s
		}
	}
	pick := func(t int, scores []float32, heap []int32) {
		R := (b.pos + t + 1) / ratio
		k := min(K, R)
		nsel[t] = int32(k)
		if R <= K {
			// All visible rows, in row order (the same picks whatever the
			// chunk, scored or not).
			for i := 0; i < R; i++ {
				sel[t*K+i] = int32(i)
			}
			return
		}
		topK(scores[:R], k, sel[t*K:t*K+k], heap)
	}
	if n == 1 {
		scores := b.sc.f32("idx.scores", maxRows)
		R := (b.pos + 1) / ratio
		be.pool.run(R, 64, func(lo, hi int) { score(0, scores, lo, hi) })
		pick(0, scores, b.sc.i32("idx.heap", K))
	} else {
		be.pool.run(n, 1, func(lo, hi int) {
			buf := getRowBuf(maxRows)
			heap := make([]int32, K)
			for t := lo; t < hi; t++ {
				if R := (b.pos + t + 1) / ratio; R > K {
					score(t, *buf, 0, R)
				}
				pick(t, *buf, heap)
			}
			rowBufs.Put(buf)
		})
	}
	be.reportPicks(L, b, sel, nsel)
	return sel, nsel
}

func (be *Backend) reportPicks(L *layer, b *batch, sel, nsel []int32) {
	if be.opts.OnTopK == nil {
		return
	}
	K := be.cfg.IndexerTopK
	for t := 0; t < b.n; t++ {
		be.opts.OnTopK(L.index, b.pos+t, sel[t*K:t*K+int(nsel[t])])
	}
}

// topK writes the indices of the k best scores to out in row order
// (ascending index); a higher score is better, and of equal scores the
// lower index.
func topK(scores []float32, k int, out, heap []int32) {
	better := func(a, b int32) bool {
		sa, sb := scores[a], scores[b]
		return sa > sb || sa == sb && a < b
	}
	if k == 0 {
		return
	}
	// A min-heap (worst at the root) of the best k seen so far.
	h := heap[:0]
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(h) {
				return
			}
			w := l
			if r := l + 1; r < len(h) && better(h[l], h[r]) {
				w = r
			}
			if !better(h[i], h[w]) {
				return
			}
			h[i], h[w] = h[w], h[i]
			i = w
		}
	}
	for i := range scores {
		id := int32(i)
		if len(h) < k {
			h = append(h, id)
			for j := len(h) - 1; j > 0; {
				p := (j - 1) / 2
				if !better(h[p], h[j]) {
					break
				}
				h[p], h[j] = h[j], h[p]
				j = p
			}
			continue
		}
		if better(id, h[0]) {
			h[0] = id
			down(0)
		}
	}
	copy(out, h)
	slices.Sort(out[:k])
}
