/* dt_tensor — DTensor handles: metadata on the controller, pieces on the devices. The last
 * release queues a free on every device; fetches ask each device for its own piece. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "act_capture.h"
#include "act_future.h"
#include "act_runtime.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dtn_op.h"
#include "dtn_tensor.h"
#include "mb_schema.h"

#define S_CACHE 256 /* handle structs, and strided views' maps, kept per thread for reuse */

static _Thread_local dt_tensor *s_cache[S_CACHE];
static _Thread_local int s_cached;
/* A strided view's map, kept for reuse as the handles are: made and dropped at every transpose */
static _Thread_local dtn_strided *s_strided_cache[S_CACHE];
static _Thread_local int s_strided_cached;

/* What a thread kept goes when it exits (a pool's threads come and go): the key's destructor runs
 * for a thread that set a value, once it has kept something; one that keeps more from a later
 * destructor sets it again, and runs it again. */
static pthread_key_t s_keeper;
static pthread_once_t s_keeper_once = PTHREAD_ONCE_INIT;
static bool s_keeper_made;
static _Thread_local bool s_keeping;

static void s_let_go(void *unused)
{
    (void)unused;
    s_keeping = false;
    while (s_cached > 0)
        free(s_cache[--s_cached]);
    while (s_strided_cached > 0)
        free(s_strided_cache[--s_strided_cached]);
}

static void s_make_keeper(void) { s_keeper_made = pthread_key_create(&s_keeper, s_let_go) == 0; }

/* Whether this thread may keep what it frees (its key set: nothing is kept that its exit would
 * not free). */
static bool s_may_keep(void)
{
    if (s_keeping)
        return true;
    pthread_once(&s_keeper_once, s_make_keeper);
    return s_keeping = s_keeper_made && pthread_setspecific(s_keeper, &s_keeping) == 0;
}

dt_tensor *dtn_tensor_alloc(void)
{
    dt_tensor *t = s_cached > 0 ? s_cache[--s_cached] : malloc(sizeof *t);
    if (t) {
        memset(t, 0, sizeof *t);
        atomic_init(&t->holds, 1);
    }
    return t;
}

void dtn_tensor_free(dt_tensor *t)
{
    if (s_cached < S_CACHE && s_may_keep())
        s_cache[s_cached++] = t;
    else
        free(t);
}

dtn_strided *dtn_strided_alloc(void)
{
    return s_strided_cached > 0 ? s_strided_cache[--s_strided_cached] : malloc(sizeof(dtn_strided));
}

void dtn_strided_free(dtn_strided *s)
{
    if (!s)
        return;
    if (s_strided_cached < S_CACHE && s_may_keep())
        s_strided_cache[s_strided_cached++] = s;
    else
        free(s);
}

dt_tensor *dt_tensor_ref(dt_tensor *t)
{
    atomic_fetch_add(&t->holds, 1);
    return t;
}

/* The views' bookkeeping on their bases (their count reaching 0 against a retire on another
 * thread) is two atomics: a write that retires pieces after the last view took retired finds them
 * left in retired, and the base's own release frees them. A view holds its base and counts itself
 * in one operation on base->holds, and borrows the base's mesh (the base holds it while the view
 * holds the base): a reference of its own would be two more atomic operations of every x[0]. */
dt_tensor *dtn_tensor_view(dt_tensor *base, uint64_t base_id, int64_t first, dt_dtype dtype, int ndim,
                           const int64_t *shape, const dt_placement *placements)
{
    /* the hold first: a locked operation waits for the stores before it to drain, and the handle's
     * are a few hundred bytes (the caller holds base, so an undo never frees it) */
    atomic_fetch_add(&base->holds, 1 + DTN_VIEW);
    dt_tensor *t = dtn_tensor_alloc();
    if (!t) {
        atomic_fetch_sub(&base->holds, 1 + DTN_VIEW);
        return NULL;
    }
    t->mesh = base->mesh;
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    memcpy(t->placements, placements, (size_t)base->mesh->ndim * sizeof *placements);
    t->base = base;
    t->base_id = base_id;
    t->view_first = first;
    t->epoch = base->epoch;
    return t;
}

