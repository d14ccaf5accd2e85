package model_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
	"ds4go/synth"
	"ds4go/tokenizer"
)

// parse writes a file with the given metadata and tensors (zero data) and
// parses it back.
func parse(t *testing.T, kvs []gguf.KV, tensors []gguf.TensorSpec) *gguf.File {
	t.Helper()
	b := &gguf.Builder{KVs: kvs, Tensors: tensors}
	l, err := b.Layout()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := b.Write(&buf, func(i int) ([]byte, error) { return make([]byte, l.Sizes[i]), nil }); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestConfigRoundTrip(t *testing.T) {
	for name, c := range map[string]model.Config{"flash": model.Flash(), "tiny": synth.Tiny(), "flash2": synth.Flash(2)} {
		t.Run(name, func(t *testing.T) {
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			got, err := model.ConfigFromGGUF(parse(t, c.Metadata(), nil))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, c)
			}
		})
	}
}

func TestFlashMatchesReference(t *testing.T) {
	c := model.Flash()
	if d := c.DiffFromFlash(); len(d) != 0 {
		t.Errorf("Flash differs from itself: %q", d)
	}
	// Facts of /work/shared/reference/ds4-gguf-metadata.md.
	want := map[string]string{
		model.KeyBlockCount: "43", model.KeyEmbeddingLength: "4096", model.KeyVocabSize: "129280",
		model.KeyHeadCount: "64", model.KeyHeadCountKV: "1", model.KeyKeyLength: "512", model.KeyValueLength: "512",
		model.KeyRopeDim: "64", model.KeyQLoraRank: "1024", model.KeyOLoraRank: "1024", model.KeyOGroups: "8",
		model.KeyExpertCount: "256", model.KeyExpertUsedCount: "6", model.KeyExpertFF: "2048",
		model.KeyExpertSharedCount: "1", model.KeyHashLayerCount: "3", model.KeySlidingWindow: "128",
		model.KeyIndexerHeads: "64", model.KeyIndexerKeyLength: "128", model.KeyIndexerTopK: "512",
		model.KeyHCCount: "4", model.KeyHCSinkhornIters: "20", model.KeyHCEpsilon: "1e-06",
		model.KeyNormEpsilon: "1e-06", model.KeyRopeFreqBase: "10000", model.KeyRopeScalingFactor: "16",
		model.KeyYarnBetaFast: "32", model.KeyYarnBetaSlow: "1", model.KeyRopeOrigCtx: "65536",
		model.KeyCompressRopeBase: "160000", model.KeyExpertWeightsScale: "1.5", model.KeyExpertWeightsNorm: "true",
	}
	seen := map[string]bool{}
	for _, kv := range c.Metadata() {
		seen[kv.Key] = true
		if w, ok := want[kv.Key]; ok && kv.Value.Format(0) != w {
			t.Errorf("%s = %s, want %s", kv.Key, kv.Value.Format(0), w)
		}
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("%s missing from Metadata()", k)
		}
	}
	if d := synth.Tiny(); len(d.DiffFromFlash()) == 0 {
		t.Error("Tiny does not differ from Flash")
	}
	tiny := synth.Tiny()
	if d := strings.Join(tiny.DiffFromFlash(), "\n"); !strings.Contains(d, model.KeyBlockCount+": got 6, Flash has 43") {
		t.Errorf("Tiny's differences: %s", d)
	}
	r := model.FlashRatios(43)
	for l, x := range r {
		want := 0
		if l >= 2 {
			want = 128
			if l%2 == 0 {
				want = 4
			}
		}
		if x != want {
			t.Errorf("FlashRatios[%d] = %d, want %d", l, x, want)
		}
	}
}

