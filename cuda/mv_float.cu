// mv_float.cu: matrix-product kernels for F32, F16 and BF16 weights (see
// matvec.cuh).
#include "fexact.cuh"

namespace ds4mv {

// Fast-mode products of 16-bit weights and many tokens on the tensor cores
// (TF32 mma.sync m16n8k8, float32 accumulators). F16 and BF16 values convert
// to TF32 exactly (10 and 7 stored significand bits, TF32 keeps 10), so the
// weights enter unrounded; each float32 input x is split into hi + lo by
// tf32_split (common.cuh) and both are multiplied, which keeps ≈ 21 of its
// 24 significand bits. The products are
// exact in the accumulators; the sums run in the tensor cores' order, a few
// float32 ulps of Σ|w·x| from the exact order (TestFloatTensorCores).
//
// CTA: 4 warps, FTC_M rows × FTC_N tokens, the columns in steps of FTC_K
// staged in shared memory (weights as TF32 [row][k], inputs as (hi, lo)
// pairs [token][k], rows padded by 4 words: the fragment loads of a warp hit
// 32 different banks); warp w takes rows 32·(w&1) … +32 and tokens
// 32·(w>>1) … +32: 2 × 4 tiles of 16 × 8, 16 mma per 8 columns. The next
// step's loads wait in registers while the current step is multiplied.
constexpr int FTC_M = 64, FTC_N = 64, FTC_K = 32, FTC_LD = FTC_K + 4, FTC_T = 128;
constexpr int FTC_WV = FTC_M * FTC_K / 8 / FTC_T; // 16-byte weight loads (8 values) per thread per step
constexpr int FTC_XV = FTC_N * FTC_K / 4 / FTC_T; // float4 input loads per thread per step

template <int FT>
__global__ void __launch_bounds__(FTC_T) k_float_tc(MVArgs a, int nt) {
    mv_pdl_enter(a);
    __shared__ __align__(16) uint32_t s_w[FTC_M * FTC_LD];
    __shared__ __align__(16) uint2 s_x[FTC_N * FTC_LD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, sel = blockIdx.y;
    const int gid = lane >> 2, tig = lane & 3;
    const int row0 = blockIdx.x * FTC_M, tok0 = blockIdx.z * FTC_N;
    int64_t mat = a.sel_mat ? sel : 0;
    if (a.ids) mat = a.ids[sel];
    const bool mat_ok = mat >= 0 && mat < a.n_mat;
    const uint8_t *wbase = a.w + (size_t)(mat_ok ? mat : 0) * a.rows * a.cols * 2;
    const uint8_t *act = a.act + (sel / a.act_div) * a.act_sel;
    int4 wr[FTC_WV];
    float4 xr[FTC_XV];
    // weight load v: row id/4, columns 8·(id%4) …; input load v: token id/8, columns 4·(id%8) …
    auto load = [&](int k0) {
#pragma unroll
        for (int v = 0; v < FTC_WV; v++) {
            const int id = tid + v * FTC_T, r = id / (FTC_K / 8), c = k0 + 8 * (id % (FTC_K / 8));
            wr[v] = make_int4(0, 0, 0, 0);
            if (mat_ok && row0 + r < a.rows && c < a.cols)
                wr[v] = ldw16(wbase + ((size_t)(row0 + r) * a.cols + c) * 2, a.wl);
        }
#pragma unroll
        for (int v = 0; v < FTC_XV; v++) {
            const int id = tid + v * FTC_T, t = id / (FTC_K / 4), c = k0 + 4 * (id % (FTC_K / 4));
            xr[v] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (tok0 + t < nt && c < a.cols)
                xr[v] = __ldg((const float4 *)(act + (int64_t)(tok0 + t) * a.act_tok) + c / 4);
        }
    };
    auto store = [&]() {
#pragma unroll
        for (int v = 0; v < FTC_WV; v++) {
            const int id = tid + v * FTC_T, r = id / (FTC_K / 8), c = 8 * (id % (FTC_K / 8));
            float f[8];
            fx_unpack<FT>(wr[v], f);
            uint4 *d = (uint4 *)&s_w[r * FTC_LD + c];
            d[0] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
            d[1] = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]), __float_as_uint(f[7]));
        }
#pragma unroll
        for (int v = 0; v < FTC_XV; v++) {
            const int id = tid + v * FTC_T, t = id / (FTC_K / 4), c = 4 * (id % (FTC_K / 4));
            const float x[4] = {xr[v].x, xr[v].y, xr[v].z, xr[v].w};
            uint32_t hi[4], lo[4];
#pragma unroll
            for (int e = 0; e < 4; e++) tf32_split(x[e], hi[e], lo[e]);
            uint4 *d = (uint4 *)&s_x[t * FTC_LD + c];
            d[0] = make_uint4(hi[0], lo[0], hi[1], lo[1]);
            d[1] = make_uint4(hi[2], lo[2], hi[3], lo[3]);
        }
    };
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
    const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
    const int steps = (a.cols + FTC_K - 1) / FTC_K;
    load(0);
    store();
    __syncthreads();
    for (int s = 0; s < steps; s++) {
        if (s + 1 < steps) load((s + 1) * FTC_K);
#pragma unroll
        for (int kk = 0; kk < FTC_K; kk += 8) {
            uint32_t A[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const uint32_t *p = &s_w[(wm + 16 * i + gid) * FTC_LD + kk + tig];
                A[i][0] = p[0];
                A[i][1] = p[8 * FTC_LD];
                A[i][2] = p[4];
                A[i][3] = p[8 * FTC_LD + 4];
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint2 *q = &s_x[(wn + 8 * j + gid) * FTC_LD + kk + tig];
                const uint2 b0 = q[0], b1 = q[4];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mma_tf32(acc[i][j], A[i], b0.y, b1.y); // the small terms first
                    mma_tf32(acc[i][j], A[i], b0.x, b1.x);
                }
            }
        }
        __syncthreads();
        if (s + 1 < steps) {
            store();
            __syncthreads();
        }
    }
    // accumulator (i, j): c0, c1 at row gid, tokens 2·tig, 2·tig + 1; c2, c3 at row gid + 8
    const float nan = __int_as_float(0x7fc00000);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = row0 + wm + 16 * i + gid + 8 * (e >> 1), t = tok0 + wn + 8 * j + 2 * tig + (e & 1);
                if (r < a.rows && t < nt) a.y[sel * a.y_sel + (int64_t)t * a.y_tok + r] = mat_ok ? acc[i][j][e] : nan;
            }
}

