/*
 * ds4cuda.h: the C ABI of libds4cuda.so, the CUDA kernels of ds4go.
 *
 * The Go package ds4go/backend/cuda loads this library at run time with
 * purego (no cgo), so every function here takes and returns only integers,
 * floats and pointers (no structs by value) and reports failure through an
 * int status: 0 is success; a positive value is a cudaError_t; a negative
 * value is one of the DS4C_E* codes below. ds4c_last_error() returns the
 * message of the last failure on the calling thread.
 *
 * Pointers named d_* are device pointers; h_* are host pointers. Streams and
 * events are opaque handles (cudaStream_t / cudaEvent_t); stream 0 is the
 * legacy default stream.
 *
 * Layouts (docs/cuda.md has the full description):
 *   Weights live on the device in a "device layout" that ds4c_weight_repack
 *   produces from the GGUF bytes of a whole tensor of R rows (R = rows of all
 *   matrices of a 3-D expert tensor together), in chunks of whole blocks:
 *     F32, F16, BF16  GGUF bytes unchanged (row-major).
 *     Q4_K      GGUF bytes unchanged (144-byte blocks are 16-byte aligned).
 *     Q8_0      int8 qs[R*cols], then f16 d[R*cols/32].
 *     Q2_K      qs[NB][64], then scales[NB][16], then {d, dmin} f16[NB][2].
 *     IQ2_XXS   qs[NB][64] (grid indices + sign/scale words), then f16 d[NB].
 *   (NB = R*cols/256.) The size is the GGUF size (ds4c_weight_bytes).
 *
 *   An activation row ("act") for one token of `cols` values, of
 *   ds4c_act_bytes(type, cols) bytes (a multiple of 16):
 *     F32   float x[cols]
 *     Q8_0  int8 q[cols], float d[cols/32]        (d is the f16-rounded scale)
 *     Q8_K  int8 q[cols], float d[cols/256], int16 bsums[cols/16]
 *   quantized bit-exactly like ds4go/quant's Activation.Set (ggml's CPU
 *   quantize_row_q8_0 / quantize_row_q8_K_ref).
 */
#ifndef DS4CUDA_H
#define DS4CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DS4C_ABI_VERSION 45

/* Element types, numbered as ggml/GGUF numbers them. */
enum {
    DS4C_F32 = 0,
    DS4C_F16 = 1,
    DS4C_Q8_0 = 8,
    DS4C_Q2_K = 10,
    DS4C_Q4_K = 12,
    DS4C_Q8_K = 15,
    DS4C_IQ2_XXS = 16,
    DS4C_BF16 = 30,
};

/* Negative status codes (positive ones are cudaError_t values). */
enum {
    DS4C_EINVAL = -1,       /* bad argument */
    DS4C_ETYPE = -2,        /* unsupported type */
    DS4C_ENOINIT = -3,      /* ds4c_init not called */
    DS4C_EBLAS = -4,        /* a cuBLAS call failed */
};

int ds4c_abi_version(void);
const char *ds4c_last_error(void);

/* Device. ds4c_init selects the device for the whole process (every later
 * call, from any thread, uses it). */
int ds4c_device_count(int *n);
int ds4c_init(int device);
/* ints[0..7]: compute capability major, minor, multiprocessor count,
 * L2 bytes, max shared memory per block (opt-in), memory bus width (bits),
 * memory clock (kHz), runtime version. mem[0..1]: free, total bytes. */
int ds4c_device_info(char *name, int name_len, int *ints, uint64_t *mem);
int ds4c_device_synchronize(void);

/* Memory. */
int ds4c_malloc(void **d_ptr, uint64_t bytes);
int ds4c_free(void *d_ptr);
int ds4c_malloc_host(void **h_ptr, uint64_t bytes); /* pinned */
int ds4c_free_host(void *h_ptr);
int ds4c_memcpy_h2d(void *d_dst, const void *h_src, uint64_t bytes); /* synchronous */
int ds4c_memcpy_d2h(void *h_dst, const void *d_src, uint64_t bytes); /* synchronous */
int ds4c_memcpy_h2d_async(void *d_dst, const void *h_src, uint64_t bytes, void *stream);
int ds4c_memcpy_d2h_async(void *h_dst, const void *d_src, uint64_t bytes, void *stream);
int ds4c_memcpy_d2d_async(void *d_dst, const void *d_src, uint64_t bytes, void *stream);
int ds4c_memset_async(void *d_dst, int value, uint64_t bytes, void *stream);

/* Streams and events. */
int ds4c_stream_create(void **stream);
int ds4c_stream_destroy(void *stream);
int ds4c_stream_synchronize(void *stream);
int ds4c_stream_wait_event(void *stream, void *event);
int ds4c_event_create(void **event);
int ds4c_event_destroy(void *event);
int ds4c_event_record(void *event, void *stream);
int ds4c_event_synchronize(void *event);
int ds4c_event_elapsed_ms(float *ms, void *start, void *end);

/* CUDA graphs: capture the work queued on a (non-default) stream between
 * begin and end into an executable graph; replay it with launch. */
int ds4c_graph_begin(void *stream);
int ds4c_graph_end(void *stream, void **exec);
/* End a capture and bring *exec up to date with the captured graph: update
 * it in place when its topology matches (*how = 1), else (or when *exec is
 * null) instantiate a new one (*how = 2), destroying the old. */
int ds4c_graph_end_update(void *stream, void **exec, int *how);
/* End any capture in progress on stream and drop what it recorded. */
int ds4c_graph_abort(void *stream);
int ds4c_graph_launch(void *exec, void *stream);
int ds4c_graph_destroy(void *exec);

/* Graph replay (replay.cu). A recorder logs, while it records, the work
 * queued on its streams (main, side and side2; the side ones may be null) instead of
 * running it; ds4c_rec_launch stops recording and runs the log as the graph
 * *graph: built (capturing the log) when *graph is null or was built from
 * work of another structure, else updated in place where kernel launch
 * configurations or arguments changed. stats[0] = 1 when the graph was
 * built, stats[1] = kernel nodes updated, stats[2] = operations logged.
 * Synchronising a recorded stream is an error. */
int ds4c_rec_create(void *main, void *side, void *side2, void **rec);
int ds4c_rec_destroy(void *rec);
int ds4c_rec_begin(void *rec);
int ds4c_rec_abort(void *rec);
int ds4c_rec_launch(void *rec, void **graph, int *stats);
int ds4c_rgraph_destroy(void *graph);

/* Weights. */
uint64_t ds4c_weight_bytes(int type, int64_t rows, int64_t cols); /* 0: unsupported */
/* Convert n_blocks GGUF blocks (F32/F16: elements) starting at block index
 * first_block of a tensor of total_rows x cols into the device layout at
 * d_dst (the whole tensor's allocation). d_src holds exactly those GGUF
 * bytes, on the device. */
int ds4c_weight_repack(int type, void *d_dst, int64_t total_rows, int64_t cols,
                       const void *d_src, int64_t first_block, int64_t n_blocks, void *stream);

/* Activations. */
int ds4c_act_type(int weight_type); /* the act type a weight type consumes; <0: none */
uint64_t ds4c_act_bytes(int act_type, int64_t cols);
/* Quantize n_tok rows of cols floats (row stride x_stride floats) into
 * act rows (stride ds4c_act_bytes). act_type F32 copies. */
int ds4c_quantize(int act_type, const float *d_x, int64_t x_stride, void *d_act,
                  int64_t cols, int n_tok, void *stream);

/* Matrix products of weights (device layout) with activation rows.
 *
 * ds4c_matmul: y[t*y_stride + r] = W[r] . act_t for r < rows, t < n_tok,
 *   where W is the first matrix of the weight tensor and act_t is at
 *   d_act + t*act_stride bytes (act_stride 0: ds4c_act_bytes).
 *
 * ds4c_matvec_ids: for s < n_sel, with e = d_ids[s] (device int32),
 *   y[s*y_stride + r] = W_e[r] . act_s, act_s at d_act + s*act_stride bytes
 *   (act_stride 0: all selections share one activation row). W_e is matrix e
 *   of a tensor of n_mat matrices of rows x cols.
 */
int ds4c_matmul(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat,
                const void *d_act, int64_t act_stride, int n_tok,
                float *d_y, int64_t y_stride, void *stream);
int ds4c_matvec_ids(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat,
                    const int32_t *d_ids, int n_sel, const void *d_act, int64_t act_stride,
                    float *d_y, int64_t y_stride, void *stream);
/* The general form: for s < n_sel and t < n_tok,
 *   y[s*y_sel + t*y_tok + r] = W_m[r] . act(s, t),
 *   act(s, t) at d_act + (s / act_div)*act_sel + t*act_tok bytes,
 * with m = d_ids[s] when d_ids is given, else m = s when n_sel > 1, else 0.
 * act_tok 0: ds4c_act_bytes; y_tok 0: rows. A matrix index outside
 * [0, n_mat) yields NaN rows.
 * flags: DS4C_MM_EXACT sums each row in the order of ds4go/quant's Dot
 * (block terms in block order; float rows as four running sums over i mod 4,
 * products rounded) so results are bit-identical to the CPU backend's;
 * without it the sums run in parallel (faster, a few ulps different). */
enum {
    DS4C_MM_EXACT = 1,
    /* The kernels queued after the product launch only once everything
     * queued before it is complete (not as soon as it starts), so the next
     * kernel may read the product's inputs before its own wait (ds4c_hc_pre
     * mode bit 2). */
    DS4C_MM_LATE = 2,
    /* ds4c_matmul_grouped only: d_act holds f16 rows (ds4c_to_half's),
     * multiplied by fast mode's wgmma kernels (mm_wg.cu: each weight
     * dequantized to f16 with its scales, f32 sums; not bit-identical to
     * anything). DS4C_ETYPE, nothing queued, unless ds4c_grouped_half_ok. */
    DS4C_MM_HALF = 4,
    /* ds4c_matvec_f32 only: where the pipelined kernel takes the product,
     * one CTA an SM with stages that leave DS4C_MV_ROOM_KIB of each SM's
     * shared memory free, so that kernels queued on other streams run
     * beside it (a scoring decode step's q_b beside the indexer's path);
     * the same results. */
    DS4C_MM_ROOM = 8,
};
#define DS4C_MV_ROOM_KIB 72
int ds4c_matmul_ex(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat,
                   const int32_t *d_ids, int n_sel, const void *d_act, int64_t act_tok,
                   int64_t act_sel, int act_div, int n_tok, float *d_y, int64_t y_tok,
                   int64_t y_sel, int flags, void *stream);

