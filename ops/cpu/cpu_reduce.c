/* cpu_reduce — the CPU kernels of the reductions: vectorised reductions, arg-extremes, softmax,
 * cumulative sums, top-k and normalisation over compute-type arrays, and the kernels of the
 * reduction ops (OP_REDUCE) that convert pieces into them a chunk at a time. */
#include "cpu_reduce.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "dt_dtype.h"
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
S_DEFINE_REDUCE(s_sum_i64, int64_t, S_ADD_WRAP, 0)
S_DEFINE_REDUCE(s_max_i64, int64_t, S_MAX, INT64_MIN)
S_DEFINE_REDUCE(s_min_i64, int64_t, S_MIN, INT64_MAX)

/* float max/min: as above, and a NaN anywhere makes the result NaN (torch's rule) */
#define S_DEFINE_EXTREME_F32(NAME, COMBINE, INIT)                                                                      \
    static void NAME(float *out, const float *in, int64_t outer, int64_t n, int64_t inner)                             \
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

/* ---- the kernels of the ops (OP_REDUCE in ops/op_table.h) --------------------------------------
 * ctx (worked out by op_reduce.c): list reductions [reduced dims mask, elements each output
 * averages]; ops along a dim [the dim, or -1 for every element]; norms [elements normalised
 * together, has_weight | has_bias << 1].
 *
 * Kernels compute in float32 or int64. A piece of another dtype is converted a chunk at a time,
 * in whole blocks of its outermost dim, into scratch that stays in cache and is reused: a
 * full-size copy costs more in page faults than the reduction itself. */

#define S_CHUNK 16384 /* elements converted at a time */

static const char *const s_oom = "out of memory on the device";

static bool s_native(dt_dtype d, cpu_ctype t)
{
    return (t == CPU_F32 && d == DT_FLOAT32) || (t == CPU_I64 && d == DT_INT64);
}

static cpu_ctype s_ctype(dt_dtype d) { return dt_dtype_is_float(d) ? CPU_F32 : CPU_I64; }

static void *s_alloc(int64_t n, size_t elem) { return malloc((size_t)(n > 0 ? n : 1) * elem); }

static int64_t s_min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t s_attr(const op_attrs *a, int i, int64_t otherwise) { return i < a->nints ? a->ints[i] : otherwise; }

/* (outer, n, inner) of a C-contiguous shape seen along dim (-1: the whole array as one row). */
static void s_split(int ndim, const int64_t *shape, int dim, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = 1;
    *n = 1;
    *inner = 1;
    if (dim < 0) {
        *n = dt_layout_numel(ndim, shape);
        return;
    }
    for (int d = 0; d < ndim; d++) {
        if (d < dim)
            *outer *= shape[d];
        else if (d == dim)
            *n = shape[d];
        else
            *inner *= shape[d];
    }
}


/* Converting to cast (what a dtype= argument asks for) first loses what the compute type would
 * keep: to a 16-bit float, or to bool. */
static bool s_lossy(dt_dtype from, dt_dtype cast)
{
    return cast != from && (cast == DT_FLOAT16 || cast == DT_BFLOAT16 || cast == DT_BOOL);
}

/* Reads a piece in compute type t, as torch sees it after converting it to cast. */
typedef struct {
    const op_local *piece;
    cpu_ctype t;
    dt_dtype cast;
    bool direct;  /* the piece is in t already: no copy */
    void *buf;    /* a chunk in t */
    void *narrow; /* a chunk in cast (lossy casts only) */
} s_reader;

static bool s_reader_init(s_reader *r, const op_local *piece, cpu_ctype t, dt_dtype cast, int64_t chunk)
{
    bool lossy = s_lossy(piece->dtype, cast);
    *r = (s_reader){piece, t, cast, s_native(piece->dtype, t) && !lossy, NULL, NULL};
    if (r->direct)
        return true;
    r->buf = s_alloc(chunk, cpu_ctype_size(t));
    r->narrow = lossy ? s_alloc(chunk, dt_dtype_size(cast)) : NULL;
    return r->buf && (!lossy || r->narrow);
}

