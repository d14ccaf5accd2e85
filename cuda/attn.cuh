// attn.cuh: what model.cu's attention kernels and attn_wg.cu's wgmma
// attention share: the arguments of an attention launch (AttnArgs), a
// token's keys (attn_nkeys, attn_key_in), the rotation's pieces (rope_cs,
// rope_pair_cs) and the rounded float operations they use.
#pragma once
#include "common.cuh"

// float operations rounded each (no contraction into a multiply-add), as
// the CPU backend rounds them
static __device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
static __device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
static __device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }

// rope_cs is the rotation's cosine and sine for the angle fp·freq (the
// angle's product in float, the trigonometry in double, rounded to float).
static __device__ __forceinline__ float2 rope_cs(float fp, float freq) {
    const double a = (double)fmul(fp, freq);
    return make_float2((float)cos(a), (float)sin(a));
}

// rope_pair_cs rotates the pair v[0], v[1] by the angle of cosine c and
// sine s (inverse: back).
static __device__ __forceinline__ void rope_pair_cs(float *v, float c, float s, int inverse) {
    const float x0 = v[0], x1 = v[1];
    if (!inverse) {
        v[0] = fsub(fmul(x0, c), fmul(x1, s));
        v[1] = fadd(fmul(x0, s), fmul(x1, c));
    } else {
        v[0] = fadd(fmul(x0, c), fmul(x1, s));
        v[1] = fsub(fmul(x1, c), fmul(x0, s));
    }
}

// An attention launch's arguments. Keys (= values) of token t at position
// p: the window positions max(0, p−W+1)..p (this chunk's kv rows, or the
// window ring), then the compressed rows: all (p+1)/ratio for ratio 128,
// sel[t][0..nsel[t]) for ratio 4. o = Σ_k softmax(q·k·scale ; sink)_k · k.
struct AttnArgs {
    const float *q;      // [n][H][HD]
    const float *kv;     // [n][HD] this chunk's rows
    const float *win;    // window ring [wcap][HD]
    int64_t wcap;
    const float *comp;   // compressed rows [.][HD], or null
    int ratio;           // 0, 4 or 128
    const int32_t *sel;  // [n][K] (ratio 4)
    const int32_t *nsel; // [n]
    int K;
    const float *sinks; // [H]
    float *out;         // [n][H][HD]
    int64_t pos0;
    int H, HD, W;
    float scale;
    // inverse RoPE of the output's dims roff..roff+rd (pairs) at the
    // token's position, by k_attn_po itself when rfreqs is set (k_rope
    // after the kernel otherwise)
    const float *rfreqs;
    int rd;
    int roff;
    // the output's Q8_0 activation too, by k_attn_po itself when qact is
    // set: rows of qseg values (of the flat [n][H][HD] output),
    // ds4c_act_bytes(Q8_0, qseg) apart (ds4c_quantize after the kernels
    // otherwise)
    uint8_t *qact;
    int64_t qseg, qstride;
    // f16 copies of kv, win and comp (the same rows), for k_attn_flash<true> and k_attn_wg
    const __half *kvh, *winh, *comph;
    // k_attn_flash and k_attn_wg only (DS4C_ATTN_QH, DS4C_ATTN_OH): the queries as f16
    // rows (read instead of q) and the output as f16 rows with the inverse
    // rotation applied (written instead of out)
    const __half *qh;
    __half *outh;
    // k_attn_flash and k_attn_wg only (DS4C_ATTN_QN): q holds the query rows before their
    // norm (no weight, qeps) and rotation (rfreqs), which the kernel applies
    int qnorm;
    float qeps;
    // one token: the inverse rotation's (cosine, sine) per pair at its
    // position (ds4c_rope_table), read by attn_out_store instead of computed
    const float2 *rcs;
    // pos0 mod wcap (0 without a ring), for the ring's slots without a
    // remainder a key (attn_key_in)
    int64_t pos0m;
};

