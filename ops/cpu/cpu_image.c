/* cpu_image — the CPU kernels of the image ops (ops/op_image.c): conv2d through oneDNN where the
 * build has it and it takes the case (cpu_dnnl.c), else by im2col and OpenBLAS' sgemm (one product
 * per group, by chunks of output rows), group_norm, interpolate and pad. The math runs in float32;
 * 16-bit pieces are converted an image (or a piece) at a time. */
#include "cpu_image.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_dnnl.h"
#include "cpu_gemm.h"
#include "cpu_matmul.h"
#include "cpu_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"
#include "dt_pool.h"
#include "op_image_math.h"

static const char s_oom[] = "out of memory";

static int64_t s_min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t s_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- conv2d ----------------------------------------------------------------------------------- */

/* Output rows per chunk: as many as keep the column buffer within CPU_CONV2D_COL_MAX. */
static int64_t s_chunk_rows(const op_conv2d_dims *d)
{
    int64_t K = d->C / d->groups * d->kH * d->kW, per_row = K * d->OW;
    int64_t rows = per_row > 0 ? CPU_CONV2D_COL_MAX / per_row : d->OH;
    return s_max(1, s_min(rows, d->OH));
}

int64_t cpu_conv2d_col_size(const op_conv2d_dims *d)
{
    if (op_conv2d_direct(d))
        return 0;
    return d->C / d->groups * d->kH * d->kW * s_chunk_rows(d) * d->OW;
}

/* The columns of output rows [oh0, oh0 + rows) of channels [c0, c0 + Cg) of x: row (c, ki, kj)
 * holds, for each output position, the input element the kernel tap (ki, kj) meets there (0 in
 * the padding). */
static void s_im2col(const op_conv2d_dims *d, const float *x, int64_t c0, int64_t Cg, int64_t oh0, int64_t rows,
                     float *col)
{
    int64_t sh = d->stride[0], sw = d->stride[1], dh = d->dilation[0], dw = d->dilation[1];
    int64_t H = d->H, W = d->W, OW = d->OW, width = rows * OW;
    for (int64_t c = 0; c < Cg; c++) {
        const float *plane = x + (c0 + c) * H * W;
        for (int64_t ki = 0; ki < d->kH; ki++) {
            for (int64_t kj = 0; kj < d->kW; kj++) {
                float *dst = col + ((c * d->kH + ki) * d->kW + kj) * width;
                /* output columns [lo, hi) read inside the row: iw = ow * sw + off in [0, W) */
                int64_t off = kj * dw - d->pad_left;
                int64_t lo = off >= 0 ? 0 : (-off + sw - 1) / sw;
                int64_t hi = W - 1 - off < 0 ? 0 : (W - 1 - off) / sw + 1;
                hi = s_min(hi, OW);
                lo = s_min(lo, hi);
                for (int64_t r = 0; r < rows; r++) {
                    float *seg = dst + r * OW;
                    int64_t ih = (oh0 + r) * sh - d->pad_top + ki * dh;
                    if (ih < 0 || ih >= H) {
                        memset(seg, 0, (size_t)OW * sizeof *seg);
                        continue;
                    }
                    const float *src = plane + ih * W + off;
                    if (lo > 0)
                        memset(seg, 0, (size_t)lo * sizeof *seg);
                    if (sw == 1) {
                        memcpy(seg + lo, src + lo, (size_t)(hi - lo) * sizeof *seg);
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++)
                            seg[ow] = src[ow * sw];
                    }
                    if (hi < OW)
                        memset(seg + hi, 0, (size_t)(OW - hi) * sizeof *seg);
                }
            }
        }
    }
}

const char *cpu_conv2d(const op_conv2d_dims *d, const float *x, const float *w, const float *bias, float *out,
                       float *col)
{
    int64_t G = d->groups, Cg = d->C / G, Og = d->O / G, K = Cg * d->kH * d->kW, plane = d->OH * d->OW;
    if (d->O == 0 || plane == 0)
        return NULL;
    if (K == 0) {
        memset(out, 0, (size_t)(d->O * plane) * sizeof *out);
    } else {
        if (plane > INT_MAX || K > INT_MAX || Og > INT_MAX || d->H * d->W > INT_MAX)
            return "conv2d: a size exceeds the BLAS integer range";
        bool direct = op_conv2d_direct(d);
        int64_t step = direct ? d->OH : s_chunk_rows(d);
        for (int64_t g = 0; g < G; g++) {
            const float *wg = w + g * Og * K;
            float *og = out + g * Og * plane;
            for (int64_t oh0 = 0; oh0 < d->OH; oh0 += step) {
                int64_t rows = s_min(step, d->OH - oh0), n = rows * d->OW;
                const float *b = x + g * Cg * d->H * d->W;
                if (!direct) {
                    s_im2col(d, x, g * Cg, Cg, oh0, rows, col);
                    b = col;
                }
                cpu_sgemm(false, Og, n, K, 1.0f, wg, K, b, n, 0.0f, og + oh0 * d->OW, plane);
            }
        }
    }
    if (bias)
        for (int64_t o = 0; o < d->O; o++) {
            float *row = out + o * plane, v = bias[o];
            for (int64_t i = 0; i < plane; i++)
                row[i] += v;
        }
    return NULL;
}

