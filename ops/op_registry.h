/* op_registry — what an op is: its definition (op_def: name, id, arity, shape and dtype
 * inference, sharding rule, how Python calls it), the calls the controller makes of it (op_call)
 * and the pieces a kernel gets (op_kernel). Every op has one row in ops/op_table.h; the registry
 * finds it by id or name. The controller runs infer and shard on global metadata when the op is
 * called (errors raise there); each device runs its backend's kernel for the id on its local
 * pieces. */
#ifndef OP_REGISTRY_H
#define OP_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "dtorch.h"
#include "op_table.h"

#define OP_MAX_INPUTS 32
#define OP_MAX_OUTPUTS 2
#define OP_MAX_INTS 16                   /* dt_op_attrs.ints */
#define OP_MAX_FLOATS 4                  /* dt_op_attrs.floats */
#define OP_MAX_CTX 8

/* Attributes: a small bag each op reads by position (documented at its table entry). */
typedef dt_op_attrs op_attrs;

/* A tensor argument as the controller sees it: global metadata and placements. */
typedef struct {
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    dt_dtype dtype;
    dt_placement pl[DT_MAX_DIMS];         /* (mesh ndim) */
} op_arg;

typedef struct op_def op_def;

/* What moving a tensor between placements costs, in bytes (INT64_MAX when it cannot be planned).
 * The layer that plans redistributes (dtensor) provides it with each call, so ops never call up. */
typedef int64_t (*op_cost_fn)(const dt_mesh *mesh, int ndim, const int64_t *shape, dt_dtype dtype,
                              const dt_placement *from, const dt_placement *to);

/* How a strided view made on the controller reads its frame: a C-contiguous tensor of frame_ndim
 * dims (the base's pieces, or a contiguous view of them). View dim j walks frame dim dim[j] step[j]
 * elements at a time (a step of 0 repeats one element: a broadcast), or no frame dim (dim[j] -1: a
 * dim of its own, of size 1 or broadcast); the view's element 0 is frame element start[] (one index
 * per frame dim). The view's sizes are its shape. A tensor with pieces of its own reads itself as
 * the identity: frame_ndim = ndim, dim[j] = j, step 1, start 0 (op_strided_identity). */
typedef struct {
    int ndim, frame_ndim;
    int8_t dim[DT_MAX_DIMS];
    int64_t step[DT_MAX_DIMS];
    int64_t start[DT_MAX_DIMS];
} op_strided;

/* One call of an op on the controller. infer fills out[] (shape, dtype); shard fills want[]
 * (the placements each input must have, a redistribute is inserted where it differs) and
 * out[].pl. */
typedef struct {
    const op_def *def;
    const dt_mesh *mesh;
    op_cost_fn cost;                      /* prices candidate placements (op_cost) */
    int mesh_ndim;
    const int64_t *mesh_shape;
    int nin;
    op_arg in[OP_MAX_INPUTS];
    op_attrs attrs;
    /* what infer worked out of the attributes, for the op's hooks that run after it on this call
     * (shard, local, view, strided): slice, narrow and select keep dim, start, length and step */
    int64_t derived[4];
    int nout;
    op_arg out[OP_MAX_OUTPUTS];
    dt_placement want[OP_MAX_INPUTS][DT_MAX_DIMS];
} op_call;

/* A local piece on a device. */
typedef struct {
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    void *data;
} op_local;

/* What a kernel gets: its inputs' and outputs' local pieces, the attributes, and per-device
 * integers the op's `local` hook computed on the controller (e.g. where this piece starts). */
typedef struct {
    const op_def *def;
    const op_attrs *attrs;
    int nin;
    op_local in[OP_MAX_INPUTS];
    int nout;
    op_local out[OP_MAX_OUTPUTS];
    int nctx;
    int64_t ctx[OP_MAX_CTX];
} op_kernel;

