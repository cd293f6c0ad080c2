/* dtorch.h — the public C API of DTorch, a single-controller distributed tensor runtime.
 *
 * One thread (the user's) builds DTensors over DeviceMeshes; each device is an actor that
 * runs the work it is sent; values come back as futures. Every call here returns at once
 * except the ones that wait for a value (dt_future_wait) or for the runtime (dt_shutdown).
 *
 * Errors: functions returning int give 0 or a negative DT_E* code; functions returning a
 * pointer give NULL. Either way dt_last_error() holds a message for the calling thread.
 *
 *     dt_mesh *mesh = dt_mesh_new("cpu", 1, (int64_t[]){2}, (int64_t[]){0, 1}, NULL);
 *     dt_placement shard0 = dt_shard(0);
 *     dt_tensor *x = dt_rand(mesh, 2, (int64_t[]){4, 3}, DT_FLOAT32, &shard0);
 *     dt_future *f = dt_tensor_fetch(x);
 *     if (dt_future_wait(f, -1) == 0) { const float *v = dt_future_data(f, 0); ... }
 *     dt_future_release(&f); dt_tensor_release(&x); dt_mesh_release(&mesh); dt_shutdown();
 */
#ifndef DTORCH_H
#define DTORCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What is declared here is what libdtorch.so exports: the library is built with every other
 * symbol hidden (-fvisibility=hidden), and these declarations give its definitions back the
 * default visibility. */
#ifdef __GNUC__
#pragma GCC visibility push(default)
#endif

#define DT_MAX_DIMS 8        /* most dims of a tensor or a mesh */
#define DT_MAX_DEVICE_ID 65535 /* device ids are 0..DT_MAX_DEVICE_ID */

/* Error codes (negative returns). */
enum {
    DT_OK = 0,
    DT_EINVAL = -1,     /* bad argument value (ValueError) */
    DT_ETYPE = -2,      /* bad dtype or argument type (TypeError) */
    DT_EINDEX = -3,     /* dimension out of range (IndexError) */
    DT_ESHUTDOWN = -4,  /* runtime shut down, or object from before a shutdown */
    DT_ETIMEDOUT = -5,  /* wait expired; the future stays usable */
    DT_EDEVICE = -6,    /* a device died or is unreachable */
    DT_EKERNEL = -7,    /* an op failed on a device */
    DT_ENOMEM = -8,     /* out of memory */
    DT_EPROTO = -9,     /* malformed or unexpected message */
    DT_EINTR = -10,     /* wait interrupted by the caller's hook (e.g. Ctrl-C) */
    DT_ESYS = -11,      /* operating-system failure (spawn, socket) */
    DT_EUNSUPPORTED = -12, /* a valid request this runtime does not do (RuntimeError) */
};

typedef enum {
    DT_FLOAT32 = 0,
    DT_FLOAT16 = 1,
    DT_BFLOAT16 = 2,
    DT_INT32 = 3,
    DT_INT64 = 4,
    DT_BOOL = 5,
    DT_NDTYPES
} dt_dtype;

typedef enum { DT_SHARD = 0, DT_REPLICATE = 1, DT_PARTIAL = 2 } dt_placement_kind;
typedef enum { DT_REDUCE_SUM = 0, DT_REDUCE_AVG = 1, DT_REDUCE_MAX = 2, DT_REDUCE_MIN = 3 } dt_reduce_op;

/* One placement per mesh dim. dim: the tensor dim of a Shard (negative allowed on input). */
typedef struct {
    int32_t kind;      /* dt_placement_kind */
    int32_t dim;       /* Shard only */
    int32_t reduce_op; /* Partial only: dt_reduce_op */
} dt_placement;

/* A Python-like scalar: integer values stay exact. */
typedef struct {
    bool is_int;
    int64_t i;
    double f;
} dt_scalar;

typedef enum { DT_WORKERS_THREAD = 0, DT_WORKERS_PROCESS = 1 } dt_workers;

