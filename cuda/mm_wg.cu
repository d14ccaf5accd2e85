// mm_wg.cu: fast mode's routed-expert products of chunks on the Hopper
// tensor cores through wgmma (f16 operands, f32 sums), for IQ2_XXS and Q2_K
// experts grouped by matrix (ds4c_group's tile table of up to TC_TILE
// selections of one expert).
//
// Not bit-identical to anything (fast mode only): the activations are the
// floats rounded to f16 (ds4c_to_half's rows, not Q8_K), and each weight is
// dequantized to f16 with its scales folded in — IQ2_XXS d·(2s+1) rounded
// to f16 once, times the grid magnitude (rounded once more), signed;
// Q2_K (d·sc)·q − dmin·m by one f16 fused multiply-add of f16 scale terms.
// The 1/8 of IQ2_XXS is applied to the float sums at the end.
//
// A CTA is 4 warpgroups (512 threads) over 256 weight rows (option
// wg_moe 2: IQ2_XXS in 2 warpgroups over 128 rows, two CTAs an SM) × the
// tile's selections (up to 128; m64n64 when the tile has at most 64), K in
// stages of 64 values, the 4 stages of a 256-value block unrolled so that
// every buffer offset is a constant. Each stage: the raw weight bytes and
// the activations are copied in by cp.async two stages ahead (4 buffers;
// each thread's source pointers and destinations formed once, the block
// scales loaded a block ahead into registers); every thread then
// decodes one row's 32 values (an IQ2_XXS sub-block, or one Q2_K plane) into
// f16 in shared memory in one of the tensor cores' K-major layouts (wg_cm:
// without swizzle, or — wg_moe 3 and 4 — with the 128-byte swizzle, whose
// conflict-free copies made IQ2_XXS 20 % faster); each warpgroup multiplies
// its 64 rows by the stage's activations with 4 asynchronous wgmma (k16)
// and waits only for the previous stage's, so the decoding of a stage
// overlaps the products of the one before. Which products come here is
// ds4c_grouped_half_ok's choice (wg_moe 3 leaves Q2_K to the int8 kernels).
// wg_moe 5 is k_wg_rs below: the weights decoded straight into wgmma's A
// registers; the default, 7, the same with Q2_K in CTAs of 2 warpgroups.
// Needs sm_90a (wgmma): the library builds this file for it
// (scripts/cuda/build-lib.sh) and wg_supported checks the device.
#include "mm_tc.cuh"
#include "wg.cuh"

