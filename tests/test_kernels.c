/* CPU kernels against hand-computed values; random numbers against the Philox known answers. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_matmul.h"
#include "cpu_ops.h"
#include "cpu_reduce_loops.h"
#include "cpu_rope.h"
#include "dt_dtype.h"
#include "op_pointwise_math.h"

#define S_INT(v) ((dt_scalar){.is_int = true, .i = (v)})
#define S_FLT(v) ((dt_scalar){.is_int = false, .f = (v)})

static uint32_t s_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- fill --------------------------------------------------------------------------------- */

Test(fill, float32)
{
    float v[5] = {0};
    cpu_fill(v, DT_FLOAT32, 4, S_FLT(1.0 / 3.0));
    for (int i = 0; i < 4; i++)
        cr_expect_eq(s_f32_bits(v[i]), 0x3eaaaaabu);
    cr_expect_eq(v[4], 0.0f, "wrote past n");
    cpu_fill(v, DT_FLOAT32, 2, S_INT(-7));
    cr_expect_eq(v[0], -7.0f);
    cr_expect_eq(v[1], -7.0f);
    cr_expect_eq(v[2], 1.0f / 3.0f);
}

Test(fill, float16)
{
    uint16_t v[3] = {0};
    cpu_fill(v, DT_FLOAT16, 2, S_FLT(1.0 / 3.0));
    cr_expect_eq(v[0], 0x3555);
    cr_expect_eq(v[1], 0x3555);
    cr_expect_eq(v[2], 0);
    cpu_fill(v, DT_FLOAT16, 1, S_INT(65504));
    cr_expect_eq(v[0], 0x7bff);
    cpu_fill(v, DT_FLOAT16, 1, S_INT(70000));
    cr_expect_eq(v[0], 0x7c00);
    cpu_fill(v, DT_FLOAT16, 1, S_FLT(-0.0));
    cr_expect_eq(v[0], 0x8000);
    /* 1 + 2^-11 + 2^-40 is just above a tie: through float it would look like the tie itself */
    cpu_fill(v, DT_FLOAT16, 1, S_FLT(1.0 + 0x1p-11 + 0x1p-40));
    cr_expect_eq(v[0], 0x3c01);
    cpu_fill(v, DT_FLOAT16, 1, S_FLT(1.0 + 0x1p-11));
    cr_expect_eq(v[0], 0x3c00);
    cpu_fill(v, DT_FLOAT16, 1, S_FLT(1.0 + 3 * 0x1p-11));
    cr_expect_eq(v[0], 0x3c02);
    cpu_fill(v, DT_FLOAT16, 1, S_FLT(NAN));
    cr_expect((v[0] & 0x7c00) == 0x7c00 && (v[0] & 0x3ff));
    cpu_fill(v, DT_FLOAT16, 1, S_FLT(1e300));
    cr_expect_eq(v[0], 0x7c00);
}

Test(fill, bfloat16)
{
    uint16_t v[3] = {0};
    cpu_fill(v, DT_BFLOAT16, 2, S_FLT(1.0 / 3.0));
    cr_expect_eq(v[0], 0x3eab);
    cr_expect_eq(v[1], 0x3eab);
    cr_expect_eq(v[2], 0);
    cpu_fill(v, DT_BFLOAT16, 1, S_INT(1));
    cr_expect_eq(v[0], 0x3f80);
    cpu_fill(v, DT_BFLOAT16, 1, S_INT(257)); /* tie between 256 and 258: even is 256 */
    cr_expect_eq(v[0], 0x4380);
    cpu_fill(v, DT_BFLOAT16, 1, S_FLT(1.0 + 0x1p-8 + 0x1p-40));
    cr_expect_eq(v[0], 0x3f81);
    cpu_fill(v, DT_BFLOAT16, 1, S_FLT(-1e300));
    cr_expect_eq(v[0], 0xff80);
    cpu_fill(v, DT_BFLOAT16, 1, S_FLT(0.1));
    cr_expect_eq(v[0], 0x3dcd); /* 0.1f = 0x3dcccccd */
}

Test(fill, integers)
{
    int32_t a[3] = {0};
    cpu_fill(a, DT_INT32, 2, S_FLT(-2.7));
    cr_expect_eq(a[0], -2);
    cr_expect_eq(a[1], -2);
    cr_expect_eq(a[2], 0);
    cpu_fill(a, DT_INT32, 1, S_FLT(3.9));
    cr_expect_eq(a[0], 3);
    cpu_fill(a, DT_INT32, 1, S_INT(-123456));
    cr_expect_eq(a[0], -123456);

    int64_t b[2] = {0};
    cpu_fill(b, DT_INT64, 2, S_INT(INT64_C(1) << 60 | 1));
    cr_expect_eq(b[0], (INT64_C(1) << 60) + 1);
    cr_expect_eq(b[1], (INT64_C(1) << 60) + 1);
    cpu_fill(b, DT_INT64, 1, S_FLT(-1e300)); /* saturates instead of undefined behaviour */
    cr_expect_eq(b[0], INT64_MIN);
    cpu_fill(b, DT_INT64, 1, S_FLT(NAN));
    cr_expect_eq(b[0], 0);
}

Test(fill, bool_and_empty)
{
    bool v[4] = {false, false, false, true};
    cpu_fill(v, DT_BOOL, 3, S_FLT(0.5));
    cr_expect(v[0] && v[1] && v[2]);
    cpu_fill(v, DT_BOOL, 2, S_INT(0));
    cr_expect(!v[0] && !v[1] && v[2]);
    cpu_fill(v, DT_BOOL, 1, S_FLT(-0.0));
    cr_expect(!v[0]);
    cpu_fill(v, DT_BOOL, 1, S_INT(-3));
    cr_expect(v[0]);
    cpu_fill(v, DT_BOOL, 0, S_INT(0));
    cr_expect(v[0]);
}

/* ---- arange ------------------------------------------------------------------------------- */

Test(arange, float32_with_offset)
{
    float v[4];
    cpu_arange(v, DT_FLOAT32, 4, 2, S_FLT(0.5), S_FLT(0.25));
    cr_expect_eq(v[0], 1.0f);
    cr_expect_eq(v[1], 1.25f);
    cr_expect_eq(v[2], 1.5f);
    cr_expect_eq(v[3], 1.75f);
    cpu_arange(v, DT_FLOAT32, 3, 0, S_INT(-3), S_FLT(-0.5));
    cr_expect_eq(v[0], -3.0f);
    cr_expect_eq(v[1], -3.5f);
    cr_expect_eq(v[2], -4.0f);
}

Test(arange, sixteen_bit)
{
    uint16_t v[2];
    /* 0 + 3 * 0.1 = 0.30000000000000004 */
    cpu_arange(v, DT_FLOAT16, 2, 3, S_FLT(0.0), S_FLT(0.1));
    cr_expect_eq(v[0], 0x34cd); /* 0.3 * 2^2 = 1.2 -> mantissa round(0.2 * 1024) = 205 */
    cr_expect_eq(v[1], 0x3666); /* 0.4 * 2^2 = 1.6 -> round(0.6 * 1024) = 614 = 0x266 */
    cpu_arange(v, DT_BFLOAT16, 2, 3, S_FLT(0.0), S_FLT(0.1));
    cr_expect_eq(v[0], 0x3e9a); /* 0.3f = 0x3e99999a */
    cr_expect_eq(v[1], 0x3ecd); /* 0.4f = 0x3ecccccd */
}

