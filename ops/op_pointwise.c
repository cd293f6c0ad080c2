/* op_pointwise — elementwise ops: unary math, binary arithmetic and comparisons with numpy/torch
 * broadcasting and Python scalars, where, masked_fill, clamp and dtype conversion.
 *
 * Sharding: the output follows one input's shards (mapped through broadcasting) or is
 * Replicate, whichever moves the fewest bytes; a broadcast dim of an input is Replicate there.
 * Partial passes through the linear cases (neg and casts; sum of two Partials; a Partial times a
 * replicated value or a finite number; a Partial numerator over a replicated denominator or a
 * nonzero number) and is reduced first everywhere else.
 *
 * The ops are the rows of OP_POINTWISE (ops/op_table.h); their kernels are in
 * ops/cpu/cpu_pointwise.c. */
#include <stdlib.h>
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "op_pointwise_math.h"
#include "op_registry.h"

typedef enum { S_UNARY, S_BINARY, S_WHERE, S_MASKED_FILL, S_CLAMP, S_TO } s_kind;

/* How an op treats its dtype. */
typedef enum {
    S_SAME,     /* the input's */
    S_FLOATING, /* the input's when floating, else float32 */
    S_PROMOTE,  /* torch's promotion of the operands */
    S_TRUE_DIV, /* promotion, then float32 if not floating */
    S_COMPARE,  /* bool, computed in the operands' promotion */
    S_LOGICAL,  /* bool */
} s_dtype_rule;

/* The types an op's kernels compute in: bits of float32, the integers, bool. */
enum { S_D_FLOAT = 1, S_D_NUMBER = 3, S_D_ANY = 7, S_D_BOOL = 4 };

/* How a Partial input may pass through. */
typedef enum { S_P_NONE, S_P_LINEAR, S_P_ADD, S_P_MUL, S_P_DIV } s_partial_rule;

typedef struct {
    s_kind kind;
    s_dtype_rule dtype;
    int domain;
    s_partial_rule partial;
} s_info;

/* Each row's kind and rules, by id. */
static const s_info s_infos[OP_ID_LIMIT] = {
#define S_INFO(name, id, kind, dtype, domain, partial, ...) [id] = {S_##kind, S_##dtype, S_D_##domain, S_P_##partial},
    OP_POINTWISE(S_INFO)
#undef S_INFO
};

/* A row's domain is the list of op_pointwise_math.h its line is in, which is what the backends'
 * kernels compute: a line in another list fails here, and so does a line without a row
 * ('s_domain_of_<name>' undeclared). A row without a line has no kernel, and fails to link. */
