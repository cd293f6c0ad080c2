/* cuda_pointwise_kernels — the elementwise ops (OP_POINTWISE in ops/op_table.h) on the GPU, in
 * their compute types: one expression per op and type, the CPU's (ops/op_pointwise_math.h), applied
 * by one kernel per (op, type) over a broadcast, strided set of operands (cuda_kernels.h). The
 * float32 functions are CUDA's (logf, tanhf, erff, ...: within a few ulps of glibc's, not bit for
 * bit), but for the exponential of exp, sigmoid, silu, gelu_tanh and softplus: op_ew_exp, the CPU's
 * arithmetic; integer, bool and selection ops give the CPU's bits. */
#include "cuda_kernels.h"
#include "cuda_layout.h"
#include "op_table.h"
#include "op_pointwise_math.h"

#define S_THREADS 256

/* The element at linear output index i of operand k: its bytes, or the number. */
template <class T> __device__ __forceinline__ T s_operand(const cuda_ew_args &a, int k, int64_t i)
{
    if (!a.in[k]) {
        T v;
        memcpy(&v, &a.number[k], sizeof v);
        return v;
    }
    return ((const T *)a.in[k])[cuda_offset(i, a.nd, a.size, a.stride[k])];
}

template <class T, class O, class F> __global__ void s_unary(cuda_ew_args a, F f)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x)
        ((O *)a.out)[i] = (O)f(s_operand<T>(a, 0, i), a.p);
}

/* (zero_divisor: integer floor_divide and remainder, whose driver fails the op for a zero divisor) */
template <class T, class O, class F> __global__ void s_binary(cuda_ew_args a, F f)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
        T y = s_operand<T>(a, 1, i);
        if (a.zero_divisor && y == T(0))
            *a.zero_divisor = 1;
        ((O *)a.out)[i] = (O)f(s_operand<T>(a, 0, i), y);
    }
}

template <class T> __global__ void s_select(cuda_ew_args a)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x)
        ((T *)a.out)[i] = s_operand<uint8_t>(a, 0, i) ? s_operand<T>(a, 1, i) : s_operand<T>(a, 2, i);
}

static unsigned s_blocks(int64_t n)
{
    int64_t b = (n + S_THREADS - 1) / S_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

template <class T, class O, class F> static cudaError_t s_launch1(const cuda_ew_args *a, cudaStream_t s, F f)
{
    s_unary<T, O, F><<<s_blocks(a->n), S_THREADS, 0, s>>>(*a, f);
    return cudaGetLastError();
}

template <class T, class O, class F> static cudaError_t s_launch2(const cuda_ew_args *a, cudaStream_t s, F f)
{
    s_binary<T, O, F><<<s_blocks(a->n), S_THREADS, 0, s>>>(*a, f);
    return cudaGetLastError();
}

/* ---- the ops' expressions: ops/op_pointwise_math.h, the CPU's too ---------------------------- */

/* ---- one functor per op and kind, and its launch per compute type --------------------------- */

#define S_F1(name, f)                                                                                                  \
    struct s_##name##_f {                                                                                              \
        __device__ float operator()(float x, const double *p) const { return (f); }                                    \
    };
OP_EW_UNARY_FLOAT(S_F1)

#define S_N1(name, f, i)                                                                                               \
    struct s_##name##_f {                                                                                              \
        __device__ float operator()(float x, const double *p) const { return (f); }                                    \
    };                                                                                                                 \
    struct s_##name##_i {                                                                                              \
        template <class T> __device__ T operator()(T x, const double *p) const { return (i); }                         \
    };
OP_EW_UNARY_NUMBER(S_N1)

struct s_logical_not_b {
    __device__ uint8_t operator()(uint8_t x, const double *p) const { return !x; }
};

#define S_A2(name, f, i, b)                                                                                            \
    struct s_##name##_f {                                                                                              \
        __device__ float operator()(float x, float y) const { return (f); }                                            \
    };                                                                                                                 \
    struct s_##name##_i {                                                                                              \
        template <class T> __device__ T operator()(T x, T y) const { return (i); }                                     \
    };                                                                                                                 \
    struct s_##name##_b {                                                                                              \
        __device__ uint8_t operator()(uint8_t x, uint8_t y) const { return (b); }                                      \
    };
OP_EW_BINARY_ANY(S_A2)

#define S_N2(name, f, i)                                                                                               \
    struct s_##name##_f {                                                                                              \
        __device__ float operator()(float x, float y) const { return (f); }                                            \
    };                                                                                                                 \
    struct s_##name##_i {                                                                                              \
        template <class T> __device__ T operator()(T x, T y) const { return (i); }                                     \
    };
OP_EW_BINARY_NUMBER(S_N2)
OP_EW_BINARY_DIVIDING(S_N2)

#define S_D2(name, f)                                                                                                  \
    struct s_##name##_f {                                                                                              \
        __device__ float operator()(float x, float y) const { return (f); }                                            \
    };
OP_EW_BINARY_FLOAT(S_D2)

#define S_C2(name, e)                                                                                                  \
    struct s_##name##_c {                                                                                              \
        template <class T> __device__ uint8_t operator()(T x, T y) const { return (e); }                               \
    };
