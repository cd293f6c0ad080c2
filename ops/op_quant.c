/* op_quant — linear layers whose weights are stored quantized (OP_QUANT in ops/op_table.h):
 * linear_int8 (one float32 scale per output row) and linear_int4 (one per 32 input features of a
 * row, two weights a byte). A weight row is its bytes, padded to whole int32 words: the tensors
 * stay of the types every op already moves (int32, float32), and only these kernels read the bytes.
 *
 * Sharding follows linear's (ops/op_matmul.c) but from the weight's side, since a quantized weight
 * is laid out once by the parallel styles and never worth moving: per mesh dim,
 * - qweight Shard(0) (output rows): scale and bias Shard(0) with it, input Replicate, output
 *   Shard(-1);
 * - qweight Shard(1) (input features): output Partial(sum); int8's scales are per row (Replicate),
 *   int4's are Shard(1) and must split where the words split (whole groups: else DT_EINVAL naming
 *   the split); the input stays Shard(-1) where its pieces hold the features of the weight's
 *   pieces, else it is replicated and each device reads its features from ctx[1] on; the bias is
 *   added at coordinate 0 only (ctx[0]);
 * - otherwise the weight is replicated: an input sharded on a leading dim stays so (the output is
 *   sharded alike), a Partial(sum|avg) input passes through (the product is linear), anything else
 *   is replicated. */
#include "op_quant.h"

#include <stdio.h>
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"

static int s_bits(const op_def *def) { return def->id == OP_ID_linear_int8 ? 8 : 4; }

static int64_t s_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* int32 words of a row of K features */
static int64_t s_words(int bits, int64_t K) { return s_ceil(K, bits == 8 ? 4 : 8); }

static int s_infer(op_call *c)
{
    const char *name = c->def->name;
    int bits = s_bits(c->def);
    if (c->nin < 3 || c->nin > 4)
        return dt_err(DT_EINVAL, "%s: expected input, qweight, scale and an optional bias, got %d tensors", name,
                      c->nin);
    const op_arg *x = &c->in[0], *q = &c->in[1], *s = &c->in[2];
    if (x->dtype != DT_FLOAT32 || x->ndim < 1)
        return dt_err(DT_ETYPE, "%s: the input must be a float32 tensor of at least 1 dim, got %s of %d dims", name,
                      dt_dtype_name(x->dtype), x->ndim);
    int64_t K = x->shape[x->ndim - 1];
    if (q->dtype != DT_INT32 || q->ndim != 2 || q->shape[1] != s_words(bits, K))
        return dt_err(DT_EINVAL, "%s: qweight must be int32 (out_features, %lld) for %lld input features, got %s "
                      "of %d dims", name, (long long)s_words(bits, K), (long long)K, dt_dtype_name(q->dtype), q->ndim);
    int64_t N = q->shape[0], G = s_ceil(K, OP_QUANT_GROUP);
    bool scale_ok = s->dtype == DT_FLOAT32 && (bits == 8 ? s->ndim == 1 && s->shape[0] == N
                                                          : s->ndim == 2 && s->shape[0] == N && s->shape[1] == G);
    if (!scale_ok)
        return dt_err(DT_EINVAL, bits == 8 ? "%s: scale must be float32 (%lld,), one per output feature"
                                           : "%s: scale must be float32 (%lld, %lld), one per 32 input features",
                      name, (long long)N, (long long)G);
    if (c->nin == 4 && (c->in[3].dtype != DT_FLOAT32 || c->in[3].ndim != 1 || c->in[3].shape[0] != N))
        return dt_err(DT_EINVAL, "%s: bias must be float32 (%lld,)", name, (long long)N);
    op_arg *o = &c->out[0];
    o->dtype = DT_FLOAT32;
    o->ndim = x->ndim;
    memcpy(o->shape, x->shape, sizeof o->shape);
    o->shape[o->ndim - 1] = N;
    return 0;
}

static bool s_linear_partial(dt_placement p)
{
    return p.kind == DT_PARTIAL && (p.reduce_op == DT_REDUCE_SUM || p.reduce_op == DT_REDUCE_AVG);
}

/* Where device coord's pieces sit along the input features: the input's first feature and count,
 * the weight's first word and count, the scales' first group (int4). */
typedef struct {
    int64_t x0, xn, w0, wn, g0;
} s_span;

static s_span s_span_at(const op_call *c, const int64_t *coord)
{
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    const op_arg *x = &c->in[0], *q = &c->in[1], *s = &c->in[2];
    s_span sp = {0};
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[0], x->ndim, x->shape, local, offset);
    sp.x0 = offset[x->ndim - 1], sp.xn = local[x->ndim - 1];
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[1], 2, q->shape, local, offset);
    sp.w0 = offset[1], sp.wn = local[1];
    if (s->ndim == 2) {
        dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[2], 2, s->shape, local, offset);
        sp.g0 = offset[1];
    }
    if (sp.wn == 0)
        sp.w0 = 0; /* an empty piece reads nothing, wherever torch says it starts */
    return sp;
}

/* Whether every device's input piece holds its weight piece's features (*groups: and int4's
 * scale pieces start at its words' first group). */
static bool s_spans_fit(const op_call *c, bool *groups)
{
    int bits = s_bits(c->def), per_word = bits == 8 ? 4 : 8;
    int64_t K = c->in[0].shape[c->in[0].ndim - 1], ndev = 1, coord[DT_MAX_DIMS];
    for (int m = 0; m < c->mesh_ndim; m++)
        ndev *= c->mesh_shape[m];
    bool fit = true;
    *groups = true;
    for (int64_t d = 0; d < ndev; d++) {
        for (int m = c->mesh_ndim - 1, r = (int)d; m >= 0; m--) {
            coord[m] = r % c->mesh_shape[m];
            r /= (int)c->mesh_shape[m];
        }
        s_span sp = s_span_at(c, coord);
        int64_t first = sp.w0 * per_word, end = (sp.w0 + sp.wn) * per_word;
        end = end < K ? end : K;
        if (sp.wn && (first < sp.x0 || end > sp.x0 + sp.xn))
            fit = false;
        if (bits == 4 && sp.wn && (sp.w0 % (OP_QUANT_GROUP / 8) || sp.g0 * (OP_QUANT_GROUP / 8) != sp.w0))
            *groups = false;
    }
    return fit;
}

