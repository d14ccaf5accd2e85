package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"ds4go/quant"
)

// The GPU tests skip when libds4cuda.so cannot be loaded or no device opens,
// unless DS4_CUDA_REQUIRE is set (the GPU machine's script sets it), when
// they fail instead.

var (
	devOnce sync.Once
	testDev *Device
	devErr  error
)

func gpu(t testing.TB) *Device {
	t.Helper()
	devOnce.Do(func() { testDev, devErr = Open(0) })
	if devErr != nil {
		if os.Getenv("DS4_CUDA_REQUIRE") != "" {
			t.Fatalf("DS4_CUDA_REQUIRE is set but no CUDA device: %v", devErr)
		}
		t.Skipf("no CUDA: %v", devErr)
	}
	return testDev
}

func TestSearchPaths(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("DS4_CUDA_LIB", dir)
	p := SearchPaths()
	if len(p) == 0 || p[0] != filepath.Join(dir, LibName) {
		t.Fatalf("DS4_CUDA_LIB=%s (a directory): first path %v", dir, p)
	}
	t.Setenv("DS4_CUDA_LIB", "/x/y.so")
	if p := SearchPaths(); len(p) != 1 || p[0] != "/x/y.so" {
		t.Fatalf("DS4_CUDA_LIB file: paths %v, want that file alone", p)
	}
}

func TestLoadMissingLibrary(t *testing.T) {
	t.Chdir(t.TempDir())
	// a named library that is not there fails, even where another one
	// would be found further down the search list
	missing := filepath.Join(t.TempDir(), "missing", LibName)
	t.Setenv("DS4_CUDA_LIB", missing)
	_, err := load()
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "cuda: libds4cuda.so not found") ||
		!strings.Contains(err.Error(), missing) {
		t.Fatalf("error %v does not say the named library is missing", err)
	}
}

func TestDeviceInfo(t *testing.T) {
	d := gpu(t)
	info := d.Info()
	t.Logf("device: %v; library %s", info, d.LibPath())
	if info.SMs <= 0 || info.TotalMem == 0 {
		t.Fatalf("implausible device info %+v", info)
	}
}

// ---------------------------------------------------------------- helpers

// parallel runs f over [0, n) split into contiguous ranges, one per CPU.
func parallel(n int, f func(lo, hi int)) {
	w := min(runtime.NumCPU(), max(1, n))
	var wg sync.WaitGroup
	for i := 0; i < w; i++ {
		lo, hi := n*i/w, n*(i+1)/w
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}

// randomWeights returns nblocks random but valid blocks of type t: random
// quant bytes with finite, moderate f16 scales (float types: Gaussian values).
func randomWeights(t quant.Type, nblocks int64, seed uint64) []byte {
	bb := int64(t.BlockBytes())
	out := make([]byte, nblocks*bb)
	const chunk = 1 << 16
	nch := int((nblocks + chunk - 1) / chunk)
	parallel(nch, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			b0, b1 := int64(c)*chunk, min(int64(c+1)*chunk, nblocks)
			buf := out[b0*bb : b1*bb]
			switch t {
			case quant.F32:
				for i := 0; i < len(buf); i += 4 {
					binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(float32(r.NormFloat64()*0.05)))
				}
				continue
			case quant.F16:
				for i := 0; i < len(buf); i += 2 {
					binary.LittleEndian.PutUint16(buf[i:], quant.F32ToF16(float32(r.NormFloat64()*0.05)))
				}
				continue
			case quant.BF16:
				for i := 0; i < len(buf); i += 2 {
					binary.LittleEndian.PutUint16(buf[i:], quant.F32ToBF16(float32(r.NormFloat64()*0.05)))
				}
				continue
			}
			for i := 0; i+8 <= len(buf); i += 8 {
				binary.LittleEndian.PutUint64(buf[i:], r.Uint64())
			}
			for i := len(buf) &^ 7; i < len(buf); i++ {
				buf[i] = byte(r.Uint32())
			}
			scale := func() uint16 { return quant.F32ToF16(float32(0.001 + 0.01*r.Float64())) }
			for b := int64(0); b < b1-b0; b++ {
				blk := buf[b*bb : (b+1)*bb]
				switch t {
				case quant.Q8_0:
					binary.LittleEndian.PutUint16(blk[0:], scale())
				case quant.Q2_K:
					binary.LittleEndian.PutUint16(blk[80:], scale())
					binary.LittleEndian.PutUint16(blk[82:], scale())
				case quant.Q4_K:
					binary.LittleEndian.PutUint16(blk[0:], scale())
					binary.LittleEndian.PutUint16(blk[2:], scale())
				case quant.IQ2_XXS:
					binary.LittleEndian.PutUint16(blk[0:], scale())
				}
			}
		}
	})
	return out
}

func gaussian(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// reference computes quant.MatVec of rows x cols weights of type t with x
// (quantized as quant.ActivationType says) and each row's Σ|w_i·x_i| over
// the dequantized weights.
func reference(t testing.TB, typ quant.Type, w []byte, rows, cols int, x []float32) (out []float32, mag []float64) {
	at, err := quant.ActivationType(typ)
	if err != nil {
		t.Fatal(err)
	}
	act, err := quant.NewActivation(at, cols)
	if err != nil {
		t.Fatal(err)
	}
	if err := act.Set(x); err != nil {
		t.Fatal(err)
	}
	rb64, _ := typ.RowBytes(int64(cols))
	rb := int(rb64)
	out = make([]float32, rows)
	mag = make([]float64, rows)
	var mu sync.Mutex
	var firstErr error
	parallel(rows, func(lo, hi int) {
		if err := quant.MatVec(typ, w[lo*rb:hi*rb], act, out[lo:hi]); err != nil {
			mu.Lock()
			firstErr = err
			mu.Unlock()
			return
		}
		buf := make([]float32, cols)
		for r := lo; r < hi; r++ {
			if err := quant.Dequantize(typ, w[r*rb:(r+1)*rb], buf); err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
				return
			}
			var s float64
			for i, v := range buf {
				s += math.Abs(float64(v) * float64(x[i]))
			}
			mag[r] = s
		}
	})
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	return out, mag
}

// nterms is the number of float terms quant.Dot adds for a row of cols values.
func nterms(t quant.Type, cols int) int {
	if t.BlockSize() == 1 {
		return cols / 4
	}
	return cols / t.BlockSize()
}

// compare checks got against want within a tolerance in float32 ulps of the
// rows' magnitude sums, reports the largest error and returns it.
func compare(t *testing.T, name string, got, want []float32, mag []float64, terms int) float64 {
	t.Helper()
	tol := 4 + math.Sqrt(float64(terms))/2
	var worst float64
	bad := 0
	for i := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			if bad < 5 {
				t.Errorf("%s: row %d: got %v, want %v", name, i, got[i], want[i])
			}
			bad++
			continue
		}
		ulp := mag[i] * 0x1p-24
		if ulp == 0 {
			ulp = 0x1p-149
		}
		e := math.Abs(g-float64(want[i])) / ulp
		worst = max(worst, e)
		if e > tol {
			if bad < 5 {
				t.Errorf("%s: row %d: got %v, want %v (%.1f ulps of Σ|w·x| = %g; tolerance %.0f)", name, i, got[i], want[i], e, mag[i], tol)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d rows out of tolerance", name, bad, len(want))
	}
	t.Logf("%-34s max error %6.2f ulps of Σ|w·x| (tolerance %.0f)", name, worst, tol)
	return worst
}

// alloc allocates device memory that the test's cleanup frees.
func alloc(t testing.TB, d *Device, n int64) Ptr {
	t.Helper()
	p := tempAlloc(t, d, n)
	t.Cleanup(func() { d.Free(p) })
	return p
}

// upload copies x to new device memory that the test's cleanup frees.
func upload(t testing.TB, d *Device, x []float32) Ptr {
	t.Helper()
	p := tempUpload(t, d, x)
	t.Cleanup(func() { d.Free(p) })
	return p
}

func download(t testing.TB, d *Device, p Ptr, n int) []float32 {
	t.Helper()
	out := make([]float32, n)
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := DownloadSlice(d, out, p); err != nil {
		t.Fatal(err)
	}
	return out
}

