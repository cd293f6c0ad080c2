/* cuda_kernels — the CUDA device kernels behind the backend's slots (ops/cuda/cuda_backend.c), each
 * launched on a stream by a C-callable function: fills, counter-based random numbers, ranges,
 * strided copies, dtype conversions, the combinations of Partial pieces (cuda_kernels.cu) and the
 * elementwise ops in their compute types (cuda_pointwise_kernels.cu).
 *
 * Every function returns the launch's error (cudaSuccess once queued); a kernel's own failure shows
 * at the stream's next synchronisation. The arithmetic is the CPU kernels' (ops/cpu/cpu_kernels.h,
 * cpu_pointwise.c), written again for the device; ops/cuda/cuda_dtype.h holds the 16-bit float
 * conversions both sides share bit for bit. */
#ifndef CUDA_KERNELS_H
#define CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "dtorch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[0..n) = the element whose elem bytes (1, 2, 4 or 8) are the low bytes of bits. */
cudaError_t cuda_fill(void *dst, size_t elem, int64_t n, uint64_t bits, cudaStream_t s);

/* An ndim block of shape elements of elem bytes between two strided layouts (byte strides) on
 * the device; ndim 0 copies one element. */
cudaError_t cuda_copy_strided(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
                              int ndim, const int64_t *shape, size_t elem, cudaStream_t s);

/* dst (n elements of to) = src (n elements of from), converted as cpu_convert does. */
cudaError_t cuda_convert(void *dst, dt_dtype to, const void *src, dt_dtype from, int64_t n, cudaStream_t s);

/* cpu_arange: dst[i] = a + (first + i) * d in double for float dtypes, ia + (first + i) * id wrapping
 * in 64 bits for integer ones (the start and step already converted both ways). */
cudaError_t cuda_arange(void *dst, dt_dtype dtype, int64_t n, int64_t first, double a, double d, uint64_t ia,
                        uint64_t id, cudaStream_t s);

/* cpu_random: the C-contiguous block shape at offset of the (seed, stream) tensor of global_shape. */
cudaError_t cuda_random(void *dst, dt_dtype dtype, int ndim, const int64_t *shape, const int64_t *offset,
                        const int64_t *global_shape, uint64_t seed, uint64_t stream, bool normal, cudaStream_t s);

/* cpu_combine_pieces and cpu_scale_div. */
cudaError_t cuda_combine_pieces(void *dst, const void *a, const void *b, dt_dtype dtype, int64_t n, dt_reduce_op op,
                                cudaStream_t s);
cudaError_t cuda_scale_div(void *acc, dt_dtype dtype, int64_t n, int64_t divisor, cudaStream_t s);

/* ---- elementwise ops (cuda_pointwise_kernels.cu) ----------------------------------------------
 * One launch computes out[i] = f(operands at i) over a C-contiguous output of n elements, every
 * operand already in the compute type cd: float32, int32, int64 or bool (comparisons and logical
 * ops write bool). The output's dims are size[0..nd) (merged where every operand walks them as
 * one); an operand's element offset is the dot product of the output index with its strides (0:
 * broadcast). An operand with no data is a number: the low bytes of number[i]. */
#define CUDA_EW_MAX_IN 3

typedef struct {
    int nd;
    int64_t size[DT_MAX_DIMS];
    int nin;
    const void *in[CUDA_EW_MAX_IN];
    int64_t stride[CUDA_EW_MAX_IN][DT_MAX_DIMS];
    uint64_t number[CUDA_EW_MAX_IN];
    double p[4];                           /* the op's float attributes (clamp: its bounds) */
    void *out;
    int64_t n;
    int *zero_divisor;                     /* binary ops: set to 1 where operand 1 is 0, or NULL */
} cuda_ew_args;

/* Op id (ops/op_table.h) in cd; cudaErrorNotSupported when the op has no loop in cd. */
cudaError_t cuda_pointwise(int op, dt_dtype cd, const cuda_ew_args *a, cudaStream_t s);

