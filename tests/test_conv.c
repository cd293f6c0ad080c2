/* conv2d's CPU kernels (ops/cpu/cpu_image.h, cpu_dnnl.h) against a direct sum in double: im2col and
 * sgemm, and oneDNN in a build with it (which must then take every case here, counted by
 * cpu_dnnl_convs), on odd sizes, strides 1 and 2, paddings 0 and 1, with and without bias, batches of
 * 1 to 3, the pieces of an image split by rows (the top one with only its top pad, a middle one
 * with none, the bottom one with only its bottom pad), groups and dilation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_dnnl.h"
#include "cpu_image.h"

typedef struct {
    int64_t N, C, O, H, W, kH, kW, sh, sw, pt, pb, pl, pr, dh, dw, G;
    bool bias;
} s_case;

static float s_val(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The largest |a - ref| over the largest |ref|. */
static double s_rel(const float *a, const double *ref, int64_t n)
{
    double diff = 0, top = 0;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - ref[i]));
        top = fmax(top, fabs(ref[i]));
    }
    return top > 0 ? diff / top : diff;
}

static void s_check(const s_case *c, unsigned salt)
{
    int64_t OH = (c->H + c->pt + c->pb - c->dh * (c->kH - 1) - 1) / c->sh + 1;
    int64_t OW = (c->W + c->pl + c->pr - c->dw * (c->kW - 1) - 1) / c->sw + 1;
    int64_t Cg = c->C / c->G, Og = c->O / c->G;
    int64_t nx = c->N * c->C * c->H * c->W, nw = c->O * Cg * c->kH * c->kW, per = c->O * OH * OW, ny = c->N * per;
    float *x = malloc((size_t)nx * 4), *w = malloc((size_t)nw * 4), *b = malloc((size_t)c->O * 4);
    float *y_im = malloc((size_t)ny * 4), *y_dn = malloc((size_t)ny * 4);
    double *ref = calloc((size_t)ny, sizeof *ref);
    unsigned seed = (unsigned)(c->C * 131 + c->H * 7 + c->pt) + salt;
    for (int64_t i = 0; i < nx; i++)
        x[i] = s_val(&seed);
    for (int64_t i = 0; i < nw; i++)
        w[i] = s_val(&seed);
    for (int64_t i = 0; i < c->O; i++)
        b[i] = s_val(&seed);
    /* the definition: out[n][o][i][j] = bias[o] + sum over the group's channels and the taps that
     * land inside the image of x * w */
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t i = 0; i < OH; i++)
                for (int64_t j = 0; j < OW; j++) {
                    double s = c->bias ? b[o] : 0.0;
                    int64_t g = o / Og;
                    for (int64_t ci = 0; ci < Cg; ci++)
                        for (int64_t ki = 0; ki < c->kH; ki++)
                            for (int64_t kj = 0; kj < c->kW; kj++) {
                                int64_t ih = i * c->sh - c->pt + ki * c->dh, iw = j * c->sw - c->pl + kj * c->dw;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W)
                                    continue;
                                s += (double)x[((n * c->C + g * Cg + ci) * c->H + ih) * c->W + iw] *
                                     w[((o * Cg + ci) * c->kH + ki) * c->kW + kj];
                            }
                    ref[((n * c->O + o) * OH + i) * OW + j] = s;
                }
    op_conv2d_dims d = {.N = c->N, .C = c->C, .H = c->H, .W = c->W, .O = c->O, .kH = c->kH, .kW = c->kW, .OH = OH,
                        .OW = OW, .stride = {OH > 1 ? c->sh : 1, OW > 1 ? c->sw : 1}, .pad_top = c->pt,
                        .pad_left = c->pl, .dilation = {c->dh, c->dw}, .groups = c->G};
    int64_t ncol = cpu_conv2d_col_size(&d);
    float *col = ncol ? malloc((size_t)ncol * 4) : NULL;
    for (int64_t n = 0; n < c->N; n++)
        cr_assert_null(cpu_conv2d(&d, x + n * c->C * c->H * c->W, w, c->bias ? b : NULL, y_im + n * per, col));
    int64_t before = cpu_dnnl_convs();
    bool took = cpu_dnnl_conv2d(&d, c->N, c->pb, c->pr, x, w, c->bias ? b : NULL, y_dn);
    char name[160];
    snprintf(name, sizeof name, "N %lld C %lld O %lld %lldx%lld k %lldx%lld stride %lldx%lld pads %lld %lld %lld %lld "
             "dilation %lldx%lld groups %lld bias %d", (long long)c->N, (long long)c->C, (long long)c->O,
             (long long)c->H, (long long)c->W, (long long)c->kH, (long long)c->kW, (long long)c->sh, (long long)c->sw,
             (long long)c->pt, (long long)c->pb, (long long)c->pl, (long long)c->pr, (long long)c->dh,
             (long long)c->dw, (long long)c->G, c->bias);
    cr_expect_lt(s_rel(y_im, ref, ny), 1e-5, "im2col, %s: %g", name, s_rel(y_im, ref, ny));
