/* cpu_pointwise — the CPU kernels of the elementwise ops (OP_POINTWISE in ops/op_table.h), and
 * the dtype conversions every family uses to bring a piece into a compute type and back. */
#include "cpu_pointwise.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"
#include "op_pointwise_math.h"

size_t cpu_ctype_size(cpu_ctype t) { return t == CPU_F32 ? 4 : t == CPU_I64 ? 8 : 1; }

/* One loop per (source, destination) pair, so the compiler vectorises each, in an AVX-512 and an
 * AVX2 clone too (CPU_CLONES). */
#define S_CONVERT(DST_T, dst, SRC_T, src, n, EXPR)                                                                     \
    do {                                                                                                               \
        DST_T *d_ = (DST_T *)(dst);                                                                                    \
        const SRC_T *s_ = (const SRC_T *)(src);                                                                        \
        for (int64_t i = 0; i < (n); i++) {                                                                            \
            SRC_T x = s_[i];                                                                                           \
            d_[i] = (DST_T)(EXPR);                                                                                     \
        }                                                                                                              \
    } while (0)

CPU_CLONES static void s_to_ctype(void *dst, cpu_ctype t, const void *src, dt_dtype dtype, int64_t n)
{
    switch (t) {
    case CPU_F32:
        switch (dtype) {
        case DT_FLOAT32: memcpy(dst, src, (size_t)n * 4); break;
        case DT_FLOAT16: S_CONVERT(float, dst, uint16_t, src, n, dt_f16_to_f32(x)); break;
        case DT_BFLOAT16: S_CONVERT(float, dst, uint16_t, src, n, dt_bf16_to_f32(x)); break;
        case DT_INT32: S_CONVERT(float, dst, int32_t, src, n, x); break;
        case DT_INT64: S_CONVERT(float, dst, int64_t, src, n, x); break;
        default: S_CONVERT(float, dst, uint8_t, src, n, x != 0); break;
        }
        break;
    case CPU_I64:
        switch (dtype) {
        case DT_FLOAT32: S_CONVERT(int64_t, dst, float, src, n, op_ew_f2i64(x)); break;
        case DT_FLOAT16: S_CONVERT(int64_t, dst, uint16_t, src, n, op_ew_f2i64(dt_f16_to_f32(x))); break;
        case DT_BFLOAT16: S_CONVERT(int64_t, dst, uint16_t, src, n, op_ew_f2i64(dt_bf16_to_f32(x))); break;
        case DT_INT32: S_CONVERT(int64_t, dst, int32_t, src, n, x); break;
        case DT_INT64: memcpy(dst, src, (size_t)n * 8); break;
        default: S_CONVERT(int64_t, dst, uint8_t, src, n, x != 0); break;
        }
        break;
    default:
        switch (dtype) {
        case DT_FLOAT32: S_CONVERT(uint8_t, dst, float, src, n, x != 0); break;
        case DT_FLOAT16:
        case DT_BFLOAT16: S_CONVERT(uint8_t, dst, uint16_t, src, n, (x & 0x7fff) != 0); break;
        case DT_INT32: S_CONVERT(uint8_t, dst, int32_t, src, n, x != 0); break;
        case DT_INT64: S_CONVERT(uint8_t, dst, int64_t, src, n, x != 0); break;
        default: S_CONVERT(uint8_t, dst, uint8_t, src, n, x != 0); break;
        }
    }
}

/* bfloat16 and float32 both ways, 16 lanes at a time with AVX-512: the commonest conversions (a
 * bfloat16 model's every elementwise op converts its operands in and its result out). The
 * compilers' vectorisation of dt_f32_to_bf16's integer rounding ran on 8 lanes with packs and
 * permutes, costing more than the op it served; cpu_bf16_round16 is the same arithmetic. Each
 * returns how many leading elements it converted: whole vectors, the rest left to the portable
 * loop. */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static int64_t s_bf16_widen(float *dst, const uint16_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, cpu_bf16_widen16(src + i));
    return i;
}

__attribute__((target("avx512f"))) static int64_t s_bf16_round(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), cpu_bf16_round16(_mm512_loadu_ps(src + i)));
    return i;
}
#endif

/* the clones stay static: a cloned function's symbol would be exported from the library */
void cpu_to_ctype(void *dst, cpu_ctype t, const void *src, dt_dtype dtype, int64_t n)
{
#if defined(__x86_64__)
    if (t == CPU_F32 && dtype == DT_BFLOAT16 && cpu_has_avx512()) {
        int64_t done = s_bf16_widen(dst, src, n);
        dst = (float *)dst + done;
        src = (const uint16_t *)src + done;
        n -= done;
    }
#endif
    s_to_ctype(dst, t, src, dtype, n);
}

