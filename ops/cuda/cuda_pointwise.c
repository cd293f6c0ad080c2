/* cuda_pointwise — the drivers of the elementwise ops on the GPU: cpu_pointwise.c's, on device
 * memory. Operands are read in place when their dtype is the compute type (float32, int32, int64 or
 * bool; 16-bit floats compute in float32) and broadcast by strides; others, and an output of
 * another dtype, go through converted copies on the compute stream. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"
#include "op_pointwise_math.h"

/* One kernel call: its operands, the copies it made, and its first failure. */
typedef struct {
    cuda_ctx *ctx;
    cuda_ew_args a;
    int ndim[CUDA_EW_MAX_IN];
    const int64_t *shape[CUDA_EW_MAX_IN];
    int ncopies;
    void *copies[CUDA_EW_MAX_IN + 1];
    const char *why;
} s_call;

static dt_dtype s_compute(dt_dtype d) { return d == DT_FLOAT16 || d == DT_BFLOAT16 ? DT_FLOAT32 : d; }

static void s_begin(s_call *c, cuda_ctx *ctx)
{
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
}

static void s_piece(s_call *c, const op_local *piece, dt_dtype cd)
{
    int i = c->a.nin++;
    c->a.in[i] = piece->data;
    c->ndim[i] = piece->ndim;
    c->shape[i] = piece->shape;
    if (piece->dtype == cd || c->why)
        return;
    int64_t n = dt_layout_numel(piece->ndim, piece->shape);
    void *copy;
    if ((c->why = cuda_scratch(c->ctx, (size_t)n * dt_dtype_size(cd), &copy)))
        return;
    c->copies[c->ncopies++] = copy;
    c->a.in[i] = copy;
    c->why = cuda_check(cuda_convert(copy, cd, piece->data, piece->dtype, n, c->ctx->compute), "conversion");
}

static void s_number(s_call *c, dt_scalar v, dt_dtype cd)
{
    int i = c->a.nin++;
    cpu_fill(&c->a.number[i], cd, 1, v); /* the CPU's conversion of the number */
    c->a.in[i] = NULL;
    c->ndim[i] = 0;
    c->shape[i] = NULL;
}

/* The output's dims with size-1 dims dropped and neighbours merged where every operand walks them
 * as one (cpu_pointwise.c's s_iterate), and each operand's element strides over them. */
static void s_layout(s_call *c, int ndim, const int64_t *shape)
{
    cuda_ew_args *a = &c->a;
    int64_t own[CUDA_EW_MAX_IN][DT_MAX_DIMS];
    for (int i = 0; i < a->nin; i++)
        for (int64_t d = c->ndim[i] - 1, s = 1; d >= 0; s *= c->shape[i][d--])
            own[i][d] = s;
    a->nd = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1)
            continue;
        int64_t st[CUDA_EW_MAX_IN];
        bool merge = a->nd > 0;
        for (int i = 0; i < a->nin; i++) {
            int k = d - (ndim - c->ndim[i]);
            st[i] = k >= 0 && c->shape[i][k] == shape[d] ? own[i][k] : 0;
            merge = merge && a->stride[i][a->nd - 1] == st[i] * shape[d];
        }
        if (merge)
            a->size[a->nd - 1] *= shape[d];
        else
            a->size[a->nd++] = shape[d];
        for (int i = 0; i < a->nin; i++)
            a->stride[i][a->nd - 1] = st[i];
    }
}

/* Runs op in cd into the output, whose values are computed in rd (converted when it has another dtype). */
static const char *s_run(s_call *c, op_local *out, int op, dt_dtype cd, dt_dtype rd, const double *p)
{
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    void *dst = out->data;
    if (!c->why && n > 0 && out->dtype != rd && !(c->why = cuda_scratch(c->ctx, (size_t)n * dt_dtype_size(rd), &dst)))
        c->copies[c->ncopies++] = dst;
    if (!c->why && n > 0) {
        s_layout(c, out->ndim, out->shape);
        c->a.out = dst;
        c->a.n = n;
        if (p)
            memcpy(c->a.p, p, sizeof c->a.p);
        cudaError_t e = cuda_pointwise(op, cd, &c->a, c->ctx->compute);
        c->why = e == cudaErrorNotSupported ? "no loop for these dtypes (internal error)"
                                            : cuda_check(e, "elementwise kernel");
        if (!c->why && dst != out->data)
            c->why = cuda_check(cuda_convert(out->data, out->dtype, dst, rd, n, c->ctx->compute), "conversion");
    }
    for (int i = 0; i < c->ncopies; i++)
        cuda_scratch_free(c->ctx, c->copies[i]);
    return c->why;
}