Test(arange, integers)
{
    int64_t a[3];
    cpu_arange(a, DT_INT64, 3, 1, S_INT(10), S_INT(-3));
    cr_expect_eq(a[0], 7);
    cr_expect_eq(a[1], 4);
    cr_expect_eq(a[2], 1);
    int32_t b[4];
    cpu_arange(b, DT_INT32, 4, 0, S_INT(5), S_INT(2));
    cr_expect_eq(b[0], 5);
    cr_expect_eq(b[1], 7);
    cr_expect_eq(b[2], 9);
    cr_expect_eq(b[3], 11);
    /* exact beyond 2^53, where a double would lose the low bit */
    cpu_arange(a, DT_INT64, 2, 0, S_INT((INT64_C(1) << 53) + 1), S_INT(2));
    cr_expect_eq(a[0], (INT64_C(1) << 53) + 1);
    cr_expect_eq(a[1], (INT64_C(1) << 53) + 3);
}

/* ---- strides and block copies --------------------------------------------------------------- */

Test(copy, contiguous_strides)
{
    int64_t s[3];
    cpu_contiguous_strides(3, (int64_t[]){2, 3, 4}, 4, s);
    cr_expect_eq(s[0], 48);
    cr_expect_eq(s[1], 16);
    cr_expect_eq(s[2], 4);
    cpu_contiguous_strides(3, (int64_t[]){2, 0, 3}, 2, s);
    cr_expect_eq(s[0], 6);
    cr_expect_eq(s[1], 6);
    cr_expect_eq(s[2], 2);
}

Test(copy, transpose)
{
    int32_t src[12], dst[12];
    for (int i = 0; i < 12; i++)
        src[i] = i;
    memset(dst, 0xff, sizeof dst);
    /* element (i, j) of the 3x4 source lands at (j, i) of a 4x3 destination */
    cpu_copy_block(dst, (int64_t[]){4, 12}, src, (int64_t[]){16, 4}, 2, (int64_t[]){3, 4}, 4);
    int32_t want[12] = {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11};
    for (int i = 0; i < 12; i++)
        cr_expect_eq(dst[i], want[i], "dst[%d]", i);
}

Test(copy, sub_block_3d)
{
    int16_t big[4][5][6];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            for (int k = 0; k < 6; k++)
                big[i][j][k] = (int16_t)(i * 100 + j * 10 + k);
    int16_t block[2][3][2];
    int64_t bs[3];
    cpu_contiguous_strides(3, (int64_t[]){2, 3, 2}, 2, bs);
    cpu_copy_block(block, bs, &big[1][2][3], (int64_t[]){60, 12, 2}, 3, (int64_t[]){2, 3, 2}, 2);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++)
                cr_expect_eq(block[a][b][c], (1 + a) * 100 + (2 + b) * 10 + 3 + c);

    /* and back: pasting into a strided destination leaves everything else alone */
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++)
                block[a][b][c] = -1;
    cpu_copy_block(&big[2][1][0], (int64_t[]){60, 12, 2}, block, bs, 3, (int64_t[]){2, 3, 2}, 2);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            for (int k = 0; k < 6; k++) {
                bool inside = i >= 2 && j >= 1 && j < 4 && k < 2;
                cr_expect_eq(big[i][j][k], inside ? -1 : i * 100 + j * 10 + k, "[%d][%d][%d]", i, j, k);
            }
}

Test(copy, strided_inner_and_negative)
{
    int32_t src[8] = {0, 1, 2, 3, 4, 5, 6, 7}, dst[4] = {0};
    cpu_copy_block(dst, (int64_t[]){4}, src + 1, (int64_t[]){8}, 1, (int64_t[]){4}, 4);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(dst[i], 2 * i + 1);
    cpu_copy_block(dst, (int64_t[]){4}, src + 7, (int64_t[]){-4}, 1, (int64_t[]){4}, 4);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(dst[i], 7 - i);
    /* a size-1 dim with a meaningless stride still allows the single memcpy */
    cpu_copy_block(dst, (int64_t[]){999, 4}, src + 2, (int64_t[]){-5, 4}, 2, (int64_t[]){1, 4}, 4);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(dst[i], 2 + i);
}

/* A stack along the last dim: each element of a source lands every other element of the
 * destination, for elements of 1, 2, 4 and 8 bytes (moves of a constant size) and chunks of 12
 * (three 4-byte elements contiguous in both, strided past them: memcpy of the chunk). */
Test(copy, interleaved_elements_of_every_size)
{
    uint8_t src[96], dst[192];
    for (int i = 0; i < 96; i++)
        src[i] = (uint8_t)(i + 1);
    const int64_t sizes[] = {1, 2, 4, 8, 12};
    for (int t = 0; t < 5; t++) {
        int64_t es = sizes[t], n = 96 / es;
        memset(dst, 0, sizeof dst);
        cpu_copy_block(dst, (int64_t[]){2 * es}, src, (int64_t[]){es}, 1, (int64_t[]){n}, (size_t)es);
        for (int64_t i = 0; i < 2 * 96; i++) {
            int64_t element = i / es, byte = i % es;
            int want = element % 2 ? 0 : src[(element / 2) * es + byte];
            cr_assert_eq(dst[i], want, "%ld-byte elements, byte %ld", (long)es, (long)i);
        }
    }
}

Test(copy, contiguous_scalar_and_empty)
{
    double src[6] = {1, 2, 3, 4, 5, 6}, dst[6] = {0};
    int64_t s[2];
    cpu_contiguous_strides(2, (int64_t[]){2, 3}, 8, s);
    cpu_copy_block(dst, s, src, s, 2, (int64_t[]){2, 3}, 8);
    cr_expect_arr_eq(dst, src, sizeof src);

    double one = 42, out = 0;
    cpu_copy_block(&out, NULL, &one, NULL, 0, NULL, 8);
    cr_expect_eq(out, 42);

    double untouched[6] = {0};
    cpu_copy_block(untouched, (int64_t[]){48, 16, 8}, src, (int64_t[]){48, 16, 8}, 3, (int64_t[]){3, 0, 2}, 8);
    for (int i = 0; i < 6; i++)
        cr_expect_eq(untouched[i], 0);
}

/* ---- reductions --------------------------------------------------------------------------- */

Test(reduce, float32)
{
    float acc[3] = {1, 2.5f, -1};
    cpu_combine_pieces(acc, acc, (float[]){2, 0.5f, 1}, DT_FLOAT32, 3, DT_REDUCE_SUM);
    cr_expect(acc[0] == 3 && acc[1] == 3 && acc[2] == 0);

    float x[4] = {1, NAN, 3, -INFINITY}, y[4] = {2, 1, NAN, -5};
    float mx[4], mn[4];
    memcpy(mx, x, sizeof x);
    memcpy(mn, x, sizeof x);
    cpu_combine_pieces(mx, mx, y, DT_FLOAT32, 4, DT_REDUCE_MAX);
    cpu_combine_pieces(mn, mn, y, DT_FLOAT32, 4, DT_REDUCE_MIN);
    cr_expect(mx[0] == 2 && isnan(mx[1]) && isnan(mx[2]) && mx[3] == -5);
    cr_expect(mn[0] == 1 && isnan(mn[1]) && isnan(mn[2]) && mn[3] == -INFINITY);

    /* out of place: dst gets a (op) b, a and b stay as they were */
    float dst[4] = {9, 9, 9, 9};
    cpu_combine_pieces(dst, x, y, DT_FLOAT32, 4, DT_REDUCE_SUM);
    cr_expect(dst[0] == 3 && isnan(dst[1]) && isnan(dst[2]) && dst[3] == -INFINITY);
    cr_expect(x[0] == 1 && y[0] == 2 && x[2] == 3 && y[3] == -5);
    cpu_combine_pieces(dst, y, x, DT_FLOAT32, 4, DT_REDUCE_MAX);
    cr_expect(dst[0] == 2 && isnan(dst[1]) && isnan(dst[2]) && dst[3] == -5);

    float avg[2] = {3, -1};
    cpu_combine_pieces(avg, avg, (float[]){0, 2}, DT_FLOAT32, 2, DT_REDUCE_AVG);
    cpu_scale_div(avg, DT_FLOAT32, 2, 2);
    cr_expect(avg[0] == 1.5f && avg[1] == 0.5f);
}