func TestConfigErrorsListEveryKey(t *testing.T) {
	c := model.Flash()
	drop := map[string]bool{model.KeyEmbeddingLength: true, model.KeyValueLength: true, model.KeyRopeFreqBase: true,
		model.KeyExpertWeightsNorm: true, model.KeySwigluClamp: true}
	replace := map[string]gguf.Value{
		model.KeyBlockCount:         gguf.Str("43"),
		model.KeyHeadCount:          gguf.I32(-64),
		model.KeyCompressRatios:     gguf.StrArray([]string{"0"}),
		model.KeyHCEpsilon:          gguf.Str("tiny"),
		model.KeyExpertWeightsScale: gguf.F32(float32(posInf())),
		model.KeyKeyLength:          gguf.U64(1 << 40),
	}
	var kvs []gguf.KV
	for _, kv := range c.Metadata() {
		if drop[kv.Key] {
			continue
		}
		if v, ok := replace[kv.Key]; ok {
			kv.Value = v
		}
		kvs = append(kvs, kv)
	}
	_, err := model.ConfigFromGGUF(parse(t, kvs, nil))
	var me *model.MetadataError
	if !errors.As(err, &me) {
		t.Fatalf("got %v, want a *MetadataError", err)
	}
	msg := err.Error()
	for k := range drop {
		if !strings.Contains(msg, k+": missing") {
			t.Errorf("missing %s not reported", k)
		}
	}
	for k := range replace {
		if !strings.Contains(msg, k+": got") {
			t.Errorf("malformed %s not reported", k)
		}
	}
	if want := len(drop) + len(replace); len(me.Problems) != want {
		t.Errorf("%d problems, want %d:\n%s", len(me.Problems), want, msg)
	}

	// Optional keys may be absent.
	kvs = kvs[:0]
	for _, kv := range c.Metadata() {
		if kv.Key != model.KeyContextLength && kv.Key != model.KeyExpertGroupCount {
			kvs = append(kvs, kv)
		}
	}
	got, err := model.ConfigFromGGUF(parse(t, kvs, nil))
	if err != nil || got.ContextLen != c.ContextLen {
		t.Errorf("without context_length: %v, context %d", err, got.ContextLen)
	}
	// Another architecture.
	kvs = []gguf.KV{{Key: "general.architecture", Value: gguf.Str("llama")}}
	if _, err := model.ConfigFromGGUF(parse(t, kvs, nil)); !errors.Is(err, model.ErrNotDS4) {
		t.Errorf("llama file: %v", err)
	}
	if _, err := model.ConfigFromGGUF(parse(t, nil, nil)); !errors.Is(err, model.ErrNotDS4) {
		t.Errorf("file without architecture: %v", err)
	}
}

func posInf() float64 { x := 1e308; return x * 10 }