namespace ds4mv {
namespace {

constexpr int WG_N = TC_TILE;           // selections a CTA (128)
constexpr int WG_K = 64;                // values a stage
constexpr int WG_NS = 4;                // activation and raw-weight buffers
constexpr int WG_B = WG_N * WG_K * 2;   // activations, a buffer
constexpr int WG_TYPE_IQ2 = 0, WG_TYPE_Q2K = 1;

// WgShape: a CTA of WGS warpgroups (64 weight rows each, two threads a
// row for the decoding); its buffers: decoded weights (2), activations and
// raw weight bytes (WG_NS each: IQ2_XXS 2 sub-blocks of 8 bytes a row,
// Q2_K 32 quant bytes and 4 scale bytes a row).
template <int T, int WGS, bool SW> struct WgShape {
    static constexpr int M = 64 * WGS;
    static constexpr int THREADS = 128 * WGS;
    static constexpr int A = M * WG_K * 2;
    static constexpr int RAW = M * (T == WG_TYPE_IQ2 ? 16 : 36);
    static constexpr int SMEM = (SW ? 1024 : 0) + 2 * A + WG_NS * (WG_B + RAW); // (SW: + alignment to 1024)
    static constexpr int MINB = WGS == 4 ? 1 : 2; // CTAs an SM the registers are capped for
};

// wg_h2 makes bytes b0, b1 of w (sel 0x4140) or b2, b3 (0x4342), small
// non-negative integers, an f16 pair: 1024 + b as f16 bits, minus 1024.
__device__ __forceinline__ __half2 wg_h2(uint32_t w, uint32_t sel) {
    const uint32_t h = __byte_perm(w, 0x64646464u, sel);
    return __hsub2(*(const __half2 *)&h, __float2half2_rn(1024.f));
}
__device__ __forceinline__ uint32_t wg_bits(__half2 h) { return *(const uint32_t *)&h; }

// wg_iq2_vals dequantizes IQ2_XXS grid entry gv (8 magnitudes) with its
// 7-bit sign field s7 (the 8th sign makes the count even) at scale s2 =
// d·(2s+1) (c2 = −1024·s2) into 4 f16 pairs, values 2p and 2p+1 in word
// p. FMA: each pair as one fused multiply-add (1024 + g)·s − 1024·s, exact
// but for the one rounding of g·s, when 1024·s is finite in f16 (|s| <
// 64); else (g)·s from the exact g.
template <bool FMA> __device__ __forceinline__ uint4 wg_iq2_vals(uint64_t gv, uint32_t s7, __half2 s2, __half2 c2) {
    const uint32_t s8 = s7 | ((__popc(s7) & 1) << 7);
    const uint32_t lo = (uint32_t)gv, hi = (uint32_t)(gv >> 32);
    auto pair = [&](uint32_t w, uint32_t sel) -> uint32_t {
        const uint32_t h = __byte_perm(w, 0x64646464u, sel); // 1024 + g, two f16
        if (FMA) return wg_bits(__hfma2(*(const __half2 *)&h, s2, c2));
        return wg_bits(__hmul2(__hsub2(*(const __half2 *)&h, __float2half2_rn(1024.f)), s2));
    };
    // sign bit of value 2p at bit 15, of value 2p+1 at bit 31 of pair p
    uint4 o;
    o.x = pair(lo, 0x4140) ^ ((s8 * 0x40008000u) & 0x80008000u);
    o.y = pair(lo, 0x4342) ^ ((s8 * 0x10002000u) & 0x80008000u);
    o.z = pair(hi, 0x4140) ^ ((s8 * 0x04000800u) & 0x80008000u);
    o.w = pair(hi, 0x4342) ^ ((s8 * 0x01000200u) & 0x80008000u);
    return o;
}

// wg_iq2 decodes one IQ2_XXS sub-block (quant words qw, scale d·(2s+1) as
// s2) into chunks c0 … c0+3 of the row at row (x: its index % 8).
template <bool FMA, bool SW>
__device__ __forceinline__ void wg_iq2(uint2 qw, __half2 s2, const uint64_t *s_grid, uint8_t *row, int x, int c0) {
    const __half2 c2 = __hmul2(s2, __float2half2_rn(-1024.f));
#pragma unroll
    for (int j = 0; j < 4; j++)
        *(uint4 *)(row + wg_coff<SW>(c0 + j, x)) =
            wg_iq2_vals<FMA>(s_grid[(qw.x >> (8 * j)) & 0xff], (qw.y >> (7 * j)) & 127, s2, c2);
}

// wg_q2k_group dequantizes 8 Q2_K values — the 2-bit fields at shift sh of
// the 8 quant bytes w — as (d·sc)·q − dmin·m, one f16 fused multiply-add
// with a2 = d·sc, b2 = −dmin·m, into 4 f16 pairs (values 2p, 2p+1 in word p).
__device__ __forceinline__ uint4 wg_q2k_group(uint2 w, int sh, __half2 a2, __half2 b2) {
    const uint32_t q0 = (w.x >> sh) & 0x03030303u, q1 = (w.y >> sh) & 0x03030303u;
    uint4 o;
    o.x = wg_bits(__hfma2(wg_h2(q0, 0x4140), a2, b2));
    o.y = wg_bits(__hfma2(wg_h2(q0, 0x4342), a2, b2));
    o.z = wg_bits(__hfma2(wg_h2(q1, 0x4140), a2, b2));
    o.w = wg_bits(__hfma2(wg_h2(q1, 0x4342), a2, b2));
    return o;
}

// wg_q2k_terms: the f16 scale terms d·(sc & 15) and −dmin·(sc >> 4) of a
// Q2_K sub-block with scale byte sc.
__device__ __forceinline__ void wg_q2k_terms(uint32_t sc, float d, float dmin, __half2 &a2, __half2 &b2) {
    a2 = __float2half2_rn(d * (float)(sc & 15));
    b2 = __float2half2_rn(-dmin * (float)(sc >> 4));
}

// wg_q2k decodes 32 Q2_K values — one plane (2-bit field at shift sh) of
// the 32 quant bytes q of a half block, two 16-value sub-blocks with scale
// bytes sc0, sc1 — into chunks c0 … c0+3 of the row at row (x: its index
// % 8).
template <bool SW>
__device__ __forceinline__ void wg_q2k(const uint8_t *q, int sh, uint32_t sc0, uint32_t sc1, float d, float dmin,
                                       uint8_t *row, int x, int c0) {
#pragma unroll
    for (int sb = 0; sb < 2; sb++) {
        __half2 a2, b2;
        wg_q2k_terms(sb ? sc1 : sc0, d, dmin, a2, b2);
#pragma unroll
        for (int c2 = 0; c2 < 2; c2++) {
            const int c = 2 * sb + c2;
            *(uint4 *)(row + wg_coff<SW>(c0 + c, x)) = wg_q2k_group(*(const uint2 *)(q + 8 * c), sh, a2, b2);
        }
    }
}

// cp.async of 16 bytes (through L2 only, or also L1: ca) or 4 bytes to a
// shared-memory address.
__device__ __forceinline__ void wg_cp16(uint32_t s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
}
__device__ __forceinline__ void wg_cp16ca(uint32_t s, const void *g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
}
__device__ __forceinline__ void wg_cp4(uint32_t s, const void *g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(g) : "memory");
}

// wg_store writes a warpgroup's sums (rows r0 … r0+63 × the tile's cnt
// selections, the accumulators of an m64n<width> product) times fin, or NaN
// rows for a matrix out of range: acc[4j + i] is row 16·warp + lane/4 (+8
// for i ≥ 2), selection 8j + 2·(lane%4) + (i & 1).
// wg_frag_each calls f(k, r, slot) for each accumulator acc[k] of a
// warpgroup's m64n<width> sums: k = 4j + i holds row r = 16·warp + lane/4
// (+8 for i ≥ 2) of the warpgroup's 64 and selection slot 8j + 2·(lane%4) +
// (i & 1).
template <class F> __device__ __forceinline__ void wg_frag_each(int width, F &&f) {
    const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        if (8 * j >= width) break;
#pragma unroll
        for (int i = 0; i < 4; i++) f(4 * j + i, 16 * w + g + 8 * (i >> 1), 8 * j + 2 * q + (i & 1));
    }
}

