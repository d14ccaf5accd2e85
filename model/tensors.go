package model

import (
	"fmt"
	"slices"
	"strings"

	"ds4go/gguf"
	"ds4go/quant"
)

// Role groups tensors that share the same set of allowed storage types.
type Role int

// Tensor roles.
const (
	// RoleVector is a small F32 vector or matrix: norm weights, attention
	// sinks, router bias, hyper-connection scales and bases.
	RoleVector Role = iota
	// RoleDense is a large dense projection published as Q8_0: attention
	// LoRA and output projections, the shared expert, the LM head.
	RoleDense
	// RoleSmall is a matrix published as F16: the embedding, the
	// hyper-connection mixers, compressors, the indexer and the router.
	RoleSmall
	// RoleExpertGateUp is the stacked routed-expert gate or up projection.
	RoleExpertGateUp
	// RoleExpertDown is the stacked routed-expert down projection.
	RoleExpertDown
	// RoleTokenMap is the hash-routing table (token id → experts), I32.
	RoleTokenMap
)

func (r Role) String() string {
	switch r {
	case RoleVector:
		return "vector"
	case RoleDense:
		return "dense"
	case RoleSmall:
		return "small"
	case RoleExpertGateUp:
		return "expert-gate-up"
	case RoleExpertDown:
		return "expert-down"
	case RoleTokenMap:
		return "token-map"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// Allowed returns the storage types this engine accepts for a role. The
// published files use the first type of RoleVector, RoleSmall, RoleDense and
// RoleTokenMap; the float types serve converted reference checkpoints.
func (r Role) Allowed() []quant.Type {
	switch r {
	case RoleVector:
		return []quant.Type{quant.F32}
	case RoleDense:
		return []quant.Type{quant.Q8_0, quant.F16, quant.BF16, quant.F32}
	case RoleSmall:
		return []quant.Type{quant.F16, quant.BF16, quant.F32}
	case RoleExpertGateUp, RoleExpertDown:
		return []quant.Type{quant.IQ2_XXS, quant.Q2_K, quant.Q4_K, quant.Q8_0, quant.F16, quant.BF16, quant.F32}
	case RoleTokenMap:
		return []quant.Type{quant.I32}
	}
	return nil
}

// TensorSpec is one expected tensor of a DS4 GGUF file.
type TensorSpec struct {
	Name     string
	Dims     []uint64 // Dims[0] is the row length (ggml ne[0])
	Role     Role
	Layer    int  // block index, -1 for model-level tensors
	Optional bool // may be absent (the router bias of learned-routing layers)

	// slot returns where Bind stores the tensor in Weights (the layer's
	// Compressor and Indexer already allocated).
	slot func(w *Weights, layer int) **Tensor
}

// Scheme chooses one storage type per role, as a quantization of the whole
// model does (the published q2 and q4 files, or float checkpoints).
type Scheme struct {
	Name         string
	Dense        quant.Type
	Small        quant.Type
	ExpertGateUp quant.Type
	ExpertDown   quant.Type
}

// The storage schemes of the published files and of float checkpoints.
var (
	// SchemeQ2 is the published q2 file: routed gate/up IQ2_XXS, down Q2_K.
	SchemeQ2 = Scheme{Name: "q2", Dense: quant.Q8_0, Small: quant.F16, ExpertGateUp: quant.IQ2_XXS, ExpertDown: quant.Q2_K}
	// SchemeQ4 is the published q4 file: all routed experts Q4_K.
	SchemeQ4 = Scheme{Name: "q4", Dense: quant.Q8_0, Small: quant.F16, ExpertGateUp: quant.Q4_K, ExpertDown: quant.Q4_K}
	// SchemeQ8 keeps routed experts in Q8_0 (small test models).
	SchemeQ8 = Scheme{Name: "q8", Dense: quant.Q8_0, Small: quant.F16, ExpertGateUp: quant.Q8_0, ExpertDown: quant.Q8_0}
	// SchemeF16 stores every matrix as F16.
	SchemeF16 = Scheme{Name: "f16", Dense: quant.F16, Small: quant.F16, ExpertGateUp: quant.F16, ExpertDown: quant.F16}
	// SchemeF32 stores every matrix as F32 (reference checks).
	SchemeF32 = Scheme{Name: "f32", Dense: quant.F32, Small: quant.F32, ExpertGateUp: quant.F32, ExpertDown: quant.F32}
)

// Schemes lists the named schemes.
var Schemes = []Scheme{SchemeQ2, SchemeQ4, SchemeQ8, SchemeF16, SchemeF32}

// SchemeByName finds a named scheme.
func SchemeByName(name string) (Scheme, bool) {
	for _, s := range Schemes {
		if s.Name == name {
			return s, true
		}
	}
	return Scheme{}, false
}

// TypeFor returns the storage type the scheme gives a role.
func (s Scheme) TypeFor(r Role) quant.Type {
	switch r {
	case RoleDense:
		return s.Dense
	case RoleSmall:
		return s.Small
	case RoleExpertGateUp:
		return s.ExpertGateUp
	case RoleExpertDown:
		return s.ExpertDown
	case RoleTokenMap:
		return quant.I32
	}
	return quant.F32
}

// Typed returns the tensor specs with the scheme's types, as a gguf writer
// takes them. It fails if a type does not fit a tensor's row length (block
// formats need rows that are a multiple of their block size).
func (s Scheme) Typed(specs []TensorSpec) ([]gguf.TensorSpec, error) {
	out := make([]gguf.TensorSpec, 0, len(specs))
	for _, sp := range specs {
		t := s.TypeFor(sp.Role)
		if sp.Dims[0]%uint64(t.BlockSize()) != 0 {
			return nil, fmt.Errorf("scheme %s: %s row length %d is not a multiple of the %v block size %d",
				s.Name, sp.Name, sp.Dims[0], t, t.BlockSize())
		}
		out = append(out, gguf.TensorSpec{Name: sp.Name, Type: t, Dims: slices.Clone(sp.Dims)})
	}
	return out, nil
}

// LayerPrefix returns the tensor-name prefix of block l.
func LayerPrefix(l int) string { return fmt.Sprintf("blk.%d.", l) }

// ExpectedTensors returns every tensor a DS4 GGUF file with these
// hyperparameters carries, in a canonical order: the embedding, each block
// (attention then feed-forward), then the output head. This table is the one
// definition of the layout that validation, binding and synthesis share.
func ExpectedTensors(c *Config) []TensorSpec {
	E, V, HC := uint64(c.Embed), uint64(c.Vocab), uint64(c.HC)
	var specs []TensorSpec
	add := func(layer int, name string, slot func(*Weights, int) **Tensor, role Role, dims ...uint64) {
		specs = append(specs, TensorSpec{Name: name, Dims: dims, Role: role, Layer: layer, slot: slot})
	}
	add(-1, "token_embd.weight", func(w *Weights, _ int) **Tensor { return &w.TokenEmbd }, RoleSmall, E, V)
	for l := 0; l < c.Layers; l++ {
		specs = append(specs, blockTensors(c, l, LayerPrefix(l), c.Ratio(l), c.IsHashLayer(l))...)
	}
	add(-1, "output_hc_base.weight", func(w *Weights, _ int) **Tensor { return &w.OutputHCBase }, RoleVector, HC)
	add(-1, "output_hc_fn.weight", func(w *Weights, _ int) **Tensor { return &w.OutputHCFn }, RoleSmall, E*HC, HC)
	add(-1, "output_hc_scale.weight", func(w *Weights, _ int) **Tensor { return &w.OutputHCScal }, RoleVector, 1)
	add(-1, "output_norm.weight", func(w *Weights, _ int) **Tensor { return &w.OutputNorm }, RoleVector, E)
	add(-1, "output.weight", func(w *Weights, _ int) **Tensor { return &w.Output }, RoleDense, E, V)
	return specs
}

// blockTensors returns the tensors of one transformer block named with
// prefix p ("blk.N." or the MTP block's "mtp.0."), bound to block l.
func blockTensors(c *Config, l int, p string, r int, hash bool) []TensorSpec {
	ratio := uint64(r)
	E, V := uint64(c.Embed), uint64(c.Vocab)
	HD, H := uint64(c.HeadDim), uint64(c.Heads)
	HC, mixes := uint64(c.HC), uint64(c.HCMixes())
	NE, FF := uint64(c.Experts), uint64(c.ExpertFF)
	G, OL, QL := uint64(c.OGroups), uint64(c.OLoraRank), uint64(c.QLoraRank)
	IH, IHD := uint64(c.IndexerHeads), uint64(c.IndexerHeadDim)
	var specs []TensorSpec
	add := func(layer int, name string, slot func(*Weights, int) **Tensor, role Role, dims ...uint64) {
		specs = append(specs, TensorSpec{Name: name, Dims: dims, Role: role, Layer: layer, slot: slot})
	}
	add(l, p+"hc_attn_fn.weight", func(w *Weights, l int) **Tensor { return &w.block(l).HCAttnFn }, RoleSmall, E*HC, mixes)
	add(l, p+"hc_attn_scale.weight", func(w *Weights, l int) **Tensor { return &w.block(l).HCAttnScale }, RoleVector, 3)
	add(l, p+"hc_attn_base.weight", func(w *Weights, l int) **Tensor { return &w.block(l).HCAttnBase }, RoleVector, mixes)
	add(l, p+"attn_norm.weight", func(w *Weights, l int) **Tensor { return &w.block(l).AttnNorm }, RoleVector, E)
	add(l, p+"attn_q_a.weight", func(w *Weights, l int) **Tensor { return &w.block(l).QA }, RoleDense, E, QL)
	add(l, p+"attn_q_a_norm.weight", func(w *Weights, l int) **Tensor { return &w.block(l).QANorm }, RoleVector, QL)
	add(l, p+"attn_q_b.weight", func(w *Weights, l int) **Tensor { return &w.block(l).QB }, RoleDense, QL, H*HD)
	add(l, p+"attn_kv.weight", func(w *Weights, l int) **Tensor { return &w.block(l).KV }, RoleDense, E, HD)
	add(l, p+"attn_kv_a_norm.weight", func(w *Weights, l int) **Tensor { return &w.block(l).KVNorm }, RoleVector, HD)
	add(l, p+"attn_sinks.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Sinks }, RoleVector, H)
	add(l, p+"attn_output_a.weight", func(w *Weights, l int) **Tensor { return &w.block(l).OutA }, RoleDense, HD*(H/G), G*OL)
	add(l, p+"attn_output_b.weight", func(w *Weights, l int) **Tensor { return &w.block(l).OutB }, RoleDense, G*OL, E)
	if ratio != 0 {
		w := uint64(c.compressorWidth(r))
		add(l, p+"attn_compressor_ape.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Compressor.APE }, RoleSmall, w, ratio)
		add(l, p+"attn_compressor_kv.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Compressor.KV }, RoleSmall, E, w)
		add(l, p+"attn_compressor_gate.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Compressor.Gate }, RoleSmall, E, w)
		add(l, p+"attn_compressor_norm.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Compressor.Norm }, RoleVector, HD)
	}
	if ratio == RatioIndexed {
		add(l, p+"indexer.attn_q_b.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Indexer.QB }, RoleSmall, QL, IH*IHD)
		add(l, p+"indexer.proj.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Indexer.Proj }, RoleSmall, E, IH)
		add(l, p+"indexer_compressor_ape.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Indexer.Compressor.APE }, RoleSmall, 2*IHD, ratio)
		add(l, p+"indexer_compressor_kv.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Indexer.Compressor.KV }, RoleSmall, E, 2*IHD)
		add(l, p+"indexer_compressor_gate.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Indexer.Compressor.Gate }, RoleSmall, E, 2*IHD)
		add(l, p+"indexer_compressor_norm.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Indexer.Compressor.Norm }, RoleVector, IHD)
	}
	add(l, p+"hc_ffn_fn.weight", func(w *Weights, l int) **Tensor { return &w.block(l).HCFFNFn }, RoleSmall, E*HC, mixes)
	add(l, p+"hc_ffn_scale.weight", func(w *Weights, l int) **Tensor { return &w.block(l).HCFFNScale }, RoleVector, 3)
	add(l, p+"hc_ffn_base.weight", func(w *Weights, l int) **Tensor { return &w.block(l).HCFFNBase }, RoleVector, mixes)
	add(l, p+"ffn_norm.weight", func(w *Weights, l int) **Tensor { return &w.block(l).FFNNorm }, RoleVector, E)
	add(l, p+"ffn_gate_inp.weight", func(w *Weights, l int) **Tensor { return &w.block(l).GateInp }, RoleSmall, E, NE)
	if hash {
		add(l, p+"ffn_gate_tid2eid.weight", func(w *Weights, l int) **Tensor { return &w.block(l).Tid2Eid }, RoleTokenMap, uint64(c.ExpertsUsed), V)
	} else {
		add(l, p+"exp_probs_b.bias", func(w *Weights, l int) **Tensor { return &w.block(l).ExpProbsBias }, RoleVector, NE)
		specs[len(specs)-1].Optional = true
	}
	add(l, p+"ffn_gate_exps.weight", func(w *Weights, l int) **Tensor { return &w.block(l).GateExps }, RoleExpertGateUp, E, FF, NE)
	add(l, p+"ffn_up_exps.weight", func(w *Weights, l int) **Tensor { return &w.block(l).UpExps }, RoleExpertGateUp, E, FF, NE)
	add(l, p+"ffn_down_exps.weight", func(w *Weights, l int) **Tensor { return &w.block(l).DownExps }, RoleExpertDown, FF, E, NE)
	add(l, p+"ffn_gate_shexp.weight", func(w *Weights, l int) **Tensor { return &w.block(l).GateShexp }, RoleDense, E, FF)
	add(l, p+"ffn_up_shexp.weight", func(w *Weights, l int) **Tensor { return &w.block(l).UpShexp }, RoleDense, E, FF)
	add(l, p+"ffn_down_shexp.weight", func(w *Weights, l int) **Tensor { return &w.block(l).DownShexp }, RoleDense, FF, E)
	return specs
}

// LayoutError lists every way a file's tensor table differs from the one
// its hyperparameters imply.
type LayoutError struct {
	Problems []string
}

func (e *LayoutError) Error() string {
	const show = 40
	p := e.Problems
	more := ""
	if len(p) > show {
		more = fmt.Sprintf("\n  ... and %d more", len(p)-show)
		p = p[:show]
	}
	return fmt.Sprintf("tensor layout: %d problem(s):\n  %s%s", len(e.Problems), strings.Join(p, "\n  "), more)
}

// ValidateTensors checks every tensor of f against ExpectedTensors(c): that
// each expected tensor is present with the right shape and an allowed type,
// that gate and up experts share a type, and that nothing unexpected is in the
// file. A file may also carry an MTP block (mtp.0.*, MTPTensors), whole. It
// returns a *LayoutError listing all problems, or nil.
func ValidateTensors(c *Config, f *gguf.File) error {
	specs := ExpectedTensors(c)
	blocks := make([]int, c.Layers)
	for l := range blocks {
		blocks[l] = l
	}
	if HasMTP(f) {
		if err := c.checkMTP(); err != nil {
			return &LayoutError{Problems: []string{err.Error()}}
		}
		specs = append(specs, MTPTensors(c)...)
		blocks = append(blocks, c.Layers)
	}
	return validateSpecs(c, f, specs, blocks, false)
}

// validateSpecs checks f's tensor table against specs (blocks: the block
// indices whose expert types must agree); mtpFile names the file in the
// messages as a separate MTP file.
func validateSpecs(c *Config, f *gguf.File, specs []TensorSpec, blocks []int, mtpFile bool) error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	known := make(map[string]bool, len(specs))
	for _, sp := range specs {
		known[sp.Name] = true
		t, ok := f.Tensor(sp.Name)
		if !ok {
			if !sp.Optional {
				bad("%s: missing (want %s)", sp.Name, dimsString(sp.Dims))
			}
			continue
		}
		if !slices.Equal(t.Dims, sp.Dims) {
			bad("%s: shape %s, want %s", sp.Name, dimsString(t.Dims), dimsString(sp.Dims))
		}
		if allowed := sp.Role.Allowed(); !slices.Contains(allowed, t.Type) {
			bad("%s: type %v, want one of %v", sp.Name, t.Type, allowed)
		}
	}
	for _, l := range blocks {
		p := LayerPrefix(l)
		if l == c.Layers {
			p = MTPPrefix
		}
		g, ok1 := f.Tensor(p + "ffn_gate_exps.weight")
		u, ok2 := f.Tensor(p + "ffn_up_exps.weight")
		if ok1 && ok2 && g.Type != u.Type {
			bad("%sffn_gate_exps/ffn_up_exps: types %v and %v differ", p, g.Type, u.Type)
		}
	}
	for i := range f.Tensors {
		n := f.Tensors[i].Name
		if mtpFile && !strings.HasPrefix(n, MTPPrefix) {
			continue // (the model's own tensors come from its file)
		}
		if !known[n] {
			bad("%s: unexpected tensor (%s %v)", n, f.Tensors[i].ShapeString(), f.Tensors[i].Type)
		}
	}
	if len(errs) > 0 {
		if mtpFile {
			errs = prefixEach("MTP file: ", errs)
		}
		return &LayoutError{Problems: errs}
	}
	return nil
}

func dimsString(d []uint64) string {
	parts := make([]string, len(d))
	for i, x := range d {
		parts[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
