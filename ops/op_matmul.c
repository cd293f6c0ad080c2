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
 * its dims match and is Replicate where it broadcasts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_matmul.h"
#include "cpu_pointwise.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

enum { M_MATMUL, M_MM, M_BMM, M_LINEAR, M_EMBEDDING, M_SDPA };

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

static cpu_ctype m_ctype(dt_dtype d) { return dt_dtype_is_float(d) ? CPU_F32 : CPU_I64; }

/* A piece as n elements of the compute type t: the piece itself when it already is, else a
 * converted scratch copy (*scratch set, to be freed). NULL when out of memory. */
static const void *m_as(const op_local *in, cpu_ctype t, void **scratch)
{
    *scratch = NULL;
    if ((t == CPU_F32 && in->dtype == DT_FLOAT32) || (t == CPU_I64 && in->dtype == DT_INT64))
        return in->data;
    int64_t n = dt_layout_numel(in->ndim, in->shape);
    void *buf = malloc((size_t)(n ? n : 1) * cpu_ctype_size(t));
    if (buf)
        cpu_to_ctype(buf, t, in->data, in->dtype, n);
    *scratch = buf;
    return buf;
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
    const m_opt *pick[DT_MAX_DIMS], *best[DT_MAX_DIMS];
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

/* Where the dims of a product are: a (batch..., M, K), b (batch..., K, N), or b a weight (N, K)
 * for linear; M is absent for a 1-D a and N for a 1-D b (-1). */
typedef struct {
    int a_m, a_k, b_k, b_n, o_m, o_n;
    int nbatch, a_nbatch, b_nbatch;
    bool b_trans;
} m_mm;

static m_mm m_mm_dims(int a_nd, int b_nd, bool linear)
{
    m_mm d = {.b_trans = linear};
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

static int m_mm_infer(op_call *c)
{
    const char *name = c->def->name;
    int code = c->def->code;
    bool linear = code == M_LINEAR;
    if (linear && (c->nin < 2 || c->nin > 3))
        return dt_err(DT_EINVAL, "linear: expected input, weight and an optional bias, got %d tensors", c->nin);
    const op_arg *a = &c->in[0], *b = &c->in[1];
    char as[160], bs[160];
    m_shape_str(a->ndim, a->shape, as, sizeof as);
    m_shape_str(b->ndim, b->shape, bs, sizeof bs);
    switch (code) {
    case M_MM:
        if (a->ndim != 2)
            return dt_err(DT_EINVAL, "mm: self must be a matrix, got a %dD tensor of shape %s", a->ndim, as);
        if (b->ndim != 2)
            return dt_err(DT_EINVAL, "mm: mat2 must be a matrix, got a %dD tensor of shape %s", b->ndim, bs);
        break;
    case M_BMM:
        if (a->ndim != 3)
            return dt_err(DT_EINVAL, "bmm: batch1 must be a 3D tensor, got shape %s", as);
        if (b->ndim != 3)
            return dt_err(DT_EINVAL, "bmm: batch2 must be a 3D tensor, got shape %s", bs);
        if (a->shape[0] != b->shape[0] || a->shape[2] != b->shape[1])
            return dt_err(DT_EINVAL, "bmm: Expected size for first two dimensions of batch2 tensor to be: [%lld, %lld] "
                          "but got: [%lld, %lld].", (long long)a->shape[0], (long long)a->shape[2],
                          (long long)b->shape[0], (long long)b->shape[1]);
        break;
    case M_LINEAR:
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
    m_mm d = m_mm_dims(a->ndim, b->ndim, linear);
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
    m_mm d = m_mm_dims(a->ndim, b->ndim, c->def->code == M_LINEAR);
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

static int m_mm_shard(op_call *c) { return m_choose(c, m_mm_options, NULL); }

/* linear: ctx[0] = 1 when this device adds the bias (it is counted once in a Partial(sum)). */
static int m_linear_local(const op_call *c, const int64_t *coord, int64_t *ctx)
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

static const char *m_mm_cpu(op_kernel *k)
{
    const op_local *a = &k->in[0], *b = &k->in[1];
    op_local *o = &k->out[0];
    bool linear = k->def->code == M_LINEAR;
    m_mm d = m_mm_dims(a->ndim, b->ndim, linear);
    cpu_mm_desc desc = {.nbatch = d.nbatch, .b_trans = linear};
    desc.M = d.a_m >= 0 ? a->shape[d.a_m] : 1;
    desc.K = a->shape[d.a_k];
    desc.N = d.b_n >= 0 ? b->shape[d.b_n] : 1;
    if (b->shape[d.b_k] != desc.K || (d.o_m >= 0 && o->shape[d.o_m] != desc.M) ||
        (d.o_n >= 0 && o->shape[d.o_n] != desc.N) || o->ndim != d.nbatch + (d.a_m >= 0) + (d.b_n >= 0))
        return "the local pieces of the operands do not fit together";
    int64_t a_st[DT_MAX_DIMS], b_st[DT_MAX_DIMS];
    cpu_contiguous_strides(a->ndim, a->shape, 1, a_st);
    cpu_contiguous_strides(b->ndim, b->shape, 1, b_st);
    for (int j = 0; j < d.nbatch; j++) {
        int ja = j - (d.nbatch - d.a_nbatch), jb = j - (d.nbatch - d.b_nbatch);
        desc.batch[j] = o->shape[j];
        if ((ja >= 0 && a->shape[ja] != o->shape[j] && a->shape[ja] != 1) ||
            (jb >= 0 && b->shape[jb] != o->shape[j] && b->shape[jb] != 1))
            return "the local batch dims of the operands do not fit together";
        desc.a_stride[j] = ja >= 0 && a->shape[ja] == o->shape[j] ? a_st[ja] : 0;
        desc.b_stride[j] = jb >= 0 && b->shape[jb] == o->shape[j] ? b_st[jb] : 0;
    }
    cpu_ctype t = m_ctype(o->dtype);
    int64_t n = dt_layout_numel(o->ndim, o->shape);
    void *sa, *sb, *sbias = NULL, *sc = NULL;
    const void *pa = m_as(a, t, &sa), *pb = m_as(b, t, &sb);
    void *pc = o->data;
    if (!((t == CPU_F32 && o->dtype == DT_FLOAT32) || (t == CPU_I64 && o->dtype == DT_INT64)))
        pc = sc = malloc((size_t)(n ? n : 1) * cpu_ctype_size(t));
    const char *why = pa && pb && pc ? NULL : "out of memory on the device";
    bool bias = !why && k->nin == 3 && k->nctx > 0 && k->ctx[0];
    if (bias) {
        const void *pbias = m_as(&k->in[2], t, &sbias);
        if (pbias)
            cpu_broadcast(pc, o->ndim, o->shape, pbias, k->in[2].ndim, k->in[2].shape, cpu_ctype_size(t));
        else
            why = "out of memory on the device";
    }
    if (!why)
        why = cpu_matmul_run(&desc, t, pa, pb, pc, bias);
    if (!why && sc)
        cpu_from_ctype(o->data, o->dtype, sc, t, n);
    free(sa);
    free(sb);
    free(sbias);
    free(sc);
    return why;
}

/* ---- embedding ------------------------------------------------------------------------------- */

static int m_embedding_infer(op_call *c)
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

static int m_embedding_shard(op_call *c) { return m_choose(c, m_embedding_options, NULL); }

/* ctx[0]: the global index of this device's first weight row; ctx[1]: the vocabulary size. */
static int m_embedding_local(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    const op_arg *w = &c->in[1];
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[1], w->ndim, w->shape, local, offset);
    ctx[0] = offset[0];
    ctx[1] = w->shape[0];
    return 2;
}

static const char *m_embedding_cpu(op_kernel *k)
{
    const op_local *idx = &k->in[0], *w = &k->in[1];
    op_local *o = &k->out[0];
    int64_t n = dt_layout_numel(idx->ndim, idx->shape);
    if (k->nctx < 2 || w->ndim != 2 || o->shape[o->ndim - 1] != w->shape[1] ||
        dt_layout_numel(o->ndim, o->shape) != n * w->shape[1])
        return "the local pieces of the operands do not fit together";
    return cpu_embedding(o->data, w->data, w->shape[0], (size_t)w->shape[1] * dt_dtype_size(w->dtype), idx->data,
                         idx->dtype, n, k->ctx[0], k->ctx[1]);
}

/* ---- scaled_dot_product_attention ----------------------------------------------------------------
 * Inputs q, k, v and an optional mask; ints[0] = is_causal, ints[1] = enable_gqa, ints[2] = a scale
 * is given in floats[0]. */

static int64_t m_attr(const op_call *c, int i) { return c->attrs.nints > i ? c->attrs.ints[i] : 0; }

static int m_sdpa_infer(op_call *c)
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

static int m_sdpa_shard(op_call *c) { return m_choose(c, m_sdpa_options, m_sdpa_valid); }

/* ctx[0]: the global index of this device's first query row (for the causal mask). */
static int m_sdpa_local(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    const op_arg *q = &c->in[0];
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[0], q->ndim, q->shape, local, offset);
    ctx[0] = offset[q->ndim - 2];
    return 1;
}

static const char *m_sdpa_cpu(op_kernel *k)
{
    const op_local *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2], *mask = k->nin == 4 ? &k->in[3] : NULL;
    op_local *o = &k->out[0];
    int nd = q->ndim;
    int64_t L = q->shape[nd - 2], E = q->shape[nd - 1], S = kk->shape[nd - 2], Ev = v->shape[nd - 1];
    int64_t Hq = nd >= 3 ? q->shape[nd - 3] : 1, H = nd >= 3 ? kk->shape[nd - 3] : 1;
    int64_t group = H ? Hq / H : 1;
    int64_t nbatch = dt_layout_numel(nd - 2, q->shape); /* every (batch..., head) of the query */
    if (H * group != Hq || o->ndim != nd || o->shape[nd - 1] != Ev || o->shape[nd - 2] != L ||
        dt_layout_numel(nd - 2, kk->shape) * group != nbatch)
        return "the local pieces of the operands do not fit together";
    bool causal = k->attrs->nints > 0 && k->attrs->ints[0];
    bool has_scale = k->attrs->nints > 2 && k->attrs->ints[2] && k->attrs->nfloats > 0;
    float scale = has_scale ? (float)k->attrs->floats[0] : (float)(1.0 / sqrt((double)E));
    int64_t row0 = k->nctx > 0 ? k->ctx[0] : 0;
    /* the mask as additive float32, indexed with the attention weights' (local) dims */
    int64_t wshape[DT_MAX_DIMS], mstride[DT_MAX_DIMS] = {0};
    memcpy(wshape, q->shape, sizeof wshape);
    wshape[nd - 1] = S;
    float *mvals = NULL;
    if (mask) {
        int64_t mst[DT_MAX_DIMS];
        cpu_contiguous_strides(mask->ndim, mask->shape, 1, mst);
        for (int d = 0; d < nd; d++) {
            int md = d - (nd - mask->ndim);
            if (md < 0)
                continue;
            if (mask->shape[md] != wshape[d] && mask->shape[md] != 1)
                return "the local pieces of the mask and the attention weights do not fit together";
            mstride[d] = mask->shape[md] == wshape[d] ? mst[md] : 0;
        }
    }
    void *sq, *sk, *sv, *so = NULL;
    const float *pq = m_as(q, CPU_F32, &sq), *pk = m_as(kk, CPU_F32, &sk), *pv = m_as(v, CPU_F32, &sv);
    int64_t nout = dt_layout_numel(o->ndim, o->shape), nmask = mask ? dt_layout_numel(mask->ndim, mask->shape) : 0;
    float *po = o->dtype == DT_FLOAT32 ? o->data : (so = malloc((size_t)(nout ? nout : 1) * sizeof(float)));
    float *scores = malloc((size_t)(L * S > 0 ? L * S : 1) * sizeof(float));
    if (mask && (mvals = malloc((size_t)(nmask ? nmask : 1) * sizeof(float)))) {
        if (mask->dtype == DT_BOOL) {
            const uint8_t *mb = mask->data;
            for (int64_t i = 0; i < nmask; i++)
                mvals[i] = mb[i] ? 0.0f : -INFINITY;
        } else {
            cpu_to_ctype(mvals, CPU_F32, mask->data, mask->dtype, nmask);
        }
    }
    const char *why = pq && pk && pv && po && scores && (!mask || mvals) ? NULL : "out of memory on the device";
    int64_t idx[DT_MAX_DIMS] = {0};
    for (int64_t b = 0; b < nbatch && !why; b++) {
        int64_t h = nd >= 3 ? idx[nd - 3] : 0, outer = nd >= 3 ? b / (Hq ? Hq : 1) : 0;
        int64_t kv = outer * H + h / group, moff = 0;
        for (int d = 0; d < nd - 2; d++)
            moff += idx[d] * mstride[d];
        cpu_attention_head(L, S, E, Ev, pq + b * L * E, pk + kv * S * E, pv + kv * S * Ev, mvals ? mvals + moff : NULL,
                           mstride[nd - 2], mstride[nd - 1], causal, row0, scale, scores, po + b * L * Ev);
        for (int d = nd - 3; d >= 0; d--) {
            if (++idx[d] < q->shape[d])
                break;
            idx[d] = 0;
        }
    }
    if (!why && so)
        cpu_from_ctype(o->data, o->dtype, so, CPU_F32, nout);
    free(sq);
    free(sk);
    free(sv);
    free(so);
    free(scores);
    free(mvals);
    return why;
}

/* ---- the table -------------------------------------------------------------------------------
 * matmul, mm, bmm: (a, b). linear: (input, weight[, bias]); ctx[0] = add the bias here.
 * embedding: (indices, weight); ctx = [first weight row here, vocabulary size].
 * scaled_dot_product_attention: (q, k, v[, mask]); ints = [is_causal, enable_gqa, has_scale],
 * floats = [scale]; ctx[0] = first query row here. */
const op_def op_matmul_ops[] = {
    {"matmul", M_MATMUL, 2, 1, m_mm_infer, m_mm_shard, NULL, m_mm_cpu},
    {"mm", M_MM, 2, 1, m_mm_infer, m_mm_shard, NULL, m_mm_cpu},
    {"bmm", M_BMM, 2, 1, m_mm_infer, m_mm_shard, NULL, m_mm_cpu},
    {"linear", M_LINEAR, -1, 1, m_mm_infer, m_mm_shard, m_linear_local, m_mm_cpu},
    {"embedding", M_EMBEDDING, 2, 1, m_embedding_infer, m_embedding_shard, m_embedding_local, m_embedding_cpu},
    {"scaled_dot_product_attention", M_SDPA, -1, 1, m_sdpa_infer, m_sdpa_shard, m_sdpa_local, m_sdpa_cpu},
};
const int op_matmul_count = (int)(sizeof op_matmul_ops / sizeof op_matmul_ops[0]);
