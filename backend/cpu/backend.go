// Package cpu is the reference backend of the DeepSeek V4 forward pass:
// plain Go loops, f32 activations and KV state, weights used where they lie
// (a mapped GGUF file) through the quantized dot products of package quant,
// and a pool of goroutines that splits matrix rows (and attention heads,
// tokens, indexer rows) across all cores.
//
// Each mechanism lives in its own file and reads like the official
// model.py: hc.go (embedding, hyper-connections, head), attention.go,
// compressor.go, indexer.go, moe.go; qat.go holds the FP8/FP4/Hadamard
// simulations and rope.go the rotary embedding. docs/engine.md describes the
// algorithms and where each fact comes from.
package cpu

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"

	"ds4go/engine"
	"ds4go/model"
	"ds4go/quant"
)

// Options configures the CPU backend.
type Options struct {
	// Threads is the number of goroutines that run parallel loops
	// (GOMAXPROCS when ≤ 0).
	Threads int
	// ClampSharedExpert applies the SwiGLU clamp to the shared expert too,
	// as antirez/ds4's ds4.c does (layer_shared_ffn_one). The official
	// model.py does not ("# no swiglu_limit"), and neither does the default.
	ClampSharedExpert bool
	// OnTopK, if set, is called during Attention of ratio-4 layers with the
	// compressed rows the indexer picked for each position, in row order (for
	// tests and debugging; rows is reused after the call).
	OnTopK func(layer, pos int, rows []int32)
	// AttnSerial selects the attention's serial summation order (AttendHead
	// with seg 0) instead of the default, the segmented order of
	// AttnSegmentKeys keys a segment. The CUDA backend's exact mode sums in
	// the segmented order by default too (its option OptAttnOrder; 0 is the
	// serial order, the one both backends used before v66: cuda/NOTES.md
	// v65 and v66).
	AttnSerial bool
}

// Backend runs the forward pass of one model on the CPU. It implements
// engine.Backend and engine.Inspector. Ops on different batches and states
// may run concurrently.
type Backend struct {
	cfg  model.Config
	w    *model.Weights
	opts Options
	pool *pool

	layers []layer

	embd        *mat
	out         *mat
	outNorm     []float32
	hcHeadFn    *mat
	hcHeadBase  []float32
	hcHeadScale float32
	mtp         *mtpWeights // nil without an MTP block

	fingerprint []byte
}

// mtpWeights are the MTP block's input projections and head; the block
// itself is layers[Config.Layers].
type mtpWeights struct {
	eProj, hProj       *mat
	enorm, hnorm, norm []float32
	hcHeadFn           *mat
	hcHeadBase         []float32
	hcHeadScale        float32
}

// hcWeights are one sub-block's hyper-connection mixing weights.
type hcWeights struct {
	fn    *mat      // [HCMixes][HC·Embed]
	scale []float32 // 3: pre, post, comb
	base  []float32 // [HCMixes]
}

// compressor holds a compressor's weights (attention or indexer).
type compressor struct {
	ratio, coff, width int
	ape                []float32 // [ratio][coff·width]
	kv, gate           *mat      // [coff·width][Embed]
	norm               []float32 // [width]
}

type indexer struct {
	qb, proj *mat // [IH·IHD][QLora], [IH][Embed]
	comp     compressor
}

// layer holds one block's prepared weights.
type layer struct {
	index, ratio int
	hash         bool
	freqs        []float32 // RoPE frequencies of this layer

	hcAttn, hcFFN     hcWeights
	attnNorm, ffnNorm []float32

	qa     *mat
	qNorm  []float32
	qb     *mat
	kv     *mat
	kvNorm []float32
	sinks  []float32
	outA   *mat // [OGroups·OLora][Heads·HeadDim/OGroups]
	outB   *mat
	comp   *compressor
	idx    *indexer

	gate                       *mat
	bias                       []float32 // nil on hash layers
	tid2eid                    []int32   // [Vocab][ExpertsUsed] on hash layers
	gateExps, upExps, downExps *mat      // stacked: expert e = rows e·FF… / e·Embed…
	gateSh, upSh, downSh       *mat
	clamp                      float32
}

