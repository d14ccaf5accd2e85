// chain.cu: a persistent chain of dependent single-token Q8_0 products
// (ds4cuda.h: ds4c_chain_q8) — the measurement of the persistent decode
// kernel's premise (cuda/NOTES.md v44; nothing in the model calls it):
// weights never depend on the activations, so one resident grid can stream
// the next product's weights into shared memory while the current
// product's last rows are still being formed elsewhere.
//
// One CTA an SM (cooperative launch: every CTA resident): CW consumer
// warps (8 or 16), then a producer warp, a finisher warp and a step warp.
// For op i (rows × cols, rows whole blocks of 32) CTA b owns output blocks
// [b·nblk/G, (b+1)·nblk/G) (CH_IDLE: CTA 0 none); a block is 32/tr stages
// of tr = tile/cols rows (tile weights of quants and their f16 scales: the
// device layout's two regions, each contiguous over rows).
// - The producer's lane 0 walks the CTA's stages of every op in order and
//   requests each with two bulk copies on the stage's full barrier as soon
//   as all consumer warps have released it (its empty barrier): it never
//   waits for an activation (CH_SERIAL: it waits, as a kernel boundary
//   would, for op i−1 before op i's first stage; CH_HOLD: for its own
//   finisher to have published the CTA's last block of op i−1).
// - Before op i (i > 0) each consumer warp's lane 0 polls op i−1's counter
//   (CH_SEGDEP: the counter of the 1024 rows its segment reads; with steps,
//   the step's), then the warp loads its activation units from L2 into
//   registers: a warp's items all lie in segment warp mod nseg. A stage's
//   tile/1024 items (row, 1024-column segment) are k_mv_pipe_q8f's items
//   with its operations (q8f_sums: the dp4a sum of the lane's block, the
//   even lane's block lane/2, the odd's 16 + lane/2, scaled, and the
//   warp's tree sum); lane 0 writes the partial into one of two buffers
//   of a block's [32 rows][segments] and the warps arrive on its barrier.
// - The finisher adds each block's partials in segment order, stores y and
//   the block's Q8_0 activation (q8_0_warp), frees the buffer, and
//   publishes the block (ch_publish: a fence, then the op's counter and
//   its segment's; fence mode 3 flagged words instead, ch_ll_put): y and
//   yq are ds4c_matmul_q8out's bits whatever the flags.
// - The step warp's thread (CTA 0, flags >> CH_STEP_SHIFT µs) stands for
//   a latency-bound kernel between two products; with CH_PROBE the step
//   warps of the other CTAs time dependent L2 loads instead.
// The entry zeroes the counters (and the flagged words) first.
#include "common.cuh"
#include "matvec.cuh"

