/* op_write — writes into an existing DTensor, in place: the KV cache's per-step update.
 *
 *   slice_assign_(dst, src; attrs.ints = [dim, start]): dst[..., start:start+n, ...] = src along
 *   dim, with src of dst's shape except n on dim and of dst's dtype (the caller converts).
 *
 * The output is dst itself (op_def.inplace): same id, shape, dtype and placements, so dst's
 * placements never move (a Partial dst is refused). src follows dst's shards on the other dims
 * (equal sizes there, so equal torch.chunk pieces) and is replicated along a mesh dim that
 * shards dim, where each device writes the part of the region that falls in its piece.
 *
 * Ordering: a device runs its records in order, and a worker writes in place only into storage
 * nobody else holds; a fetch or a redistribute issued before the write holds the old storage,
 * so the worker copies it first and they see the old value (act_worker.c, copy on write).
 * The kernel is ops/cpu/cpu_write.c. */
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

static int s_infer(op_call *c)
{
    const op_arg *dst = &c->in[0], *src = &c->in[1];
    if (c->attrs.nints != 2)
        return dt_err(DT_EINVAL, "slice_assign_: expected dim and start");
    int dim;
    if (op_dim("slice_assign_", c->attrs.ints[0], dst->ndim, &dim) != 0)
        return DT_EINDEX;
    int64_t start = c->attrs.ints[1];
    if (src->dtype != dst->dtype)
        return dt_err(DT_ETYPE, "slice_assign_: src is %s but dst is %s", dt_dtype_name(src->dtype),
                      dt_dtype_name(dst->dtype));
    bool fits = src->ndim == dst->ndim && start >= 0 && start + src->shape[dim] <= dst->shape[dim];
    for (int d = 0; fits && d < dst->ndim; d++)
        fits = d == dim || src->shape[d] == dst->shape[d];
    if (!fits)
        return dt_err(DT_EINVAL, "slice_assign_: a src of %d dims with size %lld on dim %d does not fit at %lld "
                      "in a dst of %d dims with size %lld there (other sizes must match)", src->ndim,
                      (long long)(src->ndim > dim ? src->shape[dim] : 0), dim, (long long)start, dst->ndim,
                      (long long)dst->shape[dim]);
    c->attrs.ints[0] = dim;
    c->nout = 1;
    c->out[0] = *dst;
    return 0;
}

static int s_shard(op_call *c)
{
    const op_arg *dst = &c->in[0];
    int dim = (int)c->attrs.ints[0];
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = dst->pl[m];
        if (p.kind == DT_PARTIAL)
            return dt_err(DT_EUNSUPPORTED, "slice_assign_: cannot write into a Partial DTensor in place "
                          "(redistribute it to Replicate or Shard first)");
        c->want[0][m] = p;
        c->want[1][m] = p.kind == DT_SHARD && p.dim == dim ? dt_replicate() : p;
        c->out[0].pl[m] = p;
    }
    return 0;
}

/* ctx[0]: where this device's piece of dst starts along dim. */
static int s_local(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    const op_arg *dst = &c->in[0];
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, dst->pl, dst->ndim, dst->shape, local, offset);
    ctx[0] = offset[c->attrs.ints[0]];
    return 1;
}

#define S_DEF(op, num, inputs)                                                                                     \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = inputs, .nout = 1, .infer = s_infer,                 \
                                .shard = s_shard, .local = s_local, .inplace = true};
OP_WRITE(S_DEF)
#undef S_DEF
