// attn_wg.cu: fast mode's attention of a chunk on the Hopper tensor cores
// through wgmma (DS4C_OPT_ATTN_FLASH 3): what k_attn_flash<true> computes,
// for Flash's shape (heads in groups of 64, head dim 512, keys = values),
// from the same f16 copies of the key rows.
//
// k_attn_flash runs on mma.sync: every warp loads its fragments of the
// query and key tiles with ldmatrix, four head tiles each read the whole
// key tile, and the four dim quarters' partial scores meet in shared
// memory — at 128k its 32-key tiles took ≈ 5 k cycles each and the kernel
// ≈ 17 % of a 4096-token chunk (cuda/NOTES.md v50). Here a CTA (one token,
// 64 heads) has two warpgroups, and each key tile of 64 rows is used twice
// straight from shared memory by the tensor cores:
//  - the scores S = Q · Kᵀ: warpgroup g those of keys 32g … +32 (m64n32k16,
//    32 k16 steps over the 512 dims; A the queries, B the key tile's rows,
//    both K-major in the 128-byte swizzle);
//  - the softmax: a thread holds two heads' rows (lane / 4 and + 8 of its
//    warp's 16) against 8 of those keys; the row maximum over the quad by
//    two shuffles and over both warpgroups through shared memory; the
//    probabilities rounded to f16 into shared memory (heads × 64 keys,
//    K-major), each warpgroup summing its own keys' terms;
//  - O += P · V (m64n256k16; A the probabilities, B the same key tile read
//    MN-major: its 64-value blocks are the 128-byte swizzle's atoms either
//    way): warpgroup g keeps output dims 256g … +256 (128 floats a thread).
// (Both warpgroups forming all 64 keys' scores, each its probabilities in
// registers as P · V's A fragments, measured slower: 874 against 807 µs for
// 2048 tokens' ratio-4 layer; cuda/NOTES.md v53.)
// A running maximum starts at the sink's logit with its term 1, as in
// k_attn_flash; the output is divided by the sum of the f16-rounded terms.
// Not k_attn_flash's bits (the tensor cores' sums, the terms' order): the
// same bound (TestAttentionFast). Needs sm_90a (scripts/cuda/build-lib.sh)
// and wg_supported's device check (attn_wg_ok).
#include "attn.cuh"
#include "common.cuh"
#include "mm_tc.cuh"
#include "wg.cuh"

