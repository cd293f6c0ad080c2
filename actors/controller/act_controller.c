/* act_controller — the controller actor: one thread that owns the ROUTER socket every worker
 * talks to (lending it, between its steps, to a user thread that waits on a future). It ships
 * outboxes under a credit window, takes in what the workers say (act_controller_inbox.c: hellos,
 * completions that settle futures), watches their liveness (act_controller_liveness.c: deaths,
 * silence, stuck threads), and says bye to them at shutdown. It also keeps the timeline of the
 * batches it sends. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "act_controller.h"
#include "act_runtime.h"
#include "act_spawn.h"
#include "dt_error.h"
#include "dt_shm.h"
#include "mb_curve.h"
#include "mb_rid.h"

typedef struct {
    act_runtime *rt;
    zsock_t *router;
    int64_t *sent;       /* (DT_MAX_DEVICE_ID + 1) records sent per device since the last accounting */
    bool threads_only;   /* every device is a thread worker of this process: act_rt.posted says when to look */
    uint64_t seen_posted; /* act_rt.posted when the router was last drained */
    int idle_looks;      /* spinning looks since the router was last polled */
} s_ctl;

#define S_LOOKS_PER_POLL 32 /* spinning looks that trust act_rt.posted before polling the router anyway */

/* The controller's state and sockets belong to whichever thread holds `step`: the controller
 * thread for each of its steps, or a waiting user thread (act_controller_help) between them. The
 * controller thread sleeps on the sockets without it, saying so in `asleep`, and nobody else
 * touches them then. A ZeroMQ socket may move between threads with a full barrier, which the
 * mutex is. */
static struct {
    pthread_mutex_t step;
    bool live;           /* the controller is up and not stopping: helpers may step */
    bool asleep;         /* the controller thread is in a blocking poll on the sockets */
    s_ctl *ctl;
} s_shared = {.step = PTHREAD_MUTEX_INITIALIZER};

/* The routing id of device's link to the controller (mb_rid.h: with the run's token in process mode). */
static void s_routing_id(int64_t device, char *buf) { mb_rid_format(buf, 'd', device, act_rt.token); }

/* Moves every dirty outbox to its device's send queue. */
static void s_take_outboxes(act_runtime *rt)
{
    /* a racy peek that saves taking the user thread's lock on wake-ups with nothing new: a
     * record queued after it is collected at the next wake-up (doorbell, completion or tick) */
    if (__atomic_load_n(&rt->ndirty, __ATOMIC_RELAXED) == 0 && !__atomic_load_n(&rt->rung, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&rt->lock);
    for (int64_t i = 0; i < rt->ndirty; i++) {
        act_device *dev = rt->dirty[i];
        dev->dirty = false;
        if (!dev->out_head)
            continue; /* emptied by its death */
        if (dev->send_tail)
            dev->send_tail->next = dev->out_head;
        else
            dev->send_head = dev->out_head;
        dev->send_tail = dev->out_tail;
        dev->out_head = dev->out_tail = NULL;
    }
    rt->ndirty = 0;
    __atomic_store_n(&rt->rung, false, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&rt->lock);
}

void act_controller_send(act_runtime *rt, act_device *to, mb_kind kind, mb_writer *body)
{
    if (body->failed) {
        free(mb_w_release(body));
        return;
    }
    char rid[MB_RID_MAX];
    s_routing_id(to->id, rid);
    mb_header h = {MB_VERSION, kind, to->send_seq++, MB_SENDER_CONTROLLER, 1};
    mb_send(rt->router, rid, strlen(rid), &h, act_body_frame(body), NULL, 0);
}

void act_controller_send_empty(act_runtime *rt, act_device *to, mb_kind kind)
{
    char rid[MB_RID_MAX];
    s_routing_id(to->id, rid);
    mb_header h = {MB_VERSION, kind, to->send_seq++, MB_SENDER_CONTROLLER, 0};
    mb_send(rt->router, rid, strlen(rid), &h, (mb_buf){NULL, 0, NULL, NULL}, NULL, 0);
}

static void s_send_batch(s_ctl *c, act_device *dev, act_batch *b)
{
    char rid[MB_RID_MAX];
    s_routing_id(dev->id, rid);
    mb_header h = {MB_VERSION, MB_OPS, dev->send_seq++, MB_SENDER_CONTROLLER, b->nrecords};
    if (b->pk.failed) {
        act_batch_destroy(b);
        act_controller_died(c->rt, dev, "the controller ran out of memory encoding its ops");
        return;
    }
    int rc = mb_send(c->router, rid, strlen(rid), &h, act_body_frame(&b->pk), b->payloads, b->npayloads);
    b->npayloads = 0; /* mb_send owns them now */
    dev->in_flight += b->nrecords;
    c->sent[dev->id] += b->nrecords;
    act_trace_batch(dev->id, b->nrecords);
    act_batch_destroy(b);
    if (rc != 0)
        act_controller_died(c->rt, dev, dt_last_error());
}

/* Sends queued batches while each device has credit; then tells waiting users how much left. */
static void s_send_ready(s_ctl *c)
{
    act_runtime *rt = c->rt;
    bool any = false;
    int64_t ndevices = __atomic_load_n(&rt->ndevices, __ATOMIC_ACQUIRE);
    for (int64_t i = 0; i < ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev || !dev->hello || dev->state == ACT_DEV_DEAD)
            continue;
        while (dev->send_head &&
               (dev->in_flight == 0 || dev->in_flight + dev->send_head->nrecords <= ACT_WINDOW)) {
            act_batch *b = dev->send_head;
            dev->send_head = b->next;
            if (!dev->send_head)
                dev->send_tail = NULL;
            s_send_batch(c, dev, b);
            any = true;
            if (dev->state == ACT_DEV_DEAD)
                break;
        }
    }
    if (!any)
        return;
    pthread_mutex_lock(&rt->lock);
    for (int64_t i = 0; i < ndevices; i++) {
        if (c->sent[i] && rt->devices[i])
            rt->devices[i]->queued -= c->sent[i];
        c->sent[i] = 0;
    }
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->lock);
}

