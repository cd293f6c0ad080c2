/* act_worker_storage — the memory of a device's pieces: storage records with their references, the
 * buffers and records a worker keeps for reuse, and the tensor table that names them by id,
 * counting the bytes in use. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_worker.h"
#include "dt_error.h"
#include "dt_pool.h"
#include "dt_shm.h"
#include "mb_schema.h"
#include "op_backend.h"

/* The worker whose thread this is, between act_storage_open and act_storage_close: its spare lists
 * are touched by this thread alone. A storage let go on any other thread (a frame's free callback,
 * a peer thread done reading) goes back to malloc. */
static _Thread_local act_worker *s_self;

void act_storage_open(act_worker *w) { s_self = w; }

void act_storage_close(act_worker *w)
{
    if (s_self == w)
        s_self = NULL; /* storage let go from now on goes back to malloc */
    for (int k = 0; k < (int)(ACT_SMALL_MAX / ACT_SMALL_STEP); k++)
        while (w->nsmall[k] > 0)
            w->backend->free(w->small[k][--w->nsmall[k]], (k + 1) * ACT_SMALL_STEP);
    while (w->nspare_storage > 0)
        free(w->spare_storage[--w->nspare_storage]);
}

act_storage *act_storage_alloc(void)
{
    act_worker *w = s_self;
    act_storage *st;
    if (w && w->nspare_storage > 0) {
        st = w->spare_storage[--w->nspare_storage];
        memset(st, 0, sizeof *st);
    } else if (!(st = calloc(1, sizeof *st))) {
        return NULL;
    }
    atomic_init(&st->refs, 1);
    return st;
}

static void s_storage_free(act_storage *st)
{
    act_worker *w = s_self;
    if (w && w->nspare_storage < ACT_SPARE_TENSORS)
        w->spare_storage[w->nspare_storage++] = st;
    else
        free(st);
}

/* The bytes a piece of size bytes gets from its backend: small ones rounded up to their size class
 * (ACT_SMALL_STEP), so that any piece of the class can reuse the buffer. */
static size_t s_capacity(size_t size)
{
    return size == 0 || size > ACT_SMALL_MAX ? size : (size + ACT_SMALL_STEP - 1) / ACT_SMALL_STEP * ACT_SMALL_STEP;
}

/* Which of w's spare lists of small buffers a piece of size bytes of backend uses (-1: none). Host
 * memory only (adopt_host): a GPU's buffer goes back through its backend, which orders the free
 * after the streams that may still read it. */
static int s_small_class(const act_worker *w, const op_backend *backend, size_t size)
{
    bool kept = w && w->backend == backend && backend->adopt_host && size > 0 && size <= ACT_SMALL_MAX;
    return kept ? (int)((size - 1) / ACT_SMALL_STEP) : -1;
}

void act_storage_release(act_storage *st)
{
    if (!st || atomic_fetch_sub(&st->refs, 1) != 1)
        return;
    act_worker *w = s_self;
    int k;
    if (st->seg)
        dt_shm_seg_free(st->seg);
    else if (st->adopted)
        zmq_msg_close(&st->msg);
    else if (st->owner != w && st->backend->free_elsewhere)
        st->backend->free_elsewhere(st->data, s_capacity(st->size));
    else if ((k = s_small_class(w, st->backend, st->size)) >= 0 && w->nsmall[k] < ACT_SMALL_KEEP)
        w->small[k][w->nsmall[k]++] = st->data;
    else
        st->backend->free(st->data, s_capacity(st->size));
    s_storage_free(st);
}

void act_storage_free_fn(void *data, void *hint) { act_storage_release(hint); }

act_storage *act_storage_new(const op_backend *backend, size_t size)
{
    act_storage *st = act_storage_alloc();
    if (!st)
        return NULL;
    act_worker *w = s_self;
    int k = s_small_class(w, backend, size);
    if (k >= 0 && w->nsmall[k] > 0)
        st->data = w->small[k][--w->nsmall[k]];
    else if (!(st->data = backend->alloc(s_capacity(size)))) {
        s_storage_free(st);
        return NULL;
    }
    st->size = size;
    st->backend = backend;
    st->owner = s_self;
    st->huge = backend->alloc == dt_pool_alloc && dt_pool_advised(st->data, size);
    return st;
}

