/* act_controller — the controller actor: one thread that owns the ROUTER socket every worker
 * talks to (lending it, between its steps, to a user thread that waits on a future). It ships
 * outboxes under a credit window, turns completions into settled futures, and fails the futures
 * of devices whose worker died. It tells worker processes which processes their peers are (so
 * that they can map each other's shared segments) and maps the segments of values they lend it
 * by handle (act_shm.c). */
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "act_controller.h"
#include "act_future.h"
#include "act_runtime.h"
#include "act_spawn.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dt_shm.h"
#include "mb_curve.h"
#include "mb_schema.h"
#include "op_registry.h"

typedef struct {
    act_runtime *rt;
    zsock_t *router;
    int64_t *sent;       /* (DT_MAX_DEVICE_ID + 1) records sent per device since the last accounting */
    bool threads_only;   /* every device is a thread worker of this process: act_rt.posted says when to look */
    uint64_t seen_posted; /* act_rt.posted when the router was last drained */
    int idle_looks;      /* spinning looks since the router was last polled */
} s_ctl;

#define S_LOOKS_PER_POLL 32 /* spinning looks that trust act_rt.posted before polling the router anyway */

/* The controller's state and sockets belong to whichever thread holds `step`: the controller
 * thread for each of its steps, or a waiting user thread (act_controller_help) between them. The
 * controller thread sleeps on the sockets without it, saying so in `asleep`, and nobody else
 * touches them then. A ZeroMQ socket may move between threads with a full barrier, which the
 * mutex is. */
static struct {
    pthread_mutex_t step;
    bool live;           /* the controller is up and not stopping: helpers may step */
    bool asleep;         /* the controller thread is in a blocking poll on the sockets */
    s_ctl *ctl;
} s_shared = {.step = PTHREAD_MUTEX_INITIALIZER};

/* The routing id of device's link to the controller (mb_rid.h: with the run's token in process mode). */
static void s_routing_id(int64_t device, char *buf) { mb_rid_format(buf, 'd', device, act_rt.token); }

static act_device *s_device(act_runtime *rt, int64_t id)
{
    return id >= 0 && id <= DT_MAX_DEVICE_ID && rt->devices ? __atomic_load_n(&rt->devices[id], __ATOMIC_ACQUIRE)
                                                             : NULL;
}

