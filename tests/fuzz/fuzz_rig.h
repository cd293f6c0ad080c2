/* What the fuzz targets of a worker (fuzz_worker, fuzz_peer) and of the controller
 * (fuzz_controller) share: a worker that runs records without sockets of its own, and a shared
 * segment that handles may name.
 *
 * The worker is a fresh act_worker per input, a worker process as far as it knows (an ipc endpoint:
 * nothing it is sent is trusted), on the CPU backend with allocations above FZ_MAX_ALLOC refused so
 * that a record cannot make the fuzzer run out of memory, nor spend its time filling a large piece
 * (every kernel is instrumented too). Its peer sockets are in-process pipes made
 * once: its own peer socket (an inproc ROUTER) and one DEALER to it that stands for each of peers
 * 0..FZ_PEERS-1, so a SEND to any of them comes back to this worker as a REGION (from device 0),
 * which a later ASSEMBLE can take. It never waits: it is leaving, so a region that has not come fails
 * its ASSEMBLE at once. Device FZ_LENDER is this process, whose segment FZ_SEG_FD (serial
 * FZ_SEG_SERIAL, FZ_SEG_SIZE bytes) a region or a value may name by handle; make_corpus names it. */
#ifndef FUZZ_RIG_H
#define FUZZ_RIG_H

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "act_worker.h"
#include "dt_shm.h"
#include "mb_codec.h"

#define FZ_MAX_ALLOC (1u << 20)
#define FZ_PEERS 4           /* devices 0..3: SENDs to them come back to the worker */
#define FZ_LENDER 1          /* the device whose process this is, for regions lent by handle */
#define FZ_SEG_FD 200        /* the segment a handle may name: this descriptor ... */
#define FZ_SEG_SERIAL 1      /* ... of the process's first segment ... */
#define FZ_SEG_SIZE (64u << 10) /* ... of this many bytes (floats 0, 1, 2, ...) */

static const op_backend *fz_cpu;
static op_backend fz_limited;

static inline void *fz_alloc(size_t size) { return size > FZ_MAX_ALLOC ? NULL : fz_cpu->alloc(size); }

/* The segment, made once as this process's first (so its serial is FZ_SEG_SERIAL) and moved to
 * descriptor FZ_SEG_FD, where the seeds name it. */
static inline void fz_segment(void)
{
    static dt_shm_seg *seg;
    if (seg)
        return;
    seg = dt_shm_seg_new(FZ_SEG_SIZE);
    if (!seg || dup2(seg->fd, FZ_SEG_FD) != FZ_SEG_FD)
        abort();
    close(seg->fd);
    seg->fd = FZ_SEG_FD;
    float *v = seg->data;
    for (size_t i = 0; i < FZ_SEG_SIZE / sizeof *v; i++)
        v[i] = (float)i;
}

static zsock_t *fz_peer_socket, *fz_to_peer;

/* At exit: the rig's sockets go before ZeroMQ's context does. */
static inline void fz_rig_end(void)
{
    mb_socket_destroy(&fz_to_peer);
    mb_socket_destroy(&fz_peer_socket);
}

/* A fresh worker, device 0, with the rig's peer sockets. */
static inline void fz_worker_open(act_worker *w)
{
    if (!fz_cpu) {
        fz_segment();
        fz_cpu = op_backend_find("cpu");
        fz_limited = *fz_cpu;
        fz_limited.alloc = fz_alloc;
        fz_peer_socket = mb_socket_new(MB_ROUTER, "inproc://fuzz-peer", true, NULL);
        fz_to_peer = mb_socket_new(MB_DEALER, "inproc://fuzz-peer", false, "w0");
        if (!fz_peer_socket || !fz_to_peer)
            abort();
        atexit(fz_rig_end);
    }
    act_worker_init(w, 0, &fz_limited, "ipc://fuzz-harness");
    w->peer = fz_peer_socket;
    for (uint64_t d = 0; d < FZ_PEERS; d++)
        dt_idmap_put(&w->peers, d + 1, fz_to_peer);
    w->leaving = true;
    act_proc *lender = calloc(1, sizeof *lender);
    if (lender) {
        lender->pid = (int)getpid();
        if (dt_idmap_put(&w->procs, FZ_LENDER + 1, lender) != 0)
            free(lender);
    }
}

/* Ends the worker, after taking in what its SENDs still have on the way; the rig's sockets stay. */
static inline void fz_worker_close(act_worker *w)
{
    act_peer_receive(w);
    for (uint64_t d = 0; d < FZ_PEERS; d++)
        dt_idmap_take(&w->peers, d + 1);
    w->peer = NULL;
    act_worker_fini(w);
}

/* Whether a record is a SEND to a device outside the rig (which would make a socket of its own). */
static inline bool fz_leaves_rig(const mb_cursor *rec)
{
    int64_t code;
    uint64_t to;
    return mb_record_code(rec, &code) == 0 && code == MB_OP_SEND && mb_field_u64(rec, 3, &to) && to >= FZ_PEERS &&
           to <= DT_MAX_DEVICE_ID;
}

/* Runs up to count op records of body on w, in order, as the worker's batch loop does (m: the
 * message they came in, for its payload frames), taking in the region a SEND posts after it. */
static inline void fz_run(act_worker *w, const uint8_t *body, size_t size, uint32_t count, mb_message *m)
{
    mb_body_reader r;
    if (mb_body_init(&r, body, size, count) != 0)
        return;
    mb_cursor rec;
    while (mb_body_next(&r, &rec) == 1) {
        int64_t code;
        bool send = mb_record_code(&rec, &code) == 0 && code == MB_OP_SEND;
        if (fz_leaves_rig(&rec))
            continue;
        (void)act_worker_run_record(w, &rec, m);
        act_worker_drop_reply(w);
        mb_body_read(&r, &rec); /* as the worker's batch loop: a record read whole is not read again */
        if (send)
            act_peer_receive(w);
    }
}

/* A message of frames from bytes, as mb_recv gives one (close it with mb_message_close): the body,
 * and npayloads payload frames of the given sizes, taken in turn from data. */
static inline void fz_message(mb_message *m, const mb_header *h, const void *body, size_t body_size, const uint8_t *data,
                       const size_t *sizes, int npayloads)
{
    memset(m, 0, sizeof *m);
    m->header = *h;
    zmq_msg_init_size(&m->body, body_size);
    if (body_size)
        memcpy(zmq_msg_data(&m->body), body, body_size);
    m->payloads = calloc(npayloads ? (size_t)npayloads : 1, sizeof *m->payloads);
    if (!m->payloads)
        abort();
    m->npayloads = npayloads;
    for (int i = 0; i < npayloads; i++) {
        zmq_msg_init_size(&m->payloads[i], sizes[i]);
        if (sizes[i])
            memcpy(zmq_msg_data(&m->payloads[i]), data, sizes[i]);
        data += sizes[i];
    }
}

#endif
