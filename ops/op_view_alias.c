/* op_view_alias — the view ops whose outputs need no copy (op_def's alias, view and strided hooks of
 * the rows of OP_VIEW): a device's output that is its input's own bytes (reshape, a slice that keeps
 * one contiguous run), an output no device needs to hear of, and a strided view of what the input
 * reads (op_strided_*). The ops' shapes and shardings are in op_view.c, where a slice's block lies in
 * its device's piece (op_slice_layout) in op_view_local.c. */
#include <string.h>

#include "dt_dtype.h"
#include "dt_layout.h"
#include "op_view.h"

/* ---- outputs that are their input's bytes (op_def.alias) -------------------------------------- */

/* reshape, flatten, unsqueeze, squeeze: the sharding rule keeps every device's output piece its
 * input piece in the same row-major order, so the bytes are the same */
bool op_alias_whole(const op_kernel *k, size_t *offset)
{
    const op_local *in = &k->in[0], *out = &k->out[0];
    *offset = 0;
    return k->nin == 1 && k->nout == 1 && in->dtype == out->dtype &&
           dt_layout_numel(out->ndim, out->shape) == dt_layout_numel(in->ndim, in->shape);
}

/* Whether len rows from start (every step-th) along dim of a C-contiguous tensor of shape, whole
 * along every other dim, are one contiguous run, and its first element: they are when they are the
 * whole tensor, or when every dim before dim has size 1 and the rows are adjacent (step 1, or one) */
static bool s_one_run(int ndim, const int64_t *shape, int dim, int64_t start, int64_t len, int64_t step,
                      int64_t *first)
{
    *first = 0;
    if (start == 0 && len == shape[dim] && (step == 1 || len <= 1))
        return true;
    if (step != 1 && len > 1)
        return false;
    int64_t row = 1;
    for (int d = 0; d < ndim; d++) {
        if (d < dim && shape[d] != 1)
            return false;
        if (d > dim)
            row *= shape[d];
    }
    *first = start * row;
    return true;
}

/* slice, narrow, select: a region of the piece that is one contiguous run (or empty) */
bool op_alias_slice(const op_kernel *k, size_t *offset)
{
    op_slice_dims s;
    int64_t first;
    if (k->nin != 1 || k->nout != 1 || op_slice_layout(k, &s))
        return false;
    const op_local *in = &k->in[0];
    *offset = 0;
    if (dt_layout_numel(in->ndim, s.shape) == 0)
        return true;
    if (!s_one_run(in->ndim, in->shape, s.dim, s.start, s.shape[s.dim], s.step, &first))
        return false;
    *offset = (size_t)first * dt_dtype_size(in->dtype);
    return true;
}

/* ---- outputs no device needs to hear of (op_def.view) ----------------------------------------- */

/* reshape, flatten, unsqueeze, squeeze: with no input moved, the sharding rule kept every piece
 * its input piece in the same row-major order */
bool op_view_whole(const op_call *c, int64_t *first)
{
    *first = 0;
    return c->in[0].dtype == c->out[0].dtype;
}

/* slice, narrow, select: one contiguous run of every piece, starting at the same element on every
 * device: the whole tensor's region is one run (s_one_run; a dim of size 1 before the sliced one
 * gives a piece 1 or 0 rows there), and, unless it is the whole tensor, no dim from the sliced one
 * on is sharded (its rows are then as long on every device as in the whole tensor) */
bool op_view_slice(const op_call *c, int64_t *first)
{
    const op_arg *a = &c->in[0];
    int dim = 0;
    int64_t start = 0, len = 0, step = 1;
    op_slice_derived(c, &dim, &start, &len, &step);
    if (!s_one_run(a->ndim, a->shape, dim, start, len, step, first))
        return false;
    bool whole = start == 0 && len == a->shape[dim] && (step == 1 || len <= 1);
    for (int m = 0; m < c->mesh_ndim && !whole; m++)
        if (a->pl[m].kind == DT_SHARD && a->pl[m].dim >= dim)
            return false;
    return true;
}

/* ---- strided outputs no device needs to hear of (op_def.strided) ------------------------------ */

void op_strided_identity(op_strided *s, int ndim)
{
    s->ndim = s->frame_ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        s->dim[d] = (int8_t)d;
        s->step[d] = 1;
        s->start[d] = 0;
    }
}

bool op_strided_uniform(const op_strided *s, int mesh_ndim, const int64_t *shape, const dt_placement *pl,
                        const int64_t *frame_shape, const dt_placement *frame_pl)
{
    for (int m = 0; m < mesh_ndim; m++) {
        dt_placement v = pl[m], f = frame_pl[m];
        if (v.kind != f.kind || (v.kind == DT_PARTIAL && v.reduce_op != f.reduce_op))
            return false;
        if (v.kind != DT_SHARD)
            continue;
        int fd = s->dim[v.dim];
        if (fd != f.dim || s->step[v.dim] != 1 || s->start[fd] != 0 || shape[v.dim] != frame_shape[fd])
            return false;
    }
    return true;
}

