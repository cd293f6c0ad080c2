/* cpu_pointwise — elementwise kernels over contiguous arrays of a compute type, and the
 * conversions that bring a piece of any dtype (broadcast to an output shape) into one. */
#ifndef CPU_POINTWISE_H
#define CPU_POINTWISE_H

#include <stdint.h>

#include "dtorch.h"

/* Compute types: floating values in float32, integers in int64, truth values in uint8. */
typedef enum { CPU_F32 = 0, CPU_I64 = 1, CPU_U8 = 2 } cpu_ctype;

typedef enum {
    CPU_NEG, CPU_ABS, CPU_EXP, CPU_LOG, CPU_SQRT, CPU_RSQRT, CPU_SIN, CPU_COS, CPU_TANH, CPU_SIGMOID, CPU_RELU,
    CPU_SILU, CPU_GELU, CPU_GELU_TANH, CPU_RECIPROCAL, CPU_LOGICAL_NOT, CPU_COPY,
} cpu_unary;

typedef enum {
    CPU_ADD, CPU_SUB, CPU_MUL, CPU_DIV, CPU_POW, CPU_MAXIMUM, CPU_MINIMUM,
    CPU_EQ, CPU_NE, CPU_LT, CPU_LE, CPU_GT, CPU_GE, CPU_LOGICAL_AND, CPU_LOGICAL_OR,
} cpu_binary;

size_t cpu_ctype_size(cpu_ctype t);

/* dst (n elements of ctype) = src (n elements of dtype), converted. */
void cpu_to_ctype(void *dst, cpu_ctype t, const void *src, dt_dtype dtype, int64_t n);
/* dst (n elements of dtype) = src (n elements of ctype), converted (bool: nonzero). */
void cpu_from_ctype(void *dst, dt_dtype dtype, const void *src, cpu_ctype t, int64_t n);

/* Expands a C-contiguous array of shape in_shape (right-aligned against out_shape, size-1 dims
 * broadcast) into a C-contiguous array of out_shape; elements of elem bytes. */
void cpu_broadcast(void *dst, int out_ndim, const int64_t *out_shape, const void *src, int in_ndim,
                   const int64_t *in_shape, size_t elem);

/* out = op(a) over n elements; CPU_LOGICAL_NOT reads and writes CPU_U8, the rest are for t. */
void cpu_unary_run(cpu_unary op, cpu_ctype t, void *out, const void *a, int64_t n);
/* out = a op b over n elements of t; comparisons and logical ops write CPU_U8. */
void cpu_binary_run(cpu_binary op, cpu_ctype t, void *out, const void *a, const void *b, int64_t n);

#endif
