package cuda

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

// LibName is the file name of the CUDA kernel library.
const LibName = "libds4cuda.so"

// abiVersion must equal DS4C_ABI_VERSION in cuda/ds4cuda.h.
const abiVersion = 45

// ErrNotFound is wrapped by the error Load returns when no libds4cuda.so
// exists in any searched place.
var ErrNotFound = errors.New("cuda: " + LibName + " not found")

// lib holds the C entry points of libds4cuda.so.
type lib struct {
	path string
	// slow (env DS4_CUDA_SLOW_CALL_US, a diagnostic): calls into the
	// library that take longer than this on the host are logged with their
	// op and duration — where a fresh process's first prompt spends its
	// one-time costs (kernel modules loaded at their first launch,
	// allocations, cuBLAS's start) and where the host waits for the GPU.
	slow time.Duration

	abiVersion func() int32
	lastError  func() string

	deviceCount       func(n *int32) int32
	initDev           func(dev int32) int32
	deviceInfo        func(name *byte, nameLen int32, ints *int32, mem *uint64) int32
	deviceSynchronize func() int32

	malloc          func(p *uintptr, n uint64) int32
	free            func(p uintptr) int32
	mallocHost      func(p *unsafe.Pointer, n uint64) int32
	freeHost        func(p unsafe.Pointer) int32
	memcpyH2D       func(dst uintptr, src unsafe.Pointer, n uint64) int32
	memcpyD2H       func(dst unsafe.Pointer, src uintptr, n uint64) int32
	memcpyH2DAsync  func(dst uintptr, src uintptr, n uint64, s uintptr) int32
	memcpyD2HAsync  func(dst uintptr, src uintptr, n uint64, s uintptr) int32
	memcpyD2DAsync  func(dst uintptr, src uintptr, n uint64, s uintptr) int32
	memsetAsync     func(dst uintptr, v int32, n uint64, s uintptr) int32
	streamCreate    func(s *uintptr) int32
	streamDestroy   func(s uintptr) int32
	streamSync      func(s uintptr) int32
	streamWaitEvent func(s, e uintptr) int32
	eventCreate     func(e *uintptr) int32
	eventDestroy    func(e uintptr) int32
	eventRecord     func(e, s uintptr) int32
	eventSync       func(e uintptr) int32
	eventElapsed    func(ms *float32, a, b uintptr) int32

	graphBegin   func(s uintptr) int32
	graphEnd     func(s uintptr, exec *uintptr) int32
	graphLaunch  func(exec, s uintptr) int32
	graphUpdate  func(s uintptr, exec *uintptr, how *int32) int32
	graphAbort   func(s uintptr) int32
	graphDestroy func(exec uintptr) int32

	recCreate     func(main, side, side2 uintptr, rec *uintptr) int32
	recDestroy    func(rec uintptr) int32
	recBegin      func(rec uintptr) int32
	recAbort      func(rec uintptr) int32
	recLaunch     func(rec uintptr, graph *uintptr, stats *[3]int32) int32
	rgraphDestroy func(graph uintptr) int32

	weightBytes   func(t int32, rows, cols int64) uint64
	weightRepack  func(t int32, dst uintptr, totalRows, cols int64, src uintptr, first, n int64, s uintptr) int32
	actType       func(wt int32) int32
	actBytes      func(t int32, cols int64) uint64
	quantize      func(t int32, x uintptr, xStride int64, act uintptr, cols int64, nTok int32, s uintptr) int32
	matmul        func(t int32, w uintptr, rows, cols, nMat int64, act uintptr, actStride int64, nTok int32, y uintptr, yStride int64, s uintptr) int32
	matvecIDs     func(t int32, w uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, act uintptr, actStride int64, y uintptr, yStride int64, s uintptr) int32
	matmulEx      func(t int32, w uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, act uintptr, actTok, actSel int64, actDiv, nTok int32, y uintptr, yTok, ySel int64, flags int32, s uintptr) int32
	matmulQ8Out   func(t int32, w uintptr, rows, cols, nMat int64, nSel int32, act uintptr, actTok, actSel int64, actDiv, nTok int32, y, yq uintptr, flags int32, s uintptr) int32
	profiler      func(on int32) int32
	halfOK        func(t, xType, nTok int32) int32
	halfWarm      func() int32
	q8ToHalf      func(w uintptr, rows, cols int64, out uintptr, s uintptr) int32
	toHalf        func(x uintptr, xStride, cols int64, nTok int32, xh uintptr, s uintptr) int32
	toHalfEx      func(x uintptr, xStride, cols int64, nTok int32, xh uintptr, flags int32, s uintptr) int32
	matmulHalf    func(t int32, w uintptr, rows, cols, nMat int64, nSel int32, x uintptr, xType int32, xTok, xSel int64, nTok int32, y uintptr, yTok, ySel int64, s uintptr) int32
	matmulHalfH   func(t int32, w uintptr, rows, cols, nMat int64, nSel int32, x uintptr, xType int32, xTok, xSel int64, nTok int32, y uintptr, yTok, ySel int64, s uintptr) int32
	groupBytes    func(nSel int32, nMat int64) uint64
	group         func(ids uintptr, nSel int32, nMat int64, scratch, s uintptr) int32
	matmulGroup   func(t int32, w uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, act uintptr, actSel int64, actDiv int32, y uintptr, ySel int64, scratch uintptr, flags int32, s uintptr) int32
	matmulSwiGLU  func(t int32, w uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, g, u uintptr, lim float32, wts, act, y uintptr, ySel int64, scratch uintptr, flags int32, s uintptr) int32
	matmulPair    func(t int32, w1, w2 uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, act uintptr, actSel int64, actDiv int32, y1, y2 uintptr, ySel int64, scratch uintptr, flags int32, s uintptr) int32
	groupedHalfOK func(t int32, cols int64, nSel int32) int32
	hcMixesOK     func(t, m int32, k int64, n int32) int32
	hcMixes       func(t int32, fn uintptr, m int32, k int64, h uintptr, n int32, eps float32, mix uintptr, s uintptr) int32

	getRows      func(t int32, w uintptr, totalRows, cols int64, ids uintptr, n int32, dst uintptr, dstStride int64, copies int32, copyStride int64, s uintptr) int32
	argmax       func(x uintptr, n int64, work, out, s uintptr) int32
	waitToken    func(word, flag uintptr, seq uint32, timeoutNs int64, out, s uintptr) int32
	pickCands    func(x uintptr, n int64, temp, minP float32, work, top, counts, out uintptr, cap int32, s uintptr) int32
	hcPostMix    func(h, out, post, comb uintptr, hc int32, d int64, fnType int32, fn uintptr, m, parts int32, part uintptr, n int32, s uintptr) int32
	hcPostMixMoE func(h, ye, sel, ysh uintptr, k int32, post, comb uintptr, hc int32, d int64, fnType int32, fn uintptr, m, parts int32, part uintptr, n int32, s uintptr) int32
	hcPostMixEx  func(h, out, ye, sel, ysh uintptr, k int32, post, comb uintptr, hc int32, d int64, fnType int32, fn uintptr, m int32, part uintptr, n int32, s uintptr) int32
	rmsnormRef   func(x uintptr, xStride int64, w, y uintptr, yStride, n int64, rows int32, eps float32, s uintptr) int32
	hcPre        func(mode int32, mix uintptr, m int32, scale, base uintptr, hc, iters int32, hcEps float32, h uintptr, d int64, normw uintptr, normEps float32, x, post, comb, xq uintptr, n int32, s uintptr) int32
	hcPost       func(h, out, post, comb uintptr, hc int32, d int64, n int32, s uintptr) int32
	normRope     func(x uintptr, tokStride int64, heads int32, headStride int64, hd int32, w uintptr, eps float32, off int64, freqs uintptr, rd int32, pos0 int64, fp8n, nTok int32, s uintptr) int32
	rope         func(x uintptr, tokStride int64, heads int32, headStride, off int64, freqs uintptr, rd int32, pos0, posStep int64, nTok, inverse int32, s uintptr) int32
	fp8Sim       func(x uintptr, stride int64, rows int32, n int64, s uintptr) int32
	fp4Sim       func(x uintptr, stride int64, rows int32, n int64, s uintptr) int32
	hadamard     func(x uintptr, stride int64, rows, n int32, scale float32, s uintptr) int32
	hadamardFP4  func(x uintptr, stride int64, rows, n int32, scale float32, s uintptr) int32
	indexQuery   func(q, w uintptr, heads, hd, rd int32, freqs uintptr, pos0 int64, n int32, hadScale, wScale float32, s uintptr) int32
	scaleVec     func(x uintptr, n int64, f float32, s uintptr) int32
	addAPE       func(dst, ape uintptr, width int64, r int32, pos0 int64, n int32, s uintptr) int32
	ringWrite    func(ring uintptr, cap, width int64, src uintptr, srcStride, pos0 int64, n int32, s uintptr) int32
	ringWrite2   func(ringA, ringB uintptr, cap, width int64, srcA, srcB uintptr, srcStride, pos0 int64, n int32, s uintptr) int32
	compPool     func(kv, sc, kvRing, scRing uintptr, cap, cw, pos0 int64, r, coff int32, w, i0 int64, nrows int32, rows uintptr, s uintptr) int32
	compEmit     func(kv, sc, kvRing, scRing uintptr, kvCap, scCap, cw, pos0 int64, n, r, coff int32, w, i0 int64, nrows int32, rows, norm uintptr, eps float32, freqs uintptr, rd, post, fp8n int32, hadScale float32, s uintptr) int32
	indexScores  func(q, w, rows uintptr, ih, ihd int32, pos0 int64, ratio, n int32, scores uintptr, scStride int64, flags int32, s uintptr) int32
	topk         func(scores uintptr, stride, rFixed, pos0 int64, ratio, k, allIfFew int32, sel, nsel uintptr, n int32, s uintptr) int32
	attnWork     func(n, h, hd int32, maxKeys int64, flags int32) int64
	attnHalfOK   func(n, h, hd, rd, roff, flags int32) int32
	gluOK        func(typ int32, rows, cols int64, nsel int32) int32
	matmulGLU    func(typ int32, gate, up uintptr, rows, cols, nmat int64, ids uintptr, nsel int32, act uintptr, actSel int64, actDiv int32, wts uintptr, lim float32, yh uintptr, perm int32, scratch, s uintptr) int32
	normRopeH    func(x uintptr, tokStride int64, heads int32, headStride int64, hd int32, w uintptr, eps float32, off int64, freqs uintptr, rd int32, pos0 int64, fp8n, nTok int32, xh, s uintptr) int32
	attention    func(q, kv, win uintptr, wcap int64, comp uintptr, ratio int32, sel, nsel uintptr, k int32, sinks, out uintptr, pos0 int64, n, h, hd, w int32, scale float32, maxKeys int64, work, rfreqs uintptr, rd, roff int32, qact uintptr, qseg int64, qEps float32, rcs uintptr, flags int32, s uintptr) int32
	router       func(logits uintptr, e int32, bias, tid2eid, tokens uintptr, k, norm int32, wscale float32, sel, w uintptr, n int32, x uintptr, cols int64, act uintptr, actStride int64, s uintptr) int32
	swigluRef    func(g, u, y uintptr, n int64, rows int32, lim float32, w uintptr, s uintptr) int32
	swigluQ8K    func(g, u, act uintptr, actStride, n int64, rows int32, lim float32, w uintptr, flags int32, s uintptr) int32
	ropeTable    func(freqs uintptr, rd int32, pos int64, n int32, cs uintptr, s uintptr) int32
	normRopeP    func(x1 uintptr, heads1 int32, w1 uintptr, fp8n1 int32, x2 uintptr, heads2 int32, w2 uintptr, fp8n2, hd int32, eps float32, off int64, freqs uintptr, rd int32, pos0 int64, nTok int32, cs, ring uintptr, ringCap int64, s uintptr) int32
	matvecF32    func(t int32, w uintptr, rows, cols int64, x, nw uintptr, eps float32, xn, act, y uintptr, flags, n int32, s uintptr) int32
	swigluHalf   func(g, u, yh uintptr, n int64, rows int32, lim float32, w uintptr, flags int32, s uintptr) int32
	moeCombine   func(ye, sel, ysh, y uintptr, n, k int32, d int64, s uintptr) int32

	rmsnorm   func(x, w, y uintptr, n int64, rows int32, eps float32, s uintptr) int32
	softmax   func(x, y uintptr, n int64, rows int32, s uintptr) int32
	swiglu    func(g, u, y uintptr, n int64, clamp float32, s uintptr) int32
	setOption func(key, value int32) int32
	setOptEnv func(assign string) int32
	getOptEnv func(name string, value *int32) int32
	benchRead func(src uintptr, n uint64, out uintptr, s uintptr) int32
	chainQ8   func(ops uintptr, n int32, count uintptr, stages, flags int32, s uintptr) int32
}