/* Moves every dirty outbox to its device's send queue. */
static void s_take_outboxes(act_runtime *rt)
{
    /* a racy peek that saves taking the user thread's lock on wake-ups with nothing new: a
     * record queued after it is collected at the next wake-up (doorbell, completion or tick) */
    if (__atomic_load_n(&rt->ndirty, __ATOMIC_RELAXED) == 0 && !__atomic_load_n(&rt->rung, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&rt->lock);
    for (int64_t i = 0; i < rt->ndirty; i++) {
        act_device *dev = rt->dirty[i];
        dev->dirty = false;
        if (!dev->out_head)
            continue; /* emptied by its death */
        if (dev->send_tail)
            dev->send_tail->next = dev->out_head;
        else
            dev->send_head = dev->out_head;
        dev->send_tail = dev->out_tail;
        dev->out_head = dev->out_tail = NULL;
    }
    rt->ndirty = 0;
    __atomic_store_n(&rt->rung, false, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&rt->lock);
}

/* Fails every pending future that waits for a piece from device. */
static void s_fail_futures_of(act_runtime *rt, int64_t device, int code, const char *why)
{
    pthread_mutex_lock(&rt->lock);
    size_t n = 0, cursor = 0, cap = rt->futures.count;
    dt_future **victims = malloc((cap ? cap : 1) * sizeof *victims);
    uint64_t id;
    void *value;
    while (victims && dt_idmap_next(&rt->futures, &cursor, &id, &value)) {
        dt_future *f = value;
        for (int p = 0; p < f->npieces; p++)
            if (device < 0 || f->pieces[p].device == device) {
                victims[n++] = f;
                break;
            }
    }
    for (size_t i = 0; i < n; i++)
        dt_idmap_take(&rt->futures, victims[i]->id);
    pthread_mutex_unlock(&rt->lock);
    for (size_t i = 0; i < n; i++) {
        act_future_fail(victims[i], code, why);
        dt_future_release(&victims[i]);
    }
    free(victims);
}

/* Sends `to` a message of kind (MB_ABORT, MB_PROCESS, MB_RELEASE) with the one record body holds. */
static void s_send_one(act_runtime *rt, act_device *to, mb_kind kind, mb_writer *body)
{
    if (body->failed) {
        free(mb_w_release(body));
        return;
    }
    char rid[MB_RID_MAX];
    s_routing_id(to->id, rid);
    mb_header h = {MB_VERSION, kind, to->send_seq++, MB_SENDER_CONTROLLER, 1};
    mb_send(rt->router, rid, strlen(rid), &h, act_body_frame(body), NULL, 0);
}

/* A message with no body (MB_BYE, MB_HEARTBEAT). */
static void s_send_empty(act_runtime *rt, act_device *to, mb_kind kind)
{
    char rid[MB_RID_MAX];
    s_routing_id(to->id, rid);
    mb_header h = {MB_VERSION, kind, to->send_seq++, MB_SENDER_CONTROLLER, 0};
    mb_send(rt->router, rid, strlen(rid), &h, (mb_buf){NULL, 0, NULL, NULL}, NULL, 0);
}

/* Tells `to` (on another host) where device's peer socket is. */
static void s_send_endpoint(act_runtime *rt, act_device *to, const act_device *device)
{
    mb_writer body = {0};
    mb_encode_endpoint(&body, device->id, device->peer);
    s_send_one(rt, to, MB_ENDPOINT, &body);
}

/* Tells device `to` that device `dead` died, so that it stops waiting for regions from it. */
static void s_send_abort(act_runtime *rt, act_device *to, int64_t dead)
{
    mb_writer body = {0};
    mb_encode_abort(&body, dead);
    s_send_one(rt, to, MB_ABORT, &body);
}

/* Tells `to` that device runs as process pid (0: it lends nothing). */
static void s_send_process(act_runtime *rt, act_device *to, int64_t device, int64_t pid)
{
    mb_writer body = {0};
    mb_encode_process(&body, device, pid);
    s_send_one(rt, to, MB_PROCESS, &body);
}

/* Tells dev that the controller is done with what it lent as hold. */
static void s_send_release(act_runtime *rt, act_device *dev, uint64_t hold)
{
    if (dev->state == ACT_DEV_DEAD)
        return;
    mb_writer body = {0};
    mb_encode_release(&body, hold);
    s_send_one(rt, dev, MB_RELEASE, &body);
}

/* Marks dev dead for reason (kept for later calls: "device 3 is dead: <reason>") and fails the
 * futures waiting on it with message. */
static void s_device_lost(act_runtime *rt, act_device *dev, const char *reason, const char *message)
{
    pthread_mutex_lock(&rt->lock);
    if (dev->state == ACT_DEV_DEAD) {
        pthread_mutex_unlock(&rt->lock);
        return;
    }
    dev->state = ACT_DEV_DEAD;
    rt->deaths++;
    snprintf(dev->reason, sizeof dev->reason, "%s", reason);
    if (!rt->stopping)
        act_runtime_note_failure(dev->id, reason); /* workers that leave at shutdown are no failure */
    for (act_batch *b = dev->out_head, *next; b; b = next) {
        next = b->next;
        act_batch_destroy(b);
    }
    dev->out_head = dev->out_tail = NULL;
    dev->queued = 0;
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->lock);
    for (act_batch *b = dev->send_head, *next; b; b = next) {
        next = b->next;
        act_batch_destroy(b);
    }
    dev->send_head = dev->send_tail = NULL;
    dt_shm_peer_destroy(&dev->maps); /* its memory goes with it */
    s_fail_futures_of(rt, dev->id, DT_EDEVICE, message);
    /* workers waiting for a region from it in a redistribute must stop waiting */
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *other = rt->devices[i];
        if (!other || other == dev || !other->hello || other->state == ACT_DEV_DEAD)
            continue; /* one that has not said hello yet is told when it does */
        s_send_abort(rt, other, dev->id);
    }
}

static void s_device_died(act_runtime *rt, act_device *dev, const char *reason)
{
    char message[DT_ERRMSG_MAX + 160], last[96] = "";
    pthread_mutex_lock(&rt->lock);
    const op_def *op = dev->last_op >= 0 ? op_at(dev->last_op) : NULL;
    pthread_mutex_unlock(&rt->lock);
    if (op)
        snprintf(last, sizeof last, " (the last op sent to it: %s)", op->name);
    snprintf(message, sizeof message, "device %" PRId64 " died: %s%s", dev->id, reason, last);
    s_device_lost(rt, dev, reason, message);
}

/* A worker the controller refused: the reason names the device and is the whole message. */
static void s_device_down(act_runtime *rt, act_device *dev, const char *reason)
{
    s_device_lost(rt, dev, reason, reason);
}

static void s_send_batch(s_ctl *c, act_device *dev, act_batch *b)
{
    char rid[MB_RID_MAX];
    s_routing_id(dev->id, rid);
    mb_header h = {MB_VERSION, MB_OPS, dev->send_seq++, MB_SENDER_CONTROLLER, b->nrecords};
    if (b->pk.failed) {
        act_batch_destroy(b);
        s_device_died(c->rt, dev, "the controller ran out of memory encoding its ops");
        return;
    }
    int rc = mb_send(c->router, rid, strlen(rid), &h, act_body_frame(&b->pk), b->payloads, b->npayloads);
    b->npayloads = 0; /* mb_send owns them now */
    dev->in_flight += b->nrecords;
    c->sent[dev->id] += b->nrecords;
    act_trace_batch(dev->id, b->nrecords);
    act_batch_destroy(b);
    if (rc != 0)
        s_device_died(c->rt, dev, dt_last_error());
}

