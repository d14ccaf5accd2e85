// hc_mix.cu: fast mode's hyper-connection mixing logits of chunks
// (ds4cuda.h: ds4c_hc_mixes_ok, ds4c_hc_mixes).
//
// The mixer multiplies each token's flattened streams h_t (HC·D floats,
// 16384 for Flash, not normalised) by M ≤ 32 rows (24 for Flash: pre, post
// and the HC×HC split) and scales the M logits by rsqrt(mean(h_t²) + eps).
// Exact mode keeps the CPU's summation order (k_fexact_tile_wr, ≈ 315 µs
// for a 4096-token chunk on the H200, cuda/NOTES.md v16), and hc_pre then
// reads the streams again for their sum of squares. Here a chunk is one
// pass over the streams (268 MB for 4096 tokens: ≈ 67 µs at 4 TB/s): the
// products on the TF32 tensor cores in three terms (hi·hi + hi·lo + lo·hi of
// each operand split into two TF32 values: about float32's accuracy, the
// lo·lo term below 2^-22 of a product), the sum of squares on the side, and
// the scale applied, so that hc_pre needs neither.
//
// A CTA takes 16 tokens and 8 warps; warp w walks K/8 of the values. Per
// 16 values a lane (g = lane/4, q = lane%4) loads 4 consecutive values of
// tokens g and g+8 and of mixer rows g, 8+g, …: values 4q+2s and 4q+2s+1
// are the mma's k columns q and q+4 of step s (any order of k gives the
// same dot product, and these are whole 32-byte sectors a row). The warps'
// partial sums meet in shared memory and are added in warp order.
#include <cooperative_groups.h>

#include "common.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int HM_T = 16; // tokens a CTA
constexpr int HM_W = 8;  // warps a CTA (each a K/8 range)
constexpr int HM_KS = 8; // k_hc_mix_tf32_cl: CTAs a cluster (each a K/8 range)
// HM_CL_MAX: chunks of at most this many tokens take k_hc_mix_tf32_cl (at
// 2048 tokens, 128 CTAs of k_hc_mix_tf32 already give each SM one)
constexpr int HM_CL_MAX = 1024;

__device__ __forceinline__ uint32_t hm_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// hm_split: x as hi + lo, both TF32 (hi the nearest TF32, lo the rest
// rounded to TF32).
__device__ __forceinline__ void hm_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = hm_tf32(x);
    lo = hm_tf32(x - __uint_as_float(hi));
}

