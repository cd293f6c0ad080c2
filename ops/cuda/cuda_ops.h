/* cuda_ops — the CUDA kernel of every op, looked up by its id: each row of ops/op_table.h names its
 * kernel, cuda_k_<kernel>, which its family's file defines (ops/cuda/cuda_<family>.c; an op without
 * one fails to link). Also what the kernels share: the calling actor's device context and scratch
 * memory on its compute stream. */
#ifndef CUDA_OPS_H
#define CUDA_OPS_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "op_registry.h"

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

/* The CUDA kernel of op id, or NULL when no op has that id (every op has one). */
cuda_op_kernel cuda_kernel_for(int id);

/* The kernels the rows name (OP_KERNELS). */
#define OP_KERNEL(name, id, kernel) const char *cuda_k_##kernel(cuda_ctx *c, op_kernel *k);
OP_KERNELS
#undef OP_KERNEL

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
