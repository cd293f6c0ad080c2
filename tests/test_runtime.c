/* The public C API end to end: every scenario runs once with thread workers and once with
 * dtorch-worker processes, and checks fetched values against references computed here. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtorch.h"

#define S_INT(v) ((dt_scalar){.is_int = true, .i = (v)})
#define S_FLT(v) ((dt_scalar){.is_int = false, .f = (v)})
#define S_SHARD(d) {DT_SHARD, (d), 0}
#define S_REP {DT_REPLICATE, 0, 0}

static const char *s_mode_name(dt_workers mode) { return mode == DT_WORKERS_THREAD ? "thread" : "process"; }

static void s_init(dt_workers mode)
{
    const char *path = getenv("DTORCH_WORKER_PATH");
    cr_assert(mode == DT_WORKERS_THREAD || path, "process workers need DTORCH_WORKER_PATH (meson test sets it)");
    cr_assert_eq(dt_init(&(dt_config){mode, path}), 0, "init(%s): %s", s_mode_name(mode), dt_last_error());
}

/* Declares a scenario and one Criterion test per worker mode; each ends with a clean shutdown. */
#define S_BOTH(suite, name)                                                                                  \
    static void s_case_##name(dt_workers mode);                                                                   \
    Test(suite, name##_thread, .timeout = 120)                                                                \
    {                                                                                                        \
        s_init(DT_WORKERS_THREAD);                                                                           \
        s_case_##name(DT_WORKERS_THREAD);                                                                         \
        cr_expect_eq(dt_shutdown(), 0);                                                                      \
    }                                                                                                        \
    Test(suite, name##_process, .timeout = 120)                                                               \
    {                                                                                                        \
        s_init(DT_WORKERS_PROCESS);                                                                          \
        s_case_##name(DT_WORKERS_PROCESS);                                                                        \
        cr_expect_eq(dt_shutdown(), 0);                                                                      \
    }                                                                                                        \
    static void s_case_##name(dt_workers mode)

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static dt_mesh *s_mesh(int ndim, const int64_t *shape, const int64_t *ids)
{
    dt_mesh *m = dt_mesh_new("cpu", ndim, shape, ids, NULL);
    cr_assert_not_null(m, "mesh: %s", dt_last_error());
    return m;
}

/* Fetches t's full value and waits for it. */
static dt_future *s_fetch(dt_tensor *t)
{
    cr_assert_not_null(t, "making the tensor failed: %s", dt_last_error());
    dt_future *f = dt_tensor_fetch(t);
    cr_assert_not_null(f, "fetch: %s", dt_last_error());
    cr_assert_eq(dt_future_wait(f, -1), 0, "fetch: %s", dt_last_error());
    cr_assert_eq(dt_future_status(f), 0);
    cr_assert_null(dt_future_error(f));
    cr_assert_eq(dt_future_npieces(f), 1);
    return f;
}

/* Checks a ready full value's dtype, shape and bytes, element by element. */
static void s_expect_value(const dt_future *f, dt_dtype dtype, int ndim, const int64_t *shape, const void *want,
                           const char *what)
{
    cr_expect_eq(dt_future_dtype(f), dtype, "%s: dtype", what);
    cr_assert_eq(dt_future_ndim(f), ndim, "%s: ndim", what);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        cr_expect_eq(dt_future_shape(f, 0)[d], shape[d], "%s: size of dim %d", what, d);
        n *= shape[d];
    }
    size_t elem = dt_dtype_size(dtype);
    const unsigned char *got = dt_future_data(f, 0);
    cr_assert_not_null(got, "%s: no data", what);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(got + i * elem, (const unsigned char *)want + i * elem, elem) != 0) {
            cr_expect_fail("%s: element %lld differs", what, (long long)i);
            return;
        }
}

/* ---- runtime lifecycle ---------------------------------------------------------------------- */

/* A full(2, 3.0) on devices 0 and 1, fetched and checked. */
static void s_check_op_works(const char *when)
{
    dt_mesh *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){0, 1});
    dt_placement s0 = dt_shard(0);
    dt_tensor *t = dt_full(mesh, 1, (int64_t[]){3}, DT_FLOAT32, &s0, S_FLT(3.0));
    dt_future *f = s_fetch(t);
    s_expect_value(f, DT_FLOAT32, 1, (int64_t[]){3}, (float[]){3, 3, 3}, when);
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

S_BOTH(lifecycle, start_stop_restart)
{
    dt_workers other = mode == DT_WORKERS_THREAD ? DT_WORKERS_PROCESS : DT_WORKERS_THREAD;
    cr_assert(dt_is_running());
    cr_expect_eq(dt_current_workers(), mode);
    s_check_op_works("first runtime");

    dt_mesh *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){0, 1});
    dt_tensor *old = dt_ones(mesh, 1, (int64_t[]){4}, DT_INT64, NULL);
    cr_assert_not_null(old, "%s", dt_last_error());
    cr_assert_eq(dt_shutdown(), 0);
    cr_expect_not(dt_is_running());
    cr_expect_eq(dt_shutdown(), 0, "a second shutdown is a no-op");
    cr_expect_null(dt_tensor_fetch(old), "fetch of a tensor from before shutdown");
    cr_expect_eq(dt_last_error_code(), DT_ESHUTDOWN);

    /* restart in the other mode, then in this one again: old stays dead in both */
    s_init(other);
    cr_expect(dt_is_running());
    cr_expect_eq(dt_current_workers(), other);
    s_check_op_works("second runtime");
    cr_expect_null(dt_tensor_fetch(old), "fetch of a tensor from an earlier runtime");
    cr_expect_eq(dt_last_error_code(), DT_ESHUTDOWN);
    cr_assert_eq(dt_shutdown(), 0);

    s_init(mode);
    s_check_op_works("third runtime");
    dt_tensor_release(&old);
    dt_mesh_release(&mesh);
}

S_BOTH(lifecycle, init_other_mode_while_running)
{
    dt_workers other = mode == DT_WORKERS_THREAD ? DT_WORKERS_PROCESS : DT_WORKERS_THREAD;
    cr_expect_eq(dt_init(&(dt_config){other, getenv("DTORCH_WORKER_PATH")}), DT_EINVAL);
    cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    cr_expect_eq(dt_init(&(dt_config){mode, getenv("DTORCH_WORKER_PATH")}), 0, "same mode again is fine");
    cr_expect_eq(dt_init(&(dt_config){(dt_workers)7, NULL}), DT_EINVAL, "unknown mode");
    cr_expect(dt_is_running());
    cr_expect_eq(dt_current_workers(), mode);
    s_check_op_works("after the refused inits");
}

/* No dt_init: DTORCH_WORKERS picks the mode and the first op starts the runtime. */
static void s_lazy_start(const char *env, dt_workers mode)
{
    cr_assert_eq(setenv("DTORCH_WORKERS", env, 1), 0);
    cr_expect_not(dt_is_running());
    cr_expect_eq(dt_current_workers(), mode);
    cr_expect_eq(dt_synchronize(), 0, "synchronize with no runtime");
    cr_expect_not(dt_is_running(), "synchronize must not start the runtime");
    s_check_op_works("lazily started runtime");
    cr_expect(dt_is_running());
    cr_expect_eq(dt_current_workers(), mode);
    cr_expect_eq(dt_shutdown(), 0);
}

Test(lifecycle, lazy_start_thread, .timeout = 120) { s_lazy_start("thread", DT_WORKERS_THREAD); }

Test(lifecycle, lazy_start_process, .timeout = 120)
{
    cr_assert_not_null(getenv("DTORCH_WORKER_PATH"), "process workers need DTORCH_WORKER_PATH");
    s_lazy_start("process", DT_WORKERS_PROCESS);
}

/* ---- factories ------------------------------------------------------------------------------ */

typedef struct {
    int ndim;
    int64_t shape[2];
    int64_t ids[4];
    dt_placement pl[2];
} s_layout;

/* Meshes of 1 to 4 devices and 2x2, with uneven and empty shards for 6 and 5 rows over 4. */
static const s_layout s_layouts_2d[] = {
    {1, {1}, {0}, {S_SHARD(0)}},
    {1, {2}, {1, 0}, {S_SHARD(1)}},
    {1, {3}, {0, 1, 2}, {S_SHARD(0)}},
    {1, {3}, {2, 0, 1}, {S_SHARD(-1)}},
    {1, {4}, {0, 1, 2, 3}, {S_SHARD(0)}},
    {1, {4}, {0, 1, 2, 3}, {S_REP}},
    {2, {2, 2}, {0, 1, 2, 3}, {S_SHARD(0), S_SHARD(1)}},
    {2, {2, 2}, {3, 2, 1, 0}, {S_SHARD(0), S_SHARD(0)}},
    {2, {2, 2}, {0, 1, 2, 3}, {S_REP, S_SHARD(0)}},
    {2, {2, 2}, {0, 1, 2, 3}, {S_SHARD(1), S_REP}},
};
#define S_NLAYOUTS_2D (sizeof s_layouts_2d / sizeof s_layouts_2d[0])

