/* cpu_matmul — the numeric cores of the matmul family on contiguous pieces: (batched,
 * broadcast) matrix products in float32 through cpu_gemm (OpenBLAS or oneDNN) and in int64 with
 * plain loops, one attention head (scores, masked numerically stable softmax, weighted values),
 * and the embedding row gather. */
#ifndef CPU_MATMUL_H
#define CPU_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu_gemm.h"
#include "cpu_pointwise.h"
#include "dtorch.h"
#include "op_quant.h"


/* A batch of products C[b] (M,N) = A[b] (M,K) @ op(B[b]), with B[b] stored (K,N) or, when
 * b_trans, (N,K) (a linear layer's weight). C is C-contiguous over (batch..., M, N); the
 * element offset of A[b] (B[b]) is the dot product of the batch index with a_stride (b_stride),
 * a stride 0 broadcasting that batch dim. */
typedef struct {
    int nbatch;
    int64_t batch[DT_MAX_DIMS];
    int64_t a_stride[DT_MAX_DIMS], b_stride[DT_MAX_DIMS];
    int64_t M, N, K;
    bool b_trans;
} cpu_mm_desc;

/* Runs the products in t (CPU_F32 or CPU_I64); accumulate adds into C (which the caller filled,
 * e.g. with a broadcast bias), else C is overwritten. NULL, or why it cannot run. */
const char *cpu_matmul_run(const cpu_mm_desc *d, cpu_ctype t, const void *a, const void *b, void *c, bool accumulate);

/* The products of few rows against a linear layer's weight, as decode makes them:
 * C (M, N) = A (M, K) @ B^T with B stored (N, K) in b_dtype (float32, float16 or bfloat16) and A,
 * C in float32 (accumulate adds into C). B is streamed from memory once for all M rows, in its
 * own order (one sequential stream, which the hardware prefetcher follows), and 16-bit weights
 * are widened on the fly, so the cost is the bytes of B: OpenBLAS's sgemm runs 3-13x slower than
 * that when M is small, and converting a 16-bit B first would read it twice.
 * Meant for M <= CPU_SKINNY_MAX_M. */
#define CPU_SKINNY_MAX_M 16
void cpu_matmul_skinny(int64_t M, int64_t N, int64_t K, const float *a, const void *b, dt_dtype b_dtype, float *c,
                       bool accumulate);

/* A product with a quantized weight (op_quant.h's layout, d its dims): out (M, N) = x (M, K; row
 * stride K_x) @ dequantized(q)^T + bias (NULL: none). Up to 8 rows at a time stream the weight's
 * bytes once (cpu_quant.c), more dequantize blocks of weight rows for sgemm. NULL, or why not. */
const char *cpu_quant_linear(const op_quant_dims *d, const float *x, const uint8_t *q, const float *scale,
                             const float *bias, float *out);

/* One attention head in float32: out (L, Ev) = softmax(scale * q k^T + mask) v with q (L, E),
 * k (S, E), v (S, Ev) C-contiguous, k and v of kv_dtype: float32, or bfloat16 / float16 where
 * L <= CPU_ATTENTION_FEW_ROWS (decode reads a 16-bit cache as it is, widening each element).
 * mask: NULL or additive float values, element (i, j) at mask[i * mask_sl + j * mask_ss] (strides 0
 * broadcast); causal hides key j > row0 + i (row0: the global index of this piece's first query
 * row). A row that sees no key gives zeros.
 * scores: scratch of cpu_attention_block_rows(L, S) * (S + 1) floats: the rows go in blocks of that
 * many (a block's scores, then a float per row).
 * Up to CPU_ATTENTION_FEW_ROWS query rows (decode) are scored key by key, skipping the keys the
 * mask hides; more go through two products per block, in register tiles (below) or by sgemm. */
#define CPU_ATTENTION_FEW_ROWS 4
int64_t cpu_attention_block_rows(int64_t L, int64_t S);
#if defined(__x86_64__)
/* cpu_attention_tiles.c: a block's two products in AVX2 register tiles, for float32 value rows of
 * Ev % 8 == 0 features on a CPU with AVX2 and FMA (cpu_attention_tiles_fit). The keys (S, E) go
 * into panels of 8 keys by feature first (cpu_attention_panel_floats floats, zeros past S); then
 * scores (L rows of stride ld) = scale * q (L, E) k^T for the first `used` keys, and out (L, Ev) =
 * w (L x used, row stride ld) @ v (used, Ev). */
bool cpu_attention_tiles_fit(int64_t Ev);
int64_t cpu_attention_panel_floats(int64_t S, int64_t E);
void cpu_attention_pack_keys(int64_t S, int64_t E, const float *k, float *kt);
void cpu_attention_scores(int64_t L, int64_t used, int64_t E, const float *q, const float *kt, float scale,
                          float *scores, int64_t ld);
void cpu_attention_values(int64_t L, int64_t used, int64_t Ev, const float *w, int64_t ld, const float *v,
                          float *out);
/* One query row (decode), on a CPU with AVX2, FMA and F16C, k (used, E) and v (used, Ev) of
 * kv_dtype (float32, bfloat16 or float16) as they lie; mask: NULL or key j's additive value at
 * mask[j * ss]. scores[j] = scale * q . k_j + mask, -inf where the mask is -inf (those keys are not
 * read); out = sum over the keys the mask does not hide of w[j] v_j. */
void cpu_attention_row_scores(int64_t used, int64_t E, const float *q, const void *k, dt_dtype kv_dtype,
                              float scale, const float *mask, int64_t ss, float *scores);
void cpu_attention_row_values(int64_t used, int64_t Ev, const float *w, const void *v, dt_dtype kv_dtype,
                              const float *mask, int64_t ss, float *out);
#endif
void cpu_attention_head(int64_t L, int64_t S, int64_t E, int64_t Ev, const float *q, const void *k, const void *v,
                        dt_dtype kv_dtype, const float *mask, int64_t mask_sl, int64_t mask_ss, bool causal,
                        int64_t row0, float scale, float *scores, float *out);
/* The same head with q, k and v bfloat16 (raw bits), more than CPU_ATTENTION_FEW_ROWS rows, E and
 * Ev above 0: both products on the CPU's bfloat16 units (cpu_gemm_bf16), the weights rounded to
 * bfloat16 between them (as torch's bfloat16 attention rounds them), softmax and out in float32.
 * scores as cpu_attention_head's; weights: cpu_attention_block_rows(L, S) * S bfloat16. false when
 * a product could not run there (out partly written: the caller computes the head in float32). */
bool cpu_attention_head_bf16(int64_t L, int64_t S, int64_t E, int64_t Ev, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, const float *mask, int64_t mask_sl, int64_t mask_ss, bool causal,
                             int64_t row0, float scale, float *scores, uint16_t *weights, float *out);

/* out[i] = row idx[i] - row_offset of weight (rows x row_bytes) for n indices of idx_dtype
 * (int32 or int64), zeros where that row is not in this piece. NULL, or "index out of range in
 * embedding" when an index is outside [0, vocab). */
const char *cpu_embedding(void *out, const void *weight, int64_t rows, size_t row_bytes, const void *idx,
                          dt_dtype idx_dtype, int64_t n, int64_t row_offset, int64_t vocab);

#endif
