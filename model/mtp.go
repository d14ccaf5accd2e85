package model

import (
	"fmt"
	"strings"

	"ds4go/gguf"
)

// MTPPrefix is the tensor-name prefix of the multi-token-prediction block,
// as in the official checkpoint (mtp.0.*) and ds4's MTP GGUF.
const MTPPrefix = "mtp.0."

// MTP holds the multi-token-prediction block, the draft head of speculative
// decoding. It is one more transformer block (index Config.Layers in
// layer-indexed operations) whose input streams are formed from the main
// model's output streams h_i at position i and the embedding of the token at
// i+1:
//
//	x_j = e_proj(enorm(embed(t_{i+1}))) + h_proj(hnorm(h_{i,j}))   for every stream j
//
// and whose output goes through its own hyper-connection head and norm
// into the main model's vocabulary projection, predicting t_{i+2}. The
// embedding and the vocabulary projection are the main model's (official
// model.py: MTPBlock shares embed and head; DeepSeek-V3 report §2.2 for the
// (h_i, t_{i+1}) → t_{i+2} alignment, which vLLM's MTP proposer also uses).
type MTP struct {
	Block       Layer   // the transformer block; Block.Index is Config.Layers
	EProj       *Tensor // [Embed][Embed], applied to the normalised embedding
	HProj       *Tensor // [Embed][Embed], applied to each normalised stream
	ENorm       *Tensor // [Embed]
	HNorm       *Tensor // [Embed]
	Norm        *Tensor // [Embed], the head's final norm
	HCHeadFn    *Tensor // [HC·Embed][HC]
	HCHeadBase  *Tensor // [HC]
	HCHeadScale *Tensor // [1]
}

// MTPRatio returns the compression ratio of the MTP block: the entry of
// compress_ratios after the layers' (Flash lists 44 ratios for 43 layers
// and one MTP block), or 0 when the list has no such entry.
func (c *Config) MTPRatio() int { return c.Ratio(c.Layers) }

// Clamp returns the SwiGLU clamp of block l; the MTP block (l = Layers)
// takes its own entry when swiglu_clamp_exp has one, else the last layer's
// (the official model uses one swiglu_limit for every block).
func (c *Config) Clamp(l int) float32 {
	if l < len(c.SwigluClamp) {
		return c.SwigluClamp[l]
	}
	return c.SwigluClamp[len(c.SwigluClamp)-1]
}

// checkMTP reports why this engine cannot run an MTP block of c, or nil.
func (c *Config) checkMTP() error {
	if r := c.MTPRatio(); r != RatioNone {
		return fmt.Errorf("MTP block: compress ratio %d, only the sliding-window block (ratio 0) of DS4 is supported", r)
	}
	return nil
}

// MTPTensors returns the tensors of the MTP block, bound to block index
// c.Layers: the block's own tensors (the names of a layer's, prefixed
// mtp.0., sliding-window attention and learned routing) and the input
// projections, norms and hyper-connection head of the draft.
func MTPTensors(c *Config) []TensorSpec {
	E, HC := uint64(c.Embed), uint64(c.HC)
	l, p := c.Layers, MTPPrefix
	specs := blockTensors(c, l, p, c.MTPRatio(), false)
	add := func(name string, slot func(m *MTP) **Tensor, role Role, dims ...uint64) {
		specs = append(specs, TensorSpec{Name: p + name, Dims: dims, Role: role, Layer: l,
			slot: func(w *Weights, _ int) **Tensor { return slot(w.MTP) }})
	}
	add("e_proj.weight", func(m *MTP) **Tensor { return &m.EProj }, RoleDense, E, E)
	add("h_proj.weight", func(m *MTP) **Tensor { return &m.HProj }, RoleDense, E, E)
	add("enorm.weight", func(m *MTP) **Tensor { return &m.ENorm }, RoleVector, E)
	add("hnorm.weight", func(m *MTP) **Tensor { return &m.HNorm }, RoleVector, E)
	add("norm.weight", func(m *MTP) **Tensor { return &m.Norm }, RoleVector, E)
	add("hc_head_fn.weight", func(m *MTP) **Tensor { return &m.HCHeadFn }, RoleSmall, E*HC, HC)
	add("hc_head_base.weight", func(m *MTP) **Tensor { return &m.HCHeadBase }, RoleVector, HC)
	add("hc_head_scale.weight", func(m *MTP) **Tensor { return &m.HCHeadScale }, RoleVector, 1)
	return specs
}

// block returns block l's weights: a layer, or the MTP block (l = Layers).
func (w *Weights) block(l int) *Layer {
	if l == len(w.Layers) {
		return &w.MTP.Block
	}
	return &w.Layers[l]
}

// BindMTP binds the MTP block of w's model from src (validated tensors:
// ValidateMTP) into w.MTP.
func BindMTP(w *Weights, src TensorSource) error {
	c := &w.Config
	if err := c.checkMTP(); err != nil {
		return err
	}
	w.MTP = &MTP{Block: Layer{Index: c.Layers, Ratio: c.MTPRatio()}}
	if missing := bindSpecs(w, src, MTPTensors(c)); len(missing) > 0 {
		w.MTP = nil
		return &LayoutError{Problems: prefixEach("missing MTP tensor ", missing)}
	}
	return nil
}

// HasMTP reports whether a GGUF file carries tensors of an MTP block.
func HasMTP(f *gguf.File) bool {
	for i := range f.Tensors {
		if strings.HasPrefix(f.Tensors[i].Name, MTPPrefix) {
			return true
		}
	}
	return false
}

// ValidateMTP checks a separate MTP file (ds4's DeepSeek-V4-Flash-MTP
// GGUF) against the main model's hyperparameters: the MTP block's tensors
// with their shapes and allowed types, and no other mtp.* tensor. Tensors
// outside mtp.* are not used (the embedding and the vocabulary projection
// are the main file's, as in ds4) and not checked. Its metadata is not
// required (ds4 checks none); a file that declares another architecture is
// refused.
func ValidateMTP(c *Config, f *gguf.File) error {
	if v, ok := f.KV("general.architecture"); ok {
		if s, err := v.AsString(); err != nil || s != Architecture {
			return fmt.Errorf("%w: MTP file: general.architecture is %s", ErrNotDS4, v.Format(4))
		}
	}
	if err := c.checkMTP(); err != nil {
		return err
	}
	return validateSpecs(c, f, MTPTensors(c), []int{c.Layers}, true)
}

// LoadMTP validates a separate MTP file against w's model and binds its
// block into w.MTP (the file must stay mapped while w is used).
func LoadMTP(w *Weights, f *gguf.File) error {
	if err := ValidateMTP(&w.Config, f); err != nil {
		return err
	}
	return BindMTP(w, GGUFSource{f})
}
