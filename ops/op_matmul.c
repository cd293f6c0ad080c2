/* op_matmul — matrix products (matmul with torch's 1-D to N-D rules, mm, bmm), linear layers,
 * embedding lookups and scaled dot-product attention.
 *
 * Sharding: each op lists, per mesh dim, the candidates PyTorch's einsum rules give (section 3.1
 * of DTENSOR-SEMANTICS): a batch dim sharded alike on both operands stays sharded; rows of the
 * left operand S(m) with the right one R give rows; columns likewise; the contraction dim
 * sharded on both gives Partial(sum); all Replicate gives Replicate. A Partial(sum|avg) operand
 * times a Replicate one stays Partial (the product is linear); any other Partial is reduced
 * first. Candidates combine across mesh dims: when the inputs already fit one combination it is
 * taken as it is, otherwise the combination that moves the fewest bytes (op_cost) wins, ties to
 * the first in the order the candidates are listed (batch dims, rows, columns, contraction,
 * Partial pass-through, Replicate; mesh dim 0 varies slowest).
 *
 * linear(x, W, b) is matmul(x, W^T) + b, so the weight's dims count swapped: W S(0) (output
 * features) gives an output sharded on its last dim, W S(1) with x S(-1) gives Partial(sum).
 * The bias follows the output (S(0) when the output is sharded on its last dim, R when it is
 * sharded elsewhere); for a Partial output it stays Replicate and only the devices at
 * coordinate 0 along every Partial(sum) mesh dim add it (ctx[0]), so it is counted once.
 *
 * embedding(indices, W): W S(1) with indices R gives the output sharded on its last dim; W S(0)
 * with indices R gives Partial(sum), each device zeroing the rows it does not hold (ctx: its
 * first row, the vocabulary size); indices sharded with W R give an output sharded alike; a
 * Partial W (any reduce op: a lookup only selects) passes through with indices R. An index
 * outside [0, V) fails the kernel: the output is poisoned and the error surfaces on fetch.
 *
 * scaled_dot_product_attention(q, k, v, mask): q, k, v sharded alike on a batch or head dim
 * stay sharded (with grouped-query attention the heads shard only when the mesh dims that split
 * them divide the key/value head count, so every device keeps whole groups); a query-sequence
 * shard with k, v Replicate is kept as it is (each device attends for its own rows; the causal
 * mask learns the rows' global offset from ctx[0]) — better than PyTorch, which gathers it; a
 * Partial(sum|avg) v with q, k Replicate passes through (the output is linear in v); anything
 * else, such as a key-sequence shard, is gathered. The mask follows the output's shards where
 * its dims match and is Replicate where it broadcasts.
 *
 * The ops are the rows of OP_MATMUL (ops/op_table.h); their kernels are in ops/cpu/cpu_matmul.c
 * (and ops/cuda/cuda_matmul.c, cuda_view.c, cuda_attention.c). Attention's kernels read their
 * pieces' dims through op_sdpa_layout, here, so that every backend derives them alike. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static void m_shape_str(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
}

static bool m_same(dt_placement a, dt_placement b)
{
    return a.kind == b.kind && (a.kind != DT_SHARD || a.dim == b.dim) &&
           (a.kind != DT_PARTIAL || a.reduce_op == b.reduce_op);
}

static bool m_is_linear_partial(dt_placement p)
{
    return p.kind == DT_PARTIAL && (p.reduce_op == DT_REDUCE_SUM || p.reduce_op == DT_REDUCE_AVG);
}

/* The placement an operand that broadcasts right-aligned into the output (a bias, a mask) must
 * have when the output has p: the matching shard where its dim has the output's size, its own
 * Partial where the output keeps the same one (partial_ok), else Replicate. */
static dt_placement m_follow(const op_arg *in, const op_arg *out, dt_placement p, dt_placement have, bool partial_ok)
{
    if (p.kind == DT_SHARD) {
        int d = p.dim - (out->ndim - in->ndim);
        if (d >= 0 && in->shape[d] == out->shape[p.dim])
            return dt_shard(d);
    } else if (p.kind == DT_PARTIAL && partial_ok && m_same(have, p)) {
        return p;
    }
    return dt_replicate();
}

/* ---- choosing placements ----------------------------------------------------------------------
 * An op lists candidates per mesh dim; m_choose combines them across mesh dims. */