Test(reduce, float16)
{
    /* 1 + 2^-11 ties to 1; (1 + 2^-10) + 2^-11 ties up to 1 + 2^-9 */
    uint16_t acc[2] = {0x3c00, 0x3c01};
    cpu_combine_pieces(acc, acc, (uint16_t[]){0x1000, 0x1000}, DT_FLOAT16, 2, DT_REDUCE_SUM);
    cr_expect_eq(acc[0], 0x3c00);
    cr_expect_eq(acc[1], 0x3c02);

    uint16_t x[3] = {0x3c00, 0x7e00, 0xbc00}, y[3] = {0x4000, 0x3c00, 0x7e01};
    uint16_t mx[3], mn[3];
    memcpy(mx, x, sizeof x);
    memcpy(mn, x, sizeof x);
    cpu_combine_pieces(mx, mx, y, DT_FLOAT16, 3, DT_REDUCE_MAX);
    cpu_combine_pieces(mn, mn, y, DT_FLOAT16, 3, DT_REDUCE_MIN);
    cr_expect(mx[0] == 0x4000 && isnan(dt_f16_to_f32(mx[1])) && isnan(dt_f16_to_f32(mx[2])));
    cr_expect(mn[0] == 0x3c00 && isnan(dt_f16_to_f32(mn[1])) && isnan(dt_f16_to_f32(mn[2])));

    uint16_t three = 0x4200;
    cpu_scale_div(&three, DT_FLOAT16, 1, 2);
    cr_expect_eq(three, 0x3e00);
}

Test(reduce, bfloat16)
{
    /* 2^-8 is 0x3b80: 1 + 2^-8 ties to 1; (1 + 2^-7) + 2^-8 ties up to 1 + 2^-6 */
    uint16_t acc[2] = {0x3f80, 0x3f81};
    cpu_combine_pieces(acc, acc, (uint16_t[]){0x3b80, 0x3b80}, DT_BFLOAT16, 2, DT_REDUCE_AVG);
    cr_expect_eq(acc[0], 0x3f80);
    cr_expect_eq(acc[1], 0x3f82);

    /* tp's all-reduce on whole vectors and a tail, each pair from a hand table: the ties above, a
     * NaN stays NaN, infinities, subnormals kept (not flushed), -0 + -0 = -0, overflow to inf */
    static const uint16_t table[][3] = {{0x3f80, 0x3b80, 0x3f80}, {0x3f81, 0x3b80, 0x3f82}, {0x7fc1, 0x3f80, 0x7fc1},
                                        {0x7f80, 0x3f80, 0x7f80}, {0x0001, 0x0001, 0x0002}, {0x8000, 0x8000, 0x8000},
                                        {0x7f7f, 0x7f7f, 0x7f80}, {0xc0a0, 0x4020, 0xc020}, {0x0000, 0x8001, 0x8001}};
    enum { N = 37, T = sizeof table / sizeof table[0] };
    uint16_t sa[N], sb[N], sum[N];
    for (int i = 0; i < N; i++) {
        sa[i] = table[i % T][0];
        sb[i] = table[i % T][1];
    }
    cpu_combine_pieces(sum, sa, sb, DT_BFLOAT16, N, DT_REDUCE_SUM);
    for (int i = 0; i < N; i++)
        cr_expect_eq(sum[i], table[i % T][2], "%#x + %#x = %#x, want %#x", sa[i], sb[i], sum[i], table[i % T][2]);

    uint16_t mn[3] = {0x3f80, 0xbf80, 0x3f80};
    cpu_combine_pieces(mn, mn, (uint16_t[]){0x4000, 0x3f80, 0x7fc0}, DT_BFLOAT16, 3, DT_REDUCE_MIN);
    cr_expect(mn[0] == 0x3f80 && mn[1] == 0xbf80 && isnan(dt_bf16_to_f32(mn[2])));
    uint16_t mx[2] = {0xff80, 0x7fc0};
    cpu_combine_pieces(mx, mx, (uint16_t[]){0xc000, 0x3f80}, DT_BFLOAT16, 2, DT_REDUCE_MAX);
    cr_expect(mx[0] == 0xc000 && isnan(dt_bf16_to_f32(mx[1])));

    uint16_t three = 0x4040;
    cpu_scale_div(&three, DT_BFLOAT16, 1, 2);
    cr_expect_eq(three, 0x3fc0);
}

Test(reduce, int32)
{
    int32_t x[3] = {INT32_MAX, -5, 7}, y[3] = {1, 3, -7};
    int32_t s[3], mx[3], mn[3];
    memcpy(s, x, sizeof x);
    memcpy(mx, x, sizeof x);
    memcpy(mn, x, sizeof x);
    cpu_combine_pieces(s, s, y, DT_INT32, 3, DT_REDUCE_SUM);
    cpu_combine_pieces(mx, mx, y, DT_INT32, 3, DT_REDUCE_MAX);
    cpu_combine_pieces(mn, mn, y, DT_INT32, 3, DT_REDUCE_MIN);
    cr_expect(s[0] == INT32_MIN && s[1] == -2 && s[2] == 0);
    cr_expect(mx[0] == INT32_MAX && mx[1] == 3 && mx[2] == 7);
    cr_expect(mn[0] == 1 && mn[1] == -5 && mn[2] == -7);

    int32_t d[3] = {7, -7, 6};
    cpu_scale_div(d, DT_INT32, 3, 2);
    cr_expect(d[0] == 3 && d[1] == -3 && d[2] == 3);
}

Test(reduce, int64)
{
    int64_t x[3] = {INT64_MIN, INT64_C(1) << 40, -1}, y[3] = {-1, 5, -1};
    int64_t s[3], mx[3], mn[3];
    memcpy(s, x, sizeof x);
    memcpy(mx, x, sizeof x);
    memcpy(mn, x, sizeof x);
    cpu_combine_pieces(s, s, y, DT_INT64, 3, DT_REDUCE_AVG);
    cpu_combine_pieces(mx, mx, y, DT_INT64, 3, DT_REDUCE_MAX);
    cpu_combine_pieces(mn, mn, y, DT_INT64, 3, DT_REDUCE_MIN);
    cr_expect(s[0] == INT64_MAX && s[1] == (INT64_C(1) << 40) + 5 && s[2] == -2);
    cr_expect(mx[0] == -1 && mx[1] == INT64_C(1) << 40 && mx[2] == -1);
    cr_expect(mn[0] == INT64_MIN && mn[1] == 5 && mn[2] == -1);

    int64_t d[2] = {-9, 9};
    cpu_scale_div(d, DT_INT64, 2, 4);
    cr_expect(d[0] == -2 && d[1] == 2);
}

