/* op_write — writes into an existing DTensor, in place: the KV cache's per-step update.
 *
 *   slice_assign_(dst, src; attrs.ints = [dim, start]): dst[..., start:start+n, ...] = src along
 *   dim, with src of dst's shape except n on dim and of dst's dtype (the caller converts).
 *   shard_assign_(dst, src; attrs.ints = [dim, offset]): a write by pieces. Where dst is split on
 *   dim, src is split there alike and each device writes its own piece of src at `offset` along
 *   dim of its piece of dst; elsewhere it is slice_assign_ at `offset`. The value depends on both
 *   layouts (it is defined by them, as torch's local_map), and no byte crosses devices: a
 *   sequence-split block of keys goes into a cache laid out per device (the ring's).
 *   index_copy_(dst, index, src; attrs.ints = [dim]): dst[..., index[i], ...] = src[..., i, ...],
 *   torch's index_copy_, with the positions on the devices (a captured decode step writes its
 *   keys where the step's position says). dst may not be split on dim; index is replicated.
 *
 * The output is dst itself (op_def.inplace): same id, shape, dtype and placements, so dst's
 * placements never move (a Partial dst is refused). src follows dst's shards on the other dims
 * (equal sizes there, so equal torch.chunk pieces) and is replicated along a mesh dim that
 * shards dim, where each device writes the part of the region that falls in its piece.
 *
 * Ordering: a device runs its records in order, and a worker writes in place only into storage
 * nobody else holds; a fetch or a redistribute issued before the write holds the old storage,
 * so the worker copies it first and they see the old value (actors/worker/act_worker_ops.c, copy on write).
 * The kernel is ops/cpu/cpu_write.c. */
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

static int s_infer(op_call *c)
{
    const char *name = c->def->name;
    const op_arg *dst = &c->in[0], *src = &c->in[1];
    if (c->attrs.nints != 2)
        return dt_err(DT_EINVAL, "%s: expected dim and start", name);
    int dim;
    if (op_dim(name, c->attrs.ints[0], dst->ndim, &dim) != 0)
        return DT_EINDEX;
    int64_t start = c->attrs.ints[1];
    if (src->dtype != dst->dtype)
        return dt_err(DT_ETYPE, "%s: src is %s but dst is %s", name, dt_dtype_name(src->dtype),
                      dt_dtype_name(dst->dtype));
    /* shard_assign_'s start is within each piece: the pieces are checked when the layouts are known */
    int64_t global_start = c->def->id == OP_ID_shard_assign_ ? 0 : start;
    bool fits = src->ndim == dst->ndim && start >= 0 && global_start + src->shape[dim] <= dst->shape[dim];
    for (int d = 0; fits && d < dst->ndim; d++)
        fits = d == dim || src->shape[d] == dst->shape[d];
    if (!fits)
        return dt_err(DT_EINVAL, "%s: a src of %d dims with size %lld on dim %d does not fit at %lld "
                      "in a dst of %d dims with size %lld there (other sizes must match)", name, src->ndim,
                      (long long)(src->ndim > dim ? src->shape[dim] : 0), dim, (long long)start, dst->ndim,
                      (long long)dst->shape[dim]);
    c->attrs.ints[0] = dim;
    c->nout = 1;
    c->out[0] = *dst;
    return 0;
}

/* dst keeps its placements; src follows them, except along a mesh dim that splits dim, where it is
 * `split_src` (Replicate: every device picks its part of the region; Shard(dim): its own piece). */
static int s_shard_as(op_call *c, dt_placement split_src)
{
    const op_arg *dst = &c->in[0];
    int dim = (int)c->attrs.ints[0];
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = dst->pl[m];
        if (p.kind == DT_PARTIAL)
            return dt_err(DT_EUNSUPPORTED, "%s: cannot write into a Partial DTensor in place "
                          "(redistribute it to Replicate or Shard first)", c->def->name);
        c->want[0][m] = p;
        c->want[1][m] = p.kind == DT_SHARD && p.dim == dim ? split_src : p;
        c->out[0].pl[m] = p;
    }
    return 0;
}

