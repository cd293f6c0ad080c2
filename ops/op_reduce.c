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
 * keeps Partial(sum|avg) like sum. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_reduce.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

typedef enum {
    S_SUM, S_MEAN, S_AMAX, S_AMIN, S_MAX, S_MIN,  /* over a list of dims (all when none) */
    S_MAX_DIM, S_MIN_DIM, S_ARGMAX, S_ARGMIN,     /* position of the extreme along one dim */
    S_SOFTMAX, S_LOG_SOFTMAX, S_CUMSUM, S_TOPK,   /* along one dim */
    S_LAYER_NORM, S_RMS_NORM,                     /* over the trailing normalised dims */
} s_code;

/* The name a user called (max along a dim is torch's max too). */
static const char *s_name(const op_def *def)
{
    return def->code == S_MAX_DIM ? "max" : def->code == S_MIN_DIM ? "min" : def->name;
}

/* torch's name of a dtype, as its error messages spell it. */
static const char *s_torch_dtype(dt_dtype d)
{
    static const char *names[] = {"Float", "Half", "BFloat16", "Int", "Long", "Bool"};
    return d >= 0 && d < DT_NDTYPES ? names[d] : "?";
}

static void s_format_shape(char *buf, size_t size, int n, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
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

static bool s_is_list_reduce(int code) { return code <= S_MIN; }

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
static int s_along_dim(int code, const op_attrs *a, int ndim)
{
    int64_t d;
    switch (code) {
    case S_ARGMAX:
    case S_ARGMIN:
        if (a->nints < 2)
            return -1;
        d = a->ints[1];
        break;
    case S_TOPK: d = s_int(a, 1, -1); break;
    default: d = s_int(a, 0, 0); break;
    }
    if (ndim == 0)
        return 0;
    return (int)(d < 0 ? d + ndim : d);
}

/* (outer, n, inner) of a C-contiguous shape seen along dim (-1: the whole array as one row). */
static void s_split(int ndim, const int64_t *shape, int dim, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = 1;
    *n = 1;
    *inner = 1;
    if (dim < 0) {
        *n = dt_layout_numel(ndim, shape);
        return;
    }
    for (int d = 0; d < ndim; d++) {
        if (d < dim)
            *outer *= shape[d];
        else if (d == dim)
            *n = shape[d];
        else
            *inner *= shape[d];
    }
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
    int code = c->def->code;
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
    case S_SUM:
        o->dtype = dtype >= 0 ? (dt_dtype)dtype : floating ? a->dtype : DT_INT64;
        return 0;
    case S_MEAN:
        if (dtype >= 0 && !dt_dtype_is_float((dt_dtype)dtype))
            return dt_err(DT_ETYPE, "mean(): could not infer output dtype. Optional dtype must be either a floating "
                          "point or complex dtype. Got: %s", s_torch_dtype((dt_dtype)dtype));
        if (dtype < 0 && !floating)
            return dt_err(DT_ETYPE, "mean(): could not infer output dtype. Input dtype must be either a floating "
                          "point or complex dtype. Got: %s", s_torch_dtype(a->dtype));
        o->dtype = dtype >= 0 ? (dt_dtype)dtype : a->dtype;
        return 0;
    case S_MAX:
    case S_MIN:
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
    int code = c->def->code;
    int64_t dim_attr = code == S_ARGMAX || code == S_ARGMIN ? s_int(&c->attrs, 1, 0)
                       : code == S_TOPK                     ? s_int(&c->attrs, 1, -1)
                                                            : s_int(&c->attrs, 0, 0);
    bool whole = (code == S_ARGMAX || code == S_ARGMIN) && c->attrs.nints < 2;
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
    case S_ARGMAX:
    case S_ARGMIN:
    case S_MAX_DIM:
    case S_MIN_DIM: {
        bool arg = code == S_ARGMAX || code == S_ARGMIN;
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
    case S_SOFTMAX:
    case S_LOG_SOFTMAX:
    case S_CUMSUM: {
        int64_t dtype = s_int(&c->attrs, 1, -1);
        if (s_check_dtype_attr(name, dtype) != 0)
            return DT_ETYPE;
        if (code == S_CUMSUM) {
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
    bool rms = c->def->code == S_RMS_NORM;
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
    s_format_shape(want, sizeof want, nshape, shape);
    bool fits = a->ndim >= nshape;
    for (int i = 0; fits && i < nshape; i++)
        fits = a->shape[a->ndim - nshape + i] == shape[i];
    if (!fits) {
        s_format_shape(got, sizeof got, a->ndim, a->shape);
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
            s_format_shape(got, sizeof got, w->ndim, w->shape);
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
    int code = c->def->code;
    if (s_is_list_reduce(code))
        return s_infer_list(c);
    if (code == S_LAYER_NORM || code == S_RMS_NORM)
        return s_infer_norm(c);
    return s_infer_along(c);
}

/* ---- sharding ------------------------------------------------------------------------------- */

/* Whether a Partial(have) input gives an exact Partial(have) output. */
static bool s_partial_passes(const op_call *c, dt_reduce_op have)
{
    dt_dtype in = c->in[0].dtype, out = c->out[0].dtype;
    bool floats = dt_dtype_is_float(in) && dt_dtype_is_float(out);
    switch (c->def->code) {
    case S_SUM:
    case S_MEAN:
    case S_CUMSUM:
        /* linear; integer sums stay exact only in int64 (int32 pieces may wrap, bool ones are or-ed) */
        return (have == DT_REDUCE_SUM && (floats || (in == DT_INT64 && out == DT_INT64))) ||
               (have == DT_REDUCE_AVG && floats);
    case S_AMAX:
    case S_MAX:
        return have == DT_REDUCE_MAX;
    case S_AMIN:
    case S_MIN:
        return have == DT_REDUCE_MIN;
    default:
        return false;
    }
}

static int s_shard_list(op_call *c)
{
    const op_arg *a = &c->in[0];
    int code = c->def->code;
    bool keepdim = s_int(&c->attrs, 0, 0) != 0;
    uint32_t mask = s_list_mask(&c->attrs, a->ndim);
    dt_reduce_op op = code <= S_MEAN ? DT_REDUCE_SUM : code == S_AMAX || code == S_MAX ? DT_REDUCE_MAX : DT_REDUCE_MIN;
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
    int code = c->def->code;
    if (s_is_list_reduce(code))
        return s_shard_list(c);
    if (code == S_LAYER_NORM || code == S_RMS_NORM) {
        int nshape = c->attrs.nints - 1;
        s_shard_whole(c, s_all_dims(a->ndim) & ~s_all_dims(a->ndim - nshape), 0);
        return 0;
    }
    int dim = s_along_dim(code, &c->attrs, a->ndim);
    uint32_t whole = dim < 0 ? s_all_dims(a->ndim) : a->ndim ? 1u << dim : 0u;
    bool keepdim = code == S_ARGMAX || code == S_ARGMIN ? s_int(&c->attrs, 0, 0) != 0
                   : code == S_MAX_DIM || code == S_MIN_DIM ? s_int(&c->attrs, 1, 0) != 0
                                                          : true;
    s_shard_whole(c, whole, keepdim ? 0u : whole);
    return 0;
}

/* mean: ctx[0] = how many elements each output element averages, globally. */
static int s_local_mean(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    const op_arg *a = &c->in[0];
    uint32_t mask = s_list_mask(&c->attrs, a->ndim);
    ctx[0] = 1;
    for (int d = 0; d < a->ndim; d++)
        if (mask & (1u << d))
            ctx[0] *= a->shape[d];
    return 1;
}

/* ---- kernels --------------------------------------------------------------------------------
 * Kernels compute in float32 or int64. A piece of another dtype is converted a chunk at a time,
 * in whole blocks of its outermost dim, into scratch that stays in cache and is reused: a
 * full-size copy costs more in page faults than the reduction itself. */

#define S_CHUNK 16384 /* elements converted at a time */

static const char *const s_oom = "out of memory on the device";

static bool s_native(dt_dtype d, cpu_ctype t)
{
    return (t == CPU_F32 && d == DT_FLOAT32) || (t == CPU_I64 && d == DT_INT64);
}

static cpu_ctype s_ctype(dt_dtype d) { return dt_dtype_is_float(d) ? CPU_F32 : CPU_I64; }

static void *s_alloc(int64_t n, size_t elem) { return malloc((size_t)(n > 0 ? n : 1) * elem); }

static int64_t s_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Converting to cast (what a dtype= argument asks for) first loses what the compute type would
 * keep: to a 16-bit float, or to bool. */
static bool s_lossy(dt_dtype from, dt_dtype cast)
{
    return cast != from && (cast == DT_FLOAT16 || cast == DT_BFLOAT16 || cast == DT_BOOL);
}

/* Reads a piece in compute type t, as torch sees it after converting it to cast. */
typedef struct {
    const op_local *piece;
    cpu_ctype t;
    dt_dtype cast;
    bool direct;  /* the piece is in t already: no copy */
    void *buf;    /* a chunk in t */
    void *narrow; /* a chunk in cast (lossy casts only) */
} s_reader;

static bool s_reader_init(s_reader *r, const op_local *piece, cpu_ctype t, dt_dtype cast, int64_t chunk)
{
    bool lossy = s_lossy(piece->dtype, cast);
    *r = (s_reader){piece, t, cast, s_native(piece->dtype, t) && !lossy, NULL, NULL};
    if (r->direct)
        return true;
    r->buf = s_alloc(chunk, cpu_ctype_size(t));
    r->narrow = lossy ? s_alloc(chunk, dt_dtype_size(cast)) : NULL;
    return r->buf && (!lossy || r->narrow);
}

/* count elements from first */
static const void *s_read(s_reader *r, int64_t first, int64_t count)
{
    const char *src = (const char *)r->piece->data + first * (int64_t)dt_dtype_size(r->piece->dtype);
    if (r->direct)
        return src;
    if (r->narrow) {
        cpu_ctype via = r->cast == DT_BOOL ? CPU_U8 : CPU_F32; /* buf holds either */
        cpu_to_ctype(r->buf, via, src, r->piece->dtype, count);
        cpu_from_ctype(r->narrow, r->cast, r->buf, via, count);
        cpu_to_ctype(r->buf, r->t, r->narrow, r->cast, count);
    } else {
        cpu_to_ctype(r->buf, r->t, src, r->piece->dtype, count);
    }
    return r->buf;
}

static void s_reader_free(s_reader *r)
{
    free(r->buf);
    free(r->narrow);
}

/* Writes an output computed in t: in place when it is of type t, else through a chunk. */
typedef struct {
    op_local *piece;
    cpu_ctype t;
    void *buf;
} s_writer;

static bool s_writer_init(s_writer *w, op_local *piece, cpu_ctype t, int64_t chunk)
{
    bool native = s_native(piece->dtype, t);
    *w = (s_writer){piece, t, native ? NULL : s_alloc(chunk, cpu_ctype_size(t))};
    return native || w->buf;
}

/* where the kernel writes the elements from first */
static void *s_slot(s_writer *w, int64_t first)
{
    return w->buf ? w->buf : (char *)w->piece->data + first * (int64_t)cpu_ctype_size(w->t);
}

static void s_flush(s_writer *w, int64_t first, int64_t count)
{
    if (w->buf)
        cpu_from_ctype((char *)w->piece->data + first * (int64_t)dt_dtype_size(w->piece->dtype), w->piece->dtype,
                       w->buf, w->t, count);
}

static void s_divide(float *v, int64_t n, int64_t count)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)((double)v[i] / (double)count);
}

/* The value of max/min over nothing: what a device with an empty shard contributes to a
 * Partial(max|min), so that the others' values win. */
static dt_scalar s_identity(dt_dtype d, bool max)
{
    if (dt_dtype_is_float(d))
        return (dt_scalar){.is_int = false, .f = max ? -INFINITY : INFINITY};
    switch (d) {
    case DT_INT32: return (dt_scalar){.is_int = true, .i = max ? INT32_MIN : INT32_MAX};
    case DT_INT64: return (dt_scalar){.is_int = true, .i = max ? INT64_MIN : INT64_MAX};
    default: return (dt_scalar){.is_int = true, .i = max ? 0 : 1};
    }
}

/* sum, mean, amax, amin, max, min: converted pieces go a block of dim-0 rows at a time; when
 * dim 0 is reduced, each block's result is combined into the first one's. */
static const char *s_cpu_list(op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int code = k->def->code;
    uint32_t mask = s_list_mask(k->attrs, in->ndim);
    int64_t n_out = dt_layout_numel(out->ndim, out->shape), extent = 1;
    for (int d = 0; d < in->ndim; d++)
        if (mask & (1u << d))
            extent *= in->shape[d];
    if (n_out == 0)
        return NULL;
    if (extent == 0) { /* an empty shard (or an empty reduced dim, for sum and mean) */
        if (code == S_SUM)
            cpu_fill(out->data, out->dtype, n_out, (dt_scalar){.is_int = true, .i = 0});
        else if (code == S_MEAN)
            cpu_fill(out->data, out->dtype, n_out, (dt_scalar){.f = k->ctx[0] ? 0.0 : NAN});
        else
            cpu_fill(out->data, out->dtype, n_out, s_identity(out->dtype, code == S_AMAX || code == S_MAX));
        return NULL;
    }
    cpu_red op = code <= S_MEAN ? CPU_RED_SUM : code == S_AMAX || code == S_MAX ? CPU_RED_MAX : CPU_RED_MIN;
    cpu_ctype t = s_ctype(out->dtype);
    dt_dtype cast = code <= S_MEAN ? out->dtype : in->dtype;
    int64_t rows = in->ndim ? in->shape[0] : 1, slab = dt_layout_numel(in->ndim, in->shape) / rows;
    bool folded = in->ndim > 0 && (mask & 1u); /* dim 0 is reduced */
    bool direct = s_native(in->dtype, t) && !s_lossy(in->dtype, cast);
    int64_t step = direct ? rows : s_min64(rows, S_CHUNK / slab > 1 ? S_CHUNK / slab : 1);
    int64_t out_slab = folded ? 0 : n_out / rows;
    s_reader rd;
    s_writer wr;
    void *part = folded && step < rows ? s_alloc(n_out, cpu_ctype_size(t)) : NULL;
    bool ok = s_reader_init(&rd, in, t, cast, step * slab);
    ok = s_writer_init(&wr, out, t, folded ? n_out : step * out_slab) && ok;
    const char *why = ok && (part || !folded || step == rows) ? NULL : s_oom;
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, in->shape, sizeof shape);
    for (int64_t r0 = 0; r0 < rows && !why; r0 += step) {
        int64_t count = s_min64(step, rows - r0);
        if (in->ndim)
            shape[0] = count;
        const void *x = s_read(&rd, r0 * slab, count * slab);
        if (folded) {
            void *acc = s_slot(&wr, 0);
            why = cpu_reduce_dims(op, t, r0 ? part : acc, x, in->ndim, shape, mask);
            if (!why && r0)
                cpu_combine(op, t, acc, part, n_out);
            continue;
        }
        void *y = s_slot(&wr, r0 * out_slab);
        why = cpu_reduce_dims(op, t, y, x, in->ndim, shape, mask);
        if (!why && code == S_MEAN)
            s_divide(y, count * out_slab, k->ctx[0]);
        if (!why)
            s_flush(&wr, r0 * out_slab, count * out_slab);
    }
    if (!why && folded) {
        if (code == S_MEAN)
            s_divide(s_slot(&wr, 0), n_out, k->ctx[0]);
        s_flush(&wr, 0, n_out);
    }
    s_reader_free(&rd);
    free(wr.buf);
    free(part);
    return why;
}

/* One chunk of outer blocks of an op along a dim (or of normalised rows). */
static const char *s_run_along(const op_kernel *k, cpu_ctype t, void *y, int64_t *index, const void *x,
                               int64_t outer, int64_t n, int64_t inner, const float *weight, const float *bias)
{
    int code = k->def->code;
    switch (code) {
    case S_MAX_DIM:
    case S_MIN_DIM:
    case S_ARGMAX:
    case S_ARGMIN:
        cpu_arg_run(code == S_MAX_DIM || code == S_ARGMAX, t, index, y, x, outer, n, inner);
        return NULL;
    case S_SOFTMAX:
    case S_LOG_SOFTMAX:
        return cpu_softmax_run(code == S_LOG_SOFTMAX, y, x, outer, n, inner);
    case S_CUMSUM:
        cpu_cumsum_run(t, y, x, outer, n, inner);
        return NULL;
    case S_TOPK:
        return cpu_topk_run(t, y, index, x, outer, n, inner, s_int(k->attrs, 0, 1), s_int(k->attrs, 2, 1) != 0);
    default: {
        float eps = k->attrs->nfloats > 0 ? (float)k->attrs->floats[0] : FLT_EPSILON;
        cpu_norm_run(code == S_RMS_NORM, y, x, outer, n, weight, bias, eps);
        return NULL;
    }
    }
}

/* max/min along a dim, argmax/argmin, softmax, log_softmax, cumsum, topk, layer_norm, rms_norm:
 * the piece is (outer, n, inner) and goes a chunk of outer blocks at a time. */
static const char *s_cpu_along(op_kernel *k)
{
    const op_local *in = &k->in[0];
    int code = k->def->code;
    bool norm = code == S_LAYER_NORM || code == S_RMS_NORM, arg = code == S_ARGMAX || code == S_ARGMIN;
    int64_t outer, n, inner, out_block;
    if (norm) {
        int64_t d = 1;
        for (int i = 1; i < k->attrs->nints; i++)
            d *= k->attrs->ints[i];
        n = d;
        inner = 1;
        outer = d ? dt_layout_numel(in->ndim, in->shape) / d : 0;
    } else {
        s_split(in->ndim, in->shape, s_along_dim(code, k->attrs, in->ndim), &outer, &n, &inner);
    }
    switch (code) {
    case S_MAX_DIM: case S_MIN_DIM: case S_ARGMAX: case S_ARGMIN: out_block = n ? inner : 0; break;
    case S_TOPK: out_block = s_int(k->attrs, 0, 1) * inner; break;
    default: out_block = n * inner; break;
    }
    if (outer == 0 || out_block == 0)
        return NULL;
    cpu_ctype t = norm || code == S_SOFTMAX || code == S_LOG_SOFTMAX ? CPU_F32
                  : code == S_CUMSUM                                ? s_ctype(k->out[0].dtype)
                                                                    : s_ctype(in->dtype);
    dt_dtype cast = code == S_SOFTMAX || code == S_LOG_SOFTMAX || code == S_CUMSUM ? k->out[0].dtype : in->dtype;
    int64_t *index = arg ? k->out[0].data : code == S_MAX_DIM || code == S_MIN_DIM || code == S_TOPK ? k->out[1].data
                                                                                                    : NULL;
    int64_t in_block = n * inner, widest = in_block > out_block ? in_block : out_block;
    bool direct = s_native(in->dtype, t) && !s_lossy(in->dtype, cast) && (arg || s_native(k->out[0].dtype, t));
    int64_t step = direct ? outer : s_min64(outer, S_CHUNK / widest > 1 ? S_CHUNK / widest : 1);
    s_reader rd, rw = {0}, rb = {0};
    s_writer wr = {0};
    void *values = NULL; /* argmax/argmin: the extreme values, not an output */
    bool ok = s_reader_init(&rd, in, t, cast, step * in_block);
    if (arg)
        ok = (values = s_alloc(step * out_block, cpu_ctype_size(t))) && ok;
    else
        ok = s_writer_init(&wr, &k->out[0], t, step * out_block) && ok;
    const float *weight = NULL, *bias = NULL;
    int64_t flags = norm ? s_int(k->attrs, 0, 0) : 0;
    if (flags & 1) {
        ok = s_reader_init(&rw, &k->in[1], CPU_F32, k->in[1].dtype, n) && ok;
        weight = ok ? s_read(&rw, 0, n) : NULL;
    }
    if (flags & 2) {
        const op_local *b = &k->in[flags & 1 ? 2 : 1];
        ok = s_reader_init(&rb, b, CPU_F32, b->dtype, n) && ok;
        bias = ok ? s_read(&rb, 0, n) : NULL;
    }
    const char *why = ok ? NULL : s_oom;
    for (int64_t o0 = 0; o0 < outer && !why; o0 += step) {
        int64_t count = s_min64(step, outer - o0);
        const void *x = s_read(&rd, o0 * in_block, count * in_block);
        void *y = arg ? values : s_slot(&wr, o0 * out_block);
        why = s_run_along(k, t, y, index ? index + o0 * out_block : NULL, x, count, n, inner, weight, bias);
        if (!why && !arg)
            s_flush(&wr, o0 * out_block, count * out_block);
    }
    s_reader_free(&rd);
    s_reader_free(&rw);
    s_reader_free(&rb);
    free(wr.buf);
    free(values);
    return why;
}

static const char *s_cpu(op_kernel *k)
{
    return s_is_list_reduce(k->def->code) ? s_cpu_list(k) : s_cpu_along(k);
}

/* ---- the table (attributes: see above) ------------------------------------------------------- */

#define S_OP(name, code, nin, nout) {name, code, nin, nout, s_infer, s_shard, NULL, s_cpu}
const op_def op_reduce_ops[] = {
    S_OP("sum", S_SUM, 1, 1),
    {"mean", S_MEAN, 1, 1, s_infer, s_shard, s_local_mean, s_cpu},
    S_OP("amax", S_AMAX, 1, 1),
    S_OP("amin", S_AMIN, 1, 1),
    S_OP("max", S_MAX, 1, 1),
    S_OP("min", S_MIN, 1, 1),
    S_OP("max_dim", S_MAX_DIM, 1, 2),
    S_OP("min_dim", S_MIN_DIM, 1, 2),
    S_OP("argmax", S_ARGMAX, 1, 1),
    S_OP("argmin", S_ARGMIN, 1, 1),
    S_OP("softmax", S_SOFTMAX, 1, 1),
    S_OP("log_softmax", S_LOG_SOFTMAX, 1, 1),
    S_OP("cumsum", S_CUMSUM, 1, 1),
    S_OP("topk", S_TOPK, 1, 2),
    S_OP("layer_norm", S_LAYER_NORM, -1, 1),
    S_OP("rms_norm", S_RMS_NORM, -1, 1),
};
#undef S_OP
const int op_reduce_count = (int)(sizeof op_reduce_ops / sizeof op_reduce_ops[0]);