// poison fills n floats at p with NaN bit patterns, so unwritten outputs show.
func poison(t testing.TB, d *Device, p Ptr, n int) {
	t.Helper()
	if err := d.MemsetAsync(p, 0xff, int64(4*n), 0); err != nil {
		t.Fatal(err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func uploadWeight(t testing.TB, d *Device, typ quant.Type, rows, cols, mats int, data []byte) *Weight {
	t.Helper()
	w, err := d.UploadWeight(typ, rows, cols, mats, data)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.FreeWeight(w) })
	return w
}

// randomMats uploads mats random matrices of rows × cols weights of type typ
// (seeded) and returns each matrix's GGUF bytes by index, the device weight
// and the bytes of one activation row for it.
func randomMats(t testing.TB, d *Device, typ quant.Type, rows, cols, mats int, seed uint64) (mat func(int) []byte, dw *Weight, ab int64) {
	t.Helper()
	return randomMatsEdit(t, d, typ, rows, cols, mats, seed, nil)
}

// randomMatsEdit is randomMats with edit (when not nil) applied to the
// matrices' GGUF bytes before they are uploaded.
func randomMatsEdit(t testing.TB, d *Device, typ quant.Type, rows, cols, mats int, seed uint64, edit func(w []byte)) (mat func(int) []byte, dw *Weight, ab int64) {
	t.Helper()
	mb := weightBytes(typ, rows, cols)
	w := randomWeights(typ, int64(mats)*mb/int64(typ.BlockBytes()), seed)
	if edit != nil {
		edit(w)
	}
	dw = uploadWeight(t, d, typ, rows, cols, mats, w)
	at, err := d.ActType(typ)
	if err != nil {
		t.Fatal(err)
	}
	return func(m int) []byte { return w[int64(m)*mb : int64(m+1)*mb] }, dw, d.ActBytes(at, cols)
}

// quantizeOnDevice uploads ntok rows of x and quantizes them for weights of
// type wt, returning the activation rows.
func quantizeOnDevice(t testing.TB, d *Device, wt quant.Type, x []float32, cols, ntok int) Ptr {
	t.Helper()
	at, err := d.ActType(wt)
	must(t, err)
	xp := upload(t, d, x)
	act := alloc(t, d, d.ActBytes(at, cols)*int64(ntok))
	must(t, d.Quantize(0, at, xp, cols, act, cols, ntok))
	return act
}

// ---------------------------------------------------------------- activations

// ggmlActBytes converts one device activation row into ggml's encoding.
func ggmlActBytes(t quant.Type, row []byte, cols int) []byte {
	var out []byte
	switch t {
	case quant.F32:
		return append(out, row[:4*cols]...)
	case quant.Q8_0:
		for b := 0; b < cols/32; b++ {
			d := math.Float32frombits(binary.LittleEndian.Uint32(row[cols+4*b:]))
			out = binary.LittleEndian.AppendUint16(out, quant.F32ToF16(d))
			out = append(out, row[32*b:32*b+32]...)
		}
	case quant.Q8_K:
		nb := cols / 256
		for b := 0; b < nb; b++ {
			out = append(out, row[cols+4*b:cols+4*b+4]...)
			out = append(out, row[256*b:256*b+256]...)
			out = append(out, row[cols+4*nb+32*b:cols+4*nb+32*b+32]...)
		}
	}
	return out
}

// TestQuantizeActivation checks Quantize against quant.Activation byte for
// byte, with each OptQuantVec variant, rows packed and rows at an odd
// stride (which the vector kernels leave to the scalar ones).
func TestQuantizeActivation(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptQuantVec, 1) })
	for _, vec := range []int{1, 0} {
		must(t, d.SetOption(OptQuantVec, vec))
		for _, at := range []quant.Type{quant.F32, quant.Q8_0, quant.Q8_K} {
			for _, cols := range []int{256, 1024, 4096, 16384} {
				for _, pad := range []int{0, 1} {
					ntok := 3
					if cols == 1024 {
						ntok = 37
					}
					xs := cols + pad
					x := gaussian(xs*ntok, uint64(cols)+uint64(at))
					// special blocks: zeros, a tie of magnitudes, huge and tiny values
					for i := 0; i < 256; i++ {
						x[i] = 0
					}
					x[xs+5], x[xs+9] = -3.5, 3.5
					x[2*xs] = 1e30
					x[2*xs+300%cols] = 1e-30
					xp := upload(t, d, x)
					ab := d.ActBytes(at, cols)
					act := alloc(t, d, ab*int64(ntok))
					must(t, d.MemsetAsync(act, 0xa5, ab*int64(ntok), 0))
					must(t, d.Quantize(0, at, xp, xs, act, cols, ntok))
					must(t, d.Synchronize())
					got := make([]byte, ab*int64(ntok))
					must(t, d.Download(got, act))
					ref, err := quant.NewActivation(at, cols)
					must(t, err)
					for tok := 0; tok < ntok; tok++ {
						must(t, ref.Set(x[tok*xs:tok*xs+cols]))
						want := ref.AppendBytes(nil)
						g := ggmlActBytes(at, got[int64(tok)*ab:], cols)
						if string(g) != string(want) {
							for i := range want {
								if g[i] != want[i] {
									t.Fatalf("vec %d %s cols %d stride %d token %d: byte %d differs: got %#x want %#x", vec, at, cols, xs, tok, i, g[i], want[i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// ---------------------------------------------------------------- products

type shape struct {
	name       string
	typ        quant.Type
	rows, cols int
}

// flashShapes are the dense matrices of DeepSeek V4 Flash (rows = outputs).
var flashShapes = []shape{
	{"attn_q_a", quant.Q8_0, 1024, 4096},
	{"attn_q_b", quant.Q8_0, 32768, 1024},
	{"attn_kv", quant.Q8_0, 512, 4096},
	{"attn_output_a (8 groups)", quant.Q8_0, 8192, 4096},
	{"attn_output_b", quant.Q8_0, 4096, 8192},
	{"ffn_gate_shexp", quant.Q8_0, 2048, 4096},
	{"ffn_down_shexp", quant.Q8_0, 4096, 2048},
	{"q8_0 32768x4096", quant.Q8_0, 32768, 4096},
	{"output (lm_head)", quant.Q8_0, 129280, 4096},
	{"attn_compressor_kv r4", quant.F16, 1024, 4096},
	{"indexer.attn_q_b", quant.F16, 8192, 1024},
	{"ffn_gate_inp (router)", quant.F16, 256, 4096},
	{"hc_attn_fn", quant.F16, 24, 16384},
	{"f32 4096x64", quant.F32, 64, 4096},
	{"q2_k 4096x2048", quant.Q2_K, 4096, 2048},
	{"q4_k 2048x4096", quant.Q4_K, 2048, 4096},
	{"iq2_xxs 2048x4096", quant.IQ2_XXS, 2048, 4096},
}

func weightBytes(typ quant.Type, rows, cols int) int64 {
	rb, _ := typ.RowBytes(int64(cols))
	return rb * int64(rows)
}

func TestMatVecFlashShapes(t *testing.T) {
	d := gpu(t)
	for i, s := range flashShapes {
		if testing.Short() && s.rows > 32768 {
			continue
		}
		w := randomWeights(s.typ, weightBytes(s.typ, s.rows, s.cols)/int64(s.typ.BlockBytes()), uint64(100+i))
		x := gaussian(s.cols, uint64(200+i))
		want, mag := reference(t, s.typ, w, s.rows, s.cols, x)
		dw := uploadWeight(t, d, s.typ, s.rows, s.cols, 1, w)
		act := quantizeOnDevice(t, d, s.typ, x, s.cols, 1)
		y := alloc(t, d, int64(4*s.rows))
		poison(t, d, y, s.rows)
		must(t, d.MatMul(0, dw, act, 0, 1, y, 0))
		got := download(t, d, y, s.rows)
		compare(t, fmt.Sprintf("%s %s %dx%d", s.name, s.typ, s.rows, s.cols), got, want, mag, nterms(s.typ, s.cols))
		d.FreeWeight(dw)
	}
}

func TestMatMulBatch(t *testing.T) {
	d := gpu(t)
	cases := []struct {
		typ        quant.Type
		rows, cols int
		nts        []int
	}{
		{quant.Q8_0, 1024, 4096, []int{2, 3, 5, 8, 11, 17}},
		{quant.F16, 512, 1024, []int{3, 9}},
		{quant.F32, 64, 512, []int{4}},
		{quant.Q2_K, 512, 2048, []int{3, 8}},
		{quant.Q4_K, 256, 4096, []int{2, 6}},
		{quant.IQ2_XXS, 256, 4096, []int{3, 8}},
	}
	for ci, c := range cases {
		w := randomWeights(c.typ, weightBytes(c.typ, c.rows, c.cols)/int64(c.typ.BlockBytes()), uint64(300+ci))
		dw := uploadWeight(t, d, c.typ, c.rows, c.cols, 1, w)
		for _, nt := range c.nts {
			x := gaussian(nt*c.cols, uint64(400+nt+10*ci))
			act := quantizeOnDevice(t, d, c.typ, x, c.cols, nt)
			// output rows padded to a stride larger than rows
			ys := c.rows + 3
			y := alloc(t, d, int64(4*ys*nt))
			poison(t, d, y, ys*nt)
			must(t, d.MatMul(0, dw, act, 0, nt, y, ys))
			got := download(t, d, y, ys*nt)
			for tok := 0; tok < nt; tok++ {
				want, mag := reference(t, c.typ, w, c.rows, c.cols, x[tok*c.cols:(tok+1)*c.cols])
				compare(t, fmt.Sprintf("%s %dx%d nt=%d tok %d", c.typ, c.rows, c.cols, nt, tok), got[tok*ys:tok*ys+c.rows], want, mag, nterms(c.typ, c.cols))
			}
		}
	}
}

func TestMatVecIDs(t *testing.T) {
	d := gpu(t)
	cases := []struct {
		typ        quant.Type
		rows, cols int
		shared     bool // one activation for all selections (gate/up) or one each (down)
	}{
		{quant.IQ2_XXS, 2048, 4096, true},
		{quant.Q2_K, 4096, 2048, false},
		{quant.Q4_K, 2048, 4096, true},
		{quant.Q4_K, 4096, 2048, false},
		{quant.Q8_0, 2048, 4096, true},
		{quant.F16, 256, 1024, false},
	}
	const mats = 16
	ids := []int32{3, 15, 0, 7, 7, 9}
	for ci, c := range cases {
		w := randomWeights(c.typ, int64(mats)*weightBytes(c.typ, c.rows, c.cols)/int64(c.typ.BlockBytes()), uint64(500+ci))
		dw := uploadWeight(t, d, c.typ, c.rows, c.cols, mats, w)
		nact := len(ids)
		if c.shared {
			nact = 1
		}
		x := gaussian(nact*c.cols, uint64(600+ci))
		act := quantizeOnDevice(t, d, c.typ, x, c.cols, nact)
		at, _ := d.ActType(c.typ)
		stride := int64(0)
		if !c.shared {
			stride = d.ActBytes(at, c.cols)
		}
		idp := alloc(t, d, 4*int64(len(ids)+1))
		must(t, UploadSlice(d, idp, append(append([]int32(nil), ids...), mats)))
		y := alloc(t, d, int64(4*c.rows*(len(ids)+1)))
		poison(t, d, y, c.rows*(len(ids)+1))
		// one more selection, out of range: its rows must come back NaN
		must(t, d.MatVecIDs(0, dw, idp, len(ids)+1, act, stride, y, 0))
		got := download(t, d, y, c.rows*(len(ids)+1))
		mb := int(weightBytes(c.typ, c.rows, c.cols))
		for s, e := range ids {
			xs := x
			if !c.shared {
				xs = x[s*c.cols : (s+1)*c.cols]
			}
			want, mag := reference(t, c.typ, w[int(e)*mb:(int(e)+1)*mb], c.rows, c.cols, xs)
			compare(t, fmt.Sprintf("%s %dx%d expert %d (sel %d)", c.typ, c.rows, c.cols, e, s), got[s*c.rows:(s+1)*c.rows], want, mag, nterms(c.typ, c.cols))
		}
		for i, v := range got[len(ids)*c.rows:] {
			if !math.IsNaN(float64(v)) {
				t.Fatalf("%s: out-of-range expert id: row %d = %v, want NaN", c.typ, i, v)
			}
		}
	}
}

// TestMatMulGroupedPair checks the routed gate-and-up pair against
// quant.Dot bit for bit: for decode's few selections (one k_mv_dec launch
// over both tensors; with OptMVDec off, the two grouped calls) and for a
// chunk's many (the grouped tensor-core calls), with one activation for
// each token's K selections and one id out of range (NaN rows).
func TestMatMulGroupedPair(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptMVDec, DefaultMVDec) })
	const mats, K = 9, 3
	for ci, c := range []struct {
		typ        quant.Type
		rows, cols int
	}{{quant.IQ2_XXS, 200, 4096}, {quant.Q2_K, 136, 2048}, {quant.Q8_0, 64, 1024}} {
		mat1, dw1, ab := randomMats(t, d, c.typ, c.rows, c.cols, mats, uint64(3100+ci))
		mat2, dw2, _ := randomMats(t, d, c.typ, c.rows, c.cols, mats, uint64(3200+ci))
		for _, dec := range []int{DefaultMVDec, 0} {
			must(t, d.SetOption(OptMVDec, dec))
			for _, ntok := range []int{2, 40} {
				nsel := ntok * K
				ids, idp, grp := groupedIDs(t, d, nsel, mats, uint64(ci), uint64(ntok))
				x := gaussian(ntok*c.cols, uint64(3300+ci+ntok))
				act := quantizeOnDevice(t, d, c.typ, x, c.cols, ntok)
				ys := int64(c.rows + 3)
				y1, y2 := alloc(t, d, 4*ys*int64(nsel)), alloc(t, d, 4*ys*int64(nsel))
				poison(t, d, y1, int(ys)*nsel)
				poison(t, d, y2, int(ys)*nsel)
				must(t, d.MatMulGroupedPair(0, dw1, dw2, idp, nsel, act, ab, K, y1, y2, ys, grp, true))
				for k, out := range []struct {
					y   Ptr
					mat func(int) []byte
				}{{y1, mat1}, {y2, mat2}} {
					got := download(t, d, out.y, int(ys)*nsel)
					for i := 0; i < nsel; i++ {
						row := got[int64(i)*ys : int64(i)*ys+int64(c.rows)]
						name := fmt.Sprintf("%s %dx%d mv_dec %d nsel %d tensor %d sel %d", c.typ, c.rows, c.cols, dec, nsel, k, i)
						if ids[i] == mats {
							for r, v := range row {
								if !math.IsNaN(float64(v)) {
									t.Fatalf("%s (id out of range): row %d = %v, want NaN", name, r, v)
								}
							}
							continue
						}
						want, _ := reference(t, c.typ, out.mat(int(ids[i])), c.rows, c.cols, x[(i/K)*c.cols:(i/K+1)*c.cols])
						for r := range want {
							if math.Float32bits(row[r]) != math.Float32bits(want[r]) {
								t.Fatalf("%s row %d: got %v, want %v", name, r, row[r], want[r])
							}
						}
					}
				}
			}
		}
		d.FreeWeight(dw1)
		d.FreeWeight(dw2)
	}
}

// TestMatVecPair checks MatMulGroupedPair of one selection of one matrix
// (a shared expert's gate and up in one k_matvec grid, OptMVPair) bit for
// bit: against the CPU's products in exact mode, and in fast mode against
// two MatMulEx launches that run as the pair does (option on: k_matvec,
// OptMVPipeMin raised; off: the default launches).
func TestMatVecPair(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptMVPair, 1); d.SetOption(OptMVPipeMin, DefaultMVPipeMin) })
	for ci, c := range []struct {
		typ        quant.Type
		rows, cols int
	}{{quant.Q8_0, 2048, 4096}, {quant.Q8_0, 200, 1024}, {quant.Q4_K, 2048, 4096}, {quant.Q4_K, 136, 2048}} {
		mat1, dw1, _ := randomMats(t, d, c.typ, c.rows, c.cols, 1, uint64(3400+ci))
		mat2, dw2, _ := randomMats(t, d, c.typ, c.rows, c.cols, 1, uint64(3500+ci))
		x := gaussian(c.cols, uint64(3600+ci))
		act := quantizeOnDevice(t, d, c.typ, x, c.cols, 1)
		y1, y2 := alloc(t, d, 4*int64(c.rows)), alloc(t, d, 4*int64(c.rows))
		r1, r2 := alloc(t, d, 4*int64(c.rows)), alloc(t, d, 4*int64(c.rows))
		for _, exact := range []bool{true, false} {
			for _, on := range []int{1, 0} {
				// fast mode's reference, the separate launches: on k_matvec
				// where the pair is one k_matvec grid (alone, a Q8_0
				// product goes pipelined, which adds in another order),
				// else as they are
				if on == 1 {
					must(t, d.SetOption(OptMVPipeMin, 1<<20))
				}
				must(t, d.MatMulEx(0, dw1, 0, 1, act, 0, 0, 1, 1, r1, 0, 0, exact))
				must(t, d.MatMulEx(0, dw2, 0, 1, act, 0, 0, 1, 1, r2, 0, 0, exact))
				must(t, d.SetOption(OptMVPipeMin, DefaultMVPipeMin))
				must(t, d.SetOption(OptMVPair, on))
				poison(t, d, y1, c.rows)
				poison(t, d, y2, c.rows)
				must(t, d.MatMulGroupedPair(0, dw1, dw2, 0, 1, act, 0, 1, y1, y2, 0, 0, exact))
				for k, out := range []struct {
					y, ref Ptr
					mat    func(int) []byte
				}{{y1, r1, mat1}, {y2, r2, mat2}} {
					got := download(t, d, out.y, c.rows)
					want := download(t, d, out.ref, c.rows)
					if exact {
						want, _ = reference(t, c.typ, out.mat(0), c.rows, c.cols, x)
					}
					for r := range want {
						if math.Float32bits(got[r]) != math.Float32bits(want[r]) {
							t.Fatalf("%s %dx%d exact %v mv_pair %d tensor %d row %d: got %v, want %v", c.typ, c.rows, c.cols, exact, on, k, r, got[r], want[r])
						}
					}
				}
			}
		}
		d.FreeWeight(dw1)
		d.FreeWeight(dw2)
	}
}

// TestMatVecF32 checks MatVecF32 (one token's Q8_0 product with the float
// row's RMSNorm and quantization formed inside the pipelined kernel) bit
// for bit against RMSNormRef, Quantize and MatMulEx, with OptMVF32 on and
// off and with room (one CTA an SM, DS4C_MM_ROOM): q_b's shape with its
// norm, wo_b's without, and a product below the pipeline's threshold (the
// three steps either way); x stays unchanged.
func TestMatVecF32(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptMVF32, DefaultMVF32) })
	const eps = 1e-6
	for ci, c := range []struct {
		rows, cols int
		norm       bool
	}{{16384, 1024, true}, {2048, 8192, false}, {300, 1024, true}} {
		_, dw, ab := randomMats(t, d, quant.Q8_0, c.rows, c.cols, 1, uint64(4100+ci))
		x := gaussian(c.cols, uint64(4200+ci))
		for i := 64; i < 96; i++ { // an all-zero block
			x[i] = 0
		}
		dx := upload(t, d, x)
		var nw Ptr
		if c.norm {
			nw = upload(t, d, gaussian(c.cols, uint64(4300+ci)))
		}
		in, xn, act := dx, alloc(t, d, 4*int64(c.cols)), alloc(t, d, ab)
		if c.norm {
			must(t, d.RMSNormRef(0, dx, int64(c.cols), nw, xn, int64(c.cols), c.cols, 1, eps))
			in = xn
		}
		must(t, d.Quantize(0, quant.Q8_0, in, c.cols, act, c.cols, 1))
		ref := alloc(t, d, 4*int64(c.rows))
		must(t, d.MatMulEx(0, dw, 0, 1, act, ab, 0, 1, 1, ref, int64(c.rows), 0, true))
		want := download(t, d, ref, c.rows)
		for _, on := range []int{1, 0} {
			must(t, d.SetOption(OptMVF32, on))
			for _, room := range []bool{false, true} {
				y, xn2, act2 := alloc(t, d, 4*int64(c.rows)), alloc(t, d, 4*int64(c.cols)), alloc(t, d, ab)
				poison(t, d, y, c.rows)
				must(t, d.MatVecF32(0, dw, dx, nw, eps, xn2, act2, y, true, room, 1))
				got := download(t, d, y, c.rows)
				for r := range want {
					if math.Float32bits(got[r]) != math.Float32bits(want[r]) {
						t.Fatalf("%dx%d norm %v mv_f32 %d room %v: row %d = %v, want %v", c.rows, c.cols, c.norm, on, room, r, got[r], want[r])
					}
				}
			}
		}
		for i, v := range download(t, d, dx, c.cols) {
			if math.Float32bits(v) != math.Float32bits(x[i]) {
				t.Fatalf("%dx%d: x[%d] changed to %v", c.rows, c.cols, i, v)
			}
		}
		d.FreeWeight(dw)
	}
}

// TestMatVecF32ExactF16: exact mode's MatVecF32 of a single F16 matrix —
// the indexer's query product from q_a's row — in one launch (OptMVF32
// bit 4: k_fexact_warp staging the row after its RMSNorm) gives the bits
// of RMSNormRef then the exact product, as the separate launches (the bit
// off) do: one period (1024 and 2048 columns) and two (4096, and 4000:
// rows not a whole number of a CTA's loads), x unchanged; with the
// rows' and the norm's loads batched (OptFXLive bits 2 and 4) or not.
func TestMatVecF32ExactF16(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptMVF32, DefaultMVF32); d.SetOption(OptFXLive, DefaultFXLive) })
	const eps = 1e-6
	for ci, c := range []struct{ rows, cols int }{{8192, 1024}, {300, 2048}, {64, 4096}, {1000, 4000}} {
		_, dw, _ := randomMats(t, d, quant.F16, c.rows, c.cols, 1, uint64(4400+ci))
		x := gaussian(c.cols, uint64(4500+ci))
		dx, nw := upload(t, d, x), upload(t, d, gaussian(c.cols, uint64(4600+ci)))
		xn := alloc(t, d, 4*int64(c.cols))
		must(t, d.RMSNormRef(0, dx, int64(c.cols), nw, xn, int64(c.cols), c.cols, 1, eps))
		ref := alloc(t, d, 4*int64(c.rows))
		must(t, d.MatMulEx(0, dw, 0, 1, xn, 4*int64(c.cols), 0, 1, 1, ref, int64(c.rows), 0, true))
		want := download(t, d, ref, c.rows)
		// (and the rows' and the norm's loads a float4 a thread at a time,
		// OptFXLive without bits 2 and 4)
		for _, v := range []struct{ opt, fx int }{{DefaultMVF32, DefaultFXLive}, {DefaultMVF32 &^ 4, DefaultFXLive},
			{DefaultMVF32, DefaultFXLive &^ 4}, {DefaultMVF32, DefaultFXLive &^ 6}, {DefaultMVF32 &^ 4, DefaultFXLive &^ 6}} {
			must(t, d.SetOption(OptMVF32, v.opt))
			must(t, d.SetOption(OptFXLive, v.fx))
			y, xn2 := alloc(t, d, 4*int64(c.rows)), alloc(t, d, 4*int64(c.cols))
			poison(t, d, y, c.rows)
			must(t, d.MatVecF32(0, dw, dx, nw, eps, xn2, 0, y, true, false, 1))
			got := download(t, d, y, c.rows)
			if i, ok := firstBitDiff(got, want); !ok {
				t.Fatalf("%dx%d mv_f32 %d, fx_live %d: row %d = %v, want %v", c.rows, c.cols, v.opt, v.fx, i, got[i], want[i])
			}
		}
		must(t, d.SetOption(OptFXLive, DefaultFXLive))
		for i, v := range download(t, d, dx, c.cols) {
			if math.Float32bits(v) != math.Float32bits(x[i]) {
				t.Fatalf("%dx%d: x[%d] changed to %v", c.rows, c.cols, i, v)
			}
		}
		d.FreeWeight(dw)
	}
}

