/* cuda_kernels — the CUDA kernels of the backend's slots other than run: fills, Philox random
 * numbers, ranges, strided copies, dtype conversions and the combinations of Partial pieces. Each
 * is the CPU kernel's arithmetic (ops/cpu/cpu_kernels.c, cpu_random.c, cpu_pointwise.c), one
 * element per thread in a grid-stride loop. */
#include "cuda_dtype.h"
#include "op_pointwise_math.h"
#include "cuda_kernels.h"

#define S_THREADS 256

/* Enough blocks for n elements, at most 2^16 (each thread then walks the rest in strides). */
static unsigned s_blocks(int64_t n)
{
    int64_t b = (n + S_THREADS - 1) / S_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

#define S_EACH(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---- fill ------------------------------------------------------------------------------------ */

template <class T> __global__ void s_fill(T *dst, int64_t n, T v)
{
    S_EACH(i, n) dst[i] = v;
}

extern "C" cudaError_t cuda_fill(void *dst, size_t elem, int64_t n, uint64_t bits, cudaStream_t s)
{
    if (n <= 0)
        return cudaSuccess;
    switch (elem) {
    case 1: return cudaMemsetAsync(dst, (int)(bits & 0xff), (size_t)n, s);
    case 2: s_fill<<<s_blocks(n), S_THREADS, 0, s>>>((uint16_t *)dst, n, (uint16_t)bits); break;
    case 4: s_fill<<<s_blocks(n), S_THREADS, 0, s>>>((uint32_t *)dst, n, (uint32_t)bits); break;
    case 8: s_fill<<<s_blocks(n), S_THREADS, 0, s>>>((uint64_t *)dst, n, bits); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- strided copies -------------------------------------------------------------------------- */

typedef struct {
    int ndim;
    int64_t shape[DT_MAX_DIMS], dst[DT_MAX_DIMS], src[DT_MAX_DIMS];
} s_layout;

template <class T> __global__ void s_copy(char *dst, const char *src, s_layout l, int64_t n, int64_t elem)
{
    S_EACH(i, n) {
        int64_t rem = i, doff = 0, soff = 0;
        for (int d = l.ndim - 1; d >= 0; d--) {
            int64_t at = rem % l.shape[d];
            rem /= l.shape[d];
            doff += at * l.dst[d];
            soff += at * l.src[d];
        }
        if (sizeof(T) > 1 || elem == 1)
            *(T *)(dst + doff) = *(const T *)(src + soff);
        else
            for (int64_t b = 0; b < elem; b++)
                dst[doff + b] = src[soff + b];
    }
}

extern "C" cudaError_t cuda_copy_strided(void *dst, const int64_t *dst_strides, const void *src,
                                         const int64_t *src_strides, int ndim, const int64_t *shape, size_t elem,
                                         cudaStream_t s)
{
    s_layout l = {0};
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        n *= shape[d];
        if (shape[d] == 1)
            continue; /* never moves a pointer */
        l.shape[l.ndim] = shape[d];
        l.dst[l.ndim] = dst_strides[d];
        l.src[l.ndim] = src_strides[d];
        l.ndim++;
    }
    if (n == 0)
        return cudaSuccess;
    char *d = (char *)dst;
    const char *from = (const char *)src;
    /* whole elements move as one word when every address is a multiple of their size */
    uintptr_t all = (uintptr_t)d | (uintptr_t)from;
    for (int k = 0; k < l.ndim; k++)
        all |= (uintptr_t)l.dst[k] | (uintptr_t)l.src[k];
    bool aligned = elem <= 8 && (elem & (elem - 1)) == 0 && all % elem == 0;
    unsigned blocks = s_blocks(n);
    if (aligned && elem == 8)
        s_copy<uint64_t><<<blocks, S_THREADS, 0, s>>>(d, from, l, n, 8);
    else if (aligned && elem == 4)
        s_copy<uint32_t><<<blocks, S_THREADS, 0, s>>>(d, from, l, n, 4);
    else if (aligned && elem == 2)
        s_copy<uint16_t><<<blocks, S_THREADS, 0, s>>>(d, from, l, n, 2);
    else
        s_copy<uint8_t><<<blocks, S_THREADS, 0, s>>>(d, from, l, n, (int64_t)elem);
    return cudaGetLastError();
}

/* ---- conversions (cpu_convert's rules) ------------------------------------------------------- */

/* Element i of a piece of dtype, read as a float (floats), an integer (int32, int64) or a truth value. */
typedef struct {
    int kind; /* 0 float, 1 integer, 2 bool */
    float f;
    int64_t i;
    bool b;
} s_value;

__device__ __forceinline__ s_value s_load(const void *src, dt_dtype dtype, int64_t i)
{
    s_value v = {0, 0.0f, 0, false};
    switch (dtype) {
    case DT_FLOAT32: v.f = ((const float *)src)[i]; break;
    case DT_FLOAT16: v.f = cuda_f16_to_f32(((const uint16_t *)src)[i]); break;
    case DT_BFLOAT16: v.f = cuda_bf16_to_f32(((const uint16_t *)src)[i]); break;
    case DT_INT32: v.kind = 1; v.i = ((const int32_t *)src)[i]; break;
    case DT_INT64: v.kind = 1; v.i = ((const int64_t *)src)[i]; break;
    default: v.kind = 2; v.b = ((const uint8_t *)src)[i] != 0; break;
    }
    return v;
}

__device__ __forceinline__ void s_store(void *dst, dt_dtype dtype, int64_t i, s_value v)
{
    float f = v.kind == 0 ? v.f : v.kind == 1 ? (float)v.i : (v.b ? 1.0f : 0.0f);
    switch (dtype) {
    case DT_FLOAT32: ((float *)dst)[i] = f; break;
    case DT_FLOAT16: ((uint16_t *)dst)[i] = v.kind == 2 ? (v.b ? 0x3c00 : 0) : cuda_f32_to_f16(f); break;
    case DT_BFLOAT16: ((uint16_t *)dst)[i] = v.kind == 2 ? (v.b ? 0x3f80 : 0) : cuda_f32_to_bf16(f); break;
    /* float -> integer as every backend converts (op_ew_f2i32, op_ew_f2i64) */
    case DT_INT32: ((int32_t *)dst)[i] = v.kind == 0 ? op_ew_f2i32(f) : (int32_t)(v.kind == 1 ? v.i : v.b); break;
    case DT_INT64: ((int64_t *)dst)[i] = v.kind == 0 ? op_ew_f2i64(f) : v.kind == 1 ? v.i : v.b; break;
    default: ((uint8_t *)dst)[i] = v.kind == 0 ? f != 0.0f : v.kind == 1 ? v.i != 0 : v.b; break;
    }
}

__global__ void s_convert(void *dst, dt_dtype to, const void *src, dt_dtype from, int64_t n)
{
    S_EACH(i, n) s_store(dst, to, i, s_load(src, from, i));
}

extern "C" cudaError_t cuda_convert(void *dst, dt_dtype to, const void *src, dt_dtype from, int64_t n, cudaStream_t s)
{
    if (n <= 0)
        return cudaSuccess;
    if (to == from)
        return cudaMemcpyAsync(dst, src, (size_t)n * (to == DT_FLOAT32 || to == DT_INT32 ? 4 : to == DT_INT64 ? 8
                                                      : to == DT_BOOL ? 1 : 2),
                               cudaMemcpyDeviceToDevice, s);
    s_convert<<<s_blocks(n), S_THREADS, 0, s>>>(dst, to, src, from, n);
    return cudaGetLastError();
}

/* ---- ranges ---------------------------------------------------------------------------------- */

__global__ void s_arange(void *dst, dt_dtype dtype, int64_t n, int64_t first, double a, double d, uint64_t ia,
                         uint64_t id)
{
    S_EACH(i, n) {
        if (dtype == DT_FLOAT32 || dtype == DT_FLOAT16 || dtype == DT_BFLOAT16) {
            double v = __dadd_rn(a, __dmul_rn((double)(first + i), d)); /* two roundings, no fused multiply-add */
            if (dtype == DT_FLOAT32)
                ((float *)dst)[i] = (float)v;
            else
                ((uint16_t *)dst)[i] = dtype == DT_FLOAT16 ? cuda_f64_to_f16(v) : cuda_f64_to_bf16(v);
            continue;
        }
        int64_t v = (int64_t)(ia + (uint64_t)(first + i) * id);
        if (dtype == DT_INT32)
            ((int32_t *)dst)[i] = (int32_t)v;
        else if (dtype == DT_INT64)
            ((int64_t *)dst)[i] = v;
        else
            ((uint8_t *)dst)[i] = v != 0;
    }
}

extern "C" cudaError_t cuda_arange(void *dst, dt_dtype dtype, int64_t n, int64_t first, double a, double d,
                                   uint64_t ia, uint64_t id, cudaStream_t s)
{
    if (n <= 0)
        return cudaSuccess;
    s_arange<<<s_blocks(n), S_THREADS, 0, s>>>(dst, dtype, n, first, a, d, ia, id);
    return cudaGetLastError();
}

/* ---- Philox4x32-10 (cpu_random.c) ------------------------------------------------------------ */

typedef struct {
    int ndim;
    int64_t shape[DT_MAX_DIMS], offset[DT_MAX_DIMS], gstride[DT_MAX_DIMS];
} s_block;

__device__ __forceinline__ void s_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                                         uint32_t out[4])
{
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

__global__ void s_random(void *dst, dt_dtype dtype, s_block b, int64_t n, uint64_t seed, uint64_t stream, bool normal)
{
    S_EACH(i, n) {
        /* the element's row-major index in the whole tensor: its value's counter */
        uint64_t g = 0;
        int64_t rem = i;
        for (int d = b.ndim - 1; d >= 0; d--) {
            int64_t at = rem % b.shape[d];
            rem /= b.shape[d];
            g += (uint64_t)(b.offset[d] + at) * (uint64_t)b.gstride[d];
        }
        uint32_t w[4];
        s_philox((uint32_t)g, (uint32_t)(g >> 32), (uint32_t)stream, (uint32_t)(stream >> 32), (uint32_t)seed,
                 (uint32_t)(seed >> 32), w);
        if (normal) {
            double u1 = ((double)(w[0] >> 8) + 1.0) * 0x1p-24;
            double u2 = (double)(w[1] >> 8) * 0x1p-24;
            double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
            if (dtype == DT_FLOAT32)
                ((float *)dst)[i] = (float)z;
            else
                ((uint16_t *)dst)[i] = dtype == DT_FLOAT16 ? cuda_f64_to_f16(z) : cuda_f64_to_bf16(z);
        } else if (dtype == DT_FLOAT32) {
            ((float *)dst)[i] = (float)(w[0] >> 8) * 0x1p-24f;
        } else if (dtype == DT_FLOAT16) {
            ((uint16_t *)dst)[i] = cuda_f32_to_f16((float)(w[0] >> 21) * 0x1p-11f);
        } else {
            ((uint16_t *)dst)[i] = cuda_f32_to_bf16((float)(w[0] >> 24) * 0x1p-8f);
        }
    }
}

extern "C" cudaError_t cuda_random(void *dst, dt_dtype dtype, int ndim, const int64_t *shape, const int64_t *offset,
                                   const int64_t *global_shape, uint64_t seed, uint64_t stream, bool normal,
                                   cudaStream_t s)
{
    s_block b = {0};
    int64_t n = 1, g = 1;
    b.ndim = ndim;
    for (int d = ndim - 1; d >= 0; d--) {
        b.shape[d] = shape[d];
        b.offset[d] = offset[d];
        b.gstride[d] = g;
        g *= global_shape[d];
        n *= shape[d];
    }
    if (n <= 0)
        return cudaSuccess;
    s_random<<<s_blocks(n), S_THREADS, 0, s>>>(dst, dtype, b, n, seed, stream, normal);
    return cudaGetLastError();
}

/* ---- combining Partial pieces (cpu_combine_pieces, cpu_scale_div) --------------------------- */

__global__ void s_combine(void *dst, const void *pa, const void *pb, dt_dtype dtype, int64_t n, dt_reduce_op op)
{
    bool sum = op == DT_REDUCE_SUM || op == DT_REDUCE_AVG, max = op == DT_REDUCE_MAX;
    S_EACH(i, n) {
        switch (dtype) {
        case DT_FLOAT32: {
            float a = ((const float *)pa)[i], b = ((const float *)pb)[i];
            ((float *)dst)[i] = sum ? a + b : isnan(a) ? a : isnan(b) ? b : max ? (a >= b ? a : b) : (a <= b ? a : b);
            break;
        }
        case DT_FLOAT16:
        case DT_BFLOAT16: {
            bool bf = dtype == DT_BFLOAT16;
            uint16_t ha = ((const uint16_t *)pa)[i], hb = ((const uint16_t *)pb)[i];
            float a = bf ? cuda_bf16_to_f32(ha) : cuda_f16_to_f32(ha), b = bf ? cuda_bf16_to_f32(hb) : cuda_f16_to_f32(hb);
            if (sum)
                ((uint16_t *)dst)[i] = bf ? cuda_f32_to_bf16(a + b) : cuda_f32_to_f16(a + b);
            else /* the bits of the operand picked */
                ((uint16_t *)dst)[i] = !isnan(a) && (isnan(b) || (max ? b > a : b < a)) ? hb : ha;
            break;
        }
        case DT_INT32: {
            int32_t a = ((const int32_t *)pa)[i], b = ((const int32_t *)pb)[i];
            ((int32_t *)dst)[i] = sum   ? (int32_t)((uint32_t)a + (uint32_t)b)
                                  : max ? (a >= b ? a : b)
                                        : (a <= b ? a : b);
            break;
        }
        case DT_INT64: {
            int64_t a = ((const int64_t *)pa)[i], b = ((const int64_t *)pb)[i];
            ((int64_t *)dst)[i] = sum   ? (int64_t)((uint64_t)a + (uint64_t)b)
                                  : max ? (a >= b ? a : b)
                                        : (a <= b ? a : b);
            break;
        }
        default: {
            uint8_t a = ((const uint8_t *)pa)[i], b = ((const uint8_t *)pb)[i];
            ((uint8_t *)dst)[i] = op == DT_REDUCE_MIN ? (a && b) : (a || b);
        }
        }
    }
}

extern "C" cudaError_t cuda_combine_pieces(void *dst, const void *a, const void *b, dt_dtype dtype, int64_t n,
                                           dt_reduce_op op, cudaStream_t s)
{
    if (n <= 0)
        return cudaSuccess;
    s_combine<<<s_blocks(n), S_THREADS, 0, s>>>(dst, a, b, dtype, n, op);
    return cudaGetLastError();
}

__global__ void s_scale_div(void *acc, dt_dtype dtype, int64_t n, int64_t divisor)
{
    float fd = (float)divisor;
    S_EACH(i, n) {
        uint16_t *h = (uint16_t *)acc;
        switch (dtype) {
        case DT_FLOAT32: ((float *)acc)[i] /= fd; break;
        case DT_FLOAT16: h[i] = cuda_f32_to_f16(cuda_f16_to_f32(h[i]) / fd); break;
        case DT_BFLOAT16: h[i] = cuda_f32_to_bf16(cuda_bf16_to_f32(h[i]) / fd); break;
        case DT_INT32: ((int32_t *)acc)[i] = (int32_t)(((int32_t *)acc)[i] / divisor); break;
        case DT_INT64: ((int64_t *)acc)[i] /= divisor; break;
        default: break; /* an avg of bools is their or */
        }
    }
}

extern "C" cudaError_t cuda_scale_div(void *acc, dt_dtype dtype, int64_t n, int64_t divisor, cudaStream_t s)
{
    if (n <= 0 || dtype == DT_BOOL)
        return cudaSuccess;
    s_scale_div<<<s_blocks(n), S_THREADS, 0, s>>>(acc, dtype, n, divisor);
    return cudaGetLastError();
}
