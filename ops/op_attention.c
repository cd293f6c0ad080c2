/* op_attention — attention over one block of keys with an online-softmax accumulator (the kernel
 * op of ring attention, dtensor/dt_ring.c), and the merge of partial results.
 *
 *   attention_block(q, k, v, q_index, k_index[, o_acc, lse_acc]; ints [is_causal], floats [scale])
 *       -> (o, lse)
 *   attention_merge(o_parts, lse_parts; ints [P]) -> (o, lse)
 *
 * A partial result over some keys is a pair (o, lse) per query row: o the softmax-weighted values
 * over those keys, lse the log of the softmax's denominator; a row that sees none of them has
 * lse = -inf and o = 0. Partial results over disjoint sets of keys merge exactly:
 * lse = logaddexp(lse_a, lse_b), o = o_a exp(lse_a - lse) + o_b exp(lse_b - lse). So the keys can
 * be visited block by block, in any order, on any device. Which keys a query row sees is decided
 * by positions, not by where they sit in the arrays: key j is visible to row i iff
 * k_index[j] >= 0 and (not causal or k_index[j] <= q_index[i]), so any layout of the sequence
 * (zig-zag, uneven, padded, -1 for an empty cache slot) is correct.
 *
 * Sharding (when run through dt_op): per mesh dim every input follows q's batch shard (the indices
 * too where their batch dim is B > 1, else Replicate) or q's head shard (indices Replicate; with
 * grouped-query heads only when the mesh dims that split them divide Hkv, so every device keeps
 * whole groups); otherwise everything is Replicate. The merge follows its parts' head shard, else
 * Replicate (dim 0 stacks the parts). Outputs are float32; the kernels are
 * ops/cpu/cpu_attention.c and ops/cuda/cuda_attention.c. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

static bool s_has(const op_arg *a, dt_dtype dtype, int ndim, const int64_t *shape)
{
    return a->dtype == dtype && a->ndim == ndim && !memcmp(a->shape, shape, (size_t)ndim * sizeof *shape);
}

/* An index (B or 1, n) of int64 positions. */
static int s_check_index(const char *op, const char *what, const op_arg *idx, int64_t batch, int64_t n)
{
    if (idx->dtype != DT_INT64)
        return dt_err(DT_ETYPE, "%s: %s must be int64 positions, got %s", op, what, dt_dtype_name(idx->dtype));
    if (idx->ndim != 2 || (idx->shape[0] != 1 && idx->shape[0] != batch) || idx->shape[1] != n) {
        char got[96], rows[48] = "1";
        dt_layout_format_sizes(got, sizeof got, idx->ndim, idx->shape);
        if (batch != 1)
            snprintf(rows, sizeof rows, "1 or %lld", (long long)batch);
        return dt_err(DT_EINVAL, "%s: %s must have shape (%s, %lld), got %s", op, what, rows, (long long)n, got);
    }
    return 0;
}

/* q (B, Hq, Lq, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) of one floating dtype with Hkv dividing
 * Hq, and their positions. */
static int s_check_inputs(const char *op, const op_arg *in)
{
    const op_arg *q = &in[0], *k = &in[1], *v = &in[2];
    if (!dt_dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return dt_err(DT_ETYPE, "%s: query, key and value must have the same floating dtype, got %s, %s and %s", op,
                      dt_dtype_name(q->dtype), dt_dtype_name(k->dtype), dt_dtype_name(v->dtype));
    char qs[96], ks[96], vs[96];
    dt_layout_format_sizes(qs, sizeof qs, q->ndim, q->shape);
    dt_layout_format_sizes(ks, sizeof ks, k->ndim, k->shape);
    dt_layout_format_sizes(vs, sizeof vs, v->ndim, v->shape);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3] ||
        v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1] || v->shape[2] != k->shape[2])
        return dt_err(DT_EINVAL, "%s: expected query (B, Hq, Lq, D), key (B, Hkv, S, D) and value (B, Hkv, S, Dv), "
                      "got query %s, key %s, value %s", op, qs, ks, vs);
    if (k->shape[1] < 1 || q->shape[1] % k->shape[1] != 0)
        return dt_err(DT_EINVAL, "%s: the key/value heads (%lld) must divide the query heads (%lld)", op,
                      (long long)k->shape[1], (long long)q->shape[1]);
    int rc = s_check_index(op, "query_index", &in[3], q->shape[0], q->shape[2]);
    return rc ? rc : s_check_index(op, "key_index", &in[4], k->shape[0], k->shape[2]);
}