const void *cpu_piece_as(const op_local *in, cpu_ctype t, void **scratch)
{
    *scratch = NULL;
    if ((t == CPU_F32 && in->dtype == DT_FLOAT32) || (t == CPU_I64 && in->dtype == DT_INT64))
        return in->data;
    int64_t n = dt_layout_numel(in->ndim, in->shape);
    void *buf = malloc((size_t)(n ? n : 1) * cpu_ctype_size(t));
    if (buf)
        cpu_to_ctype(buf, t, in->data, in->dtype, n);
    *scratch = buf;
    return buf;
}

CPU_CLONES static void s_from_ctype(void *dst, dt_dtype dtype, const void *src, cpu_ctype t, int64_t n)
{
    switch (t) {
    case CPU_F32:
        switch (dtype) {
        case DT_FLOAT32: memcpy(dst, src, (size_t)n * 4); break;
        case DT_FLOAT16: S_CONVERT(uint16_t, dst, float, src, n, dt_f32_to_f16(x)); break;
        case DT_BFLOAT16: S_CONVERT(uint16_t, dst, float, src, n, dt_f32_to_bf16(x)); break;
        case DT_INT32: S_CONVERT(int32_t, dst, float, src, n, op_ew_f2i32(x)); break;
        case DT_INT64: S_CONVERT(int64_t, dst, float, src, n, op_ew_f2i64(x)); break;
        default: S_CONVERT(uint8_t, dst, float, src, n, x != 0); break;
        }
        break;
    case CPU_I64:
        switch (dtype) {
        case DT_FLOAT32: S_CONVERT(float, dst, int64_t, src, n, x); break;
        case DT_FLOAT16: S_CONVERT(uint16_t, dst, int64_t, src, n, dt_f32_to_f16((float)x)); break;
        case DT_BFLOAT16: S_CONVERT(uint16_t, dst, int64_t, src, n, dt_f32_to_bf16((float)x)); break;
        case DT_INT32: S_CONVERT(int32_t, dst, int64_t, src, n, x); break;
        case DT_INT64: memcpy(dst, src, (size_t)n * 8); break;
        default: S_CONVERT(uint8_t, dst, int64_t, src, n, x != 0); break;
        }
        break;
    default:
        switch (dtype) {
        case DT_FLOAT32: S_CONVERT(float, dst, uint8_t, src, n, x); break;
        case DT_FLOAT16: S_CONVERT(uint16_t, dst, uint8_t, src, n, x ? 0x3c00 : 0); break;
        case DT_BFLOAT16: S_CONVERT(uint16_t, dst, uint8_t, src, n, x ? 0x3f80 : 0); break;
        case DT_INT32: S_CONVERT(int32_t, dst, uint8_t, src, n, x); break;
        case DT_INT64: S_CONVERT(int64_t, dst, uint8_t, src, n, x); break;
        default: S_CONVERT(uint8_t, dst, uint8_t, src, n, x != 0); break;
        }
    }
}

void cpu_from_ctype(void *dst, dt_dtype dtype, const void *src, cpu_ctype t, int64_t n)
{
#if defined(__x86_64__)
    if (t == CPU_F32 && dtype == DT_BFLOAT16 && cpu_has_avx512()) {
        int64_t done = s_bf16_round(dst, src, n);
        dst = (uint16_t *)dst + done;
        src = (const float *)src + done;
        n -= done;
    }
#endif
    s_from_ctype(dst, dtype, src, t, n);
}

void cpu_broadcast(void *dst, int out_ndim, const int64_t *out_shape, const void *src, int in_ndim,
                   const int64_t *in_shape, size_t elem)
{
    int64_t in_strides[DT_MAX_DIMS], src_strides[DT_MAX_DIMS], dst_strides[DT_MAX_DIMS];
    cpu_contiguous_strides(in_ndim, in_shape, elem, in_strides);
    for (int d = 0; d < out_ndim; d++) {
        int k = d - (out_ndim - in_ndim);
        src_strides[d] = k < 0 || in_shape[k] == 1 ? 0 : in_strides[k];
    }
    cpu_contiguous_strides(out_ndim, out_shape, elem, dst_strides);
    cpu_copy_block(dst, dst_strides, src, src_strides, out_ndim, out_shape, elem);
}

static cpu_ctype s_ctype_of(dt_dtype d) { return d == DT_FLOAT32 ? CPU_F32 : d == DT_INT64 ? CPU_I64 : CPU_U8; }

