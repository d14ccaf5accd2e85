package model_test

import (
	"errors"
	"strings"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
	"ds4go/synth"
)

func buildParsed(t *testing.T, o synth.Options) *gguf.File {
	t.Helper()
	data, err := synth.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func checkMTPBound(t *testing.T, w *model.Weights) {
	t.Helper()
	m := w.MTP
	if m == nil {
		t.Fatal("no MTP block bound")
	}
	c := &w.Config
	b := &m.Block
	if b.Index != c.Layers || b.Ratio != 0 || b.Hash || b.Compressor != nil || b.Indexer != nil || b.Tid2Eid != nil {
		t.Errorf("MTP block bound as %+v", b)
	}
	for name, x := range map[string]*model.Tensor{"q_a": b.QA, "gate_exps": b.GateExps, "bias": b.ExpProbsBias,
		"e_proj": m.EProj, "h_proj": m.HProj, "enorm": m.ENorm, "hnorm": m.HNorm, "norm": m.Norm,
		"hc_head_fn": m.HCHeadFn, "hc_head_base": m.HCHeadBase, "hc_head_scale": m.HCHeadScale} {
		if x == nil || !strings.HasPrefix(x.Name, model.MTPPrefix) {
			t.Errorf("%s bound to %v", name, x)
		}
	}
	if m.HCHeadFn.Rows() != c.HC || m.EProj.Rows() != c.Embed {
		t.Errorf("shapes: hc_head_fn %d rows, e_proj %d rows", m.HCHeadFn.Rows(), m.EProj.Rows())
	}
}

func TestMTPInFileAndSeparate(t *testing.T) {
	c := synth.Tiny()
	// No MTP block: none bound.
	w, err := model.Load(buildParsed(t, synth.Options{Config: c, Seed: 3}))
	if err != nil {
		t.Fatal(err)
	}
	if w.MTP != nil {
		t.Fatal("MTP bound from a file without one")
	}
	// In the model's file.
	w, err = model.Load(buildParsed(t, synth.Options{Config: c, Seed: 3, MTP: synth.MTPInclude}))
	if err != nil {
		t.Fatal(err)
	}
	checkMTPBound(t, w)
	// A separate file, loaded onto a model without one.
	w, err = model.Load(buildParsed(t, synth.Options{Config: c, Seed: 3}))
	if err != nil {
		t.Fatal(err)
	}
	mf := buildParsed(t, synth.Options{Config: c, Seed: 3, MTP: synth.MTPOnly})
	if err := model.LoadMTP(w, mf); err != nil {
		t.Fatal(err)
	}
	checkMTPBound(t, w)
	// The model's own file is not an MTP file: its block is missing.
	if err := model.LoadMTP(w, buildParsed(t, synth.Options{Config: c, Seed: 3})); err == nil ||
		!strings.Contains(err.Error(), "MTP file: mtp.0.e_proj.weight: missing") {
		t.Errorf("a model file as MTP file: %v", err)
	}
	// A file with the model and the block serves as an MTP file too (the
	// model's tensors are not used).
	if err := model.LoadMTP(w, buildParsed(t, synth.Options{Config: c, Seed: 3, MTP: synth.MTPInclude})); err != nil {
		t.Errorf("a model file with its MTP block as MTP file: %v", err)
	}
	// An MTP file of another model size.
	other := c
	other.Embed = 128
	of := buildParsed(t, synth.Options{Config: other, Seed: 3, MTP: synth.MTPOnly})
	var le *model.LayoutError
	if err := model.LoadMTP(w, of); !errors.As(err, &le) || !strings.Contains(err.Error(), "mtp.0.e_proj.weight: shape [128, 128], want [64, 64]") {
		t.Errorf("MTP file of another size: %v", err)
	}
	// A compressed MTP block is refused.
	cr := c
	cr.CompressRatios = append(append([]int(nil), c.CompressRatios...), 4)
	if _, err := synth.Build(synth.Options{Config: cr, MTP: synth.MTPInclude}); err == nil {
		t.Error("synth built a compressed MTP block")
	}
	f := buildParsed(t, synth.Options{Config: c, Seed: 3, MTP: synth.MTPInclude})
	if err := model.ValidateTensors(&cr, f); err == nil || !strings.Contains(err.Error(), "compress ratio 4") {
		t.Errorf("compressed MTP block: %v", err)
	}
}

func TestMTPValidateListsProblems(t *testing.T) {
	c := synth.Tiny()
	typed := validTable(t, &c, append(model.ExpectedTensors(&c), model.MTPTensors(&c)...))
	var edited []gguf.TensorSpec
	for _, ts := range typed {
		switch ts.Name {
		case "mtp.0.h_proj.weight":
			continue
		case "mtp.0.ffn_up_exps.weight":
			ts.Type = quant.F16
		case "mtp.0.hc_head_base.weight":
			ts.Dims = []uint64{5}
		}
		edited = append(edited, ts)
	}
	edited = append(edited, gguf.TensorSpec{Name: "mtp.0.attn_compressor_kv.weight", Type: quant.F32, Dims: []uint64{64, 128}})
	err := model.ValidateTensors(&c, parse(t, c.Metadata(), edited))
	for _, want := range []string{"mtp.0.h_proj.weight: missing", "mtp.0.ffn_gate_exps/ffn_up_exps: types Q8_0 and F16 differ",
		"mtp.0.hc_head_base.weight: shape [5], want [4]", "mtp.0.attn_compressor_kv.weight: unexpected tensor"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q not reported in: %v", want, err)
		}
	}
	if n := len(model.MTPTensors(&c)); n != 32 {
		t.Errorf("%d MTP tensors, want 32 (as ds4's mtp_weights_bind: 24 of the block, 8 of the draft)", n)
	}
}

