/* Every registered op through dt_op, on a 2-device mesh and on a 2x2 mesh (thread workers; a
 * smaller set with process workers), with inputs sharded, replicated, unevenly sharded (down to
 * empty shards) and Partial (built with dt_from_local). Whatever placements the op picks and
 * whatever it redistributes first, the fetched value must equal a reference computed here by
 * loops: exactly for integer and data-movement ops, within a small tolerance for float math.
 * Then the error paths: bad arguments fail at the call naming the op, a kernel failure surfaces
 * on fetch and leaves the runtime working, strict mode refuses a needed redistribute.
 *
 * CI runs this suite under AddressSanitizer with leak detection: every handle is released. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtorch.h"
#include "op_registry.h" /* the scenarios and the coverage check walk the registry */

#define S_INT(v) ((dt_scalar){.is_int = true, .i = (v)})
#define S_FLT(v) ((dt_scalar){.is_int = false, .f = (v)})
#define S_MAXN 1024 /* elements of the largest tensor a scenario builds */
#define S_TOL 1e-5  /* relative tolerance of float math */

/* ---- environment ------------------------------------------------------------------------------ */

typedef struct {
    dt_mesh *mesh;
    int mn;     /* mesh ndim */
    bool small; /* fewer layouts (process workers) */
} s_env;

static void s_init(dt_workers mode)
{
    const char *path = getenv("DTORCH_WORKER_PATH");
    cr_assert(mode == DT_WORKERS_THREAD || path, "process workers need DTORCH_WORKER_PATH (meson test sets it)");
    cr_assert_eq(dt_init(&(dt_config){mode, path}), 0, "init: %s", dt_last_error());
}

static s_env s_env_new(int mesh_ndim, bool small)
{
    s_env e = {.mn = mesh_ndim, .small = small};
    if (mesh_ndim == 1)
        e.mesh = dt_mesh_new("cpu", 1, (int64_t[]){2}, (int64_t[]){1, 0}, NULL);
    else
        e.mesh = dt_mesh_new("cpu", 2, (int64_t[]){2, 2}, (int64_t[]){0, 1, 2, 3}, NULL);
    cr_assert_not_null(e.mesh, "mesh: %s", dt_last_error());
    return e;
}

/* One scenario as three Criterion tests: 2 devices and 2x2 with threads, 2 devices with
 * processes on fewer layouts. Each ends with a clean shutdown. */
#define S_SCENARIO(suite, name)                                                                                        \
    static void s_case_##name(const s_env *e);                                                                         \
    static void s_run_##name(dt_workers mode, int mesh_ndim, bool small)                                               \
    {                                                                                                                  \
        s_init(mode);                                                                                                  \
        s_env e = s_env_new(mesh_ndim, small);                                                                         \
        s_case_##name(&e);                                                                                             \
        dt_mesh_release(&e.mesh);                                                                                      \
        cr_expect_eq(dt_shutdown(), 0);                                                                                \
    }                                                                                                                  \
    Test(suite, name##_mesh2_thread, .timeout = 180) { s_run_##name(DT_WORKERS_THREAD, 1, false); }                     \
    Test(suite, name##_mesh2x2_thread, .timeout = 180) { s_run_##name(DT_WORKERS_THREAD, 2, false); }                   \
    Test(suite, name##_mesh2_process, .timeout = 180) { s_run_##name(DT_WORKERS_PROCESS, 1, true); }                    \
    static void s_case_##name(const s_env *e)

/* Input layouts for a tensor of nd dims; pop >= 0 adds a Partial(pop) one. */
typedef struct {
    dt_placement pl[2];
} s_layout;

static int s_layouts(const s_env *e, int nd, int pop, s_layout *out)
{
    dt_placement R = dt_replicate(), S0 = dt_shard(0), SL = dt_shard(nd > 0 ? nd - 1 : 0);
    dt_placement P = dt_partial(pop >= 0 ? (dt_reduce_op)pop : DT_REDUCE_SUM);
    int n = 0;
    if (e->mn == 1) {
        if (nd > 0)
            out[n++] = (s_layout){{S0}};
        if (nd > 1 && !e->small)
            out[n++] = (s_layout){{SL}};
        if (!e->small || nd == 0)
            out[n++] = (s_layout){{R}};
        if (pop >= 0)
            out[n++] = (s_layout){{P}};
    } else {
        if (nd > 0) {
            out[n++] = (s_layout){{S0, SL}};
            out[n++] = (s_layout){{R, S0}};
            out[n++] = (s_layout){{S0, S0}};
            out[n++] = (s_layout){{SL, R}};
        } else {
            out[n++] = (s_layout){{R, R}};
        }
        if (pop >= 0)
            out[n++] = nd > 0 ? (s_layout){{P, S0}} : (s_layout){{R, P}};
        if (pop >= 0 && nd > 0)
            out[n++] = (s_layout){{SL, P}};
    }
    return n;
}

static void s_layout_name(const s_env *e, const dt_placement *pl, char *buf, size_t size)
{
    size_t used = 0;
    for (int m = 0; m < e->mn && used < size; m++) {
        const dt_placement p = pl[m];
        used += (size_t)snprintf(buf + used, size - used, "%s%c%d", m ? "," : "",
                                 p.kind == DT_SHARD ? 'S' : p.kind == DT_REPLICATE ? 'R' : 'P',
                                 p.kind == DT_SHARD ? p.dim : p.kind == DT_PARTIAL ? p.reduce_op : 0);
    }
}

/* ---- values ---------------------------------------------------------------------------------- */

static int64_t s_numel(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= shape[d];
    return n;
}

static void s_unravel(int nd, const int64_t *shape, int64_t i, int64_t *idx)
{
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
}

static int64_t s_ravel(int nd, const int64_t *shape, const int64_t *idx)
{
    int64_t o = 0;
    for (int d = 0; d < nd; d++)
        o = o * shape[d] + idx[d];
    return o;
}

static double s_half(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h >> 15 ? -v : v;
}

static double s_get(dt_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case DT_FLOAT32: return ((const float *)p)[i];
    case DT_FLOAT16: return s_half(((const uint16_t *)p)[i]);
    case DT_BFLOAT16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    case DT_INT32: return ((const int32_t *)p)[i];
    case DT_INT64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static void s_put(dt_dtype dt, void *p, int64_t i, double v)
{
    switch (dt) {
    case DT_FLOAT32: ((float *)p)[i] = (float)v; break;
    case DT_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: cr_assert_fail("s_put: no inputs of dtype %d (make them with the 'to' op)", dt);
    }
}

static void *s_pack(dt_dtype dt, const double *v, int64_t n)
{
    void *buf = malloc((size_t)(n ? n : 1) * dt_dtype_size(dt));
    cr_assert_not_null(buf);
    for (int64_t i = 0; i < n; i++)
        s_put(dt, buf, i, v[i]);
    return buf;
}

/* How a device at coordinate c of a mesh dim of size n splits x (element g) for Partial(op):
 * the pieces reduce to x exactly (small multiples of 1/8 stay exact in float32). */
static double s_split(dt_reduce_op op, int64_t c, int64_t n, double x, int64_t g, dt_dtype dt)
{
    bool fl = dt == DT_FLOAT32;
    double r = fl ? (double)(g % 5 - 2) * 0.25 : (double)(g % 5 - 2);
    switch (op) {
    case DT_REDUCE_SUM: return c == 0 ? x - (double)(n - 1) * r : r;
    case DT_REDUCE_AVG: return c == 0 ? x + (double)(n - 1) * r : x - r;
    case DT_REDUCE_MAX: return c == 0 ? x : x - 1 - (double)(g % 3);
    default: return c == 0 ? x : x + 1 + (double)(g % 3);
    }
}

/* A tensor of the global value v laid out as pl: dt_distribute, or dt_from_local with pieces that
 * reduce to v where pl has a Partial. */
static dt_tensor *s_make(const s_env *e, dt_dtype dt, int nd, const int64_t *shape, const double *v,
                         const dt_placement *pl)
{
    int64_t n = s_numel(nd, shape);
    bool partial = false;
    dt_placement base[DT_MAX_DIMS];
    for (int m = 0; m < e->mn; m++) {
        partial = partial || pl[m].kind == DT_PARTIAL;
        base[m] = pl[m].kind == DT_PARTIAL ? dt_replicate() : pl[m];
    }
    if (!partial) {
        void *buf = s_pack(dt, v, n);
        dt_tensor *t = dt_distribute(e->mesh, buf, nd, shape, NULL, dt, pl);
        free(buf);
        cr_assert_not_null(t, "distribute: %s", dt_last_error());
        return t;
    }
    dt_tensor *blocks = dt_empty(e->mesh, nd, shape, dt, base);
    cr_assert_not_null(blocks, "empty: %s", dt_last_error());
    int64_t size = dt_mesh_size(e->mesh);
    const int64_t *mshape = dt_mesh_shape(e->mesh);
    void *pieces[4];
    int64_t lshapes[4 * DT_MAX_DIMS + 1];
    for (int64_t d = 0; d < size; d++) {
        int64_t off[DT_MAX_DIMS], coord[DT_MAX_DIMS], lidx[DT_MAX_DIMS], gidx[DT_MAX_DIMS];
        int64_t *ls = &lshapes[d * nd];
        cr_assert_eq(dt_tensor_local_block(blocks, d, ls, off), 0, "%s", dt_last_error());
        s_unravel(e->mn, mshape, d, coord);
        int64_t ln = s_numel(nd, ls);
        pieces[d] = malloc((size_t)(ln ? ln : 1) * dt_dtype_size(dt));
        cr_assert_not_null(pieces[d]);
        for (int64_t j = 0; j < ln; j++) {
            s_unravel(nd, ls, j, lidx);
            for (int k = 0; k < nd; k++)
                gidx[k] = lidx[k] + off[k];
            int64_t g = s_ravel(nd, shape, gidx);
            double x = dt == DT_FLOAT32 ? v[g] : trunc(v[g]); /* the value the tensor holds */
            for (int m = 0; m < e->mn; m++)
                if (pl[m].kind == DT_PARTIAL)
                    x = s_split((dt_reduce_op)pl[m].reduce_op, coord[m], mshape[m], x, g, dt);
            s_put(dt, pieces[d], j, x);
        }
    }
    dt_tensor *t = dt_from_local(e->mesh, (const void *const *)pieces, nd, lshapes, dt, pl, shape);
    for (int64_t d = 0; d < size; d++)
        free(pieces[d]);
    dt_tensor_release(&blocks);
    cr_assert_not_null(t, "from_local: %s", dt_last_error());
    return t;
}

static bool s_close(double got, double want, double tol)
{
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs(got - want) <= tol * (1.0 + fabs(want));
}

/* Fetches t and checks dtype, shape and values (tol 0: exact). Does not release t. */
static void s_check(dt_tensor *t, dt_dtype dt, int nd, const int64_t *shape, const double *want, double tol,
                    const char *what)
{
    cr_assert_not_null(t, "%s: no tensor: %s", what, dt_last_error());
    dt_future *f = dt_tensor_fetch(t);
    cr_assert_not_null(f, "%s: fetch: %s", what, dt_last_error());
    if (dt_future_wait(f, -1) != 0) {
        cr_expect_fail("%s: fetch failed: %s", what, dt_future_error(f));
        dt_future_release(&f);
        return;
    }
    bool ok = dt_future_dtype(f) == dt && dt_future_ndim(f) == nd;
    cr_expect(ok, "%s: got dtype %d ndim %d, want dtype %d ndim %d", what, dt_future_dtype(f), dt_future_ndim(f), dt,
              nd);
    for (int d = 0; ok && d < nd; d++)
        if (dt_future_shape(f, 0)[d] != shape[d]) {
            cr_expect_fail("%s: dim %d has size %lld, want %lld", what, d, (long long)dt_future_shape(f, 0)[d],
                           (long long)shape[d]);
            ok = false;
        }
    const void *data = dt_future_data(f, 0);
    int64_t n = s_numel(nd, shape);
    for (int64_t i = 0; ok && i < n; i++) {
        double got = s_get(dt, data, i);
        if (!(tol == 0 ? (got == want[i] || (isnan(got) && isnan(want[i]))) : s_close(got, want[i], tol))) {
            cr_expect_fail("%s: element %lld is %.9g, want %.9g", what, (long long)i, got, want[i]);
            ok = false;
        }
    }
    dt_future_release(&f);
}

/* Runs an op of one output. */
static dt_tensor *s_op(const char *name, int n, dt_tensor *const *in, const dt_op_attrs *a, const char *what)
{
    dt_tensor *out[2] = {NULL, NULL};
    int rc = dt_op(name, n, in, a, 2, out);
    cr_assert_eq(rc, 1, "%s: %s returned %d: %s", what, name, rc, dt_last_error());
    return out[0];
}

/* Runs op, checks its one output against want, releases it. */
static void s_expect(const char *name, int n, dt_tensor *const *in, const dt_op_attrs *a, dt_dtype dt, int nd,
                     const int64_t *shape, const double *want, double tol, const char *what)
{
    char full[256];
    snprintf(full, sizeof full, "%s %s", name, what);
    dt_tensor *t = s_op(name, n, in, a, full);
    s_check(t, dt, nd, shape, want, tol, full);
    dt_tensor_release(&t);
}

/* Runs a two-output op (values, indices) and checks both. */
static void s_expect2(const char *name, dt_tensor *in, const dt_op_attrs *a, dt_dtype dt, int nd, const int64_t *shape,
                      const double *values, const double *indices, double tol, const char *what)
{
    char full[256];
    snprintf(full, sizeof full, "%s %s", name, what);
    dt_tensor *out[2] = {NULL, NULL};
    int rc = dt_op(name, 1, &in, a, 2, out);
    cr_assert_eq(rc, 2, "%s: returned %d: %s", full, rc, dt_last_error());
    s_check(out[0], dt, nd, shape, values, tol, full);
    s_check(out[1], DT_INT64, nd, shape, indices, 0, full);
    dt_tensor_release(&out[0]);
    dt_tensor_release(&out[1]);
}

/* Distinct values: small multiples of 1/8 (exact in float32), or integers. */
static void s_fill(double *v, int64_t n, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: v[i] = (double)((i * 37) % 61 - 30) / 8.0; break;  /* mixed signs, distinct for n <= 61 */
        case 1: v[i] = (double)((i * 7) % 23 + 1) / 8.0; break;    /* positive */
        case 2: v[i] = (double)((i * 37) % 61 - 30); break;        /* integers, distinct */
        case 3: v[i] = (double)((i * 5) % 13 - 6) / 4.0 + 0.125; break; /* nonzero */
        case 4: v[i] = (double)(i % 3 == 0); break;               /* booleans */
        default: v[i] = (double)((i % 2 ? 1 : -1) * ((i * 5) % 3 + 1)); break; /* small nonzero integers */
        }
    }
}

static double s_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static double s_softplus(double x, double beta, double threshold)
{
    return x * beta > threshold ? x : log1p(exp(x * beta)) / beta;
}

/* a ** b as the kernel computes it (integers: exact for small values) */
/* Rounding to the nearest integer, halves to the even one (torch's round). */
static double s_round_half_even(double x)
{
    double r = floor(x), d = x - r;
    if (d != 0.5)
        return d < 0.5 ? r : r + 1;
    return fmod(r, 2) == 0 ? r : r + 1;
}

static double s_pow(double a, double b, bool integer)
{
    if (!integer)
        return pow(a, b);
    double r = 1;
    for (int i = 0; i < (int)b; i++)
        r *= a;
    return r;
}

/* ---- every op's test entry ---------------------------------------------------------------------
 * coverage::every_registered_op walks the registry and fails for an op without an entry here.
 * An elementwise op's entry is its reference: the scenarios pointwise::unary and pointwise::binary
 * run every registered op that has one, on every layout. Other ops name the scenario that drives
 * them. */

/* Unary elementwise ops: the value of one element x (in double; p: the float attributes given),
 * the inputs it is defined for, and the float attributes to call it with. */
#define S_UNARY_TESTS(X)                                                                                               \
    X(neg, -x, ANY, 0, 0, 0)                                                                                           \
    X(abs, fabs(x), ANY, 0, 0, 0)                                                                                      \
    X(exp, exp(x), ANY, 0, 0, 0)                                                                                       \
    X(log, log(x), POSITIVE, 0, 0, 0)                                                                                  \
    X(sqrt, sqrt(x), POSITIVE, 0, 0, 0)                                                                                \
    X(rsqrt, 1.0 / sqrt(x), POSITIVE, 0, 0, 0)                                                                         \
    X(sin, sin(x), ANY, 0, 0, 0)                                                                                       \
    X(cos, cos(x), ANY, 0, 0, 0)                                                                                       \
    X(tanh, tanh(x), ANY, 0, 0, 0)                                                                                     \
    X(sigmoid, s_sigmoid(x), ANY, 0, 0, 0)                                                                             \
    X(relu, x > 0 ? x : 0, ANY, 0, 0, 0)                                                                               \
    X(silu, x * s_sigmoid(x), ANY, 0, 0, 0)                                                                            \
    X(gelu, 0.5 * x * (1.0 + erf(x / sqrt(2.0))), ANY, 0, 0, 0)                                                        \
    X(gelu_tanh, 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))), ANY, 0, 0, 0)                  \
    X(reciprocal, 1.0 / x, POSITIVE, 0, 0, 0)                                                                          \
    X(logical_not, x == 0, ANY, 0, 0, 0)                                                                               \
    X(erf, erf(x), ANY, 0, 0, 0)                                                                                       \
    X(softplus, s_softplus(x, p[0], p[1]), ANY, 2, 2.0, 1.0)                                                           \
    X(floor, floor(x), ANY, 0, 0, 0)                                                                                   \
    X(ceil, ceil(x), ANY, 0, 0, 0)                                                                                     \
    X(round, s_round_half_even(x), ANY, 0, 0, 0)                                                                       \
    X(trunc, trunc(x), ANY, 0, 0, 0)

/* Binary elementwise ops: the value of a op b (integer: both operands are integers). */
#define S_BINARY_TESTS(X)                                                                                              \
    X(add, a + b)                                                                                                      \
    X(sub, a - b)                                                                                                      \
    X(mul, a * b)                                                                                                      \
    X(div, a / b)                                                                                                      \
    X(pow, s_pow(a, b, integer))                                                                                       \
    X(floor_divide, floor(a / b))                                                                                      \
    X(remainder, a - b * floor(a / b))                                                                                 \
    X(maximum, a > b ? a : b)                                                                                          \
    X(minimum, a < b ? a : b)                                                                                          \
    X(eq, a == b)                                                                                                      \
    X(ne, a != b)                                                                                                      \
    X(lt, a < b)                                                                                                       \
    X(le, a <= b)                                                                                                      \
    X(gt, a > b)                                                                                                       \
    X(ge, a >= b)                                                                                                      \
    X(logical_and, a != 0 && b != 0)                                                                                   \
    X(logical_or, a != 0 || b != 0)

/* Every other op, and the scenario (suite::name) that drives it. */
#define S_SCENARIO_TESTS(X)                                                                                            \
    X(to, "pointwise::to")                                                                                             \
    X(where, "pointwise::select_and_clamp")                                                                            \
    X(masked_fill, "pointwise::select_and_clamp")                                                                      \
    X(clamp, "pointwise::select_and_clamp")                                                                            \
    X(sum, "reduce::list_reductions")                                                                                            \
    X(mean, "reduce::list_reductions")                                                                                           \
    X(amax, "reduce::list_reductions")                                                                                           \
    X(amin, "reduce::list_reductions")                                                                                           \
    X(max, "reduce::list_reductions")                                                                                            \
    X(min, "reduce::list_reductions")                                                                                            \
    X(max_dim, "reduce::along_a_dim")                                                                                        \
    X(min_dim, "reduce::along_a_dim")                                                                                        \
    X(argmax, "reduce::along_a_dim")                                                                                         \
    X(argmin, "reduce::along_a_dim")                                                                                         \
    X(softmax, "reduce::along_a_dim")                                                                                        \
    X(log_softmax, "reduce::along_a_dim")                                                                                    \
    X(cumsum, "reduce::along_a_dim")                                                                                         \
    X(topk, "reduce::along_a_dim")                                                                                           \
    X(layer_norm, "reduce::norms")                                                                                     \
    X(rms_norm, "reduce::norms")                                                                                       \
    X(reshape, "view::reshapes")                                                                         \
    X(flatten, "view::reshapes")                                                                         \
    X(unsqueeze, "view::reshapes")                                                                       \
    X(squeeze, "view::reshapes")                                                                         \
    X(permute, "view::reshapes")                                                                         \
    X(expand, "view::reshapes")                                                                          \
    X(cat, "view::cat_and_stack")                                                                                          \
    X(stack, "view::cat_and_stack")                                                                                        \
    X(slice, "view::slicing")                                                                                          \
    X(narrow, "view::slicing")                                                                                         \
    X(select, "view::slicing")                                                                                         \
    X(index_select, "view::slicing")                                                                                   \
    X(triu, "view::triangles")                                                                                         \
    X(tril, "view::triangles")                                                                                         \
    X(matmul, "matmul::products")                                                                                      \
    X(mm, "matmul::products")                                                                                          \
    X(bmm, "matmul::products")                                                                                         \
    X(linear, "matmul::products")                                                                                        \
    X(embedding, "matmul::embedding")                                                                                  \
    X(scaled_dot_product_attention, "matmul::attention")                                                   \
    X(rope, "rope::rotate_half_by_position")                                                                  \
    X(slice_assign_, "write::slice_assign_in_place")                                                               \
    X(shard_assign_, "write::shard_assign_by_pieces")                                                              \
    X(index_copy_, "write::index_copy_at_positions")                                                               \
    X(attention_block, "attention::blocks_and_merge")                                                              \
    X(attention_merge, "attention::blocks_and_merge")                                                              \
    X(conv2d, "image::conv2d")                                                                                         \
    X(group_norm, "image::group_norm")                                                                                 \
    X(interpolate, "image::interpolate")                                                                               \
    X(pad, "image::pad")                                                                                               \
    X(linear_int8, "quant::products_against_double")                                                                   \
    X(linear_int4, "quant::products_against_double")

