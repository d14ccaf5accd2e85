// matvec.cuh: the matrix-vector / small-batch matrix-product kernels of
// libds4cuda.so, as templates; mv_*.cu instantiate them per weight type
// (separate files so that nvcc builds them in parallel) and matvec.cu holds
// the C entry points, weight repacking and activation quantization.
//
// Numerics. Each product consumes the activation format that ds4go/quant
// pairs with the weight type (Q8_0 activations for Q8_0 weights, Q8_K for
// Q2_K/Q4_K/IQ2_XXS, float32 for F16/F32), quantized on the device
// bit-exactly like quant.Activation.Set. Per quant block the integer sums are
// exact and the float scaling of a block is computed with the same
// operations, in the same order, as quant.Dot (explicitly rounded __fmul_rn /
// __fsub_rn, so nvcc cannot contract them into FMAs). Only the order in which
// the per-block terms of a row are added differs from the CPU (per lane, then
// a warp tree, then across warps), so a GPU dot differs from quant.Dot by a
// few float32 ulps of the sum of the terms' magnitudes; exact mode adds
// them in block order instead (bit-identical). F16/F32 rows here are plain
// float32 FMA dot products (fast mode); exact float products are in
// fexact.cuh.
//
// Work split. One row is owned by a team of S warps (S = 1, 2, 4 or 8; more
// when there are too few rows to fill the GPU); a CTA is 256 threads, so it
// owns 8/S rows. A row is cut into 16-byte "units" of weight quants, dealt
// round-robin to the team's threads; the U units of one quant block sit in U
// adjacent lanes, which combine their integer sums with shuffles before the
// block's float term is formed. Each thread first issues the loads of CH
// units, then computes, so several 16-byte loads are in flight per thread.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "iq2xxs_grid.inc"

namespace ds4mv {

constexpr int CH = 4; // units loaded per thread before computing

// has_reg<T>: whether weight type T has k_mv_dec's register form (T::Reg).
template <class T, class = void>
struct has_reg : std::false_type {};
template <class T>
struct has_reg<T, std::void_t<typename T::Reg>> : std::true_type {};

struct MVArgs {
    const uint8_t *w; // weight tensor (device layout)
    int64_t R;        // rows of the whole tensor (n_mat * rows)
    int rows;         // rows of one matrix
    int cols;
    int64_t n_mat;
    const int32_t *ids; // selected matrices, or null (matrix 0)
    const uint8_t *act;
    int64_t act_tok; // bytes between tokens
    int64_t act_sel; // bytes between selections
    float *y;
    int64_t y_tok; // floats between tokens
    int64_t y_sel; // floats between selections
    int wl;        // weight load flavour
    int pf;        // prefetch the weights into L2 before the wait (prefetch_l2)
    int act_div;   // selection s reads activation s / act_div
    int sel_mat;   // without ids: selection s uses matrix s (else matrix 0)
    int late;      // DS4C_MM_LATE: dependents launch only after this product's wait (mv_pdl_wait)
    // the pair (ds4c_matmul_grouped_pair; k_mv_dec, and k_matvec for one
    // selection): a second tensor of the same shape and ids, its outputs at
    // y2; null otherwise
    const uint8_t *w2;
    float *y2;
    // k_mv_dec only: the activation formed by the CTAs themselves after
    // their wait, in shared memory, instead of read from act (null
    // otherwise): selection s's is the Q8_K row (act_sel bytes) of
    // SwiGLU(glu_g[s], glu_u[s]) (rows of cols floats, glu_stride apart;
    // swiglu_as with glu_lim and the weights glu_w), the bytes
    // k_swiglu_q8k writes (ds4c_matmul_grouped_swiglu).
    const float *glu_g, *glu_u, *glu_w;
    int64_t glu_stride;
    float glu_lim;
    int glu_fast; // swiglu_as's fast form (DS4C_SWIGLU_FAST)
    // k_fexact_warp (ds4c_matvec_f32, exact F16 weights): act is the float
    // row before its RMSNorm with weights nw, which each CTA applies while
    // it stages the row (k_rmsnorm_ref's operations); null: act as it is
    const float *nw;
    float eps;
    int xbatch; // k_fexact_warp's staging: 1 without nw a row's float4s requested two a thread at once, then staged (DS4C_OPT_FX_LIVE bit 2); 2 (2-4 tokens, without nw) every token's row copied at once by cp.async (bit 8)
};

// The programmatic-launch halves of a product kernel (pdl_launch,
// pdl_wait): by default its dependents may launch at once; with a.late
// (DS4C_MM_LATE) only after its own wait, i.e. once everything before the
// product is complete, so that the next kernel may read the product's
// inputs before its own wait (hc_pre reads the streams early).
__device__ __forceinline__ void mv_pdl_launch(const MVArgs &a) {
    if (!a.late) pdl_launch();
}
__device__ __forceinline__ void mv_pdl_wait(const MVArgs &a) {
    pdl_wait();
    if (a.late) pdl_launch();
}
__device__ __forceinline__ void mv_pdl_enter(const MVArgs &a) {
    mv_pdl_launch(a);
    mv_pdl_wait(a);
}

// mv_args gathers a product's arguments (ds4c_matmul_ex's, in its terms)
// into MVArgs; the weight-load flavour is the current option.
inline MVArgs mv_args(const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, const int32_t *d_ids, bool sel_mat,
                      const void *d_act, int64_t act_tok, int64_t act_sel, int act_div, float *d_y, int64_t y_tok,
                      int64_t y_sel) {
    MVArgs a;
    a.w = (const uint8_t *)d_w;
    a.R = rows * n_mat;
    a.rows = (int)rows;
    a.cols = (int)cols;
    a.n_mat = n_mat;
    a.ids = d_ids;
    a.act = (const uint8_t *)d_act;
    a.act_tok = act_tok;
    a.act_sel = act_sel;
    a.y = d_y;
    a.y_tok = y_tok;
    a.y_sel = y_sel;
    a.wl = ds4c_opt_wload();
    a.pf = ds4c_opt_prefetch();
    a.act_div = act_div;
    a.sel_mat = sel_mat;
    a.late = 0;
    a.w2 = nullptr;
    a.y2 = nullptr;
    a.glu_g = a.glu_u = a.glu_w = nullptr;
    a.glu_stride = 0;
    a.glu_lim = 0.f;
    a.glu_fast = 0;
    a.nw = nullptr;
    a.eps = 0.f;
    return a;
}

// ldact16 loads 16 activation bytes: from global memory through the
// read-only path, or (SA) from a copy in shared memory.
template <bool SA>
__device__ __forceinline__ int4 ldact16(const void *p) {
    if (SA) return *(const int4 *)p;
    return ld16(p);
}

// act_at: where byte o of an activation row's int8 values is. PAD > 0:
// the row's copy in shared memory (k_mv_pipe) leaves PAD bytes after every
// 64, so that lanes reading 16 bytes at a stride of 64 or 256 bytes (one
// unit of 64 values each) hit different banks. act_tail: where the row's
// scales (and Q8_K's block sums) begin.
template <int PAD, class B> // B: uint8_t or const uint8_t
__device__ __forceinline__ B *act_at(B *at, int64_t o) {
    return PAD ? at + o + (o >> 6) * PAD : at + o;
}
template <int PAD>
__device__ __forceinline__ const uint8_t *act_tail(const uint8_t *at, int cols) {
    return at + cols + (PAD ? (cols >> 6) * PAD : 0);
}

__device__ __forceinline__ int dot4(int4 w, int4 x, int acc) {
    acc = __dp4a(w.x, x.x, acc);
    acc = __dp4a(w.y, x.y, acc);
    acc = __dp4a(w.z, x.z, acc);
    acc = __dp4a(w.w, x.w, acc);
    return acc;
}

// dp4a of unsigned weight bytes with signed activation bytes.
__device__ __forceinline__ int dp4a_us(int a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ int dot4_us(int4 w, int4 x, int acc) {
    acc = dp4a_us(w.x, x.x, acc);
    acc = dp4a_us(w.y, x.y, acc);
    acc = dp4a_us(w.z, x.z, acc);
    acc = dp4a_us(w.w, x.w, acc);
    return acc;
}

// A quant block's float term: added to the lane's running sum (fast), or
// stored in shared memory for the row's sequential sum in block order
// (exact: the order of quant.Dot, so results are bit-identical to the CPU).
template <bool EX>
__device__ __forceinline__ void emit(float *acc, float *terms, int nb, int t, int blk, float term) {
    if (EX)
        terms[t * nb + blk] = term;
    else
        acc[t] += term;
}

// ---------------------------------------------------------------- Q8_0
struct TQ8_0 {
    static constexpr int VPU = 16; // values per 16-byte unit
    static constexpr int U = 2;    // units per block
    static constexpr int MAX_RPW = 1; // rows per warp the automatic choice may stack
    struct Row {
        const uint8_t *q;
        const __half *d;
    };
    // d: the block scale as loaded, converted where the term is formed (a
    // conversion in load would wait for the scale's load before the next
    // unit's loads are issued: one memory latency a unit)
    struct Unit {
        int4 q;
        __half d;
    };
    static __device__ __forceinline__ void row(Row &r, const MVArgs &a, int64_t grow) {
        r.q = a.w + grow * a.cols;
        r.d = (const __half *)(a.w + a.R * a.cols) + grow * (a.cols / 32);
    }
    // qrow: where row grow's quants begin (rows' quants are contiguous)
    static __device__ __forceinline__ const uint8_t *qrow(const MVArgs &a, int64_t grow) { return a.w + grow * a.cols; }
    // The pipeline's view (k_mv_pipe): region k of the tensor begins at
    // byte base(k) and holds bpr(k) bytes per row; srow points a Row at a
    // row's bytes of each region (p[k]) wherever they are staged.
    static constexpr int NREG = 2; // quants, scales
    static int64_t base(int k, int64_t R, int64_t cols) { return k == 0 ? 0 : R * cols; }
    static int64_t bpr(int k, int64_t cols) { return k == 0 ? cols : cols / 16; }
    static __device__ __forceinline__ void srow(Row &r, const uint8_t *const *p) {
        r.q = p[0];
        r.d = (const __half *)p[1];
    }
    static __device__ __forceinline__ void load(Unit &u, const Row &r, int ui, int wl) {
        u.q = ldw16(r.q + (int64_t)ui * 16, wl);
        u.d = r.d[ui >> 1];
    }
    template <int NT, bool EX, bool SA = false>
    static __device__ __forceinline__ void dot(const Unit &u, int ui, bool valid, const uint8_t *act,
                                               int64_t act_tok, int cols, float *acc, int lane, const uint64_t *,
                                               float *terms, int nb) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint8_t *at = act + t * act_tok;
            int4 x = valid ? ldact16<SA>(at + (int64_t)ui * 16) : make_int4(0, 0, 0, 0);
            int s = dot4(u.q, x, 0);
            s += __shfl_xor_sync(FULL_MASK, s, 1);
            if (valid && (lane & 1) == 0) {
                float da = ((const float *)(at + cols))[ui >> 1];
                emit<EX>(acc, terms, nb, t, ui >> 1, __fmul_rn((float)s, __fmul_rn(__half2float(u.d), da)));
            }
        }
    }
    static constexpr float FINAL = 1.0f;
    static constexpr bool GRID = false;
    static constexpr int MIN_BLOCKS = 2; // CTAs per SM the registers are capped for
    static constexpr int ACT_PAD = 0; // lanes read consecutive 16 bytes: no conflicts
};

// ---------------------------------------------------------------- Q2_K
struct TQ2_K {
    static constexpr int VPU = 64;
    static constexpr int U = 4;
    static constexpr int MAX_RPW = 4; // rows per warp the automatic choice may stack
    struct Row {
        const uint8_t *qs, *sc;
        const __half2 *dm;
    };
    struct Unit {
        int4 q;
        uint2 sc;
        __half2 dm;
    };
    static __device__ __forceinline__ void row(Row &r, const MVArgs &a, int64_t grow) {
        int64_t nb = a.R * (a.cols / 256);
        int64_t b0 = grow * (a.cols / 256);
        r.qs = a.w + b0 * 64;
        r.sc = a.w + nb * 64 + b0 * 16;
        r.dm = (const __half2 *)(a.w + nb * 80) + b0;
    }
    static __device__ __forceinline__ const uint8_t *qrow(const MVArgs &a, int64_t grow) {
        return a.w + grow * (a.cols / 256) * 64;
    }
    static constexpr int NREG = 3; // quants, scale bytes, (d, dmin) pairs
    static int64_t base(int k, int64_t R, int64_t cols) { return k == 0 ? 0 : (k == 1 ? R * cols / 4 : R * cols / 256 * 80); }
    static int64_t bpr(int k, int64_t cols) { return k == 0 ? cols / 4 : (k == 1 ? cols / 16 : cols / 64); }
    static __device__ __forceinline__ void srow(Row &r, const uint8_t *const *p) {
        r.qs = p[0];
        r.sc = p[1];
        r.dm = (const __half2 *)p[2];
    }
    static __device__ __forceinline__ void load(Unit &u, const Row &r, int ui, int wl) {
        int blk = ui >> 2, h = (ui >> 1) & 1;
        u.q = ldw16(r.qs + (int64_t)ui * 16, wl);
        const uint2 *sc = (const uint2 *)(r.sc + (int64_t)blk * 16 + 8 * h);
        u.sc = wl == WL_GENERIC ? *sc : __ldg(sc);
        u.dm = r.dm[blk];
    }
    template <int NT, bool EX, bool SA = false>
    static __device__ __forceinline__ void dot(const Unit &u, int ui, bool valid, const uint8_t *act,
                                               int64_t act_tok, int cols, float *acc, int lane, const uint64_t *,
                                               float *terms, int nb) {
        const int blk = ui >> 2, m = ui & 3, h = m >> 1, o = m & 1;
        // the 4 two-bit planes of this unit's 16 bytes, left in place: plane k
        // holds 4^k times its quants, and its dot is shifted back (exactly)
        int4 p[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int mask = 0x03030303 << (2 * k);
            p[k].x = u.q.x & mask;
            p[k].y = u.q.y & mask;
            p[k].z = u.q.z & mask;
            p[k].w = u.q.w & mask;
        }
        // scale byte of plane k: sub-block 8h + 2k + o
        int sc[4];
        sc[0] = (u.sc.x >> (8 * o)) & 0xff;
        sc[1] = (u.sc.x >> (8 * (2 + o))) & 0xff;
        sc[2] = (u.sc.y >> (8 * o)) & 0xff;
        sc[3] = (u.sc.y >> (8 * (2 + o))) & 0xff;
        const int64_t nbc = cols / 256;
        constexpr int PAD = SA ? ACT_PAD : 0;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint8_t *at = act + t * act_tok;
            const int64_t aq = (int64_t)blk * 256 + 128 * h + 16 * o;
            const int16_t *bs = (const int16_t *)(act_tail<PAD>(at, cols) + 4 * nbc) + (int64_t)blk * 16 + 8 * h + o;
            int isum = 0, summs = 0;
            if (valid) {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    int4 x = ldact16<SA>(act_at<PAD>(at, aq + 32 * k));
                    isum += (sc[k] & 15) * (dot4_us(p[k], x, 0) >> (2 * k));
                    summs += (int)bs[2 * k] * (sc[k] >> 4);
                }
            }
            isum += __shfl_xor_sync(FULL_MASK, isum, 1);
            summs += __shfl_xor_sync(FULL_MASK, summs, 1);
            isum += __shfl_xor_sync(FULL_MASK, isum, 2);
            summs += __shfl_xor_sync(FULL_MASK, summs, 2);
            if (valid && m == 0) {
                float da = ((const float *)act_tail<PAD>(at, cols))[blk];
                float dall = __fmul_rn(da, __low2float(u.dm));
                float dmin = __fmul_rn(da, __high2float(u.dm));
                emit<EX>(acc, terms, nb, t, blk, __fsub_rn(__fmul_rn(dall, (float)isum), __fmul_rn(dmin, (float)summs)));
            }
        }
    }
    static constexpr float FINAL = 1.0f;
    static constexpr bool GRID = false;
    static constexpr int MIN_BLOCKS = 2; // CTAs per SM the registers are capped for
    // The decode form (k_mv_dec; TIQ2_XXS's comment): unit ui's activation
    // planes, its four block sums and its block's scale in registers.
    struct Reg {
        int4 x[4];
        int bs[4];
        float da;
    };
    // (GEN: at is a generic pointer, possibly to shared memory)
    template <bool GEN = false>
    static __device__ __forceinline__ void act_reg(Reg &r, const uint8_t *at, int cols, int ui) {
        const int blk = ui >> 2, m = ui & 3, h = m >> 1, o = m & 1;
        const int64_t aq = (int64_t)blk * 256 + 128 * h + 16 * o;
        const int16_t *bs = (const int16_t *)(at + cols + 4 * (cols / 256)) + (int64_t)blk * 16 + 8 * h + o;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            r.x[k] = GEN ? *(const int4 *)(at + aq + 32 * k) : ld16(at + aq + 32 * k);
            r.bs[k] = bs[2 * k];
        }
        r.da = ((const float *)(at + cols))[blk];
    }
    // (RED false: the lane's own share, as TIQ2_XXS::dot_reg)
    template <bool RED = true>
    static __device__ __forceinline__ float dot_reg(const Unit &u, const Reg &x, int ui, const uint32_t *) {
        const int o = ui & 1;
        int isum = 0, summs = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int mask = 0x03030303 << (2 * k);
            int4 p;
            p.x = u.q.x & mask;
            p.y = u.q.y & mask;
            p.z = u.q.z & mask;
            p.w = u.q.w & mask;
            const int sc = ((k < 2 ? u.sc.x : u.sc.y) >> (8 * (2 * (k & 1) + o))) & 0xff;
            isum += (sc & 15) * (dot4_us(p, x.x[k], 0) >> (2 * k));
            summs += x.bs[k] * (sc >> 4);
        }
        if (RED) {
            isum += __shfl_xor_sync(FULL_MASK, isum, 1);
            summs += __shfl_xor_sync(FULL_MASK, summs, 1);
            isum += __shfl_xor_sync(FULL_MASK, isum, 2);
            summs += __shfl_xor_sync(FULL_MASK, summs, 2);
        }
        const float dall = __fmul_rn(x.da, __low2float(u.dm));
        const float dmin = __fmul_rn(x.da, __high2float(u.dm));
        return __fsub_rn(__fmul_rn(dall, (float)isum), __fmul_rn(dmin, (float)summs));
    }
    static constexpr int ACT_PAD = 16; // (act_at) lanes 256 bytes apart would share banks
};