bool dtn_tensor_viewed(dt_tensor *t) { return DTN_VIEWS(atomic_load(&t->holds)) > 0 && !atomic_load(&t->retired); }

void dtn_tensor_retire(dt_tensor *t, uint64_t old_id) { atomic_store(&t->retired, old_id); }

static void s_destroy(dt_tensor *t);

/* Drops view's hold on its base; its mesh, borrowed from the base, is left dangling (the caller
 * takes a reference of its own first, or is done with view). */
static void s_unview(dt_tensor *view)
{
    dt_tensor *base = view->base;
    /* the last view: the pieces a write left it go too. Looked at while this view still holds
     * base (once it lets go, another thread's last release may free base): no view made after the
     * write reads them, so a count of one view means none but this one does. Two views that go at
     * once both count two and leave them to base's own release, as a write that retires them after
     * the look does. (Loaded before the exchange, a locked operation: there are seldom any.) */
    uint64_t retired = atomic_load(&base->retired) && DTN_VIEWS(atomic_load(&base->holds)) == 1
                           ? atomic_exchange(&base->retired, 0)
                           : 0;
    if (retired)
        act_runtime_free(base->epoch, base->mesh, retired);
    uint64_t was = atomic_fetch_sub(&base->holds, 1 + DTN_VIEW); /* before the stores below (dtn_tensor_view) */
    view->base = NULL;
    dtn_strided_free(view->strided);
    view->strided = NULL;
    if (DTN_REFS(was) == 1)
        s_destroy(base);
}

void dtn_tensor_unview(dt_tensor *view)
{
    if (!view->base)
        return;
    view->mesh = dt_mesh_ref(view->mesh); /* its own from now on */
    if (view->noncontiguous && !view->layout) { /* the views made of it read on through its map */
        view->layout = view->strided;
        view->strided = NULL;
    }
    s_unview(view);
}

/* t's last reference is gone: its pieces, and the handle. */
static void s_destroy(dt_tensor *t)
{
    if (t->id)
        act_runtime_free(t->epoch, t->mesh, t->id);
    uint64_t retired = atomic_load(&t->retired);
    if (retired) /* left by a write racing the last view's release on another thread */
        act_runtime_free(t->epoch, t->mesh, retired);
    dtn_strided_free(t->layout);
    if (t->base) { /* a view made on the controller: its devices never heard of it */
        s_unview(t);
        t->mesh = NULL;
    } else {
        dt_mesh_release(&t->mesh);
    }
    dtn_tensor_free(t);
}

void dt_tensor_release(dt_tensor **tp)
{
    dt_tensor *t = *tp;
    *tp = NULL;
    if (!t)
        return;
    /* the only reference, and no views (they hold one each): no other thread can reach t to take
     * one, so it goes without a locked operation (most of a short-lived view's release) */
    if (atomic_load_explicit(&t->holds, memory_order_acquire) == 1 || DTN_REFS(atomic_fetch_sub(&t->holds, 1)) == 1)
        s_destroy(t);
}

int dt_tensor_ndim(const dt_tensor *t) { return t->ndim; }
const int64_t *dt_tensor_shape(const dt_tensor *t) { return t->shape; }
int64_t dt_tensor_numel(const dt_tensor *t) { return dt_layout_numel(t->ndim, t->shape); }
dt_dtype dt_tensor_dtype(const dt_tensor *t) { return t->dtype; }
dt_mesh *dt_tensor_mesh(const dt_tensor *t) { return t->mesh; }
const dt_placement *dt_tensor_placements(const dt_tensor *t) { return t->placements; }

/* Decided when the view is made, as torch's view would be (through dt_tensor.layout where the
 * placements made a copy or its input has one): a fetch or a gather that gives it pieces of its
 * own later does not change what it is (torch's x[:, 0] is never contiguous). */