#define S_ANY false
#define S_POSITIVE true
#define S_UNARY_REF(op, expr, ...)                                                                                     \
    static double s_ref_##op(double x, const double *p) { return (expr); }
#define S_BINARY_REF(op, expr)                                                                                         \
    static double s_ref_##op(double a, double b, bool integer) { return (expr); }
S_UNARY_TESTS(S_UNARY_REF)
S_BINARY_TESTS(S_BINARY_REF)

typedef struct {
    const char *op;
    double (*unary)(double x, const double *p);         /* a unary elementwise op's reference */
    bool positive;                                      /* unary: defined for positive inputs only */
    int nfloats;                                        /* unary: the float attributes to call it with */
    double floats[2];
    double (*binary)(double a, double b, bool integer); /* a binary elementwise op's reference */
    const char *scenario;                               /* any other op: the scenario that drives it */
} s_test;

#define S_UNARY_ENTRY(name, expr, domain, nf, f0, f1)                                                                  \
    {.op = #name, .unary = s_ref_##name, .positive = S_##domain, .nfloats = nf, .floats = {f0, f1}},
#define S_BINARY_ENTRY(name, expr) {.op = #name, .binary = s_ref_##name},
#define S_SCENARIO_ENTRY(name, where) {.op = #name, .scenario = where},
static const s_test s_tests[] = {
    S_UNARY_TESTS(S_UNARY_ENTRY) S_BINARY_TESTS(S_BINARY_ENTRY) S_SCENARIO_TESTS(S_SCENARIO_ENTRY)};

#define S_NTESTS (sizeof s_tests / sizeof s_tests[0])

/* The test entry of op name, or NULL. */
static const s_test *s_test_of(const char *name)
{
    for (size_t i = 0; i < S_NTESTS; i++)
        if (!strcmp(s_tests[i].op, name))
            return &s_tests[i];
    return NULL;
}

/* ---- pointwise -------------------------------------------------------------------------------- */

S_SCENARIO(pointwise, unary)
{
    /* (3,5): uneven on 2 devices; (1,4): an empty shard; (4,2) even */
    static const int64_t shapes[3][2] = {{3, 5}, {1, 4}, {4, 2}};
    double mixed[S_MAXN], pos[S_MAXN], want[S_MAXN];
    s_layout lay[8];
    for (int s = 0; s < (e->small ? 1 : 3); s++) {
        const int64_t *shape = shapes[s];
        int64_t n = s_numel(2, shape);
        s_fill(mixed, n, 0);
        s_fill(pos, n, 1);
        int nl = s_layouts(e, 2, DT_REDUCE_SUM, lay);
        for (int l = 0; l < nl; l++) {
            char what[96], ln[32];
            s_layout_name(e, lay[l].pl, ln, sizeof ln);
            snprintf(what, sizeof what, "shape (%lld,%lld) [%s]", (long long)shape[0], (long long)shape[1], ln);
            dt_tensor *tm = s_make(e, DT_FLOAT32, 2, shape, mixed, lay[l].pl);
            dt_tensor *tp = s_make(e, DT_FLOAT32, 2, shape, pos, lay[l].pl);
            for (int o = 0; o < op_count(); o++) {
                const char *name = op_nth(o)->name;
                const s_test *t = s_test_of(name);
                if (!t || !t->unary)
                    continue;
                for (int64_t i = 0; i < n; i++)
                    want[i] = t->unary(t->positive ? pos[i] : mixed[i], t->floats);
                bool logical = !strcmp(name, "logical_not");
                dt_op_attrs attrs = {.nfloats = t->nfloats, .floats = {t->floats[0], t->floats[1]}};
                s_expect(name, 1, t->positive ? &tp : &tm, &attrs, logical ? DT_BOOL : DT_FLOAT32, 2, shape, want,
                         logical ? 0 : S_TOL, what);
            }
            /* float attributes left out take the row's defaults (softplus: beta=1, threshold=20) */
            for (int64_t i = 0; i < n; i++)
                want[i] = s_softplus(mixed[i], 1.0, 20.0);
            s_expect("softplus", 1, &tm, NULL, DT_FLOAT32, 2, shape, want, S_TOL, what);
            dt_tensor_release(&tm);
            dt_tensor_release(&tp);
        }
    }
    dt_tensor *x = s_make(e, DT_FLOAT32, 2, shapes[0], mixed, lay[0].pl), *bad[1] = {NULL};
    cr_expect_eq(dt_op("softplus", 1, &x, &(dt_op_attrs){.nfloats = 1, .floats = {2.0}}, 1, bad), DT_EINVAL,
                 "softplus with one of its two float attributes");
    cr_expect(strstr(dt_last_error(), "beta=1, threshold=20") != NULL, "%s", dt_last_error());
    dt_tensor_release(&x);

    /* integer and bool inputs: neg/abs/relu stay int64, the floating ops give float32 */
    int64_t shape[2] = {3, 5};
    double iv[15], bv[15];
    s_fill(iv, 15, 2);
    s_fill(bv, 15, 4);
    int nl = s_layouts(e, 2, DT_REDUCE_SUM, lay);
    for (int l = 0; l < nl; l++) {
        dt_tensor *ti = s_make(e, DT_INT64, 2, shape, iv, lay[l].pl);
        static const char *const int_ops[] = {"neg", "abs", "relu", "exp", "sin", "logical_not"};
        for (int o = 0; o < 6; o++) {
            for (int i = 0; i < 15; i++)
                want[i] = s_test_of(int_ops[o])->unary(iv[i], NULL);
            dt_dtype dt = o < 3 ? DT_INT64 : o < 5 ? DT_FLOAT32 : DT_BOOL;
            s_expect(int_ops[o], 1, &ti, NULL, dt, 2, shape, want, dt == DT_FLOAT32 ? S_TOL : 0, "int64");
        }
        dt_tensor_release(&ti);
    }
    dt_tensor *tb = s_make(e, DT_BOOL, 2, shape, bv, lay[0].pl);
    for (int i = 0; i < 15; i++)
        want[i] = !bv[i];
    s_expect("logical_not", 1, &tb, NULL, DT_BOOL, 2, shape, want, 0, "bool");
    bad[0] = NULL;
    cr_expect_eq(dt_op("neg", 1, &tb, NULL, 1, bad), DT_ETYPE, "neg of bool");
    cr_expect_null(bad[0]);
    dt_tensor_release(&tb);
}

S_SCENARIO(pointwise, to)
{
    int64_t shape[2] = {3, 5};
    double fv[15], iv[15], bv[15], want[15];
    s_fill(fv, 15, 0);
    s_fill(iv, 15, 2);
    s_fill(bv, 15, 4);
    s_layout lay[8];
    int nl = s_layouts(e, 2, DT_REDUCE_SUM, lay);
    for (int l = 0; l < nl; l++) {
        bool partial = lay[l].pl[0].kind == DT_PARTIAL || (e->mn > 1 && lay[l].pl[1].kind == DT_PARTIAL);
        dt_tensor *tf = s_make(e, DT_FLOAT32, 2, shape, fv, lay[l].pl);
        dt_tensor *ti = s_make(e, DT_INT64, 2, shape, iv, lay[l].pl);
        /* float32 -> float16 / bfloat16 -> float32: the values are exact in both */
        dt_tensor *h = s_op("to", 1, &tf, &(dt_op_attrs){.nints = 1, .ints = {DT_FLOAT16}}, "to f16");
        s_check(h, DT_FLOAT16, 2, shape, fv, 0, "to float16");
        dt_tensor *back = s_op("to", 1, &h, &(dt_op_attrs){.nints = 1, .ints = {DT_FLOAT32}}, "to f32");
        s_check(back, DT_FLOAT32, 2, shape, fv, 0, "float16 back to float32");
        dt_tensor_release(&back);
        dt_tensor_release(&h);
        s_expect("to", 1, &tf, &(dt_op_attrs){.nints = 1, .ints = {DT_BFLOAT16}}, DT_BFLOAT16, 2, shape, fv, 0,
                 "to bfloat16");
        s_expect("to", 1, &ti, &(dt_op_attrs){.nints = 1, .ints = {DT_FLOAT32}}, DT_FLOAT32, 2, shape, iv, 0,
                 "int64 to float32");
        s_expect("to", 1, &ti, &(dt_op_attrs){.nints = 1, .ints = {DT_INT32}}, DT_INT32, 2, shape, iv, 0,
                 "int64 to int32");
        if (!partial) {
            /* truncation and bool are not linear: a Partial input would pass through (as in
             * torch) and convert each contribution on its own, so only whole values here */
            for (int i = 0; i < 15; i++)
                want[i] = trunc(fv[i]);
            s_expect("to", 1, &tf, &(dt_op_attrs){.nints = 1, .ints = {DT_INT64}}, DT_INT64, 2, shape, want, 0,
                     "float32 to int64");
            for (int i = 0; i < 15; i++)
                want[i] = fv[i] != 0;
            s_expect("to", 1, &tf, &(dt_op_attrs){.nints = 1, .ints = {DT_BOOL}}, DT_BOOL, 2, shape, want, 0,
                     "float32 to bool");
            dt_tensor *tb = s_make(e, DT_BOOL, 2, shape, bv, lay[l].pl);
            s_expect("to", 1, &tb, &(dt_op_attrs){.nints = 1, .ints = {DT_INT32}}, DT_INT32, 2, shape, bv, 0,
                     "bool to int32");
            dt_tensor_release(&tb);
        }
        dt_tensor_release(&tf);
        dt_tensor_release(&ti);
    }
}

/* The output dtype of a binary op whose operands promote to t. */
static dt_dtype s_binary_dtype(const char *name, dt_dtype t)
{
    if (!strcmp(name, "eq") || !strcmp(name, "ne") || !strcmp(name, "lt") || !strcmp(name, "le") ||
        !strcmp(name, "gt") || !strcmp(name, "ge") || !strncmp(name, "logical", 7))
        return DT_BOOL;
    if (!strcmp(name, "div"))
        return DT_FLOAT32;
    return t;
}

/* Checks every binary op on a (shape a) and b (shape b, broadcast) laid out as given. */
static void s_binary_case(const s_env *e, dt_dtype ta, int and_, const int64_t *sa, const double *va, dt_dtype tb,
                          int nb, const int64_t *sb, const double *vb, const dt_placement *pa, const dt_placement *pb,
                          const char *what)
{
    dt_tensor *in[2] = {s_make(e, ta, and_, sa, va, pa), s_make(e, tb, nb, sb, vb, pb)};
    dt_dtype t = ta == DT_FLOAT32 || tb == DT_FLOAT32 ? DT_FLOAT32 : ta == DT_INT64 || tb == DT_INT64 ? DT_INT64 : ta;
    bool integer = t != DT_FLOAT32;
    int64_t n = s_numel(and_, sa), idx[DT_MAX_DIMS], bidx[DT_MAX_DIMS];
    double want[S_MAXN];
    for (int o = 0; o < op_count(); o++) {
        const char *name = op_nth(o)->name;
        const s_test *test = s_test_of(name);
        if (!test || !test->binary)
            continue;
        bool ipow = integer && !strcmp(name, "pow");
        for (int64_t i = 0; i < n; i++) {
            s_unravel(and_, sa, i, idx);
            for (int d = 0; d < nb; d++)
                bidx[d] = sb[d] == 1 ? 0 : idx[d + and_ - nb];
            double b = vb[s_ravel(nb, sb, bidx)];
            want[i] = test->binary(va[i], ipow ? fabs(b) : b, integer);
        }
        if (ipow) { /* integer powers need exponents >= 0 */
            dt_tensor *absb = s_op("abs", 1, &in[1], NULL, "abs");
            dt_tensor *pin[2] = {in[0], absb};
            s_expect(name, 2, pin, NULL, t, and_, sa, want, 0, what);
            dt_tensor_release(&absb);
            continue;
        }
        dt_dtype out = s_binary_dtype(name, t);
        s_expect(name, 2, in, NULL, out, and_, sa, want, out == DT_FLOAT32 ? S_TOL : 0, what);
    }
    dt_tensor_release(&in[0]);
    dt_tensor_release(&in[1]);
}

S_SCENARIO(pointwise, binary)
{
    int64_t sa[2] = {3, 4};
    double fa[12], fb[12], ia[12], ib[12];
    s_fill(fa, 12, 0);
    s_fill(fb, 12, 3);
    s_fill(ia, 12, 2);
    s_fill(ib, 12, 5);
    s_layout lay[8];
    int nl = s_layouts(e, 2, DT_REDUCE_SUM, lay);
    char what[96], l1[32], l2[32];
    /* same shapes, layouts paired with themselves and with the next one */
    for (int l = 0; l < nl; l++)
        for (int k = 0; k < (e->small ? 1 : 2); k++) {
            const dt_placement *pa = lay[l].pl, *pb = lay[(l + k) % nl].pl;
            s_layout_name(e, pa, l1, sizeof l1);
            s_layout_name(e, pb, l2, sizeof l2);
            snprintf(what, sizeof what, "float32 [%s] with [%s]", l1, l2);
            s_binary_case(e, DT_FLOAT32, 2, sa, fa, DT_FLOAT32, 2, sa, fb, pa, pb, what);
            snprintf(what, sizeof what, "int64 [%s] with [%s]", l1, l2);
            s_binary_case(e, DT_INT64, 2, sa, ia, DT_INT64, 2, sa, ib, pa, pb, what);
        }
    /* broadcasting and promotion: (3,4) with (4,) and (3,1); int32 with int64, int64 with float32 */
    int64_t row[1] = {4}, col[2] = {3, 1};
    s_layout lrow[8], lcol[8];
    int nrow = s_layouts(e, 1, DT_REDUCE_SUM, lrow), ncol = s_layouts(e, 2, -1, lcol);
    for (int l = 0; l < nl; l++) {
        s_layout_name(e, lay[l].pl, l1, sizeof l1);
        snprintf(what, sizeof what, "float32 [%s] with a row", l1);
        s_binary_case(e, DT_FLOAT32, 2, sa, fa, DT_FLOAT32, 1, row, fb, lay[l].pl, lrow[l % nrow].pl, what);
        snprintf(what, sizeof what, "int32 [%s] with an int64 column", l1);
        s_binary_case(e, DT_INT32, 2, sa, ia, DT_INT64, 2, col, ib, lay[l].pl, lcol[l % ncol].pl, what);
        snprintf(what, sizeof what, "int64 [%s] with float32", l1);
        s_binary_case(e, DT_INT64, 2, sa, ia, DT_FLOAT32, 2, sa, fb, lay[l].pl, lay[(l + 1) % nl].pl, what);
    }
    /* bool operands: logical ops and comparisons */
    double ba[12], bb[12], want[12];
    s_fill(ba, 12, 4);
    for (int i = 0; i < 12; i++)
        bb[i] = i % 2;
    int lb = e->small ? 0 : 1; /* bools are never Partial: lay[0] and lay[1] are not */
    dt_tensor *b2[2] = {s_make(e, DT_BOOL, 2, sa, ba, lay[0].pl), s_make(e, DT_BOOL, 2, sa, bb, lay[lb].pl)};
    static const char *const bool_ops[] = {"logical_and", "logical_or", "eq", "ne", "lt"};
    for (int o = 0; o < 5; o++) {
        for (int i = 0; i < 12; i++)
            want[i] = s_test_of(bool_ops[o])->binary(ba[i], bb[i], true);
        s_expect(bool_ops[o], 2, b2, NULL, DT_BOOL, 2, sa, want, 0, "bool");
    }
    dt_tensor *bad[1] = {NULL};
    cr_expect_eq(dt_op("sub", 2, b2, NULL, 1, bad), DT_ETYPE, "sub of two bools");
    cr_expect_null(bad[0]);
    dt_tensor_release(&b2[0]);
    dt_tensor_release(&b2[1]);

    /* a Python number on either side: x op 3, 3 op x (ints[0] = 1), x op 0.5 */
    for (int l = 0; l < nl; l++) {
        dt_tensor *ti = s_make(e, DT_INT64, 2, sa, ia, lay[l].pl);
        dt_tensor *tf = s_make(e, DT_FLOAT32, 2, sa, fa, lay[l].pl);
        for (int o = 0; o < op_count(); o++) {
            const char *name = op_nth(o)->name;
            const s_test *test = s_test_of(name);
            if (!test || !test->binary)
                continue;
            bool is_pow = !strcmp(name, "pow");
            for (int right = 0; right < 2; right++) {
                if (is_pow && !right)
                    continue; /* 3 ** x with negative x: not an integer */
                dt_op_attrs a = {.nints = 1, .ints = {!right}, .has_scalar = true, .scalar = S_INT(3)};
                for (int i = 0; i < 12; i++)
                    want[i] = right ? test->binary(ia[i], 3, true) : test->binary(3, ia[i], true);
                dt_dtype out = s_binary_dtype(name, DT_INT64);
                snprintf(what, sizeof what, "int64 %s 3", right ? "op" : "reversed");
                s_expect(name, 1, &ti, &a, out, 2, sa, want, out == DT_FLOAT32 ? S_TOL : 0, what);
                /* a float number promotes an integer tensor to float32 */
                a.scalar = S_FLT(0.5);
                for (int i = 0; i < 12; i++)
                    want[i] = right ? test->binary(fa[i], 0.5, false) : test->binary(0.5, fa[i], false);
                out = s_binary_dtype(name, DT_FLOAT32);
                snprintf(what, sizeof what, "float32 %s 0.5", right ? "op" : "reversed");
                s_expect(name, 1, &tf, &a, out, 2, sa, want, out == DT_FLOAT32 ? S_TOL : 0, what);
            }
        }
        for (int i = 0; i < 12; i++)
            want[i] = ia[i] + 0.5;
        s_expect("add", 1, &ti, &(dt_op_attrs){.has_scalar = true, .scalar = S_FLT(0.5)}, DT_FLOAT32, 2, sa, want, 0,
                 "int64 + 0.5");
        dt_tensor_release(&ti);
        dt_tensor_release(&tf);
    }
}

S_SCENARIO(pointwise, select_and_clamp)
{
    int64_t sa[2] = {3, 4}, row[1] = {4};
    double x[12], y[12], c[12], m[4] = {1, 0, 0, 1}, want[12];
    s_fill(x, 12, 0);
    s_fill(y, 12, 3);
    s_fill(c, 12, 4);
    s_layout lay[8], lrow[8];
    int nl = s_layouts(e, 2, DT_REDUCE_SUM, lay), nrow = s_layouts(e, 1, -1, lrow);
    for (int l = 0; l < nl; l++) {
        char what[64], ln[32];
        s_layout_name(e, lay[l].pl, ln, sizeof ln);
        snprintf(what, sizeof what, "[%s]", ln);
        const dt_placement *other = lay[(l + 1) % nl].pl;
        /* Partial bools do not exist: the condition takes the next non-Partial layout */
        int lc = l;
        while (lay[lc].pl[0].kind == DT_PARTIAL || (e->mn > 1 && lay[lc].pl[1].kind == DT_PARTIAL))
            lc = (lc + 1) % nl;
        dt_tensor *cond = s_make(e, DT_BOOL, 2, sa, c, lay[lc].pl);
        dt_tensor *tx = s_make(e, DT_FLOAT32, 2, sa, x, lay[l].pl);
        dt_tensor *tyr = s_make(e, DT_FLOAT32, 1, row, y, lrow[l % nrow].pl);
        dt_tensor *tyi = s_make(e, DT_INT64, 2, sa, y, other); /* y as int64: truncated below */
        /* where(cond, x, y row) broadcasts y */
        for (int i = 0; i < 12; i++)
            want[i] = c[i] ? x[i] : y[i % 4];
        s_expect("where", 3, (dt_tensor *[]){cond, tx, tyr}, NULL, DT_FLOAT32, 2, sa, want, 0, what);
        /* where(cond, x, int64 tensor) promotes to float32 */
        for (int i = 0; i < 12; i++)
            want[i] = c[i] ? x[i] : trunc((float)y[i]);
        s_expect("where", 3, (dt_tensor *[]){cond, tx, tyi}, NULL, DT_FLOAT32, 2, sa, want, 0, what);
        /* where(cond, x, 2.5) and where(cond, -1, x) */
        for (int i = 0; i < 12; i++)
            want[i] = c[i] ? x[i] : 2.5;
        s_expect("where", 2, (dt_tensor *[]){cond, tx},
                 &(dt_op_attrs){.nints = 1, .ints = {2}, .has_scalar = true, .scalar = S_FLT(2.5)}, DT_FLOAT32, 2, sa,
                 want, 0, what);
        for (int i = 0; i < 12; i++)
            want[i] = c[i] ? -1 : x[i];
        s_expect("where", 2, (dt_tensor *[]){cond, tx},
                 &(dt_op_attrs){.nints = 1, .ints = {1}, .has_scalar = true, .scalar = S_INT(-1)}, DT_FLOAT32, 2, sa,
                 want, 0, what);
        /* masked_fill(x, mask row, 7) */
        dt_tensor *mask = s_make(e, DT_BOOL, 1, row, m, lrow[(l + 1) % nrow].pl);
        for (int i = 0; i < 12; i++)
            want[i] = m[i % 4] ? 7 : x[i];
        s_expect("masked_fill", 2, (dt_tensor *[]){tx, mask}, &(dt_op_attrs){.has_scalar = true, .scalar = S_INT(7)},
                 DT_FLOAT32, 2, sa, want, 0, what);
        /* clamp: both bounds, min only, max only; integer input with integer and float bounds */
        for (int i = 0; i < 12; i++)
            want[i] = x[i] < -0.5 ? -0.5 : x[i] > 0.75 ? 0.75 : x[i];
        s_expect("clamp", 1, &tx, &(dt_op_attrs){.nints = 2, .ints = {3, 1}, .nfloats = 2, .floats = {-0.5, 0.75}},
                 DT_FLOAT32, 2, sa, want, 0, what);
        for (int i = 0; i < 12; i++)
            want[i] = x[i] < 0.25 ? 0.25 : x[i];
        s_expect("clamp", 1, &tx, &(dt_op_attrs){.nints = 2, .ints = {1, 1}, .nfloats = 2, .floats = {0.25, 0}},
                 DT_FLOAT32, 2, sa, want, 0, what);
        for (int i = 0; i < 12; i++) {
            double v = trunc((float)y[i]);
            want[i] = v > 1 ? 1 : v;
        }
        s_expect("clamp", 1, &tyi, &(dt_op_attrs){.nints = 2, .ints = {2, 0}, .nfloats = 2, .floats = {0, 1}},
                 DT_INT64, 2, sa, want, 0, what);
        for (int i = 0; i < 12; i++) {
            double v = trunc((float)y[i]);
            want[i] = v < -0.5 ? -0.5 : v;
        }
        s_expect("clamp", 1, &tyi, &(dt_op_attrs){.nints = 2, .ints = {1, 1}, .nfloats = 2, .floats = {-0.5, 0}},
                 DT_FLOAT32, 2, sa, want, 0, what);
        /* a lower bound above the upper: the upper everywhere (torch: min(max(x, lo), hi)); integer
         * bounds given exactly in ints[2..3] win over the float ones */
        for (int i = 0; i < 12; i++)
            want[i] = -0.5;
        s_expect("clamp", 1, &tx, &(dt_op_attrs){.nints = 2, .ints = {3, 0}, .nfloats = 2, .floats = {0.75, -0.5}},
                 DT_FLOAT32, 2, sa, want, 0, what);
        for (int i = 0; i < 12; i++)
            want[i] = 2;
        s_expect("clamp", 1, &tyi,
                 &(dt_op_attrs){.nints = 4, .ints = {3, 0, 5, 2}, .nfloats = 2, .floats = {-100, 100}}, DT_INT64, 2,
                 sa, want, 0, what);
        dt_tensor *bad[1] = {NULL};
        cr_expect_eq(dt_op("clamp", 1, &tx, &(dt_op_attrs){.nints = 1, .ints = {0}}, 1, bad), DT_EINVAL);
        cr_expect(strstr(dt_last_error(), "clamp") != NULL, "%s", dt_last_error());
        cr_expect_eq(dt_op("where", 3, (dt_tensor *[]){tx, tx, tx}, NULL, 1, bad), DT_ETYPE);
        cr_expect(strstr(dt_last_error(), "where") != NULL, "%s", dt_last_error());
        cr_expect_null(bad[0]);
        dt_tensor_release(&mask);
        dt_tensor_release(&cond);
        dt_tensor_release(&tx);
        dt_tensor_release(&tyr);
        dt_tensor_release(&tyi);
    }
}

/* ---- reductions ------------------------------------------------------------------------------- */

/* sum/mean/amax/amin over the dims in mask (0: every dim), in double */
static void s_reduce_ref(int op, int nd, const int64_t *shape, uint32_t mask, const double *v, int64_t *nout,
                         double *out)
{
    if (!mask)
        mask = (1u << nd) - 1u;
    int64_t oshape[DT_MAX_DIMS], idx[DT_MAX_DIMS], oidx[DT_MAX_DIMS], count = 1;
    int on = 0;
    for (int d = 0; d < nd; d++) {
        if (!(mask & (1u << d)))
            oshape[on++] = shape[d];
        else
            count *= shape[d];
    }
    *nout = s_numel(on, oshape);
    for (int64_t o = 0; o < *nout; o++)
        out[o] = op == 0 || op == 1 ? 0 : op == 2 ? -INFINITY : INFINITY;
    for (int64_t i = 0; i < s_numel(nd, shape); i++) {
        s_unravel(nd, shape, i, idx);
        int k = 0;
        for (int d = 0; d < nd; d++)
            if (!(mask & (1u << d)))
                oidx[k++] = idx[d];
        double *acc = &out[s_ravel(on, oshape, oidx)];
        *acc = op <= 1 ? *acc + v[i] : op == 2 ? fmax(*acc, v[i]) : fmin(*acc, v[i]);
    }
    if (op == 1)
        for (int64_t o = 0; o < *nout; o++)
            out[o] /= (double)count;
}

/* The output shape of a reduction over mask (keepdim or not). */
static int s_reduced_shape(int nd, const int64_t *shape, uint32_t mask, bool keepdim, int64_t *out)
{
    if (!mask)
        mask = (1u << nd) - 1u;
    int on = 0;
    for (int d = 0; d < nd; d++)
        if (!(mask & (1u << d)))
            out[on++] = shape[d];
        else if (keepdim)
            out[on++] = 1;
    return on;
}

typedef struct {
    const char *name;
    int op;   /* 0 sum, 1 mean, 2 max, 3 min */
    bool keepdim;
    uint32_t mask; /* 0: every dim */
    int nints;
    int64_t ints[6];
} s_red_case;

S_SCENARIO(reduce, list_reductions)
{
    static const s_red_case cases[] = {
        {"sum", 0, false, 0, 2, {0, -1}},
        {"sum", 0, false, 2, 3, {0, -1, 1}},
        {"sum", 0, true, 5, 4, {1, -1, 0, 2}},
        {"sum", 0, false, 0, 0, {0}},
        {"mean", 1, false, 4, 3, {0, -1, -1}},
        {"mean", 1, false, 0, 2, {0, -1}},
        {"mean", 1, true, 3, 4, {1, -1, 1, 0}},
        {"amax", 2, false, 1, 3, {0, -1, 0}},
        {"amax", 2, true, 0, 2, {1, -1}},
        {"amin", 3, false, 6, 4, {0, -1, 1, 2}},
        {"amin", 3, false, 0, 2, {0, -1}},
        {"max", 2, false, 0, 0, {0}},
        {"min", 3, false, 0, 0, {0}},
    };
    /* (3,4,5) uneven on 2 devices; (1,4,3): an empty shard of dim 0 */
    static const int64_t shapes[2][3] = {{3, 4, 5}, {1, 4, 3}};
    double v[60], want[60];
    int64_t oshape[DT_MAX_DIMS], nout;
    s_layout lay[8];
    for (int s = 0; s < (e->small ? 1 : 2); s++) {
        const int64_t *shape = shapes[s];
        s_fill(v, s_numel(3, shape), 0);
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            const s_red_case *rc = &cases[c];
            /* Partial(sum) for sum/mean (passes through), Partial(max|min) for the extremes */
            int pop = rc->op <= 1 ? (c % 2 ? DT_REDUCE_SUM : DT_REDUCE_AVG) : rc->op == 2 ? DT_REDUCE_MAX
                                                                                          : DT_REDUCE_MIN;
            int nl = s_layouts(e, 3, pop, lay);
            s_reduce_ref(rc->op, 3, shape, rc->mask, v, &nout, want);
            int on = s_reduced_shape(3, shape, rc->mask, rc->keepdim, oshape);
            dt_op_attrs a = {.nints = rc->nints};
            memcpy(a.ints, rc->ints, sizeof rc->ints);
            for (int l = 0; l < nl; l++) {
                char what[96], ln[32];
                s_layout_name(e, lay[l].pl, ln, sizeof ln);
                snprintf(what, sizeof what, "case %zu shape %d [%s]", c, s, ln);
                dt_tensor *t = s_make(e, DT_FLOAT32, 3, shape, v, lay[l].pl);
                s_expect(rc->name, 1, &t, &a, DT_FLOAT32, on, oshape, want, S_TOL, what);
                dt_tensor_release(&t);
            }
        }
    }
    /* integer sums are exact and int64; a float input summed with dtype=int64 truncates first */
    const int64_t *shape = shapes[0];
    double iv[60], bv[60];
    s_fill(iv, 60, 2);
    s_fill(bv, 60, 4);
    s_fill(v, 60, 0);
    int nl = s_layouts(e, 3, DT_REDUCE_SUM, lay);
    for (int l = 0; l < nl; l++) {
        bool partial = lay[l].pl[0].kind == DT_PARTIAL || (e->mn > 1 && lay[l].pl[1].kind == DT_PARTIAL);
        dt_tensor *ti = s_make(e, DT_INT64, 3, shape, iv, lay[l].pl);
        dt_tensor *ti32 = s_make(e, DT_INT32, 3, shape, iv, lay[l].pl);
        dt_op_attrs dims12 = {.nints = 4, .ints = {0, -1, 1, 2}};
        s_reduce_ref(0, 3, shape, 6, iv, &nout, want);
        s_expect("sum", 1, &ti, &dims12, DT_INT64, 1, (int64_t[]){3}, want, 0, "int64");
        s_expect("sum", 1, &ti32, &dims12, DT_INT64, 1, (int64_t[]){3}, want, 0, "int32");
        s_reduce_ref(2, 3, shape, 1, iv, &nout, want);
        s_expect("amax", 1, &ti, &(dt_op_attrs){.nints = 3, .ints = {0, -1, 0}}, DT_INT64, 2, (int64_t[]){4, 5}, want,
                 0, "int64");
        s_reduce_ref(3, 3, shape, 0, iv, &nout, want);
        s_expect("min", 1, &ti32, NULL, DT_INT32, 0, NULL, want, 0, "int32");
        if (!partial) {
            dt_tensor *tb = s_make(e, DT_BOOL, 3, shape, bv, lay[l].pl);
            s_reduce_ref(0, 3, shape, 4, bv, &nout, want);
            s_expect("sum", 1, &tb, &(dt_op_attrs){.nints = 3, .ints = {0, -1, 2}}, DT_INT64, 2, (int64_t[]){3, 4},
                     want, 0, "bool counts");
            dt_tensor_release(&tb);
        }
        dt_tensor *tf = s_make(e, DT_FLOAT32, 3, shape, v, lay[l].pl);
        double tv[60];
        for (int i = 0; i < 60; i++)
            tv[i] = trunc(v[i]);
        s_reduce_ref(0, 3, shape, 0, tv, &nout, want);
        if (!partial) /* truncating each contribution is not truncating the sum */
            s_expect("sum", 1, &tf, &(dt_op_attrs){.nints = 2, .ints = {0, DT_INT64}}, DT_INT64, 0, NULL, want, 0,
                     "float32 with dtype=int64");
        dt_tensor *bad[1] = {NULL};
        cr_expect_eq(dt_op("mean", 1, &ti, NULL, 1, bad), DT_ETYPE, "mean of int64");
        cr_expect(strstr(dt_last_error(), "mean") != NULL, "%s", dt_last_error());
        cr_expect_eq(dt_op("sum", 1, &tf, &(dt_op_attrs){.nints = 3, .ints = {0, -1, 3}}, 1, bad), DT_EINDEX);
        cr_expect(strstr(dt_last_error(), "sum") != NULL, "%s", dt_last_error());
        cr_expect_null(bad[0]);
        dt_tensor_release(&tf);
        dt_tensor_release(&ti);
        dt_tensor_release(&ti32);
    }
}

