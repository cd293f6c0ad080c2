/* act_runtime_devices — the devices the runtime serves, as its table has them: an entry made for
 * each device a mesh names (or a worker that comes to a listening controller says), its worker
 * started in its home (act_spawn.c) or waited for, what the user can ask of it, and its death
 * noted for whoever watches failures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "act_runtime.h"
#include "act_spawn.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_backend.h"

int act_runtime_devices_table(void)
{
    act_runtime *rt = &act_rt;
    if (rt->devices)
        return 0;
    rt->devices = calloc(DT_MAX_DEVICE_ID + 1, sizeof *rt->devices);
    rt->dirty = calloc(DT_MAX_DEVICE_ID + 1, sizeof *rt->dirty);
    if (!rt->devices || !rt->dirty) {
        free(rt->devices);
        free(rt->dirty);
        rt->devices = rt->dirty = NULL;
        return dt_err(DT_ENOMEM, "out of memory");
    }
    return 0;
}

/* A new device entry, not yet published (s_device_publish); its worker is not started. */
static act_device *s_device_alloc(act_runtime *rt, int64_t id, const char *device_type)
{
    act_device *dev = calloc(1, sizeof *dev);
    if (!dev) {
        dt_err(DT_ENOMEM, "out of memory");
        return NULL;
    }
    dev->id = id;
    snprintf(dev->device_type, sizeof dev->device_type, "%s", device_type);
    dev->state = ACT_DEV_STARTING;
    dev->started_at = act_now();
    dev->remote = rt->listening;
    dev->last_op = -1;
    dev->lifeline = -1;
    atomic_init(&dev->stop, false);
    return dev;
}

/* Makes dev the entry of its id (the lock held), before its worker says hello: the controller
 * finds a worker's device by the id it says. */
static void s_device_publish(act_device *dev)
{
    act_runtime *rt = &act_rt;
    __atomic_store_n(&rt->devices[dev->id], dev, __ATOMIC_RELEASE);
    if (dev->id >= rt->ndevices)
        __atomic_store_n(&rt->ndevices, dev->id + 1, __ATOMIC_RELEASE);
}

static act_device *s_device_new(act_runtime *rt, int64_t id, const char *device_type)
{
    act_device *dev = s_device_alloc(rt, id, device_type);
    if (dev)
        s_device_publish(dev);
    return dev;
}

act_device *act_runtime_adopt(int64_t id, const char *device_type)
{
    act_runtime *rt = &act_rt;
    if (id < 0 || id > DT_MAX_DEVICE_ID || !rt->devices)
        return NULL;
    pthread_mutex_lock(&rt->lock);
    act_device *dev = rt->devices[id] ? rt->devices[id] : s_device_new(rt, id, device_type);
    pthread_mutex_unlock(&rt->lock);
    return dev;
}