/* Layouts a 1-D tensor can take. */
static const s_layout s_layouts_1d[] = {
    {1, {1}, {0}, {S_SHARD(0)}},
    {1, {2}, {0, 1}, {S_SHARD(0)}},
    {1, {3}, {0, 1, 2}, {S_SHARD(0)}},
    {1, {4}, {0, 1, 2, 3}, {S_SHARD(-1)}},
    {1, {4}, {0, 1, 2, 3}, {S_REP}},
    {2, {2, 2}, {0, 1, 2, 3}, {S_SHARD(0), S_SHARD(0)}},
    {2, {2, 2}, {0, 1, 2, 3}, {S_REP, S_SHARD(0)}},
    {2, {2, 2}, {0, 1, 2, 3}, {S_SHARD(0), S_REP}},
};
#define S_NLAYOUTS_1D (sizeof s_layouts_1d / sizeof s_layouts_1d[0])

static dt_mesh *s_layout_mesh(const s_layout *l) { return s_mesh(l->ndim, l->shape, l->ids); }

/* Checks t's value against n copies of one element. */
static void s_expect_filled(dt_tensor *t, dt_dtype dtype, int ndim, const int64_t *shape, const void *elem,
                            const char *what)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    size_t size = dt_dtype_size(dtype);
    unsigned char *want = malloc((size_t)n * size + 1);
    for (int64_t i = 0; i < n; i++)
        memcpy(want + i * size, elem, size);
    dt_future *f = s_fetch(t);
    s_expect_value(f, dtype, ndim, shape, want, what);
    dt_future_release(&f);
    free(want);
}

S_BOTH(factories, fills)
{
    static const int64_t shapes[3][2] = {{6, 5}, {5, 3}, {0, 3}};
    for (size_t l = 0; l < S_NLAYOUTS_2D; l++) {
        dt_mesh *mesh = s_layout_mesh(&s_layouts_2d[l]);
        const dt_placement *pl = s_layouts_2d[l].pl;
        for (int s = 0; s < 3; s++) {
            char what[64];
            snprintf(what, sizeof what, "layout %zu shape (%lld,%lld)", l, (long long)shapes[s][0],
                     (long long)shapes[s][1]);
            dt_tensor *t = dt_full(mesh, 2, shapes[s], DT_FLOAT32, pl, S_FLT(2.5));
            s_expect_filled(t, DT_FLOAT32, 2, shapes[s], &(float){2.5f}, what);
            dt_tensor_release(&t);
            t = dt_full(mesh, 2, shapes[s], DT_INT64, pl, S_INT(-7));
            s_expect_filled(t, DT_INT64, 2, shapes[s], &(int64_t){-7}, what);
            dt_tensor_release(&t);
            t = dt_zeros(mesh, 2, shapes[s], DT_FLOAT32, pl);
            s_expect_filled(t, DT_FLOAT32, 2, shapes[s], &(float){0.0f}, what);
            dt_tensor_release(&t);
            t = dt_ones(mesh, 2, shapes[s], DT_INT32, pl);
            s_expect_filled(t, DT_INT32, 2, shapes[s], &(int32_t){1}, what);
            dt_tensor_release(&t);
        }
        dt_mesh_release(&mesh);
    }
}