/* (outer, n, inner) of shape along dim */
static void s_split_dims(int nd, const int64_t *shape, int dim, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = *inner = 1;
    *n = shape[dim];
    for (int d = 0; d < dim; d++)
        *outer *= shape[d];
    for (int d = dim + 1; d < nd; d++)
        *inner *= shape[d];
}

S_SCENARIO(reduce, along_a_dim)
{
    static const int64_t shapes[2][3] = {{3, 4, 5}, {1, 4, 3}};
    double v[60], val[60], ind[60];
    s_layout lay[8];
    for (int s = 0; s < (e->small ? 1 : 2); s++) {
        const int64_t *shape = shapes[s];
        int64_t total = s_numel(3, shape);
        s_fill(v, total, 0);
        int nl = s_layouts(e, 3, DT_REDUCE_SUM, lay);
        for (int l = 0; l < nl; l++) {
            char what[96], ln[32];
            s_layout_name(e, lay[l].pl, ln, sizeof ln);
            snprintf(what, sizeof what, "shape %d [%s]", s, ln);
            dt_tensor *t = s_make(e, DT_FLOAT32, 3, shape, v, lay[l].pl);
            for (int dim = 0; dim < 3; dim++) {
                int64_t outer, n, inner, oshape[3];
                s_split_dims(3, shape, dim, &outer, &n, &inner);
                /* max/min along dim (values, indices), argmax/argmin */
                for (int mx = 0; mx < 2; mx++) {
                    for (int64_t o = 0; o < outer; o++)
                        for (int64_t i = 0; i < inner; i++) {
                            int64_t best = 0;
                            for (int64_t j = 1; j < n; j++) {
                                double x = v[(o * n + j) * inner + i], b = v[(o * n + best) * inner + i];
                                if (mx ? x < b : x > b)
                                    best = j;
                            }
                            val[o * inner + i] = v[(o * n + best) * inner + i];
                            ind[o * inner + i] = (double)best;
                        }
                    bool keep = dim == 1;
                    int on = 0;
                    for (int d = 0; d < 3; d++)
                        if (d != dim)
                            oshape[on++] = shape[d];
                        else if (keep)
                            oshape[on++] = 1;
                    s_expect2(mx ? "min_dim" : "max_dim", t,
                              &(dt_op_attrs){.nints = 2, .ints = {dim - (dim == 2 ? 3 : 0), keep}}, DT_FLOAT32, on,
                              oshape, val, ind, 0, what);
                    s_expect(mx ? "argmin" : "argmax", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {keep, dim}},
                             DT_INT64, on, oshape, ind, 0, what);
                }
                /* softmax, log_softmax, cumsum */
                for (int64_t o = 0; o < outer; o++)
                    for (int64_t i = 0; i < inner; i++) {
                        double mxv = -INFINITY, sum = 0, run = 0;
                        for (int64_t j = 0; j < n; j++)
                            mxv = fmax(mxv, v[(o * n + j) * inner + i]);
                        for (int64_t j = 0; j < n; j++)
                            sum += exp(v[(o * n + j) * inner + i] - mxv);
                        for (int64_t j = 0; j < n; j++) {
                            int64_t k = (o * n + j) * inner + i;
                            val[k] = exp(v[k] - mxv) / sum;
                            ind[k] = v[k] - mxv - log(sum);
                        }
                        (void)run;
                    }
                dt_op_attrs along = {.nints = 2, .ints = {dim, -1}};
                s_expect("softmax", 1, &t, &along, DT_FLOAT32, 3, shape, val, S_TOL, what);
                s_expect("log_softmax", 1, &t, &along, DT_FLOAT32, 3, shape, ind, S_TOL, what);
                for (int64_t o = 0; o < outer; o++)
                    for (int64_t i = 0; i < inner; i++) {
                        double run = 0;
                        for (int64_t j = 0; j < n; j++) {
                            int64_t k = (o * n + j) * inner + i;
                            val[k] = run += v[k];
                        }
                    }
                s_expect("cumsum", 1, &t, &along, DT_FLOAT32, 3, shape, val, S_TOL, what);
                /* topk: k = min(2, n), largest and smallest, sorted */
                int64_t k = n < 2 ? n : 2;
                for (int largest = 0; largest < 2; largest++) {
                    for (int64_t o = 0; o < outer; o++)
                        for (int64_t i = 0; i < inner; i++) {
                            bool used[8] = {false};
                            for (int64_t r = 0; r < k; r++) {
                                int64_t best = -1;
                                for (int64_t j = 0; j < n; j++) {
                                    if (used[j])
                                        continue;
                                    double x = v[(o * n + j) * inner + i];
                                    if (best < 0 || (largest ? x > v[(o * n + best) * inner + i]
                                                             : x < v[(o * n + best) * inner + i]))
                                        best = j;
                                }
                                used[best] = true;
                                val[(o * k + r) * inner + i] = v[(o * n + best) * inner + i];
                                ind[(o * k + r) * inner + i] = (double)best;
                            }
                        }
                    memcpy(oshape, shape, sizeof oshape);
                    oshape[dim] = k;
                    s_expect2("topk", t, &(dt_op_attrs){.nints = 4, .ints = {k, dim, largest, 1}}, DT_FLOAT32, 3,
                              oshape, val, ind, 0, what);
                }
            }
            /* argmax/argmin over everything */
            int64_t amax = 0, amin = 0;
            for (int64_t i = 1; i < total; i++) {
                amax = v[i] > v[amax] ? i : amax;
                amin = v[i] < v[amin] ? i : amin;
            }
            s_expect("argmax", 1, &t, &(dt_op_attrs){.nints = 1, .ints = {0}}, DT_INT64, 0, NULL,
                     (double[]){(double)amax}, 0, what);
            s_expect("argmin", 1, &t, &(dt_op_attrs){.nints = 1, .ints = {1}}, DT_INT64, 3, (int64_t[]){1, 1, 1},
                     (double[]){(double)amin}, 0, what);
            dt_tensor_release(&t);
        }
    }
    /* an int64 cumsum stays exact; a Partial(sum) int64 input passes through */
    const int64_t *shape = shapes[0];
    double iv[60];
    s_fill(iv, 60, 2);
    int nl = s_layouts(e, 3, DT_REDUCE_SUM, lay);
    for (int l = 0; l < nl; l++) {
        dt_tensor *ti = s_make(e, DT_INT64, 3, shape, iv, lay[l].pl);
        for (int o = 0; o < 3; o++)
            for (int i = 0; i < 5; i++) {
                double run = 0;
                for (int j = 0; j < 4; j++)
                    val[(o * 4 + j) * 5 + i] = run += iv[(o * 4 + j) * 5 + i];
            }
        s_expect("cumsum", 1, &ti, &(dt_op_attrs){.nints = 2, .ints = {1, -1}}, DT_INT64, 3, shape, val, 0, "int64");
        dt_tensor *bad[2] = {NULL, NULL};
        cr_expect_eq(dt_op("topk", 1, &ti, &(dt_op_attrs){.nints = 4, .ints = {6, -1, 1, 1}}, 2, bad), DT_EINVAL);
        cr_expect(strstr(dt_last_error(), "topk") != NULL, "%s", dt_last_error());
        cr_expect_eq(dt_op("softmax", 1, &ti, &(dt_op_attrs){.nints = 2, .ints = {0, -1}}, 2, bad), DT_ETYPE);
        cr_expect(strstr(dt_last_error(), "softmax") != NULL, "%s", dt_last_error());
        cr_expect(bad[0] == NULL && bad[1] == NULL);
        dt_tensor_release(&ti);
    }
}

/* layer_norm / rms_norm over the trailing nnorm dims of x (rows of length d) */
static void s_norm_ref(bool rms, const double *x, int64_t rows, int64_t d, const double *w, const double *b,
                       double eps, double *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *row = x + r * d;
        double mean = 0, var = 0;
        if (!rms) {
            for (int64_t j = 0; j < d; j++)
                mean += row[j];
            mean /= (double)d;
        }
        for (int64_t j = 0; j < d; j++)
            var += (row[j] - mean) * (row[j] - mean);
        var /= (double)d;
        for (int64_t j = 0; j < d; j++)
            out[r * d + j] = (row[j] - mean) / sqrt(var + eps) * (w ? w[j] : 1) + (b ? b[j] : 0);
    }
}

