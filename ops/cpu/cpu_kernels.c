/* cpu_kernels — CPU fills, ranges, strided block copies and the in-place reductions that combine
 * Partial pieces (the 16-bit rounding helpers they share too). */
#include "cpu_kernels.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "dt_dtype.h"

/* Saturating: a plain cast of an out-of-range double is undefined behaviour. */
static int64_t s_f64_to_i64(double v)
{
    if (isnan(v))
        return 0;
    if (v >= 9223372036854775808.0)
        return INT64_MAX;
    if (v < -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

static int64_t s_scalar_i64(dt_scalar s) { return s.is_int ? s.i : s_f64_to_i64(s.f); }

static double s_scalar_f64(dt_scalar s) { return s.is_int ? (double)s.i : s.f; }

/* Rounding double -> float -> 16-bit in two round-to-nearest steps can land on the wrong side
 * of a 16-bit tie; rounding the first step to odd keeps the sticky information, which makes the
 * second step correct because float has more than 2 bits beyond either 16-bit format. */
static float s_f64_to_f32_odd(double v)
{
    float f = (float)v;
    if (isnan(v) || (double)f == v)
        return f;
    if (fabs((double)f) > fabs(v))
        f = nextafterf(f, 0.0f);
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u |= 1u;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t cpu_f64_to_f16(double v) { return dt_f32_to_f16(s_f64_to_f32_odd(v)); }

uint16_t cpu_f64_to_bf16(double v) { return dt_f32_to_bf16(s_f64_to_f32_odd(v)); }

/* Stores the double v as element i of a float-typed buffer. */
static inline void s_store_float(void *dst, dt_dtype dtype, int64_t i, double v)
{
    switch (dtype) {
    case DT_FLOAT32: ((float *)dst)[i] = (float)v; break;
    case DT_FLOAT16: ((uint16_t *)dst)[i] = cpu_f64_to_f16(v); break;
    case DT_BFLOAT16: ((uint16_t *)dst)[i] = cpu_f64_to_bf16(v); break;
    default: assert(!"not a float dtype");
    }
}

void cpu_fill(void *dst, dt_dtype dtype, int64_t n, dt_scalar value)
{
    switch (dtype) {
    case DT_FLOAT32: {
        float v = (float)s_scalar_f64(value);
        for (int64_t i = 0; i < n; i++)
            ((float *)dst)[i] = v;
        break;
    }
    case DT_FLOAT16:
    case DT_BFLOAT16: {
        uint16_t v = dtype == DT_FLOAT16 ? cpu_f64_to_f16(s_scalar_f64(value)) : cpu_f64_to_bf16(s_scalar_f64(value));
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = v;
        break;
    }
    case DT_INT32: {
        int32_t v = (int32_t)s_scalar_i64(value);
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = v;
        break;
    }
    case DT_INT64: {
        int64_t v = s_scalar_i64(value);
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)dst)[i] = v;
        break;
    }
    case DT_BOOL:
        memset(dst, value.is_int ? value.i != 0 : value.f != 0.0, (size_t)n);
        break;
    default: assert(!"bad dtype");
    }
}

void cpu_arange(void *dst, dt_dtype dtype, int64_t n, int64_t first, dt_scalar start, dt_scalar step)
{
    if (dt_dtype_is_float(dtype)) {
        double a = s_scalar_f64(start), d = s_scalar_f64(step);
        for (int64_t i = 0; i < n; i++)
            s_store_float(dst, dtype, i, a + (double)(first + i) * d);
        return;
    }
    /* unsigned arithmetic: wraps like torch instead of overflowing into undefined behaviour */
    uint64_t a = (uint64_t)s_scalar_i64(start), d = (uint64_t)s_scalar_i64(step);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = (int64_t)(a + (uint64_t)(first + i) * d);
        switch (dtype) {
        case DT_INT32: ((int32_t *)dst)[i] = (int32_t)v; break;
        case DT_INT64: ((int64_t *)dst)[i] = v; break;
        case DT_BOOL: ((bool *)dst)[i] = v != 0; break;
        default: assert(!"bad dtype");
        }
    }
}

