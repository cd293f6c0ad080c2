/* op_reduce — reductions (sum, mean, amax/amin, max/min, argmax/argmin, max/min along a dim),
 * softmax and log_softmax, cumsum, topk, layer_norm and rms_norm.
 *
 * Sharding: a reduction over a sharded dim leaves each device a contribution, so the output is
 * Partial there: sum and mean give Partial(sum) (a mean divides its local sum by the global
 * count, so uneven and empty shards are exact), amax/max give Partial(max), amin/min
 * Partial(min); shards of kept dims stay (their index shifts down past dropped dims), Replicate
 * stays. A Partial input passes through when that is exact (sum or mean of Partial(sum|avg)
 * floats, sum of Partial(sum) int64, amax of Partial(max), amin of Partial(min)), otherwise it is
 * reduced first. Ops that need a whole dim on one device (argmax/argmin, max/min along a dim,
 * softmax, log_softmax, cumsum, topk, the normalised dims of layer_norm/rms_norm) want Replicate
 * there and keep the other shards; so local indices are global ones. cumsum, being linear, also
 * keeps Partial(sum|avg) like sum.
 *
 * The ops are the rows of OP_REDUCE (ops/op_table.h); their kernels are in ops/cpu/cpu_reduce.c,
 * which get the reduced dims from ctx (s_local) rather than decoding the attributes again. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

/* The name a user called (max along a dim is torch's max too). */
static const char *s_name(const op_def *def)
{
    return def->id == OP_ID_max_dim ? "max" : def->id == OP_ID_min_dim ? "min" : def->name;
}

/* torch's name of a dtype, as its error messages spell it. */
static const char *s_torch_dtype(dt_dtype d)
{
    static const char *names[] = {"Float", "Half", "BFloat16", "Int", "Long", "Bool"};
    return d >= 0 && d < DT_NDTYPES ? names[d] : "?";
}

static int s_popcount_below(uint32_t mask, int d) { return __builtin_popcount(mask & ((1u << d) - 1u)); }

static uint32_t s_all_dims(int ndim) { return ndim ? (1u << ndim) - 1u : 0u; }

/* ---- attributes ------------------------------------------------------------------------------
 * sum, mean:              ints [keepdim, dtype or -1, dims...]   (no dims: every dim)
 * amax, amin:             ints [keepdim, -1, dims...]
 * max, min:               no ints (every dim)
 * max_dim, min_dim:       ints [dim, keepdim]                     -> (values, indices)
 * argmax, argmin:         ints [keepdim] or [keepdim, dim]
 * softmax, log_softmax, cumsum: ints [dim, dtype or -1]
 * topk:                   ints [k, dim, largest, sorted]          -> (values, indices)
 * layer_norm:             inputs (x[, weight][, bias]); ints [has_weight | has_bias << 1,
 *                         normalized_shape...]; floats [eps]
 * rms_norm:               inputs (x[, weight]); ints [has_weight, normalized_shape...];
 *                         floats [eps], or none for torch's default (float32's epsilon: the op
 *                         computes in float32 whatever the input dtype) */

static int64_t s_int(const op_attrs *a, int i, int64_t otherwise) { return i < a->nints ? a->ints[i] : otherwise; }

/* sum, mean, amax, amin, max, min: over a list of dims */
static bool s_is_list_reduce(int id)
{
    return id == OP_ID_sum || id == OP_ID_mean || id == OP_ID_amax || id == OP_ID_amin || id == OP_ID_max ||
           id == OP_ID_min;
}

/* The reduced dims of a list reduction, as a bit mask (validated by infer). */
static uint32_t s_list_mask(const op_attrs *a, int ndim)
{
    if (a->nints <= 2)
        return s_all_dims(ndim);
    uint32_t mask = 0;
    for (int i = 2; i < a->nints && ndim > 0; i++)
        mask |= 1u << (a->ints[i] < 0 ? a->ints[i] + ndim : a->ints[i]);
    return mask;
}

