/* libFuzzer target: the controller's handling of what workers send it, fed what a hostile worker
 * could send: HELLOs, and COMPLETIONS of CREDIT, VALUE and ERROR records with payload frames. Each
 * input runs on a fresh runtime state of FZ_DEVICES devices (device d's worker is "d<d>"), with
 * pending futures a fetch and a synchronize would have made:
 *   future 1  a FULL fetch of a float32 (2, 3), Shard(0) over devices 0 and 1: pieces (1, 3)
 *   future 2  the LOCALS of a float32 (2, 3) replicated on devices 2 and 3
 *   future 3  a SYNC of devices 0..3
 *   future 4  a FULL fetch of a float32 (2, 3), Partial(sum) over devices 0 and 1
 * The input is [flags][message]...: flags bit 0 says the controller is listening (its devices came
 * from elsewhere), bit 1 that they have said hello already, bit 2 that device 0 was told it may lend
 * by handle (the rig's segment is descriptor 200, serial 1). Each message is
 *   [device][kind: HELLO or COMPLETIONS][count][npayloads (0..3)][payload lengths...][body length (2
 *   bytes)][payload bytes][body]
 * and goes to the controller as the message of that device, in order. Nothing may crash, hang or
 * leak; a value is copied into a future only when it is what the future asked of that device. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "act_controller.h"
#include "act_future.h"
#include "fuzz_rig.h"

#define FZ_DEVICES 4
#define FZ_FUTURES 4

static dt_future *s_futures[FZ_FUTURES];

/* A pending future of kind over devices (each piece of shape, at offset rows down), tracked as id. */
static void s_future(int k, act_future_kind kind, int npieces, const int64_t *devices, const int64_t *shape,
                     bool split, bool partial)
{
    dt_future *f = act_future_new(kind, npieces);
    if (!f)
        abort();
    f->id = (uint64_t)k + 1;
    f->dtype = DT_FLOAT32;
    f->ndim = 2;
    f->shape[0] = 2, f->shape[1] = 3;
    f->mesh_ndim = 1;
    f->mesh_shape[0] = npieces;
    f->placements[0] = partial ? dt_partial(DT_REDUCE_SUM) : split ? dt_shard(0) : dt_replicate();
    f->has_partial = partial;
    for (int p = 0; p < npieces; p++) {
        act_piece *pc = &f->pieces[p];
        pc->device = devices[p];
        pc->mesh_index = p;
        memcpy(pc->shape, shape, 2 * sizeof *shape);
        pc->offset[0] = split ? p : 0;
    }
    if (kind == ACT_FETCH_FULL && act_future_alloc_value(f) != 0)
        abort();
    if (dt_idmap_put(&act_rt.futures, f->id, dt_future_ref(f)) != 0)
        abort();
    s_futures[k] = f;
}

static void s_end(void) { mb_socket_destroy(&act_rt.router); }

static void s_open(uint8_t flags)
{
    act_runtime *rt = &act_rt;
    if (!rt->devices) {
        fz_segment();
        rt->devices = calloc(DT_MAX_DEVICE_ID + 1, sizeof *rt->devices);
        rt->dirty = calloc(DT_MAX_DEVICE_ID + 1, sizeof *rt->dirty);
        rt->router = mb_socket_new(MB_ROUTER, "inproc://fuzz-controller", true, NULL); /* what it sends goes nowhere */
        if (!rt->devices || !rt->dirty || !rt->router)
            abort();
        atexit(s_end);
    }
    rt->listening = flags & 1;
    rt->shm = true;
    dt_idmap_init(&rt->futures);
    for (int64_t d = 0; d < FZ_DEVICES; d++) {
        act_device *dev = calloc(1, sizeof *dev);
        if (!dev)
            abort();
        dev->id = d;
        snprintf(dev->device_type, sizeof dev->device_type, "cpu");
        dev->remote = rt->listening;
        dev->hello = flags & 2;
        dev->state = dev->hello ? ACT_DEV_READY : ACT_DEV_STARTING;
        dev->in_flight = 64;
        dev->last_op = -1;
        if (d == 0 && (flags & 4)) {
            dev->lends = true; /* its segments are this process's: mapped as a worker process's would be */
            dev->maps = dt_shm_peer_new((int)getpid());
        }
        rt->devices[d] = dev;
    }
    rt->ndevices = FZ_DEVICES;
    const int64_t piece[2] = {1, 3}, whole[2] = {2, 3};
    s_future(0, ACT_FETCH_FULL, 2, (const int64_t[]){0, 1}, piece, true, false);
    s_future(1, ACT_FETCH_LOCALS, 2, (const int64_t[]){2, 3}, whole, false, false);
    s_future(2, ACT_SYNC, 4, (const int64_t[]){0, 1, 2, 3}, whole, false, false);
    s_future(3, ACT_FETCH_FULL, 2, (const int64_t[]){0, 1}, whole, false, true);
}

static void s_close(void)
{
    act_runtime *rt = &act_rt;
    size_t cursor = 0;
    uint64_t id;
    void *f;
    while (dt_idmap_next(&rt->futures, &cursor, &id, &f)) {
        dt_future *tracked = f;
        dt_future_release(&tracked);
    }
    dt_idmap_destroy(&rt->futures);
    for (int k = 0; k < FZ_FUTURES; k++)
        dt_future_release(&s_futures[k]);
    for (int64_t d = 0; d < rt->ndevices; d++) {
        act_device *dev = rt->devices[d];
        if (!dev)
            continue;
        dt_shm_peer_destroy(&dev->maps);
        free(dev);
        rt->devices[d] = NULL;
    }
    rt->ndevices = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    s_open(data[0]);
    const uint8_t *at = data + 1, *end = data + size;
    uint64_t seq[FZ_DEVICES] = {0};
    while (end - at >= 6) {
        uint32_t device = at[0] % FZ_DEVICES;
        mb_kind kind = (at[1] & 1) ? MB_COMPLETIONS : MB_HELLO;
        uint32_t count = at[2];
        int npayloads = at[3] % 4;
        at += 4;
        size_t sizes[3], total = 0;
        for (int i = 0; i < npayloads; i++) {
            sizes[i] = at < end ? *at++ : 0;
            total += sizes[i];
        }
        if (end - at < 2)
            break;
        size_t blen = (size_t)at[0] << 8 | at[1];
        at += 2;
        if ((size_t)(end - at) < total + blen)
            break;
        mb_message m;
        mb_header h = {MB_VERSION, kind, seq[device]++, device, count};
        fz_message(&m, &h, at + total, blen, at, sizes, npayloads);
        at += total + blen;
        m.routing_id_len = (size_t)snprintf((char *)m.routing_id, sizeof m.routing_id, "d%u", device);
        act_device *dev = act_rt.devices[device];
        if (dev && dev->state != ACT_DEV_DEAD)
            act_controller_take(&act_rt, dev, &m);
        mb_message_close(&m);
    }
    s_close();
    return 0;
}
