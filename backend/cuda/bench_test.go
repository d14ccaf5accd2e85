package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"ds4go/quant"
)

// TestBandwidth times the kernels on the Flash shapes and prints GB/s of
// weight bytes read. It runs only with DS4_CUDA_BENCH=1 (the GPU machine's
// script); DS4_CUDA_BENCH_OUT names a CSV file for the results.
//
// Method: every timed launch reads weights that are not in L2 (dense
// matrices are replicated until the copies exceed 6x the L2 and used in
// turn; expert launches pick fresh random experts out of 256); launches are
// captured into a CUDA graph of `graphLen` launches that is replayed, timed
// with events; the median of 7 replays is reported.
func TestBandwidth(t *testing.T) {
	if os.Getenv("DS4_CUDA_BENCH") == "" {
		t.Skip("set DS4_CUDA_BENCH=1 to run the bandwidth benchmark")
	}
	d := gpu(t)
	info := d.Info()
	gt := newGraphTimer(t, d)
	s := gt.s

	type row struct {
		name  string
		bytes int64 // weight bytes per launch
		us    float64
	}
	var rows []row
	// the rows as CSV, printed and written to DS4_CUDA_BENCH_OUT when the
	// test returns (the pipeline sweep returns early)
	defer func() {
		var b strings.Builder
		fmt.Fprintf(&b, "# %s\n", info)
		fmt.Fprintf(&b, "kernel,bytes,us,GB/s\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "%q,%d,%.2f,%.1f\n", r.name, r.bytes, r.us, float64(r.bytes)/r.us/1e3)
		}
		fmt.Print("\n" + b.String())
		if p := os.Getenv("DS4_CUDA_BENCH_OUT"); p != "" {
			if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
				t.Error(err)
			}
		}
	}()
	timeGraph := gt.time
	add := func(name string, bytes int64, us float64) {
		rows = append(rows, row{name, bytes, us})
		t.Logf("%-44s %9.1f µs %8.1f GB/s", name, us, float64(bytes)/us/1e3)
	}

	// Copy ceiling: device-to-device copy, bytes read + written.
	{
		const n = 1 << 30
		a, b := tempAlloc(t, d, n), tempAlloc(t, d, n)
		must(t, d.MemsetAsync(a, 1, n, s))
		us := timeGraph(10, func(int) error { return d.CopyAsync(b, a, n, s) })
		add("d2d copy 1 GiB (read+write)", 2*n, us)
		out := alloc(t, d, int64(16*info.SMs))
		us = timeGraph(10, func(int) error { return d.BenchRead(a, n, out, s) })
		add("read-only 1 GiB", n, us)
		d.Free(a)
		d.Free(b)
	}

	// Host cost of a library call (returns before launching anything) and
	// of a tiny kernel launch (queued back to back, then synchronised).
	{
		p := alloc(t, d, 16)
		const n = 4000
		t0 := time.Now()
		for i := 0; i < n; i++ {
			must(t, d.Scale(s, p, 0, 1))
		}
		call := time.Since(t0)
		t0 = time.Now()
		for i := 0; i < n; i++ {
			must(t, d.Scale(s, p, 1, 1))
		}
		must(t, d.SyncStream(s))
		launch := time.Since(t0)
		t.Logf("host cost: %.2f µs per library call, %.2f µs per kernel launch", float64(call.Nanoseconds())/n/1e3, float64(launch.Nanoseconds())/n/1e3)
		fmt.Printf("host cost: %.2f µs per library call, %.2f µs per kernel launch\n", float64(call.Nanoseconds())/n/1e3, float64(launch.Nanoseconds())/n/1e3)
	}

	const graphLen = 50
	exact := false // products in exact mode (the pipeline sweep)
	l2 := int64(info.L2Bytes)
	hot := false // one copy of the weights, replayed: as fast as they run from L2
	dense := func(sh shape, nt int, label string) {
		mb := weightBytes(sh.typ, sh.rows, sh.cols)
		copies := int(max(1, (6*l2+mb-1)/mb))
		if hot {
			copies, label = 1, label+" hot"
		}
		w := randomWeights(sh.typ, mb/int64(sh.typ.BlockBytes()), 42)
		base := tempAlloc(t, d, mb*int64(copies))
		w0 := &Weight{Type: sh.typ, Rows: sh.rows, Cols: sh.cols, Mats: 1, Ptr: base, Bytes: mb}
		must(t, d.fillWeight(w0, w))
		for c := 1; c < copies; c++ {
			must(t, d.CopyAsync(base.Add(int64(c)*mb), base, mb, 0))
		}
		must(t, d.Synchronize())
		at, _ := d.ActType(sh.typ)
		x := gaussian(nt*sh.cols, 43)
		act := alloc(t, d, d.ActBytes(at, sh.cols)*int64(nt))
		xp := upload(t, d, x)
		must(t, d.Quantize(0, at, xp, sh.cols, act, sh.cols, nt))
		y := alloc(t, d, int64(4*sh.rows*nt))
		us := timeGraph(max(graphLen, min(copies, 1000)), func(i int) error {
			wi := *w0
			wi.Ptr = base.Add(int64(i%copies) * mb)
			if exact {
				return d.MatMulEx(s, &wi, 0, 1, act, 0, 0, 1, nt, y, 0, 0, true)
			}
			return d.MatMul(s, &wi, act, 0, nt, y, 0)
		})
		name := fmt.Sprintf("%s %s %dx%d", sh.typ, sh.name, sh.rows, sh.cols)
		if nt > 1 {
			name += fmt.Sprintf(" nt=%d", nt)
		}
		add(name+label, mb, us)
		d.Free(base)
	}
	// Routed experts: 256 matrices, 6 (or 12) random ones per launch.
	experts := func(typ quant.Type, rows, cols, nsel int, shared bool, label string) {
		const mats = 256
		mb := weightBytes(typ, rows, cols)
		w := randomWeights(typ, mats*mb/int64(typ.BlockBytes()), 44)
		dw := uploadWeight(t, d, typ, rows, cols, mats, w)
		r := rand.New(rand.NewPCG(45, 46))
		ids := make([]int32, graphLen*nsel)
		for i := 0; i < graphLen; i++ {
			perm := r.Perm(mats)
			for k := 0; k < nsel; k++ {
				ids[i*nsel+k] = int32(perm[k])
			}
		}
		idp := alloc(t, d, int64(4*len(ids)))
		must(t, UploadSlice(d, idp, ids))
		at, _ := d.ActType(typ)
		nact := nsel
		stride := d.ActBytes(at, cols)
		if shared {
			nact, stride = 1, 0
		}
		xp := upload(t, d, gaussian(nact*cols, 47))
		act := alloc(t, d, d.ActBytes(at, cols)*int64(nact))
		must(t, d.Quantize(0, at, xp, cols, act, cols, nact))
		y := alloc(t, d, int64(4*rows*nsel))
		us := timeGraph(graphLen, func(i int) error {
			if exact {
				return d.MatMulEx(s, dw, idp.Add(int64(4*i*nsel)), nsel, act, 0, stride, 1, 1, y, 0, int64(rows), true)
			}
			return d.MatVecIDs(s, dw, idp.Add(int64(4*i*nsel)), nsel, act, stride, y, 0)
		})
		add(fmt.Sprintf("%s experts %dx%d sel %d%s", typ, rows, cols, nsel, label), int64(nsel)*mb, us)
		d.FreeWeight(dw)
	}
	// DS4_CUDA_BENCH_DEC="n,…": only the single-token expert products
	// (decode's gate, gate and up, down), exact, once per value of OptMVDec
	// (0: k_matvec or the pipeline, as before k_mv_dec).
	if v := os.Getenv("DS4_CUDA_BENCH_DEC"); v != "" {
		exact = true
		defer d.SetOption(OptMVDec, DefaultMVDec)
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("DS4_CUDA_BENCH_DEC %q: %v", v, err)
			}
			must(t, d.SetOption(OptMVDec, n))
			label := fmt.Sprintf(" dec=%d", n)
			experts(quant.IQ2_XXS, 2048, 4096, 6, true, " (gate)"+label)
			experts(quant.IQ2_XXS, 2048, 4096, 12, true, " (gate+up)"+label)
			experts(quant.Q2_K, 4096, 2048, 6, false, " (down)"+label)
		}
		return
	}
	// DS4_CUDA_BENCH_PIPE="pipe:copy:timing:stage:stages,…": only the
	// single-token quantized products, exact, once per setting of OptMVPipe,
	// OptMVCopy, OptMVTiming, OptMVStage and OptMVStages.
	if v := os.Getenv("DS4_CUDA_BENCH_PIPE"); v != "" {
		exact = true
		for _, pc := range strings.Split(v, ",") {
			var pipe, cp, timing, stage, ns int
			if _, err := fmt.Sscanf(pc, "%d:%d:%d:%d:%d", &pipe, &cp, &timing, &stage, &ns); err != nil {
				t.Fatalf("DS4_CUDA_BENCH_PIPE %q: %v", pc, err)
			}
			must(t, d.SetOption(OptMVPipe, pipe))
			must(t, d.SetOption(OptMVCopy, cp))
			must(t, d.SetOption(OptMVTiming, timing))
			must(t, d.SetOption(OptMVStage, stage))
			must(t, d.SetOption(OptMVStages, ns))
			label := fmt.Sprintf(" pipe=%d copy=%d timing=%d stage=%d ns=%d", pipe, cp, timing, stage, ns)
			for _, sh := range flashShapes {
				if sh.typ == quant.Q8_0 || sh.typ == quant.Q2_K {
					dense(sh, 1, label)
				}
			}
			experts(quant.IQ2_XXS, 2048, 4096, 6, true, " (gate)"+label)
			experts(quant.Q2_K, 4096, 2048, 6, false, " (down)"+label)
		}
		return
	}
	for _, sh := range flashShapes {
		dense(sh, 1, "")
	}
	big := shape{"", quant.Q8_0, 32768, 4096}
	for _, nt := range []int{2, 4, 8} {
		dense(big, nt, "")
	}
	// load flavours and split-K on two shapes
	for _, wl := range []int{0, 2} {
		must(t, d.SetOption(OptWeightLoad, wl))
		dense(big, 1, fmt.Sprintf(" wload=%d", wl))
		dense(shape{"attn_kv", quant.Q8_0, 512, 4096}, 1, fmt.Sprintf(" wload=%d", wl))
	}
	must(t, d.SetOption(OptWeightLoad, 1))
	for _, sk := range []int{1, 2, 4, 8} {
		must(t, d.SetOption(OptSplitK, sk))
		dense(shape{"attn_kv", quant.Q8_0, 512, 4096}, 1, fmt.Sprintf(" splitk=%d", sk))
		dense(shape{"q_a", quant.Q8_0, 1024, 4096}, 1, fmt.Sprintf(" splitk=%d", sk))
	}
	must(t, d.SetOption(OptSplitK, 0))

	experts(quant.IQ2_XXS, 2048, 4096, 6, true, " (gate)")
	experts(quant.IQ2_XXS, 2048, 4096, 12, true, " (gate+up)")
	// the 34 MiB Q8_0 products of every layer, exact, from L2 (hot) and
	// not (what prefetching them into L2 could gain)
	exact = true
	for _, h := range []bool{false, true} {
		hot = h
		for _, sh := range flashShapes[1:5] {
			if sh.rows*sh.cols >= 1<<25 {
				dense(sh, 1, " exact")
			}
		}
	}
	hot = false
	// the expert products in exact mode (decode's), through k_matvec
	// (pipe=0), the pipelined kernel from 16 MiB (pipe=2, pipemin=16: not
	// these) and through it always (pipemin=0)
	exact = true
	for _, pc := range [][2]int{{0, 16}, {2, 16}, {2, 0}, {1, 0}} {
		must(t, d.SetOption(OptMVPipe, pc[0]))
		must(t, d.SetOption(OptMVPipeMin, pc[1]))
		label := fmt.Sprintf(" exact pipe=%d pipemin=%d", pc[0], pc[1])
		experts(quant.IQ2_XXS, 2048, 4096, 6, true, " (gate)"+label)
		experts(quant.Q2_K, 4096, 2048, 6, false, " (down)"+label)
	}
	must(t, d.SetOption(OptMVPipe, 2))
	must(t, d.SetOption(OptMVPipeMin, DefaultMVPipeMin))
	exact = false
	experts(quant.Q2_K, 4096, 2048, 6, false, " (down)")
	experts(quant.Q4_K, 2048, 4096, 12, true, " (gate+up)")
	experts(quant.Q4_K, 4096, 2048, 6, false, " (down)")
	for _, rpw := range []int{1, 2, 4, 8} {
		must(t, d.SetOption(OptRowsPerWarp, rpw))
		experts(quant.IQ2_XXS, 2048, 4096, 12, true, fmt.Sprintf(" rpw=%d", rpw))
		experts(quant.Q2_K, 4096, 2048, 6, false, fmt.Sprintf(" rpw=%d", rpw))
		dense(shape{"attn_q_b", quant.Q8_0, 32768, 1024}, 1, fmt.Sprintf(" rpw=%d", rpw))
	}
	must(t, d.SetOption(OptRowsPerWarp, 0))

	// Activation quantization.
	for _, at := range []quant.Type{quant.Q8_0, quant.Q8_K} {
		cols := 4096
		xp := upload(t, d, gaussian(cols, 48))
		act := alloc(t, d, d.ActBytes(at, cols))
		us := timeGraph(graphLen, func(int) error { return d.Quantize(s, at, xp, cols, act, cols, 1) })
		add(fmt.Sprintf("quantize %s 4096", at), int64(4*cols), us)
	}
}