typedef struct {
    dt_workers workers;      /* where device actors live */
    const char *worker_path; /* dtorch-worker executable for process workers (NULL: env/PATH) */
    /* Listening instead (NULL: not): "tcp://ADDR:PORT" (ADDR a numeric IPv4 address, 0.0.0.0 or *;
     * PORT * for any). No worker is spawned: `dtorch-worker --connect ... --devices TYPE:IDS` serves
     * the devices, from any host. */
    const char *listen;
    const char *key;         /* the controller's key pair file (dtorch-worker --keygen); NULL: a fresh one */
    const char *worker_key;  /* the workers' public key (40 Z85 characters or a key file): the only one admitted */
    bool insecure;           /* plaintext tcp, no authentication: anyone who reaches the port is a worker */
} dt_config;

typedef struct dt_mesh dt_mesh;
typedef struct dt_tensor dt_tensor;
typedef struct dt_future dt_future;

/* ---- runtime ------------------------------------------------------------------------------ */
int dt_init(const dt_config *config);   /* NULL: DTORCH_WORKERS env, else threads; started lazily otherwise */
int dt_shutdown(void);                  /* stops every actor; tensors made before become unusable */
bool dt_is_running(void);
/* A listening runtime: where it listens (the port filled in) and the controller's public key
 * ("" when insecure), for the workers' --connect and --server-key. DT_EINVAL when not listening. */
int dt_listen_info(char *endpoint, size_t endpoint_size, char *public_key, size_t key_size);
/* Waits up to timeout_s (< 0: forever) until the workers of the n devices have connected (DT_ETIMEDOUT
 * naming one that has not; DT_EDEVICE for one that died). Listening runtimes only; others start
 * their workers themselves and return at once. */
int dt_wait_workers(const int64_t *ids, int n, double timeout_s);
typedef struct {
    int state;               /* 0: no worker yet, 1: serving, 2: dead */
    bool remote;
    char host[64];           /* "" until its worker said hello */
    int64_t pid;             /* its worker's process (on host); 0 for a thread */
    char peer[64];           /* remote: where other workers reach it ("tcp://A.B.C.D:PORT") */
    char reason[512];        /* dead: why */
} dt_worker_info;
/* What the runtime knows of device id's worker: DT_EINVAL if none was ever asked for. */
int dt_worker_info_get(int64_t id, dt_worker_info *out);
dt_workers dt_current_workers(void);    /* mode of the running (or next) runtime */
const char *dt_last_error(void);        /* message of this thread's last failure */
int dt_last_error_code(void);
void dt_manual_seed(uint64_t seed);     /* resets the random stream of every random factory */
/* Called around every blocking wait of the user's thread (bindings release their lock there);
 * interrupt is polled while waiting and makes the wait return DT_EINTR when it returns true. */
void dt_set_wait_hooks(void (*enter)(void), void (*leave)(void), bool (*interrupt)(void));
int dt_synchronize(void);               /* waits until every op sent so far has run */
uint64_t dt_ops_submitted(void);        /* submissions so far: ops, factories, fetches, redistributes */

/* ---- placements --------------------------------------------------------------------------- */
dt_placement dt_shard(int32_t dim);
dt_placement dt_replicate(void);
dt_placement dt_partial(dt_reduce_op op);
const char *dt_dtype_name(dt_dtype dtype);
size_t dt_dtype_size(dt_dtype dtype);

/* ---- meshes ------------------------------------------------------------------------------- */
/* device_type "cpu" or "cuda"; ids holds prod(shape) distinct device ids, row-major;
 * dim_names: NULL or ndim distinct names. */
dt_mesh *dt_mesh_new(const char *device_type, int ndim, const int64_t *shape, const int64_t *ids,
                     const char *const *dim_names);
dt_mesh *dt_mesh_ref(dt_mesh *mesh);
void dt_mesh_release(dt_mesh **mesh);
int dt_mesh_ndim(const dt_mesh *mesh);
const int64_t *dt_mesh_shape(const dt_mesh *mesh);
const int64_t *dt_mesh_ids(const dt_mesh *mesh);
int64_t dt_mesh_size(const dt_mesh *mesh);
const char *dt_mesh_device_type(const dt_mesh *mesh);
const char *dt_mesh_dim_name(const dt_mesh *mesh, int dim); /* NULL when unnamed */

/* ---- factories (placements: dt_mesh_ndim entries, or NULL for all Replicate) ----------------- */
dt_tensor *dt_full(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype,
                   const dt_placement *placements, dt_scalar value);