Test(reduce, bool)
{
    const bool x[4] = {false, false, true, true}, y[4] = {false, true, false, true};
    const bool any[4] = {false, true, true, true}, all[4] = {false, false, false, true};
    const struct {
        dt_reduce_op op;
        const bool *want;
    } cases[] = {{DT_REDUCE_SUM, any}, {DT_REDUCE_AVG, any}, {DT_REDUCE_MAX, any}, {DT_REDUCE_MIN, all}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bool acc[4];
        memcpy(acc, x, sizeof acc);
        cpu_combine_pieces(acc, acc, y, DT_BOOL, 4, cases[c].op);
        cpu_scale_div(acc, DT_BOOL, 4, 2);
        for (int i = 0; i < 4; i++)
            cr_expect_eq(acc[i], cases[c].want[i], "op %d [%d]", cases[c].op, i);
    }
}

/* ---- random ------------------------------------------------------------------------------- */

Test(random, philox_known_answers)
{
    const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
        uint32_t out[4];
        cpu_philox(kat[k].ctr, kat[k].key, out);
        for (int i = 0; i < 4; i++)
            cr_expect_eq(out[i], kat[k].out[i], "vector %zu word %d: 0x%08x", k, i, out[i]);
    }
}

Test(random, first_element_formula)
{
    /* seed 0, stream 0, index 0 is the first known-answer counter */
    float u;
    cpu_random(&u, DT_FLOAT32, 0, NULL, NULL, NULL, 0, 0, false);
    cr_expect_eq(u, (float)0x6627e8 * 0x1p-24f);
    float z;
    cpu_random(&z, DT_FLOAT32, 0, NULL, NULL, NULL, 0, 0, true);
    double want = sqrt(-2 * log((0x6627e8 + 1) * 0x1p-24)) * cos(2 * 3.14159265358979323846 * 0xe169c5 * 0x1p-24);
    cr_expect_eq(z, (float)want);
    uint16_t h, b;
    cpu_random(&h, DT_FLOAT16, 0, NULL, NULL, NULL, 0, 0, false);
    cpu_random(&b, DT_BFLOAT16, 0, NULL, NULL, NULL, 0, 0, false);
    cr_expect_eq(dt_f16_to_f32(h), (float)(0x6627e8d5u >> 21) * 0x1p-11f);
    cr_expect_eq(dt_bf16_to_f32(b), (float)0x66 * 0x1p-8f);
}

static void s_check_pieces(dt_dtype dtype, bool normal)
{
    enum { R = 7, C = 5 };
    size_t es = dt_dtype_size(dtype);
    const int64_t global[2] = {R, C};
    unsigned char full[R * C * 4];
    cpu_random(full, dtype, 2, global, (int64_t[]){0, 0}, global, 1234, 7, normal);
    const struct {
        int64_t off[2], shape[2];
    } pieces[] = {
        {{0, 0}, {3, 2}}, {{0, 2}, {3, 3}}, {{3, 0}, {4, 5}}, {{7, 0}, {0, 5}},
    };
    int64_t full_strides[2];
    cpu_contiguous_strides(2, global, es, full_strides);
    for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
        unsigned char got[R * C * 4], want[R * C * 4];
        int64_t n = pieces[p].shape[0] * pieces[p].shape[1];
        memset(got, 0xab, sizeof got);
        cpu_random(got, dtype, 2, pieces[p].shape, pieces[p].off, global, 1234, 7, normal);
        int64_t ps[2];
        cpu_contiguous_strides(2, pieces[p].shape, es, ps);
        const unsigned char *corner = full + pieces[p].off[0] * full_strides[0] + pieces[p].off[1] * full_strides[1];
        cpu_copy_block(want, ps, corner, full_strides, 2, pieces[p].shape, es);
        cr_expect_arr_eq(got, want, (size_t)n * es, "dtype %d normal %d piece %zu", dtype, normal, p);
        cr_expect_eq(got[n * (int64_t)es], 0xab, "wrote past the piece");
    }
}

Test(random, placement_invariance)
{
    for (dt_dtype dt = DT_FLOAT32; dt <= DT_BFLOAT16; dt++) {
        s_check_pieces(dt, false);
        s_check_pieces(dt, true);
    }
}

Test(random, placement_invariance_3d)
{
    const int64_t global[3] = {3, 4, 5};
    float full[60], piece[12];
    cpu_random(full, DT_FLOAT32, 3, global, (int64_t[]){0, 0, 0}, global, 99, 1, true);
    cpu_random(piece, DT_FLOAT32, 3, (int64_t[]){2, 3, 2}, (int64_t[]){1, 1, 3}, global, 99, 1, true);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++)
                cr_expect_eq(piece[(a * 3 + b) * 2 + c], full[((1 + a) * 4 + 1 + b) * 5 + 3 + c]);
}

Test(random, seed_and_stream_matter)
{
    const int64_t shape[1] = {64};
    float a[64], b[64], c[64];
    cpu_random(a, DT_FLOAT32, 1, shape, (int64_t[]){0}, shape, 5, 0, false);
    cpu_random(b, DT_FLOAT32, 1, shape, (int64_t[]){0}, shape, 5, 1, false);
    cpu_random(c, DT_FLOAT32, 1, shape, (int64_t[]){0}, shape, 6, 0, false);
    int same_ab = 0, same_ac = 0;
    for (int i = 0; i < 64; i++) {
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
    }
    cr_expect_lt(same_ab, 2);
    cr_expect_lt(same_ac, 2);
    /* the high halves of seed and stream take part too */
    cpu_random(b, DT_FLOAT32, 1, shape, (int64_t[]){0}, shape, 5 | UINT64_C(1) << 32, 0, false);
    cpu_random(c, DT_FLOAT32, 1, shape, (int64_t[]){0}, shape, 5, UINT64_C(1) << 32, false);
    cr_expect_neq(memcmp(a, b, sizeof a), 0);
    cr_expect_neq(memcmp(a, c, sizeof a), 0);
}

Test(random, statistics)
{
    enum { N = 100000 };
    static float v[N];
    const int64_t shape[1] = {N};
    cpu_random(v, DT_FLOAT32, 1, shape, (int64_t[]){0}, shape, 42, 3, false);
    double sum = 0;
    for (int i = 0; i < N; i++) {
        cr_assert(v[i] >= 0.0f && v[i] < 1.0f, "v[%d] = %g", i, (double)v[i]);
        sum += v[i];
    }
    cr_expect(fabs(sum / N - 0.5) < 0.01, "mean %g", sum / N);

    cpu_random(v, DT_FLOAT32, 1, shape, (int64_t[]){0}, shape, 42, 4, true);
    double s1 = 0, s2 = 0;
    for (int i = 0; i < N; i++) {
        cr_assert(isfinite(v[i]));
        s1 += v[i];
        s2 += (double)v[i] * v[i];
    }
    double mean = s1 / N, sd = sqrt(s2 / N - mean * mean);
    cr_expect(fabs(mean) < 0.02, "mean %g", mean);
    cr_expect(fabs(sd - 1) < 0.02, "std %g", sd);
}

Test(random, sixteen_bit_uniform_below_one)
{
    enum { N = 20000 };
    static uint16_t h[N];
    const int64_t shape[1] = {N};
    cpu_random(h, DT_FLOAT16, 1, shape, (int64_t[]){0}, shape, 8, 0, false);
    for (int i = 0; i < N; i++)
        cr_assert(dt_f16_to_f32(h[i]) >= 0.0f && dt_f16_to_f32(h[i]) < 1.0f);
    cpu_random(h, DT_BFLOAT16, 1, shape, (int64_t[]){0}, shape, 8, 0, false);
    for (int i = 0; i < N; i++)
        cr_assert(dt_bf16_to_f32(h[i]) >= 0.0f && dt_bf16_to_f32(h[i]) < 1.0f);
}

