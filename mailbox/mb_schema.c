/* mb_schema — the strict decoders of every record, generated from the tables in mb_schema.h:
 * one reader per field type, one decoder per record that reads the bytes in one pass, checking
 * the arity, the code and each field in turn, and names the first one that is wrong. */
#include "mb_schema.h"

#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"

_Static_assert(MB_MAX_INTS == sizeof ((dt_op_attrs *)0)->ints / sizeof(int64_t), "INTS holds dt_op_attrs.ints");
_Static_assert(MB_MAX_FLOATS == sizeof ((dt_op_attrs *)0)->floats / sizeof(double), "FLOATS holds dt_op_attrs.floats");

/* ---- field readers: one field at the cursor, which then points past it ------------------ */

static bool s_get_U64(mb_cursor *c, uint64_t *out) { return mb_read_u64(c, out); }

static bool s_get_I64(mb_cursor *c, int64_t *out) { return mb_read_i64(c, out); }

static bool s_get_BOOL(mb_cursor *c, bool *out) { return mb_read_bool(c, out); }

/* an integer in [lo, hi] */
static bool s_get_enum(mb_cursor *c, int64_t lo, int64_t hi, int64_t *out)
{
    return mb_read_i64(c, out) && *out >= lo && *out <= hi;
}

static bool s_get_DTYPE(mb_cursor *c, dt_dtype *out)
{
    int64_t v;
    if (!s_get_enum(c, 0, DT_NDTYPES - 1, &v))
        return false;
    *out = (dt_dtype)v;
    return true;
}

static bool s_get_REDUCE(mb_cursor *c, dt_reduce_op *out)
{
    int64_t v;
    if (!s_get_enum(c, DT_REDUCE_SUM, DT_REDUCE_MIN, &v))
        return false;
    *out = (dt_reduce_op)v;
    return true;
}

static bool s_get_MODE(mb_cursor *c, mb_part_mode *out)
{
    int64_t v;
    if (!s_get_enum(c, MB_PART_COPY, MB_PART_DIV, &v))
        return false;
    *out = (mb_part_mode)v;
    return true;
}

static bool s_get_SCALAR(mb_cursor *c, dt_scalar *out)
{
    double f;
    if (mb_read_float(c, &f)) {
        *out = (dt_scalar){.is_int = false, .f = f};
        return true;
    }
    if (!mb_read_i64(c, &out->i))
        return false;
    out->is_int = true;
    out->f = (double)out->i;
    return true;
}

static bool s_get_OSCALAR(mb_cursor *c, mb_oscalar *out)
{
    out->present = !mb_read_nil(c);
    return !out->present || s_get_SCALAR(c, &out->value);
}

static bool s_get_STR(mb_cursor *c, mb_str *out) { return mb_read_str(c, &out->ptr, &out->len); }

static bool s_get_OSTR(mb_cursor *c, mb_str *out)
{
    *out = (mb_str){NULL, 0};
    return mb_read_nil(c) || s_get_STR(c, out);
}

/* an array of at most max integers */
static bool s_get_i64s(mb_cursor *c, int64_t *v, uint32_t max, int *n)
{
    uint32_t len;
    if (!mb_read_array(c, &len) || len > max)
        return false;
    for (uint32_t k = 0; k < len; k++)
        if (!mb_read_i64(c, &v[k]))
            return false;
    *n = (int)len;
    return true;
}

static bool s_get_DIMS(mb_cursor *c, mb_dims *out) { return s_get_i64s(c, out->v, DT_MAX_DIMS, &out->n); }

static bool s_get_SHAPE(mb_cursor *c, mb_dims *out)
{
    return s_get_DIMS(c, out) && dt_layout_check_shape("record", out->n, out->v) == 0;
}

static bool s_get_IDS(mb_cursor *c, mb_ids *out)
{
    uint32_t len;
    if (!mb_read_array(c, &len) || len > MB_MAX_IDS)
        return false;
    for (uint32_t k = 0; k < len; k++)
        if (!mb_read_u64(c, &out->v[k]))
            return false;
    out->n = (int)len;
    return true;
}