struct op_def {
    const char *name;
    int id;                               /* its number in ops/op_table.h: what records carry */
    int nin;                              /* inputs, or -1: any number >= 1 */
    int nout;
    int (*infer)(op_call *c);             /* checks arguments, fills out[] shapes/dtypes; dt_err */
    int (*shard)(op_call *c);             /* fills want[] and out[].pl from in[].pl */
    /* optional: per-device integers for the kernel (mesh coordinate of the device given) */
    int (*local)(const op_call *c, const int64_t *coord, int64_t *ctx);
    /* how the bindings call it and where they put it (dtorch.h, dt_op_info) */
    dt_op_sig py_sig;
    int py_exports;                       /* DT_PY_* bits; 0 with DT_SIG_NONE */
    const char *py_floats;                /* DT_SIG_UNARY: "name=default, ..." of attrs.floats */
    const char *py_operator;              /* the Python operator that runs it ("__add__"), or "" */
    bool inplace;                         /* output 0 is input 0, written in place (ops/op_write.c) */
    /* optional: whether a device's output 0 may be input 0's own bytes, in the same row-major
     * order from *offset bytes in (reshape, and slices that keep one contiguous run). A worker
     * then makes the output share the input's storage instead of running the kernel: device
     * pieces are values (a write in place copies shared storage first), so sharing is safe.
     * False when it may not, or when the pieces do not fit (the kernel then says why). */
    bool (*alias)(const op_kernel *k, size_t *offset);
    /* optional, on the controller: whether output 0 can be a view of input 0 that no device needs
     * to hear of: with the placements shard chose and no input moved, every device's output piece
     * is the contiguous run of its input piece that starts *first elements in, the same *first on
     * every device (or the piece is empty). The op is then not sent at all (dt_op_run). */
    bool (*view)(const op_call *c, int64_t *first);
    /* optional, on the controller: whether output 0 can be a strided view of what input 0 reads
     * (in: input 0's map onto its frame), and its map (*out), when it is not one contiguous run:
     * permute, expand, a slice along a dim that is not sharded. The controller checks that every
     * sharded dim stays whole (op_strided_uniform), so the same map holds on every device. */
    bool (*strided)(const op_call *c, const op_strided *in, op_strided *out);
    /* infer holds for the local pieces too (elementwise ops): a worker checks a record's local
     * shapes and dtypes with it before the kernel runs (op_check_local) */
    bool infer_local;
};

/* The op with this id, or NULL. */
const op_def *op_by_id(int id);
/* The op named name, or NULL. */
const op_def *op_find(const char *name);
/* The op that Python's operator runs (its row's operator column: "__add__" gives add), or NULL. */
const op_def *op_find_operator(const char *dunder);
/* Every op in ops/op_table.h's order: op_nth(0) .. op_nth(op_count() - 1). */
int op_count(void);
const op_def *op_nth(int i);
/* The number a COMPUTE record carries for an op, and back: its id. */
int op_index(const op_def *def);
const op_def *op_at(int index);
/* A worker's check of a COMPUTE before its kernel runs, since the record came from a socket:
 * the counts of inputs and outputs the op takes, and for ops whose infer holds locally, the
 * output shapes and dtypes infer gives for the inputs' pieces. NULL when it may run, else why
 * not (a thread-local message). */
const char *op_check_local(const op_kernel *k);
/* FNV-1a over every op's number, name, nin and nout in registry order: a controller and a worker
 * built from other sources disagree on it, and HELLO carries it so that they find out. */
uint64_t op_registry_hash(void);

/* Strided views (ops/op_view_alias.c). The identity map of a tensor of ndim dims. */
void op_strided_identity(op_strided *s, int ndim);
/* Whether map s (a view of shape/pl over a frame of frame_shape/frame_pl) reads the same way on
 * every device: each mesh dim places view and frame alike, and a dim sharded in the view is its
 * frame dim, whole (start 0, step 1, the same size). */
bool op_strided_uniform(const op_strided *s, int mesh_ndim, const int64_t *shape, const dt_placement *pl,
                        const int64_t *frame_shape, const dt_placement *frame_pl);
/* Whether s reads its frame's elements in order, all of them (it is the frame itself). */
bool op_strided_is_identity(const op_strided *s, const int64_t *shape, const int64_t *frame_shape);
/* Whether a view of shape through s reads its frame (of frame_shape, C-contiguous) in row-major
 * order: as torch, a dim of one element places nothing and an empty view is contiguous. */
