package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ds4go/quant"
)

// enc assembles GGUF bytes field by field, for hand-made (often hostile) files.
type enc struct{ b []byte }

func (e *enc) u8(x uint8) *enc   { e.b = append(e.b, x); return e }
func (e *enc) u32(x uint32) *enc { e.b = binary.LittleEndian.AppendUint32(e.b, x); return e }
func (e *enc) u64(x uint64) *enc { e.b = binary.LittleEndian.AppendUint64(e.b, x); return e }
func (e *enc) raw(b ...byte) *enc {
	e.b = append(e.b, b...)
	return e
}
func (e *enc) str(s string) *enc { return e.u64(uint64(len(s))).raw([]byte(s)...) }

// hdr starts a file: magic, version, tensor_count, kv_count.
func hdr(version uint32, nTensors, nKV uint64) *enc {
	return (&enc{}).raw([]byte(Magic)...).u32(version).u64(nTensors).u64(nKV)
}

// kv appends a key and a value type; the caller appends the value.
func (e *enc) kv(key string, t ValueType) *enc { return e.str(key).u32(uint32(t)) }

// tensor appends a tensor directory entry.
func (e *enc) tensor(name string, t quant.Type, off uint64, dims ...uint64) *enc {
	e.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		e.u64(d)
	}
	return e.u32(uint32(t)).u64(off)
}

// padTo appends zeros up to the next multiple of a.
func (e *enc) padTo(a int) *enc {
	for len(e.b)%a != 0 {
		e.b = append(e.b, 0)
	}
	return e
}

func (e *enc) zeros(n int) *enc { e.b = append(e.b, make([]byte, n)...); return e }

// array builds a numeric array value of type t from widened elements.
func array(t ValueType, xs ...Value) Value {
	return scalarArray(t, len(xs), func(i int) Value { x := xs[i]; x.Type = t; return x })
}

// nested builds an array of arrays.
func nested(elems ...Value) Value {
	return Value{Type: TypeArray, ElemType: TypeArray, Count: uint64(len(elems)), Elems: elems}
}

// valueEqual compares two values by content: floats by their bits, arrays by
// elements (nil and empty slices alike).
func valueEqual(a, b Value) bool {
	if a.Type != b.Type {
		return false
	}
	switch {
	case a.Type == TypeFloat32:
		return f64to32(a.F) == f64to32(b.F)
	case a.Type == TypeFloat64:
		return math.Float64bits(a.F) == math.Float64bits(b.F)
	case a.Type == TypeBool:
		return (a.U != 0) == (b.U != 0)
	case isUnsigned(a.Type):
		return a.U == b.U
	case isSigned(a.Type):
		return a.I == b.I
	case a.Type == TypeString:
		return a.S == b.S
	case a.Type == TypeArray:
		if a.ElemType != b.ElemType || a.Count != b.Count {
			return false
		}
		switch a.ElemType {
		case TypeString:
			if len(a.Strings) != len(b.Strings) {
				return false
			}
			for i := range a.Strings {
				if a.Strings[i] != b.Strings[i] {
					return false
				}
			}
			return true
		case TypeArray:
			if len(a.Elems) != len(b.Elems) {
				return false
			}
			for i := range a.Elems {
				if !valueEqual(a.Elems[i], b.Elems[i]) {
					return false
				}
			}
			return true
		}
		return bytes.Equal(a.Raw, b.Raw)
	}
	return false
}

