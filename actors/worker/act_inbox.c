/* act_inbox — regions handed between worker threads of one process (act_inbox.h). */
#include "act_inbox.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "dt_error.h"

/* The head of a closed inbox: pushes fail from then on. */
#define S_CLOSED ((act_recv *)(uintptr_t)1)

struct act_inbox {
    _Atomic(act_recv *) head;   /* pushed regions, newest first; S_CLOSED once its owner left */
    atomic_int asleep;          /* the receiver sleeps (or is about to): a push rings */
    int bell;                   /* eventfd, non-blocking */
    int refs;                   /* under s_lock */
    char endpoint[256];
    int64_t device;
    struct act_inbox *next;     /* in s_boxes */
};

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static act_inbox *s_boxes;      /* every inbox of the process, under s_lock */

static void s_free_list(act_recv *r)
{
    while (r && r != S_CLOSED) {
        act_recv *next = r->next;
        act_recv_free(r);
        r = next;
    }
}

act_inbox *act_inbox_get(const char *endpoint, int64_t device)
{
    pthread_mutex_lock(&s_lock);
    act_inbox *box = s_boxes;
    while (box && !(box->device == device && strcmp(box->endpoint, endpoint) == 0))
        box = box->next;
    if (box) {
        box->refs++;
    } else if ((box = calloc(1, sizeof *box))) {
        if ((box->bell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
            dt_err(DT_ESYS, "cannot make a worker's doorbell: %s", strerror(errno));
            free(box);
            box = NULL;
        } else {
            atomic_init(&box->head, NULL);
            atomic_init(&box->asleep, 0);
            box->refs = 1;
            snprintf(box->endpoint, sizeof box->endpoint, "%s", endpoint);
            box->device = device;
            box->next = s_boxes;
            s_boxes = box;
        }
    } else {
        dt_err(DT_ENOMEM, "out of memory");
    }
    pthread_mutex_unlock(&s_lock);
    return box;
}

void act_inbox_put(act_inbox *box)
{
    if (!box)
        return;
    pthread_mutex_lock(&s_lock);
    bool last = --box->refs == 0;
    if (last) {
        act_inbox **at = &s_boxes;
        while (*at != box)
            at = &(*at)->next;
        *at = box->next;
    }
    pthread_mutex_unlock(&s_lock);
    if (!last)
        return;
    s_free_list(atomic_load(&box->head));
    close(box->bell);
    free(box);
}

bool act_inbox_push(act_inbox *box, act_recv *r)
{
    act_recv *head = atomic_load(&box->head);
    do {
        if (head == S_CLOSED)
            return false;
        r->next = head;
    } while (!atomic_compare_exchange_weak(&box->head, &head, r));
    /* after the push (both sequentially consistent): a receiver that marked itself asleep before
     * it is rung; one that marks itself after sees the push in act_inbox_sleep */
    if (atomic_load(&box->asleep)) {
        uint64_t one = 1;
        ssize_t n = write(box->bell, &one, sizeof one);
        (void)n; /* the counter full (EAGAIN) is rung already */
    }
    return true;
}

act_recv *act_inbox_take(act_inbox *box)
{
    if (atomic_load_explicit(&box->head, memory_order_relaxed) == NULL)
        return NULL; /* the usual look while spinning: nothing, and no write to the shared line */
    act_recv *r = atomic_exchange(&box->head, NULL), *oldest = NULL;
    if (r == S_CLOSED) {
        atomic_store(&box->head, S_CLOSED);
        return NULL;
    }
    while (r) { /* newest first -> oldest first */
        act_recv *next = r->next;
        r->next = oldest;
        oldest = r;
        r = next;
    }
    return oldest;
}

bool act_inbox_sleep(act_inbox *box)
{
    atomic_store(&box->asleep, 1);
    act_recv *head = atomic_load(&box->head);
    if (head != NULL && head != S_CLOSED) {
        atomic_store(&box->asleep, 0);
        return false;
    }
    return true;
}

void act_inbox_awake(act_inbox *box)
{
    atomic_store(&box->asleep, 0);
    uint64_t rung;
    ssize_t n = read(box->bell, &rung, sizeof rung);
    (void)n; /* EAGAIN: not rung */
}

int act_inbox_fd(const act_inbox *box) { return box->bell; }

void act_inbox_close(act_inbox *box)
{
    s_free_list(atomic_exchange(&box->head, S_CLOSED));
}