/* The one dim an op works along (validated by infer); -1 for argmax/argmin without a dim. */
static int s_along_dim(int id, const op_attrs *a, int ndim)
{
    int64_t d;
    switch (id) {
    case OP_ID_argmax:
    case OP_ID_argmin:
        if (a->nints < 2)
            return -1;
        d = a->ints[1];
        break;
    case OP_ID_topk: d = s_int(a, 1, -1); break;
    default: d = s_int(a, 0, 0); break;
    }
    if (ndim == 0)
        return 0;
    return (int)(d < 0 ? d + ndim : d);
}

/* ---- inference ------------------------------------------------------------------------------ */

static int s_check_dtype_attr(const char *name, int64_t code)
{
    if (code >= 0 && !dt_dtype_valid((int)code))
        return dt_err(DT_ETYPE, "%s(): unknown dtype %lld", name, (long long)code);
    return 0;
}

static int s_infer_list(op_call *c)
{
    const char *name = s_name(c->def);
    const op_arg *a = &c->in[0];
    op_arg *o = &c->out[0];
    int code = c->def->id;
    bool keepdim = s_int(&c->attrs, 0, 0) != 0;
    int64_t dtype = s_int(&c->attrs, 1, -1);
    if (s_check_dtype_attr(name, dtype) != 0)
        return DT_ETYPE;
    uint32_t mask = 0;
    for (int i = 2; i < c->attrs.nints; i++) {
        int d;
        if (op_dim(name, c->attrs.ints[i], a->ndim, &d) != 0)
            return DT_EINDEX;
        if (a->ndim == 0)
            continue; /* dim 0 or -1 of a 0-d tensor names the tensor itself */
        if (mask & (1u << d))
            return dt_err(DT_EINVAL, "%s(): dim %d appears multiple times in the list of dims", name, d);
        mask |= 1u << d;
    }
    if (c->attrs.nints <= 2)
        mask = s_all_dims(a->ndim);
    o->ndim = 0;
    for (int d = 0; d < a->ndim; d++) {
        if (!(mask & (1u << d)))
            o->shape[o->ndim++] = a->shape[d];
        else if (keepdim)
            o->shape[o->ndim++] = 1;
    }
    bool floating = dt_dtype_is_float(a->dtype);
    switch (code) {
    case OP_ID_sum:
        o->dtype = dtype >= 0 ? (dt_dtype)dtype : floating ? a->dtype : DT_INT64;
        return 0;
    case OP_ID_mean:
        if (dtype >= 0 && !dt_dtype_is_float((dt_dtype)dtype))
            return dt_err(DT_ETYPE, "mean(): could not infer output dtype. Optional dtype must be either a floating "
                          "point or complex dtype. Got: %s", s_torch_dtype((dt_dtype)dtype));
        if (dtype < 0 && !floating)
            return dt_err(DT_ETYPE, "mean(): could not infer output dtype. Input dtype must be either a floating "
                          "point or complex dtype. Got: %s", s_torch_dtype(a->dtype));
        o->dtype = dtype >= 0 ? (dt_dtype)dtype : a->dtype;
        return 0;
    case OP_ID_max:
    case OP_ID_min:
        if (dt_layout_numel(a->ndim, a->shape) == 0)
            return dt_err(DT_EINVAL, "%s(): Expected reduction dim to be specified for input.numel() == 0. Specify "
                          "the reduction dim with the 'dim' argument.", name);
        o->dtype = a->dtype;
        return 0;
    default: /* amax, amin */
        for (int d = 0; d < a->ndim; d++)
            if ((mask & (1u << d)) && a->shape[d] == 0)
                return dt_err(DT_EINDEX, "%s(): Expected reduction dim %d to have non-zero size.", name, d);
        o->dtype = a->dtype;
        return 0;
    }
}