namespace {

constexpr int CH_MAX_OPS = 24;
constexpr int CH_TILE = 32768; // weights a stage at most (flags >> CH_TILE_SHIFT & 3 halves it: 32768 >> that)
constexpr int CH_MAX_COLS = 8192;
constexpr int CH_MAX_STAGES = 16;
constexpr int CH_BARS = 8 * (2 * CH_MAX_STAGES + 5); // the stages' full and empty barriers, the partials' two pairs, hold
constexpr int CH_PART = 512;                          // the partials: two buffers of [32 rows][8 segments]
constexpr int CH_STAGES_OFF = CH_PART + 2 * 32 * 8 * 4;
static_assert(CH_BARS <= CH_PART, "chain.cu: barriers overlap the partials");
constexpr int CH_SERIAL = 1; // flags: no stage of op i requested before op i−1 is complete
constexpr int CH_WIDE = 2;   // flags: 16 consumer warps (else 8)
constexpr int CH_ILP = 4;    // flags: a warp's items formed 2 (16 warps) or 4 (8 warps) at once
constexpr int CH_NOMATH = 8; // flags (timing only, wrong results): the stages consumed without their items
constexpr int CH_SEGDEP = 16; // flags: a warp waits only for its segment of op i−1 (1024 rows) and reads it from L2
constexpr int CH_NOWAIT = 32; // flags (timing only, wrong results): no op waits for the one before
constexpr int CH_SLEEP = 64;  // flags: the counters (flagged words) polled with a 128 (256) ns sleep between loads
constexpr int CH_PROBE = 128; // flags: clock64 sums a CTA (ch_probe)
constexpr int CH_FENCE_SHIFT = 8; // flags >> 8 & 3: how a block is published (ch_publish)
constexpr int CH_TILE_SHIFT = 10; // flags >> 10 & 3: a stage of 32768 >> that weights (their quants, then f16 scales)
constexpr int CH_IDLE = 4096;      // flags: CTA 0 owns no blocks (an SM that streams nothing, for CH_PROBE's latencies)
constexpr int CH_HOLD = 8192;      // flags: a CTA requests op i's stages only after publishing its own last block of the op before
constexpr int CH_STEP_SHIFT = 14; // flags >> 14: a step of that many µs between two ops
constexpr int CH_SEGS = CH_MAX_COLS / 1024; // segment counters an op

struct ChainOp { // ds4c_chain_op
    const uint8_t *w;
    const uint8_t *act;
    float *y;
    uint8_t *yq;
    int64_t rows, cols;
    int64_t ll; // (fence mode 3) y's Q8_0 activation as flagged words from p.ll + ll
};

struct ChainArgs {
    ChainOp op[CH_MAX_OPS];
    unsigned long long *ll; // (fence mode 3) the flagged words: 4 quants or a scale, then 1 (ch_ll_put)
    unsigned *count; // op i's blocks stored [n_ops], then those of each of its 1024-row segments [n_ops][CH_SEGS]
    int n_ops, ns, flags;
};

__device__ __forceinline__ void ch_arrive(uint64_t *bar) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(b) : "memory");
}

__device__ __forceinline__ void ch_wait_count(const unsigned *c, unsigned target, int flags) {
    if (flags & CH_NOWAIT) return;
    unsigned v;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
        if (v >= target) return;
        if (flags & CH_SLEEP) __nanosleep(128);
    }
}

// ch_step_ctr: op i's step counter (flags >> CH_STEP_SHIFT: a step of that
// many µs between op i and op i+1), after the op and segment counters
__device__ __forceinline__ unsigned *ch_step_ctr(const ChainArgs &p, int i) {
    return p.count + (1 + CH_SEGS) * p.n_ops + i;
}

// ch_probe_word: the word of the count buffer where the probe's sums begin
// (after ten counters an op, rounded to 8 bytes); the flagged words follow
// them (8 uint64 a multiprocessor later). ChainCountBytes mirrors it.
__host__ __device__ constexpr int ch_probe_word(int n_ops) { return ((2 + CH_SEGS) * n_ops + 1) & ~1; }

// ch_probe: where CTA b's clock64 sums go (CH_PROBE), 8 of them after the
// counters: consumer warp 0's waits for the stages' bytes, its waits for
// the ops' inputs (with the activation's loads), its items, the producer's
// waits for free stages, warp 0's waits for a free partials buffer, the
// finisher's fences, and the latency probe's cycles and loads
__device__ __forceinline__ unsigned long long *ch_probe(const ChainArgs &p) {
    return (unsigned long long *)(p.count + ch_probe_word(p.n_ops)) + 8 * blockIdx.x;
}

// ch_wait_done waits until op i has stored all its blocks
__device__ __forceinline__ void ch_wait_done(const ChainArgs &p, int i) {
    ch_wait_count(p.count + i, (unsigned)(p.op[i].rows / 32), p.flags);
}

// ch_wait_op waits until op i's input is ready: op i−1 complete, or the
// step after it done where the chain has steps
__device__ __forceinline__ void ch_wait_op(const ChainArgs &p, int i) {
    if (p.flags >> CH_STEP_SHIFT)
        ch_wait_count(ch_step_ctr(p, i - 1), 1, p.flags);
    else
        ch_wait_done(p, i - 1);
}