static int s_shard_slice(op_call *c) { return s_shard_as(c, dt_replicate()); }

/* Every device's piece of src must fit at the offset in its piece of dst: checked here, on the
 * user's thread, so a bad write fails at the call and not on a device. */
static int s_shard_pieces(op_call *c)
{
    int dim = (int)c->attrs.ints[0];
    int rc = s_shard_as(c, dt_shard(dim));
    if (rc != 0)
        return rc;
    const op_arg *dst = &c->in[0], *src = &c->in[1];
    int64_t size = 1, coord[DT_MAX_DIMS], dl[DT_MAX_DIMS], sl[DT_MAX_DIMS], off[DT_MAX_DIMS];
    for (int m = 0; m < c->mesh_ndim; m++)
        size *= c->mesh_shape[m];
    for (int64_t d = 0; d < size; d++) {
        dt_layout_coord(c->mesh_ndim, c->mesh_shape, d, coord);
        dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[0], dst->ndim, dst->shape, dl, off);
        dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, c->want[1], src->ndim, src->shape, sl, off);
        if (c->attrs.ints[1] + sl[dim] > dl[dim])
            return dt_err(DT_EINVAL, "shard_assign_: device %lld of the mesh holds %lld of src's positions on dim %d; "
                          "they do not fit at %lld in its piece of dst of %lld", (long long)d, (long long)sl[dim],
                          dim, (long long)c->attrs.ints[1], (long long)dl[dim]);
    }
    return 0;
}

/* ctx[0]: where this device's piece of dst starts along dim (the region's start is global). */
static int s_local_slice(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    const op_arg *dst = &c->in[0];
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    dt_layout_block(c->mesh_ndim, c->mesh_shape, coord, dst->pl, dst->ndim, dst->shape, local, offset);
    ctx[0] = offset[c->attrs.ints[0]];
    return 1;
}

/* ctx[0] = 0: the start is within the piece, so the same kernel writes src's piece there. */
static int s_local_pieces(const op_call *c, const int64_t *coord, int64_t *ctx)
{
    const op_arg *dst = &c->in[0];
    int dim = (int)c->attrs.ints[0];
    for (int m = 0; m < c->mesh_ndim; m++)
        if (dst->pl[m].kind == DT_SHARD && dst->pl[m].dim == dim)
            return ctx[0] = 0, 1;
    return s_local_slice(c, coord, ctx);
}

static int s_infer_index(op_call *c)
{
    const char *name = c->def->name;
    const op_arg *dst = &c->in[0], *index = &c->in[1], *src = &c->in[2];
    if (c->attrs.nints != 1)
        return dt_err(DT_EINVAL, "%s: expected dim", name);
    int dim;
    if (op_dim(name, c->attrs.ints[0], dst->ndim, &dim) != 0)
        return DT_EINDEX;
    if (index->dtype != DT_INT64 || index->ndim > 1)
        return dt_err(DT_EINVAL, "%s(): index must be a 1-D int64 tensor, got a %d-D %s one", name, index->ndim,
                      dt_dtype_name(index->dtype));
    if (src->dtype != dst->dtype)
        return dt_err(DT_ETYPE, "%s(): self (%s) and source (%s) must have the same dtype", name,
                      dt_dtype_name(dst->dtype), dt_dtype_name(src->dtype));
    int64_t n = index->ndim ? index->shape[0] : 1;
    bool fits = src->ndim == dst->ndim && src->shape[dim] == n;
    for (int d = 0; fits && d < dst->ndim; d++)
        fits = d == dim || src->shape[d] == dst->shape[d];
    if (!fits)
        return dt_err(DT_EINVAL, "%s(): source must have self's shape except %lld (the number of indices) on dim %d",
                      name, (long long)n, dim);
    c->attrs.ints[0] = dim;
    c->nout = 1;
    c->out[0] = *dst;
    return 0;
}

