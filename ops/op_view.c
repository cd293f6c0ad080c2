/* op_view — views and data movement: reshape (view, flatten, unsqueeze, squeeze), permute,
 * expand, cat, stack, slice (narrow, select, basic indexing), index_select, triu and tril.
 * Device pieces are C-contiguous values: a reshape, or a slice that keeps one contiguous run,
 * shares its input's bytes on the device (op_def.alias, in op_view_alias.c with the other hooks that
 * spare a copy); every other output is a fresh piece.
 *
 * Sharding (torch's view, cat and indexing rules, DTENSOR-SEMANTICS 3.6 and 3.9):
 * - reshape-like ops keep a Shard when the dim survives: each input dim maps to an output dim
 *   (renumbered by unsqueeze/squeeze; for reshape and flatten the output dim that starts at the
 *   same row-major position). The shard is kept only when every device's output piece is its
 *   input piece in the same row-major order (checked with dt_layout_block on every device),
 *   which is exactly "an unchanged dim keeps its shard even uneven; a flattened or split dim
 *   keeps it only where the chunks line up". Otherwise that mesh dim is made Replicate first
 *   (the cheapest such choice when several mesh dims shard).
 * - permute renumbers shards; expand keeps shards of non-broadcast dims (a sharded size-1 dim
 *   that broadcasts is replicated first).
 * - cat: the inputs follow the placements of one of them (the cheapest), with a shard of the
 *   cat dim replaced by Replicate; stack the same, shard dims >= dim shifted by one.
 * - slice/narrow/select along a sharded dim: Replicate first unless the slice is the whole dim;
 *   other shards are kept (select drops its dim, later shards shift by -1).
 * - index_select(x, d, idx): x S(e), e != d, with idx R -> S(e); x R with idx S(0) -> S(d).
 * - triu/tril: any sharding, each piece masked with its global row and column offsets.
 * - Partial passes through all of them: they move or zero elements, which commutes with any
 *   elementwise reduction (cat/stack keep it only where every input has the same Partial).
 *
 * The ops are the rows of OP_VIEW (ops/op_table.h); their kernels are in ops/cpu/cpu_view.c. */
#include <stdio.h>
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_view.h"

/* Returns the error code of expr when it fails. */
#define S_TRY(expr)                                                                                                    \
    do {                                                                                                               \
        int rc_ = (expr);                                                                                              \
        if (rc_ != 0)                                                                                                  \
            return rc_;                                                                                                \
    } while (0)

static op_id s_code(const op_call *c) { return (op_id)c->def->id; }

/* "[2, 3]" */
static const char *s_fmt(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
    return buf;
}

static int64_t s_mesh_size(const op_call *c)
{
    int64_t n = 1;
    for (int m = 0; m < c->mesh_ndim; m++)
        n *= c->mesh_shape[m];
    return n;
}

static int s_need_ints(const op_call *c, int n)
{
    if (c->attrs.nints < n)
        return dt_err(DT_EINVAL, "%s: expected %d integer arguments, got %d", c->def->name, n, c->attrs.nints);
    return 0;
}

/* ---- reshape-like ops ------------------------------------------------------------------------ */

/* True when squeeze removes input dim d (a size-1 dim named by the call, or any when none is). */
static bool s_squeezed(const op_call *c, int d)
{
    const op_arg *a = &c->in[0];
    if (a->shape[d] != 1)
        return false;
    if (c->attrs.nints == 0)
        return true;
    for (int t = 0; t < c->attrs.nints; t++) {
        int64_t v = c->attrs.ints[t];
        if ((v < 0 ? v + a->ndim : v) == d)
            return true;
    }
    return false;
}