func TestSplitKAndLoadFlavours(t *testing.T) {
	d := gpu(t)
	defer d.SetOption(OptSplitK, 0)
	defer d.SetOption(OptRowsPerWarp, 0)
	defer d.SetOption(OptWeightLoad, 1)
	for ci, typ := range []quant.Type{quant.Q8_0, quant.IQ2_XXS, quant.Q2_K, quant.Q4_K, quant.F16, quant.F32} {
		rows, cols := 517, 4096 // not a multiple of any rows-per-CTA
		w := randomWeights(typ, weightBytes(typ, rows, cols)/int64(typ.BlockBytes()), uint64(700+ci))
		x := gaussian(cols, uint64(800+ci))
		want, mag := reference(t, typ, w, rows, cols, x)
		dw := uploadWeight(t, d, typ, rows, cols, 1, w)
		act := quantizeOnDevice(t, d, typ, x, cols, 1)
		y := alloc(t, d, int64(4*rows))
		var base []float32
		for _, sk := range []int{1, 2, 4, 8, -2, -4, -8} { // negative: rows per warp
			for wl := 0; wl < 3; wl++ {
				if sk > 0 {
					must(t, d.SetOption(OptRowsPerWarp, 0))
					must(t, d.SetOption(OptSplitK, sk))
				} else {
					must(t, d.SetOption(OptSplitK, 0))
					must(t, d.SetOption(OptRowsPerWarp, -sk))
				}
				must(t, d.SetOption(OptWeightLoad, wl))
				poison(t, d, y, rows)
				must(t, d.MatMul(0, dw, act, 0, 1, y, 0))
				got := download(t, d, y, rows)
				if wl == 0 {
					base = got
					compare(t, fmt.Sprintf("%s splitk=%d (<0: rows/warp)", typ, sk), got, want, mag, nterms(typ, cols))
				} else {
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(base[i]) {
							t.Fatalf("%s splitk %d: load flavour %d changed row %d: %v vs %v", typ, sk, wl, i, got[i], base[i])
						}
					}
				}
			}
		}
	}
}

