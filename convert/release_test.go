package convert

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
	"ds4go/tokenizer"
)

// releaseConfig is a small model whose row lengths fit every scheme's block
// sizes (256 for the K-quants and IQ2_XXS, 32 for Q8_0).
func releaseConfig() model.Config {
	c := model.Flash()
	c.Layers, c.Embed, c.Vocab, c.ContextLen = 3, 256, 320, 8192
	c.Heads, c.HeadDim, c.RopeDim = 2, 128, 64
	c.QLoraRank, c.OLoraRank, c.OGroups, c.Window = 64, 32, 2, 8
	c.Experts, c.ExpertsUsed, c.ExpertFF, c.HashLayers = 4, 2, 256, 1
	c.IndexerHeads, c.IndexerHeadDim, c.IndexerTopK = 2, 128, 4
	c.CompressRatios = []int{0, 4, 128, 0} // + one MTP entry
	c.SwigluClamp = []float32{10, 10, 10}
	return c
}

// hfConfigJSON writes a config.json in the Hugging Face spelling (the
// inverse of ParseConfig, written out key by key), with extra keys merged.
func hfConfigJSON(c model.Config, extra map[string]any) []byte {
	m := map[string]any{
		"architectures": []string{"DeepseekV4ForCausalLM"}, "model_type": "deepseek_v4",
		"hidden_size": c.Embed, "num_hidden_layers": c.Layers, "vocab_size": c.Vocab,
		"max_position_embeddings": c.ContextLen, "num_attention_heads": c.Heads,
		"num_key_value_heads": 1, "head_dim": c.HeadDim, "qk_rope_head_dim": c.RopeDim,
		"q_lora_rank": c.QLoraRank, "o_lora_rank": c.OLoraRank, "o_groups": c.OGroups,
		"sliding_window": c.Window, "n_routed_experts": c.Experts, "num_experts_per_tok": c.ExpertsUsed,
		"moe_intermediate_size": c.ExpertFF, "n_shared_experts": c.SharedExperts,
		"num_hash_layers": c.HashLayers, "compress_ratios": c.CompressRatios,
		"index_n_heads": c.IndexerHeads, "index_head_dim": c.IndexerHeadDim, "index_topk": c.IndexerTopK,
		"hc_mult": c.HC, "hc_sinkhorn_iters": c.SinkhornIters, "hc_eps": c.HCEps,
		"rms_norm_eps": c.NormEps, "rope_theta": c.RopeBase, "compress_rope_theta": c.CompressRopeBase,
		"rope_scaling": map[string]any{"type": "yarn", "factor": c.RopeScale, "beta_fast": c.YarnBetaFast,
			"beta_slow": c.YarnBetaSlow, "original_max_position_embeddings": c.RopeOrigCtx},
		"routed_scaling_factor": c.ExpertWeightsScale, "norm_topk_prob": true,
		"scoring_func": "sqrtsoftplus", "swiglu_limit": c.SwigluClamp[0], "hidden_act": "silu",
		"topk_method": "noaux_tc", "tie_word_embeddings": false, "attention_bias": false,
		"num_nextn_predict_layers": len(c.CompressRatios) - c.Layers,
		"quantization_config": map[string]any{"activation_scheme": "dynamic", "fmt": "e4m3",
			"quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": []int{128, 128}},
	}
	for k, v := range extra {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		panic(err)
	}
	return b
}

// releaseModel is a synthetic checkpoint stored as the official release
// stores Flash: FP8 e4m3 dense matrices with 128×128 e8m0 scales, FP4
// routed experts (I8, two e2m1 per byte, e8m0 scale per 32), BF16 and F32
// small tensors, I64 tid2eid, spread over shards with an index.
type releaseModel struct {
	cfg    model.Config
	dir    string
	expect map[string][]float32 // GGUF name → values in GGUF order
	ids    map[string][]int64   // tid2eid
}

