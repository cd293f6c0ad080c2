/* dt_halo — image ops over an input split along a spatial dim (an image split by rows), each device
 * computing its own torch.chunk share of the output from its own rows and a few of its neighbours'
 * (the halo), never gathering the image.
 *
 * conv2d: the output rows [o0, o1) of a device need the input rows [o0 * stride - pad, (o1 - 1) *
 * stride + dilated kernel - pad); the part of that window outside the image becomes the device's own
 * zero padding (the top device keeps the top pad, the bottom one the bottom pad, the ones between
 * none), the rest is fetched worker to worker from the devices that hold it and assembled into one
 * local piece, on which the ordinary conv2d kernel runs. A device whose window is exactly its own
 * piece (a 1x1 convolution, one device) reads that piece as it is.
 *
 * interpolate (nearest or nearest-exact, by a power-of-two factor s along the split dim): the output
 * rows [o0, o1) are copies of the input rows [o0 / s, (o1 - 1) / s + 1); a device fetches those,
 * upsamples them with the ordinary kernel (s rows for each: the same source rows as the whole
 * image's, s being a power of two whose inverse is exact) and keeps the rows it owns.
 *
 * The output is laid out like the input: Shard(dim) along mesh_dim (its own torch.chunk split of the
 * output's rows, not the input's), the input's placements on the other mesh dims (Replicate or
 * Shard(0), the batch: each line of devices along mesh_dim exchanges its halos on its own). Weight
 * and bias are Replicate. Every device's SENDs are queued before any device's ASSEMBLE
 * (dt_redistribute.c's rule), so that no device waits for rows it has still to send. Only SEND,
 * ASSEMBLE, EMPTY, COMPUTE and FREE records are sent: the worker checks each as it checks any. */
#include <stdlib.h>
#include <string.h>

#include "act_runtime.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dtn_halo.h"
#include "dtn_op.h"
#include "dtn_tensor.h"
#include "mb_schema.h"
#include "op_registry.h"

typedef struct {
    op_call c;       /* the call as the op's rules see it: global shapes, attributes */
    dt_mesh *mesh;
    int mesh_dim;    /* the mesh dim the image is split along */
    int dim;         /* the split tensor dim (a spatial one) */
    int64_t n;       /* devices along mesh_dim */
    int64_t stride;  /* flat mesh index distance between neighbours along mesh_dim */
    uint64_t ids[3]; /* the inputs' piece ids */
    dt_tensor *out;
    int op;          /* OP_ID_conv2d or OP_ID_interpolate */
    int64_t scale;   /* interpolate: the split dim's upsampling */
} s_halo;

/* ---- the windows (pure arithmetic, tested on its own) ------------------------------------------ */

void dtn_halo_conv_window(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t o0, int64_t o1,
                          dtn_halo_window *w)
{
    *w = (dtn_halo_window){0};
    if (o1 <= o0)
        return;
    int64_t lo = o0 * stride - pad, hi = (o1 - 1) * stride + kernel - pad, len = hi - lo;
    w->used = 1;
    w->lo = lo < 0 ? 0 : lo > in ? in : lo;
    w->hi = hi > in ? in : hi < w->lo ? w->lo : hi;
    w->pad_lo = w->lo - lo < 0 ? 0 : w->lo - lo > len ? len : w->lo - lo; /* all padding: len */
    w->pad_hi = len - w->pad_lo - (w->hi - w->lo);
}

void dtn_halo_upsample_window(int64_t scale, int64_t o0, int64_t o1, dtn_halo_window *w)
{
    *w = (dtn_halo_window){0};
    if (o1 <= o0)
        return;
    w->used = 1;
    w->lo = o0 / scale;
    w->hi = (o1 - 1) / scale + 1;
    w->skip = o0 - w->lo * scale;
}

/* ---- where things are ------------------------------------------------------------------------- */

static int64_t s_position(const s_halo *g, int64_t d) { return d / g->stride % g->n; }