// ch_publish makes the warp's stores visible, then adds one to c (and to
// c2 unless null) by lane 0: mode 0 __threadfence by every lane (fence.sc),
// 1 fence.acq_rel.gpu by every lane, 2 the warp's barrier then a release
// reduction by lane 0 alone (cumulative over the stores the barrier
// ordered before it). warp: the whole warp calls it (else lane 0 alone).
__device__ __forceinline__ void ch_publish(unsigned *c, unsigned *c2, int mode, int lane, bool warp = true) {
    if (mode == 0)
        __threadfence();
    else if (mode == 1)
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    if (warp) __syncwarp();
    if (lane != 0) return;
    if (mode == 2) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
        if (c2) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c2) : "memory");
    } else {
        atomicAdd(c, 1u);
        if (c2) atomicAdd(c2, 1u);
    }
}

// ch_ll_put stores one flagged word (fence mode 3, as NCCL's LL protocol):
// the value and the flag 1 in one 8-byte store, which a reader sees whole,
// so no fence orders it (the entry zeroes the words before each launch)
__device__ __forceinline__ void ch_ll_put(unsigned long long *w, unsigned v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(w), "l"((unsigned long long)v | (1ull << 32)) : "memory");
}

// ch_blocks: CTA b's output blocks [b0, b1) of op o
// (CH_IDLE: CTA 0 none, the others share them)
__device__ __forceinline__ void ch_blocks(const ChainOp &o, int flags, int &b0, int &b1) {
    const int nblk = (int)(o.rows / 32), idle = (flags & CH_IDLE) ? 1 : 0, G = gridDim.x - idle;
    const int b = (int)blockIdx.x - idle;
    if (b < 0) {
        b0 = b1 = 0;
        return;
    }
    b0 = (int)((int64_t)b * nblk / G);
    b1 = (int)((int64_t)(b + 1) * nblk / G);
}