__device__ __forceinline__ void hm_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// hm_load4: 4 consecutive mixer weights as floats.
__device__ __forceinline__ void hm_load4(const float *p, float (&v)[4]) {
    const float4 f = __ldg((const float4 *)p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
__device__ __forceinline__ void hm_load4(const __half *p, float (&v)[4]) {
    const uint2 u = __ldg((const uint2 *)p);
    const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}

// hm_share stores the warps' partial sums (acc: per n-tile j, (token g,
// rows 2q, 2q+1), (token g+8, the same); ssa, ssb: tokens g, g+8) in
// shared memory, s_acc[w] and s_ss[w] for warp w, and synchronises the CTA.
template <int NT>
__device__ __forceinline__ void hm_share(const float (&acc)[NT][4], float ssa, float ssb,
                                         float (&s_acc)[HM_W][HM_T][NT * 8 + 1], float (&s_ss)[HM_W][HM_T]) {
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            s_acc[w][g][8 * j + 2 * q + e] = acc[j][e];
            s_acc[w][g + 8][8 * j + 2 * q + e] = acc[j][2 + e];
        }
    ssa += __shfl_xor_sync(0xffffffffu, ssa, 1);
    ssa += __shfl_xor_sync(0xffffffffu, ssa, 2);
    ssb += __shfl_xor_sync(0xffffffffu, ssb, 1);
    ssb += __shfl_xor_sync(0xffffffffu, ssb, 2);
    if (q == 0) s_ss[w][g] = ssa, s_ss[w][g + 8] = ssb;
    __syncthreads();
}

// hm_finish ends a mixing kernel: the warps' partial sums meet in shared
// memory (hm_share), are added in warp order and scaled by rsqrt(Σh²/K +
// eps) into mix[t][m] for the CTA's HM_T tokens.
template <int NT>
__device__ __forceinline__ void hm_finish(const float (&acc)[NT][4], float ssa, float ssb,
                                          float (&s_acc)[HM_W][HM_T][NT * 8 + 1], float (&s_ss)[HM_W][HM_T], int M,
                                          int64_t K, int n, float eps, float *mix) {
    hm_share<NT>(acc, ssa, ssb, s_acc, s_ss);
    const int tid = threadIdx.x, t0 = blockIdx.x * HM_T;
    for (int i = tid; i < HM_T * M; i += HM_W * 32) {
        const int r = i / M, m = i - r * M;
        if (t0 + r >= n) break;
        float sum = 0.f, ss = 0.f;
#pragma unroll
        for (int v = 0; v < HM_W; v++) sum += s_acc[v][r][m], ss += s_ss[v][r];
        mix[(int64_t)(t0 + r) * M + m] = sum * (1.f / sqrtf(ss / (float)K + eps));
    }
}

// hm_dot: one warp's partial products of the CTA's HM_T tokens (from
// blockIdx.x) with the M ≤ 8·NT mixer rows over its kw values from kbase
// (acc: per n-tile j, (token g, rows 2q, 2q+1), (token g+8, the same)) and
// the sums of squares of tokens g (ssa) and g+8 (ssb) over them.
template <typename WT, int NT>
__device__ __forceinline__ void hm_dot(const WT *fn, int M, int64_t K, const float *h, int n, int64_t kbase,
                                       int64_t kw, float (&acc)[NT][4], float &ssa, float &ssb) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int t0 = blockIdx.x * HM_T;
    const int64_t k0 = kbase + 4 * q;
    const float *ha = h + (int64_t)min(t0 + g, n - 1) * K + k0;
    const float *hb = h + (int64_t)min(t0 + g + 8, n - 1) * K + k0;
    const WT *wr[NT];
    bool wok[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        wok[j] = 8 * j + g < M;
        wr[j] = fn + (int64_t)min(8 * j + g, M - 1) * K + k0;
    }
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    ssa = 0.f, ssb = 0.f;
    pdl_wait();
    // Two steps of 16 values a loop, the next two steps' loads issued before
    // these products (a step's loads are its only latency: loaded in turn,
    // the loop waited on memory once a step, 178 µs a 4096-token chunk).
    float4 va[2], vb[2];
    float wv[2][NT][4];
    auto load = [&](int64_t k, float4 &a, float4 &b, float (&w)[NT][4]) {
        a = __ldg((const float4 *)(ha + k)), b = __ldg((const float4 *)(hb + k));
#pragma unroll
        for (int j = 0; j < NT; j++) hm_load4(wr[j] + k, w[j]);
    };
    load(0, va[0], vb[0], wv[0]);
    load(16, va[1], vb[1], wv[1]);
    for (int64_t k = 0; k < kw; k += 32) {
        const int64_t kn = k + 32 < kw ? k + 32 : k; // (the last loop reloads its own values)
        float4 na[2], nb[2];
        float nw[2][NT][4];
        load(kn, na[0], nb[0], nw[0]);
        load(kn + 16, na[1], nb[1], nw[1]);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const float4 a4 = va[u], b4 = vb[u];
            ssa = fmaf(a4.x, a4.x, fmaf(a4.y, a4.y, fmaf(a4.z, a4.z, fmaf(a4.w, a4.w, ssa))));
            ssb = fmaf(b4.x, b4.x, fmaf(b4.y, b4.y, fmaf(b4.z, b4.z, fmaf(b4.w, b4.w, ssb))));
#pragma unroll
            for (int s = 0; s < 2; s++) {
                // a: (token g, k q), (token g+8, k q), (g, k q+4), (g+8, k q+4)
                const float af[4] = {s ? a4.z : a4.x, s ? b4.z : b4.x, s ? a4.w : a4.y, s ? b4.w : b4.y};
                uint32_t ahi[4], alo[4];
#pragma unroll
                for (int i = 0; i < 4; i++) hm_split(af[i], ahi[i], alo[i]);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    // b: (k q, row g), (k q+4, row g); rows past M are zero
                    uint32_t b0h, b0l, b1h, b1l;
                    hm_split(wok[j] ? wv[u][j][2 * s] : 0.f, b0h, b0l);
                    hm_split(wok[j] ? wv[u][j][2 * s + 1] : 0.f, b1h, b1l);
                    hm_mma(acc[j], alo, b0h, b1h);
                    hm_mma(acc[j], ahi, b0l, b1l);
                    hm_mma(acc[j], ahi, b0h, b1h);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            va[u] = na[u], vb[u] = nb[u];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) wv[u][j][i] = nw[u][j][i];
        }
    }
}

