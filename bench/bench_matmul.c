/* bench_matmul — what DTorch's matmul kernel delivers next to OpenBLAS called directly, measured
 * in one run.
 *
 * For square float32 products of 256, 512 and 1024 (and any sizes given on the command line) on
 * a 1-device mesh with thread workers, it reports GFLOP/s (2 n^3 flops per product) of:
 *   (a) OpenBLAS: cblas_sgemm called directly on this thread, on the same values, with the same
 *       OpenBLAS thread count the devices use;
 *   (b) DTorch, one op: dt_op("matmul") timed from submit to dt_synchronize — everything a user
 *       waits for (record, message, kernel, completion), nothing subtracted;
 *   (c) DTorch, pipelined: a run of ops submitted back to back, then one dt_synchronize.
 * Each figure is the median of its repeats (these machines are noisy). The DTorch result of the
 * last product is fetched and compared with the direct one (they must agree to float rounding).
 *
 * The thread count is 1 unless DTORCH_BLAS_THREADS says otherwise; OPENBLAS_CORETYPE is reported
 * when set (it picks OpenBLAS's kernels; this program does not change it), and so is the library
 * DTorch's products go through (cpu_gemm.h: OpenBLAS, or oneDNN where OpenBLAS's kernel is not the
 * CPU's best), so (b) / (a) is oneDNN against OpenBLAS where the two differ.
 *
 * Then, for decode's shapes (a few rows x a linear layer's weight, the 110M Llama's projections and
 * classifier), the kernels themselves on this thread, GB/s of weight read: sgemm, M sgemv calls,
 * cpu_matmul_skinny with float32 and bfloat16 weights, and cpu_quant_linear with int8 and int4
 * weights (each its own bytes, scales included); memcpy of the weight's bytes into a written buffer
 * is the reference for what memory allows. Last, one whole decode step's products at batch 1 of
 * the 15M and 110M shapes in each format, and decode's attention over caches of 64 to 4096 keys
 * beside two sgemv calls a head.
 *
 * Usage: bench_matmul [repeat_scale [n ...]]
 *   repeat_scale multiplies every repeat count (e.g. 0.2 for a quick look).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu_matmul.h"
#include "bench_util.h"
#include "dtorch.h"

#define S_MAX_SIZES 16
#define S_PIPELINE 8 /* ops per pipelined run */

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}



static void s_die(const char *what)
{
    fprintf(stderr, "bench_matmul: %s failed: %s\n", what, dt_last_error());
    exit(1);
}

/* The whole value of t, copied out (caller frees). */
static float *s_fetch(dt_tensor *t, int64_t n)
{
    dt_future *f = dt_tensor_fetch(t);
    if (!f || dt_future_wait(f, -1) != 0)
        s_die("fetch");
    float *out = malloc((size_t)n * sizeof *out);
    if (!out)
        s_die("malloc");
    memcpy(out, dt_future_data(f, 0), (size_t)n * sizeof *out);
    dt_future_release(&f);
    return out;
}

static dt_tensor *s_matmul(dt_tensor *a, dt_tensor *b)
{
    dt_tensor *in[2] = {a, b}, *out = NULL;
    if (dt_op("matmul", 2, in, NULL, 1, &out) != 1)
        s_die("dt_op(matmul)");
    return out;
}

typedef struct {
    double blas, dt_one, dt_pipe; /* GFLOP/s */
    double max_rel_err;
} s_result;

