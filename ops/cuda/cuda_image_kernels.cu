/* cuda_image_kernels — the image ops' kernels on the GPU (cuda_kernels.h), cpu_image.c's arithmetic
 * written for the device: conv2d's im2col and its epilogue (the product between them is cuBLAS's,
 * cuda_image.c), group_norm a block per (image, group) accumulating in double as the CPU does,
 * interpolate and pad a thread per output element (any dtype for pad), finding its source as the
 * CPU does (op_image_math.h). Built with -fmad=false: a * b + c rounds twice, as on the CPU. */
#include "cuda_dtype.h"
#include "cuda_kernels.h"
#include "op_image_math.h"

#define S_THREADS 256

static unsigned s_blocks(int64_t n)
{
    int64_t b = (n + S_THREADS - 1) / S_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* Element i of elem bytes from src to element j of dst. */
__device__ __forceinline__ void s_copy_elem(void *dst, int64_t j, const void *src, int64_t i, size_t elem)
{
    switch (elem) {
    case 1: ((uint8_t *)dst)[j] = ((const uint8_t *)src)[i]; break;
    case 2: ((uint16_t *)dst)[j] = ((const uint16_t *)src)[i]; break;
    case 4: ((uint32_t *)dst)[j] = ((const uint32_t *)src)[i]; break;
    default: ((uint64_t *)dst)[j] = ((const uint64_t *)src)[i]; break;
    }
}

__device__ __forceinline__ void s_put_bits(void *dst, int64_t j, uint64_t bits, size_t elem)
{
    switch (elem) {
    case 1: ((uint8_t *)dst)[j] = (uint8_t)bits; break;
    case 2: ((uint16_t *)dst)[j] = (uint16_t)bits; break;
    case 4: ((uint32_t *)dst)[j] = (uint32_t)bits; break;
    default: ((uint64_t *)dst)[j] = bits; break;
    }
}

/* ---- conv2d ----------------------------------------------------------------------------------- */

__global__ void s_im2col(void *col, const void *x, size_t elem, cuda_im2col_args a)
{
    int64_t width = a.rows * a.OW, taps = a.kH * a.kW, n = a.Cg * taps * width;
    for (int64_t t = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; t < n; t += (int64_t)gridDim.x * S_THREADS) {
        int64_t j = t % width, row = t / width;
        int64_t c = row / taps, ki = (row % taps) / a.kW, kj = row % a.kW;
        int64_t r = j / a.OW, ow = j % a.OW;
        int64_t ih = (a.oh0 + r) * a.sh - a.pad_top + ki * a.dh, iw = ow * a.sw - a.pad_left + kj * a.dw;
        if (ih >= 0 && ih < a.H && iw >= 0 && iw < a.W)
            s_copy_elem(col, t, x, ((a.c0 + c) * a.H + ih) * a.W + iw, elem);
        else
            s_put_bits(col, t, 0, elem); /* +0.0 in every float dtype */
    }
}

extern "C" cudaError_t cuda_im2col(void *col, const void *x, size_t elem, const cuda_im2col_args *a, cudaStream_t s)
{
    int64_t n = a->Cg * a->kH * a->kW * a->rows * a->OW;
    if (n <= 0)
        return cudaSuccess;
    s_im2col<<<s_blocks(n), S_THREADS, 0, s>>>(col, x, elem, *a);
    return cudaGetLastError();
}

__global__ void s_conv_epilogue(void *out, dt_dtype dt, const float *acc, const void *bias, int64_t O, int64_t plane)
{
    int64_t n = O * plane;
    for (int64_t t = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; t < n; t += (int64_t)gridDim.x * S_THREADS) {
        float v = acc[t];
        if (bias)
            v += cuda_load_f32(bias, dt, t / plane); /* no bias adds nothing: -0.0 stays -0.0 */
        cuda_store_f32(out, dt, t, v);
    }
}

extern "C" cudaError_t cuda_conv_epilogue(void *out, dt_dtype dtype, const float *acc, const void *bias, int64_t O,
                                          int64_t plane, cudaStream_t s)
{
    int64_t n = O * plane;
    if (n <= 0)
        return cudaSuccess;
    s_conv_epilogue<<<s_blocks(n), S_THREADS, 0, s>>>(out, dtype, acc, bias, O, plane);
    return cudaGetLastError();
}

/* ---- group_norm: a block per (image, group) -------------------------------------------------- */

/* The sum of every thread's v; every thread gets it (part: S_THREADS doubles of shared memory). */
__device__ double s_block_sum(double *part, double v)
{
    part[threadIdx.x] = v;
    __syncthreads();
    for (int h = S_THREADS / 2; h > 0; h /= 2) {
        if (threadIdx.x < h)
            part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    double all = part[0];
    __syncthreads();
    return all;
}

__global__ void s_group_norm(void *y, const void *x, dt_dtype dt, int64_t N, int64_t C, int64_t S, int64_t G,
                             const void *weight, dt_dtype wd, const void *bias, dt_dtype bd, float eps)
{
    __shared__ double part[S_THREADS];
    int64_t Cg = C / G, n = Cg * S;
    for (int64_t ng = blockIdx.x; ng < N * G; ng += gridDim.x) {
        int64_t g = ng % G, first = ng * n; /* a group's elements lie together in its image */
        double sum = 0;
        for (int64_t i = threadIdx.x; i < n; i += S_THREADS)
            sum += cuda_load_f32(x, dt, first + i);
        double mean = n ? s_block_sum(part, sum) / (double)n : 0;
        double sq = 0;
        for (int64_t i = threadIdx.x; i < n; i += S_THREADS) {
            double t = cuda_load_f32(x, dt, first + i) - mean;
            sq += t * t;
        }
        sq = s_block_sum(part, sq);
        double rstd = 1.0 / sqrt((n ? sq / (double)n : 0) + (double)eps);
        for (int64_t i = threadIdx.x; i < n; i += S_THREADS) {
            int64_t ch = g * Cg + i / S;
            double scale = rstd * (weight ? cuda_load_f32(weight, wd, ch) : 1.0f);
            float a = (float)scale, b = (float)((bias ? cuda_load_f32(bias, bd, ch) : 0.0f) - mean * scale);
            cuda_store_f32(y, dt, first + i, cuda_load_f32(x, dt, first + i) * a + b);
        }
    }
}

extern "C" cudaError_t cuda_group_norm(void *y, const void *x, dt_dtype dtype, int64_t N, int64_t C, int64_t S,
                                       int64_t G, const void *weight, dt_dtype weight_dtype, const void *bias,
                                       dt_dtype bias_dtype, float eps, cudaStream_t s)
{
    if (N * C * S <= 0)
        return cudaSuccess;
    int64_t blocks = N * G < 65536 ? N * G : 65536;
    s_group_norm<<<(unsigned)blocks, S_THREADS, 0, s>>>(y, x, dtype, N, C, S, G, weight, weight_dtype, bias,
                                                         bias_dtype, eps);
    return cudaGetLastError();
}

/* ---- interpolate ------------------------------------------------------------------------------ */

__global__ void s_resample(void *out, dt_dtype od, const void *x, dt_dtype xd, cuda_resample_args a)
{
    int64_t n = a.P * a.OH * a.OW;
    for (int64_t t = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; t < n; t += (int64_t)gridDim.x * S_THREADS) {
        int64_t ow = t % a.OW, oh = (t / a.OW) % a.OH, p = t / (a.OW * a.OH);
        int64_t h0 = 0, h1 = 0, w0, w1;
        float b = 0.0f, d;
        if (a.nspatial == 2)
            op_resample_source(oh, a.IH, a.OH, a.mode, a.align_corners, a.scale_h, &h0, &h1, &b);
        op_resample_source(ow, a.IW, a.OW, a.mode, a.align_corners, a.scale_w, &w0, &w1, &d);
        int64_t r0 = (p * a.IH + h0) * a.IW, r1 = (p * a.IH + h1) * a.IW;
        if (a.mode != 1) {
            cuda_store_f32(out, od, t, cuda_load_f32(x, xd, r0 + w0));
            continue;
        }
        float a_ = 1.0f - b, c = 1.0f - d;
        float v = a_ * (c * cuda_load_f32(x, xd, r0 + w0) + d * cuda_load_f32(x, xd, r0 + w1)) +
                  b * (c * cuda_load_f32(x, xd, r1 + w0) + d * cuda_load_f32(x, xd, r1 + w1));
        cuda_store_f32(out, od, t, v);
    }
}

extern "C" cudaError_t cuda_resample(void *out, dt_dtype out_dtype, const void *x, dt_dtype x_dtype,
                                     const cuda_resample_args *a, cudaStream_t s)
{
    int64_t n = a->P * a->OH * a->OW;
    if (n <= 0)
        return cudaSuccess;
    s_resample<<<s_blocks(n), S_THREADS, 0, s>>>(out, out_dtype, x, x_dtype, *a);
    return cudaGetLastError();
}

/* ---- pad ---------------------------------------------------------------------------------------- */

__global__ void s_pad(void *out, const void *x, size_t elem, cuda_pad_args a)
{
    int64_t n = 1;
    for (int d = 0; d < a.ndim; d++)
        n *= a.out_shape[d];
    for (int64_t t = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; t < n; t += (int64_t)gridDim.x * S_THREADS) {
        int64_t rest = t, src = 0, stride = 1;
        for (int d = a.ndim - 1; d >= 0 && src >= 0; d--) {
            int64_t i = rest % a.out_shape[d];
            rest /= a.out_shape[d];
            int64_t s = op_pad_source(i - a.left[d], a.in_shape[d], a.mode);
            src = s < 0 ? -1 : src + s * stride;
            stride *= a.in_shape[d];
        }
        if (src < 0)
            s_put_bits(out, t, a.fill, elem);
        else
            s_copy_elem(out, t, x, src, elem);
    }
}

extern "C" cudaError_t cuda_pad(void *out, const void *x, size_t elem, const cuda_pad_args *a, cudaStream_t s)
{
    int64_t n = 1;
    for (int d = 0; d < a->ndim; d++)
        n *= a->out_shape[d];
    if (n <= 0)
        return cudaSuccess;
    s_pad<<<s_blocks(n), S_THREADS, 0, s>>>(out, x, elem, *a);
    return cudaGetLastError();
}
