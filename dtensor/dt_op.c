/* dt_op — running a registered op on DTensors. Everything about the call is settled here, on
 * the user's thread: arguments and shapes (infer), placements (shard), and the redistributes an
 * input needs first. Each device then gets one COMPUTE record naming the op, its local output
 * shapes and its inputs; workers never re-infer. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_capture.h"
#include "act_runtime.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dtn_capture.h"
#include "dtn_op.h"
#include "dtn_plan.h"
#include "dtn_redistribute.h"
#include "dtn_tensor.h"
#include "dtn_viewmemo.h"
#include "mb_schema.h"
#include "op_registry.h"

static bool s_strict;

#define S_GATHER_ONCE (1 << 20) /* bytes of a strided view from which it is gathered once (dt_op_run) */

void dt_set_strict(bool strict) { s_strict = strict; }
bool dt_get_strict(void) { return s_strict; }

int dtn_op_call(const op_def *def, int n, dt_tensor *const *in, const op_attrs *attrs, op_call *c)
{
    if (def->nin >= 0 && n != def->nin)
        return dt_err(DT_EINVAL, "%s: expected %d tensor inputs, got %d", def->name, def->nin, n);
    if (n < 1 || n > OP_MAX_INPUTS)
        return dt_err(DT_EINVAL, "%s: takes 1 to %d tensors, got %d", def->name, OP_MAX_INPUTS, n);
    if (attrs && (attrs->nints < 0 || attrs->nints > OP_MAX_INTS || attrs->nfloats < 0 || attrs->nfloats > OP_MAX_FLOATS))
        return dt_err(DT_EINVAL, "%s: too many attributes", def->name);
    /* only what this call uses is initialised: the whole struct is kilobytes, and this runs per op
     * (the inputs' every field, and given attributes, are written below; the op's own outputs,
     * which its infer fills, start zeroed) */
    memset(c, 0, offsetof(op_call, in));
    if (!attrs)
        memset(&c->attrs, 0, sizeof c->attrs);
    for (int o = 0; o < OP_MAX_OUTPUTS && (o == 0 || o < def->nout); o++) /* one fixed size: stores inline */
        memset(&c->out[o], 0, sizeof c->out[o]);
    c->def = def;
    c->mesh = in[0]->mesh;
    c->cost = dtn_redistribute_cost;
    c->mesh_ndim = in[0]->mesh->ndim;
    c->mesh_shape = in[0]->mesh->shape;
    c->nin = n;
    if (attrs) { /* what is given of them (a whole struct is 208 bytes; ops read only these) */
        c->attrs.nints = attrs->nints;
        memcpy(c->attrs.ints, attrs->ints, (size_t)attrs->nints * sizeof *attrs->ints);
        c->attrs.nfloats = attrs->nfloats;
        memcpy(c->attrs.floats, attrs->floats, (size_t)attrs->nfloats * sizeof *attrs->floats);
        c->attrs.has_scalar = attrs->has_scalar;
        c->attrs.scalar = attrs->scalar;
    }
    for (int i = 0; i < n; i++) {
        if (!in[i])
            return dt_err(DT_EINVAL, "%s: input %d is missing", def->name, i);
        if (i > 0 && !dt_layout_same_mesh(in[i]->mesh, in[0]->mesh))
            return dt_err(DT_EUNSUPPORTED, "%s: DTensor does not support cross-mesh operation: input %d lives on "
                          "another mesh than input 0 (redistribute it first)", def->name, i);
        int rc = act_runtime_check_live(def->name, in[i]->epoch);
        if (rc != 0)
            return rc;
        op_arg *a = &c->in[i];
        a->ndim = in[i]->ndim;
        memcpy(a->shape, in[i]->shape, sizeof a->shape);
        a->dtype = in[i]->dtype;
        memcpy(a->pl, in[i]->placements, sizeof a->pl);
        memcpy(c->want[i], a->pl, sizeof c->want[i]); /* by default an input stays as it is */
    }
    c->nout = def->nout;
    return 0;
}

/* Fails with the placements an input has and the ones the op needs (strict mode). */
static int s_strict_error(const op_call *c, int i)
{
    char have[256], want[256];
    dt_layout_format_placements(c->mesh_ndim, c->in[i].pl, have, sizeof have);
    dt_layout_format_placements(c->mesh_ndim, c->want[i], want, sizeof want);
    return dt_err(DT_EUNSUPPORTED, "%s: strict mode: input %d has placements %s but the op needs %s "
                  "(redistribute it explicitly, or turn strict mode off)", c->def->name, i, have, want);
}

