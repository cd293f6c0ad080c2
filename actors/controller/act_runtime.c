/* act_runtime — starting and stopping the runtime, and the user thread's side of it: packing
 * op records into per-device outboxes and ringing the controller's doorbell. */
#include "act_capture.h"
#include "act_controller.h"
#include "act_runtime.h"
#include "act_spawn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "act_future.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "mb_curve.h"
#include "mb_schema.h"
#include "op_backend.h"

act_runtime act_rt = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
    .doorbell = -1,
    .next_tensor_id = 1,
    .next_future_id = 1,
    .next_transfer_id = 1,
    .workers = DT_WORKERS_THREAD,
};

static void (*s_wait_enter)(void);
static void (*s_wait_leave)(void);
static bool (*s_wait_interrupt)(void);
static bool s_configured;     /* dt_init chose the worker mode explicitly */
static bool s_urgent;         /* this op is waited for: ring now */
static bool s_over_limit;     /* this op filled a device's queue past ACT_QUEUE_LIMIT */

void dt_set_wait_hooks(void (*enter)(void), void (*leave)(void), bool (*interrupt)(void))
{
    s_wait_enter = enter;
    s_wait_leave = leave;
    s_wait_interrupt = interrupt;
}

void act_wait_enter(void)
{
    if (s_wait_enter)
        s_wait_enter();
}

void act_wait_leave(void)
{
    if (s_wait_leave)
        s_wait_leave();
}

bool act_wait_interrupted(void)
{
    if (!s_wait_interrupt)
        return false;
    act_wait_leave();
    bool interrupted = s_wait_interrupt();
    act_wait_enter();
    return interrupted;
}

static int s_workers_from_env(dt_workers *out)
{
    const char *env = getenv("DTORCH_WORKERS");
    if (!env || !*env || strcmp(env, "thread") == 0)
        *out = DT_WORKERS_THREAD;
    else if (strcmp(env, "process") == 0)
        *out = DT_WORKERS_PROCESS;
    else
        return dt_err(DT_EINVAL, "DTORCH_WORKERS='%s': expected 'thread' or 'process'", env);
    return 0;
}

static char s_dir[64];   /* the run's private directory for ipc sockets ("" until made) */

static void s_remove_run_dir(void)
{
    if (!s_dir[0])
        return;
    DIR *d = opendir(s_dir);
    struct dirent *e;
    char path[sizeof s_dir + 300];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", s_dir, e->d_name);
            unlink(path);   /* socket files a killed worker could not remove */
        }
    if (d)
        closedir(d);
    rmdir(s_dir);
    s_dir[0] = 0;
}

/* The start time of process pid (clock ticks after boot, /proc/<pid>/stat), which tells it from a
 * later process given the same pid; 0 when there is no such process. */
