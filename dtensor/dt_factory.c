/* dt_factory — making DTensors: every device is sent one record that makes its own piece
 * (fills, counter-based random numbers, ranges), or the piece itself (distribute, from_local). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_capture.h"
#include "act_runtime.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dt_pool.h"
#include "dtn_tensor.h"
#include "mb_schema.h"
#include "op_backend.h"

/* Validates a factory's arguments and builds the handle (not yet known to any device). */
static dt_tensor *s_tensor_new(const char *op, dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype,
                               const dt_placement *placements)
{
    if (!mesh) {
        dt_err(DT_EINVAL, "%s: device_mesh is required", op);
        return NULL;
    }
    if (!dt_dtype_valid((int)dtype)) {
        dt_err(DT_ETYPE, "%s: unknown dtype %d", op, (int)dtype);
        return NULL;
    }
    dt_tensor *t = dtn_tensor_alloc();
    if (!t) {
        dt_err(DT_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    if (dt_layout_check_shape(op, ndim, shape) != 0 ||
        dt_layout_check_placements(op, mesh->ndim, placements, ndim, t->placements) != 0 ||
        dtn_check_fits(op, mesh, ndim, shape, t->placements, dtype) != 0) {
        dtn_tensor_free(t);
        return NULL;
    }
    t->mesh = dt_mesh_ref(mesh);
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    return t;
}

/* Starts submitting t's records; on failure releases t. */
static int s_begin(const char *op, dt_tensor **t)
{
    if (act_runtime_begin(op, &(*t)->mesh, 1) != 0) {
        dt_tensor_release(t);
        return -1;
    }
    (*t)->id = act_runtime_new_tensor_id();
    (*t)->epoch = act_runtime_epoch();
    return 0;
}

/* s_begin for a tensor made of host data, which a capture cannot hold (it would be the same
 * data on every replay: make it before, and pass it in). */
static int s_begin_load(const char *op, dt_tensor **t)
{
    if (s_begin(op, t) != 0)
        return -1;
    if (act_capture_refuse(op) != 0) {
        act_runtime_end();
        dt_tensor_release(t);
        return -1;
    }
    return 0;
}

/* One record per device that makes its piece: EMPTY, FILL or RANDOM (value.i: normal). */
static dt_tensor *s_make(const char *op, mb_op_code code, dt_mesh *mesh, int ndim, const int64_t *shape,
                         dt_dtype dtype, const dt_placement *placements, dt_scalar value)
{
    dt_tensor *t = s_tensor_new(op, mesh, ndim, shape, dtype, placements);
    if (!t)
        return NULL;
    if (code == MB_OP_RANDOM && !dt_dtype_is_float(dtype)) {
        dt_err(DT_ETYPE, "%s: expected a floating-point dtype, got %s", op, dt_dtype_name(dtype));
        dt_tensor_release(&t);
        return NULL;
    }
    if (s_begin(op, &t) != 0)
        return NULL;
    uint64_t seed = 0, stream = 0;
    if (code == MB_OP_RANDOM)
        act_runtime_next_stream(&seed, &stream);
    int64_t coord[DT_MAX_DIMS], local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    for (int64_t i = 0; i < mesh->size; i++) {
        dt_layout_coord(mesh->ndim, mesh->shape, i, coord);
        dt_layout_block(mesh->ndim, mesh->shape, coord, t->placements, ndim, t->shape, local, offset);
        mb_writer *pk = act_runtime_record(mesh->ids[i]);
        if (code == MB_OP_EMPTY)
            mb_encode_empty(pk, t->id, dtype, ndim, local);
        else if (code == MB_OP_FILL)
            mb_encode_fill(pk, t->id, dtype, ndim, local, value);
        else
            mb_encode_random(pk, t->id, dtype, ndim, local, ndim, offset, ndim, t->shape, seed, stream, value.i != 0);
    }
    act_runtime_end();
    return t;
}

dt_tensor *dt_full(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements,
                   dt_scalar value)
{
    if (dt_dtype_valid(dtype) && dt_dtype_check_value("full", dtype, value) != 0)
        return NULL;
    return s_make("full", MB_OP_FILL, mesh, ndim, shape, dtype, placements, value);
}

dt_tensor *dt_zeros(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements)
{
    return s_make("zeros", MB_OP_FILL, mesh, ndim, shape, dtype, placements, (dt_scalar){true, 0, 0.0});
}

dt_tensor *dt_ones(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements)
{
    return s_make("ones", MB_OP_FILL, mesh, ndim, shape, dtype, placements, (dt_scalar){true, 1, 1.0});
}

dt_tensor *dt_empty(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements)
{
    return s_make("empty", MB_OP_EMPTY, mesh, ndim, shape, dtype, placements, (dt_scalar){0});
}

dt_tensor *dt_rand(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements)
{
    return s_make("rand", MB_OP_RANDOM, mesh, ndim, shape, dtype, placements, (dt_scalar){true, 0, 0.0});
}

dt_tensor *dt_randn(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements)
{
    return s_make("randn", MB_OP_RANDOM, mesh, ndim, shape, dtype, placements, (dt_scalar){true, 1, 1.0});
}

static double s_as_double(dt_scalar v) { return v.is_int ? (double)v.i : v.f; }

/* Number of arange values, as torch counts them: ceil((end - start) / step). */
static int s_arange_length(dt_scalar start, dt_scalar end, dt_scalar step, int64_t *n)
{
    double fs = s_as_double(start), fe = s_as_double(end), fst = s_as_double(step);
    if (!isfinite(fs) || !isfinite(fe) || !isfinite(fst))
        return dt_err(DT_EINVAL, "arange: unsupported range: %g -> %g with step %g", fs, fe, fst);
    if (fst == 0)
        return dt_err(DT_EINVAL, "arange: step must be nonzero");
    if ((fst > 0 && fe < fs) || (fst < 0 && fe > fs))
        return dt_err(DT_EINVAL, "arange: upper bound and larger bound inconsistent with step sign");
    if (start.is_int && end.is_int && step.is_int) {
        __int128 span = (__int128)end.i - start.i, s = step.i;
        __int128 q = span / s + (span % s != 0);
        *n = q < 0 ? 0 : (int64_t)q;
    } else {
        double q = ceil((fe - fs) / fst);
        if (q > 9e15)
            return dt_err(DT_EINVAL, "arange: too many values");
        *n = q < 0 ? 0 : (int64_t)q;
    }
    return dt_layout_check_shape("arange", 1, n);
}

dt_tensor *dt_arange(dt_mesh *mesh, dt_scalar start, dt_scalar end, dt_scalar step, dt_dtype dtype,
                     const dt_placement *placements)
{
    int64_t n;
    if (s_arange_length(start, end, step, &n) != 0)
        return NULL;
    if (dtype == DT_BOOL) {
        dt_err(DT_ETYPE, "arange: not implemented for bool");
        return NULL;
    }
    dt_tensor *t = s_tensor_new("arange", mesh, 1, &n, dtype, placements);
    if (!t || s_begin("arange", &t) != 0)
        return NULL;
    int64_t coord[DT_MAX_DIMS], local, offset;
    for (int64_t i = 0; i < mesh->size; i++) {
        dt_layout_coord(mesh->ndim, mesh->shape, i, coord);
        dt_layout_block(mesh->ndim, mesh->shape, coord, t->placements, 1, t->shape, &local, &offset);
        mb_encode_arange(act_runtime_record(mesh->ids[i]), t->id, dtype, 1, &local, offset, start, step);
    }
    act_runtime_end();
    return t;
}

/* A payload buffer that several devices' messages share (replicas of one piece). A large one comes
 * from the pool, 2 MiB-aligned and advised for huge pages before the copy into it touches a page: a
 * worker thread adopts the frame as the piece's storage (weights live there, read for every token),
 * and a worker process copies a frame of its own into such memory (act_worker_ops.c: s_load). */
typedef struct {
    atomic_int refs;
    size_t size;
    void *data;          /* inline, or the pool's for DT_POOL_LARGE bytes and more */
    max_align_t inline_data[];
} s_shared;

static void s_shared_release(void *data, void *hint)
{
    s_shared *s = hint;
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    if (s->data != s->inline_data)   /* not kept: a worker process has its copy, a thread let go of it */
        dt_pool_give_back(s->data);
    free(s);
}

static s_shared *s_shared_new(size_t size)
{
    bool pooled = size >= DT_POOL_LARGE;
    s_shared *s = malloc(sizeof *s + (pooled ? 0 : size ? size : 1));
    if (!s)
        return NULL;
    atomic_init(&s->refs, 1);
    s->size = size;
    s->data = pooled ? dt_pool_alloc(size) : s->inline_data;
    if (!s->data) {
        free(s);
        return NULL;
    }
    return s;
}

/* Sends device i its piece as a payload and a LOAD record for it. */
static void s_load(const dt_tensor *t, int64_t device, const int64_t *local, s_shared *piece)
{
    atomic_fetch_add(&piece->refs, 1);
    int frame = act_runtime_payload(device, (mb_buf){piece->data, piece->size, s_shared_release, piece});
    mb_encode_load(act_runtime_record(device), t->id, t->dtype, t->ndim, local, frame);
}

/* Devices holding the same block (replicas) share one copy of it: the key is the device's index
 * over the Shard mesh dims. */
static int64_t s_block_key(const dt_tensor *t, const int64_t *coord)
{
    int64_t key = 0;
    for (int m = 0; m < t->mesh->ndim; m++)
        if (t->placements[m].kind == DT_SHARD)
            key = key * t->mesh->shape[m] + coord[m];
    return key;
}

dt_tensor *dt_distribute(dt_mesh *mesh, const void *data, int ndim, const int64_t *shape, const int64_t *strides,
                         dt_dtype dtype, const dt_placement *placements)
{
    dt_tensor *t = s_tensor_new("distribute_tensor", mesh, ndim, shape, dtype, placements);
    if (!t)
        return NULL;
    for (int i = 0; i < mesh->ndim; i++)
        if (t->placements[i].kind == DT_PARTIAL) {
            dt_err(DT_EINVAL, "distribute_tensor: Partial placements are not supported (mesh dim %d); "
                              "use from_local to give each device its partial value", i);
            dt_tensor_release(&t);
            return NULL;
        }
    size_t elem = dt_dtype_size(dtype);
    int64_t src_strides[DT_MAX_DIMS];
    if (strides)
        memcpy(src_strides, strides, (size_t)ndim * sizeof *strides);
    else
        dt_layout_strides(ndim, shape, elem, src_strides);

    int64_t nblocks = 1;
    for (int i = 0; i < mesh->ndim; i++)
        if (t->placements[i].kind == DT_SHARD)
            nblocks *= mesh->shape[i];
    s_shared **blocks = calloc((size_t)nblocks, sizeof *blocks);
    if (!blocks) {
        dt_err(DT_ENOMEM, "distribute_tensor: out of memory");
        dt_tensor_release(&t);
        return NULL;
    }
    int64_t coord[DT_MAX_DIMS], local[DT_MAX_DIMS], offset[DT_MAX_DIMS], dst_strides[DT_MAX_DIMS];
    for (int64_t i = 0; i < mesh->size; i++) {
        dt_layout_coord(mesh->ndim, mesh->shape, i, coord);
        int64_t key = s_block_key(t, coord);
        if (blocks[key])
            continue;
        dt_layout_block(mesh->ndim, mesh->shape, coord, t->placements, ndim, shape, local, offset);
        size_t bytes = (size_t)dt_layout_numel(ndim, local) * elem;
        if (!(blocks[key] = s_shared_new(bytes)))
            goto nomem;
        const char *src = data;
        for (int d = 0; d < ndim; d++)
            src += offset[d] * src_strides[d];
        /* the user's array is host memory, and so is the payload: the host backend slices it */
        dt_layout_strides(ndim, local, elem, dst_strides);
        if (bytes)
            op_backend_host()->copy_region(blocks[key]->data, dst_strides, src, src_strides, ndim, local, elem);
    }
    if (s_begin_load("distribute_tensor", &t) != 0)
        goto done;
    for (int64_t i = 0; i < mesh->size; i++) {
        dt_layout_coord(mesh->ndim, mesh->shape, i, coord);
        int64_t key = s_block_key(t, coord);
        dt_layout_block(mesh->ndim, mesh->shape, coord, t->placements, ndim, shape, local, offset);
        s_load(t, mesh->ids[i], local, blocks[key]);
    }
    act_runtime_end();
    goto done;
nomem:
    dt_err(DT_ENOMEM, "distribute_tensor: out of memory");
    dt_tensor_release(&t);
done:
    for (int64_t k = 0; k < nblocks; k++)
        if (blocks[k])
            s_shared_release(blocks[k]->data, blocks[k]);
    free(blocks);
    return t;
}

dt_tensor *dt_from_local(dt_mesh *mesh, const void *const *pieces, int ndim, const int64_t *local_shapes,
                         dt_dtype dtype, const dt_placement *placements, const int64_t *shape)
{
    if (!mesh) {
        dt_err(DT_EINVAL, "from_local: device_mesh is required");
        return NULL;
    }
    if (dt_layout_check_shape("from_local", ndim, local_shapes) != 0)
        return NULL;
    int64_t global[DT_MAX_DIMS];
    dt_placement norm[DT_MAX_DIMS];
    if (dt_layout_check_placements("from_local", mesh->ndim, placements, ndim, norm) != 0)
        return NULL;
    if (shape) {
        memcpy(global, shape, (size_t)ndim * sizeof *shape);
    } else {
        /* as torch does without shape=: assume even shards, scale by the mesh dims that shard */
        memcpy(global, local_shapes, (size_t)ndim * sizeof *global);
        for (int i = 0; i < mesh->ndim; i++)
            if (norm[i].kind == DT_SHARD)
                global[norm[i].dim] *= mesh->shape[i];
    }
    dt_tensor *t = s_tensor_new("from_local", mesh, ndim, global, dtype, norm);
    if (!t)
        return NULL;
    size_t elem = dt_dtype_size(dtype);
    int64_t coord[DT_MAX_DIMS], local[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    for (int64_t i = 0; i < mesh->size; i++) {
        dt_layout_coord(mesh->ndim, mesh->shape, i, coord);
        dt_layout_block(mesh->ndim, mesh->shape, coord, t->placements, ndim, global, local, offset);
        const int64_t *given = local_shapes + i * ndim;
        if (memcmp(local, given, (size_t)ndim * sizeof *local) != 0) {
            char want[160], got[160], whole[160];
            dt_layout_format_shape(ndim, local, want, sizeof want);
            dt_layout_format_shape(ndim, given, got, sizeof got);
            dt_layout_format_shape(ndim, global, whole, sizeof whole);
            dt_err(DT_EINVAL, "from_local: the piece for device %lld has shape %s, but the placements give "
                              "%s for a tensor of shape %s%s", (long long)mesh->ids[i], got, want, whole,
                   shape ? "" : " (pass shape= for uneven pieces)");
            dt_tensor_release(&t);
            return NULL;
        }
    }
    s_shared **copies = calloc((size_t)mesh->size, sizeof *copies);
    if (!copies)
        goto nomem;
    for (int64_t i = 0; i < mesh->size; i++) {
        size_t bytes = (size_t)dt_layout_numel(ndim, local_shapes + i * ndim) * elem;
        if (!(copies[i] = s_shared_new(bytes)))
            goto nomem;
        if (bytes)
            memcpy(copies[i]->data, pieces[i], bytes);
    }
    if (s_begin_load("from_local", &t) == 0) {
        for (int64_t i = 0; i < mesh->size; i++)
            s_load(t, mesh->ids[i], local_shapes + i * ndim, copies[i]);
        act_runtime_end();
    }
    goto done;
nomem:
    dt_err(DT_ENOMEM, "from_local: out of memory");
    dt_tensor_release(&t);
done:
    for (int64_t i = 0; copies && i < mesh->size; i++)
        if (copies[i])
            s_shared_release(copies[i]->data, copies[i]);
    free(copies);
    return t;
}
