/* cpu_attention — the numeric cores of attention by blocks of keys (ops/op_attention.c): one head
 * against one block as a partial result (o, lse), and the merge of partial results row by row.
 * Everything is float32 and C-contiguous. */
#ifndef CPU_ATTENTION_H
#define CPU_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

/* One head against one block of keys, q (L, D), k (S, D), v (S, Dv): o (L, Dv) is the softmax of
 * scale * q k^T over the visible keys times v, and lse (L) the log of that softmax's denominator.
 * Key j is visible to row i iff k_pos[j] >= 0 and (!causal or k_pos[j] <= q_pos[i]); a row that
 * sees no key gets o = 0 and lse = -inf. scores: scratch of L * S floats. */
void cpu_attention_block_head(int64_t L, int64_t S, int64_t D, int64_t Dv, const float *q, const float *k,
                              const float *v, const int64_t *q_pos, const int64_t *k_pos, bool causal, float scale,
                              float *scores, float *o, float *lse);

/* Merges the partial result (o_b (n, Dv), lse_b (n)) into (o, lse) in place, row by row:
 * lse' = logaddexp(lse, lse_b), o' = o exp(lse - lse') + o_b exp(lse_b - lse'). A row where both
 * are -inf stays lse = -inf, o as it is (0). */
void cpu_attention_merge(int64_t n, int64_t Dv, float *o, float *lse, const float *o_b, const float *lse_b);

#endif
