/* act_runtime — the one runtime of a process, started and stopped: its worker mode, the private
 * directory of its worker processes' sockets, listening for workers started elsewhere, the
 * controller thread, and the epoch that tells a tensor of this run from one of an earlier run. The
 * devices it serves are in act_runtime_devices.c; the user thread's side of an op, packing its
 * records into the devices' outboxes, is in act_runtime_submit.c. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "act_capture.h"
#include "act_controller.h"
#include "act_runtime.h"
#include "dt_error.h"
#include "mb_curve.h"
#include "mb_rid.h"

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
    if (act_runtime_devices_table() != 0) {
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

int act_runtime_ready(const char *op)
{
    act_runtime *rt = &act_rt;
    if (!rt->running) {
        dt_workers workers = rt->workers;
        if (!s_configured && s_workers_from_env(&workers) != 0)
            return dt_last_error_code();
        if (!s_configured)
            rt->workers = workers;
        if (!rt->worker_path[0]) {
            const char *path = getenv("DTORCH_WORKER_PATH");
            snprintf(rt->worker_path, sizeof rt->worker_path, "%s", path && *path ? path : "dtorch-worker");
        }
        if (s_start() != 0)
            return dt_last_error_code();
    }
    if (rt->stopping)
        return dt_err(DT_ESHUTDOWN, "%s: the runtime is shutting down", op);
    if (act_capture_active() && !act_capture_thread())
        return dt_err(DT_EUNSUPPORTED, "%s: another thread is capturing with dtorch.capture(); ops from other threads "
                      "wait until it ends", op);
    return 0;
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
