/* bench_collectives — what DTorch's redistribute collectives cost, beside memcpy measured in the
 * same run.
 *
 * For float32 tensors of 4 KiB, 1 MiB and 64 MiB on 1-D meshes of 2 and 4 devices, in thread and
 * process mode, it times one dt_redistribute followed by dt_synchronize:
 *   all_gather      Shard(0)     -> Replicate   (source: dt_rand)
 *   all_reduce      Partial(sum) -> Replicate   (source: dt_from_local, every piece full size)
 *   reduce_scatter  Partial(sum) -> Shard(0)
 *   all_to_all      Shard(0)     -> Shard(1)    (source: dt_rand)
 * and reports the median time, the algorithm bandwidth (bytes of the whole tensor / time) and the
 * bus bandwidth (NCCL's convention), next to a single-thread memcpy of the same bytes into a
 * pre-touched destination. Then it moves a 100-tensor weight set (about 105 MiB of 2-D tensors,
 * the shapes of a small transformer) from Shard(0) on mesh [0,1] to [Replicate, Shard(1)] on the
 * 2x2 mesh [[2,3],[4,5]] and to Shard(0) on [2,3] with one dt_redistribute_many call each.
 *
 * Worker processes exchange large regions through shared memory; DTORCH_SHM=0 in the environment
 * measures the ZeroMQ frames they fall back to. The targets line compares the 64 MiB, 2-device
 * figures with memcpy / 2. Timings are information only: the program fails only when DTorch fails
 * or a result is wrong.
 *
 * Usage: bench_collectives [thread|process|both [repeat_scale]]
 *   repeat_scale multiplies every repeat count (e.g. 0.2 for a quick look, 2 for steadier medians).
 * Process workers run DTORCH_WORKER_PATH, else the dtorch-worker next to this program's build
 * directory (../dtorch-worker relative to argv[0]).
 */
#include <limits.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "dtorch.h"

#define S_MAX_STEPS 8
#define S_NWEIGHTS 100

typedef enum { C_ALL_GATHER, C_ALL_REDUCE, C_REDUCE_SCATTER, C_ALL_TO_ALL, C_COUNT } s_coll;

static const char *const s_coll_name[C_COUNT] = {"all_gather", "all_reduce", "reduce_scatter", "all_to_all"};

/* The sizes: a square 2-D float32 tensor each, so that every collective (all_to_all included)
 * runs on the same shape. Repeats shrink as the size grows; warm-ups are not timed. */
typedef struct {
    const char *label;
    int64_t side;
    int repeats, warmups;
} s_size;

static const s_size s_sizes[] = {
    {"4 KiB", 32, 200, 20},
    {"1 MiB", 512, 50, 5},
    {"64 MiB", 4096, 8, 2},
};
#define S_NSIZES (int)(sizeof s_sizes / sizeof s_sizes[0])

static double s_scale = 1.0;

static int s_scaled(int n)
{
    int k = (int)lround(n * s_scale);
    return k < 3 ? 3 : k;
}




static void s_die(const char *what)
{
    fprintf(stderr, "bench_collectives: %s failed: %s\n", what, dt_last_error());
    exit(1);
}

static void s_sync(void)
{
    if (dt_synchronize() != 0)
        s_die("dt_synchronize");
}

static double s_gbps(double bytes, double ns) { return bytes / ns; } /* bytes per ns = GB/s */

/* ---- memcpy reference ---------------------------------------------------------------------- */

/* Median ns of one single-thread memcpy of `bytes`; the destination is written once before the
 * first timed copy, so no page faults are timed (fresh_dst: a new malloc per copy instead, first
 * touch included: the price a freshly allocated output pays). */
static double s_memcpy_ns(size_t bytes, int repeats, bool fresh_dst)
{
    char *src = malloc(bytes), *dst = fresh_dst ? NULL : malloc(bytes);
    double *ns = malloc(sizeof *ns * (size_t)repeats);
    if (!src || (!fresh_dst && !dst) || !ns) {
        fprintf(stderr, "bench_collectives: out of memory for the memcpy reference\n");
        exit(1);
    }
    memset(src, 0x3c, bytes);
    if (!fresh_dst) {
        memset(dst, 0, bytes);
        memcpy(dst, src, bytes); /* warm-up */
    }
    for (int i = 0; i < repeats; i++) {
        char *d = dst;
        double t0 = bench_now_ns();
        if (fresh_dst && !(d = malloc(bytes)))
            exit(1);
        memcpy(d, src, bytes);
        __asm__ volatile("" : : "r"(d) : "memory"); /* the copy must happen */
        ns[i] = bench_now_ns() - t0;
        if (fresh_dst)
            free(d);
    }
    double med = bench_median(ns, repeats);
    free(ns);
    free(src);
    free(dst);
    return med;
}