/* Says bye to every worker, waits for them to go (killing the ones that do not), fails what is
 * still pending and frees every device. */
static void s_stop(s_ctl *c)
{
    act_runtime *rt = c->rt;
    double deadline = act_now() + ACT_BYE_TIMEOUT_S;
    bool *asked = calloc((size_t)(rt->ndevices ? rt->ndevices : 1), sizeof *asked);
    for (;;) {
        bool waiting = false;
        for (int64_t i = 0; i < rt->ndevices; i++) {
            act_device *dev = rt->devices[i];
            if (!dev || dev->state == ACT_DEV_DEAD || dev->bye)
                continue;
            if (dev->hello && asked && !asked[i]) {
                act_controller_send_empty(rt, dev, MB_BYE);
                asked[i] = true;
            }
            waiting = true;
        }
        if (!waiting || act_now() > deadline)
            break;
        zmq_pollitem_t item = {zsock_resolve(c->router), 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 20);
        act_controller_drain(c->rt);
        act_controller_check_workers(rt);
    }
    free(asked);
    act_controller_fail_futures(rt, -1, DT_ESHUTDOWN, "the runtime was shut down before this value arrived");
    for (int64_t i = 0; i < rt->ndevices; i++) {
        act_device *dev = rt->devices[i];
        if (!dev)
            continue;
        atomic_store(&dev->stop, true);
        bool gone = act_spawn_stop(dev, dev->bye ? ACT_BYE_TIMEOUT_S : 0.1);
        for (act_batch *b = dev->send_head, *next; b; b = next) {
            next = b->next;
            act_batch_destroy(b);
        }
        pthread_mutex_lock(&rt->lock);
        for (act_batch *b = dev->out_head, *next; b; b = next) {
            next = b->next;
            act_batch_destroy(b);
        }
        rt->devices[i] = NULL;
        pthread_mutex_unlock(&rt->lock);
        dt_shm_peer_destroy(&dev->maps);
        if (gone)
            free(dev); /* an abandoned thread still stuck keeps its device (its stop flag) for good */
    }
    pthread_mutex_lock(&rt->lock);
    rt->ndirty = 0;
    dt_idmap_destroy(&rt->futures);
    pthread_mutex_unlock(&rt->lock);
}

/* The socket every worker talks to: local workers' (inproc, or ipc in the run's directory), or,
 * listening, a tcp one that is a CURVE server admitting the workers' key only (plaintext when the
 * user said insecure, loudly). */
static zsock_t *s_open_router(act_runtime *rt)
{
    if (!rt->listening)
        return mb_socket_new(MB_ROUTER, rt->endpoint, true, NULL);
    mb_curve server = {&rt->keys, NULL};
    if (!rt->insecure && mb_curve_accept(rt->worker_key) != 0)
        return NULL;
    zsock_t *sock = mb_socket_open(MB_ROUTER, rt->endpoint, true, NULL, rt->insecure ? NULL : &server);
    size_t len = sizeof rt->bound - 1;
    memset(rt->bound, 0, sizeof rt->bound);
    if (sock && zmq_getsockopt(zsock_resolve(sock), ZMQ_LAST_ENDPOINT, rt->bound, &len) != 0)
        snprintf(rt->bound, sizeof rt->bound, "%s", rt->endpoint);
    if (sock && rt->insecure)
        fprintf(stderr, "dtorch: WARNING: listening on %s in PLAINTEXT with no authentication (insecure=True): "
                "anyone who can reach this port can read the tensors and run ops as a worker\n", rt->bound);
    if (!sock && !rt->insecure)
        mb_curve_stop();
    return sock;
}

