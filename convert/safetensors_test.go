package convert

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stTensor is a tensor for writeST.
type stTensor struct {
	name  string
	dtype DType
	shape []int64
	data  []byte
}

// encodeST builds a safetensors file (header entries in the given order,
// data packed in that order).
func encodeST(tensors []stTensor, meta map[string]string) []byte {
	hdr := map[string]any{}
	if meta != nil {
		hdr["__metadata__"] = meta
	}
	var data []byte
	for _, t := range tensors {
		shape := t.shape
		if shape == nil {
			shape = []int64{}
		}
		hdr[t.name] = map[string]any{"dtype": t.dtype, "shape": shape, "data_offsets": []int{len(data), len(data) + len(t.data)}}
		data = append(data, t.data...)
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		panic(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(out, h...)
	return append(out, data...)
}

func writeST(t *testing.T, path string, tensors []stTensor) {
	t.Helper()
	if err := os.WriteFile(path, encodeST(tensors, map[string]string{"format": "pt"}), 0o644); err != nil {
		t.Fatal(err)
	}
}

func rawFile(hdr string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	out = append(out, hdr...)
	return append(out, data...)
}

func parseBytes(b []byte) (*Header, error) {
	h, _, err := readHeader(bytes.NewReader(b), int64(len(b)))
	return h, err
}

func TestSafetensorsRoundTrip(t *testing.T) {
	f32 := func(xs ...float32) []byte {
		var b []byte
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		return b
	}
	file := encodeST([]stTensor{
		{"a", F32, []int64{2, 2}, f32(1, 2, 3, 4)},
		{"scalar", F32, nil, f32(7)},
		{"empty", BF16, []int64{0, 5}, nil},
		{"b", BF16, []int64{3}, []byte{0x80, 0x3f, 0, 0x40, 0x40, 0x40}},
		{"p", F4E2M1, []int64{2, 4}, []byte{0x21, 0x43, 0x65, 0x87}},
	}, map[string]string{"format": "pt"})
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	sf, err := OpenSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	if sf.Header.Metadata["format"] != "pt" {
		t.Errorf("metadata %v", sf.Header.Metadata)
	}
	a, ok := sf.Header.Tensor("a")
	if !ok || a.DType != F32 || a.Elements() != 4 {
		t.Fatalf("a: %+v", a)
	}
	b, err := sf.ReadAll(a)
	if err != nil || !bytes.Equal(b, f32(1, 2, 3, 4)) {
		t.Fatalf("a data %v %v", b, err)
	}
	if s, _ := sf.Header.Tensor("scalar"); s.Elements() != 1 || s.Bytes() != 4 {
		t.Errorf("scalar: %+v", s)
	}
	if e, _ := sf.Header.Tensor("empty"); e.Bytes() != 0 {
		t.Errorf("empty: %+v", e)
	}
	if err := sf.ReadRange(a, 12, make([]byte, 8)); err == nil {
		t.Error("read past the tensor accepted")
	}
}

// TestHostileHeaders feeds malformed files and checks each is rejected with
// a message naming the problem.
func TestHostileHeaders(t *testing.T) {
	ok := `{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	data8 := make([]byte, 8)
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"short file", []byte{1, 2, 3}, "too short"},
		{"zero length", binary.LittleEndian.AppendUint64(nil, 0), "header length 0"},
		{"huge length", binary.LittleEndian.AppendUint64(nil, 1<<62), "header length"},
		{"length past file", append(binary.LittleEndian.AppendUint64(nil, 100), "{}"...), "exceeds the file"},
		{"over 100MB", binary.LittleEndian.AppendUint64(nil, MaxHeaderLen+1), "header length"},
		{"not json", rawFile("{nope", nil), "JSON"},
		{"array", rawFile("[1,2]", nil), "not a JSON object"},
		{"trailing", rawFile(ok+"{}", data8), "trailing"},
		{"unknown dtype", rawFile(`{"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,2]}}`, data8), "unknown dtype"},
		{"missing shape", rawFile(`{"t":{"dtype":"F32","data_offsets":[0,8]}}`, data8), "needs dtype, shape and data_offsets"},
		{"missing dtype", rawFile(`{"t":{"shape":[2],"data_offsets":[0,8]}}`, data8), "needs dtype"},
		{"negative dim", rawFile(`{"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, data8), "shape[0]"},
		{"fractional dim", rawFile(`{"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}`, data8), "shape[0]"},
		{"exponent dim", rawFile(`{"t":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}`, data8), "shape[0]"},
		{"string dim", rawFile(`{"t":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}}`, data8), "shape[0]"},
		{"too many dims", rawFile(`{"t":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}`, data8), "dimensions"},
		{"overflowing shape", rawFile(`{"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, data8), "too many elements"},
		{"size mismatch", rawFile(`{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, data8), "needs 12 bytes"},
		{"reversed offsets", rawFile(`{"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, data8), "reversed"},
		{"offset past data", rawFile(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, data8), "past the data section"},
		{"huge offset", rawFile(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551616]}}`, data8), "data_offsets"},
		{"three offsets", rawFile(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}`, data8), "3 entries"},
		{"overlap", rawFile(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, data8), "overlap"},
		{"duplicate", rawFile(`{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, data8), "duplicate tensor"},
		{"empty name", rawFile(`{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, data8), "empty name"},
		{"bad metadata", rawFile(`{"__metadata__":{"a":1}}`, nil), "__metadata__"},
		{"odd F4", rawFile(`{"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, data8), "whole number of bytes"},
		{"entry not object", rawFile(`{"t":[1]}`, nil), "bad entry"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseBytes(c.file)
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}
	if _, err := parseBytes(rawFile(ok, data8)); err != nil {
		t.Fatalf("valid file rejected: %v", err)
	}
}

func TestHostileIndex(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644)
	writeST(t, filepath.Join(dir, "a.safetensors"), []stTensor{{"x", F32, []int64{1}, make([]byte, 4)}})
	for _, c := range []struct{ index, want string }{
		{`{"weight_map":{"x":"../a.safetensors"}}`, "not a file name"},
		{`{"weight_map":{"x":"/etc/passwd"}}`, "not a file name"},
		{`{"weight_map":{}}`, "no weight_map"},
		{`{"weight_map":{"y":"a.safetensors"}}`, "does not hold it"},
		{`{"weight_map":{"x":"missing.safetensors"}}`, "missing.safetensors"},
		{`[`, IndexFile},
	} {
		os.WriteFile(filepath.Join(dir, IndexFile), []byte(c.index), 0o644)
		_, err := OpenHF(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("index %s: got %v, want an error mentioning %q", c.index, err, c.want)
		}
	}
	os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"weight_map":{"x":"a.safetensors"}}`), 0o644)
	ck, err := OpenHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck.Close()
}

// FuzzParseHeader checks that no input makes the header parser panic or
// accept a table that points outside the file.
func FuzzParseHeader(f *testing.F) {
	f.Add(rawFile(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(rawFile(`{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}}`, make([]byte, 16)))
	f.Add(rawFile(`{"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},"w.scale":{"dtype":"F8_E8M0","shape":[1,1],"data_offsets":[4,5]}}`, make([]byte, 5)))
	f.Add(rawFile(`{"p":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}`, make([]byte, 2)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, base, err := readHeader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		dataLen := uint64(int64(len(b)) - base)
		var prevEnd uint64
		for i := range h.Tensors {
			ti := &h.Tensors[i]
			if ti.Begin > ti.End || ti.End > dataLen || ti.Begin < prevEnd {
				t.Fatalf("accepted bad range %+v (data %d)", ti, dataLen)
			}
			prevEnd = ti.End
			if uint64(ti.Elements())*uint64(ti.DType.Bits()) != 8*ti.Bytes() {
				t.Fatalf("accepted size mismatch %+v", ti)
			}
			if got, ok := h.Tensor(ti.Name); !ok || got != ti {
				t.Fatalf("lookup of %q broken", ti.Name)
			}
		}
	})
}

// E4M3 reference: the OCP FP8 e4m3fn definition, written out per case.
func e4m3Ref(b uint8) float64 {
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	exp := int(b>>3) & 15
	man := float64(b & 7)
	if exp == 15 && b&7 == 7 {
		return math.NaN()
	}
	if exp == 0 {
		return sign * man / 8 * math.Pow(2, -6)
	}
	return sign * (1 + man/8) * math.Pow(2, float64(exp-7))
}

func TestElementDecoders(t *testing.T) {
	known := map[uint8]float32{
		0x00: 0, 0x38: 1, 0xb8: -1, 0x3c: 1.5, 0x40: 2, 0x7e: 448, 0xfe: -448,
		0x08: 1.0 / 64, 0x01: 1.0 / 512, 0x07: 7.0 / 512, 0x30: 0.5, 0x77: 240,
	}
	for b, want := range known {
		if got := E4M3ToF32(b); got != want {
			t.Errorf("E4M3(0x%02x) = %v, want %v", b, got, want)
		}
	}
	if v := E4M3ToF32(0x80); v != 0 || !math.Signbit(float64(v)) {
		t.Errorf("E4M3(0x80) = %v, want -0", v)
	}
	for i := 0; i < 256; i++ {
		got, want := E4M3ToF32(uint8(i)), e4m3Ref(uint8(i))
		if math.IsNaN(want) {
			if !math.IsNaN(float64(got)) {
				t.Errorf("E4M3(0x%02x) = %v, want NaN", i, got)
			}
			continue
		}
		if float64(got) != want {
			t.Errorf("E4M3(0x%02x) = %v, want %v", i, got, want)
		}
	}
	for e := 0; e < 255; e++ {
		if got, want := E8M0ToF32(uint8(e)), math.Ldexp(1, e-127); float64(got) != want {
			t.Errorf("E8M0(%d) = %v, want 2^%d", e, got, e-127)
		}
	}
	if !math.IsNaN(float64(E8M0ToF32(0xff))) {
		t.Error("E8M0(0xff) is not NaN")
	}
	mags := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	for i := 0; i < 16; i++ {
		want := mags[i&7]
		if i&8 != 0 {
			want = -want
		}
		if got := E2M1ToF32(uint8(i)); got != want {
			t.Errorf("E2M1(%d) = %v, want %v", i, got, want)
		}
	}
}

// TestFP8FP4Blocks builds a checkpoint with hand-chosen FP8 and FP4 codes
// and scales and checks the dequantized values computed by hand.
func TestFP8FP4Blocks(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"quantization_config":{"quant_method":"fp8","fmt":"e4m3","scale_fmt":"ue8m0","weight_block_size":[128,128]}}`), 0o644)

	// FP8 weight [130, 130]: scale blocks [2, 2] (the last row and column
	// blocks are partial, as model.py's ceil-sized scales allow).
	const R, C = 130, 130
	codes := []struct {
		b uint8
		v float32
	}{{0x38, 1}, {0xb8, -1}, {0x3c, 1.5}, {0x7e, 448}, {0x01, 1.0 / 512}, {0x00, 0}, {0x44, 3}, {0xc0, -2}}
	w := make([]byte, R*C)
	for i := range w {
		w[i] = codes[i%len(codes)].b
	}
	// scale[br][bc]: 2^1, 2^-3, 2^0, 2^-127 (e8m0 128, 124, 127, 0).
	scale := []byte{128, 124, 127, 0}
	scaleVal := []float32{2, 0.125, 1, float32(math.Ldexp(1, -127))}

	// FP4 weight: 3 rows × 64 values, packed [3, 32] I8, scales [3, 2].
	fp4 := make([]byte, 3*32)
	for i := range fp4 {
		fp4[i] = uint8(i%16) | uint8((15-i%16)<<4)
	}
	fp4s := []byte{127, 129, 126, 127, 120, 133} // 1, 4, .5, 1, 2^-7, 2^6
	fp4sv := []float32{1, 4, 0.5, 1, 1.0 / 128, 64}
	e2m1 := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}

	writeST(t, filepath.Join(dir, SingleFile), []stTensor{
		{"w.weight", F8E4M3, []int64{R, C}, w},
		{"w.scale", F8E8M0, []int64{2, 2}, scale},
		{"e.weight", I8, []int64{3, 32}, fp4},
		{"e.scale", F8E8M0, []int64{3, 2}, fp4s},
		{"bad.weight", F8E4M3, []int64{2, 2}, []byte{0x38, 0x7f, 0, 0}},
		{"bad.scale", F8E8M0, []int64{1, 1}, []byte{127}},
		{"noscale.weight", F8E4M3, []int64{1, 1}, []byte{0x38}},
		{"badscale.weight", F8E4M3, []int64{2, 2}, make([]byte, 4)},
		{"badscale.scale", F8E8M0, []int64{2, 2}, make([]byte, 4)},
	})
	ck, err := OpenHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()

	m, err := ck.matrix("w.weight")
	if err != nil {
		t.Fatal(err)
	}
	// Read in two pieces that straddle the 128-row block boundary.
	got := make([]float32, R*C)
	if err := m.read(0, 100, got[:100*C]); err != nil {
		t.Fatal(err)
	}
	if err := m.read(100, R, got[100*C:]); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < R; r++ {
		for c := 0; c < C; c++ {
			i := r*C + c
			want := codes[i%len(codes)].v * scaleVal[(r/128)*2+c/128]
			if got[i] != want {
				t.Fatalf("FP8 [%d,%d] = %v, want %v", r, c, got[i], want)
			}
		}
	}

	m, err = ck.matrix("e.weight")
	if err != nil {
		t.Fatal(err)
	}
	if m.rows != 3 || m.cols != 64 || m.bi != 32 {
		t.Fatalf("FP4 view %d×%d block %d", m.rows, m.cols, m.bi)
	}
	got = make([]float32, 3*64)
	if err := m.read(0, 3, got); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 3; r++ {
		for j := 0; j < 32; j++ {
			b := fp4[r*32+j]
			s := fp4sv[r*2+(2*j)/32]
			if lo, hi := got[r*64+2*j], got[r*64+2*j+1]; lo != e2m1[b&15]*s || hi != e2m1[b>>4]*s {
				t.Fatalf("FP4 row %d byte %d (0x%02x): got %v %v, want %v %v", r, j, b, lo, hi, e2m1[b&15]*s, e2m1[b>>4]*s)
			}
		}
	}

	m, err = ck.matrix("bad.weight")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.read(0, 2, make([]float32, 4)); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("FP8 NaN code: got %v", err)
	}
	if _, err := ck.matrix("noscale.weight"); err == nil || !strings.Contains(err.Error(), "without a .scale") {
		t.Errorf("FP8 without scale: got %v", err)
	}
	if _, err := ck.matrix("badscale.weight"); err == nil || !strings.Contains(err.Error(), "needs scale [1, 1]") {
		t.Errorf("FP8 with a wrong scale shape: got %v", err)
	}
}

func ExampleHFName() {
	for _, n := range []string{"output.weight", "blk.7.attn_output_a.weight", "blk.0.ffn_gate_tid2eid.weight", "blk.3.exp_probs_b.bias"} {
		hf, _ := HFName(n)
		fmt.Println(n, "<-", hf)
	}
	e, _ := ExpertHFNames("blk.4.ffn_up_exps.weight", 2)
	fmt.Println(e)
	// Output:
	// output.weight <- head.weight
	// blk.7.attn_output_a.weight <- layers.7.attn.wo_a.weight
	// blk.0.ffn_gate_tid2eid.weight <- layers.0.ffn.gate.tid2eid
	// blk.3.exp_probs_b.bias <- layers.3.ffn.gate.bias
	// [layers.4.ffn.experts.0.w3.weight layers.4.ffn.experts.1.w3.weight]
}
