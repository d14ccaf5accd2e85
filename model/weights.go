package model

import (
	"encoding/binary"
	"fmt"

	"ds4go/gguf"
	"ds4go/quant"
)

// Tensor is a bound weight: its name, storage type, shape and bytes (a view
// into the mapped file, or any buffer for weights built in memory).
type Tensor struct {
	Name string
	Type quant.Type
	Dims []uint64 // Dims[0] is the row length
	Data []byte
}

// Rows returns the number of rows (the product of Dims[1:]).
func (t *Tensor) Rows() int {
	n := 1
	for _, d := range t.Dims[1:] {
		n *= int(d)
	}
	return n
}

// RowLen returns the number of elements per row (Dims[0]).
func (t *Tensor) RowLen() int { return int(t.Dims[0]) }

// RowBytes returns the bytes of one row.
// The tensor's row length was checked against its block size when the file
// was parsed, so the size is always defined.
func (t *Tensor) RowBytes() int {
	n, _ := t.Type.RowBytes(int64(t.Dims[0]))
	return int(n)
}

// Row returns the bytes of row i.
func (t *Tensor) Row(i int) []byte {
	rb := t.RowBytes()
	return t.Data[i*rb : (i+1)*rb]
}

// Compressor holds one KV compressor: the projections of the values and the
// pooling scores, the positional bias added to the scores, and the RMSNorm of
// the pooled row.
type Compressor struct {
	APE, KV, Gate, Norm *Tensor
}

// Indexer holds the ratio-4 layers' top-k indexer: its query projection from
// the query LoRA, the per-head weight projection and its own compressor.
type Indexer struct {
	QB, Proj   *Tensor
	Compressor Compressor
}

// Layer holds the weights of one transformer block.
type Layer struct {
	Index int
	Ratio int // compression ratio: 0, 4 or 128
	Hash  bool

	HCAttnFn, HCAttnScale, HCAttnBase *Tensor
	AttnNorm                          *Tensor
	QA, QANorm, QB                    *Tensor
	KV, KVNorm                        *Tensor
	Sinks                             *Tensor
	OutA, OutB                        *Tensor
	Compressor                        *Compressor // nil when Ratio == 0
	Indexer                           *Indexer    // nil unless Ratio == 4

	HCFFNFn, HCFFNScale, HCFFNBase *Tensor
	FFNNorm                        *Tensor
	GateInp                        *Tensor
	ExpProbsBias                   *Tensor // nil on hash layers (and when absent)
	Tid2Eid                        *Tensor // non-nil on hash layers only
	GateExps, UpExps, DownExps     *Tensor
	GateShexp, UpShexp, DownShexp  *Tensor
}

// Weights holds a whole model's weights bound to its hyperparameters.
type Weights struct {
	Config Config
	Scheme string // e.g. "q2", "q4", "f32", or "mixed"

	TokenEmbd    *Tensor
	Layers       []Layer
	OutputHCBase *Tensor
	OutputHCFn   *Tensor
	OutputHCScal *Tensor
	OutputNorm   *Tensor
	Output       *Tensor
}

// TensorSource hands out tensors by name; *gguf.File implements it through
// GGUFSource.
type TensorSource interface {
	Lookup(name string) (*Tensor, bool)
}

// GGUFSource binds tensors to a GGUF file's mapped bytes.
type GGUFSource struct{ File *gguf.File }

// Lookup returns the named tensor as a zero-copy view.
func (s GGUFSource) Lookup(name string) (*Tensor, bool) {
	t, ok := s.File.Tensor(name)
	if !ok {
		return nil, false
	}
	return &Tensor{Name: t.Name, Type: t.Type, Dims: t.Dims, Data: s.File.TensorData(t)}, true
}

// Load reads the hyperparameters of a DS4 GGUF file, validates its tensor
// table and binds its weights.
func Load(f *gguf.File) (*Weights, error) {
	cfg, err := ConfigFromGGUF(f)
	if err != nil {
		return nil, err
	}
	if err := ValidateTensors(&cfg, f); err != nil {
		return nil, err
	}
	w, err := Bind(&cfg, GGUFSource{f})
	if err != nil {
		return nil, err
	}
	if err := CheckTokenMaps(w); err != nil {
		return nil, err
	}
	return w, nil
}

// CheckTokenMaps checks that every hash-routing table entry names an
// existing expert, so that a corrupt file cannot make the engine index out of
// range. It reads the tables (ExpertsUsed × Vocab int32 per hash layer).
func CheckTokenMaps(w *Weights) error {
	ne := uint32(w.Config.Experts)
	for l := range w.Layers {
		t := w.Layers[l].Tid2Eid
		if t == nil {
			continue
		}
		d := t.Data
		for i := 0; i+4 <= len(d); i += 4 {
			if e := binary.LittleEndian.Uint32(d[i:]); e >= ne {
				return fmt.Errorf("%s: entry %d (token %d) is expert %d, want < %d",
					t.Name, i/4, i/4/int(t.Dims[0]), int32(e), ne)
			}
		}
	}
	return nil
}