// fill returns n deterministic pseudo-random bytes.
func fill(n uint64, seed uint32) []byte {
	b := make([]byte, n)
	x := seed*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// sNaN32 is a signalling float32 NaN, which a plain float32→float64
// conversion would quiet.
const sNaN32 = 0x7f800001

// allValuesKVs returns metadata with every value type the format has.
func allValuesKVs() []KV {
	return []KV{
		{"general.architecture", Str("test")},
		{"v.u8", U8(200)},
		{"v.i8", I8(-100)},
		{"v.u16", U16(65000)},
		{"v.i16", I16(-32000)},
		{"v.u32", U32(4000000000)},
		{"v.i32", I32(-2000000000)},
		{"v.u64", U64(1<<63 + 5)},
		{"v.i64", I64(math.MinInt64)},
		{"v.f32", F32(3.25)},
		{"v.f32.snan", F32(math.Float32frombits(sNaN32))},
		{"v.f32.negzero", F32(float32(math.Copysign(0, -1)))},
		{"v.f32.inf", F32(float32(math.Inf(-1)))},
		{"v.f32.denormal", F32(math.Float32frombits(1))},
		{"v.f64", F64(-1e300)},
		{"v.f64.nan", F64(math.Float64frombits(0x7ff0000000000001))},
		{"v.bool.true", Bool(true)},
		{"v.bool.false", Bool(false)},
		{"v.string", Str("héllo\x00wörld")},
		{"v.string.empty", Str("")},
		{"a.u8", array(TypeUint8, Value{U: 0}, Value{U: 255})},
		{"a.i8", array(TypeInt8, Value{I: -128}, Value{I: 127})},
		{"a.u16", array(TypeUint16, Value{U: 1}, Value{U: 65535})},
		{"a.i16", array(TypeInt16, Value{I: -32768}, Value{I: 5})},
		{"a.u32", U32Array([]uint32{1, 2, math.MaxUint32})},
		{"a.i32", I32Array([]int32{-1, 0, math.MaxInt32})},
		{"a.u64", array(TypeUint64, Value{U: math.MaxUint64})},
		{"a.i64", array(TypeInt64, Value{I: -1}, Value{I: math.MaxInt64})},
		{"a.f32", F32Array([]float32{0.5, -2, float32(math.Inf(1))})},
		{"a.f64", array(TypeFloat64, Value{F: math.Pi}, Value{F: -0.0})},
		{"a.bool", array(TypeBool, Value{U: 1}, Value{U: 0}, Value{U: 1})},
		{"a.string", StrArray([]string{"a", "", "ccc"})},
		{"a.empty.u8", array(TypeUint8)},
		{"a.empty.f64", array(TypeFloat64)},
		{"a.empty.string", StrArray(nil)},
		{"a.empty.array", nested()},
		{"a.nested", nested(I32Array([]int32{1, 2}), StrArray([]string{"x"}), nested(array(TypeUint8, Value{U: 7})))},
		// The deepest nesting the format allows here: four levels of arrays.
		{"a.nested.deep", nested(nested(nested(array(TypeUint16, Value{U: 9}))))},
	}
}

// testBuilder returns a builder with every value type and tensors of several
// ggml types; align 0 means the default alignment (no general.alignment key).
func testBuilder(align uint32) *Builder {
	b := &Builder{}
	if align != 0 {
		b.Add("general.alignment", U32(align))
		b.Alignment = uint64(align) // both set, agreeing
	}
	for _, kv := range allValuesKVs() {
		b.Add(kv.Key, kv.Value)
	}
	b.AddTensor("f32", quant.F32, 3, 2)
	b.AddTensor("f16", quant.F16, 5)
	b.AddTensor("q8_0", quant.Q8_0, 64, 3)
	b.AddTensor("q2_k", quant.Q2_K, 256, 2)
	b.AddTensor("iq2_xxs", quant.IQ2_XXS, 512)
	b.AddTensor("bf16.4d", quant.BF16, 3, 1, 2, 2)
	b.AddTensor("i8", quant.I8, 1)
	return b
}

// build writes b with deterministic tensor data, returning the file and the data.
func build(t testing.TB, b *Builder) ([]byte, [][]byte) {
	t.Helper()
	l, err := b.Layout()
	if err != nil {
		t.Fatalf("Layout: %v", err)
	}
	datas := make([][]byte, len(b.Tensors))
	for i := range datas {
		datas[i] = fill(l.Sizes[i], uint32(i))
	}
	var buf bytes.Buffer
	if err := b.Write(&buf, func(i int) ([]byte, error) { return datas[i], nil }); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if uint64(buf.Len()) != l.TotalSize {
		t.Fatalf("wrote %d bytes, layout says %d", buf.Len(), l.TotalSize)
	}
	if !bytes.Equal(buf.Bytes()[:len(l.Header)], l.Header) {
		t.Fatalf("written header differs from Layout.Header")
	}
	return buf.Bytes(), datas
}

// checkFile verifies that f holds exactly what b declared.
func checkFile(t *testing.T, f *File, b *Builder, datas [][]byte) {
	t.Helper()
	l, err := b.Layout()
	if err != nil {
		t.Fatal(err)
	}
	wantVersion := b.Version
	if wantVersion == 0 {
		wantVersion = 3
	}
	if f.Version != wantVersion {
		t.Errorf("Version = %d, want %d", f.Version, wantVersion)
	}
	wantAlign := uint64(DefaultAlignment)
	if b.Alignment != 0 {
		wantAlign = b.Alignment
	}
	if f.Alignment != wantAlign {
		t.Errorf("Alignment = %d, want %d", f.Alignment, wantAlign)
	}
	if f.DataOffset != uint64(len(l.Header)) || f.DataOffset%wantAlign != 0 {
		t.Errorf("DataOffset = %d, want %d (aligned to %d)", f.DataOffset, len(l.Header), wantAlign)
	}
	if len(f.KVs) != len(b.KVs) {
		t.Fatalf("%d KVs, want %d", len(f.KVs), len(b.KVs))
	}
	for i, want := range b.KVs {
		got := f.KVs[i]
		if got.Key != want.Key || !valueEqual(got.Value, want.Value) {
			t.Errorf("KV %d = %q %s, want %q %s", i, got.Key, got.Value.Format(8), want.Key, want.Value.Format(8))
		}
		if v, ok := f.KV(want.Key); !ok || !valueEqual(v, want.Value) {
			t.Errorf("KV(%q) = %v, %v", want.Key, v.Format(8), ok)
		}
	}
	if _, ok := f.KV("no.such.key"); ok {
		t.Errorf("KV of a missing key found")
	}
	if len(f.Tensors) != len(b.Tensors) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(b.Tensors))
	}
	for i, want := range b.Tensors {
		got := &f.Tensors[i]
		if got.Name != want.Name || got.Type != want.Type || got.Index != i || !equalDims(got.Dims, want.Dims) {
			t.Errorf("tensor %d = %q %s %v index %d, want %q %s %v", i, got.Name, got.Type, got.Dims, got.Index, want.Name, want.Type, want.Dims)
		}
		if got.Offset != l.Offsets[i]-f.DataOffset || got.Size != l.Sizes[i] {
			t.Errorf("tensor %q at %d+%d, want %d+%d", got.Name, got.Offset, got.Size, l.Offsets[i]-f.DataOffset, l.Sizes[i])
		}
		if (f.DataOffset+got.Offset)%wantAlign != 0 {
			t.Errorf("tensor %q at %d is not aligned to %d", got.Name, f.DataOffset+got.Offset, wantAlign)
		}
		d := f.TensorData(got)
		if !bytes.Equal(d, datas[i]) || cap(d) != len(d) {
			t.Errorf("tensor %q data differs (len %d cap %d)", got.Name, len(d), cap(d))
		}
		if p, ok := f.Tensor(want.Name); !ok || p != got {
			t.Errorf("Tensor(%q) = %p %v, want %p", want.Name, p, ok, got)
		}
	}
	if _, ok := f.Tensor("no.such.tensor"); ok {
		t.Errorf("Tensor of a missing name found")
	}
}