__device__ __forceinline__ void wg_store(const TCArgs &p, const SlotsT<WG_N> &s, const float (&acc)[64], int r0, int cnt,
                                         int width, bool mat_ok, float fin) {
    const MVArgs &a = p.a;
    const float nan = __int_as_float(0x7fc00000);
    wg_frag_each(width, [&](int k, int r, int slot) {
        const int row = r0 + r;
        if (row < a.rows && slot < cnt) a.y[s.y[slot] + row] = mat_ok ? acc[k] * fin : nan;
    });
}

// wg_store_glu ends a GLU CTA (k_wg_rs<T, 4, true>) in its free buffers
// at buf (≥ 68 KB): warpgroups 2, 3 leave their up sums (rows 0 … 127 ×
// slots, times fin) there; warpgroups 0, 1 meet them with their gate sums
// of the same (row, slot) and form swiglu_fast(gate, up, lim) times the
// selection's weight (NaN for a matrix out of range), rounded to f16 (as
// k_swiglu_half) into [slot][position] rows there; then every thread copies
// the slots' 256-byte rows to p.glu_y + selection·a.rows + row0.
__device__ __forceinline__ void wg_store_glu(const TCArgs &p, const SlotsT<WG_N> &s, float (&acc)[64], uint8_t *buf,
                                             int row0, int cnt, int width, bool mat_ok, float fin) {
    constexpr int ULD = WG_N + 4, YLD = 128 + 8; // floats a row of up sums, halves a row of outputs
    __shared__ float s_gw[WG_N];
    const int tid = threadIdx.x, wg = tid >> 7;
    float *U = (float *)buf;
    __half *Y = (__half *)buf;
    if (wg >= 2) wg_frag_each(width, [&](int k, int r, int slot) { U[(64 * (wg - 2) + r) * ULD + slot] = acc[k] * fin; });
    if (tid < cnt) s_gw[tid] = p.glu_w[s.y[tid]];
    __syncthreads();
    const float nan = __int_as_float(0x7fc00000);
    if (wg < 2)
        wg_frag_each(width, [&](int k, int r, int slot) {
            const float v = swiglu_fast(acc[k] * fin, U[(64 * wg + r) * ULD + slot], p.glu_lim) *
                            (slot < cnt ? s_gw[slot] : 0.f);
            acc[k] = mat_ok ? v : nan;
        });
    __syncthreads(); // every up sum read
    if (wg < 2)
        wg_frag_each(width, [&](int k, int r, int slot) {
            const int row = 64 * wg + r, pos = p.glu_perm ? (row & ~31) + perm32_pos(row & 31) : row;
            Y[slot * YLD + pos] = __float2half_rn(half_sat(acc[k]));
        });
    __syncthreads();
    for (int i = tid; i < cnt * 16; i += 512) {
        const int slot = i >> 4, c = i & 15;
        *(uint4 *)(p.glu_y + s.y[slot] * p.a.rows + row0 + 8 * c) = *(const uint4 *)(Y + slot * YLD + 8 * c);
    }
}

template <bool V> struct WgFlag {
    static constexpr bool value = V;
};
template <int N> struct WgN {
    static constexpr int value = N;
};

