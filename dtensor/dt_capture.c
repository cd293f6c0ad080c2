/* dt_capture — captured op sequences with DTensor handles: what a capture takes and returns
 * (shapes, dtypes, meshes, placements), checked on every replay, and the fresh handles a replay
 * returns. The recording and the records themselves are actors/controller/act_capture.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_capture.h"
#include "act_runtime.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dtn_capture.h"
#include "dtn_op.h"
#include "dtn_tensor.h"
#include "mb_schema.h"

/* What an input or output is, without holding its value. */
typedef struct {
    uint64_t id;                    /* the id inside the capture */
    dt_mesh *mesh;                  /* owned reference */
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    dt_placement placements[DT_MAX_DIMS];
} s_meta;

struct dt_capture {
    act_graph_ref *ref;
    int ninputs, noutputs;
    s_meta inputs[MB_MAX_IDS], outputs[MB_MAX_IDS];
    uint64_t written;               /* a bit per input its ops write in place */
};

/* the inputs of the capture running now (one at a time: act_capture refuses a second), and which of
 * them its ops write in place */
static s_meta s_inputs[MB_MAX_IDS];
static int s_ninputs;
static uint64_t s_written;
_Static_assert(MB_MAX_IDS <= 64, "a bit per input");

void dtn_capture_wrote(const dt_tensor *t)
{
    for (int i = 0; i < s_ninputs; i++)
        if (s_inputs[i].id == t->id)
            s_written |= (uint64_t)1 << i;
}

static void s_meta_of(s_meta *m, const dt_tensor *t)
{
    *m = (s_meta){.id = t->id, .mesh = dt_mesh_ref(t->mesh), .dtype = t->dtype, .ndim = t->ndim};
    memcpy(m->shape, t->shape, sizeof m->shape);
    memcpy(m->placements, t->placements, sizeof m->placements);
}

static void s_meta_clear(s_meta *m, int n)
{
    for (int i = 0; i < n; i++)
        dt_mesh_release(&m[i].mesh);
}

/* 0 when t can stand where m stood, else DT_EINVAL saying what differs. */
static int s_meta_check(const char *name, int i, const s_meta *m, const dt_tensor *t)
{
    char want[256], got[256];
    if (!dt_layout_same_mesh(m->mesh, t->mesh))
        return dt_err(DT_EINVAL, "replay of '%s': input %d lives on another mesh than the one it was captured with",
                      name, i);
    if (m->dtype != t->dtype)
        return dt_err(DT_EINVAL, "replay of '%s': input %d is %s, it was captured as %s (a new dtype is a new capture)",
                      name, i, dt_dtype_name(t->dtype), dt_dtype_name(m->dtype));
    if (m->ndim != t->ndim || memcmp(m->shape, t->shape, (size_t)m->ndim * sizeof *m->shape) != 0) {
        dt_layout_format_shape(t->ndim, t->shape, got, sizeof got);
        dt_layout_format_shape(m->ndim, m->shape, want, sizeof want);
        return dt_err(DT_EINVAL, "replay of '%s': input %d has shape %s, it was captured with %s (a new shape is a "
                      "new capture)", name, i, got, want);
    }
    if (memcmp(m->placements, t->placements, (size_t)t->mesh->ndim * sizeof *m->placements) != 0) {
        dt_layout_format_placements(t->mesh->ndim, t->placements, got, sizeof got);
        dt_layout_format_placements(m->mesh->ndim, m->placements, want, sizeof want);
        return dt_err(DT_EINVAL, "replay of '%s': input %d has placements %s, it was captured with %s", name, i, got,
                      want);
    }
    return 0;
}

bool dt_capture_made(const dt_tensor *t) { return t && act_capture_made(t->epoch); }

int dt_capture_begin(const char *name, dt_tensor *const *inputs, int ninputs)
{
    if (ninputs < 0 || ninputs > MB_MAX_IDS)
        return dt_err(DT_EUNSUPPORTED, "capture: %d tensor inputs; at most %d", ninputs, MB_MAX_IDS);
    for (int i = 0; i < ninputs; i++) {
        if (!inputs[i])
            return dt_err(DT_EINVAL, "capture: input %d is missing", i);
        /* the captured records name the inputs' pieces, which a view made on the controller lacks */
        int rc = act_runtime_check_live("capture", inputs[i]->epoch);
        if (rc != 0 || (rc = dtn_op_settle(inputs[i], "capture")) != 0 || (rc = dtn_op_unshare(inputs[i], "capture")) != 0)
            return rc;
    }
    int rc = act_capture_begin(name);
    if (rc != 0)
        return rc;
    s_meta_clear(s_inputs, s_ninputs);
    for (int i = 0; i < ninputs; i++)
        s_meta_of(&s_inputs[i], inputs[i]);
    s_ninputs = ninputs;
    s_written = 0;
    return 0;
}

void dt_capture_abort(void)
{
    act_capture_abort();
    s_meta_clear(s_inputs, s_ninputs);
    s_ninputs = 0;
}