// attn_key_in is key k's row for token t (position p) among the rows kv,
// win and comp (a.kv, a.win and a.comp, or their f16 copies).
template <class T>
static __device__ __forceinline__ const T *attn_key_in(const AttnArgs &a, const T *kv, const T *win, const T *comp, int t,
                                                int64_t p, int64_t k, int64_t nwin) {
    if (k < nwin) {
        // a ring position qp is at most W ≤ wcap before pos0: its slot
        // qp mod wcap is pos0m + (qp − pos0), plus wcap where that is
        // negative (no 64-bit remainder a key)
        const int64_t d = p - nwin + 1 + k - a.pos0;
        if (d >= 0) return kv + d * a.HD;
        const int64_t s = a.pos0m + d;
        return win + (s < 0 ? s + a.wcap : s) * a.HD;
    }
    k -= nwin;
    if (a.ratio == 4) return comp + (int64_t)a.sel[(int64_t)t * a.K + k] * a.HD;
    return comp + k * a.HD;
}

static __device__ __forceinline__ const float *attn_key(const AttnArgs &a, int t, int64_t p, int64_t k, int64_t nwin) {
    return attn_key_in(a, a.kv, a.win, a.comp, t, p, k, nwin);
}

static __device__ __forceinline__ int64_t attn_nkeys(const AttnArgs &a, int t, int64_t *nwin) {
    const int64_t p = a.pos0 + t;
    *nwin = p + 1 < a.W ? p + 1 : a.W;
    int64_t ncomp = 0;
    if (a.ratio == 128) ncomp = (p + 1) / 128;
    else if (a.ratio == 4) ncomp = a.nsel[t];
    return *nwin + ncomp;
}

