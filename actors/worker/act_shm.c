/* act_shm — a worker process's pieces in shared memory, lent by handle.
 *
 * A worker process the controller says others can map (an MB_PROCESS about itself) makes every
 * piece of ACT_SHM_MIN bytes or more in a memfd segment (core/dt_shm.h); a piece that came as a
 * frame (a LOAD) moves into one the first time it is lent. A region of such a piece goes to a
 * peer, and a fetched value to the controller, as a handle: the segment's descriptor number and
 * serial, the offset and strides of the bytes, and a hold id. The lender keeps a
 * reference to the storage under the hold until the borrower sends a RELEASE of it (or dies), so
 * the bytes stay as they were while they are read: storage is immutable, and a write in place
 * copies storage that anything else holds. The borrower maps the segment read-only through
 * /proc/<pid>/fd/<fd>, where pid is what the controller said of the lender (it started that
 * process), never what a message says; it checks the segment and the region's bounds before
 * reading a byte (dt_shm_peer_map, dt_shm_region_check), and keeps the mapping for the next
 * transfer. Anything wrong fails that transfer with a message; nothing crashes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "act_worker.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "mb_schema.h"

act_storage *act_shm_storage_new(const act_worker *w, size_t size)
{
    if (!w->lends || size < ACT_SHM_MIN || !w->backend->adopt_host)
        return NULL;
    dt_shm_seg *seg = dt_shm_seg_new(size);
    act_storage *st = seg && w->backend->adopt_host(seg->data, seg->size) ? act_storage_alloc() : NULL;
    if (!st) {
        dt_shm_seg_free(seg);
        return NULL;
    }
    st->data = seg->data;
    st->size = size;
    st->backend = w->backend;
    st->seg = seg;
    return st;
}

/* Whether device `to` (-1: the controller) can map this worker's segments: the controller can
 * when it said this worker lends; a peer when the controller named its process. */
static bool s_borrower_maps(const act_worker *w, int64_t to)
{
    if (to < 0)
        return true;
    const act_proc *p = dt_idmap_get(&w->procs, (uint64_t)to + 1);
    return p && p->pid > 0;
}

/* Moves t's bytes into a shared segment of their own: false when there is none to be had. Its
 * value is the same, so whatever holds the old storage is unaffected. */
static bool s_share(act_worker *w, act_wtensor *t)
{
    size_t bytes = (size_t)dt_layout_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
    act_storage *st = act_shm_storage_new(w, bytes);
    if (!st || act_copy_bytes(w->backend->copy_region, st->data, t->data, bytes)) {
        act_storage_release(st);
        return false;
    }
    act_wtensor_set_storage(w, t, st);
    return true;
}

act_handle act_shm_lend(act_worker *w, act_wtensor *t, size_t at, size_t bytes, int64_t to)
{
    act_handle none = {.segment = -1};
    if (!w->lends || bytes < ACT_SHM_MIN || !s_borrower_maps(w, to) || (!t->storage->seg && !s_share(w, t)))
        return none;
    act_storage *st = t->storage;
    act_hold *h = malloc(sizeof *h);
    uint64_t id = ++w->next_hold;
    if (!h || dt_idmap_put(&w->holds, id, h) != 0) {
        free(h);
        return none;
    }
    atomic_fetch_add(&st->refs, 1);
    *h = (act_hold){st, to};
    return (act_handle){st->seg->fd, st->seg->serial, (uint64_t)(t->data + at - (const char *)st->seg->data), id};
}

static void s_hold_end(act_hold *h)
{
    act_storage_release(h->storage);
    free(h);
}

void act_shm_unlend(act_worker *w, uint64_t hold)
{
    act_hold *h = dt_idmap_take(&w->holds, hold);
    if (h)
        s_hold_end(h);
}

/* The one record of a message of kind PROCESS or RELEASE, decoded by decode: 0 or DT_EPROTO. */
static int s_only_record(mb_message *m, int (*decode)(const mb_cursor *, void *), void *out)
{
    mb_body_reader r;
    mb_cursor rec;
    if (act_body_open(&r, m) != 0)
        return DT_EPROTO;
    return mb_body_next(&r, &rec) == 1 && decode(&rec, out) == 0 && mb_body_next(&r, &rec) == 0 ? 0 : DT_EPROTO;
}

static int s_decode_process(const mb_cursor *rec, void *out) { return mb_decode_process(rec, out); }
static int s_decode_release(const mb_cursor *rec, void *out) { return mb_decode_release(rec, out); }

static void s_proc_free(act_proc *p)
{
    if (!p)
        return;
    dt_shm_peer_destroy(&p->maps);
    free(p);
}