static unsigned long long s_start_time(pid_t pid)
{
    char path[64], stat[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    size_t n = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
    if (f)
        fclose(f);
    stat[n] = 0;
    const char *at = strrchr(stat, ')'); /* "pid (name) S ...": the name may hold anything */
    unsigned long long start = 0;
    for (int field = 2; at && field < 22; field++)
        at = strchr(at + 1, ' ');
    if (at)
        sscanf(at + 1, "%llu", &start);
    return start;
}

/* Whether the process that made the run directory dir (an open descriptor) has ended, as its owner
 * file says ("<pid> <start time>"). A directory without one, or with one that is no file of this
 * user, is not known to be stale. */
static bool s_owner_gone(int dir)
{
    int fd = openat(dir, "owner", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    char text[64] = ""; /* zeroed: read leaves it terminated */
    ssize_t n = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid()
                    ? read(fd, text, sizeof text - 1) : -1;
    if (fd >= 0)
        close(fd);
    int pid;
    unsigned long long start;
    if (n <= 0 || sscanf(text, "%d %llu", &pid, &start) != 2 || pid <= 0)
        return false;
    return pid != (int)getpid() && s_start_time(pid) != start;
}

/* Removes the run directories that processes of this user left when they ended without removing
 * theirs (killed, or stopped by a signal before their exit handlers ran): under tmp, a directory
 * named as mkdtemp makes them, not a link, this user's, mode 0700, whose owner file names a process
 * that has ended. Only the files inside are removed (the sockets and the owner file), then the
 * directory; anything else found there (a directory) leaves it in place. */
static void s_remove_stale_run_dirs(const char *tmp)
{
    DIR *d = opendir(tmp);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "dtorch-", 7) != 0 || strlen(e->d_name) != 13)
            continue;
        int dir = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (dir < 0)
            continue;
        if (fstat(dir, &st) == 0 && st.st_uid == getuid() && (st.st_mode & 07777) == 0700 && s_owner_gone(dir)) {
            int listing = dup(dir);
            DIR *inside = listing >= 0 ? fdopendir(listing) : NULL;
            struct dirent *f;
            while (inside && (f = readdir(inside)))
                if (strcmp(f->d_name, ".") && strcmp(f->d_name, ".."))
                    unlinkat(dir, f->d_name, 0);
            if (inside)
                closedir(inside);
            else if (listing >= 0)
                close(listing);
            unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
        }
        close(dir);
    }
    if (d)
        closedir(d);
}

/* Makes the run's ipc directory (mode 0700, a random name under $TMPDIR or /tmp) once, with an
 * owner file naming this process, by which a later run tells a directory left behind; first, such
 * directories of ended processes are removed. */
static int s_run_dir(void)
{
    if (s_dir[0])
        return 0;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 24)
        tmp = "/tmp";   /* socket paths must stay short (sun_path) */
    s_remove_stale_run_dirs(tmp);
    snprintf(s_dir, sizeof s_dir, "%s/dtorch-XXXXXX", tmp);
    if (!mkdtemp(s_dir)) {
        s_dir[0] = 0;
        return dt_err(DT_ESYS, "dtorch: cannot make a private directory for the workers' sockets in %s", tmp);
    }
    char path[sizeof s_dir + 16], owner[64];
    snprintf(path, sizeof path, "%s/owner", s_dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int n = snprintf(owner, sizeof owner, "%d %llu\n", (int)getpid(), s_start_time(getpid()));
    if (fd >= 0) {
        if (write(fd, owner, (size_t)n) != n) { /* without it the directory is only never taken for stale */ }
        close(fd);
    }
    static bool registered;
    if (!registered)
        registered = atexit(s_remove_run_dir) == 0;
    return 0;
}

/* The table of devices, made once: fixed for the life of the process, the controller reads it
 * without the lock. */
static int s_devices_table(void)
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

