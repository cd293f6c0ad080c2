#include "cpu_reduce.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtorch.h"

/* Partial results kept side by side when reducing along the last dim: independent lanes the
 * compiler turns into vector registers (a single running value would serialise every add). */
#define S_LANES 16

#define S_ADD(a, b) ((a) + (b))
/* integer sums wrap on overflow, as torch's do (in unsigned arithmetic: signed overflow is undefined) */
#define S_ADD_WRAP(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
/* b when it wins over a; a NaN wins over any number and stays */
#define S_MAX_F(a, b) ((b) > (a) || (b) != (b) ? (b) : (a))
#define S_MIN_F(a, b) ((b) < (a) || (b) != (b) ? (b) : (a))
#define S_MAX_I(a, b) ((b) > (a) ? (b) : (a))
#define S_MIN_I(a, b) ((b) < (a) ? (b) : (a))

/* out (outer, inner) = COMBINE over n of in (outer, n, inner), starting from INIT. */
#define S_DEFINE_REDUCE(NAME, T, COMBINE, INIT)                                                                        \
    static void NAME(T *out, const T *in, int64_t outer, int64_t n, int64_t inner)                                     \
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
S_DEFINE_REDUCE(s_max_f32, float, S_MAX_F, -INFINITY)
S_DEFINE_REDUCE(s_min_f32, float, S_MIN_F, INFINITY)
S_DEFINE_REDUCE(s_sum_i64, int64_t, S_ADD_WRAP, 0)
S_DEFINE_REDUCE(s_max_i64, int64_t, S_MAX_I, INT64_MIN)
S_DEFINE_REDUCE(s_min_i64, int64_t, S_MIN_I, INT64_MAX)

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
    int groups = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1)
            continue;
        bool r = (mask >> d) & 1u;
        if (groups > 0 && reduced[groups - 1] == r) {
            size[groups - 1] *= shape[d];
        } else {
            size[groups] = shape[d];
            reduced[groups++] = r;
        }
    }
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

const char *cpu_softmax_run(bool log, float *out, const float *in, int64_t outer, int64_t n, int64_t inner)
{
    float *top = malloc(sizeof(float) * (size_t)(2 * inner + 1)), *total = top + inner;
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
                top[i] = S_MAX_F(top[i], x[r * inner + i]);
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < inner; i++) {
                float e = expf(x[r * inner + i] - top[i]);
                y[r * inner + i] = e;
                total[i] += e;
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

#define S_DEFINE_TOPK(NAME, T, PAIR, DESC, ASC)                                                                        \
    static void NAME(PAIR *pairs, T *values, int64_t *index, const T *in, int64_t outer, int64_t n, int64_t inner,     \
                     int64_t k, bool largest)                                                                          \
    {                                                                                                                  \
        for (int64_t o = 0; o < outer; o++)                                                                            \
            for (int64_t i = 0; i < inner; i++) {                                                                      \
                const T *x = in + o * n * inner + i;                                                                   \
                for (int64_t r = 0; r < n; r++)                                                                        \
                    pairs[r] = (PAIR){x[r * inner], r};                                                                \
                qsort(pairs, (size_t)n, sizeof *pairs, largest ? DESC : ASC);                                          \
                T *v = values + o * k * inner + i;                                                                     \
                int64_t *at = index + o * k * inner + i;                                                               \
                for (int64_t r = 0; r < k; r++) {                                                                      \
                    v[r * inner] = pairs[r].v;                                                                         \
                    at[r * inner] = pairs[r].i;                                                                        \
                }                                                                                                      \
            }                                                                                                          \
    }

S_DEFINE_TOPK(s_topk_f32, float, s_pair_f32, s_desc_f32, s_asc_f32)
S_DEFINE_TOPK(s_topk_i64, int64_t, s_pair_i64, s_desc_i64, s_asc_i64)

const char *cpu_topk_run(cpu_ctype t, void *values, int64_t *index, const void *in, int64_t outer, int64_t n,
                         int64_t inner, int64_t k, bool largest)
{
    void *pairs = malloc((size_t)(n ? n : 1) * sizeof(s_pair_i64));
    if (!pairs)
        return "out of memory on the device";
    if (t == CPU_F32)
        s_topk_f32(pairs, values, index, in, outer, n, inner, k, largest);
    else
        s_topk_i64(pairs, values, index, in, outer, n, inner, k, largest);
    free(pairs);
    return NULL;
}

/* ---- layer norm, rms norm ------------------------------------------------------------------- */

/* sum of (x[j] - shift)^power for power 1 or 2, in lanes */
static float s_moment(const float *x, int64_t n, float shift, int power)
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

void cpu_norm_run(bool rms, float *out, const float *in, int64_t rows, int64_t d, const float *weight,
                  const float *bias, float eps)
{
    if (d == 0)
        return;
    for (int64_t row = 0; row < rows; row++) {
        const float *x = in + row * d;
        float *y = out + row * d;
        float mean = rms ? 0.0f : s_moment(x, d, 0.0f, 1) / (float)d;
        float var = s_moment(x, d, mean, 2) / (float)d;
        float rstd = 1.0f / sqrtf(var + eps);
        for (int64_t j = 0; j < d; j++) {
            float v = (x[j] - mean) * rstd;
            if (weight)
                v *= weight[j];
            if (bias)
                v += bias[j];
            y[j] = v;
        }
    }
}
