/* The CPU kernels of the ops whose infer does not hold for local pieces, fed pieces that a COMPUTE
 * record from a socket could name and the controller never makes: a dim out of range, a shape or
 * dtype that does not fit the others, counts and offsets that overflow int64. Each is refused with
 * a reason before the kernel touches a byte (the pieces are heap blocks of exactly numel * dtype
 * size, so a read or write past one is AddressSanitizer's to see, and an overflow UBSan's); beside
 * them, pieces that fit still run and give the values worked out by hand. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

#define F32 DT_FLOAT32
#define I32 DT_INT32
#define I64 DT_INT64
#define BOOL DT_BOOL
#define BIG (INT64_C(1) << 40)

/* a shape as (ndim, sizes) */
#define S(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* A kernel's call: its pieces on the heap, attributes and ctx. */
typedef struct {
    op_kernel k;
    op_attrs attrs;
} s_call;

static s_call *s_new(int op)
{
    s_call *c = calloc(1, sizeof *c);
    cr_assert(c && op_by_id(op));
    c->k.def = op_by_id(op);
    c->k.attrs = &c->attrs;
    return c;
}

/* A piece of exactly numel * dtype size bytes, zeros; the sizes past ndim are stale nonsense, as a
 * worker's view of a piece can leave them. */
static op_local s_piece(dt_dtype dtype, int ndim, const int64_t *shape)
{
    op_local p = {.dtype = dtype, .ndim = ndim};
    for (int d = 0; d < DT_MAX_DIMS; d++)
        p.shape[d] = d < ndim ? shape[d] : 7;
    size_t bytes = (size_t)dt_layout_numel(ndim, p.shape) * dt_dtype_size(dtype);
    p.data = calloc(bytes, 1);
    cr_assert(p.data || !bytes);
    return p;
}

static op_local *s_in(s_call *c, dt_dtype dtype, int ndim, const int64_t *shape)
{
    c->k.in[c->k.nin] = s_piece(dtype, ndim, shape);
    return &c->k.in[c->k.nin++];
}

static op_local *s_out(s_call *c, dt_dtype dtype, int ndim, const int64_t *shape)
{
    c->k.out[c->k.nout] = s_piece(dtype, ndim, shape);
    return &c->k.out[c->k.nout++];
}

static void s_ints(s_call *c, int n, const int64_t *v)
{
    c->attrs.nints = n;
    memcpy(c->attrs.ints, v, (size_t)n * sizeof *v);
}

static void s_ctx(s_call *c, int n, const int64_t *v)
{
    c->k.nctx = n;
    memcpy(c->k.ctx, v, (size_t)n * sizeof *v);
}

static void s_floats(s_call *c, int n, const double *v)
{
    c->attrs.nfloats = n;
    memcpy(c->attrs.floats, v, (size_t)n * sizeof *v);
}

static const char *s_run(s_call *c) { return cpu_kernel_for(c->k.def->id)(&c->k); }

static void s_free(s_call *c)
{
    for (int i = 0; i < c->k.nin; i++)
        free(c->k.in[i].data);
    for (int o = 0; o < c->k.nout; o++)
        if (c->k.def->inplace && o == 0)
            continue; /* input 0's bytes */
        else
            free(c->k.out[o].data);
    free(c);
}

/* The kernel refuses c's pieces, saying why. */
static void s_refused(s_call *c, const char *what)
{
    const char *why = s_run(c);
    cr_expect(why != NULL, "%s %s: ran", c->k.def->name, what);
    s_free(c);
}

/* The kernel runs c's pieces. */
static void s_runs(s_call *c, const char *what)
{
    const char *why = s_run(c);
    cr_expect(why == NULL, "%s %s: %s", c->k.def->name, what, why ? why : "");
}

/* ---- reductions ------------------------------------------------------------------------------ */