S_BOTH(factories, tensor_metadata)
{
    dt_mesh *mesh = s_mesh(2, (int64_t[]){2, 2}, (int64_t[]){0, 1, 2, 3});
    dt_tensor *t = dt_zeros(mesh, 2, (int64_t[]){5, 3}, DT_FLOAT32, (dt_placement[]){dt_shard(-1), dt_replicate()});
    cr_assert_not_null(t, "%s", dt_last_error());
    cr_expect_eq(dt_tensor_ndim(t), 2);
    cr_expect(dt_tensor_shape(t)[0] == 5 && dt_tensor_shape(t)[1] == 3);
    cr_expect_eq(dt_tensor_numel(t), 15);
    cr_expect_eq(dt_tensor_dtype(t), DT_FLOAT32);
    cr_expect_eq(dt_tensor_mesh(t), mesh);
    cr_expect(dt_tensor_placements(t)[0].kind == DT_SHARD && dt_tensor_placements(t)[0].dim == 1,
              "Shard(-1) is stored normalised");
    cr_expect_eq(dt_tensor_placements(t)[1].kind, DT_REPLICATE);
    /* columns 2|1 along mesh dim 0, whole along mesh dim 1 */
    int64_t shape[2], offset[2];
    cr_expect_eq(dt_tensor_local_block(t, 3, shape, offset), 0);
    cr_expect(shape[0] == 5 && shape[1] == 1 && offset[0] == 0 && offset[1] == 2);
    cr_expect_eq(dt_tensor_local_block(t, 4, shape, offset), DT_EINDEX);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

S_BOTH(factories, arange)
{
    for (size_t l = 0; l < S_NLAYOUTS_1D; l++) {
        dt_mesh *mesh = s_layout_mesh(&s_layouts_1d[l]);
        const dt_placement *pl = s_layouts_1d[l].pl;
        char what[32];
        snprintf(what, sizeof what, "layout %zu", l);

        /* ceil((10 - 0.5) / 0.75) = 13 values */
        float fwant[13];
        for (int i = 0; i < 13; i++)
            fwant[i] = (float)(0.5 + i * 0.75);
        dt_tensor *t = dt_arange(mesh, S_FLT(0.5), S_INT(10), S_FLT(0.75), DT_FLOAT32, pl);
        dt_future *f = s_fetch(t);
        s_expect_value(f, DT_FLOAT32, 1, (int64_t[]){13}, fwant, what);
        dt_future_release(&f);
        dt_tensor_release(&t);

        /* ceil(23 / 2) = 12 values */
        int64_t iwant[12];
        for (int i = 0; i < 12; i++)
            iwant[i] = -3 + 2 * i;
        t = dt_arange(mesh, S_INT(-3), S_INT(20), S_INT(2), DT_INT64, pl);
        f = s_fetch(t);
        s_expect_value(f, DT_INT64, 1, (int64_t[]){12}, iwant, what);
        dt_future_release(&f);
        dt_tensor_release(&t);

        t = dt_arange(mesh, S_INT(10), S_INT(0), S_INT(-3), DT_INT64, pl);
        f = s_fetch(t);
        s_expect_value(f, DT_INT64, 1, (int64_t[]){4}, (int64_t[]){10, 7, 4, 1}, what);
        dt_future_release(&f);
        dt_tensor_release(&t);

        t = dt_arange(mesh, S_INT(5), S_INT(5), S_INT(1), DT_INT64, pl);
        f = s_fetch(t);
        s_expect_value(f, DT_INT64, 1, (int64_t[]){0}, iwant, what);
        dt_future_release(&f);
        dt_tensor_release(&t);
        dt_mesh_release(&mesh);
    }
}

/* Seeds, makes a (rows, cols) random tensor on layout l and returns its fetched value. */
static dt_future *s_random_on(const s_layout *l, bool normal, uint64_t seed)
{
    dt_mesh *mesh = s_layout_mesh(l);
    dt_manual_seed(seed);
    int64_t shape[2] = {37, 29};
    dt_tensor *t = normal ? dt_randn(mesh, 2, shape, DT_FLOAT32, l->pl) : dt_rand(mesh, 2, shape, DT_FLOAT32, l->pl);
    dt_future *f = s_fetch(t);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
    return f;
}

S_BOTH(factories, random_is_placement_invariant)
{
    static const size_t layouts[3] = {0, 4, 6}; /* one device; 4 devices Shard(0); 2x2 [Shard(0), Shard(1)] */
    const size_t bytes = 37 * 29 * sizeof(float);
    for (int normal = 0; normal < 2; normal++) {
        dt_future *first = s_random_on(&s_layouts_2d[layouts[0]], normal, 1234);
        for (int i = 1; i < 3; i++) {
            dt_future *f = s_random_on(&s_layouts_2d[layouts[i]], normal, 1234);
            cr_expect_eq(memcmp(dt_future_data(f, 0), dt_future_data(first, 0), bytes), 0,
                         "%s: layout %zu differs from one device", normal ? "randn" : "rand", layouts[i]);
            dt_future_release(&f);
        }
        dt_future *other = s_random_on(&s_layouts_2d[layouts[1]], normal, 1235);
        cr_expect_neq(memcmp(dt_future_data(other, 0), dt_future_data(first, 0), bytes), 0,
                      "another seed gives the same values");
        dt_future_release(&other);
        dt_future_release(&first);
    }
}

S_BOTH(factories, random_stream_advances)
{
    dt_mesh *mesh = s_mesh(1, (int64_t[]){3}, (int64_t[]){0, 1, 2});
    dt_placement s0 = dt_shard(0);
    int64_t shape[1] = {4096};
    dt_manual_seed(7);
    dt_tensor *a = dt_rand(mesh, 1, shape, DT_FLOAT32, &s0);
    dt_tensor *b = dt_rand(mesh, 1, shape, DT_FLOAT32, &s0);
    dt_future *fa = s_fetch(a), *fb = s_fetch(b);
    cr_expect_neq(memcmp(dt_future_data(fa, 0), dt_future_data(fb, 0), sizeof(float) * 4096), 0,
                  "the second rand after a seed repeats the first");
    /* the same seed sequence again gives the same pair */
    dt_manual_seed(7);
    dt_tensor *a2 = dt_rand(mesh, 1, shape, DT_FLOAT32, &s0);
    dt_tensor *b2 = dt_rand(mesh, 1, shape, DT_FLOAT32, &s0);
    dt_future *fa2 = s_fetch(a2), *fb2 = s_fetch(b2);
    cr_expect_eq(memcmp(dt_future_data(fa, 0), dt_future_data(fa2, 0), sizeof(float) * 4096), 0);
    cr_expect_eq(memcmp(dt_future_data(fb, 0), dt_future_data(fb2, 0), sizeof(float) * 4096), 0);

    const float *u = dt_future_data(fa, 0);
    double sum = 0;
    for (int i = 0; i < 4096; i++) {
        cr_expect(u[i] >= 0.0f && u[i] < 1.0f, "rand element %d = %g is outside [0, 1)", i, u[i]);
        sum += u[i];
    }
    /* sd of the mean of 4096 uniforms is 0.0045: 0.05 is far outside chance for a fixed seed */
    cr_expect(fabs(sum / 4096 - 0.5) < 0.05, "rand mean %g", sum / 4096);

    dt_future_release(&fa);
    dt_future_release(&fb);
    dt_future_release(&fa2);
    dt_future_release(&fb2);
    dt_tensor_release(&a);
    dt_tensor_release(&b);
    dt_tensor_release(&a2);
    dt_tensor_release(&b2);
    dt_mesh_release(&mesh);
}

S_BOTH(factories, randn_moments)
{
    dt_mesh *mesh = s_mesh(2, (int64_t[]){2, 2}, (int64_t[]){0, 1, 2, 3});
    dt_manual_seed(99);
    dt_tensor *t = dt_randn(mesh, 2, (int64_t[]){64, 64}, DT_FLOAT32, (dt_placement[]){dt_shard(1), dt_shard(0)});
    dt_future *f = s_fetch(t);
    const float *z = dt_future_data(f, 0);
    double sum = 0, sq = 0;
    for (int i = 0; i < 4096; i++) {
        cr_expect(isfinite(z[i]), "randn element %d is %g", i, z[i]);
        sum += z[i];
        sq += (double)z[i] * z[i];
    }
    double mean = sum / 4096, var = sq / 4096 - mean * mean;
    cr_expect(fabs(mean) < 0.1, "randn mean %g", mean);
    cr_expect(var > 0.85 && var < 1.15, "randn variance %g", var);
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

/* ---- distribute ----------------------------------------------------------------------------- */

/* Distributes a (7,5) array given by data/strides on every 2-D layout and fetches it back. */
static void s_roundtrip(const void *data, const int64_t *strides, dt_dtype dtype, const void *want, const char *what)
{
    int64_t shape[2] = {7, 5};
    for (size_t l = 0; l < S_NLAYOUTS_2D; l++) {
        dt_mesh *mesh = s_layout_mesh(&s_layouts_2d[l]);
        dt_tensor *t = dt_distribute(mesh, data, 2, shape, strides, dtype, s_layouts_2d[l].pl);
        cr_assert_not_null(t, "%s layout %zu: %s", what, l, dt_last_error());
        dt_future *f = s_fetch(t);
        char label[64];
        snprintf(label, sizeof label, "%s layout %zu", what, l);
        s_expect_value(f, dtype, 2, shape, want, label);
        dt_future_release(&f);
        dt_tensor_release(&t);
        dt_mesh_release(&mesh);
    }
}

S_BOTH(distribute, roundtrip)
{
    float f32[7][5], f32_t[5][7];
    int64_t i64[7][5], i64_t[5][7];
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < 5; j++) {
            f32[i][j] = f32_t[j][i] = (float)(i * 10 + j) + 0.25f;
            i64[i][j] = i64_t[j][i] = -(int64_t)(i * 1000003 + j) * 65537;
        }
    s_roundtrip(f32, NULL, DT_FLOAT32, f32, "float32");
    s_roundtrip(i64, NULL, DT_INT64, i64, "int64");
    /* the transpose of a (5,7) array: element (i,j) is at byte i*elem + j*7*elem */
    s_roundtrip(f32_t, (int64_t[]){sizeof(float), 7 * sizeof(float)}, DT_FLOAT32, f32, "float32 transposed");
    s_roundtrip(i64_t, (int64_t[]){sizeof(int64_t), 7 * sizeof(int64_t)}, DT_INT64, i64, "int64 transposed");
    /* every second row of a (14,5) array */
    float tall[14][5];
    for (int i = 0; i < 14; i++)
        for (int j = 0; j < 5; j++)
            tall[i][j] = i % 2 ? -1.0f : f32[i / 2][j];
    s_roundtrip(tall, (int64_t[]){10 * sizeof(float), sizeof(float)}, DT_FLOAT32, f32, "float32 row-strided");
}

typedef struct {
    int64_t shape[2];
    int64_t offset[2];
} s_block;

/* Checks every device's piece of a (7,5) int64 tensor against hand-computed blocks. */
static void s_expect_locals(const s_layout *l, const s_block *blocks, const int64_t (*src)[5])
{
    dt_mesh *mesh = s_layout_mesh(l);
    int64_t n = dt_mesh_size(mesh);
    dt_tensor *t = dt_distribute(mesh, src, 2, (int64_t[]){7, 5}, NULL, DT_INT64, l->pl);
    cr_assert_not_null(t, "%s", dt_last_error());
    dt_future *f = dt_tensor_fetch_locals(t);
    cr_assert_not_null(f, "%s", dt_last_error());
    cr_assert_eq(dt_future_wait(f, -1), 0, "%s", dt_last_error());
    cr_assert_eq(dt_future_npieces(f), n);
    for (int p = 0; p < n; p++) {
        int64_t shape[2], offset[2];
        cr_expect_eq(dt_tensor_local_block(t, p, shape, offset), 0);
        cr_expect(shape[0] == blocks[p].shape[0] && shape[1] == blocks[p].shape[1] &&
                      offset[0] == blocks[p].offset[0] && offset[1] == blocks[p].offset[1],
                  "piece %d: local_block (%lld,%lld) at (%lld,%lld)", p, (long long)shape[0], (long long)shape[1],
                  (long long)offset[0], (long long)offset[1]);
        const int64_t *got_shape = dt_future_shape(f, p);
        cr_assert_not_null(got_shape);
        cr_assert(got_shape[0] == blocks[p].shape[0] && got_shape[1] == blocks[p].shape[1],
                  "piece %d has shape (%lld,%lld)", p, (long long)got_shape[0], (long long)got_shape[1]);
        const int64_t *got = dt_future_data(f, p);
        cr_assert_not_null(got);
        for (int64_t i = 0; i < blocks[p].shape[0]; i++)
            for (int64_t j = 0; j < blocks[p].shape[1]; j++)
                cr_expect_eq(got[i * blocks[p].shape[1] + j], src[blocks[p].offset[0] + i][blocks[p].offset[1] + j],
                             "piece %d element (%lld,%lld)", p, (long long)i, (long long)j);
    }
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

S_BOTH(distribute, fetch_locals)
{
    int64_t src[7][5];
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < 5; j++)
            src[i][j] = i * 5 + j;
    /* 2x2 [Shard(0), Shard(1)]: rows 4|3, columns 3|2 */
    s_expect_locals(&s_layouts_2d[6],
                    (s_block[]){{{4, 3}, {0, 0}}, {{4, 2}, {0, 3}}, {{3, 3}, {4, 0}}, {{3, 2}, {4, 3}}}, src);
    /* 3 devices Shard(-1): columns 2|2|1 */
    s_expect_locals(&s_layouts_2d[3], (s_block[]){{{7, 2}, {0, 0}}, {{7, 2}, {0, 2}}, {{7, 1}, {0, 4}}}, src);
    /* 4 devices Shard(0): rows 2|2|2|1 */
    s_expect_locals(&s_layouts_2d[4],
                    (s_block[]){{{2, 5}, {0, 0}}, {{2, 5}, {2, 0}}, {{2, 5}, {4, 0}}, {{1, 5}, {6, 0}}}, src);
    /* 2x2 [Shard(0), Shard(0)]: 4|3 then 4->2|2, 3->2|1 */
    s_expect_locals(&s_layouts_2d[7],
                    (s_block[]){{{2, 5}, {0, 0}}, {{2, 5}, {2, 0}}, {{2, 5}, {4, 0}}, {{1, 5}, {6, 0}}}, src);
    /* 2x2 [Replicate, Shard(0)]: each row of the mesh holds rows 4|3 */
    s_expect_locals(&s_layouts_2d[8],
                    (s_block[]){{{4, 5}, {0, 0}}, {{3, 5}, {4, 0}}, {{4, 5}, {0, 0}}, {{3, 5}, {4, 0}}}, src);
}

S_BOTH(distribute, empty_shards)
{
    /* 2 rows over 4 devices: two devices hold (0,3) pieces */
    float src[2][3] = {{1, 2, 3}, {4, 5, 6}};
    dt_mesh *mesh = s_mesh(1, (int64_t[]){4}, (int64_t[]){0, 1, 2, 3});
    dt_placement s0 = dt_shard(0);
    dt_tensor *t = dt_distribute(mesh, src, 2, (int64_t[]){2, 3}, NULL, DT_FLOAT32, &s0);
    dt_future *f = s_fetch(t);
    s_expect_value(f, DT_FLOAT32, 2, (int64_t[]){2, 3}, src, "2 rows over 4");
    dt_future_release(&f);
    f = dt_tensor_fetch_locals(t);
    cr_assert_not_null(f, "%s", dt_last_error());
    cr_assert_eq(dt_future_wait(f, -1), 0, "%s", dt_last_error());
    for (int p = 0; p < 4; p++)
        cr_expect(dt_future_shape(f, p)[0] == (p < 2) && dt_future_shape(f, p)[1] == 3, "piece %d", p);
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

/* ---- from_local with Partial ---------------------------------------------------------------- */

/* Builds a Partial(op) tensor over 2 devices from a and b (2x3 floats) and checks op(a, b). */
static void s_expect_partial(dt_mesh *mesh, dt_reduce_op op, const float *a, const float *b, const float *want)
{
    dt_placement p = dt_partial(op);
    const void *pieces[2] = {a, b};
    dt_tensor *t = dt_from_local(mesh, pieces, 2, (int64_t[]){2, 3, 2, 3}, DT_FLOAT32, &p, NULL);
    cr_assert_not_null(t, "reduce op %d: %s", op, dt_last_error());
    cr_expect(dt_tensor_shape(t)[0] == 2 && dt_tensor_shape(t)[1] == 3, "Partial keeps the local shape");
    dt_future *f = s_fetch(t);
    char what[32];
    snprintf(what, sizeof what, "reduce op %d", op);
    s_expect_value(f, DT_FLOAT32, 2, (int64_t[]){2, 3}, want, what);
    dt_future_release(&f);

    /* the pieces stay un-reduced */
    f = dt_tensor_fetch_locals(t);
    cr_assert_eq(dt_future_wait(f, -1), 0, "%s", dt_last_error());
    cr_expect_eq(memcmp(dt_future_data(f, 0), a, 6 * sizeof(float)), 0);
    cr_expect_eq(memcmp(dt_future_data(f, 1), b, 6 * sizeof(float)), 0);
    dt_future_release(&f);
    dt_tensor_release(&t);
}

S_BOTH(from_local, partial_1d)
{
    float a[6] = {1, -2, 3.5f, 4, 0, -8}, b[6] = {2, 5, -1.5f, 4, -3, 8};
    float sum[6], avg[6], mx[6], mn[6];
    for (int i = 0; i < 6; i++) {
        sum[i] = a[i] + b[i];
        avg[i] = (a[i] + b[i]) / 2;
        mx[i] = a[i] > b[i] ? a[i] : b[i];
        mn[i] = a[i] < b[i] ? a[i] : b[i];
    }
    dt_mesh *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){1, 0});
    s_expect_partial(mesh, DT_REDUCE_SUM, a, b, sum);
    s_expect_partial(mesh, DT_REDUCE_AVG, a, b, avg);
    s_expect_partial(mesh, DT_REDUCE_MAX, a, b, mx);
    s_expect_partial(mesh, DT_REDUCE_MIN, a, b, mn);

    /* integer sums stay exact */
    int64_t ia[2] = {INT64_C(1) << 40, -5}, ib[2] = {3, -(INT64_C(1) << 41)};
    dt_placement p = dt_partial(DT_REDUCE_SUM);
    dt_tensor *t = dt_from_local(mesh, (const void *[]){ia, ib}, 1, (int64_t[]){2, 2}, DT_INT64, &p, NULL);
    dt_future *f = s_fetch(t);
    s_expect_value(f, DT_INT64, 1, (int64_t[]){2}, (int64_t[]){ia[0] + ib[0], ia[1] + ib[1]}, "int64 sum");
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

S_BOTH(from_local, partial_sum_shard_2x2)
{
    /* [Partial(sum), Shard(0)]: device (i,j) holds a contribution to rows of chunk j */
    dt_mesh *mesh = s_mesh(2, (int64_t[]){2, 2}, (int64_t[]){0, 1, 2, 3});
    dt_placement pl[2] = {dt_partial(DT_REDUCE_SUM), dt_shard(0)};
    float pieces[4][2][3];
    for (int d = 0; d < 4; d++)
        for (int r = 0; r < 2; r++)
            for (int c = 0; c < 3; c++)
                pieces[d][r][c] = (float)((d + 1) * 100 + r * 10 + c);
    const void *ptrs[4] = {pieces[0], pieces[1], pieces[2], pieces[3]};
    float want[4][3];
    for (int j = 0; j < 2; j++)
        for (int r = 0; r < 2; r++)
            for (int c = 0; c < 3; c++)
                want[j * 2 + r][c] = pieces[j][r][c] + pieces[2 + j][r][c];
    int64_t even[8] = {2, 3, 2, 3, 2, 3, 2, 3};
    dt_tensor *t = dt_from_local(mesh, ptrs, 2, even, DT_FLOAT32, pl, NULL);
    cr_assert_not_null(t, "%s", dt_last_error());
    cr_expect(dt_tensor_shape(t)[0] == 4 && dt_tensor_shape(t)[1] == 3, "inferred shape assumes even shards");
    dt_future *f = s_fetch(t);
    s_expect_value(f, DT_FLOAT32, 2, (int64_t[]){4, 3}, want, "[Partial(sum), Shard(0)]");
    dt_future_release(&f);
    dt_tensor_release(&t);

    /* uneven with shape=(3,3): rows 2|1 on every mesh row */
    int64_t uneven[8] = {2, 3, 1, 3, 2, 3, 1, 3};
    t = dt_from_local(mesh, ptrs, 2, uneven, DT_FLOAT32, pl, (int64_t[]){3, 3});
    f = s_fetch(t);
    float want3[3][3];
    for (int c = 0; c < 3; c++) {
        want3[0][c] = pieces[0][0][c] + pieces[2][0][c];
        want3[1][c] = pieces[0][1][c] + pieces[2][1][c];
        want3[2][c] = pieces[1][0][c] + pieces[3][0][c];
    }
    s_expect_value(f, DT_FLOAT32, 2, (int64_t[]){3, 3}, want3, "uneven [Partial(sum), Shard(0)]");
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

S_BOTH(from_local, mismatched_pieces)
{
    float data[9] = {0};
    const void *ptrs[2] = {data, data};
    dt_mesh *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){0, 1});
    dt_placement s0 = dt_shard(0), p = dt_partial(DT_REDUCE_SUM);
    /* Shard(0) of (4,3) needs (2,3) twice */
    cr_expect_null(dt_from_local(mesh, ptrs, 2, (int64_t[]){2, 3, 3, 3}, DT_FLOAT32, &s0, (int64_t[]){4, 3}));
    cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    /* without shape=, the first piece sets the expected shape */
    cr_expect_null(dt_from_local(mesh, ptrs, 2, (int64_t[]){2, 3, 3, 3}, DT_FLOAT32, &s0, NULL));
    cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    cr_expect_null(dt_from_local(mesh, ptrs, 2, (int64_t[]){2, 3, 2, 2}, DT_FLOAT32, &p, NULL));
    cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    cr_expect_null(dt_from_local(mesh, ptrs, 2, (int64_t[]){2, -3, 2, -3}, DT_FLOAT32, &p, NULL));
    cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    dt_mesh_release(&mesh);
}

