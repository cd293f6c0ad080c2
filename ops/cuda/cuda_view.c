/* cuda_view — the views and data movement (OP_VIEW) and embedding on the GPU: cpu_view.c's kernels
 * on device memory. Every kernel writes a fresh C-contiguous output; the reshapes, permute, expand,
 * cat, stack and the slices are strided copies (the backend's copy_region, on the compute stream);
 * index_select and embedding gather rows and triu/tril mask them (cuda_view_kernels.cu).
 *
 * embedding is a row of the products' family (ops/op_matmul.c) but the same gather as
 * index_select, so it is here.
 *
 * Indices out of range fail the op with the CPU's message. Only the device knows them, so these
 * kernels wait for the compute stream (cuda_index_check), as the integer floor_divide and remainder
 * do for zero divisors (cuda_pointwise.c): the failure must be this op's, not a later
 * synchronisation's. */
#include <inttypes.h>
#include <stdio.h>

#include "cuda_backend.h"
#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

static _Thread_local char s_why[160];

/* C-contiguous byte strides of a piece */
static void s_strides(const op_local *p, int64_t *strides)
{
    dt_layout_strides(p->ndim, p->shape, dt_dtype_size(p->dtype), strides);
}

const char *cuda_index_check(cuda_ctx *c, const op_local *idx, int64_t lo, int64_t hi, int64_t *at, int64_t *value)
{
    int64_t n = dt_layout_numel(idx->ndim, idx->shape), first = n;
    *at = -1;
    if (n == 0)
        return NULL;
    if (idx->dtype != DT_INT32 && idx->dtype != DT_INT64)
        return "indices must be int32 or int64 (internal error)";
    int64_t *dev;
    const char *why = cuda_scratch(c, sizeof *dev, (void **)&dev);
    if (!why)
        why = cuda_check(cuda_find_bad_index(idx->data, idx->dtype, n, lo, hi, dev, c->compute), "index check");
    if (!why)
        why = cuda_check(cudaMemcpyAsync(&first, dev, sizeof first, cudaMemcpyDeviceToHost, c->compute), "index check");
    cuda_scratch_free(c, dev);
    if (!why)
        why = cuda_check(cudaStreamSynchronize(c->compute), "index check");
    if (why || first >= n)
        return why;
    *at = first;
    size_t elem = dt_dtype_size(idx->dtype);
    int32_t v32 = 0;
    int64_t v64 = 0;
    why = cuda_check(cudaMemcpyAsync(elem == 4 ? (void *)&v32 : (void *)&v64, (const char *)idx->data + first * elem,
                                     elem, cudaMemcpyDeviceToHost, c->compute),
                     "index check");
    if (!why)
        why = cuda_check(cudaStreamSynchronize(c->compute), "index check");
    *value = elem == 4 ? v32 : v64;
    return why;
}

/* reshape / flatten / unsqueeze / squeeze: the same bytes in the same order */
const char *cuda_k_reshape(cuda_ctx *c, op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    if (n != dt_layout_numel(in->ndim, in->shape) || in->dtype != out->dtype)
        return "local piece does not match the output (internal error)";
    int64_t one[1] = {1}, bytes[1] = {n * (int64_t)dt_dtype_size(out->dtype)};
    return cuda_backend.copy_region(out->data, one, in->data, one, 1, bytes, 1);
}

/* permute: attrs.ints = the permutation (negative dims allowed) */
const char *cuda_k_permute(cuda_ctx *c, op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t in_strides[DT_MAX_DIMS], src[DT_MAX_DIMS], dst[DT_MAX_DIMS];
    int perm[DT_MAX_DIMS];
    const char *why = op_permute_local(k, perm);
    if (why)
        return why;
    s_strides(in, in_strides);
    for (int i = 0; i < in->ndim; i++)
        src[i] = in_strides[perm[i]];
    s_strides(out, dst);
    return cuda_backend.copy_region(out->data, dst, in->data, src, out->ndim, out->shape, dt_dtype_size(in->dtype));
}

/* expand: size-1 local dims broadcast to the output's local shape (right-aligned): stride 0 */
const char *cuda_k_expand(cuda_ctx *c, op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t in_strides[DT_MAX_DIMS], src[DT_MAX_DIMS], dst[DT_MAX_DIMS];
    const char *why = op_expand_local(k);
    if (why)
        return why;
    s_strides(in, in_strides);
    for (int d = 0; d < out->ndim; d++) {
        int j = d - (out->ndim - in->ndim);
        src[d] = j >= 0 && in->shape[j] == out->shape[d] ? in_strides[j] : 0;
    }
    s_strides(out, dst);
    return cuda_backend.copy_region(out->data, dst, in->data, src, out->ndim, out->shape, dt_dtype_size(in->dtype));
}

/* cat, stack: attrs.ints[0] = dim (of the output); inputs converted to the output dtype (as
 * cpu_convert does) and laid side by side along dim */
