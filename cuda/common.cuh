// common.cuh: helpers shared by the .cu files of libds4cuda.so (host error
// reporting, launch checks, small device functions). Everything device-side
// is static inline so that the files link without relocatable device code.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ds4cuda.h"

// Error reporting (ds4cuda.cu). ds4c_err formats a message into the calling
// thread's last-error buffer and returns code.
int ds4c_err(int code, const char *fmt, ...);
int ds4c_cuda_err(cudaError_t e, const char *where);
// ds4c_ready returns 0 once ds4c_init has succeeded (and makes the chosen
// device current on the calling thread), else DS4C_ENOINIT.
int ds4c_ready(void);
int ds4c_sm_count(void);
int ds4c_opt_wload(void);
int ds4c_opt_splitk(void);
int ds4c_opt_rpw(void);
int ds4c_opt_tc_min_tok(void); // INT32_MAX when disabled
int ds4c_opt_tc_min_sel(void); // INT32_MAX when disabled
int ds4c_opt_pdl(void);
int ds4c_opt_attn_po(void);
int ds4c_opt_prefetch(void);
int ds4c_opt_fx_warp(void);
int ds4c_opt_fx_live(void);
int ds4c_opt_mv_dec_sum(void);
int ds4c_opt_hc_two(void);
int ds4c_opt_norm_rope(void);
int ds4c_opt_hc_quant(void);
int ds4c_opt_mv_pipe(void);
int ds4c_opt_mv_copy(void);
int ds4c_opt_mv_timing(void);
int ds4c_opt_mv_stage(void);
int ds4c_opt_mv_stages(void);
int ds4c_opt_mv_pipe_min(void);
int ds4c_opt_ix_tile(void);
int ds4c_opt_attn_tile(void);
int ds4c_opt_ix_chunk(void);
int ds4c_opt_fx_wreg(void);
int ds4c_opt_tc_stage(void);
int ds4c_opt_tc_q8w(void);
int ds4c_opt_quant_vec(void);
int ds4c_opt_norm_rope_w(void);
int ds4c_opt_float_tc(void);
int ds4c_opt_attn_tc(void);
int ds4c_opt_attn_split(void);
int ds4c_opt_half_mm(void);
int ds4c_opt_half_min(void);
int ds4c_opt_attn_flash(void);
int ds4c_opt_ix_flash(void);
int ds4c_opt_hc_chunk(void);
int ds4c_opt_hc_mix(void);
int ds4c_opt_had_warp(void);
int ds4c_opt_attn_half(void);
int ds4c_opt_wg_glu(void);
int ds4c_opt_mv_dec(void);
int ds4c_opt_mv_f32(void);
int ds4c_opt_mv_pre(void);
int ds4c_opt_mv_pair(void);
int ds4c_opt_mv_ilp(void);
int ds4c_opt_mv_sumw(void);
int ds4c_opt_mv_two(void);
int ds4c_opt_mv_room(void);
int ds4c_opt_tc_parts(void);
int ds4c_opt_topk_cl(void);
int ds4c_opt_ix_flash_split(void);
int ds4c_opt_topk_cl_tok(void);
int ds4c_opt_topk_wide(void);
int ds4c_opt_mv_exq8(void);
int ds4c_opt_mv_q8_ns(int exact);   // DS4C_OPT_MV_Q8_NS_EX (exact) or _FAST
int ds4c_opt_mv_few_ns(int exact);  // DS4C_OPT_MV_FEW_NS_EX (exact) or _FAST: 2-4 tokens
int ds4c_opt_mv_q8_ctas(int exact); // DS4C_OPT_MV_Q8_CTAS_EX (exact) or _FAST
int ds4c_opt_ix_query(void);
int ds4c_opt_attn_wave(void);
int ds4c_opt_attn_cluster(void);
int ds4c_opt_comp_emit(void);
int ds4c_opt_hc_hoist(void);
int ds4c_opt_mv_dec_late(void);
int ds4c_opt_mv_fast(void);
int ds4c_opt_mv_even(void);
int ds4c_opt_wg_moe(void);
int ds4c_opt_topk_warp(void);
int ds4c_opt_router_warp(void);
int ds4c_opt_attn_ecache(void);
int ds4c_opt_attn_po_vec(void);
int ds4c_opt_seg_comb(void);
int ds4c_opt_mv_occ(void);
int ds4c_opt_ex_timing(void);
int ds4c_opt_attn_order(void);
int ds4c_opt_attn_seg_occ(void);
int ds4c_opt_attn_seg_walk(void);
int ds4c_opt_attn_seg_form(void);
int ds4c_opt_ix_exact(void);
int ds4c_opt_attn_rope(void);
int ds4c_opt_attn_quant(void);

