// mm_tc.cuh: what the grouped tensor-core products share (mm_tc.cu's
// int8 mma.sync kernels, mm_wg.cu's f16 wgmma kernels): the launch
// arguments, the tile table's size and the CTA's slot table.
#pragma once
#include "matvec.cuh"

namespace ds4mv {

struct TCArgs {
    MVArgs a;
    int n_tok;
    const int4 *tiles;   // grouped: per blockIdx.x (matrix, first pair, count, 0)
    const int32_t *perm; // grouped: pair → selection
    // grouped, CTAs of TC_PART slots (tc_go): per blockIdx.x, tile·4 + part
    // of each non-empty part, then −1 up to n_parts (group_parts)
    const int32_t *parts = nullptr;
    int n_parts = 0;
    // wg_grouped_glu only: the up weights (a.w: the gate's), the
    // selections' weights, the SwiGLU clamp (≤ 0: none) and the f16 output
    // rows of a.rows values (permuted within 32-value blocks when glu_perm)
    const uint8_t *w2;
    const float *glu_w;
    float glu_lim;
    __half *glu_y;
    int glu_perm;
};

// The CTA's slots: byte offsets of each slot's activation row and float
// offsets of its output row; the matrix and the number of valid slots.
template <int BN> struct SlotsT {
    int64_t act[BN];
    int64_t y[BN];
};

// Grouped products read a tile table of up to TC_TILE selections of one
// matrix a tile; a CTA of BN < TC_TILE slots takes part blockIdx.z of its
// tile (the grid has TC_TILE / BN parts in z), except CTAs of TC_PART
// slots, which take the part p.parts[blockIdx.x] names: a grid of only the
// non-empty parts (a fast chunk of 256 tokens has ≈ 6 selections an
// expert, so three parts in four were CTAs that only started and left,
// cuda/NOTES.md v50).
constexpr int TC_TILE = 128;
constexpr int TC_PART = 32;
static_assert(TC_TILE == 4 * TC_PART, "a part code is tile·4 + part");

// tc_slots fills s (all threads must call it; it synchronises) and returns
// the slot count (0 or less: nothing to do) and the matrix in *mat; tile is
// the CTA's tile of a grouped product (blockIdx.x unless the kernel's grid
// puts tiles elsewhere).
template <int BN> __device__ int tc_slots(const TCArgs &p, SlotsT<BN> &s, int64_t *mat, int tile = -1) {
    const MVArgs &a = p.a;
    const int tid = threadIdx.x;
    int cnt;
    if (p.tiles) {
        int part = blockIdx.z;
        if (BN == TC_PART && p.parts) {
            const int code = p.parts[blockIdx.x];
            if (code < 0) {
                __syncthreads(); // (as the path below; the code is the same for the whole CTA, and the caller returns on 0)
                return 0;
            }
            tile = code >> 2;
            part = code & 3;
        }
        const int4 tl = p.tiles[tile >= 0 ? tile : blockIdx.x];
        const int first = BN * part;
        *mat = tl.x;
        cnt = min(BN, tl.z - first);
        if (cnt > 0 && tid < BN) {
            const int sel = p.perm[tl.y + first + min(tid, cnt - 1)];
            s.act[tid] = (int64_t)(sel / a.act_div) * a.act_sel;
            s.y[tid] = (int64_t)sel * a.y_sel;
        }
    } else {
        const int sel = blockIdx.z;
        int64_t m = a.sel_mat ? sel : 0;
        if (a.ids) m = a.ids[sel];
        *mat = m;
        const int t0 = blockIdx.x * BN;
        cnt = min(BN, p.n_tok - t0);
        if (tid < BN) {
            const int64_t t = t0 + min(tid, cnt - 1);
            s.act[tid] = (int64_t)(sel / a.act_div) * a.act_sel + t * a.act_tok;
            s.y[tid] = (int64_t)sel * a.y_sel + t * a.y_tok;
        }
    }
    __syncthreads();
    return cnt;
}

// wg_supported says whether wg_grouped takes weights of type with rows of
// cols values on this device (mm_wg.cu: sm_90, Q2_K and IQ2_XXS, cols a
// multiple of 256).
bool wg_supported(int type, int64_t cols);

// wg_kernel_ok says whether kernel k of another sm_90a file (ix_wg.cu,
// attn_wg.cu) can run here: wg_supported's device check, and k built with
// its body — a file built for plain sm_90 compiles the body away, leaving
// the programmatic-launch prologue in a handful of registers.
template <class... A> static bool wg_kernel_ok(void (*k)(A...)) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, k) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return wg_supported(DS4C_IQ2_XXS, 256) && fa.numRegs >= 64;
}

// wg_grouped launches the f16 wgmma product of p (grouped: p.tiles, f16
// activation rows) over xcount tiles (mm_wg.cu).
int wg_grouped(int type, const TCArgs &p, int xcount, cudaStream_t st);

// wg_grouped_glu launches the RS-form product of the gate (p.a.w) and up
// (p.w2) weights for the same tiles with SwiGLU in its epilogue (mm_wg.cu;
// p.a.y_sel 1, p.a.rows a multiple of 128).
int wg_grouped_glu(int type, const TCArgs &p, int xcount, cudaStream_t st);

} // namespace ds4mv
