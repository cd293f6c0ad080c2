/* act_future — TensorFuture: a value that devices are producing. One outcome, exactly once:
 * ready (value) or failed (code + message); a wait spins briefly, then sleeps, and can be interrupted. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "act_controller.h"
#include "act_future.h"
#include "act_runtime.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dt_pool.h"
#include "op_backend.h"

#define S_WAIT_SLICE_S 0.05 /* how often a long wait looks at the interrupt hook */

dt_future *act_future_new(act_future_kind kind, int npieces)
{
    dt_future *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    if (npieces > 0 && !(f->pieces = calloc((size_t)npieces, sizeof *f->pieces))) {
        free(f);
        return NULL;
    }
    atomic_init(&f->refs, 1);
    pthread_mutex_init(&f->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&f->cv, &attr);
    pthread_condattr_destroy(&attr);
    f->status = 1;
    f->kind = kind;
    f->npieces = f->remaining = npieces;
    return f;
}

int act_future_alloc_value(dt_future *f)
{
    f->data_size = (size_t)dt_layout_numel(f->ndim, f->shape) * dt_dtype_size(f->dtype);
    f->data = dt_pool_alloc(f->data_size);
    return f->data ? 0 : DT_ENOMEM;
}

dt_future *dt_future_ref(dt_future *f)
{
    atomic_fetch_add(&f->refs, 1);
    return f;
}

void dt_future_release(dt_future **fp)
{
    dt_future *f = *fp;
    *fp = NULL;
    if (!f || atomic_fetch_sub(&f->refs, 1) != 1)
        return;
    for (int i = 0; i < f->npieces; i++)
        free(f->pieces[i].data);
    free(f->pieces);
    dt_pool_free(f->data, f->data_size);
    free(f->error);
    free(f->callbacks);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

/* Moves the status out of pending and runs the callbacks, outside the lock. */
static void s_settle(dt_future *f, int status, const char *message)
{
    pthread_mutex_lock(&f->mu);
    if (f->status != 1) {
        pthread_mutex_unlock(&f->mu);
        return;
    }
    if (message)
        f->error = strdup(message);
    f->status = status;
    int n = f->ncallbacks;
    act_callback *cbs = f->callbacks;
    f->ncallbacks = 0;
    f->callbacks = NULL;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < n; i++)
        cbs[i].fn(f, cbs[i].arg);
    free(cbs);
}

void act_future_fail(dt_future *f, int code, const char *message)
{
    s_settle(f, code < 0 ? code : DT_EKERNEL, message);
}

/* Combines Partial pieces mesh dim by mesh dim, innermost first (the logical value of a
 * Partial on mesh dim i is its reduce op over the values the inner mesh dims hold), then
 * copies each combined piece to its place in the value. Pieces are in the controller's memory:
 * the host backend does the work (it cannot fail on host memory). */
