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

#include "act_worker.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dt_pool.h"
#include "dt_shm.h"
#include "mb_schema.h"
#include "op_backend.h"
#include "op_registry.h"

#define S_POLL_MS 500 /* how often an idle worker looks at its stop flag */

/* what a COMPUTE record can carry must fit what a kernel takes */
_Static_assert(OP_MAX_INPUTS <= MB_MAX_IDS && OP_MAX_OUTPUTS <= MB_MAX_OUTS && OP_MAX_CTX <= MB_MAX_INTS && OP_MAX_INTS == MB_MAX_INTS &&
               OP_MAX_FLOATS == MB_MAX_FLOATS, "mb_schema.h's COMPUTE limits hold op_kernel's");

/* The worker whose thread this is, between act_worker_init and act_worker_fini: its spare lists
 * are touched by this thread alone. A storage let go on any other thread (a frame's free callback,
 * a peer thread done reading) goes back to malloc. */
static _Thread_local act_worker *s_self;

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

static size_t s_bytes(const act_wtensor *t)
{
    return (size_t)dt_layout_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
}

/* A table entry starts or stops using st: bytes_in_use counts each storage once, however many
 * entries share it. */
static void s_hold(act_worker *w, act_storage *st)
{
    if (st && st->held++ == 0) {
        int64_t *stats = w->stats;
        stats[MB_STAT_bytes_in_use] += (int64_t)st->size;
        if (stats[MB_STAT_bytes_in_use] > stats[MB_STAT_peak_bytes])
            stats[MB_STAT_peak_bytes] = stats[MB_STAT_bytes_in_use];
    }
}

static void s_unhold(act_worker *w, act_storage *st)
{
    if (st && --st->held == 0)
        w->stats[MB_STAT_bytes_in_use] -= (int64_t)st->size;
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
    mb_encode_error(&w->reply, fid, piece, code, msg);
    w->nreply++;
}

/* The bytes of t as a payload frame: straight from its storage when the host can read device
 * memory in place, else a host copy. -1 (and why) when there is no memory for it. (Pieces in
 * shared memory are lent to the controller by handle instead: s_reply_value.) */
static int s_piece_frame(act_worker *w, const act_wtensor *t, const char **why)
{
    size_t size = s_bytes(t);
    if (w->backend->host_view) {
        atomic_fetch_add(&t->storage->refs, 1);
        return s_add_payload(w, (mb_buf){(void *)w->backend->host_view(t->data), size, act_storage_free_fn, t->storage});
    }
    void *host = malloc(size ? size : 1);
    if (!host || (*why = act_copy_bytes(w->backend->to_host, host, t->data, size))) {
        free(host);
        return -1;
    }
    return s_add_payload(w, (mb_buf){host, size, mb_buf_free, NULL});
}

/* A VALUE completion for piece of future fid: t's bytes, lent by handle when they are in shared
 * memory, else as a frame; or none (t NULL: a SYNC's answer). */
static void s_reply_value(act_worker *w, uint64_t fid, int64_t piece, act_wtensor *t)
{
    int frame = -1;
    act_handle lent = {.segment = -1};
    if (t && (lent = act_shm_lend(w, t, 0, s_bytes(t), -1)).segment >= 0) {
        w->stats[MB_STAT_shm_bytes_fetched] += (int64_t)s_bytes(t);
    } else if (t) {
        const char *why = "out of memory on the device";
        if ((frame = s_piece_frame(w, t, &why)) < 0) {
            s_reply_error(w, fid, piece, DT_ENOMEM, why);
            return;
        }
    }
    mb_encode_value(&w->reply, fid, piece, t ? t->dtype : DT_FLOAT32, t ? t->ndim : 0, t ? t->shape : NULL, frame,
                    lent.segment, lent.serial, lent.offset, lent.hold);
    w->nreply++;
}

/* A STATS record's answer: the counters as a VALUE of MB_NSTATS int64. */
static void s_reply_stats(act_worker *w, uint64_t fid, int64_t piece)
{
    w->stats[MB_STAT_pooled_bytes] = (int64_t)(dt_pool_kept() + dt_shm_kept());
    int64_t *counters = malloc(sizeof w->stats);
    if (counters)
        memcpy(counters, w->stats, sizeof w->stats);
    int frame = counters ? s_add_payload(w, (mb_buf){counters, sizeof w->stats, mb_buf_free, NULL}) : -1;
    if (frame < 0) {
        s_reply_error(w, fid, piece, DT_ENOMEM, "out of memory on the device");
        return;
    }
    mb_encode_value(&w->reply, fid, piece, DT_INT64, 1, (const int64_t[]){MB_NSTATS}, frame, -1, 0, 0, 0);
    w->nreply++;
}

const char *act_worker_no_memory(const act_worker *w)
{
    return w->unusable[0] ? w->unusable : "out of memory on the device";
}

static const char *s_alloc(const act_worker *w, act_wtensor *t)
{
    t->storage = act_storage_piece(w, s_bytes(t));
    if (!t->storage)
        return act_worker_no_memory(w);
    t->data = t->storage->data;
    return NULL;
}

/* LOAD: the payload frame becomes the storage without a copy when the backend can use host
 * memory as it is, else it is copied to the device. */
