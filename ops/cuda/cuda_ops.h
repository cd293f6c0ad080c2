/* cuda_ops — which ops have a CUDA kernel (CUDA_OPS: every other op fails with "<op>: no CUDA
 * kernel yet"), and what the kernels share: the calling actor's device context and scratch memory
 * on its compute stream. */
#ifndef CUDA_OPS_H
#define CUDA_OPS_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "op_registry.h"

/* Every op with a CUDA kernel: its name (ops/op_table.h) and its kernel. */
#define CUDA_OPS(X)                                                                                                    \
    /* elementwise (cuda_pointwise.c; kernels in cuda_pointwise_kernels.cu) */                                        \
    X(neg, cuda_k_unary) X(abs, cuda_k_unary) X(exp, cuda_k_unary) X(log, cuda_k_unary) X(sqrt, cuda_k_unary)          \
    X(rsqrt, cuda_k_unary) X(sin, cuda_k_unary) X(cos, cuda_k_unary) X(tanh, cuda_k_unary) X(sigmoid, cuda_k_unary)    \
    X(relu, cuda_k_unary) X(silu, cuda_k_unary) X(gelu, cuda_k_unary) X(gelu_tanh, cuda_k_unary)                       \
    X(reciprocal, cuda_k_unary) X(logical_not, cuda_k_unary) X(erf, cuda_k_unary) X(softplus, cuda_k_unary)            \
    X(add, cuda_k_arith) X(sub, cuda_k_arith) X(mul, cuda_k_arith) X(div, cuda_k_arith) X(pow, cuda_k_arith)           \
    X(maximum, cuda_k_arith) X(minimum, cuda_k_arith)                                                                  \
    X(eq, cuda_k_compare) X(ne, cuda_k_compare) X(lt, cuda_k_compare) X(le, cuda_k_compare) X(gt, cuda_k_compare)      \
    X(ge, cuda_k_compare)                                                                                              \
    X(logical_and, cuda_k_logical) X(logical_or, cuda_k_logical)                                                       \
    X(where, cuda_k_where) X(masked_fill, cuda_k_masked_fill) X(clamp, cuda_k_clamp) X(to, cuda_k_to)                  \
    /* products through cuBLAS (cuda_matmul.c), floating dtypes */                                                     \
    X(matmul, cuda_k_mm) X(mm, cuda_k_mm) X(bmm, cuda_k_mm) X(linear, cuda_k_mm)                                       \
    /* reductions, softmax, norms (cuda_reduce.c; kernels in cuda_reduce_kernels.cu) */                                \
    X(sum, cuda_k_reduce) X(mean, cuda_k_reduce) X(amax, cuda_k_reduce) X(amin, cuda_k_reduce)                         \
    X(max, cuda_k_reduce) X(min, cuda_k_reduce)                                                                        \
    X(max_dim, cuda_k_arg) X(min_dim, cuda_k_arg) X(argmax, cuda_k_arg) X(argmin, cuda_k_arg)                          \
    X(softmax, cuda_k_softmax) X(log_softmax, cuda_k_softmax) X(layer_norm, cuda_k_norm) X(rms_norm, cuda_k_norm)    \
    X(cumsum, cuda_k_cumsum) X(topk, cuda_k_topk)                                                                      \
    /* views and data movement, embedding (cuda_view.c; kernels in cuda_view_kernels.cu), every dtype */              \
    X(reshape, cuda_k_reshape) X(flatten, cuda_k_reshape) X(unsqueeze, cuda_k_reshape) X(squeeze, cuda_k_reshape)      \
    X(permute, cuda_k_permute) X(expand, cuda_k_expand) X(cat, cuda_k_cat) X(stack, cuda_k_cat)                        \
    X(slice, cuda_k_slice) X(narrow, cuda_k_slice) X(select, cuda_k_slice) X(index_select, cuda_k_index_select)        \
    X(triu, cuda_k_tri) X(tril, cuda_k_tri) X(embedding, cuda_k_embedding)                                             \
    /* writes in place (cuda_write.c) */                                                                               \
    X(slice_assign_, cuda_k_slice_assign) X(shard_assign_, cuda_k_slice_assign) X(index_copy_, cuda_k_index_copy)      \
    /* rotary embedding (cuda_rope.c; kernel in cuda_rope_kernels.cu) */                                               \
    X(rope, cuda_k_rope)                                                                                               \
    /* attention (cuda_attention.c; kernels in cuda_attention_kernels.cu), floating dtypes */                          \
    X(scaled_dot_product_attention, cuda_k_sdpa) X(attention_block, cuda_k_attention_block)                            \
    X(attention_merge, cuda_k_attention_merge)                                                                         \
    /* image ops (cuda_image.c; kernels in cuda_image_kernels.cu), floating dtypes (pad: every dtype) */             \
    X(conv2d, cuda_k_conv2d) X(group_norm, cuda_k_group_norm) X(interpolate, cuda_k_interpolate) X(pad, cuda_k_pad)

/* An actor's device: what attach made for the thread that runs its records. */
typedef struct {
    int ordinal;                  /* the GPU */
    cudaStream_t compute;         /* kernels, products, copies between pieces, allocations */
    cudaStream_t comm;            /* copies to and from host memory (later: NCCL's collectives) */
    cudaEvent_t computed;         /* recorded on compute before comm works on the same memory */
    cublasHandle_t blas;          /* made at the first product, bound to compute */
} cuda_ctx;

/* A kernel: runs on the calling actor's device context (the backend's run slot fetched it). */
typedef const char *(*cuda_op_kernel)(cuda_ctx *c, op_kernel *k);

/* The CUDA kernel of op id, or NULL when it has none. */
cuda_op_kernel cuda_kernel_for(int id);

#define CUDA_DECLARE_(name, fn) const char *fn(cuda_ctx *c, op_kernel *k);
CUDA_OPS(CUDA_DECLARE_)
#undef CUDA_DECLARE_

/* The calling thread's context, or NULL with *why set (attach did not run, or could not bind a
 * device: the reason). */
cuda_ctx *cuda_ctx_get(const char **why);

/* Column-major C (m x n, ldc) = op(A) (m x k; A is k x m with trans_a) times B (k x n), A and B of
 * ab_type, C of c_type, in float32 arithmetic (no TF32): cuBLAS on the compute stream (cuda_matmul.c). */
const char *cuda_gemm(cuda_ctx *c, bool trans_a, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
                      const void *B, int64_t ldb, cudaDataType ab_type, void *C, int64_t ldc, cudaDataType c_type);

/* Destroys the context's cuBLAS handle, if the context made one (cuda_matmul.c). */
void cuda_blas_release(cuda_ctx *c);

/* NULL for cudaSuccess, else "<what>: <CUDA's message>" (a thread-local message). */
const char *cuda_check(cudaError_t e, const char *what);

/* The first of the indices idx (int32 or int64) outside [lo, hi): *at its position and *value its
 * value, or *at = -1 when every one is in range. It waits for the compute stream (the kernels that
 * index by a tensor fail their own op with the CPU's message; only the device knows the indices). */
const char *cuda_index_check(cuda_ctx *c, const op_local *idx, int64_t lo, int64_t hi, int64_t *at, int64_t *value);

/* Device memory ordered on the context's compute stream, for a kernel's converted copies. */
const char *cuda_scratch(cuda_ctx *c, size_t bytes, void **out);
void cuda_scratch_free(cuda_ctx *c, void *p);

#endif
