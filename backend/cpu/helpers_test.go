package cpu_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/convert"
	"ds4go/engine"
	"ds4go/gguf"
	"ds4go/model"
)

const goldenRoot = "../../testdata/golden"

var tmpDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "ds4go-cpu-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tmpDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// stTensor is one tensor of a safetensors file.
type stTensor struct {
	dtype string
	shape []int
	data  []byte
}

func (t *stTensor) f32() []float32 {
	out := make([]float32, len(t.data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.data[4*i:]))
	}
	return out
}

func (t *stTensor) i32() []int32 {
	out := make([]int32, len(t.data)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(t.data[4*i:]))
	}
	return out
}

// readSafetensors reads a whole (small) safetensors file.
func readSafetensors(t testing.TB, path string) map[string]*stTensor {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	data := b[8+n:]
	out := map[string]*stTensor{}
	for name, raw := range hdr {
		if name == "__metadata__" {
			continue
		}
		var e struct {
			Dtype   string   `json:"dtype"`
			Shape   []int    `json:"shape"`
			Offsets [2]int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		out[name] = &stTensor{e.Dtype, e.Shape, data[e.Offsets[0]:e.Offsets[1]]}
	}
	return out
}

// goldenModel is a golden case converted to an F32 GGUF and loaded.
type goldenModel struct {
	name   string
	w      *model.Weights
	tokens map[string][]int32
}

var (
	goldenMu    sync.Mutex
	goldenCache = map[string]*goldenModel{}
)

// loadGolden converts (once per test binary) and loads a golden case.
func loadGolden(t testing.TB, name string) *goldenModel {
	t.Helper()
	goldenMu.Lock()
	defer goldenMu.Unlock()
	if g, ok := goldenCache[name]; ok {
		return g
	}
	dir := filepath.Join(goldenRoot, name)
	out := filepath.Join(tmpDir, name+".gguf")
	if err := convert.ConvertDir(context.Background(), dir, out, model.SchemeF32); err != nil {
		t.Fatalf("convert %s: %v", name, err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	var toks map[string][]int32
	b, err := os.ReadFile(filepath.Join(dir, "tokens.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &toks); err != nil {
		t.Fatal(err)
	}
	g := &goldenModel{name: name, w: w, tokens: toks}
	goldenCache[name] = g
	return g
}

func newBackend(t testing.TB, w *model.Weights, opts cpu.Options) *cpu.Backend {
	t.Helper()
	be, err := cpu.New(w, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

func newSession(t testing.TB, be engine.Backend, opts engine.Options) *engine.Session {
	t.Helper()
	s, err := engine.NewSession(be, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// agreement summarises per-row errors e = max|a−b| / max|a| (a = reference)
// as docs/forward-reference.md defines them.
type agreement struct {
	rows                 int
	max, median, p95     float64
	meanKL, top1         float64
	worstRow, worstPos   int
	firstOver1e3, over3s int
}

func (a agreement) String() string {
	return fmt.Sprintf("rows %d: max %.3g (pos %d) median %.3g p95 %.3g meanKL %.3g top1 %.4f",
		a.rows, a.max, a.worstPos, a.median, a.p95, a.meanKL, a.top1)
}

func rowErr(ref, got []float32) float64 {
	var md, ma float64
	for i, a := range ref {
		md = max(md, math.Abs(float64(a)-float64(got[i])))
		ma = max(ma, math.Abs(float64(a)))
	}
	return md / ma
}

func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	ls := math.Log(s) + mx
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - ls
	}
	return out
}

func argmax(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}

// compare computes the agreement of got with ref, row by row.
func compare(ref, got [][]float32, pos []int) agreement {
	a := agreement{rows: len(ref), worstRow: -1}
	errs := make([]float64, len(ref))
	agree := 0
	for r := range ref {
		e := rowErr(ref[r], got[r])
		errs[r] = e
		if e > a.max || a.worstRow < 0 {
			a.max, a.worstRow, a.worstPos = e, r, pos[r]
		}
		lr, lg := logSoftmax(ref[r]), logSoftmax(got[r])
		var kl float64
		for i := range lr {
			kl += math.Exp(lr[i]) * (lr[i] - lg[i])
		}
		a.meanKL += kl
		if argmax(ref[r]) == argmax(got[r]) {
			agree++
		}
	}
	a.meanKL /= float64(len(ref))
	a.top1 = float64(agree) / float64(len(ref))
	s := slices.Clone(errs)
	sort.Float64s(s)
	a.median = s[len(s)/2]
	a.p95 = s[min(len(s)-1, int(math.Ceil(0.95*float64(len(s))))-1)]
	return a
}

// goldenLogits returns the stored rows of one variant: positions and logits.
func goldenLogits(t testing.TB, lg map[string]*stTensor, key string) ([]int, [][]float32) {
	t.Helper()
	pt, ok := lg[key+".positions"]
	if !ok {
		t.Fatalf("no %s.positions", key)
	}
	lt := lg[key+".logits"]
	pos32 := pt.i32()
	vals := lt.f32()
	V := lt.shape[1]
	pos := make([]int, len(pos32))
	rows := make([][]float32, len(pos32))
	for i, p := range pos32 {
		pos[i] = int(p)
		rows[i] = vals[i*V : (i+1)*V]
	}
	return pos, rows
}
