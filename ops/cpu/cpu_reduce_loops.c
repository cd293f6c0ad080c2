/* cpu_reduce_loops — the loops of the CPU's reduction kernels over compute-type arrays: vectorised
 * reductions, arg-extremes, softmax, cumulative sums, top-k and normalisation (cpu_reduce_loops.h).
 * The kernels of the ops, which convert pieces into them, are in cpu_reduce.c. */
#include "cpu_reduce_loops.h"
#include "cpu_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "dt_layout.h"
#include "op_reduce_math.h"

/* Partial results kept side by side when reducing along the last dim: independent lanes the
 * compiler turns into vector registers (a single running value would serialise every add). More
 * than 16, so that GCC vectorises the lane loop instead of unrolling it into scalar code. */
#define S_LANES 32
/* Columns handled together when reducing along an inner dim (their NaN flags live on the stack;
 * whole rows of up to this many stream through the cache). */
#define S_TILE 4096

#define S_ADD(a, b) ((a) + (b))
/* integer sums wrap on overflow, as torch's do (in unsigned arithmetic: signed overflow is undefined) */
#define S_ADD_WRAP(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
/* b when it wins over a. Written so that compilers map it to vector max/min instructions: a
 * NaN b loses (float max/min count NaNs on the side). */
#define S_MAX(a, b) ((b) > (a) ? (b) : (a))
#define S_MIN(a, b) ((b) < (a) ? (b) : (a))

/* out (outer, inner) = COMBINE over n of in (outer, n, inner), starting from INIT. Cloned: each of
 * the S_LANES accumulators combines its own elements in order at any vector width, so every clone
 * gives the same result (AVX-512 has the 64-bit min and max that AVX2 lacks: a 16000-entry int64
 * amin, the greedy argmax's, ran scalar). */
