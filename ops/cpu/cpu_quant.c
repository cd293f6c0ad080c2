/* cpu_quant — the CPU kernels of the products with quantized weights (linear_int8, linear_int4;
 * ops/op_quant.c reads their pieces).
 *
 * Decode's few rows (up to S_FEW_ROWS) stream the weight's bytes once, row after row, and
 * widen them to float32 in registers: the cost is the quantized bytes, a quarter (int8) or an
 * eighth (int4) of float32's. More rows dequantize a block of weight rows into float32 at a time
 * and hand it to sgemm, so no float copy of the whole weight is ever made. AVX2 and FMA are taken
 * where the CPU has them (asked at run time); a portable loop does the same work elsewhere. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_matmul.h"
#include "cpu_ops.h"
#include "op_quant.h"

#define S_FEW_ROWS 8     /* rows of A that stream the quantized weight (their accumulators fit the registers) */
#define S_BLOCK_ROWS 64 /* weight rows dequantized per sgemm */

/* ---- the portable path ----------------------------------------------------------------------- */

/* One weight row (its bytes q, its scales) against M input rows (stride lda): their products. */
static void s_row_plain(const op_quant_dims *d, const float *x, int64_t lda, const uint8_t *q, const float *scale,
                        float *sums)
{
    for (int64_t m = 0; m < d->M; m++) {
        const float *xm = x + m * lda;
        float total = 0.0f;
        if (d->bits == 8) {
            for (int64_t k = 0; k < d->K; k++)
                total += xm[k] * (float)op_quant_int8(q, k);
            total *= scale[0];
        } else {
            for (int64_t g = 0; g < d->groups; g++) {
                int64_t end = (g + 1) * OP_QUANT_GROUP < d->K ? (g + 1) * OP_QUANT_GROUP : d->K;
                float part = 0.0f;
                for (int64_t k = g * OP_QUANT_GROUP; k < end; k++)
                    part += xm[k] * (float)op_quant_int4(q, k);
                total += part * scale[g];
            }
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

S_AVX2 static inline float s_hsum(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}

/* 8 int8 weights widened to float32 */
S_AVX2 static inline __m256 s_widen8(const uint8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* One weight row against M rows of x (M a constant where this is inlined). The weight is read
 * one row after another, a single sequential stream: two rows read side by side (even adjacent
 * ones of 768 bytes) halve what the hardware prefetcher delivers here, so x's loads are not shared
 * across weight rows; instead int8 keeps U steps of 8 features in flight per x row (M * U >= 4
 * independent multiply-add chains), and the loop runs at about the bytes memory delivers.
 *
 * int4: xp holds x regrouped so the nibbles need no reordering: per 32-feature group, the even
 * features of its first 16, their odd ones, then the same for its last 16 (a byte's low nibble is
 * the even feature, its high one the odd); and xc per group the vector -8 * (sum of its four xp
 * vectors). A nibble holds w in two's complement, so u = nibble ^ 8 (one xor flips a byte's two)
 * is w + 8 in [0, 15], and the -8 costs nothing per weight: x . w = x . u + xc. */
S_AVX2 static inline __attribute__((always_inline)) void s_row_avx2(int M, const op_quant_dims *d, const float *x,
                                                                    const float *xp, const float *xc,
                                                                    const uint8_t *q, const float *scale, float *sums)
{
    const int64_t lda = d->K_x;
    if (d->bits == 8) {
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
        return;
    }
    __m256 acc[S_FEW_ROWS];
    S_UNROLL for (int m = 0; m < M; m++)
        acc[m] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi32(0x0f);
    const __m128i flip = _mm_set1_epi8((char)0x88);
    const int64_t whole = d->K / OP_QUANT_GROUP;
    for (int64_t g = 0; g < whole; g++) {
        const uint8_t *qg = q + g * (OP_QUANT_GROUP / 2);
        __m256i b0 = _mm256_cvtepu8_epi32(_mm_xor_si128(_mm_loadl_epi64((const __m128i *)qg), flip));
        __m256i b1 = _mm256_cvtepu8_epi32(_mm_xor_si128(_mm_loadl_epi64((const __m128i *)(qg + 8)), flip));
        __m256 u0 = _mm256_cvtepi32_ps(_mm256_and_si256(b0, low)), u1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4));
        __m256 u2 = _mm256_cvtepi32_ps(_mm256_and_si256(b1, low)), u3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4));
        __m256 sc = _mm256_broadcast_ss(scale + g);
        S_UNROLL for (int m = 0; m < M; m++) {
            const float *xg = xp + (m * whole + g) * OP_QUANT_GROUP;
            /* two short chains, not one of four */
            __m256 t0 = _mm256_fmadd_ps(_mm256_loadu_ps(xg), u0, _mm256_loadu_ps(xc + (m * whole + g) * 8));
            __m256 t1 = _mm256_mul_ps(_mm256_loadu_ps(xg + 8), u1);
            t0 = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), u2, t0);
            t1 = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), u3, t1);
            acc[m] = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), sc, acc[m]);
        }
    }
    const int64_t k = whole * OP_QUANT_GROUP;
    S_UNROLL for (int m = 0; m < M; m++) {
        float tail = 0.0f;
        for (int64_t t = k; t < d->K; t++)
            tail += x[m * lda + t] * (float)op_quant_int4(q, t);
        sums[m] = s_hsum(acc[m]) + (k < d->K ? tail * scale[whole] : 0.0f);
    }
}