bool op_strided_rowmajor(const op_strided *s, const int64_t *shape, const int64_t *frame_shape);
/* The local view of map s on one device: the frame's local shape there (frame_local) and the
 * view's local sizes (local) give the first element and the element strides of the view in the
 * frame's piece (C-contiguous). */
void op_strided_local(const op_strided *s, const int64_t *frame_local, const int64_t *local, int64_t *first,
                      int64_t *strides);

/* Shared rule helpers (ops/op_rules.c). */
/* Result dtype of combining two dtypes as torch promotes them. */
dt_dtype op_promote(dt_dtype a, dt_dtype b);
/* Result dtype of a tensor op a Python scalar (a scalar does not widen a tensor of its kind). */
dt_dtype op_promote_scalar(dt_dtype t, dt_scalar s);
/* Broadcasts shapes a and b (right-aligned) into out; DT_EINVAL naming op on a mismatch. */
int op_broadcast(const char *op, int an, const int64_t *a, int bn, const int64_t *b, int *on, int64_t *out);
/* Normalises dim for ndim dims (negative from the end); DT_EINDEX naming op when out of range. */
int op_dim(const char *op, int64_t dim, int ndim, int *out);
void op_replicate_all(dt_placement *pl, int mesh_ndim);
/* Bytes moved to bring input i to placements to (0 when it already has them). */
int64_t op_cost(const op_call *c, int i, const dt_placement *to);
bool op_same_placements(const dt_placement *a, const dt_placement *b, int mesh_ndim);

/* Where the dims of a product are (ops/op_matmul.c; its kernels read their pieces the same way):
 * a (batch..., M, K), b (batch..., K, N), or b a weight (N, K) for linear; M is absent for a 1-D a
 * and N for a 1-D b (-1). */
typedef struct {
    int a_m, a_k, b_k, b_n, o_m, o_n;
    int nbatch, a_nbatch, b_nbatch;
    bool b_trans;
} op_mm_dims;
op_mm_dims op_mm_layout(int a_ndim, int b_ndim, bool linear);
/* A product's local pieces on a device, as every backend's kernel reads them: their layout (*d)
 * and M, K, N, checked against the op, each other and the output (a bias, linear's third input,
 * broadcasting into it). NULL, or why they do not fit: a record from a socket can name any shapes. */
const char *op_mm_local(const op_kernel *k, op_mm_dims *d, int64_t *M, int64_t *K, int64_t *N);

/* The writes in place on a device (ops/op_write.c, every backend's kernel): dst is output 0, input 0's
 * bytes, of input 0's shape and dtype. slice_assign_, shard_assign_ (dst, src; ints [dim, start];
 * ctx[0] where this piece starts on dim): the part [*lo, *hi) of the region, in global positions along
 * dim, that falls in this piece (empty when either piece is). index_copy_ (dst, index, src; ints
 * [dim]): the *n positions, a 1-D (or 0-D) int64 index, and src of dst's sizes but *n on dim. NULL, or
 * why the pieces do not fit together. */
const char *op_slice_assign_local(const op_kernel *k, int *dim, int64_t *lo, int64_t *hi);
const char *op_index_copy_local(const op_kernel *k, int *dim, int64_t *n);

/* clamp's bounds for a kernel computing in cd (every backend's): for float32, the two doubles
 * (an absent bound an infinity); for an integer type, the bits of two int64s, exact from
 * attrs.ints[2..3] where given, else the float attributes converted (an absent bound INT64_MIN or
 * INT64_MAX). NULL, or why the attributes are not clamp's. */
const char *op_clamp_bounds(const op_kernel *k, dt_dtype cd, double *bounds);

/* rope on a device (every backend's kernel): NULL when x (B, H, S, D) of a floating dtype, positions
 * (B or 1, S) int64, inv_freq (D/2,) float32, the scaling and the output (x's shape and dtype) fit
 * together, or why not. */
const char *op_rope_local(const op_kernel *k);

/* cat and stack on a device (every backend's kernel): the output dim the pieces join along
 * (attrs.ints[0], negative from the end), or -1 when the attributes name none of its dims. */
int op_cat_dim(const op_kernel *k);
/* ... and the block input i fills in the output: its shape, of the output's rank (stack: a size-1
 * dim at dim), starting at *pos along dim, which it advances. NULL, or why the local pieces do
 * not line up (nothing from a socket is trusted). */
