/* cuda_view_kernels — data movement by index on the GPU (cuda_kernels.h): the index check behind
 * embedding, index_select and index_copy_, the row gather and scatter they do, and triu/tril.
 * Views that are plain strided copies need no kernel of their own (cuda_copy_strided). Rows move
 * as the widest word that divides them and their addresses. */
#include "cuda_kernels.h"

#define S_THREADS 256

static unsigned s_blocks(int64_t n)
{
    int64_t b = (n + S_THREADS - 1) / S_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

#define S_EACH(i, n)                                                                                                   \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ int64_t s_index(const void *idx, dt_dtype d, int64_t j)
{
    return d == DT_INT32 ? ((const int32_t *)idx)[j] : ((const int64_t *)idx)[j];
}

/* The widest word (8, 4, 2 or 1 bytes) that divides the row size and both addresses. */
static size_t s_word(size_t row_bytes, const void *a, const void *b)
{
    uintptr_t all = (uintptr_t)row_bytes | (uintptr_t)a | (uintptr_t)b;
    return all % 8 == 0 ? 8 : all % 4 == 0 ? 4 : all % 2 == 0 ? 2 : 1;
}

/* ---- the index check ------------------------------------------------------------------------- */

__global__ void s_find_bad(const void *idx, dt_dtype d, int64_t n, int64_t lo, int64_t hi, unsigned long long *first)
{
    S_EACH(j, n) {
        int64_t v = s_index(idx, d, j);
        if (v < lo || v >= hi)
            atomicMin(first, (unsigned long long)j);
    }
}

extern "C" cudaError_t cuda_find_bad_index(const void *idx, dt_dtype idx_dtype, int64_t n, int64_t lo, int64_t hi,
                                           int64_t *first, cudaStream_t s)
{
    cudaError_t e = cuda_fill(first, sizeof *first, 1, (uint64_t)n, s);
    if (e != cudaSuccess || n <= 0)
        return e;
    s_find_bad<<<s_blocks(n), S_THREADS, 0, s>>>(idx, idx_dtype, n, lo, hi, (unsigned long long *)first);
    return cudaGetLastError();
}

/* ---- gather and scatter of rows -------------------------------------------------------------- */

template <class W>
__global__ void s_gather(W *dst, const W *src, const void *idx, dt_dtype d, int64_t outer, int64_t m, int64_t rows,
                         int64_t first_row, int64_t wrap, int64_t words)
{
    S_EACH(i, outer * m * words) {
        int64_t w = i % words, j = (i / words) % m, o = i / (words * m);
        int64_t g = s_index(idx, d, j);
        int64_t r = (g < 0 ? g + wrap : g) - first_row;
        dst[i] = r >= 0 && r < rows ? src[(o * rows + r) * words + w] : W(0);
    }
}

template <class W>
static void s_launch_gather(void *dst, const void *src, const void *idx, dt_dtype d, int64_t outer, int64_t m,
                            int64_t rows, int64_t first_row, int64_t wrap, int64_t words, cudaStream_t s)
{
    s_gather<W><<<s_blocks(outer * m * words), S_THREADS, 0, s>>>((W *)dst, (const W *)src, idx, d, outer, m, rows,
                                                                  first_row, wrap, words);
}

extern "C" cudaError_t cuda_gather_rows(void *dst, const void *src, const void *idx, dt_dtype idx_dtype, int64_t outer,
                                        int64_t m, int64_t rows, int64_t first_row, int64_t wrap, size_t row_bytes,
                                        cudaStream_t s)
{
    if (outer <= 0 || m <= 0 || row_bytes == 0)
        return cudaSuccess;
    size_t word = s_word(row_bytes, dst, src);
    int64_t words = (int64_t)(row_bytes / word);
    switch (word) {
    case 8: s_launch_gather<uint64_t>(dst, src, idx, idx_dtype, outer, m, rows, first_row, wrap, words, s); break;
    case 4: s_launch_gather<uint32_t>(dst, src, idx, idx_dtype, outer, m, rows, first_row, wrap, words, s); break;
    case 2: s_launch_gather<uint16_t>(dst, src, idx, idx_dtype, outer, m, rows, first_row, wrap, words, s); break;
    default: s_launch_gather<uint8_t>(dst, src, idx, idx_dtype, outer, m, rows, first_row, wrap, words, s); break;
    }
    return cudaGetLastError();
}

__global__ void s_last_writer(long long *winner, const int64_t *idx, int64_t n)
{
    S_EACH(j, n) atomicMax(&winner[idx[j]], (long long)j);
}

template <class W>
__global__ void s_scatter(W *dst, const W *src, const int64_t *idx, const int64_t *winner, int64_t outer, int64_t n,
                          int64_t rows, int64_t words)
{
    S_EACH(i, outer * n * words) {
        int64_t w = i % words, j = (i / words) % n, o = i / (words * n);
        int64_t r = idx[j];
        if (winner[r] == j)
            dst[(o * rows + r) * words + w] = src[i];
    }
}

template <class W>
static void s_launch_scatter(void *dst, const void *src, const int64_t *idx, const int64_t *winner, int64_t outer,
                             int64_t n, int64_t rows, int64_t words, cudaStream_t s)
{
    s_scatter<W><<<s_blocks(outer * n * words), S_THREADS, 0, s>>>((W *)dst, (const W *)src, idx, winner, outer, n,
                                                                   rows, words);
}

extern "C" cudaError_t cuda_scatter_rows(void *dst, const void *src, const int64_t *idx, int64_t outer, int64_t n,
                                         int64_t rows, size_t row_bytes, int64_t *winner, cudaStream_t s)
{
    if (outer <= 0 || n <= 0 || rows <= 0 || row_bytes == 0)
        return cudaSuccess;
    cudaError_t e = cuda_fill(winner, sizeof *winner, rows, UINT64_MAX, s); /* -1: no writer */
    if (e != cudaSuccess)
        return e;
    s_last_writer<<<s_blocks(n), S_THREADS, 0, s>>>((long long *)winner, idx, n);
    size_t word = s_word(row_bytes, dst, src);
    int64_t words = (int64_t)(row_bytes / word);
    switch (word) {
    case 8: s_launch_scatter<uint64_t>(dst, src, idx, winner, outer, n, rows, words, s); break;
    case 4: s_launch_scatter<uint32_t>(dst, src, idx, winner, outer, n, rows, words, s); break;
    case 2: s_launch_scatter<uint16_t>(dst, src, idx, winner, outer, n, rows, words, s); break;
    default: s_launch_scatter<uint8_t>(dst, src, idx, winner, outer, n, rows, words, s); break;
    }
    return cudaGetLastError();
}

/* ---- triu, tril ------------------------------------------------------------------------------ */

template <class T>
__global__ void s_tri(T *dst, const T *src, int64_t n, int64_t rows, int64_t cols, int64_t r0, int64_t c0,
                      int64_t diag, bool upper)
{
    S_EACH(i, n) {
        int64_t j = i % cols, r = (i / cols) % rows;
        int64_t edge = r0 + r + diag - c0; /* global column - global row compared with diag, for the local column */
        dst[i] = (upper ? j >= edge : j <= edge) ? src[i] : T(0);
    }
}

extern "C" cudaError_t cuda_tri(void *dst, const void *src, size_t elem, int64_t batch, int64_t rows, int64_t cols,
                                int64_t r0, int64_t c0, int64_t diag, bool upper, cudaStream_t s)
{
    int64_t n = batch * rows * cols;
    if (n <= 0)
        return cudaSuccess;
    unsigned b = s_blocks(n);
    switch (elem) {
    case 1: s_tri<<<b, S_THREADS, 0, s>>>((uint8_t *)dst, (const uint8_t *)src, n, rows, cols, r0, c0, diag, upper); break;
    case 2: s_tri<<<b, S_THREADS, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, n, rows, cols, r0, c0, diag, upper); break;
    case 4: s_tri<<<b, S_THREADS, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, n, rows, cols, r0, c0, diag, upper); break;
    case 8: s_tri<<<b, S_THREADS, 0, s>>>((uint64_t *)dst, (const uint64_t *)src, n, rows, cols, r0, c0, diag, upper); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
