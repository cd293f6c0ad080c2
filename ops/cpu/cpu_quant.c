/* cpu_quant — the CPU kernels of the products with quantized weights (linear_int8, linear_int4;
 * ops/op_quant.c reads their pieces).
 *
 * Decode's few rows (up to S_FEW_ROWS) stream the weight's bytes once, row after row: the cost is
 * the quantized bytes, a quarter (int8) or an eighth (int4) of float32's. int8 widens its bytes to
 * float32 in registers. int4 quantizes its input too, per group of 32 features (symmetric int8:
 * xs = max|x_group| / 127, xq = rint(x / xs); features past the last whole group stay float32),
 * and multiplies nibbles by bytes in integers, one 32-bit sum per group scaled by xs and the
 * weight's scale: widening nibbles to float took three times the instructions and bound the loop
 * well below what memory delivers.
 *
 * More rows: int8 dequantizes a block of weight rows into float32 at a time and hands it to sgemm,
 * so no float copy of the whole weight is ever made. int4 keeps its integer products for any
 * number of rows: a block of S_INT4_BLOCK weight rows stays in L1 while the input's rows pass over
 * it S_FEW_ROWS at a time, each through the same per-row code as decode. One maddubs multiplies 32
 * nibble-byte pairs where an FMA does 8 products, so a prompt's products take fewer instructions
 * than sgemm's over a dequantized copy (and no copy is written), and a row's result is the same to
 * the bit whatever rows came with it. AVX-512 with VNNI is taken where the CPU has it (one vpdpbusd
 * multiplies 64 nibble-byte pairs and sums them in fours: 128 weights of four groups a step), else
 * AVX2 and FMA (asked at run time; DTORCH_QUANT_AVX512=0 keeps AVX2 for comparison); a portable
 * loop computes the same sums elsewhere. int8's AVX-512 path widens 16 weights a step. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm.h"
#include "cpu_kernels.h"
#include "cpu_matmul.h"
#include "cpu_ops.h"
#include "op_quant.h"

#define S_FEW_ROWS 8     /* rows of A that stream the quantized weight (their accumulators fit the registers) */
#define S_BLOCK_ROWS 256 /* int8: weight rows dequantized per sgemm (each call packs x again: 64 ran at 0.85x) */
#define S_INT4_BLOCK 16  /* int4, more rows: weight rows that stay in L1 while the input's rows pass */

/* ---- int4's input, quantized ------------------------------------------------------------------ */

/* W groups of one input row (features 32 W b .. 32 W (b + 1) - 1), laid out as the kernel reads them
 * beside 16 W weight bytes: lo holds each group's even features in turn, hi their odd ones (a
 * byte's low nibble is an even feature, its high one the odd), c per 4 bytes 8 * their lo + hi
 * values (so that the unsigned nibble u = w + 8 gives w's sum: u . xq - c), xs each group's scale
 * four times over. A last block of fewer groups is zeros past them. W is 2 for the AVX2 kernel
 * (s_xpair, 32 weight bytes a step) and 4 for the AVX-512 one (s_xquad, 64). */
typedef struct {
    int8_t lo[32], hi[32];
    int32_t c[8];
    float xs[8];
} s_xpair;

typedef struct {
    int8_t lo[64], hi[64];
    int32_t c[16];
    float xs[16];
} s_xquad;

#define S_XBLOCK(W) ((size_t)(W) * 64) /* bytes of a block of W groups: sizeof(s_xpair), sizeof(s_xquad) */

/* blocks of W groups per row of x */
static int64_t s_xblocks(const op_quant_dims *d, int W) { return (d->K / OP_QUANT_GROUP + W - 1) / W; }

/* One group's largest magnitude and its values as the nearest integers to x * 127 / amax (0 where
 * amax is 0 or not finite); the AVX2 version below does the same in registers. */
typedef void s_round_fn(const float *xg, float *amax, int32_t *v);

static void s_round_plain(const float *xg, float *amax, int32_t *v)
{
    float top = 0.0f;
    for (int i = 0; i < OP_QUANT_GROUP; i++)
        top = isnan(xg[i]) || isnan(top) ? NAN : fmaxf(top, fabsf(xg[i]));
    float inv = top > 0.0f && isfinite(top) ? 127.0f / top : 0.0f;
    for (int i = 0; i < OP_QUANT_GROUP; i++)
        v[i] = inv > 0.0f ? (int32_t)lrintf(xg[i] * inv) : 0;
    *amax = top;
}