// New prepares a backend for the weights (which must stay valid, e.g. the
// GGUF file stay mapped, while the backend is used).
func New(w *model.Weights, opts Options) (*Backend, error) {
	c := w.Config
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if (c.HeadDim-c.RopeDim)%fp8Block != 0 {
		return nil, fmt.Errorf("cpu: head_dim %d − rope dims %d is not a multiple of the FP8 block %d", c.HeadDim, c.RopeDim, fp8Block)
	}
	for l := 0; l < c.Layers; l++ {
		if c.Ratio(l) == model.RatioIndexed {
			ihd := c.IndexerHeadDim
			if ihd&(ihd-1) != 0 || ihd%fp4Block != 0 {
				return nil, fmt.Errorf("cpu: indexer head dim %d must be a power of two and a multiple of %d (Hadamard + FP4)", ihd, fp4Block)
			}
		}
	}
	threads := opts.Threads
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	be := &Backend{cfg: c, w: w, opts: opts}
	if err := be.prepare(); err != nil {
		return nil, err
	}
	be.pool = newPool(threads)
	return be, nil
}

// Close stops the backend's worker goroutines.
func (be *Backend) Close() error {
	be.pool.close()
	return nil
}

// Name returns "cpu".
func (be *Backend) Name() string { return "cpu" }

// Config returns the model's hyperparameters.
func (be *Backend) Config() *model.Config { return &be.cfg }

// Threads returns the number of goroutines the backend computes with.
func (be *Backend) Threads() int { return be.pool.workers }

// WeightsFingerprint identifies the weights (engine.Fingerprinter): a hash
// of the storage scheme and a few small tensors.
func (be *Backend) WeightsFingerprint() []byte { return be.fingerprint }

// vec decodes a small tensor to f32, checking its length.
func vec(t *model.Tensor, n int) ([]float32, error) {
	if t == nil {
		return nil, fmt.Errorf("missing tensor")
	}
	total := t.RowLen() * t.Rows()
	if total != n {
		return nil, fmt.Errorf("%s: %d values, want %d", t.Name, total, n)
	}
	out := make([]float32, n)
	if err := quant.Dequantize(t.Type, t.Data, out); err != nil {
		return nil, fmt.Errorf("%s: %w", t.Name, err)
	}
	return out, nil
}

func (be *Backend) prepare() error {
	c, w := &be.cfg, be.w
	D, HC, mixes := c.Embed, c.HC, c.HCMixes()
	var err error
	wrap := func(what string, e error) error {
		if e == nil {
			return nil
		}
		return fmt.Errorf("cpu: %s: %w", what, e)
	}
	if be.embd, err = newMat(w.TokenEmbd, c.Vocab, D); err != nil {
		return wrap("token_embd", err)
	}
	if be.out, err = newMat(w.Output, c.Vocab, D); err != nil {
		return wrap("output", err)
	}
	if be.outNorm, err = vec(w.OutputNorm, D); err != nil {
		return wrap("output_norm", err)
	}
	if be.hcHeadFn, err = newMat(w.OutputHCFn, HC, HC*D); err != nil {
		return wrap("output_hc_fn", err)
	}
	if be.hcHeadBase, err = vec(w.OutputHCBase, HC); err != nil {
		return wrap("output_hc_base", err)
	}
	sc, err := vec(w.OutputHCScal, 1)
	if err != nil {
		return wrap("output_hc_scale", err)
	}
	be.hcHeadScale = sc[0]

	hc := func(fn, scale, base *model.Tensor) (hcWeights, error) {
		var h hcWeights
		var err error
		if h.fn, err = newMat(fn, mixes, HC*D); err != nil {
			return h, err
		}
		if h.scale, err = vec(scale, 3); err != nil {
			return h, err
		}
		h.base, err = vec(base, mixes)
		return h, err
	}
	comp := func(cw *model.Compressor, ratio, width int) (compressor, error) {
		cp := compressor{ratio: ratio, coff: 1, width: width}
		if ratio == model.RatioIndexed {
			cp.coff = 2
		}
		var err error
		if cp.ape, err = vec(cw.APE, ratio*cp.coff*width); err != nil {
			return cp, err
		}
		if cp.kv, err = newMat(cw.KV, cp.coff*width, D); err != nil {
			return cp, err
		}
		if cp.gate, err = newMat(cw.Gate, cp.coff*width, D); err != nil {
			return cp, err
		}
		cp.norm, err = vec(cw.Norm, width)
		return cp, err
	}

	be.layers = make([]layer, c.Layers, c.Layers+1)
	for l := range be.layers {
		if err := be.prepareLayer(&be.layers[l], &w.Layers[l], hc, comp); err != nil {
			return err
		}
	}
	if w.MTP != nil {
		be.layers = append(be.layers, layer{})
		if err := be.prepareLayer(&be.layers[c.Layers], &w.MTP.Block, hc, comp); err != nil {
			return err
		}
		if be.mtp, err = prepareMTP(c, w.MTP); err != nil {
			return err
		}
	}
	h := sha256.New()
	h.Write([]byte(w.Scheme))
	for _, v := range [][]float32{be.outNorm, be.hcHeadBase, be.layers[0].sinks, be.layers[c.Layers-1].attnNorm} {
		for _, x := range v {
			h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(x)))
		}
	}
	h.Write(be.embd.row(0))
	be.fingerprint = h.Sum(nil)
	return nil
}

