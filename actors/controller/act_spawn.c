/* act_spawn — the homes of worker actors: a thread in this process, or a child process running
 * the dtorch-worker executable. Only the endpoint differs; the worker code is the same. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "act_runtime.h"
#include "act_spawn.h"
#include "dt_error.h"

extern char **environ;

/* The start of a worker thread, shared by it and its spawner: the thread opens its sockets and
 * says so, then waits to say hello until its device is published. A thread that cannot open them
 * returns at once and its device is never published: no other thread ever sees it. */
typedef enum { S_OPENING, S_OPENED, S_FAILED, S_GO } s_start_state;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    s_start_state state;
    char error[DT_ERRMSG_MAX];
    atomic_int refs;      /* the thread and its spawner: the last to let go frees it */
} s_start;

typedef struct {
    char endpoint[256];
    char device_type[16];
    int64_t device;
    atomic_bool *stop;
    atomic_uint_fast64_t *beats;
    act_device *dev;      /* where a failure is said (devices never move) */
    s_start *start;
    bool told, opened;    /* the thread: start has heard how the opening went, and whether it did */
} s_thread_args;

static void s_start_release(s_start *st)
{
    if (atomic_fetch_sub(&st->refs, 1) == 1) {
        pthread_mutex_destroy(&st->lock);
        pthread_cond_destroy(&st->cond);
        free(st);
    }
}

/* act_worker_link.opened of a worker thread: tells the spawner, and on success waits for its go. */
static void s_opened(void *arg, int rc)
{
    s_thread_args *a = arg;
    s_start *st = a->start;
    a->told = true;
    a->opened = rc == 0;
    pthread_mutex_lock(&st->lock);
    st->state = rc == 0 ? S_OPENED : S_FAILED;
    if (rc != 0)
        snprintf(st->error, sizeof st->error, "%s", dt_last_error());
    pthread_cond_broadcast(&st->cond);
    while (rc == 0 && st->state != S_GO)
        pthread_cond_wait(&st->cond, &st->lock);
    pthread_mutex_unlock(&st->lock);
    s_start_release(st);
}

static bool s_should_stop(void *arg) { return atomic_load((atomic_bool *)arg); }

static void *s_thread_main(void *arg)
{
    s_thread_args a = *(s_thread_args *)arg;
    free(arg);
    /* named after its device (top -H, perf and /proc/self/task/<tid>/comm show it): 15 chars at most */
    char name[16];
    snprintf(name, sizeof name, "dtorch-dev%u", (unsigned)(a.device % 100000));
    pthread_setname_np(pthread_self(), name);
    atomic_store(&a.dev->thread_tid, (int)gettid());
    act_worker_link link = {.endpoint = a.endpoint, .device = a.device, .device_type = a.device_type,
                            .beats = a.beats, .posted = &act_rt.posted, .opened = s_opened, .opened_arg = &a};
    int rc = act_worker_serve(&link, s_should_stop, a.stop);
    if (!a.told)
        s_opened(&a, rc != 0 ? rc : dt_err(DT_ESYS, "it returned before opening its sockets"));
    if (!a.opened)
        return NULL; /* never published: the spawner joins it, says why and frees its device */
    if (rc != 0) {
        /* e.g. a socket it could not have later: the controller declares the device dead at its
         * next check, instead of waiting for what will not come */
        snprintf(a.dev->thread_error, sizeof a.dev->thread_error, "%s", dt_last_error());
        atomic_store(&a.dev->thread_failed, true);
    }
    atomic_store(&a.dev->thread_running, false);
    return NULL;
}