static const char *s_load(act_worker *w, act_wtensor *t, int64_t frame, mb_message *m)
{
    size_t size = s_bytes(t);
    if (frame < 0 || frame >= m->npayloads || zmq_msg_size(&m->payloads[frame]) != size)
        return "malformed record (payload missing or of the wrong size)";
    zmq_msg_t *src = &m->payloads[frame];
    w->stats[MB_STAT_loads]++;
    w->stats[MB_STAT_loaded_bytes] += (int64_t)size;
    if (w->backend->adopt_host && w->backend->adopt_host(zmq_msg_data(src), size) &&
        (t->storage = act_storage_adopt(src))) {
        t->data = t->storage->data;
        return NULL;
    }
    const char *why = s_alloc(w, t);
    return why ? why : act_copy_bytes(w->backend->to_device, t->data, zmq_msg_data(src), size);
}

/* Makes the storage of a new tensor of dtype and shape; *out is the tensor even on failure. */
static const char *s_new_piece(act_worker *w, dt_dtype dtype, const mb_dims *shape, act_wtensor **out)
{
    act_wtensor *t = *out = act_wtensor_new(w);
    if (!t)
        return "out of memory on the device";
    t->dtype = dtype;
    t->ndim = shape->n;
    memcpy(t->shape, shape->v, (size_t)shape->n * sizeof *shape->v);
    return s_alloc(w, t);
}

/* Runs an op record that makes a tensor from nothing but its own fields (and payloads): the
 * tensor, or its poisoned place when it could not be made. */
static void s_make(act_worker *w, int64_t code, mb_cursor *rec, mb_message *m)
{
    const mb_cursor start = *rec;
    const op_backend *be = w->backend;
    const char *why = NULL;
    act_wtensor *t = NULL;
    uint64_t id = 0;
    int rc;
    switch (code) {
    case MB_OP_EMPTY: {
        mb_empty_rec r;
        if ((rc = mb_read_empty(rec, &r)) == 0) {
            id = r.id;
            why = s_new_piece(w, r.dtype, &r.shape, &t);
        }
        break;
    }
    case MB_OP_FILL: {
        mb_fill_rec r;
        if ((rc = mb_read_fill(rec, &r)) == 0) {
            id = r.id;
            if (!(why = s_new_piece(w, r.dtype, &r.shape, &t)))
                why = be->fill(t->data, t->dtype, dt_layout_numel(t->ndim, t->shape), r.value);
        }
        break;
    }
    case MB_OP_RANDOM: {
        mb_random_rec r;
        if ((rc = mb_read_random(rec, &r)) == 0 &&
            (r.offset.n != r.shape.n || r.global_shape.n != r.shape.n || !dt_dtype_is_float(r.dtype)))
            rc = dt_err(DT_EPROTO, "malformed random record: offset, shape and global shape disagree, or not a "
                                   "float dtype");
        else if (rc == 0 && !dt_layout_region_inside(r.shape.n, r.global_shape.v, r.offset.v, r.shape.v))
            rc = dt_err(DT_EPROTO, "malformed random record: the piece lies outside its global shape");
        if (rc == 0) {
            id = r.id;
            if (!(why = s_new_piece(w, r.dtype, &r.shape, &t)))
                why = be->random(t->data, t->dtype, t->ndim, t->shape, r.offset.v, r.global_shape.v, r.seed,
                                 r.stream, r.normal);
        }
        break;
    }
    case MB_OP_ARANGE: {
        mb_arange_rec r;
        if ((rc = mb_read_arange(rec, &r)) == 0 && (r.shape.n != 1 || r.first < 0 || r.first > INT64_MAX - r.shape.v[0]))
            rc = dt_err(DT_EPROTO, "malformed arange record: a range has one dim, and its first element is >= 0 "
                                   "with first + size not past INT64_MAX");
        if (rc == 0) {
            id = r.id;
            if (!(why = s_new_piece(w, r.dtype, &r.shape, &t)))
                why = be->arange(t->data, t->dtype, t->shape[0], r.first, r.start, r.step);
        }
        break;
    }
    case MB_OP_LOAD: {
        mb_load_rec r;
        if ((rc = mb_read_load(rec, &r)) == 0) {
            id = r.id;
            if ((t = act_wtensor_new(w))) {
                t->dtype = r.dtype;
                t->ndim = r.shape.n;
                memcpy(t->shape, r.shape.v, (size_t)r.shape.n * sizeof *r.shape.v);
                why = s_load(w, t, r.frame, m);
            } else {
                why = "out of memory on the device";
            }
        }
        break;
    }
    default:
        rc = dt_err(DT_EPROTO, "unknown op record code %" PRId64, code);
    }
    if (rc != 0) {
        /* a record that cannot be read still poisons its output when it names one */
        *rec = start; /* not read whole */
        if (!mb_field_u64(rec, 1, &id)) {
            fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed op record: %s\n", w->device,
                    dt_last_error());
            return;
        }
        why = dt_last_error();
    }
    if (why) {
        char msg[DT_ERRMSG_MAX];
        act_worker_failure(w, msg, sizeof msg, mb_op_name(code), why);
        act_wtensor_free(w, t);
        act_wtensor_poison(w, id, msg);
    } else {
        act_wtensor_put(w, id, t);
    }
}

bool act_wtensor_sole(const act_wtensor *t)
{
    const act_storage *st = t->storage;
    return st && !st->adopted && atomic_load(&st->refs) == 1 && t->data == st->data;
}

/* Makes t's storage its own before a write in place: storage that anything else holds (a fetch
 * or a transfer on its way, a replica sharing it, a received frame) is copied first, so whatever
 * was issued before the write keeps seeing the old value. */
