/* The CPU kernels of the products with quantized weights (linear_int8, linear_int4) against
 * products in double written from the storage rules (ops/op_table.h's OP_QUANT), a row by hand,
 * and pieces that do not fit refused with a reason. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "op_registry.h"

/* A kernel record over the given pieces: x (M, Kx), qweight (N, words) int32, scale (N[, G]),
 * out (M, N), an optional bias (N,); ctx = [add bias, k0]. */
static op_kernel s_record(int op, int64_t M, int64_t Kx, int64_t N, int64_t words, int64_t groups, void *x, void *q,
                          float *scale, float *bias, float *out, int64_t k0)
{
    static op_attrs attrs;
    op_kernel k = {.def = op_by_id(op), .attrs = &attrs, .nin = bias ? 4 : 3, .nout = 1, .nctx = 2};
    k.ctx[0] = bias != NULL;
    k.ctx[1] = k0;
    k.in[0] = (op_local){.dtype = DT_FLOAT32, .ndim = 2, .shape = {M, Kx}, .data = x};
    k.in[1] = (op_local){.dtype = DT_INT32, .ndim = 2, .shape = {N, words}, .data = q};
    k.in[2] = op == OP_ID_linear_int8 ? (op_local){.dtype = DT_FLOAT32, .ndim = 1, .shape = {N}, .data = scale}
                                      : (op_local){.dtype = DT_FLOAT32, .ndim = 2, .shape = {N, groups}, .data = scale};
    k.in[3] = (op_local){.dtype = DT_FLOAT32, .ndim = 1, .shape = {N}, .data = bias};
    k.out[0] = (op_local){.dtype = DT_FLOAT32, .ndim = 2, .shape = {M, N}, .data = out};
    return k;
}

/* One row by hand: x = [1, 2, 3, 4, 5], int8 q = [1, -2, 127, -127, 0] scale 0.5:
 * (1 - 4 + 381 - 508 + 0) * 0.5 = -65; plus bias 1 = -64. int4 over the same x, bytes 0xe1 (1, -2),
 * 0x87 (7, -8), 0xf3 (3, then padding: never read), scale 0.25: (1 - 4 + 21 - 32 + 15) * 0.25 = 0.25. */
Test(quant, one_row_by_hand)
{
    float x[5] = {1, 2, 3, 4, 5}, scale = 0.5f, bias = 1.0f, out = 0;
    int8_t q8[8] = {1, -2, 127, -127, 0, 99, 99, 99}; /* the padding is never read into the sum */
    op_kernel k = s_record(OP_ID_linear_int8, 1, 5, 1, 2, 1, x, q8, &scale, &bias, &out, 0);
    cr_assert_null(cpu_kernel_for(OP_ID_linear_int8)(&k));
    cr_expect_eq(out, -64.0f, "int8: %g", out);
    uint8_t q4[4] = {0xe1, 0x87, 0xf3, 0xff};
    float s4 = 0.25f;
    k = s_record(OP_ID_linear_int4, 1, 5, 1, 1, 1, x, q4, &s4, NULL, &out, 0);
    cr_assert_null(cpu_kernel_for(OP_ID_linear_int4)(&k));
    cr_expect_eq(out, 0.25f, "int4: %g", out);
}

/* int4 quantizes up to 8 input rows per whole group of 32 features, by hand: x = [2.54, 0.333,
 * then 30 ones] has scale 2.54 / 127 = 0.02 and bytes [127, rint(16.65) = 17, 50 x 30]; every weight
 * 1 (bytes 0x11) at scale 0.5: (127 + 17 + 1500) * 0.02 * 0.5 = 16.44, where float inputs would
 * give (2.54 + 0.333 + 30) * 0.5 = 16.4365. Past the last whole group features stay float: with
 * K = 34 and x[32..33] = 0.333, the tail adds 2 * 0.333 * 0.5 = 0.333 exactly as given. */
Test(quant, int4_inputs_quantized_by_hand)
{
    float x[34], scale[2] = {0.5f, 0.5f}, out = 0;
    for (int i = 0; i < 34; i++)
        x[i] = i == 0 ? 2.54f : i == 1 || i >= 32 ? 0.333f : 1.0f;
    uint8_t q[20];
    memset(q, 0x11, sizeof q);
    op_kernel k = s_record(OP_ID_linear_int4, 1, 32, 1, 4, 1, x, q, scale, NULL, &out, 0);
    cr_assert_null(cpu_kernel_for(OP_ID_linear_int4)(&k));
    cr_expect(fabsf(out - 16.44f) < 1e-4f, "one group: %.6f", out);
    k = s_record(OP_ID_linear_int4, 1, 34, 1, 5, 2, x, q, scale, NULL, &out, 0);
    cr_assert_null(cpu_kernel_for(OP_ID_linear_int4)(&k));
    cr_expect(fabsf(out - (16.44f + 0.333f)) < 1e-4f, "a group and a tail: %.6f", out);
    /* a group holding a NaN or an infinity has no scale: the product is NaN, not some number */
    for (int bad = 0; bad < 2; bad++) {
        x[5] = bad ? INFINITY : NAN;
        k = s_record(OP_ID_linear_int4, 1, 32, 1, 4, 1, x, q, scale, NULL, &out, 0);
        cr_assert_null(cpu_kernel_for(OP_ID_linear_int4)(&k));
        cr_expect(isnan(out), "x[5] = %g: %g", x[5], out);
    }
}

