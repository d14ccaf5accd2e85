// mm_half.cu: fast mode's products of chunks through cuBLAS, with f16
// operands and f32 sums (ds4cuda.h: ds4c_half_ok, ds4c_to_half,
// ds4c_matmul_half).
//
// Why: the int8 tensor-core kernels of mm_tc.cu keep quant.Dot's per-block
// float terms (an int-to-float conversion, two multiplies and an add per
// accumulator and block of 32), which both modes need for their bits; a
// 2048-token chunk of q_b (32768 x 1024) ran at ≈ 170 int8 TOPS there
// (cuda/NOTES.md v15). Fast mode is not held to those bits, so its Q8_0
// products of chunks may instead round each weight q·d to f16 once (q·d is
// exact in float; the rounding is ≤ 2^-11 of it) and take the activations
// as the unquantized floats rounded to f16 — closer to the real-valued
// product than the Q8_0 activations exact mode uses (whose error is up to
// 1/254 of a block's largest magnitude) — and let cuBLAS's GEMMs sum them
// in f32 on the tensor cores. (Option half_mm 3 also takes F16 weights
// with float inputs, both then on the TF32 tensor cores: the
// hyper-connection mixers, whose inputs are not normalised.)
//
// cuBLAS is loaded with dlopen on first use (libcublas.so.13, .12, or the
// file DS4_CUDA_CUBLAS names), so the library still needs only the driver
// at run time: without cuBLAS, ds4c_half_ok says no and fast mode keeps
// the int8 kernels. cublas_v2.h gives the types only.
//
// Memory: the f16 copy of a Q8_0 matrix lives in stream-ordered scratch
// (cudaMallocAsync on the product's stream, freed after the GEMM is queued;
// the device's default pool keeps the memory for the next call). Each
// stream gets its own cuBLAS handle (concurrent GEMMs on two streams must
// not share a handle's workspace).
#include <cublas_v2.h>
#include <dlfcn.h>
#include <stdlib.h>

#include <mutex>

#include "common.cuh"

namespace {

// Q8_0 weights as the library stores them (ds4c_weight_repack): the int8
// quants of all R rows, [R][cols], then the f16 block scales, [R][cols/32].
// k_q8_0_half writes the first nrows rows as f16 [nrows][cols], 8 values a
// thread (one 8-byte load of quants, one scale).
__global__ void k_q8_0_half(const uint8_t *w, int64_t R, int64_t cols, int64_t nrows, __half *out) {
    pdl_enter();
    const int8_t *wq = (const int8_t *)w;
    const __half *wd = (const __half *)(w + R * cols);
    const int64_t n8 = nrows * cols / 8;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = 8 * i; // cols % 32 == 0: the 8 values share a row and a block
        const int2 q = __ldg((const int2 *)(wq + e));
        const float d = __half2float(wd[e / 32]);
        const uint32_t qq[2] = {(uint32_t)q.x, (uint32_t)q.y};
        uint32_t h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t word = qq[j >> 1], sh = 16 * (j & 1);
            const float a = (float)(int8_t)(word >> sh), b = (float)(int8_t)(word >> (sh + 8));
            const __half2 v = __floats2half2_rn(__fmul_rn(a, d), __fmul_rn(b, d));
            h[j] = *(const uint32_t *)&v;
        }
        *(uint4 *)(out + e) = make_uint4(h[0], h[1], h[2], h[3]);
    }
}

// k_f16_f32: n f16 values to float (F16 weights for the TF32 products).
__global__ void k_f16_f32(const __half *w, int64_t n, float *out) {
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __half2float(w[i]);
}

// k_to_half: n rows of cols floats (ld apart) to f16 rows of cols; vec: cols
// and ld multiples of 4 and x 16-byte aligned (float4 loads, 8-byte stores).
template <bool VEC>
__global__ void k_to_half(const float *x, int64_t ld, int64_t cols, int n, __half *out) {
    pdl_enter();
    const int64_t per = VEC ? cols / 4 : cols, total = per * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / per, c = i - t * per;
        if constexpr (VEC) {
            const float4 v = __ldg((const float4 *)(x + t * ld) + c);
            *(uint2 *)(out + t * cols + 4 * c) = half4_bits(v);
        } else {
            out[t * cols + c] = __float2half_rn(half_sat(x[t * ld + c]));
        }
    }
}