/* max/min along a dim, argmax/argmin, softmax, log_softmax, cumsum, topk */
static int s_infer_along(op_call *c)
{
    const char *name = s_name(c->def);
    const op_arg *a = &c->in[0];
    int code = c->def->id;
    int64_t dim_attr = code == OP_ID_argmax || code == OP_ID_argmin ? s_int(&c->attrs, 1, 0)
                       : code == OP_ID_topk                     ? s_int(&c->attrs, 1, -1)
                                                            : s_int(&c->attrs, 0, 0);
    bool whole = (code == OP_ID_argmax || code == OP_ID_argmin) && c->attrs.nints < 2;
    int dim = 0;
    if (!whole && op_dim(name, dim_attr, a->ndim, &dim) != 0)
        return DT_EINDEX;
    int64_t extent = a->ndim ? a->shape[dim] : 1;
    op_arg *o = &c->out[0];
    o->ndim = a->ndim;
    memcpy(o->shape, a->shape, sizeof o->shape);
    o->dtype = a->dtype;
    c->out[1] = *o;
    c->out[1].dtype = DT_INT64;
    switch (code) {
    case OP_ID_argmax:
    case OP_ID_argmin:
    case OP_ID_max_dim:
    case OP_ID_min_dim: {
        bool arg = code == OP_ID_argmax || code == OP_ID_argmin;
        bool keepdim = s_int(&c->attrs, arg ? 0 : 1, 0) != 0;
        if (arg && a->dtype == DT_BOOL)
            return dt_err(DT_ETYPE, "%s(): not implemented for 'Bool'", name);
        if (whole && dt_layout_numel(a->ndim, a->shape) == 0)
            return dt_err(DT_EINVAL, "%s(): Expected reduction dim to be specified for input.numel() == 0.", name);
        if (!whole && extent == 0)
            return dt_err(DT_EINDEX, "%s(): Expected reduction dim %d to have non-zero size.", name, dim);
        if (whole) {
            for (int d = 0; d < a->ndim; d++)
                o->shape[d] = 1;
            if (!keepdim)
                o->ndim = 0;
        } else if (a->ndim > 0) {
            if (keepdim)
                o->shape[dim] = 1;
            else {
                memmove(&o->shape[dim], &o->shape[dim + 1], sizeof *o->shape * (size_t)(a->ndim - dim - 1));
                o->ndim--;
            }
        }
        if (arg)
            o->dtype = DT_INT64;
        c->out[1].ndim = o->ndim;
        memcpy(c->out[1].shape, o->shape, sizeof o->shape);
        return 0;
    }
    case OP_ID_softmax:
    case OP_ID_log_softmax:
    case OP_ID_cumsum: {
        int64_t dtype = s_int(&c->attrs, 1, -1);
        if (s_check_dtype_attr(name, dtype) != 0)
            return DT_ETYPE;
        if (code == OP_ID_cumsum) {
            o->dtype = dtype >= 0 ? (dt_dtype)dtype : dt_dtype_is_float(a->dtype) ? a->dtype : DT_INT64;
            return 0;
        }
        dt_dtype d = dtype >= 0 ? (dt_dtype)dtype : a->dtype;
        if (!dt_dtype_is_float(d))
            return dt_err(DT_ETYPE, "%s(): not implemented for '%s' (a floating input, or a floating dtype=, is "
                          "needed)", name, s_torch_dtype(d));
        o->dtype = d;
        return 0;
    }
    default: { /* topk */
        int64_t k = s_int(&c->attrs, 0, 1);
        if (a->dtype == DT_BOOL)
            return dt_err(DT_ETYPE, "topk(): not implemented for 'Bool'");
        if (k < 0 || k > extent)
            return dt_err(DT_EINVAL, "topk(): selected index k out of range (k = %lld, dimension %d has size %lld)",
                          (long long)k, dim, (long long)extent);
        if (a->ndim > 0) {
            o->shape[dim] = k;
            c->out[1].shape[dim] = k;
        }
        return 0;
    }
    }
}

