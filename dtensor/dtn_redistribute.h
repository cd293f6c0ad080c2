/* dtn_redistribute — redistribute as the other dtensor modules use it (dt_redistribute.c): emitted
 * inline inside another op's submission, and priced for the op rules' choice of placements. */
#ifndef DTN_REDISTRIBUTE_H
#define DTN_REDISTRIBUTE_H

#include <stdint.h>

#include "dtorch.h"

/* Between act_runtime_begin and _end on t's mesh: emits the records that lay t out with
 * placements as a new tensor on the same mesh and returns its id (t's own id when nothing
 * changes, 0 when planning failed); *nsteps tells how many steps it took. */
uint64_t dtn_redistribute_inline(const dt_tensor *t, const dt_placement *placements, int *nsteps);
/* Bytes a redistribute from -> to on mesh would move between devices (the cost ops minimise);
 * an op_cost_fn. */
int64_t dtn_redistribute_cost(const dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype,
                              const dt_placement *from, const dt_placement *to);

#endif