// ---------------------------------------------------------------- Q4_K
struct TQ4_K {
    static constexpr int VPU = 32;
    static constexpr int U = 8;
    static constexpr int MAX_RPW = 4; // rows per warp the automatic choice may stack
    static constexpr int NREG = 0; // no pipelined product
    struct Row {
        const uint8_t *b;
    };
    struct Unit {
        int4 q;
        int4 hdr;
    };
    static __device__ __forceinline__ void row(Row &r, const MVArgs &a, int64_t grow) {
        r.b = a.w + grow * (a.cols / 256) * 144;
    }
    static __device__ __forceinline__ const uint8_t *qrow(const MVArgs &a, int64_t grow) {
        return a.w + grow * (a.cols / 256) * 144;
    }
    static __device__ __forceinline__ void load(Unit &u, const Row &r, int ui, int wl) {
        const uint8_t *blk = r.b + (int64_t)(ui >> 3) * 144;
        u.q = ldw16(blk + 16 + 16 * (ui & 7), wl);
        u.hdr = ld16(blk);
    }
    static __device__ __forceinline__ int sbyte(const int4 &h, int i) { // scales byte i (0..11)
        int w = i < 4 ? h.y : (i < 8 ? h.z : h.w);
        return (w >> (8 * (i & 3))) & 0xff;
    }
    template <int NT, bool EX>
    static __device__ __forceinline__ void dot(const Unit &u, int ui, bool valid, const uint8_t *act,
                                               int64_t act_tok, int cols, float *acc, int lane, const uint64_t *,
                                               float *terms, int nb) {
        const int blk = ui >> 3, tt = ui & 7, c = tt >> 1, hf = tt & 1;
        int sc1, m1, sc2, m2;
        {
            const int j = 2 * c; // j < 4 for c < 2
            if (c < 2) {
                sc1 = sbyte(u.hdr, j) & 63;
                m1 = sbyte(u.hdr, j + 4) & 63;
                sc2 = sbyte(u.hdr, j + 1) & 63;
                m2 = sbyte(u.hdr, j + 5) & 63;
            } else {
                sc1 = (sbyte(u.hdr, j + 4) & 15) | ((sbyte(u.hdr, j - 4) >> 6) << 4);
                m1 = (sbyte(u.hdr, j + 4) >> 4) | ((sbyte(u.hdr, j) >> 6) << 4);
                sc2 = (sbyte(u.hdr, j + 5) & 15) | ((sbyte(u.hdr, j - 3) >> 6) << 4);
                m2 = (sbyte(u.hdr, j + 5) >> 4) | ((sbyte(u.hdr, j + 1) >> 6) << 4);
            }
        }
        int4 lo, hi;
        lo.x = u.q.x & 0x0f0f0f0f;
        lo.y = u.q.y & 0x0f0f0f0f;
        lo.z = u.q.z & 0x0f0f0f0f;
        lo.w = u.q.w & 0x0f0f0f0f;
        hi.x = u.q.x & 0xf0f0f0f0; // 16 times the high quants
        hi.y = u.q.y & 0xf0f0f0f0;
        hi.z = u.q.z & 0xf0f0f0f0;
        hi.w = u.q.w & 0xf0f0f0f0;
        const int64_t nbc = cols / 256;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint8_t *at = act + t * act_tok;
            const int8_t *aq = (const int8_t *)at + (int64_t)blk * 256 + 64 * c + 16 * hf;
            const int16_t *bs = (const int16_t *)(at + cols + 4 * nbc) + (int64_t)blk * 16 + 4 * c + hf;
            int isum = 0, summ = 0;
            if (valid) {
                int4 xl = ld16(aq), xh = ld16(aq + 32);
                isum = sc1 * dot4(lo, xl, 0) + sc2 * (dot4_us(hi, xh, 0) >> 4);
                summ = m1 * (int)bs[0] + m2 * (int)bs[2];
            }
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) {
                isum += __shfl_xor_sync(FULL_MASK, isum, o);
                summ += __shfl_xor_sync(FULL_MASK, summ, o);
            }
            if (valid && tt == 0) {
                float da = ((const float *)(at + cols))[blk];
                __half2 dm = *(const __half2 *)&u.hdr.x;
                float d = __fmul_rn(da, __low2float(dm));
                float dmin = __fmul_rn(da, __high2float(dm));
                emit<EX>(acc, terms, nb, t, blk, __fsub_rn(__fmul_rn(d, (float)isum), __fmul_rn(dmin, (float)summ)));
            }
        }
    }
    static constexpr float FINAL = 1.0f;
    static constexpr bool GRID = false;
    static constexpr int MIN_BLOCKS = 2; // CTAs per SM the registers are capped for
};

// ---------------------------------------------------------------- IQ2_XXS
// Spread the low 4 bits of s to the four bytes of a word as 0x00/0xff.
__device__ __forceinline__ uint32_t sign_bytes(uint32_t s) {
    return ((s * 0x00204081u) & 0x01010101u) * 0xffu;
}

// The byte masks (0xff: negate) of the 8 signs of IQ2 sign index s (0..127):
// the low 7 bits of s and, as eighth sign, their parity.
__device__ __forceinline__ uint64_t iq2_sign_mask(uint32_t s) {
    s |= (__popc(s) & 1) << 7;
    return (uint64_t)sign_bytes(s & 15) | (uint64_t)sign_bytes(s >> 4) << 32;
}

// prmt: PTX prmt.b32 (byte i of the result: byte nibble_i(s) of b:a; no
// sign replication for nibbles below 8). __byte_perm masks each nibble to
// three bits first (an extra LOP3 a call); k_mv_dec's selectors never set
// the fourth.
__device__ __forceinline__ int prmt(uint32_t a, uint32_t b, uint32_t s) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
    return (int)d;
}

// lds32: the 32-bit word at shared-memory address a.
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}

// Negate the bytes of g (magnitudes below 128) where m is 0xff: ~g + 1 in
// each such byte; no byte carries into the next.
__device__ __forceinline__ int apply_signs(uint32_t g, uint32_t m) {
    return (int)((g ^ m) + (m & 0x01010101u));
}

struct TIQ2_XXS {
    static constexpr int VPU = 64;
    static constexpr int U = 4;
    static constexpr int MAX_RPW = 4; // rows per warp the automatic choice may stack
    struct Row {
        const uint8_t *qs;
        const __half *d;
    };
    struct Unit {
        int4 q;
        __half d; // (converted at use: TQ8_0::Unit)
    };
    static __device__ __forceinline__ void row(Row &r, const MVArgs &a, int64_t grow) {
        int64_t nb = a.R * (a.cols / 256);
        int64_t b0 = grow * (a.cols / 256);
        r.qs = a.w + b0 * 64;
        r.d = (const __half *)(a.w + nb * 64) + b0;
    }
    static __device__ __forceinline__ const uint8_t *qrow(const MVArgs &a, int64_t grow) {
        return a.w + grow * (a.cols / 256) * 64;
    }
    static constexpr int NREG = 2; // quants, scales
    static int64_t base(int k, int64_t R, int64_t cols) { return k == 0 ? 0 : R * cols / 4; }
    static int64_t bpr(int k, int64_t cols) { return k == 0 ? cols / 4 : cols / 128; }
    static __device__ __forceinline__ void srow(Row &r, const uint8_t *const *p) {
        r.qs = p[0];
        r.d = (const __half *)p[1];
    }
    static __device__ __forceinline__ void load(Unit &u, const Row &r, int ui, int wl) {
        u.q = ldw16(r.qs + (int64_t)ui * 16, wl);
        u.d = r.d[ui >> 2];
    }
    template <int NT, bool EX, bool SA = false>
    static __device__ __forceinline__ void dot(const Unit &u, int ui, bool valid, const uint8_t *act,
                                               int64_t act_tok, int cols, float *acc, int lane,
                                               const uint64_t *grid, float *terms, int nb) {
        const int blk = ui >> 2, m = ui & 3;
        constexpr int PAD = SA ? ACT_PAD : 0;
        // decode the 64 signed magnitudes of the two sub-blocks of this unit
        int w[16];
        int mul[2];
#pragma unroll
        for (int sb = 0; sb < 2; sb++) {
            const uint32_t idx = sb ? (uint32_t)u.q.z : (uint32_t)u.q.x;
            const uint32_t aux = sb ? (uint32_t)u.q.w : (uint32_t)u.q.y;
            mul[sb] = 2 * (int)(aux >> 28) + 1;
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const uint64_t gv = grid[(idx >> (8 * g)) & 0xff];
                const uint64_t sm = iq2_sign_mask((aux >> (7 * g)) & 127); // ALU: no bank conflicts
                w[8 * sb + 2 * g] = apply_signs((uint32_t)gv, (uint32_t)sm);
                w[8 * sb + 2 * g + 1] = apply_signs((uint32_t)(gv >> 32), (uint32_t)(sm >> 32));
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint8_t *at = act + t * act_tok;
            const uint8_t *aq = act_at<PAD>(at, (int64_t)blk * 256 + 64 * m); // (64 bytes: no pad inside)
            int bsum = 0;
            if (valid) {
#pragma unroll
                for (int sb = 0; sb < 2; sb++) {
                    int4 x0 = ldact16<SA>(aq + 32 * sb), x1 = ldact16<SA>(aq + 32 * sb + 16);
                    int s = 0;
                    s = __dp4a(w[8 * sb + 0], x0.x, s);
                    s = __dp4a(w[8 * sb + 1], x0.y, s);
                    s = __dp4a(w[8 * sb + 2], x0.z, s);
                    s = __dp4a(w[8 * sb + 3], x0.w, s);
                    s = __dp4a(w[8 * sb + 4], x1.x, s);
                    s = __dp4a(w[8 * sb + 5], x1.y, s);
                    s = __dp4a(w[8 * sb + 6], x1.z, s);
                    s = __dp4a(w[8 * sb + 7], x1.w, s);
                    bsum += s * mul[sb];
                }
            }
            bsum += __shfl_xor_sync(FULL_MASK, bsum, 1);
            bsum += __shfl_xor_sync(FULL_MASK, bsum, 2);
            if (valid && m == 0) {
                float da = ((const float *)act_tail<PAD>(at, cols))[blk];
                emit<EX>(acc, terms, nb, t, blk, __fmul_rn(__fmul_rn(__half2float(u.d), da), (float)bsum));
            }
        }
    }
    // The decode form (k_mv_dec): unit ui's 64 activation values and its
    // block's scale held in registers (Reg), read once per warp and used for
    // every row it takes; dot_reg gives the block term (dot's operations on
    // the same signed weights) on the unit's first lane (ui % 4 == 0). Two
    // tables, each entry repeated for the 32 lanes (word 32 e + lane: every
    // lane reads its own bank, no conflicts) in TAB_WORDS of shared memory:
    // the codebook as byte-permute selectors (tab_entry: coordinate i's
    // magnitude 8, 25 or 43 as index 0, 1 or 2 in nibble i), and the 128
    // sign patterns with their parity bit as 4 added to the nibbles of the
    // negated coordinates (sign_entry), so that one byte permute (prmt) of
    // the magnitudes and their negations gives four signed weights.
    static constexpr int TAB_WORDS = (256 + 128) * 32;
    struct Reg {
        int4 x[4];
        float da;
    };
    // (GEN: at is a generic pointer, possibly to shared memory)
    template <bool GEN = false>
    static __device__ __forceinline__ void act_reg(Reg &r, const uint8_t *at, int cols, int ui) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint8_t *p = at + (int64_t)ui * 64 + 16 * k;
            r.x[k] = GEN ? *(const int4 *)p : ld16(p);
        }
        r.da = ((const float *)(at + cols))[ui >> 2];
    }
    static __device__ __forceinline__ uint32_t tab_entry(int i) {
        const uint64_t g = iq2xxs_grid[i];
        uint32_t e = 0;
#pragma unroll
        for (int b = 0; b < 8; b++) {
            const uint32_t v = (uint32_t)(g >> (8 * b)) & 0xff;
            e |= (v == 8 ? 0u : (v == 25 ? 1u : 2u)) << (4 * b);
        }
        return e;
    }
    static __device__ __forceinline__ uint32_t sign_entry(uint32_t s7) {
        uint32_t s = s7 | (__popc(s7) & 1) << 7; // bit i: coordinate i negated
        s = (s | (s << 12)) & 0x000f000fu;          // bit i → bit 4i + 2
        s = (s | (s << 6)) & 0x03030303u;
        s = (s | (s << 3)) & 0x11111111u;
        return s << 2;
    }
    // fill_tabs writes both tables (a CTA of 256 threads): the entries
    // once, then each 16 bytes of the copies by consecutive threads.
    static __device__ __forceinline__ void fill_tabs(uint32_t *tab) {
        __shared__ uint32_t ent[384];
        const int t = threadIdx.x;
        ent[t] = tab_entry(t);
        if (t < 128) ent[256 + t] = sign_entry(t);
        __syncthreads();
        for (int k = t; k < TAB_WORDS / 4; k += 256) {
            const uint32_t e = ent[k >> 3]; // words 4k … 4k + 3 are copies of entry 4k / 32
            *(uint4 *)&tab[4 * k] = make_uint4(e, e, e, e);
        }
    }
    // tab: the tables' words plus the lane. RED false (fast mode's
    // k_mv_dec): the lane's own share of the term, the block's four lanes
    // not added.
    template <bool RED = true>
    static __device__ __forceinline__ float dot_reg(const Unit &u, const Reg &x, int, const uint32_t *tab) {
        constexpr uint32_t POS = 0x002b1908u, NEG = 0x00d5e7f8u; // 8, 25, 43 and their negations
        // the tables' shared-memory addresses: entry e of the lane's copies
        // at tb + 128 e (the codebook), tb + 0x8000 + 128 e (the signs);
        // the codebook's byte g taken by a byte permute and scaled by one
        // multiply-add, the sign fields masked in place where they sit at
        // bit 7 (fewer instructions a lookup than the word index 32 e + lane)
        const uint32_t tb = (uint32_t)__cvta_generic_to_shared(tab);
        int bsum = 0;
#pragma unroll
        for (int sb = 0; sb < 2; sb++) {
            const uint32_t idx = sb ? (uint32_t)u.q.z : (uint32_t)u.q.x;
            const uint32_t aux = sb ? (uint32_t)u.q.w : (uint32_t)u.q.y;
            const int4 x0 = x.x[2 * sb], x1 = x.x[2 * sb + 1];
            const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            int s = 0;
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const uint32_t ga = (uint32_t)prmt(idx, 0u, 0x4440u + g) * 128u + tb;
                const uint32_t sf = g == 0 ? (aux & 127u) * 128u : (g == 1 ? aux & 0x3f80u : (aux >> (7 * g - 7)) & 0x3f80u);
                const uint32_t sel = lds32(ga) | lds32(tb + 0x8000u + sf);
                s = __dp4a(prmt(POS, NEG, sel), xs[2 * g], s);
                s = __dp4a(prmt(POS, NEG, sel >> 16), xs[2 * g + 1], s);
            }
            bsum += s * (2 * (int)(aux >> 28) + 1);
        }
        if (RED) {
            bsum += __shfl_xor_sync(FULL_MASK, bsum, 1);
            bsum += __shfl_xor_sync(FULL_MASK, bsum, 2);
        }
        return __fmul_rn(__fmul_rn(__half2float(u.d), x.da), (float)bsum);
    }
    static constexpr float FINAL = 0.125f;
    static constexpr int ACT_PAD = 16; // (act_at) lanes 64 bytes apart would share banks
    static constexpr bool GRID = true;
    static constexpr int MIN_BLOCKS = 3; // CTAs per SM the registers are capped for (3: the 384 CTAs of a decode expert product in one wave; spills 16 bytes)
};

// ---------------------------------------------------------------- F16, F32
// fma8_half adds the products of the 8 halves of w with a (values 0-3) and
// b (4-7) to s, one fmaf after another in value order: TF16's dot, and so
// k_mv_f16_norm's (mv_float.cu), which keeps its bits.
__device__ __forceinline__ float fma8_half(int4 w, float4 a, float4 b, float s) {
    const __half2 *h = (const __half2 *)&w;
    const float2 w0 = __half22float2(h[0]), w1 = __half22float2(h[1]);
    const float2 w2 = __half22float2(h[2]), w3 = __half22float2(h[3]);
    s = fmaf(w0.x, a.x, s);
    s = fmaf(w0.y, a.y, s);
    s = fmaf(w1.x, a.z, s);
    s = fmaf(w1.y, a.w, s);
    s = fmaf(w2.x, b.x, s);
    s = fmaf(w2.y, b.y, s);
    s = fmaf(w3.x, b.z, s);
    s = fmaf(w3.y, b.w, s);
    return s;
}

struct TF16 {
    static constexpr int VPU = 8;
    static constexpr int U = 1;
    static constexpr int MAX_RPW = 1; // rows per warp the automatic choice may stack
    static constexpr int NREG = 0; // no pipelined product
    struct Row {
        const uint8_t *w;
    };
    struct Unit {
        int4 q;
    };
    static __device__ __forceinline__ void row(Row &r, const MVArgs &a, int64_t grow) {
        r.w = a.w + grow * a.cols * 2;
    }
    static __device__ __forceinline__ const uint8_t *qrow(const MVArgs &a, int64_t grow) { return a.w + grow * a.cols * 2; }
    static __device__ __forceinline__ void load(Unit &u, const Row &r, int ui, int wl) {
        u.q = ldw16(r.w + (int64_t)ui * 16, wl);
    }
    template <int NT, bool EX>
    static __device__ __forceinline__ void dot(const Unit &u, int ui, bool valid, const uint8_t *act,
                                               int64_t act_tok, int, float *acc, int, const uint64_t *, float *,
                                               int) {
        if (!valid) return;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *x = (const float4 *)(act + t * act_tok) + 2 * (int64_t)ui;
            acc[t] = fma8_half(u.q, __ldg(x), __ldg(x + 1), acc[t]);
        }
    }
    static constexpr float FINAL = 1.0f;
    static constexpr bool GRID = false;
    static constexpr int MIN_BLOCKS = 2; // CTAs per SM the registers are capped for
};

