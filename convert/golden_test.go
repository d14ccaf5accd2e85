package convert

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
)

var goldenCases = []string{"flash6_w16_k8", "flash4_w128_k512"}

func goldenDir(c string) string { return filepath.Join("..", "testdata", "golden", c) }

// rawSafetensors reads a safetensors file the simple way (whole file in
// memory), independently of SafeFile, for checking conversions.
type rawSafetensors struct {
	hdr  map[string]json.RawMessage
	data []byte
}

type rawEntryT struct {
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Offsets []uint64 `json:"data_offsets"`
}

func readRawSafetensors(t *testing.T, path string) *rawSafetensors {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	r := &rawSafetensors{data: b[8+n:]}
	if err := json.Unmarshal(b[8:8+n], &r.hdr); err != nil {
		t.Fatal(err)
	}
	delete(r.hdr, "__metadata__")
	return r
}

func (r *rawSafetensors) entry(t *testing.T, name string) rawEntryT {
	t.Helper()
	var e rawEntryT
	raw, ok := r.hdr[name]
	if !ok {
		t.Fatalf("source has no %s", name)
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatal(err)
	}
	return e
}

// floats decodes a BF16/F32 source tensor; BF16→F32 is a 16-bit shift.
func (r *rawSafetensors) floats(t *testing.T, name string) ([]float32, []int64) {
	t.Helper()
	e := r.entry(t, name)
	b := r.data[e.Offsets[0]:e.Offsets[1]]
	var out []float32
	switch e.DType {
	case "BF16":
		for i := 0; i < len(b); i += 2 {
			out = append(out, math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[i:]))<<16))
		}
	case "F32":
		for i := 0; i < len(b); i += 4 {
			out = append(out, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
		}
	default:
		t.Fatalf("%s: unexpected dtype %s", name, e.DType)
	}
	return out, e.Shape
}

func (r *rawSafetensors) ints(t *testing.T, name string) ([]int64, []int64) {
	t.Helper()
	e := r.entry(t, name)
	if e.DType != "I64" {
		t.Fatalf("%s: dtype %s, want I64", name, e.DType)
	}
	b := r.data[e.Offsets[0]:e.Offsets[1]]
	out := make([]int64, len(b)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out, e.Shape
}

func convertGolden(t *testing.T, c string, scheme model.Scheme) (string, *gguf.File, *model.Weights) {
	t.Helper()
	return convertGoldenOpts(t, c, Options{Scheme: scheme})
}

// convertGoldenOpts converts a golden checkpoint with o's scheme and MTP
// choice (no tokenizer) and loads the result.
func convertGoldenOpts(t *testing.T, c string, o Options) (string, *gguf.File, *model.Weights) {
	t.Helper()
	o.InputDir, o.Tokenizer = goldenDir(c), TokenizerNone
	o.Output = filepath.Join(t.TempDir(), c+"-"+o.Scheme.Name+".gguf")
	out := o.Output
	if err := Convert(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	w, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return out, f, w
}

func f32Data(t *testing.T, f *gguf.File, ti *gguf.TensorInfo) []float32 {
	t.Helper()
	b := f.TensorData(ti)
	out := make([]float32, ti.Elements())
	if err := quant.Dequantize(ti.Type, b, out); err != nil {
		t.Fatalf("%s: %v", ti.Name, err)
	}
	return out
}

// TestGoldenF32 converts both golden checkpoints to F32 and checks every
// element of every tensor against the safetensors source, and that every
// source tensor except the MTP block is used exactly once.
func TestGoldenF32(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c, func(t *testing.T) {
			_, f, w := convertGolden(t, c, model.SchemeF32)
			if w.Scheme != "f32" {
				t.Errorf("scheme %q, want f32", w.Scheme)
			}
			src := readRawSafetensors(t, filepath.Join(goldenDir(c), "model.safetensors"))
			used := checkAgainstSource(t, f, src)
			for name := range src.hdr {
				switch n := used[name]; {
				case strings.HasPrefix(name, "mtp."):
					if n != 0 {
						t.Errorf("MTP tensor %s was converted", name)
					}
				case n != 1:
					t.Errorf("source %s used %d times, want once", name, n)
				}
			}
		})
	}
}