void cpu_convert(void *dst, dt_dtype to, const void *src, dt_dtype from, int64_t n)
{
    if (to == from) {
        memcpy(dst, src, (size_t)n * dt_dtype_size(to));
    } else if (to == DT_FLOAT32 || to == DT_INT64 || to == DT_BOOL) {
        cpu_to_ctype(dst, s_ctype_of(to), src, from, n);
    } else if (from == DT_FLOAT32 || from == DT_INT64 || from == DT_BOOL) {
        cpu_from_ctype(dst, to, src, s_ctype_of(from), n);
    } else {
        /* 16-bit floats and int32 among themselves: through float32, a block at a time */
        float buf[1024];
        size_t to_size = dt_dtype_size(to), from_size = dt_dtype_size(from);
        for (int64_t i = 0; i < n; i += 1024) {
            int64_t m = n - i < 1024 ? n - i : 1024;
            cpu_to_ctype(buf, CPU_F32, (const char *)src + i * (int64_t)from_size, from, m);
            cpu_from_ctype((char *)dst + i * (int64_t)to_size, to, buf, CPU_F32, m);
        }
    }
}

/* ---- the kernels of the elementwise ops ------------------------------------------------------
 * An op's value is one expression per compute type, in the lists below. The drivers read the
 * operands where they lie and write the output in place when their dtypes are the compute type
 * (float32, int32, int64 or bool: the output's, 16-bit floats computed in float32); other dtypes
 * are converted a block at a time where every operand has the output's shape (s_blocked), and
 * through converted copies where one broadcasts. Operands broadcast by strides: a size-1 dim or a Python
 * number is read again, never expanded into a copy. */

static const char *const s_oom = "out of memory on the device";

#define S_MAX_IN 3 /* operands of an op (where: condition, a, b) */

/* The dtype an op computes in when its output (or its comparison) has dtype d. */
static dt_dtype s_compute(dt_dtype d) { return d == DT_FLOAT16 || d == DT_BFLOAT16 ? DT_FLOAT32 : d; }

/* One row: out[i] = f(in[0][i * step[0]], ...) for i < n, each step 0 (the same element again)
 * or 1. p: the op's float attributes. */
typedef void (*s_loop)(void *out, const void *const *in, const int64_t *step, int64_t n, const double *p);

/* An op's row loop per compute type (NULL where its dtype rule never computes in it). */
typedef struct {
    s_loop f32, i32, i64, u8;
} s_loops;

static s_loop s_pick(const s_loops *l, dt_dtype cd)
{
    switch (cd) {
    case DT_FLOAT32: return l->f32;
    case DT_INT32: return l->i32;
    case DT_INT64: return l->i64;
    case DT_BOOL: return l->u8;
    default: return NULL;
    }
}

/* An operand in the compute dtype: the piece's own bytes, a converted copy, or a number. */
typedef struct {
    const void *data;
    int ndim;
    const int64_t *shape;
    size_t elem;
} s_operand;

/* One kernel call: its operands, what it allocated, and its first failure. */
typedef struct {
    int nin;
    s_operand in[S_MAX_IN];
    int ncopies;
    void *copies[S_MAX_IN];
    int64_t number; /* storage of a number operand */
    const char *why;
} s_call;

static void s_piece(s_call *c, const op_local *piece, dt_dtype cd)
{
    s_operand *o = &c->in[c->nin++];
    *o = (s_operand){piece->data, piece->ndim, piece->shape, dt_dtype_size(cd)};
    if (piece->dtype == cd || c->why)
        return;
    int64_t n = dt_layout_numel(piece->ndim, piece->shape);
    void *copy = malloc((size_t)(n ? n : 1) * o->elem);
    if (!copy) {
        c->why = s_oom;
        return;
    }
    cpu_convert(copy, cd, piece->data, piece->dtype, n);
    c->copies[c->ncopies++] = copy;
    o->data = copy;
}

static void s_number(s_call *c, dt_scalar v, dt_dtype cd)
{
    cpu_fill(&c->number, cd, 1, v);
    c->in[c->nin++] = (s_operand){&c->number, 0, NULL, dt_dtype_size(cd)};
}

/* Calls loop on every row of the output (ndim, shape, C-contiguous, elements of out_elem bytes),
 * each operand broadcast into it right-aligned. Size-1 dims are dropped and neighbouring dims
 * merged where every operand walks them as one, so same-shape operands make a single row. */
