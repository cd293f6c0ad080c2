/* cpu_matmul — the CPU kernels of the products: batched float32 products through cpu_gemm and
 * int64 ones by loops, a weight-streaming kernel for decode's few rows, one attention head, the embedding row gather, and the kernels of the
 * matmul family's ops (OP_MATMUL) that convert pieces into them. */
#include "cpu_matmul.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm.h"
#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "cpu_reduce_loops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

/* ---- products -------------------------------------------------------------------------------- */

static void s_gemm_f32(int64_t M, int64_t N, int64_t K, const float *a, const float *b, bool b_trans, bool accumulate,
                       float *c)
{
    /* up to CPU_SKINNY_MAX_M rows the weight-streaming kernel beats sgemm, which packs the whole
     * weight first (bench_matmul's decode shapes: 1.0-3x at 3-16 rows); beyond, sgemm's blocking
     * wins */
    if (b_trans && M <= CPU_SKINNY_MAX_M) {
        cpu_matmul_skinny(M, N, K, a, b, DT_FLOAT32, c, accumulate);
        return;
    }
    cpu_sgemm(b_trans, M, N, K, 1.0f, a, K, b, b_trans ? K : N, accumulate ? 1.0f : 0.0f, c, N);
}

/* Integer products wrap on overflow, as torch's do: the arithmetic is done unsigned. */
static void s_gemm_i64(int64_t M, int64_t N, int64_t K, const int64_t *a, const int64_t *b, bool b_trans,
                       bool accumulate, int64_t *c)
{
    for (int64_t i = 0; i < M; i++) {
        uint64_t *row = (uint64_t *)(c + i * N);
        const int64_t *ai = a + i * K;
        if (!accumulate)
            memset(row, 0, (size_t)N * sizeof *row);
        if (b_trans) {
            for (int64_t j = 0; j < N; j++) {
                const int64_t *bj = b + j * K;
                uint64_t acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += (uint64_t)ai[k] * (uint64_t)bj[k];
                row[j] += acc;
            }
        } else {
            for (int64_t k = 0; k < K; k++) {
                uint64_t x = (uint64_t)ai[k];
                const int64_t *bk = b + k * N;
                for (int64_t j = 0; j < N; j++)
                    row[j] += x * (uint64_t)bk[j];
            }
        }
    }
}

static void s_gemm(cpu_ctype t, int64_t M, int64_t N, int64_t K, const void *a, const void *b, bool b_trans,
                   bool accumulate, void *c)
{
    if (t == CPU_F32)
        s_gemm_f32(M, N, K, a, b, b_trans, accumulate, c);
    else
        s_gemm_i64(M, N, K, a, b, b_trans, accumulate, c);
}

const char *cpu_matmul_run(const cpu_mm_desc *d, cpu_ctype t, const void *a, const void *b, void *c, bool accumulate)
{
    size_t elem = cpu_ctype_size(t);
    int64_t nb = 1;
    for (int i = 0; i < d->nbatch; i++)
        nb *= d->batch[i];
    if (nb == 0 || d->M == 0 || d->N == 0)
        return NULL;
    if (d->K == 0) {
        if (!accumulate)
            memset(c, 0, (size_t)(nb * d->M * d->N) * elem);
        return NULL;
    }
    if (t == CPU_F32 && (d->M > INT_MAX || d->N > INT_MAX || d->K > INT_MAX))
        return "a matrix dimension exceeds the BLAS integer range";
    /* a B shared by the whole batch and an A laid out contiguously over it: one product of
     * (batch * M) rows */
    bool fold = true;
    int64_t expect = d->M * d->K;
    for (int i = d->nbatch - 1; i >= 0 && fold; i--) {
        fold = d->b_stride[i] == 0 && (d->batch[i] == 1 || d->a_stride[i] == expect);
        expect *= d->batch[i];
    }
    if (fold && (t != CPU_F32 || nb * d->M <= INT_MAX)) {
        s_gemm(t, nb * d->M, d->N, d->K, a, b, d->b_trans, accumulate, c);
        return NULL;
    }
    int64_t idx[DT_MAX_DIMS] = {0};
    int64_t c_step = d->M * d->N;
    for (int64_t n = 0; n < nb; n++) {
        int64_t ao = 0, bo = 0;
        for (int i = 0; i < d->nbatch; i++) {
            ao += idx[i] * d->a_stride[i];
            bo += idx[i] * d->b_stride[i];
        }
        s_gemm(t, d->M, d->N, d->K, (const char *)a + ao * (int64_t)elem, (const char *)b + bo * (int64_t)elem,
               d->b_trans, accumulate, (char *)c + n * c_step * (int64_t)elem);
        for (int i = d->nbatch - 1; i >= 0; i--) {
            if (++idx[i] < d->batch[i])
                break;
            idx[i] = 0;
        }
    }
    return NULL;
}

/* ---- few rows against a weight ---------------------------------------------------------------- */

#if defined(__x86_64__)
#include <immintrin.h>
#define S_AVX2 __attribute__((target("avx2,fma,f16c")))
#define S_AHEAD 2048 /* bytes of weight asked for ahead of decode's loads (s_row) */
#define S_CACHED_WEIGHT (16 << 20) /* bytes of weight beyond which the block kernel prefetches it */
/* the loops over a block's registers unroll whole, so its accumulators stay in registers */
#define S_UNROLL _Pragma("GCC unroll 16")

S_AVX2 static inline float s_hsum(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}

/* One weight row (row j of b) against all M rows of A, U accumulators per row of A (M * U <= 8,
 * enough to hide the multiply-add latency). M, U and dtype are constants where it is inlined, so
 * the loops unroll and the accumulators stay in registers. */