static void s_reduce_partials(dt_future *f)
{
    const op_backend *host = op_backend_host();
    int64_t mesh_size = dt_layout_numel(f->mesh_ndim, f->mesh_shape);
    int *at = malloc((size_t)mesh_size * sizeof *at);
    if (!at) {
        act_future_fail(f, DT_ENOMEM, "fetch: out of memory while combining Partial pieces");
        return;
    }
    for (int64_t i = 0; i < mesh_size; i++)
        at[i] = -1;
    for (int i = 0; i < f->npieces; i++)
        at[f->pieces[i].mesh_index] = i;
    int64_t stride[DT_MAX_DIMS], coord[DT_MAX_DIMS];
    for (int d = f->mesh_ndim - 1, s = 1; d >= 0; s *= (int)f->mesh_shape[d], d--)
        stride[d] = s;
    size_t elem = dt_dtype_size(f->dtype);
    for (int p = f->mesh_ndim - 1; p >= 0; p--) {
        if (f->placements[p].kind != DT_PARTIAL)
            continue;
        for (int i = 0; i < f->npieces; i++) {
            act_piece *acc = &f->pieces[i];
            dt_layout_coord(f->mesh_ndim, f->mesh_shape, acc->mesh_index, coord);
            bool head = coord[p] == 0;
            for (int q = p + 1; q < f->mesh_ndim; q++)
                head = head && (f->placements[q].kind != DT_PARTIAL || coord[q] == 0);
            if (!head)
                continue;
            int64_t n = dt_layout_numel(f->ndim, acc->shape);
            for (int64_t j = 1; j < f->mesh_shape[p]; j++)
                host->combine(acc->data, acc->data, f->pieces[at[acc->mesh_index + j * stride[p]]].data, f->dtype, n,
                              f->placements[p].reduce_op);
            if (f->placements[p].reduce_op == DT_REDUCE_AVG)
                host->scale_div(acc->data, f->dtype, n, f->mesh_shape[p]);
        }
    }
    int64_t dst_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS];
    dt_layout_strides(f->ndim, f->shape, elem, dst_strides);
    for (int i = 0; i < f->npieces; i++) {
        act_piece *pc = &f->pieces[i];
        dt_layout_coord(f->mesh_ndim, f->mesh_shape, pc->mesh_index, coord);
        bool head = true;
        for (int q = 0; q < f->mesh_ndim; q++)
            head = head && (f->placements[q].kind != DT_PARTIAL || coord[q] == 0);
        if (!head)
            continue;
        char *dst = f->data;
        for (int d = 0; d < f->ndim; d++)
            dst += pc->offset[d] * dst_strides[d];
        dt_layout_strides(f->ndim, pc->shape, elem, src_strides);
        host->copy_region(dst, dst_strides, pc->data, src_strides, f->ndim, pc->shape, elem);
    }
    free(at);
    s_settle(f, 0, NULL);
}

int act_future_add_piece(dt_future *f, int piece, dt_dtype dtype, int ndim, const int64_t *shape,
                         const void *data, size_t size)
{
    if (f->status != 1)
        return 0;
    char why[160];
    if (piece < 0 || piece >= f->npieces || f->pieces[piece].arrived) {
        snprintf(why, sizeof why, "fetch: unexpected piece %d of future %llu", piece, (unsigned long long)f->id);
        goto bad;
    }
    act_piece *pc = &f->pieces[piece];
    if (f->kind == ACT_SYNC) {
        pc->arrived = true;
        if (--f->remaining == 0)
            s_settle(f, 0, NULL);
        return 0;
    }
    size_t elem = dt_dtype_size(f->dtype);
    bool same = dtype == f->dtype && ndim == f->ndim;
    for (int d = 0; same && d < ndim; d++)
        same = shape[d] == pc->shape[d];
    if (!same || size != (size_t)dt_layout_numel(ndim, shape) * elem) {
        snprintf(why, sizeof why, "fetch: device %lld sent a piece of the wrong dtype or shape",
                 (long long)pc->device);
        goto bad;
    }
    pc->arrived = true;
    if (f->kind == ACT_FETCH_LOCALS || f->has_partial) {
        if (!(pc->data = malloc(size ? size : 1)))
            goto nomem;
        memcpy(pc->data, data, size);
    } else {
        /* straight into its place in the value: a host-to-host region copy */
        int64_t dst_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS];
        dt_layout_strides(f->ndim, f->shape, elem, dst_strides);
        dt_layout_strides(ndim, shape, elem, src_strides);
        char *dst = f->data;
        for (int d = 0; d < ndim; d++)
            dst += pc->offset[d] * dst_strides[d];
        op_backend_host()->copy_region(dst, dst_strides, data, src_strides, ndim, shape, elem);
    }
    if (--f->remaining == 0) {
        if (f->kind == ACT_FETCH_FULL && f->has_partial)
            s_reduce_partials(f);
        else
            s_settle(f, 0, NULL);
    }
    return 0;
bad:
    act_future_fail(f, DT_EPROTO, why);
    return DT_EPROTO;
