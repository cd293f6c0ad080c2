/* cpu_write — the CPU kernel of the in-place writes (ops/op_write.c): the part of the region that
 * falls in this device's piece, copied into place (shard_assign_: the region is src's piece at the
 * start within the piece; its local hook says the piece starts at 0). */
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

/* The byte strides of dst and src (both contiguous) and src's shape, to copy a block of src into
 * dst; returns the element size. */
static size_t s_layout(const op_local *dst, const op_local *src, int64_t *dst_strides, int64_t *src_strides,
                       int64_t *shape)
{
    size_t elem = dt_dtype_size(dst->dtype);
    cpu_contiguous_strides(dst->ndim, dst->shape, elem, dst_strides);
    cpu_contiguous_strides(src->ndim, src->shape, elem, src_strides);
    memcpy(shape, src->shape, DT_MAX_DIMS * sizeof *shape);
    return elem;
}

const char *cpu_k_slice_assign(op_kernel *k)
{
    const op_local *dst = &k->out[0], *src = &k->in[1];
    int dim;
    int64_t lo, hi;
    const char *why = op_slice_assign_local(k, &dim, &lo, &hi);
    if (why || hi == lo)
        return why;
    int64_t dst_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS], shape[DT_MAX_DIMS];
    size_t elem = s_layout(dst, src, dst_strides, src_strides, shape);
    shape[dim] = hi - lo;
    cpu_copy_block((char *)dst->data + (lo - k->ctx[0]) * dst_strides[dim], dst_strides,
                   (const char *)src->data + (lo - k->attrs->ints[1]) * src_strides[dim], src_strides, dst->ndim,
                   shape, elem);
    return NULL;
}

/* index_copy_: row i of src (along dim) to row index[i] of dst; the indices are checked first, so
 * a bad one writes nothing. */
const char *cpu_k_index_copy(op_kernel *k)
{
    static _Thread_local char why_buf[128];
    const op_local *dst = &k->out[0], *index = &k->in[1], *src = &k->in[2];
    int dim;
    int64_t n;
    const char *why = op_index_copy_local(k, &dim, &n);
    if (why)
        return why;
    const int64_t *at = index->data;
    int64_t size = dst->shape[dim];
    for (int64_t i = 0; i < n; i++)
        if (at[i] < 0 || at[i] >= size) {
            snprintf(why_buf, sizeof why_buf, "index_copy_(): index %lld is out of bounds for dimension %d with size %lld",
                     (long long)at[i], dim, (long long)size);
            return why_buf;
        }
    if (dt_layout_numel(src->ndim, src->shape) == 0)
        return NULL; /* nothing to copy, and an empty piece's strides may not multiply */
    int64_t dst_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS], shape[DT_MAX_DIMS];
    size_t elem = s_layout(dst, src, dst_strides, src_strides, shape);
    shape[dim] = 1;
    for (int64_t i = 0; i < n; i++)
        cpu_copy_block((char *)dst->data + at[i] * dst_strides[dim], dst_strides,
                       (const char *)src->data + i * src_strides[dim], src_strides, dst->ndim, shape, elem);
    return NULL;
}