dt_tensor *dt_zeros(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements);
dt_tensor *dt_ones(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements);
dt_tensor *dt_empty(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements);
dt_tensor *dt_rand(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements);
dt_tensor *dt_randn(dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype, const dt_placement *placements);
/* The dtype dt_full and dt_arange make when the caller names none, as torch: full follows its
 * value (a truth value, is_bool: bool; an integer: int64; else float32), arange gives int64 when
 * every bound is an integer, else float32. */
dt_dtype dt_full_dtype(dt_scalar value, bool is_bool);
dt_dtype dt_arange_dtype(dt_scalar start, dt_scalar end, dt_scalar step);
/* values start, start+step, ... below end (above end for a negative step) */
dt_tensor *dt_arange(dt_mesh *mesh, dt_scalar start, dt_scalar end, dt_scalar step, dt_dtype dtype,
                     const dt_placement *placements);
/* data: the global tensor; strides in bytes (NULL: C-contiguous). Copied before returning. */
dt_tensor *dt_distribute(dt_mesh *mesh, const void *data, int ndim, const int64_t *shape,
                         const int64_t *strides, dt_dtype dtype, const dt_placement *placements);
/* One C-contiguous local piece per device, row-major mesh order; each piece has ndim dims with
 * local_shapes[d * ndim ...]. shape: the global shape, or NULL to infer it assuming even shards.
 * Pieces must match the local shapes the placements give for that global shape. */
dt_tensor *dt_from_local(dt_mesh *mesh, const void *const *pieces, int ndim, const int64_t *local_shapes,
                         dt_dtype dtype, const dt_placement *placements, const int64_t *shape);

/* ---- redistribute ------------------------------------------------------------------------- */
/* The same value laid out anew: other placements, or another mesh (NULL: t's own). Devices
 * exchange the pieces among themselves; nothing waits. Placements: one per mesh dim of the
 * target; a Partial target must be what t already has on that mesh dim of the same mesh.
 * Returns t itself (another reference) when nothing changes. */
dt_tensor *dt_redistribute(dt_tensor *t, dt_mesh *mesh, const dt_placement *placements);
/* n tensors at once, tensor i to placements + i * dt_mesh_ndim(target); their transfers go out
 * together. On success out holds n new references; on failure none. */
int dt_redistribute_many(int n, dt_tensor *const *tensors, dt_mesh *mesh, const dt_placement *placements,
                         dt_tensor **out);
/* n tensors at once into existing ones: dst[i] (same shape and dtype as tensors[i], on any mesh of
 * the device type, in any placements but a Partial of its own) takes tensors[i]'s value in its own
 * mesh and placements, in place: no new tensor, and on each device the piece's own memory is
 * written when nothing else holds it. Whatever was issued before (ops, fetches, views made of
 * dst) sees dst's old value. A destination may not share pieces with any tensor of the call, nor
 * with another destination; not inside a capture. */
int dt_redistribute_into(int n, dt_tensor *const *tensors, dt_tensor *const *dst);

/* One step of a redistribute plan (what dt_redistribute would do, for tests and tuning). */
typedef struct {
    char kind[16];            /* "all_gather", "all_to_all", "all_reduce", "reduce_scatter", "local", "p2p" */
    int mesh_dim;             /* the mesh dim it works along, or -1 */
    int64_t remote_elements;  /* elements that cross between devices */
} dt_plan_step;
/* Fills up to max steps; returns the number of steps, or a negative error code. */
int dt_redistribute_plan(dt_tensor *t, dt_mesh *mesh, const dt_placement *placements, dt_plan_step *steps, int max);

/* ---- ops ---------------------------------------------------------------------------------- */
/* Attributes of an op call, read by position (each op documents its own; see ops/). */
typedef struct {
    int nints;
    int64_t ints[16];
    int nfloats;
    double floats[4];
    bool has_scalar;
    dt_scalar scalar;         /* a Python number operand (x + 1) */
} dt_op_attrs;

