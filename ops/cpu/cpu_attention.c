/* cpu_attention — the CPU kernels of attention by blocks of keys (OP_ATTENTION in ops/op_table.h):
 * per head, the scores by one sgemm, a softmax over the keys its positions let each row see, the
 * weighted values by a second sgemm, then the merge into the accumulators. 16-bit inputs are
 * converted to float32 scratch first; the outputs are float32. */
#include "cpu_attention.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm.h"
#include "cpu_matmul.h"
#include "cpu_ops.h"
#include "cpu_reduce_loops.h"

static inline bool s_visible(int64_t key, int64_t query, bool causal) { return key >= 0 && (!causal || key <= query); }

/* Rows [0, L) of one head against the block (what cpu_attention_block_head does for a run of rows). */
static void s_block_rows(int64_t L, int64_t S, int64_t D, int64_t Dv, const float *q, const float *k, const float *v,
                         const int64_t *q_pos, const int64_t *k_pos, bool causal, float scale, float *scores, float *o,
                         float *lse)
{
    if (L == 0)
        return;
    if (S > 0 && D > 0)
        cpu_sgemm(true, L, S, D, scale, q, D, k, D, 0.0f, scores, S);
    else if (S > 0)
        memset(scores, 0, (size_t)(L * S) * sizeof *scores);
    for (int64_t i = 0; i < L; i++) {
        float *row = scores + i * S, top = -INFINITY;
        bool nan = false;
        for (int64_t j = 0; j < S; j++) {
            if (!s_visible(k_pos[j], q_pos[i], causal))
                row[j] = -INFINITY; /* its weight comes out exactly 0 */
            else if (row[j] > top)
                top = row[j];
            else if (row[j] != row[j])
                nan = true;
        }
        if (nan)
            top = NAN; /* the row comes out NaN, as torch's softmax gives it */
        if (top == -INFINITY) {
            memset(row, 0, (size_t)S * sizeof *row);
            lse[i] = -INFINITY;
            continue;
        }
        float sum = cpu_exp_shifted_sum(row, NULL, S, top);
        lse[i] = top + logf(sum);
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < S; j++)
            row[j] *= inv;
    }
    if (Dv == 0)
        return;
    /* o = weights . v over the runs of keys some row sees: a key no row sees (an unfilled slot of
     * a KV cache, a padded one) is left out of the product, not multiplied by a weight of 0, so
     * whatever its memory holds (empty() can hold NaN) never reaches o */
    int64_t last = INT64_MIN;  /* the latest position a row of the run looks from */
    for (int64_t i = 0; i < L; i++)
        if (q_pos[i] > last)
            last = q_pos[i];
    float beta = 0.0f;
    for (int64_t j = 0; j < S;) {
        if (!s_visible(k_pos[j], last, causal)) {
            j++;
            continue;
        }
        int64_t end = j;
        while (end < S && s_visible(k_pos[end], last, causal))
            end++;
        cpu_sgemm(false, L, Dv, end - j, 1.0f, scores + j, S, v + j * Dv, Dv, beta, o, Dv);
        beta = 1.0f;
        j = end;
    }
    if (beta == 0.0f)
        memset(o, 0, (size_t)(L * Dv) * sizeof *o);
}

/* Under a causal mask, a query row before every key of the block sees none of it (half the rows
 * of a foreign block in the ring's zig-zag layout): those rows get o = 0 and lse = -inf without
 * any arithmetic, and the products run on the runs of rows that see something. */
void cpu_attention_block_head(int64_t L, int64_t S, int64_t D, int64_t Dv, const float *q, const float *k,
                              const float *v, const int64_t *q_pos, const int64_t *k_pos, bool causal, float scale,
                              float *scores, float *o, float *lse)
{
    int64_t first = INT64_MAX;  /* the earliest position a key of the block holds */
    for (int64_t j = 0; j < S; j++)
        if (k_pos[j] >= 0 && k_pos[j] < first)
            first = k_pos[j];
    if (!causal || first == INT64_MAX) {
        s_block_rows(L, S, D, Dv, q, k, v, q_pos, k_pos, causal, scale, scores, o, lse);
        return;
    }
    for (int64_t i = 0; i < L;) {
        int64_t end = i;
        bool sees = q_pos[i] >= first;
        while (end < L && (q_pos[end] >= first) == sees)
            end++;
        if (sees) {
            s_block_rows(end - i, S, D, Dv, q + i * D, k, v, q_pos + i, k_pos, causal, scale, scores, o + i * Dv,
                         lse + i);
        } else {
            memset(o + i * Dv, 0, (size_t)((end - i) * Dv) * sizeof *o);
            for (int64_t r = i; r < end; r++)
                lse[r] = -INFINITY;
        }
        i = end;
    }
}