/* Sends queued batches while each device has credit; then tells waiting users how much left. */
static void s_send_ready(s_ctl *c)
{
    act_runtime *rt = c->rt;
    bool any = false;
    int64_t ndevices = __atomic_load_n(&rt->ndevices, __ATOMIC_ACQUIRE);
    for (int64_t i = 0; i < ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev || !dev->hello || dev->state == ACT_DEV_DEAD)
            continue;
        while (dev->send_head &&
               (dev->in_flight == 0 || dev->in_flight + dev->send_head->nrecords <= ACT_WINDOW)) {
            act_batch *b = dev->send_head;
            dev->send_head = b->next;
            if (!dev->send_head)
                dev->send_tail = NULL;
            s_send_batch(c, dev, b);
            any = true;
            if (dev->state == ACT_DEV_DEAD)
                break;
        }
    }
    if (!any)
        return;
    pthread_mutex_lock(&rt->lock);
    for (int64_t i = 0; i < ndevices; i++) {
        if (c->sent[i] && rt->devices[i])
            rt->devices[i]->queued -= c->sent[i];
        c->sent[i] = 0;
    }
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->lock);
}

/* The bytes of a value dev lent by handle: its segment mapped here (once; the worker is the
 * process the controller started) and the value's bytes checked against the segment's real size.
 * NULL, or why the fetch fails. */
static const char *s_lent_value(act_device *dev, const mb_value_rec *value, const void **data, size_t *size)
{
    static char why[DT_ERRMSG_MAX];
    const char *err = NULL;
    if (!dev->lends)
        err = "it was never told it may lend by handle";
    else if (!dev->maps && !(dev->maps = dt_shm_peer_new(dev->pid)))
        err = "out of memory";
    const char *base = NULL;
    size_t mapped = 0, elem = dt_dtype_size(value->dtype);
    if (!err)
        err = dt_shm_peer_map(dev->maps, value->segment, value->serial, &base, &mapped);
    int64_t strides[DT_MAX_DIMS];
    dt_layout_strides(value->shape.n, value->shape.v, elem, strides);
    if (!err)
        err = dt_shm_region_check(mapped, value->offset, value->shape.n, value->shape.v, strides, elem);
    if (err) {
        snprintf(why, sizeof why, "fetch: device %" PRId64 "'s value by handle: %s", dev->id, err);
        return why;
    }
    *data = base + value->offset;
    *size = (size_t)dt_layout_numel(value->shape.n, value->shape.v) * elem;
    return NULL;
}

/* Settles or updates the future of a VALUE or ERROR; drops ones already settled. A value lent by
 * handle is copied out of dev's segment and given back, whatever becomes of it. DT_EPROTO for a
 * completion that cannot be read. */
static int s_complete(act_runtime *rt, act_device *dev, const mb_cursor *rec, int64_t code, mb_message *m)
{
    mb_value_rec value;
    mb_error_rec error;
    uint64_t fid;
    if (code == MB_C_VALUE) {
        if (mb_decode_value(rec, &value) != 0)
            return DT_EPROTO;
        if (value.frame >= m->npayloads)
            return dt_err(DT_EPROTO, "a value names payload frame %" PRId64 " of %d", value.frame, m->npayloads);
        fid = value.future;
    } else {
        if (mb_decode_error(rec, &error) != 0)
            return DT_EPROTO;
        fid = error.future;
    }
    pthread_mutex_lock(&rt->lock);
    dt_future *f = dt_idmap_get(&rt->futures, fid);
    pthread_mutex_unlock(&rt->lock);
    bool lent = code == MB_C_VALUE && value.segment >= 0;
    if (!f) {
        if (lent)
            s_send_release(rt, dev, value.hold);
        return 0;
    }
    if (code == MB_C_VALUE) {
        const void *data = value.frame >= 0 ? zmq_msg_data(&m->payloads[value.frame]) : NULL;
        size_t size = value.frame >= 0 ? zmq_msg_size(&m->payloads[value.frame]) : 0;
        /* a piece number no int holds is no piece of f: -1 makes add_piece fail f for it */
        int piece = value.piece >= 0 && value.piece <= INT32_MAX ? (int)value.piece : -1;
        const char *why = lent ? s_lent_value(dev, &value, &data, &size) : NULL;
        if (why)
            act_future_fail(f, DT_EPROTO, why);
        else
            act_future_add_piece(f, piece, value.dtype, value.shape.n, value.shape.v, data, size);
        if (lent)
            s_send_release(rt, dev, value.hold); /* copied out, or failed: either way done with it */
    } else {
        char text[DT_ERRMSG_MAX];
        snprintf(text, sizeof text, "%.*s", (int)error.message.len, error.message.ptr);
        act_future_fail(f, (int)error.status, text);
    }
    if (dt_future_status(f) != 1) {
        pthread_mutex_lock(&rt->lock);
        dt_future *tracked = dt_idmap_take(&rt->futures, fid);
        pthread_mutex_unlock(&rt->lock);
        dt_future_release(&tracked);
    }
    return 0;
}