uint64_t dt_ops_submitted(void) { return act_runtime_submitted(); }

int dt_op_id(const char *name)
{
    const op_def *def = name ? op_find(name) : NULL;
    if (!def && name && name[0] == '_')
        def = op_find_operator(name);
    if (!def)
        return dt_err(DT_EINVAL, "unknown op '%s'", name ? name : "(null)");
    return op_index(def);
}

int dt_op_count(void) { return op_count(); }

int dt_op_info_at(int i, dt_op_info *info)
{
    const op_def *def = op_nth(i);
    if (!def)
        return dt_err(DT_EINVAL, "no op %d (there are %d)", i, op_count());
    *info = (dt_op_info){def->name, def->id, def->nin, def->nout, def->py_sig, def->py_exports, def->py_floats};
    return 0;
}

static void s_encode_compute(mb_writer *pk, int op, int nin, const uint64_t *ins, const op_attrs *a, int nctx,
                             const int64_t *ctx, int nviews, const int64_t *views, int nout, const dtn_out *outs)
{
    mb_encode_compute(pk, op, nin, ins, a->nints, a->ints, a->nfloats, a->floats, a->has_scalar ? &a->scalar : NULL,
                      nctx, ctx, nviews, views, (uint32_t)nout);
    for (int o = 0; o < nout; o++)
        mb_encode_out(pk, outs[o].id, outs[o].dtype, outs[o].ndim, outs[o].shape);
}

void dtn_op_compute(int64_t device, int op, int nin, const uint64_t *ins, const op_attrs *a, int nctx,
                    const int64_t *ctx, int nout, const dtn_out *outs)
{
    mb_writer *pk = act_runtime_record(device);
    act_runtime_note_op(device, op);
    s_encode_compute(pk, op, nin, ins, a, nctx, ctx, 0, NULL, nout, outs);
}

/* Appends input i's view on the device at coord to views: t's piece there, the run of its base's
 * piece from t->view_first on ([input, first, rank, sizes...]; first 0 when the piece is empty),
 * or what a strided view's map reads of that run ([input, first, -rank, sizes..., strides...]; a
 * strided view whose piece there happens to be one run is sent as a run). */
static int s_view_ints(const dt_tensor *t, int i, const int64_t *coord, int64_t *views)
{
    const dt_mesh *mesh = t->mesh;
    int64_t offset[DT_MAX_DIMS], *sizes = views + 3;
    dt_layout_block(mesh->ndim, mesh->shape, coord, t->placements, t->ndim, t->shape, sizes, offset);
    bool empty = dt_layout_numel(t->ndim, sizes) == 0;
    views[0] = i;
    views[1] = empty ? 0 : t->view_first;
    views[2] = t->ndim;
    if (!t->strided || empty)
        return 3 + t->ndim;
    const dtn_strided *s = t->strided;
    int64_t frame_local[DT_MAX_DIMS], first, *strides = sizes + t->ndim, run = 1;
    dt_layout_block(mesh->ndim, mesh->shape, coord, s->frame_pl, s->map.frame_ndim, s->frame_shape, frame_local,
                    offset);
    op_strided_local(&s->map, frame_local, sizes, &first, strides);
    views[1] += first;
    bool one_run = true; /* its elements in order, with no gap: strides of a C-contiguous piece */
    for (int d = t->ndim - 1; d >= 0 && one_run; d--) {
        one_run = sizes[d] == 1 || strides[d] == run;
        run *= sizes[d];
    }
    if (one_run)
        return 3 + t->ndim;
    views[2] = -t->ndim;
    return 3 + 2 * t->ndim;
}

/* The COMPUTE record of every device of mesh; ins are the ids of its pieces, in the tensors (a view
 * made on the controller names its base's id, and each device's record says where its piece lies
 * in the base's). Where each output is whole on every device (no Shard), each view too, and a
 * device's context is the first device's, its record is the same bytes: copied from the first
 * instead of encoded again. */