/* The last error again, after prefix (its text copied first: it is where the new one goes). */
static int s_rethrow(int code, const char *prefix)
{
    char why[DT_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", dt_last_error());
    return dt_err(code, "%s%s", prefix, why);
}

/* Listening (dt_config.listen): checks the endpoint and takes the keys, before anything starts. */
static int s_listen_config(const dt_config *config)
{
    act_runtime *rt = &act_rt;
    mb_tcp_addr addr;
    if (mb_tcp_parse(config->listen, true, &addr) != 0)
        return s_rethrow(DT_EINVAL, "init: listen=");
    rt->insecure = config->insecure;
    memset(&rt->keys, 0, sizeof rt->keys);
    rt->worker_key[0] = 0;
    if (!config->insecure) {
        if (!config->worker_key)
            return dt_err(DT_EINVAL, "init: listening on tcp needs worker_key=, the workers' public key (their key "
                          "pair comes from dtorch-worker --keygen FILE), or insecure=True for plaintext without "
                          "authentication");
        mb_keypair workers;
        if (mb_keys_load(config->worker_key, false, &workers) != 0)
            return s_rethrow(DT_EINVAL, "init: worker_key: ");
        snprintf(rt->worker_key, sizeof rt->worker_key, "%s", workers.public_key);
        int rc = config->key ? mb_keys_load(config->key, true, &rt->keys) : mb_keys_generate(&rt->keys);
        if (rc != 0)
            return s_rethrow(rc, "init: key: ");
    }
    snprintf(rt->endpoint, sizeof rt->endpoint, "%s", config->listen);
    rt->listening = true;
    return 0;
}

/* Starts the controller thread; called with the lock held. */
static int s_start(void)
{
    act_runtime *rt = &act_rt;
    rt->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (rt->doorbell < 0)
        return dt_err(DT_ESYS, "dtorch: cannot create the controller's doorbell");
    rt->epoch++;
    if (rt->listening) {
        /* dt_init checked the endpoint and keys; workers come from wherever they were started */
    } else if (rt->workers == DT_WORKERS_THREAD) {
        snprintf(rt->endpoint, sizeof rt->endpoint, "inproc://dtorch-controller-%llu", (unsigned long long)rt->epoch);
    } else {
        /* the sockets of worker processes live in a directory of this run that only its user can
         * enter, under a name nobody can guess: another local user cannot even connect */
        if (s_run_dir() != 0) {
            close(rt->doorbell);
            rt->doorbell = -1;
            return dt_last_error_code();
        }
        snprintf(rt->endpoint, sizeof rt->endpoint, "ipc://%s/control-%llu", s_dir, (unsigned long long)rt->epoch);
    }
    /* the run's secret, which only the worker processes it starts are told (mb_rid.h) */
    rt->token[0] = 0;
    if (!rt->listening && rt->workers == DT_WORKERS_PROCESS && mb_token_new(rt->token) != 0) {
        close(rt->doorbell);
        rt->doorbell = -1;
        return dt_last_error_code();
    }
    rt->refused = 0;
    dt_idmap_init(&rt->futures);
    const char *silent = getenv("DTORCH_SILENT_TIMEOUT");
    rt->silent_s = silent && atof(silent) > 0 ? atof(silent) : ACT_SILENT_S;
    const char *stuck = getenv("DTORCH_STUCK_TIMEOUT");
    rt->stuck_s = stuck && atof(stuck) > 0 ? atof(stuck) : ACT_STUCK_S;
    const char *connect = getenv("DTORCH_CONNECT_TIMEOUT");
    rt->connect_s = connect && atof(connect) > 0 ? atof(connect) : ACT_CONNECT_S;
    if (s_devices_table() != 0) {
        close(rt->doorbell);
        rt->doorbell = -1;
        return dt_last_error_code();
    }
    rt->start_error = 0;
    rt->controller_up = false;
    rt->stopping = false;
    rt->rung = false;
    if (pthread_create(&rt->controller, NULL, act_controller_main, rt) != 0) {
        close(rt->doorbell);
        rt->doorbell = -1;
        return dt_err(DT_ESYS, "dtorch: cannot start the controller thread");
    }
    while (!rt->controller_up && !rt->start_error)
        pthread_cond_wait(&rt->cond, &rt->lock);
    if (rt->start_error) {
        int code = rt->start_error;
        pthread_mutex_unlock(&rt->lock);
        pthread_join(rt->controller, NULL);
        pthread_mutex_lock(&rt->lock);
        close(rt->doorbell);
        rt->doorbell = -1;
        dt_idmap_destroy(&rt->futures);
        return dt_err(code, "dtorch: the controller could not bind %s", rt->endpoint);
    }
    rt->running = true;
    return 0;
}

int dt_init(const dt_config *config)
{
    act_runtime *rt = &act_rt;
    dt_workers workers;
    if (config) {
        if (config->workers != DT_WORKERS_THREAD && config->workers != DT_WORKERS_PROCESS)
            return dt_err(DT_EINVAL, "init: unknown worker mode %d", (int)config->workers);
        workers = config->workers;
    } else if (s_workers_from_env(&workers) != 0) {
        return dt_last_error_code();
    }
    pthread_mutex_lock(&rt->lock);
    int rc = 0;
    if (rt->running) {
        if (config && (config->listen != NULL) != rt->listening)
            rc = dt_err(DT_EINVAL, "init: the runtime is already running %s; call shutdown() first",
                        rt->listening ? "and listening for workers" : "with workers of its own");
        else if (config && workers != rt->workers)
            rc = dt_err(DT_EINVAL, "init: the runtime is already running with %s workers; call shutdown() first",
                        rt->workers == DT_WORKERS_THREAD ? "thread" : "process");
        pthread_mutex_unlock(&rt->lock);
        return rc;
    }
    rt->workers = workers;
    rt->listening = false;
    if (config && config->listen && (rc = s_listen_config(config)) != 0) {
        pthread_mutex_unlock(&rt->lock);
        return rc;
    }
    s_configured = config != NULL;
    const char *path = config && config->worker_path ? config->worker_path : getenv("DTORCH_WORKER_PATH");
    snprintf(rt->worker_path, sizeof rt->worker_path, "%s", path && *path ? path : "dtorch-worker");
    rc = s_start();
    pthread_mutex_unlock(&rt->lock);
    return rc;
}

int dt_shutdown(void)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (!rt->running) {
        pthread_mutex_unlock(&rt->lock);
        return 0;
    }
    if (rt->stopping) {
        /* another thread is stopping it: wait for that, never join the controller twice */
        uint64_t epoch = rt->epoch;
        pthread_mutex_unlock(&rt->lock);
        act_wait_enter();
        pthread_mutex_lock(&rt->lock);
        while (rt->running && rt->epoch == epoch)
            pthread_cond_wait(&rt->cond, &rt->lock);
        pthread_mutex_unlock(&rt->lock);
        act_wait_leave();
        return 0;
    }
    __atomic_store_n(&rt->stopping, true, __ATOMIC_RELEASE);
    act_capture_reset();
    uint64_t one = 1;
    if (write(rt->doorbell, &one, sizeof one) < 0) { /* the controller also wakes on its tick */ }
    pthread_mutex_unlock(&rt->lock);

    act_wait_enter();
    pthread_join(rt->controller, NULL);
    act_wait_leave();

    pthread_mutex_lock(&rt->lock);
    close(rt->doorbell);
    rt->doorbell = -1;
    if (rt->workers == DT_WORKERS_PROCESS)
        s_remove_run_dir();   /* every worker is gone: their sockets go too */
    rt->running = false;
    rt->stopping = false;
    rt->listening = false;
    s_configured = false;
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->lock);
    return 0;
}

