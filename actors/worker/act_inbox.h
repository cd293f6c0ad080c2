/* act_inbox — regions handed from one worker thread to another of the same process without a
 * message (internal to the worker side; act_peer.c uses it).
 *
 * A SEND between worker threads passes a reference to the sender's storage; through the peer
 * sockets that took a message made, routed through an inproc pipe, its reader's signal written and
 * read, and the message decoded: about 3 us of the sender's time and 7 of the receiver's on the
 * path of every all-reduce in a decode step. Here the sender makes the act_recv the receiver would
 * have decoded and pushes it onto the receiver's inbox (a lock-free stack); the receiver takes the
 * whole stack at once where it looks for regions and on every round of its loop. A receiver that
 * sleeps in its wait says so first and polls the inbox's doorbell (an eventfd) beside its sockets;
 * a sender that finds it asleep after its push rings it (both sides' marks are sequentially
 * consistent, so a push is never left unseen by a sleeper).
 *
 * An inbox is found by (the run's controller endpoint, device) and made by whichever side comes
 * first: a sender may send before its receiver started. It lives until its last reference goes;
 * regions still in it then are let go. */
#ifndef ACT_INBOX_H
#define ACT_INBOX_H

#include <stdbool.h>
#include <stdint.h>

#include "act_worker.h"

typedef struct act_inbox act_inbox;

/* The inbox of device in the run of endpoint, with a reference for the caller; NULL (and
 * dt_last_error) when it cannot be made. */
act_inbox *act_inbox_get(const char *endpoint, int64_t device);
/* Lets go of a reference; the last frees the inbox and the regions still in it. NULL is ignored. */
void act_inbox_put(act_inbox *box);
/* The sender: hands r to the receiver (which then owns it), ringing the doorbell when it sleeps.
 * False when the receiver has left (act_inbox_close): r stays the caller's. */
bool act_inbox_push(act_inbox *box, act_recv *r);
/* The receiver: the regions pushed since the last take, oldest first, linked through next. */
act_recv *act_inbox_take(act_inbox *box);
/* The receiver, about to sleep: marks it asleep, unless regions came meanwhile (false, not marked).
 * After the sleep, act_inbox_awake unmarks it and quiets the doorbell. */
bool act_inbox_sleep(act_inbox *box);
void act_inbox_awake(act_inbox *box);
/* The doorbell to poll while asleep (readable once rung). */
int act_inbox_fd(const act_inbox *box);
/* The receiver leaves: later pushes fail, and the regions in it are let go. */
void act_inbox_close(act_inbox *box);

#endif