/* The flat mesh index of position p along mesh_dim on device d's line. */
static int64_t s_at(const s_halo *g, int64_t d, int64_t p) { return d + (p - s_position(g, d)) * g->stride; }

static int64_t s_id(const s_halo *g, int64_t d) { return g->mesh->ids[d]; }

/* The local shape and global offset of a tensor of `shape` laid out as the input on device d. */
static void s_block(const s_halo *g, const int64_t *shape, int64_t d, int64_t *local, int64_t *offset)
{
    int64_t coord[DT_MAX_DIMS];
    dt_layout_coord(g->mesh->ndim, g->mesh->shape, d, coord);
    dt_layout_block(g->mesh->ndim, g->mesh->shape, coord, g->c.in[0].pl, g->c.in[0].ndim, shape, local, offset);
}

static int64_t s_elements(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

static void s_free(int64_t device, uint64_t id) { mb_encode_free(act_runtime_record(device), id); }

/* ---- the halo exchange -------------------------------------------------------------------------- */

/* Device d's piece `win` becomes the input rows [w[d].lo, w[d].hi) along dim, taken from the pieces
 * of the devices on its line that hold them; win[d] is the input's own id where the window is
 * exactly its piece, 0 where the device has no output (nothing is sent to it). All SENDs first,
 * then the ASSEMBLEs. */
static int s_exchange(const s_halo *g, const dtn_halo_window *w, uint64_t fresh, uint64_t *win)
{
    int64_t size = g->mesh->size, n = g->n, dim = g->dim;
    const op_arg *x = &g->c.in[0];
    uint64_t *transfer = calloc((size_t)(size * n), sizeof *transfer);
    if (!transfer)
        return dt_err(DT_ENOMEM, "halo exchange: out of memory");
    int64_t local[DT_MAX_DIMS], offset[DT_MAX_DIMS], at[DT_MAX_DIMS] = {0};
    for (int64_t d = 0; d < size; d++) {
        s_block(g, x->shape, d, local, offset);
        bool own = w[d].lo == offset[dim] && w[d].hi == offset[dim] + local[dim];
        win[d] = !w[d].used ? 0 : own ? g->ids[0] : fresh;
        if (!w[d].used)
            continue;
        for (int64_t p = 0; !own && p < n; p++) {
            int64_t q = s_at(g, d, p);
            if (q == d)
                continue;
            s_block(g, x->shape, q, local, offset);
            int64_t a = w[d].lo > offset[dim] ? w[d].lo : offset[dim];
            int64_t b = w[d].hi < offset[dim] + local[dim] ? w[d].hi : offset[dim] + local[dim];
            if (a >= b)
                continue;
            at[dim] = a - offset[dim];
            local[dim] = b - a;
            transfer[d * n + p] = act_runtime_new_transfer_id();
            mb_encode_send(act_runtime_record(s_id(g, q)), g->ids[0], transfer[d * n + p], s_id(g, d), x->ndim, at,
                           x->ndim, local);
        }
    }
    int64_t src[DT_MAX_DIMS], dst[DT_MAX_DIMS] = {0}, shape[DT_MAX_DIMS];
    for (int64_t d = 0; d < size; d++) {
        if (win[d] != fresh)
            continue;
        s_block(g, x->shape, d, shape, offset);
        shape[dim] = w[d].hi - w[d].lo;
        uint32_t parts = 0;
        for (int64_t p = 0; p < n; p++) {
            s_block(g, x->shape, s_at(g, d, p), local, offset);
            parts += (w[d].lo > offset[dim] ? w[d].lo : offset[dim]) <
                     (w[d].hi < offset[dim] + local[dim] ? w[d].hi : offset[dim] + local[dim]);
        }
        mb_writer *pk = act_runtime_record(s_id(g, d));
        mb_encode_assemble(pk, fresh, x->dtype, x->ndim, shape, g->ids[0], false, parts);
        for (int64_t p = 0; p < n; p++) {
            int64_t q = s_at(g, d, p);
            s_block(g, x->shape, q, local, offset);
            int64_t a = w[d].lo > offset[dim] ? w[d].lo : offset[dim];
            int64_t b = w[d].hi < offset[dim] + local[dim] ? w[d].hi : offset[dim] + local[dim];
            if (a >= b)
                continue;
            memset(src, 0, sizeof src);
            src[dim] = q == d ? a - offset[dim] : 0; /* a received region starts at its own origin */
            dst[dim] = a - w[d].lo;
            local[dim] = b - a;
            mb_encode_part(pk, MB_PART_COPY, DT_REDUCE_SUM, s_id(g, q), q == d ? 0 : transfer[d * n + p], x->ndim,
                           src, x->ndim, dst, x->ndim, local, 0);
        }
    }
    free(transfer);
    return 0;
}

/* Device d's output piece has no elements: an EMPTY piece of its local shape. */
static void s_empty(const s_halo *g, int64_t d, const int64_t *shape)
{
    mb_encode_empty(act_runtime_record(s_id(g, d)), g->out->id, g->out->dtype, g->out->ndim, shape);
}

/* ---- the ops ------------------------------------------------------------------------------------ */

static int s_conv2d(const s_halo *g)
{
    int64_t size = g->mesh->size, axis = g->dim - 2, local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    const int64_t *a = g->c.attrs.ints;
    const op_arg *w = &g->c.in[1];
    int64_t kernel = a[6 + axis] * (w->shape[2 + axis] - 1) + 1;
    dtn_halo_window *win = calloc((size_t)size, sizeof *win);
    uint64_t *ids = calloc((size_t)size, sizeof *ids), fresh = act_runtime_new_tensor_id();
    if (!win || !ids) {
        free(win);
        free(ids);
        return dt_err(DT_ENOMEM, "conv2d: out of memory");
    }
    for (int64_t d = 0; d < size; d++) {
        s_block(g, g->out->shape, d, local, offset);
        dtn_halo_conv_window(g->c.in[0].shape[g->dim], kernel, a[axis], a[2 + 2 * axis], offset[g->dim],
                             offset[g->dim] + local[g->dim], &win[d]);
        win[d].used &= s_elements(g->out->ndim, local) > 0;
    }
    int rc = s_exchange(g, win, fresh, ids);
    for (int64_t d = 0; rc == 0 && d < size; d++) {
        s_block(g, g->out->shape, d, local, offset);
        if (!win[d].used) {
            s_empty(g, d, local);
        } else {
            op_attrs attrs = g->c.attrs;
            attrs.ints[2 + 2 * axis] = win[d].pad_lo;
            attrs.ints[3 + 2 * axis] = win[d].pad_hi;
            uint64_t ins[3] = {ids[d], g->ids[1], g->ids[2]};
            dtn_out out = {g->out->id, g->out->dtype, 4, local};
            dtn_op_compute(s_id(g, d), OP_ID_conv2d, g->c.nin, ins, &attrs, 0, NULL, 1, &out);
        }
        if (ids[d] == fresh)
            s_free(s_id(g, d), fresh);
    }
    free(win);
    free(ids);
    return rc;
}

static int s_interpolate(const s_halo *g, int64_t scale)
{
    int64_t size = g->mesh->size, dim = g->dim, local[DT_MAX_DIMS], offset[DT_MAX_DIMS], up[DT_MAX_DIMS];
    const op_arg *x = &g->c.in[0];
    dtn_halo_window *win = calloc((size_t)size, sizeof *win);
    uint64_t *ids = calloc((size_t)size, sizeof *ids), fresh = act_runtime_new_tensor_id();
    uint64_t wide = act_runtime_new_tensor_id();
    if (!win || !ids) {
        free(win);
        free(ids);
        return dt_err(DT_ENOMEM, "interpolate: out of memory");
    }
    for (int64_t d = 0; d < size; d++) {
        s_block(g, g->out->shape, d, local, offset);
        dtn_halo_upsample_window(scale, offset[dim], offset[dim] + local[dim], &win[d]);
        win[d].used &= s_elements(g->out->ndim, local) > 0;
    }
    int rc = s_exchange(g, win, fresh, ids);
    static const int64_t origin[DT_MAX_DIMS];
    for (int64_t d = 0; rc == 0 && d < size; d++) {
        s_block(g, g->out->shape, d, local, offset);
        if (!win[d].used) {
            s_empty(g, d, local);
        } else {
            /* the fetched rows upsampled whole, then the rows the device owns kept */
            memcpy(up, local, sizeof up);
            up[dim] = (win[d].hi - win[d].lo) * scale;
            bool exact = up[dim] == local[dim];
            op_attrs attrs = g->c.attrs;
            attrs.ints[dim] = up[dim]; /* ints: mode, align_corners, then the output sizes */
            dtn_out out = {exact ? g->out->id : wide, g->out->dtype, x->ndim, up};
            dtn_op_compute(s_id(g, d), OP_ID_interpolate, 1, &ids[d], &attrs, 0, NULL, 1, &out);
            if (!exact) {
                int64_t src[DT_MAX_DIMS] = {0};
                src[dim] = win[d].skip;
                mb_writer *pk = act_runtime_record(s_id(g, d));
                mb_encode_assemble(pk, g->out->id, g->out->dtype, x->ndim, local, wide, false, 1);
                mb_encode_part(pk, MB_PART_COPY, DT_REDUCE_SUM, s_id(g, d), 0, x->ndim, src, x->ndim, origin, x->ndim,
                               local, 0);
                s_free(s_id(g, d), wide);
            }
        }
        if (ids[d] == fresh)
            s_free(s_id(g, d), fresh);
    }
    free(win);
    free(ids);
    return rc;
}

/* ---- checking the call -------------------------------------------------------------------------- */

/* Fills g for op on the inputs: shapes and attributes by the op's own checks; the input Shard of a
 * spatial dim along mesh_dim and Replicate or Shard(0) on the others, the other inputs Replicate. */
static int s_check(s_halo *g, int op, int nin, dt_tensor *const *in, const op_attrs *attrs, int mesh_dim)
{
    const op_def *def = op_by_id(op);
    op_call *c = &g->c;
    for (int i = 0; i < nin; i++)
        if (!in[i])
            return dt_err(DT_EINVAL, "%s: input %d is missing", def->name, i);
    int rc = dtn_op_call(def, nin, in, attrs, c);
    if (rc != 0 || (rc = def->infer(c)) != 0)
        return rc;
    if (mesh_dim < 0 || mesh_dim >= c->mesh_ndim)
        return dt_err(DT_EINVAL, "%s: mesh_dim %d is out of range for a mesh of %d dims", def->name, mesh_dim,
                      c->mesh_ndim);
    const op_arg *x = &c->in[0];
    dt_placement p = x->pl[mesh_dim];
    char have[256];
    dt_layout_format_placements(c->mesh_ndim, x->pl, have, sizeof have);
    if (p.kind != DT_SHARD || p.dim < 2 || p.dim >= x->ndim)
        return dt_err(DT_EINVAL, "%s: the input must be split on a spatial dim (Shard(2) or Shard(%d)) along mesh dim "
                      "%d, got placements %s", def->name, x->ndim - 1, mesh_dim, have);
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement q = x->pl[m];
        if (m != mesh_dim && !(q.kind == DT_REPLICATE || (q.kind == DT_SHARD && q.dim == 0)))
            return dt_err(DT_EINVAL, "%s: the input must be Replicate or Shard(0) on the mesh dims other than %d, got "
                          "placements %s", def->name, mesh_dim, have);
        for (int i = 1; i < nin; i++)
            if (c->in[i].pl[m].kind != DT_REPLICATE)
                return dt_err(DT_EINVAL, "%s: %s must be Replicate on every mesh dim", def->name,
                              i == 1 ? "weight" : "bias");
    }
    g->mesh = in[0]->mesh;
    g->mesh_dim = mesh_dim;
    g->dim = p.dim;
    g->n = g->mesh->shape[mesh_dim];
    g->stride = 1;
    for (int m = mesh_dim + 1; m < g->mesh->ndim; m++)
        g->stride *= g->mesh->shape[m];
    memset(g->ids, 0, sizeof g->ids);
    for (int i = 0; i < nin; i++)
        g->ids[i] = in[i]->id;
    return 0;
}

