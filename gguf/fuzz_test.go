package gguf

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"ds4go/quant"
)

// FuzzParse parses arbitrary bytes. A failure must be a *FormatError inside
// the input; a success must describe a consistent file, which Rewrite
// either reproduces (re-parsing to the same metadata, tensors and data) or
// declines with ErrLayoutMismatch.
func FuzzParse(f *testing.F) {
	for _, s := range seedFiles() {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			if file != nil {
				t.Fatalf("Parse returned a File and an error")
			}
			checkFormatError(t, "fuzz input", data, err)
			return
		}
		checkParsed(t, file, data)

		var out bytes.Buffer
		err = Rewrite(file, &out)
		if errors.Is(err, ErrLayoutMismatch) {
			if out.Len() != 0 {
				t.Fatalf("Rewrite wrote %d bytes before ErrLayoutMismatch", out.Len())
			}
			return
		}
		if err != nil {
			t.Fatalf("Rewrite of a parsed file: %v", err)
		}
		// The sequential layout matched, so the sizes agree and only padding
		// bytes (zeroed by the writer) may differ.
		if out.Len() != len(data) {
			t.Fatalf("Rewrite wrote %d bytes, the input has %d", out.Len(), len(data))
		}
		again, err := Parse(out.Bytes())
		if err != nil {
			t.Fatalf("re-parse of the rewritten file: %v", err)
		}
		checkParsed(t, again, out.Bytes())
		if d := diffFiles(file, again); d != "" {
			t.Fatalf("rewritten file differs: %s", d)
		}
		// Rewriting the rewrite is byte-identical.
		var out2 bytes.Buffer
		if err := Rewrite(again, &out2); err != nil || !bytes.Equal(out2.Bytes(), out.Bytes()) {
			t.Fatalf("second Rewrite: %v (identical %v)", err, bytes.Equal(out2.Bytes(), out.Bytes()))
		}
	})
}

// checkParsed verifies the invariants of a successfully parsed file.
func checkParsed(t *testing.T, f *File, data []byte) {
	t.Helper()
	if f.Version != 2 && f.Version != 3 {
		t.Fatalf("Version %d", f.Version)
	}
	if f.Alignment == 0 || f.Alignment&(f.Alignment-1) != 0 || f.Alignment > math.MaxUint32 {
		t.Fatalf("Alignment %d", f.Alignment)
	}
	if f.DataOffset%f.Alignment != 0 {
		t.Fatalf("DataOffset %d not aligned to %d", f.DataOffset, f.Alignment)
	}
	if len(f.Tensors) > 0 && f.DataOffset > uint64(len(data)) {
		t.Fatalf("DataOffset %d past the %d-byte file", f.DataOffset, len(data))
	}
	if f.Size() != int64(len(data)) || (len(data) > 0 && &f.Bytes()[0] != &data[0]) {
		t.Fatalf("Bytes/Size do not describe the input")
	}
	for i, kv := range f.KVs {
		if v, ok := f.KV(kv.Key); !ok || !valueEqual(v, kv.Value) {
			t.Fatalf("KV(%q) does not return kv[%d]", kv.Key, i)
		}
		checkValue(t, kv.Value, data, 0)
	}
	if len(f.kvIndex) != len(f.KVs) || len(f.tIndex) != len(f.Tensors) {
		t.Fatalf("index sizes %d/%d for %d kvs, %d tensors", len(f.kvIndex), len(f.tIndex), len(f.KVs), len(f.Tensors))
	}
	if v, ok := f.KV("general.alignment"); ok {
		if v.Type != TypeUint32 || v.U != f.Alignment {
			t.Fatalf("general.alignment %s but Alignment %d", v.Format(1), f.Alignment)
		}
	} else if f.Alignment != DefaultAlignment {
		t.Fatalf("Alignment %d without general.alignment", f.Alignment)
	}
	order := make([]*TensorInfo, len(f.Tensors))
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		order[i] = ti
		if ti.Index != i || len(ti.Dims) == 0 || len(ti.Dims) > MaxDims || !ti.Type.Known() {
			t.Fatalf("tensor %d: index %d, dims %v, type %s", i, ti.Index, ti.Dims, ti.Type)
		}
		for _, d := range ti.Dims {
			if d == 0 {
				t.Fatalf("tensor %q has a zero dimension", ti.Name)
			}
		}
		if ti.Elements() > maxDimProduct {
			t.Fatalf("tensor %q has %d elements", ti.Name, ti.Elements())
		}
		if size, err := ti.Type.TensorBytes(ti.Dims); err != nil || size != ti.Size || size == 0 {
			t.Fatalf("tensor %q: Size %d, TensorBytes %d, %v", ti.Name, ti.Size, size, err)
		}
		if ti.Offset%f.Alignment != 0 {
			t.Fatalf("tensor %q offset %d misaligned", ti.Name, ti.Offset)
		}
		end := f.DataOffset + ti.Offset + ti.Size
		if ti.Offset > uint64(len(data)) || end > uint64(len(data)) || end < f.DataOffset {
			t.Fatalf("tensor %q [%d, %d) outside the %d-byte file", ti.Name, f.DataOffset+ti.Offset, end, len(data))
		}
		d := f.TensorData(ti)
		if uint64(len(d)) != ti.Size || cap(d) != len(d) || !within(d, data) || &d[0] != &data[f.DataOffset+ti.Offset] {
			t.Fatalf("tensor %q data is not the file's bytes at its offset", ti.Name)
		}
		if p, ok := f.Tensor(ti.Name); !ok || p != ti {
			t.Fatalf("Tensor(%q) does not return tensor[%d]", ti.Name, i)
		}
		_ = ti.ShapeString()
	}
	sort.Slice(order, func(a, b int) bool { return order[a].Offset < order[b].Offset })
	for k := 1; k < len(order); k++ {
		if order[k-1].Offset+order[k-1].Size > order[k].Offset {
			t.Fatalf("tensors %q and %q overlap", order[k-1].Name, order[k].Name)
		}
	}
}