static s_result s_run(dt_mesh *mesh, int64_t n, int repeats)
{
    int64_t shape[2] = {n, n}, numel = n * n;
    double flops = 2.0 * (double)n * (double)n * (double)n;
    dt_tensor *a = dt_randn(mesh, 2, shape, DT_FLOAT32, NULL), *b = dt_randn(mesh, 2, shape, DT_FLOAT32, NULL);
    if (!a || !b)
        s_die("dt_randn");
    float *ha = s_fetch(a, numel), *hb = s_fetch(b, numel), *hc = malloc((size_t)numel * sizeof *hc);
    double *t = malloc((size_t)repeats * sizeof *t);
    if (!hc || !t)
        s_die("malloc");
    s_result r = {0};

    /* (a) OpenBLAS directly; one warm-up */
    for (int i = -1; i < repeats; i++) {
        double t0 = s_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, ha, (int)n, hb, (int)n,
                    0.0f, hc, (int)n);
        if (i >= 0)
            t[i] = s_now() - t0;
    }
    r.blas = flops / bench_median(t, repeats) * 1e-9;

    /* (b) one op, submit to synchronize; the release only queues a free for the next message */
    dt_tensor *c = s_matmul(a, b);
    if (dt_synchronize() != 0)
        s_die("dt_synchronize");
    dt_tensor_release(&c);
    for (int i = 0; i < repeats; i++) {
        double t0 = s_now();
        c = s_matmul(a, b);
        if (dt_synchronize() != 0)
            s_die("dt_synchronize");
        t[i] = s_now() - t0;
        if (i + 1 < repeats)
            dt_tensor_release(&c);
    }
    r.dt_one = flops / bench_median(t, repeats) * 1e-9;

    /* the last product against the direct one */
    float *got = s_fetch(c, numel);
    double num = 0, den = 0;
    for (int64_t i = 0; i < numel; i++) {
        double d = (double)got[i] - (double)hc[i];
        num += d * d;
        den += (double)hc[i] * (double)hc[i];
    }
    r.max_rel_err = sqrt(num / (den > 0 ? den : 1));
    free(got);
    dt_tensor_release(&c);

    /* (c) pipelined */
    int runs = repeats / S_PIPELINE > 3 ? repeats / S_PIPELINE : 3;
    for (int i = 0; i < runs; i++) {
        double t0 = s_now();
        for (int j = 0; j < S_PIPELINE; j++) {
            dt_tensor *x = s_matmul(a, b);
            dt_tensor_release(&x);
        }
        if (dt_synchronize() != 0)
            s_die("dt_synchronize");
        t[i] = (s_now() - t0) / S_PIPELINE;
    }
    r.dt_pipe = flops / bench_median(t, runs) * 1e-9;

    free(ha);
    free(hb);
    free(hc);
    free(t);
    dt_tensor_release(&a);
    dt_tensor_release(&b);
    return r;
}

/* Median seconds of fn over repeats. */
#define S_TIME(out, repeats, stmt)                                                                              \
    do {                                                                                                        \
        double t_[64];                                                                                          \
        for (int r_ = 0; r_ < (repeats); r_++) {                                                                \
            double t0_ = s_now();                                                                               \
            stmt;                                                                                               \
            t_[r_] = s_now() - t0_;                                                                             \
        }                                                                                                       \
        (out) = bench_median(t_, (repeats));                                                                    \
    } while (0)

/* A quantized weight of N x K for the kernels' timing (its values are any valid bytes) and its
 * dims for M rows: row bytes padded to int32 words, scales per row (int8) or per 32 features. */
typedef struct {
    op_quant_dims d;
    uint8_t *q;
    float *scale;
} s_qweight;

static s_qweight s_qweight_new(int bits, int64_t M, int64_t N, int64_t K)
{
    int64_t groups = bits == 8 ? 1 : (K + OP_QUANT_GROUP - 1) / OP_QUANT_GROUP;
    int64_t row_bytes = bits == 8 ? (K + 3) / 4 * 4 : (K + 7) / 8 * 4;
    s_qweight w = {.d = {.bits = bits, .M = M, .N = N, .K_x = K, .K = K, .row_bytes = row_bytes, .groups = groups},
                   .q = malloc((size_t)(N * row_bytes)),
                   .scale = malloc((size_t)(N * groups) * sizeof(float))};
    if (!w.q || !w.scale)
        s_die("malloc");
    for (int64_t i = 0; i < N * row_bytes; i++)
        w.q[i] = (uint8_t)(i * 37 + 11);
    for (int64_t i = 0; i < N * groups; i++)
        w.scale[i] = 0.01f;
    return w;
}

static double s_qweight_bytes(const s_qweight *w)
{
    return (double)(w->d.N * w->d.row_bytes) + (double)(w->d.N * w->d.groups) * sizeof(float);
}