/* The bottom (axis 0) or right (1) pad that oneDNN's size rule (in + pads - dilated kernel) / stride + 1
 * = out asks for: the least that reaches the last output position's taps, or -1 when the input
 * holds more than a stride of unread rows (or columns) past them (the conv declines to oneDNN). */
static int64_t s_far_pad(const op_conv2d_dims *d, int axis)
{
    int64_t in = axis ? d->W : d->H, out = axis ? d->OW : d->OH, k = axis ? d->kW : d->kH;
    int64_t near = axis ? d->pad_left : d->pad_top, s = d->stride[axis];
    int64_t need = (out - 1) * s + (k - 1) * d->dilation[axis] + 1 - in - near;
    return need >= 0 ? need : need > -s ? 0 : -1;
}

/* conv2d: op_conv2d_layout's pieces */
const char *cpu_k_conv2d(op_kernel *k)
{
    const op_local *x = &k->in[0], *w = &k->in[1], *b = k->nin == 3 ? &k->in[2] : NULL, *y = &k->out[0];
    op_conv2d_dims d;
    const char *bad = op_conv2d_layout(k, &d);
    if (bad || d.N == 0)
        return bad; /* N = 0: no output element */
    int64_t N = d.N;
    int64_t in_n = d.C * d.H * d.W, out_n = d.O * d.OH * d.OW;
    bool f32 = x->dtype == DT_FLOAT32;
    void *sw = NULL, *sb = NULL;
    const float *pw = cpu_piece_as(w, CPU_F32, &sw), *pb = b ? cpu_piece_as(b, CPU_F32, &sb) : NULL;
    if (!pw || (b && !pb)) {
        free(sw);
        free(sb);
        return s_oom;
    }
    int64_t pad_bottom = s_far_pad(&d, 0), pad_right = s_far_pad(&d, 1);
    /* float32: every image in one oneDNN call */
    if (f32 && cpu_dnnl_conv2d(&d, N, pad_bottom, pad_right, x->data, pw, pb, y->data)) {
        free(sw);
        free(sb);
        return NULL;
    }
    /* the scratch comes from the pool: a fresh column buffer per call faulted its pages in again on
     * every call (a third of a VAE decode's time) */
    int64_t ncol = cpu_conv2d_col_size(&d);
    size_t col_size = (size_t)ncol * sizeof(float), xs_size = (size_t)(in_n ? in_n : 1) * sizeof(float);
    size_t ys_size = (size_t)out_n * sizeof(float);
    float *col = ncol ? dt_pool_alloc(col_size) : NULL;
    float *xs = f32 ? NULL : dt_pool_alloc(xs_size);
    float *ys = f32 ? NULL : dt_pool_alloc(ys_size);
    const char *why = (ncol && !col) || (!f32 && (!xs || !ys)) ? s_oom : NULL;
    for (int64_t n = 0; n < N && !why; n++) {
        const float *xn = f32 ? (const float *)x->data + n * in_n : xs;
        float *yn = f32 ? (float *)y->data + n * out_n : ys;
        if (!f32)
            cpu_to_ctype(xs, CPU_F32, (const char *)x->data + n * in_n * (int64_t)dt_dtype_size(x->dtype), x->dtype,
                         in_n);
        if (f32 || !cpu_dnnl_conv2d(&d, 1, pad_bottom, pad_right, xn, pw, pb, yn))
            why = cpu_conv2d(&d, xn, pw, pb, yn, col);
        if (!why && !f32)
            cpu_from_ctype((char *)y->data + n * out_n * (int64_t)dt_dtype_size(y->dtype), y->dtype, ys, CPU_F32,
                           out_n);
    }
    free(sw);
    free(sb);
    dt_pool_free(col, col_size);
    dt_pool_free(xs, xs_size);
    dt_pool_free(ys, ys_size);
    return why;
}

/* ---- group_norm ------------------------------------------------------------------------------- */

