/* bench_conv — conv2d's two CPU kernels side by side on one thread, in one run: im2col and
 * OpenBLAS' sgemm (cpu_conv2d) and oneDNN's convolution primitive (cpu_dnnl_conv2d, in a build
 * with oneDNN), on the same values, float32, batch 1.
 *
 * The shapes are an AutoencoderKL decoder's (bench_diffusion's small VAE: 16/32/64/64 channels,
 * a 256x256 image from a 32x32 latent): its 3x3 convolutions of stride 1 and padding 1, the
 * 1x1 shortcuts where a block changes its channels, and its first and last convolutions. Each
 * figure is the median of its repeats, in ms and GFLOP/s (2 * O * C * kH * kW * OH * OW flops);
 * "first" is oneDNN's first call of the shape (it builds the primitive), and the largest relative
 * difference between the two outputs is printed beside. The process's thread count is printed
 * before and after: oneDNN is to run on this thread alone (DTORCH_BLAS_THREADS, default 1).
 *
 * Usage: bench_conv [repeat_scale]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cpu_dnnl.h"
#include "cpu_image.h"

static int s_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    if (f)
        fclose(f);
    return n;
}

static void s_fill(float *p, int64_t n, unsigned seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

int main(int argc, char **argv)
{
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    /* C, O, H, W, k (stride 1, padding k / 2) */
    static const int64_t shapes[][5] = {
        {4, 64, 32, 32, 3},    {64, 64, 32, 32, 3},   {64, 64, 64, 64, 3},   {64, 32, 128, 128, 3},
        {32, 32, 128, 128, 3}, {32, 16, 256, 256, 3}, {16, 16, 256, 256, 3}, {16, 3, 256, 256, 3},
        {64, 32, 128, 128, 1}, {32, 16, 256, 256, 1},
    };
    printf("threads at start: %d (DTORCH_BLAS_THREADS=%s)\n", s_threads(),
           getenv("DTORCH_BLAS_THREADS") ? getenv("DTORCH_BLAS_THREADS") : "unset");
    printf("%-22s %10s %8s %10s %8s %9s %8s %9s\n", "C,O,HxW,k", "im2col ms", "GFLOP/s", "oneDNN ms", "GFLOP/s",
           "first ms", "speedup", "max rel");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t *sh = shapes[s];
        int64_t C = sh[0], O = sh[1], H = sh[2], W = sh[3], k = sh[4];
        op_conv2d_dims d = {.N = 1, .C = C, .H = H, .W = W, .O = O, .kH = k, .kW = k, .OH = H, .OW = W,
                            .stride = {1, 1}, .pad_top = k / 2, .pad_left = k / 2, .dilation = {1, 1},
                            .groups = 1};
        int64_t nx = C * H * W, nw = O * C * k * k, ny = O * H * W, ncol = cpu_conv2d_col_size(&d);
        float *x = malloc((size_t)nx * 4), *w = malloc((size_t)nw * 4), *b = malloc((size_t)O * 4);
        float *y0 = malloc((size_t)ny * 4), *y1 = malloc((size_t)ny * 4);
        float *col = ncol ? malloc((size_t)ncol * 4) : NULL;
        s_fill(x, nx, 1);
        s_fill(w, nw, 2);
        s_fill(b, O, 3);
        double flops = 2.0 * (double)O * (double)C * (double)(k * k) * (double)(H * W);
        int reps = (int)fmax(3, scale * fmin(200, 2e9 / flops));
        double t_im[256], t_dn[256], first = NAN;
        reps = reps > 256 ? 256 : reps;
        cpu_conv2d(&d, x, w, b, y0, col); /* warm: pages, OpenBLAS' buffers */
        double t = bench_now_ns();
        bool dnnl = cpu_dnnl_conv2d(&d, 1, k / 2, k / 2, x, w, b, y1);
        first = (bench_now_ns() - t) * 1e-6;
        for (int r = 0; r < reps; r++) {
            t = bench_now_ns();
            cpu_conv2d(&d, x, w, b, y0, col);
            t_im[r] = (bench_now_ns() - t) * 1e-6;
            t = bench_now_ns();
            if (dnnl)
                cpu_dnnl_conv2d(&d, 1, k / 2, k / 2, x, w, b, y1);
            t_dn[r] = (bench_now_ns() - t) * 1e-6;
        }
        double rel = 0, ref = 0;
        for (int64_t i = 0; i < ny && dnnl; i++) {
            rel = fmax(rel, fabs((double)y1[i] - y0[i]));
            ref = fmax(ref, fabs((double)y0[i]));
        }
        double mi = bench_median(t_im, reps), md = bench_median(t_dn, reps);
        char name[64];
        snprintf(name, sizeof name, "%lld,%lld,%lldx%lld,%lld", (long long)C, (long long)O, (long long)H, (long long)W,
                 (long long)k);
        if (dnnl)
            printf("%-22s %10.3f %8.1f %10.3f %8.1f %9.1f %7.2fx %9.1e\n", name, mi, flops / mi * 1e-6, md,
                   flops / md * 1e-6, first, mi / md, ref > 0 ? rel / ref : rel);
        else
            printf("%-22s %10.3f %8.1f %10s\n", name, mi, flops / mi * 1e-6, "(none)");
        free(x);
        free(w);
        free(b);
        free(y0);
        free(y1);
        free(col);
    }
    printf("threads at end: %d\n", s_threads());
    return 0;
}