type (
	hcPrep   func(fn, scale, base *model.Tensor) (hcWeights, error)
	compPrep func(cw *model.Compressor, ratio, width int) (compressor, error)
)

// prepareLayer prepares block wl (a layer or the MTP block) into L.
func (be *Backend) prepareLayer(L *layer, wl *model.Layer, hc hcPrep, comp compPrep) error {
	c := &be.cfg
	D, H, HD, QL := c.Embed, c.Heads, c.HeadDim, c.QLoraRank
	E, FF := c.Experts, c.ExpertFF
	var err error
	l := wl.Index
	L.index, L.ratio, L.hash = l, c.Ratio(l), c.IsHashLayer(l)
	L.freqs = engine.RopeFrequencies(c, l)
	L.clamp = c.Clamp(l)
	steps := []struct {
		what string
		do   func() error
	}{
		{"hc_attn", func() (e error) { L.hcAttn, e = hc(wl.HCAttnFn, wl.HCAttnScale, wl.HCAttnBase); return }},
		{"hc_ffn", func() (e error) { L.hcFFN, e = hc(wl.HCFFNFn, wl.HCFFNScale, wl.HCFFNBase); return }},
		{"attn_norm", func() (e error) { L.attnNorm, e = vec(wl.AttnNorm, D); return }},
		{"ffn_norm", func() (e error) { L.ffnNorm, e = vec(wl.FFNNorm, D); return }},
		{"attn_q_a", func() (e error) { L.qa, e = newMat(wl.QA, QL, D); return }},
		{"attn_q_a_norm", func() (e error) { L.qNorm, e = vec(wl.QANorm, QL); return }},
		{"attn_q_b", func() (e error) { L.qb, e = newMat(wl.QB, H*HD, QL); return }},
		{"attn_kv", func() (e error) { L.kv, e = newMat(wl.KV, HD, D); return }},
		{"attn_kv_a_norm", func() (e error) { L.kvNorm, e = vec(wl.KVNorm, HD); return }},
		{"attn_sinks", func() (e error) { L.sinks, e = vec(wl.Sinks, H); return }},
		{"attn_output_a", func() (e error) { L.outA, e = newMat(wl.OutA, c.OGroups*c.OLoraRank, H*HD/c.OGroups); return }},
		{"attn_output_b", func() (e error) { L.outB, e = newMat(wl.OutB, D, c.OGroups*c.OLoraRank); return }},
		{"ffn_gate_inp", func() (e error) { L.gate, e = newMat(wl.GateInp, E, D); return }},
		{"ffn_gate_exps", func() (e error) { L.gateExps, e = newMat(wl.GateExps, E*FF, D); return }},
		{"ffn_up_exps", func() (e error) { L.upExps, e = newMat(wl.UpExps, E*FF, D); return }},
		{"ffn_down_exps", func() (e error) { L.downExps, e = newMat(wl.DownExps, E*D, FF); return }},
		{"ffn_gate_shexp", func() (e error) { L.gateSh, e = newMat(wl.GateShexp, FF, D); return }},
		{"ffn_up_shexp", func() (e error) { L.upSh, e = newMat(wl.UpShexp, FF, D); return }},
		{"ffn_down_shexp", func() (e error) { L.downSh, e = newMat(wl.DownShexp, D, FF); return }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("cpu: layer %d %s: %w", l, s.what, err)
		}
	}
	if L.ratio != model.RatioNone {
		if wl.Compressor == nil {
			return fmt.Errorf("cpu: layer %d: no compressor", l)
		}
		cp, err := comp(wl.Compressor, L.ratio, HD)
		if err != nil {
			return fmt.Errorf("cpu: layer %d attention compressor: %w", l, err)
		}
		L.comp = &cp
	}
	if L.ratio == model.RatioIndexed {
		if wl.Indexer == nil {
			return fmt.Errorf("cpu: layer %d: no indexer", l)
		}
		ix := &indexer{}
		IH, IHD := c.IndexerHeads, c.IndexerHeadDim
		if ix.qb, err = newMat(wl.Indexer.QB, IH*IHD, QL); err != nil {
			return fmt.Errorf("cpu: layer %d indexer q_b: %w", l, err)
		}
		if ix.proj, err = newMat(wl.Indexer.Proj, IH, D); err != nil {
			return fmt.Errorf("cpu: layer %d indexer proj: %w", l, err)
		}
		if ix.comp, err = comp(&wl.Indexer.Compressor, L.ratio, IHD); err != nil {
			return fmt.Errorf("cpu: layer %d indexer compressor: %w", l, err)
		}
		L.idx = ix
	}
	if L.hash {
		t := wl.Tid2Eid
		if t == nil || t.Type != quant.I32 || t.RowLen() != c.ExpertsUsed || t.Rows() != c.Vocab {
			return fmt.Errorf("cpu: layer %d: tid2eid must be I32 [%d][%d]", l, c.Vocab, c.ExpertsUsed)
		}
		L.tid2eid = make([]int32, c.Vocab*c.ExpertsUsed)
		for i := range L.tid2eid {
			e := int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
			if e < 0 || int(e) >= E {
				return fmt.Errorf("cpu: layer %d: tid2eid[%d] = %d is not an expert", l, i, e)
			}
			L.tid2eid[i] = e
		}
	} else if wl.ExpProbsBias != nil {
		if L.bias, err = vec(wl.ExpProbsBias, E); err != nil {
			return fmt.Errorf("cpu: layer %d exp_probs_b: %w", l, err)
		}
	}
	return nil
}