static void s_compute_all(const op_call *c, dt_mesh *mesh, int op, int nin, const uint64_t *ins, dt_tensor *const *in,
                          dt_tensor *const *made)
{
    const op_def *def = c->def;
    bool whole = true, viewed = false;
    for (int o = 0; o < c->nout && whole; o++)
        for (int m = 0; m < mesh->ndim; m++)
            whole = whole && c->out[o].pl[m].kind != DT_SHARD;
    for (int i = 0; i < nin; i++) {
        if (!in[i]->base)
            continue;
        viewed = true;
        for (int m = 0; m < mesh->ndim; m++)
            whole = whole && in[i]->placements[m].kind != DT_SHARD;
    }
    int64_t coord[DT_MAX_DIMS], offset[DT_MAX_DIMS], local[OP_MAX_OUTPUTS][DT_MAX_DIMS];
    int64_t ctx[OP_MAX_CTX], first_ctx[OP_MAX_CTX], views[MB_MAX_VIEW_INTS];
    int first_nctx = 0, nviews = 0;
    dtn_out outs[OP_MAX_OUTPUTS];
    const mb_writer *first = NULL;
    size_t at = 0, len = 0; /* where the first device's record lies in its writer */
    for (int64_t d = 0; d < mesh->size; d++) {
        mb_writer *pk = act_runtime_record(mesh->ids[d]);
        act_runtime_note_op(mesh->ids[d], op);
        dt_layout_coord(mesh->ndim, mesh->shape, d, coord);
        int nctx = def->local ? def->local(c, coord, ctx) : 0;
        if (whole && first && first != pk && nctx == first_nctx &&
            !memcmp(ctx, first_ctx, (size_t)nctx * sizeof *ctx)) {
            mb_w_encoded(pk, first->data + at, len);
            continue;
        }
        for (int o = 0; o < c->nout; o++) {
            dt_layout_block(mesh->ndim, mesh->shape, coord, c->out[o].pl, c->out[o].ndim, c->out[o].shape, local[o],
                            offset);
            outs[o] = (dtn_out){made[o]->id, c->out[o].dtype, c->out[o].ndim, local[o]};
        }
        nviews = 0;
        for (int i = 0; viewed && i < nin; i++)
            if (in[i]->base)
                nviews += s_view_ints(in[i], i, coord, views + nviews);
        size_t start = pk->size;
        s_encode_compute(pk, op, nin, ins, &c->attrs, nctx, ctx, nviews, views, c->nout, outs);
        if (d == 0 && !pk->failed) {
            at = start;
            len = pk->size - start;
            first = pk;
            first_nctx = nctx;
            memcpy(first_ctx, ctx, (size_t)nctx * sizeof *ctx);
        }
    }
}

int dt_op(const char *name, int n, dt_tensor *const *in, const dt_op_attrs *attrs, int max_out, dt_tensor **out)
{
    int id = dt_op_id(name);
    return id < 0 ? id : dt_op_run(id, n, in, attrs, max_out, out);
}

/* The frame a strided view of x reads: x's own (x itself, or the contiguous view it is), or for a
 * strided x the one it reads already. */
static void s_frame(const dt_tensor *x, const int64_t **shape, const dt_placement **pl)
{
    *shape = x->strided ? x->strided->frame_shape : x->shape;
    *pl = x->strided ? x->strided->frame_pl : x->placements;
}

/* plan's output as a view of in made on the controller alone: a handle that reads in's pieces (or
 * those in reads), starting plan->first elements further in; a strided plan's is a strided view of
 * in's frame (in itself, or the frame in reads). No device hears of it until an op reads it. */
static int s_view(const char *op, const dtn_view_plan *plan, dt_tensor *in, dt_tensor **out)
{
    dt_tensor *base = in->base ? in->base : in;
    const op_arg *o = &plan->out;
    uint64_t base_id = in->base ? in->base_id : in->id; /* a view of a view reads what it reads */
    dt_tensor *t = dtn_tensor_view(base, base_id, in->view_first + plan->first, o->dtype, o->ndim, o->shape, o->pl);
    if (!t)
        return dt_err(DT_ENOMEM, "%s: out of memory", op);
    if (plan->strided) {
        dtn_strided *strided = dtn_strided_alloc();
        if (!strided) {
            dt_tensor_release(&t);
            return dt_err(DT_ENOMEM, "%s: out of memory", op);
        }
        const int64_t *frame_shape;
        const dt_placement *frame_pl;
        s_frame(in, &frame_shape, &frame_pl);
        memcpy(strided->frame_shape, frame_shape, sizeof strided->frame_shape);
        memcpy(strided->frame_pl, frame_pl, sizeof strided->frame_pl);
        strided->map = plan->map;
        t->strided = strided;
        t->noncontiguous = plan->noncontiguous;
    }
    out[0] = t;
    return 1;
}

