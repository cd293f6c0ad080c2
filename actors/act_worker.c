/* act_worker — a device actor. It receives batches of op records from the controller, runs
 * them in order on its own tensors, and answers each batch with one completions message
 * (credit, values, errors). It blocks in a receive when idle.
 *
 * Tensors are immutable once made: values are sent straight from their storage (no copy over
 * inproc), and a storage lives until both the tensor and every message using it let go. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "act_runtime.h"
#include "cpu_kernels.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dtn_layout.h"
#include "op_codes.h"

#define S_POLL_MS 500 /* how often an idle worker looks at its stop flag */

typedef struct {
    atomic_int refs;
    void *data;
    size_t size;
    bool adopted;     /* data lives in msg, a received frame */
    zmq_msg_t msg;
} s_storage;

typedef struct {
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS]; /* (ndim) local shape */
    s_storage *storage;         /* NULL when poisoned */
    char *error;                /* why it could not be made (poisoned) */
} s_tensor;

typedef struct {
    int64_t device;
    zsock_t *sock;
    dt_idmap tensors;           /* id -> s_tensor */
    uint64_t send_seq;
    /* the reply to the batch being run */
    msgpack_sbuffer reply;
    msgpack_packer pk;
    uint32_t nreply;
    int npayloads, cap_payloads;
    mb_buf *payloads;
} s_worker;

static void s_storage_release(s_storage *st)
{
    if (!st || atomic_fetch_sub(&st->refs, 1) != 1)
        return;
    if (st->adopted)
        zmq_msg_close(&st->msg);
    else
        free(st->data);
    free(st);
}

static void s_storage_free_fn(void *data, void *hint) { s_storage_release(hint); }

static s_storage *s_storage_new(size_t size)
{
    s_storage *st = calloc(1, sizeof *st);
    if (!st || !(st->data = malloc(size ? size : 1))) {
        free(st);
        return NULL;
    }
    atomic_init(&st->refs, 1);
    st->size = size;
    return st;
}

static void s_tensor_free(s_tensor *t)
{
    if (!t)
        return;
    s_storage_release(t->storage);
    free(t->error);
    free(t);
}

static void s_put(s_worker *w, uint64_t id, s_tensor *t)
{
    s_tensor_free(dt_idmap_take(&w->tensors, id));
    if (dt_idmap_put(&w->tensors, id, t) != 0)
        s_tensor_free(t);
}

/* A tensor that could not be made; ops that use it fail with this message. */
static void s_poison(s_worker *w, uint64_t id, const char *fmt, const char *op, const char *why)
{
    s_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return;
    char msg[DT_ERRMSG_MAX];
    snprintf(msg, sizeof msg, fmt, op, why);
    t->error = strdup(msg);
    s_put(w, id, t);
}

static int s_add_payload(s_worker *w, mb_buf buf)
{
    if (w->npayloads == w->cap_payloads) {
        int cap = w->cap_payloads ? 2 * w->cap_payloads : 8;
        mb_buf *grown = realloc(w->payloads, (size_t)cap * sizeof *grown);
        if (!grown) {
            if (buf.free_fn)
                buf.free_fn(buf.data, buf.hint);
            return -1;
        }
        w->payloads = grown;
        w->cap_payloads = cap;
    }
    w->payloads[w->npayloads] = buf;
    return w->npayloads++;
}

static void s_reply_error(s_worker *w, uint64_t fid, int64_t piece, int code, const char *msg)
{
    msgpack_pack_array(&w->pk, 5);
    msgpack_pack_int(&w->pk, C_ERROR);
    msgpack_pack_uint64(&w->pk, fid);
    msgpack_pack_int64(&w->pk, piece);
    msgpack_pack_int(&w->pk, code);
    size_t len = strlen(msg);
    msgpack_pack_str(&w->pk, len);
    msgpack_pack_str_body(&w->pk, msg, len);
    w->nreply++;
}

static void s_reply_value(s_worker *w, uint64_t fid, int64_t piece, const s_tensor *t)
{
    int frame = -1;
    if (t) {
        atomic_fetch_add(&t->storage->refs, 1);
        frame = s_add_payload(w, (mb_buf){t->storage->data, t->storage->size, s_storage_free_fn, t->storage});
        if (frame < 0) {
            s_reply_error(w, fid, piece, DT_ENOMEM, "out of memory on the device");
            return;
        }
    }
    msgpack_pack_array(&w->pk, 6);
    msgpack_pack_int(&w->pk, C_VALUE);
    msgpack_pack_uint64(&w->pk, fid);
    msgpack_pack_int64(&w->pk, piece);
    msgpack_pack_int(&w->pk, t ? (int)t->dtype : 0);
    mb_pack_i64s(&w->pk, t ? t->shape : NULL, t ? t->ndim : 0);
    msgpack_pack_int(&w->pk, frame);
    w->nreply++;
}

