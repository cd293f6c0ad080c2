/* The CUDA backend against the CPU backend (built only with CUDA). Without a GPU (no driver, or
 * none found) every differential test prints why and skips: the one place where skipping is the
 * right outcome; the end-to-end tests then check that ops on a cuda mesh fail with that reason
 * instead of crashing or hanging. With a GPU, every slot of the table and every op runs on random
 * inputs and is compared with the CPU backend's result: bit for bit for integers,
 * bools, copies, fills, ranges, uniform random numbers and the exactly rounded float ops, within a
 * tolerance per dtype for CUDA's float functions and cuBLAS's products. */
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"
#include "dtorch.h"
#include "op_backend.h"
#include "op_pointwise_math.h"
#include "op_registry.h"

#define S_INT(v) ((dt_scalar){.is_int = true, .i = (v)})
#define S_FLT(v) ((dt_scalar){.is_int = false, .f = (v)})

static const dt_dtype s_dtypes[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16, DT_INT32, DT_INT64, DT_BOOL};
#define S_NDTYPES 6

/* Why there is no usable GPU here, or NULL when there is one. */
static const char *s_no_device(void)
{
    static char why[200];
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count > 0)
        return NULL;
    snprintf(why, sizeof why, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return why;
}

/* The CUDA table attached to device 0 on this test's thread, or a skip. */
static const op_backend *s_cuda(void)
{
    const char *why = s_no_device();
    if (why) {
        printf("test_cuda: %s: skipped\n", why);
        cr_skip_test("%s", why);
    }
    const op_backend *be = op_backend_find("cuda");
    cr_assert_not_null(be);
    const char *unusable = be->attach(0);
    cr_assert_null(unusable, "%s", unusable);
    return be;
}

/* ---- random host data ------------------------------------------------------------------------- */

static uint64_t s_state = 0x9E3779B97F4A7C15ull;

static double s_uniform(void)
{
    s_state = s_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(s_state >> 11) * 0x1p-53;
}

/* n random elements of dtype: floats in [-3, 3), integers in [-5, 5], bools half true. */
static void *s_random_host(dt_dtype dtype, int64_t n)
{
    size_t elem = dt_dtype_size(dtype);
    char *p = malloc((size_t)(n ? n : 1) * elem);
    for (int64_t i = 0; i < n; i++) {
        double u = s_uniform();
        switch (dtype) {
        case DT_FLOAT32: ((float *)p)[i] = (float)(6 * u - 3); break;
        case DT_FLOAT16: ((uint16_t *)p)[i] = dt_f32_to_f16((float)(6 * u - 3)); break;
        case DT_BFLOAT16: ((uint16_t *)p)[i] = dt_f32_to_bf16((float)(6 * u - 3)); break;
        case DT_INT32: ((int32_t *)p)[i] = (int32_t)(u * 11) - 5; break;
        case DT_INT64: ((int64_t *)p)[i] = (int64_t)(u * 11) - 5; break;
        default: ((uint8_t *)p)[i] = u < 0.5; break;
        }
    }
    return p;
}

static double s_value(const void *p, dt_dtype dtype, int64_t i)
{
    switch (dtype) {
    case DT_FLOAT32: return ((const float *)p)[i];
    case DT_FLOAT16: return dt_f16_to_f32(((const uint16_t *)p)[i]);
    case DT_BFLOAT16: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_INT32: return ((const int32_t *)p)[i];
    case DT_INT64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

/* ---- device helpers --------------------------------------------------------------------------- */

static void *s_upload(const op_backend *be, const void *host, size_t bytes)
{
    void *d = be->alloc(bytes);
    cr_assert_not_null(d);
    const char *why = be->to_device(d, (const int64_t[]){1}, host, (const int64_t[]){1}, 1,
                                    (const int64_t[]){(int64_t)bytes}, 1);
    cr_assert_null(why, "%s", why);
    return d;
}

static void *s_download(const op_backend *be, const void *dev, size_t bytes)
{
    void *host = malloc(bytes ? bytes : 1);
    const char *why = be->synchronize ? be->synchronize() : NULL;
    cr_assert_null(why, "%s", why);
    why = be->to_host(host, (const int64_t[]){1}, dev, (const int64_t[]){1}, 1, (const int64_t[]){(int64_t)bytes}, 1);
    cr_assert_null(why, "%s", why);
    return host;
}

/* Element-by-element agreement of n elements of dtype: exact (NaN with NaN, whatever its bits) or
 * within atol + rtol |cpu|. */
static void s_expect_close(const char *what, dt_dtype dtype, const void *cpu, const void *gpu, int64_t n, bool exact,
                           double rtol, double atol)
{
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; i++) {
        double c = s_value(cpu, dtype, i), g = s_value(gpu, dtype, i);
        bool ok = (isnan(c) && isnan(g)) || c == g || (!exact && fabs(c - g) <= atol + rtol * fabs(c));
        if (!ok) {
            cr_expect(false, "%s (%s): element %lld: CPU %.9g, CUDA %.9g", what, dt_dtype_name(dtype), (long long)i, c,
                      g);
            bad++;
        }
    }
}

/* Tolerances for CUDA's float functions against glibc's (a few ulps in float32; the 16-bit
 * dtypes round the same float32 value, so at most one of their ulps apart). */
static void s_tolerance(dt_dtype dtype, double *rtol, double *atol)
{
    *rtol = dtype == DT_FLOAT16 ? 2e-3 : dtype == DT_BFLOAT16 ? 1.6e-2 : 2e-5;
    *atol = dtype == DT_FLOAT16 ? 2e-3 : dtype == DT_BFLOAT16 ? 1.6e-2 : 2e-6;
}

/* ---- ops through both backends' run ----------------------------------------------------------- */

#define S_MAX_IN 7 /* attention_block's inputs */

typedef struct {
    int nin;
    dt_dtype dtype[S_MAX_IN];
    int ndim[S_MAX_IN];
    int64_t shape[S_MAX_IN][DT_MAX_DIMS];
    op_attrs attrs;
    const void *data[S_MAX_IN]; /* an input's host values where random ones will not do (indices); NULL: random */
    bool nans;                  /* float inputs hold a NaN here and there */
    bool nonzero;               /* random integer and bool inputs hold no 0 (divisors) */
    const char *fails;          /* both backends must fail, with this message */
    int nctx;                   /* > 0: the kernels' ctx (a device's own, e.g. its first query row), instead of
                                   what the op's local hook gives a single device */
    int64_t ctx[OP_MAX_CTX];
} s_case;

/* Ops computed with exactly rounded arithmetic, or none: the CPU's bits (NaN aside). */
static bool s_exact(const char *op)
{
    static const char *const exact[] = {"neg", "abs", "relu", "sqrt", "rsqrt", "reciprocal", "logical_not", "floor",
                                        "ceil", "round", "trunc", "add", "sub", "mul", "div", "floor_divide",
                                        "remainder", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                                        "logical_and", "logical_or", "where", "masked_fill", "clamp", "to", NULL};
    for (int i = 0; exact[i]; i++)
        if (strcmp(exact[i], op) == 0)
            return true;
    return false;
}

/* An input of the case on the host: its given values, or random ones (with NaNs where asked). */
static void *s_input(const s_case *sc, int i, int64_t n)
{
    size_t bytes = (size_t)n * dt_dtype_size(sc->dtype[i]);
    if (sc->data[i]) {
        void *p = malloc(bytes ? bytes : 1);
        memcpy(p, sc->data[i], bytes);
        return p;
    }
    void *p = s_random_host(sc->dtype[i], n);
    if (sc->nonzero && !dt_dtype_is_float(sc->dtype[i]))
        for (int64_t j = 0; j < n; j++)
            if (s_value(p, sc->dtype[i], j) == 0)
                cpu_fill((char *)p + j * (int64_t)dt_dtype_size(sc->dtype[i]), sc->dtype[i], 1, S_INT(1));
    if (sc->nans && dt_dtype_is_float(sc->dtype[i]))
        for (int64_t j = 5; j < n; j += 97)
            switch (sc->dtype[i]) {
            case DT_FLOAT32: ((float *)p)[j] = NAN; break;
            case DT_FLOAT16: ((uint16_t *)p)[j] = 0x7e00; break;
            default: ((uint16_t *)p)[j] = 0x7fc0; break;
            }
    return p;
}

/* Runs op on both backends when its infer accepts the case, and compares every output (an
 * in-place op's is its first input, written where it lies); false when infer refuses the case. */
static bool s_check_op(const op_backend *cuda, const char *name, const s_case *sc, bool exact, double rscale)
{
    const op_backend *cpu = op_backend_find("cpu");
    const op_def *def = op_find(name);
    cr_assert_not_null(def, "%s", name);
    op_call call = {.def = def, .nin = sc->nin, .attrs = sc->attrs};
    for (int i = 0; i < sc->nin; i++) {
        call.in[i].ndim = sc->ndim[i];
        call.in[i].dtype = sc->dtype[i];
        memcpy(call.in[i].shape, sc->shape[i], sizeof sc->shape[i]);
    }
    if (def->infer(&call) != 0)
        return false;
    op_kernel kc = {.def = def, .attrs = &call.attrs, .nin = sc->nin, .nout = def->nout};
    if (def->local)
        kc.nctx = def->local(&call, NULL, kc.ctx);
    if (sc->nctx > 0) {
        kc.nctx = sc->nctx;
        memcpy(kc.ctx, sc->ctx, sizeof kc.ctx);
    }
    op_kernel kg = kc;
    kg.attrs = &call.attrs;
    void *host_in[S_MAX_IN], *dev_in[S_MAX_IN];
    for (int i = 0; i < sc->nin; i++) {
        int64_t n = dt_layout_numel(sc->ndim[i], sc->shape[i]);
        host_in[i] = s_input(sc, i, n);
        dev_in[i] = s_upload(cuda, host_in[i], (size_t)n * dt_dtype_size(sc->dtype[i]));
        kc.in[i] = (op_local){sc->dtype[i], sc->ndim[i], {0}, host_in[i]};
        memcpy(kc.in[i].shape, sc->shape[i], sizeof sc->shape[i]);
        kg.in[i] = kc.in[i];
        kg.in[i].data = dev_in[i];
    }
    int64_t n[OP_MAX_OUTPUTS];
    size_t bytes[OP_MAX_OUTPUTS];
    for (int j = 0; j < def->nout; j++) {
        op_arg *o = &call.out[j];
        n[j] = dt_layout_numel(o->ndim, o->shape);
        bytes[j] = (size_t)n[j] * dt_dtype_size(o->dtype);
        kc.out[j] = (op_local){o->dtype, o->ndim, {0}, def->inplace ? host_in[0] : malloc(bytes[j] ? bytes[j] : 1)};
        memcpy(kc.out[j].shape, o->shape, sizeof o->shape);
        kg.out[j] = kc.out[j];
        kg.out[j].data = def->inplace ? dev_in[0] : cuda->alloc(bytes[j]);
    }
    const char *cpu_why = cpu->run(def, &kc);
    char cpu_msg[256];
    snprintf(cpu_msg, sizeof cpu_msg, "%s", cpu_why ? cpu_why : "");
    const char *gpu_why = cuda->run(def, &kg);
    if (sc->fails) {
        cr_expect(cpu_why && strcmp(cpu_msg, sc->fails) == 0, "%s on the CPU: %s", name, cpu_why ? cpu_msg : "(none)");
        cr_expect(gpu_why && strcmp(gpu_why, sc->fails) == 0, "%s on CUDA: %s, not %s", name,
                  gpu_why ? gpu_why : "(none)", sc->fails);
    } else {
        cr_expect_null(cpu_why, "%s on the CPU: %s", name, cpu_msg);
        cr_expect_null(gpu_why, "%s on CUDA: %s", name, gpu_why);
    }
    for (int j = 0; j < def->nout && !cpu_why && !gpu_why; j++) {
        void *got = s_download(cuda, kg.out[j].data, bytes[j]);
        double rtol, atol;
        s_tolerance(kc.out[j].dtype, &rtol, &atol);
        char what[96];
        snprintf(what, sizeof what, "%s of %s, output %d", name, dt_dtype_name(sc->dtype[0]), j);
        s_expect_close(what, kc.out[j].dtype, kc.out[j].data, got, n[j], exact, rtol * rscale, atol * rscale);
        free(got);
    }
    for (int j = 0; j < def->nout && !def->inplace; j++) {
        free(kc.out[j].data);
        cuda->free(kg.out[j].data, bytes[j]);
    }
    for (int i = 0; i < sc->nin; i++) {
        free(host_in[i]);
        cuda->free(dev_in[i], 0);
    }
    return true;
}

static s_case s_shapes(int nin, const dt_dtype *dtypes, const int *ndim, const int64_t (*shapes)[DT_MAX_DIMS])
{
    cr_assert(nin <= S_MAX_IN);
    s_case c = {.nin = nin};
    for (int i = 0; i < nin; i++) {
        c.dtype[i] = dtypes[i];
        c.ndim[i] = ndim[i];
        memcpy(c.shape[i], shapes[i], sizeof c.shape[i]);
    }
    return c;
}

/* The unary and binary elementwise ops: logical_not and every line of ops/op_pointwise_math.h (the
 * kernel of every other unary or binary row of the op table). */
#define S_NAME(name, ...) #name,
static const char *const s_unary_ops[] = {OP_EW_UNARY_FLOAT(S_NAME) OP_EW_UNARY_NUMBER(S_NAME) "logical_not", NULL};
static const char *const s_binary_ops[] = {
    OP_EW_BINARY_ANY(S_NAME) OP_EW_BINARY_NUMBER(S_NAME) OP_EW_BINARY_DIVIDING(S_NAME) OP_EW_BINARY_FLOAT(S_NAME)
    OP_EW_COMPARE(S_NAME) OP_EW_LOGICAL(S_NAME) NULL};
/* ... and those an integer zero divides (their tests' integers are not 0: integer_division_by_zero) */
static const char *const s_dividing_ops[] = {OP_EW_BINARY_DIVIDING(S_NAME) NULL};
#undef S_NAME

static bool s_divides(const char *op)
{
    for (int i = 0; s_dividing_ops[i]; i++)
        if (strcmp(s_dividing_ops[i], op) == 0)
            return true;
    return false;
}

Test(cuda_ops, unary)
{
    const op_backend *cuda = s_cuda();
    for (int o = 0; s_unary_ops[o]; o++)
        for (int d = 0; d < S_NDTYPES; d++) {
            s_case c = s_shapes(1, &s_dtypes[d], (int[]){3}, (const int64_t[][DT_MAX_DIMS]){{3, 4, 37}});
            s_check_op(cuda, s_unary_ops[o], &c, s_exact(s_unary_ops[o]), 1);
        }
}

Test(cuda_ops, binary_broadcast)
{
    const op_backend *cuda = s_cuda();
    /* same dtypes, then mixed ones (promoted, converted on the device) */
    const dt_dtype pairs[][2] = {{DT_FLOAT32, DT_FLOAT32}, {DT_FLOAT16, DT_FLOAT16}, {DT_BFLOAT16, DT_BFLOAT16},
                                 {DT_INT32, DT_INT32},     {DT_INT64, DT_INT64},     {DT_BOOL, DT_BOOL},
                                 {DT_FLOAT16, DT_FLOAT32}, {DT_INT32, DT_FLOAT32},   {DT_BOOL, DT_INT64},
                                 {DT_BFLOAT16, DT_FLOAT16}, {DT_INT64, DT_INT32}};
    for (int o = 0; s_binary_ops[o]; o++)
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
            /* broadcast both ways, and one run of same-shape operands */
            s_case c = s_shapes(2, pairs[p], (int[]){3, 2}, (const int64_t[][DT_MAX_DIMS]){{3, 1, 33}, {4, 33}});
            c.nonzero = s_divides(s_binary_ops[o]);
            s_check_op(cuda, s_binary_ops[o], &c, s_exact(s_binary_ops[o]), 1);
            c = s_shapes(2, pairs[p], (int[]){2, 2}, (const int64_t[][DT_MAX_DIMS]){{5, 70}, {5, 70}});
            c.nonzero = s_divides(s_binary_ops[o]);
            s_check_op(cuda, s_binary_ops[o], &c, s_exact(s_binary_ops[o]), 1);
        }
}