/* count elements from first */
static const void *s_read(s_reader *r, int64_t first, int64_t count)
{
    const char *src = (const char *)r->piece->data + first * (int64_t)dt_dtype_size(r->piece->dtype);
    if (r->direct)
        return src;
    if (r->narrow) {
        cpu_ctype via = r->cast == DT_BOOL ? CPU_U8 : CPU_F32; /* buf holds either */
        cpu_to_ctype(r->buf, via, src, r->piece->dtype, count);
        cpu_from_ctype(r->narrow, r->cast, r->buf, via, count);
        cpu_to_ctype(r->buf, r->t, r->narrow, r->cast, count);
    } else {
        cpu_to_ctype(r->buf, r->t, src, r->piece->dtype, count);
    }
    return r->buf;
}

static void s_reader_free(s_reader *r)
{
    free(r->buf);
    free(r->narrow);
}

/* Writes an output computed in t: in place when it is of type t, else through a chunk. */
typedef struct {
    op_local *piece;
    cpu_ctype t;
    void *buf;
} s_writer;

static bool s_writer_init(s_writer *w, op_local *piece, cpu_ctype t, int64_t chunk)
{
    bool native = s_native(piece->dtype, t);
    *w = (s_writer){piece, t, native ? NULL : s_alloc(chunk, cpu_ctype_size(t))};
    return native || w->buf;
}

/* where the kernel writes the elements from first */
static void *s_slot(s_writer *w, int64_t first)
{
    return w->buf ? w->buf : (char *)w->piece->data + first * (int64_t)cpu_ctype_size(w->t);
}

static void s_flush(s_writer *w, int64_t first, int64_t count)
{
    if (w->buf)
        cpu_from_ctype((char *)w->piece->data + first * (int64_t)dt_dtype_size(w->piece->dtype), w->piece->dtype,
                       w->buf, w->t, count);
}

static void s_divide(float *v, int64_t n, int64_t count)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)((double)v[i] / (double)count);
}

/* sum, mean, amax, amin, max, min: converted pieces go a block of dim-0 rows at a time; when
 * dim 0 is reduced, each block's result is combined into the first one's. */
static const char *s_cpu_list(op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int id = k->def->id;
    uint32_t mask;
    int64_t n_out, extent;
    const char *bad = op_reduce_layout(k, &mask, &extent, &n_out);
    if (bad)
        return bad;
    if (n_out == 0)
        return NULL;
    if (extent == 0) { /* an empty shard (or an empty reduced dim, for sum and mean) */
        if (id == OP_ID_sum)
            cpu_fill(out->data, out->dtype, n_out, (dt_scalar){.is_int = true, .i = 0});
        else if (id == OP_ID_mean)
            cpu_fill(out->data, out->dtype, n_out, (dt_scalar){.f = k->ctx[1] ? 0.0 : NAN});
        else
            cpu_fill(out->data, out->dtype, n_out, op_reduce_identity(out->dtype, id == OP_ID_amax || id == OP_ID_max));
        return NULL;
    }
    bool sum = id == OP_ID_sum || id == OP_ID_mean;
    cpu_red op = sum ? CPU_RED_SUM : id == OP_ID_amax || id == OP_ID_max ? CPU_RED_MAX : CPU_RED_MIN;
    cpu_ctype t = s_ctype(out->dtype);
    dt_dtype cast = sum ? out->dtype : in->dtype;
    int64_t rows = in->ndim ? in->shape[0] : 1, slab = dt_layout_numel(in->ndim, in->shape) / rows;
    bool folded = in->ndim > 0 && (mask & 1u); /* dim 0 is reduced */
    bool direct = s_native(in->dtype, t) && !s_lossy(in->dtype, cast);
    int64_t step = direct ? rows : s_min64(rows, S_CHUNK / slab > 1 ? S_CHUNK / slab : 1);
    int64_t out_slab = folded ? 0 : n_out / rows;
    s_reader rd;
    s_writer wr;
    void *part = folded && step < rows ? s_alloc(n_out, cpu_ctype_size(t)) : NULL;
    bool ok = s_reader_init(&rd, in, t, cast, step * slab);
    ok = s_writer_init(&wr, out, t, folded ? n_out : step * out_slab) && ok;
    const char *why = ok && (part || !folded || step == rows) ? NULL : s_oom;
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, in->shape, sizeof shape);
    for (int64_t r0 = 0; r0 < rows && !why; r0 += step) {
        int64_t count = s_min64(step, rows - r0);
        if (in->ndim)
            shape[0] = count;
        const void *x = s_read(&rd, r0 * slab, count * slab);
        if (folded) {
            void *acc = s_slot(&wr, 0);
            why = cpu_reduce_dims(op, t, r0 ? part : acc, x, in->ndim, shape, mask);
            if (!why && r0)
                cpu_combine(op, t, acc, part, n_out);
            continue;
        }
        void *y = s_slot(&wr, r0 * out_slab);
        why = cpu_reduce_dims(op, t, y, x, in->ndim, shape, mask);
        if (!why && id == OP_ID_mean)
            s_divide(y, count * out_slab, k->ctx[1]);
        if (!why)
            s_flush(&wr, r0 * out_slab, count * out_slab);
    }
    if (!why && folded) {
        if (id == OP_ID_mean)
            s_divide(s_slot(&wr, 0), n_out, k->ctx[1]);
        s_flush(&wr, 0, n_out);
    }
    s_reader_free(&rd);
    free(wr.buf);
    free(part);
    return why;
}

