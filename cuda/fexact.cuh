// fexact.cuh: exact float-weight products (F32, F16, BF16 weights with
// float32 inputs), bit-identical to ds4go/quant's float-weight order
// (quant/floatdot.go): product i, rounded, joins running sum (i/8) mod 256;
// the 256 sums are combined as a complete binary tree of adjacent pairs.
// Included by mv_float.cu only.
//
// k_fexact_rows gives running sum j to thread j of a 256-thread CTA (lane
// j%32 of warp j/32); k_fexact_warp gives lane l of a row's warp q the sums
// l + 32k of its groups k; k_fexact_tile gives lane l the sums 32g + l of
// its warp's outputs, group g after group. Either way a sum's 8 consecutive
// elements are one 16-byte load of F16/BF16 weights (two of F32 weights or
// of inputs), and the pair tree is a warp's xor-shuffle reduction (offsets
// 1, 2, …, 16 pair exactly the adjacent sums; a + b == b + a in IEEE
// arithmetic) followed by the 8 warp (or group) totals paired in shared
// memory. A product of k columns is a serial chain of k/256 additions per
// sum.
#pragma once

#include "matvec.cuh"

namespace ds4mv {

constexpr int FX_SUMS = 256, FX_RUN = 8, FX_PERIOD = FX_SUMS * FX_RUN; // 2048 columns per period

// fx_unpack: 16 bytes → 8 (F16/BF16) or 4 (F32) floats.
template <int FT>
__device__ __forceinline__ void fx_unpack(int4 v, float *out) {
    if (FT == 0) {
        out[0] = __int_as_float(v.x);
        out[1] = __int_as_float(v.y);
        out[2] = __int_as_float(v.z);
        out[3] = __int_as_float(v.w);
    } else {
        const uint32_t q[4] = {(uint32_t)v.x, (uint32_t)v.y, (uint32_t)v.z, (uint32_t)v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (FT == 1) {
                float2 f = __half22float2(*(const __half2 *)&q[k]);
                out[2 * k] = f.x;
                out[2 * k + 1] = f.y;
            } else {
                out[2 * k] = __uint_as_float(q[k] << 16);
                out[2 * k + 1] = __uint_as_float(q[k] & 0xffff0000u);
            }
        }
    }
}

template <int FT>
__device__ __forceinline__ float fx_scalar(const uint8_t *row, int c) {
    if (FT == 0) return ((const float *)row)[c];
    if (FT == 1) return __half2float(((const __half *)row)[c]);
    return __uint_as_float((uint32_t)((const uint16_t *)row)[c] << 16);
}

// fx_w8: weights c … c+7 of a row as floats, zero past cols (vec: the row
// allows 16-byte loads and cols % 8 == 0).
template <int FT>
__device__ __forceinline__ void fx_w8(const uint8_t *row, int c, int cols, bool vec, int wl, float *out) {
    if (vec) {
        if (c < cols) {
            if constexpr (FT == 0) {
                fx_unpack<0>(ldw16(row + (size_t)c * 4, wl), out);
                fx_unpack<0>(ldw16(row + (size_t)c * 4 + 16, wl), out + 4);
            } else {
                fx_unpack<FT>(ldw16(row + (size_t)c * 2, wl), out);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) out[e] = 0.f;
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; e++) out[e] = c + e < cols ? fx_scalar<FT>(row, c + e) : 0.f;
}

// fx_x8: inputs c … c+7 of a float32 row, zero past cols.
__device__ __forceinline__ void fx_x8(const uint8_t *xrow, int c, int cols, bool vec, float *out) {
    const float *x = (const float *)xrow;
    if (vec) {
        if (c < cols) {
            const float4 p = __ldg((const float4 *)(x + c)), q = __ldg((const float4 *)(x + c + 4));
            out[0] = p.x, out[1] = p.y, out[2] = p.z, out[3] = p.w;
            out[4] = q.x, out[5] = q.y, out[6] = q.z, out[7] = q.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) out[e] = 0.f;
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; e++) out[e] = c + e < cols ? __ldg(x + c + e) : 0.f;
}

// fx_vec reports whether a product's rows allow the 16-byte loads.
inline bool fx_vec(const MVArgs &a) {
    return a.cols % 8 == 0 && a.act_tok % 16 == 0 && a.act_sel % 16 == 0 && ((uintptr_t)a.act & 15) == 0 &&
           ((uintptr_t)a.w & 15) == 0;
}

// fx_tree8 pairs the 8 warp totals of one output: ((t0+t1)+(t2+t3))+((t4+t5)+(t6+t7)).
__device__ __forceinline__ float fx_tree8(const float *t, int stride) {
    return __fadd_rn(__fadd_rn(__fadd_rn(t[0], t[stride]), __fadd_rn(t[2 * stride], t[3 * stride])),
                     __fadd_rn(__fadd_rn(t[4 * stride], t[5 * stride]), __fadd_rn(t[6 * stride], t[7 * stride])));
}

// k_fexact_rows: one row × NT tokens per CTA (NT ≤ 8), the loads of U
// periods in flight before their products join the chains.
template <int FT, int NT, int U>
__global__ void __launch_bounds__(256) k_fexact_rows(MVArgs a, int vec) {
    mv_pdl_launch(a);
    if (threadIdx.x == 0 && !a.ids && a.pf && (a.sel_mat ? blockIdx.y : 0) < a.n_mat) {
        const size_t rb = (size_t)a.cols * (FT == 0 ? 4 : 2);
        prefetch_l2(a.w + ((size_t)(a.sel_mat ? blockIdx.y : 0) * a.rows + blockIdx.x) * rb, rb);
    }
    mv_pdl_wait(a);
    __shared__ float s_tot[8][NT];
    const int j = threadIdx.x, lane = j & 31, warp = j >> 5, sel = blockIdx.y;
    int64_t mat = a.sel_mat ? sel : 0;
    if (a.ids) mat = a.ids[sel];
    const bool mat_ok = mat >= 0 && mat < a.n_mat;
    const int64_t tz = (int64_t)blockIdx.z * NT;
    const uint8_t *act = a.act + (sel / a.act_div) * a.act_sel + tz * a.act_tok;
    const size_t esz = FT == 0 ? 4 : 2;
    const uint8_t *row = a.w + ((size_t)(mat_ok ? mat : 0) * a.rows + blockIdx.x) * a.cols * esz;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if (mat_ok) {
        for (int c0 = j * FX_RUN; c0 < a.cols; c0 += U * FX_PERIOD) {
            float w[U][8], x[U][NT][8];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * FX_PERIOD;
                fx_w8<FT>(row, c, a.cols, vec, a.wl, w[u]);
#pragma unroll
                for (int t = 0; t < NT; t++) fx_x8(act + t * a.act_tok, c, a.cols, vec, x[u][t]);
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[t] = __fadd_rn(acc[t], __fmul_rn(w[u][e], x[u][t][e]));
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = acc[t];
#pragma unroll
        for (int m = 1; m < 32; m <<= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, m));
        if (lane == 0) s_tot[warp][t] = v;
    }
    __syncthreads();
    if (j < NT)
        a.y[sel * a.y_sel + (tz + j) * a.y_tok + blockIdx.x] =
            mat_ok ? fx_tree8(&s_tot[0][j], NT) : __int_as_float(0x7fc00000);
}

// fx_reduce32: v[o] holds this lane's running sum of output o (32 outputs);
// the 32 lanes' sums of every output are pair-tree reduced with 31 shuffles
// (each level hands half of the outputs to the partner lane). The lane is
// left with the total of output brev5(lane) in v[0].
template <int LVL>
__device__ __forceinline__ void fx_reduce_level(float (&v)[32], int lane) {
    constexpr int m = 1 << LVL, half = 16 >> LVL;
    const bool hi = lane & m;
#pragma unroll
    for (int i = 0; i < half; i++) {
        const float send = hi ? v[i] : v[i + half];
        const float keep = hi ? v[i + half] : v[i];
        v[i] = __fadd_rn(keep, __shfl_xor_sync(FULL_MASK, send, m));
    }
}

__device__ __forceinline__ void fx_reduce32(float (&v)[32], int lane) {
    fx_reduce_level<0>(v, lane);
    fx_reduce_level<1>(v, lane);
    fx_reduce_level<2>(v, lane);
    fx_reduce_level<3>(v, lane);
    fx_reduce_level<4>(v, lane);
}

// k_fexact_tile: FXT_R rows × FXT_T tokens per CTA (many tokens). Sums are
// taken 32 at a time (a group: 256 columns of every period); each warp owns
// 4 rows × 8 tokens, lane l running sum 32g + l of its 32 outputs. The
// group's columns of the CTA's rows and tokens stream through shared memory
// (transposed, element e of sum l at [e][l]: conflict-free), the next
// stage's loads in flight; each group's 32 sums are reduced by shuffles and
// the 8 group totals paired at the end.
constexpr int FXT_R = 16, FXT_T = 16, FXT_G = FX_SUMS / 32;
constexpr int FXT_STAGE = (FXT_R + FXT_T) * FX_RUN * 32; // floats per stage

// The tiled kernels' shared pieces (256 threads; warp w owns rows
// rb = 4·(w & 3) … +3 and tokens tb = 8·(w >> 2) … +7 of the CTA's tile).
//
// fxt_load_x: this thread's 4 input quads of the stage whose first column
// is cb, as (token, sum, half) quads; zero past the tokens or columns.
__device__ __forceinline__ void fxt_load_x(const MVArgs &a, const uint8_t *act, int cb, int tok0, int nt, bool vec,
                                           float (&xr)[4][4]) {
#pragma unroll
    for (int v = 0; v < 4; v++) {
        const int id = threadIdx.x + v * 256;
        const int t = id / 64, q = id % 64, l = q % 32, h = q / 32;
        const int c = cb + l * FX_RUN + 4 * h;
        const float *x = (const float *)(act + (int64_t)(tok0 + t) * a.act_tok);
#pragma unroll
        for (int e = 0; e < 4; e++) xr[v][e] = 0.f;
        if (tok0 + t < nt) {
            if (vec) {
                if (c < a.cols) {
                    const float4 p = __ldg((const float4 *)(x + c));
                    xr[v][0] = p.x, xr[v][1] = p.y, xr[v][2] = p.z, xr[v][3] = p.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) xr[v][e] = c + e < a.cols ? __ldg(x + c + e) : 0.f;
            }
        }
    }
}

// fxt_store_x puts them in a stage's token part st, laid out [token][e][sum l].
__device__ __forceinline__ void fxt_store_x(float *st, const float (&xr)[4][4]) {
#pragma unroll
    for (int v = 0; v < 4; v++) {
        const int id = threadIdx.x + v * 256;
        const int t = id / 64, q = id % 64, l = q % 32, h = q / 32;
#pragma unroll
        for (int e = 0; e < 4; e++) st[(t * FX_RUN + 4 * h + e) * 32 + l] = xr[v][e];
    }
}

// fxt_mac adds element e of the lane's 4 rows (wq[r]: 8 16-bit weights,
// FT 1 f16, else bf16; half e of the 16 bytes, unpacked where used) times
// its 8 tokens' inputs x to the running sums acc[r·8 + t], each product
// rounded and then added: the tiled kernels' step.
template <int FT>
__device__ __forceinline__ void fxt_mac(float (&acc)[32], const int4 (&wq)[4], int e, const float (&x)[8]) {
    float w[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const uint32_t q = (uint32_t)(e < 4 ? (e < 2 ? wq[r].x : wq[r].y) : (e < 6 ? wq[r].z : wq[r].w));
        const uint32_t hv = (e & 1) ? q >> 16 : q & 0xffffu;
        w[r] = FT == 1 ? __half2float(__ushort_as_half((unsigned short)hv)) : __uint_as_float(hv << 16);
    }
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int t = 0; t < 8; t++) acc[r * 8 + t] = __fadd_rn(acc[r * 8 + t], __fmul_rn(w[r], x[t]));
}

// fxt_group_total reduces the warp's 32 running sums of each of its outputs
// (acc[r·8 + t]) to group g's totals in s_tot [FXT_G][FXT_R][FXT_T] and
// clears acc for the next group.
__device__ __forceinline__ void fxt_group_total(float (&acc)[32], float *s_tot, int g, int rb, int tb) {
    const int lane = threadIdx.x & 31;
    fx_reduce32(acc, lane);
    const int o = __brev(lane) >> 27; // the output lane holds
    s_tot[(g * FXT_R + rb + o / 8) * FXT_T + tb + o % 8] = acc[0];
#pragma unroll
    for (int o2 = 0; o2 < 32; o2++) acc[o2] = 0.f;
}

// fxt_finish pairs each output's group totals (groups past the last column
// total +0, as their sums do on the CPU) and stores the CTA's outputs (NaN
// for a matrix id out of range). Called after the last stage's barrier.
__device__ __forceinline__ void fxt_finish(const MVArgs &a, float *s_tot, int groups, int row0, int tok0, int nt,
                                           int sel, bool mat_ok) {
    const int tid = threadIdx.x;
    for (int i = groups * FXT_R * FXT_T + tid; i < FXT_G * FXT_R * FXT_T; i += 256) s_tot[i] = 0.f;
    __syncthreads();
    const int r = tid / FXT_T, t = tid % FXT_T;
    if (row0 + r < a.rows && tok0 + t < nt)
        a.y[sel * a.y_sel + (int64_t)(tok0 + t) * a.y_tok + row0 + r] =
            mat_ok ? fx_tree8(&s_tot[r * FXT_T + t], FXT_R * FXT_T) : __int_as_float(0x7fc00000);
}

// FxtCta is a tiled exact kernel's CTA (blockIdx x: its FXT_R rows, y:
// the selection, z: its FXT_T tokens): the selection's matrix (a.ids, or
// the selection itself with a.sel_mat) and whether it is inside the
// tensor, the selection's input rows, the matrix's first weight byte (esz
// bytes a weight; matrix 0 when outside, whose outputs are NaN), and a
// row's periods of FX_PERIOD columns.
struct FxtCta {
    int sel, row0, tok0, periods;
    bool mat_ok;
    const uint8_t *act, *wbase;
};

__device__ __forceinline__ FxtCta fxt_cta(const MVArgs &a, size_t esz) {
    FxtCta c;
    c.sel = blockIdx.y;
    c.row0 = blockIdx.x * FXT_R;
    c.tok0 = blockIdx.z * FXT_T;
    int64_t mat = a.sel_mat ? c.sel : 0;
    if (a.ids) mat = a.ids[c.sel];
    c.mat_ok = mat >= 0 && mat < a.n_mat;
    c.act = a.act + (c.sel / a.act_div) * a.act_sel;
    c.wbase = a.w + ((size_t)(c.mat_ok ? mat : 0) * a.rows) * a.cols * esz;
    c.periods = (a.cols + FX_PERIOD - 1) / FX_PERIOD;
    return c;
}

template <int FT>
__global__ void __launch_bounds__(256) k_fexact_tile(MVArgs a, int nt, int vec) {
    mv_pdl_enter(a);
    constexpr int WV = FT == 0 ? 4 : 2; // 16-byte weight loads per thread per stage
    extern __shared__ float s_ft[];
    float *s_tot = s_ft + 2 * FXT_STAGE; // [FXT_G][FXT_R][FXT_T]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t esz = FT == 0 ? 4 : 2;
    const FxtCta cta = fxt_cta(a, esz);
    const int sel = cta.sel, row0 = cta.row0, tok0 = cta.tok0, periods = cta.periods;
    const bool mat_ok = cta.mat_ok;
    const uint8_t *act = cta.act, *wbase = cta.wbase;
    const int groups = min(FXT_G, (a.cols + 32 * FX_RUN - 1) / (32 * FX_RUN)); // groups with any column
    const int steps = groups * periods;
    // Stage loads: weights as (row, sum) pairs of 8 values, inputs as
    // (token, sum, half) quads; thread → pair keeps a warp on one row.
    float wr[WV][8 / (FT == 0 ? 2 : 1)];
    float xr[4][4];
    auto load = [&](int s) {
        const int g = s / periods, k = s % periods;
        const int cb = k * FX_PERIOD + g * 32 * FX_RUN; // first column of the stage
#pragma unroll
        for (int v = 0; v < WV; v++) {
            const int id = tid + v * 256;
            if constexpr (FT == 0) { // 4 floats: (row, sum, half)
                const int r = id / 64, q = id % 64, l = q % 32, h = q / 32;
                const int c = cb + l * FX_RUN + 4 * h;
                const bool ok = mat_ok && row0 + r < a.rows;
                const uint8_t *rowp = wbase + (size_t)(row0 + r) * a.cols * esz;
#pragma unroll
                for (int e = 0; e < 4; e++) wr[v][e] = 0.f;
                if (ok) {
                    if (vec) {
                        if (c < a.cols) fx_unpack<0>(ldw16(rowp + (size_t)c * 4, a.wl), wr[v]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++) wr[v][e] = c + e < a.cols ? fx_scalar<0>(rowp, c + e) : 0.f;
                    }
                }
            } else { // 8 halves: (row, sum)
                const int r = id / 32, l = id % 32;
                const int c = cb + l * FX_RUN;
                if (mat_ok && row0 + r < a.rows)
                    fx_w8<FT>(wbase + (size_t)(row0 + r) * a.cols * esz, c, a.cols, vec, a.wl, wr[v]);
                else
#pragma unroll
                    for (int e = 0; e < 8; e++) wr[v][e] = 0.f;
            }
        }
        fxt_load_x(a, act, cb, tok0, nt, vec, xr);
    };
    // stage layout: [row or FXT_R + token][e][sum l]
    auto store = [&](int buf) {
        float *st = s_ft + buf * FXT_STAGE;
#pragma unroll
        for (int v = 0; v < WV; v++) {
            const int id = tid + v * 256;
            if constexpr (FT == 0) {
                const int r = id / 64, q = id % 64, l = q % 32, h = q / 32;
#pragma unroll
                for (int e = 0; e < 4; e++) st[(r * FX_RUN + 4 * h + e) * 32 + l] = wr[v][e];
            } else {
                const int r = id / 32, l = id % 32;
#pragma unroll
                for (int e = 0; e < 8; e++) st[(r * FX_RUN + e) * 32 + l] = wr[v][e];
            }
        }
        fxt_store_x(st + FXT_R * FX_RUN * 32, xr);
    };
    const int rb = 4 * (warp & 3), tb = 8 * (warp >> 2); // the warp's rows and tokens
    float acc[32];                                       // [row r][token t] = acc[r·8 + t]
#pragma unroll
    for (int o = 0; o < 32; o++) acc[o] = 0.f;
    if (steps > 0) {
        load(0);
        store(0);
    }
    __syncthreads();
    for (int s = 0; s < steps; s++) {
        const int cur = s & 1;
        if (s + 1 < steps) load(s + 1);
        const float *st = s_ft + cur * FXT_STAGE;
#pragma unroll
        for (int e = 0; e < FX_RUN; e++) {
            float w[4], x[8];
#pragma unroll
            for (int r = 0; r < 4; r++) w[r] = st[((rb + r) * FX_RUN + e) * 32 + lane];
#pragma unroll
            for (int t = 0; t < 8; t++) x[t] = st[((FXT_R + tb + t) * FX_RUN + e) * 32 + lane];
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int t = 0; t < 8; t++) acc[r * 8 + t] = __fadd_rn(acc[r * 8 + t], __fmul_rn(w[r], x[t]));
        }
        const bool group_done = (s + 1) % periods == 0;
        if (group_done) fxt_group_total(acc, s_tot, s / periods, rb, tb); // the group's 32 sums of each output
        if (s + 1 < steps) store(cur ^ 1);
        __syncthreads();
    }
    fxt_finish(a, s_tot, groups, row0, tok0, nt, sel, mat_ok);
}