Test(cuda_ops, binary_with_a_number)
{
    const op_backend *cuda = s_cuda();
    const dt_scalar numbers[] = {S_INT(2), S_FLT(-1.5)};
    for (int o = 0; s_binary_ops[o]; o++)
        for (int d = 0; d < S_NDTYPES; d++)
            for (int v = 0; v < 2; v++)
                for (int left = 0; left < 2; left++) {
                    s_case c = s_shapes(1, &s_dtypes[d], (int[]){2}, (const int64_t[][DT_MAX_DIMS]){{6, 11}});
                    c.nonzero = s_divides(s_binary_ops[o]);
                    c.attrs.has_scalar = true;
                    c.attrs.scalar = numbers[v];
                    c.attrs.nints = 1;
                    c.attrs.ints[0] = left;
                    s_check_op(cuda, s_binary_ops[o], &c, s_exact(s_binary_ops[o]), 1);
                }
}

/* An integer divided by zero fails floor_divide and remainder with the CPU's message, whether the
 * zero is an element of the divisor or a number, and whichever side the number is on; an empty
 * output divides nothing; floats divided by zero give the CPU's infinities and NaNs. */
Test(cuda_ops, integer_division_by_zero)
{
    const op_backend *cuda = s_cuda();
    static const int32_t d32[7] = {3, -2, 0, 5, -1, 4, 7};
    static const int64_t d64[7] = {3, -2, 0, 5, -1, 4, 7};
    static const float df[7] = {3, -2, 0, 5, -0.0f, 4, -7};
    for (int o = 0; s_dividing_ops[o]; o++) {
        const char *op = s_dividing_ops[o];
        char failure[96];
        snprintf(failure, sizeof failure, "%s: ZeroDivisionError (an integer divided by zero)", op);
        for (int t = 0; t < 2; t++) {
            dt_dtype ty[2] = {t ? DT_INT64 : DT_INT32, t ? DT_INT64 : DT_INT32};
            const void *zeros = t ? (const void *)d64 : (const void *)d32;
            s_case c = s_shapes(2, ty, (int[]){2, 1}, (const int64_t[][DT_MAX_DIMS]){{3, 7}, {7}});
            c.data[1] = zeros;
            c.fails = failure;
            cr_expect(s_check_op(cuda, op, &c, true, 1), "%s of %s by a tensor", op, dt_dtype_name(ty[0]));
            c = s_shapes(2, ty, (int[]){2, 1}, (const int64_t[][DT_MAX_DIMS]){{0, 7}, {7}});
            c.data[1] = zeros;
            cr_expect(s_check_op(cuda, op, &c, true, 1), "%s of an empty %s", op, dt_dtype_name(ty[0]));
            for (int left = 0; left < 2; left++) {
                c = s_shapes(1, &ty[0], (int[]){1}, (const int64_t[][DT_MAX_DIMS]){{7}});
                c.data[0] = left ? zeros : NULL;
                c.attrs.has_scalar = true;
                c.attrs.scalar = S_INT(left ? 5 : 0);
                c.attrs.nints = 1;
                c.attrs.ints[0] = left;
                c.fails = failure;
                cr_expect(s_check_op(cuda, op, &c, true, 1), "%s of %s, a number on the %s", op,
                          dt_dtype_name(ty[0]), left ? "left" : "right");
            }
        }
        dt_dtype tf[2] = {DT_FLOAT32, DT_FLOAT32};
        s_case c = s_shapes(2, tf, (int[]){2, 1}, (const int64_t[][DT_MAX_DIMS]){{3, 7}, {7}});
        c.data[1] = df;
        cr_expect(s_check_op(cuda, op, &c, true, 1), "%s of float32 by zeros", op);
    }
}