static const char *s_own_storage(act_worker *w, act_wtensor *t)
{
    if (act_wtensor_sole(t))
        return NULL;
    size_t size = (size_t)dt_layout_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
    act_storage *own = act_storage_piece(w, size);
    if (!own)
        return act_worker_no_memory(w);
    const char *why = act_copy_bytes(w->backend->copy_region, own->data, t->data, size);
    if (why) {
        act_storage_release(own);
        return why;
    }
    act_wtensor_set_storage(w, t, own);
    return NULL;
}

/* A strided view's elements gathered into a C-contiguous piece of its own (*made), which the
 * kernel then reads: from its first element in the piece at data, with the view's strides. */
static const char *s_gather_view(act_worker *w, const mb_view *v, op_local *in, act_storage **made)
{
    size_t elem = dt_dtype_size(in->dtype);
    int64_t n = dt_layout_numel(v->shape.n, v->shape.v);
    const void *from = in->data;
    if (!(*made = act_storage_piece(w, (size_t)n * elem)))
        return "out of memory on the device";
    in->data = (*made)->data;
    if (n == 0)
        return NULL; /* nothing read: the strides, which no extent bounds then, are not looked at */
    int64_t src[DT_MAX_DIMS], dst[DT_MAX_DIMS], run = (int64_t)elem;
    for (int d = v->shape.n - 1; d >= 0; d--) {
        src[d] = v->strides[d] * (int64_t)elem;
        dst[d] = run;
        run *= v->shape.v[d];
    }
    return w->backend->copy_region((*made)->data, dst, (const char *)from + v->first * (int64_t)elem, src, v->shape.n,
                                   v->shape.v, elem);
}

/* The inputs a COMPUTE reads as views (mb_view): each one's piece is the part of the piece its id
 * names that the view reads (a contiguous run from its first element, or a strided view, gathered
 * into gathered[input]; NULL for a run), which must lie inside it; *seen gets a bit per viewed
 * input. NULL, or why a view cannot be read. */
static const char *s_read_views(act_worker *w, const mb_views *views, op_kernel *k, uint64_t *seen,
                                act_storage **gathered)
{
    _Static_assert(OP_MAX_INPUTS <= 64, "a bit per input");
    mb_view v;
    int at = 0, rc;
    while ((rc = mb_view_next(views, &at, k->nin, &v)) == 1) {
        op_local *in = &k->in[v.input];
        int64_t end = mb_view_extent(&v), have = dt_layout_numel(in->ndim, in->shape);
        if ((*seen >> v.input) & 1 || end < 0 || end > have) {
            dt_err(DT_EPROTO, "malformed compute record: a view of input %d does not lie inside its piece", v.input);
            return dt_last_error();
        }
        *seen |= (uint64_t)1 << v.input;
        gathered[v.input] = NULL;
        in->ndim = v.shape.n;
        memcpy(in->shape, v.shape.v, (size_t)v.shape.n * sizeof *v.shape.v);
        if (v.strided) {
            const char *why = s_gather_view(w, &v, in, &gathered[v.input]);
            if (why)
                return why;
        } else if (end > 0) {
            in->data = (char *)in->data + (size_t)v.first * dt_dtype_size(in->dtype);
        }
    }
    return rc == 0 ? NULL : dt_last_error();
}

/* An output whose bytes start at data, inside storage (op_def.alias): it shares the storage. */
static void s_put_view(act_worker *w, uint64_t id, act_storage *storage, char *data, const op_local *out)
{
    act_wtensor *t = act_wtensor_new(w);
    if (!t) {
        act_wtensor_poison(w, id, "out of memory on the device");
        return;
    }
    t->dtype = out->dtype;
    t->ndim = out->ndim;
    memcpy(t->shape, out->shape, (size_t)out->ndim * sizeof *out->shape);
    t->storage = storage;
    atomic_fetch_add(&storage->refs, 1);
    t->data = data;
    act_wtensor_put(w, id, t);
}

/* The kernel of a COMPUTE whose inputs k holds (in0: input 0's id; in0_storage: the storage its
 * piece lies in, which an aliasing output shares), or its outputs poisoned when why says it cannot
 * run. False for a record that does not fit its op. */
static bool s_compute_run(act_worker *w, op_kernel *k, const uint64_t *out_ids, uint64_t in0, act_storage *in0_storage,
                          const char *why)
{
    char msg[DT_ERRMSG_MAX];
    /* a record over a socket another process can reach is checked against the op; between threads
     * of one process it comes from this process's own controller, which worked the shapes out */
    if (!why && !w->same_process && (why = op_check_local(k))) {
        act_worker_failure(w, msg, sizeof msg, k->def->name, why);
        for (int o = 0; o < k->nout; o++)
            act_wtensor_poison(w, out_ids[o], msg);
        return true;
    }
    if (why) {
        snprintf(msg, sizeof msg, "%s", why); /* the root failure, passed on unchanged */
        for (int o = 0; o < k->nout; o++)
            act_wtensor_poison(w, out_ids[o], msg);
        return true;
    }
    size_t offset;
    if (k->def->alias && k->def->alias(k, &offset)) {
        s_put_view(w, out_ids[0], in0_storage, (char *)k->in[0].data + offset, &k->out[0]);
        return true;
    }
    act_wtensor *made[OP_MAX_OUTPUTS] = {NULL};
    act_wtensor *written = NULL; /* an in-place op's output 0: input 0 itself */
    if (k->def->inplace && k->nin > 0 && k->nout > 0) {
        if (out_ids[0] != in0 || k->out[0].ndim != k->in[0].ndim ||
            memcmp(k->out[0].shape, k->in[0].shape, (size_t)k->in[0].ndim * sizeof k->in[0].shape[0]) != 0)
            return false;
        written = act_wtensor_lookup(w, in0, &why);
        if (written && !(why = s_own_storage(w, written)))
            k->out[0].data = k->in[0].data = written->data;
    }
    for (int o = written ? 1 : 0; o < k->nout && !why; o++) {
        made[o] = act_wtensor_new(w);
        if (!made[o]) {
            why = "out of memory on the device";
            break;
        }
        made[o]->dtype = k->out[o].dtype;
        made[o]->ndim = k->out[o].ndim;
        memcpy(made[o]->shape, k->out[o].shape, sizeof made[o]->shape);
        if (!(why = s_alloc(w, made[o])))
            k->out[o].data = made[o]->data;
    }
    if (!why)
        why = w->backend->run(k->def, k);
    for (int o = 0; o < k->nout; o++) {
        if (o == 0 && written && !why)
            continue; /* written in place: it is already in the table */
        if (why) {
            act_wtensor_free(w, made[o]);
            act_worker_failure(w, msg, sizeof msg, k->def->name, why);
            act_wtensor_poison(w, out_ids[o], msg);
        } else {
            act_wtensor_put(w, out_ids[o], made[o]);
        }
    }
    return true;
}