// checkAgainstSource checks every element of every tensor of f against the
// checkpoint tensors it comes from, and returns how often each was used.
func checkAgainstSource(t *testing.T, f *gguf.File, src *rawSafetensors) map[string]int {
	t.Helper()
	used := map[string]int{}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if ti.Type == quant.I32 {
			hf, _ := HFName(ti.Name)
			used[hf]++
			want, shape := src.ints(t, hf)
			if !slices.Equal(reversed(ti.Dims), shape) {
				t.Fatalf("%s dims %v vs source %v", ti.Name, ti.Dims, shape)
			}
			b := f.TensorData(ti)
			for k, v := range want {
				if got := int32(binary.LittleEndian.Uint32(b[4*k:])); int64(got) != v {
					t.Fatalf("%s[%d] = %d, want %d", ti.Name, k, got, v)
				}
			}
			continue
		}
		if ti.Type != quant.F32 {
			t.Fatalf("%s: type %v in an f32 conversion", ti.Name, ti.Type)
		}
		got := f32Data(t, f, ti)
		var names []string
		if hf, ok := HFName(ti.Name); ok {
			names = []string{hf}
		} else if hfs, ok := ExpertHFNames(ti.Name, int(ti.Dims[2])); ok {
			names = hfs
		} else {
			t.Fatalf("%s: no source name", ti.Name)
		}
		pos := 0
		for _, hf := range names {
			used[hf]++
			want, shape := src.floats(t, hf)
			wantDims := ti.Dims
			if len(names) > 1 {
				wantDims = ti.Dims[:2]
			}
			if !slices.Equal(reversed(wantDims), shape) {
				t.Fatalf("%s dims %v vs source %s %v", ti.Name, ti.Dims, hf, shape)
			}
			for k, v := range want {
				if math.Float32bits(got[pos+k]) != math.Float32bits(v) {
					t.Fatalf("%s (from %s) element %d = %v, want %v", ti.Name, hf, k, got[pos+k], v)
				}
			}
			pos += len(want)
		}
		if pos != len(got) {
			t.Fatalf("%s: %d elements, sources had %d", ti.Name, len(got), pos)
		}
	}
	return used
}

// TestGoldenMTP converts flash4's checkpoint with its MTP block: every
// element matches the source, every source tensor (the MTP block's too) is
// used exactly once, and model.Load binds the block.
func TestGoldenMTP(t *testing.T) {
	const c = "flash4_w128_k512"
	_, f, w := convertGoldenOpts(t, c, Options{Scheme: model.SchemeF32, MTP: true})
	if w.MTP == nil || w.MTP.Block.Index != w.Config.Layers || w.MTP.EProj == nil {
		t.Fatalf("MTP block not bound: %+v", w.MTP)
	}
	src := readRawSafetensors(t, filepath.Join(goldenDir(c), "model.safetensors"))
	used := checkAgainstSource(t, f, src)
	mtp := 0
	for name := range src.hdr {
		if n := used[name]; n != 1 {
			t.Errorf("source %s used %d times, want once", name, n)
		}
		if strings.HasPrefix(name, "mtp.") {
			mtp++
		}
	}
	if mtp != 53 {
		t.Errorf("%d MTP source tensors, want 53", mtp)
	}
}

