// ds4cuda.cu: device selection, error reporting, memory, streams and events
// of libds4cuda.so (see ds4cuda.h).
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include <ctype.h>
#include <stdlib.h>

#include "common.cuh"

static thread_local char g_errbuf[512];
static int g_device = -1;        // set by ds4c_init
static thread_local int t_device = -1; // device made current on this thread
static int g_sm_count = 0;
static int g_opt_wload = 1; // measured fastest on the H100 (cuda/NOTES.md)
static int g_opt_splitk = 0;
static int g_opt_rpw = 0;
static int g_opt_tc_min_tok = 5;  // tensor cores from 5 tokens (cuda/NOTES.md v4; 4 until v69: a pass of four tokens, three drafts, takes the few-token forms, exact MTP +33 %)
static int g_opt_tc_min_sel = 32;
static int g_opt_pdl = 1;
static int g_opt_attn_po = 1;
static int g_opt_prefetch = 1;
static int g_opt_fx_warp = 1;
static int g_opt_fx_live = 15; // k_fexact_warp, by bits: 1 rows of at most 1024 columns skip the four empty groups (fexact.cuh; cuda/NOTES.md v59); 2 a row's loads requested two float4s a thread at once before they are staged (v75); 4 the fused norm's loads likewise (a form of its own); 8 passes of 2-4 tokens: every token's row copied at once by cp.async (v76; over bit 2)
static int g_opt_mv_dec_sum = 1; // exact k_mv_dec rows summed on lane p from shared memory (matvec.cuh; cuda/NOTES.md v60)
static int g_opt_attn_po_vec = 4; // k_attn_po: 1 key rows staged once a CTA, key slices read as float4 quads (cuda/NOTES.md v60); 2 also conflict-free staging and the serial loops' loads a group ahead; 3 also exact weighted sums two heads a warp (model.cu; cuda/NOTES.md v62); 4 (the default since v64) as 2, exact mode's softmax statistics once a head in clusters of 8 CTAs (k_attn_po_cl)
static int g_opt_hc_two = 1;
static int g_opt_norm_rope = 1;
static int g_opt_hc_quant = 1;
static int g_opt_mv_pipe = 2; // CTAs per SM of the pipelined products (0: off)
static int g_opt_mv_pipe_min = 0; // MiB of weights from which a product is pipelined (0: every one; v9's 15 kept q_a, the KV and the shared expert on k_matvec until v34)
static int g_opt_mv_copy = 2; // their copies: cp.async, with the L2 hint, bulk
static int g_opt_mv_stage = 0;  // their bytes per stage (0: what fits)
static int g_opt_mv_stages = 3; // their stages
static int g_opt_mv_timing = 0; // timing experiments only (wrong results)
static int g_opt_attn_order = 5; // exact attention's summation order: 0 serial (the default until v66), 1 segmented (cpu.AttendHead) in k_attn_po_cl, 2 segmented split over the segments (k_attn_seg, 128-dim slices; 3: 64, 4: 32; 5, the default: as 3 with the scores formed in k_attn_seg_cl, a cluster of the 8 dim slices, for head dim 512, else as 3); chunks in k_attn_softmax_seg + k_attn_out_tile<false, true> (cuda/NOTES.md v65)
static int g_opt_mv_occ = 3; // the pipelined Q8_0 products of 2-4 tokens in forms whose registers are bounded for two CTAs an SM, two items a warp at once (k_mv_pipe_q8f's MB; the same bits), by bits: 1 fast mode's, 2 exact mode's (cuda/NOTES.md v71; default 3, both); 0 the unbounded forms (one CTA an SM where they hold more registers)
static int g_opt_seg_comb = 1; // k_attn_seg_combine: 1 its loads requested before the statistics (v67), 0 the v66 form (the same bits)
static int g_opt_ex_timing = 0; // timing experiments only (wrong results): exact single-token work on fast mode's kernels, by class (DS4C_OPT_EX_TIMING)
static int g_opt_ix_tile = 2; // indexer scores of fewer than 8 queries: 1 k_index_tile, 2 fast mode's on the tensor cores (model.cu k_index_tile_tc; cuda/NOTES.md v29)
static int g_opt_topk_warp = 1;
static int g_opt_router_warp = 1;
static int g_opt_attn_ecache = 1;
static int g_opt_attn_rope = 1;
static int g_opt_attn_quant = 1;
static int g_opt_attn_tile = 2;
static int g_opt_ix_chunk = 1;
static int g_opt_fx_wreg = 2; // 2: k_fexact_tile_wv where the stages are whole (fexact.cuh; cuda/NOTES.md v60)
static int g_opt_tc_q8w = 2;
static int g_opt_quant_vec = 1;
static int g_opt_norm_rope_w = 1;
static int g_opt_float_tc = 1;
static int g_opt_attn_tc = 1;
static int g_opt_attn_split = 2;
static int g_opt_half_mm = 2;   // fast mode: Q8_0 and F16 products of chunks through cuBLAS (3, the hc mixers too, measured no faster: cuda/NOTES.md v15)
static int g_opt_half_min = 128;
static int g_opt_attn_flash = 3; // fast chunks' attention: k_attn_wg (wgmma; 2 where there is none), cuda/NOTES.md v53
static int g_opt_ix_flash = 4; // fast chunks' indexer scores: 4 k_index_wg on the tile image (wgmma; 2 where there is none), cuda/NOTES.md v53
static int g_opt_hc_chunk = 1;
static int g_opt_had_warp = 1; // Hadamard transforms a warp a row (model.cu k_hadamard_w)
static int g_opt_hc_mix = 1; // fast chunks' mixing logits in one pass on the TF32 tensor cores (hc_mix.cu): 1 chunks of up to 1024 tokens split over clusters of 8 CTAs (v49), 2 never split
static int g_opt_attn_half = 3; // fast chunks: q_b's f16 output rows normalised and rotated in the flash kernels, their output f16 and rotated back there (cuda/NOTES.md v54)
static int g_opt_mv_pre = 7; // pipelined products: tiles requested before the wait (matvec.cuh k_mv_pipe; capped at stages − 1)
static int g_opt_mv_ilp = 4; // fast pipelined Q8_0 products: items a warp forms at once (matvec.cuh q8f_items; cuda/NOTES.md v40)
static int g_opt_mv_sumw = 1; // fast pipelined Q8_0 products: the row sums on the last warp (matvec.cuh k_mv_pipe_q8f; cuda/NOTES.md v40)
static int g_opt_mv_two = 31; // Q8_0 products of two tokens as one k_mv_pipe_q8f (weights streamed once), by bits: 1 fast mode's, <2, 2> (cuda/NOTES.md v45); 2 exact mode's, <2, 2, true> (v67); 4 (with bit 2) exact mode's ds4c_matmul_q8out of two tokens quantizing its output in the product (v68); 8 exact mode's k_hc_post_mix_ex of two tokens in one CTA a part (v68); 16 fast mode's three- and four-token items with their trees packed (q8f_items4; v71: fast three drafts +4.7 % in one process, the same bits; default since v71)
static int g_opt_topk_cl = 8193; // top-k of this many candidate rows or more on a cluster of CTAs a token (model.cu k_topk_cl; 0 never; cuda/NOTES.md v51)
static int g_opt_mv_q8_ns_ex = 200; // exact mode's pipelined Q8_0 products' stages by class: the shared expert's down in 2 (cuda/NOTES.md v63)
static int g_opt_mv_q8_ns_fast = 0; // fast mode's: DS4C_OPT_MV_STAGES for all
static int g_opt_mv_few_ns_ex = 2222; // exact mode's of 2-4 tokens (speculative passes), each digit 0 the one-token option's: 2 stages of taller tiles for all (cuda/NOTES.md v72: exact three drafts +2.9 % in one process)
static int g_opt_mv_few_ns_fast = 2222; // fast mode's of 2-4 tokens: 2 stages of taller tiles for all (cuda/NOTES.md v72: fast three drafts +3.9 % in one process, one token's products measured −0.5 % at 2222)
static int g_opt_mv_q8_ctas_ex = 0;   // their CTAs an SM at most by class (0: DS4C_OPT_MV_PIPE for all)
static int g_opt_mv_q8_ctas_fast = 0;
static int g_opt_mv_exq8 = 2; // exact pipelined Q8_0 products on k_mv_pipe_q8f's items, terms added in block order (cuda/NOTES.md v57), by a ninth warp (2, v58)
static int g_opt_topk_wide = 1; // prefill chunks' top-k past 8192 rows in two walks (k_topk_wide), cuda/NOTES.md v53
static int g_opt_topk_cl_tok = 16; // … for launches of at most this many tokens (decode steps and passes: prefill chunks measured slower so)
static int g_opt_ix_flash_split = 2; // fast chunks' indexer scores (k_index_flash): rows split into runs for this many waves of CTAs (0: a CTA walks every row; cuda/NOTES.md v51)
static int g_opt_tc_parts = 1; // grouped int8 products of 32-slot CTAs over the part list: only non-empty parts launched (cuda/NOTES.md v50)
static int g_opt_mv_room = 0; // pipelined products given room (DS4C_MM_ROOM) run mv_pipe CTAs an SM in the room's budget, by bits: 1 one token's, 2 two tokens' (else one CTA; cuda/NOTES.md v47; 2 was the default until v65: speculative +1.3 % without it)
static int g_opt_mv_pair = 1; // ds4c_matmul_grouped_pair: one selection's Q8_0/Q4_K pair in one k_matvec grid
static int g_opt_attn_seg_occ = 4; // exact split attention compiled for 4 CTAs an SM (model.cu, k_attn_seg_cl<MINB>; CUDA 13: 64 registers against 78, so 4 CTAs an SM against 3; cuda/NOTES.md v73: exact three drafts +1.0 … +1.2 %, one draft +0.7 %, plain decode 0.0 %, the same bits)
static int g_opt_attn_seg_walk = 1; // exact split attention's segments walked by fewer CTAs (model.cu k_attn_seg_walk): 0 off, 1 single tokens (the default; cuda/NOTES.md v74: exact decode +0.5 … +0.7 %, the same bits), 2 every token count, 3+ every count with walk − 2 segments a CTA
static int g_opt_ix_exact = 2; // exact mode's chunk indexer scores on the f16 tensor cores where exact (model.cu k_index_flash_exact; cuda/NOTES.md v78: exact prefill at 131k +85 %, the same bits); 2 (the default since v79: +5.05 % at 131k against 1) the same from f16 copies of the rows with their spans (k_ix_rows_half, once a chunk); bit 4: tests only
static int g_opt_attn_seg_form = 5; // exact split attention's CL score and sum forms (model.cu sgc_scores, sgc_sums): SF + 4 · PF; SF 0 a thread a chain, 1 two heads a thread, 2 two heads × two keys; PF 0 a head's 2 dims a lane, 1 two heads' dim a lane; default 5 (SF 1, PF 1; cuda/NOTES.md v75: exact decode +0.58 %, exact three drafts +1.14 %; the same bits)
static int g_opt_attn_cluster = 1; // fast split attention combined in its launch by clusters (model.cu, k_attn_split_cl)
static int g_opt_comp_emit = 1;    // a decode step's compressed row in one launch (model.cu, k_comp_emit)
static int g_opt_attn_wave = 1; // fast split attention: splits that fit one wave of CTAs (model.cu, k_attn_split's launch)
static int g_opt_mv_dec_late = 2; // k_mv_dec launched without the early launch: 1 the routed gate/up pair, 2 also the down (matvec.cuh launch_dec_as; cuda/NOTES.md v26)
static int g_opt_mv_even = 1; // pipelined products: the tile height that evens the CTAs' rows (matvec.cuh launch_pipe)
static int g_opt_mv_fast = 3; // fast mode's single-token products sum in parallel: 1 the pipelined Q8_0 ones (matvec.cuh k_mv_pipe_q8f), 2 k_mv_dec's (cuda/NOTES.md v27)
static int g_opt_hc_hoist = 1; // single-token hc_pre with k_hc_post_mix's parts: the stream loads issued right after the wait (model.cu k_hc_pre)
static int g_opt_ix_query = 1; // ds4c_index_query: rotation, Hadamard/FP4 and weight scale in one launch (k_ix_query)
static int g_opt_mv_f32 = 7; // ds4c_matvec_f32, by bits: 1 the pipelined kernel forms its Q8_0 activation itself (matvec.cuh pipe_act_f32); 2 fast mode's F16 products normalise their row themselves (mv_float.cu k_mv_f16_norm, v35); 4 exact mode's too (fexact.cuh k_fexact_warp with MVArgs.nw; cuda/NOTES.md v59)
static int g_opt_mv_dec = 2; // single-token IQ2_XXS and Q2_K products: k_mv_dec, 2 rows at a time, 2 CTAs an SM (matvec.cuh launch_dec; cuda/NOTES.md v20)
static int g_opt_wg_glu = 1; // fast chunks: routed gate + up + SwiGLU in one wgmma launch (mm_wg.cu)
static int g_opt_wg_moe = 7; // routed experts on wgmma, weights dequantized into its A registers, Q2_K in CTAs of 2 warpgroups (cuda/NOTES.md v18, v55)
static int g_opt_tc_stage = 3; // IQ2_XXS 8 warps x 64 slots from 32 selections a matrix, else 4 x 32; Q2_K 4 x 32 (cuda/NOTES.md v12, v49)