static void s_qweight_free(s_qweight *w) { free(w->q), free(w->scale); }

static void s_decode_shapes(double scale)
{
    static const int64_t shapes[][2] = {{768, 768}, {2048, 768}, {768, 2048}, {32000, 288}, {32000, 768}};
    int repeats = (int)lround(15 * scale);
    repeats = repeats < 3 ? 3 : repeats > 64 ? 64 : repeats;
    printf("\n  decode shapes: (M x K) @ W^T with W (N x K); GB/s of weight bytes read, medians of %d\n", repeats);
    printf("  %6s %6s %3s %9s %9s %9s %9s %9s %9s %9s\n", "N", "K", "M", "memcpy", "sgemm", "M*sgemv", "skinny", "bf16",
           "int8", "int4");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        float *w = malloc((size_t)(N * K) * sizeof *w), *copy = malloc((size_t)(N * K) * sizeof *w);
        uint16_t *wb = malloc((size_t)(N * K) * sizeof *wb);
        float *x = malloc((size_t)(16 * K) * sizeof *x), *y = malloc((size_t)(16 * N) * sizeof *y);
        if (!w || !copy || !wb || !x || !y)
            s_die("malloc");
        for (int64_t i = 0; i < N * K; i++) {
            w[i] = (float)(i % 13) / 13.0f - 0.5f;
            wb[i] = (uint16_t)(0x3f00 + i % 64);
        }
        memset(copy, 1, (size_t)(N * K) * sizeof *copy);
        for (int64_t i = 0; i < 16 * K; i++)
            x[i] = (float)(i % 7) / 7.0f;
        double bytes = (double)(N * K) * sizeof(float), t_copy;
        S_TIME(t_copy, repeats, memcpy(copy, w, (size_t)bytes));
        for (int M = 1; M <= 16; M = M < 8 ? 2 * M : M + 4) {
            double t_gemm, t_gemv, t_skinny, t_bf16, t_q8, t_q4;
            s_qweight q8 = s_qweight_new(8, M, N, K), q4 = s_qweight_new(4, M, N, K);
            S_TIME(t_gemm, repeats, cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, (int)N, (int)K, 1.0f, x,
                                                (int)K, w, (int)K, 0.0f, y, (int)N));
            S_TIME(t_gemv, repeats, for (int m = 0; m < M; m++) cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)N, (int)K,
                                                                             1.0f, w, (int)K, x + m * K, 1, 0.0f,
                                                                             y + m * N, 1));
            S_TIME(t_skinny, repeats, cpu_matmul_skinny(M, N, K, x, w, DT_FLOAT32, y, false));
            S_TIME(t_bf16, repeats, cpu_matmul_skinny(M, N, K, x, wb, DT_BFLOAT16, y, false));
            S_TIME(t_q8, repeats, cpu_quant_linear(&q8.d, x, q8.q, q8.scale, NULL, y));
            S_TIME(t_q4, repeats, cpu_quant_linear(&q4.d, x, q4.q, q4.scale, NULL, y));
            printf("  %6lld %6lld %3d %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", (long long)N, (long long)K, M,
                   bytes / t_copy / 1e9, bytes / t_gemm / 1e9, bytes / t_gemv / 1e9, bytes / t_skinny / 1e9,
                   bytes / 2 / t_bf16 / 1e9, s_qweight_bytes(&q8) / t_q8 / 1e9, s_qweight_bytes(&q4) / t_q4 / 1e9);
            s_qweight_free(&q8), s_qweight_free(&q4);
        }
        fflush(stdout);
        free(w), free(copy), free(wb), free(x), free(y);
    }
    printf("  memcpy: the weight's bytes into a written buffer; bf16: the same kernel on a bfloat16 weight, int8 and "
           "int4: cpu_quant_linear on quantized weights (each its own bytes, scales included)\n");
}

/* One decode step's weight traffic at batch 1: every projection of every layer and the output
 * layer of llama2.c's 15M and 110M shapes, one after another (the layers' weights do not stay in
 * cache across steps once the output layer has streamed through it), through sgemv and through
 * the skinny kernel, on this thread; then the same step with every weight quantized (the output
 * layer too) through cpu_quant_linear. */
