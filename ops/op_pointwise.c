/* op_pointwise — elementwise ops: unary math, binary arithmetic and comparisons with numpy/torch
 * broadcasting and Python scalars, where, masked_fill, clamp and dtype conversion.
 *
 * Sharding: the output follows one input's shards (mapped through broadcasting) or is
 * Replicate, whichever moves the fewest bytes; a broadcast dim of an input is Replicate there.
 * Partial passes through the linear cases (neg and casts; sum of two Partials; a Partial times a
 * replicated value or a number; a Partial numerator over a replicated denominator) and is
 * reduced first everywhere else. */
#include <stdlib.h>
#include <string.h>

#include "cpu_pointwise.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

typedef enum { S_UNARY, S_BINARY, S_WHERE, S_MASKED_FILL, S_CLAMP, S_TO } s_kind;

/* How an op treats its dtype. */
typedef enum {
    S_SAME,     /* the input's; refused for bool */
    S_FLOATING, /* the input's when floating, else float32 */
    S_PROMOTE,  /* torch's promotion of the operands */
    S_TRUE_DIV, /* promotion, then float32 if not floating */
    S_COMPARE,  /* bool, computed in the operands' promotion */
    S_LOGICAL,  /* bool */
} s_dtype_rule;

/* How a Partial input may pass through. */
typedef enum { S_P_NONE, S_P_LINEAR, S_P_ADD, S_P_MUL, S_P_DIV } s_partial_rule;

typedef struct {
    s_kind kind;
    int cpu;                  /* cpu_unary or cpu_binary */
    s_dtype_rule dtype;
    s_partial_rule partial;
} s_info;

static const s_info s_infos[];

static const s_info *s_of(const op_call *c) { return &s_infos[c->def->code]; }

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
        /* the mask broadcasts to the input, never the other way */
        if (out->ndim != c->in[0].ndim || memcmp(out->shape, c->in[0].shape, sizeof(int64_t) * (size_t)out->ndim))
            return dt_err(DT_EINVAL, "masked_fill: the mask must broadcast to the input's shape");
        return 0;
    case S_CLAMP:
        if (c->attrs.nints < 1 || !(c->attrs.ints[0] & 3))
            return dt_err(DT_EINVAL, "clamp: At least one of 'min' or 'max' must not be None");
        out->dtype = c->in[0].dtype == DT_BOOL ? DT_INT64 : c->in[0].dtype;
        if (!dt_dtype_is_float(out->dtype) && c->attrs.nints > 1 && c->attrs.ints[1])
            out->dtype = DT_FLOAT32; /* a float bound promotes an integer tensor */
        return 0;
    default:
        break;
    }
    s_tensor_scalar_dtype(c, &d);
    switch (info->dtype) {
    case S_SAME:
        if (d == DT_BOOL && (info->cpu == CPU_NEG || info->cpu == CPU_ABS || info->cpu == CPU_RELU))
            return dt_err(DT_ETYPE, "%s: not supported on a bool tensor", name);
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
        if (d == DT_BOOL && info->cpu == CPU_SUB)
            return dt_err(DT_ETYPE, "sub: Subtraction, the `-` operator, with two bool tensors is not supported");
        if (d == DT_BOOL && info->cpu == CPU_POW)
            d = DT_INT64;
        break;
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
        allow[0] = true; /* one factor Partial, the other Replicate (or a number) */
        return true;
    case S_P_DIV:
        allow[0] = !(c->attrs.nints > 0 && c->attrs.ints[0]); /* only a Partial numerator */
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

/* ---- kernels -------------------------------------------------------------------------------- */

static cpu_ctype s_ctype(dt_dtype d) { return dt_dtype_is_float(d) ? CPU_F32 : d == DT_BOOL ? CPU_U8 : CPU_I64; }

/* An operand as n contiguous elements of t broadcast to the output's local shape: the piece
 * itself when it already is one, else a scratch copy (*scratch is set and must be freed). */
static const void *s_operand(const op_local *in, const op_local *out, cpu_ctype t, void **scratch)
{
    int64_t n_out = dt_layout_numel(out->ndim, out->shape), n_in = dt_layout_numel(in->ndim, in->shape);
    bool same_shape = n_in == n_out && in->ndim <= out->ndim;
    /* the piece's own bytes serve only when its dtype is t's (int32 is not int64, nor bf16 f32) */
    bool native = (t == CPU_F32 && in->dtype == DT_FLOAT32) || (t == CPU_I64 && in->dtype == DT_INT64) ||
                  (t == CPU_U8 && in->dtype == DT_BOOL);
    *scratch = NULL;
    if (same_shape && native)
        return in->data;
    size_t elem = cpu_ctype_size(t);
    char *converted = malloc((size_t)(n_in ? n_in : 1) * elem), *expanded = NULL;
    if (!converted)
        return NULL;
    cpu_to_ctype(converted, t, in->data, in->dtype, n_in);
    if (same_shape) {
        *scratch = converted;
        return converted;
    }
    if (!(expanded = malloc((size_t)(n_out ? n_out : 1) * elem))) {
        free(converted);
        return NULL;
    }
    cpu_broadcast(expanded, out->ndim, out->shape, converted, in->ndim, in->shape, elem);
    free(converted);
    *scratch = expanded;
    return expanded;
}

/* A number as n elements of t. */
static void *s_splat(dt_scalar v, cpu_ctype t, int64_t n)
{
    size_t elem = cpu_ctype_size(t);
    char *buf = malloc((size_t)(n ? n : 1) * elem);
    if (!buf)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        if (t == CPU_F32)
            ((float *)buf)[i] = (float)(v.is_int ? (double)v.i : v.f);
        else if (t == CPU_I64)
            ((int64_t *)buf)[i] = v.is_int ? v.i : (int64_t)v.f;
        else
            buf[i] = v.is_int ? v.i != 0 : v.f != 0;
    }
    return buf;
}