static int s_shard(op_call *c)
{
    int bits = s_bits(c->def), last = c->in[0].ndim - 1;
    dt_placement R = dt_replicate();
    bool split_k = false;
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement x = c->in[0].pl[m], q = c->in[1].pl[m], out;
        dt_placement want[4] = {R, R, R, R};
        if (q.kind == DT_SHARD && q.dim == 0) {
            want[1] = want[2] = want[3] = dt_shard(0);
            out = dt_shard(last);
        } else if (q.kind == DT_SHARD && q.dim == 1) {
            want[0] = dt_shard(last);
            want[1] = dt_shard(1);
            want[2] = bits == 8 ? R : dt_shard(1);
            out = dt_partial(DT_REDUCE_SUM);
            split_k = true;
        } else if ((x.kind == DT_SHARD && x.dim < last) || s_linear_partial(x)) {
            want[0] = x;
            out = x;
        } else {
            out = R;
        }
        c->out[0].pl[m] = out;
        for (int i = 0; i < c->nin; i++)
            c->want[i][m] = want[i];
    }
    if (!split_k)
        return 0;
    bool groups;
    if (!s_spans_fit(c, &groups)) {
        /* the input's pieces split the features elsewhere than the weight's: every device reads
         * its own features out of the whole input */
        for (int m = 0; m < c->mesh_ndim; m++)
            if (c->want[1][m].kind == DT_SHARD && c->want[1][m].dim == 1)
                c->want[0][m] = R;
        s_spans_fit(c, &groups);
    }
    if (!groups) {
        int64_t K = c->in[0].shape[last];
        return dt_err(DT_EINVAL, "%s: splitting the %lld input features (%lld groups of %d) over the mesh as qweight "
                      "is split cuts a group of %d: give each device whole groups", c->def->name, (long long)K,
                      (long long)s_ceil(K, OP_QUANT_GROUP), OP_QUANT_GROUP, OP_QUANT_GROUP);
    }
    return 0;
}

/* ctx[0] = 1 when this device adds the bias (it is counted once in a Partial(sum)); ctx[1] = where
 * its weight's features start in its input piece. */
static int s_local(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    bool add = true;
    for (int m = 0; m < c->mesh_ndim && c->nin == 4; m++) {
        dt_placement p = c->out[0].pl[m];
        if (p.kind == DT_PARTIAL && p.reduce_op == DT_REDUCE_SUM && coord[m] != 0)
            add = false;
    }
    s_span sp = s_span_at(c, coord);
    ctx[0] = add;
    ctx[1] = sp.wn ? sp.w0 * (s_bits(c->def) == 8 ? 4 : 8) - sp.x0 : 0;
    return 2;
}

const char *op_quant_layout(const op_kernel *k, op_quant_dims *d)
{
    static const char *misfit = "the local pieces of the operands do not fit together";
    const op_local *x = &k->in[0], *q = &k->in[1], *s = &k->in[2], *o = &k->out[0];
    memset(d, 0, sizeof *d);
    d->bits = s_bits(k->def);
    if (k->nin < 3 || k->nin > 4 || k->nout != 1 || k->nctx < 2 || x->dtype != DT_FLOAT32 || x->ndim < 1 ||
        q->dtype != DT_INT32 || q->ndim != 2 || s->dtype != DT_FLOAT32 || o->dtype != DT_FLOAT32 ||
        o->ndim != x->ndim)
        return misfit;
    d->K_x = x->shape[x->ndim - 1];
    d->N = q->shape[0];
    d->row_bytes = q->shape[1] * 4;
    int64_t per_byte = d->bits == 8 ? 1 : 2, words = q->shape[1];
    d->k0 = k->ctx[1];
    if (d->k0 < 0 || d->k0 > d->K_x)
        return misfit;
    int64_t room = d->K_x - d->k0; /* words * 8 cannot overflow where words <= room */
    d->K = words > room || words * 4 * per_byte > room ? room : words * 4 * per_byte;
    if (s_words(d->bits, d->K) != words)
        return misfit;
    d->groups = d->bits == 8 ? 1 : s_ceil(d->K, OP_QUANT_GROUP);
    if (d->bits == 8 ? s->ndim != 1 || s->shape[0] != d->N : s->ndim != 2 || s->shape[0] != d->N ||
                                                                 s->shape[1] != d->groups)
        return misfit;
    for (int i = 0; i < x->ndim - 1; i++)
        if (o->shape[i] != x->shape[i])
            return misfit;
    if (o->shape[o->ndim - 1] != d->N)
        return misfit;
    d->M = dt_layout_numel(x->ndim - 1, x->shape);
    d->bias = k->nin == 4 && k->ctx[0];
    if (k->nin == 4 && (k->in[3].dtype != DT_FLOAT32 || k->in[3].ndim != 1 || k->in[3].shape[0] != d->N))
        return misfit;
    return NULL;
}

/* ---- the rows of OP_QUANT -------------------------------------------------------------------- */

#define S_DEF(op, num, bits)                                                                                          \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = -1, .nout = 1, .infer = s_infer, .shard = s_shard,  \
                                .local = s_local};
OP_QUANT(S_DEF)
#undef S_DEF