Test(hostile, list_reductions)
{
    s_call *c = s_new(OP_ID_sum);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(1));
    s_ctx(c, S(2, 3));
    s_refused(c, "into an output of fewer elements than the kept dims");

    c = s_new(OP_ID_sum);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2, 3));
    s_ctx(c, S(1 << 5, 1));
    s_refused(c, "over a dim past the piece's");

    c = s_new(OP_ID_amax);
    s_in(c, I32, S(2, 3));
    s_out(c, I64, S(2));
    s_ctx(c, S(2, 3));
    s_refused(c, "into another dtype than its input's");

    c = s_new(OP_ID_mean);
    s_in(c, I64, S(2, 3));
    s_out(c, I64, S(2));
    s_ctx(c, S(2, 3));
    s_refused(c, "into an integer output");

    /* an empty piece whose reduced dims multiply past int64: nothing to do */
    c = s_new(OP_ID_sum);
    s_in(c, F32, S(0, BIG, BIG));
    s_out(c, F32, S(0));
    s_ctx(c, S(6, 1));
    s_runs(c, "of an empty piece with huge reduced dims");
    s_free(c);

    /* fits: [[1, 2, 3], [4, 5, 6]] summed over dim 1 (kept) is [[6], [15]] */
    c = s_new(OP_ID_sum);
    float *x = s_in(c, F32, S(2, 3))->data, *y = s_out(c, F32, S(2, 1))->data;
    for (int i = 0; i < 6; i++)
        x[i] = (float)(i + 1);
    s_ctx(c, S(2, 3));
    s_runs(c, "over dim 1");
    cr_expect(y[0] == 6.0f && y[1] == 15.0f, "sum: %g %g", y[0], y[1]);
    s_free(c);
}

Test(hostile, along_a_dim)
{
    s_call *c = s_new(OP_ID_argmax);
    s_in(c, F32, S(2, 3));
    s_out(c, I64, S(2));
    s_ctx(c, S(5));
    s_ints(c, S(0, 5));
    s_refused(c, "along dim 5 of a 2-D piece");

    c = s_new(OP_ID_argmax);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2));
    s_ctx(c, S(1));
    s_refused(c, "into float32 positions");

    c = s_new(OP_ID_max_dim);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2));
    s_out(c, I64, S(1));
    s_ctx(c, S(1));
    s_refused(c, "with positions of another shape than its values");

    c = s_new(OP_ID_topk);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2, 5));
    s_out(c, I64, S(2, 5));
    s_ints(c, S(5, 1, 1, 1));
    s_ctx(c, S(1));
    s_refused(c, "of k = 5 along a dim of 3");

    c = s_new(OP_ID_topk);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2, 1));
    s_out(c, I64, S(2, 1));
    s_ints(c, S(2, 1, 1, 1));
    s_ctx(c, S(1));
    s_refused(c, "of k = 2 into outputs of 1");

    c = s_new(OP_ID_softmax);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2));
    s_ctx(c, S(1));
    s_refused(c, "into an output of another shape");

    c = s_new(OP_ID_cumsum);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2, 3));
    s_ctx(c, S(-1));
    s_refused(c, "along dim -1 (only argmax and argmin run over every element)");

    /* softmax along dim 0 of an empty piece whose later dims multiply past int64 */
    c = s_new(OP_ID_softmax);
    s_in(c, F32, S(0, BIG, BIG));
    s_out(c, F32, S(0, BIG, BIG));
    s_ctx(c, S(0));
    s_runs(c, "of an empty piece");
    s_free(c);

    /* fits: argmax of [[1, 5, 2], [7, 0, 3]] along dim 1 is [1, 0] */
    c = s_new(OP_ID_argmax);
    float *x = s_in(c, F32, S(2, 3))->data;
    int64_t *at = s_out(c, I64, S(2))->data;
    memcpy(x, (float[]){1, 5, 2, 7, 0, 3}, sizeof(float[6]));
    s_ints(c, S(0, 1));
    s_ctx(c, S(1));
    s_runs(c, "along dim 1");
    cr_expect(at[0] == 1 && at[1] == 0, "argmax: %lld %lld", (long long)at[0], (long long)at[1]);
    s_free(c);
}