int dt_capture_end(dt_tensor *const *outputs, int noutputs, dt_capture **out)
{
    *out = NULL;
    uint64_t ins[MB_MAX_IDS], outs[MB_MAX_IDS];
    int rc = 0;
    if (noutputs < 0 || noutputs > MB_MAX_IDS)
        rc = dt_err(DT_EUNSUPPORTED, "capture: %d tensor outputs; at most %d", noutputs, MB_MAX_IDS);
    for (int o = 0; rc == 0 && o < noutputs; o++) {
        const dt_tensor *t = outputs[o];
        if (!t || !act_capture_made(t->epoch) || !act_runtime_epoch_live(t->epoch))
            rc = dt_err(DT_EINVAL, "capture: output %d was not made inside this capture", o);
        for (int p = 0; rc == 0 && p < o; p++)
            if (outputs[p]->id == t->id)
                rc = dt_err(DT_EINVAL, "capture: outputs %d and %d are the same tensor", p, o);
        if (rc == 0)
            outs[o] = t->id;
    }
    dt_capture *g = rc == 0 ? calloc(1, sizeof *g) : NULL;
    if (rc == 0 && !g)
        rc = dt_err(DT_ENOMEM, "capture: out of memory");
    if (rc != 0) {
        dt_capture_abort();
        return rc;
    }
    for (int i = 0; i < s_ninputs; i++)
        ins[i] = s_inputs[i].id;
    if ((rc = act_capture_end(ins, s_ninputs, outs, noutputs, &g->ref)) != 0) {
        free(g);
        dt_capture_abort();
        return rc;
    }
    memcpy(g->inputs, s_inputs, (size_t)s_ninputs * sizeof *s_inputs); /* the mesh references move */
    g->ninputs = s_ninputs;
    g->written = s_written;
    s_ninputs = 0;
    for (int o = 0; o < noutputs; o++)
        s_meta_of(&g->outputs[o], outputs[o]);
    g->noutputs = noutputs;
    *out = g;
    return 0;
}

int dt_capture_replay(dt_capture *g, dt_tensor *const *inputs, int ninputs, dt_tensor **outputs)
{
    const char *name = g->ref->name;
    if (ninputs != g->ninputs)
        return dt_err(DT_EINVAL, "replay of '%s': %d tensor inputs, it was captured with %d", name, ninputs,
                      g->ninputs);
    uint64_t ins[MB_MAX_IDS];
    for (int i = 0; i < ninputs; i++) {
        int rc;
        if (!inputs[i])
            return dt_err(DT_EINVAL, "replay of '%s': input %d is missing", name, i);
        if ((rc = act_runtime_check_live(name, inputs[i]->epoch)) != 0 ||
            (rc = s_meta_check(name, i, &g->inputs[i], inputs[i])) != 0 || (rc = dtn_op_settle(inputs[i], name)) != 0)
            return rc;
        /* an input the replay writes in place is written as an op would write it (dt_op_run) */
        if ((g->written >> i) & 1 && (rc = dtn_op_written(inputs[i], name)) != 0)
            return rc;
        ins[i] = inputs[i]->id;
    }
    dt_tensor *made[MB_MAX_IDS];
    for (int o = 0; o < g->noutputs; o++) {
        const s_meta *m = &g->outputs[o];
        if (!(made[o] = dtn_tensor_alloc())) {
            for (int p = 0; p < o; p++)
                dt_tensor_release(&made[p]);   /* no id yet: nothing to free on the devices */
            return dt_err(DT_ENOMEM, "replay of '%s': out of memory", name);
        }
        made[o]->mesh = dt_mesh_ref(m->mesh);
        made[o]->dtype = m->dtype;
        made[o]->ndim = m->ndim;
        memcpy(made[o]->shape, m->shape, sizeof m->shape);
        memcpy(made[o]->placements, m->placements, sizeof m->placements);
    }
    uint64_t base;
    int rc = act_capture_replay(g->ref, ins, ninputs, &base);
    for (int o = 0; o < g->noutputs; o++) {
        if (rc == 0) {
            made[o]->id = base + (g->outputs[o].id - g->ref->tensor_lo);
            made[o]->epoch = g->ref->epoch;
        }
        outputs[o] = made[o];
        if (rc != 0)
            dt_tensor_release(&outputs[o]); /* no id yet: nothing to free on the devices */
    }
    return rc;
}

int dt_capture_ninputs(const dt_capture *g) { return g->ninputs; }
int dt_capture_noutputs(const dt_capture *g) { return g->noutputs; }
uint64_t dt_capture_nrecords(const dt_capture *g) { return g->ref->nrecords; }
int dt_capture_ndevices(const dt_capture *g) { return g->ref->ndevices; }

void dt_capture_release(dt_capture **gp)
{
    dt_capture *g = *gp;
    *gp = NULL;
    if (!g)
        return;
    act_capture_drop(&g->ref);
    s_meta_clear(g->inputs, g->ninputs);
    s_meta_clear(g->outputs, g->noutputs);
    free(g);
}
