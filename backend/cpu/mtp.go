package cpu

import (
	"fmt"

	"ds4go/engine"
	"ds4go/quant"
)

// The MTP block's input and head (official model.py: MTPBlock.forward).
// The block itself runs through the layer ops as layer Config.Layers.

// HasMTP reports whether the weights carry an MTP block (engine.Drafter).
func (be *Backend) HasMTP() bool { return be.mtp != nil }

func (be *Backend) mtpBatch(bi engine.Batch) (*batch, error) {
	if be.mtp == nil {
		return nil, fmt.Errorf("cpu: the model has no MTP block")
	}
	return be.batchOf(bi)
}

// StageMTP appends rows [first, first+n) of src's streams to mb's staged
// rows (engine.Drafter).
func (be *Backend) StageMTP(mbi, srci engine.Batch, first, n int) error {
	mb, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	src, err := be.batchOf(srci)
	if err != nil {
		return err
	}
	if first < 0 || n < 0 || first+n > src.n {
		return fmt.Errorf("cpu: stage rows [%d, %d) of a chunk of %d", first, first+n, src.n)
	}
	if mb.nStaged+n > mb.cap {
		return fmt.Errorf("cpu: staging %d rows after %d in a batch of %d", n, mb.nStaged, mb.cap)
	}
	w := be.cfg.HC * be.cfg.Embed
	if mb.staged == nil {
		mb.staged = make([]float32, mb.cap*w)
	}
	copy(mb.staged[mb.nStaged*w:(mb.nStaged+n)*w], src.h[first*w:(first+n)*w])
	mb.nStaged += n
	return nil
}

// DropStagedMTP keeps only the first keep staged rows (engine.Drafter).
func (be *Backend) DropStagedMTP(mbi engine.Batch, keep int) error {
	mb, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	if keep < 0 {
		return fmt.Errorf("cpu: keep %d staged rows", keep)
	}
	mb.nStaged = min(mb.nStaged, keep)
	return nil
}

// MTPEmbed forms the MTP block's input streams from the oldest staged rows
// and the next tokens (engine.Drafter):
//
//	x_t,j = e_proj·enorm(embed(tokens[t])) + h_proj·hnorm(staged_t,j)
func (be *Backend) MTPEmbed(mbi engine.Batch, pos int, tokens []int32) error {
	mb, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	n := len(tokens)
	if n == 0 || n > mb.nStaged {
		return fmt.Errorf("cpu: MTP chunk of %d tokens with %d staged rows", n, mb.nStaged)
	}
	c, m := &be.cfg, be.mtp
	D, HC := c.Embed, c.HC
	for _, tok := range tokens {
		if tok < 0 || int(tok) >= c.Vocab {
			return fmt.Errorf("cpu: token %d out of range", tok)
		}
	}
	mb.n, mb.pos = n, pos
	copy(mb.tokens, tokens)
	sc := &mb.sc
	e := sc.f32("mtp.e", n*D)
	for t, tok := range tokens {
		if err := quant.Dequantize(be.embd.t, be.embd.row(int(tok)), e[t*D:(t+1)*D]); err != nil {
			return err
		}
		rmsNorm(e[t*D:(t+1)*D], e[t*D:(t+1)*D], m.enorm, c.NormEps)
	}
	hn := sc.f32("mtp.hn", n*HC*D)
	for i := 0; i < n*HC; i++ {
		rmsNorm(hn[i*D:(i+1)*D], mb.staged[i*D:(i+1)*D], m.hnorm, c.NormEps)
	}
	ep := sc.f32("mtp.ep", n*D)
	be.linear(sc, e, D, n, linJob{m.eProj, ep, D})
	be.linear(sc, hn, D, n*HC, linJob{m.hProj, mb.h, D})
	for t := 0; t < n; t++ {
		for j := 0; j < HC; j++ {
			h := mb.h[(t*HC+j)*D : (t*HC+j+1)*D]
			for d := range h {
				h[d] += ep[t*D+d]
			}
		}
	}
	w := HC * D
	copy(mb.staged, mb.staged[n*w:mb.nStaged*w])
	mb.nStaged -= n
	return nil
}

// MTPHead computes the MTP block's logits for the listed chunk rows
// (engine.Drafter).
func (be *Backend) MTPHead(mbi engine.Batch, rows []int, logits []float32) error {
	mb, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	m := be.mtp
	return be.head(mb, rows, logits, m.hcHeadFn, m.hcHeadScale, m.hcHeadBase, m.norm)
}