Test(cuda_ops, where_masked_fill_clamp_to)
{
    const op_backend *cuda = s_cuda();
    for (int d = 0; d < S_NDTYPES; d++) {
        dt_dtype t = s_dtypes[d];
        s_case c = s_shapes(3, (dt_dtype[]){DT_BOOL, t, t}, (int[]){3, 2, 3},
                            (const int64_t[][DT_MAX_DIMS]){{3, 1, 9}, {4, 9}, {3, 4, 1}});
        cr_expect(s_check_op(cuda, "where", &c, true, 1), "where of %s", dt_dtype_name(t));
        c = s_shapes(2, (dt_dtype[]){DT_BOOL, t}, (int[]){3, 2}, (const int64_t[][DT_MAX_DIMS]){{3, 1, 9}, {4, 9}});
        c.attrs.has_scalar = true;
        c.attrs.scalar = S_INT(1);
        c.attrs.nints = 1;
        c.attrs.ints[0] = 2;
        s_check_op(cuda, "where", &c, true, 1);
        c = s_shapes(2, (dt_dtype[]){t, DT_BOOL}, (int[]){3, 2}, (const int64_t[][DT_MAX_DIMS]){{3, 4, 9}, {4, 1}});
        c.attrs.has_scalar = true;
        c.attrs.scalar = S_INT(0);
        s_check_op(cuda, "masked_fill", &c, true, 1);
        for (int bounds = 1; bounds <= 3; bounds++) {
            c = s_shapes(1, &t, (int[]){2}, (const int64_t[][DT_MAX_DIMS]){{7, 13}});
            c.attrs.nints = 2;
            c.attrs.ints[0] = bounds;
            c.attrs.ints[1] = 0;
            c.attrs.nfloats = 2;
            c.attrs.floats[0] = -2;
            c.attrs.floats[1] = 1;
            s_check_op(cuda, "clamp", &c, true, 1);
        }
        for (int e = 0; e < S_NDTYPES; e++) {
            c = s_shapes(1, &t, (int[]){2}, (const int64_t[][DT_MAX_DIMS]){{7, 13}});
            c.attrs.nints = 1;
            c.attrs.ints[0] = s_dtypes[e];
            cr_expect(s_check_op(cuda, "to", &c, true, 1), "to %s", dt_dtype_name(s_dtypes[e]));
        }
    }
}

Test(cuda_ops, products)
{
    const op_backend *cuda = s_cuda();
    const dt_dtype floats[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16};
    for (int d = 0; d < 3; d++) {
        dt_dtype t = floats[d];
        dt_dtype two[] = {t, t}, three[] = {t, t, t};
        /* K = 64: the tolerance grows with the sum's length (order of accumulation) */
        s_case c = s_shapes(2, two, (int[]){2, 2}, (const int64_t[][DT_MAX_DIMS]){{17, 64}, {64, 9}});
        cr_expect(s_check_op(cuda, "mm", &c, false, 8));
        c = s_shapes(2, two, (int[]){3, 3}, (const int64_t[][DT_MAX_DIMS]){{3, 5, 64}, {3, 64, 4}});
        cr_expect(s_check_op(cuda, "bmm", &c, false, 8));
        c = s_shapes(2, two, (int[]){4, 3}, (const int64_t[][DT_MAX_DIMS]){{2, 1, 5, 64}, {3, 64, 4}});
        cr_expect(s_check_op(cuda, "matmul", &c, false, 8), "matmul broadcasting batch dims");
        c = s_shapes(2, two, (int[]){1, 2}, (const int64_t[][DT_MAX_DIMS]){{64}, {64, 6}});
        cr_expect(s_check_op(cuda, "matmul", &c, false, 8), "vector @ matrix");
        c = s_shapes(2, two, (int[]){3, 1}, (const int64_t[][DT_MAX_DIMS]){{2, 5, 64}, {64}});
        cr_expect(s_check_op(cuda, "matmul", &c, false, 8), "batch @ vector");
        c = s_shapes(3, three, (int[]){3, 2, 1}, (const int64_t[][DT_MAX_DIMS]){{2, 5, 64}, {8, 64}, {8}});
        cr_expect(s_check_op(cuda, "linear", &c, false, 8), "linear with a bias");
        c = s_shapes(2, two, (int[]){2, 2}, (const int64_t[][DT_MAX_DIMS]){{3, 64}, {8, 64}});
        cr_expect(s_check_op(cuda, "linear", &c, false, 8), "linear");
        c = s_shapes(2, two, (int[]){2, 2}, (const int64_t[][DT_MAX_DIMS]){{3, 0}, {0, 4}});
        cr_expect(s_check_op(cuda, "mm", &c, true, 1), "an empty sum is 0");
    }
}

Test(cuda_ops, integer_products)
{
    const op_backend *cuda = s_cuda();
    const dt_dtype ints[] = {DT_INT32, DT_INT64};
    for (int d = 0; d < 2; d++) {
        dt_dtype t = ints[d], two[] = {t, t}, three[] = {t, t, t};
        /* int64 that wraps, as the CPU's loops: the CPU's bits */
        s_case c = s_shapes(2, two, (int[]){2, 2}, (const int64_t[][DT_MAX_DIMS]){{17, 40}, {40, 9}});
        cr_expect(s_check_op(cuda, "mm", &c, true, 1));
        c = s_shapes(2, two, (int[]){4, 3}, (const int64_t[][DT_MAX_DIMS]){{2, 1, 5, 8}, {3, 8, 4}});
        cr_expect(s_check_op(cuda, "matmul", &c, true, 1), "matmul broadcasting batch dims");
        c = s_shapes(2, two, (int[]){1, 1}, (const int64_t[][DT_MAX_DIMS]){{8}, {8}});
        cr_expect(s_check_op(cuda, "matmul", &c, true, 1), "a dot product");
        c = s_shapes(3, three, (int[]){3, 2, 1}, (const int64_t[][DT_MAX_DIMS]){{2, 5, 8}, {6, 8}, {6}});
        cr_expect(s_check_op(cuda, "linear", &c, true, 1), "linear with a bias");
        c = s_shapes(2, two, (int[]){2, 2}, (const int64_t[][DT_MAX_DIMS]){{3, 0}, {0, 4}});
        cr_expect(s_check_op(cuda, "mm", &c, true, 1), "an empty sum is 0");
    }
}

/* ---- reductions, softmax, norms ---------------------------------------------------------------
 * Pieces are C-contiguous by the backend interface; reductions over an inner dim or over dims
 * that are not neighbours read their input strided, which is what these shapes exercise. */

static void s_set_ints(s_case *c, int n, const int64_t *v)
{
    c->attrs.nints = n;
    if (n)
        memcpy(c->attrs.ints, v, (size_t)n * sizeof *v);
}

/* The float32 tolerance a sum of about n terms needs, added in another order than the CPU's; a
 * 16-bit output rounds the same float32 value to its own precision, so keeps its own. */
static double s_sum_slack(dt_dtype t, int64_t n) { return t == DT_FLOAT32 ? (double)n / 4 + 1 : 1; }

typedef struct {
    int ndim;
    int64_t shape[3];
    int ndims; /* dims reduced (0: every dim) */
    int64_t dims[3];
} s_reduce_shape;

static const s_reduce_shape s_reduce_shapes[] = {
    {3, {5, 7, 33}, 0, {0}},    /* everything */
    {3, {5, 7, 33}, 2, {0, 2}}, /* dims that are not neighbours: the kept one is strided */
    {3, {5, 7, 33}, 1, {1}},    /* an inner dim */
    {2, {3, 300}, 1, {-1}},     /* long rows: a block of threads each */
    {2, {3, 70001}, 1, {-1}},   /* few very long rows: several blocks each, merged (the last part short) */
    {1, {200000}, 0, {0}},      /* a full reduction split over blocks */
    {3, {4, 0, 3}, 1, {1}},     /* an empty reduced dim */
    {3, {4, 0, 3}, 1, {0}},     /* an empty output */
    {0, {0}, 0, {0}},           /* a 0-d tensor */
};
#define S_NREDUCE_SHAPES (sizeof s_reduce_shapes / sizeof s_reduce_shapes[0])

Test(cuda_ops, reductions)
{
    const op_backend *cuda = s_cuda();
    static const char *const ops[] = {"sum", "mean", "amax", "amin", NULL};
    for (int o = 0; ops[o]; o++)
        for (size_t h = 0; h < S_NREDUCE_SHAPES; h++)
            for (int d = 0; d < S_NDTYPES; d++)
                for (int keepdim = 0; keepdim < 2; keepdim++)
                    for (int nans = 0; nans < 2; nans++) {
                        const s_reduce_shape *r = &s_reduce_shapes[h];
                        dt_dtype t = s_dtypes[d];
                        s_case c = s_shapes(1, &t, &r->ndim, (const int64_t[][DT_MAX_DIMS]){{r->shape[0], r->shape[1],
                                                                                             r->shape[2]}});
                        int64_t ints[5] = {keepdim, -1, r->dims[0], r->dims[1], r->dims[2]};
                        s_set_ints(&c, 2 + r->ndims, ints);
                        c.nans = nans;
                        bool sum = o < 2;
                        s_check_op(cuda, ops[o], &c, !sum || !dt_dtype_is_float(t),
                                   s_sum_slack(t, dt_layout_numel(r->ndim, r->shape)));
                    }
    /* max and min of every element */
    for (size_t h = 0; h < S_NREDUCE_SHAPES; h++)
        for (int d = 0; d < S_NDTYPES; d++)
            for (int nans = 0; nans < 2; nans++) {
                const s_reduce_shape *r = &s_reduce_shapes[h];
                s_case c = s_shapes(1, &s_dtypes[d], &r->ndim,
                                    (const int64_t[][DT_MAX_DIMS]){{r->shape[0], r->shape[1], r->shape[2]}});
                c.nans = nans;
                s_check_op(cuda, "max", &c, true, 1);
                s_check_op(cuda, "min", &c, true, 1);
            }
}

/* sum and mean with dtype=: torch converts the input first (losing precision to a 16-bit float or
 * bool), then reduces in float32 or int64 */
