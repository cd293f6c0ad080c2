/* dt_redistribute — laying a DTensor out anew. The planner (dtn_plan) decides the steps; this
 * turns each step into records: SENDs to the devices that hold needed regions, then one
 * ASSEMBLE per destination device, which waits for its regions and builds its piece. Tensor
 * data never passes through the controller. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_capture.h"
#include "act_runtime.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dtn_op.h"
#include "dtn_plan.h"
#include "dtn_redistribute.h"
#include "dtn_tensor.h"
#include "mb_schema.h"

static const char *s_reduce_names[] = {"sum", "avg", "max", "min"};

static void s_placement_str(dt_placement p, char *buf, size_t size)
{
    if (p.kind == DT_SHARD)
        snprintf(buf, size, "Shard(dim=%d)", p.dim);
    else if (p.kind == DT_REPLICATE)
        snprintf(buf, size, "Replicate()");
    else
        snprintf(buf, size, "Partial(%s)", s_reduce_names[p.reduce_op & 3]);
}

/* Whether reducing with a then b gives what b then a gives: the same op, or sum and avg (linear)
 * on floats (avg over integers truncates, so there the order shows). */
static bool s_commute(int a, int b, dt_dtype dtype)
{
    bool linear_a = a == DT_REDUCE_SUM || a == DT_REDUCE_AVG, linear_b = b == DT_REDUCE_SUM || b == DT_REDUCE_AVG;
    return a == b || (linear_a && linear_b && dt_dtype_is_float(dtype));
}

/* Checks a request and fills the source and target layouts. */
static int s_check(const char *op, dt_tensor *t, dt_mesh *mesh, const dt_placement *placements, dtn_layout *src,
                   dtn_layout *dst)
{
    if (!t)
        return dt_err(DT_EINVAL, "%s: no tensor", op);
    if (!placements)
        return dt_err(DT_EINVAL, "%s: placements is needed for redistribute!", op);
    if (!mesh)
        mesh = t->mesh;
    if (strcmp(mesh->device_type, t->mesh->device_type) != 0)
        return dt_err(DT_EINVAL, "%s: the target mesh is of device type '%s' but the tensor lives on '%s'", op,
                      mesh->device_type, t->mesh->device_type);
    src->mesh = t->mesh;
    memcpy(src->pl, t->placements, sizeof src->pl);
    dst->mesh = mesh;
    if (dt_layout_check_placements(op, mesh->ndim, placements, t->ndim, dst->pl) != 0)
        return dt_last_error_code();
    bool same_mesh = mesh == t->mesh || (mesh->ndim == t->mesh->ndim && mesh->size == t->mesh->size &&
                                         !memcmp(mesh->shape, t->mesh->shape, (size_t)mesh->ndim * sizeof *mesh->shape) &&
                                         !memcmp(mesh->ids, t->mesh->ids, (size_t)mesh->size * sizeof *mesh->ids));
    for (int i = 0; i < mesh->ndim; i++) {
        if (dst->pl[i].kind != DT_PARTIAL)
            continue;
        if (same_mesh && !memcmp(&src->pl[i], &dst->pl[i], sizeof dst->pl[i]))
            continue;
        char from[32] = "(another mesh)", to[32];
        if (same_mesh)
            s_placement_str(src->pl[i], from, sizeof from);
        s_placement_str(dst->pl[i], to, sizeof to);
        return dt_err(DT_EUNSUPPORTED,
                      "%s: Can not redistribute from %s to %s on mesh dim %d, redistributing to Partial is for "
                      "internal use only!", op, from, to, i);
    }
    /* The value of several Partial mesh dims is the outer op over the inner ones. Reducing an outer
     * Partial while keeping an inner one computes outer-of-contributions then inner, which is the
     * same value only when the two reductions commute. */
    for (int i = 0; same_mesh && i < mesh->ndim; i++) {
        if (src->pl[i].kind != DT_PARTIAL || !memcmp(&src->pl[i], &dst->pl[i], sizeof dst->pl[i]))
            continue;
        for (int j = i + 1; j < mesh->ndim; j++) {
            if (dst->pl[j].kind != DT_PARTIAL || s_commute(src->pl[i].reduce_op, dst->pl[j].reduce_op, t->dtype))
                continue;
            char outer[32], inner[32];
            s_placement_str(src->pl[i], outer, sizeof outer);
            s_placement_str(dst->pl[j], inner, sizeof inner);
            return dt_err(DT_EUNSUPPORTED,
                          "%s: cannot reduce %s on mesh dim %d while keeping %s on mesh dim %d: the value is the "
                          "outer reduction of the inner one and these two do not commute; reduce mesh dim %d too",
                          op, outer, i, inner, j, j);
        }
    }
    /* the target's pieces, and a view's own (made for the steps to read) must fit */
    if (dtn_check_fits(op, mesh, t->ndim, t->shape, dst->pl, t->dtype) != 0 ||
        (t->base && dtn_check_fits(op, t->mesh, t->ndim, t->shape, t->placements, t->dtype) != 0))
        return dt_last_error_code();
    return act_runtime_check_live(op, t->epoch);
}