/* Tensor-core products (mm_tc.cu; Q8_0, Q2_K, IQ2_XXS with cols a multiple
 * of 256; results bit-identical to the exact mode). ds4c_matmul_ex uses them
 * by itself for n_tok >= DS4C_OPT_TC_MIN_TOK tokens. For routed experts:
 * ds4c_group sorts n_sel selections by their matrix ids into d_scratch
 * (ds4c_group_bytes(n_sel, n_mat) bytes), then each ds4c_matmul_grouped with
 * the same ids, n_sel, n_mat and scratch computes, like ds4c_matmul_ex with
 * n_tok = 1, y[s*y_sel + r] = W_ids[s][r] . act(s), act(s) at
 * d_act + (s / act_div)*act_sel bytes, reading each matrix once per 32 of
 * its selections. With fewer than DS4C_OPT_TC_MIN_SEL selections or an
 * unsupported type it runs ds4c_matmul_ex instead (scratch unused). */
uint64_t ds4c_group_bytes(int n_sel, int64_t n_mat);
int ds4c_group(const int32_t *d_ids, int n_sel, int64_t n_mat, void *d_scratch, void *stream);
int ds4c_matmul_grouped(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, const int32_t *d_ids,
                        int n_sel, const void *d_act, int64_t act_sel, int act_div, float *d_y, int64_t y_sel,
                        const void *d_scratch, int flags, void *stream);
/* ds4c_matmul_q8out: ds4c_matmul_ex of n_tok tokens (1 to 4; activation
 * rows act_tok bytes apart) without ids (n_sel selections, selection s
 * through matrix s when n_sel > 1, its activation at d_act + (s /
 * act_div)*act_sel bytes) with token t's y[t*n_sel*rows + s*rows + r] (rows
 * a multiple of 32), that also writes d_yq, each token's Q8_0 activation of
 * its row of n_sel*rows values (ds4c_quantize's bytes, ds4c_act_bytes(
 * DS4C_Q8_0, n_sel*rows) of them a token, token t's that many bytes after
 * token 0's): the next product's input (a decode step's or a verification
 * pass's wo_a for wo_b). Where the pipelined kernel takes a Q8_0 product
 * (k_mv_pipe_q8f, either mode; two to four tokens where it takes them) each of its
 * CTAs multiplies one block of 32 rows and quantizes that block itself:
 * one launch, no float row read back; else ds4c_matmul_ex, then
 * ds4c_quantize. The same bits either way. */
int ds4c_matmul_q8out(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, int n_sel, const void *d_act,
                      int64_t act_tok, int64_t act_sel, int act_div, int n_tok, float *d_y, void *d_yq, int flags,
                      void *stream);
/* ds4c_matvec_f32: n tokens' (1 to 4) products y = W . act(x) of a
 * single Q8_0 or F16 matrix W (rows x cols, cols a multiple of 32) with the
 * float rows d_x (cols apart; y's rows apart, d_xn's and d_act's rows
 * likewise; two to four tokens: Q8_0's pipelined kernel, else the
 * separate steps). F16: act(x) is RMSNorm(x) with weights d_nw and eps when d_nw is
 * set (ds4c_rmsnorm_ref's operations), else x, and d_act is unused; in
 * fast mode with d_nw set k_mv_f16_norm takes it in one launch
 * (DS4C_OPT_MV_F32 bit 2), in exact mode k_fexact_warp staging the row
 * after its norm (bit 4; at most 4096 columns), else ds4c_rmsnorm_ref into
 * d_xn and ds4c_matmul_ex. Q8_0:
 * act(x) is the Q8_0 activation (as ds4c_quantize writes it) of
 * RMSNorm(x) with weights d_nw and eps (ds4c_rmsnorm_ref's operations)
 * when d_nw is set, else of x. Where the pipelined kernel takes the
 * product (DS4C_OPT_MV_PIPE, DS4C_OPT_MV_PIPE_MIN) and DS4C_OPT_MV_F32 is
 * on, its CTAs form act(x) themselves after their wait: one launch;
 * otherwise ds4c_rmsnorm_ref into d_xn (cols floats; unused without d_nw),
 * ds4c_quantize into d_act (ds4c_act_bytes(DS4C_Q8_0, cols) bytes) and
 * ds4c_matmul_ex with flags. The same bits either way; d_x is not
 * written. */
int ds4c_matvec_f32(int type, const void *d_w, int64_t rows, int64_t cols, const float *d_x, const float *d_nw,
                    float eps, float *d_xn, void *d_act, float *d_y, int flags, int n, void *stream);
/* ds4c_matmul_grouped_pair: ds4c_matmul_grouped through two tensors of the
 * same type and shape (a routed gate and up) with the same ids, activations
 * and scratch, outputs at d_y1 and d_y2: where each would run as a single
 * token's product that k_mv_dec takes (IQ2_XXS, Q2_K; DS4C_OPT_MV_DEC), in
 * one launch; one selection of one Q8_0 or Q4_K matrix (a shared expert's
 * gate and up; DS4C_OPT_MV_PAIR) too, as one k_matvec grid; otherwise as
 * the two calls. Same results either way. */
int ds4c_matmul_grouped_pair(int type, const void *d_w1, const void *d_w2, int64_t rows, int64_t cols, int64_t n_mat,
                             const int32_t *d_ids, int n_sel, const void *d_act, int64_t act_sel, int act_div,
                             float *d_y1, float *d_y2, int64_t y_sel, const void *d_scratch, int flags, void *stream);
/* ds4c_matmul_grouped_swiglu: ds4c_matmul_grouped (act_div 1) of the Q8_K
 * activation rows of SwiGLU(g, u) (n_sel rows of cols floats each at d_g
 * and d_u, cols a multiple of 256; ds4c_swiglu_q8k's values with lim and
 * the selections' weights d_wts, its fast form unless flags has
 * DS4C_MM_EXACT): a routed down product after its gate and up. Where the
 * product runs as one single-token k_mv_dec launch (IQ2_XXS, Q2_K;
 * DS4C_OPT_MV_DEC) its CTAs form the activation rows they read
 * themselves, in shared memory: one launch, d_act unused; otherwise
 * ds4c_swiglu_q8k into d_act (ds4c_act_bytes(DS4C_Q8_K, cols) bytes a row,
 * 16-byte aligned) and ds4c_matmul_grouped. The same bits either way. */
int ds4c_matmul_grouped_swiglu(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat,
                               const int32_t *d_ids, int n_sel, const float *d_g, const float *d_u, float lim,
                               const float *d_wts, void *d_act, float *d_y, int64_t y_sel, const void *d_scratch,
                               int flags, void *stream);
/* ds4c_grouped_half_ok: nonzero when ds4c_matmul_grouped takes f16
 * activations (DS4C_MM_HALF) for weights of type with rows of cols values
 * and n_sel selections: DS4C_OPT_WG_MOE on and offering the type (value
 * 3 declines Q2_K), a compute capability 9.0 device, IQ2_XXS or
 * Q2_K, cols a multiple of 256, at least DS4C_OPT_TC_MIN_SEL selections (so
 * that ds4c_group built the tile table). 1: the rows as ds4c_to_half writes
 * them; 2: permuted within each 32-value block (ds4c_to_half_ex with
 * DS4C_HALF_PERM32). 0: not taken. */
int ds4c_grouped_half_ok(int type, int64_t cols, int n_sel);
/* ds4c_matmul_grouped_glu: the routed experts' gate and up products of the
 * same selections in one launch (RS-form wgmma: each CTA takes 128 rows of
 * both, d_act permuted f16 rows as ds4c_grouped_half_ok 2 reads them) with
 * SwiGLU in its epilogue: d_yh[i][r] = f16(swiglu(gate_i[r], up_i[r]) ·
 * d_wts[i]) — ds4c_swiglu_half's values of the two products' float outputs,
 * the same bits — in rows of `rows` values, permuted within each 32-value
 * block when out_perm (the down product's input). ds4c_grouped_glu_ok: 1
 * when DS4C_OPT_WG_GLU is on, DS4C_OPT_WG_MOE is 5 or 7, rows is a multiple of
 * 128 and ds4c_grouped_half_ok(type, cols, n_sel) is 2; else 0, and
 * ds4c_matmul_grouped_glu returns DS4C_ETYPE with nothing queued. */
int ds4c_grouped_glu_ok(int type, int64_t rows, int64_t cols, int n_sel);
int ds4c_matmul_grouped_glu(int type, const void *d_gate, const void *d_up, int64_t rows, int64_t cols,
                            int64_t n_mat, const int32_t *d_ids, int n_sel, const void *d_act, int64_t act_sel,
                            int act_div, const float *d_wts, float lim, void *d_yh, int out_perm,
                            const void *d_scratch, void *stream);

/* Fast mode's hyper-connection mixing logits of chunks (hc_mix.cu):
 * d_mix[t][m] = (fn_m . h_t) * rsqrt(mean(h_t^2) + eps) for t < n, m < M,
 * h_t the K floats at d_h + t*K (16-byte aligned), fn (F32 or F16, rows of
 * K) at d_fn; f32 products as three TF32 terms, sums in any order (not
 * bit-identical to anything). ds4c_hc_mixes_ok: 1 when DS4C_OPT_HC_MIX is on,
 * the type F32 or F16, 0 < M <= 32, K a multiple of 256 and n >= 8; else
 * ds4c_hc_mixes returns DS4C_ETYPE with nothing queued. */
int ds4c_hc_mixes_ok(int type, int M, int64_t K, int n);
int ds4c_hc_mixes(int type, const void *d_fn, int M, int64_t K, const float *d_h, int n, float eps, float *d_mix,
                  void *stream);