// graphTimer times launches replayed from CUDA graphs on its own stream s
// (TestBandwidth, TestOpLatency).
type graphTimer struct {
	t      testing.TB
	d      *Device
	s      Stream
	e0, e1 Event
}

// newGraphTimer makes the stream and the two events; the test's cleanup
// releases them.
func newGraphTimer(t testing.TB, d *Device) *graphTimer {
	t.Helper()
	s, err := d.NewStream()
	must(t, err)
	e0, err := d.NewEvent()
	must(t, err)
	e1, err := d.NewEvent()
	must(t, err)
	t.Cleanup(func() {
		d.DestroyEvent(e1)
		d.DestroyEvent(e0)
		d.DestroyStream(s)
	})
	return &graphTimer{t, d, s, e0, e1}
}

// time captures n calls of launch(i) on the timer's stream into a CUDA
// graph, replays it (once to warm up, then 7 times timed with the events)
// and returns the median µs per call.
func (g *graphTimer) time(n int, launch func(i int) error) float64 {
	t, d, s := g.t, g.d, g.s
	t.Helper()
	must(t, d.BeginCapture(s))
	for i := 0; i < n; i++ {
		if err := launch(i); err != nil {
			d.EndCapture(s)
			t.Fatal(err)
		}
	}
	graph, err := d.EndCapture(s)
	must(t, err)
	defer d.DestroyGraph(graph)
	return g.rounds(n, func() { must(t, d.Launch(graph, s)) })
}