/* COMPUTE: a registered op's kernel on this device's pieces. A poisoned input poisons the
 * outputs with its (root) message. False for a record it cannot read (dt_last_error says why). */
static bool s_compute(act_worker *w, mb_cursor *rec)
{
    mb_compute_rec r;
    if (mb_read_compute(rec, &r) != 0)
        return false;
    const op_def *def = r.op >= 0 && r.op <= INT32_MAX ? op_at((int)r.op) : NULL;
    if (!def || r.outs.n > OP_MAX_OUTPUTS || r.ins.n > OP_MAX_INPUTS || r.ctx.n > OP_MAX_CTX) {
        dt_err(DT_EPROTO, "malformed compute record: %s", def ? "too many inputs, outputs or ctx integers" : "unknown op");
        return false;
    }
    op_attrs attrs = {.nints = r.ints.n, .nfloats = r.floats.n, .has_scalar = r.scalar.present, .scalar = r.scalar.value};
    memcpy(attrs.ints, r.ints.v, (size_t)r.ints.n * sizeof *r.ints.v);
    memcpy(attrs.floats, r.floats.v, (size_t)r.floats.n * sizeof *r.floats.v);
    /* the kernel's inputs beyond nin are left unwritten: the struct is kilobytes (OP_MAX_INPUTS
     * pieces) and zeroing it was a tenth of a worker's time for a small op; kernels read in[i]
     * only for i < nin, and every field of those is written below */
    op_kernel k;
    k.def = def;
    k.attrs = &attrs;
    k.nin = r.ins.n;
    k.nout = (int)r.outs.n;
    k.nctx = r.ctx.n;
    memset(k.ctx, 0, sizeof k.ctx);
    memcpy(k.ctx, r.ctx.v, (size_t)r.ctx.n * sizeof *r.ctx.v);
    uint64_t out_ids[OP_MAX_OUTPUTS];
    for (int o = 0; o < k.nout; o++) {
        const mb_out_rec *out = &r.outs.v[o];
        out_ids[o] = out->id;
        k.out[o] = (op_local){.dtype = out->dtype, .ndim = out->shape.n};
        memcpy(k.out[o].shape, out->shape.v, (size_t)out->shape.n * sizeof *out->shape.v);
    }
    const char *why = NULL;
    act_wtensor *first = NULL; /* input 0 */
    for (int i = 0; i < k.nin && !why; i++) {
        act_wtensor *t = act_wtensor_lookup(w, r.ins.v[i], &why);
        if (i == 0)
            first = t;
        if (t) {
            k.in[i] = (op_local){t->dtype, t->ndim, {0}, t->data};
            memcpy(k.in[i].shape, t->shape, sizeof t->shape);
        }
    }
    uint64_t viewed = 0;
    act_storage *gathered[OP_MAX_INPUTS]; /* set for the viewed inputs */
    if (!why && r.views.n)
        why = s_read_views(w, &r.views, &k, &viewed, gathered);
    act_storage *in0_storage = viewed & 1 && gathered[0] ? gathered[0] : first ? first->storage : NULL;
    bool ok;
    if (def->inplace && (viewed & 1))
        ok = !dt_err(DT_EPROTO, "malformed compute record: an in-place op writes into a view");
    else
        ok = s_compute_run(w, &k, out_ids, k.nin > 0 ? r.ins.v[0] : 0, in0_storage, why);
    for (int i = 0; i < k.nin; i++)
        if ((viewed >> i) & 1 && gathered[i])
            act_storage_release(gathered[i]);
    return ok;
}

void act_worker_failure(const act_worker *w, char *msg, size_t size, const char *op, const char *why)
{
    char where[160];
    snprintf(msg, size, "%s failed on device %" PRId64 "%s: %s", op, w->device, act_replay_where(w, where, sizeof where),
             why);
}

static int64_t s_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Gives back the marks of the events kept and of the start (a backend that marks). */
static void s_trace_marks_clear(act_worker *w)
{
    const op_backend *b = w->backend;
    if (!b->mark)
        return;
    for (size_t i = 0; w->trace_marks && i < 2 * w->ntrace; i++) {
        b->mark_free(w->trace_marks[i]);
        w->trace_marks[i] = NULL;
    }
    b->mark_free(w->trace_mark0);
    w->trace_mark0 = NULL;
}