#define DS4C_CHECK(call)                                              \
    do {                                                              \
        cudaError_t e_ = (call);                                      \
        if (e_ != cudaSuccess) return ds4c_cuda_err(e_, #call);       \
    } while (0)

#define DS4C_CHECK_LAUNCH(name)                                       \
    do {                                                              \
        cudaError_t e_ = cudaGetLastError();                          \
        if (e_ != cudaSuccess) return ds4c_cuda_err(e_, name);        \
    } while (0)

#define DS4C_READY()                                                  \
    do {                                                              \
        int r_ = ds4c_ready();                                        \
        if (r_ != 0) return r_;                                       \
    } while (0)

static inline cudaStream_t as_stream(void *s) { return (cudaStream_t)s; }

// Fast mode's indexer scores of a chunk on wgmma (ix_wg.cu, sm_90a;
// DS4C_OPT_IX_FLASH 3): ds4c_ix_wg_ok says whether this device and build
// run it; ds4c_ix_wg_tokens is the tokens a CTA (blockIdx.x); ds4c_ix_wg
// launches it on f16 copies of the rows, nx token groups × ny runs of rblk
// rows (a multiple of 64), the arguments as k_index_flash2's.
bool ds4c_ix_wg_ok(void);
int ds4c_ix_wg_tokens(void);
int ds4c_ix_wg(const float *d_q, const float *d_w, const __half *d_rows, int64_t pos0, int ratio, int n,
               float *d_scores, int64_t sc_stride, int64_t nx, int64_t ny, int64_t rblk, int bulk, cudaStream_t st);
// bulk (DS4C_OPT_IX_FLASH 4): d_rows is the rows' tile image, which
// ds4c_ix_tiles writes (ds4c_ix_tiles_bytes of scratch for R rows).
int64_t ds4c_ix_tiles_bytes(int64_t R);
int ds4c_ix_tiles(const float *d_rows, int64_t R, void *d_img, cudaStream_t st);

// Graph replay (replay.cu): while a recorder records, the work queued on its
// streams is logged through these hooks instead of run. ds4c_rec_any is
// nonzero while any recorder records; ds4c_rec_of returns the recorder of
// stream s, or null.
struct ds4c_rec;
int ds4c_rec_any(void);
ds4c_rec *ds4c_rec_of(cudaStream_t s);
// ds4c_stream_busy: the stream is being recorded (replay.cu) or captured,
// where neither a cuBLAS call nor a stream-ordered allocation may go.
bool ds4c_stream_busy(cudaStream_t s);
void ds4c_rec_kernel(ds4c_rec *r, cudaStream_t s, const void *fn, dim3 grid, dim3 block, size_t smem, int pdl,
                     int nargs, void *const *args, const size_t *sizes);
int ds4c_rec_event(ds4c_rec *r, cudaStream_t s, void *event, int wait);
int ds4c_rec_memset(ds4c_rec *r, cudaStream_t s, void *dst, int value, uint64_t bytes);
int ds4c_rec_memcpy(ds4c_rec *r, cudaStream_t s, void *dst, const void *src, uint64_t bytes, int kind);

// Programmatic dependent launch (Hopper). Every kernel is launched through
// ds4c_launch, which lets the next kernel of the stream (or captured graph)
// be launched before this one completes, and begins with pdl_enter: it
// allows its own dependents to launch at once, then waits until the kernel
// before it has completed and its writes are visible — so a kernel never
// reads data early, while the launch and the filling of the GPU with the
// next kernel's CTAs overlap the end of the previous one. Without the
// launch attribute (or before Hopper) both instructions do nothing.
//
// Kernels with work to do before they may read what the previous kernel
// wrote call the two halves themselves: pdl_launch lets the dependents
// launch, pdl_wait waits for the previous kernel.
static __device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_enter() {
    pdl_launch();
    pdl_wait();
}

// prefetch_l1 brings the line holding p into this SM's L1 (one thread's
// prefetch.global.L1: no register waits on it).
static __device__ __forceinline__ void prefetch_l1(const void *p) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// prefetch_l2 asks the copy engine of the SM to bring bytes at p into L2
// (one thread's instruction; Hopper's bulk prefetch, no-op before). Kernels
// call it on their weights between pdl_launch and pdl_wait: weights are
// never written by the previous kernel, so their first loads need not wait
// for it, and the CTAs placed while the previous kernel drains find their
// weights in L2.
static __device__ __forceinline__ void prefetch_l2(const void *p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDACC_VER_MAJOR__ >= 12
    const uintptr_t a0 = (uintptr_t)p & ~(uintptr_t)15;
    const uintptr_t a1 = ((uintptr_t)p + (uintptr_t)bytes + 15) & ~(uintptr_t)15;
    for (uintptr_t a = a0; a < a1; a += (1u << 20)) {
        const uint32_t n = (uint32_t)min((uintptr_t)(1u << 20), a1 - a);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
    }
#endif
}

// DS4_SMEM_MAX (a build flag for measurement, off in every shipped build):
// every kernel, at its first launch (direct or into a recorded graph), asks
// for the largest shared-memory carveout, so that an SM need not drain to
// change its L1/shared split before a pipelined product's CTAs may join it
// (cuda/NOTES.md v41: wo_a's CTAs then became resident during the attention,
// and decode did not change).
#ifdef DS4_SMEM_MAX
#include <mutex>
#include <unordered_set>
static inline void ds4c_carveout(const void *fn) {
    static std::mutex mu;
    static std::unordered_set<const void *> done;
    std::lock_guard<std::mutex> lock(mu);
    if (!done.insert(fn).second) return;
    (void)cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    (void)cudaGetLastError();
}
#else
static inline void ds4c_carveout(const void *) {}
#endif

// ds4c_launch_as launches kernel k (arguments converted to its parameter
// types) with the programmatic-serialization attribute when early (and the
// PDL option) is set — k may then be launched before the kernel ahead of it
// in the stream completes — or logs it when st is being recorded
// (replay.cu). Launch errors surface through DS4C_CHECK_LAUNCH.
template <typename... KArgs, typename... Args>
static inline void ds4c_launch_as(bool early, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                  cudaStream_t st, Args &&...args) {
    const int pdl = early && ds4c_opt_pdl() ? 1 : 0;
    if (ds4c_rec_any()) {
        if (ds4c_rec *r = ds4c_rec_of(st)) {
            // Logged with its arguments converted to the parameter types,
            // as cudaLaunchKernelEx would pass them.
            [&](KArgs... a) {
                void *p[] = {(void *)&a..., nullptr};
                const size_t sz[] = {sizeof(KArgs)..., 0};
                ds4c_rec_kernel(r, st, (const void *)k, grid, block, smem, pdl, (int)sizeof...(KArgs), p, sz);
            }(static_cast<Args &&>(args)...);
            return;
        }
    }
    ds4c_carveout((const void *)k);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, k, static_cast<Args &&>(args)...);
}