// FuzzLoadMTP loads arbitrary bytes as a separate MTP file onto a small
// model: a file that does not parse or does not fit is an error, never a
// panic; a file LoadMTP accepts binds every tensor of the block, and the
// CPU backend can be built on it.
func FuzzLoadMTP(f *testing.F) {
	c := synth.Tiny()
	c.Layers, c.HashLayers = 2, 1
	c.CompressRatios, c.SwigluClamp = c.CompressRatios[:2], c.SwigluClamp[:2]
	c.Experts, c.Vocab = 4, 320
	main, err := synth.Build(synth.Options{Config: c, Seed: 1})
	if err != nil {
		f.Fatal(err)
	}
	mtp, err := synth.Build(synth.Options{Config: c, Seed: 2, MTP: synth.MTPOnly})
	if err != nil {
		f.Fatal(err)
	}
	mf, err := gguf.Parse(main)
	if err != nil {
		f.Fatal(err)
	}
	w, err := model.Load(mf)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(mtp)
	f.Add(mtp[:len(mtp)/2])
	f.Add(main)
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := gguf.Parse(data)
		if err != nil {
			return
		}
		ww := *w
		ww.MTP = nil
		if err := model.LoadMTP(&ww, file); err != nil {
			if ww.MTP != nil {
				t.Fatalf("LoadMTP failed (%v) but bound a block", err)
			}
			return
		}
		m := ww.MTP
		if m == nil || m.EProj == nil || m.HProj == nil || m.HCHeadFn == nil || m.Block.QA == nil || m.Block.DownExps == nil {
			t.Fatalf("LoadMTP accepted the file but left tensors unbound: %+v", m)
		}
		be, err := cpu.New(&ww, cpu.Options{Threads: 1})
		if err != nil {
			t.Fatalf("an accepted MTP file: cpu backend: %v", err)
		}
		be.Close()
	})
}

// TestWeightsBytes checks that Weights.Tensors lists every tensor of a
// synthetic file once (its bytes add up to the file's tensor data), with
// and without the MTP block, in two schemes.
func TestWeightsBytes(t *testing.T) {
	c := synth.Tiny()
	for _, o := range []synth.Options{{Config: c, Seed: 3}, {Config: c, Seed: 3, MTP: synth.MTPInclude},
		{Config: c, Seed: 3, Scheme: model.SchemeQ8, MTP: synth.MTPInclude}} {
		f := buildParsed(t, o)
		w, err := model.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		var want int64
		for i := range f.Tensors {
			want += int64(len(f.TensorData(&f.Tensors[i])))
		}
		ts := w.Tensors()
		seen := map[string]bool{}
		for _, x := range ts {
			if seen[x.Name] {
				t.Fatalf("%s listed twice", x.Name)
			}
			seen[x.Name] = true
		}
		if len(ts) != len(f.Tensors) || w.Bytes() != want {
			t.Fatalf("MTP %v, scheme %q: %d tensors of %d bytes, want the file's %d of %d", o.MTP, o.Scheme, len(ts), w.Bytes(), len(f.Tensors), want)
		}
	}
}
