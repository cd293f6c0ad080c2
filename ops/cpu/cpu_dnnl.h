/* cpu_dnnl — conv2d and cpu_gemm's products through oneDNN (Debian's libdnnl, optional at build
 * time: DTORCH_HAVE_DNNL). cpu_k_conv2d (cpu_image.c) asks it first and falls back to im2col and
 * sgemm when it declines; cpu_gemm.c calls the rest.
 * Each device thread keeps its own primitives (a small LRU by the convolution's sizes), runs
 * them on one stream of its own with as many threads as OpenBLAS has (cpu_blas_threads), and
 * counts the calls it served. */
#ifndef CPU_DNNL_H
#define CPU_DNNL_H

#include <stdbool.h>
#include <stdint.h>

#include "op_registry.h"

#if DTORCH_HAVE_DNNL
/* out (N, O, OH, OW) = the convolution of x (N, C, H, W) with w (O, C / groups, kH, kW) plus bias
 * (O,) or NULL (d->N unread: N images), float32, C-contiguous; pad_bottom and pad_right are the
 * conv's (op_conv2d_layout's d has the top and left ones). true when it ran; false when oneDNN
 * declined (a case it is not given, or it could not build or run the primitive): out is then
 * unwritten or to be overwritten, and the caller computes it another way. */
bool cpu_dnnl_conv2d(const op_conv2d_dims *d, int64_t N, int64_t pad_bottom, int64_t pad_right, const float *x,
                     const float *w, const float *bias, float *out);
/* How many cpu_dnnl_conv2d calls of this thread ran through oneDNN. */
int64_t cpu_dnnl_convs(void);
/* cpu_sgemm's product (cpu_gemm.h) by dnnl_sgemm; false when it failed (nothing written). */
bool cpu_dnnl_sgemm(bool b_trans, int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* cpu_gemm_bf16's product (cpu_gemm.h) by oneDNN's matmul primitive; false where oneDNN has no
 * kernel of its own for it or failed (nothing written). */
bool cpu_dnnl_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *a, const uint16_t *b, bool b_trans,
                          const void *bias, bool bias_bf16, void *c, bool c_bf16);
/* How many cpu_dnnl_matmul_bf16 calls of this thread ran. */
int64_t cpu_dnnl_matmuls(void);
#else
static inline bool cpu_dnnl_conv2d(const op_conv2d_dims *d, int64_t N, int64_t pad_bottom, int64_t pad_right,
                                   const float *x, const float *w, const float *bias, float *out)
{
    return false;
}
static inline int64_t cpu_dnnl_convs(void) { return 0; }
static inline bool cpu_dnnl_sgemm(bool b_trans, int64_t M, int64_t N, int64_t K, float alpha, const float *a,
                                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    return false;
}
static inline bool cpu_dnnl_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *a, const uint16_t *b,
                                        bool b_trans, const void *bias, bool bias_bf16, void *c, bool c_bf16)
{
    return false;
}
static inline int64_t cpu_dnnl_matmuls(void) { return 0; }
#endif

#endif
