/* dtn_layout — where each piece of a DTensor lives: placement checks and the local shape and
 * global offset of the piece on every mesh coordinate (torch.chunk semantics, nested over mesh
 * dims: mesh dim 0 splits first, each later mesh dim splits the piece left by earlier ones). */
#ifndef DTN_LAYOUT_H
#define DTN_LAYOUT_H

#include <stdint.h>

#include "dtorch.h"

int64_t dtn_numel(int ndim, const int64_t *shape);

/* Row-major coordinate of the flat mesh index. */
void dtn_mesh_coord(int mesh_ndim, const int64_t *mesh_shape, int64_t flat, int64_t *coord);

/* Checks a shape (ndim in 0..DT_MAX_DIMS, sizes >= 0, numel fits). 0 or DT_EINVAL. */
int dtn_check_shape(const char *op, int ndim, const int64_t *shape);

/* Checks mesh_ndim placements for a tensor of tensor_ndim dims and writes them normalised
 * (Shard(-1) -> Shard(ndim-1)) to out. NULL placements mean all Replicate.
 * 0, DT_EINDEX (shard dim out of range) or DT_EINVAL (bad kind or reduce op). */
int dtn_check_placements(const char *op, int mesh_ndim, const dt_placement *placements, int tensor_ndim,
                         dt_placement *out);

/* Local shape and global offset of the piece at mesh coordinate coord. An empty piece's offset
 * on its dim is the size of the piece being split (as torch reports it). */
void dtn_local_block(int mesh_ndim, const int64_t *mesh_shape, const int64_t *coord, const dt_placement *pl,
                     int ndim, const int64_t *global_shape, int64_t *local_shape, int64_t *offset);

/* Formats placements like torch's str: "(Shard(dim=0), Replicate(), Partial(sum))". */
void dtn_format_placements(int n, const dt_placement *pl, char *buf, size_t size);

#endif
