// mm_tc.cu: batched products on the tensor cores (int8 mma.sync m16n8k32)
// for Q8_0, Q2_K and IQ2_XXS weights, dense (many tokens through one
// matrix) or grouped (selections sorted by expert, tiles of one expert).
//
// Numerics: bit-identical to quant.Dot (and so to backend/cpu), in both the
// fast and the exact mode. One mma covers 32 values of one row for 8 tokens
// and yields exact integer sums; the per-block float terms are formed with
// the operations of quant.Dot (explicitly rounded) and added by the thread
// that owns the (row, token) output, in block order:
//   Q8_0     block = one mma (32 values): sum += isum · (d_w · d_a).
//   Q2_K     the 4-bit scale is folded into the weight bytes (q·sc ≤ 45) so
//            the mma sums Σ sc·q·a directly; a second mma with the 4-bit mins
//            as weights gives Σ m·a = Σ_j m_j·bsum_j; per 256-block
//            sum += (d_a·d)·isum − (d_a·dmin)·summs.
//   IQ2_XXS  one mma per 32-value sub-block (grid magnitude × sign), times
//            the odd integer 2·scale+1; per 256-block sum += (d_w·d_a)·bsum;
//            the row ends with 0.125·sum.
// The K index of the mma is permuted (thread t of a quad holds values
// 8t…8t+7 of the 32, the same for weights and activations), which leaves
// every integer sum unchanged and lets each thread load 8 contiguous bytes.
//
// Work split: a CTA is 4 warps; a warp owns 32 rows (two m16 tiles) × 32
// token slots (four n8 tiles); a CTA 128 rows × 32 slots. blockIdx.y picks
// the 128 rows; blockIdx.x (the fastest-varying, so the CTAs that read the
// same weight rows run together and share them through L2) the slots, which
// map to (selection, token) pairs: dense, blockIdx.x picks 32 tokens and
// blockIdx.z the selection; grouped, blockIdx.x indexes a tile table
// (matrix, first pair, count) that k_group builds on the device from the
// selections' matrix ids, so no host round trip is needed. Q8_0 stages its
// operands in shared memory (k_tc_q8_0); Q2_K and IQ2_XXS load their
// fragments from global memory, one block (or sub-block) ahead.
#include "mm_tc.cuh"

namespace ds4mv {
namespace {

constexpr int TC_WARPS = 4;
constexpr int TC_ROWS = 32 * TC_WARPS; // rows per CTA
constexpr int TC_BN = 32;              // token slots per CTA

__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma_k16_u8: c += a·b for m16n8k16 with unsigned 8-bit a (row g: a[0], row
// g+8: a[1], k 4q … 4q+3 each) and 8-bit b (k 4q … 4q+3 of column g),
// signed (S) or unsigned.
template <bool S> __device__ __forceinline__ void mma_k16_u8(int (&c)[4], const int (&a)[2], int b) {
    if (S)
        asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(b));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(b));
}

__device__ __forceinline__ int2 ld8(const void *p) { return __ldg((const int2 *)p); }

using Slots = SlotsT<TC_BN>;

// Per-thread geometry of the warp's 32 rows × 32 slots.
struct Geo {
    int g, q;       // lane / 4, lane % 4
    int rb;         // the warp's first row
    int64_t gr[4];  // global rows (clamped) of [m-tile][lo/hi]
    bool rok[4];    // row inside the matrix
};

// tc_geo fills G for the CTA's matrix mat and returns whether mat is one
// of the tensor's (if not, mat becomes 0 so that loads stay inside the
// tensor, and the outputs are NaN).
__device__ __forceinline__ bool tc_geo(Geo &G, const MVArgs &a, int64_t &mat) {
    const bool mat_ok = mat >= 0 && mat < a.n_mat;
    if (!mat_ok) mat = 0;
    const int lane = threadIdx.x & 31;
    G.g = lane >> 2;
    G.q = lane & 3;
    G.rb = blockIdx.y * TC_ROWS + (threadIdx.x >> 5) * 32;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = G.rb + (i >> 1) * 16 + (i & 1) * 8 + G.g;
        G.rok[i] = r < a.rows;
        G.gr[i] = mat * a.rows + min(r, a.rows - 1);
    }
    return mat_ok;
}

// tc_act_rows points ab[nt] at this thread's 8 bytes of the B fragment of
// n-tile nt (slot 8nt + g) and ac[2nt + j] at the activation rows of its
// output slots 8nt + 2q + j (whose scales the block terms need).
__device__ __forceinline__ void tc_act_rows(const MVArgs &a, const Slots &s, const Geo &G, const uint8_t *(&ab)[4],
                                            const uint8_t *(&ac)[8]) {
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        ab[nt] = a.act + s.act[8 * nt + G.g] + 8 * G.q;
        ac[2 * nt] = a.act + s.act[8 * nt + 2 * G.q];
        ac[2 * nt + 1] = a.act + s.act[8 * nt + 2 * G.q + 1];
    }
}

__device__ __forceinline__ void tc_zero(float (&acc)[2][4][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.f;
}

// Store the accumulators: acc[mt][nt][i] is row rb + 16mt + g + 8(i>>1),
// slot 8nt + 2q + (i&1).
__device__ __forceinline__ void tc_store(const MVArgs &a, const Slots &s, const Geo &G, int cnt,
                                         float (&acc)[2][4][4], bool mat_ok, float final_scale) {
    const float nan = __int_as_float(0x7fc00000);
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int ri = 2 * mt + (i >> 1);
                const int slot = 8 * nt + 2 * G.q + (i & 1);
                if (!G.rok[ri] || slot >= cnt) continue;
                const int r = G.rb + 16 * mt + 8 * (i >> 1) + G.g;
                float v = acc[mt][nt][i];
                if (final_scale != 1.0f) v = __fmul_rn(final_scale, v);
                a.y[s.y[slot] + r] = mat_ok ? v : nan;
            }
}

// ---------------------------------------------------------------- Q8_0
// Stages of 8 blocks (256 values) of the CTA's 128 weight rows, 32
// activation rows and their scales go to shared memory with 16-byte
// cp.async copies (double buffered), so each global byte is fetched once per
// CTA in whole sectors; the warps then read their fragments with 8-byte
// shared loads (rows padded to 288 bytes: conflict-free per half-warp).
constexpr int Q8S_LD = 288;                                   // bytes per staged row
constexpr int Q8S_A = TC_ROWS * Q8S_LD, Q8S_B = TC_BN * Q8S_LD; // weight, activation bytes
constexpr int Q8S_DW = TC_ROWS * 16, Q8S_DA = TC_BN * 32;     // 8 f16 / 8 f32 scales per row
constexpr int Q8S_STAGE = Q8S_A + Q8S_B + Q8S_DW + Q8S_DA;

// (cp_async16 and its group commit/wait: common.cuh)

