/* act_worker_ops — the op records that run a device's kernels on its pieces: the factories (EMPTY,
 * FILL, RANDOM, ARANGE, LOAD) and COMPUTE, with its views of inputs, its outputs that alias an
 * input and its writes in place. A piece that cannot be made is poisoned with why. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_worker.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dt_pool.h"
#include "mb_schema.h"
#include "op_backend.h"
#include "op_registry.h"

/* what a COMPUTE record can carry must fit what a kernel takes */
_Static_assert(OP_MAX_INPUTS <= MB_MAX_IDS && OP_MAX_OUTPUTS <= MB_MAX_OUTS && OP_MAX_CTX <= MB_MAX_INTS && OP_MAX_INTS == MB_MAX_INTS &&
               OP_MAX_FLOATS == MB_MAX_FLOATS, "mb_schema.h's COMPUTE limits hold op_kernel's");

static const char *s_alloc(const act_worker *w, act_wtensor *t)
{
    t->storage = act_storage_piece(w, act_wtensor_bytes(t));
    if (!t->storage)
        return act_worker_no_memory(w);
    t->data = t->storage->data;
    return NULL;
}

/* LOAD: the payload frame becomes the storage without a copy when the backend can use host
 * memory as it is, else it is copied to the device. A large piece (weights, mostly: read for every
 * token for as long as they live) must sit in memory advised for huge pages: a thread's frame is
 * the controller's pool buffer, advised already (dt_factory.c), but a frame ZeroMQ received in a
 * worker process is malloc's, which the kernel backs with 4 KiB pages; that one is copied, once,
 * into the pool's memory, where the kernel has huge pages to give (else it is adopted too). */
static const char *s_load(act_worker *w, act_wtensor *t, int64_t frame, mb_message *m)
{
    size_t size = act_wtensor_bytes(t);
    if (frame < 0 || frame >= m->npayloads || zmq_msg_size(&m->payloads[frame]) != size)
        return "malformed record (payload missing or of the wrong size)";
    zmq_msg_t *src = &m->payloads[frame];
    const op_backend *be = w->backend;
    w->stats[MB_STAT_loads]++;
    w->stats[MB_STAT_loaded_bytes] += (int64_t)size;
    bool host = be->adopt_host && be->adopt_host(zmq_msg_data(src), size);
    bool advised = dt_pool_advised(zmq_msg_data(src), size);
    bool copy = size >= DT_POOL_LARGE && !advised && be->alloc == dt_pool_alloc && dt_pool_huge_pages();
    if (host && !copy && (t->storage = act_storage_adopt(src))) {
        t->storage->huge = advised && be->alloc == dt_pool_alloc;
        t->data = t->storage->data;
        return NULL;
    }
    const char *why = NULL;
    if (host && copy) {   /* the pool's memory, never a shared segment's */
        if ((t->storage = act_storage_new(be, size)))
            t->data = t->storage->data;
        else
            why = act_worker_no_memory(w);
    } else {
        why = s_alloc(w, t);
    }
    return why ? why : act_copy_bytes(be->to_device, t->data, zmq_msg_data(src), size);
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

void act_worker_make(act_worker *w, int64_t code, mb_cursor *rec, mb_message *m)
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
        if (out_ids[0] != in0 || k->out[0].ndim != k->in[0].ndim || k->out[0].dtype != k->in[0].dtype ||
            memcmp(k->out[0].shape, k->in[0].shape, (size_t)k->in[0].ndim * sizeof k->in[0].shape[0]) != 0)
            return !dt_err(DT_EPROTO, "malformed compute record: an in-place op's output is not its input 0 (the same "
                           "id, shape and dtype)");
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

bool act_worker_compute(act_worker *w, mb_cursor *rec)
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