// checkValue verifies a parsed value's shape and exercises its accessors.
func checkValue(t *testing.T, v Value, data []byte, depth int) {
	t.Helper()
	switch {
	case v.Type.scalarSize() > 0:
		if v.Type == TypeBool && v.U > 1 {
			t.Fatalf("bool value %d", v.U)
		}
	case v.Type == TypeString:
	case v.Type == TypeArray:
		if depth >= maxNestDepth {
			t.Fatalf("arrays nested %d deep", depth+1)
		}
		switch {
		case v.ElemType == TypeString:
			if uint64(len(v.Strings)) != v.Count || v.Raw != nil || v.Elems != nil {
				t.Fatalf("string array of %d holds %d strings", v.Count, len(v.Strings))
			}
		case v.ElemType == TypeArray:
			if uint64(len(v.Elems)) != v.Count || v.Raw != nil || v.Strings != nil {
				t.Fatalf("array of arrays of %d holds %d", v.Count, len(v.Elems))
			}
			for _, e := range v.Elems {
				if e.Type != TypeArray {
					t.Fatalf("array of arrays holds a %s", e.Type)
				}
				checkValue(t, e, data, depth+1)
			}
		case v.ElemType.scalarSize() > 0:
			if uint64(len(v.Raw)) != v.Count*uint64(v.ElemType.scalarSize()) || !within(v.Raw, data) || cap(v.Raw) != len(v.Raw) {
				t.Fatalf("array of %d %s holds %d raw bytes", v.Count, v.ElemType, len(v.Raw))
			}
			for i := range v.Len() {
				if e := v.Elem(i); e.Type != v.ElemType || (e.Type == TypeBool && e.U > 1) {
					t.Fatalf("element %d of an array of %s is %s", i, v.ElemType, e.Format(1))
				}
			}
		default:
			t.Fatalf("array of %s", v.ElemType)
		}
		_, _ = v.AsUint32s()
		_, _ = v.AsInt32s()
		_, _ = v.AsFloat32s()
		_, _ = v.AsStrings()
	default:
		t.Fatalf("value of type %s", v.Type)
	}
	_ = v.Format(4)
	_, _ = v.AsUint64()
	_, _ = v.AsInt64()
	_, _ = v.AsFloat64()
	_, _ = v.AsBool()
	_, _ = v.AsString()
}

// within reports whether the non-empty slice b lies inside buf's memory.
func within(b, buf []byte) bool {
	if len(b) == 0 {
		return true
	}
	if len(buf) == 0 {
		return false
	}
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(buf))
}