// k_fexact_tile_wr: k_fexact_tile for 16-bit weights whose rows allow
// 16-byte loads, with each warp's weights in registers: lane l loads the 8
// weights of sum l of its warp's 4 rows straight from global memory (a
// stage ahead), so only the inputs go through shared memory. Per stage a
// CTA then writes 16 and reads 64 KB of shared memory instead of 32 and 96
// (k_fexact_tile was bound by shared-memory wavefronts: its loads and
// stores matched its arithmetic one for one; cuda/NOTES.md v11). Same
// sums, same order, same bits.
constexpr int FXW_STAGE = FXT_T * FX_RUN * 32; // floats per stage (inputs only)

template <int FT>
__global__ void __launch_bounds__(256, 2) k_fexact_tile_wr(MVArgs a, int nt) {
    static_assert(FT != 0, "16-bit weights");
    mv_pdl_enter(a);
    extern __shared__ float s_fw[];
    float *s_tot = s_fw + 2 * FXW_STAGE; // [FXT_G][FXT_R][FXT_T]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const FxtCta cta = fxt_cta(a, 2);
    const int sel = cta.sel, row0 = cta.row0, tok0 = cta.tok0, periods = cta.periods;
    const bool mat_ok = cta.mat_ok;
    const uint8_t *act = cta.act, *wbase = cta.wbase;
    const int groups = min(FXT_G, (a.cols + 32 * FX_RUN - 1) / (32 * FX_RUN));
    const int steps = groups * periods;
    const int rb = 4 * (warp & 3), tb = 8 * (warp >> 2); // the warp's rows and tokens
    // the warp's rows rb … rb+3 from w0, rowb bytes apart; nrow of them inside the matrix
    const int nrow = mat_ok ? max(0, min(4, (int)(a.rows - row0 - rb))) : 0;
    const size_t rowb = (size_t)a.cols * 2;
    const uint8_t *w0 = wbase + (size_t)(nrow > 0 ? row0 + rb : 0) * rowb;
    int4 wq[4], wn[4]; // this stage's and the next stage's weights (8 halves a row)
    float xr[4][4];
    auto load = [&](int s, int4 (&w)[4]) {
        const int g = s / periods, k = s % periods;
        const int cb = k * FX_PERIOD + g * 32 * FX_RUN; // first column of the stage
        const int c = cb + lane * FX_RUN;
#pragma unroll
        for (int r = 0; r < 4; r++) w[r] = r < nrow && c < a.cols ? ldw16(w0 + r * rowb + (size_t)c * 2, a.wl) : make_int4(0, 0, 0, 0);
        fxt_load_x(a, act, cb, tok0, nt, true, xr);
    };
    auto store = [&](int buf) { fxt_store_x(s_fw + buf * FXW_STAGE, xr); };
    float acc[32]; // [row r][token t] = acc[r·8 + t]
#pragma unroll
    for (int o = 0; o < 32; o++) acc[o] = 0.f;
    if (steps > 0) {
        load(0, wq);
        store(0);
    }
    __syncthreads();
    for (int s = 0; s < steps; s++) {
        const int cur = s & 1;
        if (s + 1 < steps) load(s + 1, wn);
        const float *st = s_fw + cur * FXW_STAGE;
#pragma unroll
        for (int e = 0; e < FX_RUN; e++) {
            float x[8];
#pragma unroll
            for (int t = 0; t < 8; t++) x[t] = st[((tb + t) * FX_RUN + e) * 32 + lane];
            fxt_mac<FT>(acc, wq, e, x);
        }
        if ((s + 1) % periods == 0) fxt_group_total(acc, s_tot, s / periods, rb, tb);
        if (s + 1 < steps) {
            store(cur ^ 1);
#pragma unroll
            for (int r = 0; r < 4; r++) wq[r] = wn[r];
        }
        __syncthreads();
    }
    fxt_finish(a, s_tot, groups, row0, tok0, nt, sel, mat_ok);
}

