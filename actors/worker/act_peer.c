/* act_peer — workers exchanging regions of their pieces for a redistribute, without the
 * controller in the path.
 *
 * Each worker binds a peer socket next to the controller's endpoint. A worker process keeps one
 * DEALER per peer it sends to; a worker thread has one ROUTER connected to every peer it sends to
 * (inproc pipes hold no file descriptors, so a mesh of n thread workers needs 3n sockets, not n^2:
 * 512 devices work). A SEND posts one region; an ASSEMBLE builds a new piece from local regions
 * and received ones, waiting for the latter. Worker threads of one process whose backend can
 * copy out of a peer's memory pass a reference to the sender's (immutable) storage and the
 * receiver copies straight out of it: shared memory, no serialization. Worker processes of one
 * host lend a large region by handle to its place in the sender's shared segment, which the
 * receiver maps and copies from, then releases (act_shm.c); otherwise the region's bytes travel
 * as a frame in host memory. Every copy and combination goes through the device's backend table.
 *
 * A wait never blocks forever on a dead peer: the controller broadcasts an ABORT naming a dead
 * device, and an ASSEMBLE that still needs a region from it fails (its output is poisoned). */
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "act_inbox.h"
#include "act_worker.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "mb_schema.h"

#define S_WAIT_POLL_MS 500 /* how often a waiting ASSEMBLE looks up from its sockets */
#define S_INBOX_LOOKS 32   /* a spinning worker thread looks at its inbox this often per look at its sockets */

/* Local workers: the peer socket of a device is named after the controller's endpoint (in the
 * run's private directory, or inproc). */
static void s_peer_endpoint(const char *base, int64_t device, char *buf, size_t size)
{
    snprintf(buf, size, "%s-peer-%" PRId64, base, device);
}

bool act_peer_endpoint(const act_worker *w, int64_t device, char *buf, size_t size)
{
    if (!w->remote) {
        s_peer_endpoint(w->endpoint, device, buf, size);
        return true;
    }
    const char *told = dt_idmap_get(&w->endpoints, (uint64_t)device + 1);
    if (!told) {
        dt_err(DT_EDEVICE, "the controller never said where device %" PRId64 "'s peer socket is", device);
        return false;
    }
    snprintf(buf, size, "%s", told);
    return true;
}

/* A remote worker binds its peer socket on its own host, on a port the system picks, and says
 * where in its hello; with keys, it is a CURVE server that admits the run's workers only. */
static int s_open_remote(act_worker *w)
{
    mb_tcp_addr addr;
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://%s:*", w->peer_host);
    if (mb_tcp_parse(endpoint, true, &addr) != 0 || addr.any_addr)
        return dt_err(DT_EINVAL, "device %" PRId64 ": the peer address '%s' is not an IPv4 address", w->device,
                      w->peer_host);
    mb_curve server = {&w->keys, NULL};
    w->peer = mb_socket_open(MB_ROUTER, endpoint, true, NULL, w->curve ? &server : NULL);
    if (!w->peer)
        return dt_last_error_code();
    char bound[256] = "";
    size_t len = sizeof bound - 1;
    if (zmq_getsockopt(zsock_resolve(w->peer), ZMQ_LAST_ENDPOINT, bound, &len) != 0 ||
        mb_tcp_parse(bound, false, &addr) != 0)
        return dt_err(DT_ESYS, "device %" PRId64 ": cannot tell where its peer socket is bound ('%s')", w->device,
                      bound);
    mb_tcp_format(&addr, w->peer_endpoint, sizeof w->peer_endpoint);
    return 0;
}

int act_peer_open(act_worker *w)
{
    if (w->remote)
        return s_open_remote(w);
    char endpoint[300];
    s_peer_endpoint(w->endpoint, w->device, endpoint, sizeof endpoint);
    w->peer = mb_socket_new(MB_ROUTER, endpoint, true, NULL);
    if (!w->peer)
        return dt_last_error_code();
    if (w->same_process) {
        /* `out` too (s_peer_router): every socket a worker thread needs is had at its start, so
         * one that cannot be had stops its start, never a transfer halfway */
        char own[MB_RID_MAX];
        mb_rid_format(own, 'w', w->device, w->token);
        if (!(w->out = mb_socket_new(MB_ROUTER, NULL, false, own)))
            return dt_last_error_code();
        int one = 1;
        zmq_setsockopt(zsock_resolve(w->out), ZMQ_ROUTER_MANDATORY, &one, sizeof one);
        if (!(w->inbox = act_inbox_get(w->endpoint, w->device)))
            return dt_last_error_code();
    }
    return 0;
}

void act_recv_free(act_recv *r)
{
    if (!r)
        return;
    act_storage_release(r->storage);
    free(r->error);
    free(r);
}

/* Frees a region this worker is done with; one lent by handle goes back to its lender. */
static void s_recv_done(act_worker *w, act_recv *r)
{
    if (r && r->lent)
        act_shm_give_back(w, r);
    act_recv_free(r);
}

/* The region of transfer, out of the stash (NULL: none there). */
static act_recv *s_recv_take(act_worker *w, uint64_t transfer)
{
    act_recv *r = dt_idmap_take(&w->received, transfer);
    if (r)
        w->recv_bytes -= r->bytes;
    return r;
}