/* The whole groups of d->M rows of x into xa (M * s_xblocks blocks of W groups). A group whose
 * largest magnitude is not finite gets scale NaN, so its products come out NaN rather than some
 * number. */
static void s_quantize_x(const op_quant_dims *d, const float *x, void *xa, int W, s_round_fn *round_group)
{
    int64_t whole = d->K / OP_QUANT_GROUP, blocks = s_xblocks(d, W);
    memset(xa, 0, (size_t)(d->M * blocks) * S_XBLOCK(W));
    for (int64_t m = 0; m < d->M; m++)
        for (int64_t g = 0; g < whole; g++) {
            char *block = (char *)xa + (size_t)(m * blocks + g / W) * S_XBLOCK(W);
            int8_t *lo = (int8_t *)block + 16 * (g % W), *hi = lo + 16 * W;
            int32_t *c = (int32_t *)(block + 32 * W) + 4 * (g % W);
            float *xs = (float *)(block + 48 * W) + 4 * (g % W);
            float amax;
            int32_t v[OP_QUANT_GROUP];
            round_group(x + m * d->K_x + g * OP_QUANT_GROUP, &amax, v);
            for (int j = 0; j < OP_QUANT_GROUP / 2; j++) {
                lo[j] = (int8_t)v[2 * j];
                hi[j] = (int8_t)v[2 * j + 1];
            }
            for (int l = 0; l < 4; l++) {
                int32_t sum = 0;
                for (int b = 0; b < 4; b++)
                    sum += lo[4 * l + b] + hi[4 * l + b];
                c[l] = 8 * sum;
                xs[l] = isfinite(amax) ? amax / 127.0f : NAN;
            }
        }
}

/* ---- the portable path ----------------------------------------------------------------------- */

/* One weight row (its bytes q, its scales) against M input rows (stride lda): their products.
 * int4: xa is the rows' whole groups quantized (s_quantize_x). */
static void s_row_plain(const op_quant_dims *d, const float *x, int64_t lda, const s_xpair *xa, const uint8_t *q,
                        const float *scale, float *sums)
{
    int64_t whole = d->K / OP_QUANT_GROUP, pairs = s_xblocks(d, 2);
    for (int64_t m = 0; m < d->M; m++) {
        const float *xm = x + m * lda;
        float total = 0.0f;
        if (d->bits == 8) {
            for (int64_t k = 0; k < d->K; k++)
                total += xm[k] * (float)op_quant_int8(q, k);
            total *= scale[0];
        } else {
            for (int64_t g = 0; g < whole; g++) {
                const s_xpair *pr = xa + m * pairs + g / 2;
                int half = (int)(g % 2);
                int32_t dot = 0;
                for (int j = 0; j < OP_QUANT_GROUP / 2; j++)
                    dot += op_quant_int4(q, g * OP_QUANT_GROUP + 2 * j) * pr->lo[half * 16 + j] +
                           op_quant_int4(q, g * OP_QUANT_GROUP + 2 * j + 1) * pr->hi[half * 16 + j];
                total += (float)dot * (scale[g] * pr->xs[half * 4]);
            }
            float tail = 0.0f;
            for (int64_t k = whole * OP_QUANT_GROUP; k < d->K; k++)
                tail += xm[k] * (float)op_quant_int4(q, k);
            if (whole < d->groups)
                total += tail * scale[whole];
        }
        sums[m] = total;
    }
}

/* ---- AVX2 ------------------------------------------------------------------------------------ */

#if defined(__x86_64__)
#include <immintrin.h>
#define S_AVX2 __attribute__((target("avx2,fma")))
/* the loops over a row's accumulators unroll whole, so they stay in registers */
#define S_UNROLL _Pragma("GCC unroll 8")

S_AVX2 static inline float s_hsum128(__m128 x)
{
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}

