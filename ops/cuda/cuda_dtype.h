/* cuda_dtype — the 16-bit float conversions of core/dt_dtype.h and ops/cpu/cpu_kernels.c, written
 * once more as device functions: the same integer steps, so that a value converted on
 * the GPU has the CPU's bits (round to nearest even, NaN quiet, double -> 16 bits rounded once). */
#ifndef CUDA_DTYPE_H
#define CUDA_DTYPE_H

#include <stdint.h>

#include "dtorch.h"

#define CUDA_HD __device__ __forceinline__

CUDA_HD float cuda_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

CUDA_HD uint16_t cuda_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

CUDA_HD float cuda_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)
        return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float f = (float)man * 0x1p-24f; /* exact */
        return sign ? -f : f;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

CUDA_HD uint16_t cuda_f32_to_f16(float f)
{
    uint32_t u = __float_as_uint(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return sign | 0x7e00u;
    if (abs >= 0x477ff000u)
        return sign | 0x7c00u;
    if (abs < 0x38800000u)
        return sign | (uint16_t)rintf(__uint_as_float(abs) * 16777216.0f); /* ties to even */
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);
}

/* double -> float rounded to odd: the sticky bit survives, so a second rounding to 16 bits is
 * the correctly rounded one (cpu_kernels.c, s_f64_to_f32_odd) */
CUDA_HD float cuda_f64_to_f32_odd(double v)
{
    float f = (float)v;
    if (v != v || (double)f == v)
        return f;
    if (fabs((double)f) > fabs(v))
        f = nextafterf(f, 0.0f);
    return __uint_as_float(__float_as_uint(f) | 1u);
}

CUDA_HD uint16_t cuda_f64_to_f16(double v) { return cuda_f32_to_f16(cuda_f64_to_f32_odd(v)); }
CUDA_HD uint16_t cuda_f64_to_bf16(double v) { return cuda_f32_to_bf16(cuda_f64_to_f32_odd(v)); }

/* Element i of a piece in the compute types of the reductions and norms (cpu_to_ctype and
 * cpu_from_ctype): float32 from and to float32, float16 and bfloat16; int64 from and to int32,
 * int64 and bool. */
CUDA_HD float cuda_load_f32(const void *p, dt_dtype d, int64_t i)
{
    switch (d) {
    case DT_FLOAT16: return cuda_f16_to_f32(((const uint16_t *)p)[i]);
    case DT_BFLOAT16: return cuda_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

CUDA_HD void cuda_store_f32(void *p, dt_dtype d, int64_t i, float v)
{
    switch (d) {
    case DT_FLOAT16: ((uint16_t *)p)[i] = cuda_f32_to_f16(v); break;
    case DT_BFLOAT16: ((uint16_t *)p)[i] = cuda_f32_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

CUDA_HD int64_t cuda_load_i64(const void *p, dt_dtype d, int64_t i)
{
    switch (d) {
    case DT_INT32: return ((const int32_t *)p)[i];
    case DT_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return ((const int64_t *)p)[i];
    }
}

CUDA_HD void cuda_store_i64(void *p, dt_dtype d, int64_t i, int64_t v)
{
    switch (d) {
    case DT_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: ((int64_t *)p)[i] = v; break;
    }
}

#endif