/* ---- plans --------------------------------------------------------------------------------- */

/* "kind(remote MiB)+kind(...)" of what dt_redistribute would run. */
static void s_plan_string(dt_tensor *x, dt_mesh *mesh, const dt_placement *pl, char *buf, size_t size)
{
    dt_plan_step steps[S_MAX_STEPS];
    int n = dt_redistribute_plan(x, mesh, pl, steps, S_MAX_STEPS);
    if (n < 0)
        s_die("dt_redistribute_plan");
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < size; i++) {
        double mib = (double)steps[i].remote_elements * (double)dt_dtype_size(dt_tensor_dtype(x)) / (1 << 20);
        at += (size_t)snprintf(buf + at, size - at, "%s%s[dim %d, %.3g MiB remote]", i ? " + " : "", steps[i].kind,
                               steps[i].mesh_dim, mib);
    }
    if (n == 0)
        snprintf(buf, size, "(nothing)");
}

/* ---- correctness check (outside every timed span) ----------------------------------------- */

static void s_expect_same_value(dt_tensor *a, dt_tensor *b, const char *what)
{
    dt_future *fa = dt_tensor_fetch(a), *fb = dt_tensor_fetch(b);
    if (!fa || !fb || dt_future_wait(fa, -1) != 0 || dt_future_wait(fb, -1) != 0)
        s_die("fetch for the check");
    size_t bytes = (size_t)dt_tensor_numel(a) * dt_dtype_size(dt_tensor_dtype(a));
    if (dt_tensor_numel(a) != dt_tensor_numel(b) || memcmp(dt_future_data(fa, 0), dt_future_data(fb, 0), bytes) != 0) {
        fprintf(stderr, "bench_collectives: %s gave a wrong value\n", what);
        exit(1);
    }
    dt_future_release(&fa);
    dt_future_release(&fb);
}

/* ---- collectives --------------------------------------------------------------------------- */

typedef struct {
    double median_ns, algbw, busbw;
    char plan[256];
} s_result;

