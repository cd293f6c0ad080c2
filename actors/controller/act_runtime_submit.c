/* act_runtime_submit — the user thread's side of an op: what it takes from the runtime (ids,
 * random streams), its records packed into per-device outboxes (or a capture), the futures it
 * waits for, and the controller's doorbell, rung when it is due; a device's queue past
 * ACT_QUEUE_LIMIT makes the user thread wait. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "act_capture.h"
#include "act_controller.h"
#include "act_future.h"
#include "act_runtime.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "mb_schema.h"

static bool s_urgent;         /* this op is waited for: ring now */
static bool s_over_limit;     /* this op filled a device's queue past ACT_QUEUE_LIMIT */

void dt_manual_seed(uint64_t seed)
{
    pthread_mutex_lock(&act_rt.lock);
    act_rt.seed = seed;
    act_rt.stream = 0;
    pthread_mutex_unlock(&act_rt.lock);
}

void act_runtime_next_stream(uint64_t *seed, uint64_t *stream)
{
    *seed = act_rt.seed;
    *stream = act_rt.stream++;
}

uint64_t act_runtime_new_tensor_id(void) { return act_rt.next_tensor_id++; }

uint64_t act_runtime_new_future_id(void) { return act_rt.next_future_id++; }

uint64_t act_runtime_new_transfer_id(void) { return act_rt.next_transfer_id++; }

uint64_t act_runtime_submitted(void)
{
    pthread_mutex_lock(&act_rt.lock);
    uint64_t n = act_rt.submitted;
    pthread_mutex_unlock(&act_rt.lock);
    return n;
}

int act_runtime_begin(const char *op, dt_mesh *const *meshes, int nmeshes)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (act_runtime_ready(op) != 0 || act_runtime_devices_ready(op, meshes, nmeshes) != 0) {
        pthread_mutex_unlock(&rt->lock);
        return dt_last_error_code();
    }
    rt->submitted++;
    s_urgent = false;
    s_over_limit = false;
    return 0;
}

static act_batch *s_batch_new(void)
{
    act_batch *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "dtorch: out of memory for an op batch\n");
        abort();
    }
    return b;
}

void act_batch_destroy(act_batch *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->npayloads; i++)
        if (b->payloads[i].free_fn)
            b->payloads[i].free_fn(b->payloads[i].data, b->payloads[i].hint);
    free(b->payloads);
    free(b->pk.data);
    free(b);
}

/* The batch the next record of dev goes into, sealing a full one unless its payload's record
 * is still to come. */
static act_batch *s_open_batch(act_runtime *rt, act_device *dev)
{
    act_batch *b = dev->out_tail;
    if (!b || (b->nrecords >= ACT_BATCH_MAX && !b->payload_pending)) {
        act_batch *fresh = s_batch_new();
        if (b)
            b->next = fresh;
        else
            dev->out_head = fresh;
        dev->out_tail = b = fresh;
    }
    if (!dev->dirty) {
        dev->dirty = true;
        rt->dirty[rt->ndirty] = dev;
        __atomic_store_n(&rt->ndirty, rt->ndirty + 1, __ATOMIC_RELAXED);
    }
    return b;
}

mb_writer *act_runtime_record(int64_t device)
{
    if (act_capture_active())
        return act_capture_record(device, 0);
    return act_runtime_record_now(device);
}

mb_writer *act_runtime_record_now(int64_t device)
{
    act_runtime *rt = &act_rt;
    act_device *dev = rt->devices[device];
    act_batch *b = s_open_batch(rt, dev);
    b->payload_pending = false;
    b->nrecords++;
    if (++dev->queued > ACT_QUEUE_LIMIT)
        s_over_limit = true;
    rt->since_ring++;
    return &b->pk;
}

int act_runtime_payload(int64_t device, mb_buf buf)
{
    act_runtime *rt = &act_rt;
    if (act_capture_active()) {
        /* refused at the call sites; should one slip through, the capture cannot be kept */
        act_capture_fail("it sends host data to the devices (make such tensors before the capture)");
        if (buf.free_fn)
            buf.free_fn(buf.data, buf.hint);
        return 0;
    }
    act_device *dev = rt->devices[device];
    act_batch *b = s_open_batch(rt, dev);
    if (b->npayloads == b->cap_payloads) {
        int cap = b->cap_payloads ? b->cap_payloads * 2 : 4;
        mb_buf *grown = realloc(b->payloads, (size_t)cap * sizeof *grown);
        if (!grown) {
            fprintf(stderr, "dtorch: out of memory for payload frames\n");
            abort();
        }
        b->payloads = grown;
        b->cap_payloads = cap;
    }
    b->payloads[b->npayloads] = buf;
    b->payload_pending = true;
    return b->npayloads++;
}