S_SCENARIO(reduce, norms)
{
    int64_t shape[3] = {3, 4, 5};
    double x[60], w[20], b[20], want[60];
    s_fill(x, 60, 0);
    for (int i = 0; i < 20; i++) {
        w[i] = 0.5 + (double)(i % 4) * 0.25;
        b[i] = (double)(i % 3 - 1) * 0.125;
    }
    s_layout lay[8], lw[8], l2[8];
    int nl = s_layouts(e, 3, DT_REDUCE_SUM, lay), nw = s_layouts(e, 1, -1, lw), n2 = s_layouts(e, 2, -1, l2);
    for (int l = 0; l < nl; l++) {
        char what[96], ln[32];
        s_layout_name(e, lay[l].pl, ln, sizeof ln);
        snprintf(what, sizeof what, "[%s]", ln);
        dt_tensor *t = s_make(e, DT_FLOAT32, 3, shape, x, lay[l].pl);
        dt_tensor *tw = s_make(e, DT_FLOAT32, 1, (int64_t[]){5}, w, lw[l % nw].pl);
        dt_tensor *tb = s_make(e, DT_FLOAT32, 1, (int64_t[]){5}, b, lw[(l + 1) % nw].pl);
        dt_tensor *tw2 = s_make(e, DT_FLOAT32, 2, (int64_t[]){4, 5}, w, l2[l % n2].pl);
        /* layer_norm over the last dim with weight and bias; with bias only; over the last two */
        s_norm_ref(false, x, 12, 5, w, b, 1e-5, want);
        s_expect("layer_norm", 3, (dt_tensor *[]){t, tw, tb},
                 &(dt_op_attrs){.nints = 2, .ints = {3, 5}, .nfloats = 1, .floats = {1e-5}}, DT_FLOAT32, 3, shape,
                 want, 1e-4, what);
        s_norm_ref(false, x, 12, 5, NULL, b, 1e-3, want);
        s_expect("layer_norm", 2, (dt_tensor *[]){t, tb},
                 &(dt_op_attrs){.nints = 2, .ints = {2, 5}, .nfloats = 1, .floats = {1e-3}}, DT_FLOAT32, 3, shape,
                 want, 1e-4, what);
        s_norm_ref(false, x, 3, 20, w, NULL, 1e-5, want);
        s_expect("layer_norm", 2, (dt_tensor *[]){t, tw2},
                 &(dt_op_attrs){.nints = 3, .ints = {1, 4, 5}, .nfloats = 1, .floats = {1e-5}}, DT_FLOAT32, 3, shape,
                 want, 1e-4, what);
        /* rms_norm with weight and torch's default eps; without weight, eps given */
        s_norm_ref(true, x, 12, 5, w, NULL, FLT_EPSILON, want);
        s_expect("rms_norm", 2, (dt_tensor *[]){t, tw}, &(dt_op_attrs){.nints = 2, .ints = {1, 5}}, DT_FLOAT32, 3,
                 shape, want, 1e-4, what);
        s_norm_ref(true, x, 3, 20, NULL, NULL, 0.5, want);
        s_expect("rms_norm", 1, &t, &(dt_op_attrs){.nints = 3, .ints = {0, 4, 5}, .nfloats = 1, .floats = {0.5}},
                 DT_FLOAT32, 3, shape, want, 1e-4, what);
        dt_tensor *bad[1] = {NULL};
        cr_expect_eq(dt_op("layer_norm", 2, (dt_tensor *[]){t, tw},
                           &(dt_op_attrs){.nints = 2, .ints = {1, 4}, .nfloats = 1, .floats = {1e-5}}, 1, bad),
                     DT_EINVAL);
        cr_expect(strstr(dt_last_error(), "layer_norm") != NULL, "%s", dt_last_error());
        cr_expect_null(bad[0]);
        dt_tensor_release(&t);
        dt_tensor_release(&tw);
        dt_tensor_release(&tb);
        dt_tensor_release(&tw2);
    }
}

/* ---- views and data movement ----------------------------------------------------------------- */

/* The value of x (shape, values) permuted by perm. */
static void s_permute_ref(int nd, const int64_t *shape, const double *x, const int64_t *perm, int64_t *oshape,
                          double *out)
{
    int64_t idx[DT_MAX_DIMS], src[DT_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        oshape[d] = shape[perm[d]];
    for (int64_t i = 0; i < s_numel(nd, shape); i++) {
        s_unravel(nd, oshape, i, idx);
        for (int d = 0; d < nd; d++)
            src[perm[d]] = idx[d];
        out[i] = x[s_ravel(nd, shape, src)];
    }
}

S_SCENARIO(view, reshapes)
{
    int64_t shape[3] = {3, 4, 5}, s1[3] = {3, 1, 5};
    double x[60], want[120];
    s_fill(x, 60, 2);
    s_layout lay[8];
    int nl = s_layouts(e, 3, DT_REDUCE_SUM, lay);
    for (int dt = 0; dt < 2; dt++) {
        dt_dtype type = dt ? DT_FLOAT32 : DT_INT64;
        for (int l = 0; l < nl; l++) {
            char what[96], ln[32];
            s_layout_name(e, lay[l].pl, ln, sizeof ln);
            snprintf(what, sizeof what, "%s [%s]", dt_dtype_name(type), ln);
            dt_tensor *t = s_make(e, type, 3, shape, x, lay[l].pl);
            dt_tensor *t1 = s_make(e, type, 3, s1, x, lay[l].pl);
            /* reshape-like ops keep the row-major order */
            s_expect("reshape", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {12, 5}}, type, 2, (int64_t[]){12, 5}, x, 0,
                     what);
            s_expect("reshape", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {-1, 20}}, type, 2, (int64_t[]){3, 20}, x,
                     0, what);
            s_expect("reshape", 1, &t, &(dt_op_attrs){.nints = 3, .ints = {5, 2, 6}}, type, 3, (int64_t[]){5, 2, 6},
                     x, 0, what);
            s_expect("reshape", 1, &t, &(dt_op_attrs){.nints = 1, .ints = {60}}, type, 1, (int64_t[]){60}, x, 0, what);
            s_expect("flatten", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {1, 2}}, type, 2, (int64_t[]){3, 20}, x, 0,
                     what);
            s_expect("flatten", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {0, -1}}, type, 1, (int64_t[]){60}, x, 0,
                     what);
            s_expect("unsqueeze", 1, &t, &(dt_op_attrs){.nints = 1, .ints = {1}}, type, 4, (int64_t[]){3, 1, 4, 5}, x,
                     0, what);
            s_expect("unsqueeze", 1, &t, &(dt_op_attrs){.nints = 1, .ints = {-1}}, type, 4, (int64_t[]){3, 4, 5, 1},
                     x, 0, what);
            s_expect("squeeze", 1, &t1, NULL, type, 2, (int64_t[]){3, 5}, x, 0, what);
            s_expect("squeeze", 1, &t1, &(dt_op_attrs){.nints = 1, .ints = {-2}}, type, 2, (int64_t[]){3, 5}, x, 0,
                     what);
            s_expect("squeeze", 1, &t1, &(dt_op_attrs){.nints = 1, .ints = {0}}, type, 3, s1, x, 0, what);
            /* permute */
            int64_t oshape[3];
            static const int64_t perms[3][3] = {{2, 0, 1}, {1, 0, 2}, {0, 2, 1}};
            for (int p = 0; p < 3; p++) {
                s_permute_ref(3, shape, x, perms[p], oshape, want);
                dt_op_attrs a = {.nints = 3};
                memcpy(a.ints, perms[p], sizeof perms[p]);
                s_expect("permute", 1, &t, &a, type, 3, oshape, want, 0, what);
            }
            /* expand (3,1,5) -> (2,3,4,5) and (3,2,5) */
            int64_t ex[4] = {2, 3, 4, 5}, idx[4];
            for (int64_t i = 0; i < 120; i++) {
                s_unravel(4, ex, i, idx);
                want[i] = x[idx[1] * 5 + idx[3]];
            }
            s_expect("expand", 1, &t1, &(dt_op_attrs){.nints = 4, .ints = {2, 3, 4, 5}}, type, 4, ex, want, 0, what);
            for (int64_t i = 0; i < 30; i++)
                want[i] = x[(i / 10) * 5 + i % 5];
            s_expect("expand", 1, &t1, &(dt_op_attrs){.nints = 3, .ints = {-1, 2, -1}}, type, 3, (int64_t[]){3, 2, 5},
                     want, 0, what);
            dt_tensor *bad[1] = {NULL};
            cr_expect_eq(dt_op("reshape", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {7, -1}}, 1, bad), DT_EINVAL);
            cr_expect(strstr(dt_last_error(), "reshape") != NULL, "%s", dt_last_error());
            cr_expect_eq(dt_op("permute", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {1, 0}}, 1, bad), DT_EINVAL);
            cr_expect(strstr(dt_last_error(), "permute") != NULL, "%s", dt_last_error());
            cr_expect_eq(dt_op("expand", 1, &t, &(dt_op_attrs){.nints = 3, .ints = {3, 8, 5}}, 1, bad), DT_EINVAL);
            cr_expect(strstr(dt_last_error(), "expand") != NULL, "%s", dt_last_error());
            cr_expect_null(bad[0]);
            dt_tensor_release(&t);
            dt_tensor_release(&t1);
        }
    }
}

S_SCENARIO(view, cat_and_stack)
{
    int64_t sa[3] = {3, 4, 5}, sb[3] = {3, 2, 5}, sc[3] = {1, 4, 5};
    double a[60], b[30], c[20], want[160];
    s_fill(a, 60, 2);
    for (int i = 0; i < 30; i++)
        b[i] = 1000 + i;
    for (int i = 0; i < 20; i++)
        c[i] = -1000 - i;
    s_layout lay[8];
    int nl = s_layouts(e, 3, DT_REDUCE_SUM, lay);
    for (int l = 0; l < nl; l++) {
        char what[96], ln[32];
        s_layout_name(e, lay[l].pl, ln, sizeof ln);
        snprintf(what, sizeof what, "[%s]", ln);
        const dt_placement *other = lay[(l + 1) % nl].pl;
        dt_tensor *ta = s_make(e, DT_INT64, 3, sa, a, lay[l].pl);
        dt_tensor *tb = s_make(e, DT_INT32, 3, sb, b, other); /* int32 promotes to int64 */
        dt_tensor *tc = s_make(e, DT_INT64, 3, sc, c, other);
        double b30[60];
        for (int i = 0; i < 60; i++)
            b30[i] = 2000 + i;
        dt_tensor *ta2 = s_make(e, DT_INT64, 3, sa, b30, other);
        /* cat along dim 1: (3,6,5) */
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 6; j++)
                for (int k = 0; k < 5; k++)
                    want[(i * 6 + j) * 5 + k] = j < 4 ? a[(i * 4 + j) * 5 + k] : b[(i * 2 + j - 4) * 5 + k];
        s_expect("cat", 2, (dt_tensor *[]){ta, tb}, &(dt_op_attrs){.nints = 1, .ints = {1}}, DT_INT64, 3,
                 (int64_t[]){3, 6, 5}, want, 0, what);
        /* cat along dim 0 (-3) of three: (7,4,5) */
        memcpy(want, a, sizeof a);
        memcpy(want + 60, c, sizeof c);
        memcpy(want + 80, a, sizeof a);
        s_expect("cat", 3, (dt_tensor *[]){ta, tc, ta}, &(dt_op_attrs){.nints = 1, .ints = {-3}}, DT_INT64, 3,
                 (int64_t[]){7, 4, 5}, want, 0, what);
        s_expect("cat", 1, &ta, &(dt_op_attrs){.nints = 1, .ints = {2}}, DT_INT64, 3, sa, a, 0, what);
        /* stack along dim 1 and dim 3 */
        for (int i = 0; i < 3; i++)
            for (int s = 0; s < 2; s++)
                for (int j = 0; j < 20; j++)
                    want[(i * 2 + s) * 20 + j] = s ? b30[i * 20 + j] : a[i * 20 + j];
        s_expect("stack", 2, (dt_tensor *[]){ta, ta2}, &(dt_op_attrs){.nints = 1, .ints = {1}}, DT_INT64, 4,
                 (int64_t[]){3, 2, 4, 5}, want, 0, what);
        dt_tensor_release(&ta2);
        double b60[60];
        for (int i = 0; i < 60; i++)
            b60[i] = 500 - i;
        ta2 = s_make(e, DT_INT64, 3, sa, b60, other);
        for (int i = 0; i < 60; i++) {
            want[i * 2] = a[i];
            want[i * 2 + 1] = b60[i];
        }
        s_expect("stack", 2, (dt_tensor *[]){ta, ta2}, &(dt_op_attrs){.nints = 1, .ints = {-1}}, DT_INT64, 4,
                 (int64_t[]){3, 4, 5, 2}, want, 0, what);
        dt_tensor *bad[1] = {NULL};
        cr_expect_eq(dt_op("cat", 2, (dt_tensor *[]){ta, tc}, &(dt_op_attrs){.nints = 1, .ints = {1}}, 1, bad),
                     DT_EINVAL);
        cr_expect(strstr(dt_last_error(), "cat") != NULL, "%s", dt_last_error());
        cr_expect_eq(dt_op("stack", 2, (dt_tensor *[]){ta, tb}, &(dt_op_attrs){.nints = 1, .ints = {0}}, 1, bad),
                     DT_EINVAL);
        cr_expect(strstr(dt_last_error(), "stack") != NULL, "%s", dt_last_error());
        cr_expect_null(bad[0]);
        dt_tensor_release(&ta);
        dt_tensor_release(&tb);
        dt_tensor_release(&tc);
        dt_tensor_release(&ta2);
    }
}

/* x (3,4,5) sliced along dim: positions start, start + step, ... (count of them) */
static int s_slice_ref(const double *x, const int64_t *shape, int dim, int64_t start, int64_t count, int64_t step,
                       bool drop, int64_t *oshape, double *out)
{
    int64_t full[3], idx[3];
    memcpy(full, shape, sizeof full);
    full[dim] = count;
    for (int64_t i = 0; i < s_numel(3, full); i++) {
        s_unravel(3, full, i, idx);
        idx[dim] = start + idx[dim] * step;
        out[i] = x[s_ravel(3, shape, idx)];
    }
    int on = 0;
    for (int d = 0; d < 3; d++)
        if (!(drop && d == dim))
            oshape[on++] = full[d];
    return on;
}

S_SCENARIO(view, slicing)
{
    int64_t shape[3] = {3, 4, 5}, oshape[3];
    double x[60], want[60];
    s_fill(x, 60, 2);
    s_layout lay[8], li[8];
    int nl = s_layouts(e, 3, DT_REDUCE_SUM, lay), ni = s_layouts(e, 1, -1, li);
    for (int l = 0; l < nl; l++) {
        char what[96], ln[32];
        s_layout_name(e, lay[l].pl, ln, sizeof ln);
        snprintf(what, sizeof what, "[%s]", ln);
        dt_tensor *t = s_make(e, DT_FLOAT32, 3, shape, x, lay[l].pl);
        /* slice dim 1 [1:4:2]; dim -1 [-3:100]; dim 0 [0:3] (the whole dim); dim 2 [4:2] (empty) */
        int on = s_slice_ref(x, shape, 1, 1, 2, 2, false, oshape, want);
        s_expect("slice", 1, &t, &(dt_op_attrs){.nints = 4, .ints = {1, 1, 4, 2}}, DT_FLOAT32, on, oshape, want, 0,
                 what);
        on = s_slice_ref(x, shape, 2, 2, 3, 1, false, oshape, want);
        s_expect("slice", 1, &t, &(dt_op_attrs){.nints = 4, .ints = {-1, -3, 100, 1}}, DT_FLOAT32, on, oshape, want,
                 0, what);
        s_expect("slice", 1, &t, &(dt_op_attrs){.nints = 4, .ints = {0, 0, 3, 1}}, DT_FLOAT32, 3, shape, x, 0, what);
        s_expect("slice", 1, &t, &(dt_op_attrs){.nints = 4, .ints = {2, 4, 2, 1}}, DT_FLOAT32, 3, (int64_t[]){3, 4, 0},
                 want, 0, what);
        on = s_slice_ref(x, shape, 0, 1, 2, 1, false, oshape, want);
        s_expect("narrow", 1, &t, &(dt_op_attrs){.nints = 3, .ints = {0, -2, 2}}, DT_FLOAT32, on, oshape, want, 0,
                 what);
        on = s_slice_ref(x, shape, 2, 1, 3, 1, false, oshape, want);
        s_expect("narrow", 1, &t, &(dt_op_attrs){.nints = 3, .ints = {2, 1, 3}}, DT_FLOAT32, on, oshape, want, 0,
                 what);
        on = s_slice_ref(x, shape, 1, 3, 1, 1, true, oshape, want);
        s_expect("select", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {1, -1}}, DT_FLOAT32, on, oshape, want, 0, what);
        on = s_slice_ref(x, shape, 0, 2, 1, 1, true, oshape, want);
        s_expect("select", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {0, 2}}, DT_FLOAT32, on, oshape, want, 0, what);
        /* index_select along each dim with int64 and int32 indices; wrap (ints[1]) counts
         * negative positions from the end */
        double pos[3] = {2, 0, 2};
        for (int dim = 0; dim < 3; dim++) {
            dt_dtype it = dim == 1 ? DT_INT32 : DT_INT64;
            dt_tensor *idx = s_make(e, it, 1, (int64_t[]){3}, pos, li[(l + dim) % ni].pl);
            int64_t os[3], ix[3];
            memcpy(os, shape, sizeof os);
            os[dim] = 3;
            for (int64_t i = 0; i < s_numel(3, os); i++) {
                s_unravel(3, os, i, ix);
                ix[dim] = (int64_t)pos[ix[dim]];
                want[i] = x[s_ravel(3, shape, ix)];
            }
            s_expect("index_select", 2, (dt_tensor *[]){t, idx}, &(dt_op_attrs){.nints = 2, .ints = {dim, 0}},
                     DT_FLOAT32, 3, os, want, 0, what);
            dt_tensor_release(&idx);
        }
        dt_tensor *neg = s_make(e, DT_INT64, 1, (int64_t[]){2}, (double[]){-1, 1}, li[l % ni].pl);
        on = 0;
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) {
                want[on++] = x[(i * 4 + j) * 5 + 4];
                want[on++] = x[(i * 4 + j) * 5 + 1];
            }
        s_expect("index_select", 2, (dt_tensor *[]){t, neg}, &(dt_op_attrs){.nints = 2, .ints = {-1, 1}}, DT_FLOAT32, 3,
                 (int64_t[]){3, 4, 2}, want, 0, what);
        dt_tensor *bad[1] = {NULL};
        cr_expect_eq(dt_op("select", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {1, 4}}, 1, bad), DT_EINDEX);
        cr_expect(strstr(dt_last_error(), "select") != NULL, "%s", dt_last_error());
        cr_expect_eq(dt_op("narrow", 1, &t, &(dt_op_attrs){.nints = 3, .ints = {2, 3, 3}}, 1, bad), DT_EINVAL);
        cr_expect(strstr(dt_last_error(), "narrow") != NULL, "%s", dt_last_error());
        cr_expect_eq(dt_op("index_select", 2, (dt_tensor *[]){t, t}, &(dt_op_attrs){.nints = 2}, 1, bad), DT_ETYPE);
        cr_expect(strstr(dt_last_error(), "index_select") != NULL, "%s", dt_last_error());
        cr_expect_null(bad[0]);
        dt_tensor_release(&neg);
        dt_tensor_release(&t);
    }
}

S_SCENARIO(view, triangles)
{
    /* (3,4,5) and (5,3): shards of the last two dims need their global offsets */
    static const int64_t shapes[2][3] = {{3, 4, 5}, {5, 3, 0}};
    double x[60], want[60];
    s_layout lay[8];
    for (int s = 0; s < 2; s++) {
        int nd = s ? 2 : 3;
        const int64_t *shape = shapes[s];
        int64_t n = s_numel(nd, shape), rows = shape[nd - 2], cols = shape[nd - 1];
        s_fill(x, n, 2);
        int nl = s_layouts(e, nd, DT_REDUCE_SUM, lay);
        for (int l = 0; l < nl; l++) {
            char what[96], ln[32];
            s_layout_name(e, lay[l].pl, ln, sizeof ln);
            dt_tensor *t = s_make(e, DT_INT64, nd, shape, x, lay[l].pl);
            for (int upper = 0; upper < 2; upper++)
                for (int64_t diag = -1; diag <= 2; diag++) {
                    for (int64_t i = 0; i < n; i++) {
                        int64_t c = i % cols, r = (i / cols) % rows;
                        bool keep = upper ? c - r >= diag : c - r <= diag;
                        want[i] = keep ? x[i] : 0;
                    }
                    snprintf(what, sizeof what, "%dD diagonal %lld [%s]", nd, (long long)diag, ln);
                    s_expect(upper ? "triu" : "tril", 1, &t, &(dt_op_attrs){.nints = 1, .ints = {diag}}, DT_INT64, nd,
                             shape, want, 0, what);
                }
            dt_tensor_release(&t);
        }
    }
}

static void s_expect_refused(const char *name, int n, dt_tensor *const *in, const dt_op_attrs *a, int code,
                             const char *needle);

/* ---- writes in place ------------------------------------------------------------------------ */