struct TBF16 {
    static constexpr int VPU = 8;
    static constexpr int U = 1;
    static constexpr int MAX_RPW = 1; // rows per warp the automatic choice may stack
    static constexpr int NREG = 0; // no pipelined product
    struct Row {
        const uint8_t *w;
    };
    struct Unit {
        int4 q;
    };
    static __device__ __forceinline__ void row(Row &r, const MVArgs &a, int64_t grow) {
        r.w = a.w + grow * a.cols * 2;
    }
    static __device__ __forceinline__ const uint8_t *qrow(const MVArgs &a, int64_t grow) { return a.w + grow * a.cols * 2; }
    static __device__ __forceinline__ void load(Unit &u, const Row &r, int ui, int wl) {
        u.q = ldw16(r.w + (int64_t)ui * 16, wl);
    }
    template <int NT, bool EX>
    static __device__ __forceinline__ void dot(const Unit &u, int ui, bool valid, const uint8_t *act,
                                               int64_t act_tok, int, float *acc, int, const uint64_t *, float *,
                                               int) {
        if (!valid) return;
        float w[8];
        const uint32_t q[4] = {(uint32_t)u.q.x, (uint32_t)u.q.y, (uint32_t)u.q.z, (uint32_t)u.q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[2 * k] = __uint_as_float(q[k] << 16);
            w[2 * k + 1] = __uint_as_float(q[k] & 0xffff0000u);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *x = (const float4 *)(act + t * act_tok) + 2 * (int64_t)ui;
            float4 a = __ldg(x), b = __ldg(x + 1);
            float s = acc[t];
            s = fmaf(w[0], a.x, s);
            s = fmaf(w[1], a.y, s);
            s = fmaf(w[2], a.z, s);
            s = fmaf(w[3], a.w, s);
            s = fmaf(w[4], b.x, s);
            s = fmaf(w[5], b.y, s);
            s = fmaf(w[6], b.z, s);
            s = fmaf(w[7], b.w, s);
            acc[t] = s;
        }
    }
    static constexpr float FINAL = 1.0f;
    static constexpr bool GRID = false;
    static constexpr int MIN_BLOCKS = 2; // CTAs per SM the registers are capped for
};

struct TF32 {
    static constexpr int VPU = 4;
    static constexpr int U = 1;
    static constexpr int MAX_RPW = 1; // rows per warp the automatic choice may stack
    static constexpr int NREG = 0; // no pipelined product
    struct Row {
        const uint8_t *w;
    };
    struct Unit {
        int4 q;
    };
    static __device__ __forceinline__ void row(Row &r, const MVArgs &a, int64_t grow) {
        r.w = a.w + grow * a.cols * 4;
    }
    static __device__ __forceinline__ const uint8_t *qrow(const MVArgs &a, int64_t grow) { return a.w + grow * a.cols * 4; }
    static __device__ __forceinline__ void load(Unit &u, const Row &r, int ui, int wl) {
        u.q = ldw16(r.w + (int64_t)ui * 16, wl);
    }
    template <int NT, bool EX>
    static __device__ __forceinline__ void dot(const Unit &u, int ui, bool valid, const uint8_t *act,
                                               int64_t act_tok, int, float *acc, int, const uint64_t *, float *,
                                               int) {
        if (!valid) return;
        float4 w = *(const float4 *)&u.q;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float4 a = __ldg((const float4 *)(act + t * act_tok) + ui);
            float s = acc[t];
            s = fmaf(w.x, a.x, s);
            s = fmaf(w.y, a.y, s);
            s = fmaf(w.z, a.z, s);
            s = fmaf(w.w, a.w, s);
            acc[t] = s;
        }
    }
    static constexpr float FINAL = 1.0f;
    static constexpr bool GRID = false;
    static constexpr int MIN_BLOCKS = 2; // CTAs per SM the registers are capped for
};

template <class T>
__host__ __device__ constexpr int block_vals() {
    return T::VPU * T::U;
}

// ordered_sum adds a row's nb block terms (16-byte aligned in shared
// memory) one after another in block order, as quant.Dot does.
__device__ __forceinline__ float ordered_sum(const float *tm, int nb) {
    float sum = 0.f;
    int b = 0;
    if ((nb & 3) == 0) { // 32 terms loaded (16-byte loads) before they join the chain
        for (; b + 32 <= nb; b += 32) {
            float4 v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = *(const float4 *)(tm + b + 4 * k);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                sum = __fadd_rn(sum, v[k].x);
                sum = __fadd_rn(sum, v[k].y);
                sum = __fadd_rn(sum, v[k].z);
                sum = __fadd_rn(sum, v[k].w);
            }
        }
    }
    for (; b < nb; b++) sum = __fadd_rn(sum, tm[b]);
    return sum;
}

template <class T, int NT, int S, int RPW, bool EX>
__global__ void __launch_bounds__(256, T::MIN_BLOCKS) k_matvec(MVArgs a) {
    static_assert(32 % T::U == 0, "a quant block must fit in aligned lanes");
    static_assert(S == 1 || RPW == 1, "split-K and stacked rows exclude each other");
    // units per row loaded per thread before computing: RPW*CHR in flight
    constexpr int CHR = RPW == 1 ? CH : (RPW >= 8 ? 1 : 8 / RPW);
    constexpr int TEAM = 32 * S;
    constexpr int ROWS = 8 * RPW / S; // rows per CTA
    // the pair (a.w2): the grid's second half of blockIdx.y runs a.w2 into a.y2
    const bool second = a.w2 != nullptr && blockIdx.y >= gridDim.y / 2;
    const int sel = second ? (int)(blockIdx.y - gridDim.y / 2) : (int)blockIdx.y;
    MVArgs aw = a;
    if (second) aw.w = a.w2;
    mv_pdl_launch(a);
    if (threadIdx.x == 0 && !a.ids && a.pf) { // the CTA's rows of a matrix known before the wait
        const int64_t m0 = (a.sel_mat ? sel : 0) * (int64_t)a.rows;
        const int64_t r0 = (int64_t)blockIdx.x * ROWS, r1 = min(r0 + ROWS, (int64_t)a.rows);
        if (m0 / a.rows < a.n_mat && r0 < r1) prefetch_l2(T::qrow(aw, m0 + r0), T::qrow(aw, m0 + r1) - T::qrow(aw, m0 + r0));
    }
    mv_pdl_wait(a);
    // IQ2_XXS: the codebook (256 entries; sign masks are computed)
    __shared__ uint64_t s_grid[T::GRID ? 256 : 1];
    __shared__ float s_red[S > 1 && !EX ? 8 : 1][NT];
    extern __shared__ __align__(16) float s_terms[]; // EX: [ROWS][NT][nb]
    if (T::GRID) {
        s_grid[threadIdx.x] = iq2xxs_grid[threadIdx.x];
        __syncthreads();
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rl0 = (warp / S) * RPW; // the warp's first row within the CTA
    const int row0 = blockIdx.x * ROWS + rl0;
    const int team = (warp % S) * 32 + lane;
    const int nb = a.cols / block_vals<T>();
    // blockIdx.z: the piece of NT tokens (launch_chunks runs all full pieces in one grid)
    const int64_t tz = (int64_t)blockIdx.z * NT;
    const uint8_t *act = a.act + (sel / a.act_div) * a.act_sel + tz * a.act_tok;
    float acc[RPW][NT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    bool mat_ok = true;
    int64_t mat = a.sel_mat ? sel : 0;
    if (a.ids) mat = a.ids[sel];
    if (mat < 0 || mat >= a.n_mat) mat_ok = false;
    if (mat_ok && row0 < a.rows) { // uniform over the warp
        typename T::Row rr[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++)
            if (row0 + r < a.rows) T::row(rr[r], aw, mat * a.rows + row0 + r);
        const int units = a.cols / T::VPU;
        for (int base = 0; base < units; base += TEAM * CHR) {
            typename T::Unit u[RPW][CHR];
#pragma unroll
            for (int r = 0; r < RPW; r++)
#pragma unroll
                for (int c = 0; c < CHR; c++) {
                    const int ui = base + c * TEAM + team;
                    if (row0 + r < a.rows && ui < units) T::load(u[r][c], rr[r], ui, a.wl);
                }
#pragma unroll
            for (int r = 0; r < RPW; r++)
#pragma unroll
                for (int c = 0; c < CHR; c++) {
                    const int ui = base + c * TEAM + team;
                    if (row0 + r < a.rows && base + c * TEAM < units) // uniform over the warp
                        T::template dot<NT, EX>(u[r][c], ui, ui < units, act, a.act_tok, a.cols, acc[r], lane, s_grid,
                                                s_terms + (size_t)(rl0 + r) * NT * nb, nb);
                }
        }
    }
    const float nan = __int_as_float(0x7fc00000);
    float *y = (second ? a.y2 : a.y) + sel * a.y_sel + tz * a.y_tok;
    const int rows0 = blockIdx.x * ROWS;
    if constexpr (EX) {
        // one thread per (row, token): the terms in block order
        __syncthreads();
        for (int i = threadIdx.x; i < ROWS * NT; i += blockDim.x) {
            const int rl = i / NT, t = i % NT;
            if (rows0 + rl >= a.rows) continue;
            float sum = ordered_sum(s_terms + (size_t)(rl * NT + t) * nb, nb);
            if (T::FINAL != 1.0f) sum = __fmul_rn(T::FINAL, sum);
            y[t * a.y_tok + rows0 + rl] = mat_ok ? sum : nan;
        }
        return;
    } else {
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
    if (S == 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RPW; r++)
                if (row0 + r < a.rows) {
#pragma unroll
                    for (int t = 0; t < NT; t++) y[t * a.y_tok + row0 + r] = mat_ok ? acc[r][t] * T::FINAL : nan;
                }
        }
    } else {
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++) s_red[warp][t] = acc[0][t];
        }
        __syncthreads();
        if (lane == 0 && warp % S == 0 && row0 < a.rows) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float s = 0.f;
#pragma unroll
                for (int k = 0; k < S; k++) s += s_red[warp + k][t];
                y[t * a.y_tok + row0] = mat_ok ? s * T::FINAL : nan;
            }
        }
    }
    }
}

template <class T, int NT, int S, int RPW, bool EX>
int launch_one(const MVArgs &a, int n_sel, cudaStream_t st, int pieces = 1) {
    constexpr int rows_per_cta = 8 * RPW / S;
    size_t smem = EX ? (size_t)rows_per_cta * NT * (a.cols / block_vals<T>()) * sizeof(float) : 0;
    if (smem > 48 * 1024) {
        static size_t set = 0; // the largest opt-in done for this instantiation
        if (smem > set) {
            cudaError_t e = cudaFuncSetAttribute(k_matvec<T, NT, S, RPW, EX>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return ds4c_cuda_err(e, "matvec shared memory");
            set = smem;
        }
    }
    dim3 g((unsigned)((a.rows + rows_per_cta - 1) / rows_per_cta), (unsigned)(n_sel * (a.w2 ? 2 : 1)), (unsigned)pieces);
    ds4c_launch(k_matvec<T, NT, S, RPW, EX>, g, 256, smem, st, a);
    return 0;
}

// ---------------------------------------------------------------- decode products
// mv_glu_act: a k_mv_dec CTA's activation rows when it forms them
// (MVArgs.glu_g): those of selections s_lo … s_hi into s_act (act_sel
// bytes each), a warp a 256-value block: k_swiglu_q8k's operations, so its
// bytes.
__device__ __forceinline__ void mv_glu_act(const MVArgs &a, uint8_t *s_act, int s_lo, int s_hi) {
    const int nb = a.cols >> 8, lane = threadIdx.x & 31;
    const int blocks = (s_hi - s_lo + 1) * nb;
    for (int gb = threadIdx.x >> 5; gb < blocks; gb += blockDim.x >> 5) {
        const int rs = gb / nb, b = gb - rs * nb, r = s_lo + rs;
        const int64_t o = (int64_t)r * a.glu_stride + b * 256 + lane * 8;
        const float4 g0 = __ldg((const float4 *)(a.glu_g + o)), g1 = __ldg((const float4 *)(a.glu_g + o) + 1);
        const float4 u0 = __ldg((const float4 *)(a.glu_u + o)), u1 = __ldg((const float4 *)(a.glu_u + o) + 1);
        const float gs[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
        const float us[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = swiglu_as(a.glu_fast != 0, gs[i], us[i], a.glu_lim, a.glu_w, r);
        q8_k_warp(v, lane, s_act + (int64_t)rs * a.act_sel, b, nb);
    }
}

// k_mv_dec: one token's product of n_sel selections (DS4C_OPT_MV_DEC) for
// the types with a register form of the activation (T::Reg: IQ2_XXS, Q2_K).
// k_matvec gives each warp a few rows and every unit of every row reads its
// 64 activation bytes again through L1, lanes 64 bytes apart: four times the
// weights' own traffic and scattered (v9: L1/TEX 74 % busy, DRAM 14 %). Here
// each warp takes a contiguous run of rows of one selection (wps warps a
// selection); a lane holds the activation of its UPL units (ui = lane +
// 32 j) in registers for the whole run; the run goes P rows at a time, the
// next P rows' weights loaded while the current ones are computed (the loop
// unrolled by two, so that the buffers keep their registers); the P rows'
// dots are straight-line code the compiler interleaves. A row's block terms
// are added in block order (quant.Dot's, k_matvec's exact path): the result
// is bit-identical to the CPU in both modes — unless FAST (fast mode,
// DS4C_OPT_MV_FAST bit 2): each lane's shares of its units' terms added,
// then the warp's tree sum (a third fewer instructions a row than the
// block-order sum of broadcast terms). MB: CTAs an SM the registers are
// capped for. With a.glu_g (ds4c_matmul_grouped_swiglu) the CTA forms the
// activation rows of its warps' selections in shared memory after its
// wait (mv_glu_act), the warps' first rows' weights already requested.
//
// dsum (exact mode, DS4C_OPT_MV_DEC_SUM): the lanes holding a row's block
// terms store them in shared memory and lane p adds row p's in block order,
// instead of every lane adding all of them after a broadcast shuffle each
// (16 shuffles and 16 additions a row of 4096 columns, on every lane): the
// same terms in the same order, so the same bits.
template <class T, int UPL, int P, int MB, bool FAST>
__global__ void __launch_bounds__(256, MB) k_mv_dec(MVArgs a, int n_sel, int run, int wps, int dsum) {
    extern __shared__ __align__(16) uint32_t s_tab[]; // T::TAB_WORDS (GRID types)
    __shared__ __align__(16) float s_dsum[FAST ? 1 : 8][P][8 * UPL]; // (dsum) warp w's rows' block terms
    mv_pdl_launch(a);
    if constexpr (T::GRID) T::fill_tabs(s_tab);
    mv_pdl_wait(a);
    if (T::GRID) __syncthreads();
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * 8 + (threadIdx.x >> 5);
    int sel = gw / wps;
    const int r0 = (gw % wps) * run;
    // a pair's second tensor: selections n_sel … 2 n_sel − 1
    const bool second = a.w2 != nullptr && sel >= n_sel;
    if (second) sel -= n_sel;
    // (warps without rows return only after the CTA's activation prologue)
    const bool live = sel < n_sel && r0 < a.rows;
    const int n = live ? min(run, a.rows - r0) : 1; // the warp's rows r0 … r0 + n − 1
    MVArgs aw = a; // (aw.w: the tensor the warp reads)
    if (second) aw.w = a.w2;
    float *y = (second ? a.y2 : a.y) + sel * a.y_sel + r0;
    int64_t mat = a.sel_mat ? sel : 0;
    if (live && a.ids) mat = a.ids[sel];
    const bool ok = live && mat >= 0 && mat < a.n_mat;
    static_assert(32 * T::VPU == 8 * block_vals<T>(), "a round of 32 units is 8 blocks");
    const int64_t grow0 = mat * a.rows + r0;
    using U = typename T::Unit;
    // rows i … i + P − 1 (past the run: its last row again, not stored)
    auto load = [&](U (&u)[P][UPL], int i) {
#pragma unroll
        for (int p = 0; p < P; p++) {
            typename T::Row rr;
            T::row(rr, aw, grow0 + min(i + p, n - 1));
#pragma unroll
            for (int j = 0; j < UPL; j++) T::load(u[p][j], rr, lane + 32 * j, a.wl);
        }
    };
    typename T::Reg x[UPL];
    auto compute = [&](const U (&u)[P][UPL], int i) {
        float term[P][UPL];
#pragma unroll
        for (int p = 0; p < P; p++)
#pragma unroll
            for (int j = 0; j < UPL; j++)
                term[p][j] = T::template dot_reg<!FAST>(u[p][j], x[j], lane + 32 * j, s_tab + lane);
        if constexpr (FAST) {
#pragma unroll
            for (int p = 0; p < P; p++) {
                float sum = term[p][0];
#pragma unroll
                for (int j = 1; j < UPL; j++) sum += term[p][j];
                sum = warp_sum(sum);
                if (T::FINAL != 1.0f) sum *= T::FINAL;
                if (lane == 0 && i + p < n) y[i + p] = sum;
            }
            return;
        }
        // block b's term is on lane 4 (b % 8) of unit round b / 8
        if (dsum) {
            float(*ss)[8 * UPL] = s_dsum[FAST ? 0 : threadIdx.x >> 5];
            if ((lane & 3) == 0)
#pragma unroll
                for (int p = 0; p < P; p++)
#pragma unroll
                    for (int j = 0; j < UPL; j++) ss[p][8 * j + (lane >> 2)] = term[p][j];
            __syncwarp();
            if (lane < P) {
                const float4 *r4 = (const float4 *)ss[lane];
                float sum = 0.f;
#pragma unroll
                for (int k = 0; k < 2 * UPL; k++) {
                    const float4 v = r4[k];
                    sum = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(sum, v.x), v.y), v.z), v.w);
                }
                if (T::FINAL != 1.0f) sum = __fmul_rn(T::FINAL, sum);
                if (i + lane < n) y[i + lane] = sum;
            }
            __syncwarp(); // (read before the next rows' terms are stored)
            return;
        }
#pragma unroll
        for (int p = 0; p < P; p++) {
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < UPL; j++)
#pragma unroll
                for (int b = 0; b < 8; b++) sum = __fadd_rn(sum, __shfl_sync(FULL_MASK, term[p][j], 4 * b));
            if (T::FINAL != 1.0f) sum = __fmul_rn(T::FINAL, sum);
            if (lane == 0 && i + p < n) y[i + p] = sum;
        }
    };
    U ua[P][UPL], ub[P][UPL];
    if (ok) load(ua, 0);
    if (a.glu_g) {
        // the activation formed here (MVArgs.glu_g), the first rows'
        // weights already on their way
        uint8_t *s_act;
        if constexpr (T::GRID)
            s_act = (uint8_t *)(s_tab + T::TAB_WORDS);
        else
            s_act = (uint8_t *)s_tab;
        const int s_lo = (int)(blockIdx.x * 8 / wps);
        mv_glu_act(a, s_act, s_lo, min(n_sel - 1, (int)((blockIdx.x * 8 + 7) / wps)));
        __syncthreads();
        if (!live) return;
        const uint8_t *at = s_act + (int64_t)(sel - s_lo) * a.act_sel;
#pragma unroll
        for (int j = 0; j < UPL; j++) T::template act_reg<true>(x[j], at, a.cols, lane + 32 * j);
    } else {
        if (!live) return;
        const uint8_t *at = a.act + (int64_t)(sel / a.act_div) * a.act_sel;
#pragma unroll
        for (int j = 0; j < UPL; j++) T::act_reg(x[j], at, a.cols, lane + 32 * j);
    }
    if (!ok) {
        for (int i = lane; i < n; i += 32) y[i] = __int_as_float(0x7fc00000);
        return;
    }
    for (int i = 0; i < n; i += 2 * P) {
        if (i + P < n) load(ub, i + P);
        compute(ua, i);
        if (i + P >= n) break;
        if (i + 2 * P < n) load(ua, i + 2 * P);
        compute(ub, i + P);
    }
}

