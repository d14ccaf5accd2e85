package synth

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
	"ds4go/tokenizer"
)

func buildTiny(t *testing.T, opts Options) ([]byte, *gguf.File) {
	t.Helper()
	if opts.Config.Layers == 0 {
		opts.Config = Tiny()
	}
	data, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return data, f
}

func TestTinyLoads(t *testing.T) {
	for _, s := range []model.Scheme{model.SchemeQ8, model.SchemeF16, model.SchemeF32} {
		t.Run(s.Name, func(t *testing.T) {
			_, f := buildTiny(t, Options{Scheme: s, Seed: 1})
			w, err := model.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			if w.Scheme != s.Name {
				t.Errorf("scheme %q, want %q", w.Scheme, s.Name)
			}
			c, _ := model.ConfigFromGGUF(f)
			want := Tiny()
			if c.Embed != want.Embed || c.Layers != want.Layers || c.IndexerHeadDim != want.IndexerHeadDim {
				t.Errorf("config %+v", c)
			}
			v, err := model.VocabFromGGUF(f, c.Vocab)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tokenizer.New(v); err != nil {
				t.Fatal(err)
			}
			if kv, ok := f.KV(KeyScheme); !ok || kv.S != s.Name {
				t.Errorf("%s = %v", KeyScheme, kv)
			}
		})
	}
}

func TestDeterminism(t *testing.T) {
	a, _ := buildTiny(t, Options{Seed: 7, Workers: 1})
	b, _ := buildTiny(t, Options{Seed: 7, Workers: 8})
	if !bytes.Equal(a, b) {
		t.Fatal("1 worker and 8 workers differ")
	}
	c, _ := buildTiny(t, Options{Seed: 8})
	if bytes.Equal(a, c) {
		t.Fatal("seeds 7 and 8 give the same file")
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := WriteFile(context.Background(), path, Options{Config: Tiny(), Seed: 7, Workers: 3}); err != nil {
		t.Fatal(err)
	}
	d, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, d) {
		t.Fatal("WriteFile and Build differ")
	}
	if _, err := os.Stat(path + ".partial"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
}

// stats dequantizes a whole tensor.
func stats(t *testing.T, f *gguf.File, name string) (mean, std, amax float64) {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("%s missing", name)
	}
	x := make([]float32, ti.Elements())
	if err := quant.Dequantize(ti.Type, f.TensorData(ti), x); err != nil {
		t.Fatal(err)
	}
	var s, ss float64
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("%s has a non-finite value", name)
		}
		s += float64(v)
		ss += float64(v) * float64(v)
		amax = max(amax, math.Abs(float64(v)))
	}
	n := float64(len(x))
	return s / n, math.Sqrt(ss/n - (s/n)*(s/n)), amax
}

func TestBlockStd(t *testing.T) {
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q2_K, quant.Q4_K, quant.IQ2_XXS} {
		g := blockGens[typ]
		for _, want := range []float64{1.0 / 64, 1.0 / 45} {
			n := 512
			buf := make([]byte, n*typ.BlockBytes())
			g.fill(&rng{s: 99}, buf, quant.F32ToF16(float32(want/g.unitStd())))
			x := make([]float32, n*typ.BlockSize())
			if err := quant.Dequantize(typ, buf, x); err != nil {
				t.Fatal(err)
			}
			var s, ss float64
			for _, v := range x {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%v: non-finite value", typ)
				}
				s += float64(v)
				ss += float64(v) * float64(v)
			}
			m := s / float64(len(x))
			std := math.Sqrt(ss/float64(len(x)) - m*m)
			if math.Abs(std/want-1) > 0.03 || math.Abs(m) > 0.02*want {
				t.Errorf("%v: mean %.3g std %.4g, want 0 and %.4g", typ, m, std, want)
			}
		}
	}
}

func TestNo128(t *testing.T) {
	for _, x := range []uint64{0x8080808080808080, 0x0080018081808000, 0x7f80ff0001028081, 0} {
		y := no128(x)
		for i := 0; i < 8; i++ {
			bx, by := byte(x>>(8*i)), byte(y>>(8*i))
			want := bx
			if bx == 0x80 {
				want = 0x81
			}
			if by != want {
				t.Errorf("no128(%#x) byte %d = %#x, want %#x", x, i, by, want)
			}
		}
	}
}