// prepareMTP prepares the MTP block's input projections and head.
func prepareMTP(c *model.Config, m *model.MTP) (*mtpWeights, error) {
	D, HC := c.Embed, c.HC
	p := &mtpWeights{}
	var err error
	steps := []struct {
		what string
		do   func() error
	}{
		{"e_proj", func() (e error) { p.eProj, e = newMat(m.EProj, D, D); return }},
		{"h_proj", func() (e error) { p.hProj, e = newMat(m.HProj, D, D); return }},
		{"enorm", func() (e error) { p.enorm, e = vec(m.ENorm, D); return }},
		{"hnorm", func() (e error) { p.hnorm, e = vec(m.HNorm, D); return }},
		{"norm", func() (e error) { p.norm, e = vec(m.Norm, D); return }},
		{"hc_head_fn", func() (e error) { p.hcHeadFn, e = newMat(m.HCHeadFn, HC, HC*D); return }},
		{"hc_head_base", func() (e error) { p.hcHeadBase, e = vec(m.HCHeadBase, HC); return }},
	}
	for _, s := range steps {
		if err = s.do(); err != nil {
			return nil, fmt.Errorf("cpu: MTP %s: %w", s.what, err)
		}
	}
	sc, err := vec(m.HCHeadScale, 1)
	if err != nil {
		return nil, fmt.Errorf("cpu: MTP hc_head_scale: %w", err)
	}
	p.hcHeadScale = sc[0]
	return p, nil
}