/* The power of two s by which interpolate upsamples the split dim (its rows are then s copies of
 * each input row, wherever they are cut), or 0 with the error. */
static int64_t s_upsample_scale(const s_halo *g)
{
    const op_call *c = &g->c;
    int axis = g->dim - 2;
    int64_t in = c->in[0].shape[g->dim], out = c->out[0].shape[g->dim], s = in > 0 ? out / in : 0;
    double f = c->attrs.floats[axis];
    if (c->attrs.ints[0] == 1 || s < 1 || s * in != out || (s & (s - 1)) != 0 || (f != 0.0 && f != (double)s)) {
        dt_err(DT_EINVAL, "interpolate: an input split on dim %d is resampled only by nearest or nearest-exact with a "
               "power-of-two scale on that dim (input %lld rows, output %lld)", g->dim, (long long)in, (long long)out);
        return 0;
    }
    return s;
}

static int s_plan(void *arg)
{
    const s_halo *g = arg;
    return g->op == OP_ID_conv2d ? s_conv2d(g) : s_interpolate(g, g->scale);
}

/* The op run over the split: the output tensor, or NULL with the error. */
static dt_tensor *s_run(int op, int nin, dt_tensor *const *in, const op_attrs *attrs, int mesh_dim)
{
    s_halo *g = malloc(sizeof *g);
    dt_tensor *out = g ? dtn_tensor_alloc() : NULL;
    if (!out) {
        free(g);
        dt_err(DT_ENOMEM, "%s: out of memory", op_by_id(op)->name);
        return NULL;
    }
    int64_t scale = 1;
    if (s_check(g, op, nin, in, attrs, mesh_dim) != 0 || (op == OP_ID_interpolate && !(scale = s_upsample_scale(g)))) {
        dtn_tensor_free(out);
        free(g);
        return NULL;
    }
    const op_arg *o = &g->c.out[0];
    out->mesh = dt_mesh_ref(g->mesh);
    out->dtype = o->dtype;
    out->ndim = o->ndim;
    memcpy(out->shape, o->shape, sizeof out->shape);
    memcpy(out->placements, in[0]->placements, sizeof out->placements);
    g->out = out;
    g->op = op;
    g->scale = scale;
    out = dtn_op_run_plan(op_by_id(op)->name, g->mesh, out, in, nin, g->ids, s_plan, g);
    free(g);
    return out;
}

dt_tensor *dt_halo_conv2d(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, const int64_t *ints, int mesh_dim)
{
    op_attrs attrs = {.nints = 9};
    memcpy(attrs.ints, ints, 9 * sizeof ints[0]);
    dt_tensor *in[3] = {x, weight, bias};
    return s_run(OP_ID_conv2d, bias ? 3 : 2, in, &attrs, mesh_dim);
}

dt_tensor *dt_halo_interpolate(dt_tensor *x, int nints, const int64_t *ints, int nfloats, const double *floats,
                               int mesh_dim)
{
    op_attrs attrs = {.nints = nints, .nfloats = nfloats};
    if (nints < 0 || nints > 4 || nfloats < 0 || nfloats > 2) {
        dt_err(DT_EINVAL, "interpolate: expected ints [mode, align_corners, output sizes] and scale factors");
        return NULL;
    }
    memcpy(attrs.ints, ints, (size_t)nints * sizeof ints[0]);
    memcpy(attrs.floats, floats, (size_t)nfloats * sizeof floats[0]);
    return s_run(OP_ID_interpolate, 1, &x, &attrs, mesh_dim);
}