/* n chunks of `chunk` bytes, dst and src stepping by their strides. A chunk of one element (a
 * stack or a transpose along the last dim) is a move of a constant size, not a call to memcpy per
 * element (which made interleaving two halves run at about 1 GB/s). */
static void s_copy_strided(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, size_t chunk)
{
#define S_MOVES(BYTES)                                                                                               \
    for (int64_t i = 0; i < n; i++)                                                                                  \
        memcpy(d + i * ds, s + i * ss, BYTES);                                                                       \
    break
    switch (chunk) {
    case 1: S_MOVES(1);
    case 2: S_MOVES(2);
    case 4: S_MOVES(4);
    case 8: S_MOVES(8);
    default: S_MOVES(chunk);
    }
#undef S_MOVES
}

void cpu_copy_block(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
                    int ndim, const int64_t *shape, size_t elem_size)
{
    assert(ndim >= 0 && ndim <= DT_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0)
            return;
    /* Trailing dims laid out contiguously in both become one memcpy chunk; size-1 dims never
     * move a pointer, so their strides do not matter. */
    size_t chunk = elem_size;
    int k = ndim;
    while (k > 0 && (shape[k - 1] == 1 ||
                     (dst_strides[k - 1] == (int64_t)chunk && src_strides[k - 1] == (int64_t)chunk))) {
        chunk *= (size_t)shape[k - 1];
        k--;
    }
    if (k == 0) {
        memcpy(dst, src, chunk);
        return;
    }
    /* odometer over dims [0, k-1), inner loop over dim k-1; offsets rather than pointers so
     * that stepping past the end before wrapping never forms an invalid pointer */
    int inner = k - 1;
    int64_t idx[DT_MAX_DIMS] = {0};
    int64_t doff = 0, soff = 0;
    for (;;) {
        char *d = (char *)dst + doff;
        const char *s = (const char *)src + soff;
        s_copy_strided(d, dst_strides[inner], s, src_strides[inner], shape[inner], chunk);
        int j = inner - 1;
        for (; j >= 0; j--) {
            doff += dst_strides[j];
            soff += src_strides[j];
            if (++idx[j] < shape[j])
                break;
            doff -= shape[j] * dst_strides[j];
            soff -= shape[j] * src_strides[j];
            idx[j] = 0;
        }
        if (j < 0)
            break;
    }
}

/* torch semantics: a NaN on either side wins */
static inline float s_maxf(float a, float b) { return isnan(a) ? a : isnan(b) ? b : a >= b ? a : b; }
static inline float s_minf(float a, float b) { return isnan(a) ? a : isnan(b) ? b : a <= b ? a : b; }

static void s_combine_f32(float *dst, const float *a, const float *b, int64_t n, dt_reduce_op op)
{
    switch (op) {
    case DT_REDUCE_SUM:
    case DT_REDUCE_AVG:
        for (int64_t i = 0; i < n; i++)
            dst[i] = a[i] + b[i];
        break;
    case DT_REDUCE_MAX:
        for (int64_t i = 0; i < n; i++)
            dst[i] = s_maxf(a[i], b[i]);
        break;
    case DT_REDUCE_MIN:
        for (int64_t i = 0; i < n; i++)
            dst[i] = s_minf(a[i], b[i]);
        break;
    }
}

/* tp's all-reduce in bfloat16: 16 lanes where the CPU has AVX-512 (the compiler's vectorisation of
 * the rounding runs 4 lanes at the baseline), then a loop that vectorizes. */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static int64_t s_sum_bf16_avx512(uint16_t *dst, const uint16_t *a,
                                                                    const uint16_t *b, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 sum = _mm512_add_ps(cpu_bf16_widen16(a + i), cpu_bf16_widen16(b + i));
        _mm256_storeu_si256((__m256i *)(dst + i), cpu_bf16_round16(sum));
    }
    return i;
}
#endif

static void s_sum_bf16(uint16_t *dst, const uint16_t *a, const uint16_t *b, int64_t n)
{
    int64_t i = 0;
#if defined(__x86_64__)
    if (cpu_has_avx512())
        i = s_sum_bf16_avx512(dst, a, b, n);
#endif
    for (; i < n; i++)
        dst[i] = dt_f32_to_bf16(dt_bf16_to_f32(a[i]) + dt_bf16_to_f32(b[i]));
}

