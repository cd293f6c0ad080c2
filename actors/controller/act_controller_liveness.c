/* act_controller_liveness — the workers' liveness as the controller sees it: a worker process
 * that ended, was stopped or went silent, a worker thread stuck in a kernel, a worker that never
 * said hello, a remote one no longer heard. A device declared dead fails the futures that wait on
 * it, and the other workers are told, so that none waits for a region from it. Remote workers
 * hear the controller beat, and leave when it goes silent. */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "act_controller.h"
#include "act_future.h"
#include "act_runtime.h"
#include "act_spawn.h"
#include "dt_error.h"
#include "dt_shm.h"
#include "mb_schema.h"
#include "op_registry.h"

void act_controller_fail_futures(act_runtime *rt, int64_t device, int code, const char *why)
{
    pthread_mutex_lock(&rt->lock);
    size_t n = 0, cursor = 0, cap = rt->futures.count;
    dt_future **victims = malloc((cap ? cap : 1) * sizeof *victims);
    uint64_t id;
    void *value;
    while (victims && dt_idmap_next(&rt->futures, &cursor, &id, &value)) {
        dt_future *f = value;
        for (int p = 0; p < f->npieces; p++)
            if (device < 0 || f->pieces[p].device == device) {
                victims[n++] = f;
                break;
            }
    }
    for (size_t i = 0; i < n; i++)
        dt_idmap_take(&rt->futures, victims[i]->id);
    pthread_mutex_unlock(&rt->lock);
    for (size_t i = 0; i < n; i++) {
        act_future_fail(victims[i], code, why);
        dt_future_release(&victims[i]);
    }
    free(victims);
}

void act_controller_abort(act_runtime *rt, act_device *to, int64_t dead)
{
    mb_writer body = {0};
    mb_encode_abort(&body, dead);
    act_controller_send(rt, to, MB_ABORT, &body);
}

/* Marks dev dead for reason (kept for later calls: "device 3 is dead: <reason>") and fails the
 * futures waiting on it with message. */
static void s_device_lost(act_runtime *rt, act_device *dev, const char *reason, const char *message)
{
    pthread_mutex_lock(&rt->lock);
    if (dev->state == ACT_DEV_DEAD) {
        pthread_mutex_unlock(&rt->lock);
        return;
    }
    dev->state = ACT_DEV_DEAD;
    rt->deaths++;
    snprintf(dev->reason, sizeof dev->reason, "%s", reason);
    if (!rt->stopping)
        act_runtime_note_failure(dev->id, reason); /* workers that leave at shutdown are no failure */
    for (act_batch *b = dev->out_head, *next; b; b = next) {
        next = b->next;
        act_batch_destroy(b);
    }
    dev->out_head = dev->out_tail = NULL;
    dev->queued = 0;
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->lock);
    for (act_batch *b = dev->send_head, *next; b; b = next) {
        next = b->next;
        act_batch_destroy(b);
    }
    dev->send_head = dev->send_tail = NULL;
    dt_shm_peer_destroy(&dev->maps); /* its memory goes with it */
    act_controller_fail_futures(rt, dev->id, DT_EDEVICE, message);
    /* workers waiting for a region from it in a redistribute must stop waiting */
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *other = rt->devices[i];
        if (!other || other == dev || !other->hello || other->state == ACT_DEV_DEAD)
            continue; /* one that has not said hello yet is told when it does */
        act_controller_abort(rt, other, dev->id);
    }
}

void act_controller_died(act_runtime *rt, act_device *dev, const char *reason)
{
    char message[DT_ERRMSG_MAX + 160], last[96] = "";
    pthread_mutex_lock(&rt->lock);
    const op_def *op = dev->last_op >= 0 ? op_at(dev->last_op) : NULL;
    pthread_mutex_unlock(&rt->lock);
    if (op)
        snprintf(last, sizeof last, " (the last op sent to it: %s)", op->name);
    snprintf(message, sizeof message, "device %" PRId64 " died: %s%s", dev->id, reason, last);
    s_device_lost(rt, dev, reason, message);
}

void act_controller_down(act_runtime *rt, act_device *dev, const char *reason)
{
    s_device_lost(rt, dev, reason, reason);
}

/* Worker threads: one with work in flight whose beats (act_worker_beat, between kernels) and CPU
 * time have both stood still for the stuck bound, and which is not waiting for a CPU either, is
 * stuck in a kernel that will not return (a long kernel uses CPU; a wait for a peer beats; a
 * thread starved on a loaded machine is runnable). */