Test(cuda_ops, reductions_with_a_dtype)
{
    const op_backend *cuda = s_cuda();
    const struct {
        const char *op;
        dt_dtype in, to;
    } casts[] = {{"sum", DT_FLOAT32, DT_FLOAT16}, {"sum", DT_FLOAT32, DT_BFLOAT16}, {"sum", DT_INT32, DT_FLOAT32},
                 {"sum", DT_FLOAT32, DT_INT64},   {"sum", DT_INT64, DT_INT32},      {"sum", DT_INT32, DT_BOOL},
                 {"sum", DT_FLOAT16, DT_FLOAT32}, {"mean", DT_BFLOAT16, DT_FLOAT32}, {"mean", DT_INT32, DT_FLOAT32},
                 {"mean", DT_FLOAT32, DT_FLOAT16}};
    for (size_t i = 0; i < sizeof casts / sizeof casts[0]; i++)
        for (size_t h = 0; h < S_NREDUCE_SHAPES; h++) {
            const s_reduce_shape *r = &s_reduce_shapes[h];
            s_case c = s_shapes(1, &casts[i].in, &r->ndim,
                                (const int64_t[][DT_MAX_DIMS]){{r->shape[0], r->shape[1], r->shape[2]}});
            int64_t ints[5] = {0, casts[i].to, r->dims[0], r->dims[1], r->dims[2]};
            s_set_ints(&c, 2 + r->ndims, ints);
            cr_expect(s_check_op(cuda, casts[i].op, &c, !dt_dtype_is_float(casts[i].to),
                                 s_sum_slack(casts[i].to, dt_layout_numel(r->ndim, r->shape))),
                      "%s of %s to %s", casts[i].op, dt_dtype_name(casts[i].in), dt_dtype_name(casts[i].to));
        }
}

/* argmax, argmin (of every element, or along a dim) and max/min along a dim: the CPU's values and
 * positions exactly, ties to the first (small integers tie often) and a NaN beating any number */
Test(cuda_ops, arg_reductions)
{
    const op_backend *cuda = s_cuda();
    const struct {
        int ndim;
        int64_t shape[3];
    } shapes[] = {{3, {5, 7, 33}}, {2, {3, 300}}, {2, {3, 70001}}, {1, {200000}}, {3, {4, 0, 3}}, {0, {0}}};
    for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++)
        for (int d = 0; d < S_NDTYPES; d++)
            for (int nans = 0; nans < 2; nans++)
                for (int keepdim = 0; keepdim < 2; keepdim++)
                    for (int dim = -1; dim < (shapes[h].ndim ? shapes[h].ndim : 1); dim++) {
                        s_case c = s_shapes(1, &s_dtypes[d], &shapes[h].ndim,
                                            (const int64_t[][DT_MAX_DIMS]){{shapes[h].shape[0], shapes[h].shape[1],
                                                                            shapes[h].shape[2]}});
                        c.nans = nans;
                        /* dim -1 here: argmax/argmin of every element */
                        s_set_ints(&c, dim < 0 ? 1 : 2, (int64_t[]){keepdim, dim});
                        s_check_op(cuda, "argmax", &c, true, 1);
                        s_check_op(cuda, "argmin", &c, true, 1);
                        if (dim < 0)
                            continue;
                        s_set_ints(&c, 2, (int64_t[]){dim, keepdim});
                        s_check_op(cuda, "max_dim", &c, true, 1);
                        s_check_op(cuda, "min_dim", &c, true, 1);
                    }
}

Test(cuda_ops, softmax)
{
    const op_backend *cuda = s_cuda();
    static const char *const ops[] = {"softmax", "log_softmax", NULL};
    const struct {
        int ndim;
        int64_t shape[3];
    } shapes[] = {{3, {5, 7, 33}}, {2, {3, 300}}, {3, {4, 0, 3}}, {0, {0}}};
    /* (input, dtype=): the input's own, a 16-bit float from float32 (converted first), and
     * integers with a floating dtype= */
    const int64_t casts[][2] = {{DT_FLOAT32, -1},         {DT_FLOAT16, -1},       {DT_BFLOAT16, -1},
                                {DT_FLOAT32, DT_FLOAT16}, {DT_INT32, DT_FLOAT32}, {DT_INT64, DT_BFLOAT16}};
    for (int o = 0; ops[o]; o++)
        for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++)
            for (size_t i = 0; i < sizeof casts / sizeof casts[0]; i++)
                for (int nans = 0; nans < 2; nans++)
                    for (int dim = 0; dim < (shapes[h].ndim ? shapes[h].ndim : 1); dim++) {
                        dt_dtype in = (dt_dtype)casts[i][0];
                        s_case c = s_shapes(1, &in, &shapes[h].ndim,
                                            (const int64_t[][DT_MAX_DIMS]){{shapes[h].shape[0], shapes[h].shape[1],
                                                                            shapes[h].shape[2]}});
                        c.nans = nans;
                        s_set_ints(&c, 2, (int64_t[]){dim, casts[i][1]});
                        dt_dtype out = casts[i][1] >= 0 ? (dt_dtype)casts[i][1] : in;
                        cr_expect(s_check_op(cuda, ops[o], &c, false, out == DT_FLOAT32 ? 8 : 1), "%s along %d",
                                  ops[o], dim);
                    }
}

Test(cuda_ops, norms)
{
    const op_backend *cuda = s_cuda();
    const dt_dtype floats[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16};
    const struct {
        int ndim;
        int64_t shape[3];
        int nnorm; /* the normalised dims: the last 1 or 2 */
    } shapes[] = {{3, {4, 5, 64}, 1}, {3, {4, 5, 64}, 2}, {2, {2, 1000}, 1}, {2, {0, 64}, 1}};
    for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++)
        for (int d = 0; d < 3; d++)
            for (int wd = 0; wd < 3; wd++)
                for (int flags = 0; flags < 4; flags++) {
                    int nn = shapes[h].nnorm, xn = shapes[h].ndim;
                    const int64_t *norm = shapes[h].shape + xn - nn;
                    dt_dtype t[3] = {floats[d], floats[wd], floats[wd]};
                    int ndim[3] = {xn, nn, nn};
                    int64_t sh[3][DT_MAX_DIMS] = {{shapes[h].shape[0], shapes[h].shape[1], shapes[h].shape[2]}};
                    memcpy(sh[1], norm, (size_t)nn * sizeof *norm);
                    memcpy(sh[2], norm, (size_t)nn * sizeof *norm);
                    s_case c = s_shapes(1 + __builtin_popcount((unsigned)flags), t, ndim, sh);
                    int64_t ints[3] = {flags, norm[0], nn > 1 ? norm[1] : 0};
                    s_set_ints(&c, 1 + nn, ints);
                    c.attrs.nfloats = 1;
                    c.attrs.floats[0] = 1e-5;
                    double slack = floats[d] == DT_FLOAT32 ? 8 : 1;
                    cr_expect(s_check_op(cuda, "layer_norm", &c, false, slack), "layer_norm, flags %d", flags);
                    if (flags > 1)
                        continue;
                    c.attrs.nfloats = flags ? 1 : 0; /* none: float32's epsilon */
                    cr_expect(s_check_op(cuda, "rms_norm", &c, false, slack), "rms_norm, flags %d", flags);
                }
}

/* ---- views and data movement: the CPU's bytes ------------------------------------------------ */

/* op on one input of shape (ndim, shape) and each dtype, with attrs.ints v */
static void s_check_view(const op_backend *cuda, const char *op, int ndim, const int64_t *shape, int nints,
                         const int64_t *v)
{
    for (int d = 0; d < S_NDTYPES; d++) {
        int64_t sh[1][DT_MAX_DIMS] = {{0}};
        memcpy(sh[0], shape, (size_t)ndim * sizeof *shape);
        s_case c = s_shapes(1, &s_dtypes[d], &ndim, sh);
        s_set_ints(&c, nints, v);
        cr_expect(s_check_op(cuda, op, &c, true, 1), "%s of %s", op, dt_dtype_name(s_dtypes[d]));
    }
}

Test(cuda_ops, views)
{
    const op_backend *cuda = s_cuda();
    s_check_view(cuda, "reshape", 2, (int64_t[]){4, 6}, 2, (int64_t[]){3, -1});
    s_check_view(cuda, "reshape", 2, (int64_t[]){0, 6}, 2, (int64_t[]){3, 0});
    s_check_view(cuda, "flatten", 3, (int64_t[]){2, 3, 4}, 2, (int64_t[]){0, 1});
    s_check_view(cuda, "unsqueeze", 2, (int64_t[]){3, 4}, 1, (int64_t[]){1});
    s_check_view(cuda, "squeeze", 3, (int64_t[]){3, 1, 4}, 0, NULL);
    s_check_view(cuda, "permute", 3, (int64_t[]){2, 3, 4}, 3, (int64_t[]){2, 0, 1});
    s_check_view(cuda, "permute", 3, (int64_t[]){2, 3, 4}, 3, (int64_t[]){-1, 1, 0});
    s_check_view(cuda, "permute", 3, (int64_t[]){0, 3, 4}, 3, (int64_t[]){1, 2, 0});
    s_check_view(cuda, "expand", 3, (int64_t[]){3, 1, 5}, 4, (int64_t[]){2, 3, 4, 5});
    s_check_view(cuda, "expand", 3, (int64_t[]){3, 1, 5}, 3, (int64_t[]){-1, 0, -1});
    s_check_view(cuda, "slice", 3, (int64_t[]){5, 9, 4}, 4, (int64_t[]){1, 1, 9, 3});
    s_check_view(cuda, "slice", 3, (int64_t[]){5, 9, 4}, 4, (int64_t[]){2, 3, 3, 1});
    s_check_view(cuda, "narrow", 3, (int64_t[]){5, 9, 4}, 3, (int64_t[]){0, 2, 3});
    s_check_view(cuda, "select", 3, (int64_t[]){5, 9, 4}, 2, (int64_t[]){1, -2});
    for (int64_t diag = -1; diag <= 2; diag++) {
        s_check_view(cuda, "triu", 3, (int64_t[]){2, 5, 6}, 1, &diag);
        s_check_view(cuda, "tril", 3, (int64_t[]){2, 5, 6}, 1, &diag);
        s_check_view(cuda, "tril", 3, (int64_t[]){0, 5, 6}, 1, &diag);
    }
}

Test(cuda_ops, cat_and_stack)
{
    const op_backend *cuda = s_cuda();
    for (int d = 0; d < S_NDTYPES; d++)
        for (int e = 0; e < S_NDTYPES; e++) {
            /* the second piece of another dtype: promoted, converted on the device */
            dt_dtype t[3] = {s_dtypes[d], s_dtypes[e], s_dtypes[d]};
            s_case c = s_shapes(3, t, (int[]){2, 2, 2}, (const int64_t[][DT_MAX_DIMS]){{2, 3}, {4, 3}, {1, 3}});
            s_set_ints(&c, 1, (int64_t[]){0});
            cr_expect(s_check_op(cuda, "cat", &c, true, 1));
            c = s_shapes(3, t, (int[]){2, 2, 2}, (const int64_t[][DT_MAX_DIMS]){{2, 3}, {2, 5}, {2, 0}});
            s_set_ints(&c, 1, (int64_t[]){-1});
            cr_expect(s_check_op(cuda, "cat", &c, true, 1), "cat with an empty piece");
            c = s_shapes(3, t, (int[]){2, 2, 2}, (const int64_t[][DT_MAX_DIMS]){{2, 3}, {2, 3}, {2, 3}});
            s_set_ints(&c, 1, (int64_t[]){1});
            cr_expect(s_check_op(cuda, "stack", &c, true, 1));
        }
}