static void s_iterate(void *dst, size_t out_elem, int ndim, const int64_t *shape, const s_call *c, s_loop loop,
                      const double *p)
{
    /* every operand of the output's own shape (the commonest call): one row, no strides worked out */
    bool same = true;
    for (int i = 0; i < c->nin && same; i++)
        same = c->in[i].ndim == ndim && (ndim == 0 || memcmp(c->in[i].shape, shape, (size_t)ndim * sizeof *shape) == 0);
    if (same) {
        const void *whole[S_MAX_IN];
        int64_t ones[S_MAX_IN];
        for (int i = 0; i < c->nin; i++) {
            whole[i] = c->in[i].data;
            ones[i] = 1;
        }
        loop(dst, whole, ones, dt_layout_numel(ndim, shape), p);
        return;
    }
    int nd = 0;
    int64_t size[DT_MAX_DIMS], stride[S_MAX_IN][DT_MAX_DIMS], own[S_MAX_IN][DT_MAX_DIMS];
    for (int i = 0; i < c->nin; i++)
        for (int64_t d = c->in[i].ndim - 1, s = 1; d >= 0; s *= c->in[i].shape[d--])
            own[i][d] = s;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1)
            continue;
        int64_t st[S_MAX_IN];
        bool merge = nd > 0;
        for (int i = 0; i < c->nin; i++) {
            int k = d - (ndim - c->in[i].ndim);
            st[i] = k >= 0 && c->in[i].shape[k] == shape[d] ? own[i][k] : 0;
            merge = merge && stride[i][nd - 1] == st[i] * shape[d];
        }
        if (merge)
            size[nd - 1] *= shape[d];
        else
            size[nd++] = shape[d];
        for (int i = 0; i < c->nin; i++)
            stride[i][nd - 1] = st[i];
    }
    const void *row[S_MAX_IN];
    int64_t step[S_MAX_IN], n = nd ? size[nd - 1] : 1, rows = 1, idx[DT_MAX_DIMS] = {0};
    for (int d = 0; d + 1 < nd; d++)
        rows *= size[d];
    for (int i = 0; i < c->nin; i++)
        step[i] = nd ? stride[i][nd - 1] : 0;
    for (int64_t r = 0; r < rows; r++) {
        for (int i = 0; i < c->nin; i++) {
            int64_t off = 0;
            for (int d = 0; d + 1 < nd; d++)
                off += idx[d] * stride[i][d];
            row[i] = (const char *)c->in[i].data + off * (int64_t)c->in[i].elem;
        }
        loop((char *)dst + r * n * (int64_t)out_elem, row, step, n, p);
        for (int d = nd - 2; d >= 0 && ++idx[d] == size[d]; d--)
            idx[d] = 0;
    }
}

/* Runs loop into the output, computed in dtype rd (converted when the output has another). */
static const char *s_run(s_call *c, op_local *out, dt_dtype rd, s_loop loop, const double *p)
{
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    void *dst = out->data, *copy = NULL;
    if (!c->why && !loop)
        c->why = "no loop for these dtypes (internal error)";
    if (!c->why && out->dtype != rd && !(dst = copy = malloc((size_t)(n ? n : 1) * dt_dtype_size(rd))))
        c->why = s_oom;
    if (!c->why && n > 0) {
        s_iterate(dst, dt_dtype_size(rd), out->ndim, out->shape, c, loop, p);
        if (copy)
            cpu_convert(out->data, out->dtype, copy, rd, n);
    }
    free(copy);
    for (int i = 0; i < c->ncopies; i++)
        free(c->copies[i]);
    return c->why;
}

/* Loops of one operand (x) and of two (x, y) for elements of TYPE into OTYPE; inside, T is TYPE.
 * S_LOOP1_ATTR's ATTR prefixes the function (S_CLONES). */
#define S_LOOP1(fn, TYPE, OTYPE, EXPR) S_LOOP1_ATTR(, fn, TYPE, OTYPE, EXPR)
#define S_LOOP1_ATTR(ATTR, fn, TYPE, OTYPE, EXPR)                                                                      \
    ATTR static void fn(void *out, const void *const *in, const int64_t *step, int64_t n, const double *p)           \
    {                                                                                                                  \
        typedef TYPE T;                                                                                                \
        OTYPE *o = out;                                                                                                \
        const T *a = in[0];                                                                                            \
        if (step[0]) {                                                                                                 \
            for (int64_t i = 0; i < n; i++) {                                                                          \
                T x = a[i];                                                                                            \
                o[i] = (OTYPE)(EXPR);                                                                                  \
            }                                                                                                          \
            return;                                                                                                    \
        }                                                                                                              \
        T x = a[0];                                                                                                    \
        OTYPE v = (OTYPE)(EXPR);                                                                                       \
        for (int64_t i = 0; i < n; i++)                                                                                \
            o[i] = v;                                                                                                  \
    }