func TestValidateRejects(t *testing.T) {
	cases := []struct {
		name string
		edit func(c *model.Config)
		want string
	}{
		{"zero layers", func(c *model.Config) { c.Layers = 0 }, "block_count = 0"},
		{"huge embed", func(c *model.Config) { c.Embed = 1 << 30 }, "embedding_length"},
		{"kv heads", func(c *model.Config) { c.HeadsKV = 2 }, "head_count_kv"},
		{"odd rope", func(c *model.Config) { c.RopeDim = 63 }, "rope.dimension_count"},
		{"rope > head", func(c *model.Config) { c.RopeDim = 1024 }, "rope.dimension_count"},
		{"groups", func(c *model.Config) { c.OGroups = 7 }, "output_group_count"},
		{"used > experts", func(c *model.Config) { c.ExpertsUsed = 300 }, "expert_used_count"},
		{"shared", func(c *model.Config) { c.SharedExperts = 2 }, "expert_shared_count"},
		{"hash layers", func(c *model.Config) { c.HashLayers = 44 }, "hash_layer_count"},
		{"groups routing", func(c *model.Config) { c.ExpertGroups = 8 }, "expert_group_count"},
		{"short ratios", func(c *model.Config) { c.CompressRatios = c.CompressRatios[:10] }, "compress_ratios has 10 entries"},
		{"bad ratio", func(c *model.Config) { c.CompressRatios[5] = 8 }, "compress_ratios[5] = 8"},
		{"no indexer", func(c *model.Config) { c.IndexerTopK = 0 }, "indexer"},
		{"narrow indexer", func(c *model.Config) { c.IndexerHeadDim = 32 }, "indexer key_length 32"},
		{"short clamp", func(c *model.Config) { c.SwigluClamp = c.SwigluClamp[:3] }, "swiglu_clamp_exp has 3 entries"},
		{"negative clamp", func(c *model.Config) { c.SwigluClamp[0] = -1 }, "swiglu_clamp_exp[0]"},
		{"eps", func(c *model.Config) { c.NormEps = 0 }, "layer_norm_rms_epsilon"},
		{"scale", func(c *model.Config) { c.ExpertWeightsScale = -1 }, "expert_weights_scale"},
	}
	for _, tc := range cases {
		c := model.Flash()
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
	// Several problems are reported together.
	c := model.Flash()
	c.HeadsKV, c.OGroups, c.SharedExperts = 2, 7, 0
	var me *model.MetadataError
	if err := c.Validate(); !errors.As(err, &me) || len(me.Problems) != 3 {
		t.Errorf("three problems: %v", err)
	}
	// Without ratio-4 layers the indexer is not needed.
	c = synth.Flash(2)
	c.IndexerHeads, c.IndexerHeadDim, c.IndexerTopK = 0, 0, 0
	if err := c.Validate(); err != nil {
		t.Errorf("2 uncompressed layers without an indexer: %v", err)
	}
}

func TestExpectedTensorsTiny(t *testing.T) {
	c := synth.Tiny()
	specs := model.ExpectedTensors(&c)
	names := map[string]model.TensorSpec{}
	for _, sp := range specs {
		if _, dup := names[sp.Name]; dup {
			t.Errorf("duplicate %s", sp.Name)
		}
		names[sp.Name] = sp
	}
	has := func(n string) bool { _, ok := names[n]; return ok }
	for l := 0; l < c.Layers; l++ {
		p := model.LayerPrefix(l)
		r := c.Ratio(l)
		if has(p+"attn_compressor_kv.weight") != (r != 0) {
			t.Errorf("layer %d (ratio %d): compressor presence wrong", l, r)
		}
		if has(p+"indexer.proj.weight") != (r == 4) {
			t.Errorf("layer %d (ratio %d): indexer presence wrong", l, r)
		}
		if has(p+"ffn_gate_tid2eid.weight") != (l < c.HashLayers) || has(p+"exp_probs_b.bias") != (l >= c.HashLayers) {
			t.Errorf("layer %d: routing tensors wrong", l)
		}
	}
	if sp := names["blk.2.attn_compressor_ape.weight"]; !slices.Equal(sp.Dims, []uint64{256, 4}) {
		t.Errorf("ratio-4 ape dims %v", sp.Dims)
	}
	if sp := names["blk.3.attn_compressor_ape.weight"]; !slices.Equal(sp.Dims, []uint64{128, 128}) {
		t.Errorf("ratio-128 ape dims %v", sp.Dims)
	}
	if _, err := model.SchemeQ2.Typed(specs); err == nil {
		t.Error("q2 accepted rows of 64 values")
	}
	for _, s := range []model.Scheme{model.SchemeQ8, model.SchemeF16, model.SchemeF32} {
		if _, err := s.Typed(specs); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
}

// validTable types specs with SchemeQ8 and checks that the table, as it
// is, validates for c: the starting point of the tests that edit it.
func validTable(t *testing.T, c *model.Config, specs []model.TensorSpec) []gguf.TensorSpec {
	t.Helper()
	typed, err := model.SchemeQ8.Typed(specs)
	if err != nil {
		t.Fatal(err)
	}
	if err := model.ValidateTensors(c, parse(t, c.Metadata(), typed)); err != nil {
		t.Fatalf("the expected table: %v", err)
	}
	return typed
}

func TestValidateTensorsListsAllProblems(t *testing.T) {
	c := synth.Tiny()
	typed := validTable(t, &c, model.ExpectedTensors(&c))
	var edited []gguf.TensorSpec
	for _, ts := range typed {
		switch ts.Name {
		case "blk.1.attn_q_a.weight":
			continue // missing
		case "blk.2.attn_kv.weight":
			ts.Dims = []uint64{64, 64} // wrong shape
		case "blk.3.attn_norm.weight":
			ts.Type = quant.F16 // not allowed for a vector
		case "blk.4.ffn_up_exps.weight":
			ts.Type = quant.F16 // gate stays Q8_0
		case "blk.4.exp_probs_b.bias":
			continue // optional: no problem
		}
		edited = append(edited, ts)
	}
	edited = append(edited, gguf.TensorSpec{Name: "blk.0.extra.weight", Type: quant.F32, Dims: []uint64{4}})
	err := model.ValidateTensors(&c, parse(t, c.Metadata(), edited))
	var le *model.LayoutError
	if !errors.As(err, &le) {
		t.Fatalf("got %v, want a *LayoutError", err)
	}
	want := []string{
		"blk.1.attn_q_a.weight: missing",
		"blk.2.attn_kv.weight: shape [64, 64], want [64, 128]",
		"blk.3.attn_norm.weight: type F16",
		"blk.4.ffn_gate_exps/ffn_up_exps: types Q8_0 and F16 differ",
		"blk.0.extra.weight: unexpected tensor",
	}
	if len(le.Problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%v", len(le.Problems), len(want), err)
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("problem %q not reported in:\n%s", w, msg)
		}
	}
}

func TestLoadSynthetic(t *testing.T) {
	// A model of neither Flash's nor Tiny's size, in the published q2 and
	// q4 schemes (rows of 256).
	c := synth.Flash(5)
	c.Embed, c.Heads, c.HeadDim, c.QLoraRank, c.OLoraRank, c.OGroups = 256, 4, 128, 128, 64, 2
	c.Experts, c.ExpertsUsed, c.ExpertFF, c.HashLayers, c.Vocab = 16, 3, 256, 2, 600
	c.IndexerHeads, c.IndexerTopK, c.Window = 2, 8, 32
	for _, s := range []model.Scheme{model.SchemeQ2, model.SchemeQ4, model.SchemeQ8} {
		data, err := synth.Build(synth.Options{Config: c, Scheme: s, Seed: 5})
		if err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		w, err := model.Load(f)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if w.Scheme != s.Name || len(w.Layers) != 5 || !reflect.DeepEqual(w.Config, c) {
			t.Errorf("%s: loaded %s", s.Name, w)
		}
		l3 := &w.Layers[3]
		if l3.Ratio != 128 || l3.Compressor == nil || l3.Indexer != nil || l3.Hash || l3.ExpProbsBias == nil {
			t.Errorf("layer 3 bound wrong: %+v", l3)
		}
		l2 := &w.Layers[2]
		if l2.Ratio != 4 || l2.Indexer == nil || l2.Tid2Eid != nil {
			t.Errorf("layer 2 bound wrong")
		}
		if w.Layers[1].Tid2Eid == nil || w.Layers[1].Compressor != nil {
			t.Errorf("layer 1 bound wrong")
		}
		if got := l3.GateExps.Type; got != s.ExpertGateUp {
			t.Errorf("%s: gate experts are %v", s.Name, got)
		}
		if n := l3.DownExps.Rows(); n != c.Experts*c.Embed {
			t.Errorf("down experts: %d rows", n)
		}
	}
}

func TestVocabRoundTrip(t *testing.T) {
	real, err := tokenizer.DefaultVocab()
	if err != nil {
		t.Fatal(err)
	}
	small, err := synth.SmallVocab(1024)
	if err != nil {
		t.Fatal(err)
	}
	noTypes := small.Clone()
	noTypes.Types, noTypes.BOS, noTypes.EOS = nil, -1, -1
	for _, v := range []*tokenizer.Vocab{real, small, noTypes} {
		kvs := append([]gguf.KV{{Key: "general.architecture", Value: gguf.Str(model.Architecture)}}, model.VocabMetadata(v)...)
		f := parse(t, kvs, nil)
		got, err := model.VocabFromGGUF(f, len(v.Tokens))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, v) {
			t.Errorf("%d-token vocabulary does not round-trip", len(v.Tokens))
		}
		if _, err := model.VocabFromGGUF(f, len(v.Tokens)+1); err == nil {
			t.Error("wrong vocab_size accepted")
		}
		if pre, _ := f.KV(model.KeyTokenizerPre); pre.S != tokenizer.GGUFPre {
			t.Errorf("tokenizer.ggml.pre = %q", pre.S)
		}
	}
	// Malformed vocabularies.
	base := model.VocabMetadata(small)
	edit := func(key string, v *gguf.Value) []gguf.KV {
		var out []gguf.KV
		for _, kv := range base {
			if kv.Key == key {
				if v == nil {
					continue
				}
				kv.Value = *v
			}
			out = append(out, kv)
		}
		return out
	}
	bad := map[string][]gguf.KV{
		"no tokens":    edit(model.KeyTokens, nil),
		"no merges":    edit(model.KeyMerges, nil),
		"bpe model":    edit(model.KeyTokenizerModel, ptr(gguf.Str("llama"))),
		"short types":  edit(model.KeyTokenTypes, ptr(gguf.I32Array([]int32{1, 1}))),
		"bos range":    edit(model.KeyBOS, ptr(gguf.U32(5000))),
		"tokens ints":  edit(model.KeyTokens, ptr(gguf.U32Array([]uint32{1}))),
		"merges float": edit(model.KeyMerges, ptr(gguf.F32(1))),
	}
	for name, kvs := range bad {
		if _, err := model.VocabFromGGUF(parse(t, kvs, nil), 1024); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestBoolIsNotAnInteger(t *testing.T) {
	c := synth.Tiny()
	kvs := c.Metadata()
	for i := range kvs {
		if kvs[i].Key == model.KeyBlockCount {
			kvs[i].Value = gguf.Bool(true)
		}
	}
	_, err := model.ConfigFromGGUF(parse(t, kvs, nil))
	if err == nil || !strings.Contains(err.Error(), model.KeyBlockCount) {
		t.Fatalf("block_count = true accepted: %v", err)
	}
}

func TestLoadRejectsBadTokenMap(t *testing.T) {
	data, err := synth.Build(synth.Options{Config: synth.Tiny(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := model.Load(f); err != nil {
		t.Fatal(err)
	}
	ti, _ := f.Tensor("blk.1.ffn_gate_tid2eid.weight")
	// Point token 7's second expert past the expert count (the data is a
	// view into our own buffer).
	d := f.TensorData(ti)
	binary.LittleEndian.PutUint32(d[4*(7*int(ti.Dims[0])+1):], uint32(synth.Tiny().Experts))
	_, err = model.Load(f)
	if err == nil || !strings.Contains(err.Error(), "blk.1.ffn_gate_tid2eid.weight") || !strings.Contains(err.Error(), "token 7") {
		t.Fatalf("corrupt tid2eid accepted: %v", err)
	}
}
