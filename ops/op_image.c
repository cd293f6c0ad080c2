/* op_image — the ops of convolutional image models (a VAE, a patch embedding): conv2d, group_norm,
 * interpolate and pad, with torch.nn.functional's semantics; the kernels are ops/cpu/cpu_image.c.
 *
 * Sharding, per mesh dim (spatial dims are never kept split here: a Shard of H or W is gathered;
 * dtensor/dt_halo.c runs conv2d and nearest interpolate over such a split without gathering):
 *   conv2d       input Shard(0) (batch) with weight and bias Replicate gives Shard(0); otherwise a
 *                weight Shard(0) (output channels; groups = 1) with the input Replicate and the
 *                bias Shard(0) gives an output Shard(1); a Partial(sum|avg) input with weight
 *                Replicate and no bias stays Partial (the convolution is linear; with a bias the
 *                input is reduced first); anything else is made Replicate.
 *   group_norm   Shard(0) passes through; anything else (a channel or spatial shard, a Partial)
 *                is made Replicate; weight and bias are Replicate.
 *   interpolate  Shard(0) or Shard(1) passes through; a spatial shard is gathered. The output is
 *                made of the input's own elements (nearest) or of weighted sums of them whose
 *                weights add to 1 (linear), so any Partial passes through nearest and
 *                Partial(sum|avg) through linear.
 *   pad          a Shard of a dim that is not padded stays, a Shard of a padded dim is gathered.
 *                reflect and replicate only select elements, so any Partial passes; constant
 *                padding passes Partial(avg|max|min), and Partial(sum) when the value is 0. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "op_image_math.h"
#include "op_registry.h"

static bool s_linear_partial(dt_placement p)
{
    return p.kind == DT_PARTIAL && (p.reduce_op == DT_REDUCE_SUM || p.reduce_op == DT_REDUCE_AVG);
}

/* ---- conv2d ----------------------------------------------------------------------------------- */