static int s_infer_reshape(op_call *c)
{
    const op_arg *a = &c->in[0];
    op_arg *o = &c->out[0];
    const char *name = c->def->name;
    int64_t numel = dt_layout_numel(a->ndim, a->shape);
    char b1[160];
    o->dtype = a->dtype;
    switch (s_code(c)) {
    case OP_ID_reshape: {
        int n = c->attrs.nints, infer = -1;
        if (n > DT_MAX_DIMS)
            return dt_err(DT_EINVAL, "%s: at most %d dims, got %d", name, DT_MAX_DIMS, n);
        int64_t known = 1;
        for (int i = 0; i < n; i++) {
            int64_t s = c->attrs.ints[i];
            if (s == -1) {
                if (infer >= 0)
                    return dt_err(DT_EINVAL, "%s: only one dimension can be inferred", name);
                infer = i;
            } else if (s < 0) {
                return dt_err(DT_EINVAL, "%s: invalid shape dimension %lld", name, (long long)s);
            } else {
                known = known && s > INT64_MAX / known ? -2 : known * s;
            }
            o->shape[i] = s;
        }
        o->ndim = n;
        if (infer >= 0) {
            if (known == 0)
                return dt_err(DT_EINVAL, "%s: cannot reshape tensor of 0 elements into shape %s because the "
                              "unspecified dimension size -1 can be any value and is ambiguous", name,
                              s_fmt(b1, sizeof b1, n, c->attrs.ints));
            if (known > 0 && numel % known == 0)
                o->shape[infer] = numel / known;
            else
                known = -2;
        }
        if (known == -2 || dt_layout_numel(o->ndim, o->shape) != numel)
            return dt_err(DT_EINVAL, "%s: shape '%s' is invalid for input of size %lld", name,
                          s_fmt(b1, sizeof b1, n, c->attrs.ints), (long long)numel);
        return 0;
    }
    case OP_ID_flatten: {
        int start, end;
        S_TRY(s_need_ints(c, 2));
        S_TRY(op_dim(name, c->attrs.ints[0], a->ndim, &start));
        S_TRY(op_dim(name, c->attrs.ints[1], a->ndim, &end));
        if (a->ndim == 0) {
            o->ndim = 1;
            o->shape[0] = 1;
            return 0;
        }
        if (start > end)
            return dt_err(DT_EINVAL, "%s: flatten() has invalid args: start_dim cannot come after end_dim", name);
        int n = 0;
        for (int d = 0; d < start; d++)
            o->shape[n++] = a->shape[d];
        o->shape[n++] = dt_layout_numel(end - start + 1, a->shape + start);
        for (int d = end + 1; d < a->ndim; d++)
            o->shape[n++] = a->shape[d];
        o->ndim = n;
        return 0;
    }
    case OP_ID_unsqueeze: {
        int dim;
        S_TRY(s_need_ints(c, 1));
        S_TRY(op_dim(name, c->attrs.ints[0], a->ndim + 1, &dim));
        if (a->ndim >= DT_MAX_DIMS)
            return dt_err(DT_EINVAL, "%s: at most %d dims", name, DT_MAX_DIMS);
        int n = 0;
        for (int d = 0; d <= a->ndim; d++)
            o->shape[n++] = d == dim ? 1 : a->shape[d < dim ? d : d - 1];
        o->ndim = n;
        return 0;
    }
    case OP_ID_squeeze: {
        for (int i = 0; i < c->attrs.nints; i++) {
            int d;
            S_TRY(op_dim(name, c->attrs.ints[i], a->ndim, &d));
        }
        int n = 0;
        for (int d = 0; d < a->ndim; d++)
            if (!s_squeezed(c, d))
                o->shape[n++] = a->shape[d];
        o->ndim = n;
        return 0;
    }
    default:
        return dt_err(DT_EINVAL, "%s: not a reshape", name);
    }
}

/* The output dim input dim d lands in, or -1. */
static int s_reshape_map(const op_call *c, int d)
{
    const op_arg *a = &c->in[0], *o = &c->out[0];
    switch (s_code(c)) {
    case OP_ID_unsqueeze: {
        int dim = (int)(c->attrs.ints[0] < 0 ? c->attrs.ints[0] + a->ndim + 1 : c->attrs.ints[0]);
        return d < dim ? d : d + 1;
    }
    case OP_ID_squeeze: {
        int kept = 0; /* the dims that stay keep their order */
        for (int i = 0; i < d; i++)
            kept += !s_squeezed(c, i);
        return s_squeezed(c, d) ? -1 : kept;
    }
    default: {
        /* reshape/flatten: the output dim that starts at the same row-major position (the
         * elements before it number the same), of size 1 exactly when the input dim is */
        int64_t before = 1;
        for (int i = 0; i < d; i++)
            before *= a->shape[i];
        int64_t p = 1;
        for (int i = 0; i < o->ndim; i++) {
            if (p == before && (a->shape[d] == 1) == (o->shape[i] == 1))
                return i;
            p *= o->shape[i];
        }
        return -1;
    }
    }
}

/* A box (a local piece) of a row-major tensor as the sequence of linear positions it covers:
 * start and (count, stride) runs, innermost first, merged where contiguous. -1: empty. */
