/* cpu_attention_tiles — attention's two products for a block of many query rows, in AVX-512 or AVX2
 * register tiles (cpu_matmul.c's cpu_attention_head takes them where the CPU has AVX2 and FMA).
 *
 * At attention's head sizes (32-128 features) the two BLAS products of a block are thin: sgemm
 * packs both operands, zeroes the scores before adding into them (beta = 0) and packs the weights
 * again for the second product, work of the order of the multiply-adds themselves when K = 32
 * (a 768-token head spent a fifth of its time there). Here the keys are laid out once per head in
 * panels of 8 keys by feature, the scores come from 6 query rows x 16 keys at a time in
 * registers (the query's features broadcast from where they lie), and the weighted sum reads the
 * weights and the value rows where they lie, 3 query rows x 32 value features at a time.
 *
 * Decode's few query rows go one at a time, against the cache as it lies (float32 or 16-bit): the
 * scores 8 keys at a time (8 accumulators, one load of the query per 8 features for all 8 keys),
 * the weighted sum over the keys with the output row in up to 8 registers. Key by key through a
 * dot product and an axpy into memory, a 144-key head of 64 features cost about twice as long. */
#include "cpu_kernels.h"
#include "cpu_matmul.h"

#include <math.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define S_AVX2 __attribute__((target("avx2,fma,f16c")))
#define S_TILE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define S_UNROLL _Pragma("GCC unroll 8")
#define S_SCORE_ROWS 6  /* query rows per score tile (x 2 panels: 12 accumulators) */
#define S_VALUE_ROWS 3  /* query rows per weighted-sum tile (x 4 vectors: 12 accumulators) */

bool cpu_attention_tiles_fit(int64_t Ev)
{
    return Ev % 8 == 0 && cpu_has_avx2_fma();
}

/* Keys per panel: a vector's lanes, 16 where the CPU has AVX-512 (its tiles below), else 8. */
static int64_t s_panel(void) { return cpu_has_avx512() ? 16 : 8; }

int64_t cpu_attention_panel_floats(int64_t S, int64_t E)
{
    int64_t w = s_panel();
    return (S + w - 1) / w * w * E;
}

void cpu_attention_pack_keys(int64_t S, int64_t E, const float *k, float *kt)
{
    int64_t w = s_panel();
    for (int64_t p = 0; p < (S + w - 1) / w; p++)
        for (int64_t e = 0; e < E; e++)
            for (int64_t l = 0; l < w; l++)
                kt[(p * E + e) * w + l] = w * p + l < S ? k[(w * p + l) * E + e] : 0.0f;
}

/* ---- many query rows on AVX-512: the tiles below on 16 lanes ---------------------------------
 * Every score and output element sums its products in the same order as the AVX2 tiles' (over the
 * features, then over the keys, one multiply-add each), so both give the same bits; 32 registers
 * hold 8 query rows x 2 panels of scores, 6 rows x 2 vectors of values. */
#define S_TILE512 static inline __attribute__((always_inline, target("avx512f")))
#define S_AVX512 __attribute__((target("avx512f")))
#define S_SCORE_ROWS16 8
#define S_VALUE_ROWS16 6

S_TILE512 void s_score_tile16(int R, int P, int64_t E, const float *q, const float *kt, float scale, float *out,
                              int64_t ld, int64_t j0, int64_t used)
{
    __m512 acc[S_SCORE_ROWS16][2];
    S_UNROLL for (int r = 0; r < R; r++)
        S_UNROLL for (int p = 0; p < P; p++)
            acc[r][p] = _mm512_setzero_ps();
    const float *k1 = kt + E * 16;
    for (int64_t e = 0; e < E; e++) {
        __m512 key0 = _mm512_loadu_ps(kt + e * 16), key1 = P > 1 ? _mm512_loadu_ps(k1 + e * 16) : key0;
        S_UNROLL for (int r = 0; r < R; r++) {
            __m512 x = _mm512_set1_ps(q[r * E + e]);
            acc[r][0] = _mm512_fmadd_ps(x, key0, acc[r][0]);
            if (P > 1)
                acc[r][1] = _mm512_fmadd_ps(x, key1, acc[r][1]);
        }
    }
    const __m512 s = _mm512_set1_ps(scale);
    S_UNROLL for (int p = 0; p < P; p++) {
        int64_t n = used - (j0 + 16 * p);
        __mmask16 lanes = cpu_lanes16(n);
        S_UNROLL for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(out + r * ld + j0 + 16 * p, lanes, _mm512_mul_ps(acc[r][p], s));
    }
}