Test(hostile, norms)
{
    s_call *c = s_new(OP_ID_layer_norm);
    s_in(c, F32, S(2, 3));
    s_in(c, F32, S(2));
    s_out(c, F32, S(2, 3));
    s_ctx(c, S(3, 1));
    s_refused(c, "with a weight of 2 for rows of 3");

    c = s_new(OP_ID_layer_norm);
    s_in(c, F32, S(2, 3));
    s_in(c, F32, S(3));
    s_out(c, F32, S(2, 3));
    s_ctx(c, S(3, 3));
    s_refused(c, "told of a weight and a bias, given one tensor");

    c = s_new(OP_ID_rms_norm);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2, 3));
    s_ctx(c, S(4, 0));
    s_refused(c, "in rows of 4 of a piece of 6");

    c = s_new(OP_ID_rms_norm);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(3));
    s_ctx(c, S(3, 0));
    s_refused(c, "into a smaller output");

    /* fits: rms_norm of [3, 4] (eps 0) is [3, 4] / sqrt(12.5) */
    c = s_new(OP_ID_rms_norm);
    float *x = s_in(c, F32, S(1, 2))->data, *y = s_out(c, F32, S(1, 2))->data;
    x[0] = 3, x[1] = 4;
    s_ctx(c, S(2, 0));
    s_floats(c, 1, (double[]){0.0});
    s_runs(c, "of one row");
    float r = 1.0f / sqrtf(12.5f);
    cr_expect(fabsf(y[0] - 3 * r) < 1e-6f && fabsf(y[1] - 4 * r) < 1e-6f, "rms_norm: %g %g", y[0], y[1]);
    s_free(c);
}

/* ---- views and data movement ----------------------------------------------------------------- */