static int s_canon(int ndim, const int64_t *shape, const int64_t *len, const int64_t *off, int64_t *start,
                   int64_t *cnt, int64_t *str)
{
    for (int i = 0; i < ndim; i++)
        if (len[i] == 0)
            return -1;
    int64_t stride = 1, st = 0;
    int n = 0;
    for (int i = ndim - 1; i >= 0; i--) {
        st += off[i] * stride;
        if (len[i] != 1) {
            if (n > 0 && str[n - 1] * cnt[n - 1] == stride) {
                cnt[n - 1] *= len[i];
            } else {
                cnt[n] = len[i];
                str[n] = stride;
                n++;
            }
        }
        stride *= shape[i];
    }
    *start = st;
    return n;
}

/* True when, on every device, the output piece under out_pl is the input piece under in_pl in
 * the same row-major order (the kernel is then one memcpy). */
static bool s_pieces_line_up(const op_call *c, const dt_placement *in_pl, const dt_placement *out_pl)
{
    const op_arg *a = &c->in[0], *o = &c->out[0];
    int64_t coord[DT_MAX_DIMS], il[DT_MAX_DIMS], io[DT_MAX_DIMS], ol[DT_MAX_DIMS], oo[DT_MAX_DIMS];
    int64_t s1 = 0, s2 = 0, c1[DT_MAX_DIMS], c2[DT_MAX_DIMS], t1[DT_MAX_DIMS], t2[DT_MAX_DIMS];
    int64_t n = s_mesh_size(c);
    for (int64_t f = 0; f < n; f++) {
        dt_layout_coord(c->mesh_ndim, c->mesh_shape, f, coord);
        dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, in_pl, a->ndim, a->shape, il, io);
        dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, out_pl, o->ndim, o->shape, ol, oo);
        int n1 = s_canon(a->ndim, a->shape, il, io, &s1, c1, t1);
        int n2 = s_canon(o->ndim, o->shape, ol, oo, &s2, c2, t2);
        if (n1 != n2)
            return false;
        if (n1 < 0)
            continue;
        if (s1 != s2 || memcmp(c1, c2, sizeof(int64_t) * (size_t)n1) || memcmp(t1, t2, sizeof(int64_t) * (size_t)n1))
            return false;
    }
    return true;
}

static int s_shard_reshape(op_call *c)
{
    const op_arg *a = &c->in[0];
    int mn = c->mesh_ndim;
    dt_placement base_in[DT_MAX_DIMS], base_out[DT_MAX_DIMS], in_pl[DT_MAX_DIMS], out_pl[DT_MAX_DIMS];
    int kept[DT_MAX_DIMS], nk = 0;
    for (int m = 0; m < mn; m++) {
        dt_placement p = a->pl[m];
        base_in[m] = base_out[m] = p;
        if (p.kind == DT_SHARD) {
            int od = s_reshape_map(c, p.dim);
            if (od >= 0) {
                base_out[m] = dt_shard(od);
                kept[nk++] = m;
            } else {
                base_in[m] = base_out[m] = dt_replicate();
            }
        }
    }
    if (nk == 0) {
        /* no Shard on either side: every piece is the whole tensor, which lines up with itself */
        memcpy(c->want[0], base_in, sizeof base_in);
        memcpy(c->out[0].pl, base_out, sizeof base_out);
        return 0;
    }
    /* every subset of the kept shards, most kept first; the cheapest valid one wins */
    int64_t best = -1;
    int best_pop = -1;
    for (int mask = (1 << nk) - 1; mask >= 0; mask--) {
        memcpy(in_pl, base_in, sizeof in_pl);
        memcpy(out_pl, base_out, sizeof out_pl);
        int pop = 0;
        for (int j = 0; j < nk; j++) {
            if (mask >> j & 1) {
                pop++;
            } else {
                in_pl[kept[j]] = dt_replicate();
                out_pl[kept[j]] = dt_replicate();
            }
        }
        if (!s_pieces_line_up(c, in_pl, out_pl))
            continue;
        int64_t cost = op_cost(c, 0, in_pl);
        if (best < 0 || cost < best || (cost == best && pop > best_pop)) {
            best = cost;
            best_pop = pop;
            memcpy(c->want[0], in_pl, sizeof in_pl);
            memcpy(c->out[0].pl, out_pl, sizeof out_pl);
        }
        if (best == 0 && best_pop == nk)
            break;
    }
    return 0;
}


