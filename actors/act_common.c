/* act_common — the clock and the spinning poll that the controller, the workers and the user's
 * waits share. */
#include "act_common.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

double act_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double s_spin_s = -1;
static pthread_once_t s_spin_once = PTHREAD_ONCE_INIT;

static void s_spin_read(void)
{
    const char *env = getenv("DTORCH_SPIN_US");
    char *end;
    double us = env ? strtod(env, &end) : -1;
    s_spin_s = env && end != env && *end == '\0' && us >= 0 && us <= 1e6 ? us * 1e-6 : ACT_SPIN_S;
}

double act_spin_s(void)
{
    pthread_once(&s_spin_once, s_spin_read);
    return s_spin_s;
}

int act_poll(zmq_pollitem_t *items, int n, long timeout_ms, double *spin_until)
{
    int rc;
    while ((rc = zmq_poll(items, n, 0)) == 0 && act_now() < *spin_until)
        sched_yield();
    if (rc == 0)
        rc = zmq_poll(items, n, timeout_ms);
    if (rc > 0)
        *spin_until = act_now() + act_spin_s();
    return rc;
}