// float_tc_ok reports whether a fast-mode product can take k_float_tc:
// 16-bit weights, 16 or more tokens, 16-byte rows and inputs, and enough
// tiles for half the SMs (the hc mixers' 24 rows × 2048 tokens make 32 CTAs
// that each walk all 16384 columns: 531 µs on the H200 against 159 for the
// exact tiled kernel, which launch_float then takes; option value 2 takes
// k_float_tc whatever the grid, for the tests).
static bool float_tc_ok(int type, const MVArgs &a, int n_sel, int nt) {
    const int64_t ctas = (a.rows + FTC_M - 1) / FTC_M * n_sel * ((nt + FTC_N - 1) / FTC_N);
    return (type == DS4C_F16 || type == DS4C_BF16) && nt >= 16 && ds4c_opt_float_tc() && fx_vec(a) &&
           a.rows <= INT32_MAX && n_sel <= 65535 && (nt + FTC_N - 1) / FTC_N <= 65535 &&
           (2 * ctas >= ds4c_sm_count() || ds4c_opt_float_tc() == 2);
}

template <int FT>
static int launch_float_tc(const MVArgs &a, int n_sel, int nt, cudaStream_t st) {
    const dim3 g((unsigned)((a.rows + FTC_M - 1) / FTC_M), (unsigned)n_sel, (unsigned)((nt + FTC_N - 1) / FTC_N));
    ds4c_launch(k_float_tc<FT>, g, FTC_T, 0, st, a, nt);
    DS4C_CHECK_LAUNCH("matmul (16-bit weights, tensor cores)");
    return 0;
}