template <int T, int WGS, bool SW>
__global__ void __launch_bounds__(WgShape<T, WGS, SW>::THREADS, WgShape<T, WGS, SW>::MINB) k_wg_moe(TCArgs p) {
#if WG_ARCH
    using S = WgShape<T, WGS, SW>;
    constexpr int M = S::M, RAW = S::RAW, NT = S::THREADS;
    constexpr int NCH = WG_N * 8 / NT; // activation chunks a thread copies a stage (tiles of more than 64)
    mv_pdl_enter(p.a);
    __shared__ SlotsT<WG_N> s;
    __shared__ uint64_t s_grid[T == WG_TYPE_IQ2 ? 256 : 1];
    extern __shared__ __align__(128) uint8_t s_wg[];
    if (T == WG_TYPE_IQ2)
        for (int i = threadIdx.x; i < 256; i += NT) s_grid[i] = iq2xxs_grid[i];
    int64_t mat;
    const int cnt = tc_slots<WG_N>(p, s, &mat); // synchronises (after the codebook too)
    if (cnt <= 0) return;
    const MVArgs &a = p.a;
    const bool mat_ok = mat >= 0 && mat < a.n_mat;
    if (!mat_ok) mat = 0;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int row0 = blockIdx.y * M;
    const int nbr = a.cols / 256;
    const int64_t NB = a.R * nbr;
    // Buffers: decoded weights [2][A], activations [4][WG_B], raw [4][RAW];
    // stage 4b + q4 uses activation and raw buffer q4, weight buffer q4 & 1.
    uint8_t *gA = s_wg + (SW ? (1024 - ((uint32_t)__cvta_generic_to_shared(s_wg) & 1023)) & 1023 : 0);
    uint8_t *gR = gA + 2 * S::A + WG_NS * WG_B;
    const uint32_t sB = (uint32_t)__cvta_generic_to_shared(gA + 2 * S::A);
    const uint32_t sR = (uint32_t)__cvta_generic_to_shared(gR);
    // This thread's row (decoding and raw copies) and half of it (pp).
    const int r = tid & (M - 1), pp = tid / M;
    const int64_t blk0 = (mat * a.rows + min(row0 + r, a.rows - 1)) * nbr; // the row's first block
    // Copies: activation chunks i = tid + k·NT — without swizzle selection
    // (i & 7) + 8·(i >> 6), chunk (i >> 3) & 7: a quarter-warp writes chunk c
    // of 8 consecutive selections (no bank conflict), a warp reads 64
    // contiguous bytes of each of 8 rows; with it selection i >> 3, chunk
    // i & 7: a quarter-warp copies one row's 128 contiguous bytes;
    // the row's raw bytes (IQ2_XXS: 16 a stage by the first thread of the
    // row; Q2_K: 16 of the half's 32 quant bytes each, and 4 scale bytes).
    const uint8_t *bsrc[NCH];
    uint32_t bdst[NCH];
#pragma unroll
    for (int k = 0; k < NCH; k++) {
        const int i = tid + k * NT;
        const int j = SW ? i >> 3 : (i & 7) + 8 * (i >> 6), c = SW ? i & 7 : (i >> 3) & 7;
        bsrc[k] = a.act + s.act[j] + 16 * c;
        bdst[k] = sB + wg_cm<SW>(j, c);
    }
    const uint8_t *rsrc = a.w + blk0 * 64 + (T == WG_TYPE_IQ2 ? 0 : 16 * pp);
    const uint32_t rdst = sR + (T == WG_TYPE_IQ2 ? 16 * r : 32 * r + 16 * pp);
    const uint8_t *ssrc = a.w + NB * 64 + blk0 * 16; // Q2_K scale bytes
    const uint32_t sdst = sR + 32 * M + 4 * r;
    // The row's block scales (IQ2_XXS: d; Q2_K: d, dmin), loaded a block
    // ahead so that no stage waits for them.
    auto scale_of = [&](int b) -> uint32_t {
        if (T == WG_TYPE_IQ2) return (uint32_t)__ldg((const unsigned short *)(a.w + NB * 64) + blk0 + b);
        return __ldg((const uint32_t *)(a.w + NB * 80) + blk0 + b);
    };
    // The warpgroup's descriptors of weight buffer 0 and activation buffer 0
    // (values 0 … 15); the others are byte offsets >> 4 added to them.
    const uint64_t dA = wg_desc<SW>(gA + wg * 8 * 1024), dB = wg_desc<SW>(gA + 2 * S::A);

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;

    auto body = [&](auto wide_tag) {
        constexpr bool WIDE = decltype(wide_tag)::value; // m64n128, else m64n64 (at most 64 selections)
        auto issue = [&](int b, int q4) {
            if (b < nbr) {
                const int64_t ko = (int64_t)(4 * b + q4) * (WG_K * 2);
#pragma unroll
                for (int k = 0; k < NCH; k++)
                    if (WIDE || k * (NT / 8) < 64) wg_cp16ca(bdst[k] + q4 * WG_B, bsrc[k] + ko);
                if (T == WG_TYPE_IQ2) {
                    if (pp == 0) wg_cp16(rdst + q4 * RAW, rsrc + b * 64 + 16 * q4);
                } else {
                    wg_cp16(rdst + q4 * RAW, rsrc + b * 64 + 32 * (q4 >> 1));
                    if (pp == 0) wg_cp4(sdst + q4 * RAW, ssrc + b * 16 + 4 * q4);
                }
            }
            cp_async_commit();
        };
        uint32_t scur = 0, snext = scale_of(0);
        issue(0, 0);
        issue(0, 1);
        for (int b = 0; b < nbr; b++) {
            scur = snext;
            if (b + 1 < nbr) snext = scale_of(b + 1);
#pragma unroll
            for (int q4 = 0; q4 < 4; q4++) {
                cp_async_wait<1>(); // stage 4b+q4 is here (the next may still be in flight)
                __syncthreads();    // ... for every thread; every warpgroup is past the products two stages back
                if (q4 < 2)
                    issue(b, q4 + 2);
                else
                    issue(b + 1, q4 - 2);
                const uint8_t *rw = gR + q4 * RAW;
                uint8_t *row = gA + (q4 & 1) * S::A + wg_rbase<SW>(r);
                if (T == WG_TYPE_IQ2) {
                    const uint2 qw = *(const uint2 *)(rw + 16 * r + 8 * pp);
                    const float d = __half2float(__ushort_as_half((unsigned short)scur));
                    const __half2 s2 = __float2half2_rn(d * (float)(2 * (qw.y >> 28) + 1));
                    if (fabsf(__low2float(s2)) < 63.f)
                        wg_iq2<true, SW>(qw, s2, s_grid, row, r & 7, 4 * pp);
                    else
                        wg_iq2<false, SW>(qw, s2, s_grid, row, r & 7, 4 * pp);
                } else {
                    const __half2 dm = *(const __half2 *)&scur;
                    const uint32_t scw = *(const uint32_t *)(rw + 32 * M + 4 * r);
                    const int sh = 2 * (2 * (q4 & 1) + pp);
                    wg_q2k<SW>(rw + 32 * r, sh, (scw >> (16 * pp)) & 0xff, (scw >> (16 * pp + 8)) & 0xff,
                               __low2float(dm), __high2float(dm), row, r & 7, 4 * pp);
                }
                wg_proxy_fence();
                __syncthreads(); // the stage's weights are decoded
                wg_keep(acc);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < WG_K / 16; kk++) {
                    const uint64_t da = dA + (uint64_t)(((q4 & 1) * S::A + wg_kstep<SW>() * kk) >> 4);
                    const uint64_t db = dB + (uint64_t)((q4 * WG_B + wg_kstep<SW>() * kk) >> 4);
                    if (WIDE)
                        wg_mma128(acc, da, db);
                    else
                        wg_mma64(acc, da, db);
                }
                wg_commit();
                wg_keep(acc);
                wg_wait<1>(); // the previous stage's products are done
            }
        }
        wg_wait<0>();
        wg_keep(acc);
    };
    const bool wide = cnt > 64;
    if (wide)
        body(WgFlag<true>{});
    else
        body(WgFlag<false>{});

    wg_store(p, s, acc, row0 + 64 * wg, cnt, wide ? 128 : 64, mat_ok, T == WG_TYPE_IQ2 ? 0.125f : 1.0f);
