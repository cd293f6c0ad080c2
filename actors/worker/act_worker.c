/* act_worker — a device actor's loop. It receives batches of op records from the controller, runs
 * them in order on its own tensors (act_worker_run_record, act_worker_records.c), and answers each
 * batch with one completions message (credit, values, errors). It blocks in a receive when idle.
 * Between batches it takes the controller's other words (heartbeats, deaths of peers, where peers
 * are, which processes lend by handle); a worker process also says it is alive from a thread of
 * its own.
 *
 * Tensors are immutable once made: values are sent straight from their storage (no copy over
 * inproc), and a storage lives until both the tensor and every message using it let go. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "act_worker.h"
#include "dt_error.h"
#include "mb_schema.h"
#include "op_backend.h"
#include "op_registry.h"

#define S_POLL_MS 500 /* how often an idle worker looks at its stop flag */

static int s_send(act_worker *w, mb_kind kind, uint32_t count)
{
    mb_header h = {MB_VERSION, kind, w->send_seq++, (uint32_t)w->device, count};
    /* records that did not fit leave the body short of count: the controller takes that for a
     * protocol error and declares the device dead, which is what running out of memory here is */
    w->reply.failed = false;
    int rc = mb_send(w->sock, NULL, 0, &h, act_body_frame(&w->reply), w->payloads, w->npayloads);
    if (w->posted)
        __atomic_add_fetch(w->posted, 1, __ATOMIC_RELEASE); /* after the send: a look that sees it finds the message */
    w->npayloads = 0;
    w->nreply = 0;
    return rc;
}

static int s_run_batch(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    if (act_body_open(&r, m) == 0) {
        mb_cursor rec;
        int rc;
        while ((rc = mb_body_next(&r, &rec)) == 1) {
            if (!act_worker_run_record(w, &rec, m))
                fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed op record: %s\n", w->device,
                        dt_last_error());
            mb_body_read(&r, &rec);
        }
        if (rc < 0)
            fprintf(stderr, "dtorch worker %" PRId64 ": %s\n", w->device, dt_last_error());
    } else {
        fprintf(stderr, "dtorch worker %" PRId64 ": %s\n", w->device, dt_last_error());
    }
    /* credit the whole batch, read or not, so the controller's window stays exact */
    mb_encode_credit(&w->reply, m->header.count);
    w->nreply++;
    return s_send(w, MB_COMPLETIONS, w->nreply);
}

static void s_note_abort(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    mb_cursor rec;
    mb_abort_rec dead;
    if (act_body_open(&r, m) != 0)
        return;
    if (mb_body_next(&r, &rec) == 1 && mb_decode_abort(&rec, &dead) == 0 && dead.device >= 0 &&
        dead.device <= DT_MAX_DEVICE_ID) {
        dt_idmap_put(&w->dead, (uint64_t)dead.device + 1, w);
        act_shm_forget(w, dead.device);
    }
}

/* MB_ENDPOINT: where a peer on another host listens. Read again here (the controller checked it
 * too): only an IPv4 tcp endpoint with a port is kept, written back from its parts. */
static void s_note_endpoint(act_worker *w, mb_message *m)
{
    mb_body_reader r;
    mb_cursor rec;
    mb_endpoint_rec peer;
    if (!w->remote || act_body_open(&r, m) != 0)
        return;
    char text[64];
    mb_tcp_addr addr;
    if (mb_body_next(&r, &rec) == 1 && mb_decode_endpoint(&rec, &peer) == 0 && peer.device >= 0 &&
        peer.device <= DT_MAX_DEVICE_ID && peer.endpoint.len < sizeof text) {
        snprintf(text, sizeof text, "%.*s", (int)peer.endpoint.len, peer.endpoint.ptr);
        char *kept = mb_tcp_parse(text, false, &addr) == 0 ? malloc(sizeof text) : NULL;
        if (kept) {
            mb_tcp_format(&addr, kept, sizeof text);
            free(dt_idmap_take(&w->endpoints, (uint64_t)peer.device + 1));
            if (dt_idmap_put(&w->endpoints, (uint64_t)peer.device + 1, kept) != 0)
                free(kept);
        }
    }
}

