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
#include <time.h>
#include <unistd.h>

#include "act_runtime.h"
#include "act_worker.h"
#include "cpu_kernels.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_codes.h"
#include "op_backend.h"
#include "op_registry.h"

#define S_POLL_MS 500 /* how often an idle worker looks at its stop flag */

void act_storage_release(act_storage *st)
{
    if (!st || atomic_fetch_sub(&st->refs, 1) != 1)
        return;
    if (st->adopted)
        zmq_msg_close(&st->msg);
    else
        st->backend->free(st->data, st->size);
    free(st);
}

void act_storage_free_fn(void *data, void *hint) { act_storage_release(hint); }

act_storage *act_storage_new(const op_backend *backend, size_t size)
{
    act_storage *st = calloc(1, sizeof *st);
    if (!st || !(st->data = backend->alloc(size))) {
        free(st);
        return NULL;
    }
    atomic_init(&st->refs, 1);
    st->size = size;
    st->backend = backend;
    return st;
}

void act_wtensor_free(act_wtensor *t)
{
    if (!t)
        return;
    act_storage_release(t->storage);
    free(t->error);
    free(t);
}

void act_wtensor_put(act_worker *w, uint64_t id, act_wtensor *t)
{
    act_wtensor_free(dt_idmap_take(&w->tensors, id));
    if (dt_idmap_put(&w->tensors, id, t) != 0)
        act_wtensor_free(t);
}

void act_wtensor_poison(act_worker *w, uint64_t id, const char *message)
{
    act_wtensor *t = calloc(1, sizeof *t);
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
        snprintf(msg, sizeof msg, "device %" PRId64 " has no tensor %" PRIu64 " (freed, or never made)", w->device,
                 id);
        *why = msg;
    } else if (!t->storage) {
        *why = t->error;
        t = NULL;
    }
    return t;
}

static int s_add_payload(act_worker *w, mb_buf buf)
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

static void s_reply_error(act_worker *w, uint64_t fid, int64_t piece, int code, const char *msg)
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