/* ---- futures -------------------------------------------------------------------------------- */

typedef struct {
    atomic_int calls;
    atomic_int status;
    dt_future *expected;
    atomic_bool same;
} s_done;

static void s_on_done(dt_future *f, void *arg)
{
    s_done *d = arg;
    atomic_store(&d->same, f == d->expected);
    atomic_store(&d->status, dt_future_status(f));
    atomic_fetch_add(&d->calls, 1);
}

/* Polls until counter reaches want or 60 s pass (a loaded machine may be slow; only a failure
 * waits that long): callbacks run on a runtime thread, possibly just after the waiter wakes. */
static void s_await_count(atomic_int *counter, int want)
{
    double deadline = s_now() + 60.0;
    while (atomic_load(counter) < want && s_now() < deadline)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
}

S_BOTH(futures, wait_timeout_then_block)
{
    dt_mesh *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){0, 1});
    dt_placement s0 = dt_shard(0);
    dt_tensor *t = dt_arange(mesh, S_INT(0), S_INT(1 << 20), S_INT(1), DT_INT64, &s0);
    cr_assert_not_null(t, "%s", dt_last_error());
    dt_future *f = dt_tensor_fetch(t);
    cr_assert_not_null(f, "%s", dt_last_error());
    int rc = dt_future_wait(f, 0);
    cr_expect(rc == 0 || rc == DT_ETIMEDOUT, "wait(0) gave %d", rc);
    if (rc == DT_ETIMEDOUT) {
        cr_expect_eq(dt_last_error_code(), DT_ETIMEDOUT);
        cr_expect_null(dt_future_data(f, 0), "a pending future has no data");
    }
    cr_assert_eq(dt_future_wait(f, -1), 0, "%s", dt_last_error());
    cr_expect(dt_future_done(f));
    cr_expect_eq(dt_future_wait(f, 0), 0, "a ready future answers at once");
    const int64_t *v = dt_future_data(f, 0);
    for (int64_t i = 0; i < (1 << 20); i++)
        if (v[i] != i) {
            cr_expect_fail("element %lld is %lld", (long long)i, (long long)v[i]);
            break;
        }
    /* a second reference keeps the value after the first is released */
    dt_future *g = dt_future_ref(f);
    dt_future_release(&f);
    cr_expect_null(f, "release clears the handle");
    cr_expect_eq(((const int64_t *)dt_future_data(g, 0))[12345], 12345);
    dt_future_release(&g);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