#define S_LOOP2(fn, TYPE, OTYPE, EXPR) S_LOOP2_ATTR(, fn, TYPE, OTYPE, EXPR)
#define S_LOOP2_ATTR(ATTR, fn, TYPE, OTYPE, EXPR)                                                                      \
    ATTR static void fn(void *out, const void *const *in, const int64_t *step, int64_t n, const double *p)             \
    {                                                                                                                  \
        typedef TYPE T;                                                                                                \
        OTYPE *o = out;                                                                                                \
        const T *a = in[0], *b = in[1];                                                                                \
        if (step[0] && step[1]) {                                                                                      \
            for (int64_t i = 0; i < n; i++) {                                                                          \
                T x = a[i], y = b[i];                                                                                  \
                o[i] = (OTYPE)(EXPR);                                                                                  \
            }                                                                                                          \
        } else if (step[0]) {                                                                                          \
            T y = b[0];                                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                                          \
                T x = a[i];                                                                                            \
                o[i] = (OTYPE)(EXPR);                                                                                  \
            }                                                                                                          \
        } else if (step[1]) {                                                                                          \
            T x = a[0];                                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                                          \
                T y = b[i];                                                                                            \
                o[i] = (OTYPE)(EXPR);                                                                                  \
            }                                                                                                          \
        } else {                                                                                                       \
            T x = a[0], y = b[0];                                                                                      \
            OTYPE v = (OTYPE)(EXPR);                                                                                   \
            for (int64_t i = 0; i < n; i++)                                                                            \
                o[i] = v;                                                                                              \
        }                                                                                                              \
    }

/* the ops' expressions: ops/op_pointwise_math.h */

/* ---- the drivers ------------------------------------------------------------------------------ */

/* The commonest call (c = a + b, x * 0.5, exp(x)): operands of the output's own shape, and the
 * op's number at operand `number` (-1: none), with no strides worked out. Where every operand is in
 * cd and the output in rd, one row over the whole; else a block of S_BLOCK elements at a time,
 * each operand not in cd converted into a buffer that stays in L1, the loop run, the result
 * converted out if the output is not in rd (a bfloat16 residual add or silu reads and writes its
 * 16-bit elements once, where whole converted copies were allocated, written and read again: 3-4x
 * the time of the same op in float32). False, having done nothing, when an operand broadcasts. */
#define S_BLOCK 1024
static bool s_blocked(op_kernel *k, s_loop loop, dt_dtype cd, dt_dtype rd, int number, const double *p)
{
    const op_local *out = &k->out[0];
    int nop = k->nin + (number >= 0);
    if (!loop || nop > S_MAX_IN)
        return false;
    for (int i = 0; i < k->nin; i++) {
        const op_local *x = &k->in[i];
        if (x->ndim != out->ndim || (out->ndim && memcmp(x->shape, out->shape, (size_t)out->ndim * sizeof *x->shape)))
            return false;
    }
    bool convert = out->dtype != rd;
    for (int i = 0; i < k->nin; i++)
        convert = convert || k->in[i].dtype != cd;
    int64_t value = 0, n = dt_layout_numel(out->ndim, out->shape), block = convert ? S_BLOCK : n;
    if (number >= 0)
        cpu_fill(&value, cd, 1, k->attrs->scalar);
    _Alignas(64) unsigned char buf[S_MAX_IN][S_BLOCK * sizeof(int64_t)], obuf[S_BLOCK * sizeof(int64_t)];
    int64_t oe = (int64_t)dt_dtype_size(out->dtype);
    for (int64_t i = 0; i < n; i += block) {
        int64_t m = n - i < block ? n - i : block;
        const void *in[S_MAX_IN];
        int64_t step[S_MAX_IN];
        for (int j = 0, piece = 0; j < nop; j++) {
            step[j] = j != number;
            if (j == number) {
                in[j] = &value;
                continue;
            }
            const op_local *x = &k->in[piece++];
            const char *at = (const char *)x->data + i * (int64_t)dt_dtype_size(x->dtype);
            if (x->dtype == cd) {
                in[j] = at;
            } else {
                cpu_convert(buf[j], cd, at, x->dtype, m);
                in[j] = buf[j];
            }
        }
        char *dst = (char *)out->data + i * oe;
        loop(out->dtype == rd ? (void *)dst : (void *)obuf, in, step, m, p);
        if (out->dtype != rd)
            cpu_convert(dst, out->dtype, obuf, rd, m);
    }
    return true;
}

static const char *s_unary(op_kernel *k, const s_loops *loops)
{
    dt_dtype cd = s_compute(k->out[0].dtype);
    if (k->nin != 1)
        return "expected one operand (internal error)";
    if (s_blocked(k, s_pick(loops, cd), cd, cd, -1, k->attrs->floats))
        return NULL;
    s_call c = {0};
    s_piece(&c, &k->in[0], cd);
    return s_run(&c, &k->out[0], cd, s_pick(loops, cd), k->attrs->floats);
}