Test(hostile, views)
{
    s_call *c = s_new(OP_ID_permute);
    s_in(c, F32, S(2, 3));
    s_out(c, F32, S(2, 2));
    s_ints(c, S(0, 0));
    s_refused(c, "by [0, 0], which names dim 0 twice");

    c = s_new(OP_ID_permute);
    s_in(c, F32, S(2, 3));
    s_out(c, BOOL, S(3, 2));
    s_ints(c, S(1, 0));
    s_refused(c, "into a bool output of a float32 input");

    c = s_new(OP_ID_expand);
    s_in(c, F32, S(1, 3));
    s_out(c, BOOL, S(2, 3));
    s_refused(c, "into a bool output of a float32 input");

    c = s_new(OP_ID_index_select);
    s_in(c, F32, S(2, 3));
    s_in(c, I64, S(7));
    s_out(c, F32, S(2, 3));
    s_ints(c, S(5, 0));
    s_refused(c, "along dim 5 of a 2-D piece");

    c = s_new(OP_ID_index_select);
    s_in(c, F32, S(2, 3));
    s_in(c, F32, S(2));
    s_out(c, F32, S(2, 3));
    s_ints(c, S(0, 0));
    s_refused(c, "by float32 positions");

    c = s_new(OP_ID_index_select);
    s_in(c, F32, S(2, 3));
    s_in(c, I64, S(1));
    s_out(c, F32, S(1, 2));
    s_ints(c, S(0, 0));
    s_refused(c, "into rows shorter than the input's");

    c = s_new(OP_ID_triu);
    s_in(c, F32, S(3, 3));
    s_out(c, F32, S(2, 2));
    s_ctx(c, S(0, 0));
    s_refused(c, "into a smaller output");

    c = s_new(OP_ID_slice);
    s_in(c, F32, S(4));
    s_out(c, F32, S(2));
    s_ctx(c, S(0, 1, INT64_MAX));
    s_refused(c, "of two elements a step of INT64_MAX apart");

    c = s_new(OP_ID_cat);
    s_in(c, F32, S(0, INT64_C(1) << 62));
    s_in(c, F32, S(0, INT64_C(1) << 62));
    s_out(c, F32, S(0, INT64_C(1) << 62));
    s_ints(c, S(1));
    s_refused(c, "of two pieces of 2^62 into 2^62 along dim 1");

    /* fits: a row far below the diagonal's reach keeps nothing of triu */
    c = s_new(OP_ID_triu);
    float *x = s_in(c, F32, S(2, 2))->data, *y = s_out(c, F32, S(2, 2))->data;
    memcpy(x, (float[]){1, 2, 3, 4}, sizeof(float[4]));
    s_ctx(c, S(INT64_MAX, 0));
    s_runs(c, "of rows from INT64_MAX on");
    for (int i = 0; i < 4; i++)
        cr_expect(y[i] == 0.0f, "triu: y[%d] = %g", i, y[i]);
    s_free(c);

    /* fits: one element at 2 with any step */
    c = s_new(OP_ID_slice);
    x = s_in(c, F32, S(4))->data, y = s_out(c, F32, S(1))->data;
    memcpy(x, (float[]){1, 2, 3, 4}, sizeof(float[4]));
    s_ctx(c, S(0, 2, INT64_MAX));
    s_runs(c, "of one element");
    cr_expect(y[0] == 3.0f, "slice: %g", y[0]);
    s_free(c);

    /* fits: [[1, 2, 3], [4, 5, 6]] permuted by [1, 0] */
    c = s_new(OP_ID_permute);
    x = s_in(c, F32, S(2, 3))->data, y = s_out(c, F32, S(3, 2))->data;
    memcpy(x, (float[]){1, 2, 3, 4, 5, 6}, sizeof(float[6]));
    s_ints(c, S(-1, 0));
    s_runs(c, "by [-1, 0]");
    const float want[6] = {1, 4, 2, 5, 3, 6};
    for (int i = 0; i < 6; i++)
        cr_expect(y[i] == want[i], "permute: y[%d] = %g, want %g", i, y[i], want[i]);
    s_free(c);
}

/* ---- products' family: embedding, attention; rotary embedding ------------------------------- */

Test(hostile, embedding)
{
    s_call *c = s_new(OP_ID_embedding);
    s_in(c, I64, S(3));
    s_in(c, F32, S(4, 2));
    s_out(c, F32, 0, NULL);
    s_ctx(c, S(0, 4));
    s_refused(c, "into a 0-D output");

    c = s_new(OP_ID_embedding);
    s_in(c, I64, S(3));
    s_in(c, F32, S(4, 2));
    s_out(c, BOOL, S(3, 2));
    s_ctx(c, S(0, 4));
    s_refused(c, "of float32 rows into a bool output");

    c = s_new(OP_ID_embedding);
    s_in(c, F32, S(3));
    s_in(c, F32, S(4, 2));
    s_out(c, F32, S(3, 2));
    s_ctx(c, S(0, 4));
    s_refused(c, "by float32 positions");

    c = s_new(OP_ID_embedding);
    s_in(c, I64, S(3));
    s_in(c, F32, S(4, 2));
    s_out(c, F32, S(3, 2));
    s_ctx(c, S(INT64_MIN, 4));
    s_refused(c, "of a shard said to start at row INT64_MIN");

    /* fits: rows 1..4 of a vocabulary of 5 here; positions 4, 0, 2 read local rows 3, none, 1 */
    c = s_new(OP_ID_embedding);
    int64_t *idx = s_in(c, I64, S(3))->data;
    float *w = s_in(c, F32, S(4, 2))->data, *y = s_out(c, F32, S(3, 2))->data;
    memcpy(idx, (int64_t[]){4, 0, 2}, sizeof(int64_t[3]));
    for (int i = 0; i < 8; i++)
        w[i] = (float)i;
    s_ctx(c, S(1, 5));
    s_runs(c, "of a shard of rows");
    const float want[6] = {6, 7, 0, 0, 2, 3};
    for (int i = 0; i < 6; i++)
        cr_expect(y[i] == want[i], "embedding: y[%d] = %g, want %g", i, y[i], want[i]);
    s_free(c);
}