void act_peer_close(act_worker *w)
{
    size_t cursor = 0;
    uint64_t id;
    void *value;
    while (dt_idmap_next(&w->received, &cursor, &id, &value))
        act_recv_free(value);
    dt_idmap_destroy(&w->received);
    w->recv_bytes = 0;
    if (w->inbox) {
        act_inbox_close(w->inbox);
        act_inbox_put(w->inbox);
        w->inbox = NULL;
    }
    cursor = 0;
    while (dt_idmap_next(&w->boxes, &cursor, &id, &value))
        act_inbox_put(value);
    dt_idmap_destroy(&w->boxes);
    act_shm_close(w);
    cursor = 0;
    while (dt_idmap_next(&w->peers, &cursor, &id, &value)) {
        zsock_t *sock = value;
        if (w->orphaned)
            zsock_set_linger(sock, 0); /* the run is over: what is still queued goes nowhere */
        mb_socket_destroy(&sock);
    }
    dt_idmap_destroy(&w->peers);
    dt_idmap_destroy(&w->linked);
    mb_socket_destroy(&w->out);
    mb_socket_destroy(&w->peer);
    char endpoint[300];
    s_peer_endpoint(w->endpoint, w->device, endpoint, sizeof endpoint);
    if (!w->remote && strncmp(endpoint, "ipc://", 6) == 0)
        unlink(endpoint + 6); /* the socket file outlives the socket otherwise */
}

#define S_PEER_SEND_TIMEOUT_MS 500 /* a send to a peer that has no socket any more gives up after this */

/* Worker threads: `out` (opened by act_peer_open) connected to device's peer socket under the
 * routing id "d<device>" (the peer sees this worker as "w<device>", as from a DEALER). Unroutable
 * sends fail instead of vanishing (ZMQ_ROUTER_MANDATORY); an inproc connect is routable at once,
 * even before the peer binds. NULL + dt_last_error when the link cannot be made. */