static int s_infer_norm(op_call *c)
{
    const char *name = c->def->name;
    const op_arg *a = &c->in[0];
    int64_t flags = s_int(&c->attrs, 0, 0);
    bool rms = c->def->id == OP_ID_rms_norm;
    int nshape = c->attrs.nints - 1;
    const int64_t *shape = &c->attrs.ints[1];
    char want[160], got[160];
    if (flags < 0 || flags > (rms ? 1 : 3) || c->nin != 1 + __builtin_popcount((unsigned)flags))
        return dt_err(DT_EINVAL, "%s: ints[0] = %lld does not say which of the %d extra tensors are weight and bias",
                      name, (long long)flags, c->nin - 1);
    if (nshape < 1)
        return dt_err(DT_EINVAL, "%s: Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                      "least one element, but got normalized_shape = []", name);
    if (nshape > DT_MAX_DIMS)
        return dt_err(DT_EINVAL, "%s: normalized_shape has %d dims, at most %d", name, nshape, DT_MAX_DIMS);
    dt_layout_format_sizes(want, sizeof want, nshape, shape);
    bool fits = a->ndim >= nshape;
    for (int i = 0; fits && i < nshape; i++)
        fits = a->shape[a->ndim - nshape + i] == shape[i];
    if (!fits) {
        dt_layout_format_sizes(got, sizeof got, a->ndim, a->shape);
        char star[168];
        snprintf(star, sizeof star, "[*, %s", want + 1);
        return dt_err(DT_EINVAL, "%s: Given normalized_shape=%s, expected input with shape %s, but got input of size%s",
                      name, want, star, got);
    }
    if (!dt_dtype_is_float(a->dtype))
        return dt_err(DT_ETYPE, "%s: expected a floating point input, got %s", name, dt_dtype_name(a->dtype));
    for (int i = 1; i < c->nin; i++) {
        const op_arg *w = &c->in[i];
        const char *what = i == 1 && (flags & 1) ? "weight" : "bias";
        if (w->ndim != nshape || memcmp(w->shape, shape, sizeof *shape * (size_t)nshape)) {
            dt_layout_format_sizes(got, sizeof got, w->ndim, w->shape);
            return dt_err(DT_EINVAL, "%s: Expected %s to be of same shape as normalized_shape, but got %s of shape %s "
                          "and normalized_shape = %s", name, what, what, got, want);
        }
        if (!dt_dtype_is_float(w->dtype))
            return dt_err(DT_ETYPE, "%s: expected a floating point %s, got %s", name, what, dt_dtype_name(w->dtype));
    }
    c->out[0] = *a;
    return 0;
}

static int s_infer(op_call *c)
{
    int code = c->def->id;
    if (s_is_list_reduce(code))
        return s_infer_list(c);
    if (code == OP_ID_layer_norm || code == OP_ID_rms_norm)
        return s_infer_norm(c);
    return s_infer_along(c);
}

/* ---- sharding ------------------------------------------------------------------------------- */

/* Whether a Partial(have) input gives an exact Partial(have) output. */
static bool s_partial_passes(const op_call *c, dt_reduce_op have)
{
    dt_dtype in = c->in[0].dtype, out = c->out[0].dtype;
    bool floats = dt_dtype_is_float(in) && dt_dtype_is_float(out);
    switch (c->def->id) {
    case OP_ID_sum:
    case OP_ID_mean:
    case OP_ID_cumsum:
        /* linear; integer sums stay exact only in int64 (int32 pieces may wrap, bool ones are or-ed) */
        return (have == DT_REDUCE_SUM && (floats || (in == DT_INT64 && out == DT_INT64))) ||
               (have == DT_REDUCE_AVG && floats);
    case OP_ID_amax:
    case OP_ID_max:
        return have == DT_REDUCE_MAX;
    case OP_ID_amin:
    case OP_ID_min:
        return have == DT_REDUCE_MIN;
    default:
        return false;
    }
}

static int s_shard_list(op_call *c)
{
    const op_arg *a = &c->in[0];
    int code = c->def->id;
    bool keepdim = s_int(&c->attrs, 0, 0) != 0;
    uint32_t mask = s_list_mask(&c->attrs, a->ndim);
    dt_reduce_op op = code == OP_ID_sum || code == OP_ID_mean           ? DT_REDUCE_SUM
                      : code == OP_ID_amax || code == OP_ID_max ? DT_REDUCE_MAX
                                                                : DT_REDUCE_MIN;
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = a->pl[m], *out = &c->out[0].pl[m];
        c->want[0][m] = p;
        if (p.kind == DT_SHARD && (mask & (1u << p.dim)))
            *out = dt_partial(op);
        else if (p.kind == DT_SHARD)
            *out = dt_shard(keepdim ? p.dim : p.dim - s_popcount_below(mask, p.dim));
        else if (p.kind == DT_PARTIAL && s_partial_passes(c, (dt_reduce_op)p.reduce_op))
            *out = p;
        else
            *out = c->want[0][m] = dt_replicate();
    }
    return 0;
}