#endif
}

// WG_GRID_COPIES: k_wg_rs's IQ2_XXS codebook in shared memory as 16
// interleaved copies, entry e of copy c at e·16 + c, lane l reading copy
// l mod 16: a half-warp's 16 lanes read 16 different 8-byte bank pairs
// whatever the entries (32 KB of static shared memory), where one copy's
// random lookups meet ≈ 3-way bank conflicts (cuda/NOTES.md v55, v56: the
// gate product 1037 → 1023 µs for 4096 tokens, the same bits).
constexpr int WG_GRID_COPIES = 16;

// WgRsShape: the RS form's CTA (k_wg_rs) of WGS warpgroups over 64·WGS
// weight rows; its buffers: activations and raw weight bytes (WG_NS each,
// as WgShape), no decoded weights.
template <int T, int WGS> struct WgRsShape {
    static constexpr int M = 64 * WGS;
    static constexpr int THREADS = 128 * WGS;
    static constexpr int RAW = M * (T == WG_TYPE_IQ2 ? 16 : 36);
    static constexpr int SMEM = 1024 + WG_NS * (WG_B + RAW); // (+ alignment to 1024)
    static constexpr int MINB = WGS == 4 ? 1 : 2;
};

// k_wg_rs is k_wg_moe with the weights dequantized straight into the
// registers wgmma reads A from (RS form): no decoded-weight stores, no A
// reads from shared memory, one barrier a stage. A thread holds A's
// fragment for rows ra = 16·warp + lane/4 and ra + 8 of its warpgroup and,
// per k16 step, positions 2·(lane%4) + {0, 1, 8, 9}; so that those are one
// IQ2_XXS grid entry or 8 consecutive Q2_K values, the activations come
// permuted within each 32-value block (ds4c_to_half_ex with
// DS4C_HALF_PERM32): position 16s + 8h + 2q + e holds value 8q + 4s + 2h + e.
// Thread q then decodes values 8q … 8q+7 of each 32-value block of its two
// rows (IQ2_XXS: grid entry q of the sub-block; Q2_K: quant bytes 8q … 8q+7
// of the plane, sub-block q/2), which are its fragments of steps s = 0
// (values 8q … 8q+3) and 1 (8q+4 … 8q+7); the IQ2_XXS form (fused
// multiply-add or not) is chosen a block at a time for the whole warp, so
// that its two rows interleave without branches. A stage's two 32-value
// blocks are two commit groups of two wgmma each; the registers of the one
// before are free once wait_group 1 returns after the next is committed.
// (Loading a stage's raw words and codebook entries up front for both
// blocks measured slower: 1283 against 1220 µs, spilling.) The grid is row
// blocks (x) × tiles (y), so that the CTAs of a tile run together and read
// its activation rows from L2 (the down product's rows at 4096 tokens,
// 100 MB, do not fit there). The products are m64n32, 64, 96 or 128, the
// tile's selections rounded up to 32.
// GLU (wg_grouped_glu, WGS 4): the CTA's first two warpgroups take rows
// row0 … row0+127 of the gate weights (a.w), the other two the same rows of
// the up weights (p.w2), so that the epilogue (wg_store_glu) meets both
// sums of each (row, selection) and writes SwiGLU's f16 value, the down
// product's input, instead of two float outputs and a SwiGLU pass.
template <int T, int WGS, bool GLU = false>
__global__ void __launch_bounds__(WgRsShape<T, WGS>::THREADS, WgRsShape<T, WGS>::MINB) k_wg_rs(TCArgs p) {
#if WG_ARCH
    static_assert(!GLU || WGS == 4, "GLU: 4 warpgroups");
    using S = WgRsShape<T, WGS>;
    constexpr int M = S::M, RAW = S::RAW, NT = S::THREADS;
    constexpr int NCH = WG_N * 8 / NT; // activation chunks a thread copies a stage (tiles of more than 64)
    mv_pdl_enter(p.a);
    __shared__ SlotsT<WG_N> s;
    __shared__ uint64_t s_grid[T == WG_TYPE_IQ2 ? 256 * WG_GRID_COPIES : 1];
    extern __shared__ __align__(128) uint8_t s_wg[];
    if (T == WG_TYPE_IQ2)
        for (int i = threadIdx.x; i < 256 * WG_GRID_COPIES; i += NT) s_grid[i] = iq2xxs_grid[i / WG_GRID_COPIES];
    int64_t mat;
    const int cnt = tc_slots<WG_N>(p, s, &mat, blockIdx.y); // synchronises (after the codebook too)
    if (cnt <= 0) return;
    const MVArgs &a = p.a;
    const bool mat_ok = mat >= 0 && mat < a.n_mat;
    if (!mat_ok) mat = 0;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, q = lane & 3;
    // __byte_perm selector: byte q of a word, zero-extended (IQ2_XXS: the grid index)
    const uint32_t gsel = 0x4440u | (uint32_t)q;
    const int gcopy = lane & (WG_GRID_COPIES - 1); // the codebook copy this lane reads (WG_GRID_COPIES)
    constexpr int MR = GLU ? M / 2 : M; // rows of a tensor a CTA
    const int row0 = blockIdx.x * MR;
    const int nbr = a.cols / 256;
    const int64_t NB = a.R * nbr;
    // Buffers (1024-aligned): activations [4][WG_B], raw [4][RAW].
    uint8_t *gB = s_wg + ((1024 - ((uint32_t)__cvta_generic_to_shared(s_wg) & 1023)) & 1023);
    uint8_t *gR = gB + WG_NS * WG_B;
    const uint32_t sB = (uint32_t)__cvta_generic_to_shared(gB);
    const uint32_t sR = (uint32_t)__cvta_generic_to_shared(gR);
    // Copies as k_wg_moe's swizzled form: activation chunk i = tid + k·NT is
    // selection i >> 3, chunk i & 7; row r's raw bytes by thread r (and
    // r + M: Q2_K's other 16 quant bytes).
    const int r = tid & (M - 1), pp = tid / M;
    const uint8_t *wc = GLU && r >= MR ? p.w2 : a.w; // (GLU: the CTA's rows MR … are the up tensor's)
    const int64_t blk0 = (mat * a.rows + min(row0 + (r & (MR - 1)), a.rows - 1)) * nbr;
    const uint8_t *bsrc[NCH];
    uint32_t bdst[NCH];
#pragma unroll
    for (int k = 0; k < NCH; k++) {
        const int i = tid + k * NT, j = i >> 3, c = i & 7;
        bsrc[k] = a.act + s.act[j] + 16 * c;
        bdst[k] = sB + wg_cm<true>(j, c);
    }
    const uint8_t *rsrc = wc + blk0 * 64 + (T == WG_TYPE_IQ2 ? 0 : 16 * pp);
    const uint32_t rdst = sR + (T == WG_TYPE_IQ2 ? 16 * r : 32 * r + 16 * pp);
    const uint8_t *ssrc = wc + NB * 64 + blk0 * 16; // Q2_K scale bytes
    const uint32_t sdst = sR + 32 * M + 4 * r;
    // The decoded rows ra, rb = ra + 8 and their block scales (IQ2_XXS: d;
    // Q2_K: d, dmin), loaded a block ahead.
    const int ra = 64 * wg + 16 * ((tid >> 5) & 3) + (lane >> 2), rb = ra + 8;
    const uint8_t *wd = GLU && ra >= MR ? p.w2 : a.w; // the tensor of the rows this thread decodes
    const int64_t bA = (mat * a.rows + min(row0 + (ra & (MR - 1)), a.rows - 1)) * nbr;
    const int64_t bB = (mat * a.rows + min(row0 + (rb & (MR - 1)), a.rows - 1)) * nbr;
    auto scale_of = [&](int64_t blk) -> uint32_t {
        if (T == WG_TYPE_IQ2) return (uint32_t)__ldg((const unsigned short *)(wd + NB * 64) + blk);
        return __ldg((const uint32_t *)(wd + NB * 80) + blk);
    };
    const uint64_t dB = wg_desc<true>(gB);

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;

    auto body = [&](auto n_tag) {
        constexpr int WN = decltype(n_tag)::value; // the tile's selections rounded up to 32: m64n<WN>
        auto issue = [&](int b, int q4) {
            if (b < nbr) {
                const int64_t ko = (int64_t)(4 * b + q4) * (WG_K * 2);
#pragma unroll
                for (int k = 0; k < NCH; k++)
                    if (k * (NT / 8) < WN) wg_cp16ca(bdst[k] + q4 * WG_B, bsrc[k] + ko);
                if (T == WG_TYPE_IQ2) {
                    if (pp == 0) wg_cp16(rdst + q4 * RAW, rsrc + b * 64 + 16 * q4);
                } else {
                    wg_cp16(rdst + q4 * RAW, rsrc + b * 64 + 32 * (q4 >> 1));
                    if (pp == 0) wg_cp4(sdst + q4 * RAW, ssrc + b * 16 + 4 * q4);
                }
            }
            cp_async_commit();
        };
        // mma: the products of 32-value block jj of stage q4 (fragments x:
        // k16 steps 2·jj and 2·jj + 1), committed as one group; then wait
        // for the group before (its registers are free after).
        auto mma = [&](int q4, int jj, const uint32_t (&x)[2][4]) {
            wg_keep(acc);
            wg_fence();
#pragma unroll
            for (int st = 0; st < 2; st++) {
                const uint64_t db = dB + (uint64_t)((q4 * WG_B + 32 * (2 * jj + st)) >> 4);
                if (WN == 128)
                    wg_mma128_rs(acc, x[st], db);
                else if (WN == 96)
                    wg_mma96_rs(acc, x[st], db);
                else if (WN == 64)
                    wg_mma64_rs(acc, x[st], db);
                else
                    wg_mma32_rs(acc, x[st], db);
            }
            wg_commit();
            wg_keep(acc);
            wg_wait<1>();
        };
        // frag: o[h] (row ra, rb: values 8q … 8q+7 of a 32-value block) as
        // the two k16 steps' fragments.
        auto frag = [](const uint4 (&o)[2], uint32_t (&x)[2][4]) {
            x[0][0] = o[0].x, x[0][1] = o[1].x, x[0][2] = o[0].y, x[0][3] = o[1].y;
            x[1][0] = o[0].z, x[1][1] = o[1].z, x[1][2] = o[0].w, x[1][3] = o[1].w;
        };
        uint32_t na = scale_of(bA), nb = scale_of(bB);
        issue(0, 0);
        issue(0, 1);
        for (int b = 0; b < nbr; b++) {
            const uint32_t sa = na, sb = nb;
            if (b + 1 < nbr) na = scale_of(bA + b + 1), nb = scale_of(bB + b + 1);
            // IQ2_XXS: the rows' block scales d as f16 pairs and −1024·d
            // (exact), and whether every sub-block scale d·(2s+1) of the
            // warp's rows (s ≤ 15) is below 63, so that the fused forms hold
            // for the whole block: |d| < 2 (one vote a block)
            __half2 d2[2], e2[2];
            bool fma_blk = false;
            if (T == WG_TYPE_IQ2) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    d2[h] = __half2half2(__ushort_as_half((unsigned short)(h ? sb : sa)));
                    e2[h] = __hmul2(d2[h], __float2half2_rn(-1024.f));
                }
                fma_blk = __all_sync(0xffffffffu, fabsf(__low2float(d2[0])) < 2.f && fabsf(__low2float(d2[1])) < 2.f);
            }
#pragma unroll
            for (int q4 = 0; q4 < 4; q4++) {
                cp_async_wait<1>(); // stage 4b+q4 is here (the next may still be in flight)
                wg_proxy_fence();   // ... visible to the tensor cores
                __syncthreads();    // ... for every thread; every warpgroup is past the products two stages back
                if (q4 < 2)
                    issue(b, q4 + 2);
                else
                    issue(b + 1, q4 - 2);
                const uint8_t *rw = gR + q4 * RAW;
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    uint4 o[2];
                    if (T == WG_TYPE_IQ2) {
                        // rows ra, rb: sub-block jj's grid entry q, signs and
                        // scale; one form for the warp (a uniform branch, so
                        // that the rows interleave): the fused multiply-add
                        // unless a scale of the block is too large for it
                        uint2 qw[2];
                        __half2 s2[2], c2[2];
#pragma unroll
                        for (int h = 0; h < 2; h++) qw[h] = *(const uint2 *)(rw + 16 * (h ? rb : ra) + 8 * jj);
                        auto vals = [&](auto fma_tag) {
                            constexpr bool FMA = decltype(fma_tag)::value;
#pragma unroll
                            for (int h = 0; h < 2; h++)
#ifdef DS4_WG_PROBE_NODEC // (timing probe: the weights not decoded; wrong sums)
                                o[h] = make_uint4(qw[h].x & 0x3bff3bffu, qw[h].y & 0x3bff3bffu, wg_bits(s2[h]), wg_bits(c2[h]));
#else
                                o[h] = wg_iq2_vals<FMA>(s_grid[__byte_perm(qw[h].x, 0u, gsel) * WG_GRID_COPIES + gcopy],
                                                        (qw[h].y >> (7 * q)) & 127, s2[h], c2[h]);
#endif
                        };
                        if (fma_blk) {
                            // s2 = d·(2s+1) rounded once, as the float
                            // product rounded to f16: (1024 + 2s+1)·d − 1024·d
                            // fused, the biased f16 1024 + 2s+1 (twice) from
                            // the sub-block's scale s (its top 4 bits)
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                const uint32_t hb = (qw[h].y >> 28) * 0x20002u + 0x64016401u;
                                s2[h] = __hfma2(*(const __half2 *)&hb, d2[h], e2[h]);
                                c2[h] = __hmul2(s2[h], __float2half2_rn(-1024.f));
                            }
                            vals(WgFlag<true>{});
                        } else {
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                const float d = __low2float(d2[h]);
                                s2[h] = __float2half2_rn(d * (float)(2 * (qw[h].y >> 28) + 1));
                                c2[h] = __hmul2(s2[h], __float2half2_rn(-1024.f));
                            }
                            vals(WgFlag<false>{});
                        }
                    } else {
                        // Q2_K: the row's quant bytes 8q … 8q+7 of the half
                        // (plane 2·(q4 & 1) + jj) and its sub-block's scale byte
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int row = h ? rb : ra;
                            const uint32_t sc = h ? sb : sa;
                            const __half2 dm = *(const __half2 *)&sc;
                            const uint32_t scw = *(const uint32_t *)(rw + 32 * M + 4 * row);
                            __half2 a2, b2;
                            wg_q2k_terms((scw >> (8 * (2 * jj + (q >> 1)))) & 0xff, __low2float(dm), __high2float(dm),
                                         a2, b2);
                            o[h] = wg_q2k_group(*(const uint2 *)(rw + 32 * row + 8 * q), 2 * (2 * (q4 & 1) + jj), a2, b2);
                        }
                    }
                    uint32_t x[2][4];
                    frag(o, x);
                    mma(q4, jj, x);
                }
            }
        }
        wg_wait<0>();
        wg_keep(acc);
    };
    // B as wide as the tile's selections rounded up to 32 (the tensor
    // cores' time goes with the width)
    if (cnt > 96)
        body(WgN<128>{});
    else if (cnt > 64)
        body(WgN<96>{});
    else if (cnt > 32)
        body(WgN<64>{});
    else
        body(WgN<32>{});
    if constexpr (GLU) {
        cp_async_wait<0>(); // (the last groups are empty) the buffers are free
        __syncthreads();
        wg_store_glu(p, s, acc, gB, row0, cnt, (cnt + 31) / 32 * 32, mat_ok, T == WG_TYPE_IQ2 ? 0.125f : 1.0f);
    } else {
        wg_store(p, s, acc, row0 + 64 * wg, cnt, (cnt + 31) / 32 * 32, mat_ok, T == WG_TYPE_IQ2 ? 0.125f : 1.0f);
    }