static int s_ensure_device(act_runtime *rt, const char *op, int64_t id, const char *device_type)
{
    if (act_runtime_devices_table() != 0)
        return dt_last_error_code();
    act_device *dev = rt->devices[id];
    if (dev && !dev->device_type[0] && dev->state == ACT_DEV_STARTING) {
        if (op_backend_check(op, device_type) != 0)
            return dt_last_error_code();
        snprintf(dev->device_type, sizeof dev->device_type, "%s", device_type); /* waited for, untyped */
    }
    if (dev) {
        if (strcmp(dev->device_type, device_type) != 0)
            return dt_err(DT_EINVAL, "%s: device %lld is a '%s' device (an earlier mesh made it so) but this mesh says '%s'; "
                          "use other device ids for it", op, (long long)id, dev->device_type, device_type);
        return 0;
    }
    /* a worker picks its backend by device type: the caller hears of one it lacks, not the worker */
    if (op_backend_check(op, device_type) != 0)
        return dt_last_error_code();
    if (rt->listening) /* its worker comes from elsewhere: act_runtime_begin waits for it */
        return s_device_new(rt, id, device_type) ? 0 : dt_last_error_code();
    if (rt->workers == DT_WORKERS_THREAD) {
        /* one that cannot start (no socket to be had) is never published: the next op that names
         * the device starts it afresh */
        if (!(dev = s_device_alloc(rt, id, device_type)))
            return dt_last_error_code();
        int rc = act_spawn_thread(dev, rt->endpoint, dev->device_type, s_device_publish);
        if (rc != 0) {
            free(dev);
            char why[DT_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", dt_last_error());
            return dt_err(rc, "%s: %s", op, why);
        }
        return 0;
    }
    if (!(dev = s_device_new(rt, id, device_type)))
        return dt_last_error_code();
    int rc = act_spawn_process(dev, rt->endpoint, dev->device_type, rt->worker_path, rt->token);
    if (rc != 0) {
        /* kept, dead, until shutdown: the controller may already hold a pointer to it */
        dev->state = ACT_DEV_DEAD;
        rt->deaths++;
        snprintf(dev->reason, sizeof dev->reason, "its worker could not start: %s", dt_last_error());
    }
    return rc;
}

/* Listening, the lock held: waits (the lock let go meanwhile) until dev's worker has said hello or
 * died, for up to timeout_s (< 0: forever). */
static int s_await_worker(act_runtime *rt, const char *op, act_device *dev, double timeout_s)
{
    double until = act_now() + timeout_s;
    uint64_t epoch = rt->epoch;
    pthread_mutex_unlock(&rt->lock);
    act_wait_enter();
    pthread_mutex_lock(&rt->lock);
    int rc = 0;
    while (rc == 0 && dev->state == ACT_DEV_STARTING) {
        if (!rt->running || rt->stopping || rt->epoch != epoch) {
            rc = dt_err(DT_ESHUTDOWN, "%s: the runtime was shut down while waiting for device %lld's worker", op,
                        (long long)dev->id);
            break;
        }
        if (timeout_s >= 0 && act_now() >= until) {
            rc = dt_err(DT_ETIMEDOUT, "%s: no worker has connected for device %lld in %.0f s; start one where it "
                        "should run: dtorch-worker --connect %s --devices %s:%lld --key ... --server-key ...", op,
                        (long long)dev->id, timeout_s, rt->bound, dev->device_type, (long long)dev->id);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        if (pthread_cond_timedwait(&rt->cond, &rt->lock, &ts) != 0) {
            pthread_mutex_unlock(&rt->lock);
            bool interrupted = act_wait_interrupted();
            pthread_mutex_lock(&rt->lock);
            if (interrupted)
                rc = dt_err(DT_EINTR, "%s: interrupted while waiting for device %lld's worker", op, (long long)dev->id);
        }
    }
    pthread_mutex_unlock(&rt->lock);
    act_wait_leave();
    pthread_mutex_lock(&rt->lock);
    return rc;
}

int act_runtime_devices_ready(const char *op, dt_mesh *const *meshes, int nmeshes)
{
    act_runtime *rt = &act_rt;
    for (int m = 0; m < nmeshes; m++) {
        dt_mesh *mesh = meshes[m];
        if (mesh->ready_epoch == rt->epoch && mesh->ready_deaths == rt->deaths)
            continue; /* every device was started and alive at its last op, and none has died since */
        for (int64_t i = 0; i < mesh->size; i++) {
            if (s_ensure_device(rt, op, mesh->ids[i], mesh->device_type) != 0)
                return dt_last_error_code();
            act_device *dev = rt->devices[mesh->ids[i]];
            if (dev->state == ACT_DEV_STARTING && rt->listening && s_await_worker(rt, op, dev, rt->connect_s) != 0)
                return dt_last_error_code();
            if (dev->state == ACT_DEV_DEAD)
                return dt_err(DT_EDEVICE, "%s: device %lld is dead: %s", op, (long long)dev->id, dev->reason);
        }
        mesh->ready_epoch = rt->epoch;
        mesh->ready_deaths = rt->deaths;
    }
    return 0;
}

int dt_wait_workers(const int64_t *ids, int n, double timeout_s)
{
    act_runtime *rt = &act_rt;
    if (n < 0 || (n > 0 && !ids))
        return dt_err(DT_EINVAL, "wait_for_workers: expected device ids");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] > DT_MAX_DEVICE_ID)
            return dt_err(DT_EINVAL, "wait_for_workers: device id %lld is out of range [0, %d]", (long long)ids[i],
                          DT_MAX_DEVICE_ID);
    pthread_mutex_lock(&rt->lock);
    int rc = 0;
    if (!rt->running || !rt->listening) {
        pthread_mutex_unlock(&rt->lock);
        return 0;
    }
    double until = act_now() + timeout_s;
    for (int i = 0; i < n && rc == 0; i++) {
        act_device *dev = rt->devices[ids[i]];
        if (!dev && !(dev = s_device_new(rt, ids[i], "")))
            rc = dt_last_error_code();
        double left = timeout_s < 0 ? -1 : fmax(0, until - act_now());   /* what is left of the timeout */
        if (rc == 0 && dev->state == ACT_DEV_STARTING)
            rc = s_await_worker(rt, "wait_for_workers", dev, left);
        if (rc == 0 && dev->state == ACT_DEV_DEAD)
            rc = dt_err(DT_EDEVICE, "wait_for_workers: device %lld is dead: %s", (long long)dev->id, dev->reason);
    }
    pthread_mutex_unlock(&rt->lock);
    return rc;
}