/* With a backend that marks, each event's times become when the device ran its work (from its
 * marks, counted from the start's mark at host time trace_t0) instead of when the worker queued
 * it; an event whose marks cannot tell keeps the host's times. */
static void s_trace_marks_resolve(act_worker *w)
{
    const op_backend *b = w->backend;
    if (!b->mark || !w->trace_mark0)
        return;
    for (size_t i = 0; i < w->ntrace; i++) {
        int64_t *e = w->trace + i * MB_TRACE_FIELDS;
        int64_t from = b->mark_elapsed_ns(w->trace_mark0, w->trace_marks[2 * i]);
        int64_t to = b->mark_elapsed_ns(w->trace_mark0, w->trace_marks[2 * i + 1]);
        if (from >= 0 && to >= from) {
            e[MB_TRACE_BEGIN] = w->trace_t0 + from;
            e[MB_TRACE_END] = w->trace_t0 + to;
        }
    }
}

/* TRACE: start, stop, or send the events (an int64 (n, MB_TRACE_FIELDS) value). */
static bool s_trace(act_worker *w, mb_cursor *rec)
{
    mb_trace_rec r;
    if (mb_read_trace(rec, &r) != 0)
        return false;
    size_t rows = r.action == MB_TRACE_SEND ? w->ntrace : 1;
    size_t bytes = rows * (r.action == MB_TRACE_SEND ? MB_TRACE_FIELDS : 1) * sizeof(int64_t);
    int64_t *v = malloc(bytes ? bytes : 1);
    if (!v) {
        s_reply_error(w, r.future, r.piece, DT_ENOMEM, "out of memory on the device");
        return true;
    }
    if (r.action == MB_TRACE_START) {
        s_trace_marks_clear(w);
        w->ntrace = 0;
        w->tracing = true;
        if (w->backend->mark) {
            /* the start's mark is reached at once on an idle device: it ties device time to the host's */
            if (w->backend->synchronize)
                w->backend->synchronize();
            w->trace_mark0 = w->backend->mark();
        }
        w->trace_t0 = s_now_ns();
        v[0] = 0;
    } else if (r.action == MB_TRACE_STOP) {
        w->tracing = false;
        v[0] = (int64_t)w->ntrace;
    } else if (r.action == MB_TRACE_SEND) {
        s_trace_marks_resolve(w);
        if (bytes) /* nothing traced: no buffer either */
            memcpy(v, w->trace, bytes);
        s_trace_marks_clear(w);
        w->ntrace = 0;
    } else {
        free(v);
        s_reply_error(w, r.future, r.piece, DT_EINVAL, "unknown trace action");
        return true;
    }
    int frame = s_add_payload(w, (mb_buf){v, bytes, mb_buf_free, NULL});
    if (frame < 0) {
        s_reply_error(w, r.future, r.piece, DT_ENOMEM, "out of memory on the device");
        return true;
    }
    if (r.action == MB_TRACE_SEND)
        mb_encode_value(&w->reply, r.future, r.piece, DT_INT64, 2, (const int64_t[]){(int64_t)rows, MB_TRACE_FIELDS},
                        frame, -1, 0, 0, 0);
    else
        mb_encode_value(&w->reply, r.future, r.piece, DT_INT64, 1, (const int64_t[]){1}, frame, -1, 0, 0, 0);
    w->nreply++;
    return true;
}

static bool s_run_record(act_worker *w, mb_cursor *rec, mb_message *m, int64_t code);

bool act_worker_run_record(act_worker *w, mb_cursor *rec, mb_message *m)
{
    uint64_t id;
    if (!w->tracing && mb_read_free_fast(rec, &id)) { /* every op's second record */
        act_replay_free(w, id);
        return true;
    }
    const mb_cursor start = *rec;
    int64_t code;
    bool ok;
    if (mb_record_code(rec, &code) != 0)
        return false;
    if (code == MB_OP_TRACE || !w->tracing) {
        ok = code == MB_OP_TRACE ? s_trace(w, rec) : s_run_record(w, rec, m, code);
        if (!ok)
            *rec = start; /* read in part at most: left for the body reader to step over */
        return ok;
    }
    const op_backend *b = w->backend;
    bool marked = b->mark && w->ntrace < ACT_TRACE_MARKED;
    void *mark_begin = marked ? b->mark() : NULL;
    int64_t begin = s_now_ns();
    ok = s_run_record(w, rec, m, code);
    if (!ok)
        *rec = start;
    void *mark_end = marked ? b->mark() : NULL;
    if (w->ntrace == w->cap_trace && w->cap_trace < ACT_TRACE_MAX) {
        size_t cap = w->cap_trace ? 2 * w->cap_trace : 4096;
        int64_t *grown = realloc(w->trace, cap * MB_TRACE_FIELDS * sizeof *grown);
        void **marks = grown && b->mark ? realloc(w->trace_marks, cap * 2 * sizeof *marks) : NULL;
        if (grown)
            w->trace = grown;
        if (marks)
            w->trace_marks = marks;
        if (grown && (!b->mark || marks))
            w->cap_trace = cap;
    }
    if (w->ntrace < w->cap_trace) {
        if (b->mark) {
            w->trace_marks[2 * w->ntrace] = mark_begin;
            w->trace_marks[2 * w->ntrace + 1] = mark_end;
            mark_begin = mark_end = NULL;
        }
        int64_t *e = w->trace + w->ntrace++ * MB_TRACE_FIELDS, op = -1;
        uint64_t number;
        if (code == MB_OP_COMPUTE && mb_field_u64(&start, 1, &number) && number <= INT64_MAX)
            op = (int64_t)number;   /* a COMPUTE's op number comes first */
        e[MB_TRACE_CODE] = code;
        e[MB_TRACE_OP] = op;
        e[MB_TRACE_BEGIN] = begin;
        e[MB_TRACE_END] = s_now_ns();
    }
    if (b->mark) {
        b->mark_free(mark_begin); /* an event dropped past ACT_TRACE_MAX */
        b->mark_free(mark_end);
    }
    return ok;
}