/* ---- permute --------------------------------------------------------------------------------- */

static int s_infer_permute(op_call *c)
{
    const op_arg *a = &c->in[0];
    op_arg *o = &c->out[0];
    if (c->attrs.nints != a->ndim)
        return dt_err(DT_EINVAL, "permute: number of dimensions in the tensor input does not match the length of the "
                      "desired ordering of dimensions i.e. input.dim() = %d is not equal to len(dims) = %d",
                      a->ndim, c->attrs.nints);
    bool seen[DT_MAX_DIMS] = {false};
    for (int i = 0; i < a->ndim; i++) {
        int d;
        S_TRY(op_dim("permute", c->attrs.ints[i], a->ndim, &d));
        if (seen[d])
            return dt_err(DT_EINVAL, "permute: duplicate dims are not allowed.");
        seen[d] = true;
        o->shape[i] = a->shape[d];
    }
    o->ndim = a->ndim;
    o->dtype = a->dtype;
    return 0;
}

static int s_shard_permute(op_call *c)
{
    const op_arg *a = &c->in[0];
    int where[DT_MAX_DIMS]; /* input dim -> output dim */
    for (int i = 0; i < a->ndim; i++) {
        int64_t d = c->attrs.ints[i];
        where[d < 0 ? d + a->ndim : d] = i;
    }
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = a->pl[m];
        c->want[0][m] = p;
        c->out[0].pl[m] = p.kind == DT_SHARD ? dt_shard(where[p.dim]) : p;
    }
    return 0;
}


/* ---- expand ---------------------------------------------------------------------------------- */

static int s_infer_expand(op_call *c)
{
    const op_arg *a = &c->in[0];
    op_arg *o = &c->out[0];
    int n = c->attrs.nints;
    char b1[160], b2[160];
    if (n < a->ndim)
        return dt_err(DT_EINVAL, "expand: the number of sizes provided (%d) must be greater or equal to the number of "
                      "dimensions in the tensor (%d)", n, a->ndim);
    if (n > DT_MAX_DIMS)
        return dt_err(DT_EINVAL, "expand: at most %d dims, got %d", DT_MAX_DIMS, n);
    for (int i = 0; i < n; i++) {
        int k = i - (n - a->ndim);
        int64_t s = c->attrs.ints[i];
        if (k < 0) {
            if (s < 0)
                return dt_err(DT_EINVAL, "expand: The expanded size of the tensor (%lld) isn't allowed in a leading, "
                              "non-existing dimension %d", (long long)s, i);
        } else if (s == -1) {
            s = a->shape[k];
        } else if (s < 0) {
            return dt_err(DT_EINVAL, "expand: Trying to create tensor with negative dimension %lld", (long long)s);
        } else if (a->shape[k] != s && a->shape[k] != 1) {
            return dt_err(DT_EINVAL, "expand: The expanded size of the tensor (%lld) must match the existing size "
                          "(%lld) at non-singleton dimension %d.  Target sizes: %s.  Tensor sizes: %s",
                          (long long)s, (long long)a->shape[k], i, s_fmt(b1, sizeof b1, n, c->attrs.ints),
                          s_fmt(b2, sizeof b2, a->ndim, a->shape));
        }
        o->shape[i] = s;
    }
    o->ndim = n;
    o->dtype = a->dtype;
    return 0;
}

static int s_shard_expand(op_call *c)
{
    const op_arg *a = &c->in[0], *o = &c->out[0];
    int lead = o->ndim - a->ndim;
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = a->pl[m];
        if (p.kind == DT_SHARD && a->shape[p.dim] != o->shape[p.dim + lead])
            p = dt_replicate(); /* a size-1 dim that broadcasts: every device needs its element */
        c->want[0][m] = p;
        c->out[0].pl[m] = p.kind == DT_SHARD ? dt_shard(p.dim + lead) : p;
    }
    return 0;
}


/* ---- cat / stack ----------------------------------------------------------------------------- */