#define M_MAX_OPTS (DT_MAX_DIMS + 8)
#define M_MAX_IN 4
#define M_MAX_COMBOS 4096
#define M_CACHE 256

typedef struct {
    dt_placement out;
    dt_placement want[M_MAX_IN];
    bool gqa; /* shards the heads of a grouped-query attention */
} m_opt;

typedef int (*m_options_fn)(const op_call *c, int m, m_opt *opts);
typedef bool (*m_valid_fn)(const op_call *c, const m_opt *const *pick);

typedef struct {
    int n;
    int input[M_CACHE];
    dt_placement pl[M_CACHE][DT_MAX_DIMS];
    int64_t cost[M_CACHE];
} m_cost_cache;

static int64_t m_input_cost(const op_call *c, m_cost_cache *cache, int i, const dt_placement *want)
{
    for (int e = 0; e < cache->n; e++)
        if (cache->input[e] == i && op_same_placements(cache->pl[e], want, c->mesh_ndim))
            return cache->cost[e];
    int64_t cost = op_cost(c, i, want);
    if (cache->n < M_CACHE) {
        int e = cache->n++;
        cache->input[e] = i;
        memcpy(cache->pl[e], want, sizeof(dt_placement) * (size_t)c->mesh_ndim);
        cache->cost[e] = cost;
    }
    return cost;
}

/* Bytes moved for a combination (INT64_MAX: not possible). */
static int64_t m_combo_cost(const op_call *c, m_cost_cache *cache, const m_opt *const *pick, m_valid_fn valid)
{
    if (valid && !valid(c, pick))
        return INT64_MAX;
    int64_t total = 0;
    for (int i = 0; i < c->nin; i++) {
        dt_placement want[DT_MAX_DIMS];
        for (int m = 0; m < c->mesh_ndim; m++)
            want[m] = pick[m]->want[i];
        int64_t step = m_input_cost(c, cache, i, want);
        if (step == INT64_MAX)
            return INT64_MAX;
        total += step;
    }
    return total;
}

static int m_choose(op_call *c, m_options_fn options, m_valid_fn valid)
{
    int nm = c->mesh_ndim;
    m_opt opts[DT_MAX_DIMS][M_MAX_OPTS];
    int nopts[DT_MAX_DIMS];
    const m_opt *pick[DT_MAX_DIMS] = {NULL}, *best[DT_MAX_DIMS];
    /* the inputs as they are, when they fit a candidate on every mesh dim */
    bool fits = true;
    for (int m = 0; m < nm; m++) {
        nopts[m] = options(c, m, opts[m]);
        pick[m] = NULL;
        for (int o = 0; o < nopts[m] && !pick[m]; o++) {
            bool same = true;
            for (int i = 0; i < c->nin && same; i++)
                same = m_same(opts[m][o].want[i], c->in[i].pl[m]);
            if (same)
                pick[m] = &opts[m][o];
        }
        fits = fits && pick[m];
    }
    if (!(fits && (!valid || valid(c, pick)))) {
        m_cost_cache *cache = malloc(sizeof *cache);
        if (!cache)
            return dt_err(DT_ENOMEM, "%s: out of memory", c->def->name);
        cache->n = 0;
        int64_t combos = 1, best_cost = INT64_MAX;
        for (int m = 0; m < nm; m++)
            combos = combos > M_MAX_COMBOS ? combos : combos * nopts[m];
        for (int m = 0; m < nm; m++)
            best[m] = &opts[m][nopts[m] - 1]; /* every list ends with all Replicate */
        if (combos <= M_MAX_COMBOS) {
            int idx[DT_MAX_DIMS] = {0};
            for (int64_t n = 0; n < combos; n++) {
                for (int m = 0; m < nm; m++)
                    pick[m] = &opts[m][idx[m]];
                int64_t cost = m_combo_cost(c, cache, pick, valid);
                if (cost < best_cost) {
                    best_cost = cost;
                    memcpy(best, pick, sizeof best);
                }
                for (int m = nm - 1; m >= 0; m--) {
                    if (++idx[m] < nopts[m])
                        break;
                    idx[m] = 0;
                }
            }
        } else {
            /* too many combinations: improve one mesh dim at a time from all Replicate */
            memcpy(pick, best, sizeof pick);
            best_cost = m_combo_cost(c, cache, pick, valid);
            for (int pass = 0; pass < 2; pass++) {
                for (int m = 0; m < nm; m++) {
                    for (int o = 0; o < nopts[m]; o++) {
                        pick[m] = &opts[m][o];
                        int64_t cost = m_combo_cost(c, cache, pick, valid);
                        if (cost < best_cost) {
                            best_cost = cost;
                            memcpy(best, pick, sizeof best);
                        }
                    }
                    memcpy(pick, best, sizeof pick);
                }
            }
        }
        free(cache);
        memcpy(pick, best, sizeof pick);
    }
    for (int m = 0; m < nm; m++) {
        c->out[0].pl[m] = pick[m]->out;
        for (int i = 0; i < c->nin; i++)
            c->want[i][m] = pick[m]->want[i];
    }
    return 0;
}