nomem:
    act_future_fail(f, DT_ENOMEM, "fetch: out of memory");
    return DT_ENOMEM;
}

bool dt_future_done(const dt_future *f)
{
    dt_future *m = (dt_future *)f;
    pthread_mutex_lock(&m->mu);
    bool done = m->status != 1;
    pthread_mutex_unlock(&m->mu);
    return done;
}

int dt_future_status(const dt_future *f)
{
    dt_future *m = (dt_future *)f;
    pthread_mutex_lock(&m->mu);
    int status = m->status;
    pthread_mutex_unlock(&m->mu);
    return status;
}

const char *dt_future_error(const dt_future *f) { return dt_future_status(f) < 0 ? f->error : NULL; }

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int dt_future_wait(dt_future *f, double timeout_s)
{
    double deadline = timeout_s < 0 ? INFINITY : s_now() + timeout_s;
    int status = dt_future_status(f);
    /* a short wait spins before it sleeps: the value of a small op is usually back within tens of
     * microseconds, less than a wake-up costs. Each look does the controller's step itself when
     * the controller thread is between steps (ships the records, takes in the answers), then
     * yields the core to any thread that has work. */
    for (double spin_until = s_now() + act_spin_s(); status == 1 && s_now() < fmin(spin_until, deadline);) {
        act_controller_help();
        sched_yield();
        status = dt_future_status(f);
    }
    if (status == 1) {
        act_wait_enter();
        pthread_mutex_lock(&f->mu);
        while (f->status == 1) {
            double now = s_now(), until = fmin(deadline, now + S_WAIT_SLICE_S);
            if (now >= deadline)
                break;
            struct timespec ts = {(time_t)until, (long)((until - floor(until)) * 1e9)};
            int rc = pthread_cond_timedwait(&f->cv, &f->mu, &ts);
            if (rc == ETIMEDOUT && f->status == 1) {
                pthread_mutex_unlock(&f->mu);
                bool interrupted = act_wait_interrupted();
                pthread_mutex_lock(&f->mu);
                if (interrupted && f->status == 1) {
                    pthread_mutex_unlock(&f->mu);
                    act_wait_leave();
                    return dt_err(DT_EINTR, "wait interrupted");
                }
            }
        }
        status = f->status;
        pthread_mutex_unlock(&f->mu);
        act_wait_leave();
    }
    if (status == 1)
        return dt_err(DT_ETIMEDOUT, "result(): timed out after %g s; the value is still coming", timeout_s);
    if (status < 0)
        return dt_err(status, "%s", f->error ? f->error : "failed");
    return 0;
}

int dt_future_npieces(const dt_future *f) { return f->kind == ACT_FETCH_LOCALS ? f->npieces : 1; }
dt_dtype dt_future_dtype(const dt_future *f) { return f->dtype; }
int dt_future_ndim(const dt_future *f) { return f->ndim; }

const int64_t *dt_future_shape(const dt_future *f, int piece)
{
    if (f->kind == ACT_FETCH_LOCALS)
        return piece >= 0 && piece < f->npieces ? f->pieces[piece].shape : NULL;
    return f->shape;
}

const void *dt_future_data(const dt_future *f, int piece)
{
    if (dt_future_status(f) != 0)
        return NULL;
    if (f->kind == ACT_FETCH_LOCALS)
        return piece >= 0 && piece < f->npieces ? f->pieces[piece].data : NULL;
    return f->data;
}

void dt_future_on_done(dt_future *f, void (*cb)(dt_future *f, void *arg), void *arg)
{
    pthread_mutex_lock(&f->mu);
    if (f->status == 1) {
        act_callback *grown = realloc(f->callbacks, (size_t)(f->ncallbacks + 1) * sizeof *grown);
        if (grown) {
            f->callbacks = grown;
            f->callbacks[f->ncallbacks++] = (act_callback){cb, arg};
            pthread_mutex_unlock(&f->mu);
            return;
        }
    }
    pthread_mutex_unlock(&f->mu);
    cb(f, arg);
}
