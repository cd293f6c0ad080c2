/* act_worker — the insides of a device actor, shared by its parts (internal): act_worker.c (the
 * loop: the link to the controller, its messages and batches), act_worker_records.c (running each
 * record, answering the controller), act_worker_ops.c (the records that run kernels),
 * act_worker_storage.c (the memory of pieces and the tensor table), act_peer.c (exchanging regions
 * with other workers for redistribute; act_inbox.c hands them between worker threads), act_shm.c
 * (a worker process's pieces in shared memory, lent by handle to its peers and the controller) and
 * act_replay.c (captured sequences). */
#ifndef ACT_WORKER_H
#define ACT_WORKER_H

#include <stdatomic.h>

#include "act_common.h"
#include "dt_dtype.h"
#include "dt_idmap.h"
#include "dt_layout.h"
#include "dt_shm.h"
#include "dtorch.h"
#include "mb_rid.h"
#include "mb_schema.h"
#include "mb_socket.h"
#include "mb_writer.h"
#include "op_backend.h"

#define ACT_TRACE_MAX (1u << 20) /* events a device keeps while tracing (32 MiB); later ones are dropped */
#define ACT_TRACE_MARKED (1u << 16) /* ... of which the first this many are timed by the backend's marks, the rest by the host */
#define ACT_SPARE_TENSORS 1024 /* freed tensor-table entries a worker keeps for reuse */
#define ACT_SMALL_STEP 32u      /* pieces of bytes in (k - 1) * 32, k * 32], up to ACT_SMALL_MAX, get buffers ... */
#define ACT_SMALL_MAX 512u      /* ... of k * 32 bytes, and a worker keeps those it frees for reuse, ... */
#define ACT_SMALL_KEEP 256      /* ... this many of each size */
#define ACT_SHM_MIN (256u << 10) /* worker processes: pieces and regions from this size up are shared by handle */
#define ACT_RECV_MAX 65536      /* regions a worker keeps waiting for the ASSEMBLE that claims them; one past it
                                 * is dropped whole (peer_regions_dropped): room for thousands of redistributes
                                 * ahead, while a worker that nothing claims from cannot grow without end */
#define ACT_RECV_MAX_BYTES (4ull << 30) /* bytes of those regions (wherever they lie: what they keep alive); a
                                 * region past it is kept as a failure, its bytes let go, so that its ASSEMBLE
                                 * fails saying why instead of waiting */

/* Bytes of a piece. Immutable once made, so it can be sent, shared by replicas and read by
 * peers in place; it lives until the tensor and every message that uses it let go. */
typedef struct {
    atomic_int refs;
    void *data;
    size_t size;
    const op_backend *backend;  /* whose memory data is (unless adopted or shared) */
    bool adopted;               /* data lives in msg, a received frame */
    zmq_msg_t msg;
    dt_shm_seg *seg;            /* data is this shared segment's (a worker process that lends), or NULL */
    bool huge;                  /* data is the pool's memory advised for huge pages (dt_pool_advised):
                                 * its size counts in huge_page_bytes while it is held */
    struct act_worker *owner;   /* the worker whose thread made it (NULL: none); the last release on
                                 * another thread gives its bytes back with the backend's free_elsewhere */
    int held;                   /* entries of its worker's tensor table that use it (views share one):
                                 * its size counts in bytes_in_use while there is one; that worker's
                                 * thread alone touches it */
} act_storage;

typedef struct {
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS]; /* (ndim) local shape */
    act_storage *storage;       /* NULL when poisoned */
    char *data;                 /* first element, inside storage (a view may start further in) */
    char *error;                /* why it could not be made (poisoned) */
} act_wtensor;

/* Where a piece's bytes lent by handle are (the segment fields of REGION and VALUE). */
typedef struct {
    int64_t segment;            /* the lender's descriptor of its segment; -1: not lent */
    uint64_t serial;            /* the segment's serial (dt_shm.h) */
    uint64_t offset;            /* bytes from the segment's start to the first element */
    uint64_t hold;              /* what the borrower names in its RELEASE */
} act_handle;