static m_opt m_opt_make(dt_placement out, int nin, const dt_placement *want)
{
    m_opt o = {.out = out};
    for (int i = 0; i < nin; i++)
        o.want[i] = want[i];
    return o;
}

/* ---- matmul, mm, bmm, linear ----------------------------------------------------------------- */

op_mm_dims op_mm_layout(int a_nd, int b_nd, bool linear)
{
    op_mm_dims d = {.b_trans = linear};
    d.a_nbatch = a_nd >= 2 ? a_nd - 2 : 0;
    d.a_m = a_nd >= 2 ? a_nd - 2 : -1;
    d.a_k = a_nd - 1;
    if (linear) {
        d.b_nbatch = 0;
        d.b_k = b_nd - 1;
        d.b_n = b_nd == 2 ? 0 : -1;
    } else {
        d.b_nbatch = b_nd >= 2 ? b_nd - 2 : 0;
        d.b_k = b_nd >= 2 ? b_nd - 2 : 0;
        d.b_n = b_nd >= 2 ? b_nd - 1 : -1;
    }
    d.nbatch = d.a_nbatch > d.b_nbatch ? d.a_nbatch : d.b_nbatch;
    d.o_m = d.a_m >= 0 ? d.nbatch : -1;
    d.o_n = d.b_n >= 0 ? d.nbatch + (d.a_m >= 0) : -1;
    return d;
}

const char *op_mm_local(const op_kernel *k, op_mm_dims *d, int64_t *M, int64_t *K, int64_t *N)
{
    static const char *misfit = "the local pieces of the operands do not fit together";
    const op_local *a = &k->in[0], *b = &k->in[1], *o = &k->out[0];
    int id = k->def->id;
    bool linear = id == OP_ID_linear;
    if (k->nin < 2 || k->nin > (linear ? 3 : 2) || k->nout != 1 || a->ndim < 1 || b->ndim < 1 ||
        (id == OP_ID_mm && (a->ndim != 2 || b->ndim != 2)) || (id == OP_ID_bmm && (a->ndim != 3 || b->ndim != 3)) ||
        (linear && b->ndim > 2))
        return misfit;
    *d = op_mm_layout(a->ndim, b->ndim, linear);
    *M = d->a_m >= 0 ? a->shape[d->a_m] : 1;
    *K = a->shape[d->a_k];
    *N = d->b_n >= 0 ? b->shape[d->b_n] : 1;
    if (b->shape[d->b_k] != *K || o->ndim != d->nbatch + (d->a_m >= 0) + (d->b_n >= 0) ||
        (d->o_m >= 0 && o->shape[d->o_m] != *M) || (d->o_n >= 0 && o->shape[d->o_n] != *N))
        return misfit;
    for (int j = 0; j < d->nbatch; j++) {
        int ja = j - (d->nbatch - d->a_nbatch), jb = j - (d->nbatch - d->b_nbatch);
        if ((ja >= 0 && a->shape[ja] != o->shape[j] && a->shape[ja] != 1) ||
            (jb >= 0 && b->shape[jb] != o->shape[j] && b->shape[jb] != 1))
            return "the local batch dims of the operands do not fit together";
    }
    if (k->nin == 3) { /* the bias broadcasts into the output */
        const op_local *v = &k->in[2];
        if (v->ndim > o->ndim)
            return misfit;
        for (int i = 1; i <= v->ndim; i++)
            if (v->shape[v->ndim - i] != 1 && v->shape[v->ndim - i] != o->shape[o->ndim - i])
                return misfit;
    }
    return NULL;
}

