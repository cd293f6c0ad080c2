/* act_runtime — the one runtime of a process: its devices, their outboxes and the controller
 * actor that ships them (internal): the controller side's state, which its files share.
 *
 * The user's thread packs op records into per-device outboxes under `lock` and rings the
 * doorbell (an eventfd) when an outbox goes from empty to dirty. The controller thread takes
 * whole outboxes, sends each device its own batch as one message under a credit window, and
 * turns completions into settled futures. Workers run each device's records in order.
 */
#ifndef ACT_RUNTIME_H
#define ACT_RUNTIME_H

#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "act_common.h"
#include "dt_idmap.h"
#include "dt_shm.h"
#include "dtorch.h"
#include "mb_rid.h"
#include "mb_socket.h"
#include "mb_writer.h"

#define ACT_WINDOW 16384               /* op records in flight to one device before the controller waits for credit */
#define ACT_QUEUE_LIMIT (4 * ACT_WINDOW) /* records queued for one device before the user thread waits */
#define ACT_BATCH_MAX 4096             /* records in one outbox batch; a fuller one is sealed and a new one begun */
#define ACT_TICK_MS 20                 /* controller wakes at least this often: worker processes, unrung outboxes */
#define ACT_RING_RECORDS 64            /* records queued since the last doorbell that make the user thread ring */
#define ACT_RING_DELAY_S 0.001         /* ... or the time since the last doorbell that does */
#define ACT_HELLO_TIMEOUT_S 20.0       /* a worker that has not said hello by then is dead */
#define ACT_RUN_FD 3                   /* where a worker process finds the read end of its pipe from the controller */
#define ACT_BYE_TIMEOUT_S 2.0          /* how long shutdown waits for workers to stop before killing them */
#define ACT_STUCK_S 10.0               /* a worker thread with work that neither beats, uses CPU nor is runnable
                                        * this long is stuck in a kernel (env DTORCH_STUCK_TIMEOUT): longer
                                        * than a process's silence, since a thread waiting on a lock looks the
                                        * same from outside and 512 threads making links wait seconds for one */

/* One message's worth of records for one device. */
typedef struct act_batch {
    struct act_batch *next;
    mb_writer pk;                  /* nrecords msgpack records back to back */
    uint32_t nrecords;
    bool payload_pending;          /* a payload was attached and its record is not packed yet */
    int npayloads, cap_payloads;
    mb_buf *payloads;              /* (npayloads) frames the records refer to by index */
} act_batch;

typedef enum { ACT_DEV_STARTING, ACT_DEV_READY, ACT_DEV_DEAD } act_device_state;

