/* op_view_local — the view family's pieces on a device, as every backend's kernels read them
 * (ops/cpu/cpu_view.c, ops/cuda/cuda_view.c; op_view_alias.c's slice hook too): what each output
 * takes of its input, checked against the pieces a record names. A record from a socket can name
 * any shapes, dtypes and attributes; every check is on sizes alone, without a product that could
 * pass int64 (an empty piece may have any size beside its 0). */
#include <string.h>

#include "dt_layout.h"
#include "op_view.h"

static const char s_misfit[] = "the local pieces of the operands do not fit together";

/* dim (negative from the end) of ndim dims, or -1 outside them */
static int s_dim(int64_t dim, int ndim)
{
    dim = dim < 0 ? dim + ndim : dim;
    return dim >= 0 && dim < ndim ? (int)dim : -1;
}

static bool s_same_shape(const op_local *a, const op_local *b)
{
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape);
}

/* ---- permute, expand ------------------------------------------------------------------------- */

const char *op_permute_local(const op_kernel *k, int *perm)
{
    const op_local *in = &k->in[0], *out = &k->out[0];
    if (k->nin != 1 || k->nout != 1 || k->attrs->nints != in->ndim || out->ndim != in->ndim || out->dtype != in->dtype)
        return s_misfit;
    uint32_t seen = 0;
    for (int i = 0; i < in->ndim; i++) {
        int p = s_dim(k->attrs->ints[i], in->ndim);
        if (p < 0 || (seen & (1u << p)) || out->shape[i] != in->shape[p])
            return s_misfit;
        seen |= 1u << p;
        perm[i] = p;
    }
    return NULL;
}

const char *op_expand_local(const op_kernel *k)
{
    const op_local *in = &k->in[0], *out = &k->out[0];
    if (k->nin != 1 || k->nout != 1 || in->ndim > out->ndim || out->dtype != in->dtype)
        return s_misfit;
    for (int d = 0; d < in->ndim; d++) {
        int64_t a = in->shape[d], b = out->shape[d + out->ndim - in->ndim];
        if (a != b && a != 1)
            return s_misfit;
    }
    return NULL;
}

/* ---- cat / stack ----------------------------------------------------------------------------- */

int op_cat_dim(const op_kernel *k)
{
    int n = k->out[0].ndim;
    if (k->attrs->nints < 1)
        return -1;
    int64_t dim = k->attrs->ints[0] < 0 ? k->attrs->ints[0] + (n > 0 ? n : 1) : k->attrs->ints[0];
    return dim >= 0 && dim < n ? (int)dim : -1;
}

const char *op_cat_block(const op_kernel *k, int i, int dim, int64_t *pos, int64_t *shape)
{
    bool stack = k->def->id == OP_ID_stack;
    const op_local *in = &k->in[i], *out = &k->out[0];
    if (k->nout != 1 || in->ndim != out->ndim - (stack ? 1 : 0))
        return s_misfit;
    for (int d = 0, r = 0; d < out->ndim; d++)
        shape[d] = stack && d == dim ? 1 : in->shape[r++];
    for (int d = 0; d < out->ndim; d++)
        if (d != dim && shape[d] != out->shape[d])
            return s_misfit;
    if (shape[dim] > out->shape[dim] - *pos) /* *pos <= out->shape[dim]: no sum to wrap */
        return s_misfit;
    *pos += shape[dim];
    return NULL;
}

/* ---- slice / narrow / select ----------------------------------------------------------------- */

const char *op_slice_layout(const op_kernel *k, op_slice_dims *s)
{
    bool drop = k->def->id == OP_ID_select;
    const op_local *in = &k->in[0], *out = &k->out[0];
    if (k->nctx < 3)
        return "slice: missing arguments (internal error)";
    s->dim = k->ctx[0] >= 0 && k->ctx[0] < in->ndim ? (int)k->ctx[0] : -1;
    s->start = k->ctx[1];
    s->step = k->ctx[2];
    if (k->nin != 1 || k->nout != 1 || s->dim < 0 || out->ndim != in->ndim - (drop ? 1 : 0) || out->dtype != in->dtype)
        return s_misfit;
    for (int d = 0, r = 0; d < in->ndim; d++)
        s->shape[d] = drop && d == s->dim ? 1 : out->shape[r++];
    for (int d = 0; d < in->ndim; d++)
        if (d != s->dim && s->shape[d] != in->shape[d])
            return s_misfit;
    if (dt_layout_numel(in->ndim, s->shape) == 0)
        return NULL;
    /* start + (len - 1) * step < size, without the product: the last element lies in the piece */
    int64_t len = s->shape[s->dim], size = in->shape[s->dim];
    if (s->start < 0 || s->step < 1 || s->start >= size || (len - 1) > (size - 1 - s->start) / s->step)
        return "slice: range outside the local piece (internal error)";
    if (len == 1)
        s->step = 1; /* never stepped: a stride times it must not overflow */
    return NULL;
}

/* ---- index_select ---------------------------------------------------------------------------- */

const char *op_index_select_local(const op_kernel *k, int *dim)
{
    const op_local *x = &k->in[0], *idx = &k->in[1], *out = &k->out[0];
    if (k->nin != 2 || k->nout != 1 || k->attrs->nints < 1 || (*dim = s_dim(k->attrs->ints[0], x->ndim)) < 0 ||
        (idx->dtype != DT_INT32 && idx->dtype != DT_INT64) || idx->ndim > 1 || out->dtype != x->dtype ||
        out->ndim != x->ndim)
        return s_misfit;
    for (int d = 0; d < x->ndim; d++)
        if (out->shape[d] != (d == *dim ? dt_layout_numel(idx->ndim, idx->shape) : x->shape[d]))
            return s_misfit;
    return NULL;
}

/* ---- triu / tril ----------------------------------------------------------------------------- */

const char *op_tri_local(const op_kernel *k, int64_t *row0, int64_t *col0, int64_t *diag)
{
    const op_local *in = &k->in[0];
    if (k->nctx < 2)
        return "tri: missing arguments (internal error)";
    if (k->nin != 1 || k->nout != 1 || in->ndim < 2 || !s_same_shape(in, &k->out[0]) || k->out[0].dtype != in->dtype)
        return s_misfit;
    /* far beyond any dim of a piece with elements, so that clamping changes no answer, and small
     * enough that row0 + i + diag - col0 cannot overflow */
    const int64_t lim = INT64_C(1) << 60;
    int64_t v[3] = {k->ctx[0], k->ctx[1], k->attrs->nints > 0 ? k->attrs->ints[0] : 0};
    for (int i = 0; i < 3; i++)
        v[i] = v[i] > lim ? lim : v[i] < -lim ? -lim : v[i];
    *row0 = v[0], *col0 = v[1], *diag = v[2];
    return NULL;
}
