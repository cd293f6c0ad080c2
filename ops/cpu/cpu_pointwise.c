#include "cpu_pointwise.h"

#include <math.h>
#include <string.h>

#include "cpu_kernels.h"
#include "dt_dtype.h"

size_t cpu_ctype_size(cpu_ctype t) { return t == CPU_F32 ? 4 : t == CPU_I64 ? 8 : 1; }

/* One loop per (source, destination) pair, so the compiler vectorises each. */
#define S_CONVERT(DST_T, dst, SRC_T, src, n, EXPR)                                                                     \
    do {                                                                                                               \
        DST_T *d_ = (DST_T *)(dst);                                                                                    \
        const SRC_T *s_ = (const SRC_T *)(src);                                                                        \
        for (int64_t i = 0; i < (n); i++) {                                                                            \
            SRC_T x = s_[i];                                                                                           \
            d_[i] = (DST_T)(EXPR);                                                                                     \
        }                                                                                                              \
    } while (0)

void cpu_to_ctype(void *dst, cpu_ctype t, const void *src, dt_dtype dtype, int64_t n)
{
    switch (t) {
    case CPU_F32:
        switch (dtype) {
        case DT_FLOAT32: memcpy(dst, src, (size_t)n * 4); break;
        case DT_FLOAT16: S_CONVERT(float, dst, uint16_t, src, n, dt_f16_to_f32(x)); break;
        case DT_BFLOAT16: S_CONVERT(float, dst, uint16_t, src, n, dt_bf16_to_f32(x)); break;
        case DT_INT32: S_CONVERT(float, dst, int32_t, src, n, x); break;
        case DT_INT64: S_CONVERT(float, dst, int64_t, src, n, x); break;
        default: S_CONVERT(float, dst, uint8_t, src, n, x != 0); break;
        }
        break;
    case CPU_I64:
        switch (dtype) {
        case DT_FLOAT32: S_CONVERT(int64_t, dst, float, src, n, x); break;
        case DT_FLOAT16: S_CONVERT(int64_t, dst, uint16_t, src, n, dt_f16_to_f32(x)); break;
        case DT_BFLOAT16: S_CONVERT(int64_t, dst, uint16_t, src, n, dt_bf16_to_f32(x)); break;
        case DT_INT32: S_CONVERT(int64_t, dst, int32_t, src, n, x); break;
        case DT_INT64: memcpy(dst, src, (size_t)n * 8); break;
        default: S_CONVERT(int64_t, dst, uint8_t, src, n, x != 0); break;
        }
        break;
    default:
        switch (dtype) {
        case DT_FLOAT32: S_CONVERT(uint8_t, dst, float, src, n, x != 0); break;
        case DT_FLOAT16:
        case DT_BFLOAT16: S_CONVERT(uint8_t, dst, uint16_t, src, n, (x & 0x7fff) != 0); break;
        case DT_INT32: S_CONVERT(uint8_t, dst, int32_t, src, n, x != 0); break;
        case DT_INT64: S_CONVERT(uint8_t, dst, int64_t, src, n, x != 0); break;
        default: S_CONVERT(uint8_t, dst, uint8_t, src, n, x != 0); break;
        }
    }
}

void cpu_from_ctype(void *dst, dt_dtype dtype, const void *src, cpu_ctype t, int64_t n)
{
    switch (t) {
    case CPU_F32:
        switch (dtype) {
        case DT_FLOAT32: memcpy(dst, src, (size_t)n * 4); break;
        case DT_FLOAT16: S_CONVERT(uint16_t, dst, float, src, n, dt_f32_to_f16(x)); break;
        case DT_BFLOAT16: S_CONVERT(uint16_t, dst, float, src, n, dt_f32_to_bf16(x)); break;
        case DT_INT32: S_CONVERT(int32_t, dst, float, src, n, isfinite(x) ? x : 0); break;
        case DT_INT64: S_CONVERT(int64_t, dst, float, src, n, isfinite(x) ? x : 0); break;
        default: S_CONVERT(uint8_t, dst, float, src, n, x != 0); break;
        }
        break;
    case CPU_I64:
        switch (dtype) {
        case DT_FLOAT32: S_CONVERT(float, dst, int64_t, src, n, x); break;
        case DT_FLOAT16: S_CONVERT(uint16_t, dst, int64_t, src, n, dt_f32_to_f16((float)x)); break;
        case DT_BFLOAT16: S_CONVERT(uint16_t, dst, int64_t, src, n, dt_f32_to_bf16((float)x)); break;
        case DT_INT32: S_CONVERT(int32_t, dst, int64_t, src, n, x); break;
        case DT_INT64: memcpy(dst, src, (size_t)n * 8); break;
        default: S_CONVERT(uint8_t, dst, int64_t, src, n, x != 0); break;
        }
        break;
    default:
        switch (dtype) {
        case DT_FLOAT32: S_CONVERT(float, dst, uint8_t, src, n, x); break;
        case DT_FLOAT16: S_CONVERT(uint16_t, dst, uint8_t, src, n, x ? 0x3c00 : 0); break;
        case DT_BFLOAT16: S_CONVERT(uint16_t, dst, uint8_t, src, n, x ? 0x3f80 : 0); break;
        case DT_INT32: S_CONVERT(int32_t, dst, uint8_t, src, n, x); break;
        case DT_INT64: S_CONVERT(int64_t, dst, uint8_t, src, n, x); break;
        default: S_CONVERT(uint8_t, dst, uint8_t, src, n, x != 0); break;
        }
    }
}

