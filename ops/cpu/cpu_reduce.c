/* cpu_reduce — the CPU kernels of the reduction ops (OP_REDUCE), which convert pieces a chunk at a
 * time into the loops of cpu_reduce_loops.c. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "cpu_reduce_loops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

/* ---- the kernels of the ops (OP_REDUCE in ops/op_table.h) --------------------------------------
 * ctx (worked out by op_reduce.c): list reductions [reduced dims mask, elements each output
 * averages]; ops along a dim [the dim, or -1 for every element]; norms [elements normalised
 * together, has_weight | has_bias << 1].
 *
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

static int64_t s_attr(const op_attrs *a, int i, int64_t otherwise) { return i < a->nints ? a->ints[i] : otherwise; }

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

/* sum, mean, amax, amin, max, min: converted pieces go a block of dim-0 rows at a time; when
 * dim 0 is reduced, each block's result is combined into the first one's. */
const char *cpu_k_reduce(op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int id = k->def->id;
    uint32_t mask;
    int64_t n_out, extent;
    const char *bad = op_reduce_layout(k, &mask, &extent, &n_out);
    if (bad)
        return bad;
    if (n_out == 0)
        return NULL;
    if (extent == 0) { /* an empty shard (or an empty reduced dim, for sum and mean) */
        if (id == OP_ID_sum)
            cpu_fill(out->data, out->dtype, n_out, (dt_scalar){.is_int = true, .i = 0});
        else if (id == OP_ID_mean)
            cpu_fill(out->data, out->dtype, n_out, (dt_scalar){.f = k->ctx[1] ? 0.0 : NAN});
        else
            cpu_fill(out->data, out->dtype, n_out, op_reduce_identity(out->dtype, id == OP_ID_amax || id == OP_ID_max));
        return NULL;
    }
    bool sum = id == OP_ID_sum || id == OP_ID_mean;
    cpu_red op = sum ? CPU_RED_SUM : id == OP_ID_amax || id == OP_ID_max ? CPU_RED_MAX : CPU_RED_MIN;
    cpu_ctype t = s_ctype(out->dtype);
    dt_dtype cast = sum ? out->dtype : in->dtype;
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
        if (!why && id == OP_ID_mean)
            s_divide(y, count * out_slab, k->ctx[1]);
        if (!why)
            s_flush(&wr, r0 * out_slab, count * out_slab);
    }
    if (!why && folded) {
        if (id == OP_ID_mean)
            s_divide(s_slot(&wr, 0), n_out, k->ctx[1]);
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
    int id = k->def->id;
    switch (id) {
    case OP_ID_max_dim:
    case OP_ID_min_dim:
    case OP_ID_argmax:
    case OP_ID_argmin:
        cpu_arg_run(id == OP_ID_max_dim || id == OP_ID_argmax, t, index, y, x, outer, n, inner);
        return NULL;
    case OP_ID_softmax:
    case OP_ID_log_softmax:
        return cpu_softmax_run(id == OP_ID_log_softmax, y, x, outer, n, inner);
    case OP_ID_cumsum:
        cpu_cumsum_run(t, y, x, outer, n, inner);
        return NULL;
    case OP_ID_topk:
        return cpu_topk_run(t, y, index, x, outer, n, inner, s_attr(k->attrs, 0, 1), s_attr(k->attrs, 2, 1) != 0);
    default: {
        float eps = k->attrs->nfloats > 0 ? (float)k->attrs->floats[0] : FLT_EPSILON;
        cpu_norm_run(id == OP_ID_rms_norm, y, x, outer, n, weight, bias, eps);
        return NULL;
    }
    }
}

/* max/min along a dim, argmax/argmin, softmax, log_softmax, cumsum, topk, layer_norm, rms_norm:
 * the piece is (outer, n, inner) and goes a chunk of outer blocks at a time. */
static const char *s_cpu_along(op_kernel *k)
{
    const op_local *in = &k->in[0];
    int id = k->def->id;
    bool norm = id == OP_ID_layer_norm || id == OP_ID_rms_norm, arg = id == OP_ID_argmax || id == OP_ID_argmin;
    int64_t outer, n, inner, out_block;
    const char *bad = op_along_layout(k, &outer, &n, &inner);
    if (bad)
        return bad;
    switch (id) {
    case OP_ID_max_dim: case OP_ID_min_dim: case OP_ID_argmax: case OP_ID_argmin: out_block = n ? inner : 0; break;
    case OP_ID_topk: out_block = s_attr(k->attrs, 0, 1) * inner; break;
    default: out_block = n * inner; break;
    }
    if (outer == 0 || out_block == 0)
        return NULL;
    cpu_ctype t = norm || id == OP_ID_softmax || id == OP_ID_log_softmax ? CPU_F32
                  : id == OP_ID_cumsum                                ? s_ctype(k->out[0].dtype)
                                                                    : s_ctype(in->dtype);
    dt_dtype cast = id == OP_ID_softmax || id == OP_ID_log_softmax || id == OP_ID_cumsum ? k->out[0].dtype : in->dtype;
    int64_t *index = arg ? k->out[0].data : id == OP_ID_max_dim || id == OP_ID_min_dim || id == OP_ID_topk ? k->out[1].data
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
    int64_t flags = norm ? k->ctx[1] : 0;
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

/* the rows' kernels (ops/op_table.h) that run along a dim */
const char *cpu_k_arg(op_kernel *k) { return s_cpu_along(k); }
const char *cpu_k_softmax(op_kernel *k) { return s_cpu_along(k); }
const char *cpu_k_cumsum(op_kernel *k) { return s_cpu_along(k); }
const char *cpu_k_topk(op_kernel *k) { return s_cpu_along(k); }
const char *cpu_k_norm(op_kernel *k) { return s_cpu_along(k); }
