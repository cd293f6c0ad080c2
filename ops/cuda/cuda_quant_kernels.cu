/* cuda_quant_kernels — the products with quantized weights on the GPU (cuda_quant.h): a thread per
 * output element widening its weight row's bytes as it adds the K products, in the CPU kernels'
 * order of scaling (ops/cpu/cpu_quant.c: the row's sum times its scale; per group for int4). */
#include "cuda_quant.h"

#define S_THREADS 256
#define S_GROUP 32

__global__ void s_linear_quant(float *out, const float *x, const uint8_t *q, const float *scale, const float *bias,
                               cuda_quant_args g)
{
    int64_t n_out = g.M * g.N;
    for (int64_t t = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; t < n_out; t += (int64_t)gridDim.x * S_THREADS) {
        int64_t m = t / g.N, n = t % g.N;
        const float *xm = x + m * g.lda;
        const uint8_t *row = q + n * g.row_bytes;
        const float *sc = scale + n * g.groups;
        float total = 0.0f;
        if (g.bits == 8) {
            for (int64_t k = 0; k < g.K; k++)
                total += xm[k] * (float)(int8_t)row[k];
            total *= sc[0];
        } else {
            for (int64_t k0 = 0; k0 < g.K; k0 += S_GROUP) {
                float part = 0.0f;
                int64_t end = k0 + S_GROUP < g.K ? k0 + S_GROUP : g.K;
                for (int64_t k = k0; k < end; k++) {
                    int v = (row[k >> 1] >> ((k & 1) * 4)) & 0xf;
                    part += xm[k] * (float)((v ^ 8) - 8);
                }
                total += part * sc[k0 / S_GROUP];
            }
        }
        out[t] = total + (bias ? bias[n] : 0.0f);
    }
}

extern "C" cudaError_t cuda_linear_quant(float *out, const float *x, const uint8_t *q, const float *scale,
                                         const float *bias, const cuda_quant_args *args, cudaStream_t s)
{
    int64_t n = args->M * args->N;
    if (n <= 0)
        return cudaSuccess;
    int64_t blocks = (n + S_THREADS - 1) / S_THREADS;
    s_linear_quant<<<(unsigned)(blocks > 65536 ? 65536 : blocks), S_THREADS, 0, s>>>(out, x, q, scale, bias, *args);
    return cudaGetLastError();
}
