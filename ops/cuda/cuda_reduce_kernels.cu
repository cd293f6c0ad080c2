/* cuda_reduce_kernels — the reductions, softmax, norms, cumsum and topk on the GPU (cuda_kernels.h),
 * in the CPU's compute types (ops/cpu/cpu_reduce_loops.c): float32 sums, NaN-propagating float max/min,
 * wrapping int64 sums, arg-extremes with the CPU's tie rule, the CPU's softmax exponential
 * (ops/op_reduce_math.h) and its norm formulas. Sums are added in another order than the CPU's, so
 * float results agree to rounding, not bit for bit; everything else (cumsum, which adds in the
 * CPU's order, and topk among them) gives the CPU's values.
 *
 * One accumulator type per operation (init, add an element, merge another, write the result) serves
 * three shapes of launch: a block per output when the folded elements lie side by side in memory
 * (its threads split them, then merge in shared memory); for few outputs with many elements each (a
 * full reduction), several blocks per output, each folding a part into a partial accumulator, and a
 * second launch merging the parts; else a thread per output walking them (neighbouring threads read
 * neighbouring columns). */
#include "cuda_dtype.h"
#include "cuda_kernels.h"
#include "cuda_layout.h"
#include "op_reduce_math.h"

#define S_THREADS 256 /* a power of two: the block merge halves it */
/* a block per output only when each has at least this many elements to fold */
#define S_ROW_MIN 64
/* fewer outputs than this, each of at least S_SPLIT_MIN elements: several blocks per output, each
 * folding a part of at least S_PART_MIN elements, at most S_PARTS of them (a GPU has about a hundred
 * multiprocessors: one block each would leave it nearly idle) */
#define S_SPLIT_OUTS 64
#define S_SPLIT_MIN (1 << 16)
#define S_PART_MIN 4096
#define S_PARTS 256

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

/* Part blockIdx.x % parts of output blockIdx.x / parts: elements [p * chunk, (p + 1) * chunk). */
template <class A> __global__ void s_fold_part(cuda_fold_args a, int64_t chunk, int parts, A *partial)
{
    __shared__ A part[S_THREADS];
    int64_t o = blockIdx.x / parts, lo = (blockIdx.x % parts) * chunk;
    int64_t hi = lo + chunk < a.n_fold ? lo + chunk : a.n_fold;
    int64_t base = cuda_offset(o, a.nkeep, a.keep_size, a.keep_stride);
    A acc;
    acc.init();
    for (int64_t r = lo + threadIdx.x; r < hi; r += S_THREADS)
        s_fold_add(a, acc, base, r);
    A all = s_block_merge(part, acc);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = all;
}

/* Output o from its parts' accumulators (a block per output). */
template <class A> __global__ void s_fold_merge(cuda_fold_args a, int parts, const A *partial)
{
    __shared__ A part[S_THREADS];
    for (int64_t o = blockIdx.x; o < a.n_out; o += gridDim.x) {
        A acc;
        acc.init();
        for (int p = threadIdx.x; p < parts; p += S_THREADS)
            acc.merge(partial[o * parts + p]);
        A all = s_block_merge(part, acc);
        if (threadIdx.x == 0)
            all.put(a, o);
    }
}

