/* cpu_backend — the CPU device backend: the op_backend table filled from the cpu_* kernels.
 * Device memory is pooled host memory, so received frames become storage without a copy, values
 * are sent from storage in place, and thread workers read each other's pieces directly. Every
 * slot finishes its work before it returns; none can fail but alloc and run. It is also the
 * host backend: the controller's own memory is host memory. */
#include <stdint.h>

#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "dt_pool.h"

static const char *s_copy(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides, int ndim,
                          const int64_t *shape, size_t elem_size)
{
    cpu_copy_block(dst, dst_strides, src, src_strides, ndim, shape, elem_size);
    return NULL;
}

/* Kernels read pieces through typed pointers: a frame becomes storage only when 8-byte aligned. */
static bool s_adopt_host(const void *host, size_t size) { return (uintptr_t)host % 8 == 0; }

static const void *s_host_view(const void *data) { return data; }

static const char *s_run(const op_def *def, op_kernel *k)
{
    return cpu_kernel_for(def->id)(k); /* every row has one (ops/op_table.h) */
}

static const char *s_fill(void *dst, dt_dtype dtype, int64_t n, dt_scalar value)
{
    cpu_fill(dst, dtype, n, value);
    return NULL;
}

static const char *s_random(void *dst, dt_dtype dtype, int ndim, const int64_t *shape, const int64_t *offset,
                            const int64_t *global_shape, uint64_t seed, uint64_t stream, bool normal)
{
    cpu_random(dst, dtype, ndim, shape, offset, global_shape, seed, stream, normal);
    return NULL;
}

static const char *s_arange(void *dst, dt_dtype dtype, int64_t n, int64_t first, dt_scalar start, dt_scalar step)
{
    cpu_arange(dst, dtype, n, first, start, step);
    return NULL;
}

static const char *s_combine(void *dst, const void *a, const void *b, dt_dtype dtype, int64_t n, dt_reduce_op op)
{
    cpu_combine_pieces(dst, a, b, dtype, n, op);
    return NULL;
}

static const char *s_scale_div(void *acc, dt_dtype dtype, int64_t n, int64_t divisor)
{
    cpu_scale_div(acc, dtype, n, divisor);
    return NULL;
}

/* A CPU device's memory is the host's (every device of a host shares it, each piece fits alone). */
static size_t s_memory_size(int64_t device_id)
{
    (void)device_id;
    return dt_pool_host_memory();
}

const op_backend cpu_backend = {
    .name = "cpu",
    .alloc = dt_pool_alloc,
    .free = dt_pool_free,
    .memory_size = s_memory_size,
    .to_device = s_copy,
    .to_host = s_copy,
    .copy_region = s_copy,
    .adopt_host = s_adopt_host,
    .host_view = s_host_view,
    .copy_from_peer = s_copy,
    .run = s_run,
    .fill = s_fill,
    .random = s_random,
    .arange = s_arange,
    .combine = s_combine,
    .scale_div = s_scale_div,
    .synchronize = NULL,
};