// k_to_half_p32: k_to_half with each 32-value block permuted
// (DS4C_HALF_PERM32): output chunk m (positions 8m … 8m+7) of a block holds
// values 2m, 2m+1 of each of the block's four groups of 8. A thread per
// output chunk: its four float2 loads are, across a warp's 8 blocks × 4
// chunks, 32 contiguous bytes a block each (whole sectors), its store 16
// bytes of 512 contiguous.
__global__ void k_to_half_p32(const float *x, int64_t ld, int64_t cols, int n, __half *out) {
    pdl_enter();
    const int64_t per = cols / 8, total = per * n; // chunks of 8 a row
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / per, c = i - t * per; // chunk c: block c / 4, m = c % 4
        const float *src = x + t * ld;
        uint32_t w[4];
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const float2 f = __ldg((const float2 *)(src + perm32_at(c, g)));
            const __half2 h = __floats2half2_rn(half_sat(f.x), half_sat(f.y));
            w[g] = *(const uint32_t *)&h;
        }
        *(uint4 *)(out + t * cols + 8 * c) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// grid_for: CTAs of 256 threads for items, at most 8 an SM (grid-stride).
unsigned grid_for(int64_t items) {
    const int64_t cap = 8 * (int64_t)(ds4c_sm_count() > 0 ? ds4c_sm_count() : 132);
    const int64_t g = (items + 255) / 256;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

// The cuBLAS entry points used here, from dlopen.
struct Blas {
    bool tried, ok;
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*gemm_sb)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, long long, const void *, cudaDataType, int, long long,
                              const void *, void *, cudaDataType, int, long long, int, cublasComputeType_t,
                              cublasGemmAlgo_t);
};
Blas g_blas;
std::mutex g_blas_mu;

// blas_load loads cuBLAS once; false when it is not there.
bool blas_load() {
    std::lock_guard<std::mutex> lock(g_blas_mu);
    if (g_blas.tried) return g_blas.ok;
    g_blas.tried = true;
    const char *names[] = {getenv("DS4_CUDA_CUBLAS"), "libcublas.so.13", "libcublas.so.12", "libcublas.so",
                           "/usr/local/cuda/lib64/libcublas.so"};
    void *h = nullptr;
    for (const char *n : names)
        if (n && *n && (h = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!h) return false;
    g_blas.create = (decltype(g_blas.create))dlsym(h, "cublasCreate_v2");
    g_blas.destroy = (decltype(g_blas.destroy))dlsym(h, "cublasDestroy_v2");
    g_blas.set_stream = (decltype(g_blas.set_stream))dlsym(h, "cublasSetStream_v2");
    g_blas.gemm_sb = (decltype(g_blas.gemm_sb))dlsym(h, "cublasGemmStridedBatchedEx");
    g_blas.ok = g_blas.create && g_blas.destroy && g_blas.set_stream && g_blas.gemm_sb;
    return g_blas.ok;
}

// One cuBLAS handle per stream (created on first use, bound to its stream).
struct HalfHandle {
    cudaStream_t st;
    cublasHandle_t h;
};
constexpr int HALF_HANDLES = 32;
std::mutex g_half_mu;
HalfHandle g_half[HALF_HANDLES];
int g_half_n = 0;
bool g_pool_kept = false;

const char *blas_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

// half_handle returns (in *out) the handle of stream st; the caller holds
// g_half_mu. The table is small: past HALF_HANDLES streams the oldest
// handle is destroyed (cublasDestroy waits for the device) and reused. A
// destroyed stream's handle stays until then (a new stream at the same
// address takes it over: every call binds the handle to its stream).
int half_handle(cudaStream_t st, cublasHandle_t *out) {
    for (int i = 0; i < g_half_n; i++)
        if (g_half[i].st == st) {
            *out = g_half[i].h;
            return 0;
        }
    if (!g_pool_kept) { // the scratch of one call stays in the pool for the next
        cudaMemPool_t pool;
        int dev = 0;
        DS4C_CHECK(cudaGetDevice(&dev));
        DS4C_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
        uint64_t keep = UINT64_MAX;
        DS4C_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
        g_pool_kept = true;
    }
    int slot = g_half_n;
    if (slot == HALF_HANDLES) {
        g_blas.destroy(g_half[0].h);
        for (int i = 1; i < HALF_HANDLES; i++) g_half[i - 1] = g_half[i];
        slot = HALF_HANDLES - 1;
    } else {
        g_half_n++;
    }
    cublasHandle_t h;
    cublasStatus_t s = g_blas.create(&h);
    if (s == CUBLAS_STATUS_SUCCESS) s = g_blas.set_stream(h, st);
    if (s != CUBLAS_STATUS_SUCCESS) {
        g_half_n = slot; // (the slot stays free)
        return ds4c_err(DS4C_EBLAS, "cublas handle: %s (%d)", blas_name(s), (int)s);
    }
    g_half[slot] = {st, h};
    *out = h;
    return 0;
}

} // namespace

