/* act_common — what both actors need: the clock, a poll that spins before it sleeps, the envelope
 * of the messages they exchange, and the link by which a worker is started and reaches its
 * controller (internal).
 *
 * actors/ is two actors and this file. The controller side (actors/controller: the runtime, the
 * controller thread, futures, captures, the workers' homes) and the worker side (actors/worker: a
 * device's loop, its records, pieces, peers and replays, and dtorch-worker) never include each
 * other's headers: each side's library sees its own folder and this one only (actors/meson.build).
 * The worker side reaches the controller through messages alone, which the build proves by linking
 * it without the controller side; the controller reaches the worker side at one point,
 * act_worker_serve, where a thread of its process becomes a worker (act_spawn.c). */
#ifndef ACT_COMMON_H
#define ACT_COMMON_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "mb_codec.h"
#include "mb_curve.h"
#include "mb_socket.h"
#include "mb_writer.h"

#define ACT_SPIN_S 300e-6              /* the controller, workers and waits poll without sleeping this long after their
                                        * last event (env DTORCH_SPIN_US, 0: block at once) */
#define ACT_HEARTBEAT_S 0.5            /* a worker process says it is alive this often */
#define ACT_SILENT_S 3.0               /* a worker process not heard from this long is dead (env DTORCH_SILENT_TIMEOUT) */
#define ACT_CONNECT_S 60.0             /* listening: an op waits this long for its devices' workers to connect
                                        * (env DTORCH_CONNECT_TIMEOUT) */

double act_now(void);               /* monotonic seconds */
/* zmq_poll that first polls without blocking, yielding the core between looks, while the clock is
 * before *spin_until, and blocks for timeout_ms only after that; when it finds events it moves
 * *spin_until ACT_SPIN_S past now. A reply that comes within that long costs no wake-up: on these
 * machines a thread's wake-up is tens of microseconds, a round trip's whole budget. */
int act_poll(zmq_pollitem_t *items, int n, long timeout_ms, double *spin_until);
/* How long a thread spins before it blocks: ACT_SPIN_S, or DTORCH_SPIN_US microseconds. */
double act_spin_s(void);

/* ---- the envelope ------------------------------------------------------------------------ */
/* Opens the body of m, a received message, for reading its records (mb_body_next). */
static inline int act_body_open(mb_body_reader *r, mb_message *m)
{
    return mb_body_init(r, zmq_msg_data(&m->body), zmq_msg_size(&m->body), m->header.count);
}

/* The records packed into pk as the body frame mb_send takes (and frees); pk is left empty. */
static inline mb_buf act_body_frame(mb_writer *pk)
{
    size_t size = pk->size;
    return (mb_buf){mb_w_release(pk), size, mb_buf_free, NULL};
}

/* ---- the link ---------------------------------------------------------------------------- */
/* How a worker reaches its controller and peers. */
typedef struct {
    const char *endpoint;       /* the controller's */
    int64_t device;
    const char *device_type;    /* which backend it runs */
    bool remote;                /* it came to a listening controller (dtorch-worker --connect tcp://...): its
                                 * peers' sockets are what the controller tells it, and it leaves when the
                                 * controller goes silent */
    const mb_keypair *keys;     /* the workers' key pair: CURVE on every link; NULL: plaintext */
    const char *server_key;     /* ... and the controller's public key */
    const char *peer_host;      /* remote: the IPv4 address its peer socket binds (where peers reach it) */
    const char *token;          /* a process the controller started: the run's secret, carried in the routing
                                 * ids of its links (mb_rid.h); NULL or "": none */
    double silent_s;            /* remote: how long the controller may be silent */
    double connect_s;           /* remote: how long to wait for the controller's first word */
    atomic_uint_fast64_t *beats; /* bumped wherever the worker is not inside a kernel (worker threads) */
    uint64_t *posted;           /* worker threads: the controller's count of the messages they sent it, bumped
                                 * after each send (a spinning controller polls its socket when it moved) */
    /* called once its sockets are open (rc 0) or could not be (rc, dt_last_error says why), before
     * its hello, which waits until it returns; NULL: none */
    void (*opened)(void *arg, int rc);
    void *opened_arg;
} act_worker_link;

/* Runs device's worker with the backend of device_type until the controller says bye or
 * should_stop(arg) turns true: the body of a worker thread and of the dtorch-worker process.
 * DT_EINVAL, before it connects, for a device type this build has no backend for. (Both are the
 * worker side's, actors/worker/act_worker.c.) */
int act_worker_run(const char *endpoint, int64_t device, const char *device_type, bool (*should_stop)(void *arg),
                   void *arg);
/* The same for any link (act_worker_run is a local one, in plaintext). */
int act_worker_serve(const act_worker_link *link, bool (*should_stop)(void *arg), void *arg);

#endif
