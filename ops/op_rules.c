/* op_rules — the pieces of shape, dtype and placement rules that many ops share. */
#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "op_registry.h"

/* torch's promotion lattice over our dtypes: bool < integers < floating; within a kind, the
 * wider wins; float16 with bfloat16 gives float32. */
static int s_rank(dt_dtype d)
{
    switch (d) {
    case DT_BOOL: return 0;
    case DT_INT32: return 1;
    case DT_INT64: return 2;
    case DT_FLOAT16:
    case DT_BFLOAT16: return 3;
    default: return 4;
    }
}

dt_dtype op_promote(dt_dtype a, dt_dtype b)
{
    if (a == b)
        return a;
    if ((a == DT_FLOAT16 && b == DT_BFLOAT16) || (a == DT_BFLOAT16 && b == DT_FLOAT16))
        return DT_FLOAT32;
    return s_rank(a) >= s_rank(b) ? a : b;
}

dt_dtype op_promote_scalar(dt_dtype t, dt_scalar s)
{
    if (!s.is_int && !dt_dtype_is_float(t))
        return DT_FLOAT32; /* an integer or bool tensor with a float number: the default float */
    return t;
}

int op_broadcast(const char *op, int an, const int64_t *a, int bn, const int64_t *b, int *on, int64_t *out)
{
    int n = an > bn ? an : bn;
    for (int i = 0; i < n; i++) {
        int64_t x = i < n - an ? 1 : a[i - (n - an)];
        int64_t y = i < n - bn ? 1 : b[i - (n - bn)];
        if (x != y && x != 1 && y != 1)
            return dt_err(DT_EINVAL,
                          "%s: The size of tensor a (%lld) must match the size of tensor b (%lld) at non-singleton "
                          "dimension %d", op, (long long)x, (long long)y, i);
        out[i] = x == 1 ? y : x;
    }
    *on = n;
    return 0;
}

int op_dim(const char *op, int64_t dim, int ndim, int *out)
{
    int64_t n = ndim > 0 ? ndim : 1; /* a 0-d tensor accepts dims -1 and 0, as torch does */
    if (dim < -n || dim >= n)
        return dt_err(DT_EINDEX, "%s: Dimension out of range (expected to be in range of [%lld, %lld], but got %lld)",
                      op, (long long)-n, (long long)(n - 1), (long long)dim);
    *out = (int)(dim < 0 ? dim + n : dim);
    return 0;
}

void op_replicate_all(dt_placement *pl, int mesh_ndim)
{
    for (int i = 0; i < mesh_ndim; i++)
        pl[i] = dt_replicate();
}

bool op_same_placements(const dt_placement *a, const dt_placement *b, int mesh_ndim)
{
    for (int i = 0; i < mesh_ndim; i++)
        if (a[i].kind != b[i].kind || (a[i].kind == DT_SHARD && a[i].dim != b[i].dim) ||
            (a[i].kind == DT_PARTIAL && a[i].reduce_op != b[i].reduce_op))
            return false;
    return true;
}

int64_t op_cost(const op_call *c, int i, const dt_placement *to)
{
    const op_arg *a = &c->in[i];
    if (op_same_placements(a->pl, to, c->mesh_ndim))
        return 0;
    return c->cost(c->mesh, a->ndim, a->shape, a->dtype, a->pl, to);
}