// launch_dec runs a single-token product as k_mv_dec when T has the
// register form, DS4C_OPT_MV_DEC is on and a row is one or two rounds of
// 32 units (UPL a lane; Flash's 4096 and 2048 columns): it returns whether it took the
// product, *rc the launch's status. The option picks (rows at a time P,
// CTAs an SM MB): 1 (1, 3), 2 (2, 2; the default), 3 (3, 2). IQ2_XXS
// spills a few bytes in 1 and 3 (its 128 registers at MB 2 hold 2 rows);
// (2, 3) spilled 228 bytes and measured 16.5 µs against 12.8 (cuda/NOTES.md
// v20).
template <class T, int UPL, int P, int MB, bool FAST>
cudaError_t launch_dec_as(const MVArgs &a, int n_sel, cudaStream_t st) {
    // runs: the GPU's resident warps over the rows, whole runs per selection
    const int64_t warps = (int64_t)MB * 8 * ds4c_sm_count();
    const int64_t mats = (int64_t)n_sel * (a.w2 ? 2 : 1); // the selections' matrices
    const int64_t rows = mats * a.rows;
    int64_t run = max((int64_t)1, (rows + warps - 1) / warps);
    // Each matrix rounds its warps up (wps), so ⌈rows / warps⌉ a warp can
    // still ask for a few CTAs more than one wave holds; those few would
    // then run alone in a second wave, doubling the product's time (a
    // three-token verification's 18 selections: 266 CTAs for 264 slots,
    // 53 µs against 27 for 12). Longer runs until one wave holds them (a
    // row's sum is the same whichever warp takes it: the same bits).
    while (run < a.rows && (mats * ((a.rows + run - 1) / run) + 7) / 8 > warps / 8) run++;
    const int64_t wps = (a.rows + run - 1) / run;
    const unsigned grid = (unsigned)((mats * wps + 7) / 8);
    size_t smem = 0;
    if constexpr (T::GRID) smem = T::TAB_WORDS * 4; // 48 KiB beside fill_tabs' static 1.5: past the default limit
    // (a.glu_g: the activation rows of the selections a CTA's 8 warps
    // take, at most ⌊7 / wps⌋ + 2)
    if (a.glu_g) smem += (size_t)min((int64_t)n_sel, 7 / wps + 2) * (size_t)a.act_sel;
    static size_t opted = 0; // the largest opt-in done (GRID: always needed, beside the static tables)
    if (smem > opted) {
        const cudaError_t e =
            cudaFuncSetAttribute(k_mv_dec<T, UPL, P, MB, FAST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        opted = smem;
    }
    // (DS4C_OPT_MV_DEC_LATE: not launched early beside the kernel before it)
    const int late = ds4c_opt_mv_dec_late();
    const bool early = !(late >= 2 || (late == 1 && a.w2 != nullptr));
    ds4c_launch_as(early, k_mv_dec<T, UPL, P, MB, FAST>, grid, 256, smem, st, a, n_sel, (int)run, (int)wps,
                   FAST ? 0 : ds4c_opt_mv_dec_sum());
    return cudaGetLastError();
}

template <class T, int UPL, bool FAST>
cudaError_t launch_dec_upl(const MVArgs &a, int n_sel, int opt, cudaStream_t st) {
    switch (opt) {
    case 1: return launch_dec_as<T, UPL, 1, 3, FAST>(a, n_sel, st);
    case 3: return launch_dec_as<T, UPL, 3, 2, FAST>(a, n_sel, st);
    default: return launch_dec_as<T, UPL, 2, 2, FAST>(a, n_sel, st);
    }
}

template <class T>
bool launch_dec(const MVArgs &a, int n_sel, bool exact, cudaStream_t st, int *rc) {
    *rc = 0;
    if constexpr (!has_reg<T>::value) {
        return false;
    } else {
        const int opt = ds4c_opt_mv_dec();
        if (opt <= 0 || a.cols % (32 * T::VPU) != 0 || a.cols % block_vals<T>() != 0) return false;
        if ((int64_t)n_sel * a.rows > INT32_MAX / 4) return false;
        cudaError_t e;
        const bool fast = !exact && (ds4c_opt_mv_fast() & 2) != 0;
        switch (a.cols / (32 * T::VPU)) {
        case 1: e = fast ? launch_dec_upl<T, 1, true>(a, n_sel, opt, st) : launch_dec_upl<T, 1, false>(a, n_sel, opt, st); break;
        case 2: e = fast ? launch_dec_upl<T, 2, true>(a, n_sel, opt, st) : launch_dec_upl<T, 2, false>(a, n_sel, opt, st); break;
        default: return false;
        }
        if (e != cudaSuccess) *rc = ds4c_cuda_err(e, "decode matvec");
        return true;
    }
}

template <class T, int NT, bool EX>
int launch_nt(const MVArgs &a, int n_sel, int S, int RPW, cudaStream_t st) {
    if constexpr (NT >= 2 && NT <= 4 && !EX) { // fast mode's passes of 2-4 tokens: split-K for short matrices (launch_type)
        switch (S) {
        case 8: return launch_one<T, NT, 8, 1, EX>(a, n_sel, st);
        case 4: return launch_one<T, NT, 4, 1, EX>(a, n_sel, st);
        case 2: return launch_one<T, NT, 2, 1, EX>(a, n_sel, st);
        }
    }
    if constexpr (NT == 1) {
        switch (S) {
        case 8: return launch_one<T, NT, 8, 1, EX>(a, n_sel, st);
        case 4: return launch_one<T, NT, 4, 1, EX>(a, n_sel, st);
        case 2: return launch_one<T, NT, 2, 1, EX>(a, n_sel, st);
        }
        switch (RPW) {
        case 8: return launch_one<T, NT, 1, 8, EX>(a, n_sel, st);
        case 4: return launch_one<T, NT, 1, 4, EX>(a, n_sel, st);
        case 2: return launch_one<T, NT, 1, 2, EX>(a, n_sel, st);
        }
    }
    return launch_one<T, NT, 1, 1, EX>(a, n_sel, st);
}

// for_pieces calls launch(b, std::integral_constant<int, NT>{}) for each
// piece of up to 8 of the nt tokens (NT its token count), b being a with the
// activation and output advanced to the piece; it stops at the first error.
template <class L>
int for_pieces(const MVArgs &a, int nt, L launch) {
    for (int t0 = 0; t0 < nt; t0 += 8) {
        MVArgs b = a;
        b.act = a.act + t0 * a.act_tok;
        b.y = a.y + t0 * a.y_tok;
        int rc = 0;
        switch (nt - t0 >= 8 ? 8 : nt - t0) {
        case 1: rc = launch(b, std::integral_constant<int, 1>{}); break;
        case 2: rc = launch(b, std::integral_constant<int, 2>{}); break;
        case 3: rc = launch(b, std::integral_constant<int, 3>{}); break;
        case 4: rc = launch(b, std::integral_constant<int, 4>{}); break;
        case 5: rc = launch(b, std::integral_constant<int, 5>{}); break;
        case 6: rc = launch(b, std::integral_constant<int, 6>{}); break;
        case 7: rc = launch(b, std::integral_constant<int, 7>{}); break;
        default: rc = launch(b, std::integral_constant<int, 8>{}); break;
        }
        if (rc) return rc;
    }
    return 0;
}

template <class T, bool EX>
int launch_chunks(const MVArgs &a, int n_sel, int nt, int S, int RPW, cudaStream_t st) {
    if (nt >= 16) { // all full pieces of 8 tokens in one grid, then the rest
        const int pieces = min(nt / 8, 65535);
        int rc = launch_one<T, 8, 1, 1, EX>(a, n_sel, st, pieces);
        if (rc) return rc;
        MVArgs b = a;
        b.act = a.act + (int64_t)pieces * 8 * a.act_tok;
        b.y = a.y + (int64_t)pieces * 8 * a.y_tok;
        return nt > pieces * 8 ? launch_chunks<T, EX>(b, n_sel, nt - pieces * 8, S, RPW, st) : 0;
    }
    return for_pieces(a, nt, [&](const MVArgs &b, auto k) {
        return launch_nt<T, decltype(k)::value, EX>(b, n_sel, S, RPW, st);
    });
}

// ---------------------------------------------------------------- pipelined single-token products
// DS4_MV_PROBE (a build flag for measurement, off in every shipped build):
// every thread of k_mv_pipe_q8f stamps clock64 at its phases — entry, the
// wait for the previous kernel done, the start done (the activation
// formed, the tiles after the wait requested), and per tile: its bytes
// landed, the CTA's barrier passed, the next copies requested, its items
// formed, the previous tile's row sums stored — then the exit; thread 0
// adds its deltas to per-site device sums, and lane 0 of the last warp its
// items, barrier, bytes waits and row sums (site by shape: 0 q_b's 1024 columns, 1 wo_b's
// 8192, 2 wo_a's 4096 × 8 selections, 3 the other 4096-column ones, 4 2048
// columns; the head's rows none). Every 1024th call of a site, CTA 0
// prints the means in µs at 1.98 GHz: a CTA's entry → wait, start, tail,
// wait → exit and the share that arrived after the wait was satisfied
// (less than 600 cycles from entry to its end), and on a second line the
// shares of CTAs by entry → wait (< 0.3, 1, 3, 6, 10 µs, more: how long
// before the kernel ahead completed they became resident), on a third
// their shares by wait → exit (< 4, 6, 8, 10, 12, 16 µs, more: the tail
// the product's end waits for); a tile's stall, barrier,
// requests, items and row sums; the last warp's items, barrier, bytes
// wait and row sums. cuda/NOTES.md v40 and v41 read them.
#ifdef DS4_MV_PROBE
} // namespace ds4mv
#include <cstdio>
namespace ds4mv {
static __device__ unsigned long long g_mvp_sum[5][16], g_mvp_n[5], g_mvp_hist[5][6], g_mvp_exit[5][7], g_mvp_w9[5][4];
__device__ __forceinline__ unsigned long long mvp_now() { return (unsigned long long)clock64(); }
// mvp_bucket is the index of the first of the N edges (cycles) that v is
// below, N when none: a probe histogram's bucket.
template <int N>
__device__ __forceinline__ int mvp_bucket(unsigned long long v, const unsigned (&edges)[N]) {
    int b = 0;
    while (b < N && v >= edges[b]) b++;
    return b;
}
#define MVP(x) x
#else
#define MVP(x)
#endif

// k_mv_pipe: one token's product with weights streamed through shared
// memory. Each CTA stays resident for the whole product and walks its own
// contiguous range of tiles (RT consecutive rows of one selection's matrix;
// RT as large as lets DS4C_OPT_MV_PIPE CTAs share an SM). A tile's bytes of
// every weight region (T::NREG: quants, scales, …; each contiguous over
// consecutive rows) are copied into one of p.ns stages, p.ns−1 tiles ahead of
// the tile being computed, so the SM keeps loads in flight while it forms
// block terms. The copies (CP): 16-byte cp.async by every thread (0; 1 with
// L2's 256-byte fetch hint), or one bulk copy per region by one thread,
// completing on the stage's mbarrier (2, the default). Without ids the first
// tiles are requested before the wait for the previous kernel (weights are
// never written by it). The selection's activation row is copied to shared
// memory (read from L1/L2 by every tile, it held the arithmetic back). Terms
// and their order are those of k_matvec's exact path (the same T::load/T::dot
// on the staged bytes, one thread per row adding the terms in block order):
// bit-identical results. A tile's row sums run while the next tile's terms
// are formed, by the last warp alone when rows are long.
constexpr int PIPE_MAX_STAGES = 8; // (PIPE_BARS / 8 barriers)
constexpr int PIPE_THREADS = 256;
constexpr int PIPE_UNITS = 4; // units a thread loads before computing
constexpr int PIPE_BARS = 64; // bytes for the stages' mbarriers at the start of shared memory

struct PipeArgs {
    MVArgs a;
    int rt;         // rows per tile
    int tiles;      // tiles per selection
    int total;      // tiles of all selections
    int terms_off;  // byte offset of the terms: two buffers of [rt][tstride] (after the barriers and the IQ2 codebook)
    int stage_off;  // byte offset of stage 0
    int stage;      // bytes per stage
    int64_t base[3]; // region k of the tensor begins at a.w + base[k]
    int bpr[3];      // … and holds bpr[k] bytes per row
    int soff[3];     // … staged at soff[k] within a stage
    int timing;      // timing experiments (DS4C_OPT_MV_TIMING): 1 skips the arithmetic, 2 the ordered sums
    int act_off;     // byte offset of the activation row's copy
    int act_bytes;   // its bytes (a multiple of 16; in shared memory T::ACT_PAD more per 64 values)
    int ush;         // log2 of the units per row
    int tstride;     // floats between rows of terms (nb + 4: rows on different banks)
    int tw;          // 1: the last warp adds the row sums while the others form terms
    int ns;          // stages (3..PIPE_MAX_STAGES)
    // ds4c_matvec_f32 (Q8_0, one selection): the float row the CTAs quantize
    // into their activation copy themselves (pipe_act_f32), after RMSNorm
    // with weights nw and eps when nw is set; null: a.act is copied. xf_n
    // rows (the tokens: 1, or 2 for k_mv_pipe_q8f<2, 2>) a.cols floats apart.
    const float *xf;
    const float *nw;
    float eps;
    int xf_n;
    int pre; // tiles requested before the wait for the previous kernel (DS4C_OPT_MV_PRE; products without ids)
    int ilp; // k_mv_pipe_q8f: items a warp forms at once (q8f_items; 1: one after another)
    int sumw; // k_mv_pipe_q8f: the last warp adds the row sums (DS4C_OPT_MV_SUMW; segments dividing the warps)
    int pack; // k_mv_pipe_q8f, fast mode, 3-4 tokens: the tokens' trees packed (q8f_items4; DS4C_OPT_MV_TWO bit 16)
    // k_mv_pipe_q8f (ds4c_matmul_q8out): each CTA's tiles are one whole
    // block of 32 rows of one selection, and the CTA also writes that
    // block of y as the Q8_0 activation yq of the row of yq_n values
    // y[0 … yq_n) (quants, then the float scales; ds4c_quantize's bytes;
    // NT = 2: token t's row at yq + t·yq_tok, from its y at a.y_tok);
    // null: y only
    uint8_t *yq;
    int yq_n;
    // k_mv_pipe_q8f<CP, 2> (ds4c_matmul_ex of two tokens, fast mode): the
    // tokens' activation copies act_stride bytes apart in shared memory;
    // their partials [2][NT][rt][nseg]
    int act_stride;
    int yq_tok; // (yq, NT = 2: the bytes from token 0's activation row to token 1's)
};

// pipe_act_f32 writes the Q8_0 activation row of RMSNorm(xf) (p.nw set)
// or of xf (a row of p.xf) to s_act, the bytes ds4c_rmsnorm_ref then ds4c_quantize give:
// the float64 squares summed in k_rmsnorm_ref's order (thread t adds values
// t, t + 256, … in turn; block_sum_d over the CTA's 256 threads), each value
// normalised with its two roundings, then k_quant_q8_0_v's layout and
// operations (8 values a thread, 4 threads a block). Every CTA of the
// product does it for itself; each thread's loads of a pass are issued
// together (4 floats for the squares, up to 4 × 8 for the blocks).
__device__ __forceinline__ void pipe_act_f32(const PipeArgs &p, const float *xf, uint8_t *s_act) {
    const int n = p.a.cols, tid = threadIdx.x;
    // (a summing warp past PIPE_THREADS, k_mv_pipe_q8f's W9, forms nothing:
    // its zero joins block_sum_d's serial sum last, leaving it unchanged)
    const bool former = tid < PIPE_THREADS;
    float r = 0.f;
    if (p.nw) {
        double ss = 0;
        for (int i0 = tid; former && i0 < n; i0 += 4 * PIPE_THREADS) {
            float v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = i0 + k * PIPE_THREADS < n ? xf[i0 + k * PIPE_THREADS] : 0.f;
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (i0 + k * PIPE_THREADS < n) ss += (double)v[k] * (double)v[k];
        }
        ss = block_sum_d(ss);
        r = rms_from_sumsq(ss, n, p.eps);
    }
    constexpr int GB = PIPE_THREADS / 4; // blocks a pass of the CTA
    const int nb = n / 32, part = tid & 3;
    for (int b0 = tid >> 2; former && b0 - (tid >> 2) < nb; b0 += 4 * GB) {
        float v[4][8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int b = b0 + k * GB;
            if (b < nb) {
                const float4 *x4 = (const float4 *)(xf + b * 32 + part * 8);
                const float4 a0 = __ldg(x4), a1 = __ldg(x4 + 1);
                v[k][0] = a0.x, v[k][1] = a0.y, v[k][2] = a0.z, v[k][3] = a0.w;
                v[k][4] = a1.x, v[k][5] = a1.y, v[k][6] = a1.z, v[k][7] = a1.w;
                if (p.nw) {
                    const float4 *w4 = (const float4 *)(p.nw + b * 32 + part * 8);
                    const float4 c0 = __ldg(w4), c1 = __ldg(w4 + 1);
                    const float w[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
                    for (int i = 0; i < 8; i++) v[k][i] = __fmul_rn(w[i], __fmul_rn(v[k][i], r));
                }
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) v[k][i] = 0.f;
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int b = b0 + k * GB;
            if (b0 - (tid >> 2) + k * GB >= nb) break; // (uniform over the CTA)
            float amax = fabsf(v[k][0]);
#pragma unroll
            for (int i = 1; i < 8; i++) amax = fmaxf(amax, fabsf(v[k][i]));
            amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 2));
            if (b < nb) {
                const float id = q8_0_inv(amax);
                int q[8];
#pragma unroll
                for (int i = 0; i < 8; i++) q[i] = q8_0_round(v[k][i], id);
                *(int2 *)(s_act + b * 32 + part * 8) = pack8(q);
                if (part == 0) ((float *)(s_act + n))[b] = q8_0_scale(amax);
            }
        }
    }
    __syncthreads();
}

