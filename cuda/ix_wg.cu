// ix_wg.cu: fast mode's indexer scores of a chunk on the Hopper tensor
// cores through wgmma (DS4C_OPT_IX_FLASH 3): score(t, i) = Σ_h w_th ·
// max(q_th · k_i, 0) for Flash's 64 indexer heads of 128, against the
// compressed rows as f16 copies (ds4c_index_scores makes them once a chunk,
// as for k_index_flash2).
//
// k_index_flash2 multiplies on mma.sync (m16n8k16), which on Hopper runs
// at about half of wgmma's rate; at 128k its scores were ≈ 30 % of a
// 4096-token chunk (cuda/NOTES.md v51). Here the operands are the other
// way round, so that a head's sum stays within a quad of lanes:
//  - A (64 × 128, shared memory): a tile of 64 compressed rows;
//  - B (shared memory, K-major): the queries of the CTA's IW_TOK tokens,
//    64 heads a token, rounded to f16 once (as if_queries does);
//  - each of the four warpgroups takes two tokens: an m64n128 product a
//    tile, then its scores. The warpgroups share the tensor cores, so one
//    adds its scores while the others' products run. (Two accumulators in
//    one warpgroup, one pair's scores added while the other pair's
//    products ran, made ptxas serialize every wgmma — C7514 — whether or
//    not the loop's first pass was peeled: cuda/NOTES.md v52.)
// In a product's accumulators a thread holds two compressed rows (lane / 4
// and + 8 of its warp's 16) against 16 heads of each token; it adds
// max(dot, 0)·w over them, and two shuffle steps both add the quad's four
// parts and leave each lane one (token, row) score to store.
//
// The rows stream through IW_NS stages (cp.async, IW_NS − 1 tiles ahead: a
// stage is overwritten only after every warpgroup has waited for the
// product that read it). Not the bits of k_index_flash2 (the tensor cores'
// sums and the heads' order differ): fast mode only, held by
// TestIndexScores to the same bound. Needs sm_90a (the library builds this
// file for it, scripts/cuda/build-lib.sh) and wg_supported's device check.
#include "common.cuh"
#include "mm_tc.cuh"
#include "wg.cuh"