bool dt_is_running(void)
{
    pthread_mutex_lock(&act_rt.lock);
    bool running = act_rt.running;
    pthread_mutex_unlock(&act_rt.lock);
    return running;
}

dt_workers dt_current_workers(void)
{
    pthread_mutex_lock(&act_rt.lock);
    dt_workers w = act_rt.workers;
    if (!act_rt.running && !s_configured)
        s_workers_from_env(&w);
    pthread_mutex_unlock(&act_rt.lock);
    return w;
}

void dt_manual_seed(uint64_t seed)
{
    pthread_mutex_lock(&act_rt.lock);
    act_rt.seed = seed;
    act_rt.stream = 0;
    pthread_mutex_unlock(&act_rt.lock);
}

void act_runtime_next_stream(uint64_t *seed, uint64_t *stream)
{
    *seed = act_rt.seed;
    *stream = act_rt.stream++;
}

uint64_t act_runtime_new_tensor_id(void) { return act_rt.next_tensor_id++; }

uint64_t act_runtime_new_future_id(void) { return act_rt.next_future_id++; }

uint64_t act_runtime_new_transfer_id(void) { return act_rt.next_transfer_id++; }

uint64_t act_runtime_epoch(void) { return act_capture_active() ? act_capture_epoch() : act_rt.epoch; }