// ds4c_launch is ds4c_launch_as with the early launch (every kernel's
// default).
template <typename... KArgs, typename... Args>
static inline void ds4c_launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                               Args &&...args) {
    ds4c_launch_as(true, k, grid, block, smem, st, static_cast<Args &&>(args)...);
}

#define FULL_MASK 0xffffffffu

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// The operations of every Q8_0 activation block here (ggml's and
// quant.Activation's): from the block's largest magnitude amax, the stored
// scale q8_0_scale(amax) (amax/127 rounded to half), the inverse
// q8_0_inv(amax) = 127/amax (0 for an all-zero block), and each value
// q8_0_round(v, inv) = clamp(round-to-nearest-even(v·inv), −128, 127).
// k_quant_q8_0, k_quant_q8_0_v, hc_pre's fused x and k_attn_po's fused output
// all go through these three, so they cannot drift apart bit-wise.
static __device__ __forceinline__ float q8_0_scale(float amax) { return __half2float(__float2half_rn(amax / 127.f)); }
static __device__ __forceinline__ float q8_0_inv(float amax) { return amax != 0.f ? 127.f / amax : 0.f; }
static __device__ __forceinline__ int q8_0_round(float v, float inv) {
    return max(-128, min(127, __float2int_rn(__fmul_rn(v, inv))));
}

