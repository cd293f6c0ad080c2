/* dtn_tensor — the insides of the public handle dt_tensor (internal; dt_mesh's are in core/dt_layout.h). */
#ifndef DTN_TENSOR_H
#define DTN_TENSOR_H

#include <stdatomic.h>

#include "dt_layout.h"
#include "dtorch.h"

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