/* Runs the op called name (torch's names: "add", "matmul", "softmax", ...) on n inputs that live
 * on one mesh. Shapes, dtypes and placements are worked out here; bad input fails here, and no
 * device sees the op. Inputs whose placements the op cannot use are redistributed first (the
 * cheapest way), unless strict mode is on. Fills up to max_out new tensors into out; returns
 * how many, or a negative error code. */
int dt_op(const char *name, int n, dt_tensor *const *inputs, const dt_op_attrs *attrs, int max_out, dt_tensor **out);
/* The same with the op looked up once: dt_op_id gives its id (or a negative error code). It also
 * takes the name of the Python operator an elementwise op runs as ("__add__": add, "__floordiv__":
 * floor_divide, "__invert__": logical_not), which is how the bindings find their operators' ops. */
int dt_op_id(const char *name);
int dt_op_run(int id, int n, dt_tensor *const *inputs, const dt_op_attrs *attrs, int max_out, dt_tensor **out);
/* The registry, as bindings see it: every op's name, id, arity, and how Python calls it. */
typedef enum {
    DT_SIG_NONE,   /* the bindings write a wrapper by hand */
    DT_SIG_UNARY,  /* f(input, <float attributes>=<defaults>) */
    DT_SIG_BINARY, /* f(input, other): either may be a Python number (attrs.scalar) */
} dt_op_sig;
enum { DT_PY_FN = 1, DT_PY_METHOD = 2, DT_PY_NN = 4 }; /* dtorch.<name>, DTensor.<name>, nn.functional */
typedef struct {
    const char *name;
    int id;             /* what dt_op_run takes */
    int nin, nout;      /* inputs (-1: any number) and outputs */
    dt_op_sig sig;
    int exports;        /* DT_PY_* bits; 0 with DT_SIG_NONE */
    const char *floats; /* DT_SIG_UNARY: its float attributes in order, with defaults ("beta=1, threshold=20") */
} dt_op_info;
int dt_op_count(void);
/* Fills info for op i of dt_op_count(); DT_EINVAL when there is none. */
int dt_op_info_at(int i, dt_op_info *info);
/* Pieces of t along dim, as torch: of split_size each (the last may be short), or (sections
 * not NULL) of the nsections sizes given. A dim sharded on some mesh dim is made Replicate first (one all-gather,
 * not one per piece) unless strict mode is on. Fills out (room for max_out) and returns how many
 * pieces; with out NULL, only checks the arguments and returns how many there would be. */
int dt_split(dt_tensor *t, int64_t dim, int64_t split_size, int nsections, const int64_t *sections, int max_out,
             dt_tensor **out);
/* At most chunks pieces of ceil(size / chunks) along dim (torch.chunk); the same conventions. */
int dt_chunk(dt_tensor *t, int64_t chunks, int64_t dim, int max_out, dt_tensor **out);
/* Every slice of t along dim, that dim removed; the same conventions. */
int dt_unbind(dt_tensor *t, int64_t dim, int max_out, dt_tensor **out);

/* One item of an index, x[i, a:b:c, None, ...] or x[idx]. */
typedef enum { DT_INDEX_INT, DT_INDEX_SLICE, DT_INDEX_NONE, DT_INDEX_ELLIPSIS, DT_INDEX_TENSOR, DT_INDEX_LIST } dt_index_kind;
typedef struct {
    dt_index_kind kind;
    int64_t i;                          /* INT (negative counts from the end) */
    bool has_start, has_stop, has_step; /* SLICE: which bounds are given (Python's None: not) */
    int64_t start, stop, step;          /* SLICE: Python's bounds; step > 0 */
    dt_tensor *tensor;                  /* TENSOR: 0-d or 1-D int32/int64 positions along its dim */
    const int64_t *positions;           /* LIST: npositions positions along its dim (read during the call) */
    int64_t npositions;
} dt_index_item;
/* t indexed as torch does with basic indexing (ints, slices, None, one Ellipsis), and at most one
 * integer DTensor or list of positions among them (index_select along the dim it stands for,
 * negative positions allowed, a list's checked against that dim's size; the picked dim goes first
 * where ints stand apart from it, numpy's rule). */
dt_tensor *dt_index(dt_tensor *t, int n, const dt_index_item *items);