static void s_reply_value(act_worker *w, uint64_t fid, int64_t piece, const act_wtensor *t)
{
    int frame = -1;
    if (t) {
        size_t size = (size_t)dt_layout_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
        atomic_fetch_add(&t->storage->refs, 1);
        frame = s_add_payload(w, (mb_buf){t->data, size, act_storage_free_fn, t->storage});
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

/* Reads [code, id, dtype, shape, ...] into a new tensor without storage. */
static act_wtensor *s_new_output(const msgpack_object *rec, const char **why)
{
    int64_t dtype;
    uint32_t ndim;
    act_wtensor *t = calloc(1, sizeof *t);
    if (!t) {
        *why = "out of memory";
        return NULL;
    }
    if (!mb_get_i64(rec, 2, &dtype) || !dt_dtype_valid((int)dtype) ||
        !mb_get_i64s(rec, 3, t->shape, DT_MAX_DIMS, &ndim) || dt_layout_check_shape("op", (int)ndim, t->shape) != 0) {
        free(t);
        *why = "malformed record";
        return NULL;
    }
    t->dtype = (dt_dtype)dtype;
    t->ndim = (int)ndim;
    return t;
}

static const char *s_alloc(const act_worker *w, act_wtensor *t)
{
    size_t size = (size_t)dt_layout_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
    t->storage = act_storage_new(w->backend, size);
    if (!t->storage)
        return "out of memory on the device";
    t->data = t->storage->data;
    return NULL;
}

/* LOAD: the payload frame becomes the storage, without a copy when it is aligned. */
static const char *s_load(const act_worker *w, act_wtensor *t, const msgpack_object *rec, mb_message *m)
{
    int64_t frame;
    size_t size = (size_t)dt_layout_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
    if (!mb_get_i64(rec, 4, &frame) || frame < 0 || frame >= m->npayloads || zmq_msg_size(&m->payloads[frame]) != size)
        return "malformed record (payload missing or of the wrong size)";
    zmq_msg_t *src = &m->payloads[frame];
    if (((uintptr_t)zmq_msg_data(src) % 8) == 0 && (t->storage = calloc(1, sizeof *t->storage))) {
        atomic_init(&t->storage->refs, 1);
        zmq_msg_init(&t->storage->msg);
        zmq_msg_move(&t->storage->msg, src);
        t->storage->adopted = true;
        t->storage->data = t->data = zmq_msg_data(&t->storage->msg);
        t->storage->size = size;
        return NULL;
    }
    const char *why = s_alloc(w, t);
    if (!why)
        memcpy(t->data, zmq_msg_data(src), size);
    return why;
}

/* Runs an op record that makes a tensor from nothing but its own fields (and payloads). */
static void s_make(act_worker *w, int64_t code, uint64_t id, const msgpack_object *rec, mb_message *m)
{
    const char *why = NULL;
    act_wtensor *t = s_new_output(rec, &why);
    int64_t n = t ? dt_layout_numel(t->ndim, t->shape) : 0;
    switch (t ? code : -1) {
    case -1:
        break;
    case OP_EMPTY:
        why = s_alloc(w, t);
        break;
    case OP_FILL: {
        dt_scalar v;
        if (!s_get_scalar(rec, 4, &v))
            why = "malformed record";
        else if (!(why = s_alloc(w, t)))
            cpu_fill(t->data, t->dtype, n, v);
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
        else if (!(why = s_alloc(w, t)))
            cpu_random(t->data, t->dtype, t->ndim, t->shape, offset, global, seed, stream, normal != 0);
        break;
    }
    case OP_ARANGE: {
        int64_t first;
        dt_scalar start, step;
        if (t->ndim != 1 || !mb_get_i64(rec, 4, &first) || !s_get_scalar(rec, 5, &start) || !s_get_scalar(rec, 6, &step))
            why = "malformed record";
        else if (!(why = s_alloc(w, t)))
            cpu_arange(t->data, t->dtype, n, first, start, step);
        break;
    }
    case OP_LOAD:
        why = s_load(w, t, rec, m);
        break;
    default:
        why = "unknown op";
    }
    if (why) {
        char msg[DT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s failed on device %" PRId64 ": %s", op_name((int)code), w->device, why);
        act_wtensor_free(t);
        act_wtensor_poison(w, id, msg);
    } else {
        act_wtensor_put(w, id, t);
    }
}

static bool s_read_attrs(const msgpack_object *o, op_attrs *a)
{
    uint32_t nints;
    if (!mb_arr(o, 3) || !mb_get_i64s(o, 0, a->ints, OP_MAX_INTS, &nints) ||
        o->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY || o->via.array.ptr[1].via.array.size > OP_MAX_FLOATS)
        return false;
    a->nints = (int)nints;
    a->nfloats = (int)o->via.array.ptr[1].via.array.size;
    for (int i = 0; i < a->nfloats; i++)
        if (!mb_get_f64(&o->via.array.ptr[1], (uint32_t)i, &a->floats[i]))
            return false;
    a->has_scalar = o->via.array.ptr[2].type != MSGPACK_OBJECT_NIL;
    return !a->has_scalar || s_get_scalar(o, 2, &a->scalar);
}

/* Makes t's storage its own before a write in place: storage that anything else holds (a fetch
 * or a transfer on its way, a replica sharing it, a received frame) is copied first, so whatever
 * was issued before the write keeps seeing the old value. */
static const char *s_own_storage(const act_worker *w, act_wtensor *t)
{
    act_storage *st = t->storage;
    if (!st->adopted && atomic_load(&st->refs) == 1 && t->data == st->data)
        return NULL;
    size_t size = (size_t)dt_layout_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
    act_storage *own = act_storage_new(w->backend, size);
    if (!own)
        return "out of memory on the device";
    memcpy(own->data, t->data, size);
    act_storage_release(st);
    t->storage = own;
    t->data = own->data;
    return NULL;
}

/* [COMPUTE, op index, out ids, [[dtype, shape]...], in ids, attrs, ctx]: a registered op's kernel
 * on this device's pieces. A poisoned input poisons the outputs with its (root) message. */
static bool s_compute(act_worker *w, const msgpack_object *rec)
{
    int64_t index;
    uint64_t out_ids[OP_MAX_OUTPUTS], in_ids[OP_MAX_INPUTS];
    op_attrs attrs = {0};
    op_kernel k = {.attrs = &attrs};
    if (!mb_arr(rec, 7) || !mb_get_i64(rec, 1, &index))
        return false;
    const op_def *def = op_at((int)index);
    k.def = def;
    const msgpack_object *outs = &rec->via.array.ptr[2], *specs = &rec->via.array.ptr[3], *ins = &rec->via.array.ptr[4];
    uint32_t nctx;
    if (!def || outs->type != MSGPACK_OBJECT_ARRAY || specs->type != MSGPACK_OBJECT_ARRAY ||
        ins->type != MSGPACK_OBJECT_ARRAY || outs->via.array.size > OP_MAX_OUTPUTS ||
        specs->via.array.size != outs->via.array.size || ins->via.array.size > OP_MAX_INPUTS ||
        !s_read_attrs(&rec->via.array.ptr[5], &attrs) || !mb_get_i64s(rec, 6, k.ctx, OP_MAX_CTX, &nctx))
        return false;
    k.nctx = (int)nctx;
    k.nout = (int)outs->via.array.size;
    k.nin = (int)ins->via.array.size;
    for (int o = 0; o < k.nout; o++) {
        int64_t dtype;
        uint32_t ndim;
        const msgpack_object *spec = &specs->via.array.ptr[o];
        if (!mb_get_u64(outs, (uint32_t)o, &out_ids[o]) || !mb_arr(spec, 2) || !mb_get_i64(spec, 0, &dtype) ||
            !dt_dtype_valid((int)dtype) || !mb_get_i64s(spec, 1, k.out[o].shape, DT_MAX_DIMS, &ndim))
            return false;
        k.out[o].dtype = (dt_dtype)dtype;
        k.out[o].ndim = (int)ndim;
    }
    const char *why = NULL;
    for (int i = 0; i < k.nin && !why; i++) {
        if (!mb_get_u64(ins, (uint32_t)i, &in_ids[i]))
            return false;
        act_wtensor *t = act_wtensor_lookup(w, in_ids[i], &why);
        if (t)
            k.in[i] = (op_local){t->dtype, t->ndim, {0}, t->data};
        if (t)
            memcpy(k.in[i].shape, t->shape, sizeof t->shape);
    }
    char msg[DT_ERRMSG_MAX];
    if (why) {
        snprintf(msg, sizeof msg, "%s", why); /* the root failure, passed on unchanged */
        for (int o = 0; o < k.nout; o++)
            act_wtensor_poison(w, out_ids[o], msg);
        return true;
    }
    act_wtensor *made[OP_MAX_OUTPUTS] = {NULL};
    act_wtensor *written = NULL; /* an in-place op's output 0: input 0 itself */
    if (def->inplace && k.nin > 0 && k.nout > 0) {
        if (out_ids[0] != in_ids[0] || k.out[0].ndim != k.in[0].ndim ||
            memcmp(k.out[0].shape, k.in[0].shape, (size_t)k.in[0].ndim * sizeof k.in[0].shape[0]) != 0)
            return false;
        written = act_wtensor_lookup(w, in_ids[0], &why);
        if (written && !(why = s_own_storage(w, written)))
            k.out[0].data = k.in[0].data = written->data;
    }
    for (int o = written ? 1 : 0; o < k.nout && !why; o++) {
        made[o] = calloc(1, sizeof *made[o]);
        if (!made[o]) {
            why = "out of memory on the device";
            break;
        }
        made[o]->dtype = k.out[o].dtype;
        made[o]->ndim = k.out[o].ndim;
        memcpy(made[o]->shape, k.out[o].shape, sizeof made[o]->shape);
        if (!(why = s_alloc(w, made[o])))
            k.out[o].data = made[o]->data;
    }
    if (!why)
        why = w->backend->run(def, &k);
    for (int o = 0; o < k.nout; o++) {
        if (o == 0 && written && !why)
            continue; /* written in place: it is already in the table */
        if (why) {
            act_wtensor_free(made[o]);
            snprintf(msg, sizeof msg, "%s failed on device %" PRId64 ": %s", def->name, w->device, why);
            act_wtensor_poison(w, out_ids[o], msg);
        } else {
            act_wtensor_put(w, out_ids[o], made[o]);
        }
    }
    return true;
}

/* Runs one op record. Returns false for a record it cannot even read. */
static bool s_run(act_worker *w, const msgpack_object *rec, mb_message *m)
{
    int64_t code;
    uint64_t id;
    if (!mb_arr(rec, 2) || !mb_get_i64(rec, 0, &code) || !mb_get_u64(rec, 1, &id))
        return false;
    switch (code) {
    case OP_SYNC: {
        int64_t piece;
        if (!mb_get_i64(rec, 2, &piece))
            return false;
        s_reply_value(w, id, piece, NULL);
        return true;
    }
    case OP_FREE:
        act_wtensor_free(dt_idmap_take(&w->tensors, id));
        return true;
    case OP_FETCH: {
        uint64_t fid;
        int64_t piece;
        const char *why;
        if (!mb_get_u64(rec, 2, &fid) || !mb_get_i64(rec, 3, &piece))
            return false;
        act_wtensor *t = act_wtensor_lookup(w, id, &why);
        if (t)
            s_reply_value(w, fid, piece, t);
        else
            s_reply_error(w, fid, piece, DT_EKERNEL, why);
        return true;
    }
    case OP_SEND:
        return act_peer_send(w, rec);
    case OP_ASSEMBLE:
        return act_peer_assemble(w, rec);
    case OP_COMPUTE:
        return s_compute(w, rec);
    default:
        s_make(w, code, id, rec, m);
        return true;
    }
}

static int s_send(act_worker *w, mb_kind kind, uint32_t count)
{
    mb_header h = {MB_VERSION, kind, w->send_seq++, (uint32_t)w->device, count};
    size_t size = w->reply.size;
    mb_buf body = {msgpack_sbuffer_release(&w->reply), size, mb_buf_free, NULL};
    int rc = mb_send(w->sock, NULL, 0, &h, body, w->payloads, w->npayloads);
    w->npayloads = 0;
    w->nreply = 0;
    return rc;
}

static int s_run_batch(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    if (mb_body_init(&r, zmq_msg_data(&m->body), zmq_msg_size(&m->body), m->header.count) == 0) {
        msgpack_object rec;
        int rc;
        while ((rc = mb_body_next(&r, &rec)) == 1)
            if (!s_run(w, &rec, m))
                fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed op record\n", w->device);
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
    return s_send(w, MB_COMPLETIONS, w->nreply);
}

static void s_note_abort(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    msgpack_object rec;
    int64_t dead;
    if (mb_body_init(&r, zmq_msg_data(&m->body), zmq_msg_size(&m->body), m->header.count) != 0)
        return;
    if (mb_body_next(&r, &rec) == 1 && mb_get_i64(&rec, 0, &dead) && dead >= 0)
        dt_idmap_put(&w->dead, (uint64_t)dead + 1, w);
    mb_body_destroy(&r);
}

void act_worker_defer(act_worker *w, mb_message *m)
{
    if (m->header.kind == MB_ABORT) {
        s_note_abort(w, m);
        mb_message_close(m);
        return;
    }
    if (m->header.kind == MB_BYE)
        w->leaving = true;
    act_pending *p = malloc(sizeof *p);
    if (!p) {
        mb_message_close(m);
        return;
    }
    p->next = NULL;
    p->msg = *m; /* the frames' contents move with the struct; m is not used again */
    if (w->pending_tail)
        w->pending_tail->next = p;
    else
        w->pending_head = p;
    w->pending_tail = p;
}

/* The next controller message: one deferred during a wait, or a new one. 0, 1 (none yet), <0. */
static int s_next_message(act_worker *w, mb_message *m, bool (*should_stop)(void *arg), void *arg)
{
    if (w->pending_head) {
        act_pending *p = w->pending_head;
        w->pending_head = p->next;
        if (!w->pending_head)
            w->pending_tail = NULL;
        *m = p->msg;
        free(p);
        return 0;
    }
    zmq_pollitem_t items[2] = {{zsock_resolve(w->sock), 0, ZMQ_POLLIN, 0}, {zsock_resolve(w->peer), 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, 2, S_POLL_MS) <= 0)
        return should_stop && should_stop(arg) ? DT_ESHUTDOWN : 1;
    if (items[1].revents & ZMQ_POLLIN)
        act_peer_receive(w);
    if (!(items[0].revents & ZMQ_POLLIN))
        return 1;
    int got = mb_recv(w->sock, false, true, m);
    return got == DT_EPROTO ? 1 : got;
}

typedef struct {
    char endpoint[256];
    int64_t device;
    pthread_mutex_t lock;
    pthread_cond_t wake;        /* signalled to stop at once */
    bool stop;
    pthread_t thread;
} s_heartbeat;

/* A worker process says it is alive from a thread of its own, so that a long kernel on the
 * worker's thread does not look like silence; a stopped or hung process goes quiet. */
static void *s_heartbeat_main(void *arg)
{
    s_heartbeat *hb = arg;
    char rid[32];
    snprintf(rid, sizeof rid, "h%" PRId64, hb->device);
    zsock_t *sock = mb_socket_new(MB_DEALER, hb->endpoint, false, rid);
    pthread_mutex_lock(&hb->lock);
    for (uint64_t seq = 0; sock && !hb->stop; seq++) {
        mb_header h = {MB_VERSION, MB_HEARTBEAT, seq, (uint32_t)hb->device, 0};
        mb_send(sock, NULL, 0, &h, (mb_buf){NULL, 0, NULL, NULL}, NULL, 0);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)(ACT_HEARTBEAT_S * 1e9);
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&hb->wake, &hb->lock, &until);
    }
    pthread_mutex_unlock(&hb->lock);
    mb_socket_destroy(&sock);
    return NULL;
}

static void s_hello(act_worker *w)
{
    msgpack_pack_array(&w->pk, 2);
    msgpack_pack_int64(&w->pk, w->device);
    msgpack_pack_int(&w->pk, (int)getpid());
}

int act_worker_run(const char *endpoint, int64_t device, bool (*should_stop)(void *arg), void *arg)
{
    char rid[32];
    snprintf(rid, sizeof rid, "d%" PRId64, device);
    act_worker w = {.device = device, .backend = &op_backend_cpu}; /* every device type is cpu so far */
    snprintf(w.endpoint, sizeof w.endpoint, "%s", endpoint);
    w.same_process = strncmp(endpoint, "inproc://", 9) == 0;
    dt_idmap_init(&w.tensors);
    dt_idmap_init(&w.peers);
    dt_idmap_init(&w.received);
    dt_idmap_init(&w.dead);
    msgpack_sbuffer_init(&w.reply);
    msgpack_packer_init(&w.pk, &w.reply, msgpack_sbuffer_write);
    int rc = act_peer_open(&w);
    if (rc == 0)
        w.sock = mb_socket_new(MB_DEALER, endpoint, false, rid);
    if (rc == 0 && !w.sock)
        rc = dt_last_error_code();
    if (rc == 0) {
        s_hello(&w);
        rc = s_send(&w, MB_HELLO, 1);
    }
    s_heartbeat hb = {.device = device, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};
    bool beating = false;
    if (rc == 0 && !w.same_process) {
        snprintf(hb.endpoint, sizeof hb.endpoint, "%s", endpoint);
        pthread_t beat;
        beating = pthread_create(&beat, NULL, s_heartbeat_main, &hb) == 0;
        if (beating)
            hb.thread = beat;
    }
    while (rc == 0) {
        mb_message m;
        int got = s_next_message(&w, &m, should_stop, arg);
        if (got == 1)
            continue;
        if (got != 0) {
            rc = got == DT_ESHUTDOWN ? 0 : got;
            break;
        }
        if (m.header.kind == MB_OPS) {
            rc = s_run_batch(&w, &m);
        } else if (m.header.kind == MB_ABORT) {
            s_note_abort(&w, &m);
        } else if (m.header.kind == MB_BYE) {
            mb_message_close(&m);
            s_send(&w, MB_BYE, 0);
            break;
        }
        mb_message_close(&m);
    }
    if (beating) {
        pthread_mutex_lock(&hb.lock);
        hb.stop = true;
        pthread_cond_signal(&hb.wake);
        pthread_mutex_unlock(&hb.lock);
        pthread_join(hb.thread, NULL);
    }
    while (w.pending_head) {
        act_pending *p = w.pending_head;
        w.pending_head = p->next;
        mb_message_close(&p->msg);
        free(p);
    }
    size_t cursor = 0;
    uint64_t id;
    void *t;
    while (dt_idmap_next(&w.tensors, &cursor, &id, &t))
        act_wtensor_free(t);
    dt_idmap_destroy(&w.tensors);
    dt_idmap_destroy(&w.dead);
    act_peer_close(&w);
    msgpack_sbuffer_destroy(&w.reply);
    free(w.payloads);
    mb_socket_destroy(&w.sock);
    return rc;
}