__global__ void __launch_bounds__(128) k_tc_q8_0(TCArgs p) {
    mv_pdl_enter(p.a);
    __shared__ Slots s;
    extern __shared__ __align__(16) uint8_t s_q8[]; // [2][Q8S_STAGE]
    int64_t mat;
    const int cnt = tc_slots<TC_BN>(p, s, &mat);
    const MVArgs &a = p.a;
    if (cnt <= 0) return;
    Geo G;
    const bool mat_ok = tc_geo(G, a, mat);
    const int tid = threadIdx.x, warp = tid >> 5;
    const int row0 = blockIdx.y * TC_ROWS;
    const int nb = a.cols / 32, nst = a.cols / 256;
    const int8_t *wq = (const int8_t *)a.w;
    const __half *wd = (const __half *)(a.w + a.R * a.cols);
    // this thread's copies: weight rows tid/16 + 8k (k < 16) at chunk tid%16;
    // activation rows tid/16 + 8k (k < 4); the scales of row tid and slot tid/4
    const int cr = tid >> 4, cc = tid & 15;
    auto issue = [&](int st, int buf) {
        uint8_t *sa = s_q8 + buf * Q8S_STAGE, *sb = sa + Q8S_A, *sdw = sb + Q8S_B, *sda = sdw + Q8S_DW;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const int r = cr + 8 * k;
            const int64_t gr = mat * a.rows + min(row0 + r, a.rows - 1);
            cp_async16(sa + r * Q8S_LD + 16 * cc, wq + gr * a.cols + 256 * st + 16 * cc);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int j = cr + 8 * k;
            cp_async16(sb + j * Q8S_LD + 16 * cc, a.act + s.act[j] + 256 * st + 16 * cc);
        }
        {
            const int64_t gr = mat * a.rows + min(row0 + tid, a.rows - 1);
            cp_async16(sdw + tid * 16, wd + gr * nb + 8 * st);
        }
        if (tid < 2 * TC_BN) {
            const int j = tid >> 1, h = tid & 1;
            cp_async16(sda + j * 32 + 16 * h, a.act + s.act[j] + a.cols + 32 * st + 16 * h);
        }
        cp_async_commit();
    };
    float acc[2][4][4];
    tc_zero(acc);
    issue(0, 0);
    for (int st = 0; st < nst; st++) {
        const int buf = st & 1;
        if (st + 1 < nst) {
            issue(st + 1, buf ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint8_t *sa = s_q8 + buf * Q8S_STAGE, *sb = sa + Q8S_A;
        const __half *sdw = (const __half *)(sb + Q8S_B);
        const float *sda = (const float *)(sb + Q8S_B + Q8S_DW);
        // (fully unrolled: with "unroll 2" the compiler gave every mma's
        // result the registers of its A fragment and rebuilt the fragment
        // with 4 moves an mma — 12 % of the kernel's instructions)
#pragma unroll
        for (int bb = 0; bb < 8; bb++) {
            int A[2][4];
            float dw[4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int rl = warp * 32 + mt * 16 + G.g;
                const int2 lo = *(const int2 *)(sa + rl * Q8S_LD + 32 * bb + 8 * G.q);
                const int2 hi = *(const int2 *)(sa + (rl + 8) * Q8S_LD + 32 * bb + 8 * G.q);
                A[mt][0] = lo.x;
                A[mt][1] = hi.x;
                A[mt][2] = lo.y;
                A[mt][3] = hi.y;
                dw[2 * mt] = __half2float(sdw[rl * 8 + bb]);
                dw[2 * mt + 1] = __half2float(sdw[(rl + 8) * 8 + bb]);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int2 x = *(const int2 *)(sb + (8 * nt + G.g) * Q8S_LD + 32 * bb + 8 * G.q);
                const float da0 = sda[(8 * nt + 2 * G.q) * 8 + bb], da1 = sda[(8 * nt + 2 * G.q + 1) * 8 + bb];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    int c[4] = {0, 0, 0, 0};
                    mma_s8(c, A[mt], x.x, x.y);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float sc = __fmul_rn(dw[2 * mt + (i >> 1)], (i & 1) ? da1 : da0);
                        acc[mt][nt][i] = __fadd_rn(acc[mt][nt][i], __fmul_rn((float)c[i], sc));
                    }
                }
            }
        }
        __syncthreads(); // the buffer is refilled by the next iteration's issue
    }
    if (G.rb >= a.rows) return;
    tc_store(a, s, G, cnt, acc, mat_ok, 1.0f);
}

// ---------------------------------------------------------------- Q2_K
__global__ void __launch_bounds__(128) k_tc_q2_k(TCArgs p) {
    mv_pdl_enter(p.a);
    __shared__ Slots s;
    int64_t mat;
    const int cnt = tc_slots<TC_BN>(p, s, &mat);
    const MVArgs &a = p.a;
    if (cnt <= 0) return;
    Geo G;
    const bool mat_ok = tc_geo(G, a, mat);
    if (G.rb >= a.rows) return;
    const int nbr = a.cols / 256;          // blocks per row
    const int64_t NB = a.R * nbr;          // blocks of the tensor
    const uint8_t *qs = a.w, *scb = a.w + NB * 64;
    const __half2 *dmb = (const __half2 *)(a.w + NB * 80);
    const uint8_t *ab[4], *ac[8];
    tc_act_rows(a, s, G, ab, ac);
    float acc[2][4][4];
    tc_zero(acc);
    for (int b = 0; b < nbr; b++) {
        int2 q[4][2];  // per row, per half: bytes 8q..8q+7 of the half's 32
        int4 sc[4];    // per row: the 16 scale bytes
        __half2 dm[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t gb = G.gr[i] * nbr + b;
            q[i][0] = ld8(qs + gb * 64 + 8 * G.q);
            q[i][1] = ld8(qs + gb * 64 + 32 + 8 * G.q);
            sc[i] = __ldg((const int4 *)(scb + gb * 16));
            dm[i] = dmb[gb];
        }
        int ci[2][4][4], cm[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) ci[mt][nt][i] = cm[mt][nt][i] = 0;
#pragma unroll
        for (int ks = 0; ks < 8; ks++) { // values 32ks … 32ks+31: half ks/4, plane ks%4
            const int h = ks >> 2, sh = 2 * (ks & 3);
            const int sub = 2 * ks + (G.q >> 1); // the 16-value sub-block of this thread's 8 values
            int A[2][4], M[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int hl = 0; hl < 2; hl++) { // row lo (g) / hi (g+8)
                    const int i = 2 * mt + hl;
                    const int4 v = sc[i];
                    const int word = sub < 4 ? v.x : (sub < 8 ? v.y : (sub < 12 ? v.z : v.w));
                    const int sb = (word >> (8 * (sub & 3))) & 0xff;
                    const int lo = (int)(((unsigned)q[i][h].x >> sh) & 0x03030303u) * (sb & 15);
                    const int hi = (int)(((unsigned)q[i][h].y >> sh) & 0x03030303u) * (sb & 15);
                    A[mt][hl] = lo;
                    A[mt][2 + hl] = hi;
                    M[mt][hl] = M[mt][2 + hl] = 0x01010101 * (sb >> 4);
                }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int2 v = ld8(ab[nt] + 256 * b + 32 * ks);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma_s8(ci[mt][nt], A[mt], v.x, v.y);
                    mma_s8(cm[mt][nt], M[mt], v.x, v.y);
                }
            }
        }
        float da[8];
#pragma unroll
        for (int j = 0; j < 8; j++) da[j] = __ldg((const float *)(ac[j] + a.cols) + b);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const __half2 d2 = dm[2 * mt + (i >> 1)];
                    const float x = da[2 * nt + (i & 1)];
                    const float dall = __fmul_rn(x, __low2float(d2)), dmin = __fmul_rn(x, __high2float(d2));
                    const float term = __fsub_rn(__fmul_rn(dall, (float)ci[mt][nt][i]), __fmul_rn(dmin, (float)cm[mt][nt][i]));
                    acc[mt][nt][i] = __fadd_rn(acc[mt][nt][i], term);
                }
    }
    tc_store(a, s, G, cnt, acc, mat_ok, 1.0f);
}

// ---------------------------------------------------------------- IQ2_XXS
// The 32 activation rows of each 256-value block, which all four warps read,
// are staged in shared memory with cp.async (double buffered: block b+1 is
// copied while block b is multiplied; rows padded to 288 bytes, as Q8_0's,
// so the 8-byte fragment reads are conflict-free per half-warp). Each warp's
// weight words are its own and stay register-pipelined from global memory.
__global__ void __launch_bounds__(128) k_tc_iq2_xxs(TCArgs p) {
    mv_pdl_enter(p.a);
    __shared__ Slots s;
    __shared__ uint64_t s_grid[256]; // the codebook (sign masks are computed: iq2_sign_mask)
    __shared__ __align__(16) uint8_t s_x[2][TC_BN * Q8S_LD];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_grid[i] = iq2xxs_grid[i];
    int64_t mat;
    const int cnt = tc_slots<TC_BN>(p, s, &mat); // synchronises (after the tables too)
    const MVArgs &a = p.a;
    if (cnt <= 0) return;
    Geo G;
    const bool mat_ok = tc_geo(G, a, mat);
    const bool live = G.rb < a.rows; // warps past the matrix still stage and synchronise
    const int tid = threadIdx.x;
    const int nbr = a.cols / 256;
    const int64_t NB = a.R * nbr;
    const uint8_t *qs = a.w;
    const __half *db = (const __half *)(a.w + NB * 64);
    const uint8_t *ab[4], *ac[8];
    tc_act_rows(a, s, G, ab, ac);
    // staging: thread tid copies 16-byte chunk tid%16 of rows tid/16 + 8k
    const int cr = tid >> 4, cc = tid & 15;
    auto issue = [&](int b, int buf) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int j = cr + 8 * k;
            cp_async16(&s_x[buf][j * Q8S_LD + 16 * cc], a.act + s.act[j] + 256 * b + 16 * cc);
        }
        cp_async_commit();
    };
    float acc[2][4][4];
    tc_zero(acc);
    // one 32-value sub-block's weight words; the next sub-block's are
    // loaded before this one's products run
    struct Sub {
        int2 q[4];
    };
    auto load = [&](Sub &f, int b, int ib) {
#pragma unroll
        for (int i = 0; i < 4; i++) f.q[i] = ld8(qs + (G.gr[i] * nbr + b) * 64 + 8 * ib);
    };
    int bs[2][4][4];
    auto compute = [&](const Sub &f, int ib, const uint8_t *xs) {
        int A[2][4], ls[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t aux = (uint32_t)f.q[i].y;
            ls[i] = 2 * (int)(aux >> 28) + 1;
            const uint64_t gv = s_grid[((uint32_t)f.q[i].x >> (8 * G.q)) & 0xff];
            const uint64_t sm = iq2_sign_mask((aux >> (7 * G.q)) & 127);
            const int mt = i >> 1, hl = i & 1;
            A[mt][hl] = apply_signs((uint32_t)gv, (uint32_t)sm);
            A[mt][2 + hl] = apply_signs((uint32_t)(gv >> 32), (uint32_t)(sm >> 32));
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int2 x = *(const int2 *)(xs + (8 * nt + G.g) * Q8S_LD + 32 * ib + 8 * G.q);
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                int c[4] = {0, 0, 0, 0};
                mma_s8(c, A[mt], x.x, x.y);
#pragma unroll
                for (int i = 0; i < 4; i++) bs[mt][nt][i] += c[i] * ls[2 * mt + (i >> 1)];
            }
        }
    };
    Sub f0, f1;
    issue(0, 0);
    load(f0, 0, 0);
    for (int b = 0; b < nbr; b++) {
        const int buf = b & 1;
        cp_async_wait<0>();
        __syncthreads(); // block b is staged; block b-1's buffer is free
        if (b + 1 < nbr) issue(b + 1, buf ^ 1);
        if (!live) continue;
        const uint8_t *xs = s_x[buf];
        float dw[4], da[8];
#pragma unroll
        for (int i = 0; i < 4; i++) dw[i] = __half2float(db[G.gr[i] * nbr + b]);
#pragma unroll
        for (int j = 0; j < 8; j++) da[j] = __ldg((const float *)(ac[j] + a.cols) + b);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) bs[mt][nt][i] = 0;