static void s_handle_completions(act_runtime *rt, act_device *dev, mb_message *m)
{
    mb_body_reader r;
    if (act_body_open(&r, m) != 0) {
        s_device_died(rt, dev, dt_last_error());
        return;
    }
    mb_cursor rec;
    int rc;
    while ((rc = mb_body_next(&r, &rec)) == 1) {
        int64_t code;
        if ((rc = mb_record_code(&rec, &code)) != 0)
            break;
        if (code == MB_C_CREDIT) {
            mb_credit_rec credit;
            if ((rc = mb_decode_credit(&rec, &credit)) != 0)
                break;
            if (credit.records > (uint64_t)dev->in_flight) {
                rc = dt_err(DT_EPROTO, "credit for %" PRIu64 " records, %" PRId64 " in flight", credit.records,
                            dev->in_flight);
                break;
            }
            dev->in_flight -= (int64_t)credit.records;
        } else if (code == MB_C_VALUE || code == MB_C_ERROR) {
            if ((rc = s_complete(rt, dev, &rec, code, m)) != 0)
                break;
        } else {
            rc = dt_err(DT_EPROTO, "unknown completion code %" PRId64, code);
            break;
        }
    }
    if (rc < 0) {
        char why[DT_ERRMSG_MAX + 32];
        snprintf(why, sizeof why, "protocol error: %s", dt_last_error());
        s_device_died(rt, dev, why);
    }
}

/* A worker process said hello as process pid: it may lend by handle when it is the process the
 * controller started and the controller can read its descriptors (then its peers, processes of
 * the same user, can too; DTORCH_SHM=0 turns lending off). It hears which processes its ready
 * peers are, and they hear of it: pid 0 for one that does not lend. */
static void s_introduce(act_runtime *rt, act_device *dev, int64_t pid)
{
    dev->lends = rt->shm && pid == dev->pid && dt_shm_reachable(dev->pid);
    if (dev->lends)
        s_send_process(rt, dev, dev->id, dev->pid);
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *other = rt->devices[i];
        if (!other || other == dev || !other->hello || other->state == ACT_DEV_DEAD || other->pid <= 0)
            continue;
        s_send_process(rt, other, dev->id, dev->lends ? dev->pid : 0);
        s_send_process(rt, dev, other->id, other->lends ? other->pid : 0);
    }
}

/* Where a worker's hello says it is: a remote one names its host and a tcp peer socket (read
 * strictly and written back from its parts), a local one none. Fills why when it is wrong. */
static void s_hello_home(act_device *dev, const mb_hello_rec *hello, char *why, size_t size)
{
    char peer[64] = "";
    if (hello->peer.len < sizeof peer)
        snprintf(peer, sizeof peer, "%.*s", (int)hello->peer.len, hello->peer.ptr);
    if (!dev->remote) {
        if (hello->peer.len != 0)
            snprintf(why, size, "device %" PRId64 ": a worker this controller started names a peer socket of its own",
                     dev->id);
        return;
    }
    mb_tcp_addr addr;
    if (hello->peer.len >= sizeof peer || mb_tcp_parse(peer, false, &addr) != 0) {
        snprintf(why, size, "device %" PRId64 ": its worker's peer socket '%.60s' is not tcp://A.B.C.D:PORT", dev->id,
                 peer);
        return;
    }
    mb_tcp_format(&addr, dev->peer, sizeof dev->peer);
    size_t n = 0;
    for (uint32_t i = 0; i < hello->host.len && n + 1 < sizeof dev->host; i++) {
        char ch = hello->host.ptr[i];
        dev->host[n++] = ch > ' ' && ch < 127 ? ch : '?'; /* it is only printed */
    }
    dev->host[n] = 0;
    dev->remote_pid = hello->pid;
}

/* A worker on another host said hello: it hears where its ready peers are, they hear of it, and
 * it hears the controller beat at once (its first word back). */
static void s_introduce_remote(act_runtime *rt, act_device *dev)
{
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *other = rt->devices[i];
        if (!other || other == dev || !other->remote || !other->hello || other->state == ACT_DEV_DEAD)
            continue;
        s_send_endpoint(rt, other, dev);
        s_send_endpoint(rt, dev, other);
    }
    dev->beat_at = act_now();
    s_send_empty(rt, dev, MB_HEARTBEAT);
}

/* A worker said hello: it serves the device once it speaks this controller's protocol and op
 * registry for the device type asked of it; otherwise it is refused, naming both sides. */
static void s_hello(act_runtime *rt, act_device *dev, mb_message *m)
{
    mb_body_reader r;
    mb_cursor rec;
    mb_hello_rec hello;
    char why[DT_ERRMSG_MAX + 160] = "";
    if (act_body_open(&r, m) != 0 ||
        mb_body_next(&r, &rec) != 1 || mb_decode_hello(&rec, &hello) != 0 || mb_body_next(&r, &rec) != 0) {
        snprintf(why, sizeof why, "device %" PRId64 ": its worker's hello could not be read (%s): rebuild "
                 "dtorch-worker from the same sources", dev->id, dt_last_error());
    } else {
        if (dev->remote && !dev->device_type[0] && hello.device_type.len < sizeof dev->device_type)
            snprintf(dev->device_type, sizeof dev->device_type, "%.*s", (int)hello.device_type.len,
                     hello.device_type.ptr); /* no mesh named it yet: it serves what it says */
        uint64_t registry = op_registry_hash();
        if (hello.protocol != MB_PROTOCOL || hello.registry != registry)
            snprintf(why, sizeof why, "device %" PRId64 " speaks protocol %" PRIu64 ", registry 0x%016" PRIx64
                     ", this controller protocol %d, registry 0x%016" PRIx64 ": rebuild dtorch-worker from the same "
                     "sources", dev->id, hello.protocol, hello.registry, MB_PROTOCOL, registry);
        else if (hello.device != dev->id || hello.device_type.len != strlen(dev->device_type) ||
                 memcmp(hello.device_type.ptr, dev->device_type, hello.device_type.len) != 0)
            snprintf(why, sizeof why, "device %" PRId64 ": its worker serves %.*s device %" PRId64 ", not %s device %" PRId64,
                     dev->id, (int)hello.device_type.len, hello.device_type.ptr, hello.device, dev->device_type,
                     dev->id);
        else
            s_hello_home(dev, &hello, why, sizeof why);
    }
    if (why[0]) {
        if (dev->pid > 0)
            kill(dev->pid, SIGKILL); /* it would misread every record it was sent */
        s_device_down(rt, dev, why);
        return;
    }
    pthread_mutex_lock(&rt->lock);
    dev->hello = true;
    dev->state = ACT_DEV_READY;
    pthread_mutex_unlock(&rt->lock);
    if (dev->pid > 0)
        s_introduce(rt, dev, hello.pid);
    if (dev->remote)
        s_introduce_remote(rt, dev);
    /* ops queued for it before it started may wait for regions from devices dead since */
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *gone = rt->devices[i];
        if (gone && gone != dev && gone->state == ACT_DEV_DEAD)
            s_send_abort(rt, dev, gone->id);
    }
}