static zsock_t *s_peer_router(act_worker *w, int64_t device, char *rid, size_t size)
{
    act_worker_beat(w); /* a socket or a link to make: ZeroMQ's locks may keep it waiting, which is not stuck */
    snprintf(rid, size, "d%" PRId64, device);
    if (!dt_idmap_get(&w->linked, (uint64_t)device + 1)) {
        char endpoint[300];
        s_peer_endpoint(w->endpoint, device, endpoint, sizeof endpoint);
        void *handle = zsock_resolve(w->out);
        if (zmq_setsockopt(handle, ZMQ_CONNECT_ROUTING_ID, rid, strlen(rid)) != 0 ||
            zmq_connect(handle, endpoint) != 0) {
            dt_err(DT_ESYS, "cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
            return NULL;
        }
        if (dt_idmap_put(&w->linked, (uint64_t)device + 1, w) != 0) {
            dt_err(DT_ENOMEM, "out of memory");
            return NULL;
        }
    }
    return w->out;
}

zsock_t *act_peer_socket(act_worker *w, int64_t device)
{
    zsock_t *sock = dt_idmap_get(&w->peers, (uint64_t)device + 1);
    if (sock)
        return sock;
    act_worker_beat(w);
    char endpoint[300], rid[MB_RID_MAX];
    if (!act_peer_endpoint(w, device, endpoint, sizeof endpoint))
        return NULL;
    mb_rid_format(rid, 'w', w->device, w->token);
    /* every worker of a run holds the same key pair: a peer's server key is its own public one */
    mb_curve client = {&w->keys, w->keys.public_key};
    sock = mb_socket_open(MB_DEALER, endpoint, false, rid, w->curve ? &client : NULL);
    if (sock)
        zsock_set_sndtimeo(sock, S_PEER_SEND_TIMEOUT_MS);
    if (sock && dt_idmap_put(&w->peers, (uint64_t)device + 1, sock) != 0)
        mb_socket_destroy(&sock);
    return sock;
}

/* Whether a region of a C-contiguous piece is one contiguous run of bytes. */
static bool s_contiguous(int ndim, const int64_t *piece, const int64_t *region)
{
    int d = 0;
    while (d < ndim && region[d] == 1)
        d++;
    for (int e = d + 1; e < ndim; e++)
        if (region[e] != piece[e])
            return false;
    return true;
}

/* The region of t at start (byte strides of t) as a payload frame in host memory: straight from
 * t's storage when it is one run of bytes the host can read in place, else a host copy. */
static const char *s_region_frame(act_worker *w, const act_wtensor *t, const char *start, const int64_t *strides,
                                  const mb_dims *shape, mb_buf *frame)
{
    const op_backend *be = w->backend;
    size_t elem = dt_dtype_size(t->dtype), bytes = (size_t)dt_layout_numel(shape->n, shape->v) * elem;
    if (be->host_view && s_contiguous(shape->n, t->shape, shape->v)) {
        atomic_fetch_add(&t->storage->refs, 1);
        *frame = (mb_buf){(void *)be->host_view(start), bytes, act_storage_free_fn, t->storage};
        return NULL;
    }
    int64_t host_strides[DT_MAX_DIMS];
    dt_layout_strides(shape->n, shape->v, elem, host_strides);
    void *host = malloc(bytes ? bytes : 1);
    const char *why = host ? be->to_host(host, host_strides, start, strides, shape->n, shape->v, elem)
                           : "out of memory on the device";
    if (why) {
        free(host);
        return why;
    }
    *frame = (mb_buf){host, bytes, mb_buf_free, NULL};
    return NULL;
}

/* A SEND whose receiver cannot be reached: said here; the receiver waits until the controller
 * declares a device dead. */
static bool s_unreachable(const act_worker *w, int64_t to)
{
    fprintf(stderr, "dtorch worker %" PRId64 ": cannot reach device %" PRId64 ": %s\n", w->device, to,
            dt_last_error());
    return true;
}

/* The inbox of device `to` (worker threads), found on first use and kept; NULL + dt_last_error. */
static act_inbox *s_inbox_of(act_worker *w, int64_t to)
{
    act_inbox *box = dt_idmap_get(&w->boxes, (uint64_t)to + 1);
    if (box)
        return box;
    if (!(box = act_inbox_get(w->endpoint, to)))
        return NULL;
    if (dt_idmap_put(&w->boxes, (uint64_t)to + 1, box) != 0) {
        act_inbox_put(box);
        dt_err(DT_ENOMEM, "out of memory");
        return NULL;
    }
    return box;
}

/* SEND between worker threads that read each other's memory (or of a region that could not be
 * made: t NULL, why says why): the region the receiver would decode from a REGION message, made
 * here and pushed onto its inbox (act_inbox.h). The region holds a reference to t's storage. */
static bool s_hand_over(act_worker *w, const mb_send_rec *r, act_wtensor *t, const char *start,
                        const int64_t *strides, size_t bytes, const char *why)
{
    act_inbox *box = s_inbox_of(w, r->to);
    act_recv *got = box ? calloc(1, sizeof *got) : NULL;
    if (!got)
        return s_unreachable(w, r->to);
    got->transfer = r->transfer;
    got->from = w->device;
    got->ndim = (int)r->shape.n;
    memcpy(got->shape, r->shape.v, (size_t)r->shape.n * sizeof *r->shape.v);
    got->in_place = true;
    if (!t) {
        got->dtype = DT_FLOAT32;
        got->status = DT_EKERNEL;
        got->error = strdup(why ? why : "a peer could not send its region");
    } else {
        got->dtype = t->dtype;
        atomic_fetch_add(&t->storage->refs, 1);
        got->storage = t->storage;
        got->data = start;
        memcpy(got->strides, strides, (size_t)r->shape.n * sizeof *strides);
        got->peer = true;
        got->bytes = bytes;
    }
    if (!act_inbox_push(box, got)) {
        /* the receiver left: later regions for it are dropped at once, as a gone socket's are */
        act_recv_free(got);
        dt_idmap_put(&w->dead, (uint64_t)r->to + 1, w);
        return true;
    }
    w->stats[MB_STAT_peer_messages_sent]++;
    w->stats[MB_STAT_peer_handoffs]++;
    if (t)
        w->stats[MB_STAT_peer_bytes_sent] += (int64_t)bytes;
    return true;
}

/* SEND: the region to its peer as one REGION message. Thread workers that read each other's
 * memory hand the receiver the region itself instead (s_hand_over): the sender's storage, kept
 * alive for the receiver, and the region's address; a worker process lends a large region of a
 * piece in shared memory by handle (held until the receiver's RELEASE); others send the region's
 * bytes as the message's frame. A failure is sent too, so that the receiver's ASSEMBLE fails with
 * it instead of waiting. */
bool act_peer_send(act_worker *w, mb_cursor *rec)
{
    mb_send_rec r;
    if (mb_read_send(rec, &r) != 0)
        return false;
    if (r.offset.n != r.shape.n || r.to < 0 || r.to > DT_MAX_DEVICE_ID) {
        dt_err(DT_EPROTO, "malformed send record: %s", r.offset.n != r.shape.n
                                                            ? "the region's offset and shape disagree"
                                                            : "its receiver is no device id");
        return false;
    }
    if (dt_idmap_get(&w->dead, (uint64_t)r.to + 1))
        return true; /* the receiver is gone: nobody waits for the region */
    char rid[32] = "";
    zsock_t *sock = w->same_process ? NULL : act_peer_socket(w, r.to);
    if (!w->same_process && !sock)
        return s_unreachable(w, r.to);
    const char *why = NULL;
    act_wtensor *t = act_wtensor_lookup(w, r.id, &why);
    if (t && !(t->ndim == r.shape.n && dt_layout_region_inside(r.shape.n, t->shape, r.offset.v, r.shape.v))) {
        why = "a region outside the piece";
        t = NULL;
    }
    mb_writer body = {0};
    mb_buf frame = {NULL, 0, NULL, NULL};
    int nframes = 0;
    int64_t strides[DT_MAX_DIMS];
    const char *start = NULL;
    act_handle lent = {.segment = -1};
    size_t bytes = t ? (size_t)dt_layout_numel(r.shape.n, r.shape.v) * dt_dtype_size(t->dtype) : 0;
    /* by address when the receiver can read this device's memory in place; the work queued on it
     * (what made the piece) is finished first, as the receiver's reads are not ordered after it */
    const op_backend *be = w->backend;
    bool by_address = w->read_peers && (!be->peer_can_read || be->peer_can_read(r.to));
    if (t && by_address && be->synchronize && (why = be->synchronize()))
        t = NULL;
    if (t) {
        dt_layout_strides(t->ndim, t->shape, dt_dtype_size(t->dtype), strides);
        size_t at = 0; /* the region's first byte in the piece */
        for (int d = 0; d < r.shape.n; d++)
            at += (size_t)(r.offset.v[d] * strides[d]);
        if (!by_address)
            lent = act_shm_lend(w, t, at, bytes, r.to); /* may move the piece's bytes */
        start = t->data + at;
        if (!by_address && lent.segment < 0 && (why = s_region_frame(w, t, start, strides, &r.shape, &frame)))
            t = NULL;
    }
    if (w->same_process && (!t || by_address))
        return s_hand_over(w, &r, t, start, strides, bytes, why);
    if (w->same_process && !(sock = s_peer_router(w, r.to, rid, sizeof rid))) {
        if (frame.free_fn)
            frame.free_fn(frame.data, frame.hint);
        return s_unreachable(w, r.to);
    }
    if (!t) {
        mb_encode_region(&body, r.transfer, DT_EKERNEL, DT_FLOAT32, r.shape.n, r.shape.v, why, 0, 0, 0, NULL, -1, 0,
                         0, 0);
    } else if (by_address) {
        /* the reference the region carries rides on an empty frame: ZeroMQ lets it go when the
         * message dies, read or not (a receiver that left at shutdown never reads it) */
        atomic_fetch_add(&t->storage->refs, 1);
        frame = (mb_buf){t->storage->data, 0, act_storage_free_fn, t->storage};
        nframes = 1;
        mb_encode_region(&body, r.transfer, 0, t->dtype, r.shape.n, r.shape.v, NULL, (uint64_t)(uintptr_t)t->storage,
                         (uint64_t)(uintptr_t)start, r.shape.n, strides, -1, 0, 0, 0);
    } else if (lent.segment >= 0) {
        mb_encode_region(&body, r.transfer, 0, t->dtype, r.shape.n, r.shape.v, NULL, 0, 0, r.shape.n, strides,
                         lent.segment, lent.serial, lent.offset, lent.hold);
    } else {
        mb_encode_region(&body, r.transfer, 0, t->dtype, r.shape.n, r.shape.v, NULL, 0, 0, 0, NULL, -1, 0, 0, 0);
        nframes = 1;
    }
    mb_header h = {MB_VERSION, MB_PEER, w->peer_seq++, (uint32_t)w->device, 1};
    if (body.failed) {
        /* no message at all rather than a truncated one; the receiver's wait ends with the runtime */
        free(mb_w_release(&body));
        if (frame.free_fn)
            frame.free_fn(frame.data, frame.hint);
        act_shm_unlend(w, lent.hold);
        return true;
    }
    if (mb_send(sock, rid[0] ? rid : NULL, strlen(rid), &h, act_body_frame(&body), &frame, nframes) == 0) {
        w->stats[MB_STAT_peer_messages_sent]++;
        if (t)
            w->stats[MB_STAT_peer_bytes_sent] += (int64_t)bytes;
        if (lent.segment >= 0)
            w->stats[MB_STAT_shm_bytes_sent] += (int64_t)bytes;
    } else {
        /* only a peer without a socket any more makes a send wait (high-water marks are off) or,
         * through the ROUTER, fail: it left or died, so later regions for it are dropped at once */
        dt_idmap_put(&w->dead, (uint64_t)r.to + 1, w);   /* (mb_send let the frames go, references too) */
        act_shm_unlend(w, lent.hold);
    }
    return true;
}

/* The received frame as this device's memory: adopted in place when the backend can use host
 * memory as it is, else copied to the device. Takes the frame. */
static const char *s_frame_storage(act_worker *w, zmq_msg_t *frame, act_storage **out)
{
    const op_backend *be = w->backend;
    void *data = zmq_msg_data(frame);
    size_t size = zmq_msg_size(frame);
    if (be->adopt_host && be->adopt_host(data, size) && (*out = act_storage_adopt(frame)))
        return NULL;
    if (!(*out = act_storage_piece(w, size)))
        return act_worker_no_memory(w);
    return act_copy_bytes(be->to_device, (*out)->data, data, size);
}

/* Counts one more of stat, and says so on stderr at the first and then at each doubling: a process
 * that floods the socket gets a few lines, not one per message. */
static void s_tell(act_worker *w, mb_stat stat, const char *what)
{
    int64_t n = ++w->stats[stat];
    if ((n & (n - 1)) == 0)
        fprintf(stderr, "dtorch worker %" PRId64 ": %s (%" PRId64 " so far)\n", w->device, what, n);
}

/* Stashes got, of bytes, until the ASSEMBLE that claims it, within ACT_RECV_MAX regions and
 * ACT_RECV_MAX_BYTES bytes. A region past the bytes is kept as a failure that says why, its bytes
 * let go (a region lent by handle is given back), so that its ASSEMBLE fails instead of waiting; one
 * past the count is dropped whole. */
static void s_keep(act_worker *w, uint64_t transfer, act_recv *got, uint64_t bytes)
{
    if (w->received.count >= ACT_RECV_MAX) {
        s_tell(w, MB_STAT_peer_regions_dropped, "dropped a region from a peer: too many were waiting to be assembled");
        s_recv_done(w, got);
        return;
    }
    if (bytes > ACT_RECV_MAX_BYTES - w->recv_bytes) {
        char why[DT_ERRMSG_MAX];
        snprintf(why, sizeof why, "a region of %" PRIu64 " bytes from device %" PRId64 " was let go on arrival: %"
                 PRIu64 " bytes of regions were already waiting to be assembled (at most %llu)", bytes, got->from,
                 w->recv_bytes, ACT_RECV_MAX_BYTES);
        if (got->lent)
            act_shm_give_back(w, got);
        act_storage_release(got->storage);
        free(got->error);
        got->lent = got->peer = false;
        got->storage = NULL;
        got->status = DT_ENOMEM;
        got->error = strdup(why);
        bytes = 0;
        s_tell(w, MB_STAT_peer_regions_dropped, "let go of a region's bytes: too many were waiting to be assembled");
    }
    if (dt_idmap_put(&w->received, transfer, got) != 0) {
        s_recv_done(w, got);
        return;
    }
    got->bytes = bytes;
    w->recv_bytes += bytes;
}

/* Decodes one peer message into a stashed region. */
static void s_stash(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    mb_cursor rec;
    mb_region_rec region;
    if (act_body_open(&r, m) != 0)
        return;
    act_recv *got = calloc(1, sizeof *got);
    if (!got || mb_body_next(&r, &rec) != 1 || mb_decode_region(&rec, &region) != 0) {
        fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed region from a peer: %s\n", w->device,
                got ? dt_last_error() : "out of memory");
        free(got);
        return;
    }
    got->dtype = region.dtype;
    got->ndim = region.shape.n;
    memcpy(got->shape, region.shape.v, (size_t)region.shape.n * sizeof *region.shape.v);
    got->status = (int)region.status;
    got->from = m->header.sender;
    got->copy = w->backend->copy_region;
    got->in_place = true;
    /* a handle is given back to its lender whatever becomes of the region */
    got->lent = region.segment >= 0 && !w->same_process;
    got->handle = (act_handle){region.segment, region.serial, region.offset, region.hold};
    if (region.status != 0) {
        got->error = region.error.ptr ? strndup(region.error.ptr, region.error.len)
                                      : strdup("a peer could not send its region");
    } else if (region.segment >= 0) {
        /* mapped when the ASSEMBLE that needs it runs (act_shm_map_region), which knows its sender */
        if (w->same_process) {
            got->status = DT_EPROTO;
            got->error = strdup("a peer sent a region by handle to a worker thread");
        } else if (region.strides.n != got->ndim) {
            got->status = DT_EPROTO;
            got->error = strdup("a peer sent a region with strides of the wrong rank");
        } else {
            memcpy(got->strides, region.strides.v, (size_t)region.strides.n * sizeof *region.strides.v);
        }
    } else if (region.storage) {
        /* an address is only meaningful, and only trusted, between threads of this process */
        if (!w->read_peers) {
            got->status = DT_EPROTO;
            got->error = strdup("a peer sent a region by address to a worker that cannot read it");
        } else {
            got->storage = (act_storage *)(uintptr_t)region.storage;
            atomic_fetch_add(&got->storage->refs, 1); /* the message's empty frame holds one until it closes */
            got->copy = w->backend->copy_from_peer;
            got->peer = true;
            got->data = (const char *)(uintptr_t)region.data;
            if (region.strides.n != got->ndim) {
                got->status = DT_EPROTO;
                got->error = strdup("a peer sent a region with strides of the wrong rank");
            }
            memcpy(got->strides, region.strides.v, (size_t)region.strides.n * sizeof *region.strides.v);
        }
    } else {
        size_t elem = dt_dtype_size(region.dtype);
        const char *why = NULL;
        if (m->npayloads != 1 || zmq_msg_size(&m->payloads[0]) != (size_t)dt_layout_numel(got->ndim, got->shape) * elem)
            why = "a peer sent a region of the wrong size";
        else if (!(why = s_frame_storage(w, &m->payloads[0], &got->storage))) {
            got->data = got->storage->data;
            dt_layout_strides(got->ndim, got->shape, elem, got->strides);
        }
        if (why) {
            got->status = DT_EPROTO;
            got->error = strdup(why);
        }
    }
    uint64_t bytes = got->status == 0 ? (uint64_t)dt_layout_numel(got->ndim, got->shape) * dt_dtype_size(region.dtype) : 0;
    w->stats[MB_STAT_peer_messages_received]++;
    w->stats[MB_STAT_peer_bytes_received] += (int64_t)bytes;
    s_recv_done(w, s_recv_take(w, region.transfer));
    s_keep(w, region.transfer, got, bytes);
}

