/* bench_cuda_matmul — what DTorch's matmul on a GPU delivers next to cuBLAS called directly, in
 * one run (built with the CUDA backend only; tools/gpu-check.sh runs it).
 *
 * For square products of 1024, 2048, 4096 and 8192 (or the sizes given) in float32 (computed in
 * float32, no TF32, as DTorch's kernel does), bfloat16 and float16 (tensor cores, float32
 * accumulation), on a 1-actor cuda mesh with thread workers, it reports TFLOP/s (2 n^3 flops per
 * product) of:
 *   (a) cuBLAS: cublasGemmEx with DTorch's compute type (CUBLAS_COMPUTE_32F) and math mode (no
 *       TF32, no reduction in a 16-bit type) on the same values in buffers of its own, S_PIPELINE
 *       products timed with CUDA events on one stream;
 *   (b) DTorch: S_PIPELINE dt_op("matmul") submitted back to back, then dt_synchronize, timed on
 *       the host: everything a user waits for (records, messages, kernels, completions).
 * Each figure is the median of the repeats. The last DTorch product is fetched and compared with
 * the direct one (relative RMS error; the same cuBLAS call on the same bytes: about 0).
 *
 * Usage: bench_cuda_matmul [repeats [n ...]]
 * Exits 2, saying why, where no GPU can be used.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dtorch.h"

#define S_MAX_SIZES 16
#define S_PIPELINE 8 /* products per timed run */

static void s_die(const char *what, const char *why)
{
    fprintf(stderr, "bench_cuda_matmul: %s failed: %s\n", what, why);
    exit(1);
}

static void s_cuda(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        s_die(what, cudaGetErrorString(e));
}

static void s_blas(cublasStatus_t st, const char *what)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        s_die(what, cublasGetStatusString(st));
}

typedef struct {
    const char *name;
    dt_dtype dtype;
    cudaDataType_t cuda;
} s_type;

static const s_type s_types[] = {
    {"float32", DT_FLOAT32, CUDA_R_32F},
    {"bfloat16", DT_BFLOAT16, CUDA_R_16BF},
    {"float16", DT_FLOAT16, CUDA_R_16F},
};

/* The whole value of t as it is on the devices (elem bytes each), copied out; caller frees. */
static void *s_fetch(dt_tensor *t, size_t bytes)
{
    dt_future *f = dt_tensor_fetch(t);
    if (!f || dt_future_wait(f, -1) != 0)
        s_die("fetch", dt_last_error());
    void *out = malloc(bytes);
    if (!out)
        s_die("malloc", "out of memory");
    memcpy(out, dt_future_data(f, 0), bytes);
    dt_future_release(&f);
    return out;
}

static dt_tensor *s_matmul(dt_tensor *a, dt_tensor *b)
{
    dt_tensor *in[2] = {a, b}, *out = NULL;
    if (dt_op("matmul", 2, in, NULL, 1, &out) != 1)
        s_die("dt_op(matmul)", dt_last_error());
    return out;
}