// k_mv_f16_norm: fast mode's product of one token's float row x, after
// RMSNorm with weights nw, by a single F16 matrix (ds4c_matvec_f32 with F16
// weights: the indexer's query product from q_a's row, which otherwise
// waits for a k_rmsnorm_ref launch of its own). A warp a row, 8 rows a CTA;
// lane l holds halves 8 (l + 32 j) … + 7 of its row (NU 16-byte units),
// loaded before the wait for the previous kernel (weights are never written
// by it). After the wait every CTA takes the row's sum of squares in
// k_rmsnorm_ref's order (thread t adds values t, t + 256, …; block_sum_d)
// and each lane normalises its own values with that kernel's two roundings;
// then the lane's fmaf chain over its units in order and the warp's tree
// sum: k_matvec<TF16, 1, 1, 1>'s operations on ds4c_rmsnorm_ref's output
// (the launch that rows of 4224 and more get), so the same bits as the two
// launches there. wl: the weight-load flavour (ldw16); late: DS4C_MM_LATE.
template <int NU>
__global__ void __launch_bounds__(256) k_mv_f16_norm(const uint8_t *w, int rows, int cols, const float *x,
                                                     const float *nw, float eps, float *y, int wl, int late) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int row = blockIdx.x * 8 + warp;
    if (!late) pdl_launch();
    int4 wq[NU];
    if (row < rows) {
        const uint8_t *wr = w + (int64_t)row * cols * 2;
#pragma unroll
        for (int j = 0; j < NU; j++) wq[j] = ldw16(wr + 16 * (lane + 32 * j), wl);
    }
    pdl_wait();
    if (late) pdl_launch();
    double ss = 0;
    for (int i = tid; i < cols; i += 256) ss += (double)x[i] * (double)x[i];
    ss = block_sum_d(ss);
    const float r = rms_from_sumsq(ss, cols, eps);
    if (row >= rows) return;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < NU; j++) {
        const int c = 8 * (lane + 32 * j);
        float4 a = __ldg((const float4 *)(x + c)), b = __ldg((const float4 *)(x + c) + 1);
        const float4 wa = __ldg((const float4 *)(nw + c)), wb = __ldg((const float4 *)(nw + c) + 1);
        a = rms_scale4(wa, a, r);
        b = rms_scale4(wb, b, r);
        acc = fma8_half(wq[j], a, b, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

bool f16_norm_exact(const MVArgs &a, const float *xf, const float *nw, float eps, cudaStream_t st, int *rc) {
    *rc = 0;
    // (k_fexact_warp's shapes: at most two periods, rows enough for its CTAs)
    if (!nw || a.cols % 32 != 0 || a.cols > 2 * FX_PERIOD || a.rows < 16 || !ds4c_opt_fx_warp() ||
        (((uintptr_t)a.w | (uintptr_t)xf | (uintptr_t)nw) & 15) != 0)
        return false;
    MVArgs b = a;
    b.act = (const uint8_t *)xf;
    b.act_sel = 0;
    b.act_div = 1;
    b.nw = nw;
    b.eps = eps;
    if (a.cols <= FX_PERIOD)
        launch_fexact_warp<1, 1>(b, 1, st);
    else
        launch_fexact_warp<1, 2>(b, 1, st);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) *rc = ds4c_cuda_err(e, "matvec_f32 (F16, exact, normalised)");
    return true;
}

bool f16_norm(const MVArgs &a, const float *xf, const float *nw, float eps, cudaStream_t st, int *rc) {
    *rc = 0;
    if (!nw || a.rows > INT32_MAX - 8 || (((uintptr_t)a.w | (uintptr_t)xf | (uintptr_t)nw) & 15) != 0) return false;
    void (*k)(const uint8_t *, int, int, const float *, const float *, float, float *, int, int) = nullptr;
    switch (a.cols) { // (the units a lane holds in registers)
    case 1024: k = k_mv_f16_norm<4>; break;
    case 2048: k = k_mv_f16_norm<8>; break;
    case 4096: k = k_mv_f16_norm<16>; break;
    default: return false;
    }
    ds4c_launch(k, (unsigned)((a.rows + 7) / 8), 256, 0, st, a.w, (int)a.rows, (int)a.cols, xf, nw, eps, a.y, a.wl,
                a.late);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) *rc = ds4c_cuda_err(e, "matvec_f32 (F16, normalised)");
    return true;
}

int launch_float(int type, const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st) {
    if (exact) {
        switch (type) {
        case DS4C_F32: return launch_fexact<0>(a, n_sel, nt, st);
        case DS4C_F16: return launch_fexact<1>(a, n_sel, nt, st);
        case DS4C_BF16: return launch_fexact<2>(a, n_sel, nt, st);
        }
    }
    if (float_tc_ok(type, a, n_sel, nt)) return type == DS4C_F16 ? launch_float_tc<1>(a, n_sel, nt, st) : launch_float_tc<2>(a, n_sel, nt, st);
    if (nt >= FXT_T && type == DS4C_F16) return launch_fexact<1>(a, n_sel, nt, st); // the tiled kernel beats 8 tokens a launch
    if (nt >= FXT_T && type == DS4C_BF16) return launch_fexact<2>(a, n_sel, nt, st);
    switch (type) {
    case DS4C_F32: return launch_type<TF32>(a, n_sel, nt, false, st);
    case DS4C_F16: return launch_type<TF16>(a, n_sel, nt, false, st);
    case DS4C_BF16: return launch_type<TBF16>(a, n_sel, nt, false, st);
    }
    return ds4c_err(DS4C_ETYPE, "unsupported weight type %d", type);
}

} // namespace ds4mv