/* Ops that need the dims in whole (a bit mask) on every device: those dims want Replicate, other
 * shards stay (shifted past the dropped dims); weight and bias want Replicate. */
static void s_shard_whole(op_call *c, uint32_t whole, uint32_t dropped)
{
    const op_arg *a = &c->in[0];
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = a->pl[m], *out = &c->out[0].pl[m];
        c->want[0][m] = p;
        if (p.kind == DT_SHARD && !(whole & (1u << p.dim)))
            *out = dt_shard(p.dim - s_popcount_below(dropped, p.dim));
        else if (p.kind == DT_PARTIAL && s_partial_passes(c, (dt_reduce_op)p.reduce_op))
            *out = p;
        else
            *out = c->want[0][m] = dt_replicate();
    }
    for (int i = 1; i < c->nin; i++)
        op_replicate_all(c->want[i], c->mesh_ndim);
    for (int o = 1; o < c->nout; o++)
        memcpy(c->out[o].pl, c->out[0].pl, sizeof c->out[o].pl);
}

static int s_shard(op_call *c)
{
    const op_arg *a = &c->in[0];
    int code = c->def->id;
    if (s_is_list_reduce(code))
        return s_shard_list(c);
    if (code == OP_ID_layer_norm || code == OP_ID_rms_norm) {
        int nshape = c->attrs.nints - 1;
        s_shard_whole(c, s_all_dims(a->ndim) & ~s_all_dims(a->ndim - nshape), 0);
        return 0;
    }
    int dim = s_along_dim(code, &c->attrs, a->ndim);
    uint32_t whole = dim < 0 ? s_all_dims(a->ndim) : a->ndim ? 1u << dim : 0u;
    bool keepdim = code == OP_ID_argmax || code == OP_ID_argmin ? s_int(&c->attrs, 0, 0) != 0
                   : code == OP_ID_max_dim || code == OP_ID_min_dim ? s_int(&c->attrs, 1, 0) != 0
                                                          : true;
    s_shard_whole(c, whole, keepdim ? 0u : whole);
    return 0;
}

/* What the kernel needs, worked out here: list reductions ctx = [mask of the reduced dims,
 * elements each output element averages, globally]; ops along a dim [that dim, or -1 for every
 * element]; norms [elements normalised together, which of weight and bias are given]. */
static int s_local(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    const op_arg *a = &c->in[0];
    int id = c->def->id;
    if (s_is_list_reduce(id)) {
        uint32_t mask = s_list_mask(&c->attrs, a->ndim);
        ctx[0] = mask;
        ctx[1] = 1;
        for (int d = 0; d < a->ndim; d++)
            if (mask & (1u << d))
                ctx[1] *= a->shape[d];
        return 2;
    }
    if (id == OP_ID_layer_norm || id == OP_ID_rms_norm) {
        ctx[0] = 1;
        for (int i = 1; i < c->attrs.nints; i++)
            ctx[0] *= c->attrs.ints[i];
        ctx[1] = s_int(&c->attrs, 0, 0);
        return 2;
    }
    ctx[0] = s_along_dim(id, &c->attrs, a->ndim);
    return 1;
}