// pipe_mat returns selection sel's matrix (−1: an invalid id).
__device__ __forceinline__ int64_t pipe_mat(const MVArgs &a, int sel) {
    const int64_t mat = a.ids ? (int64_t)a.ids[sel] : (a.sel_mat ? sel : 0);
    return mat >= 0 && mat < a.n_mat ? mat : -1;
}

// pipe_tile: tile k of the CTA whose tiles begin at t0 — its selection,
// first row and rows; it returns the selection's matrix (−1: an invalid id).
__device__ __forceinline__ int64_t pipe_tile(const PipeArgs &p, int t0, int k, int &sel, int &r0, int &nr) {
    const MVArgs &a = p.a;
    const int t = t0 + k;
    sel = t / p.tiles;
    r0 = (t % p.tiles) * p.rt;
    nr = min(p.rt, a.rows - r0);
    return pipe_mat(a, sel);
}

// pipe_issue requests tile k (of my, from t0) into stage k mod p.ns: one
// bulk copy a region by thread 0 completing on the stage's mbarrier (CP 2;
// an invalid id completes the phase with nothing to copy), or 16-byte
// cp.async by every thread, one commit group a tile even when empty (CP
// 0, 1).
template <class T, int CP>
__device__ __forceinline__ void pipe_issue(const PipeArgs &p, uint8_t *s_mem, int t0, int my, int k) {
    const MVArgs &a = p.a;
    const int tid = threadIdx.x;
    if (k < my && (CP < 2 || tid == 0)) {
        int sel, r0, nr;
        const int64_t mat = pipe_tile(p, t0, k, sel, r0, nr);
        uint8_t *stg = s_mem + p.stage_off + (k % p.ns) * p.stage;
        const int64_t grow = mat * a.rows + r0;
        if (CP == 2) {
            uint64_t *bar = (uint64_t *)s_mem + k % p.ns;
            if (mat < 0) {
                bar_expect(bar, 0); // completes the phase: nothing to copy
            } else {
                unsigned bytes = 0;
#pragma unroll
                for (int r = 0; r < T::NREG; r++) bytes += (unsigned)(nr * p.bpr[r]);
#ifndef DS4_MV_NOFENCE // (a build flag for measurement only: cuda/NOTES.md v40's next lead)
                bulk_fence();
#endif
                bar_expect(bar, bytes);
#pragma unroll
                for (int r = 0; r < T::NREG; r++)
                    bulk_copy(stg + p.soff[r], a.w + p.base[r] + grow * p.bpr[r], (unsigned)(nr * p.bpr[r]), bar);
            }
        } else if (mat >= 0) {
#pragma unroll
            for (int r = 0; r < T::NREG; r++) {
                const uint8_t *src = a.w + p.base[r] + grow * p.bpr[r];
                const int n16 = nr * p.bpr[r] / 16;
                for (int i = tid; i < n16; i += PIPE_THREADS) {
                    if (CP == 1)
                        cp_async16_l2(stg + p.soff[r] + 16 * i, src + 16 * i);
                    else
                        cp_async16(stg + p.soff[r] + 16 * i, src + 16 * i);
                }
            }
        }
    }
    if (CP < 2) cp_async_commit(); // one group per tile, even an empty one
}

// pipe_start is a pipelined product's start, k_mv_pipe's and
// k_mv_pipe_q8f's: the stages' barriers (bulk copies), the early launch of
// the next kernel, the tiles requested before and after the wait for the
// previous one (whose results the activation is), the IQ2 codebook into
// s_grid (T::GRID), the activation row formed from p.xf (Q8_0) or, for
// tile 0, copied by copy_act(sel) — its loads beside the tiles in flight.
// cur_act is the activation row in shared memory afterwards (-1: none).
template <class T, int CP, class CopyAct>
__device__ __forceinline__ void pipe_start(const PipeArgs &p, uint8_t *s_mem, int t0, int my, uint64_t *s_grid,
                                           int &cur_act, CopyAct &&copy_act, unsigned long long *probe = nullptr) {
    const MVArgs &a = p.a;
    const int tid = threadIdx.x;
    if (CP == 2) {
        if (tid == 0)
            for (int s = 0; s < p.ns; s++) bar_init((uint64_t *)s_mem + s, 1);
        __syncthreads();
    }
    mv_pdl_launch(a);
    const int pre = a.ids ? 0 : min(p.pre, p.ns - 1); // tiles requested before the wait
    for (int k = 0; k < pre; k++) pipe_issue<T, CP>(p, s_mem, t0, my, k);
    // the RMSNorm weights (never written by the kernel before) into L1
    // before the wait: pipe_act_f32's second pass then waits on no L2
    // round trip of its own (cuda/NOTES.md v41)
    if (std::is_same<T, TQ8_0>::value && p.xf && p.nw)
        for (int i = tid * 32; tid < PIPE_THREADS && i < a.cols; i += PIPE_THREADS * 32) prefetch_l1(p.nw + i);
    mv_pdl_wait(a);
    MVP(if (probe) *probe = mvp_now();)
    if (T::GRID)
        for (int i = tid; i < 256; i += PIPE_THREADS) s_grid[i] = iq2xxs_grid[i];
    cur_act = -1;
    if constexpr (std::is_same<T, TQ8_0>::value) {
        if (p.xf) { // (one selection: the loop finds its row(s) in place; tokens act_stride apart)
            for (int t = 0; t < p.xf_n; t++) pipe_act_f32(p, p.xf + (int64_t)t * p.a.cols, s_mem + p.act_off + t * p.act_stride);
            cur_act = 0;
        }
    }
    for (int k = pre; k < p.ns - 1; k++) pipe_issue<T, CP>(p, s_mem, t0, my, k);
    if (my > 0 && cur_act < 0) {
        int sel, r0, nr;
        pipe_tile(p, t0, 0, sel, r0, nr);
        copy_act(sel);
    }
}

// PipePrev is the tile whose row sums a pipelined product adds while it
// computes the next one.
struct PipePrev {
    int sel = 0, r0 = 0, nr = 0;
    bool ok = false;
};

template <class T, int CP>
__global__ void __launch_bounds__(PIPE_THREADS) k_mv_pipe(PipeArgs p) {
    extern __shared__ __align__(16) uint8_t s_mem[];
    const MVArgs &a = p.a;
    uint64_t *s_bar = (uint64_t *)s_mem;
    uint64_t *s_grid = (uint64_t *)(s_mem + PIPE_BARS);
    float *s_terms = (float *)(s_mem + p.terms_off);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nb = a.cols / block_vals<T>();
    const int upr = 1 << p.ush; // units per row (a power of two, at least 32)
    // this CTA's tiles: a contiguous range (selections change rarely)
    const int G = gridDim.x;
    const int t0 = (int)((int64_t)blockIdx.x * p.total / G);
    const int my = (int)((int64_t)(blockIdx.x + 1) * p.total / G) - t0;
    uint8_t *s_act = s_mem + p.act_off;
    int cur_act; // the activation row in s_act
    auto tile = [&](int k, int &sel, int &r0, int &nr) -> int64_t { return pipe_tile(p, t0, k, sel, r0, nr); };
    auto issue = [&](int k) { pipe_issue<T, CP>(p, s_mem, t0, my, k); };
    auto copy_act = [&](int sel) { // the selection's activation row into shared memory
        cur_act = sel / a.act_div;
        const uint8_t *src = a.act + (int64_t)cur_act * a.act_sel;
        for (int i = tid; i < p.act_bytes / 16; i += PIPE_THREADS) { // (padded: act_at; the tail after the last pad)
            const int o = 16 * i, q = min(o, a.cols);
            *(int4 *)(act_at<T::ACT_PAD>(s_act, q) + (o - q)) = ld16(src + o);
        }
    };
    pipe_start<T, CP>(p, s_mem, t0, my, s_grid, cur_act, copy_act);
    const float nan = __int_as_float(0x7fc00000);
    // Tile k's terms go to buffer k & 1; its row sums are added while tile
    // k+1 is computed (by the last warp alone when rows are long: p.tw).
    const int cw = PIPE_THREADS / 32 - p.tw; // warps that form terms
    PipePrev prev;
    auto sums = [&](int k) { // row sums of tile k (its terms complete)
        const int i = p.tw ? (warp == cw ? lane : PIPE_THREADS) : tid;
        if (i < prev.nr) {
            const float *tm = s_terms + (size_t)(k & 1) * p.rt * p.tstride + (size_t)i * p.tstride;
            float sum = p.timing ? tm[0] : ordered_sum(tm, nb);
            if (T::FINAL != 1.0f) sum = __fmul_rn(T::FINAL, sum);
            a.y[prev.sel * a.y_sel + prev.r0 + i] = prev.ok ? sum : nan;
        }
    };
    for (int k = 0; k < my; k++) {
        if (CP == 2)
            bar_wait(s_bar + k % p.ns, (unsigned)(k / p.ns) & 1);
        else if (p.ns == 3) // tile k's copies (this thread's) have landed: ns − 2 newer groups may be pending
            cp_async_wait<1>();
        else if (p.ns == 4)
            cp_async_wait<2>();
        else
            cp_async_wait<0>();
        __syncthreads(); // … and everyone's, tile k−1's terms are formed and its stage is free
        issue(k + p.ns - 1);
        int sel, r0, nr;
        const int64_t mat = tile(k, sel, r0, nr);
        const uint8_t *stg = s_mem + p.stage_off + (k % p.ns) * p.stage;
        if (sel / a.act_div != cur_act) { // the next selection's row (tile 0's came before the loop)
            copy_act(sel);
            __syncthreads();
        }
        float *terms = s_terms + (size_t)(k & 1) * p.rt * p.tstride;
        if (mat >= 0 && p.timing != 1 && warp < cw) {
            const int nu = nr * upr, nt = cw * 32;
            for (int b0 = 0; b0 < nu; b0 += nt * PIPE_UNITS) {
                typename T::Unit u[PIPE_UNITS];
#pragma unroll
                for (int c = 0; c < PIPE_UNITS; c++) {
                    const int ut = b0 + c * nt + tid;
                    if (b0 + c * nt + warp * 32 < nu) { // uniform over the warp (nu % 32 == 0)
                        const int rl = ut >> p.ush;
                        const uint8_t *rp[3] = {stg + p.soff[0] + rl * p.bpr[0], stg + p.soff[1] + rl * p.bpr[1],
                                                stg + p.soff[2] + rl * p.bpr[2]};
                        typename T::Row rr;
                        T::srow(rr, rp);
                        T::load(u[c], rr, ut & (upr - 1), WL_GENERIC);
                    }
                }
#pragma unroll
                for (int c = 0; c < PIPE_UNITS; c++) {
                    const int ut = b0 + c * nt + tid;
                    if (b0 + c * nt + warp * 32 < nu) {
                        float acc[1] = {0.f};
                        T::template dot<1, true, true>(u[c], ut & (upr - 1), true, s_act, 0, a.cols, acc, lane, s_grid,
                                                       terms + (size_t)(ut >> p.ush) * p.tstride, nb);
                    }
                }
            }
        }
        if (k > 0) sums(k - 1);
        prev = {sel, r0, nr, mat >= 0};
    }
    __syncthreads();
    if (my > 0) sums(my - 1);
    if (CP < 2) cp_async_wait<0>();
}

// k_mv_pipe_q8f: fast mode's pipelined Q8_0 product (DS4C_OPT_MV_FAST;
// bulk copies only). The staging is k_mv_pipe's (pipe_tile, pipe_issue,
// the activation row in shared memory); the arithmetic sums in parallel,
// not in quant.Dot's block order. A tile's rows are cut into items of
// Q8F_SEG values (32 blocks), a warp taking items w, w + 8, …: lane l
// forms the dp4a sum of one block of the item (the even lane block l/2,
// the odd 16 + l/2: q8f_blk) and scales it, and the warp's tree sum is the
// item's partial, stored in its (row, segment) slot. After the tile's
// barrier one thread a row adds its partials in segment order: the same
// bits run to run. A warp keeps its
// segment's activation units and scales in registers while its segment
// and the selection stay (always, when the segments divide the 8 warps).
// Per 32 weight bytes this is about a third of k_mv_pipe's instructions,
// whose terms written and summed in order made it arithmetic-bound (≈ 5 µs
// a product over its copies alone; cuda/NOTES.md v21, v27).
constexpr int Q8F_SEG = 1024;

// A lane's share of a segment: the 32 blocks are scaled by the lanes in the
// order q8f_blk gives (even lane l block l/2, odd lane 16 + l/2: warp_sum's
// tree adds them in that order), and lane l loads both 16-byte halves of its
// own block, unit q8f_u0 first, then q8f_u1 (units are 16 bytes). The half
// it loads first is its lane's parity: the 8 lanes of a quarter-warp then
// read 8 different 16-byte bank groups in each of the two loads (0 … 7 and
// 1, 0, 3, 2, …), with the rows of a tile cols bytes apart (a multiple of
// 128). Until v54 lane l loaded units l and l + 32 (the halves of two
// blocks) and a shuffle added each block's two halves; the integer sums
// are the same, so the same bits.
__device__ __forceinline__ int q8f_blk(int lane) { return (lane >> 1) + (lane & 1) * 16; }
__device__ __forceinline__ int q8f_u0(int lane) { return 2 * q8f_blk(lane) + (lane & 1); }
__device__ __forceinline__ int q8f_u1(int lane) { return 2 * q8f_blk(lane) + 1 - (lane & 1); }

// q8f_sums forms U items' partials from their units (the two halves of
// the lane's block, w0/w1, and its scale d: q8f_u0, q8f_u1) and the warp's
// activation units x0/x1 (the same halves) and scale xd: the dp4a sums of
// the block, scaled, and warp_sum's tree with the U items' steps
// interleaved — the operations of k_mv_pipe_q8f's items (ds4c_chain_q8's
// too: chain.cu).
template <int U>
__device__ __forceinline__ void q8f_sums(const int4 (&w0)[U], const int4 (&w1)[U], const __half (&d)[U], int4 x0,
                                         int4 x1, float xd, float (&v)[U]) {
#pragma unroll
    for (int j = 0; j < U; j++) {
        const int sum = dot4(w1[j], x1, dot4(w0[j], x0, 0)); // (integers: any order, the same sum)
        v[j] = (float)sum * (__half2float(d[j]) * xd);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) // warp_sum's tree, the U items' steps interleaved
#pragma unroll
        for (int j = 0; j < U; j++) v[j] += __shfl_xor_sync(FULL_MASK, v[j], o);
}

// q8f_items forms a tile's items as k_mv_pipe_q8f's loop does, U of the
// warp's items at once (items it, it + 8, …, it + 8(U − 1)): their loads,
// dp4a sums and tree sums interleaved, so that a warp waits on one chain
// of shared-memory loads and shuffles for U items instead of U chains one
// after another (DS4C_OPT_MV_ILP). Every item's operations and order are
// the loop's: the same bits. The warp's segment is fixed (the segments
// divide the 8 warps: item it's segment is it mod nseg = warp mod nseg);
// qs points at that segment's quants of row 0 of the tile and ds at the
// lane's block scale there (rows cols bytes and dstride halves apart).
// q8f_load loads the lane's units (w0, w1: q8f_u0, q8f_u1) and block scale
// (d) of the U items it0, it0 + 8, … of a tile (zeros past items), as
// q8f_items and q8f_items2 consume them.
template <int U>
__device__ __forceinline__ void q8f_load(int it0, int items, int nsh, int lane, const uint8_t *qs, const __half *ds,
                                         int cols, int dstride, int4 (&w0)[U], int4 (&w1)[U], __half (&d)[U]) {
    const int o0 = 16 * q8f_u0(lane), o1 = 16 * q8f_u1(lane);
#pragma unroll
    for (int j = 0; j < U; j++) {
        const int row = (it0 + 8 * j) >> nsh;
        if (it0 + 8 * j < items) { // (uniform over the warp)
            const uint8_t *q = qs + (size_t)row * cols;
            w0[j] = *(const int4 *)(q + o0);
            w1[j] = *(const int4 *)(q + o1);
            d[j] = ds[(size_t)row * dstride];
        } else {
            w0[j] = w1[j] = make_int4(0, 0, 0, 0);
            d[j] = __float2half(0.f);
        }
    }
}