/* Fast mode's products of chunks through cuBLAS (mm_half.cu): the GEMM
 * cuBLAS picks, f32 sums. Not bit-identical to anything, fast mode only:
 * with f16 inputs (x_type DS4C_F16) the activations are the unquantized
 * floats rounded to f16 (not Q8_0) and a Q8_0 weight q*d is rounded to f16
 * once; with float inputs (x_type DS4C_F32, F16 weights) both operands go
 * to the TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32: float range, f16's
 * precision).
 * ds4c_half_ok: 1 when ds4c_matmul_half takes weights of type with inputs
 * of x_type for n_tok tokens (DS4C_OPT_HALF_MM, DS4C_OPT_HALF_MIN, cuBLAS
 * found), else 0.
 * ds4c_to_half: n_tok rows of cols floats at d_x (x_stride floats apart) as
 * f16 rows at d_xh (cols apart); magnitudes beyond f16's largest finite
 * value (65504) saturate there, infinities and NaNs stay.
 * ds4c_matmul_half: for s < n_sel and t < n_tok,
 *   y[s*y_sel + t*y_tok + r] = W_s[r] . x(s, t),
 * x(s, t) the row of x_type at d_xh + s*xh_sel + t*xh_tok (in elements),
 * W_s matrix s of n_mat (n_sel 1 or n_mat). Q8_0 weights (f16 inputs) are
 * converted to f16, F16 weights with float inputs to float, in
 * stream-ordered scratch first. DS4C_ETYPE, with nothing queued, when the
 * product does not qualify (types or option; the stream being recorded or
 * captured). */
int ds4c_half_ok(int type, int x_type, int n_tok);
/* ds4c_half_warm: loads cuBLAS and initialises it (a handle, one small
 * GEMM, synchronised) ahead of the first product; 1 when cuBLAS is there. */
int ds4c_half_warm(void);
int ds4c_to_half(const float *d_x, int64_t x_stride, int64_t cols, int n_tok, void *d_xh, void *stream);
/* ds4c_to_half_ex is ds4c_to_half with flags: DS4C_HALF_PERM32 (cols a
 * multiple of 32, x_stride even, d_x 8-byte and d_xh 16-byte aligned)
 * permutes each 32-value block of a row so that position 16s + 8h + 2q + e
 * (s, h, e < 2, q < 4) holds value 8q + 4s + 2h + e — the order the RS form
 * of the wgmma expert products reads (its A fragments then hold 8
 * consecutive weights a thread; the dot product is the same). */
enum { DS4C_HALF_PERM32 = 1 };
int ds4c_to_half_ex(const float *d_x, int64_t x_stride, int64_t cols, int n_tok, void *d_xh, int flags, void *stream);
int ds4c_matmul_half(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, int n_sel,
                     const void *d_xh, int x_type, int64_t xh_tok, int64_t xh_sel, int n_tok, float *d_y,
                     int64_t y_tok, int64_t y_sel, void *stream);
/* ds4c_matmul_half_h: ds4c_matmul_half with f16 inputs and f16 outputs at
 * d_yh (strides in halves): the f32 sums rounded to nearest by cuBLAS (no
 * saturation: a magnitude beyond 65504 becomes infinite). */
int ds4c_matmul_half_h(int type, const void *d_w, int64_t rows, int64_t cols, int64_t n_mat, int n_sel,
                       const void *d_xh, int x_type, int64_t xh_tok, int64_t xh_sel, int n_tok, void *d_yh,
                       int64_t y_tok, int64_t y_sel, void *stream);

/* ds4c_q8_0_to_half: the f16 values of a device Q8_0 tensor of rows rows
 * (all its matrices) of cols values (a multiple of 32), q·d rounded to
 * nearest as ds4c_matmul_half converts them before each product, into
 * d_out [rows][cols] (16-byte aligned): a copy that ds4c_matmul_half takes
 * as F16 weights, with the same products' bits. */
int ds4c_q8_0_to_half(const void *d_w, int64_t rows, int64_t cols, void *d_out, void *stream);

/* Elementwise and row operations (float32). */
/* y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w (w may be NULL: no weight). */
int ds4c_rmsnorm(const float *d_x, const float *d_w, float *d_y, int64_t n, int rows,
                 float eps, void *stream);
/* Row-wise softmax over n values, in place allowed. */
int ds4c_softmax(const float *d_x, float *d_y, int64_t n, int rows, void *stream);
/* y = silu(min(g, clamp)) * clamp_range(u, -clamp, clamp); clamp <= 0: no clamp. */
int ds4c_swiglu(const float *d_g, const float *d_u, float *d_y, int64_t n, float clamp,
                void *stream);

/* Model operations (model.cu), float32, mirroring backend/cpu operation by
 * operation (see model.cu for each one's definition). Row-major buffers;
 * strides are in elements. */
int ds4c_get_rows(int type, const void *d_w, int64_t total_rows, int64_t cols, const int32_t *d_ids,
                  int n, float *d_dst, int64_t dst_stride, int copies, int64_t copy_stride,
                  void *stream);
/* The greedy choice over n logits: *d_out = the id of the largest (the
 * lowest id on ties; −0 equals +0; NaN never, unless every value is NaN:
 * then 0), as engine.Greedy picks it. d_work: DS4C_ARGMAX_WORK bytes,
 * 8-byte aligned, zero before the first call; each call leaves it zero. */
#define DS4C_ARGMAX_WORK 16
int ds4c_argmax(const float *d_x, int64_t n, void *d_work, int32_t *d_out, void *stream);
/* min-p's candidates of a sampled step's n logits (engine.Candidates): the
 * greedy choice top (ds4c_argmax into *d_top, with its work area d_work),
 * then every id whose logit is at least a threshold a margin below
 * top's logit + temp·ln(min_p) − 1e-3 — a superset of engine.Sampler's
 * min-p prefilter — and top, in id order. d_out: [0] their count (all of
 * them, even past cap), [1] top, [2] top's logit (float bits), [3] 0, then
 * cap ids, then cap logits (4 + 2·cap words). d_counts: DS4C_CAND_CTAS
 * words of work. temp > 0, min_p > 0. */
#define DS4C_CAND_CTAS 1024
int ds4c_pick_candidates(const float *d_x, int64_t n, float temp, float min_p, void *d_work, int32_t *d_top,
                         int32_t *d_counts, int32_t *d_out, int cap, void *stream);
/* A token the host gives a queued step (engine.PickPipeliner): one thread
 * waits until the 8-byte word at h_word (pinned host memory, 8-byte
 * aligned) holds seq in its high half, then writes its low half to *d_out.
 * The host publishes a token by storing (seq << 32 | token) in one write.
 * After timeout_ns of waiting it gives up: *d_out = 0 (a token in range, so
 * that the step runs as any step does; the host discards its work) and seq
 * is stored in the 4-byte word at h_flag (pinned host memory), which the
 * host checks. */
int ds4c_wait_token(const void *h_word, void *h_flag, uint32_t seq, int64_t timeout_ns, int32_t *d_out,
                    void *stream);
int ds4c_rmsnorm_ref(const float *d_x, int64_t x_stride, const float *d_w, float *d_y,
                     int64_t y_stride, int64_t n, int rows, float eps, void *stream);
/* mode: bit 0 the head's variant, bit 1 d_mix holds raw products fn·flat(h),
 * bit 2 (with bit 1) d_h is complete when the kernel launches (d_mix came
 * from a DS4C_MM_LATE product queued right before): its sum of squares is
 * taken before waiting for that product; bit 3: d_xq (if any) receives x
 * rounded to f16 (rows of D, as ds4c_to_half) instead of its Q8_0
 * activation; bits 16 and up (with bit 1): P > 0, d_mix holds
 * ds4c_hc_post_mix's P parts [P][M + 1] (a token's, up to 4 tokens),
 * which it adds in order (the logits and the streams' sum of squares)
 * instead of reading M raw logits; with bit 4 too, P is DS4C_HC_EX_PARTS
 * and d_mix holds ds4c_hc_post_mix_ex's running sums and squares, whose
 * tree it completes in quant's float-weight order. */
int ds4c_hc_pre(int mode, const float *d_mix, int M, const float *d_scale, const float *d_base,
                int hc, int iters, float hc_eps, const float *d_h, int64_t D,
                const float *d_normw, float norm_eps, float *d_x, float *d_post, float *d_comb,
                void *d_xq, int n, void *stream);
int ds4c_hc_post(float *d_h, const float *d_out, const float *d_post, const float *d_comb, int hc,
                 int64_t D, int n, void *stream);
/* ds4c_hc_post of n tokens (1 … 4; hc 4) that also forms the next
 * ds4c_hc_pre's M (at most 24) raw mixing logits fn·flat(h) in parts: part
 * p of token t's d_part[t][parts][M + 1] sums the products over d in
 * [p·D/parts, (p+1)·D/parts) and, at index M, the new streams' squares
 * there (D/parts a multiple of 32, at most 128). fn_type: DS4C_F16,
 * DS4C_BF16 or DS4C_F32, [M][4·D]. Float sums in another order than the
 * product kernels' (fast mode). */
int ds4c_hc_post_mix(float *d_h, const float *d_out, const float *d_post, const float *d_comb, int hc,
                     int64_t D, int fn_type, const void *d_fn, int M, int parts, float *d_part, int n,
                     void *stream);
/* ds4c_hc_post_mix whose sub-block output is each token's MoE sum, formed
 * in the kernel as ds4c_moe_combine forms it (the same bits): token t's K
 * routed outputs d_ye [n][K][D] added in ascending expert id of d_sel
 * [n][K], then d_ysh [n][D] (null: none). n tokens as ds4c_hc_post_mix. */
int ds4c_hc_post_mix_moe(float *d_h, const float *d_ye, const int32_t *d_sel, const float *d_ysh, int K,
                         const float *d_post, const float *d_comb, int hc, int64_t D, int fn_type,
                         const void *d_fn, int M, int parts, float *d_part, int n, void *stream);
/* ds4c_hc_post_mix for exact mode (hc 4, D == DS4C_HC_EX_D): the next
 * ds4c_hc_pre's M (at most 24) mixing products fn·flat(h) in quant's
 * float-weight order, as its 256 running sums: token t's d_part holds
 * [M][256] floats, then DS4C_HC_EX_PARTS doubles (8-byte aligned), partial
 * sums of the new streams' squares; token t + 1's follow (stride M·256 +
 * 2·DS4C_HC_EX_PARTS floats). ds4c_hc_pre (mode bit 4) completes the sums'
 * tree: the same logits as the exact product kernels. The sub-block output
 * is d_out [n][D], or (d_out null) each token's MoE sum of d_ye, d_sel,
 * d_ysh as ds4c_hc_post_mix_moe forms it. n tokens: 1 … 4. */
