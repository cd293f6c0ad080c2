/* cuda_rope_kernels — the rotary embedding on the GPU (cuda_kernels.h): cpu_rope's arithmetic, one
 * thread per pair of rotated elements. The angles go through CUDA's cosf and sinf (within a couple
 * of ulps of glibc's); the rotation rounds as the CPU's does (no fused multiply-adds). */
#include "cuda_dtype.h"
#include "cuda_kernels.h"

#define S_THREADS 256

static unsigned s_blocks(int64_t n)
{
    int64_t b = (n + S_THREADS - 1) / S_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

__global__ void s_rope(void *out, const void *x, dt_dtype dt, int64_t B, int64_t H, int64_t S, int64_t D,
                       const int64_t *positions, int64_t pos_batch, const float *inv_freq, float scaling)
{
    int64_t half = D / 2, n = B * H * S * half;
    for (int64_t t = blockIdx.x * (int64_t)S_THREADS + threadIdx.x; t < n; t += (int64_t)gridDim.x * S_THREADS) {
        int64_t i = t % half, s = (t / half) % S, bh = t / (half * S), b = bh / H;
        float p = (float)positions[(pos_batch == 1 ? 0 : b) * S + s];
        float angle = inv_freq[i] * p;
        float cs = cosf(angle) * scaling, sn = sinf(angle) * scaling;
        int64_t row = (bh * S + s) * D;
        float x1 = cuda_load_f32(x, dt, row + i), x2 = cuda_load_f32(x, dt, row + i + half);
        cuda_store_f32(out, dt, row + i, x1 * cs - x2 * sn);
        cuda_store_f32(out, dt, row + i + half, x2 * cs + x1 * sn);
    }
}

extern "C" cudaError_t cuda_rope(void *out, const void *x, dt_dtype dtype, int64_t B, int64_t H, int64_t S, int64_t D,
                                 const int64_t *positions, int64_t pos_batch, const float *inv_freq, float scaling,
                                 cudaStream_t s)
{
    int64_t n = B * H * S * (D / 2);
    if (n <= 0)
        return cudaSuccess;
    s_rope<<<s_blocks(n), S_THREADS, 0, s>>>(out, x, dtype, B, H, S, D, positions, pos_batch, inv_freq, scaling);
    return cudaGetLastError();
}