// attn_stage_queries rounds token t's queries of heads h0 … h0 + NH − 1 (HD
// values each) to f16, with NT threads (every thread of the CTA calls it):
// a.qnorm: the rows' norm and rotation (the rotation's (cos, sin) a pair
// in scs, written before; ds4c_norm_rope_half's operations in its order:
// warp w takes heads w, w + NT/32, …, lane l values 128c + 4l … +3, HB
// heads' loads issued together), of the float rows, or with a.qh of the
// f16 rows before the norm (the same operations on their float values);
// a.qh alone: the f16 rows as they are (normalised and rotated); else
// the float rows rounded, QU 16-byte loads a thread issued together. put(hh,
// d, v) stores values d … d + 3 of head hh (v: their four halves' bits)
// where the kernel keeps them. HB and QU set how many loads are in flight
// (one round trip a batch), not the values.
template <int NT, int NH, int HD, int HB, int QU, class Put>
static __device__ __forceinline__ void attn_stage_queries(const AttnArgs &a, int t, int h0, const float2 *scs, Put put) {
    static_assert(NH % (HB * (NT / 32)) == 0, "whole batches of heads");
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    if (a.qnorm) {
        __syncthreads(); // the rotation's table
        constexpr int NC = HD / 128;
        for (int hb = w; hb < NH; hb += HB * (NT / 32)) {
            float e[HB][NC][4];
#pragma unroll
            for (int u = 0; u < HB; u++) {
                const int64_t row = ((int64_t)t * a.H + h0 + hb + u * (NT / 32)) * HD;
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    float4 v;
                    if (a.qh) { // (DS4C_ATTN_QH with DS4C_ATTN_QN: q_b's f16 output)
                        const uint2 hv = __ldg((const uint2 *)(a.qh + row) + c * 32 + lane);
                        const float2 lo = __half22float2(*(const __half2 *)&hv.x), hi = __half22float2(*(const __half2 *)&hv.y);
                        v = make_float4(lo.x, lo.y, hi.x, hi.y);
                    } else {
                        v = __ldg((const float4 *)(a.q + row) + c * 32 + lane);
                    }
                    e[u][c][0] = v.x, e[u][c][1] = v.y, e[u][c][2] = v.z, e[u][c][3] = v.w;
                }
            }
#pragma unroll
            for (int u = 0; u < HB; u++) {
                double ss = 0;
#pragma unroll
                for (int c = 0; c < NC; c++)
#pragma unroll
                    for (int k = 0; k < 4; k++) ss += (double)e[u][c][k] * (double)e[u][c][k];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
                const float r = rms_from_sumsq(ss, HD, a.qeps);
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    const int i0 = c * 128 + 4 * lane;
#pragma unroll
                    for (int k = 0; k < 4; k++) e[u][c][k] = fmul(e[u][c][k], r);
#pragma unroll
                    for (int k = 0; k < 4; k += 2)
                        if (i0 + k >= a.roff && i0 + k < a.roff + a.rd) {
                            const float2 cs = scs[(i0 + k - a.roff) / 2];
                            rope_pair_cs(&e[u][c][k], cs.x, cs.y, 0);
                        }
                    put(hb + u * (NT / 32), i0, half4_bits(make_float4(e[u][c][0], e[u][c][1], e[u][c][2], e[u][c][3])));
                }
            }
        }
    } else if (a.qh) { // f16 query rows (ds4c_norm_rope_half: the same values as rounded below)
        const __half *qt = a.qh + ((int64_t)t * a.H + h0) * HD;
        for (int i = tid; i < NH * HD / 4; i += NT) {
            const int hh = i / (HD / 4), c = i % (HD / 4);
            put(hh, 4 * c, __ldg((const uint2 *)(qt + (int64_t)hh * HD) + c));
        }
    } else {
        // (a single token's split CTAs each read all of the group's heads)
        const float4 *qt = (const float4 *)(a.q + ((int64_t)t * a.H + h0) * HD);
        constexpr int NQ = NH * HD / 4;
        for (int i0 = tid; i0 < NQ; i0 += QU * NT) {
            float4 v[QU];
#pragma unroll
            for (int u = 0; u < QU; u++)
                if (i0 + u * NT < NQ) v[u] = __ldg(qt + i0 + u * NT);
#pragma unroll
            for (int u = 0; u < QU; u++) {
                const int i = i0 + u * NT, hh = i / (HD / 4), c = i % (HD / 4);
                if (i < NQ) put(hh, 4 * c, half4_bits(v[u]));
            }
        }
    }
}

// attn_put_pair stores output values v0, v1 of dims d, d + 1 (d even) of
// row `row` (token · H + head): as f16 rows (a.outh) with the inverse
// rotation applied where orot and d is a rotated dim (the values k_rope,
// then ds4c_to_half, would make of the float output), else as floats.
static __device__ __forceinline__ void attn_put_pair(const AttnArgs &a, bool orot, const float2 *scs, int64_t row, int d,
                                                     float v0, float v1) {
    if (a.outh) {
        float v[2] = {v0, v1};
        if (orot && d >= a.roff && d < a.roff + a.rd) {
            const float2 cs = scs[(d - a.roff) / 2];
            rope_pair_cs(v, cs.x, cs.y, 1);
        }
        *(__half2 *)(a.outh + row * a.HD + d) = __floats2half2_rn(half_sat(v[0]), half_sat(v[1]));
        return;
    }
    *(float2 *)(a.out + row * a.HD + d) = make_float2(v0, v1);
}

// attn_wg_ok: ds4c_attn_wg can run here (the device has wgmma and
// attn_wg.cu was built for sm_90a).
bool attn_wg_ok();

// ds4c_attn_wg runs fast mode's attention of a chunk of n tokens on wgmma
// (attn_wg.cu): a's f16 key rows (kvh, winh, comph) and its query and
// output forms as k_attn_flash<true> takes them, heads in groups of 64 of
// 512 dims.
int ds4c_attn_wg(const AttnArgs &a, int n, cudaStream_t st);