static void s_decode_model(double scale)
{
    static const struct { const char *name; int64_t dim, hidden, layers; } models[] = {{"15M", 288, 768, 6},
                                                                                      {"110M", 768, 2048, 12}};
    int repeats = (int)lround(9 * scale);
    repeats = repeats < 3 ? 3 : repeats > 64 ? 64 : repeats;
    printf("\n  one decode step's products at batch 1 (every layer's 7 projections, then the 32000-row output "
           "layer), medians of %d\n", repeats);
    printf("  %6s %9s %12s %12s %12s %12s %9s %9s %9s %9s\n", "model", "MB", "sgemv ms", "skinny ms", "sgemv GB/s",
           "skinny GB/s", "int8 ms", "int8 GB/s", "int4 ms", "int4 GB/s");
    for (size_t s = 0; s < sizeof models / sizeof models[0]; s++) {
        int64_t D = models[s].dim, F = models[s].hidden, n = 7 * models[s].layers + 1;
        int64_t (*shape)[2] = malloc((size_t)n * sizeof *shape);
        float **w = calloc((size_t)n, sizeof *w), *x = malloc((size_t)F * sizeof *x), *y = malloc(32000 * sizeof *y);
        s_qweight *q8 = calloc((size_t)n, sizeof *q8), *q4 = calloc((size_t)n, sizeof *q4);
        if (!shape || !w || !x || !y || !q8 || !q4)
            s_die("malloc");
        double bytes = 0, bytes8 = 0, bytes4 = 0;
        for (int64_t i = 0; i < n; i++) {
            int p = (int)(i % 7);
            shape[i][0] = i == n - 1 ? 32000 : p < 4 ? D : p < 6 ? F : D;
            shape[i][1] = i == n - 1 ? D : p < 6 ? D : F;
            int64_t count = shape[i][0] * shape[i][1];
            if (!(w[i] = malloc((size_t)count * sizeof(float))))
                s_die("malloc");
            for (int64_t e = 0; e < count; e++)
                w[i][e] = (float)(e % 13) / 13.0f - 0.5f;
            bytes += (double)count * sizeof(float);
            q8[i] = s_qweight_new(8, 1, shape[i][0], shape[i][1]);
            q4[i] = s_qweight_new(4, 1, shape[i][0], shape[i][1]);
            bytes8 += s_qweight_bytes(&q8[i]);
            bytes4 += s_qweight_bytes(&q4[i]);
        }
        for (int64_t i = 0; i < F; i++)
            x[i] = (float)(i % 7) / 7.0f;
        double t_gemv, t_skinny;
        S_TIME(t_gemv, repeats, for (int64_t i = 0; i < n; i++) cblas_sgemv(CblasRowMajor, CblasNoTrans,
                                                                            (int)shape[i][0], (int)shape[i][1], 1.0f,
                                                                            w[i], (int)shape[i][1], x, 1, 0.0f, y, 1));
        S_TIME(t_skinny, repeats,
               for (int64_t i = 0; i < n; i++) cpu_matmul_skinny(1, shape[i][0], shape[i][1], x, w[i], DT_FLOAT32, y,
                                                                 false));
        double t_q8, t_q4;
        S_TIME(t_q8, repeats, for (int64_t i = 0; i < n; i++) cpu_quant_linear(&q8[i].d, x, q8[i].q, q8[i].scale, NULL, y));
        S_TIME(t_q4, repeats, for (int64_t i = 0; i < n; i++) cpu_quant_linear(&q4[i].d, x, q4[i].q, q4[i].scale, NULL, y));
        printf("  %6s %9.1f %12.2f %12.2f %12.1f %12.1f %9.2f %9.1f %9.2f %9.1f\n", models[s].name, bytes / 1e6,
               t_gemv * 1e3, t_skinny * 1e3, bytes / t_gemv / 1e9, bytes / t_skinny / 1e9, t_q8 * 1e3,
               bytes8 / t_q8 / 1e9, t_q4 * 1e3, bytes4 / t_q4 / 1e9);
        fflush(stdout);
        for (int64_t i = 0; i < n; i++) {
            free(w[i]);
            s_qweight_free(&q8[i]), s_qweight_free(&q4[i]);
        }
        free(w), free(shape), free(x), free(y), free(q8), free(q4);
    }
}