#pragma unroll
        for (int ib = 0; ib < 8; ib += 2) {
            load(f1, b, ib + 1);
            compute(f0, ib, xs);
            if (ib + 2 < 8)
                load(f0, b, ib + 2);
            else if (b + 1 < nbr)
                load(f0, b + 1, 0);
            compute(f1, ib + 1, xs);
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float d = __fmul_rn(dw[2 * mt + (i >> 1)], da[2 * nt + (i & 1)]);
                    acc[mt][nt][i] = __fadd_rn(acc[mt][nt][i], __fmul_rn(d, (float)bs[mt][nt][i]));
                }
    }
    if (!live) return;
    tc_store(a, s, G, cnt, acc, mat_ok, 0.125f);
}

// ---------------------------------------------------------------- staged Q2_K, IQ2_XXS
// The same products with every operand of a 256-value block staged in
// shared memory by a three-stage cp.async pipeline (block b+2 is copied
// while block b is multiplied), so no warp waits on a global load inside the
// loop: the CTA's 128 rows' 64 quant bytes (16-byte chunks XOR-swizzled by
// row, so that a warp's 8 rows × 8-byte reads fall in distinct banks), Q2_K's
// 16 scale bytes a row, and the activation rows (288-byte rows, as Q8_0's).
// N-tiles of 8 slots past the tile's count are skipped. The arithmetic, and
// so every bit of the result, is the unstaged kernels'.
//
// Two shapes (template MT, NT): 4 warps of 32 rows (MT = 2 m-tiles) × 32
// slots (NT = 4 n-tiles), or 8 warps of 16 rows × 64 slots. A weight
// sub-block is decoded once per warp for its NT n-tiles, so the second
// shape decodes each row once per 64 slots instead of per 32: IQ2_XXS's
// codebook, sign and scale decoding is most of its instructions (≈ 13 of
// ≈ 32 an mma with 32 slots, cuda/NOTES.md v12).
constexpr int ST_NS = 3;           // stages
constexpr int ST_W = TC_ROWS * 64;  // quant bytes of a stage
constexpr int ST_SC = TC_ROWS * 16; // Q2_K's scale bytes of a stage

template <int MT, int NT> struct StShape {
    static constexpr int WARPS = TC_ROWS / (16 * MT);
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int BN = 8 * NT;                       // slots
    static constexpr int X = BN * Q8S_LD;                   // activation bytes of a stage
    static constexpr int IQ2 = ST_W + X;                    // an IQ2_XXS stage: weights, activations
    static constexpr int Q2K_D = X;                         // a Q2_K stage's row (d, dmin) pairs, then slot scales, after its activations
    static constexpr int Q2K = ST_W + ST_SC + X + 4 * TC_ROWS + 4 * BN; // a Q2_K stage: weights, scales, activations, those
    static constexpr int MINB = WARPS == 4 ? 4 : 2;         // CTAs per SM the registers are capped for (IQ2_XXS; 3 for 4 warps measured slower, v50)
    static constexpr int MINB_Q2K = WARPS == 4 ? 3 : 1;     // (Q2_K: 2 CTAs of 8 warps would spill)
};

// st_off is the staged byte offset of byte off (0..63) of the CTA's row r.
__device__ __forceinline__ int st_off(int r, int off) { return r * 64 + 16 * ((off >> 4) ^ ((r >> 1) & 3)) + (off & 15); }

// StSrc: what of st_issue's copy sources does not change from block to
// block, formed once a CTA (st_src): each weight copy's row as its first
// block's index, (mrow + clamped row) · nbr, and each activation copy's
// byte offset, s.act[j] + 16·cc — 32-bit, which tc_launch and the callers'
// act_span_ok bound. (Before v50 st_issue formed them again for every
// block: 64-bit products and a shared-memory load on each block's path.)
template <class S> struct StSrc {
    static constexpr int NW = 4 * TC_ROWS / S::THREADS, NX = 16 * S::BN / S::THREADS;
    int w[NW];
    int x[NX];
};

template <class S>
__device__ __forceinline__ void st_src(StSrc<S> &c, const MVArgs &a, const SlotsT<S::BN> &s, int64_t mrow, int nbr) {
    const int tid = threadIdx.x, row0 = blockIdx.y * TC_ROWS;
#pragma unroll
    for (int k = 0; k < StSrc<S>::NW; k++) {
        const int r = (tid + S::THREADS * k) >> 2;
        c.w[k] = (int)((mrow + min(row0 + r, a.rows - 1)) * nbr);
    }
#pragma unroll
    for (int k = 0; k < StSrc<S>::NX; k++) {
        const int id = tid + S::THREADS * k;
        c.x[k] = (int)s.act[id >> 4] + 16 * (id & 15);
    }
}

// The block scales are staged too, so that the block loop reads them from
// shared memory instead of waiting on global loads (cuda/NOTES.md v50).
// IQ2_XXS puts them in the activation rows' padding (bytes 256 … 287 of
// each Q8S_LD row, which Q2_K fills with the sub-block sums): row j's own
// scale at 256 (ST_DA), and the f16 scales of weight rows 4j … 4j+3 at 260
// + 4·(r % 4) (ST_DW), each as the 4-byte word that holds it (the scale of
// block index e is half e % 2 of word e / 2). Q2_K puts them after the
// activation rows (StShape::Q2K_D): the weight rows' (d, dmin) pairs, then
// the slots' scales.
constexpr int ST_DA = 256, ST_DW = 260;
static_assert(TC_ROWS / 4 <= 32 && ST_DW + 16 <= Q8S_LD, "the weight rows' scales fit the first 32 rows' padding");

