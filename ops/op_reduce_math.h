/* op_reduce_math — the softmax's exponential, written once for every backend: the CPU's kernels
 * (ops/cpu/cpu_reduce_loops.c) and CUDA's (ops/cuda/cuda_reduce_kernels.cu) expand the same arithmetic,
 * so that a softmax gives the same numbers on both (up to the order of its sum). */
#ifndef OP_REDUCE_MATH_H
#define OP_REDUCE_MATH_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define OP_RED_FN static __device__ __forceinline__
#else
#define OP_RED_FN static inline
#endif

/* The core of both vectorisable exponentials (this softmax's and op_pointwise_math.h's op_ew_exp):
 * x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts, the first product exact); returns exp(r) by
 * its Taylor series to r^8 (relative error ~1e-7) and sets *n. The callers build 2^n in exponent
 * bits, each for its own range of n. */
OP_RED_FN float op_exp_reduced(float x, int32_t *n)
{
    float t = x * 1.44269504f + 12582912.0f; /* 1.5 * 2^23: rounds to an integer held in the low bits */
    float whole = t - 12582912.0f;
    int32_t bits;
    memcpy(&bits, &t, sizeof bits);
    float r = (x - whole * 0.693145752f) - whole * 1.42860677e-6f;
    float p = 1.0f / 40320;
    p = p * r + 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    *n = bits - 0x4B400000;
    return p;
}

/* exp(x) for x in [-88, 0] (softmax's shifted values, clamped by op_softmax_clamp; NaN stays
 * NaN), in a form compilers vectorise (libm's expf is a call per element): op_exp_reduced times
 * 2^n built in the exponent bits. At -88, n = -127 gives a scale of 0: exp there is below 2^-126,
 * which no softmax sum (at least 1) can notice. */
OP_RED_FN float op_softmax_exp(float x)
{
    int32_t n;
    float p = op_exp_reduced(x, &n);
    uint32_t scale_bits = (uint32_t)(n + 127) << 23;
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return p * scale;
}

/* x clamped to [-88, 0], NaN kept (the max/min form vectorises; GCC will not vectorise the clamp
 * and the exponential in one loop, hence two functions) */
OP_RED_FN float op_softmax_clamp(float x)
{
    x = -88.0f > x ? -88.0f : x;
    return 0.0f < x ? 0.0f : x;
}

#endif