func TestOps(t *testing.T) {
	d := gpu(t)
	const n, rows = 4096, 3
	x := gaussian(n*rows, 900)
	w := gaussian(n, 901)
	xp, wp := upload(t, d, x), upload(t, d, w)
	y := alloc(t, d, 4*n*rows)
	check := func(name string, got []float32, want []float64) {
		t.Helper()
		var num, den float64
		for i := range want {
			num += (float64(got[i]) - want[i]) * (float64(got[i]) - want[i])
			den += want[i] * want[i]
		}
		rel := math.Sqrt(num / den)
		t.Logf("%s: relative error %.2e", name, rel)
		if !(rel < 1e-6) {
			t.Errorf("%s: relative error %.2e", name, rel)
		}
	}
	// RMSNorm
	poison(t, d, y, n*rows)
	must(t, d.RMSNorm(0, xp, wp, y, n, rows, 1e-6))
	got := download(t, d, y, n*rows)
	want := make([]float64, n*rows)
	for r := 0; r < rows; r++ {
		var ss float64
		for _, v := range x[r*n : (r+1)*n] {
			ss += float64(v) * float64(v)
		}
		sc := 1 / math.Sqrt(ss/n+1e-6)
		for i := 0; i < n; i++ {
			want[r*n+i] = float64(x[r*n+i]) * sc * float64(w[i])
		}
	}
	check("rmsnorm", got, want)
	// softmax
	poison(t, d, y, n*rows)
	must(t, d.Softmax(0, xp, y, n, rows))
	got = download(t, d, y, n*rows)
	for r := 0; r < rows; r++ {
		m := math.Inf(-1)
		for _, v := range x[r*n : (r+1)*n] {
			m = max(m, float64(v))
		}
		var s float64
		for i := 0; i < n; i++ {
			want[r*n+i] = math.Exp(float64(x[r*n+i]) - m)
			s += want[r*n+i]
		}
		for i := 0; i < n; i++ {
			want[r*n+i] /= s
		}
	}
	check("softmax", got, want)
	// SwiGLU with clamp
	for _, clamp := range []float32{0, 1.5} {
		poison(t, d, y, n)
		must(t, d.SwiGLU(0, xp, xp.Add(4*n), y, n, clamp))
		got = download(t, d, y, n)
		for i := 0; i < n; i++ {
			g, u := float64(x[i]), float64(x[n+i])
			if clamp > 0 {
				g = math.Min(g, float64(clamp))
				u = math.Max(math.Min(u, float64(clamp)), -float64(clamp))
			}
			want[i] = g / (1 + math.Exp(-g)) * u
		}
		check(fmt.Sprintf("swiglu clamp %v", clamp), got, want[:n])
	}
}

func TestGraphReplay(t *testing.T) {
	d := gpu(t)
	rows, cols := 1024, 4096
	w := randomWeights(quant.Q8_0, weightBytes(quant.Q8_0, rows, cols)/34, 1000)
	dw := uploadWeight(t, d, quant.Q8_0, rows, cols, 1, w)
	x := gaussian(cols, 1001)
	xp := upload(t, d, x)
	act := alloc(t, d, d.ActBytes(quant.Q8_0, cols))
	y := alloc(t, d, int64(4*rows))
	s, err := d.NewStream()
	must(t, err)
	defer d.DestroyStream(s)
	must(t, d.BeginCapture(s))
	must(t, d.Quantize(s, quant.Q8_0, xp, cols, act, cols, 1))
	must(t, d.MatMul(s, dw, act, 0, 1, y, 0))
	g, err := d.EndCapture(s)
	must(t, err)
	defer d.DestroyGraph(g)
	poison(t, d, y, rows)
	must(t, d.Synchronize())
	must(t, d.Launch(g, s))
	must(t, d.SyncStream(s))
	got := download(t, d, y, rows)
	want, mag := reference(t, quant.Q8_0, w, rows, cols, x)
	compare(t, "graph quantize+matmul", got, want, mag, nterms(quant.Q8_0, cols))
}

// TestMatMulExact checks that exact products (MatMulEx with exact) are
// bit-identical to quant.MatVec, single and batched, dense and by ids.
func TestMatMulExact(t *testing.T) {
	d := gpu(t)
	pipeEverywhere(t, d)
	cases := []struct {
		typ        quant.Type
		rows, cols int
		mats       int
	}{
		{quant.Q8_0, 1024, 4096, 1},
		{quant.Q8_0, 4096, 8192, 1}, // 256 blocks a row
		{quant.Q8_0, 300, 64, 1},    // tiny rows
		{quant.Q8_0, 300, 1024, 2},  // pipelined: a partial last tile
		{quant.Q2_K, 100, 4096, 2},
		{quant.IQ2_XXS, 100, 2048, 2},
		{quant.Q2_K, 512, 2048, 4},
		{quant.Q4_K, 256, 4096, 4},
		{quant.IQ2_XXS, 256, 4096, 4},
		{quant.F16, 300, 4096, 1},
		{quant.F16, 24, 16384, 1},
		{quant.F32, 100, 512, 2},
		{quant.BF16, 64, 1024, 1},
		{quant.F16, 50, 5000, 2},   // a partial period of 2048 columns
		{quant.F32, 33, 100, 1},    // cols % 8 != 0: element loads
		{quant.BF16, 20, 2056, 1},  // one run past a whole period
		{quant.F16, 1000, 2048, 2}, // short rows, many: a row per warp (single token, no ids)
		{quant.BF16, 520, 4096, 1},
		{quant.F16, 4096, 2048, 1}, // 8 rows per CTA
		{quant.F16, 8192, 1024, 1}, // 8 rows per CTA, four live groups (the indexer's query product)
		{quant.BF16, 4096, 640, 1}, // … the fourth group partly past the row
	}
	// IQ2_XXS and Q2_K single tokens: k_mv_dec (the default), then the
	// kernels it replaces (k_matvec, the pipeline); Q8_0 and Q4_K single
	// tokens pipelined (the default), then on k_matvec (a pipeline
	// threshold past every size)
	// (then the 16-bit weights' tiled products of 16+ tokens with the
	// inputs staged for 4-byte reads, OptFXWReg 1, against the default's
	// 16-byte reads where the stages are whole; and k_mv_dec's rows summed
	// by every lane after broadcast shuffles, OptMVDecSum 0)
	t.Cleanup(func() {
		d.SetOption(OptMVDec, DefaultMVDec)
		d.SetOption(OptFXWReg, DefaultFXWReg)
		d.SetOption(OptMVDecSum, 1)
	})
	for _, v := range []struct{ dec, pipeMin, wreg, dsum int }{
		{DefaultMVDec, 0, DefaultFXWReg, 1}, {0, 0, DefaultFXWReg, 1}, {DefaultMVDec, 1 << 20, DefaultFXWReg, 1},
		{DefaultMVDec, 0, 1, 1}, {DefaultMVDec, 0, DefaultFXWReg, 0},
	} {
		dec := v.dec
		must(t, d.SetOption(OptMVDec, dec))
		must(t, d.SetOption(OptMVPipeMin, v.pipeMin))
		must(t, d.SetOption(OptFXWReg, v.wreg))
		must(t, d.SetOption(OptMVDecSum, v.dsum))
		for ci, c := range cases {
			if dec == 0 && c.typ != quant.Q2_K && c.typ != quant.IQ2_XXS {
				continue
			}
			if v.pipeMin > 0 && c.typ != quant.Q8_0 && c.typ != quant.Q4_K {
				continue
			}
			if v.wreg != DefaultFXWReg && c.typ != quant.F16 && c.typ != quant.BF16 {
				continue
			}
			if v.dsum == 0 && c.typ != quant.Q2_K && c.typ != quant.IQ2_XXS {
				continue
			}
			mat, dw, ab := randomMats(t, d, c.typ, c.rows, c.cols, c.mats, uint64(1100+ci))
			for _, nt := range []int{1, 3, 9, 40} {
				x := gaussian(nt*c.cols, uint64(1200+ci+nt))
				act := quantizeOnDevice(t, d, c.typ, x, c.cols, nt)
				m := c.mats - 1 // the last matrix, through the selection path
				idp := alloc(t, d, 4)
				must(t, UploadSlice(d, idp, []int32{int32(m)}))
				y := alloc(t, d, int64(4*c.rows*nt))
				poison(t, d, y, c.rows*nt)
				must(t, d.MatMulEx(0, dw, idp, 1, act, ab, 0, 1, nt, y, int64(c.rows), 0, true))
				got := download(t, d, y, c.rows*nt)
				bad := 0
				for tok := 0; tok < nt; tok++ {
					want, _ := reference(t, c.typ, mat(m), c.rows, c.cols, x[tok*c.cols:(tok+1)*c.cols])
					for r := range want {
						if math.Float32bits(got[tok*c.rows+r]) != math.Float32bits(want[r]) {
							if bad < 3 {
								t.Errorf("%s %dx%d nt=%d token %d row %d: got %v, want %v", c.typ, c.rows, c.cols, nt, tok, r, got[tok*c.rows+r], want[r])
							}
							bad++
						}
					}
				}
				if bad > 0 {
					t.Errorf("%s %dx%d nt=%d mv_dec %d, pipeline from %d MiB, fx_wreg %d, mv_dec_sum %d: %d values not bit-identical", c.typ, c.rows, c.cols, nt, dec, v.pipeMin, v.wreg, v.dsum, bad)
				}
				if nt == 1 { // matrix 0 without ids (the single-token kernels that load weights before the wait)
					poison(t, d, y, c.rows)
					must(t, d.MatMulEx(0, dw, 0, 1, act, ab, 0, 1, 1, y, int64(c.rows), 0, true))
					got := download(t, d, y, c.rows)
					want, _ := reference(t, c.typ, mat(0), c.rows, c.cols, x[:c.cols])
					bad := 0
					for r := range want {
						if math.Float32bits(got[r]) != math.Float32bits(want[r]) {
							bad++
						}
					}
					if bad > 0 {
						t.Errorf("%s %dx%d, one token, no ids, mv_dec %d: %d values not bit-identical", c.typ, c.rows, c.cols, dec, bad)
					}
				}
			}
		}
	}
}