#endif
}

template <int T, int WGS, bool SW> void wg_go(const TCArgs &p, int xcount, cudaStream_t st) {
    using S = WgShape<T, WGS, SW>;
    static bool set = false;
    if (!set) {
        cudaFuncSetAttribute(k_wg_moe<T, WGS, SW>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM);
        set = true;
    }
    const dim3 grid((unsigned)xcount, (unsigned)((p.a.rows + S::M - 1) / S::M), 1);
    ds4c_launch(k_wg_moe<T, WGS, SW>, grid, S::THREADS, (size_t)S::SMEM, st, p);
}

template <int T, int WGS, bool GLU = false> void wg_go_rs(const TCArgs &p, int xcount, cudaStream_t st) {
    using S = WgRsShape<T, WGS>;
    static bool set = false;
    if (!set) {
        cudaFuncSetAttribute(k_wg_rs<T, WGS, GLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM);
        set = true;
    }
    constexpr int MR = GLU ? S::M / 2 : S::M;
    const dim3 grid((unsigned)((p.a.rows + MR - 1) / MR), (unsigned)xcount, 1);
    ds4c_launch(k_wg_rs<T, WGS, GLU>, grid, S::THREADS, (size_t)S::SMEM, st, p);
}

// wg_device_ok: the current device is compute capability 9.0 and this file
// was compiled for sm_90a (the kernel has a body: its static shared memory
// is there; built for plain sm_90 it is empty).
bool wg_device_ok() {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, k_wg_moe<WG_TYPE_IQ2, 4, false>) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0 && fa.sharedSizeBytes > 0;
}

} // namespace

