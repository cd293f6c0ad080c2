/* act_spawn — the homes of worker actors: a thread in this process, or a child process running
 * the dtorch-worker executable. Only the endpoint differs; the worker code is the same. */
#include <errno.h>
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
#include "act_worker.h"
#include "dt_error.h"

extern char **environ;

typedef struct {
    char endpoint[256];
    char device_type[16];
    int64_t device;
    atomic_bool *stop;
    act_device *dev;      /* where a failure is said (devices never move) */
} s_thread_args;

static bool s_should_stop(void *arg) { return atomic_load((atomic_bool *)arg); }

static void *s_thread_main(void *arg)
{
    s_thread_args a = *(s_thread_args *)arg;
    free(arg);
    /* named after its device (top -H, perf and /proc/self/task/<tid>/comm show it): 15 chars at most */
    char name[16];
    snprintf(name, sizeof name, "dtorch-dev%u", (unsigned)(a.device % 100000));
    pthread_setname_np(pthread_self(), name);
    if (act_worker_run(a.endpoint, a.device, a.device_type, s_should_stop, a.stop) != 0) {
        /* e.g. no socket to be had: the controller declares the device dead at its next check,
         * instead of waiting for a hello that will not come */
        snprintf(a.dev->thread_error, sizeof a.dev->thread_error, "%s", dt_last_error());
        atomic_store(&a.dev->thread_failed, true);
    }
    return NULL;
}

int act_spawn_thread(act_device *dev, const char *endpoint, const char *device_type)
{
    s_thread_args *a = malloc(sizeof *a);
    if (!a)
        return dt_err(DT_ENOMEM, "out of memory");
    snprintf(a->endpoint, sizeof a->endpoint, "%s", endpoint);
    snprintf(a->device_type, sizeof a->device_type, "%s", device_type);
    a->device = dev->id;
    a->stop = &dev->stop;
    a->dev = dev;
    atomic_store(&dev->thread_failed, false);
    dev->thread_failure_told = false;
    if (pthread_create(&dev->thread, NULL, s_thread_main, a) != 0) {
        free(a);
        return dt_err(DT_ESYS, "cannot start a worker thread for device %lld", (long long)dev->id);
    }
    dev->has_thread = true;
    return 0;
}

int act_spawn_process(act_device *dev, const char *endpoint, const char *device_type, const char *worker_path)
{
    if (strchr(worker_path, '/') && access(worker_path, X_OK) != 0)
        return dt_err(DT_ESYS, "cannot run the worker executable '%s': %s", worker_path, strerror(errno));
    char device[32], parent[32];
    snprintf(device, sizeof device, "%lld", (long long)dev->id);
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    char *argv[] = {(char *)worker_path, "--connect", (char *)endpoint, "--device", device,
                    "--device-type", (char *)device_type, "--parent", parent, NULL};
    int rc = posix_spawnp(&dev->pid, worker_path, NULL, NULL, argv, environ);
    if (rc != 0)
        return dt_err(DT_ESYS, "cannot start worker process '%s' for device %lld: %s", worker_path,
                      (long long)dev->id, strerror(rc));
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
    return true;
}

void act_spawn_stop(act_device *dev, double grace_s)
{
    if (dev->has_thread) {
        pthread_join(dev->thread, NULL);
        dev->has_thread = false;
    }
    if (dev->pid <= 0)
        return;
    double deadline = act_now() + grace_s;
    while (act_now() < deadline) {
        if (waitpid(dev->pid, NULL, WNOHANG) == dev->pid) {
            dev->pid = 0;
            return;
        }
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    kill(dev->pid, SIGKILL);
    waitpid(dev->pid, NULL, 0);
    dev->pid = 0;
}