// k_hc_mix_tf32: mix[t][m] = (fn[m] · h[t]) · rsqrt(Σ h[t]² / K + eps) for
// t < n, m < M ≤ 8·NT (K a multiple of 256, h 16-byte aligned).
template <typename WT, int NT>
__global__ void __launch_bounds__(HM_W * 32) k_hc_mix_tf32(const WT *fn, int M, int64_t K, const float *h, int n,
                                                           float eps, float *mix) {
    pdl_launch();
    __shared__ float s_acc[HM_W][HM_T][NT * 8 + 1];
    __shared__ float s_ss[HM_W][HM_T];
    const int64_t kw = K / HM_W;
    float acc[NT][4], ssa, ssb;
    hm_dot<WT, NT>(fn, M, K, h, n, (threadIdx.x >> 5) * kw, kw, acc, ssa, ssb);
    hm_finish<NT>(acc, ssa, ssb, s_acc, s_ss, M, K, n, eps, mix);
}

// k_hc_mix_tf32_cl is k_hc_mix_tf32 for chunks of few tokens (hm_go:
// HM_CL_MAX): the HM_KS CTAs of a cluster (blockIdx.y) take the same tokens
// and a K/HM_KS range each, so that a 256-token chunk runs 128 CTAs, not
// 16, each warp 256 values instead of 2048 (v49: 70 µs a call, latency-
// bound). Each CTA adds its warps' sums in warp order; CTA 0 of the
// cluster adds the CTAs' in rank order from their shared memory and scales
// them: a fixed order, another one than k_hc_mix_tf32's (the same accuracy,
// other bits).
template <typename WT, int NT>
__global__ void __cluster_dims__(1, HM_KS, 1) __launch_bounds__(HM_W * 32)
    k_hc_mix_tf32_cl(const WT *fn, int M, int64_t K, const float *h, int n, float eps, float *mix) {
    pdl_launch();
    __shared__ float s_acc[HM_W][HM_T][NT * 8 + 1];
    __shared__ float s_ss[HM_W][HM_T];
    __shared__ float s_part[HM_T][NT * 8 + 1];
    __shared__ float s_sp[HM_T];
    const int tid = threadIdx.x;
    const int64_t kw = K / (HM_W * HM_KS);
    float acc[NT][4], ssa, ssb;
    hm_dot<WT, NT>(fn, M, K, h, n, ((int64_t)blockIdx.y * HM_W + (tid >> 5)) * kw, kw, acc, ssa, ssb);
    hm_share<NT>(acc, ssa, ssb, s_acc, s_ss);
    for (int i = tid; i < HM_T * M; i += HM_W * 32) {
        const int r = i / M, m = i - r * M;
        float sum = 0.f;
#pragma unroll
        for (int v = 0; v < HM_W; v++) sum += s_acc[v][r][m];
        s_part[r][m] = sum;
    }
    if (tid < HM_T) {
        float ss = 0.f;
#pragma unroll
        for (int v = 0; v < HM_W; v++) ss += s_ss[v][tid];
        s_sp[tid] = ss;
    }
    cg::cluster_group cl = cg::this_cluster();
    cl.sync(); // every CTA's partial sums are in its shared memory
    if (cl.block_rank() == 0) {
        const int t0 = blockIdx.x * HM_T;
        for (int i = tid; i < HM_T * M; i += HM_W * 32) {
            const int r = i / M, m = i - r * M;
            if (t0 + r >= n) break;
            float sum = 0.f, ss = 0.f;
#pragma unroll
            for (int c = 0; c < HM_KS; c++) {
                sum += cl.map_shared_rank(&s_part[0][0], c)[r * (NT * 8 + 1) + m];
                ss += cl.map_shared_rank(&s_sp[0], c)[r];
            }
            mix[(int64_t)(t0 + r) * M + m] = sum * (1.f / sqrtf(ss / (float)K + eps));
        }
    }
    cl.sync(); // the other CTAs' shared memory stays until CTA 0 has read it
}