static bool s_remote(const dtn_piece *pc, const dtn_part *part)
{
    return part->mode != MB_PART_DIV && part->src_device != pc->device;
}

/* Emits every step of plan for t (lock held); the last step makes out->id (into: writes the
 * pieces out already has). */
static void s_emit(const dt_tensor *t, const dtn_plan *plan, const dt_tensor *out, bool into)
{
    int ndim = t->ndim;
    uint64_t src_id = t->id;
    for (int s = 0; s < plan->nsteps; s++) {
        const dtn_step *step = &plan->steps[s];
        bool last = s == plan->nsteps - 1;
        uint64_t out_id = last ? out->id : act_runtime_new_tensor_id();
        /* every SEND of the step goes before any ASSEMBLE: a device never waits for a region it
         * still has to send, so no cycle of waits can form */
        uint64_t first_transfer = 0, k = 0;
        for (int p = 0; p < step->npieces; p++) {
            const dtn_piece *pc = &step->pieces[p];
            for (int q = 0; q < pc->nparts; q++) {
                const dtn_part *part = &pc->parts[q];
                if (!s_remote(pc, part))
                    continue;
                uint64_t transfer = act_runtime_new_transfer_id();
                if (k++ == 0)
                    first_transfer = transfer;
                mb_encode_send(act_runtime_record(part->src_device), src_id, transfer, pc->device, ndim,
                               part->src_offset, ndim, part->shape);
            }
        }
        k = 0;
        for (int p = 0; p < step->npieces; p++) {
            const dtn_piece *pc = &step->pieces[p];
            mb_writer *pk = act_runtime_record(pc->device);
            mb_encode_assemble(pk, out_id, t->dtype, ndim, pc->shape, src_id, into && last, (uint32_t)pc->nparts);
            for (int q = 0; q < pc->nparts; q++) {
                const dtn_part *part = &pc->parts[q];
                /* transfer ids of a step were taken in this order above, one after another */
                mb_encode_part(pk, (mb_part_mode)part->mode, (dt_reduce_op)part->op, part->src_device,
                               s_remote(pc, part) ? first_transfer + k++ : 0, ndim, part->src_offset, ndim,
                               part->dst_offset, ndim, part->shape, part->divisor);
            }
        }
        if (s > 0) {
            /* the previous step's pieces are intermediates: free them once they are sent */
            const dt_mesh *m = step->from.mesh;
            for (int64_t i = 0; i < m->size; i++)
                mb_encode_free(act_runtime_record(m->ids[i]), src_id);
        }
        src_id = out_id;
    }
}

/* t's value into out, which has t's layout already (lock held): each device copies its own piece. */
static void s_emit_copy(const dt_tensor *t, const dt_tensor *out)
{
    const dt_mesh *m = t->mesh;
    int64_t coord[DT_MAX_DIMS], shape[DT_MAX_DIMS], offset[DT_MAX_DIMS], origin[DT_MAX_DIMS] = {0};
    for (int64_t d = 0; d < m->size; d++) {
        dt_layout_coord(m->ndim, m->shape, d, coord);
        dt_layout_block(m->ndim, m->shape, coord, t->placements, t->ndim, t->shape, shape, offset);
        mb_writer *pk = act_runtime_record(m->ids[d]);
        mb_encode_assemble(pk, out->id, t->dtype, t->ndim, shape, t->id, true, 1);
        mb_encode_part(pk, MB_PART_COPY, DT_REDUCE_SUM, m->ids[d], 0, t->ndim, origin, t->ndim, origin, t->ndim, shape,
                       0);
    }
}

/* Whether a and b read the same pieces: one is the other, or a view made on the controller of it
 * (or both of one base). */
static bool s_overlap(const dt_tensor *a, const dt_tensor *b)
{
    const dt_tensor *ba = a->base ? a->base : a, *bb = b->base ? b->base : b;
    return ba == bb;
}

/* The checks of redistribute_into's destinations, and each one readied for a write in place:
 * pieces of its own, and its live views left the pieces they read (outside any session). */