typedef struct {
    int64_t id;
    char device_type[8];           /* of the meshes that name it ("cpu"): which backend its worker runs */
    act_device_state state;        /* under lock */
    char reason[512];              /* why it died, or why its worker was refused */
    /* filled by the user thread, taken by the controller, both under lock */
    act_batch *out_head, *out_tail;
    bool dirty;
    int64_t queued;                /* records not yet sent */
    /* its home */
    pthread_t thread;
    bool has_thread;
    pid_t pid;
    int lifeline;                  /* worker processes: the write end of the pipe its process watches (-1: none) */
    atomic_bool stop;              /* thread workers: leave even without a bye */
    atomic_bool thread_failed;     /* thread workers: it returned with an error (thread_error says which) */
    atomic_uint_fast64_t beats;    /* thread workers: bumped by the thread wherever it is not inside a kernel */
    uint64_t seen_beats;           /* controller thread only: beats, and the thread's CPU seconds, when it */
    double seen_cpu;               /* last showed progress ... */
    double progress_at;            /* ... at this time */
    bool abandoned;                /* its thread made no progress for the silent bound: left running */
    atomic_bool thread_running;    /* its thread has not returned yet */
    atomic_int thread_tid;         /* its thread's id (0 until it runs) */
    bool thread_failure_told;      /* controller thread only: that was turned into a death */
    char thread_error[256];
    double started_at;
    /* controller thread only */
    act_batch *send_head, *send_tail;
    int64_t in_flight;             /* records sent and not yet credited */
    uint64_t send_seq, recv_seq;
    bool hello;
    bool bye;
    double heard_at;               /* when it last sent anything (heartbeats included); 0: nothing yet */
    bool lends;                    /* its worker process was told it may lend by handle (MB_PROCESS) */
    /* a worker that came to a listening controller (dtorch-worker --devices) */
    bool remote;                   /* set before its hello; under lock */
    char host[64];                 /* as its hello said */
    char peer[64];                 /* its peer socket, "tcp://A.B.C.D:PORT" */
    int64_t remote_pid;            /* its process on its host (for messages) */
    double beat_at;                /* when the controller last told it that it is alive */
    int last_op;                   /* the op number of the last COMPUTE queued for it (-1: none), under lock */
    dt_shm_peer *maps;             /* its segments mapped here: fetched values lent by handle */
} act_device;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;           /* controller -> users: started, queues drained, stopped */
    int doorbell;                  /* eventfd: outboxes are dirty or a stop was asked */
    bool rung;                     /* the doorbell was rung and the controller has not taken outboxes since */
    uint64_t posted;               /* messages thread workers have sent the controller: a spinning look
                                    * reads this, and polls the socket (a system call) only when it moved */
    int64_t since_ring;            /* records queued since the doorbell last rang */
    double last_ring;              /* when it last rang */
    bool running;
    bool stopping;
    bool controller_up;
    int start_error;
    uint64_t epoch;                /* bumped by every start */
    uint64_t deaths;               /* devices declared dead in this run so far (under lock): a mesh
                                    * ready in this epoch since as many needs no new check */
    dt_workers workers;
    char worker_path[4096];
    char endpoint[256];
    act_device **devices;          /* (DT_MAX_DEVICE_ID + 1) by device id, NULL where unused; never moves */
    int64_t ndevices;              /* 1 + the highest device id used: loops over devices stop there */
    act_device **dirty;            /* (DT_MAX_DEVICE_ID + 1) devices whose outbox has records */
    int64_t ndirty;
    dt_idmap futures;              /* id -> pending dt_future (one reference each) */
    /* three id spaces, each counting from 1 (0 is never an id): tensors on the devices, futures
     * that completions name, and transfers of redistribute regions between workers */
    uint64_t next_tensor_id, next_future_id, next_transfer_id;
    uint64_t seed, stream;         /* random factories */
    pthread_t controller;
    zsock_t *router;               /* controller thread only: the socket every worker talks to */
    char token[MB_TOKEN_CHARS + 1]; /* worker processes of this host: the run's secret (mb_rid.h); else "" */
    uint64_t refused;              /* controller thread only: messages dropped whose routing id names no
                                    * worker of this run (another process on the run's socket) */
    double silent_s;               /* a process worker not heard from this long is dead */
    double stuck_s;                /* a worker thread making no progress this long is stuck */
    bool shm;                      /* controller thread only: worker processes may lend by handle (DTORCH_SHM=0: never) */
    /* listening for workers started elsewhere (dt_config.listen): no worker is spawned */
    bool listening;
    bool insecure;                 /* ... in plaintext, as the user asked */
    mb_keypair keys;               /* the controller's key pair (CURVE server) */
    char worker_key[MB_KEY_CHARS + 1]; /* the one client key it admits */
    char bound[256];               /* where it listens, the port filled in */
    double connect_s;              /* how long an op waits for a device's worker to connect */
    uint64_t submitted;            /* submissions so far (ops, factories, fetches, redistributes), under lock */
} act_runtime;

extern act_runtime act_rt;

/* ---- act_runtime.c: starting and stopping ---- */
/* Under the lock, before an op: the runtime started if it is not (in the worker mode DTORCH_WORKERS
 * names, unless dt_init chose one), and neither stopping nor captured by another thread; else an
 * error naming op. */
int act_runtime_ready(const char *op);
/* Under the lock: the epoch of tensors made now (the running runtime's, tagged inside a capture). */
uint64_t act_runtime_epoch(void);
/* Whether a tensor of that epoch can be used now: made by the running runtime, outside a capture
 * or inside the one running. */
