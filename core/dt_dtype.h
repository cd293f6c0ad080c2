/* dt_dtype — element types: sizes, names and the 16-bit float conversions. */
#ifndef DT_DTYPE_H
#define DT_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "dtorch.h"

bool dt_dtype_valid(int dtype);
bool dt_dtype_is_float(dt_dtype dtype);
/* 0 when the number fits dtype (torch's rule: integers in range, floats finite and within the
 * largest finite value or infinite or NaN for float dtypes; anything for bool), else DT_EINVAL
 * "<op>: value V cannot be converted to type T without overflow". */
int dt_dtype_check_value(const char *op, dt_dtype dtype, dt_scalar value);

/* Round-to-nearest-even conversions; NaN stays NaN, overflow goes to infinity. */
static inline float dt_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t dt_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);

#endif