/* ---- reductions, softmax, norms (cuda_reduce_kernels.cu) ------------------------------------
 * The kernels read a piece in its compute type (float32 from float32, float16 or bfloat16; int64
 * from int32, int64 or bool: cuda_load_f32, cuda_load_i64) and write outputs of that kind, with
 * the CPU's conversions (ops/cpu/cpu_reduce.c computes in the same types). */

/* What a reduction folds: each output element o (C-contiguous, n_out of them) folds the n_fold
 * input elements at offset(o over the kept dims) + offset(r over the folded dims), r = 0..n_fold-1
 * in row-major order over the folded dims (element offsets; cuda_layout.h). */
typedef struct {
    int nkeep, nfold;
    int64_t keep_size[DT_MAX_DIMS], keep_stride[DT_MAX_DIMS];
    int64_t fold_size[DT_MAX_DIMS], fold_stride[DT_MAX_DIMS];
    int64_t n_out, n_fold;
    const void *in;
    dt_dtype in_dtype;
    void *out;        /* the values, out_dtype (NULL: argmax/argmin keep only positions) */
    dt_dtype out_dtype;
    int64_t *index;   /* argmax/argmin: r of the extreme (the first on ties; a NaN beats any number) */
    int64_t divisor;  /* sum: each value divided by it in double (mean); 0: none */
} cuda_fold_args;

typedef enum { CUDA_FOLD_SUM, CUDA_FOLD_MAX, CUDA_FOLD_MIN, CUDA_FOLD_ARGMAX, CUDA_FOLD_ARGMIN } cuda_fold_op;

/* op in float32 (floating) or int64 (wrapping sums); a float max/min is NaN where a NaN was folded. */
cudaError_t cuda_fold(cuda_fold_op op, bool floating, const cuda_fold_args *a, cudaStream_t s);

/* softmax (log: log_softmax) along n of (outer, n, inner), float32 inside (cpu_softmax_run). */
cudaError_t cuda_softmax(bool log, const void *in, dt_dtype in_dtype, void *out, dt_dtype out_dtype, int64_t outer,
                         int64_t n, int64_t inner, cudaStream_t s);

/* layer_norm (rms: rms_norm) of rows of d elements, float32 inside (cpu_norm_run); weight and
 * bias (d elements, NULL: none) of floating dtypes. */
cudaError_t cuda_norm(bool rms, const void *in, dt_dtype in_dtype, void *out, dt_dtype out_dtype, int64_t rows,
                      int64_t d, const void *weight, dt_dtype weight_dtype, const void *bias, dt_dtype bias_dtype,
                      float eps, cudaStream_t s);

/* cpu_cumsum_run: out (outer, n, inner) = the running sum along n of in, in float32 (floating) or
 * wrapping int64, added in the CPU's order (each column by one thread), so the CPU's bits. */
cudaError_t cuda_cumsum(bool floating, const void *in, dt_dtype in_dtype, void *out, dt_dtype out_dtype, int64_t outer,
                        int64_t n, int64_t inner, cudaStream_t s);

/* Device scratch cuda_topk needs (0: none) for (outer, n, inner). */
size_t cuda_topk_scratch(bool floating, int64_t outer, int64_t n, int64_t inner);

/* cpu_topk_run: values/index (outer, k, inner) = the k largest (smallest) elements along n of in
 * (outer, n, inner), largest (smallest) first, ties in index order, a NaN above every number;
 * float32 keys for floating dtypes, int64 ones for integers (values keep in's dtype). scratch:
 * cuda_topk_scratch bytes. */
cudaError_t cuda_topk(bool floating, const void *in, dt_dtype dtype, void *values, int64_t *index, int64_t outer,
                      int64_t n, int64_t inner, int64_t k, bool largest, void *scratch, cudaStream_t s);

/* ---- attention (cuda_attention_kernels.cu) -----------------------------------------------------
 * A block of threads per query row: the row in shared memory, the keys in tiles of the block's
 * threads with an online softmax (a running max and denominator; the weighted values, Ev floats in
 * shared memory, rescaled at each tile). q, k and v are read in their floating dtype, everything
 * else is float32. */

/* The shared memory one block needs for heads of E (query, key) and Ev (value) elements. */
size_t cuda_attention_smem(int64_t E, int64_t Ev);