/* The split launch, or false (nothing launched) when the partials' scratch cannot be had. */
template <class A> static bool s_fold_split(const cuda_fold_args *a, cudaStream_t s, cudaError_t *e)
{
    int64_t parts = (a->n_fold + S_PART_MIN - 1) / S_PART_MIN;
    parts = parts > S_PARTS ? S_PARTS : parts;
    int64_t chunk = (a->n_fold + parts - 1) / parts;
    A *partial = NULL;
    if (cudaMallocAsync((void **)&partial, (size_t)(a->n_out * parts) * sizeof(A), s) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    s_fold_part<A><<<(unsigned)(a->n_out * parts), S_THREADS, 0, s>>>(*a, chunk, (int)parts, partial);
    s_fold_merge<A><<<s_rows(a->n_out), S_THREADS, 0, s>>>(*a, (int)parts, partial);
    *e = cudaGetLastError();
    cudaFreeAsync(partial, s);
    return true;
}

template <class A> static cudaError_t s_fold(const cuda_fold_args *a, cudaStream_t s)
{
    bool rows = a->nfold > 0 && a->fold_stride[a->nfold - 1] == 1 && a->n_fold >= S_ROW_MIN;
    cudaError_t e;
    if (rows && a->n_out < S_SPLIT_OUTS && a->n_fold >= S_SPLIT_MIN && s_fold_split<A>(a, s, &e))
        return e;
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

/* ---- cumsum: a thread per column, adding in the CPU's order (so its bits) --------------------- */

template <class V>
__global__ void s_cumsum_columns(const void *in, dt_dtype id, void *out, dt_dtype od, int64_t outer, int64_t n,
                                 int64_t inner)
{
    for (int64_t c = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; c < outer * inner;
         c += (int64_t)gridDim.x * S_THREADS) {
        int64_t first = (c / inner) * n * inner + c % inner;
        V run = s_get<V>(in, id, first);
        s_put(out, od, first, run);
        for (int64_t r = 1; r < n; r++) {
            run = s_plus(run, s_get<V>(in, id, first + r * inner));
            s_put(out, od, first + r * inner, run);
        }
    }
}

extern "C" cudaError_t cuda_cumsum(bool floating, const void *in, dt_dtype in_dtype, void *out, dt_dtype out_dtype,
                                   int64_t outer, int64_t n, int64_t inner, cudaStream_t s)
{
    if (outer * n * inner <= 0)
        return cudaSuccess;
    if (floating)
        s_cumsum_columns<float><<<s_blocks(outer * inner), S_THREADS, 0, s>>>(in, in_dtype, out, out_dtype, outer, n,
                                                                                inner);
    else
        s_cumsum_columns<int64_t><<<s_blocks(outer * inner), S_THREADS, 0, s>>>(in, in_dtype, out, out_dtype, outer,
                                                                                  n, inner);
    return cudaGetLastError();
}

/* ---- topk: a stable radix sort of each slice -------------------------------------------------
 * Each slice along n is sorted by a block, 8 bits of a sort key per pass, in device scratch: keys
 * whose ascending order is the order topk lists elements in (largest first, or smallest first; a
 * NaN above every number, -0 level with +0), and positions. Every pass is stable and the first
 * reads the elements in position order, so elements that rank alike stay in position order: the
 * CPU's tie rule. The first k are the result. Passes whose digit is the same for every element
 * are skipped (the high bytes of small integers, the low ones of 16-bit floats). */

#define S_BINS 256
#define S_SORT_WARPS (S_THREADS / 32)
/* scratch for the blocks sorting slices at once: each holds two copies of its slice */
#define S_TOPK_SCRATCH ((size_t)64 << 20)

/* The sort key of a float: its order as an unsigned integer, NaN the highest, -0 as +0. */
__device__ __forceinline__ uint32_t s_sort_key(float x, bool largest)
{
    uint32_t u = 0xffffffffu;
    if (x == x) {
        u = __float_as_uint(x == 0.0f ? 0.0f : x);
        u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    }
    return largest ? ~u : u;
}

__device__ __forceinline__ uint64_t s_sort_key(int64_t x, bool largest)
{
    uint64_t u = (uint64_t)x ^ 0x8000000000000000ull;
    return largest ? ~u : u;
}

template <class K> static int64_t s_topk_blocks(int64_t slices, int64_t n)
{
    size_t per = 2 * (size_t)n * (sizeof(K) + sizeof(int64_t));
    int64_t most = (int64_t)(S_TOPK_SCRATCH / per);
    most = most < 1 ? 1 : most > 65535 ? 65535 : most;
    return slices < most ? slices : most;
}

/* keys, pos: 2 n of each per block */
template <class V, class K>
__global__ void s_topk_slices(const void *in, dt_dtype dt, void *values, int64_t *index, int64_t outer, int64_t n,
                              int64_t inner, int64_t k, bool largest, K *keys, int64_t *pos)
{
    __shared__ int64_t base[S_BINS];            /* where the next element of each digit goes */
    __shared__ int count[S_SORT_WARPS][S_BINS]; /* the histogram, then each warp's elements per digit */
    __shared__ int total[S_BINS];               /* a chunk's elements per digit */
    __shared__ bool skip;
    K *key_buf[2] = {keys + blockIdx.x * 2 * n, keys + blockIdx.x * 2 * n + n};
    int64_t *pos_buf[2] = {pos + blockIdx.x * 2 * n, pos + blockIdx.x * 2 * n + n};
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t slice = blockIdx.x; slice < outer * inner; slice += gridDim.x) {
        int64_t first = (slice / inner) * n * inner + slice % inner;
        int cur = -1; /* the buffer holding the slice so far; -1: the input, in position order */
        for (int shift = 0; shift < 8 * (int)sizeof(K); shift += 8) {
            for (int b = threadIdx.x; b < S_BINS; b += S_THREADS)
                count[0][b] = 0;
            __syncthreads();
            for (int64_t r = threadIdx.x; r < n; r += S_THREADS) {
                K key = cur < 0 ? s_sort_key(s_get<V>(in, dt, first + r * inner), largest) : key_buf[cur][r];
                atomicAdd(&count[0][(key >> shift) & 0xff], 1);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                int64_t run = 0;
                skip = false;
                for (int b = 0; b < S_BINS; b++) {
                    skip = skip || count[0][b] == n;
                    base[b] = run;
                    run += count[0][b];
                }
            }
            __syncthreads();
            if (skip)
                continue;
            int dst = cur == 0 ? 1 : 0;
            for (int b = threadIdx.x; b < S_BINS; b += S_THREADS)
                for (int w = 0; w < S_SORT_WARPS; w++)
                    count[w][b] = 0;
            __syncthreads();
            for (int64_t c0 = 0; c0 < n; c0 += S_THREADS) {
                int64_t r = c0 + threadIdx.x;
                bool valid = r < n;
                K key = 0;
                int64_t at = r;
                unsigned digit = 0;
                if (valid) {
                    key = cur < 0 ? s_sort_key(s_get<V>(in, dt, first + r * inner), largest) : key_buf[cur][r];
                    at = cur < 0 ? r : pos_buf[cur][r];
                    digit = (unsigned)(key >> shift) & 0xffu;
                }
                /* the lanes of this warp with the same digit, and this one's rank among them */
                unsigned peers = __ballot_sync(0xffffffffu, valid);
                for (int bit = 0; bit < 8; bit++) {
                    unsigned set = __ballot_sync(0xffffffffu, (digit >> bit) & 1u);
                    peers &= (digit >> bit) & 1u ? set : ~set;
                }
                int rank = __popc(peers & ((1u << lane) - 1u));
                if (valid && rank == 0)
                    count[warp][digit] = __popc(peers);
                __syncthreads();
                for (int b = threadIdx.x; b < S_BINS; b += S_THREADS) {
                    int run = 0;
                    for (int w = 0; w < S_SORT_WARPS; w++) {
                        int here = count[w][b];
                        count[w][b] = run;
                        run += here;
                    }
                    total[b] = run;
                }
                __syncthreads();
                if (valid) {
                    int64_t to = base[digit] + count[warp][digit] + rank;
                    key_buf[dst][to] = key;
                    pos_buf[dst][to] = at;
                }
                __syncthreads();
                for (int b = threadIdx.x; b < S_BINS; b += S_THREADS) {
                    base[b] += total[b];
                    for (int w = 0; w < S_SORT_WARPS; w++)
                        count[w][b] = 0;
                }
                __syncthreads();
            }
            cur = dst;
        }
        for (int64_t r = threadIdx.x; r < k; r += S_THREADS) {
            int64_t at = cur < 0 ? r : pos_buf[cur][r];
            int64_t o = (slice / inner) * k * inner + r * inner + slice % inner;
            s_put(values, dt, o, s_get<V>(in, dt, first + at * inner));
            index[o] = at;
        }
        __syncthreads();
    }
}

extern "C" size_t cuda_topk_scratch(bool floating, int64_t outer, int64_t n, int64_t inner)
{
    if (outer * inner <= 0 || n <= 0)
        return 0;
    size_t key = floating ? sizeof(uint32_t) : sizeof(uint64_t);
    int64_t blocks = floating ? s_topk_blocks<uint32_t>(outer * inner, n) : s_topk_blocks<uint64_t>(outer * inner, n);
    return (size_t)blocks * 2 * (size_t)n * (key + sizeof(int64_t));
}

template <class V, class K>
static cudaError_t s_topk(const void *in, dt_dtype dt, void *values, int64_t *index, int64_t outer, int64_t n,
                          int64_t inner, int64_t k, bool largest, void *scratch, cudaStream_t s)
{
    int64_t blocks = s_topk_blocks<K>(outer * inner, n);
    K *keys = (K *)scratch;
    int64_t *pos = (int64_t *)((char *)scratch + (size_t)blocks * 2 * (size_t)n * sizeof(K));
    s_topk_slices<V, K><<<(unsigned)blocks, S_THREADS, 0, s>>>(in, dt, values, index, outer, n, inner, k, largest, keys,
                                                               pos);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_topk(bool floating, const void *in, dt_dtype dtype, void *values, int64_t *index,
                                 int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest, void *scratch,
                                 cudaStream_t s)
{
    if (outer * inner * k <= 0 || n <= 0)
        return cudaSuccess;
    if (floating)
        return s_topk<float, uint32_t>(in, dtype, values, index, outer, n, inner, k, largest, scratch, s);
    return s_topk<int64_t, uint64_t>(in, dtype, values, index, outer, n, inner, k, largest, scratch, s);
}