S_AVX2 static inline __attribute__((always_inline)) void s_row(int M, int U, dt_dtype dtype, int64_t j, int64_t N,
                                                               int64_t K, const float *a, const void *b, float *c,
                                                               bool accumulate)
{
    __m256 acc[8];
    for (int i = 0; i < M * U; i++)
        acc[i] = _mm256_setzero_ps();
    const int64_t row = j * K;
    int64_t k = 0;
    for (; k + 8 * U <= K; k += 8 * U) {
        /* the weight's lines S_AHEAD bytes ahead: the hardware prefetcher alone falls behind this
         * loop (bench_matmul's 110M decode step on one core of a Xeon with AVX-512: float32 41.7-43.7
         * ms without, 35.8-36.5 with 2-4 KiB; 16-bit weights gained on a Zen 3 at 1 KiB and at 2-4
         * KiB on that Xeon) */
        _mm_prefetch((const char *)b + (row + k) * (dtype == DT_FLOAT32 ? 4 : 2) + S_AHEAD, _MM_HINT_T0);
        for (int u = 0; u < U; u++) {
            __m256 w = cpu_widen8(b, dtype, row + k + 8 * u);
            for (int m = 0; m < M; m++)
                acc[m * U + u] = _mm256_fmadd_ps(_mm256_loadu_ps(a + m * K + k + 8 * u), w, acc[m * U + u]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 w = cpu_widen8(b, dtype, row + k);
        for (int m = 0; m < M; m++)
            acc[m * U] = _mm256_fmadd_ps(_mm256_loadu_ps(a + m * K + k), w, acc[m * U]);
    }
    for (int m = 0; m < M; m++) {
        for (int u = 1; u < U; u++)
            acc[m * U] = _mm256_add_ps(acc[m * U], acc[m * U + u]);
        float sum = s_hsum(acc[m * U]);
        for (int64_t t = k; t < K; t++)
            sum += a[m * K + t] * cpu_widen(b, dtype, row + t);
        float *out = c + m * N + j;
        *out = accumulate ? *out + sum : sum;
    }
}

/* A block of NB weight rows (j ..) against MB rows of A (m0 ..): NB * MB dot products over K,
 * each in its own accumulator; the NB weight vectors of a step are loaded once and serve all MB
 * rows (NB * MB + NB <= 16 registers). */
S_AVX2 static inline __attribute__((always_inline)) void s_block(int NB, int MB, dt_dtype dtype, int64_t j,
                                                                 int64_t m0, int64_t N, int64_t K, const float *a,
                                                                 const void *b, float *c, bool accumulate)
{
    __m256 acc[12];
    S_UNROLL
    for (int i = 0; i < NB * MB; i++)
        acc[i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 w[3];
        S_UNROLL
        for (int n = 0; n < NB; n++)
            w[n] = cpu_widen8(b, dtype, (j + n) * K + k);
        S_UNROLL
        for (int m = 0; m < MB; m++) {
            __m256 x = _mm256_loadu_ps(a + (m0 + m) * K + k);
            S_UNROLL
            for (int n = 0; n < NB; n++)
                acc[n * MB + m] = _mm256_fmadd_ps(x, w[n], acc[n * MB + m]);
        }
    }
    for (int n = 0; n < NB; n++)
        for (int m = 0; m < MB; m++) {
            float sum = s_hsum(acc[n * MB + m]);
            for (int64_t t = k; t < K; t++)
                sum += a[(m0 + m) * K + t] * cpu_widen(b, dtype, (j + n) * K + t);
            float *out = c + (m0 + m) * N + j + n;
            *out = accumulate ? *out + sum : sum;
        }
}

/* NB weight rows against every row of A, four rows of A at a time: the weight rows stay in L1
 * while A's blocks pass over them, so the weight is still read from memory once. */
S_AVX2 static inline __attribute__((always_inline)) void s_rows_nb(int NB, bool fetch, dt_dtype dtype, int64_t j,
                                                                   int64_t M, int64_t N, int64_t K, const float *a,
                                                                   const void *b, float *c, bool accumulate)
{
    /* the weight rows two blocks ahead, from memory while these compute: a weight larger than the
     * caches (an lm_head's) is otherwise fetched only as the loads reach it */
    if (fetch && j + 3 * NB <= N) {
        const char *ahead = (const char *)b + (j + 2 * NB) * K * (int64_t)dt_dtype_size(dtype);
        for (int64_t off = 0; off < NB * K * (int64_t)dt_dtype_size(dtype); off += 64)
            _mm_prefetch(ahead + off, _MM_HINT_T0);
    }
    int64_t m0 = 0;
    for (; m0 + 4 <= M; m0 += 4)
        s_block(NB, 4, dtype, j, m0, N, K, a, b, c, accumulate);
    switch (M - m0) {
    case 3: s_block(NB, 3, dtype, j, m0, N, K, a, b, c, accumulate); break;
    case 2: s_block(NB, 2, dtype, j, m0, N, K, a, b, c, accumulate); break;
    case 1: s_block(NB, 1, dtype, j, m0, N, K, a, b, c, accumulate); break;
    default: break;
    }
}

S_AVX2 static inline __attribute__((always_inline)) void s_skinny_avx2_m(int M, dt_dtype dtype, int64_t N, int64_t K,
                                                                         const float *a, const void *b, float *c,
                                                                         bool accumulate)
{
    /* The weight is read once, in its own order: row after row, one sequential stream. Streaming
     * several rows at once (8 interleaved streams of K elements) starves the hardware prefetcher
     * when K is short (decode's K of 288-2048): bench_matmul's 32000 x 288 and x 768 shapes read
     * at about half the bandwidth that way. One or two rows of A take one weight row at a time,
     * every row's accumulators in registers; from three on, blocks of 3 adjacent weight rows x 4 rows
     * of A do the arithmetic (the products stop being bound by the weight's bytes), and 3
     * adjacent rows are still close to one stream. */
    if (M <= 2) {
        const int U = M == 1 ? 4 : 2;
        for (int64_t j = 0; j < N; j++)
            s_row(M, U, dtype, j, N, K, a, b, c, accumulate);
        return;
    }
    bool fetch = N * K * (int64_t)dt_dtype_size(dtype) > S_CACHED_WEIGHT;
    int64_t j = 0;
    for (; j + 3 <= N; j += 3)
        s_rows_nb(3, fetch, dtype, j, M, N, K, a, b, c, accumulate);
    for (; j < N; j++)
        s_rows_nb(1, false, dtype, j, M, N, K, a, b, c, accumulate);
}

/* bfloat16 weights at one or two rows of A, widened without a conversion: a 32-bit lane holding
 * two bfloat16 weights is the odd one as a float once its low half is masked off, and the even one
 * once shifted up by 16 bits. So 16 weights become two float vectors in two single-cycle
 * instructions (widening 8 at a time took a zero-extension and a shift per 8), against x's
 * features rearranged once per call to match: per block of 16, the 8 even then the 8 odd ones. */
#define S_BF16_STACK 4096 /* floats of rearranged x kept on the stack; more are allocated */

static void s_split_even_odd(int M, int64_t K, const float *a, float *xs)
{
    const int64_t K16 = K / 16 * 16;
    for (int m = 0; m < M; m++)
        for (int64_t k0 = 0; k0 < K16; k0 += 16)
            for (int i = 0; i < 8; i++) {
                xs[m * K16 + k0 + i] = a[m * K + k0 + 2 * i];
                xs[m * K16 + k0 + 8 + i] = a[m * K + k0 + 2 * i + 1];
            }
}

S_AVX2 static inline __attribute__((always_inline)) void s_row_bf16(int M, int64_t j, int64_t N, int64_t K,
                                                                    const float *a, const float *xs,
                                                                    const uint16_t *b, float *c, bool accumulate)
{
    const int64_t K16 = K / 16 * 16, row = j * K;
    const __m256i odd = _mm256_set1_epi32((int)0xffff0000u);
    __m256 acc[2][4];
    S_UNROLL for (int m = 0; m < M; m++)
        S_UNROLL for (int u = 0; u < 4; u++)
            acc[m][u] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K16; k += 32) {
        _mm_prefetch((const char *)(b + row + k) + S_AHEAD, _MM_HINT_T0); /* as s_row's */
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(b + row + k));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(b + row + k + 16));
        __m256 w[4] = {_mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), _mm256_castsi256_ps(_mm256_and_si256(v0, odd)),
                       _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), _mm256_castsi256_ps(_mm256_and_si256(v1, odd))};
        S_UNROLL for (int m = 0; m < M; m++)
            S_UNROLL for (int u = 0; u < 4; u++)
                acc[m][u] = _mm256_fmadd_ps(_mm256_loadu_ps(xs + m * K16 + k + 8 * u), w[u], acc[m][u]);
    }
    if (k < K16) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(b + row + k));
        S_UNROLL for (int m = 0; m < M; m++) {
            acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xs + m * K16 + k),
                                        _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xs + m * K16 + k + 8),
                                        _mm256_castsi256_ps(_mm256_and_si256(v0, odd)), acc[m][1]);
        }
    }
    S_UNROLL for (int m = 0; m < M; m++) {
        float sum = s_hsum(_mm256_add_ps(_mm256_add_ps(acc[m][0], acc[m][1]), _mm256_add_ps(acc[m][2], acc[m][3])));
        for (int64_t t = K16; t < K; t++)
            sum += a[m * K + t] * dt_bf16_to_f32(b[row + t]);
        float *out = c + m * N + j;
        *out = accumulate ? *out + sum : sum;
    }
}