// TestGoldenSpotRows checks a few rows through the typed views the engine
// binds (model.Weights), with the orientation spelled out: GGUF row r of a
// [in, out] matrix is PyTorch row r (output feature r).
func TestGoldenSpotRows(t *testing.T) {
	_, _, w := convertGolden(t, "flash6_w16_k8", model.SchemeF32)
	src := readRawSafetensors(t, filepath.Join(goldenDir("flash6_w16_k8"), "model.safetensors"))
	row := func(tn *model.Tensor, i int) []float32 {
		out := make([]float32, tn.RowLen())
		if err := quant.Dequantize(tn.Type, tn.Row(i), out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(tn *model.Tensor, i int, hf string, hfRow int) {
		t.Helper()
		want, shape := src.floats(t, hf)
		cols := int(shape[len(shape)-1])
		if cols != tn.RowLen() {
			t.Fatalf("%s row length %d, source %s has %d columns", tn.Name, tn.RowLen(), hf, cols)
		}
		if got := row(tn, i); !slices.Equal(got, want[hfRow*cols:(hfRow+1)*cols]) {
			t.Errorf("%s row %d differs from %s row %d", tn.Name, i, hf, hfRow)
		}
	}
	check(w.TokenEmbd, 17, "embed.weight", 17)
	check(w.Output, 511, "head.weight", 511)
	l := &w.Layers[2]
	check(l.QB, 700, "layers.2.attn.wq_b.weight", 700)
	check(l.OutA, 33, "layers.2.attn.wo_a.weight", 33)
	check(l.Compressor.APE, 3, "layers.2.attn.compressor.ape", 3)
	check(l.Indexer.Compressor.KV, 255, "layers.2.attn.indexer.compressor.wkv.weight", 255)
	check(l.HCAttnFn, 23, "layers.2.hc_attn_fn", 23)
	// Expert stacks: GGUF row e·out + r is expert e's row r.
	check(l.GateExps, 5*16+3, "layers.2.ffn.experts.5.w1.weight", 3)
	check(l.UpExps, 15*16+15, "layers.2.ffn.experts.15.w3.weight", 15)
	check(l.DownExps, 9*64+40, "layers.2.ffn.experts.9.w2.weight", 40)
	if l.Compressor.APE.Dims[0] != 2*192 || l.Compressor.APE.Dims[1] != 4 {
		t.Errorf("ape dims %v, want [384, 4]", l.Compressor.APE.Dims)
	}
}

// TestGoldenF16 checks the F16 scheme: matrices are the source rounded to
// half precision, vectors stay F32.
func TestGoldenF16(t *testing.T) {
	_, f, w := convertGolden(t, "flash4_w128_k512", model.SchemeF16)
	if w.Scheme != "f16" {
		t.Errorf("scheme %q, want f16", w.Scheme)
	}
	ck, err := OpenHF(goldenDir("flash4_w128_k512"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, name := range []string{"token_embd.weight", "blk.2.attn_q_b.weight", "blk.3.ffn_down_exps.weight", "blk.0.attn_norm.weight", "blk.2.attn_compressor_ape.weight"} {
		ti, _ := f.Tensor(name)
		want, dims, err := ck.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(dims, ti.Dims) {
			t.Fatalf("%s dims %v vs %v", name, ti.Dims, dims)
		}
		got := f32Data(t, f, ti)
		for i := range want {
			w := want[i]
			if ti.Type == quant.F16 {
				w = quant.RoundF16(w)
			}
			if got[i] != w {
				t.Fatalf("%s (%v) element %d = %v, want %v", name, ti.Type, i, got[i], w)
			}
		}
	}
}

// TestGoldenQuantSchemeRejected: the golden models' row lengths (16, 48)
// do not fit Q8_0 blocks, and conversion must say so before writing.
func TestGoldenQuantSchemeRejected(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.gguf")
	err := ConvertDir(context.Background(), goldenDir("flash4_w128_k512"), out, model.SchemeQ8)
	if err == nil || !strings.Contains(err.Error(), "blk.0.attn_q_b.weight") || !strings.Contains(err.Error(), "block size 32") {
		t.Fatalf("got %v, want a block-size error naming blk.0.attn_q_b.weight", err)
	}
	if _, serr := os.Stat(out); serr == nil {
		t.Error("output written despite the error")
	}
	if _, serr := os.Stat(out + ".tmp"); serr == nil {
		t.Error("temporary file left behind")
	}
}

// TestGoldenConfig checks the config.json mapping against the golden
// config.json and the independent inference_config.json (ModelArgs names).
func TestGoldenConfig(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c, func(t *testing.T) {
			_, _, w := convertGolden(t, c, model.SchemeF32)
			got := w.Config
			b, err := os.ReadFile(filepath.Join(goldenDir(c), "inference_config.json"))
			if err != nil {
				t.Fatal(err)
			}
			var a struct {
				MaxSeqLen     int     `json:"max_seq_len"`
				Vocab         int     `json:"vocab_size"`
				Dim           int     `json:"dim"`
				MoeInter      int     `json:"moe_inter_dim"`
				Layers        int     `json:"n_layers"`
				HashLayers    int     `json:"n_hash_layers"`
				Heads         int     `json:"n_heads"`
				Experts       int     `json:"n_routed_experts"`
				Shared        int     `json:"n_shared_experts"`
				Active        int     `json:"n_activated_experts"`
				RouteScale    float32 `json:"route_scale"`
				SwigluLimit   float32 `json:"swiglu_limit"`
				QLora         int     `json:"q_lora_rank"`
				HeadDim       int     `json:"head_dim"`
				RopeDim       int     `json:"rope_head_dim"`
				NormEps       float32 `json:"norm_eps"`
				OGroups       int     `json:"o_groups"`
				OLora         int     `json:"o_lora_rank"`
				Window        int     `json:"window_size"`
				Ratios        []int   `json:"compress_ratios"`
				CompressTheta float32 `json:"compress_rope_theta"`
				OrigSeqLen    int     `json:"original_seq_len"`
				RopeTheta     float32 `json:"rope_theta"`
				RopeFactor    float32 `json:"rope_factor"`
				BetaFast      float32 `json:"beta_fast"`
				BetaSlow      float32 `json:"beta_slow"`
				IndexHeads    int     `json:"index_n_heads"`
				IndexHeadDim  int     `json:"index_head_dim"`
				IndexTopK     int     `json:"index_topk"`
				HCMult        int     `json:"hc_mult"`
				HCIters       int     `json:"hc_sinkhorn_iters"`
				HCEps         float32 `json:"hc_eps"`
			}
			if err := json.Unmarshal(b, &a); err != nil {
				t.Fatal(err)
			}
			clamp := make([]float32, a.Layers)
			for i := range clamp {
				clamp[i] = a.SwigluLimit
			}
			want := model.Config{
				Layers: a.Layers, Embed: a.Dim, Vocab: a.Vocab, ContextLen: a.MaxSeqLen,
				Heads: a.Heads, HeadsKV: 1, HeadDim: a.HeadDim, RopeDim: a.RopeDim,
				QLoraRank: a.QLora, OLoraRank: a.OLora, OGroups: a.OGroups, Window: a.Window,
				Experts: a.Experts, ExpertsUsed: a.Active, ExpertFF: a.MoeInter, SharedExperts: a.Shared,
				HashLayers: a.HashLayers, IndexerHeads: a.IndexHeads, IndexerHeadDim: a.IndexHeadDim,
				IndexerTopK: a.IndexTopK, HC: a.HCMult, SinkhornIters: a.HCIters, HCEps: a.HCEps,
				NormEps: a.NormEps, RopeBase: a.RopeTheta, CompressRopeBase: a.CompressTheta,
				RopeScale: a.RopeFactor, YarnBetaFast: a.BetaFast, YarnBetaSlow: a.BetaSlow,
				RopeOrigCtx: a.OrigSeqLen, CompressRatios: a.Ratios, SwigluClamp: clamp,
				ExpertWeightsScale: a.RouteScale, ExpertWeightsNorm: true,
			}
			// max_position_embeddings (config.json) vs max_seq_len (the
			// reference run's cache size) are different things; compare the
			// context length against config.json itself.
			var hf struct {
				MaxPos int `json:"max_position_embeddings"`
			}
			cb, _ := os.ReadFile(filepath.Join(goldenDir(c), "config.json"))
			json.Unmarshal(cb, &hf)
			want.ContextLen = hf.MaxPos
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(want)
			if string(gj) != string(wj) {
				t.Errorf("config\n got  %s\n want %s", gj, wj)
			}
		})
	}
}