// TestFloatTensorCores checks the fast-mode products of 16-bit weights and
// 16 or more tokens on the tensor cores (k_float_tc: TF32 mma, each input as
// two TF32 terms) against quant.MatVec within float32 ulps of Σ|w·x| — a
// wrong index or fragment gives errors of the size of the sum itself —
// through the selection path (ids, the last matrix, an id out of range:
// NaN) and dense over every matrix; rows and token counts not multiples of
// the CTA's 64, columns not a multiple of its step of 32. With the option
// off the same calls take the exact tiled kernels, compared the same way.
// The tolerance is compare's for 4·cols terms (4 + √cols ulps): the tensor
// cores' float32 accumulation truncates, which measured ≈ √cols/2 ulps on
// the H200 (16 at 1024 columns, 32 at 4096, 55 at 16384).
func TestFloatTensorCores(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { d.SetOption(OptFloatTC, 1) })
	cases := []struct {
		typ        quant.Type
		rows, cols int
	}{
		{quant.F16, 300, 4096},
		{quant.F16, 24, 16384}, // the hc mixes' shape
		{quant.BF16, 130, 1024},
		{quant.F16, 70, 1032}, // a partial last step
		{quant.BF16, 64, 72},
	}
	const mats = 2
	for ci, c := range cases {
		mat, dw, ab := randomMats(t, d, c.typ, c.rows, c.cols, mats, uint64(3100+ci))
		for _, on := range []int{2, 0} { // 2: the tensor cores whatever the grid
			must(t, d.SetOption(OptFloatTC, on))
			for _, nt := range []int{16, 40, 100} {
				x := gaussian(nt*c.cols, uint64(3200+ci+nt))
				act := quantizeOnDevice(t, d, c.typ, x, c.cols, nt)
				wants := make([][]float32, mats*nt)
				mags := make([][]float64, mats*nt)
				for m := 0; m < mats; m++ {
					for tok := 0; tok < nt; tok++ {
						wants[m*nt+tok], mags[m*nt+tok] = reference(t, c.typ, mat(m), c.rows, c.cols, x[tok*c.cols:(tok+1)*c.cols])
					}
				}
				name := fmt.Sprintf("%s %dx%d nt=%d tc=%d", c.typ, c.rows, c.cols, nt, on)
				// selection path: the last matrix, then an id out of range
				for _, id := range []int32{mats - 1, mats} {
					idp := alloc(t, d, 4)
					must(t, UploadSlice(d, idp, []int32{id}))
					y := alloc(t, d, int64(4*c.rows*nt))
					poison(t, d, y, c.rows*nt)
					must(t, d.MatMulEx(0, dw, idp, 1, act, ab, 0, 1, nt, y, int64(c.rows), 0, false))
					got := download(t, d, y, c.rows*nt)
					if id == mats {
						for i, v := range got {
							if !math.IsNaN(float64(v)) {
								t.Fatalf("%s, id out of range: output %d = %v, want NaN", name, i, v)
							}
						}
						continue
					}
					want, mag := flat(wants[int(id)*nt:(int(id)+1)*nt]), flat(mags[int(id)*nt:(int(id)+1)*nt])
					compare(t, name+" ids", got, want, mag, 4*c.cols)
				}
				// dense: selection i = matrix i, outputs at a token stride past the rows
				yt := int64(c.rows + 3)
				y := alloc(t, d, 4*yt*int64(nt*mats))
				poison(t, d, y, int(yt)*nt*mats)
				must(t, d.MatMulEx(0, dw, 0, mats, act, ab, 0, 1, nt, y, yt, yt*int64(nt), false))
				all := download(t, d, y, int(yt)*nt*mats)
				got := make([]float32, 0, c.rows*nt*mats)
				for o := 0; o < nt*mats; o++ {
					got = append(got, all[o*int(yt):o*int(yt)+c.rows]...)
				}
				compare(t, name+" dense", got, flat(wants), flat(mags), 4*c.cols)
			}
		}
	}
}

// flat concatenates rows.
func flat[T any](rows [][]T) []T {
	var out []T
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

// TestMatMulTensorCores checks the tensor-core products (mm_tc.cu), dense
// (many tokens, several matrices, rows not a multiple of the CTA's 128) and
// grouped by expert ids (Group + MatMulGrouped, with an id out of range),
// bit for bit against quant.MatVec.
func TestMatMulTensorCores(t *testing.T) {
	d := gpu(t)
	cases := []struct {
		typ        quant.Type
		rows, cols int
		stage      int // Q2_K, IQ2_XXS: OptTCStage (0 unstaged, 1 staged 32 slots a CTA, 2 staged 64, 3 by selections a matrix); Q8_0: OptTCQ8W (2: by columns)
	}{
		{quant.Q8_0, 1024, 4096, 1},
		{quant.Q8_0, 300, 512, 1},
		{quant.Q8_0, 300, 512, 0},
		{quant.Q8_0, 1024, 4096, 2},
		{quant.Q8_0, 40, 256, 1},
		{quant.Q2_K, 512, 2048, 1},
		{quant.Q2_K, 200, 1024, 1},
		{quant.Q2_K, 200, 1024, 0},
		{quant.Q2_K, 200, 1024, 2},
		{quant.Q2_K, 200, 768, 1}, // 3 blocks a row: the sub-block sums staged by 4-byte copies
		{quant.IQ2_XXS, 256, 4096, 1},
		{quant.IQ2_XXS, 136, 512, 1},
		{quant.IQ2_XXS, 136, 512, 0},
		{quant.IQ2_XXS, 136, 512, 2},
		{quant.IQ2_XXS, 136, 512, 3}, // by selections a matrix: 4 warps × 32 slots below 32, else 8 × 64
		{quant.IQ2_XXS, 72, 256, 1},
		{quant.IQ2_XXS, 72, 256, 2},
		{quant.Q2_K, 40, 256, 1},
		{quant.Q2_K, 40, 256, 2},
	}
	t.Cleanup(func() {
		d.SetOption(OptTCStage, 3)
		d.SetOption(OptTCQ8W, 2)
		d.SetOption(OptTCParts, 1)
		d.SetOption(OptTCMinTokens, DefaultTCMinTokens)
	})
	// dense products from 4 tokens on the tensor cores, so that nt = 4
	// below checks their fewest (the default takes 4 on the few-token forms)
	must(t, d.SetOption(OptTCMinTokens, 4))
	exactEqual := func(name string, got, want []float32) {
		t.Helper()
		bad := 0
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				if bad < 3 {
					t.Errorf("%s: [%d] got %v, want %v", name, i, got[i], want[i])
				}
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d values not bit-identical", name, bad, len(want))
		}
	}
	for ci, c := range cases {
		if c.typ == quant.Q8_0 {
			must(t, d.SetOption(OptTCQ8W, c.stage))
		} else {
			must(t, d.SetOption(OptTCStage, c.stage))
		}
		const mats = 5
		mat, dw, ab := randomMats(t, d, c.typ, c.rows, c.cols, mats, uint64(2100+ci))

		// dense: every matrix (selection = matrix) × nt tokens
		for _, nt := range []int{4, 33, 70} {
			x := gaussian(nt*c.cols, uint64(2200+ci+nt))
			act := quantizeOnDevice(t, d, c.typ, x, c.cols, nt)
			y := alloc(t, d, int64(4*mats*nt*c.rows))
			poison(t, d, y, mats*nt*c.rows)
			must(t, d.MatMulEx(0, dw, 0, mats, act, ab, 0, 1, nt, y, int64(c.rows), int64(nt*c.rows), false))
			got := download(t, d, y, mats*nt*c.rows)
			for m := 0; m < mats; m++ {
				for tok := 0; tok < nt; tok++ {
					want, _ := reference(t, c.typ, mat(m), c.rows, c.cols, x[tok*c.cols:(tok+1)*c.cols])
					o := (m*nt + tok) * c.rows
					exactEqual(fmt.Sprintf("dense %s %dx%d stage %d nt=%d mat %d tok %d", c.typ, c.rows, c.cols, c.stage, nt, m, tok), got[o:o+c.rows], want)
				}
			}
		}

		// grouped: ntok tokens × K selections each (activation per token,
		// act_div K), one id out of range; then per selection (act_div 1)
		// (OptTCParts 0: the 32-slot kernels' grid of every tile's four
		// parts, as before the part list, for the largest chunk)
		const K = 3
		for _, run := range []struct{ ntok, parts int }{{2, 1}, {40, 1}, {150, 1}, {150, 0}} {
			ntok := run.ntok
			must(t, d.SetOption(OptTCParts, run.parts))
			nsel := ntok * K
			ids, idp, grp := groupedIDs(t, d, nsel, mats, uint64(ci), uint64(ntok))
			for _, div := range []int{K, 1} {
				na := nsel / div
				x := gaussian(na*c.cols, uint64(2300+ci+ntok+div))
				act := quantizeOnDevice(t, d, c.typ, x, c.cols, na)
				ys := int64(c.rows + 5)
				y := alloc(t, d, 4*ys*int64(nsel))
				poison(t, d, y, int(ys)*nsel)
				must(t, d.MatMulGrouped(0, dw, idp, nsel, act, ab, div, y, ys, grp, true))
				got := download(t, d, y, int(ys)*nsel)
				for i := 0; i < nsel; i++ {
					row := got[int64(i)*ys : int64(i)*ys+int64(c.rows)]
					name := fmt.Sprintf("grouped %s %dx%d stage %d parts %d nsel=%d div=%d sel %d", c.typ, c.rows, c.cols, c.stage, run.parts, nsel, div, i)
					if ids[i] == mats {
						for k, v := range row {
							if !math.IsNaN(float64(v)) {
								t.Fatalf("%s (id out of range): row %d = %v, want NaN", name, k, v)
							}
						}
						continue
					}
					a := i / div
					want, _ := reference(t, c.typ, mat(int(ids[i])), c.rows, c.cols, x[a*c.cols:(a+1)*c.cols])
					exactEqual(name, row, want)
				}
			}
		}
	}
}

// groupedIDs draws nsel random matrix ids below mats (seeded), sets the
// middle one out of range (its rows must come out NaN), uploads them and
// groups them (Group): the ids, their device copy and the tile table.
func groupedIDs(t testing.TB, d *Device, nsel, mats int, seed1, seed2 uint64) (ids []int32, idp, grp Ptr) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed1, seed2))
	ids = make([]int32, nsel)
	for i := range ids {
		ids[i] = int32(r.IntN(mats))
	}
	ids[nsel/2] = int32(mats)
	idp = alloc(t, d, int64(4*nsel))
	must(t, UploadSlice(d, idp, ids))
	grp = alloc(t, d, d.GroupBytes(nsel, mats))
	must(t, d.Group(0, idp, nsel, mats, grp))
	return ids, idp, grp
}