// diffFiles describes the first difference between two parsed files'
// metadata, tensor directories and tensor data ("" if none).
func diffFiles(a, b *File) string {
	if a.Version != b.Version || a.Alignment != b.Alignment || a.DataOffset != b.DataOffset {
		return fmt.Sprintf("version/alignment/data offset %d/%d/%d vs %d/%d/%d", a.Version, a.Alignment, a.DataOffset, b.Version, b.Alignment, b.DataOffset)
	}
	if len(a.KVs) != len(b.KVs) || len(a.Tensors) != len(b.Tensors) {
		return fmt.Sprintf("%d kvs, %d tensors vs %d, %d", len(a.KVs), len(a.Tensors), len(b.KVs), len(b.Tensors))
	}
	for i := range a.KVs {
		if a.KVs[i].Key != b.KVs[i].Key || !valueEqual(a.KVs[i].Value, b.KVs[i].Value) {
			return fmt.Sprintf("kv %d: %q %s vs %q %s", i, a.KVs[i].Key, a.KVs[i].Value.Format(4), b.KVs[i].Key, b.KVs[i].Value.Format(4))
		}
	}
	for i := range a.Tensors {
		x, y := &a.Tensors[i], &b.Tensors[i]
		if x.Name != y.Name || x.Type != y.Type || x.Offset != y.Offset || x.Size != y.Size || !equalDims(x.Dims, y.Dims) {
			return fmt.Sprintf("tensor %d: %+v vs %+v", i, *x, *y)
		}
		if !bytes.Equal(a.TensorData(x), b.TensorData(y)) {
			return fmt.Sprintf("tensor %d %q: data differs", i, x.Name)
		}
	}
	return ""
}

type seedFile struct {
	name string
	data []byte
	bad  bool // Parse must fail
}

// seedFiles returns the seed corpus: small valid files and corrupt variants,
// each under 4 KiB.
func seedFiles() []seedFile {
	var seeds []seedFile
	bad := false
	add := func(name string, data []byte) { seeds = append(seeds, seedFile{name, data, bad}) }
	mustBuild := func(b *Builder) []byte {
		var buf bytes.Buffer
		l, err := b.Layout()
		if err != nil {
			panic(err)
		}
		if err := b.Write(&buf, func(i int) ([]byte, error) { return fill(l.Sizes[i], uint32(i)), nil }); err != nil {
			panic(err)
		}
		return buf.Bytes()
	}

	add("empty-v3", mustBuild(&Builder{}))
	add("empty-v2-unpadded", hdr(2, 0, 0).b)

	small := &Builder{}
	small.Add("general.architecture", Str("deepseek4"))
	small.Add("general.alignment", U32(64))
	small.Add("n", U32(7))
	small.Add("ok", Bool(true))
	small.Add("scale", F32(0.5))
	small.Add("tokens", StrArray([]string{"a", "bc", ""}))
	small.Add("ratios", I32Array([]int32{-1, 4}))
	small.Add("nested", nested(U32Array([]uint32{1}), StrArray([]string{"x"})))
	small.AddTensor("token_embd.weight", quant.F16, 4, 3)
	small.AddTensor("blk.0.ffn.weight", quant.Q8_0, 32, 2)
	small.AddTensor("norm", quant.F32, 5)
	smallFile := mustBuild(small)
	add("small-align64", smallFile)

	all := allValuesKVs()
	half := len(all) / 2
	add("value-types-1-v2", mustBuild(&Builder{Version: 2, KVs: all[:half]}))
	add("value-types-2", mustBuild(&Builder{KVs: all[half:]}))

	quants := &Builder{}
	quants.AddTensor("q2_k", quant.Q2_K, 256)
	quants.AddTensor("iq2_xxs", quant.IQ2_XXS, 256)
	quants.AddTensor("bf16", quant.BF16, 2, 1, 1, 3)
	add("quant-tensors", mustBuild(quants))

	// The seeds that found bugs: an f32 signalling NaN (changed by Rewrite
	// before payload-preserving conversion) and a tensor-less file whose
	// alignment puts the data section 2 GiB away (Rewrite tried to lay out
	// a 2 GiB header).
	add("f32-snan", hdr(3, 0, 1).kv("x", TypeFloat32).u32(sNaN32).padTo(32).b)
	add("align-2g-no-tensors", hdr(3, 0, 1).kv("general.alignment", TypeUint32).u32(1<<31).b)

	// Valid but not sequential: Rewrite declines.
	add("reversed-tensors", hdr(3, 2, 0).tensor("a", quant.F32, 32, 8).tensor("b", quant.F32, 0, 8).padTo(32).raw(fill(64, 9)...).b)
	add("trailing-bytes", append(append([]byte(nil), smallFile...), 1, 2, 3))
	// Sequential, with non-zero padding: Rewrite zeroes it.
	add("garbage-padding", hdr(3, 1, 0).tensor("w", quant.F32, 0, 1).raw(0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x11).raw(1, 2, 3, 4).raw(fill(28, 3)...).b)

	// Corrupt variants.
	bad = true
	add("truncated-half", smallFile[:len(smallFile)/2])
	add("truncated-header", smallFile[:100])
	flip := func(name string, off int, b ...byte) {
		d := append([]byte(nil), smallFile...)
		copy(d[off:], b)
		add(name, d)
	}
	flip("bad-magic", 0, 'G', 'G', 'M', 'L')
	flip("version-1", 4, 1)
	flip("big-endian", 4, 0, 0, 0, 3)
	flip("huge-tensor-count", 8, 0, 0, 0, 0, 0, 0, 0, 0x40)
	flip("huge-kv-count", 16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	flip("key-length", 24, 0xff, 0xff, 0, 0)
	flip("value-type", 24+8+20, 13)
	add("bool-2", oneKV(TypeBool).u8(2).b)
	add("nested-too-deep", badFileData("arrays nested 5 deep"))
	add("duplicate-key", badFileData("duplicate key"))
	add("duplicate-tensor", badFileData("duplicate tensor name"))
	add("overlap", badFileData("overlapping tensors"))
	add("misaligned", badFileData("misaligned offset"))
	add("offset-past-eof", badFileData("offset past EOF"))
	add("unknown-ggml-type", badFileData("unknown ggml type 4"))
	add("n-dims-5", badFileData("n_dims 5"))
	add("dims-overflow", badFileData("dims product wraps to 0"))
	add("alignment-48", badFileData("alignment 48"))
	add("string-array-cut", badFileData("string in array past EOF"))
	return seeds
}

func badFileData(name string) []byte {
	for _, b := range badFiles() {
		if b.name == name {
			return b.data
		}
	}
	panic("no bad file " + name)
}

var updateCorpus = flag.Bool("update", false, "rewrite the generated seed corpus under testdata/fuzz/FuzzParse")

const corpusDir = "testdata/fuzz/FuzzParse"

// corpusFile encodes data in the go test fuzz v1 corpus format.
func corpusFile(data []byte) []byte {
	return []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(data)) + ")\n")
}