S_BOTH(futures, on_done_runs_once)
{
    dt_mesh *mesh = s_mesh(1, (int64_t[]){3}, (int64_t[]){0, 1, 2});
    dt_placement s0 = dt_shard(0);
    dt_tensor *t = dt_full(mesh, 2, (int64_t[]){512, 512}, DT_FLOAT32, &s0, S_FLT(1.5));
    cr_assert_not_null(t, "%s", dt_last_error());
    dt_future *f = dt_tensor_fetch(t);
    cr_assert_not_null(f, "%s", dt_last_error());
    s_done early = {.expected = f};
    dt_future_on_done(f, s_on_done, &early);
    cr_assert_eq(dt_future_wait(f, -1), 0, "%s", dt_last_error());
    s_await_count(&early.calls, 1);
    cr_expect_eq(atomic_load(&early.calls), 1);
    cr_expect(atomic_load(&early.same));
    cr_expect_eq(atomic_load(&early.status), 0);

    /* registered after completion: runs now, on this thread */
    s_done late = {.expected = f};
    dt_future_on_done(f, s_on_done, &late);
    cr_expect_eq(atomic_load(&late.calls), 1);
    cr_expect(atomic_load(&late.same));
    cr_expect_eq(atomic_load(&late.status), 0);

    /* nothing runs twice, even after more traffic */
    cr_expect_eq(dt_synchronize(), 0);
    nanosleep(&(struct timespec){0, 50000000}, NULL);
    cr_expect_eq(atomic_load(&early.calls), 1);
    cr_expect_eq(atomic_load(&late.calls), 1);
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
}

S_BOTH(futures, synchronize)
{
    cr_expect_eq(dt_synchronize(), 0, "no device yet");
    dt_mesh *mesh = s_mesh(2, (int64_t[]){2, 2}, (int64_t[]){0, 1, 2, 3});
    dt_tensor *ts[8];
    for (int i = 0; i < 8; i++) {
        ts[i] = dt_rand(mesh, 2, (int64_t[]){64, 64}, DT_FLOAT32, NULL);
        cr_assert_not_null(ts[i], "%s", dt_last_error());
    }
    cr_expect_eq(dt_synchronize(), 0, "%s", dt_last_error());
    for (int i = 0; i < 8; i++)
        dt_tensor_release(&ts[i]);
    cr_expect_eq(dt_synchronize(), 0, "%s", dt_last_error());
    dt_mesh_release(&mesh);
}

/* ---- device statistics ------------------------------------------------------------------------ */

/* An all-gather of a (4, 4) float32 Shard(0) over 2 devices: each device sends its 32-byte piece
 * to the other in one message and holds 32 + 64 bytes; freeing the gathered copy brings it back
 * to 32 and leaves the peak at 96 until it is reset. */
S_BOTH(stats, counts_pieces_and_peer_traffic)
{
    dt_mesh *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){3, 5});
    dt_placement shard0 = dt_shard(0), rep = dt_replicate();
    dt_tensor *x = dt_zeros(mesh, 2, (int64_t[]){4, 4}, DT_FLOAT32, &shard0);
    cr_assert_not_null(x, "%s", dt_last_error());
    dt_device_stat before[2], after[2];
    cr_assert_eq(dt_device_stats_reset_peak(mesh, 2, before), 2, "%s", dt_last_error());
    dt_tensor *y = dt_redistribute(x, NULL, &rep);
    cr_assert_not_null(y, "%s", dt_last_error());
    cr_assert_eq(dt_device_stats(mesh, 2, after), 2, "%s", dt_last_error());
    for (int d = 0; d < 2; d++) {
        cr_expect_eq(after[d].device, d ? 5 : 3, "entries come in mesh order with their device ids");
        cr_expect_eq(before[d].bytes_in_use, 32);
        cr_expect_eq(after[d].bytes_in_use, 96, "device %d holds %lld bytes", d, (long long)after[d].bytes_in_use);
        cr_expect_eq(after[d].peak_bytes, 96);
        cr_expect_eq(after[d].peer_messages_sent - before[d].peer_messages_sent, 1);
        cr_expect_eq(after[d].peer_bytes_sent - before[d].peer_bytes_sent, 32);
        cr_expect_eq(after[d].peer_messages_received - before[d].peer_messages_received, 1);
        cr_expect_eq(after[d].peer_bytes_received - before[d].peer_bytes_received, 32);
        /* worker threads hand each other the region itself; processes send a message */
        cr_expect_eq(after[d].peer_handoffs - before[d].peer_handoffs, mode == DT_WORKERS_THREAD ? 1 : 0);
    }
    dt_tensor_release(&y);
    cr_assert_eq(dt_device_stats_reset_peak(mesh, 2, after), 2, "%s", dt_last_error());
    cr_expect(after[0].bytes_in_use == 32 && after[0].peak_bytes == 96, "the free ran before the stats");
    cr_assert_eq(dt_device_stats(mesh, 1, after), 2, "room for fewer entries still counts every device");
    cr_expect_eq(after[0].peak_bytes, 32, "the peak starts again from what is held");
    cr_expect_eq(dt_device_stats(NULL, 0, NULL), DT_EINVAL);
    dt_tensor_release(&x);
    dt_mesh_release(&mesh);
}

