/* cpu_rope — the rotary embedding kernel (ops/op_rope.c's op): a cos/sin table per (batch row,
 * position), applied to every head there.
 *
 * The table depends on the positions, the frequencies and the scaling alone, and a model rotates
 * q and k at the same positions in every layer (24 calls of a 12-layer prompt): each thread keeps
 * the last table it computed, with the values it came from, and reuses it when a call brings the
 * same values (compared, not trusted by address). Computing it took most of the op's time (a cosf
 * and a sinf per frequency and position). */
#include "cpu_rope.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

/* A thread's last table: rows of half cosines then half sines, one row per (batch row, position). */
typedef struct {
    int64_t rows, half;
    float scaling;
    int64_t *positions; /* rows */
    float *inv_freq;    /* half */
    float *table;       /* rows * 2 * half */
} s_table;

static pthread_key_t s_key;
static pthread_once_t s_key_once = PTHREAD_ONCE_INIT;

static void s_table_free(void *p)
{
    s_table *t = p;
    if (t) {
        free(t->positions);
        free(t->inv_freq);
        free(t->table);
        free(t);
    }
}

static void s_key_make(void) { pthread_key_create(&s_key, s_table_free); }

/* The table for rows positions, half frequencies and scaling: the thread's kept one when it was
 * made from the same values, else computed into it. NULL when memory ran out. */
static const float *s_table_for(const int64_t *positions, int64_t rows, const float *inv_freq, int64_t half,
                                float scaling)
{
    pthread_once(&s_key_once, s_key_make);
    s_table *t = pthread_getspecific(s_key);
    if (!t) {
        if (!(t = calloc(1, sizeof *t)) || pthread_setspecific(s_key, t) != 0) {
            free(t);
            return NULL;
        }
    }
    if (t->table && t->rows == rows && t->half == half && memcmp(&t->scaling, &scaling, sizeof scaling) == 0 &&
        memcmp(t->positions, positions, (size_t)rows * sizeof *positions) == 0 &&
        memcmp(t->inv_freq, inv_freq, (size_t)half * sizeof *inv_freq) == 0)
        return t->table;
    size_t cells;
    if (__builtin_mul_overflow((size_t)rows, (size_t)(2 * half), &cells) || cells > SIZE_MAX / sizeof(float))
        return NULL;
    free(t->positions);
    free(t->inv_freq);
    free(t->table);
    t->positions = malloc((size_t)(rows ? rows : 1) * sizeof *positions);
    t->inv_freq = malloc((size_t)(half ? half : 1) * sizeof *inv_freq);
    t->table = malloc((cells ? cells : 1) * sizeof(float));
    if (!t->positions || !t->inv_freq || !t->table) {
        free(t->positions);
        free(t->inv_freq);
        free(t->table);
        t->positions = NULL;
        t->inv_freq = NULL;
        t->table = NULL;
        return NULL;
    }
    memcpy(t->positions, positions, (size_t)rows * sizeof *positions);
    memcpy(t->inv_freq, inv_freq, (size_t)half * sizeof *inv_freq);
    t->rows = rows;
    t->half = half;
    t->scaling = scaling;
    for (int64_t r = 0; r < rows; r++) {
        float p = (float)positions[r], *cs = t->table + r * 2 * half, *sn = cs + half;
        for (int64_t i = 0; i < half; i++) {
            float angle = inv_freq[i] * p;
            cs[i] = cosf(angle) * scaling;
            sn[i] = sinf(angle) * scaling;
        }
    }
    return t->table;
}

/* One row of 16-bit x rotated into out (row, half, cs, sn in scope), through float32. */
#define S_ROTATE_16(widen, round)                                                                                      \
    do {                                                                                                               \
        const uint16_t *xr = (const uint16_t *)x + row;                                                                \
        uint16_t *o = (uint16_t *)out + row;                                                                           \
        for (int64_t i = 0; i < half; i++) {                                                                           \
            float x1 = widen(xr[i]), x2 = widen(xr[i + half]);                                                         \
            o[i] = round(x1 * cs[i] - x2 * sn[i]);                                                                     \
            o[i + half] = round(x2 * cs[i] + x1 * sn[i]);                                                              \
        }                                                                                                              \
    } while (0)

/* A bfloat16 row on 16 lanes, the last few masked: the portable loop's arithmetic (no multiply-add
 * contracted), the same bits. */
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void s_rotate_bf16_avx512(uint16_t *o, const uint16_t *xr,
                                                                                      int64_t half, const float *cs,
                                                                                      const float *sn)
{
    for (int64_t i = 0; i < half; i += 16) {
        __mmask16 lanes = cpu_lanes16(half - i);
        __m512 x1 = cpu_bf16_load16(xr + i, lanes), x2 = cpu_bf16_load16(xr + i + half, lanes);
        __m512 c = _mm512_maskz_loadu_ps(lanes, cs + i), s = _mm512_maskz_loadu_ps(lanes, sn + i);
        __m512 lo = _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s));
        __m512 hi = _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s));
        _mm256_mask_storeu_epi16(o + i, lanes, cpu_bf16_round16(lo));
        _mm256_mask_storeu_epi16(o + i + half, lanes, cpu_bf16_round16(hi));
    }
}
#endif

const char *cpu_rope(void *out, const void *x, dt_dtype dtype, int64_t B, int64_t H, int64_t S, int64_t D,
              const int64_t *positions, int64_t pos_batch, const float *inv_freq, float scaling)
{
    int64_t half = D / 2;
    const float *table = s_table_for(positions, pos_batch * S, inv_freq, half, scaling);
    if (!table)
        return "out of memory on the device";
#if defined(__x86_64__)
    bool wide = dtype == DT_BFLOAT16 && cpu_has_avx512();
#endif
    /* rows in the order they lie: (batch, head, position) */
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            for (int64_t s = 0; s < S; s++) {
                const float *cs = table + ((pos_batch == 1 ? 0 : b) * S + s) * 2 * half, *sn = cs + half;
                int64_t row = ((b * H + h) * S + s) * D;
#if defined(__x86_64__)
                if (wide) {
                    s_rotate_bf16_avx512((uint16_t *)out + row, (const uint16_t *)x + row, half, cs, sn);
                    continue;
                }
#endif
                if (dtype == DT_FLOAT32) {
                    const float *xr = (const float *)x + row;
                    float *o = (float *)out + row;
                    for (int64_t i = 0; i < half; i++) {
                        float x1 = xr[i], x2 = xr[i + half];
                        o[i] = x1 * cs[i] - x2 * sn[i];
                        o[i + half] = x2 * cs[i] + x1 * sn[i];
                    }
                } else if (dtype == DT_BFLOAT16) {
                    S_ROTATE_16(dt_bf16_to_f32, dt_f32_to_bf16);
                } else {
                    S_ROTATE_16(dt_f16_to_f32, dt_f32_to_f16);
                }
            }
        }
    }
    return NULL;
}

const char *cpu_k_rope(op_kernel *k)
{
    const op_local *x = &k->in[0], *pos = &k->in[1];
    const char *why = op_rope_local(k);
    if (why || dt_layout_numel(x->ndim, x->shape) == 0)
        return why;
    return cpu_rope(k->out[0].data, x->data, x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                    pos->data, pos->shape[0], k->in[2].data, (float)k->attrs->floats[0]);
}