/* A region received from a peer, waiting for the ASSEMBLE that needs it. */
typedef struct act_recv {
    int status;                 /* 0, or the code of the sender's failure */
    char *error;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    const char *data;           /* first element of the region (of one lent by handle: once mapped) */
    int64_t strides[DT_MAX_DIMS]; /* byte strides of the region */
    op_copy_fn copy;            /* the backend's copy that reads data: copy_region (this device's memory),
                                 * copy_from_peer (a peer thread's), to_device (host memory it cannot use) */
    bool in_place;              /* combine may read data as it is */
    bool peer;                  /* data is a peer thread's memory, read in place: the backend synchronizes
                                 * before this worker lets go of it */
    act_storage *storage;       /* keeps data alive: the peer's storage, or the received frame as this device's memory */
    int64_t from;               /* the sender, as its message and the routing id of its link said */
    uint64_t bytes;             /* what it counts in its worker's recv_bytes */
    bool lent;                  /* it came by handle (worker processes): in the sender's segment */
    act_handle handle;
    uint64_t transfer;          /* handed over in an inbox (act_inbox.h): the transfer it is for ... */
    struct act_recv *next;      /* ... and the next region in that inbox */
} act_recv;

typedef struct act_graph act_graph;   /* a kept captured sequence (act_replay.c) */

/* Storage lent by handle, until the borrower's RELEASE (or death). */
typedef struct {
    act_storage *storage;
    int64_t to;                 /* the borrower: a device, or -1 for the controller */
} act_hold;

/* What the controller said of another device's process. */
typedef struct {
    int pid;                    /* 0: it lends nothing, its regions come as frames */
    dt_shm_peer *maps;          /* its segments mapped here (made on first use) */
} act_proc;

typedef struct act_pending {
    struct act_pending *next;
    mb_message msg;
} act_pending;