// k_fexact_tile_wv: k_fexact_tile_wr for matrices whose every stage is
// whole (fxv_whole: the columns a multiple of the 2048-column period, or
// fewer than one period and a multiple of 256), with the staged inputs
// laid out so that a lane reads its 8 tokens' inputs of element e with two
// 16-byte loads instead of eight 4-byte ones: [e][sum l][token], FXV_LD
// floats a sum (16 tokens and 4 of padding) and FXV_PS a plane. Each thread
// loads the same 4 columns of 4 tokens (a token quad) and stores them as 4
// 16-byte rows, one an element. The padding makes both conflict-free (a
// quarter-warp's 16-byte addresses fall in 8 different bank groups: lane
// l's row starts 5l slots on, plane e's 161e). With the stages whole, the
// column checks and the load flavour's branches are gone, and rows and
// tokens past the product load clamped ones. Same sums, same order, same bits
// (cuda/NOTES.md v60: k_fexact_tile_wr spent ≈ 40 % of its instructions
// outside the products).
constexpr int FXV_LD = FXT_T + 4, FXV_PS = 32 * FXV_LD + 4, FXV_STAGE = FX_RUN * FXV_PS;
static_assert(FXT_T == 16, "four token quads a stage");

inline bool fxv_whole(const MVArgs &a) {
    return a.cols > 0 && (a.cols % FX_PERIOD == 0 || (a.cols < FX_PERIOD && a.cols % (32 * FX_RUN) == 0));
}