void cpu_attention_merge(int64_t n, int64_t Dv, float *o, float *lse, const float *o_b, const float *lse_b)
{
    for (int64_t i = 0; i < n; i++) {
        float a = lse[i], b = lse_b[i], *oi = o + i * Dv;
        const float *bi = o_b + i * Dv;
        if (b == -INFINITY)
            continue;
        if (a == -INFINITY) {
            memcpy(oi, bi, (size_t)Dv * sizeof *oi);
            lse[i] = b;
            continue;
        }
        double hi = a > b ? a : b, lo = a > b ? b : a, merged = hi + log1p(exp(lo - hi));
        float wa = (float)exp(a - merged), wb = (float)exp(b - merged);
        for (int64_t d = 0; d < Dv; d++)
            oi[d] = oi[d] * wa + bi[d] * wb;
        lse[i] = (float)merged;
    }
}

/* ---- the kernels of the ops ------------------------------------------------------------------- */

const char *cpu_k_attention_block(op_kernel *k)
{
    if (!op_attention_block_fits(k))
        return "the local pieces of the operands do not fit together";
    const op_local *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2], *qi = &k->in[3], *ki = &k->in[4];
    int64_t B = q->shape[0], Hq = q->shape[1], L = q->shape[2], D = q->shape[3];
    int64_t H = kk->shape[1], S = kk->shape[2], Dv = v->shape[3], group = H ? Hq / H : 1;
    bool causal = k->attrs->ints[0] != 0, acc = k->nin == 7;
    float scale = (float)k->attrs->floats[0], *o = k->out[0].data, *lse = k->out[1].data;
    void *sq, *sk, *sv;
    const float *pq = cpu_piece_as(q, CPU_F32, &sq), *pk = cpu_piece_as(kk, CPU_F32, &sk),
                *pv = cpu_piece_as(v, CPU_F32, &sv);
    float *scores = malloc((size_t)(L * S > 0 ? L * S : 1) * sizeof(float));
    /* with accumulators the block's own result goes to scratch, then merges into them */
    float *block_o = acc ? malloc((size_t)(L * Dv > 0 ? L * Dv : 1) * sizeof(float)) : NULL;
    float *block_lse = acc ? malloc((size_t)(L > 0 ? L : 1) * sizeof(float)) : NULL;
    const char *why = pq && pk && pv && scores && (!acc || (block_o && block_lse)) ? NULL : "out of memory on the device";
    if (!why && acc) {
        memcpy(o, k->in[5].data, (size_t)(B * Hq * L * Dv) * sizeof *o);
        memcpy(lse, k->in[6].data, (size_t)(B * Hq * L) * sizeof *lse);
    }
    for (int64_t b = 0; b < B && !why; b++) {
        const int64_t *q_pos = (const int64_t *)qi->data + (qi->shape[0] == 1 ? 0 : b) * L;
        const int64_t *k_pos = (const int64_t *)ki->data + (ki->shape[0] == 1 ? 0 : b) * S;
        for (int64_t h = 0; h < Hq; h++) {
            int64_t kv = b * H + h / group, row = (b * Hq + h) * L;
            float *head_o = acc ? block_o : o + row * Dv, *head_lse = acc ? block_lse : lse + row;
            cpu_attention_block_head(L, S, D, Dv, pq + row * D, pk + kv * S * D, pv + kv * S * Dv, q_pos, k_pos,
                                     causal, scale, scores, head_o, head_lse);
            if (acc)
                cpu_attention_merge(L, Dv, o + row * Dv, lse + row, block_o, block_lse);
        }
    }
    free(sq);
    free(sk);
    free(sv);
    free(scores);
    free(block_o);
    free(block_lse);
    return why;
}

const char *cpu_k_attention_merge(op_kernel *k)
{
    const op_local *parts_o = &k->in[0], *parts_lse = &k->in[1];
    int64_t P, rows, Dv;
    const char *why = op_attention_merge_layout(k, &P, &rows, &Dv);
    if (why)
        return why;
    float *o = k->out[0].data, *lse = k->out[1].data;
    const float *po = parts_o->data, *plse = parts_lse->data;
    memcpy(o, po, (size_t)(rows * Dv) * sizeof *o);
    memcpy(lse, plse, (size_t)rows * sizeof *lse);
    for (int64_t p = 1; p < P; p++)
        cpu_attention_merge(rows, Dv, o, lse, po + p * rows * Dv, plse + p * rows);
    return NULL;
}