/* ---- views let go on several threads at once ------------------------------------------------- */

typedef struct {
    dt_tensor *t;
    atomic_int *ready; /* the threads at the start line; all three go together */
} s_drop;

static void *s_drop_main(void *arg)
{
    s_drop *d = arg;
    atomic_fetch_add(d->ready, 1);
    while (atomic_load(d->ready) < 3)
        ;
    dt_tensor_release(&d->t);
    return NULL;
}

static int64_t s_bytes_in_use(dt_mesh *mesh, int64_t device)
{
    dt_device_stat st[2];
    cr_assert_eq(dt_device_stats(mesh, 2, st), 2, "%s", dt_last_error());
    return st[device].bytes_in_use;
}

/* A (4, 3) float32 tensor written in place while two views made on the controller read it: it
 * moves to new pieces and leaves its old ones (48 bytes on each device) to the views. Its last
 * reference and both views then go on three threads at once, 200 times: whatever the order, both
 * pieces are freed (a view's release looks at what it must free while it still holds the tensor,
 * and two views that go together leave the old pieces to the tensor's own release). */
S_BOTH(views, let_go_on_three_threads_at_once)
{
    (void)mode;
    dt_mesh *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){0, 1});
    dt_placement rep = dt_replicate();
    int sel = dt_op_id("select"), assign = dt_op_id("slice_assign_");
    cr_assert(sel >= 0 && assign >= 0);
    dt_tensor *src = dt_full(mesh, 2, (int64_t[]){1, 3}, DT_FLOAT32, &rep, S_FLT(7.0));
    cr_assert_not_null(src, "%s", dt_last_error());
    int64_t empty = s_bytes_in_use(mesh, 1);
    for (int round = 0; round < 200; round++) {
        dt_tensor *x = dt_full(mesh, 2, (int64_t[]){4, 3}, DT_FLOAT32, &rep, S_FLT(2.0));
        cr_assert_not_null(x, "%s", dt_last_error());
        dt_tensor *v[2] = {NULL, NULL}, *w = NULL;
        for (int i = 0; i < 2; i++) {
            dt_op_attrs a = {.nints = 2, .ints = {0, 1 + i}};
            cr_assert_eq(dt_op_run(sel, 1, &x, &a, 1, &v[i]), 1, "%s", dt_last_error());
        }
        dt_op_attrs at = {.nints = 2, .ints = {0, 1}};
        cr_assert_eq(dt_op_run(assign, 2, (dt_tensor *[]){x, src}, &at, 1, &w), 1, "%s", dt_last_error());
        dt_tensor_release(&w);
        if (round == 0) /* the views read the old pieces, x the new ones: two of them */
            cr_expect_eq(s_bytes_in_use(mesh, 1), empty + 2 * 48, "the write left its views no pieces of their own");
        atomic_int ready = 0;
        s_drop drops[3] = {{v[0], &ready}, {v[1], &ready}, {x, &ready}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            cr_assert_eq(pthread_create(&th[i], NULL, s_drop_main, &drops[i]), 0);
        s_drop_main(&drops[2]);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
    }
    cr_expect_eq(s_bytes_in_use(mesh, 0), empty, "pieces left behind on device 0");
    cr_expect_eq(s_bytes_in_use(mesh, 1), empty, "pieces left behind on device 1");
    dt_tensor_release(&src);
    dt_mesh_release(&mesh);
}

static void *s_views_main(void *arg)
{
    dt_tensor *x = arg;
    int sel = dt_op_id("select"), perm = dt_op_id("permute");
    for (int i = 0; i < 300; i++) {
        dt_tensor *v[2] = {NULL, NULL};
        dt_op_attrs a = {.nints = 2, .ints = {0, i % 4}}, p = {.nints = 2, .ints = {1, 0}};
        if (dt_op_run(sel, 1, &x, &a, 1, &v[0]) != 1 || dt_op_run(perm, 1, &x, &p, 1, &v[1]) != 1)
        {
            fprintf(stderr, "a view on the thread failed: %s\n", dt_last_error());
            return x;
        }
        dt_tensor_release(&v[0]);
        dt_tensor_release(&v[1]);
    }
    return NULL;
}

/* A thread that made and dropped views (a row and a transpose, whose handles and maps each thread
 * keeps for reuse) leaves nothing behind when it exits: the sanitized build's leak check fails on
 * what it kept. Four such threads one after another, then one more view here. */
S_BOTH(views, threads_that_exit_keep_nothing)
{
    (void)mode;
    dt_mesh *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){0, 1});
    dt_placement rep = dt_replicate();
    dt_tensor *x = dt_full(mesh, 2, (int64_t[]){4, 3}, DT_FLOAT32, &rep, S_FLT(2.0));
    cr_assert_not_null(x, "%s", dt_last_error());
    for (int i = 0; i < 4; i++) {
        pthread_t th;
        void *why = NULL;
        cr_assert_eq(pthread_create(&th, NULL, s_views_main, x), 0);
        pthread_join(th, &why);
        cr_assert_null(why, "a view on thread %d failed (its error is above)", i);
    }
    dt_tensor *row = NULL;
    cr_assert_eq(dt_op("select", 1, &x, &(dt_op_attrs){.nints = 2, .ints = {0, 3}}, 1, &row), 1, "%s", dt_last_error());
    dt_future *f = s_fetch(row);
    s_expect_value(f, DT_FLOAT32, 1, (int64_t[]){3}, (float[]){2, 2, 2}, "row 3");
    dt_future_release(&f);
    dt_tensor_release(&row);
    dt_tensor_release(&x);
    dt_mesh_release(&mesh);
}

/* ---- a worker process dies ------------------------------------------------------------------ */

/* The pid of this process's dtorch-worker child that serves device, or -1. */
static pid_t s_worker_pid(int64_t device)
{
    DIR *proc = opendir("/proc");
    cr_assert_not_null(proc);
    pid_t found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(proc))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *fp = fopen(path, "r");
        if (!fp)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, fp);
        fclose(fp);
        buf[n] = 0;
        /* the command name may hold spaces and parentheses: the parent pid follows the last ')' */
        char *close = strrchr(buf, ')');
        long ppid;
        if (!close || sscanf(close + 1, " %*c %ld", &ppid) != 1 || ppid != (long)getpid())
            continue;
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        if (!(fp = fopen(path, "r")))
            continue;
        n = fread(buf, 1, sizeof buf - 1, fp);
        fclose(fp);
        buf[n] = 0;
        /* argv: PATH --connect ENDPOINT --device ID ... (NUL-separated) */
        const char *argv[5] = {0};
        size_t at = 0;
        for (int a = 0; a < 5 && at < n; a++) {
            argv[a] = buf + at;
            at += strlen(buf + at) + 1;
        }
        char id[32];
        snprintf(id, sizeof id, "%lld", (long long)device);
        if (argv[0] && strstr(argv[0], "dtorch-worker") && argv[3] && strcmp(argv[3], "--device") == 0 &&
            argv[4] && strcmp(argv[4], id) == 0)
            found = (pid_t)pid;
    }
    closedir(proc);
    return found;
}