static double s_bus_factor(s_coll c, int n)
{
    return c == C_ALL_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

/* Partial(sum) source: device d's piece is the whole shape, small integers so that any order of
 * summation gives the same floats (the check compares the controller's sum with the devices'). */
static dt_tensor *s_partial_source(dt_mesh *mesh, int n, int64_t side)
{
    int64_t numel = side * side;
    float *buf = malloc(sizeof *buf * (size_t)numel * (size_t)n);
    const void *pieces[8];
    int64_t local[16];
    if (!buf)
        exit(1);
    for (int d = 0; d < n; d++) {
        float *p = buf + (size_t)d * (size_t)numel;
        for (int64_t i = 0; i < numel; i++)
            p[i] = (float)((i + 3 * d) % 17);
        pieces[d] = p;
        local[2 * d] = side;
        local[2 * d + 1] = side;
    }
    dt_placement partial = dt_partial(DT_REDUCE_SUM);
    dt_tensor *x = dt_from_local(mesh, pieces, 2, local, DT_FLOAT32, &partial, (int64_t[]){side, side});
    free(buf);
    if (!x)
        s_die("dt_from_local");
    return x;
}

static s_result s_run_collective(dt_mesh *mesh, int n, s_coll c, const s_size *sz, double *samples)
{
    int64_t shape[2] = {sz->side, sz->side};
    dt_placement shard0 = dt_shard(0), src_pl, dst_pl;
    dt_tensor *x;
    switch (c) {
    case C_ALL_GATHER: src_pl = shard0, dst_pl = dt_replicate(); break;
    case C_ALL_REDUCE: src_pl = dt_partial(DT_REDUCE_SUM), dst_pl = dt_replicate(); break;
    case C_REDUCE_SCATTER: src_pl = dt_partial(DT_REDUCE_SUM), dst_pl = shard0; break;
    default: src_pl = shard0, dst_pl = dt_shard(1); break;
    }
    if (src_pl.kind == DT_PARTIAL)
        x = s_partial_source(mesh, n, sz->side);
    else if (!(x = dt_rand(mesh, 2, shape, DT_FLOAT32, &src_pl)))
        s_die("dt_rand");
    s_sync();

    s_result res = {0};
    s_plan_string(x, NULL, &dst_pl, res.plan, sizeof res.plan);
    int warm = s_scaled(sz->warmups), reps = s_scaled(sz->repeats);
    for (int i = 0; i < warm + reps; i++) {
        double t0 = bench_now_ns();
        dt_tensor *y = dt_redistribute(x, NULL, &dst_pl);
        if (!y)
            s_die("dt_redistribute");
        s_sync();
        double t1 = bench_now_ns();
        if (i >= warm)
            samples[i - warm] = t1 - t0;
        if (i == warm + reps - 1)
            s_expect_same_value(x, y, s_coll_name[c]);
        dt_tensor_release(&y);
        s_sync(); /* untimed: the FREE of y runs here, not inside the next timed span */
    }
    dt_tensor_release(&x);
    s_sync();
    double bytes = (double)(sz->side * sz->side) * 4.0;
    res.median_ns = bench_median(samples, reps);
    res.algbw = s_gbps(bytes, res.median_ns);
    res.busbw = res.algbw * s_bus_factor(c, n);
    return res;
}

/* ---- cross-mesh weight set ----------------------------------------------------------------- */

/* A small Llama-like model: dim 384, hidden 1024, 12 layers, vocabulary 8192. Each layer holds
 * wq, wk, wv, wo (384x384), w1, w3 (1024x384), w2 (384x1024) and its two norms, stored 2-D as
 * [2, 384]; plus the embedding, the output, the final norm ([2, 384]) and a rope table ([256, 32]):
 * 12 * 8 + 4 = 100 tensors, about 105 MiB of float32. */
static int s_weight_shapes(int64_t (*shapes)[2])
{
    int k = 0;
    for (int l = 0; l < 12; l++) {
        for (int q = 0; q < 4; q++)
            shapes[k][0] = 384, shapes[k++][1] = 384;
        shapes[k][0] = 1024, shapes[k++][1] = 384;
        shapes[k][0] = 1024, shapes[k++][1] = 384;
        shapes[k][0] = 384, shapes[k++][1] = 1024;
        shapes[k][0] = 2, shapes[k++][1] = 384; /* both norms, one [2, 384] tensor */
    }
    shapes[k][0] = 8192, shapes[k++][1] = 384; /* embedding */
    shapes[k][0] = 8192, shapes[k++][1] = 384; /* output */
    shapes[k][0] = 2, shapes[k++][1] = 384;    /* final norm */
    shapes[k][0] = 256, shapes[k++][1] = 32;   /* rope table */
    return k;
}

typedef struct {
    double median_ns, total_bytes, max_device_bytes, memcpy_total_ns, memcpy_device_ns;
    char plan[256];
} s_xresult;

static s_xresult s_run_cross_mesh(dt_tensor *const *xs, int n, dt_mesh *target, const dt_placement *pl,
                                  const char *what, double *samples)
{
    int mdim = dt_mesh_ndim(target);
    int64_t ndev = dt_mesh_size(target);
    dt_placement *all = malloc(sizeof *all * (size_t)n * (size_t)mdim);
    dt_tensor **out = malloc(sizeof *out * (size_t)n);
    if (!all || !out)
        exit(1);
    for (int i = 0; i < n; i++)
        memcpy(all + (size_t)i * (size_t)mdim, pl, sizeof *pl * (size_t)mdim);
    s_xresult res = {0};
    s_plan_string(xs[n - 4], target, pl, res.plan, sizeof res.plan); /* the embedding */

    int warm = 1, reps = s_scaled(5);
    for (int r = 0; r < warm + reps; r++) {
        double t0 = bench_now_ns();
        if (dt_redistribute_many(n, xs, target, all, out) != 0)
            s_die("dt_redistribute_many");
        s_sync();
        double t1 = bench_now_ns();
        if (r >= warm)
            samples[r - warm] = t1 - t0;
        if (r == 0) {
            /* what each destination device receives: its local blocks (the source devices are others) */
            double per_device[64] = {0};
            for (int i = 0; i < n; i++)
                for (int64_t d = 0; d < ndev && d < 64; d++) {
                    int64_t shape[DT_MAX_DIMS], offset[DT_MAX_DIMS];
                    if (dt_tensor_local_block(out[i], d, shape, offset) != 0)
                        s_die("dt_tensor_local_block");
                    per_device[d] += (double)(shape[0] * shape[1]) * 4.0;
                }
            for (int64_t d = 0; d < ndev && d < 64; d++) {
                res.total_bytes += per_device[d];
                if (per_device[d] > res.max_device_bytes)
                    res.max_device_bytes = per_device[d];
            }
            s_expect_same_value(xs[n - 4], out[n - 4], what); /* embedding */
            s_expect_same_value(xs[6], out[6], what);         /* a w2 */
        }
        for (int i = 0; i < n; i++)
            dt_tensor_release(&out[i]);
        s_sync();
    }
    res.median_ns = bench_median(samples, reps);
    res.memcpy_total_ns = s_memcpy_ns((size_t)res.total_bytes, s_scaled(5), false);
    res.memcpy_device_ns = s_memcpy_ns((size_t)res.max_device_bytes, s_scaled(5), false);
    free(all);
    free(out);
    return res;
}

static void s_cross_mesh(double *samples)
{
    int64_t shapes[S_NWEIGHTS][2];
    int n = s_weight_shapes(shapes);
    dt_mesh *src = dt_mesh_new("cpu", 1, (int64_t[]){2}, (int64_t[]){0, 1}, NULL);
    dt_mesh *grid = dt_mesh_new("cpu", 2, (int64_t[]){2, 2}, (int64_t[]){2, 3, 4, 5}, NULL);
    dt_mesh *pair = dt_mesh_new("cpu", 1, (int64_t[]){2}, (int64_t[]){2, 3}, NULL);
    if (!src || !grid || !pair)
        s_die("dt_mesh_new");
    dt_tensor *xs[S_NWEIGHTS];
    dt_placement shard0 = dt_shard(0);
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        if (!(xs[i] = dt_rand(src, 2, shapes[i], DT_FLOAT32, &shard0)))
            s_die("dt_rand");
        bytes += (double)(shapes[i][0] * shapes[i][1]) * 4.0;
    }
    s_sync();
    printf("\ncross-mesh: %d float32 tensors, %.1f MiB, Shard(0) on mesh [0,1]; one dt_redistribute_many + "
           "dt_synchronize\n",
           n, bytes / (1 << 20));
    printf("  reference: single-thread memcpy (pre-touched destination) of the bytes the destination devices "
           "receive, all of them / one device's\n");
    printf("  %-40s %9s %9s %9s %10s %9s %10s %9s\n", "target", "recv MiB", "median ms", "GB/s", "memcpy ms",
           "DT/mcpy", "1-dev ms", "DT/1-dev");
    struct {
        const char *name;
        dt_mesh *mesh;
        dt_placement pl[2];
    } targets[2] = {{"[Replicate, Shard(1)] on [[2,3],[4,5]]", grid, {dt_replicate(), dt_shard(1)}},
                    {"Shard(0) on [2,3]", pair, {dt_shard(0)}}};
    for (int t = 0; t < 2; t++) {
        s_xresult r = s_run_cross_mesh(xs, n, targets[t].mesh, targets[t].pl, targets[t].name, samples);
        printf("  %-40s %9.1f %9.2f %9.2f %10.2f %8.2fx %10.2f %8.2fx\n", targets[t].name, r.total_bytes / (1 << 20),
               r.median_ns / 1e6, s_gbps(r.total_bytes, r.median_ns), r.memcpy_total_ns / 1e6,
               r.median_ns / r.memcpy_total_ns, r.memcpy_device_ns / 1e6, r.median_ns / r.memcpy_device_ns);
        printf("    plan of the embedding: %s\n", r.plan);
    }
    for (int i = 0; i < n; i++)
        dt_tensor_release(&xs[i]);
    dt_mesh_release(&src);
    dt_mesh_release(&grid);
    dt_mesh_release(&pair);
    s_sync();
}

