/* act_controller_inbox — what the workers say to the controller, taken in from its socket: a
 * hello, checked against this controller's protocol and op registry, after which the worker
 * hears of its peers (which processes lend by handle, where remote ones listen); and completions,
 * which return credit and settle futures with values (sent as frames, or lent by handle from a
 * worker process's shared segment, mapped here: actors/worker/act_shm.c) and errors. A message whose routing id
 * names no worker of this run is dropped unread. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_controller.h"
#include "act_future.h"
#include "act_runtime.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dt_shm.h"
#include "mb_curve.h"
#include "mb_rid.h"
#include "mb_schema.h"
#include "op_registry.h"

/* Tells `to` (on another host) where device's peer socket is. */
static void s_send_endpoint(act_runtime *rt, act_device *to, const act_device *device)
{
    mb_writer body = {0};
    mb_encode_endpoint(&body, device->id, device->peer);
    act_controller_send(rt, to, MB_ENDPOINT, &body);
}

/* Tells `to` that device runs as process pid (0: it lends nothing). */
static void s_send_process(act_runtime *rt, act_device *to, int64_t device, int64_t pid)
{
    mb_writer body = {0};
    mb_encode_process(&body, device, pid);
    act_controller_send(rt, to, MB_PROCESS, &body);
}

/* Tells dev that the controller is done with what it lent as hold. */
static void s_send_release(act_runtime *rt, act_device *dev, uint64_t hold)
{
    if (dev->state == ACT_DEV_DEAD)
        return;
    mb_writer body = {0};
    mb_encode_release(&body, hold);
    act_controller_send(rt, dev, MB_RELEASE, &body);
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
        act_controller_died(rt, dev, dt_last_error());
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
        act_controller_died(rt, dev, why);
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
    act_controller_send_empty(rt, dev, MB_HEARTBEAT);
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
        act_controller_down(rt, dev, why);
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
            act_controller_abort(rt, dev, gone->id);
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

void act_controller_drain(act_runtime *rt)
{
    for (;;) {
        mb_message m;
        int rc = mb_recv(rt->router, true, true, &m);
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
        act_device *dev = act_controller_device(rt, id);
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
            act_controller_died(rt, dev, "messages arrived out of order");
        } else if (m.header.kind == MB_BYE) {
            dev->bye = true;
        } else {
            act_controller_take(rt, dev, &m);
        }
        mb_message_close(&m);
    }
}
