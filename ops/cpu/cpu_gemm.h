/* cpu_gemm — the one BLAS-like interface of the CPU kernels: every dense float32 product of the
 * CPU ops (linear and matmul past decode's few rows, attention's blocks, im2col convolution,
 * int8's dequantized blocks) and the bfloat16 products of prompts go through here.
 *
 * Two libraries serve it, chosen once per process (cpu_gemm_library):
 *   - OpenBLAS's sgemm, where its kernel was built for this CPU's vector units;
 *   - oneDNN's (cpu_dnnl.c), which generates its kernels for the instructions the CPU reports.
 *     Taken on CPUs with AVX-512, where bench_matmul measured its sgemm at 0.95-1.3x OpenBLAS's
 *     SkylakeX kernel, and wherever OpenBLAS does not know the CPU: Debian's OpenBLAS 0.3.21 runs
 *     its Prescott (SSE3) kernel on Xeons newer than it, 5x slower (32 against 155 GFLOP/s).
 *   DTORCH_GEMM=openblas or onednn overrides the choice (a build without oneDNN has OpenBLAS only).
 * Threads: as many as cpu_blas_threads() (one unless DTORCH_BLAS_THREADS says more), per device. */
#ifndef CPU_GEMM_H
#define CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

/* The thread setting (DTORCH_BLAS_THREADS), applied to OpenBLAS once (thread-safe) and to oneDNN
 * per device thread; returns the thread count. */
int cpu_blas_threads(void);

/* The library of cpu_sgemm in this process: "OpenBLAS (<its kernel>)" or "oneDNN". */
const char *cpu_gemm_library(void);

/* C (M, N; row stride ldc) = alpha * A (M, K; ldc lda) @ op(B) + beta * C, row-major float32, B
 * stored (K, N) or, when b_trans, (N, K) (ldb its row stride). Sizes below 2^31. */
void cpu_sgemm(bool b_trans, int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
               const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* Whether cpu_gemm_bf16 runs here: a build with oneDNN, a CPU with bfloat16 units (AMX or
 * AVX512_BF16) and oneDNN chosen (DTORCH_GEMM). */
bool cpu_gemm_bf16_ready(void);

/* C (M, N) = A (M, K) @ op(B) + bias, A and B bfloat16 (raw bits), B stored (N, K) when b_trans (a
 * linear layer's weight, keys) else (K, N) (values), C float32 or bfloat16 (c_bf16), C-contiguous,
 * and bias (N,) float32, bfloat16 (bias_bf16) or NULL; products exact, sums in float32, C rounded
 * once. Runs on the CPU's bfloat16 units through oneDNN; false when they are not there
 * (cpu_gemm_bf16_ready) or the product failed (nothing written: the caller widens and calls
 * cpu_sgemm). */
bool cpu_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *a, const uint16_t *b, bool b_trans,
                   const void *bias, bool bias_bf16, void *c, bool c_bf16);

#endif