static double s_weight(int bits, const uint8_t *row, int64_t k, const float *scale)
{
    if (bits == 8)
        return (double)(int8_t)row[k] * scale[0];
    int nibble = k % 2 ? row[k / 2] >> 4 : row[k / 2] & 15;
    return (double)(nibble >= 8 ? nibble - 16 : nibble) * scale[k / 32];
}

/* The input feature j of a row as the product uses it: int4 quantizes whole groups of 32 (scale
 * max|x_group| / 127, values rint(x * 127 / max|x_group|), in float32 as the rule says), everything
 * else is used as given. */
static void s_inputs(int bits, const float *x, int64_t K, double *used)
{
    for (int64_t j = 0; j < K; j++)
        used[j] = x[j];
    if (bits != 4)
        return;
    for (int64_t g = 0; g + 32 <= K; g += 32) {
        float amax = 0;
        for (int64_t j = g; j < g + 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        for (int64_t j = g; j < g + 32; j++)
            used[j] = amax > 0 ? (double)rintf(x[j] * (127.0f / amax)) * (double)(amax / 127.0f) : 0.0;
    }
}

/* Random weights and inputs for M rows of 1 to 8 (the streaming path, one code path per count)
 * and 9, 17 and 41 (int8: blocks through sgemm, 263 rows of weight: a block of 256 and one of 7;
 * int4: 71 rows, blocks of 16 weight rows and a last of 7, passed by groups of 8 rows and a rest),
 * K not a multiple of 8, 16 or 32, and a weight whose features start k0 = 4 (8) into the input (its
 * last K): every output within 1e-5 of the sum of its terms' magnitudes of the double product over
 * the inputs as s_inputs uses them. */
Test(quant, products_against_double)
{
    srand(7);
    int64_t Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 41}, Ks[] = {5, 37, 67, 96, 197};
    for (int bits = 8; bits >= 4; bits -= 4) {
        int64_t N = bits == 8 ? 263 : 71;
        int op = bits == 8 ? OP_ID_linear_int8 : OP_ID_linear_int4;
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
                for (int64_t k0 = 0; k0 <= bits; k0 += bits) {
                    int64_t M = Ms[mi], K = Ks[ki], Kx = K + k0, words = (K + (bits == 8 ? 3 : 7)) / (bits == 8 ? 4 : 8);
                    int64_t groups = bits == 8 ? 1 : (K + 31) / 32, rb = words * 4;
                    float *x = malloc(sizeof(float) * (size_t)(M * Kx)), *out = malloc(sizeof(float) * (size_t)(M * N));
                    float *scale = malloc(sizeof(float) * (size_t)(N * groups)), *bias = malloc(sizeof(float) * (size_t)N);
                    uint8_t *q = malloc((size_t)(N * rb));
                    for (int64_t i = 0; i < M * Kx; i++)
                        x[i] = (float)rand() / RAND_MAX * 2 - 1;
                    for (int64_t i = 0; i < N * rb; i++)
                        q[i] = (uint8_t)rand();
                    for (int64_t i = 0; i < N * groups; i++)
                        scale[i] = (float)rand() / RAND_MAX * 0.02f;
                    for (int64_t i = 0; i < N; i++)
                        bias[i] = (float)i;
                    op_kernel k = s_record(op, M, Kx, N, words, groups, x, q, scale, bias, out, k0);
                    const char *why = cpu_kernel_for(op)(&k);
                    cr_assert_null(why, "bits %d M %lld K %lld: %s", bits, (long long)M, (long long)K, why);
                    double *used = malloc(sizeof(double) * (size_t)K);
                    for (int64_t m = 0; m < M; m++)
                        for (int64_t n = 0; n < N; n++) {
                            double want = bias[n], mag = fabs(bias[n]);
                            s_inputs(bits, x + m * Kx + k0, K, used);
                            for (int64_t j = 0; j < K; j++) {
                                double t = used[j] * s_weight(bits, q + n * rb, j, scale + n * groups);
                                want += t;
                                mag += fabs(t);
                            }
                            cr_expect(fabs(out[m * N + n] - want) <= 1e-5 * mag + 1e-6,
                                      "bits %d M %lld K %lld k0 %lld (%lld, %lld): %g, want %g", bits, (long long)M,
                                      (long long)K, (long long)k0, (long long)m, (long long)n, out[m * N + n], want);
                        }
                    free(used);
                    free(x);
                    free(out);
                    free(scale);
                    free(bias);
                    free(q);
                }
    }
}

/* int4 computes every input row with the same per-row code whatever the rows beside it: a prompt's
 * 41 rows (blocks of weight rows, groups of 8 input rows and a rest) give each row the very bits
 * that row alone gives (decode's path), over 3 whole groups and a float tail. */