// st_issue copies block b into stage sg (scb: Q2_K's scales, else null)
// and commits the copies as one group: the 128 weight rows' 4 chunks, the
// 128 rows' scales, the BN activation rows' 16 chunks, spread over the
// CTA's threads, and for Q2_K each activation row's 16 sub-block sums (32
// bytes at offset 256 of the staged row: 16-byte copies where the rows'
// sums are 16-byte aligned, nbr a multiple of 4, else 4-byte copies); with
// dwb, the base of the weights' block scales, those and the slots' scales
// too (ST_DA / ST_DW for IQ2_XXS, Q2K_D for Q2_K). mrow is the matrix's
// first row; src holds the copies' block-invariant sources.
template <class S>
__device__ __forceinline__ void st_issue(const MVArgs &a, const SlotsT<S::BN> &s, const StSrc<S> &src, int64_t mrow,
                                         int nbr, const uint8_t *scb, int b, uint8_t *sg, const uint8_t *dwb = nullptr) {
    const int tid = threadIdx.x, row0 = blockIdx.y * TC_ROWS;
#pragma unroll
    for (int k = 0; k < StSrc<S>::NW; k++) {
        const int id = tid + S::THREADS * k, r = id >> 2, c = id & 3;
        cp_async16(sg + st_off(r, 16 * c), a.w + (int64_t)(src.w[k] + b) * 64 + 16 * c);
    }
    uint8_t *sx = sg + ST_W;
    if (scb) {
        if (tid < TC_ROWS) cp_async16(sx + 16 * tid, scb + ((mrow + min(row0 + tid, a.rows - 1)) * nbr + b) * 16);
        sx += ST_SC;
    }
#pragma unroll
    for (int k = 0; k < StSrc<S>::NX; k++) {
        const int id = tid + S::THREADS * k, j = id >> 4, cc = id & 15;
        cp_async16(sx + j * Q8S_LD + 16 * cc, a.act + (src.x[k] + 256 * b));
    }
    if (dwb) { // the scales (ST_DA, ST_DW; Q2K_D); a row's by the thread of its chunk 0
        uint8_t *sd = sx + S::Q2K_D;
        if ((tid & 3) == 0) {
#pragma unroll
            for (int k = 0; k < StSrc<S>::NW; k++) {
                const int r = (tid + S::THREADS * k) >> 2;
                if (scb) cp_async4(sd + 4 * r, dwb + 4 * (src.w[k] + b));
                else cp_async4(sx + (r >> 2) * Q8S_LD + ST_DW + 4 * (r & 3), dwb + 2 * ((src.w[k] + b) & ~1));
            }
        }
        if (tid < S::BN)
            cp_async4(scb ? sd + 4 * TC_ROWS + 4 * tid : sx + tid * Q8S_LD + ST_DA, a.act + s.act[tid] + a.cols + 4 * b);
    }
    if (scb) { // the sub-block sums: [nbr floats][nbr × 16 int16] after the row's quants
        const int64_t bso = a.cols + 4 * (int64_t)nbr + 32 * b;
        if ((nbr & 3) == 0) {
#pragma unroll
            for (int k = 0; k < (2 * S::BN + S::THREADS - 1) / S::THREADS; k++) {
                const int id = tid + S::THREADS * k, j = id >> 1, c = id & 1;
                if (id < 2 * S::BN) cp_async16(sx + j * Q8S_LD + 256 + 16 * c, a.act + s.act[j] + bso + 16 * c);
            }
        } else {
#pragma unroll
            for (int k = 0; k < 8 * S::BN / S::THREADS; k++) {
                const int id = tid + S::THREADS * k, j = id >> 3, c = id & 7;
                cp_async4(sx + j * Q8S_LD + 256 + 4 * c, a.act + s.act[j] + bso + 4 * c);
            }
        }
    }
    cp_async_commit();
}

// st_wait waits for block b's stage (groups are committed one per block,
// an empty one past the last) and makes it visible to the CTA; after it the
// stage of block b-1 is free, and the caller copies block b+2 into it.
__device__ __forceinline__ void st_wait() {
    cp_async_wait<ST_NS - 2>();
    __syncthreads();
}

// StGeo: this thread's rows and slots in a staged kernel. Row index i =
// 2·mt + hl is CTA-local row lr[i] = warp·16·MT + 16·mt + 8·hl + g (global
// row gr, clamped, inside matrix mat; gb[i] = gr · blocks a row, the index
// of its first block's scale: tc_launch bounds the blocks to 31 bits);
// n-tile nt's output slots are 8nt + 2q + {0, 1}.
template <int MT> struct StGeo {
    int g, q, ntl;       // lane/4, lane%4, n-tiles with a slot
    int lr[2 * MT];
    int gb[2 * MT];
    bool live;           // the warp has a row inside the matrix
};

template <int MT, int NT>
__device__ __forceinline__ bool st_geo(StGeo<MT> &G, const MVArgs &a, int64_t &mat, int cnt) {
    const bool mat_ok = mat >= 0 && mat < a.n_mat;
    if (!mat_ok) mat = 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    G.g = lane >> 2;
    G.q = lane & 3;
    G.ntl = min(NT, (cnt + 7) >> 3);
    const int row0 = blockIdx.y * TC_ROWS;
    G.live = row0 + warp * 16 * MT < a.rows;
#pragma unroll
    for (int i = 0; i < 2 * MT; i++) {
        G.lr[i] = warp * 16 * MT + (i >> 1) * 16 + (i & 1) * 8 + G.g;
        G.gb[i] = (int)((mat * a.rows + min(row0 + G.lr[i], a.rows - 1)) * (a.cols / 256));
    }
    return mat_ok;
}

// st_staged_scales reads a stage's activation scales of this thread's
// output slots (8nt + 2q + j at da[2nt + j]) in the first ntl n-tiles, slot
// j's at base + j·stride (IQ2_XXS: in the rows' padding, stride Q8S_LD;
// Q2_K: an array, stride 4); the others' are 0 (a 256-token fast chunk has
// ≈ 6 selections an expert: one n-tile of four, cuda/NOTES.md v50). NT = 8
// (st_nta: no checks in the block loops) reads all of them.
template <int NT>
__device__ __forceinline__ void st_staged_scales(const uint8_t *base, int stride, int q, int ntl, float (&da)[2 * NT]) {
    if (NT == 8) ntl = NT;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++) da[2 * nt + j] = nt < ntl ? *(const float *)(base + (8 * nt + 2 * q + j) * stride) : 0.f;
}

// st_store writes the accumulators: acc[mt][nt][i] is row lr[2mt + (i>>1)],
// slot 8nt + 2q + (i&1); NaN for a matrix id outside the tensor.
template <int MT, int NT, int BN>
__device__ __forceinline__ void st_store(const MVArgs &a, const SlotsT<BN> &s, const StGeo<MT> &G, int cnt,
                                         float (&acc)[MT][NT][4], bool mat_ok, float final_scale) {
    const float nan = __int_as_float(0x7fc00000);
    const int row0 = blockIdx.y * TC_ROWS;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = row0 + G.lr[2 * mt + (i >> 1)];
                const int slot = 8 * nt + 2 * G.q + (i & 1);
                if (r >= a.rows || slot >= cnt) continue;
                float v = acc[mt][nt][i];
                if (final_scale != 1.0f) v = __fmul_rn(final_scale, v);
                a.y[s.y[slot] + r] = mat_ok ? v : nan;
            }
}

// st_nta calls f with the number of n-tiles to compute for ntl n-tiles with
// a slot, as a compile-time tag (NTags<N>::value) and whether the block
// loops must still check ntl. NT = 8: ntl rounded up to even (the extra
// n-tile reads clamped slots; its sums are not stored), no check — the
// block loops have no branch inside, so the compiler overlaps a
// sub-block's decoding with the previous one's products (IQ2_XXS with 64
// slots: 1182 → 1039 µs a Flash prefill call, cuda/NOTES.md v12). NT = 4:
// all 4 with the check (four inlined copies of the 32-slot kernels' loops
// spill registers and lose: 1250 → 1392 µs).
template <int N, bool C> struct NTags {
    static constexpr int value = N;
    static constexpr bool check = C;
};
template <int NT, class F> __device__ __forceinline__ void st_nta(int ntl, F &&f) {
    if (NT == 8) {
        switch ((ntl + 1) >> 1) {
        case 1: f(NTags<2, false>{}); break;
        case 2: f(NTags<4, false>{}); break;
        case 3: f(NTags<(NT < 6 ? NT : 6), false>{}); break;
        default: f(NTags<NT, false>{}); break;
        }
    } else {
        f(NTags<NT, true>{});
    }
}

// IQ2Tab: the staged IQ2_XXS kernels' lookup table in shared memory, 512-byte
// aligned (iq2_block ORs a sign index into its base, so the alignment is
// load-bearing; TestMatMulTensorCores would see a table off it): the 128
// sign patterns' byte selectors (sign_entry) at words 0 … 127, the
// codebook's (tab_entry) from word GRID.
struct IQ2Tab {
    static constexpr int GRID = 128, WORDS = 384;
};

