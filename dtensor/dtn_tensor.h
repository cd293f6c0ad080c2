/* dtn_tensor — the insides of the public handle dt_tensor (internal; dt_mesh's are in core/dt_layout.h). */
#ifndef DTN_TENSOR_H
#define DTN_TENSOR_H

#include <stdatomic.h>

#include "dt_layout.h"
#include "dtorch.h"
#include "op_registry.h"

/* How a strided view made on the controller reads its base's pieces (op_def.strided): through map
 * from its frame, the contiguous run of each base piece from view_first on laid out as frame_shape
 * under frame_pl (the base itself, or the contiguous view the first strided op read). */
typedef struct {
    int64_t frame_shape[DT_MAX_DIMS];
    dt_placement frame_pl[DT_MAX_DIMS];
    op_strided map;
} dtn_strided;

/* dt_tensor.holds: its references in the low 32 bits, the live views made of it (below) in the
 * high 32, one word so that a view takes and drops its hold on the base and counts itself in one
 * atomic operation each (a locked operation is tens of cycles: five of them were most of an x[0]'s
 * release) */
#define DTN_VIEW ((uint64_t)1 << 32)
#define DTN_REFS(holds) ((holds) & (DTN_VIEW - 1))
#define DTN_VIEWS(holds) ((holds) >> 32)

struct dt_tensor {
    _Atomic uint64_t holds;
    uint64_t id;                    /* the id its devices know it by */
    uint64_t epoch;                 /* runtime epoch it was created in */
    dt_mesh *mesh;                  /* owned reference; a view borrows its base's */
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];     /* (ndim) global shape */
    dt_placement placements[DT_MAX_DIMS]; /* (mesh->ndim) normalised */
    /* A view made on the controller alone (dt_op_run, op_def.view and .strided): it has no pieces
     * of its own (id 0) and reads those base had when the view was made (base_id): each device's
     * piece is the contiguous run of that piece that starts view_first elements in (none when it
     * is empty), or for a strided view what its map reads of that run. base has pieces of its own
     * (base->base is NULL); the view holds a reference to it. NULL for a tensor with pieces of its
     * own. */
    dt_tensor *base;
    uint64_t base_id;
    int64_t view_first;
    dtn_strided *strided;           /* owned; NULL but for a strided view (it then reads its frame) */
    /* is_contiguous, as torch's view would answer: made by view ops out of row-major order, kept
     * once it has pieces. How it reads in those terms is strided's map, but where layout says
     * otherwise: the map onto a row-major frame that torch's view would have (owned; set for a
     * view op's copy out of row-major order, a strided view given pieces, and a view made of a
     * tensor that has one), so that the views made of it answer as torch's do. */
    bool noncontiguous;
    dtn_strided *layout;
    /* Of a tensor with pieces: whether it has ever been written in place (then no view is made of
     * it on the controller: a write would show through), and the id of the pieces a first write
     * left to its live views (DTN_VIEWS(holds): they read its pieces as they were when made; it
     * wrote into a copy, dtn_tensor_retire), freed with the last of them. */
    bool written;
    _Atomic uint64_t retired;
};

/* Handle structs come from a small per-thread free list: a calloc per op showed in profiles. */
dt_tensor *dtn_tensor_alloc(void);   /* zeroed, one reference */
void dtn_tensor_free(dt_tensor *t);   /* the struct only */
dtn_strided *dtn_strided_alloc(void); /* uninitialised; NULL when out of memory */
void dtn_strided_free(dtn_strided *s);   /* NULL is nothing to free */

/* A view made on the controller of base (which has pieces of its own, never written in place): a
 * handle of the given metadata reading the pieces base_id names (base's, or those a view of base
 * reads) from first elements in. NULL when out of memory. */
dt_tensor *dtn_tensor_view(dt_tensor *base, uint64_t base_id, int64_t first, dt_dtype dtype, int ndim,
                           const int64_t *shape, const dt_placement *placements);
/* t (with pieces of its own) is about to be written in place under a new id, its old pieces kept
 * for the views made of it on the controller: whether it must be (live views read its pieces
 * now). When true the caller gives t the new id and dtn_tensor_retire gets the old one. */
bool dtn_tensor_viewed(dt_tensor *t);

/* 0 when a tensor of shape, dtype and placements pl (normalised) fits on mesh: no device's piece is
 * larger than that device's memory (op_backend memory_size; a device that cannot tell is not
 * checked); else DT_ENOMEM naming op, the piece's bytes and the limit. Every op that makes pieces
 * asks it before it sends a record, so a piece that cannot fit is refused at the call site, the
 * same way whatever the workers' home (dtensor/dt_mesh.c). */
int dtn_check_fits(const char *op, const dt_mesh *mesh, int ndim, const int64_t *shape, const dt_placement *pl,
                   dt_dtype dtype);
void dtn_tensor_retire(dt_tensor *t, uint64_t old_id);
/* A view given pieces of its own lets go of its base and of its map, and holds its mesh itself. */
void dtn_tensor_unview(dt_tensor *view);

#endif