#define DS4C_HC_EX_D 4096
#define DS4C_HC_EX_PARTS 128
int ds4c_hc_post_mix_ex(float *d_h, const float *d_out, const float *d_ye, const int32_t *d_sel,
                        const float *d_ysh, int K, const float *d_post, const float *d_comb, int hc,
                        int64_t D, int fn_type, const void *d_fn, int M, float *d_part, int n,
                        void *stream);
int ds4c_rope(float *d_x, int64_t tok_stride, int heads, int64_t head_stride, int64_t off,
              const float *d_freqs, int rd, int64_t pos0, int64_t pos_step, int n_tok,
              int inverse, void *stream);
int ds4c_fp8_sim(float *d_x, int64_t stride, int rows, int64_t n, void *stream);
/* rmsnorm (weight d_w, or none), rope from off (position pos0 + t) and the
 * FP8 rounding of the first fp8_n values of every row x[t][h][0:hd] in
 * place; heads contiguous (tok_stride = heads·head_stride); fp8_n > 0 only
 * for one head. As ds4c_rmsnorm_ref, ds4c_rope and ds4c_fp8_sim in turn. */
int ds4c_norm_rope(float *d_x, int64_t tok_stride, int heads, int64_t head_stride, int hd, const float *d_w,
                   float eps, int64_t off, const float *d_freqs, int rd, int64_t pos0, int fp8_n, int n_tok,
                   void *stream);
/* ds4c_norm_rope_pair: ds4c_norm_rope of two tensors that share hd, eps,
 * off and the rotation (rows of hd values, heads1 and heads2 a token, each
 * with its weights and FP8 count): for fewer than 8 tokens in one launch
 * (the query heads and the KV row of a decode step), else as two calls.
 * The same bits either way. d_cs (else NULL): the rotation's table of the
 * n_tok positions from pos0 (ds4c_rope_table of d_freqs), read instead of
 * computed — the same values. d_ring (else NULL): x2's normed rows are also
 * written into that ring of ring_cap slots of heads2·hd floats, token t's
 * into slot (pos0 + t) mod ring_cap, as ds4c_ring_write would (the KV rows
 * of a decode step or a speculative pass into the window ring). */
int ds4c_norm_rope_pair(float *d_x1, int heads1, const float *d_w1, int fp8_n1, float *d_x2, int heads2,
                        const float *d_w2, int fp8_n2, int hd, float eps, int64_t off, const float *d_freqs, int rd,
                        int64_t pos0, int n_tok, const float *d_cs, float *d_ring, int64_t ring_cap,
                        void *stream);
/* ds4c_rope_table writes the rotation's (cosine, sine) of each of the rd/2
 * pairs at positions pos … pos + n − 1 into d_cs (n·rd floats: cos, sin of
 * pair 0 of position pos, …; position pos + t from float t·rd): the values
 * ds4c_rope, ds4c_norm_rope and the attention's inverse rotation compute
 * per pair (float64 trigonometry of the float angle, each rounded to
 * float), for the calls that take a table (a decode step's, a pass's). */
int ds4c_rope_table(const float *d_freqs, int rd, int64_t pos, int n, float *d_cs, void *stream);
/* ds4c_norm_rope_half: ds4c_norm_rope's rows (chunk form: hd a multiple of
 * 128 up to 1024, off even, 16-byte aligned rows, heads·head_stride apart)
 * written as f16 rows (half_sat, then round to nearest) of hd values at
 * d_xh instead of in place; d_x is left as it was. */
int ds4c_norm_rope_half(const float *d_x, int64_t tok_stride, int heads, int64_t head_stride, int hd,
                        const float *d_w, float eps, int64_t off, const float *d_freqs, int rd,
                        int64_t pos0, int fp8_n, int n_tok, void *d_xh, void *stream);
int ds4c_fp4_sim(float *d_x, int64_t stride, int rows, int64_t n, void *stream);
int ds4c_hadamard(float *d_x, int64_t stride, int rows, int n, float scale, void *stream);
/* ds4c_hadamard_fp4: ds4c_hadamard then ds4c_fp4_sim on the same rows (n a
 * multiple of 32), in one kernel where n is 32 … 512 (the same bits). */
int ds4c_hadamard_fp4(float *d_x, int64_t stride, int rows, int n, float scale, void *stream);
int ds4c_scale(float *d_x, int64_t n, float s, void *stream);
/* ds4c_index_query readies the indexer's queries d_q [n_tok][heads][hd]
 * and head weights d_w [n_tok][heads] for the scores: ds4c_rope of each
 * row's last rd dims at position pos0 + t, ds4c_hadamard_fp4 of each row
 * with had_scale, ds4c_scale of d_w by w_scale; one launch (a warp a row)
 * for hd 64 … 512 (DS4C_OPT_IX_QUERY), else the three calls. The same bits
 * either way. */
int ds4c_index_query(float *d_q, float *d_w, int heads, int hd, int rd, const float *d_freqs, int64_t pos0, int n_tok,
                     float had_scale, float w_scale, void *stream);
int ds4c_add_ape(float *d_dst, const float *d_ape, int64_t width, int r, int64_t pos0, int n,
                 void *stream);
int ds4c_ring_write(float *d_ring, int64_t cap, int64_t width, const float *d_src,
                    int64_t src_stride, int64_t pos0, int n, void *stream);
/* Two rings of the same shape at once: ring_a from src_a, ring_b from src_b. */
int ds4c_ring_write2(float *d_ring_a, float *d_ring_b, int64_t cap, int64_t width, const float *d_src_a,
                     const float *d_src_b, int64_t src_stride, int64_t pos0, int n, void *stream);
int ds4c_comp_pool(const float *d_kv, const float *d_sc, const float *d_kv_ring,
                   const float *d_sc_ring, int64_t cap, int64_t cw, int64_t pos0, int r, int coff,
                   int64_t w, int64_t i0, int nrows, float *d_rows, void *stream);
/* ds4c_comp_emit: a compressor's step after its entries' APE bias: the
 * rows i0 … i0+nrows−1 that complete (nrows may be 0) pooled as
 * ds4c_comp_pool (into d_rows, w floats apart), RMS-normalised with d_norm
 * (ds4c_rmsnorm_ref), their last rd values rotated at position i·r
 * (ds4c_rope), then post 1: the first fp8_n values through FP8
 * (ds4c_fp8_sim), post 2: ds4c_hadamard_fp4 of the w values with
 * had_scale, post 0: nothing; then the chunk's n entries (d_kv, d_sc: cw =
 * coff·w floats apart) written into the frontier rings (ds4c_ring_write).
 * With DS4C_OPT_COMP_EMIT one row, equal capacities, w ≤ 1024 and (post 2)
 * w = 128 take one launch (k_comp_emit); else those entry points' kernels.
 * The same bits either way. */
int ds4c_comp_emit(const float *d_kv, const float *d_sc, float *d_kv_ring, float *d_sc_ring, int64_t kv_cap,
                   int64_t sc_cap, int64_t cw, int64_t pos0, int n, int r, int coff, int64_t w, int64_t i0, int nrows,
                   float *d_rows, const float *d_norm, float eps, const float *d_freqs, int rd, int post, int fp8_n,
                   float had_scale, void *stream);
/* flags of ds4c_index_scores and ds4c_attention: DS4C_FAST lets them take
 * the fast-mode kernels — for chunks (8 or more tokens) dots and weighted
 * sums on the tensor cores (TF32 mma, each operand split into two TF32
 * terms: ≈ 2^-21 of Σ|a·b| from the exact order); for chunks and single
 * tokens float exponentials, softmax denominators as lane sums and a
 * shuffle tree, fused multiply-adds in the weighted sums. Without it every
 * operation rounds as backend/cpu's. */
enum { DS4C_FAST = 1 };
/* ds4c_attention's flags for fast chunks through the flash kernel only
 * (ds4c_attention_half_ok): DS4C_ATTN_QH, d_q holds f16 rows (as
 * ds4c_norm_rope_half writes them); DS4C_ATTN_QN, d_q holds the query rows
 * before their norm and rotation (floats), which the kernel applies as
 * ds4c_norm_rope_half would (no weight, q_eps, the rotation of d_rfreqs at
 * each token's position); both, d_q holds those rows before their norm as
 * f16 (the same operations on their float values); DS4C_ATTN_OH, d_out
 * receives f16 rows, the inverse rotation applied (d_qact must be NULL):
 * the values that the float output rotated (ds4c_rope) and rounded
 * (ds4c_to_half) would give. */
enum { DS4C_ATTN_QH = 2, DS4C_ATTN_OH = 4, DS4C_ATTN_QN = 8 };
/* When ds4c_attention takes f16 queries and output for these arguments
 * (fast chunks of the flash kernel's shape, rotated dims roff … roff+rd
 * with roff even and rd ≤ 128), the form option attn_half picks: 1
 * DS4C_ATTN_QH with DS4C_ATTN_OH, 2 DS4C_ATTN_QN with DS4C_ATTN_OH, 3
 * DS4C_ATTN_QH and DS4C_ATTN_QN with DS4C_ATTN_OH; else 0. */
int ds4c_attention_half_ok(int n, int H, int HD, int rd, int roff, int flags);
int ds4c_index_scores(const float *d_q, const float *d_w, const float *d_rows, int IH, int IHD,
                      int64_t pos0, int ratio, int n, float *d_scores, int64_t sc_stride,
                      int flags, void *stream);
/* Top-k of each token's scores: the min(K, R) best (ties: lower index)
 * into d_sel [n][K], best first, and their count into d_nsel [n] (may be
 * NULL); R is R_fixed, or (pos0+t+1)/ratio. all_if_few holds flags:
 * DS4C_TOPK_ALL, with R ≤ K all rows in order; DS4C_TOPK_ROWS, the same
 * picks in row order (ascending index; the radix kernels then skip their
 * sort; past 1024 picks the ranking kernel's are put in row order after
 * it, K at most 12288 there), the order the CPU backend's
 * indexer gives and the attention adds its picked rows in. */
enum { DS4C_TOPK_ALL = 1, DS4C_TOPK_ROWS = 2 };
int ds4c_topk(const float *d_scores, int64_t stride, int64_t R_fixed, int64_t pos0, int ratio,
              int K, int all_if_few, int32_t *d_sel, int32_t *d_nsel, int n, void *stream);