template <int U>
__device__ __forceinline__ void q8f_items(int items, int nsh, int warp, int lane, const uint8_t *qs, const __half *ds,
                                          int cols, int dstride, int4 x0, int4 x1, float xd, float *part) {
    const int nseg = 1 << nsh, seg = warp & (nseg - 1);
    for (int it0 = warp; it0 < items; it0 += 8 * U) {
        int4 w0[U], w1[U];
        __half d[U];
        q8f_load<U>(it0, items, nsh, lane, qs, ds, cols, dstride, w0, w1, d);
        float v[U];
        q8f_sums<U>(w0, w1, d, x0, x1, xd, v);
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < U; j++)
                if (it0 + 8 * j < items) part[((it0 + 8 * j) >> nsh) * nseg + seg] = v[j];
    }
}

// q8e_items is q8f_items for exact mode (k_mv_pipe_q8f<CP, NT, true>):
// the same items, loads and dp4a sums, but each lane's block term —
// k_mv_pipe's, TQ8_0::dot's roundings — is stored in its row's terms
// (terms + row · tstride, the block's index in the row) instead of entering
// a tree; the rows are then added in block order (ordered_sum). NT = 2:
// each weight item loaded once, its units multiplied with both tokens'
// activation units (x0/x1/xd[t]), token t's terms at terms + t·tterm: each
// token's operations those of a one-token product, so the same bits.
template <int U, int NT>
__device__ __forceinline__ void q8e_items(int items, int nsh, int warp, int lane, const uint8_t *qs, const __half *ds,
                                          int cols, int dstride, const int4 (&x0)[NT], const int4 (&x1)[NT],
                                          const float (&xd)[NT], float *terms, int tstride, int tterm) {
    const int nseg = 1 << nsh, col = (warp & (nseg - 1)) * 32 + q8f_blk(lane);
    for (int it0 = warp; it0 < items; it0 += 8 * U) {
        int4 w0[U], w1[U];
        __half d[U];
        q8f_load<U>(it0, items, nsh, lane, qs, ds, cols, dstride, w0, w1, d);
#pragma unroll
        for (int j = 0; j < U; j++)
            if (it0 + 8 * j < items) {
                float *tm = terms + (size_t)((it0 + 8 * j) >> nsh) * tstride + col;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const int sum = dot4(w1[j], x1[t], dot4(w0[j], x0[t], 0)); // (integers: TQ8_0::dot's sum)
                    tm[t * tterm] = __fmul_rn((float)sum, __fmul_rn(__half2float(d[j]), xd[t]));
                }
            }
    }
}

// q8f_sums2 is q8f_sums for two tokens' activations (x0/x1/xd[t]) with
// their trees packed: at the tree's first step (lanes l and l ^ 16) the
// lower half of the warp keeps token 0's sums and the upper half token
// 1's, each lane sending the other token's value, and the four steps after
// run once for both. v[j] is token 0's item partial on lanes 0–15, token
// 1's on lanes 16–31, each with the bits of q8f_sums for that token alone
// (the same adds, own value first, in the same tree).
template <int U>
__device__ __forceinline__ void q8f_sums2(const int4 (&w0)[U], const int4 (&w1)[U], const __half (&d)[U],
                                          const int4 (&x0)[2], const int4 (&x1)[2], const float (&xd)[2], int lane,
                                          float (&v)[U]) {
    const bool hi = lane >= 16;
#pragma unroll
    for (int j = 0; j < U; j++) {
        float vt[2];
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const int sum = dot4(w1[j], x1[t], dot4(w0[j], x0[t], 0));
            vt[t] = (float)sum * (__half2float(d[j]) * xd[t]);
        }
        v[j] = (hi ? vt[1] : vt[0]) + __shfl_xor_sync(FULL_MASK, hi ? vt[0] : vt[1], 16);
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < U; j++) v[j] += __shfl_xor_sync(FULL_MASK, v[j], o);
}

// q8f_items2 is q8f_items for two tokens: each weight item loaded once,
// its units multiplied with both tokens' activation units (x0/x1/xd[t]),
// token t's partials at part + t·tpart, both tokens' trees packed into one
// (q8f_sums2). Each token's operations and order are q8f_items's for that
// token alone: the same bits as a one-token product.
template <int U>
__device__ __forceinline__ void q8f_items2(int items, int nsh, int warp, int lane, const uint8_t *qs, const __half *ds,
                                           int cols, int dstride, const int4 (&x0)[2], const int4 (&x1)[2],
                                           const float (&xd)[2], float *part, int tpart) {
    const int nseg = 1 << nsh, seg = warp & (nseg - 1);
    for (int it0 = warp; it0 < items; it0 += 8 * U) {
        int4 w0[U], w1[U];
        __half d[U];
        q8f_load<U>(it0, items, nsh, lane, qs, ds, cols, dstride, w0, w1, d);
        float v[U];
        q8f_sums2<U>(w0, w1, d, x0, x1, xd, lane, v);
        if ((lane & 15) == 0) // lane 0 token 0's partials, lane 16 token 1's
#pragma unroll
            for (int j = 0; j < U; j++)
                if (it0 + 8 * j < items) part[(lane >> 4) * tpart + ((it0 + 8 * j) >> nsh) * nseg + seg] = v[j];
    }
}

// q8f_itemsN is q8f_items for NT = 3 or 4 tokens (fast mode's verification
// passes of deeper drafts): each weight item loaded once, its units
// multiplied with each token's activation units, each token's item sum its
// own tree (q8f_sums's), token t's partials at part + t·tpart: each token's
// operations and order those of a one-token product, so the same bits.
template <int U, int NT>
__device__ __forceinline__ void q8f_itemsN(int items, int nsh, int warp, int lane, const uint8_t *qs, const __half *ds,
                                           int cols, int dstride, const int4 (&x0)[NT], const int4 (&x1)[NT],
                                           const float (&xd)[NT], float *part, int tpart) {
    const int nseg = 1 << nsh, seg = warp & (nseg - 1);
    for (int it0 = warp; it0 < items; it0 += 8 * U) {
        int4 w0[U], w1[U];
        __half d[U];
        q8f_load<U>(it0, items, nsh, lane, qs, ds, cols, dstride, w0, w1, d);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v[U];
            q8f_sums<U>(w0, w1, d, x0[t], x1[t], xd[t], v);
            if (lane == 0)
#pragma unroll
                for (int j = 0; j < U; j++)
                    if (it0 + 8 * j < items) part[t * tpart + ((it0 + 8 * j) >> nsh) * nseg + seg] = v[j];
        }
    }
}

// q8f_sums4 is q8f_sums for three or four tokens' activations with their
// trees packed, q8f_sums2's way one level further: at the tree's first
// step (lanes l and l ^ 16) the lower half of the warp keeps tokens 0 and
// 1, the upper half 2 and 3, each lane sending the other two; at the
// second (l ^ 8) each quarter keeps one token (quarter q: token q), each
// lane sending the other; the three steps after run once for all. Six
// shuffles an item for four tokens where four trees take twenty. v[j] is
// token (lane >> 3)'s item partial, with the bits of q8f_sums for that
// token alone (the same adds, own value first, in the same tree; a
// butterfly leaves every lane the same bits). NT = 3: the fourth quarter
// sums zeros, not stored.
template <int U, int NT>
__device__ __forceinline__ void q8f_sums4(const int4 (&w0)[U], const int4 (&w1)[U], const __half (&d)[U],
                                          const int4 (&x0)[NT], const int4 (&x1)[NT], const float (&xd)[NT], int lane,
                                          float (&v)[U]) {
    static_assert(NT == 3 || NT == 4, "q8f_sums4: three or four tokens");
    const bool hi = lane >= 16, odd = (lane & 8) != 0;
#pragma unroll
    for (int j = 0; j < U; j++) {
        float vt[4];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            if (t < NT) {
                const int sum = dot4(w1[j], x1[t], dot4(w0[j], x0[t], 0));
                vt[t] = (float)sum * (__half2float(d[j]) * xd[t]);
            } else {
                vt[t] = 0.f;
            }
        }
        // (l ^ 16): the lower half keeps tokens 0 and 1, the upper 2 and 3
        const float a = (hi ? vt[2] : vt[0]) + __shfl_xor_sync(FULL_MASK, hi ? vt[0] : vt[2], 16);
        const float b = (hi ? vt[3] : vt[1]) + __shfl_xor_sync(FULL_MASK, hi ? vt[1] : vt[3], 16);
        // (l ^ 8): lanes with bit 3 clear keep the first, set the second
        v[j] = (odd ? b : a) + __shfl_xor_sync(FULL_MASK, odd ? a : b, 8);
    }
#pragma unroll
    for (int o = 4; o > 0; o >>= 1)
#pragma unroll
        for (int j = 0; j < U; j++) v[j] += __shfl_xor_sync(FULL_MASK, v[j], o);
}

// q8f_items4 is q8f_itemsN with the tokens' trees packed (q8f_sums4,
// PipeArgs.pack): lane 8t stores token t's partials. Each token's
// operations and order are q8f_items's for that token alone: the same bits.
template <int U, int NT>
__device__ __forceinline__ void q8f_items4(int items, int nsh, int warp, int lane, const uint8_t *qs, const __half *ds,
                                           int cols, int dstride, const int4 (&x0)[NT], const int4 (&x1)[NT],
                                           const float (&xd)[NT], float *part, int tpart) {
    const int nseg = 1 << nsh, seg = warp & (nseg - 1), t = lane >> 3;
    for (int it0 = warp; it0 < items; it0 += 8 * U) {
        int4 w0[U], w1[U];
        __half d[U];
        q8f_load<U>(it0, items, nsh, lane, qs, ds, cols, dstride, w0, w1, d);
        float v[U];
        q8f_sums4<U, NT>(w0, w1, d, x0, x1, xd, lane, v);
        if ((lane & 7) == 0 && t < NT)
#pragma unroll
            for (int j = 0; j < U; j++)
                if (it0 + 8 * j < items) part[t * tpart + ((it0 + 8 * j) >> nsh) * nseg + seg] = v[j];
    }
}

// NT = 2: two tokens' products of the same weights (speculative decoding's
// verification passes; NT = 3, 4: deeper drafts' — q8e_items<U, NT>, or in
// fast mode q8f_itemsN, rows of token t at i + t·nr as NT = 2's), the
// weights streamed once; each token's bits
// those of a one-token product (q8f_items2; EX: q8e_items<U, 2>, each token's
// terms in its own buffers, [NT][rt][tstride] a tile). Only
// the ilp form (segments dividing the warps), no ids (selections: one, or
// each its own matrix, as the grouped wo_a); xf: both tokens' rows formed
// by pipe_act_f32; yq: warp t quantizes token t's block.
// EX (exact mode, DS4C_OPT_MV_EXQ8; one token): the items' block terms are
// stored, two buffers of [rt][tstride] floats (q8e_items), and a tile's
// rows added in block order (ordered_sum; on the last warp's lanes with
// p.sumw, else a thread a row): k_mv_pipe's terms, order and bits, with
// the items' fewer instructions a weight byte.
// W9 (EX only; DS4C_OPT_MV_EXQ8 2): a ninth warp, which forms no items and
// copies nothing, adds tile k − 1's rows while the eight form tile k's
// items, so that a row's serial chain of cols/32 adds (128 for 4096
// columns) no longer follows the last warp's items before the next
// tile's barrier. The same terms and order: the same bits.
// MB (2-4 tokens, DS4C_OPT_MV_OCC): the registers bounded for MB CTAs an
// SM (__launch_bounds__), and two items a warp at once whatever p.ilp (the
// forms of more items hold more registers than two CTAs leave). Unbounded,
// fast mode's four-token form holds 178 registers a thread and exact
// mode's two-token one with its summing warp 115 (nvcc 11.8): one CTA an
// SM, where the launch sizes the tiles for two. The items' operations and
// order are U = 2's: the same bits. MB = 0: no bound, nvcc's own choice (a
// bound of one CTA lets it take more registers than that, and the forms
// ran slower: cuda/NOTES.md v71).
template <int CP, int NT = 1, bool EX = false, bool W9 = false, int MB = 0>
__global__ void __launch_bounds__(PIPE_THREADS + (W9 ? 32 : 0), MB) k_mv_pipe_q8f(PipeArgs p) {
    static_assert(NT >= 1 && NT <= 4, "k_mv_pipe_q8f: one to four tokens");
    static_assert(MB == 0 || NT >= 2, "k_mv_pipe_q8f: bounded registers for few-token forms only");
    static_assert(!W9 || EX, "k_mv_pipe_q8f: a summing warp for exact terms");
    extern __shared__ __align__(16) uint8_t s_mem[];
    __shared__ float s_yq[NT][32]; // p.yq: the CTA's block of each token's y
    const MVArgs &a = p.a;
    uint64_t *s_bar = (uint64_t *)s_mem;
    float *s_part = (float *)(s_mem + p.terms_off); // two buffers of [rt][nseg]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bool former = !W9 || tid < PIPE_THREADS; // (W9: not the summing warp)
    const int nseg = a.cols / Q8F_SEG;
    // an item's row and segment by a shift and a mask where nseg is a power
    // of two (Flash's 1, 4 and 8), not a division (≈ 20 instructions an
    // item of ≈ 50: the loop is issue-bound, cuda/NOTES.md v35)
    const int nsh = (nseg & (nseg - 1)) == 0 ? __ffs(nseg) - 1 : -1;
    const int G = gridDim.x;
    const int t0 = (int)((int64_t)blockIdx.x * p.total / G);
    const int my = (int)((int64_t)(blockIdx.x + 1) * p.total / G) - t0;
    uint8_t *s_act = s_mem + p.act_off;
    int cur_act; // the activation row in s_act
    auto copy_act = [&](int sel) { // the selection's activation row(s) into shared memory
        cur_act = sel / a.act_div;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint8_t *src = a.act + (int64_t)cur_act * a.act_sel + (int64_t)t * a.act_tok;
            uint8_t *dst = s_act + t * p.act_stride;
            // a thread's loads (up to 4 of 16 bytes a pass) all issued before
            // its stores: one L2 round trip for rows up to 16 KB, where a load
            // a pass waited on each before the next (wo_a's 4.6 KB: two;
            // cuda/NOTES.md v41)
            const int n16 = p.act_bytes / 16;
            for (int i0 = tid; former && i0 < n16; i0 += 4 * PIPE_THREADS) {
                int4 v[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (i0 + j * PIPE_THREADS < n16) v[j] = ld16(src + 16 * (i0 + j * PIPE_THREADS));
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (i0 + j * PIPE_THREADS < n16) *(int4 *)(dst + 16 * (i0 + j * PIPE_THREADS)) = v[j];
            }
        }
    };
    static_assert(CP == 2, "k_mv_pipe_q8f: bulk copies only");
#ifdef DS4_MV_PROBE
    const int site = a.cols == 1024 ? 0
                     : a.cols == 8192 ? 1
                     : a.cols == 4096 && p.total * p.rt >= 8192 && a.rows <= 8192 ? 2
                     : a.cols == 4096 && a.rows <= 1024 ? 3
                     : a.cols == 2048 ? 4 : -1;
    unsigned long long mv_t[16] = {0}, t_wait = 0;
    const unsigned long long t_entry = mvp_now();
    unsigned long long t_last = 0;
#endif
#ifdef DS4_MV_PROBE
    pipe_start<TQ8_0, CP>(p, s_mem, t0, my, nullptr, cur_act, copy_act, &t_wait);
#else
    pipe_start<TQ8_0, CP>(p, s_mem, t0, my, nullptr, cur_act, copy_act);
#endif
    MVP(t_last = mvp_now(); mv_t[0] = t_wait - t_entry; mv_t[1] = t_last - t_wait;)
    const float nan = __int_as_float(0x7fc00000);
    // the warp's activation: the halves of the lane's block of segment xseg
    // (units q8f_u0, q8f_u1), and that block's scale (blk)
    const int blk = q8f_blk(lane), xo0 = 16 * q8f_u0(lane), xo1 = 16 * q8f_u1(lane);
    int xseg = -1;
    int4 x0 = make_int4(0, 0, 0, 0), x1 = x0;
    float xd = 0.f;
    int4 x0t[NT], x1t[NT]; // NT = 2: both tokens' (x0, x1, xd)
    float xdt[NT];
    auto load_x = [&](int seg) { // the warp's activation units of segment seg, unless it holds them
        if (seg == xseg) return;
        xseg = seg;
        if constexpr (NT == 1) {
            const uint8_t *xa = s_act + seg * Q8F_SEG;
            x0 = *(const int4 *)(xa + xo0);
            x1 = *(const int4 *)(xa + xo1);
            xd = ((const float *)(s_act + a.cols))[seg * 32 + blk];
        } else {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const uint8_t *xa = s_act + t * p.act_stride + seg * Q8F_SEG;
                x0t[t] = *(const int4 *)(xa + xo0);
                x1t[t] = *(const int4 *)(xa + xo1);
                xdt[t] = ((const float *)(s_act + t * p.act_stride + a.cols))[seg * 32 + blk];
            }
        }
    };
    PipePrev prev;
    // tile t0 + k's selection and index within it, advanced a tile at a
    // time (pipe_tile's division and modulo once, not every tile; the
    // selection's activation row looked up only when the selection changes)
    int w_sel = t0 / p.tiles, w_ti = t0 - w_sel * p.tiles, last_sel = -1;
    // put stores row i of the tile in prev: y, and (p.yq) the CTA's block
    auto put = [&](int i, float sum, int t = 0) {
        const float v = prev.ok ? sum : nan;
        a.y[prev.sel * a.y_sel + (NT > 1 ? t * a.y_tok : 0) + prev.r0 + i] = v;
        if (NT == 1 && p.yq) s_yq[0][(prev.r0 & 31) + i] = v;
        if (NT >= 2 && p.yq) s_yq[t][(prev.r0 & 31) + i] = v;
    };
    // the row sums of a tile: thread i of warp 0 row i, its partials one
    // load each; or (p.sumw, segments dividing the warps) lanes of the last
    // warp, which does not request copies, each row's partials in one or
    // two vector loads (DS4C_OPT_MV_SUMW); the same adds in segment order
    auto sums = [&](int k) { // rows of tile k (its partials complete)
        if constexpr (EX && NT == 1) { // the block terms in block order
            const float *tb = s_part + (size_t)(k & 1) * p.rt * p.tstride;
            const int nb = a.cols / 32;
            if (W9) {
                if (!former)
                    for (int i = lane; i < prev.nr; i += 32) put(i, ordered_sum(tb + (size_t)i * p.tstride, nb));
            } else if (p.sumw) {
                if (warp == PIPE_THREADS / 32 - 1)
                    for (int i = lane; i < prev.nr; i += 32) put(i, ordered_sum(tb + (size_t)i * p.tstride, nb));
            } else if (tid < prev.nr) {
                put(tid, ordered_sum(tb + (size_t)tid * p.tstride, nb));
            }
            return;
        } else if constexpr (EX) { // two tokens: row i of token t as i + t·nr
            const float *tb = s_part + (size_t)(k & 1) * p.rt * p.tstride * NT;
            const int nb = a.cols / 32, nr = prev.nr;
            auto row = [&](int i) {
                const int t = NT == 2 ? (i >= nr ? 1 : 0) : i / nr, r = i - t * nr;
                put(r, ordered_sum(tb + ((size_t)t * p.rt + r) * p.tstride, nb), t);
            };
            if (W9) {
                if (!former)
                    for (int i = lane; i < NT * nr; i += 32) row(i);
            } else if (p.sumw) {
                if (warp == PIPE_THREADS / 32 - 1)
                    for (int i = lane; i < NT * nr; i += 32) row(i);
            } else if (tid < NT * nr) {
                row(tid);
            }
            return;
        }
        if (p.sumw) {
            if (warp != PIPE_THREADS / 32 - 1) return;
#pragma unroll
            for (int t = 0; t < NT; t++)
            for (int i = lane; i < prev.nr; i += 32) {
                const float *pt = s_part + ((size_t)(k & 1) * p.rt * NT + t * p.rt + i) * nseg;
                float sum;
                if (nseg >= 4) {
                    const float4 u = *(const float4 *)pt;
                    sum = u.x;
                    sum += u.y;
                    sum += u.z;
                    sum += u.w;
                    if (nseg == 8) {
                        const float4 v = *(const float4 *)(pt + 4);
                        sum += v.x;
                        sum += v.y;
                        sum += v.z;
                        sum += v.w;
                    }
                } else if (nseg == 2) {
                    const float2 u = *(const float2 *)pt;
                    sum = u.x;
                    sum += u.y;
                } else {
                    sum = pt[0];
                }
                put(i, sum, t);
            }
            return;
        }
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (tid < prev.nr) {
                const float *pt = s_part + ((size_t)(k & 1) * p.rt * NT + t * p.rt + tid) * nseg;
                float sum = pt[0];
                for (int s = 1; s < nseg; s++) sum += pt[s];
                put(tid, sum, t);
            }
    };
    for (int k = 0; k < my; k++) {
        bar_wait(s_bar + k % p.ns, (unsigned)(k / p.ns) & 1);
        MVP({
            const unsigned long long t = mvp_now();
            mv_t[2] += t - t_last;
            t_last = t;
        })
        __syncthreads(); // everyone's view; tile k−1's partials are stored and its stage is free
        MVP({
            const unsigned long long t = mvp_now();
            mv_t[3] += t - t_last;
            t_last = t;
        })
        pipe_issue<TQ8_0, CP>(p, s_mem, t0, my, k + p.ns - 1);
        const int sel = w_sel, r0 = w_ti * p.rt, nr = min(p.rt, a.rows - r0);
        const int64_t mat = pipe_mat(a, sel);
        if (++w_ti == p.tiles) {
            w_ti = 0;
            w_sel++;
        }
        const bool sel_new = sel != last_sel;
        last_sel = sel;
        const uint8_t *stg = s_mem + p.stage_off + (k % p.ns) * p.stage;
        if (sel_new && sel / a.act_div != cur_act) { // the next selection's row (tile 0's came before the loop)
            copy_act(sel);
            xseg = -1;
            __syncthreads();
        }
        float *part = s_part + (size_t)(k & 1) * p.rt * (EX ? p.tstride * NT : nseg * NT);
        MVP({
            const unsigned long long t = mvp_now();
            mv_t[4] += t - t_last;
            t_last = t;
        })
        if (!former) {
            // (W9: the summing warp forms no items)
        } else if (NT >= 2 && mat >= 0) { // (launch_pipe: the ilp form only)
            const int ilp = MB >= 2 ? 2 : p.ilp; // (MB: two items at once)
            const int seg = warp & (nseg - 1);
            load_x(seg);
            const uint8_t *qs = stg + p.soff[0] + seg * Q8F_SEG;
            const __half *ds = (const __half *)(stg + p.soff[1]) + seg * 32 + blk;
            const int items = nr * nseg, dstride = p.bpr[1] / 2;
            if constexpr (NT >= 2 && EX) {
                const int tt = p.rt * p.tstride;
                if (ilp >= 4)
                    q8e_items<4, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.tstride, tt);
                else if (ilp == 3)
                    q8e_items<3, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.tstride, tt);
                else
                    q8e_items<2, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.tstride, tt);
            } else if constexpr (NT > 2) {
                if (p.pack) {
                    if (ilp >= 4)
                        q8f_items4<4, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
                    else if (ilp == 3)
                        q8f_items4<3, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
                    else
                        q8f_items4<2, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
                } else if (ilp >= 4)
                    q8f_itemsN<4, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
                else if (ilp == 3)
                    q8f_itemsN<3, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
                else
                    q8f_itemsN<2, NT>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
            } else if constexpr (NT == 2) {
                if (ilp >= 4)
                    q8f_items2<4>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
                else if (ilp == 3)
                    q8f_items2<3>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
                else
                    q8f_items2<2>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0t, x1t, xdt, part, p.rt * nseg);
            }
        } else if (mat >= 0 && p.ilp > 1) {
            // the warp's segment is fixed (nseg divides the warps); ilp items at once
            const int seg = warp & (nseg - 1);
            load_x(seg);
            const uint8_t *qs = stg + p.soff[0] + seg * Q8F_SEG;
            const __half *ds = (const __half *)(stg + p.soff[1]) + seg * 32 + blk;
            const int items = nr * nseg, dstride = p.bpr[1] / 2;
            if (EX) {
                const int4 x0a[1] = {x0}, x1a[1] = {x1};
                const float xda[1] = {xd};
                if (p.ilp >= 4)
                    q8e_items<4, 1>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0a, x1a, xda, part, p.tstride, 0);
                else if (p.ilp == 3)
                    q8e_items<3, 1>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0a, x1a, xda, part, p.tstride, 0);
                else
                    q8e_items<2, 1>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0a, x1a, xda, part, p.tstride, 0);
            } else if (p.ilp >= 4)
                q8f_items<4>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0, x1, xd, part);
            else if (p.ilp == 3)
                q8f_items<3>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0, x1, xd, part);
            else
                q8f_items<2>(items, nsh, warp, lane, qs, ds, a.cols, dstride, x0, x1, xd, part);
        } else if (mat >= 0) {
            const int items = nr * nseg;
            for (int it = warp; it < items; it += PIPE_THREADS / 32) {
                const int row = nsh >= 0 ? it >> nsh : it / nseg, seg = it - row * nseg;
                load_x(seg);
                const uint8_t *q = stg + p.soff[0] + (size_t)row * a.cols + seg * Q8F_SEG;
                const int4 w0 = *(const int4 *)(q + xo0), w1 = *(const int4 *)(q + xo1);
                const __half d = ((const __half *)(stg + p.soff[1] + (size_t)row * p.bpr[1]))[seg * 32 + blk];
                if (EX) {
                    part[(size_t)row * p.tstride + seg * 32 + blk] =
                        __fmul_rn((float)dot4(w1, x1, dot4(w0, x0, 0)), __fmul_rn(__half2float(d), xd));
                    continue;
                }
                const float v = warp_sum((float)dot4(w1, x1, dot4(w0, x0, 0)) * (__half2float(d) * xd));
                if (lane == 0) part[row * nseg + seg] = v;
            }
        }
        MVP({
            const unsigned long long t = mvp_now();
            mv_t[5] += t - t_last;
            t_last = t;
        })
        if (k > 0) sums(k - 1);
        prev = {sel, r0, nr, mat >= 0};
        MVP({
            const unsigned long long t = mvp_now();
            mv_t[6] += t - t_last;
            t_last = t;
        })
    }
    __syncthreads();
    MVP(const unsigned long long t_fin = mvp_now();)
    if (my > 0) sums(my - 1);