bool op_strided_is_identity(const op_strided *s, const int64_t *shape, const int64_t *frame_shape)
{
    if (s->ndim != s->frame_ndim)
        return false;
    for (int d = 0; d < s->ndim; d++)
        if (s->dim[d] != d || s->start[d] != 0 || shape[d] != frame_shape[d] || (s->step[d] != 1 && shape[d] > 1))
            return false;
    return true;
}

bool op_strided_rowmajor(const op_strided *s, const int64_t *shape, const int64_t *frame_shape)
{
    /* the view's step through its frame in each dim, from the last, against a row-major tensor's
     * (the product of the sizes after it). Every strided view made is asked this once (bench/README.md,
     * "bench_op_cost"): one pass, no table of the view's steps. */
    int64_t frame[DT_MAX_DIMS], run = 1;
    dt_layout_strides(s->frame_ndim, frame_shape, 1, frame);
    bool rowmajor = true;
    for (int j = s->ndim - 1; j >= 0; j--) {
        if (shape[j] == 0)
            return true;
        if (shape[j] > 1 && (s->dim[j] < 0 || s->step[j] * frame[s->dim[j]] != run))
            rowmajor = false;
        run *= shape[j];
    }
    return rowmajor;
}

void op_strided_local(const op_strided *s, const int64_t *frame_local, const int64_t *local, int64_t *first,
                      int64_t *strides)
{
    int64_t frame_strides[DT_MAX_DIMS], run = 1;
    for (int d = s->frame_ndim - 1; d >= 0; d--) {
        frame_strides[d] = run;
        run *= frame_local[d];
    }
    *first = 0;
    for (int d = 0; d < s->frame_ndim; d++)
        *first += s->start[d] * frame_strides[d];
    for (int j = 0; j < s->ndim; j++)
        strides[j] = s->dim[j] >= 0 && local[j] > 1 ? s->step[j] * frame_strides[s->dim[j]] : 0;
}

/* Drops view dim j of s (a select: its index already folded into start). */
static void s_strided_drop(op_strided *s, int j)
{
    for (int k = j; k + 1 < s->ndim; k++) {
        s->dim[k] = s->dim[k + 1];
        s->step[k] = s->step[k + 1];
    }
    s->ndim--;
}

/* slice, narrow, select: the index or the start moves the view's first element along the frame dim
 * the sliced dim walks, and a slice's step multiplies that dim's step */
bool op_strided_slice(const op_call *c, const op_strided *in, op_strided *out)
{
    int dim = 0;
    int64_t start = 0, len = 0, step = 1;
    op_slice_derived(c, &dim, &start, &len, &step);
    *out = *in;
    int f = in->dim[dim];
    if (f >= 0 && len > 0)
        out->start[f] += start * in->step[dim];
    if (c->def->id == OP_ID_select)
        s_strided_drop(out, dim);
    else
        out->step[dim] = len > 1 ? in->step[dim] * step : in->step[dim];
    return true;
}

/* permute: output dim i walks what input dim ints[i] walks */
bool op_strided_permute(const op_call *c, const op_strided *in, op_strided *out)
{
    *out = *in;
    for (int i = 0; i < in->ndim; i++) {
        int64_t d = c->attrs.ints[i] < 0 ? c->attrs.ints[i] + in->ndim : c->attrs.ints[i];
        out->dim[i] = in->dim[d];
        out->step[i] = in->step[d];
    }
    return true;
}

/* expand: new leading dims and size-1 dims that grow repeat one element (step 0) */
bool op_strided_expand(const op_call *c, const op_strided *in, op_strided *out)
{
    const op_arg *a = &c->in[0], *o = &c->out[0];
    int lead = o->ndim - a->ndim;
    *out = *in;
    out->ndim = o->ndim;
    for (int i = 0; i < o->ndim; i++) {
        int k = i - lead;
        out->dim[i] = k < 0 ? -1 : in->dim[k];
        out->step[i] = k < 0 || (a->shape[k] == 1 && o->shape[i] != 1) ? 0 : in->step[k];
    }
    return true;
}

/* reshape, flatten, unsqueeze, squeeze of a strided view: only when the dims of size other than 1
 * are the same, in order (size-1 dims come and go); other reshapes of a strided view run as ops */
bool op_strided_ones(const op_call *c, const op_strided *in, op_strided *out)
{
    const op_arg *a = &c->in[0], *o = &c->out[0];
    if (a->dtype != o->dtype)
        return false;
    *out = *in;
    out->ndim = o->ndim;
    int k = 0;
    for (int i = 0; i < o->ndim; i++) {
        if (o->shape[i] == 1) {
            out->dim[i] = -1;
            out->step[i] = 0;
            continue;
        }
        while (k < a->ndim && a->shape[k] == 1)
            k++;
        if (k == a->ndim || a->shape[k] != o->shape[i])
            return false;
        out->dim[i] = in->dim[k];
        out->step[i] = in->step[k];
        k++;
    }
    while (k < a->ndim && a->shape[k] == 1)
        k++;
    return k == a->ndim;
}
