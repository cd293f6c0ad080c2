/* act_controller — the controller actor: one thread that ships every device its batches under a
 * credit window, turns completions into settled futures, and watches the workers' liveness. */
#ifndef ACT_CONTROLLER_H
#define ACT_CONTROLLER_H

#include "act_runtime.h"

/* ---- act_controller.c: the thread, and its step lent to a waiting user thread ---- */
/* The controller thread's body (started by the runtime with act_rt). */
void *act_controller_main(void *arg);
/* One step of the controller's work (ship what is queued, take in what has arrived, settle the
 * futures it completes), done on the calling thread: a user thread spinning on a future calls it,
 * so that a small op's value comes back without the two wake-ups of the controller thread. Does
 * nothing (false) while the controller thread is in a step or asleep on the sockets, or not up. */
bool act_controller_help(void);
/* Whether the controller thread sleeps on its sockets (or is not up): a user thread that has
 * raised the doorbell's flag (act_rt.rung) rings the eventfd only then; a spinning controller
 * sees the flag at its next look. */
bool act_controller_asleep(void);
/* What follows is for the controller thread, or a user thread that holds its step. The device of id as the table has it now (NULL: none, or out of range). */
static inline act_device *act_controller_device(const act_runtime *rt, int64_t id)
{
    return id >= 0 && id <= DT_MAX_DEVICE_ID && rt->devices ? __atomic_load_n(&rt->devices[id], __ATOMIC_ACQUIRE)
                                                             : NULL;
}
/* Sends `to` a message of kind (MB_ABORT, MB_ENDPOINT, MB_PROCESS, MB_RELEASE) with the one record
 * body holds. */
void act_controller_send(act_runtime *rt, act_device *to, mb_kind kind, mb_writer *body);
/* A message with no body (MB_BYE, MB_HEARTBEAT). */
void act_controller_send_empty(act_runtime *rt, act_device *to, mb_kind kind);

/* ---- act_controller_inbox.c: what the workers say ---- */
/* Handles every message waiting on the router; the bye of a device sets dev->bye. */
void act_controller_drain(act_runtime *rt);
/* What the controller does with a HELLO or COMPLETIONS message from dev once it knows the message
 * is dev's and in order (the fuzz target of the controller calls it; controller thread only). */
void act_controller_take(act_runtime *rt, act_device *dev, mb_message *m);

/* ---- act_controller_liveness.c: deaths and silence ---- */
/* Fails every pending future that waits for a piece from device (every one: device -1). */
void act_controller_fail_futures(act_runtime *rt, int64_t device, int code, const char *why);
/* Tells device `to` that device `dead` died, so that it stops waiting for regions from it. */
void act_controller_abort(act_runtime *rt, act_device *to, int64_t dead);
/* Declares dev dead for reason: the futures waiting on it fail with a message that names the last
 * op sent to it. */
void act_controller_died(act_runtime *rt, act_device *dev, const char *reason);
/* A worker the controller refused: the reason names the device and is the whole message. */
void act_controller_down(act_runtime *rt, act_device *dev, const char *reason);
/* When the controller judges dev silent if nothing comes from it before (act_now seconds), INFINITY
 * when its silence is not watched: silent_s after it was last heard, for a worker on another host
 * once it said hello and for a worker process of this host; for the latter, before anything was
 * heard from it, silent_s after it was started (then only a stopped process is silent: one that is
 * still starting has up to ACT_HELLO_TIMEOUT_S). The controller looks at that time, not at its
 * next tick after it, so the declared bound holds. */
double act_controller_silent_at(const act_runtime *rt, const act_device *dev);
/* Process workers: notices the ones that ended; any worker: the ones that never said hello, and
 * those that went silent (act_controller_silent_at). Returns the earliest time still ahead at which
 * a worker could be found silent, for the controller to look again then, not a tick after. */
double act_controller_check_workers(act_runtime *rt);
/* Listening: tells every remote worker that the controller is alive (they leave when it is silent). */
void act_controller_beat(act_runtime *rt);

#endif