/* dst keeps its placements (not split on dim: every device writes its rows of the indexed
 * positions), index is replicated, src follows dst on the other dims. */
static int s_shard_index(op_call *c)
{
    int dim = (int)c->attrs.ints[0];
    const op_arg *dst = &c->in[0];
    for (int m = 0; m < c->mesh_ndim; m++)
        if (dst->pl[m].kind == DT_SHARD && dst->pl[m].dim == dim)
            return dt_err(DT_EUNSUPPORTED, "%s(): self is split on dim %d, the dim it indexes (write into it with "
                          "slice assignment, or lay it out otherwise)", c->def->name, dim);
    int rc = s_shard_as(c, dt_replicate());
    if (rc != 0)
        return rc;
    for (int m = 0; m < c->mesh_ndim; m++) {
        c->want[2][m] = c->want[1][m];
        c->want[1][m] = dt_replicate();
    }
    return 0;
}

/* ---- the pieces on a device (every backend's kernels) ----------------------------------------- */

static const char s_misfit[] = "the local pieces of the operands do not fit together";

/* Whether dst (output 0, input 0's bytes) and src fit: dst as input 0 says, src of its rank and
 * dtype with its sizes but on dim. */
static bool s_fits(const op_kernel *k, int nin, int64_t dim, const op_local *src)
{
    const op_local *dst = &k->out[0], *in = &k->in[0];
    if (k->nin != nin || k->nout != 1 || dim < 0 || dim >= dst->ndim || in->dtype != dst->dtype ||
        in->ndim != dst->ndim || memcmp(in->shape, dst->shape, (size_t)dst->ndim * sizeof *dst->shape) ||
        src->ndim != dst->ndim || src->dtype != dst->dtype)
        return false;
    for (int d = 0; d < dst->ndim; d++)
        if (d != dim && src->shape[d] != dst->shape[d])
            return false;
    return true;
}

const char *op_slice_assign_local(const op_kernel *k, int *dim, int64_t *lo, int64_t *hi)
{
    const op_local *dst = &k->out[0], *src = &k->in[1];
    if (k->attrs->nints < 2 || k->nctx < 1 || !s_fits(k, 2, k->attrs->ints[0], src))
        return s_misfit;
    *dim = (int)k->attrs->ints[0];
    *lo = *hi = 0;
    if (dt_layout_numel(dst->ndim, dst->shape) == 0 || dt_layout_numel(src->ndim, src->shape) == 0)
        return NULL;
    /* the region [start, start + n) in global positions, clipped to this piece [piece0, piece0 + size):
     * with both pieces holding elements, n and size are below 2^48, and no global position of such a
     * piece is past 2^62 */
    int64_t start = k->attrs->ints[1], piece0 = k->ctx[0], lim = INT64_C(1) << 62;
    if (start < 0 || start > lim || piece0 < 0 || piece0 > lim)
        return s_misfit;
    int64_t end = start + src->shape[*dim], piece_end = piece0 + dst->shape[*dim];
    *lo = start > piece0 ? start : piece0;
    *hi = end < piece_end ? end : piece_end;
    if (*hi < *lo)
        *hi = *lo;
    return NULL;
}

const char *op_index_copy_local(const op_kernel *k, int *dim, int64_t *n)
{
    const op_local *index = &k->in[1], *src = &k->in[2];
    if (k->attrs->nints < 1 || !s_fits(k, 3, k->attrs->ints[0], src) || index->dtype != DT_INT64 || index->ndim > 1)
        return s_misfit;
    *dim = (int)k->attrs->ints[0];
    *n = dt_layout_numel(index->ndim, index->shape);
    return src->shape[*dim] == *n ? NULL : s_misfit;
}

#define S_DEF(op, num, kernel, inputs, infer_fn, shard_fn, local_fn)                                               \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = inputs, .nout = 1, .infer = infer_fn,               \
                                .shard = shard_fn, .local = local_fn, .inplace = true};
OP_WRITE(S_DEF)
#undef S_DEF