template <typename WT> void hm_go(const WT *fn, int M, int64_t K, const float *h, int n, float eps, float *mix,
                                  cudaStream_t st) {
    const unsigned grid = (unsigned)((n + HM_T - 1) / HM_T);
    // the kernel for M rows: k1 up to 8, k3 up to 24, k4 up to 32
    auto go = [&](auto k1, auto k3, auto k4, dim3 g) {
        if (M <= 8)
            ds4c_launch(k1, g, HM_W * 32, 0, st, fn, M, K, h, n, eps, mix);
        else if (M <= 24)
            ds4c_launch(k3, g, HM_W * 32, 0, st, fn, M, K, h, n, eps, mix);
        else
            ds4c_launch(k4, g, HM_W * 32, 0, st, fn, M, K, h, n, eps, mix);
    };
    if (n <= HM_CL_MAX && K % (32 * HM_W * HM_KS) == 0 && ds4c_opt_hc_mix() == 1)
        go(k_hc_mix_tf32_cl<WT, 1>, k_hc_mix_tf32_cl<WT, 3>, k_hc_mix_tf32_cl<WT, 4>, dim3(grid, HM_KS));
    else
        go(k_hc_mix_tf32<WT, 1>, k_hc_mix_tf32<WT, 3>, k_hc_mix_tf32<WT, 4>, dim3(grid));
}

} // namespace

extern "C" {

int ds4c_hc_mixes_ok(int type, int M, int64_t K, int n) {
    return ds4c_opt_hc_mix() && (type == DS4C_F32 || type == DS4C_F16) && M > 0 && M <= 32 && K > 0 && K % 256 == 0 &&
                   n >= 8
               ? 1
               : 0;
}

int ds4c_hc_mixes(int type, const void *d_fn, int M, int64_t K, const float *d_h, int n, float eps, float *d_mix,
                  void *stream) {
    DS4C_READY();
    if (!ds4c_hc_mixes_ok(type, M, K, n) || ((uintptr_t)d_h & 15) != 0 || ((uintptr_t)d_fn & 15) != 0)
        return ds4c_err(DS4C_ETYPE, "hc_mixes: type %d, %d rows of %lld for %d tokens not taken", type, M, (long long)K,
                        n);
    cudaStream_t st = as_stream(stream);
    if (type == DS4C_F32)
        hm_go((const float *)d_fn, M, K, d_h, n, eps, d_mix, st);
    else
        hm_go((const __half *)d_fn, M, K, d_h, n, eps, d_mix, st);
    DS4C_CHECK_LAUNCH("hc_mixes");
    return 0;
}

} // extern "C"