int ds4c_err(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_errbuf, sizeof g_errbuf, fmt, ap);
    va_end(ap);
    return code;
}

int ds4c_cuda_err(cudaError_t e, const char *where) {
    cudaGetLastError(); // consume it, so that a later launch check does not report it again
    return ds4c_err((int)e, "%s: %s (%s)", where, cudaGetErrorString(e), cudaGetErrorName(e));
}

int ds4c_ready(void) {
    if (g_device < 0) return ds4c_err(DS4C_ENOINIT, "ds4c_init has not been called");
    if (t_device != g_device) {
        cudaError_t e = cudaSetDevice(g_device);
        if (e != cudaSuccess) return ds4c_cuda_err(e, "cudaSetDevice");
        t_device = g_device;
    }
    return 0;
}

int ds4c_sm_count(void) { return g_sm_count; }
int ds4c_opt_wload(void) { return g_opt_wload; }
int ds4c_opt_splitk(void) { return g_opt_splitk; }
int ds4c_opt_rpw(void) { return g_opt_rpw; }
int ds4c_opt_tc_min_tok(void) { return g_opt_tc_min_tok > 0 ? g_opt_tc_min_tok : 0x7fffffff; }
int ds4c_opt_tc_min_sel(void) { return g_opt_tc_min_sel > 0 ? g_opt_tc_min_sel : 0x7fffffff; }
int ds4c_opt_pdl(void) { return g_opt_pdl; }
int ds4c_opt_attn_po(void) { return g_opt_attn_po; }
int ds4c_opt_prefetch(void) { return g_opt_prefetch; }
int ds4c_opt_fx_warp(void) { return g_opt_fx_warp; }
int ds4c_opt_fx_live(void) { return g_opt_fx_live; }
int ds4c_opt_mv_dec_sum(void) { return g_opt_mv_dec_sum; }
int ds4c_opt_hc_two(void) { return g_opt_hc_two; }
int ds4c_opt_norm_rope(void) { return g_opt_norm_rope; }
int ds4c_opt_hc_quant(void) { return g_opt_hc_quant; }
int ds4c_opt_mv_pipe(void) { return g_opt_mv_pipe; }
int ds4c_opt_mv_pipe_min(void) { return g_opt_mv_pipe_min; }
int ds4c_opt_mv_copy(void) { return g_opt_mv_copy; }
int ds4c_opt_mv_stage(void) { return g_opt_mv_stage; }
int ds4c_opt_mv_stages(void) { return g_opt_mv_stages; }
int ds4c_opt_mv_timing(void) { return g_opt_mv_timing; }
int ds4c_opt_ix_tile(void) { return g_opt_ix_tile; }
int ds4c_opt_attn_tile(void) { return g_opt_attn_tile; }
int ds4c_opt_ix_chunk(void) { return g_opt_ix_chunk; }
int ds4c_opt_fx_wreg(void) { return g_opt_fx_wreg; }
int ds4c_opt_tc_stage(void) { return g_opt_tc_stage; }
int ds4c_opt_tc_q8w(void) { return g_opt_tc_q8w; }
int ds4c_opt_quant_vec(void) { return g_opt_quant_vec; }
int ds4c_opt_norm_rope_w(void) { return g_opt_norm_rope_w; }
int ds4c_opt_float_tc(void) { return g_opt_float_tc; }
int ds4c_opt_attn_tc(void) { return g_opt_attn_tc; }
int ds4c_opt_attn_split(void) { return g_opt_attn_split; }
int ds4c_opt_half_mm(void) { return g_opt_half_mm; }
int ds4c_opt_half_min(void) { return g_opt_half_min; }
int ds4c_opt_attn_flash(void) { return g_opt_attn_flash; }
int ds4c_opt_ix_flash(void) { return g_opt_ix_flash; }
int ds4c_opt_hc_chunk(void) { return g_opt_hc_chunk; }
int ds4c_opt_hc_mix(void) { return g_opt_hc_mix; }
int ds4c_opt_had_warp(void) { return g_opt_had_warp; }
int ds4c_opt_wg_moe(void) { return g_opt_wg_moe; }
int ds4c_opt_attn_half(void) { return g_opt_attn_half; }
int ds4c_opt_wg_glu(void) { return g_opt_wg_glu; }
int ds4c_opt_mv_dec(void) { return g_opt_mv_dec; }
int ds4c_opt_mv_f32(void) { return g_opt_mv_f32; }
int ds4c_opt_mv_pre(void) { return g_opt_mv_pre; }
int ds4c_opt_mv_pair(void) { return g_opt_mv_pair; }
int ds4c_opt_mv_sumw(void) { return g_opt_mv_sumw; }
int ds4c_opt_mv_two(void) { return g_opt_mv_two; }
int ds4c_opt_mv_room(void) { return g_opt_mv_room; }
int ds4c_opt_tc_parts(void) { return g_opt_tc_parts; }
int ds4c_opt_ix_flash_split(void) { return g_opt_ix_flash_split; }
int ds4c_opt_topk_cl(void) { return g_opt_topk_cl; }
int ds4c_opt_topk_cl_tok(void) { return g_opt_topk_cl_tok; }
int ds4c_opt_topk_wide(void) { return g_opt_topk_wide; }
int ds4c_opt_mv_exq8(void) { return g_opt_mv_exq8; }
int ds4c_opt_mv_q8_ns(int exact) { return exact ? g_opt_mv_q8_ns_ex : g_opt_mv_q8_ns_fast; }
int ds4c_opt_mv_few_ns(int exact) { return exact ? g_opt_mv_few_ns_ex : g_opt_mv_few_ns_fast; }
int ds4c_opt_mv_q8_ctas(int exact) { return exact ? g_opt_mv_q8_ctas_ex : g_opt_mv_q8_ctas_fast; }
int ds4c_opt_mv_ilp(void) { return g_opt_mv_ilp; }
int ds4c_opt_ix_query(void) { return g_opt_ix_query; }
int ds4c_opt_attn_wave(void) { return g_opt_attn_wave; }
int ds4c_opt_attn_cluster(void) { return g_opt_attn_cluster; }
int ds4c_opt_attn_seg_occ(void) { return g_opt_attn_seg_occ; }
int ds4c_opt_attn_seg_walk(void) { return g_opt_attn_seg_walk; }
int ds4c_opt_attn_seg_form(void) { return g_opt_attn_seg_form; }
int ds4c_opt_ix_exact(void) { return g_opt_ix_exact; }
int ds4c_opt_comp_emit(void) { return g_opt_comp_emit; }
int ds4c_opt_hc_hoist(void) { return g_opt_hc_hoist; }
int ds4c_opt_mv_dec_late(void) { return g_opt_mv_dec_late; }
int ds4c_opt_mv_fast(void) { return g_opt_mv_fast; }
int ds4c_opt_mv_even(void) { return g_opt_mv_even; }