template <int FT>
__global__ void __launch_bounds__(256, 2) k_fexact_tile_wv(MVArgs a, int nt) {
    static_assert(FT != 0, "16-bit weights");
    mv_pdl_enter(a);
    extern __shared__ __align__(16) float s_fv[];
    float *s_tot = s_fv + 2 * FXV_STAGE; // [FXT_G][FXT_R][FXT_T]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const FxtCta cta = fxt_cta(a, 2);
    const int sel = cta.sel, row0 = cta.row0, tok0 = cta.tok0, periods = cta.periods;
    const bool mat_ok = cta.mat_ok;
    const uint8_t *act = cta.act, *wbase = cta.wbase;
    const int groups = min(FXT_G, a.cols / (32 * FX_RUN));
    const int steps = groups * periods;
    const int rb = 4 * (warp & 3), tb = 8 * (warp >> 2); // the warp's rows and tokens
    // Rows and tokens past the product load a row or token inside it
    // instead (their sums are never stored, and each output's sum stays
    // its own through the reductions), so the loads need no predicate.
    const size_t rowb = (size_t)a.cols * 2;
    const int wrow = mat_ok ? (int)min((int64_t)row0 + rb, (int64_t)a.rows - 1) : 0; // the warp's first row, clamped
    const int wlast = mat_ok ? (int)a.rows - 1 : 0;
    const uint8_t *wr[4];
#pragma unroll
    for (int r = 0; r < 4; r++) wr[r] = wbase + (size_t)min(wrow + r, wlast) * rowb + (size_t)lane * FX_RUN * 2;
    // this thread's input loads: token quad tq, sum xl, half xh (columns 8·xl + 4·xh … +3 of a stage)
    const int tq = tid >> 6, xl = (tid >> 1) & 31, xh = tid & 1;
    const float *xs[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        xs[i] = (const float *)(act + (int64_t)min(tok0 + 4 * tq + i, nt - 1) * a.act_tok) + FX_RUN * xl + 4 * xh;
    int4 wq[4], wn[4]; // this stage's and the next stage's weights (8 halves a row)
    float4 xr[4];      // the quad's 4 tokens' inputs
    int lg = 0, lk = 0; // the group and period of the next stage to load
    auto load = [&](int4 (&w)[4]) {
        const int cb = lk * FX_PERIOD + lg * 32 * FX_RUN; // first column of the stage
        if (++lk == periods) lk = 0, lg++;
#pragma unroll
        for (int r = 0; r < 4; r++) w[r] = __ldg((const int4 *)(wr[r] + (size_t)cb * 2));
#pragma unroll
        for (int i = 0; i < 4; i++) xr[i] = __ldg((const float4 *)(xs[i] + cb));
    };
    auto store = [&](int buf) {
        float *st = s_fv + buf * FXV_STAGE + (4 * xh) * FXV_PS + xl * FXV_LD + 4 * tq;
        *(float4 *)(st + 0 * FXV_PS) = make_float4(xr[0].x, xr[1].x, xr[2].x, xr[3].x);
        *(float4 *)(st + 1 * FXV_PS) = make_float4(xr[0].y, xr[1].y, xr[2].y, xr[3].y);
        *(float4 *)(st + 2 * FXV_PS) = make_float4(xr[0].z, xr[1].z, xr[2].z, xr[3].z);
        *(float4 *)(st + 3 * FXV_PS) = make_float4(xr[0].w, xr[1].w, xr[2].w, xr[3].w);
    };
    float acc[32]; // [row r][token t] = acc[r·8 + t]
#pragma unroll
    for (int o = 0; o < 32; o++) acc[o] = 0.f;
    if (steps > 0) {
        load(wq);
        store(0);
    }
    __syncthreads();
    int cg = 0, ck = 0; // the current stage's group and period
    for (int s = 0; s < steps; s++) {
        const int cur = s & 1;
        if (s + 1 < steps) load(wn);
        const float *st = s_fv + cur * FXV_STAGE + lane * FXV_LD + tb;
#pragma unroll
        for (int e = 0; e < FX_RUN; e++) {
            const float4 xa = *(const float4 *)(st + e * FXV_PS), xb = *(const float4 *)(st + e * FXV_PS + 4);
            const float x[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            fxt_mac<FT>(acc, wq, e, x);
        }
        if (++ck == periods) { // the group's 32 sums of each output
            fxt_group_total(acc, s_tot, cg, rb, tb);
            ck = 0;
            cg++;
        }
        if (s + 1 < steps) {
            store(cur ^ 1);
#pragma unroll
            for (int r = 0; r < 4; r++) wq[r] = wn[r];
        }
        __syncthreads();
    }
    fxt_finish(a, s_tot, groups, row0, tok0, nt, sel, mat_ok);
}

// k_fexact_warp: single token, 16-bit weights, rows of at most P periods
// (P·2048 columns), no ids; a row per 8/G warps, G rows per CTA. Warp q of
// a row runs the sum groups qG … qG+G−1, lane l of group k running sum
// l + 32k: group k is what warp k of k_fexact_rows holds, so each group's
// xor-shuffle reduction and the pairing of the 8 group totals are that
// kernel's, and the result the same bits. The weights are loaded before
// waiting for the previous kernel (they are not its output); the input row
// is staged in shared memory once per CTA. Made for the compressors' and
// the router's products: a few hundred short rows, which k_fexact_rows ran
// as one small CTA each. With a.nw (ds4c_matvec_f32 in exact mode: the
// indexer's query product from q_a's row) the CTA stages the row after its
// RMSNorm: the float64 sum of squares in k_rmsnorm_ref's order (thread t
// adds values t, t + 256, …; block_sum_d over the 256 threads), then w ·
// (x · r) with that kernel's two roundings — its output, without its
// launch.
// LIVE < G (G 8, one period: rows of at most 256·LIVE columns, the
// indexer's query product's 1024): only the warp's first LIVE groups hold
// columns; the others' totals are +0 (sums of no products, and +0 through
// the xor-shuffle tree), written without their registers, loads and
// shuffles — the same bits.
// NT = 2 (exact mode's products of two tokens, DS4C_OPT_MV_TWO's bit 2;
// NT = 3, 4 likewise, deeper drafts' verification passes): each weight
// loaded once, every token's row staged (a.act_tok bytes apart
// in a.act, a.cols floats apart in shared memory; with a.nw each after its
// own norm), token t's sums and tree its one-token launch's, its outputs
// a.y_tok floats after token 0's.
// a.xbatch (DS4C_OPT_FX_LIVE's bit 2): a token's row requested XB float4s
// a thread at once, then staged — the loop before waited for each float4's
// round trip to L2 in turn (P·2 a thread a token); the same values
// staged. (By nvcc 11.8, a token's whole row at once took up to 68
// registers against 40 for P = 2, every token's rows at once up to 158
// against 106 for NT = 4.) XN (DS4C_OPT_FX_LIVE's bit 4; one token, with
// a.nw): the sum of squares' values 4 a thread at once, then added in the
// same order, and the scaling's rows XB at once: the same values staged,
// in a form of its own (the indexer's query product: 48 registers against
// 40, 5 CTAs an SM against 6). a.xbatch 2 (DS4C_OPT_FX_LIVE's bit 8, v76;
// NT ≥ 2, without a.nw): every token's row copied into shared memory by
// cp.async, all of a thread's copies in flight together (one round trip to
// L2 where a.xbatch 1 waits for cols / 2048 of them a token: 8 for a
// four-token pass's 4096-column rows); the same values staged. (One token
// measured −0.46 % in exact decode with this form, v76: not used there.)
template <int FT, int P, int G, int LIVE = G, int NT = 1, bool XN = false>
__global__ void __launch_bounds__(256) k_fexact_warp(MVArgs a) {
    static_assert(FT != 0, "16-bit weights");
    static_assert(NT >= 1 && NT <= 4, "one to four tokens");
    static_assert(G == 2 || G == 4 || G == 8, "groups per warp");
    static_assert(LIVE == G || (G == 8 && P == 1 && LIVE > 0 && LIVE < G), "live groups: one period, a warp a row");
    constexpr int WPR = 8 / G; // warps per row
    constexpr int XB = 2; // float4s a thread requested at once (a.xbatch; 4 floats for a.nw's sum of squares)
    extern __shared__ float4 s_x4[]; // the input rows, a.cols floats each
    __shared__ float s_tot[NT][G][8];
    mv_pdl_launch(a);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sel = blockIdx.y;
    const int rl = warp / WPR, q = warp % WPR;
    const int64_t mat = a.sel_mat ? sel : 0;
    const bool mat_ok = mat < a.n_mat;
    const int64_t r = (int64_t)blockIdx.x * G + rl;
    const bool row_ok = mat_ok && r < a.rows;
    const uint8_t *row = a.w + ((size_t)(mat_ok ? mat : 0) * a.rows + (row_ok ? r : 0)) * a.cols * 2;
    int4 w[P][LIVE];
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int k = 0; k < LIVE; k++) {
            const int c = p * FX_PERIOD + (lane + 32 * (q * G + k)) * FX_RUN;
            w[p][k] = row_ok && c < a.cols ? ldw16(row + (size_t)c * 2, a.wl) : make_int4(0, 0, 0, 0);
        }
    mv_pdl_wait(a);
    if (NT > 1 && a.xbatch == 2) { // every token's row copied at once (cp.async; without a.nw)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *x4 = (const float4 *)(a.act + (sel / a.act_div) * a.act_sel + t * a.act_tok);
            float4 *sx4 = s_x4 + t * (a.cols / 4);
            for (int i = threadIdx.x; i < a.cols / 4; i += 256) cp_async16(sx4 + i, x4 + i);
        }
        cp_async_commit();
        cp_async_wait<0>();
    } else {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *x4 = (const float4 *)(a.act + (sel / a.act_div) * a.act_sel + t * a.act_tok);
            float4 *sx4 = s_x4 + t * (a.cols / 4);
            if (XN && a.nw) { // the same, the loads a few a thread at once (one token: ds4c_matvec_f32's fused norm)
                const float *xf = (const float *)x4;
                double ss = 0;
                for (int i0 = threadIdx.x; i0 < a.cols; i0 += 4 * 256) {
                    float xv[4];
#pragma unroll
                    for (int u = 0; u < 4; u++) xv[u] = i0 + u * 256 < a.cols ? xf[i0 + u * 256] : 0.f;
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        if (i0 + u * 256 < a.cols) ss += (double)xv[u] * (double)xv[u];
                }
                ss = block_sum_d(ss);
                const float r = rms_from_sumsq(ss, a.cols, a.eps);
                for (int i0 = threadIdx.x; i0 < a.cols / 4; i0 += XB * 256) {
                    float4 v[XB], wn[XB];
#pragma unroll
                    for (int u = 0; u < XB; u++)
                        if (i0 + u * 256 < a.cols / 4) v[u] = __ldg(x4 + i0 + u * 256), wn[u] = __ldg((const float4 *)a.nw + i0 + u * 256);
#pragma unroll
                    for (int u = 0; u < XB; u++)
                        if (i0 + u * 256 < a.cols / 4) sx4[i0 + u * 256] = rms_scale4(wn[u], v[u], r);
                }
            } else if (a.nw) {
                const float *xf = (const float *)x4;
                double ss = 0;
                for (int i = threadIdx.x; i < a.cols; i += blockDim.x) ss += (double)xf[i] * (double)xf[i];
                ss = block_sum_d(ss);
                const float r = rms_from_sumsq(ss, a.cols, a.eps);
                for (int i = threadIdx.x; i < a.cols / 4; i += blockDim.x)
                    sx4[i] = rms_scale4(__ldg((const float4 *)a.nw + i), __ldg(x4 + i), r);
            } else if (a.xbatch) { // the row's float4s XB at once, then staged
                for (int i0 = threadIdx.x; i0 < a.cols / 4; i0 += XB * 256) {
                    float4 v[XB];
#pragma unroll
                    for (int u = 0; u < XB; u++)
                        if (i0 + u * 256 < a.cols / 4) v[u] = __ldg(x4 + i0 + u * 256);
#pragma unroll
                    for (int u = 0; u < XB; u++)
                        if (i0 + u * 256 < a.cols / 4) sx4[i0 + u * 256] = v[u];
                }
            } else {
                for (int i = threadIdx.x; i < a.cols / 4; i += blockDim.x) sx4[i] = __ldg(x4 + i);
            }
        }
    }
    __syncthreads();
    float acc[NT][LIVE];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int k = 0; k < LIVE; k++) acc[t][k] = 0.f;
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int k = 0; k < LIVE; k++) {
            const int c = p * FX_PERIOD + (lane + 32 * (q * G + k)) * FX_RUN;
            if (c >= a.cols) continue;
            float wf[8];
            fx_unpack<FT>(w[p][k], wf);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float *sx = (const float *)s_x4 + t * a.cols;
                const float4 xa = *(const float4 *)(sx + c), xb = *(const float4 *)(sx + c + 4);
                const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (int e = 0; e < 8; e++) acc[t][k] = __fadd_rn(acc[t][k], __fmul_rn(wf[e], xv[e]));
            }
        }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int k = 0; k < LIVE; k++) {
            float v = acc[t][k];
#pragma unroll
            for (int m = 1; m < 32; m <<= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, m));
            if (lane == 0) s_tot[t][rl][q * G + k] = v;
        }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int k = LIVE; k < G; k++)
            if (lane == 0) s_tot[t][rl][q * G + k] = 0.f;
    __syncthreads();
    if constexpr (NT == 1) {
        const int64_t ro = (int64_t)blockIdx.x * G + threadIdx.x;
        if (threadIdx.x < G && ro < a.rows)
            a.y[sel * a.y_sel + ro] = mat_ok ? fx_tree8(s_tot[0][threadIdx.x], 1) : __int_as_float(0x7fc00000);
    } else {
        const int t = threadIdx.x / G;
        const int64_t ro = (int64_t)blockIdx.x * G + threadIdx.x % G;
        if (threadIdx.x < NT * G && ro < a.rows)
            a.y[sel * a.y_sel + t * a.y_tok + ro] =
                mat_ok ? fx_tree8(s_tot[t][threadIdx.x % G], 1) : __int_as_float(0x7fc00000);
    }
}