/* ---- the rows of OP_REDUCE ------------------------------------------------------------------- */

#define S_DEF(op, num, kernel, inputs, outputs)                                                                      \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = inputs, .nout = outputs, .infer = s_infer,            \
                                .shard = s_shard, .local = s_local};
OP_REDUCE(S_DEF)
#undef S_DEF

/* ---- the pieces on a device (every backend's kernels) -----------------------------------------
 * A record from a socket can name any pieces: each op's are checked against what infer gives for
 * them before a kernel reads a byte, by sizes alone (no product that could pass int64: an empty
 * piece may have any size beside its 0). */

static const char s_misfit[] = "the local pieces of the operands do not fit together";

static bool s_same_shape(const op_local *a, const op_local *b)
{
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape);
}

/* Whether out is in without the dims of mask, or with them of size 1 (keepdim). */
static bool s_reduced_shape(const op_local *in, uint32_t mask, const op_local *out)
{
    bool keep = out->ndim == in->ndim;
    if (!keep && out->ndim != in->ndim - __builtin_popcount(mask))
        return false;
    for (int d = 0, o = 0; d < in->ndim; d++) {
        bool reduced = mask & (1u << d);
        if (reduced && !keep)
            continue;
        if (out->shape[o++] != (reduced ? 1 : in->shape[d]))
            return false;
    }
    return true;
}

const char *op_reduce_layout(const op_kernel *k, uint32_t *mask, int64_t *extent, int64_t *n_out)
{
    const op_local *in = &k->in[0], *out = &k->out[0];
    int id = k->def->id;
    if (k->nctx < 2)
        return "reduction: missing arguments (internal error)";
    if (k->nin != 1 || k->nout != 1 || k->ctx[0] < 0 || ((uint64_t)k->ctx[0] & ~(uint64_t)s_all_dims(in->ndim)))
        return s_misfit;
    *mask = (uint32_t)k->ctx[0];
    if (!s_reduced_shape(in, *mask, out) || (id == OP_ID_mean && !dt_dtype_is_float(out->dtype)) ||
        (id != OP_ID_sum && id != OP_ID_mean && out->dtype != in->dtype))
        return s_misfit;
    *n_out = dt_layout_numel(out->ndim, out->shape);
    *extent = 1;
    if (dt_layout_numel(in->ndim, in->shape) == 0)
        *extent = 0; /* a 0 in a kept dim would have emptied the output */
    for (int d = 0; d < in->ndim && *extent; d++)
        if (*mask & (1u << d))
            *extent *= in->shape[d];
    return NULL;
}

/* The output of an op along dim of in (-1: every element): keepdim's size 1 there, or no dim. */
static bool s_along_shape(const op_local *in, int dim, const op_local *out)
{
    if (in->ndim == 0 || (dim < 0 && out->ndim == 0))
        return out->ndim == 0;
    bool keep = out->ndim == in->ndim;
    if (!keep && (dim < 0 || out->ndim != in->ndim - 1))
        return false;
    for (int d = 0, o = 0; d < in->ndim; d++) {
        bool along = dim < 0 || d == dim;
        if (along && !keep)
            continue;
        if (out->shape[o++] != (along ? 1 : in->shape[d]))
            return false;
    }
    return true;
}

