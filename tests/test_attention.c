/* The attention_block and attention_merge kernels (ops/cpu/cpu_attention.c) on pieces made here,
 * against values worked out by hand: visibility by positions, a row that sees nothing, padding,
 * grouped-query heads, and partial results that merge into the result over all their keys. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

static op_local s_piece(dt_dtype dtype, int ndim, const int64_t *shape, void *data)
{
    op_local t = {.dtype = dtype, .ndim = ndim, .data = data};
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    return t;
}

/* Runs attention_block on q (1, Hq, L, 1), k and v (1, Hkv, S, 1), positions (1, L) and (1, S),
 * with accumulators when o_acc is not NULL; writes o (Hq * L) and lse (Hq * L). */
static const char *s_block(int64_t Hq, int64_t Hkv, int64_t L, int64_t S, const float *q, const float *k,
                           const float *v, const int64_t *q_pos, const int64_t *k_pos, const float *o_acc,
                           const float *lse_acc, bool causal, float *o, float *lse)
{
    op_attrs attrs = {.nints = 1, .ints = {causal}, .nfloats = 1, .floats = {1.0}};
    op_kernel kr = {.def = op_by_id(OP_ID_attention_block), .attrs = &attrs, .nin = o_acc ? 7 : 5, .nout = 2};
    kr.in[0] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, Hq, L, 1}, (void *)q);
    kr.in[1] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, Hkv, S, 1}, (void *)k);
    kr.in[2] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, Hkv, S, 1}, (void *)v);
    kr.in[3] = s_piece(DT_INT64, 2, (int64_t[]){1, L}, (void *)q_pos);
    kr.in[4] = s_piece(DT_INT64, 2, (int64_t[]){1, S}, (void *)k_pos);
    if (o_acc) {
        kr.in[5] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, Hq, L, 1}, (void *)o_acc);
        kr.in[6] = s_piece(DT_FLOAT32, 3, (int64_t[]){1, Hq, L}, (void *)lse_acc);
    }
    kr.out[0] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, Hq, L, 1}, o);
    kr.out[1] = s_piece(DT_FLOAT32, 3, (int64_t[]){1, Hq, L}, lse);
    return cpu_kernel_for(OP_ID_attention_block)(&kr);
}

#define S_NEAR(got, want) cr_expect(fabsf((got) - (float)(want)) <= 1e-5f * (1.0f + fabsf((float)(want))), \
                                    "%s is %.9g, want %.9g", #got, (double)(got), (double)(want))

/* q = (1, 2, 3) at positions (0, 1, -1) against keys k = (0, 1), v = (10, 20) at (0, 1), causal:
 * row 0 sees key 0 only (score 0): o = 10, lse = 0; row 1 sees both (scores 0 and 2):
 * o = (10 + 20 e^2) / (1 + e^2), lse = log(1 + e^2); row 2 sees none: o = 0, lse = -inf. */
Test(attention_block, causal_by_position_and_a_row_that_sees_nothing)
{
    const float q[3] = {1, 2, 3}, k[2] = {0, 1}, v[2] = {10, 20};
    const int64_t qp[3] = {0, 1, -1}, kp[2] = {0, 1};
    float o[3] = {-7, -7, -7}, lse[3] = {-7, -7, -7};
    cr_assert_null(s_block(1, 1, 3, 2, q, k, v, qp, kp, NULL, NULL, true, o, lse));
    double e2 = exp(2.0);
    S_NEAR(o[0], 10.0);
    S_NEAR(lse[0], 0.0);
    S_NEAR(o[1], (10.0 + 20.0 * e2) / (1.0 + e2));
    S_NEAR(lse[1], log(1.0 + e2));
    cr_expect_eq(o[2], 0.0f, "a row that sees nothing gives zeros, got %g", (double)o[2]);
    cr_expect(isinf(lse[2]) && lse[2] < 0, "and lse = -inf, got %g", (double)lse[2]);
}

/* Not causal, key 1 an empty slot (-1): every row sees key 0 alone: o = 10, lse = q * 0 = 0. */
Test(attention_block, padding_hides_a_key)
{
    const float q[3] = {1, 2, 3}, k[2] = {0, 1}, v[2] = {10, 20};
    const int64_t qp[3] = {0, 1, -1}, kp[2] = {0, -1};
    float o[3], lse[3];
    cr_assert_null(s_block(1, 1, 3, 2, q, k, v, qp, kp, NULL, NULL, false, o, lse));
    for (int i = 0; i < 3; i++) {
        S_NEAR(o[i], 10.0);
        S_NEAR(lse[i], 0.0);
    }
}

/* Two query heads share one key/value head: head 1's q = 2 against keys (0, 1): scores (0, 2). */
Test(attention_block, grouped_query_heads)
{
    const float q[2] = {0, 2}, k[2] = {0, 1}, v[2] = {10, 20};
    const int64_t qp[1] = {5}, kp[2] = {0, 1};
    float o[2], lse[2];
    cr_assert_null(s_block(2, 1, 1, 2, q, k, v, qp, kp, NULL, NULL, true, o, lse));
    double e2 = exp(2.0);
    S_NEAR(o[0], 15.0);
    S_NEAR(lse[0], log(2.0));
    S_NEAR(o[1], (10.0 + 20.0 * e2) / (1.0 + e2));
    S_NEAR(lse[1], log(1.0 + e2));
}