enum {
#define S_DOMAIN_OF(name, id, kind, dtype, domain, ...) s_domain_of_##name = S_D_##domain,
    OP_POINTWISE(S_DOMAIN_OF)
#undef S_DOMAIN_OF
};
#define S_IN(domain, name)                                                                                             \
    _Static_assert((int)s_domain_of_##name == S_D_##domain, #name ": its domain is not " #domain);
#define S_IN_FLOAT(name, ...) S_IN(FLOAT, name)
#define S_IN_NUMBER(name, ...) S_IN(NUMBER, name)
#define S_IN_ANY(name, ...) S_IN(ANY, name)
#define S_IN_BOOL(name, ...) S_IN(BOOL, name)
OP_EW_UNARY_FLOAT(S_IN_FLOAT)
OP_EW_BINARY_FLOAT(S_IN_FLOAT)
OP_EW_UNARY_NUMBER(S_IN_NUMBER)
OP_EW_BINARY_NUMBER(S_IN_NUMBER)
OP_EW_BINARY_DIVIDING(S_IN_NUMBER)
OP_EW_BINARY_ANY(S_IN_ANY)
OP_EW_COMPARE(S_IN_ANY)
OP_EW_LOGICAL(S_IN_BOOL)
#undef S_IN_FLOAT
#undef S_IN_NUMBER
#undef S_IN_ANY
#undef S_IN_BOOL
#undef S_IN

static const s_info *s_of(const op_call *c) { return &s_infos[c->def->id]; }

/* ---- inference ------------------------------------------------------------------------------ */

static int s_tensor_scalar_dtype(const op_call *c, dt_dtype *out)
{
    dt_dtype d = c->in[0].dtype;
    for (int i = 1; i < c->nin; i++)
        d = op_promote(d, c->in[i].dtype);
    if (c->attrs.has_scalar)
        d = op_promote_scalar(d, c->attrs.scalar);
    *out = d;
    return 0;
}

/* A UNARY row's float attributes ("beta=1, threshold=20"): none given takes the defaults. */
static int s_float_attrs(op_call *c)
{
    double defaults[OP_MAX_FLOATS];
    int n = 0;
    for (const char *p = c->def->py_floats; n < OP_MAX_FLOATS && (p = strchr(p, '='));)
        defaults[n++] = strtod(p + 1, (char **)&p);
    if (n == 0 || c->attrs.nfloats == n)
        return 0;
    if (c->attrs.nfloats != 0)
        return dt_err(DT_EINVAL, "%s: expected %d float attributes (%s), got %d", c->def->name, n, c->def->py_floats,
                      c->attrs.nfloats);
    memcpy(c->attrs.floats, defaults, sizeof(double) * (size_t)n);
    c->attrs.nfloats = n;
    return 0;
}

static int s_infer(op_call *c)
{
    const s_info *info = s_of(c);
    const char *name = c->def->name;
    op_arg *out = &c->out[0];
    /* the output shape broadcasts every tensor operand (where: condition too) */
    out->ndim = c->in[0].ndim;
    memcpy(out->shape, c->in[0].shape, sizeof out->shape);
    for (int i = 1; i < c->nin; i++) {
        int64_t shape[DT_MAX_DIMS];
        int ndim;
        if (op_broadcast(name, out->ndim, out->shape, c->in[i].ndim, c->in[i].shape, &ndim, shape) != 0)
            return DT_EINVAL;
        out->ndim = ndim;
        memcpy(out->shape, shape, sizeof shape);
    }
    if ((info->kind == S_BINARY && c->nin + c->attrs.has_scalar != 2) ||
        (info->kind == S_MASKED_FILL && (c->nin != 2 || !c->attrs.has_scalar)))
        return dt_err(DT_EINVAL, "%s: expected two operands", name);
    dt_dtype d;
    switch (info->kind) {
    case S_TO:
        if (c->attrs.nints < 1 || !dt_dtype_valid((int)c->attrs.ints[0]))
            return dt_err(DT_ETYPE, "to: unknown dtype");
        out->dtype = (dt_dtype)c->attrs.ints[0];
        return 0;
    case S_WHERE:
        if (c->in[0].dtype != DT_BOOL)
            return dt_err(DT_ETYPE, "where: expected condition to be a boolean tensor, but got a tensor with dtype %s",
                          dt_dtype_name(c->in[0].dtype));
        d = c->nin == 3 ? op_promote(c->in[1].dtype, c->in[2].dtype) : c->in[1].dtype;
        if (c->attrs.has_scalar)
            d = op_promote_scalar(d, c->attrs.scalar);
        out->dtype = d;
        return 0;
    case S_MASKED_FILL:
        if (c->in[1].dtype != DT_BOOL)
            return dt_err(DT_ETYPE, "masked_fill: expected mask to be a boolean tensor, got %s",
                          dt_dtype_name(c->in[1].dtype));
        out->dtype = c->in[0].dtype;
        if (dt_dtype_check_value(name, out->dtype, c->attrs.scalar) != 0)
            return DT_EINVAL;
        /* the mask broadcasts to the input, never the other way */
        if (out->ndim != c->in[0].ndim || memcmp(out->shape, c->in[0].shape, sizeof(int64_t) * (size_t)out->ndim))
            return dt_err(DT_EINVAL, "masked_fill: the mask must broadcast to the input's shape");
        return 0;
    case S_CLAMP:
        if (c->attrs.nints < 1 || !(c->attrs.ints[0] & 3))
            return dt_err(DT_EINVAL, "clamp: At least one of 'min' or 'max' must not be None");
        if (c->attrs.nfloats < 2)
            return dt_err(DT_EINVAL, "clamp: expected the bounds as two float attributes");
        out->dtype = c->in[0].dtype == DT_BOOL ? DT_INT64 : c->in[0].dtype;
        if (!dt_dtype_is_float(out->dtype) && c->attrs.nints > 1 && c->attrs.ints[1])
            out->dtype = DT_FLOAT32; /* a float bound promotes an integer tensor */
        /* torch converts each bound to the result's dtype: one that does not fit is an error */
        for (int b = 0; b < 2; b++) {
            if (!(c->attrs.ints[0] & (1 << b)))
                continue;
            dt_scalar v = {.is_int = false, .f = c->attrs.floats[b]};
            if (!dt_dtype_is_float(out->dtype) && c->attrs.nints >= 4)
                v = (dt_scalar){.is_int = true, .i = c->attrs.ints[2 + b]};
            if (dt_dtype_check_value(name, out->dtype, v) != 0)
                return DT_EINVAL;
        }
        return 0;
    case S_UNARY:
        if (s_float_attrs(c) != 0)
            return DT_EINVAL;
        break;
    default:
        break;
    }
    s_tensor_scalar_dtype(c, &d);
    switch (info->dtype) {
    case S_SAME:
        break;
    case S_FLOATING:
        if (!dt_dtype_is_float(d))
            d = DT_FLOAT32;
        break;
    case S_TRUE_DIV:
        if (!dt_dtype_is_float(d))
            d = DT_FLOAT32;
        break;
    case S_COMPARE:
    case S_LOGICAL:
        d = DT_BOOL;
        break;
    case S_PROMOTE:
        /* torch converts the number to the operation's dtype: one that does not fit is an error */
        if (c->attrs.has_scalar && dt_dtype_check_value(name, d, c->attrs.scalar) != 0)
            return DT_EINVAL;
        /* numpy's rule, which torch keeps: an integer tensor to a negative integer number (the
         * tensor's elements to a negative tensor exponent give op_ew_ipow's values, as torch's) */
        if (c->def->id == OP_ID_pow && c->attrs.has_scalar && !(c->attrs.nints > 0 && c->attrs.ints[0] == 1) &&
            c->attrs.scalar.is_int && c->attrs.scalar.i < 0 && !dt_dtype_is_float(c->in[0].dtype))
            return dt_err(DT_EINVAL, "pow: Integers to negative integer powers are not allowed.");
        if (d == DT_BOOL && c->def->id == OP_ID_pow)
            d = DT_INT64;
        break;
    }
    /* the kernels compute in the result's dtype here (SAME, PROMOTE): a bool one needs a bool line */
    if (d == DT_BOOL && (info->dtype == S_SAME || info->dtype == S_PROMOTE) && !(info->domain & S_D_BOOL)) {
        if (c->def->id == OP_ID_sub)
            return dt_err(DT_ETYPE, "sub: Subtraction, the `-` operator, with two bool tensors is not supported");
        return dt_err(DT_ETYPE, "%s: not supported on %s", name,
                      info->kind == S_UNARY ? "a bool tensor" : "bool tensors");
    }
    out->dtype = d;
    return 0;
}

/* ---- sharding ------------------------------------------------------------------------------- */

/* The placements input i must have for the output to have out_pl; Partial passes only where
 * allow_partial[i]. */
static void s_want_for(const op_call *c, int i, const dt_placement *out_pl, const bool *allow_partial, dt_placement *want)
{
    const op_arg *a = &c->in[i], *o = &c->out[0];
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = out_pl[m];
        want[m] = dt_replicate();
        if (p.kind == DT_SHARD) {
            int d = p.dim - (o->ndim - a->ndim);
            if (d >= 0 && a->shape[d] == o->shape[p.dim])
                want[m] = dt_shard(d);
        } else if (p.kind == DT_PARTIAL && allow_partial[i]) {
            want[m] = p;
        }
    }
}

