/* act_capture — the controller's side of captured op sequences (internal).
 *
 * While the user's thread captures, every op record it packs goes into a per-device capture
 * buffer instead of the device's outbox: nothing runs. At the end each device gets its records
 * once, in a DEFINE, and keeps them (actors/worker/act_replay.c); a replay is then one REPLAY record
 * per device, whatever the number of ops. Ids the capture made, its transfers and its random
 * streams are blocks that every replay takes afresh, so replays may be in flight together.
 */
#ifndef ACT_CAPTURE_H
#define ACT_CAPTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "mb_writer.h"

/* A capture that ended: what its replays need. */
typedef struct {
    uint64_t graph;                 /* the id the devices keep it by */
    uint64_t epoch;                 /* the runtime it was defined on */
    uint64_t tensor_lo, tensors;    /* the ids it made: [tensor_lo, tensor_lo + tensors) */
    uint64_t transfers, streams;    /* how many transfer ids and random streams one run takes */
    int ndevices;
    int64_t *devices;               /* those that got records */
    uint64_t nrecords;              /* op records over all devices */
    char name[96];
} act_graph_ref;

/* Starts capturing on the calling thread (the lock must not be held). DT_EUNSUPPORTED while a
 * capture runs already, DT_ESHUTDOWN while the runtime stops. */
int act_capture_begin(const char *name);
/* Whether a capture is running; under the lock. */
bool act_capture_active(void);
/* ... and whether it is the calling thread's. */
bool act_capture_thread(void);
/* Marks the running capture as one that cannot be kept, saying why. */
void act_capture_fail(const char *why);
/* 0 outside a capture, else DT_EUNSUPPORTED saying op needs the controller and cannot be
 * captured; under the lock. */
int act_capture_refuse(const char *op);
/* The epoch of tensors made inside the running capture (0 when none); under the lock. */
uint64_t act_capture_epoch(void);
/* Whether a tensor of that epoch was made inside a capture (it holds no value). */
bool act_capture_made(uint64_t epoch);
/* Under the lock, for act_runtime: the writer of device's next captured record; a FREE of a
 * tensor of id (0: not a FREE) made before the capture is kept back instead (NULL), and sent
 * for real after the DEFINE, so nothing the records name is gone before they are kept. */
mb_writer *act_capture_record(int64_t device, uint64_t free_id);
/* Ends the capture and sends each device its DEFINE: ins are the ids of the inputs, outs of the
 * outputs (tensors it made). Also on failure the capture is over. */
int act_capture_end(const uint64_t *ins, int nins, const uint64_t *outs, int nouts, act_graph_ref **out);
/* Ends a capture without keeping anything (the captured function raised). */
void act_capture_abort(void);
/* Under the lock, at shutdown: a running capture is over, and nothing of it is sent. */
void act_capture_reset(void);
/* Queues one REPLAY per device of g; *tensor_base: where this run's ids start. */
int act_capture_replay(const act_graph_ref *g, const uint64_t *ins, int nins, uint64_t *tensor_base);
/* Tells the devices to forget g (when its runtime still runs) and frees it. */
void act_capture_drop(act_graph_ref **g);

#endif