/* Stashes the regions peer threads handed over (s_hand_over), as s_stash does a message's; how
 * many there were. */
int act_peer_take_handed(act_worker *w)
{
    act_recv *got = w->inbox ? act_inbox_take(w->inbox) : NULL;
    int n = 0;
    for (; got; n++) {
        act_recv *next = got->next;
        got->next = NULL;
        if (got->peer) {
            got->copy = w->backend->copy_from_peer;
            if (!w->read_peers) { /* never made so: the sender reads peers as this worker does */
                act_storage_release(got->storage);
                got->storage = NULL;
                got->peer = false;
                got->status = DT_EPROTO;
                got->error = strdup("a peer sent a region by address to a worker that cannot read it");
            }
        }
        uint64_t bytes = got->status == 0 ? got->bytes : 0;
        w->stats[MB_STAT_peer_messages_received]++;
        w->stats[MB_STAT_peer_bytes_received] += (int64_t)bytes;
        s_recv_done(w, s_recv_take(w, got->transfer));
        s_keep(w, got->transfer, got, bytes);
        got = next;
    }
    return n;
}

/* The device a peer message comes from: the one its header names, when the routing id of the link
 * it came on ("w<device>", with the run's token for worker processes) names that device too; else
 * -2, a message from a process that is no worker of this run or one that names another device. */