bool act_runtime_epoch_live(uint64_t epoch)
{
    /* no lock on this per-op path: only the user's thread starts and stops the runtime (and
     * captures), and ops queued against a runtime that is stopping are dropped by it anyway */
    if (!__atomic_load_n(&act_rt.running, __ATOMIC_ACQUIRE) || __atomic_load_n(&act_rt.stopping, __ATOMIC_ACQUIRE))
        return false;
    return epoch == __atomic_load_n(&act_rt.epoch, __ATOMIC_ACQUIRE) ||
           (act_capture_made(epoch) && epoch == act_capture_epoch());
}

int act_runtime_check_live(const char *op, uint64_t epoch)
{
    if (act_runtime_epoch_live(epoch))
        return 0;
    if (act_capture_made(epoch) && (epoch & 0xffffffffu) == __atomic_load_n(&act_rt.epoch, __ATOMIC_ACQUIRE))
        return dt_err(DT_EUNSUPPORTED, "%s: this tensor was made inside dtorch.capture() and never held a value; use "
                      "the tensors a replay returns", op);
    return dt_err(DT_ESHUTDOWN, "%s: this tensor was made before dtorch.shutdown() and no longer exists", op);
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
    if (s_devices_table() != 0)
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

int dt_listen_info(char *endpoint, size_t endpoint_size, char *public_key, size_t key_size)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    int rc = rt->running && rt->listening ? 0 : dt_err(DT_EINVAL, "the runtime is not listening for workers: "
                                                       "dtorch.init(listen=\"tcp://ADDR:PORT\", ...) first");
    if (rc == 0) {
        snprintf(endpoint, endpoint_size, "%s", rt->bound);
        snprintf(public_key, key_size, "%s", rt->insecure ? "" : rt->keys.public_key);
    }
    pthread_mutex_unlock(&rt->lock);
    return rc;
}

uint64_t act_runtime_submitted(void)
{
    pthread_mutex_lock(&act_rt.lock);
    uint64_t n = act_rt.submitted;
    pthread_mutex_unlock(&act_rt.lock);
    return n;
}

int act_runtime_begin(const char *op, dt_mesh *const *meshes, int nmeshes)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (!rt->running) {
        dt_workers workers = rt->workers;
        if (!s_configured && s_workers_from_env(&workers) != 0)
            goto fail;
        if (!s_configured)
            rt->workers = workers;
        if (!rt->worker_path[0]) {
            const char *path = getenv("DTORCH_WORKER_PATH");
            snprintf(rt->worker_path, sizeof rt->worker_path, "%s", path && *path ? path : "dtorch-worker");
        }
        if (s_start() != 0)
            goto fail;
    }
    if (rt->stopping) {
        dt_err(DT_ESHUTDOWN, "%s: the runtime is shutting down", op);
        goto fail;
    }
    if (act_capture_active() && !act_capture_thread()) {
        dt_err(DT_EUNSUPPORTED, "%s: another thread is capturing with dtorch.capture(); ops from other threads wait "
               "until it ends", op);
        goto fail;
    }
    for (int m = 0; m < nmeshes; m++) {
        dt_mesh *mesh = meshes[m];
        if (mesh->ready_epoch == rt->epoch && mesh->ready_deaths == rt->deaths)
            continue; /* every device was started and alive at its last op, and none has died since */
        for (int64_t i = 0; i < mesh->size; i++) {
            if (s_ensure_device(rt, op, mesh->ids[i], mesh->device_type) != 0)
                goto fail;
            act_device *dev = rt->devices[mesh->ids[i]];
            if (dev->state == ACT_DEV_STARTING && rt->listening && s_await_worker(rt, op, dev, rt->connect_s) != 0)
                goto fail;
            if (dev->state == ACT_DEV_DEAD) {
                dt_err(DT_EDEVICE, "%s: device %lld is dead: %s", op, (long long)dev->id, dev->reason);
                goto fail;
            }
        }
        mesh->ready_epoch = rt->epoch;
        mesh->ready_deaths = rt->deaths;
    }
    rt->submitted++;
    s_urgent = false;
    s_over_limit = false;
    return 0;
