/* op_backend — everything a device type does for its worker actors, as one table of function
 * pointers (in the spirit of ggml's backend interface). A worker reaches its device only
 * through the table of its device type, found by name with op_backend_find; the controller's
 * own host-memory work (assembling fetched values, combining Partial pieces, slicing the
 * user's arrays) goes through op_backend_host, the CPU table. Callers never ask which backend
 * they have, and a new device type is a new table (docs/ARCHITECTURE.md, "Device backends").
 *
 * Tensors speak one vocabulary: element counts per dim (shape) and byte strides per dim.
 * "Device memory" is what alloc returned (or a host buffer adopt_host accepted); "host
 * memory" is ordinary memory of this process. Slots that touch the device return NULL, or why
 * they failed (kept as the poisoned output's message). Optional slots are NULL when absent.
 */
#ifndef OP_BACKEND_H
#define OP_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtorch.h"
#include "op_registry.h"

/* Copies an ndim region of shape elements of elem_size bytes between two strided layouts
 * (byte strides); ndim 0 copies one element. */
typedef const char *(*op_copy_fn)(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
                                  int ndim, const int64_t *shape, size_t elem_size);

typedef struct {
    const char *name;  /* the DeviceMesh device type it serves ("cpu") */

    /* ---- the actor's device ---- */
    /* optional: binds the calling thread to device device_id before it uses any other slot; a
     * worker calls it once, on its own thread, when it starts (several workers may share one
     * physical device). Every other slot then works on that thread's device. NULL, or why the
     * device cannot be used (then every slot that touches the device fails with that reason). */
    const char *(*attach)(int64_t device_id);
    /* optional: gives back what attach took, on the same thread, after the worker's last piece
     * is freed */
    void (*detach)(void);

    /* ---- memory ---- */
    /* device memory for a piece of size bytes; NULL when there is none left */
    void *(*alloc)(size_t size);
    /* gives back what alloc returned */
    void (*free)(void *data, size_t size);
    /* optional: the bytes of memory device device_id has, as the controller can tell without
     * using the device (cached by the backend); 0 when it cannot tell. The controller refuses an op
     * whose piece on a device would be larger (dtn_check_fits), in every worker home alike. */
    size_t (*memory_size)(int64_t device_id);
    /* optional: gives back what alloc returned on another thread of this process (a peer thread
     * let go of the last reference to a piece it read): the allocating thread's queued work may still
     * use it, so it waits for that first. NULL: free serves every thread. */
    void (*free_elsewhere)(void *data, size_t size);
    /* host memory -> device memory (LOAD, regions received as frames) */
    op_copy_fn to_device;
    /* device memory -> host memory (FETCH values and regions sent as frames, without host_view) */
    op_copy_fn to_host;
    /* device memory -> device memory of this device (regions between pieces) */
    op_copy_fn copy_region;
    /* optional: whether size bytes of host memory at host may serve as device memory as they are;
     * a received frame the backend accepts becomes a piece's storage (or a received region)
     * without a copy. A backend whose memory is not host memory lacks it. */
    bool (*adopt_host)(const void *host, size_t size);
    /* optional: the host address of device memory, when the host can read it in place: values
     * and regions are then sent straight from a piece's storage, without to_host */
    const void *(*host_view)(const void *data);
    /* optional: device memory of another device of this backend in this process (a thread
     * worker's piece) -> device memory of this device. With it, thread workers hand each other
     * their storage and the receiver copies (and combine reads) a region in place; without
     * it, they send regions as frames like worker processes do. */
    op_copy_fn copy_from_peer;
    /* optional, with copy_from_peer: whether the thread worker of device device_id can read this
     * device's memory in place (a GPU shared by both actors); it is sent frames otherwise. NULL:
     * every peer thread can. A reader that queued work on memory read in place calls synchronize
     * before it lets go of it, and a sender calls synchronize before it hands its memory over. */
    bool (*peer_can_read)(int64_t device_id);

    /* ---- kernels ---- */
    /* runs def's kernel on this device's pieces (the op has no kernel for this device type,
     * bad data such as an index out of range, memory) */
    const char *(*run)(const op_def *def, op_kernel *k);
    /* dst[0..n) = value converted to dtype (cpu_fill's rules) */
    const char *(*fill)(void *dst, dt_dtype dtype, int64_t n, dt_scalar value);
    /* the C-contiguous block shape at offset of the counter-based random tensor of global_shape
     * for (seed, stream); uniform in [0, 1) or normal (cpu_random's numbers, bit for bit) */
    const char *(*random)(void *dst, dt_dtype dtype, int ndim, const int64_t *shape, const int64_t *offset,
                          const int64_t *global_shape, uint64_t seed, uint64_t stream, bool normal);
    /* dst[i] = start + (first + i) * step for i in [0, n) (cpu_arange's rules) */
    const char *(*arange)(void *dst, dt_dtype dtype, int64_t n, int64_t first, dt_scalar start, dt_scalar step);

    /* ---- collectives: combining Partial pieces ---- */
    /* dst[i] = a[i] (op) b[i] for n C-contiguous elements (cpu_combine_pieces's rules); dst may be a (a
     * reduction in place); a and b may be a peer's memory when the backend has copy_from_peer */
    const char *(*combine)(void *dst, const void *a, const void *b, dt_dtype dtype, int64_t n, dt_reduce_op op);
    /* acc[i] /= divisor: the end of an avg */
    const char *(*scale_div)(void *acc, dt_dtype dtype, int64_t n, int64_t divisor);

    /* ---- ordering ---- */
    /* optional: waits until every operation issued so far has finished, and reports the first
     * failure of an asynchronous one; a worker calls it before it answers a SYNC. NULL when every
     * slot has finished its work by the time it returns (CPU). */
    const char *(*synchronize)(void);

    /* ---- timing (a traced device's timeline, dtorch.profiler) ---- */
    /* optional: a mark of how far the work queued so far has got, for timing work that runs after
     * the slot that queued it returned (a CUDA event on the compute stream); NULL when it cannot
     * make one. A backend whose slots finish their work before they return lacks it: the host's
     * clock times that work. */
    void *(*mark)(void);
    /* the nanoseconds from mark `from` to mark `to` once the device has reached both (waits for
     * that); < 0 when it cannot tell. With mark. */
    int64_t (*mark_elapsed_ns)(void *from, void *to);
    /* gives back a mark (NULL is ignored). With mark. */
    void (*mark_free)(void *mark);
} op_backend;

/* The backend of a device type, or NULL when this build has none for it ("cuda" only in a build
 * with the CUDA backend: meson's -Dcuda option). */
const op_backend *op_backend_find(const char *device_type);
/* The backend of the controller's own memory (host memory): the CPU one, in every build. */
const op_backend *op_backend_host(void);
/* 0 when this build serves device_type; else DT_EINVAL for a name no backend will ever have, or
 * DT_EDEVICE for one whose backend this build lacks, with a message naming op. */
int op_backend_check(const char *op, const char *device_type);
/* The device types this build serves, for messages: "'cpu'". */
void op_backend_names(char *buf, size_t size);
/* The conv2d kernels the calling thread (a device's) ran through oneDNN (ops/cpu/cpu_dnnl.h): 0 in a
 * build without it. */
int64_t op_backend_onednn_convs(void);
/* How many bfloat16 products this thread ran through oneDNN's matmul (cpu_gemm.h; 0 without it). */
int64_t op_backend_onednn_matmuls(void);

#endif