/* A message whose routing id names no worker of this run: dropped unread, and said on stderr at the
 * first and at each doubling (a flood gets a few lines). */
static void s_refuse(act_runtime *rt)
{
    uint64_t n = ++rt->refused;
    if ((n & (n - 1)) == 0)
        fprintf(stderr, "dtorch: dropped a message on the workers' socket from a process that is not a worker of "
                "this run (%" PRIu64 " so far)\n", n);
}

void act_controller_take(act_runtime *rt, act_device *dev, mb_message *m)
{
    if (m->header.kind == MB_HELLO)
        s_hello(rt, dev, m);
    else if (m->header.kind == MB_COMPLETIONS)
        s_handle_completions(rt, dev, m);
}

/* Handles every message waiting on the router; the bye of a device sets dev->bye. */
static void s_drain(s_ctl *c)
{
    act_runtime *rt = c->rt;
    for (;;) {
        mb_message m;
        int rc = mb_recv(c->router, true, true, &m);
        if (rc == 1)
            return;
        if (rc != 0)
            continue; /* a malformed message is dropped whole; its sender is unknown */
        /* who sent it is what the routing id of its link says, proven by the run's token in process
         * mode: a message under any other name is from a process that is no worker of this run */
        int64_t id = mb_rid_device(m.routing_id, m.routing_id_len, 'd', rt->token);
        bool heartbeat = id < 0 && (id = mb_rid_device(m.routing_id, m.routing_id_len, 'h', rt->token)) >= 0;
        if (id < 0) {
            s_refuse(rt);
            mb_message_close(&m);
            continue;
        }
        act_device *dev = s_device(rt, id);
        if (!dev && rt->listening && !heartbeat && m.header.kind == MB_HELLO && m.header.sender == (uint32_t)id)
            dev = act_runtime_adopt(id, ""); /* untyped: s_hello takes the type its hello says */
        if (!dev || m.header.sender != (uint32_t)id || dev->state == ACT_DEV_DEAD ||
            heartbeat != (m.header.kind == MB_HEARTBEAT)) {
            mb_message_close(&m);
            continue;
        }
        dev->heard_at = act_now();
        if (heartbeat) {
            /* from the worker's own heartbeat socket: outside the sequence of its messages */
        } else if (m.header.seq != dev->recv_seq++) {
            s_device_died(rt, dev, "messages arrived out of order");
        } else if (m.header.kind == MB_BYE) {
            dev->bye = true;
        } else {
            act_controller_take(rt, dev, &m);
        }
        mb_message_close(&m);
    }
}

/* Worker threads: one with work in flight whose beats (act_worker_beat, between kernels) and CPU
 * time have both stood still for the stuck bound, and which is not waiting for a CPU either, is
 * stuck in a kernel that will not return (a long kernel uses CPU; a wait for a peer beats; a
 * thread starved on a loaded machine is runnable). */
static bool s_thread_stuck(act_runtime *rt, act_device *dev, double now)
{
    uint64_t beats = atomic_load_explicit(&dev->beats, memory_order_relaxed);
    /* idle or beating: its CPU clock is not read (one system call per device and tick saved) */
    double cpu = beats != dev->seen_beats || dev->in_flight == 0 ? -1 : act_spawn_thread_cpu(dev);
    if (beats != dev->seen_beats || dev->in_flight == 0 || cpu < 0 || dev->seen_cpu < 0 ||
        cpu - dev->seen_cpu > 0.005) {
        dev->seen_beats = beats;
        dev->seen_cpu = cpu;
        dev->progress_at = now;
        return false;
    }
    if (now - dev->progress_at <= rt->stuck_s)
        return false;
    if (act_spawn_thread_runnable(dev)) {
        dev->progress_at = now; /* only starved of CPU */
        return false;
    }
    return true;
}

