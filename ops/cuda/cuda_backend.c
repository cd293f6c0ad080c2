/* cuda_backend — the CUDA device backend: the op_backend table on one GPU per actor.
 *
 * Each worker thread (or process) attaches once: its context (cuda_ops.h) is thread-local, so the
 * table needs no device argument. Device id d runs on GPU d % (the GPU count), or on entry
 * d % n of DTORCH_CUDA_DEVICES (a comma-separated list of ordinals); several actors may share a GPU.
 *
 * Memory comes from the device's stream-ordered pool (cudaMallocAsync / cudaFreeAsync on the
 * compute stream; the pool keeps what is freed instead of giving it back at every
 * synchronisation). Kernels, products and copies between pieces are queued on the compute stream
 * and return at once; copies to and from host memory run on the communication stream after an
 * event recorded on the compute stream, and finish before they return (the host buffers are the
 * caller's). synchronize waits for both streams and reports the first asynchronous failure.
 *
 * There is no adopt_host or host_view: device memory is not host memory, so received frames are
 * copied in and values are copied out. Thread workers on the same GPU read each other's pieces in
 * place (copy_from_peer, combine; peer_can_read says which peers): the sender synchronizes
 * before it hands a piece over and the reader before it lets go of it, so neither stream's work
 * outlives the other's use; a piece whose last reference goes on another thread is freed after
 * its device has finished everything queued (free_elsewhere). Actors on different GPUs, and
 * worker processes, send each other regions as frames. */
#include "cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

static _Thread_local cuda_ctx s_ctx;
static _Thread_local bool s_attached;
static _Thread_local char s_unusable[320]; /* why attach could not bind a device: s_msg and a prefix */
static _Thread_local char s_msg[256];

static const char *const s_oom = "out of memory on the device";

const char *cuda_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return NULL;
    snprintf(s_msg, sizeof s_msg, "%s: %s", what, cudaGetErrorString(e));
    cudaGetLastError(); /* a failure that is not sticky is not reported again by the next call */
    return s_msg;
}

cuda_ctx *cuda_ctx_get(const char **why)
{
    if (s_attached)
        return &s_ctx;
    *why = s_unusable[0] ? s_unusable : "the CUDA backend is not attached to a device on this thread (internal error)";
    return NULL;
}

const char *cuda_scratch(cuda_ctx *c, size_t bytes, void **out)
{
    *out = NULL;
    if (cudaMallocAsync(out, bytes ? bytes : 1, c->compute) != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return s_oom;
    }
    return NULL;
}

void cuda_scratch_free(cuda_ctx *c, void *p)
{
    if (p)
        cudaFreeAsync(p, c->compute);
}

/* ---- the actor's device ---------------------------------------------------------------------- */

/* The GPU of device id: entry id % n of DTORCH_CUDA_DEVICES when it lists n ordinals, else id % count. */
static int s_ordinal(int64_t id, int count)
{
    const char *env = getenv("DTORCH_CUDA_DEVICES");
    int list[64], n = 0;
    for (const char *p = env; p && *p && n < 64;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= count)
            break;
        list[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    return n ? list[id % n] : (int)(id % count);
}

/* The GPU's memory, asked of its properties, which takes no context on it (the controller asks
 * this of the GPU a device id stands for, from any thread); kept per ordinal. */
static size_t s_memory_size(int64_t device_id)
{
    static _Atomic size_t known[64];
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        cudaGetLastError();
        return 0;
    }
    int ordinal = s_ordinal(device_id < 0 ? 0 : device_id, count);
    size_t bytes = ordinal < 64 ? known[ordinal] : 0;
    struct cudaDeviceProp prop;
    if (bytes == 0 && cudaGetDeviceProperties(&prop, ordinal) == cudaSuccess) {
        bytes = prop.totalGlobalMem;
        if (ordinal < 64)
            known[ordinal] = bytes;
    }
    cudaGetLastError();
    return bytes;
}