fail:
    pthread_mutex_unlock(&rt->lock);
    return dt_last_error_code();
}

static act_batch *s_batch_new(void)
{
    act_batch *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "dtorch: out of memory for an op batch\n");
        abort();
    }
    return b;
}

void act_batch_destroy(act_batch *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->npayloads; i++)
        if (b->payloads[i].free_fn)
            b->payloads[i].free_fn(b->payloads[i].data, b->payloads[i].hint);
    free(b->payloads);
    free(b->pk.data);
    free(b);
}

/* The batch the next record of dev goes into, sealing a full one unless its payload's record
 * is still to come. */
static act_batch *s_open_batch(act_runtime *rt, act_device *dev)
{
    act_batch *b = dev->out_tail;
    if (!b || (b->nrecords >= ACT_BATCH_MAX && !b->payload_pending)) {
        act_batch *fresh = s_batch_new();
        if (b)
            b->next = fresh;
        else
            dev->out_head = fresh;
        dev->out_tail = b = fresh;
    }
    if (!dev->dirty) {
        dev->dirty = true;
        rt->dirty[rt->ndirty] = dev;
        __atomic_store_n(&rt->ndirty, rt->ndirty + 1, __ATOMIC_RELAXED);
    }
    return b;
}

mb_writer *act_runtime_record(int64_t device)
{
    if (act_capture_active())
        return act_capture_record(device, 0);
    return act_runtime_record_now(device);
}

mb_writer *act_runtime_record_now(int64_t device)
{
    act_runtime *rt = &act_rt;
    act_device *dev = rt->devices[device];
    act_batch *b = s_open_batch(rt, dev);
    b->payload_pending = false;
    b->nrecords++;
    if (++dev->queued > ACT_QUEUE_LIMIT)
        s_over_limit = true;
    rt->since_ring++;
    return &b->pk;
}

int act_runtime_payload(int64_t device, mb_buf buf)
{
    act_runtime *rt = &act_rt;
    if (act_capture_active()) {
        /* refused at the call sites; should one slip through, the capture cannot be kept */
        act_capture_fail("it sends host data to the devices (make such tensors before the capture)");
        if (buf.free_fn)
            buf.free_fn(buf.data, buf.hint);
        return 0;
    }
    act_device *dev = rt->devices[device];
    act_batch *b = s_open_batch(rt, dev);
    if (b->npayloads == b->cap_payloads) {
        int cap = b->cap_payloads ? b->cap_payloads * 2 : 4;
        mb_buf *grown = realloc(b->payloads, (size_t)cap * sizeof *grown);
        if (!grown) {
            fprintf(stderr, "dtorch: out of memory for payload frames\n");
            abort();
        }
        b->payloads = grown;
        b->cap_payloads = cap;
    }
    b->payloads[b->npayloads] = buf;
    b->payload_pending = true;
    return b->npayloads++;
}

int act_runtime_track(dt_future *f)
{
    if (act_capture_refuse("wait") != 0)
        return dt_last_error_code();
    f->id = act_runtime_new_future_id();
    if (dt_idmap_put(&act_rt.futures, f->id, f) != 0)
        return dt_err(DT_ENOMEM, "out of memory");
    dt_future_ref(f);
    return 0;
}

static bool s_queues_full(act_runtime *rt)
{
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (dev && dev->state != ACT_DEV_DEAD && dev->queued > ACT_QUEUE_LIMIT)
            return true;
    }
    return false;
}

void act_runtime_urgent(void) { s_urgent = true; }