var (
	loadOnce sync.Once
	loaded   *lib
	loadErr  error
)

// SearchPaths returns the places Load looks for libds4cuda.so, in order.
// With $DS4_CUDA_LIB set, that is the one place (a file, or a directory
// holding the library): a library further down the list would otherwise
// run in place of a missing named one, unnoticed. Else the directory of
// the running executable, ./build/ and the build/ directories of the
// parents of the working directory (so that tests run from a package
// directory find the repository's build/).
func SearchPaths() []string {
	if p := os.Getenv("DS4_CUDA_LIB"); p != "" {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			p = filepath.Join(p, LibName)
		}
		return []string{p}
	}
	var paths []string
	if exe, err := os.Executable(); err == nil {
		paths = append(paths, filepath.Join(filepath.Dir(exe), LibName))
	}
	if wd, err := os.Getwd(); err == nil {
		for d, i := wd, 0; i < 5; i++ {
			paths = append(paths, filepath.Join(d, "build", LibName))
			parent := filepath.Dir(d)
			if parent == d {
				break
			}
			d = parent
		}
	}
	return paths
}

// Load loads libds4cuda.so once per process and returns the same result to
// every caller. Without the library (or without a usable CUDA driver) it
// returns an error that says what was searched; it never panics.
func Load() error {
	loadOnce.Do(func() { loaded, loadErr = load() })
	return loadErr
}