// TestTopK checks the indexer's top-k (radix select + bitonic sort beyond K
// rows, all rows in order below) against a sort by (score desc, index asc),
// on scores with many ties, both zeros and both infinities, per token row
// counts from (pos0+t+1)/ratio; with TopKRowOrder, the same picks in row
// order (the CPU backend's indexer's order, which exact mode's attention
// must add them in), with and without TopKAllIfFew.
func TestTopK(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() {
		d.SetOption(OptTopKWarp, 1)
		d.SetOption(OptTopKCl, DefaultTopKCl)
		d.SetOption(OptTopKClTok, DefaultTopKClTok)
		d.SetOption(OptTopKWide, DefaultTopKWide)
	})
	must(t, d.SetOption(OptTopKClTok, 65535))
	// k_topk_warp<512> (the default), k_topk_warp<1024>, k_topk_radix, then
	// k_topk_cl wherever it can take the rows (from K + 1, any token count),
	// then k_topk_wide past 8192 rows
	for _, v := range []struct{ warp, cl, wide int }{{1, 0, 0}, {2, 0, 0}, {0, 0, 0}, {1, 1, 0}, {1, 0, 1}} {
		must(t, d.SetOption(OptTopKWarp, v.warp))
		must(t, d.SetOption(OptTopKCl, v.cl))
		must(t, d.SetOption(OptTopKWide, v.wide))
		testTopK(t, d, TopKAllIfFew)
		testTopK(t, d, TopKAllIfFew|TopKRowOrder)
		testTopK(t, d, TopKRowOrder)
	}
	// k_topk_wide's picks in k_topk_warp's slots (the attention adds
	// them in that order), on distinct scores and on many ties (its
	// gathered candidates) and on a flat row (more candidates than it
	// gathers: its fallback to the walks)
	must(t, d.SetOption(OptTopKCl, 0))
	for _, kind := range []int{scoresSmooth, scoresTies, scoresFlat} {
		const k, pos0, ratio, n = 512, 131000, 4, 6
		maxR := (pos0 + n) / ratio
		scores := topKScores(maxR*n, kind, rand.New(rand.NewPCG(7, 8)))
		sp := upload(t, d, scores)
		slots := func(wide int) []int32 {
			must(t, d.SetOption(OptTopKWide, wide))
			sel, nsel := alloc(t, d, int64(4*n*k)), alloc(t, d, int64(4*n))
			must(t, d.TopK(0, sp, int64(maxR), 0, pos0, ratio, k, TopKAllIfFew|TopKRowOrder, sel, nsel, n))
			got := make([]int32, n*k)
			must(t, DownloadSlice(d, got, sel))
			return got
		}
		if warp, wide := slots(0), slots(1); !slices.Equal(warp, wide) {
			i := 0
			for warp[i] == wide[i] {
				i++
			}
			t.Fatalf("scores kind %d: k_topk_wide's slot %d of token %d holds row %d, k_topk_warp's row %d", kind, i%k, i/k, wide[i], warp[i])
		}
	}
}

// The kinds of topKScores' rows.
const (
	scoresTies   = iota // ±0, ±Inf and 40 values, many ties
	scoresSmooth        // distinct gaussian values
	scoresFlat          // nine in ten zero, the rest negative
)

// topKScores draws n scores of the kind given.
func topKScores(n int, kind int, r *rand.Rand) []float32 {
	scores := make([]float32, n)
	for i := range scores {
		switch kind {
		case scoresSmooth:
			scores[i] = float32(r.NormFloat64())
			continue
		case scoresFlat:
			if r.IntN(10) > 0 {
				scores[i] = 0
			} else {
				scores[i] = -float32(r.Float64())
			}
			continue
		}
		switch v := r.IntN(20); {
		case v == 0:
			scores[i] = float32(math.Copysign(0, -1))
		case v == 1:
			scores[i] = 0
		case v == 2:
			scores[i] = float32(math.Inf(1 - 2*r.IntN(2)))
		default:
			scores[i] = float32(r.IntN(40)-20) / 8 // many ties
		}
	}
	return scores
}

func testTopK(t *testing.T, d *Device, flags int) {
	rowOrder := flags&TopKRowOrder != 0
	for _, c := range []struct {
		k, pos0, ratio, n, kind int
	}{
		{4, 0, 4, 40, scoresTies}, {512, 1900, 4, 8, scoresTies}, {512, 20000, 4, 3, scoresTies},
		{64, 0, 1, 300, scoresTies}, {512, 8191, 4, 1, scoresTies}, {512, 32700, 4, 1, scoresTies},
		{1024, 8000, 2, 2, scoresTies}, {3, 40, 1, 2, scoresTies},
		// more picks than the radix kernels take (the ranking kernel, then
		// k_topk_rows for row order)
		{1500, 3000, 1, 2, scoresTies},
		// a long context's rows: the cluster kernel's keys in registers
		// (65500 rows: 16 a thread), then past them (75000: 19 a thread)
		{512, 262000, 4, 1, scoresTies}, {512, 300000, 4, 2, scoresTies}, {512, 140000, 4, 3, scoresTies},
		// past 8192 rows, k_topk_wide's candidates gathered (distinct
		// scores), or too many for it (a flat row: its walks)
		{512, 131000, 4, 20, scoresSmooth}, {512, 40000, 4, 3, scoresSmooth}, {100, 36000, 1, 2, scoresSmooth},
		{512, 60000, 4, 2, scoresFlat},
	} {
		maxR := (c.pos0 + c.n) / c.ratio
		r := rand.New(rand.NewPCG(uint64(c.k), uint64(c.pos0)))
		scores := topKScores(c.n*maxR, c.kind, r)
		sp := upload(t, d, scores)
		sel := alloc(t, d, int64(4*c.n*c.k))
		nsel := alloc(t, d, int64(4*c.n))
		must(t, d.TopK(0, sp, int64(maxR), 0, c.pos0, c.ratio, c.k, flags, sel, nsel, c.n))
		gotSel := make([]int32, c.n*c.k)
		gotN := make([]int32, c.n)
		must(t, DownloadSlice(d, gotSel, sel))
		must(t, DownloadSlice(d, gotN, nsel))
		for tok := 0; tok < c.n; tok++ {
			R := (c.pos0 + tok + 1) / c.ratio
			row := scores[tok*maxR : tok*maxR+R]
			idx := make([]int32, R)
			for i := range idx {
				idx[i] = int32(i)
			}
			if R > c.k || flags&TopKAllIfFew == 0 {
				idx = bestFirst(row)[:min(R, c.k)]
			}
			if int(gotN[tok]) != len(idx) {
				t.Fatalf("k=%d pos0=%d token %d: nsel %d, want %d", c.k, c.pos0, tok, gotN[tok], len(idx))
			}
			got := gotSel[tok*c.k : tok*c.k+len(idx)]
			if rowOrder { // the same picks in row order
				idx = slices.Clone(idx)
				slices.Sort(idx)
			}
			if !slices.Equal(got, idx) {
				for i := range idx {
					if got[i] != idx[i] {
						t.Fatalf("k=%d pos0=%d token %d (R=%d, flags %d): pick %d is %d (%v), want %d (%v)", c.k, c.pos0, tok, R, flags, i, got[i], row[got[i]], idx[i], row[idx[i]])
					}
				}
			}
		}
	}
}

// bestFirst returns the indices of scores, higher scores first and equal
// scores in index order (the order of the top-k and the router's picks).
func bestFirst(scores []float32) []int32 {
	idx := make([]int32, len(scores))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int {
		switch {
		case scores[a] > scores[b]:
			return -1
		case scores[a] < scores[b]:
			return 1
		}
		return 0
	})
	return idx
}