/* Sparse attention with sinks of n query tokens into d_out [n][H][HD]. With
 * d_rfreqs, the output's dims roff..roff+rd are rotated back afterwards
 * (inverse RoPE in pairs at each token's position, as ds4c_rope would); with
 * d_qact, the output's Q8_0 activation is formed too, as ds4c_quantize
 * would from the flat output in rows of q_seg values. Single tokens do
 * both inside the output kernel. d_work holds ds4c_attention_work(n, H, HD,
 * max_keys, flags) floats (NULL when that is 0). d_rcs (else NULL): the
 * inverse rotation's table of the n positions from pos0 (ds4c_rope_table
 * of d_rfreqs), read instead of computed — the same values. */
int ds4c_attention(const float *d_q, const float *d_kv, const float *d_win, int64_t wcap,
                   const float *d_comp, int ratio, const int32_t *d_sel, const int32_t *d_nsel,
                   int K, const float *d_sinks, float *d_out, int64_t pos0, int n, int H, int HD,
                   int W, float scale, int64_t max_keys, float *d_work, const float *d_rfreqs, int rd,
                   int roff, void *d_qact, int64_t q_seg, float q_eps, const float *d_rcs, int flags,
                   void *stream);
/* The floats of ds4c_attention's work buffer for these arguments under the
 * current options (0: none; fast chunks of Flash's shape, whose one kernel
 * keeps its scores on chip): the scores [n][H][max_keys], or for fewer than
 * 8 tokens in fast mode the split form's partial sums when larger, and in
 * exact mode's segmented order (DS4C_OPT_ATTN_ORDER) the segments' side rows
 * or partial sums after the scores. */
int64_t ds4c_attention_work(int n, int H, int HD, int64_t max_keys, int flags);
/* ds4c_router: each token's K experts (d_sel [n][K]) and weights (d_w)
 * from its E router logits: s = sqrt(softplus(logit)); the experts from
 * d_tid2eid[token] (hash layers) or the top K of s + d_bias; the weights
 * s[e], normalised to sum 1 when norm, times wscale. d_x not null: the
 * token's input rows d_x [n][cols] (cols a multiple of 256, 16-byte
 * aligned) are also quantized to Q8_K activation rows d_act (act_stride
 * bytes apart) by the CTA's other warps, as ds4c_quantize forms them (the
 * same bytes), so that the routed products need no launch of their own
 * for it. */
int ds4c_router(const float *d_logits, int E, const float *d_bias, const int32_t *d_tid2eid,
                const int32_t *d_tokens, int K, int norm, float wscale, int32_t *d_sel,
                float *d_w, int n, const float *d_x, int64_t cols, void *d_act, int64_t act_stride,
                void *stream);
int ds4c_swiglu_ref(const float *d_g, const float *d_u, float *d_y, int64_t n, int rows, float lim,
                    const float *d_w, void *stream);
/* ds4c_swiglu_q8k: ds4c_swiglu_ref's rows quantized straight into Q8_K
 * activation rows act_stride bytes apart (the bytes ds4c_swiglu_ref and
 * ds4c_quantize would write); n a multiple of 256, d_g and d_u 16-byte,
 * d_act and act_stride 8-byte aligned. flags DS4C_SWIGLU_FAST: fast mode's
 * values instead (silu in float with the fast exponential, as
 * ds4c_swiglu_half's, then the row's weight), within a few float ulps. */
#define DS4C_SWIGLU_FAST 1
int ds4c_swiglu_q8k(const float *d_g, const float *d_u, void *d_act, int64_t act_stride, int64_t n, int rows, float lim,
                    const float *d_w, int flags, void *stream);
/* ds4c_swiglu_half: ds4c_swiglu_ref's values (fast mode: silu in float
 * with the fast exponential, within a few float ulps) rounded to f16 (as
 * ds4c_to_half) into rows of n at d_yh, permuted as ds4c_to_half_ex's when
 * flags has DS4C_HALF_PERM32 (n a multiple of 32; d_g, d_u 8-byte and d_yh
 * 16-byte aligned): the f16 input of the down product, in one pass. */
int ds4c_swiglu_half(const float *d_g, const float *d_u, void *d_yh, int64_t n, int rows, float lim,
                     const float *d_w, int flags, void *stream);
int ds4c_moe_combine(const float *d_ye, const int32_t *d_sel, const float *d_ysh, float *d_y,
                     int n, int K, int64_t D, void *stream);

/* Start (on != 0) or stop the profiler's collection (cudaProfilerStart/Stop;
 * for ncu --profile-from-start off). */
int ds4c_profiler(int on);

/* Read bytes (a multiple of 16) at d_src as fast as possible (a bandwidth
 * ceiling for benchmarks); d_out needs 4 * (4 * multiprocessors) bytes. */
int ds4c_bench_read(const void *d_src, uint64_t bytes, int *d_out, void *stream);

/* A persistent chain of dependent single-token Q8_0 products, op i's
 * activation op i-1's yq (a measurement of the persistent decode kernel's
 * premise, cuda/NOTES.md v44; nothing in the model calls it): one
 * cooperative launch, one CTA a multiprocessor, each owning whole blocks of
 * 32 rows of every op; a producer warp streams every op's weights through
 * `stages` shared-memory stages (2..16, as many as fit) without waiting for
 * the activations. Op i computes y = W x for its Q8_0 activation act
 * (ds4c_act_bytes(Q8_0, cols) bytes) into y and yq (y's Q8_0 activation of
 * `rows` values): the bits of ds4c_matmul_q8out in fast mode, whatever the
 * flags. rows: whole blocks of 32; cols 1024, 2048, 4096 or 8192 and op
 * i-1's rows; at most 24 ops. d_count holds ten unsigned counters an op
 * (zeroed here first), then (from word (10 n_ops + 1) & ~1) 64 bytes a
 * multiprocessor, then 8 (rows/4 + rows/32) bytes an op.
 * flags (the forms of cuda/NOTES.md v44):
 *   1     the producer waits for op i-1's last block before op i's first
 *         stage, as a kernel boundary would;
 *   2     16 consumer warps (else 8);
 *   4     a warp's items formed 2 (16 warps) or 4 (8 warps) at once;
 *   8     (timing only, wrong results) no arithmetic;
 *   16    a warp waits only for the 1024 rows of op i-1 its segment reads;
 *   32    (timing only, wrong results) no waits at all;
 *   64    the counters (flagged words) polled with a sleep;
 *   128   clock64 sums, 8 uint64 a CTA, after the counters;
 *   >> 8 & 3   a block published after __threadfence (0),
 *         fence.acq_rel.gpu (1), by a release reduction (2), or as flagged
 *         8-byte words read without counters (3: not with 1 or steps);
 *   >> 10 & 3  stages of 32768 >> that weights (8192 at least);
 *   4096  CTA 0 owns no blocks;
 *   8192  a CTA requests op i's weights only after publishing its last
 *         block of op i-1;
 *   >> 14 a step of that many µs between two ops (one thread spins once op
 *         i-1 is complete; op i waits for it), a latency-bound stand-in. */
typedef struct {
    const void *w;   /* Q8_0 matrix in the device layout */
    const void *act; /* its Q8_0 activation row (16-byte aligned) */
    float *y;        /* rows floats */
    void *yq;        /* ds4c_act_bytes(Q8_0, rows) bytes */
    int64_t rows, cols;
} ds4c_chain_op;
int ds4c_chain_q8(const ds4c_chain_op *h_ops, int n_ops, unsigned *d_count, int stages, int flags, void *stream);

/* Tuning knobs for experiments (key, value); unknown keys fail. */
int ds4c_set_option(int key, int value);
/* The same by the option's environment variable (DS4_CUDA_ and its name in
 * upper case, as read at load): "NAME=VALUE" sets it (unknown names, values
 * that are not whole numbers and values the option refuses fail), and
 * ds4c_get_option_env reads its value now. For switching options inside one
 * process (ds4-bench --ab); an option takes effect where the library reads
 * it, which for most is each launch. */