const char *cuda_k_cat(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    why = NULL;
    op_local *out = &k->out[0];
    size_t elem = dt_dtype_size(out->dtype);
    int dim = op_cat_dim(k);
    int64_t dst_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS], shape[DT_MAX_DIMS];
    if (dim < 0)
        return "cat: bad dim (internal error)";
    s_strides(out, dst_strides);
    int64_t pos = 0;
    for (int i = 0; i < k->nin && !why; i++) {
        const op_local *in = &k->in[i];
        int64_t at = pos;
        if ((why = op_cat_block(k, i, dim, &pos, shape)))
            return why;
        int64_t n = dt_layout_numel(in->ndim, in->shape);
        if (n == 0)
            continue; /* nothing to copy, and an empty output's strides may not multiply */
        const void *src = in->data;
        void *converted = NULL;
        if (in->dtype != out->dtype) {
            why = cuda_scratch(c, (size_t)n * elem, &converted);
            if (!why)
                why = cuda_check(cuda_convert(converted, out->dtype, in->data, in->dtype, n, c->compute), "conversion");
            src = converted;
        }
        dt_layout_strides(out->ndim, shape, elem, src_strides);
        if (!why)
            why = cuda_backend.copy_region((char *)out->data + at * dst_strides[dim], dst_strides, src, src_strides,
                                           out->ndim, shape, elem);
        cuda_scratch_free(c, converted);
    }
    if (why)
        return why;
    return pos == out->shape[dim] ? NULL : "cat: local pieces do not fill the output (internal error)";
}

/* slice / narrow / select: ctx = {dim, start, step} (normalised); select drops the dim */
const char *cuda_k_slice(cuda_ctx *c, op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    op_slice_dims s;
    const char *why = op_slice_layout(k, &s);
    if (why || dt_layout_numel(in->ndim, s.shape) == 0)
        return why;
    size_t elem = dt_dtype_size(in->dtype);
    int64_t src[DT_MAX_DIMS], dst[DT_MAX_DIMS];
    s_strides(in, src);
    dt_layout_strides(in->ndim, s.shape, elem, dst);
    const char *base = (const char *)in->data + s.start * src[s.dim];
    src[s.dim] *= s.step;
    return cuda_backend.copy_region(out->data, dst, base, src, in->ndim, s.shape, elem);
}

/* index_select(x, idx): attrs.ints = {dim, wrap}: idx holds int32/int64 positions along dim of
 * the local x (whole along dim); wrap = 1 accepts negative positions (x[idx]) */
const char *cuda_k_index_select(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *x = &k->in[0], *idx = &k->in[1];
    op_local *out = &k->out[0];
    int dim;
    if ((why = op_index_select_local(k, &dim)))
        return why;
    bool wrap = k->attrs->nints > 1 && k->attrs->ints[1];
    int64_t m = dt_layout_numel(idx->ndim, idx->shape), size = x->shape[dim], at, v;
    if ((why = cuda_index_check(c, idx, wrap ? -size : 0, size, &at, &v)))
        return why;
    if (at >= 0) {
        if (!wrap)
            return "index out of range in self";
        snprintf(s_why, sizeof s_why, "index %" PRId64 " is out of bounds for dimension %d with size %" PRId64, v, dim,
                 size);
        return s_why;
    }
    if (dt_layout_numel(out->ndim, out->shape) == 0)
        return NULL; /* nothing to copy, and an empty piece's sizes may not multiply */
    int64_t outer = dt_layout_numel(dim, x->shape), inner = dt_layout_numel(x->ndim - dim - 1, x->shape + dim + 1);
    return cuda_check(cuda_gather_rows(out->data, x->data, idx->data, idx->dtype, outer, m, size, 0, wrap ? size : 0,
                                       (size_t)inner * dt_dtype_size(x->dtype), c->compute),
                      "gather");
}

/* embedding(indices, weight): ctx = [the global index of this device's first weight row, the
 * vocabulary size]; rows of another device's shard are zeros here */
const char *cuda_k_embedding(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *idx = &k->in[0], *w = &k->in[1];
    op_local *o = &k->out[0];
    int64_t n, at, v;
    if ((why = op_embedding_local(k, &n)))
        return why;
    if ((why = cuda_index_check(c, idx, 0, k->ctx[1], &at, &v)))
        return why;
    if (at >= 0)
        return "index out of range in embedding";
    return cuda_check(cuda_gather_rows(o->data, w->data, idx->data, idx->dtype, 1, n, w->shape[0], k->ctx[0], 0,
                                       (size_t)w->shape[1] * dt_dtype_size(w->dtype), c->compute),
                      "gather");
}

/* triu / tril on the last two dims: attrs.ints[0] = diagonal; ctx = {row offset, column offset}
 * of this piece in the global matrix */
const char *cuda_k_tri(cuda_ctx *c, op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t r0, c0, diag;
    const char *why = op_tri_local(k, &r0, &c0, &diag);
    if (why || dt_layout_numel(in->ndim, in->shape) == 0)
        return why;
    int64_t rows = in->shape[in->ndim - 2], cols = in->shape[in->ndim - 1];
    return cuda_check(cuda_tri(out->data, in->data, dt_dtype_size(in->dtype), dt_layout_numel(in->ndim - 2, in->shape),
                               rows, cols, r0, c0, diag, k->def->id == OP_ID_triu, c->compute),
                      "triu/tril");
}
