/* dtn_types — the insides of the public handles dt_mesh and dt_tensor (internal). */
#ifndef DTN_TYPES_H
#define DTN_TYPES_H

#include <stdatomic.h>

#include "dtorch.h"

struct dt_mesh {
    atomic_int refs;
    char device_type[8];            /* "cpu" or "cuda" */
    int ndim;
    int64_t shape[DT_MAX_DIMS];     /* (ndim) */
    int64_t size;                   /* prod(shape) */
    int64_t *ids;                   /* (size) device ids, row-major */
    char *dim_names[DT_MAX_DIMS];   /* (ndim) or all NULL */
    uint64_t ready_epoch;           /* runtime epoch in which its devices were last started */
};

struct dt_tensor {
    atomic_int refs;
    uint64_t id;                    /* the id its devices know it by */
    uint64_t epoch;                 /* runtime epoch it was created in */
    dt_mesh *mesh;                  /* owned reference */
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];     /* (ndim) global shape */
    dt_placement placements[DT_MAX_DIMS]; /* (mesh->ndim) normalised */
};

/* Handle structs come from a small per-thread free list: a calloc per op showed in profiles. */
dt_tensor *dtn_tensor_alloc(void);   /* zeroed, one reference */
void dtn_tensor_free(dt_tensor *t);   /* the struct only */

#endif