static bool s_get_scalar(const msgpack_object *rec, uint32_t i, dt_scalar *out)
{
    if (mb_get_i64(rec, i, &out->i)) {
        out->is_int = true;
        out->f = (double)out->i;
        return true;
    }
    out->is_int = false;
    return mb_get_f64(rec, i, &out->f);
}

/* Reads [code, id, dtype, shape, ...] and makes the output tensor with fresh storage. */
static s_tensor *s_new_output(const msgpack_object *rec, const char **why)
{
    int64_t dtype;
    uint32_t ndim;
    s_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        *why = "out of memory";
        return NULL;
    }
    if (!mb_get_i64(rec, 2, &dtype) || !dt_dtype_valid((int)dtype) ||
        !mb_get_i64s(rec, 3, t->shape, DT_MAX_DIMS, &ndim) || dtn_check_shape("op", (int)ndim, t->shape) != 0) {
        free(t);
        *why = "malformed record";
        return NULL;
    }
    t->dtype = (dt_dtype)dtype;
    t->ndim = (int)ndim;
    return t;
}

static const char *s_alloc(s_tensor *t)
{
    size_t size = (size_t)dtn_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
    t->storage = s_storage_new(size);
    return t->storage ? NULL : "out of memory on the device";
}

/* Runs one op record. Returns false for a record it cannot even read. */
static bool s_run(s_worker *w, const msgpack_object *rec, mb_message *m)
{
    int64_t code;
    uint64_t id;
    if (!mb_arr(rec, 2) || !mb_get_i64(rec, 0, &code))
        return false;
    if (code == OP_SYNC) {
        int64_t piece;
        if (!mb_get_u64(rec, 1, &id) || !mb_get_i64(rec, 2, &piece))
            return false;
        s_reply_value(w, id, piece, NULL);
        return true;
    }
    if (!mb_get_u64(rec, 1, &id))
        return false;
    if (code == OP_FREE) {
        s_tensor_free(dt_idmap_take(&w->tensors, id));
        return true;
    }
    if (code == OP_FETCH) {
        uint64_t fid;
        int64_t piece;
        if (!mb_get_u64(rec, 2, &fid) || !mb_get_i64(rec, 3, &piece))
            return false;
        s_tensor *t = dt_idmap_get(&w->tensors, id);
        char msg[128];
        if (!t) {
            snprintf(msg, sizeof msg, "device %" PRId64 " has no tensor %" PRIu64 " (freed, or never made)",
                     w->device, id);
            s_reply_error(w, fid, piece, DT_EKERNEL, msg);
        } else if (!t->storage) {
            s_reply_error(w, fid, piece, DT_EKERNEL, t->error);
        } else {
            s_reply_value(w, fid, piece, t);
        }
        return true;
    }

    const char *why = NULL;
    s_tensor *t = s_new_output(rec, &why);
    if (!t) {
        s_poison(w, id, "%s on device: %s", op_name((int)code), why);
        return true;
    }
    int64_t n = dtn_numel(t->ndim, t->shape);
    switch (code) {
    case OP_EMPTY:
        why = s_alloc(t);
        break;
    case OP_FILL: {
        dt_scalar v;
        if (!s_get_scalar(rec, 4, &v))
            why = "malformed record";
        else if (!(why = s_alloc(t)))
            cpu_fill(t->storage->data, t->dtype, n, v);
        break;
    }
    case OP_RANDOM: {
        int64_t offset[DT_MAX_DIMS], global[DT_MAX_DIMS], normal;
        uint64_t seed, stream;
        uint32_t n_off, n_glob;
        if (!mb_get_i64s(rec, 4, offset, DT_MAX_DIMS, &n_off) || !mb_get_i64s(rec, 5, global, DT_MAX_DIMS, &n_glob) ||
            n_off != (uint32_t)t->ndim || n_glob != (uint32_t)t->ndim || !mb_get_u64(rec, 6, &seed) ||
            !mb_get_u64(rec, 7, &stream) || !mb_get_i64(rec, 8, &normal) || !dt_dtype_is_float(t->dtype))
            why = "malformed record";
        else if (!(why = s_alloc(t)))
            cpu_random(t->storage->data, t->dtype, t->ndim, t->shape, offset, global, seed, stream, normal != 0);
        break;
    }
    case OP_ARANGE: {
        int64_t first;
        dt_scalar start, step;
        if (t->ndim != 1 || !mb_get_i64(rec, 4, &first) || !s_get_scalar(rec, 5, &start) || !s_get_scalar(rec, 6, &step))
            why = "malformed record";
        else if (!(why = s_alloc(t)))
            cpu_arange(t->storage->data, t->dtype, n, first, start, step);
        break;
    }
    case OP_LOAD: {
        int64_t frame;
        size_t size = (size_t)n * dt_dtype_size(t->dtype);
        if (!mb_get_i64(rec, 4, &frame) || frame < 0 || frame >= m->npayloads ||
            zmq_msg_size(&m->payloads[frame]) != size) {
            why = "malformed record (payload missing or of the wrong size)";
            break;
        }
        zmq_msg_t *src = &m->payloads[frame];
        if (((uintptr_t)zmq_msg_data(src) % 8) == 0 && (t->storage = calloc(1, sizeof *t->storage))) {
            /* adopt the received frame as storage: no copy */
            atomic_init(&t->storage->refs, 1);
            zmq_msg_init(&t->storage->msg);
            zmq_msg_move(&t->storage->msg, src);
            t->storage->adopted = true;
            t->storage->data = zmq_msg_data(&t->storage->msg);
            t->storage->size = size;
        } else if (!(why = s_alloc(t))) {
            memcpy(t->storage->data, zmq_msg_data(src), size);
        }
        break;
    }
    default:
        why = "unknown op";
    }
    if (why) {
        s_tensor_free(t);
        s_poison(w, id, "%s failed on the device: %s", op_name((int)code), why);
    } else {
        s_put(w, id, t);
    }
    return true;
}