static int s_infer_mm(op_call *c)
{
    const char *name = c->def->name;
    int code = c->def->id;
    bool linear = code == OP_ID_linear;
    if (linear && (c->nin < 2 || c->nin > 3))
        return dt_err(DT_EINVAL, "linear: expected input, weight and an optional bias, got %d tensors", c->nin);
    const op_arg *a = &c->in[0], *b = &c->in[1];
    char as[160], bs[160];
    m_shape_str(a->ndim, a->shape, as, sizeof as);
    m_shape_str(b->ndim, b->shape, bs, sizeof bs);
    switch (code) {
    case OP_ID_mm:
        if (a->ndim != 2)
            return dt_err(DT_EINVAL, "mm: self must be a matrix, got a %dD tensor of shape %s", a->ndim, as);
        if (b->ndim != 2)
            return dt_err(DT_EINVAL, "mm: mat2 must be a matrix, got a %dD tensor of shape %s", b->ndim, bs);
        break;
    case OP_ID_bmm:
        if (a->ndim != 3)
            return dt_err(DT_EINVAL, "bmm: batch1 must be a 3D tensor, got shape %s", as);
        if (b->ndim != 3)
            return dt_err(DT_EINVAL, "bmm: batch2 must be a 3D tensor, got shape %s", bs);
        if (a->shape[0] != b->shape[0] || a->shape[2] != b->shape[1])
            return dt_err(DT_EINVAL, "bmm: Expected size for first two dimensions of batch2 tensor to be: [%lld, %lld] "
                          "but got: [%lld, %lld].", (long long)a->shape[0], (long long)a->shape[2],
                          (long long)b->shape[0], (long long)b->shape[1]);
        break;
    case OP_ID_linear:
        if (a->ndim < 1)
            return dt_err(DT_EINVAL, "linear: the input must have at least 1 dimension, got a 0D tensor");
        if (b->ndim < 1 || b->ndim > 2)
            return dt_err(DT_EINVAL, "linear: weight must be 1D or 2D (out_features, in_features), got shape %s", bs);
        break;
    default:
        if (a->ndim < 1 || b->ndim < 1)
            return dt_err(DT_EINVAL, "matmul: both arguments to matmul need to be at least 1D, but they are %dD "
                          "and %dD", a->ndim, b->ndim);
    }
    for (int i = 1; i < c->nin; i++)
        if (c->in[i].dtype != a->dtype)
            return dt_err(DT_ETYPE, "%s: expected all operands to have the same dtype, but got %s and %s", name,
                          dt_dtype_name(a->dtype), dt_dtype_name(c->in[i].dtype));
    if (a->dtype == DT_BOOL)
        return dt_err(DT_ETYPE, "%s: not implemented for bool tensors", name);
    op_mm_dims d = op_mm_layout(a->ndim, b->ndim, linear);
    if (a->shape[d.a_k] != b->shape[d.b_k]) {
        if (a->ndim == 1 && b->ndim == 1 && !linear)
            return dt_err(DT_EINVAL, "%s: inconsistent tensor size, expected tensor %s and src %s to have the same "
                          "number of elements, but got %lld and %lld elements respectively", name, as, bs,
                          (long long)a->shape[0], (long long)b->shape[0]);
        if (linear)
            return dt_err(DT_EINVAL, "linear: input and weight shapes cannot be multiplied (input %s, weight %s: "
                          "in_features %lld != %lld)", as, bs, (long long)a->shape[d.a_k], (long long)b->shape[d.b_k]);
        return dt_err(DT_EINVAL, "%s: mat1 and mat2 shapes cannot be multiplied (%s and %s: %lld != %lld)", name, as,
                      bs, (long long)a->shape[d.a_k], (long long)b->shape[d.b_k]);
    }
    op_arg *o = &c->out[0];
    o->dtype = a->dtype;
    int nb;
    if (op_broadcast(name, d.a_nbatch, a->shape, d.b_nbatch, b->shape, &nb, o->shape) != 0)
        return DT_EINVAL;
    o->ndim = d.nbatch;
    if (d.a_m >= 0)
        o->shape[o->ndim++] = a->shape[d.a_m];
    if (d.b_n >= 0)
        o->shape[o->ndim++] = b->shape[d.b_n];
    if (c->nin == 3) {
        const op_arg *bias = &c->in[2];
        bool fits = bias->ndim <= o->ndim;
        for (int i = 0; i < bias->ndim && fits; i++) {
            int64_t have = bias->shape[bias->ndim - 1 - i];
            fits = have == 1 || have == o->shape[o->ndim - 1 - i];
        }
        if (!fits) {
            char bias_s[160], out_s[160];
            m_shape_str(bias->ndim, bias->shape, bias_s, sizeof bias_s);
            m_shape_str(o->ndim, o->shape, out_s, sizeof out_s);
            return dt_err(DT_EINVAL, "linear: bias of shape %s does not broadcast to the output's shape %s", bias_s,
                          out_s);
        }
    }
    return 0;
}