S_AVX2 static inline float s_hsum(__m256 v)
{
    return s_hsum128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

S_AVX2 static void s_round_avx2(const float *xg, float *amax, int32_t *v)
{
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 x[4], top = _mm256_setzero_ps();
    int nan = 0;
    for (int i = 0; i < 4; i++) {
        x[i] = _mm256_loadu_ps(xg + 8 * i);
        top = _mm256_max_ps(top, _mm256_and_ps(x[i], magnitude));
        nan |= _mm256_movemask_ps(_mm256_cmp_ps(x[i], x[i], _CMP_UNORD_Q)); /* max_ps passes NaNs over */
    }
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    float m = nan ? NAN : _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
    float inv = m > 0.0f && isfinite(m) ? 127.0f / m : 0.0f;
    for (int i = 0; i < 4; i++) /* rounds to nearest even, as lrintf in the default mode */
        _mm256_storeu_si256((__m256i *)(v + 8 * i), inv > 0.0f ? _mm256_cvtps_epi32(_mm256_mul_ps(x[i], _mm256_set1_ps(inv)))
                                                              : _mm256_setzero_si256());
    *amax = m;
}

/* 8 int8 weights widened to float32 */
S_AVX2 static inline __m256 s_widen8(const uint8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* One int8 weight row against M rows of x (M a constant where this is inlined). The weight is read
 * one row after another, a single sequential stream: two rows read side by side (even adjacent
 * ones of 768 bytes) halve what the hardware prefetcher delivers here, so x's loads are not shared
 * across weight rows; instead U steps of 8 features are in flight per x row (M * U >= 4
 * independent multiply-add chains), and the loop runs at about the bytes memory delivers. */
S_AVX2 static inline __attribute__((always_inline)) void s_row_int8(int M, const op_quant_dims *d, const float *x,
                                                                    const uint8_t *q, const float *scale,
                                                                    float *sums)
{
    const int64_t lda = d->K_x;
    const int U = M == 1 ? 4 : M == 2 ? 2 : 1;
    __m256 acc[S_FEW_ROWS * 4];
    S_UNROLL for (int i = 0; i < M * U; i++)
        acc[i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 * U <= d->K; k += 8 * U)
        S_UNROLL for (int u = 0; u < U; u++) {
            __m256 w = s_widen8(q + k + 8 * u);
            S_UNROLL for (int m = 0; m < M; m++)
                acc[m * U + u] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * lda + k + 8 * u), w, acc[m * U + u]);
        }
    for (; k + 8 <= d->K; k += 8) {
        __m256 w = s_widen8(q + k);
        S_UNROLL for (int m = 0; m < M; m++)
            acc[m * U] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * lda + k), w, acc[m * U]);
    }
    S_UNROLL for (int m = 0; m < M; m++) {
        S_UNROLL for (int u = 1; u < U; u++)
            acc[m * U] = _mm256_add_ps(acc[m * U], acc[m * U + u]);
        float s = s_hsum(acc[m * U]);
        for (int64_t t = k; t < d->K; t++)
            s += x[m * lda + t] * (float)op_quant_int8(q, t);
        sums[m] = s * scale[0];
    }
}

/* One int4 weight row against M rows of x quantized into xa: two groups (32 bytes) at a time, the
 * nibbles XOR 8 (u = w + 8, unsigned, as maddubs wants them) split into the even and odd features'
 * bytes, each multiplied by the input's bytes and summed in pairs (15 * 127 * 2 * 2 fits 16 bits),
 * then in fours into 32 bits (lanes 0-3 the first group, 4-7 the second), less c, converted and
 * scaled by the input's and the weight's group scales. */
