/* cpu_view — the CPU kernels of the views and data movement (OP_VIEW in ops/op_table.h). Every
 * kernel writes a fresh C-contiguous output; the op's infer/shard/local hooks settle shapes and
 * placements on the controller, so a kernel only moves bytes of its local pieces. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "cpu_pointwise.h"
#include "dt_dtype.h"
#include "dt_layout.h"

/* reshape / view / flatten / unsqueeze / squeeze: the local output is the local input in the
 * same row-major order (the sharding rule guarantees it), so one memcpy. */
const char *cpu_k_reshape(op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    if (n != dt_layout_numel(in->ndim, in->shape) || in->dtype != out->dtype)
        return "local piece does not match the output (internal error)";
    if (n)
        memcpy(out->data, in->data, (size_t)n * dt_dtype_size(out->dtype));
    return NULL;
}

/* permute: attrs.ints = the permutation (negative dims allowed). */
const char *cpu_k_permute(op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    size_t elem = dt_dtype_size(in->dtype);
    int64_t in_strides[DT_MAX_DIMS], src[DT_MAX_DIMS], dst[DT_MAX_DIMS];
    int perm[DT_MAX_DIMS];
    const char *why = op_permute_local(k, perm);
    if (why)
        return why;
    cpu_contiguous_strides(in->ndim, in->shape, elem, in_strides);
    for (int i = 0; i < in->ndim; i++)
        src[i] = in_strides[perm[i]];
    cpu_contiguous_strides(out->ndim, out->shape, elem, dst);
    cpu_copy_block(out->data, dst, in->data, src, out->ndim, out->shape, elem);
    return NULL;
}

/* expand: size-1 local dims broadcast to the output's local shape (right-aligned). */
const char *cpu_k_expand(op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    const char *why = op_expand_local(k);
    if (why)
        return why;
    cpu_broadcast(out->data, out->ndim, out->shape, in->data, in->ndim, in->shape, dt_dtype_size(in->dtype));
    return NULL;
}

static cpu_ctype s_ctype(dt_dtype d) { return dt_dtype_is_float(d) ? CPU_F32 : d == DT_BOOL ? CPU_U8 : CPU_I64; }

/* cat, stack: attrs.ints[0] = dim (negative allowed, of the output); inputs are
 * converted to the output dtype and laid side by side along dim. */
const char *cpu_k_cat(op_kernel *k)
{
    op_local *out = &k->out[0];
    size_t elem = dt_dtype_size(out->dtype);
    int dim = op_cat_dim(k);
    if (dim < 0)
        return "cat: bad dim (internal error)";
    int64_t dst_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS], shape[DT_MAX_DIMS];
    cpu_contiguous_strides(out->ndim, out->shape, elem, dst_strides);
    int64_t pos = 0;
    for (int i = 0; i < k->nin; i++) {
        const op_local *in = &k->in[i];
        int64_t at = pos;
        const char *why = op_cat_block(k, i, dim, &pos, shape);
        if (why)
            return why;
        int64_t n = dt_layout_numel(in->ndim, in->shape);
        if (n == 0)
            continue; /* nothing to copy, and an empty output's strides may not multiply */
        const void *src = in->data;
        void *converted = NULL;
        if (in->dtype != out->dtype) {
            cpu_ctype t = s_ctype(out->dtype);
            void *tmp = malloc((size_t)n * cpu_ctype_size(t));
            converted = malloc((size_t)n * elem);
            if (!tmp || !converted) {
                free(tmp);
                free(converted);
                return "out of memory on the device";
            }
            cpu_to_ctype(tmp, t, in->data, in->dtype, n);
            cpu_from_ctype(converted, out->dtype, tmp, t, n);
            free(tmp);
            src = converted;
        }
        cpu_contiguous_strides(out->ndim, shape, elem, src_strides);
        cpu_copy_block((char *)out->data + at * dst_strides[dim], dst_strides, src, src_strides, out->ndim, shape,
                       elem);
        free(converted);
    }
    return pos == out->shape[dim] ? NULL : "cat: local pieces do not fill the output (internal error)";
}

/* slice / narrow / select: ctx = {dim, start, step} (normalised); the output takes elements
 * start, start + step, ... along dim of the local input; select drops the dim. */
