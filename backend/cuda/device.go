package cuda

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Ptr is a device address.
type Ptr uintptr

// Add returns p advanced by off bytes.
func (p Ptr) Add(off int64) Ptr { return Ptr(int64(p) + off) }

// Stream is a CUDA stream; the zero Stream is the legacy default stream.
type Stream uintptr

// Event is a CUDA event.
type Event uintptr

// Info describes the opened device.
type Info struct {
	Name              string
	Major, Minor      int // compute capability
	SMs               int // multiprocessors
	L2Bytes           int
	SharedPerBlock    int // opt-in shared memory per block, bytes
	BusWidthBits      int
	MemClockKHz       int
	RuntimeVersion    int // CUDA runtime the library was built with (e.g. 13000)
	FreeMem, TotalMem uint64
}

func (i Info) String() string {
	return fmt.Sprintf("%s (sm_%d%d, %d SMs, L2 %d MiB, %.1f GiB, runtime %d.%d)", i.Name, i.Major, i.Minor, i.SMs,
		i.L2Bytes>>20, float64(i.TotalMem)/(1<<30), i.RuntimeVersion/1000, i.RuntimeVersion%1000/10)
}

// Device is the CUDA device this process uses. The library selects one device
// per process; Open returns the same *Device for the same id.
type Device struct {
	l    *lib
	id   int
	info Info
	// actBytes caches ActBytes by format and length: a pure function of
	// the library, asked ≈ 450 times a speculative pass, each a foreign
	// call of ≈ 1.5 µs through purego's reflection (cuda/NOTES.md v46)
	actBytes sync.Map // actKey → int64
}

var (
	openMu sync.Mutex
	opened *Device
)

// Open loads libds4cuda.so and initialises device id.
func Open(id int) (*Device, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	openMu.Lock()
	defer openMu.Unlock()
	if opened != nil {
		if opened.id != id {
			return nil, fmt.Errorf("cuda: device %d already opened; one device per process", opened.id)
		}
		return opened, nil
	}
	l := loaded
	d := &Device{l: l, id: id}
	if err := l.call("init", func() int32 { return l.initDev(int32(id)) }); err != nil {
		return nil, err
	}
	if err := d.refreshInfo(); err != nil {
		return nil, err
	}
	opened = d
	return d, nil
}

func (d *Device) refreshInfo() error {
	var name [256]byte
	var ints [8]int32
	var mem [2]uint64
	if err := d.l.call("device_info", func() int32 { return d.l.deviceInfo(&name[0], int32(len(name)), &ints[0], &mem[0]) }); err != nil {
		return err
	}
	n := bytes.IndexByte(name[:], 0)
	if n < 0 {
		n = len(name)
	}
	d.info = Info{
		Name: string(name[:n]), Major: int(ints[0]), Minor: int(ints[1]), SMs: int(ints[2]), L2Bytes: int(ints[3]),
		SharedPerBlock: int(ints[4]), BusWidthBits: int(ints[5]), MemClockKHz: int(ints[6]), RuntimeVersion: int(ints[7]),
		FreeMem: mem[0], TotalMem: mem[1],
	}
	return nil
}

// Info returns the device's description, with free memory as of this call.
func (d *Device) Info() Info {
	_ = d.refreshInfo()
	return d.info
}

// LibPath is the file the library was loaded from.
func (d *Device) LibPath() string { return d.l.path }

// Synchronize waits for all work on the device.
func (d *Device) Synchronize() error {
	return d.l.call("synchronize", func() int32 { return d.l.deviceSynchronize() })
}

// Malloc allocates n bytes of device memory (cudaMalloc: 256-byte aligned).
func (d *Device) Malloc(n int64) (Ptr, error) {
	if n < 0 {
		return 0, fmt.Errorf("cuda: malloc of %d bytes", n)
	}
	var p uintptr
	err := d.l.call("malloc", func() int32 { return d.l.malloc(&p, uint64(n)) })
	return Ptr(p), err
}

// Free releases memory from Malloc. Freeing 0 is a no-op.
func (d *Device) Free(p Ptr) error {
	if p == 0 {
		return nil
	}
	return d.l.call("free", func() int32 { return d.l.free(uintptr(p)) })
}

// MallocHost allocates n bytes of pinned host memory, usable by the async
// copies. Release it with FreeHost.
func (d *Device) MallocHost(n int) ([]byte, error) {
	var p unsafe.Pointer
	if err := d.l.call("malloc_host", func() int32 { return d.l.mallocHost(&p, uint64(n)) }); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// FreeHost releases memory from MallocHost.
func (d *Device) FreeHost(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	return d.l.call("free_host", func() int32 { return d.l.freeHost(unsafe.Pointer(unsafe.SliceData(b))) })
}

// Upload copies src to device address dst and waits for the copy.
func (d *Device) Upload(dst Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.l.call("upload", func() int32 {
		return d.l.memcpyH2D(uintptr(dst), unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src)))
	})
}

// Download copies len(dst) bytes from device address src and waits for them.
func (d *Device) Download(dst []byte, src Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.l.call("download", func() int32 {
		return d.l.memcpyD2H(unsafe.Pointer(unsafe.SliceData(dst)), uintptr(src), uint64(len(dst)))
	})
}

// Plain is the element types the typed copy helpers accept.
type Plain interface {
	~float32 | ~float64 | ~int32 | ~uint32 | ~int16 | ~uint16 | ~int8 | ~uint8 | ~int64 | ~uint64
}