int ds4c_set_option_env(const char *assign);
int ds4c_get_option_env(const char *name, int *value);
enum {
    DS4C_OPT_WLOAD = 1,   /* weight loads: 0 __ldg, 1 ld.nc.L1::no_allocate.L2::256B (default), 2 __ldcs */
    DS4C_OPT_SPLITK = 2,  /* 0: automatic; 1, 2, 4, 8: warps per row (single token) */
    DS4C_OPT_RPW = 3,     /* 0: automatic; 1, 2, 4, 8: rows per warp (single token) */
    DS4C_OPT_TC_MIN_TOK = 4, /* tokens from which dense products use tensor cores (default 5 since v69; 0: never) */
    DS4C_OPT_TC_MIN_SEL = 5, /* selections from which grouped products use tensor cores (default 32; 0: never) */
    DS4C_OPT_PDL = 6,     /* 1: kernels launched with programmatic dependent launch (default; env DS4_CUDA_PDL=0 sets 0) */
    DS4C_OPT_ATTN_PO = 7, /* 1: single-token attention's softmax and output in one kernel (default); 0: two */
    DS4C_OPT_PREFETCH = 8, /* 1: matrix products prefetch known weights into L2 before waiting for the previous kernel (default; env DS4_CUDA_PREFETCH=0 sets 0) */
    DS4C_OPT_FX_WARP = 9, /* 1: single-token exact products of short 16-bit rows run a row per warp (default); 0: a row per CTA */
    DS4C_OPT_FX_LIVE = 68, /* by bits: 1 DS4C_OPT_FX_WARP's kernel with 8 rows a CTA on rows of at most 1024 columns (the indexer's query product) keeps only the four groups of running sums that hold columns, the other four's totals written as +0 (else all eight groups); 2 that kernel requests a row's float4s two a thread at once before staging them (else one at a time); 4 its fused norm (one token, DS4C_OPT_MV_F32's bit 4) likewise, in a form of its own; 8 in passes of 2-4 tokens (without the fused norm) every token's row copied into shared memory at once by cp.async (over bit 2); default 15; env DS4_CUDA_FX_LIVE; the same bits */
    DS4C_OPT_MV_DEC_SUM = 71, /* 1: exact mode's single-token IQ2_XXS / Q2_K products (k_mv_dec) add a row's block terms on one lane from shared memory, in block order (default; env DS4_CUDA_MV_DEC_SUM; the same bits); 0: every lane adds them after a broadcast shuffle each */
    DS4C_OPT_ATTN_PO_VEC = 72, /* exact single-token attention's softmax and output kernel (DS4C_OPT_ATTN_PO): 4 (default since v64; env DS4_CUDA_ATTN_PO_VEC): as 2, its softmax statistics formed once a head in a thread-block cluster of 8 output CTAs (k_attn_po_cl), where the exponentials are cached (else 2); 3: as 2, the weighted sums two heads a warp on warps 0-3; 2: as 1, the staged key quads swizzled free of bank conflicts and the serial loops loading the next group of 8 keys before adding the current one; 1: the first 1024 keys' rows found once a CTA, the staged key slices and probabilities read four keys a load; 0: each key's row found by every thread loading it, a key a load; all the same bits */
    DS4C_OPT_HC_TWO = 10, /* 1: hc_pre runs the Sinkhorn split in a second CTA per token (default; env DS4_CUDA_HC_TWO); 0: one CTA */
    DS4C_OPT_NORM_ROPE = 11, /* 1: rmsnorm, rope and FP8 rounding of query heads / KV rows in one kernel (default); 0: three */
    DS4C_OPT_HC_QUANT = 12, /* 1: hc_pre forms x's Q8_0 activation itself when asked (default); 0: a quantize kernel after it */
    DS4C_OPT_MV_PIPE = 13, /* single-token Q8_0/Q2_K/IQ2_XXS products stream weights through a shared-memory pipeline with this many CTAs per SM (1..4, default 2; env DS4_CUDA_MV_PIPE); 0: one load round per CTA */
    DS4C_OPT_MV_COPY = 14, /* the pipelined products' copies: 0 cp.async, 1 cp.async with L2 256-byte fetches, 2 bulk copies (default; env DS4_CUDA_MV_COPY) */
    DS4C_OPT_MV_STAGE = 15, /* weight bytes per stage of the pipelined products (0, the default: the most that lets DS4C_OPT_MV_PIPE CTAs fit an SM; env DS4_CUDA_MV_STAGE) */
    DS4C_OPT_MV_STAGES = 16, /* stages of the pipelined products (2..8, default 3; env DS4_CUDA_MV_STAGES) */
    DS4C_OPT_MV_Q8_NS_EX = 73, /* stages of exact mode's pipelined Q8_0 products (on k_mv_pipe_q8f's items, DS4C_OPT_MV_EXQ8) with automatic tiles (DS4C_OPT_MV_STAGE 0), a decimal digit a class of columns: thousands at most 1024, hundreds 2048, tens 4096, ones more; each 2..8, or 0 for DS4C_OPT_MV_STAGES (default 200: the shared expert's down, 2048 columns, in 2 stages: taller tiles, 216 CTAs against 256, so that more SMs hold one of them and room for a routed expert's k_mv_dec CTA beside it; env DS4_CUDA_MV_Q8_NS_EX; the same bits: stages change the tiles, not a row's order) */
    DS4C_OPT_MV_Q8_NS_FAST = 74, /* the same for fast mode's pipelined Q8_0 products (k_mv_pipe_q8f; default 0: DS4C_OPT_MV_STAGES for all; env DS4_CUDA_MV_Q8_NS_FAST) */
    DS4C_OPT_MV_Q8_CTAS_EX = 75, /* exact mode's pipelined Q8_0 products (as DS4C_OPT_MV_Q8_NS_EX) run at most this many CTAs an SM, a decimal digit a class of columns as there, tiles still sized for DS4C_OPT_MV_PIPE CTAs an SM (0: no cap, the default; env DS4_CUDA_MV_Q8_CTAS_EX; the same bits) */
    DS4C_OPT_MV_Q8_CTAS_FAST = 76, /* the same for fast mode's (default 0; env DS4_CUDA_MV_Q8_CTAS_FAST) */
    DS4C_OPT_EX_TIMING = 77, /* timing experiments only, WRONG RESULTS in exact mode: exact mode's single-token work of a class runs fast mode's kernels (another summation order), by bits: 1 the Q8_0 products, 2 the attention, 4 the F16/BF16/F32 products, 8 the indexer's scores (default 0; env DS4_CUDA_EX_TIMING): what a summation order shared with the CPU would gain, class by class (cuda/NOTES.md v65) */
    DS4C_OPT_ATTN_ORDER = 78, /* exact mode's attention summation order: 0 the serial one (the default until v66; cpu.Options.AttnSerial), 1 the segmented one of cpu.AttendHead (64 keys a segment; the CPU backend's default) in k_attn_po_cl (its segments' sums side by side), 2 the same order split over the segments (k_attn_seg<128>, a CTA a segment, 8 heads and 128 dims, then k_attn_seg_combine), 3 and 4 as 2 with 64 and 32 dims a CTA (k_attn_seg<64>, <32>), 5 (the default) as 3 with the scores formed inside it instead of by k_attn_scores<1> (k_attn_seg_cl: the segment's 8 dim-slice CTAs a cluster, each the scores of 8 keys shared through DSMEM; head dim 512, else as 3); 1 past k_attn_po_cl's reach as 3; prompt chunks (8 tokens or more) with any of 1-5 through k_attn_softmax_seg and k_attn_out_tile<false, true>; a shape no kernel takes in the order fails (env DS4_CUDA_ATTN_ORDER; cuda/NOTES.md v65, v66) */
    DS4C_OPT_SEG_COMB = 79, /* k_attn_seg_combine (exact decode, the segmented order): 1 (default) each lane's partial sums requested before the statistics, up to 16 segments at once, and its first (m, l) pair kept from the maximum's loads; 0 the v66 form (the pairs loaded twice, the partials four at a time); the same bits (env DS4_CUDA_SEG_COMB; cuda/NOTES.md v67) */
    DS4C_OPT_MV_OCC = 80, /* the pipelined Q8_0 products of 2-4 tokens (speculative passes) in forms whose registers are bounded for two CTAs an SM, two items a warp at once (k_mv_pipe_q8f's MB; the same bits), by bits: 1 fast mode's, 2 exact mode's; 3 both (default); 0 the unbounded forms, one CTA an SM where their registers are many (env DS4_CUDA_MV_OCC; cuda/NOTES.md v71) */
    DS4C_OPT_MV_FEW_NS_EX = 81, /* stages of exact mode's pipelined Q8_0 products of 2-4 tokens (speculative passes), a decimal digit a class of columns as DS4C_OPT_MV_Q8_NS_EX; a digit 0 takes that option's (default 2222; env DS4_CUDA_MV_FEW_NS_EX; the same bits) */
    DS4C_OPT_ATTN_SEG_OCC = 83, /* exact mode's split attention of 1-7 tokens (k_attn_seg_cl, DS4C_OPT_ATTN_ORDER 5): 0 compiled for no occupancy, 2-5 for at least that many CTAs an SM (__launch_bounds__' second argument: fewer registers a thread, so more CTAs at once where a pass's CTAs take several waves; the same bits); default 4 (CUDA 13: 64 registers against 78, 4 CTAs an SM against 3; 5 spills; env DS4_CUDA_ATTN_SEG_OCC) */
    DS4C_OPT_ATTN_SEG_WALK = 84, /* exact mode's split attention (DS4C_OPT_ATTN_ORDER 5) with each cluster walking several segments (k_attn_seg_walk: the keys' rows found and the queries staged once a CTA, the next segment's loads in flight during the current one's sums; the same bits), as few a cluster as keep the CTAs within one wave: 0 off, 1 single tokens (the default: exact decode +0.5 ... +0.7 %), 2 every token count (1-7), 3-14 every count with value - 2 segments a CTA; env DS4_CUDA_ATTN_SEG_WALK */
    DS4C_OPT_IX_EXACT = 86, /* exact mode's indexer scores of prompt chunks (8 or more queries, Flash's 64 heads of 128) on the f16 tensor cores (k_index_flash_exact): each dot kept where its query head's and row's exponent spans make its f16 values and every product and partial sum exact in float (the model's FP4-simulated values, unless their block scales spread over more than about 13 binary places), formed again in dot4_ref's operations where not, and the heads added in order from shared memory: the same bits as 0, the CUDA cores' FP32 tiles (k_index_scores_tile); 1: exact prefill at 131k +85 %; 2, the default: the same kernel fed f16 copies of the rows with their spans, formed once a chunk (k_ix_rows_half; form 1 while the stream is recorded or captured; +5.05 % against 1); bit 4 (tests only, 5 or 6): a dot that fails the check is +inf; env DS4_CUDA_IX_EXACT */
    DS4C_OPT_ATTN_SEG_FORM = 85, /* exact mode's split attention (k_attn_seg_cl, k_attn_seg_walk): the scores' and sums' forms, SF + 4 * PF; SF 0 a thread a chain of one head and key, 1 two heads a thread (warps 0-3), 2 two heads x two keys (warps 0-1); PF 0 a lane a head's 2 dims, 1 a lane two heads' dim; each chain and sum in its own order: the same bits; default 5 (SF 1, PF 1: exact decode +0.6 %, exact three drafts +1.1 %); forms other than 0 with DS4C_OPT_ATTN_SEG_OCC 3 and 4 only (env DS4_CUDA_ATTN_SEG_FORM) */
    DS4C_OPT_MV_FEW_NS_FAST = 82, /* the same for fast mode's (k_mv_pipe_q8f<CP, 2..4>; a digit 0 takes DS4C_OPT_MV_Q8_NS_FAST's; default 2222; env DS4_CUDA_MV_FEW_NS_FAST) */
    DS4C_OPT_MV_PIPE_MIN = 17, /* MiB of weights from which a single-token product is pipelined (default 0: every one that can be, its first tiles requested before the wait for the previous kernel; env DS4_CUDA_MV_PIPE_MIN) */
    DS4C_OPT_MV_TIMING = 18, /* timing experiments only, WRONG RESULTS: the pipelined products skip their arithmetic (1) or their ordered sums (2); env DS4_CUDA_MV_TIMING */
    DS4C_OPT_IX_TILE = 19, /* 1: indexer scores of fewer than 8 queries (a CTA row a query, each its one-query launch's bits) with a row per lane and 8 heads per warp, staging loads in flight together; 2 (default): the same, and in fast mode (Flash's 64 heads of 128) the dots on the tensor cores (TF32 mma, float sums: exact products of FP4 values, the sums in another order); 0: a (row, head) dot per thread */
    DS4C_OPT_TOPK_WARP = 20, /* 1: radix top-k with warp scans and a bitonic sort in registers and shuffles, 512 threads when K <= 512 (default); 2: the same with 1024 threads; 0: block-wide scans and sort */
    DS4C_OPT_ROUTER_WARP = 21, /* 1: the router picks its experts by K rounds of a warp maximum (default); 0: by ranking every expert against all */
    DS4C_OPT_ATTN_ECACHE = 22, /* 1: single-token attention keeps its exponentials in shared memory for the output pass (default); 0: computes them again */
    DS4C_OPT_ATTN_ROPE = 23, /* 1: single-token attention applies the output's inverse RoPE in its output kernel (default); 0: a k_rope launch after it */
    DS4C_OPT_ATTN_QUANT = 24, /* 1: single-token attention forms the output's Q8_0 activation in its output kernel (default); 0: a quantize launch after it */
    DS4C_OPT_ATTN_TILE = 25, /* 1: chunk attention register-tiled: scores 4 heads x 4 keys a thread, weighted sum 8 heads x 4 dims; 2 (default): the same, exact mode's scores tiles staging their slices by cp.async instead of through registers (the same bits); env DS4_CUDA_ATTN_TILE; 0: k_attn_scores<2> and k_attn_out<16> */
    DS4C_OPT_IX_CHUNK = 26, /* 1: chunk indexer scores register-tiled, 4 heads x 4 rows per thread (default; env DS4_CUDA_IX_CHUNK); 0: a (row, head) dot per thread */
    DS4C_OPT_FX_WREG = 27, /* 2: exact 16-bit-weight products of 16+ tokens keep each warp's weights in registers, only the inputs staged, and where every stage is whole (columns a multiple of 2048, or fewer and a multiple of 256) the inputs staged for 16-byte reads (default; env DS4_CUDA_FX_WREG); 1: the weights in registers only; 0: both staged in shared memory; the same bits */
    DS4C_OPT_TC_STAGE = 28, /* tensor-core Q2_K and IQ2_XXS products of many tokens: 1 weights and activations staged in shared memory three blocks deep, CTAs of 4 warps x 32 slots; 2 the same with CTAs of 8 warps x 64 slots; 3 (default; env DS4_CUDA_TC_STAGE) IQ2_XXS as 2, Q2_K as 1; 0 unstaged, weights loaded from global memory one sub-block ahead */
    DS4C_OPT_TC_Q8W = 29, /* tensor-core Q8_0 products of many tokens (env DS4_CUDA_TC_Q8W): 1: CTAs of 8 warps x 64 slots, stages of 4 blocks three deep; 0: 4 warps x 32 slots, stages of 8 blocks two deep; 2 (default): the first for matrices of at most 1024 columns, the second for longer rows */
    DS4C_OPT_QUANT_VEC = 30, /* 1: Q8_0 and Q8_K activations quantized 8 values a lane with 16-byte loads, the blocks of all tokens flattened (default; env DS4_CUDA_QUANT_VEC); 0: a lane a value (Q8_0 a warp a block, Q8_K a CTA a block) */
    DS4C_OPT_NORM_ROPE_W = 31, /* 1: the fused query/KV norm and rotation of chunks with a warp per row, the row in registers (default; env DS4_CUDA_NORM_ROPE_W); 0: a CTA per row staged in shared memory */
    DS4C_OPT_FLOAT_TC = 32, /* 1: fast-mode products of 16-bit weights and 16+ tokens on the tensor cores (TF32 mma, each input split into two TF32 terms) when their tiles fill the GPU (default; env DS4_CUDA_FLOAT_TC); 2: whenever they can (tests); 0: never (the exact tiled kernels). Exact mode never uses it */
    DS4C_OPT_ATTN_TC = 33, /* 1: fast-mode chunk attention and indexer dots on the tensor cores (TF32 mma, operands split into two TF32 terms; default; env DS4_CUDA_ATTN_TC); 0: fast mode keeps the exact-order tiled scores and sums the weighted output with fused multiply-adds. Exact mode never uses it */
    DS4C_OPT_ATTN_SPLIT = 34, /* 1: fast-mode attention of fewer than 8 tokens split over the keys (k_attn_split + k_attn_combine: flash decoding, for head dim 512; env DS4_CUDA_ATTN_SPLIT); 2: from 512 keys, the same split on the tensor cores (k_attn_flash over each split's tiles of 32 keys with f16 operands, then k_attn_combine; 64 heads a CTA, 16-byte aligned rows), else as 1 (default); 3: that kernel at any number of keys; 0: one pass over every key per (token, head), as exact mode (k_attn_po with float exponentials). Exact mode never uses it */
    DS4C_OPT_HALF_MM = 35, /* fast-mode products of chunks through cuBLAS with f16 operands and f32 sums (ds4c_matmul_half; env DS4_CUDA_HALF_MM): 1 Q8_0 weights; 2 Q8_0 and F16 weights (default); 3 also the hyper-connection mixers (F16 weights, float inputs) on the TF32 tensor cores; 0 never. Exact mode never uses it */
    DS4C_OPT_HALF_MIN = 36, /* tokens from which ds4c_half_ok accepts a product (default 128; env DS4_CUDA_HALF_MIN) */
    DS4C_OPT_ATTN_FLASH = 37, /* 1: fast-mode attention of chunks (8 or more tokens) in one kernel with f16 operands on the tensor cores (k_attn_flash: running softmax over key tiles, for head dim 512 and heads in groups of 64; the key rows rounded to f16 in the kernel; env DS4_CUDA_ATTN_FLASH); 2: the same kernel fed f16 copies of the key rows made before it in stream-ordered scratch (same bits; 1 while the stream is recorded or captured); 3: those copies multiplied on wgmma (k_attn_wg, attn_wg.cu: two warpgroups a CTA, 64-key tiles; other bits than 2 within the same bound; 2 where the device or build has no sm_90a; default); 0: scores, softmax and weighted sum as three kernels (DS4C_OPT_ATTN_TC). Exact mode never uses it */
    DS4C_OPT_IX_FLASH = 38, /* 1: fast-mode indexer scores of chunks (8 or more tokens) with f16 operands on the tensor cores (k_index_flash, for 64 heads of 128; exact products on FP4-simulated inputs; env DS4_CUDA_IX_FLASH); 2: the same operations on f16 copies of the rows made once a chunk in stream-ordered scratch, four tokens a CTA, the next rows copied while the current ones are multiplied (k_index_flash2; the same bits; 1 while the stream is recorded); 3: the f16 copies multiplied on wgmma, eight tokens a CTA (k_index_wg, ix_wg.cu; other bits than 2, the same bound; 2 where the device or build has no sm_90a, 1 while recorded); 4: that kernel on the rows' tile image (k_ix_tiles), a tile one bulk copy completing on its stage's mbarrier, the warpgroups free to drift (the bits of 3; default); 0: the TF32-split tiles (DS4C_OPT_ATTN_TC). Exact mode never uses it */
    DS4C_OPT_HC_CHUNK = 39, /* 1: hc_pre of chunks (8 or more tokens, 4 streams) with a CTA of 128 threads a token walking the values in a loop, the split in its warp 0 (k_hc_pre_chunk; same results; default; env DS4_CUDA_HC_CHUNK); 0: the decode layout (k_hc_pre: 512 threads a token holding the streams in registers, DS4C_OPT_HC_TWO) */
    DS4C_OPT_WG_MOE = 40, /* fast mode multiplies chunks by routed experts with f16 activations on the wgmma tensor cores (ds4c_grouped_half_ok, DS4C_MM_HALF; env DS4_CUDA_WG_MOE): 1 IQ2_XXS and Q2_K, CTAs of 4 warpgroups over 256 rows; 2 the same with IQ2_XXS in CTAs of 2 warpgroups over 128 rows, two an SM; 3 IQ2_XXS with its operands in shared memory in the 128-byte-swizzled layout, Q2_K on the int8 kernels; 4 Q2_K swizzled too (measured no faster than its int8 kernels); 5 both types with the weights dequantized into wgmma's A registers (RS form; activations permuted, ds4c_grouped_half_ok 2), CTAs of 4 warpgroups; 6 the same in CTAs of 2 warpgroups, two an SM; 7 IQ2_XXS as 5 and Q2_K as 6 (default); 0 Q8_K activations through the int8 mma kernels, as exact mode */
    DS4C_OPT_HC_MIX = 41, /* 1: fast mode's hyper-connection mixing logits of chunks (ds4c_hc_mixes_ok) in one pass over the streams on the TF32 tensor cores in three terms, scaled by the streams' rms there (hc_pre then skips its own pass; default; env DS4_CUDA_HC_MIX); 0: the exact-order product and hc_pre's scaling, as exact mode */
    DS4C_OPT_ATTN_HALF = 43, /* ds4c_attention_half_ok's answer for fast chunks of the flash kernel (env DS4_CUDA_ATTN_HALF): 1 f16 queries (DS4C_ATTN_QH) and f16 output (DS4C_ATTN_OH), which the kernel rotates and rounds itself; 2 the same with the queries' norm and rotation in the kernel too (DS4C_ATTN_QN); both give the same bits as the float queries and output; 3: as 2 from f16 rows before the norm (DS4C_ATTN_QH with DS4C_ATTN_QN: q_b's product with f16 output, other bits; default); 0: none */
    DS4C_OPT_WG_GLU = 44, /* 1: ds4c_grouped_glu_ok accepts fast chunks' routed gate and up products for one launch with SwiGLU in its epilogue (ds4c_matmul_grouped_glu; the same bits as the two products and ds4c_swiglu_half; default; env DS4_CUDA_WG_GLU); 0: it refuses them */
    DS4C_OPT_MV_DEC = 45, /* single-token IQ2_XXS and Q2_K products (rows a whole number of 32-unit rounds: 4096 or 2048 columns) as k_mv_dec: each warp a contiguous run of one selection's rows, its lanes' activation in registers, the next rows' weights in flight, IQ2_XXS through lane-private codebook and sign tables, block terms added in block order (bit-identical to the CPU in both modes); the value picks rows at a time and CTAs an SM: 1 (1, 3), 2 (2, 2; default), 3 (3, 2); env DS4_CUDA_MV_DEC; 0: k_matvec or the pipelined kernel, as before */
    DS4C_OPT_MV_F32 = 46, /* ds4c_matvec_f32 in one launch, by bits (default 7; env DS4_CUDA_MV_F32): 1 the Q8_0 products that the pipelined kernel takes form their Q8_0 activation (after the RMSNorm) in that kernel, every CTA for itself, after its wait (one launch for three; the same bits); 2 fast mode's F16 products of 1024, 2048 or 4096 columns with d_nw set as k_mv_f16_norm: each warp's row loaded into registers before the wait, every CTA normalising the row itself after it (one launch for two; the same bits as k_rmsnorm_ref and k_matvec's one-row-a-warp launch); 4 exact mode's F16 products of at most 4096 columns with d_nw set as k_fexact_warp, each CTA staging the row after its norm (one launch for two; the same bits as k_rmsnorm_ref and the exact product); a bit off: RMSNorm, (quantize) and product as separate launches */
    DS4C_OPT_MV_PRE = 47, /* the pipelined products (k_mv_pipe) without ids: tiles requested before the wait for the previous kernel, capped at the stages less one (default 7: all of them; env DS4_CUDA_MV_PRE); the rest after it (and after the activation formed by DS4C_OPT_MV_F32) */
    DS4C_OPT_IX_QUERY = 49, /* ds4c_index_query in one launch (1, default; env DS4_CUDA_IX_QUERY) or as ds4c_rope, ds4c_hadamard_fp4 and ds4c_scale (0); the same bits */
    DS4C_OPT_ATTN_WAVE = 50, /* fast single-token attention split over the keys (DS4C_OPT_ATTN_SPLIT): when its splits of whole 32-key chunks make more CTAs than the GPU holds at once, as many splits as fit one wave, of equal runs of keys (1, default; env DS4_CUDA_ATTN_WAVE); 0 the chunk splits in two waves; fast mode only, so not the same bits */
    DS4C_OPT_HC_HOIST = 51, /* 1: single-token hc_pre with k_hc_post_mix's parts (fast decode) issues its stream loads right after the wait for the previous kernel, before adding the parts (the same bits; default; env DS4_CUDA_HC_HOIST); 0: after the gates, as before */
    DS4C_OPT_MV_DEC_LATE = 52, /* single-token IQ2_XXS / Q2_K products (k_mv_dec, DS4C_OPT_MV_DEC) launched only when the kernel before them completes, not early beside it (programmatic launch) where their CTAs would hold every SM's registers while they wait and keep the side stream's shared expert off the GPU: 1 the routed gate/up pair, 2 also the down (default); 0 early like every kernel; env DS4_CUDA_MV_DEC_LATE; the same bits */
    DS4C_OPT_MV_FAST = 53, /* fast mode's single-token products summed in parallel, not in quant.Dot's block order (the same bits run to run), by bits: 1 the pipelined Q8_0 products (columns a multiple of 1024, bulk copies) as k_mv_pipe_q8f, k_mv_pipe's staging with the dp4a sums of a row's 1024-value segments reduced by warps and the segments added in order; 2 k_mv_dec (IQ2_XXS, Q2_K) adds each lane's shares of its units' terms, then the warp's tree sum; default 3; env DS4_CUDA_MV_FAST; 0: the exact terms in both modes */
    DS4C_OPT_MV_EVEN = 54, /* 1: fast mode's pipelined Q8_0 products (DS4C_OPT_MV_FAST bit 1) with automatic stages take the tile height, among the largest that fits and down to 7/8 of it, that gives the CTA with the most tiles the fewest rows (default; env DS4_CUDA_MV_EVEN); 0: the largest that fits; the same bits */
    DS4C_OPT_ATTN_CLUSTER = 55, /* 1: fast single-token attention split over the keys by k_attn_split (DS4C_OPT_ATTN_SPLIT; up to 512 keys) combined in the same launch: the splits of a head group form one thread-block cluster of 8 CTAs (splits of whole 32-key chunks, the last ones empty where the keys are fewer) that, after a cluster barrier, does k_attn_combine's operations itself (one launch fewer on a layer's chain; the same bits as the two launches up to 256 keys; default; env DS4_CUDA_ATTN_CLUSTER); 0: k_attn_split, then k_attn_combine */
    DS4C_OPT_COMP_EMIT = 56, /* 1: a decode step's compressed row (ds4c_comp_emit: one row, equal ring capacities) pooled, normalised, rotated, post-processed and stored, and the step's entries written into the rings, in one launch (k_comp_emit; the same bits; default; env DS4_CUDA_COMP_EMIT); 0: ds4c_comp_pool, ds4c_rmsnorm_ref, ds4c_rope, the post-processing and the ring writes apart */
    DS4C_OPT_MV_ILP = 57, /* fast mode's pipelined Q8_0 products (k_mv_pipe_q8f) whose 1024-column segments divide the CTA's 8 warps: each warp forms this many of its items (a row's segment of a tile) at once, their loads, dp4a sums and tree sums interleaved (q8f_items; 1 to 4, default 4; env DS4_CUDA_MV_ILP; the same bits); 1: one item after another */
    DS4C_OPT_MV_SUMW = 58, /* 1: fast mode's pipelined Q8_0 products (k_mv_pipe_q8f) whose 1024-column segments divide the CTA's 8 warps add a tile's row sums on the last warp, which requests no copies, each row's partials in one or two vector loads (default; env DS4_CUDA_MV_SUMW; the same bits); 0: warp 0's threads, a load a partial */
    DS4C_OPT_MV_TWO = 59, /* products of two tokens (speculative decoding's verification passes), by bits: 1 fast mode's: Q8_0 ones (one selection, columns a multiple of 1024 dividing the 8 warps) as one pipelined k_mv_pipe_q8f<2, 2>, the weights streamed once and each token's bits those of its one-token product; the others on k_matvec split over up to 8 warps a row where the rows are too few to fill the GPU, as one token's; 2 exact mode's Q8_0 ones of the same shapes as one k_mv_pipe_q8f<2, 2, true> (each token's block terms stored and added in block order: quant.Dot's bits, its one-token product's; v67); 4, with bit 2: exact mode's ds4c_matmul_q8out of two tokens quantizes both tokens' output blocks in its CTAs (the same bits as ds4c_quantize after the product; fast mode's measured −0.2 / −0.5 %, within the spread, and left to the separate steps; v68); 8 ds4c_hc_post_mix_ex of two tokens in one CTA a part, the weights loaded once (each token's bits its one-token launch's; v68); 16, with bit 1: fast mode's three- and four-token items with the tokens' shuffle trees packed (q8f_items4; each token's bits its one-token product's; v70, not yet measured: off); 15 the first four (default; env DS4_CUDA_MV_TWO); 0: k_matvec's two-token form, a warp a row */
    DS4C_OPT_MV_ROOM = 60, /* pipelined products given room (DS4C_MM_ROOM: a scoring decode step's q_b beside the indexer's path), by bits: 1 one token's, 2 two tokens' run DS4C_OPT_MV_PIPE CTAs an SM within the room's budget (SM shared memory less DS4C_MV_ROOM_KIB), the others one CTA an SM (env DS4_CUDA_MV_ROOM; default 0 since v65, 2 before) */
    DS4C_OPT_TC_PARTS = 61, /* 1: grouped int8 tensor-core products in CTAs of 32 slots run a grid of only the tile parts that hold selections (ds4c_group's part list; default; env DS4_CUDA_TC_PARTS); 0: every tile's four parts in z, the empty ones starting and leaving; the same bits */
    DS4C_OPT_TOPK_CL = 62, /* the top-k of a launch whose tokens see this many candidate rows or more (K <= 512) on a thread-block cluster of 8 CTAs a token, each holding an eighth of the keys in registers and the radix passes' counts shared through distributed shared memory (the same picks in the same order as the one-CTA kernels; default 8193; env DS4_CUDA_TOPK_CL); 0: never */
    DS4C_OPT_TOPK_CL_TOK = 63, /* DS4C_OPT_TOPK_CL only for launches of at most this many tokens (default 16: decode steps and speculative passes; a prefill chunk's 4096 tokens measured slower on it; env DS4_CUDA_TOPK_CL_TOK) */
    DS4C_OPT_IX_FLASH_SPLIT = 64, /* fast chunks' indexer scores on the f16 tensor cores (DS4C_OPT_IX_FLASH): where a chunk's token groups are too few for this many waves of the kernel's CTAs (two an SM of k_index_flash's, one of k_index_flash2's or k_index_wg's), each group's compressed rows are split into runs, a CTA a run (a small chunk deep in a long context; the same bits; default 2; env DS4_CUDA_IX_FLASH_SPLIT); 0: a CTA walks every row */
    DS4C_OPT_MV_EXQ8 = 66, /* 1: exact mode's pipelined Q8_0 products (columns a multiple of 1024 dividing the CTA's 8 warps, bulk copies) form their block terms on k_mv_pipe_q8f's items (a lane a block, the terms stored, not tree-summed) and add them in block order as k_mv_pipe does: the same bits with about a third of the instructions; 2 (default): the same with a ninth warp that forms no items adding the previous tile's rows while the eight form the next (env DS4_CUDA_MV_EXQ8); 1: the last warp adds them after its items; 0: k_mv_pipe's units */
    DS4C_OPT_TOPK_WIDE = 65, /* 1: the top-k of a launch of more than DS4C_OPT_TOPK_CL_TOK tokens whose rows pass 8192 (prefill chunks deep in a long context; K <= 512) in two walks over the scores (k_topk_wide: a histogram of the keys' top 11 bits, then the keys of the bins at and above the cut gathered in index order, at most 4096, else k_topk_warp's walks): the same picks in the same slots as k_topk_warp (default; env DS4_CUDA_TOPK_WIDE); 0: k_topk_warp */
    DS4C_OPT_MV_PAIR = 48, /* ds4c_matmul_grouped_pair of one selection of one Q8_0 or Q4_K matrix (a shared expert's gate and up): both tensors in one k_matvec grid (1, default; env DS4_CUDA_MV_PAIR) or two launches (0); the same bits in exact mode (in fast mode a lone Q8_0 product runs pipelined, which adds in another order) */
    DS4C_OPT_HAD_WARP = 42, /* 1: Walsh-Hadamard transforms of rows of 32 … 512 values a warp a row in registers (k_hadamard_w; with the FP4 simulation after it in the same kernel for ds4c_hadamard_fp4; the same bits; default; env DS4_CUDA_HAD_WARP); 0: a CTA a row in shared memory (k_hadamard), k_fp4_sim apart */
};

#ifdef __cplusplus
}
#endif

#endif