void act_runtime_end(void)
{
    act_runtime *rt = &act_rt;
    bool wait = s_over_limit, ring = false;
    if (!rt->rung && rt->ndirty > 0) {
        double now = s_urgent || wait || rt->since_ring >= ACT_RING_RECORDS ? 0 : act_now();
        ring = now == 0 || now - rt->last_ring >= ACT_RING_DELAY_S;
        if (ring) {
            __atomic_store_n(&rt->rung, true, __ATOMIC_SEQ_CST);
            rt->since_ring = 0;
            rt->last_ring = now ? now : act_now();
        }
    }
    int fd = rt->doorbell;
    pthread_mutex_unlock(&rt->lock);
    if (ring && act_controller_asleep()) {
        uint64_t one = 1;
        if (write(fd, &one, sizeof one) < 0) { /* an eventfd only fails when its counter is full: still rung */ }
    }
    if (!wait)
        return;
    /* backpressure: the controller is far behind; let it drain before queueing more. The op is
     * already queued, so an interrupt only ends the wait (the bindings then drop the result). */
    act_wait_enter();
    pthread_mutex_lock(&rt->lock);
    while (rt->running && !rt->stopping && s_queues_full(rt)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50 * 1000 * 1000;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        if (pthread_cond_timedwait(&rt->cond, &rt->lock, &until) != 0) {
            pthread_mutex_unlock(&rt->lock);
            bool interrupted = act_wait_interrupted();
            pthread_mutex_lock(&rt->lock);
            if (interrupted)
                break;
        }
    }
    pthread_mutex_unlock(&rt->lock);
    act_wait_leave();
}

void act_runtime_free_now(const dt_mesh *mesh, uint64_t id)
{
    act_runtime *rt = &act_rt;
    for (int64_t i = 0; i < mesh->size; i++) {
        act_device *dev = rt->devices[mesh->ids[i]];
        if (!dev || dev->state == ACT_DEV_DEAD)
            continue;
        if (act_capture_active()) {
            mb_writer *pk = act_capture_record(dev->id, id);
            if (pk)
                mb_encode_free(pk, id);
            continue;
        }
        act_batch *b = s_open_batch(rt, dev);
        mb_encode_free(&b->pk, id);
        b->nrecords++;
        dev->queued++;
    }
}

void act_runtime_free(uint64_t epoch, dt_mesh *mesh, uint64_t id)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (act_runtime_epoch_live(epoch))
        act_runtime_free_now(mesh, id);
    pthread_mutex_unlock(&rt->lock);
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

int dt_synchronize(void)
{
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (!rt->running) {
        pthread_mutex_unlock(&rt->lock);
        return 0;
    }
    if (rt->stopping) {
        /* the controller may have failed the pending futures already: a new one would never settle */
        pthread_mutex_unlock(&rt->lock);
        return dt_err(DT_ESHUTDOWN, "synchronize: the runtime is shutting down");
    }
    if (act_capture_refuse("synchronize") != 0) {
        pthread_mutex_unlock(&rt->lock);
        return dt_last_error_code();
    }
    int n = 0;
    for (int64_t i = 0; i < rt->ndevices; i++)
        n += rt->devices[i] && rt->devices[i]->state != ACT_DEV_DEAD;
    if (n == 0) {
        pthread_mutex_unlock(&rt->lock);
        return 0;
    }
    dt_future *f = act_future_new(ACT_SYNC, n);
    if (!f || act_runtime_track(f) != 0) {
        pthread_mutex_unlock(&rt->lock);
        dt_future_release(&f);
        return dt_err(DT_ENOMEM, "synchronize: out of memory");
    }
    s_urgent = true;
    s_over_limit = false;
    int piece = 0;
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev || dev->state == ACT_DEV_DEAD)
            continue;
        f->pieces[piece].device = dev->id;
        mb_encode_sync(act_runtime_record(dev->id), f->id, piece++);
    }
    act_runtime_end();
    int rc = dt_future_wait(f, -1);
    dt_future_release(&f);
    return rc;
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
        if (rt->devices[i] && rt->devices[i]->state == ACT_DEV_READY) {
            if (n < max)
                ids[n] = i;
            n++;
        }
    pthread_mutex_unlock(&rt->lock);
    return n;
}
