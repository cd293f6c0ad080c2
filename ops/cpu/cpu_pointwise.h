/* cpu_pointwise — the conversions that bring a piece of any dtype (broadcast to an output shape)
 * into a compute type and back. The elementwise ops' kernels are in cpu_pointwise.c, found
 * through cpu_ops.h. */
#ifndef CPU_POINTWISE_H
#define CPU_POINTWISE_H

#include <stdint.h>

#include "dtorch.h"

/* Compute types: floating values in float32, integers in int64, truth values in uint8. */
typedef enum { CPU_F32 = 0, CPU_I64 = 1, CPU_U8 = 2 } cpu_ctype;

size_t cpu_ctype_size(cpu_ctype t);

/* dst (n elements of ctype) = src (n elements of dtype), converted. */
void cpu_to_ctype(void *dst, cpu_ctype t, const void *src, dt_dtype dtype, int64_t n);
/* dst (n elements of dtype) = src (n elements of ctype), converted (bool: nonzero). */
void cpu_from_ctype(void *dst, dt_dtype dtype, const void *src, cpu_ctype t, int64_t n);
/* dst (n elements of to) = src (n elements of from), converted as the two above do. */
void cpu_convert(void *dst, dt_dtype to, const void *src, dt_dtype from, int64_t n);

/* Expands a C-contiguous array of shape in_shape (right-aligned against out_shape, size-1 dims
 * broadcast) into a C-contiguous array of out_shape; elements of elem bytes. */
void cpu_broadcast(void *dst, int out_ndim, const int64_t *out_shape, const void *src, int in_ndim,
                   const int64_t *in_shape, size_t elem);

#endif
