/* act_controller — the controller actor: one thread that ships every device its batches under a
 * credit window, turns completions into settled futures, and watches the workers' liveness. */
#ifndef ACT_CONTROLLER_H
#define ACT_CONTROLLER_H

#include "act_runtime.h"

/* The controller thread's body (started by the runtime with act_rt). */
void *act_controller_main(void *arg);
void act_batch_destroy(act_batch *b);

#endif