// TestIndexScores checks the indexer's scores, Σ_h relu(q_h·k_i)·w_h, against
// the CPU backend's order (dot_ref's four running sums, the heads added in
// order) bit for bit: the tiled single-query kernel, the general one and the
// chunk kernel; and the fast forms (dots on the tensor cores: the chunk
// kernel's, the single query's) within 2^-18 of Σ_h |w_h|·Σ_i |q_hi·k_i|
// (FP4 inputs; gaussian ones through f16 or TF32 operands: 2^-9). The
// tiled kernels take a few queries too (a speculative pass's two), each
// token's scores those of its one-query launch bit for bit.
func TestIndexScores(t *testing.T) {
	d := gpu(t)
	const IH, IHD, ratio = 64, 128, 4
	t.Cleanup(func() { d.SetOption(OptIXFlash, DefaultIXFlash); d.SetOption(OptIXFlashSplit, DefaultIXFlashSplit) })
	refs := map[string]indexRef{}
	// fast: each chunk form (OptIXFlash 0: TF32-split tiles; 1: f16; 2:
	// f16 copies of the rows, four tokens a CTA; 3: those on wgmma); fp4:
	// the inputs through the FP4 simulation first, as the model's are
	for _, c := range []struct {
		pos0, n, tile int
		fast          bool
		flash         int
		fp4           bool
	}{{8200, 1, 1, false, 1, false}, {8200, 1, 0, false, 1, false}, {8200, 3, 1, false, 1, false}, {101, 1, 1, false, 1, false},
		{3, 1, 1, false, 1, false}, {300, 40, 1, false, 1, false}, {300, 40, 1, true, 0, false}, {1000, 70, 1, true, 0, false},
		{300, 40, 1, true, 1, false}, {1000, 70, 1, true, 1, false}, {300, 40, 1, true, 1, true}, {1000, 71, 1, true, 1, true},
		{1000, 71, 1, true, 0, true},
		// one query, fast: the tensor cores (ix_tile 2; TF32 operands, so
		// gaussian values take the f16 bound, FP4 ones are exact)
		{8200, 1, 2, true, 1, true}, {8200, 1, 2, true, 1, false}, {101, 1, 2, true, 1, true}, {3, 1, 2, true, 1, true},
		// two queries (their rows differ by one at 103: R 25, 26)
		{8200, 2, 2, true, 1, true}, {103, 2, 2, true, 1, false}, {103, 2, 1, false, 1, false},
		// a small chunk deep in the context: the f16 chunk kernel's rows
		// split into runs (OptIXFlashSplit), checked against one CTA a pair
		{20000, 40, 1, true, 1, true}, {20000, 9, 1, true, 1, false},
		// the f16 rows' kernel (OptIXFlash 2), checked against the same
		{300, 40, 1, true, 2, true}, {1000, 71, 1, true, 2, false}, {20000, 40, 1, true, 2, true},
		{20000, 9, 1, true, 2, false}, {20000, 130, 1, true, 2, true},
		// the wgmma kernel (OptIXFlash 3; its split rows checked against
		// its own whole rows)
		{300, 40, 1, true, 3, true}, {1000, 71, 1, true, 3, false}, {20000, 40, 1, true, 3, true},
		{20000, 9, 1, true, 3, false}, {20000, 130, 1, true, 3, true}, {6000, 300, 1, true, 3, false},
		// the same on the rows' tile image, bulk copies (OptIXFlash 4; the
		// bits of 3 with whole rows)
		{300, 40, 1, true, 4, true}, {1000, 71, 1, true, 4, false}, {20000, 130, 1, true, 4, true},
		{6000, 300, 1, true, 4, false}} {
		must(t, d.SetOption(OptIXTile, c.tile))
		must(t, d.SetOption(OptIXFlash, c.flash))
		maxR := (c.pos0 + c.n) / ratio
		q := gaussian(c.n*IH*IHD, uint64(c.pos0+c.n))
		w := gaussian(c.n*IH, 7)
		rows := gaussian(maxR*IHD, 9)
		scores := tempAlloc(t, d, int64(4*c.n*maxR))
		poison(t, d, scores, c.n*maxR)
		qp, wp, rp := tempUpload(t, d, q), tempUpload(t, d, w), tempUpload(t, d, rows)
		if c.fp4 {
			must(t, d.FP4Sim(0, qp, IHD, c.n*IH, IHD))
			must(t, d.FP4Sim(0, rp, IHD, maxR, IHD))
			q, rows = download(t, d, qp, len(q)), download(t, d, rp, len(rows))
		}
		// fast mode's bound: the TF32 terms keep ≈ 2^-21 of each product,
		// and so does f16 on FP4-simulated values (exact); on gaussian
		// values f16 rounds each operand (2^-11), so a product by 2^-10
		bound := 0x1p-18
		if c.flash >= 1 && !c.fp4 {
			bound = 0x1p-9
		}
		must(t, d.IndexScores(0, qp, wp, rp, IH, IHD, c.pos0, ratio, c.n, scores, int64(maxR), c.fast))
		got := download(t, d, scores, c.n*maxR)
		key := fmt.Sprint(c.pos0, c.n, c.fp4) // (the inputs are the same for the same key)
		ref, ok := refs[key]
		if !ok {
			ref = indexRefs(q, rows, w, c.pos0, c.n, ratio, maxR, IH, IHD)
			refs[key] = ref
		}
		worst := 0.0 // fast: the largest error as a fraction of its row's magnitude
		for tok := 0; tok < c.n; tok++ {
			R := (c.pos0 + tok + 1) / ratio
			for i := 0; i < R; i++ {
				want, mag := ref.want[tok*maxR+i], ref.mag[tok*maxR+i]
				g := got[tok*maxR+i]
				if c.fast {
					e := math.Abs(float64(g) - float64(want))
					if !(e <= mag*bound) {
						t.Fatalf("pos0 %d, %d tokens, fast, ix_flash %d, fp4 %v: token %d row %d: %v, want %v (error %g, bound %g)", c.pos0, c.n, c.flash, c.fp4, tok, i, g, want, e, mag*bound)
					}
					worst = max(worst, e/mag)
					continue
				}
				if math.Float32bits(g) != math.Float32bits(want) {
					t.Fatalf("pos0 %d, %d tokens, tile %d: token %d row %d: %v, want %v", c.pos0, c.n, c.tile, tok, i, g, want)
				}
			}
		}
		if c.fast {
			t.Logf("pos0 %d, %d tokens, fast, ix_tile %d, ix_flash %d, fp4 %v: largest error %.3g of the magnitude (bound %.3g)", c.pos0, c.n, c.tile, c.flash, c.fp4, worst, bound)
		}
		if c.fast && c.flash >= 1 && c.n >= 8 { // split rows, f16 rows: the same bits as one CTA a pair (wgmma: its own whole rows)
			ref := 1
			if c.flash >= 3 {
				ref = 3
			}
			must(t, d.SetOption(OptIXFlash, ref))
			must(t, d.SetOption(OptIXFlashSplit, 0))
			whole := tempAlloc(t, d, int64(4*c.n*maxR))
			poison(t, d, whole, c.n*maxR)
			must(t, d.IndexScores(0, qp, wp, rp, IH, IHD, c.pos0, ratio, c.n, whole, int64(maxR), c.fast))
			must(t, d.SetOption(OptIXFlashSplit, DefaultIXFlashSplit))
			w := download(t, d, whole, c.n*maxR)
			for tok := 0; tok < c.n; tok++ {
				R := (c.pos0 + tok + 1) / ratio
				if i, ok := firstBitDiff(got[tok*maxR:tok*maxR+R], w[tok*maxR:tok*maxR+R]); !ok {
					t.Fatalf("pos0 %d, %d tokens, fp4 %v, ix_flash %d: token %d row %d differs from ix_flash %d with whole rows", c.pos0, c.n, c.fp4, c.flash, tok, i, ref)
				}
			}
			d.Free(whole)
		}
		if c.n > 1 && c.n < 8 { // each token's scores: its one-query launch's
			for tok := 0; tok < c.n; tok++ {
				R := (c.pos0 + tok + 1) / ratio
				one := tempAlloc(t, d, int64(4*R))
				must(t, d.IndexScores(0, qp+Ptr(4*tok*IH*IHD), wp+Ptr(4*tok*IH), rp, IH, IHD, c.pos0+tok, ratio, 1, one, int64(R), c.fast))
				if i, ok := firstBitDiff(got[tok*maxR:tok*maxR+R], download(t, d, one, R)); !ok {
					t.Fatalf("pos0 %d, %d tokens, tile %d, fast %v: token %d row %d differs from its one-query launch", c.pos0, c.n, c.tile, c.fast, tok, i)
				}
				d.Free(one)
			}
		}
		for _, p := range []Ptr{scores, qp, wp, rp} {
			d.Free(p)
		}
	}
	must(t, d.SetOption(OptIXTile, DefaultIXTile))
}

// indexRef holds the CPU's indexer scores of a chunk (want) and each
// score's magnitude Σ_h |w_h|·Σ_j |q_hj·k_j| (mag, the scale of fast
// mode's bound), [token][row] with maxR rows a token.
type indexRef struct {
	want []float32
	mag  []float64
}

// indexRefs forms an indexRef for n tokens from pos0, a token a goroutine
// at a time on every CPU (the deep cases take minutes on one).
func indexRefs(q, rows, w []float32, pos0, n, ratio, maxR, IH, IHD int) indexRef {
	r := indexRef{want: make([]float32, n*maxR), mag: make([]float64, n*maxR)}
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tok := range next {
				for i := 0; i < (pos0+tok+1)/ratio; i++ {
					r.want[tok*maxR+i] = indexScoreRef(q, rows, w, tok, i, IH, IHD)
					var mag float64
					for h := 0; h < IH; h++ {
						qh, k := q[(tok*IH+h)*IHD:(tok*IH+h+1)*IHD], rows[i*IHD:(i+1)*IHD]
						var m float64
						for j := range qh {
							m += math.Abs(float64(qh[j]) * float64(k[j]))
						}
						mag += m * math.Abs(float64(w[tok*IH+h]))
					}
					r.mag[tok*maxR+i] = mag
				}
			}
		}()
	}
	for tok := range n {
		next <- tok
	}
	close(next)
	wg.Wait()
	return r
}

// dotRef is a·b with four running sums over i mod 4, each product rounded
// before its addition, combined as (s0+s1)+(s2+s3) (len(a) % 4 == 0).
// indexScoreRef is the CPU's indexer score of compressed row i for token
// tok: Σ_h w_h·dot_h over the heads whose dotRef dot_h > 0, in head order.
func indexScoreRef(q, rows, w []float32, tok, i, IH, IHD int) float32 {
	var s float32
	for h := 0; h < IH; h++ {
		if dot := dotRef(q[(tok*IH+h)*IHD:(tok*IH+h+1)*IHD], rows[i*IHD:(i+1)*IHD]); dot > 0 {
			s += float32(dot * w[tok*IH+h])
		}
	}
	return s
}

func dotRef(a, b []float32) float32 {
	var s [4]float32
	for i := 0; i < len(a); i += 4 {
		for j := range 4 {
			s[j] += float32(a[i+j] * b[i+j])
		}
	}
	return (s[0] + s[1]) + (s[2] + s[3])
}

// TestRouter checks the learned router's picks (the K best of
// sqrt(softplus(logit)) + bias, ties to the lower expert id, best first)
// against a Go ranking, on scores with many ties, for both pickers; their
// weights must agree bit for bit. RouterQ8K must pick the same experts
// with the same weights and form the Q8_K rows Quantize forms, byte for
// byte, for rows of 4096 (16 blocks: the pre-loaded ones and the loop after
// them) and 7168 values.
func TestRouter(t *testing.T) {
	d := gpu(t)
	const K, n = 6, 5
	// 256 experts (Flash's), 128, 384 and 512 (the warp picker's register
	// form, router_pick_regs, at 4, 12 and 16 experts a lane) and 96 (its
	// general loop)
	for _, E := range []int{256, 128, 384, 512, 96} {
		r := rand.New(rand.NewPCG(11, uint64(E)))
		logits := make([]float32, n*E)
		for i := range logits {
			logits[i] = float32(r.IntN(17)-8) / 4
		}
		bias := make([]float32, E)
		for i := range bias {
			bias[i] = float32(r.IntN(3)) / 8
		}
		lp, bp := upload(t, d, logits), upload(t, d, bias)
		sel, wts := alloc(t, d, 4*n*K), alloc(t, d, 4*n*K)
		var first []float32
		for _, v := range []int{1, 0} {
			must(t, d.SetOption(OptRouterWarp, v))
			must(t, d.Router(0, lp, E, bp, 0, 0, K, true, 1.5, sel, wts, n))
			ids := make([]int32, n*K)
			must(t, DownloadSlice(d, ids, sel))
			w := download(t, d, wts, n*K)
			for tok := 0; tok < n; tok++ {
				biased := make([]float32, E)
				for e := range biased {
					x := float64(logits[tok*E+e])
					sp := float32(math.Log1p(math.Exp(x)))
					biased[e] = float32(math.Sqrt(float64(sp))) + bias[e]
				}
				want := bestFirst(biased)
				if got := ids[tok*K : (tok+1)*K]; !slices.Equal(got, want[:K]) {
					t.Fatalf("%d experts, router_warp %d, token %d: experts %v, want %v", E, v, tok, got, want[:K])
				}
			}
			if first == nil {
				first = w
			} else {
				for i := range w {
					if math.Float32bits(w[i]) != math.Float32bits(first[i]) {
						t.Fatalf("weight %d: %v with the ranking, %v with the warp picker", i, w[i], first[i])
					}
				}
			}
		}
		must(t, d.SetOption(OptRouterWarp, 1))
		for _, cols := range []int{4096, 7168} {
			x := gaussian(n*cols, uint64(cols))
			xp := upload(t, d, x)
			ab := d.ActBytes(quant.Q8_K, cols)
			want, got := alloc(t, d, ab*n), alloc(t, d, ab*n)
			must(t, d.Quantize(0, quant.Q8_K, xp, cols, want, cols, n))
			sel2, wts2 := alloc(t, d, 4*n*K), alloc(t, d, 4*n*K)
			must(t, d.RouterQ8K(0, lp, E, bp, 0, 0, K, true, 1.5, sel2, wts2, n, xp, cols, got, ab))
			wb, gb := make([]byte, ab*n), make([]byte, ab*n)
			must(t, DownloadSlice(d, wb, want))
			must(t, DownloadSlice(d, gb, got))
			if i := firstByteDiff(wb, gb); i >= 0 {
				t.Fatalf("RouterQ8K, rows of %d: activation byte %d is %d, Quantize's %d", cols, i, gb[i], wb[i])
			}
			ids, ids2 := make([]int32, n*K), make([]int32, n*K)
			must(t, DownloadSlice(d, ids, sel))
			must(t, DownloadSlice(d, ids2, sel2))
			w2 := download(t, d, wts2, n*K)
			if !slices.Equal(ids, ids2) {
				t.Fatalf("RouterQ8K: experts %v, Router's %v", ids2, ids)
			}
			for i := range w2 {
				if math.Float32bits(w2[i]) != math.Float32bits(first[i]) {
					t.Fatalf("RouterQ8K: weight %d is %v, Router's %v", i, w2[i], first[i])
				}
			}
			for _, p := range []Ptr{xp, want, got, sel2, wts2} {
				d.Free(p)
			}
		}
	}
}