/* One query row against a head's cache by two sgemv calls and a softmax between them: the BLAS
 * route for decode's attention, the reference for cpu_attention_head's few-rows path. */
static void s_head_by_sgemv(int64_t S, int64_t E, const float *q, const float *k, const float *v, float scale,
                            float *scores, float *out)
{
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)S, (int)E, scale, k, (int)E, q, 1, 0.0f, scores, 1);
    float top = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < S; j++)
        top = scores[j] > top ? scores[j] : top;
    for (int64_t j = 0; j < S; j++)
        sum += scores[j] = expf(scores[j] - top);
    cblas_sgemv(CblasRowMajor, CblasTrans, (int)S, (int)E, 1.0f / sum, v, (int)E, scores, 1, 0.0f, out, 1);
}

/* Decode's attention at batch 1: one query row for each of 6 heads of 64 features (the 110M's
 * heads on one device at tp=2) over S cached keys and values in float32, layer after layer of 12
 * (so the cache comes from wherever a decode step finds it: L2 for short ones, memory for long),
 * through cpu_attention_head and through sgemv; GB/s of the cache's bytes read. */
static void s_decode_attention(double scale)
{
    enum { H = 6, E = 64, LAYERS = 12 };
    static const int64_t lengths[] = {64, 256, 1024, 4096};
    int repeats = (int)lround(15 * scale);
    repeats = repeats < 3 ? 3 : repeats > 64 ? 64 : repeats;
    printf("\n  decode attention: 1 query row x %d heads of %d over S keys, %d layers one after another, medians of "
           "%d\n", H, E, LAYERS, repeats);
    printf("  %6s %9s %12s %12s %12s %12s %9s %10s\n", "S", "cache MB", "DTorch us", "sgemv us", "DTorch GB/s",
           "sgemv GB/s", "ratio", "rel err");
    for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
        int64_t S = lengths[l], per = (int64_t)H * S * E;
        float *k = malloc((size_t)(LAYERS * per) * sizeof *k), *v = malloc((size_t)(LAYERS * per) * sizeof *v);
        float *q = malloc(H * E * sizeof *q), *o1 = malloc(H * E * sizeof *o1), *o2 = malloc(H * E * sizeof *o2);
        float *scores = malloc((size_t)(cpu_attention_block_rows(1, S) * (S + 1)) * sizeof *scores);
        if (!k || !v || !q || !o1 || !o2 || !scores)
            s_die("malloc");
        for (int64_t i = 0; i < LAYERS * per; i++) {
            k[i] = (float)(i % 29) / 29.0f - 0.5f;
            v[i] = (float)(i % 31) / 31.0f - 0.5f;
        }
        for (int i = 0; i < H * E; i++)
            q[i] = (float)(i % 11) / 11.0f - 0.5f;
        const float sc = 0.125f;
        double t_dt, t_blas;
        S_TIME(t_dt, repeats, for (int y = 0; y < LAYERS; y++) for (int h = 0; h < H; h++)
               cpu_attention_head(1, S, E, E, q + h * E, k + y * per + h * S * E, v + y * per + h * S * E, DT_FLOAT32,
                                  NULL, 0, 0, false, 0, sc, scores, o1 + h * E));
        S_TIME(t_blas, repeats, for (int y = 0; y < LAYERS; y++) for (int h = 0; h < H; h++)
               s_head_by_sgemv(S, E, q + h * E, k + y * per + h * S * E, v + y * per + h * S * E, sc, scores,
                               o2 + h * E));
        double err = 0, norm = 0;
        for (int i = 0; i < H * E; i++) {
            err += (double)(o1[i] - o2[i]) * (o1[i] - o2[i]);
            norm += (double)o2[i] * o2[i];
        }
        double bytes = 2.0 * LAYERS * per * sizeof(float);
        printf("  %6lld %9.1f %12.1f %12.1f %12.1f %12.1f %8.2fx %10.2e\n", (long long)S, bytes / 1e6,
               t_dt / LAYERS * 1e6, t_blas / LAYERS * 1e6, bytes / t_dt / 1e9, bytes / t_blas / 1e9, t_blas / t_dt,
               sqrt(err / (norm > 0 ? norm : 1)));
        fflush(stdout);
        free(k), free(v), free(q), free(o1), free(o2), free(scores);
    }
    printf("  us: one layer's %d heads; ratio: sgemv's time over DTorch's; rel err: ||DTorch - sgemv|| / ||sgemv||\n",
           H);
}

