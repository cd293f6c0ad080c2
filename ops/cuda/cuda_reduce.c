/* cuda_reduce — the drivers of the reductions on the GPU (sum, mean, amax, amin, max, min, max/min
 * along a dim, argmax, argmin), softmax, log_softmax, cumsum, topk, layer_norm and rms_norm:
 * cpu_reduce.c's kernels on device memory, with its dtypes, empty-piece values and NaN and tie rules (the kernels
 * are in cuda_reduce_kernels.cu). ctx is what op_reduce.c's local hook gives the CPU too.
 *
 * Pieces are read in place in their compute type (float32 from every floating dtype, int64 from
 * int32, int64 and bool); only a piece that must first become another dtype (an integer summed as
 * a float, or a dtype= that loses precision, which torch applies before reducing) goes through a
 * converted copy on the compute stream. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

/* Converting to cast (what a dtype= argument asks for) first loses what the compute type would
 * keep: to a 16-bit float, or to bool (cpu_reduce.c's rule). */
static bool s_lossy(dt_dtype from, dt_dtype cast)
{
    return cast != from && (cast == DT_FLOAT16 || cast == DT_BFLOAT16 || cast == DT_BOOL);
}

/* Whether the kernels read dtype d in place in float32 (floating) or int64. */
static bool s_readable(dt_dtype d, bool floating) { return dt_dtype_is_float(d) == floating; }

/* The piece as the kernels read it, as torch sees it after converting it to cast: in place, or a
 * converted copy (*copy, for the caller to free). */
static const char *s_source(cuda_ctx *c, const op_local *p, bool floating, dt_dtype cast, const void **data,
                            dt_dtype *dtype, void **copy)
{
    *data = p->data;
    *dtype = p->dtype;
    *copy = NULL;
    dt_dtype want = s_lossy(p->dtype, cast) ? cast : p->dtype;
    if (!s_readable(want, floating))
        want = floating ? DT_FLOAT32 : DT_INT64;
    if (want == p->dtype)
        return NULL;
    int64_t n = dt_layout_numel(p->ndim, p->shape);
    const char *why = cuda_scratch(c, (size_t)n * dt_dtype_size(want), copy);
    if (!why)
        why = cuda_check(cuda_convert(*copy, want, p->data, p->dtype, n, c->compute), "conversion");
    *data = *copy;
    *dtype = want;
    return why;
}

/* The dims grouped as every backend's reductions group them (dt_layout_group_dims), split into
 * kept and folded, with C-contiguous element strides. */
static void s_fold_layout(cuda_fold_args *a, int ndim, const int64_t *shape, uint32_t mask)
{
    int64_t size[DT_MAX_DIMS], stride[DT_MAX_DIMS];
    bool folded[DT_MAX_DIMS];
    int groups = dt_layout_group_dims(ndim, shape, mask, size, folded);
    for (int64_t g = groups - 1, s = 1; g >= 0; s *= size[g--])
        stride[g] = s;
    a->nkeep = a->nfold = 0;
    a->n_out = a->n_fold = 1;
    for (int g = 0; g < groups; g++) {
        if (folded[g]) {
            a->fold_size[a->nfold] = size[g];
            a->fold_stride[a->nfold++] = stride[g];
            a->n_fold *= size[g];
        } else {
            a->keep_size[a->nkeep] = size[g];
            a->keep_stride[a->nkeep++] = stride[g];
            a->n_out *= size[g];
        }
    }
}

/* Folds in over mask into the values (and positions) of a. */
static const char *s_fold(cuda_ctx *c, cuda_fold_op op, bool floating, dt_dtype cast, const op_local *in,
                          uint32_t mask, cuda_fold_args *a)
{
    void *copy;
    const char *why = s_source(c, in, floating, cast, &a->in, &a->in_dtype, &copy);
    s_fold_layout(a, in->ndim, in->shape, mask);
    if (!why)
        why = cuda_check(cuda_fold(op, floating, a, c->compute), "reduction kernel");
    cuda_scratch_free(c, copy);
    return why;
}

/* sum, mean, amax, amin, max, min: ctx = [mask of the reduced dims, elements each output averages] */
const char *cuda_k_reduce(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int id = k->def->id;
    uint32_t mask;
    int64_t n_out, extent;
    if ((why = op_reduce_layout(k, &mask, &extent, &n_out)))
        return why;
    if (n_out == 0)
        return NULL;
    bool sum = id == OP_ID_sum || id == OP_ID_mean, max = id == OP_ID_amax || id == OP_ID_max;
    if (extent == 0) { /* an empty shard (or an empty reduced dim, for sum and mean) */
        dt_scalar v = id == OP_ID_sum    ? (dt_scalar){.is_int = true, .i = 0}
                      : id == OP_ID_mean ? (dt_scalar){.f = k->ctx[1] ? 0.0 : NAN}
                                         : op_reduce_identity(out->dtype, max);
        return cuda_backend.fill(out->data, out->dtype, n_out, v);
    }
    cuda_fold_args a = {.out = out->data, .out_dtype = out->dtype, .divisor = id == OP_ID_mean ? k->ctx[1] : 0};
    cuda_fold_op op = sum ? CUDA_FOLD_SUM : max ? CUDA_FOLD_MAX : CUDA_FOLD_MIN;
    return s_fold(c, op, dt_dtype_is_float(out->dtype), sum ? out->dtype : in->dtype, in, mask, &a);
}