func equalDims(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		align   uint32
		version uint32
	}{{"default-align", 0, 0}, {"align64", 64, 3}, {"align1-v2", 1, 2}, {"align4096", 4096, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(tc.align)
			b.Version = tc.version
			file, datas := build(t, b)
			f, err := Parse(file)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			checkFile(t, f, b, datas)
			if f.Size() != int64(len(file)) || &f.Bytes()[0] != &file[0] {
				t.Errorf("Size/Bytes do not describe the parsed buffer")
			}
			if err := f.Close(); err != nil { // no-op for Parse
				t.Errorf("Close: %v", err)
			}

			var out bytes.Buffer
			if err := Rewrite(f, &out); err != nil {
				t.Fatalf("Rewrite: %v", err)
			}
			if !bytes.Equal(out.Bytes(), file) {
				t.Fatalf("Rewrite output differs from the original (%d vs %d bytes)", out.Len(), len(file))
			}

			// The same through a real file and mmap.
			path := filepath.Join(t.TempDir(), "x.gguf")
			if err := os.WriteFile(path, file, 0o644); err != nil {
				t.Fatal(err)
			}
			mf, err := Open(path)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			checkFile(t, mf, b, datas)
			out.Reset()
			if err := Rewrite(mf, &out); err != nil || !bytes.Equal(out.Bytes(), file) {
				t.Fatalf("Rewrite of the mapped file: %v (equal %v)", err, bytes.Equal(out.Bytes(), file))
			}
			if err := mf.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if mf.Bytes() != nil {
				t.Errorf("Bytes after Close is not nil")
			}
			if err := mf.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// TestFloatBitsSurvive checks that f32 metadata keeps its exact bits,
// signalling NaNs included, through Parse and Rewrite.
func TestFloatBitsSurvive(t *testing.T) {
	for _, bits := range []uint32{sNaN32, 0xffa00000, 0x7fc00000, 0x7fffffff, 0xff800000, 0x80000000, 1, 0x3f800000} {
		file := hdr(3, 0, 1).kv("x", TypeFloat32).u32(bits).padTo(DefaultAlignment).b
		f, err := Parse(file)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := Rewrite(f, &out); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), file) {
			t.Errorf("f32 %08x: rewrite gives % x, want % x", bits, out.Bytes()[len(file)-36:], file[len(file)-36:])
		}
		if got := f64to32(f32to64(bits)); got != bits {
			t.Errorf("f64to32(f32to64(%08x)) = %08x", bits, got)
		}
	}
	// A float64 NaN whose payload lies in the low bits narrows to a NaN, not Inf.
	if got := f64to32(math.Float64frombits(0x7ff0000000000001)); got&0x7f800000 != 0x7f800000 || got&0x7fffff == 0 {
		t.Errorf("narrowed NaN = %08x, not a NaN", got)
	}
	if got := F32(math.Float32frombits(sNaN32)).F; math.Float64bits(got)>>29&0x7fffff != 1 {
		t.Errorf("F32(sNaN) lost the payload: %016x", math.Float64bits(got))
	}
}

