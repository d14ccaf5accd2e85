package gguf

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"ds4go/quant"
)

// oneKV starts a file with one tensor-less kv "k" of type t; the caller
// appends the value. The value starts at byte 37.
func oneKV(t ValueType) *enc { return hdr(3, 0, 1).kv("k", t) }

// oneTensor is a file with a single tensor "w" and enough zeroed data.
func oneTensor(t quant.Type, off uint64, dims ...uint64) []byte {
	return hdr(3, 1, 0).tensor("w", t, off, dims...).padTo(DefaultAlignment).zeros(256).b
}

type badFile struct {
	name   string
	data   []byte
	field  string // the FormatError's Field, exactly
	offset int64  // its Offset, or -1 to not check
	trunc  bool   // whether it must wrap ErrTruncated
	msg    string // a substring of the message, if not ""
}

func badFiles() []badFile {
	valid := hdr(3, 0, 0).b
	withVersion := func(v uint32) []byte { return (&enc{}).raw([]byte(Magic)...).u32(v).u64(0).u64(0).b }
	deep := oneKV(TypeArray)
	for range maxNestDepth {
		deep.u32(uint32(TypeArray)).u64(1)
	}
	deep.u32(uint32(TypeUint8)).u64(0)
	align := func(t ValueType, val func(e *enc)) []byte {
		e := hdr(3, 0, 1).kv("general.alignment", t)
		val(e)
		return e.padTo(32).b
	}
	return []badFile{
		{"empty", nil, "magic", 0, true, ""},
		{"3 bytes", []byte("GGU"), "magic", 0, true, ""},
		{"bad magic", append([]byte("GGUX"), valid[4:]...), "magic", 0, false, "not a GGUF file"},
		{"lowercase magic", append([]byte("gguf"), valid[4:]...), "magic", 0, false, ""},
		{"no version", []byte("GGUF\x03\x00\x00"), "version", 4, true, ""},
		{"version 1", withVersion(1), "version", 4, false, "unsupported version 1"},
		{"version 4", withVersion(4), "version", 4, false, "unsupported version 4"},
		{"version max", withVersion(0xffffffff), "version", 4, false, "unsupported"},
		{"big-endian v3", []byte("GGUF\x00\x00\x00\x03" + strings.Repeat("\x00", 16)), "version", 4, false, "byte-swapped"},
		{"big-endian v2", []byte("GGUF\x00\x00\x00\x02" + strings.Repeat("\x00", 16)), "version", 4, false, "big-endian"},
		{"no tensor_count", valid[:12], "tensor_count", 8, true, ""},
		{"no kv_count", valid[:20], "kv_count", 16, true, ""},
		{"kv_count 2^62", hdr(3, 0, 1<<62).zeros(76).b, "kv_count", 16, true, "cannot fit"},
		{"kv_count 2^64-1", hdr(3, 0, 1<<64-1).b, "kv_count", 16, true, ""},
		{"value missing", hdr(3, 0, 2).kv("k", TypeUint8).u8(1).kv("", TypeUint8).b, `kv[1] "" value`, 50, true, ""},
		{"tensor_count 2^62", hdr(3, 1<<62, 0).zeros(76).b, "tensor_count", 8, true, "cannot fit"},
		{"tensor_count 2^40 with kvs", hdr(3, 1<<40, 1).kv("k", TypeUint8).u8(1).zeros(64).b, "tensor_count", 8, true, ""},
		{"key length 2^63", hdr(3, 0, 1).u64(1 << 63).zeros(16).b, "kv[0] key length", 24, false, "exceeds the limit"},
		{"key length past EOF", hdr(3, 0, 1).u64(100).zeros(20).b, "kv[0] key length", 24, true, ""},
		{"key too long", hdr(3, 0, 1).u64(maxKeyLen + 1).zeros(maxKeyLen + 16).b, "kv[0] key length", 24, false, "exceeds the limit"},
		{"no value type", hdr(3, 0, 1).str("kkkk").u8(7).b, `kv[0] "kkkk" type`, 36, true, ""},
		{"unknown value type", oneKV(13).u64(0).b, `kv[0] "k" type`, 33, false, "unknown value type 13"},
		{"value type 2^32-1", oneKV(0xffffffff).u64(0).b, `kv[0] "k" type`, 33, false, "unknown value type"},
		{"truncated u64 value", oneKV(TypeUint64).u32(1).b, `kv[0] "k" value`, 37, true, ""},
		{"string length 2^62", oneKV(TypeString).u64(1 << 62).zeros(8).b, `kv[0] "k" value length`, 37, true, ""},
		{"string length 2^64-1", oneKV(TypeString).u64(1<<64 - 1).zeros(8).b, `kv[0] "k" value length`, 37, true, ""},
		{"u8 array count 2^62", oneKV(TypeArray).u32(uint32(TypeUint8)).u64(1 << 62).zeros(8).b, `kv[0] "k" value count`, 41, true, "cannot fit"},
		{"u64 array count 2^61+1", oneKV(TypeArray).u32(uint32(TypeUint64)).u64(1<<61 + 1).zeros(8).b, `kv[0] "k" value count`, 41, true, ""},
		{"string array count 2^60", oneKV(TypeArray).u32(uint32(TypeString)).u64(1 << 60).zeros(64).b, `kv[0] "k" value count`, 41, true, ""},
		{"array array count 2^60", oneKV(TypeArray).u32(uint32(TypeArray)).u64(1 << 60).zeros(64).b, `kv[0] "k" value count`, 41, true, ""},
		{"array count 2^64-1", oneKV(TypeArray).u32(uint32(TypeInt32)).u64(1<<64 - 1).b, `kv[0] "k" value count`, 41, true, ""},
		{"array count one too many", oneKV(TypeArray).u32(uint32(TypeUint16)).u64(3).u32(0).u8(0).b, `kv[0] "k" value count`, 41, true, ""},
		{"unknown element type", oneKV(TypeArray).u32(13).u64(0).b, `kv[0] "k" value element type`, 37, false, "unknown value type 13"},
		{"unknown nested element type", oneKV(TypeArray).u32(uint32(TypeArray)).u64(1).u32(77).u64(0).b, `kv[0] "k" value[0] element type`, 49, false, "unknown value type 77"},
		{"string in array past EOF", oneKV(TypeArray).u32(uint32(TypeString)).u64(3).str("a").str("b").u64(100).zeros(3).b, `kv[0] "k" value[2] length`, 67, true, ""},
		{"string in array length 2^64-1", oneKV(TypeArray).u32(uint32(TypeString)).u64(2).str("a").u64(1<<64 - 1).b, `kv[0] "k" value[1] length`, 58, true, ""},
		{"bool 2", oneKV(TypeBool).u8(2).b, `kv[0] "k" value`, 37, false, "bool byte is 2"},
		{"bool 255", oneKV(TypeBool).u8(255).b, `kv[0] "k" value`, 37, false, "bool byte is 255"},
		{"bool array byte 2", oneKV(TypeArray).u32(uint32(TypeBool)).u64(2).u8(0).u8(2).b, `kv[0] "k" value[1]`, 50, false, "bool byte is 2"},
		{"arrays nested 5 deep", deep.b, `kv[0] "k" value[0][0][0][0]`, 85, false, "nested deeper"},
		{"duplicate key", hdr(3, 0, 2).kv("k", TypeUint8).u8(1).kv("k", TypeUint8).u8(2).b, `kv[1] "k"`, 38, false, "duplicate key"},
		{"alignment 48", align(TypeUint32, func(e *enc) { e.u32(48) }), "general.alignment", 53, false, "not a power of two"},
		{"alignment 0", align(TypeUint32, func(e *enc) { e.u32(0) }), "general.alignment", 53, false, "not a power of two"},
		{"alignment 2^32-1", align(TypeUint32, func(e *enc) { e.u32(0xffffffff) }), "general.alignment", 53, false, "not a power of two"},
		{"alignment u64", align(TypeUint64, func(e *enc) { e.u64(64) }), "general.alignment", 53, false, "must be a u32, got u64"},
		{"alignment i32", align(TypeInt32, func(e *enc) { e.u32(64) }), "general.alignment", 53, false, "must be a u32"},
		{"alignment u16", align(TypeUint16, func(e *enc) { e.raw(64, 0) }), "general.alignment", 53, false, "must be a u32"},
		{"alignment string", align(TypeString, func(e *enc) { e.str("64") }), "general.alignment", 53, false, "got string"},
		{"alignment array", align(TypeArray, func(e *enc) { e.u32(uint32(TypeUint32)).u64(1).u32(64) }), "general.alignment", 53, false, "got array of u32"},
		{"tensor name 2^63", hdr(3, 1, 0).u64(1 << 63).zeros(40).b, "tensor[0] name length", 24, false, "exceeds the limit"},
		{"tensor name too long", hdr(3, 1, 0).u64(maxNameLen + 1).zeros(maxNameLen + 64).b, "tensor[0] name length", 24, false, "exceeds the limit"},
		{"n_dims 0", oneTensor(quant.F32, 0), `tensor[0] "w" n_dims`, 33, false, "0 dimensions"},
		{"n_dims 5", oneTensor(quant.F32, 0, 1, 1, 1, 1, 1), `tensor[0] "w" n_dims`, 33, false, "5 dimensions"},
		{"n_dims 2^32-1", hdr(3, 1, 0).str("w").u32(0xffffffff).zeros(64).b, `tensor[0] "w" n_dims`, 33, false, ""},
		{"zero dim", oneTensor(quant.F32, 0, 4, 0), `tensor[0] "w" ne[1]`, 45, false, "dimension is zero"},
		{"zero first dim", oneTensor(quant.F32, 0, 0, 4), `tensor[0] "w" ne[0]`, 37, false, "dimension is zero"},
		{"dim 2^63", oneTensor(quant.F32, 0, 1<<63), `tensor[0] "w" ne[0]`, 37, false, "absurdly large"},
		{"dims product 2^80", oneTensor(quant.F32, 0, 1<<40, 1<<40), `tensor[0] "w" ne[1]`, 45, false, "absurdly large"},
		{"dims product wraps to 0", oneTensor(quant.F32, 0, 1<<32, 1<<32, 1<<32, 1<<32), `tensor[0] "w" ne[1]`, 45, false, ""},
		{"dims product 2^51", oneTensor(quant.I8, 0, 1<<17, 1<<17, 1<<17), `tensor[0] "w" ne[2]`, 53, false, ""},
		{"unknown ggml type 4", oneTensor(4, 0, 32), `tensor[0] "w" type`, 45, false, "unknown ggml type 4"},
		{"unknown ggml type 1000", oneTensor(1000, 0, 32), `tensor[0] "w" type`, 45, false, "unknown ggml type 1000"},
		{"block size mismatch", oneTensor(quant.Q8_0, 0, 33), `tensor[0] "w" type`, 45, false, "block size"},
		{"no offset", hdr(3, 1, 0).str("wwwwwwww").u32(1).u64(8).u32(0).b, `tensor[0] "wwwwwwww" offset`, 56, true, ""},
		{"offset past EOF", hdr(3, 1, 0).tensor("w", quant.F32, 32, 8).padTo(32).zeros(32).b, `tensor[0] "w" offset`, 64, true, "runs past the end"},
		{"data one byte short", hdr(3, 1, 0).tensor("w", quant.F32, 0, 8).padTo(32).zeros(31).b, `tensor[0] "w" offset`, 64, true, ""},
		{"offset 2^64-32", hdr(3, 1, 0).tensor("w", quant.F32, 1<<64-32, 8).padTo(32).zeros(32).b, `tensor[0] "w" offset`, 64, true, ""},
		{"huge tensor", hdr(3, 1, 0).tensor("w", quant.F64, 0, 1<<25, 1<<25).padTo(32).zeros(32).b, `tensor[0] "w" offset`, 96, true, ""},
		{"misaligned offset", hdr(3, 1, 0).tensor("w", quant.F32, 4, 8).padTo(32).zeros(64).b, `tensor[0] "w" offset`, 64, false, "not a multiple of the alignment 32"},
		{"offset misaligned for general.alignment", hdr(3, 1, 1).kv("general.alignment", TypeUint32).u32(64).tensor("w", quant.F32, 32, 8).padTo(64).zeros(128).b,
			`tensor[0] "w" offset`, 128, false, "alignment 64"},
		{"overlapping tensors", hdr(3, 2, 0).tensor("a", quant.F32, 0, 16).tensor("b", quant.F32, 32, 8).padTo(32).zeros(64).b,
			`tensor[1] "b" offset`, 96, false, `overlaps tensor[0] "a"`},
		{"overlap, reverse order", hdr(3, 2, 0).tensor("a", quant.F32, 32, 8).tensor("b", quant.F32, 0, 16).padTo(32).zeros(64).b,
			`tensor[0] "a" offset`, 96, false, `overlaps tensor[1] "b"`},
		{"same offset", hdr(3, 2, 0).tensor("a", quant.F32, 0, 1).tensor("b", quant.F32, 0, 1).padTo(32).zeros(64).b, "", 96, false, "overlaps"},
		{"duplicate tensor name", hdr(3, 2, 0).tensor("w", quant.F32, 0, 8).tensor("w", quant.F32, 32, 8).padTo(32).zeros(64).b,
			`tensor[1] "w"`, 57, false, "duplicate tensor name"},
		{"data section past EOF", hdr(3, 1, 0).tensor("w", quant.F32, 0, 1).b, "data section", 57, true, ""},
		{"second tensor cut", hdr(3, 2, 0).tensor("w", quant.F32, 0, 1).str("xxxxxxx").u32(1).u64(1).u32(0).b, `tensor[1] "xxxxxxx" offset`, 88, true, ""},
	}
}

