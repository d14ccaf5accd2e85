// model.cu: the DeepSeek V4 forward-pass operations of libds4cuda.so other
// than the matrix products (matvec.cu): embedding rows, hyper-connections,
// RMSNorm, RoPE, the FP8/FP4/Hadamard simulations, the compressors, the
// indexer's scores, top-k selection, attention with sinks, the router, SwiGLU
// and the MoE sum.
//
// Correctness first: every kernel mirrors the reference backend
// (backend/cpu) operation by operation, in float32 with the same roundings
// (explicit __fmul_rn/__fadd_rn where the CPU rounds a product before an
// addition, transcendental functions in double rounded once to float, the
// same summation orders where a loop is sequential there), so most results
// are bit-identical to the CPU's given identical inputs; only double-precision
// sums of squares are reduced in a different order (then rounded to float).
// Speed comes later (cuda/NOTES.md).
#include <math.h>
#include <stdio.h>

#include <cooperative_groups.h>

#include "common.cuh"
#include "attn.cuh"

namespace cg = cooperative_groups;

namespace {

// ------------------------------------------------------------ scalar math
__device__ __forceinline__ float sigmoid_ref(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }
__device__ __forceinline__ float softplus_ref(float x) { return x > 20.f ? x : (float)log1p(exp((double)x)); }
__device__ __forceinline__ float exp_ref(float x) { return (float)exp((double)x); }
__device__ __forceinline__ float fmax_go(float a, float b) { return a > b ? a : b; }

// ------------------------------------------------------------ embedding rows
__device__ __forceinline__ float load_elem(int type, const uint8_t *w, int64_t R, int64_t cols, int64_t row, int64_t c) {
    switch (type) {
    case DS4C_F32: return ((const float *)w)[row * cols + c];
    case DS4C_F16: return __half2float(((const __half *)w)[row * cols + c]);
    case DS4C_BF16: return __uint_as_float((uint32_t)((const uint16_t *)w)[row * cols + c] << 16);
    case DS4C_Q8_0: {
        const int8_t q = ((const int8_t *)w)[row * cols + c];
        const float d = __half2float(((const __half *)(w + R * cols))[(row * cols + c) / 32]);
        return fmul((float)q, d);
    }
    }
    return 0.f;
}

__global__ void k_get_rows(int type, const uint8_t *w, int64_t R, int64_t cols, const int32_t *ids, float *dst,
                           int64_t dst_stride, int copies, int64_t copy_stride) {
    pdl_enter();
    const int i = blockIdx.y;
    const int64_t row = ids[i];
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x) {
        float v = (row >= 0 && row < R) ? load_elem(type, w, R, cols, row, c) : __int_as_float(0x7fc00000);
        for (int k = 0; k < copies; k++) dst[i * dst_stride + k * copy_stride + c] = v;
    }
}

// ------------------------------------------------------------ min-p candidates
// A sampled step's candidates under min-p (engine.Candidates): every id
// whose logit v passes cand_keep — v ≥ thr, a threshold a margin below the
// host's cut lt + T·ln(min_p) − 1e-3 (engine.Sampler: its float32 cut is at
// least that, so these are a superset of the host's prefilter) — and the
// greedy choice top, in id order. k_cand_count counts each CTA's range;
// k_cand_write places each range's ids at the sum of the ranges before it.
constexpr int CAND_T = 256;

__device__ __forceinline__ float cand_threshold(float lt, float temp, float min_p) {
    if (!(lt > -INFINITY)) return INFINITY; // no logit above −inf: only top
    double cut = (double)lt + (double)temp * log((double)min_p) - 1e-3;
    cut -= 1e-4 + 1e-6 * fabs(cut);
    return __double2float_rd(cut);
}

__device__ __forceinline__ bool cand_keep(float v, float thr, int64_t i, int32_t top) {
    return (v >= thr && v > -INFINITY) || i == (int64_t)top;
}

__global__ void __launch_bounds__(CAND_T) k_cand_count(const float *x, int64_t n, const int32_t *top, float temp,
                                                      float min_p, int64_t per, int32_t *counts) {
    pdl_enter();
    const int64_t lo = (int64_t)blockIdx.x * per, hi = min(n, lo + per);
    const int32_t tp = *top;
    const float thr = cand_threshold(x[tp], temp, min_p);
    int c = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += CAND_T) c += cand_keep(x[i], thr, i, tp) ? 1 : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(FULL_MASK, c, o);
    __shared__ int s_c[CAND_T / 32];
    if ((threadIdx.x & 31) == 0) s_c[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int w = 0; w < CAND_T / 32; w++) t += s_c[w];
        counts[blockIdx.x] = t;
    }
}

// out: [0] the candidates (all of them, even past cap), [1] top, [2] top's
// logit (bits), [3] 0; then cap ids, then cap logits.
__global__ void __launch_bounds__(CAND_T) k_cand_write(const float *x, int64_t n, const int32_t *top, float temp,
                                                      float min_p, int64_t per, const int32_t *counts, int32_t *out,
                                                      int cap) {
    pdl_enter();
    __shared__ int s_off, s_w[CAND_T / 32];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int32_t tp = *top;
    const float lt = x[tp];
    if (tid == 0) {
        int o = 0;
        for (int b = 0; b < (int)blockIdx.x; b++) o += counts[b];
        s_off = o;
        if (blockIdx.x == 0) {
            int total = 0;
            for (int b = 0; b < (int)gridDim.x; b++) total += counts[b];
            out[0] = total, out[1] = tp, out[2] = __float_as_int(lt), out[3] = 0;
        }
    }
    __syncthreads();
    int off = s_off;
    const float thr = cand_threshold(lt, temp, min_p);
    int32_t *ids = out + 4;
    float *vals = (float *)(out + 4 + cap);
    const int64_t lo = (int64_t)blockIdx.x * per, hi = min(n, lo + per);
    for (int64_t base = lo; base < hi; base += CAND_T) {
        const int64_t i = base + tid;
        const float v = i < hi ? x[i] : 0.f;
        const bool keep = i < hi && cand_keep(v, thr, i, tp);
        const unsigned m = __ballot_sync(FULL_MASK, keep);
        if (lane == 0) s_w[w] = __popc(m);
        __syncthreads();
        int before = 0, total = 0;
#pragma unroll
        for (int k = 0; k < CAND_T / 32; k++) {
            const int c = s_w[k];
            before += k < w ? c : 0;
            total += c;
        }
        if (keep) {
            const int pos = off + before + __popc(m & ((1u << lane) - 1u));
            if (pos < cap) ids[pos] = (int32_t)i, vals[pos] = v;
        }
        off += total;
        __syncthreads(); // (s_w is the next tile's)
    }
}

// ------------------------------------------------------------ host tokens
// k_wait_token: one thread polls the host's word (mapped pinned memory, read
// over the bus each time: volatile, never cached) until its high half is seq,
// and writes the low half to *out. The dependents may launch at once: they
// wait for this kernel's completion and writes before reading (pdl_wait).
__global__ void k_wait_token(const unsigned long long *word, unsigned *flag, unsigned seq, long long timeout_ns,
                             int32_t *out) {
    pdl_launch();
    pdl_wait();
    unsigned long long t0, t, v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
        if ((unsigned)(v >> 32) == seq) break;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if ((long long)(t - t0) > timeout_ns) {
            v = 0; // token 0 (any id in range: the step's work is discarded)
            *(volatile unsigned *)flag = seq;
            break;
        }
        __nanosleep(256);
    }
    *out = (int32_t)(uint32_t)v;
}

// ------------------------------------------------------------ greedy argmax
// argmax_key orders a logit and its id as engine.Greedy does: the larger
// value first, the lower id on ties, −0 equal to +0, and NaN (key 0) below
// everything, so never chosen unless every value is NaN.
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i) {
    if (v != v) return 0ull;
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) == 0) u = 0;
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (0xffffffffu - (uint32_t)i);
}

__device__ __forceinline__ unsigned long long max_u64(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

constexpr int AM_T = 256;

// k_argmax: each CTA's best key goes into work[0] (atomicMax); the CTA that
// counts last in work[1] writes the id to *out and leaves both words zero
// for the next launch (a graph replays it as it is).
__global__ void __launch_bounds__(AM_T) k_argmax(const float *x, int64_t n, unsigned long long *work, int32_t *out) {
    pdl_enter();
    unsigned long long k = 0;
    const int64_t step = (int64_t)gridDim.x * AM_T, first = (int64_t)blockIdx.x * AM_T + threadIdx.x;
    int64_t tail = 0;
    if ((((uintptr_t)x) & 15) == 0) {
        const int64_t n4 = n / 4;
        const float4 *x4 = (const float4 *)x;
#pragma unroll 4
        for (int64_t g = first; g < n4; g += step) {
            const float4 v = x4[g];
            k = max_u64(k, argmax_key(v.x, 4 * g));
            k = max_u64(k, argmax_key(v.y, 4 * g + 1));
            k = max_u64(k, argmax_key(v.z, 4 * g + 2));
            k = max_u64(k, argmax_key(v.w, 4 * g + 3));
        }
        tail = 4 * n4;
    }
    for (int64_t i = tail + first; i < n; i += step) k = max_u64(k, argmax_key(x[i], i));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) k = max_u64(k, __shfl_xor_sync(0xffffffffu, k, o));
    __shared__ unsigned long long s_k[AM_T / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) s_k[warp] = k;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < AM_T / 32; w++) k = max_u64(k, s_k[w]);
    atomicMax(&work[0], k);
    __threadfence();
    const unsigned long long ticket = atomicAdd(&work[1], 1ull);
    if (ticket != gridDim.x - 1) return;
    const unsigned long long best = atomicExch(&work[0], 0ull);
    work[1] = 0;
    *out = best ? (int32_t)(0xffffffffu - (uint32_t)best) : 0;
}

// ------------------------------------------------------------ RMSNorm rows
// y = w ⊙ (x · r) (w null: x · r), rows of n values.
__global__ void k_rmsnorm_ref(const float *x, int64_t x_stride, const float *w, float *y, int64_t y_stride, int64_t n,
                              float eps) {
    pdl_enter();
    const float *xr = x + blockIdx.x * x_stride;
    float *yr = y + blockIdx.x * y_stride;
    // a thread's values NB at a time, their loads in flight together (a
    // plain loop waited for each one's L2 round trip in turn, n / 256 of
    // them: 16 for the MTP block's 4096-wide norms, even unrolled); the same
    // sums in the same order, each value scaled by the thread that read it
    // (y may be x)
    constexpr int NB = 4;
    const int64_t step = blockDim.x;
    double ss = 0;
    for (int64_t i0 = threadIdx.x; i0 < n; i0 += NB * step) {
        float v[NB];
#pragma unroll
        for (int u = 0; u < NB; u++) v[u] = i0 + u * step < n ? xr[i0 + u * step] : 0.f;
#pragma unroll
        for (int u = 0; u < NB; u++)
            if (i0 + u * step < n) ss += (double)v[u] * (double)v[u];
    }
    ss = block_sum_d(ss);
    const float r = rms_from_sumsq(ss, n, eps);
    for (int64_t i0 = threadIdx.x; i0 < n; i0 += NB * step) {
        float v[NB], wv[NB];
#pragma unroll
        for (int u = 0; u < NB; u++) {
            const int64_t i = i0 + u * step;
            v[u] = i < n ? xr[i] : 0.f;
            wv[u] = w && i < n ? w[i] : 1.f;
        }
#pragma unroll
        for (int u = 0; u < NB; u++) {
            const int64_t i = i0 + u * step;
            if (i < n) {
                const float x = fmul(v[u], r);
                yr[i] = w ? fmul(wv[u], x) : x;
            }
        }
    }
}

// ------------------------------------------------------------ hyper-connections
// The Sinkhorn normalisation of one token's comb logits (s_comb, then
// stored), one thread per value (hc² threads). Every value goes through exactly the
// reference's operations in its order: a row or column sum is computed by
// each thread of that row/column, sequentially in index order, from shared
// memory, so the result is bit-identical to the serial loop. All threads of
// the block run it (hc² ≤ blockDim).
__device__ void hc_split(const float *m, const float *scale, const float *base, int hc, int iters, float hc_eps,
                         float *s_comb, float *comb_out) {
    const int tid = threadIdx.x, nn = hc * hc;
    const int j = tid / hc, k = tid - (tid / hc) * hc;
    auto sync = [] { __syncthreads(); };
    if (tid < nn) s_comb[tid] = fadd(fmul(m[2 * hc + tid], scale[2]), base[2 * hc + tid]);
    sync();
    float v = 0.f;
    if (tid < nn) { // row softmax: max, then exp
        float mx = 0.f;
        for (int q = 0; q < hc; q++) {
            const float r = s_comb[j * hc + q];
            if (q == 0 || r > mx) mx = r;
        }
        v = exp_ref(fsub(s_comb[tid], mx));
    }
    sync();
    if (tid < nn) s_comb[tid] = v;
    sync();
    if (tid < nn) {
        float sum = 0.f;
        for (int q = 0; q < hc; q++) sum = fadd(sum, s_comb[j * hc + q]);
        v = fadd(__fdiv_rn(s_comb[tid], sum), hc_eps);
    }
    sync();
    if (tid < nn) s_comb[tid] = v;
    sync();
    // iterations: rows (except the first), then columns, each divided by its sum + eps
    for (int step = 1; step < 2 * iters; step++) {
        const bool rows = (step & 1) == 0;
        if (tid < nn) {
            float sum = 0.f;
            for (int q = 0; q < hc; q++) sum = fadd(sum, s_comb[rows ? j * hc + q : q * hc + k]);
            v = __fdiv_rn(s_comb[tid], fadd(sum, hc_eps));
        }
        sync();
        if (tid < nn) s_comb[tid] = v;
        sync();
    }
    if (tid < nn) comb_out[tid] = s_comb[tid];
}

// The same split for hc² ≤ 32 in warp 0's registers: lane j·hc+k holds
// comb[j][k]; a row or column sum gathers its values by shuffles in index
// order and adds them as the serial loop does (no shared memory, no
// barriers: the latency-bound critical path of hc_pre in decode). sc2 is
// scale[2], bl the lane's base[2·hc + lane] (the caller may load them
// before its wait for the previous kernel).
template <int HC>
__device__ void hc_split_warp(const float *m, float sc2, float bl, int hc_rt, int iters, float hc_eps,
                              float *comb_out) {
    const int hc = HC ? HC : hc_rt; // HC > 0: the loops below unroll
    const int lane = threadIdx.x & 31, nn = hc * hc;
    const bool on = lane < nn;
    const int j = on ? lane / hc : 0, k = on ? lane - (lane / hc) * hc : 0;
    float v = on ? fadd(fmul(m[2 * hc + lane], sc2), bl) : 0.f;
    float mx = 0.f; // row softmax: max, exp, sum, then + eps
#pragma unroll
    for (int q = 0; q < hc; q++) {
        const float r = __shfl_sync(FULL_MASK, v, j * hc + q);
        if (q == 0 || r > mx) mx = r;
    }
    v = on ? exp_ref(fsub(v, mx)) : 0.f;
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < hc; q++) sum = fadd(sum, __shfl_sync(FULL_MASK, v, j * hc + q));
    v = on ? fadd(__fdiv_rn(v, sum), hc_eps) : 0.f;
    // iterations: rows (except the first), then columns, each divided by its sum + eps
    for (int step = 1; step < 2 * iters; step++) {
        const bool rows = (step & 1) == 0;
        float s2 = 0.f;
#pragma unroll
        for (int q = 0; q < hc; q++) s2 = fadd(s2, __shfl_sync(FULL_MASK, v, rows ? j * hc + q : q * hc + k));
        v = on ? __fdiv_rn(v, fadd(s2, hc_eps)) : 0.f;
    }
    if (on) comb_out[lane] = v;
}

// hc_x_q8_0 stores float4 group g of x (o) into x's Q8_0 activation row qa
// (D values, then their scales) with k_quant_q8_0's operations: block g/8
// is 8 adjacent lanes, which must be active together (D % 32 == 0).
__device__ __forceinline__ void hc_x_q8_0(const float4 &o, int64_t g, uint8_t *qa, int64_t D) {
    const unsigned lanes = __activemask();
    float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
    amax = fmaxf(amax, __shfl_xor_sync(lanes, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(lanes, amax, 2));
    amax = fmaxf(amax, __shfl_xor_sync(lanes, amax, 4));
    const float id = q8_0_inv(amax);
    const float ov[4] = {o.x, o.y, o.z, o.w};
    uint32_t packed = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) packed |= (uint32_t)(uint8_t)(int8_t)q8_0_round(ov[e], id) << (8 * e);
    ((uint32_t *)qa)[g] = packed;
    if ((g & 7) == 0) ((float *)(qa + D))[g / 8] = q8_0_scale(amax);
}

// hc_sumsq: the sum of squares of the hc·D stream values of one token at hr
// (nh of them), by the whole CTA (float4 loads when vec: nh % 4 == 0 and hr
// 16-byte aligned), reduced by block_sum_d.
__device__ double hc_sumsq(const float *hr, int64_t nh, bool vec) {
    double ss = 0;
    if (vec) {
        const float4 *h4 = (const float4 *)hr;
#pragma unroll 8
        for (int64_t i = threadIdx.x; i < nh / 4; i += blockDim.x) {
            const float4 v = h4[i];
            ss += (double)v.x * (double)v.x;
            ss += (double)v.y * (double)v.y;
            ss += (double)v.z * (double)v.z;
            ss += (double)v.w * (double)v.w;
        }
    } else {
#pragma unroll 8
        for (int64_t i = threadIdx.x; i < nh; i += blockDim.x) ss += (double)hr[i] * (double)hr[i];
    }
    return block_sum_d(ss);
}

// DS4_PHASE_PROBE (a build flag for measurement, off in every shipped
// build): thread 0 of CTA 0 of k_hc_pre (site 0; its x-forming CTA),
// k_router (site 1) and k_attn_split_cl (site 2: the first split of each
// head group) stamps clock64 at its phases (PHASE_MARK(i), i < 12) and
// adds the deltas between consecutive marks to device sums; every 4096th
// call of a site prints the running means (cycles from the previous mark
// set, to marks 1 … 11; 11 is the end) and the ns a cycle (%globaltimer
// over the same span). cuda/NOTES.md v34 and v37 read them. Exact mode's
// single-token attention too (CTA (0, 0, 0) of each): k_attn_scores<1>
// (site 3 for 512 keys or more, a ratio-4 layer; 4 fewer) and
// k_attn_po<false> (5 and 6), with PHASE_SYNC barriers between their
// phases so that a mark is the CTA's, not thread 0's (cuda/NOTES.md v61),
// and k_attn_po_cl (7 and 8: its statistics' steps marked too, v64).
#ifdef DS4_PHASE_PROBE
__device__ unsigned long long g_phase_sum[9][12], g_phase_n[9], g_phase_ns[9], g_phase_cyc[9];
#define PHASE_SYNC() __syncthreads()
static __shared__ long long s_phase[12];
static __shared__ unsigned long long s_phase_gt;
#define PHASE_ON (threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.x == 0)
#define PHASE_MARK(i)                                                                                                  \
    do {                                                                                                               \
        if (PHASE_ON) s_phase[i] = clock64();                                                                          \
    } while (0)
__device__ __forceinline__ unsigned long long phase_gt() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ void phase_begin() {
    if (PHASE_ON) {
        for (int i = 0; i < 12; i++) s_phase[i] = 0;
        s_phase[0] = clock64();
        s_phase_gt = phase_gt();
    }
}
// phase_record adds one call's marks to site's sums and prints their means
// every `every` calls: m[0] the start, m[11] the end, m[1 … 10] the marks
// set (0: not set; a mark's cycles are those since the mark set before it).
__device__ void phase_record(int site, const long long (&m)[12], unsigned long long gt, unsigned long long every) {
    long long prev = m[0];
    for (int i = 1; i < 12; i++) {
        if (m[i] == 0) continue;
        atomicAdd(&g_phase_sum[site][i], (unsigned long long)(m[i] - prev));
        prev = m[i];
    }
    atomicAdd(&g_phase_ns[site], gt);
    atomicAdd(&g_phase_cyc[site], (unsigned long long)(m[11] - m[0]));
    const unsigned long long n = atomicAdd(&g_phase_n[site], 1ull) + 1;
    if (n % every == 0) {
        const double k = 1.0 / (double)n;
        const unsigned long long *q = g_phase_sum[site];
        printf("phase probe site %d n=%llu cycles to marks 1-11: %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f; "
               "ns/cycle %.4f\n",
               site, n, q[1] * k, q[2] * k, q[3] * k, q[4] * k, q[5] * k, q[6] * k, q[7] * k, q[8] * k, q[9] * k,
               q[10] * k, q[11] * k, (double)g_phase_ns[site] / (double)g_phase_cyc[site]);
    }
}
__device__ void phase_end(int site) {
    if (!PHASE_ON) return;
    s_phase[11] = clock64();
    phase_record(site, s_phase, phase_gt() - s_phase_gt, 4096);
}
// The attention kernels keep their marks in registers (apm_: constant
// indices), not in s_phase: k_attn_po's static shared memory is at the
// 48 KiB limit already. Marks 1 … 9 (those a kernel sets), then the end
// (11), recorded as phase_end's.
#define APM_BEGIN()                                                                                                    \
    unsigned long long apm_[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};                                                     \
    apm_[0] = clock64();                                                                                               \
    const unsigned long long apm_gt = phase_gt()
#define APM(i) (apm_[i] = clock64())
#define APM_END(site) attn_probe_end(site, apm_, apm_gt)
__device__ void attn_probe_end(int site, const unsigned long long (&m)[10], unsigned long long gt0) {
    if (threadIdx.x != 0 || blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) return;
    long long r[12] = {}; // mark 10 unused, 11 the end
    for (int i = 0; i < 10; i++) r[i] = (long long)m[i];
    r[11] = clock64();
    phase_record(site, r, phase_gt() - gt0, 2048);
}
#else
#define PHASE_MARK(i) ((void)0)
#define PHASE_SYNC() ((void)0)
#define APM_BEGIN() ((void)0)
#define APM(i) ((void)0)
#define APM_END(site) ((void)0)
__device__ __forceinline__ void phase_begin() {}
__device__ __forceinline__ void phase_end(int) {}
#endif

// hc_pre_mix is the opening k_hc_pre and k_hc_pre_chunk share: the PDL wait
// and, when raw (mode bit 1: raw mixing logits), the streams' sum of
// squares — before the wait when early (bit 2: the streams are complete at
// launch) — and the M logits at m scaled by rsqrt(mean(h²) + eps) into
// s_mix. It returns the logits to read (m itself unless raw); every thread
// calls it (waited: the caller has waited already, so it does not wait again).
// ex (with parts): m holds k_hc_post_mix_ex's [M][256] running sums, then
// parts doubles of squares; a warp a row completes the sums' tree (lane l
// the sums 8l … 8l + 7: three levels in the lane, then xor-shuffles 1 … 16
// pair the adjacent subtrees, a + b == b + a), quant's float-weight order.
__device__ const float *hc_pre_mix(bool raw, bool early, const float *m, int M, const float *hr, int64_t nh, bool vec,
                                   float norm_eps, float *s_mix, int parts = 0, bool waited = false, bool ex = false) {
    if (parts > 0 && ex) {
        if (!waited) pdl_wait();
        const int lane = threadIdx.x & 31, nw = (int)(blockDim.x >> 5);
        for (int r = (int)(threadIdx.x >> 5); r < M; r += nw) {
            const float4 a = *(const float4 *)(m + (int64_t)r * 256 + 8 * lane);
            const float4 b = *(const float4 *)(m + (int64_t)r * 256 + 8 * lane + 4);
            float v = fadd(fadd(fadd(a.x, a.y), fadd(a.z, a.w)), fadd(fadd(b.x, b.y), fadd(b.z, b.w)));
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) v = fadd(v, __shfl_xor_sync(FULL_MASK, v, o));
            if (lane == 0) s_mix[r] = v;
        }
        const double *sq = (const double *)(m + (int64_t)M * 256);
        double ss = 0;
        for (int p = threadIdx.x; p < parts; p += blockDim.x) ss += sq[p];
        ss = block_sum_d(ss); // (its barriers also publish s_mix)
        const float r = rms_from_sumsq(ss, nh, norm_eps);
        __syncthreads();
        for (int i = threadIdx.x; i < M; i += blockDim.x) s_mix[i] = fmul(s_mix[i], r);
        __syncthreads();
        return s_mix;
    }
    if (parts > 0) { // m: k_hc_post_mix's parts [parts][M + 1]
        if (!waited) pdl_wait();
        PHASE_MARK(3);
        // a warp a value, two at a time (values i and i + nw: Flash's 25
        // values in one round of 16 warps): its lanes load the parts of
        // both at once, then a fixed shuffle tree each (a loop of dependent
        // loads cost ≈ 5 µs; a second round of loads, ≈ one L2 latency)
        const int lane = threadIdx.x & 31, nw = (int)(blockDim.x >> 5);
        for (int i = (int)(threadIdx.x >> 5); i <= M; i += 2 * nw) {
            const int i2 = i + nw;
            const bool pair = i2 <= M;
            float v = 0.f, v2 = 0.f;
#pragma unroll 4
            for (int p = lane; p < parts; p += 32) {
                v += m[p * (M + 1) + i];
                if (pair) v2 += m[p * (M + 1) + i2];
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                v += __shfl_xor_sync(FULL_MASK, v, o);
                v2 += __shfl_xor_sync(FULL_MASK, v2, o);
            }
            if (lane == 0) {
                s_mix[i] = v;
                if (pair) s_mix[i2] = v2;
            }
        }
        __syncthreads();
        PHASE_MARK(4);
        const float r = rms_from_sumsq((double)s_mix[M], nh, norm_eps);
        PHASE_MARK(5);
        __syncthreads();
        for (int i = threadIdx.x; i < M; i += blockDim.x) s_mix[i] = fmul(s_mix[i], r);
        __syncthreads();
        PHASE_MARK(6);
        return s_mix;
    }
    double hss = 0;
    if (early) hss = hc_sumsq(hr, nh, vec);
    pdl_wait();
    if (!raw) return m;
    const double ss = early ? hss : hc_sumsq(hr, nh, vec);
    const float r = rms_from_sumsq(ss, nh, norm_eps);
    for (int i = threadIdx.x; i < M; i += blockDim.x) s_mix[i] = fmul(m[i], r);
    __syncthreads();
    return s_mix;
}

// One token per CTA. mode bit 0 clear (hc_pre): Sinkhorn split of the
// mixing logits into pre, post and comb (post/comb stored for hc_post); set
// (head): pre_j = sigmoid(m_j·scale + base_j) + eps only. Then x = Σ_j
// pre_j·h_j and x = normw ⊙ (x·rms(x)). Mode bit 1: the mixing logits are
// raw products fn·flat(h) and are first scaled by rsqrt(mean(h²) + norm_eps)
// here (M ≤ 288). Mode bit 2 (with bit 1): h is complete when the kernel
// launches (the product of the mixing logits was queued with DS4C_MM_LATE),
// so its sum of squares is taken before the wait for that product.
// G: the float4 groups of the streams a thread forms (the vector path: D/4
// ≤ G·(threads − x0)). H: with k_hc_post_mix's parts (mode bits 16+), the
// x-forming CTA issues its stream loads right after the wait, so that they
// are in flight while the parts are added and the gates computed (G = 2:
// the loads' 32 registers fit the 128 of a 512-thread CTA; DS4C_OPT_HC_HOIST).
// The gates' scales and biases and (vector path) the norm weights are
// loaded before the wait: the kernels before do not write them, and after
// it each was a round trip of its own on the chain.
template <int HC, int G = 4, bool H = false> // HC > 0: compiled for hc == HC (the loops over streams unroll); 0: any hc
__global__ void __launch_bounds__(512) k_hc_pre(int mode, const float *mix, int M, const float *scale, const float *base, int hc_rt, int iters,
                         float hc_eps, const float *h, int64_t D, const float *normw, float norm_eps, float *x,
                         float *post_out, float *comb_out, uint8_t *xq, int64_t xq_stride) {
    phase_begin();
    pdl_launch();
    const int parts = mode >> 16; // the logits are k_hc_post_mix's parts
    const bool pex = parts > 0 && (mode & 16) != 0; // … k_hc_post_mix_ex's
    const bool early = (mode & 6) == 6;
    mode &= 3;
    const int hc = HC ? HC : hc_rt;
    __shared__ float s_pre[16], s_comb[256], s_mix[289];
    const int t = blockIdx.x;
    const int tid = threadIdx.x, nn = hc * hc;
    // (parts: token t's are [parts][M + 1] after the tokens' before it)
    const float *m =
        mix + (int64_t)t * (pex ? (int64_t)M * 256 + 2 * parts : parts > 0 ? (int64_t)parts * (M + 1) : M);
    // HC > 0 and D a multiple of 4 that the threads cover in at most
    // HP_G float4 groups each: the streams are read as float4 (every load of
    // a thread in flight at once) and x stays in registers
    constexpr int HP_G = G;
    // hc_pre with two CTAs per token (blockIdx.y): CTA 1 runs the split
    // (post, comb), CTA 0 forms x; else CTA 0 does both, the split in warp 0
    // while the other warps form x (one warp: hc² ≤ 32) or before x
    const bool two = (mode & 1) == 0 && gridDim.y == 2;
    const int x0 = !two && (mode & 1) == 0 && nn <= 32 && blockDim.x > 32 ? 32 : 0; // warp 0 runs the split
    const bool vec = HC > 0 && D % 4 == 0 && D / 4 <= (int64_t)HP_G * (blockDim.x - x0);
    const float *ht = h + (int64_t)t * hc * D;
    constexpr int NS = HC > 0 ? HC : 1;
    float4 hv[HP_G][NS]; // the vector path's stream values
    const int64_t ng = D / 4, step = blockDim.x - x0, g0 = (int64_t)tid - x0;
    auto load_streams = [&]() {
#pragma unroll
        for (int i = 0; i < HP_G; i++) {
            const int64_t g = g0 + i * step;
#pragma unroll
            for (int j = 0; j < NS; j++)
                hv[i][j] = g0 >= 0 && g < ng ? ((const float4 *)(ht + j * D))[g] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    // the weights this CTA reads (scale: 1 value for the head, 3 else;
    // base: M = 2·hc + hc² values, hc for the head), before the wait
    const bool head = (mode & 1) != 0, splits = !head && (!two || blockIdx.y == 1);
    const int lane = tid & 31;
    const float sc0 = scale[0], sc1 = head ? 0.f : scale[1], sc2 = splits ? scale[2] : 0.f;
    const float bpre = tid < hc ? base[tid] : 0.f, bpost = !head && tid < hc ? base[hc + tid] : 0.f;
    const float bcomb = splits && lane < nn ? base[2 * hc + lane] : 0.f;
    float4 nwr[HP_G];
#pragma unroll
    for (int i = 0; i < HP_G; i++) {
        const int64_t g = g0 + i * step;
        nwr[i] = vec && !(two && blockIdx.y == 1) && g0 >= 0 && g < ng ? ((const float4 *)normw)[g]
                                                                    : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    bool loaded = false;
    if constexpr (H) {
        if (vec && parts > 0 && !(two && blockIdx.y == 1)) {
            pdl_wait(); // (hc_pre_mix does not wait again)
            PHASE_MARK(1);
            load_streams();
            PHASE_MARK(2);
            loaded = true;
        }
    }
    // the streams' sum of squares and the scaled logits (mode bit 1)
    m = hc_pre_mix(mode & 2, early, m, M, ht, (int64_t)hc * D, vec, norm_eps, s_mix, parts, loaded, pex);
    mode &= 1;
    const bool warp_split = mode == 0 && nn <= 32 && blockDim.x > 32;
    if (two && blockIdx.y == 1) {
        if (tid < hc) post_out[(int64_t)t * hc + tid] = fmul(2.f, sigmoid_ref(fadd(fmul(m[hc + tid], sc1), bpost)));
        if (warp_split) {
            if (tid < 32) hc_split_warp<HC>(m, sc2, bcomb, hc, iters, hc_eps, comb_out + (int64_t)t * nn);
        } else {
            hc_split(m, scale, base, hc, iters, hc_eps, s_comb, comb_out + (int64_t)t * nn);
        }
        return;
    }
    // pre (and post) first: x needs only pre, so with a one-warp split the
    // other warps form x while warp 0 runs the Sinkhorn iterations
    if (tid < hc) {
        s_pre[tid] = fadd(sigmoid_ref(fadd(fmul(m[tid], sc0), bpre)), hc_eps);
        if (mode == 0 && !two) post_out[(int64_t)t * hc + tid] = fmul(2.f, sigmoid_ref(fadd(fmul(m[hc + tid], sc1), bpost)));
    }
    __syncthreads();
    PHASE_MARK(7);
    if (mode == 0 && !two) {
        if (warp_split) {
            if (tid < 32) hc_split_warp<HC>(m, sc2, bcomb, hc, iters, hc_eps, comb_out + (int64_t)t * nn);
        } else {
            hc_split(m, scale, base, hc, iters, hc_eps, s_comb, comb_out + (int64_t)t * nn);
        }
    }
    float *xt = x + (int64_t)t * D;
    double ss = 0;
    if (vec) {
        // float4 group g = tid − x0 + i·(blockDim − x0), i < HP_G
        float4 xr[HP_G];
        if (!loaded) load_streams(); // every load first, then the sums
#pragma unroll
        for (int i = 0; i < HP_G; i++) {
            const int64_t g = g0 + i * step;
            float4 sx = make_float4(0.f, 0.f, 0.f, 0.f);
            if (g0 >= 0 && g < ng) {
#pragma unroll
                for (int j = 0; j < NS; j++) {
                    const float pj = s_pre[j];
                    sx.x = fadd(sx.x, fmul(pj, hv[i][j].x));
                    sx.y = fadd(sx.y, fmul(pj, hv[i][j].y));
                    sx.z = fadd(sx.z, fmul(pj, hv[i][j].z));
                    sx.w = fadd(sx.w, fmul(pj, hv[i][j].w));
                }
                ss += (double)sx.x * (double)sx.x;
                ss += (double)sx.y * (double)sx.y;
                ss += (double)sx.z * (double)sx.z;
                ss += (double)sx.w * (double)sx.w;
            }
            xr[i] = sx;
        }
        PHASE_MARK(8);
        ss = block_sum_d(ss);
        PHASE_MARK(9);
        const float r = rms_from_sumsq(ss, D, norm_eps);
        PHASE_MARK(10);
#pragma unroll
        for (int i = 0; i < HP_G; i++) {
            const int64_t g = g0 + i * step;
            if (g0 < 0 || g >= ng) continue;
            const float4 o = rms_scale4(nwr[i], xr[i], r);
            ((float4 *)xt)[g] = o;
            if (xq) hc_x_q8_0(o, g, xq + (int64_t)t * xq_stride, D);
        }
        phase_end(0);
        return;
    }
#pragma unroll 4
    for (int64_t d = (int64_t)threadIdx.x - x0; d >= 0 && d < D; d += (int64_t)blockDim.x - x0) {
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < hc; j++) s = fadd(s, fmul(s_pre[j], ht[j * D + d]));
        xt[d] = s;
        ss += (double)s * (double)s;
    }
    ss = block_sum_d(ss);
    const float r = rms_from_sumsq(ss, D, norm_eps);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) xt[d] = fmul(normw[d], fmul(xt[d], r));
}

// hc_pre of a chunk (8 or more tokens; hc == HC, D % 4 == 0, 16-byte
// aligned rows): k_hc_pre's operations and results, laid out for
// throughput instead of one token's latency. k_hc_pre gives a token a CTA
// of 512 threads that hold every stream's float4s in registers at once (the
// decode step's critical path), plus a second CTA for the Sinkhorn split:
// about one resident CTA per SM, so a chunk of 4096 tokens ran as ≈ 60
// waves (461 µs on the H200). Here a token has HPC_T threads that walk the
// float4 groups in a loop: the streams' sum of squares (mode bit 1), pre
// and post, the split in warp 0, then x = Σ_j pre_j·h_j stored as it is
// formed with its sum of squares, and a second pass that normalises it
// (and forms its Q8_0 activation when xq is set: D % 32 == 0). Same
// operations per value; the double sums of squares are reduced in another
// tree (rounded to float, as k_hc_pre's and the CPU's orders are).
constexpr int HPC_T = 128;
template <int HC>
__global__ void __launch_bounds__(HPC_T) k_hc_pre_chunk(int mode, const float *mix, int M, const float *scale,
                                                        const float *base, int iters, float hc_eps, const float *h,
                                                        int64_t D, const float *normw, float norm_eps, float *x,
                                                        float *post_out, float *comb_out, uint8_t *xq, int64_t xq_stride) {
    pdl_launch();
    const bool early = (mode & 6) == 6, xhalf = (mode & 8) != 0;
    mode &= 3;
    __shared__ float s_pre[HC], s_mix[288];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float *m = mix + (int64_t)t * M;
    const float *ht = h + (int64_t)t * HC * D;
    const int64_t ng = D / 4; // float4 groups a stream
    m = hc_pre_mix(mode & 2, early, m, M, ht, HC * D, true, norm_eps, s_mix);
    mode &= 1;
    if (tid < HC) {
        s_pre[tid] = fadd(sigmoid_ref(fadd(fmul(m[tid], scale[0]), base[tid])), hc_eps);
        if (mode == 0)
            post_out[(int64_t)t * HC + tid] = fmul(2.f, sigmoid_ref(fadd(fmul(m[HC + tid], scale[1]), base[HC + tid])));
    }
    __syncthreads();
    if (mode == 0 && tid < 32)
        hc_split_warp<HC>(m, scale[2], tid < HC * HC ? base[2 * HC + tid] : 0.f, HC, iters, hc_eps,
                          comb_out + (int64_t)t * HC * HC);
    float4 *xt = (float4 *)(x + (int64_t)t * D);
    double ss = 0;
#pragma unroll 2
    for (int64_t g = tid; g < ng; g += HPC_T) {
        float4 hv[HC];
#pragma unroll
        for (int j = 0; j < HC; j++) hv[j] = ((const float4 *)(ht + j * D))[g];
        float4 sx = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < HC; j++) {
            const float pj = s_pre[j];
            sx.x = fadd(sx.x, fmul(pj, hv[j].x));
            sx.y = fadd(sx.y, fmul(pj, hv[j].y));
            sx.z = fadd(sx.z, fmul(pj, hv[j].z));
            sx.w = fadd(sx.w, fmul(pj, hv[j].w));
        }
        xt[g] = sx;
        ss += (double)sx.x * (double)sx.x;
        ss += (double)sx.y * (double)sx.y;
        ss += (double)sx.z * (double)sx.z;
        ss += (double)sx.w * (double)sx.w;
    }
    ss = block_sum_d(ss);
    const float r = rms_from_sumsq(ss, D, norm_eps);
    for (int64_t g = tid; g < ng; g += HPC_T) { // (each thread reads back the groups it wrote)
        const float4 o = rms_scale4(((const float4 *)normw)[g], xt[g], r);
        xt[g] = o;
        if (xq) {
            if (xhalf)
                *(uint2 *)(xq + (int64_t)t * xq_stride + 8 * g) = half4_bits(o); // (mode bit 8: x in f16)
            else
                hc_x_q8_0(o, g, xq + (int64_t)t * xq_stride, D);
        }
    }
}

// hc_post_at forms one token's new streams at d, in place: h'_k[d] =
// post_k·o + Σ_j comb[j][k]·h_j[d] (j in order) for k < hc, the streams D
// apart at ht; nv receives them. M bounds hc (the loops unroll).
template <int M>
__device__ __forceinline__ void hc_post_at(float *ht, int64_t D, int64_t d, float o, const float *pt, const float *ct,
                                           int hc, float (&nv)[M]) {
    float hv[M];
#pragma unroll
    for (int j = 0; j < M; j++)
        if (j < hc) hv[j] = ht[j * D + d];
#pragma unroll
    for (int k = 0; k < M; k++) {
        if (k >= hc) break;
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < M; j++)
            if (j < hc) s = fadd(s, fmul(ct[j * hc + k], hv[j]));
        nv[k] = fadd(fmul(pt[k], o), s);
    }
#pragma unroll
    for (int k = 0; k < M; k++)
        if (k < hc) ht[k * D + d] = nv[k];
}

// h'_k = post_k·out + Σ_j comb[j][k]·h_j, in place; one thread per (t, d).
// HC > 0: that many streams, known at compile time (the arrays stay in
// registers); HC == 0: hc of them, up to 16.
template <int HC>
__global__ void k_hc_post(float *h, const float *out, const float *post, const float *comb, int hc, int64_t D, int n) {
    pdl_enter();
    constexpr int M = HC > 0 ? HC : 16;
    if (HC > 0) hc = HC;
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= D * n) return;
    const int64_t t = i / D, d = i % D;
    float nv[M];
    hc_post_at<M>(h + t * hc * D, D, d, out[t * D + d], post + t * hc, comb + t * hc * hc, hc, nv);
}

// ------------------------------------------------------------ MoE sum helpers
// moe_rank_order: the threads with i < K (i: the thread's index, or its
// lane when a warp ranks its own token's) place the token's experts ids[0
// … K−1] by rank (ascending id, ties by position) into ord (K ≤ 16; the
// caller synchronises before reading it).
__device__ __forceinline__ void moe_rank_order(const int32_t *ids, int K, int *ord, int i = threadIdx.x) {
    if (i < K) { // (thread i: selection i's rank)
        const int32_t me = ids[i];
        int r = 0;
        for (int j = 0; j < K; j++) r += (ids[j] < me || (ids[j] == me && j < i)) ? 1 : 0; // a permutation even with repeats
        ord[r] = i;
    }
}

// moe_sum_at: one token's routed outputs ye[K][D] at d added in rank order
// (ord), then its shared expert's ysh[d] (if any): k_moe_combine's value.
__device__ __forceinline__ float moe_sum_at(const float *ye, const int *ord, int K, int64_t D, int64_t d,
                                            const float *ysh) {
    float v[16];
#pragma unroll
    for (int r = 0; r < 16; r++)
        if (r < K) v[r] = ye[(int64_t)ord[r] * D + d];
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < 16; r++)
        if (r < K) acc = fadd(acc, v[r]);
    return ysh ? fadd(acc, ysh[d]) : acc;
}

// ------------------------------------------------------------ hc_post + the next mixes
// k_hc_post_mix is k_hc_post of one token (the same operations, so the same
// streams; tokens by blockIdx.y, up to HPM_N) whose CTA p also
// sums, over its slice of d (blockDim.x values),
// the next hc_pre's mixing products fn_r·flat(h) (r < M) and the streams'
// squares into part[p][0..M]: hc_pre adds the parts (mode bits 16+) instead
// of waiting for a product of its own. The weights are loaded before the
// wait (the kernels before do not write them). Fast mode (the products'
// float order differs from the product kernels').
constexpr int HPM_M = 24;
constexpr int HPM_N = 4; // tokens: a CTA row (blockIdx.y) each, as k_hc_pre takes them (below k_hc_pre_chunk's 8)

// NW warps: the CTA's slice is 32·NW values of d; warp w sums the rows
// w, w + NW, … of fn (their weights in registers, loaded before the wait)
// over the slice's 4 × 32·NW new stream values, read from shared memory,
// and warp M % NW the squares. MOE: the sub-block output at d is the
// token's MoE sum of moe.ye, moe.sel, moe.ysh (k_moe_combine's value), not
// out[d].
struct MoESum {
    const float *ye;    // [n][K][D]
    const int32_t *sel; // [n][K]
    const float *ysh;   // [n][D] or null
    int K;
};

// hpm_token moves k_hc_post_mix's and k_hc_post_mix_ex's pointers to token
// t's streams (hc of D), post and comb weights, and sub-block output (out,
// or with MOE the MoE sum's inputs); the parts are each kernel's own.
template <int HC, bool MOE>
__device__ __forceinline__ void hpm_token(int64_t t, int64_t D, float *&h, const float *&post, const float *&comb,
                                          const float *&out, MoESum &moe) {
    h += t * HC * D;
    post += t * HC;
    comb += t * HC * HC;
    if constexpr (MOE) {
        moe.ye += t * moe.K * D;
        moe.sel += t * moe.K;
        if (moe.ysh) moe.ysh += t * D;
    } else {
        out += t * D;
    }
}

template <int TYPE, int NW, bool MOE>
__global__ void __launch_bounds__(32 * NW) k_hc_post_mix(float *h, const float *out, const float *post, const float *comb,
                                                         int64_t D, const void *fn, int M, float *part, MoESum moe) {
    constexpr int HC = 4, RPW = (HPM_M + NW - 1) / NW, VPL = HC * NW; // rows a warp, values a lane and row
    pdl_launch();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t d0 = blockIdx.x * (int64_t)(32 * NW);
    if (gridDim.y > 1) { // token blockIdx.y: its streams, output (or MoE sum's), weights and parts
        const int64_t t = blockIdx.y;
        hpm_token<HC, MOE>(t, D, h, post, comb, out, moe);
        part += t * gridDim.x * (int64_t)(M + 1);
    }
    float w[RPW][VPL];
#pragma unroll
    for (int j = 0; j < RPW; j++) {
        const int r = warp + NW * j;
#pragma unroll
        for (int v = 0; v < VPL; v++) // v = k·NW + i: stream k, slice value lane + 32 i
            w[j][v] = r < M ? load_elem(TYPE, (const uint8_t *)fn, M, HC * D, r, (v / NW) * D + d0 + lane + 32 * (v % NW))
                            : 0.f;
    }
    pdl_wait();
    __shared__ float s_h[HC][32 * NW];
    __shared__ int s_ord[16];
    if (MOE) {
        moe_rank_order(moe.sel, moe.K, s_ord);
        __syncthreads();
    }
    {
        const int64_t d = d0 + threadIdx.x;
        const float o = MOE ? moe_sum_at(moe.ye, s_ord, moe.K, D, d, moe.ysh) : out[d];
        float nv[HC];
        hc_post_at<HC>(h, D, d, o, post, comb, HC, nv);
#pragma unroll
        for (int k = 0; k < HC; k++) s_h[k][threadIdx.x] = nv[k];
    }
    __syncthreads();
    float x[VPL];
#pragma unroll
    for (int v = 0; v < VPL; v++) x[v] = s_h[v / NW][lane + 32 * (v % NW)];
    float *pp = part + blockIdx.x * (int64_t)(M + 1);
#pragma unroll
    for (int j = 0; j <= RPW; j++) {
        const int r = j < RPW ? warp + NW * j : M; // the last: the squares, on warp M % NW
        if (j < RPW ? r >= M : warp != M % NW) continue;
        float acc = 0.f;
#pragma unroll
        for (int v = 0; v < VPL; v++) acc = fmaf(j < RPW ? w[j][v] : x[v], x[v], acc);
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, m);
        if (lane == 0) pp[r] = acc;
    }
}

// ------------------------------------------------------------ hc_post + the next mixes, exact
// k_hc_post_mix_ex is k_hc_post_mix for exact mode: the next mixing
// products in quant's float-weight order (quant/floatdot.go: product i,
// rounded, joins running sum (i/8) mod 256 in ascending i; the 256 sums
// then a tree of adjacent pairs), which hc_pre completes. With 4 streams of
// D = 2048·HPX_PER values, element i = s·D + d of flat(h) joins sum
// (d/8) mod 256 whatever its stream, so running sum j takes exactly the
// new stream values at the 8·HPX_PER values of d in {2048p + 8j + e}: CTA c
// forms the streams there for its HPX_J sums (k_hc_post's operations: the
// same streams) and runs each (row, sum) chain whole, in ascending i
// (streams, then p, then e), into part[t][r][j]; and the squares of those
// stream values, summed in double, into the token's part count of doubles
// after the M × 256 sums (hc_pre adds them: the streams' sum of squares in
// another double order, as k_hc_pre's own). The rows' weights are loaded
// before the wait (the kernels before do not write them). MOE as
// k_hc_post_mix: the sub-block output is the token's MoE sum.
constexpr int HPX_J = 2;                    // running sums a CTA
constexpr int HPX_PER = 2;                  // periods of 2048 in D (Flash's 4096)
constexpr int HPX_D = 8 * HPX_J * HPX_PER;  // values of d a CTA (its hc_post threads)
constexpr int HPX_P = 256 / HPX_J;          // CTAs a token: the parts
constexpr int HPX_T = 64;                   // threads: ≥ HPX_D and ≥ HPM_M · HPX_J chains
static_assert(HPX_T >= HPX_D && HPX_T >= HPM_M * HPX_J, "k_hc_post_mix_ex: a thread a value of d and a chain");
static_assert(HPX_P == DS4C_HC_EX_PARTS && 2048 * HPX_PER == DS4C_HC_EX_D, "k_hc_post_mix_ex: the header's shape");

// NT = 2 (a verification pass's two tokens, DS4C_OPT_MV_TWO's bit 8): one CTA
// takes both tokens' running sums j0 … j0 + HPX_J − 1 with the rows'
// weights loaded once — warp t forms token t's streams (HPX_D values: one
// warp) and its squares, whose xor-shuffle tree is block_sum_d's for one
// token (the other warp's total is +0 there) — then each chain thread runs
// token 0's chain and token 1's: each token's operations, order and bits
// those of its one-token CTA, in half the CTAs and weight loads.
template <int TYPE, bool MOE, int NT = 1>
__global__ void __launch_bounds__(HPX_T) k_hc_post_mix_ex(float *h, const float *out, const float *post,
                                                          const float *comb, const void *fn, int M, float *part,
                                                          MoESum moe) {
    constexpr int HC = 4, D = 2048 * HPX_PER, CL = HC * HPX_PER * 8; // a chain's elements
    static_assert(NT == 1 || (NT == 2 && HPX_D == 32 && HPX_T == 64), "k_hc_post_mix_ex: two tokens a warp each");
    pdl_launch();
    const int tid = threadIdx.x, j0 = blockIdx.x * HPX_J;
    const int64_t t = blockIdx.y;
    if constexpr (NT == 1) {
        hpm_token<HC, MOE>(t, D, h, post, comb, out, moe);
        part += t * ((int64_t)M * 256 + 2 * HPX_P);
    }
    // the chain's weights: row r, sum j0 + jj, elements s·D + 2048p + 8(j0 + jj) + e
    const int r = tid / HPX_J, jj = tid % HPX_J;
    const bool chain = r < M;
    // (chain element c = (s·HPX_PER + p)·8 + e: stream s, period p, e; in
    // ascending i)
    auto s_of = [](int c) { return c / (8 * HPX_PER); };
    auto p_of = [](int c) { return c / 8 % HPX_PER; };
    float w[CL];
#pragma unroll
    for (int c = 0; c < CL; c++)
        w[c] = chain ? load_elem(TYPE, (const uint8_t *)fn, M, HC * D, r,
                                 s_of(c) * D + 2048 * p_of(c) + 8 * (j0 + jj) + c % 8)
                     : 0.f;
    pdl_wait();
    // the new streams at the CTA's values of d, local index (p·HPX_J + jj)·8 + e
    __shared__ float s_h[NT][HC][HPX_D];
    __shared__ int s_ord[NT][16];
    if constexpr (NT == 1) {
        if (MOE) {
            moe_rank_order(moe.sel, moe.K, s_ord[0]);
            __syncthreads();
        }
        double sq = 0;
        if (tid < HPX_D) {
            const int64_t d = 2048 * (tid / (8 * HPX_J)) + 8 * j0 + tid % (8 * HPX_J);
            const float o = MOE ? moe_sum_at(moe.ye, s_ord[0], moe.K, D, d, moe.ysh) : out[d];
            float nv[HC];
            hc_post_at<HC>(h, D, d, o, post, comb, HC, nv);
#pragma unroll
            for (int k = 0; k < HC; k++) {
                s_h[0][k][tid] = nv[k];
                sq += (double)nv[k] * (double)nv[k];
            }
        }
        sq = block_sum_d(sq); // (its barriers also order s_h's stores before the chains)
        if (chain) {
            float acc = 0.f;
#pragma unroll
            for (int c = 0; c < CL; c++)
                acc = fadd(acc, fmul(w[c], s_h[0][s_of(c)][(p_of(c) * HPX_J + jj) * 8 + c % 8]));
            part[(int64_t)r * 256 + j0 + jj] = acc;
        }
        if (tid == 0) ((double *)(part + (int64_t)M * 256))[blockIdx.x] = sq;
    } else {
        // warp tt: token tt's streams (lane: the value), its rank order and squares
        const int tt = tid >> 5, lane = tid & 31;
        const int64_t tstride = (int64_t)M * 256 + 2 * HPX_P; // a token's parts
        hpm_token<HC, MOE>(tt, D, h, post, comb, out, moe);
        if (MOE) {
            moe_rank_order(moe.sel, moe.K, s_ord[tt], lane); // (the warp's own token)
            __syncwarp();
        }
        const int64_t d = 2048 * (lane / (8 * HPX_J)) + 8 * j0 + lane % (8 * HPX_J);
        const float o = MOE ? moe_sum_at(moe.ye, s_ord[tt], moe.K, D, d, moe.ysh) : out[d];
        float nv[HC];
        hc_post_at<HC>(h, D, d, o, post, comb, HC, nv);
        double sq = 0;
#pragma unroll
        for (int k = 0; k < HC; k++) {
            s_h[tt][k][lane] = nv[k];
            sq += (double)nv[k] * (double)nv[k];
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) sq += __shfl_xor_sync(FULL_MASK, sq, m);
        if (lane == 0) ((double *)(part + tt * tstride + (int64_t)M * 256))[blockIdx.x] = sq;
        __syncthreads(); // both tokens' streams before the chains
        if (chain) {
#pragma unroll
            for (int u = 0; u < NT; u++) {
                float acc = 0.f;
#pragma unroll
                for (int c = 0; c < CL; c++)
                    acc = fadd(acc, fmul(w[c], s_h[u][s_of(c)][(p_of(c) * HPX_J + jj) * 8 + c % 8]));
                part[u * tstride + (int64_t)r * 256 + j0 + jj] = acc;
            }
        }
    }
}

// ------------------------------------------------------------ RoPE
// rope_pair rotates the pair v[0], v[1] by the angle fp·freq (inverse: back).
__device__ __forceinline__ void rope_pair(float *v, float fp, float freq, int inverse) {
    const float2 cs = rope_cs(fp, freq);
    rope_pair_cs(v, cs.x, cs.y, inverse);
}

// Rotates x[t][j][off : off+rd] (pairs) at position pos0 + t·pos_step.
__global__ void k_rope(float *x, int64_t tok_stride, int heads, int64_t head_stride, int64_t off, const float *freqs,
                       int rd, int64_t pos0, int64_t pos_step, int n_tok, int inverse) {
    pdl_enter();
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int half = rd / 2;
    if (i >= (int64_t)n_tok * heads * half) return;
    const int64_t t = i / ((int64_t)heads * half);
    const int j = (int)((i / half) % heads), p = (int)(i % half);
    rope_pair(x + t * tok_stride + j * head_stride + off + 2 * p, (float)(pos0 + t * pos_step), freqs[p], inverse);
}

// k_rope_table writes rope_cs(pos + t, freqs[j]) for the rd/2 pairs j of
// n positions into cs[t·rd/2 + j]: the (cosine, sine) that k_rope,
// k_norm_rope and the attention's inverse rotation compute per pair, once
// for a position (ds4c_rope_table).
__global__ void k_rope_table(const float *freqs, int rd, int64_t pos, int n, float2 *cs) {
    pdl_enter();
    const int h = rd / 2;
    for (int i = threadIdx.x; i < n * h; i += blockDim.x) cs[i] = rope_cs((float)(pos + i / h), freqs[i % h]);
}

// ------------------------------------------------------------ FP8 / FP4 / Hadamard
__device__ __forceinline__ float pow2_ceil(float v) {
    int e;
    float m = frexpf(v, &e);
    if (m == 0.5f) e--;
    return ldexpf(1.f, e);
}

__device__ __forceinline__ float round_e4m3(float y) {
    float a = fabsf(y);
    int e;
    frexpf(a, &e);
    float q = ldexpf(1.f, max(e - 1, -6) - 3);
    return copysignf(rintf(a / q) * q, y);
}

__device__ __forceinline__ float round_e2m1(float y) {
    float a = fabsf(y);
    float q = a < 2.f ? 0.5f : (a < 4.f ? 1.f : 2.f);
    return copysignf(rintf(a / q) * q, y);
}

// The FP8 e4m3 simulation of a block of 64 values: from its largest
// magnitude amax (at least 1e-4), the power-of-two scale fp8_scale(amax) ≥
// amax/448, and each value fp8_round(v, s) = e4m3(clamp(v/s, ±448))·s.
// fp8_block and k_norm_rope_w's fused form both go through these two.
__device__ __forceinline__ float fp8_scale(float amax) { return pow2_ceil(fmul(amax, (float)(1.0 / 448.0))); }
__device__ __forceinline__ float fp8_round(float v, float s) {
    return fmul(round_e4m3(fminf(fmaxf(__fdiv_rn(v, s), -448.f), 448.f)), s);
}

// fp8_block: FP8 e4m3 simulation of the 64 values at blk, by one warp.
__device__ __forceinline__ void fp8_block(float *blk, int lane) {
    const float v0 = blk[lane], v1 = blk[lane + 32];
    const float s = fp8_scale(warp_max(fmax_go(1e-4f, fmax_go(fabsf(v0), fabsf(v1)))));
    blk[lane] = fp8_round(v0, s);
    blk[lane + 32] = fp8_round(v1, s);
}

// k_norm_rope: k_rmsnorm_ref, k_rope and k_fp8_sim of one row in one CTA
// (the query heads and the KV row of a token): x[t][h][0:hd] is normalised
// (times w when w is set), its pairs from off rotated to position pos0 + t,
// and its first fp8_n values rounded through FP8 — the same device code as
// the three kernels, on the row staged in shared memory.
// norm_rope_row is that work on the row xr at position fp, staged in s_row
// (hd floats of shared memory); cs, when set, holds ds4c_rope_table's
// (cosine, sine) of each pair at fp, read instead of computed; xr2, when
// set, receives the row too.
__device__ __forceinline__ void norm_rope_row(float *xr, float *s_row, int hd, const float *w, float eps, int64_t off,
                                              const float *freqs, int rd, float fp, int fp8_n,
                                              const float2 *cs = nullptr, float *xr2 = nullptr) {
    const int tid = threadIdx.x;
    double ss = 0;
    for (int i = tid; i < hd; i += blockDim.x) {
        const float v = xr[i];
        s_row[i] = v;
        ss += (double)v * (double)v;
    }
    ss = block_sum_d(ss);
    const float r = rms_from_sumsq(ss, hd, eps);
    for (int i = tid; i < hd; i += blockDim.x) {
        const float v = fmul(s_row[i], r);
        s_row[i] = w ? fmul(w[i], v) : v;
    }
    __syncthreads();
    for (int p = tid; p < rd / 2; p += blockDim.x) {
        if (cs) { // (ds4c_rope_table's rope_cs(fp, freqs[p]): the same bits)
            const float2 c = __ldg(cs + p);
            rope_pair_cs(s_row + off + 2 * p, c.x, c.y, 0);
        } else {
            rope_pair(s_row + off + 2 * p, fp, freqs[p], 0);
        }
    }
    for (int b = tid >> 5; b < fp8_n / 64; b += blockDim.x >> 5) fp8_block(s_row + 64 * b, tid & 31);
    __syncthreads();
    for (int i = tid; i < hd; i += blockDim.x) {
        xr[i] = s_row[i];
        if (xr2) xr2[i] = s_row[i];
    }
}

__global__ void k_norm_rope(float *x, int64_t tok_stride, int heads, int64_t head_stride, int hd, const float *w,
                            float eps, int64_t off, const float *freqs, int rd, int64_t pos0, int fp8_n) {
    pdl_enter();
    extern __shared__ float s_row[];
    const int t = blockIdx.x / heads, h = blockIdx.x % heads;
    norm_rope_row(x + t * tok_stride + h * head_stride, s_row, hd, w, eps, off, freqs, rd, (float)(pos0 + t), fp8_n);
}

// k_norm_rope_pair: k_norm_rope of two tensors of rows of hd values in one
// launch (the query heads and the KV row of a decode step or a speculative
// pass): the first n_tok * heads1 CTAs take x1's rows, the rest x2's, each
// with its own weights and FP8 count; cs: the rotation's table of the n_tok
// positions (ds4c_rope_table); ring (ring_cap slots of heads2 * hd values):
// x2's rows of token t are also written into slot (pos0 + t) % ring_cap.
__global__ void k_norm_rope_pair(float *x1, int heads1, const float *w1, int fp8_n1, float *x2, int heads2,
                                 const float *w2, int fp8_n2, int hd, float eps, int64_t off, const float *freqs,
                                 int rd, int64_t pos0, int n_tok, const float2 *cs, float *ring, int64_t ring_cap) {
    pdl_enter();
    extern __shared__ float s_row[];
    const int n1 = n_tok * heads1;
    if ((int)blockIdx.x < n1) {
        const int t = blockIdx.x / heads1, h = blockIdx.x % heads1;
        norm_rope_row(x1 + ((int64_t)t * heads1 + h) * hd, s_row, hd, w1, eps, off, freqs, rd, (float)(pos0 + t),
                      fp8_n1, cs ? cs + (int64_t)t * (rd / 2) : nullptr);
    } else {
        const int b = blockIdx.x - n1, t = b / heads2, h = b % heads2;
        float *slot = ring ? ring + (((pos0 + t) % ring_cap) * heads2 + h) * (int64_t)hd : nullptr;
        norm_rope_row(x2 + ((int64_t)t * heads2 + h) * hd, s_row, hd, w2, eps, off, freqs, rd, (float)(pos0 + t),
                      fp8_n2, cs ? cs + (int64_t)t * (rd / 2) : nullptr, slot);
    }
}

// k_norm_rope_w: k_norm_rope with a warp per row, for chunks (hd a multiple
// of 128, at most NR_V·128; off even): the row stays in registers as
// float4s (lane l holds values 128c + 4l … +3), the sum of squares is taken
// by shuffles, each lane rotates the pairs it holds, and each FP8 block of 64
// values (16 lanes) finds its largest magnitude by shuffles within those
// lanes — no shared memory, no barriers, 8 rows a CTA instead of one. Every
// value gets k_norm_rope's operations; the float64 sum of squares is added
// in another order (neither kernel's order is the CPU's sequential one).
constexpr int NR_V = 8;
__global__ void __launch_bounds__(256) k_norm_rope_w(float *x, int64_t tok_stride, int heads, int64_t head_stride,
                                                     int hd, const float *w, float eps, int64_t off,
                                                     const float *freqs, int rd, int64_t pos0, int fp8_n, int64_t rows,
                                                     __half *xh) {
    pdl_enter();
    const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gw >= rows) return; // whole warps
    const int64_t t = gw / heads;
    const int h = (int)(gw % heads);
    float4 *xr = (float4 *)(x + t * tok_stride + h * head_stride);
    const int nv = hd / 128;
    float e[NR_V][4];
    double ss = 0;
#pragma unroll
    for (int c = 0; c < NR_V; c++) {
        if (c < nv) {
            const float4 q = xr[c * 32 + lane];
            e[c][0] = q.x, e[c][1] = q.y, e[c][2] = q.z, e[c][3] = q.w;
        } else {
            e[c][0] = e[c][1] = e[c][2] = e[c][3] = 0.f;
        }
    }
#pragma unroll
    for (int c = 0; c < NR_V; c++)
#pragma unroll
        for (int k = 0; k < 4; k++) ss += (double)e[c][k] * (double)e[c][k];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
    const float r = rms_from_sumsq(ss, hd, eps);
    const float fp = (float)(pos0 + t);
#pragma unroll
    for (int c = 0; c < NR_V; c++) {
        if (c >= nv) break; // the same for the whole warp
        const int i0 = c * 128 + 4 * lane;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float u = fmul(e[c][k], r);
            e[c][k] = w ? fmul(w[i0 + k], u) : u;
        }
#pragma unroll
        for (int k = 0; k < 4; k += 2) {
            const int64_t i = i0 + k;
            if (i >= off && i < off + rd) rope_pair(&e[c][k], fp, freqs[(i - off) / 2], 0);
        }
        if (c * 128 < fp8_n) { // fp8_block's operations on the lane's block of 64 (lanes 0-15 or 16-31)
            float amax = fmax_go(1e-4f, fmax_go(fmax_go(fabsf(e[c][0]), fabsf(e[c][1])),
                                                fmax_go(fabsf(e[c][2]), fabsf(e[c][3]))));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
            if (i0 < fp8_n) {
                const float s = fp8_scale(amax);
#pragma unroll
                for (int k = 0; k < 4; k++) e[c][k] = fp8_round(e[c][k], s);
            }
        }
        const float4 o = make_float4(e[c][0], e[c][1], e[c][2], e[c][3]);
        if (xh) // (ds4c_norm_rope_half: the row in f16 at xh, rows hd apart; x unchanged)
            *(uint2 *)(xh + gw * hd + c * 128 + 4 * lane) = half4_bits(o);
        else
            xr[c * 32 + lane] = o;
    }
}

// FP8 e4m3 simulation of x[r][0:n] in blocks of 64: one warp per block.
__global__ void k_fp8_sim(float *x, int64_t stride, int rows, int64_t n) {
    pdl_enter();
    const int64_t gw = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t nb = n / 64;
    if (gw >= nb * rows) return;
    fp8_block(x + (gw / nb) * stride + (gw % nb) * 64, lane);
}

// FP4 e2m1 simulation of x[r][0:n] in blocks of 32: one warp per block.
__global__ void k_fp4_sim(float *x, int64_t stride, int rows, int64_t n) {
    pdl_enter();
    const int64_t gw = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t nb = n / 32;
    if (gw >= nb * rows) return;
    float *blk = x + (gw / nb) * stride + (gw % nb) * 32;
    float v = blk[lane];
    float amax = fmax_go(6.f * 1.17549435e-38f, fabsf(v)); // 6·2^-126
    amax = warp_max(amax);
    const float s = pow2_ceil(fmul(amax, (float)(1.0 / 6.0)));
    float y = fminf(fmaxf(__fdiv_rn(v, s), -6.f), 6.f);
    blk[lane] = fmul(round_e2m1(y), s);
}

// had_regs: the Hadamard transform of one row of n = 32·V values held by a
// warp, lane l holding values V·l … V·l+V−1 in v: stages below V inside the
// thread, the others with the lane l ^ (s/V) (the lower index adds, the
// upper subtracts, as k_hadamard's pairs), then × scale; FP4: each block
// of 32 (32/V lanes) as k_fp4_sim. The same operations on the same values
// as those two kernels.
template <int V, bool FP4> __device__ __forceinline__ void had_regs(float (&v)[V], int lane, float scale) {
#pragma unroll
    for (int s = 1; s < V; s *= 2)
#pragma unroll
        for (int k = 0; k < V; k++)
            if ((k & s) == 0) {
                const float a = v[k], b = v[k + s];
                v[k] = fadd(a, b);
                v[k + s] = fsub(a, b);
            }
#pragma unroll
    for (int m = 1; m < 32; m *= 2) {
        const bool upper = (lane & m) != 0;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float p = __shfl_xor_sync(FULL_MASK, v[k], m);
            v[k] = upper ? fsub(p, v[k]) : fadd(v[k], p);
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = fmul(v[k], scale);
    if (FP4) {
        float amax = fmax_go(6.f * 1.17549435e-38f, fabsf(v[0])); // (a block of NaNs stays NaN, as warp_max's)
#pragma unroll
        for (int k = 1; k < V; k++) amax = fmaxf(amax, fmax_go(6.f * 1.17549435e-38f, fabsf(v[k])));
#pragma unroll
        for (int o = 1; o < 32 / V; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
        const float s = pow2_ceil(fmul(amax, (float)(1.0 / 6.0)));
#pragma unroll
        for (int k = 0; k < V; k++) v[k] = fmul(round_e2m1(fminf(fmaxf(__fdiv_rn(v[k], s), -6.f), 6.f)), s);
    }
}

// row_load / row_store: a lane's V values of a warp's row at xr (float4
// when V is a multiple of 4: xr 16-byte aligned).
template <int V> __device__ __forceinline__ void row_load(float (&v)[V], const float *xr) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i < V; i += 4) {
            const float4 f = *(const float4 *)(xr + i);
            v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = xr[i];
    }
}
template <int V> __device__ __forceinline__ void row_store(const float (&v)[V], float *xr) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i < V; i += 4) *(float4 *)(xr + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) xr[i] = v[i];
    }
}

// k_hadamard_w: k_hadamard (and, FP4, k_fp4_sim after it) of rows of n =
// 32·V values, a warp a row in registers (had_regs). The same bits as the
// two kernels, whose CTA a row (7 barriers for n = 128, half its threads
// idle) took 355 + 196 µs for a 4096-token chunk's indexer queries on the
// H200.
template <int V, bool FP4>
__global__ void __launch_bounds__(256) k_hadamard_w(float *x, int64_t stride, int rows, float scale) {
    pdl_enter();
    const int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    float *xr = x + row * stride + V * lane;
    float v[V];
    row_load<V>(v, xr);
    had_regs<V, FP4>(v, lane, scale);
    row_store<V>(v, xr);
}

// k_ix_query: the indexer's queries of a batch readied for the scores in
// one launch (ds4c_index_query), a warp a (token, head) row of n = 32·V
// values: k_rope's rotation of the row's dims off … off+rd−1 at the
// token's position (pairs within a lane: V and off even), then had_regs
// with the FP4 simulation (ds4c_hadamard_fp4), and lane 0 scales the
// head's weight w[row] (ds4c_scale): the three kernels' operations on the
// same values, so the same bits.
template <int V>
__global__ void __launch_bounds__(256) k_ix_query(float *q, float *w, int heads, int64_t off, const float *freqs, int rd,
                                                  int64_t pos0, int rows, float had_scale, float w_scale) {
    pdl_enter();
    const int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const int64_t t = row / heads;
    float *xr = q + row * (32 * V) + V * lane;
    float v[V];
    row_load<V>(v, xr);
#pragma unroll
    for (int k = 0; k < V; k += 2) {
        const int64_t e = (int64_t)V * lane + k;
        if (e >= off && e < off + rd) rope_pair(&v[k], (float)(pos0 + t), freqs[(e - off) / 2], 0);
    }
    had_regs<V, true>(v, lane, had_scale);
    row_store<V>(v, xr);
    if (lane == 0) w[row] = fmul(w[row], w_scale);
}

// Normalised Walsh–Hadamard transform of rows of n (a power of two ≤ 1024)
// values, Sylvester order, then × scale; one CTA per row.
__global__ void k_hadamard(float *x, int64_t stride, int n, float scale) {
    pdl_enter();
    extern __shared__ float s_h[];
    float *xr = x + blockIdx.x * stride;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s_h[i] = xr[i];
    __syncthreads();
    for (int s = 1; s < n; s *= 2) {
        for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
            const int j = (p / s) * 2 * s, k = j + p % s;
            const float a = s_h[k], b = s_h[k + s];
            s_h[k] = fadd(a, b);
            s_h[k + s] = fsub(a, b);
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = fmul(s_h[i], scale);
}

// ------------------------------------------------------------ small helpers
__global__ void k_scale(float *x, int64_t n, float s) {
    pdl_enter();
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] = fmul(x[i], s);
}

// dst[t][c] += add[((pos0 + t) mod r)][c] for t < n, c < width.
__global__ void k_add_ape(float *dst, const float *ape, int64_t width, int r, int64_t pos0, int n) {
    pdl_enter();
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= width * n) return;
    const int64_t t = i / width, c = i % width;
    dst[i] = fadd(dst[i], ape[((pos0 + t) % r) * width + c]);
}

// ring_copy_at: element x of a ring write of n rows at positions pos0 …
// pos0 + n − 1 (width cw; only the last min(n, cap) rows land, earlier
// ones would be overwritten): *slot its index in the ring (row (pos0 + t)
// mod cap), *from its index in the source (row t, stride ss). x runs over
// ring_copy_len(n, cap, cw) elements. k_ring_write and k_comp_emit's ring
// copy share it.
__device__ __forceinline__ int64_t ring_copy_len(int64_t n, int64_t cap, int64_t cw) {
    return (n > cap ? cap : n) * cw;
}
__device__ __forceinline__ void ring_copy_at(int64_t x, int64_t n, int64_t cap, int64_t cw, int64_t ss, int64_t pos0,
                                             int64_t *slot, int64_t *from) {
    const int64_t t = (n > cap ? n - cap : 0) + x / cw, c = x % cw;
    *slot = ((pos0 + t) % cap) * cw + c;
    *from = t * ss + c;
}

// ring[(pos0 + t) mod cap] = src[t] for the last min(n, cap) rows; grid y
// = 2 writes ring_b from src_b too (a compressor's two rings in one launch).
__global__ void k_ring_write(float *ring, float *ring_b, int64_t cap, int64_t width, const float *src,
                             const float *src_b, int64_t src_stride, int64_t pos0, int n) {
    pdl_enter();
    if (blockIdx.y == 1) {
        ring = ring_b;
        src = src_b;
    }
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= ring_copy_len(n, cap, width)) return;
    int64_t slot, from;
    ring_copy_at(i, n, cap, width, src_stride, pos0, &slot, &from);
    ring[slot] = src[from];
}

// ------------------------------------------------------------ compressor pooling
// Row i (i0 ≤ i < i0+nrows) pools channel c (c < w) of the entries of its
// block (and, for coff 2, the first-half features of the block before):
// softmax of the scores over those entries, weighted sum of the values.
// An entry q comes from this chunk (q ≥ pos0: kv/sc rows q−pos0) or from
// the frontier rings (slot q mod cap).
struct Entries {
    const float *kv, *sc; // chunk rows, width cw
    const float *kv_ring, *sc_ring;
    int64_t cap, cw, pos0;
    __device__ __forceinline__ const float *kvp(int64_t q) const {
        return q >= pos0 ? kv + (q - pos0) * cw : kv_ring + (q % cap) * cw;
    }
    __device__ __forceinline__ const float *scp(int64_t q) const {
        return q >= pos0 ? sc + (q - pos0) * cw : sc_ring + (q % cap) * cw;
    }
};

__global__ void k_comp_pool(Entries e, int r, int coff, int64_t w, int64_t i0, int nrows, float *rows) {
    pdl_enter();
    const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx >= w * nrows) return;
    const int64_t i = i0 + idx / w, c = idx % w;
    const int64_t first = i * r;
    const bool prev = coff == 2 && i > 0;
    const int64_t f = coff == 2 ? w + c : c;
    // pass 1: the maximum score
    float mx = 0.f;
    int n = 0;
    if (prev)
        for (int64_t q = first - r; q < first; q++, n++) {
            float v = e.scp(q)[c];
            if (n == 0 || v > mx) mx = v;
        }
    for (int64_t q = first; q < first + r; q++, n++) {
        float v = e.scp(q)[f];
        if (n == 0 || v > mx) mx = v;
    }
    // pass 2: the sum of the exponentials, in entry order
    float sum = 0.f;
    if (prev)
        for (int64_t q = first - r; q < first; q++) sum = fadd(sum, exp_ref(fsub(e.scp(q)[c], mx)));
    for (int64_t q = first; q < first + r; q++) sum = fadd(sum, exp_ref(fsub(e.scp(q)[f], mx)));
    // pass 3: the weighted values
    float acc = 0.f;
    if (prev)
        for (int64_t q = first - r; q < first; q++)
            acc = fadd(acc, fmul(e.kvp(q)[c], __fdiv_rn(exp_ref(fsub(e.scp(q)[c], mx)), sum)));
    for (int64_t q = first; q < first + r; q++)
        acc = fadd(acc, fmul(e.kvp(q)[f], __fdiv_rn(exp_ref(fsub(e.scp(q)[f], mx)), sum)));
    rows[(i - i0) * w + c] = acc;
}

// k_comp_emit: one compressed row of a decode step in one launch
// (ds4c_comp_emit, DS4C_OPT_COMP_EMIT), a CTA of CE_THREADS: k_comp_pool's
// pooling of row i, k_rmsnorm_ref's normalisation (its sum of squares
// taken by the first 256 threads in its order: the same bits), k_rope's
// rotation of the last rd values at position i·r, the post-processing
// (post 1: fp8_block of the first fp8_n values, k_fp8_sim's; post 2:
// had_regs<4, true> of the row's 128 values by warp 0, k_hadamard_w's with
// the FP4 simulation), the row stored at out, and then (kv_ring set) the
// chunk's n entries copied into the frontier rings as k_ring_write does —
// after every read of the rings. The pooling is a chain of dependent
// latencies (k_comp_pool: ≈ 8.4 µs for one row alone, one thread a channel
// going three times over its entries, each address with a 64-bit modulo),
// so here, when a row has at most CE_NE entries (ratio 4), CE_NE lanes take
// a channel, lane k entry k: one load of its score and value, the maximum
// by shuffles (any order gives the same exponentials: x − (±0) is x), one
// exponential and one division a lane, and the sums, which k_comp_pool adds
// in entry order, added in that order from shuffles. More entries (ratio
// 128): a thread a channel, k_comp_pool's loops. The entries' addresses
// are computed once a CTA, and the norm weights and rotation frequencies
// loaded (a thread each: w ≤ CE_THREADS), before the wait for the kernel
// before.
constexpr int CE_THREADS = 1024, CE_MAXW = 1024, CE_NE = 8, CE_MAXE = 256, CE_NORM = 256;
static_assert(CE_MAXW <= CE_THREADS, "k_comp_emit: a thread a channel after the pooling");
__global__ void __launch_bounds__(CE_THREADS) k_comp_emit(Entries e, int r, int coff, int w, int64_t i, float *out,
                                                          const float *nw, float eps, const float *freqs, int rd,
                                                          int post, int fp8_n, float had_scale, float *kv_ring,
                                                          float *sc_ring, int n) {
    pdl_launch();
    __shared__ float s_row[CE_MAXW];
    __shared__ const float *s_kvp[CE_MAXE], *s_scp[CE_MAXE];
    const int tid = threadIdx.x;
    const int64_t first = i * r;
    const bool prev = coff == 2 && i > 0;
    const int ne = prev ? 2 * r : r; // entries q0 … q0 + ne − 1
    const int64_t q0 = prev ? first - r : first;
    for (int k = tid; k < ne; k += CE_THREADS) {
        const int64_t q = q0 + k;
        s_kvp[k] = e.kvp(q);
        s_scp[k] = e.scp(q);
    }
    const float nwc = nw && tid < w ? nw[tid] : 1.f, fq = tid < rd / 2 ? freqs[tid] : 0.f;
    pdl_wait();
    __syncthreads();
    // entry k's channel: c for the block before (prev, k < r), else f
    const int lo = prev ? r : 0, fo = coff == 2 ? w : 0;
    if (ne <= CE_NE) {
        constexpr int CPP = CE_THREADS / CE_NE; // channels a pass
        const int k = tid % CE_NE, base = (tid & 31) - k;
        const bool live = k < ne;
#pragma unroll 2
        for (int c0 = 0; c0 < w; c0 += CPP) {
            const int c = c0 + tid / CE_NE; // (w % CPP == 0: whole warps)
            const int col = k < lo ? c : fo + c;
            const float sv = live ? s_scp[k][col] : 0.f, kv = live ? s_kvp[k][col] : 0.f;
            float mx = live ? sv : -INFINITY;
#pragma unroll
            for (int o = 1; o < CE_NE; o <<= 1) {
                const float y = __shfl_xor_sync(FULL_MASK, mx, o);
                mx = y > mx ? y : mx;
            }
            const float ex = live ? exp_ref(fsub(sv, mx)) : 0.f;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < CE_NE; j++) {
                const float y = __shfl_sync(FULL_MASK, ex, base + j);
                if (j < ne) sum = fadd(sum, y);
            }
            const float term = live ? fmul(kv, __fdiv_rn(ex, sum)) : 0.f;
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < CE_NE; j++) {
                const float y = __shfl_sync(FULL_MASK, term, base + j);
                if (j < ne) acc = fadd(acc, y);
            }
            if (k == 0) s_row[c] = acc;
        }
    } else {
        for (int c = tid; c < w; c += CE_THREADS) {
            const int f = fo + c;
            auto col = [&](int k) { return k < lo ? c : f; };
            float mx = 0.f;
            for (int k = 0; k < ne; k++) {
                const float v = s_scp[k][col(k)];
                if (k == 0 || v > mx) mx = v;
            }
            float sum = 0.f;
            for (int k = 0; k < ne; k++) sum = fadd(sum, exp_ref(fsub(s_scp[k][col(k)], mx)));
            float acc = 0.f;
            for (int k = 0; k < ne; k++)
                acc = fadd(acc, fmul(s_kvp[k][col(k)], __fdiv_rn(exp_ref(fsub(s_scp[k][col(k)], mx)), sum)));
            s_row[c] = acc;
        }
    }
    __syncthreads(); // the row is pooled; every read of the rings is done
    // k_rmsnorm_ref's sum of squares: its 256 threads' strided sums, then
    // block_sum_d (the other warps add zeros after the first eight)
    double ss = 0;
    if (tid < CE_NORM)
        for (int c = tid; c < w; c += CE_NORM) ss += (double)s_row[c] * (double)s_row[c];
    ss = block_sum_d(ss);
    const float rs = rms_from_sumsq(ss, w, eps);
    if (tid < w) { // (channel tid: w ≤ CE_THREADS)
        const float v = fmul(s_row[tid], rs);
        s_row[tid] = nw ? fmul(nwc, v) : v;
    }
    __syncthreads();
    if (tid < rd / 2) rope_pair(s_row + (w - rd) + 2 * tid, (float)first, fq, 0);
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31;
    if (post == 1) {
        for (int b = warp; b < fp8_n / 64; b += CE_THREADS / 32) fp8_block(s_row + 64 * b, lane);
    } else if (post == 2 && warp == 0) {
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = s_row[4 * lane + k];
        had_regs<4, true>(v, lane, had_scale);
#pragma unroll
        for (int k = 0; k < 4; k++) s_row[4 * lane + k] = v[k];
    }
    __syncthreads();
    for (int c = tid; c < w; c += CE_THREADS) out[c] = s_row[c];
    if (kv_ring) { // (k_ring_write's copy of both rings)
        for (int64_t x = tid; x < ring_copy_len(n, e.cap, e.cw); x += CE_THREADS) {
            int64_t slot, from;
            ring_copy_at(x, n, e.cap, e.cw, e.cw, e.pos0, &slot, &from);
            kv_ring[slot] = e.kv[from];
            sc_ring[slot] = e.sc[from];
        }
    }
}

// ------------------------------------------------------------ indexer scores
// scores[t][i] = Σ_h relu(q_t,h · k_i)·w_t,h for i < (pos0+t+1)/ratio, the
// dots in dot_ref's order and the heads added in order. One CTA per (token,
// IX_ROWS rows): the token's IH query heads and the rows are staged in
// shared memory (rows padded by 4 floats: conflict-free float4 reads), one
// thread per (row, head) dot, then one thread per row adds the heads.
constexpr int IX_ROWS = 32;

__device__ __forceinline__ float dot4_ref(const float *a, const float *b, int n) { // n % 4 == 0, 16-byte aligned
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll 4
    for (int i = 0; i < n; i += 4) {
        const float4 x = *(const float4 *)(a + i), y = *(const float4 *)(b + i);
        s0 = fadd(s0, fmul(x.x, y.x));
        s1 = fadd(s1, fmul(x.y, y.y));
        s2 = fadd(s2, fmul(x.z, y.z));
        s3 = fadd(s3, fmul(x.w, y.w));
    }
    return fadd(fadd(s0, s1), fadd(s2, s3));
}

// Register-tiled dots of ATS_A rows of A against ATS_B rows of B (length
// D, D % ATS_SL == 0), for the chunk forms of the attention and indexer
// scores: each thread takes ATS_R rows of A × ATS_R rows of B (A rows
// ag·ATS_R + i, B rows bg + 16·j), every dot kept as its four running sums
// (dot4_ref's operations and order, which are backend/cpu's). D goes by in
// slices of ATS_SL values staged in shared memory (two stages; the next
// slice's loads sit in registers while the current one is summed), so a
// thread loads ATS_R A and ATS_R B float4s for ATS_R² dots: 16 arithmetic
// instructions per shared load, where k_attn_scores<2> had 5 and was bound
// by shared-memory wavefronts (cuda/NOTES.md v11). The caller fills row[]
// (A rows, then B rows; stand-in rows for the ones past its counts, whose
// dots it does not store) and synchronises before the call; the stages are
// free again when it returns.
constexpr int ATS_R = 4, ATS_A = 64, ATS_B = 64, ATS_SL = 32, ATS_LD = ATS_SL + 4;
constexpr int ATS_T = (ATS_A / ATS_R) * (ATS_B / ATS_R); // 256 threads
constexpr int ATS_C4 = ATS_SL / 4;
constexpr int ATS_V = (ATS_A + ATS_B) * ATS_C4 / ATS_T; // float4 loads per thread per slice
static_assert((ATS_A + ATS_B) * ATS_C4 % ATS_T == 0, "slice loads split evenly");

struct TileSmem {
    float a[2][ATS_A * ATS_LD];
    float b[2][ATS_B * ATS_LD];
    const float *row[ATS_A + ATS_B]; // A rows, then B rows
};

// TC (fast mode only): the same slices multiplied on the tensor cores
// (TF32 mma.sync m16n8k8; each operand split into two TF32 terms and the
// three larger cross products summed, ≈ 2^-21 of Σ|a·b| from the exact
// dots): warp w takes A rows 16·(w&3) … +16 against B rows 32·(w>>2) … +32.
// The dots then pass through shared memory into acc[i][j][0] of the thread
// that owns dot (i, j) in the exact layout (the other three sums 0), so the
// callers read either form the same way.
// CP (DS4C_OPT_ATTN_TILE 2, the chunk attention's scores): the next slice
// goes to its stage by cp.async, requested as the current one's sums
// start, instead of through registers: at the 128-register cap the
// compiler had sunk the register loads to just before their stores, so
// each slice waited a full L2 round trip (ncu, cuda/NOTES.md v80: 10.4 %
// of k_attn_scores_tile's stall samples on that store, long scoreboard).
// The same values staged, so the same dots.
template <bool TC, bool CP = false>
__device__ __forceinline__ void tile_dots(TileSmem &sm, int D, float (&acc)[ATS_R][ATS_R][4]) {
    static_assert(ATS_T == 256 && ATS_A == 64 && ATS_B == 64 && ATS_SL % 8 == 0, "the mma layout: 8 warps, 64 × 64 dots");
    const int tid = threadIdx.x;
    float4 v[ATS_V];
    auto fetch = [&](int c0) {
#pragma unroll
        for (int u = 0; u < ATS_V; u++) {
            const int f = tid + ATS_T * u;
            v[u] = __ldg((const float4 *)(sm.row[f / ATS_C4] + c0) + f % ATS_C4);
        }
    };
    auto stash = [&](int st) {
#pragma unroll
        for (int u = 0; u < ATS_V; u++) {
            const int f = tid + ATS_T * u, r = f / ATS_C4;
            float *d = r < ATS_A ? &sm.a[st][r * ATS_LD] : &sm.b[st][(r - ATS_A) * ATS_LD];
            *(float4 *)(d + 4 * (f % ATS_C4)) = v[u];
        }
    };
    const int ag = tid / (ATS_B / ATS_R), bg = tid % (ATS_B / ATS_R);
#pragma unroll
    for (int i = 0; i < ATS_R; i++)
#pragma unroll
        for (int j = 0; j < ATS_R; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    const int lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int ma = 16 * (warp & 3), nb = 32 * (warp >> 2);
    float c[4][4]; // TC: the warp's 4 tiles of 16 A rows × 8 B rows
#pragma unroll
    for (int j = 0; j < 4; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
    // CP: slice c0's copies into stage st, one group a thread
    auto copy = [&](int c0, int st) {
#pragma unroll
        for (int u = 0; u < ATS_V; u++) {
            const int f = tid + ATS_T * u, r = f / ATS_C4;
            float *d = r < ATS_A ? &sm.a[st][r * ATS_LD] : &sm.b[st][(r - ATS_A) * ATS_LD];
            cp_async16(d + 4 * (f % ATS_C4), (const float4 *)(sm.row[r] + c0) + f % ATS_C4);
        }
        cp_async_commit();
    };
    if constexpr (CP) {
        copy(0, 0);
        cp_async_wait<0>();
    } else {
        fetch(0);
        stash(0);
    }
    __syncthreads();
    const int ns = D / ATS_SL;
    for (int sl = 0; sl < ns; sl++) {
        const int st = sl & 1;
        if (sl + 1 < ns) {
            if constexpr (CP)
                copy((sl + 1) * ATS_SL, st ^ 1);
            else
                fetch((sl + 1) * ATS_SL);
        }
        if constexpr (TC) {
#pragma unroll
            for (int kk = 0; kk < ATS_SL; kk += 8) {
                const float *pa = &sm.a[st][(ma + gid) * ATS_LD + kk + tig];
                uint32_t ah[4], al[4];
                tf32_split(pa[0], ah[0], al[0]);
                tf32_split(pa[8 * ATS_LD], ah[1], al[1]);
                tf32_split(pa[4], ah[2], al[2]);
                tf32_split(pa[8 * ATS_LD + 4], ah[3], al[3]);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float *pb = &sm.b[st][(nb + 8 * j + gid) * ATS_LD + kk + tig];
                    uint32_t b0h, b0l, b1h, b1l;
                    tf32_split(pb[0], b0h, b0l);
                    tf32_split(pb[4], b1h, b1l);
                    mma_tf32(c[j], al, b0h, b1h); // the small terms first
                    mma_tf32(c[j], ah, b0l, b1l);
                    mma_tf32(c[j], ah, b0h, b1h);
                }
            }
        } else {
            const float *ab = &sm.a[st][ag * ATS_R * ATS_LD], *bb = &sm.b[st][bg * ATS_LD];
#pragma unroll
            for (int c4 = 0; c4 < ATS_SL; c4 += 4) {
                float4 x[ATS_R], y[ATS_R];
#pragma unroll
                for (int i = 0; i < ATS_R; i++) x[i] = *(const float4 *)(ab + i * ATS_LD + c4);
#pragma unroll
                for (int j = 0; j < ATS_R; j++) y[j] = *(const float4 *)(bb + j * (ATS_B / ATS_R) * ATS_LD + c4);
#pragma unroll
                for (int i = 0; i < ATS_R; i++)
#pragma unroll
                    for (int j = 0; j < ATS_R; j++) {
                        acc[i][j][0] = fadd(acc[i][j][0], fmul(x[i].x, y[j].x));
                        acc[i][j][1] = fadd(acc[i][j][1], fmul(x[i].y, y[j].y));
                        acc[i][j][2] = fadd(acc[i][j][2], fmul(x[i].z, y[j].z));
                        acc[i][j][3] = fadd(acc[i][j][3], fmul(x[i].w, y[j].w));
                    }
            }
        }
        if (sl + 1 < ns) {
            if constexpr (CP)
                cp_async_wait<0>();
            else
                stash(st ^ 1);
        }
        __syncthreads();
    }
    if constexpr (TC) {
        float *dots = &sm.a[0][0]; // [ATS_A][ATS_B + 1], the stages are free now
        static_assert(ATS_A * (ATS_B + 1) <= 2 * ATS_A * ATS_LD, "the dots fit the A stages");
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dots[(ma + gid + 8 * (e >> 1)) * (ATS_B + 1) + nb + 8 * j + 2 * tig + (e & 1)] = c[j][e];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATS_R; i++)
#pragma unroll
            for (int j = 0; j < ATS_R; j++) acc[i][j][0] = dots[(ag * ATS_R + i) * (ATS_B + 1) + bg + j * (ATS_B / ATS_R)];
        __syncthreads();
    }
}

// the A row (ag·ATS_R + i) and B row (bg + 16·j) of a thread's dot (i, j)
__device__ __forceinline__ int tile_arow(int i) { return (threadIdx.x / (ATS_B / ATS_R)) * ATS_R + i; }
__device__ __forceinline__ int tile_brow(int j) { return threadIdx.x % (ATS_B / ATS_R) + j * (ATS_B / ATS_R); }
__device__ __forceinline__ float tile_sum(const float (&s)[4]) { return fadd(fadd(s[0], s[1]), fadd(s[2], s[3])); }

// index_weighted is a compressed row's indexer score from its per-head
// dots d[0..IH): Σ_h w_h·d_h over the heads with d_h > 0, in head order.
__device__ __forceinline__ float index_weighted(const float *d, const float *w, int IH) {
    float sum = 0.f;
    for (int h = 0; h < IH; h++)
        if (d[h] > 0.f) sum = fadd(sum, fmul(d[h], w[h]));
    return sum;
}

__global__ void __launch_bounds__(256) k_index_scores(const float *q, const float *w, const float *rows, int IH, int IHD,
                                                      int64_t pos0, int ratio, float *scores, int64_t sc_stride) {
    pdl_enter();
    extern __shared__ float s_ix[];
    const int t = blockIdx.y, tid = threadIdx.x;
    const int64_t R = (pos0 + t + 1) / ratio;
    const int64_t i0 = (int64_t)blockIdx.x * IX_ROWS;
    if (i0 >= R) return;
    const int nr = (int)min((int64_t)IX_ROWS, R - i0);
    const int ld = IHD + 4, v4 = IHD / 4;
    float *sq = s_ix, *sk = s_ix + IH * ld, *sd = sk + IX_ROWS * ld; // sd: [IX_ROWS][IH+1]
    const float *qt = q + (int64_t)t * IH * IHD;
    for (int i = tid; i < IH * v4; i += blockDim.x)
        *(float4 *)&sq[(i / v4) * ld + 4 * (i % v4)] = ((const float4 *)qt)[i];
    for (int i = tid; i < nr * v4; i += blockDim.x)
        *(float4 *)&sk[(i / v4) * ld + 4 * (i % v4)] = ((const float4 *)(rows + i0 * IHD))[i];
    __syncthreads();
    for (int i = tid; i < nr * IH; i += blockDim.x) {
        const int r = i / IH, h = i % IH;
        sd[r * (IH + 1) + h] = dot4_ref(sq + h * ld, sk + r * ld, IHD);
    }
    __syncthreads();
    if (tid < nr) scores[t * sc_stride + i0 + tid] = index_weighted(sd + tid * (IH + 1), w + (int64_t)t * IH, IH);
}

// Indexer scores of a chunk through tile_dots: a CTA takes one token's
// query heads (A, IH <= ATS_A) and ATS_B compressed rows (B); the dots go
// to shared memory and the row's thread adds w_h·max(dot, 0) over the heads
// in order. Same bits as k_index_scores (TC: fast mode, tile_dots on the
// tensor cores).
template <bool TC>
__global__ void __launch_bounds__(ATS_T, 2) k_index_scores_tile(const float *q, const float *w, const float *rows, int IH,
                                                               int IHD, int64_t pos0, int ratio, float *scores,
                                                               int64_t sc_stride) {
    pdl_enter();
    __shared__ __align__(16) TileSmem sm;
    const int t = blockIdx.y, tid = threadIdx.x;
    const int64_t R = (pos0 + t + 1) / ratio;
    const int64_t i0 = (int64_t)blockIdx.x * ATS_B;
    if (i0 >= R) return;
    const int nr = (int)min((int64_t)ATS_B, R - i0);
    if (tid < ATS_A) sm.row[tid] = q + ((int64_t)t * IH + min(tid, IH - 1)) * IHD;
    else if (tid < ATS_A + ATS_B) sm.row[tid] = rows + (i0 + min(tid - ATS_A, nr - 1)) * IHD;
    __syncthreads();
    float acc[ATS_R][ATS_R][4];
    tile_dots<TC>(sm, IHD, acc);
    float *sd = &sm.a[0][0]; // [ATS_B][ATS_A + 1], the stages are free now
    static_assert(ATS_B * (ATS_A + 1) <= 2 * ATS_A * ATS_LD, "the dots fit the A stages");
#pragma unroll
    for (int i = 0; i < ATS_R; i++)
#pragma unroll
        for (int j = 0; j < ATS_R; j++) sd[tile_brow(j) * (ATS_A + 1) + tile_arow(i)] = tile_sum(acc[i][j]);
    __syncthreads();
    if constexpr (TC) { // fast mode: 4 threads a row, each a quarter of the heads, then two shuffles
        static_assert(ATS_T == 4 * ATS_B, "4 threads a row");
        const int r = tid >> 2, q = tid & 3, hq = (IH + 3) / 4;
        const float *d = sd + r * (ATS_A + 1), *wt = w + (int64_t)t * IH;
        float sum = 0.f;
        for (int h = q * hq; h < min(IH, (q + 1) * hq); h++)
            if (d[h] > 0.f) sum = fmaf(d[h], __ldg(wt + h), sum);
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        if (q == 0 && r < nr) scores[t * sc_stride + i0 + r] = sum;
        return;
    }
    if (tid < nr) scores[t * sc_stride + i0 + tid] = index_weighted(sd + tid * (ATS_A + 1), w + (int64_t)t * IH, IH);
}

// Fast mode's indexer scores of a chunk (8 or more tokens) on the f16
// tensor cores, for IH == IF_IH heads of IHD == IF_HD (Flash's 64 × 128),
// instead of k_index_scores_tile<true>'s two-term TF32 products (one token
// and 64 rows a CTA, both re-read from L2 by every CTA). The indexer's
// queries and compressed rows went through the FP4 simulation (e2m1 values
// times a power-of-two block scale), which f16 holds exactly for block
// scales from 2^-23 to 2^13: their products are then exact and only the
// float sums round, as in the TF32 form. A CTA takes IF_TT tokens: their
// queries rounded to f16 once into shared memory; the compressed rows go by
// in tiles of IF_RB (rounded to f16 as they are staged), each multiplied
// on mma m16n8k16 (warp w: token (w%4)/2, heads 32·(w%2) … +32 against
// rows 64·(w/4) … +64 of the tile); each thread adds max(dot, 0)·w_h over
// its 4 heads, shuffles add the warp's 32 heads, and shared memory the two
// halves. TestIndexScores holds it to FP4-simulated inputs as tightly as
// the TF32 form.
constexpr int IF_IH = 64, IF_HD = 128, IF_TT = 2, IF_RB = 128, IF_T = 256;
constexpr int IF_LD = IF_HD + 8;     // halves per staged row (272 bytes: ldmatrix rows conflict-free)
constexpr int IF_AR = IF_TT * IF_IH; // staged query rows
constexpr size_t IF_SMEM = (size_t)(IF_AR + IF_RB) * IF_LD * 2 + (size_t)2 * IF_TT * IF_RB * sizeof(float);
static_assert(IF_T == 256 && IF_TT == 2 && IF_RB == 128 && IF_IH == 64 && IF_HD % 16 == 0 && IF_TT * IF_RB == IF_T,
              "the warp layout: 8 warps, 2 tokens × 2 head halves × 2 row halves");

// Exact mode's tensor-core indexer (k_index_flash_exact) keeps a dot of a
// query head and a compressed row where it is exact, and so dot4_ref's
// bits whatever order the tensor cores add the products in. The indexer's
// queries and rows are FP4-simulated (backend/cpu/indexer.go: e2m1 values
// of IXF_MB = 1 mantissa bit, times a power-of-two block scale). If every
// value of a row has at most IXF_MB mantissa bits and its nonzero values'
// exponent fields lie in [emin, emax], the values are multiples of
// 2^(emin − 127 − IXF_MB) below 2^(emax − 126); the products of two rows
// are multiples of 2^(ea_min + eb_min − 254 − 2·IXF_MB), and a sum of any
// D = 2^lg of them lies below 2^(ea_max + eb_max − 254 + 2 + lg). Float
// holds every such multiple exactly when the two exponents are at most 24
// apart: span_a + span_b ≤ 24 − 2 − lg − 2·IXF_MB (IFX_LIM; span = emax −
// emin). Then every product and every partial sum, in any order and
// grouping, is exact, as long as the adder keeps float's 24 bits below its
// largest addend's leading bit (the tensor cores' FP32 accumulation,
// measured: TestIndexScoresExact). f16 must hold the values too: e2m1's
// 1.1b·2^e for e from -23 (its last bit 2^-24, f16's least) to 15.
//
// ifx_span is a row's span, for IF_HD values that the 32 lanes of a warp
// hold a float4 each (warp-collective): the largest nonzero value's
// exponent field less the smallest's (one below for a power of two: m − 1
// passes over zeros; 0 for a row of zeros), or IFX_BAD where a value has
// more mantissa bits than e2m1's or lies where f16 does not hold such
// values (below 2^-23, at or past 2^16; inf, NaN, subnormal floats).
constexpr int IXF_MB = 1;                               // FP4's e2m1: 1.5 = 1.1b, one mantissa bit
constexpr uint32_t IXF_MANT = (1u << (23 - IXF_MB)) - 1u; // the mantissa bits below them
constexpr int IFX_BAD = 64;
constexpr int IFX_LIM = 24 - 2 - 7 - 2 * IXF_MB; // 13, for ⌈log2 IF_HD⌉ = 7
static_assert(IF_HD == 128, "IFX_LIM's log2 of the dot's length");
__device__ __forceinline__ int ifx_span(float4 v) {
    const uint32_t b[4] = {__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z), __float_as_uint(v.w)};
    uint32_t umax = 0u, kmin = 0xffffffffu, mant = 0u;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t m = b[k] & 0x7fffffffu;
        umax = max(umax, m);
        kmin = min(kmin, m - 1u); // (passes over zeros)
        mant |= b[k];
    }
    umax = __reduce_max_sync(FULL_MASK, umax);
    kmin = __reduce_min_sync(FULL_MASK, kmin);
    mant = __reduce_or_sync(FULL_MASK, mant);
    if (umax == 0u) return 0;
    const int emax = (int)(umax >> 23), emin = (int)(kmin >> 23);
    // f16: e2m1 values 1.1b·2^e exact for e from -23 (the last bit 2^-24) to 15
    if ((mant & IXF_MANT) != 0u || emin < 127 - 23 || emax > 127 + 15) return IFX_BAD;
    return emax - emin;
}

// if_queries stages TT tokens' queries from token t0 (a missing token:
// the last one's again, its scores not stored) as f16 rows of sa, NT
// threads.
// With spans (exact mode's k_index_flash_exact) each staged row's
// ifx_span goes to spans[r] too (a row is one warp's 32 float4s: NT a
// multiple of 32, the loop warp-uniform).
template <int TT, int NT>
__device__ __forceinline__ void if_queries(__half *sa, const float *q, int t0, int ntk, int tid, int8_t *spans = nullptr) {
    for (int i = tid; i < TT * IF_IH * IF_HD / 4; i += NT) {
        const int r = i / (IF_HD / 4), c = i % (IF_HD / 4), tt = min(r / IF_IH, ntk - 1), h = r % IF_IH;
        const float4 v = __ldg((const float4 *)(q + ((int64_t)(t0 + tt) * IF_IH + h) * IF_HD) + c);
        *(uint2 *)(sa + r * IF_LD + 4 * c) = half4_bits(v);
        if (spans) {
            const int s = ifx_span(v);
            if (c == 0) spans[r] = (int8_t)s;
        }
    }
}

// if_rows stages IF_RB compressed rows from row i0 (rows past rmax: the
// last row again) as f16 rows of sb, IF_T threads, U float4 loads unrolled
// (a warp a row); SP (exact mode's k_index_flash_exact): each row's
// ifx_span goes to spans[r] too (a template flag, not if_queries' null
// test: the measured kernels' SASS stays as it was, v78).
template <int U, bool SP = false>
__device__ __forceinline__ void if_rows(__half *sb, const float *rows, int64_t i0, int64_t rmax, int tid,
                                        int8_t *spans = nullptr) {
    static_assert(IF_HD / 4 == 32, "a warp a row");
#pragma unroll U
    for (int u = 0; u < IF_RB * IF_HD / 4 / IF_T; u++) {
        const int i = tid + IF_T * u, r = i / (IF_HD / 4), c = i % (IF_HD / 4);
        const int64_t row = min(i0 + r, rmax - 1);
        const float4 v = __ldg((const float4 *)(rows + row * IF_HD) + c);
        *(uint2 *)(sb + r * IF_LD + 4 * c) = half4_bits(v);
        if constexpr (SP) {
            const int sp = ifx_span(v);
            if (c == 0) spans[r] = (int8_t)sp;
        }
    }
}

// if_weights loads the weights of the thread's heads 32hh + 16mt + 8hi + g
// of token t into wh[mt][hi].
__device__ __forceinline__ void if_weights(float (&wh)[2][2], const float *w, int t, int hh, int g) {
    const float *wt = w + (int64_t)t * IF_IH + 32 * hh + g;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) wh[mt][hi] = __ldg(wt + 16 * mt + 8 * hi);
}

// if_dots is a warp's dots of a tile: its 32 heads (pa: its ldmatrix row
// of them) against rows 64bh … 64bh + 63 of the staged rows sb (brow, bcol:
// its ldmatrix row and column of them). acc[mt][j][2hi + c]: head 32hh +
// 16mt + 8hi + g, row 64bh + 8j + 2q4 + c.
__device__ __forceinline__ void if_dots(const __half *pa, const __half *sb, int bh, int brow, int bcol,
                                        float (&acc)[2][8][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < IF_HD / 16; ks++) {
        uint32_t A0[4], A1[4];
        ldsm_x4<false>(A0, pa + 16 * ks);
        ldsm_x4<false>(A1, pa + 16 * IF_LD + 16 * ks);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t B[4];
            ldsm_x4<false>(B, sb + (64 * bh + 16 * np + brow) * IF_LD + 16 * ks + bcol);
            mma_f16(acc[0][2 * np], A0, B[0], B[1]);
            mma_f16(acc[0][2 * np + 1], A0, B[2], B[3]);
            mma_f16(acc[1][2 * np], A1, B[0], B[1]);
            mma_f16(acc[1][2 * np + 1], A1, B[2], B[3]);
        }
    }
}

// if_sums adds each of the warp's rows' max(dot, 0)·w_h over its 32 heads
// (the thread's four, then the lanes' by shuffles) and has the lanes of
// g == 0 store them at sr (the warp's rows in the head half's sums:
// sr[8j + c] for row 64bh + 8j + 2q4 + c).
__device__ __forceinline__ void if_sums(const float (&acc)[2][8][4], const float (&wh)[2][2], float *sr, int g) {
    float part[8][2];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float s = 0.f;
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hi = 0; hi < 2; hi++) s = fmaf(fmaxf(acc[mt][j][2 * hi + c], 0.f), wh[mt][hi], s);
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) s += __shfl_xor_sync(FULL_MASK, s, off);
            part[j][c] = s;
        }
    if (g == 0)
#pragma unroll
        for (int j = 0; j < 8; j++) *(float2 *)(sr + 8 * j) = make_float2(part[j][0], part[j][1]);
}

// rblk (a multiple of IF_RB): the rows a CTA walks, blockIdx.y the run
// (a small chunk deep in a long context: its few token pairs would each
// walk every row in one CTA, a wave far from full; DS4C_OPT_IX_FLASH_SPLIT).
// Each score is computed by the same operations whichever CTA takes it.
__global__ void __launch_bounds__(IF_T, 2) k_index_flash(const float *q, const float *w, const float *rows, int64_t pos0,
                                                         int ratio, int n, float *scores, int64_t sc_stride,
                                                         int64_t rblk) {
    pdl_enter();
    extern __shared__ __align__(16) uint8_t s_if[];
    __half *sa = (__half *)s_if, *sb = sa + IF_AR * IF_LD;
    float *sred = (float *)(sb + IF_RB * IF_LD); // [head half][token][row]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = blockIdx.x * IF_TT, ntk = min(IF_TT, n - t0);
    const int64_t rmax = (pos0 + t0 + ntk) / ratio; // the CTA's last token has the most rows
    const int64_t ib = (int64_t)blockIdx.y * rblk, ie = min(rmax, ib + rblk); // this CTA's rows
    if (ib >= rmax) return;
    if_queries<IF_TT, IF_T>(sa, q, t0, ntk, tid);
    const int g = lane >> 2, q4 = lane & 3, tt = (warp & 3) >> 1, hh = warp & 1, bh = warp >> 2;
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4); // ldmatrix: A rows
    const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1); // ldmatrix: B rows (compressed rows)
    float wh[2][2];
    if_weights(wh, w, t0 + min(tt, ntk - 1), hh, g);
    const __half *pa = sa + (IF_IH * tt + 32 * hh + lrow) * IF_LD + lcol;
    for (int64_t i0 = ib; i0 < ie; i0 += IF_RB) {
        if (i0 > ib) __syncthreads(); // the previous tile's rows and sums are consumed
        if_rows<8>(sb, rows, i0, rmax, tid);
        __syncthreads();
        float acc[2][8][4];
        if_dots(pa, sb, bh, brow, bcol, acc);
        if_sums(acc, wh, sred + (hh * IF_TT + tt) * IF_RB + 64 * bh + 2 * q4, g);
        __syncthreads();
        const int st = tid / IF_RB, r = tid % IF_RB, t = t0 + st;
        if (st < ntk && i0 + r < (pos0 + t + 1) / ratio)
            scores[(int64_t)t * sc_stride + i0 + r] = sred[st * IF_RB + r] + sred[(IF_TT + st) * IF_RB + r];
    }
}

// k_index_flash2 is k_index_flash for chunks whose rows are many (DS4C_OPT_IX_FLASH
// 2): every CTA of k_index_flash re-reads its token pair's rows as floats
// and rounds them to f16 while the tensor cores wait (at 128k a 4096-token
// chunk read ≈ 32 GB a layer from L2, 10.5 ms; cuda/NOTES.md v51). Here the
// rows come as f16 copies (rounded once a chunk by ds4c_index_scores, in
// stream-ordered scratch: the same values, f16 holds them exactly), a CTA
// takes IF2_TT = 4 tokens (16 warps: token × head half × row half, each
// warp k_index_flash's work on the same operands), and the next tile's rows
// are copied by cp.async into the other of two buffers while the current
// one is multiplied. Every score is formed by the same operations in the
// same order as k_index_flash's: the same bits.
constexpr int IF2_TT = 4, IF2_T = 512, IF2_AR = IF2_TT * IF_IH;
constexpr size_t IF2_SMEM = (size_t)(IF2_AR + 2 * IF_RB) * IF_LD * 2 + (size_t)2 * IF2_TT * IF_RB * sizeof(float);
static_assert(IF2_TT * IF_RB == IF2_T && IF_RB * (IF_HD / 8) % IF2_T == 0, "a thread a (token, row) score; whole copies");

__global__ void __launch_bounds__(IF2_T, 1) k_index_flash2(const float *q, const float *w, const __half *rows,
                                                           int64_t pos0, int ratio, int n, float *scores,
                                                           int64_t sc_stride, int64_t rblk) {
    pdl_enter();
    extern __shared__ __align__(16) uint8_t s_if[];
    __half *sa = (__half *)s_if, *sbuf = sa + IF2_AR * IF_LD; // sbuf: two tiles of IF_RB rows
    float *sred = (float *)(sbuf + 2 * IF_RB * IF_LD);        // [head half][token][row]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = blockIdx.x * IF2_TT, ntk = min(IF2_TT, n - t0);
    const int64_t rmax = (pos0 + t0 + ntk) / ratio; // the CTA's last token has the most rows
    const int64_t ib = (int64_t)blockIdx.y * rblk, ie = min(rmax, ib + rblk); // this CTA's rows
    if (ib >= rmax) return;
    // tile i0's rows into buffer sb (rows past rmax: the last row again)
    auto issue = [&](int64_t i0, __half *sb) {
#pragma unroll
        for (int u = 0; u < IF_RB * (IF_HD / 8) / IF2_T; u++) {
            const int i = tid + IF2_T * u, r = i / (IF_HD / 8), c = i % (IF_HD / 8);
            const int64_t row = min(i0 + r, rmax - 1);
            cp_async16(sb + r * IF_LD + 8 * c, rows + row * IF_HD + 8 * c);
        }
        cp_async_commit();
    };
    issue(ib, sbuf);
    if_queries<IF2_TT, IF2_T>(sa, q, t0, ntk, tid);
    const int g = lane >> 2, q4 = lane & 3, tt = warp >> 2, hh = warp & 1, bh = (warp >> 1) & 1;
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4); // ldmatrix: A rows
    const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1); // ldmatrix: B rows (compressed rows)
    float wh[2][2];
    if_weights(wh, w, t0 + min(tt, ntk - 1), hh, g);
    const __half *pa = sa + (IF_IH * tt + 32 * hh + lrow) * IF_LD + lcol;
    int buf = 0;
    for (int64_t i0 = ib; i0 < ie; i0 += IF_RB, buf ^= 1) {
        const __half *sb = sbuf + buf * IF_RB * IF_LD;
        if (i0 + IF_RB < ie) { // the next tile's copies in flight (its buffer's last reader passed the barrier below)
            issue(i0 + IF_RB, sbuf + (buf ^ 1) * IF_RB * IF_LD);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); // this tile's rows (and the queries) are in
        float acc[2][8][4];
        if_dots(pa, sb, bh, brow, bcol, acc);
        if_sums(acc, wh, sred + (hh * IF2_TT + tt) * IF_RB + 64 * bh + 2 * q4, g);
        __syncthreads(); // the tile's sums are in; its rows are read
        const int st = tid / IF_RB, r = tid % IF_RB, t = t0 + st;
        if (st < ntk && i0 + r < (pos0 + t + 1) / ratio)
            scores[(int64_t)t * sc_stride + i0 + r] = sred[st * IF_RB + r] + sred[(IF2_TT + st) * IF_RB + r];
    }
}

// Exact mode's indexer scores of a chunk (8 or more tokens) on the f16
// tensor cores (DS4C_OPT_IX_EXACT): k_index_flash's staging and
// products (two tokens a CTA, tiles of IF_RB rows, if_dots), but each dot
// goes to shared memory and the (token, row)'s thread adds w_h·dot over
// the heads with dot > 0 in head order, in fmul and fadd: index_weighted's
// operations. A dot is the tensor cores' exactly where its query head and
// row pass ifx_span's check (the model's FP4-simulated values: e2m1 times a
// power-of-two block scale, so f16 holds them and every product and partial
// sum is exact in float, whatever order and grouping the tensor cores add
// them in, as long as they keep float's 24 bits of the largest addend);
// where not it is formed again by dot4_ref from global memory: the same
// bits as k_index_scores (EX 1). EX 5 (tests only): such a dot is +inf
// instead, so that a test sees which path each took.
constexpr int IFX_SD = 68; // floats a (token, row)'s dots take: 272-byte rows, conflict-free fragment stores and float4 reads
constexpr size_t IFX_SD_OFF = (size_t)IF_AR * IF_LD * 2; // the dots overlay the rows' tile (read by then) and past it
constexpr size_t IFX_SMEM = IFX_SD_OFF + (size_t)IF_TT * IF_RB * IFX_SD * sizeof(float) + IF_TT * IF_IH * sizeof(float) +
                            IF_AR + IF_RB + 16;
static_assert(IFX_SD_OFF % 16 == 0 && IFX_SMEM <= 113 * 1024, "two CTAs an SM");
static_assert(IF_TT * IF_RB == IF_T, "a thread a (token, row) score");

//
// H (DS4C_OPT_IX_EXACT 2): the rows come as f16 copies with their spans
// (k_ix_rows_half, once a chunk: the same values, f16 holds every row
// that passes), copied into shared memory by cp.async, instead of every
// CTA reading the float rows, rounding them and forming their spans (half
// the bytes read from L2 a tile; as k_index_flash2 for fast mode). rows
// stays the float rows, for the dots formed again.
template <int EX, bool H = false>
__global__ void __launch_bounds__(IF_T, 2) k_index_flash_exact(const float *q, const float *w, const float *rows,
                                                               const __half *rows_h, const int8_t *rows_span,
                                                               int64_t pos0, int ratio, int n, float *scores,
                                                               int64_t sc_stride, int64_t rblk) {
    pdl_enter();
    extern __shared__ __align__(16) uint8_t s_if[];
    __half *sa = (__half *)s_if, *sb = sa + IF_AR * IF_LD;
    float *sd = (float *)(s_if + IFX_SD_OFF);     // [token][row][IFX_SD]: the tile's dots
    float *sw = sd + IF_TT * IF_RB * IFX_SD;      // [token][head]: the weights
    int8_t *sqs = (int8_t *)(sw + IF_TT * IF_IH); // [token][head]: the query heads' spans
    int8_t *srs = sqs + IF_AR;                    // [row]: the tile's rows' spans
    int8_t *sqm = srs + IF_RB;                    // [token]: the largest of its heads' spans
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = blockIdx.x * IF_TT, ntk = min(IF_TT, n - t0);
    const int64_t rmax = (pos0 + t0 + ntk) / ratio; // the CTA's last token has the most rows
    const int64_t ib = (int64_t)blockIdx.y * rblk, ie = min(rmax, ib + rblk); // this CTA's rows
    if (ib >= rmax) return;
    if_queries<IF_TT, IF_T>(sa, q, t0, ntk, tid, sqs);
    if (tid < IF_TT * IF_IH) sw[tid] = __ldg(w + (int64_t)(t0 + min(tid / IF_IH, ntk - 1)) * IF_IH + tid % IF_IH);
    __syncthreads();
    if (tid < IF_TT) {
        int m = 0;
        for (int h = 0; h < IF_IH; h++) m = max(m, (int)sqs[tid * IF_IH + h]);
        sqm[tid] = (int8_t)m;
    }
    const int g = lane >> 2, q4 = lane & 3, tt = (warp & 3) >> 1, hh = warp & 1, bh = warp >> 2;
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4); // ldmatrix: A rows
    const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1); // ldmatrix: B rows (compressed rows)
    const __half *pa = sa + (IF_IH * tt + 32 * hh + lrow) * IF_LD + lcol;
    for (int64_t i0 = ib; i0 < ie; i0 += IF_RB) {
        if (i0 > ib) __syncthreads(); // the previous tile's dots are consumed
        if constexpr (H) { // rows past rmax: the last row again
            // thread: 16-byte piece tid % 16 of rows tid / 16 + 16·u; one
            // shared and one global base, the rows' clamp a 32-bit min
            constexpr int RP = IF_HD / 8, RS = IF_T / RP; // pieces a row, rows a pass
            static_assert(IF_T % RP == 0 && IF_RB % RS == 0 && IF_RB <= IF_T, "whole copies; a thread a row's span");
            const int cr = tid / RP, cc = tid % RP;
            const int lim = (int)(rmax - 1 - i0 - cr); // the last row, from row cr (negative: cr is past it)
            const __half *src = rows_h + (i0 + cr) * IF_HD + 8 * cc;
            __half *dst = sb + cr * IF_LD + 8 * cc;
#pragma unroll
            for (int u = 0; u < IF_RB / RS; u++) cp_async16(dst + RS * u * IF_LD, src + (int64_t)min(RS * u, lim) * IF_HD);
            cp_async_commit();
            if (tid < IF_RB) srs[tid] = __ldg(rows_span + min(i0 + tid, rmax - 1));
            cp_async_wait<0>();
        } else {
            if_rows<4, true>(sb, rows, i0, rmax, tid, srs);
        }
        __syncthreads();
        float acc[2][8][4];
        if_dots(pa, sb, bh, brow, bcol, acc);
        __syncthreads(); // every warp's products are formed: the tile's rows are read
        // acc[mt][j][2hi + c]: head 32hh + 16mt + 8hi + g, row 64bh + 8j + 2q4 + c
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sd[(tt * IF_RB + 64 * bh + 8 * j + 2 * q4 + (e & 1)) * IFX_SD + 32 * hh + 16 * mt + 8 * (e >> 1) + g] =
                        acc[mt][j][e];
        __syncthreads();
        const int st = tid / IF_RB, r = tid % IF_RB, t = t0 + st;
        const int64_t row = i0 + r;
        if (st >= ntk || row >= (pos0 + t + 1) / ratio) continue;
        const float *d = sd + tid * IFX_SD, *wt = sw + st * IF_IH;
        const int rs = srs[r];
        float sum = 0.f;
        if (sqm[st] + rs <= IFX_LIM) { // every head's dot exact
#pragma unroll 4
            for (int h = 0; h < IF_IH; h += 4) {
                const float4 x = *(const float4 *)(d + h);
                if (x.x > 0.f) sum = fadd(sum, fmul(x.x, wt[h]));
                if (x.y > 0.f) sum = fadd(sum, fmul(x.y, wt[h + 1]));
                if (x.z > 0.f) sum = fadd(sum, fmul(x.z, wt[h + 2]));
                if (x.w > 0.f) sum = fadd(sum, fmul(x.w, wt[h + 3]));
            }
        } else {
            for (int h = 0; h < IF_IH; h++) {
                float x = d[h];
                if (sqs[st * IF_IH + h] + rs > IFX_LIM)
                    x = (EX & 4) ? __int_as_float(0x7f800000)
                                 : dot4_ref(q + ((int64_t)t * IF_IH + h) * IF_HD, rows + row * IF_HD, IF_HD);
                if (x > 0.f) sum = fadd(sum, fmul(x, wt[h]));
            }
        }
        scores[(int64_t)t * sc_stride + row] = sum;
    }
}

// k_ix_rows_half writes the f16 copies of R compressed rows of IF_HD
// floats (rh) and their ifx_span (rs), a warp a row, for
// k_index_flash_exact<EX, true>.
__global__ void __launch_bounds__(256) k_ix_rows_half(const float *rows, int64_t R, __half *rh, int8_t *rs) {
    static_assert(IF_HD == 128, "a lane a float4 of the row");
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= R) return; // (a warp's whole: r is the warp's)
    const float4 v = __ldg((const float4 *)(rows + r * IF_HD) + lane);
    *(uint2 *)(rh + r * IF_HD + 4 * lane) = half4_bits(v);
    const int sp = ifx_span(v);
    if (lane == 0) rs[r] = (int8_t)sp;
}

// The same scores, tiled for one query (decode): a CTA takes IXT_ROWS rows,
// one per lane, and every head; warp w the heads w·IXT_HPW + 64·j … (eight
// at a time), so a k row's float4 is loaded once for eight dots and the
// query's float4 is the same address across the warp (a broadcast). The
// staging keeps eight 16-byte loads per thread in flight (k_index_scores'
// strided loop, one at a time). Measured alone on the H200: 18.4 → 9.7 µs
// at 2048 rows (cuda/NOTES.md v8). Each dot keeps
// dot_ref's four running sums; the heads are added in order by the row's
// thread, as in k_index_scores. Needs IH % IXT_HPW == 0.
constexpr int IXT_ROWS = 32, IXT_WARPS = 8, IXT_HPW = 8;

__host__ __device__ constexpr size_t ixt_smem(int IH, int IHD) {
    return ((size_t)IH * IHD + (size_t)IXT_ROWS * (IHD + 4) + (size_t)IXT_ROWS * (IH + 1) + IH) * sizeof(float);
}

// ixt_tile gives the tiled scores kernels' CTA (block blockIdx.x of token
// blockIdx.y's R = (pos0 + t + 1) / ratio rows) its first row i0 and its
// row count nr (IXT_ROWS, fewer at the end); false when the block starts
// past R (the CTA has nothing to score).
__device__ __forceinline__ bool ixt_tile(int64_t pos0, int ratio, int64_t &i0, int &nr) {
    const int64_t R = (pos0 + blockIdx.y + 1) / ratio;
    i0 = (int64_t)blockIdx.x * IXT_ROWS;
    if (i0 >= R) return false;
    nr = (int)min((int64_t)IXT_ROWS, R - i0);
    return true;
}

// ixt_stage stages one query's rows and nr compressed rows for the tiled
// scores kernels (k_index_tile, k_index_tile_tc): the nq float4s at qt, then
// the nr·v4 at kt, U loads a thread in flight before their stores; query
// float4 j goes to sq + (j / v4)·qld + 4 (j % v4), row float4 j to sk + (j
// / v4)·kld + 4 (j % v4) (padded rows: bank-conflict-free reads).
template <int U, int NT>
__device__ __forceinline__ void ixt_stage(const float4 *qt, const float4 *kt, int nq, int nr, int v4, float *sq, int qld,
                                          float *sk, int kld, int tid) {
    const int nall = nq + nr * v4;
    for (int b = 0; b < nall; b += U * NT) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = b + u * NT + tid;
            if (i < nq)
                v[u] = qt[i];
            else if (i < nall)
                v[u] = kt[i - nq];
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = b + u * NT + tid;
            if (i < nall) {
                const int j = i < nq ? i : i - nq;
                *(float4 *)((i < nq ? sq : sk) + (j / v4) * (i < nq ? qld : kld) + 4 * (j % v4)) = v[u];
            }
        }
    }
}

__global__ void __launch_bounds__(IXT_WARPS * 32) k_index_tile(const float *q, const float *w, const float *rows, int IH,
                                                               int IHD, int64_t pos0, int ratio, float *scores,
                                                               int64_t sc_stride) {
    pdl_enter();
    extern __shared__ float4 s_ixt4[];
    float *sq = (float *)s_ixt4;                  // [IH][IHD]
    const int ld = IHD + 4, v4 = IHD / 4;         // k rows padded: 8 lanes' float4s cover the 32 banks
    float *sk = sq + (size_t)IH * IHD;            // [IXT_ROWS][ld]
    float *sd = sk + (size_t)IXT_ROWS * ld;       // [IXT_ROWS][IH+1]
    float *sw = sd + (size_t)IXT_ROWS * (IH + 1); // [IH]
    const int t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int NT = IXT_WARPS * 32;
    int64_t i0;
    int nr;
    if (!ixt_tile(pos0, ratio, i0, nr)) return;
    const float4 *qt = (const float4 *)(q + (int64_t)t * IH * IHD);
    const float4 *kt = (const float4 *)(rows + i0 * IHD);
    ixt_stage<8, NT>(qt, kt, IH * v4, nr, v4, sq, IHD, sk, ld, tid);
    for (int h = tid; h < IH; h += NT) sw[h] = w[(int64_t)t * IH + h];
    __syncthreads();
    const float *kr = sk + lane * ld; // lanes past nr read stale rows; their dots are never stored
    for (int hb = warp * IXT_HPW; hb < IH; hb += IXT_WARPS * IXT_HPW) {
        float acc[IXT_HPW][4];
#pragma unroll
        for (int j = 0; j < IXT_HPW; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        const float *qh = sq + (size_t)hb * IHD;
#pragma unroll 2
        for (int c = 0; c < IHD; c += 4) {
            const float4 y = *(const float4 *)(kr + c);
#pragma unroll
            for (int j = 0; j < IXT_HPW; j++) {
                const float4 x = *(const float4 *)(qh + j * IHD + c);
                acc[j][0] = fadd(acc[j][0], fmul(x.x, y.x));
                acc[j][1] = fadd(acc[j][1], fmul(x.y, y.y));
                acc[j][2] = fadd(acc[j][2], fmul(x.z, y.z));
                acc[j][3] = fadd(acc[j][3], fmul(x.w, y.w));
            }
        }
#pragma unroll
        for (int j = 0; j < IXT_HPW; j++)
            sd[lane * (IH + 1) + hb + j] = fadd(fadd(acc[j][0], acc[j][1]), fadd(acc[j][2], acc[j][3]));
    }
    __syncthreads();
    if (tid < nr) scores[t * sc_stride + i0 + tid] = index_weighted(sd + tid * (IH + 1), sw, IH);
}

// k_index_tile_tc: fast mode's k_index_tile (one query; Flash's IF_IH
// heads of IF_HD) with the dots on the tensor cores (mma m16n8k8, TF32
// operands, float sums). A CTA stages IXT_ROWS rows and the query as
// k_index_tile does (all loads in flight at once; the query's rows padded
// too, so that the B fragments are conflict-free); warp w takes rows
// 16 (w & 1) … + 15 and heads 16 (w >> 1) … + 15; each lane adds
// relu(dot)·w over its heads, the quad's lanes and then the four head
// groups (through shared memory) give the row's score. The model's
// queries and rows are FP4 values (e2m1 × a power of two: two significant
// bits), exact in TF32, so each product is exact and only the order of the
// sums differs from k_index_tile's (ncu: 80 % of that kernel's
// instructions were its float dots).
constexpr int IXC_LD = IF_HD + 4, IXC_U = 12;
constexpr size_t IXC_SMEM = ((size_t)(IF_IH + IXT_ROWS) * IXC_LD + IF_IH + 4 * IXT_ROWS) * sizeof(float);
static_assert(IXT_WARPS == 8 && IXT_ROWS == 32 && IF_IH == 64, "k_index_tile_tc: 2 row tiles × 4 head groups");

__global__ void __launch_bounds__(IXT_WARPS * 32) k_index_tile_tc(const float *q, const float *w, const float *rows,
                                                                  int64_t pos0, int ratio, float *scores,
                                                                  int64_t sc_stride) {
    pdl_enter();
    extern __shared__ float4 s_ixc4[];
    float *sq = (float *)s_ixc4;        // [IF_IH][IXC_LD]
    float *sk = sq + IF_IH * IXC_LD;    // [IXT_ROWS][IXC_LD]
    float *sw = sk + IXT_ROWS * IXC_LD; // [IF_IH]
    float *sp = sw + IF_IH;             // [4][IXT_ROWS]: the head groups' sums
    constexpr int NT = IXT_WARPS * 32, V4 = IF_HD / 4, NQ = IF_IH * V4;
    const int t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t i0;
    int nr;
    if (!ixt_tile(pos0, ratio, i0, nr)) return;
    const float4 *qt = (const float4 *)(q + (int64_t)t * IF_IH * IF_HD);
    const float4 *kt = (const float4 *)(rows + i0 * IF_HD);
    ixt_stage<IXC_U, NT>(qt, kt, NQ, nr, V4, sq, IXC_LD, sk, IXC_LD, tid);
    if (tid < IF_IH) sw[tid] = w[(int64_t)t * IF_IH + tid];
    __syncthreads();
    // (rows past nr: stale values; their sums are never stored)
    const int g = lane >> 2, tq = lane & 3, mt = warp & 1, hg = warp >> 1;
    const float *ka = sk + (16 * mt + g) * IXC_LD + tq;
    const float *qb = sq + (16 * hg + g) * IXC_LD + tq;
    float c[2][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < IF_HD; k0 += 8) {
        const uint32_t a[4] = {__float_as_uint(ka[k0]), __float_as_uint(ka[8 * IXC_LD + k0]),
                               __float_as_uint(ka[k0 + 4]), __float_as_uint(ka[8 * IXC_LD + k0 + 4])};
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
            mma_tf32(c[nt], a, __float_as_uint(qb[8 * nt * IXC_LD + k0]), __float_as_uint(qb[8 * nt * IXC_LD + k0 + 4]));
    }
    float v0 = 0.f, v1 = 0.f; // rows 16 mt + g and 16 mt + g + 8
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        const int h = 16 * hg + 8 * nt + 2 * tq;
        v0 += fmaxf(c[nt][0], 0.f) * sw[h] + fmaxf(c[nt][1], 0.f) * sw[h + 1];
        v1 += fmaxf(c[nt][2], 0.f) * sw[h] + fmaxf(c[nt][3], 0.f) * sw[h + 1];
    }
    v0 += __shfl_xor_sync(FULL_MASK, v0, 1);
    v1 += __shfl_xor_sync(FULL_MASK, v1, 1);
    v0 += __shfl_xor_sync(FULL_MASK, v0, 2);
    v1 += __shfl_xor_sync(FULL_MASK, v1, 2);
    if (tq == 0) {
        sp[hg * IXT_ROWS + 16 * mt + g] = v0;
        sp[hg * IXT_ROWS + 16 * mt + g + 8] = v1;
    }
    __syncthreads();
    if (tid < nr)
        scores[t * sc_stride + i0 + tid] =
            (sp[tid] + sp[IXT_ROWS + tid]) + (sp[2 * IXT_ROWS + tid] + sp[3 * IXT_ROWS + tid]);
}

// ------------------------------------------------------------ top-k
// topk_count is token t's number of candidate rows: R_fixed, or the
// (pos0+t+1)/ratio compressed rows its position has completed.
__device__ __forceinline__ int64_t topk_count(int64_t R_fixed, int64_t pos0, int t, int ratio) {
    return R_fixed > 0 ? R_fixed : (pos0 + t + 1) / ratio;
}

// The top-k kernels' all_if_few holds ds4c_topk's flags (DS4C_TOPK_ALL,
// DS4C_TOPK_ROWS).
// topk_all_rows handles the case of R ≤ K with DS4C_TOPK_ALL or
// DS4C_TOPK_ROWS: every row, in order (this thread writes rows i0,
// i0+step, …; the thread of i0 == 0 the count). It reports whether it did,
// so that the caller returns.
__device__ __forceinline__ bool topk_all_rows(int64_t R, int K, int all_if_few, int t, int64_t i0, int64_t step,
                                              int32_t *sel, int32_t *nsel) {
    if (R > K || !(all_if_few & (DS4C_TOPK_ALL | DS4C_TOPK_ROWS))) return false;
    for (int64_t i = i0; i < R; i += step) sel[(int64_t)t * K + i] = (int32_t)i;
    if (i0 == 0 && nsel) nsel[t] = (int32_t)R;
    return true;
}

// topk_radix_init sets the radix kernels' shared search state (thread 0):
// no prefix yet, take keys left to place; and the token's count.
__device__ __forceinline__ void topk_radix_init(int take, int t, int32_t *nsel, uint32_t &prefix, uint32_t &mask,
                                                int &kleft) {
    prefix = 0;
    mask = 0;
    kleft = take;
    if (nsel) nsel[t] = take;
}

// For each token t (one CTA): R = count (or (pos0+t+1)/ratio); the
// min(K, R) best scores (higher first; equal scores: lower index first) go
// to sel[t][0..), best first; with R ≤ K (and all_if_few) all rows in order.
__global__ void k_topk(const float *scores, int64_t stride, int64_t R_fixed, int64_t pos0, int ratio, int K,
                       int all_if_few, int32_t *sel, int32_t *nsel) {
    pdl_enter();
    // grid (candidate blocks, tokens): each thread ranks one candidate row
    // against all R, so the O(R²) comparisons of a token spread over
    // R/blockDim CTAs instead of one.
    const int t = blockIdx.y;
    const int64_t R = topk_count(R_fixed, pos0, t, ratio);
    const float *s = scores + t * stride;
    int32_t *out = sel + (int64_t)t * K;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (topk_all_rows(R, K, all_if_few, t, i, (int64_t)gridDim.x * blockDim.x, sel, nsel)) return;
    if (i == 0 && nsel) nsel[t] = (int32_t)(R < K ? R : K);
    if (i >= R) return;
    const float si = s[i];
    int64_t rank = 0;
    for (int64_t j = 0; j < R && rank < K; j++) {
        const float sj = s[j];
        rank += (sj > si || (sj == si && j < i)) ? 1 : 0;
    }
    if (rank < K) out[rank] = (int32_t)i;
}

// k_topk_rows puts each token's picks, best first from k_topk, in row
// order (DS4C_TOPK_ROWS past the radix kernels' K): a CTA a token, the
// min(K, R) picks in dynamic shared memory, each one's slot the number of
// picks with a lower row (the rows are distinct).
__global__ void k_topk_rows(int64_t R_fixed, int64_t pos0, int ratio, int K, int32_t *sel) {
    pdl_enter();
    extern __shared__ int32_t s_pick[];
    const int t = blockIdx.x;
    const int64_t R = topk_count(R_fixed, pos0, t, ratio);
    const int take = (int)(R < K ? R : K);
    int32_t *out = sel + (int64_t)t * K;
    for (int i = threadIdx.x; i < take; i += blockDim.x) s_pick[i] = out[i];
    __syncthreads();
    for (int i = threadIdx.x; i < take; i += blockDim.x) {
        const int32_t r = s_pick[i];
        int slot = 0;
        for (int j = 0; j < take; j++) slot += s_pick[j] < r ? 1 : 0;
        out[slot] = r;
    }
}

// Radix top-k, the same picks in the same order as k_topk without its
// O(R²) ranking: one CTA of TK_THREADS per token. Scores map to ordered
// 32-bit keys (-0 taken as +0, so equal keys are equal floats); four 8-bit
// radix passes find the K-th largest key T and how many keys equal to T
// make the cut (those of the lowest indices, as the ranking breaks ties); an
// ordered compaction collects the winners; a bitonic sort on (key desc,
// index asc) gives the ranks. Needs K ≤ TK_THREADS.
constexpr int TK_THREADS = 1024;

// topk_row_slot is a pick's slot in row order: og keys above T and oe ties
// at T come before it in row order (gt: it is above T; else it is a tie
// with oe < need_eq), and of the ties only the first need_eq are picks.
__device__ __forceinline__ int topk_row_slot(bool gt, int og, int oe, int need_eq) {
    return og + (gt ? min(oe, need_eq) : oe);
}

__device__ __forceinline__ uint32_t topk_key(float f) {
    if (f == 0.f) f = 0.f;
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One chunk of the top-k's ordered compaction, run by every thread of the
// CTA (NW warps) on its row i (key k, ok: a row of the chunk), the chunks in
// row order: the picks — keys above T and the first need_eq keys equal to
// T (lowest indices first) — go to out[…] in row order (topk_row_slot);
// s_base holds both counts so far.
template <int NW>
__device__ __forceinline__ void topk_compact(int64_t i, uint32_t k, bool ok, uint32_t T, int need_eq,
                                             unsigned long long *out, int (*s_wcnt)[2], int *s_base, int tid, int lane,
                                             int warp) {
    const bool gt = ok && k > T, eq = ok && k == T;
    const unsigned bg = __ballot_sync(FULL_MASK, gt), be = __ballot_sync(FULL_MASK, eq);
    if (lane == 0) {
        s_wcnt[warp][0] = __popc(bg);
        s_wcnt[warp][1] = __popc(be);
    }
    __syncthreads();
    int og = s_base[0], oe = s_base[1];
    for (int w = 0; w < warp; w++) {
        og += s_wcnt[w][0];
        oe += s_wcnt[w][1];
    }
    const unsigned below = (1u << lane) - 1;
    og += __popc(bg & below);
    oe += __popc(be & below);
    if (gt || (eq && oe < need_eq))
        out[topk_row_slot(gt, og, oe, need_eq)] = ((unsigned long long)k << 32) | (0xffffffffu - (uint32_t)i);
    __syncthreads();
    if (tid == 0) {
        int tg = 0, te = 0;
        for (int w = 0; w < NW; w++) {
            tg += s_wcnt[w][0];
            te += s_wcnt[w][1];
        }
        s_base[0] += tg;
        s_base[1] += te;
    }
    __syncthreads();
}

__global__ void __launch_bounds__(TK_THREADS) k_topk_radix(const float *scores, int64_t stride, int64_t R_fixed,
                                                           int64_t pos0, int ratio, int K, int all_if_few,
                                                           int32_t *sel, int32_t *nsel) {
    pdl_enter();
    __shared__ int s_hist[256];
    __shared__ int s_suf[257];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_kleft;
    __shared__ int s_wcnt[TK_THREADS / 32][2];
    __shared__ int s_base[2];
    __shared__ unsigned long long s_sort[TK_THREADS];
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t R = topk_count(R_fixed, pos0, t, ratio);
    const float *sc = scores + t * stride;
    const int take = (int)(R < K ? R : K);
    if (topk_all_rows(R, K, all_if_few, t, tid, TK_THREADS, sel, nsel)) return;
    if (tid == 0) topk_radix_init(take, t, nsel, s_prefix, s_mask, s_kleft);
    // 1. the take-th largest key, 8 bits at a time
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (tid < 256) s_hist[tid] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for (int64_t i = tid; i < R; i += TK_THREADS) {
            const uint32_t k = topk_key(sc[i]);
            if ((k & mask) == prefix) atomicAdd(&s_hist[(k >> shift) & 255], 1);
        }
        __syncthreads();
        // suffix sums over the bins (Hillis–Steele), bin 256 = 0
        if (tid < 256) s_suf[tid] = s_hist[tid];
        if (tid == 0) s_suf[256] = 0;
        __syncthreads();
        for (int o = 1; o < 256; o <<= 1) {
            int v = 0;
            if (tid < 256 && tid + o < 256) v = s_suf[tid + o];
            __syncthreads();
            if (tid < 256) s_suf[tid] += v;
            __syncthreads();
        }
        const int kleft = s_kleft;
        __syncthreads();
        if (tid < 256 && s_suf[tid] >= kleft && s_suf[tid + 1] < kleft) {
            s_prefix = prefix | ((uint32_t)tid << shift);
            s_mask = mask | (255u << shift);
            s_kleft = kleft - s_suf[tid + 1];
        }
        __syncthreads();
    }
    const uint32_t T = s_prefix;
    const int need_eq = s_kleft; // keys equal to T that make the cut (lowest indices first)
    // 2. ordered compaction: keys above T and the first need_eq equal to T, in row order
    if (tid < 2) s_base[tid] = 0;
    s_sort[tid] = 0; // padding sorts last
    __syncthreads();
    for (int64_t c0 = 0; c0 < R; c0 += TK_THREADS) {
        const int64_t i = c0 + tid;
        const bool ok = i < R;
        topk_compact<TK_THREADS / 32>(i, ok ? topk_key(sc[i]) : 0u, ok, T, need_eq, s_sort, s_wcnt, s_base, tid, lane,
                                      warp);
    }
    if (all_if_few & DS4C_TOPK_ROWS) { // the picks in row order
        if (tid < take) sel[(int64_t)t * K + tid] = (int32_t)(0xffffffffu - (uint32_t)(s_sort[tid] & 0xffffffffu));
        return;
    }
    // 3. bitonic sort, descending
    for (int size = 2; size <= TK_THREADS; size <<= 1) {
        for (int stride2 = size >> 1; stride2 > 0; stride2 >>= 1) {
            const int j = tid ^ stride2;
            if (j > tid) {
                const unsigned long long x = s_sort[tid], y = s_sort[j];
                const bool desc = (tid & size) == 0;
                if (desc ? x < y : x > y) {
                    s_sort[tid] = y;
                    s_sort[j] = x;
                }
            }
            __syncthreads();
        }
    }
    if (tid < take) sel[(int64_t)t * K + tid] = (int32_t)(0xffffffffu - (uint32_t)(s_sort[tid] & 0xffffffffu));
}

// topk_pick_bin is a radix pass's choice (threads 0 … 255 hold bin tid's
// count own; every thread of the CTA calls it, barriers inside): the suffix
// sums over the 256 bins by warp scans and the eight warps' totals in
// s_wsum, then the bin whose keys and those above reach kleft narrows the
// shared prefix and mask by 8 bits at shift and leaves in s_kleft the keys
// of that bin still to take.
__device__ __forceinline__ void topk_pick_bin(int own, int tid, int lane, int warp, int shift, uint32_t prefix,
                                              uint32_t mask, int kleft, int *s_wsum, uint32_t &s_prefix,
                                              uint32_t &s_mask, int &s_kleft) {
    int suf = own; // bins tid..(its warp's last)
    if (tid < 256) {
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_down_sync(FULL_MASK, suf, o);
            if (lane + o < 32) suf += u;
        }
        if (lane == 0) s_wsum[warp] = suf;
    }
    __syncthreads();
    if (tid < 256) {
        for (int w = warp + 1; w < 8; w++) suf += s_wsum[w]; // bins tid..255
        const int next = suf - own;                          // bins tid+1..255
        if (suf >= kleft && next < kleft) {
            s_prefix = prefix | ((uint32_t)tid << shift);
            s_mask = mask | (255u << shift);
            s_kleft = kleft - next;
        }
    }
    __syncthreads();
}

// topk_sort_desc sorts the CTA's NT packed picks (key << 32 | ~index, one
// a thread: x, zero padding past take) descending by a bitonic sort of the
// first P ≥ take slots (keys are distinct: the index is in the low half),
// partners closer than 32 by shuffles, farther ones through the two
// alternating buffers s_x (s_x[1] first); it returns thread tid's slot.
// Every thread of the CTA calls it (barriers inside).
template <int NT>
__device__ __forceinline__ unsigned long long topk_sort_desc(unsigned long long x, unsigned long long (*s_x)[NT],
                                                             int take, int tid) {
    int P = 1;
    while (P < take) P <<= 1;
    int buf = 1;
    for (int size = 2; size <= P; size <<= 1) {
        for (int st = size >> 1; st > 0; st >>= 1) {
            unsigned long long y;
            if (st >= 32) {
                s_x[buf][tid] = x;
                __syncthreads();
                y = s_x[buf][tid ^ st];
                buf ^= 1;
            } else {
                y = __shfl_xor_sync(FULL_MASK, x, st);
            }
            const bool desc = (tid & size) == 0, lower = (tid & st) == 0;
            x = (desc == lower) ? (x > y ? x : y) : (x < y ? x : y);
        }
    }
    return x;
}

// TopkSmem: the shared state of k_topk_warp's selection (topk_finish):
// a radix pass's counts (bin 256: keys outside the prefix), the warp
// totals of its suffix sums, the prefix and mask found so far and the keys
// still to take, the compaction's per-warp counts and bases, and the picks'
// two sort buffers.
template <int NT> struct TopkSmem {
    int hist[257];
    int wsum[8];
    uint32_t prefix, mask;
    int kleft;
    int wcnt[NT / 32][2];
    int base[2];
    unsigned long long x[2][NT];
};

// topk_finish is the selection of k_topk_warp and k_topk_wide over the
// keys that each(f) walks (f(i, key, valid) for row i of the token, in
// chunks of NT rows in index order, every thread of the CTA together:
// warp-wide intrinsics inside): the take-th largest key 8 bits at a pass,
// the ordered compaction (the keys above it and the first ties, in row
// order), then the picks as compacted (DS4C_TOPK_ROWS) or sorted
// descending, into sel[t][0 … take). Every thread calls it.
template <int NT, class Each>
__device__ __forceinline__ void topk_finish(TopkSmem<NT> &sm, Each &&each, int take, int t, int K, int all_if_few,
                                            int32_t *sel, int32_t *nsel) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) topk_radix_init(take, t, nsel, sm.prefix, sm.mask, sm.kleft);
    // 1. the take-th largest key, 8 bits at a time
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (tid < 257) sm.hist[tid] = 0;
        __syncthreads();
        const uint32_t prefix = sm.prefix, mask = sm.mask;
        const int kleft = sm.kleft;
        each([&](int64_t, uint32_t k, bool ok) {
            const int bin = (ok && (k & mask) == prefix) ? (int)((k >> shift) & 255) : 256;
            const unsigned peers = __match_any_sync(FULL_MASK, bin);
            if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&sm.hist[bin], __popc(peers));
        });
        __syncthreads();
        topk_pick_bin(tid < 256 ? sm.hist[tid] : 0, tid, lane, warp, shift, prefix, mask, kleft, sm.wsum, sm.prefix,
                      sm.mask, sm.kleft);
    }
    const uint32_t T = sm.prefix;
    const int need_eq = sm.kleft; // keys equal to T that make the cut (lowest indices first)
    // 2. ordered compaction: keys above T and the first need_eq equal to T, in row order
    if (tid < 2) sm.base[tid] = 0;
    sm.x[0][tid] = 0; // padding sorts last
    __syncthreads();
    each([&](int64_t i, uint32_t k, bool ok) {
        topk_compact<NT / 32>(i, k, ok, T, need_eq, sm.x[0], sm.wcnt, sm.base, tid, lane, warp);
    });
    if (all_if_few & DS4C_TOPK_ROWS) { // the picks as compacted, in row order (the sort was half the instructions)
        if (tid < take) sel[(int64_t)t * K + tid] = (int32_t)(0xffffffffu - (uint32_t)(sm.x[0][tid] & 0xffffffffu));
        return;
    }
    // 3. bitonic sort of the first P slots, descending
    const unsigned long long x = topk_sort_desc<NT>(sm.x[0][tid], sm.x, take, tid);
    if (tid < take) sel[(int64_t)t * K + tid] = (int32_t)(0xffffffffu - (uint32_t)(x & 0xffffffffu));
}

// topk_load_round loads this thread's keys of the L chunks of NT rows from
// row c0 of token scores sc's R (all requested at once; 0 past R).
template <int NT, int L>
__device__ __forceinline__ void topk_load_round(const float *sc, int64_t R, int64_t c0, uint32_t (&kb)[L]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int j = 0; j < L; j++) {
        const int64_t i = c0 + j * NT + tid;
        kb[j] = i < R ? topk_key(sc[i]) : 0u;
    }
}

// topk_each_global walks token scores sc's R rows from global memory for
// topk_finish, in chunks of NT, L chunks' keys requested at once.
template <int NT, int L, class F> __device__ __forceinline__ void topk_each_global(const float *sc, int64_t R, F &&f) {
    const int tid = threadIdx.x;
    for (int64_t c0 = 0; c0 < R; c0 += L * NT) {
        uint32_t kb[L];
        topk_load_round<NT, L>(sc, R, c0, kb);
#pragma unroll
        for (int j = 0; j < L; j++) {
            const int64_t i = c0 + j * NT + tid;
            f(i, kb[j], i < R);
        }
    }
}

// The same top-k, built for one decode token's few thousand scores, where
// k_topk_radix waits on latencies rather than work: the keys are loaded
// once, all in flight, into registers (R ≤ 8192; more are re-read from
// global memory on each pass, TK_LOADS chunks in flight), each
// radix pass adds a warp's equal bins with one shared atomic
// (__match_any_sync: the scores of a layer share their leading bits, so
// the plain per-key atomics were serialised on a few bins), the suffix sums
// over the 256 bins are warp scans plus eight warp totals (4 barriers a
// pass instead of 19), and the bitonic sort covers only the next power of
// two ≥ take, one key per thread in a register: partners closer than 32
// by shuffles, farther ones through two alternating shared buffers (10
// barriers for 512 keys instead of 55). Same picks, same order.
// NT threads (K ≤ NT): 512 for Flash's 512 picks, half the warps of
// k_topk_radix's CTA, each with twice the keys (measured: the kernel is
// bound by instructions issued on its one SM, and the scans and the sort cost
// per warp).
constexpr int TK_LOADS = 4; // past the registers: chunks whose keys a thread loads at once (a prefill chunk's tokens deep in a long context)

template <int NT>
__global__ void __launch_bounds__(NT) k_topk_warp(const float *scores, int64_t stride, int64_t R_fixed,
                                                          int64_t pos0, int ratio, int K, int all_if_few,
                                                          int32_t *sel, int32_t *nsel) {
    pdl_enter();
    __shared__ TopkSmem<NT> sm;
    constexpr int TK_REG = 8192 / NT; // keys per thread held in registers
    const int t = blockIdx.x, tid = threadIdx.x;
    const int64_t R = topk_count(R_fixed, pos0, t, ratio);
    const float *sc = scores + t * stride;
    const int take = (int)(R < K ? R : K);
    if (topk_all_rows(R, K, all_if_few, t, tid, NT, sel, nsel)) return;
    const bool inreg = R <= (int64_t)TK_REG * NT;
    uint32_t kr[TK_REG];
#pragma unroll
    for (int u = 0; u < TK_REG; u++) {
        const int64_t i = tid + (int64_t)u * NT;
        kr[u] = (inreg && i < R) ? topk_key(sc[i]) : 0;
    }
    // f(i, key, valid) over this thread's rows, in chunks of NT
    // rows that every thread walks together (warp-wide intrinsics inside)
    auto each = [&](auto &&f) {
        if (inreg) {
#pragma unroll
            for (int u = 0; u < TK_REG; u++) {
                if ((int64_t)u * NT >= R) break;
                const int64_t i = tid + (int64_t)u * NT;
                f(i, kr[u], i < R);
            }
        } else {
            topk_each_global<NT, TK_LOADS>(sc, R, f);
        }
    };
    topk_finish<NT>(sm, each, take, t, K, all_if_few, sel, nsel);
}

// k_topk_wide is k_topk_warp<512> for a prefill chunk's tokens deep in a
// long context (DS4C_OPT_TOPK_WIDE; R > 8192 rows, past k_topk_warp's
// registers, where it walks the scores from global memory five times: four
// radix passes and the compaction, ≈ 2.1 ms a ratio-4 layer for a
// 4096-token chunk at 128k, cuda/NOTES.md v51). Here two walks: a
// histogram of the keys' top TKW_BITS bits finds the bin b that holds the
// take-th largest key; the keys of bins ≥ b (at most TKW_CAP of them) are
// gathered into shared memory in index order; topk_finish then runs on
// them — the same keys in the same order as its walks over all rows would
// give, so the same picks in the same slots. More than TKW_CAP candidates
// (many ties at the cut): k_topk_warp's walks.
constexpr int TKW_T = 512, TKW_BITS = 11, TKW_BINS = 1 << TKW_BITS, TKW_CAP = 4096;
static_assert(TKW_BINS * 4 <= 2 * TKW_T * 8 && TKW_BINS % TKW_T == 0, "the histogram in the sort buffers; whole bins a thread");

__global__ void __launch_bounds__(TKW_T) k_topk_wide(const float *scores, int64_t stride, int64_t R_fixed,
                                                     int64_t pos0, int ratio, int K, int all_if_few, int32_t *sel,
                                                     int32_t *nsel) {
    pdl_enter();
    constexpr int NT = TKW_T, NW = NT / 32, BPT = TKW_BINS / NT; // bins a thread
    __shared__ TopkSmem<NT> sm;
    __shared__ uint32_t s_ck[TKW_CAP], s_ci[TKW_CAP]; // candidates: keys, rows
    __shared__ int s_cnt[2][TK_LOADS][NW];              // the gather's per-warp counts (two rounds' buffers)
    __shared__ int s_w16[NW];
    __shared__ int s_bin, s_nc;
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t R = topk_count(R_fixed, pos0, t, ratio);
    const float *sc = scores + t * stride;
    const int take = (int)(R < K ? R : K);
    if (topk_all_rows(R, K, all_if_few, t, tid, NT, sel, nsel)) return;
    // 1. the histogram of the keys' top bits (in the sort buffers)
    int *h = (int *)&sm.x[0][0];
    for (int i = tid; i < TKW_BINS; i += NT) h[i] = 0;
    __syncthreads();
    topk_each_global<NT, TK_LOADS>(sc, R, [&](int64_t, uint32_t k, bool ok) {
        const int bin = ok ? (int)(k >> (32 - TKW_BITS)) : -1;
        const unsigned peers = __match_any_sync(FULL_MASK, bin);
        if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&h[bin], __popc(peers));
    });
    __syncthreads();
    // 2. the bin b of the take-th largest key: thread tid holds bins
    // BPT·tid …; suffix sums over the threads above, then its own bins
    int own = 0;
#pragma unroll
    for (int j = 0; j < BPT; j++) own += h[BPT * tid + j];
    int suf = own; // bins of threads tid … (its warp's last)
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_down_sync(FULL_MASK, suf, o);
        if (lane + o < 32) suf += u;
    }
    if (lane == 0) s_w16[warp] = suf;
    if (tid == 0) s_nc = -1;
    __syncthreads();
    for (int w = warp + 1; w < NW; w++) suf += s_w16[w]; // bins BPT·tid … the last
    int above = suf - own;                                 // bins past this thread's
#pragma unroll
    for (int j = BPT - 1; j >= 0; j--) {
        const int c = h[BPT * tid + j];
        if (above < take && above + c >= take) {
            s_bin = BPT * tid + j;
            s_nc = above + c; // the candidates: keys of bins ≥ b
        }
        above += c;
    }
    __syncthreads();
    const int nc = s_nc;
    const uint32_t kmin = (uint32_t)s_bin << (32 - TKW_BITS); // the smallest key of bin b
    if (nc < 0 || nc > TKW_CAP) { // (nc < 0 cannot happen: R > take keys)
        topk_finish<NT>(sm, [&](auto &&f) { topk_each_global<NT, TK_LOADS>(sc, R, f); }, take, t, K, all_if_few, sel,
                        nsel);
        return;
    }
    // 3. gather the candidates in index order: per round, L chunks' keys;
    // a key's slot is the candidates before its chunk, its warp, its lane
    int base = 0, buf = 0;
    for (int64_t c0 = 0; c0 < R; c0 += TK_LOADS * NT, buf ^= 1) {
        uint32_t kb[TK_LOADS];
        unsigned bal[TK_LOADS];
        topk_load_round<NT, TK_LOADS>(sc, R, c0, kb);
#pragma unroll
        for (int j = 0; j < TK_LOADS; j++) {
            const int64_t i = c0 + j * NT + tid;
            bal[j] = __ballot_sync(FULL_MASK, i < R && kb[j] >= kmin);
            if (lane == 0) s_cnt[buf][j][warp] = __popc(bal[j]);
        }
        __syncthreads(); // (two buffers: the round after next rewrites this one, past the next barrier)
        const unsigned below = (1u << lane) - 1;
#pragma unroll
        for (int j = 0; j < TK_LOADS; j++) {
            int off = base;
            for (int w = 0; w < NW; w++) off += w < warp ? s_cnt[buf][j][w] : 0;
            if (bal[j] >> lane & 1) {
                const int slot = off + __popc(bal[j] & below);
                s_ck[slot] = kb[j];
                s_ci[slot] = (uint32_t)(c0 + j * NT + tid);
            }
            for (int w = 0; w < NW; w++) base += s_cnt[buf][j][w];
        }
    }
    __syncthreads();
    // 4. the selection over the candidates (rows past nc: invalid)
    topk_finish<NT>(
        sm,
        [&](auto &&f) {
#pragma unroll 1
            for (int u = 0; u * NT < nc; u++) {
                const int c = tid + u * NT;
                f((int64_t)(c < nc ? s_ci[c] : 0), c < nc ? s_ck[c] : 0u, c < nc);
            }
        },
        take, t, K, all_if_few, sel, nsel);
}

// The same top-k for many candidate rows (a decode token deep in a long
// context: (pos+1)/4 rows at a ratio-4 layer, 32768 at 128k), on a
// thread-block cluster of TKC_CL CTAs a token. k_topk_warp holds at most
// 8192 keys in its one CTA's registers and re-reads the rest from global
// memory on each of its five walks, one load's latency after another
// (≈ 105 µs for 32768 rows; cuda/NOTES.md v51). Here CTA r of the cluster
// takes the r-th of TKC_CL equal runs of rows, a thread a run of
// consecutive rows in registers (TKC_REG at most; more are read from
// global memory on each walk); each radix pass counts the CTA's keys into
// a histogram of its own (one a pass, so none is cleared while another CTA
// reads it), and after a cluster barrier every CTA adds the TKC_CL
// histograms from distributed shared memory and takes the same bin. The
// compaction numbers a thread's keys above the cut and its ties by the
// counts of the threads, then the CTAs, before it: the picks in row order
// (topk_row_slot) — k_topk_warp's slots, so its picks in its order; sorted
// (without DS4C_TOPK_ROWS) by CTA 0, which gathers the picks into its
// shared memory.
constexpr int TKC_CL = 8, TKC_T = 512, TKC_REG = 16;

__global__ void __cluster_dims__(TKC_CL, 1, 1) __launch_bounds__(TKC_T)
    k_topk_cl(const float *scores, int64_t stride, int64_t R_fixed, int64_t pos0, int ratio, int K, int all_if_few,
              int32_t *sel, int32_t *nsel) {
    pdl_enter();
    __shared__ int s_hist[4][257]; // a radix pass's counts (bin 256: keys outside the prefix)
    __shared__ int s_wsum[8];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_kleft;
    __shared__ long long s_wcnt[TKC_T / 32]; // warps' counts: ties << 32 | above
    __shared__ long long s_tot;              // the CTA's
    __shared__ long long s_off;              // the CTAs' before this one
    __shared__ unsigned long long s_x[2][TKC_T]; // CTA 0: the picks, sorted
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank();
    const int t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t R = topk_count(R_fixed, pos0, t, ratio);
    const float *sc = scores + t * stride;
    const int take = (int)(R < K ? R : K);
    if (topk_all_rows(R, K, all_if_few, t, (int64_t)rank * TKC_T + tid, (int64_t)TKC_CL * TKC_T, sel, nsel)) return;
    // the CTA's rows lo … hi − 1, the thread's r0 … r1 − 1 (per at most)
    const int64_t S = (R + TKC_CL - 1) / TKC_CL, per = (S + TKC_T - 1) / TKC_T;
    const int64_t lo = min(R, (int64_t)rank * S), hi = min(R, lo + S);
    const int64_t r0 = min(hi, lo + (int64_t)tid * per), r1 = min(hi, r0 + per);
    const bool inreg = per <= TKC_REG;
    uint32_t kr[TKC_REG];
#pragma unroll
    for (int u = 0; u < TKC_REG; u++) kr[u] = (inreg && r0 + u < r1) ? topk_key(sc[r0 + u]) : 0u;
    // f(i, key, valid) over the thread's rows in order, every thread the
    // same number of calls (warp-wide intrinsics inside)
    auto each = [&](auto &&f) {
        if (inreg) {
#pragma unroll
            for (int u = 0; u < TKC_REG; u++) {
                if (u >= per) break;
                f(r0 + u, kr[u], r0 + u < r1);
            }
        } else {
#pragma unroll 4
            for (int64_t u = 0; u < per; u++) {
                const int64_t i = r0 + u;
                f(i, i < r1 ? topk_key(sc[i]) : 0u, i < r1);
            }
        }
    };
    for (int i = tid; i < 4 * 257; i += TKC_T) (&s_hist[0][0])[i] = 0;
    if (rank == 0) s_x[0][tid] = 0; // padding sorts last
    if (tid == 0) topk_radix_init(take, t, rank == 0 ? nsel : nullptr, s_prefix, s_mask, s_kleft);
    __syncthreads();
    // 1. the take-th largest key, 8 bits at a time, over the cluster's keys
    for (int p = 0; p < 4; p++) {
        const int shift = 24 - 8 * p;
        const uint32_t prefix = s_prefix, mask = s_mask;
        const int kleft = s_kleft;
        each([&](int64_t, uint32_t k, bool ok) {
            const int bin = (ok && (k & mask) == prefix) ? (int)((k >> shift) & 255) : 256;
            const unsigned peers = __match_any_sync(FULL_MASK, bin);
            if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&s_hist[p][bin], __popc(peers));
        });
        cl.sync(); // every CTA's counts of this pass are in
        int own = 0; // bin tid's count over the cluster
        if (tid < 256)
#pragma unroll
            for (int c = 0; c < TKC_CL; c++) own += cl.map_shared_rank(&s_hist[p][0], c)[tid];
        topk_pick_bin(own, tid, lane, warp, shift, prefix, mask, kleft, s_wsum, s_prefix, s_mask, s_kleft);
    }
    const uint32_t T = s_prefix;
    const int need_eq = s_kleft; // keys equal to T that make the cut (lowest indices first)
    // 2. each key's slot: the counts of the threads, then the CTAs, before it
    long long mine = 0; // ties << 32 | above
    each([&](int64_t, uint32_t k, bool ok) { mine += ok ? (k > T ? 1ll : (k == T ? 1ll << 32 : 0ll)) : 0ll; });
    long long incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const long long u = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += u;
    }
    if (lane == 31) s_wcnt[warp] = incl;
    __syncthreads();
    long long before = incl - mine;
    for (int w = 0; w < warp; w++) before += s_wcnt[w];
    if (tid == 0) {
        long long tot = 0;
        for (int w = 0; w < TKC_T / 32; w++) tot += s_wcnt[w];
        s_tot = tot;
    }
    cl.sync(); // every CTA's total is in
    if (tid == 0) {
        long long off = 0;
        for (int c = 0; c < rank; c++) off += *cl.map_shared_rank(&s_tot, c);
        s_off = off;
    }
    __syncthreads();
    before += s_off;
    int og = (int)(before & 0xffffffffll), oe = (int)(before >> 32);
    const bool rows = (all_if_few & DS4C_TOPK_ROWS) != 0;
    unsigned long long *x0 = rows ? nullptr : cl.map_shared_rank(&s_x[0][0], 0);
    int32_t *out = sel + (int64_t)t * K;
    auto put = [&](int slot, int64_t i, uint32_t k) {
        if (rows)
            out[slot] = (int32_t)i;
        else
            x0[slot] = ((unsigned long long)k << 32) | (0xffffffffu - (uint32_t)i);
    };
    each([&](int64_t i, uint32_t k, bool ok) {
        if (!ok) return;
        if (k > T) {
            put(topk_row_slot(true, og++, oe, need_eq), i, k);
        } else if (k == T) {
            if (oe < need_eq) put(topk_row_slot(false, og, oe, need_eq), i, k);
            oe++;
        }
    });
    cl.sync(); // the picks are in CTA 0; no CTA's shared memory is read after this
    if (rows || rank != 0) return;
    // 3. CTA 0 sorts them (take ≤ K ≤ TKC_T)
    const unsigned long long x = topk_sort_desc<TKC_T>(s_x[0][tid], s_x, take, tid);
    if (tid < take) out[tid] = (int32_t)(0xffffffffu - (uint32_t)(x & 0xffffffffu));
}

// ------------------------------------------------------------ attention
// One CTA per (token, head). Keys (= values): the window positions
// max(0, p−W+1)..p (this chunk's kv rows, or the window ring), then the
// compressed rows: all (p+1)/ratio for dense layers, sel[t][0..nsel[t]) for
// indexed ones. o = Σ_k softmax(q·k·scale ; sink)_k · k.
// Attention runs as three kernels over a work buffer sc [n][H][maxk]:
// scores (every (token, head, key) dot in parallel), softmax (one warp per
// (token, head): the maximum, the exponentials, their sum in key order after
// the sink's term, the probabilities), and the weighted sum of the keys (one
// thread per (token, output dim) for AO_H heads, keys in order). Same
// operations and order as backend/cpu's attention, so bit-identical.
constexpr int AS_H = 16;   // scores: heads per CTA (256 threads: 16 heads × 16 key slots)
constexpr int AS_KMAX = 32; // keys per CTA at most (2 per thread)
constexpr int AO_PK = 256;          // output: probabilities staged per pass

// hg: head groups of AS_H per CTA (the key tile is loaded once for all).
// KPT: keys per thread (2 for chunks: two dots share the query loads; 1 for
// single tokens, whose few keys need more CTAs instead), AS_K keys per CTA.
template <int KPT>
__global__ void __launch_bounds__(256) k_attn_scores(AttnArgs a, float *sc, int64_t maxk, int hg) {
    APM_BEGIN();
    pdl_enter();
    APM(1);
    constexpr int AS_K = 16 * KPT;
    extern __shared__ float s_at[];
    __shared__ const float *s_kp[AS_K];
    const int t = blockIdx.y, tid = threadIdx.x;
    const int64_t p = a.pos0 + t;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    const int64_t k0 = (int64_t)blockIdx.x * AS_K;
    if (k0 >= nk) return;
    const int nkt = (int)min((int64_t)AS_K, nk - k0);
    const int ld = a.HD + 4, v4 = a.HD / 4;
    float *sq = s_at, *sk = s_at + AS_H * ld;
    if (tid < nkt) s_kp[tid] = attn_key(a, t, p, k0 + tid, nwin);
    __syncthreads();
    APM(2);
    for (int i = tid; i < nkt * v4; i += blockDim.x) {
        const int k = i / v4, c = i % v4;
        *(float4 *)&sk[k * ld + 4 * c] = __ldg((const float4 *)s_kp[k] + c);
    }
    if (KPT == 1) {
        PHASE_SYNC();
        APM(3);
    }
    // thread: head tid/16 of the group, keys tid%16 and tid%16 + 16 (two
    // dots sharing the query loads)
    const int kk = tid % 16, hh = tid / 16;
    for (int g = 0; g < hg; g++) {
        const int h0 = (blockIdx.z * hg + g) * AS_H;
        if (h0 >= a.H) break;
        const int nh = min(AS_H, a.H - h0);
        if (g > 0) __syncthreads(); // the previous group's queries are consumed
        const float *qt = a.q + ((int64_t)t * a.H + h0) * a.HD;
        for (int i = tid; i < nh * v4; i += blockDim.x)
            *(float4 *)&sq[(i / v4) * ld + 4 * (i % v4)] = __ldg((const float4 *)qt + i);
        __syncthreads();
        APM(4);
        if (hh >= nh || kk >= nkt) continue;
        const float *qa = sq + hh * ld, *ka = sk + kk * ld, *kb = sk + (KPT > 1 ? kk + 16 : kk) * ld;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f, b0 = 0.f, b1 = 0.f, b2 = 0.f, b3 = 0.f;
#pragma unroll 4
        for (int i = 0; i < a.HD; i += 4) {
            const float4 x = *(const float4 *)(qa + i), y = *(const float4 *)(ka + i);
            a0 = fadd(a0, fmul(x.x, y.x));
            a1 = fadd(a1, fmul(x.y, y.y));
            a2 = fadd(a2, fmul(x.z, y.z));
            a3 = fadd(a3, fmul(x.w, y.w));
            if (KPT > 1) {
                const float4 z = *(const float4 *)(kb + i);
                b0 = fadd(b0, fmul(x.x, z.x));
                b1 = fadd(b1, fmul(x.y, z.y));
                b2 = fadd(b2, fmul(x.z, z.z));
                b3 = fadd(b3, fmul(x.w, z.w));
            }
        }
        float *o = sc + ((int64_t)t * a.H + h0 + hh) * maxk + k0;
        o[kk] = fmul(fadd(fadd(a0, a1), fadd(a2, a3)), a.scale);
        if (KPT > 1 && kk + 16 < nkt) o[kk + 16] = fmul(fadd(fadd(b0, b1), fadd(b2, b3)), a.scale);
        APM(5);
    }
    if (KPT == 1) APM_END(nk >= 512 ? 3 : 4);
}

// Scores of a chunk through tile_dots: a CTA takes one token, ATS_A heads
// (A: its query rows) and ATS_B keys (B). Same bits as k_attn_scores (TC:
// fast mode, the dots on the tensor cores; CP: the slices staged by
// cp.async, DS4C_OPT_ATTN_TILE 2).
template <bool TC, bool CP = false>
__global__ void __launch_bounds__(ATS_T, 2) k_attn_scores_tile(AttnArgs a, float *sc, int64_t maxk) {
    pdl_enter();
    __shared__ __align__(16) TileSmem sm;
    const int t = blockIdx.y, tid = threadIdx.x;
    const int64_t p = a.pos0 + t;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    const int64_t k0 = (int64_t)blockIdx.x * ATS_B;
    if (k0 >= nk) return;
    const int nkt = (int)min((int64_t)ATS_B, nk - k0);
    const int h0 = blockIdx.z * ATS_A, nh = min(ATS_A, a.H - h0);
    if (tid < ATS_A) sm.row[tid] = a.q + ((int64_t)t * a.H + h0 + min(tid, nh - 1)) * a.HD;
    else if (tid < ATS_A + ATS_B) sm.row[tid] = attn_key(a, t, p, k0 + min(tid - ATS_A, nkt - 1), nwin);
    __syncthreads();
    float acc[ATS_R][ATS_R][4];
    tile_dots<TC, CP>(sm, a.HD, acc);
#pragma unroll
    for (int i = 0; i < ATS_R; i++) {
        const int hh = tile_arow(i);
        if (hh >= nh) break;
        float *o = sc + ((int64_t)t * a.H + h0 + hh) * maxk + k0;
#pragma unroll
        for (int j = 0; j < ATS_R; j++)
            if (tile_brow(j) < nkt) o[tile_brow(j)] = fmul(tile_sum(acc[i][j]), a.scale);
    }
}

// FAST: float exponentials (expf) instead of exp_ref's double ones, and
// the denominator as lane sums and a shuffle tree instead of one serial sum.
template <bool FAST>
__global__ void __launch_bounds__(32) k_attn_softmax(AttnArgs a, float *sc, int64_t maxk) {
    pdl_enter();
    const int t = blockIdx.x / a.H, h = blockIdx.x % a.H, lane = threadIdx.x;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    float *s = sc + ((int64_t)t * a.H + h) * maxk;
    const float sink = a.sinks[h];
    float mx = sink;
    for (int64_t k = lane; k < nk; k += 32) mx = fmax_go(mx, s[k]);
    mx = warp_max(mx);
    float sum;
    if constexpr (FAST) { // lane sums and a shuffle tree
        float part = 0.f;
        for (int64_t k = lane; k < nk; k += 32) {
            const float e = expf(s[k] - mx);
            s[k] = e;
            part += e;
        }
        sum = expf(sink - mx) + warp_sum(part);
    } else {
        for (int64_t k = lane; k < nk; k += 32) s[k] = exp_ref(fsub(s[k], mx));
        __syncwarp();
        // every lane runs the same serial sum, 32 values per load
        sum = exp_ref(fsub(sink, mx));
        for (int64_t k0 = 0; k0 < nk; k0 += 32) {
            const float v = k0 + lane < nk ? s[k0 + lane] : 0.f;
            const int m = (int)min((int64_t)32, nk - k0);
            for (int j = 0; j < m; j++) sum = fadd(sum, __shfl_sync(FULL_MASK, v, j));
        }
    }
    __syncwarp();
    for (int64_t k = lane; k < nk; k += 32) s[k] = __fdiv_rn(s[k], sum);
}

// k_attn_softmax_seg: exact prompt chunks' softmax in the segmented order
// (DS4C_OPT_ATTN_ORDER 1-5; cpu.AttendHead with cpu.AttnSegmentKeys), a warp
// a (token, head) as k_attn_softmax: each segment of AP_SEG keys its maximum
// m_j, its exponentials e_k = exp_ref(s_k − m_j) in place of the scores,
// their sum l_j in key order; then into the row's side entry (seg_side:
// after the n·H·maxk scores, 2·S + 1 floats a row, S = seg_nseg(maxk))
// c_j = exp_ref(m_j − M) at [j], l_j at [S + j] and L = exp_ref(sink − M) +
// l_0·c_0 + … in segment order at [2S], for k_attn_out_tile<false, true>.
// The segments' serial sums are independent, so they run side by side, a
// lane a segment, 32 segments at a time: the group's scores staged in
// shared memory (coalesced), each segment's maximum and exponentials formed
// across the warp, then lane j sums segment j's exponentials from its row
// (SMS_LD floats apart: lane j reads bank (j + i) mod 32 at step i). The
// chain is a segment's 64 additions, not the row's every key (the serial
// order's k_attn_softmax).
constexpr int AP_SEG = 64; // the segmented order's keys a segment (cpu.AttnSegmentKeys): two warps' 32
constexpr int SMS_LD = AP_SEG + 1;
__host__ __device__ __forceinline__ int64_t seg_nseg(int64_t maxk) { return (maxk + AP_SEG - 1) / AP_SEG; }
__device__ __forceinline__ float *seg_side(float *sc, int n, int H, int64_t maxk, int t, int h) {
    return sc + (int64_t)n * H * maxk + ((int64_t)t * H + h) * (2 * seg_nseg(maxk) + 1);
}
__global__ void __launch_bounds__(32) k_attn_softmax_seg(AttnArgs a, float *sc, int64_t maxk) {
    pdl_enter();
    __shared__ float se[32 * SMS_LD]; // a group's 32 segments, a row each
    const int n = gridDim.x / a.H, t = blockIdx.x / a.H, h = blockIdx.x % a.H, lane = threadIdx.x;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin), S = seg_nseg(maxk), ns = seg_nseg(nk);
    float *s = sc + ((int64_t)t * a.H + h) * maxk;
    float *side = seg_side(sc, n, a.H, maxk, t, h);
    const float sink = a.sinks[h];
    float M = sink;
    for (int64_t g = 0; g < ns; g += 32) {
        const int gn = (int)min((int64_t)32, ns - g);
        const float *sg = s + g * AP_SEG;
        const int64_t gk = min((int64_t)gn * AP_SEG, nk - g * AP_SEG); // the group's keys
#pragma unroll 4
        for (int q = 0; q < gn; q++) { // its scores, past the keys −∞
            const int k = q * AP_SEG + lane;
            se[q * SMS_LD + lane] = k < gk ? sg[k] : -INFINITY;
            se[q * SMS_LD + 32 + lane] = k + 32 < gk ? sg[k + 32] : -INFINITY;
        }
        __syncwarp();
        float mine = 0.f; // this lane's segment's maximum
#pragma unroll 2
        for (int q = 0; q < gn; q++) {
            float *r = se + q * SMS_LD;
            const int k = q * AP_SEG + lane;
            const float s0 = r[lane], s1 = r[32 + lane];
            const float mj = warp_max(fmaxf(s0, s1));
            const float e0 = k < gk ? exp_ref(fsub(s0, mj)) : 0.f, e1 = k + 32 < gk ? exp_ref(fsub(s1, mj)) : 0.f;
            r[lane] = e0, r[32 + lane] = e1;
            if (k < gk) s[g * AP_SEG + k] = e0;
            if (k + 32 < gk) s[g * AP_SEG + k + 32] = e1;
            if (lane == q) mine = mj;
            M = fmaxf(M, mj);
        }
        __syncwarp();
        if (lane < gn) { // segment g + lane's sum, in key order
            const float *r = se + lane * SMS_LD;
            const int m = (int)min((int64_t)AP_SEG, gk - lane * AP_SEG);
            float l = 0.f;
            if (m == AP_SEG) {
#pragma unroll
                for (int i = 0; i < AP_SEG; i++) l = fadd(l, r[i]);
            } else {
                for (int i = 0; i < m; i++) l = fadd(l, r[i]);
            }
            side[g + lane] = mine, side[S + g + lane] = l;
        }
        __syncwarp();
    }
    float L = exp_ref(fsub(sink, M)); // then c_j and L, in segment order
    for (int64_t g = 0; g < ns; g += 32) {
        const int64_t j = g + lane;
        float p = 0.f;
        if (j < ns) {
            const float c = exp_ref(fsub(side[j], M));
            side[j] = c;
            p = fmul(side[S + j], c);
        }
        const int gn = (int)min((int64_t)32, ns - g);
        for (int i = 0; i < gn; i++) L = fadd(L, __shfl_sync(FULL_MASK, p, i));
    }
    if (lane == 0) side[2 * S] = L;
}

template <int OH>
__global__ void __launch_bounds__(128) k_attn_out(AttnArgs a, const float *sc, int64_t maxk) {
    pdl_enter();
    __shared__ float sp[OH][AO_PK];
    __shared__ const float *skey[AO_PK]; // the pass's key rows
    const int t = blockIdx.y, tid = threadIdx.x;
    const int64_t p = a.pos0 + t;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    const int h0 = blockIdx.z * OH, nh = min(OH, a.H - h0);
    const int d = blockIdx.x * 128 + tid;
    const bool dok = d < a.HD;
    const int dd = dok ? d : 0;
    float acc[OH];
#pragma unroll
    for (int j = 0; j < OH; j++) acc[j] = 0.f;
    for (int64_t kc = 0; kc < nk; kc += AO_PK) {
        const int m = (int)min((int64_t)AO_PK, nk - kc);
        __syncthreads();
        for (int i = tid; i < OH * m; i += blockDim.x) {
            const int hh = i / m, j = i % m;
            sp[hh][j] = hh < nh ? sc[((int64_t)t * a.H + h0 + hh) * maxk + kc + j] : 0.f;
        }
        for (int j = tid; j < m; j += blockDim.x) skey[j] = attn_key(a, t, p, kc + j, nwin);
        __syncthreads();
        int j = 0;
        for (; j + 8 <= m; j += 8) { // the loads of 8 keys first, then the serial sums
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = __ldg(skey[j + u] + dd);
#pragma unroll
            for (int u = 0; u < 8; u++)
#pragma unroll
                for (int hh = 0; hh < OH; hh++) acc[hh] = fadd(acc[hh], fmul(sp[hh][j + u], v[u]));
        }
        for (; j < m; j++) {
            const float v = __ldg(skey[j] + dd);
#pragma unroll
            for (int hh = 0; hh < OH; hh++) acc[hh] = fadd(acc[hh], fmul(sp[hh][j], v));
        }
    }
    if (!dok) return;
    for (int hh = 0; hh < nh; hh++) a.out[((int64_t)t * a.H + h0 + hh) * a.HD + d] = acc[hh];
}

// The weighted sum of a chunk, register-tiled: a CTA takes one token,
// AOT_H heads and AOT_D output dims; each thread AOT_RH heads × 4 dims
// (heads hg·AOT_RH + i, dims 4·dg … 4·dg + 3), every output one running sum
// over the keys in order (k_attn_out's operations and order, so its bits).
// The keys go by in chunks of AOT_K: their probabilities (transposed to
// [key][head]) and their value slices staged in shared memory, two stages,
// the next chunk's loads in registers while the current one is summed. Per
// key a thread loads AOT_RH/4 + 1 float4s for 4·AOT_RH products, where
// k_attn_out<16> loaded a probability per product (cuda/NOTES.md v11).
// Needs HD % AOT_D == 0.
constexpr int AOT_H = 64, AOT_D = 128, AOT_RH = 8, AOT_K = 16;
constexpr int AOT_T = (AOT_H / AOT_RH) * (AOT_D / 4); // 256 threads
constexpr int AOT_PLD = AOT_H + 4;                    // probability rows [key][head], padded
constexpr int AOT_VV = AOT_K * AOT_D / 4 / AOT_T;     // value float4s per thread per chunk
constexpr int AOT_PV = AOT_K * AOT_H / 4 / AOT_T;     // probability float4s per thread per chunk
static_assert(AOT_VV * AOT_T * 4 == AOT_K * AOT_D && AOT_PV * AOT_T * 4 == AOT_K * AOT_H, "chunk loads split evenly");

// The key rows of a token's first AOT_KEYS keys, found once per CTA into
// shared memory (attn_key's window ring index is a 64-bit remainder and its
// ratio-4 rows a dependent load of the pick): the weighted sums' value loads
// then take the row from there, and attn_key only past AOT_KEYS keys.
// Needs a barrier between attn_keys_stage and the first attn_key_row.
constexpr int AOT_KEYS = 1024;
__device__ __forceinline__ void attn_keys_stage(const AttnArgs &a, int t, int64_t p, int64_t nk, int64_t nwin,
                                                const float **rows) {
    for (int k = threadIdx.x; k < min(nk, (int64_t)AOT_KEYS); k += blockDim.x) rows[k] = attn_key(a, t, p, k, nwin);
}
__device__ __forceinline__ const float *attn_key_row(const AttnArgs &a, int t, int64_t p, int64_t k, int64_t nwin,
                                                     const float *const *rows) {
    return k < AOT_KEYS ? rows[k] : attn_key(a, t, p, k, nwin);
}

// A chunk of the weighted sums' keys, kc … kc+AOT_K (k_attn_out_tile and
// k_attn_out_tc): fetch loads its value slices (AOT_D dims from d0) and
// probabilities (AOT_H heads from h0) into registers, keys past the count
// as zeros; stash stores them to shared memory, values as [key][dim] rows
// VLD floats apart and probabilities transposed to [key][head] rows PLD
// apart. Value float4 f = threadIdx.x + AOT_T·u: key f / (AOT_D/4), dims
// 4·(f % (AOT_D/4)); probability float4 f: head f / (AOT_K/4), keys
// 4·(f % (AOT_K/4)).
template <int PLD, int VLD>
struct AotChunk {
    const AttnArgs &a;
    const float *sc;
    int64_t maxk, p, nk, nwin;
    const float *const *rows; // attn_keys_stage's
    int t, d0, h0, nh;
    float4 vv[AOT_VV], pv[AOT_PV];

    __device__ __forceinline__ void fetch(int64_t kc) {
        const int tid = threadIdx.x, m = (int)min((int64_t)AOT_K, nk - kc);
#pragma unroll
        for (int u = 0; u < AOT_VV; u++) {
            const int f = tid + AOT_T * u, k = f / (AOT_D / 4);
            vv[u] = k < m ? __ldg((const float4 *)(attn_key_row(a, t, p, kc + k, nwin, rows) + d0) + f % (AOT_D / 4))
                          : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < AOT_PV; u++) {
            const int f = tid + AOT_T * u, h = min(f / (AOT_K / 4), nh - 1), k4 = 4 * (f % (AOT_K / 4));
            const float *src = sc + ((int64_t)t * a.H + h0 + h) * maxk + kc + k4;
            // maxk need not be a multiple of 4: the row's float4s are not aligned
            pv[u] = make_float4(k4 < m ? src[0] : 0.f, k4 + 1 < m ? src[1] : 0.f, k4 + 2 < m ? src[2] : 0.f,
                                k4 + 3 < m ? src[3] : 0.f);
        }
    }

    // begin: the CTA's chunk staging (token blockIdx.y, dims from
    // blockIdx.x·AOT_D, heads from blockIdx.z·AOT_H), its key count, and
    // its first AOT_KEYS key rows staged in rows (shared memory; the
    // function ends with a __syncthreads).
    __device__ static __forceinline__ AotChunk begin(const AttnArgs &a, const float *sc, int64_t maxk,
                                                     const float **rows) {
        const int t = blockIdx.y, h0 = blockIdx.z * AOT_H;
        const int64_t p = a.pos0 + t;
        int64_t nwin;
        const int64_t nk = attn_nkeys(a, t, &nwin);
        attn_keys_stage(a, t, p, nk, nwin, rows);
        __syncthreads();
        return AotChunk{a, sc, maxk, p, nk, nwin, rows, t, (int)blockIdx.x * AOT_D, h0, min(AOT_H, a.H - h0)};
    }

    __device__ __forceinline__ void stash(float *sp, float *sv) const {
        const int tid = threadIdx.x;
#pragma unroll
        for (int u = 0; u < AOT_VV; u++) {
            const int f = tid + AOT_T * u;
            *(float4 *)&sv[(f / (AOT_D / 4)) * VLD + 4 * (f % (AOT_D / 4))] = vv[u];
        }
#pragma unroll
        for (int u = 0; u < AOT_PV; u++) {
            const int f = tid + AOT_T * u, h = f / (AOT_K / 4), k4 = 4 * (f % (AOT_K / 4));
            float *d = &sp[k4 * PLD + h];
            d[0] = pv[u].x;
            d[PLD] = pv[u].y;
            d[2 * PLD] = pv[u].z;
            d[3 * PLD] = pv[u].w;
        }
    }
};

// FAST: fused multiply-adds (same order, one rounding a term). SEG (exact,
// after k_attn_softmax_seg): the segmented order — sc holds the segments'
// exponentials; each output sums a segment's terms in o from 0 and, at the
// segment's end, adds c_j·o to its total; the total divided by L at the end.
template <bool FAST, bool SEG = false>
__global__ void __launch_bounds__(AOT_T) k_attn_out_tile(AttnArgs a, const float *sc, int64_t maxk) {
    static_assert(!(FAST && SEG) && AP_SEG % AOT_K == 0, "exact mode's segments of whole chunks");
    pdl_enter();
    __shared__ __align__(16) float s_p[2][AOT_K * AOT_PLD];
    __shared__ __align__(16) float s_v[2][AOT_K * AOT_D];
    __shared__ const float *s_rows[AOT_KEYS];
    auto ch = AotChunk<AOT_PLD, AOT_D>::begin(a, sc, maxk, s_rows);
    const int tid = threadIdx.x, t = ch.t, d0 = ch.d0, h0 = ch.h0, nh = ch.nh;
    const int64_t nk = ch.nk;
    const int hg = tid / (AOT_D / 4), dg = tid % (AOT_D / 4);
    float acc[AOT_RH][4];
#pragma unroll
    for (int i = 0; i < AOT_RH; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    [[maybe_unused]] float o[AOT_RH][4]; // SEG: the current segment's sums
    // SEG: the segments' scales c_j of the CTA's heads, by segment parity;
    // loaded (thread hh < nh: head h0 + hh) as a segment's first chunk
    // starts, stored as it ends, read at the segment's end after a barrier
    [[maybe_unused]] __shared__ float s_c[2][AOT_H];
    // SEG: the heads' sums L, loaded at the start (thread hh < nh: head
    // h0 + hh; the barrier after the first chunk's stash orders it). Loaded
    // at the end, each head's load waited for the division before it: 8 L2
    // round trips a CTA (exact prefill +0.12 %; the kernel stays ≈ 15 %
    // slower than the serial form, cuda/NOTES.md v67)
    [[maybe_unused]] __shared__ float s_l[AOT_H];
    if constexpr (SEG) {
#pragma unroll
        for (int i = 0; i < AOT_RH; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
        if (tid < nh) s_l[tid] = seg_side((float *)sc, gridDim.y, a.H, maxk, t, h0 + tid)[2 * seg_nseg(maxk)];
    }
    auto step = [&](const float *pp, const float *vp) {
        float pr[AOT_RH];
#pragma unroll
        for (int i = 0; i < AOT_RH; i += 4) *(float4 *)&pr[i] = *(const float4 *)(pp + i);
        const float4 v = *(const float4 *)vp;
#pragma unroll
        for (int i = 0; i < AOT_RH; i++) {
            if constexpr (FAST) {
                acc[i][0] = fmaf(pr[i], v.x, acc[i][0]);
                acc[i][1] = fmaf(pr[i], v.y, acc[i][1]);
                acc[i][2] = fmaf(pr[i], v.z, acc[i][2]);
                acc[i][3] = fmaf(pr[i], v.w, acc[i][3]);
            } else if constexpr (SEG) {
                o[i][0] = fadd(o[i][0], fmul(pr[i], v.x));
                o[i][1] = fadd(o[i][1], fmul(pr[i], v.y));
                o[i][2] = fadd(o[i][2], fmul(pr[i], v.z));
                o[i][3] = fadd(o[i][3], fmul(pr[i], v.w));
            } else {
                acc[i][0] = fadd(acc[i][0], fmul(pr[i], v.x));
                acc[i][1] = fadd(acc[i][1], fmul(pr[i], v.y));
                acc[i][2] = fadd(acc[i][2], fmul(pr[i], v.z));
                acc[i][3] = fadd(acc[i][3], fmul(pr[i], v.w));
            }
        }
    };
    if (nk > 0) {
        ch.fetch(0);
        ch.stash(s_p[0], s_v[0]);
    }
    __syncthreads();
    for (int64_t kc = 0, c = 0; kc < nk; kc += AOT_K, c++) {
        const int st = (int)(c & 1), m = (int)min((int64_t)AOT_K, nk - kc);
        if (kc + AOT_K < nk) ch.fetch(kc + AOT_K);
        [[maybe_unused]] const int64_t j = kc / AP_SEG; // SEG: the chunk's segment
        [[maybe_unused]] float cl = 0.f;
        if constexpr (SEG)
            if (kc % AP_SEG == 0 && tid < nh) cl = seg_side((float *)sc, gridDim.y, a.H, maxk, t, h0 + tid)[j];
        const float *pp = &s_p[st][hg * AOT_RH], *vp = &s_v[st][4 * dg];
        if (m == AOT_K) {
#pragma unroll
            for (int k = 0; k < AOT_K; k++) step(pp + k * AOT_PLD, vp + k * AOT_D);
        } else {
            for (int k = 0; k < m; k++) step(pp + k * AOT_PLD, vp + k * AOT_D);
        }
        if constexpr (SEG)
            if (kc % AP_SEG == 0 && tid < nh) s_c[j & 1][tid] = cl;
        if (kc + AOT_K < nk) ch.stash(s_p[st ^ 1], s_v[st ^ 1]);
        __syncthreads();
        if constexpr (SEG) { // a segment ends: its sums join the totals, scaled
            if ((kc + m) % AP_SEG == 0 || kc + m == nk) {
#pragma unroll
                for (int i = 0; i < AOT_RH; i++) {
                    const float c = s_c[j & 1][min(hg * AOT_RH + i, nh - 1)];
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        acc[i][q] = fadd(acc[i][q], fmul(c, o[i][q]));
                        o[i][q] = 0.f;
                    }
                }
            }
        }
    }
    if constexpr (SEG) {
#pragma unroll
        for (int i = 0; i < AOT_RH; i++) {
            const float L = s_l[min(hg * AOT_RH + i, nh - 1)];
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][q] = __fdiv_rn(acc[i][q], L);
        }
    }
#pragma unroll
    for (int i = 0; i < AOT_RH; i++) {
        const int hh = hg * AOT_RH + i;
        if (hh < nh)
            *(float4 *)&a.out[((int64_t)t * a.H + h0 + hh) * a.HD + d0 + 4 * dg] =
                make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
}

// Fast mode's weighted sum of a chunk on the tensor cores: k_attn_out_tile's
// CTA (one token, AOT_H heads × AOT_D dims) and staging (AotChunk; keys
// past the count staged as zeros), the sum as TF32 mma.sync m16n8k8 with
// both operands split into two TF32 terms (the three larger cross products:
// ≈ 2^-21 of Σ p·|v| from the exact order). Warp w takes heads
// 16·(w&3) … +16 and dims 64·(w>>2) … +64: 8 tiles of 16 × 8. (Splitting
// each value once as it is staged and loading the fragments by ldmatrix
// was slower: cuda/NOTES.md v14.)
__global__ void __launch_bounds__(AOT_T) k_attn_out_tc(AttnArgs a, const float *sc, int64_t maxk) {
    static_assert(AOT_T == 256 && AOT_H == 64 && AOT_D == 128 && AOT_K % 8 == 0, "the mma layout");
    pdl_enter();
    // rows padded so that a fragment's 4 keys × 8 heads or dims hit 32 banks
    constexpr int PLD = AOT_H + 8, VLD = AOT_D + 8;
    __shared__ __align__(16) float s_p[2][AOT_K * PLD];
    __shared__ __align__(16) float s_v[2][AOT_K * VLD];
    __shared__ const float *s_rows[AOT_KEYS];
    auto ch = AotChunk<PLD, VLD>::begin(a, sc, maxk, s_rows);
    const int tid = threadIdx.x, t = ch.t, d0 = ch.d0, h0 = ch.h0, nh = ch.nh;
    const int64_t nk = ch.nk;
    const int lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int hm = 16 * (warp & 3), dn = 64 * (warp >> 2);
    float c[8][4];
#pragma unroll
    for (int j = 0; j < 8; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
    if (nk > 0) {
        ch.fetch(0);
        ch.stash(s_p[0], s_v[0]);
    }
    __syncthreads();
    for (int64_t kc = 0, ci = 0; kc < nk; kc += AOT_K, ci++) {
        const int st = (int)(ci & 1);
        if (kc + AOT_K < nk) ch.fetch(kc + AOT_K);
#pragma unroll
        for (int kk = 0; kk < AOT_K; kk += 8) {
            // A = probabilities [head][key]: (gid, tig), (gid+8, tig), (gid, tig+4), (gid+8, tig+4)
            const float *pa = &s_p[st][(kk + tig) * PLD + hm + gid];
            uint32_t ah[4], al[4];
            tf32_split(pa[0], ah[0], al[0]);
            tf32_split(pa[8], ah[1], al[1]);
            tf32_split(pa[4 * PLD], ah[2], al[2]);
            tf32_split(pa[4 * PLD + 8], ah[3], al[3]);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                // B = values [key][dim]: (key tig, dim gid), (key tig+4, dim gid)
                const float *pb = &s_v[st][(kk + tig) * VLD + dn + 8 * j + gid];
                uint32_t b0h, b0l, b1h, b1l;
                tf32_split(pb[0], b0h, b0l);
                tf32_split(pb[4 * VLD], b1h, b1l);
                mma_tf32(c[j], al, b0h, b1h); // the small terms first
                mma_tf32(c[j], ah, b0l, b1l);
                mma_tf32(c[j], ah, b0h, b1h);
            }
        }
        if (kc + AOT_K < nk) ch.stash(s_p[st ^ 1], s_v[st ^ 1]);
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            const int hh = hm + gid + 4 * e; // e 0: rows gid, e 2: gid + 8
            if (hh < nh)
                *(float2 *)&a.out[((int64_t)t * a.H + h0 + hh) * a.HD + d0 + dn + 8 * j + 2 * tig] =
                    make_float2(c[j][e], c[j][e + 1]);
        }
}

// Single tokens (and chunks of fewer than 8): the softmax and the weighted
// sum in one kernel. CTA: 32 output dims × 8 heads, warp w = head h0 + w,
// lane = dim. The warp first finds its head's maximum and the serial sum of
// the exponentials (key order, after the sink's term; lane 0 adds them from
// shared memory), then the keys go by in chunks of AP_K: the probabilities
// p_k = exp(s_k − max)/sum recomputed by the warp (exp_ref is deterministic,
// so the same values as the softmax kernel's), the chunk's 32-dim key
// slices staged in shared memory, and every thread adds p_k·v_k[d] in key
// order. The next chunk's slices are loaded into registers while the
// current one is summed. Same operations and order as k_attn_softmax +
// k_attn_out, so the same bits; each key slice is read by 8 heads at once
// (k_attn_out<2>: 2) and the softmax costs no launch of its own.
constexpr int AP_H = 8, AP_D = 32, AP_K = 256, AP_T = AP_H * 32;
constexpr int AP_LD = AP_K / (AP_T / (AP_D / 4)); // float4 key loads per thread per chunk (8)

// ecap > 0 (at least the keys of every token, a multiple of 4): the
// exponentials of the sum pass are kept in dynamic shared memory
// [AP_H][ecap] and the output pass divides them instead of computing them
// again (a double-precision exp per key and head was ≈ 40 % of the
// kernel's stall samples). In the decode graph on the H200 (ktrace, full
// size, 8k) the kernel's share of a token moved little (17.9 → 17.6 µs a
// call); run alone (TestOpLatency) the ratio-4 layer's 640 keys were
// slower with the cache (37.8 → 41.4 µs) and the ratio-128 layer's 192
// faster (21.6 → 20.9): cuda/NOTES.md v8 has the runs.
constexpr int AP_ECAP = 2048;
constexpr int AP_CL = 8; // k_attn_po_cl's cluster: CTAs of consecutive output slices
// The segmented order (DS4C_OPT_ATTN_ORDER 1; cpu.AttendHead with
// cpu.AttnSegmentKeys): AP_SEG keys a segment, and a head's row of
// exponentials in k_attn_po_cl followed by AP_SEGX floats: the segments'
// scales c_j (at most AP_ECAP / AP_SEG of them), then the sum L.
constexpr int AP_SEGX = AP_ECAP / AP_SEG + 4;
static_assert(AP_K % AP_SEG == 0 && AP_T / 32 == 2 * (AP_T / AP_SEG) && AP_SEG == 64,
              "a chunk holds whole segments, two warps' keys a segment");

// attn_out_store ends a single-token attention kernel whose warp holds
// output dims d0 + lane of head h (hok: h < H; the whole warp calls it): the
// inverse rotation when a.rfreqs is set (as k_rope: lane pairs (even, odd)
// hold a rotated pair), the store, and the Q8_0 activation when a.qact is
// set (the warp's 32 dims are one Q8_0 block: HD % 32 == 0, qseg % 32 == 0).
// cs, when set: the pair's (cosine, sine) from a.rcs, loaded by the caller
// ahead (attn_combine_at); else a.rcs is read here when set.
__device__ __forceinline__ void attn_out_store(const AttnArgs &a, int t, int h, bool hok, int d0, int lane, float acc,
                                               const float2 *cs = nullptr) {
    if (a.rfreqs) {
        const float other = __shfl_xor_sync(FULL_MASK, acc, 1);
        const int d = d0 + lane;
        if (d >= a.roff && d < a.roff + a.rd) {
            const int e = (d - a.roff) & 1;
            float pr[2];
            pr[e] = acc;
            pr[e ^ 1] = other;
            if (cs || a.rcs) { // (rope_cs of the same position and frequency: the same bits)
                const float2 c = cs ? *cs : __ldg(a.rcs + (int64_t)t * (a.rd / 2) + (d - a.roff) / 2);
                rope_pair_cs(pr, c.x, c.y, 1);
            } else {
                rope_pair(pr, (float)(a.pos0 + t), a.rfreqs[(d - a.roff) / 2], 1);
            }
            acc = pr[e];
        }
    }
    if (hok && d0 + lane < a.HD) a.out[((int64_t)t * a.H + h) * a.HD + d0 + lane] = acc;
    if (a.qact && hok) {
        const int64_t f = ((int64_t)t * a.H + h) * a.HD + d0, r = f / a.qseg, c = f % a.qseg;
        uint8_t *row = a.qact + r * a.qstride;
        q8_0_warp(acc, lane, (int8_t *)row + c, (float *)(row + a.qseg) + c / 32);
    }
}

// vec (DS4C_OPT_ATTN_PO_VEC, cuda/NOTES.md v60): the first AOT_KEYS keys'
// rows found once a CTA into shared memory (attn_keys_stage, as the chunk
// kernels do: each of the 8 threads loading a key's row formed it again),
// and the staged key slices laid out [key / 4][dim], a dim's 4 keys in one
// float4, so that a lane reads 8 keys' values and probabilities with four
// 16-byte loads instead of sixteen 4-byte ones. The same products and
// additions in the same order: the same bits.

// vec 2 (the default since cuda/NOTES.md v62): as 1, and (a) the staged
// quads' slots swizzled within each 8-dim group (po_slot) so that the
// transposing stores of a warp fall in 32 different banks (they fell in
// 8: four wavefronts a store) while a quarter-warp's reads stay in 8
// different 16-byte slots; (b) lane 0's serial sum and the weighted sums
// load the next group of 8 keys before they add the current one (two
// groups in flight, ping-pong: the loads were issued right before their
// adds, so each group of 8 dependent additions waited a shared-memory
// round trip first). The same operations in the same order: the same bits.
// vec 3 (exact mode only; not the default: +0.3 % in the decode graph,
// within the spread, cuda/NOTES.md v62): as 2, and the weighted sums on
// warps 0 … 3 only, heads 2w and 2w + 1 a warp, so that a key slice read
// from shared memory serves two heads' sums (the softmax statistics stay a
// head a warp on all 8 warps: with 4 warps for them too, k_attn_pox of
// v62's first call, their double-precision exponentials doubled the phase).
__device__ __forceinline__ int po_slot(int d) { return (d & ~7) | ((d + (d >> 3)) & 7); }
__device__ __forceinline__ float4 ld4s(const float *p) { return *(const float4 *)p; }
// po_ahead8 walks keys 0 … m − 1 in groups of 8, in order, with the next
// group's loads issued before the current group is used: load(g, buf) fills
// a Buf with keys g … g + 7 (g a multiple of 4), use(buf) consumes it. Two
// Bufs alternate; the load past the last whole group is clamped to the last
// aligned group within m, so it stays in bounds and is never used. Returns
// the keys done (m rounded down to 8); the caller does the rest one by one.
template <class Buf, class Load, class Use>
__device__ __forceinline__ int po_ahead8(int m, Load load, Use use) {
    int j = 0;
    if (m >= 8) {
        const int last = (m - 8) & ~3;
        Buf a, b;
        load(0, a);
        for (; j + 16 <= m; j += 16) {
            load(j + 8, b);
            use(a);
            load(min(j + 16, last), a);
            use(b);
        }
        if (j + 8 <= m) { // a holds keys j … j + 7
            use(a);
            j += 8;
        }
    }
    return j;
}
struct PoQ2 { // a group of 8 floats
    float4 x0, x1;
};
// sum + sp[0] + … + sp[m − 1], added one at a time in order (sp 16-byte
// aligned, readable to m).
__device__ __forceinline__ float po_sum_ahead(float sum, const float *sp, int m) {
    auto load = [&](int g, PoQ2 &b) { b.x0 = ld4s(sp + g), b.x1 = ld4s(sp + g + 4); };
    auto add8 = [&](const PoQ2 &b) {
        sum = fadd(fadd(fadd(fadd(sum, b.x0.x), b.x0.y), b.x0.z), b.x0.w);
        sum = fadd(fadd(fadd(fadd(sum, b.x1.x), b.x1.y), b.x1.z), b.x1.w);
    };
    for (int j = po_ahead8<PoQ2>(m, load, add8); j < m; j++) sum = fadd(sum, sp[j]);
    return sum;
}
struct PoVP { // a group of 8 keys' values (a dim) and one head's probabilities
    float4 v0, v1, q0, q1;
};
struct PoVPP { // the same with a second head's probabilities
    float4 v0, v1, q0, q1, r0, r1;
};

// A cluster barrier in two halves: cluster_arrive (every thread: its
// earlier writes, global memory's included, released at cluster scope) and
// cluster_wait (until every thread of the cluster's CTAs has arrived; theirs
// acquired). Work between the two overlaps the others' arrival — k_attn_po_cl
// waits only before it exits, so that its shared memory outlives the other
// CTAs' reads of it.
static __device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
static __device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// cluster_sync_all: both halves at once. Every thread calls it.
static __device__ __forceinline__ void cluster_sync_all() {
    cluster_arrive();
    cluster_wait();
}

// copy_peer_row copies n4 float4s of shared memory from the same address in
// cluster CTA rank into this CTA (row: its start), by the 32 lanes of one
// warp, 4 float4s a lane in flight.
static __device__ __forceinline__ void copy_peer_row(float *row, int rank, int n4, int lane) {
    const float4 *src = (const float4 *)cg::this_cluster().map_shared_rank(row, rank);
    float4 *dst = (float4 *)row;
    for (int j0 = lane; j0 < n4; j0 += 4 * 32) {
        float4 x[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (j0 + 32 * u < n4) x[u] = src[j0 + 32 * u];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (j0 + 32 * u < n4) dst[j0 + 32 * u] = x[u];
    }
}

// k_attn_po_cl's softmax statistics. Its cluster is the AP_CL CTAs of
// consecutive output slices of one token's AP_H heads; CTA r of the cluster
// forms head r's probabilities with all its threads — the maximum of the
// sink and the scores, each score's exponential exp_ref(s − max), their sum
// by one thread in key order after the sink's term (the CPU's order), each
// exponential divided by it — into row r of s_e (its exponentials' cache,
// [AP_H][ecap]); after a cluster barrier, warp w of every CTA copies row w
// from CTA w. In two steps: PoScoresCL::load issues the head's score loads
// (before the CTA's key slices', which would otherwise queue ahead of them),
// stats the rest. Needs AP_CL == AP_H, nk ≤ ecap ≤ AP_ECAP (ecap a multiple
// of 4); red: 16 floats of shared memory.
static_assert(AP_CL == AP_H, "a cluster's CTA a head of the group");
struct PoScoresCL {
    static constexpr int PT = AP_ECAP / AP_T; // scores a thread at most
    float v[PT], sink;
    int r;     // the CTA's rank in the cluster: its head in the group
    bool live; // head r exists

    __device__ __forceinline__ void load(const AttnArgs &a, const float *sc, int64_t maxk, int nk, int t) {
        r = (int)cg::this_cluster().block_rank();
        const int hr = blockIdx.z * AP_H + r;
        live = hr < a.H;
        sink = live ? a.sinks[hr] : 0.f;
        const float *s = sc + ((int64_t)t * a.H + (live ? hr : 0)) * maxk;
#pragma unroll
        for (int u = 0; u < PT; u++) {
            const int k = threadIdx.x + u * AP_T;
            v[u] = live && k < nk ? s[k] : sink;
        }
    }

    // mark(i): the probe's mark i (4: the maximum, 5: the exponentials, 6:
    // the sum, 7: the divisions and the cluster barrier).
    template <class Mark>
    __device__ __forceinline__ void stats(const AttnArgs &a, int ecap, int nk, float *s_e, float *red, Mark mark) const {
        const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
        float *er = s_e + (size_t)r * ecap;
        if (live) { // the same for the whole CTA
            float mx = sink;
#pragma unroll
            for (int u = 0; u < PT; u++) mx = fmax_go(mx, v[u]);
            mx = warp_max(mx);
            if (lane == 0) red[w] = mx;
            __syncthreads();
            mark(4);
#pragma unroll
            for (int i = 0; i < AP_T / 32; i++) mx = fmaxf(mx, red[i]);
#pragma unroll
            for (int u = 0; u < PT; u++) {
                const int k = tid + u * AP_T;
                if (k < nk) er[k] = exp_ref(fsub(v[u], mx));
            }
            __syncthreads();
            mark(5);
            if (tid == 0) red[AP_T / 32] = po_sum_ahead(exp_ref(fsub(sink, mx)), er, nk);
            __syncthreads();
            mark(6);
            const float sum = red[AP_T / 32];
#pragma unroll
            for (int u = 0; u < PT; u++) {
                const int k = tid + u * AP_T;
                if (k < nk) er[k] = __fdiv_rn(er[k], sum);
            }
        }
        cluster_sync_all(); // every CTA's row is whole
        mark(7);
        if (w != r && blockIdx.z * AP_H + w < a.H)
            copy_peer_row(s_e + (size_t)w * ecap, w, (nk + 3) / 4, lane);
        __syncwarp();
        cluster_arrive();
    }

    // stats_seg is stats for the segmented order: row r of s_e (es floats
    // apart, es ≥ ecap + AP_SEGX) gets head r's e_k = exp_ref(s_k − m_j),
    // m_j the maximum of key k's segment j, and after ecap its segments'
    // c_j = exp_ref(m_j − M) and then L = exp_ref(sink − M) + l_0·c_0 + …,
    // l_j the sum of segment j's e_k in key order (by lane j of warp 0)
    // and the l_j·c_j added in segment order; every CTA then copies the other
    // rows whole. red: PT·AP_T/32 + AP_ECAP/AP_SEG floats of shared memory.
    template <class Mark>
    __device__ __forceinline__ void stats_seg(const AttnArgs &a, int ecap, int es, int nk, float *s_e, float *red,
                                              Mark mark) const {
        const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
        constexpr int NW = AP_T / 32;
        float *er = s_e + (size_t)r * es, *segm = red + PT * NW;
        if (live) {
            // each warp's 32 keys lie in one segment (warp pair 2i, 2i + 1: segment 4u + i)
#pragma unroll
            for (int u = 0; u < PT; u++) {
                const float m = warp_max(tid + u * AP_T < nk ? v[u] : -INFINITY);
                if (lane == 0) red[u * NW + w] = m;
            }
            __syncthreads();
            mark(4);
            float M = sink;
#pragma unroll
            for (int i = 0; i < PT * NW; i++) M = fmaxf(M, red[i]);
#pragma unroll
            for (int u = 0; u < PT; u++) {
                const int k = tid + u * AP_T;
                const float mj = fmaxf(red[u * NW + (w & ~1)], red[u * NW + (w | 1)]);
                if (k < nk) er[k] = exp_ref(fsub(v[u], mj));
                if (k < nk && (k & (AP_SEG - 1)) == 0) segm[k / AP_SEG] = mj;
            }
            __syncthreads();
            mark(5);
            if (w == 0) {
                const int nseg = (nk + AP_SEG - 1) / AP_SEG;
                float lc = 0.f;
                if (lane < nseg) {
                    const float c = exp_ref(fsub(segm[lane], M));
                    lc = fmul(po_sum_ahead(0.f, er + lane * AP_SEG, min(AP_SEG, nk - lane * AP_SEG)), c);
                    er[ecap + lane] = c;
                }
                float L = exp_ref(fsub(sink, M));
                for (int j = 0; j < nseg; j++) L = fadd(L, __shfl_sync(FULL_MASK, lc, j));
                if (lane == 0) er[ecap + AP_ECAP / AP_SEG] = L;
            }
            mark(6);
        }
        cluster_sync_all(); // every CTA's row is whole
        mark(7);
        if (w != r && blockIdx.z * AP_H + w < a.H)
            copy_peer_row(s_e + (size_t)w * es, w, (ecap + AP_SEGX) / 4, lane);
        __syncwarp();
        cluster_arrive();
    }
};

// po_seg_mac adds NS whole segments' weighted sums to acc in segment order:
// o_s = Σ e_k·v_k (key order, from 0) for the AP_SEG keys of each segment s
// = s0 … s0 + NS − 1 of the staged chunk (vq: this thread's dim's key
// quads, AP_D float4s apart; sp: the chunk's exponentials of this warp's
// head; cs: its segments' scales), then acc += c_s·o_s. The NS chains run
// side by side.
template <int NS>
__device__ __forceinline__ float po_seg_mac(float acc, const float4 *vq, const float *sp, const float *cs, int s0) {
    float o[NS];
#pragma unroll
    for (int s = 0; s < NS; s++) o[s] = 0.f;
#pragma unroll 2
    for (int i = 0; i < AP_SEG; i += 4) {
        float4 v[NS], p[NS];
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const int g = (s0 + s) * AP_SEG + i;
            v[s] = vq[(g >> 2) * AP_D];
            p[s] = ld4s(sp + g);
        }
#pragma unroll
        for (int s = 0; s < NS; s++) {
            o[s] = fadd(o[s], fmul(p[s].x, v[s].x));
            o[s] = fadd(o[s], fmul(p[s].y, v[s].y));
            o[s] = fadd(o[s], fmul(p[s].z, v[s].z));
            o[s] = fadd(o[s], fmul(p[s].w, v[s].w));
        }
    }
#pragma unroll
    for (int s = 0; s < NS; s++) acc = fadd(acc, fmul(cs[s0 + s], o[s]));
    return acc;
}

// attn_po_run is k_attn_po's body (CL false) and k_attn_po_cl's (CL true:
// exact mode, the exponentials cached, vec 2's loops; SEG: the segmented
// order, its rows of exponentials ecap + AP_SEGX floats apart).
template <bool FAST, bool CL, bool SEG = false>
__device__ __forceinline__ void attn_po_run(const AttnArgs &a, const float *sc, int64_t maxk, int ecap, int vec) {
    static_assert(CL || !SEG, "the segmented order is k_attn_po_cl's");
    APM_BEGIN();
    pdl_enter();
    APM(1);
    __shared__ __align__(16) float4 s_v[AP_K][AP_D / 4]; // vec: as float4 [AP_K / 4][AP_D], a dim's 4 keys each
    __shared__ __align__(16) float s_p[AP_H][AP_K];
    __shared__ const float *s_kr[AOT_KEYS]; // vec: the first AOT_KEYS keys' rows
    const bool swz = vec >= 2, two = vec == 3 && !FAST; // two: warps 0 … 3 sum two heads each (heads 2w, 2w + 1)
    extern __shared__ float s_e[]; // [AP_H][ecap]
    const int t = blockIdx.y, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int64_t p = a.pos0 + t;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    const int h = blockIdx.z * AP_H + w;
    const bool hok = h < a.H;
    const int d0 = blockIdx.x * AP_D;
    if (vec) {
        attn_keys_stage(a, t, p, nk, nwin, s_kr);
        __syncthreads();
    }
    APM(2);
    // loads of a chunk: float4 column tid % 8 of keys tid / 8 + 32·u
    const int lc = tid % (AP_D / 4), lk = tid / (AP_D / 4);
    float4 nv[AP_LD];
    auto load_into = [&](int64_t kc, float4(&buf)[AP_LD]) {
#pragma unroll
        for (int u = 0; u < AP_LD; u++) {
            const int64_t k = kc + lk + u * (AP_T / (AP_D / 4));
            const float *row = k >= nk ? nullptr : vec && k < AOT_KEYS ? s_kr[k] : attn_key(a, t, p, k, nwin);
            buf[u] = k < nk ? __ldg((const float4 *)(row + d0) + lc) : make_float4(0, 0, 0, 0);
        }
    };
    [[maybe_unused]] PoScoresCL scl;
    if constexpr (CL) scl.load(a, sc, maxk, (int)nk, t); // ahead of the key slices' loads
    load_into(0, nv);
    // softmax statistics of head h: maximum, then the serial sum
    const float *s = sc + ((int64_t)t * a.H + (hok ? h : 0)) * maxk;
    const float sink = hok ? a.sinks[h] : 0.f;
    float mx = sink;
    if constexpr (!CL) {
        for (int64_t k = lane; k < nk; k += 32) mx = fmax_go(mx, s[k]);
        mx = warp_max(mx);
    }
    if (!FAST) {
        PHASE_SYNC();
        APM(3);
    }
    float sum = FAST ? expf(sink - mx) : exp_ref(fsub(sink, mx)), part = 0.f;
    float *sp = s_p[w];
    float *se = s_e + (size_t)w * (SEG ? ecap + AP_SEGX : ecap);
    [[maybe_unused]] auto mark = [&](int i) {
        (void)i;
        APM(i);
    };
    if constexpr (SEG) // every row of s_e holds its head's exponentials, scales and sum
        scl.stats_seg(a, ecap, ecap + AP_SEGX, (int)nk, s_e, s_p[0], mark);
    else if constexpr (CL) // every row of s_e already holds its head's probabilities
        scl.stats(a, ecap, (int)nk, s_e, s_p[0], mark);
    if constexpr (CL) APM(8);
    for (int64_t kc = 0; kc < (CL ? 0 : nk); kc += AP_K) {
        const int m = (int)min((int64_t)AP_K, nk - kc);
        if (ecap) sp = se + kc;
        if constexpr (FAST) { // lane sums, a shuffle tree after the last chunk
            for (int j = lane; j < m; j += 32) {
                const float e = expf(s[kc + j] - mx);
                sp[j] = e;
                part += e;
            }
            continue;
        }
        for (int j = lane; j < m; j += 32) sp[j] = exp_ref(fsub(s[kc + j], mx));
        __syncwarp();
        if (lane == 0 && swz) {
            sum = po_sum_ahead(sum, sp, m);
        } else if (lane == 0) {
            int j = 0;
            for (; j + 8 <= m; j += 8) {
                float e[8];
#pragma unroll
                for (int u = 0; u < 8; u++) e[u] = sp[j + u];
#pragma unroll
                for (int u = 0; u < 8; u++) sum = fadd(sum, e[u]);
            }
            for (; j < m; j++) sum = fadd(sum, sp[j]);
        }
        __syncwarp();
    }
    if constexpr (FAST) {
        sum += warp_sum(part);
        __syncwarp();
    } else if constexpr (!CL) {
        sum = __shfl_sync(FULL_MASK, sum, 0);
        PHASE_SYNC();
        APM(4);
    }
    float acc = 0.f, acc1 = 0.f;
    const float *vcol = (const float *)s_v + lane; // this thread's dim in a staged row
    const float4 *vq = (const float4 *)s_v + (swz ? po_slot(lane) : lane); // vec: this thread's dim's key quads, AP_D float4s apart
    // chunk stages the slices of keys kc … kc + AP_K − 1 (at most) from buf,
    // issues the loads of the chunk at kc + ahead into buf, and sums the
    // staged keys
    auto chunk = [&](int64_t kc, float4(&buf)[AP_LD]) {
        const int m = (int)min((int64_t)AP_K, nk - kc);
        __syncthreads(); // the previous chunk is consumed
        if (vec) {
            float *sv = (float *)s_v;
#pragma unroll
            for (int u = 0; u < AP_LD; u++) {
                const int kk = lk + u * (AP_T / (AP_D / 4));
                float *q = sv + (kk >> 2) * AP_D * 4 + (kk & 3); // dims 4lc … 4lc+3 of key kk
                if (swz) {
                    q[po_slot(4 * lc) * 4] = buf[u].x;
                    q[po_slot(4 * lc + 1) * 4] = buf[u].y;
                    q[po_slot(4 * lc + 2) * 4] = buf[u].z;
                    q[po_slot(4 * lc + 3) * 4] = buf[u].w;
                } else {
                    q += 4 * lc * 4;
                    q[0] = buf[u].x;
                    q[4] = buf[u].y;
                    q[8] = buf[u].z;
                    q[12] = buf[u].w;
                }
            }
        } else {
#pragma unroll
            for (int u = 0; u < AP_LD; u++) s_v[lk + u * (AP_T / (AP_D / 4))][lc] = buf[u];
        }
        if (ecap) {
            sp = se + kc; // this warp's own row: the exponentials become the probabilities in place
            if constexpr (!CL)
                for (int j = lane; j < m; j += 32) sp[j] = __fdiv_rn(sp[j], sum);
        } else {
            for (int j = lane; j < m; j += 32)
                sp[j] = __fdiv_rn(FAST ? expf(s[kc + j] - mx) : exp_ref(fsub(s[kc + j], mx)), sum);
        }
        __syncthreads();
        if (kc + AP_K < nk) load_into(kc + AP_K, buf);
        int j = 0;
        if constexpr (SEG) { // the chunk's segments: whole ones 4 or 2 at a time, then the rest
            const float *cs = se + ecap + kc / AP_SEG;
            const int whole = m / AP_SEG;
            int s0 = 0;
            for (; s0 + 4 <= whole; s0 += 4) acc = po_seg_mac<4>(acc, vq, sp, cs, s0);
            for (; s0 + 2 <= whole; s0 += 2) acc = po_seg_mac<2>(acc, vq, sp, cs, s0);
            if (s0 < whole) acc = po_seg_mac<1>(acc, vq, sp, cs, s0++);
            if (s0 * AP_SEG < m) { // the last, short segment
                float o = 0.f;
                for (j = s0 * AP_SEG; j < m; j++) o = fadd(o, fmul(sp[j], ((const float *)(vq + (j >> 2) * AP_D))[j & 3]));
                acc = fadd(acc, fmul(cs[s0], o));
            }
            return;
        }
        if (two) { // heads 2w and 2w + 1 over the same key slices, each in key order
            if (w >= AP_H / 2) return;
            const float *p0 = ecap ? s_e + (size_t)(2 * w) * ecap + kc : s_p[2 * w];
            const float *p1 = ecap ? s_e + (size_t)(2 * w + 1) * ecap + kc : s_p[2 * w + 1];
            auto load = [&](int g, PoVPP &b) {
                b.v0 = vq[(g >> 2) * AP_D], b.v1 = vq[((g >> 2) + 1) * AP_D];
                b.q0 = ld4s(p0 + g), b.q1 = ld4s(p0 + g + 4);
                b.r0 = ld4s(p1 + g), b.r1 = ld4s(p1 + g + 4);
            };
            auto mac8 = [&](const PoVPP &b) {
                const float v[8] = {b.v0.x, b.v0.y, b.v0.z, b.v0.w, b.v1.x, b.v1.y, b.v1.z, b.v1.w};
                const float x[8] = {b.q0.x, b.q0.y, b.q0.z, b.q0.w, b.q1.x, b.q1.y, b.q1.z, b.q1.w};
                const float y[8] = {b.r0.x, b.r0.y, b.r0.z, b.r0.w, b.r1.x, b.r1.y, b.r1.z, b.r1.w};
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    acc = fadd(acc, fmul(x[u], v[u]));
                    acc1 = fadd(acc1, fmul(y[u], v[u]));
                }
            };
            for (j = po_ahead8<PoVPP>(m, load, mac8); j < m; j++) {
                const float v = ((const float *)(vq + (j >> 2) * AP_D))[j & 3];
                acc = fadd(acc, fmul(p0[j], v));
                acc1 = fadd(acc1, fmul(p1[j], v));
            }
            return;
        }
        if (swz) { // two groups of 8 keys in flight (po_ahead8); the rest below, one at a time
            auto load = [&](int g, PoVP &b) {
                b.v0 = vq[(g >> 2) * AP_D], b.v1 = vq[((g >> 2) + 1) * AP_D];
                b.q0 = ld4s(sp + g), b.q1 = ld4s(sp + g + 4);
            };
            auto mac8 = [&](const PoVP &b) {
                const float v[8] = {b.v0.x, b.v0.y, b.v0.z, b.v0.w, b.v1.x, b.v1.y, b.v1.z, b.v1.w};
                const float q[8] = {b.q0.x, b.q0.y, b.q0.z, b.q0.w, b.q1.x, b.q1.y, b.q1.z, b.q1.w};
#pragma unroll
                for (int u = 0; u < 8; u++) acc = FAST ? fmaf(q[u], v[u], acc) : fadd(acc, fmul(q[u], v[u]));
            };
            j = po_ahead8<PoVP>(m, load, mac8);
        }
        if (vec) {
            for (; j + 8 <= m; j += 8) {
                const float4 va = vq[(j >> 2) * AP_D], vb = vq[((j >> 2) + 1) * AP_D];
                const float4 qa = *(const float4 *)(sp + j), qb = *(const float4 *)(sp + j + 4);
                const float v[8] = {va.x, va.y, va.z, va.w, vb.x, vb.y, vb.z, vb.w};
                const float q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                for (int u = 0; u < 8; u++) acc = FAST ? fmaf(q[u], v[u], acc) : fadd(acc, fmul(q[u], v[u]));
            }
            for (; j < m; j++) {
                const float v = ((const float *)(vq + (j >> 2) * AP_D))[j & 3];
                acc = FAST ? fmaf(sp[j], v, acc) : fadd(acc, fmul(sp[j], v));
            }
            return;
        }
        for (; j + 8 <= m; j += 8) {
            float v[8], q[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                v[u] = vcol[(j + u) * AP_D];
                q[u] = sp[j + u];
            }
#pragma unroll
            for (int u = 0; u < 8; u++) acc = FAST ? fmaf(q[u], v[u], acc) : fadd(acc, fmul(q[u], v[u]));
        }
        for (; j < m; j++) acc = FAST ? fmaf(sp[j], vcol[j * AP_D], acc) : fadd(acc, fmul(sp[j], vcol[j * AP_D]));
    };
    for (int64_t kc = 0; kc < nk; kc += AP_K) chunk(kc, nv);
    if constexpr (SEG) acc = __fdiv_rn(acc, se[ecap + AP_ECAP / AP_SEG]);
    if (!FAST) {
        PHASE_SYNC();
        APM(CL ? 9 : 5);
    }
    if (two) {
        if (w < AP_H / 2) {
            const int ha = blockIdx.z * AP_H + 2 * w;
            attn_out_store(a, t, ha, ha < a.H, d0, lane, acc);
            attn_out_store(a, t, ha + 1, ha + 1 < a.H, d0, lane, acc1);
        }
    } else {
        attn_out_store(a, t, h, hok, d0, lane, acc);
    }
    if constexpr (CL) cluster_wait(); // no CTA leaves while another may still read its row
    if (!FAST) APM_END(CL ? (nk >= 512 ? 7 : 8) : nk >= 512 ? 5 : 6);
}

template <bool FAST>
__global__ void __launch_bounds__(AP_T) k_attn_po(AttnArgs a, const float *sc, int64_t maxk, int ecap, int vec) {
    attn_po_run<FAST, false>(a, sc, maxk, ecap, vec);
}

// k_attn_po_cl (DS4C_OPT_ATTN_PO_VEC 4; exact mode, when a CTA caches its
// heads' exponentials, ecap > 0; SEG: the segmented order, stats_seg and
// po_seg_mac, DS4C_OPT_ATTN_ORDER 1): k_attn_po with option 2's loops, its
// softmax statistics formed once a head within a thread-block cluster of
// the AP_CL CTAs of consecutive output slices (PoScoresCL), instead
// of by every output CTA of the head (16 on Flash), whose warps each walked
// the head's scores a global load at a time while 15 other CTAs read the
// same lines. The same operations in the same order: the same bits.
template <bool SEG>
__global__ void __cluster_dims__(AP_CL, 1, 1) __launch_bounds__(AP_T)
    k_attn_po_cl(AttnArgs a, const float *sc, int64_t maxk, int ecap) {
    attn_po_run<false, true, SEG>(a, sc, maxk, ecap, 2);
}

// ------------------------------------------------------------ exact single tokens, split over segments
// The segmented order (DS4C_OPT_ATTN_ORDER 2-5; cpu.AttendHead with
// cpu.AttnSegmentKeys) split over the keys as flash decoding is, after
// k_attn_scores<1>: k_attn_seg<SD> gives each CTA one segment of AP_SEG keys
// of one token, SG_H heads and SD dims of each (warp w: head h0 + w, lane l:
// dims l·SD/32 … on; SD 128 with option value 2, 64 with 3, 32 with 4: more
// CTAs for a ratio-128 layer's three segments); it forms the segment's maximum m_j, exponentials e_k =
// exp_ref(s_k − m_j) and their sum l_j in key order (lane 0), stages the
// segment's key slices, and writes o_j = Σ e_k·v_k (key order, from 0) and
// (m_j, l_j) to the work buffer after the scores. k_attn_seg_combine then
// gives each warp a head and 32 dims of a token: M, c_j = exp_ref(m_j − M),
// L = exp_ref(sink − M) + l_0·c_0 + … and out = (c_0·o_0 + …) / L in segment
// order, then attn_out_store (rotation, Q8_0 activation). Each (head,
// segment)'s statistics are formed by the HD / SD dim-slice CTAs alike (the
// same bits); the first of them writes them.
//
// CL (option 5; SD 64 and HD = SG_CL · 64, Flash's 512): no k_attn_scores<1>
// before it — the segment's HD / SD = SG_CL dim-slice CTAs of a head group
// are a thread-block cluster (blockIdx.z = group · SG_CL + slice), CTA r
// forms the scores of the segment's keys 8r … 8r + 7 for the group's 8 heads
// (a dot a 4 lanes: lane i of the 4 the products of dims ≡ i mod 4 in dim
// order, then (s_0 + s_1) + (s_2 + s_3) times the scale: dotF32's order and
// k_attn_scores' bits) and stores each into every CTA's shared row of
// scores (DSMEM); after the cluster barrier each CTA goes on as above.
constexpr int SG_H = 8, SG_T = SG_H * 32, SG_CL = 8;
// CL's staging: 16 rows of 512 dims, each as 4 planes of SGC_RS values
// SGC_LD apart (a plane: the dims ≡ i mod 4), rows SGC_PS apart: a warp's
// key loads (8 keys × 4 planes, 16 bytes each) fall in 32 different banks
// a quarter-warp (SGC_LD ≡ 4, SGC_PS ≡ 16 mod 32)
constexpr int SGC_ROWS = 2 * SG_H, SGC_RS = 128, SGC_LD = SGC_RS + 4, SGC_PS = 4 * SGC_LD;
// sgc_put stages float4 c of a row (its dims 4c … 4c + 3) as row row of
// s_buf: dim 4c + i in plane i at slot c
__device__ __forceinline__ void sgc_put(float *s_buf, int row, int c, float4 v) {
    float *d = s_buf + row * SGC_PS + c;
    d[0] = v.x, d[SGC_LD] = v.y, d[2 * SGC_LD] = v.z, d[3 * SGC_LD] = v.w;
}

// The CL score and sum forms (DS4C_OPT_ATTN_SEG_FORM; model.cu v75). A
// CTA's score work is SG_H heads × 8 keys × 4 chains (chain r: dims ≡ r
// mod 4 in order), 128 serial steps each; its sums SG_H heads × SD dims,
// AP_SEG serial steps each. Form 0 gives every thread one chain and one
// head's 2 dims; each step then reads its query and key from shared memory
// (ncu, v75: the L1/shared pipe 83 % busy, the kernel's bound). The other
// forms give a thread HB heads (h, h + SG_H / HB, …) × KB keys of one chain,
// or two heads of one dim in the sums, so that a value read from shared
// memory serves several chains; each chain and each sum keeps its own
// operations in its own order: the same bits.
//   SF (scores): 0 HB = KB = 1, all 8 warps; 1 HB = 2, KB = 1, warps 0-3;
//   2 HB = KB = 2, warps 0-1. PF (sums): 0 a head's 2 dims a lane; 1 two
//   heads (h, h + 4) of one dim a lane, all 8 warps.
// A warp's query reads fall on 8 rows of both parities (1 wavefront), its
// key reads on 16 (2): SGC_PS ≡ 16, SGC_LD ≡ 4 mod 32.
static_assert(SG_H == 8 && SG_CL == 8 && AP_SEG == 64 && SGC_RS == 128, "the CL forms' shapes");
template <int HB, int KB>
__device__ __forceinline__ void sgc_dots(const float *s_buf, int hi0, int kk0, int r, float (&acc)[HB][KB]) {
    const float *qs[HB], *ks[KB];
#pragma unroll
    for (int i = 0; i < HB; i++) qs[i] = s_buf + (hi0 + i * (SG_H / HB)) * SGC_PS + r * SGC_LD;
#pragma unroll
    for (int i = 0; i < KB; i++) ks[i] = s_buf + (SG_H + kk0 + i * (AP_SEG / SG_CL / KB)) * SGC_PS + r * SGC_LD;
#pragma unroll
    for (int i = 0; i < HB; i++)
#pragma unroll
        for (int k = 0; k < KB; k++) acc[i][k] = 0.f;
#pragma unroll 4
    for (int s = 0; s < SGC_RS; s += 4) { // chain r: dims r, r + 4, … in order
        float4 qv[HB], kv[KB];
#pragma unroll
        for (int i = 0; i < HB; i++) qv[i] = *(const float4 *)(qs[i] + s);
#pragma unroll
        for (int k = 0; k < KB; k++) kv[k] = *(const float4 *)(ks[k] + s);
#pragma unroll
        for (int i = 0; i < HB; i++)
#pragma unroll
            for (int k = 0; k < KB; k++) {
                float c = acc[i][k];
                c = fadd(c, fmul(qv[i].x, kv[k].x));
                c = fadd(c, fmul(qv[i].y, kv[k].y));
                c = fadd(c, fmul(qv[i].z, kv[k].z));
                c = fadd(c, fmul(qv[i].w, kv[k].w));
                acc[i][k] = c;
            }
    }
}
// sgc_scores: the CTA's keys' scores (rank ds: keys 8·ds … of the segment,
// m of them in all) for its group's SG_H heads, from the staged rows, into
// row [h][key] of every cluster CTA's sc (DSMEM); the cluster barrier after
// it is the caller's. dotF32's order: (s_0 + s_1) + (s_2 + s_3), times the scale.
template <int SF>
__device__ __forceinline__ void sgc_scores(const float *s_buf, float (*sc)[AP_SEG], float scale, int ds, int m, int tid) {
    constexpr int HB = SF == 0 ? 1 : 2, KB = SF == 2 ? 2 : 1, NT = SG_T / (HB * KB);
    if constexpr (NT < SG_T)
        if (tid >= NT) return; // (whole warps)
    const int r = tid & 3;
    int hi0, kk0;
    if constexpr (SF == 0) {
        hi0 = tid >> 5, kk0 = (tid >> 2) & 7;
    } else { // a warp: 2 heads of each parity × 4 keys × 4 chains
        const int kq = (tid >> 2) & 3, hp = (tid >> 4) & 1, wv = tid >> 5;
        kk0 = SF == 1 ? (wv & 1) * 4 + kq : kq;
        hi0 = (SF == 1 ? wv >> 1 : wv) * 2 + hp;
    }
    float acc[HB][KB];
    sgc_dots<HB, KB>(s_buf, hi0, kk0, r, acc);
    cg::cluster_group cl = cg::this_cluster();
#pragma unroll
    for (int i = 0; i < HB; i++)
#pragma unroll
        for (int k = 0; k < KB; k++) {
            const float x = acc[i][k];
            const float v1 = __shfl_down_sync(FULL_MASK, x, 1), v2 = __shfl_down_sync(FULL_MASK, x, 2),
                        v3 = __shfl_down_sync(FULL_MASK, x, 3);
            const int hi = hi0 + i * (SG_H / HB), kl = ds * (AP_SEG / SG_CL) + kk0 + k * (AP_SEG / SG_CL / KB);
            if (r == 0 && kl < m) {
                const float s = fmul(fadd(fadd(x, v1), fadd(v2, v3)), scale);
#pragma unroll
                for (int c = 0; c < SG_CL; c++) cl.map_shared_rank(&sc[hi][0], c)[kl] = s;
            }
        }
}
// seg_lane_sums: this lane's DL = SD / 32 dims (DL·lane …) of o = Σ_k e_k·v_k
// over a segment's m staged value slices (s_v, SD dims each) in key order
// (from 0), e the head's exponentials: the segment kernels' weighted sums.
template <int SD>
__device__ __forceinline__ void seg_lane_sums(const float4 (*s_v)[SD / 4], const float *e, int m, int lane, float (&o)[SD / 32]) {
    constexpr int DL = SD / 32;
#pragma unroll
    for (int i = 0; i < DL; i++) o[i] = 0.f;
    // this lane's DL dims of staged key k
    auto val = [&](int k, float (&v)[DL]) {
        if constexpr (DL == 4) {
            const float4 x = s_v[k][lane];
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
        } else if constexpr (DL == 2) {
            const float2 x = ((const float2 *)s_v[k])[lane];
            v[0] = x.x, v[1] = x.y;
        } else {
            v[0] = ((const float *)s_v[k])[lane];
        }
    };
    int k = 0;
    for (; k + 4 <= m; k += 4) {
        const float4 e4 = ld4s(e + k);
        const float ev[4] = {e4.x, e4.y, e4.z, e4.w};
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float v[DL];
            val(k + u, v);
#pragma unroll
            for (int i = 0; i < DL; i++) o[i] = fadd(o[i], fmul(ev[u], v[i]));
        }
    }
    for (; k < m; k++) {
        float v[DL];
        val(k, v);
#pragma unroll
        for (int i = 0; i < DL; i++) o[i] = fadd(o[i], fmul(e[k], v[i]));
    }
}
// sgc_sums: o = Σ_k e_k·v_k over the segment's m keys in key order (from 0)
// for the group's heads and the CTA's 64 dims (s_v: the staged value
// slices, ex: the heads' exponentials), stored at o + head·HD + dim for the
// heads below nh (PF above).
template <int PF>
__device__ __forceinline__ void sgc_sums(const float4 (*s_v)[16], const float (*ex)[AP_SEG], int m, int tid, float *o, int64_t HD, int nh) {
    const int w = tid >> 5, lane = tid & 31;
    if constexpr (PF == 0) {
        float ov[2];
        seg_lane_sums<64>(s_v, ex[w], m, lane, ov);
        if (w < nh) *(float2 *)(o + w * HD + 2 * lane) = make_float2(ov[0], ov[1]);
    } else {
        const int ha = w & 3, hb = ha + 4, dim = (w >> 2) * 32 + lane;
        const float *ea = ex[ha], *eb = ex[hb];
        float oa = 0.f, ob = 0.f;
        int k = 0;
        for (; k + 4 <= m; k += 4) {
            const float4 a4 = ld4s(ea + k), b4 = ld4s(eb + k);
            const float av[4] = {a4.x, a4.y, a4.z, a4.w}, bv[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float v = ((const float *)s_v[k + u])[dim];
                oa = fadd(oa, fmul(av[u], v));
                ob = fadd(ob, fmul(bv[u], v));
            }
        }
        for (; k < m; k++) {
            const float v = ((const float *)s_v[k])[dim];
            oa = fadd(oa, fmul(ea[k], v));
            ob = fadd(ob, fmul(eb[k], v));
        }
        if (ha < nh) o[ha * HD + dim] = oa;
        if (hb < nh) o[hb * HD + dim] = ob;
    }
}

// the segment partials' place in the work buffer: after the n·H·maxk scores,
// o [nseg][n][H][HD] (seg_nseg), then (m, l) [nseg][n][H]

template <int SD, bool CL, int FORM = 0>
__device__ __forceinline__ void attn_seg_run(const AttnArgs &a, float *work, int64_t maxk) {
    constexpr int DL = SD / 32, KV = AP_SEG * SD / 4 / SG_T; // dims a lane, float4 key loads a thread
    static_assert((DL == 4 || DL == 2 || DL == 1) && KV * SG_T * 4 == AP_SEG * SD, "a lane 1, 2 or 4 dims, whole float4 loads");
    static_assert(!CL || (SD == 64 && SG_H * SG_CL * 4 == SG_T && AP_SEG == 8 * SG_CL), "CL: a dot a 4 lanes, 8 keys a CTA");
    // CL: the scores' staged rows (SGC_ROWS: the group's 8 query rows, then
    // the CTA's 8 key rows), de-interleaved (row ρ's dim 4s + i at [ρ][i][s])
    // so that a chain reads its next 4 values with one load; the key slices
    // s_v are staged after the scores, in the same bytes
    constexpr int VROWS = CL ? (SGC_ROWS * SGC_PS + SD - 1) / SD : AP_SEG; // (CL: 132 rows, ≥ AP_SEG)
    __shared__ __align__(16) float4 s_v[VROWS][SD / 4];
    [[maybe_unused]] float *const s_buf = (float *)s_v;
    __shared__ __align__(16) float s_ex[SG_H][AP_SEG];
    [[maybe_unused]] __shared__ float s_sc[CL ? SG_H : 1][AP_SEG]; // CL: the segment's scores, from the cluster
    pdl_enter();
    const int j = blockIdx.x, t = blockIdx.y, n = gridDim.y, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int hgroups = (a.H + SG_H - 1) / SG_H;
    // the head group and dim slice (CL: the slice is the CTA's cluster rank)
    const int h = (CL ? blockIdx.z / SG_CL : blockIdx.z % hgroups) * SG_H + w;
    const int ds = CL ? blockIdx.z % SG_CL : 0, d0 = (CL ? ds : blockIdx.z / hgroups) * SD;
    const bool first = CL ? ds == 0 : blockIdx.z < hgroups; // the slice that writes the statistics
    const int64_t p = a.pos0 + t;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    const int64_t k0 = (int64_t)j * AP_SEG;
    if (k0 >= nk) return; // (this token has fewer segments; a cluster's CTAs alike)
    const int m = (int)min((int64_t)AP_SEG, nk - k0);
    // the scores first, then the segment's key slices, in flight while the
    // statistics are formed (CL: the slices first, then the scores)
    const bool hok = h < a.H;
    float s0 = -INFINITY, s1 = -INFINITY;
    if constexpr (!CL) {
        const float *sc = work + ((int64_t)t * a.H + (hok ? h : 0)) * maxk + k0;
        s0 = lane < m ? sc[lane] : -INFINITY, s1 = lane + 32 < m ? sc[lane + 32] : -INFINITY;
    }
    const int lc = tid % (SD / 4), lk = tid / (SD / 4);
    float4 kv[KV];
#pragma unroll
    for (int u = 0; u < KV; u++) {
        const int k = lk + u * (SG_T / (SD / 4));
        kv[u] = k < m ? __ldg((const float4 *)(attn_key(a, t, p, k0 + k, nwin) + d0) + lc) : make_float4(0, 0, 0, 0);
    }
    if constexpr (CL) {
        {
            float4 x[SGC_ROWS * SGC_RS / SG_T]; // the rows' float4s, coalesced
#pragma unroll
            for (int u = 0; u < SGC_ROWS * SGC_RS / SG_T; u++) {
                const int f = tid + u * SG_T, row = f / SGC_RS, c = f % SGC_RS;
                const int hq = min((h - w) + row, a.H - 1);
                const float *src = row < SG_H ? a.q + ((int64_t)t * a.H + hq) * a.HD
                                              : attn_key(a, t, p, k0 + min(ds * (AP_SEG / SG_CL) + row - SG_H, m - 1), nwin);
                x[u] = __ldg((const float4 *)src + c);
            }
#pragma unroll
            for (int u = 0; u < SGC_ROWS * SGC_RS / SG_T; u++) {
                const int f = tid + u * SG_T;
                sgc_put(s_buf, f / SGC_RS, f % SGC_RS, x[u]);
            }
        }
        __syncthreads();
        sgc_scores<FORM & 3>(s_buf, s_sc, a.scale, ds, m, tid);
        cluster_sync_all(); // every CTA's row of scores whole; no remote access after it
        s0 = lane < m ? s_sc[w][lane] : -INFINITY, s1 = lane + 32 < m ? s_sc[w][lane + 32] : -INFINITY;
    }
    const float mj = warp_max(fmaxf(s0, s1));
    if (lane < m) s_ex[w][lane] = exp_ref(fsub(s0, mj));
    if (lane + 32 < m) s_ex[w][lane + 32] = exp_ref(fsub(s1, mj));
    __syncwarp();
    const int64_t nseg = seg_nseg(maxk), row = ((int64_t)j * n + t) * a.H + h;
    if (lane == 0 && hok && first) {
        const float l = po_sum_ahead(0.f, s_ex[w], m);
        ((float2 *)(work + (int64_t)n * a.H * maxk + nseg * n * a.H * a.HD))[row] = make_float2(mj, l);
    }
#pragma unroll
    for (int u = 0; u < KV; u++) s_v[lk + u * (SG_T / (SD / 4))][lc] = kv[u];
    __syncthreads();
    if constexpr (CL) {
        const int64_t row0 = ((int64_t)j * n + t) * a.H + (h - w);
        sgc_sums<(FORM >> 2)>(s_v, s_ex, m, tid, work + (int64_t)n * a.H * maxk + row0 * a.HD + d0, a.HD, a.H - (h - w));
    } else {
        float o[DL];
        seg_lane_sums<SD>(s_v, s_ex[w], m, lane, o);
        if (hok && d0 + DL * lane < a.HD) {
            float *dst = work + (int64_t)n * a.H * maxk + row * a.HD + d0 + DL * lane;
            if constexpr (DL == 4)
                *(float4 *)dst = make_float4(o[0], o[1], o[2], o[3]);
            else if constexpr (DL == 2)
                *(float2 *)dst = make_float2(o[0], o[1]);
            else
                *dst = o[0];
        }
    }
}

template <int SD>
__global__ void __launch_bounds__(SG_T) k_attn_seg(AttnArgs a, float *work, int64_t maxk) {
    attn_seg_run<SD, false>(a, work, maxk);
}
// MINB: __launch_bounds__' CTAs an SM (DS4C_OPT_ATTN_SEG_OCC; 1: none)
// FORM: the score and sum forms (sgc_scores, sgc_sums): SF + 4 · PF
template <int MINB, int FORM>
__global__ void __cluster_dims__(1, 1, SG_CL) __launch_bounds__(SG_T, MINB) k_attn_seg_cl(AttnArgs a, float *work, int64_t maxk) {
    attn_seg_run<64, true, FORM>(a, work, maxk);
}

// k_attn_seg_walk (DS4C_OPT_ATTN_SEG_WALK): k_attn_seg_cl's segments, the
// same operations on each, walked by fewer CTAs. A cluster (the SG_CL dim
// slices of a head group of token blockIdx.y) takes segs consecutive
// segments from blockIdx.x · segs, as few as keep the CTAs within one wave
// (a single token's 10 segments at a ratio-4 layer: 640 CTAs of
// k_attn_seg_cl, 1.2 waves at 4 an SM; here 320). Each CTA finds its keys'
// rows once, a thread a key (a pick's row is a dependent load;
// k_attn_seg_cl finds 12 a thread), stages its group's query rows once (their loads in flight while
// the rows are found), and issues the next segment's key rows (after the
// current ones are staged) and value slices (after theirs) before it works
// on the current segment, so that their loads are in flight during the
// scores and the sums. The scores' rows are shared through a double buffer
// (a CTA writes a peer's buffer of segment i + 2 only after the cluster
// barrier of i + 1, which every peer reaches after reading i's). Each
// segment's scores, statistics and partial sums are k_attn_seg_cl's, in
// the same order and roundings: the same bits.
constexpr int SGW_MAX = 12; // segments a CTA at most (its rows' table: SGW_MAX · AP_SEG pointers)
template <int MINB, int FORM>
__global__ void __cluster_dims__(1, 1, SG_CL) __launch_bounds__(SG_T, MINB)
    k_attn_seg_walk(AttnArgs a, float *work, int64_t maxk, int segs) {
    constexpr int SD = SGC_RS / 2, DL = SD / 32, KV = AP_SEG * SD / 4 / SG_T, XR = SG_H * SGC_RS / SG_T;
    static_assert(SD == 64 && DL == 2 && KV == 4 && XR == 4 && AP_SEG == 8 * SG_CL, "k_attn_seg_cl's shapes");
    // rows 0 … SG_H − 1: the queries (staged once); SG_H …: the segment's
    // key rows for its scores, then (the same bytes) its value slices
    __shared__ __align__(16) float s_buf[SGC_ROWS * SGC_PS];
    __shared__ __align__(16) float s_ex[SG_H][AP_SEG];
    __shared__ float s_sc[2][SG_H][AP_SEG];
    __shared__ const float *s_row[SGW_MAX * AP_SEG];
    float4(*const s_v)[SD / 4] = (float4(*)[SD / 4])(s_buf + SG_H * SGC_PS);
    static_assert(AP_SEG * SD <= SG_H * SGC_PS, "the value slices fit the key rows' bytes");
    pdl_enter();
    const int t = blockIdx.y, n = gridDim.y, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int h = blockIdx.z / SG_CL * SG_H + w, ds = blockIdx.z % SG_CL, d0 = ds * SD;
    const bool first = ds == 0, hok = h < a.H;
    const int64_t p = a.pos0 + t;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    const int64_t kb = (int64_t)blockIdx.x * segs * AP_SEG;
    if (kb >= nk) return; // (a cluster's CTAs alike)
    const int nkr = (int)min(nk - kb, (int64_t)segs * AP_SEG), nsg = (nkr + AP_SEG - 1) / AP_SEG;
    // the queries' float4s (as k_attn_seg_cl's first SG_H rows): in flight
    // while the rows are found, staged while the first segment's rows load
    float4 x[XR];
#pragma unroll
    for (int u = 0; u < XR; u++) {
        const int f = tid + u * SG_T, row = f / SGC_RS, c = f % SGC_RS;
        x[u] = __ldg((const float4 *)(a.q + ((int64_t)t * a.H + min((h - w) + row, a.H - 1)) * a.HD) + c);
    }
    for (int i = tid; i < nkr; i += SG_T) s_row[i] = attn_key(a, t, p, kb + i, nwin);
    __syncthreads(); // s_row
    const int lc = tid % (SD / 4), lk = tid / (SD / 4);
    // segment i's (of this CTA's) key rows for the scores, and value slices
    auto load_keys = [&](int i, float4(&x)[XR]) {
        const int m = min(AP_SEG, nkr - i * AP_SEG);
#pragma unroll
        for (int u = 0; u < XR; u++) {
            const int f = tid + u * SG_T, row = f / SGC_RS, c = f % SGC_RS;
            x[u] = __ldg((const float4 *)s_row[i * AP_SEG + min(ds * (AP_SEG / SG_CL) + row, m - 1)] + c);
        }
    };
    auto load_vals = [&](int i, float4(&kv)[KV]) {
        const int m = min(AP_SEG, nkr - i * AP_SEG);
#pragma unroll
        for (int u = 0; u < KV; u++) {
            const int k = lk + u * (SG_T / (SD / 4));
            kv[u] = k < m ? __ldg((const float4 *)(s_row[i * AP_SEG + k] + d0) + lc) : make_float4(0, 0, 0, 0);
        }
    };
    float4 xk[XR], kv[KV];
    load_keys(0, xk);
    load_vals(0, kv);
#pragma unroll
    for (int u = 0; u < XR; u++) {
        const int f = tid + u * SG_T;
        sgc_put(s_buf, f / SGC_RS, f % SGC_RS, x[u]);
    }
    const int64_t nseg = seg_nseg(maxk);
    const int j0 = blockIdx.x * segs;
    for (int i = 0; i < nsg; i++) {
        const int j = j0 + i, m = min(AP_SEG, nkr - i * AP_SEG), par = i & 1;
        if (i > 0) __syncthreads(); // the previous segment's sums have read s_v
#pragma unroll
        for (int u = 0; u < XR; u++) {
            const int f = tid + u * SG_T;
            sgc_put(s_buf, SG_H + f / SGC_RS, f % SGC_RS, xk[u]);
        }
        if (i + 1 < nsg) load_keys(i + 1, xk);
        __syncthreads();
        sgc_scores<FORM & 3>(s_buf, s_sc[par], a.scale, ds, m, tid);
        cluster_sync_all(); // every CTA's row of segment i's scores whole
        const float s0 = lane < m ? s_sc[par][w][lane] : -INFINITY, s1 = lane + 32 < m ? s_sc[par][w][lane + 32] : -INFINITY;
        const float mj = warp_max(fmaxf(s0, s1));
        if (lane < m) s_ex[w][lane] = exp_ref(fsub(s0, mj));
        if (lane + 32 < m) s_ex[w][lane + 32] = exp_ref(fsub(s1, mj));
        __syncwarp();
        const int64_t row = ((int64_t)j * n + t) * a.H + h;
        if (lane == 0 && hok && first) {
            const float l = po_sum_ahead(0.f, s_ex[w], m);
            ((float2 *)(work + (int64_t)n * a.H * maxk + nseg * n * a.H * a.HD))[row] = make_float2(mj, l);
        }
#pragma unroll
        for (int u = 0; u < KV; u++) s_v[lk + u * (SG_T / (SD / 4))][lc] = kv[u];
        if (i + 1 < nsg) load_vals(i + 1, kv);
        __syncthreads();
        sgc_sums<(FORM >> 2)>(s_v, s_ex, m, tid, work + (int64_t)n * a.H * maxk + (row - w) * a.HD + d0, a.HD, a.H - (h - w));
    }
}

// the CL kernels by CTAs an SM (DS4C_OPT_ATTN_SEG_OCC) and form
// (DS4C_OPT_ATTN_SEG_FORM: SF + 4 · PF, SF above 2 taken as 2); the forms
// other than 0 at 3 and 4 CTAs an SM only (1, 2 and 5 CTAs an SM: form 0)
struct SegClK {
    template <int MINB, int F>
    static auto fn() { return k_attn_seg_cl<MINB, F>; }
};
struct SegWalkK {
    template <int MINB, int F>
    static auto fn() { return k_attn_seg_walk<MINB, F>; }
};
template <class K, int MINB>
static auto seg_form(int form) {
    switch ((form & 4) | min(form & 3, 2)) {
    case 1: return K::template fn<MINB, 1>();
    case 2: return K::template fn<MINB, 2>();
    case 4: return K::template fn<MINB, 4>();
    case 5: return K::template fn<MINB, 5>();
    case 6: return K::template fn<MINB, 6>();
    default: return K::template fn<MINB, 0>();
    }
}
static auto seg_cl_kernel(int occ, int form) {
    return occ == 5   ? SegClK::fn<5, 0>()
           : occ == 4 ? seg_form<SegClK, 4>(form)
           : occ == 3 ? seg_form<SegClK, 3>(form)
           : occ == 2 ? SegClK::fn<2, 0>()
                      : SegClK::fn<1, 0>();
}
static auto seg_walk_kernel(int wocc, int form) {
    return wocc == 3 ? seg_form<SegWalkK, 3>(form) : seg_form<SegWalkK, 4>(form);
}

// BATCH (DS4C_OPT_SEG_COMB 1, the default): the same operations in the same
// order with the lane's partials o_j requested before the statistics, up
// to SCB segments a pass, and each lane's first (m_j, l_j) kept from the
// maximum's loads. The v66 form (BATCH false) waited for the (m, l) pairs
// twice and then for the partials four segments at a time, the last ns % 4
// one after another: 3–5 L2 round trips after the kernel before ends.
constexpr int SCB = 16;
template <bool BATCH>
__global__ void __launch_bounds__(AP_T) k_attn_seg_combine(AttnArgs a, const float *work, int64_t maxk) {
    extern __shared__ float s_c[]; // [AP_H][2·nseg]: c_j, then l_j·c_j
    pdl_enter();
    const int t = blockIdx.y, n = gridDim.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.z * AP_H + w, d0 = blockIdx.x * AP_D;
    const bool hok = h < a.H;
    const int hc = hok ? h : 0;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin), nseg = seg_nseg(maxk), ns = seg_nseg(nk);
    const float *o = work + (int64_t)n * a.H * maxk;
    const float2 *ml = (const float2 *)(o + nseg * n * a.H * a.HD);
    const float *oj = o + ((int64_t)t * a.H + hc) * a.HD + d0 + lane;
    const int64_t jstride = (int64_t)n * a.H * a.HD;
    [[maybe_unused]] float x[SCB];
    [[maybe_unused]] float2 v0;
    if constexpr (BATCH) {
#pragma unroll
        for (int u = 0; u < SCB; u++) x[u] = u < ns ? __ldcg(oj + u * jstride) : 0.f;
        v0 = lane < ns ? ml[((int64_t)lane * n + t) * a.H + hc] : make_float2(-INFINITY, 0.f);
    }
    const float sink = a.sinks[hc];
    float M = sink;
    if constexpr (BATCH) {
        if (lane < ns) M = fmaxf(M, v0.x);
        for (int64_t j = lane + 32; j < ns; j += 32) M = fmaxf(M, ml[(j * n + t) * a.H + hc].x);
    } else {
        for (int64_t j = lane; j < ns; j += 32) M = fmaxf(M, ml[(j * n + t) * a.H + hc].x);
    }
    M = warp_max(M);
    float *cw = s_c + (size_t)w * 2 * nseg;
    for (int64_t j = lane; j < ns; j += 32) {
        const float2 v = BATCH && j == lane ? v0 : ml[(j * n + t) * a.H + hc];
        const float c = exp_ref(fsub(v.x, M));
        cw[j] = c;
        cw[nseg + j] = fmul(v.y, c);
    }
    __syncwarp();
    float L = exp_ref(fsub(sink, M)), acc = 0.f;
    for (int64_t j = 0; j < ns; j++) L = fadd(L, cw[nseg + j]);
    int64_t j = 0;
    if constexpr (BATCH) {
        for (;;) {
#pragma unroll
            for (int u = 0; u < SCB; u++)
                if (j + u < ns) acc = fadd(acc, fmul(cw[j + u], x[u]));
            j += SCB;
            if (j >= ns) break;
#pragma unroll
            for (int u = 0; u < SCB; u++) x[u] = j + u < ns ? __ldcg(oj + (j + u) * jstride) : 0.f;
        }
    } else {
        for (; j + 4 <= ns; j += 4) {
            float x4[4];
#pragma unroll
            for (int u = 0; u < 4; u++) x4[u] = __ldcg(oj + (j + u) * jstride);
#pragma unroll
            for (int u = 0; u < 4; u++) acc = fadd(acc, fmul(cw[j + u], x4[u]));
        }
        for (; j < ns; j++) acc = fadd(acc, fmul(cw[j], __ldcg(oj + j * jstride)));
    }
    attn_out_store(a, t, h, hok, d0, lane, __fdiv_rn(acc, L));
}

// ------------------------------------------------------------ fast attention of single tokens
// Fast mode's attention for fewer than 8 tokens (decode), split over the
// keys (flash decoding) instead of k_attn_scores<1> + k_attn_po's one pass
// over every key per (token, head): k_attn_split gives each CTA DEC_H heads
// of one token and ks of its keys (blockIdx.x: the split), walked in chunks
// of DEC_KC: the chunk's key rows and the heads' queries staged in shared
// memory, a score per thread (warp w: head h0 + w, lane: key), the chunk's
// softmax terms against a running maximum (the earlier terms rescaled when
// it rises), and their weighted sum of the keys into each thread's 4 heads ×
// 4 dims. The scores keep exact mode's order and roundings (the same bits
// as k_attn_scores'); the rest uses float exponentials and fused
// multiply-adds (fast mode's contract). It writes the split's unnormalised
// sums o and its (maximum, sum of exponentials) to the work buffer: o at
// [split][token][head][HD], then the pairs at [split][token][head][2].
// k_attn_combine adds the splits with the sink's term in the denominator,
// then rotates, stores and quantizes as k_attn_po does. TestAttentionFast
// holds it to the exact kernels. For HD == DEC_HD (Flash's 512); at most
// DEC_SPLITS splits, so the work buffer needs DEC_SPLITS · n · H · (HD + 2)
// floats (backend/cuda's AttentionWork).
constexpr int DEC_HD = 512, DEC_H = 8, DEC_KC = 32, DEC_T = DEC_H * 32, DEC_SPLITS = 64;
constexpr int DEC_LD = DEC_HD + 4;                                 // staged rows: 2064 bytes, conflict-free float4 lanes
constexpr int DEC_HPT = DEC_H * DEC_HD / 4 / DEC_T;               // heads per thread in the weighted sum (4)
constexpr int DEC_KV = DEC_KC * DEC_HD / 4 / DEC_T;               // float4 key loads per thread per chunk (16)
constexpr size_t DEC_SMEM = ((size_t)(DEC_H + DEC_KC) * DEC_LD + DEC_KC * DEC_H + DEC_H) * sizeof(float);
static_assert(DEC_HPT == 4 && DEC_KC == 32 && DEC_KV * DEC_T * 4 == DEC_KC * DEC_HD, "the thread layout");

// attn_split_run is k_attn_split's work after the wait: the split of
// blockIdx.x over keys [blockIdx.x·ks, +ks) of token blockIdx.y (of
// gridDim.y) for heads blockIdx.z·DEC_H … +DEC_H, into work (nsplit splits).
// An empty split (past the token's keys) loads nothing and writes zero sums
// with the maximum −∞.
__device__ __forceinline__ void attn_split_run(const AttnArgs &a, float *work, int ks, int nsplit) {
    extern __shared__ __align__(16) float s_dec[];
    float *sq = s_dec, *sk = sq + DEC_H * DEC_LD, *sp = sk + DEC_KC * DEC_LD, *salpha = sp + DEC_KC * DEC_H;
    __shared__ const float *s_krow[DEC_KC];
    const int split = blockIdx.x, t = blockIdx.y, n = gridDim.y, h0 = blockIdx.z * DEC_H;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int64_t p = a.pos0 + t;
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    const int64_t kb = (int64_t)split * ks, ke = min(nk, kb + ks);
    // a chunk's key rows (the first chunk's found while the queries load)
    auto rows = [&](int64_t kc) {
        if (tid < DEC_KC) s_krow[tid] = attn_key(a, t, p, min(kc + tid, ke - 1), nwin);
    };
    if (kb < ke) {
        rows(kb);
        for (int i = tid; i < DEC_H * DEC_HD / 4; i += DEC_T) {
            const int hh = i / (DEC_HD / 4), c = i % (DEC_HD / 4), h = min(h0 + hh, a.H - 1);
            *(float4 *)&sq[hh * DEC_LD + 4 * c] = __ldg((const float4 *)(a.q + ((int64_t)t * a.H + h) * DEC_HD) + c);
        }
    }
    // weighted sum: dims 4·dg … +3 of heads DEC_HPT·hg … +DEC_HPT
    const int dg = tid % (DEC_HD / 4), hg = tid / (DEC_HD / 4);
    float acc[DEC_HPT][4];
#pragma unroll
    for (int i = 0; i < DEC_HPT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float mrun = -INFINITY, lrun = 0.f; // warp w's head: running maximum and sum (the lanes agree)
    for (int64_t kc = kb; kc < ke; kc += DEC_KC) {
        const int m = (int)min((int64_t)DEC_KC, ke - kc);
        if (kc != kb) {
            __syncthreads(); // the previous chunk is consumed
            rows(kc);
        }
        __syncthreads();
        float4 kv[DEC_KV];
#pragma unroll
        for (int u = 0; u < DEC_KV; u++) {
            const int i = tid + DEC_T * u;
            kv[u] = __ldg((const float4 *)s_krow[i / (DEC_HD / 4)] + i % (DEC_HD / 4));
        }
#pragma unroll
        for (int u = 0; u < DEC_KV; u++) {
            const int i = tid + DEC_T * u;
            *(float4 *)&sk[(i / (DEC_HD / 4)) * DEC_LD + 4 * (i % (DEC_HD / 4))] = kv[u];
        }
        __syncthreads();
        if (kc == kb) PHASE_MARK(2);
        // the score as exact mode's (k_attn_scores: dot_ref's four running
        // sums, each product rounded), so that both fast single-token forms
        // start from exact mode's scores (with fused multiply-adds here the
        // model-level distance from exact mode was about the same:
        // cuda/NOTES.md v14)
        const float sc = lane < m ? fmul(dot4_ref(sq + w * DEC_LD, sk + lane * DEC_LD, DEC_HD), a.scale) : -INFINITY;
        const float mnew = fmaxf(mrun, warp_max(sc));
        const float e = lane < m ? expf(sc - mnew) : 0.f, alpha = expf(mrun - mnew); // alpha 0 on the first chunk
        lrun = lrun * alpha + warp_sum(e);
        mrun = mnew;
        sp[lane * DEC_H + w] = e;
        if (lane == 0) salpha[w] = alpha;
        __syncthreads();
        if (kc == kb) PHASE_MARK(3);
        const float4 al = *(const float4 *)&salpha[DEC_HPT * hg];
        const float als[DEC_HPT] = {al.x, al.y, al.z, al.w};
#pragma unroll
        for (int i = 0; i < DEC_HPT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] *= als[i];
        for (int k = 0; k < m; k++) {
            const float4 v = *(const float4 *)&sk[k * DEC_LD + 4 * dg];
            const float4 pe = *(const float4 *)&sp[k * DEC_H + DEC_HPT * hg];
            const float pes[DEC_HPT] = {pe.x, pe.y, pe.z, pe.w};
#pragma unroll
            for (int i = 0; i < DEC_HPT; i++) {
                acc[i][0] = fmaf(pes[i], v.x, acc[i][0]);
                acc[i][1] = fmaf(pes[i], v.y, acc[i][1]);
                acc[i][2] = fmaf(pes[i], v.z, acc[i][2]);
                acc[i][3] = fmaf(pes[i], v.w, acc[i][3]);
            }
        }
    }
    PHASE_MARK(4);
    float *po = work + ((int64_t)split * n + t) * a.H * DEC_HD;
#pragma unroll
    for (int i = 0; i < DEC_HPT; i++) {
        const int h = h0 + DEC_HPT * hg + i;
        if (h < a.H) *(float4 *)&po[(int64_t)h * DEC_HD + 4 * dg] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
    float *ml = work + (int64_t)nsplit * n * a.H * DEC_HD + (((int64_t)split * n + t) * a.H + h0 + w) * 2;
    if (lane == 0 && h0 + w < a.H) ml[0] = mrun, ml[1] = lrun;
}

__global__ void __launch_bounds__(DEC_T) k_attn_split(AttnArgs a, float *work, int ks, int nsplit) {
    pdl_enter();
    attn_split_run(a, work, ks, nsplit);
}

// k_attn_combine: k_attn_po's CTA (AP_D dims × AP_H heads of one token,
// warp w: head, lane: dim) adds k_attn_split's nsplit partial sums, each
// scaled by exp(its maximum − the overall one), and divides by the sink's
// exp(sink − maximum) plus the splits' scaled sums; then attn_out_store.
// Lane s holds split s's and s + 32's (maximum, sum) pairs and factors, so
// the sums' loads wait on one round trip and the factors go by shuffles.
// attn_combine_at is that for one warp: head h (of a.H: past them the warp
// only joins the shuffles), dims d0 … d0 + 31 (lane: d0 + lane < a.HD) of
// token t of n. It reads the partial sums at L2 (ld.global.cg), so that
// k_attn_split_cl's clusters may call it on their other CTAs' sums after a
// cluster barrier.
static_assert(DEC_SPLITS <= 64, "two splits a lane");
__device__ __forceinline__ void attn_combine_at(const AttnArgs &a, const float *work, int nsplit, int t, int n, int h,
                                                int d0, int lane) {
    const bool hok = h < a.H;
    const int hc = hok ? h : 0;
    // the inverse rotation's table entry, loaded with the first round trip
    const int dr = d0 + lane - a.roff;
    const bool rot = a.rcs && a.rfreqs && dr >= 0 && dr < a.rd;
    const float2 cs = rot ? __ldg(a.rcs + (int64_t)t * (a.rd / 2) + dr / 2) : make_float2(0.f, 0.f);
    const float2 *ml = (const float2 *)(work + (int64_t)nsplit * n * a.H * a.HD);
    auto mls = [&](int s) { return __ldcg(ml + ((int64_t)s * n + t) * a.H + hc); };
    const float2 z = make_float2(-INFINITY, 0.f);
    const float2 p0 = lane < nsplit ? mls(lane) : z, p1 = lane + 32 < nsplit ? mls(lane + 32) : z;
    const float sink = a.sinks[hc];
    const float mx = warp_max(fmaxf(sink, fmaxf(p0.x, p1.x)));
    const float e0 = expf(p0.x - mx), e1 = expf(p1.x - mx); // 0 for empty splits
    const float den = warp_sum(p0.y * e0 + p1.y * e1) + expf(sink - mx);
    float acc = 0.f;
    const float *po = work + ((int64_t)t * a.H + hc) * a.HD + d0 + lane;
    const int64_t sstride = (int64_t)n * a.H * a.HD;
#pragma unroll 8
    for (int s = 0; s < nsplit; s++)
        acc = fmaf(__ldcg(po + s * sstride), __shfl_sync(FULL_MASK, s < 32 ? e0 : e1, s & 31), acc);
    attn_out_store(a, t, h, hok, d0, lane, acc / den, rot ? &cs : nullptr);
}

__global__ void __launch_bounds__(AP_T) k_attn_combine(AttnArgs a, const float *work, int nsplit) {
    pdl_enter();
    const int w = threadIdx.x >> 5;
    attn_combine_at(a, work, nsplit, blockIdx.y, gridDim.y, blockIdx.z * AP_H + w, blockIdx.x * AP_D,
                    threadIdx.x & 31);
}

// k_attn_split_cl is k_attn_split with its combine in the same launch
// (DS4C_OPT_ATTN_CLUSTER): the DEC_CL splits of a (token, head group)
// form one thread-block cluster; after their partial sums are stored and a
// cluster barrier, the cluster's 8·DEC_CL warps take the group's (head,
// 32-dim block) units in turn and do k_attn_combine's operations on them
// (attn_combine_at, then attn_out_store: the rotation and the Q8_0
// activation where ds4c_attention fuses them). Runs of keys shorter than
// DEC_CL splits leave the last splits empty (maximum −∞, zero sums: their
// factor is 0 and adds nothing), so with the same ks the output has the
// same bits as the two launches.
constexpr int DEC_CL = 8, DEC_CL_CHUNKS = 2;
__global__ void __cluster_dims__(DEC_CL, 1, 1) __launch_bounds__(DEC_T) k_attn_split_cl(AttnArgs a, float *work, int ks) {
    phase_begin();
    pdl_enter();
    PHASE_MARK(1);
    attn_split_run(a, work, ks, DEC_CL);
    PHASE_MARK(5);
    cluster_sync_all();
    PHASE_MARK(6);
    constexpr int NW = DEC_T / 32, UH = DEC_HD / 32; // warps a CTA, units a head
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int u = blockIdx.x * NW + w; u < DEC_H * UH; u += DEC_CL * NW)
        attn_combine_at(a, work, DEC_CL, blockIdx.y, gridDim.y, blockIdx.z * DEC_H + u / UH, (u % UH) * 32, lane);
    phase_end(2);
}

// ------------------------------------------------------------ fast chunk attention, flash form
// Fast mode's attention of a chunk (8 or more tokens) in one kernel, the
// scores and the weighted sum on the f16 tensor cores (mma m16n8k16, float
// sums), instead of k_attn_scores_tile<true> + k_attn_softmax<true> +
// k_attn_out_tc (two-term TF32 products through a [token][head][key] score
// buffer in global memory). A CTA takes one token and FL_H heads: their
// queries rounded to f16 once into shared memory; the token's keys go by in
// tiles of FL_KT, each copied as floats by cp.async (the next tile's copy
// overlaps this tile's products) and rounded to f16 in shared memory; per
// tile: the scores (warp w: heads 16·(w%4) … +16 against the tile's keys
// over dims 128·(w/4) … +128, the four partial dots added in the softmax
// step), the softmax terms against a running maximum that starts at the
// sink's logit (the sink is a key of value zero: its term, 1 at the start,
// is rescaled with the others), the probabilities rounded to f16, and their
// weighted sum of the keys (warp w: the same 16 heads × output dims
// 128·(w/4) … +128, held in registers and rescaled when the maximum rises).
// The output is divided by the final sum of terms (the f16-rounded ones the
// products used). Same semantics as the exact kernels; the operands keep f16's
// 11 significant bits (KV values that went through the FP8 simulation are
// exact in f16 within its range; queries, rotated dims and probabilities
// round): TestAttentionFast and TestKernelVariants' flash4/fast/attn_flash
// hold it. For HD == FL_HD (Flash's 512) and H a multiple of FL_H, 16-byte
// aligned rows.
constexpr int FL_HD = 512, FL_H = 64, FL_KT = 32, FL_T = 512;
constexpr int FL_QLD = FL_HD + 8; // halves per staged query or key row (1040 bytes: ldmatrix rows conflict-free)
constexpr int FL_SLD = FL_KT + 4; // floats per partial-score row
constexpr int FL_PLD = FL_KT + 8; // halves per probability row (80 bytes)
constexpr int FL_ROWS = 1024;     // key rows found once per CTA (attn_key past them)
constexpr int FL_RP = 64;         // rotated pairs the f16 output's inverse rotation takes (rd ≤ 2·FL_RP)
constexpr int FL_SPLIT_MIN = 512; // keys from which fast single tokens take it split over the keys (OptAttnSplit 2)
// Shared memory, in order: f16 queries [FL_H][FL_QLD]; f16 keys
// [FL_KT][FL_QLD] (H16: two tiles, double-buffered); the float keys as
// copied [FL_KT][FL_HD] (not H16); partial scores [4][FL_H][FL_SLD]; f16
// probabilities [FL_H][FL_PLD]; per head the tile's rescale, then 1/sum;
// the output rotation's (cos, sin) per pair [FL_RP]; the key rows'
// addresses.
template <bool H16> struct FlSmem {
    static constexpr size_t KH = (size_t)FL_H * FL_QLD * 2;
    static constexpr size_t KH_BYTES = (size_t)FL_KT * FL_QLD * 2;
    static constexpr size_t KF = KH + (H16 ? 2 : 1) * KH_BYTES;
    static constexpr size_t S = KF + (H16 ? 0 : (size_t)FL_KT * FL_HD * 4);
    static constexpr size_t P = S + (size_t)4 * FL_H * FL_SLD * 4;
    static constexpr size_t A = P + (size_t)FL_H * FL_PLD * 2;
    static constexpr size_t C = A + (size_t)FL_H * 4;
    static constexpr size_t R = C + (size_t)FL_RP * 8;
    static constexpr size_t BYTES = R + (size_t)FL_ROWS * sizeof(void *);
    static_assert(KF % 16 == 0 && S % 16 == 0 && P % 16 == 0 && R % 8 == 0, "aligned regions");
    static_assert(BYTES <= 227 * 1024, "one CTA's shared memory");
};
static_assert(FL_T == 512 && FL_H == 64 && FL_KT == 32 && FL_HD == 512, "the warp layout: 16 warps, 4 head tiles × 4 dim quarters");

// H16 (option attn_flash 2): the key rows come from f16 copies (a.kvh,
// a.winh, a.comph, made by ds4c_attention before the launch) that cp.async
// stages straight into the key tiles, double-buffered: no float copy and
// no rounding pass (one barrier a tile fewer, a third less shared-memory
// traffic). The same f16 values as the rounding pass's, so the same bits.
//
// Split over the keys (work not null; fast single tokens, OptAttnSplit 2):
// CTA (t, head group, blockIdx.z = split) walks keys [split·ks, +ks) only,
// starts without the sink's term, and writes its unnormalised sums and its
// (maximum, sum of terms) to work in k_attn_split's layout, for
// k_attn_combine.
template <bool H16>
__global__ void __launch_bounds__(FL_T, 1) k_attn_flash(AttnArgs a, float *work, int ks, int nsplit) {
    using L = FlSmem<H16>;
    pdl_enter();
    extern __shared__ __align__(16) uint8_t s_fl[];
    __half *sq = (__half *)s_fl, *sp = (__half *)(s_fl + L::P);
    float *skf = (float *)(s_fl + L::KF), *ss = (float *)(s_fl + L::S), *sa = (float *)(s_fl + L::A);
    float2 *scs = (float2 *)(s_fl + L::C);
    const void **rows = (const void **)(s_fl + L::R);
    const int t = blockIdx.x, h0 = blockIdx.y * FL_H, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int64_t p = a.pos0 + t;
    // the rotation's cosine and sine per pair at the token's position, as
    // k_rope computes them: for the f16 output's inverse rotation and the
    // queries' (read after the barriers below)
    const bool orot = a.outh && a.rfreqs;
    if ((orot || a.qnorm) && tid < a.rd / 2) scs[tid] = rope_cs((float)p, a.rfreqs[tid]);
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    // this CTA's keys [kb, ke)
    const int64_t kb = work ? (int64_t)blockIdx.z * ks : 0, ke = work ? min(nk, kb + ks) : nk;
    auto key_row = [&](int64_t key) -> const void * {
        if constexpr (H16)
            return attn_key_in(a, a.kvh, a.winh, a.comph, t, p, key, nwin);
        else
            return attn_key(a, t, p, key, nwin);
    };
    for (int64_t k = kb + tid; k < min(ke, (int64_t)FL_ROWS); k += FL_T) rows[k] = key_row(k);
    __syncthreads();
    // the copy of the key tile from kc (keys past the count: the last key's
    // row again, its score masked): H16 the f16 rows into key tile buf, else
    // the float rows into skf
    auto issue = [&](int64_t kc, int buf) {
        constexpr int CH = H16 ? FL_HD / 8 : FL_HD / 4; // 16-byte chunks a row
#pragma unroll
        for (int u = 0; u < FL_KT * CH / FL_T; u++) {
            const int f = tid + FL_T * u, k = f / CH, c = f % CH;
            const int64_t key = min(kc + k, ke - 1);
            const uint8_t *row = (const uint8_t *)(key < FL_ROWS ? rows[key] : key_row(key));
            if constexpr (H16)
                cp_async16(s_fl + L::KH + buf * L::KH_BYTES + (size_t)k * FL_QLD * 2 + 16 * c, row + 16 * c);
            else
                cp_async16(skf + k * FL_HD + 4 * c, row + 16 * c);
        }
        cp_async_commit();
    };
    if (kb < ke) issue(kb, 0);
    attn_stage_queries<FL_T, FL_H, FL_HD, 1, 8>(a, t, h0, scs, [&](int hh, int d, uint2 v) { *(uint2 *)(sq + hh * FL_QLD + d) = v; });
    // softmax step: head sh, keys 4·sj … +3 of the tile (8 threads a head,
    // which keep the head's running maximum and sum alike)
    const int sh = tid >> 3, sj = tid & 7;
    float mrun = work ? -INFINITY : a.sinks[h0 + sh], lrun = work ? 0.f : 1.f;
    // mma steps: head tile mt (heads 16mt … +16), quarter wq (dims 128wq … +128)
    const int mt = w & 3, wq = w >> 2, g = lane >> 2, q4 = lane & 3;
    const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4); // ldmatrix: A rows, V's keys
    const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1); // ldmatrix: K's keys (scores' B)
    float o[16][4];
#pragma unroll
    for (int j = 0; j < 16; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    for (int64_t kc = kb, ti = 0; kc < ke; kc += FL_KT, ti++) {
        const int m = (int)min((int64_t)FL_KT, ke - kc);
        const __half *skh = (const __half *)(s_fl + L::KH + (H16 ? (ti & 1) * L::KH_BYTES : 0));
        cp_async_wait<0>();
        __syncthreads(); // the tile is in; the previous tile's products are done with its key tile
        if constexpr (!H16) {
#pragma unroll
            for (int u = 0; u < FL_KT * FL_HD / 4 / FL_T; u++) {
                const int f = tid + FL_T * u, k = f / (FL_HD / 4), c = f % (FL_HD / 4);
                *(uint2 *)(s_fl + L::KH + ((size_t)k * FL_QLD + 4 * c) * 2) =
                    half4_bits(*(const float4 *)(skf + k * FL_HD + 4 * c));
            }
            __syncthreads(); // the f16 tile is ready, skf free
        }
        if (kc + FL_KT < ke) issue(kc + FL_KT, (int)((ti + 1) & 1));
        {
            float c[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < 8; ks++) {
                const int d = 128 * wq + 16 * ks;
                uint32_t A[4];
                ldsm_x4<false>(A, sq + (16 * mt + lrow) * FL_QLD + d + lcol);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    uint32_t B[4];
                    ldsm_x4<false>(B, skh + (16 * np + brow) * FL_QLD + d + bcol);
                    mma_f16(c[2 * np], A, B[0], B[1]);
                    mma_f16(c[2 * np + 1], A, B[2], B[3]);
                }
            }
            float *sw = ss + wq * FL_H * FL_SLD + (16 * mt + g) * FL_SLD + 2 * q4;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                *(float2 *)(sw + 8 * j) = make_float2(c[j][0], c[j][1]);
                *(float2 *)(sw + 8 * FL_SLD + 8 * j) = make_float2(c[j][2], c[j][3]);
            }
        }
        __syncthreads(); // the partial scores are in
        {
            float s[4];
            const float *sr = ss + sh * FL_SLD + 4 * sj;
            const float4 p0 = *(const float4 *)sr, p1 = *(const float4 *)(sr + FL_H * FL_SLD),
                         p2 = *(const float4 *)(sr + 2 * FL_H * FL_SLD), p3 = *(const float4 *)(sr + 3 * FL_H * FL_SLD);
            s[0] = ((p0.x + p1.x) + p2.x) + p3.x;
            s[1] = ((p0.y + p1.y) + p2.y) + p3.y;
            s[2] = ((p0.z + p1.z) + p2.z) + p3.z;
            s[3] = ((p0.w + p1.w) + p2.w) + p3.w;
            float tm = -INFINITY;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                s[i] = 4 * sj + i < m ? s[i] * a.scale : -INFINITY;
                tm = fmaxf(tm, s[i]);
            }
#pragma unroll
            for (int off = 1; off < 8; off <<= 1) tm = fmaxf(tm, __shfl_xor_sync(FULL_MASK, tm, off));
            const float mnew = fmaxf(mrun, tm), alpha = expf(mrun - mnew);
            // (masked keys: 0)
            const __half2 e01 = __floats2half2_rn(expf(s[0] - mnew), expf(s[1] - mnew));
            const __half2 e23 = __floats2half2_rn(expf(s[2] - mnew), expf(s[3] - mnew));
            const float2 f01 = __half22float2(e01), f23 = __half22float2(e23);
            float ls = (f01.x + f01.y) + (f23.x + f23.y);
#pragma unroll
            for (int off = 1; off < 8; off <<= 1) ls += __shfl_xor_sync(FULL_MASK, ls, off);
            lrun = lrun * alpha + ls;
            mrun = mnew;
            *(uint2 *)(sp + sh * FL_PLD + 4 * sj) = make_uint2(*(const uint32_t *)&e01, *(const uint32_t *)&e23);
            if (sj == 0) sa[sh] = alpha;
        }
        __syncthreads(); // the probabilities and rescales are in
        const float alo = sa[16 * mt + g], ahi = sa[16 * mt + g + 8];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            o[j][0] *= alo;
            o[j][1] *= alo;
            o[j][2] *= ahi;
            o[j][3] *= ahi;
        }
#pragma unroll
        for (int ks = 0; ks < FL_KT / 16; ks++) {
            uint32_t A[4];
            ldsm_x4<false>(A, sp + (16 * mt + lrow) * FL_PLD + 16 * ks + lcol);
#pragma unroll
            for (int jp = 0; jp < 8; jp++) {
                uint32_t B[4];
                ldsm_x4<true>(B, skh + (16 * ks + lrow) * FL_QLD + 128 * wq + 16 * jp + lcol);
                mma_f16(o[2 * jp], A, B[0], B[1]);
                mma_f16(o[2 * jp + 1], A, B[2], B[3]);
            }
        }
    }
    if (work) { // the split's partial sums (k_attn_split's layout)
        const int n = gridDim.x;
        float *po = work + (((int64_t)blockIdx.z * n + t) * a.H + h0 + 16 * mt + g) * FL_HD + 128 * wq + 2 * q4;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            *(float2 *)(po + 8 * j) = make_float2(o[j][0], o[j][1]);
            *(float2 *)(po + 8 * FL_HD + 8 * j) = make_float2(o[j][2], o[j][3]);
        }
        float *ml = work + (int64_t)nsplit * n * a.H * FL_HD + (((int64_t)blockIdx.z * n + t) * a.H + h0 + sh) * 2;
        if (sj == 0) ml[0] = mrun, ml[1] = lrun;
        return;
    }
    __syncthreads(); // every rescale read
    if (sj == 0) sa[sh] = 1.f / lrun;
    __syncthreads();
    const float ilo = sa[16 * mt + g], ihi = sa[16 * mt + g + 8];
    // rows (token, head) of the thread's two heads; dims 128·wq + 8j + 2·q4, +1
    const int64_t rlo = (int64_t)t * a.H + h0 + 16 * mt + g, rhi = rlo + 8;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int d = 128 * wq + 8 * j + 2 * q4;
        attn_put_pair(a, orot, scs, rlo, d, o[j][0] * ilo, o[j][1] * ilo);
        attn_put_pair(a, orot, scs, rhi, d, o[j][2] * ihi, o[j][3] * ihi);
    }
}

// ------------------------------------------------------------ router
// One CTA per token: s = sqrt(softplus(logit)); experts from tid2eid (hash
// layers) or the top-K of s + bias; weights s[e], normalised, scaled.
// x not null: warps 1 … of the CTA also quantize the token's input row
// (cols values at x + t·cols) to Q8_K blocks at act + t·act_stride
// (k_quant_q8_k_w's operations, q8_k_warp), the first RQ_PRE blocks of each
// loaded before the scores and quantized while warp 0 picks the experts.
constexpr int RQ_PRE = 3;
// router_pick_regs is warp 0's pick where E = 32·U: the lane's experts
// lane + 32u as 64-bit ranks in registers (key << (UB + 1) | 1 << UB |
// U − 1 − u, UB the bits of U − 1: the greater, the better, ties to the
// lower u, so the lower id; 0 once taken), the lane's best by a max tree,
// and each round two warp reductions (redux.sync) instead of five 64-bit
// shuffle steps: the greatest key, then the lowest id among the lanes
// whose best it is. The same experts in the same order as the ranking.
template <int U>
__device__ __forceinline__ void router_pick_regs(const float *biased, int K, int32_t *s_ids) {
    constexpr int UB = U <= 2 ? 1 : (U <= 4 ? 2 : (U <= 8 ? 3 : (U <= 16 ? 4 : 5)));
    constexpr int P2 = 1 << UB; // U rounded up to a power of two (the tree's width)
    const int lane = threadIdx.x & 31;
    unsigned long long rk[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        rk[u] = (unsigned long long)topk_key(biased[lane + 32 * u]) << (UB + 1) | (1u << UB) | (unsigned)(U - 1 - u);
    for (int r = 0; r < K; r++) {
        unsigned long long tree[P2]; // the lane's max tree over its ranks (0 past U)
#pragma unroll
        for (int u = 0; u < P2; u++) tree[u] = u < U ? rk[u] : 0ull;
#pragma unroll
        for (int h = P2 / 2; h > 0; h >>= 1)
#pragma unroll
            for (int u = 0; u < h; u++) tree[u] = tree[u] > tree[u + h] ? tree[u] : tree[u + h];
        const uint32_t bk = (uint32_t)(tree[0] >> (UB + 1));
        const uint32_t mk = __reduce_max_sync(FULL_MASK, bk);
        const uint32_t bid = (uint32_t)lane + 32u * (uint32_t)(U - 1 - (int)(tree[0] & (P2 - 1)));
        const uint32_t w = __reduce_min_sync(FULL_MASK, tree[0] != 0 && bk == mk ? bid : 0xffffffffu);
#pragma unroll
        for (int u = 0; u < U; u++) // (the winner's rank taken: a select per u, no local memory)
            if (w == (uint32_t)lane + 32u * (uint32_t)u) rk[u] = 0;
        if (lane == 0) s_ids[r] = (int)w;
    }
}

__global__ void k_router(const float *logits, int E, const float *bias, const int32_t *tid2eid, const int32_t *tokens,
                         int K, int norm, float wscale, int32_t *sel, float *wts, int warp_pick, const float *x,
                         int64_t cols, uint8_t *act, int64_t act_stride) {
    phase_begin();
    pdl_enter();
    PHASE_MARK(1);
    extern __shared__ float s_r[]; // s[E], biased[E], ids[K]
    float *s = s_r, *biased = s_r + E;
    int32_t *s_ids = (int32_t *)(s_r + 2 * E);
    const int t = blockIdx.x;
    // the activation's blocks: warp w ≥ 1 takes blocks w − 1, w − 1 + qw, …
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, qw = (int)(blockDim.x >> 5) - 1;
    const int nb = x ? (int)(cols / 256) : 0;
    const float *xt = x ? x + (int64_t)t * cols : nullptr;
    float qv[RQ_PRE][8];
    auto qload = [&](int b, float(&v)[8]) { load8(xt + b * 256 + lane * 8, v); };
    if (warp >= 1) {
#pragma unroll
        for (int j = 0; j < RQ_PRE; j++) {
            const int b = warp - 1 + j * qw;
            if (b < nb) qload(b, qv[j]);
        }
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = logits[(int64_t)t * E + e];
        s[e] = (float)sqrt((double)softplus_ref(v));
        biased[e] = bias ? fadd(s[e], bias[e]) : s[e];
    }
    PHASE_MARK(2);
    __syncthreads();
    PHASE_MARK(3);
    if (tid2eid) {
        const int64_t tok = tokens[t];
        for (int i = threadIdx.x; i < K; i += blockDim.x) s_ids[i] = tid2eid[tok * K + i];
    } else if (warp_pick) {
        // K rounds of a warp-wide maximum over (biased score, lower id)
        // keys, the winners of earlier rounds left out: the same experts in
        // the same order as the ranking below, without its serial scans
        // (lane l looks at experts l, l+32, …; E ≤ 1024).
        if (threadIdx.x < 32 && (E == 128 || E == 256 || E == 384 || E == 512)) {
            switch (E / 32) { // (Flash's 256; the other widths of the family's configurations)
            case 4: router_pick_regs<4>(biased, K, s_ids); break;
            case 8: router_pick_regs<8>(biased, K, s_ids); break;
            case 12: router_pick_regs<12>(biased, K, s_ids); break;
            default: router_pick_regs<16>(biased, K, s_ids); break;
            }
            PHASE_MARK(4);
        } else if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            unsigned taken = 0;
            for (int r = 0; r < K; r++) {
                unsigned long long best = 0;
                for (int u = 0, e = lane; e < E; u++, e += 32) {
                    const unsigned long long k = ((unsigned long long)topk_key(biased[e]) << 32) | (0xffffffffu - (uint32_t)e);
                    if (!((taken >> u) & 1u) && k > best) best = k;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    const unsigned long long y = __shfl_xor_sync(FULL_MASK, best, o);
                    if (y > best) best = y;
                }
                const int w = (int)(0xffffffffu - (uint32_t)(best & 0xffffffffu));
                if ((w & 31) == lane) taken |= 1u << (w >> 5);
                if (lane == 0) s_ids[r] = w;
            }
            PHASE_MARK(4);
        }
    } else {
        // rank of e: the experts before it (greater biased score, or equal
        // and a lower id); the K first take the ranks 0..K-1. Eight scores
        // per step (two 16-byte shared loads) when E allows.
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            const float si = biased[e];
            int rank = 0, j = 0;
            auto before = [&](float b, int jj) { return (b > si || (b == si && jj < e)) ? 1 : 0; };
            if (E % 8 == 0) {
                const float4 *b4 = (const float4 *)biased;
                for (; j < E && rank < K; j += 8) {
                    const float4 x = b4[j / 4], y = b4[j / 4 + 1];
                    rank += before(x.x, j) + before(x.y, j + 1) + before(x.z, j + 2) + before(x.w, j + 3) +
                            before(y.x, j + 4) + before(y.y, j + 5) + before(y.z, j + 6) + before(y.w, j + 7);
                }
            }
            for (; j < E && rank < K; j++) rank += before(biased[j], j);
            if (rank < K) s_ids[rank] = e;
        }
    }
    if (warp >= 1 && nb > 0) {
        uint8_t *at = act + (int64_t)t * act_stride;
#pragma unroll
        for (int j = 0; j < RQ_PRE; j++) {
            const int b = warp - 1 + j * qw;
            if (b < nb) q8_k_warp(qv[j], lane, at, b, nb);
        }
        for (int b = warp - 1 + RQ_PRE * qw; b < nb; b += qw) {
            float v[8];
            qload(b, v);
            q8_k_warp(v, lane, at, b, nb);
        }
    }
    // the weights, by warp 0: after its own pick without waiting for the
    // CTA (the quantizing warps go on), else after the whole CTA's; K ≤ 32:
    // lane i takes pick i (its score gathered into the sum by shuffles,
    // added in pick order as the serial loop adds them), else thread 0
    if (!tid2eid && warp_pick) {
        __syncwarp();
    } else {
        __syncthreads();
    }
    PHASE_MARK(5);
    int32_t *ids = sel + (int64_t)t * K;
    float *w = wts + (int64_t)t * K;
    if (K <= 32) {
        if (warp == 0) {
            const int id = lane < K ? s_ids[lane] : 0;
            const float v = lane < K ? s[id] : 0.f;
            float sum = 0.f;
#pragma unroll 8
            for (int i = 0; i < K; i++) sum = fadd(sum, __shfl_sync(FULL_MASK, v, i));
            if (lane < K) {
                w[lane] = fmul(norm ? __fdiv_rn(v, sum) : v, wscale);
                ids[lane] = id;
            }
        }
    } else if (threadIdx.x == 0) {
        float sum = 0.f;
        for (int i = 0; i < K; i++) sum = fadd(sum, s[s_ids[i]]);
        for (int i = 0; i < K; i++) {
            float v = s[s_ids[i]];
            if (norm) v = __fdiv_rn(v, sum);
            w[i] = fmul(v, wscale);
            ids[i] = s_ids[i];
        }
    }
    phase_end(1);
}

// ------------------------------------------------------------ SwiGLU
// (swiglu_val, silu_ref: common.cuh)

__global__ void k_swiglu_ref(const float *g, const float *u, float *y, int64_t n, int rows, float lim,
                             const float *w) {
    pdl_enter();
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n * rows) return;
    y[i] = swiglu_val(g[i], u[i], lim, w, i / n);
}

// k_swiglu_q8k: k_swiglu_ref's values quantized straight into Q8_K
// activation rows (act_stride bytes apart; k_quant_q8_k_w's operations,
// q8_k_warp): a warp a 256-value block, 8 values a lane; n a multiple of
// 256, g and u 16-byte aligned. The same bytes as the two kernels; with
// fast, swiglu_as's fast values (DS4C_SWIGLU_FAST).
__global__ void __launch_bounds__(256) k_swiglu_q8k(const float *g, const float *u, uint8_t *act, int64_t act_stride,
                                                    int64_t n, int rows, float lim, const float *w, int fast) {
    pdl_enter();
    const int nb = (int)(n / 256);
    const int64_t gb = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (gb >= (int64_t)nb * rows) return; // whole warps
    const int64_t r = gb / nb;
    const int b = (int)(gb - r * nb);
    const int64_t o = r * n + b * 256 + lane * 8;
    const float4 g0 = __ldg((const float4 *)(g + o)), g1 = __ldg((const float4 *)(g + o) + 1);
    const float4 u0 = __ldg((const float4 *)(u + o)), u1 = __ldg((const float4 *)(u + o) + 1);
    const float gs[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    const float us[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = swiglu_as(fast != 0, gs[i], us[i], lim, w, r);
    q8_k_warp(v, lane, act + r * act_stride, b, nb);
}

// k_swiglu_half: k_swiglu_ref's values, with a float silu (x / (1 +
// exp(-x)) by the fast exponential: the double-precision one made this
// kernel 288 µs for a 4096-token chunk's 50M values), rounded to f16 rows
// (half_sat first), in chunks of 8 a thread (n a multiple of 32, rows n
// apart); P:
// each 32-value block permuted as ds4c_to_half_ex's DS4C_HALF_PERM32 — the
// output chunk m holds values 2m, 2m+1 of each group of 8.
template <bool P>
__global__ void k_swiglu_half(const float *g, const float *u, __half *y, int64_t n, int rows, float lim,
                              const float *w) {
    pdl_enter();
    const int64_t per = n / 8, total = per * rows;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / per, c = i - r * per;
        const float wr = w ? w[r] : 1.f;
        uint32_t out[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            // the pair of values that goes to word k of chunk c
            const int64_t at = r * n + (P ? perm32_at(c, k) : 8 * c + 2 * k);
            const float2 gv2 = __ldg((const float2 *)(g + at)), uv2 = __ldg((const float2 *)(u + at));
            float v[2] = {gv2.x, gv2.y}, uu[2] = {uv2.x, uv2.y};
#pragma unroll
            for (int e = 0; e < 2; e++) {
                v[e] = swiglu_fast(v[e], uu[e], lim); // (fast mode: float silu)
                if (w) v[e] *= wr;
            }
            const __half2 h = __floats2half2_rn(half_sat(v[0]), half_sat(v[1]));
            out[k] = *(const uint32_t *)&h;
        }
        *(uint4 *)(y + r * n + 8 * c) = make_uint4(out[0], out[1], out[2], out[3]);
    }
}

// ------------------------------------------------------------ MoE sum
// y[t] = Σ over the token's experts in ascending expert id of ye[t][k],
// then + ysh[t].
__global__ void __launch_bounds__(64) k_moe_combine(const float *ye, const int32_t *sel, const float *ysh, float *y,
                                                    int n, int K, int64_t D) {
    pdl_enter();
    // CTA: token blockIdx.y, 64 dims. Its first K threads place their
    // expert by rank (ties by position) once for the CTA; then every
    // thread loads the experts' outputs at its dim in rank order and adds
    // them in that order.
    __shared__ int s_ord[16]; // ds4c_moe_combine checks K
    const int t = blockIdx.y, tid = threadIdx.x;
    moe_rank_order(sel + (int64_t)t * K, K, s_ord);
    __syncthreads();
    const int64_t d = (int64_t)blockIdx.x * 64 + tid;
    if (d >= D) return;
    y[(int64_t)t * D + d] = moe_sum_at(ye + (int64_t)t * K * D, s_ord, K, D, d, ysh ? ysh + (int64_t)t * D : nullptr);
}

// k_moe_combine4: k_moe_combine for chunks, a thread per 4 dims (float4
// loads: the 64-thread scalar form read a 4096-token chunk's 403 MB of
// expert outputs at ≈ 1.3 TB/s), the same additions in the same order.
__global__ void __launch_bounds__(256) k_moe_combine4(const float *ye, const int32_t *sel, const float *ysh, float *y,
                                                     int n, int K, int64_t D) {
    pdl_enter();
    __shared__ int s_ord[16];
    const int t = blockIdx.y, tid = threadIdx.x;
    const int32_t *ids = sel + (int64_t)t * K;
    if (tid < K) {
        const int32_t me = ids[tid];
        int r = 0;
        for (int j = 0; j < K; j++) r += (ids[j] < me || (ids[j] == me && j < tid)) ? 1 : 0;
        s_ord[r] = tid;
    }
    __syncthreads();
    const int64_t d = ((int64_t)blockIdx.x * 256 + tid) * 4;
    if (d >= D) return;
    float4 v[16];
#pragma unroll
    for (int r = 0; r < 16; r++)
        if (r < K) v[r] = __ldg((const float4 *)(ye + ((int64_t)t * K + s_ord[r]) * D + d));
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < 16; r++)
        if (r < K) {
            acc.x = fadd(acc.x, v[r].x);
            acc.y = fadd(acc.y, v[r].y);
            acc.z = fadd(acc.z, v[r].z);
            acc.w = fadd(acc.w, v[r].w);
        }
    const int64_t i = (int64_t)t * D + d;
    if (ysh) {
        const float4 s = __ldg((const float4 *)(ysh + i));
        acc.x = fadd(acc.x, s.x), acc.y = fadd(acc.y, s.y), acc.z = fadd(acc.z, s.z), acc.w = fadd(acc.w, s.w);
    }
    *(float4 *)(y + i) = acc;
}

inline unsigned nblk(int64_t n, int b) { return (unsigned)((n + b - 1) / b); }

// hadamard_w launches k_hadamard_w for n = 32·V (V 1 … 32; the row start
// 16-byte aligned for V ≥ 4), else returns false.
template <bool FP4> bool hadamard_w(float *d_x, int64_t stride, int rows, int n, float scale, cudaStream_t st) {
    const unsigned g = nblk((int64_t)rows * 32, 256);
    const bool al = ((uintptr_t)d_x & 15) == 0 && stride % 4 == 0;
    switch (n) {
    case 32: ds4c_launch(k_hadamard_w<1, FP4>, g, 256, 0, st, d_x, stride, rows, scale); return true;
    case 64: ds4c_launch(k_hadamard_w<2, FP4>, g, 256, 0, st, d_x, stride, rows, scale); return true;
    case 128:
        if (!al) return false;
        ds4c_launch(k_hadamard_w<4, FP4>, g, 256, 0, st, d_x, stride, rows, scale);
        return true;
    case 256:
        if (!al) return false;
        ds4c_launch(k_hadamard_w<8, FP4>, g, 256, 0, st, d_x, stride, rows, scale);
        return true;
    case 512:
        if (!al) return false;
        ds4c_launch(k_hadamard_w<16, FP4>, g, 256, 0, st, d_x, stride, rows, scale);
        return true;
    }
    return false;
}


} // namespace

extern "C" {

int ds4c_get_rows(int type, const void *d_w, int64_t total_rows, int64_t cols, const int32_t *d_ids, int n,
                  float *d_dst, int64_t dst_stride, int copies, int64_t copy_stride, void *stream) {
    DS4C_READY();
    if (type != DS4C_F32 && type != DS4C_F16 && type != DS4C_BF16 && type != DS4C_Q8_0)
        return ds4c_err(DS4C_ETYPE, "get_rows: unsupported type %d", type);
    if (n <= 0) return 0;
    dim3 g((unsigned)((cols + 255) / 256 < 64 ? (cols + 255) / 256 : 64), (unsigned)n);
    ds4c_launch(k_get_rows, g, 256, 0, as_stream(stream), type, (const uint8_t *)d_w, total_rows, cols, d_ids, d_dst,
                dst_stride, copies, copy_stride);
    DS4C_CHECK_LAUNCH("get_rows");
    return 0;
}

int ds4c_pick_candidates(const float *d_x, int64_t n, float temp, float min_p, void *d_work, int32_t *d_top,
                         int32_t *d_counts, int32_t *d_out, int cap, void *stream) {
    DS4C_READY();
    if (n <= 0 || n > 0x7fffffffll || cap <= 0 || !(temp > 0.f) || !(min_p > 0.f))
        return ds4c_err(DS4C_EINVAL, "pick_candidates: %lld logits, cap %d, temperature %g, min_p %g", (long long)n, cap,
                        (double)temp, (double)min_p);
    const int rc = ds4c_argmax(d_x, n, d_work, d_top, stream);
    if (rc) return rc;
    const int sms = ds4c_sm_count() > 0 ? ds4c_sm_count() : 132;
    int64_t G = (n + 4 * CAND_T - 1) / (4 * CAND_T);
    if (G > sms) G = sms;
    if (G > DS4C_CAND_CTAS) G = DS4C_CAND_CTAS;
    if (G < 1) G = 1;
    const int64_t per = (n + G - 1) / G;
    ds4c_launch(k_cand_count, (unsigned)G, CAND_T, 0, as_stream(stream), d_x, n, d_top, temp, min_p, per, d_counts);
    DS4C_CHECK_LAUNCH("pick_candidates (count)");
    ds4c_launch(k_cand_write, (unsigned)G, CAND_T, 0, as_stream(stream), d_x, n, d_top, temp, min_p, per, d_counts,
                d_out, cap);
    DS4C_CHECK_LAUNCH("pick_candidates (write)");
    return 0;
}

int ds4c_wait_token(const void *h_word, void *h_flag, uint32_t seq, int64_t timeout_ns, int32_t *d_out,
                    void *stream) {
    DS4C_READY();
    if (((uintptr_t)h_word & 7) != 0 || ((uintptr_t)h_flag & 3) != 0 || !d_out)
        return ds4c_err(DS4C_EINVAL, "wait_token: misaligned or missing words");
    ds4c_launch(k_wait_token, 1, 1, 0, as_stream(stream), (const unsigned long long *)h_word, (unsigned *)h_flag,
                (unsigned)seq, (long long)timeout_ns, d_out);
    DS4C_CHECK_LAUNCH("wait_token");
    return 0;
}

int ds4c_argmax(const float *d_x, int64_t n, void *d_work, int32_t *d_out, void *stream) {
    DS4C_READY();
    if (n <= 0 || n > 0xffffffffll) return ds4c_err(DS4C_EINVAL, "argmax: %lld values", (long long)n);
    if (((uintptr_t)d_work & 7) != 0) return ds4c_err(DS4C_EINVAL, "argmax: work area not 8-byte aligned");
    // a few float4 groups a thread, every SM at most once
    int64_t blocks = (n / 4 + 4 * AM_T - 1) / (4 * AM_T);
    const int sms = ds4c_sm_count() > 0 ? ds4c_sm_count() : 132;
    if (blocks < 1) blocks = 1;
    if (blocks > sms) blocks = sms;
    ds4c_launch(k_argmax, (unsigned)blocks, AM_T, 0, as_stream(stream), d_x, n, (unsigned long long *)d_work, d_out);
    DS4C_CHECK_LAUNCH("argmax");
    return 0;
}

int ds4c_rmsnorm_ref(const float *d_x, int64_t x_stride, const float *d_w, float *d_y, int64_t y_stride, int64_t n,
                     int rows, float eps, void *stream) {
    DS4C_READY();
    if (rows <= 0) return 0;
    ds4c_launch(k_rmsnorm_ref, rows, 256, 0, as_stream(stream), d_x, x_stride, d_w, d_y, y_stride, n, eps);
    DS4C_CHECK_LAUNCH("rmsnorm_ref");
    return 0;
}

int ds4c_hc_pre(int mode, const float *d_mix, int M, const float *d_scale, const float *d_base, int hc, int iters,
                float hc_eps, const float *d_h, int64_t D, const float *d_normw, float norm_eps, float *d_x,
                float *d_post, float *d_comb, void *d_xq, int n, void *stream) {
    DS4C_READY();
    if (hc > 16) return ds4c_err(DS4C_EINVAL, "hc_pre: %d streams (at most 16)", hc);
    if ((mode & 2) && M > 288) return ds4c_err(DS4C_EINVAL, "hc_pre: %d mixing logits to scale (at most 288)", M);
    if ((mode >> 16) && (n > HPM_N || !(mode & 2)))
        return ds4c_err(DS4C_EINVAL, "hc_pre: mixing parts need at most %d tokens and raw logits (%d tokens)", HPM_N, n);
    if ((mode & 16) && ((mode >> 16) != DS4C_HC_EX_PARTS || hc != 4 || D != DS4C_HC_EX_D || ((uintptr_t)d_mix & 7)))
        return ds4c_err(DS4C_EINVAL, "hc_pre: exact mixing parts: %d parts, %d streams of %lld", mode >> 16, hc, (long long)D);
    if (n <= 0) return 0;
    // two CTAs per token (the split beside x) unless the option is off or
    // this is the head's (no split)
    const bool two = (mode & 1) == 0 && ds4c_opt_hc_two();
    const dim3 g((unsigned)n, two ? 2 : 1);
    // mode bit 8: d_xq receives x in f16 (rows of D), not its Q8_0 activation
    const bool xhalf = (mode & 8) != 0;
    const int64_t xq_bytes = !d_xq ? 0 : xhalf ? 2 * D : (int64_t)ds4c_act_bytes(DS4C_Q8_0, D);
    if (n >= 8 && hc == 4 && D % 4 == 0 && ((((uintptr_t)d_h | (uintptr_t)d_x | (uintptr_t)d_normw) & 15) == 0) &&
        ds4c_opt_hc_chunk()) {
        // the Q8_0 activation, or the f16 row, in the kernel
        const bool fq = d_xq && (xhalf ? ((uintptr_t)d_xq & 7) == 0 : D % 32 == 0);
        ds4c_launch(k_hc_pre_chunk<4>, (unsigned)n, HPC_T, 0, as_stream(stream), mode, d_mix, M, d_scale, d_base, iters,
                    hc_eps, d_h, D, d_normw, norm_eps, d_x, d_post, d_comb, fq ? (uint8_t *)d_xq : nullptr, xq_bytes);
        DS4C_CHECK_LAUNCH("hc_pre (chunk)");
        if (d_xq && !fq)
            return xhalf ? ds4c_to_half(d_x, D, D, n, d_xq, stream) : ds4c_quantize(DS4C_Q8_0, d_x, D, d_xq, D, n, stream);
        return 0;
    }
    if (xhalf) { // (the decode layout forms no f16 row)
        const int rc = ds4c_hc_pre(mode & ~8, d_mix, M, d_scale, d_base, hc, iters, hc_eps, d_h, D, d_normw, norm_eps, d_x,
                                   d_post, d_comb, nullptr, n, stream);
        return rc || !d_xq ? rc : ds4c_to_half(d_x, D, D, n, d_xq, stream);
    }
    // x's Q8_0 activation (d_xq, rows ds4c_act_bytes apart): formed by the
    // kernel where its float4 groups of a block sit in 8 adjacent lanes (the
    // vector path with every warp on x), else quantized after it
    const int64_t xq_stride = d_xq ? (int64_t)ds4c_act_bytes(DS4C_Q8_0, D) : 0;
    const bool fused = d_xq && hc == 4 && two && D % 32 == 0 && D / 4 <= 4 * 512 && ds4c_opt_hc_quant();
    // two float4 groups a thread cover D (the x CTA's 512 threads, less the
    // split's warp when it shares the CTA): k_hc_pre<4, 2>, with the stream
    // loads hoisted (DS4C_OPT_HC_HOIST)
    const int x0 = !two && (mode & 1) == 0 && hc * hc <= 32 ? 32 : 0;
    const bool g2 = hc == 4 && D % 4 == 0 && D / 4 <= 2 * (512 - x0);
    void (*k)(int, const float *, int, const float *, const float *, int, int, float, const float *, int64_t,
              const float *, float, float *, float *, float *, uint8_t *, int64_t) =
        hc != 4 ? k_hc_pre<0> : !g2 ? k_hc_pre<4> : ds4c_opt_hc_hoist() ? k_hc_pre<4, 2, true> : k_hc_pre<4, 2, false>;
    ds4c_launch(k, g, 512, 0, as_stream(stream), mode, d_mix, M, d_scale, d_base, hc, iters, hc_eps, d_h, D, d_normw,
                norm_eps, d_x, d_post, d_comb, fused ? (uint8_t *)d_xq : nullptr, xq_stride);
    DS4C_CHECK_LAUNCH("hc_pre");
    if (d_xq && !fused) return ds4c_quantize(DS4C_Q8_0, d_x, D, d_xq, D, n, stream);
    return 0;
}

int ds4c_hc_post(float *d_h, const float *d_out, const float *d_post, const float *d_comb, int hc, int64_t D, int n,
                 void *stream) {
    DS4C_READY();
    if (hc > 16) return ds4c_err(DS4C_EINVAL, "hc_post: %d streams (at most 16)", hc);
    if (n <= 0) return 0;
    ds4c_launch(hc == 4 ? k_hc_post<4> : k_hc_post<0>, nblk(D * n, 256), 256, 0, as_stream(stream), d_h, d_out, d_post,
                d_comb, hc, D, n);
    DS4C_CHECK_LAUNCH("hc_post");
    return 0;
}

// (d_ye null: out is d_out)
static int hc_post_mix(float *d_h, const float *d_out, const float *d_ye, const int32_t *d_sel, const float *d_ysh,
                       int K, const float *d_post, const float *d_comb, int hc, int64_t D, int fn_type, const void *d_fn,
                       int M, int parts, float *d_part, int n, void *stream) {
    DS4C_READY();
    if (d_ye && (K < 1 || K > 16 || !d_sel)) return ds4c_err(DS4C_EINVAL, "hc_post_mix: %d experts (1 … 16)", K);
    if (n < 1 || n > HPM_N) return ds4c_err(DS4C_EINVAL, "hc_post_mix: %d tokens (1 … %d)", n, HPM_N);
    if (hc != 4) return ds4c_err(DS4C_EINVAL, "hc_post_mix: %d streams (4 only)", hc);
    if (M <= 0 || M > HPM_M) return ds4c_err(DS4C_EINVAL, "hc_post_mix: %d mixing rows (at most %d)", M, HPM_M);
    const int64_t slice = parts > 0 && D % parts == 0 ? D / parts : 0; // 32, 64 or 128: one, two or four warps
    if (slice != 32 && slice != 64 && slice != 128)
        return ds4c_err(DS4C_EINVAL, "hc_post_mix: %lld values in %d parts", (long long)D, parts);
    using KF = void (*)(float *, const float *, const float *, const float *, int64_t, const void *, int, float *,
                        MoESum);
    static const KF ks[2][3][3] = {
        {
            {k_hc_post_mix<DS4C_F16, 1, false>, k_hc_post_mix<DS4C_F16, 2, false>, k_hc_post_mix<DS4C_F16, 4, false>},
            {k_hc_post_mix<DS4C_BF16, 1, false>, k_hc_post_mix<DS4C_BF16, 2, false>, k_hc_post_mix<DS4C_BF16, 4, false>},
            {k_hc_post_mix<DS4C_F32, 1, false>, k_hc_post_mix<DS4C_F32, 2, false>, k_hc_post_mix<DS4C_F32, 4, false>},
        },
        {
            {k_hc_post_mix<DS4C_F16, 1, true>, k_hc_post_mix<DS4C_F16, 2, true>, k_hc_post_mix<DS4C_F16, 4, true>},
            {k_hc_post_mix<DS4C_BF16, 1, true>, k_hc_post_mix<DS4C_BF16, 2, true>, k_hc_post_mix<DS4C_BF16, 4, true>},
            {k_hc_post_mix<DS4C_F32, 1, true>, k_hc_post_mix<DS4C_F32, 2, true>, k_hc_post_mix<DS4C_F32, 4, true>},
        },
    };
    const int ti = fn_type == DS4C_F16 ? 0 : fn_type == DS4C_BF16 ? 1 : fn_type == DS4C_F32 ? 2 : -1;
    if (ti < 0) return ds4c_err(DS4C_ETYPE, "hc_post_mix: weight type %d", fn_type);
    const KF k = ks[d_ye ? 1 : 0][ti][slice == 32 ? 0 : slice == 64 ? 1 : 2];
    const MoESum moe{d_ye, d_sel, d_ysh, K};
    ds4c_launch(k, dim3((unsigned)parts, (unsigned)n), (unsigned)slice, 0, as_stream(stream), d_h, d_out, d_post, d_comb,
                D, d_fn, M, d_part, moe);
    DS4C_CHECK_LAUNCH("hc_post_mix");
    return 0;
}

int ds4c_hc_post_mix(float *d_h, const float *d_out, const float *d_post, const float *d_comb, int hc, int64_t D,
                     int fn_type, const void *d_fn, int M, int parts, float *d_part, int n, void *stream) {
    return hc_post_mix(d_h, d_out, nullptr, nullptr, nullptr, 0, d_post, d_comb, hc, D, fn_type, d_fn, M, parts, d_part,
                       n, stream);
}

int ds4c_hc_post_mix_moe(float *d_h, const float *d_ye, const int32_t *d_sel, const float *d_ysh, int K,
                         const float *d_post, const float *d_comb, int hc, int64_t D, int fn_type, const void *d_fn,
                         int M, int parts, float *d_part, int n, void *stream) {
    if (!d_ye) return ds4c_err(DS4C_EINVAL, "hc_post_mix_moe: no expert outputs");
    return hc_post_mix(d_h, nullptr, d_ye, d_sel, d_ysh, K, d_post, d_comb, hc, D, fn_type, d_fn, M, parts, d_part, n,
                       stream);
}

int ds4c_hc_post_mix_ex(float *d_h, const float *d_out, const float *d_ye, const int32_t *d_sel, const float *d_ysh,
                        int K, const float *d_post, const float *d_comb, int hc, int64_t D, int fn_type,
                        const void *d_fn, int M, float *d_part, int n, void *stream) {
    DS4C_READY();
    if (!d_ye == !d_out) return ds4c_err(DS4C_EINVAL, "hc_post_mix_ex: one of the output and the expert outputs");
    if (d_ye && (K < 1 || K > 16 || !d_sel)) return ds4c_err(DS4C_EINVAL, "hc_post_mix_ex: %d experts (1 … 16)", K);
    if (n < 1 || n > HPM_N) return ds4c_err(DS4C_EINVAL, "hc_post_mix_ex: %d tokens (1 … %d)", n, HPM_N);
    if (hc != 4 || D != 2048 * HPX_PER)
        return ds4c_err(DS4C_EINVAL, "hc_post_mix_ex: %d streams of %lld (4 of %d only)", hc, (long long)D, 2048 * HPX_PER);
    if (M <= 0 || M > HPM_M) return ds4c_err(DS4C_EINVAL, "hc_post_mix_ex: %d mixing rows (at most %d)", M, HPM_M);
    if (((uintptr_t)d_part & 7) != 0) return ds4c_err(DS4C_EINVAL, "hc_post_mix_ex: parts not 8-byte aligned");
    using KF = void (*)(float *, const float *, const float *, const float *, const void *, int, float *, MoESum);
    static const KF ks[2][2][3] = {
        {
            {k_hc_post_mix_ex<DS4C_F16, false>, k_hc_post_mix_ex<DS4C_BF16, false>, k_hc_post_mix_ex<DS4C_F32, false>},
            {k_hc_post_mix_ex<DS4C_F16, true>, k_hc_post_mix_ex<DS4C_BF16, true>, k_hc_post_mix_ex<DS4C_F32, true>},
        },
        {
            {k_hc_post_mix_ex<DS4C_F16, false, 2>, k_hc_post_mix_ex<DS4C_BF16, false, 2>,
             k_hc_post_mix_ex<DS4C_F32, false, 2>},
            {k_hc_post_mix_ex<DS4C_F16, true, 2>, k_hc_post_mix_ex<DS4C_BF16, true, 2>,
             k_hc_post_mix_ex<DS4C_F32, true, 2>},
        },
    };
    const int ti = fn_type == DS4C_F16 ? 0 : fn_type == DS4C_BF16 ? 1 : fn_type == DS4C_F32 ? 2 : -1;
    if (ti < 0) return ds4c_err(DS4C_ETYPE, "hc_post_mix_ex: weight type %d", fn_type);
    const MoESum moe{d_ye, d_sel, d_ysh, K};
    // two tokens in one CTA each part (the weights loaded once) unless off
    const bool two = n == 2 && (ds4c_opt_mv_two() & 8);
    ds4c_launch(ks[two ? 1 : 0][d_ye ? 1 : 0][ti], dim3((unsigned)HPX_P, two ? 1u : (unsigned)n), HPX_T, 0,
                as_stream(stream), d_h, d_out, d_post, d_comb, d_fn, M, d_part, moe);
    DS4C_CHECK_LAUNCH("hc_post_mix_ex");
    return 0;
}

int ds4c_rope(float *d_x, int64_t tok_stride, int heads, int64_t head_stride, int64_t off, const float *d_freqs,
              int rd, int64_t pos0, int64_t pos_step, int n_tok, int inverse, void *stream) {
    DS4C_READY();
    int64_t n = (int64_t)n_tok * heads * (rd / 2);
    if (n <= 0) return 0;
    ds4c_launch(k_rope, nblk(n, 256), 256, 0, as_stream(stream), d_x, tok_stride, heads, head_stride, off, d_freqs, rd,
                pos0, pos_step, n_tok, inverse);
    DS4C_CHECK_LAUNCH("rope");
    return 0;
}

int ds4c_fp8_sim(float *d_x, int64_t stride, int rows, int64_t n, void *stream) {
    DS4C_READY();
    if (n % 64) return ds4c_err(DS4C_EINVAL, "fp8_sim: %lld values not a multiple of 64", (long long)n);
    int64_t warps = n / 64 * rows;
    if (warps <= 0) return 0;
    ds4c_launch(k_fp8_sim, nblk(warps * 32, 256), 256, 0, as_stream(stream), d_x, stride, rows, n);
    DS4C_CHECK_LAUNCH("fp8_sim");
    return 0;
}

int ds4c_norm_rope_pair(float *d_x1, int heads1, const float *d_w1, int fp8_n1, float *d_x2, int heads2,
                        const float *d_w2, int fp8_n2, int hd, float eps, int64_t off, const float *d_freqs, int rd,
                        int64_t pos0, int n_tok, const float *d_cs, float *d_ring, int64_t ring_cap,
                        void *stream) {
    DS4C_READY();
    if (n_tok <= 0) return 0;
    if (d_ring && (ring_cap < 1 || pos0 < 0))
        return ds4c_err(DS4C_EINVAL, "norm_rope_pair: a ring of %lld slots at position %lld", (long long)ring_cap,
                        (long long)pos0);
    const bool ok = heads1 > 0 && heads2 > 0 && fp8_n1 % 64 == 0 && fp8_n2 % 64 == 0 && fp8_n1 <= off &&
                    fp8_n2 <= off && off + rd <= hd && rd % 2 == 0 && (fp8_n1 == 0 || heads1 == 1) &&
                    (fp8_n2 == 0 || heads2 == 1);
    if (!ok)
        return ds4c_err(DS4C_EINVAL, "norm_rope_pair: %d and %d heads, fp8 %d and %d, rope %lld+%d of %d", heads1,
                        heads2, fp8_n1, fp8_n2, (long long)off, rd, hd);
    if (!ds4c_opt_norm_rope() || n_tok >= 8) { // the kernels of each tensor (which compute the rotation)
        int rc = ds4c_norm_rope(d_x1, (int64_t)heads1 * hd, heads1, hd, hd, d_w1, eps, off, d_freqs, rd, pos0, fp8_n1,
                                n_tok, stream);
        if (!rc)
            rc = ds4c_norm_rope(d_x2, (int64_t)heads2 * hd, heads2, hd, hd, d_w2, eps, off, d_freqs, rd, pos0, fp8_n2,
                                n_tok, stream);
        if (!rc && d_ring) // (the second copy of x2's rows)
            rc = ds4c_ring_write(d_ring, ring_cap, (int64_t)heads2 * hd, d_x2, (int64_t)heads2 * hd, pos0, n_tok,
                                 stream);
        return rc;
    }
    ds4c_launch(k_norm_rope_pair, (unsigned)(n_tok * (heads1 + heads2)), 256, (size_t)hd * sizeof(float),
                as_stream(stream), d_x1, heads1, d_w1, fp8_n1, d_x2, heads2, d_w2, fp8_n2, hd, eps, off, d_freqs, rd,
                pos0, n_tok, (const float2 *)d_cs, d_ring, ring_cap);
    DS4C_CHECK_LAUNCH("norm_rope_pair");
    return 0;
}

int ds4c_rope_table(const float *d_freqs, int rd, int64_t pos, int n, float *d_cs, void *stream) {
    DS4C_READY();
    if (rd <= 0 || rd % 2 || n < 1 || !d_freqs || !d_cs)
        return ds4c_err(DS4C_EINVAL, "rope_table: %d rotated dims of %d positions", rd, n);
    ds4c_launch(k_rope_table, 1, 32 * (unsigned)min(32, (n * rd / 2 + 31) / 32), 0, as_stream(stream), d_freqs, rd,
                pos, n, (float2 *)d_cs);
    DS4C_CHECK_LAUNCH("rope_table");
    return 0;
}

int ds4c_norm_rope(float *d_x, int64_t tok_stride, int heads, int64_t head_stride, int hd, const float *d_w,
                   float eps, int64_t off, const float *d_freqs, int rd, int64_t pos0, int fp8_n, int n_tok,
                   void *stream) {
    DS4C_READY();
    if (n_tok <= 0 || heads <= 0) return 0;
    if (fp8_n % 64 || fp8_n > off || off + rd > hd || rd % 2 || (fp8_n > 0 && heads != 1) ||
        tok_stride != heads * head_stride)
        return ds4c_err(DS4C_EINVAL, "norm_rope: %d heads %lld apart, tokens %lld apart, fp8 %d, rope %lld+%d of %d", heads,
                        (long long)head_stride, (long long)tok_stride, fp8_n, (long long)off, rd, hd);
    if (!ds4c_opt_norm_rope()) { // the three kernels
        int rc = ds4c_rmsnorm_ref(d_x, head_stride, d_w, d_x, head_stride, hd, heads * n_tok, eps, stream);
        if (rc == 0) rc = ds4c_rope(d_x, tok_stride, heads, head_stride, off, d_freqs, rd, pos0, 1, n_tok, 0, stream);
        if (rc == 0 && fp8_n > 0) rc = ds4c_fp8_sim(d_x, tok_stride, n_tok, fp8_n, stream);
        return rc;
    }
    // chunks: a warp per row where the row fits its registers as float4s
    if (n_tok >= 8 && ds4c_opt_norm_rope_w() && hd % 128 == 0 && hd <= NR_V * 128 && off % 2 == 0 &&
        ((uintptr_t)d_x & 15) == 0 && head_stride % 4 == 0 && tok_stride % 4 == 0) {
        const int64_t rows = (int64_t)n_tok * heads;
        ds4c_launch(k_norm_rope_w, (unsigned)((rows + 7) / 8), 256, 0, as_stream(stream), d_x, tok_stride, heads,
                    head_stride, hd, d_w, eps, off, d_freqs, rd, pos0, fp8_n, rows, (__half *)nullptr);
        DS4C_CHECK_LAUNCH("norm_rope");
        return 0;
    }
    ds4c_launch(k_norm_rope, (unsigned)(n_tok * heads), 256, (size_t)hd * sizeof(float), as_stream(stream), d_x,
                tok_stride, heads, head_stride, hd, d_w, eps, off, d_freqs, rd, pos0, fp8_n);
    DS4C_CHECK_LAUNCH("norm_rope");
    return 0;
}

int ds4c_norm_rope_half(const float *d_x, int64_t tok_stride, int heads, int64_t head_stride, int hd, const float *d_w,
                        float eps, int64_t off, const float *d_freqs, int rd, int64_t pos0, int fp8_n, int n_tok,
                        void *d_xh, void *stream) {
    DS4C_READY();
    if (n_tok <= 0 || heads <= 0) return 0;
    if (fp8_n % 64 || fp8_n > off || off + rd > hd || rd % 2 || (fp8_n > 0 && heads != 1) ||
        tok_stride != heads * head_stride || hd % 128 || hd > NR_V * 128 || off % 2 || ((uintptr_t)d_x & 15) ||
        ((uintptr_t)d_xh & 7) || head_stride % 4)
        return ds4c_err(DS4C_EINVAL, "norm_rope_half: %d heads %lld apart, fp8 %d, rope %lld+%d of %d", heads,
                        (long long)head_stride, fp8_n, (long long)off, rd, hd);
    const int64_t rows = (int64_t)n_tok * heads;
    ds4c_launch(k_norm_rope_w, (unsigned)((rows + 7) / 8), 256, 0, as_stream(stream), (float *)d_x, tok_stride, heads,
                head_stride, hd, d_w, eps, off, d_freqs, rd, pos0, fp8_n, rows, (__half *)d_xh);
    DS4C_CHECK_LAUNCH("norm_rope_half");
    return 0;
}

int ds4c_fp4_sim(float *d_x, int64_t stride, int rows, int64_t n, void *stream) {
    DS4C_READY();
    if (n % 32) return ds4c_err(DS4C_EINVAL, "fp4_sim: %lld values not a multiple of 32", (long long)n);
    int64_t warps = n / 32 * rows;
    if (warps <= 0) return 0;
    ds4c_launch(k_fp4_sim, nblk(warps * 32, 256), 256, 0, as_stream(stream), d_x, stride, rows, n);
    DS4C_CHECK_LAUNCH("fp4_sim");
    return 0;
}

int ds4c_hadamard_fp4(float *d_x, int64_t stride, int rows, int n, float scale, void *stream) {
    DS4C_READY();
    if (n <= 0 || n > 4096 || (n & (n - 1)) || n % 32) return ds4c_err(DS4C_EINVAL, "hadamard_fp4: size %d", n);
    if (rows <= 0) return 0;
    if (ds4c_opt_had_warp() && hadamard_w<true>(d_x, stride, rows, n, scale, as_stream(stream))) {
        DS4C_CHECK_LAUNCH("hadamard_fp4");
        return 0;
    }
    const int rc = ds4c_hadamard(d_x, stride, rows, n, scale, stream);
    return rc ? rc : ds4c_fp4_sim(d_x, stride, rows, n, stream);
}

int ds4c_hadamard(float *d_x, int64_t stride, int rows, int n, float scale, void *stream) {
    DS4C_READY();
    if (n <= 0 || n > 4096 || (n & (n - 1))) return ds4c_err(DS4C_EINVAL, "hadamard: size %d", n);
    if (rows <= 0) return 0;
    if (ds4c_opt_had_warp() && hadamard_w<false>(d_x, stride, rows, n, scale, as_stream(stream))) {
        DS4C_CHECK_LAUNCH("hadamard");
        return 0;
    }
    ds4c_launch(k_hadamard, rows, 128, n * sizeof(float), as_stream(stream), d_x, stride, n, scale);
    DS4C_CHECK_LAUNCH("hadamard");
    return 0;
}

int ds4c_scale(float *d_x, int64_t n, float s, void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    ds4c_launch(k_scale, nblk(n, 256), 256, 0, as_stream(stream), d_x, n, s);
    DS4C_CHECK_LAUNCH("scale");
    return 0;
}

int ds4c_index_query(float *d_q, float *d_w, int heads, int hd, int rd, const float *d_freqs, int64_t pos0, int n_tok,
                     float had_scale, float w_scale, void *stream) {
    DS4C_READY();
    if (n_tok <= 0 || heads <= 0) return 0;
    if (hd <= 0 || rd < 0 || rd > hd || rd % 2)
        return ds4c_err(DS4C_EINVAL, "index_query: head dim %d, rotated dims %d", hd, rd);
    if ((int64_t)n_tok * heads > (1LL << 31) / 32)
        return ds4c_err(DS4C_EINVAL, "index_query: %d tokens × %d heads", n_tok, heads);
    const int64_t off = hd - rd;
    const int rows = n_tok * heads;
    const unsigned g = nblk((int64_t)rows * 32, 256);
    const bool al = ((uintptr_t)d_q & 15) == 0;
    cudaStream_t st = as_stream(stream);
    void (*k)(float *, float *, int, int64_t, const float *, int, int64_t, int, float, float) = nullptr;
    if (hd == 64) k = k_ix_query<2>;
    if (al) { // (V ≥ 4: float4 rows, 16-byte aligned)
        if (hd == 128) k = k_ix_query<4>;
        if (hd == 256) k = k_ix_query<8>;
        if (hd == 512) k = k_ix_query<16>;
    }
    if (k && ds4c_opt_ix_query() && off % 2 == 0) {
        ds4c_launch(k, g, 256, 0, st, d_q, d_w, heads, off, d_freqs, rd, pos0, rows, had_scale, w_scale);
        DS4C_CHECK_LAUNCH("index_query");
        return 0;
    }
    int rc = ds4c_rope(d_q, (int64_t)heads * hd, heads, hd, off, d_freqs, rd, pos0, 1, n_tok, 0, stream);
    if (!rc) rc = ds4c_hadamard_fp4(d_q, hd, rows, hd, had_scale, stream);
    if (!rc) rc = ds4c_scale(d_w, rows, w_scale, stream);
    return rc;
}

int ds4c_add_ape(float *d_dst, const float *d_ape, int64_t width, int r, int64_t pos0, int n, void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    ds4c_launch(k_add_ape, nblk(width * n, 256), 256, 0, as_stream(stream), d_dst, d_ape, width, r, pos0, n);
    DS4C_CHECK_LAUNCH("add_ape");
    return 0;
}

int ds4c_ring_write(float *d_ring, int64_t cap, int64_t width, const float *d_src, int64_t src_stride, int64_t pos0,
                    int n, void *stream) {
    return ds4c_ring_write2(d_ring, nullptr, cap, width, d_src, nullptr, src_stride, pos0, n, stream);
}

// (d_ring_b null: one ring)
int ds4c_ring_write2(float *d_ring_a, float *d_ring_b, int64_t cap, int64_t width, const float *d_src_a,
                     const float *d_src_b, int64_t src_stride, int64_t pos0, int n, void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    int64_t rows = n > cap ? cap : n;
    ds4c_launch(k_ring_write, dim3(nblk(rows * width, 256), d_ring_b ? 2 : 1), 256, 0, as_stream(stream), d_ring_a,
                d_ring_b, cap, width, d_src_a, d_src_b, src_stride, pos0, n);
    DS4C_CHECK_LAUNCH("ring_write");
    return 0;
}

int ds4c_comp_pool(const float *d_kv, const float *d_sc, const float *d_kv_ring, const float *d_sc_ring, int64_t cap,
                   int64_t cw, int64_t pos0, int r, int coff, int64_t w, int64_t i0, int nrows, float *d_rows,
                   void *stream) {
    DS4C_READY();
    if (nrows <= 0) return 0;
    Entries e{d_kv, d_sc, d_kv_ring, d_sc_ring, cap, cw, pos0};
    ds4c_launch(k_comp_pool, nblk(w * nrows, 128), 128, 0, as_stream(stream), e, r, coff, w, i0, nrows, d_rows);
    DS4C_CHECK_LAUNCH("comp_pool");
    return 0;
}

int ds4c_comp_emit(const float *d_kv, const float *d_sc, float *d_kv_ring, float *d_sc_ring, int64_t kv_cap,
                   int64_t sc_cap, int64_t cw, int64_t pos0, int n, int r, int coff, int64_t w, int64_t i0, int nrows,
                   float *d_rows, const float *d_norm, float eps, const float *d_freqs, int rd, int post, int fp8_n,
                   float had_scale, void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    if (r <= 0 || (coff != 1 && coff != 2) || w <= 0 || cw != coff * w || rd < 0 || rd > w || rd % 2 || post < 0 ||
        post > 2 || (post == 1 && (fp8_n < 0 || fp8_n > w || fp8_n % 64)) || (post == 2 && w % 32))
        return ds4c_err(DS4C_EINVAL, "comp_emit: ratio %d, coff %d, width %lld of %lld, rope %d, post %d (%d)", r, coff,
                        (long long)w, (long long)cw, rd, post, fp8_n);
    const int64_t ne = (coff == 2 && i0 > 0 ? 2 : 1) * (int64_t)r;
    if (ds4c_opt_comp_emit() && nrows == 1 && kv_cap == sc_cap && w <= CE_MAXW && ne <= CE_MAXE &&
        (ne > CE_NE || w % (CE_THREADS / CE_NE) == 0) && (post != 2 || w == 128)) {
        Entries e{d_kv, d_sc, d_kv_ring, d_sc_ring, kv_cap, cw, pos0};
        ds4c_launch(k_comp_emit, 1, CE_THREADS, 0, as_stream(stream), e, r, coff, (int)w, i0, d_rows, d_norm, eps,
                    d_freqs, rd, post, fp8_n, had_scale, d_kv_ring, d_sc_ring, n);
        DS4C_CHECK_LAUNCH("comp_emit");
        return 0;
    }
    int rc = 0;
    if (nrows > 0) {
        rc = ds4c_comp_pool(d_kv, d_sc, d_kv_ring, d_sc_ring, kv_cap, cw, pos0, r, coff, w, i0, nrows, d_rows, stream);
        if (rc == 0) rc = ds4c_rmsnorm_ref(d_rows, w, d_norm, d_rows, w, w, nrows, eps, stream);
        if (rc == 0) rc = ds4c_rope(d_rows, w, 1, w, w - rd, d_freqs, rd, i0 * r, r, nrows, 0, stream);
        if (rc == 0 && post == 1 && fp8_n > 0) rc = ds4c_fp8_sim(d_rows, w, nrows, fp8_n, stream);
        if (rc == 0 && post == 2) rc = ds4c_hadamard_fp4(d_rows, w, nrows, (int)w, had_scale, stream);
        if (rc) return rc;
    }
    if (kv_cap != sc_cap) {
        rc = ds4c_ring_write(d_kv_ring, kv_cap, cw, d_kv, cw, pos0, n, stream);
        return rc ? rc : ds4c_ring_write(d_sc_ring, sc_cap, cw, d_sc, cw, pos0, n, stream);
    }
    return ds4c_ring_write2(d_kv_ring, d_sc_ring, kv_cap, cw, d_kv, d_sc, cw, pos0, n, stream);
}

// if_runs splits the maxR rows of nx token groups into ny runs of rblk
// rows (a multiple of IF_RB; a CTA a run) where the groups are too few for
// DS4C_OPT_IX_FLASH_SPLIT waves of the kernel's per_sm CTAs an SM (a small
// chunk deep in a long context); else one run of every row.
static void if_runs(int64_t nx, int64_t maxR, int per_sm, int64_t &ny, int64_t &rblk) {
    const int64_t tiles = (maxR + IF_RB - 1) / IF_RB;
    const int64_t want = (int64_t)ds4c_opt_ix_flash_split() * per_sm * ds4c_sm_count();
    ny = want > nx ? min(tiles, (want + nx - 1) / nx) : 1;
    rblk = ((tiles + ny - 1) / ny) * IF_RB;
    ny = (maxR + rblk - 1) / rblk;
}

int ds4c_index_scores(const float *d_q, const float *d_w, const float *d_rows, int IH, int IHD, int64_t pos0,
                      int ratio, int n, float *d_scores, int64_t sc_stride, int flags, void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    if (IHD % 4 || IH <= 0) return ds4c_err(DS4C_EINVAL, "index_scores: %d heads of %d", IH, IHD);
    if (n < 8 && (ds4c_opt_ex_timing() & 8)) flags |= DS4C_FAST; // (timing experiments only: wrong bits)
    const int64_t maxR = (pos0 + n) / ratio;
    if (maxR <= 0) return 0;
    const size_t smem = ((size_t)(IH + IX_ROWS) * (IHD + 4) + (size_t)IX_ROWS * (IH + 1)) * sizeof(float);
    static size_t set = 0;
    if (smem > 48 * 1024 && smem > set) {
        DS4C_CHECK(cudaFuncSetAttribute(k_index_scores, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        set = smem;
    }
    const size_t tsmem = ixt_smem(IH, IHD);
    const bool al16 = (((uintptr_t)d_q | (uintptr_t)d_rows) & 15) == 0;
    // fewer than 8 queries (a decode step, a speculative pass): the tiled
    // kernels, a CTA row (blockIdx.y) a token, each token's scores those of
    // its one-token launch
    if (n < 8 && (flags & DS4C_FAST) && IH == IF_IH && IHD == IF_HD && al16 && ds4c_opt_ix_tile() == 2) {
        static bool cset = false;
        if (!cset) {
            DS4C_CHECK(cudaFuncSetAttribute(k_index_tile_tc, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)IXC_SMEM));
            cset = true;
        }
        ds4c_launch(k_index_tile_tc, dim3(nblk(maxR, IXT_ROWS), (unsigned)n), IXT_WARPS * 32, IXC_SMEM, as_stream(stream), d_q,
                    d_w, d_rows, pos0, ratio, d_scores, sc_stride);
        DS4C_CHECK_LAUNCH("index_scores (tensor cores)");
        return 0;
    }
    if (n < 8 && IH % IXT_HPW == 0 && tsmem <= 200 * 1024 && ds4c_opt_ix_tile()) {
        static size_t tset = 0;
        if (tsmem > 48 * 1024 && tsmem > tset) {
            DS4C_CHECK(cudaFuncSetAttribute(k_index_tile, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tsmem));
            tset = tsmem;
        }
        ds4c_launch(k_index_tile, dim3(nblk(maxR, IXT_ROWS), (unsigned)n), IXT_WARPS * 32, tsmem, as_stream(stream), d_q, d_w,
                    d_rows, IH, IHD, pos0, ratio, d_scores, sc_stride);
        DS4C_CHECK_LAUNCH("index_scores");
        return 0;
    }
    // exact mode's chunks (8 or more tokens): the f16 tensor cores where exact
    // (DS4C_OPT_IX_EXACT: bits 1 and 2 the form, bit 4 tests only)
    const int ixe = ds4c_opt_ix_exact();
    if (n >= 8 && !(flags & DS4C_FAST) && (ixe & 3) && IH == IF_IH && IHD == IF_HD && al16) {
        static bool xset = false;
        if (!xset) {
            DS4C_CHECK(cudaFuncSetAttribute(k_index_flash_exact<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)IFX_SMEM));
            DS4C_CHECK(cudaFuncSetAttribute(k_index_flash_exact<5>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)IFX_SMEM));
            DS4C_CHECK(cudaFuncSetAttribute(k_index_flash_exact<1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)IFX_SMEM));
            DS4C_CHECK(cudaFuncSetAttribute(k_index_flash_exact<5, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)IFX_SMEM));
            xset = true;
        }
        const cudaStream_t st = as_stream(stream);
        const int64_t nx = nblk(n, IF_TT);
        int64_t ny, rblk;
        if_runs(nx, maxR, 2, ny, rblk);
        // (2: the f16 copies need stream-ordered scratch: not while the
        // stream is being recorded or captured, where form 1 runs)
        if ((ixe & 3) >= 2 && !ds4c_stream_busy(st)) {
            __half *rh = nullptr;
            DS4C_CHECK(cudaMallocAsync((void **)&rh, (size_t)maxR * (IF_HD * sizeof(__half) + 1), st));
            int8_t *rs = (int8_t *)(rh + maxR * IF_HD);
            ds4c_launch(k_ix_rows_half, dim3((unsigned)nblk(maxR, 8)), 256, 0, st, d_rows, maxR, rh, rs);
            ds4c_launch((ixe & 4) ? k_index_flash_exact<5, true> : k_index_flash_exact<1, true>,
                        dim3((unsigned)nx, (unsigned)ny), IF_T, IFX_SMEM, st, d_q, d_w, d_rows, (const __half *)rh,
                        (const int8_t *)rs, pos0, ratio, n, d_scores, sc_stride, rblk);
            const cudaError_t e = cudaGetLastError();
            cudaFreeAsync(rh, st);
            return e != cudaSuccess ? ds4c_cuda_err(e, "index_scores (exact, tensor cores, f16 rows)") : 0;
        }
        ds4c_launch((ixe & 4) ? k_index_flash_exact<5> : k_index_flash_exact<1>, dim3((unsigned)nx, (unsigned)ny), IF_T,
                    IFX_SMEM, st, d_q, d_w, d_rows, (const __half *)nullptr, (const int8_t *)nullptr, pos0, ratio, n,
                    d_scores, sc_stride, rblk);
        DS4C_CHECK_LAUNCH("index_scores (exact, tensor cores)");
        return 0;
    }
    if (n >= 8 && (flags & DS4C_FAST) && IH == IF_IH && IHD == IF_HD && al16 && ds4c_opt_ix_flash()) {
        static bool fset = false;
        if (!fset) {
            DS4C_CHECK(cudaFuncSetAttribute(k_index_flash, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)IF_SMEM));
            DS4C_CHECK(cudaFuncSetAttribute(k_index_flash2, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)IF2_SMEM));
            fset = true;
        }
        const cudaStream_t st = as_stream(stream);
        // (the f16 copies need stream-ordered scratch: not while the stream
        // is being recorded or captured)
        // (3: the wgmma kernel where the device and the build have it, else 2)
        if (ds4c_opt_ix_flash() >= 2 && !ds4c_stream_busy(st)) {
            // (4: the wgmma kernel on the rows' tile image, bulk copies)
            const bool wg = ds4c_opt_ix_flash() >= 3 && ds4c_ix_wg_ok(), bulk = wg && ds4c_opt_ix_flash() == 4;
            const int64_t nx = nblk(n, wg ? ds4c_ix_wg_tokens() : IF2_TT);
            int64_t ny, rblk;
            if_runs(nx, maxR, 1, ny, rblk);
            __half *rh = nullptr;
            const size_t bytes = bulk ? (size_t)ds4c_ix_tiles_bytes(maxR) : (size_t)maxR * IF_HD * sizeof(__half);
            DS4C_CHECK(cudaMallocAsync((void **)&rh, bytes, st));
            int rc = bulk ? ds4c_ix_tiles(d_rows, maxR, rh, st) : ds4c_to_half(d_rows, IF_HD, IF_HD, (int)maxR, rh, stream);
            if (!rc && wg) {
                rc = ds4c_ix_wg(d_q, d_w, rh, pos0, ratio, n, d_scores, sc_stride, nx, ny, rblk, bulk, st);
            } else if (!rc) {
                ds4c_launch(k_index_flash2, dim3((unsigned)nx, (unsigned)ny), IF2_T, IF2_SMEM, st, d_q, d_w, rh, pos0,
                            ratio, n, d_scores, sc_stride, rblk);
                const cudaError_t e = cudaGetLastError();
                if (e != cudaSuccess) rc = ds4c_cuda_err(e, "index_scores (flash, f16 rows)");
            }
            cudaFreeAsync(rh, st);
            return rc;
        }
        const int64_t nx = nblk(n, IF_TT);
        int64_t ny, rblk;
        if_runs(nx, maxR, 2, ny, rblk);
        ds4c_launch(k_index_flash, dim3((unsigned)nx, (unsigned)ny), IF_T, IF_SMEM, as_stream(stream), d_q, d_w, d_rows,
                    pos0, ratio, n, d_scores, sc_stride, rblk);
        DS4C_CHECK_LAUNCH("index_scores (flash)");
        return 0;
    }
    if (IH <= ATS_A && IHD % ATS_SL == 0 && ds4c_opt_ix_chunk()) {
        ds4c_launch((flags & DS4C_FAST) && n >= 8 && ds4c_opt_attn_tc() ? k_index_scores_tile<true> : k_index_scores_tile<false>, dim3(nblk(maxR, ATS_B), (unsigned)n), ATS_T, 0, as_stream(stream), d_q, d_w,
                    d_rows, IH, IHD, pos0, ratio, d_scores, sc_stride);
        DS4C_CHECK_LAUNCH("index_scores");
        return 0;
    }
    dim3 g(nblk(maxR, IX_ROWS), (unsigned)n);
    ds4c_launch(k_index_scores, g, 256, smem, as_stream(stream), d_q, d_w, d_rows, IH, IHD, pos0, ratio, d_scores,
                sc_stride);
    DS4C_CHECK_LAUNCH("index_scores");
    return 0;
}

int ds4c_topk(const float *d_scores, int64_t stride, int64_t R_fixed, int64_t pos0, int ratio, int K, int all_if_few,
              int32_t *d_sel, int32_t *d_nsel, int n, void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    if (R_fixed <= 0 && ratio <= 0) return ds4c_err(DS4C_EINVAL, "topk: neither a count nor a ratio");
    const int64_t maxR = R_fixed > 0 ? R_fixed : (pos0 + n) / ratio;
    if (n > 65535) return ds4c_err(DS4C_EINVAL, "topk: %d tokens (at most 65535)", n);
    // (row order past the radix kernels: k_topk's ranks, then k_topk_rows)
    constexpr int TOPK_ROWS_MAX = 12288; // k_topk_rows's picks in 48 KiB of shared memory
    if ((all_if_few & DS4C_TOPK_ROWS) && K > TOPK_ROWS_MAX && maxR > K)
        return ds4c_err(DS4C_EINVAL, "topk: %d picks in row order (at most %d)", K, TOPK_ROWS_MAX);
    const int cl_min = ds4c_opt_topk_cl();
    if (K <= TKC_T && maxR > K && cl_min > 0 && maxR >= cl_min && n <= ds4c_opt_topk_cl_tok()) {
        ds4c_launch(k_topk_cl, dim3(TKC_CL, (unsigned)n), TKC_T, 0, as_stream(stream), d_scores, stride, R_fixed, pos0,
                    ratio, K, all_if_few, d_sel, d_nsel);
        DS4C_CHECK_LAUNCH("topk");
        return 0;
    }
    if (K <= TK_THREADS && maxR > K) {
        const int tw = ds4c_opt_topk_warp();
        if (tw == 1 && K <= TKW_T && maxR > 8192 && ds4c_opt_topk_wide())
            ds4c_launch(k_topk_wide, (unsigned)n, TKW_T, 0, as_stream(stream), d_scores, stride, R_fixed, pos0, ratio, K,
                        all_if_few, d_sel, d_nsel);
        else if (tw == 1 && K <= 512)
            ds4c_launch(k_topk_warp<512>, (unsigned)n, 512, 0, as_stream(stream), d_scores, stride, R_fixed, pos0, ratio,
                        K, all_if_few, d_sel, d_nsel);
        else
            ds4c_launch(tw ? k_topk_warp<TK_THREADS> : k_topk_radix, (unsigned)n, TK_THREADS, 0, as_stream(stream),
                        d_scores, stride, R_fixed, pos0, ratio, K, all_if_few, d_sel, d_nsel);
        DS4C_CHECK_LAUNCH("topk");
        return 0;
    }
    dim3 g((unsigned)(maxR > 0 ? nblk(maxR, 64) : 1), (unsigned)n);
    ds4c_launch(k_topk, g, 64, 0, as_stream(stream), d_scores, stride, R_fixed, pos0, ratio, K, all_if_few, d_sel,
                d_nsel);
    DS4C_CHECK_LAUNCH("topk");
    if ((all_if_few & DS4C_TOPK_ROWS) && maxR > K) {
        ds4c_launch(k_topk_rows, (unsigned)n, 256, (size_t)K * sizeof(int32_t), as_stream(stream), R_fixed, pos0, ratio,
                    K, d_sel);
        DS4C_CHECK_LAUNCH("topk rows");
    }
    return 0;
}

// attn_flash_smem lets k_attn_flash's two forms take their shared memory
// (once).
static cudaError_t attn_flash_smem() {
    static bool set = false;
    if (set) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(k_attn_flash<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)FlSmem<false>::BYTES);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(k_attn_flash<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)FlSmem<true>::BYTES);
    set = e == cudaSuccess;
    return e;
}

// attn_flash_takes: ds4c_attention runs k_attn_flash for these arguments
// (given 16-byte aligned rows).
static bool attn_flash_takes(int n, int H, int HD, int flags) {
    return n >= 8 && (flags & DS4C_FAST) && HD == FL_HD && H % FL_H == 0 && ds4c_opt_attn_flash();
}

int ds4c_attention_half_ok(int n, int H, int HD, int rd, int roff, int flags) {
    return attn_flash_takes(n, H, HD, flags) && rd >= 0 && rd / 2 <= FL_RP && rd % 2 == 0 && roff >= 0 &&
                   roff % 2 == 0 && roff + rd <= HD
               ? ds4c_opt_attn_half()
               : 0;
}

int64_t ds4c_attention_work(int n, int H, int HD, int64_t max_keys, int flags) {
    if (n <= 0 || H <= 0 || HD <= 0 || max_keys <= 0 || attn_flash_takes(n, H, HD, flags)) return 0;
    int64_t w = (int64_t)n * H * max_keys;
    const int64_t split = (int64_t)n * H * DEC_SPLITS * (HD + 2); // k_attn_split's partial sums
    if (n < 8 && split > w) w = split;
    const int64_t seg = (int64_t)n * H * max_keys + seg_nseg(max_keys) * n * H * (HD + 2); // k_attn_seg's, after the scores
    if (n < 8 && seg > w) w = seg;
    const int64_t side = (int64_t)n * H * max_keys + (int64_t)n * H * (2 * seg_nseg(max_keys) + 1); // k_attn_softmax_seg's
    if (side > w) w = side;
    return w;
}

int ds4c_attention(const float *d_q, const float *d_kv, const float *d_win, int64_t wcap, const float *d_comp,
                   int ratio, const int32_t *d_sel, const int32_t *d_nsel, int K, const float *d_sinks, float *d_out,
                   int64_t pos0, int n, int H, int HD, int W, float scale, int64_t max_keys, float *d_work,
                   const float *d_rfreqs, int rd, int roff, void *d_qact, int64_t q_seg, float q_eps,
                   const float *d_rcs, int flags, void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    if (HD % 4) return ds4c_err(DS4C_EINVAL, "attention: head dim %d not a multiple of 4", HD);
    if (n < 8 && (ds4c_opt_ex_timing() & 2)) flags |= DS4C_FAST; // (timing experiments only: wrong bits)
    if (n > 65535 || max_keys <= 0) return ds4c_err(DS4C_EINVAL, "attention: %d tokens, %lld keys", n, (long long)max_keys);
    if (d_rfreqs && (rd <= 0 || rd % 2 || roff < 0 || roff + rd > HD))
        return ds4c_err(DS4C_EINVAL, "attention: rotation of dims %d..%d of %d", roff, roff + rd, HD);
    if (d_qact && (q_seg <= 0 || q_seg % 32 || ((int64_t)n * H * HD) % q_seg))
        return ds4c_err(DS4C_EINVAL, "attention: Q8_0 rows of %lld values", (long long)q_seg);
    const bool qh = flags & DS4C_ATTN_QH, oh = flags & DS4C_ATTN_OH, qn = flags & DS4C_ATTN_QN;
    if ((qh || oh || qn) && (!ds4c_attention_half_ok(n, H, HD, d_rfreqs ? rd : 0, roff, flags) || (oh && d_qact) ||
                             (qn && !d_rfreqs)))
        return ds4c_err(DS4C_EINVAL, "attention: f16 queries or output for %d tokens, %d heads of %d, rotation %d+%d%s", n,
                        H, HD, roff, rd, oh && d_qact ? " with a Q8_0 activation" : "");
    AttnArgs a{qh ? nullptr : d_q, d_kv, d_win, wcap, d_comp, ratio, d_sel, d_nsel, K, d_sinks, oh ? nullptr : d_out,
               pos0, H, HD, W, scale, nullptr, rd, roff, nullptr, q_seg, (int64_t)ds4c_act_bytes(DS4C_Q8_0, q_seg)};
    a.qh = qh ? (const __half *)d_q : nullptr;
    a.outh = oh ? (__half *)d_out : nullptr;
    if (oh || qn) a.rfreqs = d_rfreqs; // (the flash kernel's own rotations)
    a.qnorm = qn, a.qeps = q_eps;
    a.rcs = (const float2 *)d_rcs;
    a.pos0m = wcap > 0 ? pos0 % wcap : 0;
    // the Q8_0 activation after the output kernels (not fused)
    auto quantize = [&]() -> int {
        if (!d_qact) return 0;
        return ds4c_quantize(DS4C_Q8_0, d_out, q_seg, d_qact, q_seg, (int)((int64_t)n * H * HD / q_seg), stream);
    };
    // the rotation after the output kernels (not fused)
    auto rotate = [&]() -> int {
        if (!d_rfreqs) return 0;
        return ds4c_rope(d_out, (int64_t)H * HD, H, HD, roff, d_rfreqs, rd, pos0, 1, n, 1, stream);
    };
    // the segmented order (DS4C_OPT_ATTN_ORDER 1-5; cuda/NOTES.md v65, v66):
    // single tokens through k_attn_po_cl (1, where it applies) or split over
    // the segments (k_attn_seg: 2-4, 1 elsewhere; k_attn_seg_cl: 5 for head
    // dim 512, 3 elsewhere), prompt chunks through
    // k_attn_softmax_seg + k_attn_out_tile<false, true>; where none of them
    // applies, an error rather than another order's sums
    const int order = (flags & DS4C_FAST) ? 0 : ds4c_opt_attn_order();
    const bool seg = order == 1 && n < 8 && HD % AP_D == 0 && (HD / AP_D) % AP_CL == 0 && max_keys <= AP_ECAP &&
                     ds4c_opt_attn_po() && ds4c_opt_attn_po_vec() >= 4 && ds4c_opt_attn_ecache();
    const bool segsplit = order && !seg && n < 8 && HD % AP_D == 0 && HD % 128 == 0;
    const bool segchunk = order && n >= 8 && HD % AOT_D == 0 && ds4c_opt_attn_tile();
    const bool segfused = segsplit && order == 5 && HD == SG_CL * 64; // k_attn_seg_cl: the scores in the kernel
    if (order && !seg && !segsplit && !segchunk)
        return ds4c_err(DS4C_EINVAL,
                        "attention: the segmented order (option attn_order %d) for %d tokens of %d heads of %d: no kernel "
                        "has it for that shape (option attn_tile off?)",
                        order, n, H, HD);
    // k_attn_flash needs no work buffer (ds4c_attention_work 0)
    const bool rows16 = (((uintptr_t)d_q | (uintptr_t)d_kv | (uintptr_t)d_win | (uintptr_t)d_comp) & 15) == 0;
    const bool flash = attn_flash_takes(n, H, HD, flags);
    if ((qh || oh || qn) && !rows16) return ds4c_err(DS4C_EINVAL, "attention: f16 queries or output: rows not 16-byte aligned");
    if (!d_work && !(flash && rows16))
        return ds4c_err(DS4C_EINVAL, flash ? "attention: rows not 16-byte aligned for the flash kernel, and no work buffer"
                                           : "attention: no work buffer");
    cudaStream_t st = as_stream(stream);
    // the rotation and the Q8_0 activation inside the single-token kernels
    // (k_attn_po, k_attn_combine): the rotation when its pairs stay within a
    // lane pair, the activation when the rotation is done there too
    const bool fuse = d_rfreqs && roff % 2 == 0 && ds4c_opt_attn_rope();
    const bool fuseq = d_qact && (fuse || !d_rfreqs) && ds4c_opt_attn_quant();
    // after such a kernel: the parts it did not fuse
    auto unfused = [&]() -> int {
        if (!fuse) {
            int rc = rotate();
            if (rc) return rc;
        }
        return fuseq ? 0 : quantize();
    };
    // after a split kernel: k_attn_combine adds the nsplit splits' sums
    // (the rotation and the Q8_0 activation in it where they fuse), then
    // the parts it did not fuse
    auto combine = [&](int nsplit) -> int {
        if (fuse) a.rfreqs = d_rfreqs;
        if (fuseq) a.qact = (uint8_t *)d_qact;
        ds4c_launch(k_attn_combine, dim3(HD / AP_D, (unsigned)n, nblk(H, AP_H)), AP_T, 0, st, a, d_work, nsplit);
        DS4C_CHECK_LAUNCH("attention (split combine)");
        return unfused();
    };
    // fast single tokens split over the keys on the tensor cores: the flash
    // kernel with f16 operands on tiles of FL_KT keys, at most DEC_SPLITS
    // splits of whole tiles, as many as fit one wave (one CTA an SM), then
    // k_attn_combine; from FL_SPLIT_MIN keys (its cost hardly grows with the
    // keys, but starts higher than k_attn_split's: cuda/NOTES.md v28), or
    // always (option value 3)
    const int osplit = ds4c_opt_attn_split();
    if (n < 8 && (flags & DS4C_FAST) && HD == FL_HD && H % FL_H == 0 && rows16 &&
        (osplit == 3 || (osplit == 2 && max_keys >= FL_SPLIT_MIN)) && !a.qh && !a.outh && !a.qnorm) {
        DS4C_CHECK(attn_flash_smem());
        const int64_t groups = (int64_t)n * (H / FL_H), tiles = (max_keys + FL_KT - 1) / FL_KT;
        const int64_t fits = min((int64_t)DEC_SPLITS, max((int64_t)1, (int64_t)ds4c_sm_count() / groups));
        const int ks = (int)((tiles + fits - 1) / fits * FL_KT), nsplit = (int)((max_keys + ks - 1) / ks);
        ds4c_launch(k_attn_flash<false>, dim3((unsigned)n, (unsigned)(H / FL_H), (unsigned)nsplit), FL_T,
                    FlSmem<false>::BYTES, st, a, d_work, ks, nsplit);
        DS4C_CHECK_LAUNCH("attention (flash split)");
        return combine(nsplit);
    }
    if (n < 8 && (flags & DS4C_FAST) && HD == DEC_HD && ds4c_opt_attn_split()) {
        // fast single tokens, split over the keys: at most DEC_SPLITS splits
        // of a whole number of DEC_KC-key chunks
        const int64_t chunks = (max_keys + DEC_KC - 1) / DEC_KC, cps = (chunks + DEC_SPLITS - 1) / DEC_SPLITS;
        int ks = (int)(cps * DEC_KC), nsplit = (int)((max_keys + ks - 1) / ks);
        static int dec_fit = 0; // k_attn_split CTAs an SM holds (its registers allow one)
        if (!dec_fit) {
            DS4C_CHECK(cudaFuncSetAttribute(k_attn_split, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)DEC_SMEM));
            int f = 0;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f, k_attn_split, DEC_T, DEC_SMEM) != cudaSuccess) {
                (void)cudaGetLastError();
                f = 1;
            }
            dec_fit = max(1, f);
        }
        // … unless that makes more CTAs than the GPU holds at once (a ratio-4
        // layer's 640 keys: 20 splits of 8 head groups, 160 CTAs against
        // 132, a second wave as long as the first): then as many splits as
        // fit one wave, of equal runs of keys (the last chunk of a run
        // partial; DS4C_OPT_ATTN_WAVE)
        const int64_t groups = (int64_t)n * nblk(H, DEC_H), slots = (int64_t)dec_fit * ds4c_sm_count();
        // the splits of a head group as one cluster that combines them in
        // the same launch (DS4C_OPT_ATTN_CLUSTER): DEC_CL splits of whole
        // chunks, up to DEC_CL_CHUNKS chunks each, while the clusters' CTAs
        // fit one wave; the rotation and activation as k_attn_combine's
        // (cl_fit: how many such clusters the GPU holds at once, by its GPCs
        // — where it holds none, or the query fails, k_attn_split and its
        // combine run; where a launch has more clusters than that, as two
        // tokens' 16 can, the rest would wait for a second wave: the same)
        static int cl_fit = -1;
        if (cl_fit < 0 && ds4c_opt_attn_cluster()) {
            DS4C_CHECK(cudaFuncSetAttribute(k_attn_split_cl, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)DEC_SMEM));
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(DEC_CL, 1, 1);
            cfg.blockDim = dim3(DEC_T, 1, 1);
            cfg.dynamicSmemBytes = DEC_SMEM;
            int nc = 0;
            if (cudaOccupancyMaxActiveClusters(&nc, k_attn_split_cl, &cfg) != cudaSuccess) {
                (void)cudaGetLastError();
                nc = 0;
            }
            cl_fit = max(nc, 0);
        }
        if (ds4c_opt_attn_cluster() && cl_fit > 0 && chunks <= (int64_t)DEC_CL * DEC_CL_CHUNKS &&
            groups * DEC_CL <= slots && groups <= cl_fit) {
            if (fuse) a.rfreqs = d_rfreqs;
            if (fuseq) a.qact = (uint8_t *)d_qact;
            const int ksc = (int)((chunks + DEC_CL - 1) / DEC_CL * DEC_KC);
            ds4c_launch(k_attn_split_cl, dim3(DEC_CL, (unsigned)n, nblk(H, DEC_H)), DEC_T, DEC_SMEM, st, a, d_work, ksc);
            DS4C_CHECK_LAUNCH("attention (split, cluster)");
            return unfused();
        }
        if (ds4c_opt_attn_wave() && (int64_t)nsplit * groups > slots) {
            const int64_t fits = min((int64_t)DEC_SPLITS, max((int64_t)1, slots / groups)); // (fewer than before)
            ks = (int)((max_keys + fits - 1) / fits);
            nsplit = (int)((max_keys + ks - 1) / ks);
        }
        ds4c_launch(k_attn_split, dim3((unsigned)nsplit, (unsigned)n, nblk(H, DEC_H)), DEC_T, DEC_SMEM, st, a, d_work, ks,
                    nsplit);
        DS4C_CHECK_LAUNCH("attention (split)");
        return combine(nsplit);
    }
    // fast chunks of Flash's shape: one kernel, f16 operands (k_attn_flash)
    if (flash && rows16) {
        DS4C_CHECK(attn_flash_smem());
        const dim3 fg((unsigned)n, (unsigned)(H / FL_H));
        // (the f16 copies need stream-ordered scratch: not while the stream
        // is being recorded or captured)
        if (ds4c_opt_attn_flash() >= 2 && !ds4c_stream_busy(st)) { // f16 copies of the key rows first, in stream-ordered scratch
            const int64_t ncomp = ratio > 0 && d_comp ? (pos0 + n) / ratio : 0, nwin = d_win ? wcap : 0;
            const int64_t rows_h = n + nwin + ncomp;
            __half *hb = nullptr;
            DS4C_CHECK(cudaMallocAsync((void **)&hb, (size_t)rows_h * HD * sizeof(__half), st));
            a.kvh = hb;
            a.winh = nwin ? hb + (int64_t)n * HD : nullptr;
            a.comph = ncomp ? hb + (int64_t)(n + nwin) * HD : nullptr;
            int rc = ds4c_to_half(d_kv, HD, HD, n, hb, stream);
            if (!rc && nwin) rc = ds4c_to_half(d_win, HD, HD, (int)nwin, (void *)a.winh, stream);
            if (!rc && ncomp) rc = ds4c_to_half(d_comp, HD, HD, (int)ncomp, (void *)a.comph, stream);
            if (!rc && ds4c_opt_attn_flash() == 3 && attn_wg_ok()) {
                rc = ds4c_attn_wg(a, n, st); // the same operands on wgmma (attn_wg.cu)
            } else if (!rc) {
                ds4c_launch(k_attn_flash<true>, fg, FL_T, FlSmem<true>::BYTES, st, a, (float *)nullptr, 0, 0);
                const cudaError_t e = cudaGetLastError();
                if (e != cudaSuccess) rc = ds4c_cuda_err(e, "attention (flash, f16 rows)");
            }
            cudaFreeAsync(hb, st);
            if (rc) return rc;
        } else {
            ds4c_launch(k_attn_flash<false>, fg, FL_T, FlSmem<false>::BYTES, st, a, (float *)nullptr, 0, 0);
            DS4C_CHECK_LAUNCH("attention (flash)");
        }
        if (oh) return 0; // rotated and rounded in the kernel
        int rc = rotate();
        return rc ? rc : quantize();
    }
    // chunks: 32 keys and every head group per CTA; single tokens (and
    // small chunks): 16 keys and one head group, for more CTAs
    const bool chunk = n >= 8, fast = chunk && (flags & DS4C_FAST), tc = fast && ds4c_opt_attn_tc();
    const int ak = chunk ? AS_KMAX : AS_KMAX / 2;
    const size_t smem = (size_t)(AS_H + ak) * (HD + 4) * sizeof(float);
    static size_t set[2] = {0, 0};
    if (smem > 48 * 1024 && smem > set[chunk]) {
        DS4C_CHECK(cudaFuncSetAttribute(chunk ? k_attn_scores<2> : k_attn_scores<1>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        set[chunk] = smem;
    }
    const int hg = chunk ? (int)nblk(H, AS_H) : 1;
    const dim3 gs(nblk(max_keys, ak), (unsigned)n, nblk(H, AS_H * hg));
    if (segfused) {
        // (k_attn_seg_cl forms the scores)
    } else if (chunk && HD % ATS_SL == 0 && ds4c_opt_attn_tile())
        ds4c_launch(tc ? k_attn_scores_tile<true>
                       : (ds4c_opt_attn_tile() >= 2 ? k_attn_scores_tile<false, true> : k_attn_scores_tile<false>),
                    dim3(nblk(max_keys, ATS_B), (unsigned)n, nblk(H, ATS_A)), ATS_T, 0, st, a, d_work, max_keys);
    else if (chunk)
        ds4c_launch(k_attn_scores<2>, gs, 256, smem, st, a, d_work, max_keys, hg);
    else
        ds4c_launch(k_attn_scores<1>, gs, 256, smem, st, a, d_work, max_keys, hg);
    DS4C_CHECK_LAUNCH("attention scores");
    if (segsplit) { // the segmented order split over the segments (k_attn_seg), then combined
        const int hg = (int)nblk(H, SG_H), sd = order == 4 ? 32 : order == 2 ? 128 : 64;
        const dim3 sgrid((unsigned)seg_nseg(max_keys), (unsigned)n, (unsigned)(hg * (HD / sd)));
        if (segfused) {
            const int occ = ds4c_opt_attn_seg_occ(), walk = ds4c_opt_attn_seg_walk(), form = ds4c_opt_attn_seg_form();
            // k_attn_seg_walk (walk 1: single tokens, 2: every count) with
            // as few segments a cluster as keep the CTAs within one wave of
            // its occupancy's slots (3+: walk − 2 segments, every count)
            const int wocc = occ == 3 ? 3 : 4;
            if (walk >= 2 || (walk == 1 && n == 1)) {
                const int64_t ns = seg_nseg(max_keys);
                const int64_t f = max((int64_t)1, (int64_t)ds4c_sm_count() * wocc / ((int64_t)n * hg * SG_CL));
                const int segs = (int)min((int64_t)SGW_MAX, walk >= 3 ? (int64_t)(walk - 2) : (ns + f - 1) / f);
                ds4c_launch(seg_walk_kernel(wocc, form),
                            dim3((unsigned)((ns + segs - 1) / segs), (unsigned)n, (unsigned)(hg * SG_CL)), SG_T, 0, st, a, d_work,
                            max_keys, segs);
            } else
                ds4c_launch(seg_cl_kernel(occ, form),
                            sgrid, SG_T, 0, st, a, d_work, max_keys);
        }
        else
            ds4c_launch(order == 4 ? k_attn_seg<32> : order == 2 ? k_attn_seg<128> : k_attn_seg<64>, sgrid, SG_T, 0, st, a, d_work, max_keys);
        DS4C_CHECK_LAUNCH("attention (segments)");
        if (fuse) a.rfreqs = d_rfreqs;
        if (fuseq) a.qact = (uint8_t *)d_qact;
        const size_t csmem = (size_t)AP_H * 2 * seg_nseg(max_keys) * sizeof(float);
        static size_t cset = 48 * 1024;
        if (csmem > cset) {
            DS4C_CHECK(cudaFuncSetAttribute(k_attn_seg_combine<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csmem));
            DS4C_CHECK(cudaFuncSetAttribute(k_attn_seg_combine<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csmem));
            cset = csmem;
        }
        ds4c_launch(ds4c_opt_seg_comb() ? k_attn_seg_combine<true> : k_attn_seg_combine<false>,
                    dim3(HD / AP_D, (unsigned)n, nblk(H, AP_H)), AP_T, csmem, st, a, d_work, max_keys);
        DS4C_CHECK_LAUNCH("attention (segments combined)");
        return unfused();
    }
    if (n < 8 && HD % AP_D == 0 && ds4c_opt_attn_po()) {
        // softmax and output in one kernel (k_attn_po)
        const int ecap = (max_keys <= AP_ECAP && ds4c_opt_attn_ecache()) ? (int)((max_keys + 3) / 4 * 4) : 0;
        const size_t esmem = (size_t)AP_H * (seg ? ecap + AP_SEGX : ecap) * sizeof(float);
        // (the limit set once, whatever this call uses: with none in use,
        // the attribute alone changed a 640-key call run alone from 45.0
        // to 37.8 µs on the H200 — a larger shared-memory carve-out)
        static bool eset = false;
        if (!eset) {
            const int lim = (int)((size_t)AP_H * AP_ECAP * sizeof(float));
            DS4C_CHECK(cudaFuncSetAttribute(k_attn_po<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, lim));
            DS4C_CHECK(cudaFuncSetAttribute(k_attn_po<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, lim));
            DS4C_CHECK(cudaFuncSetAttribute(k_attn_po_cl<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, lim));
            DS4C_CHECK(cudaFuncSetAttribute(k_attn_po_cl<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)((size_t)AP_H * (AP_ECAP + AP_SEGX) * sizeof(float))));
            eset = true;
        }
        if (fuse) a.rfreqs = d_rfreqs;
        if (fuseq) a.qact = (uint8_t *)d_qact;
        const dim3 pg(HD / AP_D, (unsigned)n, nblk(H, AP_H));
        const int vec = ds4c_opt_attn_po_vec();
        if (vec >= 4 && !(flags & DS4C_FAST) && ecap && pg.x % AP_CL == 0)
            ds4c_launch(seg ? k_attn_po_cl<true> : k_attn_po_cl<false>, pg, AP_T, esmem, st, a, d_work, max_keys, ecap);
        else // (option 4 where k_attn_po_cl does not apply: option 2)
            ds4c_launch((flags & DS4C_FAST) ? k_attn_po<true> : k_attn_po<false>, pg, AP_T, esmem, st, a, d_work,
                        max_keys, ecap, vec >= 4 ? 2 : vec);
        DS4C_CHECK_LAUNCH("attention softmax and output");
        return unfused();
    }
    if (segchunk) { // exact prompt chunks in the segmented order
        ds4c_launch(k_attn_softmax_seg, (unsigned)(n * H), 32, 0, st, a, d_work, max_keys);
        DS4C_CHECK_LAUNCH("attention softmax (segments)");
        ds4c_launch(k_attn_out_tile<false, true>, dim3(HD / AOT_D, (unsigned)n, nblk(H, AOT_H)), AOT_T, 0, st, a, d_work,
                    max_keys);
        DS4C_CHECK_LAUNCH("attention output (segments)");
        int rc = rotate();
        return rc ? rc : quantize();
    }
    ds4c_launch(fast ? k_attn_softmax<true> : k_attn_softmax<false>, (unsigned)(n * H), 32, 0, st, a, d_work, max_keys);
    DS4C_CHECK_LAUNCH("attention softmax");
    // single tokens: 2 heads per CTA (measured against 4 and 8 on the H200:
    // more heads per CTA read the keys fewer times but leave SMs idle)
    if (tc && HD % AOT_D == 0 && ds4c_opt_attn_tile())
        ds4c_launch(k_attn_out_tc, dim3(HD / AOT_D, (unsigned)n, nblk(H, AOT_H)), AOT_T, 0, st, a, d_work, max_keys);
    else if (n >= 8 && HD % AOT_D == 0 && ds4c_opt_attn_tile())
        ds4c_launch(fast ? k_attn_out_tile<true> : k_attn_out_tile<false>, dim3(HD / AOT_D, (unsigned)n, nblk(H, AOT_H)), AOT_T, 0, st, a, d_work, max_keys);
    else if (n >= 8)
        ds4c_launch(k_attn_out<16>, dim3(nblk(HD, 128), (unsigned)n, nblk(H, 16)), 128, 0, st, a, d_work, max_keys);
    else
        ds4c_launch(k_attn_out<2>, dim3(nblk(HD, 128), (unsigned)n, nblk(H, 2)), 128, 0, st, a, d_work, max_keys);
    DS4C_CHECK_LAUNCH("attention output");
    int rc = rotate();
    return rc ? rc : quantize();
}

int ds4c_router(const float *d_logits, int E, const float *d_bias, const int32_t *d_tid2eid, const int32_t *d_tokens,
                int K, int norm, float wscale, int32_t *d_sel, float *d_w, int n, const float *d_x, int64_t cols,
                void *d_act, int64_t act_stride, void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    if (K > E) return ds4c_err(DS4C_EINVAL, "router: %d of %d experts", K, E);
    if (d_x && (cols <= 0 || cols % 256 != 0 || cols / 256 > 1 << 20 || (((uintptr_t)d_x) & 15) != 0 || !d_act ||
                ((uintptr_t)d_act & 7) != 0 || act_stride % 8 != 0))
        return ds4c_err(DS4C_EINVAL, "router: activation rows of %lld values (a multiple of 256, aligned)",
                        (long long)cols);
    ds4c_launch(k_router, n, 256, 2 * E * sizeof(float) + K * sizeof(int32_t), as_stream(stream), d_logits, E, d_bias,
                d_tid2eid, d_tokens, K, norm, wscale, d_sel, d_w, (E <= 1024 && ds4c_opt_router_warp()) ? 1 : 0, d_x,
                d_x ? cols : 0, (uint8_t *)d_act, act_stride);
    DS4C_CHECK_LAUNCH("router");
    return 0;
}

int ds4c_swiglu_ref(const float *d_g, const float *d_u, float *d_y, int64_t n, int rows, float lim, const float *d_w,
                    void *stream) {
    DS4C_READY();
    if (n * rows <= 0) return 0;
    ds4c_launch(k_swiglu_ref, nblk(n * rows, 256), 256, 0, as_stream(stream), d_g, d_u, d_y, n, rows, lim, d_w);
    DS4C_CHECK_LAUNCH("swiglu_ref");
    return 0;
}

int ds4c_swiglu_q8k(const float *d_g, const float *d_u, void *d_act, int64_t act_stride, int64_t n, int rows, float lim,
                    const float *d_w, int flags, void *stream) {
    DS4C_READY();
    if (n <= 0 || rows < 0 || n % 256 != 0 || (((uintptr_t)d_g | (uintptr_t)d_u) & 15) != 0 ||
        ((uintptr_t)d_act & 7) != 0 || act_stride % 8 != 0)
        return ds4c_err(DS4C_EINVAL, "swiglu_q8k: n %lld (a multiple of 256), alignment", (long long)n);
    if (rows == 0) return 0;
    const int64_t blocks = n / 256 * rows;
    ds4c_launch(k_swiglu_q8k, (unsigned)((blocks + 7) / 8), 256, 0, as_stream(stream), d_g, d_u, (uint8_t *)d_act,
                act_stride, n, rows, lim, d_w, (flags & DS4C_SWIGLU_FAST) ? 1 : 0);
    DS4C_CHECK_LAUNCH("swiglu_q8k");
    return 0;
}

int ds4c_swiglu_half(const float *d_g, const float *d_u, void *d_yh, int64_t n, int rows, float lim, const float *d_w,
                     int flags, void *stream) {
    DS4C_READY();
    if (n <= 0 || rows < 0 || n % 32 != 0 || (((uintptr_t)d_g | (uintptr_t)d_u) & 7) != 0 || ((uintptr_t)d_yh & 15) != 0)
        return ds4c_err(DS4C_EINVAL, "swiglu_half: bad shape or alignment");
    if (rows == 0) return 0;
    const int64_t items = n / 8 * rows;
    const int64_t cap = 8 * (int64_t)(ds4c_sm_count() > 0 ? ds4c_sm_count() : 132);
    const int64_t want = (items + 255) / 256;
    const unsigned grid = (unsigned)(want < cap ? want : cap);
    if (flags & DS4C_HALF_PERM32)
        ds4c_launch(k_swiglu_half<true>, grid, 256, 0, as_stream(stream), d_g, d_u, (__half *)d_yh, n, rows, lim, d_w);
    else
        ds4c_launch(k_swiglu_half<false>, grid, 256, 0, as_stream(stream), d_g, d_u, (__half *)d_yh, n, rows, lim, d_w);
    DS4C_CHECK_LAUNCH("swiglu_half");
    return 0;
}

int ds4c_moe_combine(const float *d_ye, const int32_t *d_sel, const float *d_ysh, float *d_y, int n, int K, int64_t D,
                     void *stream) {
    DS4C_READY();
    if (n <= 0) return 0;
    if (K > 16) return ds4c_err(DS4C_EINVAL, "moe_combine: %d experts per token (at most 16)", K);
    if (n > 65535) return ds4c_err(DS4C_EINVAL, "moe_combine: %d tokens (at most 65535)", n);
    if (n >= 8 && D % 4 == 0 && (((uintptr_t)d_ye | (uintptr_t)d_ysh | (uintptr_t)d_y) & 15) == 0)
        ds4c_launch(k_moe_combine4, dim3(nblk(D / 4, 256), (unsigned)n), 256, 0, as_stream(stream), d_ye, d_sel, d_ysh, d_y,
                    n, K, D);
    else
        ds4c_launch(k_moe_combine, dim3(nblk(D, 64), (unsigned)n), 64, 0, as_stream(stream), d_ye, d_sel, d_ysh, d_y, n,
                    K, D);
    DS4C_CHECK_LAUNCH("moe_combine");
    return 0;
}

} // extern "C"