/* Few rows against a weight: every M up to the limit; K of one vector (8), with a tail past the
 * widest unrolled step (37) and with whole single-vector steps after it before the tail (50); each
 * weight dtype, overwrite and accumulate; against a double-precision loop over the same (rounded)
 * weights. */
Test(matmul, skinny_rows_against_a_weight)
{
    enum { N = 13, KMAX = 50 };
    float a[CPU_SKINNY_MAX_M * KMAX], w32[N * KMAX], c[CPU_SKINNY_MAX_M * N];
    uint16_t w16[N * KMAX];
    dt_dtype dtypes[] = {DT_FLOAT32, DT_BFLOAT16, DT_FLOAT16};
    const int Ks[] = {8, 37, KMAX};
    for (int ki = 0; ki < 3; ki++) {
        int K = Ks[ki];
        for (int i = 0; i < CPU_SKINNY_MAX_M * K; i++)
            a[i] = (float)((i * 37) % 11) / 4.0f - 1.25f;
        for (int d = 0; d < 3; d++) {
            for (int i = 0; i < N * K; i++) {
                float v = (float)((i * 13) % 17) / 8.0f - 1.0f;
                w16[i] = dtypes[d] == DT_BFLOAT16 ? dt_f32_to_bf16(v) : dt_f32_to_f16(v);
                w32[i] = dtypes[d] == DT_FLOAT32    ? v
                         : dtypes[d] == DT_BFLOAT16 ? dt_bf16_to_f32(w16[i])
                                                    : dt_f16_to_f32(w16[i]);
            }
            const void *w = dtypes[d] == DT_FLOAT32 ? (const void *)w32 : (const void *)w16;
            for (int M = 1; M <= CPU_SKINNY_MAX_M; M++) {
                for (int accumulate = 0; accumulate < 2; accumulate++) {
                    for (int i = 0; i < M * N; i++)
                        c[i] = accumulate ? 0.5f * (float)i : 99.0f;
                    cpu_matmul_skinny(M, N, K, a, w, dtypes[d], c, accumulate);
                    for (int m = 0; m < M; m++)
                        for (int j = 0; j < N; j++) {
                            double want = accumulate ? 0.5 * (m * N + j) : 0.0;
                            for (int k = 0; k < K; k++)
                                want += (double)a[m * K + k] * w32[j * K + k];
                            cr_assert(fabs(c[m * N + j] - want) < 1e-4 * (1 + fabs(want)),
                                      "K %d dtype %d M %d acc %d (%d,%d): %f, want %f", K, d, M, accumulate, m, j,
                                      c[m * N + j], want);
                        }
                }
            }
        }
    }
}

/* bfloat16 rows long enough that the rearranged rows of A (per 16 features the even ones, then the
 * odd ones) no longer fit the kernel's stack buffer and are allocated: one and two rows of A, K a
 * multiple of 16 plus a tail, against a double-precision loop. */
Test(matmul, skinny_bf16_long_rows)
{
    enum { N = 3, K = 4100 };
    static float a[2 * K];
    static uint16_t w[N * K];
    for (int i = 0; i < 2 * K; i++)
        a[i] = (float)((i * 37) % 11) / 4.0f - 1.25f;
    for (int i = 0; i < N * K; i++)
        w[i] = dt_f32_to_bf16((float)((i * 13) % 17) / 8.0f - 1.0f);
    for (int M = 1; M <= 2; M++) {
        float c[2 * N];
        cpu_matmul_skinny(M, N, K, a, w, DT_BFLOAT16, c, false);
        for (int m = 0; m < M; m++)
            for (int j = 0; j < N; j++) {
                double want = 0.0;
                for (int k = 0; k < K; k++)
                    want += (double)a[m * K + k] * dt_bf16_to_f32(w[j * K + k]);
                cr_assert(fabs(c[m * N + j] - want) < 1e-4 * (1 + fabs(want)), "M %d (%d,%d): %f, want %f", M, m, j,
                          c[m * N + j], want);
            }
    }
}

/* A product's kernel is handed whatever shapes a record names: pieces that do not make the op
 * (a 0-D operand, mm of a 3-D tensor, a 3-D weight, K or the output that disagree, a bias that
 * does not broadcast) are refused with a reason, never read out of bounds; pieces that fit still
 * run (2x3 @ 3x2 by hand). */
Test(matmul, refuses_pieces_that_do_not_fit)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, bias[3] = {0}, out[16];
    op_attrs attrs = {0};
    struct {
        int op, na, nb, no, nbias;
        int64_t as[3], bs[3], os[3], biass[2];
        bool fits;
    } cases[] = {
        {OP_ID_matmul, 0, 2, 1, -1, {0}, {3, 2}, {2}, {0}, false},
        {OP_ID_matmul, 1, 0, 0, -1, {3}, {0}, {0}, {0}, false},
        {OP_ID_mm, 3, 2, 2, -1, {1, 2, 3}, {3, 2}, {2, 2}, {0}, false},
        {OP_ID_bmm, 2, 2, 2, -1, {2, 3}, {3, 2}, {2, 2}, {0}, false},
        {OP_ID_linear, 2, 3, 3, -1, {2, 3}, {1, 2, 3}, {2, 1, 2}, {0}, false},
        {OP_ID_linear, 0, 2, 1, -1, {0}, {2, 3}, {2}, {0}, false},
        {OP_ID_linear, 2, 2, 2, 1, {2, 3}, {2, 3}, {2, 2}, {3}, false},
        {OP_ID_linear, 2, 2, 2, 3, {2, 3}, {2, 3}, {2, 2}, {0}, false},
        {OP_ID_mm, 2, 2, 2, -1, {2, 3}, {2, 3}, {2, 2}, {0}, false},
        {OP_ID_mm, 2, 2, 2, -1, {2, 3}, {3, 2}, {2, 3}, {0}, false},
        {OP_ID_mm, 2, 2, 1, -1, {2, 3}, {3, 2}, {4}, {0}, false},
        {OP_ID_mm, 2, 2, 2, -1, {2, 3}, {3, 2}, {2, 2}, {0}, true},
        {OP_ID_linear, 2, 2, 2, 1, {2, 3}, {2, 3}, {2, 2}, {2}, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        op_kernel k = {.def = op_by_id(cases[i].op), .attrs = &attrs, .nin = cases[i].nbias >= 0 ? 3 : 2, .nout = 1};
        k.nctx = 1;
        k.ctx[0] = cases[i].nbias >= 0;
        k.in[0] = (op_local){.dtype = DT_FLOAT32, .ndim = cases[i].na, .data = a};
        k.in[1] = (op_local){.dtype = DT_FLOAT32, .ndim = cases[i].nb, .data = b};
        k.in[2] = (op_local){.dtype = DT_FLOAT32, .ndim = cases[i].nbias >= 0 ? cases[i].nbias : 0, .data = bias};
        k.out[0] = (op_local){.dtype = DT_FLOAT32, .ndim = cases[i].no, .data = out};
        memcpy(k.in[0].shape, cases[i].as, sizeof cases[i].as);
        memcpy(k.in[1].shape, cases[i].bs, sizeof cases[i].bs);
        memcpy(k.in[2].shape, cases[i].biass, sizeof cases[i].biass);
        memcpy(k.out[0].shape, cases[i].os, sizeof cases[i].os);
        const char *why = cpu_kernel_for(cases[i].op)(&k);
        cr_expect((why == NULL) == cases[i].fits, "case %zu: %s", i, why ? why : "ran");
    }
    /* the last two ran: [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] and the same against b read as
     * a (2, 3) weight: [[1,0,0],[1,1,1]] transposed */
    float want_linear[4] = {1, 6, 4, 15};
    for (int j = 0; j < 4; j++)
        cr_expect(out[j] == want_linear[j], "out[%d] = %g, want %g", j, out[j], want_linear[j]);
}