/* ---- one worker mode ----------------------------------------------------------------------- */

static void s_run_mode(dt_workers mode, const char *worker_path)
{
    const char *mname = mode == DT_WORKERS_THREAD ? "thread" : "process";
    if (dt_init(&(dt_config){mode, worker_path}) != 0)
        s_die("dt_init");
    int maxreps = 0;
    for (int s = 0; s < S_NSIZES; s++)
        if (s_scaled(s_sizes[s].repeats) > maxreps)
            maxreps = s_scaled(s_sizes[s].repeats);
    double *samples = malloc(sizeof *samples * (size_t)(maxreps + 64));
    if (!samples)
        exit(1);

    printf("\n==== %s workers ====\n", mname);
    printf("  time: median of K x (dt_redistribute + dt_synchronize); algbw = tensor bytes / time; busbw = algbw "
           "x (n-1)/n\n  (all_reduce: x 2(n-1)/n); memcpy: single thread, same bytes, pre-touched destination; "
           "DT/mcpy = algbw / memcpy GB/s\n");
    double big_ratio[C_COUNT] = {0}; /* 64 MiB over 2 devices: algbw / memcpy, for the targets */
    for (int s = 0; s < S_NSIZES; s++) {
        const s_size *sz = &s_sizes[s];
        size_t bytes = (size_t)(sz->side * sz->side) * 4;
        double mcpy_ns = s_memcpy_ns(bytes, s_scaled(sz->repeats), false);
        double mcpy = s_gbps((double)bytes, mcpy_ns);
        printf("\n  %s (%lld x %lld float32): memcpy %.4g ms = %.2f GB/s", sz->label, (long long)sz->side,
               (long long)sz->side, mcpy_ns / 1e6, mcpy);
        if (s == S_NSIZES - 1) {
            double fresh = s_memcpy_ns(bytes, s_scaled(5), true);
            printf("; into a fresh malloc (first touch timed) %.3f ms = %.2f GB/s", fresh / 1e6,
                   s_gbps((double)bytes, fresh));
        }
        printf("\n  %-15s %2s %4s %10s %10s %10s %8s  %s\n", "collective", "n", "K", "median ms", "algbw GB/s",
               "busbw GB/s", "DT/mcpy", "plan");
        for (int n = 2; n <= 4; n += 2) {
            int64_t ids[4] = {0, 1, 2, 3};
            dt_mesh *mesh = dt_mesh_new("cpu", 1, (int64_t[]){n}, ids, NULL);
            if (!mesh)
                s_die("dt_mesh_new");
            for (int c = 0; c < C_COUNT; c++) {
                s_result r = s_run_collective(mesh, n, (s_coll)c, sz, samples);
                printf("  %-15s %2d %4d %10.3f %10.2f %10.2f %7.3fx  %s\n", s_coll_name[c], n, s_scaled(sz->repeats),
                       r.median_ns / 1e6, r.algbw, r.busbw, r.algbw / mcpy, r.plan);
                fflush(stdout);
                if (n == 2 && s == S_NSIZES - 1)
                    big_ratio[c] = r.algbw / mcpy;
            }
            dt_mesh_release(&mesh);
        }
    }
    /* thread workers: all_gather; worker processes (through shared memory): all but all_reduce */
    printf("\n  targets (%s mode, 64 MiB over 2 devices, algbw >= memcpy / 2; information only):", mname);
    for (int c = 0; c < C_COUNT; c++)
        if (c == C_ALL_GATHER || (mode == DT_WORKERS_PROCESS && c != C_ALL_REDUCE))
            printf(" %s %s (%.2fx)", s_coll_name[c], big_ratio[c] >= 0.5 ? "PASS" : "MISS", big_ratio[c]);
    printf("\n");
    fflush(stdout);

    s_cross_mesh(samples);
    fflush(stdout);
    free(samples);
    if (dt_shutdown() != 0)
        s_die("dt_shutdown");
}