double act_controller_silent_at(const act_runtime *rt, const act_device *dev)
{
    if (dev->state == ACT_DEV_DEAD || dev->bye)
        return INFINITY;
    if (dev->remote)
        return dev->hello ? dev->heard_at + rt->silent_s : INFINITY;
    if (dev->pid > 0)
        return (dev->heard_at > 0 ? dev->heard_at : dev->started_at) + rt->silent_s;
    return INFINITY;
}

/* Process workers: notices the ones that ended; any worker: the ones that never said hello, and
 * those that went silent (act_controller_silent_at). Returns the earliest time still ahead at which
 * a worker could be found silent, for the controller to look again then, not a tick after. */
static double s_check_workers(act_runtime *rt)
{
    double now = act_now(), next = INFINITY;
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev || dev->state == ACT_DEV_DEAD || dev->bye)
            continue; /* a worker that said bye at shutdown and exited did not die */
        char reason[200];
        bool silent = now >= act_controller_silent_at(rt, dev), heard = dev->heard_at > 0;
        if (act_spawn_reap(dev, reason, sizeof reason))
            s_device_died(rt, dev, reason);
        else if (dev->has_thread && dev->hello && s_thread_stuck(rt, dev, now)) {
            snprintf(reason, sizeof reason, "its worker thread has made no progress for %.1f s (inside an op, using "
                     "no CPU); a thread cannot be stopped, so it is abandoned (process workers can be killed)",
                     now - dev->progress_at);
            dev->abandoned = true;
            s_device_died(rt, dev, reason);
        }
        else if (!dev->hello && !dev->remote && now - dev->started_at > ACT_HELLO_TIMEOUT_S)
            s_device_died(rt, dev, "its worker did not start in time");
        else if (dev->remote && silent) {
            /* stopped, dead, or cut off: a worker on another host cannot be killed from here; it
             * leaves by itself once the controller is silent to it (no heartbeats to the dead) */
            snprintf(reason, sizeof reason, "its worker on host %s (process %lld) has been silent for %.1f s",
                     dev->host, (long long)dev->remote_pid, now - dev->heard_at);
            s_device_died(rt, dev, reason);
        } else if (dev->pid > 0 && silent && heard && act_spawn_process_runnable(dev)) {
            dev->heard_at = now; /* not silent: starved of CPU on a loaded host (its heartbeat waits to run) */
        } else if (dev->pid > 0 && silent && (heard || act_spawn_process_stopped(dev))) {
            /* stopped, hung in the kernel, or unreachable: it no longer even says it is alive; or, before
             * its first word (its heartbeat starts before its hello), stopped since it was started. One
             * not heard yet that is not stopped is still starting (a loaded host): the hello bound holds */
            if (heard)
                snprintf(reason, sizeof reason, "its worker process %d has been silent for %.1f s%s", (int)dev->pid,
                         now - dev->heard_at, dev->hello ? "" : " before its hello");
            else
                snprintf(reason, sizeof reason, "its worker process %d has been stopped and silent for %.1f s since "
                         "it was started", (int)dev->pid, now - dev->started_at);
            kill(dev->pid, SIGKILL); /* so that it cannot come back as a second actor for the device */
            s_device_died(rt, dev, reason);
        }
        double at = act_controller_silent_at(rt, dev);
        if (at > now && at < next)
            next = at;
    }
    return next;
}

/* Says bye to every worker, waits for them to go (killing the ones that do not), fails what is
 * still pending and frees every device. */
static void s_stop(s_ctl *c)
{
    act_runtime *rt = c->rt;
    double deadline = act_now() + ACT_BYE_TIMEOUT_S;
    bool *asked = calloc((size_t)(rt->ndevices ? rt->ndevices : 1), sizeof *asked);
    for (;;) {
        bool waiting = false;
        for (int64_t i = 0; i < rt->ndevices; i++) {
            act_device *dev = rt->devices[i];
            if (!dev || dev->state == ACT_DEV_DEAD || dev->bye)
                continue;
            if (dev->hello && asked && !asked[i]) {
                s_send_empty(rt, dev, MB_BYE);
                asked[i] = true;
            }
            waiting = true;
        }
        if (!waiting || act_now() > deadline)
            break;
        zmq_pollitem_t item = {zsock_resolve(c->router), 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 20);
        s_drain(c);
        s_check_workers(rt);
    }
    free(asked);
    s_fail_futures_of(rt, -1, DT_ESHUTDOWN, "the runtime was shut down before this value arrived");
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev)
            continue;
        atomic_store(&dev->stop, true);
        bool gone = act_spawn_stop(dev, dev->bye ? ACT_BYE_TIMEOUT_S : 0.1);
        for (act_batch *b = dev->send_head, *next; b; b = next) {
            next = b->next;
            act_batch_destroy(b);
        }
        pthread_mutex_lock(&rt->lock);
        for (act_batch *b = dev->out_head, *next; b; b = next) {
            next = b->next;
            act_batch_destroy(b);
        }
        rt->devices[i] = NULL;
        pthread_mutex_unlock(&rt->lock);
        dt_shm_peer_destroy(&dev->maps);
        if (gone)
            free(dev); /* an abandoned thread still stuck keeps its device (its stop flag) for good */
    }
    pthread_mutex_lock(&rt->lock);
    rt->ndirty = 0;
    dt_idmap_destroy(&rt->futures);
    pthread_mutex_unlock(&rt->lock);
}