/* What may stop a view of x between two calls with the same plan: no capture is being recorded
 * (its records must make what they use), and the pieces it would read have an id and were never
 * written in place (a write would show through: views are values). */
static bool s_view_allowed(const dt_tensor *x)
{
    const dt_tensor *base = x->base ? x->base : x;
    return !act_capture_active() && !base->written && base->id;
}

/* Whether output 0 of c can be a view of input 0 made on the controller alone: the op says so, no
 * input moves, and s_view_allowed. *plan is then its view: a contiguous run of every piece
 * (op_def.view) from plan->first, or a strided view that reads the same way on every device
 * (op_def.strided, op_strided_uniform; plan->strided where its map is not the frame itself). */
static bool s_viewable(const op_call *c, const dt_tensor *x, const bool *moves, dtn_view_plan *plan)
{
    if ((!c->def->view && !c->def->strided) || moves[0] || !s_view_allowed(x))
        return false;
    plan->out = c->out[0];
    plan->first = 0;
    plan->strided = plan->noncontiguous = false;
    if (!x->strided && c->def->view && c->def->view(c, &plan->first))
        return true;
    plan->first = 0;
    op_strided from, *map = &plan->map;
    if (x->strided)
        from = x->strided->map;
    else
        op_strided_identity(&from, x->ndim);
    const int64_t *frame_shape;
    const dt_placement *frame_pl;
    s_frame(x, &frame_shape, &frame_pl);
    const op_arg *o = &c->out[0];
    if (!c->def->strided || !c->def->strided(c, &from, map) ||
        !op_strided_uniform(map, c->mesh_ndim, o->shape, o->pl, frame_shape, frame_pl))
        return false;
    plan->strided = !op_strided_is_identity(map, o->shape, frame_shape);
    plan->noncontiguous = plan->strided && !op_strided_rowmajor(map, o->shape, frame_shape);
    return true;
}

/* How x reads in torch's terms: a map onto a row-major frame, whose shape it returns (its layout's,
 * a strided view's own, or the identity onto itself). */
static const int64_t *s_logical(const dt_tensor *x, op_strided *map)
{
    const dtn_strided *s = x->layout ? x->layout : x->strided;
    if (s) {
        *map = s->map;
        return s->frame_shape;
    }
    op_strided_identity(map, x->ndim);
    return x->shape;
}

/* t, output 0 of a view op on x made otherwise than by a plan of x's own map (a copy, or a view of a
 * tensor with a layout): whether torch's view would be contiguous, and the layout its own views
 * read on by where it is not, or where it differs from t's strided map. An op with no map for
 * it (a reshape torch would copy) makes a row-major tensor. Out of memory, t is left as it is. */
static void s_lay_out(const op_call *c, const dt_tensor *x, dt_tensor *t)
{
    op_strided from, map;
    const int64_t *frame_shape = s_logical(x, &from);
    if (!c->def->strided || !c->def->strided(c, &from, &map)) {
        t->noncontiguous = false;
        return;
    }
    t->noncontiguous = !op_strided_rowmajor(&map, t->shape, frame_shape);
    if (!t->noncontiguous && !t->strided)
        return;
    dtn_strided *layout = dtn_strided_alloc();
    if (!layout)
        return;
    memcpy(layout->frame_shape, frame_shape, sizeof layout->frame_shape);
    memset(layout->frame_pl, 0, sizeof layout->frame_pl); /* not read: a layout is no frame of pieces */
    layout->map = map;
    t->layout = layout;
}

/* Between act_runtime_begin and _end: pieces for t under a fresh id, sharing the bytes of the
 * pieces named read (t's own, or for a view its base's from t->view_first on): a reshape to its own
 * shape, which the worker's alias hook makes without a copy. */