func checkFormatError(t *testing.T, name string, data []byte, err error) *FormatError {
	t.Helper()
	var fe *FormatError
	if !errors.As(err, &fe) {
		t.Fatalf("%s: error %v (%T) is not a *FormatError", name, err, err)
	}
	if fe.Offset < 0 || fe.Offset > int64(len(data)) {
		t.Errorf("%s: Offset %d outside the %d-byte file", name, fe.Offset, len(data))
	}
	if !strings.HasPrefix(err.Error(), "gguf: ") || !strings.Contains(err.Error(), fe.Field) {
		t.Errorf("%s: message %q", name, err)
	}
	return fe
}

func TestParseErrors(t *testing.T) {
	for _, tc := range badFiles() {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.data[:len(tc.data):len(tc.data)]
			f, err := Parse(data)
			if err == nil {
				t.Fatalf("Parse succeeded: %d kvs, %d tensors", len(f.KVs), len(f.Tensors))
			}
			fe := checkFormatError(t, tc.name, data, err)
			if tc.field != "" && fe.Field != tc.field {
				t.Errorf("Field = %q, want %q (%v)", fe.Field, tc.field, err)
			}
			if tc.offset >= 0 && fe.Offset != tc.offset {
				t.Errorf("Offset = %d, want %d (%v)", fe.Offset, tc.offset, err)
			}
			if errors.Is(err, ErrTruncated) != tc.trunc {
				t.Errorf("errors.Is(ErrTruncated) = %v, want %v (%v)", !tc.trunc, tc.trunc, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}
}

// TestParseBoundaries checks the values just inside the limits that
// TestParseErrors checks just outside.
func TestParseBoundaries(t *testing.T) {
	deep := oneKV(TypeArray)
	for range maxNestDepth - 1 {
		deep.u32(uint32(TypeArray)).u64(1)
	}
	deep.u32(uint32(TypeUint8)).u64(1).u8(42)
	for name, data := range map[string][]byte{
		"4 dims":           oneTensor(quant.F32, 0, 1, 2, 1, 2),
		"arrays nested 4":  deep.b,
		"key at limit":     hdr(3, 0, 1).str(strings.Repeat("k", maxKeyLen)).u32(uint32(TypeBool)).u8(1).b,
		"name at limit":    hdr(3, 1, 0).tensor(strings.Repeat("n", maxNameLen), quant.F32, 0, 1).padTo(32).zeros(4).b,
		"alignment 1":      hdr(3, 1, 1).kv("general.alignment", TypeUint32).u32(1).tensor("w", quant.F32, 0, 1).zeros(4).b,
		"alignment 2^31":   hdr(3, 0, 1).kv("general.alignment", TypeUint32).u32(1 << 31).b,
		"adjacent tensors": hdr(3, 2, 0).tensor("a", quant.F32, 32, 8).tensor("b", quant.F32, 0, 8).padTo(32).zeros(64).b,
		"empty name, key":  hdr(3, 1, 1).kv("", TypeUint8).u8(0).tensor("", quant.F32, 0, 1).padTo(32).zeros(4).b,
		"v2":               (&enc{}).raw([]byte(Magic)...).u32(2).u64(0).u64(1).kv("k", TypeString).str("v").b,
	} {
		if _, err := Parse(data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// 2^50 elements pass the dimension check and fail only for want of data.
	_, err := Parse(hdr(3, 1, 0).tensor("w", quant.I8, 0, 1<<25, 1<<25).padTo(32).b)
	var fe *FormatError
	if !errors.As(err, &fe) || fe.Field != `tensor[0] "w" offset` {
		t.Errorf("2^50 elements: %v", err)
	}
}

// TestParseTruncated parses every prefix of valid files: each shorter than
// the end of the last tensor's data must fail with ErrTruncated, never
// panic; the longer ones (cut in the final padding) must parse.
func TestParseTruncated(t *testing.T) {
	for _, align := range []uint32{0, 64} {
		file, _ := build(t, testBuilder(align))
		full, err := Parse(file)
		if err != nil {
			t.Fatal(err)
		}
		need := full.DataOffset
		for _, ti := range full.Tensors {
			need = max(need, full.DataOffset+ti.Offset+ti.Size)
		}
		for n := 0; n <= len(file); n++ {
			data := file[:n:n]
			f, err := Parse(data)
			if uint64(n) >= need {
				if err != nil {
					t.Fatalf("align %d: prefix of %d bytes (>= %d): %v", align, n, need, err)
				}
				if len(f.Tensors) != len(full.Tensors) {
					t.Fatalf("prefix of %d bytes: %d tensors", n, len(f.Tensors))
				}
				continue
			}
			if err == nil {
				t.Fatalf("align %d: prefix of %d bytes parsed", align, n)
			}
			name := fmt.Sprintf("align %d prefix %d", align, n)
			checkFormatError(t, name, data, err)
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("%s: %v does not wrap ErrTruncated", name, err)
			}
		}
	}
}

// TestParseCorruptBytes flips every byte of a valid header in turn: Parse
// must either fail with a FormatError or succeed with a consistent file.
func TestParseCorruptBytes(t *testing.T) {
	file, _ := build(t, testBuilder(64))
	f0, _ := Parse(file)
	data := make([]byte, len(file))
	for i := 0; i < int(f0.DataOffset); i++ {
		for _, x := range []byte{0xff, 0x80, 0x01, 0x00} {
			copy(data, file)
			data[i] ^= x
			if x == 0 {
				data[i] = 0
			}
			f, err := Parse(data)
			if err != nil {
				checkFormatError(t, fmt.Sprintf("byte %d ^ %#x", i, x), data, err)
				continue
			}
			checkParsed(t, f, data)
		}
	}
}

// runtimeMem samples the bytes allocated so far.
type runtimeMem struct{ alloc uint64 }

func (m *runtimeMem) read() {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.alloc = s.TotalAlloc
}

// allocated returns the bytes allocated by fn.
func allocated(fn func()) uint64 {
	var a, b runtimeMem
	a.read()
	fn()
	b.read()
	return b.alloc - a.alloc
}

// TestHostileCountsAllocation checks that counts claiming far more entries
// than exist cost memory bounded by a constant, not by the claim, even when
// the file is large (as a mapped model file with gigabytes of tensor data
// is).
func TestHostileCountsAllocation(t *testing.T) {
	// A 100-byte file claiming 2^40 of everything.
	small := map[string][]byte{
		"kv_count":     hdr(3, 0, 1<<40).zeros(76).b,
		"tensor_count": hdr(3, 1<<40, 0).zeros(76).b,
		"array count":  oneKV(TypeArray).u32(uint32(TypeString)).u64(1 << 40).zeros(51).b,
	}
	for name, data := range small {
		if len(data) != 100 {
			t.Fatalf("%s: %d bytes", name, len(data))
		}
		if n := testing.AllocsPerRun(20, func() { _, _ = Parse(data) }); n > 32 {
			t.Errorf("%s: %v allocations per Parse", name, n)
		}
		if a := allocated(func() { _, _ = Parse(data) }); a > 16<<10 {
			t.Errorf("%s: Parse allocated %d bytes", name, a)
		}
	}

	// Counts that do fit the bytes that remain, in a 16 MiB file whose tail
	// is 0xff, so the first entry fails to parse.
	const tail = 16 << 20
	ff := bytes.Repeat([]byte{0xff}, tail)
	large := map[string][]byte{
		"kv_count":     append(hdr(3, 0, tail/13).b, ff...),
		"tensor_count": append(hdr(3, tail/32, 0).b, ff...),
		"string array": append(oneKV(TypeArray).u32(uint32(TypeString)).u64(tail/8).b, ff...),
		"array array":  append(oneKV(TypeArray).u32(uint32(TypeArray)).u64(tail/12).b, ff...),
	}
	for name, data := range large {
		var err error
		if a := allocated(func() { _, err = Parse(data) }); a > 2<<20 {
			t.Errorf("%s: Parse of a %d-byte file allocated %d bytes", name, len(data), a)
		}
		checkFormatError(t, name, data, err)
	}
}

// TestLargeStringArray parses a vocabulary-sized string array (the fast path).
func TestLargeStringArray(t *testing.T) {
	words := make([]string, 150000)
	for i := range words {
		words[i] = fmt.Sprintf("tok%d", i)
	}
	b := &Builder{}
	b.Add("tokenizer.ggml.tokens", StrArray(words))
	file, _ := build(t, b)
	f, err := Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := f.KV("tokenizer.ggml.tokens")
	got, err := v.AsStrings()
	if err != nil || len(got) != len(words) || got[0] != "tok0" || got[149999] != "tok149999" {
		t.Fatalf("read back %d strings: %v", len(got), err)
	}
}

func BenchmarkParseVocab(b *testing.B) {
	words := make([]string, 129280)
	for i := range words {
		words[i] = fmt.Sprintf("token-%d", i)
	}
	bl := &Builder{}
	bl.Add("tokenizer.ggml.tokens", StrArray(words))
	file, _ := build(b, bl)
	b.SetBytes(int64(len(file)))
	for b.Loop() {
		if _, err := Parse(file); err != nil {
			b.Fatal(err)
		}
	}
}
