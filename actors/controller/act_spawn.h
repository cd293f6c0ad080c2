/* act_spawn — the homes of a worker: a thread of this process or a local child process. */
#ifndef ACT_SPAWN_H
#define ACT_SPAWN_H

#include <stdbool.h>
#include <stddef.h>

#include "act_runtime.h"

/* Starts dev's worker, told the controller's endpoint and its device type (which backend to run).
 * A worker thread is waited for until its sockets are open; publish(dev) is then called before it
 * says hello. One that cannot open them is joined, publish is never called, and the error says why
 * (dev may be freed, or started again). */
int act_spawn_thread(act_device *dev, const char *endpoint, const char *device_type, void (*publish)(act_device *));
/* A worker process gets the read end of a pipe as descriptor ACT_RUN_FD: token, the run's secret,
 * then nothing until this process ends (dev->lifeline keeps the write end until the child is gone). */
int act_spawn_process(act_device *dev, const char *endpoint, const char *device_type, const char *worker_path,
                      const char *token);
/* Process workers: true (and why, in reason) once the process has ended. */
bool act_spawn_reap(act_device *dev, char *reason, size_t size);
/* Ends the worker's home: joins the thread, or waits up to grace_s for the process, then kills it.
 * false when an abandoned thread is still stuck: it is let go, and dev must outlive it (never freed). */
bool act_spawn_stop(act_device *dev, double grace_s);
/* Worker threads: whether the thread is running or waiting for a CPU (not blocked, not stopped). */
bool act_spawn_thread_runnable(const act_device *dev);
/* Process workers: whether a thread of the process is running or waiting for a CPU. */
bool act_spawn_process_runnable(const act_device *dev);
/* Process workers: whether every thread of the process is stopped (SIGSTOP, or a tracer's stop). */
bool act_spawn_process_stopped(const act_device *dev);
/* Worker threads: the CPU seconds the thread has used, -1 if unknown. */
double act_spawn_thread_cpu(const act_device *dev);

#endif