typedef struct act_worker {
    int64_t device;
    const op_backend *backend;  /* the device type's memory and kernels */
    char unusable[256];         /* why the backend's attach could not bind the device ("": it did) */
    char endpoint[256];         /* the controller's */
    bool same_process;          /* peers are threads of this process (inproc) */
    bool remote;                /* act_worker_link.remote */
    mb_keypair keys;            /* CURVE keys of its links (curve set) */
    char server_key[MB_KEY_CHARS + 1];
    bool curve;
    char token[MB_TOKEN_CHARS + 1]; /* act_worker_link.token ("" for none) */
    char peer_host[32];         /* remote: the address its peer socket binds */
    char peer_endpoint[64];     /* remote: where its peer socket is bound (told in its hello) */
    dt_idmap endpoints;         /* remote: device + 1 -> the peer endpoint the controller told (malloc'd) */
    double heard_at;            /* remote: when the controller last said anything */
    double spin_until;          /* polls without sleeping until then (act_poll) */
    double started_at;
    double silent_s, connect_s;
    bool orphaned;              /* remote: the controller has been silent too long: leave */
    atomic_uint_fast64_t *beats; /* act_worker_link.beats, or NULL */
    uint64_t *posted;           /* act_worker_link.posted, or NULL */
    bool read_peers;            /* ... and the backend copies from their memory: regions are read in place */
    bool lends;                 /* a worker process whose segments the controller and peers can map: its large
                                 * pieces live in shared memory and are lent by handle (MB_PROCESS said so) */
    dt_idmap holds;             /* hold id -> act_hold: storage lent by handle */
    uint64_t next_hold;
    dt_idmap procs;             /* device + 1 -> act_proc: the processes of the other devices */
    zsock_t *sock;              /* DEALER to the controller */
    zsock_t *peer;              /* ROUTER other workers send regions to */
    dt_idmap peers;             /* worker processes: device + 1 -> DEALER to that device's peer socket */
    zsock_t *out;               /* worker threads: one ROUTER connected to every peer sent to (made lazily) */
    dt_idmap linked;            /* worker threads: device + 1 -> non-NULL once `out` is connected to it */
    struct act_inbox *inbox;    /* worker threads: where peers hand this worker their regions (act_inbox.h) */
    dt_idmap boxes;             /* worker threads: device + 1 -> that device's inbox (a reference held) */
    dt_idmap tensors;           /* id -> act_wtensor */
    act_wtensor *spare[ACT_SPARE_TENSORS]; /* freed entries kept for the next pieces: a pipeline of
                                 * small ops makes and frees thousands in flight, past what malloc's
                                 * per-thread cache keeps */
    int nspare;
    act_storage *spare_storage[ACT_SPARE_TENSORS]; /* the same for storage records let go on this
                                 * worker's thread (with their bytes already given back) */
    int nspare_storage;
    void *small[ACT_SMALL_MAX / ACT_SMALL_STEP][ACT_SMALL_KEEP]; /* freed buffers of small pieces in
                                 * host memory, by size (about 1 MiB at most; not in pooled_bytes): the
                                 * allocator's own cache of freed blocks holds 7 of a size, and a
                                 * pipeline has hundreds in flight */
    int nsmall[ACT_SMALL_MAX / ACT_SMALL_STEP];
    dt_idmap received;          /* transfer id -> act_recv */
    uint64_t recv_bytes;        /* bytes of the regions in received */
    dt_idmap dead;              /* device + 1 -> non-NULL: devices the controller said died */
    act_pending *pending_head, *pending_tail; /* controller messages that came during a wait */
    bool leaving;               /* the controller said bye during a wait */
    uint64_t send_seq, peer_seq;
    int64_t stats[MB_NSTATS];   /* the counters a STATS record reads (mb_schema.h, MB_STATS) */
    bool tracing;               /* TRACE started: every record run is kept as an event */
    int64_t *trace;             /* (ntrace, MB_TRACE_FIELDS) events; at most ACT_TRACE_MAX, the rest dropped */
    size_t ntrace, cap_trace;
    void **trace_marks;         /* (cap_trace, 2) with a backend that has mark: each event's begin and end marks */
    void *trace_mark0;          /* ... and the mark made when tracing started, at host time trace_t0 */
    int64_t trace_t0;
    dt_idmap graphs;            /* graph id -> act_graph: captured sequences kept for replays */
    dt_idmap pins;              /* tensor id -> pin count: constants of kept sequences (act_replay.c) */
    const act_graph *replay;    /* the sequence being replayed, NULL outside one */
    uint32_t replay_at;         /* ... and which of its records runs */
    /* the reply to the batch being run */
    mb_writer reply;
    uint32_t nreply;
    int npayloads, cap_payloads;
    mb_buf *payloads;
} act_worker;

/* ---- act_worker.c: the loop ---- */
/* A worker's state with no sockets yet (act_worker_serve opens them), and its teardown. */
void act_worker_init(act_worker *w, int64_t device, const op_backend *backend, const char *endpoint);
void act_worker_fini(act_worker *w);
/* A controller message arrived while not in the main loop: MB_ABORT, MB_PROCESS, MB_RELEASE and
 * MB_BYE act at once, the rest waits in the pending queue. Takes m. */
void act_worker_defer(act_worker *w, mb_message *m);
/* Says the worker is between kernels: the controller takes a worker thread whose beats and CPU
 * time both stand still while it has work for stuck. */
void act_worker_beat(act_worker *w);
/* A remote worker: true (and dt_last_error says so) once the controller has been silent too long;
 * called where the worker waits. */
bool act_worker_orphaned(act_worker *w);

/* ---- act_worker_records.c: running a record, answering the controller ---- */
/* Runs the op record at rec (m: the message it came in, for payloads; NULL for a replayed one),
 * read straight from the bytes: rec then points past it. False for a record it cannot even read
 * (dt_last_error says why); rec is then left at the record's start, and so is it for a record read
 * in part only. */