static int m_mm_options(const op_call *c, int m, m_opt *opts)
{
    const op_arg *a = &c->in[0], *b = &c->in[1], *o = &c->out[0];
    op_mm_dims d = op_mm_layout(a->ndim, b->ndim, c->def->id == OP_ID_linear);
    dt_placement R = dt_replicate();
    int n = 0;
    for (int j = 0; j < d.nbatch; j++) {
        int ja = j - (d.nbatch - d.a_nbatch), jb = j - (d.nbatch - d.b_nbatch);
        dt_placement want[2] = {ja >= 0 && a->shape[ja] == o->shape[j] ? dt_shard(ja) : R,
                                jb >= 0 && b->shape[jb] == o->shape[j] ? dt_shard(jb) : R};
        opts[n++] = m_opt_make(dt_shard(j), 2, want);
    }
    if (d.a_m >= 0)
        opts[n++] = m_opt_make(dt_shard(d.o_m), 2, (dt_placement[]){dt_shard(d.a_m), R});
    if (d.b_n >= 0)
        opts[n++] = m_opt_make(dt_shard(d.o_n), 2, (dt_placement[]){R, dt_shard(d.b_n)});
    opts[n++] = m_opt_make(dt_partial(DT_REDUCE_SUM), 2, (dt_placement[]){dt_shard(d.a_k), dt_shard(d.b_k)});
    if (m_is_linear_partial(a->pl[m]))
        opts[n++] = m_opt_make(a->pl[m], 2, (dt_placement[]){a->pl[m], R});
    if (m_is_linear_partial(b->pl[m]))
        opts[n++] = m_opt_make(b->pl[m], 2, (dt_placement[]){R, b->pl[m]});
    opts[n++] = m_opt_make(R, 2, (dt_placement[]){R, R});
    if (c->nin == 3)
        for (int i = 0; i < n; i++)
            opts[i].want[2] = m_follow(&c->in[2], o, opts[i].out, c->in[2].pl[m], true);
    return n;
}

static int s_shard_mm(op_call *c) { return m_choose(c, m_mm_options, NULL); }

/* linear: ctx[0] = 1 when this device adds the bias (it is counted once in a Partial(sum)). */
static int s_local_linear(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    bool add = true;
    for (int m = 0; m < c->mesh_ndim && c->nin == 3; m++) {
        dt_placement p = c->out[0].pl[m];
        if (p.kind == DT_PARTIAL && p.reduce_op == DT_REDUCE_SUM && c->want[2][m].kind != DT_PARTIAL && coord[m] != 0)
            add = false;
    }
    ctx[0] = add;
    return 1;
}

/* ---- embedding ------------------------------------------------------------------------------- */