/* One or two rows of A against a bfloat16 weight, row after row (as s_skinny_avx2_m). False when
 * the rearranged x could not be allocated (the caller takes the general path). */
S_AVX2 static bool s_skinny_bf16_pairs(int64_t M, int64_t N, int64_t K, const float *a, const uint16_t *b,
                                       float *c, bool accumulate)
{
    float stack[S_BF16_STACK], *xs = M * K <= S_BF16_STACK ? stack : malloc((size_t)(M * K) * sizeof *xs);
    if (!xs)
        return false;
    s_split_even_odd((int)M, K, a, xs);
    if (M == 1)
        for (int64_t j = 0; j < N; j++)
            s_row_bf16(1, j, N, K, a, xs, b, c, accumulate);
    else
        for (int64_t j = 0; j < N; j++)
            s_row_bf16(2, j, N, K, a, xs, b, c, accumulate);
    if (xs != stack)
        free(xs);
    return true;
}

#define S_CASE(M, D)                                                                                              \
    case M:                                                                                                     \
        s_skinny_avx2_m(M, D, N, K, a, b, c, accumulate);                                                       \
        break;
#define S_DTYPE_KERNEL(NAME, D)                                                                                   \
    S_AVX2 static void NAME(int64_t M, int64_t N, int64_t K, const float *a, const void *b, float *c,          \
                            bool accumulate)                                                                  \
    {                                                                                                         \
        switch (M) {                                                                                          \
            S_CASE(1, D) S_CASE(2, D) S_CASE(4, D) S_CASE(8, D) S_CASE(16, D)                                 \
        default: s_skinny_avx2_m((int)M, D, N, K, a, b, c, accumulate);                                       \
        }                                                                                                     \
    }
