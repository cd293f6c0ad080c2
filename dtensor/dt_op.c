/* dt_op — running a registered op on DTensors. Everything about the call is settled here, on
 * the user's thread: arguments and shapes (infer), placements (shard), and the redistributes an
 * input needs first. Each device then gets one COMPUTE record naming the op, its local output
 * shapes and its inputs; workers never re-infer. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_runtime.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dtn_op.h"
#include "dtn_plan.h"
#include "dtn_redistribute.h"
#include "dtn_tensor.h"
#include "mb_schema.h"
#include "op_registry.h"

static bool s_strict;

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
     * (the inputs' every field, and given attributes, are written below) */
    memset(c, 0, offsetof(op_call, in));
    if (!attrs)
        memset(&c->attrs, 0, sizeof c->attrs);
    memset(c->out, 0, sizeof c->out);
    c->def = def;
    c->mesh = in[0]->mesh;
    c->cost = dtn_redistribute_cost;
    c->mesh_ndim = in[0]->mesh->ndim;
    c->mesh_shape = in[0]->mesh->shape;
    c->nin = n;
    if (attrs)
        c->attrs = *attrs;
    for (int i = 0; i < n; i++) {
        if (!in[i])
            return dt_err(DT_EINVAL, "%s: input %d is missing", def->name, i);
        if (!dt_layout_same_mesh(in[i]->mesh, in[0]->mesh))
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
                             const int64_t *ctx, int nout, const dtn_out *outs)
{
    mb_encode_compute(pk, op, nin, ins, a->nints, a->ints, a->nfloats, a->floats, a->has_scalar ? &a->scalar : NULL,
                      nctx, ctx, (uint32_t)nout);
    for (int o = 0; o < nout; o++)
        mb_encode_out(pk, outs[o].id, outs[o].dtype, outs[o].ndim, outs[o].shape);
}

void dtn_op_compute(int64_t device, int op, int nin, const uint64_t *ins, const op_attrs *a, int nctx,
                    const int64_t *ctx, int nout, const dtn_out *outs)
{
    mb_writer *pk = act_runtime_record(device);
    act_runtime_note_op(device, op);
    s_encode_compute(pk, op, nin, ins, a, nctx, ctx, nout, outs);
}

/* The COMPUTE record of every device of mesh. Where each output is whole on every device (no
 * Shard) and a device's context is the first device's, its record is the same bytes: copied from
 * the first instead of encoded again. */
static void s_compute_all(const op_call *c, dt_mesh *mesh, int op, int nin, const uint64_t *ins,
                          dt_tensor *const *made)
{
    const op_def *def = c->def;
    bool whole = true;
    for (int o = 0; o < c->nout && whole; o++)
        for (int m = 0; m < mesh->ndim; m++)
            whole = whole && c->out[o].pl[m].kind != DT_SHARD;
    int64_t coord[DT_MAX_DIMS], offset[DT_MAX_DIMS], local[OP_MAX_OUTPUTS][DT_MAX_DIMS];
    int64_t ctx[OP_MAX_CTX], first_ctx[OP_MAX_CTX];
    int first_nctx = 0;
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
        size_t start = pk->size;
        s_encode_compute(pk, op, nin, ins, &c->attrs, nctx, ctx, c->nout, outs);
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

int dt_op_run(int id, int n, dt_tensor *const *in, const dt_op_attrs *attrs, int max_out, dt_tensor **out)
{
    const op_def *def = op_at(id);
    if (!def)
        return dt_err(DT_EINVAL, "unknown op id %d", id);
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
        atomic_init(&t->refs, 1);
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
    uint64_t ids[OP_MAX_INPUTS];
    for (int i = 0; i < n; i++) {
        int nsteps = 0;
        ids[i] = moves[i] ? dtn_redistribute_inline(in[i], c.want[i], &nsteps) : in[i]->id;
        if (ids[i] == 0) {
            /* planning ran out of memory: free the inputs already laid out, make nothing */
            for (int j = 0; j < i; j++)
                if (ids[j] != in[j]->id)
                    act_runtime_free_now(mesh, ids[j]);
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
    s_compute_all(&c, mesh, op_index(def), n, ids, made);
    for (int i = 0; i < n; i++)
        if (ids[i] != in[i]->id)
            act_runtime_free_now(mesh, ids[i]);
    act_runtime_end();
    for (int o = 0; o < c.nout; o++)
        out[o] = made[o];
    return c.nout;
}