#if DTORCH_HAVE_DNNL
    cr_expect(took, "oneDNN declined %s", name);
    cr_expect_eq(cpu_dnnl_convs(), before + 1, "oneDNN's count, %s", name);
    if (took) {
        cr_expect_lt(s_rel(y_dn, ref, ny), 1e-5, "oneDNN, %s: %g", name, s_rel(y_dn, ref, ny));
        double d_im = 0, top = 0; /* and the two kernels against each other */
        for (int64_t i = 0; i < ny; i++) {
            d_im = fmax(d_im, fabs((double)y_dn[i] - y_im[i]));
            top = fmax(top, fabs((double)y_im[i]));
        }
        cr_expect_leq(d_im, 1e-5 * top, "oneDNN against im2col, %s", name);
    }
#else
    cr_expect(!took && cpu_dnnl_convs() == 0 && before == 0, "a build without oneDNN ran %s through it", name);
#endif
    free(x);
    free(w);
    free(b);
    free(y_im);
    free(y_dn);
    free(ref);
    free(col);
}

Test(conv, kernels_against_the_definition)
{
    static const s_case cases[] = {
        /* N  C  O  H   W  kH kW sh sw pt pb pl pr dh dw G bias */
        {2, 3, 5, 7, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, true},     /* odd sizes, padding 1 */
        {1, 4, 6, 11, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, false},   /* stride 2 */
        {3, 5, 4, 9, 10, 3, 2, 2, 1, 0, 0, 0, 0, 1, 1, 1, true},    /* padding 0, uneven kernel and stride */
        {2, 16, 24, 13, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, true}, /* channels of whole blocks of 8 */
        {1, 33, 9, 12, 15, 3, 3, 2, 2, 0, 1, 0, 1, 1, 1, 1, true},  /* stride 2, pads on one side, odd channels */
        /* an image of 12 rows split in three for a 3x3 of padding 1: each piece holds its output
         * rows' window (4 rows and its neighbours' halo) and keeps only the pads at the image's edge */
        {2, 8, 8, 5, 13, 3, 3, 1, 1, 1, 0, 1, 1, 1, 1, 1, true},    /* top: rows 0..4 */
        {2, 8, 8, 6, 13, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 1, true},    /* middle: rows 3..8 */
        {2, 8, 8, 5, 13, 3, 3, 1, 1, 0, 1, 1, 1, 1, 1, 1, false},   /* bottom: rows 7..11 */
        {2, 16, 8, 5, 7, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, true},    /* 1x1 */
        {1, 6, 9, 10, 9, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 3, true},    /* groups and dilation */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        s_check(&cases[i], 0);
}

/* im2col past CPU_CONV2D_COL_MAX floats of columns goes by chunks of output rows: 256 channels x
 * 3x3 x 128 x 64 columns are two chunks. */
Test(conv, im2col_by_chunks)
{
    s_case c = {1, 256, 2, 130, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 1, true};
    op_conv2d_dims d = {.C = 256, .H = 130, .W = 64, .O = 2, .kH = 3, .kW = 3, .OH = 128, .OW = 64, .stride = {1, 1},
                        .pad_left = 1, .dilation = {1, 1}, .groups = 1};
    cr_assert_lt(cpu_conv2d_col_size(&d), 256 * 9 * 128 * 64);
    s_check(&c, 0);
}

/* The same sizes again reuse the thread's primitive: each call computes its own values (new
 * inputs and weights, at whatever addresses malloc gives). */
Test(conv, a_kept_primitive_runs_new_values)
{
    s_case c = {1, 8, 8, 9, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, true};
    for (int i = 0; i < 3; i++)
        s_check(&c, (unsigned)i * 7919u);
}