static int s_infer_conv(op_call *c)
{
    char xs[160], ws[160], bs[160];
    if (c->nin < 2 || c->nin > 3)
        return dt_err(DT_EINVAL, "conv2d: expected input, weight and an optional bias, got %d tensors", c->nin);
    const op_arg *x = &c->in[0], *w = &c->in[1];
    dt_layout_format_sizes(xs, sizeof xs, x->ndim, x->shape);
    dt_layout_format_sizes(ws, sizeof ws, w->ndim, w->shape);
    if (x->ndim != 4)
        return dt_err(DT_EINVAL, "conv2d: Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of "
                      "size: %s", xs);
    if (w->ndim != 4)
        return dt_err(DT_EINVAL, "conv2d: Expected 4-dimensional weight (out_channels, in_channels / groups, kH, "
                      "kW), but got weight of size %s", ws);
    if (!dt_dtype_is_float(x->dtype))
        return dt_err(DT_ETYPE, "conv2d: expected a floating point input, got %s", dt_dtype_name(x->dtype));
    for (int i = 1; i < c->nin; i++)
        if (c->in[i].dtype != x->dtype)
            return dt_err(DT_ETYPE, "conv2d: Input type (%s) and %s type (%s) should be the same",
                          dt_dtype_name(x->dtype), i == 1 ? "weight" : "bias", dt_dtype_name(c->in[i].dtype));
    if (c->attrs.nints != 9)
        return dt_err(DT_EINVAL, "conv2d: expected 9 ints (stride, padding on each side, dilation, groups), got %d",
                      c->attrs.nints);
    const int64_t *a = c->attrs.ints;
    for (int i = 0; i < 2; i++)
        if (a[i] < 1)
            return dt_err(DT_EINVAL, "conv2d: non-positive stride is not supported (got %lld)", (long long)a[i]);
    for (int i = 2; i < 6; i++)
        if (a[i] < 0)
            return dt_err(DT_EINVAL, "conv2d: negative padding is not supported (got %lld)", (long long)a[i]);
    for (int i = 6; i < 8; i++)
        if (a[i] < 1)
            return dt_err(DT_EINVAL, "conv2d: dilation should be greater than zero (got %lld)", (long long)a[i]);
    int64_t groups = a[8];
    if (groups < 1)
        return dt_err(DT_EINVAL, "conv2d: non-positive groups is not supported (got %lld)", (long long)groups);
    if (w->shape[0] % groups != 0)
        return dt_err(DT_EINVAL, "conv2d: Given groups=%lld, expected weight to be divisible by %lld at dimension 0, "
                      "but got weight of size %s instead", (long long)groups, (long long)groups, ws);
    int64_t channels;
    if (__builtin_mul_overflow(w->shape[1], groups, &channels))
        return dt_err(DT_EINVAL, "conv2d: Given groups=%lld, weight of size %s, expected input%s to have more "
                      "channels than int64 holds", (long long)groups, ws, xs);
    if (x->shape[1] != channels)
        return dt_err(DT_EINVAL, "conv2d: Given groups=%lld, weight of size %s, expected input%s to have %lld "
                      "channels, but got %lld channels instead", (long long)groups, ws, xs, (long long)channels,
                      (long long)x->shape[1]);
    if (c->nin == 3) {
        const op_arg *b = &c->in[2];
        if (b->ndim != 1 || b->shape[0] != w->shape[0]) {
            dt_layout_format_sizes(bs, sizeof bs, b->ndim, b->shape);
            return dt_err(DT_EINVAL, "conv2d: Given weight of size %s, expected bias to be 1-dimensional with %lld "
                          "elements, but got bias of size %s instead", ws, (long long)w->shape[0], bs);
        }
    }
    int64_t ph, pw, kh, kw;
    if (__builtin_add_overflow(x->shape[2], a[2], &ph) || __builtin_add_overflow(ph, a[3], &ph) ||
        __builtin_add_overflow(x->shape[3], a[4], &pw) || __builtin_add_overflow(pw, a[5], &pw) ||
        __builtin_mul_overflow(a[6], w->shape[2] - 1, &kh) || __builtin_mul_overflow(a[7], w->shape[3] - 1, &kw) ||
        __builtin_add_overflow(kh, 1, &kh) || __builtin_add_overflow(kw, 1, &kw))
        return dt_err(DT_EINVAL, "conv2d: the padded input (%s with padding %lld, %lld, %lld, %lld) or the dilated "
                      "kernel (%s with dilation %lld, %lld) has more elements per side than int64 holds", xs,
                      (long long)a[2], (long long)a[3], (long long)a[4], (long long)a[5], ws, (long long)a[6],
                      (long long)a[7]);
    if (w->shape[2] < 1 || w->shape[3] < 1 || ph < kh || pw < kw)
        return dt_err(DT_EINVAL, "conv2d: Calculated padded input size per channel: (%lld x %lld). Kernel size: "
                      "(%lld x %lld). Kernel size can't be greater than actual input size", (long long)ph,
                      (long long)pw, (long long)kh, (long long)kw);
    op_arg *o = &c->out[0];
    o->ndim = 4;
    o->dtype = x->dtype;
    o->shape[0] = x->shape[0];
    o->shape[1] = w->shape[0];
    o->shape[2] = (ph - kh) / a[0] + 1;
    o->shape[3] = (pw - kw) / a[1] + 1;
    return 0;
}

static int s_shard_conv(op_call *c)
{
    const op_arg *x = &c->in[0], *w = &c->in[1];
    bool bias = c->nin == 3, grouped = c->attrs.ints[8] != 1;
    dt_placement R = dt_replicate();
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement px = x->pl[m], pw = w->pl[m], out = R, wx = R, ww = R, wb = R;
        if (px.kind == DT_SHARD && px.dim == 0) {
            out = wx = dt_shard(0);
        } else if (pw.kind == DT_SHARD && pw.dim == 0 && !grouped && !(px.kind == DT_SHARD && px.dim == 1)) {
            ww = wb = dt_shard(0);
            out = dt_shard(1);
        } else if (s_linear_partial(px) && !bias) {
            out = wx = px;
        }
        c->want[0][m] = wx;
        c->want[1][m] = ww;
        if (bias)
            c->want[2][m] = wb;
        c->out[0].pl[m] = out;
    }
    return 0;
}