template <int FT, int P, int NT = 1>
void launch_fexact_warp(MVArgs a, int n_sel, cudaStream_t st) {
    const int live = ds4c_opt_fx_live(); // (its bits: fexact_warp's forms)
    a.xbatch = NT > 1 && (live & 8) && !a.nw ? 2 : (live & 2) != 0;
    const size_t smem = (size_t)NT * a.cols * sizeof(float);
    const int64_t sms = ds4c_sm_count();
    int G = 8; // fewer rows per CTA until the grid covers the SMs twice
    while (G > 2 && (a.rows + G - 1) / G * n_sel < 2 * sms) G /= 2;
    const dim3 g((unsigned)((a.rows + G - 1) / G), (unsigned)n_sel, 1);
    // the form: G rows a CTA (G 8, one period of at most 1024 columns: the
    // first four groups hold the columns)
    const int form = G == 8 && P == 1 && a.cols <= 4 * 256 && (live & 1) ? 0 : G == 8 ? 1 : G == 4 ? 2 : 3;
    constexpr bool XN = NT == 1; // (the batched norm's forms: one token)
    const bool xn = XN && a.nw && (live & 4);
    void (*k)(MVArgs) = form == 0   ? (xn ? k_fexact_warp<FT, 1, 8, 4, NT, XN> : k_fexact_warp<FT, 1, 8, 4, NT>)
                        : form == 1 ? (xn ? k_fexact_warp<FT, P, 8, 8, NT, XN> : k_fexact_warp<FT, P, 8, 8, NT>)
                        : form == 2 ? (xn ? k_fexact_warp<FT, P, 4, 4, NT, XN> : k_fexact_warp<FT, P, 4, 4, NT>)
                                    : (xn ? k_fexact_warp<FT, P, 2, 2, NT, XN> : k_fexact_warp<FT, P, 2, 2, NT>);
    if (smem + sizeof(float) * NT * 8 * 8 > 48 * 1024) { // (three rows of 4096 floats and more, with s_tot: the opt-in, once for each form)
        static bool set[8] = {};
        if (!set[form + 4 * xn]) {
            (void)cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            set[form + 4 * xn] = true;
        }
    }
    ds4c_launch(k, g, 256, smem, st, a);
}