static int s_infer_embedding(op_call *c)
{
    const op_arg *idx = &c->in[0], *w = &c->in[1];
    if (idx->dtype != DT_INT64 && idx->dtype != DT_INT32)
        return dt_err(DT_ETYPE, "embedding: Expected tensor for argument #1 'indices' to have one of the following "
                      "scalar types: int64, int32; but got %s instead", dt_dtype_name(idx->dtype));
    if (w->ndim != 2) {
        char ws[160];
        m_shape_str(w->ndim, w->shape, ws, sizeof ws);
        return dt_err(DT_EINVAL, "embedding: 'weight' must be 2-D, got shape %s", ws);
    }
    if (idx->ndim + 1 > DT_MAX_DIMS)
        return dt_err(DT_EINVAL, "embedding: indices have too many dims (%d; at most %d)", idx->ndim, DT_MAX_DIMS - 1);
    op_arg *o = &c->out[0];
    o->dtype = w->dtype;
    o->ndim = idx->ndim + 1;
    memcpy(o->shape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    o->shape[idx->ndim] = w->shape[1];
    return 0;
}

static int m_embedding_options(const op_call *c, int m, m_opt *opts)
{
    const op_arg *idx = &c->in[0], *w = &c->in[1];
    dt_placement R = dt_replicate();
    int n = 0;
    for (int j = 0; j < idx->ndim; j++)
        opts[n++] = m_opt_make(dt_shard(j), 2, (dt_placement[]){dt_shard(j), R});
    opts[n++] = m_opt_make(dt_shard(idx->ndim), 2, (dt_placement[]){R, dt_shard(1)});
    opts[n++] = m_opt_make(dt_partial(DT_REDUCE_SUM), 2, (dt_placement[]){R, dt_shard(0)});
    if (w->pl[m].kind == DT_PARTIAL)
        opts[n++] = m_opt_make(w->pl[m], 2, (dt_placement[]){R, w->pl[m]});
    opts[n++] = m_opt_make(R, 2, (dt_placement[]){R, R});
    return n;
}

static int s_shard_embedding(op_call *c) { return m_choose(c, m_embedding_options, NULL); }

/* ctx[0]: the global index of this device's first weight row; ctx[1]: the vocabulary size. */
static int s_local_embedding(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    const op_arg *w = &c->in[1];
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[1], w->ndim, w->shape, local, offset);
    ctx[0] = offset[0];
    ctx[1] = w->shape[0];
    return 2;
}

/* ---- scaled_dot_product_attention ----------------------------------------------------------------
 * Inputs q, k, v and an optional mask; ints[0] = is_causal, ints[1] = enable_gqa, ints[2] = a scale
 * is given in floats[0]. */

static int64_t m_attr(const op_call *c, int i) { return c->attrs.nints > i ? c->attrs.ints[i] : 0; }