// TestSeedCorpus checks that the committed seed corpus is what seedFiles
// generates (go test -run TestSeedCorpus -update rewrites it) and that every
// file in the corpus directory, crashers kept as regression seeds included,
// is well-formed.
func TestSeedCorpus(t *testing.T) {
	for _, s := range seedFiles() {
		path := filepath.Join(corpusDir, "seed-"+s.name)
		want := corpusFile(s.data)
		if len(want) >= 4096 {
			t.Errorf("seed %s is %d bytes, over 4 KiB", s.name, len(want))
		}
		if *updateCorpus {
			if err := os.MkdirAll(corpusDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is missing or stale (%v); run go test ./gguf -run TestSeedCorpus -update", path, err)
		}
	}
	ents, err := os.ReadDir(corpusDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(corpusDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if !strings.HasPrefix(s, "go test fuzz v1\n[]byte(") || !strings.HasSuffix(strings.TrimSpace(s), ")") {
			t.Errorf("%s is not a go test fuzz v1 []byte corpus file", e.Name())
			continue
		}
		q := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(s), "go test fuzz v1\n[]byte("), ")")
		if _, err := strconv.Unquote(q); err != nil {
			t.Errorf("%s: %v", e.Name(), err)
		}
	}
}

// TestSeedsBehave pins what each seed does, so the corpus keeps covering
// both the success and the failure paths.
func TestSeedsBehave(t *testing.T) {
	mismatch := map[string]bool{"empty-v2-unpadded": true, "reversed-tensors": true, "trailing-bytes": true, "align-2g-no-tensors": true}
	for _, s := range seedFiles() {
		f, err := Parse(s.data)
		if (err != nil) != s.bad {
			t.Errorf("seed %s: Parse error %v", s.name, err)
			continue
		}
		if err != nil {
			checkFormatError(t, s.name, s.data, err)
			continue
		}
		checkParsed(t, f, s.data)
		var out bytes.Buffer
		err = Rewrite(f, &out)
		if mismatch[s.name] != errors.Is(err, ErrLayoutMismatch) || (!mismatch[s.name] && err != nil) {
			t.Errorf("seed %s: Rewrite = %v", s.name, err)
		}
		if identical := bytes.Equal(out.Bytes(), s.data); !mismatch[s.name] && identical != (s.name != "garbage-padding") {
			t.Errorf("seed %s: Rewrite byte-identical = %v", s.name, identical)
		}
	}
}