/* Runs fn over the compute-type operands and writes the output, converting when needed. */
static const char *s_finish(op_kernel *k, cpu_ctype result, void *buf)
{
    op_local *out = &k->out[0];
    cpu_from_ctype(out->data, out->dtype, buf, result, dt_layout_numel(out->ndim, out->shape));
    return NULL;
}

static const char *s_unary(op_kernel *k, const s_info *info)
{
    op_local *out = &k->out[0];
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    cpu_ctype t = info->cpu == CPU_LOGICAL_NOT ? CPU_U8 : s_ctype(out->dtype);
    void *scratch, *res = malloc((size_t)(n ? n : 1) * cpu_ctype_size(t));
    const void *a = s_operand(&k->in[0], out, t, &scratch);
    const char *why = a && res ? NULL : "out of memory on the device";
    if (!why) {
        cpu_unary_run((cpu_unary)info->cpu, t, res, a, n);
        s_finish(k, t, res);
    }
    free(scratch);
    free(res);
    return why;
}

static const char *s_binary(op_kernel *k, const s_info *info)
{
    op_local *out = &k->out[0];
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    dt_dtype operands = k->in[0].dtype;
    for (int i = 1; i < k->nin; i++)
        operands = op_promote(operands, k->in[i].dtype);
    if (k->attrs->has_scalar)
        operands = op_promote_scalar(operands, k->attrs->scalar);
    bool compare = info->dtype == S_COMPARE || info->dtype == S_LOGICAL;
    cpu_ctype t = compare ? s_ctype(operands) : s_ctype(out->dtype);
    if (info->cpu == CPU_DIV || (info->cpu == CPU_POW && dt_dtype_is_float(out->dtype)))
        t = CPU_F32;
    cpu_ctype result = compare ? CPU_U8 : t;
    void *sa = NULL, *sb = NULL, *res = malloc((size_t)(n ? n : 1) * cpu_ctype_size(result));
    const void *a, *b;
    bool reversed = k->attrs->nints > 0 && k->attrs->ints[0]; /* number op tensor */
    if (k->nin == 2) {
        a = s_operand(&k->in[0], out, t, &sa);
        b = s_operand(&k->in[1], out, t, &sb);
    } else {
        const void *x = s_operand(&k->in[0], out, t, &sa);
        void *y = sb = s_splat(k->attrs->scalar, t, n);
        a = reversed ? y : x;
        b = reversed ? x : y;
    }
    const char *why = a && b && res ? NULL : "out of memory on the device";
    if (!why) {
        cpu_binary_run((cpu_binary)info->cpu, t, res, a, b, n);
        s_finish(k, result, res);
    }
    free(sa);
    free(sb);
    free(res);
    return why;
}

/* where(cond, a, b) with a number in place of b (ints[0] = 2) or a (ints[0] = 1);
 * masked_fill(x, mask, number) is where(mask, number, x). */