static int64_t s_peer_sender(const act_worker *w, const mb_message *m)
{
    int64_t named = mb_rid_device(m->routing_id, m->routing_id_len, 'w', w->token);
    return named >= 0 && named == (int64_t)m->header.sender ? named : -2;
}

void act_peer_take(act_worker *w, mb_message *m)
{
    int64_t from = s_peer_sender(w, m);
    if (from < 0)
        s_tell(w, MB_STAT_peer_messages_refused, "refused a message on its peer socket that no worker of this "
               "run sent under its own name");
    else if (m->header.kind == MB_PEER)
        s_stash(w, m);
    else if (m->header.kind == MB_RELEASE)
        act_shm_on_release(w, m, from);
    mb_message_close(m);
}

void act_peer_receive(act_worker *w)
{
    mb_message m;
    while (mb_recv(w->peer, true, true, &m) == 0)
        act_peer_take(w, &m);
}

/* One round of a worker thread's wait: while spinning, the inbox S_INBOX_LOOKS times (a handed
 * region is seen within a look) and then the sockets once; after, asleep on the sockets and the
 * inbox's doorbell. The number of sockets with an event, or < 0. */
static int s_inbox_poll(act_worker *w, zmq_pollitem_t *items, double *spin_until)
{
    if (act_now() < *spin_until) {
        for (int i = 0; i < S_INBOX_LOOKS; i++) {
            if (act_peer_take_handed(w) > 0)
                return 0; /* the caller looks for its region among them */
            sched_yield();
        }
        int rc = zmq_poll(items, 2, 0);
        if (rc > 0)
            *spin_until = act_now() + act_spin_s();
        return rc;
    }
    if (!act_inbox_sleep(w->inbox))
        return 0;
    int rc = zmq_poll(items, 3, S_WAIT_POLL_MS);
    act_inbox_awake(w->inbox);
    if (rc > 0)
        *spin_until = act_now() + act_spin_s();
    return rc - (rc > 0 && items[2].revents);
}