/* Ring attention (context parallelism): softmax(q k^T * scale, with keys hidden by position) v
 * over a sequence split along mesh dim mesh_dim (the ring) without gathering it. q (B, Hq, Lq, D),
 * k (B, Hkv, S, D), v (B, Hkv, S, Dv) of one floating dtype (Hkv divides Hq: grouped-query heads);
 * q_index (B or 1, Lq) and k_index (B or 1, S) int64 positions: key j is visible to query i iff
 * k_index[j] >= 0 and (!is_causal or k_index[j] <= q_index[i]), so any layout of the sequence
 * (zig-zag, uneven, padded, -1 for an empty cache slot) is correct. Along the ring k and v are
 * Shard(2) and k_index Shard(1) (torch.chunk pieces, uneven or empty allowed); q Shard(2) with
 * q_index Shard(1) is prefill (the key blocks travel around the ring, device to device), q and
 * q_index Replicate is decode (each device attends to its own block, the partial results are
 * exchanged and merged). On the other mesh dims each line along mesh_dim is a ring of its own, with
 * all inputs Replicate, or q, k, v Shard(0) (the indices too where their batch is above 1) or
 * Shard(1) (heads; the indices Replicate). scale: has_scale ? scale : 1 / sqrt(D). Returns
 * (B, Hq, Lq, Dv) of q's dtype and placements, or NULL (DT_EINVAL naming the input, its placements
 * and what is needed). */
dt_tensor *dt_ring_attention(dt_tensor *q, dt_tensor *k, dt_tensor *v, dt_tensor *q_index, dt_tensor *k_index,
                             int mesh_dim, bool is_causal, bool has_scale, double scale);
/* The same with a joint block every query attends to once besides the ring's keys: joint_key
 * (B, Hkv, Sj, D), joint_value (B, Hkv, Sj, Dv), joint_index (B or 1, Sj) positions, Replicate along
 * the ring and placed as attention_block's rule wants a block for the query elsewhere (e.g. a
 * diffusion transformer's text tokens next to its image tokens split over the ring). It never
 * travels: in prefill each device merges it into its accumulators, in decode the device at ring
 * position 0 does. NULL, NULL, NULL: dt_ring_attention. */
dt_tensor *dt_ring_attention_joint(dt_tensor *q, dt_tensor *k, dt_tensor *v, dt_tensor *q_index, dt_tensor *k_index,
                                   dt_tensor *joint_key, dt_tensor *joint_value, dt_tensor *joint_index, int mesh_dim,
                                   bool is_causal, bool has_scale, double scale);

/* Image ops over an input split along a spatial dim (dtensor/dt_halo.c): x Shard(2) or Shard(3)
 * along mesh_dim (rows or columns) and Replicate or Shard(0) on the other mesh dims, weight and bias
 * Replicate. Each device computes its own torch.chunk share of the output along that dim from its
 * own rows and the few of its neighbours' the op reads (the halo, fetched worker to worker); the
 * output has x's placements. conv2d: ints are the op's 9 (stride h, w; padding top, bottom, left,
 * right; dilation h, w; groups), bias may be NULL. interpolate: ints [mode, align_corners, output
 * sizes], floats the scale factors, as the op takes them; only nearest or nearest-exact with a
 * power-of-two scale on the split dim. NULL with DT_EINVAL naming what does not fit. */
dt_tensor *dt_halo_conv2d(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, const int64_t *ints, int mesh_dim);
dt_tensor *dt_halo_interpolate(dt_tensor *x, int nints, const int64_t *ints, int nfloats, const double *floats,
                               int mesh_dim);

/* Strict mode: an op whose inputs would need a redistribute fails instead, naming the op and
 * the placements. */
void dt_set_strict(bool strict);
bool dt_get_strict(void);