// CW consumer warps, each forming U of its items at once (their loads,
// dp4a sums and tree sums interleaved; each item's operations unchanged),
// then the producer warp, the finisher warp and the step warp.
template <int CW, int U>
__global__ void __launch_bounds__(32 * (CW + 3), 1) k_chain_q8(const __grid_constant__ ChainArgs p) {
    extern __shared__ __align__(128) uint8_t s_mem[];
    uint64_t *full = (uint64_t *)s_mem, *empty = full + CH_MAX_STAGES;
    uint64_t *pfull = empty + CH_MAX_STAGES, *pempty = pfull + 2; // the partials' two buffers
    uint64_t *hold = pempty + 2; // CH_HOLD: the finisher published the CTA's last block of an op
    float *s_part = (float *)(s_mem + CH_PART);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int ns = p.ns, tile = CH_TILE >> ((p.flags >> CH_TILE_SHIFT) & 3), sbytes = tile + tile / 16;
    const bool probe = (p.flags & CH_PROBE) != 0;
    if (tid == 0) {
        for (int s = 0; s < ns; s++) {
            bar_init(full + s, 1);
            bar_init(empty + s, CW);
        }
        for (int k = 0; k < 2; k++) {
            bar_init(pfull + k, CW);
            bar_init(pempty + k, 1);
        }
        bar_init(hold, 1);
    }
    __syncthreads();
    if (warp == CW + 2) { // the step thread (CTA 0, lane 0), or the L2 latency probe's
        if (lane != 0) return;
        if (probe && ((p.flags >> CH_FENCE_SHIFT) & 3) != 3 && (blockIdx.x != 0 || !(p.flags >> CH_STEP_SHIFT))) {
            // dependent ld.global.cg of one word (an L2 hit) until the last
            // op is complete: cycles and loads into ch_probe's [6], [7]
            const unsigned z = (unsigned)p.n_ops >> 20; // 0, unknown to the compiler
            const unsigned *base = p.count + ch_probe_word(p.n_ops) - 1;
            const unsigned *last = p.count + p.n_ops - 1;
            const unsigned target = (unsigned)(p.op[p.n_ops - 1].rows / 32);
            unsigned long long cyc = 0, n = 0;
            unsigned v = 0;
            for (;;) {
                unsigned done;
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(done) : "l"(last) : "memory");
                if (done >= target || (p.flags & CH_NOWAIT)) break;
                const long long t0 = clock64();
#pragma unroll 1
                for (int k = 0; k < 16; k++)
                    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(base + (v & z)) : "memory");
                cyc += clock64() - t0 + (v & z);
                n += 16;
            }
            unsigned long long *q = ch_probe(p);
            q[6] = cyc;
            q[7] = n;
            return;
        }
        if (blockIdx.x != 0 || !(p.flags >> CH_STEP_SHIFT)) return;
        // the steps between the ops (a latency-bound stand-in: one thread
        // waits for op i−1, then spins flags >> CH_STEP_SHIFT µs at 1.98 GHz)
        const long long cyc = (long long)(p.flags >> CH_STEP_SHIFT) * 1980;
        for (int i = 1; i < p.n_ops; i++) {
            ch_wait_done(p, i - 1);
            const long long t0 = clock64();
            while (clock64() - t0 < cyc) {
            }
            ch_publish(ch_step_ctr(p, i - 1), nullptr, (p.flags >> CH_FENCE_SHIFT) & 3, 0, false);
        }
        return;
    }
    if (warp == CW) { // the producer
        if (lane != 0) return;
        unsigned long long t_empty = 0;
        int it = 0, nop = 0;
        for (int i = 0; i < p.n_ops; i++) {
            const ChainOp &o = p.op[i];
            int b0, b1;
            ch_blocks(o, p.flags, b0, b1);
            if (b1 == b0) continue;
            if ((p.flags & CH_SERIAL) && i > 0) ch_wait_op(p, i);
            // (CH_HOLD: the publish's fence then waits for no bytes of this
            // op in flight on the SM)
            if ((p.flags & CH_HOLD) && nop > 0) bar_wait(hold, (unsigned)(nop - 1) & 1);
            nop++;
            const int tr = tile / (int)o.cols;
            const uint8_t *sc = o.w + o.rows * o.cols; // the scales' region
            for (int r0 = b0 * 32; r0 < b1 * 32; r0 += tr, it++) {
                const int s = it % ns;
                if (it >= ns) {
                    const long long t0 = probe ? clock64() : 0;
                    bar_wait(empty + s, (unsigned)(it / ns - 1) & 1);
                    if (probe) t_empty += clock64() - t0;
                }
                uint8_t *stg = s_mem + CH_STAGES_OFF + s * sbytes;
                bulk_fence();
                bar_expect(full + s, sbytes);
                bulk_copy(stg, o.w + (int64_t)r0 * o.cols, tile, full + s);
                bulk_copy(stg + tile, sc + (int64_t)r0 * (o.cols / 16), tile / 16, full + s);
            }
        }
        if (probe) ch_probe(p)[3] = t_empty;
        return;
    }
    if (warp == CW + 1) { // the finisher: each block's row sums, its Q8_0 activation, the counters
        unsigned long long t_fence = 0;
        int kb = 0; // the CTA's blocks so far
        for (int i = 0; i < p.n_ops; i++) {
            const ChainOp &o = p.op[i];
            int b0, b1;
            ch_blocks(o, p.flags, b0, b1);
            const int nseg = (int)o.cols / 1024;
            for (int b = b0; b < b1; b++, kb++) {
                bar_wait(pfull + (kb & 1), (unsigned)(kb >> 1) & 1);
                const float *pt = s_part + (kb & 1) * 32 * 8 + lane * nseg;
                float sum = pt[0];
                for (int g = 1; g < nseg; g++) sum += pt[g];
                __syncwarp();
                if (lane == 0) ch_arrive(pempty + (kb & 1));
                o.y[b * 32 + lane] = sum;
                const long long t0 = probe ? clock64() : 0;
                if (((p.flags >> CH_FENCE_SHIFT) & 3) == 3) { // flagged words, no fence, no counters
                    float dq;
                    const int q = q8_0_warp(sum, lane, (int8_t *)o.yq + b * 32, (float *)(o.yq + o.rows) + b, &dq);
                    unsigned w = (unsigned)q & 0xffu;
                    w |= ((unsigned)__shfl_down_sync(FULL_MASK, q, 1) & 0xffu) << 8;
                    w |= ((unsigned)__shfl_down_sync(FULL_MASK, q, 2) & 0xffu) << 16;
                    w |= ((unsigned)__shfl_down_sync(FULL_MASK, q, 3) & 0xffu) << 24;
                    unsigned long long *ll = p.ll + o.ll;
                    if ((lane & 3) == 0) ch_ll_put(ll + b * 8 + lane / 4, w);
                    if (lane == 0) ch_ll_put(ll + o.rows / 4 + b, __float_as_uint(dq));
                } else {
                    q8_0_warp(sum, lane, (int8_t *)o.yq + b * 32, (float *)(o.yq + o.rows) + b);
                    ch_publish(p.count + i, b / 32 < CH_SEGS ? p.count + p.n_ops + CH_SEGS * i + b / 32 : nullptr,
                               (p.flags >> CH_FENCE_SHIFT) & 3, lane);
                }
                if (probe) t_fence += clock64() - t0;
                if (b == b1 - 1 && lane == 0) ch_arrive(hold);
            }
        }
        if (probe && lane == 0) ch_probe(p)[5] = t_fence;
        return;
    }
    // the consumers
    // the block of its segment this lane scales, and its two halves (units)
    const int blk_l = ds4mv::q8f_blk(lane), u0 = ds4mv::q8f_u0(lane), u1 = ds4mv::q8f_u1(lane);
    const bool pr = probe && tid == 0;
    unsigned long long t_full = 0, t_op = 0, t_items = 0, t_part = 0, t_mark = 0;
    int it = 0, kb = 0;
    for (int i = 0; i < p.n_ops; i++) {
        const ChainOp &o = p.op[i];
        int b0, b1;
        ch_blocks(o, p.flags, b0, b1);
        if (b1 == b0) continue;
        const int cols = (int)o.cols, nseg = cols / 1024, nsh = __ffs(nseg) - 1, tr = tile / cols;
        // the warp's activation: units u0 and u1 of its segment (a
        // warp's items all lie in segment warp mod nseg: nseg divides CW),
        // read from L2 once op i−1 is complete (CH_SEGDEP: once its 1024
        // rows of that segment are)
        const int xseg = warp & (nseg - 1);
        if (pr) t_mark = clock64();
        const bool ll = i > 0 && ((p.flags >> CH_FENCE_SHIFT) & 3) == 3;
        if (i > 0 && lane == 0 && !ll) {
            if (!(p.flags & CH_SEGDEP) || (p.flags >> CH_STEP_SHIFT)) ch_wait_op(p, i);
            if (p.flags & CH_SEGDEP)
                ch_wait_count(p.count + p.n_ops + CH_SEGS * (i - 1) + xseg,
                              (unsigned)min(32, (int)(p.op[i - 1].rows / 32) - 32 * xseg), p.flags);
        }
        __syncwarp();
        int4 xr0, xr1;
        float xdr;
        if (ll) { // op i−1's flagged words: polled until all nine of the lane's are in
            const unsigned long long *w = p.ll + p.op[i - 1].ll;
            const unsigned long long *a[9] = {w + xseg * 256 + 4 * u0, w + xseg * 256 + 4 * u0 + 1,
                                              w + xseg * 256 + 4 * u0 + 2, w + xseg * 256 + 4 * u0 + 3,
                                              w + xseg * 256 + 4 * u1, w + xseg * 256 + 4 * u1 + 1,
                                              w + xseg * 256 + 4 * u1 + 2, w + xseg * 256 + 4 * u1 + 3,
                                              w + cols / 4 + xseg * 32 + blk_l};
            unsigned v[9];
            for (;;) {
                bool ok = true;
#pragma unroll
                for (int k = 0; k < 9; k++) {
                    unsigned long long x;
                    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(x) : "l"(a[k]) : "memory");
                    v[k] = (unsigned)x;
                    ok &= (x >> 32) == 1;
                }
                if (ok || (p.flags & CH_NOWAIT)) break;
                if (p.flags & CH_SLEEP) __nanosleep(256);
            }
            xr0 = make_int4((int)v[0], (int)v[1], (int)v[2], (int)v[3]);
            xr1 = make_int4((int)v[4], (int)v[5], (int)v[6], (int)v[7]);
            xdr = __uint_as_float(v[8]);
        } else {
            const uint8_t *xa = o.act + xseg * 1024;
            xr0 = __ldcg((const int4 *)(xa + 16 * u0));
            xr1 = __ldcg((const int4 *)(xa + 16 * u1));
            xdr = __ldcg((const float *)(o.act + cols) + xseg * 32 + blk_l);
        }
        if (pr) t_op += clock64() - t_mark;
        for (int b = b0; b < b1; b++, kb++) {
            float *part = s_part + (kb & 1) * 32 * 8;
            if (kb >= 2) { // the finisher has read the buffer's block before last
                if (pr) t_mark = clock64();
                bar_wait(pempty + (kb & 1), (unsigned)((kb >> 1) - 1) & 1);
                if (pr) t_part += clock64() - t_mark;
            }
            for (int t = 0; t < 32 / tr; t++, it++) {
                const int s = it % ns;
                if (pr) t_mark = clock64();
                bar_wait(full + s, (unsigned)(it / ns) & 1);
                if (pr) {
                    const unsigned long long tn = clock64();
                    t_full += tn - t_mark;
                    t_mark = tn;
                }
                const uint8_t *stg = s_mem + CH_STAGES_OFF + s * sbytes;
                const int items = (p.flags & CH_NOMATH) ? 0 : tr * nseg; // (tile / 1024 items a stage)
                for (int i0 = warp; i0 < items; i0 += CW * U) {
                    int4 w0[U], w1[U];
                    __half d[U];
                    float v[U];
#pragma unroll
                    for (int j = 0; j < U; j++) {
                        const int item = min(i0 + j * CW, items - 1), row = item >> nsh, seg = item & (nseg - 1);
                        const uint8_t *q = stg + (size_t)row * cols + seg * 1024;
                        w0[j] = *(const int4 *)(q + 16 * u0);
                        w1[j] = *(const int4 *)(q + 16 * u1);
                        d[j] = ((const __half *)(stg + tile + (size_t)row * (cols / 16)))[seg * 32 + blk_l];
                    }
                    ds4mv::q8f_sums<U>(w0, w1, d, xr0, xr1, xdr, v); // (k_mv_pipe_q8f's operations)
                    if (lane == 0)
#pragma unroll
                        for (int j = 0; j < U; j++) {
                            const int item = i0 + j * CW, row = item >> nsh, seg = item & (nseg - 1);
                            if (item < items) part[(t * tr + row) * nseg + seg] = v[j];
                        }
                }
                __syncwarp();
                if (pr) t_items += clock64() - t_mark;
                if (lane == 0) ch_arrive(empty + s);
            }
            if (lane == 0) ch_arrive(pfull + (kb & 1)); // (after the warp's partials of the block)
        }
    }
    if (pr) {
        unsigned long long *q = ch_probe(p);
        q[0] = t_full;
        q[1] = t_op;
        q[2] = t_items;
        q[4] = t_part;
    }
}

} // namespace