static void s_combine_16(uint16_t *dst, const uint16_t *a, const uint16_t *b, int64_t n, dt_reduce_op op, bool bf16)
{
    if (bf16 && (op == DT_REDUCE_SUM || op == DT_REDUCE_AVG)) {
        s_sum_bf16(dst, a, b, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float x = bf16 ? dt_bf16_to_f32(a[i]) : dt_f16_to_f32(a[i]);
        float y = bf16 ? dt_bf16_to_f32(b[i]) : dt_f16_to_f32(b[i]);
        switch (op) {
        case DT_REDUCE_SUM:
        case DT_REDUCE_AVG:
            dst[i] = bf16 ? dt_f32_to_bf16(x + y) : dt_f32_to_f16(x + y);
            break;
        /* max/min pick one operand, so its bits are kept as they are */
        case DT_REDUCE_MAX:
            dst[i] = !isnan(x) && (isnan(y) || y > x) ? b[i] : a[i];
            break;
        case DT_REDUCE_MIN:
            dst[i] = !isnan(x) && (isnan(y) || y < x) ? b[i] : a[i];
            break;
        }
    }
}

/* Integers wrap on overflow like torch; the sum goes through unsigned to stay defined. */
#define S_COMBINE_INT(type, utype)                                                                 \
    static void s_combine_##type(type *dst, const type *a, const type *b, int64_t n, dt_reduce_op op) \
    {                                                                                              \
        for (int64_t i = 0; i < n; i++) {                                                          \
            type x = a[i], y = b[i];                                                               \
            switch (op) {                                                                          \
            case DT_REDUCE_SUM:                                                                    \
            case DT_REDUCE_AVG: dst[i] = (type)((utype)x + (utype)y); break;                      \
            case DT_REDUCE_MAX: dst[i] = x >= y ? x : y; break;                                    \
            case DT_REDUCE_MIN: dst[i] = x <= y ? x : y; break;                                    \
            }                                                                                      \
        }                                                                                          \
    }
S_COMBINE_INT(int32_t, uint32_t)
S_COMBINE_INT(int64_t, uint64_t)

static void s_combine_bool(bool *dst, const bool *a, const bool *b, int64_t n, dt_reduce_op op)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = op == DT_REDUCE_MIN ? a[i] && b[i] : a[i] || b[i];
}

void cpu_combine_pieces(void *dst, const void *a, const void *b, dt_dtype dtype, int64_t n, dt_reduce_op op)
{
    switch (dtype) {
    case DT_FLOAT32: s_combine_f32(dst, a, b, n, op); break;
    case DT_FLOAT16: s_combine_16(dst, a, b, n, op, false); break;
    case DT_BFLOAT16: s_combine_16(dst, a, b, n, op, true); break;
    case DT_INT32: s_combine_int32_t(dst, a, b, n, op); break;
    case DT_INT64: s_combine_int64_t(dst, a, b, n, op); break;
    case DT_BOOL: s_combine_bool(dst, a, b, n, op); break;
    default: assert(!"bad dtype");
    }
}

void cpu_scale_div(void *acc, dt_dtype dtype, int64_t n, int64_t divisor)
{
    assert(divisor > 0);
    float fd = (float)divisor;
    uint16_t *h = acc;
    switch (dtype) {
    case DT_FLOAT32:
        for (int64_t i = 0; i < n; i++)
            ((float *)acc)[i] /= fd;
        break;
    case DT_FLOAT16:
        for (int64_t i = 0; i < n; i++)
            h[i] = dt_f32_to_f16(dt_f16_to_f32(h[i]) / fd);
        break;
    case DT_BFLOAT16:
        for (int64_t i = 0; i < n; i++)
            h[i] = dt_f32_to_bf16(dt_bf16_to_f32(h[i]) / fd);
        break;
    case DT_INT32:
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)acc)[i] = (int32_t)(((int32_t *)acc)[i] / divisor);
        break;
    case DT_INT64:
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)acc)[i] /= divisor;
        break;
    case DT_BOOL: break; /* an avg of bools is their or: nothing to divide */
    default: assert(!"bad dtype");
    }
}