/* ---- tensors ------------------------------------------------------------------------------ */
dt_tensor *dt_tensor_ref(dt_tensor *t);
void dt_tensor_release(dt_tensor **t);     /* the last release frees the tensor on its devices */
int dt_tensor_ndim(const dt_tensor *t);
const int64_t *dt_tensor_shape(const dt_tensor *t);
int64_t dt_tensor_numel(const dt_tensor *t);
dt_dtype dt_tensor_dtype(const dt_tensor *t);
dt_mesh *dt_tensor_mesh(const dt_tensor *t);             /* borrowed */
const dt_placement *dt_tensor_placements(const dt_tensor *t); /* dt_mesh_ndim entries, normalised */
bool dt_tensor_is_contiguous(const dt_tensor *t); /* as torch's view would be: row-major order (not a transpose, a column...) */
/* local shape and global offset of the piece the device at flat mesh index holds */
int dt_tensor_local_block(const dt_tensor *t, int64_t mesh_index, int64_t *shape, int64_t *offset);
dt_future *dt_tensor_fetch(dt_tensor *t);                /* the whole value, Partial reduced */
dt_future *dt_tensor_fetch_locals(dt_tensor *t);         /* every device's own piece */

/* ---- captured op sequences ---------------------------------------------------------------- */
/* Between dt_capture_begin and dt_capture_end the calling thread's ops are recorded, not run:
 * each device keeps its own records, and dt_capture_replay runs them all again by one small
 * record per device, on new inputs of the same shapes and placements, into fresh outputs.
 * Tensors made inside hold no value (ops on them after the capture fail); fetches, syncs and
 * host data are refused inside (DT_EUNSUPPORTED); other threads' ops wait until it ends. Tensors
 * the recorded ops use that are neither inputs nor made inside are constants: the devices keep
 * them as long as the capture lives, and in-place writes to them happen on every replay. Random
 * factories draw new numbers on every replay, as if the ops were issued again. */
typedef struct dt_capture dt_capture;
int dt_capture_begin(const char *name, dt_tensor *const *inputs, int ninputs);
/* outputs: tensors made inside (at most 32, no repeats); on failure the capture is over too. */
int dt_capture_end(dt_tensor *const *outputs, int noutputs, dt_capture **out);
void dt_capture_abort(void);                       /* ends a capture, keeping nothing */
bool dt_capture_made(const dt_tensor *t);         /* made inside a capture (holds no value) */
/* One run on inputs like the capture's (same mesh, dtype, shape, placements): noutputs new
 * tensors into outputs. 0, or an error naming the input that differs. */
int dt_capture_replay(dt_capture *g, dt_tensor *const *inputs, int ninputs, dt_tensor **outputs);
int dt_capture_ninputs(const dt_capture *g);
int dt_capture_noutputs(const dt_capture *g);
uint64_t dt_capture_nrecords(const dt_capture *g); /* op records kept over all devices */
int dt_capture_ndevices(const dt_capture *g);
void dt_capture_release(dt_capture **g);           /* the devices forget it */

/* ---- device failures ------------------------------------------------------------------------ */
/* Failures are numbered from 1 over the process's life, every runtime included. Waits up to
 * timeout_s (the GIL or the like released through the wait hooks) for the first failure numbered
 * after `after`, fills its device and reason and returns its number; 0 when none came. A watcher
 * more than 255 failures behind skips to the oldest one remembered. */
uint64_t dt_next_device_failure(uint64_t after, double timeout_s, int64_t *device, char *reason, size_t size);
uint64_t dt_device_failures(void);   /* the number of the latest failure (0: none yet) */