/* A float32 value of the element at i of a buffer of type t. */
static double s_value(const void *p, dt_dtype t, int64_t i)
{
    if (t == DT_FLOAT32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    float f;
    uint32_t bits;
    if (t == DT_BFLOAT16) {
        bits = (uint32_t)h << 16;
    } else { /* float16, normal and subnormal; the products here hold no inf or NaN */
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
        if (exp == 0)
            return (sign ? -1.0 : 1.0) * ldexp((double)man, -24);
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

typedef struct {
    double blas, dt; /* TFLOP/s */
    double rel_err;
} s_result;

static s_result s_run(dt_mesh *mesh, cublasHandle_t handle, cudaStream_t stream, const s_type *ty, int64_t n,
                      int repeats)
{
    int64_t shape[2] = {n, n}, numel = n * n;
    size_t elem = dt_dtype_size(ty->dtype), bytes = (size_t)numel * elem;
    double flops = 2.0 * (double)n * (double)n * (double)n;
    dt_tensor *a32 = dt_randn(mesh, 2, shape, DT_FLOAT32, NULL), *b32 = dt_randn(mesh, 2, shape, DT_FLOAT32, NULL);
    if (!a32 || !b32)
        s_die("dt_randn", dt_last_error());
    dt_tensor *a = a32, *b = b32;
    if (ty->dtype != DT_FLOAT32) {
        dt_op_attrs to = {.nints = 1, .ints = {ty->dtype}};
        if (dt_op("to", 1, &a32, &to, 1, &a) != 1 || dt_op("to", 1, &b32, &to, 1, &b) != 1)
            s_die("dt_op(to)", dt_last_error());
    }
    void *ha = s_fetch(a, bytes), *hb = s_fetch(b, bytes), *da, *db, *dc;
    s_cuda(cudaMalloc(&da, bytes), "cudaMalloc");
    s_cuda(cudaMalloc(&db, bytes), "cudaMalloc");
    s_cuda(cudaMalloc(&dc, bytes), "cudaMalloc");
    s_cuda(cudaMemcpy(da, ha, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    s_cuda(cudaMemcpy(db, hb, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    double *t = malloc((size_t)repeats * sizeof *t);
    if (!t)
        s_die("malloc", "out of memory");
    s_result r = {0};

    /* (a) cuBLAS: row-major C = A B is column-major C^T = B^T A^T, so B goes first */
    float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    s_cuda(cudaEventCreate(&e0), "cudaEventCreate");
    s_cuda(cudaEventCreate(&e1), "cudaEventCreate");
    for (int i = -1; i < repeats; i++) {
        s_cuda(cudaEventRecord(e0, stream), "cudaEventRecord");
        for (int j = 0; j < S_PIPELINE; j++)
            s_blas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, db, ty->cuda, (int)n, da,
                                ty->cuda, (int)n, &zero, dc, ty->cuda, (int)n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
        s_cuda(cudaEventRecord(e1, stream), "cudaEventRecord");
        s_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
        float ms;
        s_cuda(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
        if (i >= 0)
            t[i] = ms * 1e-3 / S_PIPELINE;
    }
    r.blas = flops / bench_median(t, repeats) * 1e-12;
    void *want = malloc(bytes);
    if (!want)
        s_die("malloc", "out of memory");
    s_cuda(cudaMemcpy(want, dc, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");

    /* (b) DTorch, pipelined; one untimed run first */
    dt_tensor *c = NULL;
    for (int i = -1; i < repeats; i++) {
        double t0 = bench_now_ns() * 1e-9;
        for (int j = 0; j < S_PIPELINE; j++) {
            dt_tensor_release(&c);
            c = s_matmul(a, b);
        }
        if (dt_synchronize() != 0)
            s_die("dt_synchronize", dt_last_error());
        if (i >= 0)
            t[i] = (bench_now_ns() * 1e-9 - t0) / S_PIPELINE;
    }
    r.dt = flops / bench_median(t, repeats) * 1e-12;

    void *got = s_fetch(c, bytes);
    double num = 0, den = 0;
    for (int64_t i = 0; i < numel; i++) {
        double w = s_value(want, ty->dtype, i), d = s_value(got, ty->dtype, i) - w;
        num += d * d;
        den += w * w;
    }
    r.rel_err = sqrt(num / (den > 0 ? den : 1));

    free(got);
    free(want);
    free(t);
    free(ha);
    free(hb);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    dt_tensor_release(&c);
    if (a != a32)
        dt_tensor_release(&a);
    if (b != b32)
        dt_tensor_release(&b);
    dt_tensor_release(&a32);
    dt_tensor_release(&b32);
    return r;
}

int main(int argc, char **argv)
{
    int repeats = argc > 1 ? atoi(argv[1]) : 5;
    int64_t sizes[S_MAX_SIZES] = {1024, 2048, 4096, 8192};
    int nsizes = 4;
    if (argc > 2)
        for (nsizes = 0; nsizes < S_MAX_SIZES && nsizes + 2 < argc; nsizes++)
            sizes[nsizes] = atoll(argv[nsizes + 2]);
    if (repeats < 1 || nsizes < 1) {
        fprintf(stderr, "usage: %s [repeats>=1 [n ...]]\n", argv[0]);
        return 2;
    }
    int ngpus = 0;
    cudaError_t e = cudaGetDeviceCount(&ngpus);
    if (e != cudaSuccess || ngpus == 0) {
        printf("bench_cuda_matmul: no GPU can be used here: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return 2;
    }
    struct cudaDeviceProp prop;
    s_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    s_cuda(cudaSetDevice(0), "cudaSetDevice");
    cudaStream_t stream;
    cublasHandle_t handle;
    s_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    s_blas(cublasCreate(&handle), "cublasCreate");
    s_blas(cublasSetStream(handle, stream), "cublasSetStream");
    s_blas(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION),
           "cublasSetMathMode"); /* DTorch's: a 16-bit product is summed in float32 throughout */

    if (dt_init(&(dt_config){DT_WORKERS_THREAD, NULL}) != 0)
        s_die("dt_init", dt_last_error());
    dt_mesh *mesh = dt_mesh_new("cuda", 1, (int64_t[]){1}, (int64_t[]){0}, NULL);
    if (!mesh)
        s_die("dt_mesh_new", dt_last_error());
    printf("GEMM on %s (%d GPUs); %d products per timed run, median of %d runs\n", prop.name, ngpus, S_PIPELINE,
           repeats);
    printf("  %-9s %6s %14s %14s %9s %10s\n", "dtype", "n", "cuBLAS TFLOP/s", "DTorch TFLOP/s", "DT/cuBLAS", "rel err");
    for (size_t k = 0; k < sizeof s_types / sizeof s_types[0]; k++)
        for (int i = 0; i < nsizes; i++) {
            s_result r = s_run(mesh, handle, stream, &s_types[k], sizes[i], repeats);
            printf("  %-9s %6lld %14.1f %14.1f %8.2fx %10.1e\n", s_types[k].name, (long long)sizes[i], r.blas, r.dt,
                   r.dt / r.blas, r.rel_err);
            fflush(stdout);
        }
    dt_mesh_release(&mesh);
    dt_shutdown();
    cublasDestroy(handle);
    cudaStreamDestroy(stream);
    return 0;
}