static int s_ready_into(const char *op, int n, dt_tensor *const *ts, dt_tensor *const *dst)
{
    if (act_capture_active())
        return dt_err(DT_EUNSUPPORTED, "%s: not inside dtorch.capture() (redistribute into fresh tensors there)", op);
    for (int i = 0; i < n; i++) {
        dt_tensor *t = ts[i], *o = dst[i];
        if (!t || !o)
            return dt_err(DT_EINVAL, "%s: tensor %d or its destination is missing", op, i);
        if (o->dtype != t->dtype)
            return dt_err(DT_ETYPE, "%s: tensor %d is %s but its destination is %s (cast it first)", op, i,
                          dt_dtype_name(t->dtype), dt_dtype_name(o->dtype));
        bool same = o->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = o->shape[d] == t->shape[d];
        if (!same) {
            char want[160], got[160];
            dt_layout_format_sizes(want, sizeof want, t->ndim, t->shape);
            dt_layout_format_sizes(got, sizeof got, o->ndim, o->shape);
            return dt_err(DT_EINVAL, "%s: tensor %d has shape %s but its destination has shape %s", op, i, want, got);
        }
        for (int j = 0; j < n; j++)
            if (ts[j] && s_overlap(ts[j], o))
                return dt_err(DT_EINVAL, "%s: destination %d reads the same pieces as tensor %d, which is "
                              "redistributed in this call", op, i, j);
        for (int j = 0; j < i; j++)
            if (s_overlap(dst[j], o))
                return dt_err(DT_EINVAL, "%s: destinations %d and %d read the same pieces", op, j, i);
    }
    for (int i = 0; i < n; i++) {
        int rc = dtn_op_settle(dst[i], op);
        if (rc != 0 || (rc = dtn_op_written(dst[i], op)) != 0)
            return rc;
    }
    return 0;
}

/* Redistributes n tensors under one lock so their records and transfers travel together: into
 * new tensors out[] (in mesh with placements pl, or each in its own), or with into into the
 * tensors out[] holds (each's mesh and placements), in place. */
static int s_redistribute(const char *op, int n, dt_tensor *const *ts, dt_mesh *mesh, const dt_placement *pl,
                          dt_tensor **out, bool into)
{
    if (into && s_ready_into(op, n, ts, out) != 0)
        return dt_last_error_code();
    dtn_plan *plans = calloc((size_t)(n ? n : 1), sizeof *plans);
    if (!plans)
        return dt_err(DT_ENOMEM, "%s: out of memory", op);
    int rc = 0, made = 0;
    for (int i = 0; i < n && !into; i++)
        out[i] = NULL;
    for (; made < n; made++) {
        dt_tensor *t = ts[made];
        dt_mesh *target = into ? out[made]->mesh : mesh ? mesh : t ? t->mesh : NULL;
        const dt_placement *want = into     ? out[made]->placements
                                   : target ? pl + (size_t)made * (size_t)target->ndim
                                            : NULL;
        dtn_layout src, dst;
        if ((rc = s_check(op, t, target, want, &src, &dst)) != 0)
            goto fail;
        if ((rc = dtn_plan_make(t->ndim, t->shape, dt_dtype_size(t->dtype), &src, &dst, &plans[made])) != 0)
            goto fail;
        if (into)
            continue; /* out[made] is the caller's */
        if (plans[made].nsteps == 0) {
            out[made] = dt_tensor_ref(t);
            continue;
        }
        dt_tensor *o = dtn_tensor_alloc();
        if (!o) {
            rc = dt_err(DT_ENOMEM, "%s: out of memory", op);
            goto fail;
        }
        o->mesh = dt_mesh_ref(target);
        o->dtype = t->dtype;
        o->ndim = t->ndim;
        memcpy(o->shape, t->shape, sizeof o->shape);
        memcpy(o->placements, dst.pl, sizeof o->placements);
        out[made] = o;
    }
    dt_mesh **meshes = malloc((size_t)(2 * n + 1) * sizeof *meshes);
    if (!meshes) {
        rc = dt_err(DT_ENOMEM, "%s: out of memory", op);
        goto fail;
    }
    int nmeshes = 0;
    for (int i = 0; i < n; i++)
        if (into || out[i] != ts[i]) {
            meshes[nmeshes++] = ts[i]->mesh;
            meshes[nmeshes++] = out[i]->mesh;
        }
    if (nmeshes > 0 && (rc = act_runtime_begin(op, meshes, nmeshes)) != 0) {
        free(meshes);
        goto fail;
    }
    free(meshes);
    if (nmeshes > 0) {
        for (int i = 0; i < n && into; i++)
            if ((rc = act_runtime_check_live(op, out[i]->epoch)) != 0) {
                act_runtime_end();
                goto fail;
            }
        for (int i = 0; i < n; i++) {
            if (!into && out[i] == ts[i])
                continue;
            if ((rc = act_runtime_check_live(op, ts[i]->epoch)) != 0) {
                act_runtime_end();
                goto fail;
            }
            if (!into) {
                out[i]->id = act_runtime_new_tensor_id();
                out[i]->epoch = act_runtime_epoch();
            }
            dt_tensor piece = *ts[i];
            if (ts[i]->base) {
                /* a view made on the controller: pieces of its own for the steps to read, freed after */
                piece.id = dtn_op_view_piece(ts[i]);
                piece.base = NULL;
            }
            if (plans[i].nsteps > 0)
                s_emit(&piece, &plans[i], out[i], into);
            else
                s_emit_copy(&piece, out[i]);
            if (ts[i]->base)
                act_runtime_free_now(ts[i]->mesh, piece.id);
        }
        act_runtime_end();
    }
    for (int i = 0; i < n; i++)
        dtn_plan_free(&plans[i]);
    free(plans);
    return 0;
fail:
    for (int i = 0; i < n; i++) {
        dtn_plan_free(&plans[i]);
        if (!into)
            dt_tensor_release(&out[i]);
    }
    free(plans);
    return rc;
}