// q8_0_warp quantizes one Q8_0 activation block held by a whole warp (lane i
// has value i): the lane's int8 goes to q[lane], lane 0 writes the block's
// scale to *d (k_quant_q8_0, k_attn_po's fused output). It returns the
// lane's quant and sets *scale to the block's scale on every lane, for a
// caller that also stores them elsewhere (ds4c_chain_q8's flagged words).
static __device__ __forceinline__ int q8_0_warp(float v, int lane, int8_t *q, float *d, float *scale = nullptr) {
    const float amax = warp_max(fabsf(v));
    const int r = q8_0_round(v, q8_0_inv(amax));
    q[lane] = (int8_t)r;
    if (lane == 0) *d = q8_0_scale(amax);
    if (scale) *scale = q8_0_scale(amax);
    return r;
}

// rsqrt(mean(x²) + eps) as the reference: the sum of squares in double, the
// mean rounded to float, eps added in float, the reciprocal square root in
// double rounded to float (model.cu's norms, matvec.cuh's pipe_act_f32).
static __device__ __forceinline__ float rms_from_sumsq(double ss, int64_t n, float eps) {
    float ms = (float)(ss / (double)n);
    return (float)(1.0 / sqrt((double)__fadd_rn(ms, eps)));
}

// rms_scale4: four values of an RMSNorm, w · (x · r) with each product
// rounded (the CPU's order): hc_pre's x and k_mv_f16_norm's activation.
static __device__ __forceinline__ float4 rms_scale4(float4 w, float4 x, float r) {
    return make_float4(__fmul_rn(w.x, __fmul_rn(x.x, r)), __fmul_rn(w.y, __fmul_rn(x.y, r)),
                       __fmul_rn(w.z, __fmul_rn(x.z, r)), __fmul_rn(w.w, __fmul_rn(x.w, r)));
}