void cpu_broadcast(void *dst, int out_ndim, const int64_t *out_shape, const void *src, int in_ndim,
                   const int64_t *in_shape, size_t elem)
{
    int64_t in_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS], dst_strides[DT_MAX_DIMS];
    cpu_contiguous_strides(in_ndim, in_shape, elem, in_strides);
    for (int d = 0; d < out_ndim; d++) {
        int k = d - (out_ndim - in_ndim);
        src_strides[d] = k < 0 || in_shape[k] == 1 ? 0 : in_strides[k];
    }
    cpu_contiguous_strides(out_ndim, out_shape, elem, dst_strides);
    cpu_copy_block(dst, dst_strides, src, src_strides, out_ndim, out_shape, elem);
}

#define S_MAP(T, out, a, n, EXPR)                                                                                      \
    do {                                                                                                               \
        T *o_ = (T *)(out);                                                                                            \
        const T *a_ = (const T *)(a);                                                                                  \
        for (int64_t i = 0; i < (n); i++) {                                                                            \
            T x = a_[i];                                                                                               \
            o_[i] = (EXPR);                                                                                            \
        }                                                                                                              \
    } while (0)

static float s_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

static float s_gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

void cpu_unary_run(cpu_unary op, cpu_ctype t, void *out, const void *a, int64_t n)
{
    if (op == CPU_LOGICAL_NOT) {
        S_MAP(uint8_t, out, a, n, !x);
        return;
    }
    if (op == CPU_COPY) {
        memcpy(out, a, (size_t)n * cpu_ctype_size(t));
        return;
    }
    if (t == CPU_I64) {
        switch (op) {
        case CPU_NEG: S_MAP(int64_t, out, a, n, -x); break;
        case CPU_ABS: S_MAP(int64_t, out, a, n, x < 0 ? -x : x); break;
        case CPU_RELU: S_MAP(int64_t, out, a, n, x > 0 ? x : 0); break;
        default: break; /* float functions of integers are computed in float32 (infer picks it) */
        }
        return;
    }
    switch (op) {
    case CPU_NEG: S_MAP(float, out, a, n, -x); break;
    case CPU_ABS: S_MAP(float, out, a, n, fabsf(x)); break;
    case CPU_EXP: S_MAP(float, out, a, n, expf(x)); break;
    case CPU_LOG: S_MAP(float, out, a, n, logf(x)); break;
    case CPU_SQRT: S_MAP(float, out, a, n, sqrtf(x)); break;
    case CPU_RSQRT: S_MAP(float, out, a, n, 1.0f / sqrtf(x)); break;
    case CPU_SIN: S_MAP(float, out, a, n, sinf(x)); break;
    case CPU_COS: S_MAP(float, out, a, n, cosf(x)); break;
    case CPU_TANH: S_MAP(float, out, a, n, tanhf(x)); break;
    case CPU_SIGMOID: S_MAP(float, out, a, n, 1.0f / (1.0f + expf(-x))); break;
    case CPU_RELU: S_MAP(float, out, a, n, x > 0 ? x : (x == x ? 0.0f : x)); break;
    case CPU_SILU: S_MAP(float, out, a, n, x / (1.0f + expf(-x))); break;
    case CPU_GELU: S_MAP(float, out, a, n, s_gelu(x)); break;
    case CPU_GELU_TANH: S_MAP(float, out, a, n, s_gelu_tanh(x)); break;
    case CPU_RECIPROCAL: S_MAP(float, out, a, n, 1.0f / x); break;
    default: break;
    }
}