func TestWeightsSane(t *testing.T) {
	_, f := buildTiny(t, Options{Seed: 3})
	c := Tiny()
	for _, ti := range f.Tensors {
		if ti.Type == quant.I32 {
			continue
		}
		m, std, amax := stats(t, f, ti.Name)
		n := ti.Name
		switch {
		case strings.HasSuffix(n, "norm.weight"):
			if math.Abs(m-1) > 0.025 || amax > 1.05 {
				t.Errorf("%s: mean %g max %g", n, m, amax)
			}
		case strings.HasSuffix(n, "_scale.weight"), strings.HasSuffix(n, "_base.weight"),
			strings.HasSuffix(n, "sinks.weight"), strings.HasSuffix(n, ".bias"):
			if amax > 1.1 {
				t.Errorf("%s: max %g", n, amax)
			}
		default:
			want := matrixStd(&model.TensorSpec{Name: n, Dims: ti.Dims})
			if math.Abs(std/want-1) > 0.15 || math.Abs(m) > 0.1*want {
				t.Errorf("%s (%v): mean %.3g std %.4g, want %.4g", n, ti.Type, m, std, want)
			}
		}
	}
	// tid2eid: distinct experts < Experts per token.
	for l := 0; l < c.HashLayers; l++ {
		ti, _ := f.Tensor(model.LayerPrefix(l) + "ffn_gate_tid2eid.weight")
		d := f.TensorData(ti)
		for tok := 0; tok < c.Vocab; tok++ {
			seen := map[int32]bool{}
			for k := 0; k < c.ExpertsUsed; k++ {
				e := int32(uint32(d[4*(tok*c.ExpertsUsed+k)]) | uint32(d[4*(tok*c.ExpertsUsed+k)+1])<<8)
				if e < 0 || int(e) >= c.Experts || seen[e] {
					t.Fatalf("layer %d token %d: bad expert list", l, tok)
				}
				seen[e] = true
			}
		}
	}
}

func TestRealVocab(t *testing.T) {
	c := Tiny()
	c.Vocab = RealVocabSize
	_, f := buildTiny(t, Options{Config: c, Seed: 1})
	w, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	v, err := model.VocabFromGGUF(f, w.Config.Vocab)
	if err != nil {
		t.Fatal(err)
	}
	real, _ := tokenizer.DefaultVocab()
	if len(v.Tokens) != RealVocabSize || len(v.Merges) != len(real.Merges) || v.BOS != real.BOS || v.EOS != real.EOS {
		t.Errorf("vocabulary: %d tokens, %d merges", len(v.Tokens), len(v.Merges))
	}
	// A given vocabulary must match Config.Vocab.
	small, _ := SmallVocab(1024)
	if _, err := Build(Options{Config: c, Vocab: small}); err == nil {
		t.Error("a 1024-token vocabulary was accepted for vocab_size 129280")
	}
}

func TestExactQuant(t *testing.T) {
	c := Flash(3)
	c.Embed, c.Heads, c.HeadDim, c.QLoraRank, c.OLoraRank, c.OGroups = 256, 2, 128, 64, 32, 1
	c.Experts, c.ExpertsUsed, c.ExpertFF, c.Vocab, c.IndexerHeads = 2, 2, 256, 400, 2
	for _, s := range []model.Scheme{model.SchemeQ2, model.SchemeQ4} {
		data, err := Build(Options{Config: c, Scheme: s, Seed: 2, ExactQuant: true})
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
		for _, n := range []string{"blk.2.ffn_gate_exps.weight", "blk.2.ffn_down_exps.weight", "output.weight"} {
			_, std, _ := stats(t, f, n)
			ti, _ := f.Tensor(n)
			want := 1 / math.Sqrt(float64(ti.Dims[0]))
			if math.Abs(std/want-1) > 0.2 {
				t.Errorf("%s %s (%v): std %.4g, want ≈ %.4g", s.Name, n, ti.Type, std, want)
			}
		}
	}
}

func TestWriteFileCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	path := filepath.Join(t.TempDir(), "x.gguf")
	if err := WriteFile(ctx, path, Options{Config: Tiny()}); err == nil {
		t.Fatal("cancelled write succeeded")
	}
	for _, p := range []string{path, path + ".partial"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a cancelled write", p)
		}
	}
	if err := WriteFile(context.Background(), path, Options{Config: Tiny(), HeaderOnly: true}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := model.ValidateTensors(ptrConfig(Tiny()), f); err != nil {
		t.Error(err)
	}
}

func ptrConfig(c model.Config) *model.Config { return &c }

func TestOptionsErrors(t *testing.T) {
	c := Tiny()
	c.Heads = 3 // not a multiple of OGroups 2
	if _, err := Build(Options{Config: c}); err == nil {
		t.Error("inconsistent config accepted")
	}
	if _, err := Build(Options{Config: Tiny(), Scheme: model.SchemeQ2}); err == nil {
		t.Error("q2 accepted rows of 64")
	}
	odd := model.SchemeQ8
	odd.Dense = quant.Q5_K
	if _, err := Build(Options{Config: Tiny(), Scheme: odd}); err == nil {
		t.Error("Q5_K accepted")
	}
}

func dequant(t *testing.T, f *gguf.File, name string) []float32 {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("%s missing", name)
	}
	x := make([]float32, ti.Elements())
	if err := quant.Dequantize(ti.Type, f.TensorData(ti), x); err != nil {
		t.Fatal(err)
	}
	return x
}

// TestHyperConnectionMixes computes hc_pre's coefficients (docs/forward-reference.md
// §1) for random unit-RMS streams and checks they are in a sane range.
func TestHyperConnectionMixes(t *testing.T) {
	c := Tiny()
	_, f := buildTiny(t, Options{Seed: 11})
	hc, e := c.HC, c.Embed
	r := &rng{s: 5}
	x := make([]float64, hc*e)
	for _, pfx := range []string{"blk.0.hc_attn_", "blk.4.hc_ffn_"} {
		fn := dequant(t, f, pfx+"fn.weight")
		scale := dequant(t, f, pfx+"scale.weight")
		base := dequant(t, f, pfx+"base.weight")
		sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
		var diag float64
		var ndiag int
		for trial := 0; trial < 20; trial++ {
			var ss float64
			for i := range x {
				x[i] = float64(normalTable[uint16(r.next())])
				ss += x[i] * x[i]
			}
			rs := 1 / math.Sqrt(ss/float64(len(x))+1e-6)
			mix := make([]float64, c.HCMixes())
			for m := range mix {
				var d float64
				for i, v := range x {
					d += float64(fn[m*hc*e+i]) * v
				}
				mix[m] = d * rs
			}
			for j := 0; j < hc; j++ {
				pre := sig(mix[j]*float64(scale[0])+float64(base[j])) + 1e-6
				post := 2 * sig(mix[hc+j]*float64(scale[1])+float64(base[hc+j]))
				if pre < 0.2 || pre > 0.8 || post < 0.4 || post > 1.6 {
					t.Fatalf("%s: pre %.3f post %.3f", pfx, pre, post)
				}
				// comb row j: softmax over k, the diagonal dominates.
				row := make([]float64, hc)
				var sum float64
				for k := range row {
					row[k] = math.Exp(mix[2*hc+j*hc+k]*float64(scale[2]) + float64(base[2*hc+j*hc+k]))
					sum += row[k]
				}
				for k := range row {
					p := row[k] / sum
					if k == j && (p < 0.15 || p > 0.9) || k != j && (p < 0.02 || p > 0.5) {
						t.Fatalf("%s: comb[%d][%d] = %.3f", pfx, j, k, p)
					}
					if k == j {
						diag += p
						ndiag++
					}
				}
			}
		}
		if d := diag / float64(ndiag); d < 0.4 {
			t.Errorf("%s: mean diagonal of comb %.3f: not leaning to the identity", pfx, d)
		}
	}
}