// iq2_block multiplies one staged IQ2_XXS block (weights ws, activations
// xs) into acc for the first NTA n-tiles. Each group of 8 weights is
// decoded as the decode kernels do (TIQ2_XXS::dot_reg): the codebook entry
// as byte selectors (tab_entry) ORed with the sign pattern's (sign_entry),
// both one 32-bit lookup in the CTA's table at shared address tb (IQ2Tab:
// not replicated per lane), then one byte permute of the magnitudes and
// their negations for each 4 weights — the int8 weights the 64-bit grid
// lookup and the computed sign masks gave before v49, so the same sums, in
// ≈ half the instructions (a 256-token fast chunk 89 ms against 94). The
// lookups' addresses take two instructions each (v50): the codebook's a
// byte permute and a multiply-add, the signs' a rotation that leaves the
// 7-bit field at bit 2 and one LOP3 that masks it and ORs in the table's
// 512-byte-aligned base.
template <int MT, int NT, int NTA, bool CHECK>
__device__ __forceinline__ void iq2_block(const uint8_t *ws, const uint8_t *xs, uint32_t tb,
                                          const StGeo<MT> &G, const float (&dw)[2 * MT], const float (&da)[2 * NT],
                                          float (&acc)[MT][NT][4]) {
    int bs[MT][NTA][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NTA; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) bs[mt][nt][i] = 0;
    const uint32_t bsel = 0x4440u | (uint32_t)G.q; // byte q of a word, zero-extended (its codebook index)
    const uint32_t rot = (7u * G.q - 2u) & 31u;       // sign field q (bits 7q …) rotated to bit 2
    const uint32_t gb = tb + 4 * IQ2Tab::GRID;
#pragma unroll
    for (int ib = 0; ib < 8; ib++) {
        int A[MT][4], ls[2 * MT];
#pragma unroll
        for (int i = 0; i < 2 * MT; i++) {
            const int2 qw = *(const int2 *)(ws + st_off(G.lr[i], 8 * ib));
            const uint32_t aux = (uint32_t)qw.y;
            ls[i] = 2 * (int)(aux >> 28) + 1;
            const int mt = i >> 1, hl = i & 1;
            constexpr uint32_t POS = 0x002b1908u, NEG = 0x00d5e7f8u; // 8, 25, 43 and their negations
            const uint32_t sel = lds32((uint32_t)prmt((uint32_t)qw.x, 0u, bsel) * 4u + gb) |
                                 lds32((__funnelshift_r(aux, aux, rot) & 0x1fcu) | tb);
            A[mt][hl] = prmt(POS, NEG, sel);
            A[mt][2 + hl] = prmt(POS, NEG, sel >> 16);
        }
#pragma unroll
        for (int nt = 0; nt < NTA; nt++) {
            if (CHECK && nt >= G.ntl) break;
            const int2 x = *(const int2 *)(xs + (8 * nt + G.g) * Q8S_LD + 32 * ib + 8 * G.q);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int c[4] = {0, 0, 0, 0};
                mma_s8(c, A[mt], x.x, x.y);
#pragma unroll
                for (int i = 0; i < 4; i++) bs[mt][nt][i] += c[i] * ls[2 * mt + (i >> 1)];
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NTA; nt++) {
            if (CHECK && nt >= G.ntl) break;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float d = __fmul_rn(dw[2 * mt + (i >> 1)], da[2 * nt + (i & 1)]);
                acc[mt][nt][i] = __fadd_rn(acc[mt][nt][i], __fmul_rn(d, (float)bs[mt][nt][i]));
            }
        }
}

template <int MT, int NT>
__global__ void __launch_bounds__(StShape<MT, NT>::THREADS, StShape<MT, NT>::MINB) k_tc_iq2_xxs_st(TCArgs p) {
    using S = StShape<MT, NT>;
    mv_pdl_enter(p.a);
    __shared__ SlotsT<S::BN> s;
    extern __shared__ __align__(16) uint8_t s_st[]; // [ST_NS][S::IQ2]
    __shared__ __align__(512) uint32_t s_tab[IQ2Tab::WORDS]; // (iq2_block)
    for (int i = threadIdx.x; i < IQ2Tab::WORDS; i += blockDim.x)
        s_tab[i] = i < IQ2Tab::GRID ? TIQ2_XXS::sign_entry((uint32_t)i) : TIQ2_XXS::tab_entry(i - IQ2Tab::GRID);
    const uint32_t tb = (uint32_t)__cvta_generic_to_shared(s_tab);
    int64_t mat;
    const int cnt = tc_slots<S::BN>(p, s, &mat); // synchronises (after the codebook too)
    const MVArgs &a = p.a;
    if (cnt <= 0) return;
    StGeo<MT> G;
    const bool mat_ok = st_geo<MT, NT>(G, a, mat, cnt);
    const int nbr = a.cols / 256;
    const int64_t NB = a.R * nbr;
    const __half *db = (const __half *)(a.w + NB * 64);
    const int64_t mrow = mat * a.rows;
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.f;
    StSrc<S> src;
    st_src<S>(src, a, s, mrow, nbr);
    const uint8_t *dwb = (const uint8_t *)db;
    st_issue<S>(a, s, src, mrow, nbr, nullptr, 0, s_st, dwb);
    if (nbr > 1) st_issue<S>(a, s, src, mrow, nbr, nullptr, 1, s_st + S::IQ2, dwb);
    else cp_async_commit();
    for (int b = 0; b < nbr; b++) {
        st_wait();
        if (b + 2 < nbr) st_issue<S>(a, s, src, mrow, nbr, nullptr, b + 2, s_st + ((b + 2) % ST_NS) * S::IQ2, dwb);
        else cp_async_commit();
        if (!G.live) continue; // (warps past the matrix still stage and synchronise)
        const uint8_t *ws = s_st + (b % ST_NS) * S::IQ2, *xs = ws + ST_W;
        float dw[2 * MT], da[2 * NT];
#pragma unroll
        for (int i = 0; i < 2 * MT; i++) {
            const uint32_t w = *(const uint32_t *)(xs + (G.lr[i] >> 2) * Q8S_LD + ST_DW + 4 * (G.lr[i] & 3));
            dw[i] = __half2float(__ushort_as_half((unsigned short)(w >> (16 * ((G.gb[i] + b) & 1)))));
        }
        st_staged_scales<NT>(xs + ST_DA, Q8S_LD, G.q, G.ntl, da);
        st_nta<NT>(G.ntl, [&](auto tag) { iq2_block<MT, NT, decltype(tag)::value, decltype(tag)::check>(ws, xs, tb, G, dw, da, acc); });
    }
    if (!G.live) return;
    st_store<MT, NT>(a, s, G, cnt, acc, mat_ok, 0.125f);
}

// q2k_block multiplies one staged Q2_K block (weights ws, scales ss,
// activations xs with their sub-block sums at byte 256 of each row; row
// scales dm) into acc for the first NTA n-tiles. The scaled quants' sums
// take one m16n8k32 a plane; the minimums' Σ_j m_j·bsum_j, the integer the
// minimums as weights would give, takes two m16n8k16 a block: thread q's k
// lanes are sub-blocks 4q … 4q+3, the 4-bit minimums (u8) against the int16
// sums split into their low (u8) and high (s8) bytes, 256·hi + lo — eight
// m16n8k32 a block and their operands before v50 (cuda/NOTES.md v50).
template <int MT, int NT, int NTA, bool CHECK>
__device__ __forceinline__ void q2k_block(const uint8_t *ws, const uint8_t *ss, const uint8_t *xs, const StGeo<MT> &G,
                                          const __half2 (&dm)[2 * MT], const float (&da)[2 * NT],
                                          float (&acc)[MT][NT][4]) {
    int ci[MT][NTA][4], cm[MT][NTA][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NTA; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) ci[mt][nt][i] = cm[mt][nt][i] = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) { // half h: values 128h … 128h+127, quant bytes 32h … 32h+31
        int2 qw[2 * MT], sc[2 * MT]; // per row: this thread's 8 quant bytes of the half; the half's 8 scale bytes
#pragma unroll
        for (int i = 0; i < 2 * MT; i++) {
            qw[i] = *(const int2 *)(ws + st_off(G.lr[i], 32 * h + 8 * G.q));
            sc[i] = *(const int2 *)(ss + 16 * G.lr[i] + 8 * h);
        }
#pragma unroll
        for (int pl = 0; pl < 4; pl++) { // plane pl: values 32(4h+pl) … +31
            const int ks = 4 * h + pl, sh = 2 * pl;
            const int sub = 2 * pl + (G.q >> 1); // this thread's 16-value sub-block among the half's 8
            int A[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hl = 0; hl < 2; hl++) { // row lo (g) / hi (g+8)
                    const int i = 2 * mt + hl;
                    const int word = sub < 4 ? sc[i].x : sc[i].y;
                    const int sb = (word >> (8 * (sub & 3))) & 15;
                    A[mt][hl] = (int)(((unsigned)qw[i].x >> sh) & 0x03030303u) * sb;
                    A[mt][2 + hl] = (int)(((unsigned)qw[i].y >> sh) & 0x03030303u) * sb;
                }
#pragma unroll
            for (int nt = 0; nt < NTA; nt++) {
                if (CHECK && nt >= G.ntl) break;
                const int2 v = *(const int2 *)(xs + (8 * nt + G.g) * Q8S_LD + 32 * ks + 8 * G.q);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) mma_s8(ci[mt][nt], A[mt], v.x, v.y);
            }
        }
    }
    int M[MT][2]; // the minimums of sub-blocks 4q … 4q+3: rows g, g+8 of each m-tile
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hl = 0; hl < 2; hl++) M[mt][hl] = (int)((*(const uint32_t *)(ss + 16 * G.lr[2 * mt + hl] + 4 * G.q) >> 4) & 0x0f0f0f0fu);
#pragma unroll
    for (int nt = 0; nt < NTA; nt++) {
        if (CHECK && nt >= G.ntl) break;
        const int2 bs = *(const int2 *)(xs + (8 * nt + G.g) * Q8S_LD + 256 + 8 * G.q); // slot g's sums 4q … 4q+3
        const int lo = prmt((uint32_t)bs.x, (uint32_t)bs.y, 0x6420u), hi = prmt((uint32_t)bs.x, (uint32_t)bs.y, 0x7531u);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            int ch[4] = {0, 0, 0, 0};
            mma_k16_u8<false>(cm[mt][nt], M[mt], lo);
            mma_k16_u8<true>(ch, M[mt], hi);
#pragma unroll
            for (int i = 0; i < 4; i++) cm[mt][nt][i] += 256 * ch[i];
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NTA; nt++) {
            if (CHECK && nt >= G.ntl) break;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const __half2 d2 = dm[2 * mt + (i >> 1)];
                const float x = da[2 * nt + (i & 1)];
                const float dall = __fmul_rn(x, __low2float(d2)), dmin = __fmul_rn(x, __high2float(d2));
                const float term = __fsub_rn(__fmul_rn(dall, (float)ci[mt][nt][i]), __fmul_rn(dmin, (float)cm[mt][nt][i]));
                acc[mt][nt][i] = __fadd_rn(acc[mt][nt][i], term);
            }
        }
}