bool dt_tensor_is_contiguous(const dt_tensor *t) { return !t->noncontiguous; }

int dt_tensor_local_block(const dt_tensor *t, int64_t mesh_index, int64_t *shape, int64_t *offset)
{
    if (mesh_index < 0 || mesh_index >= t->mesh->size)
        return dt_err(DT_EINDEX, "local block: mesh index %lld out of range [0, %lld)", (long long)mesh_index,
                      (long long)t->mesh->size);
    int64_t coord[DT_MAX_DIMS];
    dt_layout_coord(t->mesh->ndim, t->mesh->shape, mesh_index, coord);
    dt_layout_block(t->mesh->ndim, t->mesh->shape, coord, t->placements, t->ndim, t->shape, shape, offset);
    return 0;
}

/* Whether the device at coord holds a piece the full value needs: replicas beyond the first
 * along Replicate mesh dims hold copies and are not asked. */
static bool s_needed(const dt_tensor *t, const int64_t *coord)
{
    for (int i = 0; i < t->mesh->ndim; i++)
        if (t->placements[i].kind == DT_REPLICATE && coord[i] != 0)
            return false;
    return true;
}

static dt_future *s_fetch(dt_tensor *t, act_future_kind kind, const char *op)
{
    if (act_runtime_check_live(op, t->epoch) != 0 || (!act_capture_active() && dtn_op_settle(t, op) != 0))
        return NULL;
    dt_mesh *mesh = t->mesh;
    int64_t coord[DT_MAX_DIMS];
    int npieces = 0;
    for (int64_t i = 0; i < mesh->size; i++) {
        dt_layout_coord(mesh->ndim, mesh->shape, i, coord);
        npieces += kind == ACT_FETCH_LOCALS || s_needed(t, coord);
    }
    dt_future *f = act_future_new(kind, npieces);
    if (!f) {
        dt_err(DT_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    f->dtype = t->dtype;
    f->ndim = t->ndim;
    memcpy(f->shape, t->shape, sizeof f->shape);
    f->mesh_ndim = mesh->ndim;
    memcpy(f->mesh_shape, mesh->shape, sizeof f->mesh_shape);
    memcpy(f->placements, t->placements, sizeof f->placements);
    for (int i = 0; i < mesh->ndim; i++)
        f->has_partial |= t->placements[i].kind == DT_PARTIAL;
    for (int64_t i = 0, p = 0; i < mesh->size; i++) {
        dt_layout_coord(mesh->ndim, mesh->shape, i, coord);
        if (kind != ACT_FETCH_LOCALS && !s_needed(t, coord))
            continue;
        act_piece *pc = &f->pieces[p++];
        pc->device = mesh->ids[i];
        pc->mesh_index = i;
        dt_layout_block(mesh->ndim, mesh->shape, coord, t->placements, t->ndim, t->shape, pc->shape, pc->offset);
    }
    if (kind == ACT_FETCH_FULL && act_future_alloc_value(f) != 0) {
        dt_future_release(&f);
        dt_err(DT_ENOMEM, "%s: out of memory for a value of %lld elements", op, (long long)dt_tensor_numel(t));
        return NULL;
    }
    if (act_runtime_begin(op, &mesh, 1) != 0) {
        dt_future_release(&f);
        return NULL;
    }
    if (act_capture_refuse(op) != 0 || act_runtime_check_live(op, t->epoch) != 0 || act_runtime_track(f) != 0) {
        act_runtime_end();
        dt_future_release(&f);
        return NULL;
    }
    act_runtime_urgent();
    for (int p = 0; p < npieces; p++)
        mb_encode_fetch(act_runtime_record(f->pieces[p].device), t->id, f->id, p);
    act_runtime_end();
    return f;
}

dt_future *dt_tensor_fetch(dt_tensor *t) { return s_fetch(t, ACT_FETCH_FULL, "fetch"); }

dt_future *dt_tensor_fetch_locals(dt_tensor *t) { return s_fetch(t, ACT_FETCH_LOCALS, "to_local"); }
