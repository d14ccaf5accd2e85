// matvec.cu: the C entry points of the matrix products (kernels in
// matvec.cuh, instantiated per type in mv_*.cu), weight repacking and
// activation quantization.
#include "matvec.cuh"

using namespace ds4mv;

namespace {

// ---------------------------------------------------------------- repack
__global__ void k_repack_q8_0(uint8_t *dst, int64_t R, int64_t cols, const uint8_t *src, int64_t first,
                              int64_t n) {
    pdl_enter();
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint8_t *s = src + i * 34;
    int64_t b = first + i;
    uint8_t *q = dst + b * 32;
    for (int j = 0; j < 32; j++) q[j] = s[2 + j];
    uint8_t *d = dst + R * cols + b * 2;
    d[0] = s[0];
    d[1] = s[1];
}

__global__ void k_repack_q2_k(uint8_t *dst, int64_t NB, const uint8_t *src, int64_t first, int64_t n) {
    pdl_enter();
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint8_t *s = src + i * 84;
    int64_t b = first + i;
    uint8_t *q = dst + b * 64, *sc = dst + NB * 64 + b * 16, *dm = dst + NB * 80 + b * 4;
    for (int j = 0; j < 16; j++) sc[j] = s[j];
    for (int j = 0; j < 64; j++) q[j] = s[16 + j];
    for (int j = 0; j < 4; j++) dm[j] = s[80 + j];
}

__global__ void k_repack_iq2_xxs(uint8_t *dst, int64_t NB, const uint8_t *src, int64_t first, int64_t n) {
    pdl_enter();
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint8_t *s = src + i * 66;
    int64_t b = first + i;
    uint8_t *q = dst + b * 64, *d = dst + NB * 64 + b * 2;
    d[0] = s[0];
    d[1] = s[1];
    for (int j = 0; j < 64; j++) q[j] = s[2 + j];
}

// ---------------------------------------------------------------- quantize
__global__ void k_quant_q8_0(const float *x, int64_t x_stride, uint8_t *act, int64_t act_stride, int64_t cols,
                             int n_tok) {
    pdl_enter();
    const int64_t nb = cols / 32;
    const int64_t gw = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gw >= nb * n_tok) return; // whole warps
    const int64_t t = gw / nb, b = gw % nb;
    uint8_t *a = act + t * act_stride;
    q8_0_warp(x[t * x_stride + b * 32 + lane], lane, (int8_t *)a + b * 32, (float *)(a + cols) + b);
}

__global__ void __launch_bounds__(256) k_quant_q8_k(const float *x, int64_t x_stride, uint8_t *act,
                                                    int64_t act_stride, int64_t cols, int n_tok) {
    pdl_enter();
    __shared__ float s_v[256];
    __shared__ float s_av[8];
    __shared__ int s_ix[8];
    const int64_t nb = cols / 256;
    const int64_t t = blockIdx.x / nb, b = blockIdx.x % nb;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float v = x[t * x_stride + b * 256 + tid];
    s_v[tid] = v;
    // the first index of the largest magnitude
    float av = fabsf(v);
    int ix = tid;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float oa = __shfl_xor_sync(FULL_MASK, av, o);
        int oi = __shfl_xor_sync(FULL_MASK, ix, o);
        if (oa > av || (oa == av && oi < ix)) {
            av = oa;
            ix = oi;
        }
    }
    if (lane == 0) {
        s_av[warp] = av;
        s_ix[warp] = ix;
    }
    __syncthreads();
    float amax = s_av[0];
    int imax = s_ix[0];
    for (int k = 1; k < 8; k++) {
        if (s_av[k] > amax) { // warps are in index order: ties keep the earlier one
            amax = s_av[k];
            imax = s_ix[k];
        }
    }
    uint8_t *a = act + t * act_stride;
    int q = 0;
    float d = 0.f;
    if (amax != 0.f) {
        const float mx = s_v[imax];
        const float iscale = -127.f / mx;
        q = min(127, __float2int_rn(__fmul_rn(iscale, v)));
        q = max(-128, q);
        d = 1.f / iscale;
    }
    ((int8_t *)a)[b * 256 + tid] = (int8_t)q;
    int s = q;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    if ((tid & 15) == 0) ((int16_t *)(a + cols + 4 * nb))[b * 16 + (tid >> 4)] = (int16_t)s;
    if (tid == 0) ((float *)(a + cols))[b] = d;
}

