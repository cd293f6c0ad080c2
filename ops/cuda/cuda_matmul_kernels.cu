/* cuda_matmul_kernels — integer products on the GPU (cuda_kernels.h; floating ones are cuBLAS's,
 * cuda_matmul.c): a thread per output element adding its K products in uint64, which wraps as the
 * CPU's int64 loops do (ops/cpu/cpu_matmul.c), so the result has the CPU's bits. */
#include "cuda_dtype.h"
#include "cuda_kernels.h"

#define S_THREADS 256

__global__ void s_mm_int(void *c, const void *a, const void *b, dt_dtype dt, cuda_mm_int_args g)
{
    int64_t mn = g.M * g.N, n = mn;
    for (int j = 0; j < g.nbatch; j++)
        n *= g.batch[j];
    for (int64_t t = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; t < n; t += (int64_t)gridDim.x * S_THREADS) {
        int64_t col = t % g.N, row = (t / g.N) % g.M, q = t / mn, ao = 0, bo = 0;
        for (int j = g.nbatch - 1; j >= 0; j--) {
            int64_t i = q % g.batch[j];
            q /= g.batch[j];
            ao += i * g.a_stride[j];
            bo += i * g.b_stride[j];
        }
        uint64_t acc = g.accumulate ? (uint64_t)cuda_load_i64(c, dt, t) : 0;
        for (int64_t k = 0; k < g.K; k++) {
            int64_t bi = g.b_trans ? bo + col * g.K + k : bo + k * g.N + col;
            acc += (uint64_t)cuda_load_i64(a, dt, ao + row * g.K + k) * (uint64_t)cuda_load_i64(b, dt, bi);
        }
        cuda_store_i64(c, dt, t, (int64_t)acc);
    }
}

extern "C" cudaError_t cuda_mm_int(void *c, const void *a, const void *b, dt_dtype dtype, const cuda_mm_int_args *args,
                                   cudaStream_t s)
{
    int64_t n = args->M * args->N;
    for (int j = 0; j < args->nbatch; j++)
        n *= args->batch[j];
    if (n <= 0)
        return cudaSuccess;
    int64_t blocks = (n + S_THREADS - 1) / S_THREADS;
    s_mm_int<<<(unsigned)(blocks > 65536 ? 65536 : blocks), S_THREADS, 0, s>>>(c, a, b, dtype, *args);
    return cudaGetLastError();
}