S_SCENARIO(write, slice_assign_in_place)
{
    /* dst (4, 6, 3), src (4, 2, 3) written at [3, 5) of dim 1: dst sharded on every dim, the
     * written one too (6 over 2x2 pieces unevenly), and a fetch issued before the write */
    static const int64_t dshape[3] = {4, 6, 3}, sshape[3] = {4, 2, 3};
    double x[72], y[24], want[72];
    s_fill(x, 72, 2);
    for (int i = 0; i < 24; i++)
        y[i] = 1000 + i;
    for (int i = 0; i < 72; i++) {
        int64_t c = (i / 3) % 6;
        want[i] = c >= 3 && c < 5 ? y[(i / 18) * 6 + (c - 3) * 3 + i % 3] : x[i];
    }
    dt_placement R = dt_replicate(), S0 = dt_shard(0), S1 = dt_shard(1), S2 = dt_shard(2);
    s_layout lay1[] = {{{S0}}, {{S1}}, {{S2}}, {{R}}}, lay2[] = {{{S1, S0}}, {{S0, S1}}, {{R, S1}}, {{S1, S1}}};
    s_layout *lay = e->mn == 1 ? lay1 : lay2;
    for (int l = 0; l < 4; l++) {
        char what[64], ln[32];
        s_layout_name(e, lay[l].pl, ln, sizeof ln);
        snprintf(what, sizeof what, "[%s]", ln);
        dt_tensor *dst = s_make(e, DT_INT64, 3, dshape, x, lay[l].pl);
        dt_tensor *src = s_make(e, DT_INT64, 3, sshape, y, (dt_placement[]){R, R});
        dt_future *before = dt_tensor_fetch(dst);
        cr_assert_not_null(before);
        dt_tensor *in[2] = {dst, src};
        dt_tensor *out = s_op("slice_assign_", 2, in, &(dt_op_attrs){.nints = 2, .ints = {1, 3}}, what);
        cr_expect_eq(out, dst, "%s: an in-place op returns its dst", what);
        s_check(dst, DT_INT64, 3, dshape, want, 0, what);
        cr_assert_eq(dt_future_wait(before, -1), 0, "%s: %s", what, dt_future_error(before));
        const int64_t *old = dt_future_data(before, 0);
        for (int i = 0; i < 72; i++)
            cr_expect_eq(old[i], (int64_t)x[i], "%s: a fetch issued before the write sees the old value (%d)", what, i);
        dt_future_release(&before);
        /* a src with other sizes, another dtype, a start past the end: refused at the call site */
        dt_tensor *bad = s_make(e, DT_INT64, 3, dshape, x, (dt_placement[]){R, R});
        dt_tensor *bin[2] = {dst, bad};
        s_expect_refused("slice_assign_", 2, bin, &(dt_op_attrs){.nints = 2, .ints = {1, 3}}, DT_EINVAL, "does not fit");
        s_expect_refused("slice_assign_", 2, in, &(dt_op_attrs){.nints = 2, .ints = {1, 5}}, DT_EINVAL, "does not fit");
        dt_tensor_release(&bad);
        dt_tensor_release(&out);
        dt_tensor_release(&src);
        dt_tensor_release(&dst);
    }
}

S_SCENARIO(write, shard_assign_by_pieces)
{
    /* dst (2, 10) and src (2, 7) split on dim 1 by the last mesh dim (k devices), the batch by the
     * first on a 2-D mesh; each device's piece of src lands 1 in from the start of its dst piece.
     * The reference: torch.chunk pieces by hand, ceil(n / k) long, the trailing ones short. */
    static const int64_t dshape[2] = {2, 10}, sshape[2] = {2, 7};
    const int64_t k = dt_mesh_shape(e->mesh)[e->mn - 1], dc = (10 + k - 1) / k, sc = (7 + k - 1) / k;
    double x[20], y[14], want[20];
    for (int i = 0; i < 20; i++)
        x[i] = -i;
    for (int i = 0; i < 14; i++)
        y[i] = 500 + i;
    memcpy(want, x, sizeof want);
    for (int64_t r = 0; r < k; r++) {
        int64_t d0 = r * dc < 10 ? r * dc : 10, s0 = r * sc < 7 ? r * sc : 7;
        int64_t s1 = s0 + sc < 7 ? s0 + sc : 7;
        for (int row = 0; row < 2; row++)
            for (int64_t j = s0; j < s1; j++)
                want[row * 10 + d0 + 1 + (j - s0)] = y[row * 7 + j];
    }
    dt_placement S0 = dt_shard(0), S1 = dt_shard(1);
    dt_placement *pl = e->mn == 1 ? (dt_placement[]){S1} : (dt_placement[]){S0, S1};
    dt_tensor *dst = s_make(e, DT_INT64, 2, dshape, x, pl);
    dt_tensor *src = s_make(e, DT_INT64, 2, sshape, y, pl);
    dt_tensor *in[2] = {dst, src};
    if (1 + sc > dc) {
        /* one device's piece does not fit at that offset: refused at the call site */
        s_expect_refused("shard_assign_", 2, in, &(dt_op_attrs){.nints = 2, .ints = {1, 1}}, DT_EINVAL, "do not fit");
    } else {
        dt_tensor *out = s_op("shard_assign_", 2, in, &(dt_op_attrs){.nints = 2, .ints = {1, 1}}, "[pieces]");
        cr_expect_eq(out, dst, "an in-place op returns its dst");
        s_check(dst, DT_INT64, 2, dshape, want, 0, "[pieces]");
        dt_tensor_release(&out);
    }
    s_expect_refused("shard_assign_", 2, in, &(dt_op_attrs){.nints = 2, .ints = {1, 9}}, DT_EINVAL, "do not fit");
    dt_tensor_release(&src);
    dt_tensor_release(&dst);
}

S_SCENARIO(write, index_copy_at_positions)
{
    /* dst (3, 4) split on dim 0 (rows: uneven pieces), src (3, 2) landing in columns 3 and 0 (the
     * indexed dim 1), written out by hand */
    static const int64_t dshape[2] = {3, 4}, sshape[2] = {3, 2}, ishape[1] = {2};
    double x[12], y[6], at[2] = {3, 0}, want[12];
    for (int i = 0; i < 12; i++)
        x[i] = i;
    for (int i = 0; i < 6; i++)
        y[i] = 100 + i;
    memcpy(want, x, sizeof want);
    for (int r = 0; r < 3; r++) {
        want[r * 4 + 3] = y[r * 2 + 0];
        want[r * 4 + 0] = y[r * 2 + 1];
    }
    dt_placement R = dt_replicate(), S0 = dt_shard(0), S1 = dt_shard(1);
    dt_placement *pl = e->mn == 1 ? (dt_placement[]){S0} : (dt_placement[]){R, S0};
    dt_tensor *dst = s_make(e, DT_FLOAT32, 2, dshape, x, pl);
    dt_tensor *src = s_make(e, DT_FLOAT32, 2, sshape, y, (dt_placement[]){R, R});
    dt_tensor *index = s_make(e, DT_INT64, 1, ishape, at, (dt_placement[]){R, R});
    dt_tensor *in[3] = {dst, index, src};
    dt_tensor *out = s_op("index_copy_", 3, in, &(dt_op_attrs){.nints = 1, .ints = {1}}, "[columns]");
    cr_expect_eq(out, dst, "an in-place op returns its dst");
    s_check(dst, DT_FLOAT32, 2, dshape, want, 0, "[columns]");
    dt_tensor_release(&out);
    /* split on the dim it indexes: refused at the call site */
    dt_tensor *split = s_make(e, DT_FLOAT32, 2, dshape, x, e->mn == 1 ? (dt_placement[]){S1} : (dt_placement[]){R, S1});
    dt_tensor *sin[3] = {split, index, src};
    s_expect_refused("index_copy_", 3, sin, &(dt_op_attrs){.nints = 1, .ints = {1}}, DT_EUNSUPPORTED, "split on dim 1");
    dt_tensor_release(&split);
    dt_tensor_release(&index);
    dt_tensor_release(&src);
    dt_tensor_release(&dst);
}

/* ---- rotary embedding ----------------------------------------------------------------------- */

S_SCENARIO(rope, rotate_half_by_position)
{
    /* x (2, 3, 5, 4): pairs (i, i + 2) rotate by position * inv_freq[i], written out by hand */
    static const int64_t xs[4] = {2, 3, 5, 4}, ps[2] = {2, 5}, fs[1] = {2};
    double x[120], pos[10] = {0, 1, 2, 3, 4, 9, 7, 5, 3, 1}, freq[2] = {1.0, 0.125}, want[120];
    s_fill(x, 120, 0);
    for (int i = 0; i < 120; i++) {
        int d = i % 4, s = (i / 4) % 5, b = i / 60;
        int f = d % 2, lo = i - d + f;
        double angle = pos[b * 5 + s] * freq[f], c = cos(angle), sn = sin(angle);
        want[i] = d < 2 ? x[lo] * c - x[lo + 2] * sn : x[lo + 2] * c + x[lo] * sn;
    }
    s_layout lay[8];
    int nl = s_layouts(e, 4, DT_REDUCE_SUM, lay);
    dt_tensor *p = s_make(e, DT_INT64, 2, ps, pos, (dt_placement[]){dt_replicate(), dt_replicate()});
    dt_tensor *fr = s_make(e, DT_FLOAT32, 1, fs, freq, (dt_placement[]){dt_replicate(), dt_replicate()});
    for (int l = 0; l < nl; l++) {
        char what[64], ln[32];
        s_layout_name(e, lay[l].pl, ln, sizeof ln);
        snprintf(what, sizeof what, "[%s]", ln);
        dt_tensor *t = s_make(e, DT_FLOAT32, 4, xs, x, lay[l].pl);
        dt_tensor *in[3] = {t, p, fr};
        s_expect("rope", 3, in, &(dt_op_attrs){.nfloats = 1, .floats = {1.0}}, DT_FLOAT32, 4, xs, want, 1e-5, what);
        dt_tensor *in_bad[3] = {t, fr, fr};
        s_expect_refused("rope", 3, in_bad, &(dt_op_attrs){.nfloats = 1, .floats = {1.0}}, DT_EINVAL, "positions");
        dt_tensor_release(&t);
    }
    dt_tensor_release(&p);
    dt_tensor_release(&fr);
}

/* ---- matrix products ------------------------------------------------------------------------ */

/* c = a @ b for (bat, m, k) @ (bat or 1, k, n) */
static void s_mm_ref(const double *a, const double *b, int64_t bat, int64_t m, int64_t k, int64_t n, bool b_shared,
                     double *c)
{
    for (int64_t z = 0; z < bat; z++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++)
                    s += a[(z * m + i) * k + p] * b[((b_shared ? 0 : z) * k + p) * n + j];
                c[(z * m + i) * n + j] = s;
            }
}

S_SCENARIO(matmul, products)
{
    double a[60], b[60], want[120];
    s_fill(a, 60, 0);
    s_fill(b, 60, 3);
    s_layout la2[8], la1[8], la3[8];
    int n2 = s_layouts(e, 2, DT_REDUCE_SUM, la2), n1 = s_layouts(e, 1, DT_REDUCE_SUM, la1),
        n3 = s_layouts(e, 3, DT_REDUCE_SUM, la3);
    char what[96], l1[32], l2[32];
    /* mm and matmul (5,4) @ (4,3), every pair of layouts (a sharded contraction gives Partial) */
    s_mm_ref(a, b, 1, 5, 4, 3, true, want);
    for (int i = 0; i < n2; i++)
        for (int j = 0; j < n2; j++) {
            if (e->small && j != i)
                continue;
            s_layout_name(e, la2[i].pl, l1, sizeof l1);
            s_layout_name(e, la2[j].pl, l2, sizeof l2);
            snprintf(what, sizeof what, "[%s] @ [%s]", l1, l2);
            dt_tensor *in[2] = {s_make(e, DT_FLOAT32, 2, (int64_t[]){5, 4}, a, la2[i].pl),
                                s_make(e, DT_FLOAT32, 2, (int64_t[]){4, 3}, b, la2[j].pl)};
            s_expect(j % 2 ? "mm" : "matmul", 2, in, NULL, DT_FLOAT32, 2, (int64_t[]){5, 3}, want, S_TOL, what);
            dt_tensor_release(&in[0]);
            dt_tensor_release(&in[1]);
        }
    /* int64 mm is exact */
    double ia[20], ib[12];
    s_fill(ia, 20, 2);
    s_fill(ib, 12, 5);
    s_mm_ref(ia, ib, 1, 5, 4, 3, true, want);
    for (int i = 0; i < n2; i++) {
        dt_tensor *in[2] = {s_make(e, DT_INT64, 2, (int64_t[]){5, 4}, ia, la2[i].pl),
                            s_make(e, DT_INT64, 2, (int64_t[]){4, 3}, ib, la2[(i + 1) % n2].pl)};
        s_expect("mm", 2, in, NULL, DT_INT64, 2, (int64_t[]){5, 3}, want, 0, "int64");
        dt_tensor_release(&in[0]);
        dt_tensor_release(&in[1]);
    }
    /* matmul's 1-D rules: (4)@(4), (4)@(4,3), (5,4)@(4) */
    for (int i = 0; i < n1; i++) {
        s_layout_name(e, la1[i].pl, l1, sizeof l1);
        dt_tensor *v4 = s_make(e, DT_FLOAT32, 1, (int64_t[]){4}, a, la1[i].pl);
        dt_tensor *w4 = s_make(e, DT_FLOAT32, 1, (int64_t[]){4}, b, la1[(i + 1) % n1].pl);
        dt_tensor *m43 = s_make(e, DT_FLOAT32, 2, (int64_t[]){4, 3}, b, la2[i % n2].pl);
        dt_tensor *m54 = s_make(e, DT_FLOAT32, 2, (int64_t[]){5, 4}, a, la2[(i + 1) % n2].pl);
        s_mm_ref(a, b, 1, 1, 4, 1, true, want);
        s_expect("matmul", 2, (dt_tensor *[]){v4, w4}, NULL, DT_FLOAT32, 0, NULL, want, S_TOL, l1);
        s_mm_ref(a, b, 1, 1, 4, 3, true, want);
        s_expect("matmul", 2, (dt_tensor *[]){v4, m43}, NULL, DT_FLOAT32, 1, (int64_t[]){3}, want, S_TOL, l1);
        s_mm_ref(a, b, 1, 5, 4, 1, true, want);
        s_expect("matmul", 2, (dt_tensor *[]){m54, w4}, NULL, DT_FLOAT32, 1, (int64_t[]){5}, want, S_TOL, l1);
        dt_tensor_release(&v4);
        dt_tensor_release(&w4);
        dt_tensor_release(&m43);
        dt_tensor_release(&m54);
    }
    /* batched: bmm (3,2,4)@(3,4,5); matmul (3,2,4)@(4,5) broadcasts the matrix */
    for (int i = 0; i < n3; i++) {
        s_layout_name(e, la3[i].pl, l1, sizeof l1);
        dt_tensor *x = s_make(e, DT_FLOAT32, 3, (int64_t[]){3, 2, 4}, a, la3[i].pl);
        dt_tensor *y = s_make(e, DT_FLOAT32, 3, (int64_t[]){3, 4, 5}, b, la3[(i + 1) % n3].pl);
        dt_tensor *m = s_make(e, DT_FLOAT32, 2, (int64_t[]){4, 5}, b, la2[i % n2].pl);
        s_mm_ref(a, b, 3, 2, 4, 5, false, want);
        s_expect("bmm", 2, (dt_tensor *[]){x, y}, NULL, DT_FLOAT32, 3, (int64_t[]){3, 2, 5}, want, S_TOL, l1);
        s_expect("matmul", 2, (dt_tensor *[]){x, y}, NULL, DT_FLOAT32, 3, (int64_t[]){3, 2, 5}, want, S_TOL, l1);
        s_mm_ref(a, b, 3, 2, 4, 5, true, want);
        s_expect("matmul", 2, (dt_tensor *[]){x, m}, NULL, DT_FLOAT32, 3, (int64_t[]){3, 2, 5}, want, S_TOL, l1);
        dt_tensor_release(&x);
        dt_tensor_release(&y);
        dt_tensor_release(&m);
    }
    /* linear(x (3,2,4), W (6,4), b (6)): x @ W^T + b; W sharded on in_features gives Partial and
     * the bias must be added once */
    double w[24], bias[6], wt[24];
    s_fill(w, 24, 3);
    for (int i = 0; i < 6; i++)
        bias[i] = (double)i - 2.5;
    for (int o = 0; o < 6; o++)
        for (int p = 0; p < 4; p++)
            wt[p * 6 + o] = w[o * 4 + p];
    for (int i = 0; i < n3; i++) {
        const dt_placement *pw = la2[i % n2].pl, *pb = la1[(i + 1) % n1].pl;
        s_layout_name(e, la3[i].pl, l1, sizeof l1);
        s_layout_name(e, pw, l2, sizeof l2);
        snprintf(what, sizeof what, "x [%s] W [%s]", l1, l2);
        dt_tensor *x = s_make(e, DT_FLOAT32, 3, (int64_t[]){3, 2, 4}, a, la3[i].pl);
        dt_tensor *tw = s_make(e, DT_FLOAT32, 2, (int64_t[]){6, 4}, w, pw);
        dt_tensor *tb = s_make(e, DT_FLOAT32, 1, (int64_t[]){6}, bias, pb);
        s_mm_ref(a, wt, 6, 1, 4, 6, true, want);
        s_expect("linear", 2, (dt_tensor *[]){x, tw}, NULL, DT_FLOAT32, 3, (int64_t[]){3, 2, 6}, want, S_TOL, what);
        for (int r = 0; r < 6; r++)
            for (int o = 0; o < 6; o++)
                want[r * 6 + o] += bias[o];
        s_expect("linear", 3, (dt_tensor *[]){x, tw, tb}, NULL, DT_FLOAT32, 3, (int64_t[]){3, 2, 6}, want, S_TOL,
                 what);
        dt_tensor_release(&x);
        dt_tensor_release(&tw);
        dt_tensor_release(&tb);
    }
}

S_SCENARIO(matmul, embedding)
{
    /* W (7,4) looked up by indices (2,3): W sharded by rows gives Partial(sum), by columns a
     * column shard, indices sharded keep their shards */
    double w[28], idx[6] = {6, 0, 3, 3, 1, 5}, want[24];
    s_fill(w, 28, 0);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++)
            want[i * 4 + j] = w[(int)idx[i] * 4 + j];
    s_layout lw[8], li[8];
    int nw = s_layouts(e, 2, DT_REDUCE_SUM, lw), ni = s_layouts(e, 2, -1, li);
    for (int i = 0; i < nw; i++)
        for (int j = 0; j < ni; j++) {
            if (e->small && j)
                continue;
            char what[96], l1[32], l2[32];
            s_layout_name(e, lw[i].pl, l1, sizeof l1);
            s_layout_name(e, li[j].pl, l2, sizeof l2);
            snprintf(what, sizeof what, "W [%s] indices [%s]", l1, l2);
            dt_tensor *tw = s_make(e, DT_FLOAT32, 2, (int64_t[]){7, 4}, w, lw[i].pl);
            dt_tensor *ti = s_make(e, j % 2 ? DT_INT32 : DT_INT64, 2, (int64_t[]){2, 3}, idx, li[j].pl);
            s_expect("embedding", 2, (dt_tensor *[]){ti, tw}, NULL, DT_FLOAT32, 3, (int64_t[]){2, 3, 4}, want, 0,
                     what);
            dt_tensor_release(&tw);
            dt_tensor_release(&ti);
        }
}

/* softmax(q k^T * scale + mask) v for one head: q (L,E), k (S,E), v (S,Ev); mask (L,S) additive */
static void s_attention_ref(const double *q, const double *k, const double *v, const double *mask, int64_t L,
                            int64_t S, int64_t E, int64_t Ev, bool causal, double scale, double *out)
{
    for (int64_t i = 0; i < L; i++) {
        double w[16], mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < S; j++) {
            double s = 0;
            for (int64_t p = 0; p < E; p++)
                s += q[i * E + p] * k[j * E + p];
            w[j] = s * scale + (mask ? mask[i * S + j] : 0);
            if (causal && j > i)
                w[j] = -INFINITY;
            mx = fmax(mx, w[j]);
        }
        for (int64_t j = 0; j < S; j++)
            sum += w[j] = mx == -INFINITY ? 0 : exp(w[j] - mx);
        for (int64_t c = 0; c < Ev; c++) {
            double o = 0;
            for (int64_t j = 0; j < S; j++)
                o += sum > 0 ? w[j] / sum * v[j * Ev + c] : 0;
            out[i * Ev + c] = o;
        }
    }
}