// k_quant_q8_0_v: k_quant_q8_0's operations with 8 values a lane (4 lanes a
// block, 64 blocks a CTA, the blocks of all tokens flattened): 16-byte
// loads, two shuffles for the block's largest magnitude, one 8-byte store.
// Needs x and x_stride 16-byte aligned and nb * n_tok < 2^31 (host checks).
__global__ void __launch_bounds__(256) k_quant_q8_0_v(const float *x, int64_t x_stride, uint8_t *act,
                                                      int64_t act_stride, int nb, int total) {
    pdl_enter();
    const int gb = blockIdx.x * 64 + (threadIdx.x >> 2), part = threadIdx.x & 3;
    const bool ok = gb < total;
    const int t = ok ? gb / nb : 0, b = ok ? gb - t * nb : 0;
    float v[8];
    if (ok) {
        load8(x + t * x_stride + b * 32 + part * 8, v);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = 0.f;
    }
    float amax = fabsf(v[0]);
#pragma unroll
    for (int i = 1; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 2));
    if (!ok) return;
    const float id = q8_0_inv(amax);
    int q[8];
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = q8_0_round(v[i], id);
    uint8_t *a = act + t * act_stride;
    *(int2 *)(a + b * 32 + part * 8) = pack8(q);
    if (part == 0) ((float *)(a + (int64_t)nb * 32))[b] = q8_0_scale(amax);
}

// k_quant_q8_k_w: k_quant_q8_k's operations with a warp a 256-value block
// (8 values a lane, 8 blocks a CTA, the blocks of all tokens flattened): the
// first index of the largest magnitude by shuffles, no shared memory. Same
// alignment and size needs as k_quant_q8_0_v.
__global__ void __launch_bounds__(256) k_quant_q8_k_w(const float *x, int64_t x_stride, uint8_t *act,
                                                      int64_t act_stride, int nb, int total) {
    pdl_enter();
    const int gb = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (gb >= total) return; // whole warps
    const int t = gb / nb, b = gb - t * nb;
    float v[8];
    load8(x + t * x_stride + b * 256 + lane * 8, v);
    q8_k_warp(v, lane, act + t * act_stride, b, nb);
}

__global__ void k_copy_rows_f32(const float *x, int64_t x_stride, uint8_t *act, int64_t act_stride, int64_t cols,
                                int n_tok) {
    pdl_enter();
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= cols * n_tok) return;
    int64_t t = i / cols, c = i % cols;
    ((float *)(act + t * act_stride))[c] = x[t * x_stride + c];
}

int blk_vals(int t) {
    switch (t) {
    case DS4C_F32:
    case DS4C_F16:
    case DS4C_BF16: return 1;
    case DS4C_Q8_0: return 32;
    case DS4C_Q2_K:
    case DS4C_Q4_K:
    case DS4C_IQ2_XXS:
    case DS4C_Q8_K: return 256;
    }
    return 0;
}

int blk_bytes(int t) {
    switch (t) {
    case DS4C_F32: return 4;
    case DS4C_F16:
    case DS4C_BF16: return 2;
    case DS4C_Q8_0: return 34;
    case DS4C_Q2_K: return 84;
    case DS4C_Q4_K: return 144;
    case DS4C_IQ2_XXS: return 66;
    case DS4C_Q8_K: return 292;
    }
    return 0;
}

int check_shape(int type, int64_t rows, int64_t cols, int64_t n_mat) {
    const int bv = blk_vals(type);
    if (bv == 0 || type == DS4C_Q8_K) return ds4c_err(DS4C_ETYPE, "unsupported weight type %d", type);
    if (rows <= 0 || cols <= 0 || n_mat <= 0) return ds4c_err(DS4C_EINVAL, "bad shape %lld x %lld x %lld", (long long)n_mat, (long long)rows, (long long)cols);
    int64_t need = type == DS4C_F32 ? 4 : ((type == DS4C_F16 || type == DS4C_BF16) ? 8 : bv);
    if (cols % need != 0) return ds4c_err(DS4C_EINVAL, "cols %lld not a multiple of %lld for type %d", (long long)cols, (long long)need, type);
    if (rows > 0x7fffffff || cols > 0x7fffffff) return ds4c_err(DS4C_EINVAL, "shape too large");
    return 0;
}

} // namespace