int ds4c_chain_q8(const ds4c_chain_op *h_ops, int n_ops, unsigned *d_count, int stages, int flags, void *stream) {
    DS4C_READY();
    if (n_ops <= 0) return 0;
    if (n_ops > CH_MAX_OPS || !h_ops || !d_count)
        return ds4c_err(DS4C_EINVAL, "chain_q8: %d ops (at most %d), counters %p", n_ops, CH_MAX_OPS, (void *)d_count);
    int dev = 0, optin = 0;
    DS4C_CHECK(cudaGetDevice(&dev));
    DS4C_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const int tile = CH_TILE >> ((flags >> CH_TILE_SHIFT) & 3), sbytes = tile + tile / 16;
    if (tile < 8192 || stages < 2 || stages > CH_MAX_STAGES || CH_STAGES_OFF + stages * sbytes > optin)
        return ds4c_err(DS4C_EINVAL, "chain_q8: %d stages of %d bytes do not fit", stages, sbytes);
#if !BULK_COPY
    return ds4c_err(DS4C_ETYPE, "chain_q8: this library was built without bulk copies (CUDA 12 or later)");
#else
    ChainArgs p = {};
    int64_t ll_words = 0;
    for (int i = 0; i < n_ops; i++) {
        const ds4c_chain_op &h = h_ops[i];
        const int64_t c = h.cols;
        if (!h.w || !h.act || !h.y || !h.yq || h.rows <= 0 || h.rows % 32 != 0 || h.rows > (1 << 20) ||
            (c != 1024 && c != 2048 && c != 4096 && c != 8192) || (((uintptr_t)h.w | (uintptr_t)h.act) & 15) != 0)
            return ds4c_err(DS4C_EINVAL, "chain_q8: op %d: %lld x %lld (rows whole blocks of 32, cols 1024..8192, "
                                         "16-byte aligned weights and activation)",
                            i, (long long)h.rows, (long long)c);
        if (i > 0 && h.cols != h_ops[i - 1].rows)
            return ds4c_err(DS4C_EINVAL, "chain_q8: op %d takes %lld values, op %d gives %lld", i, (long long)c, i - 1,
                            (long long)h_ops[i - 1].rows);
        p.op[i] = {(const uint8_t *)h.w, (const uint8_t *)h.act, h.y, (uint8_t *)h.yq, h.rows, c, ll_words};
        ll_words += h.rows / 4 + h.rows / 32;
    }
    if (((flags >> CH_FENCE_SHIFT) & 3) == 3 && ((flags & CH_SERIAL) || (flags >> CH_STEP_SHIFT)))
        return ds4c_err(DS4C_EINVAL, "chain_q8: flagged words (fence mode 3) count nothing to wait for (serial, steps)");
    p.count = d_count;
    p.n_ops = n_ops;
    p.ns = stages;
    p.flags = flags;
    cudaStream_t st = as_stream(stream);
    DS4C_CHECK(cudaMemsetAsync(d_count, 0, sizeof(unsigned) * (2 + CH_SEGS) * n_ops, st));
    // the flagged words (fence mode 3) after the counters and the probe's sums
    p.ll = (unsigned long long *)(d_count + ch_probe_word(n_ops)) + 8 * ds4c_sm_count();
    if (((flags >> CH_FENCE_SHIFT) & 3) == 3) DS4C_CHECK(cudaMemsetAsync(p.ll, 0, 8 * ll_words, st));
    const int smem = CH_STAGES_OFF + stages * sbytes;
    const bool wide = (flags & CH_WIDE) != 0, ilp = (flags & CH_ILP) != 0;
    void (*k)(ChainArgs) = wide ? (ilp ? k_chain_q8<16, 2> : k_chain_q8<16, 1>) : (ilp ? k_chain_q8<8, 4> : k_chain_q8<8, 1>);
    DS4C_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ds4c_sm_count());
    cfg.blockDim = dim3(32 * ((wide ? 16 : 8) + 3));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    DS4C_CHECK(cudaLaunchKernelEx(&cfg, k, p));
    return 0;
#endif
}