S_DTYPE_KERNEL(s_skinny_f32_avx2, DT_FLOAT32)
S_DTYPE_KERNEL(s_skinny_bf16_avx2, DT_BFLOAT16)
S_DTYPE_KERNEL(s_skinny_f16_avx2, DT_FLOAT16)
#undef S_CASE
#undef S_DTYPE_KERNEL
#endif

/* The portable path: the same order of work, one weight row against every row of A. */
static void s_skinny_plain(int64_t M, int64_t N, int64_t K, const float *a, const void *b, dt_dtype b_dtype, float *c,
                           bool accumulate)
{
    for (int64_t j = 0; j < N; j++) {
        float acc[CPU_SKINNY_MAX_M] = {0};
        for (int64_t k = 0; k < K; k++) {
            float w = cpu_widen(b, b_dtype, j * K + k);
            for (int64_t m = 0; m < M; m++)
                acc[m] += a[m * K + k] * w;
        }
        for (int64_t m = 0; m < M; m++)
            c[m * N + j] = accumulate ? c[m * N + j] + acc[m] : acc[m];
    }
}

#if defined(__clang__)
#define S_HAS_F16C() 1 /* clang's __builtin_cpu_supports has no "f16c"; every x86 with AVX2 and FMA has it */
#else
#define S_HAS_F16C() __builtin_cpu_supports("f16c")
#endif

void cpu_matmul_skinny(int64_t M, int64_t N, int64_t K, const float *a, const void *b, dt_dtype b_dtype, float *c,
                       bool accumulate)
{
#if defined(__x86_64__)
    if (cpu_has_avx2_fma() && S_HAS_F16C()) {
        if (b_dtype == DT_FLOAT32)
            s_skinny_f32_avx2(M, N, K, a, b, c, accumulate);
        else if (b_dtype == DT_BFLOAT16) {
            if (!(M <= 2 && s_skinny_bf16_pairs(M, N, K, a, b, c, accumulate)))
                s_skinny_bf16_avx2(M, N, K, a, b, c, accumulate);
        }
        else
            s_skinny_f16_avx2(M, N, K, a, b, c, accumulate);
        return;
    }
#endif
    s_skinny_plain(M, N, K, a, b, b_dtype, c, accumulate);
}

/* ---- attention ------------------------------------------------------------------------------- */

/* x . y[at ..] and out += a x[at ..] over n elements, y and x float32, bfloat16 or float16 (a cache
 * in its own dtype): decode's attention, a query row against one key at a time, where the CPU has
 * no AVX2 (cpu_attention_row_scores and _values where it has). */
static float s_dot_plain(const float *x, const void *y, int64_t at, dt_dtype dtype, int64_t n)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += x[i] * cpu_widen(y, dtype, at + i);
    return sum;
}

static void s_axpy_plain(float a, const void *x, int64_t at, dt_dtype dtype, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] += a * cpu_widen(x, dtype, at + i);
}

/* The keys row i may see before any mask: those before the causal diagonal, or all. */
static int64_t s_visible(int64_t S, bool causal, int64_t row0, int64_t i)
{
    int64_t visible = causal ? row0 + i + 1 : S;
    return visible > S ? S : visible < 0 ? 0 : visible;
}

/* How many leading keys some row sees: past the last key that the diagonal and the mask leave
 * visible to any row, a key costs nothing. A static cache's slots not filled yet are masked at its
 * end, so decode's attention reads the slots filled so far, not the whole cache. */
static int64_t s_keys_used(int64_t L, int64_t S, const float *mask, int64_t mask_sl, int64_t mask_ss, bool causal,
                           int64_t row0)
{
    int64_t used = 0;
    for (int64_t i = 0; i < L && used < S; i++) {
        int64_t visible = s_visible(S, causal, row0, i);
        if (mask)
            while (visible > used && mask[i * mask_sl + (visible - 1) * mask_ss] == -INFINITY)
                visible--;
        if (visible > used)
            used = visible;
    }
    return used;
}

/* A few query rows (decode, a short chunk), one after another: the scores of the keys it sees, their
 * softmax, the weighted values, skipping the keys the mask hides (a batch's ring of slots hides
 * most), where the product route would score every slot through two BLAS calls per head. */