Test(cuda_ops, gathers)
{
    const op_backend *cuda = s_cuda();
    static const int64_t wrapped[] = {3, 0, 0, 2, -1};
    static const int32_t small[] = {1, 2};
    static const int64_t tokens[] = {9, 0, 4, 4, 7, 1};
    static const int32_t tokens32[] = {2, 8, 0};
    for (int d = 0; d < S_NDTYPES; d++) {
        dt_dtype t = s_dtypes[d];
        s_case c = s_shapes(2, (dt_dtype[]){t, DT_INT64}, (int[]){3, 1},
                            (const int64_t[][DT_MAX_DIMS]){{5, 4, 3}, {5}});
        c.data[1] = wrapped;
        s_set_ints(&c, 2, (int64_t[]){1, 1});
        cr_expect(s_check_op(cuda, "index_select", &c, true, 1), "index_select, negative positions");
        c = s_shapes(2, (dt_dtype[]){t, DT_INT32}, (int[]){3, 1}, (const int64_t[][DT_MAX_DIMS]){{5, 4, 3}, {2}});
        c.data[1] = small;
        s_set_ints(&c, 2, (int64_t[]){-1, 0});
        cr_expect(s_check_op(cuda, "index_select", &c, true, 1), "index_select, int32 positions");
        c = s_shapes(2, (dt_dtype[]){t, DT_INT64}, (int[]){3, 1}, (const int64_t[][DT_MAX_DIMS]){{5, 4, 3}, {0}});
        s_set_ints(&c, 2, (int64_t[]){0, 0});
        cr_expect(s_check_op(cuda, "index_select", &c, true, 1), "index_select, no positions");
        c = s_shapes(2, (dt_dtype[]){DT_INT64, t}, (int[]){2, 2}, (const int64_t[][DT_MAX_DIMS]){{2, 3}, {10, 16}});
        c.data[0] = tokens;
        cr_expect(s_check_op(cuda, "embedding", &c, true, 1), "embedding");
        c = s_shapes(2, (dt_dtype[]){DT_INT32, t}, (int[]){1, 2}, (const int64_t[][DT_MAX_DIMS]){{3}, {10, 5}});
        c.data[0] = tokens32;
        cr_expect(s_check_op(cuda, "embedding", &c, true, 1), "embedding, int32 indices, odd rows");
        c = s_shapes(2, (dt_dtype[]){DT_INT64, t}, (int[]){2, 2}, (const int64_t[][DT_MAX_DIMS]){{0, 3}, {10, 16}});
        cr_expect(s_check_op(cuda, "embedding", &c, true, 1), "embedding, no indices");
    }
}

Test(cuda_ops, writes)
{
    const op_backend *cuda = s_cuda();
    static const int64_t repeated[] = {5, 0, 5}; /* the last write of a position wins */
    for (int d = 0; d < S_NDTYPES; d++) {
        dt_dtype t = s_dtypes[d];
        s_case c = s_shapes(2, (dt_dtype[]){t, t}, (int[]){3, 3}, (const int64_t[][DT_MAX_DIMS]){{4, 6, 5}, {4, 2, 5}});
        s_set_ints(&c, 2, (int64_t[]){1, 3});
        cr_expect(s_check_op(cuda, "slice_assign_", &c, true, 1));
        s_set_ints(&c, 2, (int64_t[]){1, 4});
        cr_expect(s_check_op(cuda, "shard_assign_", &c, true, 1));
        c = s_shapes(3, (dt_dtype[]){t, DT_INT64, t}, (int[]){3, 1, 3},
                     (const int64_t[][DT_MAX_DIMS]){{4, 6, 5}, {3}, {4, 3, 5}});
        c.data[1] = repeated;
        s_set_ints(&c, 1, (int64_t[]){1});
        cr_expect(s_check_op(cuda, "index_copy_", &c, true, 1));
    }
}

/* An index out of range fails the op on the device with the CPU's message. */
Test(cuda_ops, bad_indices_fail_as_on_the_cpu)
{
    const op_backend *cuda = s_cuda();
    static const int64_t past[] = {1, 10, 2}, negative[] = {0, -7}, minus_one[] = {-1}, six[] = {6};
    s_case c = s_shapes(2, (dt_dtype[]){DT_INT64, DT_FLOAT32}, (int[]){1, 2},
                        (const int64_t[][DT_MAX_DIMS]){{3}, {10, 4}});
    c.data[0] = past;
    c.fails = "index out of range in embedding";
    cr_expect(s_check_op(cuda, "embedding", &c, true, 1));
    c = s_shapes(2, (dt_dtype[]){DT_FLOAT32, DT_INT64}, (int[]){2, 1}, (const int64_t[][DT_MAX_DIMS]){{3, 4}, {2}});
    c.data[1] = negative;
    s_set_ints(&c, 2, (int64_t[]){1, 1});
    c.fails = "index -7 is out of bounds for dimension 1 with size 4";
    cr_expect(s_check_op(cuda, "index_select", &c, true, 1));
    c = s_shapes(2, (dt_dtype[]){DT_FLOAT32, DT_INT64}, (int[]){2, 1}, (const int64_t[][DT_MAX_DIMS]){{3, 4}, {1}});
    c.data[1] = minus_one;
    s_set_ints(&c, 2, (int64_t[]){1, 0});
    c.fails = "index out of range in self";
    cr_expect(s_check_op(cuda, "index_select", &c, true, 1));
    c = s_shapes(3, (dt_dtype[]){DT_FLOAT32, DT_INT64, DT_FLOAT32}, (int[]){2, 1, 2},
                 (const int64_t[][DT_MAX_DIMS]){{2, 6}, {1}, {2, 1}});
    c.data[1] = six;
    s_set_ints(&c, 1, (int64_t[]){1});
    c.fails = "index_copy_(): index 6 is out of bounds for dimension 1 with size 6";
    cr_expect(s_check_op(cuda, "index_copy_", &c, true, 1));
}

Test(cuda_ops, rope)
{
    const op_backend *cuda = s_cuda();
    static const int64_t positions[] = {0, 1, 7, 100, 999, 3, 4, 5, 4000, 6};
    static const float inv_freq[] = {1.0f, 0.1f, 0.01f, 0.001f};
    const dt_dtype floats[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16};
    for (int d = 0; d < 3; d++)
        for (int64_t pb = 1; pb <= 2; pb++)
            for (int sc = 0; sc < 2; sc++) {
                s_case c = s_shapes(3, (dt_dtype[]){floats[d], DT_INT64, DT_FLOAT32}, (int[]){4, 2, 1},
                                    (const int64_t[][DT_MAX_DIMS]){{2, 3, 5, 8}, {pb, 5}, {4}});
                c.data[1] = positions;
                c.data[2] = inv_freq;
                c.attrs.nfloats = 1;
                c.attrs.floats[0] = sc ? 0.7 : 1.0;
                /* CUDA's cosf and sinf against glibc's: a few ulps of the angle's functions */
                cr_expect(s_check_op(cuda, "rope", &c, false, floats[d] == DT_FLOAT32 ? 4 : 1));
            }
}

/* ---- cumsum, topk ------------------------------------------------------------------------------ */

typedef struct {
    int ndim;
    int64_t shape[3];
} s_shape3;

static s_case s_one(dt_dtype t, const s_shape3 *h)
{
    return s_shapes(1, &t, &h->ndim, (const int64_t[][DT_MAX_DIMS]){{h->shape[0], h->shape[1], h->shape[2]}});
}

/* cumsum adds in the CPU's order, so its bits: along the last dim and along inner ones (read strided),
 * with torch's conversion to dtype= first */
Test(cuda_ops, cumsum)
{
    const op_backend *cuda = s_cuda();
    const s_shape3 shapes[] = {{3, {5, 7, 33}}, {2, {3, 300}}, {3, {4, 0, 3}}, {0, {0}}};
    const int64_t casts[][2] = {{DT_FLOAT32, -1},        {DT_FLOAT16, -1},          {DT_BFLOAT16, -1},
                                {DT_INT32, -1},          {DT_INT64, -1},            {DT_BOOL, -1},
                                {DT_FLOAT32, DT_FLOAT16}, {DT_INT32, DT_FLOAT32},   {DT_FLOAT32, DT_INT64},
                                {DT_INT64, DT_INT32}};
    for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++)
        for (size_t i = 0; i < sizeof casts / sizeof casts[0]; i++)
            for (int nans = 0; nans < 2; nans++)
                for (int dim = 0; dim < (shapes[h].ndim ? shapes[h].ndim : 1); dim++) {
                    /* (a NaN converted to an integer has no value the backends agree on) */
                    if (nans && casts[i][1] >= 0 && !dt_dtype_is_float((dt_dtype)casts[i][1]))
                        continue;
                    s_case c = s_one((dt_dtype)casts[i][0], &shapes[h]);
                    c.nans = nans;
                    s_set_ints(&c, 2, (int64_t[]){dim, casts[i][1]});
                    cr_expect(s_check_op(cuda, "cumsum", &c, true, 1), "cumsum of %s along %d",
                              dt_dtype_name((dt_dtype)casts[i][0]), dim);
                }
}

/* topk: the CPU's values and positions exactly, largest and smallest, ties in position order
 * (small integers and 16-bit floats tie often; -0 ties with +0), a NaN above every number; long
 * slices (a vocabulary) and inner dims */
