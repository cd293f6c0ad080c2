/* mb_schema — the strict decoders of every record, generated from the tables in mb_schema.h:
 * one reader per field type, one decoder per record that checks the arity, the code and each
 * field in turn and names the first one that is wrong. */
#include "mb_schema.h"

#include <string.h>

#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "mb_codec.h"

_Static_assert(MB_MAX_INTS == sizeof ((dt_op_attrs *)0)->ints / sizeof(int64_t), "INTS holds dt_op_attrs.ints");
_Static_assert(MB_MAX_FLOATS == sizeof ((dt_op_attrs *)0)->floats / sizeof(double), "FLOATS holds dt_op_attrs.floats");

/* ---- field readers: element i of the record array rec ------------------------------------ */

static const msgpack_object *s_at(const msgpack_object *rec, uint32_t i) { return &rec->via.array.ptr[i]; }

static bool s_get_U64(const msgpack_object *rec, uint32_t i, uint64_t *out) { return mb_get_u64(rec, i, out); }

static bool s_get_I64(const msgpack_object *rec, uint32_t i, int64_t *out) { return mb_get_i64(rec, i, out); }

static bool s_get_BOOL(const msgpack_object *rec, uint32_t i, bool *out)
{
    if (s_at(rec, i)->type != MSGPACK_OBJECT_BOOLEAN)
        return false;
    *out = s_at(rec, i)->via.boolean;
    return true;
}

static bool s_get_DTYPE(const msgpack_object *rec, uint32_t i, dt_dtype *out)
{
    int64_t v;
    if (!mb_get_i64(rec, i, &v) || v < 0 || v >= DT_NDTYPES)
        return false;
    *out = (dt_dtype)v;
    return true;
}

static bool s_get_REDUCE(const msgpack_object *rec, uint32_t i, dt_reduce_op *out)
{
    int64_t v;
    if (!mb_get_i64(rec, i, &v) || v < DT_REDUCE_SUM || v > DT_REDUCE_MIN)
        return false;
    *out = (dt_reduce_op)v;
    return true;
}

static bool s_get_MODE(const msgpack_object *rec, uint32_t i, mb_part_mode *out)
{
    int64_t v;
    if (!mb_get_i64(rec, i, &v) || v < MB_PART_COPY || v > MB_PART_DIV)
        return false;
    *out = (mb_part_mode)v;
    return true;
}

static bool s_get_SCALAR(const msgpack_object *rec, uint32_t i, dt_scalar *out)
{
    msgpack_object_type type = s_at(rec, i)->type;
    if (type == MSGPACK_OBJECT_FLOAT32 || type == MSGPACK_OBJECT_FLOAT64) {
        *out = (dt_scalar){.is_int = false, .f = s_at(rec, i)->via.f64};
        return true;
    }
    if (!mb_get_i64(rec, i, &out->i))
        return false;
    out->is_int = true;
    out->f = (double)out->i;
    return true;
}

static bool s_get_OSCALAR(const msgpack_object *rec, uint32_t i, mb_oscalar *out)
{
    out->present = s_at(rec, i)->type != MSGPACK_OBJECT_NIL;
    return !out->present || s_get_SCALAR(rec, i, &out->value);
}

static bool s_get_STR(const msgpack_object *rec, uint32_t i, mb_str *out)
{
    return mb_get_str(rec, i, &out->ptr, &out->len);
}

static bool s_get_OSTR(const msgpack_object *rec, uint32_t i, mb_str *out)
{
    *out = (mb_str){NULL, 0};
    return s_at(rec, i)->type == MSGPACK_OBJECT_NIL || s_get_STR(rec, i, out);
}

static bool s_get_DIMS(const msgpack_object *rec, uint32_t i, mb_dims *out)
{
    uint32_t n;
    if (!mb_get_i64s(rec, i, out->v, DT_MAX_DIMS, &n))
        return false;
    out->n = (int)n;
    return true;
}

static bool s_get_SHAPE(const msgpack_object *rec, uint32_t i, mb_dims *out)
{
    return s_get_DIMS(rec, i, out) && dt_layout_check_shape("record", out->n, out->v) == 0;
}

static bool s_get_IDS(const msgpack_object *rec, uint32_t i, mb_ids *out)
{
    const msgpack_object *o = s_at(rec, i);
    if (!mb_arr(o, 0) || o->via.array.size > MB_MAX_IDS)
        return false;
    for (uint32_t k = 0; k < o->via.array.size; k++)
        if (!mb_get_u64(o, k, &out->v[k]))
            return false;
    out->n = (int)o->via.array.size;
    return true;
}