const char *cpu_k_slice(op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    op_slice_dims s;
    const char *why = op_slice_layout(k, &s);
    if (why || dt_layout_numel(in->ndim, s.shape) == 0)
        return why;
    size_t elem = dt_dtype_size(in->dtype);
    int64_t src[DT_MAX_DIMS], dst[DT_MAX_DIMS];
    cpu_contiguous_strides(in->ndim, in->shape, elem, src);
    cpu_contiguous_strides(in->ndim, s.shape, elem, dst);
    const char *base = (const char *)in->data + s.start * src[s.dim];
    src[s.dim] *= s.step;
    cpu_copy_block(out->data, dst, base, src, in->ndim, s.shape, elem);
    return NULL;
}

static _Thread_local char s_why[160];

/* index_select(x, idx): attrs.ints = {dim, wrap}: idx holds int32/int64 positions along dim
 * of the local x (which is whole along dim); wrap = 1 accepts negative positions (x[idx]). */
const char *cpu_k_index_select(op_kernel *k)
{
    const op_local *x = &k->in[0], *idx = &k->in[1];
    op_local *out = &k->out[0];
    int dim;
    const char *why = op_index_select_local(k, &dim);
    if (why)
        return why;
    bool wrap = k->attrs->nints > 1 && k->attrs->ints[1];
    int64_t m = dt_layout_numel(idx->ndim, idx->shape), size = x->shape[dim];
    int64_t *pos = malloc((size_t)(m ? m : 1) * sizeof *pos);
    if (!pos)
        return "out of memory on the device";
    for (int64_t j = 0; j < m; j++) {
        int64_t v = idx->dtype == DT_INT32 ? ((const int32_t *)idx->data)[j] : ((const int64_t *)idx->data)[j];
        if (wrap && v < 0 && v >= -size)
            v += size;
        if (v < 0 || v >= size) {
            free(pos);
            if (wrap)
                snprintf(s_why, sizeof s_why, "index %" PRId64 " is out of bounds for dimension %d with size %" PRId64,
                         v, dim, size);
            return wrap ? s_why : "index out of range in self";
        }
        pos[j] = v;
    }
    if (dt_layout_numel(out->ndim, out->shape) == 0) {
        free(pos); /* nothing to copy, and an empty piece's sizes may not multiply */
        return NULL;
    }
    int64_t outer = 1, inner = (int64_t)dt_dtype_size(x->dtype);
    for (int d = 0; d < dim; d++)
        outer *= x->shape[d];
    for (int d = dim + 1; d < x->ndim; d++)
        inner *= x->shape[d];
    const char *src = x->data;
    char *dst = out->data;
    if (inner > 0)
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < m; j++)
                memcpy(dst + (o * m + j) * inner, src + (o * size + pos[j]) * inner, (size_t)inner);
    free(pos);
    return NULL;
}

/* triu / tril on the last two dims: attrs.ints[0] = diagonal; ctx = {row offset, column
 * offset} of this piece in the global matrix. */
const char *cpu_k_tri(op_kernel *k)
{
    bool upper = k->def->id == OP_ID_triu;
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t r0, c0, diag;
    const char *why = op_tri_local(k, &r0, &c0, &diag);
    if (why || dt_layout_numel(in->ndim, in->shape) == 0)
        return why;
    int64_t rows = in->shape[in->ndim - 2], cols = in->shape[in->ndim - 1];
    int64_t batch = dt_layout_numel(in->ndim - 2, in->shape);
    size_t elem = dt_dtype_size(in->dtype);
    const char *src = in->data;
    char *dst = out->data;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < rows; i++) {
            size_t row = (size_t)((b * rows + i) * cols) * elem;
            /* global column - global row compared with diag, solved for the local column */
            int64_t edge = r0 + i + diag - c0;
            int64_t lo, hi; /* kept columns [lo, hi) */
            if (upper) {
                lo = edge < 0 ? 0 : edge > cols ? cols : edge;
                hi = cols;
            } else {
                lo = 0;
                hi = edge + 1 < 0 ? 0 : edge + 1 > cols ? cols : edge + 1;
            }
            memset(dst + row, 0, (size_t)lo * elem);
            if (hi > lo)
                memcpy(dst + row + (size_t)lo * elem, src + row + (size_t)lo * elem, (size_t)(hi - lo) * elem);
            memset(dst + row + (size_t)hi * elem, 0, (size_t)(cols - hi) * elem);
        }
    return NULL;
}