void act_peer_wait(act_worker *w, double *spin_until)
{
    act_worker_beat(w); /* waiting for a peer is not being stuck */
    zmq_pollitem_t items[3] = {{zsock_resolve(w->peer), 0, ZMQ_POLLIN, 0}, {zsock_resolve(w->sock), 0, ZMQ_POLLIN, 0},
                               {NULL, w->inbox ? act_inbox_fd(w->inbox) : -1, ZMQ_POLLIN, 0}};
    if ((w->inbox ? s_inbox_poll(w, items, spin_until) : act_poll(items, 2, S_WAIT_POLL_MS, spin_until)) < 0)
        return;
    if (items[0].revents & ZMQ_POLLIN)
        act_peer_receive(w);
    if (items[1].revents & ZMQ_POLLIN) {
        mb_message m;
        if (mb_recv(w->sock, false, true, &m) == 0)
            act_worker_defer(w, &m);
    }
}

/* The region of transfer from device `from`, waiting for it; NULL (and why) when it cannot come. */
static act_recv *s_await(act_worker *w, uint64_t transfer, int64_t from, char *why, size_t size)
{
    /* a peer's region is often microseconds away (the devices of a collective run the same ops):
     * spin a while before sleeping, as the worker's own loop does */
    double spin_until = act_now() + act_spin_s();
    for (;;) {
        act_peer_take_handed(w);
        act_recv *got = s_recv_take(w, transfer);
        if (got)
            return got;
        if (dt_idmap_get(&w->dead, (uint64_t)from + 1)) {
            snprintf(why, size, "device %" PRId64 " died before sending its region", from);
            return NULL;
        }
        if (w->leaving) {
            snprintf(why, size, "the runtime is shutting down");
            return NULL;
        }
        if (act_worker_orphaned(w)) {
            snprintf(why, size, "%s", dt_last_error());
            return NULL;
        }
        act_peer_wait(w, &spin_until);
    }
}

/* Whether a region laid out with these strides is one run of bytes in row-major order. */
static bool s_dense(int ndim, const int64_t *shape, const int64_t *strides, size_t elem)
{
    int64_t expect = (int64_t)elem;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] != 1 && strides[d] != expect)
            return false;
        expect *= shape[d];
    }
    return true;
}

/* A region's source: where it is, the copy that reads it (a peer's memory, host memory or this
 * device's), and whether combine may read it as it is. */
typedef struct {
    const char *data;
    const int64_t *strides;
    op_copy_fn copy;
    bool in_place;
} s_source;

/* Combines a region into place with op, through contiguous scratch copies on the device when the
 * region is not one run of bytes on both sides (or combine cannot read it in place). */