bool act_worker_orphaned(act_worker *w)
{
    if (!w->remote || w->orphaned)
        return w->orphaned;
    double quiet = act_now() - w->heard_at;
    bool heard = w->heard_at != w->started_at;
    if (quiet <= (heard ? w->silent_s : w->connect_s))
        return false; /* a worker may be started before its controller listens: it waits longer for a first word */
    w->orphaned = true;
    if (!heard)
        dt_err(DT_EDEVICE, "no word from the controller at %s in %.1f s: is it listening there, and are --key and "
               "--server-key the ones it was given?", w->endpoint, quiet);
    else
        dt_err(DT_EDEVICE, "the controller at %s has been silent for %.1f s: leaving", w->endpoint, quiet);
    return true;
}

/* A controller message that acts at once, wherever the worker is: true when m was one. */
static bool s_act_now(act_worker *w, mb_message *m)
{
    w->heard_at = act_now();
    if (m->header.kind == MB_HEARTBEAT)
        ; /* only that it is alive */
    else if (m->header.kind == MB_ENDPOINT)
        s_note_endpoint(w, m);
    else if (m->header.kind == MB_ABORT)
        s_note_abort(w, m);
    else if (m->header.kind == MB_PROCESS)
        act_shm_on_process(w, m);
    else if (m->header.kind == MB_RELEASE)
        act_shm_on_release(w, m, -1);
    else
        return false;
    return true;
}

void act_worker_defer(act_worker *w, mb_message *m)
{
    if (s_act_now(w, m)) {
        mb_message_close(m);
        return;
    }
    if (m->header.kind == MB_BYE)
        w->leaving = true;
    act_pending *p = malloc(sizeof *p);
    if (!p) {
        mb_message_close(m);
        return;
    }
    p->next = NULL;
    p->msg = *m; /* the frames' contents move with the struct; m is not used again */
    if (w->pending_tail)
        w->pending_tail->next = p;
    else
        w->pending_head = p;
    w->pending_tail = p;
}

/* The next controller message: one deferred during a wait, or a new one. 0, 1 (none yet), <0. */
static int s_next_message(act_worker *w, mb_message *m, bool (*should_stop)(void *arg), void *arg)
{
    act_worker_beat(w);
    act_peer_take_handed(w);
    if (w->pending_head) {
        act_pending *p = w->pending_head;
        w->pending_head = p->next;
        if (!w->pending_head)
            w->pending_tail = NULL;
        *m = p->msg;
        free(p);
        return 0;
    }
    zmq_pollitem_t items[2] = {{zsock_resolve(w->sock), 0, ZMQ_POLLIN, 0}, {zsock_resolve(w->peer), 0, ZMQ_POLLIN, 0}};
    if (act_poll(items, 2, S_POLL_MS, &w->spin_until) <= 0) {
        if (act_worker_orphaned(w))
            return DT_EDEVICE;
        return should_stop && should_stop(arg) ? DT_ESHUTDOWN : 1;
    }
    if (items[1].revents & ZMQ_POLLIN)
        act_peer_receive(w);
    if (!(items[0].revents & ZMQ_POLLIN))
        return act_worker_orphaned(w) ? DT_EDEVICE : 1;
    int got = mb_recv(w->sock, false, true, m);
    if (got == 0)
        w->heard_at = act_now();
    return got == DT_EPROTO ? 1 : got;
}

typedef struct {
    char endpoint[256];
    char rid[MB_RID_MAX];       /* its socket's routing id ("h<device>", with the run's token) */
    int64_t device;
    const mb_curve *curve;      /* NULL: plaintext */
    pthread_mutex_t lock;
    pthread_cond_t wake;        /* signalled to stop at once */
    bool stop;
    pthread_t thread;
} s_heartbeat;

