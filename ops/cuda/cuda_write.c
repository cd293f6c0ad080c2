/* cuda_write — the in-place writes (ops/op_write.c) on the GPU: cpu_write.c's kernels on device
 * memory. slice_assign_ and shard_assign_ are a strided copy of the part of the region that falls
 * in this piece (the backend's copy_region, on the compute stream); index_copy_ checks its
 * positions first, as the CPU does, so a bad one writes nothing, then scatters rows (the last of
 * several rows for one position wins, as in the CPU's sequential copy). */
#include <stdio.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

/* slice_assign_, shard_assign_: attrs.ints = [dim, start]; ctx[0] = where this piece starts on dim */
const char *cuda_k_slice_assign(cuda_ctx *c, op_kernel *k)
{
    const op_local *dst = &k->out[0], *src = &k->in[1];
    int dim;
    int64_t lo, hi;
    const char *why = op_slice_assign_local(k, &dim, &lo, &hi);
    if (why || hi == lo)
        return why;
    size_t elem = dt_dtype_size(dst->dtype);
    int64_t dst_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS], shape[DT_MAX_DIMS];
    dt_layout_strides(dst->ndim, dst->shape, elem, dst_strides);
    dt_layout_strides(src->ndim, src->shape, elem, src_strides);
    memcpy(shape, src->shape, sizeof shape);
    shape[dim] = hi - lo;
    return cuda_backend.copy_region((char *)dst->data + (lo - k->ctx[0]) * dst_strides[dim], dst_strides,
                                    (const char *)src->data + (lo - k->attrs->ints[1]) * src_strides[dim], src_strides,
                                    dst->ndim, shape, elem);
}

/* index_copy_(dst, index (n,) int64, src): attrs.ints = [dim] */
const char *cuda_k_index_copy(cuda_ctx *c, op_kernel *k)
{
    static _Thread_local char why_buf[128];
    const char *why;
    const op_local *dst = &k->out[0], *index = &k->in[1], *src = &k->in[2];
    int dim;
    int64_t n, size, at, v;
    if ((why = op_index_copy_local(k, &dim, &n)))
        return why;
    size = dst->shape[dim];
    if ((why = cuda_index_check(c, index, 0, size, &at, &v)))
        return why;
    if (at >= 0) {
        snprintf(why_buf, sizeof why_buf, "index_copy_(): index %lld is out of bounds for dimension %d with size %lld",
                 (long long)v, dim, (long long)size);
        return why_buf;
    }
    if (dt_layout_numel(src->ndim, src->shape) == 0)
        return NULL; /* nothing to copy, and an empty piece's sizes may not multiply */
    int64_t outer = dt_layout_numel(dim, dst->shape), inner = dt_layout_numel(dst->ndim - dim - 1, dst->shape + dim + 1);
    int64_t *winner;
    if ((why = cuda_scratch(c, (size_t)size * sizeof *winner, (void **)&winner)))
        return why;
    why = cuda_check(cuda_scatter_rows(dst->data, src->data, index->data, outer, n, size,
                                       (size_t)inner * dt_dtype_size(dst->dtype), winner, c->compute),
                     "index_copy_");
    cuda_scratch_free(c, winner);
    return why;
}