#ifdef DS4_MV_PROBE
    if (W9 && tid == PIPE_THREADS && site >= 0) { // the summing warp: its row sums, barriers, and the last tile's
        atomicAdd(&g_mvp_w9[site][0], mv_t[6]);
        atomicAdd(&g_mvp_w9[site][1], mv_t[3]);
        atomicAdd(&g_mvp_w9[site][2], mvp_now() - t_fin);
        atomicAdd(&g_mvp_w9[site][3], 1ull);
    }
#endif
    if (p.yq && my > 0) {
        // the CTA's block of 32 rows as the next product's Q8_0 activation
        // (q8_0_warp: pipe_act_f32's and ds4c_quantize's operations), warp t
        // token t's
        __syncthreads();
        if constexpr (NT == 1) {
            if (warp == 0) {
                const int blk = (t0 / p.tiles * a.rows + (t0 % p.tiles) * p.rt) >> 5;
                q8_0_warp(s_yq[0][lane], lane, (int8_t *)p.yq + blk * 32, (float *)(p.yq + p.yq_n) + blk);
            }
        } else if (warp < NT) {
            const int blk = (t0 / p.tiles * a.rows + (t0 % p.tiles) * p.rt) >> 5;
            uint8_t *q = p.yq + (size_t)warp * p.yq_tok;
            q8_0_warp(s_yq[warp][lane], lane, (int8_t *)q + blk * 32, (float *)(q + p.yq_n) + blk);
        }
    }
#ifdef DS4_MV_PROBE
    if (tid == 32 * (PIPE_THREADS / 32 - 1) && site >= 0) { // the last warp's items, barrier and tile waits
        atomicAdd(&g_mvp_sum[site][12], mv_t[5]);
        atomicAdd(&g_mvp_sum[site][13], mv_t[3]);
        atomicAdd(&g_mvp_sum[site][14], mv_t[2]);
        atomicAdd(&g_mvp_sum[site][15], mv_t[6]);
    }
    if (tid == 0 && site >= 0) {
        const unsigned long long t_end = mvp_now();
        mv_t[7] = t_end - t_last;
        mv_t[8] = t_wait - t_entry < 600 ? 1 : 0;
        mv_t[9] = t_end - t_wait;
        mv_t[10] = 1;
        mv_t[11] = (unsigned long long)my;
        for (int i = 0; i < 12; i++) atomicAdd(&g_mvp_sum[site][i], mv_t[i]);
        { // the CTAs' entry → wait in buckets (µs at 1.98 GHz: < 0.3, 1, 3, 6, 10, more), and their
          // wait → exit (< 4, 6, 8, 10, 12, 16 µs, more: the tail a product waits for)
            const unsigned ew[5] = {594, 1980, 5940, 11880, 19800}, we[6] = {7920, 11880, 15840, 19800, 23760, 31680};
            atomicAdd(&g_mvp_hist[site][mvp_bucket(t_wait - t_entry, ew)], 1ull);
            atomicAdd(&g_mvp_exit[site][mvp_bucket(t_end - t_wait, we)], 1ull);
        }
        if (blockIdx.x == 0) {
            const unsigned long long n = atomicAdd(&g_mvp_n[site], 1ull) + 1;
            if (n % 1024 == 0) {
                const unsigned long long *q = g_mvp_sum[site];
                const double c = 1.0 / (double)q[10], u = c / 1980.0, ut = 1.0 / (double)q[11] / 1980.0;
                printf("mv probe site %d calls %llu (ctas/call %.1f, tiles/cta %.2f) µs a CTA: entry-wait %.2f start %.2f "
                       "tail %.2f wait-exit %.2f late %.2f | µs a tile: stall %.3f sync %.3f issue %.3f items %.3f "
                       "sums %.3f | last warp: items %.3f sync %.3f stall %.3f sums %.3f\n",
                       site, n, (double)q[10] / (double)n, q[11] * c, q[0] * u, q[1] * u, q[7] * u, q[9] * u, q[8] * c,
                       q[2] * ut, q[3] * ut, q[4] * ut, q[5] * ut, q[6] * ut, q[12] * ut, q[13] * ut, q[14] * ut,
                       q[15] * ut);
                const unsigned long long *hb = g_mvp_hist[site];
                printf("mv probe site %d entry-wait shares of CTAs: <0.3 µs %.3f, <1 %.3f, <3 %.3f, <6 %.3f, <10 %.3f, "
                       "more %.3f\n",
                       site, hb[0] * c, hb[1] * c, hb[2] * c, hb[3] * c, hb[4] * c, hb[5] * c);
                const unsigned long long *w9 = g_mvp_w9[site];
                if (W9 && w9[3])
                    printf("mv probe site %d summing warp: µs a tile: sums %.3f sync %.3f | µs a CTA: last tile's "
                           "sums %.3f\n",
                           site, w9[0] * ut, w9[1] * ut, w9[2] / (double)w9[3] / 1980.0);
                const unsigned long long *he = g_mvp_exit[site];
                printf("mv probe site %d wait-exit shares of CTAs: <4 µs %.3f, <6 %.3f, <8 %.3f, <10 %.3f, <12 %.3f, "
                       "<16 %.3f, more %.3f\n",
                       site, he[0] * c, he[1] * c, he[2] * c, he[3] * c, he[4] * c, he[5] * c, he[6] * c);
            }
        }
    }
#endif
}

// q8_form returns k_mv_pipe_q8f's instance for nt tokens (1-4): exact
// mode's (EX) with or without the summing warp (w9), fast mode's (w9
// false); for 2-4 tokens with its registers bounded for MB CTAs an SM (0:
// no bound; one token never).
template <bool EX, int MB>
static void (*q8_form(int nt, bool w9))(PipeArgs) {
    switch (nt) {
    case 2: return w9 ? k_mv_pipe_q8f<2, 2, EX, EX, MB> : k_mv_pipe_q8f<2, 2, EX, false, MB>;
    case 3: return w9 ? k_mv_pipe_q8f<2, 3, EX, EX, MB> : k_mv_pipe_q8f<2, 3, EX, false, MB>;
    case 4: return w9 ? k_mv_pipe_q8f<2, 4, EX, EX, MB> : k_mv_pipe_q8f<2, 4, EX, false, MB>;
    default: return w9 ? k_mv_pipe_q8f<2, 1, EX, EX> : k_mv_pipe_q8f<2, 1, EX>;
    }
}

