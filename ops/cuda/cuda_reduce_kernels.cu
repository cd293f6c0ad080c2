/* cuda_reduce_kernels — the reductions, softmax and norms on the GPU (cuda_kernels.h), in the CPU's
 * compute types (ops/cpu/cpu_reduce.c): float32 sums, NaN-propagating float max/min, wrapping int64
 * sums, arg-extremes with the CPU's tie rule, the CPU's softmax exponential (ops/op_reduce_math.h)
 * and its norm formulas. Sums are added in another order than the CPU's, so float results agree to
 * rounding, not bit for bit; everything else gives the CPU's values.
 *
 * One accumulator type per operation (init, add an element, merge another, write the result) serves
 * two shapes of launch: a block per output when the folded elements lie side by side in memory
 * (its threads split them, then merge in shared memory), else a thread per output walking them
 * (neighbouring threads read neighbouring columns). */
#include "cuda_dtype.h"
#include "cuda_kernels.h"
#include "cuda_layout.h"
#include "op_reduce_math.h"

#define S_THREADS 256 /* a power of two: the block merge halves it */
/* a block per output only when each has at least this many elements to fold */
#define S_ROW_MIN 64

static unsigned s_blocks(int64_t n)
{
    int64_t b = (n + S_THREADS - 1) / S_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

static unsigned s_rows(int64_t n) { return (unsigned)(n < 1 ? 1 : n > 65536 ? 65536 : n); }

template <class T> __device__ __forceinline__ T s_get(const void *p, dt_dtype d, int64_t i);
template <> __device__ __forceinline__ float s_get<float>(const void *p, dt_dtype d, int64_t i)
{
    return cuda_load_f32(p, d, i);
}
template <> __device__ __forceinline__ int64_t s_get<int64_t>(const void *p, dt_dtype d, int64_t i)
{
    return cuda_load_i64(p, d, i);
}

__device__ __forceinline__ void s_put(void *p, dt_dtype d, int64_t i, float v) { cuda_store_f32(p, d, i, v); }
__device__ __forceinline__ void s_put(void *p, dt_dtype d, int64_t i, int64_t v) { cuda_store_i64(p, d, i, v); }

/* ---- accumulators ---------------------------------------------------------------------------- */

__device__ __forceinline__ float s_plus(float a, float b) { return a + b; }
/* integer sums wrap, as torch's do (in unsigned arithmetic: signed overflow is undefined) */
__device__ __forceinline__ int64_t s_plus(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

template <class V> struct s_sum {
    typedef V T;
    V v;
    __device__ void init() { v = 0; }
    __device__ void add(V x, int64_t) { v = s_plus(v, x); }
    __device__ void merge(const s_sum &o) { v = s_plus(v, o.v); }
    __device__ void put(const cuda_fold_args &a, int64_t o) const
    {
        if (a.divisor)
            s_put(a.out, a.out_dtype, o, (V)((double)v / (double)a.divisor));
        else
            s_put(a.out, a.out_dtype, o, v);
    }
};

/* x beats the kept value b: larger (smaller) and, in floats, a NaN beats any number */
template <bool MAX> __device__ __forceinline__ bool s_beats(float x, float b)
{
    return (MAX ? x > b : x < b) || (x != x && b == b);
}
template <bool MAX> __device__ __forceinline__ bool s_beats(int64_t x, int64_t b) { return MAX ? x > b : x < b; }

/* x and b rank alike (NaN with NaN) */
__device__ __forceinline__ bool s_level(float x, float b) { return x == b || (x != x && b != b); }
__device__ __forceinline__ bool s_level(int64_t x, int64_t b) { return x == b; }

__device__ __forceinline__ float s_worst(float, bool max) { return max ? -INFINITY : INFINITY; }
__device__ __forceinline__ int64_t s_worst(int64_t, bool max) { return max ? INT64_MIN : INT64_MAX; }

/* max/min: the value alone (a NaN anywhere makes it NaN, as the CPU's does) */
template <class V, bool MAX> struct s_extreme {
    typedef V T;
    V v;
    __device__ void init() { v = s_worst(V(), MAX); }
    __device__ void add(V x, int64_t) { v = s_beats<MAX>(x, v) ? x : v; }
    __device__ void merge(const s_extreme &o) { add(o.v, 0); }
    __device__ void put(const cuda_fold_args &a, int64_t o) const { s_put(a.out, a.out_dtype, o, v); }
};

/* argmax/argmin, max/min along a dim: the value and its position; of values that rank alike the
 * lower position wins, which is the CPU's first-seen rule whatever order the parts merge in */
template <class V, bool MAX> struct s_arg {
    typedef V T;
    V v;
    int64_t at; /* -1: nothing folded yet */
    __device__ void init()
    {
        v = s_worst(V(), MAX);
        at = -1;
    }
    __device__ void add(V x, int64_t r)
    {
        if (at < 0 || s_beats<MAX>(x, v) || (s_level(x, v) && r < at)) {
            v = x;
            at = r;
        }
    }
    __device__ void merge(const s_arg &o)
    {
        if (o.at >= 0)
            add(o.v, o.at);
    }
    __device__ void put(const cuda_fold_args &a, int64_t o) const
    {
        if (a.out)
            s_put(a.out, a.out_dtype, o, v);
        a.index[o] = at;
    }
};

/* Every thread's acc merged; every thread gets the result (part: S_THREADS slots of shared memory). */
template <class A> __device__ A s_block_merge(A *part, A acc)
{
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int h = S_THREADS / 2; h > 0; h /= 2) {
        if (threadIdx.x < h)
            part[threadIdx.x].merge(part[threadIdx.x + h]);
        __syncthreads();
    }
    A all = part[0];
    __syncthreads();
    return all;
}

/* ---- reductions over kept and folded dims ---------------------------------------------------- */

template <class A> __device__ __forceinline__ void s_fold_add(const cuda_fold_args &a, A &acc, int64_t base, int64_t r)
{
    acc.add(s_get<typename A::T>(a.in, a.in_dtype, base + cuda_offset(r, a.nfold, a.fold_size, a.fold_stride)), r);
}

template <class A> __global__ void s_fold_rows(cuda_fold_args a)
{
    __shared__ A part[S_THREADS];
    for (int64_t o = blockIdx.x; o < a.n_out; o += gridDim.x) {
        int64_t base = cuda_offset(o, a.nkeep, a.keep_size, a.keep_stride);
        A acc;
        acc.init();
        for (int64_t r = threadIdx.x; r < a.n_fold; r += S_THREADS)
            s_fold_add(a, acc, base, r);
        A all = s_block_merge(part, acc);
        if (threadIdx.x == 0)
            all.put(a, o);
    }
}

template <class A> __global__ void s_fold_columns(cuda_fold_args a)
{
    for (int64_t o = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; o < a.n_out; o += (int64_t)gridDim.x * S_THREADS) {
        int64_t base = cuda_offset(o, a.nkeep, a.keep_size, a.keep_stride);
        A acc;
        acc.init();
        for (int64_t r = 0; r < a.n_fold; r++)
            s_fold_add(a, acc, base, r);
        acc.put(a, o);
    }
}

template <class A> static cudaError_t s_fold(const cuda_fold_args *a, cudaStream_t s)
{
    bool rows = a->nfold > 0 && a->fold_stride[a->nfold - 1] == 1 && a->n_fold >= S_ROW_MIN;
    if (rows)
        s_fold_rows<A><<<s_rows(a->n_out), S_THREADS, 0, s>>>(*a);
    else
        s_fold_columns<A><<<s_blocks(a->n_out), S_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_fold(cuda_fold_op op, bool floating, const cuda_fold_args *a, cudaStream_t s)
{
    if (a->n_out <= 0)
        return cudaSuccess;
    switch (op) {
    case CUDA_FOLD_SUM: return floating ? s_fold<s_sum<float>>(a, s) : s_fold<s_sum<int64_t>>(a, s);
    case CUDA_FOLD_MAX: return floating ? s_fold<s_extreme<float, true>>(a, s) : s_fold<s_extreme<int64_t, true>>(a, s);
    case CUDA_FOLD_MIN:
        return floating ? s_fold<s_extreme<float, false>>(a, s) : s_fold<s_extreme<int64_t, false>>(a, s);
    case CUDA_FOLD_ARGMAX: return floating ? s_fold<s_arg<float, true>>(a, s) : s_fold<s_arg<int64_t, true>>(a, s);
    case CUDA_FOLD_ARGMIN: return floating ? s_fold<s_arg<float, false>>(a, s) : s_fold<s_arg<int64_t, false>>(a, s);
    }
    return cudaErrorNotSupported;
}

/* ---- softmax, log_softmax -------------------------------------------------------------------- */

/* One row of n elements i, i + step, ...: its max and the sum of the shifted exponentials come
 * in (a NaN in the row turns both, hence every output, to NaN, as on the CPU). */
__device__ __forceinline__ void s_softmax_write(bool log, const void *in, dt_dtype id, void *out, dt_dtype od,
                                                int64_t at, float top, float total)
{
    float x = cuda_load_f32(in, id, at) - top;
    if (log)
        cuda_store_f32(out, od, at, x - logf(total));
    else
        cuda_store_f32(out, od, at, op_softmax_exp(op_softmax_clamp(x)) * (1.0f / total));
}

/* inner == 1: a block per row */
__global__ void s_softmax_rows(bool log, const void *in, dt_dtype id, void *out, dt_dtype od, int64_t outer, int64_t n)
{
    __shared__ s_extreme<float, true> tops[S_THREADS];
    __shared__ s_sum<float> sums[S_THREADS];
    for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
        int64_t row = o * n;
        s_extreme<float, true> m;
        m.init();
        for (int64_t r = threadIdx.x; r < n; r += S_THREADS)
            m.add(cuda_load_f32(in, id, row + r), r);
        float top = s_block_merge(tops, m).v;
        s_sum<float> e;
        e.init();
        for (int64_t r = threadIdx.x; r < n; r += S_THREADS)
            e.add(op_softmax_exp(op_softmax_clamp(cuda_load_f32(in, id, row + r) - top)), r);
        float total = s_block_merge(sums, e).v;
        for (int64_t r = threadIdx.x; r < n; r += S_THREADS)
            s_softmax_write(log, in, id, out, od, row + r, top, total);
    }
}

/* inner > 1: a thread per (outer, inner) column */
__global__ void s_softmax_columns(bool log, const void *in, dt_dtype id, void *out, dt_dtype od, int64_t outer,
                                  int64_t n, int64_t inner)
{
    for (int64_t c = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; c < outer * inner;
         c += (int64_t)gridDim.x * S_THREADS) {
        int64_t first = (c / inner) * n * inner + c % inner;
        s_extreme<float, true> m;
        m.init();
        for (int64_t r = 0; r < n; r++)
            m.add(cuda_load_f32(in, id, first + r * inner), r);
        s_sum<float> e;
        e.init();
        for (int64_t r = 0; r < n; r++)
            e.add(op_softmax_exp(op_softmax_clamp(cuda_load_f32(in, id, first + r * inner) - m.v)), r);
        for (int64_t r = 0; r < n; r++)
            s_softmax_write(log, in, id, out, od, first + r * inner, m.v, e.v);
    }
}

extern "C" cudaError_t cuda_softmax(bool log, const void *in, dt_dtype in_dtype, void *out, dt_dtype out_dtype,
                                    int64_t outer, int64_t n, int64_t inner, cudaStream_t s)
{
    if (outer * n * inner <= 0)
        return cudaSuccess;
    if (inner == 1)
        s_softmax_rows<<<s_rows(outer), S_THREADS, 0, s>>>(log, in, in_dtype, out, out_dtype, outer, n);
    else
        s_softmax_columns<<<s_blocks(outer * inner), S_THREADS, 0, s>>>(log, in, in_dtype, out, out_dtype, outer, n,
                                                                          inner);
    return cudaGetLastError();
}

/* ---- layer_norm, rms_norm: a block per row --------------------------------------------------- */

__global__ void s_norm_rows(bool rms, const void *in, dt_dtype id, void *out, dt_dtype od, int64_t rows, int64_t d,
                            const void *w, dt_dtype wd, const void *b, dt_dtype bd, float eps)
{
    __shared__ s_sum<float> sums[S_THREADS];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t first = row * d;
        float mean = 0.0f;
        s_sum<float> acc;
        if (!rms) {
            acc.init();
            for (int64_t j = threadIdx.x; j < d; j += S_THREADS)
                acc.add(cuda_load_f32(in, id, first + j), j);
            mean = s_block_merge(sums, acc).v / (float)d;
        }
        acc.init();
        for (int64_t j = threadIdx.x; j < d; j += S_THREADS) {
            float v = cuda_load_f32(in, id, first + j) - mean;
            acc.add(v * v, j);
        }
        float var = s_block_merge(sums, acc).v / (float)d;
        float rstd = 1.0f / sqrtf(var + eps);
        for (int64_t j = threadIdx.x; j < d; j += S_THREADS) {
            float v = (cuda_load_f32(in, id, first + j) - mean) * rstd;
            if (w)
                v *= cuda_load_f32(w, wd, j);
            if (b)
                v += cuda_load_f32(b, bd, j);
            cuda_store_f32(out, od, first + j, v);
        }
    }
}

extern "C" cudaError_t cuda_norm(bool rms, const void *in, dt_dtype in_dtype, void *out, dt_dtype out_dtype,
                                 int64_t rows, int64_t d, const void *weight, dt_dtype weight_dtype, const void *bias,
                                 dt_dtype bias_dtype, float eps, cudaStream_t s)
{
    if (rows <= 0 || d <= 0)
        return cudaSuccess;
    s_norm_rows<<<s_rows(rows), S_THREADS, 0, s>>>(rms, in, in_dtype, out, out_dtype, rows, d, weight, weight_dtype,
                                                    bias, bias_dtype, eps);
    return cudaGetLastError();
}