static int s_infer_block(op_call *c)
{
    const char *op = c->def->name;
    if (c->nin != 5 && c->nin != 7)
        return dt_err(DT_EINVAL, "%s: expected query, key, value, query_index, key_index and optionally o_acc and "
                      "lse_acc, got %d tensors", op, c->nin);
    if (c->attrs.nints != 1 || c->attrs.nfloats != 1)
        return dt_err(DT_EINVAL, "%s: expected ints [is_causal] and floats [scale]", op);
    int rc = s_check_inputs(op, c->in);
    if (rc)
        return rc;
    const op_arg *q = &c->in[0], *v = &c->in[2];
    c->nout = 2;
    c->out[0] = (op_arg){.ndim = 4, .dtype = DT_FLOAT32, .shape = {q->shape[0], q->shape[1], q->shape[2], v->shape[3]}};
    c->out[1] = (op_arg){.ndim = 3, .dtype = DT_FLOAT32, .shape = {q->shape[0], q->shape[1], q->shape[2]}};
    if (c->nin == 7 && (!s_has(&c->in[5], DT_FLOAT32, 4, c->out[0].shape) ||
                        !s_has(&c->in[6], DT_FLOAT32, 3, c->out[1].shape))) {
        char os[96], ls[96];
        dt_layout_format_sizes(os, sizeof os, 4, c->out[0].shape);
        dt_layout_format_sizes(ls, sizeof ls, 3, c->out[1].shape);
        return dt_err(DT_EINVAL, "%s: o_acc must be float32 of shape %s and lse_acc float32 of shape %s", op, os, ls);
    }
    return 0;
}

static int s_shard_block(op_call *c)
{
    const op_arg *q = &c->in[0], *k = &c->in[1];
    int64_t ways = 1;
    for (int m = 0; m < c->mesh_ndim; m++)
        if (q->pl[m].kind == DT_SHARD && q->pl[m].dim == 1)
            ways *= c->mesh_shape[m];
    bool whole_groups = q->shape[1] == k->shape[1] || k->shape[1] % ways == 0;
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = q->pl[m];
        bool batch = p.kind == DT_SHARD && p.dim == 0, heads = p.kind == DT_SHARD && p.dim == 1 && whole_groups;
        dt_placement follow = batch ? dt_shard(0) : heads ? dt_shard(1) : dt_replicate();
        for (int i = 0; i < c->nin; i++)
            c->want[i][m] = follow;
        for (int i = 3; i < 5; i++)
            c->want[i][m] = batch && c->in[i].shape[0] > 1 ? dt_shard(0) : dt_replicate();
        c->out[0].pl[m] = c->out[1].pl[m] = follow;
    }
    return 0;
}

static int s_infer_merge(op_call *c)
{
    const char *op = c->def->name;
    const op_arg *o = &c->in[0], *lse = &c->in[1];
    if (c->attrs.nints != 1 || c->attrs.ints[0] < 1)
        return dt_err(DT_EINVAL, "%s: expected ints [P], the number of partial results (at least 1)", op);
    int64_t parts = c->attrs.ints[0];
    bool fits = o->dtype == DT_FLOAT32 && lse->dtype == DT_FLOAT32 && o->ndim == 4 && lse->ndim == 3 &&
                o->shape[0] % parts == 0 && !memcmp(o->shape, lse->shape, 3 * sizeof *o->shape);
    if (!fits) {
        char os[96], ls[96];
        dt_layout_format_sizes(os, sizeof os, o->ndim, o->shape);
        dt_layout_format_sizes(ls, sizeof ls, lse->ndim, lse->shape);
        return dt_err(DT_EINVAL, "%s: expected float32 o_parts (P*B, H, L, Dv) and lse_parts (P*B, H, L) with "
                      "P = %lld, got o_parts %s of %s and lse_parts %s of %s", op, (long long)parts, os,
                      dt_dtype_name(o->dtype), ls, dt_dtype_name(lse->dtype));
    }
    c->nout = 2;
    int64_t batch = o->shape[0] / parts;
    c->out[0] = (op_arg){.ndim = 4, .dtype = DT_FLOAT32, .shape = {batch, o->shape[1], o->shape[2], o->shape[3]}};
    c->out[1] = (op_arg){.ndim = 3, .dtype = DT_FLOAT32, .shape = {batch, o->shape[1], o->shape[2]}};
    return 0;
}

