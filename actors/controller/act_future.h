/* act_future — the controller's side of a dt_future: which pieces it waits for, where each
 * piece goes when it arrives, and how Partial pieces are combined (internal). */
#ifndef ACT_FUTURE_H
#define ACT_FUTURE_H

#include <pthread.h>
#include <stdatomic.h>

#include "dtorch.h"

typedef enum {
    ACT_FETCH_FULL = 0,   /* one global value assembled from pieces, Partial reduced */
    ACT_FETCH_LOCALS = 1, /* every device's own piece, kept apart */
    ACT_SYNC = 2,         /* no value: completes when every device has run what came before */
} act_future_kind;

typedef struct {
    int64_t device;                /* device id the piece comes from */
    int64_t mesh_index;            /* flat row-major index in the mesh */
    int64_t shape[DT_MAX_DIMS];    /* (ndim) local shape */
    int64_t offset[DT_MAX_DIMS];   /* (ndim) global offset */
    void *data;                    /* kept pieces (LOCALS, Partial FULL): C-contiguous copy */
    bool arrived;
} act_piece;

typedef struct {
    void (*fn)(dt_future *f, void *arg);
    void *arg;
} act_callback;

struct dt_future {
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int status;                    /* 1 pending, 0 ready, < 0 failed with that code */
    char *error;                   /* message of a failure */
    uint64_t id;                   /* the id devices echo in completions */
    act_future_kind kind;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];    /* (ndim) global shape (FULL) */
    void *data;                    /* (shape) the FULL value, C-contiguous */
    size_t data_size;              /* its bytes */
    int npieces;
    int remaining;                 /* pieces not yet arrived */
    act_piece *pieces;             /* (npieces) */
    int mesh_ndim;
    int64_t mesh_shape[DT_MAX_DIMS];
    dt_placement placements[DT_MAX_DIMS];
    bool has_partial;
    int ncallbacks;
    act_callback *callbacks;
};

/* A pending future of npieces pieces (allocated, zeroed) with one reference for the caller. */
dt_future *act_future_new(act_future_kind kind, int npieces);
/* Allocates the FULL value buffer; 0 or DT_ENOMEM. */
int act_future_alloc_value(dt_future *f);
/* A piece arrived (controller thread). Checks it against what was asked for, places it, and
 * completes the future when it was the last. Returns 0, or an error code after failing f. */
int act_future_add_piece(dt_future *f, int piece, dt_dtype dtype, int ndim, const int64_t *shape,
                         const void *data, size_t size);
/* Fails a pending future (no-op when it already completed); runs its callbacks. */
void act_future_fail(dt_future *f, int code, const char *message);

#endif