S_AVX2 static inline __attribute__((always_inline)) void s_row_int4(int M, const op_quant_dims *d, const float *x,
                                                                    const s_xpair *xa, const uint8_t *q,
                                                                    const float *scale, float *sums)
{
    const int64_t whole = d->K / OP_QUANT_GROUP, pairs = s_xblocks(d, 2), full = whole / 2;
    const __m256i low = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8((char)0x88), ones = _mm256_set1_epi16(1);
    const __m256i twice = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m256 acc[S_FEW_ROWS];
    S_UNROLL for (int m = 0; m < M; m++)
        acc[m] = _mm256_setzero_ps();
    for (int64_t p = 0; p < full; p++) {
        __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + 32 * p)), flip);
        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        __m128 two = _mm_castpd_ps(_mm_load_sd((const double *)(scale + 2 * p)));
        __m256 ws = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), twice);
        S_UNROLL for (int m = 0; m < M; m++) {
            const s_xpair *pr = xa + m * pairs + p;
            __m256i dot = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)pr->lo)),
                                           _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)pr->hi)));
            __m256i sum = _mm256_sub_epi32(_mm256_madd_epi16(dot, ones), _mm256_loadu_si256((const __m256i *)pr->c));
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(ws, _mm256_loadu_ps(pr->xs)), acc[m]);
        }
    }
    float odd[S_FEW_ROWS] = {0};
    if (whole % 2) { /* the last whole group alone: the same in 128 bits */
        __m128i v = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(q + 32 * full)), _mm256_castsi256_si128(flip));
        __m128i lo = _mm_and_si128(v, _mm256_castsi256_si128(low));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm256_castsi256_si128(low));
        __m128 ws = _mm_broadcast_ss(scale + 2 * full);
        S_UNROLL for (int m = 0; m < M; m++) {
            const s_xpair *pr = xa + m * pairs + full;
            __m128i dot = _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128((const __m128i *)pr->lo)),
                                        _mm_maddubs_epi16(hi, _mm_loadu_si128((const __m128i *)pr->hi)));
            __m128i sum = _mm_sub_epi32(_mm_madd_epi16(dot, _mm256_castsi256_si128(ones)),
                                        _mm_loadu_si128((const __m128i *)pr->c));
            odd[m] = s_hsum128(_mm_mul_ps(_mm_cvtepi32_ps(sum), _mm_mul_ps(ws, _mm_loadu_ps(pr->xs))));
        }
    }
    const int64_t k = whole * OP_QUANT_GROUP;
    S_UNROLL for (int m = 0; m < M; m++) {
        float tail = 0.0f;
        for (int64_t t = k; t < d->K; t++)
            tail += x[m * d->K_x + t] * (float)op_quant_int4(q, t);
        sums[m] = s_hsum(acc[m]) + odd[m] + (k < d->K ? tail * scale[whole] : 0.0f);
    }
}

/* Weight rows [n0, n1) against M (a constant) rows of x through the kernels ROW8 and ROW4; xa:
 * those rows quantized (int4). */
#define S_FEW_ROWS_CASE(M, ROW8, ROW4)                                                                            \
    case M:                                                                                                       \
        for (int64_t n = n0; n < n1; n++) {                                                                       \
            const uint8_t *qn = q + n * d->row_bytes;                                                             \
            if (d->bits == 8)                                                                                     \
                ROW8(M, d, x, qn, scale + n, sums);                                                               \
            else                                                                                                  \
                ROW4(M, d, x, xa, qn, scale + n * d->groups, sums);                                               \
            for (int m = 0; m < M; m++)                                                                           \
                out[m * d->N + n] = sums[m] + (bias ? bias[n] : 0.0f);                                            \
        }                                                                                                         \
        break;
#define S_FEW_ROWS_SWITCH(ROW8, ROW4)                                                                             \
    switch (d->M) {                                                                                               \
        S_FEW_ROWS_CASE(1, ROW8, ROW4) S_FEW_ROWS_CASE(2, ROW8, ROW4) S_FEW_ROWS_CASE(3, ROW8, ROW4)              \
        S_FEW_ROWS_CASE(4, ROW8, ROW4) S_FEW_ROWS_CASE(5, ROW8, ROW4) S_FEW_ROWS_CASE(6, ROW8, ROW4)              \
        S_FEW_ROWS_CASE(7, ROW8, ROW4) S_FEW_ROWS_CASE(8, ROW8, ROW4)                                             \
    }

/* Weight rows [n0, n1) against d->M <= S_FEW_ROWS rows of x (out's rows of stride d->N). */
S_AVX2 static void s_few_rows_avx2(const op_quant_dims *d, const float *x, const s_xpair *xa, const uint8_t *q,
                                   const float *scale, const float *bias, float *out, int64_t n0, int64_t n1)
{
    float sums[S_FEW_ROWS];
    S_FEW_ROWS_SWITCH(s_row_int8, s_row_int4)
}

/* ---- AVX-512 (with VNNI) ------------------------------------------------------------------- */