/* Rotary embedding against the formula written out by hand for one row: D = 4, so frequencies
 * inv_freq[0], inv_freq[1]; x = (a, b, c, d) at position p rotates the pairs (a, c) and (b, d). */
Test(rope, rotate_half_pairs_by_position)
{
    enum { B = 2, H = 3, S = 2, D = 4 };
    float x[B * H * S * D], out[B * H * S * D];
    for (int i = 0; i < B * H * S * D; i++)
        x[i] = (float)(i % 9) - 4.0f;
    const int64_t positions[B * S] = {0, 5, 7, 2};
    const float inv_freq[2] = {1.0f, 0.01f};
    cr_assert_null(cpu_rope(out, x, DT_FLOAT32, B, H, S, D, positions, B, inv_freq, 1.0f));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int s = 0; s < S; s++) {
                const float *r = x + ((b * H + h) * S + s) * D;
                const float *o = out + ((b * H + h) * S + s) * D;
                double p = (double)positions[b * S + s];
                for (int i = 0; i < 2; i++) {
                    double c = cos(p * inv_freq[i]), sn = sin(p * inv_freq[i]);
                    cr_assert(fabs(o[i] - (r[i] * c - r[i + 2] * sn)) < 1e-5);
                    cr_assert(fabs(o[i + 2] - (r[i + 2] * c + r[i] * sn)) < 1e-5);
                }
            }
    /* positions shared by the batch, bfloat16 storage: the float32 result rounded once */
    uint16_t xb[B * H * S * D], ob[B * H * S * D];
    for (int i = 0; i < B * H * S * D; i++)
        xb[i] = dt_f32_to_bf16(x[i]);
    cr_assert_null(cpu_rope(ob, xb, DT_BFLOAT16, B, H, S, D, positions, 1, inv_freq, 2.0f));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int s = 0; s < S; s++) {
                int64_t row = ((b * H + h) * S + s) * D;
                double p = (double)positions[s];
                for (int i = 0; i < 2; i++) {
                    double c = 2 * cos(p * inv_freq[i]), sn = 2 * sin(p * inv_freq[i]);
                    double want = x[row + i] * c - x[row + i + 2] * sn;
                    cr_assert(fabs(dt_bf16_to_f32(ob[row + i]) - want) <= 0.01 * fabs(want) + 1e-6,
                              "(%d,%d,%d,%d): %f want %f", b, h, s, i, dt_bf16_to_f32(ob[row + i]), want);
                }
            }
}

/* Head sizes of 64 and 48 in bfloat16 (whole 16-lane vectors, and a masked last one, where the CPU
 * has them): within one bfloat16 rounding of the formula in double, and bit for bit the float32
 * route's result on the same (exactly widened) values rounded once, every element of (2, 3, 5, D). */
static void s_check_rope_bf16(int D);

Test(rope, bfloat16_heads_of_64_and_48)
{
    s_check_rope_bf16(64);
    s_check_rope_bf16(48);
    s_check_rope_bf16(6);
}

static void s_check_rope_bf16(int D)
{
    enum { B = 2, H = 3, S = 5, N = B * H * S * 64 };
    static uint16_t xb[N], ob[N];
    static float xf[N], of[N];
    for (int i = 0; i < N; i++) {
        xb[i] = dt_f32_to_bf16((float)((i * 37) % 101) / 25.0f - 2.0f);
        xf[i] = dt_bf16_to_f32(xb[i]);
    }
    const int64_t positions[B * S] = {0, 1, 2, 3, 4, 9, 40, 300, 2047, 5};
    float inv_freq[32];
    for (int i = 0; i < D / 2; i++)
        inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)D);
    cr_assert_null(cpu_rope(ob, xb, DT_BFLOAT16, B, H, S, D, positions, B, inv_freq, 1.0f));
    cr_assert_null(cpu_rope(of, xf, DT_FLOAT32, B, H, S, D, positions, B, inv_freq, 1.0f));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int s = 0; s < S; s++)
                for (int i = 0; i < D; i++) {
                    int64_t at = ((b * H + h) * S + s) * D + i, pair = i < D / 2 ? at + D / 2 : at - D / 2;
                    double angle = (double)positions[b * S + s] * inv_freq[i % (D / 2)];
                    double want = i < D / 2 ? xf[at] * cos(angle) - xf[pair] * sin(angle)
                                            : xf[at] * cos(angle) + xf[pair] * sin(angle);
                    double got = dt_bf16_to_f32(ob[at]);
                    cr_assert(fabs(got - want) <= fabs(want) / 256 + 1e-3, "(%d,%d,%d,%d): %g, want %g", b, h, s, i,
                              got, want);
                    cr_assert(ob[at] == dt_f32_to_bf16(of[at]), "(%d,%d,%d,%d): %#x, the float route's %#x", b, h, s,
                              i, ob[at], dt_f32_to_bf16(of[at]));
                }
}

/* Whether out is x rotated by the formula (float32, (1, H, S, D) with D = 4), within 1e-5. */
static bool s_rope_is(const float *out, const float *x, int H, int S, const int64_t *positions,
                      const float *inv_freq, float scaling)
{
    for (int h = 0; h < H; h++)
        for (int s = 0; s < S; s++) {
            const float *r = x + (h * S + s) * 4, *o = out + (h * S + s) * 4;
            for (int i = 0; i < 2; i++) {
                double c = scaling * cos((double)positions[s] * inv_freq[i]);
                double sn = scaling * sin((double)positions[s] * inv_freq[i]);
                if (fabs(o[i] - (r[i] * c - r[i + 2] * sn)) > 1e-5 || fabs(o[i + 2] - (r[i + 2] * c + r[i] * sn)) > 1e-5)
                    return false;
            }
        }
    return true;
}

/* A thread keeps its last cos/sin table and takes it again only for the same values: the same
 * positions array with other values in it, other frequencies, another scaling, more positions,
 * each give the formula's rotation, and so does the first call's input once more. */