S_SCENARIO(matmul, attention)
{
    /* q (2,2,5,4), k (2,2,6,4), v (2,2,6,3); a (5,6) mask, bool and float */
    enum { B = 2, H = 2, L = 5, S = 6, E = 4, EV = 3 };
    double q[B * H * L * E], k[B * H * S * E], v[B * H * S * EV], bm[L * S], bma[L * S], fm[L * S];
    double want[B * H * L * EV];
    for (int i = 0; i < B * H * L * E; i++)
        q[i] = (double)((i * 7) % 11 - 5) / 8.0;
    for (int i = 0; i < B * H * S * E; i++)
        k[i] = (double)((i * 5) % 13 - 6) / 8.0;
    for (int i = 0; i < B * H * S * EV; i++)
        v[i] = (double)((i * 3) % 7 - 3) / 4.0;
    for (int i = 0; i < L * S; i++) {
        bm[i] = (i % 4) != 1;
        bma[i] = bm[i] ? 0 : -INFINITY; /* the bool mask as the additive one it stands for */
        fm[i] = bm[i] ? (double)(i % 3) * 0.25 : -INFINITY;
    }
    int64_t sq[4] = {B, H, L, E}, sk[4] = {B, H, S, E}, sv[4] = {B, H, S, EV}, so[4] = {B, H, L, EV};
    s_layout lay[8], lm[8];
    int nl = s_layouts(e, 4, DT_REDUCE_SUM, lay), nm = s_layouts(e, 2, -1, lm);
    for (int l = 0; l < nl; l++) {
        char what[96], ln[32];
        s_layout_name(e, lay[l].pl, ln, sizeof ln);
        const dt_placement *pk = lay[(l + 1) % nl].pl, *pv = lay[(l + 2) % nl].pl;
        dt_tensor *tq = s_make(e, DT_FLOAT32, 4, sq, q, lay[l].pl);
        dt_tensor *tk = s_make(e, DT_FLOAT32, 4, sk, k, pk);
        dt_tensor *tv = s_make(e, DT_FLOAT32, 4, sv, v, pv);
        dt_tensor *tv2 = s_make(e, DT_FLOAT32, 4, sv, v, lay[l].pl); /* q, k, v laid out alike */
        dt_tensor *tk2 = s_make(e, DT_FLOAT32, 4, sk, k, lay[l].pl);
        dt_tensor *tbm = s_make(e, DT_BOOL, 2, (int64_t[]){L, S}, bm, lm[l % nm].pl);
        dt_tensor *tfm = s_make(e, DT_FLOAT32, 2, (int64_t[]){L, S}, fm, lm[(l + 1) % nm].pl);
        for (int variant = 0; variant < 5; variant++) {
            bool causal = variant == 1, has_scale = variant == 2;
            const double *mask = variant == 3 ? bma : variant == 4 ? fm : NULL;
            double scale = has_scale ? 0.3 : 1.0 / sqrt((double)E);
            for (int z = 0; z < B * H; z++)
                s_attention_ref(q + z * L * E, k + z * S * E, v + z * S * EV, mask, L, S, E, EV, causal, scale,
                                want + z * L * EV);
            dt_tensor *in[4] = {tq, variant == 4 ? tk2 : tk, variant == 4 ? tv2 : tv, variant == 3 ? tbm : tfm};
            snprintf(what, sizeof what, "variant %d [%s]", variant, ln);
            s_expect("scaled_dot_product_attention", mask ? 4 : 3, in,
                     &(dt_op_attrs){.nints = 3, .ints = {causal, 0, has_scale}, .nfloats = 1, .floats = {0.3}},
                     DT_FLOAT32, 4, so, want, 1e-4, what);
        }
        dt_tensor_release(&tq);
        dt_tensor_release(&tk);
        dt_tensor_release(&tv);
        dt_tensor_release(&tk2);
        dt_tensor_release(&tv2);
        dt_tensor_release(&tbm);
        dt_tensor_release(&tfm);
    }
    /* grouped-query attention: 4 query heads over 2 key/value heads, causal */
    double gq[4 * 3 * E], gk[2 * S * E], gv[2 * S * EV], gwant[4 * 3 * EV];
    for (int i = 0; i < 4 * 3 * E; i++)
        gq[i] = (double)((i * 5) % 9 - 4) / 8.0;
    memcpy(gk, k, sizeof gk);
    memcpy(gv, v, sizeof gv);
    for (int h = 0; h < 4; h++)
        s_attention_ref(gq + h * 3 * E, gk + (h / 2) * S * E, gv + (h / 2) * S * EV, NULL, 3, S, E, EV, true,
                        1.0 / sqrt((double)E), gwant + h * 3 * EV);
    s_layout lg[8];
    int ng = s_layouts(e, 4, -1, lg);
    for (int l = 0; l < ng; l++) {
        dt_tensor *in[3] = {s_make(e, DT_FLOAT32, 4, (int64_t[]){1, 4, 3, E}, gq, lg[l].pl),
                            s_make(e, DT_FLOAT32, 4, (int64_t[]){1, 2, S, E}, gk, lg[l].pl),
                            s_make(e, DT_FLOAT32, 4, (int64_t[]){1, 2, S, EV}, gv, lg[(l + 1) % ng].pl)};
        s_expect("scaled_dot_product_attention", 3, in, &(dt_op_attrs){.nints = 3, .ints = {1, 1, 0}}, DT_FLOAT32, 4,
                 (int64_t[]){1, 4, 3, EV}, gwant, 1e-4, "gqa");
        dt_tensor *bad[1] = {NULL};
        cr_expect_eq(dt_op("scaled_dot_product_attention", 3, in, &(dt_op_attrs){.nints = 3, .ints = {1, 0, 0}}, 1,
                           bad),
                     DT_EINVAL, "fewer key heads without enable_gqa");
        cr_expect(strstr(dt_last_error(), "scaled_dot_product_attention") != NULL, "%s", dt_last_error());
        cr_expect_null(bad[0]);
        for (int i = 0; i < 3; i++)
            dt_tensor_release(&in[i]);
    }
}

/* ---- attention by blocks of keys -------------------------------------------------------------- */

/* One head's partial result over keys S with positions: o (L, Ev) and lse (L), -inf and zeros
 * for a row that sees no key. */
static void s_block_ref(const double *q, const double *k, const double *v, const double *q_pos, const double *k_pos,
                        int64_t L, int64_t S, int64_t E, int64_t Ev, bool causal, double scale, double *o,
                        double *lse)
{
    for (int64_t i = 0; i < L; i++) {
        double w[16], mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < S; j++) {
            double s = 0;
            for (int64_t p = 0; p < E; p++)
                s += q[i * E + p] * k[j * E + p];
            bool visible = k_pos[j] >= 0 && (!causal || k_pos[j] <= q_pos[i]);
            w[j] = visible ? s * scale : -INFINITY;
            mx = fmax(mx, w[j]);
        }
        for (int64_t j = 0; j < S; j++)
            sum += w[j] = mx == -INFINITY ? 0 : exp(w[j] - mx);
        lse[i] = mx == -INFINITY ? -INFINITY : mx + log(sum);
        for (int64_t c = 0; c < Ev; c++) {
            double acc = 0;
            for (int64_t j = 0; j < S; j++)
                acc += sum > 0 ? w[j] / sum * v[j * Ev + c] : 0;
            o[i * Ev + c] = acc;
        }
    }
}

/* The keys [from, from + n) of k (B, H, S, E) as their own array (B, H, n, E). */
static void s_keys(const double *k, int64_t B, int64_t H, int64_t S, int64_t E, int64_t from, int64_t n, double *out)
{
    for (int64_t z = 0; z < B * H; z++)
        memcpy(out + z * n * E, k + (z * S + from) * E, (size_t)(n * E) * sizeof *k);
}

S_SCENARIO(attention, blocks_and_merge)
{
    /* q (2, 4, 3, 4) over k (2, 2, 6, 4), v (2, 2, 6, 3): grouped-query heads; the keys visited as a
     * block of 4 then one of 2 must give attention over all 6. Positions: query row (0, 0) at -1
     * sees nothing; batch 1's first key slot is empty (-1). */
    enum { B = 2, HQ = 4, H = 2, L = 3, S = 6, SA = 4, SB = 2, E = 4, EV = 3 };
    double q[B * HQ * L * E], k[B * H * S * E], v[B * H * S * EV];
    double ka[B * H * SA * E], kb[B * H * SB * E], va[B * H * SA * EV], vb[B * H * SB * EV];
    double qpos[B * L] = {-1, 2, 5, 1, 3, 4}, kpos[B * S] = {0, 1, 2, 3, 4, 5, -1, 0, 1, 2, 3, 4};
    double kpa[B * SA], kpb[B * SB], want_o[B * HQ * L * EV], want_lse[B * HQ * L];
    s_fill(q, B * HQ * L * E, 0);
    s_fill(k, B * H * S * E, 3);
    s_fill(v, B * H * S * EV, 0);
    s_keys(k, B, H, S, E, 0, SA, ka);
    s_keys(k, B, H, S, E, SA, SB, kb);
    s_keys(v, B, H, S, EV, 0, SA, va);
    s_keys(v, B, H, S, EV, SA, SB, vb);
    s_keys(kpos, B, 1, S, 1, 0, SA, kpa);
    s_keys(kpos, B, 1, S, 1, SA, SB, kpb);
    const int64_t sq[4] = {B, HQ, L, E}, so[4] = {B, HQ, L, EV}, sl[3] = {B, HQ, L}, sqi[2] = {B, L};
    const int64_t ska[4] = {B, H, SA, E}, skb[4] = {B, H, SB, E}, sva[4] = {B, H, SA, EV}, svb[4] = {B, H, SB, EV};
    dt_placement R[2] = {dt_replicate(), dt_replicate()};
    s_layout lay[8];
    int nl = s_layouts(e, 4, -1, lay);
    dt_tensor *qi = s_make(e, DT_INT64, 2, sqi, qpos, R);
    dt_tensor *kia = s_make(e, DT_INT64, 2, (int64_t[]){B, SA}, kpa, R);
    dt_tensor *kib = s_make(e, DT_INT64, 2, (int64_t[]){B, SB}, kpb, R);
    for (int variant = 0; variant < 2; variant++) {
        bool causal = variant == 1;
        double scale = 0.375;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < HQ; h++) {
                int64_t z = b * HQ + h, kv = b * H + h / (HQ / H);
                s_block_ref(q + z * L * E, k + kv * S * E, v + kv * S * EV, qpos + b * L, kpos + b * S, L, S, E, EV,
                            causal, scale, want_o + z * L * EV, want_lse + z * L);
            }
        dt_op_attrs attrs = {.nints = 1, .ints = {causal}, .nfloats = 1, .floats = {scale}};
        for (int l = 0; l < nl; l++) {
            char what[64], ln[32];
            s_layout_name(e, lay[l].pl, ln, sizeof ln);
            snprintf(what, sizeof what, "causal %d [%s]", causal, ln);
            const dt_placement *pkv = lay[(l + 1) % nl].pl;
            dt_tensor *tq = s_make(e, DT_FLOAT32, 4, sq, q, lay[l].pl);
            dt_tensor *tka = s_make(e, DT_FLOAT32, 4, ska, ka, pkv), *tva = s_make(e, DT_FLOAT32, 4, sva, va, pkv);
            dt_tensor *tkb = s_make(e, DT_FLOAT32, 4, skb, kb, lay[l].pl);
            dt_tensor *tvb = s_make(e, DT_FLOAT32, 4, svb, vb, lay[l].pl);
            dt_tensor *a[2], *bo[2], *acc[2], *merged[2];
            cr_assert_eq(dt_op("attention_block", 5, (dt_tensor *[]){tq, tka, tva, qi, kia}, &attrs, 2, a), 2, "%s: %s",
                         what, dt_last_error());
            cr_assert_eq(dt_op("attention_block", 5, (dt_tensor *[]){tq, tkb, tvb, qi, kib}, &attrs, 2, bo), 2,
                         "%s: %s", what, dt_last_error());
            /* the second block merged into the first one's accumulators */
            cr_assert_eq(dt_op("attention_block", 7, (dt_tensor *[]){tq, tkb, tvb, qi, kib, a[0], a[1]}, &attrs, 2, acc),
                         2, "%s: %s", what, dt_last_error());
            s_check(acc[0], DT_FLOAT32, 4, so, want_o, 1e-5, what);
            s_check(acc[1], DT_FLOAT32, 3, sl, want_lse, 1e-5, what);
            /* the two partial results stacked along dim 0 and merged */
            dt_op_attrs cat0 = {.nints = 1, .ints = {0}};
            dt_tensor *parts[2] = {s_op("cat", 2, (dt_tensor *[]){a[0], bo[0]}, &cat0, what),
                                   s_op("cat", 2, (dt_tensor *[]){a[1], bo[1]}, &cat0, what)};
            cr_assert_eq(dt_op("attention_merge", 2, parts, &(dt_op_attrs){.nints = 1, .ints = {2}}, 2, merged), 2,
                         "%s: %s", what, dt_last_error());
            s_check(merged[0], DT_FLOAT32, 4, so, want_o, 1e-5, what);
            s_check(merged[1], DT_FLOAT32, 3, sl, want_lse, 1e-5, what);
            s_expect_refused("attention_merge", 2, parts, &(dt_op_attrs){.nints = 1, .ints = {3}}, DT_EINVAL, "P = 3");
            s_expect_refused("attention_block", 5, (dt_tensor *[]){tq, tka, tva, kia, kia}, &attrs, DT_EINVAL,
                             "query_index must have shape");
            s_expect_refused("attention_block", 5, (dt_tensor *[]){tq, tka, tva, qi, kia}, &cat0, DT_EINVAL,
                             "floats [scale]");
            dt_tensor *all[] = {tq, tka, tva, tkb, tvb, a[0], a[1], bo[0], bo[1], acc[0], acc[1], parts[0], parts[1],
                                merged[0], merged[1]};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                dt_tensor_release(&all[i]);
        }
    }
    dt_tensor_release(&qi);
    dt_tensor_release(&kia);
    dt_tensor_release(&kib);
}

/* dt_ring_attention over mesh dim `ring` (the other, on 2x2, splits the heads): prefill with 7 tokens
 * (uneven: 4 and 3), then decode of one token against the keys as a cache with an empty slot. */
S_SCENARIO(attention, ring)
{
    enum { B = 2, HQ = 4, H = 2, S = 7, E = 4, EV = 3 };
    double q[B * HQ * S * E], k[B * H * S * E], v[B * H * S * EV], pos[S], want[B * HQ * S * EV], lse[B * HQ * S];
    double slots[S] = {0, 1, 2, -1, 3, 4, 5}, now[1] = {4};
    s_fill(q, B * HQ * S * E, 0);
    s_fill(k, B * H * S * E, 3);
    s_fill(v, B * H * S * EV, 0);
    for (int i = 0; i < S; i++)
        pos[i] = i;
    dt_placement R = dt_replicate(), S1 = dt_shard(1), S2 = dt_shard(2);
    for (int ring = 0; ring < e->mn; ring++) {
        dt_placement seq[2] = {ring ? S1 : S2, ring ? S2 : S1}, idx[2] = {ring ? R : S1, ring ? S1 : R};
        dt_placement rep[2] = {R, R}, kidx[2] = {ring ? R : S1, ring ? S1 : R};
        char what[64];
        snprintf(what, sizeof what, "ring on mesh dim %d", ring);
        dt_tensor *tk = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, H, S, E}, k, seq);
        dt_tensor *tv = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, H, S, EV}, v, seq);
        dt_tensor *tq = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, HQ, S, E}, q, seq);
        dt_tensor *tpos = s_make(e, DT_INT64, 2, (int64_t[]){1, S}, pos, idx);
        for (int z = 0; z < B * HQ; z++) {
            int64_t kv = z / HQ * H + z % HQ / (HQ / H);
            s_block_ref(q + z * S * E, k + kv * S * E, v + kv * S * EV, pos, pos, S, S, E, EV, true, 0.5,
                        want + z * S * EV, lse + z * S);
        }
        dt_tensor *out = dt_ring_attention(tq, tk, tv, tpos, tpos, ring, true, false, 0.0);
        s_check(out, DT_FLOAT32, 4, (int64_t[]){B, HQ, S, EV}, want, 1e-5, what);
        dt_tensor_release(&out);
        /* decode: each head's first query row alone, Replicate along the ring, at position 4 */
        double one[B * HQ * E];
        for (int z = 0; z < B * HQ; z++)
            memcpy(one + z * E, q + z * S * E, E * sizeof *one);
        for (int z = 0; z < B * HQ; z++) {
            int64_t kv = z / HQ * H + z % HQ / (HQ / H);
            s_block_ref(one + z * E, k + kv * S * E, v + kv * S * EV, now, slots, 1, S, E, EV, true, 0.5,
                        want + z * EV, lse + z);
        }
        dt_placement qpl[2] = {ring ? S1 : R, ring ? R : S1};
        dt_tensor *tq1 = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, HQ, 1, E}, one, qpl);
        dt_tensor *tnow = s_make(e, DT_INT64, 2, (int64_t[]){1, 1}, now, rep);
        dt_tensor *tslots = s_make(e, DT_INT64, 2, (int64_t[]){1, S}, slots, kidx);
        out = dt_ring_attention(tq1, tk, tv, tnow, tslots, ring, true, true, 0.5);
        s_check(out, DT_FLOAT32, 4, (int64_t[]){B, HQ, 1, EV}, want, 1e-5, what);
        dt_tensor_release(&out);
        /* keys not split along the ring: refused at the call, naming the input */
        dt_tensor *bad = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, H, S, E}, k, rep);
        cr_expect_null(dt_ring_attention(tq, bad, tv, tpos, tpos, ring, true, false, 0.0));
        cr_expect_eq(dt_last_error_code(), DT_EINVAL);
        cr_expect(strstr(dt_last_error(), "ring_attention: key has placements") != NULL, "%s", dt_last_error());
        cr_expect_null(dt_ring_attention(tq, tk, tv, tpos, NULL, ring, true, false, 0.0));
        cr_expect(strstr(dt_last_error(), "key_index is missing") != NULL, "%s", dt_last_error());
        cr_expect_null(dt_ring_attention(tq, tk, tv, tpos, tpos, 2, true, false, 0.0));
        cr_expect(strstr(dt_last_error(), "mesh_dim 2 is out of range") != NULL, "%s", dt_last_error());
        dt_tensor *all[] = {tk, tv, tq, tpos, tq1, tnow, tslots, bad};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            dt_tensor_release(&all[i]);
    }
}

/* dt_ring_attention_joint: a joint block of 3 keys (Replicate along the ring, like the text tokens
 * of a diffusion transformer) seen once by every query besides the 7 ring keys split 4 and 3,
 * non-causal; prefill and decode against the reference over the concatenated keys. */
S_SCENARIO(attention, ring_joint)
{
    enum { B = 2, HQ = 4, H = 2, S = 7, SJ = 3, ST = SJ + S, E = 4, EV = 3 };
    double q[B * HQ * S * E], k[B * H * S * E], v[B * H * S * EV], jk[B * H * SJ * E], jv[B * H * SJ * EV];
    double kk[ST * E], vv[ST * EV], pos[ST] = {0}, want[B * HQ * S * EV], lse[B * HQ * S];
    s_fill(q, B * HQ * S * E, 0);
    s_fill(k, B * H * S * E, 3);
    s_fill(v, B * H * S * EV, 0);
    s_fill(jk, B * H * SJ * E, 5);
    s_fill(jv, B * H * SJ * EV, 7);
    dt_placement R = dt_replicate(), S1 = dt_shard(1), S2 = dt_shard(2);
    for (int ring = 0; ring < e->mn; ring++) {
        dt_placement seq[2] = {ring ? S1 : S2, ring ? S2 : S1}, idx[2] = {ring ? R : S1, ring ? S1 : R};
        dt_placement whole[2] = {ring ? S1 : R, ring ? R : S1}, rep[2] = {R, R};
        char what[64];
        snprintf(what, sizeof what, "joint ring on mesh dim %d", ring);
        dt_tensor *tk = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, H, S, E}, k, seq);
        dt_tensor *tv = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, H, S, EV}, v, seq);
        dt_tensor *tq = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, HQ, S, E}, q, seq);
        dt_tensor *tjk = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, H, SJ, E}, jk, whole);
        dt_tensor *tjv = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, H, SJ, EV}, jv, whole);
        dt_tensor *tpos = s_make(e, DT_INT64, 2, (int64_t[]){1, S}, pos, idx);
        dt_tensor *tjpos = s_make(e, DT_INT64, 2, (int64_t[]){1, SJ}, pos, rep);
        for (int z = 0; z < B * HQ; z++) {
            int64_t kv = z / HQ * H + z % HQ / (HQ / H);
            memcpy(kk, jk + kv * SJ * E, SJ * E * sizeof *kk);
            memcpy(kk + SJ * E, k + kv * S * E, S * E * sizeof *kk);
            memcpy(vv, jv + kv * SJ * EV, SJ * EV * sizeof *vv);
            memcpy(vv + SJ * EV, v + kv * S * EV, S * EV * sizeof *vv);
            s_block_ref(q + z * S * E, kk, vv, pos, pos, S, ST, E, EV, false, 0.5, want + z * S * EV, lse + z * S);
        }
        dt_tensor *out = dt_ring_attention_joint(tq, tk, tv, tpos, tpos, tjk, tjv, tjpos, ring, false, false, 0.0);
        s_check(out, DT_FLOAT32, 4, (int64_t[]){B, HQ, S, EV}, want, 1e-5, what);
        dt_tensor_release(&out);
        /* decode: the same queries whole along the ring (each device attends to its own block, the
         * joint block counted once in the merge) */
        dt_tensor *tqr = s_make(e, DT_FLOAT32, 4, (int64_t[]){B, HQ, S, E}, q, whole);
        dt_tensor *tqpos = s_make(e, DT_INT64, 2, (int64_t[]){1, S}, pos, rep);
        out = dt_ring_attention_joint(tqr, tk, tv, tqpos, tpos, tjk, tjv, tjpos, ring, false, false, 0.0);
        s_check(out, DT_FLOAT32, 4, (int64_t[]){B, HQ, S, EV}, want, 1e-5, what);
        dt_tensor_release(&out);
        /* a joint block split along the ring, or one given in part: refused at the call */
        cr_expect_null(dt_ring_attention_joint(tq, tk, tv, tpos, tpos, tk, tv, tpos, ring, false, false, 0.0));
        cr_expect(strstr(dt_last_error(), "ring_attention: joint_key has placements") != NULL, "%s", dt_last_error());
        cr_expect_null(dt_ring_attention_joint(tq, tk, tv, tpos, tpos, tjk, NULL, tjpos, ring, false, false, 0.0));
        cr_expect(strstr(dt_last_error(), "together") != NULL, "%s", dt_last_error());
        dt_tensor *all[] = {tk, tv, tq, tjk, tjv, tpos, tjpos, tqr, tqpos};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            dt_tensor_release(&all[i]);
    }
}

