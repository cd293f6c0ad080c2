/* dtn_plan — the redistribute planner: how to go from one layout of a tensor to another (other
 * placements, or another mesh) in steps that devices run among themselves.
 *
 * A step turns layout `from` into layout `to`. Every device of `to` builds its new piece from
 * parts: regions of pieces that devices of `from` hold, copied (or, in a reduce step, combined
 * with the reduce op) into place. A part whose source device is the destination itself is a
 * local copy; any other is a point-to-point transfer, worker to worker. With one primitive,
 * all-gather, all-to-all, local slicing and cross-mesh moves all move exactly the bytes the
 * destination lacks; reduce steps combine one Partial mesh dim each, inner mesh dims first.
 */
#ifndef DTN_PLAN_H
#define DTN_PLAN_H

#include <stdint.h>

#include "dtorch.h"
#include "mb_schema.h"

typedef struct {
    const dt_mesh *mesh;
    dt_placement pl[DT_MAX_DIMS]; /* (mesh ndim) normalised */
} dtn_layout;

typedef struct {
    int32_t mode;                      /* mb_part_mode */
    int32_t op;                        /* dt_reduce_op of a REDUCE */
    int64_t src_device;                /* who holds the source piece (the destination: local) */
    int64_t src_offset[DT_MAX_DIMS];   /* region start in the source's piece */
    int64_t dst_offset[DT_MAX_DIMS];   /* region start in the destination's piece */
    int64_t shape[DT_MAX_DIMS];        /* region shape */
    int64_t divisor;                   /* DIV */
} dtn_part;

typedef struct {
    int64_t device;                    /* destination device */
    int64_t shape[DT_MAX_DIMS];        /* its new local shape */
    int nparts;
    dtn_part *parts;
} dtn_piece;

typedef struct {
    dtn_layout from, to;
    const char *kind;                  /* "all_gather", "all_to_all", "all_reduce", "reduce_scatter", "local", "p2p" */
    int mesh_dim;                      /* the mesh dim it works along, -1 when several or across meshes */
    int reduce_dim;                    /* the Partial mesh dim it reduces, or -1 */
    int npieces;                       /* one per device of to.mesh */
    dtn_piece *pieces;
    int64_t remote_elements;           /* elements that cross between devices */
} dtn_step;

#define DTN_MAX_STEPS (DT_MAX_DIMS + 1)

typedef struct {
    int ndim;
    int64_t shape[DT_MAX_DIMS];        /* the global shape */
    int nsteps;
    dtn_step steps[DTN_MAX_STEPS];
} dtn_plan;

/* Plans src -> dst for a tensor of global shape; the layouts' placements must be normalised and
 * valid (the caller checks). 0 or DT_ENOMEM. A plan with no steps means nothing changes. */
int dtn_plan_make(int ndim, const int64_t *shape, size_t elem_size, const dtn_layout *src, const dtn_layout *dst,
                  dtn_plan *plan);
void dtn_plan_free(dtn_plan *plan);
/* Steps that move data between devices (what PyTorch counts as collectives). */
int dtn_plan_collectives(const dtn_plan *plan);

#endif
