// Package model describes a DeepSeek V4 model as a DS4 GGUF file carries it:
// the hyperparameters read from the file's metadata (Config), the tensor table
// those hyperparameters imply (ExpectedTensors), the check of a file against
// that table (ValidateTensors), the binding of the tensors to typed per-layer
// views (Bind) and the tokenizer vocabulary stored in the file (VocabFromGGUF).
//
// Nothing here is fixed to Flash's sizes: Flash's values are the defaults of
// the few optional keys and the reference a loaded file is compared against
// (Config.DiffFromFlash), and a smaller or larger file of the same family
// loads as long as it is internally consistent (Config.Validate).
//
// The key names, their types and the tensor names, shapes and types follow
// what antirez/ds4's loader (ds4.c: config_validate_model, weights_bind,
// weights_validate_layout) reads and checks; docs/gguf-layout.md lists them.
package model

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"ds4go/gguf"
)

// Architecture is the general.architecture value of a DS4 GGUF file and the
// prefix of its hyperparameter keys.
const Architecture = "deepseek4"

// Compression ratios a DS4 attention layer may have: 0 is plain sliding-window
// attention, 4 adds overlapping compressed rows chosen by the top-k indexer,
// 128 adds non-overlapping compressed rows that are all attended.
const (
	RatioNone    = 0
	RatioIndexed = 4
	RatioDense   = 128
)

// Config holds the hyperparameters of a DeepSeek V4 model.
type Config struct {
	Layers     int // transformer blocks (block_count)
	Embed      int // hidden size (embedding_length)
	Vocab      int // vocabulary size
	ContextLen int // maximum context (context_length; informative)

	Heads     int // query heads
	HeadsKV   int // key/value heads: 1, DS4 attention is MQA
	HeadDim   int // key (and value) width per head
	RopeDim   int // rotated dimensions, the last RopeDim of each head
	QLoraRank int // rank of the query LoRA
	OLoraRank int // rank of each output-projection group
	OGroups   int // output-projection groups
	Window    int // sliding-window length of the raw KV ring

	Experts          int // routed experts
	ExpertsUsed      int // experts chosen per token
	ExpertFF         int // routed and shared expert intermediate size
	SharedExperts    int // shared experts (1)
	HashLayers       int // first layers that route by token id (tid2eid)
	ExpertGroups     int // routing groups (0: none)
	ExpertGroupsUsed int // routing groups used (0: none)

	IndexerHeads   int // heads of the ratio-4 indexer
	IndexerHeadDim int // width of the indexer's heads and compressed rows
	IndexerTopK    int // compressed rows the indexer keeps

	HC            int     // hyper-connection streams
	SinkhornIters int     // Sinkhorn normalisation iterations
	HCEps         float32 // hyper-connection epsilon
	NormEps       float32 // RMSNorm epsilon

	RopeBase         float32 // RoPE base of uncompressed layers
	CompressRopeBase float32 // RoPE base of compressed layers
	RopeScale        float32 // YaRN factor (applied on compressed layers)
	YarnBetaFast     float32
	YarnBetaSlow     float32
	RopeOrigCtx      int // YaRN original context length

	CompressRatios     []int     // per layer (may be longer than Layers: MTP entries)
	SwigluClamp        []float32 // per layer SwiGLU clamp
	ExpertWeightsScale float32   // routed weights are multiplied by this
	ExpertWeightsNorm  bool      // routed weights are renormalised to sum 1
}

// Flash returns the hyperparameters of DeepSeek V4 Flash.
func Flash() Config {
	c := Config{
		Layers: 43, Embed: 4096, Vocab: 129280, ContextLen: 1048576,
		Heads: 64, HeadsKV: 1, HeadDim: 512, RopeDim: 64,
		QLoraRank: 1024, OLoraRank: 1024, OGroups: 8, Window: 128,
		Experts: 256, ExpertsUsed: 6, ExpertFF: 2048, SharedExperts: 1, HashLayers: 3,
		IndexerHeads: 64, IndexerHeadDim: 128, IndexerTopK: 512,
		HC: 4, SinkhornIters: 20, HCEps: 1e-6, NormEps: 1e-6,
		RopeBase: 10000, CompressRopeBase: 160000, RopeScale: 16,
		YarnBetaFast: 32, YarnBetaSlow: 1, RopeOrigCtx: 65536,
		ExpertWeightsScale: 1.5, ExpertWeightsNorm: true,
	}
	c.CompressRatios = FlashRatios(c.Layers)
	c.SwigluClamp = make([]float32, c.Layers)
	for i := range c.SwigluClamp {
		c.SwigluClamp[i] = 10
	}
	return c
}