bool wg_supported(int type, int64_t cols) {
    static const bool dev_ok = wg_device_ok();
    return dev_ok && (type == DS4C_IQ2_XXS || type == DS4C_Q2_K) && cols > 0 && cols % 256 == 0;
}

int wg_grouped_glu(int type, const TCArgs &p, int xcount, cudaStream_t st) {
    if (!wg_supported(type, p.a.cols) || p.a.rows % 128)
        return ds4c_err(DS4C_ETYPE, "wgmma gate/up product: type %d, %d rows of %d", type, p.a.rows, p.a.cols);
    static_assert(WG_NS * (WG_B + WgRsShape<WG_TYPE_IQ2, 4>::RAW) >= 128 * (WG_N + 4) * 4, "GLU epilogue buffers");
    if (type == DS4C_IQ2_XXS)
        wg_go_rs<WG_TYPE_IQ2, 4, true>(p, xcount, st);
    else
        wg_go_rs<WG_TYPE_Q2K, 4, true>(p, xcount, st);
    DS4C_CHECK_LAUNCH("matmul (wgmma gate/up)");
    return 0;
}

int wg_grouped(int type, const TCArgs &p, int xcount, cudaStream_t st) {
    if (!wg_supported(type, p.a.cols)) return ds4c_err(DS4C_ETYPE, "wgmma product: type %d, %d columns", type, p.a.cols);
    if ((p.a.rows + 127) / 128 > 65535) return ds4c_err(DS4C_EINVAL, "wgmma product: %d rows", p.a.rows);
    // 2: IQ2_XXS in CTAs of 2 warpgroups (Q2_K's buffers would not fit two
    // an SM); 3: IQ2_XXS in the 128-byte-swizzled layout (ds4c_grouped_half_ok
    // then leaves Q2_K to the int8 kernels); 4: Q2_K swizzled too; 5, 6: the
    // RS form (k_wg_rs; permuted activations) in CTAs of 4 or 2 warpgroups;
    // 7 (the default): IQ2_XXS as 5, Q2_K as 6 — two CTAs an SM, each with
    // its own barrier a stage, beat one of 4 warpgroups for the down
    // product (4096 tokens: 1202 against 1292 µs), not for IQ2_XXS, whose
    // 2-warpgroup CTAs read the activations twice as often (1087 against 1035)
    const int v = ds4c_opt_wg_moe();
    const bool iq2 = type == DS4C_IQ2_XXS;
    if (v == 5 || (v == 7 && iq2)) {
        if (iq2)
            wg_go_rs<WG_TYPE_IQ2, 4>(p, xcount, st);
        else
            wg_go_rs<WG_TYPE_Q2K, 4>(p, xcount, st);
    } else if (v == 6 || v == 7) {
        if (iq2)
            wg_go_rs<WG_TYPE_IQ2, 2>(p, xcount, st);
        else
            wg_go_rs<WG_TYPE_Q2K, 2>(p, xcount, st);
    } else if (iq2) {
        if (v == 2)
            wg_go<WG_TYPE_IQ2, 2, false>(p, xcount, st);
        else if (v == 3 || v == 4)
            wg_go<WG_TYPE_IQ2, 4, true>(p, xcount, st);
        else
            wg_go<WG_TYPE_IQ2, 4, false>(p, xcount, st);
    } else {
        if (v == 4)
            wg_go<WG_TYPE_Q2K, 4, true>(p, xcount, st);
        else
            wg_go<WG_TYPE_Q2K, 4, false>(p, xcount, st);
    }
    DS4C_CHECK_LAUNCH("matmul (wgmma)");
    return 0;
}

} // namespace ds4mv