extern "C" {

int ds4c_half_ok(int type, int x_type, int n_tok) {
    const int mm = ds4c_opt_half_mm();
    if (n_tok < ds4c_opt_half_min()) return 0;
    const bool ok = x_type == DS4C_F16 ? (type == DS4C_Q8_0 && mm >= 1) || (type == DS4C_F16 && mm >= 2)
                                       : x_type == DS4C_F32 && type == DS4C_F16 && mm >= 3;
    return ok && blas_load() ? 1 : 0;
}

int ds4c_half_warm(void) {
    if (ds4c_ready() != 0 || !blas_load()) return 0;
    cublasHandle_t h;
    if (g_blas.create(&h) != CUBLAS_STATUS_SUCCESS) return 0;
    // one small GEMM on the null stream, so that cuBLAS's first-call set-up
    // is not paid inside the first prompt
    constexpr int N = 256;
    void *buf = nullptr;
    if (cudaMalloc(&buf, (size_t)N * N * (2 * sizeof(__half) + sizeof(float))) == cudaSuccess) {
        cudaMemset(buf, 0, (size_t)N * N * (2 * sizeof(__half) + sizeof(float)));
        const __half *a = (const __half *)buf, *b = a + N * N;
        float *c = (float *)(b + N * N);
        const float one = 1.f, zero = 0.f;
        g_blas.gemm_sb(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, a, CUDA_R_16F, N, 0, b, CUDA_R_16F, N, 0, &zero, c,
                       CUDA_R_32F, N, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cudaDeviceSynchronize();
        cudaFree(buf);
    }
    cudaGetLastError(); // (a failure here only means no warm-up)
    g_blas.destroy(h);
    return 1;
}

int ds4c_to_half_ex(const float *d_x, int64_t x_stride, int64_t cols, int n_tok, void *d_xh, int flags, void *stream) {
    if (!(flags & DS4C_HALF_PERM32)) return ds4c_to_half(d_x, x_stride, cols, n_tok, d_xh, stream);
    DS4C_READY();
    if (cols <= 0 || n_tok < 0 || x_stride < cols || cols % 32 != 0 || x_stride % 2 != 0 || ((uintptr_t)d_x & 7) != 0 ||
        ((uintptr_t)d_xh & 15) != 0)
        return ds4c_err(DS4C_EINVAL, "to_half: bad shape or alignment for the permuted form");
    if (n_tok == 0) return 0;
    ds4c_launch(k_to_half_p32, grid_for(cols / 8 * n_tok), 256, 0, as_stream(stream), d_x, x_stride, cols, n_tok,
                (__half *)d_xh);
    DS4C_CHECK_LAUNCH("to_half (permuted)");
    return 0;
}

int ds4c_to_half(const float *d_x, int64_t x_stride, int64_t cols, int n_tok, void *d_xh, void *stream) {
    DS4C_READY();
    if (cols <= 0 || n_tok < 0 || x_stride < cols) return ds4c_err(DS4C_EINVAL, "to_half: bad shape");
    if (n_tok == 0) return 0;
    cudaStream_t st = as_stream(stream);
    const bool vec = cols % 4 == 0 && x_stride % 4 == 0 && ((uintptr_t)d_x & 15) == 0 && ((uintptr_t)d_xh & 7) == 0;
    const int64_t items = (vec ? cols / 4 : cols) * n_tok;
    if (vec)
        ds4c_launch(k_to_half<true>, grid_for(items), 256, 0, st, d_x, x_stride, cols, n_tok, (__half *)d_xh);
    else
        ds4c_launch(k_to_half<false>, grid_for(items), 256, 0, st, d_x, x_stride, cols, n_tok, (__half *)d_xh);
    DS4C_CHECK_LAUNCH("to_half");
    return 0;
}

// matmul_half runs ds4c_matmul_half with outputs of type yt (float or f16).
static int matmul_half(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, int n_sel,
                       const void *d_xh, int x_type, int64_t xh_tok, int64_t xh_sel, int n_tok, void *d_y,
                       cudaDataType yt, int64_t y_tok, int64_t y_sel, void *stream) {
    if (!ds4c_half_ok(type, x_type, n_tok))
        return ds4c_err(DS4C_ETYPE, "matmul_half: type %d with inputs of type %d for %d tokens not taken", type, x_type,
                        n_tok);
    if (rows <= 0 || cols <= 0 || rows > 0x7fffffff || cols > 0x7fffffff || n_mat <= 0 || n_sel <= 0 ||
        (n_sel != 1 && n_sel != n_mat) || xh_tok < cols || y_tok < rows || xh_tok > 0x7fffffff ||
        y_tok > 0x7fffffff || (type == DS4C_Q8_0 && cols % 32 != 0))
        return ds4c_err(DS4C_EINVAL, "matmul_half: bad shape");
    cudaStream_t st = as_stream(stream);
    if (ds4c_stream_busy(st)) return ds4c_err(DS4C_ETYPE, "matmul_half: the stream is being recorded");
    std::lock_guard<std::mutex> lock(g_half_mu);
    cublasHandle_t h;
    int rc = half_handle(st, &h);
    if (rc) return rc;
    cublasStatus_t s = g_blas.set_stream(h, st);
    if (s != CUBLAS_STATUS_SUCCESS) return ds4c_err(DS4C_EBLAS, "cublas stream: %s", blas_name(s));
    // the weights of the first n_sel matrices converted into stream-ordered
    // scratch: F16 to float (float inputs), Q8_0 to f16; F16 with f16
    // inputs as they are
    const bool tf32 = x_type == DS4C_F32;
    const int64_t nv = (int64_t)n_sel * rows * cols;
    const void *wh = d_w;
    void *scratch = nullptr;
    if (tf32 || type == DS4C_Q8_0) {
        DS4C_CHECK(cudaMallocAsync(&scratch, (size_t)nv * (tf32 ? sizeof(float) : sizeof(__half)), st));
        if (tf32)
            ds4c_launch(k_f16_f32, grid_for(nv), 256, 0, st, (const __half *)d_w, nv, (float *)scratch);
        else
            ds4c_launch(k_q8_0_half, grid_for(nv / 8), 256, 0, st, (const uint8_t *)d_w, n_mat * rows, cols,
                        (int64_t)n_sel * rows, (__half *)scratch);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) {
            cudaFreeAsync(scratch, st);
            return ds4c_cuda_err(e, "matmul_half: weights' conversion");
        }
        wh = scratch;
    }
    // Column-major view: C (rows x n_tok, ldc y_tok) = W (cols x rows, ld
    // cols)^T · X (cols x n_tok, ld xh_tok). Float inputs: TF32 tensor cores.
    const float one = 1.f, zero = 0.f;
    const cudaDataType dt = tf32 ? CUDA_R_32F : CUDA_R_16F;
    s = g_blas.gemm_sb(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n_tok, (int)cols, &one, wh, dt, (int)cols, rows * cols,
                       d_xh, dt, (int)xh_tok, xh_sel, &zero, d_y, yt, (int)y_tok, y_sel, n_sel,
                       tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (scratch) cudaFreeAsync(scratch, st);
    if (s != CUBLAS_STATUS_SUCCESS) return ds4c_err(DS4C_EBLAS, "matmul_half: cublasGemmStridedBatchedEx: %s (%d)", blas_name(s), (int)s);
    DS4C_CHECK_LAUNCH("matmul_half");
    return 0;
}

int ds4c_matmul_half(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, int n_sel,
                     const void *d_xh, int x_type, int64_t xh_tok, int64_t xh_sel, int n_tok, float *d_y,
                     int64_t y_tok, int64_t y_sel, void *stream) {
    DS4C_READY();
    return matmul_half(type, d_w, rows, cols, n_mat, n_sel, d_xh, x_type, xh_tok, xh_sel, n_tok, d_y, CUDA_R_32F, y_tok,
                       y_sel, stream);
}

int ds4c_matmul_half_h(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, int n_sel,
                       const void *d_xh, int x_type, int64_t xh_tok, int64_t xh_sel, int n_tok, void *d_yh,
                       int64_t y_tok, int64_t y_sel, void *stream) {
    DS4C_READY();
    if (x_type != DS4C_F16) return ds4c_err(DS4C_ETYPE, "matmul_half_h: inputs of type %d (f16 only)", x_type);
    return matmul_half(type, d_w, rows, cols, n_mat, n_sel, d_xh, x_type, xh_tok, xh_sel, n_tok, d_yh, CUDA_R_16F, y_tok,
                       y_sel, stream);
}

int ds4c_q8_0_to_half(const void *d_w, int64_t rows, int64_t cols, void *d_out, void *stream) {
    DS4C_READY();
    if (rows <= 0 || cols <= 0 || cols % 32 != 0 || ((uintptr_t)d_w & 7) != 0 || ((uintptr_t)d_out & 15) != 0)
        return ds4c_err(DS4C_EINVAL, "q8_0_to_half: %lld rows of %lld values (a multiple of 32; aligned buffers)",
                        (long long)rows, (long long)cols);
    // the conversion matmul_half runs before each product (k_q8_0_half): the
    // same f16 values, so that a product of the copy has the same bits
    ds4c_launch(k_q8_0_half, grid_for(rows * cols / 8), 256, 0, as_stream(stream), (const uint8_t *)d_w, rows, cols,
                rows, (__half *)d_out);
    DS4C_CHECK_LAUNCH("q8_0_to_half");
    return 0;
}

} // extern "C"