Test(quant, int4_row_alone_equals_row_in_a_prompt)
{
    srand(11);
    enum { M = 41, K = 100, N = 37, WORDS = (K + 7) / 8, G = (K + 31) / 32 };
    static float x[M * K], scale[N * G], all[M * N];
    static uint8_t q[N * WORDS * 4];
    for (int i = 0; i < M * K; i++)
        x[i] = (float)rand() / RAND_MAX * 4 - 2;
    for (size_t i = 0; i < sizeof q; i++)
        q[i] = (uint8_t)rand();
    for (int i = 0; i < N * G; i++)
        scale[i] = (float)rand() / RAND_MAX * 0.1f;
    op_kernel k = s_record(OP_ID_linear_int4, M, K, N, WORDS, G, x, q, scale, NULL, all, 0);
    cr_assert_null(cpu_kernel_for(OP_ID_linear_int4)(&k));
    for (int m = 0; m < M; m++) {
        float one[N];
        k = s_record(OP_ID_linear_int4, 1, K, N, WORDS, G, x + m * K, q, scale, NULL, one, 0);
        cr_assert_null(cpu_kernel_for(OP_ID_linear_int4)(&k));
        for (int n = 0; n < N; n++)
            cr_expect_eq(all[m * N + n], one[n], "row %d output %d: %.9g among 41 rows, %.9g alone", m, n,
                         all[m * N + n], one[n]);
    }
}

/* What a record from a socket may name: every misfit is refused with a reason before a byte is
 * read (the pieces here are too small for what the shapes would read if taken at their word). */
Test(quant, refuses_pieces_that_do_not_fit)
{
    float x[128] = {0}, scale[8] = {0}, bias[4] = {0}, out[64];
    int32_t q[16] = {0};
    struct {
        int op;
        int64_t M, Kx, N, words, groups, k0;
        int nctx;
        bool fits;
    } cases[] = {
        {OP_ID_linear_int8, 2, 8, 2, 2, 1, 0, 2, true},
        {OP_ID_linear_int8, 2, 8, 2, 3, 1, 0, 2, false},  /* more words than the input's features */
        {OP_ID_linear_int8, 2, 8, 2, 1, 1, 0, 2, true},   /* fewer: the first 4 (a piece of a split) */
        {OP_ID_linear_int8, 2, 8, 2, 2, 1, 9, 2, false},  /* the features start past the input */
        {OP_ID_linear_int8, 2, 8, 2, 2, 1, -1, 2, false}, /* before it */
        {OP_ID_linear_int8, 2, 8, 2, 2, 1, 4, 2, false},  /* two words for the 4 features from 4 on */
        {OP_ID_linear_int8, 2, 8, 2, 1, 1, 4, 2, true},   /* one */
        {OP_ID_linear_int8, 2, 8, 2, 2, 1, 0, 1, false},  /* no ctx */
        {OP_ID_linear_int4, 2, 8, 2, 1, 1, 0, 2, true},
        {OP_ID_linear_int4, 2, 8, 2, 1, 2, 0, 2, false},  /* more scales than groups */
        {OP_ID_linear_int4, 2, 40, 1, 5, 1, 0, 2, false}, /* 40 features are two groups */
        {OP_ID_linear_int4, 2, 40, 1, 5, 2, 0, 2, true},
        {OP_ID_linear_int4, 2, 8, 2, (int64_t)1 << 60, 1, 0, 2, false}, /* words past any input */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        op_kernel k = s_record(cases[i].op, cases[i].M, cases[i].Kx, cases[i].N, cases[i].words, cases[i].groups, x,
                               q, scale, bias, out, cases[i].k0);
        k.nctx = cases[i].nctx;
        const char *why = cpu_kernel_for(cases[i].op)(&k);
        cr_expect((why == NULL) == cases[i].fits, "case %zu: %s", i, why ? why : "ran");
    }
    /* the wrong dtypes and ranks */
    op_kernel k = s_record(OP_ID_linear_int8, 2, 8, 2, 2, 1, x, q, scale, NULL, out, 0);
    k.in[1].dtype = DT_FLOAT32;
    cr_expect_not_null(cpu_kernel_for(OP_ID_linear_int8)(&k));
    k = s_record(OP_ID_linear_int8, 2, 8, 2, 2, 1, x, q, scale, NULL, out, 0);
    k.in[2].ndim = 2;
    cr_expect_not_null(cpu_kernel_for(OP_ID_linear_int8)(&k));
    k = s_record(OP_ID_linear_int8, 2, 8, 2, 2, 1, x, q, scale, NULL, out, 0);
    k.out[0].shape[1] = 3;
    cr_expect_not_null(cpu_kernel_for(OP_ID_linear_int8)(&k));
    k = s_record(OP_ID_linear_int8, 2, 8, 2, 2, 1, x, q, scale, bias, out, 0);
    k.in[3].shape[0] = 3;
    cr_expect_not_null(cpu_kernel_for(OP_ID_linear_int8)(&k));
}
