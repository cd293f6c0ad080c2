/* cuda_matmul — the products (matmul, mm, bmm, linear) through cuBLAS: row-major C = A @ B is the
 * column-major C^T = B^T @ A^T, one cublasGemmStridedBatchedEx over the innermost batch dim (a
 * stride 0 broadcasts it) per index of the outer ones. float32 computes in float32 (no TF32);
 * float16 and bfloat16 are read and written as such and accumulate in float32 on the tensor
 * cores, rounded once, as the CPU's kernels round once. A bias is broadcast into C first and the
 * product added to it (beta 1). Integer products are a kernel of their own (cuda_matmul_kernels.cu)
 * adding in int64 that wraps, the CPU's arithmetic, so its bits. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>

#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

/* ---- cuBLAS, loaded at the first product -----------------------------------------------------
 * Linking libcublas (and the libcublasLt it needs) costs every process that loads them about
 * 95 MB of private memory at start, GPU or not: 512 worker processes of a cpu mesh ran the machine
 * out of memory. So the library is opened by the first product that needs it, in that process
 * only (by its soname, else where the build found it). */
static struct {
    __typeof__(cublasCreate_v2) *create;
    __typeof__(cublasDestroy_v2) *destroy;
    __typeof__(cublasSetStream_v2) *set_stream;
    __typeof__(cublasSetMathMode) *set_math;
    __typeof__(cublasGemmStridedBatchedEx) *gemm;
    __typeof__(cublasGetStatusString) *status_string;
    char why[320]; /* why it could not be loaded */
} s_cublas;

static pthread_once_t s_cublas_once = PTHREAD_ONCE_INIT;

#define S_STR_(x) #x
#define S_STR(x) S_STR_(x)

static void s_cublas_load(void)
{
    const char *names[] = {"libcublas.so." S_STR(CUBLAS_VER_MAJOR), DTORCH_CUBLAS_PATH};
    void *lib = NULL;
    for (int i = 0; i < 2 && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(s_cublas.why, sizeof s_cublas.why, "cannot load cuBLAS: %s", dlerror());
        return;
    }
    *(void **)&s_cublas.create = dlsym(lib, "cublasCreate_v2");
    *(void **)&s_cublas.destroy = dlsym(lib, "cublasDestroy_v2");
    *(void **)&s_cublas.set_stream = dlsym(lib, "cublasSetStream_v2");
    *(void **)&s_cublas.set_math = dlsym(lib, "cublasSetMathMode");
    *(void **)&s_cublas.gemm = dlsym(lib, "cublasGemmStridedBatchedEx");
    *(void **)&s_cublas.status_string = dlsym(lib, "cublasGetStatusString");
    if (!s_cublas.create || !s_cublas.destroy || !s_cublas.set_stream || !s_cublas.set_math || !s_cublas.gemm ||
        !s_cublas.status_string)
        snprintf(s_cublas.why, sizeof s_cublas.why, "cuBLAS lacks a function DTorch calls: %s", dlerror());
}

static const char *s_blas(cublasStatus_t st, const char *what)
{
    static _Thread_local char msg[160];
    if (st == CUBLAS_STATUS_SUCCESS)
        return NULL;
    snprintf(msg, sizeof msg, "%s: %s", what, s_cublas.status_string(st));
    return msg;
}

/* The context's cuBLAS handle, made at the first product and bound to the compute stream. Its math
 * mode forbids reductions in a 16-bit output type (a split-K product would otherwise round its
 * partial sums to float16 / bfloat16): a product is summed in float32 and rounded once, as on the CPU. */
static const char *s_handle(cuda_ctx *c)
{
    if (c->blas)
        return NULL;
    pthread_once(&s_cublas_once, s_cublas_load);
    if (s_cublas.why[0])
        return s_cublas.why;
    const char *why = s_blas(s_cublas.create(&c->blas), "cublasCreate");
    if (!why && (why = s_blas(s_cublas.set_stream(c->blas, c->compute), "cublasSetStream")))
        s_cublas.destroy(c->blas);
    else if (!why && (why = s_blas(s_cublas.set_math(c->blas, CUBLAS_DEFAULT_MATH |
                                                      CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION),
                                   "cublasSetMathMode")))
        s_cublas.destroy(c->blas);
    if (why)
        c->blas = NULL;
    return why;
}

void cuda_blas_release(cuda_ctx *c)
{
    if (c->blas)
        s_cublas.destroy(c->blas);
    c->blas = NULL;
}