bool ds4c_stream_busy(cudaStream_t st) {
    if (ds4c_rec_any() && ds4c_rec_of(st)) return true;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone;
}
int ds4c_opt_topk_warp(void) { return g_opt_topk_warp; }
int ds4c_opt_router_warp(void) { return g_opt_router_warp; }
int ds4c_opt_attn_ecache(void) { return g_opt_attn_ecache; }
int ds4c_opt_attn_po_vec(void) { return g_opt_attn_po_vec; }
int ds4c_opt_ex_timing(void) { return g_opt_ex_timing; }
int ds4c_opt_attn_order(void) { return g_opt_attn_order; }
int ds4c_opt_seg_comb(void) { return g_opt_seg_comb; }
int ds4c_opt_mv_occ(void) { return g_opt_mv_occ; }
int ds4c_opt_attn_rope(void) { return g_opt_attn_rope; }
int ds4c_opt_attn_quant(void) { return g_opt_attn_quant; }

extern "C" {

int ds4c_abi_version(void) { return DS4C_ABI_VERSION; }

const char *ds4c_last_error(void) { return g_errbuf; }

int ds4c_device_count(int *n) {
    DS4C_CHECK(cudaGetDeviceCount(n));
    return 0;
}

static void env_options(void); // (after the option table, below)

int ds4c_init(int device) {
    int n = 0;
    DS4C_CHECK(cudaGetDeviceCount(&n));
    if (device < 0 || device >= n) return ds4c_err(DS4C_EINVAL, "device %d out of range (%d devices)", device, n);
    DS4C_CHECK(cudaSetDevice(device));
    DS4C_CHECK(cudaFree(0)); // create the primary context now
    int sms = 0;
    DS4C_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    g_sm_count = sms;
    g_device = device;
    env_options();
    t_device = device;
    return 0;
}

int ds4c_device_info(char *name, int name_len, int *ints, uint64_t *mem) {
    DS4C_READY();
    cudaDeviceProp p;
    DS4C_CHECK(cudaGetDeviceProperties(&p, g_device));
    if (name && name_len > 0) {
        strncpy(name, p.name, (size_t)name_len - 1);
        name[name_len - 1] = 0;
    }
    if (ints) {
        int clock = 0, bus = 0, rt = 0;
        cudaDeviceGetAttribute(&clock, cudaDevAttrMemoryClockRate, g_device);
        cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, g_device);
        cudaRuntimeGetVersion(&rt);
        ints[0] = p.major;
        ints[1] = p.minor;
        ints[2] = p.multiProcessorCount;
        ints[3] = p.l2CacheSize;
        ints[4] = (int)p.sharedMemPerBlockOptin;
        ints[5] = bus;
        ints[6] = clock;
        ints[7] = rt;
    }
    if (mem) {
        size_t fr = 0, tot = 0;
        DS4C_CHECK(cudaMemGetInfo(&fr, &tot));
        mem[0] = fr;
        mem[1] = tot;
    }
    return 0;
}

