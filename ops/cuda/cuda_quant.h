/* cuda_quant — the device kernel of the products with quantized weights (cuda_quant_kernels.cu),
 * called by cuda_quant.c: out (M, N) = x (M rows of stride lda, K features) @ dequantized(q)^T
 * (+ bias), q (N rows of row_bytes) holding int8 (bits 8, one scale a row) or two 4-bit values a
 * byte (bits 4, one scale per 32 features: groups a row), all float32 but q. */
#ifndef CUDA_QUANT_H
#define CUDA_QUANT_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int bits;
    int64_t M, N, K, lda, row_bytes, groups;
} cuda_quant_args;

cudaError_t cuda_linear_quant(float *out, const float *x, const uint8_t *q, const float *scale, const float *bias,
                              const cuda_quant_args *args, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