#define S_DEFINE_REDUCE(NAME, T, COMBINE, INIT)                                                                        \
    CPU_CLONES static void NAME(T *out, const T *in, int64_t outer, int64_t n, int64_t inner)                          \
    {                                                                                                                  \
        if (inner == 1) {                                                                                              \
            for (int64_t o = 0; o < outer; o++) {                                                                      \
                const T *x = in + o * n;                                                                               \
                T acc[S_LANES];                                                                                        \
                for (int l = 0; l < S_LANES; l++)                                                                      \
                    acc[l] = (INIT);                                                                                   \
                int64_t r = 0;                                                                                         \
                for (; r + S_LANES <= n; r += S_LANES)                                                                 \
                    for (int l = 0; l < S_LANES; l++)                                                                  \
                        acc[l] = COMBINE(acc[l], x[r + l]);                                                            \
                T v = (INIT);                                                                                          \
                for (; r < n; r++)                                                                                     \
                    v = COMBINE(v, x[r]);                                                                              \
                for (int l = 0; l < S_LANES; l++)                                                                      \
                    v = COMBINE(v, acc[l]);                                                                            \
                out[o] = v;                                                                                            \
            }                                                                                                          \
            return;                                                                                                    \
        }                                                                                                              \
        for (int64_t o = 0; o < outer; o++) {                                                                          \
            T *y = out + o * inner;                                                                                    \
            const T *x = in + o * n * inner;                                                                           \
            memcpy(y, x, (size_t)inner * sizeof(T));                                                                   \
            for (int64_t r = 1; r < n; r++) {                                                                          \
                const T *row = x + r * inner;                                                                          \
                for (int64_t i = 0; i < inner; i++)                                                                    \
                    y[i] = COMBINE(y[i], row[i]);                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }

S_DEFINE_REDUCE(s_sum_f32, float, S_ADD, 0.0f)
S_DEFINE_REDUCE(s_sum_i64, int64_t, S_ADD_WRAP, 0)
S_DEFINE_REDUCE(s_max_i64, int64_t, S_MAX, INT64_MIN)
S_DEFINE_REDUCE(s_min_i64, int64_t, S_MIN, INT64_MAX)

/* float max/min: as above, and a NaN anywhere makes the result NaN (torch's rule) */
#define S_DEFINE_EXTREME_F32(NAME, COMBINE, INIT)                                                                      \
    CPU_CLONES static void NAME(float *out, const float *in, int64_t outer, int64_t n, int64_t inner)                  \
    {                                                                                                                  \
        if (inner == 1) {                                                                                              \
            for (int64_t o = 0; o < outer; o++) {                                                                      \
                const float *x = in + o * n;                                                                           \
                float acc[S_LANES];                                                                                    \
                int bad[S_LANES];                                                                                      \
                for (int l = 0; l < S_LANES; l++) {                                                                    \
                    acc[l] = (INIT);                                                                                   \
                    bad[l] = 0;                                                                                        \
                }                                                                                                      \
                int64_t r = 0;                                                                                         \
                for (; r + S_LANES <= n; r += S_LANES)                                                                 \
                    for (int l = 0; l < S_LANES; l++) {                                                                \
                        float b = x[r + l];                                                                            \
                        acc[l] = COMBINE(acc[l], b);                                                                   \
                        bad[l] |= b != b;                                                                              \
                    }                                                                                                  \
                float v = (INIT);                                                                                      \
                int nan = 0;                                                                                           \
                for (; r < n; r++) {                                                                                   \
                    v = COMBINE(v, x[r]);                                                                              \
                    nan |= x[r] != x[r];                                                                               \
                }                                                                                                      \
                for (int l = 0; l < S_LANES; l++) {                                                                    \
                    v = COMBINE(v, acc[l]);                                                                            \
                    nan |= bad[l];                                                                                     \
                }                                                                                                      \
                out[o] = nan ? NAN : v;                                                                                \
            }                                                                                                          \
            return;                                                                                                    \
        }                                                                                                              \
        int bad[S_TILE];                                                                                               \
        for (int64_t o = 0; o < outer; o++)                                                                            \
            for (int64_t i0 = 0; i0 < inner; i0 += S_TILE) {                                                           \
                int64_t m = inner - i0 < S_TILE ? inner - i0 : S_TILE;                                                 \
                float *y = out + o * inner + i0;                                                                       \
                const float *x = in + o * n * inner + i0;                                                              \
                for (int64_t i = 0; i < m; i++) {                                                                      \
                    y[i] = x[i];                                                                                       \
                    bad[i] = x[i] != x[i];                                                                             \
                }                                                                                                      \
                for (int64_t r = 1; r < n; r++) {                                                                      \
                    const float *row = x + r * inner;                                                                  \
                    for (int64_t i = 0; i < m; i++) {                                                                  \
                        y[i] = COMBINE(y[i], row[i]);                                                                  \
                        bad[i] |= row[i] != row[i];                                                                    \
                    }                                                                                                  \
                }                                                                                                      \
                for (int64_t i = 0; i < m; i++)                                                                        \
                    if (bad[i])                                                                                        \
                        y[i] = NAN;                                                                                    \
            }                                                                                                          \
    }

S_DEFINE_EXTREME_F32(s_max_f32, S_MAX, -INFINITY)
S_DEFINE_EXTREME_F32(s_min_f32, S_MIN, INFINITY)

void cpu_reduce_run(cpu_red op, cpu_ctype t, void *out, const void *in, int64_t outer, int64_t n, int64_t inner)
{
    if (t == CPU_F32) {
        switch (op) {
        case CPU_RED_SUM: s_sum_f32(out, in, outer, n, inner); break;
        case CPU_RED_MAX: s_max_f32(out, in, outer, n, inner); break;
        case CPU_RED_MIN: s_min_f32(out, in, outer, n, inner); break;
        }
    } else {
        switch (op) {
        case CPU_RED_SUM: s_sum_i64(out, in, outer, n, inner); break;
        case CPU_RED_MAX: s_max_i64(out, in, outer, n, inner); break;
        case CPU_RED_MIN: s_min_i64(out, in, outer, n, inner); break;
        }
    }
}

void cpu_combine(cpu_red op, cpu_ctype t, void *acc, const void *part, int64_t n)
{
    if (t == CPU_F32) {
        float *a = acc;
        const float *b = part;
        for (int64_t i = 0; i < n; i++) {
            float v = op == CPU_RED_SUM ? a[i] + b[i] : op == CPU_RED_MAX ? S_MAX(a[i], b[i]) : S_MIN(a[i], b[i]);
            a[i] = b[i] != b[i] ? b[i] : v; /* S_MAX/S_MIN let a NaN in b lose */
        }
    } else {
        int64_t *a = acc;
        const int64_t *b = part;
        for (int64_t i = 0; i < n; i++)
            a[i] = op == CPU_RED_SUM   ? S_ADD_WRAP(a[i], b[i])
                   : op == CPU_RED_MAX ? S_MAX(a[i], b[i])
                                       : S_MIN(a[i], b[i]);
    }
}

static int64_t s_product(const int64_t *v, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++)
        p *= v[i];
    return p;
}

/* The dims are merged into groups, alternately kept and reduced (adjacent dims of one kind
 * make one group; size-1 dims vanish), and the reduced groups are folded one pass each, the
 * innermost first, so every pass is one (outer, n, inner) reduction. */
const char *cpu_reduce_dims(cpu_red op, cpu_ctype t, void *out, const void *in, int ndim, const int64_t *shape,
                            uint32_t mask)
{
    int64_t size[DT_MAX_DIMS];
    bool reduced[DT_MAX_DIMS];
    int groups = dt_layout_group_dims(ndim, shape, mask, size, reduced);
    size_t elem = cpu_ctype_size(t);
    int64_t total = s_product(size, 0, groups);
    if (total == 0)
        return NULL; /* a kept dim is empty: so is the output */
    const void *src = in;
    void *scratch = NULL;
    for (;;) {
        int j = groups - 1;
        while (j >= 0 && !reduced[j])
            j--;
        if (j < 0) {
            memcpy(out, src, (size_t)total * elem);
            break;
        }
        bool last = true;
        for (int g = 0; g < j; g++)
            last = last && !reduced[g];
        int64_t outer = s_product(size, 0, j), n = size[j], inner = s_product(size, j + 1, groups);
        void *dst = last ? out : malloc((size_t)(outer * inner) * elem);
        if (!dst) {
            free(scratch);
            return "out of memory on the device";
        }
        cpu_reduce_run(op, t, dst, src, outer, n, inner);
        free(scratch);
        if (last)
            return NULL;
        scratch = dst;
        src = dst;
        total /= n;
        /* drop group j; its kept neighbours become one group */
        if (j + 1 < groups) {
            size[j - 1] *= size[j + 1];
            memmove(&size[j], &size[j + 2], sizeof *size * (size_t)(groups - j - 2));
            memmove(&reduced[j], &reduced[j + 2], sizeof *reduced * (size_t)(groups - j - 2));
            groups -= 2;
        } else {
            groups -= 1;
        }
    }
    free(scratch);
    return NULL;
}

/* ---- argmax / argmin -------------------------------------------------------------------------- */

#define S_ABOVE_F(v, b) ((v) > (b) || ((v) != (v) && (b) == (b)))
#define S_BELOW_F(v, b) ((v) < (b) || ((v) != (v) && (b) == (b)))
#define S_ABOVE_I(v, b) ((v) > (b))
#define S_BELOW_I(v, b) ((v) < (b))

#define S_DEFINE_ARG(NAME, T, BETTER)                                                                                  \
    static void NAME(int64_t *index, T *values, const T *in, int64_t outer, int64_t n, int64_t inner)                  \
    {                                                                                                                  \
        for (int64_t o = 0; o < outer; o++) {                                                                          \
            T *best = values + o * inner;                                                                              \
            int64_t *at = index + o * inner;                                                                           \
            const T *x = in + o * n * inner;                                                                           \
            for (int64_t i = 0; i < inner; i++) {                                                                      \
                best[i] = x[i];                                                                                        \
                at[i] = 0;                                                                                             \
            }                                                                                                          \
            for (int64_t r = 1; r < n; r++) {                                                                          \
                const T *row = x + r * inner;                                                                          \
                for (int64_t i = 0; i < inner; i++) {                                                                  \
                    bool better = BETTER(row[i], best[i]);                                                             \
                    best[i] = better ? row[i] : best[i];                                                               \
                    at[i] = better ? r : at[i];                                                                        \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }

S_DEFINE_ARG(s_argmax_f32, float, S_ABOVE_F)
S_DEFINE_ARG(s_argmin_f32, float, S_BELOW_F)
S_DEFINE_ARG(s_argmax_i64, int64_t, S_ABOVE_I)
S_DEFINE_ARG(s_argmin_i64, int64_t, S_BELOW_I)

void cpu_arg_run(bool largest, cpu_ctype t, int64_t *index, void *values, const void *in, int64_t outer, int64_t n,
                 int64_t inner)
{
    if (t == CPU_F32)
        (largest ? s_argmax_f32 : s_argmin_f32)(index, values, in, outer, n, inner);
    else
        (largest ? s_argmax_i64 : s_argmin_i64)(index, values, in, outer, n, inner);
}

/* ---- softmax, cumsum ------------------------------------------------------------------------ */

/* Attention spends much of its time here. The portable loop takes three passes (the clamp, the
 * exponential, the sum: GCC vectorises neither of the first two fused with the other); where the
 * CPU has AVX2 and FMA, one pass in registers does the same arithmetic (its products and sums
 * contracted to multiply-adds). */
static float s_exp_shifted_sum(float *x, int64_t n, float top)
{
    for (int64_t r = 0; r < n; r++)
        x[r] = op_softmax_clamp(x[r] - top);
    for (int64_t r = 0; r < n; r++)
        x[r] = op_softmax_exp(x[r]);
    float total = 0.0f;
    if (n > 0)
        s_sum_f32(&total, x, 1, n, 1);
    return total;
}

#if defined(__x86_64__)
/* op_softmax_exp(op_softmax_clamp(x - top)) on a vector of W bits (256: 8 lanes, 512: 16): the same
 * arithmetic (the products and sums contracted to multiply-adds, as the compiler does), so the
 * weights match the scalar path's at either width. */
#define S_EXP_LANES(name, W, VEC, TARGET)                                                                              \
    static inline __attribute__((always_inline, target(TARGET))) VEC name(VEC x, VEC top)                              \
    {                                                                                                                  \
        const VEC shift = _mm##W##_set1_ps(12582912.0f); /* 1.5 * 2^23 */                                              \
        VEC d = _mm##W##_sub_ps(x, top);                                                                               \
        d = _mm##W##_min_ps(_mm##W##_setzero_ps(), _mm##W##_max_ps(_mm##W##_set1_ps(-88.0f), d));                      \
        VEC t = _mm##W##_fmadd_ps(d, _mm##W##_set1_ps(1.44269504f), shift), whole = _mm##W##_sub_ps(t, shift);         \
        VEC r = _mm##W##_fnmadd_ps(whole, _mm##W##_set1_ps(0.693145752f), d);                                          \
        r = _mm##W##_fnmadd_ps(whole, _mm##W##_set1_ps(1.42860677e-6f), r);                                            \
        VEC p = _mm##W##_set1_ps(1.0f / 40320);                                                                        \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.0f / 5040));                                                    \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.0f / 720));                                                     \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.0f / 120));                                                     \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.0f / 24));                                                      \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.0f / 6));                                                       \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(0.5f));                                                           \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.0f));                                                           \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.0f));                                                           \
        __typeof__(_mm##W##_castps_si##W(x)) n =                                                                       \
            _mm##W##_sub_epi32(_mm##W##_castps_si##W(t), _mm##W##_set1_epi32(0x4B400000 - 127));                       \
        return _mm##W##_mul_ps(p, _mm##W##_castsi##W##_ps(_mm##W##_slli_epi32(n, 23)));                                \
    }
S_EXP_LANES(s_exp8, 256, __m256, "avx2,fma")
S_EXP_LANES(s_exp16, 512, __m512, "avx512f")

__attribute__((target("avx2,fma"))) static float s_exp_shifted_sum_avx2(float *x, int64_t n, float top)
{
    __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps(), top8 = _mm256_set1_ps(top);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 e0 = s_exp8(_mm256_loadu_ps(x + j), top8), e1 = s_exp8(_mm256_loadu_ps(x + j + 8), top8);
        _mm256_storeu_ps(x + j, e0);
        _mm256_storeu_ps(x + j + 8, e1);
        sum0 = _mm256_add_ps(sum0, e0);
        sum1 = _mm256_add_ps(sum1, e1);
    }
    float lanes[8], total = 0.0f;
    _mm256_storeu_ps(lanes, _mm256_add_ps(sum0, sum1));
    for (int l = 0; l < 8; l++)
        total += lanes[l];
    for (; j < n; j++)
        total += x[j] = op_softmax_exp(op_softmax_clamp(x[j] - top));
    return total;
}

/* The exponentials into x, or into w as bfloat16 (the weights an AMX product reads: rounded here
 * in registers rather than in a pass of their own over the float row). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static float s_exp_shifted_sum_avx512(float *x, uint16_t *w,
                                                                                           int64_t n, float top)
{
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps(), top16 = _mm512_set1_ps(top);
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 e0 = s_exp16(_mm512_loadu_ps(x + j), top16), e1 = s_exp16(_mm512_loadu_ps(x + j + 16), top16);
        if (w) {
            _mm256_storeu_si256((__m256i *)(w + j), cpu_bf16_round16(e0));
            _mm256_storeu_si256((__m256i *)(w + j + 16), cpu_bf16_round16(e1));
        } else {
            _mm512_storeu_ps(x + j, e0);
            _mm512_storeu_ps(x + j + 16, e1);
        }
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
    }
    for (; j < n; j += 16) {
        __mmask16 lanes = cpu_lanes16(n - j);
        __m512 e = s_exp16(_mm512_maskz_loadu_ps(lanes, x + j), top16);
        if (w)
            _mm256_mask_storeu_epi16(w + j, lanes, cpu_bf16_round16(e));
        else
            _mm512_mask_storeu_ps(x + j, lanes, e);
        sum0 = _mm512_mask_add_ps(sum0, lanes, sum0, e);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

/* cpu_scaled_max's loop on 16 lanes */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static float s_scaled_max_avx512(float *x, int64_t n, float pre)
{
    __m512 top = _mm512_set1_ps(-INFINITY), by = _mm512_set1_ps(pre);
    __mmask16 nan = 0;
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 lanes = cpu_lanes16(n - j);
        __m512 v = _mm512_maskz_loadu_ps(lanes, x + j);
        if (pre != 1.0f) {
            v = _mm512_mul_ps(v, by);
            _mm512_mask_storeu_ps(x + j, lanes, v);
        }
        nan |= _mm512_mask_cmp_ps_mask(lanes, v, v, _CMP_UNORD_Q);
        top = _mm512_mask_max_ps(top, lanes, v, top);
    }
    return nan ? NAN : _mm512_reduce_max_ps(top);
}

/* cpu_scaled_max's loop on 8 lanes; the last few elements are the portable loop's */
__attribute__((target("avx2,fma"))) static float s_scaled_max_avx2(float *x, int64_t n, float pre, int64_t *done)
{
    __m256 top8 = _mm256_set1_ps(-INFINITY), nan8 = _mm256_setzero_ps(), by = _mm256_set1_ps(pre);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (pre != 1.0f) {
            v = _mm256_mul_ps(v, by);
            _mm256_storeu_ps(x + i, v);
        }
        top8 = _mm256_max_ps(v, top8);
        nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    *done = i;
    if (_mm256_movemask_ps(nan8))
        return NAN;
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, top8);
    for (int l = 0; l < 8; l++)
        top = lanes[l] > top ? lanes[l] : top;
    return top;
}
#endif

float cpu_scaled_max(float *x, int64_t n, float pre)
{
    float top = -INFINITY;
    int64_t i = 0;
#if defined(__x86_64__)
    if (cpu_has_avx512())
        return s_scaled_max_avx512(x, n, pre);
    if (cpu_has_avx2_fma())
        top = s_scaled_max_avx2(x, n, pre, &i);
#endif
    for (; i < n; i++) {
        if (pre != 1.0f)
            x[i] *= pre;
        top = top != top || x[i] != x[i] ? NAN : x[i] > top ? x[i] : top;
    }
    return top;
}

float cpu_exp_shifted_sum(float *x, uint16_t *w, int64_t n, float top)
{
    float total;
#if defined(__x86_64__)
    if (cpu_has_avx512())
        return s_exp_shifted_sum_avx512(x, w, n, top);
    if (cpu_has_avx2_fma())
        total = s_exp_shifted_sum_avx2(x, n, top);
    else
#endif
        total = s_exp_shifted_sum(x, n, top);
    if (w)
        cpu_from_ctype(w, DT_BFLOAT16, x, CPU_F32, n);
    return total;
}

/* A NaN in a row needs no care: it turns the row's sum, hence every output of the row, to NaN. */
const char *cpu_softmax_run(bool log, float *out, const float *in, int64_t outer, int64_t n, int64_t inner)
{
    if (inner == 1) {
        for (int64_t o = 0; o < outer; o++) {
            const float *x = in + o * n;
            float *y = out + o * n, top, total;
            s_max_f32(&top, x, 1, n, 1);
            for (int64_t r = 0; r < n; r++)
                y[r] = op_softmax_clamp(x[r] - top);
            for (int64_t r = 0; r < n; r++)
                y[r] = op_softmax_exp(y[r]);
            s_sum_f32(&total, y, 1, n, 1);
            if (log) {
                float shift = logf(total);
                for (int64_t r = 0; r < n; r++)
                    y[r] = (x[r] - top) - shift;
            } else {
                float scale = 1.0f / total;
                for (int64_t r = 0; r < n; r++)
                    y[r] *= scale;
            }
        }
        return NULL;
    }
    float *top = malloc(sizeof(float) * (size_t)(2 * inner)), *total = top + inner;
    if (!top)
        return "out of memory on the device";
    for (int64_t o = 0; o < outer; o++) {
        const float *x = in + o * n * inner;
        float *y = out + o * n * inner;
        for (int64_t i = 0; i < inner; i++) {
            top[i] = -INFINITY;
            total[i] = 0.0f;
        }
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < inner; i++)
                top[i] = S_MAX(top[i], x[r * inner + i]);
        for (int64_t r = 0; r < n; r++) {
            const float *restrict xr = x + r * inner, *restrict shift = top;
            float *restrict yr = y + r * inner;
            for (int64_t i = 0; i < inner; i++)
                yr[i] = op_softmax_clamp(xr[i] - shift[i]);
            for (int64_t i = 0; i < inner; i++)
                yr[i] = op_softmax_exp(yr[i]);
            for (int64_t i = 0; i < inner; i++)
                total[i] += yr[i];
        }
        if (log) {
            for (int64_t i = 0; i < inner; i++)
                total[i] = logf(total[i]);
            for (int64_t r = 0; r < n; r++)
                for (int64_t i = 0; i < inner; i++)
                    y[r * inner + i] = (x[r * inner + i] - top[i]) - total[i];
        } else {
            for (int64_t i = 0; i < inner; i++)
                total[i] = 1.0f / total[i];
            for (int64_t r = 0; r < n; r++)
                for (int64_t i = 0; i < inner; i++)
                    y[r * inner + i] *= total[i];
        }
    }
    free(top);
    return NULL;
}

#define S_DEFINE_CUMSUM(NAME, T, ADD)                                                                                  \
    static void NAME(T *out, const T *in, int64_t outer, int64_t n, int64_t inner)                                     \
    {                                                                                                                  \
        if (n == 0)                                                                                                    \
            return;                                                                                                    \
        for (int64_t o = 0; o < outer; o++) {                                                                          \
            const T *x = in + o * n * inner;                                                                           \
            T *y = out + o * n * inner;                                                                                \
            memcpy(y, x, (size_t)inner * sizeof(T));                                                                   \
            for (int64_t r = 1; r < n; r++)                                                                            \
                for (int64_t i = 0; i < inner; i++)                                                                    \
                    y[r * inner + i] = ADD(y[(r - 1) * inner + i], x[r * inner + i]);                                 \
        }                                                                                                              \
    }

S_DEFINE_CUMSUM(s_cumsum_f32, float, S_ADD)
S_DEFINE_CUMSUM(s_cumsum_i64, int64_t, S_ADD_WRAP)

void cpu_cumsum_run(cpu_ctype t, void *out, const void *in, int64_t outer, int64_t n, int64_t inner)
{
    if (t == CPU_F32)
        s_cumsum_f32(out, in, outer, n, inner);
    else
        s_cumsum_i64(out, in, outer, n, inner);
}

/* ---- top-k ---------------------------------------------------------------------------------- */

typedef struct {
    float v;
    int64_t i;
} s_pair_f32;

typedef struct {
    int64_t v;
    int64_t i;
} s_pair_i64;

/* -1, 0, 1 as a sits below, level with, above b; NaN above every number */
static int s_order_f32(float a, float b)
{
    bool an = a != a, bn = b != b;
    if (an || bn)
        return (int)an - (int)bn;
    return (a > b) - (a < b);
}

static int s_order_i64(int64_t a, int64_t b) { return (a > b) - (a < b); }

static int s_by_index(int64_t a, int64_t b) { return (a > b) - (a < b); }

static int s_desc_f32(const void *p, const void *q)
{
    const s_pair_f32 *a = p, *b = q;
    int c = s_order_f32(b->v, a->v);
    return c ? c : s_by_index(a->i, b->i);
}

static int s_asc_f32(const void *p, const void *q)
{
    const s_pair_f32 *a = p, *b = q;
    int c = s_order_f32(a->v, b->v);
    return c ? c : s_by_index(a->i, b->i);
}

static int s_desc_i64(const void *p, const void *q)
{
    const s_pair_i64 *a = p, *b = q;
    int c = s_order_i64(b->v, a->v);
    return c ? c : s_by_index(a->i, b->i);
}

static int s_asc_i64(const void *p, const void *q)
{
    const s_pair_i64 *a = p, *b = q;
    int c = s_order_i64(a->v, b->v);
    return c ? c : s_by_index(a->i, b->i);
}

/* The k best of a slice stay in a heap whose root is the worst kept (the one the next better
 * element replaces): O(n log k) per slice; then the k are sorted. Elements arrive in index order,
 * so an equal newcomer never displaces a kept one: ties keep the lower index. */
#define S_DEFINE_TOPK(NAME, T, PAIR, ORDER, DESC, ASC)                                                                 \
    static inline bool NAME##_before(PAIR a, PAIR b, bool largest)                                                     \
    {                                                                                                                  \
        int c = largest ? ORDER(a.v, b.v) : ORDER(b.v, a.v);                                                           \
        return c > 0 || (c == 0 && a.i < b.i);                                                                         \
    }                                                                                                                  \
    static void NAME##_sift(PAIR *heap, int64_t k, int64_t at, bool largest)                                           \
    {                                                                                                                  \
        for (;;) {                                                                                                     \
            int64_t worst = at, l = 2 * at + 1, r = l + 1;                                                             \
            if (l < k && NAME##_before(heap[worst], heap[l], largest))                                                 \
                worst = l;                                                                                             \
            if (r < k && NAME##_before(heap[worst], heap[r], largest))                                                 \
                worst = r;                                                                                             \
            if (worst == at)                                                                                           \
                return;                                                                                                \
            PAIR swap = heap[at];                                                                                      \
            heap[at] = heap[worst];                                                                                    \
            heap[worst] = swap;                                                                                        \
            at = worst;                                                                                                \
        }                                                                                                              \
    }                                                                                                                  \
    static void NAME(PAIR *heap, T *values, int64_t *index, const T *in, int64_t outer, int64_t n, int64_t inner,      \
                     int64_t k, bool largest)                                                                          \
    {                                                                                                                  \
        if (k == 0)                                                                                                    \
            return;                                                                                                    \
        for (int64_t o = 0; o < outer; o++)                                                                            \
            for (int64_t i = 0; i < inner; i++) {                                                                      \
                const T *x = in + o * n * inner + i;                                                                   \
                for (int64_t r = 0; r < k; r++)                                                                        \
                    heap[r] = (PAIR){x[r * inner], r};                                                                 \
                for (int64_t at = k / 2; at-- > 0;)                                                                    \
                    NAME##_sift(heap, k, at, largest);                                                                 \
                for (int64_t r = k; r < n; r++) {                                                                      \
                    PAIR e = {x[r * inner], r};                                                                        \
                    if (NAME##_before(e, heap[0], largest)) {                                                          \
                        heap[0] = e;                                                                                   \
                        NAME##_sift(heap, k, 0, largest);                                                              \
                    }                                                                                                  \
                }                                                                                                      \
                qsort(heap, (size_t)k, sizeof *heap, largest ? DESC : ASC);                                            \
                T *v = values + o * k * inner + i;                                                                     \
                int64_t *at = index + o * k * inner + i;                                                               \
                for (int64_t r = 0; r < k; r++) {                                                                      \
                    v[r * inner] = heap[r].v;                                                                          \
                    at[r * inner] = heap[r].i;                                                                         \
                }                                                                                                      \
            }                                                                                                          \
    }

S_DEFINE_TOPK(s_topk_f32, float, s_pair_f32, s_order_f32, s_desc_f32, s_asc_f32)
S_DEFINE_TOPK(s_topk_i64, int64_t, s_pair_i64, s_order_i64, s_desc_i64, s_asc_i64)

const char *cpu_topk_run(cpu_ctype t, void *values, int64_t *index, const void *in, int64_t outer, int64_t n,
                         int64_t inner, int64_t k, bool largest)
{
    void *heap = malloc((size_t)(k ? k : 1) * sizeof(s_pair_i64));
    if (!heap)
        return "out of memory on the device";
    if (t == CPU_F32)
        s_topk_f32(heap, values, index, in, outer, n, inner, k, largest);
    else
        s_topk_i64(heap, values, index, in, outer, n, inner, k, largest);
    free(heap);
    return NULL;
}

/* ---- layer norm, rms norm ------------------------------------------------------------------- */

/* sum of (x[j] - shift)^power for power 1 or 2, in lanes */
static inline __attribute__((always_inline)) float s_moment(const float *x, int64_t n, float shift, int power)
{
    float acc[S_LANES] = {0};
    int64_t j = 0;
    for (; j + S_LANES <= n; j += S_LANES)
        for (int l = 0; l < S_LANES; l++) {
            float v = x[j + l] - shift;
            acc[l] += power == 2 ? v * v : v;
        }
    float s = 0.0f;
    for (; j < n; j++) {
        float v = x[j] - shift;
        s += power == 2 ? v * v : v;
    }
    for (int l = 0; l < S_LANES; l++)
        s += acc[l];
    return s;
}

/* cpu_norm_run's loops, cloned (a bfloat16 prompt's norms spent most of their time in SSE's 4 lanes) */
CPU_CLONES static void s_norm_rows(bool rms, float *out, const float *in, int64_t rows, int64_t d,
                                   const float *weight, const float *bias, float eps)
{
    if (d == 0)
        return;
    for (int64_t row = 0; row < rows; row++) {
        const float *x = in + row * d;
        float *y = out + row * d;
        float mean = rms ? 0.0f : s_moment(x, d, 0.0f, 1) / (float)d;
        float var = s_moment(x, d, mean, 2) / (float)d;
        float rstd = 1.0f / sqrtf(var + eps);
        /* one loop per case, each of the same arithmetic per element: with the weight and bias
         * tests inside, the loop stayed scalar (a 512 x 768 rms_norm took 0.4 ms) */
        if (weight && bias)
            for (int64_t j = 0; j < d; j++)
                y[j] = (x[j] - mean) * rstd * weight[j] + bias[j];
        else if (weight)
            for (int64_t j = 0; j < d; j++)
                y[j] = (x[j] - mean) * rstd * weight[j];
        else if (bias)
            for (int64_t j = 0; j < d; j++)
                y[j] = (x[j] - mean) * rstd + bias[j];
        else
            for (int64_t j = 0; j < d; j++)
                y[j] = (x[j] - mean) * rstd;
    }
}

void cpu_norm_run(bool rms, float *out, const float *in, int64_t rows, int64_t d, const float *weight,
                  const float *bias, float eps)
{
    s_norm_rows(rms, out, in, rows, d, weight, bias, eps);
}