act_storage *act_storage_piece(const act_worker *w, size_t size)
{
    act_storage *st = size > ACT_SMALL_MAX ? act_shm_storage_new(w, size) : NULL;
    return st ? st : act_storage_new(w->backend, size);
}

act_storage *act_storage_adopt(zmq_msg_t *frame)
{
    act_storage *st = act_storage_alloc();
    if (!st)
        return NULL;
    zmq_msg_init(&st->msg);
    zmq_msg_move(&st->msg, frame);
    st->adopted = true;
    st->data = zmq_msg_data(&st->msg);
    st->size = zmq_msg_size(&st->msg);
    return st;
}

const char *act_copy_bytes(op_copy_fn copy, void *dst, const void *src, size_t size)
{
    return copy(dst, (const int64_t[]){1}, src, (const int64_t[]){1}, 1, (const int64_t[]){(int64_t)size}, 1);
}

act_wtensor *act_wtensor_new(act_worker *w)
{
    if (w->nspare == 0)
        return calloc(1, sizeof(act_wtensor));
    act_wtensor *t = w->spare[--w->nspare];
    memset(t, 0, sizeof *t);
    return t;
}

void act_wtensor_free(act_worker *w, act_wtensor *t)
{
    if (!t)
        return;
    act_storage_release(t->storage);
    free(t->error);
    if (w->nspare < ACT_SPARE_TENSORS)
        w->spare[w->nspare++] = t;
    else
        free(t);
}

/* A table entry starts or stops using st: bytes_in_use counts each storage once, however many
 * entries share it. */
static void s_hold(act_worker *w, act_storage *st)
{
    if (st && st->held++ == 0) {
        int64_t *stats = w->stats;
        stats[MB_STAT_bytes_in_use] += (int64_t)st->size;
        stats[MB_STAT_huge_page_bytes] += st->huge ? (int64_t)st->size : 0;
        if (stats[MB_STAT_bytes_in_use] > stats[MB_STAT_peak_bytes])
            stats[MB_STAT_peak_bytes] = stats[MB_STAT_bytes_in_use];
    }
}

static void s_unhold(act_worker *w, act_storage *st)
{
    if (st && --st->held == 0) {
        w->stats[MB_STAT_bytes_in_use] -= (int64_t)st->size;
        w->stats[MB_STAT_huge_page_bytes] -= st->huge ? (int64_t)st->size : 0;
    }
}

void act_wtensor_set_storage(act_worker *w, act_wtensor *t, act_storage *st)
{
    s_hold(w, st);
    s_unhold(w, t->storage);
    act_storage_release(t->storage);
    t->storage = st;
    t->data = st->data;
}

void act_wtensor_drop(act_worker *w, uint64_t id)
{
    act_wtensor *t = dt_idmap_take(&w->tensors, id);
    if (t)
        s_unhold(w, t->storage);
    act_wtensor_free(w, t);
}

void act_wtensor_put(act_worker *w, uint64_t id, act_wtensor *t)
{
    act_wtensor_drop(w, id);
    if (dt_idmap_put(&w->tensors, id, t) != 0) {
        act_wtensor_free(w, t);
        return;
    }
    s_hold(w, t->storage);
}

void act_wtensor_poison(act_worker *w, uint64_t id, const char *message)
{
    act_wtensor *t = act_wtensor_new(w);
    if (!t)
        return;
    t->error = strdup(message);
    act_wtensor_put(w, id, t);
}

act_wtensor *act_wtensor_lookup(act_worker *w, uint64_t id, const char **why)
{
    static _Thread_local char msg[DT_ERRMSG_MAX];
    act_wtensor *t = dt_idmap_get(&w->tensors, id);
    if (!t) {
        char where[160];
        snprintf(msg, sizeof msg, "device %" PRId64 " has no tensor %" PRIu64 " (freed, or never made)%s", w->device,
                 id, act_replay_where(w, where, sizeof where));
        *why = msg;
    } else if (!t->storage) {
        *why = t->error;
        t = NULL;
    }
    return t;
}

const char *act_worker_no_memory(const act_worker *w)
{
    return w->unusable[0] ? w->unusable : "out of memory on the device";
}

bool act_wtensor_sole(const act_wtensor *t)
{
    const act_storage *st = t->storage;
    return st && !st->adopted && atomic_load(&st->refs) == 1 && t->data == st->data;
}