func bf16Round(x float32) float32 {
	return math.Float32frombits(math.Float32bits(quant.RoundBF16(x)))
}

func makeRelease(t *testing.T, c model.Config) *releaseModel {
	t.Helper()
	rm := &releaseModel{cfg: c, dir: t.TempDir(), expect: map[string][]float32{}, ids: map[string][]int64{}}
	rng := rand.New(rand.NewPCG(1, 2))
	var tensors []stTensor
	addFloats := func(name string, dt DType, shape []int64, vals []float32) {
		var b []byte
		for _, v := range vals {
			switch dt {
			case F32:
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
			case BF16:
				b = binary.LittleEndian.AppendUint16(b, uint16(math.Float32bits(v)>>16))
			case F16:
				b = binary.LittleEndian.AppendUint16(b, quant.F32ToF16(v))
			}
		}
		tensors = append(tensors, stTensor{name, dt, shape, b})
	}
	// fp8 writes rows×cols random e4m3 codes with random block scales and
	// returns the values by the format's definition.
	fp8 := func(name string, rows, cols int64) []float32 {
		sr, sc := (rows+127)/128, (cols+127)/128
		scale := make([]byte, sr*sc)
		for i := range scale {
			scale[i] = uint8(120 + rng.IntN(11))
		}
		q := make([]byte, rows*cols)
		vals := make([]float32, rows*cols)
		for i := range q {
			b := uint8(rng.IntN(256))
			if b&0x7f == 0x7f {
				b = 0x38
			}
			q[i] = b
			r, c := int64(i)/cols, int64(i)%cols
			vals[i] = float32(e4m3Ref(b) * math.Ldexp(1, int(scale[(r/128)*sc+c/128])-127))
		}
		base := strings.TrimSuffix(name, ".weight")
		tensors = append(tensors, stTensor{name, F8E4M3, []int64{rows, cols}, q},
			stTensor{base + ".scale", F8E8M0, []int64{sr, sc}, scale})
		return vals
	}
	e2m1 := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6}
	fp4 := func(name string, rows, cols int64) []float32 {
		scale := make([]byte, rows*cols/32)
		for i := range scale {
			scale[i] = uint8(118 + rng.IntN(11))
		}
		q := make([]byte, rows*cols/2)
		vals := make([]float32, rows*cols)
		for i := range q {
			lo, hi := rng.IntN(16), rng.IntN(16)
			q[i] = uint8(lo | hi<<4)
			r, c := int64(2*i)/cols, int64(2*i)%cols
			s := math.Ldexp(1, int(scale[r*(cols/32)+c/32])-127)
			vals[2*i] = float32(e2m1[lo] * s)
			vals[2*i+1] = float32(e2m1[hi] * s)
		}
		base := strings.TrimSuffix(name, ".weight")
		tensors = append(tensors, stTensor{name, I8, []int64{rows, cols / 2}, q},
			stTensor{base + ".scale", F8E8M0, []int64{rows, cols / 32}, scale})
		return vals
	}
	randVals := func(n uint64, scale float64, round func(float32) float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = round(float32(rng.NormFloat64() * scale))
		}
		return v
	}
	ident := func(x float32) float32 { return x }
	for _, sp := range model.ExpectedTensors(&c) {
		n := uint64(1)
		for _, d := range sp.Dims {
			n *= d
		}
		shape := reversed(sp.Dims)
		if names, ok := ExpertHFNames(sp.Name, c.Experts); ok {
			var all []float32
			for _, hf := range names {
				all = append(all, fp4(hf, shape[1], shape[2])...)
			}
			rm.expect[sp.Name] = all
			continue
		}
		hf, ok := HFName(sp.Name)
		if !ok {
			t.Fatalf("no HF name for %s", sp.Name)
		}
		switch {
		case sp.Role == model.RoleTokenMap:
			ids := make([]int64, n)
			var b []byte
			for i := range ids {
				ids[i] = int64(rng.IntN(c.Experts))
				b = binary.LittleEndian.AppendUint64(b, uint64(ids[i]))
			}
			rm.ids[sp.Name] = ids
			tensors = append(tensors, stTensor{hf, I64, shape, b})
		case sp.Name == "output.weight":
			v := randVals(n, 0.05, quant.RoundF16)
			addFloats(hf, F16, shape, v)
			rm.expect[sp.Name] = v
		case sp.Role == model.RoleDense:
			rm.expect[sp.Name] = fp8(hf, shape[0], shape[1])
		case strings.Contains(hf, "hc_") || strings.Contains(hf, "sink") || strings.HasSuffix(hf, "ape") || strings.HasSuffix(hf, "bias"):
			v := randVals(n, 0.5, ident)
			addFloats(hf, F32, shape, v)
			rm.expect[sp.Name] = v
		default:
			v := randVals(n, 0.1, bf16Round)
			addFloats(hf, BF16, shape, v)
			rm.expect[sp.Name] = v
		}
	}
	// Tensors the GGUF does not carry: an MTP block's projection.
	tensors = append(tensors, stTensor{"mtp.0.e_proj.weight", BF16, []int64{2, 2}, make([]byte, 8)})

	// Three shards, round robin, with an index.
	weightMap := map[string]string{}
	var shards [3][]stTensor
	for i, tn := range tensors {
		shards[i%3] = append(shards[i%3], tn)
	}
	for s := range shards {
		name := fmt.Sprintf("model-%05d-of-00003.safetensors", s+1)
		writeST(t, filepath.Join(rm.dir, name), shards[s])
		for _, tn := range shards[s] {
			weightMap[tn.name] = name
		}
	}
	idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	must(t, os.WriteFile(filepath.Join(rm.dir, IndexFile), idx, 0o644))
	must(t, os.WriteFile(filepath.Join(rm.dir, ConfigFile), hfConfigJSON(c, nil), 0o644))
	return rm
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestReleaseConfigRoundTrip(t *testing.T) {
	c := releaseConfig()
	got, err := ParseConfig(hfConfigJSON(c, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Errorf("config\n got  %+v\n want %+v", got, c)
	}
	fl := model.Flash()
	fl.CompressRatios = append(fl.CompressRatios, 0) // the MTP entry
	fl.ContextLen = 1048576
	official, err := os.ReadFile("../.ref/dsv4-flash-inference/config.json")
	if err != nil {
		t.Skip("official config.json not available:", err)
	}
	got, err = ParseConfig(official)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, fl) {
		t.Errorf("official Flash config\n got  %+v\n want %+v", got, fl)
	}
	if d := got.DiffFromFlash(); len(d) != 0 {
		t.Errorf("official config differs from model.Flash: %v", d)
	}
}