S_TILE512 void s_score_rows16(int R, int64_t E, const float *q, const float *kt, float scale, float *out,
                              int64_t ld, int64_t j0, int64_t used, int P)
{
    if (P == 2)
        s_score_tile16(R, 2, E, q, kt, scale, out, ld, j0, used);
    else
        s_score_tile16(R, 1, E, q, kt, scale, out, ld, j0, used);
}

S_AVX512 static void s_scores16(int64_t L, int64_t used, int64_t E, const float *q, const float *kt, float scale,
                                float *scores, int64_t ld)
{
    for (int64_t j0 = 0; j0 < used; j0 += 32) {
        int P = used - j0 > 16 ? 2 : 1;
        const float *panel = kt + j0 * E;
        int64_t i = 0;
        for (; i + S_SCORE_ROWS16 <= L; i += S_SCORE_ROWS16)
            s_score_rows16(S_SCORE_ROWS16, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P);
        switch (L - i) {
        case 7: s_score_rows16(7, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 6: s_score_rows16(6, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 5: s_score_rows16(5, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 4: s_score_rows16(4, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 3: s_score_rows16(3, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 2: s_score_rows16(2, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 1: s_score_rows16(1, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        default: break;
        }
    }
}

/* R rows of out, C vectors of 16 features from feature c0 */
S_TILE512 void s_value_tile16(int R, int C, int64_t used, int64_t Ev, const float *w, int64_t ld, const float *v,
                              float *out, int64_t c0)
{
    __m512 acc[S_VALUE_ROWS16][2];
    S_UNROLL for (int r = 0; r < R; r++)
        S_UNROLL for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < used; j++) {
        __m512 y0 = _mm512_loadu_ps(v + j * Ev + c0), y1 = C > 1 ? _mm512_loadu_ps(v + j * Ev + c0 + 16) : y0;
        S_UNROLL for (int r = 0; r < R; r++) {
            __m512 x = _mm512_set1_ps(w[r * ld + j]);
            acc[r][0] = _mm512_fmadd_ps(x, y0, acc[r][0]);
            if (C > 1)
                acc[r][1] = _mm512_fmadd_ps(x, y1, acc[r][1]);
        }
    }
    S_UNROLL for (int r = 0; r < R; r++)
        S_UNROLL for (int c = 0; c < C; c++)
            _mm512_storeu_ps(out + r * Ev + c0 + 16 * c, acc[r][c]);
}

S_TILE512 void s_value_rows16(int R, int64_t used, int64_t Ev, const float *w, int64_t ld, const float *v,
                              float *out)
{
    int64_t c0 = 0;
    for (; c0 + 32 <= Ev; c0 += 32)
        s_value_tile16(R, 2, used, Ev, w, ld, v, out, c0);
    if (c0 < Ev)
        s_value_tile16(R, 1, used, Ev, w, ld, v, out, c0);
}

/* Ev a multiple of 16 */
S_AVX512 static void s_values16(int64_t L, int64_t used, int64_t Ev, const float *w, int64_t ld, const float *v,
                                float *out)
{
    int64_t i = 0;
    for (; i + S_VALUE_ROWS16 <= L; i += S_VALUE_ROWS16)
        s_value_rows16(S_VALUE_ROWS16, used, Ev, w + i * ld, ld, v, out + i * Ev);
    switch (L - i) {
    case 5: s_value_rows16(5, used, Ev, w + i * ld, ld, v, out + i * Ev); break;
    case 4: s_value_rows16(4, used, Ev, w + i * ld, ld, v, out + i * Ev); break;
    case 3: s_value_rows16(3, used, Ev, w + i * ld, ld, v, out + i * Ev); break;
    case 2: s_value_rows16(2, used, Ev, w + i * ld, ld, v, out + i * Ev); break;
    case 1: s_value_rows16(1, used, Ev, w + i * ld, ld, v, out + i * Ev); break;
    default: break;
    }
}

/* ---- many query rows on AVX2 --------------------------------------------------------------- */

/* Lanes below n (0-8) of a store mask. */
S_TILE __m256i s_lanes(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* R query rows against P panels (8P keys from key j0): out[r][j] = scale * q_r . k_j, stored for the
 * keys below used only. */
S_TILE void s_score_tile(int R, int P, int64_t E, const float *q, const float *kt, float scale, float *out,
                         int64_t ld, int64_t j0, int64_t used)
{
    __m256 acc[S_SCORE_ROWS][2];
    S_UNROLL for (int r = 0; r < R; r++)
        S_UNROLL for (int p = 0; p < P; p++)
            acc[r][p] = _mm256_setzero_ps();
    const float *k1 = kt + E * 8;
    for (int64_t e = 0; e < E; e++) {
        __m256 key0 = _mm256_loadu_ps(kt + e * 8), key1 = P > 1 ? _mm256_loadu_ps(k1 + e * 8) : key0;
        S_UNROLL for (int r = 0; r < R; r++) {
            __m256 x = _mm256_broadcast_ss(q + r * E + e);
            acc[r][0] = _mm256_fmadd_ps(x, key0, acc[r][0]);
            if (P > 1)
                acc[r][1] = _mm256_fmadd_ps(x, key1, acc[r][1]);
        }
    }
    const __m256 s = _mm256_set1_ps(scale);
    S_UNROLL for (int p = 0; p < P; p++) {
        int64_t n = used - (j0 + 8 * p);
        S_UNROLL for (int r = 0; r < R; r++) {
            float *dst = out + r * ld + j0 + 8 * p;
            __m256 y = _mm256_mul_ps(acc[r][p], s);
            if (n >= 8)
                _mm256_storeu_ps(dst, y);
            else if (n > 0)
                _mm256_maskstore_ps(dst, s_lanes(n), y);
        }
    }
}

S_TILE void s_score_rows(int R, int64_t E, const float *q, const float *kt, float scale, float *out, int64_t ld,
                         int64_t j0, int64_t used, int P)
{
    if (P == 2)
        s_score_tile(R, 2, E, q, kt, scale, out, ld, j0, used);
    else
        s_score_tile(R, 1, E, q, kt, scale, out, ld, j0, used);
}

S_AVX2 void cpu_attention_scores(int64_t L, int64_t used, int64_t E, const float *q, const float *kt, float scale,
                                 float *scores, int64_t ld)
{
    if (s_panel() == 16) {
        s_scores16(L, used, E, q, kt, scale, scores, ld);
        return;
    }
    /* a pair of key panels (16 keys x E features, 4 KiB at E = 64) stays in L1 while every row of
     * the block passes over it */
    for (int64_t j0 = 0; j0 < used; j0 += 16) {
        int P = used - j0 > 8 ? 2 : 1;
        const float *panel = kt + j0 * E;
        int64_t i = 0;
        for (; i + S_SCORE_ROWS <= L; i += S_SCORE_ROWS)
            s_score_rows(S_SCORE_ROWS, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P);
        switch (L - i) {
        case 5: s_score_rows(5, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 4: s_score_rows(4, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 3: s_score_rows(3, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 2: s_score_rows(2, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        case 1: s_score_rows(1, E, q + i * E, panel, scale, scores + i * ld, ld, j0, used, P); break;
        default: break;
        }
    }
}

/* R rows of out, C vectors of 8 features from feature c0: out[r][c] = sum over j < used of
 * w[r][j] v[j][c]. */
S_TILE void s_value_tile(int R, int C, int64_t used, int64_t Ev, const float *w, int64_t ld, const float *v,
                         float *out, int64_t c0)
{
    __m256 acc[S_VALUE_ROWS][4];
    S_UNROLL for (int r = 0; r < R; r++)
        S_UNROLL for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < used; j++) {
        __m256 x[S_VALUE_ROWS];
        S_UNROLL for (int r = 0; r < R; r++)
            x[r] = _mm256_broadcast_ss(w + r * ld + j);
        S_UNROLL for (int c = 0; c < C; c++) {
            __m256 y = _mm256_loadu_ps(v + j * Ev + c0 + 8 * c);
            S_UNROLL for (int r = 0; r < R; r++)
                acc[r][c] = _mm256_fmadd_ps(x[r], y, acc[r][c]);
        }
    }
    S_UNROLL for (int r = 0; r < R; r++)
        S_UNROLL for (int c = 0; c < C; c++)
            _mm256_storeu_ps(out + r * Ev + c0 + 8 * c, acc[r][c]);
}

S_TILE void s_value_rows(int R, int64_t used, int64_t Ev, const float *w, int64_t ld, const float *v, float *out)
{
    int64_t c0 = 0;
    for (; c0 + 32 <= Ev; c0 += 32)
        s_value_tile(R, 4, used, Ev, w, ld, v, out, c0);
    switch ((Ev - c0) / 8) {
    case 3: s_value_tile(R, 3, used, Ev, w, ld, v, out, c0); break;
    case 2: s_value_tile(R, 2, used, Ev, w, ld, v, out, c0); break;
    case 1: s_value_tile(R, 1, used, Ev, w, ld, v, out, c0); break;
    default: break;
    }
}

S_AVX2 void cpu_attention_values(int64_t L, int64_t used, int64_t Ev, const float *w, int64_t ld, const float *v,
                                 float *out)
{
    if (Ev % 16 == 0 && cpu_has_avx512()) {
        s_values16(L, used, Ev, w, ld, v, out);
        return;
    }
    int64_t i = 0;
    for (; i + S_VALUE_ROWS <= L; i += S_VALUE_ROWS)
        s_value_rows(S_VALUE_ROWS, used, Ev, w + i * ld, ld, v, out + i * Ev);
    if (L - i == 2)
        s_value_rows(2, used, Ev, w + i * ld, ld, v, out + i * Ev);
    else if (L - i == 1)
        s_value_rows(1, used, Ev, w + i * ld, ld, v, out + i * Ev);
}

/* ---- one query row (decode) -------------------------------------------------------------------- */

/* The 8 lanes' sums of a[0..7], in lane order. */
S_TILE __m256 s_sum8(const __m256 *a)
{
    __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

/* q . k_j for the n <= 8 keys from key j0 (E features each). */
S_TILE void s_key_dots(dt_dtype dtype, int n, int64_t E, const float *q, const void *k, int64_t j0, float *dots)
{
    __m256 acc[8];
    S_UNROLL for (int j = 0; j < 8; j++)
        acc[j] = _mm256_setzero_ps();
    int64_t e = 0;
    if (n == 8) {
        for (; e + 8 <= E; e += 8) {
            __m256 x = _mm256_loadu_ps(q + e);
            S_UNROLL for (int j = 0; j < 8; j++)
                acc[j] = _mm256_fmadd_ps(x, cpu_widen8(k, dtype, (j0 + j) * E + e), acc[j]);
        }
        _mm256_storeu_ps(dots, s_sum8(acc));
    } else {
        for (; e + 8 <= E; e += 8) {
            __m256 x = _mm256_loadu_ps(q + e);
            for (int j = 0; j < n; j++)
                acc[j] = _mm256_fmadd_ps(x, cpu_widen8(k, dtype, (j0 + j) * E + e), acc[j]);
        }
        float all[8];
        _mm256_storeu_ps(all, s_sum8(acc));
        for (int j = 0; j < n; j++)
            dots[j] = all[j];
    }
    for (int j = 0; j < n; j++)
        for (int64_t t = e; t < E; t++)
            dots[j] += q[t] * cpu_widen(k, dtype, (j0 + j) * E + t);
}

S_TILE void s_row_scores(dt_dtype dtype, int64_t used, int64_t E, const float *q, const void *k, float scale,
                         const float *mask, int64_t ss, float *scores)
{
    for (int64_t j0 = 0; j0 < used; j0 += 8) {
        int n = used - j0 < 8 ? (int)(used - j0) : 8, hidden = 0;
        if (mask)
            for (int j = 0; j < n; j++)
                hidden += mask[(j0 + j) * ss] == -INFINITY;
        if (hidden < n)
            s_key_dots(dtype, n, E, q, k, j0, scores + j0);
        for (int j = 0; j < n; j++) {
            float bias = mask ? mask[(j0 + j) * ss] : 0.0f;
            scores[j0 + j] = bias == -INFINITY ? -INFINITY : scores[j0 + j] * scale + bias;
        }
    }
}

S_AVX2 void cpu_attention_row_scores(int64_t used, int64_t E, const float *q, const void *k, dt_dtype kv_dtype,
                                     float scale, const float *mask, int64_t ss, float *scores)
{
    switch (kv_dtype) {
    case DT_BFLOAT16: s_row_scores(DT_BFLOAT16, used, E, q, k, scale, mask, ss, scores); break;
    case DT_FLOAT16: s_row_scores(DT_FLOAT16, used, E, q, k, scale, mask, ss, scores); break;
    default: s_row_scores(DT_FLOAT32, used, E, q, k, scale, mask, ss, scores); break;
    }
}

/* out[c0 .. c0 + 8C) = sum over the keys not hidden of w[j] v[j][c]. */
S_TILE void s_row_value_tile(dt_dtype dtype, int C, int64_t used, int64_t Ev, const float *w, const void *v,
                             const float *mask, int64_t ss, float *out, int64_t c0)
{
    __m256 acc[8];
    S_UNROLL for (int c = 0; c < C; c++)
        acc[c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < used; j++) {
        if (mask && mask[j * ss] == -INFINITY)
            continue;
        __m256 x = _mm256_broadcast_ss(w + j);
        S_UNROLL for (int c = 0; c < C; c++)
            acc[c] = _mm256_fmadd_ps(x, cpu_widen8(v, dtype, j * Ev + c0 + 8 * c), acc[c]);
    }
    S_UNROLL for (int c = 0; c < C; c++)
        _mm256_storeu_ps(out + c0 + 8 * c, acc[c]);
}

S_TILE void s_row_values(dt_dtype dtype, int64_t used, int64_t Ev, const float *w, const void *v, const float *mask,
                         int64_t ss, float *out)
{
    int64_t c0 = 0;
    for (; c0 + 64 <= Ev; c0 += 64)
        s_row_value_tile(dtype, 8, used, Ev, w, v, mask, ss, out, c0);
    switch ((Ev - c0) / 8) {
    case 7: s_row_value_tile(dtype, 7, used, Ev, w, v, mask, ss, out, c0); break;
    case 6: s_row_value_tile(dtype, 6, used, Ev, w, v, mask, ss, out, c0); break;
    case 5: s_row_value_tile(dtype, 5, used, Ev, w, v, mask, ss, out, c0); break;
    case 4: s_row_value_tile(dtype, 4, used, Ev, w, v, mask, ss, out, c0); break;
    case 3: s_row_value_tile(dtype, 3, used, Ev, w, v, mask, ss, out, c0); break;
    case 2: s_row_value_tile(dtype, 2, used, Ev, w, v, mask, ss, out, c0); break;
    case 1: s_row_value_tile(dtype, 1, used, Ev, w, v, mask, ss, out, c0); break;
    default: break;
    }
    for (int64_t c = c0 + (Ev - c0) / 8 * 8; c < Ev; c++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < used; j++)
            if (!mask || mask[j * ss] != -INFINITY)
                sum += w[j] * cpu_widen(v, dtype, j * Ev + c);
        out[c] = sum;
    }
}

S_AVX2 void cpu_attention_row_values(int64_t used, int64_t Ev, const float *w, const void *v, dt_dtype kv_dtype,
                                     const float *mask, int64_t ss, float *out)
{
    switch (kv_dtype) {
    case DT_BFLOAT16: s_row_values(DT_BFLOAT16, used, Ev, w, v, mask, ss, out); break;
    case DT_FLOAT16: s_row_values(DT_FLOAT16, used, Ev, w, v, mask, ss, out); break;
    default: s_row_values(DT_FLOAT32, used, Ev, w, v, mask, ss, out); break;
    }
}
#endif