static bool s_get_INTS(const msgpack_object *rec, uint32_t i, mb_ints *out)
{
    uint32_t n;
    if (!mb_get_i64s(rec, i, out->v, MB_MAX_INTS, &n))
        return false;
    out->n = (int)n;
    return true;
}

static bool s_get_FLOATS(const msgpack_object *rec, uint32_t i, mb_floats *out)
{
    const msgpack_object *o = s_at(rec, i);
    if (!mb_arr(o, 0) || o->via.array.size > MB_MAX_FLOATS)
        return false;
    for (uint32_t k = 0; k < o->via.array.size; k++)
        if (!mb_get_f64(o, k, &out->v[k]))
            return false;
    out->n = (int)o->via.array.size;
    return true;
}

static bool s_get_VIEWS(const msgpack_object *rec, uint32_t i, mb_views *out)
{
    uint32_t n;
    if (!mb_get_i64s(rec, i, out->v, MB_MAX_VIEW_INTS, &n))
        return false;
    out->n = (int)n;
    return true;
}

int mb_view_next(const mb_views *views, int *at, int nin, mb_view *out)
{
    int p = *at, left = views->n - p;
    if (left == 0)
        return 0;
    if (left < 3 || views->v[p] < 0 || views->v[p] >= nin || views->v[p + 1] < 0 || views->v[p + 2] < 0 ||
        views->v[p + 2] > DT_MAX_DIMS || views->v[p + 2] > left - 3)
        return dt_err(DT_EPROTO, "malformed compute record: its views are not [input, first, rank, sizes...]");
    out->input = (int)views->v[p];
    out->first = views->v[p + 1];
    out->shape.n = (int)views->v[p + 2];
    memcpy(out->shape.v, &views->v[p + 3], (size_t)out->shape.n * sizeof *out->shape.v);
    if (dt_layout_check_shape("record", out->shape.n, out->shape.v) != 0)
        return dt_err(DT_EPROTO, "malformed compute record: a view's sizes are not a shape");
    *at = p + 3 + out->shape.n;
    return 1;
}

/* the elements are decoded one by one by their user (mb_decode_part, mb_decode_out) */
static bool s_get_list(const msgpack_object *rec, uint32_t i, mb_list *out)
{
    const msgpack_object *o = s_at(rec, i);
    if (!mb_arr(o, 0))
        return false;
    *out = (mb_list){o->via.array.size, o->via.array.ptr};
    return true;
}

static bool s_get_PARTS(const msgpack_object *rec, uint32_t i, mb_list *out) { return s_get_list(rec, i, out); }

static bool s_get_OUTS(const msgpack_object *rec, uint32_t i, mb_list *out) { return s_get_list(rec, i, out); }

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
#define S_DESC_VIEWS "an array of at most 48 integers"
#define S_DESC_PARTS "an array of part records"
#define S_DESC_OUTS "an array of out records"

/* ---- records ------------------------------------------------------------------------------ */

/* Checks that rec is an array of exactly nfields elements, the first being code (code < 0: a
 * record without one). */
static int s_check_shape(const msgpack_object *rec, const char *name, int64_t code, uint32_t nfields)
{
    if (!rec || rec->type != MSGPACK_OBJECT_ARRAY)
        return dt_err(DT_EPROTO, "malformed %s record: not an array", name);
    if (rec->via.array.size != nfields)
        return dt_err(DT_EPROTO, "malformed %s record: %u elements, expected %u", name, rec->via.array.size, nfields);
    int64_t got;
    if (code >= 0 && (!mb_get_i64(rec, 0, &got) || got != code))
        return dt_err(DT_EPROTO, "malformed %s record: it does not start with code %lld", name, (long long)code);
    return 0;
}

#define S_DECODE_FIELD(T, f)                                                                          \
    if (!s_get_##T(rec, i, &out->f))                                                                  \
        return dt_err(DT_EPROTO, "malformed %s record: element %u (%s) is not %s", what, i, #f, S_DESC_##T); \
    i++;

#define S_DECODER(NAME, name, code, first)                                                            \
    int mb_decode_##name(const msgpack_object *rec, mb_##name##_rec *out)                             \
    {                                                                                                 \
        static const char what[] = #name;                                                             \
        uint32_t i = first;                                                                           \
        int rc = s_check_shape(rec, what, code, first MB_FIELDS_##NAME(MB_GEN_COUNT));                \
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

int mb_record_code(const msgpack_object *rec, int64_t *code)
{
    if (!mb_arr(rec, 1) || !mb_get_i64(rec, 0, code))
        return dt_err(DT_EPROTO, "malformed record: not an array that starts with its code");
    return 0;
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
