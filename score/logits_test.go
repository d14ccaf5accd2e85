package score

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ds4go/convert"
)

func TestLogitsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.safetensors")
	w, err := CreateLogits(path, 3, []int32{4, 5}, map[string]string{"model": "m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteRow([]float32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteRow([]float32{1, 2}); err == nil {
		t.Error("short row accepted")
	}
	if err := w.WriteRow([]float32{-1, 0, 0.5}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteRow([]float32{0, 0, 0}); err == nil {
		t.Error("extra row accepted")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := OpenLogits(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Rows != 2 || f.Vocab != 3 || f.Positions[1] != 5 || f.Metadata["model"] != "m" {
		t.Errorf("%+v", f)
	}
	r, err := f.Row(1, nil)
	if err != nil || r[0] != -1 || r[2] != 0.5 {
		t.Errorf("row 1: %v %v", r, err)
	}
	if err := f.Match(3, []int32{4, 5}); err != nil {
		t.Error(err)
	}
	for _, c := range []struct {
		vocab int
		pos   []int32
		want  string
	}{
		{4, []int32{4, 5}, "vocabulary of 3"},
		{3, []int32{4}, "2 rows, this run produces 1"},
		{3, []int32{4, 6}, "row 1 is at position 5"},
	} {
		if err := f.Match(c.vocab, c.pos); err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Match(%d, %v): %v, want %q", c.vocab, c.pos, err, c.want)
		}
	}
	if _, err := f.Row(2, nil); err == nil {
		t.Error("row past the end accepted")
	}

	// An unfinished file is not left behind.
	path2 := filepath.Join(t.TempDir(), "partial.safetensors")
	w2, _ := CreateLogits(path2, 3, []int32{0, 1}, nil)
	w2.WriteRow([]float32{1, 2, 3})
	if err := w2.Close(); err == nil {
		t.Error("Close of a partial file succeeded")
	}
	if _, err := os.Stat(path2); !os.IsNotExist(err) {
		t.Errorf("partial file exists: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path2)); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

func writeST(t *testing.T, tensors []convert.WriteTensor) string {
	t.Helper()
	var b bytes.Buffer
	if err := convert.WriteSafetensors(&b, tensors, nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func f32s(xs ...float32) []byte {
	var b []byte
	for _, x := range xs {
		b = append(b, byte(math.Float32bits(x)), byte(math.Float32bits(x)>>8), byte(math.Float32bits(x)>>16), byte(math.Float32bits(x)>>24))
	}
	return b
}

func TestBadLogitsFiles(t *testing.T) {
	lg := func(dt convert.DType, shape []int64, data []byte) convert.WriteTensor {
		return convert.WriteTensor{WriteSpec: convert.WriteSpec{Name: TensorLogits, DType: dt, Shape: shape}, Data: data}
	}
	ps := func(dt convert.DType, shape []int64, data []byte) convert.WriteTensor {
		return convert.WriteTensor{WriteSpec: convert.WriteSpec{Name: TensorPositions, DType: dt, Shape: shape}, Data: data}
	}
	pos1 := []byte{0, 0, 0, 0}
	cases := []struct {
		name    string
		tensors []convert.WriteTensor
		want    string
	}{
		{"no logits", []convert.WriteTensor{ps(convert.I32, []int64{1}, pos1)}, `no "logits"`},
		{"no positions", []convert.WriteTensor{lg(convert.F32, []int64{1, 1}, f32s(1))}, `no "positions"`},
		{"f16 logits", []convert.WriteTensor{lg(convert.F16, []int64{1, 2}, make([]byte, 4)), ps(convert.I32, []int64{1}, pos1)}, "want F32"},
		{"1-d logits", []convert.WriteTensor{lg(convert.F32, []int64{2}, f32s(1, 2)), ps(convert.I32, []int64{1}, pos1)}, "want F32"},
		{"no rows", []convert.WriteTensor{lg(convert.F32, []int64{0, 2}, nil), ps(convert.I32, []int64{0}, nil)}, "rows ≥ 1"},
		{"positions count", []convert.WriteTensor{lg(convert.F32, []int64{2, 1}, f32s(1, 2)), ps(convert.I32, []int64{1}, pos1)}, "one per logits row"},
		{"positions dtype", []convert.WriteTensor{lg(convert.F32, []int64{1, 1}, f32s(1)), ps(convert.I64, []int64{1}, make([]byte, 8))}, "want I32"},
		{"negative position", []convert.WriteTensor{lg(convert.F32, []int64{1, 1}, f32s(1)), ps(convert.I32, []int64{1}, []byte{0xff, 0xff, 0xff, 0xff})}, "negative"},
	}
	for _, c := range cases {
		_, err := OpenLogits(writeST(t, c.tensors))
		if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an input error mentioning %q", c.name, err, c.want)
		}
	}
	// Not a safetensors file at all.
	junk := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(junk, []byte("hello, this is not safetensors"), 0o644)
	if _, err := OpenLogits(junk); err == nil || !errors.Is(err, ErrInput) {
		t.Errorf("junk: %v", err)
	}
	if _, err := OpenLogits(junk + ".missing"); err == nil {
		t.Error("missing file accepted")
	}
	// Non-finite values are found when the row is read.
	for _, v := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		f, err := OpenLogits(writeST(t, []convert.WriteTensor{lg(convert.F32, []int64{2, 2}, f32s(1, 2, 3, v)), ps(convert.I32, []int64{2}, make([]byte, 8))}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Row(0, nil); err != nil {
			t.Error(err)
		}
		if _, err := f.Row(1, nil); err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), "row 1") {
			t.Errorf("%v in row 1: %v", v, err)
		}
		f.Close()
	}
}

// FuzzOpenLogits checks that no file makes OpenLogits or Row panic, and
// that an accepted file's rows can all be read (or fail with an error).
func FuzzOpenLogits(f *testing.F) {
	var b bytes.Buffer
	convert.WriteSafetensors(&b, []convert.WriteTensor{
		{WriteSpec: convert.WriteSpec{Name: TensorPositions, DType: convert.I32, Shape: []int64{2}}, Data: make([]byte, 8)},
		{WriteSpec: convert.WriteSpec{Name: TensorLogits, DType: convert.F32, Shape: []int64{2, 2}}, Data: f32s(1, 2, 3, 4)},
	}, nil)
	f.Add(b.Bytes())
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "f.safetensors")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		lf, err := OpenLogits(path)
		if err != nil {
			return
		}
		defer lf.Close()
		if len(lf.Positions) != lf.Rows || lf.Rows < 1 || lf.Vocab < 1 {
			t.Fatalf("accepted %d rows × %d, %d positions", lf.Rows, lf.Vocab, len(lf.Positions))
		}
		for i := 0; i < min(lf.Rows, 4); i++ {
			if r, err := lf.Row(i, nil); err == nil && len(r) != lf.Vocab {
				t.Fatalf("row %d has %d values", i, len(r))
			}
		}
	})
}