// Sum of a double over the block (blockDim.x a multiple of 32, at most 1024):
// a xor-shuffle tree in each warp, then the warp totals in warp order.
static __device__ double block_sum_d(double v) {
    __shared__ double s_d[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();
    if (lane == 0) s_d[warp] = v;
    __syncthreads();
    double s = 0;
    for (int k = 0; k < nw; k++) s += s_d[k];
    return s;
}

// pack8 packs 8 int8 values into two words, value 0 in the lowest byte.
static __device__ __forceinline__ int2 pack8(const int (&q)[8]) {
    int2 r;
    r.x = (q[0] & 255) | (q[1] & 255) << 8 | (q[2] & 255) << 16 | (int)((unsigned)q[3] << 24);
    r.y = (q[4] & 255) | (q[5] & 255) << 8 | (q[6] & 255) << 16 | (int)((unsigned)q[7] << 24);
    return r;
}

// load8 reads 8 floats (16-byte aligned) into v (matvec.cu's quantizers,
// model.cu's k_router).
static __device__ __forceinline__ void load8(const float *p, float (&v)[8]) {
    const float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// q8_k_warp quantizes one 256-value Q8_K block held by a warp (lane i has
// values 8i … 8i + 7 in v) into activation row a (nb blocks), block b:
// quant.Activation.Set's operations (the first index of the largest
// magnitude, its signed value's scale, round to nearest, the 16-value sums).
// k_quant_q8_k_w and model.cu's k_swiglu_q8k call it.
static __device__ __forceinline__ void q8_k_warp(const float (&v)[8], int lane, uint8_t *a, int b, int nb) {
    float av = fabsf(v[0]), mv = v[0];
    int ix = lane * 8;
#pragma unroll
    for (int i = 1; i < 8; i++) {
        if (fabsf(v[i]) > av) { // in index order: ties keep the earlier one
            av = fabsf(v[i]);
            mv = v[i];
            ix = lane * 8 + i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(FULL_MASK, av, o), om = __shfl_xor_sync(FULL_MASK, mv, o);
        const int oi = __shfl_xor_sync(FULL_MASK, ix, o);
        if (oa > av || (oa == av && oi < ix)) {
            av = oa;
            mv = om;
            ix = oi;
        }
    }
    const int64_t cols = (int64_t)nb * 256;
    int q[8];
    float d = 0.f;
    if (av != 0.f) {
        const float iscale = -127.f / mv;
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = max(-128, min(127, __float2int_rn(__fmul_rn(iscale, v[i]))));
        d = 1.f / iscale;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = 0;
    }
    *(int2 *)(a + b * 256 + lane * 8) = pack8(q);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s += q[i];
    s += __shfl_xor_sync(FULL_MASK, s, 1);
    if ((lane & 1) == 0) ((int16_t *)(a + cols + 4 * nb))[b * 16 + (lane >> 1)] = (int16_t)s;
    if (lane == 0) ((float *)(a + cols))[b] = d;
}

// Streaming 16-byte weight loads. flavour 0: the read-only path (__ldg);
// 1: ld.global.nc with L1::no_allocate and a 256-byte L2 prefetch hint;
// 2: ld.global.cs (evict first); WL_GENERIC: a plain load (weights already
// staged in shared memory).
constexpr int WL_GENERIC = 3;
static __device__ __forceinline__ int4 ldw16(const void *p, int flavour) {
    int4 v;
    if (flavour == WL_GENERIC) {
        v = *(const int4 *)p;
    } else if (flavour == 1) {
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.s32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    } else if (flavour == 2) {
        v = __ldcs((const int4 *)p);
    } else {
        v = __ldg((const int4 *)p);
    }
    return v;
}

static __device__ __forceinline__ int4 ld16(const void *p) { return __ldg((const int4 *)p); }

// silu_ref: x · sigmoid(x) through a double-precision exponential (the
// CPU's operations).
static __device__ __forceinline__ float silu_ref(float x) { return (float)((double)x / (1.0 + exp(-(double)x))); }

// swiglu_val: y[r][i] = w_r · (silu(g) · u) with, when lim > 0, u clamped
// to ±lim and g to ≤ lim (w null: no weight). model.cu's SwiGLU kernels and
// k_mv_dec's activation prologue (matvec.cuh) share it.
static __device__ __forceinline__ float swiglu_val(float gv, float uv, float lim, const float *w, int64_t row) {
    if (lim > 0.f) {
        uv = fminf(fmaxf(uv, -lim), lim);
        gv = fminf(gv, lim);
    }
    float v = __fmul_rn(silu_ref(gv), uv);
    if (w) v = __fmul_rn(w[row], v);
    return v;
}

// Ampere-style asynchronous copies global → shared, 16 bytes a thread:
// issued, committed as a group per thread, and waited for until at most N
// of the thread's groups are still in flight (then __syncthreads makes
// every thread's copies visible to all).
static __device__ __forceinline__ void cp_async16(void *smem, const void *g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
#endif
}
static __device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
// 8- and 4-byte copies (through L1: .ca is the only form for these sizes).
static __device__ __forceinline__ void cp_async8(void *smem, const void *g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(g) : "memory");
#endif
}
static __device__ __forceinline__ void cp_async4(void *smem, const void *g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(g) : "memory");
#endif
}
// cp_async16 with the hint that L2 fetch the whole 256-byte block around g.
static __device__ __forceinline__ void cp_async16_l2(void *smem, const void *g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
#endif
}

// Hopper bulk copies (the TMA unit) global → shared, completing on an
// mbarrier in shared memory: bar_init once (count 1, then a fence and a
// __syncthreads), bar_expect by the issuing thread with the bytes to come,
// bulk_copy (16-byte aligned addresses, a multiple of 16 bytes), and
// bar_wait(parity) by the consumers (the n-th completion of the barrier has
// parity n & 1). BULK_COPY says whether this compiler can emit them (PTX 8.0).
#if __CUDACC_VER_MAJOR__ >= 12
#define BULK_COPY 1
#else
#define BULK_COPY 0
#endif
static __device__ __forceinline__ void bar_init(uint64_t *bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && BULK_COPY
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
static __device__ __forceinline__ void bar_expect(uint64_t *bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && BULK_COPY
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(b),
                 "r"(bytes)
                 : "memory");
#endif
}
static __device__ __forceinline__ void bulk_copy(void *smem, const void *g, unsigned bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && BULK_COPY
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem), b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(s),
                 "l"(g), "r"(bytes), "r"(b)
                 : "memory");
#endif
}
// bulk_fence orders this thread's earlier generic accesses to shared memory
// before its later bulk copies into it (a stage read, then refilled).
static __device__ __forceinline__ void bulk_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && BULK_COPY
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
static __device__ __forceinline__ void bar_wait(uint64_t *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    unsigned done = 0;
    while (!done)
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
#endif
}

