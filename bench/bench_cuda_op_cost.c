/* bench_cuda_op_cost — what one small op costs a GPU actor, beside the CUDA calls such an op makes,
 * in one run (built with the CUDA backend only; tools/gpu-check.sh runs it).
 *
 * Per op, in µs, the median of the repeats of N ops each, the wall time to the end of the GPU's
 * work (a closing synchronize):
 *   (a) raw launch: DTorch's fill kernel (cuda_fill) of one float32 launched N times on one stream,
 *       then cudaStreamSynchronize: the floor of any op that launches a kernel;
 *   (b) raw op: cudaMallocAsync of 4 bytes, that launch, cudaFreeAsync: what an op that makes and
 *       frees its output asks of CUDA;
 *   (c) DTorch: dt_full of one float32 on a cuda mesh of 1 actor, released at once, N times,
 *       then dt_synchronize, with thread workers and then process workers: records, messages,
 *       the worker's dispatch and the completions on top of (b);
 *   (d) the same on a cpu mesh of 1 device: the runtime without CUDA.
 *
 * Usage: bench_cuda_op_cost [repeats [n]]
 * Exits 2, saying why, where no GPU can be used.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "cuda_kernels.h"
#include "dtorch.h"

static void s_cuda(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_cuda_op_cost: %s failed: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* (a) and (b): ns per op of n launches, each with its own output allocated and freed if alloc */
static double s_raw(cudaStream_t s, void *dst, int n, int alloc)
{
    double t0 = bench_now_ns();
    for (int i = 0; i < n; i++) {
        void *p = dst;
        if (alloc)
            s_cuda(cudaMallocAsync(&p, 4, s), "cudaMallocAsync");
        s_cuda(cuda_fill(p, 4, 1, 0x3f800000u, s), "cuda_fill");
        if (alloc)
            s_cuda(cudaFreeAsync(p, s), "cudaFreeAsync");
    }
    s_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return (bench_now_ns() - t0) / n;
}

/* (c) and (d): ns per op of n pipelined one-element dt_full on mesh */
static double s_dtorch(dt_mesh *mesh, int n)
{
    double t0 = bench_now_ns();
    for (int i = 0; i < n; i++) {
        dt_tensor *x = dt_full(mesh, 1, (int64_t[]){1}, DT_FLOAT32, NULL, (dt_scalar){.is_int = false, .f = 1.0});
        if (!x) {
            fprintf(stderr, "bench_cuda_op_cost: dt_full failed: %s\n", dt_last_error());
            exit(1);
        }
        dt_tensor_release(&x);
    }
    if (dt_synchronize() != 0) {
        fprintf(stderr, "bench_cuda_op_cost: dt_synchronize failed: %s\n", dt_last_error());
        exit(1);
    }
    return (bench_now_ns() - t0) / n;
}

static double s_median_raw(cudaStream_t s, void *dst, int n, int alloc, int repeats)
{
    double v[64];
    s_raw(s, dst, n / 10 + 1, alloc); /* warm-up: the pool's first blocks */
    for (int r = 0; r < repeats; r++)
        v[r] = s_raw(s, dst, n, alloc);
    return bench_median(v, repeats) / 1e3;
}

static double s_median_dtorch(const char *type, dt_workers workers, const char *worker_path, int n, int repeats)
{
    double v[64];
    if (dt_init(&(dt_config){workers, worker_path}) != 0) {
        fprintf(stderr, "bench_cuda_op_cost: dt_init failed: %s\n", dt_last_error());
        exit(1);
    }
    dt_mesh *mesh = dt_mesh_new(type, 1, (int64_t[]){1}, (int64_t[]){0}, NULL);
    if (!mesh) {
        fprintf(stderr, "bench_cuda_op_cost: dt_mesh_new failed: %s\n", dt_last_error());
        exit(1);
    }
    s_dtorch(mesh, n / 10 + 1);
    for (int r = 0; r < repeats; r++)
        v[r] = s_dtorch(mesh, n);
    dt_mesh_release(&mesh);
    dt_shutdown();
    return bench_median(v, repeats) / 1e3;
}

int main(int argc, char **argv)
{
    int repeats = argc > 1 ? atoi(argv[1]) : 5;
    int n = argc > 2 ? atoi(argv[2]) : 20000;
    if (repeats < 1 || repeats > 64 || n < 1) {
        fprintf(stderr, "usage: %s [repeats (1..64) [n>=1]]\n", argv[0]);
        return 2;
    }
    int ngpus = 0;
    cudaError_t e = cudaGetDeviceCount(&ngpus);
    if (e != cudaSuccess || ngpus == 0) {
        printf("bench_cuda_op_cost: no GPU can be used here: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return 2;
    }
    char buf[PATH_MAX];
    const char *worker = bench_worker_path(argv[0], buf, sizeof buf);
    struct cudaDeviceProp prop;
    s_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    s_cuda(cudaSetDevice(0), "cudaSetDevice");
    cudaStream_t s;
    void *dst;
    s_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    s_cuda(cudaMalloc(&dst, 4), "cudaMalloc");
    double launch = s_median_raw(s, dst, n, 0, repeats), raw_op = s_median_raw(s, dst, n, 1, repeats);
    s_cuda(cudaFree(dst), "cudaFree");
    s_cuda(cudaStreamDestroy(s), "cudaStreamDestroy");

    printf("one small op on %s: us per op, %d ops per run, median of %d runs\n", prop.name, n, repeats);
    printf("  %-52s %8.2f\n", "(a) raw: a 1-element fill kernel launched", launch);
    printf("  %-52s %8.2f\n", "(b) raw: cudaMallocAsync + that launch + cudaFreeAsync", raw_op);
    static const struct {
        const char *type, *name;
        dt_workers workers;
    } runs[] = {{"cuda", "(c) DTorch dt_full, cuda mesh of 1, thread workers", DT_WORKERS_THREAD},
                {"cuda", "(c) DTorch dt_full, cuda mesh of 1, process workers", DT_WORKERS_PROCESS},
                {"cpu", "(d) DTorch dt_full, cpu mesh of 1, thread workers", DT_WORKERS_THREAD},
                {"cpu", "(d) DTorch dt_full, cpu mesh of 1, process workers", DT_WORKERS_PROCESS}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        double us = s_median_dtorch(runs[i].type, runs[i].workers, worker, n, repeats);
        printf("  %-52s %8.2f   (%.1fx (b))\n", runs[i].name, us, us / raw_op);
        fflush(stdout);
    }
    return 0;
}