// FlashRatios returns Flash's per-layer compression pattern for n layers:
// layers 0 and 1 uncompressed, then ratio 4 on even and 128 on odd layers.
func FlashRatios(n int) []int {
	r := make([]int, n)
	for i := range r {
		switch {
		case i < 2:
			r[i] = RatioNone
		case i%2 == 0:
			r[i] = RatioIndexed
		default:
			r[i] = RatioDense
		}
	}
	return r
}

// Ratio returns the compression ratio of block l: a layer's, or for the
// MTP block (l = Layers) its entry after the layers' (0 when the list has
// none).
func (c *Config) Ratio(l int) int {
	if l < len(c.CompressRatios) {
		return c.CompressRatios[l]
	}
	return RatioNone
}

// IsHashLayer reports whether layer l routes experts by token id.
func (c *Config) IsHashLayer(l int) bool { return l < c.HashLayers }

// NoPEDim is the width of each head that is not rotated.
func (c *Config) NoPEDim() int { return c.HeadDim - c.RopeDim }

// HCMixes is the number of hyper-connection mixing coefficients per token:
// HC pre weights, HC post weights and an HC×HC combination matrix.
func (c *Config) HCMixes() int { return 2*c.HC + c.HC*c.HC }

// CompressorWidth is the width of a layer's attention compressor projections:
// ratio-4 layers pool overlapping windows and project to twice the head width.
func (c *Config) CompressorWidth(l int) int { return c.compressorWidth(c.Ratio(l)) }

func (c *Config) compressorWidth(ratio int) int {
	if ratio == RatioIndexed {
		return 2 * c.HeadDim
	}
	return c.HeadDim
}

// Metadata keys of a DS4 GGUF file.
const (
	KeyBlockCount         = Architecture + ".block_count"
	KeyEmbeddingLength    = Architecture + ".embedding_length"
	KeyVocabSize          = Architecture + ".vocab_size"
	KeyContextLength      = Architecture + ".context_length"
	KeyHeadCount          = Architecture + ".attention.head_count"
	KeyHeadCountKV        = Architecture + ".attention.head_count_kv"
	KeyKeyLength          = Architecture + ".attention.key_length"
	KeyValueLength        = Architecture + ".attention.value_length"
	KeyRopeDim            = Architecture + ".rope.dimension_count"
	KeyQLoraRank          = Architecture + ".attention.q_lora_rank"
	KeyOLoraRank          = Architecture + ".attention.output_lora_rank"
	KeyOGroups            = Architecture + ".attention.output_group_count"
	KeyExpertCount        = Architecture + ".expert_count"
	KeyExpertUsedCount    = Architecture + ".expert_used_count"
	KeyExpertFF           = Architecture + ".expert_feed_forward_length"
	KeyExpertSharedCount  = Architecture + ".expert_shared_count"
	KeyHashLayerCount     = Architecture + ".hash_layer_count"
	KeyExpertGroupCount   = Architecture + ".expert_group_count"
	KeyExpertGroupUsed    = Architecture + ".expert_group_used_count"
	KeySlidingWindow      = Architecture + ".attention.sliding_window"
	KeyIndexerHeads       = Architecture + ".attention.indexer.head_count"
	KeyIndexerKeyLength   = Architecture + ".attention.indexer.key_length"
	KeyIndexerTopK        = Architecture + ".attention.indexer.top_k"
	KeyHCCount            = Architecture + ".hyper_connection.count"
	KeyHCSinkhornIters    = Architecture + ".hyper_connection.sinkhorn_iterations"
	KeyHCEpsilon          = Architecture + ".hyper_connection.epsilon"
	KeyNormEpsilon        = Architecture + ".attention.layer_norm_rms_epsilon"
	KeyRopeFreqBase       = Architecture + ".rope.freq_base"
	KeyRopeScalingFactor  = Architecture + ".rope.scaling.factor"
	KeyYarnBetaFast       = Architecture + ".rope.scaling.yarn_beta_fast"
	KeyYarnBetaSlow       = Architecture + ".rope.scaling.yarn_beta_slow"
	KeyRopeOrigCtx        = Architecture + ".rope.scaling.original_context_length"
	KeyCompressRopeBase   = Architecture + ".attention.compress_rope_freq_base"
	KeyCompressRatios     = Architecture + ".attention.compress_ratios"
	KeySwigluClamp        = Architecture + ".swiglu_clamp_exp"
	KeyExpertWeightsScale = Architecture + ".expert_weights_scale"
	KeyExpertWeightsNorm  = Architecture + ".expert_weights_norm"
)