static int s_shard_merge(op_call *c)
{
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = c->in[0].pl[m];
        dt_placement follow = p.kind == DT_SHARD && p.dim == 1 ? p : dt_replicate();
        c->want[0][m] = c->want[1][m] = c->out[0].pl[m] = c->out[1].pl[m] = follow;
    }
    return 0;
}

#define S_DEF(op, num, inputs, infer_fn, shard_fn)                                                                 \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = inputs, .nout = 2, .infer = infer_fn,               \
                                .shard = shard_fn};
OP_ATTENTION(S_DEF)
#undef S_DEF

/* ---- the pieces on a device ------------------------------------------------------------------- */

static bool s_local_is(const op_local *t, int ndim, const int64_t *shape)
{
    return t->ndim == ndim && !memcmp(t->shape, shape, (size_t)ndim * sizeof *shape);
}

static bool s_positions_fit(const op_local *idx, int64_t batch, int64_t n)
{
    return idx->dtype == DT_INT64 && idx->ndim == 2 && (idx->shape[0] == 1 || idx->shape[0] == batch) &&
           idx->shape[1] == n;
}

bool op_attention_block_fits(const op_kernel *k)
{
    const op_local *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2];
    if ((k->nin != 5 && k->nin != 7) || k->nout != 2 || k->attrs->nints < 1 || k->attrs->nfloats < 1 ||
        q->ndim != 4 || kk->ndim != 4 || v->ndim != 4)
        return false;
    int64_t B = q->shape[0], Hq = q->shape[1], L = q->shape[2], H = kk->shape[1], S = kk->shape[2];
    int64_t o_shape[4] = {B, Hq, L, v->shape[3]};
    bool fits = kk->shape[0] == B && kk->shape[3] == q->shape[3] && v->shape[0] == B && v->shape[1] == H &&
                v->shape[2] == S && (H ? Hq % H == 0 : Hq == 0) && dt_dtype_is_float(q->dtype) &&
                kk->dtype == q->dtype && v->dtype == q->dtype && s_positions_fit(&k->in[3], B, L) &&
                s_positions_fit(&k->in[4], B, S) && s_local_is(&k->out[0], 4, o_shape) &&
                s_local_is(&k->out[1], 3, o_shape) && k->out[0].dtype == DT_FLOAT32 &&
                k->out[1].dtype == DT_FLOAT32 && L <= INT_MAX && S <= INT_MAX && q->shape[3] <= INT_MAX &&
                v->shape[3] <= INT_MAX;
    if (k->nin == 7)
        fits = fits && s_local_is(&k->in[5], 4, o_shape) && s_local_is(&k->in[6], 3, o_shape) &&
               k->in[5].dtype == DT_FLOAT32 && k->in[6].dtype == DT_FLOAT32;
    return fits;
}

const char *op_attention_merge_layout(const op_kernel *k, int64_t *P, int64_t *rows, int64_t *Dv)
{
    static const char bad[] = "the local pieces of the operands do not fit together";
    const op_local *parts_o = &k->in[0], *parts_lse = &k->in[1];
    *P = k->attrs->nints > 0 ? k->attrs->ints[0] : 0;
    if (k->nin != 2 || *P < 1 || parts_o->ndim != 4 || parts_o->shape[0] % *P != 0 || k->nout != 2 ||
        parts_o->dtype != DT_FLOAT32 || parts_lse->dtype != DT_FLOAT32)
        return bad;
    int64_t o_shape[4] = {parts_o->shape[0] / *P, parts_o->shape[1], parts_o->shape[2], parts_o->shape[3]};
    int64_t lse_parts_shape[3] = {parts_o->shape[0], parts_o->shape[1], parts_o->shape[2]};
    if (!s_local_is(parts_lse, 3, lse_parts_shape) || !s_local_is(&k->out[0], 4, o_shape) ||
        !s_local_is(&k->out[1], 3, o_shape))
        return bad;
    *rows = o_shape[0] * o_shape[1] * o_shape[2];
    *Dv = o_shape[3];
    return NULL;
}