static uint64_t s_alias_pieces(const dt_tensor *t, uint64_t read)
{
    const op_def *reshape = op_by_id(OP_ID_reshape);
    const dt_mesh *mesh = t->mesh;
    op_attrs attrs = {.nints = t->ndim};
    memcpy(attrs.ints, t->shape, (size_t)t->ndim * sizeof *t->shape);
    uint64_t id = act_runtime_new_tensor_id();
    int64_t coord[DT_MAX_DIMS], views[3 + 2 * DT_MAX_DIMS], offset[DT_MAX_DIMS];
    for (int64_t d = 0; d < mesh->size; d++) {
        dt_layout_coord(mesh->ndim, mesh->shape, d, coord);
        int nviews = 0;
        if (t->base)
            nviews = s_view_ints(t, 0, coord, views);
        else
            dt_layout_block(mesh->ndim, mesh->shape, coord, t->placements, t->ndim, t->shape, views + 3, offset);
        dtn_out out = {id, t->dtype, t->ndim, views + 3};
        mb_writer *pk = act_runtime_record(mesh->ids[d]);
        act_runtime_note_op(mesh->ids[d], op_index(reshape));
        s_encode_compute(pk, op_index(reshape), 1, &read, &attrs, 0, NULL, nviews, views, 1, &out);
    }
    return id;
}

uint64_t dtn_op_view_piece(const dt_tensor *t) { return s_alias_pieces(t, t->base_id); }

dt_tensor *dtn_op_run_plan(const char *name, dt_mesh *mesh, dt_tensor *out, dt_tensor *const *in, int n,
                           uint64_t *ids, int (*run)(void *arg), void *arg)
{
    if (n > DTN_PLAN_MAX_INPUTS) {
        dt_err(DT_EINVAL, "%s: %d inputs, more than a plan takes (%d)", name, n, DTN_PLAN_MAX_INPUTS);
        dt_tensor_release(&out);
        return NULL;
    }
    if (act_runtime_begin(name, &mesh, 1) != 0) {
        dt_tensor_release(&out);
        return NULL;
    }
    out->id = act_runtime_new_tensor_id();
    out->epoch = act_runtime_epoch();
    /* views made on the controller: pieces of their own for the plan to read, freed after */
    uint64_t pieces[DTN_PLAN_MAX_INPUTS] = {0};
    for (int i = 0; i < n; i++)
        if (in[i] && in[i]->base)
            ids[i] = pieces[i] = dtn_op_view_piece(in[i]);
    int rc = run(arg);
    for (int i = 0; i < n; i++)
        if (pieces[i])
            act_runtime_free_now(mesh, pieces[i]);
    act_runtime_end();
    if (rc != 0) {
        out->id = 0; /* nothing was sent: no device has it */
        dt_tensor_release(&out);
    }
    return out;
}

int dtn_op_settle(dt_tensor *t, const char *op)
{
    if (!t->base)
        return 0;
    if (act_capture_active())
        return dt_err(DT_EUNSUPPORTED, "%s: inside dtorch.capture(), a view made before the capture cannot be "
                      "written in place (write into the tensor it views, or make the view inside the capture)", op);
    int rc = dtn_check_fits(op, t->mesh, t->ndim, t->shape, t->placements, t->dtype);
    if (rc != 0)
        return rc;
    dt_mesh *mesh = t->mesh;
    rc = act_runtime_begin(op, &mesh, 1);
    if (rc != 0)
        return rc;
    if ((rc = act_runtime_check_live(op, t->base->epoch)) != 0) {
        act_runtime_end();
        return rc;
    }
    t->id = dtn_op_view_piece(t);
    t->epoch = act_runtime_epoch();
    act_runtime_end();
    dtn_tensor_unview(t); /* the base's FREE, if this was the last, goes after the records that read it */
    t->view_first = 0;
    return 0;
}

/* Between act_runtime_begin and _end: t, to be written in place while live views read its pieces,
 * moves to new pieces sharing those bytes (copied by the worker before the write); the old ones
 * stay the views' until the last of them goes. */
static void s_rebind(dt_tensor *t)
{
    uint64_t old = t->id;
    t->id = s_alias_pieces(t, old);
    dtn_tensor_retire(t, old);
}

int dtn_op_written(dt_tensor *t, const char *op)
{
    t->written = true;
    return dtn_op_unshare(t, op);
}