template <int FT, int NT>
int launch_fexact_rows(const MVArgs &a, int n_sel, int vec, cudaStream_t st, int pieces = 1) {
    dim3 g((unsigned)a.rows, (unsigned)n_sel, (unsigned)pieces);
    const int periods = (a.cols + FX_PERIOD - 1) / FX_PERIOD;
    // k_fexact_warp's shapes (rows of at most two periods, rows enough for
    // its CTAs): one token, or two to four (exact mode's verification
    // passes, DS4C_OPT_MV_TWO's bit 2: every token's row staged, the weights
    // loaded once; four rows of at most 4096 floats: 64 KB of shared memory)
    if constexpr (NT <= 4) {
        if (FT != 0 && vec && !a.ids && periods <= 2 && a.rows >= 16 && ds4c_opt_fx_warp() &&
            (NT == 1 || (ds4c_opt_mv_two() & 2))) {
            // (FT is 1 or 2 here; the conditional keeps <0> uninstantiated)
            if (periods == 1)
                launch_fexact_warp<FT == 0 ? 1 : FT, 1, NT>(a, n_sel, st);
            else
                launch_fexact_warp<FT == 0 ? 1 : FT, 2, NT>(a, n_sel, st);
            return 0;
        }
    }
    if constexpr (NT == 1) {
        // periods of 2048 columns in flight per thread: all of a row's
        // (hc_fn: 8) up to 8, so that a short grid waits for one round of loads
        if (periods > 4)
            ds4c_launch(k_fexact_rows<FT, 1, 8>, g, 256, 0, st, a, vec);
        else if (periods > 2)
            ds4c_launch(k_fexact_rows<FT, 1, 4>, g, 256, 0, st, a, vec);
        else
            ds4c_launch(k_fexact_rows<FT, 1, 2>, g, 256, 0, st, a, vec);
    } else {
        constexpr int U = NT <= 2 ? 2 : 1;
        ds4c_launch(k_fexact_rows<FT, NT, U>, g, 256, 0, st, a, vec);
    }
    return 0;
}