/* scaled_dot_product_attention as cpu_attention_head computes it for each of nbatch query
 * matrices (op_sdpa_dims, ops/op_registry.h): q (nbatch, L, E), k (., S, E), v (., S, Ev) of
 * dtype, out (nbatch, L, Ev) of out_dtype; the mask (NULL: none) bool or floating, read at the
 * offset of b over batch_shape[0..nd-2) by mask_stride plus i, j by mask_stride[nd-2], [nd-1]. A
 * row that sees nothing gives zeros. */
typedef struct {
    const void *q, *k, *v;
    dt_dtype dtype;
    void *out;
    dt_dtype out_dtype;
    const void *mask;
    dt_dtype mask_dtype;
    int nd;
    int64_t batch_shape[DT_MAX_DIMS], mask_stride[DT_MAX_DIMS];
    int64_t nbatch, L, S, E, Ev, Hq, H, group, row0;
    bool causal;
    float scale;
} cuda_sdpa_args;

cudaError_t cuda_sdpa(const cuda_sdpa_args *a, cudaStream_t s);

/* attention_block as cpu_attention_block_head and cpu_attention_merge compute it: q (B, Hq, L, D),
 * k (B, H, S, D), v (B, H, S, Dv) of dtype, q_pos (1 or B, L), k_pos (1 or B, S) int64 (q_pos_batch,
 * k_pos_batch: 1 or B); o (B, Hq, L, Dv) and lse (B, Hq, L) float32, the block's result merged into
 * o_acc, lse_acc where given (NULL: the block's result alone). */
typedef struct {
    const void *q, *k, *v;
    dt_dtype dtype;
    const int64_t *q_pos, *k_pos;
    int64_t q_pos_batch, k_pos_batch;
    const float *o_acc, *lse_acc;
    float *o, *lse;
    int64_t B, Hq, H, L, S, D, Dv;
    bool causal;
    float scale;
} cuda_block_args;

cudaError_t cuda_attention_block(const cuda_block_args *a, cudaStream_t s);

/* attention_merge: parts P of (o (rows, Dv), lse (rows)) stacked, float32, merged in order into o,
 * lse as cpu_attention_merge merges them. */
cudaError_t cuda_attention_merge(float *o, float *lse, const float *o_parts, const float *lse_parts, int64_t P,
                                 int64_t rows, int64_t Dv, cudaStream_t s);

/* ---- data movement by index (cuda_view_kernels.cu) --------------------------------------------
 * Rows are row_bytes each; indices are int32 or int64 (idx_dtype). */

/* *first = the first j < n whose index idx[j] lies outside [lo, hi), or n when none does (first:
 * one int64 of device memory). */
cudaError_t cuda_find_bad_index(const void *idx, dt_dtype idx_dtype, int64_t n, int64_t lo, int64_t hi,
                                int64_t *first, cudaStream_t s);

/* dst (outer, m rows) = row idx[j] - first_row of src (outer, rows) for each j, a negative index
 * counted from wrap (0: none); a row outside [0, rows) gives zeros (a vocabulary shard). */
cudaError_t cuda_gather_rows(void *dst, const void *src, const void *idx, dt_dtype idx_dtype, int64_t outer,
                             int64_t m, int64_t rows, int64_t first_row, int64_t wrap, size_t row_bytes,
                             cudaStream_t s);

/* dst (outer, rows) row idx[j] = src (outer, n) row j, for int64 indices in [0, rows); where
 * several j name one row the last one wins, as in a sequential copy (winner: rows int64 of device
 * scratch). */
cudaError_t cuda_scatter_rows(void *dst, const void *src, const int64_t *idx, int64_t outer, int64_t n, int64_t rows,
                              size_t row_bytes, int64_t *winner, cudaStream_t s);

/* triu (upper) / tril of batch matrices rows x cols of elem bytes: element (i, j) kept where
 * j - (r0 + i) + c0 is >= diag (upper) or <= diag, else zero; r0, c0: where the piece starts in
 * the whole matrix. */