/* ---- group_norm ------------------------------------------------------------------------------- */

static int s_infer_group_norm(op_call *c)
{
    char xs[160], ws[160];
    const op_arg *x = &c->in[0];
    dt_layout_format_sizes(xs, sizeof xs, x->ndim, x->shape);
    if (c->attrs.nints != 2 || c->attrs.nfloats != 1)
        return dt_err(DT_EINVAL, "group_norm: expected ints [num_groups, flags] and floats [eps]");
    int64_t groups = c->attrs.ints[0], flags = c->attrs.ints[1];
    if (flags < 0 || flags > 3 || c->nin != 1 + __builtin_popcount((unsigned)flags))
        return dt_err(DT_EINVAL, "group_norm: ints[1] = %lld does not say which of the %d extra tensors are weight "
                      "and bias", (long long)flags, c->nin - 1);
    if (x->ndim < 2)
        return dt_err(DT_EINVAL, "group_norm: Expected at least 2 dimensions for input tensor but received %d",
                      x->ndim);
    if (!dt_dtype_is_float(x->dtype))
        return dt_err(DT_ETYPE, "group_norm: expected a floating point input, got %s", dt_dtype_name(x->dtype));
    if (groups < 1 || x->shape[1] % groups != 0)
        return dt_err(DT_EINVAL, "group_norm: Expected number of channels in input to be divisible by num_groups, but "
                      "got input of shape %s and num_groups=%lld", xs, (long long)groups);
    for (int i = 1; i < c->nin; i++) {
        const op_arg *p = &c->in[i];
        const char *what = i == 1 && (flags & 1) ? "weight" : "bias";
        if (p->ndim != 1 || p->shape[0] != x->shape[1]) {
            dt_layout_format_sizes(ws, sizeof ws, p->ndim, p->shape);
            return dt_err(DT_EINVAL, "group_norm: Expected %s to be a vector of size equal to the number of channels "
                          "in input, but got %s of shape %s and input of shape %s", what, what, ws, xs);
        }
        if (!dt_dtype_is_float(p->dtype))
            return dt_err(DT_ETYPE, "group_norm: expected a floating point %s, got %s", what,
                          dt_dtype_name(p->dtype));
    }
    c->out[0] = *x;
    return 0;
}

static int s_shard_group_norm(op_call *c)
{
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = c->in[0].pl[m];
        if (!(p.kind == DT_SHARD && p.dim == 0))
            p = dt_replicate();
        c->want[0][m] = c->out[0].pl[m] = p;
        for (int i = 1; i < c->nin; i++)
            c->want[i][m] = dt_replicate();
    }
    return 0;
}

/* ---- interpolate ------------------------------------------------------------------------------ */

static int s_infer_interpolate(op_call *c)
{
    char xs[160];
    const op_arg *x = &c->in[0];
    dt_layout_format_sizes(xs, sizeof xs, x->ndim, x->shape);
    if (x->ndim != 3 && x->ndim != 4)
        return dt_err(DT_EINVAL, "interpolate: expected a 3D (N, C, L) or 4D (N, C, H, W) input, got input of size %s",
                      xs);
    int ns = x->ndim - 2;
    if (c->attrs.nints != 2 + ns || c->attrs.nfloats != ns)
        return dt_err(DT_EINVAL, "interpolate: expected ints [mode, align_corners, %d output sizes] and %d scale "
                      "factors", ns, ns);
    if (!dt_dtype_is_float(x->dtype))
        return dt_err(DT_ETYPE, "interpolate: expected a floating point input, got %s", dt_dtype_name(x->dtype));
    int64_t mode = c->attrs.ints[0], align = c->attrs.ints[1];
    if (mode < 0 || mode > 2)
        return dt_err(DT_EINVAL, "interpolate: unknown mode %lld (0 nearest, 1 linear, 2 nearest-exact)",
                      (long long)mode);
    if (align != 0 && align != 1)
        return dt_err(DT_EINVAL, "interpolate: align_corners must be 0 or 1, got %lld", (long long)align);
    if (align && mode != 1)
        return dt_err(DT_EINVAL, "interpolate: align_corners option can only be set with the interpolating modes: "
                      "linear | bilinear | bicubic | trilinear");
    op_arg *o = &c->out[0];
    *o = *x;
    for (int d = 0; d < ns; d++) {
        int64_t in = x->shape[2 + d], out = c->attrs.ints[2 + d];
        double scale = c->attrs.floats[d];
        if (in <= 0 || out <= 0)
            return dt_err(DT_EINVAL, "interpolate: Input and output sizes should be greater than 0, but got input %s "
                          "and output size %lld on spatial dim %d", xs, (long long)out, d);
        if (!(scale >= 0) || isinf(scale))
            return dt_err(DT_EINVAL, "interpolate: scale factors must be finite and positive, got %g", scale);
        o->shape[2 + d] = out;
    }
    return 0;
}