Test(cuda_ops, topk)
{
    const op_backend *cuda = s_cuda();
    const s_shape3 shapes[] = {{3, {5, 7, 33}}, {2, {3, 300}}, {2, {2, 40000}}, {3, {4, 0, 3}}, {0, {0}}};
    const dt_dtype types[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16, DT_INT32, DT_INT64};
    for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++)
        for (size_t d = 0; d < sizeof types / sizeof types[0]; d++)
            for (int nans = 0; nans < 2; nans++)
                for (int largest = 0; largest < 2; largest++)
                    for (int dim = 0; dim < (shapes[h].ndim ? shapes[h].ndim : 1); dim++) {
                        int64_t n = shapes[h].ndim ? shapes[h].shape[dim] : 1;
                        const int64_t ks[] = {n ? 1 : 0, n < 17 ? n : 17, n};
                        for (int i = 0; i < 3; i++) {
                            s_case c = s_one(types[d], &shapes[h]);
                            c.nans = nans;
                            s_set_ints(&c, 4, (int64_t[]){ks[i], dim, largest, 1});
                            cr_expect(s_check_op(cuda, "topk", &c, true, 1), "topk k=%lld of %s along %d",
                                      (long long)ks[i], dt_dtype_name(types[d]), dim);
                        }
                    }
    static const float special[] = {0.0f, -0.0f, 1.0f, NAN, 1.0f, -INFINITY, INFINITY, NAN, -0.0f, 2.0f, 1.0f, -1.0f};
    for (int largest = 0; largest < 2; largest++)
        for (int64_t k = 1; k <= 12; k += 5) {
            s_case c = s_shapes(1, (dt_dtype[]){DT_FLOAT32}, (int[]){1}, (const int64_t[][DT_MAX_DIMS]){{12}});
            c.data[0] = special;
            s_set_ints(&c, 4, (int64_t[]){k, 0, largest, 1});
            cr_expect(s_check_op(cuda, "topk", &c, true, 1), "topk of zeros, infinities and NaNs, k=%lld", (long long)k);
        }
}

/* ---- attention ----------------------------------------------------------------------------------
 * The CPU computes the scores by a product, the softmax over each whole row, then a second product;
 * the CUDA kernel visits the keys in tiles with an online softmax: float32 results agree to
 * rounding (sums of E products, a softmax over S keys), 16-bit ones to one rounding of theirs. */

static double s_attention_slack(dt_dtype t) { return t == DT_FLOAT32 ? 32 : 2; }

/* q, k, v of dtype t and shapes q, k, v; ints [is_causal, enable_gqa, has_scale]; mask: its dtype
 * and shape (mask_nd 0: none); row0: ctx[0], the piece's first query row */
static void s_check_sdpa(const op_backend *cuda, const char *what, dt_dtype t, int nd, const int64_t *q,
                         const int64_t *k, const int64_t *v, bool causal, bool gqa, double scale, dt_dtype mask_t,
                         int mask_nd, const int64_t *mask, int64_t row0)
{
    int64_t sh[4][DT_MAX_DIMS] = {{0}};
    memcpy(sh[0], q, (size_t)nd * sizeof *q);
    memcpy(sh[1], k, (size_t)nd * sizeof *k);
    memcpy(sh[2], v, (size_t)nd * sizeof *v);
    if (mask_nd)
        memcpy(sh[3], mask, (size_t)mask_nd * sizeof *mask);
    s_case c = s_shapes(mask_nd ? 4 : 3, (dt_dtype[]){t, t, t, mask_t}, (int[]){nd, nd, nd, mask_nd},
                        (const int64_t(*)[DT_MAX_DIMS])sh);
    s_set_ints(&c, 3, (int64_t[]){causal, gqa, scale != 0});
    c.attrs.nfloats = scale != 0;
    c.attrs.floats[0] = scale;
    c.nctx = 1;
    c.ctx[0] = row0;
    cr_expect(s_check_op(cuda, "scaled_dot_product_attention", &c, false, s_attention_slack(t)), "%s", what);
}

Test(cuda_ops, scaled_dot_product_attention)
{
    const op_backend *cuda = s_cuda();
    const dt_dtype floats[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16};
    for (int d = 0; d < 3; d++) {
        dt_dtype t = floats[d];
        /* decode: one query row against 300 keys (three tiles) */
        s_check_sdpa(cuda, "decode", t, 4, (int64_t[]){2, 4, 1, 64}, (int64_t[]){2, 4, 300, 64},
                     (int64_t[]){2, 4, 300, 64}, false, false, 0, DT_BOOL, 0, NULL, 0);
        /* grouped-query heads, values narrower than keys */
        s_check_sdpa(cuda, "decode, GQA", t, 4, (int64_t[]){2, 8, 1, 64}, (int64_t[]){2, 2, 300, 64},
                     (int64_t[]){2, 2, 300, 32}, false, true, 0, DT_BOOL, 0, NULL, 0);
        /* prefill of a piece whose first row is 150 of the whole, causal; then one whose rows reach
         * past the keys */
        s_check_sdpa(cuda, "prefill, causal, row0 150", t, 4, (int64_t[]){1, 4, 5, 16}, (int64_t[]){1, 4, 200, 16},
                     (int64_t[]){1, 4, 200, 16}, true, false, 0, DT_BOOL, 0, NULL, 150);
        s_check_sdpa(cuda, "prefill, causal, row0 197", t, 4, (int64_t[]){1, 2, 5, 16}, (int64_t[]){1, 2, 200, 16},
                     (int64_t[]){1, 2, 200, 24}, true, false, 0, DT_BOOL, 0, NULL, 197);
        s_check_sdpa(cuda, "prefill, causal, GQA", t, 4, (int64_t[]){1, 4, 130, 16}, (int64_t[]){1, 2, 130, 16},
                     (int64_t[]){1, 2, 130, 16}, true, true, 0, DT_BOOL, 0, NULL, 0);
        /* masks broadcast onto (B, H, L, S): a bool one over batch and heads, one with few keys (a row
         * sees none of them now and then: zeros), float ones over batch, heads or rows */
        s_check_sdpa(cuda, "bool mask (L, S)", t, 4, (int64_t[]){2, 3, 4, 16}, (int64_t[]){2, 3, 9, 16},
                     (int64_t[]){2, 3, 9, 16}, false, false, 0, DT_BOOL, 2, (int64_t[]){4, 9}, 0);
        s_check_sdpa(cuda, "bool mask, 3 keys", t, 4, (int64_t[]){2, 3, 8, 16}, (int64_t[]){2, 3, 3, 16},
                     (int64_t[]){2, 3, 3, 16}, false, false, 0, DT_BOOL, 4, (int64_t[]){2, 1, 8, 3}, 0);
        s_check_sdpa(cuda, "float mask (1, H, 1, S)", t, 4, (int64_t[]){2, 3, 4, 16}, (int64_t[]){2, 3, 140, 16},
                     (int64_t[]){2, 3, 140, 16}, false, false, 0, t, 4, (int64_t[]){1, 3, 1, 140}, 0);
        s_check_sdpa(cuda, "float32 mask (B, 1, L, S), GQA", t, 4, (int64_t[]){2, 4, 3, 16},
                     (int64_t[]){2, 2, 7, 16}, (int64_t[]){2, 2, 7, 16}, false, true, 0, DT_FLOAT32, 4,
                     (int64_t[]){2, 1, 3, 7}, 0);
        s_check_sdpa(cuda, "a scale", t, 4, (int64_t[]){1, 2, 3, 16}, (int64_t[]){1, 2, 5, 16},
                     (int64_t[]){1, 2, 5, 16}, false, false, 0.3, DT_BOOL, 0, NULL, 0);
        s_check_sdpa(cuda, "3-d, no heads", t, 3, (int64_t[]){2, 5, 16}, (int64_t[]){2, 7, 16},
                     (int64_t[]){2, 7, 8}, true, false, 0, DT_BOOL, 0, NULL, 2);
        s_check_sdpa(cuda, "2-d", t, 2, (int64_t[]){5, 16}, (int64_t[]){7, 16}, (int64_t[]){7, 8}, false, false, 0,
                     DT_BOOL, 0, NULL, 0);
        /* empty pieces: no query rows, no keys (zeros), empty heads (scores of 0: the mean of v) */
        s_check_sdpa(cuda, "no query rows", t, 4, (int64_t[]){2, 3, 0, 16}, (int64_t[]){2, 3, 5, 16},
                     (int64_t[]){2, 3, 5, 16}, false, false, 0, DT_BOOL, 0, NULL, 0);
        s_check_sdpa(cuda, "no keys", t, 4, (int64_t[]){2, 3, 4, 16}, (int64_t[]){2, 3, 0, 16},
                     (int64_t[]){2, 3, 0, 16}, false, false, 0, DT_BOOL, 0, NULL, 0);
        s_check_sdpa(cuda, "E = 0", t, 4, (int64_t[]){2, 3, 4, 0}, (int64_t[]){2, 3, 5, 0}, (int64_t[]){2, 3, 5, 8},
                     false, false, 0, DT_BOOL, 0, NULL, 0);
    }
}

/* Heads whose row and values do not fit in a block's shared memory are refused by name. */
Test(cuda_ops, attention_refuses_heads_too_wide)
{
    const op_backend *cuda = s_cuda();
    const op_def *def = op_find("scaled_dot_product_attention");
    op_attrs attrs = {.nints = 3};
    const int64_t E = 40000;
    op_kernel k = {.def = def, .attrs = &attrs, .nin = 3, .nout = 1, .nctx = 1};
    for (int i = 0; i < 3; i++) {
        k.in[i] = (op_local){DT_FLOAT32, 4, {1, 1, i ? 2 : 1, E}, NULL};
        k.in[i].data = cuda->alloc((size_t)(i ? 2 : 1) * E * sizeof(float));
    }
    k.out[0] = (op_local){DT_FLOAT32, 4, {1, 1, 1, E}, cuda->alloc((size_t)E * sizeof(float))};
    const char *why = cuda->run(def, &k);
    cr_expect(why && strstr(why, "shared memory") && strstr(why, "40000"), "%s", why ? why : "(none)");
    for (int i = 0; i < 3; i++)
        cuda->free(k.in[i].data, 0);
    cuda->free(k.out[0].data, 0);
}

/* positions of query rows and key slots for attention_block: zig-zag-like orders, -1 for empty
 * slots and for a query row that sees nothing under the causal mask */
static int64_t s_q_pos[2 * 6], s_k_pos[2 * 200];