func TestConfigRejects(t *testing.T) {
	c := releaseConfig()
	for _, tc := range []struct {
		extra map[string]any
		want  string
	}{
		{map[string]any{"scoring_func": "sigmoid"}, "scoring_func"},
		{map[string]any{"num_key_value_heads": 2}, "num_key_value_heads"},
		{map[string]any{"hidden_size": nil}, "hidden_size: missing"},
		{map[string]any{"compress_ratios": nil}, "compress_ratios: missing"},
		{map[string]any{"compress_ratios": []int{0, 4}}, "compress_ratios has 2 entries"},
		{map[string]any{"compress_ratios": []int{0, 8, 128}}, "must be 0, 4 or 128"},
		{map[string]any{"tie_word_embeddings": true}, "tie_word_embeddings"},
		{map[string]any{"n_group": 8, "topk_group": 4}, "grouped"},
		{map[string]any{"norm_topk_prob": false}, "norm_topk_prob"},
		{map[string]any{"hidden_act": "gelu"}, "hidden_act"},
		{map[string]any{"model_type": "deepseek_v3"}, "model_type"},
		{map[string]any{"n_shared_experts": 2}, "shared"},
		{map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 2}}, "only yarn"},
		{map[string]any{"quantization_config": map[string]any{"quant_method": "fp8", "fmt": "e5m2"}}, "e5m2"},
		{map[string]any{"rms_norm_eps": 1e300}, "rms_norm_eps"},
	} {
		_, err := ParseConfig(hfConfigJSON(c, tc.extra))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error mentioning %q", tc.extra, err, tc.want)
		}
	}
	if _, err := ParseConfig([]byte("{")); err == nil {
		t.Error("truncated JSON accepted")
	}
}