template <int MT, int NT>
__global__ void __launch_bounds__(StShape<MT, NT>::THREADS, StShape<MT, NT>::MINB_Q2K) k_tc_q2_k_st(TCArgs p) {
    using S = StShape<MT, NT>;
    mv_pdl_enter(p.a);
    __shared__ SlotsT<S::BN> s;
    extern __shared__ __align__(16) uint8_t s_st[]; // [ST_NS][S::Q2K]
    int64_t mat;
    const int cnt = tc_slots<S::BN>(p, s, &mat);
    const MVArgs &a = p.a;
    if (cnt <= 0) return;
    StGeo<MT> G;
    const bool mat_ok = st_geo<MT, NT>(G, a, mat, cnt);
    const int nbr = a.cols / 256;
    const int64_t NB = a.R * nbr;
    const uint8_t *scb = a.w + NB * 64, *dmb = a.w + NB * 80;
    const int64_t mrow = mat * a.rows;
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.f;
    StSrc<S> src;
    st_src<S>(src, a, s, mrow, nbr);
    st_issue<S>(a, s, src, mrow, nbr, scb, 0, s_st, dmb);
    if (nbr > 1) st_issue<S>(a, s, src, mrow, nbr, scb, 1, s_st + S::Q2K, dmb);
    else cp_async_commit();
    for (int b = 0; b < nbr; b++) {
        st_wait();
        if (b + 2 < nbr) st_issue<S>(a, s, src, mrow, nbr, scb, b + 2, s_st + ((b + 2) % ST_NS) * S::Q2K, dmb);
        else cp_async_commit();
        if (!G.live) continue;
        const uint8_t *ws = s_st + (b % ST_NS) * S::Q2K, *ss = ws + ST_W, *xs = ss + ST_SC;
        __half2 dm[2 * MT];
        float da[2 * NT];
#pragma unroll
        for (int i = 0; i < 2 * MT; i++) dm[i] = *(const __half2 *)(xs + S::Q2K_D + 4 * G.lr[i]);
        st_staged_scales<NT>(xs + S::Q2K_D + 4 * TC_ROWS, 4, G.q, G.ntl, da);
        st_nta<NT>(G.ntl, [&](auto tag) { q2k_block<MT, NT, decltype(tag)::value, decltype(tag)::check>(ws, ss, xs, G, dm, da, acc); });
    }
    if (!G.live) return;
    st_store<MT, NT>(a, s, G, cnt, acc, mat_ok, 1.0f);
}

// ---------------------------------------------------------------- Q8_0, 64 slots
// k_tc_q8_0's products (the same terms in the same order, so the same bits)
// with CTAs of 8 warps, each 16 rows × 64 slots (8 n-tiles), so that each
// staged weight row serves 64 tokens instead of 32 (half the weight traffic
// from L2 a token) and an SM holds 16 warps instead of 8. Stages of 4 blocks
// (128 values), three deep: 128 weight rows and 64 activation rows padded to
// 160 bytes (conflict-free 8-byte reads per half-warp), the rows' 4 f16
// scales, and the slots' 4 f32 scales as [block][slot] so that a thread's
// two slots (2q, 2q+1) are one 8-byte read.
constexpr int Q8W_BN = 64;
constexpr int Q8W_LD = 160;
constexpr int Q8W_A = TC_ROWS * Q8W_LD, Q8W_B = Q8W_BN * Q8W_LD;
constexpr int Q8W_DW = TC_ROWS * 8, Q8W_DA = 4 * Q8W_BN * 4;
constexpr int Q8W_STAGE = Q8W_A + Q8W_B + Q8W_DW + Q8W_DA; // 32 KiB
constexpr int Q8W_NS = 3;
// OptTCQ8W 2 picks k_tc_q8_0_w for matrices of at most this many columns
// (Flash's q_b: 32768 x 1024 ran 764 against 817 us a 2048-token chunk on an
// H200), k_tc_q8_0 for longer rows (attn_out_b 4096 x 8192: 646 against 732).
constexpr int Q8W_AUTO_COLS = 1024;

// q8w_stage multiplies one staged 4-block stage into acc for the first NTA
// n-tiles.
template <int NTA>
__device__ __forceinline__ void q8w_stage(const uint8_t *sg, const StGeo<1> &G, float (&acc)[1][8][4]) {
    const uint8_t *sa = sg, *sb = sa + Q8W_A;
    const __half *sdw = (const __half *)(sb + Q8W_B);
    const float *sda = (const float *)(sb + Q8W_B + Q8W_DW);
#pragma unroll
    for (int bb = 0; bb < 4; bb++) {
        const int2 lo = *(const int2 *)(sa + G.lr[0] * Q8W_LD + 32 * bb + 8 * G.q);
        const int2 hi = *(const int2 *)(sa + G.lr[1] * Q8W_LD + 32 * bb + 8 * G.q);
        const int A[4] = {lo.x, hi.x, lo.y, hi.y};
        const float dw[2] = {__half2float(sdw[G.lr[0] * 4 + bb]), __half2float(sdw[G.lr[1] * 4 + bb])};
#pragma unroll
        for (int nt = 0; nt < NTA; nt++) {
            const int2 x = *(const int2 *)(sb + (8 * nt + G.g) * Q8W_LD + 32 * bb + 8 * G.q);
            const float2 da = *(const float2 *)(sda + bb * Q8W_BN + 8 * nt + 2 * G.q);
            int c[4] = {0, 0, 0, 0};
            mma_s8(c, A, x.x, x.y);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float sc = __fmul_rn(dw[i >> 1], (i & 1) ? da.y : da.x);
                acc[0][nt][i] = __fadd_rn(acc[0][nt][i], __fmul_rn((float)c[i], sc));
            }
        }
    }
}

__global__ void __launch_bounds__(256, 2) k_tc_q8_0_w(TCArgs p) {
    mv_pdl_enter(p.a);
    __shared__ SlotsT<Q8W_BN> s;
    extern __shared__ __align__(16) uint8_t s_q8[]; // [Q8W_NS][Q8W_STAGE]
    int64_t mat;
    const int cnt = tc_slots<Q8W_BN>(p, s, &mat);
    const MVArgs &a = p.a;
    if (cnt <= 0) return;
    StGeo<1> G;
    const bool mat_ok = st_geo<1, 8>(G, a, mat, cnt);
    const int tid = threadIdx.x, row0 = blockIdx.y * TC_ROWS;
    const int nb = a.cols / 32, nst = a.cols / 128;
    const int8_t *wq = (const int8_t *)a.w;
    const __half *wd = (const __half *)(a.w + a.R * a.cols);
    const int64_t mrow = mat * a.rows;
    // this thread's copies of a stage: chunk tid&7 of weight rows (tid>>3) +
    // 32k and of activation rows (tid>>3) + 32k; row tid's 4 scales; the
    // scale of block tid>>6 of slot tid&63
    auto issue = [&](int st, uint8_t *sg) {
        uint8_t *sa = sg, *sb = sa + Q8W_A, *sdw = sb + Q8W_B, *sda = sdw + Q8W_DW;
        const int c = tid & 7;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r = (tid >> 3) + 32 * k;
            cp_async16(sa + r * Q8W_LD + 16 * c, wq + (mrow + min(row0 + r, a.rows - 1)) * a.cols + 128 * st + 16 * c);
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int j = (tid >> 3) + 32 * k;
            cp_async16(sb + j * Q8W_LD + 16 * c, a.act + s.act[j] + 128 * st + 16 * c);
        }
        if (tid < TC_ROWS) cp_async8(sdw + 8 * tid, wd + (mrow + min(row0 + tid, a.rows - 1)) * nb + 4 * st);
        cp_async4(sda + 4 * tid, (const float *)(a.act + s.act[tid & 63] + a.cols) + 4 * st + (tid >> 6));
        cp_async_commit();
    };
    float acc[1][8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[0][nt][i] = 0.f;
    issue(0, s_q8);
    if (nst > 1) issue(1, s_q8 + Q8W_STAGE);
    else cp_async_commit();
    for (int st = 0; st < nst; st++) {
        st_wait();
        if (st + 2 < nst) issue(st + 2, s_q8 + ((st + 2) % Q8W_NS) * Q8W_STAGE);
        else cp_async_commit();
        if (!G.live) continue; // (warps past the matrix still stage and synchronise)
        const uint8_t *sg = s_q8 + (st % Q8W_NS) * Q8W_STAGE;
        st_nta<8>(G.ntl, [&](auto tag) { q8w_stage<decltype(tag)::value>(sg, G, acc); });
    }
    if (!G.live) return;
    st_store<1, 8>(a, s, G, cnt, acc, mat_ok, 1.0f);
}