static const char *s_attach(int64_t device_id)
{
    if (s_attached)
        return NULL;
    s_unusable[0] = '\0';
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        snprintf(s_unusable, sizeof s_unusable, "no CUDA device: %s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
        cudaGetLastError();
        return s_unusable;
    }
    cuda_ctx c = {.ordinal = s_ordinal(device_id < 0 ? 0 : device_id, count)};
    const char *why = cuda_check(cudaSetDevice(c.ordinal), "cudaSetDevice");
    if (!why)
        why = cuda_check(cudaStreamCreateWithFlags(&c.compute, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!why)
        why = cuda_check(cudaStreamCreateWithFlags(&c.comm, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!why)
        why = cuda_check(cudaEventCreateWithFlags(&c.computed, cudaEventDisableTiming), "cudaEventCreate");
    cudaMemPool_t pool;
    if (!why && cudaDeviceGetDefaultMemPool(&pool, c.ordinal) == cudaSuccess) {
        uint64_t keep = UINT64_MAX; /* freed memory stays in the pool for the next piece */
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
    if (why) {
        snprintf(s_unusable, sizeof s_unusable, "CUDA device %d: %s", c.ordinal, why);
        return s_unusable;
    }
    s_ctx = c;
    s_attached = true;
    return NULL;
}

static void s_detach(void)
{
    if (!s_attached)
        return;
    cudaStreamSynchronize(s_ctx.compute);
    cudaStreamSynchronize(s_ctx.comm);
    cuda_blas_release(&s_ctx);
    cudaEventDestroy(s_ctx.computed);
    cudaStreamDestroy(s_ctx.comm);
    cudaStreamDestroy(s_ctx.compute);
    cudaGetLastError();
    s_ctx = (cuda_ctx){0};
    s_attached = false;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static void *s_alloc(size_t size)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    void *p = NULL;
    return c && !cuda_scratch(c, size, &p) ? p : NULL;
}

/* A piece freed on a thread without a context (none does so today) is freed synchronously. */
static void s_free(void *data, size_t size)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!data)
        return;
    if (c)
        cudaFreeAsync(data, c->compute);
    else
        cudaFree(data);
}

/* Freed on a thread other than the one that allocated it (a peer thread held the last reference):
 * the allocating actor may still have work queued that uses it, on a stream this thread does not
 * own, so its device finishes everything first. */
static void s_free_elsewhere(void *data, size_t size)
{
    if (!data)
        return;
    struct cudaPointerAttributes at;
    int was = -1, ordinal = cudaPointerGetAttributes(&at, data) == cudaSuccess ? at.device : -1;
    cudaGetDevice(&was);
    if (ordinal >= 0 && ordinal != was)
        cudaSetDevice(ordinal);
    cudaDeviceSynchronize();
    cudaFree(data);
    if (ordinal >= 0 && ordinal != was && was >= 0)
        cudaSetDevice(was);
    cudaGetLastError();
}

/* Whether the thread worker of device_id runs on this thread's GPU (and so reads its memory). */
static bool s_peer_can_read(int64_t device_id)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    int count = 0;
    if (!c || device_id < 0 || cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        cudaGetLastError();
        return false;
    }
    return s_ordinal(device_id, count) == c->ordinal;
}

/* Whether the strides lay shape out C-contiguously (size-1 dims never move a pointer). */
static bool s_dense(int ndim, const int64_t *shape, const int64_t *strides, size_t elem)
{
    int64_t expect = (int64_t)elem;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] == 1)
            continue;
        if (strides[d] != expect)
            return false;
        expect *= shape[d];
    }
    return true;
}

/* The communication stream starts after what the compute stream was given so far. */
static const char *s_comm_begin(cuda_ctx *c)
{
    const char *why = cuda_check(cudaEventRecord(c->computed, c->compute), "cudaEventRecord");
    return why ? why : cuda_check(cudaStreamWaitEvent(c->comm, c->computed, 0), "cudaStreamWaitEvent");
}

/* host -> device: the host side packed when strided, the device side scattered from a staging
 * buffer when strided; finished before it returns */