const char *op_cat_block(const op_kernel *k, int i, int dim, int64_t *pos, int64_t *shape);

/* The other views on a device (ops/op_view_local.c, every backend's kernel): NULL, or why the
 * pieces and attributes do not fit together as the controller makes them (nothing from a socket is
 * trusted). permute: perm[i] the input dim of output dim i (attrs.ints, a permutation of the input's
 * dims). expand: the input broadcasts to the output (right-aligned). index_select: *dim the input's
 * dim that int32 or int64 positions (at most 1-D) select along (attrs.ints[0]). triu/tril: the global
 * row and column of the piece's first element (ctx) and the diagonal (attrs.ints[0]), clamped far
 * beyond any dim so that no sum of them overflows. */
const char *op_permute_local(const op_kernel *k, int *perm);
const char *op_expand_local(const op_kernel *k);
const char *op_index_select_local(const op_kernel *k, int *dim);
const char *op_tri_local(const op_kernel *k, int64_t *row0, int64_t *col0, int64_t *diag);

/* How scaled_dot_product_attention's kernels read their local pieces (ops/op_matmul.c, for every
 * backend): q (..., L, E) holds nbatch matrices of L rows, k (..., S, E) and v (..., S, Ev) those of
 * the key/value heads; query matrix b attends to key/value matrix (b / Hq) * H + (b % Hq) / group.
 * The optional mask (in[3]: bool, or float added to the scores) broadcasts onto the attention
 * weights (..., L, S): its element of weight (b..., i, j) is at the offset of b over q's batch
 * dims by mask_stride[0..nd-2), plus i * mask_stride[nd-2] + j * mask_stride[nd-1]. */
typedef struct {
    int nd;                           /* dims of q, k, v and the output */
    int64_t nbatch;                   /* q's (batch..., head) matrices */
    int64_t L, S, E, Ev;
    int64_t Hq, H, group;             /* query heads, key/value heads, query heads per key/value head */
    bool causal;                      /* key j visible to row i iff j <= row0 + i */
    int64_t row0;                     /* the global index of this piece's first query row */
    float scale;                      /* the scores are scale * (q . k) */
    int64_t mask_stride[DT_MAX_DIMS]; /* element strides of the mask over the weights' dims, 0 where
                                         it broadcasts (all 0 without a mask) */
} op_sdpa_dims;

/* The dims of kernel k's pieces (row0 clamped to S, past which it changes nothing): NULL, or why
 * they do not fit together (shapes or dtypes infer would not give, a negative row0). */
const char *op_sdpa_layout(const op_kernel *k, op_sdpa_dims *d);

/* embedding on a device (every backend's kernel): *n the positions (int32 or int64) whose rows of the
 * 2-D weight make the output (the positions' shape, then the weight's row), ctx = [the weight's first
 * row here (>= 0), the vocabulary size]. NULL, or why the pieces do not fit together. */
const char *op_embedding_local(const op_kernel *k, int64_t *n);

/* attention_block on a device (every backend's kernel): whether its pieces fit together as the
 * controller made them (q, k, v of one floating dtype, int64 positions, float32 outputs and
 * accumulators of q's rows, sizes a kernel's int indices hold). Nothing from a socket is trusted. */
bool op_attention_block_fits(const op_kernel *k);
/* attention_merge: NULL with the parts' count P, the merged rows (B * H * L) and Dv, or why the
 * pieces do not fit together. */
const char *op_attention_merge_layout(const op_kernel *k, int64_t *P, int64_t *rows, int64_t *Dv);

/* slice, narrow, select on a device: ctx = {dim, start, step}; the block of the input the output
 * takes, of the input's rank (select: size 1 at dim), elements start, start + step, ... along dim. */
typedef struct {
    int dim;
    int64_t start, step;
    int64_t shape[DT_MAX_DIMS];
} op_slice_dims;
/* NULL (an empty block: shape holds a 0; a block of one element along dim: step 1), or why the
 * pieces do not match (ops/op_view_local.c). */
const char *op_slice_layout(const op_kernel *k, op_slice_dims *s);