/* One chunk of outer blocks of an op along a dim (or of normalised rows). */
static const char *s_run_along(const op_kernel *k, cpu_ctype t, void *y, int64_t *index, const void *x,
                               int64_t outer, int64_t n, int64_t inner, const float *weight, const float *bias)
{
    int id = k->def->id;
    switch (id) {
    case OP_ID_max_dim:
    case OP_ID_min_dim:
    case OP_ID_argmax:
    case OP_ID_argmin:
        cpu_arg_run(id == OP_ID_max_dim || id == OP_ID_argmax, t, index, y, x, outer, n, inner);
        return NULL;
    case OP_ID_softmax:
    case OP_ID_log_softmax:
        return cpu_softmax_run(id == OP_ID_log_softmax, y, x, outer, n, inner);
    case OP_ID_cumsum:
        cpu_cumsum_run(t, y, x, outer, n, inner);
        return NULL;
    case OP_ID_topk:
        return cpu_topk_run(t, y, index, x, outer, n, inner, s_attr(k->attrs, 0, 1), s_attr(k->attrs, 2, 1) != 0);
    default: {
        float eps = k->attrs->nfloats > 0 ? (float)k->attrs->floats[0] : FLT_EPSILON;
        cpu_norm_run(id == OP_ID_rms_norm, y, x, outer, n, weight, bias, eps);
        return NULL;
    }
    }
}

/* max/min along a dim, argmax/argmin, softmax, log_softmax, cumsum, topk, layer_norm, rms_norm:
 * the piece is (outer, n, inner) and goes a chunk of outer blocks at a time. */