static const char *s_to_device(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
                               int ndim, const int64_t *shape, size_t elem)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    int64_t n = dt_layout_numel(ndim, shape), dense[DT_MAX_DIMS];
    if (n == 0)
        return NULL;
    size_t bytes = (size_t)n * elem;
    dt_layout_strides(ndim, shape, elem, dense);
    void *packed = NULL, *staging = NULL;
    const void *host = src;
    if (!s_dense(ndim, shape, src_strides, elem)) {
        if (!(packed = malloc(bytes)))
            return s_oom;
        cpu_copy_block(packed, dense, src, src_strides, ndim, shape, elem);
        host = packed;
    }
    bool scatter = !s_dense(ndim, shape, dst_strides, elem);
    why = s_comm_begin(c);
    if (!why && scatter && cudaMallocAsync(&staging, bytes, c->comm) != cudaSuccess) {
        cudaGetLastError();
        why = s_oom;
    }
    if (!why)
        why = cuda_check(cudaMemcpyAsync(scatter ? staging : dst, host, bytes, cudaMemcpyHostToDevice, c->comm),
                         "copy to the device");
    if (!why && scatter)
        why = cuda_check(cuda_copy_strided(dst, dst_strides, staging, dense, ndim, shape, elem, c->comm),
                         "strided copy on the device");
    if (staging)
        cudaFreeAsync(staging, c->comm);
    const char *done = cuda_check(cudaStreamSynchronize(c->comm), "copy to the device");
    free(packed);
    return why ? why : done;
}

/* device -> host: gathered into a staging buffer on the device when strided, scattered on the
 * host when strided; finished before it returns */
static const char *s_to_host(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
                             int ndim, const int64_t *shape, size_t elem)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    int64_t n = dt_layout_numel(ndim, shape), dense[DT_MAX_DIMS];
    if (n == 0)
        return NULL;
    size_t bytes = (size_t)n * elem;
    dt_layout_strides(ndim, shape, elem, dense);
    bool gather = !s_dense(ndim, shape, src_strides, elem), scatter = !s_dense(ndim, shape, dst_strides, elem);
    void *packed = NULL, *staging = NULL;
    if (scatter && !(packed = malloc(bytes)))
        return s_oom;
    why = s_comm_begin(c);
    if (!why && gather && cudaMallocAsync(&staging, bytes, c->comm) != cudaSuccess) {
        cudaGetLastError();
        why = s_oom;
    }
    if (!why && gather)
        why = cuda_check(cuda_copy_strided(staging, dense, src, src_strides, ndim, shape, elem, c->comm),
                         "strided copy on the device");
    if (!why)
        why = cuda_check(cudaMemcpyAsync(scatter ? packed : dst, gather ? staging : src, bytes,
                                         cudaMemcpyDeviceToHost, c->comm),
                         "copy to the host");
    if (staging)
        cudaFreeAsync(staging, c->comm);
    const char *done = cuda_check(cudaStreamSynchronize(c->comm), "copy to the host");
    if (!why && !done && scatter)
        cpu_copy_block(dst, dst_strides, packed, dense, ndim, shape, elem);
    free(packed);
    return why ? why : done;
}

static const char *s_copy_region(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
                                 int ndim, const int64_t *shape, size_t elem)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    int64_t n = dt_layout_numel(ndim, shape);
    if (n == 0)
        return NULL;
    if (s_dense(ndim, shape, dst_strides, elem) && s_dense(ndim, shape, src_strides, elem))
        return cuda_check(cudaMemcpyAsync(dst, src, (size_t)n * elem, cudaMemcpyDeviceToDevice, c->compute),
                          "copy on the device");
    return cuda_check(cuda_copy_strided(dst, dst_strides, src, src_strides, ndim, shape, elem, c->compute),
                      "strided copy on the device");
}

/* ---- kernels --------------------------------------------------------------------------------- */

/* every row's kernel (ops/op_table.h's OP_KERNELS) */
#define OP_KERNEL(name, id, kernel) [id] = cuda_k_##kernel,
static const cuda_op_kernel s_kernels[OP_ID_LIMIT] = {OP_KERNELS};
#undef OP_KERNEL

cuda_op_kernel cuda_kernel_for(int id) { return id >= 0 && id < OP_ID_LIMIT ? s_kernels[id] : NULL; }

static const char *s_run(const op_def *def, op_kernel *k)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    return c ? cuda_kernel_for(def->id)(c, k) : why; /* every row has one (ops/op_table.h) */
}

