/* act_controller — the controller actor: one thread that ships every device its batches under a
 * credit window, turns completions into settled futures, and watches the workers' liveness. */
#ifndef ACT_CONTROLLER_H
#define ACT_CONTROLLER_H

#include "act_runtime.h"

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
/* When the controller judges dev silent if nothing comes from it before (act_now seconds), INFINITY
 * when its silence is not watched: silent_s after it was last heard, for a worker on another host
 * once it said hello and for a worker process of this host; for the latter, before anything was
 * heard from it, silent_s after it was started (then only a stopped process is silent: one that is
 * still starting has up to ACT_HELLO_TIMEOUT_S). The controller looks at that time, not at its
 * next tick after it, so the declared bound holds. */
double act_controller_silent_at(const act_runtime *rt, const act_device *dev);
/* What the controller does with a HELLO or COMPLETIONS message from dev once it knows the message
 * is dev's and in order (the fuzz target of the controller calls it; controller thread only). */
void act_controller_take(act_runtime *rt, act_device *dev, mb_message *m);

#endif