static int s_infer_cat(op_call *c)
{
    bool stack = s_code(c) == OP_ID_stack;
    const char *name = c->def->name;
    const op_arg *a = &c->in[0];
    op_arg *o = &c->out[0];
    char b1[160], b2[160];
    int dim;
    S_TRY(s_need_ints(c, 1));
    if (stack) {
        if (a->ndim >= DT_MAX_DIMS)
            return dt_err(DT_EINVAL, "stack: at most %d dims", DT_MAX_DIMS);
        S_TRY(op_dim(name, c->attrs.ints[0], a->ndim + 1, &dim));
    } else {
        for (int i = 0; i < c->nin; i++)
            if (c->in[i].ndim == 0)
                return dt_err(DT_EINVAL, "cat: zero-dimensional tensor (at position %d) cannot be concatenated", i);
        S_TRY(op_dim(name, c->attrs.ints[0], a->ndim, &dim));
    }
    dt_dtype dt = a->dtype;
    for (int i = 1; i < c->nin; i++) {
        const op_arg *b = &c->in[i];
        dt = op_promote(dt, b->dtype);
        if (stack) {
            if (b->ndim != a->ndim || memcmp(b->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim))
                return dt_err(DT_EINVAL, "stack expects each tensor to be equal size, but got %s at entry 0 and %s at "
                              "entry %d", s_fmt(b1, sizeof b1, a->ndim, a->shape),
                              s_fmt(b2, sizeof b2, b->ndim, b->shape), i);
            continue;
        }
        if (b->ndim != a->ndim)
            return dt_err(DT_EINVAL, "cat: Tensors must have same number of dimensions: got %d and %d", a->ndim,
                          b->ndim);
        for (int d = 0; d < a->ndim; d++)
            if (d != dim && b->shape[d] != a->shape[d])
                return dt_err(DT_EINVAL, "cat: Sizes of tensors must match except in dimension %d. Expected size %lld "
                              "but got size %lld for tensor number %d in the list.", dim, (long long)a->shape[d],
                              (long long)b->shape[d], i);
    }
    o->dtype = dt;
    if (stack) {
        int n = 0;
        for (int d = 0; d <= a->ndim; d++)
            o->shape[n++] = d == dim ? c->nin : a->shape[d < dim ? d : d - 1];
        o->ndim = n;
    } else {
        o->ndim = a->ndim;
        memcpy(o->shape, a->shape, sizeof o->shape);
        o->shape[dim] = 0;
        for (int i = 0; i < c->nin; i++)
            o->shape[dim] += c->in[i].shape[dim];
    }
    return 0;
}

static int s_shard_cat(op_call *c)
{
    bool stack = s_code(c) == OP_ID_stack;
    int dim = (int)c->attrs.ints[0];
    dim = dim < 0 ? dim + c->out[0].ndim : dim; /* output dim (cat: the same as the inputs') */
    dt_placement out_pl[DT_MAX_DIMS], want[DT_MAX_DIMS];
    int64_t best = -1;
    /* candidates: follow input 0, 1, ..., then all Replicate; the first of the cheapest wins */
    for (int k = 0; k <= c->nin; k++) {
        for (int m = 0; m < c->mesh_ndim; m++) {
            dt_placement p = k < c->nin ? c->in[k].pl[m] : dt_replicate();
            dt_placement out = dt_replicate(), in = dt_replicate();
            if (p.kind == DT_SHARD) {
                int od = stack && p.dim >= dim ? p.dim + 1 : p.dim;
                if (od != dim) {
                    out = dt_shard(od);
                    in = p;
                }
            } else if (p.kind == DT_PARTIAL) {
                bool all = true;
                for (int i = 0; i < c->nin; i++)
                    all = all && c->in[i].pl[m].kind == DT_PARTIAL && c->in[i].pl[m].reduce_op == p.reduce_op;
                if (all)
                    out = in = p;
            }
            out_pl[m] = out;
            want[m] = in;
        }
        int64_t cost = 0;
        for (int i = 0; i < c->nin; i++) {
            int64_t step = op_cost(c, i, want);
            cost = step == INT64_MAX || cost == INT64_MAX || cost > INT64_MAX - step ? INT64_MAX : cost + step;
        }
        if (best < 0 || cost < best) {
            best = cost;
            memcpy(c->out[0].pl, out_pl, sizeof out_pl);
            for (int i = 0; i < c->nin; i++)
                memcpy(c->want[i], want, sizeof want);
        }
        if (best == 0)
            break;
    }
    return 0;
}


/* ---- slice / narrow / select ------------------------------------------------------------------ */