static bool s_run_record(act_worker *w, mb_cursor *rec, mb_message *m, int64_t code)
{
    switch (code) {
    case MB_OP_SYNC: {
        mb_sync_rec r;
        if (mb_read_sync(rec, &r) != 0)
            return false;
        const char *why = w->backend->synchronize ? w->backend->synchronize() : NULL;
        if (why)
            s_reply_error(w, r.future, r.piece, DT_EKERNEL, why);
        else
            s_reply_value(w, r.future, r.piece, NULL);
        return true;
    }
    case MB_OP_FREE: {
        mb_free_rec r;
        if (mb_read_free(rec, &r) != 0)
            return false;
        act_replay_free(w, r.id);
        return true;
    }
    case MB_OP_FETCH: {
        mb_fetch_rec r;
        const char *why;
        if (mb_read_fetch(rec, &r) != 0)
            return false;
        act_wtensor *t = act_wtensor_lookup(w, r.id, &why);
        if (t)
            s_reply_value(w, r.future, r.piece, t);
        else
            s_reply_error(w, r.future, r.piece, DT_EKERNEL, why);
        return true;
    }
    case MB_OP_STATS: {
        mb_stats_rec r;
        if (mb_read_stats(rec, &r) != 0)
            return false;
        s_reply_stats(w, r.future, r.piece);
        if (r.reset_peak)
            w->stats[MB_STAT_peak_bytes] = w->stats[MB_STAT_bytes_in_use];
        return true;
    }
    case MB_OP_SEND:
        return act_peer_send(w, rec);
    case MB_OP_ASSEMBLE:
        return act_peer_assemble(w, rec);
    case MB_OP_COMPUTE:
        return s_compute(w, rec);
    case MB_OP_DEFINE:
        if (!m || w->replay) {
            dt_err(DT_EPROTO, "malformed define record: inside a captured sequence");
            return false;
        }
        return act_replay_define(w, rec, m);
    case MB_OP_REPLAY:
        if (w->replay) {
            dt_err(DT_EPROTO, "malformed replay record: inside a captured sequence");
            return false;
        }
        return act_replay_run(w, rec);
    case MB_OP_DROP:
        return act_replay_drop(w, rec);
    default:
        if (!m && code == MB_OP_LOAD) {
            dt_err(DT_EPROTO, "malformed load record: inside a captured sequence");
            return false;
        }
        s_make(w, code, rec, m);
        return true;
    }
}

static int s_send(act_worker *w, mb_kind kind, uint32_t count)
{
    mb_header h = {MB_VERSION, kind, w->send_seq++, (uint32_t)w->device, count};
    /* records that did not fit leave the body short of count: the controller takes that for a
     * protocol error and declares the device dead, which is what running out of memory here is */
    w->reply.failed = false;
    int rc = mb_send(w->sock, NULL, 0, &h, act_body_frame(&w->reply), w->payloads, w->npayloads);
    if (w->posted)
        __atomic_add_fetch(w->posted, 1, __ATOMIC_RELEASE); /* after the send: a look that sees it finds the message */
    w->npayloads = 0;
    w->nreply = 0;
    return rc;
}

static int s_run_batch(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    if (act_body_open(&r, m) == 0) {
        mb_cursor rec;
        int rc;
        while ((rc = mb_body_next(&r, &rec)) == 1) {
            if (!act_worker_run_record(w, &rec, m))
                fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed op record: %s\n", w->device,
                        dt_last_error());
            mb_body_read(&r, &rec);
        }
        if (rc < 0)
            fprintf(stderr, "dtorch worker %" PRId64 ": %s\n", w->device, dt_last_error());
    } else {
        fprintf(stderr, "dtorch worker %" PRId64 ": %s\n", w->device, dt_last_error());
    }
    /* credit the whole batch, read or not, so the controller's window stays exact */
    mb_encode_credit(&w->reply, m->header.count);
    w->nreply++;
    return s_send(w, MB_COMPLETIONS, w->nreply);
}

static void s_note_abort(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    mb_cursor rec;
    mb_abort_rec dead;
    if (act_body_open(&r, m) != 0)
        return;
    if (mb_body_next(&r, &rec) == 1 && mb_decode_abort(&rec, &dead) == 0 && dead.device >= 0 &&
        dead.device <= DT_MAX_DEVICE_ID) {
        dt_idmap_put(&w->dead, (uint64_t)dead.device + 1, w);
        act_shm_forget(w, dead.device);
    }
}

/* MB_ENDPOINT: where a peer on another host listens. Read again here (the controller checked it
 * too): only an IPv4 tcp endpoint with a port is kept, written back from its parts. */
