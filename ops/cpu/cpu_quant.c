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

S_AVX2 static inline float s_hsum(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}

/* 8 signed bytes widened to float32 */
S_AVX2 static inline __m256 s_widen8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

/* One weight row against M rows of x; M is a constant where it is inlined, so the accumulators
 * stay in registers. The tail past the last whole vector (group, for int4) is added one by one. */
S_AVX2 static inline __attribute__((always_inline)) void s_row_avx2(int M, const op_quant_dims *d, const float *x,
                                                                    int64_t lda, const uint8_t *q,
                                                                    const float *scale, float *sums)
{
    __m256 acc[S_FEW_ROWS];
    for (int m = 0; m < M; m++)
        acc[m] = _mm256_setzero_ps();
    int64_t k = 0;
    float tail[S_FEW_ROWS] = {0};
    if (d->bits == 8) {
        for (; k + 16 <= d->K; k += 16) {
            __m128i b = _mm_loadu_si128((const __m128i *)(q + k));
            __m256 w0 = s_widen8(b), w1 = s_widen8(_mm_srli_si128(b, 8));
            for (int m = 0; m < M; m++) {
                acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * lda + k), w0, acc[m]);
                acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * lda + k + 8), w1, acc[m]);
            }
        }
        for (int m = 0; m < M; m++) {
            float s = s_hsum(acc[m]);
            for (int64_t t = k; t < d->K; t++)
                s += x[m * lda + t] * (float)op_quant_int8(q, t);
            sums[m] = s * scale[0];
        }
        return;
    }
    const __m128i low = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    for (; k + OP_QUANT_GROUP <= d->K; k += OP_QUANT_GROUP) {
        __m128i b = _mm_loadu_si128((const __m128i *)(q + k / 2));
        __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
        /* features k..k+15 and k+16..k+31 in order, each nibble sign-extended: (v ^ 8) - 8 */
        __m128i v0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
        __m128i v1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
        __m256 w[4] = {s_widen8(v0), s_widen8(_mm_srli_si128(v0, 8)), s_widen8(v1), s_widen8(_mm_srli_si128(v1, 8))};
        __m256 sc = _mm256_set1_ps(scale[k / OP_QUANT_GROUP]);
        for (int m = 0; m < M; m++) {
            const float *xm = x + m * lda + k;
            __m256 g = _mm256_mul_ps(_mm256_loadu_ps(xm), w[0]);
            g = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 8), w[1], g);
            g = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 16), w[2], g);
            g = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 24), w[3], g);
            acc[m] = _mm256_fmadd_ps(g, sc, acc[m]);
        }
    }
    for (int m = 0; m < M; m++) {
        for (int64_t t = k; t < d->K; t++)
            tail[m] += x[m * lda + t] * (float)op_quant_int4(q, t);
        sums[m] = s_hsum(acc[m]) + (k < d->K ? tail[m] * scale[k / OP_QUANT_GROUP] : 0.0f);
    }
}

#define S_CASE(M)                                                                                                 \
    case M:                                                                                                       \
        s_row_avx2(M, d, x, lda, q, scale, sums);                                                                 \
        break;
S_AVX2 static void s_row_avx2_any(const op_quant_dims *d, const float *x, int64_t lda, const uint8_t *q,
                                  const float *scale, float *sums)
{
    switch (d->M) { S_CASE(1) S_CASE(2) S_CASE(3) S_CASE(4) S_CASE(5) S_CASE(6) S_CASE(7) S_CASE(8) }
}
#undef S_CASE

static bool s_has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

/* ---- few rows: the weight streamed once ------------------------------------------------------ */

static void s_few_rows(const op_quant_dims *d, const float *x, const uint8_t *q, const float *scale,
                       const float *bias, float *out)
{
    void (*row)(const op_quant_dims *, const float *, int64_t, const uint8_t *, const float *, float *) = s_row_plain;
#if defined(__x86_64__)
    if (s_has_avx2())
        row = s_row_avx2_any;
#endif
    float sums[S_FEW_ROWS];
    for (int64_t n = 0; n < d->N; n++) {
        row(d, x, d->K_x, q + n * d->row_bytes, scale + n * d->groups, sums);
        for (int64_t m = 0; m < d->M; m++)
            out[m * d->N + n] = sums[m] + (bias ? bias[n] : 0.0f);
    }
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

static const char *s_linear(op_kernel *k)
{
    op_quant_dims d;
    const char *why = op_quant_layout(k, &d);
    if (why)
        return why;
    const float *x = (const float *)k->in[0].data + d.k0, *scale = k->in[2].data;
    const float *bias = d.bias ? k->in[3].data : NULL;
    const uint8_t *q = k->in[1].data;
    float *out = k->out[0].data;
    if (d.M == 0 || d.N == 0)
        return NULL;
    if (d.K == 0) {
        for (int64_t i = 0; i < d.M * d.N; i++)
            out[i] = bias ? bias[i % d.N] : 0.0f;
        return NULL;
    }
    /* sgemm takes int sizes: larger pieces go row by row through the streaming path */
    if (d.M <= S_FEW_ROWS || d.K > INT32_MAX || d.K_x > INT32_MAX || d.N > INT32_MAX || d.M > INT32_MAX) {
        for (int64_t m0 = 0; m0 < d.M; m0 += S_FEW_ROWS) {
            op_quant_dims part = d;
            part.M = d.M - m0 < S_FEW_ROWS ? d.M - m0 : S_FEW_ROWS;
            s_few_rows(&part, x + m0 * d.K_x, q, scale, bias, out + m0 * d.N);
        }
        return NULL;
    }
    return s_blocks(&d, x, q, scale, bias, out);
}

const char *cpu_k_linear_int8(op_kernel *k) { return s_linear(k); }
const char *cpu_k_linear_int4(op_kernel *k) { return s_linear(k); }