/* The normalised (dim, start, length, step) of a slice-like call; 0 or an error. */
static int s_slice_args(const op_call *c, int *dim, int64_t *start, int64_t *len, int64_t *step)
{
    const op_arg *a = &c->in[0];
    const char *name = c->def->name;
    op_id code = s_code(c);
    S_TRY(s_need_ints(c, code == OP_ID_slice ? 4 : code == OP_ID_narrow ? 3 : 2));
    if (a->ndim == 0)
        return dt_err(DT_EINDEX, "%s() cannot be applied to a 0-dim tensor.", name);
    S_TRY(op_dim(name, c->attrs.ints[0], a->ndim, dim));
    int64_t size = a->shape[*dim];
    *step = 1;
    if (code == OP_ID_select) {
        int64_t i = c->attrs.ints[1];
        if (i < -size || i >= size) {
            char b1[160];
            return dt_err(DT_EINDEX, "select(): index %lld out of range for tensor of size %s at dimension %d",
                          (long long)i, s_fmt(b1, sizeof b1, a->ndim, a->shape), *dim);
        }
        *start = i < 0 ? i + size : i;
        *len = 1;
    } else if (code == OP_ID_narrow) {
        int64_t s = c->attrs.ints[1], l = c->attrs.ints[2];
        if (s < -size || s > size)
            return dt_err(DT_EINDEX,
                          "narrow: start out of range (expected to be in range of [%lld, %lld], but got %lld)",
                          (long long)-size, (long long)size, (long long)s);
        if (s < 0)
            s += size;
        if (l < 0)
            return dt_err(DT_EINVAL, "narrow(): length must be non-negative.");
        if (s > size - l)
            return dt_err(DT_EINVAL, "narrow: start (%lld) + length (%lld) exceeds dimension size (%lld).",
                          (long long)s, (long long)l, (long long)size);
        *start = s;
        *len = l;
    } else {
        /* Python slice semantics (step > 0): negative bounds count from the end, then clamp */
        int64_t s = c->attrs.ints[1], e = c->attrs.ints[2], st = c->attrs.ints[3];
        if (st <= 0)
            return dt_err(DT_EINVAL, "slice: step must be greater than zero");
        if (s < 0)
            s = s < -size ? 0 : s + size;
        if (e < 0)
            e = e < -size ? 0 : e + size;
        s = s > size ? size : s;
        e = e > size ? size : e;
        *start = s;
        *len = e <= s ? 0 : st == 1 ? e - s : (e - s - 1) / st + 1; /* a step of 1 divides nothing */
        *step = st;
    }
    return 0;
}

/* ... as s_infer_slice worked them out (for the hooks after it, and op_view_alias.c's) */
void op_slice_derived(const op_call *c, int *dim, int64_t *start, int64_t *len, int64_t *step)
{
    *dim = (int)c->derived[0];
    *start = c->derived[1];
    *len = c->derived[2];
    *step = c->derived[3];
}

static int s_infer_slice(op_call *c)
{
    const op_arg *a = &c->in[0];
    op_arg *o = &c->out[0];
    int dim = 0;
    int64_t start = 0, len = 0, step = 1;
    int rc = s_slice_args(c, &dim, &start, &len, &step);
    if (rc)
        return rc;
    memcpy(c->derived, (int64_t[]){dim, start, len, step}, sizeof c->derived);
    o->dtype = a->dtype;
    int n = 0;
    for (int d = 0; d < a->ndim; d++) {
        if (d != dim)
            o->shape[n++] = a->shape[d];
        else if (s_code(c) != OP_ID_select)
            o->shape[n++] = len;
    }
    o->ndim = n;
    return 0;
}

static int s_shard_slice(op_call *c)
{
    const op_arg *a = &c->in[0];
    int dim = 0;
    int64_t start = 0, len = 0, step = 1;
    op_slice_derived(c, &dim, &start, &len, &step);
    bool select = s_code(c) == OP_ID_select;
    int64_t size = a->shape[dim];
    bool whole = !select && start == 0 && len == size && (step == 1 || size <= 1);
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = a->pl[m];
        if (p.kind == DT_SHARD && p.dim == dim && !whole)
            p = dt_replicate();
        c->want[0][m] = p;
        c->out[0].pl[m] = p.kind == DT_SHARD && select && p.dim > dim ? dt_shard(p.dim - 1) : p;
    }
    return 0;
}

static int s_local_slice(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    (void)coord;
    int dim = 0;
    int64_t start = 0, len = 0, step = 1;
    op_slice_derived(c, &dim, &start, &len, &step);
    ctx[0] = dim;
    ctx[1] = start;
    ctx[2] = step;
    return 3;
}


