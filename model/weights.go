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

	// MTP is the multi-token-prediction block, when the file carries one
	// or a separate MTP file was loaded (LoadMTP); nil otherwise.
	MTP *MTP
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
	if HasMTP(f) {
		if err := BindMTP(w, GGUFSource{f}); err != nil {
			return nil, err
		}
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
// (ValidateTensors); it only checks presence. The tensors bound are exactly
// those of ExpectedTensors(c).
func Bind(c *Config, src TensorSource) (*Weights, error) {
	w := &Weights{Config: *c}
	w.Layers = make([]Layer, c.Layers)
	for l := range w.Layers {
		ly := &w.Layers[l]
		ly.Index, ly.Ratio, ly.Hash = l, c.Ratio(l), c.IsHashLayer(l)
		if ly.Ratio != 0 {
			ly.Compressor = &Compressor{}
		}
		if ly.Ratio == RatioIndexed {
			ly.Indexer = &Indexer{}
		}
	}
	if missing := bindSpecs(w, src, ExpectedTensors(c)); len(missing) > 0 {
		return nil, &LayoutError{Problems: prefixEach("missing tensor ", missing)}
	}
	w.Scheme = detectScheme(w)
	return w, nil
}

// bindSpecs stores each tensor of specs that src has in its slot of w and
// returns the names of the required ones it lacks.
func bindSpecs(w *Weights, src TensorSource, specs []TensorSpec) (missing []string) {
	for _, sp := range specs {
		t, ok := src.Lookup(sp.Name)
		if !ok {
			if !sp.Optional {
				missing = append(missing, sp.Name)
			}
			continue
		}
		*sp.slot(w, sp.Layer) = t
	}
	return missing
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

// Tensors lists every tensor bound to the model, each once: the slots
// Bind fills (ExpectedTensors), then BindMTP's (MTPTensors) when the model
// has an MTP block; absent optional tensors left out.
func (w *Weights) Tensors() []*Tensor {
	specs := ExpectedTensors(&w.Config)
	if w.MTP != nil {
		specs = append(specs, MTPTensors(&w.Config)...)
	}
	var ts []*Tensor
	for _, sp := range specs {
		if t := *sp.slot(w, sp.Layer); t != nil {
			ts = append(ts, t)
		}
	}
	return ts
}

// Bytes is the size of every bound tensor's data (Tensors): what a
// backend that keeps the whole model resident must hold.
func (w *Weights) Bytes() int64 {
	var n int64
	for _, t := range w.Tensors() {
		n += int64(len(t.Data))
	}
	return n
}