Test(failure, worker_killed, .timeout = 120)
{
    s_init(DT_WORKERS_PROCESS);
    dt_mesh *a = s_mesh(1, (int64_t[]){2}, (int64_t[]){0, 1});
    dt_mesh *b = s_mesh(1, (int64_t[]){2}, (int64_t[]){2, 3});
    dt_placement s0 = dt_shard(0);
    dt_tensor *ta = dt_full(a, 1, (int64_t[]){4}, DT_FLOAT32, &s0, S_FLT(1.0));
    dt_tensor *tb = dt_full(b, 1, (int64_t[]){4}, DT_FLOAT32, &s0, S_FLT(2.0));
    dt_future *f = s_fetch(ta);
    dt_future_release(&f);
    f = s_fetch(tb);
    dt_future_release(&f);

    pid_t victim = s_worker_pid(1);
    cr_assert_gt(victim, 0, "no dtorch-worker child serves device 1");
    /* stopped, the worker cannot answer, so the fetch is surely pending when it dies */
    cr_assert_eq(kill(victim, SIGSTOP), 0);
    f = dt_tensor_fetch(ta);
    cr_assert_not_null(f, "fetch before the death is noticed: %s", dt_last_error());
    cr_assert_eq(kill(victim, SIGKILL), 0);
    /* the death must reach the future; how fast is for bench/, not for a test on a loaded machine */
    int rc = dt_future_wait(f, 60.0);
    cr_expect_eq(rc, DT_EDEVICE, "wait gave %d: %s", rc, dt_last_error());
    cr_expect_eq(dt_future_status(f), DT_EDEVICE);
    cr_assert_not_null(dt_future_error(f));
    cr_expect_not_null(strstr(dt_future_error(f), "device 1"), "error: %s", dt_future_error(f));
    cr_expect_null(dt_future_data(f, 0));
    dt_future_release(&f);

    /* the dead device refuses new work at the call site */
    dt_tensor *t = dt_zeros(a, 1, (int64_t[]){4}, DT_FLOAT32, &s0);
    cr_expect_null(t, "a factory on a mesh with a dead device");
    cr_expect_eq(dt_last_error_code(), DT_EDEVICE);
    cr_expect_not_null(strstr(dt_last_error(), "device 1"), "error: %s", dt_last_error());
    cr_expect_null(dt_tensor_fetch(ta));
    cr_expect_eq(dt_last_error_code(), DT_EDEVICE);

    /* other devices carry on: the old tensor on b and a new one */
    f = s_fetch(tb);
    s_expect_value(f, DT_FLOAT32, 1, (int64_t[]){4}, (float[]){2, 2, 2, 2}, "mesh [2,3] after the death");
    dt_future_release(&f);
    t = dt_arange(b, S_INT(0), S_INT(5), S_INT(1), DT_INT64, &s0);
    f = s_fetch(t);
    s_expect_value(f, DT_INT64, 1, (int64_t[]){5}, (int64_t[]){0, 1, 2, 3, 4}, "new tensor on [2,3]");
    dt_future_release(&f);
    dt_tensor_release(&t);
    cr_expect_eq(dt_synchronize(), 0, "synchronize skips the dead device: %s", dt_last_error());

    dt_tensor_release(&ta);
    dt_tensor_release(&tb);
    cr_expect_eq(dt_shutdown(), 0);
    cr_expect_not(dt_is_running());

    /* a fresh runtime brings device 1 back */
    s_init(DT_WORKERS_PROCESS);
    t = dt_full(a, 1, (int64_t[]){4}, DT_FLOAT32, &s0, S_FLT(5.0));
    f = s_fetch(t);
    s_expect_value(f, DT_FLOAT32, 1, (int64_t[]){4}, (float[]){5, 5, 5, 5}, "mesh [0,1] after a restart");
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&a);
    dt_mesh_release(&b);
    cr_expect_eq(dt_shutdown(), 0);
}

/* ---- bad input ------------------------------------------------------------------------------ */