static const char *s_unary(cuda_ctx *ctx, op_kernel *k)
{
    s_call c;
    s_begin(&c, ctx);
    if (k->nin != 1)
        return "expected one operand (internal error)";
    dt_dtype cd = s_compute(k->out[0].dtype);
    s_piece(&c, &k->in[0], cd);
    return s_run(&c, &k->out[0], k->def->id, cd, cd, k->attrs->nfloats ? k->attrs->floats : NULL);
}

/* a op b in cd giving rd, either a number (attrs.scalar; ints[0] = 1: on the left); zero_divisor:
 * where the kernel marks a zero b, or NULL. */
static const char *s_binary(cuda_ctx *ctx, op_kernel *k, dt_dtype cd, dt_dtype rd, int *zero_divisor)
{
    s_call c;
    s_begin(&c, ctx);
    c.a.zero_divisor = zero_divisor;
    bool left = k->attrs->nints > 0 && k->attrs->ints[0];
    if (k->nin + k->attrs->has_scalar != 2)
        return "expected two operands (internal error)";
    if (k->nin == 1 && left)
        s_number(&c, k->attrs->scalar, cd);
    s_piece(&c, &k->in[0], cd);
    if (k->nin == 2)
        s_piece(&c, &k->in[1], cd);
    else if (!left)
        s_number(&c, k->attrs->scalar, cd);
    return s_run(&c, &k->out[0], k->def->id, cd, rd, NULL);
}

static const char *s_arith(cuda_ctx *ctx, op_kernel *k)
{
    dt_dtype cd = s_compute(k->out[0].dtype);
    return s_binary(ctx, k, cd, cd, NULL);
}

/* An integer zero divisor fails the op with failure, as on the CPU: the kernel marks one in device
 * memory, and the op waits for the compute stream to read the mark (only the device knows its
 * divisors, as only it knows the indices of the kernels that index by a tensor). */
static const char *s_dividing(cuda_ctx *ctx, op_kernel *k, const char *failure)
{
    dt_dtype cd = s_compute(k->out[0].dtype);
    if (cd != DT_INT32 && cd != DT_INT64)
        return s_binary(ctx, k, cd, cd, NULL);
    int *mark, found = 0;
    const char *why = cuda_scratch(ctx, sizeof *mark, (void **)&mark);
    if (why)
        return why;
    why = cuda_check(cudaMemsetAsync(mark, 0, sizeof *mark, ctx->compute), "zero divisor check");
    if (!why)
        why = s_binary(ctx, k, cd, cd, mark);
    if (!why)
        why = cuda_check(cudaMemcpyAsync(&found, mark, sizeof found, cudaMemcpyDeviceToHost, ctx->compute),
                         "zero divisor check");
    cuda_scratch_free(ctx, mark);
    if (!why)
        why = cuda_check(cudaStreamSynchronize(ctx->compute), "zero divisor check");
    return why ? why : found ? failure : NULL;
}

/* ctx[0]: the dtype the controller says the operands are compared in */
static const char *s_compare(cuda_ctx *ctx, op_kernel *k)
{
    if (k->nctx < 1 || !dt_dtype_valid((int)k->ctx[0]))
        return "comparison: missing its dtype (internal error)";
    return s_binary(ctx, k, s_compute((dt_dtype)k->ctx[0]), DT_BOOL, NULL);
}

static const char *s_logical(cuda_ctx *ctx, op_kernel *k) { return s_binary(ctx, k, DT_BOOL, DT_BOOL, NULL); }