bool act_runtime_epoch_live(uint64_t epoch);
/* 0 when a tensor of that epoch is still usable, else DT_ESHUTDOWN naming op (DT_EUNSUPPORTED
 * for one made inside a capture that has ended: it never held a value). */
int act_runtime_check_live(const char *op, uint64_t epoch);
/* Around a wait of the user's thread: the hooks dt_set_wait_hooks set, and whether the wait was
 * interrupted. */
void act_wait_enter(void);
void act_wait_leave(void);
bool act_wait_interrupted(void);

/* ---- act_runtime_devices.c: the devices and their workers ---- */
/* The table of devices, made once: fixed for the life of the process, the controller reads it
 * without the lock. */
int act_runtime_devices_table(void);
/* Under the lock, before an op: the workers of the meshes' devices started (or, listening, waited
 * for); fails if one is dead, or was started for a mesh of another device type. */
int act_runtime_devices_ready(const char *op, dt_mesh *const *meshes, int nmeshes);
/* Controller thread, listening: the device a worker that says hello as id comes to serve (made
 * now if no mesh named it yet). NULL when the id is out of range or out of memory. */
act_device *act_runtime_adopt(int64_t id, const char *device_type);
/* Under the lock: notes that device died (for dt_next_device_failure) and wakes its waiters. */
void act_runtime_note_failure(int64_t device, const char *reason);
/* Under the lock (between act_runtime_begin and _end): a COMPUTE of op number op is queued for
 * device; a death's message names the last one. */
static inline void act_runtime_note_op(int64_t device, int op) { act_rt.devices[device]->last_op = op; }

/* ---- act_runtime_submit.c: the user thread's side of an op ---- */
/* Starts the runtime if needed and the workers of the meshes' devices; fails if one is dead, or
 * was started for a mesh of another device type. On success the lock is held until
 * act_runtime_end. */
int act_runtime_begin(const char *op, dt_mesh *const *meshes, int nmeshes);
/* The packer of device's outbox; pack exactly one record. While the calling thread captures
 * (act_capture.h), the record goes into the capture instead. */
mb_writer *act_runtime_record(int64_t device);
/* The same, straight into the outbox even during a capture (the capture's own records). */
mb_writer *act_runtime_record_now(int64_t device);
/* Attaches a payload frame to device's current batch; returns its frame index for the record
 * that follows (pack the record right after, before another payload for the device). */
int act_runtime_payload(int64_t device, mb_buf buf);
/* Under the lock: a fresh id in each id space. */
uint64_t act_runtime_new_tensor_id(void);
uint64_t act_runtime_new_future_id(void);
uint64_t act_runtime_new_transfer_id(void);
uint64_t act_runtime_submitted(void); /* submissions since the process started */
/* Registers a pending future so completions can find it; takes a reference. */
int act_runtime_track(dt_future *f);
/* The op being submitted is waited for (a fetch, a sync): ring the doorbell at the end. */
void act_runtime_urgent(void);
/* Unlocks, rings the doorbell when it is due, and waits while queues are full. Ops are not rung
 * one by one: a doorbell is a syscall and a thread wake-up, so the user thread rings when an op
 * is waited for, every ACT_RING_RECORDS records or ACT_RING_DELAY_S, and the controller also
 * collects dirty outboxes on every wake-up (completions, its tick). */
void act_runtime_end(void);
/* Under the lock: queues a free of id on every device of mesh (an intermediate of this op). */
void act_runtime_free_now(const dt_mesh *mesh, uint64_t id);
/* Queues frees for a tensor on its devices (no doorbell: they go with the next message). */
void act_runtime_free(uint64_t epoch, dt_mesh *mesh, uint64_t id);
/* Current random stream, advanced by one per random op. Under the lock. */
void act_runtime_next_stream(uint64_t *seed, uint64_t *stream);
/* A batch's end: its records and the payload frames still its own. */
void act_batch_destroy(act_batch *b);

/* ---- act_controller.c: the controller's side of a timeline ---- */
/* The controller keeps a row [device, records, CLOCK_MONOTONIC ns] per batch it sends while on. */
void act_trace_host(bool on);
void act_trace_batch(int64_t device, int64_t records);

#endif