/* The socket every worker talks to: local workers' (inproc, or ipc in the run's directory), or,
 * listening, a tcp one that is a CURVE server admitting the workers' key only (plaintext when the
 * user said insecure, loudly). */
static zsock_t *s_open_router(act_runtime *rt)
{
    if (!rt->listening)
        return mb_socket_new(MB_ROUTER, rt->endpoint, true, NULL);
    mb_curve server = {&rt->keys, NULL};
    if (!rt->insecure && mb_curve_accept(rt->worker_key) != 0)
        return NULL;
    zsock_t *sock = mb_socket_open(MB_ROUTER, rt->endpoint, true, NULL, rt->insecure ? NULL : &server);
    size_t len = sizeof rt->bound - 1;
    memset(rt->bound, 0, sizeof rt->bound);
    if (sock && zmq_getsockopt(zsock_resolve(sock), ZMQ_LAST_ENDPOINT, rt->bound, &len) != 0)
        snprintf(rt->bound, sizeof rt->bound, "%s", rt->endpoint);
    if (sock && rt->insecure)
        fprintf(stderr, "dtorch: WARNING: listening on %s in PLAINTEXT with no authentication (insecure=True): "
                "anyone who can reach this port can read the tensors and run ops as a worker\n", rt->bound);
    if (!sock && !rt->insecure)
        mb_curve_stop();
    return sock;
}

/* Listening: tells every remote worker that the controller is alive (they leave when it is silent). */
static void s_beat(act_runtime *rt)
{
    double now = act_now();
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev || !dev->remote || !dev->hello || dev->state == ACT_DEV_DEAD || now - dev->beat_at < ACT_HEARTBEAT_S)
            continue;
        dev->beat_at = now;
        s_send_empty(rt, dev, MB_HEARTBEAT);
    }
}

/* Whether every device is a thread worker of this process, whose messages act_rt.posted counts. */
static bool s_threads_only(const act_runtime *rt)
{
    if (rt->listening)
        return false;
    int64_t ndevices = __atomic_load_n(&rt->ndevices, __ATOMIC_ACQUIRE);
    for (int64_t i = 0; i < ndevices; i++) {
        const act_device *dev = s_device((act_runtime *)rt, i);
        if (dev && dev->state != ACT_DEV_DEAD && (!dev->has_thread || dev->remote))
            return false;
    }
    return true;
}

/* Whether a spinning look should poll the router (a poll and a getpid system call in ZeroMQ):
 * always, unless every device is a thread worker and none has posted since the last drain; then
 * one look in S_LOOKS_PER_POLL all the same. */
static bool s_look(s_ctl *c)
{
    uint64_t posted = __atomic_load_n(&c->rt->posted, __ATOMIC_ACQUIRE);
    if (c->threads_only && posted == c->seen_posted && ++c->idle_looks < S_LOOKS_PER_POLL)
        return false;
    c->idle_looks = 0;
    c->seen_posted = posted;
    c->threads_only = s_threads_only(c->rt);
    return true;
}

void *act_controller_main(void *arg)
{
    pthread_setname_np(pthread_self(), "dtorch-control"); /* so profiles and debuggers tell it apart */
    s_ctl c = {.rt = arg, .sent = calloc(DT_MAX_DEVICE_ID + 1, sizeof *c.sent)};
    act_runtime *rt = c.rt;
    const char *shm = getenv("DTORCH_SHM");
    rt->shm = !(shm && strcmp(shm, "0") == 0);
    c.router = rt->router = c.sent ? s_open_router(rt) : NULL;
    pthread_mutex_lock(&rt->lock);
    if (!c.router)
        rt->start_error = dt_last_error_code() ? dt_last_error_code() : DT_ESYS;
    else
        rt->controller_up = true;
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->lock);
    if (!c.router) {
        free(c.sent);
        return NULL;
    }

    zmq_pollitem_t items[2] = {{zsock_resolve(c.router), 0, ZMQ_POLLIN, 0}, {NULL, rt->doorbell, ZMQ_POLLIN, 0}};
    double next_check = act_now() + ACT_TICK_MS / 1e3, spin_until = 0;
    pthread_mutex_lock(&s_shared.step);
    s_shared.ctl = &c;
    __atomic_store_n(&s_shared.live, true, __ATOMIC_RELAXED);
    for (;;) {
        /* Spinning: a look at the sockets and at the doorbell's flag (a user thread rings the
         * eventfd only while this thread sleeps), yielding between looks with the step let go
         * (a waiting user thread may take it). Then a blocking poll, asleep: the flag is looked at
         * again after saying so, and the user thread looks at `asleep` after raising the flag,
         * so one of the two always sees the other. */
        int rc = s_look(&c) ? zmq_poll(items, 2, 0) : 0;
        bool rung = __atomic_load_n(&rt->rung, __ATOMIC_RELAXED);
        if (rc == 0 && !rung && act_now() < spin_until) {
            pthread_mutex_unlock(&s_shared.step);
            do
                sched_yield();
            while (pthread_mutex_trylock(&s_shared.step) != 0);
            continue;
        }
        if (rc == 0 && !rung) {
            __atomic_store_n(&s_shared.asleep, true, __ATOMIC_SEQ_CST);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            if (!__atomic_load_n(&rt->rung, __ATOMIC_SEQ_CST)) {
                /* until the next check, rounded up: woken before it, the check would wait a tick more */
                double wait_ms = ceil((next_check - act_now()) * 1e3);
                pthread_mutex_unlock(&s_shared.step);
                rc = zmq_poll(items, 2, wait_ms < 0 ? 0 : wait_ms > ACT_TICK_MS ? ACT_TICK_MS : (long)wait_ms);
                pthread_mutex_lock(&s_shared.step);
            }
            __atomic_store_n(&s_shared.asleep, false, __ATOMIC_RELAXED);
        }
        if (rc > 0 || rung)
            spin_until = act_now() + act_spin_s();
        if (rc > 0 && (items[1].revents & ZMQ_POLLIN)) {
            uint64_t n;
            if (read(rt->doorbell, &n, sizeof n) < 0) { /* EAGAIN: another wake-up drained it */ }
        }
        s_take_outboxes(rt);
        s_drain(&c);
        s_send_ready(&c);
        if (act_now() >= next_check) {
            double silent_at = s_check_workers(rt);
            if (rt->listening)
                s_beat(rt);
            next_check = fmin(act_now() + ACT_TICK_MS / 1e3, silent_at);
        }
        if (__atomic_load_n(&rt->stopping, __ATOMIC_ACQUIRE))
            break;
    }
    __atomic_store_n(&s_shared.live, false, __ATOMIC_RELAXED);
    s_shared.ctl = NULL;
    pthread_mutex_unlock(&s_shared.step);
    s_stop(&c);
    free(c.sent);
    mb_socket_destroy(&c.router);
    rt->router = NULL;
    if (rt->listening && !rt->insecure)
        mb_curve_stop();
    if (strncmp(rt->endpoint, "ipc://", 6) == 0)
        unlink(rt->endpoint + 6); /* the socket file outlives the socket otherwise */
    return NULL;
}