dt_tensor *dt_redistribute(dt_tensor *t, dt_mesh *mesh, const dt_placement *placements)
{
    dt_tensor *out = NULL;
    s_redistribute("redistribute", 1, &t, mesh, placements, &out, false);
    return out;
}

int dt_redistribute_many(int n, dt_tensor *const *tensors, dt_mesh *mesh, const dt_placement *placements,
                         dt_tensor **out)
{
    if (n < 0)
        return dt_err(DT_EINVAL, "redistribute_many: negative count");
    return s_redistribute("redistribute_many", n, tensors, mesh, placements, out, false);
}

int dt_redistribute_into(int n, dt_tensor *const *tensors, dt_tensor *const *dst)
{
    if (n < 0)
        return dt_err(DT_EINVAL, "redistribute_into: negative count");
    return s_redistribute("redistribute_into", n, tensors, NULL, NULL, (dt_tensor **)dst, true);
}

int dt_redistribute_plan(dt_tensor *t, dt_mesh *mesh, const dt_placement *placements, dt_plan_step *steps, int max)
{
    dtn_layout src, dst;
    int rc = s_check("redistribute", t, mesh ? mesh : t ? t->mesh : NULL, placements, &src, &dst);
    dtn_plan plan;
    if (rc != 0 || (rc = dtn_plan_make(t->ndim, t->shape, dt_dtype_size(t->dtype), &src, &dst, &plan)) != 0)
        return rc;
    for (int s = 0; s < plan.nsteps && s < max; s++) {
        snprintf(steps[s].kind, sizeof steps[s].kind, "%s", plan.steps[s].kind);
        steps[s].mesh_dim = plan.steps[s].mesh_dim;
        steps[s].remote_elements = plan.steps[s].remote_elements;
    }
    int n = plan.nsteps;
    dtn_plan_free(&plan);
    return n;
}

uint64_t dtn_redistribute_inline(const dt_tensor *t, const dt_placement *placements, int *nsteps)
{
    dtn_layout src = {t->mesh, {{0}}}, dst = {t->mesh, {{0}}};
    memcpy(src.pl, t->placements, sizeof src.pl);
    memcpy(dst.pl, placements, (size_t)t->mesh->ndim * sizeof *placements);
    dtn_plan plan;
    *nsteps = 0;
    if (dtn_plan_make(t->ndim, t->shape, dt_dtype_size(t->dtype), &src, &dst, &plan) != 0)
        return 0;
    uint64_t id = t->id;
    if (plan.nsteps > 0) {
        dt_tensor out = {.id = act_runtime_new_tensor_id()};
        s_emit(t, &plan, &out, false);
        id = out.id;
        *nsteps = plan.nsteps;
    }
    dtn_plan_free(&plan);
    return id;
}

int64_t dtn_redistribute_cost(const dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype,
                              const dt_placement *from, const dt_placement *to)
{
    dtn_layout src = {mesh, {{0}}}, dst = {mesh, {{0}}};
    memcpy(src.pl, from, (size_t)mesh->ndim * sizeof *from);
    memcpy(dst.pl, to, (size_t)mesh->ndim * sizeof *to);
    dtn_plan plan;
    if (dtn_plan_make(ndim, shape, dt_dtype_size(dtype), &src, &dst, &plan) != 0)
        return INT64_MAX;
    int64_t elements = 0;
    for (int s = 0; s < plan.nsteps; s++)
        elements += plan.steps[s].remote_elements;
    dtn_plan_free(&plan);
    return elements * (int64_t)dt_dtype_size(dtype);
}
