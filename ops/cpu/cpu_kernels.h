/* cpu_kernels — the CPU device kernels: fills, counter-based random numbers, ranges, strided
 * block copies and the elementwise reductions used to combine Partial pieces.
 *
 * Tensors speak one vocabulary: element counts per dim (shape) and byte strides per dim.
 * Every kernel writes a C-contiguous destination unless it takes strides for it.
 */
#ifndef CPU_KERNELS_H
#define CPU_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "dt_dtype.h"
#include "dt_layout.h"
#include "dtorch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Whether this CPU runs the kernels' AVX2 + FMA paths (asked at run time; false off x86-64). */
static inline bool cpu_has_avx2_fma(void)
{
#if defined(__x86_64__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

/* Whether this CPU runs the kernels' AVX-512 paths (F, BW and VL: every AVX-512 x86 since the
 * first has all three; false off x86-64). */
static inline bool cpu_has_avx512(void)
{
#if defined(__x86_64__)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

/* A loop function in an AVX-512 (16 lanes) and an AVX2 (8 lanes) clone beside the baseline one,
 * chosen when the library loads. Only on static functions: a clone's symbol would be exported
 * from the library (an exported wrapper calls the static one). No clone contracts a multiply and
 * an add into an FMA (ISO C mode), so all give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_CLONES
#endif

/* Element i of b, float32, bfloat16 or float16, as float32: a weight or a cache read in its own
 * dtype (dtype a constant where inlined). */
static inline float cpu_widen(const void *b, dt_dtype dtype, int64_t i)
{
    if (dtype == DT_FLOAT32)
        return ((const float *)b)[i];
    uint16_t h = ((const uint16_t *)b)[i];
    return dtype == DT_BFLOAT16 ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
}

#if defined(__x86_64__)
/* Elements i .. i + 7 of b widened so (AVX2, F16C). */
__attribute__((target("avx2,fma,f16c"))) static inline __m256 cpu_widen8(const void *b, dt_dtype dtype, int64_t i)
{
    if (dtype == DT_FLOAT32)
        return _mm256_loadu_ps((const float *)b + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)b + i));
    if (dtype == DT_BFLOAT16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The lanes of 16 below n: none for n <= 0, all for n >= 16 (a masked last vector's). */
static inline __mmask16 cpu_lanes16(int64_t n)
{
    return n >= 16 ? 0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0;
}

/* 16 bfloat16s from p widened to float32 (exact). */
__attribute__((target("avx512f"))) static inline __m512 cpu_bf16_widen16(const uint16_t *p)
{
    __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

/* cpu_bf16_widen16 of the lanes given, zeros in the others (nothing read there). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512 cpu_bf16_load16(const uint16_t *p,
                                                                                          __mmask16 lanes)
{
    __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

/* 16 floats rounded to bfloat16 as dt_f32_to_bf16 rounds one, bit for bit: ties to even, NaN made
 * quiet, subnormals kept (the AVX512_BF16 instruction flushes them to zero). */
__attribute__((target("avx512f"))) static inline __m256i cpu_bf16_round16(__m512 x)
{
    __m512i u = _mm512_castps_si512(x), high = _mm512_srli_epi32(u, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i even = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                    _mm512_and_si512(high, _mm512_set1_epi32(1)));
    __m512i r = _mm512_mask_mov_epi32(_mm512_srli_epi32(even, 16), nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}
#endif

/* double -> 16-bit float, rounded once to nearest even (not twice through float). */
uint16_t cpu_f64_to_f16(double v);
uint16_t cpu_f64_to_bf16(double v);

/* dst[0..n) = value converted to dtype (bool: value != 0; 16-bit floats rounded to nearest;
 * integers from a float value truncate toward zero, saturating, NaN -> 0). */
void cpu_fill(void *dst, dt_dtype dtype, int64_t n, dt_scalar value);

/* Philox4x32-10 (Salmon et al. 2011; multipliers 0xD2511F53, 0xCD9E8D57, key increments
 * 0x9E3779B9, 0xBB67AE85): 4 output words from a 128-bit counter and a 64-bit key. */
void cpu_philox(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* Counter-based random numbers. The element at global row-major index g of the stream
 * (seed, stream) takes its value from cpu_philox(counter={g lo, g hi, stream lo, stream hi},
 * key={seed lo, seed hi}) — so a value depends only on (seed, stream, g), whatever the piece.
 * With w0, w1 the first two output words and p the dtype's significand bits (24 float32,
 * 11 float16, 8 bfloat16):
 *   uniform: (w0 >> (32 - p)) * 2^-p, exact in the dtype and always in [0, 1) (rounding 24 bits
 *            to a 16-bit float would sometimes give 1);
 *   normal:  u1 = ((w0 >> 8) + 1) * 2^-24 (in (0, 1], so the log is finite),
 *            u2 = (w1 >> 8) * 2^-24, z = sqrt(-2 ln u1) * cos(2 pi u2), computed in double and
 *            rounded once to the dtype (cpu_f64_to_f16/bf16 for 16-bit floats).
 * Fills the C-contiguous local block `shape` that sits at `offset` in a tensor of `global_shape`.
 * dtype must be a float type. */
void cpu_random(void *dst, dt_dtype dtype, int ndim, const int64_t *shape, const int64_t *offset,
                const int64_t *global_shape, uint64_t seed, uint64_t stream, bool normal);

/* dst[i] = start + (first + i) * step for i in [0, n), computed in double for float dtypes
 * and exactly in int64 for integer dtypes (start/step given both ways). */
void cpu_arange(void *dst, dt_dtype dtype, int64_t n, int64_t first, dt_scalar start, dt_scalar step);

/* Copies an ndim block of shape elements of elem_size bytes between two strided layouts
 * (byte strides). ndim 0 copies one element. */
void cpu_copy_block(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
                    int ndim, const int64_t *shape, size_t elem_size);

/* C-contiguous byte strides of shape: the kernels' name for the layout arithmetic in core. */
static inline void cpu_contiguous_strides(int ndim, const int64_t *shape, size_t elem_size, int64_t *strides)
{
    dt_layout_strides(ndim, shape, elem_size, strides);
}

/* dst[i] = a[i] (op) b[i] for n elements of dtype, all C-contiguous; dst may be a (in place).
 * sum/avg add (avg is finished by cpu_scale_div); max/min propagate NaN like torch, and on a tie
 * or a NaN in a keep a's bits. 16-bit floats are combined in float32 and rounded once per call.
 * bool: sum = avg = or, max = or, min = and. Integer sums wrap on overflow. */
void cpu_combine_pieces(void *dst, const void *a, const void *b, dt_dtype dtype, int64_t n, dt_reduce_op op);

/* acc[i] /= divisor (the last step of an avg reduction); integer dtypes truncate toward zero;
 * bool is left as it is. */
void cpu_scale_div(void *acc, dt_dtype dtype, int64_t n, int64_t divisor);

#endif