/* The norms: rows of ctx[0] elements, a weight and a bias of a row's elements where ctx[1] says. */
static const char *s_norm_layout(const op_kernel *k, int64_t numel, int64_t *outer, int64_t *n, int64_t *inner)
{
    const op_local *in = &k->in[0], *out = &k->out[0];
    int64_t d = k->ctx[0], flags = k->ctx[1];
    if (flags < 0 || flags > (k->def->id == OP_ID_rms_norm ? 1 : 3) ||
        k->nin != 1 + __builtin_popcount((unsigned)flags) || k->nout != 1 || !s_same_shape(in, out) ||
        out->dtype != in->dtype || !dt_dtype_is_float(in->dtype) || d < 0 || (d ? numel % d : numel) != 0)
        return s_misfit;
    for (int i = 1; i < k->nin; i++)
        if (dt_layout_numel(k->in[i].ndim, k->in[i].shape) != d || !dt_dtype_is_float(k->in[i].dtype))
            return s_misfit;
    if (numel)
        *outer = numel / d, *n = d, *inner = 1;
    return NULL;
}

const char *op_along_layout(const op_kernel *k, int64_t *outer, int64_t *n, int64_t *inner)
{
    const op_local *in = &k->in[0], *out = &k->out[0];
    int id = k->def->id;
    bool norm = id == OP_ID_layer_norm || id == OP_ID_rms_norm;
    int64_t numel = dt_layout_numel(in->ndim, in->shape), dim = k->nctx > 0 ? k->ctx[0] : -2;
    *outer = *n = *inner = 0;
    if (k->nctx < (norm ? 2 : 1))
        return "missing arguments (internal error)";
    if (norm)
        return s_norm_layout(k, numel, outer, n, inner);
    bool whole = dim == -1 && (id == OP_ID_argmax || id == OP_ID_argmin);
    if (k->nin != 1 || k->nout != k->def->nout || (!whole && (dim < 0 || dim >= (in->ndim ? in->ndim : 1))))
        return s_misfit;
    int64_t extent = whole ? numel : in->ndim ? in->shape[dim] : 1;
    switch (id) {
    case OP_ID_softmax:
    case OP_ID_log_softmax:
    case OP_ID_cumsum:
        if (!s_same_shape(in, out) || (id != OP_ID_cumsum && !dt_dtype_is_float(out->dtype)))
            return s_misfit;
        break;
    case OP_ID_topk: {
        int64_t top = s_int(k->attrs, 0, 1);
        op_local want = *in;
        if (in->ndim)
            want.shape[dim] = top;
        if (top < 0 || top > extent || in->dtype == DT_BOOL || out->dtype != in->dtype ||
            k->out[1].dtype != DT_INT64 || !s_same_shape(&want, out) || !s_same_shape(&want, &k->out[1]))
            return s_misfit;
        break;
    }
    default: { /* max/min along a dim (values, positions), argmax/argmin (positions) */
        bool arg = id == OP_ID_argmax || id == OP_ID_argmin;
        const op_local *at = &k->out[arg ? 0 : 1];
        if (!s_along_shape(in, (int)dim, out) || at->dtype != DT_INT64 || (arg && in->dtype == DT_BOOL) ||
            (!arg && (out->dtype != in->dtype || !s_same_shape(out, at))) ||
            (extent == 0 && dt_layout_numel(out->ndim, out->shape) > 0))
            return s_misfit;
    }
    }
    if (numel == 0)
        return NULL; /* nothing to read (the sizes of an empty piece need not multiply within int64) */
    *outer = 1, *n = extent, *inner = 1;
    for (int d = 0; d < in->ndim && !whole; d++) {
        if (d < dim)
            *outer *= in->shape[d];
        else if (d > dim)
            *inner *= in->shape[d];
    }
    return NULL;
}

dt_scalar op_reduce_identity(dt_dtype d, bool max)
{
    if (dt_dtype_is_float(d))
        return (dt_scalar){.is_int = false, .f = max ? -INFINITY : INFINITY};
    switch (d) {
    case DT_INT32: return (dt_scalar){.is_int = true, .i = max ? INT32_MIN : INT32_MAX};
    case DT_INT64: return (dt_scalar){.is_int = true, .i = max ? INT64_MIN : INT64_MAX};
    default: return (dt_scalar){.is_int = true, .i = max ? 0 : 1};
    }
}