/* Each elementwise op's kernel: its line in op_pointwise_math.h (cuda_pointwise_kernels.cu), run by
 * the driver of the line's list. */
#define S_KERNEL(name, driver)                                                                                         \
    const char *cuda_k_##name(cuda_ctx *ctx, op_kernel *k) { return driver; }
#define S_UNARY(name, ...) S_KERNEL(name, s_unary(ctx, k))
#define S_ARITH(name, ...) S_KERNEL(name, s_arith(ctx, k))
#define S_DIVIDING(name, ...) S_KERNEL(name, s_dividing(ctx, k, OP_EW_ZERO_DIVISION_ERROR(name)))
#define S_COMPARE(name, ...) S_KERNEL(name, s_compare(ctx, k))
#define S_LOGICAL(name, ...) S_KERNEL(name, s_logical(ctx, k))
OP_EW_UNARY_FLOAT(S_UNARY)
OP_EW_UNARY_NUMBER(S_UNARY)
S_UNARY(logical_not)
OP_EW_BINARY_ANY(S_ARITH)
OP_EW_BINARY_NUMBER(S_ARITH)
OP_EW_BINARY_FLOAT(S_ARITH)
OP_EW_BINARY_DIVIDING(S_DIVIDING)
OP_EW_COMPARE(S_COMPARE)
OP_EW_LOGICAL(S_LOGICAL)

/* where(cond, a, b), with a number in place of b (ints[0] = 2) or of a (ints[0] = 1). */
const char *cuda_k_where(cuda_ctx *ctx, op_kernel *k)
{
    s_call c;
    s_begin(&c, ctx);
    op_local *out = &k->out[0];
    dt_dtype cd = s_compute(out->dtype);
    int at = k->attrs->has_scalar ? (k->attrs->nints > 0 ? (int)k->attrs->ints[0] : 2) : 0;
    if (k->nin != (at ? 2 : 3) || at < 0 || at > 2)
        return "where: bad operands (internal error)";
    s_piece(&c, &k->in[0], DT_BOOL);
    if (at == 1)
        s_number(&c, k->attrs->scalar, cd);
    s_piece(&c, &k->in[1], cd);
    if (at == 2)
        s_number(&c, k->attrs->scalar, cd);
    else if (at == 0)
        s_piece(&c, &k->in[2], cd);
    return s_run(&c, out, OP_ID_where, cd, cd, NULL);
}

/* masked_fill(x, mask, number) is where(mask, number, x). */
const char *cuda_k_masked_fill(cuda_ctx *ctx, op_kernel *k)
{
    s_call c;
    s_begin(&c, ctx);
    op_local *out = &k->out[0];
    dt_dtype cd = s_compute(out->dtype);
    if (k->nin != 2 || !k->attrs->has_scalar)
        return "masked_fill: bad operands (internal error)";
    s_piece(&c, &k->in[1], DT_BOOL);
    s_number(&c, k->attrs->scalar, cd);
    s_piece(&c, &k->in[0], cd);
    return s_run(&c, out, OP_ID_where, cd, cd, NULL);
}

/* clamp(x, min, max): the bounds of op_clamp_bounds (ints[0] bit 0 = has min, bit 1 = has max). */
const char *cuda_k_clamp(cuda_ctx *ctx, op_kernel *k)
{
    dt_dtype cd = s_compute(k->out[0].dtype);
    double bounds[4] = {0};
    const char *why = op_clamp_bounds(k, cd, bounds);
    if (why)
        return why;
    s_call c;
    s_begin(&c, ctx);
    s_piece(&c, &k->in[0], cd);
    return s_run(&c, &k->out[0], OP_ID_clamp, cd, cd, bounds);
}

/* to(dtype): a conversion, straight from the piece into the output. */
const char *cuda_k_to(cuda_ctx *ctx, op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    if (k->nin != 1 || n != dt_layout_numel(in->ndim, in->shape))
        return "to: the piece does not match the output (internal error)";
    return cuda_check(cuda_convert(out->data, out->dtype, in->data, in->dtype, n, ctx->compute), "conversion");
}
