/* op_table — every op DTorch runs, one row each: its name (torch's), its number, and what its
 * family's rules need to know about it.
 *
 * The number (id) is declared here, not taken from the row's position: it is what a COMPUTE
 * record carries and what kernels are looked up by, so a new op or a new family takes a new
 * number and renumbers nothing. Ids are unique (a duplicate fails to compile in op_registry.c)
 * and below OP_ID_LIMIT.
 *
 * Each family's file (ops/op_<family>.c) turns its rows into op_defs with its infer and shard
 * rules. Every backend runs a row with its kernel <backend>_k_<kernel> (the CPU's in
 * ops/cpu/cpu_<family>.c, CUDA's in ops/cuda/cuda_<family>.c): the families whose rows share
 * kernels name the kernel in a column, the others' kernel is the op's name (OP_KERNELS, at the end).
 * A row whose kernel a built backend lacks fails the build (an undefined reference to
 * cuda_k_<kernel>, say). The Python bindings make dtorch.<name>, DTensor.<name>,
 * dtorch.nn.functional.<name> and Python's operators of the elementwise rows that name where Python
 * has them. docs/ADDING-AN-OP.md walks through adding one. */
#ifndef OP_TABLE_H
#define OP_TABLE_H

#define OP_ID_LIMIT 128 /* every id is below it (raise it when the ids get there) */

/* ---- elementwise (ops/op_pointwise.c) ---------------------------------------------------------
 * Each op's kernel on every backend is its line in ops/op_pointwise_math.h (where, masked_fill,
 * clamp, to and logical_not: a kernel of their own in each backend).
 * kind:     UNARY f(x[, float attributes]); BINARY a op b, one side may be attrs.scalar (ints[0] =
 *           1: the number is on the left, as in 2 - x); WHERE, MASKED_FILL, CLAMP, TO (see
 *           op_pointwise.c)
 * dtype:    SAME the input's; FLOATING the input's when floating, else float32; PROMOTE torch's
 *           promotion; TRUE_DIV promotion, then float32 if not floating; COMPARE bool, computed in
 *           the promotion; LOGICAL bool
 * domain:   the types its kernels compute in, which is the list of ops/op_pointwise_math.h its line
 *           is in (a line in another list fails to compile): FLOAT float32 (16-bit floats compute in
 *           float32); NUMBER float32, int32, int64; ANY those and bool; BOOL bool. A SAME or PROMOTE
 *           op whose domain lacks bool refuses bool operands (pow takes them as int64, as torch)
 * Partial:  which Partial inputs pass through (NONE, LINEAR, ADD, MUL, DIV: see op_pointwise.c)
 * Python:   where the bindings put it (DT_PY_FN dtorch.<name>, DT_PY_METHOD DTensor.<name>,
 *           DT_PY_NN dtorch.nn.functional.<name>; 0: a hand-written wrapper in bindings/dtorch)
 * operator: the Python operator that runs it on a DTensor ("__add__": x + y, x + 2 and 2 + x), or ""
 * floats:   the float attributes of a UNARY op, in order, with their defaults ("" for none) */