static int s_shard_interpolate(op_call *c)
{
    bool linear = c->attrs.ints[0] == 1;
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = c->in[0].pl[m];
        bool keep = (p.kind == DT_SHARD && p.dim <= 1) || (p.kind == DT_PARTIAL && (!linear || s_linear_partial(p)));
        if (!keep)
            p = dt_replicate();
        c->want[0][m] = c->out[0].pl[m] = p;
    }
    return 0;
}

/* ---- pad -------------------------------------------------------------------------------------- */

static const char *const s_pad_modes[] = {"constant", "reflect", "replicate"};

static int s_infer_pad(op_call *c)
{
    char xs[160];
    const op_arg *x = &c->in[0];
    dt_layout_format_sizes(xs, sizeof xs, x->ndim, x->shape);
    if (c->attrs.nints < 1)
        return dt_err(DT_EINVAL, "pad: expected ints [mode, pads...]");
    int64_t mode = c->attrs.ints[0];
    int npad = c->attrs.nints - 1, npairs = npad / 2;
    const int64_t *pads = &c->attrs.ints[1];
    if (mode < 0 || mode > 2)
        return dt_err(DT_EINVAL, "pad: unknown mode %lld (0 constant, 1 reflect, 2 replicate)", (long long)mode);
    if (npad % 2 != 0)
        return dt_err(DT_EINVAL, "pad: Padding length must be divisible by 2");
    if (npairs > x->ndim)
        return dt_err(DT_EINVAL, "pad: Padding length should be less than or equal to two times the input dimension "
                      "but got padding length %d and input of dimension %d", npad, x->ndim);
    if (mode == 0 && c->attrs.nfloats != 1)
        return dt_err(DT_EINVAL, "pad: constant padding expects its value in floats[0]");
    if (mode != 0 && (npairs < 1 || npairs > 3 || x->ndim < npairs + 1 || x->ndim > npairs + 2))
        return dt_err(DT_EUNSUPPORTED, "pad: %s padding of %d dims is supported for %dD or %dD input, got input of "
                      "size %s (padding length 2 pads 2D/3D input, 4 pads 3D/4D, 6 pads 4D/5D)",
                      s_pad_modes[mode], npairs, npairs + 1, npairs + 2, xs);
    op_arg *o = &c->out[0];
    *o = *x;
    for (int i = 0; i < npairs; i++) {
        int d = x->ndim - 1 - i;
        int64_t l = pads[2 * i], r = pads[2 * i + 1], n = x->shape[d];
        if (mode == 1 && (l >= n || r >= n))
            return dt_err(DT_EINVAL, "pad: Argument #4: Padding size should be less than the corresponding input "
                          "dimension, but got: padding (%lld, %lld) at dimension %d of input %s", (long long)l,
                          (long long)r, d, xs);
        if (mode == 2 && n == 0 && (l > 0 || r > 0))
            return dt_err(DT_EINVAL, "pad: replicate padding needs a non-empty dimension %d, got input %s", d, xs);
        if (n + l + r < 0)
            return dt_err(DT_EINVAL, "pad: The input size %lld, plus negative padding %lld and %lld resulted in a "
                          "negative output size, which is invalid. Check dimension %d of your input.", (long long)n,
                          (long long)l, (long long)r, d);
        o->shape[d] = n + l + r;
    }
    return 0;
}

