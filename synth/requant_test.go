package synth

import (
	"bytes"
	"math"
	"testing"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
)

// TestRequantize: an F32 model requantized to F32 keeps every tensor's
// bytes; requantized to q8 every tensor decodes to its f32 values within
// Q8_0/F16 rounding, and the file loads as the q8 scheme.
func TestRequantize(t *testing.T) {
	data, err := Build(Options{Config: Tiny(), Scheme: model.SchemeF32, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	src, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	same, err := Requantize(src, model.SchemeF32)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(same, data) {
		t.Error("F32 → F32 changed the file")
	}
	q8, err := Requantize(src, model.SchemeQ8)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(q8)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if w.Scheme != "q8" {
		t.Errorf("scheme %q", w.Scheme)
	}
	if v, _ := f.KV(KeyScheme); v.S != "q8" {
		t.Errorf("%s = %q", KeyScheme, v.S)
	}
	changed := 0
	for i := range src.Tensors {
		a := &src.Tensors[i]
		b, ok := f.Tensor(a.Name)
		if !ok {
			t.Fatalf("%s missing", a.Name)
		}
		if a.Type == quant.I32 {
			if !bytes.Equal(src.TensorData(a), f.TensorData(b)) {
				t.Errorf("%s: token map changed", a.Name)
			}
			continue
		}
		x := make([]float32, a.Elements())
		y := make([]float32, b.Elements())
		if err := quant.Dequantize(a.Type, src.TensorData(a), x); err != nil {
			t.Fatal(err)
		}
		if err := quant.Dequantize(b.Type, f.TensorData(b), y); err != nil {
			t.Fatal(err)
		}
		var md, ma float64
		for j := range x {
			md = max(md, math.Abs(float64(x[j]-y[j])))
			ma = max(ma, math.Abs(float64(x[j])))
		}
		if md > 0 {
			changed++
		}
		if md > ma/100 {
			t.Errorf("%s (%v → %v): max difference %g of max %g", a.Name, a.Type, b.Type, md, ma)
		}
	}
	if changed == 0 {
		t.Error("no tensor changed")
	}
}