namespace ds4mv {
namespace {

constexpr int IW_IH = 64, IW_HD = 128; // Flash's indexer: heads, head dim
constexpr int IW_TOK = 8;              // tokens a CTA (four warpgroups of 2)
constexpr int IW_T = 512;              // threads: four warpgroups
constexpr int IW_ROWS = 64;            // compressed rows a tile (wgmma's M)
constexpr int IW_NS = 5;               // row stages
// Operands of IW_HD values a row are two K-halves of 64 values (128 bytes:
// one swizzle row each); a half holds all of the operand's rows.
constexpr int IW_QROWS = IW_TOK * IW_IH;       // B rows (token, head)
constexpr int IW_QHALF = IW_QROWS * 128;       // bytes of a K-half of B
constexpr int IW_KHALF = IW_ROWS * 128;        // bytes of a K-half of a row stage
constexpr int IW_STAGE = 2 * IW_KHALF;         // bytes a row stage
constexpr int IW_Q = 2 * IW_QHALF;             // bytes of the queries
constexpr int IW_W = IW_TOK * IW_IH * 4;       // bytes of the head weights
constexpr int IW_SMEM = 1024 + IW_Q + IW_NS * IW_STAGE + IW_W + IW_NS * 12; // (+ alignment to 1024; the bulk form's barriers and counts)
static_assert(IW_T == 128 * IW_TOK / 2 && IW_ROWS == 64, "a warpgroup a pair of tokens, m64 tiles");
static_assert(IW_ROWS * IW_HD / 8 % IW_T == 0, "whole 16-byte copies a thread a tile");
static_assert(IW_SMEM <= 227 * 1024, "shared memory");

// iw_off: the byte offset of 16-byte chunk kc (0 … 15) of row r in an
// operand of two K-halves of khalf bytes.
__device__ __forceinline__ int iw_off(int r, int kc, int khalf) { return (kc >> 3) * khalf + wg_cm<true>(r, kc & 7); }

// iw_sums is a thread's part of a product's scores: acc's two tokens
// against its two rows, each max(dot, 0)·w over its 16 heads (the tokens'
// weights from sw), then the quad's four parts added so that lane q holds
// token q & 1, row q >> 1 (returned).
__device__ __forceinline__ float iw_sums(const float (&acc)[64], const float *sw, int q) {
    float v[2][2]; // [token][row]
#pragma unroll
    for (int tl = 0; tl < 2; tl++) {
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            const float2 wv = *(const float2 *)(sw + tl * IW_IH + 8 * jj + 2 * q);
            const int j = 8 * tl + jj;
            s0 = fmaf(fmaxf(acc[4 * j + 0], 0.f), wv.x, s0);
            s0 = fmaf(fmaxf(acc[4 * j + 1], 0.f), wv.y, s0);
            s1 = fmaf(fmaxf(acc[4 * j + 2], 0.f), wv.x, s1);
            s1 = fmaf(fmaxf(acc[4 * j + 3], 0.f), wv.y, s1);
        }
        v[tl][0] = s0;
        v[tl][1] = s1;
    }
    // lanes q and q ^ 1: each keeps token q & 1 and adds the other's part of it
    const int kt = q & 1;
    float a[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const float give = kt ? v[0][rr] : v[1][rr], keep = kt ? v[1][rr] : v[0][rr];
        a[rr] = keep + __shfl_xor_sync(0xffffffffu, give, 1);
    }
    // lanes q and q ^ 2: each keeps row q >> 1
    const int kr = q >> 1;
    const float give = kr ? a[0] : a[1], keep = kr ? a[1] : a[0];
    return keep + __shfl_xor_sync(0xffffffffu, give, 2);
}

// rblk (a multiple of IW_ROWS): the rows a CTA walks, blockIdx.y the run
// (as k_index_flash2's). BULK (DS4C_OPT_IX_FLASH 4): rows is the rows' tile
// image (ix_tiles: tile T's 64 rows at T·IW_STAGE bytes, laid out as a
// stage), each tile one bulk copy completing on its stage's mbarrier; no
// barrier of the CTA in the loop, so the warpgroups drift apart (up to
// IW_NS tiles): the last warp to finish a tile's products refills its
// stage. Without BULK every thread copies its part of a tile (cp.async) and
// the CTA meets at a barrier a tile.
template <bool BULK>
__global__ void __launch_bounds__(IW_T, 1) k_index_wg(const float *q, const float *w, const __half *rows, int64_t pos0,
                                                      int ratio, int n, float *scores, int64_t sc_stride, int64_t rblk) {
    pdl_enter();
#if WG_ARCH
    extern __shared__ uint8_t s_iw_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)s_iw_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sq = sm, *sk = sm + IW_Q;
    float *sw = (float *)(sk + IW_NS * IW_STAGE);
    uint64_t *full = (uint64_t *)(sw + IW_TOK * IW_IH); // BULK: a stage's rows are in
    int *done = (int *)(full + IW_NS);                  // BULK: the warps done with a stage's tile
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3, g = lane >> 2, qd = lane & 3;
    const int t0 = blockIdx.x * IW_TOK, ntk = min(IW_TOK, n - t0);
    const int64_t rmax = (pos0 + t0 + ntk) / ratio; // the CTA's last token has the most rows
    const int64_t ib = (int64_t)blockIdx.y * rblk, ie = min(rmax, ib + rblk);
    if (ib >= rmax) return;
    const int nt = (int)((ie - ib + IW_ROWS - 1) / IW_ROWS);
    const uint8_t *img = (const uint8_t *)rows + (ib / IW_ROWS) * (int64_t)IW_STAGE; // BULK: the CTA's first tile
    // tile j's rows into its stage (rows past rmax: the last row again)
    auto issue = [&](int j) {
        if (j < nt) {
            uint8_t *st = sk + (j % IW_NS) * IW_STAGE;
            const int64_t i0 = ib + (int64_t)j * IW_ROWS;
#pragma unroll
            for (int u = 0; u < IW_ROWS * IW_HD / 8 / IW_T; u++) {
                const int i = tid + IW_T * u, r = i >> 4, kc = i & 15;
                const int64_t row = min(i0 + r, rmax - 1);
                cp_async16(st + iw_off(r, kc, IW_KHALF), rows + row * IW_HD + 8 * kc);
            }
        }
        cp_async_commit(); // (an empty group past the end: the waits count groups)
    };
    if constexpr (BULK) {
        if (tid == 0) {
            for (int s = 0; s < IW_NS; s++) {
                bar_init(&full[s], 1);
                done[s] = 0;
            }
        }
        __syncthreads(); // the barriers are set up before anyone waits on them
        if (tid == 0)
            for (int j = 0; j < min(IW_NS, nt); j++) {
                bar_expect(&full[j], IW_STAGE);
                bulk_copy(sk + j * IW_STAGE, img + (int64_t)j * IW_STAGE, IW_STAGE, &full[j]);
            }
    } else {
#pragma unroll
        for (int j = 0; j < IW_NS - 1; j++) issue(j);
    }
    // the queries as f16 (a missing token: the last one's again, its scores
    // not stored) and the head weights
    for (int i = tid; i < IW_QROWS * (IW_HD / 8); i += IW_T) {
        const int r = i >> 4, kc = i & 15, tt = min(r / IW_IH, ntk - 1), h = r % IW_IH;
        const float4 *src = (const float4 *)(q + ((int64_t)(t0 + tt) * IW_IH + h) * IW_HD + 8 * kc);
        const uint2 lo = half4_bits(__ldg(src)), hi = half4_bits(__ldg(src + 1));
        *(uint4 *)(sq + iw_off(r, kc, IW_QHALF)) = make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
    for (int i = tid; i < IW_TOK * IW_IH; i += IW_T) sw[i] = __ldg(w + (int64_t)(t0 + min(i / IW_IH, ntk - 1)) * IW_IH + i % IW_IH);
    wg_proxy_fence();
    if constexpr (BULK) __syncthreads(); // the queries and weights are in (the loop has no barrier)
    // descriptors: B of the warpgroup's pair (rows 128·wg …), A of stage 0
    const uint64_t dq = wg_desc<true>(sq + (2 * IW_IH * wg) / 8 * 1024);
    const uint64_t dk = wg_desc<true>(sk);
    float acc[64];
    for (int j = 0; j < nt; j++) {
        const int stage = j % IW_NS;
        if constexpr (BULK) {
            bar_wait(&full[stage], (unsigned)(j / IW_NS) & 1); // tile j's bulk copy has landed
        } else {
            cp_async_wait<IW_NS - 2>(); // tile j's rows are in (this thread's copies)
            wg_proxy_fence();
            __syncthreads(); // … and everyone's; every warpgroup waited for tile j − 1's products
            issue(j + IW_NS - 1); // into tile j − 1's stage
        }
        // descriptor offsets are in 16-byte units: a k16 step 32 bytes, a
        // K-half IW_QHALF / IW_KHALF bytes, a stage IW_STAGE bytes
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < IW_HD / 16; ks++) {
            const uint64_t da = dk + (uint64_t)((stage * IW_STAGE + (ks >> 2) * IW_KHALF + (ks & 3) * 32) >> 4);
            const uint64_t db = dq + (uint64_t)(((ks >> 2) * IW_QHALF + (ks & 3) * 32) >> 4);
            wg_mma128(acc, da, db, ks > 0);
        }
        wg_commit();
        wg_wait<0>();
        wg_keep(acc);
        if constexpr (BULK) {
            // the last of the CTA's 16 warps done with tile j refills its
            // stage with tile j + IW_NS
            if (lane == 0) {
                __threadfence_block();
                if (atomicAdd(&done[stage], 1) == IW_T / 32 - 1) {
                    __threadfence_block();
                    done[stage] = 0;
                    if (j + IW_NS < nt) {
                        bar_expect(&full[stage], IW_STAGE);
                        bulk_copy(sk + stage * IW_STAGE, img + (int64_t)(j + IW_NS) * IW_STAGE, IW_STAGE, &full[stage]);
                    }
                }
            }
        }
        // lane qd holds token 2·wg + (qd & 1), row 16·wq + g + 8·(qd >> 1) of the tile
        const float sc = iw_sums(acc, sw + 2 * wg * IW_IH, qd);
        const int t = t0 + 2 * wg + (qd & 1);
        const int64_t i = ib + (int64_t)j * IW_ROWS + 16 * wq + g + 8 * (qd >> 1);
        if (t < n && i < (pos0 + t + 1) / ratio) scores[(int64_t)t * sc_stride + i] = sc;
    }
#endif
}