// launch_pipe runs a single-token product as k_mv_pipe when T has a
// pipelined form, the option is on and the shapes allow it (every region's
// bytes per row a multiple of 16, units per row a multiple of 32, aligned
// addresses): it returns whether it took the product, *rc the launch's
// status. With xf (Q8_0, one selection; ds4c_matvec_f32) the CTAs form the
// activation from that float row (pipe_act_f32) instead of copying a.act.
// Not exact (fast mode), Q8_0 products of whole Q8F_SEG segments with bulk
// copies take k_mv_pipe_q8f when DS4C_OPT_MV_FAST is on.
// nt = 2 to 4 (Q8_0, no ids; k_mv_pipe_q8f, either mode): the tokens'
// products of the same weights in one k_mv_pipe_q8f<2, nt>, the weights
// streamed once (with xf: nt float rows, a.cols apart).
template <class T>
bool launch_pipe(const MVArgs &a, int n_sel, bool exact, cudaStream_t st, int *rc, const float *xf = nullptr,
                 const float *nw = nullptr, float eps = 0.f, bool room = false, uint8_t *yq = nullptr, int nt = 1) {
    *rc = 0;
    if constexpr (T::NREG == 0) {
        return false;
    } else {
        const int cps = ds4c_opt_mv_pipe();
        if (cps <= 0) return false;
        const int64_t upr = a.cols / T::VPU;
        if (a.cols % block_vals<T>() != 0 || upr < 32 || (upr & (upr - 1)) != 0 || ((uintptr_t)a.w & 15) != 0 ||
            (((uintptr_t)a.act | (uint64_t)a.act_sel) & 15) != 0)
            return false;
        PipeArgs p = {};
        p.a = a;
        p.pre = ds4c_opt_mv_pre();
        // (q8f_items and the last warp's sums: the segments of 1024 columns
        // divide the CTA's 8 warps)
        const int64_t nseg8 = a.cols / Q8F_SEG;
        const bool seg_warps = nseg8 >= 1 && 8 % nseg8 == 0;
        p.ilp = seg_warps ? ds4c_opt_mv_ilp() : 1;
        p.pack = nt > 2 && (ds4c_opt_mv_two() & 16) ? 1 : 0; // (fast mode's items only: q8f_items4)
        p.sumw = seg_warps ? ds4c_opt_mv_sumw() : 0;
        if (nt != 1 && (nt < 2 || nt > 4 || p.ilp < 2 || a.ids || (a.act_tok & 15) != 0 || (a.act_sel & 15) != 0))
            return false;
        if (xf) {
            if (!std::is_same<T, TQ8_0>::value || n_sel != 1 || a.cols % 32 != 0 ||
                (((uintptr_t)xf | (uintptr_t)nw) & 15) != 0)
                return false;
            p.xf = xf;
            p.nw = nw;
            p.eps = eps;
            p.xf_n = nt;
        }
        static int smem_sm = 0; // shared memory per SM (the library uses one device)
        if (!smem_sm) {
            int dev = 0;
            if (cudaGetDevice(&dev) != cudaSuccess ||
                cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess)
                smem_sm = 228 * 1024;
        }
        p.ns = ds4c_opt_mv_stages();
        int64_t row_bytes = 0; // weight bytes per row, all regions
        for (int r = 0; r < T::NREG; r++) row_bytes += T::bpr(r, a.cols);
        // Small products keep k_matvec: one wave of short CTAs that prefetch
        // their rows before the wait does better there (cuda/NOTES.md v7).
        if ((int64_t)n_sel * a.rows * row_bytes < ((int64_t)ds4c_opt_mv_pipe_min() << 20)) return false;
        const int64_t nb = a.cols / block_vals<T>();
        // one token's activation row (its format: the one T's products consume)
        const int64_t act_bytes =
            (int64_t)ds4c_act_bytes(std::is_same<T, TQ8_0>::value ? DS4C_Q8_0 : DS4C_Q8_K, a.cols);
        const int64_t act_smem = act_bytes + (a.cols / 64) * T::ACT_PAD; // the copy's bytes, padded
        const int cp = BULK_COPY ? ds4c_opt_mv_copy() : min(ds4c_opt_mv_copy(), 1);
        const bool q8f =
            std::is_same<T, TQ8_0>::value && !exact && cp == 2 && (ds4c_opt_mv_fast() & 1) && a.cols % Q8F_SEG == 0;
        // q8e: exact mode's on k_mv_pipe_q8f's items (DS4C_OPT_MV_EXQ8; two
        // tokens with DS4C_OPT_MV_TWO's bit 2)
        const bool q8e = std::is_same<T, TQ8_0>::value && exact && cp == 2 && ds4c_opt_mv_exq8() &&
                         a.cols % Q8F_SEG == 0 && (nt == 1 || (ds4c_opt_mv_two() & 2));
        // w9: its rows added by a ninth warp (DS4C_OPT_MV_EXQ8 2; the segments divide the 8 warps)
        const bool w9 = q8e && ds4c_opt_mv_exq8() == 2 && seg_warps;
        if (nt >= 2 && !q8f && !q8e) return false;
        // the Q8_0 products' own stage counts and CTAs an SM by class of
        // columns (DS4C_OPT_MV_Q8_NS_EX / _FAST, DS4C_OPT_MV_Q8_CTAS_EX /
        // _FAST: a decimal digit a class, 0 for DS4C_OPT_MV_STAGES /
        // DS4C_OPT_MV_PIPE). Exact mode's default gives the shared expert's
        // down (2048 columns, on the side stream beside the routed experts)
        // 2 stages: 19-row tiles, 216 CTAs, where 3 stages gave 16-row
        // tiles, 256 CTAs. Two of its CTAs on an SM leave no room for a
        // routed expert's k_mv_dec CTA — registers: two take 2 × 288 × 88
        // = 50688 of the SM's 65536, a k_mv_dec CTA 256 × 128 = 32768
        // (nvcc 11.8's counts); in 3 stages shared memory too, all but ≈
        // 0.6 KB — one does, so fewer CTAs let the routed experts start on
        // more SMs. Exact decode +2.0 % (cuda/NOTES.md v63). Products of
        // 2-4 tokens take DS4C_OPT_MV_FEW_NS_EX / _FAST's digit where it is
        // not 0: by default two stages of taller tiles for every class, a
        // four-token item's tile path costing more than one token's (fast
        // three drafts +3.9 %, exact +2.9 %; v72)
        int cap = 0; // DS4C_OPT_MV_Q8_CTAS_*: at most this many CTAs an SM (0: no cap)
        if (q8f || q8e) {
            const int cls = a.cols <= 1024 ? 3 : a.cols <= 2048 ? 2 : a.cols <= 4096 ? 1 : 0; // the digit: 10^cls
            int ns = ds4c_opt_mv_q8_ns(q8e), ctas = ds4c_opt_mv_q8_ctas(q8e);
            int few = nt >= 2 ? ds4c_opt_mv_few_ns(q8e) : 0; // (DS4C_OPT_MV_FEW_NS_*: 2-4 tokens)
            for (int c = 0; c < cls; c++) ns /= 10, ctas /= 10, few /= 10;
            if (few % 10 >= 2) ns = few;
            if (ns % 10 >= 2 && ds4c_opt_mv_stage() == 0) p.ns = ns % 10;
            cap = ctas % 10;
        }
        const int64_t act_stride = (act_smem + 15) & ~(int64_t)15; // nt = 2: the tokens' copies apart
        // yq (ds4c_matmul_q8out): k_mv_pipe_q8f only (either mode; two
        // tokens in exact mode, DS4C_OPT_MV_TWO's bit 4: fast mode measured
        // no gain, cuda/NOTES.md v68), y one row of whole blocks of 32
        // values a token (selections rows apart), no ids
        if (yq && (!(q8f || q8e) || xf || a.ids || a.rows % 32 != 0 || (n_sel > 1 && a.y_sel != a.rows) ||
                   ((uintptr_t)yq & 15) != 0 || (nt >= 2 && !(q8e && (ds4c_opt_mv_two() & 4)))))
            return false;
        // the terms of a row: k_mv_pipe's nb + 4 floats, k_mv_pipe_q8f's partials
        const int64_t row_terms = q8f ? a.cols / Q8F_SEG : nb + 4;
        // the kernel
        void (*k)(PipeArgs) = cp == 2 ? k_mv_pipe<T, 2> : (cp == 1 ? k_mv_pipe<T, 1> : k_mv_pipe<T, 0>);
        // (DS4C_OPT_MV_OCC's bits 1: fast mode's forms of 2-4 tokens, 2:
        // exact mode's, bounded for two CTAs an SM)
        const bool mb = nt >= 2 && ((q8f && (ds4c_opt_mv_occ() & 1)) || (q8e && (ds4c_opt_mv_occ() & 2)));
        if constexpr (std::is_same<T, TQ8_0>::value) {
            if (q8f)
                k = mb ? q8_form<false, 2>(nt, false) : q8_form<false, 0>(nt, false);
            else if (q8e)
                k = mb ? q8_form<true, 2>(nt, w9) : q8_form<true, 0>(nt, w9);
        }
        // rows per tile: the option's bytes per stage (DS4C_OPT_MV_STAGE), or
        // (0) as many as let cps CTAs fit an SM beside their fixed
        // shared memory
        int64_t stage_bytes = ds4c_opt_mv_stage();
        // room (DS4C_MM_ROOM): DS4C_MV_ROOM_KIB of each SM left free, in one
        // CTA an SM, or (DS4C_OPT_MV_ROOM's bit for nt tokens) cps of them
        // (cap: at most that many, in the budget of cps)
        int per = room && !(ds4c_opt_mv_room() & (nt >= 2 ? 2 : 1)) ? 1 : (cap > 0 ? min(cap, cps) : cps);
        // (the IQ2 codebook, 16 bytes of slack, the CTA's reserve)
        const int64_t fixed = PIPE_BARS + (T::GRID ? 2048 : 0) + (nt == 1 ? act_smem : nt * act_stride) + 16 + 1024;
        const int64_t budget = room ? (smem_sm - DS4C_MV_ROOM_KIB * 1024) / per : smem_sm / cps;
        // the shared memory rt rows a tile and ns stages take beyond fixed
        auto tile_smem = [&](int64_t rt, int ns) { return rt * (ns * row_bytes + 2 * row_terms * 4 * nt); };
        if (stage_bytes == 0) {
            const int64_t rows = (budget - fixed) / tile_smem(1, p.ns);
            stage_bytes = max((int64_t)1, rows) * row_bytes;
        }
        p.rt = (int)max((int64_t)1, min((int64_t)PIPE_THREADS, stage_bytes / row_bytes));
        p.rt = min(p.rt, a.rows);
        // (the tokens' rows of a tile are summed a thread a row where
        // neither the summing warp nor the last warp's sums are on:
        // nt · rt ≤ PIPE_THREADS; Flash's tiles are far shorter)
        if (nt > 1) p.rt = max(1, min(p.rt, PIPE_THREADS / nt));
        if (yq) { // tiles that divide a block of 32 rows: the largest power of two that fits
            int rt = 1;
            while (rt < 32 && 2 * rt <= p.rt) rt *= 2;
            // exact mode (automatic stages): tiles twice as tall and a stage
            // fewer while that keeps more rows in flight and fits — wo_a's
            // 4096 columns: 7 rows fit 3 stages beside the block terms, so 4
            // a tile (12 in flight, 8 tiles a CTA), where 8 rows in 2 stages
            // keep 16 in flight in 4 tiles (fast mode's: 8 rows, 3 stages;
            // cuda/NOTES.md v61)
            while (q8e && ds4c_opt_mv_stage() == 0 && p.ns > 2 && 2 * rt <= min(32, a.rows) &&
                   (int64_t)(2 * rt) * (p.ns - 1) > (int64_t)rt * p.ns && tile_smem(2 * rt, p.ns - 1) <= budget - fixed) {
                rt *= 2;
                p.ns--;
            }
            p.rt = rt;
        }
        // A CTA's tiles are a contiguous range and the CTAs' counts differ by
        // at most one, so the product lasts as long as the CTA with the most
        // rows: k_mv_pipe_q8f with automatic stages (DS4C_OPT_MV_EVEN) takes
        // the tile height among 7/8 rt … rt that gives it the fewest (the
        // tallest on ties) — q_b's 32768 rows on 264 CTAs: 4 tiles of 34
        // rows (136) against 4 of 32 (128), for an average of 124.1. Not
        // further down: shorter tiles keep fewer bytes in flight, and that
        // costs more than the balance gains (wo_b in 8 tiles of 2 rows
        // against 6 of 3: 19.0 against 14.9 µs; cuda/NOTES.md v27).
        if ((q8f || q8e) && !yq && ds4c_opt_mv_even() && ds4c_opt_mv_stage() == 0) {
            const int64_t G = (int64_t)per * ds4c_sm_count();
            int64_t best = INT64_MAX;
            for (int rt = p.rt, top = p.rt; rt >= max(1, (7 * top + 7) / 8); rt--) {
                const int64_t tiles = (a.rows + rt - 1) / rt * n_sel;
                const int64_t most = (tiles + G - 1) / G * rt;
                if (most < best) {
                    best = most;
                    p.rt = rt;
                }
            }
        }
        int off = 0;
        for (int r = 0; r < T::NREG; r++) {
            p.base[r] = T::base(r, a.R, a.cols);
            const int64_t b = T::bpr(r, a.cols);
            if (b % 16 != 0 || p.base[r] % 16 != 0 || b > (1 << 20)) return false;
            p.bpr[r] = (int)b;
            p.soff[r] = off;
            off += (int)(p.rt * b);
        }
        p.stage = off;
        p.timing = ds4c_opt_mv_timing();
        p.terms_off = PIPE_BARS + (T::GRID ? 256 * 8 : 0);
        p.ush = 0;
        while ((1 << p.ush) < upr) p.ush++;
        p.act_bytes = (int)act_bytes; // a multiple of 16
        p.tstride = (int)nb + 4;
        p.tw = nb >= 64 ? 1 : 0; // long rows: the sums would hold up the next tile
        p.act_off = p.terms_off + (int)((2 * p.rt * row_terms * 4 * nt + 15) & ~(int64_t)15);
        p.act_stride = (int)act_stride;
        p.stage_off = p.act_off + (int)(nt == 1 ? act_smem : nt * act_stride);
        const int64_t smem = p.stage_off + (int64_t)p.ns * p.stage;
        if (smem > 200 * 1024) return false;
        p.tiles = (a.rows + p.rt - 1) / p.rt;
        const int64_t total = (int64_t)p.tiles * n_sel;
        if (total > INT32_MAX / 2) return false;
        p.total = (int)total;
        // the largest opt-in done for each copy flavour (0-2), then
        // k_mv_pipe_q8f's forms: fast, exact, exact with the summing warp,
        // each for 1-4 tokens; then the same bounded for two CTAs (mb)
        static int64_t set[3 + 12 + 12] = {};
        const int fl = (q8f ? 3 + (nt - 1) : q8e ? (w9 ? 11 : 7) + (nt - 1) : cp) + (mb ? 12 : 0);
        if (smem > 48 * 1024 && smem > set[fl]) {
            cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) {
                *rc = ds4c_cuda_err(e, "pipelined matvec shared memory");
                return true;
            }
            set[fl] = smem;
        }
        const int64_t fit = max((int64_t)1, min((int64_t)per, (int64_t)smem_sm / (smem + 1024))); // CTAs that fit an SM
        // (yq: a CTA a block of 32 rows, t0 = blockIdx.x · 32/rt)
        const int64_t grid = yq ? total / (32 / p.rt) : min(total, fit * ds4c_sm_count());
        if (yq) {
            p.yq = yq;
            p.yq_n = n_sel * a.rows;
            p.yq_tok = (int)ds4c_act_bytes(DS4C_Q8_0, p.yq_n);
        }
        ds4c_launch(k, (unsigned)grid, PIPE_THREADS + (w9 ? 32 : 0), (size_t)smem, st, p);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) *rc = ds4c_cuda_err(e, "pipelined matvec");
        return true;
    }
}

template <class T>
int launch_type(MVArgs a, int n_sel, int nt, bool exact, cudaStream_t st) {
    const int units = a.cols / T::VPU;
    int S = 1, RPW = 1;
    if (nt >= 2 && nt <= 4 && (ds4c_opt_mv_two() & (exact ? 2 : 1))) {
        // products of two tokens (three or four: deeper drafts'
        // verifications): Q8_0 pipelined (launch_pipe: q8f, or in exact
        // mode q8e); in fast mode the tokens' others split over warps where
        // the rows are too few to fill the GPU (the mixers' 24 rows of 16384
        // columns), as one token's — for three tokens a mixer on 24 warps
        // took 26.5 µs (cuda/NOTES.md v70)
        int rc = 0;
        if (!a.w2 && launch_pipe<T>(a, n_sel, exact, st, &rc, nullptr, nullptr, 0.f, false, nullptr, nt)) return rc;
        const int64_t sms = ds4c_sm_count();
        while (!exact && S < 8 && ((int64_t)a.rows * S / 8) * n_sel < 4 * sms && units >= 64 * S) S *= 2;
    }
    if (nt == 1) {
        int rc = 0;
        // (a pair, a.w2, runs as k_matvec: both tensors in one grid)
        if (!a.w2 && launch_dec<T>(a, n_sel, exact, st, &rc)) return rc;
        if (!a.w2 && launch_pipe<T>(a, n_sel, exact, st, &rc)) return rc;
        S = ds4c_opt_splitk();
        RPW = ds4c_opt_rpw();
        const int64_t sms = ds4c_sm_count();
        if (S > 1) RPW = 1;
        if (S == 0 && RPW == 0) {
            S = 1;
            RPW = 1;
            if (units < 128) { // fewer than 4 units per lane: stack rows in a warp
                RPW = T::MAX_RPW;
                while (RPW > 1 && (units * RPW > 256 || ((int64_t)a.rows + 8 * RPW - 1) / (8 * RPW) * n_sel < 2 * sms))
                    RPW /= 2;
            }
            if (RPW == 1) // too few rows to fill the GPU: split rows over warps
                while (S < 8 && ((int64_t)a.rows * S / 8) * n_sel < 4 * sms && units >= 64 * S) S *= 2;
        }
        if (S == 0) S = 1;
        if (RPW == 0) RPW = 1;
    }
    int rc = exact ? launch_chunks<T, true>(a, n_sel, nt, S, RPW, st) : launch_chunks<T, false>(a, n_sel, nt, S, RPW, st);
    if (rc) return rc;
    DS4C_CHECK_LAUNCH("matvec");
    return 0;
}

// Per-type launchers (mv_*.cu).
int launch_q8_0(const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st);
int launch_q2_k(const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st);
int launch_q4_k(const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st);
int launch_iq2_xxs(const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st);
// A single-token product as k_mv_dec (the pair a.w2, a.y2, or the
// activation formed from a.glu_g): whether it took it, *rc the launch's
// status (mv_*.cu; types without the register form: false).
bool dec_q2_k(const MVArgs &a, int n_sel, bool exact, cudaStream_t st, int *rc);
bool dec_iq2_xxs(const MVArgs &a, int n_sel, bool exact, cudaStream_t st, int *rc);
// ds4c_matvec_f32's one launch (mv_q8_0.cu): whether the pipelined kernel
// took a's single Q8_0 product of n tokens (1 to 4) with
// their activations formed from the float rows at xf (a.cols apart) (RMSNorm with nw, eps when nw is set; room: DS4C_MM_ROOM), *rc the
// launch's status.
bool pipe_q8_0_f32(const MVArgs &a, const float *xf, const float *nw, float eps, bool exact, bool room, cudaStream_t st,
                   int *rc, int n = 1);
// ds4c_matmul_q8out's one launch (mv_q8_0.cu): whether k_mv_pipe_q8f
// (exact: its exact terms, DS4C_OPT_MV_EXQ8) took a's product of n_sel
// selections (no ids) for nt tokens (1, or 2 to 4 in exact mode where its
// few-token form takes them and DS4C_OPT_MV_TWO has bit 4; activations
// a.act_tok bytes apart) with each CTA writing its block of each token's y
// as Q8_0 activation to yq as well, *rc the launch's status.
bool pipe_q8_0_q8out(const MVArgs &a, int n_sel, uint8_t *yq, bool exact, cudaStream_t st, int *rc, int nt = 1);
// ds4c_matvec_f32's fused launch for an F16 matrix (mv_float.cu; fast mode,
// nw set, 1024, 2048 or 4096 columns, 16-byte aligned): whether
// k_mv_f16_norm took a's product of the float row xf after RMSNorm with nw
// and eps, *rc the launch's status.
bool f16_norm(const MVArgs &a, const float *xf, const float *nw, float eps, cudaStream_t st, int *rc);
// f16_norm_exact is f16_norm for exact mode: k_fexact_warp staging the
// row after its RMSNorm (MVArgs.nw), the same bits as ds4c_rmsnorm_ref and
// the exact product's launch (DS4C_OPT_MV_F32 bit 4).
bool f16_norm_exact(const MVArgs &a, const float *xf, const float *nw, float eps, cudaStream_t st, int *rc);
int launch_float(int type, const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st);

// Tensor-core products (mm_tc.cu): whether type/cols have one, and the dense
// form (n_sel selections × n_tok tokens, addressed as ds4c_matmul_ex does).
bool tc_supported(int type, int64_t cols);
int tc_dense(int type, const MVArgs &a, int n_sel, int n_tok, cudaStream_t st);

// grouped_single: whether ds4c_matmul_grouped runs a product of n_sel
// selections (not DS4C_MM_HALF) as ds4c_matmul_ex, single-token launches:
// no tensor-core form for type and cols, fewer selections than
// DS4C_OPT_TC_MIN_SEL, or activation rows not 16-byte aligned (aligned
// false). ds4c_matmul_grouped_pair and ds4c_matmul_grouped_swiglu take
// their fused single-token forms exactly where it holds.
inline bool grouped_single(int type, int64_t cols, int n_sel, bool aligned) {
    return !tc_supported(type, cols) || n_sel < ds4c_opt_tc_min_sel() || !aligned;
}

} // namespace ds4mv
