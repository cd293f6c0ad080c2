/* dt_layout — layout arithmetic: element counts, strides, shape and placement checks, torch.chunk blocks. */
#include "dt_layout.h"

#include <stdio.h>
#include <string.h>

#include "dt_error.h"

static const char *s_reduce_names[] = {"sum", "avg", "max", "min"};

dt_placement dt_shard(int32_t dim) { return (dt_placement){DT_SHARD, dim, 0}; }
dt_placement dt_replicate(void) { return (dt_placement){DT_REPLICATE, 0, 0}; }
dt_placement dt_partial(dt_reduce_op op) { return (dt_placement){DT_PARTIAL, 0, op}; }

int64_t dt_layout_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

int dt_layout_group_dims(int ndim, const int64_t *shape, uint32_t mask, int64_t *size, bool *reduced)
{
    int groups = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1)
            continue;
        bool r = (mask >> d) & 1u;
        if (groups > 0 && reduced[groups - 1] == r) {
            size[groups - 1] *= shape[d];
        } else {
            size[groups] = shape[d];
            reduced[groups++] = r;
        }
    }
    return groups;
}

void dt_layout_strides(int ndim, const int64_t *shape, size_t elem_size, int64_t *strides)
{
    int64_t s = (int64_t)elem_size;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = s;
        /* only an empty shape's product can pass int64 (a checked shape has at most 2^48 elements,
         * but any size beside a 0): its strides are never stepped along, so they stop at INT64_MAX */
        if (__builtin_mul_overflow(s, shape[d] > 1 ? shape[d] : 1, &s))
            s = INT64_MAX;
    }
}

void dt_layout_coord(int mesh_ndim, const int64_t *mesh_shape, int64_t flat, int64_t *coord)
{
    for (int d = mesh_ndim - 1; d >= 0; d--) {
        coord[d] = flat % mesh_shape[d];
        flat /= mesh_shape[d];
    }
}

int dt_layout_check_shape(const char *op, int ndim, const int64_t *shape)
{
    if (ndim < 0 || ndim > DT_MAX_DIMS)
        return dt_err(DT_EINVAL, "%s: tensors have 0 to %d dims, got %d", op, DT_MAX_DIMS, ndim);
    /* a checked product, not a division by each size: this runs for every record a worker reads and
     * every op the controller plans, and a 64-bit division costs tens of cycles */
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return dt_err(DT_EINVAL, "%s: negative dimension %lld at index %d of the size",
                          op, (long long)shape[d], d);
        if (__builtin_mul_overflow(numel, shape[d], &numel) || numel > (INT64_C(1) << 48))
            return dt_err(DT_EINVAL, "%s: size too large (more than 2^48 elements)", op);
    }
    return 0;
}

bool dt_layout_region_inside(int ndim, const int64_t *piece, const int64_t *offset, const int64_t *shape)
{
    /* offset <= piece - size, with 0 <= size <= piece: no sum that could wrap */
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0 || shape[d] > piece[d] || offset[d] < 0 || offset[d] > piece[d] - shape[d])
            return false;
    return true;
}

int dt_layout_check_placements(const char *op, int mesh_ndim, const dt_placement *placements, int tensor_ndim,
                         dt_placement *out)
{
    for (int i = 0; i < mesh_ndim; i++) {
        dt_placement p = placements ? placements[i] : dt_replicate();
        switch (p.kind) {
        case DT_SHARD:
            if (p.dim < -tensor_ndim || p.dim >= tensor_ndim)
                return dt_err(DT_EINDEX,
                              "%s: Shard(dim=%d) on mesh dim %d is out of range for a tensor of %d dims "
                              "(expected a dim in [%d, %d])",
                              op, p.dim, i, tensor_ndim, -tensor_ndim, tensor_ndim - 1);
            if (p.dim < 0)
                p.dim += tensor_ndim;
            p.reduce_op = 0;
            break;
        case DT_REPLICATE:
            p.dim = 0;
            p.reduce_op = 0;
            break;
        case DT_PARTIAL:
            if (p.reduce_op < DT_REDUCE_SUM || p.reduce_op > DT_REDUCE_MIN)
                return dt_err(DT_EINVAL, "%s: unknown Partial reduce op %d on mesh dim %d", op, p.reduce_op, i);
            p.dim = 0;
            break;
        default:
            return dt_err(DT_EINVAL, "%s: unknown placement kind %d on mesh dim %d", op, p.kind, i);
        }
        out[i] = p;
    }
    return 0;
}

void dt_layout_block(int mesh_ndim, const int64_t *mesh_shape, const int64_t *coord, const dt_placement *pl,
                     int ndim, const int64_t *global_shape, int64_t *local_shape, int64_t *offset)
{
    for (int d = 0; d < ndim; d++) {
        local_shape[d] = global_shape[d];
        offset[d] = 0;
    }
    for (int i = 0; i < mesh_ndim; i++) {
        if (pl[i].kind != DT_SHARD)
            continue;
        int d = pl[i].dim;
        int64_t n = local_shape[d], k = mesh_shape[i];
        int64_t chunk = (n + k - 1) / k; /* torch.chunk: ceil(n/k), trailing pieces may be short or empty */
        int64_t start = coord[i] * chunk;
        if (start > n)
            start = n;
        int64_t size = n - start < chunk ? n - start : chunk;
        offset[d] += start;
        local_shape[d] = size;
    }
}

void dt_layout_format_placements(int n, const dt_placement *pl, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < n && used < size; i++) {
        const char *sep = i + 1 < n || n == 1 ? (n == 1 ? ",)" : ", ") : ")";
        if (pl[i].kind == DT_SHARD)
            used += (size_t)snprintf(buf + used, size - used, "Shard(dim=%d)%s", pl[i].dim, sep);
        else if (pl[i].kind == DT_REPLICATE)
            used += (size_t)snprintf(buf + used, size - used, "Replicate()%s", sep);
        else
            used += (size_t)snprintf(buf + used, size - used, "Partial(%s)%s",
                                     s_reduce_names[pl[i].reduce_op & 3], sep);
    }
}

void dt_layout_format_sizes(char *buf, size_t size, int n, const int64_t *v)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)v[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

bool dt_layout_same_mesh(const dt_mesh *a, const dt_mesh *b)
{
    return a == b || (a->ndim == b->ndim && a->size == b->size && !strcmp(a->device_type, b->device_type) &&
                      !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape) &&
                      !memcmp(a->ids, b->ids, (size_t)a->size * sizeof *a->ids));
}

void dt_layout_format_shape(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < size)
        snprintf(buf + used, size - used, ndim == 1 ? ",)" : ")");
}