Test(rope, a_kept_table_serves_only_the_same_values)
{
    enum { H = 2, S = 3 };
    float x[H * S * 4], out[H * S * 4];
    for (int i = 0; i < H * S * 4; i++)
        x[i] = (float)(i % 7) - 3.0f;
    int64_t positions[2 * S] = {1, 2, 3, 4, 5, 6};
    float f1[2] = {1.0f, 0.1f}, f2[2] = {0.5f, 0.1f};
    cr_assert_null(cpu_rope(out, x, DT_FLOAT32, 1, H, S, 4, positions, 1, f1, 1.0f));
    cr_expect(s_rope_is(out, x, H, S, positions, f1, 1.0f), "first call");
    cr_assert_null(cpu_rope(out, x, DT_FLOAT32, 1, H, S, 4, positions, 1, f2, 1.0f));
    cr_expect(s_rope_is(out, x, H, S, positions, f2, 1.0f), "other frequencies");
    positions[1] = 9;
    cr_assert_null(cpu_rope(out, x, DT_FLOAT32, 1, H, S, 4, positions, 1, f2, 1.0f));
    cr_expect(s_rope_is(out, x, H, S, positions, f2, 1.0f), "the same array, another position in it");
    cr_assert_null(cpu_rope(out, x, DT_FLOAT32, 1, H, S, 4, positions, 1, f2, 0.5f));
    cr_expect(s_rope_is(out, x, H, S, positions, f2, 0.5f), "another scaling");
    cr_assert_null(cpu_rope(out, x, DT_FLOAT32, 1, H / 2, 2 * S, 4, positions, 1, f2, 0.5f));
    cr_expect(s_rope_is(out, x, H / 2, 2 * S, positions, f2, 0.5f), "more positions");
    positions[1] = 2;
    cr_assert_null(cpu_rope(out, x, DT_FLOAT32, 1, H, S, 4, positions, 1, f1, 1.0f));
    cr_expect(s_rope_is(out, x, H, S, positions, f1, 1.0f), "the first call's values again");
}

/* ---- the activations' exponential ---------------------------------------------------------- */

/* The spacing of float32 at v (a finite double): 2^-149 below the normal range. */
static double s_ulp32(double v)
{
    float f = fabsf((float)v);
    return f < 0x1p-126f ? 0x1p-149 : (double)nextafterf(f, INFINITY) - f;
}

/* op_ew_exp against exp in double precision over every 509th float (both signs, every exponent):
 * within 1.25 ulp of the float result wherever that is finite and nonzero (subnormal results
 * included), and exactly 0 or infinity where expf rounds to them, with the thresholds expf has. */
Test(activations, exp_sweep_against_double)
{
    double worst = 0.0;
    for (uint64_t b = 0; b <= 0xffffffffu; b += 509) {
        uint32_t bits = (uint32_t)b;
        float x;
        memcpy(&x, &bits, sizeof x);
        if (x != x)
            continue;
        double want = exp((double)x);
        float got = op_ew_exp(x), want32 = (float)want;
        if (want32 == 0.0f || want32 == INFINITY) {
            cr_assert(got == want32, "exp(%a) = %a, want %a", x, got, want32);
            continue;
        }
        double err = fabs(got - want) / s_ulp32(want);
        cr_assert(err <= 1.25, "exp(%a) = %a, want %a (%.3f ulp)", x, got, want, err);
        worst = err > worst ? err : worst;
    }
    cr_assert(worst > 0.5, "the sweep measured something (worst %.3f ulp)", worst);
}

Test(activations, exp_extremes)
{
    cr_assert(op_ew_exp(INFINITY) == INFINITY);
    cr_assert(op_ew_exp(-INFINITY) == 0.0f);
    cr_assert(isnan(op_ew_exp(NAN)) && isnan(op_ew_exp(-NAN)));
    cr_assert(op_ew_exp(0.0f) == 1.0f && op_ew_exp(-0.0f) == 1.0f);
    cr_assert(op_ew_exp(1e30f) == INFINITY && op_ew_exp(-1e30f) == 0.0f);
    /* ln(FLT_MAX) = 88.7228391...: the float below it stays finite, the one above overflows */
    cr_assert(isfinite(op_ew_exp(88.72283172607422f)) && op_ew_exp(88.72283935546875f) == INFINITY);
    cr_assert(op_ew_exp(-103.0f) > 0.0f && op_ew_exp(-103.0f) < 0x1p-126f, "subnormal, not flushed");
    cr_assert(op_ew_exp(-104.0f) == 0.0f, "exp(-104) = 6.8e-46 rounds to 0");
}

/* An attention row's weights: exp(x - top) against libm's (double) within 2e-7 relative, a hidden
 * key (-inf) exactly 0, shifts down to the clamp at -88 (0 below it) and the returned sum equal to
 * the weights' sum. */