void cpu_group_norm(float *y, const float *x, int64_t C, int64_t S, int64_t G, const float *weight, const float *bias,
                    float eps)
{
    int64_t Cg = C / G, n = Cg * S;
    for (int64_t g = 0; g < G; g++) {
        const float *xg = x + g * n;
        float *yg = y + g * n;
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < n; i++)
            sum += xg[i];
        double mean = n ? sum / (double)n : 0;
        for (int64_t i = 0; i < n; i++) {
            double t = xg[i] - mean;
            sq += t * t;
        }
        double rstd = 1.0 / sqrt((n ? sq / (double)n : 0) + (double)eps);
        for (int64_t c = 0; c < Cg; c++) {
            int64_t ch = g * Cg + c;
            double scale = rstd * (weight ? weight[ch] : 1.0f);
            float a = (float)scale, s = (float)((bias ? bias[ch] : 0.0f) - mean * scale);
            const float *xc = xg + c * S;
            float *yc = yg + c * S;
            for (int64_t i = 0; i < S; i++)
                yc[i] = xc[i] * a + s;
        }
    }
}

/* group_norm: op_group_norm_layout's pieces */
const char *cpu_k_group_norm(op_kernel *k)
{
    const op_local *x = &k->in[0], *y = &k->out[0];
    op_group_norm_dims g;
    const char *bad = op_group_norm_layout(k, &g);
    if (bad)
        return bad;
    int64_t N = g.N, C = g.C, S = g.S, G = g.G, per = C * S;
    if (N == 0 || per == 0)
        return NULL;
    const op_local *w = g.weight, *b = g.bias;
    void *sw = NULL, *sb = NULL;
    const float *pw = w ? cpu_piece_as(w, CPU_F32, &sw) : NULL, *pb = b ? cpu_piece_as(b, CPU_F32, &sb) : NULL;
    bool f32 = x->dtype == DT_FLOAT32;
    float *buf = f32 ? NULL : malloc((size_t)per * sizeof *buf);
    const char *why = (w && !pw) || (b && !pb) || (!f32 && !buf) ? s_oom : NULL;
    size_t esize = dt_dtype_size(x->dtype);
    for (int64_t n = 0; n < N && !why; n++) {
        if (f32) {
            cpu_group_norm((float *)y->data + n * per, (const float *)x->data + n * per, C, S, G, pw, pb,
                           g.eps);
            continue;
        }
        cpu_to_ctype(buf, CPU_F32, (const char *)x->data + n * per * (int64_t)esize, x->dtype, per);
        cpu_group_norm(buf, buf, C, S, G, pw, pb, g.eps);
        cpu_from_ctype((char *)y->data + n * per * (int64_t)esize, y->dtype, buf, CPU_F32, per);
    }
    free(sw);
    free(sb);
    free(buf);
    return why;
}

/* ---- interpolate ------------------------------------------------------------------------------ */

void cpu_resample(float *out, const float *x, int64_t P, int64_t IH, int64_t IW, int64_t OH, int64_t OW,
                  const int64_t *h0, const int64_t *h1, const float *lh, const int64_t *w0, const int64_t *w1,
                  const float *lw, int nearest)
{
    for (int64_t p = 0; p < P; p++) {
        const float *xp = x + p * IH * IW;
        float *op = out + p * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            const float *r0 = xp + h0[oh] * IW, *r1 = xp + h1[oh] * IW;
            float *o = op + oh * OW;
            if (nearest) {
                for (int64_t ow = 0; ow < OW; ow++)
                    o[ow] = r0[w0[ow]];
                continue;
            }
            float b = lh[oh], a = 1.0f - b;
            for (int64_t ow = 0; ow < OW; ow++) {
                float d = lw[ow], c = 1.0f - d;
                o[ow] = a * (c * r0[w0[ow]] + d * r0[w1[ow]]) + b * (c * r1[w0[ow]] + d * r1[w1[ow]]);
            }
        }
    }
}

/* interpolate: op_interpolate_layout's pieces */
const char *cpu_k_interpolate(op_kernel *k)
{
    const op_local *x = &k->in[0], *y = &k->out[0];
    op_interpolate_dims d;
    const char *bad = op_interpolate_layout(k, &d);
    if (bad)
        return bad;
    int64_t P = d.P, IH = d.IH, IW = d.IW, OH = d.OH, OW = d.OW;
    if (P == 0 || OH == 0 || OW == 0)
        return NULL;
    int64_t *idx = malloc((size_t)(2 * (OH + OW)) * sizeof *idx);
    float *lam = malloc((size_t)(OH + OW) * sizeof *lam);
    void *sx = NULL;
    const float *px = cpu_piece_as(x, CPU_F32, &sx);
    bool f32 = y->dtype == DT_FLOAT32;
    int64_t on = P * OH * OW;
    float *buf = f32 ? y->data : malloc((size_t)on * sizeof *buf);
    const char *why = idx && lam && px && buf ? NULL : s_oom;
    if (!why) {
        int64_t *h0 = idx, *h1 = idx + OH, *w0 = idx + 2 * OH, *w1 = idx + 2 * OH + OW;
        op_interpolate_sources(k, &d, h0, h1, lam, w0, w1, lam + OH);
        cpu_resample(buf, px, P, IH, IW, OH, OW, h0, h1, lam, w0, w1, lam + OH, d.mode != 1);
        if (!f32)
            cpu_from_ctype(y->data, y->dtype, buf, CPU_F32, on);
    }
    if (!f32)
        free(buf);
    free(sx);
    free(idx);
    free(lam);
    return why;
}