static bool s_get_INTS(mb_cursor *c, mb_ints *out) { return s_get_i64s(c, out->v, MB_MAX_INTS, &out->n); }

static bool s_get_FLOATS(mb_cursor *c, mb_floats *out)
{
    uint32_t len;
    if (!mb_read_array(c, &len) || len > MB_MAX_FLOATS)
        return false;
    for (uint32_t k = 0; k < len; k++)
        if (!mb_read_f64(c, &out->v[k]))
            return false;
    out->n = (int)len;
    return true;
}

static bool s_get_VIEWS(mb_cursor *c, mb_views *out) { return s_get_i64s(c, out->v, MB_MAX_VIEW_INTS, &out->n); }

int mb_view_next(const mb_views *views, int *at, int nin, mb_view *out)
{
    int p = *at, left = views->n - p;
    if (left == 0)
        return 0;
    int64_t rank = left >= 3 ? views->v[p + 2] : 0;
    bool strided = rank < 0;
    rank = strided ? -rank : rank;
    if (left < 3 || views->v[p] < 0 || views->v[p] >= nin || views->v[p + 1] < 0 || rank > DT_MAX_DIMS ||
        rank * (strided ? 2 : 1) > left - 3)
        return dt_err(DT_EPROTO, "malformed compute record: its views are not [input, first, rank, sizes...] or "
                      "[input, first, -rank, sizes..., strides...]");
    out->input = (int)views->v[p];
    out->first = views->v[p + 1];
    out->shape.n = (int)rank;
    out->strided = strided;
    memcpy(out->shape.v, &views->v[p + 3], (size_t)rank * sizeof *out->shape.v);
    if (dt_layout_check_shape("record", out->shape.n, out->shape.v) != 0)
        return dt_err(DT_EPROTO, "malformed compute record: a view's sizes are not a shape");
    for (int d = 0; d < rank && strided; d++) {
        int64_t stride = views->v[p + 3 + rank + d];
        if (stride < 0)
            return dt_err(DT_EPROTO, "malformed compute record: a view's stride is negative");
        /* a dim of one element is never stepped along: whatever its stride says, it reads as 0, so
         * that no product of it (in elements or bytes) can overflow where the extent does not */
        out->strides[d] = out->shape.v[d] > 1 ? stride : 0;
    }
    *at = p + 3 + (int)rank * (strided ? 2 : 1);
    return 1;
}

int64_t mb_view_extent(const mb_view *v)
{
    int64_t n = dt_layout_numel(v->shape.n, v->shape.v);
    if (n == 0)
        return 0;
    if (!v->strided)
        return v->first > INT64_MAX - n ? -1 : v->first + n;
    int64_t last = v->first; /* the element at the far corner */
    for (int d = 0; d < v->shape.n; d++) {
        int64_t step;
        if (__builtin_mul_overflow(v->shape.v[d] - 1, v->strides[d], &step) || __builtin_add_overflow(last, step, &last))
            return -1;
    }
    return last == INT64_MAX ? -1 : last + 1;
}

/* An array whose elements are read one by one by their user (mb_read_part): each is
 * checked whole here, so the list's cursor ends exactly after its last element. */
static bool s_get_list(mb_cursor *c, mb_list *out)
{
    uint32_t n;
    if (!mb_read_array(c, &n))
        return false;
    const uint8_t *first = c->p;
    for (uint32_t k = 0; k < n; k++)
        if (mb_skip(c) != 0)
            return false;
    *out = (mb_list){n, {first, c->p}};
    return true;
}

static bool s_get_PARTS(mb_cursor *c, mb_list *out) { return s_get_list(c, out); }

static bool s_get_OUTS(mb_cursor *c, mb_outs *out)
{
    if (!mb_read_array(c, &out->n) || out->n > MB_MAX_OUTS)
        return false;
    for (uint32_t k = 0; k < out->n; k++)
        if (mb_read_out(c, &out->v[k]) != 0)
            return false;
    return true;
}