// rounds queues round (n calls) on the timer's stream once to warm up,
// then 7 times between the events, and returns the median µs per call.
func (g *graphTimer) rounds(n int, round func()) float64 {
	t, d, s, e0, e1 := g.t, g.d, g.s, g.e0, g.e1
	t.Helper()
	round() // warm-up
	must(t, d.SyncStream(s))
	var ts []float64
	for k := 0; k < 7; k++ {
		must(t, d.Record(e0, s))
		round()
		must(t, d.Record(e1, s))
		must(t, d.SyncEvent(e1))
		ms, err := d.Elapsed(e0, e1)
		must(t, err)
		ts = append(ts, float64(ms)*1000/float64(n))
	}
	slices.Sort(ts)
	return ts[len(ts)/2]
}

// tempAlloc allocates device memory the caller frees (no test cleanup).
func tempAlloc(t testing.TB, d *Device, n int64) Ptr {
	t.Helper()
	p, err := d.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tempUpload is upload without the test cleanup: the caller frees it.
func tempUpload(t testing.TB, d *Device, x []float32) Ptr {
	t.Helper()
	p := tempAlloc(t, d, int64(4*len(x)))
	if err := UploadSlice(d, p, x); err != nil {
		d.Free(p)
		t.Fatal(err)
	}
	return p
}