static void s_note_endpoint(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    mb_cursor rec;
    mb_endpoint_rec peer;
    if (!w->remote || act_body_open(&r, m) != 0)
        return;
    char text[64];
    mb_tcp_addr addr;
    if (mb_body_next(&r, &rec) == 1 && mb_decode_endpoint(&rec, &peer) == 0 && peer.device >= 0 &&
        peer.device <= DT_MAX_DEVICE_ID && peer.endpoint.len < sizeof text) {
        snprintf(text, sizeof text, "%.*s", (int)peer.endpoint.len, peer.endpoint.ptr);
        char *kept = mb_tcp_parse(text, false, &addr) == 0 ? malloc(sizeof text) : NULL;
        if (kept) {
            mb_tcp_format(&addr, kept, sizeof text);
            free(dt_idmap_take(&w->endpoints, (uint64_t)peer.device + 1));
            if (dt_idmap_put(&w->endpoints, (uint64_t)peer.device + 1, kept) != 0)
                free(kept);
        }
    }
}

bool act_worker_orphaned(act_worker *w)
{
    if (!w->remote || w->orphaned)
        return w->orphaned;
    double quiet = act_now() - w->heard_at;
    bool heard = w->heard_at != w->started_at;
    if (quiet <= (heard ? w->silent_s : w->connect_s))
        return false; /* a worker may be started before its controller listens: it waits longer for a first word */
    w->orphaned = true;
    if (!heard)
        dt_err(DT_EDEVICE, "no word from the controller at %s in %.1f s: is it listening there, and are --key and "
               "--server-key the ones it was given?", w->endpoint, quiet);
    else
        dt_err(DT_EDEVICE, "the controller at %s has been silent for %.1f s: leaving", w->endpoint, quiet);
    return true;
}

/* A controller message that acts at once, wherever the worker is: true when m was one. */
static bool s_act_now(act_worker *w, mb_message *m)
{
    w->heard_at = act_now();
    if (m->header.kind == MB_HEARTBEAT)
        ; /* only that it is alive */
    else if (m->header.kind == MB_ENDPOINT)
        s_note_endpoint(w, m);
    else if (m->header.kind == MB_ABORT)
        s_note_abort(w, m);
    else if (m->header.kind == MB_PROCESS)
        act_shm_on_process(w, m);
    else if (m->header.kind == MB_RELEASE)
        act_shm_on_release(w, m, -1);
    else
        return false;
    return true;
}