#define S_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
/* Bytes of weight asked for ahead of the loads: these kernels consume a row's bytes faster than the
 * hardware prefetcher brings them from memory (bench_matmul's 110M decode step on one core, int8:
 * 14.5-15.5 ms without, 9.0-9.2 with 2 KiB; int4: 7.4-7.7 ms, 5.0-6.2; 512 B to 8 KiB measured) */
#define S_AHEAD 2048

/* One int8 weight row against M rows of x, as s_row_int8 with 16 weights a step. */
S_AVX512 static inline __attribute__((always_inline)) void s_row_int8_512(int M, const op_quant_dims *d,
                                                                          const float *x, const uint8_t *q,
                                                                          const float *scale, float *sums)
{
    const int64_t lda = d->K_x;
    const int U = M == 1 ? 4 : M == 2 ? 2 : 1;
    __m512 acc[S_FEW_ROWS * 4];
    S_UNROLL for (int i = 0; i < M * U; i++)
        acc[i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 * U <= d->K; k += 16 * U) {
        _mm_prefetch((const char *)q + k + S_AHEAD, _MM_HINT_T0);
        S_UNROLL for (int u = 0; u < U; u++) {
            __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + k + 16 * u))));
            S_UNROLL for (int m = 0; m < M; m++)
                acc[m * U + u] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * lda + k + 16 * u), w, acc[m * U + u]);
        }
    }
    for (; k + 16 <= d->K; k += 16) {
        __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + k))));
        S_UNROLL for (int m = 0; m < M; m++)
            acc[m * U] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * lda + k), w, acc[m * U]);
    }
    S_UNROLL for (int m = 0; m < M; m++) {
        S_UNROLL for (int u = 1; u < U; u++)
            acc[m * U] = _mm512_add_ps(acc[m * U], acc[m * U + u]);
        float s = _mm512_reduce_add_ps(acc[m * U]);
        for (int64_t t = k; t < d->K; t++)
            s += x[m * lda + t] * (float)op_quant_int8(q, t);
        sums[m] = s * scale[0];
    }
}

/* One int4 weight row against M rows of x quantized into xa (blocks of 4 groups, s_xquad): four
 * groups (64 bytes) a step, the nibbles XOR 8 split into the even and odd features' bytes as in
 * s_row_int4, and each multiplied by the input's bytes and summed in fours into 32 bits by one
 * VNNI instruction (lanes 0-3 the first group, ..., 12-15 the fourth), less c, converted and scaled
 * by the input's and the weight's group scales. A last block of fewer groups reads only their bytes
 * and scales (masked); its x block is zeros past them. */
S_AVX512 static inline __attribute__((always_inline)) void s_row_int4_512(int M, const op_quant_dims *d,
                                                                          const float *x, const s_xquad *xa,
                                                                          const uint8_t *q, const float *scale,
                                                                          float *sums)
{
    const int64_t whole = d->K / OP_QUANT_GROUP, blocks = s_xblocks(d, 4);
    const __m512i low = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x88);
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[S_FEW_ROWS];
    S_UNROLL for (int m = 0; m < M; m++)
        acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        _mm_prefetch((const char *)q + 64 * b + S_AHEAD, _MM_HINT_T0);
        int64_t left = whole - 4 * b;
        __mmask64 bytes = left >= 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * left)) - 1);
        __mmask16 groups = left >= 4 ? 0xf : (__mmask16)((1u << left) - 1);
        __m512i v = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes, q + 64 * b), flip);
        __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        __m512 ws = _mm512_permutexvar_ps(quarter, _mm512_castps128_ps512(_mm_maskz_loadu_ps(groups, scale + 4 * b)));
        S_UNROLL for (int m = 0; m < M; m++) {
            const s_xquad *xb = xa + m * blocks + b;
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xb->lo));
            dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(xb->hi));
            __m512i sum = _mm512_sub_epi32(dot, _mm512_loadu_si512(xb->c));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(ws, _mm512_loadu_ps(xb->xs)), acc[m]);
        }
    }
    const int64_t k = whole * OP_QUANT_GROUP;
    S_UNROLL for (int m = 0; m < M; m++) {
        float tail = 0.0f;
        for (int64_t t = k; t < d->K; t++)
            tail += x[m * d->K_x + t] * (float)op_quant_int4(q, t);
        sums[m] = _mm512_reduce_add_ps(acc[m]) + (k < d->K ? tail * scale[whole] : 0.0f);
    }
}

