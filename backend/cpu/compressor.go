package cpu

// The KV compressor (official model.py: Compressor). Each token contributes
// its projected values kv = wkv·x and pooling scores wgate·x + ape[p mod r]
// (coff·width each); when a block of r tokens completes, row i = p/r is
// pooled per channel with a softmax over the block's scores:
//
//   - ratio 128 (coff 1): the r entries of block i;
//   - ratio 4 (coff 2, overlapping): the first-half features (0:width) of the
//     r entries of block i−1 followed by the second-half features
//     (width:2·width) of block i; row 0 has no block −1.
//
// The pooled row is RMS-normed, its last RopeDim values rotated at position
// i·r (the block's first token) and then post-processed (FP8 simulation of
// the nope dims for the attention compressor, Hadamard + FP4 for the
// indexer's). The per-position entries live in the state's frontier rings
// (engine.PartCompKV/PartCompScore, PartIndexKV/PartIndexScore), so a block
// that straddles chunks, or follows a rewind, pools exactly as in one pass.

// compress appends the chunk's projected entries (kv and sc: n rows of
// coff·width values, sc without the ape bias) to the frontier rings and
// emits every row whose block completes.
func (be *Backend) compress(b *batch, cp *compressor, freqs []float32, kv, sc []float32,
	kvT, scT, rows *table, post func(row []float32)) {
	r, cw, w := cp.ratio, cp.coff*cp.width, cp.width
	rd := be.cfg.RopeDim
	cs := b.sc.f32("comp.rot", rd)
	weights := b.sc.f32("comp.weights", 2*r)
	for t := 0; t < b.n; t++ {
		p := b.pos + t
		copy(kvT.entry(p), kv[t*cw:(t+1)*cw])
		s := scT.entry(p)
		ape := cp.ape[(p%r)*cw : (p%r+1)*cw]
		for c, v := range sc[t*cw : (t+1)*cw] {
			s[c] = v + ape[c]
		}
		if (p+1)%r != 0 {
			continue
		}
		i := p / r
		row := rows.entry(i)
		first := i * r // first position of the block
		for c := 0; c < w; c++ {
			// Gather the entries of channel c: (position, feature).
			n := 0
			mx := float32(0)
			add := func(q, f int) {
				v := scT.entry(q)[f]
				if n == 0 || v > mx {
					mx = v
				}
				weights[n] = v
				n++
			}
			if cp.coff == 2 && i > 0 {
				for q := first - r; q < first; q++ {
					add(q, c)
				}
			}
			f := c
			if cp.coff == 2 {
				f = w + c
			}
			for q := first; q < first+r; q++ {
				add(q, f)
			}
			var sum float32
			for k := 0; k < n; k++ {
				weights[k] = expf(weights[k] - mx)
				sum += weights[k]
			}
			var acc float32
			k := 0
			if cp.coff == 2 && i > 0 {
				for q := first - r; q < first; q++ {
					acc += kvT.entry(q)[c] * (weights[k] / sum)
					k++
				}
			}
			for q := first; q < first+r; q++ {
				acc += kvT.entry(q)[f] * (weights[k] / sum)
				k++
			}
			row[c] = acc
		}
		rmsNorm(row, row, cp.norm, be.cfg.NormEps)
		rotation(cs, freqs, first)
		rotate(row[w-rd:], cs)
		post(row)
	}
}