// ---------------------------------------------------------------- grouping
// Tile bound for n_sel selections over n_mat matrices (plus one bucket for
// ids outside [0, n_mat), whose rows come out NaN).
int64_t group_tiles(int64_t n_sel, int64_t n_mat) { return (n_sel + TC_TILE - 1) / TC_TILE + n_mat + 1; }

int64_t group_perm_bytes(int64_t n_sel) { return ((4 * n_sel + 15) / 16) * 16; }

// Part bound: Σ ⌈c/TC_PART⌉ over the n_mat + 1 buckets' counts c.
int64_t group_parts(int64_t n_sel, int64_t n_mat) { return (n_sel + TC_PART - 1) / TC_PART + n_mat + 1; }

// k_group sorts the selections by matrix (a counting sort; the order within
// a matrix is arbitrary, which no result depends on) and writes the tile
// table: tiles of up to TC_TILE selections of one matrix, then empty tiles
// up to the bound; and the part list (TCArgs::parts): each tile's parts of
// TC_PART selections in tile order, then −1 up to pbound. One CTA.
__global__ void __launch_bounds__(1024) k_group(const int32_t *ids, int n_sel, int n_mat, int32_t *perm, int4 *tiles,
                                                int bound, int32_t *parts, int pbound) {
    pdl_enter();
    extern __shared__ int g_sh[];
    const int nbk = n_mat + 1;
    int *cnt = g_sh, *off = g_sh + nbk, *toff = g_sh + 2 * nbk; // toff and poff have nbk+1 entries
    int *poff = toff + nbk + 1;
    const int tid = threadIdx.x, nth = blockDim.x;
    for (int i = tid; i < nbk; i += nth) cnt[i] = 0;
    __syncthreads();
    for (int s = tid; s < n_sel; s += nth) {
        const int e = ids[s];
        atomicAdd(&cnt[(e >= 0 && e < n_mat) ? e : n_mat], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int o = 0, to = 0, po = 0;
        for (int k = 0; k < nbk; k++) {
            off[k] = o;
            toff[k] = to;
            poff[k] = po;
            o += cnt[k];
            to += (cnt[k] + TC_TILE - 1) / TC_TILE;
            po += (cnt[k] + TC_PART - 1) / TC_PART;
        }
        toff[nbk] = to;
        poff[nbk] = po;
    }
    __syncthreads();
    for (int k = tid; k < nbk; k += nth) {
        const int c = cnt[k];
        for (int j = 0; j * TC_TILE < c; j++)
            tiles[toff[k] + j] = make_int4(k == n_mat ? -1 : k, off[k] + j * TC_TILE, min(TC_TILE, c - j * TC_TILE), 0);
        for (int j = 0; j * TC_PART < c; j++) parts[poff[k] + j] = 4 * (toff[k] + j / 4) + j % 4;
    }
    for (int i = toff[nbk] + tid; i < bound; i += nth) tiles[i] = make_int4(0, 0, 0, 0);
    for (int i = poff[nbk] + tid; i < pbound; i += nth) parts[i] = -1;
    __syncthreads();
    for (int i = tid; i < nbk; i += nth) cnt[i] = 0; // now the cursors
    __syncthreads();
    for (int s = tid; s < n_sel; s += nth) {
        const int e = ids[s];
        const int k = (e >= 0 && e < n_mat) ? e : n_mat;
        perm[off[k] + atomicAdd(&cnt[k], 1)] = s;
    }
}

// tc_go launches kern (threads a CTA, smem dynamic bytes, bn slots a CTA)
// over yb row blocks: grouped (p.tiles), p.n_parts parts in x when bn is
// TC_PART and p has the part list, else xcount tiles in x and TC_TILE / bn
// parts in z; dense, xcount tokens in x (bn a CTA) and zcount selections
// in z. *set records that the kernel's shared-memory limit was raised.
template <class K>
void tc_go(K kern, int threads, int smem, int bn, bool *set, const TCArgs &p, int xcount, int zcount, unsigned yb,
           cudaStream_t st) {
    if (smem > 48 * 1024 && !*set) {
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        *set = true;
    }
    TCArgs q = p;
    if (!q.tiles || bn != TC_PART || !ds4c_opt_tc_parts()) q.parts = nullptr;
    const dim3 grid(q.parts ? (unsigned)q.n_parts : q.tiles ? (unsigned)xcount : (unsigned)((xcount + bn - 1) / bn), yb,
                    q.parts ? 1u : q.tiles ? (unsigned)(TC_TILE / bn) : (unsigned)zcount);
    ds4c_launch(kern, grid, threads, (size_t)smem, st, q);
}

// TC_IQ2_WIDE_MIN is the selections a matrix (tokens, for a dense
// product) from which OptTCStage 3 puts IQ2_XXS on CTAs of 8 warps × 64
// slots; below it, CTAs of 4 warps × 32 slots. A fast chunk of a few
// hundred tokens (≈ 6 selections an expert) decodes each weight for one
// n-tile either way, and the 32-slot CTAs ran its routed experts faster:
// a 256-token chunk at 25k 93.7–94.4 ms against 103.8–105.2, 1024 tokens
// 173 against 178.6 (cuda/NOTES.md v49); from ≈ 96 an expert the 64-slot
// CTAs decode each weight half as often (v12).
constexpr int TC_IQ2_WIDE_MIN = 32;

// tc_launch runs the tensor-core product of type (the variant OptTCStage
// picks, for per_mat selections a matrix on average) over the rows of p.a;
// xcount and zcount as tc_go's.
int tc_launch(int type, const TCArgs &p, int xcount, int zcount, int per_mat, cudaStream_t st) {
    if ((p.a.rows + TC_ROWS - 1) / TC_ROWS > 65535) return ds4c_err(DS4C_EINVAL, "matmul: %d rows", p.a.rows);
    if ((int64_t)p.a.R * (p.a.cols / 256) > 0x7fffffff) // (StGeo::gb)
        return ds4c_err(DS4C_EINVAL, "matmul: %lld rows of %lld columns", (long long)p.a.R, (long long)p.a.cols);
    const unsigned yb = (unsigned)((p.a.rows + TC_ROWS - 1) / TC_ROWS);
    const int stage = ds4c_opt_tc_stage();
    using S4 = StShape<2, 4>;
    using S8 = StShape<1, 8>;
    switch (type) {
    case DS4C_Q8_0: {
        static bool set = false, setw = false;
        const int q8w = ds4c_opt_tc_q8w();
        if (q8w == 1 || (q8w == 2 && p.a.cols <= Q8W_AUTO_COLS))
            tc_go(k_tc_q8_0_w, 256, Q8W_NS * Q8W_STAGE, Q8W_BN, &setw, p, xcount, zcount, yb, st);
        else
            tc_go(k_tc_q8_0, 128, 2 * Q8S_STAGE, TC_BN, &set, p, xcount, zcount, yb, st);
        break;
    }
    case DS4C_Q2_K: {
        static bool set4 = false, set8 = false;
        if (stage == 2)
            tc_go(k_tc_q2_k_st<1, 8>, S8::THREADS, ST_NS * S8::Q2K, S8::BN, &set8, p, xcount, zcount, yb, st);
        else if (stage == 1 || stage == 3)
            tc_go(k_tc_q2_k_st<2, 4>, S4::THREADS, ST_NS * S4::Q2K, S4::BN, &set4, p, xcount, zcount, yb, st);
        else
            tc_go(k_tc_q2_k, 128, 0, TC_BN, nullptr, p, xcount, zcount, yb, st);
        break;
    }
    case DS4C_IQ2_XXS: {
        static bool set4 = false, set8 = false;
        if (stage == 2 || (stage == 3 && per_mat >= TC_IQ2_WIDE_MIN))
            tc_go(k_tc_iq2_xxs_st<1, 8>, S8::THREADS, ST_NS * S8::IQ2, S8::BN, &set8, p, xcount, zcount, yb, st);
        else if (stage == 1 || stage == 3)
            tc_go(k_tc_iq2_xxs_st<2, 4>, S4::THREADS, ST_NS * S4::IQ2, S4::BN, &set4, p, xcount, zcount, yb, st);
        else
            tc_go(k_tc_iq2_xxs, 128, 0, TC_BN, nullptr, p, xcount, zcount, yb, st);
        break;
    }
    default: return ds4c_err(DS4C_ETYPE, "no tensor-core product for type %d", type);
    }
    DS4C_CHECK_LAUNCH("matmul (tensor cores)");
    return 0;
}

} // namespace