// firstByteDiff returns the first index where a and b differ (-1: none; the
// shorter's length where one is a prefix of the other).
func firstByteDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestMoECombine checks the expert sum against the CPU's order (each
// token's outputs in ascending expert id, ties by position, then the shared
// expert's), bit for bit, on single tokens and a chunk, with a token whose
// ids repeat one.
func TestMoECombine(t *testing.T) {
	d := gpu(t)
	const K, D = 6, 200
	r := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{1, 37} {
		ids := make([]int32, n*K)
		for tok := 0; tok < n; tok++ {
			perm := r.Perm(256)
			for k := 0; k < K; k++ {
				ids[tok*K+k] = int32(perm[k])
			}
		}
		if n > 1 {
			ids[K+3] = ids[K+1] // token 1 names one expert twice
		}
		ye := make([]float32, n*K*D)
		for i := range ye {
			ye[i] = float32(r.NormFloat64()) * float32(math.Pow(10, float64(r.IntN(7)-3)))
		}
		ysh := make([]float32, n*D)
		for i := range ysh {
			ysh[i] = float32(r.NormFloat64())
		}
		sel := alloc(t, d, int64(4*len(ids)))
		must(t, UploadSlice(d, sel, ids))
		yep, yshp, y := upload(t, d, ye), upload(t, d, ysh), alloc(t, d, int64(4*n*D))
		must(t, d.MoECombine(0, yep, sel, yshp, y, n, K, D))
		must(t, d.Synchronize())
		got := download(t, d, y, n*D)
		for tok := 0; tok < n; tok++ {
			order := make([]int, K)
			for k := range order {
				order[k] = k
			}
			slices.SortStableFunc(order, func(a, b int) int { return int(ids[tok*K+a] - ids[tok*K+b]) })
			for c := 0; c < D; c++ {
				var acc float32
				for _, k := range order {
					acc += ye[(tok*K+k)*D+c]
				}
				acc += ysh[tok*D+c]
				if g := got[tok*D+c]; math.Float32bits(g) != math.Float32bits(acc) {
					t.Fatalf("n=%d token %d dim %d: %v, want %v", n, tok, c, g, acc)
				}
			}
		}
	}
}

// rowMax is the largest magnitude of the row of n values of v that holds
// value i.
func rowMax(v []float32, i, n int) float64 {
	m := 0.0
	for _, x := range v[i/n*n : i/n*n+n] {
		m = max(m, math.Abs(float64(x)))
	}
	return m
}

// TestAttentionFast checks fast mode's chunk attention (scores and weighted
// sums on the tensor cores, float exponentials) against the exact kernels on
// the same inputs: Flash's 64 heads of 512, a chunk of 40 tokens past the
// 128-token window, ratio-4 picks and ratio-128 rows; every (token, head)
// output row within 1e-4 of its largest magnitude (the operands' TF32 terms
// keep ≈ 2^-21 of each dot; a wrong fragment or row is off by O(1)). With
// OptAttnTC off, fast mode's exact-order scores and fused multiply-add sums
// are held to the same bound, and so is a single token (k_attn_po's float
// exponentials, lane-sum denominator and fused multiply-adds). The chunk
// in one kernel with f16 operands (OptAttnFlash 1, the default) is held to
// 2e-3: queries, probabilities and these gaussian keys each round to f16's
// 11 significant bits (half an ulp ≈ 2.4e-4 of a value), which moves the
// scores by ≈ 2e-4 here and a row's terms by a few 1e-4 of its weights,
// ≈ 1e-4 of the row's largest magnitude on average; a wrong fragment, tile,
// rescale or sink term moves a row by O(1). So is the attention of fewer
// than 8 tokens split over the keys on the tensor cores (the flash kernel
// per split: OptAttnSplit 3, and 2 from 512 keys), whose fused Q8_0
// activation values may then move by that bound of their row's largest
// magnitude beyond the one step.
func TestAttentionFast(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() {
		d.SetOption(OptAttnTC, 1)
		d.SetOption(OptAttnSplit, DefaultAttnSplit)
		d.SetOption(OptAttnFlash, DefaultAttnFlash)
	})
	const H, HD, W, n = 64, 512, 128, 40
	// the inverse rotation of the last 64 dims and the Q8_0 activation in
	// rows of 4096 values, as Flash's attention output takes them
	const rd, roff, qseg = 64, HD - 64, 4096
	freqs := make([]float32, rd/2)
	for i := range freqs {
		freqs[i] = 0.01 * float32(i+1)
	}
	freqp := tempUpload(t, d, freqs)
	qrow := d.ActBytes(quant.Q8_0, qseg)
	// 64 picks at position 700; 2048 picks at 12000 (2176 keys: each CTA
	// of the split single-token kernel walks two chunks of keys); the first
	// positions (a partial window, as many picks as rows)
	for _, cfg := range []struct{ pos0, K int }{{700, 64}, {12000, 2048}, {5, 64}} {
		pos0, K := cfg.pos0, cfg.K
		q, kv := tempUpload(t, d, gaussian(n*H*HD, 21)), tempUpload(t, d, gaussian(n*HD, 22))
		win := tempUpload(t, d, gaussian(2*W*HD, 23))
		comp := tempUpload(t, d, gaussian((pos0+n)/4*HD, 24))
		sinks := tempUpload(t, d, gaussian(H, 25))
		sel := make([]int32, n*K)
		nsel := make([]int32, n)
		r := rand.New(rand.NewPCG(26, 26))
		for tok := range n {
			R := (pos0 + tok + 1) / 4
			nsel[tok] = int32(min(K, R))
			for k := range min(K, R) {
				sel[tok*K+k] = int32(r.IntN(R))
			}
		}
		selp, nselp := tempAlloc(t, d, int64(4*len(sel))), tempAlloc(t, d, int64(4*n))
		must(t, UploadSlice(d, selp, sel))
		must(t, UploadSlice(d, nselp, nsel))
		for _, ratio := range []int{4, 128} {
			maxKeys := W + K
			if ratio == 128 {
				maxKeys = W + (pos0+n)/128
			}
			// (the chunk's scores, or 3 tokens' partial sums of the split kernel)
			work := tempAlloc(t, d, int64(4*max(AttentionWork(n, H, HD, maxKeys), AttentionWork(3, H, HD, maxKeys))))
			// run returns the output and, fused, the Q8_0 activation's values
			run := func(fast bool, nt int, fused bool) (out, act []float32) {
				// no work buffer where the library needs none (the flash kernel)
				wk := work
				if nw := d.AttentionWorkFor(nt, H, HD, maxKeys, fast); nw == 0 {
					wk = 0
				} else if nw > AttentionWork(nt, H, HD, maxKeys) {
					t.Fatalf("AttentionWorkFor(%d tokens, fast %v) = %d floats, more than AttentionWork's %d", nt, fast, nw, AttentionWork(nt, H, HD, maxKeys))
				}
				a := &AttentionArgs{Q: q, KV: kv, Win: win, WCap: 2 * W, Comp: comp, Ratio: ratio, Sel: selp, NSel: nselp,
					K: K, Sinks: sinks, Pos0: pos0, N: nt, H: H, HD: HD, W: W, Scale: 0.044, MaxKeys: maxKeys, Work: wk, Fast: fast}
				out, b := attentionOut(t, d, a, fused, freqp, rd, roff, qseg)
				for r := range len(b) / int(qrow) {
					row := b[int64(r)*qrow:]
					for i := range qseg {
						scale := math.Float32frombits(binary.LittleEndian.Uint32(row[qseg+4*(i/32):]))
						act = append(act, float32(int8(row[i]))*scale)
					}
				}
				return out, act
			}
			// the chunk with each OptAttnTC; single tokens and 3 tokens
			// split over the keys (OptAttnSplit 1, and 2: on the tensor
			// cores with f16 operands, held to the flash kernel's bound),
			// and one token in one pass (k_attn_po, OptAttnSplit 0); the
			// fewer-than-8 cases also with the rotation and the Q8_0
			// activation fused
			for _, v := range []struct{ nt, tc, split, flash int }{{n, 1, 1, 0}, {n, 0, 1, 0}, {n, 1, 1, 1}, {n, 1, 1, 2}, {n, 1, 1, 3}, {1, 1, 1, 1}, {3, 1, 1, 1}, {1, 1, 0, 1}, {1, 1, 3, 1}, {3, 1, 3, 1}, {1, 1, 2, 1}} {
				must(t, d.SetOption(OptAttnTC, v.tc))
				must(t, d.SetOption(OptAttnSplit, v.split))
				must(t, d.SetOption(OptAttnFlash, v.flash))
				if got := d.AttentionWorkFor(v.nt, H, HD, maxKeys, true) == 0; got != (v.flash > 0 && v.nt >= 8) {
					t.Errorf("%d tokens, attn_flash %d: AttentionWorkFor is 0: %v", v.nt, v.flash, got)
				}
				bound := 1e-4
				// (f16 operands: the chunk's flash kernel; single tokens split
				// on the tensor cores, value 2 from 512 keys)
				half := v.flash > 0 && v.nt >= 8 || v.nt < 8 && (v.split == 3 || v.split == 2 && maxKeys >= 512)
				if half {
					bound = 2e-3
				}
				label := fmt.Sprintf("pos0 %d, ratio %d, %d tokens, attn_tc %d, attn_split %d, attn_flash %d", pos0, ratio, v.nt, v.tc, v.split, v.flash)
				for _, fused := range []bool{false, true} {
					if fused && v.nt >= 8 {
						continue
					}
					exact, eact := run(false, v.nt, fused)
					fast, fact := run(true, v.nt, fused)
					worst := 0.0
					for row := 0; row < v.nt*H; row++ {
						e := rowErr(exact[row*HD:(row+1)*HD], fast[row*HD:(row+1)*HD])
						if !(e <= bound) {
							t.Fatalf("%s, fused %v: token %d head %d: error %g of the row's largest magnitude (bound %g)", label, fused, row/H, row%H, e, bound)
						}
						worst = max(worst, e)
					}
					// a Q8_0 value may round to the neighbouring step
					for i := range eact {
						blk := eact[i/32*32 : i/32*32+32]
						var step float64
						for _, x := range blk {
							step = max(step, math.Abs(float64(x)))
						}
						step /= 127
						// f16 operands: the values move by up to the rows' bound too
						slack := 0.0
						if half {
							slack = bound * rowMax(eact, i, HD)
						}
						if e := math.Abs(float64(eact[i]) - float64(fact[i])); !(e <= 1.01*step+slack+1e-6) {
							t.Fatalf("%s: activation value %d: %v, exact %v (step %g)", label, i, fact[i], eact[i], step)
						}
					}
					t.Logf("%s, fused %v: largest row error %.3g", label, fused, worst)
				}
			}
			d.Free(work)
		}
		for _, p := range []Ptr{q, kv, win, comp, sinks, selp, nselp} {
			d.Free(p)
		}
	}
	d.Free(freqp)
}