/* a op b in cd giving rd, either a number (attrs.scalar; ints[0] = 1: on the left). */
static const char *s_binary(op_kernel *k, const s_loops *loops, dt_dtype cd, dt_dtype rd)
{
    bool left = k->attrs->nints > 0 && k->attrs->ints[0];
    if (k->nin + k->attrs->has_scalar != 2)
        return "expected two operands (internal error)";
    if (s_blocked(k, s_pick(loops, cd), cd, rd, k->nin == 2 ? -1 : left ? 0 : 1, NULL))
        return NULL;
    s_call c = {0};
    if (k->nin == 1 && left)
        s_number(&c, k->attrs->scalar, cd);
    s_piece(&c, &k->in[0], cd);
    if (k->nin == 2)
        s_piece(&c, &k->in[1], cd);
    else if (!left)
        s_number(&c, k->attrs->scalar, cd);
    return s_run(&c, &k->out[0], rd, s_pick(loops, cd), NULL);
}

static const char *s_arith(op_kernel *k, const s_loops *loops)
{
    dt_dtype cd = s_compute(k->out[0].dtype);
    return s_binary(k, loops, cd, cd);
}

/* ctx[0]: the dtype the controller says the operands are compared in */
static const char *s_compare(op_kernel *k, const s_loops *loops)
{
    if (k->nctx < 1 || !dt_dtype_valid((int)k->ctx[0]))
        return "comparison: missing its dtype (internal error)";
    return s_binary(k, loops, s_compute((dt_dtype)k->ctx[0]), DT_BOOL);
}

static const char *s_logical(op_kernel *k, const s_loops *loops) { return s_binary(k, loops, DT_BOOL, DT_BOOL); }

/* The float functions' loops have AVX-512 and AVX2 clones (CPU_CLONES): the activations'
 * exponential (op_ew_exp) vectorises, and the VAE's silu and a diffusion model's gelu_tanh spend
 * real time here; the float32 arithmetic too (a 16-bit op's blocks, converted into L1, ran SSE's 4
 * lanes). All give the same bits, and CUDA's (-fmad=false) the same arithmetic. */
#define S_CLONES CPU_CLONES