cudaError_t cuda_tri(void *dst, const void *src, size_t elem, int64_t batch, int64_t rows, int64_t cols, int64_t r0,
                     int64_t c0, int64_t diag, bool upper, cudaStream_t s);

/* ---- rotary embedding (cuda_rope_kernels.cu) ---------------------------------------------------
 * cpu_rope: x (B, H, S, D) of a floating dtype, positions (pos_batch = 1 or B, S) int64, inv_freq
 * (D/2) float32; out of x's dtype. */
cudaError_t cuda_rope(void *out, const void *x, dt_dtype dtype, int64_t B, int64_t H, int64_t S, int64_t D,
                      const int64_t *positions, int64_t pos_batch, const float *inv_freq, float scaling,
                      cudaStream_t s);

/* ---- integer products (cuda_matmul_kernels.cu) -------------------------------------------------
 * c (batch..., M, N) of dtype int32 or int64, C-contiguous = a (M, K) @ b (K, N; b_trans: (N, K))
 * per batch index, in int64 wrapping (plus what c holds: accumulate), operands of c's dtype; a
 * batch index's a and b start at its dot product with a_stride and b_stride (elements, 0 where
 * an operand broadcasts). */
typedef struct {
    int nbatch;
    int64_t batch[DT_MAX_DIMS], a_stride[DT_MAX_DIMS], b_stride[DT_MAX_DIMS];
    int64_t M, N, K;
    bool b_trans, accumulate;
} cuda_mm_int_args;
cudaError_t cuda_mm_int(void *c, const void *a, const void *b, dt_dtype dtype, const cuda_mm_int_args *args,
                        cudaStream_t s);

/* ---- image ops (cuda_image_kernels.cu) ----------------------------------------------------------
 * conv2d: the columns of output rows [oh0, oh0 + rows) of channels [c0, c0 + Cg) of one image x
 * (C, H, W): col row (c, ki, kj) holds, per output position, the element kernel tap (ki, kj) meets
 * there (0 in the padding), elements of x's elem bytes. */
typedef struct {
    int64_t c0, Cg, H, W, kH, kW, OW, oh0, rows;
    int64_t sh, sw, pad_top, pad_left, dh, dw;
} cuda_im2col_args;
cudaError_t cuda_im2col(void *col, const void *x, size_t elem, const cuda_im2col_args *a, cudaStream_t s);
/* out (O, plane) of dtype = acc (float32) plus bias[o] (dtype; NULL: none), rounded once. */
cudaError_t cuda_conv_epilogue(void *out, dt_dtype dtype, const float *acc, const void *bias, int64_t O,
                               int64_t plane, cudaStream_t s);
/* cpu_group_norm over N images (C, S) of a floating dtype; weight and bias of their own dtypes or NULL. */
cudaError_t cuda_group_norm(void *y, const void *x, dt_dtype dtype, int64_t N, int64_t C, int64_t S, int64_t G,
                            const void *weight, dt_dtype weight_dtype, const void *bias, dt_dtype bias_dtype,
                            float eps, cudaStream_t s);
/* cpu_resample: out (P, OH, OW) from x (P, IH, IW), each output position reading where
 * op_resample_source says, with the axes' scales from op_resample_scale (1-D: nspatial 1, IH = OH = 1). */
typedef struct {
    int mode, align_corners, nspatial;
    int64_t P, IH, IW, OH, OW;
    float scale_h, scale_w;
} cuda_resample_args;
cudaError_t cuda_resample(void *out, dt_dtype out_dtype, const void *x, dt_dtype x_dtype, const cuda_resample_args *a,
                          cudaStream_t s);
/* cpu_pad: out (out_shape) = x (in_shape) padded by left[d] before each dim d, mode 0 constant (the
 * low elem bytes of fill), 1 reflect, 2 replicate. */
typedef struct {
    int ndim, mode;
    int64_t in_shape[DT_MAX_DIMS], out_shape[DT_MAX_DIMS], left[DT_MAX_DIMS];
    uint64_t fill;
} cuda_pad_args;
cudaError_t cuda_pad(void *out, const void *x, size_t elem, const cuda_pad_args *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