static void s_positions(void)
{
    static const int64_t rows[] = {100, 3, 250, -1, 40, 7};
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < 6; i++)
            s_q_pos[b * 6 + i] = rows[i] + b;
        for (int j = 0; j < 200; j++)
            s_k_pos[b * 200 + j] = j % 13 == 5 ? -1 : (j * 7 + b * 3) % 260;
    }
}

/* log-sum-exps of partial results, -inf (nothing seen) here and there */
static float *s_lse_values(int64_t n)
{
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = i % 5 == 2 ? -INFINITY : (float)(6 * s_uniform() - 3);
    return v;
}

Test(cuda_ops, attention_block_and_merge)
{
    const op_backend *cuda = s_cuda();
    const dt_dtype floats[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16};
    s_positions();
    float *lse_acc = s_lse_values(2 * 4 * 6);
    const struct {
        int64_t Hq, H, L, S, D, Dv, q_batch, k_batch;
    } shapes[] = {
        {4, 4, 6, 200, 32, 32, 2, 2}, /* two tiles of keys, positions per batch row */
        {4, 2, 6, 200, 16, 24, 1, 2}, /* grouped-query heads, one set of query positions */
        {4, 2, 1, 200, 16, 16, 2, 1}, /* decode */
        {4, 4, 6, 0, 16, 16, 2, 2},   /* an empty block: nothing seen */
        {4, 4, 0, 200, 16, 16, 2, 2}, /* no query rows */
    };
    for (int d = 0; d < 3; d++)
        for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++)
            for (int causal = 0; causal < 2; causal++)
                for (int acc = 0; acc < 2; acc++) {
                    dt_dtype t = floats[d], f = DT_FLOAT32, i64 = DT_INT64;
                    int64_t Hq = shapes[h].Hq, H = shapes[h].H, L = shapes[h].L, S = shapes[h].S;
                    int64_t D = shapes[h].D, Dv = shapes[h].Dv;
                    s_case c = s_shapes(acc ? 7 : 5, (dt_dtype[]){t, t, t, i64, i64, f, f},
                                        (int[]){4, 4, 4, 2, 2, 4, 3},
                                        (const int64_t[][DT_MAX_DIMS]){{2, Hq, L, D},
                                                                       {2, H, S, D},
                                                                       {2, H, S, Dv},
                                                                       {shapes[h].q_batch, L},
                                                                       {shapes[h].k_batch, S},
                                                                       {2, Hq, L, Dv},
                                                                       {2, Hq, L}});
                    /* batch row 0's positions serve as the single row of positions (batch 1) */
                    static const int64_t decode_pos[2] = {120, 30};
                    c.data[3] = L == 6 ? s_q_pos : decode_pos;
                    c.data[4] = s_k_pos;
                    c.data[6] = lse_acc;
                    s_set_ints(&c, 1, (int64_t[]){causal});
                    c.attrs.nfloats = 1;
                    c.attrs.floats[0] = 1.0 / sqrt((double)D);
                    cr_expect(s_check_op(cuda, "attention_block", &c, false, 32),
                              "attention_block of %s, shape %zu, causal %d, accumulators %d", dt_dtype_name(t), h,
                              causal, acc);
                }
    /* three partial results merged in order */
    for (int64_t L = 0; L <= 5; L += 5) {
        float *lse = s_lse_values(3 * 2 * 4 * L);
        s_case c = s_shapes(2, (dt_dtype[]){DT_FLOAT32, DT_FLOAT32}, (int[]){4, 3},
                            (const int64_t[][DT_MAX_DIMS]){{6, 4, L, 16}, {6, 4, L}});
        c.data[1] = lse;
        s_set_ints(&c, 1, (int64_t[]){3});
        cr_expect(s_check_op(cuda, "attention_merge", &c, false, 4), "attention_merge, L %lld", (long long)L);
        free(lse);
    }
    free(lse_acc);
}

/* ---- the other slots ------------------------------------------------------------------------- */

/* ---- image ops ----------------------------------------------------------------------------------- */

/* conv2d of input x (N, C, H, W) and weight w (O, C / groups, kH, kW), with a bias or not, in each
 * float dtype; ints [stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, dilation_h,
 * dilation_w, groups]. The sums have C / groups * kH * kW terms, added in cuBLAS's order. */
static void s_check_conv(const op_backend *cuda, const int64_t *x, const int64_t *w, const int64_t *ints)
{
    const dt_dtype floats[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16};
    for (int d = 0; d < 3; d++)
        for (int bias = 0; bias < 2; bias++) {
            dt_dtype t[3] = {floats[d], floats[d], floats[d]};
            int64_t sh[3][DT_MAX_DIMS] = {{x[0], x[1], x[2], x[3]}, {w[0], w[1], w[2], w[3]}, {w[0]}};
            s_case c = s_shapes(2 + bias, t, (int[]){4, 4, 1}, sh);
            s_set_ints(&c, 9, ints);
            double slack = floats[d] == DT_FLOAT32 ? s_sum_slack(DT_FLOAT32, w[1] * w[2] * w[3]) : 1;
            cr_expect(s_check_op(cuda, "conv2d", &c, false, slack), "conv2d of %s, bias %d, groups %lld",
                      dt_dtype_name(floats[d]), bias, (long long)ints[8]);
        }
}

Test(cuda_ops, conv2d)
{
    const op_backend *cuda = s_cuda();
    /* 3x3, padding 1 on each side */
    s_check_conv(cuda, (const int64_t[]){2, 4, 7, 6}, (const int64_t[]){6, 4, 3, 3},
                 (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1});
    /* stride 2 x 1, uneven padding, dilation 2, two groups */
    s_check_conv(cuda, (const int64_t[]){3, 4, 9, 8}, (const int64_t[]){6, 2, 3, 2},
                 (const int64_t[]){2, 1, 2, 0, 1, 3, 2, 2, 2});
    /* 1x1 of stride 1: the image is the product's operand; and a patch embedding (stride = kernel) */
    s_check_conv(cuda, (const int64_t[]){2, 8, 5, 5}, (const int64_t[]){3, 8, 1, 1},
                 (const int64_t[]){1, 1, 0, 0, 0, 0, 1, 1, 1});
    s_check_conv(cuda, (const int64_t[]){1, 3, 8, 8}, (const int64_t[]){16, 3, 2, 2},
                 (const int64_t[]){2, 2, 0, 0, 0, 0, 1, 1, 1});
    /* depthwise (groups = C), and an empty batch */
    s_check_conv(cuda, (const int64_t[]){2, 6, 6, 6}, (const int64_t[]){6, 1, 3, 3},
                 (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 6});
    s_check_conv(cuda, (const int64_t[]){0, 4, 5, 5}, (const int64_t[]){2, 4, 3, 3},
                 (const int64_t[]){1, 1, 0, 0, 0, 0, 1, 1, 1});
}

Test(cuda_ops, group_norm)
{
    const op_backend *cuda = s_cuda();
    const dt_dtype floats[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16};
    const struct {
        int ndim;
        int64_t shape[4];
        int64_t groups;
    } shapes[] = {{4, {2, 8, 5, 7}, 4}, {4, {1, 6, 33, 40}, 3}, {3, {3, 4, 10}, 4}, {2, {5, 6}, 2},
                  {4, {0, 4, 2, 2}, 2}};
    for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++)
        for (int d = 0; d < 3; d++)
            for (int flags = 0; flags < 4; flags++) {
                int64_t C = shapes[h].shape[1];
                dt_dtype t[3] = {floats[d], DT_FLOAT32, floats[(d + 1) % 3]};
                int64_t sh[3][DT_MAX_DIMS] = {{0}, {C}, {C}};
                memcpy(sh[0], shapes[h].shape, sizeof shapes[h].shape);
                if (flags == 2)
                    t[1] = t[2]; /* the bias alone comes second */
                s_case c = s_shapes(1 + __builtin_popcount((unsigned)flags), t, (int[]){shapes[h].ndim, 1, 1}, sh);
                s_set_ints(&c, 2, (const int64_t[]){shapes[h].groups, flags});
                c.attrs.nfloats = 1;
                c.attrs.floats[0] = 1e-5;
                cr_expect(s_check_op(cuda, "group_norm", &c, false, floats[d] == DT_FLOAT32 ? 8 : 1),
                          "group_norm of %s, shape %zu, flags %d", dt_dtype_name(floats[d]), h, flags);
            }
}

Test(cuda_ops, interpolate)
{
    const op_backend *cuda = s_cuda();
    const dt_dtype floats[] = {DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16};
    for (int d = 0; d < 3; d++)
        for (int mode = 0; mode < 3; mode++)
            for (int align = 0; align < (mode == 1 ? 2 : 1); align++) {
                /* 2-D: by output size, up and down; by scale factor */
                s_case c = s_shapes(1, &floats[d], (int[]){4}, (const int64_t[][DT_MAX_DIMS]){{2, 3, 5, 7}});
                s_set_ints(&c, 4, (const int64_t[]){mode, align, 11, 4});
                c.attrs.nfloats = 2;
                cr_expect(s_check_op(cuda, "interpolate", &c, true, 1), "interpolate mode %d align %d", mode, align);
                s_set_ints(&c, 4, (const int64_t[]){mode, align, 10, 17});
                c.attrs.floats[0] = 2.0;
                c.attrs.floats[1] = 2.5;
                cr_expect(s_check_op(cuda, "interpolate", &c, true, 1), "by scale factors, mode %d", mode);
                /* 1-D */
                c = s_shapes(1, &floats[d], (int[]){3}, (const int64_t[][DT_MAX_DIMS]){{2, 3, 9}});
                s_set_ints(&c, 3, (const int64_t[]){mode, align, 20});
                c.attrs.nfloats = 1;
                cr_expect(s_check_op(cuda, "interpolate", &c, true, 1), "1-D, mode %d", mode);
            }
}