bool tc_supported(int type, int64_t cols) {
    return (type == DS4C_Q8_0 || type == DS4C_Q2_K || type == DS4C_IQ2_XXS) && cols % 256 == 0;
}

// act_span_ok says whether the activation rows of a product (the last
// one's offset plus a row's bytes) stay within StSrc's 31-bit offsets.
static bool act_span_ok(int64_t last_off, int64_t cols) {
    return last_off + (int64_t)ds4c_act_bytes(DS4C_Q8_K, cols) + 4 * cols <= 0x7fffffff;
}

int tc_dense(int type, const MVArgs &a, int n_sel, int n_tok, cudaStream_t st) {
    if (!act_span_ok((int64_t)(n_sel - 1) / max(1, a.act_div) * a.act_sel + (int64_t)(n_tok - 1) * a.act_tok, a.cols))
        return ds4c_err(DS4C_EINVAL, "matmul: activations span more than 2 GiB");
    TCArgs p;
    p.a = a;
    p.n_tok = n_tok;
    p.tiles = nullptr;
    p.perm = nullptr;
    return tc_launch(type, p, n_tok, n_sel, n_tok, st);
}

} // namespace ds4mv

using namespace ds4mv;

extern "C" {

uint64_t ds4c_group_bytes(int n_sel, int64_t n_mat) {
    if (n_sel < 0 || n_mat <= 0) return 0;
    return (uint64_t)(group_perm_bytes(n_sel) + 16 * group_tiles(n_sel, n_mat) + 4 * group_parts(n_sel, n_mat));
}

int ds4c_group(const int32_t *d_ids, int n_sel, int64_t n_mat, void *d_scratch, void *stream) {
    DS4C_READY();
    if (n_sel <= 0 || n_sel < ds4c_opt_tc_min_sel()) return 0; // ds4c_matmul_grouped will not read it
    if (n_mat <= 0 || n_mat > 4096) return ds4c_err(DS4C_EINVAL, "group: %lld matrices (1..4096)", (long long)n_mat);
    const int64_t bound = group_tiles(n_sel, n_mat);
    if (bound > 65535) return ds4c_err(DS4C_EINVAL, "group: %d selections make too many tiles", n_sel);
    int32_t *perm = (int32_t *)d_scratch;
    int4 *tiles = (int4 *)((uint8_t *)d_scratch + group_perm_bytes(n_sel));
    int32_t *parts = (int32_t *)(tiles + bound);
    const size_t smem = (size_t)(4 * (n_mat + 1) + 2) * sizeof(int);
    ds4c_launch(k_group, 1, 1024, smem, as_stream(stream), d_ids, n_sel, (int)n_mat, perm, tiles, (int)bound, parts,
                (int)group_parts(n_sel, n_mat));
    DS4C_CHECK_LAUNCH("group");
    return 0;
}

int ds4c_matmul_grouped(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, const int32_t *d_ids,
                        int n_sel, const void *d_act, int64_t act_sel, int act_div, float *d_y, int64_t y_sel,
                        const void *d_scratch, int flags, void *stream) {
    DS4C_READY();
    if (n_sel <= 0) return 0;
    const bool aligned = (((uintptr_t)d_act | (uint64_t)act_sel) & 15) == 0; // 16-byte activation copies
    const bool half = (flags & DS4C_MM_HALF) != 0;
    if (half && (!ds4c_grouped_half_ok(type, cols, n_sel) || !aligned))
        return ds4c_err(DS4C_ETYPE, "grouped matmul: no f16 product for type %d, %lld columns, %d selections%s", type,
                        (long long)cols, n_sel, aligned ? "" : " (activations not 16-byte aligned)");
    if (!half && grouped_single(type, cols, n_sel, aligned))
        return ds4c_matmul_ex(type, d_w, rows, cols, n_mat, d_ids, n_sel, d_act, 0, act_sel, act_div, 1, d_y, 0,
                              y_sel, flags, stream);
    if (rows <= 0 || rows > 0x7fffffff || cols <= 0 || cols > 0x7fffffff || n_mat <= 0 || act_div <= 0)
        return ds4c_err(DS4C_EINVAL, "grouped matmul: bad shape or act_div");
    const int64_t bound = group_tiles(n_sel, n_mat);
    if (bound > 65535) return ds4c_err(DS4C_EINVAL, "grouped matmul: %d selections make too many tiles", n_sel);
    if (!half && !act_span_ok((int64_t)(n_sel - 1) / act_div * act_sel, cols))
        return ds4c_err(DS4C_EINVAL, "grouped matmul: activations span more than 2 GiB");
    TCArgs p;
    // (the tile table picks each selection's matrix; no ids, no token stride)
    p.a = mv_args(d_w, rows, cols, n_mat, nullptr, false, d_act, 0, act_sel, act_div, d_y, 0, y_sel);
    p.a.late = (flags & DS4C_MM_LATE) != 0;
    p.n_tok = 1;
    p.perm = (const int32_t *)d_scratch;
    p.tiles = (const int4 *)((const uint8_t *)d_scratch + group_perm_bytes(n_sel));
    p.parts = (const int32_t *)(p.tiles + bound);
    p.n_parts = (int)group_parts(n_sel, n_mat);
    if (half) return wg_grouped(type, p, (int)bound, as_stream(stream));
    return tc_launch(type, p, (int)bound, 1, (int)(n_sel / n_mat), as_stream(stream));
}

int ds4c_grouped_glu_ok(int type, int64_t rows, int64_t cols, int n_sel) {
    return ds4c_opt_wg_glu() && (ds4c_opt_wg_moe() == 5 || ds4c_opt_wg_moe() == 7) && rows > 0 && rows % 128 == 0 &&
                   ds4c_grouped_half_ok(type, cols, n_sel) == 2
               ? 1
               : 0;
}

int ds4c_matmul_grouped_glu(int type, const void *d_gate, const void *d_up, int64_t rows, int64_t cols, int64_t n_mat,
                            const int32_t *d_ids, int n_sel, const void *d_act, int64_t act_sel, int act_div,
                            const float *d_wts, float lim, void *d_yh, int out_perm, const void *d_scratch,
                            void *stream) {
    DS4C_READY();
    if (n_sel <= 0) return 0;
    const bool aligned = (((uintptr_t)d_act | (uint64_t)act_sel) & 15) == 0 && ((uintptr_t)d_yh & 15) == 0;
    if (!ds4c_grouped_glu_ok(type, rows, cols, n_sel) || !aligned || !d_wts)
        return ds4c_err(DS4C_ETYPE, "grouped gate/up product: type %d, %lld x %lld, %d selections not taken%s", type,
                        (long long)rows, (long long)cols, n_sel, aligned ? "" : " (rows not 16-byte aligned)");
    if (rows > 0x7fffffff || cols > 0x7fffffff || n_mat <= 0 || act_div <= 0)
        return ds4c_err(DS4C_EINVAL, "grouped gate/up product: bad shape or act_div");
    const int64_t bound = group_tiles(n_sel, n_mat);
    if (bound > 65535) return ds4c_err(DS4C_EINVAL, "grouped gate/up product: %d selections make too many tiles", n_sel);
    TCArgs p;
    // (y_sel 1: the slots' y offsets are their selections)
    p.a = mv_args(d_gate, rows, cols, n_mat, nullptr, false, d_act, 0, act_sel, act_div, nullptr, 0, 1);
    p.n_tok = 1;
    p.perm = (const int32_t *)d_scratch;
    p.tiles = (const int4 *)((const uint8_t *)d_scratch + group_perm_bytes(n_sel));
    p.w2 = (const uint8_t *)d_up;
    p.glu_w = d_wts;
    p.glu_lim = lim;
    p.glu_y = (__half *)d_yh;
    p.glu_perm = out_perm;
    return wg_grouped_glu(type, p, (int)bound, as_stream(stream));
}

int ds4c_grouped_half_ok(int type, int64_t cols, int n_sel) {
    const int v = ds4c_opt_wg_moe();
    if (v == 0 || (v == 3 && type == DS4C_Q2_K)) return 0; // (3: Q2_K stays on the int8 kernels, faster there)
    if (n_sel <= 0 || n_sel < ds4c_opt_tc_min_sel() || !wg_supported(type, cols)) return 0;
    return v >= 5 ? 2 : 1; // (5, 6, 7: the RS form reads the activations permuted)
}

} // extern "C"