void act_worker_defer(act_worker *w, mb_message *m)
{
    if (s_act_now(w, m)) {
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
    act_worker_beat(w);
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
    if (act_poll(items, 2, S_POLL_MS, &w->spin_until) <= 0) {
        if (act_worker_orphaned(w))
            return DT_EDEVICE;
        return should_stop && should_stop(arg) ? DT_ESHUTDOWN : 1;
    }
    if (items[1].revents & ZMQ_POLLIN)
        act_peer_receive(w);
    if (!(items[0].revents & ZMQ_POLLIN))
        return act_worker_orphaned(w) ? DT_EDEVICE : 1;
    int got = mb_recv(w->sock, false, true, m);
    if (got == 0)
        w->heard_at = act_now();
    return got == DT_EPROTO ? 1 : got;
}

typedef struct {
    char endpoint[256];
    char rid[MB_RID_MAX];       /* its socket's routing id ("h<device>", with the run's token) */
    int64_t device;
    const mb_curve *curve;      /* NULL: plaintext */
    pthread_mutex_t lock;
    pthread_cond_t wake;        /* signalled to stop at once */
    bool stop;
    pthread_t thread;
} s_heartbeat;

/* A worker process says it is alive from a thread of its own, from before its hello on, so that a
 * long kernel on the worker's thread (or a device that takes long to attach) does not look like
 * silence; a stopped or hung process goes quiet. */
static void *s_heartbeat_main(void *arg)
{
    s_heartbeat *hb = arg;
    zsock_t *sock = mb_socket_open(MB_DEALER, hb->endpoint, false, hb->rid, hb->curve);
    if (sock) {
        zsock_set_sndtimeo(sock, 0); /* one that cannot be queued now (no link yet, or none any more) is dropped */
        zsock_set_linger(sock, 0);   /* and none is worth waiting for at exit */
    }
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

/* Who this worker is and what it speaks: the controller refuses a worker built from other sources. */
static void s_hello(act_worker *w)
{
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    mb_encode_hello(&w->reply, w->device, (int64_t)getpid(), MB_PROTOCOL, op_registry_hash(), w->backend->name, host,
                    w->remote ? w->peer_endpoint : "");
}

int act_worker_run(const char *endpoint, int64_t device, const char *device_type, bool (*should_stop)(void *arg),
                   void *arg)
{
    act_worker_link link = {.endpoint = endpoint, .device = device, .device_type = device_type};
    return act_worker_serve(&link, should_stop, arg);
}

void act_worker_beat(act_worker *w)
{
    if (w->beats)
        atomic_fetch_add_explicit(w->beats, 1, memory_order_relaxed);
}

int act_worker_serve(const act_worker_link *link, bool (*should_stop)(void *arg), void *arg)
{
    int64_t device = link->device;
    const op_backend *backend = op_backend_find(link->device_type);
    if (!backend) {
        char names[128];
        op_backend_names(names, sizeof names);
        return dt_err(DT_EINVAL, "device %" PRId64 ": no '%s' device backend in this build (it has %s)", device,
                      link->device_type ? link->device_type : "(null)", names);
    }
    act_worker w;
    act_worker_init(&w, device, backend, link->endpoint);
    w.remote = link->remote;
    w.silent_s = link->silent_s > 0 ? link->silent_s : ACT_SILENT_S;
    w.connect_s = link->connect_s > 0 ? link->connect_s : ACT_CONNECT_S;
    w.beats = link->beats;
    w.posted = link->posted;
    snprintf(w.peer_host, sizeof w.peer_host, "%s", link->peer_host ? link->peer_host : "127.0.0.1");
    snprintf(w.token, sizeof w.token, "%s", link->token ? link->token : "");
    if ((w.curve = link->keys != NULL)) {
        w.keys = *link->keys;
        snprintf(w.server_key, sizeof w.server_key, "%s", link->server_key ? link->server_key : "");
    }
    char rid[MB_RID_MAX];
    mb_rid_format(rid, 'd', device, w.token);
    mb_curve to_controller = {&w.keys, w.server_key};
    int rc = act_peer_open(&w);
    if (rc == 0)
        w.sock = mb_socket_open(MB_DEALER, link->endpoint, false, rid, w.curve ? &to_controller : NULL);
    if (rc == 0 && !w.sock)
        rc = dt_last_error_code();
    if (rc == 0 && w.remote)
        zsock_set_sndtimeo(w.sock, (int)(w.silent_s * 1000)); /* a link gone that long: the controller is silent too */
    if (link->opened)
        link->opened(link->opened_arg, rc);
    s_heartbeat hb = {.device = device, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
                      .curve = w.curve ? &to_controller : NULL};
    bool beating = false;
    if (rc == 0 && !w.same_process) {
        snprintf(hb.endpoint, sizeof hb.endpoint, "%s", link->endpoint);
        mb_rid_format(hb.rid, 'h', device, w.token);
        pthread_t beat;
        beating = pthread_create(&beat, NULL, s_heartbeat_main, &hb) == 0;
        if (beating)
            hb.thread = beat;
    }
    /* the device is bound on the thread that runs every record; a device that cannot be used
     * still serves, failing what touches it with the reason (and never hanging the controller) */
    bool attached = rc == 0 && backend->attach;
    const char *unusable = attached ? backend->attach(device) : NULL;
    if (unusable)
        snprintf(w.unusable, sizeof w.unusable, "%s", unusable);
    if (rc == 0) {
        s_hello(&w);
        rc = s_send(&w, MB_HELLO, 1);
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
        } else if (m.header.kind == MB_BYE) {
            mb_message_close(&m);
            s_send(&w, MB_BYE, 0);
            break;
        } else {
            s_act_now(&w, &m);
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
    act_worker_fini(&w);
    if (attached && backend->detach)
        backend->detach();
    return rc;
}

void act_worker_init(act_worker *w, int64_t device, const op_backend *backend, const char *endpoint)
{
    *w = (act_worker){.device = device, .backend = backend};
    snprintf(w->endpoint, sizeof w->endpoint, "%s", endpoint);
    w->same_process = strncmp(endpoint, "inproc://", 9) == 0;
    w->heard_at = w->started_at = act_now();
    dt_idmap_init(&w->endpoints);
    w->read_peers = w->same_process && backend->copy_from_peer;
    dt_idmap_init(&w->tensors);
    dt_idmap_init(&w->peers);
    dt_idmap_init(&w->linked);
    dt_idmap_init(&w->received);
    dt_idmap_init(&w->dead);
    dt_idmap_init(&w->graphs);
    dt_idmap_init(&w->pins);
    dt_idmap_init(&w->holds);
    dt_idmap_init(&w->procs);
    s_self = w;
}

void act_worker_drop_reply(act_worker *w)
{
    for (int i = 0; i < w->npayloads; i++)
        if (w->payloads[i].free_fn)
            w->payloads[i].free_fn(w->payloads[i].data, w->payloads[i].hint);
    w->npayloads = 0;
    w->nreply = 0;
    w->reply.size = 0;
    w->reply.failed = false;
}

void act_worker_fini(act_worker *w)
{
    while (w->pending_head) {
        act_pending *p = w->pending_head;
        w->pending_head = p->next;
        mb_message_close(&p->msg);
        free(p);
    }
    act_replay_close(w);
    size_t cursor = 0;
    uint64_t id;
    void *t;
    while (dt_idmap_next(&w->tensors, &cursor, &id, &t))
        act_wtensor_free(w, t);
    dt_idmap_destroy(&w->tensors);
    while (w->nspare > 0)
        free(w->spare[--w->nspare]);
    dt_idmap_destroy(&w->dead);
    act_peer_close(w);
    cursor = 0;
    while (dt_idmap_next(&w->endpoints, &cursor, &id, &t))
        free(t);
    dt_idmap_destroy(&w->endpoints);
    act_worker_drop_reply(w);
    free(mb_w_release(&w->reply));
    free(w->payloads);
    s_trace_marks_clear(w);
    free(w->trace_marks);
    free(w->trace);
    if (w->sock && w->orphaned)
        zsock_set_linger(w->sock, 0); /* nobody is left to read what it still queues */
    mb_socket_destroy(&w->sock);
    if (s_self == w)
        s_self = NULL; /* storage let go from now on goes back to malloc */
    for (int k = 0; k < (int)(ACT_SMALL_MAX / ACT_SMALL_STEP); k++)
        while (w->nsmall[k] > 0)
            w->backend->free(w->small[k][--w->nsmall[k]], (k + 1) * ACT_SMALL_STEP);
    while (w->nspare_storage > 0)
        free(w->spare_storage[--w->nspare_storage]);
}
