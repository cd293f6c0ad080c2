/* dtn_viewmemo — the views dt_op_run made, remembered by what decides them. Whether a view op's
 * output is a view of its input made on the controller alone, and which (shape, placements, where
 * it starts, its map), follows from the op, its integer attributes, the input's shape, dtype and
 * placements and the mesh's shape; working it out again (the call, infer, shard, the map and its
 * uniformity over the mesh) is most of a transpose's cost. A view op called again with the same of
 * these gets the plan kept the first time, as PyTorch DTensor keeps its sharding propagation per
 * op schema. What can change between calls (the runtime, a capture, the base written in place) is
 * still asked at every call (dt_op_run). Each thread keeps its own table: no lock, nothing shared. */
#ifndef DTN_VIEWMEMO_H
#define DTN_VIEWMEMO_H

#include <stdbool.h>
#include <stdint.h>

#include "dtn_tensor.h"
#include "op_registry.h"

/* What a view op makes of its input: output 0 (shape, dtype, placements), where its run starts in
 * the input's, and for a strided view that is not one run, its map of the input's frame. */
typedef struct {
    op_arg out;
    int64_t first;
    bool strided;       /* map holds (not the identity of the frame) */
    bool noncontiguous; /* the map reads out of row-major order (dt_tensor_is_contiguous) */
    op_strided map;
} dtn_view_plan;

/* Words: one of counts, the mesh's shape, the input's shape, its placements, the attributes. */
#define DTN_VIEWMEMO_WORDS (1 + 3 * DT_MAX_DIMS + OP_MAX_INTS)

typedef struct {
    int nwords;
    uint64_t hash;
    uint64_t words[DTN_VIEWMEMO_WORDS];
} dtn_view_key;

/* The key of a call of def on x with attrs (NULL: none), or false when a plan is never kept for
 * such a call: def makes no views, x is a strided view itself or reads out of row-major order
 * (dt_tensor.layout), or the attributes hold floats or a scalar, or more integers than an op takes. */
bool dtn_viewmemo_key(const op_def *def, const dt_tensor *x, const op_attrs *attrs, dtn_view_key *key);
/* The plan kept under key on this thread, or NULL. Valid until this thread's next _keep. */
const dtn_view_plan *dtn_viewmemo_find(const dtn_view_key *key);
/* Keeps plan under key on this thread (in the place of whatever was kept where it falls); nothing
 * when the table cannot be allocated. */
void dtn_viewmemo_keep(const dtn_view_key *key, const dtn_view_plan *plan);

#endif