Test(attention, exp_shifted_sum)
{
    enum { N = 37 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = i == 5 ? -INFINITY : (float)i * -2.5f + 3.0f; /* 3 down to -87 */
    float top = 3.0f, copy[N];
    memcpy(copy, x, sizeof x);
    float sum = cpu_exp_shifted_sum(x, NULL, N, top);
    double want_sum = 0.0;
    for (int i = 0; i < N; i++) {
        double want = i == 5 ? 0.0 : exp((double)copy[i] - top);
        if (i == 5)
            cr_assert(x[i] == 0.0f, "a hidden key's weight is %g", x[i]);
        else
            cr_assert(fabs(x[i] - want) <= 2e-7 * want + 1e-37, "exp(%g): %g, want %g", copy[i] - top, x[i], want);
        want_sum += x[i];
    }
    cr_assert(fabs(sum - want_sum) <= 1e-6 * want_sum, "sum %g, want %g", sum, want_sum);
}

/* The same weights written as bfloat16 for an AMX product: for every length up to 37 (whole
 * vectors, a masked tail, both), each the float weight rounded once to nearest even (the scalar
 * conversion), nothing written past n, and the same sum as the float route's. */
Test(attention, exp_shifted_sum_into_bfloat16)
{
    enum { N = 37 };
    for (int n = 0; n <= N; n++) {
        float x[N], floats[N];
        uint16_t w[N + 1];
        for (int i = 0; i < N; i++)
            x[i] = floats[i] = i == 5 ? -INFINITY : (float)i * -2.37f + 1.0f;
        for (int i = 0; i <= N; i++)
            w[i] = 0xabcd;
        float sum = cpu_exp_shifted_sum(x, w, n, 1.0f), want_sum = cpu_exp_shifted_sum(floats, NULL, n, 1.0f);
        for (int i = 0; i < n; i++)
            cr_assert(w[i] == dt_f32_to_bf16(floats[i]), "n %d, weight %d: %#x, want %#x", n, i, w[i],
                      dt_f32_to_bf16(floats[i]));
        cr_assert(w[n] == 0xabcd, "n %d: written past the row", n);
        cr_assert(fabsf(sum - want_sum) <= 1e-6f * want_sum, "n %d: sum %g, want %g", n, sum, want_sum);
    }
}

/* A row's scaling and largest value, against a hand loop: every length up to 40, a NaN anywhere
 * gives NaN (the row still scaled whole), none gives -inf, pre 1 writes nothing. */
Test(attention, scaled_max)
{
    enum { N = 40 };
    cr_assert(cpu_scaled_max(NULL, 0, 0.5f) == -INFINITY);
    for (int n = 1; n <= N; n++)
        for (int nan_at = -1; nan_at < n; nan_at += n > 8 ? 7 : 1) {
            float x[N], want_top = -INFINITY;
            for (int i = 0; i < n; i++) {
                x[i] = i == nan_at ? NAN : (float)((i * 7919) % 23) - 11.5f;
                want_top = x[i] * 0.125f > want_top ? x[i] * 0.125f : want_top;
            }
            float orig[N];
            memcpy(orig, x, sizeof(float) * (size_t)n);
            float top = cpu_scaled_max(x, n, 0.125f);
            if (nan_at >= 0)
                cr_assert(isnan(top), "n %d, NaN at %d: %g", n, nan_at, top);
            else
                cr_assert(top == want_top, "n %d: %g, want %g", n, top, want_top);
            for (int i = 0; i < n; i++)
                cr_assert(i == nan_at ? isnan(x[i]) : x[i] == orig[i] * 0.125f, "n %d: x[%d] = %g", n, i, x[i]);
            memcpy(x, orig, sizeof(float) * (size_t)n);
            top = cpu_scaled_max(x, n, 1.0f);
            cr_assert(nan_at >= 0 ? isnan(top) : top == want_top * 8.0f, "n %d, pre 1: %g", n, top);
            cr_assert(memcmp(x, orig, sizeof(float) * (size_t)n) == 0, "n %d: pre 1 changed the row", n);
        }
}

/* softmax(scale * q k^T + mask) v for one head in double, causal from row0 (row i sees keys up to
 * row0 + i): want (L, EV); a row that sees no key gives zeros. */
static void s_attention_reference(int L, int S, int E, int EV, int row0, const float *q, const float *k,
                                  const float *v, const float *mask, double scale, double *want)
{
    double *w = malloc(sizeof(double) * (size_t)S);
    cr_assert(w);
    for (int i = 0; i < L; i++) {
        double top = -INFINITY, sum = 0.0;
        int visible = row0 + i + 1 < S ? row0 + i + 1 : S;
        for (int j = 0; j < visible; j++) {
            double x = mask[i * S + j];
            for (int e = 0; e < E; e++)
                x += scale * (double)q[i * E + e] * k[j * E + e];
            w[j] = x;
            top = x > top ? x : top;
        }
        for (int j = 0; j < visible; j++)
            sum += w[j] = top == -INFINITY ? 0.0 : exp(w[j] - top);
        for (int c = 0; c < EV; c++) {
            want[i * EV + c] = 0.0;
            for (int j = 0; j < visible && sum > 0; j++)
                want[i * EV + c] += w[j] / sum * v[j * EV + c];
        }
    }
    free(w);
}

/* One attention head of L query rows over S keys, causal from row0, with a mask that hides every
 * third key and one whole row (row 21 where there is one): against softmax written in double
 * precision, row by row. */
static void s_check_head(int L, int S, int E, int EV, int row0)
{
    float *q = malloc(sizeof(float) * (size_t)(L * E)), *k = malloc(sizeof(float) * (size_t)(S * E));
    float *v = malloc(sizeof(float) * (size_t)(S * EV)), *mask = malloc(sizeof(float) * (size_t)(L * S));
    float *scores = malloc(sizeof(float) * (size_t)(cpu_attention_block_rows(L, S) * (S + 1)));
    float *out = malloc(sizeof(float) * (size_t)(L * EV));
    double *want = malloc(sizeof(double) * (size_t)(L * EV));
    cr_assert(q && k && v && mask && scores && out && want);
    for (int i = 0; i < L * E; i++)
        q[i] = (float)((i * 7) % 13) / 6.0f - 1.0f;
    for (int i = 0; i < S * E; i++)
        k[i] = (float)((i * 11) % 17) / 8.0f - 1.0f;
    for (int i = 0; i < S * EV; i++)
        v[i] = (float)((i * 5) % 19) / 9.0f - 1.0f;
    for (int i = 0; i < L; i++)
        for (int j = 0; j < S; j++)
            mask[i * S + j] = i == 21 || j % 3 == 0 ? -INFINITY : (float)((i + j) % 5) / 10.0f;
    const float scale = 0.5f;
    cpu_attention_head(L, S, E, EV, q, k, v, DT_FLOAT32, mask, S, 1, true, row0, scale, scores, out);
    s_attention_reference(L, S, E, EV, row0, q, k, v, mask, scale, want);
    for (int i = 0; i < L * EV; i++)
        cr_assert(fabs(out[i] - want[i]) < 1e-5, "L %d S %d E %d Ev %d, row %d col %d: %f, want %f", L, S, E, EV,
                  i / EV, i % EV, out[i], want[i]);
    free(q), free(k), free(v), free(mask), free(scores), free(out), free(want);
}

/* More query rows than a block holds (S = 4100 keys: blocks of 16 rows, so 40 rows go as 16, 16
 * and 8), causal from row0 = 4070 (the rows see 4071 to 4110 keys, the last ones all). Value rows
 * of 2 features go through sgemm; 40 and 16 through the register tiles where the CPU has AVX2 (5
 * vectors: a tile of 4 and one of 1; rows in tiles of 6 and 3 with every remainder, keys in pairs
 * of panels with a last one holding 1 to 5 keys). */
Test(attention, head_in_blocks_of_rows)
{
    cr_assert_eq(cpu_attention_block_rows(40, 4100), 16);
    s_check_head(40, 4100, 3, 2, 4070);
    s_check_head(40, 4100, 12, 40, 4070);
    s_check_head(23, 37, 32, 16, 30);
    s_check_head(29, 61, 5, 24, 100);
    s_check_head(5, 9, 8, 8, 0);
    s_check_head(7, 33, 8, 8, 40);
    /* AVX-512's tiles where the CPU has them: rows in 8s and 6s with remainders, keys in pairs of
     * 16-key panels with a part-filled last one, values of 64 (two vectors twice), 48 (a pair and
     * one) and 32 features */
    s_check_head(45, 70, 64, 64, 10);
    s_check_head(17, 50, 32, 32, 0);
    s_check_head(19, 120, 48, 48, 100);
}

/* Decode's few query rows read a bfloat16 or float16 cache as it is (no float32 copy of it): 3 rows
 * over S = 37 keys of E = 21 and Ev = 19 (vector tails everywhere), causal from row0 = 34 with a
 * mask hiding every fifth key. The keys and values are multiples of 1/8 in [-1, 1], exact in both
 * 16-bit formats, so softmax in double over those values is the answer. */
Test(attention, few_rows_read_a_16bit_cache)
{
    enum { L = 3, S = 37, E = 21, EV = 19, ROW0 = 34 };
    static float q[L * E], k[S * E], v[S * EV], mask[L * S], scores[L * (S + 1)], out[L * EV];
    static uint16_t k16[S * E], v16[S * EV];
    for (int i = 0; i < L * E; i++)
        q[i] = (float)((i * 7) % 13) / 6.0f - 1.0f;
    for (int i = 0; i < S * E; i++)
        k[i] = (float)((i * 11) % 17) / 8.0f - 1.0f;
    for (int i = 0; i < S * EV; i++)
        v[i] = (float)((i * 5) % 17) / 8.0f - 1.0f;
    for (int i = 0; i < L; i++)
        for (int j = 0; j < S; j++)
            mask[i * S + j] = j % 5 == 1 ? -INFINITY : (float)((i + j) % 4) / 8.0f;
    const float scale = 0.25f;
    static double want[L * EV];
    s_attention_reference(L, S, E, EV, ROW0, q, k, v, mask, scale, want);
    const dt_dtype dtypes[] = {DT_BFLOAT16, DT_FLOAT16};
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < S * E; i++)
            k16[i] = dtypes[t] == DT_BFLOAT16 ? dt_f32_to_bf16(k[i]) : dt_f32_to_f16(k[i]);
        for (int i = 0; i < S * EV; i++)
            v16[i] = dtypes[t] == DT_BFLOAT16 ? dt_f32_to_bf16(v[i]) : dt_f32_to_f16(v[i]);
        cpu_attention_head(L, S, E, EV, q, k16, v16, dtypes[t], mask, S, 1, true, ROW0, scale, scores, out);
        for (int i = 0; i < L * EV; i++)
            cr_assert(fabs(out[i] - want[i]) < 1e-5, "%s row %d col %d: %f, want %f", dt_dtype_name(dtypes[t]),
                      i / EV, i % EV, out[i], want[i]);
    }
}