static int s_shard_pad(op_call *c)
{
    const op_arg *x = &c->in[0];
    int64_t mode = c->attrs.ints[0];
    int npairs = (c->attrs.nints - 1) / 2;
    bool zero = mode == 0 && c->attrs.floats[0] == 0.0;
    for (int m = 0; m < c->mesh_ndim; m++) {
        dt_placement p = x->pl[m];
        bool keep = true;
        if (p.kind == DT_SHARD) {
            int i = x->ndim - 1 - p.dim;
            keep = i >= npairs || (c->attrs.ints[1 + 2 * i] == 0 && c->attrs.ints[2 + 2 * i] == 0);
        } else if (p.kind == DT_PARTIAL) {
            keep = mode != 0 || p.reduce_op != DT_REDUCE_SUM || zero;
        }
        if (!keep)
            p = dt_replicate();
        c->want[0][m] = c->out[0].pl[m] = p;
    }
    return 0;
}

/* ---- the image ops on a device ---------------------------------------------------------------- */

const char *op_conv2d_layout(const op_kernel *k, op_conv2d_dims *d)
{
    static const char misfit[] = "conv2d: the pieces do not fit together (internal error)";
    const op_local *x = &k->in[0], *w = &k->in[1], *b = k->nin == 3 ? &k->in[2] : NULL, *y = &k->out[0];
    const int64_t *a = k->attrs->ints;
    if ((k->nin != 2 && k->nin != 3) || k->nout != 1 || k->attrs->nints != 9 || x->ndim != 4 || w->ndim != 4 ||
        y->ndim != 4)
        return "conv2d: malformed arguments (internal error)";
    *d = (op_conv2d_dims){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .O = w->shape[0],
                          .kH = w->shape[2], .kW = w->shape[3], .OH = y->shape[2], .OW = y->shape[3],
                          .stride = {a[0], a[1]}, .pad_top = a[2], .pad_left = a[4], .dilation = {a[6], a[7]},
                          .groups = a[8]};
    bool dtypes = w->dtype == x->dtype && y->dtype == x->dtype && (!b || b->dtype == x->dtype) &&
                  dt_dtype_is_float(x->dtype);
    int64_t C;
    if (!dtypes || d->groups < 1 || __builtin_mul_overflow(w->shape[1], d->groups, &C) || d->C != C ||
        d->O % d->groups != 0 || y->shape[0] != d->N || y->shape[1] != d->O || (b && (b->ndim != 1 || b->shape[0] != d->O)) ||
        a[0] < 1 || a[1] < 1 || a[2] < 0 || a[3] < 0 || a[4] < 0 || a[5] < 0 || a[6] < 1 || a[7] < 1)
        return misfit;
    /* every output position's taps stay within the padded input (the kernels read no further), with
     * no sum or product past int64: the padded input is held below 2^62, a stride of an axis of one
     * output position selects nothing (1), and the columns of one output row (K * OW) fit */
    for (int i = 0; i < 2; i++) {
        int64_t in = i ? d->W : d->H, k_ = i ? d->kW : d->kH, out = i ? d->OW : d->OH, padded, reach, taps;
        if (__builtin_add_overflow(in, a[2 + 2 * i], &padded) || __builtin_add_overflow(padded, a[3 + 2 * i], &padded) ||
            padded > (INT64_C(1) << 62))
            return misfit;
        if (out <= 1)
            d->stride[i] = 1;
        if (out > 0 && (__builtin_mul_overflow(out - 1, d->stride[i], &reach) ||
                        __builtin_mul_overflow(k_ - 1, d->dilation[i], &taps) ||
                        __builtin_add_overflow(reach, taps, &reach) || reach >= padded))
            return misfit;
    }
    if (dt_layout_numel(4, y->shape) == 0) {
        d->N = 0; /* nothing to compute, and an empty piece's sizes may not multiply */
        return NULL;
    }
    int64_t K = d->C / d->groups * d->kH * d->kW, row;
    return __builtin_mul_overflow(K, d->OW, &row) ? misfit : NULL;
}