void act_shm_on_process(act_worker *w, mb_message *m)
{
    mb_process_rec r;
    if (s_only_record(m, s_decode_process, &r) != 0 || r.device < 0 || r.device > DT_MAX_DEVICE_ID ||
        r.pid < 0 || r.pid > INT32_MAX) {
        fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed process message\n", w->device);
        return;
    }
    if (r.device == w->device) {
        /* the controller maps what this process lends: it must be this process it started */
        w->lends = r.pid == (int64_t)getpid();
        return;
    }
    act_proc *p = calloc(1, sizeof *p);
    if (!p)
        return;
    p->pid = (int)r.pid;
    s_proc_free(dt_idmap_take(&w->procs, (uint64_t)r.device + 1));
    if (dt_idmap_put(&w->procs, (uint64_t)r.device + 1, p) != 0)
        s_proc_free(p);
}

void act_shm_on_release(act_worker *w, mb_message *m, int64_t from)
{
    mb_release_rec r;
    if (s_only_record(m, s_decode_release, &r) != 0)
        return;
    act_hold *h = dt_idmap_get(&w->holds, r.hold);
    if (h && h->to == from) /* only the borrower ends a hold */
        act_shm_unlend(w, r.hold);
}

const char *act_shm_map_region(act_worker *w, act_recv *got, int64_t from, size_t elem)
{
    static _Thread_local char why[DT_ERRMSG_MAX];
    if (got->from != from) {
        snprintf(why, sizeof why, "device %" PRId64 " sent by handle a region expected from device %" PRId64,
                 got->from, from);
        return why;
    }
    if (w->remote)
        return "a region lent by handle cannot come from another host";
    act_proc *p;
    double spin_until = act_now() + act_spin_s();
    while (!(p = dt_idmap_get(&w->procs, (uint64_t)from + 1))) {
        /* the controller names a peer's process before that peer runs anything: it is on its way */
        if (dt_idmap_get(&w->dead, (uint64_t)from + 1)) {
            snprintf(why, sizeof why, "device %" PRId64 " died before its region was read", from);
            return why;
        }
        if (w->leaving)
            return "the runtime is shutting down";
        act_peer_wait(w, &spin_until);
    }
    if (p->pid == 0) {
        snprintf(why, sizeof why, "device %" PRId64 " sent a region by handle, but its memory cannot be mapped here",
                 from);
        return why;
    }
    if (!p->maps && !(p->maps = dt_shm_peer_new(p->pid)))
        return "out of memory";
    const char *base;
    size_t size;
    const char *err = dt_shm_peer_map(p->maps, got->handle.segment, got->handle.serial, &base, &size);
    if (!err)
        err = dt_shm_region_check(size, got->handle.offset, got->ndim, got->shape, got->strides, elem);
    if (err) {
        snprintf(why, sizeof why, "device %" PRId64 "'s region by handle: %s", from, err);
        return why;
    }
    got->data = base + got->handle.offset;
    /* host memory: read in place where the backend can use it as its own (the CPU), else copied in */
    bool own = w->backend->adopt_host && w->backend->adopt_host(base, size);
    got->copy = own ? w->backend->copy_region : w->backend->to_device;
    got->in_place = own;
    w->stats[MB_STAT_shm_bytes_received] += dt_layout_numel(got->ndim, got->shape) * (int64_t)elem;
    return NULL;
}

void act_shm_give_back(act_worker *w, const act_recv *got)
{
    if (dt_idmap_get(&w->dead, (uint64_t)got->from + 1))
        return;
    zsock_t *sock = got->from >= 0 && got->from <= DT_MAX_DEVICE_ID ? act_peer_socket(w, got->from) : NULL;
    if (!sock)
        return; /* a lender that cannot be reached holds its storage until it is told this device died */
    mb_writer body = {0};
    mb_encode_release(&body, got->handle.hold);
    if (body.failed) {
        free(mb_w_release(&body));
        return;
    }
    mb_header h = {MB_VERSION, MB_RELEASE, w->peer_seq++, (uint32_t)w->device, 1};
    mb_send(sock, NULL, 0, &h, act_body_frame(&body), NULL, 0);
}

void act_shm_forget(act_worker *w, int64_t device)
{
    size_t cursor = 0;
    uint64_t id;
    void *value;
    uint64_t ended[64];
    int n;
    do { /* ids first, then the takes: the map is not changed while it is walked */
        n = 0;
        cursor = 0;
        while (n < 64 && dt_idmap_next(&w->holds, &cursor, &id, &value))
            if (((act_hold *)value)->to == device)
                ended[n++] = id;
        for (int i = 0; i < n; i++)
            act_shm_unlend(w, ended[i]);
    } while (n == 64);
    s_proc_free(dt_idmap_take(&w->procs, (uint64_t)device + 1));
}

void act_shm_close(act_worker *w)
{
    size_t cursor = 0;
    uint64_t id;
    void *value;
    while (dt_idmap_next(&w->holds, &cursor, &id, &value))
        s_hold_end(value);
    dt_idmap_destroy(&w->holds);
    cursor = 0;
    while (dt_idmap_next(&w->procs, &cursor, &id, &value))
        s_proc_free(value);
    dt_idmap_destroy(&w->procs);
}