/* Key 0 as one block and key 1 as another, merged by the accumulators and by attention_merge, give
 * the result over both keys; an empty block changes nothing. */
Test(attention_block, blocks_merge_into_one)
{
    const float q[3] = {1, 2, 3}, k[2] = {0, 1}, v[2] = {10, 20};
    const int64_t qp[3] = {0, 1, -1}, kp[2] = {0, 1};
    float whole_o[3], whole_lse[3], a_o[3], a_lse[3], b_o[3], b_lse[3], o[3], lse[3];
    cr_assert_null(s_block(1, 1, 3, 2, q, k, v, qp, kp, NULL, NULL, true, whole_o, whole_lse));
    cr_assert_null(s_block(1, 1, 3, 1, q, k, v, qp, kp, NULL, NULL, true, a_o, a_lse));
    cr_assert_null(s_block(1, 1, 3, 1, q, k + 1, v + 1, qp, kp + 1, NULL, NULL, true, b_o, b_lse));
    cr_expect(isinf(b_lse[0]) && b_o[0] == 0.0f, "row 0 cannot see key 1 alone");
    cr_assert_null(s_block(1, 1, 3, 1, q, k + 1, v + 1, qp, kp + 1, a_o, a_lse, true, o, lse));
    for (int i = 0; i < 2; i++) {
        S_NEAR(o[i], whole_o[i]);
        S_NEAR(lse[i], whole_lse[i]);
    }
    cr_expect(o[2] == 0.0f && isinf(lse[2]), "a row that sees nothing in either block stays o = 0, lse = -inf");
    float again_o[3], again_lse[3];
    cr_assert_null(s_block(1, 1, 3, 0, q, k, v, qp, kp, o, lse, true, again_o, again_lse));
    for (int i = 0; i < 3; i++)
        cr_expect(again_o[i] == o[i] && again_lse[i] == lse[i], "an empty block left row %d as it was", i);

    /* attention_merge of the two partial results stacked along dim 0: (2 * 1, 1, 3, 1) */
    float parts_o[6], parts_lse[6];
    memcpy(parts_o, a_o, sizeof a_o);
    memcpy(parts_o + 3, b_o, sizeof b_o);
    memcpy(parts_lse, a_lse, sizeof a_lse);
    memcpy(parts_lse + 3, b_lse, sizeof b_lse);
    op_attrs attrs = {.nints = 1, .ints = {2}};
    op_kernel mk = {.def = op_by_id(OP_ID_attention_merge), .attrs = &attrs, .nin = 2, .nout = 2};
    mk.in[0] = s_piece(DT_FLOAT32, 4, (int64_t[]){2, 1, 3, 1}, parts_o);
    mk.in[1] = s_piece(DT_FLOAT32, 3, (int64_t[]){2, 1, 3}, parts_lse);
    mk.out[0] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, 1, 3, 1}, o);
    mk.out[1] = s_piece(DT_FLOAT32, 3, (int64_t[]){1, 1, 3}, lse);
    cr_assert_null(cpu_kernel_for(OP_ID_attention_merge)(&mk));
    for (int i = 0; i < 2; i++) {
        S_NEAR(o[i], whole_o[i]);
        S_NEAR(lse[i], whole_lse[i]);
    }
    cr_expect(o[2] == 0.0f && isinf(lse[2]) && !isnan(o[2]), "merging two rows that see nothing gives no NaN");
}

/* Pieces that do not fit (an index of the wrong length) fail the kernel instead of reading past them. */
Test(attention_block, pieces_that_do_not_fit)
{
    const float q[3] = {1, 2, 3}, k[2] = {0, 1}, v[2] = {10, 20};
    const int64_t qp[3] = {0, 1, -1}, kp[2] = {0, 1};
    float o[3], lse[3];
    op_attrs attrs = {.nints = 1, .ints = {1}, .nfloats = 1, .floats = {1.0}};
    op_kernel kr = {.def = op_by_id(OP_ID_attention_block), .attrs = &attrs, .nin = 5, .nout = 2};
    kr.in[0] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, 1, 3, 1}, (void *)q);
    kr.in[1] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, 1, 2, 1}, (void *)k);
    kr.in[2] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, 1, 2, 1}, (void *)v);
    kr.in[3] = s_piece(DT_INT64, 2, (int64_t[]){1, 2}, (void *)qp);
    kr.in[4] = s_piece(DT_INT64, 2, (int64_t[]){1, 2}, (void *)kp);
    kr.out[0] = s_piece(DT_FLOAT32, 4, (int64_t[]){1, 1, 3, 1}, o);
    kr.out[1] = s_piece(DT_FLOAT32, 3, (int64_t[]){1, 1, 3}, lse);
    cr_expect_not_null(cpu_kernel_for(OP_ID_attention_block)(&kr));
}