static const char *s_fill(void *dst, dt_dtype dtype, int64_t n, dt_scalar value)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    uint64_t bits = 0;
    cpu_fill(&bits, dtype, 1, value); /* the CPU's conversion of the value, element for element */
    return cuda_check(cuda_fill(dst, dt_dtype_size(dtype), n, bits, c->compute), "fill");
}

static const char *s_random(void *dst, dt_dtype dtype, int ndim, const int64_t *shape, const int64_t *offset,
                            const int64_t *global_shape, uint64_t seed, uint64_t stream, bool normal)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    return cuda_check(cuda_random(dst, dtype, ndim, shape, offset, global_shape, seed, stream, normal, c->compute),
                      "random");
}

/* cpu_arange's conversions of start and step: to double, and to int64 saturating (NaN -> 0) */
static int64_t s_to_i64(dt_scalar s)
{
    if (s.is_int)
        return s.i;
    if (s.f != s.f)
        return 0;
    return s.f >= 9223372036854775808.0 ? INT64_MAX : s.f < -9223372036854775808.0 ? INT64_MIN : (int64_t)s.f;
}

static const char *s_arange(void *dst, dt_dtype dtype, int64_t n, int64_t first, dt_scalar start, dt_scalar step)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    double a = start.is_int ? (double)start.i : start.f, d = step.is_int ? (double)step.i : step.f;
    return cuda_check(cuda_arange(dst, dtype, n, first, a, d, (uint64_t)s_to_i64(start), (uint64_t)s_to_i64(step),
                                  c->compute),
                      "arange");
}

static const char *s_combine(void *dst, const void *a, const void *b, dt_dtype dtype, int64_t n, dt_reduce_op op)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    return c ? cuda_check(cuda_combine_pieces(dst, a, b, dtype, n, op, c->compute), "reduce") : why;
}

static const char *s_scale_div(void *acc, dt_dtype dtype, int64_t n, int64_t divisor)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    return c ? cuda_check(cuda_scale_div(acc, dtype, n, divisor, c->compute), "average") : why;
}

static const char *s_synchronize(void)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    cudaError_t e = cudaStreamSynchronize(c->compute);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->comm);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    return cuda_check(e, "an asynchronous CUDA operation failed");
}

/* A traced device's marks are timing events on its compute stream: a record's begin and end marks
 * bound the GPU time of the work it queued. */
static void *s_mark(void)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    cudaEvent_t e;
    if (!c || cudaEventCreate(&e) != cudaSuccess)
        return NULL;
    if (cudaEventRecord(e, c->compute) != cudaSuccess) {
        cudaEventDestroy(e);
        return NULL;
    }
    return e;
}

static int64_t s_mark_elapsed_ns(void *from, void *to)
{
    float ms;
    if (!from || !to || cudaEventSynchronize((cudaEvent_t)to) != cudaSuccess ||
        cudaEventElapsedTime(&ms, (cudaEvent_t)from, (cudaEvent_t)to) != cudaSuccess)
        return -1;
    return (int64_t)((double)ms * 1e6);
}

static void s_mark_free(void *mark)
{
    if (mark)
        cudaEventDestroy((cudaEvent_t)mark);
}

const op_backend cuda_backend = {
    .name = "cuda",
    .attach = s_attach,
    .detach = s_detach,
    .alloc = s_alloc,
    .free = s_free,
    .memory_size = s_memory_size,
    .to_device = s_to_device,
    .to_host = s_to_host,
    .copy_region = s_copy_region,
    .free_elsewhere = s_free_elsewhere,
    /* a peer on the same GPU: its memory is this device's, read by the same kernels and copies */
    .copy_from_peer = s_copy_region,
    .peer_can_read = s_peer_can_read,
    .run = s_run,
    .fill = s_fill,
    .random = s_random,
    .arange = s_arange,
    .combine = s_combine,
    .scale_div = s_scale_div,
    .synchronize = s_synchronize,
    .mark = s_mark,
    .mark_elapsed_ns = s_mark_elapsed_ns,
    .mark_free = s_mark_free,
};