int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "both";
    bool thread = !strcmp(which, "thread") || !strcmp(which, "both");
    bool process = !strcmp(which, "process") || !strcmp(which, "both");
    s_scale = argc > 2 ? atof(argv[2]) : 1.0;
    if ((!thread && !process) || !(s_scale > 0) || argc > 3) {
        fprintf(stderr, "usage: %s [thread|process|both [repeat_scale>0]]\n", argv[0]);
        return 2;
    }
    char wbuf[PATH_MAX + 32];
    const char *worker_path = bench_worker_path(argv[0], wbuf, sizeof wbuf);
    if (process && !worker_path) {
        fprintf(stderr, "bench_collectives: no dtorch-worker found: set DTORCH_WORKER_PATH\n");
        return 1;
    }
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("DTorch collectives benchmark: %ld CPUs online; OPENBLAS_CORETYPE=%s%s\n", sysconf(_SC_NPROCESSORS_ONLN),
           coretype ? coretype : "(unset)", coretype ? " (set in the environment; these ops do not use BLAS)" : "");
    const char *shm = getenv("DTORCH_SHM");
    printf("  float32; 1-D meshes of 2 and 4 devices; repeats x %.2g; worker: %s; DTORCH_SHM=%s\n", s_scale,
           worker_path ? worker_path : "(none)", shm ? shm : "(unset: worker processes share memory)");
    fflush(stdout);
    if (thread)
        s_run_mode(DT_WORKERS_THREAD, worker_path);
    if (process)
        s_run_mode(DT_WORKERS_PROCESS, worker_path);
    return 0;
}