// AsBytes views a slice of plain values as bytes (no copy).
func AsBytes[T Plain](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// UploadSlice copies a slice of plain values to dst.
func UploadSlice[T Plain](d *Device, dst Ptr, src []T) error { return d.Upload(dst, AsBytes(src)) }

// DownloadSlice fills dst from device address src.
func DownloadSlice[T Plain](d *Device, dst []T, src Ptr) error { return d.Download(AsBytes(dst), src) }

// UploadAsync copies pinned host memory (from MallocHost) to dst on stream s.
func (d *Device) UploadAsync(dst Ptr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	return d.l.call("upload_async", func() int32 {
		return d.l.memcpyH2DAsync(uintptr(dst), uintptr(unsafe.Pointer(unsafe.SliceData(src))), uint64(len(src)), uintptr(s))
	})
}

// DownloadAsync copies from src into pinned host memory (from MallocHost) on stream s.
func (d *Device) DownloadAsync(dst []byte, src Ptr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return d.l.call("download_async", func() int32 {
		return d.l.memcpyD2HAsync(uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(src), uint64(len(dst)), uintptr(s))
	})
}

// CopyAsync copies n bytes between device addresses on stream s.
func (d *Device) CopyAsync(dst, src Ptr, n int64, s Stream) error {
	return d.l.call("copy_async", func() int32 { return d.l.memcpyD2DAsync(uintptr(dst), uintptr(src), uint64(n), uintptr(s)) })
}

// MemsetAsync sets n bytes at dst to the byte value v on stream s.
func (d *Device) MemsetAsync(dst Ptr, v byte, n int64, s Stream) error {
	return d.l.call("memset_async", func() int32 { return d.l.memsetAsync(uintptr(dst), int32(v), uint64(n), uintptr(s)) })
}

// NewStream creates a non-blocking stream.
func (d *Device) NewStream() (Stream, error) {
	var s uintptr
	err := d.l.call("stream_create", func() int32 { return d.l.streamCreate(&s) })
	return Stream(s), err
}

// DestroyStream releases a stream from NewStream.
func (d *Device) DestroyStream(s Stream) error {
	return d.l.call("stream_destroy", func() int32 { return d.l.streamDestroy(uintptr(s)) })
}

// SyncStream waits for the work queued on s.
func (d *Device) SyncStream(s Stream) error {
	return d.l.call("stream_synchronize", func() int32 { return d.l.streamSync(uintptr(s)) })
}

// StreamWait makes later work on s wait for event e.
func (d *Device) StreamWait(s Stream, e Event) error {
	return d.l.call("stream_wait_event", func() int32 { return d.l.streamWaitEvent(uintptr(s), uintptr(e)) })
}

// NewEvent creates an event (with timing).
func (d *Device) NewEvent() (Event, error) {
	var e uintptr
	err := d.l.call("event_create", func() int32 { return d.l.eventCreate(&e) })
	return Event(e), err
}

// DestroyEvent releases an event.
func (d *Device) DestroyEvent(e Event) error {
	return d.l.call("event_destroy", func() int32 { return d.l.eventDestroy(uintptr(e)) })
}

// Record records e on stream s.
func (d *Device) Record(e Event, s Stream) error {
	return d.l.call("event_record", func() int32 { return d.l.eventRecord(uintptr(e), uintptr(s)) })
}

// SyncEvent waits for e.
func (d *Device) SyncEvent(e Event) error {
	return d.l.call("event_synchronize", func() int32 { return d.l.eventSync(uintptr(e)) })
}

// Elapsed returns the milliseconds between two recorded, completed events.
func (d *Device) Elapsed(start, end Event) (float32, error) {
	var ms float32
	err := d.l.call("event_elapsed", func() int32 { return d.l.eventElapsed(&ms, uintptr(start), uintptr(end)) })
	return ms, err
}

// Library options (cuda/ds4cuda.h DS4C_OPT_*), for experiments.
const (
	OptWeightLoad   = 1  // 0 __ldg, 1 ld.global.nc.L1::no_allocate.L2::256B (default), 2 __ldcs
	OptSplitK       = 2  // 0 automatic; 1, 2, 4, 8 warps per row (single-token products)
	OptRowsPerWarp  = 3  // 0 automatic; 1, 2, 4, 8 rows per warp (single-token products)
	OptTCMinTokens  = 4  // tokens from which dense products use tensor cores (default 5 since v69: four tokens, a pass of three drafts, take the few-token forms; 0 never)
	OptTCMinSel     = 5  // selections from which grouped products use tensor cores (default 32; 0 never)
	OptPDL          = 6  // 1: programmatic dependent launch (default; env DS4_CUDA_PDL=0 turns it off); 0: plain launches
	OptAttnPO       = 7  // 1: single-token attention's softmax and output in one kernel (default); 0: two kernels
	OptPrefetch     = 8  // 1: products prefetch known weights into L2 before waiting for the previous kernel (default; env DS4_CUDA_PREFETCH=0 turns it off)
	OptFXWarp       = 9  // 1: single-token exact products of short 16-bit rows run a row per warp (default); 0: a row per CTA
	OptFXLive       = 68 // by bits: 1 OptFXWarp's kernel with 8 rows a CTA on rows of at most 1024 columns (the indexer's query product) keeps only the four groups of running sums that hold columns, the other four's totals written as +0 (else all eight groups); 2 that kernel requests a row's float4s two a thread at once before staging them (else one at a time); 4 its fused norm (one token) likewise, in a form of its own; 8 in passes of 2-4 tokens every token's row copied into shared memory at once by cp.async (over bit 2); DefaultFXLive; env DS4_CUDA_FX_LIVE; the same bits
	OptMVDecSum     = 71 // 1: exact mode's single-token IQ2_XXS / Q2_K products (OptMVDec) add a row's block terms on one lane from shared memory, in block order (default; env DS4_CUDA_MV_DEC_SUM; the same bits); 0: every lane adds them after a broadcast shuffle each
	OptAttnPOVec    = 72 // 2: single-token attention's softmax and output kernel (OptAttnPO) as 1, with its transposing stores of key slices swizzled free of bank conflicts and its serial loops (lane 0's sum, the weighted sums) loading the next group of 8 keys before adding the current one (the same bits); 3: as 2, exact mode's weighted sums on warps 0-3 with two heads a warp sharing each key slice read (measured +0.3 %, within the spread: cuda/NOTES.md v62; −0.6 % in v63's in-process A/B); 4 (the default, DefaultAttnPOVec; env DS4_CUDA_ATTN_PO_VEC): as 2, exact mode's softmax statistics formed once a head in a thread-block cluster of 8 output CTAs (k_attn_po_cl; where the exponentials are cached, else 2; the same bits); 5: as 4, the key slices' loads two 256-key chunks ahead (168 registers against 128; written in v64 after the last device call, not yet measured); 1: it finds its first 1024 keys' rows once a CTA and reads its staged key slices and probabilities four keys a load; 0: each key's row found by every thread loading it, a key a load
	OptHCTwo        = 10 // 1: hc_pre runs the Sinkhorn split in a second CTA per token (default; env DS4_CUDA_HC_TWO); 0: one CTA
	OptNormRope     = 11 // 1: rmsnorm, rope and FP8 rounding of query heads / KV rows in one kernel (default); 0: three kernels
	OptHCQuant      = 12 // 1: hc_pre forms x's Q8_0 activation itself when asked (default); 0: a quantize kernel after it
	OptMVPipe       = 13 // 1..4: single-token Q8_0/Q2_K/IQ2_XXS products stream their weights through a shared-memory pipeline, this many CTAs per SM (default 2; env DS4_CUDA_MV_PIPE); 0: one load round per CTA
	OptMVCopy       = 14 // the pipelined products' copies: 0 cp.async, 1 cp.async with L2 256-byte fetches, 2 bulk copies (default; env DS4_CUDA_MV_COPY)
	OptMVStage      = 15 // weight bytes per stage of the pipelined products (0, the default: the most that lets OptMVPipe CTAs fit an SM; env DS4_CUDA_MV_STAGE)
	OptMVStages     = 16 // stages of the pipelined products (2..8, default 3; env DS4_CUDA_MV_STAGES)
	OptMVPipeMin    = 17 // MiB of weights from which a single-token product is pipelined (default DefaultMVPipeMin; 0: every one that can be; env DS4_CUDA_MV_PIPE_MIN)
	OptMVTiming     = 18 // timing experiments only, wrong results: pipelined products skip their arithmetic (1) or ordered sums (2)
	OptIXTile       = 19 // 1: indexer scores of fewer than 8 queries (a CTA row a query) with a row per lane and 8 heads per warp; 2 (default): the same, and in fast mode (64 heads of 128) the dots on the tensor cores (TF32, float sums); 0: a (row, head) dot per thread
	OptTopKWarp     = 20 // 1: radix top-k with warp scans and a register bitonic sort, 512 threads when k ≤ 512 (default); 2: the same with 1024; 0: block-wide scans and sort
	OptRouterWarp   = 21 // 1: the router picks its experts by rounds of a warp maximum (default); 0: by ranking each expert against all
	OptAttnECache   = 22 // 1: single-token attention keeps its exponentials in shared memory for the output pass (default); 0: computes them again
	OptAttnRope     = 23 // 1: single-token attention applies the output's inverse RoPE in its output kernel (default); 0: a RoPE launch after it
	OptAttnQuant    = 24 // 1: single-token attention forms the output's Q8_0 activation in its output kernel (default); 0: a quantize launch after it
	OptAttnTile     = 25 // 1: chunk attention register-tiled: scores 4 heads × 4 keys a thread, weighted sum 8 heads × 4 dims; 2 (DefaultAttnTile): the same, exact mode's scores tiles staging their slices by cp.async, not through registers (the same bits); 0: the untiled kernels (env DS4_CUDA_ATTN_TILE)
	OptIXChunk      = 26 // 1: chunk indexer scores register-tiled, 4 heads × 4 rows per thread (default; env DS4_CUDA_IX_CHUNK); 0: a (row, head) dot per thread
	OptFXWReg       = 27 // 2: exact 16-bit-weight products of 16+ tokens keep each warp's weights in registers, only the inputs staged, and where every stage is whole (columns a multiple of 2048, or fewer and a multiple of 256) the inputs staged for 16-byte reads (default, DefaultFXWReg; env DS4_CUDA_FX_WREG); 1: the weights in registers only; 0: both staged in shared memory; the same bits
	OptTCStage      = 28 // tensor-core Q2_K and IQ2_XXS products of many tokens: 1 weights and activations staged in shared memory three blocks deep, CTAs of 4 warps × 32 slots; 2 the same with CTAs of 8 warps × 64 slots; 3 (default; env DS4_CUDA_TC_STAGE) IQ2_XXS as 2 from 32 selections a matrix on average (tokens, dense) and as 1 below, Q2_K as 1; 0 unstaged
	OptTCQ8W        = 29 // tensor-core Q8_0 products of many tokens (env DS4_CUDA_TC_Q8W): 1: CTAs of 8 warps × 64 slots, stages of 4 blocks three deep; 0: 4 warps × 32 slots, stages of 8 blocks two deep; 2 (default): the first for matrices of at most 1024 columns, the second for longer rows
	OptQuantVec     = 30 // 1: Q8_0 and Q8_K activations quantized 8 values a lane with 16-byte loads, the blocks of all tokens flattened (default; env DS4_CUDA_QUANT_VEC); 0: a lane a value (Q8_0 a warp a block, Q8_K a CTA a block)
	OptNormRopeW    = 31 // 1: the fused query/KV norm and rotation of chunks with a warp per row, the row in registers (default; env DS4_CUDA_NORM_ROPE_W); 0: a CTA per row staged in shared memory
	OptFloatTC      = 32 // 1: fast-mode products of 16-bit weights and 16+ tokens on the tensor cores, TF32 mma with each input split into two TF32 terms, when their tiles fill the GPU (default; env DS4_CUDA_FLOAT_TC); 2: whenever they can (tests); 0: never (the exact tiled kernels). Exact mode never uses it
	OptAttnTC       = 33 // 1: fast-mode chunk attention and indexer dots on the tensor cores, TF32 mma with operands split into two TF32 terms (default; env DS4_CUDA_ATTN_TC); 0: fast mode keeps the exact-order tiled scores and sums the weighted output with fused multiply-adds. Exact mode never uses it
	OptAttnSplit    = 34 // 1: fast-mode attention of fewer than 8 tokens split over the keys, flash decoding, for head dim 512 (env DS4_CUDA_ATTN_SPLIT); 2: from 512 keys the same split on the tensor cores, f16 operands (k_attn_flash per split, 64 heads a CTA), else as 1 (DefaultAttnSplit); 3: that kernel at any number of keys; 0: one pass over every key per (token, head), as exact mode. Exact mode never uses it
	OptHalfMM       = 35 // fast-mode products of chunks through cuBLAS, f16 operands and f32 sums (MatMulHalf; env DS4_CUDA_HALF_MM): 1 Q8_0 weights; 2 Q8_0 and F16 weights (DefaultHalfMM); 3 also the hyper-connection mixers, F16 weights with float inputs on the TF32 tensor cores; 0 never. Exact mode never uses it
	OptHalfMin      = 36 // tokens from which MatMulHalf takes a product (default 128; env DS4_CUDA_HALF_MIN)
	OptAttnFlash    = 37 // 1: fast-mode attention of chunks (8 or more tokens) in one kernel with f16 operands on the tensor cores, for head dim 512 and heads in groups of 64, the key rows rounded to f16 in the kernel (env DS4_CUDA_ATTN_FLASH); 2: the same kernel fed f16 copies of the key rows made before it (same bits); 3: those copies multiplied on wgmma (sm_90a: k_attn_wg, two warpgroups a CTA, 64-key tiles; other bits than 2 within the same bound; 2 where the device has no wgmma; DefaultAttnFlash); 0: scores, softmax and weighted sum as three kernels (OptAttnTC). Exact mode never uses it
	OptIXFlash      = 38 // 1: fast-mode indexer scores of chunks (8 or more tokens) with f16 operands on the tensor cores, for 64 heads of 128 (exact products on FP4-simulated inputs; env DS4_CUDA_IX_FLASH); 2: the same operations on f16 copies of the rows made once a chunk, four tokens a CTA, the next rows copied while the current ones are multiplied (the same bits); 3: the f16 copies multiplied on wgmma (sm_90a), eight tokens a CTA (other bits than 2 within the same bound; 2 where the device has no wgmma); 4: the same kernel on the rows' tile image, a tile one bulk copy on its stage's mbarrier, no barrier of the CTA a tile (the bits of 3; DefaultIXFlash); 0: the TF32-split tiles (OptAttnTC). Exact mode never uses it
	OptHCChunk      = 39 // 1: hc_pre of chunks (8 or more tokens, 4 streams) with 128 threads a token in a loop, the split in its first warp (same results; default; env DS4_CUDA_HC_CHUNK); 0: the decode layout (512 threads a token, OptHCTwo)
	OptWGMoE        = 40 // fast mode multiplies chunks by routed experts with f16 activations on the wgmma tensor cores (GroupedHalfOK, MatMulGroupedHalf; env DS4_CUDA_WG_MOE): 1 IQ2_XXS and Q2_K, CTAs of 4 warpgroups over 256 rows; 2 the same with IQ2_XXS in CTAs of 2 warpgroups, two an SM; 3 IQ2_XXS with its operands in shared memory in the 128-byte-swizzled layout, Q2_K on the int8 kernels; 4 Q2_K swizzled too (measured no faster than its int8 kernels); 5 both types with the weights dequantized into wgmma's A registers (RS form; GroupedHalf HalfPerm32), CTAs of 4 warpgroups; 6 the same in CTAs of 2 warpgroups, two an SM; 7 IQ2_XXS as 5 and Q2_K as 6 (DefaultWGMoE); 0 Q8_K activations through the int8 kernels, as exact mode
	OptHCMix        = 41 // 1: fast mode's hyper-connection mixing logits of chunks (HCMixesOK) in one pass over the streams on the TF32 tensor cores in three terms, scaled by the streams' rms there, chunks of up to 1024 tokens with K split over clusters of 8 CTAs (default; env DS4_CUDA_HC_MIX); 2: the same never split; 0: the exact-order product and HCPre's scaling, as exact mode
	OptAttnHalf     = 43 // the form of fast chunks' f16 queries and output through the flash attention kernel (AttentionHalfIO; env DS4_CUDA_ATTN_HALF): 1 NormRopeHalf's f16 queries in, f16 output rows out with the inverse rotation applied; 2 the same with the queries' norm and rotation in the kernel too; both give the same bits as the float queries and output; 3 as 2 from q_b's output as f16 rows (MatMulHalfH: half the bytes written and read; other bits; DefaultAttnHalf); 0 neither
	OptWGGLU        = 44 // 1: fast chunks' routed gate and up products in one wgmma launch with SwiGLU in its epilogue (GroupedGLUOK, MatMulGroupedGLU: the same bits as the two products and SwiGLUHalf; default; env DS4_CUDA_WG_GLU); 0: apart
	OptMVDec        = 45 // single-token IQ2_XXS and Q2_K products as k_mv_dec (each warp a run of one selection's rows, the activation in registers, the next rows in flight; bit-identical to the CPU in exact mode, and in fast mode unless OptMVFast's bit 2); the value picks rows at a time and CTAs an SM: 1 (1, 3), 2 (2, 2; DefaultMVDec), 3 (3, 2); env DS4_CUDA_MV_DEC; 0: k_matvec or the pipelined kernel
	OptMVF32        = 46 // MatVecF32 in one launch, by bits (default 7, DefaultMVF32; env DS4_CUDA_MV_F32): 1 the Q8_0 products that the pipelined kernel takes form their Q8_0 activation (after the RMSNorm) inside it, every CTA for itself (one launch for three; the same bits); 2 fast mode's F16 products of 1024, 2048 or 4096 columns with a norm as k_mv_f16_norm (each warp's row in registers before the wait, every CTA normalising the row itself; one launch for two; the same bits as RMSNormRef and k_matvec's one-row-a-warp launch); 4 exact mode's F16 products of at most 4096 columns with a norm as k_fexact_warp staging the row after its norm (RMSNormRef's operations; one launch for two; the same bits); a bit off: separate launches
	OptMVPre        = 47 // the pipelined products without ids: tiles requested before the wait for the previous kernel, capped at OptMVStages − 1 (default 7: all of them; env DS4_CUDA_MV_PRE); the rest after it
	OptIXQuery      = 49 // IndexQuery in one launch (1, default; env DS4_CUDA_IX_QUERY) or as Rope, HadamardFP4 and Scale (0); the same bits
	OptAttnWave     = 50 // fast single-token split attention: when its chunk splits make more CTAs than the GPU holds at once, as many splits as fit one wave (1, default; env DS4_CUDA_ATTN_WAVE); 0 two waves; fast mode, not the same bits
	OptHCHoist      = 51 // 1: single-token HCPre with HCPostMix's parts (fast decode) issues its stream loads right after the wait, before adding the parts (the same bits; default; env DS4_CUDA_HC_HOIST); 0: after the gates
	OptMVDecLate    = 52 // single-token IQ2_XXS / Q2_K products (OptMVDec) launched only when the kernel before them completes, not early beside it, where their CTAs hold every SM's registers while they wait and keep the side stream's shared expert off the GPU: 1 the routed gate/up pair, 2 also the down (default); 0 early; env DS4_CUDA_MV_DEC_LATE; the same bits
	OptMVFast       = 53 // fast mode's single-token products summed in parallel, not in quant.Dot's order (the same bits run to run), by bits: 1 the pipelined Q8_0 products (columns a multiple of 1024: warps reduce each row's 1024-value segments, the segments added in order), 2 the IQ2_XXS / Q2_K decode products (OptMVDec: each lane's shares, then the warp's tree sum); default 3 (DefaultMVFast); env DS4_CUDA_MV_FAST; 0: the exact terms in both modes
	OptMVEven       = 54 // 1: fast mode's pipelined Q8_0 products (OptMVFast bit 1) with automatic stages take the tile height (from the largest that fits down to 7/8 of it) that gives the busiest CTA the fewest rows (default; env DS4_CUDA_MV_EVEN); 0: the largest that fits; the same bits
	OptAttnCluster  = 55 // 1: fast single-token attention split over the keys (OptAttnSplit; the fp32 split kernel, up to 512 keys) combined in the same launch by thread-block clusters of 8 splits, one launch fewer on a layer's chain (the same bits as the two launches up to 256 keys; DefaultAttnCluster; env DS4_CUDA_ATTN_CLUSTER); 0: the split kernel, then the combine
	OptCompEmit     = 56 // 1: a decode step's compressed row (CompEmit: one row, equal ring capacities) pooled, normalised, rotated, post-processed and stored, and the step's entries written into the rings, in one launch (the same bits; DefaultCompEmit; env DS4_CUDA_COMP_EMIT); 0: the pooling, RMSNorm, rotation, post-processing and ring writes as their own kernels
	OptMVILP        = 57 // fast mode's pipelined Q8_0 products whose 1024-column segments divide the CTA's 8 warps: items (a row's segment of a tile) a warp forms at once, their loads, dp4a sums and tree sums interleaved (1 to 4, default DefaultMVILP; env DS4_CUDA_MV_ILP; the same bits); 1: one item after another
	OptMVSumW       = 58 // 1: fast mode's pipelined Q8_0 products whose 1024-column segments divide the CTA's 8 warps add a tile's row sums on the last warp (no copies to request), each row's partials in one or two vector loads (default, DefaultMVSumW; env DS4_CUDA_MV_SUMW; the same bits); 0: warp 0's threads, a load a partial
	OptMVRoom       = 60 // pipelined products given room (a scoring decode step's q_b beside the indexer's path), by bits: 1 one token's, 2 two tokens' run OptMVPipe CTAs an SM within the room's budget, the others one CTA an SM (env DS4_CUDA_MV_ROOM; DefaultMVRoom)
	OptTCParts      = 61 // 1: grouped int8 tensor-core products in CTAs of 32 slots launch only the tile parts that hold selections (Group's part list; default; env DS4_CUDA_TC_PARTS); 0: every tile's four parts, the empty ones starting and leaving; the same bits
	OptTopKCl       = 62 // the top-k of a launch whose tokens see this many candidate rows or more (k ≤ 512) on a thread-block cluster of 8 CTAs a token (the same picks in the same order as the one-CTA kernels; default 8193; env DS4_CUDA_TOPK_CL); 0: never
	OptTopKClTok    = 63 // OptTopKCl only for launches of at most this many tokens (default 16: decode steps and speculative passes; a prefill chunk's 4096 tokens measured slower on it; env DS4_CUDA_TOPK_CL_TOK)
	OptIXFlashSplit = 64 // fast chunks' indexer scores on the f16 tensor cores: where a chunk's token groups are too few for this many waves of the kernel's CTAs (two an SM for OptIXFlash 1, one for 2 and 3), each group's compressed rows split into runs, a CTA a run (the same bits; DefaultIXFlashSplit; env DS4_CUDA_IX_FLASH_SPLIT); 0: a CTA walks every row
	OptTopKWide     = 65 // 1: the top-k of launches of more than OptTopKClTok tokens whose rows pass 8192 (prefill chunks deep in a long context) in two walks over the scores, a histogram of the keys' top 11 bits and the candidates at and above the cut gathered in index order (k_topk_wide; the same picks in the same slots as 0; DefaultTopKWide; env DS4_CUDA_TOPK_WIDE); 0: k_topk_warp's five walks
	OptMVQ8NSEx     = 73 // stages of exact mode's pipelined Q8_0 products (on fast mode's items, OptMVExQ8) with automatic tiles (OptMVStage 0), a decimal digit a class of columns: thousands at most 1024, hundreds 2048, tens 4096, ones more; each 2..8, or 0 for OptMVStages (default DefaultMVQ8NSEx: the shared expert's down in 2 stages; env DS4_CUDA_MV_Q8_NS_EX; the same bits: stages change the tiles, not a row's order)
	OptMVQ8NSFast   = 74 // the same for fast mode's pipelined Q8_0 products (default 0: OptMVStages for all; env DS4_CUDA_MV_Q8_NS_FAST)
	OptMVQ8CTAsEx   = 75 // exact mode's pipelined Q8_0 products (as OptMVQ8NSEx) run at most this many CTAs an SM, a decimal digit a class of columns as there, tiles still sized for OptMVPipe CTAs an SM (0: no cap, the default; env DS4_CUDA_MV_Q8_CTAS_EX; the same bits)
	OptMVQ8CTAsFast = 76 // the same for fast mode's (default 0; env DS4_CUDA_MV_Q8_CTAS_FAST)
	OptExTiming     = 77 // timing experiments only, wrong results in exact mode: exact single-token work runs fast mode's kernels, by bits: 1 Q8_0 products, 2 attention, 4 float products, 8 indexer scores (env DS4_CUDA_EX_TIMING)
	OptAttnOrder    = 78 // exact attention's summation order: 0 serial (cpu.Options.AttnSerial; the default until v66), 1 segmented (cpu.AttendHead with cpu.AttnSegmentKeys, the CPU backend's default) in k_attn_po_cl, 2 the same split over the segments (k_attn_seg, 128 dims a CTA; 3: 64; 4: 32; 5, DefaultAttnOrder: as 3 with the scores formed in the kernel, k_attn_seg_cl, a cluster of the 8 dim slices, for head dim 512, else as 3); prompt chunks in k_attn_softmax_seg + k_attn_out_tile whatever the value 1-5 (env DS4_CUDA_ATTN_ORDER)
	OptSegComb      = 79 // k_attn_seg_combine (exact decode in the segmented order): 1 its loads requested before the statistics (default), 0 the v66 form; the same bits (env DS4_CUDA_SEG_COMB)
	OptMVOcc        = 80 // the pipelined Q8_0 products of 2-4 tokens (speculative passes) in forms whose registers are bounded for two CTAs an SM, two items a warp at once (the same bits: TestMatVecFastQ8Two), by bits: 1 fast mode's, 2 exact mode's; 3 both (default, DefaultMVOcc; env DS4_CUDA_MV_OCC); 0 the unbounded forms, which hold one CTA an SM where their registers are many (fast mode's four-token form 178 registers a thread, exact mode's two-token one with its summing warp 115: nvcc 11.8; cuda/NOTES.md v71)
	OptMVFewNSEx    = 81 // stages of exact mode's pipelined Q8_0 products of 2-4 tokens (speculative passes), a decimal digit a class of columns as OptMVQ8NSEx, a digit 0 taking that option's (DefaultMVFewNSEx 2222; env DS4_CUDA_MV_FEW_NS_EX; the same bits)
	OptAttnSegOcc   = 83 // exact mode's split attention of 1-7 tokens (k_attn_seg_cl, OptAttnOrder 5) compiled for at least this many CTAs an SM (2-5: __launch_bounds__' second argument, fewer registers a thread; the same bits; DefaultAttnSegOcc 4), 0 for none (env DS4_CUDA_ATTN_SEG_OCC)
	OptAttnSegWalk  = 84 // exact mode's split attention (OptAttnOrder 5) with a cluster walking several segments (k_attn_seg_walk: each CTA finds its keys' rows and stages its queries once and loads the next segment during the current one's sums; the same bits), as few a cluster as keep the CTAs within one wave: 0 off, 1 single tokens (DefaultAttnSegWalk), 2 every token count (1-7), 3-14 every count with value − 2 segments a CTA (env DS4_CUDA_ATTN_SEG_WALK)
	OptIXExact      = 86 // exact mode's indexer scores of prompt chunks (8 or more queries) on the f16 tensor cores (k_index_flash_exact), each dot kept where its query head's and row's exponent spans make it exact in float (the model's FP4-simulated values), formed again in dot4_ref's operations where not: the same bits as 0 (the FP32 tiles); 1 the rows staged by each CTA; 2 (DefaultIXExact) the same kernel fed f16 copies of the rows with their spans, formed once a chunk (k_ix_rows_half); bit 4 (tests only: 5, 6) a dot that fails the check is +inf (env DS4_CUDA_IX_EXACT)
	OptAttnSegForm  = 85 // exact mode's split attention (k_attn_seg_cl, k_attn_seg_walk): the scores' and sums' forms, SF + 4·PF; SF 0 a thread a chain of one head and key, 1 two heads a thread, 2 two heads × two keys; PF 0 a lane a head's 2 dims, 1 a lane two heads' dim; the same bits; DefaultAttnSegForm 5 (env DS4_CUDA_ATTN_SEG_FORM)
	OptMVFewNSFast  = 82 // the same for fast mode's (a digit 0 taking OptMVQ8NSFast's; DefaultMVFewNSFast 2222; env DS4_CUDA_MV_FEW_NS_FAST)
	OptMVExQ8       = 66 // 1: exact mode's pipelined Q8_0 products (columns a multiple of 1024 dividing the CTA's 8 warps) form their block terms on fast mode's items (a lane a block; the terms stored, not tree-summed) and add them in block order: the same bits as 0 with about a third of the instructions; 2: the same with a ninth warp, which forms no items, adding the previous tile's rows while the eight form the next (default, DefaultMVExQ8; env DS4_CUDA_MV_EXQ8); 1: the last warp adds them after its items; 0: the pipelined kernel's 16-byte units, two lanes a block
	OptMVTwo        = 59 // products of two tokens (bits 1, 2 and 4 also of three and four since v69: deeper drafts' passes), by bits: 1 fast mode's: Q8_0 ones (one selection, columns a multiple of 1024 dividing the 8 warps) as one pipelined product, the weights streamed once and each token's bits its one-token product's, the others split over up to 8 warps a row where the rows are few; 2 exact mode's Q8_0 ones of those shapes pipelined the same way (quant.Dot's bits, v67); 4, with bit 2: exact mode's MatMulQ8Out of two tokens quantizes both tokens' output blocks in its CTAs (a pass's wo_a for wo_b; the same bits as Quantize after the product; fast mode keeps the separate steps: −0.2 / −0.5 %, within the spread; v68); 8 exact mode's HCPostMixEx of two tokens in one CTA a part, the weights loaded once (each token's bits its one-token launch's; v68); 16, with bit 1: fast mode's Q8_0 items of three and four tokens with the tokens' shuffle trees packed into one (six shuffles an item for four tokens against twenty; each token's bits its one-token product's; v71: fast mode's three drafts +4.7 % in one process); 31 all five (default, DefaultMVTwo; env DS4_CUDA_MV_TWO); 0: the generic two-token kernel, a warp a row
	OptMVPair       = 48 // MatMulGroupedPair of one selection of one Q8_0 or Q4_K matrix (a shared expert's gate and up): both in one k_matvec grid (1, default; env DS4_CUDA_MV_PAIR) or two launches (0); the same bits in exact mode (in fast mode a lone Q8_0 product runs pipelined, which adds in another order)
	OptHadWarp      = 42 // 1: Walsh–Hadamard transforms of rows of 32 … 512 values a warp a row in registers, with the FP4 simulation in the same kernel for HadamardFP4 (the same bits; default; env DS4_CUDA_HAD_WARP); 0: a CTA a row in shared memory, the FP4 simulation apart
)

// DefaultAttnHalf is the library's default of OptAttnHalf: q_b's output as
// f16 rows, their norm and rotation and the output's in the flash kernel
// (cuda/NOTES.md v54).
const DefaultAttnHalf = 3

// DefaultWGMoE is the library's default of OptWGMoE: both expert types on
// wgmma with the weights dequantized into its A registers (H200, 4096
// tokens: IQ2_XXS gate 1368 → 1220 µs against the swizzled form of 3, Q2_K
// down 2136 → 1363 against the int8 kernel; an 8k prompt 7688 → 7909–8059
// tok/s; cuda/NOTES.md v18), the Q2_K down in CTAs of 2 warpgroups, two an
// SM (1292 → 1202 µs; cuda/NOTES.md v55).
const DefaultWGMoE = 7

// DefaultHalfMM is the library's default of OptHalfMM: fast mode's Q8_0
// and F16 products of chunks through cuBLAS (the mixers too, 3, measured no
// faster: cuda/NOTES.md v15).
const DefaultHalfMM = 2

// DefaultAttnFlash is the library's default of OptAttnFlash: fast chunks'
// attention on wgmma from f16 copies of the key rows (H200, 2048 tokens at
// 6144: a ratio-4 layer 833 µs against 1062 for the mma.sync kernel on the
// same copies; cuda/NOTES.md v53), where the device has wgmma.
const DefaultAttnFlash = 3

// DefaultMVPipeMin is the library's default of OptMVPipeMin: every
// single-token product with a pipelined form takes it (since v34: q_a, the
// KV and the shared expert's products too, their first tiles requested
// before the wait for the kernel before them; cuda/NOTES.md v9 set 15 MiB
// when the pipeline could not start early).
const DefaultMVPipeMin = 0

// DefaultMVDec is the library's default of OptMVDec: two rows at a time,
// two CTAs an SM (cuda/NOTES.md v20).
const DefaultMVDec = 2

// DefaultAttnSplit is the library's default of OptAttnSplit: fast single
// tokens' attention split over the keys, on the tensor cores from 512 keys
// (a ratio-4 layer's 640: 12.2 µs against 14.7 for k_attn_split; below,
// k_attn_split is the faster; cuda/NOTES.md v28).
const DefaultAttnSplit = 2

// DefaultAttnCluster is the library's default of OptAttnCluster: the fp32
// split kernel combines its splits in its own launch (cuda/NOTES.md v32).
const DefaultAttnCluster = 1

// DefaultCompEmit is the library's default of OptCompEmit: a decode step's
// compressed row in one launch (cuda/NOTES.md v33).
const DefaultCompEmit = 1

// DefaultIXTile is the library's default of OptIXTile: the tiled
// single-query scores, on the tensor cores in fast mode (cuda/NOTES.md v29).
const DefaultIXTile = 2

// DefaultMVF32 is the library's default of OptMVF32: the three fused forms.
const DefaultMVF32 = 7

// DefaultMVILP is the library's default of OptMVILP: four items a warp at
// once.
const DefaultMVILP = 4

// DefaultMVTwo is the library's default of OptMVTwo: two tokens' Q8_0
// products pipelined together in both modes (cuda/NOTES.md v45, v67), and
// in exact mode wo_a's two-token output quantized in its product and the
// two-token hc_post mixes in one CTA a part (v68), and fast mode's three-
// and four-token items with their trees packed (v71).
const DefaultMVTwo = 31

// DefaultMVOcc is the library's default of OptMVOcc: both modes' few-token
// Q8_0 forms bounded for two CTAs an SM (cuda/NOTES.md v71).
const DefaultMVOcc = 3

// DefaultMVFewNSEx is the library's default of OptMVFewNSEx: exact mode's
// few-token products in two stages of taller tiles for every class of
// columns (cuda/NOTES.md v72: exact three drafts a pass +2.9 % in one
// process).
const DefaultMVFewNSEx = 2222

// DefaultAttnSegOcc is the library's default of OptAttnSegOcc: the split
// attention compiled for 4 CTAs an SM (CUDA 13: 64 registers against 78,
// so 4 CTAs an SM against 3; cuda/NOTES.md v73: exact mode's three drafts
// +1.0 … +1.2 % in one process, one draft +0.7 %, plain decode 0.0 %; 5
// spills and loses 1.5 % on plain decode).
const DefaultAttnSegOcc = 4

// DefaultAttnSegWalk is the library's default of OptAttnSegWalk: single
// tokens' segments walked by fewer CTAs (cuda/NOTES.md v74: exact decode
// +0.5 … +0.7 % in one process, three calls); passes of 2-4 tokens keep a
// CTA a segment (walking measured −2.3 … +0.2 %).
const DefaultAttnSegWalk = 1

// DefaultFXLive is the library's default of OptFXLive: every bit (the
// live groups, the staged rows' and the fused norm's loads requested a few
// a thread at once, and the rows of 2-4-token passes copied by cp.async:
// exact three drafts +1.43 % in one process, v76).
const DefaultFXLive = 15

// DefaultAttnSegForm is the library's default of OptAttnSegForm: form 5,
// two heads' chains of one key a thread in the scores (warps 0-3) and two
// heads' sums of one dim a lane (cuda/NOTES.md v75: the value read from
// shared memory serves two chains; exact decode +0.58 %, exact three drafts
// +1.14 % in one process against form 0).
const DefaultAttnSegForm = 5

// DefaultAttnTile is the library's default of OptAttnTile: the tiles,
// exact mode's scores staged by cp.async (cuda/NOTES.md v80).
const DefaultAttnTile = 2

// DefaultIXExact is the library's default of OptIXExact: chunks' indexer
// dots on the tensor cores where exact, from f16 copies of the rows
// (cuda/NOTES.md v78: form 1, exact prefill at 131k 1009 → 1872 tok/s in
// one process, a 262k exact prompt's second half 172 → 83 s; v79: form 2
// 1868 → 1963 tok/s against 1; the same bits).
const DefaultIXExact = 2

// DefaultMVFewNSFast is the library's default of OptMVFewNSFast: fast
// mode's few-token products in two stages of taller tiles for every class
// of columns (cuda/NOTES.md v72: fast three drafts a pass +3.9 % in one
// process, where one token's products lose 0.5 % in two stages).
const DefaultMVFewNSFast = 2222

// MVTwoPack is OptMVTwo's bit for fast mode's three- and four-token
// Q8_0 items with the tokens' trees packed (each token's bits the unpacked
// form's; on by default since v71: fast mode's three drafts +4.7 %).
const MVTwoPack = 16

// DefaultTCMinTokens is OptTCMinTokens' default: dense products of 5
// tokens and more on the tensor cores; 2 to 4 (speculative passes) on the
// few-token forms (cuda/NOTES.md v69).
const DefaultTCMinTokens = 5

// DefaultAttnOrder is the library's default of OptAttnOrder: exact mode's
// attention in the segmented order (the CPU backend's default, so exact
// mode keeps its bits), single tokens split over the segments 64 dims a
// CTA with their scores formed in the same kernel (k_attn_seg_cl; option 3,
// k_attn_seg<64> after k_attn_scores<1>, for other head dims). Exact decode
// at 8k on the H200: option 3 +2.2–2.5 % against the serial order, option
// 5 another +1.2 % (cuda/NOTES.md v65, v66).
const DefaultAttnOrder = 5

// DefaultMVRoom is the library's default of OptMVRoom: products given room
// run one CTA an SM. Two tokens' in two (2) was the default from v47 (+0.4 /
// +2.3 % speculative at 81 / 100 % committed then) until v65, where the
// speculative A/B at 80 % ran +1.29 and +1.12 % faster without it (two
// calls, 6 and 8 rounds); one token's were slower so (cuda/NOTES.md v47,
// v65).
const DefaultMVRoom = 0

// DefaultMVSumW is the library's default of OptMVSumW: the row sums on
// the last warp.
const DefaultMVSumW = 1

// DefaultTopKCl is the library's default of OptTopKCl: the cluster top-k
// from 8193 candidate rows, where k_topk_warp's keys no longer fit its
// registers (a decode token at 32k context and beyond; cuda/NOTES.md v51).
const DefaultTopKCl = 8193

// DefaultTopKClTok is the library's default of OptTopKClTok: decode steps
// and speculative passes only (a prefill chunk's top-k measured slower on
// the clusters: 7338 against 7851 tok/s from 32k to 64k; cuda/NOTES.md v51).
const DefaultTopKClTok = 16

// DefaultIXFlash is the library's default of OptIXFlash: the f16 copies of
// the rows on wgmma, fed by bulk copies of their tile image (cuda/NOTES.md
// v53: 1912 against 2203 µs for 2048 tokens × 32256 rows; 2 where the
// device has no wgmma).
const DefaultIXFlash = 4

// DefaultTopKWide is the library's default of OptTopKWide: the two-walk
// top-k for prefill chunks past 8192 rows (cuda/NOTES.md v53: 666 against
// 809 µs for 2048 tokens' 512 of 32256 rows).
const DefaultTopKWide = 1

// DefaultIXFlashSplit is the library's default of OptIXFlashSplit: two
// waves (cuda/NOTES.md v51).
const DefaultIXFlashSplit = 2

// DefaultMVExQ8 is the library's default of OptMVExQ8: exact mode's
// pipelined Q8_0 products on fast mode's items (cuda/NOTES.md v57), the
// rows added by a ninth warp (v58).
const DefaultMVExQ8 = 2

// DefaultMVQ8NSEx is the library's default of OptMVQ8NSEx: exact mode's
// pipelined Q8_0 products of 2048 columns (the shared expert's down) in two
// stages: taller tiles and fewer CTAs (216 against 256), so that more SMs
// hold one of them, which leaves room for a routed expert's CTA beside it
// (exact decode +2.0 % against three stages; every exact class in two
// stages +1.0 %; fast mode's products keep OptMVStages' three:
// cuda/NOTES.md v63).
const DefaultMVQ8NSEx = 200

// DefaultAttnPOVec is the library's default of OptAttnPOVec: exact mode's
// single-token softmax statistics formed once a head in a thread-block
// cluster of the head group's output CTAs (k_attn_po_cl: exact decode +0.6
// % against option 2, the same bits; cuda/NOTES.md v64).
const DefaultAttnPOVec = 4

// DefaultFXWReg is the library's default of OptFXWReg: exact prompt
// chunks' 16-bit-weight products with the inputs staged for 16-byte reads
// where every stage is whole (cuda/NOTES.md v60).
const DefaultFXWReg = 2

// DefaultMVFast is the library's default of OptMVFast: both kinds of
// single-token product summed in parallel in fast mode.
const DefaultMVFast = 3

// SetOption sets a library tuning option (process-wide).
func (d *Device) SetOption(key, value int) error {
	return d.l.call("set_option", func() int32 { return d.l.setOption(int32(key), int32(value)) })
}

// SetOptionEnv sets an option by its environment variable, as the library
// reads it at load: assign is "DS4_CUDA_NAME=VALUE". Names the library does
// not have, values that are not whole numbers and values the option refuses
// fail. The option takes effect where the library reads it — for most, at
// each launch; a few (weight copies made at load) only at load.
func (d *Device) SetOptionEnv(assign string) error {
	return d.l.call("set_option_env", func() int32 { return d.l.setOptEnv(assign) })
}

// OptionEnv returns the current value of the option whose environment
// variable is name ("DS4_CUDA_NAME").
func (d *Device) OptionEnv(name string) (int, error) {
	var v int32
	err := d.l.call("get_option_env", func() int32 { return d.l.getOptEnv(name, &v) })
	return int(v), err
}

// Graph is an executable CUDA graph captured from a stream.
type Graph uintptr

// BeginCapture starts capturing the work queued on s (not the default
// stream) into a graph, instead of running it; EndCapture finishes it. The
// capture is relaxed (any thread may queue onto s; nothing else is
// restricted), which suits goroutines that move between OS threads.
func (d *Device) BeginCapture(s Stream) error {
	return d.l.call("graph_begin", func() int32 { return d.l.graphBegin(uintptr(s)) })
}

// EndCapture ends the capture on s and instantiates the graph.
func (d *Device) EndCapture(s Stream) (Graph, error) {
	var g uintptr
	err := d.l.call("graph_end", func() int32 { return d.l.graphEnd(uintptr(s), &g) })
	return Graph(g), err
}

// Launch replays g on stream s.
func (d *Device) Launch(g Graph, s Stream) error {
	return d.l.call("graph_launch", func() int32 { return d.l.graphLaunch(uintptr(g), uintptr(s)) })
}

// EndCaptureUpdate ends the capture on s and brings *g up to date with
// it: updated in place when the captured topology matches *g's (returns
// 1), else re-instantiated (returns 2; *g may be 0 on entry).
func (d *Device) EndCaptureUpdate(s Stream, g *Graph) (int, error) {
	var how int32
	e := uintptr(*g)
	err := d.l.call("graph_end_update", func() int32 { return d.l.graphUpdate(uintptr(s), &e, &how) })
	*g = Graph(e)
	return int(how), err
}

// AbortCapture ends any capture in progress on s, dropping its work.
func (d *Device) AbortCapture(s Stream) error {
	return d.l.call("graph_abort", func() int32 { return d.l.graphAbort(uintptr(s)) })
}

// DestroyGraph releases g.
func (d *Device) DestroyGraph(g Graph) error {
	return d.l.call("graph_destroy", func() int32 { return d.l.graphDestroy(uintptr(g)) })
}

// Recorder logs the work queued on a main and a side stream instead of
// running it, to run it as a graph replayed without capture (cuda/replay.cu).
type Recorder uintptr

// RGraph is an executable graph run from a Recorder's log.
type RGraph uintptr

// RecordStats says what RecordLaunch did.
type RecordStats struct {
	Built   bool // the graph was built (captured) from the log
	Updated int  // kernel nodes whose parameters were set in place
	Ops     int  // operations logged
}

// NewRecorder returns a recorder of the work queued on main, side and side2
// (either side stream may equal main).
func (d *Device) NewRecorder(main, side, side2 Stream) (Recorder, error) {
	var r uintptr
	err := d.l.call("rec_create", func() int32 { return d.l.recCreate(uintptr(main), uintptr(side), uintptr(side2), &r) })
	return Recorder(r), err
}

// DestroyRecorder releases r (recording or not).
func (d *Device) DestroyRecorder(r Recorder) error {
	return d.l.call("rec_destroy", func() int32 { return d.l.recDestroy(uintptr(r)) })
}

// RecordBegin starts logging the work queued on r's streams: kernels,
// copies and event operations are kept instead of run, and synchronising
// either stream is an error, until RecordLaunch or RecordAbort.
func (d *Device) RecordBegin(r Recorder) error {
	return d.l.call("rec_begin", func() int32 { return d.l.recBegin(uintptr(r)) })
}

// RecordAbort stops logging and drops the log.
func (d *Device) RecordAbort(r Recorder) error {
	return d.l.call("rec_abort", func() int32 { return d.l.recAbort(uintptr(r)) })
}

// RecordLaunch stops logging and runs the log on r's main stream as the
// graph *g: built when *g is 0 or was built from work of another
// structure, else its changed kernel parameters set in place.
func (d *Device) RecordLaunch(r Recorder, g *RGraph) (RecordStats, error) {
	var st [3]int32
	e := uintptr(*g)
	err := d.l.call("rec_launch", func() int32 { return d.l.recLaunch(uintptr(r), &e, &st) })
	*g = RGraph(e)
	return RecordStats{Built: st[0] != 0, Updated: int(st[1]), Ops: int(st[2])}, err
}

// DestroyRGraph releases g.
func (d *Device) DestroyRGraph(g RGraph) error {
	return d.l.call("rgraph_destroy", func() int32 { return d.l.rgraphDestroy(uintptr(g)) })
}

// BenchRead reads n bytes at src as fast as the library can (a bandwidth
// ceiling for benchmarks); out must hold 16·SMs bytes.
func (d *Device) BenchRead(src Ptr, n int64, out Ptr, s Stream) error {
	return d.l.call("bench_read", func() int32 { return d.l.benchRead(uintptr(src), uint64(n), uintptr(out), uintptr(s)) })
}

// ChainOp is one product of ChainQ8 (ds4cuda.h's ds4c_chain_op): the
// Q8_0 matrix W (device layout) of Rows × Cols, its Q8_0 activation Act,
// and the outputs Y (Rows floats) and YQ (Y's Q8_0 activation,
// ActBytes(Q8_0, Rows) bytes).
type ChainOp struct {
	W, Act, Y, YQ Ptr
	Rows, Cols    int64
}

// ChainFlags selects ChainQ8's forms (ds4c_chain_q8's flags).
type ChainFlags int32

const (
	// ChainSerial makes the weights' producer wait for op i−1's last block
	// before op i's first copies, as a kernel boundary would.
	ChainSerial ChainFlags = 1
	// ChainWide runs 16 consumer warps a CTA instead of 8.
	ChainWide ChainFlags = 2
	// ChainILP has each consumer warp form 2 (wide) or 4 of its items at once.
	ChainILP ChainFlags = 4
	// ChainNoMath consumes the stages without forming their items (timing
	// only: the outputs are wrong).
	ChainNoMath ChainFlags = 8
	// ChainSegDep has each consumer warp wait only for the 1024 rows of op
	// i−1 that its segment of the activation is (read from L2 into its
	// registers), not for the whole op.
	ChainSegDep ChainFlags = 16
	// ChainNoWait has no op wait for the one before (timing only: the
	// outputs are wrong).
	ChainNoWait ChainFlags = 32
	// ChainSleep polls the counters (ChainFence(3): the flagged words)
	// with a 128 (256) ns sleep between loads.
	ChainSleep ChainFlags = 64
	// ChainProbe writes eight clock64 sums a CTA after the counters (at
	// word (10·len(ops)+1) &^ 1 of count, uint64 each): consumer warp 0's
	// waits for the stages' bytes, its waits for the ops' inputs, its
	// items, the producer's waits for free stages, warp 0's waits for a
	// free partials buffer, the finisher warp's fences, and a probe
	// thread's cycles and count of dependent L2 loads (ld.global.cg of one
	// word) while the chain runs.
	ChainProbe ChainFlags = 128
	// ChainIdle leaves CTA 0 without blocks (an SM that streams nothing,
	// whose L2 latency ChainProbe then measures beside the others').
	ChainIdle ChainFlags = 4096
	// ChainHold has a CTA request op i's weights only after it has
	// published its own last block of op i−1 (so that the publish's fence
	// waits for no weight bytes in flight on the SM).
	ChainHold ChainFlags = 8192
)

// ChainStep is the flags of a step of us µs between two of ChainQ8's ops
// (one thread spins once op i−1 is complete, op i waits for it): a
// latency-bound stand-in for the kernels between a decode step's products.
func ChainStep(us int) ChainFlags { return ChainFlags(us << 14) }

// ChainCountBytes is the size of ChainQ8's count buffer for ops: ten
// counters an op (rounded to 8 bytes: chain.cu's ch_probe_word), the
// probe's sums (64 bytes a multiprocessor), and the flagged words of
// ChainFence(3).
func (d *Device) ChainCountBytes(ops []ChainOp) int64 {
	n := int64(len(ops))
	b := 4*((10*n+1)&^1) + 64*int64(d.Info().SMs)
	for _, o := range ops {
		b += 8 * (o.Rows/4 + o.Rows/32)
	}
	return b
}

// ChainFence is the flags of how ChainQ8 publishes a finished block before
// counting it: 0 __threadfence by every lane of the warp, 1
// fence.acq_rel.gpu by every lane, 2 a release reduction by lane 0 after
// the warp's barrier, 3 no fence and no counters: each 4 quants or scale
// of the block's Q8_0 activation stored beside a flag in one 8-byte word
// (NCCL's LL protocol), which the next op's warps poll (not with
// ChainSerial or steps).
func ChainFence(mode int) ChainFlags { return ChainFlags(mode&3) << 8 }

// ChainTile is the flags of ChainQ8's stages of 32768 >> shift weights
// (shift 0..2: 34, 17 or 8.5 KB with their scales).
func ChainTile(shift int) ChainFlags { return ChainFlags(shift&3) << 10 }

// ChainQ8 runs ops as one persistent launch, op i's activation op i−1's YQ
// (a measurement of the persistent decode kernel's premise; nothing in the
// model calls it): each op's Y and YQ are MatMulQ8Out's bits in fast mode,
// whatever the flags. stages (2..16) is the shared-memory stages a CTA
// (34 KB each unless ChainTile); count must hold ChainCountBytes(ops)
// bytes.
func (d *Device) ChainQ8(ops []ChainOp, count Ptr, stages int, flags ChainFlags, s Stream) error {
	if len(ops) == 0 {
		return nil
	}
	return d.l.call("chain_q8", func() int32 {
		rc := d.l.chainQ8(uintptr(unsafe.Pointer(&ops[0])), int32(len(ops)), uintptr(count), int32(stages), int32(flags), uintptr(s))
		runtime.KeepAlive(ops)
		return rc
	})
}

// Profiler starts (on) or stops the CUDA profiler's collection, for
// `ncu --profile-from-start off` around the work of interest.
func (d *Device) Profiler(on bool) error {
	v := int32(0)
	if on {
		v = 1
	}
	return d.l.call("profiler", func() int32 { return d.l.profiler(v) })
}
