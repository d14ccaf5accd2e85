// ops.cu: float32 row and elementwise operations of libds4cuda.so
// (RMSNorm, softmax, SwiGLU). One CTA of 256 threads per row; sums are
// reduced per thread, then by a warp tree, then across the 8 warps in order,
// so results are deterministic run to run.
#include "common.cuh"

namespace {

__device__ __forceinline__ float block_sum(float v, float *s_red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) s_red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++) s += s_red[k];
    return s;
}

__device__ __forceinline__ float block_max(float v, float *s_red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) s_red[warp] = v;
    __syncthreads();
    float m = s_red[0];
    for (int k = 1; k < (int)(blockDim.x >> 5); k++) m = fmaxf(m, s_red[k]);
    return m;
}

__global__ void __launch_bounds__(256) k_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    pdl_enter();
    __shared__ float s_red[8];
    const float *xr = x + blockIdx.x * n;
    float *yr = y + blockIdx.x * n;
    float ss = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, s_red);
    const float scale = rsqrtf(ss / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * scale;
        yr[i] = w ? v * w[i] : v;
    }
}

__global__ void __launch_bounds__(256) k_softmax(const float *x, float *y, int64_t n) {
    pdl_enter();
    __shared__ float s_red[8];
    const float *xr = x + blockIdx.x * n;
    float *yr = y + blockIdx.x * n;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = block_max(m, s_red);
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += expf(xr[i] - m);
    s = block_sum(s, s_red);
    const float inv = 1.f / s;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
}

__global__ void k_swiglu(const float *g, const float *u, float *y, int64_t n, float clamp) {
    pdl_enter();
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gv = g[i], uv = u[i];
    if (clamp > 0.f) {
        gv = fminf(gv, clamp);
        uv = fminf(fmaxf(uv, -clamp), clamp);
    }
    y[i] = gv / (1.f + expf(-gv)) * uv;
}

// Reads n16 16-byte words (grid-stride, 4 loads in flight per thread) and
// writes one value per CTA, so nothing is optimised away: a read-bandwidth
// ceiling for the benchmarks.
__global__ void __launch_bounds__(256) k_read(const int4 *p, int64_t n16, int *out) {
    pdl_enter();
    int acc = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        int4 a = ldw16(p + i, 1), b = ldw16(p + i + stride, 1);
        int4 c = ldw16(p + i + 2 * stride, 1), d = ldw16(p + i + 3 * stride, 1);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        int4 a = ldw16(p + i, 1);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    acc = __reduce_xor_sync(FULL_MASK, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}

} // namespace

extern "C" {

int ds4c_bench_read(const void *d_src, uint64_t bytes, int *d_out, void *stream) {
    DS4C_READY();
    ds4c_launch(k_read, ds4c_sm_count() * 4, 256, 0, as_stream(stream), (const int4 *)d_src, (int64_t)(bytes / 16),
                d_out);
    DS4C_CHECK_LAUNCH("bench_read");
    return 0;
}


int ds4c_rmsnorm(const float *d_x, const float *d_w, float *d_y, int64_t n, int rows, float eps, void *stream) {
    DS4C_READY();
    if (n <= 0 || rows < 0) return ds4c_err(DS4C_EINVAL, "rmsnorm: bad shape");
    if (rows == 0) return 0;
    ds4c_launch(k_rmsnorm, rows, 256, 0, as_stream(stream), d_x, d_w, d_y, n, eps);
    DS4C_CHECK_LAUNCH("rmsnorm");
    return 0;
}

int ds4c_softmax(const float *d_x, float *d_y, int64_t n, int rows, void *stream) {
    DS4C_READY();
    if (n <= 0 || rows < 0) return ds4c_err(DS4C_EINVAL, "softmax: bad shape");
    if (rows == 0) return 0;
    ds4c_launch(k_softmax, rows, 256, 0, as_stream(stream), d_x, d_y, n);
    DS4C_CHECK_LAUNCH("softmax");
    return 0;
}

int ds4c_swiglu(const float *d_g, const float *d_u, float *d_y, int64_t n, float clamp, void *stream) {
    DS4C_READY();
    if (n < 0) return ds4c_err(DS4C_EINVAL, "swiglu: bad size");
    if (n == 0) return 0;
    ds4c_launch(k_swiglu, (unsigned)((n + 255) / 256), 256, 0, as_stream(stream), d_g, d_u, d_y, n, clamp);
    DS4C_CHECK_LAUNCH("swiglu");
    return 0;
}

} // extern "C"