static const char *s_reduce_region(const op_backend *be, char *dst, const int64_t *dst_strides, s_source src, int ndim,
                                   const int64_t *shape, dt_dtype dtype, dt_reduce_op op)
{
    size_t elem = dt_dtype_size(dtype);
    int64_t n = dt_layout_numel(ndim, shape), contiguous[DT_MAX_DIMS];
    dt_layout_strides(ndim, shape, elem, contiguous);
    if (src.in_place && s_dense(ndim, shape, dst_strides, elem) && s_dense(ndim, shape, src.strides, elem))
        return be->combine(dst, dst, src.data, dtype, n, op); /* one pass, the common case */
    size_t bytes = (size_t)n * elem;
    char *a = be->alloc(bytes), *b = be->alloc(bytes);
    const char *why = a && b ? NULL : "out of memory on the device";
    if (!why)
        why = be->copy_region(a, contiguous, dst, dst_strides, ndim, shape, elem);
    if (!why)
        why = src.copy(b, contiguous, src.data, src.strides, ndim, shape, elem);
    if (!why)
        why = be->combine(a, a, b, dtype, n, op);
    if (!why)
        why = be->copy_region(dst, dst_strides, a, contiguous, ndim, shape, elem);
    if (a)
        be->free(a, bytes);
    if (b)
        be->free(b, bytes);
    return why;
}

/* A region copied into place and then combined with a second one (a reduce-scatter's own part and
 * a peer's): dst = a (op) b in one pass when both read in place, which saves writing dst twice. */
static const char *s_copy_reduce_region(const op_backend *be, char *dst, const int64_t *dst_strides, s_source a,
                                        s_source b, int ndim, const int64_t *shape, dt_dtype dtype, dt_reduce_op op)
{
    size_t elem = dt_dtype_size(dtype);
    if (a.in_place && b.in_place && s_dense(ndim, shape, dst_strides, elem) && s_dense(ndim, shape, a.strides, elem) &&
        s_dense(ndim, shape, b.strides, elem))
        return be->combine(dst, a.data, b.data, dtype, dt_layout_numel(ndim, shape), op);
    const char *why = a.copy(dst, dst_strides, a.data, a.strides, ndim, shape, elem);
    return why ? why : s_reduce_region(be, dst, dst_strides, b, ndim, shape, dtype, op);
}

/* Where part p's region comes from: the local piece src, or the region a peer sends (waited for,
 * and kept in *got until the caller is done with it). On failure, why (if still empty) says why. */
static s_source s_part_source(act_worker *w, const mb_part_rec *p, act_wtensor *src, const int64_t *src_strides,
                              const char *lookup_why, dt_dtype dtype, act_recv **got, char *why, size_t size)
{
    const op_backend *be = w->backend;
    int ndim = p->shape.n;
    s_source from = {NULL, NULL, be->copy_region, true};
    *got = NULL;
    if (p->transfer) {
        /* wait even after a failure, so the region does not linger in the stash */
        char wait_why[DT_ERRMSG_MAX];
        act_recv *g = *got = s_await(w, p->transfer, p->from, wait_why, sizeof wait_why);
        if (!g) {
            if (!why[0])
                snprintf(why, size, "%s", wait_why);
            return from;
        }
        if (g->status != 0) {
            /* never an empty why, which would read as no failure: a peer's message may be "" */
            if (!why[0])
                snprintf(why, size, "%s", g->error && g->error[0] ? g->error : "a peer could not send its region");
            return from;
        }
        bool same = g->ndim == ndim && g->dtype == dtype;
        for (int d = 0; same && d < ndim; d++)
            same = g->shape[d] == p->shape.v[d];
        const char *err = NULL;
        if (!same && !why[0])
            snprintf(why, size, "a peer sent a region of the wrong shape or dtype");
        else if (g->lent && !why[0] && (err = act_shm_map_region(w, g, p->from, dt_dtype_size(dtype))))
            snprintf(why, size, "%s", err);
        return (s_source){g->data, g->strides, g->copy, g->in_place};
    }
    if (!src) {
        if (!why[0])
            snprintf(why, size, "%s", lookup_why ? lookup_why : "the source piece is missing");
        return from;
    }
    bool within = src->ndim == ndim && dt_layout_region_inside(ndim, src->shape, p->src_offset.v, p->shape.v);
    if (!within && !why[0])
        snprintf(why, size, "a region outside the source piece");
    else if (src->dtype != dtype && !why[0]) /* its strides, and the bytes copied, are counted in dtype's elements */
        snprintf(why, size, "the source piece is %s, not %s", dt_dtype_name(src->dtype), dt_dtype_name(dtype));
    from.data = src->data;
    for (int d = 0; within && d < ndim; d++)
        from.data += p->src_offset.v[d] * src_strides[d];
    from.strides = src_strides;
    return from;
}

/* Whether part q is a REDUCE of exactly the region part p wrote. */
static bool s_same_region(const mb_part_rec *p, const mb_part_rec *q)
{
    if (q->mode != MB_PART_REDUCE || q->src_offset.n != p->shape.n || q->dst_offset.n != p->shape.n ||
        q->shape.n != p->shape.n)
        return false;
    for (int d = 0; d < p->shape.n; d++)
        if (q->dst_offset.v[d] != p->dst_offset.v[d] || q->shape.v[d] != p->shape.v[d])
            return false;
    return true;
}

/* The storage an ASSEMBLE of bytes builds its piece in: a new one, or with `into` the piece's own
 * when the piece is of that dtype and shape and nothing else holds its storage (a fetch, a transfer
 * or a replica issued before keeps reading the old value from the storage it holds). */