int act_spawn_thread(act_device *dev, const char *endpoint, const char *device_type, void (*publish)(act_device *))
{
    s_thread_args *a = malloc(sizeof *a);
    s_start *st = calloc(1, sizeof *st);
    if (!a || !st) {
        free(a);
        free(st);
        return dt_err(DT_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->cond, NULL);
    st->state = S_OPENING;
    atomic_init(&st->refs, 2);
    *a = (s_thread_args){.device = dev->id, .stop = &dev->stop, .beats = &dev->beats, .dev = dev, .start = st};
    snprintf(a->endpoint, sizeof a->endpoint, "%s", endpoint);
    snprintf(a->device_type, sizeof a->device_type, "%s", device_type);
    atomic_store(&dev->beats, 0);
    dev->seen_beats = 0;
    dev->progress_at = act_now();
    dev->seen_cpu = -1;
    dev->abandoned = false;
    atomic_store(&dev->thread_failed, false);
    atomic_store(&dev->thread_running, true);
    dev->thread_failure_told = false;
    if (pthread_create(&dev->thread, NULL, s_thread_main, a) != 0) {
        free(a);
        free(st);
        return dt_err(DT_ESYS, "cannot start a worker thread for device %lld", (long long)dev->id);
    }
    pthread_mutex_lock(&st->lock);
    while (st->state == S_OPENING)
        pthread_cond_wait(&st->cond, &st->lock);
    bool opened = st->state == S_OPENED;
    if (opened) {
        dev->has_thread = true;
        publish(dev); /* before its hello, which the controller looks up by device */
        st->state = S_GO;
        pthread_cond_broadcast(&st->cond);
    }
    pthread_mutex_unlock(&st->lock);
    int rc = 0;
    if (!opened) {
        pthread_join(dev->thread, NULL);
        rc = dt_err(DT_ESYS, "device %lld: its worker thread could not start: %s", (long long)dev->id, st->error);
    }
    s_start_release(st);
    return rc;
}

/* A process forked from this one without exec (a Python multiprocessing child) must not hold the
 * workers' pipes: they would outlive the controller's process in it, and its workers with them. */
static void s_drop_lifelines_in_child(void)
{
    act_runtime *rt = &act_rt;
    for (int64_t i = 0; rt->devices && i < rt->ndevices; i++)
        if (rt->devices[i] && rt->devices[i]->lifeline >= 0) {
            close(rt->devices[i]->lifeline);
            rt->devices[i]->lifeline = -1;
        }
}

static void s_register_atfork(void) { pthread_atfork(NULL, NULL, s_drop_lifelines_in_child); }

static void s_close_lifeline(act_device *dev)
{
    if (dev->lifeline >= 0)
        close(dev->lifeline);
    dev->lifeline = -1;
}

int act_spawn_process(act_device *dev, const char *endpoint, const char *device_type, const char *worker_path,
                      const char *token)
{
    static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
    pthread_once(&atfork_once, s_register_atfork);
    if (strchr(worker_path, '/') && access(worker_path, X_OK) != 0)
        return dt_err(DT_ESYS, "cannot run the worker executable '%s': %s", worker_path, strerror(errno));
    /* The child's one link to this process that no thread's end can cut: a pipe whose write end only
     * this process holds (close-on-exec, so no other child inherits it). The run's secret goes first;
     * then the child waits for the pipe's end, which comes when this process ends, however it ends.
     * The read end is moved above ACT_RUN_FD so that the child's dup2 always makes a new descriptor. */
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0)
        return dt_err(DT_ESYS, "cannot make a pipe for the worker of device %lld: %s", (long long)dev->id,
                      strerror(errno));
    int rd = fcntl(ends[0], F_DUPFD_CLOEXEC, ACT_RUN_FD + 1);
    int rc = rd < 0 ? errno : 0;
    close(ends[0]);
    dev->lifeline = ends[1];
    size_t len = strlen(token);
    if (rc == 0 && write(ends[1], token, len) != (ssize_t)len)
        rc = errno ? errno : EIO;
    posix_spawn_file_actions_t actions;
    bool have_actions = rc == 0 && (rc = posix_spawn_file_actions_init(&actions)) == 0;
    if (have_actions)
        rc = posix_spawn_file_actions_adddup2(&actions, rd, ACT_RUN_FD);
    /* nothing else of this process goes with it: a descriptor the worker inherited (a test
     * runner's pipe, another worker's socket) would stay open as long as the worker lives */
    if (have_actions && rc == 0)
        rc = posix_spawn_file_actions_addclosefrom_np(&actions, ACT_RUN_FD + 1);
    char device[32], fd[16];
    snprintf(device, sizeof device, "%lld", (long long)dev->id);
    snprintf(fd, sizeof fd, "%d", ACT_RUN_FD);
    char *argv[] = {(char *)worker_path, "--connect", (char *)endpoint, "--device", device,
                    "--device-type", (char *)device_type, "--run-fd", fd, NULL};
    if (rc == 0)
        rc = posix_spawnp(&dev->pid, worker_path, &actions, NULL, argv, environ);
    if (have_actions)
        posix_spawn_file_actions_destroy(&actions);
    if (rd >= 0)
        close(rd);
    if (rc != 0) {
        s_close_lifeline(dev);
        dev->pid = 0;
        return dt_err(DT_ESYS, "cannot start worker process '%s' for device %lld: %s", worker_path,
                      (long long)dev->id, strerror(rc));
    }
    return 0;
}