// intField and floatField describe one scalar hyperparameter and where it
// lives in Config, so reading, writing and diffing share one table.
type intField struct {
	key      string
	ptr      func(*Config) *int
	optional bool
}

type floatField struct {
	key string
	ptr func(*Config) *float32
}

var intFields = []intField{
	{KeyBlockCount, func(c *Config) *int { return &c.Layers }, false},
	{KeyEmbeddingLength, func(c *Config) *int { return &c.Embed }, false},
	{KeyVocabSize, func(c *Config) *int { return &c.Vocab }, false},
	{KeyContextLength, func(c *Config) *int { return &c.ContextLen }, true},
	{KeyHeadCount, func(c *Config) *int { return &c.Heads }, false},
	{KeyHeadCountKV, func(c *Config) *int { return &c.HeadsKV }, false},
	{KeyKeyLength, func(c *Config) *int { return &c.HeadDim }, false},
	{KeyRopeDim, func(c *Config) *int { return &c.RopeDim }, false},
	{KeyQLoraRank, func(c *Config) *int { return &c.QLoraRank }, false},
	{KeyOLoraRank, func(c *Config) *int { return &c.OLoraRank }, false},
	{KeyOGroups, func(c *Config) *int { return &c.OGroups }, false},
	{KeyExpertCount, func(c *Config) *int { return &c.Experts }, false},
	{KeyExpertUsedCount, func(c *Config) *int { return &c.ExpertsUsed }, false},
	{KeyExpertFF, func(c *Config) *int { return &c.ExpertFF }, false},
	{KeyExpertSharedCount, func(c *Config) *int { return &c.SharedExperts }, false},
	{KeyHashLayerCount, func(c *Config) *int { return &c.HashLayers }, false},
	{KeyExpertGroupCount, func(c *Config) *int { return &c.ExpertGroups }, true},
	{KeyExpertGroupUsed, func(c *Config) *int { return &c.ExpertGroupsUsed }, true},
	{KeySlidingWindow, func(c *Config) *int { return &c.Window }, false},
	{KeyIndexerHeads, func(c *Config) *int { return &c.IndexerHeads }, false},
	{KeyIndexerKeyLength, func(c *Config) *int { return &c.IndexerHeadDim }, false},
	{KeyIndexerTopK, func(c *Config) *int { return &c.IndexerTopK }, false},
	{KeyHCCount, func(c *Config) *int { return &c.HC }, false},
	{KeyHCSinkhornIters, func(c *Config) *int { return &c.SinkhornIters }, false},
	{KeyRopeOrigCtx, func(c *Config) *int { return &c.RopeOrigCtx }, false},
}