// Bind builds Weights from a source whose tensors have already been validated
// (ValidateTensors); it only checks presence.
func Bind(c *Config, src TensorSource) (*Weights, error) {
	var missing []string
	get := func(name string, optional bool) *Tensor {
		t, ok := src.Lookup(name)
		if !ok {
			if !optional {
				missing = append(missing, name)
			}
			return nil
		}
		return t
	}
	w := &Weights{Config: *c}
	w.TokenEmbd = get("token_embd.weight", false)
	w.Layers = make([]Layer, c.Layers)
	for l := range w.Layers {
		p := LayerPrefix(l)
		ly := &w.Layers[l]
		ly.Index, ly.Ratio, ly.Hash = l, c.Ratio(l), c.IsHashLayer(l)
		ly.HCAttnFn = get(p+"hc_attn_fn.weight", false)
		ly.HCAttnScale = get(p+"hc_attn_scale.weight", false)
		ly.HCAttnBase = get(p+"hc_attn_base.weight", false)
		ly.AttnNorm = get(p+"attn_norm.weight", false)
		ly.QA = get(p+"attn_q_a.weight", false)
		ly.QANorm = get(p+"attn_q_a_norm.weight", false)
		ly.QB = get(p+"attn_q_b.weight", false)
		ly.KV = get(p+"attn_kv.weight", false)
		ly.KVNorm = get(p+"attn_kv_a_norm.weight", false)
		ly.Sinks = get(p+"attn_sinks.weight", false)
		ly.OutA = get(p+"attn_output_a.weight", false)
		ly.OutB = get(p+"attn_output_b.weight", false)
		if ly.Ratio != 0 {
			ly.Compressor = &Compressor{
				APE:  get(p+"attn_compressor_ape.weight", false),
				KV:   get(p+"attn_compressor_kv.weight", false),
				Gate: get(p+"attn_compressor_gate.weight", false),
				Norm: get(p+"attn_compressor_norm.weight", false),
			}
		}
		if ly.Ratio == RatioIndexed {
			ly.Indexer = &Indexer{
				QB:   get(p+"indexer.attn_q_b.weight", false),
				Proj: get(p+"indexer.proj.weight", false),
				Compressor: Compressor{
					APE:  get(p+"indexer_compressor_ape.weight", false),
					KV:   get(p+"indexer_compressor_kv.weight", false),
					Gate: get(p+"indexer_compressor_gate.weight", false),
					Norm: get(p+"indexer_compressor_norm.weight", false),
				},
			}
		}
		ly.HCFFNFn = get(p+"hc_ffn_fn.weight", false)
		ly.HCFFNScale = get(p+"hc_ffn_scale.weight", false)
		ly.HCFFNBase = get(p+"hc_ffn_base.weight", false)
		ly.FFNNorm = get(p+"ffn_norm.weight", false)
		ly.GateInp = get(p+"ffn_gate_inp.weight", false)
		if ly.Hash {
			ly.Tid2Eid = get(p+"ffn_gate_tid2eid.weight", false)
		} else {
			ly.ExpProbsBias = get(p+"exp_probs_b.bias", true)
		}
		ly.GateExps = get(p+"ffn_gate_exps.weight", false)
		ly.UpExps = get(p+"ffn_up_exps.weight", false)
		ly.DownExps = get(p+"ffn_down_exps.weight", false)
		ly.GateShexp = get(p+"ffn_gate_shexp.weight", false)
		ly.UpShexp = get(p+"ffn_up_shexp.weight", false)
		ly.DownShexp = get(p+"ffn_down_shexp.weight", false)
	}
	w.OutputHCBase = get("output_hc_base.weight", false)
	w.OutputHCFn = get("output_hc_fn.weight", false)
	w.OutputHCScal = get("output_hc_scale.weight", false)
	w.OutputNorm = get("output_norm.weight", false)
	w.Output = get("output.weight", false)
	if len(missing) > 0 {
		return nil, &LayoutError{Problems: prefixEach("missing tensor ", missing)}
	}
	w.Scheme = detectScheme(w)
	return w, nil
}

func prefixEach(p string, xs []string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = p + x
	}
	return out
}

// detectScheme names the storage scheme the weights match, or "mixed".
func detectScheme(w *Weights) string {
	if len(w.Layers) == 0 {
		return "mixed"
	}
	l := &w.Layers[len(w.Layers)-1]
	for _, s := range Schemes {
		if l.QA.Type == s.Dense && w.TokenEmbd.Type == s.Small &&
			l.GateExps.Type == s.ExpertGateUp && l.DownExps.Type == s.ExpertDown {
			return s.Name
		}
	}
	return "mixed"
}

// String summarises the model in one line.
func (w *Weights) String() string {
	c := &w.Config
	return fmt.Sprintf("deepseek4 %s: %d layers, dim %d, %d heads×%d, %d experts (%d used, ff %d), vocab %d",
		w.Scheme, c.Layers, c.Embed, c.Heads, c.HeadDim, c.Experts, c.ExpertsUsed, c.ExpertFF, c.Vocab)
}
