/* cpu_image — the kernels of the image ops (ops/op_image.c) on float32 arrays: a 2-D convolution
 * by im2col and sgemm, group normalisation, nearest and linear resampling, and padding of any
 * dtype. Their drivers in cpu_image.c convert 16-bit floats to float32 and back around them. */
#ifndef CPU_IMAGE_H
#define CPU_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "op_registry.h"

/* The column buffer's limit in floats: im2col goes by chunks of output rows past it (64 MiB). */
#define CPU_CONV2D_COL_MAX ((int64_t)16 << 20)

/* out (O, OH, OW) = the convolution of one image x (C, H, W) with w (O, C / groups, kH, kW) (d->N unread), plus bias (O,) or NULL; all
 * float32, C-contiguous. col: scratch of cpu_conv2d_col_size(d) floats (may be NULL when that is
 * 0). NULL, or why it cannot run (a size past the BLAS integer range). */
const char *cpu_conv2d(const op_conv2d_dims *d, const float *x, const float *w, const float *bias, float *out,
                       float *col);
/* Floats of scratch cpu_conv2d needs (0 for a 1x1 kernel of stride 1 without padding). */
int64_t cpu_conv2d_col_size(const op_conv2d_dims *d);

/* y = group_norm(x) of one sample x (C, S) in G groups of C / G channels: (x - mean) / sqrt(var +
 * eps) over each group's C / G * S elements (biased variance, accumulated in double), then times
 * weight[c] and plus bias[c] where given (NULL: 1 and 0). y may be x. */
void cpu_group_norm(float *y, const float *x, int64_t C, int64_t S, int64_t G, const float *weight, const float *bias,
                    float eps);

/* out (P, OH, OW) from x (P, IH, IW) by the axes' sources (op_resample_axis); nearest: the
 * weights are ignored and i0 read. */
void cpu_resample(float *out, const float *x, int64_t P, int64_t IH, int64_t IW, int64_t OH, int64_t OW,
                  const int64_t *h0, const int64_t *h1, const float *lh, const int64_t *w0, const int64_t *w1,
                  const float *lw, int nearest);

/* out (out_shape) = x (in_shape) padded by left[d] elements before and out_shape[d] - in_shape[d] -
 * left[d] after on every dim d (negative: cropped), elements of elem bytes: mode 0 fills with
 * *fill, 1 reflects about the edge (excluding it), 2 repeats the edge. The sizes are valid (reflect:
 * pads below the size). */
void cpu_pad(void *out, const void *x, size_t elem, int ndim, const int64_t *in_shape, const int64_t *out_shape,
             const int64_t *left, int mode, const void *fill);

#endif