int main(int argc, char **argv)
{
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    if (!(scale > 0)) {
        fprintf(stderr, "usage: %s [repeat_scale>0 [n ...]]\n", argv[0]);
        return 2;
    }
    int64_t sizes[S_MAX_SIZES] = {256, 512, 1024};
    int nsizes = 3;
    if (argc > 2) {
        nsizes = 0;
        for (int i = 2; i < argc && nsizes < S_MAX_SIZES; i++)
            if ((sizes[nsizes] = atoll(argv[i])) > 0)
                nsizes++;
    }
    int threads = cpu_blas_threads(); /* the setting the devices use, applied before any product */
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("DTorch matmul benchmark: %ld CPUs online; OpenBLAS %s\n", sysconf(_SC_NPROCESSORS_ONLN),
           openblas_get_config());
    printf("  OpenBLAS threads: %d (DTORCH_BLAS_THREADS=%s); OPENBLAS_CORETYPE=%s\n", threads,
           getenv("DTORCH_BLAS_THREADS") ? getenv("DTORCH_BLAS_THREADS") : "(unset)", coretype ? coretype : "(unset)");
    printf("  DTorch's products: %s (ops/cpu/cpu_gemm.h; DTORCH_GEMM=%s)\n", cpu_gemm_library(),
           getenv("DTORCH_GEMM") ? getenv("DTORCH_GEMM") : "(unset)");
    printf("  float32 (n x n) @ (n x n) on a 1-device mesh, thread workers; medians; GFLOP/s = 2 n^3 / time\n");
    fflush(stdout);

    if (dt_init(&(dt_config){DT_WORKERS_THREAD, NULL}) != 0)
        s_die("dt_init");
    dt_mesh *mesh = dt_mesh_new("cpu", 1, (int64_t[]){1}, (int64_t[]){0}, NULL);
    if (!mesh)
        s_die("dt_mesh_new");
    printf("\n  %6s %8s %12s %12s %12s %9s %9s %10s\n", "n", "repeats", "sgemm", "DTorch op", "pipelined", "op/sgemm",
           "pipe/sg", "rel err");
    int failed = 0;
    for (int s = 0; s < nsizes; s++) {
        int64_t n = sizes[s];
        int repeats = (int)lround((n <= 256 ? 200 : n <= 512 ? 50 : n <= 1024 ? 12 : 4) * scale);
        if (repeats < 3)
            repeats = 3;
        s_result r = s_run(mesh, n, repeats);
        printf("  %6lld %8d %12.2f %12.2f %12.2f %8.3fx %8.3fx %10.2e\n", (long long)n, repeats, r.blas, r.dt_one,
               r.dt_pipe, r.dt_one / r.blas, r.dt_pipe / r.blas, r.max_rel_err);
        fflush(stdout);
        if (!(r.max_rel_err < 1e-5)) {
            fprintf(stderr, "bench_matmul: the DTorch product differs from sgemm (relative error %.3g)\n",
                    r.max_rel_err);
            failed = 1;
        }
    }
    printf("\n  sgemm: cblas_sgemm on this thread; DTorch op: dt_op(\"matmul\") submit -> dt_synchronize, one at a "
           "time;\n  pipelined: %d ops, then one dt_synchronize; rel err: ||DTorch - sgemm|| / ||sgemm||\n",
           S_PIPELINE);
    s_decode_shapes(scale);
    s_decode_model(scale);
    s_decode_attention(scale);
    dt_mesh_release(&mesh);
    if (dt_shutdown() != 0)
        s_die("dt_shutdown");
    return failed;
}