/* ---- images ---------------------------------------------------------------------------------- */

/* Whether t has placements pl on every mesh dim. */
static void s_expect_placements(const s_env *e, dt_tensor *t, const dt_placement *pl, const char *what)
{
    char got[32], want[32];
    const dt_placement *have = dt_tensor_placements(t);
    s_layout_name(e, have, got, sizeof got);
    s_layout_name(e, pl, want, sizeof want);
    cr_expect_str_eq(got, want, "%s: placements [%s], want [%s]", what, got, want);
}

/* out (N, O, OH, OW) = conv2d of x (N, C, H, W) with w (O, C / g, kH, kW) and bias b (or NULL), p =
 * [stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, dil_h, dil_w, groups]: the sum over
 * kernel taps, written out directly. */
static void s_conv_ref(const double *x, const int64_t *xs, const double *w, const int64_t *ws, const double *b,
                       const int64_t *p, double *out, int64_t *os)
{
    int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], kH = ws[2], kW = ws[3], G = p[8];
    int64_t Cg = C / G, Og = O / G;
    int64_t OH = (H + p[2] + p[3] - p[6] * (kH - 1) - 1) / p[0] + 1;
    int64_t OW = (W + p[4] + p[5] - p[7] * (kW - 1) - 1) / p[1] + 1;
    os[0] = N, os[1] = O, os[2] = OH, os[3] = OW;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < OH; i++)
                for (int64_t j = 0; j < OW; j++) {
                    double s = b ? b[o] : 0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t ki = 0; ki < kH; ki++)
                            for (int64_t kj = 0; kj < kW; kj++) {
                                int64_t ih = i * p[0] - p[2] + ki * p[6], iw = j * p[1] - p[4] + kj * p[7];
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                                    continue;
                                int64_t ch = o / Og * Cg + c;
                                s += x[((n * C + ch) * H + ih) * W + iw] * w[((o * Cg + c) * kH + ki) * kW + kj];
                            }
                    out[((n * O + o) * OH + i) * OW + j] = s;
                }
}

S_SCENARIO(image, conv2d)
{
    /* 3x3 padded by 1; stride 2 with uneven padding, dilation 2 and 2 groups; 1x1 (no im2col) */
    static const int64_t params[3][9] = {
        {1, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 1, 0, 1, 1, 0, 2, 1, 2}, {1, 1, 0, 0, 0, 0, 1, 1, 1}};
    static const int64_t kern[3][2] = {{3, 3}, {2, 3}, {1, 1}};
    static double x[3 * 4 * 6 * 5], w[6 * 4 * 3 * 3], b[6], want[3 * 6 * 6 * 5];
    s_fill(x, 360, 0);
    s_fill(w, 216, 3);
    for (int i = 0; i < 6; i++)
        b[i] = (double)(i - 2) * 0.25;
    dt_placement R = dt_replicate(), S0 = dt_shard(0), S1 = dt_shard(1);
    s_layout lx[8], lw[8], lb[8];
    int nx = s_layouts(e, 4, DT_REDUCE_SUM, lx), nw = s_layouts(e, 4, -1, lw), nb = s_layouts(e, 1, -1, lb);
    for (int batch = 0; batch < 2; batch++) {
        /* N = 3: uneven batch shards; N = 1: an empty one */
        int64_t xs[4] = {batch ? 1 : 3, 4, 6, 5};
        for (int l = 0; l < nx; l++) {
            dt_tensor *tx = s_make(e, DT_FLOAT32, 4, xs, x, lx[l].pl);
            for (int q = 0; q < 3; q++) {
                if (e->small && q != l % 3)
                    continue;
                int64_t ws[4] = {6, 4 / params[q][8], kern[q][0], kern[q][1]}, os[4];
                dt_tensor *tw = s_make(e, DT_FLOAT32, 4, ws, w, lw[(l + q) % nw].pl);
                dt_tensor *tb = s_make(e, DT_FLOAT32, 1, (int64_t[]){6}, b, lb[(l + q) % nb].pl);
                dt_op_attrs attrs = {.nints = 9};
                memcpy(attrs.ints, params[q], sizeof params[q]);
                char what[96], ln[32], lnw[32];
                s_layout_name(e, lx[l].pl, ln, sizeof ln);
                s_layout_name(e, lw[(l + q) % nw].pl, lnw, sizeof lnw);
                snprintf(what, sizeof what, "N=%lld params %d x [%s] w [%s]", (long long)xs[0], q, ln, lnw);
                s_conv_ref(x, xs, w, ws, b, params[q], want, os);
                s_expect("conv2d", 3, (dt_tensor *[]){tx, tw, tb}, &attrs, DT_FLOAT32, 4, os, want, S_TOL, what);
                s_conv_ref(x, xs, w, ws, NULL, params[q], want, os);
                s_expect("conv2d", 2, (dt_tensor *[]){tx, tw}, &attrs, DT_FLOAT32, 4, os, want, S_TOL, what);
                dt_tensor_release(&tw);
                dt_tensor_release(&tb);
            }
            dt_tensor_release(&tx);
        }
    }
    /* the placements chosen: a batch shard stays, a weight split by output channels splits the
     * output's channels, a Partial input without bias stays Partial */
    int64_t xs[4] = {3, 4, 6, 5}, ws[4] = {6, 4, 3, 3}, os[4];
    dt_op_attrs attrs = {.nints = 9};
    memcpy(attrs.ints, params[0], sizeof params[0]);
    dt_placement pr[2] = {R, R}, ps0[2] = {S0, R}, pw0[2] = {R, S0}, pp[2] = {dt_partial(DT_REDUCE_SUM), R};
    dt_tensor *xr = s_make(e, DT_FLOAT32, 4, xs, x, pr), *xb = s_make(e, DT_FLOAT32, 4, xs, x, ps0);
    dt_tensor *xp = s_make(e, DT_FLOAT32, 4, xs, x, pp);
    dt_tensor *wr = s_make(e, DT_FLOAT32, 4, ws, w, pr), *wo = s_make(e, DT_FLOAT32, 4, ws, w, e->mn == 1 ? ps0 : pw0);
    dt_tensor *bo = s_make(e, DT_FLOAT32, 1, (int64_t[]){6}, b, e->mn == 1 ? ps0 : pw0);
    s_conv_ref(x, xs, w, ws, NULL, params[0], want, os);
    dt_tensor *t = s_op("conv2d", 2, (dt_tensor *[]){xb, wr}, &attrs, "batch");
    s_expect_placements(e, t, ps0, "conv2d of a batch shard");
    s_check(t, DT_FLOAT32, 4, os, want, S_TOL, "conv2d of a batch shard");
    dt_tensor_release(&t);
    t = s_op("conv2d", 2, (dt_tensor *[]){xp, wr}, &attrs, "partial");
    s_expect_placements(e, t, pp, "conv2d of a Partial input");
    s_check(t, DT_FLOAT32, 4, os, want, S_TOL, "conv2d of a Partial input");
    dt_tensor_release(&t);
    s_conv_ref(x, xs, w, ws, b, params[0], want, os);
    t = s_op("conv2d", 3, (dt_tensor *[]){xr, wo, bo}, &attrs, "channels");
    s_expect_placements(e, t, e->mn == 1 ? (dt_placement[]){S1} : (dt_placement[]){R, S1}, "conv2d by channels");
    s_check(t, DT_FLOAT32, 4, os, want, S_TOL, "conv2d by channels");
    dt_tensor_release(&t);
    t = s_op("conv2d", 3, (dt_tensor *[]){xp, wr, bo}, &attrs, "partial with bias");
    s_expect_placements(e, t, pr, "conv2d of a Partial input with a bias");
    s_check(t, DT_FLOAT32, 4, os, want, S_TOL, "conv2d of a Partial input with a bias");
    dt_tensor_release(&t);
    /* 16-bit inputs compute in float32: a float16 input of exact values gives the float32 result
     * rounded once */
    dt_tensor *h[3] = {s_op("to", 1, &xr, &(dt_op_attrs){.nints = 1, .ints = {DT_FLOAT16}}, "to"),
                       s_op("to", 1, &wr, &(dt_op_attrs){.nints = 1, .ints = {DT_FLOAT16}}, "to"), NULL};
    dt_tensor *hy = s_op("conv2d", 2, h, &attrs, "float16");
    dt_tensor *hy32 = s_op("to", 1, &hy, &(dt_op_attrs){.nints = 1, .ints = {DT_FLOAT32}}, "to");
    s_conv_ref(x, xs, w, ws, NULL, params[0], want, os);
    s_check(hy32, DT_FLOAT32, 4, os, want, 1e-3, "conv2d in float16");
    /* refused at the call: channels that do not match, a kernel larger than the padded input */
    dt_tensor *w3 = s_make(e, DT_FLOAT32, 4, (int64_t[]){6, 3, 3, 3}, w, pr);
    s_expect_refused("conv2d", 2, (dt_tensor *[]){xr, w3}, &attrs, DT_EINVAL, "to have 3 channels, but got 4");
    dt_op_attrs big = attrs;
    big.ints[6] = big.ints[7] = 4;
    s_expect_refused("conv2d", 2, (dt_tensor *[]){xr, wr}, &big, DT_EINVAL, "Kernel size can't be greater");
    s_expect_refused("conv2d", 2, (dt_tensor *[]){xr, h[1]}, &attrs, DT_ETYPE, "should be the same");
    dt_tensor *all[] = {xr, xb, xp, wr, wo, bo, h[0], h[1], hy, hy32, w3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_release(&all[i]);
}

/* y = group_norm(x (N, C, S) in G groups) times w plus b (NULL: none), in double. */
static void s_group_norm_ref(const double *x, int64_t N, int64_t C, int64_t S, int64_t G, const double *w,
                             const double *b, double eps, double *y)
{
    int64_t n = C / G * S;
    for (int64_t i = 0; i < N * G; i++) {
        const double *xg = x + i * n;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < n; j++)
            mean += xg[j] / (double)n;
        for (int64_t j = 0; j < n; j++)
            var += (xg[j] - mean) * (xg[j] - mean) / (double)n;
        for (int64_t j = 0; j < n; j++) {
            int64_t c = (i % G) * (C / G) + j / S;
            y[i * n + j] = (xg[j] - mean) / sqrt(var + eps) * (w ? w[c] : 1) + (b ? b[c] : 0);
        }
    }
}

S_SCENARIO(image, group_norm)
{
    static double x[3 * 6 * 2 * 5], want[180], w[6], b[6];
    s_fill(x, 180, 0);
    for (int i = 0; i < 6; i++) {
        w[i] = 0.5 + (double)(i % 4) * 0.25;
        b[i] = (double)(i % 3 - 1) * 0.125;
    }
    s_layout lx[8], l1[8];
    int nx = s_layouts(e, 4, DT_REDUCE_SUM, lx), n1 = s_layouts(e, 1, -1, l1);
    for (int batch = 0; batch < 2; batch++) {
        int64_t xs[4] = {batch ? 1 : 3, 6, 2, 5};
        for (int l = 0; l < nx; l++) {
            char what[96], ln[32];
            s_layout_name(e, lx[l].pl, ln, sizeof ln);
            snprintf(what, sizeof what, "N=%lld [%s]", (long long)xs[0], ln);
            dt_tensor *t = s_make(e, DT_FLOAT32, 4, xs, x, lx[l].pl);
            dt_tensor *tw = s_make(e, DT_FLOAT32, 1, (int64_t[]){6}, w, l1[l % n1].pl);
            dt_tensor *tb = s_make(e, DT_FLOAT32, 1, (int64_t[]){6}, b, l1[(l + 1) % n1].pl);
            s_group_norm_ref(x, xs[0], 6, 10, 3, w, b, 1e-5, want);
            s_expect("group_norm", 3, (dt_tensor *[]){t, tw, tb},
                     &(dt_op_attrs){.nints = 2, .ints = {3, 3}, .nfloats = 1, .floats = {1e-5}}, DT_FLOAT32, 4, xs,
                     want, 1e-4, what);
            s_group_norm_ref(x, xs[0], 6, 10, 2, NULL, b, 1e-3, want);
            s_expect("group_norm", 2, (dt_tensor *[]){t, tb},
                     &(dt_op_attrs){.nints = 2, .ints = {2, 2}, .nfloats = 1, .floats = {1e-3}}, DT_FLOAT32, 4, xs,
                     want, 1e-4, what);
            s_group_norm_ref(x, xs[0], 6, 10, 6, w, NULL, 1e-5, want);
            s_expect("group_norm", 2, (dt_tensor *[]){t, tw},
                     &(dt_op_attrs){.nints = 2, .ints = {6, 1}, .nfloats = 1, .floats = {1e-5}}, DT_FLOAT32, 4, xs,
                     want, 1e-4, what);
            s_group_norm_ref(x, xs[0], 6, 10, 1, NULL, NULL, 1e-5, want);
            dt_tensor *y = s_op("group_norm", 1, &t,
                                &(dt_op_attrs){.nints = 2, .ints = {1, 0}, .nfloats = 1, .floats = {1e-5}}, what);
            s_check(y, DT_FLOAT32, 4, xs, want, 1e-4, what);
            if (lx[l].pl[0].kind == DT_SHARD && lx[l].pl[0].dim == 0)
                cr_expect(dt_tensor_placements(y)[0].kind == DT_SHARD, "%s: the batch shard stays", what);
            dt_tensor_release(&y);
            s_expect_refused("group_norm", 1, &t, &(dt_op_attrs){.nints = 2, .ints = {4, 0}, .nfloats = 1},
                             DT_EINVAL, "divisible by num_groups");
            s_expect_refused("group_norm", 2, (dt_tensor *[]){t, t},
                             &(dt_op_attrs){.nints = 2, .ints = {3, 1}, .nfloats = 1}, DT_EINVAL, "weight");
            dt_tensor_release(&t);
            dt_tensor_release(&tw);
            dt_tensor_release(&tb);
        }
    }
}

/* One axis of torch's upsampling: the float32 source position of output o (mode 0 nearest, 1
 * linear, 2 nearest-exact), split into two taps and the second's weight. */
static void s_axis_ref(int64_t in, int64_t out, int mode, bool align, double factor, int64_t o, int64_t *i0,
                       int64_t *i1, double *l1)
{
    float scale = mode == 1 && align ? (out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f)
                  : factor > 0       ? (float)(1.0 / factor)
                                     : (float)in / (float)out;
    *l1 = 0;
    if (mode == 0 || mode == 2) {
        float src = mode == 0 ? scale * (float)o : scale * ((float)o + 0.5f);
        *i0 = *i1 = (int64_t)floorf(src) < in - 1 ? (int64_t)floorf(src) : in - 1;
        return;
    }
    if (in == out) {
        *i0 = *i1 = o;
        return;
    }
    float src = align ? scale * (float)o : scale * ((float)o + 0.5f) - 0.5f;
    if (src < 0)
        src = 0;
    int64_t h = (int64_t)floorf(src) < in - 1 ? (int64_t)floorf(src) : in - 1;
    *i0 = h;
    *i1 = h < in - 1 ? h + 1 : h;
    *l1 = (double)(src - (float)h);
}

S_SCENARIO(image, interpolate)
{
    /* (mode, align_corners, OH, OW, scale_h, scale_w) on x (2, 3, 4, 5) */
    static const double cases[][6] = {{0, 0, 7, 3, 0, 0}, {0, 0, 8, 10, 2, 2}, {0, 0, 6, 7, 1.5, 1.5},
                                      {1, 0, 6, 7, 0, 0}, {1, 1, 3, 8, 0, 0},   {1, 0, 8, 10, 2, 2},
                                      {1, 0, 4, 9, 0, 0}, {2, 0, 6, 3, 0, 0},   {1, 1, 1, 1, 0, 0}};
    static const int ncases = sizeof cases / sizeof cases[0];
    static double x[120], want[2 * 3 * 8 * 10];
    s_fill(x, 120, 0);
    int64_t xs[4] = {2, 3, 4, 5};
    s_layout lx[8];
    int nx = s_layouts(e, 4, DT_REDUCE_SUM, lx);
    for (int l = 0; l < nx; l++) {
        dt_tensor *t = s_make(e, DT_FLOAT32, 4, xs, x, lx[l].pl);
        for (int q = 0; q < ncases; q++) {
            const double *c = cases[q];
            int mode = (int)c[0];
            int64_t os[4] = {2, 3, (int64_t)c[2], (int64_t)c[3]};
            for (int64_t p = 0; p < 6; p++)
                for (int64_t i = 0; i < os[2]; i++)
                    for (int64_t j = 0; j < os[3]; j++) {
                        int64_t h0, h1, w0, w1;
                        double lh, lw;
                        s_axis_ref(4, os[2], mode, c[1] != 0, c[4], i, &h0, &h1, &lh);
                        s_axis_ref(5, os[3], mode, c[1] != 0, c[5], j, &w0, &w1, &lw);
                        const double *xp = x + p * 20;
                        want[(p * os[2] + i) * os[3] + j] =
                            (1 - lh) * ((1 - lw) * xp[h0 * 5 + w0] + lw * xp[h0 * 5 + w1]) +
                            lh * ((1 - lw) * xp[h1 * 5 + w0] + lw * xp[h1 * 5 + w1]);
                    }
            char what[96], ln[32];
            s_layout_name(e, lx[l].pl, ln, sizeof ln);
            snprintf(what, sizeof what, "case %d [%s]", q, ln);
            dt_op_attrs attrs = {.nints = 4, .ints = {mode, (int64_t)c[1], os[2], os[3]}, .nfloats = 2,
                                 .floats = {c[4], c[5]}};
            s_expect("interpolate", 1, &t, &attrs, DT_FLOAT32, 4, os, want, mode == 1 ? S_TOL : 0, what);
        }
        /* 3-D: (N, C, L) linear and nearest on the last dim */
        dt_placement p3[2] = {lx[l].pl[0], lx[l].pl[1]};
        for (int m = 0; m < 2; m++)
            if (p3[m].kind == DT_SHARD && p3[m].dim == 3)
                p3[m] = dt_shard(2);
        dt_tensor *t3 = s_make(e, DT_FLOAT32, 3, (int64_t[]){2, 3, 20}, x, p3);
        for (int mode = 0; mode < 2; mode++) {
            for (int64_t p = 0; p < 6; p++)
                for (int64_t j = 0; j < 9; j++) {
                    int64_t w0, w1;
                    double lw;
                    s_axis_ref(20, 9, mode, false, 0, j, &w0, &w1, &lw);
                    want[p * 9 + j] = (1 - lw) * x[p * 20 + w0] + lw * x[p * 20 + w1];
                }
            s_expect("interpolate", 1, &t3, &(dt_op_attrs){.nints = 3, .ints = {mode, 0, 9}, .nfloats = 1},
                     DT_FLOAT32, 3, (int64_t[]){2, 3, 9}, want, S_TOL, "3-D");
        }
        s_expect_refused("interpolate", 1, &t, &(dt_op_attrs){.nints = 4, .ints = {0, 1, 2, 2}, .nfloats = 2},
                         DT_EINVAL, "align_corners");
        s_expect_refused("interpolate", 1, &t, &(dt_op_attrs){.nints = 4, .ints = {1, 0, 0, 2}, .nfloats = 2},
                         DT_EINVAL, "greater than 0");
        dt_tensor_release(&t);
        dt_tensor_release(&t3);
    }
}

/* out = x (shape) padded by pads ((left, right) from the last dim) in mode (0 constant value, 1
 * reflect, 2 replicate), in double. */