OP_EW_COMPARE(S_C2)
OP_EW_LOGICAL(S_C2)

/* clamp: p = the bounds of op_clamp_bounds, doubles for float32 and int64s' bits for integers */
struct s_clamp_f {
    __device__ float operator()(float x, const double *p) const { return op_ew_clamp(x, (float)p[0], (float)p[1]); }
};
struct s_clamp_i {
    template <class T> __device__ T operator()(T x, const double *p) const
    {
        return (T)op_ew_iclamp(x, __double_as_longlong(p[0]), __double_as_longlong(p[1]));
    }
};

template <class T> static cudaError_t s_launch_select(const cuda_ew_args *a, cudaStream_t s)
{
    s_select<T><<<s_blocks(a->n), S_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_pointwise(int op, dt_dtype cd, const cuda_ew_args *a, cudaStream_t s)
{
    if (a->n <= 0)
        return cudaSuccess;
    bool f = cd == DT_FLOAT32, i32 = cd == DT_INT32, i64 = cd == DT_INT64, b = cd == DT_BOOL;
    switch (op) {
#define S_CASE_F1(name, e)                                                                                             \
    case OP_ID_##name:                                                                                                 \
        if (f)                                                                                                         \
            return s_launch1<float, float>(a, s, s_##name##_f());                                                      \
        break;
        OP_EW_UNARY_FLOAT(S_CASE_F1)
#define S_CASE_N1(name, e, i)                                                                                          \
    case OP_ID_##name:                                                                                                 \
        if (f)                                                                                                         \
            return s_launch1<float, float>(a, s, s_##name##_f());                                                      \
        if (i32)                                                                                                       \
            return s_launch1<int32_t, int32_t>(a, s, s_##name##_i());                                                  \
        if (i64)                                                                                                       \
            return s_launch1<int64_t, int64_t>(a, s, s_##name##_i());                                                  \
        break;
        OP_EW_UNARY_NUMBER(S_CASE_N1)
    case OP_ID_clamp:
        if (f)
            return s_launch1<float, float>(a, s, s_clamp_f());
        if (i32)
            return s_launch1<int32_t, int32_t>(a, s, s_clamp_i());
        if (i64)
            return s_launch1<int64_t, int64_t>(a, s, s_clamp_i());
        break;
    case OP_ID_logical_not:
        if (b)
            return s_launch1<uint8_t, uint8_t>(a, s, s_logical_not_b());
        break;
#define S_CASE_A2(name, e, i, bb)                                                                                      \
    case OP_ID_##name:                                                                                                 \
        if (f)                                                                                                         \
            return s_launch2<float, float>(a, s, s_##name##_f());                                                      \
        if (i32)                                                                                                       \
            return s_launch2<int32_t, int32_t>(a, s, s_##name##_i());                                                  \
        if (i64)                                                                                                       \
            return s_launch2<int64_t, int64_t>(a, s, s_##name##_i());                                                  \
        if (b)                                                                                                         \
            return s_launch2<uint8_t, uint8_t>(a, s, s_##name##_b());                                                  \
        break;
        OP_EW_BINARY_ANY(S_CASE_A2)
#define S_CASE_N2(name, e, i)                                                                                          \
    case OP_ID_##name:                                                                                                 \
        if (f)                                                                                                         \
            return s_launch2<float, float>(a, s, s_##name##_f());                                                      \
        if (i32)                                                                                                       \
            return s_launch2<int32_t, int32_t>(a, s, s_##name##_i());                                                  \
        if (i64)                                                                                                       \
            return s_launch2<int64_t, int64_t>(a, s, s_##name##_i());                                                  \
        break;
        OP_EW_BINARY_NUMBER(S_CASE_N2)
        OP_EW_BINARY_DIVIDING(S_CASE_N2)
#define S_CASE_D2(name, e)                                                                                             \
    case OP_ID_##name:                                                                                                 \
        if (f)                                                                                                         \
            return s_launch2<float, float>(a, s, s_##name##_f());                                                      \
        break;
        OP_EW_BINARY_FLOAT(S_CASE_D2)
#define S_CASE_C2(name, e)                                                                                             \
    case OP_ID_##name:                                                                                                 \
        if (f)                                                                                                         \
            return s_launch2<float, uint8_t>(a, s, s_##name##_c());                                                    \
        if (i32)                                                                                                       \
            return s_launch2<int32_t, uint8_t>(a, s, s_##name##_c());                                                  \
        if (i64)                                                                                                       \
            return s_launch2<int64_t, uint8_t>(a, s, s_##name##_c());                                                  \
        if (b)                                                                                                         \
            return s_launch2<uint8_t, uint8_t>(a, s, s_##name##_c());                                                  \
        break;
        OP_EW_COMPARE(S_CASE_C2)
        OP_EW_LOGICAL(S_CASE_C2)
    case OP_ID_where:
    case OP_ID_masked_fill:
        if (f)
            return s_launch_select<float>(a, s);
        if (i32)
            return s_launch_select<int32_t>(a, s);
        if (i64)
            return s_launch_select<int64_t>(a, s);
        if (b)
            return s_launch_select<uint8_t>(a, s);
        break;
    default: break;
    }
    return cudaErrorNotSupported;
}