/* Expects a NULL-returning call to have failed with code. */
#define S_EXPECT_FAIL(call, code)                                                                            \
    do {                                                                                                     \
        cr_expect_null((call), #call " succeeded");                                                          \
        cr_expect_eq(dt_last_error_code(), (code), #call ": code %d (%s)", dt_last_error_code(),             \
                     dt_last_error());                                                                       \
    } while (0)

S_BOTH(bad_input, meshes)
{
    int64_t two[1] = {2};
    S_EXPECT_FAIL(dt_mesh_new("cpu", 1, two, (int64_t[]){1, 1}, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_mesh_new("tpu", 1, two, (int64_t[]){0, 1}, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_mesh_new(NULL, 1, two, (int64_t[]){0, 1}, NULL), DT_EINVAL);
#ifndef DTORCH_HAVE_CUDA
    cr_expect_null(dt_mesh_new("cuda", 1, two, (int64_t[]){0, 1}, NULL), "no cuda backend in this build");
    cr_expect_lt(dt_last_error_code(), 0);
#endif
    S_EXPECT_FAIL(dt_mesh_new("cpu", 0, two, (int64_t[]){0, 1}, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_mesh_new("cpu", DT_MAX_DIMS + 1, two, (int64_t[]){0, 1}, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_mesh_new("cpu", 1, (int64_t[]){0}, (int64_t[]){0}, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_mesh_new("cpu", 1, two, (int64_t[]){0, -1}, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_mesh_new("cpu", 1, two, (int64_t[]){0, DT_MAX_DEVICE_ID + 1}, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_mesh_new("cpu", 2, (int64_t[]){2, 2}, (int64_t[]){0, 1, 2, 1}, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_mesh_new("cpu", 2, (int64_t[]){1, 2}, (int64_t[]){0, 1}, (const char *[]){"dp", "dp"}),
                  DT_EINVAL);

    dt_mesh *m = dt_mesh_new("cpu", 2, (int64_t[]){1, 2}, (int64_t[]){5, 4}, (const char *[]){"dp", "tp"});
    cr_assert_not_null(m, "%s", dt_last_error());
    cr_expect_eq(dt_mesh_ndim(m), 2);
    cr_expect_eq(dt_mesh_size(m), 2);
    cr_expect(dt_mesh_shape(m)[0] == 1 && dt_mesh_shape(m)[1] == 2);
    cr_expect(dt_mesh_ids(m)[0] == 5 && dt_mesh_ids(m)[1] == 4);
    cr_expect_str_eq(dt_mesh_device_type(m), "cpu");
    cr_expect_str_eq(dt_mesh_dim_name(m, 1), "tp");
    cr_expect_null(dt_mesh_dim_name(m, 2));
    dt_mesh *r = dt_mesh_ref(m);
    dt_mesh_release(&m);
    cr_expect_eq(dt_mesh_size(r), 2, "a reference outlives the first release");
    dt_mesh_release(&r);
    cr_expect(dt_is_running(), "bad meshes leave the runtime up (%s)", s_mode_name(mode));
}

S_BOTH(bad_input, factories)
{
    dt_mesh *mesh = s_mesh(2, (int64_t[]){2, 2}, (int64_t[]){0, 1, 2, 3});
    int64_t shape[2] = {4, 4};
    /* placements carry one entry per mesh dim: the second one shards a dim a 2-D tensor lacks */
    S_EXPECT_FAIL(dt_zeros(mesh, 2, shape, DT_FLOAT32, (dt_placement[]){dt_shard(0), dt_shard(2)}), DT_EINDEX);
    S_EXPECT_FAIL(dt_rand(mesh, 2, shape, DT_FLOAT32, (dt_placement[]){dt_shard(-3), dt_replicate()}), DT_EINDEX);
    S_EXPECT_FAIL(dt_ones(mesh, 2, shape, DT_FLOAT32, (dt_placement[]){{7, 0, 0}, dt_replicate()}), DT_EINVAL);
    S_EXPECT_FAIL(dt_zeros(mesh, 2, (int64_t[]){4, -1}, DT_FLOAT32, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_zeros(mesh, DT_MAX_DIMS + 1, shape, DT_FLOAT32, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_zeros(NULL, 2, shape, DT_FLOAT32, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_rand(mesh, 2, shape, DT_INT64, NULL), DT_ETYPE);
    S_EXPECT_FAIL(dt_randn(mesh, 2, shape, DT_BOOL, NULL), DT_ETYPE);
    S_EXPECT_FAIL(dt_zeros(mesh, 2, shape, (dt_dtype)99, NULL), DT_ETYPE);
    S_EXPECT_FAIL(dt_full(mesh, 2, shape, (dt_dtype)-1, NULL, S_INT(0)), DT_ETYPE);
    S_EXPECT_FAIL(dt_arange(mesh, S_INT(0), S_INT(5), S_INT(0), DT_INT64, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_arange(mesh, S_FLT(0), S_FLT(5), S_FLT(0.0), DT_FLOAT32, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_arange(mesh, S_INT(0), S_INT(5), S_INT(-1), DT_INT64, NULL), DT_EINVAL);
    S_EXPECT_FAIL(dt_arange(mesh, S_INT(0), S_INT(5), S_INT(1), (dt_dtype)99, NULL), DT_ETYPE);
    float data[16] = {0};
    S_EXPECT_FAIL(dt_distribute(mesh, data, 2, shape, NULL, DT_FLOAT32,
                                (dt_placement[]){dt_partial(DT_REDUCE_SUM), dt_replicate()}),
                  DT_EINVAL);

    /* the runtime is unharmed: a valid op right after works */
    dt_tensor *t = dt_ones(mesh, 2, shape, DT_FLOAT32, (dt_placement[]){dt_shard(1), dt_shard(0)});
    float ones[16];
    for (int i = 0; i < 16; i++)
        ones[i] = 1.0f;
    dt_future *f = s_fetch(t);
    s_expect_value(f, DT_FLOAT32, 2, shape, ones, "ones after the bad calls");
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
    cr_expect(dt_is_running(), "%s runtime still up", s_mode_name(mode));
}

/* ---- shutdown races and late starters --------------------------------------------------------- */

#include <sys/stat.h>

typedef struct {
    atomic_bool failed;   /* the pending future was failed by the shutdown */
    atomic_bool go;       /* the racing call is about to be made */
} s_gate;

/* Runs on the controller thread while it fails pending futures at shutdown: holds the shutdown
 * right there until the racing call is in (or 1 s passes). */
static void s_hold_shutdown(dt_future *f, void *arg)
{
    s_gate *g = arg;
    atomic_store(&g->failed, true);
    double deadline = s_now() + 1.0;
    while (!atomic_load(&g->go) && s_now() < deadline)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    nanosleep(&(struct timespec){0, 300000000}, NULL);
}

static void *s_shutdown_main(void *arg)
{
    (void)arg;
    dt_shutdown();
    return NULL;
}

typedef struct {
    s_gate *gate;
    atomic_int rc;
    atomic_bool returned;
} s_sync_call;

static void *s_sync_main(void *arg)
{
    s_sync_call *c = arg;
    while (!atomic_load(&c->gate->failed))
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    atomic_store(&c->gate->go, true);
    atomic_store(&c->rc, dt_synchronize());
    atomic_store(&c->returned, true);
    return NULL;
}

/* A process-mode runtime on mesh [0, 1] with device 1 stopped and a fetch pending on it, so that a
 * shutdown takes its full bye timeout and fails that fetch. */
static dt_future *s_stuck_runtime(dt_mesh **mesh, dt_tensor **t, pid_t *victim)
{
    s_init(DT_WORKERS_PROCESS);
    *mesh = s_mesh(1, (int64_t[]){2}, (int64_t[]){0, 1});
    dt_placement s0 = dt_shard(0);
    *t = dt_full(*mesh, 1, (int64_t[]){4}, DT_FLOAT32, &s0, S_FLT(1.0));
    cr_assert_not_null(*t, "%s", dt_last_error());
    dt_future *f = s_fetch(*t);
    dt_future_release(&f);
    *victim = s_worker_pid(1);
    cr_assert_gt(*victim, 0, "no dtorch-worker child serves device 1");
    cr_assert_eq(kill(*victim, SIGSTOP), 0);
    f = dt_tensor_fetch(*t);
    cr_assert_not_null(f, "%s", dt_last_error());
    return f;
}

/* synchronize() while another thread shuts down, after the pending futures were failed: it must
 * not register a future nobody will ever settle. */
Test(review, synchronize_during_shutdown, .timeout = 120)
{
    dt_mesh *mesh;
    dt_tensor *t;
    pid_t victim;
    dt_future *f = s_stuck_runtime(&mesh, &t, &victim);
    s_gate gate = {0};
    dt_future_on_done(f, s_hold_shutdown, &gate);
    pthread_t stopper, syncer;
    s_sync_call call = {.gate = &gate};
    cr_assert_eq(pthread_create(&syncer, NULL, s_sync_main, &call), 0);
    cr_assert_eq(pthread_create(&stopper, NULL, s_shutdown_main, NULL), 0);
    double deadline = s_now() + 10.0;
    while (!atomic_load(&call.returned) && s_now() < deadline)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    cr_assert(atomic_load(&call.returned), "synchronize() during shutdown never returned");
    int rc = atomic_load(&call.rc);
    cr_expect(rc == 0 || rc == DT_ESHUTDOWN, "synchronize gave %d", rc);
    cr_expect(atomic_load(&gate.failed), "the pending fetch was never failed");
    pthread_join(syncer, NULL);
    pthread_join(stopper, NULL);
    cr_expect_eq(dt_future_status(f), DT_ESHUTDOWN, "status %d: %s", dt_future_status(f), dt_future_error(f));
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
    cr_expect_not(dt_is_running());
}

/* Two threads shut down at once: the second waits for the first instead of joining the controller
 * a second time (and closing its doorbell under it); a restart afterwards works. */
Test(review, concurrent_shutdown, .timeout = 120)
{
    dt_mesh *mesh;
    dt_tensor *t;
    pid_t victim;
    dt_future *f = s_stuck_runtime(&mesh, &t, &victim);
    pid_t survivor = s_worker_pid(0);
    cr_assert_gt(survivor, 0);
    pthread_t stopper;
    cr_assert_eq(pthread_create(&stopper, NULL, s_shutdown_main, NULL), 0);
    nanosleep(&(struct timespec){0, 300000000}, NULL); /* the first shutdown waits ~2 s for device 1 */
    cr_expect_eq(dt_shutdown(), 0);
    cr_expect_not(dt_is_running());
    cr_expect_lt(s_worker_pid(0), 0, "shutdown returned while the workers still run");
    cr_expect_lt(s_worker_pid(1), 0, "shutdown returned while the workers still run");
    cr_expect_eq(dt_future_status(f), DT_ESHUTDOWN, "shutdown returned with a future still pending");
    pthread_join(stopper, NULL);
    dt_future_release(&f);
    dt_tensor_release(&t);

    /* a fresh start works */
    s_init(DT_WORKERS_PROCESS);
    dt_placement s0 = dt_shard(0);
    t = dt_full(mesh, 1, (int64_t[]){4}, DT_FLOAT32, &s0, S_FLT(3.0));
    cr_assert_not_null(t, "%s", dt_last_error());
    f = s_fetch(t);
    s_expect_value(f, DT_FLOAT32, 1, (int64_t[]){4}, (float[]){3, 3, 3, 3}, "after the double shutdown");
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&mesh);
    cr_expect_eq(dt_shutdown(), 0);
}

/* A device that says hello after another device died still learns of the death: a redistribute
 * it was sent before its start, waiting for a region from the dead device, fails instead of
 * waiting forever. */
Test(review, abort_reaches_late_starter, .timeout = 120)
{
    const char *real = getenv("DTORCH_WORKER_PATH");
    cr_assert_not_null(real);
    char dir[] = "/tmp/dtorch-review-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char script[256];
    snprintf(script, sizeof script, "%s/dtorch-worker-slow", dir);
    FILE *fp = fopen(script, "w");
    cr_assert_not_null(fp);
    /* argv: --connect ENDPOINT --device ID --parent PID; device 1 starts 3 s late */
    fprintf(fp, "#!/bin/sh\n[ \"$4\" = 1 ] && sleep 3\nexec \"%s\" \"$@\"\n", real);
    fclose(fp);
    chmod(script, 0755);
    cr_assert_eq(dt_init(&(dt_config){DT_WORKERS_PROCESS, script}), 0, "%s", dt_last_error());

    dt_mesh *a = s_mesh(1, (int64_t[]){1}, (int64_t[]){0});
    dt_mesh *b = s_mesh(1, (int64_t[]){1}, (int64_t[]){1});
    dt_placement rep = dt_replicate();
    dt_tensor *x = dt_arange(a, S_INT(0), S_INT(8), S_INT(1), DT_INT64, &rep);
    cr_assert_not_null(x, "%s", dt_last_error());
    dt_future *f = s_fetch(x);
    dt_future_release(&f);
    pid_t victim = s_worker_pid(0);
    cr_assert_gt(victim, 0, "no dtorch-worker child serves device 0");
    cr_assert_eq(kill(victim, SIGSTOP), 0); /* it cannot send its region */

    dt_tensor *y = dt_redistribute(x, b, &rep); /* starts device 1, which is still asleep */
    cr_assert_not_null(y, "%s", dt_last_error());
    f = dt_tensor_fetch(y);
    cr_assert_not_null(f, "%s", dt_last_error());
    cr_assert_eq(kill(victim, SIGKILL), 0);
    int rc = dt_future_wait(f, 15.0);
    cr_expect(rc != 0 && rc != DT_ETIMEDOUT, "the fetch gave %d: %s", rc, dt_last_error());
    if (rc != 0 && rc != DT_ETIMEDOUT)
        cr_expect_not_null(strstr(dt_future_error(f), "device 0"), "error: %s", dt_future_error(f));
    dt_future_release(&f);
    dt_tensor_release(&y);
    dt_tensor_release(&x);
    dt_mesh_release(&a);
    dt_mesh_release(&b);
    cr_expect_eq(dt_shutdown(), 0);
    unlink(script);
    rmdir(dir);
}
