/* act_peer — workers exchanging regions of their pieces for a redistribute, without the
 * controller in the path.
 *
 * Each worker binds a peer socket next to the controller's endpoint and keeps one DEALER per
 * peer it sends to. A SEND posts one region; an ASSEMBLE builds a new piece from local regions
 * and received ones, waiting for the latter. Worker threads of one process pass a reference to
 * the sender's (immutable) storage and the receiver copies straight out of it: shared memory,
 * no serialization. Worker processes send the region's bytes as a frame.
 *
 * A wait never blocks forever on a dead peer: the controller broadcasts an ABORT naming a dead
 * device, and an ASSEMBLE that still needs a region from it fails (its output is poisoned). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "act_worker.h"
#include "cpu_kernels.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_codes.h"

#define S_WAIT_POLL_MS 500 /* how often a waiting ASSEMBLE looks up from its sockets */

static void s_peer_endpoint(const char *base, int64_t device, char *buf, size_t size)
{
    snprintf(buf, size, "%s-peer-%" PRId64, base, device);
}

int act_peer_open(act_worker *w)
{
    char endpoint[300];
    s_peer_endpoint(w->endpoint, w->device, endpoint, sizeof endpoint);
    w->peer = mb_socket_new(MB_ROUTER, endpoint, true, NULL);
    return w->peer ? 0 : dt_last_error_code();
}

static void s_recv_free(act_recv *r)
{
    if (!r)
        return;
    act_storage_release(r->shared);
    if (r->has_frame)
        zmq_msg_close(&r->frame);
    free(r->error);
    free(r);
}

void act_peer_close(act_worker *w)
{
    size_t cursor = 0;
    uint64_t id;
    void *value;
    while (dt_idmap_next(&w->received, &cursor, &id, &value))
        s_recv_free(value);
    dt_idmap_destroy(&w->received);
    cursor = 0;
    while (dt_idmap_next(&w->peers, &cursor, &id, &value)) {
        zsock_t *sock = value;
        mb_socket_destroy(&sock);
    }
    dt_idmap_destroy(&w->peers);
    mb_socket_destroy(&w->peer);
    char endpoint[300];
    s_peer_endpoint(w->endpoint, w->device, endpoint, sizeof endpoint);
    if (strncmp(endpoint, "ipc://", 6) == 0)
        unlink(endpoint + 6); /* the socket file outlives the socket otherwise */
}