/* int4's x regrouped (see s_row_avx2) into xp (M * whole groups * 32) and xc (M * whole * 8). */
S_AVX2 static void s_regroup_x(const op_quant_dims *d, const float *x, float *xp, float *xc)
{
    int64_t whole = d->K / OP_QUANT_GROUP;
    for (int64_t m = 0; m < d->M; m++)
        for (int64_t g = 0; g < whole; g++) {
            const float *xg = x + m * d->K_x + g * OP_QUANT_GROUP;
            float *pg = xp + (m * whole + g) * OP_QUANT_GROUP;
            for (int half = 0; half < 2; half++)
                for (int j = 0; j < 8; j++) {
                    pg[half * 16 + j] = xg[half * 16 + 2 * j];
                    pg[half * 16 + 8 + j] = xg[half * 16 + 2 * j + 1];
                }
            __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(pg), _mm256_loadu_ps(pg + 8)),
                                     _mm256_add_ps(_mm256_loadu_ps(pg + 16), _mm256_loadu_ps(pg + 24)));
            _mm256_storeu_ps(xc + (m * whole + g) * 8, _mm256_mul_ps(s, _mm256_set1_ps(-8.0f)));
        }
}

#define S_CASE(M)                                                                                                 \
    case M:                                                                                                       \
        for (int64_t n = 0; n < d->N; n++) {                                                                      \
            s_row_avx2(M, d, x, xp, xc, q + n * d->row_bytes, scale + n * d->groups, sums);                       \
            for (int m = 0; m < M; m++)                                                                           \
                out[m * d->N + n] = sums[m] + (bias ? bias[n] : 0.0f);                                            \
        }                                                                                                         \
        break;
/* The weight streamed once for d->M <= S_FEW_ROWS rows of x. */
S_AVX2 static void s_few_rows_avx2(const op_quant_dims *d, const float *x, const float *xp, const float *xc,
                                   const uint8_t *q, const float *scale, const float *bias, float *out)
{
    float sums[S_FEW_ROWS];
    switch (d->M) { S_CASE(1) S_CASE(2) S_CASE(3) S_CASE(4) S_CASE(5) S_CASE(6) S_CASE(7) S_CASE(8) }
}
#undef S_CASE

static bool s_has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

/* ---- few rows: the weight streamed once ------------------------------------------------------ */

static const char *s_few_rows(const op_quant_dims *d, const float *x, const uint8_t *q, const float *scale,
                              const float *bias, float *out)
{
#if defined(__x86_64__)
    if (s_has_avx2()) {
        int64_t whole = d->bits == 4 ? d->K / OP_QUANT_GROUP : 0;
        float *xp = NULL, *xc = NULL;
        if (whole) {
            /* a few rows of x, regrouped: small next to the weight every call streams */
            if (!(xp = malloc((size_t)(d->M * whole) * (OP_QUANT_GROUP + 8) * sizeof *xp)))
                return "out of memory on the device";
            xc = xp + d->M * whole * OP_QUANT_GROUP;
            s_regroup_x(d, x, xp, xc);
        }
        s_few_rows_avx2(d, x, xp, xc, q, scale, bias, out);
        free(xp);
        return NULL;
    }
#endif
    float sums[S_FEW_ROWS];
    for (int64_t n = 0; n < d->N; n++) {
        s_row_plain(d, x, d->K_x, q + n * d->row_bytes, scale + n * d->groups, sums);
        for (int64_t m = 0; m < d->M; m++)
            out[m * d->N + n] = sums[m] + (bias ? bias[n] : 0.0f);
    }
    return NULL;
}

/* ---- more rows: blocks of dequantized rows through sgemm ------------------------------------- */

static void s_dequantize_rows(const op_quant_dims *d, const uint8_t *q, const float *scale, int64_t rows, float *w)
{
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = q + r * d->row_bytes;
        const float *sc = scale + r * d->groups;
        float *wr = w + r * d->K;
        if (d->bits == 8)
            for (int64_t k = 0; k < d->K; k++)
                wr[k] = (float)op_quant_int8(row, k) * sc[0];
        else
            for (int64_t k = 0; k < d->K; k++)
                wr[k] = (float)op_quant_int4(row, k) * sc[k / OP_QUANT_GROUP];
    }
}

static const char *s_blocks(const op_quant_dims *d, const float *x, const uint8_t *q, const float *scale,
                            const float *bias, float *out)
{
    cpu_blas_threads();
    float *w = malloc((size_t)S_BLOCK_ROWS * (size_t)d->K * sizeof *w);
    if (!w)
        return "out of memory on the device";
    for (int64_t n0 = 0; n0 < d->N; n0 += S_BLOCK_ROWS) {
        int64_t rows = d->N - n0 < S_BLOCK_ROWS ? d->N - n0 : S_BLOCK_ROWS;
        s_dequantize_rows(d, q + n0 * d->row_bytes, scale + n0 * d->groups, rows, w);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)d->M, (int)rows, (int)d->K, 1.0f, x, (int)d->K_x, w,
                    (int)d->K, 0.0f, out + n0, (int)d->N);
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
    /* sgemm takes int sizes: larger pieces go row by row through the streaming path */
    if (d->M <= S_FEW_ROWS || d->K > INT32_MAX || d->K_x > INT32_MAX || d->N > INT32_MAX || d->M > INT32_MAX) {
        for (int64_t m0 = 0; m0 < d->M; m0 += S_FEW_ROWS) {
            op_quant_dims part = *d;
            part.M = d->M - m0 < S_FEW_ROWS ? d->M - m0 : S_FEW_ROWS;
            const char *why = s_few_rows(&part, x + m0 * d->K_x, q, scale, bias, out + m0 * d->N);
            if (why)
                return why;
        }
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