int dt_worker_info_get(int64_t id, dt_worker_info *out)
{
    act_runtime *rt = &act_rt;
    memset(out, 0, sizeof *out);
    if (id < 0 || id > DT_MAX_DEVICE_ID)
        return dt_err(DT_EINVAL, "device id %lld is out of range [0, %d]", (long long)id, DT_MAX_DEVICE_ID);
    pthread_mutex_lock(&rt->lock);
    act_device *dev = rt->devices ? rt->devices[id] : NULL;
    if (dev) {
        out->state = dev->state == ACT_DEV_READY ? 1 : dev->state == ACT_DEV_DEAD ? 2 : 0;
        out->remote = dev->remote;
        snprintf(out->host, sizeof out->host, "%s", dev->host);
        out->pid = dev->remote ? dev->remote_pid : dev->pid;
        snprintf(out->peer, sizeof out->peer, "%s", dev->peer);
        if (dev->state == ACT_DEV_DEAD)
            snprintf(out->reason, sizeof out->reason, "%s", dev->reason);
    }
    pthread_mutex_unlock(&rt->lock);
    return dev ? 0 : dt_err(DT_EINVAL, "device %lld has no worker in this runtime", (long long)id);
}

int dt_device_type(int64_t id, char *out, size_t size)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    act_device *dev = rt->running && rt->devices && id >= 0 && id < rt->ndevices ? rt->devices[id] : NULL;
    bool known = dev && dev->device_type[0];
    if (known)
        snprintf(out, size, "%s", dev->device_type);
    pthread_mutex_unlock(&rt->lock);
    return known ? 0 : dt_err(DT_EINVAL, "device %lld: no mesh has named it yet", (long long)id);
}

int dt_started_devices(int64_t *ids, int max)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    int n = 0;
    for (int64_t i = 0; rt->running && rt->devices && i < rt->ndevices; i++)
        if (rt->devices[i] && rt->devices[i]->state != ACT_DEV_DEAD) {
            if (n < max)
                ids[n] = i;
            n++;
        }
    pthread_mutex_unlock(&rt->lock);
    return n;
}

/* ---- device failures, for whoever watches them (dtorch's DeviceMesh.on_failure) -------------- */

#define S_FAILURES 256   /* failures remembered; a watcher further behind skips the oldest */

static struct {
    int64_t device;
    char reason[256];
} s_failures[S_FAILURES];
static uint64_t s_nfailures;   /* failures so far in this process: number k is s_failures[(k-1) % S_FAILURES] */
static pthread_cond_t s_failure_cond = PTHREAD_COND_INITIALIZER;

void act_runtime_note_failure(int64_t device, const char *reason)
{
    uint64_t k = ++s_nfailures;
    s_failures[(k - 1) % S_FAILURES].device = device;
    snprintf(s_failures[(k - 1) % S_FAILURES].reason, sizeof s_failures[0].reason, "%s", reason);
    pthread_cond_broadcast(&s_failure_cond);
}

uint64_t dt_device_failures(void)
{
    pthread_mutex_lock(&act_rt.lock);
    uint64_t n = s_nfailures;
    pthread_mutex_unlock(&act_rt.lock);
    return n;
}

uint64_t dt_next_device_failure(uint64_t after, double timeout_s, int64_t *device, char *reason, size_t size)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (s_nfailures <= after && timeout_s > 0) {
        double until = act_now() + timeout_s;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double wall = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
        ts.tv_sec = (time_t)wall;
        ts.tv_nsec = (long)((wall - (double)ts.tv_sec) * 1e9);
        pthread_mutex_unlock(&rt->lock);
        act_wait_enter();
        pthread_mutex_lock(&rt->lock);
        while (s_nfailures <= after && act_now() < until)
            if (pthread_cond_timedwait(&s_failure_cond, &rt->lock, &ts) != 0)
                break;
        pthread_mutex_unlock(&rt->lock);
        act_wait_leave();
        pthread_mutex_lock(&rt->lock);
    }
    uint64_t k = 0;
    if (s_nfailures > after) {
        uint64_t oldest = s_nfailures > S_FAILURES ? s_nfailures - S_FAILURES + 1 : 1;
        k = after + 1 > oldest ? after + 1 : oldest;
        *device = s_failures[(k - 1) % S_FAILURES].device;
        snprintf(reason, size, "%s", s_failures[(k - 1) % S_FAILURES].reason);
    }
    pthread_mutex_unlock(&rt->lock);
    return k;
}