/* Whether every device is a thread worker of this process, whose messages act_rt.posted counts. */
static bool s_threads_only(const act_runtime *rt)
{
    if (rt->listening)
        return false;
    int64_t ndevices = __atomic_load_n(&rt->ndevices, __ATOMIC_ACQUIRE);
    for (int64_t i = 0; i < ndevices; i++) {
        const act_device *dev = act_controller_device(rt, i);
        if (dev && dev->state != ACT_DEV_DEAD && (!dev->has_thread || dev->remote))
            return false;
    }
    return true;
}

/* Whether a spinning look should poll the router (a poll and a getpid system call in ZeroMQ):
 * always, unless every device is a thread worker and none has posted since the last drain; then
 * one look in S_LOOKS_PER_POLL all the same. */
static bool s_look(s_ctl *c)
{
    uint64_t posted = __atomic_load_n(&c->rt->posted, __ATOMIC_ACQUIRE);
    if (c->threads_only && posted == c->seen_posted && ++c->idle_looks < S_LOOKS_PER_POLL)
        return false;
    c->idle_looks = 0;
    c->seen_posted = posted;
    c->threads_only = s_threads_only(c->rt);
    return true;
}

void *act_controller_main(void *arg)
{
    pthread_setname_np(pthread_self(), "dtorch-control"); /* so profiles and debuggers tell it apart */
    s_ctl c = {.rt = arg, .sent = calloc(DT_MAX_DEVICE_ID + 1, sizeof *c.sent)};
    act_runtime *rt = c.rt;
    const char *shm = getenv("DTORCH_SHM");
    rt->shm = !(shm && strcmp(shm, "0") == 0);
    c.router = rt->router = c.sent ? s_open_router(rt) : NULL;
    pthread_mutex_lock(&rt->lock);
    if (!c.router)
        rt->start_error = dt_last_error_code() ? dt_last_error_code() : DT_ESYS;
    else
        rt->controller_up = true;
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->lock);
    if (!c.router) {
        free(c.sent);
        return NULL;
    }

    zmq_pollitem_t items[2] = {{zsock_resolve(c.router), 0, ZMQ_POLLIN, 0}, {NULL, rt->doorbell, ZMQ_POLLIN, 0}};
    double next_check = act_now() + ACT_TICK_MS / 1e3, spin_until = 0;
    pthread_mutex_lock(&s_shared.step);
    s_shared.ctl = &c;
    __atomic_store_n(&s_shared.live, true, __ATOMIC_RELAXED);
    for (;;) {
        /* Spinning: a look at the sockets and at the doorbell's flag (a user thread rings the
         * eventfd only while this thread sleeps), yielding between looks with the step let go
         * (a waiting user thread may take it). Then a blocking poll, asleep: the flag is looked at
         * again after saying so, and the user thread looks at `asleep` after raising the flag,
         * so one of the two always sees the other. */
        int rc = s_look(&c) ? zmq_poll(items, 2, 0) : 0;
        bool rung = __atomic_load_n(&rt->rung, __ATOMIC_RELAXED);
        if (rc == 0 && !rung && act_now() < spin_until) {
            pthread_mutex_unlock(&s_shared.step);
            do
                sched_yield();
            while (pthread_mutex_trylock(&s_shared.step) != 0);
            continue;
        }
        if (rc == 0 && !rung) {
            __atomic_store_n(&s_shared.asleep, true, __ATOMIC_SEQ_CST);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            if (!__atomic_load_n(&rt->rung, __ATOMIC_SEQ_CST)) {
                /* until the next check, rounded up: woken before it, the check would wait a tick more */
                double wait_ms = ceil((next_check - act_now()) * 1e3);
                pthread_mutex_unlock(&s_shared.step);
                rc = zmq_poll(items, 2, wait_ms < 0 ? 0 : wait_ms > ACT_TICK_MS ? ACT_TICK_MS : (long)wait_ms);
                pthread_mutex_lock(&s_shared.step);
            }
            __atomic_store_n(&s_shared.asleep, false, __ATOMIC_RELAXED);
        }
        if (rc > 0 || rung)
            spin_until = act_now() + act_spin_s();
        if (rc > 0 && (items[1].revents & ZMQ_POLLIN)) {
            uint64_t n;
            if (read(rt->doorbell, &n, sizeof n) < 0) { /* EAGAIN: another wake-up drained it */ }
        }
        s_take_outboxes(rt);
        act_controller_drain(c.rt);
        s_send_ready(&c);
        if (act_now() >= next_check) {
            double silent_at = act_controller_check_workers(rt);
            if (rt->listening)
                act_controller_beat(rt);
            next_check = fmin(act_now() + ACT_TICK_MS / 1e3, silent_at);
        }
        if (__atomic_load_n(&rt->stopping, __ATOMIC_ACQUIRE))
            break;
    }
    __atomic_store_n(&s_shared.live, false, __ATOMIC_RELAXED);
    s_shared.ctl = NULL;
    pthread_mutex_unlock(&s_shared.step);
    s_stop(&c);
    free(c.sent);
    mb_socket_destroy(&c.router);
    rt->router = NULL;
    if (rt->listening && !rt->insecure)
        mb_curve_stop();
    if (strncmp(rt->endpoint, "ipc://", 6) == 0)
        unlink(rt->endpoint + 6); /* the socket file outlives the socket otherwise */
    return NULL;
}