static void s_attention_few_rows(int64_t L, int64_t used, int64_t E, int64_t Ev, const float *q, const void *k,
                                 const void *v, dt_dtype kv_dtype, const float *mask, int64_t mask_sl,
                                 int64_t mask_ss, bool causal, int64_t row0, float scale, float *row, float *out)
{
    for (int64_t i = 0; i < L; i++) {
        const float *qi = q + i * E, *m = mask ? mask + i * mask_sl : NULL;
        float *oi = out + i * Ev;
        int64_t visible = s_visible(used, causal, row0, i);
#if defined(__x86_64__)
        if (cpu_has_avx2_fma()) {
            cpu_attention_row_scores(visible, E, qi, k, kv_dtype, scale, m, mask_ss, row);
            float top = cpu_scaled_max(row, visible, 1.0f);
            if (top != top || top == -INFINITY) {
                /* a NaN score makes the row NaN, as torch's softmax does; nothing to attend to:
                 * zeros, as torch's safe softmax gives */
                for (int64_t c = 0; c < Ev; c++)
                    oi[c] = top != top ? NAN : 0.0f;
                continue;
            }
            float inv = 1.0f / cpu_exp_shifted_sum(row, NULL, visible, top);
            cpu_attention_row_values(visible, Ev, row, v, kv_dtype, m, mask_ss, oi);
            for (int64_t c = 0; c < Ev; c++)
                oi[c] *= inv;
            continue;
        }
#endif
        float top = -INFINITY;
        bool nan = false;
        for (int64_t j = 0; j < visible; j++) {
            float bias = m ? m[j * mask_ss] : 0.0f;
            if (bias == -INFINITY) {
                row[j] = -INFINITY;
                continue;
            }
            float dot = s_dot_plain(qi, k, j * E, kv_dtype, E);
            row[j] = dot * scale + bias;
            if (row[j] > top)
                top = row[j];
            else if (row[j] != row[j])
                nan = true;
        }
        memset(oi, 0, (size_t)Ev * sizeof *oi);
        if (nan) { /* a NaN score makes the row NaN, as torch's softmax does */
            for (int64_t c = 0; c < Ev; c++)
                oi[c] = NAN;
            continue;
        }
        if (top == -INFINITY)
            continue; /* nothing to attend to: zeros, as torch's safe softmax gives (no NaN) */
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; j++) {
            if (row[j] == -INFINITY)
                continue;
            float e = expf(row[j] - top);
            sum += e;
            s_axpy_plain(e, v, j * Ev, kv_dtype, oi, Ev);
        }
        float inv = 1.0f / sum;
        for (int64_t c = 0; c < Ev; c++)
            oi[c] *= inv;
    }
}

int64_t cpu_attention_block_rows(int64_t L, int64_t S)
{
    /* about 256 KiB of scores per block, within L2 beside the keys and values it reads; at least
     * 16 rows, so the products keep their shape */
    int64_t rows = S > 0 ? (256 * 1024 / (int64_t)sizeof(float)) / S : L;
    rows = rows < 16 ? 16 : rows;
    return rows < L ? rows : L;
}

static void s_attention_block(int64_t L, int64_t S, int64_t E, int64_t Ev, const float *q, const void *k,
                              const void *v, dt_dtype kv_dtype, const float *kt, const float *mask, int64_t mask_sl,
                              int64_t mask_ss, bool causal, int64_t row0, float scale, float *scores, float *inv,
                              float *out);

void cpu_attention_head(int64_t L, int64_t S, int64_t E, int64_t Ev, const float *q, const void *k, const void *v,
                        dt_dtype kv_dtype, const float *mask, int64_t mask_sl, int64_t mask_ss, bool causal,
                        int64_t row0, float scale, float *scores, float *out)
{
    /* Blocks of query rows, each scored against the keys it can see, its weights multiplied by the
     * values before the next block: the scores never exceed one block's (no L x S matrix for a
     * long sequence), stay in cache between the two products, and a causal block stops at the
     * last key its last row sees. */
    int64_t block = cpu_attention_block_rows(L, S);
    /* Many rows in float32 take the products in register tiles where the CPU has them: the keys
     * they see, laid out by feature once for every block (a failed allocation keeps sgemm). */
    float *kt = NULL;
#if defined(__x86_64__)
    if (L > CPU_ATTENTION_FEW_ROWS && kv_dtype == DT_FLOAT32 && E > 0 && cpu_attention_tiles_fit(Ev)) {
        int64_t used = s_keys_used(L, S, mask, mask_sl, mask_ss, causal, row0);
        if (used > 0 && (kt = malloc((size_t)cpu_attention_panel_floats(used, E) * sizeof *kt)))
            cpu_attention_pack_keys(used, E, k, kt);
    }
#endif
    for (int64_t i0 = 0; i0 < L; i0 += block) {
        int64_t rows = L - i0 < block ? L - i0 : block;
        s_attention_block(rows, S, E, Ev, q + i0 * E, k, v, kv_dtype, kt, mask ? mask + i0 * mask_sl : NULL, mask_sl,
                          mask_ss, causal, row0 + i0, scale, scores, scores + block * S, out + i0 * Ev);
    }
    free(kt);
}

/* A block's scores (L rows of `used` keys, row stride ld) into its weights: times pre, plus the
 * mask, the keys a row does not see zeroed, the rest exponentials of the shifted scores, and
 * inv[i] = 1 / row i's sum (0 for a row that sees nothing: zeros, as torch's safe softmax gives,
 * no NaN). The weights go into the product with the values as exponentials, and each output row
 * is divided once (Ev values) instead of each score. They are left in scores, or written to
 * weights (L rows of `used`) as bfloat16 where given. */
static void s_block_weights(int64_t L, int64_t used, int64_t ld, const float *mask, int64_t mask_sl,
                            int64_t mask_ss, bool causal, int64_t row0, float pre, float *scores, uint16_t *weights,
                            float *inv)
{
    for (int64_t i = 0; i < L; i++) {
        float *row = scores + i * ld;
        uint16_t *wrow = weights ? weights + i * used : NULL;
        int64_t visible = s_visible(used, causal, row0, i);
        float top;
        if (mask) {
            const float *m = mask + i * mask_sl;
            for (int64_t j = 0; j < visible; j++)
                row[j] = row[j] * pre + m[j * mask_ss];
            top = cpu_scaled_max(row, visible, 1.0f);
        } else {
            top = cpu_scaled_max(row, visible, pre);
        }
        if (top == -INFINITY) {
            if (wrow)
                memset(wrow, 0, (size_t)used * sizeof *wrow);
            else
                memset(row, 0, (size_t)used * sizeof *row);
            inv[i] = 0.0f;
            continue;
        }
        inv[i] = 1.0f / cpu_exp_shifted_sum(row, wrow, visible, top);
        if (wrow)
            memset(wrow + visible, 0, (size_t)(used - visible) * sizeof *wrow);
        else
            memset(row + visible, 0, (size_t)(used - visible) * sizeof *row);
    }
}