static const char *s_select(op_kernel *k, const s_info *info)
{
    op_local *out = &k->out[0];
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    cpu_ctype t = s_ctype(out->dtype);
    size_t elem = cpu_ctype_size(t);
    void *sc = NULL, *sa = NULL, *sb = NULL, *res = malloc((size_t)(n ? n : 1) * elem);
    const void *cond, *a, *b;
    if (info->kind == S_MASKED_FILL) {
        cond = s_operand(&k->in[1], out, CPU_U8, &sc);
        a = sa = s_splat(k->attrs->scalar, t, n);
        b = s_operand(&k->in[0], out, t, &sb);
    } else {
        cond = s_operand(&k->in[0], out, CPU_U8, &sc);
        int scalar_at = k->attrs->has_scalar ? (k->attrs->nints > 0 ? (int)k->attrs->ints[0] : 2) : 0;
        if (scalar_at == 1) {
            a = sa = s_splat(k->attrs->scalar, t, n);
            b = s_operand(&k->in[1], out, t, &sb);
        } else {
            a = s_operand(&k->in[1], out, t, &sa);
            b = scalar_at == 2 ? (sb = s_splat(k->attrs->scalar, t, n)) : s_operand(&k->in[2], out, t, &sb);
        }
    }
    const char *why = cond && a && b && res ? NULL : "out of memory on the device";
    if (!why) {
        const uint8_t *m = cond;
        for (int64_t i = 0; i < n; i++)
            memcpy((char *)res + i * (int64_t)elem, (const char *)(m[i] ? a : b) + i * (int64_t)elem, elem);
        s_finish(k, t, res);
    }
    free(sc);
    free(sa);
    free(sb);
    free(res);
    return why;
}

/* clamp(x, min, max): ints[0] bit 0 = has min, bit 1 = has max; floats[0] = min, floats[1] = max. */
static const char *s_clamp(op_kernel *k, const s_info *info)
{
    op_local *out = &k->out[0];
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    cpu_ctype t = s_ctype(out->dtype);
    void *scratch, *res = malloc((size_t)(n ? n : 1) * cpu_ctype_size(t));
    const void *a = s_operand(&k->in[0], out, t, &scratch);
    if (!a || !res) {
        free(scratch);
        free(res);
        return "out of memory on the device";
    }
    bool lo = k->attrs->ints[0] & 1, hi = k->attrs->ints[0] & 2;
    double fmin = k->attrs->floats[0], fmax = k->attrs->floats[1];
    if (t == CPU_F32) {
        const float *x = a;
        float *y = res;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            if (lo && v < (float)fmin)
                v = (float)fmin;
            if (hi && v > (float)fmax)
                v = (float)fmax;
            y[i] = v;
        }
    } else {
        const int64_t *x = a;
        int64_t *y = res;
        for (int64_t i = 0; i < n; i++) {
            int64_t v = x[i];
            if (lo && (double)v < fmin)
                v = (int64_t)fmin;
            if (hi && (double)v > fmax)
                v = (int64_t)fmax;
            y[i] = v;
        }
    }
    s_finish(k, t, res);
    free(scratch);
    free(res);
    return NULL;
}

static const char *s_cpu(op_kernel *k)
{
    const s_info *info = &s_infos[k->def->code];
    switch (info->kind) {
    case S_UNARY:
        return s_unary(k, info);
    case S_TO: {
        op_local *out = &k->out[0];
        int64_t n = dt_layout_numel(out->ndim, out->shape);
        cpu_ctype t = s_ctype(k->in[0].dtype);
        void *buf = malloc((size_t)(n ? n : 1) * cpu_ctype_size(t));
        if (!buf)
            return "out of memory on the device";
        cpu_to_ctype(buf, t, k->in[0].data, k->in[0].dtype, n);
        cpu_from_ctype(out->data, out->dtype, buf, t, n);
        free(buf);
        return NULL;
    }
    case S_BINARY:
        return s_binary(k, info);
    case S_WHERE:
    case S_MASKED_FILL:
        return s_select(k, info);
    case S_CLAMP:
        return s_clamp(k, info);
    }
    return "unknown pointwise op";
}

/* ---- the table -------------------------------------------------------------------------------
 * Binary ops take two tensors, or one tensor and attrs.scalar (ints[0] = 1: the number is on
 * the left, as in 2 - x). to: ints[0] = dtype. gelu: variant gelu_tanh for approximate="tanh". */