// TestReleaseConvert converts the FP8/FP4 checkpoint with every scheme and
// checks each tensor: in f32 against the values computed from the format
// definitions; in the other schemes byte for byte against quant.Quantize of
// those values, row by row.
func TestReleaseConvert(t *testing.T) {
	rm := makeRelease(t, releaseConfig())
	schemes := []model.Scheme{model.SchemeF32, model.SchemeF16, model.SchemeQ8, model.SchemeQ4, model.SchemeQ2}
	if testing.Short() {
		schemes = schemes[:3]
	}
	for _, s := range schemes {
		t.Run(s.Name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "m.gguf")
			var logs []string
			err := Convert(context.Background(), Options{InputDir: rm.dir, Output: out, Scheme: s, Tokenizer: TokenizerNone,
				Workers: 3, ChunkElems: 1000, Log: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(logs, "\n"), "ignoring 1 checkpoint tensors not in the GGUF (e.g. mtp.0.e_proj.weight)") {
				t.Errorf("logs do not report the unused MTP tensor:\n%s", strings.Join(logs, "\n"))
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			w, err := model.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if w.Scheme != s.Name {
				t.Errorf("loaded scheme %q", w.Scheme)
			}
			if !reflect.DeepEqual(w.Config, rm.cfg) {
				t.Errorf("config\n got  %+v\n want %+v", w.Config, rm.cfg)
			}
			for i := range f.Tensors {
				ti := &f.Tensors[i]
				data := f.TensorData(ti)
				if ids, ok := rm.ids[ti.Name]; ok {
					for k, v := range ids {
						if got := int32(binary.LittleEndian.Uint32(data[4*k:])); int64(got) != v {
							t.Fatalf("%s[%d] = %d, want %d", ti.Name, k, got, v)
						}
					}
					continue
				}
				want, ok := rm.expect[ti.Name]
				if !ok {
					t.Fatalf("unexpected tensor %s", ti.Name)
				}
				cols := int(ti.Dims[0])
				rb, _ := ti.Type.RowBytes(int64(cols))
				buf := make([]byte, rb)
				for r := 0; r < len(want)/cols; r++ {
					must(t, quant.Quantize(ti.Type, want[r*cols:(r+1)*cols], buf))
					if !bytes.Equal(buf, data[int64(r)*rb:int64(r+1)*rb]) {
						t.Fatalf("%s (%v) row %d differs from quantizing the dequantized source", ti.Name, ti.Type, r)
					}
				}
			}
		})
	}
}

// TestReleaseTensor checks HFCheckpoint.Tensor on the FP8/FP4 checkpoint.
func TestReleaseTensor(t *testing.T) {
	rm := makeRelease(t, releaseConfig())
	ck, err := OpenHF(rm.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, name := range []string{"blk.1.attn_q_a.weight", "blk.2.ffn_down_exps.weight", "output.weight", "blk.1.indexer_compressor_ape.weight"} {
		got, dims, err := ck.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, rm.expect[name]) {
			t.Errorf("%s %v differs", name, dims)
		}
	}
	got, _, err := ck.Tensor("blk.0.ffn_gate_tid2eid.weight")
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range rm.ids["blk.0.ffn_gate_tid2eid.weight"] {
		if got[i] != float32(v) {
			t.Fatalf("tid2eid[%d] = %v, want %d", i, got[i], v)
		}
	}
	if _, _, err := ck.Tensor("blk.9.attn_q_a.weight"); err == nil {
		t.Error("tensor of a missing layer accepted")
	}
}