static act_storage *s_assemble_storage(act_worker *w, const mb_assemble_rec *r, size_t bytes)
{
    act_wtensor *old = r->into ? dt_idmap_get(&w->tensors, r->id) : NULL;
    bool same = old && act_wtensor_sole(old) && old->storage->size == bytes && old->dtype == r->dtype &&
                old->ndim == r->shape.n;
    for (int d = 0; same && d < r->shape.n; d++)
        same = old->shape[d] == r->shape.v[d];
    if (!same)
        return act_storage_piece(w, bytes);
    atomic_fetch_add(&old->storage->refs, 1); /* the old piece's goes when the new one takes its id */
    return old->storage;
}

/* ASSEMBLE: the new piece from its parts, waiting for the regions that come from peers. Any
 * failure poisons the piece with a message naming this device. */
bool act_peer_assemble(act_worker *w, mb_cursor *rec)
{
    const op_backend *be = w->backend;
    mb_assemble_rec r;
    if (mb_read_assemble(rec, &r) != 0)
        return false;
    act_wtensor *out = act_wtensor_new(w);
    char why[DT_ERRMSG_MAX] = "";
    if (!out) {
        snprintf(why, sizeof why, "out of memory on the device");
    } else {
        out->dtype = r.dtype;
        out->ndim = r.shape.n;
        memcpy(out->shape, r.shape.v, (size_t)r.shape.n * sizeof *r.shape.v);
    }
    int ndim = r.shape.n;
    size_t elem = dt_dtype_size(r.dtype);
    const char *lookup_why = NULL;
    act_wtensor *src = act_wtensor_lookup(w, r.source, &lookup_why); /* none: a device only receives */
    size_t bytes = (size_t)dt_layout_numel(ndim, r.shape.v) * elem;
    if (out && !(out->storage = s_assemble_storage(w, &r, bytes)))
        snprintf(why, sizeof why, "%s", act_worker_no_memory(w));
    else if (out)
        out->data = out->storage->data;
    int64_t out_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS];
    dt_layout_strides(ndim, r.shape.v, elem, out_strides);
    if (src)
        dt_layout_strides(src->ndim, src->shape, elem, src_strides);
    mb_cursor parts = r.parts.items;
    for (uint32_t q = 0; q < r.parts.n; q++) {
        mb_part_rec p;
        if (mb_read_part(&parts, &p) != 0) {
            if (!why[0])
                snprintf(why, sizeof why, "%s", dt_last_error());
            break;
        }
        if (p.src_offset.n != ndim || p.dst_offset.n != ndim || p.shape.n != ndim ||
            (p.mode == MB_PART_DIV && p.divisor < 1)) {
            if (!why[0])
                snprintf(why, sizeof why, "malformed part record: its region has other dims than the piece, or a "
                                          "divisor below 1");
            break;
        }
        if (p.mode == MB_PART_DIV) {
            const char *err = why[0] ? NULL : be->scale_div(out->data, out->dtype, dt_layout_numel(ndim, out->shape),
                                                             p.divisor);
            if (err)
                snprintf(why, sizeof why, "%s", err);
            continue;
        }
        act_recv *got = NULL, *got2 = NULL;
        s_source from = s_part_source(w, &p, src, src_strides, lookup_why, r.dtype, &got, why, sizeof why), from2;
        /* a COPY and then a REDUCE of the same region run as one pass */
        mb_part_rec p2;
        mb_cursor peek = parts;
        bool pair = p.mode == MB_PART_COPY && q + 1 < r.parts.n && mb_read_part(&peek, &p2) == 0 &&
                    s_same_region(&p, &p2);
        if (pair) {
            parts = peek;
            q++;
            from2 = s_part_source(w, &p2, src, src_strides, lookup_why, r.dtype, &got2, why, sizeof why);
        }
        bool inside = dt_layout_region_inside(ndim, r.shape.v, p.dst_offset.v, p.shape.v);
        if (!inside && !why[0])
            snprintf(why, sizeof why, "a region outside the piece");
        if (!why[0]) {
            char *to = out->data;
            for (int d = 0; d < ndim; d++)
                to += p.dst_offset.v[d] * out_strides[d];
            const char *err =
                pair ? s_copy_reduce_region(be, to, out_strides, from, from2, ndim, p.shape.v, out->dtype, p2.op)
                : p.mode == MB_PART_COPY
                    ? from.copy(to, out_strides, from.data, from.strides, ndim, p.shape.v, elem)
                    : s_reduce_region(be, to, out_strides, from, ndim, p.shape.v, out->dtype, p.op);
            if (err)
                snprintf(why, sizeof why, "%s", err);
        }
        /* what was queued on a peer's memory has read it before the peer may reuse it */
        const char *err =
            ((got && got->peer) || (got2 && got2->peer)) && be->synchronize ? be->synchronize() : NULL;
        if (err && !why[0])
            snprintf(why, sizeof why, "%s", err);
        s_recv_done(w, got);
        s_recv_done(w, got2);
    }
    if (why[0]) {
        char msg[DT_ERRMSG_MAX + 64];
        act_worker_failure(w, msg, sizeof msg, "redistribute", why);
        act_wtensor_free(w, out);
        act_wtensor_poison(w, r.id, msg);
    } else {
        act_wtensor_put(w, r.id, out);
    }
    return true;
}