static bool s_thread_stuck(act_runtime *rt, act_device *dev, double now)
{
    uint64_t beats = atomic_load_explicit(&dev->beats, memory_order_relaxed);
    /* idle or beating: its CPU clock is not read (one system call per device and tick saved) */
    double cpu = beats != dev->seen_beats || dev->in_flight == 0 ? -1 : act_spawn_thread_cpu(dev);
    if (beats != dev->seen_beats || dev->in_flight == 0 || cpu < 0 || dev->seen_cpu < 0 ||
        cpu - dev->seen_cpu > 0.005) {
        dev->seen_beats = beats;
        dev->seen_cpu = cpu;
        dev->progress_at = now;
        return false;
    }
    if (now - dev->progress_at <= rt->stuck_s)
        return false;
    if (act_spawn_thread_runnable(dev)) {
        dev->progress_at = now; /* only starved of CPU */
        return false;
    }
    return true;
}

double act_controller_silent_at(const act_runtime *rt, const act_device *dev)
{
    if (dev->state == ACT_DEV_DEAD || dev->bye)
        return INFINITY;
    if (dev->remote)
        return dev->hello ? dev->heard_at + rt->silent_s : INFINITY;
    if (dev->pid > 0)
        return (dev->heard_at > 0 ? dev->heard_at : dev->started_at) + rt->silent_s;
    return INFINITY;
}

double act_controller_check_workers(act_runtime *rt)
{
    double now = act_now(), next = INFINITY;
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev || dev->state == ACT_DEV_DEAD || dev->bye)
            continue; /* a worker that said bye at shutdown and exited did not die */
        char reason[200];
        bool silent = now >= act_controller_silent_at(rt, dev), heard = dev->heard_at > 0;
        if (act_spawn_reap(dev, reason, sizeof reason))
            act_controller_died(rt, dev, reason);
        else if (dev->has_thread && dev->hello && s_thread_stuck(rt, dev, now)) {
            snprintf(reason, sizeof reason, "its worker thread has made no progress for %.1f s (inside an op, using "
                     "no CPU); a thread cannot be stopped, so it is abandoned (process workers can be killed)",
                     now - dev->progress_at);
            dev->abandoned = true;
            act_controller_died(rt, dev, reason);
        }
        else if (!dev->hello && !dev->remote && now - dev->started_at > ACT_HELLO_TIMEOUT_S)
            act_controller_died(rt, dev, "its worker did not start in time");
        else if (dev->remote && silent) {
            /* stopped, dead, or cut off: a worker on another host cannot be killed from here; it
             * leaves by itself once the controller is silent to it (no heartbeats to the dead) */
            snprintf(reason, sizeof reason, "its worker on host %s (process %lld) has been silent for %.1f s",
                     dev->host, (long long)dev->remote_pid, now - dev->heard_at);
            act_controller_died(rt, dev, reason);
        } else if (dev->pid > 0 && silent && heard && act_spawn_process_runnable(dev)) {
            dev->heard_at = now; /* not silent: starved of CPU on a loaded host (its heartbeat waits to run) */
        } else if (dev->pid > 0 && silent && (heard || act_spawn_process_stopped(dev))) {
            /* stopped, hung in the kernel, or unreachable: it no longer even says it is alive; or, before
             * its first word (its heartbeat starts before its hello), stopped since it was started. One
             * not heard yet that is not stopped is still starting (a loaded host): the hello bound holds */
            if (heard)
                snprintf(reason, sizeof reason, "its worker process %d has been silent for %.1f s%s", (int)dev->pid,
                         now - dev->heard_at, dev->hello ? "" : " before its hello");
            else
                snprintf(reason, sizeof reason, "its worker process %d has been stopped and silent for %.1f s since "
                         "it was started", (int)dev->pid, now - dev->started_at);
            kill(dev->pid, SIGKILL); /* so that it cannot come back as a second actor for the device */
            act_controller_died(rt, dev, reason);
        }
        double at = act_controller_silent_at(rt, dev);
        if (at > now && at < next)
            next = at;
    }
    return next;
}

void act_controller_beat(act_runtime *rt)
{
    double now = act_now();
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev || !dev->remote || !dev->hello || dev->state == ACT_DEV_DEAD || now - dev->beat_at < ACT_HEARTBEAT_S)
            continue;
        dev->beat_at = now;
        act_controller_send_empty(rt, dev, MB_HEARTBEAT);
    }
}