/* ---- index_select ---------------------------------------------------------------------------- */

static int s_infer_index_select(op_call *c)
{
    const op_arg *a = &c->in[0], *idx = &c->in[1];
    op_arg *o = &c->out[0];
    int dim;
    S_TRY(s_need_ints(c, 1));
    if (idx->dtype != DT_INT32 && idx->dtype != DT_INT64)
        return dt_err(DT_ETYPE, "index_select(): Expected dtype int32/int64 for index but got: %s",
                      dt_dtype_name(idx->dtype));
    if (idx->ndim > 1)
        return dt_err(DT_EINVAL, "index_select(): Index is supposed to be a vector, got %d dims", idx->ndim);
    if (a->ndim == 0)
        return dt_err(DT_EINDEX, "index_select(): cannot index a 0-dim tensor");
    S_TRY(op_dim("index_select", c->attrs.ints[0], a->ndim, &dim));
    *o = *a;
    o->shape[dim] = dt_layout_numel(idx->ndim, idx->shape);
    return 0;
}

static int s_shard_index_select(op_call *c)
{
    const op_arg *x = &c->in[0], *idx = &c->in[1];
    int d = (int)(c->attrs.ints[0] < 0 ? c->attrs.ints[0] + x->ndim : c->attrs.ints[0]);
    dt_placement out[DT_MAX_DIMS], wx[DT_MAX_DIMS], wi[DT_MAX_DIMS];
    int64_t best = -1;
    /* candidates: x's placements first then idx's, idx's first then x's, only x's, only idx's,
     * all Replicate; the first of the cheapest wins */
    static const int order[5][2] = {{1, 1}, {2, 1}, {1, 0}, {0, 1}, {0, 0}}; /* {x rank, idx rank}, 0 = unused */
    for (int k = 0; k < 5; k++) {
        for (int m = 0; m < c->mesh_ndim; m++) {
            dt_placement px = x->pl[m], pi = idx->pl[m];
            bool x_ok = order[k][0] && (px.kind == DT_PARTIAL || (px.kind == DT_SHARD && px.dim != d));
            bool i_ok = order[k][1] && idx->ndim == 1 && pi.kind == DT_SHARD;
            out[m] = wx[m] = wi[m] = dt_replicate();
            if (x_ok && (!i_ok || order[k][0] == 1)) {
                out[m] = wx[m] = px;
            } else if (i_ok) {
                out[m] = dt_shard(d);
                wi[m] = pi;
            }
        }
        int64_t cx = op_cost(c, 0, wx), ci = op_cost(c, 1, wi);
        int64_t cost = cx == INT64_MAX || ci == INT64_MAX || cx > INT64_MAX - ci ? INT64_MAX : cx + ci;
        if (best < 0 || cost < best) {
            best = cost;
            memcpy(c->out[0].pl, out, sizeof out);
            memcpy(c->want[0], wx, sizeof wx);
            memcpy(c->want[1], wi, sizeof wi);
        }
        if (best == 0)
            break;
    }
    return 0;
}


/* ---- triu / tril ----------------------------------------------------------------------------- */

static int s_infer_tri(op_call *c)
{
    const op_arg *a = &c->in[0];
    if (a->ndim < 2)
        return dt_err(DT_EINVAL, "%s: input tensor must have at least 2 dimensions", c->def->name);
    c->out[0] = *a;
    return 0;
}

static int s_shard_same(op_call *c)
{
    memcpy(c->want[0], c->in[0].pl, sizeof c->want[0]);
    memcpy(c->out[0].pl, c->in[0].pl, sizeof c->out[0].pl);
    return 0;
}

static int s_local_tri(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    const op_arg *o = &c->out[0];
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, o->pl, o->ndim, o->shape, local, offset);
    ctx[0] = offset[o->ndim - 2];
    ctx[1] = offset[o->ndim - 1];
    return 2;
}


/* ---- the rows of OP_VIEW ---------------------------------------------------------------------- */

#define S_DEF(op, num, kernel, inputs, infer_fn, shard_fn, local_fn, alias_fn, view_fn, strided_fn)                  \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = inputs, .nout = 1, .infer = infer_fn,                 \
                                .shard = shard_fn, .local = local_fn, .alias = alias_fn, .view = view_fn,             \
                                .strided = strided_fn};
OP_VIEW(S_DEF)
#undef S_DEF