static s_call *s_sdpa(int64_t Bq, int64_t Eq, int64_t Ek, int64_t Sk, int64_t Sv, int64_t Bo, dt_dtype out)
{
    s_call *c = s_new(OP_ID_scaled_dot_product_attention);
    s_in(c, F32, S(Bq, 2, Eq));
    s_in(c, F32, S(Bq, Sk, Ek));
    s_in(c, F32, S(Bq, Sv, 4));
    s_out(c, out, S(Bo, 2, 4));
    s_ctx(c, S(0));
    return c;
}

Test(hostile, sdpa)
{
    s_refused(s_sdpa(1, 4, 2, 3, 3, 1, F32), "with keys of 2 for queries of 4");
    s_refused(s_sdpa(1, 4, 4, 3, 2, 1, F32), "with 2 values for 3 keys");
    s_refused(s_sdpa(2, 4, 4, 3, 3, 1, F32), "into an output of one batch of two");
    s_refused(s_sdpa(1, 4, 4, 3, 3, 1, I32), "into an int32 output");

    /* fits: a causal row from INT64_MAX on sees both keys (equal scores): the values' mean, 3 */
    s_call *c = s_new(OP_ID_scaled_dot_product_attention);
    float *q = s_in(c, F32, S(1, 1, 1))->data, *k = s_in(c, F32, S(1, 2, 1))->data;
    float *v = s_in(c, F32, S(1, 2, 1))->data, *y = s_out(c, F32, S(1, 1, 1))->data;
    q[0] = 1, k[0] = k[1] = 0, v[0] = 2, v[1] = 4;
    s_ints(c, S(1, 0, 0));
    s_ctx(c, S(INT64_MAX));
    s_runs(c, "of a causal row from INT64_MAX");
    cr_expect(fabsf(y[0] - 3.0f) < 1e-6f, "sdpa: %g", y[0]);
    s_free(c);
}

static s_call *s_rope(int xnd, dt_dtype pos, int64_t half, int64_t D_out)
{
    s_call *c = s_new(OP_ID_rope);
    s_in(c, F32, xnd, (int64_t[]){1, 1, 1, 2});
    s_in(c, pos, S(1, 1));
    s_in(c, F32, S(half));
    s_out(c, F32, S(1, 1, 1, D_out));
    s_floats(c, 1, (double[]){2.0});
    return c;
}

Test(hostile, rope)
{
    s_refused(s_rope(3, I64, 1, 2), "of a 3-D x");
    s_refused(s_rope(4, I32, 1, 2), "at int32 positions");
    s_refused(s_rope(4, I64, 0, 2), "with no frequencies for a head of 2");
    s_refused(s_rope(4, I64, 1, 1), "into a smaller output");

    /* fits: [1, 0] at position 0, scaled by 2 */
    s_call *c = s_rope(4, I64, 1, 2);
    float *x = c->k.in[0].data, *y = c->k.out[0].data;
    x[0] = 1, x[1] = 0;
    ((float *)c->k.in[2].data)[0] = 1;
    s_runs(c, "of one pair");
    cr_expect(y[0] == 2.0f && y[1] == 0.0f, "rope: %g %g", y[0], y[1]);
    s_free(c);
}

/* ---- writes in place ------------------------------------------------------------------------- */

/* dst is input 0 and output 0 (of out_dtype: what the record says) */
static s_call *s_write(int op, int dnd, const int64_t *dshape, dt_dtype out_dtype)
{
    s_call *c = s_new(op);
    op_local *dst = s_in(c, F32, dnd, dshape);
    c->k.out[c->k.nout++] = *dst;
    c->k.out[0].dtype = out_dtype;
    return c;
}