// k_ix_tiles writes the tile image of k_index_wg<true>: the f16 values of
// the first R rows (IW_HD floats each, rounded as half4_bits), tile T's 64
// rows at T·IW_STAGE bytes in a stage's layout (rows past R: the last row
// again). A thread a 16-byte chunk.
__global__ void k_ix_tiles(const float *rows, int64_t R, uint8_t *img, int64_t ntiles) {
    pdl_enter();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ntiles * IW_ROWS * (IW_HD / 8)) return;
    const int64_t T = c / (IW_ROWS * (IW_HD / 8));
    const int r = (int)(c / (IW_HD / 8) % IW_ROWS), kc = (int)(c % (IW_HD / 8));
    const int64_t row = min(T * IW_ROWS + r, R - 1);
    const float4 *src = (const float4 *)(rows + row * IW_HD + 8 * kc);
    const uint2 lo = half4_bits(__ldg(src)), hi = half4_bits(__ldg(src + 1));
    *(uint4 *)(img + T * IW_STAGE + iw_off(r, kc, IW_KHALF)) = make_uint4(lo.x, lo.y, hi.x, hi.y);
}

} // namespace
} // namespace ds4mv

// ds4c_ix_wg_ok: the device runs mm_wg.cu's wgmma kernels (wg_supported)
// and this file was built for sm_90a too: built for plain sm_90 the kernel
// is only its programmatic-launch prologue, a handful of registers (128
// with its body).
bool ds4c_ix_wg_ok(void) {
    static const bool ok = ds4mv::wg_kernel_ok(ds4mv::k_index_wg<false>);
    return ok;
}