/* Weight rows [n0, n1) against d->M <= S_FEW_ROWS rows of x (out's rows of stride d->N). */
S_AVX512 static void s_few_rows_avx512(const op_quant_dims *d, const float *x, const s_xquad *xa, const uint8_t *q,
                                       const float *scale, const float *bias, float *out, int64_t n0, int64_t n1)
{
    float sums[S_FEW_ROWS];
    S_FEW_ROWS_SWITCH(s_row_int8_512, s_row_int4_512)
}

#endif

/* Whether the AVX-512 VNNI kernels run here (asked once at run time; DTORCH_QUANT_AVX512=0 keeps
 * AVX2's). */
static pthread_once_t s_avx512_once = PTHREAD_ONCE_INIT;
static bool s_avx512_have;

static void s_avx512_ask(void)
{
#if defined(__x86_64__)
    const char *env = getenv("DTORCH_QUANT_AVX512");
    s_avx512_have = !(env && strcmp(env, "0") == 0) && __builtin_cpu_supports("avx512f") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512vnni");
#endif
}

static bool s_avx512(void)
{
    pthread_once(&s_avx512_once, s_avx512_ask);
    return s_avx512_have;
}

/* groups per block of quantized x: what the kernel that runs here reads */
static int s_width(void) { return s_avx512() ? 4 : 2; }

static s_round_fn *s_round_best(void)
{
#if defined(__x86_64__)
    if (cpu_has_avx2_fma())
        return s_round_avx2;
#endif
    return s_round_plain;
}

/* ---- few rows: the weight streamed once ------------------------------------------------------ */

/* Weight rows [n0, n1) against d->M <= S_FEW_ROWS rows of x; xa: those rows quantized (int4), in
 * blocks of s_width() groups. */
static void s_rows(const op_quant_dims *d, const float *x, const void *xa, const uint8_t *q, const float *scale,
                   const float *bias, float *out, int64_t n0, int64_t n1)
{
#if defined(__x86_64__)
    if (s_avx512()) {
        s_few_rows_avx512(d, x, xa, q, scale, bias, out, n0, n1);
        return;
    }
    if (cpu_has_avx2_fma()) {
        s_few_rows_avx2(d, x, xa, q, scale, bias, out, n0, n1);
        return;
    }
#endif
    float sums[S_FEW_ROWS];
    for (int64_t n = n0; n < n1; n++) {
        s_row_plain(d, x, d->K_x, xa, q + n * d->row_bytes, scale + n * d->groups, sums);
        for (int64_t m = 0; m < d->M; m++)
            out[m * d->N + n] = sums[m] + (bias ? bias[n] : 0.0f);
    }
}

/* Every row of x, S_FEW_ROWS at a time: with nb the whole of N, the weight is streamed once per
 * S_FEW_ROWS rows (decode); with a block of nb weight rows, the block is read from memory once and
 * from L1 by each group of rows (a prompt). xa: x's rows quantized (int4), or NULL. */
static void s_row_groups(const op_quant_dims *d, const float *x, const void *xa, const uint8_t *q,
                         const float *scale, const float *bias, float *out, int64_t nb)
{
    const int W = s_width();
    for (int64_t n0 = 0; n0 < d->N; n0 += nb) {
        int64_t n1 = d->N - n0 < nb ? d->N : n0 + nb;
        for (int64_t m0 = 0; m0 < d->M; m0 += S_FEW_ROWS) {
            op_quant_dims part = *d;
            part.M = d->M - m0 < S_FEW_ROWS ? d->M - m0 : S_FEW_ROWS;
            const void *xm = xa ? (const char *)xa + (size_t)(m0 * s_xblocks(d, W)) * S_XBLOCK(W) : NULL;
            s_rows(&part, x + m0 * d->K_x, xm, q, scale, bias, out + m0 * d->N, n0, n1);
        }
    }
}

/* ---- int8, more rows: blocks of dequantized rows through sgemm ------------------------------- */

