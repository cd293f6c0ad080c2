/* The 16-bit float conversions of core/dt_dtype, against hand-computed bit patterns. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "dt_dtype.h"

static float s_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t s_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static bool s_f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
static bool s_bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }

Test(dtype, table)
{
    cr_expect_eq(dt_dtype_size(DT_FLOAT32), 4);
    cr_expect_eq(dt_dtype_size(DT_BFLOAT16), 2);
    cr_expect_eq(dt_dtype_size(DT_INT64), 8);
    cr_expect_eq(dt_dtype_size(DT_BOOL), 1);
    cr_expect_str_eq(dt_dtype_name(DT_FLOAT16), "float16");
    cr_expect(dt_dtype_is_float(DT_BFLOAT16));
    cr_expect(!dt_dtype_is_float(DT_INT32));
    cr_expect(!dt_dtype_valid(DT_NDTYPES));
    cr_expect(!dt_dtype_valid(-1));
}

Test(dtype, f16_values)
{
    cr_expect_eq(dt_f32_to_f16(1.0f), 0x3c00);
    cr_expect_eq(dt_f32_to_f16(-2.0f), 0xc000);
    cr_expect_eq(dt_f32_to_f16(0.0f), 0x0000);
    cr_expect_eq(dt_f32_to_f16(-0.0f), 0x8000);
    cr_expect_eq(dt_f32_to_f16(1.0f / 3.0f), 0x3555);
    cr_expect_eq(dt_f32_to_f16(65504.0f), 0x7bff);
    cr_expect_eq(dt_f32_to_f16(65519.99f), 0x7bff);
    cr_expect_eq(dt_f32_to_f16(65520.0f), 0x7c00);
    cr_expect_eq(dt_f32_to_f16(-65520.0f), 0xfc00);
    cr_expect_eq(dt_f32_to_f16(1e10f), 0x7c00);
    cr_expect_eq(dt_f32_to_f16(INFINITY), 0x7c00);
    cr_expect_eq(dt_f32_to_f16(-INFINITY), 0xfc00);
    /* subnormals: multiples of 2^-24, ties to even */
    cr_expect_eq(dt_f32_to_f16(0x1p-24f), 0x0001);
    cr_expect_eq(dt_f32_to_f16(-0x1p-24f), 0x8001);
    cr_expect_eq(dt_f32_to_f16(0x1p-25f), 0x0000);
    cr_expect_eq(dt_f32_to_f16(0x1.000002p-25f), 0x0001);
    cr_expect_eq(dt_f32_to_f16(3 * 0x1p-25f), 0x0002);
    cr_expect_eq(dt_f32_to_f16(1e-10f), 0x0000);
    cr_expect_eq(dt_f32_to_f16(1023 * 0x1p-24f), 0x03ff);
    cr_expect_eq(dt_f32_to_f16(1023.5f * 0x1p-24f), 0x0400);
    cr_expect_eq(dt_f32_to_f16(0x1p-14f), 0x0400);
    /* normal range: 10 mantissa bits, ties to even */
    cr_expect_eq(dt_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    cr_expect_eq(dt_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    cr_expect_eq(dt_f32_to_f16(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);
    cr_expect_eq(dt_f32_to_f16(1.0f - 0x1p-11f), 0x3bff);
    cr_expect_eq(dt_f32_to_f16(1.0f - 0x1p-12f), 0x3c00); /* tie: carries into the exponent */
    cr_expect(s_f16_is_nan(dt_f32_to_f16(NAN)));
    cr_expect(s_f16_is_nan(dt_f32_to_f16(s_bits_f32(0x7f800001u))));
    cr_expect(s_f16_is_nan(dt_f32_to_f16(s_bits_f32(0xffc00000u))));
}

Test(dtype, f16_to_f32)
{
    cr_expect_eq(dt_f16_to_f32(0x3c00), 1.0f);
    cr_expect_eq(dt_f16_to_f32(0x7bff), 65504.0f);
    cr_expect_eq(dt_f16_to_f32(0x0001), 0x1p-24f);
    cr_expect_eq(dt_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
    cr_expect_eq(dt_f16_to_f32(0x3555), 0.333251953125f);
    cr_expect_eq(dt_f16_to_f32(0x7c00), INFINITY);
    cr_expect_eq(dt_f16_to_f32(0xfc00), -INFINITY);
    cr_expect_eq(s_f32_bits(dt_f16_to_f32(0x8000)), 0x80000000u);
    cr_expect(isnan(dt_f16_to_f32(0x7e00)));
    cr_expect(isnan(dt_f16_to_f32(0xfc01)));
}

Test(dtype, f16_round_trip_all)
{
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = dt_f16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_f16(f);
        if (s_f16_is_nan((uint16_t)h)) {
            cr_assert(isnan(f), "0x%04x", h);
            cr_assert(s_f16_is_nan(back), "0x%04x", h);
        } else {
            cr_assert_eq(back, h, "0x%04x -> %a -> 0x%04x", h, (double)f, back);
        }
    }
}

Test(dtype, bf16_values)
{
    cr_expect_eq(dt_f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(dt_f32_to_bf16(-0.0f), 0x8000);
    cr_expect_eq(dt_f32_to_bf16(1.0f / 3.0f), 0x3eab); /* 0x3eaaaaab rounds up */
    cr_expect_eq(dt_f32_to_bf16(s_bits_f32(0x3f808000u)), 0x3f80); /* tie, even below */
    cr_expect_eq(dt_f32_to_bf16(s_bits_f32(0x3f818000u)), 0x3f82); /* tie, even above */
    cr_expect_eq(dt_f32_to_bf16(s_bits_f32(0x3f808001u)), 0x3f81);
    cr_expect_eq(dt_f32_to_bf16(s_bits_f32(0x3f807fffu)), 0x3f80);
    cr_expect_eq(dt_f32_to_bf16(s_bits_f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX overflows */
    cr_expect_eq(dt_f32_to_bf16(INFINITY), 0x7f80);
    cr_expect_eq(dt_f32_to_bf16(-INFINITY), 0xff80);
    cr_expect_eq(dt_f32_to_bf16(s_bits_f32(0x00000001u)), 0x0000); /* smallest subnormal */
    cr_expect(s_bf16_is_nan(dt_f32_to_bf16(NAN)));
    cr_expect(s_bf16_is_nan(dt_f32_to_bf16(s_bits_f32(0x7f800001u)))); /* payload below bit 16 */
    cr_expect(s_bf16_is_nan(dt_f32_to_bf16(s_bits_f32(0xffffffffu))));
    cr_expect_eq(dt_bf16_to_f32(0x3f80), 1.0f);
    cr_expect_eq(dt_bf16_to_f32(0xc040), -3.0f);
}

Test(dtype, bf16_round_trip_all)
{
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = dt_bf16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_bf16(f);
        if (s_bf16_is_nan((uint16_t)h))
            cr_assert(s_bf16_is_nan(back), "0x%04x", h);
        else
            cr_assert_eq(back, h, "0x%04x -> 0x%04x", h, back);
    }
}