/* rows x E of x into rows x Ep (Ep >= E), the features past E zero */
static void s_pad_features(uint16_t *dst, int64_t Ep, const uint16_t *x, int64_t rows, int64_t E)
{
    for (int64_t r = 0; r < rows; r++) {
        memcpy(dst + r * Ep, x + r * E, (size_t)E * sizeof *x);
        memset(dst + r * Ep + E, 0, (size_t)(Ep - E) * sizeof *x);
    }
}

bool cpu_attention_head_bf16(int64_t L, int64_t S, int64_t E, int64_t Ev, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, const float *mask, int64_t mask_sl, int64_t mask_ss, bool causal,
                             int64_t row0, float scale, float *scores, uint16_t *weights, float *out)
{
    int64_t block = cpu_attention_block_rows(L, S);
    float *inv = scores + block * S;
    /* The scores' product sums over the features in AMX's steps of 32 pairs: a head size off that
     * step (48, as 15M's) ran oneDNN's kernel at a third of its rate (118-137 against 312-387
     * GFLOP/s at 512 x 512 and 48 or 64 features, one core). The queries and keys go in zero-padded
     * to the step (zeros add nothing to a dot product). */
    int64_t Ep = (E + 31) / 32 * 32;
    uint16_t *kp = NULL, *qp = NULL;
    if (Ep != E) {
        kp = malloc((size_t)(S * Ep) * sizeof *kp);
        qp = malloc((size_t)(block * Ep) * sizeof *qp);
        if (!kp || !qp) {
            free(kp);
            free(qp);
            return false;
        }
        s_pad_features(kp, Ep, k, S, E);
        k = kp;
    }
    bool ok = true;
    for (int64_t i0 = 0; i0 < L && ok; i0 += block) {
        int64_t rows = L - i0 < block ? L - i0 : block, r0 = row0 + i0;
        const float *bm = mask ? mask + i0 * mask_sl : NULL;
        float *bo = out + i0 * Ev;
        int64_t used = s_keys_used(rows, S, bm, mask_sl, mask_ss, causal, r0);
        if (used == 0) { /* no row sees a key: zeros */
            memset(bo, 0, (size_t)(rows * Ev) * sizeof *bo);
            continue;
        }
        const uint16_t *qb = q + i0 * E;
        if (qp) {
            s_pad_features(qp, Ep, qb, rows, E);
            qb = qp;
        }
        if (!(ok = cpu_gemm_bf16(rows, used, Ep, qb, k, true, NULL, false, scores, false)))
            break;
        s_block_weights(rows, used, used, bm, mask_sl, mask_ss, causal, r0, scale, scores, weights, inv);
        if (!(ok = cpu_gemm_bf16(rows, Ev, used, weights, v, false, NULL, false, bo, false)))
            break;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t c = 0; c < Ev; c++)
                bo[i * Ev + c] *= inv[i];
    }
    free(kp);
    free(qp);
    return ok;
}

static void s_attention_block(int64_t L, int64_t S, int64_t E, int64_t Ev, const float *q, const void *k,
                              const void *v, dt_dtype kv_dtype, const float *kt, const float *mask, int64_t mask_sl,
                              int64_t mask_ss, bool causal, int64_t row0, float scale, float *scores, float *inv,
                              float *out)
{
    if (L == 0 || Ev == 0)
        return;
    int64_t used = s_keys_used(L, S, mask, mask_sl, mask_ss, causal, row0); /* the scores' columns computed */
    if (used == 0) {
        /* no row sees a key: zeros, as torch's safe softmax gives (no NaN) */
        memset(out, 0, (size_t)(L * Ev) * sizeof *out);
        return;
    }
    if (L <= CPU_ATTENTION_FEW_ROWS) {
        s_attention_few_rows(L, used, E, Ev, q, k, v, kv_dtype, mask, mask_sl, mask_ss, causal, row0, scale, scores,
                             out);
        return;
    }
    const float *kf = k, *vf = v; /* more rows: float32 by the contract */
    if (E == 0)
        for (int64_t i = 0; i < L; i++)
            memset(scores + i * S, 0, (size_t)used * sizeof *scores);
#if defined(__x86_64__)
    else if (kt)
        cpu_attention_scores(L, used, E, q, kt, scale, scores, S);
#endif
    else
        cpu_sgemm(true, L, used, E, scale, q, E, kf, E, 0.0f, scores, S);
    s_block_weights(L, used, S, mask, mask_sl, mask_ss, causal, row0, 1.0f, scores, NULL, inv);
#if defined(__x86_64__)
    if (kt)
        cpu_attention_values(L, used, Ev, scores, S, vf, out);
    else
#endif
        cpu_sgemm(false, L, Ev, used, 1.0f, scores, S, vf, Ev, 0.0f, out, Ev);
    for (int64_t i = 0; i < L; i++)
        for (int64_t c = 0; c < Ev; c++)
            out[i * Ev + c] *= inv[i];
}

/* ---- embedding ------------------------------------------------------------------------------- */

