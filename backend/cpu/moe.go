package cpu

import (
	"math"

	"ds4go/engine"
)

// The MoE sub-block (official model.py: Gate, Expert, MoE):
//
//	s = sqrt(softplus(gate·x))                     (f32, every layer)
//	experts = tid2eid[token]        on hash layers (layer < HashLayers)
//	        = top-k of s + bias     on learned-routing layers (bias only
//	                                 for the selection)
//	w = s[experts], / Σ (ExpertWeightsNorm), × ExpertWeightsScale
//	y = Σ_e (in expert order) w2_e·(w_e · silu(min(w1_e·x, L)) · clamp(w3_e·x, ±L))
//	  + w2_s·(silu(w1_s·x) · (w3_s·x))             (shared expert: no clamp)
//
// L is the layer's SwiGLU clamp (none when 0). Options.ClampSharedExpert
// clamps the shared expert too, as ds4.c does.

// FFN runs the MoE sub-block on b.x into b.out.
func (be *Backend) FFN(bi engine.Batch, layer int) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	c := &be.cfg
	L := &be.layers[layer]
	sc := &b.sc
	n, D, E, K, FF := b.n, c.Embed, c.Experts, c.ExpertsUsed, c.ExpertFF

	// Router logits and the shared expert's gate/up share the input.
	s := sc.f32("moe.s", n*E)
	shg, shu := sc.f32("moe.shg", n*FF), sc.f32("moe.shu", n*FF)
	be.linear(sc, b.x, D, n, linJob{L.gate, s, E}, linJob{L.gateSh, shg, FF}, linJob{L.upSh, shu, FF})

	sel := sc.i32("moe.sel", n*K)
	wts := sc.f32("moe.w", n*K)
	biased := sc.f32("moe.biased", E)
	heap := sc.i32("moe.heap", K)
	for t := 0; t < n; t++ {
		st := s[t*E : (t+1)*E]
		for e, v := range st {
			st[e] = float32(math.Sqrt(float64(softplus(v))))
		}
		ids := sel[t*K : (t+1)*K]
		if L.hash {
			tok := int(b.tokens[t])
			copy(ids, L.tid2eid[tok*K:(tok+1)*K])
		} else {
			copy(biased, st)
			if L.bias != nil {
				for e := range biased {
					biased[e] += L.bias[e]
				}
			}
			topK(biased, K, ids, heap)
		}
		w := wts[t*K : (t+1)*K]
		var sum float32
		for i, e := range ids {
			w[i] = st[e]
			sum += w[i]
		}
		for i := range w {
			if c.ExpertWeightsNorm {
				w[i] /= sum
			}
			w[i] *= c.ExpertWeightsScale
		}
	}

	y := b.out[:n*D]
	for i := range y {
		y[i] = 0
	}
	// Routed experts in ascending expert order, each over the tokens that
	// chose it, so every token's sum runs in the same order as in model.py.
	toks := sc.i32("moe.toks", n*K)
	slot := sc.i32("moe.slot", n*K)
	xe := sc.f32("moe.xe", n*K*D)
	ge, ue := sc.f32("moe.ge", n*K*FF), sc.f32("moe.ue", n*K*FF)
	ye := sc.f32("moe.ye", n*K*D)
	lim := L.clamp
	for e := 0; e < E; e++ {
		m := 0
		for t := 0; t < n; t++ {
			for i, id := range sel[t*K : (t+1)*K] {
				if int(id) == e {
					toks[m], slot[m] = int32(t), int32(i)
					m++
				}
			}
		}
		if m == 0 {
			continue
		}
		for i := 0; i < m; i++ {
			t := int(toks[i])
			copy(xe[i*D:(i+1)*D], b.x[t*D:(t+1)*D])
		}
		be.linear(sc, xe, D, m, linJob{L.gateExps.sub(e*FF, FF), ge, FF}, linJob{L.upExps.sub(e*FF, FF), ue, FF})
		for i := 0; i < m; i++ {
			w := wts[int(toks[i])*K+int(slot[i])]
			swiglu(ge[i*FF:(i+1)*FF], ue[i*FF:(i+1)*FF], lim, w)
		}
		be.linear(sc, ge, FF, m, linJob{L.downExps.sub(e*D, D), ye, D})
		for i := 0; i < m; i++ {
			t := int(toks[i])
			yt, src := y[t*D:(t+1)*D], ye[i*D:(i+1)*D]
			for d := range yt {
				yt[d] += src[d]
			}
		}
	}

	// Shared expert.
	shLim := float32(0)
	if be.opts.ClampSharedExpert {
		shLim = lim
	}
	for t := 0; t < n; t++ {
		swiglu(shg[t*FF:(t+1)*FF], shu[t*FF:(t+1)*FF], shLim, 1)
	}
	yse := sc.f32("moe.ys", n*D)
	be.linear(sc, shg, FF, n, linJob{L.downSh, yse, D})
	for i := range y {
		y[i] += yse[i]
	}
	return nil
}

// swiglu writes silu(gate)·up·w into gate, first clamping up to ±lim and
// gate to ≤ lim when lim > 0 (w = 1 multiplies nothing).
func swiglu(gate, up []float32, lim, w float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		u := up[i]
		if lim > 0 {
			u = min(max(u, -lim), lim)
			g = min(g, lim)
		}
		gate[i] = w * (silu(g) * u)
	}
}

var _ engine.Backend = (*Backend)(nil)
var _ engine.Inspector = (*Backend)(nil)
var _ engine.Fingerprinter = (*Backend)(nil)