bool act_controller_asleep(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(&s_shared.asleep, __ATOMIC_SEQ_CST) || !__atomic_load_n(&s_shared.live, __ATOMIC_SEQ_CST);
}

bool act_controller_help(void)
{
    if (!__atomic_load_n(&s_shared.live, __ATOMIC_RELAXED) || pthread_mutex_trylock(&s_shared.step) != 0)
        return false;
    bool stepped = s_shared.live && !__atomic_load_n(&s_shared.asleep, __ATOMIC_RELAXED);
    if (stepped) {
        /* what the step meets (a malformed message it drops) is not the waiting thread's error */
        int code = dt_last_error_code();
        char message[DT_ERRMSG_MAX];
        if (code)
            snprintf(message, sizeof message, "%s", dt_last_error());
        s_ctl *c = s_shared.ctl;
        uint64_t posted = __atomic_load_n(&c->rt->posted, __ATOMIC_ACQUIRE);
        s_take_outboxes(c->rt);
        if (!c->threads_only || posted != c->seen_posted) {
            c->seen_posted = posted; /* the drain takes in everything posted before this load */
            act_controller_drain(c->rt);
        }
        s_send_ready(c);
        if (code)
            dt_err(code, "%s", message);
        else if (dt_last_error_code())
            dt_err_clear();
    }
    pthread_mutex_unlock(&s_shared.step);
    return stepped;
}

/* ---- the controller's side of a timeline (dtorch.profiler) ---------------------------------- */

#define S_HOST_TRACE_MAX (1 << 20)
static pthread_mutex_t s_trace_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool s_tracing;
static int64_t *s_host_trace;   /* (n, 3) rows */
static int64_t s_nhost_trace, s_cap_host_trace;

void act_trace_host(bool on)
{
    pthread_mutex_lock(&s_trace_lock);
    if (on)
        s_nhost_trace = 0;
    atomic_store(&s_tracing, on);
    pthread_mutex_unlock(&s_trace_lock);
}

void act_trace_batch(int64_t device, int64_t records)
{
    if (!atomic_load_explicit(&s_tracing, memory_order_relaxed))
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pthread_mutex_lock(&s_trace_lock);
    if (s_nhost_trace == s_cap_host_trace && s_cap_host_trace < S_HOST_TRACE_MAX) {
        int64_t cap = s_cap_host_trace ? 2 * s_cap_host_trace : 4096;
        int64_t *grown = realloc(s_host_trace, (size_t)cap * 3 * sizeof *grown);
        if (grown) {
            s_host_trace = grown;
            s_cap_host_trace = cap;
        }
    }
    if (s_nhost_trace < s_cap_host_trace) {
        int64_t *row = s_host_trace + 3 * s_nhost_trace++;
        row[0] = device;
        row[1] = records;
        row[2] = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    pthread_mutex_unlock(&s_trace_lock);
}

int64_t dt_trace_host(int64_t *rows, int64_t max)
{
    pthread_mutex_lock(&s_trace_lock);
    int64_t n = s_nhost_trace;
    if (rows && max > 0)
        memcpy(rows, s_host_trace, (size_t)(n < max ? n : max) * 3 * sizeof *rows);
    pthread_mutex_unlock(&s_trace_lock);
    return n;
}