func TestReleaseErrors(t *testing.T) {
	c := releaseConfig()
	rm := makeRelease(t, c)
	idsDir := t.TempDir()
	for _, e := range mustReadDir(t, rm.dir) {
		b, _ := os.ReadFile(filepath.Join(rm.dir, e))
		os.WriteFile(filepath.Join(idsDir, e), b, 0o644)
	}
	// Rewrite the config with fewer experts: shapes no longer match.
	os.WriteFile(filepath.Join(idsDir, ConfigFile), hfConfigJSON(c, map[string]any{"n_routed_experts": 2, "num_experts_per_tok": 2}), 0o644)
	err := ConvertDir(context.Background(), idsDir, filepath.Join(t.TempDir(), "x.gguf"), model.SchemeF32)
	if err == nil || !strings.Contains(err.Error(), "ffn_gate_inp.weight") {
		t.Errorf("shape mismatch: got %v", err)
	}

	// Tokenizer choices.
	out := filepath.Join(t.TempDir(), "t.gguf")
	err = Convert(context.Background(), Options{InputDir: rm.dir, Output: out})
	if err == nil || !strings.Contains(err.Error(), "no tokenizer.json") {
		t.Errorf("auto tokenizer without tokenizer.json: got %v", err)
	}
	err = Convert(context.Background(), Options{InputDir: rm.dir, Output: out, Tokenizer: TokenizerDefault})
	if err == nil || !strings.Contains(err.Error(), "vocab_size") {
		t.Errorf("default vocabulary with vocab_size 320: got %v", err)
	}
}

func mustReadDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestTokenizerEmbedding embeds a tokenizer.json found in the checkpoint
// directory: a small one is padded to vocab_size with unused tokens.
func TestTokenizerEmbedding(t *testing.T) {
	rm := makeRelease(t, releaseConfig())
	full, err := tokenizer.DefaultVocab()
	if err != nil {
		t.Fatal(err)
	}
	// A cut-down tokenizer.json with the first 300 tokens, using the
	// embedded file's normalizer and pre-tokenizer so LoadHFJSON accepts it.
	vocab := map[string]int{}
	for i := 0; i < 300; i++ {
		vocab[full.Tokens[i]] = i
	}
	var hf map[string]json.RawMessage
	if err := json.Unmarshal(defaultTokenizerJSON(t), &hf); err != nil {
		t.Fatal(err)
	}
	cut := map[string]any{
		"added_tokens":  []map[string]any{{"id": 0, "content": tokenizer.BOSText, "special": true}, {"id": 1, "content": tokenizer.EOSText, "special": true}},
		"normalizer":    hf["normalizer"],
		"pre_tokenizer": hf["pre_tokenizer"],
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
	}
	b, _ := json.Marshal(cut)
	must(t, os.WriteFile(filepath.Join(rm.dir, "tokenizer.json"), b, 0o644))
	out := filepath.Join(t.TempDir(), "t.gguf")
	if err := Convert(context.Background(), Options{InputDir: rm.dir, Output: out}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := model.VocabFromGGUF(f, rm.cfg.Vocab)
	if err != nil {
		t.Fatal(err)
	}
	if v.BOS != 0 || v.EOS != 1 || v.Tokens[299] != full.Tokens[299] || v.Tokens[319] != "[PAD319]" || v.Types[319] != tokenizer.TypeUnused {
		t.Errorf("vocab: BOS %d EOS %d tok299 %q tok319 %q type %d", v.BOS, v.EOS, v.Tokens[299], v.Tokens[319], v.Types[319])
	}
	if name, _ := f.KV("general.name"); name.S != filepath.Base(rm.dir) {
		t.Errorf("general.name %q", name.S)
	}
}

func defaultTokenizerJSON(t *testing.T) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(tokenizer.DefaultTokenizerJSONGz()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