bool act_worker_run_record(act_worker *w, mb_cursor *rec, mb_message *m);
/* "<op> failed on device N[ (op k of captured 'name')]: why" into msg. */
void act_worker_failure(const act_worker *w, char *msg, size_t size, const char *op, const char *why);
/* Drops the reply being built (its records and payload frames) without sending it. */
void act_worker_drop_reply(act_worker *w);
/* Gives back the events and marks of the device's trace (at the worker's end). */
void act_worker_trace_free(act_worker *w);

/* ---- act_worker_ops.c: the records that run kernels ---- */
/* An op record that makes a tensor from nothing but its own fields (and payloads): the tensor, or
 * its poisoned place when it could not be made. */
void act_worker_make(act_worker *w, int64_t code, mb_cursor *rec, mb_message *m);
/* COMPUTE: a registered op's kernel on this device's pieces. A poisoned input poisons the
 * outputs with its (root) message. False for a record it cannot read (dt_last_error says why). */
bool act_worker_compute(act_worker *w, mb_cursor *rec);

/* ---- act_worker_storage.c: the memory of pieces and the tensor table ---- */
/* From now on w's thread keeps the storage records and small buffers it lets go of for w's next
 * pieces; at close, no longer, and what it kept goes back. */
void act_storage_open(act_worker *w);
void act_storage_close(act_worker *w);
/* What a failed allocation of device memory says: why the device is unusable when attach said so,
 * else "out of memory on the device". */
const char *act_worker_no_memory(const act_worker *w);
/* The bytes of t's elements. */
static inline size_t act_wtensor_bytes(const act_wtensor *t)
{
    return (size_t)dt_layout_numel(t->ndim, t->shape) * dt_dtype_size(t->dtype);
}
void act_storage_release(act_storage *st);
void act_storage_free_fn(void *data, void *hint);
/* A zeroed storage record with one reference and no bytes yet (NULL when memory ran out): on a
 * worker's thread, one that thread let go of before. */
act_storage *act_storage_alloc(void);
act_storage *act_storage_new(const op_backend *backend, size_t size);
/* The storage of a new piece of size bytes: a shared segment in a worker process that lends (size
 * at least ACT_SHM_MIN), else the backend's memory. NULL when out of memory. */
act_storage *act_storage_piece(const act_worker *w, size_t size);
/* A received frame kept as storage without a copy (the backend accepted it with adopt_host);
 * takes the frame. NULL when out of memory. */
act_storage *act_storage_adopt(zmq_msg_t *frame);
/* size contiguous bytes with one of the backend's copies (to_device, to_host, copy_region). */
const char *act_copy_bytes(op_copy_fn copy, void *dst, const void *src, size_t size);
act_wtensor *act_wtensor_lookup(act_worker *w, uint64_t id, const char **why);
/* Puts t in the tensor table as id (replacing and freeing what was there), counting its bytes. */
void act_wtensor_put(act_worker *w, uint64_t id, act_wtensor *t);
/* A zeroed entry for w's tensor table (NULL when memory ran out), and its end (NULL is ignored):
 * its storage is released and the entry kept for the next one. */
act_wtensor *act_wtensor_new(act_worker *w);
void act_wtensor_free(act_worker *w, act_wtensor *t);
/* Gives t, an entry of the tensor table, the storage st instead of its own (the same bytes moved,
 * or a private copy before a write), with data at st's start; takes st's reference and lets go
 * of the old one. */
void act_wtensor_set_storage(act_worker *w, act_wtensor *t, act_storage *st);
/* Whether t's storage is t's alone and all of it (not a received frame): what a write in place
 * may write without a copy. */
bool act_wtensor_sole(const act_wtensor *t);
/* Frees the tensor id now, if the table has it (a FREE record goes through act_replay_free). */
void act_wtensor_drop(act_worker *w, uint64_t id);
/* A tensor that could not be made; ops that use it fail with this message. */
void act_wtensor_poison(act_worker *w, uint64_t id, const char *message);

