/* dt_layout — the arithmetic of layouts that every layer shares: the device grid a tensor is laid
 * out over (struct dt_mesh), element counts, shape and placement checks, and the local shape and
 * global offset of the piece on every mesh coordinate (torch.chunk semantics, nested over mesh
 * dims: mesh dim 0 splits first, each later mesh dim splits the piece left by earlier ones). */
#ifndef DT_LAYOUT_H
#define DT_LAYOUT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtorch.h"

/* The insides of the public handle dt_mesh: an N-D grid of device ids. Made by dtensor/dt_mesh.c;
 * the runtime reads its ids to reach the devices. */
struct dt_mesh {
    atomic_int refs;
    char device_type[8];            /* "cpu" or "cuda" */
    int ndim;
    int64_t shape[DT_MAX_DIMS];     /* (ndim) */
    int64_t size;                   /* prod(shape) */
    int64_t *ids;                   /* (size) device ids, row-major */
    char *dim_names[DT_MAX_DIMS];   /* (ndim) or all NULL */
    size_t memory;                  /* bytes of memory of its smallest device, 0 when unknown */
    uint64_t ready_epoch;           /* runtime epoch in which its devices were last started */
    uint64_t ready_deaths;          /* ... and how many devices had died in it by then */
};

int64_t dt_layout_numel(int ndim, const int64_t *shape);

/* C-contiguous byte strides of shape for elements of elem_size bytes (an empty dim counts as 1,
 * as torch counts it, so that strides stay distinct). */
void dt_layout_strides(int ndim, const int64_t *shape, size_t elem_size, int64_t *strides);
/* A reduction's view of shape: size-1 dims dropped and neighbours merged where both are in mask (the
 * reduced dims, bit d for dim d) or both are not; the groups' sizes and whether each is reduced, in
 * order. Returns the number of groups (0 for a shape of size-1 dims only). */
int dt_layout_group_dims(int ndim, const int64_t *shape, uint32_t mask, int64_t *size, bool *reduced);

/* Row-major coordinate of the flat mesh index. */
void dt_layout_coord(int mesh_ndim, const int64_t *mesh_shape, int64_t flat, int64_t *coord);

/* Checks a shape (ndim in 0..DT_MAX_DIMS, sizes >= 0, numel fits). 0 or DT_EINVAL. */
int dt_layout_check_shape(const char *op, int ndim, const int64_t *shape);

/* Whether the region of `shape` at `offset` lies inside a piece of `piece` (ndim dims each): along
 * every dim 0 <= offset and offset + size <= the piece's size. Offsets and sizes may come from a
 * message: no value can overflow the check. */
bool dt_layout_region_inside(int ndim, const int64_t *piece, const int64_t *offset, const int64_t *shape);

/* Checks mesh_ndim placements for a tensor of tensor_ndim dims and writes them normalised
 * (Shard(-1) -> Shard(ndim-1)) to out. NULL placements mean all Replicate.
 * 0, DT_EINDEX (shard dim out of range) or DT_EINVAL (bad kind or reduce op). */
int dt_layout_check_placements(const char *op, int mesh_ndim, const dt_placement *placements, int tensor_ndim,
                         dt_placement *out);

/* Local shape and global offset of the piece at mesh coordinate coord. An empty piece's offset
 * on its dim is the size of the piece being split (as torch reports it). */
void dt_layout_block(int mesh_ndim, const int64_t *mesh_shape, const int64_t *coord, const dt_placement *pl,
                     int ndim, const int64_t *global_shape, int64_t *local_shape, int64_t *offset);

/* Formats n sizes as "[2, 3, 4]" (shapes and dims in messages). */
void dt_layout_format_sizes(char *buf, size_t size, int n, const int64_t *v);

/* Whether two meshes are the same devices in the same grid (the same device type too). */
bool dt_layout_same_mesh(const dt_mesh *a, const dt_mesh *b);

/* Formats a shape as a Python tuple: "(2, 3)", "(4,)", "()". */
void dt_layout_format_shape(int ndim, const int64_t *shape, char *buf, size_t size);

/* Formats placements like torch's str: "(Shard(dim=0), Replicate(), Partial(sum))". */
void dt_layout_format_placements(int n, const dt_placement *pl, char *buf, size_t size);

#endif