static void s_dequantize_plain(const uint8_t *q, float scale, int64_t K, float *w)
{
    for (int64_t k = 0; k < K; k++)
        w[k] = (float)op_quant_int8(q, k) * scale;
}

#if defined(__x86_64__)
S_AVX2 static void s_dequantize_avx2(const uint8_t *q, float scale, int64_t K, float *w)
{
    __m256 s = _mm256_set1_ps(scale);
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        _mm256_storeu_ps(w + k, _mm256_mul_ps(s_widen8(q + k), s));
    s_dequantize_plain(q + k, scale, K - k, w + k);
}
#endif

/* rows int8 weight rows into float32 (rows x K) */
static void s_dequantize_rows(const op_quant_dims *d, const uint8_t *q, const float *scale, int64_t rows, float *w)
{
    void (*row_fn)(const uint8_t *, float, int64_t, float *) = s_dequantize_plain;
#if defined(__x86_64__)
    if (cpu_has_avx2_fma())
        row_fn = s_dequantize_avx2;
#endif
    for (int64_t r = 0; r < rows; r++)
        row_fn(q + r * d->row_bytes, scale[r], d->K, w + r * d->K);
}

static const char *s_blocks(const op_quant_dims *d, const float *x, const uint8_t *q, const float *scale,
                            const float *bias, float *out)
{
    float *w = malloc((size_t)S_BLOCK_ROWS * (size_t)d->K * sizeof *w);
    if (!w)
        return "out of memory on the device";
    for (int64_t n0 = 0; n0 < d->N; n0 += S_BLOCK_ROWS) {
        int64_t rows = d->N - n0 < S_BLOCK_ROWS ? d->N - n0 : S_BLOCK_ROWS;
        s_dequantize_rows(d, q + n0 * d->row_bytes, scale + n0 * d->groups, rows, w);
        cpu_sgemm(true, d->M, rows, d->K, 1.0f, x, d->K_x, w, d->K, 0.0f, out + n0, d->N);
    }
    free(w);
    if (bias)
        for (int64_t m = 0; m < d->M; m++)
            for (int64_t n = 0; n < d->N; n++)
                out[m * d->N + n] += bias[n];
    return NULL;
}

const char *cpu_quant_linear(const op_quant_dims *d, const float *x, const uint8_t *q, const float *scale,
                             const float *bias, float *out)
{
    if (d->M == 0 || d->N == 0)
        return NULL;
    if (d->K == 0) {
        for (int64_t i = 0; i < d->M * d->N; i++)
            out[i] = bias ? bias[i % d->N] : 0.0f;
        return NULL;
    }
    if (d->bits == 4) {
        void *xa = NULL;
        const int W = s_width();
        if (d->K >= OP_QUANT_GROUP) { /* x's rows quantized once: half x's bytes, beside a weight read once */
            size_t per_row = (size_t)s_xblocks(d, W) * S_XBLOCK(W), bytes = (size_t)d->M * per_row;
            if (bytes / per_row != (size_t)d->M || !(xa = malloc(bytes)))
                return "out of memory on the device";
            s_quantize_x(d, x, xa, W, s_round_best());
        }
        s_row_groups(d, x, xa, q, scale, bias, out, d->M <= S_FEW_ROWS ? d->N : S_INT4_BLOCK);
        free(xa);
        return NULL;
    }
    /* sgemm takes int sizes: larger pieces go through the streaming path */
    if (d->M <= S_FEW_ROWS || d->K > INT32_MAX || d->K_x > INT32_MAX || d->N > INT32_MAX || d->M > INT32_MAX) {
        s_row_groups(d, x, NULL, q, scale, bias, out, d->N);
        return NULL;
    }
    return s_blocks(d, x, q, scale, bias, out);
}

static const char *s_linear(op_kernel *k)
{
    op_quant_dims d;
    const char *why = op_quant_layout(k, &d);
    if (why)
        return why;
    return cpu_quant_linear(&d, (const float *)k->in[0].data + d.k0, k->in[1].data, k->in[2].data,
                            d.bias ? k->in[3].data : NULL, k->out[0].data);
}

const char *cpu_k_linear_int8(op_kernel *k) { return s_linear(k); }
const char *cpu_k_linear_int4(op_kernel *k) { return s_linear(k); }