int dtn_op_unshare(dt_tensor *t, const char *op)
{
    if (!dtn_tensor_viewed(t))
        return 0;
    dt_mesh *mesh = t->mesh;
    int rc = act_runtime_begin(op, &mesh, 1);
    if (rc != 0)
        return rc;
    if ((rc = act_runtime_check_live(op, t->epoch)) == 0)
        s_rebind(t);
    act_runtime_end();
    return rc;
}

int dt_op_run(int id, int n, dt_tensor *const *in, const dt_op_attrs *attrs, int max_out, dt_tensor **out)
{
    const op_def *def = op_at(id);
    if (!def)
        return dt_err(DT_EINVAL, "unknown op id %d", id);
    /* a view op called as before on a tensor like this one: the plan of its view, kept (a strided
     * view's input, and an input from a runtime since stopped, are left to the call below) */
    dtn_view_key key;
    bool keyed = n == 1 && max_out >= 1 && in[0] && dtn_viewmemo_key(def, in[0], attrs, &key);
    if (keyed) {
        const dtn_view_plan *plan = dtn_viewmemo_find(&key);
        if (plan && s_view_allowed(in[0]) && act_runtime_epoch_live(in[0]->epoch))
            return s_view(def->name, plan, in[0], out);
    }
    op_call c;
    int rc = dtn_op_call(def, n, in, attrs, &c);
    if (rc != 0 || (rc = def->infer(&c)) != 0)
        return rc;
    if (c.nout > max_out)
        return dt_err(DT_EINVAL, "%s: returns %d tensors, room for %d", def->name, c.nout, max_out);
    for (int o = 0; o < c.nout; o++)
        if ((rc = dt_layout_check_shape(def->name, c.out[o].ndim, c.out[o].shape)) != 0)
            return rc;
    if ((rc = def->shard(&c)) != 0)
        return rc;
    bool moves[OP_MAX_INPUTS] = {false};
    for (int i = 0; i < n; i++) {
        moves[i] = !op_same_placements(c.in[i].pl, c.want[i], c.mesh_ndim);
        if (moves[i] && s_strict)
            return s_strict_error(&c, i);
    }
    if (def->inplace && moves[0])
        return dt_err(DT_EUNSUPPORTED, "%s: an in-place op may not move the tensor it writes", def->name);
    dtn_view_plan plan;
    if (s_viewable(&c, in[0], moves, &plan)) {
        if (keyed)
            dtn_viewmemo_keep(&key, &plan);
        if ((rc = s_view(def->name, &plan, in[0], out)) == 1 && in[0]->layout)
            s_lay_out(&c, in[0], out[0]);
        return rc;
    }
    /* what this op makes on the devices (outputs, and inputs moved for it) must fit there */
    for (int o = def->inplace ? 1 : 0; o < c.nout; o++)
        if ((rc = dtn_check_fits(def->name, in[0]->mesh, c.out[o].ndim, c.out[o].shape, c.out[o].pl,
                                 c.out[o].dtype)) != 0)
            return rc;
    for (int i = 0; i < n; i++)
        if (moves[i] && (rc = dtn_check_fits(def->name, in[0]->mesh, c.in[i].ndim, c.in[i].shape, c.want[i],
                                             c.in[i].dtype)) != 0)
            return rc;
    /* a large strided view gets pieces of its own the first time an op reads it (one gather on
     * each device, kept): read inline, every op that reads it would gather it again (a weight
     * transposed once, read at every step) */
    for (int i = 0; i < n && !act_capture_active(); i++)
        if (in[i]->strided && dt_layout_numel(in[i]->ndim, in[i]->shape) * (int64_t)dt_dtype_size(in[i]->dtype) >=
                                  S_GATHER_ONCE &&
            (rc = dtn_op_settle(in[i], def->name)) != 0)
            return rc;
    /* the tensor an in-place op writes needs pieces of its own; other views are read as they are
     * (the records name their base's pieces), but for those that move first or do not fit in the
     * record, which get pieces for this op alone (pieced[]) */
    bool rebind = false; /* an in-place write into a copy of what its live views read (below) */
    if (def->inplace) {
        if ((rc = dtn_op_settle(in[0], def->name)) != 0)
            return rc;
        in[0]->written = true;
        if (act_capture_active())
            dtn_capture_wrote(in[0]);
        if ((rebind = dtn_tensor_viewed(in[0])) && act_capture_active())
            return dt_err(DT_EUNSUPPORTED, "%s: inside dtorch.capture(), a tensor cannot be written in place while a "
                          "view made of it before the capture is alive (drop the view, or take it after a clone())",
                          def->name);
    }
    bool pieced[OP_MAX_INPUTS] = {false};
    for (int i = 0, room = MB_MAX_VIEW_INTS; i < n; i++) {
        if (!in[i]->base)
            continue;
        int need = 3 + (in[i]->strided ? 2 : 1) * in[i]->ndim;
        pieced[i] = moves[i] || need > room;
        room -= pieced[i] ? 0 : need;
        if (pieced[i] && (rc = dtn_check_fits(def->name, in[i]->mesh, in[i]->ndim, in[i]->shape, in[i]->placements,
                                              in[i]->dtype)) != 0)
            return rc;
    }
    dt_mesh *mesh = in[0]->mesh;
    dt_tensor *made[OP_MAX_OUTPUTS] = {NULL};
    for (int o = 0; o < c.nout; o++) {
        if (o == 0 && def->inplace) {
            made[0] = dt_tensor_ref(in[0]); /* the same handle: its devices write into it */
            continue;
        }
        dt_tensor *t = dtn_tensor_alloc();
        if (!t) {
            for (int p = 0; p < o; p++)
                dt_tensor_release(&made[p]);
            return dt_err(DT_ENOMEM, "%s: out of memory", def->name);
        }
        t->mesh = dt_mesh_ref(mesh);
        t->dtype = c.out[o].dtype;
        t->ndim = c.out[o].ndim;
        memcpy(t->shape, c.out[o].shape, sizeof t->shape);
        memcpy(t->placements, c.out[o].pl, sizeof t->placements);
        made[o] = t;
    }
    if ((rc = act_runtime_begin(def->name, &mesh, 1)) != 0) {
        for (int o = 0; o < c.nout; o++)
            dt_tensor_release(&made[o]);
        return rc;
    }
    if (rebind)
        s_rebind(in[0]);
    uint64_t ids[OP_MAX_INPUTS], own[OP_MAX_INPUTS]; /* the ids the records name, and the inputs' own */
    dt_tensor *reads[OP_MAX_INPUTS];                 /* how the records read each input */
    dt_tensor pieces[OP_MAX_INPUTS];                 /* ... a view's pieces made for this op */
    for (int i = 0; i < n; i++) {
        int nsteps = 0;
        reads[i] = in[i];
        if (pieced[i]) {
            pieces[i] = *in[i];
            pieces[i].id = dtn_op_view_piece(in[i]);
            pieces[i].base = NULL;
            reads[i] = &pieces[i];
        }
        own[i] = reads[i]->base ? reads[i]->base_id : reads[i]->id;
        ids[i] = moves[i] ? dtn_redistribute_inline(reads[i], c.want[i], &nsteps) : own[i];
        if (ids[i] == 0) {
            /* planning ran out of memory: free the inputs already laid out, make nothing */
            for (int j = 0; j <= i; j++) {
                if (j < i && ids[j] != own[j])
                    act_runtime_free_now(mesh, ids[j]);
                if (pieced[j])
                    act_runtime_free_now(mesh, own[j]);
            }
            act_runtime_end();
            for (int o = 0; o < c.nout; o++)
                dt_tensor_release(&made[o]);
            return dt_err(DT_ENOMEM, "%s: out of memory while planning a redistribute", def->name);
        }
    }
    for (int o = def->inplace ? 1 : 0; o < c.nout; o++) {
        made[o]->id = act_runtime_new_tensor_id();
        made[o]->epoch = act_runtime_epoch();
    }
    s_compute_all(&c, mesh, op_index(def), n, ids, reads, made);
    for (int i = 0; i < n; i++) {
        if (ids[i] != own[i])
            act_runtime_free_now(mesh, ids[i]);
        if (pieced[i])
            act_runtime_free_now(mesh, own[i]);
    }
    act_runtime_end();
    if ((def->view || def->strided) && !def->inplace)
        s_lay_out(&c, in[0], made[0]);
    for (int o = 0; o < c.nout; o++)
        out[o] = made[o];
    return c.nout;
}