static zsock_t *s_peer_socket(act_worker *w, int64_t device)
{
    zsock_t *sock = dt_idmap_get(&w->peers, (uint64_t)device + 1);
    if (sock)
        return sock;
    char endpoint[300], rid[32];
    s_peer_endpoint(w->endpoint, device, endpoint, sizeof endpoint);
    snprintf(rid, sizeof rid, "w%" PRId64, w->device);
    sock = mb_socket_new(MB_DEALER, endpoint, false, rid);
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

/* [SEND, id, transfer, to device, offset, shape] -> peer message
 *   [transfer, status, dtype, shape, error or nil, shared storage, data address, strides] */
bool act_peer_send(act_worker *w, const msgpack_object *rec)
{
    uint64_t id, transfer;
    int64_t to, offset[DT_MAX_DIMS], shape[DT_MAX_DIMS];
    uint32_t n_off, ndim;
    if (!mb_get_u64(rec, 1, &id) || !mb_get_u64(rec, 2, &transfer) || !mb_get_i64(rec, 3, &to) ||
        !mb_get_i64s(rec, 4, offset, DT_MAX_DIMS, &n_off) || !mb_get_i64s(rec, 5, shape, DT_MAX_DIMS, &ndim) ||
        n_off != ndim)
        return false;
    zsock_t *sock = s_peer_socket(w, to);
    if (!sock)
        return true; /* the receiver will wait; nothing better to do than let its peers time out */
    const char *why = NULL;
    act_wtensor *t = act_wtensor_lookup(w, id, &why);
    bool fits = t && t->ndim == (int)ndim;
    for (uint32_t d = 0; fits && d < ndim; d++)
        fits = offset[d] >= 0 && shape[d] >= 0 && offset[d] + shape[d] <= t->shape[d];
    if (t && !fits) {
        why = "a region outside the piece";
        t = NULL;
    }

    msgpack_sbuffer body;
    msgpack_packer pk;
    msgpack_sbuffer_init(&body);
    msgpack_packer_init(&pk, &body, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 8);
    msgpack_pack_uint64(&pk, transfer);
    msgpack_pack_int(&pk, t ? 0 : DT_EKERNEL);
    msgpack_pack_int(&pk, t ? (int)t->dtype : 0);
    mb_pack_i64s(&pk, shape, (int)ndim);
    if (t) {
        msgpack_pack_nil(&pk);
    } else {
        msgpack_pack_str(&pk, strlen(why));
        msgpack_pack_str_body(&pk, why, strlen(why));
    }
    mb_buf frame = {NULL, 0, NULL, NULL};
    int nframes = 0;
    if (t) {
        size_t elem = dt_dtype_size(t->dtype);
        int64_t strides[DT_MAX_DIMS];
        cpu_contiguous_strides(t->ndim, t->shape, elem, strides);
        char *start = t->data;
        for (uint32_t d = 0; d < ndim; d++)
            start += offset[d] * strides[d];
        size_t bytes = (size_t)dt_layout_numel((int)ndim, shape) * elem;
        if (w->same_process) {
            /* the receiver reads the region in place: pass the storage, keep it alive for it */
            atomic_fetch_add(&t->storage->refs, 1);
            msgpack_pack_uint64(&pk, (uint64_t)(uintptr_t)t->storage);
            msgpack_pack_uint64(&pk, (uint64_t)(uintptr_t)start);
            mb_pack_i64s(&pk, strides, (int)ndim);
        } else {
            msgpack_pack_uint64(&pk, 0);
            msgpack_pack_uint64(&pk, 0);
            mb_pack_i64s(&pk, NULL, 0);
            if (s_contiguous((int)ndim, t->shape, shape)) {
                atomic_fetch_add(&t->storage->refs, 1);
                frame = (mb_buf){start, bytes, act_storage_free_fn, t->storage};
            } else if ((frame.data = malloc(bytes ? bytes : 1))) {
                int64_t dst_strides[DT_MAX_DIMS];
                cpu_contiguous_strides((int)ndim, shape, elem, dst_strides);
                cpu_copy_block(frame.data, dst_strides, start, strides, (int)ndim, shape, elem);
                frame.size = bytes;
                frame.free_fn = mb_buf_free;
            }
            nframes = 1;
        }
    } else {
        msgpack_pack_uint64(&pk, 0);
        msgpack_pack_uint64(&pk, 0);
        mb_pack_i64s(&pk, NULL, 0);
    }
    mb_header h = {MB_VERSION, MB_PEER, w->peer_seq++, (uint32_t)w->device, 1};
    size_t size = body.size;
    mb_send(sock, NULL, 0, &h, (mb_buf){msgpack_sbuffer_release(&body), size, mb_buf_free, NULL}, &frame, nframes);
    return true;
}

/* Decodes one peer message into a stashed region. */
static void s_stash(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    msgpack_object rec;
    if (mb_body_init(&r, zmq_msg_data(&m->body), zmq_msg_size(&m->body), m->header.count) != 0)
        return;
    act_recv *got = calloc(1, sizeof *got);
    uint64_t transfer, shared, data;
    int64_t status, dtype, strides[DT_MAX_DIMS];
    uint32_t ndim, nstrides;
    if (!got || mb_body_next(&r, &rec) != 1 || !mb_arr(&rec, 8) || !mb_get_u64(&rec, 0, &transfer) ||
        !mb_get_i64(&rec, 1, &status) || !mb_get_i64(&rec, 2, &dtype) || !dt_dtype_valid((int)dtype) ||
        !mb_get_i64s(&rec, 3, got->shape, DT_MAX_DIMS, &ndim) || !mb_get_u64(&rec, 5, &shared) ||
        !mb_get_u64(&rec, 6, &data) || !mb_get_i64s(&rec, 7, strides, DT_MAX_DIMS, &nstrides)) {
        fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed region from a peer\n", w->device);
        free(got);
        mb_body_destroy(&r);
        return;
    }
    got->ndim = (int)ndim;
    got->status = (int)status;
    if (status != 0) {
        const char *msg;
        uint32_t len;
        got->error = mb_get_str(&rec, 4, &msg, &len) ? strndup(msg, len) : strdup("a peer could not send its region");
    } else if (shared) {
        got->shared = (act_storage *)(uintptr_t)shared;
        got->data = (const char *)(uintptr_t)data;
        memcpy(got->strides, strides, sizeof strides);
    } else {
        size_t elem = dt_dtype_size((dt_dtype)dtype);
        if (m->npayloads != 1 || zmq_msg_size(&m->payloads[0]) != (size_t)dt_layout_numel(got->ndim, got->shape) * elem) {
            got->status = DT_EPROTO;
            got->error = strdup("a peer sent a region of the wrong size");
        } else {
            zmq_msg_init(&got->frame);
            zmq_msg_move(&got->frame, &m->payloads[0]);
            got->has_frame = true;
            got->data = zmq_msg_data(&got->frame);
            cpu_contiguous_strides(got->ndim, got->shape, elem, got->strides);
        }
    }
    mb_body_destroy(&r);
    s_recv_free(dt_idmap_take(&w->received, transfer));
    if (dt_idmap_put(&w->received, transfer, got) != 0)
        s_recv_free(got);
}

void act_peer_receive(act_worker *w)
{
    mb_message m;
    while (mb_recv(w->peer, true, true, &m) == 0) {
        if (m.header.kind == MB_PEER)
            s_stash(w, &m);
        mb_message_close(&m);
    }
}

/* The region of transfer from device `from`, waiting for it; NULL (and why) when it cannot come. */
static act_recv *s_await(act_worker *w, uint64_t transfer, int64_t from, char *why, size_t size)
{
    for (;;) {
        act_recv *got = dt_idmap_take(&w->received, transfer);
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
        zmq_pollitem_t items[2] = {{zsock_resolve(w->peer), 0, ZMQ_POLLIN, 0},
                                   {zsock_resolve(w->sock), 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, S_WAIT_POLL_MS) < 0)
            continue;
        if (items[0].revents & ZMQ_POLLIN)
            act_peer_receive(w);
        if (items[1].revents & ZMQ_POLLIN) {
            mb_message m;
            if (mb_recv(w->sock, false, true, &m) == 0)
                act_worker_defer(w, &m);
        }
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

/* Combines a region into place with op, through contiguous scratch copies when the region is
 * not one run of bytes on both sides. */
static const char *s_reduce_region(char *dst, const int64_t *dst_strides, const char *src, const int64_t *src_strides,
                                   int ndim, const int64_t *shape, dt_dtype dtype, int op)
{
    size_t elem = dt_dtype_size(dtype);
    int64_t n = dt_layout_numel(ndim, shape), contiguous[DT_MAX_DIMS];
    cpu_contiguous_strides(ndim, shape, elem, contiguous);
    if (s_dense(ndim, shape, dst_strides, elem) && s_dense(ndim, shape, src_strides, elem)) {
        cpu_reduce_into(dst, src, dtype, n, (dt_reduce_op)op); /* one pass, the common case */
        return NULL;
    }
    char *a = malloc(n ? (size_t)n * elem : 1), *b = malloc(n ? (size_t)n * elem : 1);
    if (!a || !b) {
        free(a);
        free(b);
        return "out of memory on the device";
    }
    cpu_copy_block(a, contiguous, dst, dst_strides, ndim, shape, elem);
    cpu_copy_block(b, contiguous, src, src_strides, ndim, shape, elem);
    cpu_reduce_into(a, b, dtype, n, (dt_reduce_op)op);
    cpu_copy_block(dst, dst_strides, a, contiguous, ndim, shape, elem);
    free(a);
    free(b);
    return NULL;
}

typedef struct {
    int64_t mode, op, from, divisor;
    uint64_t transfer;
    int64_t src_offset[DT_MAX_DIMS], dst_offset[DT_MAX_DIMS], shape[DT_MAX_DIMS];
} s_part;

static bool s_read_part(const msgpack_object *o, int ndim, s_part *p)
{
    uint32_t a, b, c;
    return mb_arr(o, 8) && mb_get_i64(o, 0, &p->mode) && mb_get_i64(o, 1, &p->op) && mb_get_i64(o, 2, &p->from) &&
           mb_get_u64(o, 3, &p->transfer) && mb_get_i64s(o, 4, p->src_offset, DT_MAX_DIMS, &a) &&
           mb_get_i64s(o, 5, p->dst_offset, DT_MAX_DIMS, &b) && mb_get_i64s(o, 6, p->shape, DT_MAX_DIMS, &c) &&
           mb_get_i64(o, 7, &p->divisor) && (int)a == ndim && (int)b == ndim && (int)c == ndim &&
           p->op >= 0 && p->op <= DT_REDUCE_MIN && p->mode >= OP_PART_COPY && p->mode <= OP_PART_DIV;
}

/* [ASSEMBLE, id, dtype, shape, source id, parts] */
bool act_peer_assemble(act_worker *w, const msgpack_object *rec)
{
    uint64_t id, src_id;
    int64_t dtype;
    uint32_t ndim;
    act_wtensor *out = calloc(1, sizeof *out);
    if (!out || !mb_arr(rec, 6) || !mb_get_u64(rec, 1, &id) || !mb_get_i64(rec, 2, &dtype) ||
        !dt_dtype_valid((int)dtype) || !mb_get_i64s(rec, 3, out->shape, DT_MAX_DIMS, &ndim) ||
        !mb_get_u64(rec, 4, &src_id) || rec->via.array.ptr[5].type != MSGPACK_OBJECT_ARRAY) {
        free(out);
        return false;
    }
    out->dtype = (dt_dtype)dtype;
    out->ndim = (int)ndim;
    size_t elem = dt_dtype_size(out->dtype);
    const msgpack_object_array *parts = &rec->via.array.ptr[5].via.array;
    char why[DT_ERRMSG_MAX] = "";
    const char *lookup_why = NULL;
    act_wtensor *src = act_wtensor_lookup(w, src_id, &lookup_why); /* none: a device only receives */
    size_t bytes = (size_t)dt_layout_numel(out->ndim, out->shape) * elem;
    if (!(out->storage = act_storage_new(w->backend, bytes)))
        snprintf(why, sizeof why, "out of memory on the device");
    else
        out->data = out->storage->data;
    int64_t out_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS];
    cpu_contiguous_strides(out->ndim, out->shape, elem, out_strides);
    if (src)
        cpu_contiguous_strides(src->ndim, src->shape, elem, src_strides);
    for (uint32_t q = 0; q < parts->size; q++) {
        s_part p;
        if (!s_read_part(&parts->ptr[q], out->ndim, &p)) {
            snprintf(why, sizeof why, "malformed record");
            break;
        }
        if (p.mode == OP_PART_DIV) {
            if (!why[0])
                cpu_scale_div(out->data, out->dtype, dt_layout_numel(out->ndim, out->shape), p.divisor);
            continue;
        }
        const char *from = NULL;
        const int64_t *from_strides = NULL;
        act_recv *got = NULL;
        if (p.transfer) {
            /* wait even after a failure, so the region does not linger in the stash */
            char wait_why[DT_ERRMSG_MAX];
            got = s_await(w, p.transfer, p.from, wait_why, sizeof wait_why);
            if (!got && !why[0])
                snprintf(why, sizeof why, "%s", wait_why);
            else if (got && got->status != 0 && !why[0])
                snprintf(why, sizeof why, "%s", got->error ? got->error : "a peer failed");
            else if (got) {
                bool same = got->ndim == out->ndim;
                for (int d = 0; same && d < out->ndim; d++)
                    same = got->shape[d] == p.shape[d];
                if (!same && !why[0])
                    snprintf(why, sizeof why, "a peer sent a region of the wrong shape");
                from = got->data;
                from_strides = got->strides;
            }
        } else if (!src) {
            if (!why[0])
                snprintf(why, sizeof why, "%s", lookup_why ? lookup_why : "the source piece is missing");
        } else {
            from = src->data;
            for (int d = 0; d < out->ndim; d++)
                from += p.src_offset[d] * src_strides[d];
            from_strides = src_strides;
        }
        bool inside = true;
        for (int d = 0; d < out->ndim; d++)
            inside = inside && p.dst_offset[d] >= 0 && p.dst_offset[d] + p.shape[d] <= out->shape[d];
        if (!inside && !why[0])
            snprintf(why, sizeof why, "a region outside the piece");
        if (!why[0]) {
            char *to = out->data;
            for (int d = 0; d < out->ndim; d++)
                to += p.dst_offset[d] * out_strides[d];
            if (p.mode == OP_PART_COPY) {
                cpu_copy_block(to, out_strides, from, from_strides, out->ndim, p.shape, elem);
            } else {
                const char *err = s_reduce_region(to, out_strides, from, from_strides, out->ndim, p.shape, out->dtype,
                                                  (int)p.op);
                if (err)
                    snprintf(why, sizeof why, "%s", err);
            }
        }
        s_recv_free(got);
    }
    if (why[0]) {
        char msg[DT_ERRMSG_MAX + 64];
        snprintf(msg, sizeof msg, "redistribute failed on device %" PRId64 ": %s", w->device, why);
        act_wtensor_free(out);
        act_wtensor_poison(w, id, msg);
    } else {
        act_wtensor_put(w, id, out);
    }
    return true;
}
