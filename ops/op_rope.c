/* op_rope — rotary position embedding fused into one op, as Llama applies it to q and k:
 * rope(x (B, H, S, D), positions (B or 1, S) int64, inv_freq (D/2,) float32, attrs.floats[0] =
 * scaling) = x * cos + rotate_half(x) * sin with the angles positions * inv_freq; the kernel is
 * ops/cpu/cpu_rope.c.
 *
 * Sharding: the output follows x on the batch, head and position dims; the head dim D must be
 * whole on each device (a Shard of it is gathered). positions follow x's batch and position
 * shards (they have the same sizes, so the same torch.chunk pieces) and inv_freq is replicated.
 * rope is linear in x, so a Partial(sum/avg) x passes through. */
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "op_registry.h"

static int s_infer(op_call *c)
{
    const op_arg *x = &c->in[0], *pos = &c->in[1], *freq = &c->in[2];
    if (x->ndim != 4)
        return dt_err(DT_EINVAL, "rope: x must be (batch, heads, seq, head_dim), got %d dims", x->ndim);
    if (x->shape[3] % 2 != 0)
        return dt_err(DT_EINVAL, "rope: head_dim must be even, got %lld", (long long)x->shape[3]);
    if (!dt_dtype_is_float(x->dtype))
        return dt_err(DT_ETYPE, "rope: x must be floating, got %s", dt_dtype_name(x->dtype));
    if (pos->ndim != 2 || (pos->shape[0] != 1 && pos->shape[0] != x->shape[0]) || pos->shape[1] != x->shape[2])
        return dt_err(DT_EINVAL, "rope: positions must be (1 or %lld, %lld)", (long long)x->shape[0],
                      (long long)x->shape[2]);
    if (pos->dtype != DT_INT64)
        return dt_err(DT_ETYPE, "rope: positions must be int64, got %s", dt_dtype_name(pos->dtype));
    if (freq->ndim != 1 || freq->shape[0] != x->shape[3] / 2 || freq->dtype != DT_FLOAT32)
        return dt_err(DT_EINVAL, "rope: inv_freq must be float32 of shape (%lld,)", (long long)(x->shape[3] / 2));
    if (c->attrs.nfloats != 1)
        return dt_err(DT_EINVAL, "rope: expected the scaling factor");
    c->nout = 1;
    c->out[0] = *x;
    return 0;
}

static int s_shard(op_call *c)
{
    const op_arg *x = &c->in[0], *pos = &c->in[1];
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = x->pl[m], want_pos = dt_replicate();
        if (p.kind == DT_SHARD && p.dim == 3)
            p = dt_replicate();
        if (p.kind == DT_PARTIAL && p.reduce_op != DT_REDUCE_SUM && p.reduce_op != DT_REDUCE_AVG)
            p = dt_replicate();
        if (p.kind == DT_SHARD && p.dim == 2)
            want_pos = dt_shard(1);
        else if (p.kind == DT_SHARD && p.dim == 0 && pos->shape[0] != 1)
            want_pos = dt_shard(0);
        c->want[0][m] = p;
        c->want[1][m] = want_pos;
        c->want[2][m] = dt_replicate();
        c->out[0].pl[m] = p;
    }
    return 0;
}

const char *op_rope_local(const op_kernel *k)
{
    const op_local *x = &k->in[0], *pos = &k->in[1], *freq = &k->in[2], *out = &k->out[0];
    if (k->nin != 3 || k->nout != 1 || k->attrs->nfloats < 1 || x->ndim != 4 || !dt_dtype_is_float(x->dtype) ||
        out->dtype != x->dtype || out->ndim != 4 || memcmp(out->shape, x->shape, sizeof *x->shape * 4) ||
        pos->ndim != 2 || pos->dtype != DT_INT64 || pos->shape[1] != x->shape[2] ||
        (pos->shape[0] != 1 && pos->shape[0] != x->shape[0]) || freq->ndim != 1 || freq->dtype != DT_FLOAT32 ||
        freq->shape[0] != x->shape[3] / 2)
        return "rope: the local pieces of the operands do not fit together";
    return NULL;
}

#define S_DEF(op, num, inputs)                                                                                     \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = inputs, .nout = 1, .infer = s_infer, .shard = s_shard};
OP_ROPE(S_DEF)
#undef S_DEF