bool op_conv2d_direct(const op_conv2d_dims *d)
{
    return d->kH == 1 && d->kW == 1 && d->stride[0] == 1 && d->stride[1] == 1 && d->pad_top == 0 &&
           d->pad_left == 0 && d->OH == d->H && d->OW == d->W;
}

const char *op_group_norm_layout(const op_kernel *k, op_group_norm_dims *d)
{
    const op_local *x = &k->in[0], *y = &k->out[0];
    if (k->attrs->nints != 2 || k->attrs->nfloats != 1 || x->ndim < 2 || y->ndim != x->ndim || y->dtype != x->dtype)
        return "group_norm: malformed arguments (internal error)";
    int64_t G = k->attrs->ints[0], flags = k->attrs->ints[1];
    if (G < 1 || x->shape[1] % G != 0 || flags < 0 || flags > 3 || k->nin != 1 + __builtin_popcount((unsigned)flags))
        return "group_norm: malformed arguments (internal error)";
    /* S of an empty piece is 0: its sizes may not multiply */
    int64_t S = dt_layout_numel(x->ndim, x->shape) ? dt_layout_numel(x->ndim - 2, x->shape + 2) : 0;
    *d = (op_group_norm_dims){.N = x->shape[0], .C = x->shape[1], .S = S,
                              .G = G, .weight = flags & 1 ? &k->in[1] : NULL,
                              .bias = flags & 2 ? &k->in[flags & 1 ? 2 : 1] : NULL,
                              .eps = (float)k->attrs->floats[0]};
    for (int i = 0; i < 2; i++) {
        const op_local *p = i ? d->bias : d->weight;
        if (p && (p->ndim != 1 || p->shape[0] != d->C || !dt_dtype_is_float(p->dtype)))
            return "group_norm: malformed arguments (internal error)";
    }
    for (int i = 0; i < x->ndim; i++)
        if (y->shape[i] != x->shape[i])
            return "group_norm: malformed arguments (internal error)";
    return NULL;
}

const char *op_interpolate_layout(const op_kernel *k, op_interpolate_dims *d)
{
    const op_local *x = &k->in[0], *y = &k->out[0];
    int ns = x->ndim - 2;
    if ((ns != 1 && ns != 2) || k->attrs->nints != 2 + ns || k->attrs->nfloats != ns || y->ndim != x->ndim ||
        !dt_dtype_is_float(x->dtype) || !dt_dtype_is_float(y->dtype) || y->shape[0] != x->shape[0] ||
        y->shape[1] != x->shape[1])
        return "interpolate: malformed arguments (internal error)";
    if (k->attrs->ints[0] < 0 || k->attrs->ints[0] > 2 || (k->attrs->ints[1] != 0 && k->attrs->ints[1] != 1))
        return "interpolate: malformed arguments (internal error)";
    *d = (op_interpolate_dims){.mode = (int)k->attrs->ints[0], .align_corners = (int)k->attrs->ints[1],
                               .nspatial = ns, .P = x->shape[0] * x->shape[1], .IH = ns == 2 ? x->shape[2] : 1,
                               .IW = x->shape[x->ndim - 1], .OH = ns == 2 ? y->shape[2] : 1,
                               .OW = y->shape[y->ndim - 1]};
    if ((d->IH == 0 || d->IW == 0) && d->P > 0 && d->OH > 0 && d->OW > 0)
        return "interpolate: malformed arguments (internal error)";
    /* a scale factor's source positions (o / factor, below out / factor) are floats that must become
     * int64 without overflow: a factor torch would take (the output is about input x factor) is far
     * within that */
    for (int i = 0; i < ns; i++) {
        double f = k->attrs->floats[i];
        int64_t out = i == ns - 1 ? d->OW : d->OH;
        if (f > 0 && !((double)out / f < 0x1p62))
            return "interpolate: malformed arguments (internal error)";
    }
    return NULL;
}

void op_resample_axis(int64_t in, int64_t out, int mode, int align_corners, double scale_factor, int64_t *i0,
                      int64_t *i1, float *l1)
{
    float scale = op_resample_scale(in, out, mode, align_corners, scale_factor);
    for (int64_t o = 0; o < out; o++)
        op_resample_source(o, in, out, mode, align_corners, scale, &i0[o], &i1[o], &l1[o]);
}

