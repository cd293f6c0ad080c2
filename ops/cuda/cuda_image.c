/* cuda_image — the drivers of the image ops on the GPU (ops/op_image.c's ops, read through its
 * op_*_layout functions as the CPU's kernels read them; kernels in cuda_image_kernels.cu).
 *
 * conv2d is im2col plus one cuBLAS product per image, group and chunk of output rows, as on the
 * CPU: the columns keep the input's dtype and the product accumulates in float32 (16-bit operands
 * on the tensor cores), then an epilogue adds the bias and rounds once to the output's dtype, so a
 * 16-bit convolution rounds where the CPU's does. A 1x1 kernel of stride 1 without padding reads
 * the image itself. group_norm, interpolate and pad compute what their CPU kernels compute (the
 * sources of a resampled or padded position are op_image_math.h's, for both). */
#include <string.h>

#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"
#include "op_image_math.h"

#define S_COL_MAX_BYTES ((int64_t)256 << 20) /* im2col goes by chunks of output rows past this */

static cudaDataType s_blas_type(dt_dtype d)
{
    return d == DT_FLOAT16 ? CUDA_R_16F : d == DT_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* ---- conv2d ----------------------------------------------------------------------------------- */

/* One image's output (O, OH, OW) into acc (float32): a product per group and chunk of rows. */
static const char *s_conv_image(cuda_ctx *c, const op_conv2d_dims *d, const char *x, const char *w, size_t elem,
                                cudaDataType type, void *col, int64_t step, float *acc)
{
    int64_t G = d->groups, Cg = d->C / G, Og = d->O / G, K = Cg * d->kH * d->kW, plane = d->OH * d->OW;
    if (K == 0)
        return cuda_check(cudaMemsetAsync(acc, 0, (size_t)(d->O * plane) * sizeof *acc, c->compute), "conv2d");
    bool direct = op_conv2d_direct(d);
    for (int64_t g = 0; g < G; g++) {
        const char *wg = w + g * Og * K * (int64_t)elem;
        for (int64_t oh0 = 0; oh0 < d->OH; oh0 += step) {
            int64_t rows = d->OH - oh0 < step ? d->OH - oh0 : step, n = rows * d->OW;
            const void *cols = x + g * Cg * d->H * d->W * (int64_t)elem;
            if (!direct) {
                cuda_im2col_args a = {.c0 = g * Cg, .Cg = Cg, .H = d->H, .W = d->W, .kH = d->kH, .kW = d->kW,
                                      .OW = d->OW, .oh0 = oh0, .rows = rows, .sh = d->stride[0], .sw = d->stride[1],
                                      .pad_top = d->pad_top, .pad_left = d->pad_left, .dh = d->dilation[0],
                                      .dw = d->dilation[1]};
                const char *why = cuda_check(cuda_im2col(col, x, elem, &a, c->compute), "conv2d im2col");
                if (why)
                    return why;
                cols = col;
            }
            /* row-major out rows (Og, n) at stride plane = the columns (K, n) times the weight (Og, K):
             * column-major (n x Og) = (n x K) (K x Og) */
            const char *why = cuda_gemm(c, false, n, Og, K, cols, n, wg, K, type, acc + g * Og * plane + oh0 * d->OW,
                                        plane, CUDA_R_32F);
            if (why)
                return why;
        }
    }
    return NULL;
}

const char *cuda_k_conv2d(cuda_ctx *c, op_kernel *k)
{
    op_conv2d_dims d;
    const char *why = op_conv2d_layout(k, &d);
    if (why || d.N == 0)
        return why; /* N = 0: no output element */
    const op_local *x = &k->in[0], *w = &k->in[1], *b = k->nin == 3 ? &k->in[2] : NULL, *y = &k->out[0];
    int64_t plane = d.OH * d.OW, K = d.C / d.groups * d.kH * d.kW, in_n = d.C * d.H * d.W, out_n = d.O * plane;
    size_t elem = dt_dtype_size(x->dtype);
    bool f32 = x->dtype == DT_FLOAT32;
    int64_t per_row = K * d.OW * (int64_t)elem;
    int64_t step = op_conv2d_direct(&d) ? d.OH : per_row > 0 ? S_COL_MAX_BYTES / per_row : d.OH;
    step = step < 1 ? 1 : step > d.OH ? d.OH : step;
    size_t col_bytes = op_conv2d_direct(&d) ? 0 : (size_t)(K * step * d.OW) * elem;
    void *col = NULL, *acc = NULL;
    if (col_bytes && (why = cuda_scratch(c, col_bytes, &col)))
        return why;
    if (!f32 && (why = cuda_scratch(c, (size_t)out_n * sizeof(float), &acc))) {
        cuda_scratch_free(c, col);
        return why;
    }
    for (int64_t n = 0; n < d.N && !why; n++) {
        char *yn = (char *)y->data + n * out_n * (int64_t)elem;
        float *an = f32 ? (float *)yn : acc; /* float32 accumulates in place */
        why = s_conv_image(c, &d, (const char *)x->data + n * in_n * (int64_t)elem, w->data, elem,
                           s_blas_type(x->dtype), col, step, an);
        if (!why && (b || !f32))
            why = cuda_check(cuda_conv_epilogue(yn, y->dtype, an, b ? b->data : NULL, d.O, plane, c->compute),
                             "conv2d epilogue");
    }
    cuda_scratch_free(c, col);
    cuda_scratch_free(c, acc);
    return why;
}

/* ---- group_norm, interpolate, pad ------------------------------------------------------------- */

const char *cuda_k_group_norm(cuda_ctx *c, op_kernel *k)
{
    op_group_norm_dims g;
    const char *why = op_group_norm_layout(k, &g);
    if (why || g.N * g.C * g.S == 0)
        return why;
    const op_local *x = &k->in[0];
    return cuda_check(cuda_group_norm(k->out[0].data, x->data, x->dtype, g.N, g.C, g.S, g.G,
                                      g.weight ? g.weight->data : NULL, g.weight ? g.weight->dtype : DT_FLOAT32,
                                      g.bias ? g.bias->data : NULL, g.bias ? g.bias->dtype : DT_FLOAT32, g.eps,
                                      c->compute),
                      "group_norm kernel");
}

const char *cuda_k_interpolate(cuda_ctx *c, op_kernel *k)
{
    op_interpolate_dims d;
    const char *why = op_interpolate_layout(k, &d);
    if (why || d.P == 0 || d.OH == 0 || d.OW == 0)
        return why;
    const double *sf = k->attrs->floats;
    cuda_resample_args a = {.mode = d.mode, .align_corners = d.align_corners, .nspatial = d.nspatial, .P = d.P,
                            .IH = d.IH, .IW = d.IW, .OH = d.OH, .OW = d.OW,
                            .scale_h = d.nspatial == 2 ? op_resample_scale(d.IH, d.OH, d.mode, d.align_corners, sf[0])
                                                       : 0.0f,
                            .scale_w = op_resample_scale(d.IW, d.OW, d.mode, d.align_corners, sf[d.nspatial - 1])};
    return cuda_check(cuda_resample(k->out[0].data, k->out[0].dtype, k->in[0].data, k->in[0].dtype, &a, c->compute),
                      "interpolate kernel");
}

const char *cuda_k_pad(cuda_ctx *c, op_kernel *k)
{
    const op_local *x = &k->in[0], *y = &k->out[0];
    cuda_pad_args a = {.ndim = x->ndim};
    const char *why = op_pad_layout(k, &a.mode, a.left, &a.fill);
    if (why)
        return why;
    memcpy(a.in_shape, x->shape, sizeof a.in_shape);
    memcpy(a.out_shape, y->shape, sizeof a.out_shape);
    return cuda_check(cuda_pad(y->data, x->data, dt_dtype_size(x->dtype), &a, c->compute), "pad kernel");
}