extern "C" {

uint64_t ds4c_weight_bytes(int type, int64_t rows, int64_t cols) {
    const int bv = blk_vals(type);
    if (bv == 0 || type == DS4C_Q8_K || rows < 0 || cols < 0 || cols % bv != 0) return 0;
    return (uint64_t)rows * (uint64_t)(cols / bv) * (uint64_t)blk_bytes(type);
}

int ds4c_weight_repack(int type, void *d_dst, int64_t total_rows, int64_t cols, const void *d_src,
                       int64_t first_block, int64_t n_blocks, void *stream) {
    DS4C_READY();
    int rc = check_shape(type, total_rows, cols, 1);
    if (rc) return rc;
    const int64_t nb = total_rows * (cols / blk_vals(type));
    if (first_block < 0 || n_blocks < 0 || first_block + n_blocks > nb)
        return ds4c_err(DS4C_EINVAL, "blocks [%lld, %lld) outside the tensor's %lld", (long long)first_block,
                        (long long)(first_block + n_blocks), (long long)nb);
    if (n_blocks == 0) return 0;
    cudaStream_t st = as_stream(stream);
    const unsigned grid = (unsigned)((n_blocks + 255) / 256);
    switch (type) {
    case DS4C_F32:
    case DS4C_F16:
    case DS4C_BF16:
    case DS4C_Q4_K:
        DS4C_CHECK(cudaMemcpyAsync((uint8_t *)d_dst + first_block * blk_bytes(type), d_src,
                                   (size_t)(n_blocks * blk_bytes(type)), cudaMemcpyDeviceToDevice, st));
        return 0;
    case DS4C_Q8_0:
        ds4c_launch(k_repack_q8_0, grid, 256, 0, st, (uint8_t *)d_dst, total_rows, cols, (const uint8_t *)d_src,
                    first_block, n_blocks);
        break;
    case DS4C_Q2_K:
        ds4c_launch(k_repack_q2_k, grid, 256, 0, st, (uint8_t *)d_dst, nb, (const uint8_t *)d_src, first_block,
                    n_blocks);
        break;
    case DS4C_IQ2_XXS:
        ds4c_launch(k_repack_iq2_xxs, grid, 256, 0, st, (uint8_t *)d_dst, nb, (const uint8_t *)d_src, first_block,
                    n_blocks);
        break;
    }
    DS4C_CHECK_LAUNCH("weight_repack");
    return 0;
}

int ds4c_act_type(int weight_type) {
    switch (weight_type) {
    case DS4C_Q8_0: return DS4C_Q8_0;
    case DS4C_Q2_K:
    case DS4C_Q4_K:
    case DS4C_IQ2_XXS: return DS4C_Q8_K;
    case DS4C_F16:
    case DS4C_BF16:
    case DS4C_F32: return DS4C_F32;
    }
    return DS4C_ETYPE;
}

uint64_t ds4c_act_bytes(int act_type, int64_t cols) {
    uint64_t n = 0;
    switch (act_type) {
    case DS4C_F32: n = 4 * cols; break;
    case DS4C_Q8_0:
        if (cols % 32) return 0;
        n = cols + 4 * (cols / 32);
        break;
    case DS4C_Q8_K:
        if (cols % 256) return 0;
        n = cols + 4 * (cols / 256) + 2 * (cols / 16);
        break;
    default: return 0;
    }
    return (n + 15) & ~(uint64_t)15;
}

int ds4c_quantize(int act_type, const float *d_x, int64_t x_stride, void *d_act, int64_t cols, int n_tok,
                  void *stream) {
    DS4C_READY();
    const uint64_t ab = ds4c_act_bytes(act_type, cols);
    if (ab == 0 || n_tok < 0) return ds4c_err(DS4C_EINVAL, "quantize: bad type %d or cols %lld", act_type, (long long)cols);
    if (n_tok == 0) return 0;
    if (x_stride == 0) x_stride = cols;
    cudaStream_t st = as_stream(stream);
    // the vector kernels: 16-byte aligned rows, 32-bit block counts
    const bool vec = ds4c_opt_quant_vec() && ((uintptr_t)d_x & 15) == 0 && x_stride % 4 == 0 &&
                     cols / 32 * n_tok < ((int64_t)1 << 31);
    switch (act_type) {
    case DS4C_F32: {
        int64_t n = cols * n_tok;
        ds4c_launch(k_copy_rows_f32, (unsigned)((n + 255) / 256), 256, 0, st, d_x, x_stride, (uint8_t *)d_act,
                    (int64_t)ab, cols, n_tok);
        break;
    }
    case DS4C_Q8_0: {
        int64_t warps = cols / 32 * n_tok;
        if (vec) {
            ds4c_launch(k_quant_q8_0_v, (unsigned)((warps + 63) / 64), 256, 0, st, d_x, x_stride, (uint8_t *)d_act,
                        (int64_t)ab, (int)(cols / 32), (int)warps);
            break;
        }
        ds4c_launch(k_quant_q8_0, (unsigned)((warps + 7) / 8), 256, 0, st, d_x, x_stride, (uint8_t *)d_act, (int64_t)ab,
                    cols, n_tok);
        break;
    }
    case DS4C_Q8_K:
        if (vec) {
            const int64_t blocks = cols / 256 * n_tok;
            ds4c_launch(k_quant_q8_k_w, (unsigned)((blocks + 7) / 8), 256, 0, st, d_x, x_stride, (uint8_t *)d_act,
                        (int64_t)ab, (int)(cols / 256), (int)blocks);
            break;
        }
        ds4c_launch(k_quant_q8_k, (unsigned)(cols / 256 * n_tok), 256, 0, st, d_x, x_stride, (uint8_t *)d_act,
                    (int64_t)ab, cols, n_tok);
        break;
    }
    DS4C_CHECK_LAUNCH("quantize");
    return 0;
}

// ex_timed (DS4C_OPT_EX_TIMING, timing experiments only): an exact product
// of at most two tokens whose class is chosen runs as fast mode's (another
// summation order: wrong bits in exact mode).
static int ex_timed(int flags, int type, int64_t n_tok) {
    const int t = ds4c_opt_ex_timing();
    if (!t || n_tok > 2 || !(flags & DS4C_MM_EXACT)) return flags;
    const int bit = type == DS4C_Q8_0 ? 1 : type == DS4C_F16 || type == DS4C_BF16 || type == DS4C_F32 ? 4 : 0;
    return (t & bit) ? flags & ~DS4C_MM_EXACT : flags;
}

int ds4c_matmul_ex(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, const int32_t *d_ids,
                   int n_sel, const void *d_act, int64_t act_tok, int64_t act_sel, int act_div, int n_tok, float *d_y,
                   int64_t y_tok, int64_t y_sel, int flags, void *stream) {
    DS4C_READY();
    int rc = check_shape(type, rows, cols, n_mat);
    if (rc) return rc;
    if (n_tok <= 0 || n_sel <= 0) return 0;
    if (n_sel > 65535) return ds4c_err(DS4C_EINVAL, "too many selections (%d)", n_sel);
    flags = ex_timed(flags, type, n_tok);
    if (act_div <= 0) return ds4c_err(DS4C_EINVAL, "act_div %d", act_div);
    if (act_tok == 0) act_tok = (int64_t)ds4c_act_bytes(ds4c_act_type(type), cols);
    if (y_tok == 0) y_tok = rows;
    MVArgs a = mv_args(d_w, rows, cols, n_mat, d_ids, d_ids == nullptr && n_sel > 1, d_act, act_tok, act_sel,
                       act_div, d_y, y_tok, y_sel);
    a.late = (flags & DS4C_MM_LATE) != 0;
    cudaStream_t st = as_stream(stream);
    const bool exact = (flags & DS4C_MM_EXACT) != 0;
    // (the tensor-core kernels copy activation rows in 16-byte pieces)
    const bool aligned = (((uintptr_t)d_act | (uint64_t)act_tok | (uint64_t)act_sel) & 15) == 0;
    if (n_tok >= ds4c_opt_tc_min_tok() && aligned && tc_supported(type, cols)) return tc_dense(type, a, n_sel, n_tok, st);
    switch (type) {
    case DS4C_Q8_0: return launch_q8_0(a, n_sel, n_tok, exact, st);
    case DS4C_Q2_K: return launch_q2_k(a, n_sel, n_tok, exact, st);
    case DS4C_Q4_K: return launch_q4_k(a, n_sel, n_tok, exact, st);
    case DS4C_IQ2_XXS: return launch_iq2_xxs(a, n_sel, n_tok, exact, st);
    case DS4C_F16:
    case DS4C_BF16:
    case DS4C_F32: return launch_float(type, a, n_sel, n_tok, exact, st);
    }
    return ds4c_err(DS4C_ETYPE, "unsupported weight type %d", type);
}

int ds4c_matvec_f32(int type, const void *d_w, int64_t rows, int64_t cols, const float *d_x, const float *d_nw,
                    float eps, float *d_xn, void *d_act, float *d_y, int flags, int n, void *stream) {
    DS4C_READY();
    if (type != DS4C_Q8_0 && type != DS4C_F16)
        return ds4c_err(DS4C_ETYPE, "matvec_f32: weight type %d (Q8_0 or F16)", type);
    if (n < 1 || n > 4) return ds4c_err(DS4C_EINVAL, "matvec_f32: %d tokens (1 to 4)", n);
    int rc = check_shape(type, rows, cols, 1);
    if (rc) return rc;
    if (cols % 32 != 0) return ds4c_err(DS4C_EINVAL, "matvec_f32: %lld columns", (long long)cols);
    flags = ex_timed(flags, type, n);
    // One launch where a fused kernel takes the product: F16 weights in fast
    // mode normalise the row themselves (k_mv_f16_norm, bit 2), in exact
    // mode k_fexact_warp stages the row after its norm (bit 4), Q8_0 weights
    // form their activation in the pipelined kernel (pipe_act_f32, bit 1).
    const bool f16 = type == DS4C_F16;
    const bool exact = (flags & DS4C_MM_EXACT) != 0;
    const int opt = ds4c_opt_mv_f32();
    if (f16 ? ((opt & (exact ? 4 : 2)) && n == 1) : (opt & 1)) {
        const int64_t ab = f16 ? 4 * cols : (int64_t)ds4c_act_bytes(DS4C_Q8_0, cols);
        MVArgs a = mv_args(d_w, rows, cols, 1, nullptr, false, nullptr, ab, 0, 1, d_y, rows, 0);
        a.late = (flags & DS4C_MM_LATE) != 0;
        const bool took = f16 ? (exact ? f16_norm_exact(a, d_x, d_nw, eps, as_stream(stream), &rc)
                                       : f16_norm(a, d_x, d_nw, eps, as_stream(stream), &rc))
                              : pipe_q8_0_f32(a, d_x, d_nw, eps, exact, (flags & DS4C_MM_ROOM) != 0,
                                              as_stream(stream), &rc, n);
        if (took) return rc;
    }
    // the separate steps: RMSNorm, the Q8_0 quantization (the float row is
    // an F16 product's activation as it is), the product
    const float *x = d_x;
    if (d_nw) {
        if ((rc = ds4c_rmsnorm_ref(d_x, cols, d_nw, d_xn, cols, cols, n, eps, stream))) return rc;
        x = d_xn;
    }
    const void *act = x;
    if (!f16) {
        if ((rc = ds4c_quantize(DS4C_Q8_0, x, cols, d_act, cols, n, stream))) return rc;
        act = d_act;
    }
    return ds4c_matmul_ex(type, d_w, rows, cols, 1, nullptr, 1, act, 0, 0, 1, n, d_y, 0, 0, flags & ~DS4C_MM_ROOM,
                          stream);
}

int ds4c_matmul_q8out(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, int n_sel, const void *d_act,
                      int64_t act_tok, int64_t act_sel, int act_div, int n_tok, float *d_y, void *d_yq, int flags,
                      void *stream) {
    DS4C_READY();
    int rc = check_shape(type, rows, cols, n_mat);
    if (rc) return rc;
    if (n_sel <= 0) return 0;
    if (n_sel > 65535 || (n_sel > 1 && n_sel > n_mat) || act_div <= 0)
        return ds4c_err(DS4C_EINVAL, "matmul_q8out: %d selections of %lld matrices, act_div %d", n_sel, (long long)n_mat,
                        act_div);
    if (n_tok < 1 || n_tok > 4) return ds4c_err(DS4C_EINVAL, "matmul_q8out: %d tokens (1 to 4)", n_tok);
    if (rows % 32 != 0) return ds4c_err(DS4C_EINVAL, "matmul_q8out: %lld rows (whole blocks of 32)", (long long)rows);
    const int64_t n = (int64_t)n_sel * rows;
    flags = ex_timed(flags, type, n_tok);
    if (type == DS4C_Q8_0) {
        MVArgs a = mv_args(d_w, rows, cols, n_mat, nullptr, n_sel > 1, d_act,
                           n_tok > 1 ? act_tok : (int64_t)ds4c_act_bytes(DS4C_Q8_0, cols), act_sel, act_div, d_y, n,
                           rows);
        a.late = (flags & DS4C_MM_LATE) != 0;
        if (pipe_q8_0_q8out(a, n_sel, (uint8_t *)d_yq, (flags & DS4C_MM_EXACT) != 0, as_stream(stream), &rc, n_tok))
            return rc;
    }
    // the separate steps: the product, then y's quantization
    if ((rc = ds4c_matmul_ex(type, d_w, rows, cols, n_mat, nullptr, n_sel, d_act, act_tok, act_sel, act_div, n_tok, d_y,
                             n, rows, flags, stream)))
        return rc;
    return ds4c_quantize(DS4C_Q8_0, d_y, n, d_yq, n, n_tok, stream);
}

int ds4c_matmul_grouped_pair(int type, const void *d_w1, const void *d_w2, int64_t rows, int64_t cols, int64_t n_mat,
                             const int32_t *d_ids, int n_sel, const void *d_act, int64_t act_sel, int act_div,
                             float *d_y1, float *d_y2, int64_t y_sel, const void *d_scratch, int flags, void *stream) {
    DS4C_READY();
    if (n_sel <= 0) return 0;
    if (n_sel == 1) flags = ex_timed(flags, type, 1);
    // (ds4c_matmul_grouped would run each as ds4c_matmul_ex: the forms below
    // only where that would be one single-token launch each)
    const bool aligned = (((uintptr_t)d_act | (uint64_t)act_sel) & 15) == 0;
    const bool single = (flags & DS4C_MM_HALF) == 0 && grouped_single(type, cols, n_sel, aligned);
    // Two forms take both tensors in one grid (MVArgs.w2/y2), each with the
    // rows' work, and so the bits, of two separate launches of its kernel:
    // k_mv_dec's types (a decode step's routed gate and up), and one
    // selection of one Q8_0/Q4_K matrix through k_matvec (a shared expert's
    // gate and up; DS4C_OPT_MV_PAIR). In fast mode a lone Q8_0 product runs
    // pipelined (k_mv_pipe_q8f, another order), so there the pair's bits
    // are k_matvec's, not those of the option off (TestMatVecPair).
    const bool exact = (flags & DS4C_MM_EXACT) != 0;
    const bool dec = (type == DS4C_IQ2_XXS || type == DS4C_Q2_K) && n_sel <= 65535;
    const bool one = (type == DS4C_Q8_0 || type == DS4C_Q4_K) && n_sel == 1 && !d_ids && n_mat == 1 &&
                     ds4c_opt_mv_pair();
    if (single && act_div > 0 && (dec || one)) {
        int rc = check_shape(type, rows, cols, n_mat);
        if (rc) return rc;
        MVArgs a = mv_args(d_w1, rows, cols, n_mat, d_ids, d_ids == nullptr && n_sel > 1, d_act,
                           (int64_t)ds4c_act_bytes(ds4c_act_type(type), cols), act_sel, act_div, d_y1, rows, y_sel);
        a.late = (flags & DS4C_MM_LATE) != 0;
        a.w2 = (const uint8_t *)d_w2;
        a.y2 = d_y2;
        cudaStream_t st = as_stream(stream);
        if (one) {
            return type == DS4C_Q8_0 ? launch_q8_0(a, 1, 1, exact, st) : launch_q4_k(a, 1, 1, exact, st);
        }
        const bool took = type == DS4C_IQ2_XXS ? dec_iq2_xxs(a, n_sel, exact, st, &rc)
                                                : dec_q2_k(a, n_sel, exact, st, &rc);
        if (took) return rc;
    }
    int rc = ds4c_matmul_grouped(type, d_w1, rows, cols, n_mat, d_ids, n_sel, d_act, act_sel, act_div, d_y1, y_sel,
                                 d_scratch, flags, stream);
    if (rc) return rc;
    return ds4c_matmul_grouped(type, d_w2, rows, cols, n_mat, d_ids, n_sel, d_act, act_sel, act_div, d_y2, y_sel,
                               d_scratch, flags, stream);
}

int ds4c_matmul_grouped_swiglu(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat,
                               const int32_t *d_ids, int n_sel, const float *d_g, const float *d_u, float lim,
                               const float *d_wts, void *d_act, float *d_y, int64_t y_sel, const void *d_scratch,
                               int flags, void *stream) {
    DS4C_READY();
    if (n_sel <= 0) return 0;
    if (ds4c_act_type(type) != DS4C_Q8_K || cols <= 0 || cols % 256 != 0 || (flags & DS4C_MM_HALF) != 0 ||
        (((uintptr_t)d_g | (uintptr_t)d_u) & 15) != 0 || ((uintptr_t)d_act & 15) != 0)
        return ds4c_err(DS4C_EINVAL, "grouped SwiGLU product: type %d, %lld columns (Q8_K activations, a multiple of "
                                     "256, 16-byte aligned rows)",
                        type, (long long)cols);
    const int64_t ab = (int64_t)ds4c_act_bytes(DS4C_Q8_K, cols);
    // k_mv_dec forms the activation itself where ds4c_matmul_grouped would
    // run one single-token launch of it (ds4c_matmul_grouped_pair's test)
    const bool single = grouped_single(type, cols, n_sel, true);
    if (single && (type == DS4C_IQ2_XXS || type == DS4C_Q2_K) && n_sel <= 65535) {
        int rc = check_shape(type, rows, cols, n_mat);
        if (rc) return rc;
        MVArgs a = mv_args(d_w, rows, cols, n_mat, d_ids, d_ids == nullptr && n_sel > 1, nullptr, ab, ab, 1, d_y,
                           rows, y_sel);
        a.late = (flags & DS4C_MM_LATE) != 0;
        a.glu_g = d_g;
        a.glu_u = d_u;
        a.glu_w = d_wts;
        a.glu_stride = cols;
        a.glu_lim = lim;
        const bool exact = (flags & DS4C_MM_EXACT) != 0;
        a.glu_fast = exact ? 0 : 1;
        cudaStream_t st = as_stream(stream);
        const bool took = type == DS4C_IQ2_XXS ? dec_iq2_xxs(a, n_sel, exact, st, &rc) : dec_q2_k(a, n_sel, exact, st, &rc);
        if (took) return rc;
    }
    int rc = ds4c_swiglu_q8k(d_g, d_u, d_act, ab, cols, n_sel, lim, d_wts,
                             (flags & DS4C_MM_EXACT) ? 0 : DS4C_SWIGLU_FAST, stream);
    if (rc) return rc;
    return ds4c_matmul_grouped(type, d_w, rows, cols, n_mat, d_ids, n_sel, d_act, ab, 1, d_y, y_sel, d_scratch, flags,
                               stream);
}

int ds4c_matmul(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, const void *d_act,
                int64_t act_stride, int n_tok, float *d_y, int64_t y_stride, void *stream) {
    return ds4c_matmul_ex(type, d_w, rows, cols, n_mat, nullptr, 1, d_act, act_stride, 0, 1, n_tok, d_y, y_stride, 0,
                          0, stream);
}

int ds4c_matvec_ids(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, const int32_t *d_ids,
                    int n_sel, const void *d_act, int64_t act_stride, float *d_y, int64_t y_stride, void *stream) {
    if (y_stride == 0) y_stride = rows;
    return ds4c_matmul_ex(type, d_w, rows, cols, n_mat, d_ids, n_sel, d_act, 0, act_stride, 1, 1, d_y, 0, y_stride,
                          0, stream);
}

} // extern "C"