bool act_controller_asleep(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(&s_shared.asleep, __ATOMIC_SEQ_CST) || !__atomic_load_n(&s_shared.live, __ATOMIC_SEQ_CST);
}

bool act_controller_help(void)
{
    if (!__atomic_load_n(&s_shared.live, __ATOMIC_RELAXED) || pthread_mutex_trylock(&s_shared.step) != 0)
        return false;
    bool stepped = s_shared.live && !__atomic_load_n(&s_shared.asleep, __ATOMIC_RELAXED);
    if (stepped) {
        /* what the step meets (a malformed message it drops) is not the waiting thread's error */
        int code = dt_last_error_code();
        char message[DT_ERRMSG_MAX];
        if (code)
            snprintf(message, sizeof message, "%s", dt_last_error());
        s_ctl *c = s_shared.ctl;
        uint64_t posted = __atomic_load_n(&c->rt->posted, __ATOMIC_ACQUIRE);
        s_take_outboxes(c->rt);
        if (!c->threads_only || posted != c->seen_posted) {
            c->seen_posted = posted; /* the drain takes in everything posted before this load */
            s_drain(c);
        }
        s_send_ready(c);
        if (code)
            dt_err(code, "%s", message);
        else if (dt_last_error_code())
            dt_err_clear();
    }
    pthread_mutex_unlock(&s_shared.step);
    return stepped;
}

/* ---- the controller's side of a timeline (dtorch.profiler) ---------------------------------- */

#define S_HOST_TRACE_MAX (1 << 20)
static pthread_mutex_t s_trace_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool s_tracing;
static int64_t *s_host_trace;   /* (n, 3) rows */
static int64_t s_nhost_trace, s_cap_host_trace;

void act_trace_host(bool on)
{
    pthread_mutex_lock(&s_trace_lock);
    if (on)
        s_nhost_trace = 0;
    atomic_store(&s_tracing, on);
    pthread_mutex_unlock(&s_trace_lock);
}

void act_trace_batch(int64_t device, int64_t records)
{
    if (!atomic_load_explicit(&s_tracing, memory_order_relaxed))
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pthread_mutex_lock(&s_trace_lock);
    if (s_nhost_trace == s_cap_host_trace && s_cap_host_trace < S_HOST_TRACE_MAX) {
        int64_t cap = s_cap_host_trace ? 2 * s_cap_host_trace : 4096;
        int64_t *grown = realloc(s_host_trace, (size_t)cap * 3 * sizeof *grown);
        if (grown) {
            s_host_trace = grown;
            s_cap_host_trace = cap;
        }
    }
    if (s_nhost_trace < s_cap_host_trace) {
        int64_t *row = s_host_trace + 3 * s_nhost_trace++;
        row[0] = device;
        row[1] = records;
        row[2] = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    pthread_mutex_unlock(&s_trace_lock);
}

int64_t dt_trace_host(int64_t *rows, int64_t max)
{
    pthread_mutex_lock(&s_trace_lock);
    int64_t n = s_nhost_trace;
    if (rows && max > 0)
        memcpy(rows, s_host_trace, (size_t)(n < max ? n : max) * 3 * sizeof *rows);
    pthread_mutex_unlock(&s_trace_lock);
    return n;
}