// TestSpecBytes checks the writer against a file assembled by hand from the
// GGUF specification, byte by byte.
func TestSpecBytes(t *testing.T) {
	b := &Builder{}
	b.Add("general.alignment", U32(64))
	b.Add("k", Bool(true))
	b.Add("a", I32Array([]int32{-1}))
	b.AddTensor("w", quant.F16, 2, 1)
	data := []byte{0x00, 0x3c, 0x00, 0xc0} // f16 1.0, -2.0

	want := []byte{
		'G', 'G', 'U', 'F', // magic
		3, 0, 0, 0, // version 3
		1, 0, 0, 0, 0, 0, 0, 0, // tensor_count
		3, 0, 0, 0, 0, 0, 0, 0, // kv_count
		// kv 0: "general.alignment" u32 64
		17, 0, 0, 0, 0, 0, 0, 0,
		'g', 'e', 'n', 'e', 'r', 'a', 'l', '.', 'a', 'l', 'i', 'g', 'n', 'm', 'e', 'n', 't',
		4, 0, 0, 0, // GGUF_TYPE_UINT32
		64, 0, 0, 0,
		// kv 1: "k" bool true
		1, 0, 0, 0, 0, 0, 0, 0, 'k',
		7, 0, 0, 0, // GGUF_TYPE_BOOL
		1,
		// kv 2: "a" array of i32 [-1]
		1, 0, 0, 0, 0, 0, 0, 0, 'a',
		9, 0, 0, 0, // GGUF_TYPE_ARRAY
		5, 0, 0, 0, // element type GGUF_TYPE_INT32
		1, 0, 0, 0, 0, 0, 0, 0, // count
		0xff, 0xff, 0xff, 0xff,
		// tensor 0: "w", 2 dims {2, 1}, GGML_TYPE_F16, offset 0
		1, 0, 0, 0, 0, 0, 0, 0, 'w',
		2, 0, 0, 0,
		2, 0, 0, 0, 0, 0, 0, 0,
		1, 0, 0, 0, 0, 0, 0, 0,
		1, 0, 0, 0, // GGML_TYPE_F16
		0, 0, 0, 0, 0, 0, 0, 0,
	}
	if len(want) != 141 {
		t.Fatalf("hand-made header is %d bytes, expected 141", len(want))
	}
	want = append(want, make([]byte, 192-141)...) // pad to the 64-byte alignment
	want = append(want, data...)
	want = append(want, make([]byte, 64-len(data))...) // ggml pads after the last tensor too

	var buf bytes.Buffer
	if err := b.Write(&buf, func(int) ([]byte, error) { return data, nil }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("writer output differs from the spec bytes:\n got % x\nwant % x", buf.Bytes(), want)
	}
	f, err := Parse(want)
	if err != nil {
		t.Fatal(err)
	}
	if f.DataOffset != 192 || f.Alignment != 64 || len(f.Tensors) != 1 || !bytes.Equal(f.TensorData(&f.Tensors[0]), data) {
		t.Fatalf("parsed spec file: DataOffset %d Alignment %d tensors %d", f.DataOffset, f.Alignment, len(f.Tensors))
	}
	if v, _ := f.KV("a"); v.Len() != 1 || v.Elem(0).I != -1 {
		t.Fatalf("a = %s", v.Format(4))
	}

	// The smallest file: a header with nothing in it, padded to 32.
	empty := []byte{'G', 'G', 'U', 'F', 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	buf.Reset()
	if err := (&Builder{Version: 2}).Write(&buf, nil); err != nil || !bytes.Equal(buf.Bytes(), empty) {
		t.Fatalf("empty v2 file: %v\n got % x\nwant % x", err, buf.Bytes(), empty)
	}
	// ... which may also end right after the header.
	for _, file := range [][]byte{empty, empty[:24]} {
		if f, err := Parse(file); err != nil || len(f.KVs) != 0 || len(f.Tensors) != 0 || f.Version != 2 {
			t.Fatalf("Parse(empty %d bytes): %v", len(file), err)
		}
	}
}

func TestRewriteLayoutMismatch(t *testing.T) {
	// Two tensors stored in the reverse of directory order.
	swapped := hdr(3, 2, 0).tensor("a", quant.F32, 32, 8).tensor("b", quant.F32, 0, 8).padTo(32).zeros(64).b
	// A valid file with trailing bytes.
	file, _ := build(t, testBuilder(0))
	trailing := append(append([]byte(nil), file...), make([]byte, 32)...)
	// A gap between tensors.
	gap := hdr(3, 2, 0).tensor("a", quant.F32, 0, 8).tensor("b", quant.F32, 64, 8).padTo(32).zeros(96).b
	// No tensors, and an alignment that puts the data section 2 GiB past the
	// end of the file: Rewrite must not lay out a 2 GiB header.
	farData := hdr(3, 0, 1).kv("general.alignment", TypeUint32).u32(1 << 31).b

	for name, file := range map[string][]byte{"swapped": swapped, "trailing": trailing, "gap": gap, "far-data": farData} {
		f, err := Parse(file)
		if err != nil {
			t.Fatalf("%s: Parse: %v", name, err)
		}
		var out bytes.Buffer
		var ms0, ms1 runtimeMem
		ms0.read()
		err = Rewrite(f, &out)
		ms1.read()
		if !errors.Is(err, ErrLayoutMismatch) {
			t.Errorf("%s: Rewrite = %v, want ErrLayoutMismatch", name, err)
		}
		if out.Len() != 0 {
			t.Errorf("%s: Rewrite wrote %d bytes before failing", name, out.Len())
		}
		if a := ms1.alloc - ms0.alloc; a > 1<<20 {
			t.Errorf("%s: Rewrite allocated %d bytes", name, a)
		}
	}
}

func TestWriterRejects(t *testing.T) {
	base := func() *Builder {
		b := &Builder{}
		b.Add("general.architecture", Str("x"))
		b.AddTensor("w", quant.F32, 4)
		return b
	}
	deep := array(TypeUint8, Value{U: 1})
	for range maxNestDepth {
		deep = nested(deep)
	}
	for _, tc := range []struct {
		name string
		edit func(b *Builder)
		want string
	}{
		{"version", func(b *Builder) { b.Version = 1 }, "version 1"},
		{"duplicate key", func(b *Builder) { b.Add("general.architecture", Str("y")) }, "duplicate metadata key"},
		{"duplicate tensor", func(b *Builder) { b.AddTensor("w", quant.F16, 2) }, "duplicate tensor name"},
		{"alignment type", func(b *Builder) { b.Add("general.alignment", U64(64)) }, "must be a u32"},
		{"alignment pow2", func(b *Builder) { b.Add("general.alignment", U32(48)) }, "power of two"},
		{"alignment zero", func(b *Builder) { b.Add("general.alignment", U32(0)) }, "power of two"},
		{"alignment disagrees", func(b *Builder) { b.Add("general.alignment", U32(64)); b.Alignment = 128 }, "disagrees"},
		{"alignment without key", func(b *Builder) { b.Alignment = 64 }, "needs a u32 general.alignment"},
		{"builder alignment pow2", func(b *Builder) { b.Alignment = 24 }, "power of two"},
		{"key too long", func(b *Builder) { b.Add(strings.Repeat("k", maxKeyLen+1), U8(1)) }, "key of"},
		{"name too long", func(b *Builder) { b.AddTensor(strings.Repeat("n", maxNameLen+1), quant.F32, 1) }, "tensor name of"},
		{"no dims", func(b *Builder) { b.AddTensor("z", quant.F32) }, "0 dimensions"},
		{"five dims", func(b *Builder) { b.AddTensor("z", quant.F32, 1, 1, 1, 1, 1) }, "5 dimensions"},
		{"zero dim", func(b *Builder) { b.AddTensor("z", quant.F32, 4, 0) }, "dimension 1 is zero"},
		{"huge tensor", func(b *Builder) { b.AddTensor("z", quant.F32, 1<<30, 1<<30) }, "2^50"},
		{"unknown type", func(b *Builder) { b.AddTensor("z", quant.Type(4), 32) }, "unknown tensor type"},
		{"block size", func(b *Builder) { b.AddTensor("z", quant.Q8_0, 33) }, "block size"},
		{"data section size", func(b *Builder) {
			for i := range 1 << 12 {
				b.AddTensor(fmt.Sprint("t", i), quant.I64, 1<<25, 1<<25)
			}
		}, "exceed 2^62"},
		{"string array count", func(b *Builder) { v := StrArray([]string{"a"}); v.Count = 2; b.Add("s", v) }, "string array count"},
		{"raw length", func(b *Builder) { v := U32Array([]uint32{1}); v.Raw = v.Raw[:3]; b.Add("s", v) }, "holds 3 bytes"},
		{"raw count overflow", func(b *Builder) { b.Add("s", Value{Type: TypeArray, ElemType: TypeUint16, Count: 1 << 63}) }, "holds 0 bytes"},
		{"nested count", func(b *Builder) { v := nested(U32Array(nil)); v.Count = 3; b.Add("s", v) }, "nested array count"},
		{"nested scalar", func(b *Builder) { b.Add("s", nested(U32(1))) }, "is a u32"},
		{"nested too deep", func(b *Builder) { b.Add("s", deep) }, "nested deeper"},
		{"bool array byte", func(b *Builder) { b.Add("s", Value{Type: TypeArray, ElemType: TypeBool, Count: 1, Raw: []byte{2}}) }, "bool element 0 is 2"},
		{"u8 range", func(b *Builder) { b.Add("s", Value{Type: TypeUint8, U: 256}) }, "does not fit in u8"},
		{"u16 range", func(b *Builder) { b.Add("s", Value{Type: TypeUint16, U: 1 << 16}) }, "does not fit in u16"},
		{"u32 range", func(b *Builder) { b.Add("s", Value{Type: TypeUint32, U: 1 << 32}) }, "does not fit in u32"},
		{"i8 range", func(b *Builder) { b.Add("s", Value{Type: TypeInt8, I: -129}) }, "does not fit in i8"},
		{"i16 range", func(b *Builder) { b.Add("s", Value{Type: TypeInt16, I: 1 << 15}) }, "does not fit in i16"},
		{"i32 range", func(b *Builder) { b.Add("s", Value{Type: TypeInt32, I: math.MinInt32 - 1}) }, "does not fit in i32"},
		{"unknown value type", func(b *Builder) { b.Add("s", Value{Type: 13}) }, "unknown value type 13"},
		{"unknown element type", func(b *Builder) { b.Add("s", Value{Type: TypeArray, ElemType: 99}) }, "unknown array element type 99"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := base()
			tc.edit(b)
			_, err := b.Layout()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Layout error = %v, want one containing %q", err, tc.want)
			}
			if err := b.Write(new(bytes.Buffer), nil); err == nil {
				t.Fatalf("Write succeeded")
			}
		})
	}
}