static const char *s_cpu_along(op_kernel *k)
{
    const op_local *in = &k->in[0];
    int id = k->def->id;
    bool norm = id == OP_ID_layer_norm || id == OP_ID_rms_norm, arg = id == OP_ID_argmax || id == OP_ID_argmin;
    int64_t outer, n, inner, out_block;
    if (k->nctx < (norm ? 2 : 1))
        return "missing arguments (internal error)";
    if (norm) {
        n = k->ctx[0];
        inner = 1;
        outer = n ? dt_layout_numel(in->ndim, in->shape) / n : 0;
    } else {
        s_split(in->ndim, in->shape, (int)k->ctx[0], &outer, &n, &inner);
    }
    switch (id) {
    case OP_ID_max_dim: case OP_ID_min_dim: case OP_ID_argmax: case OP_ID_argmin: out_block = n ? inner : 0; break;
    case OP_ID_topk: out_block = s_attr(k->attrs, 0, 1) * inner; break;
    default: out_block = n * inner; break;
    }
    if (outer == 0 || out_block == 0)
        return NULL;
    cpu_ctype t = norm || id == OP_ID_softmax || id == OP_ID_log_softmax ? CPU_F32
                  : id == OP_ID_cumsum                                ? s_ctype(k->out[0].dtype)
                                                                    : s_ctype(in->dtype);
    dt_dtype cast = id == OP_ID_softmax || id == OP_ID_log_softmax || id == OP_ID_cumsum ? k->out[0].dtype : in->dtype;
    int64_t *index = arg ? k->out[0].data : id == OP_ID_max_dim || id == OP_ID_min_dim || id == OP_ID_topk ? k->out[1].data
                                                                                                    : NULL;
    int64_t in_block = n * inner, widest = in_block > out_block ? in_block : out_block;
    bool direct = s_native(in->dtype, t) && !s_lossy(in->dtype, cast) && (arg || s_native(k->out[0].dtype, t));
    int64_t step = direct ? outer : s_min64(outer, S_CHUNK / widest > 1 ? S_CHUNK / widest : 1);
    s_reader rd, rw = {0}, rb = {0};
    s_writer wr = {0};
    void *values = NULL; /* argmax/argmin: the extreme values, not an output */
    bool ok = s_reader_init(&rd, in, t, cast, step * in_block);
    if (arg)
        ok = (values = s_alloc(step * out_block, cpu_ctype_size(t))) && ok;
    else
        ok = s_writer_init(&wr, &k->out[0], t, step * out_block) && ok;
    const float *weight = NULL, *bias = NULL;
    int64_t flags = norm ? k->ctx[1] : 0;
    if (flags & 1) {
        ok = s_reader_init(&rw, &k->in[1], CPU_F32, k->in[1].dtype, n) && ok;
        weight = ok ? s_read(&rw, 0, n) : NULL;
    }
    if (flags & 2) {
        const op_local *b = &k->in[flags & 1 ? 2 : 1];
        ok = s_reader_init(&rb, b, CPU_F32, b->dtype, n) && ok;
        bias = ok ? s_read(&rb, 0, n) : NULL;
    }
    const char *why = ok ? NULL : s_oom;
    for (int64_t o0 = 0; o0 < outer && !why; o0 += step) {
        int64_t count = s_min64(step, outer - o0);
        const void *x = s_read(&rd, o0 * in_block, count * in_block);
        void *y = arg ? values : s_slot(&wr, o0 * out_block);
        why = s_run_along(k, t, y, index ? index + o0 * out_block : NULL, x, count, n, inner, weight, bias);
        if (!why && !arg)
            s_flush(&wr, o0 * out_block, count * out_block);
    }
    s_reader_free(&rd);
    s_reader_free(&rw);
    s_reader_free(&rb);
    free(wr.buf);
    free(values);
    return why;
}

const cpu_op_kernel cpu_reduce_kernels[OP_ID_LIMIT] = {
    [OP_ID_sum] = s_cpu_list,          [OP_ID_mean] = s_cpu_list,          [OP_ID_amax] = s_cpu_list,
    [OP_ID_amin] = s_cpu_list,         [OP_ID_max] = s_cpu_list,           [OP_ID_min] = s_cpu_list,
    [OP_ID_max_dim] = s_cpu_along,     [OP_ID_min_dim] = s_cpu_along,      [OP_ID_argmax] = s_cpu_along,
    [OP_ID_argmin] = s_cpu_along,      [OP_ID_softmax] = s_cpu_along,      [OP_ID_log_softmax] = s_cpu_along,
    [OP_ID_cumsum] = s_cpu_along,      [OP_ID_topk] = s_cpu_along,         [OP_ID_layer_norm] = s_cpu_along,
    [OP_ID_rms_norm] = s_cpu_along,
};