static int s_infer_sdpa(op_call *c)
{
    const char *name = c->def->name;
    if (c->nin < 3 || c->nin > 4)
        return dt_err(DT_EINVAL, "%s: expected query, key, value and an optional attn_mask, got %d tensors", name,
                      c->nin);
    const op_arg *q = &c->in[0], *k = &c->in[1], *v = &c->in[2];
    char qs[160], ks[160], vs[160];
    m_shape_str(q->ndim, q->shape, qs, sizeof qs);
    m_shape_str(k->ndim, k->shape, ks, sizeof ks);
    m_shape_str(v->ndim, v->shape, vs, sizeof vs);
    if (!dt_dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return dt_err(DT_ETYPE, "%s: Expected query, key, and value to have the same floating dtype, but got "
                      "query.dtype: %s key.dtype: %s and value.dtype: %s instead.", name, dt_dtype_name(q->dtype),
                      dt_dtype_name(k->dtype), dt_dtype_name(v->dtype));
    int nd = q->ndim;
    if (nd < 2 || k->ndim != nd || v->ndim != nd)
        return dt_err(DT_EINVAL, "%s: query, key and value must have the same number of dims, at least 2 "
                      "((..., L, E), (..., S, E), (..., S, Ev)); got query %s, key %s, value %s", name, qs, ks, vs);
    if (q->shape[nd - 1] != k->shape[nd - 1] || k->shape[nd - 2] != v->shape[nd - 2])
        return dt_err(DT_EINVAL, "%s: expected query (..., L, E), key (..., S, E) and value (..., S, Ev); got "
                      "query %s, key %s, value %s", name, qs, ks, vs);
    bool gqa = m_attr(c, 1) != 0;
    for (int d = 0; d < nd - 2; d++) {
        bool heads = d == nd - 3;
        if (k->shape[d] != v->shape[d])
            return dt_err(DT_EINVAL, "%s: key %s and value %s must have the same batch and head dims", name, ks, vs);
        if (q->shape[d] == k->shape[d])
            continue;
        if (heads && gqa) {
            if (k->shape[d] == 0 || q->shape[d] % k->shape[d] != 0)
                return dt_err(DT_EINVAL, "%s: Number of heads in key and value must divide the number of heads in "
                              "query (query %s, key %s)", name, qs, ks);
            continue;
        }
        return dt_err(DT_EINVAL, "%s: query %s, key %s and value %s must have the same batch and head dims%s", name,
                      qs, ks, vs, heads ? " (for fewer key/value heads pass enable_gqa=True)" : "");
    }
    op_arg *o = &c->out[0];
    o->dtype = q->dtype;
    o->ndim = nd;
    memcpy(o->shape, q->shape, sizeof o->shape);
    o->shape[nd - 1] = v->shape[nd - 1];
    if (c->nin == 4) {
        const op_arg *mask = &c->in[3];
        if (m_attr(c, 0))
            return dt_err(DT_EINVAL, "%s: Explicit attn_mask should not be set when is_causal=True", name);
        if (mask->dtype != DT_BOOL && !dt_dtype_is_float(mask->dtype))
            return dt_err(DT_ETYPE, "%s: Expected attn_mask dtype to be bool or float, but got %s", name,
                          dt_dtype_name(mask->dtype));
        int64_t weights[DT_MAX_DIMS];
        memcpy(weights, q->shape, sizeof weights);
        weights[nd - 1] = k->shape[nd - 2];
        bool fits = mask->ndim <= nd;
        for (int i = 0; i < mask->ndim && fits; i++) {
            int64_t have = mask->shape[mask->ndim - 1 - i];
            fits = have == 1 || have == weights[nd - 1 - i];
        }
        if (!fits) {
            char ms[160], ws[160];
            m_shape_str(mask->ndim, mask->shape, ms, sizeof ms);
            m_shape_str(nd, weights, ws, sizeof ws);
            return dt_err(DT_EINVAL, "%s: attn_mask of shape %s does not broadcast to the attention weights' shape %s",
                          name, ms, ws);
        }
    }
    return 0;
}

/* The attention weights (..., L, S) as an op_arg, for mapping output shards onto the mask. */
static op_arg m_sdpa_weights(const op_call *c)
{
    op_arg w = c->in[0];
    w.shape[w.ndim - 1] = c->in[1].shape[w.ndim - 2];
    return w;
}

static int m_sdpa_options(const op_call *c, int m, m_opt *opts)
{
    const op_arg *q = &c->in[0], *k = &c->in[1], *v = &c->in[2];
    int nd = q->ndim, n = 0;
    dt_placement R = dt_replicate();
    for (int d = 0; d < nd - 2; d++) {
        opts[n] = m_opt_make(dt_shard(d), 3, (dt_placement[]){dt_shard(d), dt_shard(d), dt_shard(d)});
        opts[n++].gqa = q->shape[d] != k->shape[d];
    }
    opts[n++] = m_opt_make(dt_shard(nd - 2), 3, (dt_placement[]){dt_shard(nd - 2), R, R});
    if (m_is_linear_partial(v->pl[m]))
        opts[n++] = m_opt_make(v->pl[m], 3, (dt_placement[]){R, R, v->pl[m]});
    opts[n++] = m_opt_make(R, 3, (dt_placement[]){R, R, R});
    if (c->nin == 4) {
        op_arg w = m_sdpa_weights(c);
        for (int i = 0; i < n; i++)
            opts[i].want[3] = m_follow(&c->in[3], &w, opts[i].out, c->in[3].pl[m], false);
    }
    return n;
}

/* Grouped-query heads shard only into whole groups: the mesh dims that split them must divide
 * the key/value head count (then every level splits both head counts evenly). */
static bool m_sdpa_valid(const op_call *c, const m_opt *const *pick)
{
    int64_t ways = 1;
    for (int m = 0; m < c->mesh_ndim; m++)
        if (pick[m]->gqa)
            ways *= c->mesh_shape[m];
    return ways == 1 || c->in[1].shape[c->in[1].ndim - 3] % ways == 0;
}

static int s_shard_sdpa(op_call *c) { return m_choose(c, m_sdpa_options, m_sdpa_valid); }

/* ctx[0]: the global index of this device's first query row (for the causal mask). */
static int s_local_sdpa(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    const op_arg *q = &c->in[0];
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[0], q->ndim, q->shape, local, offset);
    ctx[0] = offset[q->ndim - 2];
    return 1;
}

