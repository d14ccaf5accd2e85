package convert

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestSafeWriterRoundTrip writes tensors in pieces and reads them back with
// the reader, including a name that needs JSON escaping and metadata.
func TestSafeWriterRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	specs := []WriteSpec{
		{Name: "logits", DType: F32, Shape: []int64{2, 3}},
		{Name: "positions", DType: I32, Shape: []int64{2}},
		{Name: `odd "name"\`, DType: BF16, Shape: []int64{1}},
		{Name: "empty", DType: F32, Shape: []int64{0, 7}},
	}
	sw, err := NewSafeWriter(&buf, specs, map[string]string{"b": "2", "a": "x\ny"})
	if err != nil {
		t.Fatal(err)
	}
	if sw.Remaining() != 24+8+2 {
		t.Fatalf("remaining %d", sw.Remaining())
	}
	if err := sw.WriteF32([]float32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := sw.WriteF32([]float32{4, float32(math.Inf(-1)), -6}); err != nil {
		t.Fatal(err)
	}
	if err := sw.Close(); err == nil {
		t.Error("Close with data missing succeeded")
	}
	if err := sw.WriteI32([]int32{-1, 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := sw.Write([]byte{0x80, 0x3f}); err != nil {
		t.Fatal(err)
	}
	if err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(buf.Bytes()); n%8 != 0 {
		t.Errorf("header length %d not a multiple of 8", n)
	}
	path := filepath.Join(t.TempDir(), "w.safetensors")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sf, err := OpenSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	if m := sf.Header.Metadata; m["a"] != "x\ny" || m["b"] != "2" || len(m) != 2 {
		t.Errorf("metadata %v", m)
	}
	want := map[string][]byte{
		"logits":      f32Bytes(1, 2, 3, 4, float32(math.Inf(-1)), -6),
		"positions":   {0xff, 0xff, 0xff, 0xff, 7, 0, 0, 0},
		`odd "name"\`: {0x80, 0x3f},
		"empty":       {},
	}
	for i, s := range specs {
		ti, ok := sf.Header.Tensor(s.Name)
		if !ok {
			t.Fatalf("%q missing", s.Name)
		}
		if ti.DType != s.DType || len(ti.Shape) != len(s.Shape) {
			t.Errorf("%q: %s %v, want %s %v", s.Name, ti.DType, ti.Shape, s.DType, s.Shape)
		}
		for j := range s.Shape {
			if ti.Shape[j] != s.Shape[j] {
				t.Errorf("%q: shape %v, want %v", s.Name, ti.Shape, s.Shape)
			}
		}
		got, err := sf.ReadAll(ti)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[s.Name]) {
			t.Errorf("tensor %d %q: %v, want %v", i, s.Name, got, want[s.Name])
		}
	}
}

func f32Bytes(xs ...float32) []byte {
	var b []byte
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func TestSafeWriterErrors(t *testing.T) {
	bad := [][]WriteSpec{
		{{Name: "", DType: F32, Shape: []int64{1}}},
		{{Name: "__metadata__", DType: F32, Shape: []int64{1}}},
		{{Name: "a", DType: F32, Shape: []int64{1}}, {Name: "a", DType: F32, Shape: []int64{1}}},
		{{Name: "a", DType: "F33", Shape: []int64{1}}},
		{{Name: "a", DType: F32, Shape: []int64{-1}}},
		{{Name: "a", DType: F4E2M1, Shape: []int64{3}}},
		{{Name: "a", DType: F32, Shape: []int64{1 << 40, 1 << 40}}},
		{{Name: "a", DType: F32, Shape: make([]int64, 9)}},
	}
	for i, specs := range bad {
		if _, err := NewSafeWriter(&bytes.Buffer{}, specs, nil); err == nil {
			t.Errorf("case %d: %+v accepted", i, specs)
		}
	}
	sw, err := NewSafeWriter(&bytes.Buffer{}, []WriteSpec{{Name: "a", DType: F32, Shape: []int64{1}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sw.WriteF32([]float32{1, 2}); !errors.Is(err, ErrSafeWriterOverflow) {
		t.Errorf("overflow: %v", err)
	}
	if err := sw.Close(); err == nil {
		t.Error("Close after an overflow succeeded")
	}
	if err := WriteSafetensors(&bytes.Buffer{}, []WriteTensor{{WriteSpec{Name: "a", DType: F32, Shape: []int64{2}}, make([]byte, 4)}}, nil); err == nil {
		t.Error("WriteSafetensors with short data succeeded")
	}
}