var floatFields = []floatField{
	{KeyHCEpsilon, func(c *Config) *float32 { return &c.HCEps }},
	{KeyNormEpsilon, func(c *Config) *float32 { return &c.NormEps }},
	{KeyRopeFreqBase, func(c *Config) *float32 { return &c.RopeBase }},
	{KeyRopeScalingFactor, func(c *Config) *float32 { return &c.RopeScale }},
	{KeyYarnBetaFast, func(c *Config) *float32 { return &c.YarnBetaFast }},
	{KeyYarnBetaSlow, func(c *Config) *float32 { return &c.YarnBetaSlow }},
	{KeyCompressRopeBase, func(c *Config) *float32 { return &c.CompressRopeBase }},
	{KeyExpertWeightsScale, func(c *Config) *float32 { return &c.ExpertWeightsScale }},
}

// maxDim bounds every size hyperparameter, so that products of a few of them
// cannot overflow and a hostile file cannot ask for absurd allocations.
const maxDim = 1 << 24

// ConfigFromGGUF reads the hyperparameters from a DS4 GGUF file's metadata
// and validates them (Validate). Every missing or malformed key is reported in
// the one returned error.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	var c Config
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }

	if v, ok := f.KV("general.architecture"); !ok {
		return c, fmt.Errorf("%w: general.architecture is missing", ErrNotDS4)
	} else if s, err := v.AsString(); err != nil || s != Architecture {
		return c, fmt.Errorf("%w: general.architecture is %s", ErrNotDS4, v.Format(4))
	}
	for _, fl := range intFields {
		v, ok := f.KV(fl.key)
		if !ok {
			if !fl.optional {
				bad("%s: missing", fl.key)
			} else if fl.key == KeyContextLength {
				*fl.ptr(&c) = Flash().ContextLen
			}
			continue
		}
		n, err := v.AsUint64()
		if v.Type == gguf.TypeBool || err != nil || n > maxDim {
			bad("%s: got %s, want an unsigned integer ≤ %d", fl.key, v.Format(4), maxDim)
			continue
		}
		*fl.ptr(&c) = int(n)
	}
	// value_length must exist and equal key_length: DS4 stores one KV row
	// per token that serves as both key and value.
	if v, ok := f.KV(KeyValueLength); !ok {
		bad("%s: missing", KeyValueLength)
	} else if n, err := v.AsUint64(); err != nil || int(n) != c.HeadDim {
		bad("%s: got %s, want %d (= key_length)", KeyValueLength, v.Format(4), c.HeadDim)
	}
	for _, fl := range floatFields {
		v, ok := f.KV(fl.key)
		if !ok {
			bad("%s: missing", fl.key)
			continue
		}
		x, err := v.AsFloat64()
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			bad("%s: got %s, want a finite number", fl.key, v.Format(4))
			continue
		}
		*fl.ptr(&c) = float32(x)
	}
	if v, ok := f.KV(KeyExpertWeightsNorm); !ok {
		bad("%s: missing", KeyExpertWeightsNorm)
	} else if b, err := v.AsBool(); err != nil {
		bad("%s: got %s, want a bool", KeyExpertWeightsNorm, v.Format(4))
	} else {
		c.ExpertWeightsNorm = b
	}
	if v, ok := f.KV(KeyCompressRatios); !ok {
		bad("%s: missing", KeyCompressRatios)
	} else if rs, err := v.AsInt32s(); err != nil {
		bad("%s: got %s, want an array of integers", KeyCompressRatios, v.Format(4))
	} else {
		c.CompressRatios = make([]int, len(rs))
		for i, r := range rs {
			c.CompressRatios[i] = int(r)
		}
	}
	if v, ok := f.KV(KeySwigluClamp); !ok {
		bad("%s: missing", KeySwigluClamp)
	} else if xs, err := v.AsFloat32s(); err != nil {
		bad("%s: got %s, want an array of floats", KeySwigluClamp, v.Format(4))
	} else {
		c.SwigluClamp = xs
	}
	if len(errs) > 0 {
		return c, &MetadataError{Problems: errs}
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// MetadataError lists everything wrong with a file's hyperparameters.
type MetadataError struct {
	Problems []string
}

func (e *MetadataError) Error() string {
	return fmt.Sprintf("model metadata: %d problem(s):\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// Validate checks that the hyperparameters describe a consistent model of
// the DeepSeek V4 family, returning a *MetadataError listing every problem.
func (c *Config) Validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	positive := []struct {
		name string
		v    int
	}{
		{"block_count", c.Layers}, {"embedding_length", c.Embed}, {"vocab_size", c.Vocab},
		{"head_count", c.Heads}, {"key_length", c.HeadDim}, {"rope.dimension_count", c.RopeDim},
		{"q_lora_rank", c.QLoraRank}, {"output_lora_rank", c.OLoraRank},
		{"output_group_count", c.OGroups}, {"expert_count", c.Experts},
		{"expert_used_count", c.ExpertsUsed}, {"expert_feed_forward_length", c.ExpertFF},
		{"sliding_window", c.Window}, {"hyper_connection.count", c.HC},
		{"hyper_connection.sinkhorn_iterations", c.SinkhornIters},
		{"rope.scaling.original_context_length", c.RopeOrigCtx},
	}
	for _, p := range positive {
		if p.v <= 0 || p.v > maxDim {
			bad("%s = %d: must be in 1..%d", p.name, p.v, maxDim)
		}
	}
	if len(errs) > 0 {
		return &MetadataError{Problems: errs}
	}
	if c.HeadsKV != 1 {
		bad("head_count_kv = %d: DS4 attention has one shared KV head", c.HeadsKV)
	}
	if c.RopeDim%2 != 0 || c.RopeDim > c.HeadDim {
		bad("rope.dimension_count = %d: must be even and ≤ key_length %d", c.RopeDim, c.HeadDim)
	}
	if c.Heads%c.OGroups != 0 {
		bad("head_count %d is not a multiple of output_group_count %d", c.Heads, c.OGroups)
	}
	if c.ExpertsUsed > c.Experts {
		bad("expert_used_count %d > expert_count %d", c.ExpertsUsed, c.Experts)
	}
	if c.SharedExperts != 1 {
		bad("expert_shared_count = %d: DS4 has exactly one shared expert", c.SharedExperts)
	}
	if c.HashLayers < 0 || c.HashLayers > c.Layers {
		bad("hash_layer_count %d outside 0..block_count %d", c.HashLayers, c.Layers)
	}
	if c.ExpertGroups > 1 || c.ExpertGroupsUsed > 1 {
		bad("expert_group_count %d / expert_group_used_count %d: grouped routing is not part of DS4", c.ExpertGroups, c.ExpertGroupsUsed)
	}
	if len(c.CompressRatios) < c.Layers {
		bad("compress_ratios has %d entries, need ≥ block_count %d", len(c.CompressRatios), c.Layers)
	} else {
		indexed := false
		for l := 0; l < c.Layers; l++ {
			switch r := c.CompressRatios[l]; r {
			case RatioNone, RatioDense:
			case RatioIndexed:
				indexed = true
			default:
				bad("compress_ratios[%d] = %d: must be 0, 4 or 128", l, r)
			}
		}
		if indexed {
			if c.IndexerHeads <= 0 || c.IndexerHeadDim <= 0 || c.IndexerTopK <= 0 ||
				c.IndexerHeads > maxDim || c.IndexerHeadDim > maxDim || c.IndexerTopK > maxDim {
				bad("indexer head_count %d / key_length %d / top_k %d: must be positive with ratio-4 layers",
					c.IndexerHeads, c.IndexerHeadDim, c.IndexerTopK)
			} else if c.IndexerHeadDim < c.RopeDim || c.IndexerHeadDim%2 != 0 {
				bad("indexer key_length %d: must be even and ≥ rope.dimension_count %d", c.IndexerHeadDim, c.RopeDim)
			}
		}
	}
	if len(c.SwigluClamp) < c.Layers {
		bad("swiglu_clamp_exp has %d entries, need ≥ block_count %d", len(c.SwigluClamp), c.Layers)
	} else {
		for l := 0; l < c.Layers; l++ {
			if x := c.SwigluClamp[l]; !(x >= 0) || math.IsInf(float64(x), 0) {
				bad("swiglu_clamp_exp[%d] = %g: must be finite and ≥ 0", l, x)
			}
		}
	}
	for _, f := range []struct {
		name string
		v    float32
	}{{"hyper_connection.epsilon", c.HCEps}, {"layer_norm_rms_epsilon", c.NormEps},
		{"rope.freq_base", c.RopeBase}, {"compress_rope_freq_base", c.CompressRopeBase},
		{"rope.scaling.factor", c.RopeScale}, {"expert_weights_scale", c.ExpertWeightsScale}} {
		if !(f.v > 0) {
			bad("%s = %g: must be > 0", f.name, f.v)
		}
	}
	if len(errs) > 0 {
		return &MetadataError{Problems: errs}
	}
	return nil
}

// DiffFromFlash lists the hyperparameters that differ from DeepSeek V4
// Flash's, as "key: got X, Flash has Y" lines; empty for a Flash file.
func (c *Config) DiffFromFlash() []string {
	fl := Flash()
	var d []string
	for _, f := range intFields {
		if a, b := *f.ptr(c), *f.ptr(&fl); a != b {
			d = append(d, fmt.Sprintf("%s: got %d, Flash has %d", f.key, a, b))
		}
	}
	for _, f := range floatFields {
		if a, b := *f.ptr(c), *f.ptr(&fl); !closeRel(a, b) {
			d = append(d, fmt.Sprintf("%s: got %g, Flash has %g", f.key, a, b))
		}
	}
	if c.ExpertWeightsNorm != fl.ExpertWeightsNorm {
		d = append(d, fmt.Sprintf("%s: got %v, Flash has %v", KeyExpertWeightsNorm, c.ExpertWeightsNorm, fl.ExpertWeightsNorm))
	}
	if c.Layers == fl.Layers {
		for l := 0; l < c.Layers && l < len(c.CompressRatios); l++ {
			if c.CompressRatios[l] != fl.CompressRatios[l] {
				d = append(d, fmt.Sprintf("%s[%d]: got %d, Flash has %d", KeyCompressRatios, l, c.CompressRatios[l], fl.CompressRatios[l]))
			}
		}
	}
	return d
}

func closeRel(a, b float32) bool {
	return math.Abs(float64(a)-float64(b)) <= 1e-6*math.Max(math.Abs(float64(a)), math.Abs(float64(b)))
}

// Metadata returns the hyperparameter keys of c as GGUF key/value pairs
// (general.architecture first), the form a DS4 GGUF file carries them in.
func (c *Config) Metadata() []gguf.KV {
	kvs := []gguf.KV{{Key: "general.architecture", Value: gguf.Str(Architecture)}}
	for _, f := range intFields {
		v := *f.ptr(c)
		if f.optional && v == 0 {
			continue
		}
		if f.key == KeyRopeOrigCtx {
			kvs = append(kvs, gguf.KV{Key: f.key, Value: gguf.U64(uint64(v))})
			continue
		}
		kvs = append(kvs, gguf.KV{Key: f.key, Value: gguf.U32(uint32(v))})
		if f.key == KeyKeyLength {
			kvs = append(kvs, gguf.KV{Key: KeyValueLength, Value: gguf.U32(uint32(v))})
		}
	}
	for _, f := range floatFields {
		kvs = append(kvs, gguf.KV{Key: f.key, Value: gguf.F32(*f.ptr(c))})
	}
	kvs = append(kvs, gguf.KV{Key: KeyExpertWeightsNorm, Value: gguf.Bool(c.ExpertWeightsNorm)})
	rs := make([]uint32, len(c.CompressRatios))
	for i, r := range c.CompressRatios {
		rs[i] = uint32(r)
	}
	kvs = append(kvs, gguf.KV{Key: KeyCompressRatios, Value: gguf.U32Array(rs)})
	kvs = append(kvs, gguf.KV{Key: KeySwigluClamp, Value: gguf.F32Array(c.SwigluClamp)})
	return kvs
}

// ErrNotDS4 is returned (wrapped) for a GGUF file of another architecture.
var ErrNotDS4 = errors.New("not a DeepSeek V4 (deepseek4) GGUF file")