#define S_GEN_UNARY_FLOAT(name, f)                                                                                     \
    S_LOOP1_ATTR(S_CLONES, s_##name##_f32, float, float, f)                                                            \
    const char *cpu_k_##name(op_kernel *k)                                                                             \
    {                                                                                                                  \
        static const s_loops loops = {.f32 = s_##name##_f32};                                                          \
        return s_unary(k, &loops);                                                                                     \
    }
OP_EW_UNARY_FLOAT(S_GEN_UNARY_FLOAT)

#define S_GEN_UNARY_NUMBER(name, f, i)                                                                                 \
    S_LOOP1(s_##name##_f32, float, float, f)                                                                           \
    S_LOOP1(s_##name##_i32, int32_t, int32_t, i)                                                                       \
    S_LOOP1(s_##name##_i64, int64_t, int64_t, i)                                                                       \
    const char *cpu_k_##name(op_kernel *k)                                                                             \
    {                                                                                                                  \
        static const s_loops loops = {.f32 = s_##name##_f32, .i32 = s_##name##_i32, .i64 = s_##name##_i64};            \
        return s_unary(k, &loops);                                                                                     \
    }
OP_EW_UNARY_NUMBER(S_GEN_UNARY_NUMBER)

S_LOOP1(s_logical_not_u8, uint8_t, uint8_t, !x)
const char *cpu_k_logical_not(op_kernel *k)
{
    static const s_loops loops = {.u8 = s_logical_not_u8};
    return s_unary(k, &loops);
}

#define S_GEN_BINARY_ANY(name, f, i, b)                                                                                \
    S_LOOP2_ATTR(S_CLONES, s_##name##_f32, float, float, f)                                                            \
    S_LOOP2(s_##name##_i32, int32_t, int32_t, i)                                                                       \
    S_LOOP2(s_##name##_i64, int64_t, int64_t, i)                                                                       \
    S_LOOP2(s_##name##_u8, uint8_t, uint8_t, b)                                                                        \
    const char *cpu_k_##name(op_kernel *k)                                                                             \
    {                                                                                                                  \
        static const s_loops loops = {s_##name##_f32, s_##name##_i32, s_##name##_i64, s_##name##_u8};                  \
        return s_arith(k, &loops);                                                                                     \
    }
OP_EW_BINARY_ANY(S_GEN_BINARY_ANY)

#define S_GEN_BINARY_NUMBER(name, f, i)                                                                                \
    S_LOOP2_ATTR(S_CLONES, s_##name##_f32, float, float, f)                                                            \
    S_LOOP2(s_##name##_i32, int32_t, int32_t, i)                                                                       \
    S_LOOP2(s_##name##_i64, int64_t, int64_t, i)                                                                       \
    const char *cpu_k_##name(op_kernel *k)                                                                             \
    {                                                                                                                  \
        static const s_loops loops = {.f32 = s_##name##_f32, .i32 = s_##name##_i32, .i64 = s_##name##_i64};            \
        return s_arith(k, &loops);                                                                                     \
    }
OP_EW_BINARY_NUMBER(S_GEN_BINARY_NUMBER)

_Thread_local int op_ew_zero_division;

/* (their integer expressions set op_ew_zero_division for a zero divisor: the op fails) */
#define S_GEN_BINARY_DIVIDING(name, f, i)                                                                              \
    S_LOOP2_ATTR(S_CLONES, s_##name##_f32, float, float, f)                                                            \
    S_LOOP2(s_##name##_i32, int32_t, int32_t, i)                                                                       \
    S_LOOP2(s_##name##_i64, int64_t, int64_t, i)                                                                       \
    const char *cpu_k_##name(op_kernel *k)                                                                             \
    {                                                                                                                  \
        static const s_loops loops = {.f32 = s_##name##_f32, .i32 = s_##name##_i32, .i64 = s_##name##_i64};            \
        op_ew_zero_division = 0;                                                                                       \
        const char *why = s_arith(k, &loops);                                                                          \
        return why ? why : op_ew_zero_division ? OP_EW_ZERO_DIVISION_ERROR(name) : NULL;                               \
    }
OP_EW_BINARY_DIVIDING(S_GEN_BINARY_DIVIDING)

#define S_GEN_BINARY_FLOAT(name, f)                                                                                    \
    S_LOOP2_ATTR(S_CLONES, s_##name##_f32, float, float, f)                                                            \
    const char *cpu_k_##name(op_kernel *k)                                                                             \
    {                                                                                                                  \
        static const s_loops loops = {.f32 = s_##name##_f32};                                                          \
        return s_arith(k, &loops);                                                                                     \
    }
OP_EW_BINARY_FLOAT(S_GEN_BINARY_FLOAT)

#define S_GEN_COMPARE(name, e)                                                                                         \
    S_LOOP2(s_##name##_f32, float, uint8_t, e)                                                                         \
    S_LOOP2(s_##name##_i32, int32_t, uint8_t, e)                                                                       \
    S_LOOP2(s_##name##_i64, int64_t, uint8_t, e)                                                                       \
    S_LOOP2(s_##name##_u8, uint8_t, uint8_t, e)                                                                        \
    const char *cpu_k_##name(op_kernel *k)                                                                             \
    {                                                                                                                  \
        static const s_loops loops = {s_##name##_f32, s_##name##_i32, s_##name##_i64, s_##name##_u8};                  \
        return s_compare(k, &loops);                                                                                   \
    }
OP_EW_COMPARE(S_GEN_COMPARE)

#define S_GEN_LOGICAL(name, e)                                                                                         \
    S_LOOP2(s_##name##_u8, uint8_t, uint8_t, e)                                                                        \
    const char *cpu_k_##name(op_kernel *k)                                                                             \
    {                                                                                                                  \
        static const s_loops loops = {.u8 = s_##name##_u8};                                                            \
        return s_logical(k, &loops);                                                                                   \
    }
OP_EW_LOGICAL(S_GEN_LOGICAL)

/* where(cond, a, b) per element size: out[i] = cond[i] ? a[i] : b[i] (each broadcast). A row whose
 * condition runs along and whose values each run along or repeat one (a number, as the greedy
 * argmax's where(x == max, positions, V) has) takes a loop of its own that the compiler vectorizes
 * into blends; through the general strides, 16000 int64 elements took 37 us. */
#define S_SELECT_RUN(o, m, a, b, n, A, B)                                                                              \
    for (int64_t i = 0; i < (n); i++) {                                                                                \
        __typeof__(*(o)) x_ = (a)[A], y_ = (b)[B];                                                                     \
        (o)[i] = (m)[i] ? x_ : y_;                                                                                     \
    }
#define S_SELECT(fn, TYPE)                                                                                             \
    S_CLONES static void fn(void *out, const void *const *in, const int64_t *step, int64_t n, const double *p)       \
    {                                                                                                                  \
        TYPE *o = out;                                                                                                 \
        const uint8_t *m = in[0];                                                                                      \
        const TYPE *a = in[1], *b = in[2];                                                                             \
        if (step[0] == 1 && step[1] == 1 && step[2] == 1) {                                                            \
            S_SELECT_RUN(o, m, a, b, n, i, i)                                                                          \
        } else if (step[0] == 1 && step[1] == 1 && step[2] == 0) {                                                     \
            S_SELECT_RUN(o, m, a, b, n, i, 0)                                                                          \
        } else if (step[0] == 1 && step[1] == 0 && step[2] == 1) {                                                     \
            S_SELECT_RUN(o, m, a, b, n, 0, i)                                                                          \
        } else {                                                                                                       \
            for (int64_t i = 0; i < n; i++)                                                                            \
                o[i] = m[i * step[0]] ? a[i * step[1]] : b[i * step[2]];                                               \
        }                                                                                                              \
    }
S_SELECT(s_select_f32, float)
S_SELECT(s_select_i32, int32_t)
S_SELECT(s_select_i64, int64_t)
S_SELECT(s_select_u8, uint8_t)
static const s_loops s_select = {s_select_f32, s_select_i32, s_select_i64, s_select_u8};

/* where(cond, a, b), with a number in place of b (ints[0] = 2) or of a (ints[0] = 1). */
const char *cpu_k_where(op_kernel *k)
{
    op_local *out = &k->out[0];
    dt_dtype cd = s_compute(out->dtype);
    int at = k->attrs->has_scalar ? (k->attrs->nints > 0 ? (int)k->attrs->ints[0] : 2) : 0;
    s_call c = {0};
    if (k->nin != (at ? 2 : 3) || at < 0 || at > 2)
        return "where: bad operands (internal error)";
    s_piece(&c, &k->in[0], DT_BOOL);
    if (at == 1)
        s_number(&c, k->attrs->scalar, cd);
    s_piece(&c, &k->in[1], cd);
    if (at == 2)
        s_number(&c, k->attrs->scalar, cd);
    else if (at == 0)
        s_piece(&c, &k->in[2], cd);
    return s_run(&c, out, cd, s_pick(&s_select, cd), NULL);
}

/* masked_fill(x, mask, number) is where(mask, number, x). */
const char *cpu_k_masked_fill(op_kernel *k)
{
    op_local *out = &k->out[0];
    dt_dtype cd = s_compute(out->dtype);
    s_call c = {0};
    if (k->nin != 2 || !k->attrs->has_scalar)
        return "masked_fill: bad operands (internal error)";
    s_piece(&c, &k->in[1], DT_BOOL);
    s_number(&c, k->attrs->scalar, cd);
    s_piece(&c, &k->in[0], cd);
    return s_run(&c, out, cd, s_pick(&s_select, cd), NULL);
}

/* clamp: p = the bounds of op_clamp_bounds, doubles for float32 and int64s' bits for integers */
static inline int64_t s_int_bound(const double *p, int i)
{
    int64_t v;
    memcpy(&v, p + i, sizeof v);
    return v;
}
S_LOOP1(s_clamp_f32, float, float, op_ew_clamp(x, (float)p[0], (float)p[1]))
S_LOOP1(s_clamp_i32, int32_t, int32_t, (T)op_ew_iclamp(x, s_int_bound(p, 0), s_int_bound(p, 1)))
S_LOOP1(s_clamp_i64, int64_t, int64_t, op_ew_iclamp(x, s_int_bound(p, 0), s_int_bound(p, 1)))

/* clamp(x, min, max): ints[0] bit 0 = has min, bit 1 = has max, ints[1] = a bound is a float,
 * ints[2..3] = the integer bounds (optional); floats = [min, max]. */
const char *cpu_k_clamp(op_kernel *k)
{
    static const s_loops loops = {.f32 = s_clamp_f32, .i32 = s_clamp_i32, .i64 = s_clamp_i64};
    dt_dtype cd = s_compute(k->out[0].dtype);
    double bounds[2];
    const char *why = op_clamp_bounds(k, cd, bounds);
    if (why)
        return why;
    s_call c = {0};
    s_piece(&c, &k->in[0], cd);
    return s_run(&c, &k->out[0], cd, s_pick(&loops, cd), bounds);
}

/* to(dtype): a conversion, straight from the piece into the output. */
const char *cpu_k_to(op_kernel *k)
{
    const op_local *in = &k->in[0];
    op_local *out = &k->out[0];
    int64_t n = dt_layout_numel(out->ndim, out->shape);
    if (k->nin != 1 || n != dt_layout_numel(in->ndim, in->shape))
        return "to: the piece does not match the output (internal error)";
    cpu_convert(out->data, out->dtype, in->data, in->dtype, n);
    return NULL;
}