func load() (*lib, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("cuda: %s is only built for linux (GOOS=%s)", LibName, runtime.GOOS)
	}
	paths := SearchPaths()
	var path string
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			path = p
			break
		}
	}
	if path == "" {
		return nil, fmt.Errorf("%w (searched %s); build it with nvcc (docs/cuda.md) or set DS4_CUDA_LIB", ErrNotFound, strings.Join(paths, ", "))
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: loading %s: %v", path, err)
	}
	l := &lib{path: path}
	if v := os.Getenv("DS4_CUDA_SLOW_CALL_US"); v != "" {
		us, err := strconv.Atoi(v)
		if err != nil || us <= 0 {
			return nil, fmt.Errorf("cuda: DS4_CUDA_SLOW_CALL_US=%q: want a positive number of microseconds", v)
		}
		l.slow = time.Duration(us) * time.Microsecond
	}
	syms := []struct {
		fn   any
		name string
	}{
		{&l.abiVersion, "ds4c_abi_version"},
		{&l.lastError, "ds4c_last_error"},
		{&l.deviceCount, "ds4c_device_count"},
		{&l.initDev, "ds4c_init"},
		{&l.deviceInfo, "ds4c_device_info"},
		{&l.deviceSynchronize, "ds4c_device_synchronize"},
		{&l.malloc, "ds4c_malloc"},
		{&l.free, "ds4c_free"},
		{&l.mallocHost, "ds4c_malloc_host"},
		{&l.freeHost, "ds4c_free_host"},
		{&l.memcpyH2D, "ds4c_memcpy_h2d"},
		{&l.memcpyD2H, "ds4c_memcpy_d2h"},
		{&l.memcpyH2DAsync, "ds4c_memcpy_h2d_async"},
		{&l.memcpyD2HAsync, "ds4c_memcpy_d2h_async"},
		{&l.memcpyD2DAsync, "ds4c_memcpy_d2d_async"},
		{&l.memsetAsync, "ds4c_memset_async"},
		{&l.streamCreate, "ds4c_stream_create"},
		{&l.streamDestroy, "ds4c_stream_destroy"},
		{&l.streamSync, "ds4c_stream_synchronize"},
		{&l.streamWaitEvent, "ds4c_stream_wait_event"},
		{&l.eventCreate, "ds4c_event_create"},
		{&l.eventDestroy, "ds4c_event_destroy"},
		{&l.eventRecord, "ds4c_event_record"},
		{&l.eventSync, "ds4c_event_synchronize"},
		{&l.eventElapsed, "ds4c_event_elapsed_ms"},
		{&l.graphBegin, "ds4c_graph_begin"},
		{&l.graphEnd, "ds4c_graph_end"},
		{&l.graphLaunch, "ds4c_graph_launch"},
		{&l.graphUpdate, "ds4c_graph_end_update"},
		{&l.graphAbort, "ds4c_graph_abort"},
		{&l.recCreate, "ds4c_rec_create"},
		{&l.recDestroy, "ds4c_rec_destroy"},
		{&l.recBegin, "ds4c_rec_begin"},
		{&l.recAbort, "ds4c_rec_abort"},
		{&l.recLaunch, "ds4c_rec_launch"},
		{&l.rgraphDestroy, "ds4c_rgraph_destroy"},
		{&l.graphDestroy, "ds4c_graph_destroy"},
		{&l.weightBytes, "ds4c_weight_bytes"},
		{&l.weightRepack, "ds4c_weight_repack"},
		{&l.actType, "ds4c_act_type"},
		{&l.actBytes, "ds4c_act_bytes"},
		{&l.quantize, "ds4c_quantize"},
		{&l.matmul, "ds4c_matmul"},
		{&l.matvecIDs, "ds4c_matvec_ids"},
		{&l.matmulEx, "ds4c_matmul_ex"},
		{&l.matmulQ8Out, "ds4c_matmul_q8out"},
		{&l.profiler, "ds4c_profiler"},
		{&l.halfOK, "ds4c_half_ok"},
		{&l.halfWarm, "ds4c_half_warm"},
		{&l.q8ToHalf, "ds4c_q8_0_to_half"},
		{&l.toHalf, "ds4c_to_half"},
		{&l.toHalfEx, "ds4c_to_half_ex"},
		{&l.matmulHalf, "ds4c_matmul_half"},
		{&l.matmulHalfH, "ds4c_matmul_half_h"},
		{&l.groupBytes, "ds4c_group_bytes"},
		{&l.group, "ds4c_group"},
		{&l.matmulGroup, "ds4c_matmul_grouped"},
		{&l.matmulPair, "ds4c_matmul_grouped_pair"},
		{&l.matmulSwiGLU, "ds4c_matmul_grouped_swiglu"},
		{&l.groupedHalfOK, "ds4c_grouped_half_ok"},
		{&l.hcMixesOK, "ds4c_hc_mixes_ok"},
		{&l.hcMixes, "ds4c_hc_mixes"},
		{&l.getRows, "ds4c_get_rows"},
		{&l.argmax, "ds4c_argmax"},
		{&l.waitToken, "ds4c_wait_token"},
		{&l.pickCands, "ds4c_pick_candidates"},
		{&l.hcPostMix, "ds4c_hc_post_mix"},
		{&l.hcPostMixMoE, "ds4c_hc_post_mix_moe"},
		{&l.hcPostMixEx, "ds4c_hc_post_mix_ex"},
		{&l.rmsnormRef, "ds4c_rmsnorm_ref"},
		{&l.hcPre, "ds4c_hc_pre"},
		{&l.hcPost, "ds4c_hc_post"},
		{&l.rope, "ds4c_rope"},
		{&l.normRope, "ds4c_norm_rope"},
		{&l.fp8Sim, "ds4c_fp8_sim"},
		{&l.fp4Sim, "ds4c_fp4_sim"},
		{&l.hadamard, "ds4c_hadamard"},
		{&l.hadamardFP4, "ds4c_hadamard_fp4"},
		{&l.indexQuery, "ds4c_index_query"},
		{&l.scaleVec, "ds4c_scale"},
		{&l.addAPE, "ds4c_add_ape"},
		{&l.ringWrite, "ds4c_ring_write"},
		{&l.ringWrite2, "ds4c_ring_write2"},
		{&l.compPool, "ds4c_comp_pool"},
		{&l.compEmit, "ds4c_comp_emit"},
		{&l.indexScores, "ds4c_index_scores"},
		{&l.topk, "ds4c_topk"},
		{&l.attention, "ds4c_attention"},
		{&l.attnWork, "ds4c_attention_work"},
		{&l.attnHalfOK, "ds4c_attention_half_ok"},
		{&l.gluOK, "ds4c_grouped_glu_ok"},
		{&l.matmulGLU, "ds4c_matmul_grouped_glu"},
		{&l.normRopeH, "ds4c_norm_rope_half"},
		{&l.router, "ds4c_router"},
		{&l.swigluRef, "ds4c_swiglu_ref"},
		{&l.swigluQ8K, "ds4c_swiglu_q8k"},
		{&l.matvecF32, "ds4c_matvec_f32"},
		{&l.normRopeP, "ds4c_norm_rope_pair"},
		{&l.ropeTable, "ds4c_rope_table"},
		{&l.swigluHalf, "ds4c_swiglu_half"},
		{&l.moeCombine, "ds4c_moe_combine"},
		{&l.rmsnorm, "ds4c_rmsnorm"},
		{&l.softmax, "ds4c_softmax"},
		{&l.swiglu, "ds4c_swiglu"},
		{&l.setOption, "ds4c_set_option"},
		{&l.setOptEnv, "ds4c_set_option_env"},
		{&l.getOptEnv, "ds4c_get_option_env"},
		{&l.benchRead, "ds4c_bench_read"},
		{&l.chainQ8, "ds4c_chain_q8"},
	}
	bySym := make(map[string]uintptr, len(syms))
	for _, s := range syms {
		sym, err := purego.Dlsym(h, s.name)
		if err != nil {
			return nil, fmt.Errorf("cuda: %s lacks %s (stale build?): %v", path, s.name, err)
		}
		purego.RegisterFunc(s.fn, sym)
		bySym[s.name] = sym
	}
	if v := l.abiVersion(); v != abiVersion {
		return nil, fmt.Errorf("cuda: %s has ABI version %d, this program needs %d; rebuild it", path, v, abiVersion)
	}
	if os.Getenv("DS4_CUDA_REFLECT_CALLS") != "1" {
		if err := l.direct(func(name string) uintptr { return bySym[name] }); err != nil { // libdirect.go
			return nil, err
		}
	}
	return l, nil
}

// Error is a failure reported by libds4cuda.so.
type Error struct {
	Op   string // the Go method that failed
	Code int    // >0: cudaError_t; <0: a DS4C_E* code
	Msg  string // the library's message
}

func (e *Error) Error() string { return fmt.Sprintf("cuda: %s: %s (code %d)", e.Op, e.Msg, e.Code) }

// call runs f on a locked OS thread so that the library's thread-local error
// message belongs to this call, and converts a non-zero status to *Error.
func (l *lib) call(op string, f func() int32) error {
	runtime.LockOSThread()
	var t0 time.Time
	if l.slow > 0 {
		t0 = time.Now()
	}
	rc := f()
	if l.slow > 0 {
		if d := time.Since(t0); d > l.slow {
			slog.Info("cuda: slow call", "op", op, "us", d.Microseconds())
		}
	}
	var msg string
	if rc != 0 {
		msg = l.lastError()
	}
	runtime.UnlockOSThread()
	if rc != 0 {
		return &Error{Op: op, Code: int(rc), Msg: msg}
	}
	return nil
}
