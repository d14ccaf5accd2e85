// wg.cuh: the Hopper wgmma pieces the sm_90a files share (mm_wg.cu's
// routed-expert products, ix_wg.cu's indexer scores, attn_wg.cu's chunk
// attention): the 128-byte-swizzled and plain K-major shared-memory
// layouts (and an MN-major reading of the swizzled one), their matrix
// descriptors, the fences and groups, and the f16 products with f32 sums. Files that include
// it are built for sm_90a (scripts/cuda/build-lib.sh builds every *_wg.cu so).
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

// The wgmma instructions exist for sm_90a only; elsewhere (the host pass,
// other targets) the kernel body compiles to nothing and wg_supported says no.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ARCH 1
#else
#define WG_ARCH 0
#endif

namespace ds4mv {
namespace {

// Stage buffers hold rows (weight rows, or selections) of 64 f16 values in
// one of the tensor cores' K-major layouts, row groups of 8 1024 bytes
// apart (SBO):
//  - without swizzle (SW false): core matrices of 8 rows × 16 bytes (8
//    values), the 8 of a row group along K 128 bytes apart (LBO): 8
//    consecutive rows' chunk c are 128 contiguous bytes;
//  - 128-byte swizzle (SW true; buffers 1024-aligned): a row's 128 bytes
//    contiguous, its chunk c at chunk c ^ (row % 8): a row's 8 chunks, or
//    8 consecutive rows' chunk c, fall in distinct banks, and a row is
//    copied from 128 contiguous bytes.
// wg_rbase is the offset of row r, wg_coff that of its chunk c (x = r % 8).
template <bool SW> __device__ __forceinline__ int wg_rbase(int r) { return (r >> 3) * 1024 + (r & 7) * (SW ? 128 : 16); }
template <bool SW> __device__ __forceinline__ int wg_coff(int c, int x) { return SW ? (c ^ x) << 4 : c * 128; }
template <bool SW> __device__ __forceinline__ int wg_cm(int r, int c) { return wg_rbase<SW>(r) + wg_coff<SW>(c, r & 7); }

// wg_desc is the shared-memory matrix descriptor of a K-major operand in
// that layout starting at p: no swizzle, LBO 128 bytes (K), SBO 1024; or
// 128-byte swizzle (mode 1), SBO 1024, LBO unused (1). A k16 step starts
// wg_kstep<SW>() bytes further.
template <bool SW> __device__ __forceinline__ uint64_t wg_desc(const void *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    const uint64_t base = (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(1024 >> 4) << 32);
    return SW ? base | ((uint64_t)1 << 16) | ((uint64_t)1 << 62) : base | ((uint64_t)(128 >> 4) << 16);
}
template <bool SW> __host__ __device__ constexpr int wg_kstep() { return SW ? 32 : 256; }

__device__ __forceinline__ void wg_fence() {
#if WG_ARCH
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if WG_ARCH
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wg_wait() {
#if WG_ARCH
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// Shared-memory writes of this thread (stores, completed cp.async) made
// visible to the tensor cores' (async proxy) reads after the next barrier.
__device__ __forceinline__ void wg_proxy_fence() {
#if WG_ARCH
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// wg_keep pins the accumulators around the asynchronous products (the
// compiler must not move their reads or writes across).
template <int N> __device__ __forceinline__ void wg_keep(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// wg_mma64: d[0..31] += A (64 × 16, descriptor da) · B (16 × 64, db),
// f16 operands, f32 sums (wgmma.mma_async m64n64k16, both K-major);
// scale_d 0: d = A · B (the old sums not read).
__device__ __forceinline__ void wg_mma64(float (&d)[64], uint64_t da, uint64_t db, int scale_d = 1) {
#if WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
#endif
}

// wg_mma128: d[0..63] += A (64 × 16, descriptor da) · B (16 × 128, db),
// f16 operands, f32 sums (wgmma.mma_async m64n128k16, both K-major);
// scale_d 0: d = A · B.
__device__ __forceinline__ void wg_mma128(float (&d)[64], uint64_t da, uint64_t db, int scale_d = 1) {
#if WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
#endif
}

// wg_mma32_rs, wg_mma96_rs: as wg_mma64_rs for B of 32 and 96 columns
// (d[0..15], d[0..47]).
__device__ __forceinline__ void wg_mma32_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
#if WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#endif
}
__device__ __forceinline__ void wg_mma96_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
#if WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#endif
}

// wg_mma64_rs: d[0..31] += A (64 × 16, this thread's fragment a: rows
// 16·warp + lane/4 (+8 in a[1], a[3]), values 2·(lane%4) + 0, 1 (+8 in a[2],
// a[3])) · B (16 × 64, descriptor db), f16 operands, f32 sums
// (wgmma.mma_async m64n64k16 with A from registers, B K-major).
__device__ __forceinline__ void wg_mma64_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
#if WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#endif
}

// wg_mma128_rs: d[0..63] += A (64 × 16, this thread's fragment a: rows
// 16·warp + lane/4 (+8 in a[1], a[3]), values 2·(lane%4) + 0, 1 (+8 in a[2],
// a[3])) · B (16 × 128, descriptor db), f16 operands, f32 sums
// (wgmma.mma_async m64n128k16 with A from registers, B K-major).
__device__ __forceinline__ void wg_mma128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
#if WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#endif
}


// wg_desc_mn is the descriptor of an MN-major (transposed) operand in the
// 128-byte swizzle starting at p: atoms of 8 K-rows × 64 values (a K-row's
// 128 bytes contiguous, its 16-byte chunk c at c ^ (row % 8)), atoms along
// K sbo bytes apart, along M/N lbo bytes apart. A K-major tile of rows ×
// 64-value blocks (wg_cm<true> per block, blocks lbo apart) read this way
// is its transpose: the rows become K, the values N.
__device__ __forceinline__ uint64_t wg_desc_mn(const void *p, int lbo, int sbo) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) | ((uint64_t)1 << 62);
}

// wg_mma32: d[0..15] += A (64 × 16, descriptor da) · B (16 × 32, db), f16
// operands, f32 sums (wgmma.mma_async m64n32k16, both K-major); scale_d 0:
// d = A · B.
__device__ __forceinline__ void wg_mma32(float (&d)[16], uint64_t da, uint64_t db, int scale_d = 1) {
#if WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(scale_d));
#endif
}

// wg_mma256_t: d[0..127] += A (64 × 16, descriptor da, K-major) · B (16 ×
// 256, descriptor db of an MN-major operand: wg_desc_mn), f16 operands,
// f32 sums (wgmma.mma_async m64n256k16, B transposed).
__device__ __forceinline__ void wg_mma256_t(float (&d)[128], uint64_t da, uint64_t db) {
#if WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(1));
#endif
}
} // namespace
} // namespace ds4mv
