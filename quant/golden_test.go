package quant

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
)

// goldenRow is one line of testdata/ggml-blocks.jsonl.gz (see
// docs/quant.md): a row quantized by ggml itself.
type goldenRow struct {
	Type       string  `json:"type"`
	N          int     `json:"n"`
	Kind       int     `json:"kind"`
	SrcF32     string  `json:"src_f32"`
	Quant      string  `json:"quant"`
	DequantF32 string  `json:"dequant_f32"`
	ActF32     string  `json:"act_f32"`
	ActType    string  `json:"act_type"`
	ActQuant   string  `json:"act_quant"`
	Dot        float64 `json:"dot"`
	DotF32     string  `json:"dot_f32"`

	t, at           Type
	src, deq, act   []float32
	quant, actQuant []byte
	dotBits         float32
	hasAct          bool
	lineNo          int
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex: %v", err)
	}
	return b
}

func f32s(t *testing.T, b []byte) []float32 {
	t.Helper()
	if len(b)%4 != 0 {
		t.Fatalf("f32 field of %d bytes", len(b))
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func loadGolden(t *testing.T) []*goldenRow {
	t.Helper()
	f, err := os.Open("testdata/ggml-blocks.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(nil, 1<<24)
	var rows []*goldenRow
	for line := 1; sc.Scan(); line++ {
		r := &goldenRow{lineNo: line}
		if err := json.Unmarshal(sc.Bytes(), r); err != nil {
			t.Fatalf("line %d: %v", line, err)
		}
		if r.t, err = ParseType(strings.ToUpper(r.Type)); err != nil {
			t.Fatalf("line %d: %v", line, err)
		}
		r.src = f32s(t, mustHex(t, r.SrcF32))
		r.deq = f32s(t, mustHex(t, r.DequantF32))
		r.quant = mustHex(t, r.Quant)
		if len(r.src) != r.N || len(r.deq) != r.N {
			t.Fatalf("line %d: lengths %d/%d, n=%d", line, len(r.src), len(r.deq), r.N)
		}
		if r.ActType != "" {
			r.hasAct = true
			if r.at, err = ParseType(strings.ToUpper(r.ActType)); err != nil {
				t.Fatalf("line %d: %v", line, err)
			}
			r.act = f32s(t, mustHex(t, r.ActF32))
			r.actQuant = mustHex(t, r.ActQuant)
			r.dotBits = f32s(t, mustHex(t, r.DotF32))[0]
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatal("no golden rows")
	}
	return rows
}

func TestGoldenCoverage(t *testing.T) {
	seen := map[Type]int{}
	for _, r := range loadGolden(t) {
		seen[r.t]++
	}
	for _, ty := range []Type{Q8_0, Q2_K, Q4_K, IQ2_XXS, Q8_K, F16, BF16} {
		if seen[ty] == 0 {
			t.Errorf("no golden rows for %s", ty)
		}
	}
}

func TestGoldenDequantize(t *testing.T) {
	for _, r := range loadGolden(t) {
		got := make([]float32, r.N)
		if err := Dequantize(r.t, r.quant, got); err != nil {
			t.Fatalf("line %d %s: %v", r.lineNo, r.t, err)
		}
		bad := 0
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(r.deq[i]) {
				if bad < 3 {
					t.Errorf("line %d %s kind %d: value %d = %g (%08x), ggml %g (%08x)", r.lineNo, r.t, r.Kind, i,
						got[i], math.Float32bits(got[i]), r.deq[i], math.Float32bits(r.deq[i]))
				}
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("line %d %s: %d of %d values differ", r.lineNo, r.t, bad, r.N)
		}
	}
}

// TestGoldenQuantizeExact checks the formats whose quantizer must produce
// ggml's bytes.
func TestGoldenQuantizeExact(t *testing.T) {
	n := 0
	for _, r := range loadGolden(t) {
		switch r.t {
		case Q8_0, Q8_K, F16, BF16:
		default:
			continue
		}
		n++
		got := make([]byte, len(r.quant))
		if err := Quantize(r.t, r.src, got); err != nil {
			t.Fatalf("line %d %s: %v", r.lineNo, r.t, err)
		}
		if !bytes.Equal(got, r.quant) {
			t.Errorf("line %d %s kind %d: quantized bytes differ from ggml at byte %d", r.lineNo, r.t, r.Kind, firstDiff(got, r.quant))
		}
	}
	if n == 0 {
		t.Fatal("no rows checked")
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestGoldenActivation checks that quantizing the activation rows gives
// ggml's activation bytes (Q8_0, Q8_K, and the F16/BF16 rounding).
func TestGoldenActivation(t *testing.T) {
	for _, r := range loadGolden(t) {
		if !r.hasAct {
			continue
		}
		a, err := NewActivation(r.at, len(r.act))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Set(r.act); err != nil {
			t.Fatal(err)
		}
		got := a.AppendBytes(nil)
		if !bytes.Equal(got, r.actQuant) {
			t.Errorf("line %d %s activation (%s) kind %d: bytes differ from ggml at byte %d", r.lineNo, r.t, r.at, r.Kind, firstDiff(got, r.actQuant))
		}
	}
}

// TestGoldenDot checks Dot against ggml's vec_dot on the same bytes. ggml's
// SIMD kernels add the per-block float terms in another order, so the
// results may differ by float rounding: the tolerance is a few float32 ulps
// of the sum of the magnitudes of the per-value products.
func TestGoldenDot(t *testing.T) {
	worst := map[Type]float64{}
	for _, r := range loadGolden(t) {
		if !r.hasAct {
			continue
		}
		a, err := NewActivation(r.at, len(r.act))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.SetBytes(r.actQuant); err != nil {
			t.Fatalf("line %d: %v", r.lineNo, err)
		}
		got, err := Dot(r.t, r.quant, a)
		if err != nil {
			t.Fatalf("line %d %s: %v", r.lineNo, r.t, err)
		}
		// magnitude of the summed products, from the dequantized operands
		actDeq := make([]float32, len(r.act))
		if err := Dequantize(r.at, r.actQuant, actDeq); err != nil {
			t.Fatal(err)
		}
		var mag float64
		for i := range actDeq {
			mag += math.Abs(float64(r.deq[i]) * float64(actDeq[i]))
		}
		diff := math.Abs(float64(got) - float64(r.dotBits))
		ulps := diff / (mag * 0x1p-24)
		worst[r.t] = max(worst[r.t], ulps)
		if ulps > 16 {
			t.Errorf("line %d %s kind %d: dot %g, ggml %g (diff %.3g = %.1f ulps of magnitude %g)", r.lineNo, r.t, r.Kind, got, r.dotBits, diff, ulps, mag)
		}
		// The exact value must be close too (sanity check of the tolerance).
		ref := exactDot(r.deq, actDeq)
		if d := math.Abs(float64(got) - ref); d > 16*mag*0x1p-24 {
			t.Errorf("line %d %s: dot %g, exact %g", r.lineNo, r.t, got, ref)
		}
	}
	for ty, u := range worst {
		t.Logf("%s: worst dot difference from ggml %.2f ulps of the magnitude sum", ty, u)
	}
}

func exactDot(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

func rmse(a, b []float32) float64 {
	var s float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		s += d * d
	}
	return math.Sqrt(s / float64(len(a)))
}

// TestGoldenQuantizeError checks that the K-quant and IQ2_XXS quantizers are
// about as accurate as ggml's on the same rows.
func TestGoldenQuantizeError(t *testing.T) {
	type stat struct{ ours, ggml float64 }
	stats := map[Type]*stat{}
	same := map[Type]int{}
	for _, r := range loadGolden(t) {
		switch r.t {
		case Q2_K, Q4_K, IQ2_XXS:
		default:
			continue
		}
		q := make([]byte, len(r.quant))
		if err := Quantize(r.t, r.src, q); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(q, r.quant) {
			same[r.t]++
		} else if r.t != IQ2_XXS {
			// Q2_K and Q4_K follow ggml's reference algorithm with the
			// same float32 operation order, so they reproduce its bytes.
			t.Errorf("line %d %s kind %d: quantized bytes differ from ggml at byte %d", r.lineNo, r.t, r.Kind, firstDiff(q, r.quant))
		}
		deq := make([]float32, r.N)
		if err := Dequantize(r.t, q, deq); err != nil {
			t.Fatal(err)
		}
		ours, theirs := rmse(deq, r.src), rmse(r.deq, r.src)
		if ours > 1.5*theirs {
			t.Errorf("line %d %s kind %d: RMSE %.4g, ggml %.4g", r.lineNo, r.t, r.Kind, ours, theirs)
		}
		if stats[r.t] == nil {
			stats[r.t] = &stat{}
		}
		stats[r.t].ours += ours / theirs
		stats[r.t].ggml++
	}
	for ty, s := range stats {
		t.Logf("%s: mean RMSE ratio ours/ggml %.3f over %d rows; %d rows byte-identical to ggml", ty, s.ours/s.ggml, int(s.ggml), same[ty])
	}
}