static double s_scalar_value(dt_scalar v) { return v.is_int ? (double)v.i : v.f; }

/* Which inputs may stay Partial (with op) when the output is Partial(op). */
static bool s_partial_ok(const op_call *c, int op, bool *allow)
{
    const s_info *info = s_of(c);
    bool linear_op = op == DT_REDUCE_SUM || op == DT_REDUCE_AVG;
    for (int i = 0; i < c->nin; i++)
        allow[i] = false;
    if (!linear_op)
        return false;
    switch (info->partial) {
    case S_P_LINEAR:
        /* a cast to an integer or bool truncates each contribution: not the cast of their sum */
        if (info->kind == S_TO && !dt_dtype_is_float((dt_dtype)c->attrs.ints[0]))
            return false;
        allow[0] = true;
        return true;
    case S_P_ADD:
        /* P + P: every tensor operand a contribution; a scalar would be added n times */
        if (c->attrs.has_scalar)
            return false;
        for (int i = 0; i < c->nin; i++)
            allow[i] = true;
        return true;
    case S_P_MUL:
        /* one factor Partial, the other Replicate (or a number); times an infinite number, a zero
         * contribution would be nan where the whole is infinite: reduced first */
        allow[0] = !c->attrs.has_scalar || isfinite(s_scalar_value(c->attrs.scalar));
        return allow[0];
    case S_P_DIV:
        /* only a Partial numerator; over the number 0, a zero contribution would be nan where the
         * whole is infinite: reduced first (a replicated denominator is not looked into) */
        allow[0] = !(c->attrs.nints > 0 && c->attrs.ints[0]) &&
                   !(c->attrs.has_scalar && s_scalar_value(c->attrs.scalar) == 0);
        return allow[0];
    default:
        return false;
    }
}