const char *cpu_embedding(void *out, const void *weight, int64_t rows, size_t row_bytes, const void *idx,
                          dt_dtype idx_dtype, int64_t n, int64_t row_offset, int64_t vocab)
{
    char *dst = out;
    for (int64_t i = 0; i < n; i++, dst += row_bytes) {
        int64_t g = idx_dtype == DT_INT32 ? ((const int32_t *)idx)[i] : ((const int64_t *)idx)[i];
        if (g < 0 || g >= vocab)
            return "index out of range in embedding";
        int64_t r = g - row_offset;
        if (r >= 0 && r < rows)
            memcpy(dst, (const char *)weight + (size_t)r * row_bytes, row_bytes);
        else
            memset(dst, 0, row_bytes);
    }
    return NULL;
}

/* ---- the kernels of the ops (OP_MATMUL in ops/op_table.h) ----------------------------------- */

static cpu_ctype s_ctype(dt_dtype d) { return dt_dtype_is_float(d) ? CPU_F32 : CPU_I64; }


/* A bfloat16 linear past decode's rows (a prompt) on the CPU's bfloat16 units: x and the weight as
 * they are, the bias (N,) added in float32, the output rounded once (cpu_gemm_bf16). false when
 * this is not such a product or the CPU has no such units. */
static bool s_linear_bf16(op_kernel *k, int64_t N, int64_t K)
{
    const op_local *a = &k->in[0], *b = &k->in[1], *bias = k->nin == 3 && k->nctx > 0 && k->ctx[0] ? &k->in[2] : NULL;
    op_local *o = &k->out[0];
    int64_t rows = K > 0 ? dt_layout_numel(a->ndim, a->shape) / K : 0;
    if (a->dtype != DT_BFLOAT16 || b->dtype != DT_BFLOAT16 || rows <= CPU_SKINNY_MAX_M ||
        (o->dtype != DT_BFLOAT16 && o->dtype != DT_FLOAT32) ||
        (bias && (bias->ndim != 1 || bias->shape[0] != N ||
                  (bias->dtype != DT_BFLOAT16 && bias->dtype != DT_FLOAT32))))
        return false;
    return cpu_gemm_bf16(rows, N, K, a->data, b->data, true, bias ? bias->data : NULL,
                         bias && bias->dtype == DT_BFLOAT16, o->data, o->dtype == DT_BFLOAT16);
}

const char *cpu_k_mm(op_kernel *k)
{
    const op_local *a = &k->in[0], *b = &k->in[1];
    op_local *o = &k->out[0];
    bool linear = k->def->id == OP_ID_linear;
    op_mm_dims d;
    cpu_mm_desc desc = {.b_trans = linear};
    const char *misfit = op_mm_local(k, &d, &desc.M, &desc.K, &desc.N);
    if (misfit)
        return misfit;
    if (linear && s_linear_bf16(k, desc.N, desc.K))
        return NULL;
    desc.nbatch = d.nbatch;
    int64_t a_st[DT_MAX_DIMS], b_st[DT_MAX_DIMS];
    cpu_contiguous_strides(a->ndim, a->shape, 1, a_st);
    cpu_contiguous_strides(b->ndim, b->shape, 1, b_st);
    for (int j = 0; j < d.nbatch; j++) {
        int ja = j - (d.nbatch - d.a_nbatch), jb = j - (d.nbatch - d.b_nbatch);
        desc.batch[j] = o->shape[j];
        desc.a_stride[j] = ja >= 0 && a->shape[ja] == o->shape[j] ? a_st[ja] : 0;
        desc.b_stride[j] = jb >= 0 && b->shape[jb] == o->shape[j] ? b_st[jb] : 0;
    }
    cpu_ctype t = s_ctype(o->dtype);
    int64_t n = dt_layout_numel(o->ndim, o->shape);
    /* decode: a few rows against a 16-bit linear weight, which is streamed once and widened on
     * the fly instead of converted whole first (that would read it twice and write it once) */
    int64_t rows = desc.K > 0 ? dt_layout_numel(a->ndim, a->shape) / desc.K : 0;
    bool skinny = linear && t == CPU_F32 && rows > 0 && rows <= CPU_SKINNY_MAX_M &&
                  (b->dtype == DT_BFLOAT16 || b->dtype == DT_FLOAT16);
    void *sa, *sb = NULL, *sbias = NULL, *sc = NULL;
    const void *pa = cpu_piece_as(a, t, &sa), *pb = skinny ? b->data : cpu_piece_as(b, t, &sb);
    void *pc = o->data;
    if (!((t == CPU_F32 && o->dtype == DT_FLOAT32) || (t == CPU_I64 && o->dtype == DT_INT64)))
        pc = sc = malloc((size_t)(n ? n : 1) * cpu_ctype_size(t));
    const char *why = pa && pb && pc ? NULL : "out of memory on the device";
    bool bias = !why && k->nin == 3 && k->nctx > 0 && k->ctx[0];
    if (bias) {
        const void *pbias = cpu_piece_as(&k->in[2], t, &sbias);
        if (pbias)
            cpu_broadcast(pc, o->ndim, o->shape, pbias, k->in[2].ndim, k->in[2].shape, cpu_ctype_size(t));
        else
            why = "out of memory on the device";
    }
    if (!why && skinny)
        cpu_matmul_skinny(rows, desc.N, desc.K, pa, pb, b->dtype, pc, bias);
    else if (!why)
        why = cpu_matmul_run(&desc, t, pa, pb, pc, bias);
    if (!why && sc)
        cpu_from_ctype(o->data, o->dtype, sc, t, n);
    free(sa);
    free(sb);
    free(sbias);
    free(sc);
    return why;
}