/* max/min along a dim (values, positions), argmax, argmin (positions): ctx[0] = the dim, or -1 for
 * every element (argmax/argmin without a dim: the position in the flattened piece) */
const char *cuda_k_arg(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *in = &k->in[0];
    int id = k->def->id;
    bool arg = id == OP_ID_argmax || id == OP_ID_argmin;
    int64_t outer, n, inner;
    if ((why = op_along_layout(k, &outer, &n, &inner)))
        return why;
    if (outer * n * inner == 0)
        return NULL;
    int dim = (int)k->ctx[0];
    uint32_t mask = dim < 0 ? (in->ndim ? (1u << in->ndim) - 1u : 0u) : 1u << dim;
    cuda_fold_args a = {.out = arg ? NULL : k->out[0].data,
                        .out_dtype = k->out[0].dtype,
                        .index = k->out[arg ? 0 : 1].data};
    bool max = id == OP_ID_argmax || id == OP_ID_max_dim;
    return s_fold(c, max ? CUDA_FOLD_ARGMAX : CUDA_FOLD_ARGMIN, dt_dtype_is_float(in->dtype), in->dtype, in, mask, &a);
}

/* softmax, log_softmax: ctx[0] = the dim; computed in float32 after torch's conversion to the
 * output's dtype */
const char *cuda_k_softmax(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t outer, n, inner;
    if ((why = op_along_layout(k, &outer, &n, &inner)))
        return why;
    if (outer * n * inner == 0)
        return NULL;
    const void *x;
    dt_dtype xd;
    void *copy;
    why = s_source(c, in, true, out->dtype, &x, &xd, &copy);
    if (!why)
        why = cuda_check(
            cuda_softmax(k->def->id == OP_ID_log_softmax, x, xd, out->data, out->dtype, outer, n, inner, c->compute),
            "softmax kernel");
    cuda_scratch_free(c, copy);
    return why;
}

/* layer_norm, rms_norm: inputs (x[, weight][, bias]) of floating dtypes; ctx = [elements normalised
 * together, has_weight | has_bias << 1]; floats[0] = eps (none: float32's epsilon) */
const char *cuda_k_norm(cuda_ctx *c, op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    const char *why;
    int64_t rows, d, inner;
    if ((why = op_along_layout(k, &rows, &d, &inner)))
        return why;
    if (rows == 0)
        return NULL;
    int64_t flags = k->ctx[1];
    const op_local *w = flags & 1 ? &k->in[1] : NULL, *b = flags & 2 ? &k->in[flags & 1 ? 2 : 1] : NULL;
    float eps = k->attrs->nfloats > 0 ? (float)k->attrs->floats[0] : FLT_EPSILON;
    return cuda_check(cuda_norm(k->def->id == OP_ID_rms_norm, in->data, in->dtype, out->data, out->dtype, rows, d,
                                w ? w->data : NULL, w ? w->dtype : DT_FLOAT32, b ? b->data : NULL,
                                b ? b->dtype : DT_FLOAT32, eps, c->compute),
                      "norm kernel");
}

/* cumsum: ctx[0] = the dim; the input as torch sees it after converting it to the output's dtype,
 * summed in float32 or wrapping int64 */
const char *cuda_k_cumsum(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t outer, n, inner;
    if ((why = op_along_layout(k, &outer, &n, &inner)))
        return why;
    if (outer * n * inner == 0)
        return NULL;
    bool floating = dt_dtype_is_float(out->dtype);
    const void *x;
    dt_dtype xd;
    void *copy;
    why = s_source(c, in, floating, out->dtype, &x, &xd, &copy);
    if (!why)
        why = cuda_check(cuda_cumsum(floating, x, xd, out->data, out->dtype, outer, n, inner, c->compute),
                         "cumsum kernel");
    cuda_scratch_free(c, copy);
    return why;
}

/* topk: ctx[0] = the dim; ints [k, dim, largest, sorted] -> (values, indices); always sorted, as on
 * the CPU */
const char *cuda_k_topk(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *in = &k->in[0];
    int64_t outer, n, inner, top = k->attrs->nints > 0 ? k->attrs->ints[0] : 1;
    bool largest = k->attrs->nints < 3 || k->attrs->ints[2] != 0;
    if ((why = op_along_layout(k, &outer, &n, &inner)))
        return why;
    if (outer * inner * top == 0)
        return NULL;
    if (n > INT32_MAX)
        return "topk: slices of more than 2^31 - 1 elements have no CUDA kernel yet";
    bool floating = dt_dtype_is_float(in->dtype);
    void *scratch = NULL;
    size_t bytes = cuda_topk_scratch(floating, outer, n, inner);
    why = cuda_scratch(c, bytes, &scratch);
    if (!why)
        why = cuda_check(cuda_topk(floating, in->data, in->dtype, k->out[0].data, k->out[1].data, outer, n, inner, top,
                                   largest, scratch, c->compute),
                         "topk kernel");
    cuda_scratch_free(c, scratch);
    return why;
}
