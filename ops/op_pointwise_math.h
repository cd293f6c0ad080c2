/* op_pointwise_math — the elementwise ops' expressions, one line per op (OP_POINTWISE's rows in
 * ops/op_table.h), and the helpers they call: what every backend computes, in the compute types,
 * so that the CPU's kernels (ops/cpu/cpu_pointwise.c) and CUDA's (ops/cuda/cuda_pointwise_kernels.cu)
 * are the same arithmetic written once. Each backend's drivers read operands, broadcast them and
 * convert dtypes around these; x and y are the operands, T the integer type of integer
 * expressions, p the float attributes of the row. */
#ifndef OP_POINTWISE_MATH_H
#define OP_POINTWISE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "op_reduce_math.h"

#ifdef __CUDACC__
#define OP_EW_FN static __device__ __forceinline__
#else
#define OP_EW_FN static inline
#endif

/* c ? a : b, chosen by the bits: compilers vectorise this form where they will not vectorise the
 * ternary of floats whose result feeds more arithmetic (GCC's if-conversion gives up on it under the
 * default -ftrapping-math) */
OP_EW_FN float op_ew_pick(int c, float a, float b)
{
    int32_t ia, ib, m = -c;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    int32_t r = (ia & m) | (ib & ~m);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

/* exp(x) for every float, in a form compilers vectorise (libm's expf is a call per element, which
 * left the activations' loops scalar): x is clamped to [-104, 89] (NaN kept), outside which expf
 * rounds to 0 or overflows alike; exp(r) from op_exp_reduced (op_reduce_math.h, softmax's core),
 * times 2^n as two scales built in the exponent bits (n runs from -150 to 128, beyond one scale's
 * normal range), so results below 2^-126 come out subnormal and those above FLT_MAX infinite where
 * expf's do. Over a sweep of every 7th float the error is at most 1.16 ulp of exp in double
 * precision (9.7e-8 relative where the result is a normal float); expf(-inf) = 0, expf(inf) = inf
 * and NaN as expf gives them (tests/test_kernels.c). */
OP_EW_FN float op_ew_exp(float x)
{
    x = op_ew_pick(-104.0f > x, -104.0f, x);
    x = op_ew_pick(89.0f < x, 89.0f, x);
    int32_t k;
    float p = op_exp_reduced(x, &k);
    int32_t h = k >> 1;
    uint32_t hi_bits = (uint32_t)(h + 127) << 23, lo_bits = (uint32_t)(k - h + 127) << 23;
    float hi, lo;
    memcpy(&hi, &hi_bits, sizeof hi);
    memcpy(&lo, &lo_bits, sizeof lo);
    return p * hi * lo;
}

OP_EW_FN float op_ew_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

/* 0.5 x (1 + tanh(u)) written as x / (1 + exp(-2u)): the same function, one exponential instead of
 * tanhf (which costs an expm1f and a division: three times the time in a diffusion model's MLP) */
OP_EW_FN float op_ew_gelu_tanh(float x)
{
    return x / (1.0f + op_ew_exp(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
}

/* torch's: linear above the threshold, where log(1 + exp) would round to it anyway */
OP_EW_FN float op_ew_softplus(float x, float beta, float threshold)
{
    return x * beta > threshold ? x : log1pf(op_ew_exp(x * beta)) / beta;
}

/* A float's integer value, truncated toward zero, as every backend converts one: NaN, the
 * infinities and values beyond the type's range give its minimum, as torch's conversion does on x86
 * (where a plain C cast of those, undefined behaviour, happens to give it). */
OP_EW_FN int64_t op_ew_f2i64(double x)
{
    return x >= -9223372036854775808.0 && x < 9223372036854775808.0 ? (int64_t)x : INT64_MIN;
}

OP_EW_FN int32_t op_ew_f2i32(double x)
{
    return x > -2147483649.0 && x < 2147483648.0 ? (int32_t)x : INT32_MIN;
}

/* Integer power by squaring; a negative exponent gives 0 unless the base is 1 or -1 (torch). */
OP_EW_FN int64_t op_ew_ipow(int64_t x, int64_t y)
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

/* clamp: min(max(x, lo), hi), as torch's: NaN in x or in a bound gives NaN, and a lower bound above
 * the upper one gives the upper one. An absent bound is an infinity (floats) or the extreme of
 * int64 (integers: op_clamp_bounds). */
OP_EW_FN float op_ew_clamp(float x, float lo, float hi)
{
    x = x != x || lo != lo ? x + lo : x < lo ? lo : x;
    return x != x || hi != hi ? x + hi : x > hi ? hi : x;
}

OP_EW_FN int64_t op_ew_iclamp(int64_t x, int64_t lo, int64_t hi)
{
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}

/* Integer floor division and its remainder, as Python's // and % (and torch's floor_divide and
 * remainder): the quotient rounds toward minus infinity, the remainder takes the divisor's sign.
 * The most negative value divided by -1 wraps, as the other integer ops do. A zero divisor gives 0
 * here, and fails the op on every backend (OP_EW_BINARY_DIVIDING): on the CPU this sets
 * op_ew_zero_division (thread-local), which the kernel turns into the op's error; a GPU kernel marks
 * a zero divisor itself (ops/cuda/cuda_pointwise_kernels.cu). */
#define OP_EW_ZERO_DIVISION_ERROR(name) #name ": ZeroDivisionError (an integer divided by zero)"
#ifdef __CUDACC__
#define OP_EW_ZERO_DIVISION() ((void)0)
#else
extern _Thread_local int op_ew_zero_division;
#define OP_EW_ZERO_DIVISION() ((void)(op_ew_zero_division = 1))
#endif

OP_EW_FN int64_t op_ew_ifloordiv(int64_t x, int64_t y)
{
    if (y == 0) {
        OP_EW_ZERO_DIVISION();
        return 0;
    }
    if (y == -1)
        return (int64_t)(0 - (uint64_t)x);
    int64_t q = x / y;
    return x % y != 0 && (x < 0) != (y < 0) ? q - 1 : q;
}

OP_EW_FN int64_t op_ew_iremainder(int64_t x, int64_t y)
{
    if (y == 0) {
        OP_EW_ZERO_DIVISION();
        return 0;
    }
    if (y == -1)
        return 0;
    int64_t r = x % y;
    return r != 0 && (r < 0) != (y < 0) ? r + y : r;
}

/* Float remainder with the divisor's sign (NaN for a zero divisor, as fmod gives). */
OP_EW_FN float op_ew_remainder(float x, float y)
{
    float r = fmodf(x, y);
    if (r != 0.0f)
        return (r < 0.0f) != (y < 0.0f) ? r + y : r;
    return copysignf(0.0f, y);
}

/* Float floor division, Python's way: from the remainder, so that x == q * y + remainder(x, y)
 * holds as closely as rounding allows (floorf(x / y) can be one off when x / y rounds up to an
 * integer); a zero divisor gives x / y (an infinity or NaN), as torch. */
OP_EW_FN float op_ew_floordiv(float x, float y)
{
    if (y == 0.0f)
        return x / y;
    float r = fmodf(x, y);
    float q = (x - r) / y;
    if (r != 0.0f && (r < 0.0f) != (y < 0.0f))
        q -= 1.0f;
    if (q == 0.0f)
        return copysignf(0.0f, x / y);
    float f = floorf(q);
    return q - f > 0.5f ? f + 1.0f : f;
}

/* ---- the ops: one line each ------------------------------------------------------------------ */

/* Unary ops of floating values (their dtype rule makes the output floating): name, float32
 * expression of x (p: the float attributes of the row, in order). */
#define OP_EW_UNARY_FLOAT(X)                                                                                           \
    X(exp, op_ew_exp(x))                                                                                               \
    X(log, logf(x))                                                                                                    \
    X(sqrt, sqrtf(x))                                                                                                  \
    X(rsqrt, 1.0f / sqrtf(x))                                                                                          \
    X(sin, sinf(x))                                                                                                    \
    X(cos, cosf(x))                                                                                                    \
    X(tanh, tanhf(x))                                                                                                  \
    X(sigmoid, 1.0f / (1.0f + op_ew_exp(-x)))                                                                          \
    X(silu, x / (1.0f + op_ew_exp(-x)))                                                                                \
    X(gelu, op_ew_gelu(x))                                                                                             \
    X(gelu_tanh, op_ew_gelu_tanh(x))                                                                                   \
    X(reciprocal, 1.0f / x)                                                                                            \
    X(erf, erff(x))                                                                                                    \
    X(softplus, op_ew_softplus(x, (float)p[0], (float)p[1]))

/* Unary ops of numbers: name, float32 expression, integer expression (T: int32_t or int64_t;
 * integers wrap, computed in uint64_t). */
#define OP_EW_UNARY_NUMBER(X)                                                                                          \
    X(neg, -x, (T)(0 - (uint64_t)x))                                                                                   \
    X(abs, fabsf(x), x < 0 ? (T)(0 - (uint64_t)x) : x)                                                                 \
    X(relu, x > 0 ? x : (x == x ? 0.0f : x), x > 0 ? x : 0)                                                          \
    X(floor, floorf(x), x)                                                                                             \
    X(ceil, ceilf(x), x)                                                                                               \
    X(round, nearbyintf(x), x) /* halves to even, as torch */                                                          \
    X(trunc, truncf(x), x)

/* Binary ops of every dtype: name, float32, integer, bool (0/1) expression of x and y. NaN wins
 * maximum and minimum, as in torch. */
#define OP_EW_BINARY_ANY(X)                                                                                            \
    X(add, x + y, (T)((uint64_t)x + (uint64_t)y), x | y)                                                               \
    X(mul, x * y, (T)((uint64_t)x * (uint64_t)y), x & y)                                                               \
    X(maximum, x != x || y != y ? x + y : x > y ? x : y, x > y ? x : y, x | y)                                         \
    X(minimum, x != x || y != y ? x + y : x < y ? x : y, x < y ? x : y, x & y)

/* Binary ops of numbers: name, float32, integer expression. */
#define OP_EW_BINARY_NUMBER(X)                                                                                         \
    X(sub, x - y, (T)((uint64_t)x - (uint64_t)y))                                                                      \
    X(pow, powf(x, y), (T)op_ew_ipow(x, y))

/* ... and those whose integer expression divides: an integer zero divisor fails the op with
 * OP_EW_ZERO_DIVISION_ERROR on every backend, as torch's CPU kernels do. */
#define OP_EW_BINARY_DIVIDING(X)                                                                                       \
    X(floor_divide, op_ew_floordiv(x, y), (T)op_ew_ifloordiv(x, y))                                                    \
    X(remainder, op_ew_remainder(x, y), (T)op_ew_iremainder(x, y))

/* Binary ops of floating values: name, float32 expression (div: integers divide as floats). */
#define OP_EW_BINARY_FLOAT(X) X(div, x / y)

/* Comparisons, of operands of any dtype (compared in their promotion), giving bool. */
#define OP_EW_COMPARE(X) X(eq, x == y) X(ne, x != y) X(lt, x < y) X(le, x <= y) X(gt, x > y) X(ge, x >= y)

/* Logical ops: of the operands' truth values (nonzero), giving bool. */
#define OP_EW_LOGICAL(X) X(logical_and, x && y) X(logical_or, x || y)

#endif
