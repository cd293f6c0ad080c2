/* cpu_reduce_loops — reductions, scans, softmax, top-k and normalisation over C-contiguous arrays of a
 * compute type (cpu_ctype: float32 for floating values, int64 for integers).
 *
 * Most kernels see their array as (outer, n, inner): outer blocks of n rows of inner elements,
 * working along n. Loops run over inner innermost so the compiler vectorises them; a reduction
 * along the last dim (inner == 1) keeps several partial results side by side for the same reason
 * (which also bounds float32 rounding error better than one running sum).
 * NaN propagates like torch: max/min and argmax/argmin treat NaN as the extreme value. */
#ifndef CPU_REDUCE_LOOPS_H
#define CPU_REDUCE_LOOPS_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu_pointwise.h"

typedef enum { CPU_RED_SUM, CPU_RED_MAX, CPU_RED_MIN } cpu_red;

/* out (outer, inner) = op over n of in (outer, n, inner); t is CPU_F32 or CPU_I64; n >= 1. */
void cpu_reduce_run(cpu_red op, cpu_ctype t, void *out, const void *in, int64_t outer, int64_t n, int64_t inner);

/* acc[i] = op(acc[i], part[i]) for n elements of t (NaN wins a float max/min). */
void cpu_combine(cpu_red op, cpu_ctype t, void *acc, const void *part, int64_t n);

/* Reduces the C-contiguous array in (ndim, shape) over the dims whose bit is set in mask; out
 * holds the kept dims, C-contiguous. Every reduced dim must be non-empty. NULL, or why not. */
const char *cpu_reduce_dims(cpu_red op, cpu_ctype t, void *out, const void *in, int ndim, const int64_t *shape,
                            uint32_t mask);

/* index/values (outer, inner) = position and value of the largest (smallest) element along n;
 * the first one on ties; a NaN beats any number. n >= 1. */
void cpu_arg_run(bool largest, cpu_ctype t, int64_t *index, void *values, const void *in, int64_t outer, int64_t n,
                 int64_t inner);

/* out = softmax (or log_softmax) of in along n, float32, max-shifted. NULL, or why not. */
const char *cpu_softmax_run(bool log, float *out, const float *in, int64_t outer, int64_t n, int64_t inner);

/* An attention row's weights before normalising: exp(x[j] - top) over n floats (-inf, a hidden
 * key, gives exactly 0; NaN stays NaN), by softmax's vectorised exponential, in place into x, or
 * into w rounded to bfloat16 where w is given (x then holds anything); returns their sum (of the
 * float weights). top is the row's largest visible value (finite; NaN makes every weight NaN). */
float cpu_exp_shifted_sum(float *x, uint16_t *w, int64_t n, float top);

/* x[j] *= pre over n floats (nothing written for pre 1), returning the largest of them: -inf for
 * none, NaN where one is NaN (as torch's softmax, the row then comes out NaN rather than some
 * number). */
float cpu_scaled_max(float *x, int64_t n, float pre);

/* out = running sum of in along n. */
void cpu_cumsum_run(cpu_ctype t, void *out, const void *in, int64_t outer, int64_t n, int64_t inner);

/* values/index (outer, k, inner) = the k largest (smallest) elements along n, in order (largest
 * first, or smallest first); ties keep the lower index first; NaN counts as the largest value.
 * NULL, or why not. */
const char *cpu_topk_run(cpu_ctype t, void *values, int64_t *index, const void *in, int64_t outer, int64_t n,
                         int64_t inner, int64_t k, bool largest);

/* Normalises each of rows rows of d elements: (x - mean) / sqrt(var + eps) for layer norm, or
 * x / sqrt(mean(x^2) + eps) for rms; then times weight[j] and plus bias[j] where given (NULL:
 * none). Biased variance, computed in two passes. */
void cpu_norm_run(bool rms, float *out, const float *in, int64_t rows, int64_t d, const float *weight,
                  const float *bias, float eps);

#endif