static const s_info s_infos[] = {
#define S_U(cpu, dtype, partial) {S_UNARY, cpu, dtype, partial}
#define S_B(cpu, dtype, partial) {S_BINARY, cpu, dtype, partial}
    S_U(CPU_NEG, S_SAME, S_P_LINEAR),          S_U(CPU_ABS, S_SAME, S_P_NONE),
    S_U(CPU_EXP, S_FLOATING, S_P_NONE),        S_U(CPU_LOG, S_FLOATING, S_P_NONE),
    S_U(CPU_SQRT, S_FLOATING, S_P_NONE),       S_U(CPU_RSQRT, S_FLOATING, S_P_NONE),
    S_U(CPU_SIN, S_FLOATING, S_P_NONE),        S_U(CPU_COS, S_FLOATING, S_P_NONE),
    S_U(CPU_TANH, S_FLOATING, S_P_NONE),       S_U(CPU_SIGMOID, S_FLOATING, S_P_NONE),
    S_U(CPU_RELU, S_SAME, S_P_NONE),           S_U(CPU_SILU, S_FLOATING, S_P_NONE),
    S_U(CPU_GELU, S_FLOATING, S_P_NONE),       S_U(CPU_GELU_TANH, S_FLOATING, S_P_NONE),
    S_U(CPU_RECIPROCAL, S_FLOATING, S_P_NONE), S_U(CPU_LOGICAL_NOT, S_LOGICAL, S_P_NONE),
    {S_TO, CPU_COPY, S_SAME, S_P_LINEAR},
    S_B(CPU_ADD, S_PROMOTE, S_P_ADD),          S_B(CPU_SUB, S_PROMOTE, S_P_ADD),
    S_B(CPU_MUL, S_PROMOTE, S_P_MUL),          S_B(CPU_DIV, S_TRUE_DIV, S_P_DIV),
    S_B(CPU_POW, S_PROMOTE, S_P_NONE),         S_B(CPU_MAXIMUM, S_PROMOTE, S_P_NONE),
    S_B(CPU_MINIMUM, S_PROMOTE, S_P_NONE),     S_B(CPU_EQ, S_COMPARE, S_P_NONE),
    S_B(CPU_NE, S_COMPARE, S_P_NONE),          S_B(CPU_LT, S_COMPARE, S_P_NONE),
    S_B(CPU_LE, S_COMPARE, S_P_NONE),          S_B(CPU_GT, S_COMPARE, S_P_NONE),
    S_B(CPU_GE, S_COMPARE, S_P_NONE),          S_B(CPU_LOGICAL_AND, S_LOGICAL, S_P_NONE),
    S_B(CPU_LOGICAL_OR, S_LOGICAL, S_P_NONE),
    {S_WHERE, 0, S_PROMOTE, S_P_NONE},         {S_MASKED_FILL, 0, S_SAME, S_P_NONE},
    {S_CLAMP, 0, S_SAME, S_P_NONE},
#undef S_U
#undef S_B
};

#define S_OP(name, code, nin) {name, code, nin, 1, s_infer, s_shard, NULL, s_cpu}
const op_def op_pointwise_ops[] = {
    S_OP("neg", 0, 1),         S_OP("abs", 1, 1),          S_OP("exp", 2, 1),          S_OP("log", 3, 1),
    S_OP("sqrt", 4, 1),        S_OP("rsqrt", 5, 1),        S_OP("sin", 6, 1),          S_OP("cos", 7, 1),
    S_OP("tanh", 8, 1),        S_OP("sigmoid", 9, 1),      S_OP("relu", 10, 1),        S_OP("silu", 11, 1),
    S_OP("gelu", 12, 1),       S_OP("gelu_tanh", 13, 1),   S_OP("reciprocal", 14, 1),  S_OP("logical_not", 15, 1),
    S_OP("to", 16, 1),
    S_OP("add", 17, -1),       S_OP("sub", 18, -1),        S_OP("mul", 19, -1),        S_OP("div", 20, -1),
    S_OP("pow", 21, -1),       S_OP("maximum", 22, -1),    S_OP("minimum", 23, -1),    S_OP("eq", 24, -1),
    S_OP("ne", 25, -1),        S_OP("lt", 26, -1),         S_OP("le", 27, -1),         S_OP("gt", 28, -1),
    S_OP("ge", 29, -1),        S_OP("logical_and", 30, -1), S_OP("logical_or", 31, -1),
    S_OP("where", 32, -1),     S_OP("masked_fill", 33, 2), S_OP("clamp", 34, 1),
};
#undef S_OP
const int op_pointwise_count = (int)(sizeof op_pointwise_ops / sizeof op_pointwise_ops[0]);