static int s_send(s_worker *w, mb_kind kind, uint32_t count)
{
    mb_header h = {MB_VERSION, kind, w->send_seq++, (uint32_t)w->device, count};
    size_t size = w->reply.size;
    mb_buf body = {msgpack_sbuffer_release(&w->reply), size, mb_buf_free, NULL};
    int rc = mb_send(w->sock, NULL, 0, &h, body, w->payloads, w->npayloads);
    w->npayloads = 0;
    w->nreply = 0;
    return rc;
}

static int s_run_batch(s_worker *w, mb_message *m)
{
    mb_body_reader r;
    uint32_t ran = 0;
    if (mb_body_init(&r, zmq_msg_data(&m->body), zmq_msg_size(&m->body), m->header.count) == 0) {
        msgpack_object rec;
        int rc;
        while ((rc = mb_body_next(&r, &rec)) == 1) {
            ran++;
            if (!s_run(w, &rec, m))
                fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed op record\n", w->device);
        }
        if (rc < 0)
            fprintf(stderr, "dtorch worker %" PRId64 ": %s\n", w->device, dt_last_error());
        mb_body_destroy(&r);
    } else {
        fprintf(stderr, "dtorch worker %" PRId64 ": %s\n", w->device, dt_last_error());
    }
    /* credit the whole batch, read or not, so the controller's window stays exact */
    msgpack_pack_array(&w->pk, 2);
    msgpack_pack_int(&w->pk, C_CREDIT);
    msgpack_pack_uint32(&w->pk, m->header.count);
    w->nreply++;
    (void)ran;
    return s_send(w, MB_COMPLETIONS, w->nreply);
}

int act_worker_run(const char *endpoint, int64_t device, bool (*should_stop)(void *arg), void *arg)
{
    char rid[32];
    snprintf(rid, sizeof rid, "d%" PRId64, device);
    s_worker w = {.device = device};
    dt_idmap_init(&w.tensors);
    msgpack_sbuffer_init(&w.reply);
    msgpack_packer_init(&w.pk, &w.reply, msgpack_sbuffer_write);
    w.sock = mb_socket_new(MB_DEALER, endpoint, false, rid);
    int rc = w.sock ? 0 : dt_last_error_code();
    if (w.sock) {
        msgpack_pack_array(&w.pk, 2);
        msgpack_pack_int64(&w.pk, device);
        msgpack_pack_int(&w.pk, (int)getpid());
        rc = s_send(&w, MB_HELLO, 1);
    }
    while (rc == 0) {
        zmq_pollitem_t item = {zsock_resolve(w.sock), 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, S_POLL_MS) <= 0) {
            if (should_stop && should_stop(arg))
                break;
            continue;
        }
        mb_message m;
        int got = mb_recv(w.sock, false, true, &m);
        if (got == 1 || got == DT_EPROTO)
            continue;
        if (got != 0) {
            rc = got;
            break;
        }
        if (m.header.kind == MB_OPS) {
            rc = s_run_batch(&w, &m);
        } else if (m.header.kind == MB_BYE) {
            mb_message_close(&m);
            s_send(&w, MB_BYE, 0);
            break;
        }
        mb_message_close(&m);
    }
    size_t cursor = 0;
    uint64_t id;
    void *t;
    while (dt_idmap_next(&w.tensors, &cursor, &id, &t))
        s_tensor_free(t);
    dt_idmap_destroy(&w.tensors);
    msgpack_sbuffer_destroy(&w.reply);
    free(w.payloads);
    mb_socket_destroy(&w.sock);
    return rc;
}