#define S_ZIP(T, OUT_T, out, a, b, n, EXPR)                                                                            \
    do {                                                                                                               \
        OUT_T *o_ = (OUT_T *)(out);                                                                                    \
        const T *a_ = (const T *)(a), *b_ = (const T *)(b);                                                            \
        for (int64_t i = 0; i < (n); i++) {                                                                            \
            T x = a_[i], y = b_[i];                                                                                    \
            o_[i] = (OUT_T)(EXPR);                                                                                     \
        }                                                                                                              \
    } while (0)

/* Integer power by squaring; a negative exponent gives 0 unless the base is 1 or -1 (torch). */
static int64_t s_ipow(int64_t x, int64_t y)
{
    if (y < 0)
        return x == 1 ? 1 : x == -1 ? (y % 2 ? -1 : 1) : 0;
    int64_t r = 1;
    while (y) {
        if (y & 1)
            r *= x;
        x *= x;
        y >>= 1;
    }
    return r;
}

#define S_COMPARE(T, out, a, b, n, op)                                                                                 \
    switch (op) {                                                                                                      \
    case CPU_EQ: S_ZIP(T, uint8_t, out, a, b, n, x == y); break;                                                       \
    case CPU_NE: S_ZIP(T, uint8_t, out, a, b, n, x != y); break;                                                       \
    case CPU_LT: S_ZIP(T, uint8_t, out, a, b, n, x < y); break;                                                        \
    case CPU_LE: S_ZIP(T, uint8_t, out, a, b, n, x <= y); break;                                                       \
    case CPU_GT: S_ZIP(T, uint8_t, out, a, b, n, x > y); break;                                                        \
    case CPU_GE: S_ZIP(T, uint8_t, out, a, b, n, x >= y); break;                                                       \
    case CPU_LOGICAL_AND: S_ZIP(T, uint8_t, out, a, b, n, (x != 0) && (y != 0)); break;                                \
    case CPU_LOGICAL_OR: S_ZIP(T, uint8_t, out, a, b, n, (x != 0) || (y != 0)); break;                                 \
    default: break;                                                                                                    \
    }

void cpu_binary_run(cpu_binary op, cpu_ctype t, void *out, const void *a, const void *b, int64_t n)
{
    if (op >= CPU_EQ) {
        if (t == CPU_F32)
            S_COMPARE(float, out, a, b, n, op)
        else if (t == CPU_I64)
            S_COMPARE(int64_t, out, a, b, n, op)
        else
            S_COMPARE(uint8_t, out, a, b, n, op)
        return;
    }
    if (t == CPU_F32) {
        switch (op) {
        case CPU_ADD: S_ZIP(float, float, out, a, b, n, x + y); break;
        case CPU_SUB: S_ZIP(float, float, out, a, b, n, x - y); break;
        case CPU_MUL: S_ZIP(float, float, out, a, b, n, x * y); break;
        case CPU_DIV: S_ZIP(float, float, out, a, b, n, x / y); break;
        case CPU_POW: S_ZIP(float, float, out, a, b, n, powf(x, y)); break;
        /* NaN wins, as in torch */
        case CPU_MAXIMUM: S_ZIP(float, float, out, a, b, n, x != x || y != y ? x + y : x > y ? x : y); break;
        case CPU_MINIMUM: S_ZIP(float, float, out, a, b, n, x != x || y != y ? x + y : x < y ? x : y); break;
        default: break;
        }
    } else if (t == CPU_I64) {
        switch (op) {
        case CPU_ADD: S_ZIP(int64_t, int64_t, out, a, b, n, (uint64_t)x + (uint64_t)y); break;
        case CPU_SUB: S_ZIP(int64_t, int64_t, out, a, b, n, (uint64_t)x - (uint64_t)y); break;
        case CPU_MUL: S_ZIP(int64_t, int64_t, out, a, b, n, (uint64_t)x * (uint64_t)y); break;
        case CPU_POW: S_ZIP(int64_t, int64_t, out, a, b, n, s_ipow(x, y)); break;
        case CPU_MAXIMUM: S_ZIP(int64_t, int64_t, out, a, b, n, x > y ? x : y); break;
        case CPU_MINIMUM: S_ZIP(int64_t, int64_t, out, a, b, n, x < y ? x : y); break;
        default: break; /* integer division is true division, computed in float32 */
        }
    } else {
        switch (op) {
        case CPU_ADD:
        case CPU_MAXIMUM: S_ZIP(uint8_t, uint8_t, out, a, b, n, x || y); break;
        case CPU_MUL:
        case CPU_MINIMUM: S_ZIP(uint8_t, uint8_t, out, a, b, n, x && y); break;
        default: break;
        }
    }
}