template <int FT>
int launch_fexact(const MVArgs &a, int n_sel, int nt, cudaStream_t st) {
    if (a.rows > INT32_MAX || n_sel > 65535) return ds4c_err(DS4C_EINVAL, "float product of %lld rows × %d selections", (long long)a.rows, n_sel);
    const int vec = fx_vec(a) ? 1 : 0;
    if (nt >= FXT_T) { // FXT_R rows × FXT_T tokens per CTA
        const size_t smem = (size_t)(2 * FXT_STAGE + FXT_G * FXT_R * FXT_T) * sizeof(float);
        static bool set = false;
        if (!set) {
            cudaError_t e = cudaFuncSetAttribute(k_fexact_tile<FT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return ds4c_cuda_err(e, "matmul (float, exact, tiled) shared memory");
            set = true;
        }
        dim3 g((unsigned)((a.rows + FXT_R - 1) / FXT_R), (unsigned)n_sel, (unsigned)((nt + FXT_T - 1) / FXT_T));
        if (g.z > 65535) return ds4c_err(DS4C_EINVAL, "too many tokens (%d)", nt);
        if constexpr (FT != 0) {
            if (vec && ds4c_opt_fx_wreg() == 2 && fxv_whole(a)) {
                const size_t vsmem = (size_t)(2 * FXV_STAGE + FXT_G * FXT_R * FXT_T) * sizeof(float); // 48.25 KB
                static bool vset = false;
                if (!vset) {
                    cudaError_t e = cudaFuncSetAttribute(k_fexact_tile_wv<FT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)vsmem);
                    if (e != cudaSuccess) return ds4c_cuda_err(e, "matmul (float, exact, tiled, whole stages) shared memory");
                    vset = true;
                }
                ds4c_launch(k_fexact_tile_wv<FT>, g, 256, vsmem, st, a, nt);
                DS4C_CHECK_LAUNCH("matmul (float, exact, tiled, whole stages)");
                return 0;
            }
            if (vec && ds4c_opt_fx_wreg()) {
                const size_t wsmem = (size_t)(2 * FXW_STAGE + FXT_G * FXT_R * FXT_T) * sizeof(float); // 40 KB
                ds4c_launch(k_fexact_tile_wr<FT>, g, 256, wsmem, st, a, nt);
                DS4C_CHECK_LAUNCH("matmul (float, exact, tiled, weights in registers)");
                return 0;
            }
        }
        ds4c_launch(k_fexact_tile<FT>, g, 256, smem, st, a, nt, vec);
        DS4C_CHECK_LAUNCH("matmul (float, exact, tiled)");
        return 0;
    }
    const int rc = for_pieces(
        a, nt, [&](const MVArgs &b, auto k) { return launch_fexact_rows<FT, decltype(k)::value>(b, n_sel, vec, st); });
    if (rc) return rc;
    DS4C_CHECK_LAUNCH("matvec (float, exact)");
    return 0;
}

} // namespace ds4mv