/* A worker process says it is alive from a thread of its own, from before its hello on, so that a
 * long kernel on the worker's thread (or a device that takes long to attach) does not look like
 * silence; a stopped or hung process goes quiet. */
static void *s_heartbeat_main(void *arg)
{
    s_heartbeat *hb = arg;
    zsock_t *sock = mb_socket_open(MB_DEALER, hb->endpoint, false, hb->rid, hb->curve);
    if (sock) {
        zsock_set_sndtimeo(sock, 0); /* one that cannot be queued now (no link yet, or none any more) is dropped */
        zsock_set_linger(sock, 0);   /* and none is worth waiting for at exit */
    }
    pthread_mutex_lock(&hb->lock);
    for (uint64_t seq = 0; sock && !hb->stop; seq++) {
        mb_header h = {MB_VERSION, MB_HEARTBEAT, seq, (uint32_t)hb->device, 0};
        mb_send(sock, NULL, 0, &h, (mb_buf){NULL, 0, NULL, NULL}, NULL, 0);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)(ACT_HEARTBEAT_S * 1e9);
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&hb->wake, &hb->lock, &until);
    }
    pthread_mutex_unlock(&hb->lock);
    mb_socket_destroy(&sock);
    return NULL;
}

/* Who this worker is and what it speaks: the controller refuses a worker built from other sources. */
static void s_hello(act_worker *w)
{
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    mb_encode_hello(&w->reply, w->device, (int64_t)getpid(), MB_PROTOCOL, op_registry_hash(), w->backend->name, host,
                    w->remote ? w->peer_endpoint : "");
}

int act_worker_run(const char *endpoint, int64_t device, const char *device_type, bool (*should_stop)(void *arg),
                   void *arg)
{
    act_worker_link link = {.endpoint = endpoint, .device = device, .device_type = device_type};
    return act_worker_serve(&link, should_stop, arg);
}

void act_worker_beat(act_worker *w)
{
    if (w->beats)
        atomic_fetch_add_explicit(w->beats, 1, memory_order_relaxed);
}

int act_worker_serve(const act_worker_link *link, bool (*should_stop)(void *arg), void *arg)
{
    int64_t device = link->device;
    const op_backend *backend = op_backend_find(link->device_type);
    if (!backend) {
        char names[128];
        op_backend_names(names, sizeof names);
        return dt_err(DT_EINVAL, "device %" PRId64 ": no '%s' device backend in this build (it has %s)", device,
                      link->device_type ? link->device_type : "(null)", names);
    }
    act_worker w;
    act_worker_init(&w, device, backend, link->endpoint);
    w.remote = link->remote;
    w.silent_s = link->silent_s > 0 ? link->silent_s : ACT_SILENT_S;
    w.connect_s = link->connect_s > 0 ? link->connect_s : ACT_CONNECT_S;
    w.beats = link->beats;
    w.posted = link->posted;
    snprintf(w.peer_host, sizeof w.peer_host, "%s", link->peer_host ? link->peer_host : "127.0.0.1");
    snprintf(w.token, sizeof w.token, "%s", link->token ? link->token : "");
    if ((w.curve = link->keys != NULL)) {
        w.keys = *link->keys;
        snprintf(w.server_key, sizeof w.server_key, "%s", link->server_key ? link->server_key : "");
    }
    char rid[MB_RID_MAX];
    mb_rid_format(rid, 'd', device, w.token);
    mb_curve to_controller = {&w.keys, w.server_key};
    int rc = act_peer_open(&w);
    if (rc == 0)
        w.sock = mb_socket_open(MB_DEALER, link->endpoint, false, rid, w.curve ? &to_controller : NULL);
    if (rc == 0 && !w.sock)
        rc = dt_last_error_code();
    if (rc == 0 && w.remote)
        zsock_set_sndtimeo(w.sock, (int)(w.silent_s * 1000)); /* a link gone that long: the controller is silent too */
    if (link->opened)
        link->opened(link->opened_arg, rc);
    s_heartbeat hb = {.device = device, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
                      .curve = w.curve ? &to_controller : NULL};
    bool beating = false;
    if (rc == 0 && !w.same_process) {
        snprintf(hb.endpoint, sizeof hb.endpoint, "%s", link->endpoint);
        mb_rid_format(hb.rid, 'h', device, w.token);
        pthread_t beat;
        beating = pthread_create(&beat, NULL, s_heartbeat_main, &hb) == 0;
        if (beating)
            hb.thread = beat;
    }
    /* the device is bound on the thread that runs every record; a device that cannot be used
     * still serves, failing what touches it with the reason (and never hanging the controller) */
    bool attached = rc == 0 && backend->attach;
    const char *unusable = attached ? backend->attach(device) : NULL;
    if (unusable)
        snprintf(w.unusable, sizeof w.unusable, "%s", unusable);
    if (rc == 0) {
        s_hello(&w);
        rc = s_send(&w, MB_HELLO, 1);
    }
    while (rc == 0) {
        mb_message m;
        int got = s_next_message(&w, &m, should_stop, arg);
        if (got == 1)
            continue;
        if (got != 0) {
            rc = got == DT_ESHUTDOWN ? 0 : got;
            break;
        }
        if (m.header.kind == MB_OPS) {
            rc = s_run_batch(&w, &m);
        } else if (m.header.kind == MB_BYE) {
            mb_message_close(&m);
            s_send(&w, MB_BYE, 0);
            break;
        } else {
            s_act_now(&w, &m);
        }
        mb_message_close(&m);
    }
    if (beating) {
        pthread_mutex_lock(&hb.lock);
        hb.stop = true;
        pthread_cond_signal(&hb.wake);
        pthread_mutex_unlock(&hb.lock);
        pthread_join(hb.thread, NULL);
    }
    act_worker_fini(&w);
    if (attached && backend->detach)
        backend->detach();
    return rc;
}