/* ---- pad -------------------------------------------------------------------------------------- */

static void s_fill(void *dst, size_t elem, const void *fill, int64_t n)
{
    switch (elem) {
    case 1: memset(dst, *(const uint8_t *)fill, (size_t)n); break;
    case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = *(const uint16_t *)fill; break;
    case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = *(const uint32_t *)fill; break;
    default: for (int64_t i = 0; i < n; i++) ((uint64_t *)dst)[i] = *(const uint64_t *)fill; break;
    }
}

void cpu_pad(void *out, const void *x, size_t elem, int ndim, const int64_t *in_shape, const int64_t *out_shape,
             const int64_t *left, int mode, const void *fill)
{
    int64_t n_out = dt_layout_numel(ndim, out_shape);
    if (n_out == 0)
        return;
    if (dt_layout_numel(ndim, in_shape) == 0) {
        s_fill(out, elem, fill, n_out); /* every position is padding (op_pad_layout: constant) */
        return;
    }
    /* rows along the last dim (a 0-d tensor is one row of one element) */
    int64_t Li = ndim ? in_shape[ndim - 1] : 1, Lo = ndim ? out_shape[ndim - 1] : 1, l = ndim ? left[ndim - 1] : 0;
    int lead = ndim ? ndim - 1 : 0;
    int64_t stride[DT_MAX_DIMS], idx[DT_MAX_DIMS] = {0}, rows = dt_layout_numel(lead, out_shape);
    /* the strides of the input's leading dims, in rows */
    int64_t rs = 1;
    for (int d = lead - 1; d >= 0; d--) {
        stride[d] = rs;
        rs *= in_shape[d];
    }
    /* the output positions [mid_lo, mid_hi) of a row that read the input's row in order */
    int64_t mid_lo = s_min(s_max(l, 0), Lo), mid_hi = s_max(mid_lo, s_min(Lo, l + Li));
    char *o = out;
    const char *in = x;
    for (int64_t r = 0; r < rows; r++, o += Lo * (int64_t)elem) {
        int64_t src = 0;
        for (int d = 0; d < lead && src >= 0; d++) {
            int64_t s = op_pad_source(idx[d] - left[d], in_shape[d], mode);
            src = s < 0 ? -1 : src + s * stride[d];
        }
        if (src < 0) {
            s_fill(o, elem, fill, Lo);
        } else {
            const char *row = in + src * Li * (int64_t)elem;
            for (int64_t i = 0; i < mid_lo; i++) {
                int64_t s = op_pad_source(i - l, Li, mode);
                if (s < 0)
                    s_fill(o + i * (int64_t)elem, elem, fill, 1);
                else
                    memcpy(o + i * (int64_t)elem, row + s * (int64_t)elem, elem);
            }
            memcpy(o + mid_lo * (int64_t)elem, row + (mid_lo - l) * (int64_t)elem, (size_t)(mid_hi - mid_lo) * elem);
            for (int64_t i = mid_hi; i < Lo; i++) {
                int64_t s = op_pad_source(i - l, Li, mode);
                if (s < 0)
                    s_fill(o + i * (int64_t)elem, elem, fill, 1);
                else
                    memcpy(o + i * (int64_t)elem, row + s * (int64_t)elem, elem);
            }
        }
        for (int d = lead - 1; d >= 0; d--) {
            if (++idx[d] < out_shape[d])
                break;
            idx[d] = 0;
        }
    }
}

/* pad: op_pad_layout's pieces */
const char *cpu_k_pad(op_kernel *k)
{
    const op_local *x = &k->in[0], *y = &k->out[0];
    int mode;
    int64_t left[DT_MAX_DIMS];
    uint64_t fill;
    const char *bad = op_pad_layout(k, &mode, left, &fill);
    if (bad)
        return bad;
    cpu_pad(y->data, x->data, dt_dtype_size(x->dtype), x->ndim, x->shape, y->shape, left, mode, &fill);
    return NULL;
}