namespace ds4mv {
namespace {

constexpr int AW_H = 64, AW_HD = 512; // heads a CTA, head dim
constexpr int AW_KT = 64;             // keys a tile (P · V's K; each warpgroup's scores 32 of them)
constexpr int AW_T = 256;             // threads: two warpgroups
constexpr int AW_DB = AW_HD / 64;     // 64-value blocks a row (128 bytes: one swizzle row)
constexpr int AW_KB = AW_KT * 128;    // bytes of a block of a key tile
constexpr int AW_TILE = AW_DB * AW_KB; // bytes a key tile
constexpr int AW_QB = AW_H * 128;     // bytes of a block of the queries
constexpr int AW_Q = AW_DB * AW_QB;   // bytes of the queries
constexpr int AW_ROWS = 1024;         // key rows found once a CTA (attn_key_in past them)
constexpr int AW_RP = 64;             // rotated pairs (rd ≤ 2·AW_RP, as FL_RP)
constexpr int AW_P = AW_H * 128;      // bytes of the probabilities (64 heads × 64 keys, f16, K-major)
constexpr int AW_QHB = 8, AW_QU = 32; // the queries' loads in one batch (attn_stage_queries)
// Shared memory, in order: the queries, two key tiles, the probabilities,
// the rotation's (cos, sin) pairs, the two warpgroups' row maxima and sums,
// the key rows' addresses.
constexpr int AW_SMEM = 1024 + AW_Q + 2 * AW_TILE + AW_P + AW_RP * 8 + 2 * 2 * AW_H * 4 + AW_ROWS * 8; // (+ alignment to 1024)
static_assert(AW_SMEM <= 227 * 1024, "shared memory");
static_assert(AW_KT * AW_HD / 8 % AW_T == 0, "whole 16-byte copies a thread a tile");

// aw_off: the byte offset of value d of row r in an operand of 64-value
// blocks blk bytes apart.
__device__ __forceinline__ int aw_off(int r, int d, int blk) {
    return (d >> 6) * blk + wg_cm<true>(r, (d & 63) >> 3) + (d & 7) * 2;
}

__global__ void __launch_bounds__(AW_T, 1) k_attn_wg(AttnArgs a) {
    pdl_enter();
#if WG_ARCH
    extern __shared__ uint8_t s_aw_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)s_aw_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sq = sm, *sk = sm + AW_Q;
    uint8_t *sp = sk + 2 * AW_TILE;
    float2 *scs = (float2 *)(sp + AW_P);
    float *smx = (float *)(scs + AW_RP), *sl = smx + 2 * AW_H; // [warpgroup][head]
    const void **rows = (const void **)(sl + 2 * AW_H);
    const int t = blockIdx.x, h0 = blockIdx.y * AW_H, tid = threadIdx.x, lane = tid & 31;
    const int wg = tid >> 7, w = (tid >> 5) & 3, q = lane & 3;
    const int64_t p = a.pos0 + t;
    const bool orot = a.outh && a.rfreqs;
    if ((orot || a.qnorm) && tid < a.rd / 2) scs[tid] = rope_cs((float)p, a.rfreqs[tid]);
    int64_t nwin;
    const int64_t nk = attn_nkeys(a, t, &nwin);
    auto key_row = [&](int64_t key) -> const uint8_t * {
        return (const uint8_t *)attn_key_in(a, a.kvh, a.winh, a.comph, t, p, key, nwin);
    };
    for (int64_t k = tid; k < min(nk, (int64_t)AW_ROWS); k += AW_T) rows[k] = key_row(k);
    __syncthreads();
    // the key tile from kc into buffer buf (keys past the count: the last
    // key's row again, its score masked)
    auto issue = [&](int64_t kc, int buf) {
        uint8_t *dst = sk + buf * AW_TILE;
#pragma unroll 4
        for (int u = 0; u < AW_KT * AW_HD / 8 / AW_T; u++) {
            const int f = tid + AW_T * u, k = f >> 6, c = f & 63;
            const int64_t key = min(kc + k, nk - 1);
            const uint8_t *row = key < AW_ROWS ? (const uint8_t *)rows[key] : key_row(key);
            cp_async16(dst + (c >> 3) * AW_KB + wg_cm<true>(k, c & 7), row + 16 * c);
        }
        cp_async_commit();
    };
    issue(0, 0);
    attn_stage_queries<AW_T, AW_H, AW_HD, AW_QHB, AW_QU>(a, t, h0, scs,
                                          [&](int hh, int d, uint2 v) { *(uint2 *)(sq + aw_off(hh, d, AW_QB)) = v; });
    // the thread's rows: heads r0 and r0 + 8 of the group
    const int r0 = 16 * w + (lane >> 2);
    // (each warpgroup sums its own keys' terms: the sink's term in 0's)
    float mrun[2] = {a.sinks[h0 + r0], a.sinks[h0 + r0 + 8]}, lrun[2] = {wg ? 0.f : 1.f, wg ? 0.f : 1.f};
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    const uint64_t dq = wg_desc<true>(sq), dk = wg_desc<true>(sk), dp = wg_desc<true>(sp);
    const uint64_t dv = wg_desc_mn(sk + 4 * wg * AW_KB, AW_KB, 1024); // the warpgroup's dims 256·wg …
    for (int64_t kc = 0, ti = 0; kc < nk; kc += AW_KT, ti++) {
        const int buf = (int)(ti & 1), m = (int)min((int64_t)AW_KT, nk - kc);
        cp_async_wait<0>();
        wg_proxy_fence();
        __syncthreads(); // tile ti is in (everyone's copies, and the queries); both warpgroups are done with tile ti − 1
        if (kc + AW_KT < nk) issue(kc + AW_KT, buf ^ 1);
        // the warpgroup's half of the scores: keys kw … +32 of the tile (its
        // row groups 4·wg …); descriptor offsets in 16-byte units: a k16
        // step 32 bytes, a block AW_QB / AW_KB bytes, a tile AW_TILE bytes
        const int kw = 32 * wg;
        float s[16];
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < AW_HD / 16; ks++) {
            const uint64_t da = dq + (uint64_t)(((ks >> 2) * AW_QB + (ks & 3) * 32) >> 4);
            const uint64_t db = dk + (uint64_t)((buf * AW_TILE + (ks >> 2) * AW_KB + 4096 * wg + (ks & 3) * 32) >> 4);
            wg_mma32(s, da, db, ks > 0);
        }
        wg_commit();
        wg_wait<0>();
        wg_keep(s);
        // s[4j + e]: head r0, key kw + 8j + 2q + e; s[4j + 2 + e]: head r0 + 8
        float tm[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const bool in = kw + 8 * j + 2 * q + e < m;
                s[4 * j + e] = in ? s[4 * j + e] * a.scale : -INFINITY;
                s[4 * j + 2 + e] = in ? s[4 * j + 2 + e] * a.scale : -INFINITY;
                tm[0] = fmaxf(tm[0], s[4 * j + e]);
                tm[1] = fmaxf(tm[1], s[4 * j + 2 + e]);
            }
        float alpha[2], mnew[2], ls[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            tm[r] = fmaxf(tm[r], __shfl_xor_sync(FULL_MASK, tm[r], 1));
            tm[r] = fmaxf(tm[r], __shfl_xor_sync(FULL_MASK, tm[r], 2));
        }
        // the other warpgroup's maxima of its keys
        if (q == 0) smx[wg * AW_H + r0] = tm[0], smx[wg * AW_H + r0 + 8] = tm[1];
        __syncthreads();
        tm[0] = fmaxf(tm[0], smx[(wg ^ 1) * AW_H + r0]);
        tm[1] = fmaxf(tm[1], smx[(wg ^ 1) * AW_H + r0 + 8]);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mnew[r] = fmaxf(mrun[r], tm[r]);
            alpha[r] = expf(mrun[r] - mnew[r]);
        }
        // the warpgroup's probabilities as f16 into sp (heads × the tile's
        // 64 keys, K-major), their sums over its keys
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const __half2 e0 = __floats2half2_rn(expf(s[4 * j] - mnew[0]), expf(s[4 * j + 1] - mnew[0]));
            const __half2 e1 = __floats2half2_rn(expf(s[4 * j + 2] - mnew[1]), expf(s[4 * j + 3] - mnew[1]));
            const float2 f0 = __half22float2(e0), f1 = __half22float2(e1);
            ls[0] += f0.x + f0.y;
            ls[1] += f1.x + f1.y;
            const int c = (kw + 8 * j) >> 3;
            *(__half2 *)(sp + wg_cm<true>(r0, c) + 4 * q) = e0;
            *(__half2 *)(sp + wg_cm<true>(r0 + 8, c) + 4 * q) = e1;
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            ls[r] += __shfl_xor_sync(FULL_MASK, ls[r], 1);
            ls[r] += __shfl_xor_sync(FULL_MASK, ls[r], 2);
            lrun[r] = lrun[r] * alpha[r] + ls[r];
            mrun[r] = mnew[r];
        }