int ds4c_ix_wg(const float *d_q, const float *d_w, const __half *d_rows, int64_t pos0, int ratio, int n,
               float *d_scores, int64_t sc_stride, int64_t nx, int64_t ny, int64_t rblk, int bulk, cudaStream_t st) {
    using namespace ds4mv;
    if (rblk % IW_ROWS) return ds4c_err(DS4C_EINVAL, "index_scores (wgmma): runs of %lld rows", (long long)rblk);
    static bool set = false;
    if (!set) {
        DS4C_CHECK(cudaFuncSetAttribute(k_index_wg<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, IW_SMEM));
        DS4C_CHECK(cudaFuncSetAttribute(k_index_wg<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, IW_SMEM));
        set = true;
    }
    ds4c_launch(bulk ? k_index_wg<true> : k_index_wg<false>, dim3((unsigned)nx, (unsigned)ny), IW_T, (size_t)IW_SMEM,
                st, d_q, d_w, d_rows, pos0, ratio, n, d_scores, sc_stride, rblk);
    DS4C_CHECK_LAUNCH("index_scores (wgmma)");
    return 0;
}

int64_t ds4c_ix_tiles_bytes(int64_t R) { return (R + ds4mv::IW_ROWS - 1) / ds4mv::IW_ROWS * ds4mv::IW_STAGE; }

int ds4c_ix_tiles(const float *d_rows, int64_t R, void *d_img, cudaStream_t st) {
    using namespace ds4mv;
    const int64_t ntiles = (R + IW_ROWS - 1) / IW_ROWS, chunks = ntiles * IW_ROWS * (IW_HD / 8);
    if (R <= 0) return 0;
    ds4c_launch(k_ix_tiles, (unsigned)((chunks + 255) / 256), 256, 0, st, d_rows, R, (uint8_t *)d_img, ntiles);
    DS4C_CHECK_LAUNCH("index_scores (tile image)");
    return 0;
}

int ds4c_ix_wg_tokens(void) { return ds4mv::IW_TOK; }