const char *op_embedding_local(const op_kernel *k, int64_t *n)
{
    const op_local *idx = &k->in[0], *w = &k->in[1], *o = &k->out[0];
    if (k->nctx < 2 || k->nin != 2 || k->nout != 1 || (idx->dtype != DT_INT32 && idx->dtype != DT_INT64) ||
        w->ndim != 2 || o->ndim != idx->ndim + 1 || o->dtype != w->dtype || o->shape[idx->ndim] != w->shape[1] ||
        memcmp(o->shape, idx->shape, (size_t)idx->ndim * sizeof *idx->shape) || k->ctx[0] < 0)
        return "the local pieces of the operands do not fit together";
    *n = dt_layout_numel(idx->ndim, idx->shape);
    return NULL;
}

const char *op_sdpa_layout(const op_kernel *k, op_sdpa_dims *d)
{
    static const char misfit[] = "the local pieces of the operands do not fit together";
    const op_local *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2], *mask = k->nin == 4 ? &k->in[3] : NULL;
    const op_local *o = &k->out[0];
    int nd = q->ndim;
    if (k->nin < 3 || k->nin > 4 || k->nout != 1 || nd < 2 || kk->ndim != nd || v->ndim != nd ||
        (mask && mask->ndim > nd))
        return misfit;
    if (!dt_dtype_is_float(q->dtype) || kk->dtype != q->dtype || v->dtype != q->dtype || !dt_dtype_is_float(o->dtype) ||
        (mask && mask->dtype != DT_BOOL && !dt_dtype_is_float(mask->dtype)))
        return misfit;
    *d = (op_sdpa_dims){.nd = nd, .L = q->shape[nd - 2], .E = q->shape[nd - 1], .S = kk->shape[nd - 2],
                        .Ev = v->shape[nd - 1], .Hq = nd >= 3 ? q->shape[nd - 3] : 1,
                        .H = nd >= 3 ? kk->shape[nd - 3] : 1};
    d->group = d->H ? d->Hq / d->H : 1;
    d->nbatch = dt_layout_numel(nd - 2, q->shape);
    if (d->H * d->group != d->Hq || kk->shape[nd - 1] != d->E || v->shape[nd - 2] != d->S || o->ndim != nd ||
        o->shape[nd - 1] != d->Ev || o->shape[nd - 2] != d->L)
        return misfit;
    /* batch dims: k and v alike, q and the output alike, q and k alike but for the heads */
    for (int i = 0; i < nd - 2; i++)
        if (v->shape[i] != kk->shape[i] || o->shape[i] != q->shape[i] || (i != nd - 3 && kk->shape[i] != q->shape[i]))
            return misfit;
    const op_attrs *a = k->attrs;
    d->causal = a->nints > 0 && a->ints[0];
    bool has_scale = a->nints > 2 && a->ints[2] && a->nfloats > 0;
    d->scale = has_scale ? (float)a->floats[0] : (float)(1.0 / sqrt((double)d->E));
    d->row0 = k->nctx > 0 ? k->ctx[0] : 0;
    if (d->row0 < 0)
        return misfit;
    if (d->row0 > d->S)
        d->row0 = d->S; /* every key is visible from there on: row0 + i cannot overflow */
    if (!mask)
        return NULL;
    int64_t weights[DT_MAX_DIMS], mst[DT_MAX_DIMS];
    memcpy(weights, q->shape, sizeof weights);
    weights[nd - 1] = d->S;
    dt_layout_strides(mask->ndim, mask->shape, 1, mst);
    for (int i = 0; i < nd; i++) {
        int md = i - (nd - mask->ndim);
        if (md < 0)
            continue;
        if (mask->shape[md] != weights[i] && mask->shape[md] != 1)
            return "the local pieces of the mask and the attention weights do not fit together";
        d->mask_stride[i] = mask->shape[md] == weights[i] ? mst[md] : 0;
    }
    return NULL;
}

/* ---- the rows of OP_MATMUL ------------------------------------------------------------------- */

#define S_DEF(op, num, kernel, inputs, infer_fn, shard_fn, local_fn)                                                 \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = inputs, .nout = 1, .infer = infer_fn,                 \
                                .shard = shard_fn, .local = local_fn};
OP_MATMUL(S_DEF)
#undef S_DEF