/* Whether every input that stays Partial (allow) already has exactly p on mesh dim m: a
 * Partial output counts each device's result once, so a replicated or sharded operand (or one
 * with another reduce op) cannot pass as a contribution; it is reduced or replicated instead. */
static bool s_partial_all(const op_call *c, int m, dt_placement p, const bool *allow)
{
    for (int i = 0; i < c->nin; i++)
        if (allow[i] && (c->in[i].pl[m].kind != DT_PARTIAL || c->in[i].pl[m].reduce_op != p.reduce_op))
            return false;
    return true;
}

/* Output placements that follow input k: its shards mapped into output dims, its Partial where
 * the op lets Partial through, Replicate elsewhere. */
static void s_follow(const op_call *c, int k, dt_placement *out_pl, bool *allow)
{
    const op_arg *a = &c->in[k], *o = &c->out[0];
    for (int i = 0; i < c->nin; i++)
        allow[i] = false;
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = a->pl[m];
        out_pl[m] = dt_replicate();
        if (p.kind == DT_SHARD && a->shape[p.dim] == o->shape[p.dim + (o->ndim - a->ndim)])
            out_pl[m] = dt_shard(p.dim + (o->ndim - a->ndim));
        else if (p.kind == DT_PARTIAL) {
            bool mine[OP_MAX_INPUTS];
            if (s_partial_ok(c, p.reduce_op, mine) && mine[k] && s_partial_all(c, m, p, mine)) {
                out_pl[m] = p;
                for (int i = 0; i < c->nin; i++)
                    allow[i] = allow[i] || mine[i];
            }
        }
    }
}

/* The common case: operands of the output's shape laid out alike, none Partial. */
static bool s_plain(const op_call *c)
{
    const op_arg *o = &c->out[0];
    for (int m = 0; m < c->mesh_ndim; m++)
        if (c->in[0].pl[m].kind == DT_PARTIAL)
            return false;
    for (int i = 0; i < c->nin; i++)
        if (c->in[i].ndim != o->ndim || memcmp(c->in[i].shape, o->shape, sizeof(int64_t) * (size_t)o->ndim) ||
            !op_same_placements(c->in[i].pl, c->in[0].pl, c->mesh_ndim))
            return false;
    return true;
}