bool act_spawn_reap(act_device *dev, char *reason, size_t size)
{
    if (dev->has_thread && !dev->thread_failure_told && atomic_load(&dev->thread_failed)) {
        dev->thread_failure_told = true;
        snprintf(reason, size, "its worker thread stopped: %s", dev->thread_error);
        return true;
    }
    if (dev->pid <= 0)
        return false;
    int status;
    pid_t pid = waitpid(dev->pid, &status, WNOHANG);
    if (pid != dev->pid)
        return false;
    if (WIFSIGNALED(status))
        snprintf(reason, size, "its worker process %d was killed by signal %d (%s)", (int)pid, WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else if (WEXITSTATUS(status) == 127)
        snprintf(reason, size, "its worker process %d could not run the worker executable (exit status 127)",
                 (int)pid);
    else
        snprintf(reason, size, "its worker process %d exited with status %d", (int)pid, WEXITSTATUS(status));
    dev->pid = 0;
    s_close_lifeline(dev);
    return true;
}

/* Abandoned threads let go while still stuck (their devices are never freed). */
#define S_MAX_STUCK 256
static act_device *s_stuck[S_MAX_STUCK];
static atomic_int s_nstuck;

/* At exit, with a thread still stuck in a kernel: ZeroMQ's teardown would close sockets that
 * thread owns, under it, and crash; the process ends at once instead, with its exit status (all
 * of Python's own finalization has run by then). */
static void s_exit_past_stuck(int status, void *arg)
{
    int n = atomic_load(&s_nstuck);
    for (int i = 0; i < n && i < S_MAX_STUCK; i++)
        if (atomic_load(&s_stuck[i]->thread_running)) {
            fflush(NULL);
            _exit(status);
        }
}

static void s_note_stuck(act_device *dev)
{
    static bool registered; /* only the controller thread gets here */
    int k = atomic_fetch_add(&s_nstuck, 1);
    if (k < S_MAX_STUCK)
        s_stuck[k] = dev;
    if (!registered)
        registered = on_exit(s_exit_past_stuck, NULL) == 0; /* after ZeroMQ's own: it runs first */
}

bool act_spawn_stop(act_device *dev, double grace_s)
{
    if (dev->has_thread && dev->abandoned) {
        /* stuck in a kernel: it may still come back (it then sees stop and leaves), or never */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000 * 1000;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        if (pthread_timedjoin_np(dev->thread, NULL, &until) != 0) {
            pthread_detach(dev->thread);
            dev->has_thread = false;
            s_note_stuck(dev);
            return false;
        }
        dev->has_thread = false;
    }
    if (dev->has_thread) {
        pthread_join(dev->thread, NULL);
        dev->has_thread = false;
    }
    if (dev->pid <= 0) {
        s_close_lifeline(dev);
        return true;
    }
    double deadline = act_now() + grace_s;
    bool gone = false;
    while (!gone && act_now() < deadline) {
        gone = waitpid(dev->pid, NULL, WNOHANG) == dev->pid;
        if (!gone)
            nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    if (!gone) {
        kill(dev->pid, SIGKILL);
        waitpid(dev->pid, NULL, 0);
    }
    dev->pid = 0;
    s_close_lifeline(dev);
    return true;
}

/* The state letter of the task of a /proc stat file ('R' running or waiting for a CPU, 'S', 'D',
 * 'T' stopped, ...), 0 when it cannot be read. */
static char s_stat_state(const char *path)
{
    char stat[512];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
    if (f)
        fclose(f);
    stat[n] = 0;
    const char *after = strrchr(stat, ')'); /* "tid (name) S ...": the name may hold anything */
    return after && after[1] == ' ' ? after[2] : 0;
}

bool act_spawn_thread_runnable(const act_device *dev)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", atomic_load(&dev->thread_tid));
    return atomic_load(&dev->thread_tid) > 0 && s_stat_state(path) == 'R';
}

/* How many tasks of dev's process are in a state that `of` lists, and how many it has. */
static int s_tasks_in(const act_device *dev, const char *of, int *ntasks)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%d/task", (int)dev->pid);
    DIR *d = dev->pid > 0 ? opendir(path) : NULL;
    int n = 0;
    *ntasks = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/%d/task/%.20s/stat", (int)dev->pid, e->d_name);
        char state = s_stat_state(path);
        ++*ntasks;
        n += state && strchr(of, state) != NULL;
    }
    if (d)
        closedir(d);
    return n;
}

bool act_spawn_process_runnable(const act_device *dev)
{
    int ntasks;
    return s_tasks_in(dev, "R", &ntasks) > 0;
}

bool act_spawn_process_stopped(const act_device *dev)
{
    int ntasks, stopped = s_tasks_in(dev, "Tt", &ntasks);
    return ntasks > 0 && stopped == ntasks;
}

double act_spawn_thread_cpu(const act_device *dev)
{
    clockid_t clock;
    struct timespec ts;
    if (!dev->has_thread || pthread_getcpuclockid(dev->thread, &clock) != 0 || clock_gettime(clock, &ts) != 0)
        return -1;
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