const char *cpu_k_embedding(op_kernel *k)
{
    const op_local *idx = &k->in[0], *w = &k->in[1];
    op_local *o = &k->out[0];
    int64_t n;
    const char *why = op_embedding_local(k, &n);
    if (why)
        return why;
    return cpu_embedding(o->data, w->data, w->shape[0], (size_t)w->shape[1] * dt_dtype_size(w->dtype), idx->data,
                         idx->dtype, n, k->ctx[0], k->ctx[1]);
}


const char *cpu_k_sdpa(op_kernel *k)
{
    op_sdpa_dims d;
    const char *why = op_sdpa_layout(k, &d);
    if (why)
        return why;
    const op_local *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2], *mask = k->nin == 4 ? &k->in[3] : NULL;
    op_local *o = &k->out[0];
    int nd = d.nd;
    int64_t L = d.L, S = d.S, E = d.E, Ev = d.Ev, nscores;
    int64_t nout = dt_layout_numel(o->ndim, o->shape), nmask = mask ? dt_layout_numel(mask->ndim, mask->shape) : 0;
    if (nout == 0)
        return NULL;
    if (__builtin_mul_overflow(cpu_attention_block_rows(L, S), S + 1, &nscores)) /* pieces without elements (E = 0) */
        return "out of memory on the device";
    /* the mask as additive float32 */
    float *mvals = NULL;
    void *sq = NULL, *sk = NULL, *sv = NULL, *so = NULL;
    /* A few query rows (decode) read a 16-bit cache as it is: widening it first would read it, write
     * it twice as large and read that again, every step, for every slot up to the cache's size. */
    bool direct = L <= CPU_ATTENTION_FEW_ROWS && kk->dtype == v->dtype &&
                  (kk->dtype == DT_BFLOAT16 || kk->dtype == DT_FLOAT16);
    dt_dtype kv_dtype = direct ? kk->dtype : DT_FLOAT32;
    /* A bfloat16 prompt on the CPU's bfloat16 units: q, k and v as they lie, widened only for a head
     * whose products could not run there. */
    uint16_t *weights = NULL;
    if (L > CPU_ATTENTION_FEW_ROWS && E > 0 && Ev > 0 && q->dtype == DT_BFLOAT16 && kk->dtype == DT_BFLOAT16 &&
        v->dtype == DT_BFLOAT16 && cpu_gemm_bf16_ready())
        weights = malloc((size_t)(cpu_attention_block_rows(L, S) * S) * sizeof *weights);
    const float *pq = weights ? NULL : cpu_piece_as(q, CPU_F32, &sq);
    const void *pk = direct || weights ? kk->data : cpu_piece_as(kk, CPU_F32, &sk),
               *pv = direct || weights ? v->data : cpu_piece_as(v, CPU_F32, &sv);
    int64_t kv_size = (int64_t)dt_dtype_size(weights ? DT_BFLOAT16 : kv_dtype);
    float *po = o->dtype == DT_FLOAT32 ? o->data : (so = malloc((size_t)nout * sizeof(float)));
    float *scores = malloc((size_t)(nscores > 0 ? nscores : 1) * sizeof(float));
    if (mask && (mvals = malloc((size_t)(nmask ? nmask : 1) * sizeof(float)))) {
        if (mask->dtype == DT_BOOL) {
            const uint8_t *mb = mask->data;
            for (int64_t i = 0; i < nmask; i++)
                mvals[i] = mb[i] ? 0.0f : -INFINITY;
        } else {
            cpu_to_ctype(mvals, CPU_F32, mask->data, mask->dtype, nmask);
        }
    }
    why = (pq || weights) && pk && pv && po && scores && (!mask || mvals) ? NULL : "out of memory on the device";
    int64_t idx[DT_MAX_DIMS] = {0};
    for (int64_t b = 0; b < d.nbatch && !why; b++) {
        int64_t kv = (b / d.Hq) * d.H + (b % d.Hq) / d.group, moff = 0;
        for (int i = 0; i < nd - 2; i++)
            moff += idx[i] * d.mask_stride[i];
        if (weights && cpu_attention_head_bf16(L, S, E, Ev, (const uint16_t *)q->data + b * L * E,
                                               (const uint16_t *)pk + kv * S * E, (const uint16_t *)pv + kv * S * Ev,
                                               mvals ? mvals + moff : NULL, d.mask_stride[nd - 2],
                                               d.mask_stride[nd - 1], d.causal, d.row0, d.scale, scores, weights,
                                               po + b * L * Ev))
            goto next;
        if (weights) { /* this head in float32 after all, and every one after it */
            free(weights);
            weights = NULL;
            pq = cpu_piece_as(q, CPU_F32, &sq);
            pk = cpu_piece_as(kk, CPU_F32, &sk);
            pv = cpu_piece_as(v, CPU_F32, &sv);
            kv_size = (int64_t)sizeof(float);
            if (!pq || !pk || !pv) {
                why = "out of memory on the device";
                break;
            }
        }
        cpu_attention_head(L, S, E, Ev, pq + b * L * E, (const char *)pk + kv * S * E * kv_size,
                           (const char *)pv + kv * S * Ev * kv_size, kv_dtype, mvals ? mvals + moff : NULL,
                           d.mask_stride[nd - 2], d.mask_stride[nd - 1], d.causal, d.row0, d.scale, scores,
                           po + b * L * Ev);
    next:
        for (int i = nd - 3; i >= 0; i--) {
            if (++idx[i] < q->shape[i])
                break;
            idx[i] = 0;
        }
    }
    if (!why && so)
        cpu_from_ctype(o->data, o->dtype, so, CPU_F32, nout);
    free(sq);
    free(sk);
    free(sv);
    free(so);
    free(scores);
    free(mvals);
    free(weights);
    return why;
}