static int s_shard(op_call *c)
{
    if (s_plain(c)) {
        /* nothing moves; every input already has what it needs (want defaults to its own) */
        memcpy(c->out[0].pl, c->in[0].pl, sizeof c->out[0].pl);
        return 0;
    }
    dt_placement best_out[DT_MAX_DIMS], out_pl[DT_MAX_DIMS], want[OP_MAX_INPUTS][DT_MAX_DIMS];
    int64_t best = -1;
    /* candidates: follow input 0, 1, ..., then all Replicate; the first of the cheapest wins */
    for (int k = 0; k <= c->nin; k++) {
        bool allow[OP_MAX_INPUTS] = {false};
        if (k < c->nin)
            s_follow(c, k, out_pl, allow);
        else
            op_replicate_all(out_pl, c->mesh_ndim);
        int64_t cost = 0;
        for (int i = 0; i < c->nin; i++) {
            s_want_for(c, i, out_pl, allow, want[i]);
            int64_t step = op_cost(c, i, want[i]);
            cost = step == INT64_MAX || cost == INT64_MAX ? INT64_MAX : cost + step;
        }
        if (best < 0 || cost < best) {
            best = cost;
            memcpy(best_out, out_pl, sizeof best_out);
            memcpy(c->want, want, sizeof(dt_placement) * DT_MAX_DIMS * (size_t)c->nin);
        }
        if (best == 0)
            break;
    }
    memcpy(c->out[0].pl, best_out, sizeof best_out);
    /* a Partial output of a Partial(max/min)-free linear op keeps the reduce op of its inputs */
    return 0;
}

/* COMPARE rows, ctx[0]: the dtype the operands are compared in (their promotion). */
static int s_local_compare(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    dt_dtype d;
    s_tensor_scalar_dtype(c, &d);
    ctx[0] = d;
    return 1;
}

/* ---- what every backend's kernels share -------------------------------------------------------- */

const char *op_clamp_bounds(const op_kernel *k, dt_dtype cd, double *bounds)
{
    const op_attrs *a = k->attrs;
    if (k->nin != 1 || a->nints < 1 || a->nfloats < 2)
        return "clamp: bad operands (internal error)";
    bool has[2] = {(a->ints[0] & 1) != 0, (a->ints[0] & 2) != 0};
    if (dt_dtype_is_float(cd)) {
        bounds[0] = has[0] ? a->floats[0] : -INFINITY;
        bounds[1] = has[1] ? a->floats[1] : INFINITY;
        return NULL;
    }
    int64_t ib[2] = {INT64_MIN, INT64_MAX};
    for (int b = 0; b < 2; b++)
        if (has[b])
            ib[b] = a->nints >= 4 ? a->ints[2 + b] : op_ew_f2i64(a->floats[b]);
    memcpy(bounds, ib, sizeof ib);
    return NULL;
}

/* ---- the rows of OP_POINTWISE ---------------------------------------------------------------- */

#define S_NIN_UNARY 1
#define S_NIN_BINARY (-1)
#define S_NIN_WHERE (-1)
#define S_NIN_MASKED_FILL 2
#define S_NIN_CLAMP 1
#define S_NIN_TO 1
#define S_SIG_UNARY DT_SIG_UNARY
#define S_SIG_BINARY DT_SIG_BINARY
#define S_SIG_WHERE DT_SIG_NONE
#define S_SIG_MASKED_FILL DT_SIG_NONE
#define S_SIG_CLAMP DT_SIG_NONE
#define S_SIG_TO DT_SIG_NONE
#define S_LOCAL_SAME NULL
#define S_LOCAL_FLOATING NULL
#define S_LOCAL_PROMOTE NULL
#define S_LOCAL_TRUE_DIV NULL
#define S_LOCAL_COMPARE s_local_compare
#define S_LOCAL_LOGICAL NULL

#define S_DEF(op, num, kind, dtype, domain, partial, exports, py_op, floats)                                       \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = S_NIN_##kind, .nout = 1, .infer = s_infer,      \
                                .shard = s_shard, .local = S_LOCAL_##dtype,                                       \
                                .py_sig = (exports) ? S_SIG_##kind : DT_SIG_NONE, .py_exports = exports,          \
                                .py_operator = py_op, .py_floats = floats, .infer_local = true};
OP_POINTWISE(S_DEF)
#undef S_DEF