/* ---- device statistics -------------------------------------------------------------------- */
/* What one device's worker has counted since it started. */
typedef struct {
    int64_t device;                 /* its id */
    int64_t bytes_in_use;           /* bytes of the pieces it holds now */
    int64_t peak_bytes;             /* the most bytes_in_use has been since the last reset */
    int64_t peer_messages_sent;     /* regions sent to other devices (redistributes, ring attention) */
    int64_t peer_bytes_sent;        /* ... their bytes */
    int64_t peer_messages_received; /* regions received from other devices */
    int64_t peer_bytes_received;    /* ... their bytes */
    int64_t shm_bytes_sent;         /* of peer_bytes_sent: lent by handle to peers (worker processes' shared memory) */
    int64_t shm_bytes_received;     /* of peer_bytes_received: read in place from a peer's shared memory */
    int64_t shm_bytes_fetched;      /* bytes of fetched values the controller read from its shared memory */
    int64_t pooled_bytes;           /* freed buffers and shared segments its process keeps (threads share them) */
    int64_t loads;                  /* pieces the controller sent it whole (distribute_tensor, from_local) */
    int64_t loaded_bytes;           /* ... their bytes */
    int64_t peer_messages_refused;  /* messages on its peer socket from no worker of the run (or not from the device
                                     * they name), dropped unread */
    int64_t peer_regions_dropped;   /* regions from peers dropped because too many were waiting to be assembled */
    int64_t huge_page_bytes;        /* of bytes_in_use: pieces in 2 MiB-aligned memory advised for transparent huge
                                     * pages (MADV_HUGEPAGE) where the kernel took the advice */
    int64_t onednn_convs;           /* conv2d kernels that ran through oneDNN (a CPU device of a build with it; else
                                     * 0: im2col and sgemm ran them) */
    int64_t peer_handoffs;          /* of peer_messages_sent: handed to a peer thread of this process as they are,
                                     * no message made (worker threads that read each other's memory) */
    int64_t onednn_matmuls;         /* bfloat16 products of a prompt's rows (linear, attention) that ran on the
                                     * CPU's bfloat16 units (AMX, AVX512_BF16) through oneDNN; 0 elsewhere
                                     * (widened to float32) */
} dt_device_stat;
/* Waits for every device of mesh to run what was sent to it before, then fills up to max entries,
 * one per device in mesh order. Returns the mesh's size, or a negative error code. */
int dt_device_stats(dt_mesh *mesh, int max, dt_device_stat *out);
/* The same; then each device's peak_bytes starts again from its bytes_in_use. */
int dt_device_stats_reset_peak(dt_mesh *mesh, int max, dt_device_stat *out);

/* Timelines (dtorch.profiler). dt_trace_start: every device of mesh records each op record it runs
 * from now on (and the controller each batch it sends); dt_trace_stop: they stop, and counts[i] is
 * how many events device i kept; dt_trace_events: events gets each device's counts[i] rows of
 * DT_TRACE_FIELDS int64, device after device: the record's code, its op (a COMPUTE's op number, else -1), its start and
 * end (CLOCK_MONOTONIC ns on the device's host). dt_trace_host: the controller's batches while it
 * traced, rows of [device, records, CLOCK_MONOTONIC ns], up to max; returns how many there are. */
#define DT_TRACE_FIELDS 4
int dt_trace_start(dt_mesh *mesh);
int dt_trace_stop(dt_mesh *mesh, int64_t *counts);
int dt_trace_events(dt_mesh *mesh, const int64_t *counts, int64_t *events);
/* The name of an op record's code ("compute", "send", ...; "?" for none): what a trace event ran. */
const char *dt_record_name(int64_t code);
int64_t dt_trace_host(int64_t *rows, int64_t max);
/* The ids of the devices a mesh has started whose workers serve now or are still starting (records
 * for those wait for them in order), up to max, in order; returns how many there are. */
int dt_started_devices(int64_t *ids, int max);
/* The device type ("cpu", "cuda") a mesh gave device id, copied into out (size bytes); DT_EINVAL
 * when no mesh has named the device yet. */
int dt_device_type(int64_t id, char *out, size_t size);

/* ---- futures ------------------------------------------------------------------------------ */
dt_future *dt_future_ref(dt_future *f);
void dt_future_release(dt_future **f);
bool dt_future_done(const dt_future *f);
/* timeout_s < 0: forever. Returns 0 when the value is ready, the failure's code when it failed
 * (message in dt_last_error and dt_future_error), DT_ETIMEDOUT or DT_EINTR otherwise. */
int dt_future_wait(dt_future *f, double timeout_s);
int dt_future_status(const dt_future *f);                /* 0 ready, 1 pending, <0 failed */
const char *dt_future_error(const dt_future *f);         /* NULL unless failed */
/* ready value: a C-contiguous array of dt_future_shape; pieces (fetch_locals) are indexed */
int dt_future_npieces(const dt_future *f);
dt_dtype dt_future_dtype(const dt_future *f);
int dt_future_ndim(const dt_future *f);
const int64_t *dt_future_shape(const dt_future *f, int piece);
const void *dt_future_data(const dt_future *f, int piece);
/* cb runs once, when the future completes, on a runtime thread (or now, if already complete) */
void dt_future_on_done(dt_future *f, void (*cb)(dt_future *f, void *arg), void *arg);

#ifdef __GNUC__
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