// tf32_split writes x as hi + lo for TF32 mma operands: hi is x rounded to
// TF32's 10 stored significand bits (to nearest, ties away: add half a TF32
// ulp, clear the 13 low bits), lo = x − hi exactly (|lo| ≤ 2^-11·|x|), whose
// 13 low bits the mma ignores (≤ 2^-21·|x| lost): hi + lo keeps ≈ 21 of x's
// 24 significand bits. Two integer operations and a subtraction, where
// cvt.rna.tf32.f32 is an emulated sequence on sm_90 (ncu: FSETP, IMAD,
// LOP3, VIADD and SEL were half of the attention kernels' instructions).
// Finite x below FLT_MAX·(1 − 2^-11) only.
static __device__ __forceinline__ void tf32_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}

// mma_tf32: c += A·B for one 16×8×8 TF32 tile (mma.sync m16n8k8, float32
// accumulators; fragments as the PTX ISA lays them out).
static __device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// half_sat: x before its rounding to f16, finite magnitudes beyond 65504
// saturated to 65504 (rounding alone would make them infinite); infinities
// and NaNs stay.
static __device__ __forceinline__ float half_sat(float x) {
    const float a = fabsf(x);
    return a > 65504.f && a != INFINITY ? copysignf(65504.f, x) : x;
}

// swiglu_fast is fast mode's SwiGLU of one value pair: silu(g)·u in float
// with the fast exponential, u clamped to ±lim and g to ≤ lim when lim > 0
// (k_swiglu_half and the fused gate/up product's epilogue).
static __device__ __forceinline__ float swiglu_fast(float g, float u, float lim) {
    if (lim > 0.f) {
        u = fminf(fmaxf(u, -lim), lim);
        g = fminf(g, lim);
    }
    return g / (1.f + __expf(-g)) * u;
}

// swiglu_as: swiglu_val, or with fast set fast mode's value (swiglu_fast
// times the row's weight): k_swiglu_q8k's and k_mv_dec's activation
// prologue's (matvec.cuh mv_glu_act) one choice.
static __device__ __forceinline__ float swiglu_as(bool fast, float gv, float uv, float lim, const float *w, int64_t row) {
    if (!fast) return swiglu_val(gv, uv, lim, w, row);
    const float v = swiglu_fast(gv, uv, lim);
    return w ? v * w[row] : v;
}

// perm32_pos: the position under DS4C_HALF_PERM32 of value v (< 32) of a
// 32-value block: value 8q + 4s + 2h + e sits at 16s + 8h + 2q + e.
static __device__ __forceinline__ int perm32_pos(int v) {
    return 16 * ((v >> 2) & 1) + 8 * ((v >> 1) & 1) + 2 * (v >> 3) + (v & 1);
}

// perm32_at: under DS4C_HALF_PERM32 (ds4c_to_half_ex), the offset within a
// row of the pair of values that word k (of 4) of output chunk c (8 halves)
// holds: chunk c is block c/4's m = c%4, and its word k holds values
// 8k + 2m and 8k + 2m + 1 of the block (position 16s + 8h + 2q + e holds
// value 8q + 4s + 2h + e).
static __device__ __forceinline__ int64_t perm32_at(int64_t c, int k) { return 32 * (c >> 2) + 8 * k + 2 * (c & 3); }

// half4_bits: four floats rounded to f16 (half_sat first), as the 8 bytes
// of their f16 values in order.
static __device__ __forceinline__ uint2 half4_bits(float4 v) {
    const __half2 a = __floats2half2_rn(half_sat(v.x), half_sat(v.y));
    const __half2 b = __floats2half2_rn(half_sat(v.z), half_sat(v.w));
    return make_uint2(*(const uint32_t *)&a, *(const uint32_t *)&b);
}

// mma_f16: c += A·B for one 16×8×16 tile of f16 operands with float32
// accumulators (mma.sync m16n8k16; fragments as the PTX ISA lays them out).
static __device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldsm_x4 loads four 8×8 matrices of 16-bit values from shared memory
// (ldmatrix .x4): lanes 8i … 8i+7 give the 16-byte row addresses of matrix
// i, and r[i] receives this lane's two values of it (row lane/4, columns
// 2·(lane%4) and +1). TRANS: each matrix transposed (row 2·(lane%4) and +1,
// column lane/4). The "memory" clobber keeps the loads after the barrier
// that published the rows.
template <bool TRANS>
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s)
                     : "memory");
}