Test(hostile, writes)
{
    s_call *c = s_write(OP_ID_slice_assign_, S(4), F32);
    s_in(c, F32, S(2));
    s_ints(c, S(5, 0));
    s_ctx(c, S(0));
    s_refused(c, "along dim 5 of a 1-D piece");

    c = s_write(OP_ID_slice_assign_, S(2, 2), F32);
    s_in(c, F32, S(3, 1));
    s_ints(c, S(1, 0));
    s_ctx(c, S(0));
    s_refused(c, "of a src of 3 rows into 2");

    c = s_write(OP_ID_slice_assign_, S(4), F32);
    s_in(c, F32, S(2));
    s_ints(c, S(0, INT64_MAX));
    s_ctx(c, S(0));
    s_refused(c, "at INT64_MAX");

    c = s_write(OP_ID_slice_assign_, S(4), I64);
    s_in(c, F32, S(2));
    s_ints(c, S(0, 1));
    s_ctx(c, S(0));
    s_refused(c, "into its float32 input as int64");

    c = s_write(OP_ID_index_copy_, S(4), F32);
    s_in(c, I32, S(2));
    s_in(c, F32, S(2));
    s_ints(c, S(0));
    s_refused(c, "at int32 positions");

    c = s_write(OP_ID_index_copy_, S(4), F32);
    s_in(c, I64, S(3, 0));
    s_in(c, F32, S(3));
    s_ints(c, S(0));
    s_refused(c, "at a 2-D (3, 0) index");

    c = s_write(OP_ID_index_copy_, S(4), F32);
    s_in(c, I64, S(1));
    s_in(c, F32, S(2));
    s_ints(c, S(0));
    s_refused(c, "of 2 rows at 1 position");

    /* fits: [1, 2] at 1 of four zeros; [5, 6] at positions 2, 0 of three zeros */
    c = s_write(OP_ID_slice_assign_, S(4), F32);
    float *dst = c->k.in[0].data, *src = s_in(c, F32, S(2))->data;
    src[0] = 1, src[1] = 2;
    s_ints(c, S(0, 1));
    s_ctx(c, S(0));
    s_runs(c, "of two elements");
    cr_expect(dst[0] == 0 && dst[1] == 1 && dst[2] == 2 && dst[3] == 0, "slice_assign_: %g %g %g %g", dst[0], dst[1],
              dst[2], dst[3]);
    s_free(c);
    c = s_write(OP_ID_index_copy_, S(3), F32);
    dst = c->k.in[0].data;
    int64_t *at = s_in(c, I64, S(2))->data;
    src = s_in(c, F32, S(2))->data;
    at[0] = 2, at[1] = 0, src[0] = 5, src[1] = 6;
    s_ints(c, S(0));
    s_runs(c, "of two rows");
    cr_expect(dst[0] == 6 && dst[1] == 0 && dst[2] == 5, "index_copy_: %g %g %g", dst[0], dst[1], dst[2]);
    s_free(c);
}

/* ---- images ---------------------------------------------------------------------------------- */