func TestWriterEdgeValues(t *testing.T) {
	// A bool held as any non-zero U is written as 1, so the file stays valid.
	b := &Builder{}
	b.Add("b", Value{Type: TypeBool, U: 5})
	b.Add("long.key."+strings.Repeat("k", maxKeyLen-9), U8(1)) // exactly the limit
	b.AddTensor(strings.Repeat("n", maxNameLen), quant.F32, 1)
	file, _ := build(t, b)
	f, err := Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := f.KV("b"); v.U != 1 {
		t.Fatalf("bool read back as %d", v.U)
	}
}

func TestWriteErrors(t *testing.T) {
	b := &Builder{}
	b.AddTensor("a", quant.F32, 4)
	b.AddTensor("b", quant.F32, 4)
	errData := errors.New("no data")
	err := b.Write(new(bytes.Buffer), func(i int) ([]byte, error) {
		if i == 1 {
			return nil, errData
		}
		return make([]byte, 16), nil
	})
	if !errors.Is(err, errData) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("data error: %v", err)
	}
	err = b.Write(new(bytes.Buffer), func(i int) ([]byte, error) { return make([]byte, 15), nil })
	if err == nil || !strings.Contains(err.Error(), "got 15 bytes of data, want 16") {
		t.Fatalf("short data: %v", err)
	}
	for n := range 200 {
		w := &limitWriter{n: n}
		err := b.Write(w, func(i int) ([]byte, error) { return make([]byte, 16), nil })
		if n < 160 && !errors.Is(err, errWriteLimit) {
			t.Fatalf("writer failing after %d bytes: %v", n, err)
		}
		if n >= 160 && err != nil {
			t.Fatalf("writer with room for %d bytes: %v", n, err)
		}
	}
}