#define OP_POINTWISE(X)                                                                                                                      \
    /* name         id  kind         dtype     domain  Partial Python                                 operator        floats */              \
    X(neg,          0, UNARY,       SAME,     NUMBER, LINEAR, DT_PY_FN | DT_PY_METHOD,               "__neg__",      "")                     \
    X(abs,          1, UNARY,       SAME,     NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD,               "__abs__",      "")                     \
    X(exp,          2, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(log,          3, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(sqrt,         4, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(rsqrt,        5, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(sin,          6, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(cos,          7, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(tanh,         8, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD | DT_PY_NN,    "",             "")                     \
    X(sigmoid,      9, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD | DT_PY_NN,    "",             "")                     \
    X(relu,        10, UNARY,       SAME,     NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD | DT_PY_NN,    "",             "")                     \
    X(silu,        11, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_NN,                   "",             "")                     \
    X(gelu,        12, UNARY,       FLOATING, FLOAT,  NONE,   0,                                     "",             "")                     \
    X(gelu_tanh,   13, UNARY,       FLOATING, FLOAT,  NONE,   0,                                     "",             "")                     \
    X(reciprocal,  14, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(logical_not, 15, UNARY,       LOGICAL,  BOOL,   NONE,   DT_PY_FN | DT_PY_METHOD,               "__invert__",   "")                     \
    X(erf,         71, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(softplus,    72, UNARY,       FLOATING, FLOAT,  NONE,   DT_PY_NN,                              "",             "beta=1, threshold=20") \
    X(floor,       83, UNARY,       SAME,     NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(ceil,        84, UNARY,       SAME,     NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(round,       85, UNARY,       SAME,     NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(trunc,       86, UNARY,       SAME,     NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(to,          16, TO,          SAME,     ANY,    LINEAR, 0,                                     "",             "")                     \
    X(add,         17, BINARY,      PROMOTE,  ANY,    ADD,    DT_PY_FN | DT_PY_METHOD,               "__add__",      "")                     \
    X(sub,         18, BINARY,      PROMOTE,  NUMBER, ADD,    DT_PY_FN | DT_PY_METHOD,               "__sub__",      "")                     \
    X(mul,         19, BINARY,      PROMOTE,  ANY,    MUL,    DT_PY_FN | DT_PY_METHOD,               "__mul__",      "")                     \
    X(div,         20, BINARY,      TRUE_DIV, FLOAT,  DIV,    DT_PY_FN | DT_PY_METHOD,               "__truediv__",  "")                     \
    X(pow,         21, BINARY,      PROMOTE,  NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD,               "__pow__",      "")                     \
    X(floor_divide,87, BINARY,      PROMOTE,  NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD,               "__floordiv__", "")                     \
    X(remainder,   88, BINARY,      PROMOTE,  NUMBER, NONE,   DT_PY_FN | DT_PY_METHOD,               "__mod__",      "")                     \
    X(maximum,     22, BINARY,      PROMOTE,  ANY,    NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(minimum,     23, BINARY,      PROMOTE,  ANY,    NONE,   DT_PY_FN | DT_PY_METHOD,               "",             "")                     \
    X(eq,          24, BINARY,      COMPARE,  ANY,    NONE,   DT_PY_FN | DT_PY_METHOD,               "__eq__",       "")                     \
    X(ne,          25, BINARY,      COMPARE,  ANY,    NONE,   DT_PY_FN | DT_PY_METHOD,               "__ne__",       "")                     \
    X(lt,          26, BINARY,      COMPARE,  ANY,    NONE,   DT_PY_FN | DT_PY_METHOD,               "__lt__",       "")                     \
    X(le,          27, BINARY,      COMPARE,  ANY,    NONE,   DT_PY_FN | DT_PY_METHOD,               "__le__",       "")                     \
    X(gt,          28, BINARY,      COMPARE,  ANY,    NONE,   DT_PY_FN | DT_PY_METHOD,               "__gt__",       "")                     \
    X(ge,          29, BINARY,      COMPARE,  ANY,    NONE,   DT_PY_FN | DT_PY_METHOD,               "__ge__",       "")                     \
    X(logical_and, 30, BINARY,      LOGICAL,  BOOL,   NONE,   DT_PY_FN | DT_PY_METHOD,               "__and__",      "")                     \
    X(logical_or,  31, BINARY,      LOGICAL,  BOOL,   NONE,   DT_PY_FN | DT_PY_METHOD,               "__or__",       "")                     \
    X(where,       32, WHERE,       PROMOTE,  ANY,    NONE,   0,                                     "",             "")                     \
    X(masked_fill, 33, MASKED_FILL, SAME,     ANY,    NONE,   0,                                     "",             "")                     \
    X(clamp,       34, CLAMP,       SAME,     NUMBER, NONE,   0,                                     "",             "")

/* ---- reductions and normalisation (ops/op_reduce.c): name, id, kernel, inputs (-1: any), outputs
 * Attributes (attrs.ints unless said):
 *   sum, mean             [keepdim, dtype or -1, dims...]   (no dims: every dim)
 *   amax, amin            [keepdim, -1, dims...]
 *   max, min              none (every dim)
 *   max_dim, min_dim      [dim, keepdim]                    -> (values, indices)
 *   argmax, argmin        [keepdim] or [keepdim, dim]
 *   softmax, log_softmax, cumsum   [dim, dtype or -1]
 *   topk                  [k, dim, largest, sorted]         -> (values, indices)
 *   layer_norm            inputs (x[, weight][, bias]); [has_weight | has_bias << 1, normalized_shape...];
 *                         floats [eps]
 *   rms_norm              inputs (x[, weight]); [has_weight, normalized_shape...]; floats [eps], or none
 *                         for torch's default (float32's epsilon) */
#define OP_REDUCE(X)                                                                                                   \
    X(sum,         35, reduce,   1,  1)                                                                                \
    X(mean,        36, reduce,   1,  1)                                                                                \
    X(amax,        37, reduce,   1,  1)                                                                                \
    X(amin,        38, reduce,   1,  1)                                                                                \
    X(max,         39, reduce,   1,  1)                                                                                \
    X(min,         40, reduce,   1,  1)                                                                                \
    X(max_dim,     41, arg,      1,  2)                                                                                \
    X(min_dim,     42, arg,      1,  2)                                                                                \
    X(argmax,      43, arg,      1,  1)                                                                                \
    X(argmin,      44, arg,      1,  1)                                                                                \
    X(softmax,     45, softmax,  1,  1)                                                                                \
    X(log_softmax, 46, softmax,  1,  1)                                                                                \
    X(cumsum,      47, cumsum,   1,  1)                                                                                \
    X(topk,        48, topk,     1,  2)                                                                                \
    X(layer_norm,  49, norm,    -1,  1)                                                                                \
    X(rms_norm,    50, norm,    -1,  1)

/* ---- views and data movement (ops/op_view.c; the hooks that spare a copy in ops/op_view_alias.c):
 * name, id, kernel, inputs (-1: any), rules (infer, shard), local hook, alias hook (a device's output
 * may be its input's bytes: op_def.alias), view hook (the output needs nothing from the devices:
 * op_def.view), strided hook (nor does a strided output: op_def.strided) ---------------------------
 * Attributes (attrs.ints): reshape: the shape (one -1 may be inferred); flatten: start, end;
 * unsqueeze: dim; squeeze: the dims (none: every size-1 dim); permute: the dims; expand: the sizes
 * (-1 keeps a size); cat/stack: dim; slice: dim, start, stop, step (Python slice bounds, step > 0);
 * narrow: dim, start, length; select: dim, index; index_select: dim, wrap (1: negative positions
 * count from the end, as x[idx]); triu/tril: diagonal. */
#define OP_VIEW(X)                                                                                                                                      \
    X(reshape,      51, reshape,      1,  s_infer_reshape,      s_shard_reshape,      NULL,          op_alias_whole, op_view_whole, op_strided_ones)    \
    X(flatten,      52, reshape,      1,  s_infer_reshape,      s_shard_reshape,      NULL,          op_alias_whole, op_view_whole, op_strided_ones)    \
    X(unsqueeze,    53, reshape,      1,  s_infer_reshape,      s_shard_reshape,      NULL,          op_alias_whole, op_view_whole, op_strided_ones)    \
    X(squeeze,      54, reshape,      1,  s_infer_reshape,      s_shard_reshape,      NULL,          op_alias_whole, op_view_whole, op_strided_ones)    \
    X(permute,      55, permute,      1,  s_infer_permute,      s_shard_permute,      NULL,          NULL,           NULL,          op_strided_permute) \
    X(expand,       56, expand,       1,  s_infer_expand,       s_shard_expand,       NULL,          NULL,           NULL,          op_strided_expand)  \
    X(cat,          57, cat,          -1, s_infer_cat,          s_shard_cat,          NULL,          NULL,           NULL,          NULL)               \
    X(stack,        58, cat,          -1, s_infer_cat,          s_shard_cat,          NULL,          NULL,           NULL,          NULL)               \
    X(slice,        59, slice,        1,  s_infer_slice,        s_shard_slice,        s_local_slice, op_alias_slice, op_view_slice, op_strided_slice)   \
    X(narrow,       60, slice,        1,  s_infer_slice,        s_shard_slice,        s_local_slice, op_alias_slice, op_view_slice, op_strided_slice)   \
    X(select,       61, slice,        1,  s_infer_slice,        s_shard_slice,        s_local_slice, op_alias_slice, op_view_slice, op_strided_slice)   \
    X(index_select, 62, index_select, 2,  s_infer_index_select, s_shard_index_select, NULL,          NULL,           NULL,          NULL)               \
    X(triu,         63, tri,          1,  s_infer_tri,          s_shard_same,         s_local_tri,   NULL,           NULL,          NULL)               \
    X(tril,         64, tri,          1,  s_infer_tri,          s_shard_same,         s_local_tri,   NULL,           NULL,          NULL)

/* ---- products, embeddings, attention (ops/op_matmul.c): name, id, kernel, inputs (-1: any), rules
 * (infer, shard), local hook ----------------------------------------------------------------------
 * matmul, mm, bmm: (a, b). linear: (input, weight[, bias]); ctx[0] = add the bias here.
 * embedding: (indices, weight); ctx = [first weight row here, vocabulary size].
 * scaled_dot_product_attention: (q, k, v[, mask]); ints = [is_causal, enable_gqa, has_scale],
 * floats = [scale]; ctx[0] = first query row here. */
#define OP_MATMUL(X)                                                                                                   \
    X(matmul,                       65, mm,        2,  s_infer_mm,        s_shard_mm,        NULL)                     \
    X(mm,                           66, mm,        2,  s_infer_mm,        s_shard_mm,        NULL)                     \
    X(bmm,                          67, mm,        2,  s_infer_mm,        s_shard_mm,        NULL)                     \
    X(linear,                       68, mm,        -1, s_infer_mm,        s_shard_mm,        s_local_linear)           \
    X(embedding,                    69, embedding, 2,  s_infer_embedding, s_shard_embedding, s_local_embedding)        \
    X(scaled_dot_product_attention, 70, sdpa,      -1, s_infer_sdpa,      s_shard_sdpa,      s_local_sdpa)

/* ---- rotary position embedding (ops/op_rope.c): name, id, inputs ----------------------------------
 * rope: (x (B, H, S, D), positions (B or 1, S) int64, inv_freq (D/2,) float32); floats = [scaling]. */
#define OP_ROPE(X)                                                                                                     \
    X(rope,                         73,  3)

/* ---- writes in place (ops/op_write.c): name, id, kernel, inputs, rules (infer, shard, local) -----
 * slice_assign_: (dst, src); ints = [dim, start]: dst[..., start:start + n, ...] = src on dim.
 * shard_assign_: (dst, src); ints = [dim, offset]: on every device, src's piece lands at `offset`
 *                along dim of dst's piece (both split alike on dim: nothing moves).
 * index_copy_:   (dst, index (n,) int64, src); ints = [dim]: dst[..., index[i], ...] = src[..., i, ...]
 *                on dim (torch's index_copy_): the positions are a tensor, so a captured write goes
 *                where the devices say on every replay. */
#define OP_WRITE(X)                                                                                                    \
    X(slice_assign_, 74, slice_assign, 2,  s_infer,       s_shard_slice,  s_local_slice)                               \
    X(shard_assign_, 77, slice_assign, 2,  s_infer,       s_shard_pieces, s_local_pieces)                              \
    X(index_copy_,   78, index_copy,   3,  s_infer_index, s_shard_index,  NULL)

/* ---- attention by blocks of keys (ops/op_attention.c): name, id, inputs (-1: any), outputs ---------
 * attention_block: (q (B, Hq, Lq, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), q_index (B or 1, Lq) int64,
 *     k_index (B or 1, S) int64[, o_acc (B, Hq, Lq, Dv) float32, lse_acc (B, Hq, Lq) float32])
 *     -> (o (B, Hq, Lq, Dv) float32, lse (B, Hq, Lq) float32): this block's attention merged into the
 *     accumulators; ints = [is_causal], floats = [scale]. Key j is visible to query i iff
 *     k_index[j] >= 0 and (not causal or k_index[j] <= q_index[i]).
 * attention_merge: (o_parts (P*B, H, L, Dv) float32, lse_parts (P*B, H, L) float32) -> (o, lse): P
 *     partial results stacked along dim 0 (as cat gives them) merged into one; ints = [P]. */
#define OP_ATTENTION(X)                                                                                                \
    X(attention_block,              75, -1, s_infer_block,     s_shard_block)                                         \
    X(attention_merge,              76,  2, s_infer_merge,     s_shard_merge)

/* ---- images: convolution, group normalisation, resampling, padding (ops/op_image.c): name, id,
 * inputs (-1: any), rules (infer, shard) ----------------------------------------------------------
 * conv2d:      (input (N, C, H, W), weight (O, C / groups, kH, kW)[, bias (O,)]); ints = [stride_h,
 *              stride_w, pad_top, pad_bottom, pad_left, pad_right, dilation_h, dilation_w, groups]
 *              (padding on each side: torch's padding="same" with an even kernel pads one more at
 *              the bottom and right)
 * group_norm:  (input (N, C, *)[, weight (C,)][, bias (C,)]); ints = [num_groups, has_weight |
 *              has_bias << 1]; floats = [eps]
 * interpolate: (input (N, C, L) or (N, C, H, W)); ints = [mode (0 nearest, 1 linear/bilinear,
 *              2 nearest-exact), align_corners, output sizes (one per spatial dim)...]; floats =
 *              [scale factor per spatial dim] (0: none given, the scale is input / output size)
 * pad:         (input); ints = [mode (0 constant, 1 reflect, 2 replicate), (left, right) per dim
 *              from the last...]; floats = [value] (constant) */
#define OP_IMAGE(X)                                                                                                    \
    X(conv2d,                       79, -1, s_infer_conv,        s_shard_conv)                                        \
    X(group_norm,                   80, -1, s_infer_group_norm,  s_shard_group_norm)                                  \
    X(interpolate,                  81,  1, s_infer_interpolate, s_shard_interpolate)                                 \
    X(pad,                          82,  1, s_infer_pad,         s_shard_pad)

/* ---- products with quantized weights (ops/op_quant.c): name, id, bits ------------------------------
 * linear_int8: (input (..., K) float32, qweight (N, ceil(K/4)) int32, scale (N,) float32[, bias (N,)
 *              float32]) -> (..., N) float32: out = scale[n] * sum_k input[k] * q[n, k] (+ bias), q[n, k]
 *              the signed byte k of row n's bytes (the int32 words only pad each row to 4 bytes).
 * linear_int4: (input, qweight (N, ceil(K/8)) int32, scale (N, ceil(K/32)) float32[, bias]): q[n, k] the
 *              4-bit two's-complement value in byte k/2 of row n (low half for even k), scaled by
 *              scale[n, k/32]. ctx = [add the bias here, where this piece's features start in the
 *              input's piece]. */
#define OP_QUANT(X)                                                                                                    \
    X(linear_int8,                  89,  8)                                                                            \
    X(linear_int4,                  90,  4)

/* Every op; a row starts with its name and id whatever its family. */
#define OP_TABLE(X)                                                                                                    \
    OP_POINTWISE(X) OP_REDUCE(X) OP_VIEW(X) OP_MATMUL(X) OP_ROPE(X) OP_WRITE(X) OP_ATTENTION(X) OP_IMAGE(X) OP_QUANT(X)

/* OP_KERNEL(name, id, kernel) of every op, for a backend to build its table of kernels and declare
 * them (ops/cpu/cpu_ops.c, ops/cuda/cuda_backend.c): it defines OP_KERNEL, then expands OP_KERNELS.
 * The elementwise, rotary, attention, image and quantized ops' kernels are their names; the other families'
 * rows name theirs. */
#define OP_KERNEL_NAME_(name, id, ...) OP_KERNEL(name, id, name)
#define OP_KERNEL_COLUMN_(name, id, kernel, ...) OP_KERNEL(name, id, kernel)
#define OP_KERNELS                                                                                                     \
    OP_POINTWISE(OP_KERNEL_NAME_) OP_REDUCE(OP_KERNEL_COLUMN_) OP_VIEW(OP_KERNEL_COLUMN_)                              \
    OP_MATMUL(OP_KERNEL_COLUMN_) OP_ROPE(OP_KERNEL_NAME_) OP_WRITE(OP_KERNEL_COLUMN_)                                  \
    OP_ATTENTION(OP_KERNEL_NAME_) OP_IMAGE(OP_KERNEL_NAME_) OP_QUANT(OP_KERNEL_NAME_)

/* OP_ID_<name>: the id of each op, for the code that runs one op in particular. */
#define OP_ID_ENUM_(name, id, ...) OP_ID_##name = (id),
typedef enum { OP_TABLE(OP_ID_ENUM_) } op_id;
#undef OP_ID_ENUM_

#endif