/* ---- act_replay.c: captured sequences (DEFINE, REPLAY, DROP records) ---- */
bool act_replay_define(act_worker *w, mb_cursor *rec, mb_message *m);
bool act_replay_run(act_worker *w, mb_cursor *rec);
bool act_replay_drop(act_worker *w, mb_cursor *rec);
void act_replay_forget(act_worker *w, act_graph *g);
/* A FREE record: the tensor goes now, or when the last sequence that uses it is dropped. */
void act_replay_free(act_worker *w, uint64_t id);
/* " (op k of captured 'name')" while a replay runs, else "". */
const char *act_replay_where(const act_worker *w, char *buf, size_t size);
void act_replay_close(act_worker *w);

/* ---- act_peer.c: the worker's side of redistribute ---- */
int act_peer_open(act_worker *w);
void act_peer_close(act_worker *w);
/* Runs SEND and ASSEMBLE records; false for a record it cannot read. */
bool act_peer_send(act_worker *w, mb_cursor *rec);
bool act_peer_assemble(act_worker *w, mb_cursor *rec);
/* Handles every message waiting on the peer socket (stashes regions, takes releases). */
void act_peer_receive(act_worker *w);
/* Stashes the regions peer threads handed to this worker's inbox (act_inbox.h), as
 * act_peer_receive does the socket's, and says how many: the worker's loop calls it every round, so
 * what waits there is held to the stash's bounds. */
int act_peer_take_handed(act_worker *w);
/* Frees a region (its storage reference and error too); NULL is ignored. */
void act_recv_free(act_recv *r);
/* Handles one message from the peer socket as mb_recv gave it (routing id included), and closes
 * it: what act_peer_receive does with each (the fuzz target of the peer socket calls it). */
void act_peer_take(act_worker *w, mb_message *m);
/* Waits up to a poll interval for a message from a peer or the controller, and handles it (a
 * controller message through act_worker_defer): one round of a wait that needs one. It polls
 * without sleeping until *spin_until (act_poll), which the wait sets once when it starts. */
void act_peer_wait(act_worker *w, double *spin_until);
/* The DEALER to device's peer socket (worker processes), made on first use; NULL + dt_last_error. */
zsock_t *act_peer_socket(act_worker *w, int64_t device);
/* The endpoint of device's peer socket: derived from the controller's (local workers) or as the
 * controller told it (remote). false + dt_last_error when it is not known. */
bool act_peer_endpoint(const act_worker *w, int64_t device, char *buf, size_t size);

/* ---- act_shm.c: a worker process's pieces in shared memory ---- */
/* A shared segment of size bytes as storage, when w lends and the backend can use it as device
 * memory; else NULL. */
act_storage *act_shm_storage_new(const act_worker *w, size_t size);
/* Lends the bytes of t from byte `at` on to `to` (a device, or -1 for the controller) when they can
 * go by handle: w lends, bytes >= ACT_SHM_MIN, and the borrower can map w's segments. A piece not
 * in shared memory yet (a LOAD's adopted frame) moves there first, once. The handle, or segment
 * -1: send the bytes as a frame. */
act_handle act_shm_lend(act_worker *w, act_wtensor *t, size_t at, size_t bytes, int64_t to);
/* Ends a hold at once (what it lent was never sent). */
void act_shm_unlend(act_worker *w, uint64_t hold);
/* A region lent by handle becomes readable: the lender's segment mapped (waiting, if need be, to
 * hear its process from the controller) and the region checked against the segment's real size.
 * from is the device the ASSEMBLE expects it from, elem the ASSEMBLE's element size. NULL or why. */
const char *act_shm_map_region(act_worker *w, act_recv *got, int64_t from, size_t elem);
/* Tells the lender of a region received by handle that it is done with (RELEASE). */
void act_shm_give_back(act_worker *w, const act_recv *got);
/* An MB_PROCESS message from the controller, an MB_RELEASE from `from` (a device whose peer
 * socket it came on, -1: the controller's socket). Take nothing: the caller closes m. */
void act_shm_on_process(act_worker *w, mb_message *m);
void act_shm_on_release(act_worker *w, mb_message *m, int64_t from);
/* device died: ends what was lent to it, unmaps its segments. */
void act_shm_forget(act_worker *w, int64_t device);
void act_shm_close(act_worker *w);

#endif