static void s_pad_ref(const double *x, int nd, const int64_t *shape, int npairs, const int64_t *pads, int mode,
                      double value, double *out, int64_t *os)
{
    int64_t left[DT_MAX_DIMS] = {0}, idx[DT_MAX_DIMS], src[DT_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        os[d] = shape[d];
    for (int i = 0; i < npairs; i++) {
        left[nd - 1 - i] = pads[2 * i];
        os[nd - 1 - i] += pads[2 * i] + pads[2 * i + 1];
    }
    for (int64_t i = 0; i < s_numel(nd, os); i++) {
        s_unravel(nd, os, i, idx);
        bool inside = true;
        for (int d = 0; d < nd; d++) {
            int64_t s = idx[d] - left[d], n = shape[d];
            if (mode == 1)
                s = s < 0 ? -s : s >= n ? 2 * (n - 1) - s : s;
            else if (mode == 2)
                s = s < 0 ? 0 : s >= n ? n - 1 : s;
            inside = inside && s >= 0 && s < n;
            src[d] = s;
        }
        out[i] = inside ? x[s_ravel(nd, shape, src)] : value;
    }
}

S_SCENARIO(image, pad)
{
    /* (mode, pairs, pads...) on x (3, 4, 5) */
    static const int64_t cases[][8] = {{0, 1, 1, 2},          {0, 2, 1, 2, -1, 1},       {0, 3, 0, 0, 1, 1, 2, 0},
                                       {0, 1, -2, -1},        {1, 1, 2, 1},              {1, 2, 1, 1, 3, 2},
                                       {2, 2, 2, 3, 1, 0},    {2, 1, 0, 4}};
    static const int ncases = sizeof cases / sizeof cases[0];
    static double x[60], want[8 * 6 * 10];
    s_fill(x, 60, 2);
    int64_t xs[3] = {3, 4, 5}, os[3];
    s_layout lx[8];
    int nx = s_layouts(e, 3, DT_REDUCE_SUM, lx);
    for (int l = 0; l < nx; l++) {
        dt_tensor *tf = s_make(e, DT_FLOAT32, 3, xs, x, lx[l].pl), *ti = s_make(e, DT_INT64, 3, xs, x, lx[l].pl);
        for (int q = 0; q < ncases; q++) {
            const int64_t *c = cases[q];
            int npairs = (int)c[1];
            double value = c[0] == 0 ? 1.5 : 0;
            dt_op_attrs attrs = {.nints = 1 + 2 * npairs, .ints = {c[0]}, .nfloats = 1, .floats = {value}};
            memcpy(attrs.ints + 1, c + 2, sizeof *c * (size_t)(2 * npairs));
            char what[96], ln[32];
            s_layout_name(e, lx[l].pl, ln, sizeof ln);
            snprintf(what, sizeof what, "case %d [%s]", q, ln);
            s_pad_ref(x, 3, xs, npairs, c + 2, (int)c[0], value, want, os);
            s_expect("pad", 1, &tf, &attrs, DT_FLOAT32, 3, os, want, 0, what);
            /* int64: the value truncates, as torch's fill of an integer tensor does */
            s_pad_ref(x, 3, xs, npairs, c + 2, (int)c[0], 1, want, os);
            s_expect("pad", 1, &ti, &attrs, DT_INT64, 3, os, want, 0, what);
        }
        dt_tensor_release(&tf);
        dt_tensor_release(&ti);
    }
    /* placements: a shard of a dim not padded stays; constant 0 keeps a Partial(sum), 1.5 reduces it */
    dt_placement R = dt_replicate(), S0 = dt_shard(0), P = dt_partial(DT_REDUCE_SUM);
    dt_tensor *ts = s_make(e, DT_FLOAT32, 3, xs, x, (dt_placement[]){S0, S0});
    dt_tensor *tp = s_make(e, DT_FLOAT32, 3, xs, x, (dt_placement[]){P, R});
    dt_op_attrs zero = {.nints = 3, .ints = {0, 1, 1}, .nfloats = 1};
    dt_tensor *y = s_op("pad", 1, &ts, &zero, "pad");
    s_expect_placements(e, y, (dt_placement[]){S0, S0}, "pad of a batch shard");
    dt_tensor_release(&y);
    y = s_op("pad", 1, &tp, &zero, "pad");
    s_expect_placements(e, y, (dt_placement[]){P, R}, "pad of a Partial with 0");
    s_pad_ref(x, 3, xs, 1, (int64_t[]){1, 1}, 0, 0, want, os);
    s_check(y, DT_FLOAT32, 3, os, want, 0, "pad of a Partial with 0");
    dt_tensor_release(&y);
    zero.floats[0] = 1.5;
    y = s_op("pad", 1, &tp, &zero, "pad");
    s_expect_placements(e, y, (dt_placement[]){R, R}, "pad of a Partial with 1.5");
    dt_tensor_release(&y);
    s_expect_refused("pad", 1, &ts, &(dt_op_attrs){.nints = 3, .ints = {1, 5, 0}}, DT_EINVAL, "less than");
    s_expect_refused("pad", 1, &ts, &(dt_op_attrs){.nints = 2, .ints = {0, 1}, .nfloats = 1}, DT_EINVAL,
                     "divisible by 2");
    s_expect_refused("pad", 1, &ts, &(dt_op_attrs){.nints = 3, .ints = {0, -3, -3}, .nfloats = 1}, DT_EINVAL,
                     "negative output size");
    s_expect_refused("pad", 1, &ts, &(dt_op_attrs){.nints = 7, .ints = {1, 1, 1, 1, 1, 1, 1}}, DT_EUNSUPPORTED,
                     "reflect");
    dt_tensor_release(&ts);
    dt_tensor_release(&tp);
}

/* ---- errors ---------------------------------------------------------------------------------- */

/* dt_op fails with code, names the op in its message and makes nothing. */
static void s_expect_refused(const char *name, int n, dt_tensor *const *in, const dt_op_attrs *a, int code,
                             const char *needle)
{
    dt_tensor *out[2] = {NULL, NULL};
    int rc = dt_op(name, n, in, a, 2, out);
    cr_expect_eq(rc, code, "%s: returned %d, want %d (%s)", name, rc, code, dt_last_error());
    cr_expect_eq(dt_last_error_code(), code, "%s", name);
    cr_expect(strstr(dt_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", name, dt_last_error(), needle);
    cr_expect(out[0] == NULL && out[1] == NULL, "%s made a tensor", name);
    if (out[0])
        dt_tensor_release(&out[0]);
    if (out[1])
        dt_tensor_release(&out[1]);
}

Test(errors, bad_arguments, .timeout = 120)
{
    s_init(DT_WORKERS_THREAD);
    s_env env = s_env_new(1, false);
    const s_env *e = &env;
    dt_placement s0 = dt_shard(0);
    double v[30] = {0};
    dt_tensor *a23 = s_make(e, DT_FLOAT32, 2, (int64_t[]){2, 3}, v, &s0);
    dt_tensor *a45 = s_make(e, DT_FLOAT32, 2, (int64_t[]){4, 5}, v, &s0);
    dt_tensor *v3 = s_make(e, DT_FLOAT32, 1, (int64_t[]){3}, v, &s0);
    dt_tensor *v4 = s_make(e, DT_FLOAT32, 1, (int64_t[]){4}, v, &s0);
    dt_tensor *i23 = s_make(e, DT_INT64, 2, (int64_t[]){2, 3}, v, &s0);
    dt_tensor *c3 = s_make(e, DT_FLOAT32, 3, (int64_t[]){2, 3, 5}, v, &s0);
    s_expect_refused("add", 2, (dt_tensor *[]){a23, a45}, NULL, DT_EINVAL, "add");
    s_expect_refused("mul", 2, (dt_tensor *[]){v3, v4}, NULL, DT_EINVAL, "mul");
    s_expect_refused("mm", 2, (dt_tensor *[]){a23, a45}, NULL, DT_EINVAL, "mm");
    s_expect_refused("mm", 2, (dt_tensor *[]){v3, a45}, NULL, DT_EINVAL, "mm");
    s_expect_refused("matmul", 2, (dt_tensor *[]){v3, v4}, NULL, DT_EINVAL, "matmul");
    s_expect_refused("bmm", 2, (dt_tensor *[]){a23, a23}, NULL, DT_EINVAL, "bmm");
    s_expect_refused("linear", 2, (dt_tensor *[]){a23, a45}, NULL, DT_EINVAL, "linear");
    s_expect_refused("linear", 3, (dt_tensor *[]){a23, a23, v4}, NULL, DT_EINVAL, "linear");
    s_expect_refused("matmul", 2, (dt_tensor *[]){a23, i23}, NULL, DT_ETYPE, "matmul");
    s_expect_refused("embedding", 2, (dt_tensor *[]){a23, a45}, NULL, DT_ETYPE, "embedding");
    s_expect_refused("embedding", 2, (dt_tensor *[]){i23, v4}, NULL, DT_EINVAL, "embedding");
    s_expect_refused("scaled_dot_product_attention", 3, (dt_tensor *[]){a23, a45, a45}, NULL, DT_EINVAL,
                     "scaled_dot_product_attention");
    s_expect_refused("reshape", 1, &a23, &(dt_op_attrs){.nints = 1, .ints = {7}}, DT_EINVAL, "reshape");
    s_expect_refused("flatten", 1, &c3, &(dt_op_attrs){.nints = 2, .ints = {2, 0}}, DT_EINVAL, "flatten");
    s_expect_refused("unsqueeze", 1, &a23, &(dt_op_attrs){.nints = 1, .ints = {5}}, DT_EINDEX, "unsqueeze");
    s_expect_refused("squeeze", 1, &a23, &(dt_op_attrs){.nints = 1, .ints = {3}}, DT_EINDEX, "squeeze");
    s_expect_refused("slice", 1, &a23, &(dt_op_attrs){.nints = 4, .ints = {0, 0, 2, 0}}, DT_EINVAL, "slice");
    s_expect_refused("triu", 1, &v3, NULL, DT_EINVAL, "triu");
    s_expect_refused("tril", 1, &v3, NULL, DT_EINVAL, "tril");
    s_expect_refused("index_select", 2, (dt_tensor *[]){a23, i23}, &(dt_op_attrs){.nints = 2}, DT_EINVAL,
                     "index_select");
    s_expect_refused("masked_fill", 2, (dt_tensor *[]){a23, a23}, &(dt_op_attrs){.has_scalar = true}, DT_ETYPE,
                     "masked_fill");
    s_expect_refused("to", 1, &a23, &(dt_op_attrs){.nints = 1, .ints = {42}}, DT_ETYPE, "to");
    s_expect_refused("amax", 1, &a23, &(dt_op_attrs){.nints = 4, .ints = {0, -1, 1, 1}}, DT_EINVAL, "amax");
    s_expect_refused("argmax", 1, &a23, &(dt_op_attrs){.nints = 2, .ints = {0, 2}}, DT_EINDEX, "argmax");
    s_expect_refused("max_dim", 1, &a23, &(dt_op_attrs){.nints = 2, .ints = {-3, 0}}, DT_EINDEX, "max");
    s_expect_refused("min_dim", 1, &a23, &(dt_op_attrs){.nints = 2, .ints = {2, 0}}, DT_EINDEX, "min");
    s_expect_refused("log_softmax", 1, &i23, &(dt_op_attrs){.nints = 2, .ints = {0, -1}}, DT_ETYPE, "log_softmax");
    s_expect_refused("cumsum", 1, &a23, &(dt_op_attrs){.nints = 2, .ints = {0, 99}}, DT_ETYPE, "cumsum");
    s_expect_refused("rms_norm", 1, &a23, &(dt_op_attrs){.nints = 2, .ints = {0, 4}}, DT_EINVAL, "rms_norm");
    s_expect_refused("div", 1, &a23, NULL, DT_EINVAL, "div");
    /* call-level checks: arity, room for outputs, unknown ops and ids, attribute counts */
    s_expect_refused("neg", 2, (dt_tensor *[]){a23, a23}, NULL, DT_EINVAL, "neg");
    s_expect_refused("cat", 1, &a23, &(dt_op_attrs){.nints = 17}, DT_EINVAL, "cat");
    s_expect_refused("no_such_op", 1, &a23, NULL, DT_EINVAL, "no_such_op");
    dt_tensor *out[2] = {NULL, NULL};
    cr_expect_eq(dt_op("topk", 1, &a23, &(dt_op_attrs){.nints = 4, .ints = {1, -1, 1, 1}}, 1, out), DT_EINVAL);
    cr_expect(strstr(dt_last_error(), "topk") != NULL, "%s", dt_last_error());
    cr_expect_null(out[0]);
    cr_expect_lt(dt_op_id("no_such_op"), 0);
    cr_expect_lt(dt_op_id(NULL), 0);
    /* the ops Python's operators run, by the operators' names (//, %, /, ~, unary -, +) */
    cr_expect_eq(dt_op_id("__floordiv__"), dt_op_id("floor_divide"));
    cr_expect_eq(dt_op_id("__mod__"), dt_op_id("remainder"));
    cr_expect_eq(dt_op_id("__truediv__"), dt_op_id("div"));
    cr_expect_eq(dt_op_id("__invert__"), dt_op_id("logical_not"));
    cr_expect_eq(dt_op_id("__neg__"), dt_op_id("neg"));
    cr_expect_eq(dt_op_id("__add__"), dt_op_id("add"));
    cr_expect_lt(dt_op_id("__no_such_op__"), 0);
    cr_expect_eq(dt_op_run(100000, 1, &a23, NULL, 1, out), DT_EINVAL);
    cr_expect_eq(dt_op_run(-1, 1, &a23, NULL, 1, out), DT_EINVAL);
    cr_expect_null(out[0]);
    /* inputs on two meshes */
    dt_mesh *other = dt_mesh_new("cpu", 1, (int64_t[]){2}, (int64_t[]){2, 3}, NULL);
    cr_assert_not_null(other, "%s", dt_last_error());
    dt_tensor *far = dt_zeros(other, 2, (int64_t[]){2, 3}, DT_FLOAT32, &s0);
    cr_assert_not_null(far, "%s", dt_last_error());
    s_expect_refused("add", 2, (dt_tensor *[]){a23, far}, NULL, DT_EUNSUPPORTED, "add");

    /* dt_op_id + dt_op_run: the same op, looked up once; the runtime still works */
    int id = dt_op_id("add");
    cr_assert_geq(id, 0, "%s", dt_last_error());
    double ones[6] = {1, 1, 1, 1, 1, 1};
    dt_tensor *t = s_make(e, DT_FLOAT32, 2, (int64_t[]){2, 3}, ones, &s0);
    cr_assert_eq(dt_op_run(id, 2, (dt_tensor *[]){t, t}, NULL, 1, out), 1, "%s", dt_last_error());
    s_check(out[0], DT_FLOAT32, 2, (int64_t[]){2, 3}, (double[]){2, 2, 2, 2, 2, 2}, 0, "add by id");
    dt_tensor_release(&out[0]);
    dt_tensor_release(&t);
    dt_tensor_release(&far);
    dt_mesh_release(&other);
    dt_tensor_release(&a23);
    dt_tensor_release(&a45);
    dt_tensor_release(&v3);
    dt_tensor_release(&v4);
    dt_tensor_release(&i23);
    dt_tensor_release(&c3);
    dt_mesh_release(&env.mesh);
    cr_expect_eq(dt_shutdown(), 0);
}

/* A fetch that fails with a message holding needle. */
static void s_expect_fetch_fails(dt_tensor *t, const char *needle, const char *what)
{
    cr_assert_not_null(t, "%s: %s", what, dt_last_error());
    dt_future *f = dt_tensor_fetch(t);
    cr_assert_not_null(f, "%s: %s", what, dt_last_error());
    int rc = dt_future_wait(f, -1);
    cr_expect_eq(rc, DT_EKERNEL, "%s: wait gave %d (%s)", what, rc, dt_last_error());
    cr_expect_lt(dt_future_status(f), 0, "%s", what);
    const char *msg = dt_future_error(f);
    cr_expect(msg && strstr(msg, needle), "%s: error '%s' lacks '%s'", what, msg ? msg : "(none)", needle);
    cr_expect(strstr(dt_last_error(), needle) != NULL, "%s: last error '%s'", what, dt_last_error());
    dt_future_release(&f);
}

static void s_kernel_failure(dt_workers mode, int mesh_ndim)
{
    s_init(mode);
    s_env env = s_env_new(mesh_ndim, false);
    const s_env *e = &env;
    double w[28], bad_idx[6] = {0, 9, 1, 2, 3, 4}, good_idx[6] = {0, 6, 1, 2, 3, 4}, want[24];
    s_fill(w, 28, 0);
    s_layout lay[8], l1[8];
    int nl = s_layouts(e, 2, -1, lay), n1 = s_layouts(e, 1, -1, l1);
    for (int l = 0; l < nl; l++) {
        dt_tensor *tw = s_make(e, DT_FLOAT32, 2, (int64_t[]){7, 4}, w, lay[l].pl);
        dt_tensor *bad = s_make(e, DT_INT64, 2, (int64_t[]){2, 3}, bad_idx, lay[(l + 1) % nl].pl);
        /* the call succeeds (the index is only seen on the devices); the fetch fails */
        dt_tensor *out = s_op("embedding", 2, (dt_tensor *[]){bad, tw}, NULL, "embedding");
        s_expect_fetch_fails(out, "index out of range in embedding", "embedding");
        /* an op on the poisoned result fails with the root message too */
        dt_tensor *next = s_op("mul", 1, &out, &(dt_op_attrs){.has_scalar = true, .scalar = S_INT(2)}, "mul");
        s_expect_fetch_fails(next, "index out of range in embedding", "mul of a failed embedding");
        dt_tensor *sum = s_op("sum", 1, &next, NULL, "sum");
        s_expect_fetch_fails(sum, "index out of range in embedding", "sum of a failed embedding");
        /* the runtime keeps working: the same weight with good indices */
        dt_tensor *good = s_make(e, DT_INT64, 2, (int64_t[]){2, 3}, good_idx, lay[(l + 1) % nl].pl);
        dt_tensor *ok = s_op("embedding", 2, (dt_tensor *[]){good, tw}, NULL, "embedding");
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 4; j++)
                want[i * 4 + j] = w[(int)good_idx[i] * 4 + j];
        s_check(ok, DT_FLOAT32, 3, (int64_t[]){2, 3, 4}, want, 0, "embedding after a failure");
        /* index_select with an index out of range fails the same way */
        dt_tensor *pos = s_make(e, DT_INT64, 1, (int64_t[]){2}, (double[]){1, 7}, l1[l % n1].pl);
        dt_tensor *sel = s_op("index_select", 2, (dt_tensor *[]){tw, pos}, &(dt_op_attrs){.nints = 2, .ints = {0, 1}},
                              "index_select");
        s_expect_fetch_fails(sel, "out of bounds", "index_select");
        cr_expect_eq(dt_synchronize(), 0, "%s", dt_last_error());
        dt_tensor *again = s_op("embedding", 2, (dt_tensor *[]){good, tw}, NULL, "embedding");
        s_check(again, DT_FLOAT32, 3, (int64_t[]){2, 3, 4}, want, 0, "embedding after two failures");
        dt_tensor *all[] = {tw, bad, out, next, sum, good, ok, pos, sel, again};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            dt_tensor_release(&all[i]);
    }
    dt_mesh_release(&env.mesh);
    cr_expect_eq(dt_shutdown(), 0);
}

Test(errors, kernel_failure_mesh2_thread, .timeout = 120) { s_kernel_failure(DT_WORKERS_THREAD, 1); }
Test(errors, kernel_failure_mesh2x2_thread, .timeout = 120) { s_kernel_failure(DT_WORKERS_THREAD, 2); }
Test(errors, kernel_failure_mesh2_process, .timeout = 120) { s_kernel_failure(DT_WORKERS_PROCESS, 1); }

static void s_strict(int mesh_ndim)
{
    s_init(DT_WORKERS_THREAD);
    s_env env = s_env_new(mesh_ndim, false);
    const s_env *e = &env;
    double a[12], b[12], want[12];
    s_fill(a, 12, 0);
    s_fill(b, 12, 3);
    for (int i = 0; i < 12; i++)
        want[i] = a[i] + b[i];
    int64_t shape[2] = {3, 4};
    s_layout lay[8];
    s_layouts(e, 2, -1, lay);
    dt_tensor *x = s_make(e, DT_FLOAT32, 2, shape, a, lay[0].pl);
    dt_tensor *y = s_make(e, DT_FLOAT32, 2, shape, b, lay[1].pl);  /* laid out differently */
    dt_tensor *y0 = s_make(e, DT_FLOAT32, 2, shape, b, lay[0].pl); /* laid out alike */
    cr_expect_not(dt_get_strict());
    dt_set_strict(true);
    cr_expect(dt_get_strict());
    /* the placements differ: add needs a redistribute, and strict mode refuses it */
    s_expect_refused("add", 2, (dt_tensor *[]){x, y}, NULL, DT_EUNSUPPORTED, "add");
    cr_expect(strstr(dt_last_error(), "strict") != NULL, "%s", dt_last_error());
    /* softmax along a sharded dim needs it whole */
    dt_placement sl[2] = {dt_shard(1), dt_shard(1)};
    dt_tensor *z = s_make(e, DT_FLOAT32, 2, shape, a, sl);
    s_expect_refused("softmax", 1, &z, &(dt_op_attrs){.nints = 2, .ints = {1, -1}}, DT_EUNSUPPORTED, "softmax");
    /* what needs no redistribute still runs */
    s_expect("add", 2, (dt_tensor *[]){x, y0}, NULL, DT_FLOAT32, 2, shape, want, 0, "strict, alike");
    dt_tensor *r = s_op("sum", 1, &z, &(dt_op_attrs){.nints = 3, .ints = {0, -1, 1}}, "strict sum");
    dt_tensor_release(&r);
    dt_set_strict(false);
    cr_expect_not(dt_get_strict());
    s_expect("add", 2, (dt_tensor *[]){x, y}, NULL, DT_FLOAT32, 2, shape, want, 0, "strict off");
    dt_tensor_release(&x);
    dt_tensor_release(&y);
    dt_tensor_release(&y0);
    dt_tensor_release(&z);
    dt_mesh_release(&env.mesh);
    cr_expect_eq(dt_shutdown(), 0);
}

Test(errors, strict_mesh2_thread, .timeout = 120) { s_strict(1); }
Test(errors, strict_mesh2x2_thread, .timeout = 120) { s_strict(2); }

/* ---- coverage -------------------------------------------------------------------------------- */

/* Every op the registry holds has a test entry (s_tests), and every entry names a registered op. */
Test(coverage, every_registered_op)
{
    for (int i = 0; i < op_count(); i++) {
        const op_def *def = op_nth(i);
        cr_expect(s_test_of(def->name) != NULL, "op %s has no test entry in test_ops.c (s_tests)", def->name);
        cr_expect_eq(dt_op_id(def->name), def->id, "dt_op_id(%s)", def->name);
        cr_expect_eq(op_by_id(def->id), def, "op_by_id(%d)", def->id);
    }
    for (size_t i = 0; i < S_NTESTS; i++)
        cr_expect(op_find(s_tests[i].op) != NULL, "test entry %s names no registered op", s_tests[i].op);
}