void op_interpolate_sources(const op_kernel *k, const op_interpolate_dims *d, int64_t *h0, int64_t *h1, float *lh,
                            int64_t *w0, int64_t *w1, float *lw)
{
    if (d->nspatial == 2)
        op_resample_axis(d->IH, d->OH, d->mode, d->align_corners, k->attrs->floats[0], h0, h1, lh);
    else
        h0[0] = h1[0] = 0, lh[0] = 0.0f;
    op_resample_axis(d->IW, d->OW, d->mode, d->align_corners, k->attrs->floats[d->nspatial - 1], w0, w1, lw);
}

const char *op_pad_layout(const op_kernel *k, int *mode, int64_t *left, uint64_t *fill)
{
    static const char misfit[] = "pad: the pieces do not fit together (internal error)";
    const op_local *x = &k->in[0], *y = &k->out[0];
    int npairs = (k->attrs->nints - 1) / 2;
    if (k->nin != 1 || k->nout != 1 || k->attrs->nints < 1 || npairs > x->ndim || y->ndim != x->ndim ||
        x->dtype != y->dtype)
        return "pad: malformed arguments (internal error)";
    *mode = (int)k->attrs->ints[0];
    if (k->attrs->ints[0] < 0 || k->attrs->ints[0] > 2)
        return "pad: malformed arguments (internal error)";
    /* every dim: the output is the input with left[d] and right elements added (negative: cropped),
     * each within 2^62, so that no position the kernels work out overflows */
    const int64_t lim = INT64_C(1) << 62;
    for (int d = 0; d < x->ndim; d++) {
        int i = x->ndim - 1 - d;
        bool padded = i < npairs;
        int64_t l = padded ? k->attrs->ints[1 + 2 * i] : 0, r = padded ? k->attrs->ints[2 + 2 * i] : 0, size;
        if (l < -lim || l > lim || r < -lim || r > lim || __builtin_add_overflow(x->shape[d], l, &size) ||
            __builtin_add_overflow(size, r, &size) || size != y->shape[d])
            return misfit;
        /* replicate and reflect read within the input; reflect's edges are shorter than it */
        if (y->shape[d] > 0 && ((*mode != 0 && x->shape[d] == 0) || (*mode == 1 && (l >= x->shape[d] || r >= x->shape[d]))))
            return misfit;
        left[d] = l;
    }
    *fill = 0;
    double v = *mode == 0 && k->attrs->nfloats > 0 ? k->attrs->floats[0] : 0.0;
    switch (x->dtype) {
    case DT_FLOAT32: { float f = (float)v; memcpy(fill, &f, sizeof f); break; }
    case DT_FLOAT16: { uint16_t h = dt_f32_to_f16((float)v); memcpy(fill, &h, sizeof h); break; }
    case DT_BFLOAT16: { uint16_t h = dt_f32_to_bf16((float)v); memcpy(fill, &h, sizeof h); break; }
    /* integers truncate toward zero, saturating, NaN 0 (cpu_fill's conversion) */
    case DT_INT32: { int32_t i = v != v ? 0 : v <= INT32_MIN ? INT32_MIN : v >= INT32_MAX ? INT32_MAX : (int32_t)v;
                     memcpy(fill, &i, sizeof i); break; }
    case DT_INT64: { int64_t i = v != v ? 0 : v < -0x1p63 ? INT64_MIN : v >= 0x1p63 ? INT64_MAX : (int64_t)v;
                     memcpy(fill, &i, sizeof i); break; }
    default: { uint8_t b = v != 0; memcpy(fill, &b, sizeof b); break; }
    }
    return NULL;
}

/* ---- the rows of OP_IMAGE --------------------------------------------------------------------- */

#define S_DEF(op, num, inputs, infer_fn, shard_fn)                                                                     \
    const op_def op_def_##op = {.name = #op, .id = num, .nin = inputs, .nout = 1, .infer = infer_fn,                 \
                                .shard = shard_fn};
OP_IMAGE(S_DEF)
#undef S_DEF
