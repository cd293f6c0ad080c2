/* dt_dtype — element types: their names and sizes, the 16-bit float conversions, and the dtype
 * torch gives a tensor made from numbers. */
#include "dt_dtype.h"

#include <math.h>
#include <stdio.h>

#include "dt_error.h"

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} s_dtypes[DT_NDTYPES] = {
    [DT_FLOAT32] = {"float32", 4, true}, [DT_FLOAT16] = {"float16", 2, true},
    [DT_BFLOAT16] = {"bfloat16", 2, true}, [DT_INT32] = {"int32", 4, false},
    [DT_INT64] = {"int64", 8, false}, [DT_BOOL] = {"bool", 1, false},
};

bool dt_dtype_valid(int dtype) { return dtype >= 0 && dtype < DT_NDTYPES; }

const char *dt_dtype_name(dt_dtype dtype) { return dt_dtype_valid(dtype) ? s_dtypes[dtype].name : "?"; }

size_t dt_dtype_size(dt_dtype dtype) { return dt_dtype_valid(dtype) ? s_dtypes[dtype].size : 0; }

bool dt_dtype_is_float(dt_dtype dtype) { return dt_dtype_valid(dtype) && s_dtypes[dtype].is_float; }

int dt_dtype_check_value(const char *op, dt_dtype dtype, dt_scalar v)
{
    double lo, hi;
    switch (dtype) {
    case DT_BOOL: return 0;
    case DT_INT32: lo = -2147483648.0, hi = 2147483647.0; break;
    case DT_INT64: lo = -9223372036854775808.0, hi = 9223372036854775807.0; break;
    case DT_FLOAT16: lo = -65504.0, hi = 65504.0; break;
    case DT_BFLOAT16: lo = -3.3895313892515355e38, hi = 3.3895313892515355e38; break;
    default: lo = -3.4028234663852886e38, hi = 3.4028234663852886e38; break;
    }
    bool fits;
    if (v.is_int)
        fits = dtype == DT_INT64 || ((double)v.i >= lo && (double)v.i <= hi);
    else if (dt_dtype_is_float(dtype))
        fits = !isfinite(v.f) || (v.f >= lo && v.f <= hi);
    else /* a float into an integer type truncates: it must be finite and in range after that */
        fits = isfinite(v.f) && trunc(v.f) >= lo && trunc(v.f) < -lo;
    if (fits)
        return 0;
    char text[64];
    if (v.is_int)
        snprintf(text, sizeof text, "%lld", (long long)v.i);
    else
        snprintf(text, sizeof text, "%g", v.f);
    return dt_err(DT_EINVAL, "%s: value %s cannot be converted to type %s without overflow", op, text,
                  dt_dtype_name(dtype));
}

float dt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in float */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t dt_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return sign | 0x7e00u; /* NaN */
    if (abs >= 0x477ff000u)
        return sign | 0x7c00u; /* rounds to infinity (>= 65520) */
    if (abs < 0x38800000u) {
        /* half subnormal or zero: round abs to a multiple of 2^-24, ties to even */
        float a;
        memcpy(&a, &abs, sizeof a);
        float scaled = a * 16777216.0f; /* exact: a * 2^24 */
        return sign | (uint16_t)nearbyintf(scaled);
    }
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);
}

dt_dtype dt_full_dtype(dt_scalar value, bool is_bool)
{
    return is_bool ? DT_BOOL : value.is_int ? DT_INT64 : DT_FLOAT32;
}

dt_dtype dt_arange_dtype(dt_scalar start, dt_scalar end, dt_scalar step)
{
    return start.is_int && end.is_int && step.is_int ? DT_INT64 : DT_FLOAT32;
}