const char *cuda_gemm(cuda_ctx *c, bool trans_a, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
                      const void *B, int64_t ldb, cudaDataType ab_type, void *C, int64_t ldc, cudaDataType c_type)
{
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
        return "a matrix dimension exceeds cuBLAS's integer range";
    const char *why = s_handle(c);
    if (why)
        return why;
    const float one = 1.0f, zero = 0.0f;
    return s_blas(s_cublas.gemm(c->blas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one,
                                A, ab_type, (int)lda, 0, B, ab_type, (int)ldb, 0, &zero, C, c_type, (int)ldc, 0, 1,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "cublasGemmStridedBatchedEx");
}

const char *cuda_k_mm(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *a = &k->in[0], *b = &k->in[1];
    op_local *o = &k->out[0];
    cudaDataType type = o->dtype == DT_FLOAT16 ? CUDA_R_16F : o->dtype == DT_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
    bool integer = !dt_dtype_is_float(o->dtype);
    if (o->dtype == DT_BOOL)
        return "no CUDA kernel for products of bool tensors (internal error: infer refuses them)";
    if (a->dtype != o->dtype || b->dtype != o->dtype || (k->nin == 3 && k->in[2].dtype != o->dtype))
        return "the operands' dtypes differ (internal error)";
    bool linear = k->def->id == OP_ID_linear;
    op_mm_dims d;
    int64_t M, K, N;
    if ((why = op_mm_local(k, &d, &M, &K, &N)))
        return why;
    int64_t a_st[DT_MAX_DIMS], b_st[DT_MAX_DIMS], a_batch[DT_MAX_DIMS] = {0}, b_batch[DT_MAX_DIMS] = {0};
    dt_layout_strides(a->ndim, a->shape, 1, a_st);
    dt_layout_strides(b->ndim, b->shape, 1, b_st);
    int64_t nb = 1;
    for (int j = 0; j < d.nbatch; j++) {
        int ja = j - (d.nbatch - d.a_nbatch), jb = j - (d.nbatch - d.b_nbatch);
        a_batch[j] = ja >= 0 && a->shape[ja] == o->shape[j] ? a_st[ja] : 0;
        b_batch[j] = jb >= 0 && b->shape[jb] == o->shape[j] ? b_st[jb] : 0;
        nb *= o->shape[j];
    }
    if (nb == 0 || M == 0 || N == 0)
        return NULL;
    size_t elem = dt_dtype_size(o->dtype);
    bool bias = k->nin == 3 && k->nctx > 0 && k->ctx[0];
    if (bias) {
        /* the bias broadcast into C: strides 0 along the dims it lacks or has of size 1 */
        const op_local *v = &k->in[2];
        int64_t v_st[DT_MAX_DIMS], src[DT_MAX_DIMS], dst[DT_MAX_DIMS];
        dt_layout_strides(v->ndim, v->shape, elem, v_st);
        dt_layout_strides(o->ndim, o->shape, elem, dst);
        for (int j = 0; j < o->ndim; j++) {
            int jv = j - (o->ndim - v->ndim);
            src[j] = jv >= 0 && v->shape[jv] == o->shape[j] ? v_st[jv] : 0;
        }
        if ((why = cuda_check(cuda_copy_strided(o->data, dst, v->data, src, o->ndim, o->shape, elem, c->compute),
                              "bias")))
            return why;
    }
    if (K == 0)
        return bias ? NULL
                    : cuda_check(cudaMemsetAsync(o->data, 0, (size_t)(nb * M * N) * elem, c->compute), "product");
    if (integer) {
        /* the CPU's int64 arithmetic, wrapping, in one launch over every batch */
        cuda_mm_int_args args = {.nbatch = d.nbatch, .M = M, .N = N, .K = K, .b_trans = linear, .accumulate = bias};
        for (int j = 0; j < d.nbatch; j++) {
            args.batch[j] = o->shape[j];
            args.a_stride[j] = a_batch[j];
            args.b_stride[j] = b_batch[j];
        }
        return cuda_check(cuda_mm_int(o->data, a->data, b->data, o->dtype, &args, c->compute), "integer product");
    }
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return "a matrix dimension exceeds cuBLAS's integer range";
    if ((why = s_handle(c)))
        return why;
    /* the innermost batch dim goes to one batched call; the outer ones are walked here */
    int inner = d.nbatch - 1;
    int64_t count = d.nbatch ? o->shape[inner] : 1, outer = count ? nb / count : 0;
    int64_t sa = d.nbatch ? a_batch[inner] : 0, sb = d.nbatch ? b_batch[inner] : 0;
    if (count > INT_MAX)
        return "a batch exceeds cuBLAS's integer range";
    const float one = 1.0f, beta = bias ? 1.0f : 0.0f;
    int64_t idx[DT_MAX_DIMS] = {0};
    for (int64_t q = 0; q < outer; q++) {
        int64_t ao = 0, bo = 0;
        for (int j = 0; j < inner; j++) {
            ao += idx[j] * a_batch[j];
            bo += idx[j] * b_batch[j];
        }
        const char *pa = (const char *)a->data + ao * (int64_t)elem, *pb = (const char *)b->data + bo * (int64_t)elem;
        char *pc = (char *)o->data + q * count * M * N * (int64_t)elem;
        why = s_blas(s_cublas.gemm(c->blas, linear ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)M,
                                                (int)K, &one, pb, type, linear ? (int)K : (int)N, sb, pa, type, (int)K,
                                                sa, &beta, pc, type, (int)N, M * N, (int)count, CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT),
                     "cublasGemmStridedBatchedEx");
        if (why)
            return why;
        for (int j = inner - 1; j >= 0 && ++idx[j] == o->shape[j]; j--)
            idx[j] = 0;
    }
    return NULL;
}