Test(hostile, images)
{
    s_call *c = s_new(OP_ID_conv2d);
    s_in(c, F32, S(1, 1, 3, 3));
    s_in(c, F32, S(1, 1, 1, 1));
    s_out(c, F32, S(1, 1, 3, 3));
    s_ints(c, S(INT64_MAX, 1, 0, 0, 0, 0, 1, 1, 1));
    s_refused(c, "of a stride of INT64_MAX over 3 output rows");

    c = s_new(OP_ID_interpolate);
    s_in(c, F32, S(1, 1, 2));
    s_out(c, F32, S(1, 1, 4));
    s_ints(c, S(0, 0, 4));
    s_floats(c, 1, (double[]){1e-300});
    s_refused(c, "by a scale factor of 1e-300");

    c = s_new(OP_ID_pad);
    s_in(c, F32, S(3));
    s_out(c, F32, S(10));
    s_ints(c, S(0, 1, 1));
    s_refused(c, "of 3 by 1 and 1 into 10");

    c = s_new(OP_ID_pad);
    s_in(c, F32, S(3));
    s_out(c, F32, S(3));
    s_ints(c, S(0, INT64_MIN, 0));
    s_refused(c, "by INT64_MIN");

    /* empty pieces whose other dims multiply past int64: nothing to compute */
    c = s_new(OP_ID_conv2d);
    s_in(c, F32, S(0, BIG, BIG, BIG));
    s_in(c, F32, S(0, BIG, 1, 1));
    s_out(c, F32, S(0, 0, 1, 1));
    s_ints(c, S(1, 1, 0, 0, 0, 0, 1, 1, 1));
    s_runs(c, "of no images");
    s_free(c);
    c = s_new(OP_ID_group_norm);
    s_in(c, F32, S(0, 4, BIG, BIG));
    s_out(c, F32, S(0, 4, BIG, BIG));
    s_ints(c, S(2, 0));
    s_floats(c, 1, (double[]){1e-5});
    s_runs(c, "of no images");
    s_free(c);
    /* ... and an empty input padded into one element of the fill value, its huge dims cropped */
    c = s_new(OP_ID_pad);
    s_in(c, F32, S(0, BIG, BIG));
    float *y = s_out(c, F32, S(1, 1, 1))->data;
    s_ints(c, S(0, 0, -(BIG - 1), 0, -(BIG - 1), 1, 0));
    s_floats(c, 1, (double[]){2.5});
    s_runs(c, "of an empty piece");
    cr_expect(y[0] == 2.5f, "pad: %g", y[0]);
    s_free(c);

    /* fits: [1, 2, 3] reflected by 2 and 1 is [3, 2, 1, 2, 3, 2] */
    c = s_new(OP_ID_pad);
    float *x = s_in(c, F32, S(3))->data;
    y = s_out(c, F32, S(6))->data;
    memcpy(x, (float[]){1, 2, 3}, sizeof(float[3]));
    s_ints(c, S(1, 2, 1));
    s_runs(c, "reflecting");
    const float want[6] = {3, 2, 1, 2, 3, 2};
    for (int i = 0; i < 6; i++)
        cr_expect(y[i] == want[i], "pad: y[%d] = %g, want %g", i, y[i], want[i]);
    s_free(c);

    /* fits: [1, 2] to 4 by nearest is [1, 1, 2, 2]; a 1x1 convolution by 2 doubles */
    c = s_new(OP_ID_interpolate);
    x = s_in(c, F32, S(1, 1, 2))->data;
    y = s_out(c, F32, S(1, 1, 4))->data;
    x[0] = 1, x[1] = 2;
    s_ints(c, S(0, 0, 4));
    s_floats(c, 1, (double[]){0});
    s_runs(c, "by nearest");
    cr_expect(y[0] == 1 && y[1] == 1 && y[2] == 2 && y[3] == 2, "interpolate: %g %g %g %g", y[0], y[1], y[2], y[3]);
    s_free(c);
    c = s_new(OP_ID_conv2d);
    x = s_in(c, F32, S(1, 1, 2, 2))->data;
    float *w = s_in(c, F32, S(1, 1, 1, 1))->data;
    y = s_out(c, F32, S(1, 1, 2, 2))->data;
    memcpy(x, (float[]){1, 2, 3, 4}, sizeof(float[4]));
    w[0] = 2;
    s_ints(c, S(1, 1, 0, 0, 0, 0, 1, 1, 1));
    s_runs(c, "of a 1x1 kernel");
    cr_expect(y[0] == 2 && y[1] == 4 && y[2] == 6 && y[3] == 8, "conv2d: %g %g %g %g", y[0], y[1], y[2], y[3]);
    s_free(c);
}