int ds4c_device_synchronize(void) {
    DS4C_READY();
    DS4C_CHECK(cudaDeviceSynchronize());
    return 0;
}

int ds4c_malloc(void **d_ptr, uint64_t bytes) {
    DS4C_READY();
    *d_ptr = nullptr;
    if (bytes == 0) bytes = 16;
    cudaError_t e = cudaMalloc(d_ptr, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ds4c_err((int)e, "cudaMalloc(%llu bytes): %s", (unsigned long long)bytes, cudaGetErrorString(e));
    }
    return 0;
}

int ds4c_free(void *d_ptr) {
    DS4C_READY();
    DS4C_CHECK(cudaFree(d_ptr));
    return 0;
}

int ds4c_malloc_host(void **h_ptr, uint64_t bytes) {
    DS4C_READY();
    *h_ptr = nullptr;
    DS4C_CHECK(cudaMallocHost(h_ptr, bytes ? bytes : 16));
    return 0;
}

int ds4c_free_host(void *h_ptr) {
    DS4C_READY();
    DS4C_CHECK(cudaFreeHost(h_ptr));
    return 0;
}

int ds4c_memcpy_h2d(void *d_dst, const void *h_src, uint64_t bytes) {
    DS4C_READY();
    DS4C_CHECK(cudaMemcpy(d_dst, h_src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

int ds4c_memcpy_d2h(void *h_dst, const void *d_src, uint64_t bytes) {
    DS4C_READY();
    DS4C_CHECK(cudaMemcpy(h_dst, d_src, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

// recorded returns the recorder logging the work of stream, if any
// (replay.cu).
static ds4c_rec *recorded(void *stream) { return ds4c_rec_any() ? ds4c_rec_of(as_stream(stream)) : nullptr; }

int ds4c_memcpy_h2d_async(void *d_dst, const void *h_src, uint64_t bytes, void *stream) {
    DS4C_READY();
    if (ds4c_rec *r = recorded(stream))
        return ds4c_rec_memcpy(r, as_stream(stream), d_dst, h_src, bytes, cudaMemcpyHostToDevice);
    DS4C_CHECK(cudaMemcpyAsync(d_dst, h_src, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
    return 0;
}

int ds4c_memcpy_d2h_async(void *h_dst, const void *d_src, uint64_t bytes, void *stream) {
    DS4C_READY();
    if (ds4c_rec *r = recorded(stream))
        return ds4c_rec_memcpy(r, as_stream(stream), h_dst, d_src, bytes, cudaMemcpyDeviceToHost);
    DS4C_CHECK(cudaMemcpyAsync(h_dst, d_src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
    return 0;
}

int ds4c_memcpy_d2d_async(void *d_dst, const void *d_src, uint64_t bytes, void *stream) {
    DS4C_READY();
    if (ds4c_rec *r = recorded(stream))
        return ds4c_rec_memcpy(r, as_stream(stream), d_dst, d_src, bytes, cudaMemcpyDeviceToDevice);
    DS4C_CHECK(cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
    return 0;
}

int ds4c_memset_async(void *d_dst, int value, uint64_t bytes, void *stream) {
    DS4C_READY();
    if (ds4c_rec *r = recorded(stream)) return ds4c_rec_memset(r, as_stream(stream), d_dst, value, bytes);
    DS4C_CHECK(cudaMemsetAsync(d_dst, value, bytes, as_stream(stream)));
    return 0;
}

int ds4c_stream_create(void **stream) {
    DS4C_READY();
    cudaStream_t s;
    DS4C_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = (void *)s;
    return 0;
}

int ds4c_stream_destroy(void *stream) {
    DS4C_READY();
    DS4C_CHECK(cudaStreamDestroy(as_stream(stream)));
    return 0;
}

int ds4c_stream_synchronize(void *stream) {
    DS4C_READY();
    if (recorded(stream)) return ds4c_err(DS4C_EINVAL, "stream_synchronize: the stream is being recorded");
    DS4C_CHECK(cudaStreamSynchronize(as_stream(stream)));
    return 0;
}

int ds4c_stream_wait_event(void *stream, void *event) {
    DS4C_READY();
    if (ds4c_rec *r = recorded(stream)) return ds4c_rec_event(r, as_stream(stream), event, 1);
    DS4C_CHECK(cudaStreamWaitEvent(as_stream(stream), (cudaEvent_t)event, 0));
    return 0;
}

int ds4c_event_create(void **event) {
    DS4C_READY();
    cudaEvent_t e;
    DS4C_CHECK(cudaEventCreate(&e));
    *event = (void *)e;
    return 0;
}

int ds4c_event_destroy(void *event) {
    DS4C_READY();
    DS4C_CHECK(cudaEventDestroy((cudaEvent_t)event));
    return 0;
}

int ds4c_event_record(void *event, void *stream) {
    DS4C_READY();
    if (ds4c_rec *r = recorded(stream)) return ds4c_rec_event(r, as_stream(stream), event, 0);
    DS4C_CHECK(cudaEventRecord((cudaEvent_t)event, as_stream(stream)));
    return 0;
}

int ds4c_event_synchronize(void *event) {
    DS4C_READY();
    DS4C_CHECK(cudaEventSynchronize((cudaEvent_t)event));
    return 0;
}

int ds4c_event_elapsed_ms(float *ms, void *start, void *end) {
    DS4C_READY();
    DS4C_CHECK(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
    return 0;
}

int ds4c_graph_begin(void *stream) {
    DS4C_READY();
    if (recorded(stream)) return ds4c_err(DS4C_EINVAL, "graph_begin: the stream is being recorded");
    DS4C_CHECK(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeRelaxed));
    return 0;
}

int ds4c_graph_end(void *stream, void **exec) {
    DS4C_READY();
    cudaGraph_t g;
    *exec = nullptr;
    DS4C_CHECK(cudaStreamEndCapture(as_stream(stream), &g));
    cudaGraphExec_t e;
    cudaError_t err = cudaGraphInstantiateWithFlags(&e, g, 0);
    cudaGraphDestroy(g);
    if (err != cudaSuccess) return ds4c_cuda_err(err, "cudaGraphInstantiate");
    *exec = (void *)e;
    return 0;
}

int ds4c_graph_end_update(void *stream, void **exec, int *how) {
    DS4C_READY();
    cudaGraph_t g;
    *how = 0;
    DS4C_CHECK(cudaStreamEndCapture(as_stream(stream), &g));
    if (*exec) {
        cudaGraphExecUpdateResultInfo info;
        cudaError_t err = cudaGraphExecUpdate((cudaGraphExec_t)*exec, g, &info);
        if (err == cudaSuccess) {
            cudaGraphDestroy(g);
            *how = 1;
            return 0;
        }
        (void)cudaGetLastError();
        cudaGraphExecDestroy((cudaGraphExec_t)*exec);
        *exec = nullptr;
    }
    cudaGraphExec_t e;
    cudaError_t err = cudaGraphInstantiateWithFlags(&e, g, 0);
    cudaGraphDestroy(g);
    if (err != cudaSuccess) return ds4c_cuda_err(err, "cudaGraphInstantiate");
    *exec = (void *)e;
    *how = 2;
    return 0;
}

int ds4c_graph_abort(void *stream) {
    DS4C_READY();
    cudaStreamCaptureStatus st;
    DS4C_CHECK(cudaStreamIsCapturing(as_stream(stream), &st));
    if (st == cudaStreamCaptureStatusNone) return 0;
    cudaGraph_t g = nullptr;
    cudaError_t err = cudaStreamEndCapture(as_stream(stream), &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    (void)err;
    return 0;
}

int ds4c_graph_launch(void *exec, void *stream) {
    DS4C_READY();
    DS4C_CHECK(cudaGraphLaunch((cudaGraphExec_t)exec, as_stream(stream)));
    return 0;
}

int ds4c_graph_destroy(void *exec) {
    DS4C_READY();
    DS4C_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)exec));
    return 0;
}

int ds4c_profiler(int on) {
    DS4C_READY();
    DS4C_CHECK(on ? cudaProfilerStart() : cudaProfilerStop());
    return 0;
}

// The options that take any value in a range, by key (the on/off ones: 0..1).
static const struct {
    int key;
    const char *name;
    int *value;
    int lo, hi;
} k_ranged[] = {
    {DS4C_OPT_PDL, "pdl", &g_opt_pdl, 0, 1},
    {DS4C_OPT_ATTN_PO, "attn_po", &g_opt_attn_po, 0, 1},
    {DS4C_OPT_PREFETCH, "prefetch", &g_opt_prefetch, 0, 1},
    {DS4C_OPT_FX_WARP, "fx_warp", &g_opt_fx_warp, 0, 1},
    {DS4C_OPT_FX_LIVE, "fx_live", &g_opt_fx_live, 0, 15},
    {DS4C_OPT_MV_DEC_SUM, "mv_dec_sum", &g_opt_mv_dec_sum, 0, 1},
    {DS4C_OPT_ATTN_PO_VEC, "attn_po_vec", &g_opt_attn_po_vec, 0, 4},
    {DS4C_OPT_HC_TWO, "hc_two", &g_opt_hc_two, 0, 1},
    {DS4C_OPT_NORM_ROPE, "norm_rope", &g_opt_norm_rope, 0, 1},
    {DS4C_OPT_HC_QUANT, "hc_quant", &g_opt_hc_quant, 0, 1},
    {DS4C_OPT_WLOAD, "wload", &g_opt_wload, 0, 2},
    {DS4C_OPT_MV_PIPE, "mv_pipe", &g_opt_mv_pipe, 0, 4},
    {DS4C_OPT_MV_COPY, "mv_copy", &g_opt_mv_copy, 0, 2},
    {DS4C_OPT_MV_STAGES, "mv_stages", &g_opt_mv_stages, 2, 8},
    {DS4C_OPT_MV_PIPE_MIN, "mv_pipe_min", &g_opt_mv_pipe_min, 0, 1 << 20},
    {DS4C_OPT_MV_TIMING, "mv_timing", &g_opt_mv_timing, 0, 2},
    {DS4C_OPT_EX_TIMING, "ex_timing", &g_opt_ex_timing, 0, 15},
    {DS4C_OPT_ATTN_ORDER, "attn_order", &g_opt_attn_order, 0, 5},
    {DS4C_OPT_SEG_COMB, "seg_comb", &g_opt_seg_comb, 0, 1},
    {DS4C_OPT_MV_OCC, "mv_occ", &g_opt_mv_occ, 0, 3},
    {DS4C_OPT_IX_TILE, "ix_tile", &g_opt_ix_tile, 0, 2},
    {DS4C_OPT_TOPK_WARP, "topk_warp", &g_opt_topk_warp, 0, 2},
    {DS4C_OPT_ROUTER_WARP, "router_warp", &g_opt_router_warp, 0, 1},
    {DS4C_OPT_ATTN_ECACHE, "attn_ecache", &g_opt_attn_ecache, 0, 1},
    {DS4C_OPT_ATTN_ROPE, "attn_rope", &g_opt_attn_rope, 0, 1},
    {DS4C_OPT_ATTN_QUANT, "attn_quant", &g_opt_attn_quant, 0, 1},
    {DS4C_OPT_ATTN_TILE, "attn_tile", &g_opt_attn_tile, 0, 2},
    {DS4C_OPT_IX_CHUNK, "ix_chunk", &g_opt_ix_chunk, 0, 1},
    {DS4C_OPT_FX_WREG, "fx_wreg", &g_opt_fx_wreg, 0, 2},
    {DS4C_OPT_TC_STAGE, "tc_stage", &g_opt_tc_stage, 0, 3},
    {DS4C_OPT_TC_Q8W, "tc_q8w", &g_opt_tc_q8w, 0, 2},
    {DS4C_OPT_QUANT_VEC, "quant_vec", &g_opt_quant_vec, 0, 1},
    {DS4C_OPT_NORM_ROPE_W, "norm_rope_w", &g_opt_norm_rope_w, 0, 1},
    {DS4C_OPT_FLOAT_TC, "float_tc", &g_opt_float_tc, 0, 2},
    {DS4C_OPT_ATTN_TC, "attn_tc", &g_opt_attn_tc, 0, 1},
    {DS4C_OPT_ATTN_SPLIT, "attn_split", &g_opt_attn_split, 0, 3},
    {DS4C_OPT_HALF_MM, "half_mm", &g_opt_half_mm, 0, 3},
    {DS4C_OPT_HALF_MIN, "half_min", &g_opt_half_min, 1, 1 << 20},
    {DS4C_OPT_ATTN_FLASH, "attn_flash", &g_opt_attn_flash, 0, 3},
    {DS4C_OPT_IX_FLASH, "ix_flash", &g_opt_ix_flash, 0, 4},
    {DS4C_OPT_HC_CHUNK, "hc_chunk", &g_opt_hc_chunk, 0, 1},
    {DS4C_OPT_HC_MIX, "hc_mix", &g_opt_hc_mix, 0, 2},
    {DS4C_OPT_HAD_WARP, "had_warp", &g_opt_had_warp, 0, 1},
    {DS4C_OPT_WG_MOE, "wg_moe", &g_opt_wg_moe, 0, 7},
    {DS4C_OPT_ATTN_HALF, "attn_half", &g_opt_attn_half, 0, 3},
    {DS4C_OPT_WG_GLU, "wg_glu", &g_opt_wg_glu, 0, 1},
    {DS4C_OPT_MV_DEC, "mv_dec", &g_opt_mv_dec, 0, 3},
    {DS4C_OPT_MV_F32, "mv_f32", &g_opt_mv_f32, 0, 7},
    {DS4C_OPT_MV_PRE, "mv_pre", &g_opt_mv_pre, 0, 7},
    {DS4C_OPT_MV_PAIR, "mv_pair", &g_opt_mv_pair, 0, 1},
    {DS4C_OPT_IX_QUERY, "ix_query", &g_opt_ix_query, 0, 1},
    {DS4C_OPT_ATTN_WAVE, "attn_wave", &g_opt_attn_wave, 0, 1},
    {DS4C_OPT_HC_HOIST, "hc_hoist", &g_opt_hc_hoist, 0, 1},
    {DS4C_OPT_MV_DEC_LATE, "mv_dec_late", &g_opt_mv_dec_late, 0, 2},
    {DS4C_OPT_MV_FAST, "mv_fast", &g_opt_mv_fast, 0, 3},
    {DS4C_OPT_MV_EVEN, "mv_even", &g_opt_mv_even, 0, 1},
    {DS4C_OPT_ATTN_CLUSTER, "attn_cluster", &g_opt_attn_cluster, 0, 1},
    {DS4C_OPT_ATTN_SEG_OCC, "attn_seg_occ", &g_opt_attn_seg_occ, 0, 5},
    {DS4C_OPT_ATTN_SEG_WALK, "attn_seg_walk", &g_opt_attn_seg_walk, 0, 14}, // (14: 2 + model.cu SGW_MAX)
    {DS4C_OPT_ATTN_SEG_FORM, "attn_seg_form", &g_opt_attn_seg_form, 0, 7},
    {DS4C_OPT_IX_EXACT, "ix_exact", &g_opt_ix_exact, 0, 7},
    {DS4C_OPT_COMP_EMIT, "comp_emit", &g_opt_comp_emit, 0, 1},
    {DS4C_OPT_MV_ILP, "mv_ilp", &g_opt_mv_ilp, 1, 4},
    {DS4C_OPT_MV_SUMW, "mv_sumw", &g_opt_mv_sumw, 0, 1},
    {DS4C_OPT_MV_TWO, "mv_two", &g_opt_mv_two, 0, 31},
    {DS4C_OPT_MV_ROOM, "mv_room", &g_opt_mv_room, 0, 3},
    {DS4C_OPT_TC_PARTS, "tc_parts", &g_opt_tc_parts, 0, 1},
    {DS4C_OPT_IX_FLASH_SPLIT, "ix_flash_split", &g_opt_ix_flash_split, 0, 64},
    {DS4C_OPT_TOPK_CL, "topk_cl", &g_opt_topk_cl, 0, 1 << 30},
    {DS4C_OPT_TOPK_CL_TOK, "topk_cl_tok", &g_opt_topk_cl_tok, 0, 65535},
    {DS4C_OPT_TOPK_WIDE, "topk_wide", &g_opt_topk_wide, 0, 1},
    {DS4C_OPT_MV_EXQ8, "mv_exq8", &g_opt_mv_exq8, 0, 2},
    {DS4C_OPT_MV_Q8_CTAS_EX, "mv_q8_ctas_ex", &g_opt_mv_q8_ctas_ex, 0, 9999},
    {DS4C_OPT_MV_Q8_CTAS_FAST, "mv_q8_ctas_fast", &g_opt_mv_q8_ctas_fast, 0, 9999},
};

// whole_number parses s, all of it, as a decimal number within ±2^30.
static bool whole_number(const char *s, int *x) {
    char *end = nullptr;
    const long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < -(1L << 30) || v > (1L << 30)) return false;
    *x = (int)v;
    return true;
}

// env_option sets option key from the environment variable name when it
// holds a whole decimal number that ds4c_set_option accepts (the option's
// own range checks); anything else keeps the default and is reported on
// stderr.
static void env_option(const char *name, int key) {
    const char *v = getenv(name);
    if (!v || !*v) return;
    int x = 0;
    if (!whole_number(v, &x)) {
        fprintf(stderr, "ds4cuda: %s=%s ignored: not a whole number within ±2^30\n", name, v);
        return;
    }
    if (ds4c_set_option(key, x) != 0) fprintf(stderr, "ds4cuda: %s=%s ignored: %s\n", name, v, ds4c_last_error());
}

// The options checked by ds4c_set_option's switch (not a plain range).
static const struct {
    int key;
    const char *name;
    int *value;
} k_other[] = {{DS4C_OPT_MV_STAGE, "mv_stage", &g_opt_mv_stage},
               {DS4C_OPT_RPW, "rpw", &g_opt_rpw},
               {DS4C_OPT_SPLITK, "splitk", &g_opt_splitk},
               {DS4C_OPT_TC_MIN_SEL, "tc_min_sel", &g_opt_tc_min_sel},
               {DS4C_OPT_TC_MIN_TOK, "tc_min_tok", &g_opt_tc_min_tok},
               {DS4C_OPT_MV_Q8_NS_EX, "mv_q8_ns_ex", &g_opt_mv_q8_ns_ex},
               {DS4C_OPT_MV_Q8_NS_FAST, "mv_q8_ns_fast", &g_opt_mv_q8_ns_fast},
               {DS4C_OPT_MV_FEW_NS_EX, "mv_few_ns_ex", &g_opt_mv_few_ns_ex},
               {DS4C_OPT_MV_FEW_NS_FAST, "mv_few_ns_fast", &g_opt_mv_few_ns_fast}};

// option_var writes an option's environment variable into var: DS4_CUDA_
// and its name in upper case.
static void option_var(const char *name, char (&var)[64]) {
    size_t n = strlen("DS4_CUDA_");
    memcpy(var, "DS4_CUDA_", n);
    for (const char *c = name; *c && n + 1 < sizeof var; c++) var[n++] = (char)toupper((unsigned char)*c);
    var[n] = 0;
}

// each_option calls f(key, environment variable, value) for every option:
// the table's, and those checked by ds4c_set_option's switch.
extern "C++" {
namespace {
template <class F> void each_option(F f) {
    char var[64];
    for (const auto &o : k_ranged) {
        option_var(o.name, var);
        f(o.key, (const char *)var, o.value);
    }
    for (const auto &o : k_other) {
        option_var(o.name, var);
        f(o.key, (const char *)var, o.value);
    }
}
} // namespace
} // extern "C++"

// option_by_var returns the value of the option whose environment variable
// is var (setting *key), or null when the library has none of that name.
static int *option_by_var(const char *var, int *key) {
    int *found = nullptr;
    each_option([&](int k, const char *v, int *value) {
        if (!found && strcmp(v, var) == 0) {
            *key = k;
            found = value;
        }
    });
    return found;
}

// env_options reads every option's environment variable.
static void env_options(void) {
    each_option([](int k, const char *v, int *) { env_option(v, k); });
}

int ds4c_set_option_env(const char *assign) {
    if (!assign) return ds4c_err(DS4C_EINVAL, "option: no assignment");
    const char *eq = strchr(assign, '=');
    const size_t n = eq ? (size_t)(eq - assign) : 0;
    if (n == 0 || n >= 64) return ds4c_err(DS4C_EINVAL, "option \"%s\" is not NAME=VALUE", assign);
    char var[64];
    memcpy(var, assign, n);
    var[n] = 0;
    int key = 0;
    if (!option_by_var(var, &key)) return ds4c_err(DS4C_EINVAL, "%s is not an option of this library", var);
    int x = 0;
    if (!whole_number(eq + 1, &x))
        return ds4c_err(DS4C_EINVAL, "%s: \"%s\" is not a whole number within ±2^30", var, eq + 1);
    return ds4c_set_option(key, x);
}

int ds4c_get_option_env(const char *var, int *value) {
    int key = 0;
    const int *v = var ? option_by_var(var, &key) : nullptr;
    if (!v) return ds4c_err(DS4C_EINVAL, "%s is not an option of this library", var ? var : "(null)");
    *value = *v;
    return 0;
}

int ds4c_set_option(int key, int value) {
    for (const auto &o : k_ranged) {
        if (o.key != key) continue;
        if (value < o.lo || value > o.hi)
            return ds4c_err(DS4C_EINVAL, "%s option %d out of range %d..%d", o.name, value, o.lo, o.hi);
        *o.value = value;
        return 0;
    }
    switch (key) {
    case DS4C_OPT_SPLITK:
        if (value != 0 && value != 1 && value != 2 && value != 4 && value != 8)
            return ds4c_err(DS4C_EINVAL, "splitk option %d not one of 0,1,2,4,8", value);
        g_opt_splitk = value;
        return 0;
    case DS4C_OPT_RPW:
        if (value != 0 && value != 1 && value != 2 && value != 4 && value != 8)
            return ds4c_err(DS4C_EINVAL, "rpw option %d not one of 0,1,2,4,8", value);
        g_opt_rpw = value;
        return 0;
    case DS4C_OPT_TC_MIN_TOK:
        if (value < 0) return ds4c_err(DS4C_EINVAL, "tc_min_tok option %d negative", value);
        g_opt_tc_min_tok = value;
        return 0;
    case DS4C_OPT_MV_STAGE:
        if (value < 0 || value > 65536 || value % 1024)
            return ds4c_err(DS4C_EINVAL, "mv_stage option %d not 0 or a multiple of 1024 up to 65536", value);
        g_opt_mv_stage = value;
        return 0;
    case DS4C_OPT_MV_Q8_NS_EX:
    case DS4C_OPT_MV_Q8_NS_FAST:
    case DS4C_OPT_MV_FEW_NS_EX:
    case DS4C_OPT_MV_FEW_NS_FAST: {
        const auto *o = &k_other[0]; // (the key's entry: every case here has one)
        while (o->key != key) o++;
        bool ok = value >= 0 && value <= 8888;
        for (int v = value; ok && v; v /= 10) ok = v % 10 != 1 && v % 10 != 9;
        if (!ok)
            return ds4c_err(DS4C_EINVAL, "%s option %d: not four decimal digits, each 0 or 2..8", o->name, value);
        *o->value = value;
        return 0;
    }
    case DS4C_OPT_TC_MIN_SEL:
        if (value < 0) return ds4c_err(DS4C_EINVAL, "tc_min_sel option %d negative", value);
        g_opt_tc_min_sel = value;
        return 0;
    }
    return ds4c_err(DS4C_EINVAL, "unknown option %d", key);
}

} // extern "C"