#pragma unroll
        for (int i = 0; i < 128; i++) o[i] *= alpha[(i >> 1) & 1];
        // O += P · V: a k16 step is 16 keys, two 8-row atoms (2048 bytes)
        wg_proxy_fence();
        __syncthreads(); // both halves of the probabilities are in
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < AW_KT / 16; ks++)
            wg_mma256_t(o, dp + (uint64_t)((ks * 32) >> 4), dv + (uint64_t)((buf * AW_TILE + ks * 2048) >> 4));
        wg_commit();
        wg_wait<0>();
        wg_keep(o);
    }
    // the sums of both warpgroups' terms, 0's then 1's (the same adds in both)
    if (q == 0) sl[wg * AW_H + r0] = lrun[0], sl[wg * AW_H + r0 + 8] = lrun[1];
    __syncthreads();
    lrun[0] = sl[r0] + sl[AW_H + r0];
    lrun[1] = sl[r0 + 8] + sl[AW_H + r0 + 8];
    const float il[2] = {1.f / lrun[0], 1.f / lrun[1]};
    const int64_t row0 = (int64_t)t * a.H + h0 + r0;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int d = 256 * wg + 8 * j + 2 * q;
        attn_put_pair(a, orot, scs, row0, d, o[4 * j] * il[0], o[4 * j + 1] * il[0]);
        attn_put_pair(a, orot, scs, row0 + 8, d, o[4 * j + 2] * il[1], o[4 * j + 3] * il[1]);
    }
#endif
}

} // namespace
} // namespace ds4mv

bool attn_wg_ok() {
    static const bool ok = ds4mv::wg_kernel_ok(ds4mv::k_attn_wg);
    return ok;
}

int ds4c_attn_wg(const AttnArgs &a, int n, cudaStream_t st) {
    using namespace ds4mv;
    if (a.HD != AW_HD || a.H % AW_H || (a.rfreqs && a.rd > 2 * AW_RP))
        return ds4c_err(DS4C_EINVAL, "attention (wgmma): %d heads of %d, rotation of %d dims", a.H, a.HD, a.rd);
    static bool set = false;
    if (!set) {
        DS4C_CHECK(cudaFuncSetAttribute(k_attn_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, AW_SMEM));
        set = true;
    }
    ds4c_launch(k_attn_wg, dim3((unsigned)n, (unsigned)(a.H / AW_H)), AW_T, (size_t)AW_SMEM, st, a);
    DS4C_CHECK_LAUNCH("attention (wgmma)");
    return 0;
}