/* sum, mean, amax, amin, max, min on a device: ctx = [mask of the reduced dims, ...]; the mask, the
 * elements each output folds together (0 for an empty piece), and the output's elements. NULL, or
 * why the pieces do not fit together (a mask of dims the piece lacks, an output that is not the
 * piece reduced, a dtype infer would not give). */
const char *op_reduce_layout(const op_kernel *k, uint32_t *mask, int64_t *extent, int64_t *n_out);
/* max/min along a dim, argmax/argmin, softmax, log_softmax, cumsum, topk (ctx[0] = the dim, -1 for
 * argmax/argmin over every element) and layer_norm, rms_norm (ctx = [elements per row, has_weight |
 * has_bias << 1]) on a device: the input piece as outer blocks of n rows of inner elements along the
 * dim (norms: rows of n, inner 1; every element: (1, numel, 1)), all 0 when it is empty. NULL, or why
 * the pieces do not fit together (a dim the piece lacks, outputs or a weight of other shapes or
 * dtypes than infer gives, topk's k past the dim). */
const char *op_along_layout(const op_kernel *k, int64_t *outer, int64_t *n, int64_t *inner);
/* The value of max/min over nothing in dtype d: what a device with an empty shard contributes to a
 * Partial(max|min), so that the others' values win. */
dt_scalar op_reduce_identity(dt_dtype d, bool max);

/* ---- the image ops on a device (ops/op_image.c, for every backend's kernels) ------------------
 * Each reads its kernel's pieces and attributes as the controller made them: NULL, or why they do
 * not fit together (nothing from a socket is trusted). */

/* conv2d (input (N, C, H, W), weight (O, C / groups, kH, kW)[, bias (O,)]); ints [stride_h,
 * stride_w, pad_top, pad_bottom, pad_left, pad_right, dilation_h, dilation_w, groups]. The weight
 * piece may hold some of the output channels (groups = 1): the output piece has as many. N is 0 when
 * the output has no element (the kernels then compute nothing: the sizes of an empty piece need not
 * multiply within int64); the stride of an axis of one output position is 1. */
typedef struct {
    int64_t N, C, H, W, O, kH, kW, OH, OW;
    int64_t stride[2], pad_top, pad_left, dilation[2], groups;
} op_conv2d_dims;
const char *op_conv2d_layout(const op_kernel *k, op_conv2d_dims *d);
/* A 1x1 kernel of stride 1 without padding: the image itself is the product's operand (no im2col). */
bool op_conv2d_direct(const op_conv2d_dims *d);

/* group_norm (input (N, C, ...)[, weight][, bias]); ints [num_groups, has_weight | has_bias << 1];
 * floats [eps]: S the elements per channel; *weight and *bias NULL where not given. */
typedef struct {
    int64_t N, C, S, G;
    const op_local *weight, *bias;
    float eps;
} op_group_norm_dims;
const char *op_group_norm_layout(const op_kernel *k, op_group_norm_dims *d);

/* interpolate (input (N, C, L) or (N, C, H, W)); ints [mode, align_corners, output sizes...];
 * floats [scale factors...] (0: none). P = N * C planes of IH x IW into OH x OW (1-D: IH = OH = 1). */
typedef struct {
    int mode, align_corners, nspatial;
    int64_t P, IH, IW, OH, OW;
} op_interpolate_dims;
const char *op_interpolate_layout(const op_kernel *k, op_interpolate_dims *d);
/* Source positions of one resampled axis (op_image_math.h's, for every output position o). */
void op_resample_axis(int64_t in, int64_t out, int mode, int align_corners, double scale_factor, int64_t *i0,
                      int64_t *i1, float *l1);
/* Both axes' sources of d into h0, h1 (OH each), w0, w1 (OW each), lh (OH) and lw (OW). */
void op_interpolate_sources(const op_kernel *k, const op_interpolate_dims *d, int64_t *h0, int64_t *h1, float *lh,
                            int64_t *w0, int64_t *w1, float *lw);

/* pad (input); ints [mode, (left, right) per dim from the last...]; floats [value]: mode 0
 * constant, 1 reflect, 2 replicate; left[d] elements before dim d (negative: cropped), and the
 * constant's bits in the input's dtype (the low bytes of *fill). */
const char *op_pad_layout(const op_kernel *k, int *mode, int64_t *left, uint64_t *fill);

#endif
