/* dt_mesh — DeviceMesh: an N-D array of distinct device ids of one device type. */
#include <stdlib.h>
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dtn_tensor.h"
#include "op_backend.h"

dt_mesh *dt_mesh_new(const char *device_type, int ndim, const int64_t *shape, const int64_t *ids,
                     const char *const *dim_names)
{
    if (op_backend_check("DeviceMesh", device_type) != 0)
        return NULL;
    if (ndim < 1 || ndim > DT_MAX_DIMS) {
        dt_err(DT_EINVAL, "DeviceMesh: a mesh has 1 to %d dims, got %d", DT_MAX_DIMS, ndim);
        return NULL;
    }
    int64_t size = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1) {
            dt_err(DT_EINVAL, "DeviceMesh: mesh dim %d has size %lld; every mesh dim needs at least one device",
                   d, (long long)shape[d]);
            return NULL;
        }
        size *= shape[d];
        if (size > DT_MAX_DEVICE_ID + 1) {
            dt_err(DT_EINVAL, "DeviceMesh: too many devices (at most %d)", DT_MAX_DEVICE_ID + 1);
            return NULL;
        }
    }
    for (int64_t i = 0; i < size; i++) {
        if (ids[i] < 0 || ids[i] > DT_MAX_DEVICE_ID) {
            dt_err(DT_EINVAL, "DeviceMesh: device id %lld is out of range [0, %d]", (long long)ids[i],
                   DT_MAX_DEVICE_ID);
            return NULL;
        }
        for (int64_t j = 0; j < i; j++)
            if (ids[j] == ids[i]) {
                dt_err(DT_EINVAL, "DeviceMesh: device id %lld appears more than once", (long long)ids[i]);
                return NULL;
            }
    }
    if (dim_names)
        for (int d = 0; d < ndim; d++) {
            if (!dim_names[d] || !dim_names[d][0]) {
                dt_err(DT_EINVAL, "DeviceMesh: mesh_dim_names must be non-empty strings");
                return NULL;
            }
            for (int e = 0; e < d; e++)
                if (strcmp(dim_names[d], dim_names[e]) == 0) {
                    dt_err(DT_EINVAL, "DeviceMesh: Each mesh_dim_name must be unique ('%s' repeats)",
                           dim_names[d]);
                    return NULL;
                }
        }

    dt_mesh *m = calloc(1, sizeof *m);
    if (!m || !(m->ids = malloc((size_t)size * sizeof *m->ids)))
        goto nomem;
    atomic_init(&m->refs, 1);
    strcpy(m->device_type, device_type);
    m->ndim = ndim;
    memcpy(m->shape, shape, (size_t)ndim * sizeof *shape);
    m->size = size;
    memcpy(m->ids, ids, (size_t)size * sizeof *ids);
    if (dim_names)
        for (int d = 0; d < ndim; d++)
            if (!(m->dim_names[d] = strdup(dim_names[d])))
                goto nomem;
    const op_backend *b = op_backend_find(device_type);
    for (int64_t i = 0; b->memory_size && i < size; i++) {
        size_t bytes = b->memory_size(ids[i]);
        if (bytes && (!m->memory || bytes < m->memory))
            m->memory = bytes;
    }
    return m;
nomem:
    dt_mesh_release(&m);
    dt_err(DT_ENOMEM, "DeviceMesh: out of memory");
    return NULL;
}

/* The bytes of a piece of shape, 0 when any dim is empty (no overflow: shapes hold at most 2^48
 * elements of at most 8 bytes). */
static size_t s_piece_bytes(int ndim, const int64_t *shape, dt_dtype dtype)
{
    return (size_t)dt_layout_numel(ndim, shape) * dt_dtype_size(dtype);
}

int dtn_check_fits(const char *op, const dt_mesh *mesh, int ndim, const int64_t *shape, const dt_placement *pl,
                   dt_dtype dtype)
{
    if (!mesh->memory)
        return 0;
    /* torch.chunk gives the first piece of every split the most: coordinate 0 holds the largest */
    int64_t coord[DT_MAX_DIMS] = {0}, local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    dt_layout_block(mesh->ndim, mesh->shape, coord, pl, ndim, shape, local, offset);
    if (s_piece_bytes(ndim, local, dtype) <= mesh->memory)
        return 0;
    /* the devices may differ: the first whose piece is larger than its memory */
    const op_backend *b = op_backend_find(mesh->device_type);
    for (int64_t i = 0; i < mesh->size; i++) {
        dt_layout_coord(mesh->ndim, mesh->shape, i, coord);
        dt_layout_block(mesh->ndim, mesh->shape, coord, pl, ndim, shape, local, offset);
        size_t bytes = s_piece_bytes(ndim, local, dtype), has = b->memory_size(mesh->ids[i]);
        if (!has || bytes <= has)
            continue;
        char piece[160], whole[160];
        dt_layout_format_shape(ndim, local, piece, sizeof piece);
        dt_layout_format_shape(ndim, shape, whole, sizeof whole);
        return dt_err(DT_ENOMEM, "%s: not enough memory: the piece of device %lld, %s of shape %s (of a tensor of "
                                 "shape %s), takes %zu bytes; the device has %zu bytes of memory",
                      op, (long long)mesh->ids[i], dt_dtype_name(dtype), piece, whole, bytes, has);
    }
    return 0;
}

dt_mesh *dt_mesh_ref(dt_mesh *mesh)
{
    atomic_fetch_add(&mesh->refs, 1);
    return mesh;
}

void dt_mesh_release(dt_mesh **mesh)
{
    dt_mesh *m = *mesh;
    *mesh = NULL;
    if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    for (int d = 0; d < DT_MAX_DIMS; d++)
        free(m->dim_names[d]);
    free(m->ids);
    free(m);
}

int dt_mesh_ndim(const dt_mesh *mesh) { return mesh->ndim; }
const int64_t *dt_mesh_shape(const dt_mesh *mesh) { return mesh->shape; }
const int64_t *dt_mesh_ids(const dt_mesh *mesh) { return mesh->ids; }
int64_t dt_mesh_size(const dt_mesh *mesh) { return mesh->size; }
const char *dt_mesh_device_type(const dt_mesh *mesh) { return mesh->device_type; }
const char *dt_mesh_dim_name(const dt_mesh *mesh, int dim)
{
    return dim >= 0 && dim < mesh->ndim ? mesh->dim_names[dim] : NULL;
}