Test(cuda_ops, pad)
{
    const op_backend *cuda = s_cuda();
    for (int d = 0; d < S_NDTYPES; d++)
        for (int mode = 0; mode < 3; mode++) {
            s_case c = s_shapes(1, &s_dtypes[d], (int[]){4}, (const int64_t[][DT_MAX_DIMS]){{2, 3, 5, 6}});
            /* the last dim by (2, 3), the one before by (1, 4): reflect needs pads below the size */
            s_set_ints(&c, 5, (const int64_t[]){mode, 2, 3, 1, 4});
            c.attrs.nfloats = mode == 0;
            c.attrs.floats[0] = 1.5;
            cr_expect(s_check_op(cuda, "pad", &c, true, 1), "pad of %s, mode %d", dt_dtype_name(s_dtypes[d]), mode);
            /* negative pads crop */
            s_set_ints(&c, 5, (const int64_t[]){mode, -2, 1, 0, -3});
            cr_expect(s_check_op(cuda, "pad", &c, true, 1), "a crop, mode %d", mode);
        }
    /* a constant pad of a 3-D input over three dims, and an empty input */
    s_case c = s_shapes(1, (dt_dtype[]){DT_FLOAT32}, (int[]){3}, (const int64_t[][DT_MAX_DIMS]){{2, 3, 4}});
    s_set_ints(&c, 7, (const int64_t[]){0, 1, 1, 0, 2, 3, 0});
    c.attrs.nfloats = 1;
    c.attrs.floats[0] = -7.0;
    cr_expect(s_check_op(cuda, "pad", &c, true, 1));
    c = s_shapes(1, (dt_dtype[]){DT_FLOAT32}, (int[]){2}, (const int64_t[][DT_MAX_DIMS]){{0, 4}});
    s_set_ints(&c, 3, (const int64_t[]){0, 1, 1});
    c.attrs.nfloats = 1;
    cr_expect(s_check_op(cuda, "pad", &c, true, 1), "an empty input");
}

Test(cuda_slots, fill_arange_random)
{
    const op_backend *cuda = s_cuda(), *cpu = op_backend_find("cpu");
    const int64_t n = 1000;
    const dt_scalar values[] = {S_FLT(1.0 / 3.0), S_INT(-7), S_FLT(1e10), S_FLT(NAN), S_INT(1)};
    for (int d = 0; d < S_NDTYPES; d++) {
        dt_dtype t = s_dtypes[d];
        size_t bytes = (size_t)n * dt_dtype_size(t);
        void *want = malloc(bytes), *dev = cuda->alloc(bytes);
        for (int v = 0; v < 5; v++) {
            if (!dt_dtype_is_float(t) && !values[v].is_int)
                continue;
            cpu->fill(want, t, n, values[v]);
            cr_assert_null(cuda->fill(dev, t, n, values[v]));
            void *got = s_download(cuda, dev, bytes);
            cr_expect(memcmp(want, got, bytes) == 0, "fill of %s, value %d", dt_dtype_name(t), v);
            free(got);
        }
        if (t != DT_BOOL) {
            cpu->arange(want, t, n, 17, S_FLT(-0.1), S_FLT(0.3));
            cr_assert_null(cuda->arange(dev, t, n, 17, S_FLT(-0.1), S_FLT(0.3)));
            void *got = s_download(cuda, dev, bytes);
            cr_expect(memcmp(want, got, bytes) == 0, "arange of %s", dt_dtype_name(t));
            free(got);
        }
        if (dt_dtype_is_float(t)) {
            /* a block at an offset of a larger tensor: the same numbers as the CPU's, bit for bit
             * for uniform ones; normal ones go through CUDA's double log and cos, within an ulp */
            const int64_t shape[] = {10, 100}, offset[] = {3, 7}, global[] = {40, 300};
            for (int normal = 0; normal < 2; normal++) {
                cpu->random(want, t, 2, shape, offset, global, 1234, 5, normal);
                cr_assert_null(cuda->random(dev, t, 2, shape, offset, global, 1234, 5, normal));
                void *got = s_download(cuda, dev, bytes);
                if (normal)
                    s_expect_close("randn", t, want, got, n, false, t == DT_FLOAT32 ? 2e-7 : t == DT_FLOAT16 ? 1e-3 : 8e-3,
                                   1e-7);
                else
                    cr_expect(memcmp(want, got, bytes) == 0, "rand of %s", dt_dtype_name(t));
                free(got);
            }
        }
        free(want);
        cuda->free(dev, bytes);
    }
}

Test(cuda_slots, combine_and_scale_div)
{
    const op_backend *cuda = s_cuda(), *cpu = op_backend_find("cpu");
    const int64_t n = 777;
    for (int d = 0; d < S_NDTYPES; d++)
        for (int op = DT_REDUCE_SUM; op <= DT_REDUCE_MIN; op++) {
            dt_dtype t = s_dtypes[d];
            size_t bytes = (size_t)n * dt_dtype_size(t);
            void *acc = s_random_host(t, n), *src = s_random_host(t, n);
            void *dacc = s_upload(cuda, acc, bytes), *dsrc = s_upload(cuda, src, bytes);
            /* out of place, operands swapped: dst = src (op) acc */
            void *out = malloc(bytes), *dout = cuda->alloc(bytes);
            cr_assert(out && dout);
            cpu->combine(out, src, acc, t, n, (dt_reduce_op)op);
            cr_assert_null(cuda->combine(dout, dsrc, dacc, t, n, (dt_reduce_op)op));
            void *got_out = s_download(cuda, dout, bytes);
            cr_expect(memcmp(out, got_out, bytes) == 0, "combine %d out of place, %s", op, dt_dtype_name(t));
            free(got_out);
            free(out);
            cuda->free(dout, bytes);
            /* in place: acc = acc (op) src */
            cpu->combine(acc, acc, src, t, n, (dt_reduce_op)op);
            cr_assert_null(cuda->combine(dacc, dacc, dsrc, t, n, (dt_reduce_op)op));
            cpu->scale_div(acc, t, n, 3);
            cr_assert_null(cuda->scale_div(dacc, t, n, 3));
            void *got = s_download(cuda, dacc, bytes);
            cr_expect(memcmp(acc, got, bytes) == 0, "reduce %d then divide, %s", op, dt_dtype_name(t));
            free(got);
            free(acc);
            free(src);
            cuda->free(dacc, bytes);
            cuda->free(dsrc, bytes);
        }
}

/* A strided region (a 3x5 block of a 6x8 layout, every second column of it) through each copy slot. */
Test(cuda_slots, strided_copies)
{
    const op_backend *cuda = s_cuda();
    const size_t elems[] = {1, 2, 4, 8, 3};
    for (size_t e = 0; e < sizeof elems / sizeof elems[0]; e++) {
        size_t elem = elems[e];
        size_t bytes = 6 * 8 * elem;
        unsigned char *host = malloc(bytes), *back = calloc(1, bytes), *want = calloc(1, bytes);
        for (size_t i = 0; i < bytes; i++)
            host[i] = (unsigned char)(i * 37 + 11);
        const int64_t shape[] = {3, 5};
        const int64_t dense[] = {(int64_t)(5 * elem), (int64_t)elem};
        const int64_t src[] = {(int64_t)(8 * elem), (int64_t)elem}; /* rows of the 6x8 layout */
        const int64_t dst[] = {(int64_t)(16 * elem), (int64_t)(2 * elem)}; /* every other row and column */
        const char *at = (const char *)host + (1 * 8 + 2) * elem;
        /* host strided -> device strided -> device strided -> host dense */
        void *d1 = cuda->alloc(bytes), *d2 = cuda->alloc(bytes);
        cr_assert_null(cuda->to_device(d1, dst, at, src, 2, shape, elem));
        cr_assert_null(cuda->copy_region(d2, dense, d1, dst, 2, shape, elem));
        cr_assert_null(cuda->synchronize());
        cr_assert_null(cuda->to_host(back, dense, d2, dense, 2, shape, elem));
        cpu_copy_block(want, dense, at, src, 2, shape, elem);
        cr_expect(memcmp(back, want, 15 * elem) == 0, "elements of %zu bytes", elem);
        /* and back out into a strided host layout */
        memset(back, 0, bytes);
        memset(want, 0, bytes);
        cr_assert_null(cuda->to_host(back, dst, d1, dst, 2, shape, elem));
        cpu_copy_block(want, dst, at, src, 2, shape, elem);
        cr_expect(memcmp(back, want, bytes) == 0, "to a strided host layout, %zu bytes", elem);
        cuda->free(d1, bytes);
        cuda->free(d2, bytes);
        free(host);
        free(back);
        free(want);
    }
}

/* ---- through the runtime: a cuda mesh ---------------------------------------------------------- */

static void s_mesh_ops(dt_workers mode)
{
    cr_assert_eq(dt_init(&(dt_config){mode, getenv("DTORCH_WORKER_PATH")}), 0, "%s", dt_last_error());
    dt_mesh *m = dt_mesh_new("cuda", 1, (int64_t[]){2}, (int64_t[]){0, 1}, NULL);
    cr_assert_not_null(m, "%s", dt_last_error());
    dt_placement shard = {.kind = DT_SHARD, .dim = 0};
    dt_tensor *x = dt_arange(m, S_INT(0), S_INT(10), S_INT(1), DT_FLOAT32, &shard);
    cr_assert_not_null(x, "%s", dt_last_error());
    dt_tensor *y = NULL;
    dt_op_attrs attrs = {.has_scalar = true, .scalar = S_FLT(0.5)};
    cr_assert_eq(dt_op("mul", 1, &x, &attrs, 1, &y), 1, "%s", dt_last_error());
    dt_future *f = dt_tensor_fetch(y);
    cr_assert_not_null(f, "%s", dt_last_error());
    const char *no_device = s_no_device();
    int rc = dt_future_wait(f, 30);
    if (no_device) {
        /* the workers serve, and every op fails with the reason */
        cr_expect_neq(rc, 0);
        const char *why = dt_future_error(f);
        cr_expect(why && strstr(why, "no CUDA device"), "%s", why ? why : "(no error)");
        printf("test_cuda: without a device, ops on a cuda mesh fail with: %s\n", why ? why : "(none)");
    } else {
        cr_assert_eq(rc, 0, "%s", dt_future_error(f));
        const float *v = dt_future_data(f, 0);
        for (int i = 0; i < 10; i++)
            cr_expect_eq(v[i], 0.5f * (float)i);
    }
    dt_future_release(&f);
    dt_tensor_release(&y);
    dt_tensor_release(&x);
    dt_mesh_release(&m);
    cr_expect_eq(dt_shutdown(), 0);
}

Test(cuda_mesh, thread_workers, .timeout = 180) { s_mesh_ops(DT_WORKERS_THREAD); }
Test(cuda_mesh, process_workers, .timeout = 180) { s_mesh_ops(DT_WORKERS_PROCESS); }