#define S_DESC_U64 "an unsigned integer"
#define S_DESC_I64 "an integer"
#define S_DESC_BOOL "a boolean"
#define S_DESC_DTYPE "a dtype"
#define S_DESC_REDUCE "a reduce op"
#define S_DESC_MODE "a part mode"
#define S_DESC_SCALAR "a number"
#define S_DESC_OSCALAR "a number or nil"
#define S_DESC_STR "a string"
#define S_DESC_OSTR "a string or nil"
#define S_DESC_SHAPE "a shape (at most 8 sizes >= 0, at most 2^48 elements)"
#define S_DESC_DIMS "an array of at most 8 integers"
#define S_DESC_IDS "an array of at most 32 unsigned integers"
#define S_DESC_INTS "an array of at most 16 integers"
#define S_DESC_FLOATS "an array of at most 4 numbers"
#define S_DESC_VIEWS "an array of at most 80 integers"
#define S_DESC_PARTS "an array of part records"
#define S_DESC_OUTS "an array of at most 2 out records"

/* ---- records ------------------------------------------------------------------------------ */

/* Reads the header of an array of exactly nfields elements, the first being code (code < 0: a
 * record without one). */
static int s_check_shape(mb_cursor *c, const char *name, int64_t code, uint32_t nfields)
{
    uint32_t n;
    if (!mb_read_array(c, &n))
        return dt_err(DT_EPROTO, "malformed %s record: not an array", name);
    if (n != nfields)
        return dt_err(DT_EPROTO, "malformed %s record: %u elements, expected %u", name, n, nfields);
    int64_t got;
    if (code >= 0 && (!mb_read_i64(c, &got) || got != code))
        return dt_err(DT_EPROTO, "malformed %s record: it does not start with code %lld", name, (long long)code);
    return 0;
}

#define S_DECODE_FIELD(T, f)                                                                          \
    if (!s_get_##T(c, &out->f))                                                                       \
        return dt_err(DT_EPROTO, "malformed %s record: element %u (%s) is not %s", what, i, #f, S_DESC_##T); \
    i++;

#define S_DECODER(NAME, name, code, first)                                                            \
    int mb_read_##name(mb_cursor *c, mb_##name##_rec *out)                                            \
    {                                                                                                 \
        static const char what[] = #name;                                                             \
        uint32_t i = first;                                                                           \
        int rc = s_check_shape(c, what, code, first MB_FIELDS_##NAME(MB_GEN_COUNT));                  \
        if (rc)                                                                                       \
            return rc;                                                                                \
        MB_FIELDS_##NAME(S_DECODE_FIELD)                                                              \
        return 0;                                                                                     \
    }
#define S_DECODER_CODED(NAME, name, code) S_DECODER(NAME, name, code, 1)
#define S_DECODER_PLAIN(NAME, name) S_DECODER(NAME, name, -1, 0)

MB_OP_RECORDS(S_DECODER_CODED)
MB_COMPLETION_RECORDS(S_DECODER_CODED)
MB_PLAIN_RECORDS(S_DECODER_PLAIN)

int mb_record_code(const mb_cursor *rec, int64_t *code)
{
    mb_cursor c = *rec;
    uint32_t n;
    if (!mb_read_array(&c, &n) || n < 1 || !mb_read_i64(&c, code))
        return dt_err(DT_EPROTO, "malformed record: not an array that starts with its code");
    return 0;
}

bool mb_field_u64(const mb_cursor *rec, uint32_t i, uint64_t *out)
{
    mb_cursor c;
    return mb_elem(*rec, i, &c) && mb_read_u64(&c, out);
}

#define S_NAME_CASE(NAME, name, code)                                                                 \
    case code:                                                                                        \
        return #name;

const char *mb_op_name(int64_t code)
{
    switch (code) {
        MB_OP_RECORDS(S_NAME_CASE)
    default: return "?";
    }
}