int act_runtime_track(dt_future *f)
{
    if (act_capture_refuse("wait") != 0)
        return dt_last_error_code();
    f->id = act_runtime_new_future_id();
    if (dt_idmap_put(&act_rt.futures, f->id, f) != 0)
        return dt_err(DT_ENOMEM, "out of memory");
    dt_future_ref(f);
    return 0;
}

static bool s_queues_full(act_runtime *rt)
{
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (dev && dev->state != ACT_DEV_DEAD && dev->queued > ACT_QUEUE_LIMIT)
            return true;
    }
    return false;
}

void act_runtime_urgent(void) { s_urgent = true; }

void act_runtime_end(void)
{
    act_runtime *rt = &act_rt;
    bool wait = s_over_limit, ring = false;
    if (!rt->rung && rt->ndirty > 0) {
        double now = s_urgent || wait || rt->since_ring >= ACT_RING_RECORDS ? 0 : act_now();
        ring = now == 0 || now - rt->last_ring >= ACT_RING_DELAY_S;
        if (ring) {
            __atomic_store_n(&rt->rung, true, __ATOMIC_SEQ_CST);
            rt->since_ring = 0;
            rt->last_ring = now ? now : act_now();
        }
    }
    int fd = rt->doorbell;
    pthread_mutex_unlock(&rt->lock);
    if (ring && act_controller_asleep()) {
        uint64_t one = 1;
        if (write(fd, &one, sizeof one) < 0) { /* an eventfd only fails when its counter is full: still rung */ }
    }
    if (!wait)
        return;
    /* backpressure: the controller is far behind; let it drain before queueing more. The op is
     * already queued, so an interrupt only ends the wait (the bindings then drop the result). */
    act_wait_enter();
    pthread_mutex_lock(&rt->lock);
    while (rt->running && !rt->stopping && s_queues_full(rt)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50 * 1000 * 1000;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        if (pthread_cond_timedwait(&rt->cond, &rt->lock, &until) != 0) {
            pthread_mutex_unlock(&rt->lock);
            bool interrupted = act_wait_interrupted();
            pthread_mutex_lock(&rt->lock);
            if (interrupted)
                break;
        }
    }
    pthread_mutex_unlock(&rt->lock);
    act_wait_leave();
}

void act_runtime_free_now(const dt_mesh *mesh, uint64_t id)
{
    act_runtime *rt = &act_rt;
    for (int64_t i = 0; i < mesh->size; i++) {
        act_device *dev = rt->devices[mesh->ids[i]];
        if (!dev || dev->state == ACT_DEV_DEAD)
            continue;
        if (act_capture_active()) {
            mb_writer *pk = act_capture_record(dev->id, id);
            if (pk)
                mb_encode_free(pk, id);
            continue;
        }
        act_batch *b = s_open_batch(rt, dev);
        mb_encode_free(&b->pk, id);
        b->nrecords++;
        dev->queued++;
    }
}

void act_runtime_free(uint64_t epoch, dt_mesh *mesh, uint64_t id)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (act_runtime_epoch_live(epoch))
        act_runtime_free_now(mesh, id);
    pthread_mutex_unlock(&rt->lock);
}

int dt_synchronize(void)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (!rt->running) {
        pthread_mutex_unlock(&rt->lock);
        return 0;
    }
    if (rt->stopping) {
        /* the controller may have failed the pending futures already: a new one would never settle */
        pthread_mutex_unlock(&rt->lock);
        return dt_err(DT_ESHUTDOWN, "synchronize: the runtime is shutting down");
    }
    if (act_capture_refuse("synchronize") != 0) {
        pthread_mutex_unlock(&rt->lock);
        return dt_last_error_code();
    }
    int n = 0;
    for (int64_t i = 0; i < rt->ndevices; i++)
        n += rt->devices[i] && rt->devices[i]->state != ACT_DEV_DEAD;
    if (n == 0) {
        pthread_mutex_unlock(&rt->lock);
        return 0;
    }
    dt_future *f = act_future_new(ACT_SYNC, n);
    if (!f || act_runtime_track(f) != 0) {
        pthread_mutex_unlock(&rt->lock);
        dt_future_release(&f);
        return dt_err(DT_ENOMEM, "synchronize: out of memory");
    }
    s_urgent = true;
    s_over_limit = false;
    int piece = 0;
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev || dev->state == ACT_DEV_DEAD)
            continue;
        f->pieces[piece].device = dev->id;
        mb_encode_sync(act_runtime_record(dev->id), f->id, piece++);
    }
    act_runtime_end();
    int rc = dt_future_wait(f, -1);
    dt_future_release(&f);
    return rc;
}