void act_worker_init(act_worker *w, int64_t device, const op_backend *backend, const char *endpoint)
{
    *w = (act_worker){.device = device, .backend = backend};
    snprintf(w->endpoint, sizeof w->endpoint, "%s", endpoint);
    w->same_process = strncmp(endpoint, "inproc://", 9) == 0;
    w->heard_at = w->started_at = act_now();
    dt_idmap_init(&w->endpoints);
    w->read_peers = w->same_process && backend->copy_from_peer;
    dt_idmap_init(&w->tensors);
    dt_idmap_init(&w->peers);
    dt_idmap_init(&w->linked);
    dt_idmap_init(&w->boxes);
    dt_idmap_init(&w->received);
    dt_idmap_init(&w->dead);
    dt_idmap_init(&w->graphs);
    dt_idmap_init(&w->pins);
    dt_idmap_init(&w->holds);
    dt_idmap_init(&w->procs);
    act_storage_open(w);
}

void act_worker_fini(act_worker *w)
{
    while (w->pending_head) {
        act_pending *p = w->pending_head;
        w->pending_head = p->next;
        mb_message_close(&p->msg);
        free(p);
    }
    act_replay_close(w);
    size_t cursor = 0;
    uint64_t id;
    void *t;
    while (dt_idmap_next(&w->tensors, &cursor, &id, &t))
        act_wtensor_free(w, t);
    dt_idmap_destroy(&w->tensors);
    while (w->nspare > 0)
        free(w->spare[--w->nspare]);
    dt_idmap_destroy(&w->dead);
    act_peer_close(w);
    cursor = 0;
    while (dt_idmap_next(&w->endpoints, &cursor, &id, &t))
        free(t);
    dt_idmap_destroy(&w->endpoints);
    act_worker_drop_reply(w);
    free(mb_w_release(&w->reply));
    free(w->payloads);
    act_worker_trace_free(w);
    if (w->sock && w->orphaned)
        zsock_set_linger(w->sock, 0); /* nobody is left to read what it still queues */
    mb_socket_destroy(&w->sock);
    act_storage_close(w);
}

