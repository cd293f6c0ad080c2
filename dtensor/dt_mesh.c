/* dt_mesh — DeviceMesh: an N-D array of distinct device ids of one device type. */
#include <stdlib.h>
#include <string.h>

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
    return m;
nomem:
    dt_mesh_release(&m);
    dt_err(DT_ENOMEM, "DeviceMesh: out of memory");
    return NULL;
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