var errWriteLimit = errors.New("write limit")

type limitWriter struct{ n int }

func (w *limitWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		k := w.n
		w.n = 0
		return k, errWriteLimit
	}
	w.n -= len(p)
	return len(p), nil
}

func TestFromFile(t *testing.T) {
	file, _ := build(t, testBuilder(64))
	f, err := Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	b := FromFile(f)
	if b.Version != 3 || b.Alignment != 0 || len(b.KVs) != len(f.KVs) || len(b.Tensors) != len(f.Tensors) {
		t.Fatalf("FromFile = version %d alignment %d, %d kvs, %d tensors", b.Version, b.Alignment, len(b.KVs), len(b.Tensors))
	}
	// The builder owns its slices.
	b.KVs[0].Key = "changed"
	b.Tensors[0].Dims[0] = 99
	if f.KVs[0].Key == "changed" || f.Tensors[0].Dims[0] == 99 {
		t.Fatalf("FromFile shares slices with the File")
	}
	// Without general.alignment the builder carries the default.
	file, _ = build(t, testBuilder(0))
	f, _ = Parse(file)
	if b := FromFile(f); b.Alignment != DefaultAlignment {
		t.Fatalf("FromFile alignment = %d", b.Alignment)
	}
}

func TestValueAccessors(t *testing.T) {
	type conv struct {
		u64  any
		u32  any
		i64  any
		f64  any
		bl   any
		str  any
		strs any
	}
	const bad = "error"
	for _, tc := range []struct {
		v    Value
		want conv
		fmt  string
	}{
		{U8(200), conv{uint64(200), uint32(200), int64(200), 200.0, bad, bad, bad}, "200"},
		{I8(-5), conv{bad, bad, int64(-5), -5.0, bad, bad, bad}, "-5"},
		{I16(7), conv{uint64(7), uint32(7), int64(7), 7.0, bad, bad, bad}, "7"},
		{U64(1 << 40), conv{uint64(1 << 40), bad, int64(1 << 40), float64(1 << 40), bad, bad, bad}, "1099511627776"},
		{U64(math.MaxUint64), conv{uint64(math.MaxUint64), bad, bad, float64(math.MaxUint64), bad, bad, bad}, "18446744073709551615"},
		{I64(math.MinInt64), conv{bad, bad, int64(math.MinInt64), float64(math.MinInt64), bad, bad, bad}, "-9223372036854775808"},
		{F32(1.5), conv{bad, bad, bad, 1.5, bad, bad, bad}, "1.5"},
		{F64(-0.25), conv{bad, bad, bad, -0.25, bad, bad, bad}, "-0.25"},
		{Bool(true), conv{uint64(1), uint32(1), int64(1), bad, true, bad, bad}, "true"},
		{Str("hi"), conv{bad, bad, bad, bad, bad, "hi", bad}, `"hi"`},
		{StrArray([]string{"a", "b"}), conv{bad, bad, bad, bad, bad, bad, []string{"a", "b"}}, `[string × 2] ["a", "b"]`},
		{U32Array([]uint32{1, 2, 3, 4}), conv{bad, bad, bad, bad, bad, bad, bad}, "[u32 × 4] [1, 2, 3, …]"},
		{Value{Type: 42}, conv{bad, bad, bad, bad, bad, bad, bad}, "?"},
	} {
		v := tc.v
		check := func(what string, got any, err error, want any) {
			t.Helper()
			if want == bad {
				if err == nil {
					t.Errorf("%s.%s = %v, want an error", v.Format(3), what, got)
				}
				return
			}
			if err != nil {
				t.Errorf("%s.%s: %v", v.Format(3), what, err)
				return
			}
			if gs, ok := got.([]string); ok {
				if strings.Join(gs, ",") != strings.Join(want.([]string), ",") {
					t.Errorf("%s.%s = %v, want %v", v.Format(3), what, got, want)
				}
				return
			}
			if got != want {
				t.Errorf("%s.%s = %v (%T), want %v (%T)", v.Format(3), what, got, got, want, want)
			}
		}
		x1, err := v.AsUint64()
		check("AsUint64", x1, err, tc.want.u64)
		x2, err := v.AsUint32()
		check("AsUint32", x2, err, tc.want.u32)
		x3, err := v.AsInt64()
		check("AsInt64", x3, err, tc.want.i64)
		x4, err := v.AsFloat64()
		check("AsFloat64", x4, err, tc.want.f64)
		x5, err := v.AsBool()
		check("AsBool", x5, err, tc.want.bl)
		x6, err := v.AsString()
		check("AsString", x6, err, tc.want.str)
		x7, err := v.AsStrings()
		check("AsStrings", x7, err, tc.want.strs)
		if got := v.Format(3); got != tc.fmt {
			t.Errorf("Format = %q, want %q", got, tc.fmt)
		}
	}

	a := array(TypeInt16, Value{I: -1}, Value{I: 300})
	if a.Len() != 2 || a.Elem(0).I != -1 || a.Elem(1).I != 300 || a.Elem(2).Type != 0 || a.Elem(-1).Type != 0 || U8(1).Len() != 0 {
		t.Errorf("Len/Elem on %s", a.Format(5))
	}
	if _, err := a.AsUint32s(); err == nil {
		t.Errorf("AsUint32s of a negative element succeeded")
	}
	if xs, err := a.AsInt32s(); err != nil || xs[0] != -1 || xs[1] != 300 {
		t.Errorf("AsInt32s = %v, %v", xs, err)
	}
	if xs, err := a.AsFloat32s(); err != nil || xs[0] != -1 || xs[1] != 300 {
		t.Errorf("AsFloat32s = %v, %v", xs, err)
	}
	if xs, err := U32Array([]uint32{math.MaxUint32}).AsUint32s(); err != nil || xs[0] != math.MaxUint32 {
		t.Errorf("AsUint32s = %v, %v", xs, err)
	}
	if _, err := U32Array([]uint32{math.MaxUint32}).AsInt32s(); err == nil {
		t.Errorf("AsInt32s of 2^32-1 succeeded")
	}
	if _, err := array(TypeUint64, Value{U: 1 << 32}).AsUint32s(); err == nil {
		t.Errorf("AsUint32s of 2^32 succeeded")
	}
	if _, err := array(TypeBool, Value{U: 1}).AsFloat32s(); err == nil {
		t.Errorf("AsFloat32s of bools succeeded")
	}
	for _, f := range []func(Value) error{
		func(v Value) error { _, err := v.AsUint32s(); return err },
		func(v Value) error { _, err := v.AsInt32s(); return err },
		func(v Value) error { _, err := v.AsFloat32s(); return err },
	} {
		if f(StrArray([]string{"1"})) == nil || f(U32(1)) == nil {
			t.Errorf("numeric array accessor accepted strings or a scalar")
		}
	}
	n := nested(I32Array([]int32{1}), StrArray(nil))
	if n.Elem(1).ElemType != TypeString || n.Format(4) != "[array × 2] [[i32 × 1] [1], [string × 0]]" {
		t.Errorf("nested Format = %q", n.Format(4))
	}
	if e := array(TypeUint8); e.Format(3) != "[u8 × 0]" {
		t.Errorf("empty Format = %q", e.Format(3))
	}
	for vt, name := range map[ValueType]string{TypeUint8: "u8", TypeFloat64: "f64", TypeArray: "array", 13: "valuetype(13)"} {
		if vt.String() != name {
			t.Errorf("ValueType(%d).String() = %q", uint32(vt), vt.String())
		}
	}
}

func TestTensorInfoHelpers(t *testing.T) {
	ti := TensorInfo{Dims: []uint64{4096, 129280}}
	if ti.Elements() != 4096*129280 || ti.ShapeString() != "4096×129280" {
		t.Fatalf("Elements %d ShapeString %q", ti.Elements(), ti.ShapeString())
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "missing.gguf")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open(missing) = %v", err)
	}
	for name, data := range map[string][]byte{
		"empty":     nil,
		"short":     []byte("GGUF\x03\x00\x00\x00"),
		"bad-magic": append([]byte("GGML"), make([]byte, 60)...),
		"truncated": hdr(3, 1, 0).tensor("w", quant.F32, 0, 8).padTo(32).zeros(31).b,
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(path)
		var fe *FormatError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), path) {
			t.Errorf("Open(%s) = %v, want a FormatError naming the file", name, err)
		}
	}
	if _, err := Open(dir); err == nil {
		t.Errorf("Open(directory) succeeded")
	}
}
