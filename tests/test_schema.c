/* mb_schema: every record kind, driven by the schema's own tables, so that a record added there
 * is tested here without a new line: round trips of many sample values (every rank, both scalar
 * kinds, nil and not), as our writer and as msgpack-c's packer encode them, read alone or with
 * more bytes after them (as a body hands a record out); and malformed records per kind: truncated
 * at every length, each field replaced by values of other types, an element missing or extra, not
 * an array, another code; then random corruption, which must fail cleanly or decode (never crash:
 * ASan runs this too). Records are decoded from exact copies of their bytes, so that a read past
 * them is an ASan error; the malformed ones are built as msgpack-c objects and packed by
 * msgpack-c, independently of our writer. */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_error.h"
#include "mb_codec.h"
#include "mb_schema.h"

#define S_ROUNDS 40  /* sample sets per record: enough to cycle every array length */
#define S_ITEMS 2    /* elements of a sample list */
_Static_assert(S_ITEMS <= MB_MAX_OUTS, "a sample list fits in an OUTS field");

/* ---- sample values: a different one per field and round ---------------------------------- */

static uint64_t s_u64(int k) { return k % 3 == 0 ? UINT64_MAX - (uint64_t)k : (uint64_t)k * 1000003u; }
static int64_t s_i64(int k) { return k % 2 ? -(int64_t)k * 7919 : INT64_MAX - k; }

static void s_fill_i64s(int64_t *v, int *n, int k, int max, bool sizes)
{
    *n = k % (max + 1);
    for (int i = 0; i < *n; i++)
        v[i] = sizes ? (k + i) % 3 + 1 : s_i64(k + i);
}

/* Each field type: the sample it holds (S_HOLD), the encoder arguments made from it (S_ARG), how
 * it is made for round k (S_MAKE) and compared with a decoded member (S_CHECK). */
#define S_HOLD_U64(fld) uint64_t fld;
#define S_HOLD_I64(fld) int64_t fld;
#define S_HOLD_BOOL(fld) bool fld;
#define S_HOLD_DTYPE(fld) dt_dtype fld;
#define S_HOLD_REDUCE(fld) dt_reduce_op fld;
#define S_HOLD_MODE(fld) mb_part_mode fld;
#define S_HOLD_SCALAR(fld) dt_scalar fld;
#define S_HOLD_OSCALAR(fld) mb_oscalar fld;
#define S_HOLD_STR(fld) char fld[40];
#define S_HOLD_OSTR(fld) struct { bool present; char s[40]; } fld;
#define S_HOLD_SHAPE(fld) mb_dims fld;
#define S_HOLD_DIMS(fld) mb_dims fld;
#define S_HOLD_IDS(fld) mb_ids fld;
#define S_HOLD_INTS(fld) mb_ints fld;
#define S_HOLD_FLOATS(fld) mb_floats fld;
#define S_HOLD_VIEWS(fld) mb_views fld;
#define S_HOLD_PARTS(fld) struct { uint32_t n; s_sample_part items[S_ITEMS]; } fld;
#define S_HOLD_OUTS(fld) struct { uint32_t n; s_sample_out items[S_ITEMS]; } fld;

#define S_ARG_U64(fld) , s->fld
#define S_ARG_I64(fld) , s->fld
#define S_ARG_BOOL(fld) , s->fld
#define S_ARG_DTYPE(fld) , s->fld
#define S_ARG_REDUCE(fld) , s->fld
#define S_ARG_MODE(fld) , s->fld
#define S_ARG_SCALAR(fld) , s->fld
#define S_ARG_OSCALAR(fld) , s->fld.present ? &s->fld.value : NULL
#define S_ARG_STR(fld) , s->fld
#define S_ARG_OSTR(fld) , s->fld.present ? s->fld.s : NULL
#define S_ARG_SHAPE(fld) , s->fld.n, s->fld.v
#define S_ARG_DIMS(fld) , s->fld.n, s->fld.v
#define S_ARG_IDS(fld) , s->fld.n, s->fld.v
#define S_ARG_INTS(fld) , s->fld.n, s->fld.v
#define S_ARG_FLOATS(fld) , s->fld.n, s->fld.v
#define S_ARG_VIEWS(fld) , s->fld.n, s->fld.v
#define S_ARG_PARTS(fld) , s->fld.n
#define S_ARG_OUTS(fld) , s->fld.n

#define S_MAKE_U64(fld) s->fld = s_u64(k++);
#define S_MAKE_I64(fld) s->fld = s_i64(k++);
#define S_MAKE_BOOL(fld) s->fld = k++ % 2;
#define S_MAKE_DTYPE(fld) s->fld = (dt_dtype)(k++ % DT_NDTYPES);
#define S_MAKE_REDUCE(fld) s->fld = (dt_reduce_op)(k++ % 4);
#define S_MAKE_MODE(fld) s->fld = (mb_part_mode)(k++ % 3);
#define S_MAKE_SCALAR(fld)                                                                                   \
    s->fld = k % 2 ? (dt_scalar){.is_int = true, .i = s_i64(k), .f = (double)s_i64(k)}                        \
                 : (dt_scalar){.is_int = false, .f = -1.25 * k};                                           \
    k++;
#define S_MAKE_OSCALAR(fld)                                                                                  \
    s->fld.present = k % 3 != 0;                                                                             \
    s->fld.value = k % 2 ? (dt_scalar){.is_int = true, .i = -k, .f = (double)-k} : (dt_scalar){.f = 0.5 * k}; \
    k++;
#define S_MAKE_STR(fld) snprintf(s->fld, sizeof s->fld, "%.*s", k % 40, "a string of up to 39 bytes, say exactly");  \
    k++;
#define S_MAKE_OSTR(fld)                                                                                     \
    s->fld.present = k % 2;                                                                                  \
    snprintf(s->fld.s, sizeof s->fld.s, "error %d", k++);
#define S_MAKE_SHAPE(fld) s_fill_i64s(s->fld.v, &s->fld.n, k++, DT_MAX_DIMS, true);
#define S_MAKE_DIMS(fld) s_fill_i64s(s->fld.v, &s->fld.n, k++, DT_MAX_DIMS, false);
#define S_MAKE_IDS(fld)                                                                                      \
    s->fld.n = k % (MB_MAX_IDS + 1);                                                                         \
    for (int i = 0; i < s->fld.n; i++)                                                                       \
        s->fld.v[i] = s_u64(k + i);                                                                          \
    k++;
#define S_MAKE_INTS(fld) s_fill_i64s(s->fld.v, &s->fld.n, k++, MB_MAX_INTS, false);
#define S_MAKE_VIEWS(fld) s_fill_i64s(s->fld.v, &s->fld.n, k++, MB_MAX_VIEW_INTS, false);
#define S_MAKE_FLOATS(fld)                                                                                   \
    s->fld.n = k % (MB_MAX_FLOATS + 1);                                                                      \
    for (int i = 0; i < s->fld.n; i++)                                                                       \
        s->fld.v[i] = (k + i) * -0.125;                                                                      \
    k++;
#define S_MAKE_PARTS(fld)                                                                                    \
    s->fld.n = (uint32_t)(k % (S_ITEMS + 1));                                                                \
    for (uint32_t i = 0; i < S_ITEMS; i++)                                                                 \
        s_make_part(&s->fld.items[i], k + 7 * (int)i);                                                       \
    k++;
#define S_MAKE_OUTS(fld)                                                                                     \
    s->fld.n = (uint32_t)(k % (S_ITEMS + 1));                                                                \
    for (uint32_t i = 0; i < S_ITEMS; i++)                                                                 \
        s_make_out(&s->fld.items[i], k + 7 * (int)i);                                                        \
    k++;

#define S_CHECK_EQ(fld) cr_expect_eq(out->fld, s->fld, "%s.%s", what, #fld);
#define S_CHECK_U64(fld) S_CHECK_EQ(fld)
#define S_CHECK_I64(fld) S_CHECK_EQ(fld)
#define S_CHECK_BOOL(fld) S_CHECK_EQ(fld)
#define S_CHECK_DTYPE(fld) S_CHECK_EQ(fld)
#define S_CHECK_REDUCE(fld) S_CHECK_EQ(fld)
#define S_CHECK_MODE(fld) S_CHECK_EQ(fld)
#define S_CHECK_SCALAR(fld) s_check_scalar(out->fld, s->fld, what, #fld);
#define S_CHECK_OSCALAR(fld)                                                                                 \
    cr_expect_eq(out->fld.present, s->fld.present, "%s.%s: nil or not", what, #fld);                             \
    if (s->fld.present)                                                                                      \
        s_check_scalar(out->fld.value, s->fld.value, what, #fld);
#define S_CHECK_STR(fld) s_check_str(out->fld, s->fld, what, #fld);
#define S_CHECK_OSTR(fld)                                                                                    \
    cr_expect_eq(out->fld.ptr != NULL, s->fld.present, "%s.%s: nil or not", what, #fld);                         \
    if (s->fld.present)                                                                                      \
        s_check_str(out->fld, s->fld.s, what, #fld);
#define S_CHECK_ARRAY(fld)                                                                                   \
    cr_expect_eq(out->fld.n, s->fld.n, "%s.%s: length", what, #fld);                                             \
    cr_expect(out->fld.n != s->fld.n || !memcmp(out->fld.v, s->fld.v, (size_t)s->fld.n * sizeof *s->fld.v), "%s.%s", what, #fld);
#define S_CHECK_SHAPE(fld) S_CHECK_ARRAY(fld)
#define S_CHECK_DIMS(fld) S_CHECK_ARRAY(fld)
#define S_CHECK_IDS(fld) S_CHECK_ARRAY(fld)
#define S_CHECK_INTS(fld) S_CHECK_ARRAY(fld)
#define S_CHECK_FLOATS(fld) S_CHECK_ARRAY(fld)
#define S_CHECK_VIEWS(fld) S_CHECK_ARRAY(fld)
/* a list decodes to a cursor over its elements, read in turn; they fill it exactly */
#define S_CHECK_LIST(fld, elem)                                                                              \
    cr_assert_eq(out->fld.n, s->fld.n, "%s.%s: length", what, #fld);                                             \
    {                                                                                                        \
        mb_cursor it = out->fld.items;                                                                       \
        for (uint32_t i = 0; i < s->fld.n; i++) {                                                            \
            mb_##elem##_rec e;                                                                             \
            cr_assert_eq(mb_read_##elem(&it, &e), 0, "%s.%s[%u]: %s", what, #fld, i, dt_last_error());      \
            s_check_##elem(&e, &s->fld.items[i]);                                                            \
        }                                                                                                    \
        cr_expect(it.p == out->fld.items.end, "%s.%s: the elements fill the list", what, #fld);              \
    }
#define S_CHECK_PARTS(fld) S_CHECK_LIST(fld, part)
/* OUTS decodes to the OUT records themselves */
#define S_CHECK_OUTS(fld)                                                                                    \
    cr_assert_eq(out->fld.n, s->fld.n, "%s.%s: length", what, #fld);                                             \
    for (uint32_t i = 0; i < s->fld.n; i++)                                                                  \
        s_check_out(&out->fld.v[i], &s->fld.items[i]);

/* a list's elements follow the record that holds it */
#define S_AFTER_PARTS(fld)                                                                                   \
    for (uint32_t i = 0; i < s->fld.n; i++)                                                                  \
        s_write_part(w, &s->fld.items[i]);
#define S_AFTER_OUTS(fld)                                                                                    \
    for (uint32_t i = 0; i < s->fld.n; i++)                                                                  \
        s_write_out(w, &s->fld.items[i]);
#define S_AFTER(T, fld) S_AFTER_##T(fld)
#define S_AFTER_U64(fld)
#define S_AFTER_I64(fld)
#define S_AFTER_BOOL(fld)
#define S_AFTER_DTYPE(fld)
#define S_AFTER_REDUCE(fld)
#define S_AFTER_MODE(fld)
#define S_AFTER_SCALAR(fld)
#define S_AFTER_OSCALAR(fld)
#define S_AFTER_STR(fld)
#define S_AFTER_OSTR(fld)
#define S_AFTER_SHAPE(fld)
#define S_AFTER_DIMS(fld)
#define S_AFTER_IDS(fld)
#define S_AFTER_INTS(fld)
#define S_AFTER_FLOATS(fld)
#define S_AFTER_VIEWS(fld)

static void s_check_scalar(dt_scalar got, dt_scalar want, const char *what, const char *field)
{
    cr_expect_eq(got.is_int, want.is_int, "%s.%s: integer or float", what, field);
    if (want.is_int)
        cr_expect_eq(got.i, want.i, "%s.%s", what, field);
    else
        cr_expect_eq(got.f, want.f, "%s.%s", what, field);
}

static void s_check_str(mb_str got, const char *want, const char *what, const char *field)
{
    cr_expect(got.len == strlen(want) && !memcmp(got.ptr, want, got.len), "%s.%s: '%.*s', not '%s'", what, field,
              (int)got.len, got.ptr, want);
}

/* ---- per record: its sample, writer and checker, from the schema's tables --------------------- */

#define S_HOLD(T, fld) S_HOLD_##T(fld)
#define S_ARG(T, fld) S_ARG_##T(fld)
#define S_MAKE(T, fld) S_MAKE_##T(fld)
#define S_CHECK(T, fld) S_CHECK_##T(fld)

#define S_RECORD(NAME, name)                                                                               \
    typedef struct { MB_FIELDS_##NAME(S_HOLD) } s_sample_##name;                                           \
    static void s_make_##name(s_sample_##name *s, int k) { MB_FIELDS_##NAME(S_MAKE) }                      \
    static void s_write_##name(mb_writer *w, const s_sample_##name *s)                                     \
    {                                                                                                      \
        mb_encode_##name(w MB_FIELDS_##NAME(S_ARG));                                                       \
        MB_FIELDS_##NAME(S_AFTER)                                                                          \
    }                                                                                                      \
    static void s_check_##name(const mb_##name##_rec *out, const s_sample_##name *s)                       \
    {                                                                                                      \
        const char *what = #name;                                                                          \
        MB_FIELDS_##NAME(S_CHECK)                                                                          \
    }                                                                                                      \
    /* The record at rec, exactly its bytes, both ways: mb_read_<name>, which on success must end */      \
    /* right past it, and mb_decode_<name>, which must say the same. */                                    \
    static int s_decode_##name(const mb_cursor *rec, mb_##name##_rec *out)                                 \
    {                                                                                                      \
        mb_cursor c = *rec;                                                                                \
        int rc = mb_read_##name(&c, out);                                                                  \
        cr_assert(rc == 0 || rc == DT_EPROTO, "%s: rc %d", #name, rc);                                    \
        cr_assert(rc != 0 || c.p == rec->end, "%s: read %td of its %td bytes", #name, c.p - rec->p,        \
                  rec->end - rec->p);                                                                      \
        cr_assert_eq(mb_decode_##name(rec, out), rc, "%s: mb_decode and mb_read differ", #name);          \
        return rc;                                                                                         \
    }
#define S_RECORD_CODED(NAME, name, code) S_RECORD(NAME, name)

/* the nested ones first: lists of them are fields of later records */
S_RECORD(PART, part)
S_RECORD(OUT, out)
S_RECORD(HELLO, hello)
S_RECORD(ABORT, abort)
S_RECORD(REGION, region)
S_RECORD(PROCESS, process)
S_RECORD(RELEASE, release)
S_RECORD(ENDPOINT, endpoint)
MB_OP_RECORDS(S_RECORD_CODED)
MB_COMPLETION_RECORDS(S_RECORD_CODED)

/* ---- which values of other types each field type accepts -------------------------------------- */

/* Replacement values for one field of a record. */
enum {
    S_NIL, S_STRING, S_FLOAT, S_NEGATIVE, S_HUGE, S_TRUE, S_STRINGS, S_EMPTY, S_NINE, S_NREPLACEMENTS
};
static const char *s_replacement_names[] = {"nil", "a string", "a float", "-1", "2^63 + 1", "true",
                                            "an array of strings", "an empty array", "an array of 9 ones"};

#define S_BIT(r) (1u << (r))
#define S_ACCEPTS_U64 S_BIT(S_HUGE)
#define S_ACCEPTS_I64 S_BIT(S_NEGATIVE)
#define S_ACCEPTS_BOOL S_BIT(S_TRUE)
#define S_ACCEPTS_DTYPE 0u
#define S_ACCEPTS_REDUCE 0u
#define S_ACCEPTS_MODE 0u
#define S_ACCEPTS_SCALAR (S_BIT(S_FLOAT) | S_BIT(S_NEGATIVE))
#define S_ACCEPTS_OSCALAR (S_BIT(S_NIL) | S_BIT(S_FLOAT) | S_BIT(S_NEGATIVE))
#define S_ACCEPTS_STR S_BIT(S_STRING)
#define S_ACCEPTS_OSTR (S_BIT(S_NIL) | S_BIT(S_STRING))
#define S_ACCEPTS_SHAPE S_BIT(S_EMPTY)
#define S_ACCEPTS_DIMS S_BIT(S_EMPTY)
#define S_ACCEPTS_IDS (S_BIT(S_EMPTY) | S_BIT(S_NINE))
#define S_ACCEPTS_INTS (S_BIT(S_EMPTY) | S_BIT(S_NINE))
#define S_ACCEPTS_FLOATS S_BIT(S_EMPTY)
#define S_ACCEPTS_VIEWS (S_BIT(S_EMPTY) | S_BIT(S_NINE)) /* its integers are read as views by their user */
#define S_ACCEPTS_PARTS (S_BIT(S_EMPTY) | S_BIT(S_NINE) | S_BIT(S_STRINGS)) /* elements are read one by one */
#define S_ACCEPTS_OUTS S_BIT(S_EMPTY) /* at most MB_MAX_OUTS OUT records, read with the record */

static void s_write_replacement(mb_writer *w, int r)
{
    switch (r) {
    case S_NIL: mb_w_nil(w); break;
    case S_STRING: mb_w_str(w, "x", 1); break;
    case S_FLOAT: mb_w_double(w, 0.5); break;
    case S_NEGATIVE: mb_w_int(w, -1); break;
    case S_HUGE: mb_w_uint(w, (UINT64_C(1) << 63) + 1); break;
    case S_TRUE: mb_w_bool(w, true); break;
    case S_STRINGS: mb_w_array(w, 1); mb_w_str(w, "x", 1); break;
    case S_EMPTY: mb_w_array(w, 0); break;
    case S_NINE:
        mb_w_array(w, 9);
        for (int i = 0; i < 9; i++)
            mb_w_int(w, 1);
        break;
    }
}

/* ---- helpers -------------------------------------------------------------------------------- */

/* A heap copy of exactly n bytes, so that ASan sees any read past the end of a record. */
static uint8_t *s_exact(const void *data, size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    cr_assert_not_null(p);
    if (n)
        memcpy(p, data, n);
    return p;
}

/* One whole record that fills the bytes exactly (checked as the body reader checks a record it
 * steps over), as a cursor over an exact copy of them, *copy, which the caller frees. */
static mb_cursor s_record(const void *data, size_t size, uint8_t **copy)
{
    size_t used;
    cr_assert_eq(mb_validate(data, size, &used), 0, "%s", dt_last_error());
    cr_assert_eq(used, size);
    *copy = s_exact(data, size);
    return mb_cursor_of(*copy, size);
}

/* w's one record as msgpack-c's unpacker reads it (arrays in zone): what the malformed variants
 * are made from, independently of our decoder. */
static void s_unpack(const mb_writer *w, msgpack_zone *zone, msgpack_object *out)
{
    size_t off = 0;
    cr_assert_eq(msgpack_unpack(w->data, w->size, &off, zone, out), MSGPACK_UNPACK_SUCCESS);
    cr_assert_eq(off, w->size);
}

/* o as msgpack-c's packer writes it, as a cursor over an exact copy of the bytes, *copy, which the
 * caller frees. */
static mb_cursor s_packed(const msgpack_object *o, uint8_t **copy)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    cr_assert_eq(msgpack_pack_object(&pk, *o), 0);
    *copy = s_exact(sb.data, sb.size);
    mb_cursor c = mb_cursor_of(*copy, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return c;
}

static void s_expect_malformed(int rc, const char *name, const char *what)
{
    cr_expect_eq(rc, DT_EPROTO, "%s record %s: decoded (rc %d)", name, what, rc);
    if (rc == DT_EPROTO)
        cr_expect(strstr(dt_last_error(), "malformed") && strstr(dt_last_error(), name), "%s: message '%s'", what,
                  dt_last_error());
}

/* Writes the record's elements with element `at` (counted after the code) replaced by r;
 * nfields of them. */
#define S_WRITE_WITH(NAME, name, first, code)                                                              \
    static void s_write_##name##_with(mb_writer *w, const s_sample_##name *s, uint32_t at, int r)          \
    {                                                                                                      \
        mb_writer whole = {0};                                                                             \
        s_write_##name(&whole, s);                                                                         \
        msgpack_zone zone;                                                                                 \
        msgpack_zone_init(&zone, 4096);                                                                    \
        msgpack_object o;                                                                                  \
        size_t off = 0;                                                                                    \
        msgpack_unpack(whole.data, whole.size, &off, &zone, &o);                                           \
        /* the sample's own bytes for every element but `at`, found by re-encoding it alone */             \
        mb_w_array(w, o.via.array.size);                                                                   \
        for (uint32_t i = 0; i < o.via.array.size; i++) {                                                  \
            if (i == at) {                                                                                 \
                s_write_replacement(w, r);                                                                 \
                continue;                                                                                  \
            }                                                                                              \
            msgpack_sbuffer sb;                                                                            \
            msgpack_sbuffer_init(&sb);                                                                     \
            msgpack_packer pk;                                                                             \
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);                                          \
            msgpack_pack_object(&pk, o.via.array.ptr[i]);                                                  \
            if (mb_w_room(w, sb.size)) {                                                                   \
                memcpy(w->data + w->size, sb.data, sb.size);                                               \
                w->size += sb.size;                                                                        \
            }                                                                                              \
            msgpack_sbuffer_destroy(&sb);                                                                  \
        }                                                                                                  \
        msgpack_zone_destroy(&zone);                                                                       \
        free(whole.data);                                                                                  \
    }

/* ---- the tests of one record ------------------------------------------------------------------ */

#define S_ACCEPTS(T, fld) S_ACCEPTS_##T,
#define S_FIELD_NAME(T, fld) #fld,

#define S_TESTS(NAME, name, code, first)                                                                   \
    S_WRITE_WITH(NAME, name, first, code)                                                                  \
    Test(round_trip, name)                                                                                 \
    {                                                                                                      \
        for (int round = 0; round < S_ROUNDS; round++) {                                                   \
            s_sample_##name s;                                                                             \
            memset(&s, 0, sizeof s);                                                                       \
            s_make_##name(&s, round);                                                                      \
            mb_writer w = {0};                                                                             \
            s_write_##name(&w, &s);                                                                        \
            uint8_t *bytes;                                                                                \
            mb_cursor rec = s_record(w.data, w.size, &bytes);                                              \
            mb_##name##_rec out;                                                                           \
            cr_assert_eq(s_decode_##name(&rec, &out), 0, "round %d: %s", round, dt_last_error());          \
            s_check_##name(&out, &s);                                                                      \
            if ((code) >= 0) {                                                                             \
                int64_t got;                                                                               \
                cr_expect_eq(mb_record_code(&rec, &got), 0);                                               \
                cr_expect_eq(got, (code));                                                                 \
            }                                                                                              \
            free(bytes);                                                                                   \
            /* with the bytes of another record after it, as a body hands a record out: the same */        \
            /* record, read up to its own end */                                                           \
            bytes = malloc(2 * w.size);                                                                    \
            cr_assert_not_null(bytes);                                                                     \
            memcpy(bytes, w.data, w.size);                                                                 \
            memcpy(bytes + w.size, w.data, w.size);                                                        \
            mb_cursor c = mb_cursor_of(bytes, 2 * w.size);                                                 \
            cr_assert_eq(mb_read_##name(&c, &out), 0, "round %d, followed by more: %s", round, dt_last_error()); \
            cr_assert(c.p == bytes + w.size, "round %d: read past the record", round);                     \
            s_check_##name(&out, &s);                                                                      \
            free(bytes);                                                                                   \
            /* as msgpack-c's packer writes it, in the forms it chooses: the same */                       \
            msgpack_zone zone;                                                                             \
            msgpack_zone_init(&zone, 4096);                                                                \
            msgpack_object o;                                                                              \
            s_unpack(&w, &zone, &o);                                                                       \
            rec = s_packed(&o, &bytes);                                                                    \
            cr_assert_eq(s_decode_##name(&rec, &out), 0, "round %d, packed by msgpack-c: %s", round, dt_last_error()); \
            s_check_##name(&out, &s);                                                                      \
            free(bytes);                                                                                   \
            msgpack_zone_destroy(&zone);                                                                   \
            free(w.data);                                                                                  \
        }                                                                                                  \
    }                                                                                                      \
    Test(malformed, name)                                                                                  \
    {                                                                                                      \
        static const unsigned accepts[] = {MB_FIELDS_##NAME(S_ACCEPTS)};                                   \
        static const char *fields[] = {MB_FIELDS_##NAME(S_FIELD_NAME)};                                    \
        const uint32_t nfields = sizeof accepts / sizeof *accepts;                                         \
        s_sample_##name s;                                                                                 \
        memset(&s, 0, sizeof s);                                                                           \
        s_make_##name(&s, 5);                                                                              \
        mb_writer w = {0};                                                                                 \
        s_write_##name(&w, &s);                                                                            \
        mb_##name##_rec out;                                                                               \
        uint8_t *bytes;                                                                                    \
        mb_cursor rec;                                                                                     \
        /* truncated at every length: the body reader's check refuses it, and so does the decoder */       \
        /* straight on the bytes (as a body hands a record out), which trusts no length either */          \
        for (size_t len = 0; len < w.size; len++) {                                                        \
            size_t used;                                                                                   \
            cr_expect_eq(mb_validate(w.data, len, &used), DT_EPROTO, "truncated to %zu bytes", len);       \
            bytes = s_exact(w.data, len);                                                                  \
            rec = mb_cursor_of(bytes, len);                                                                \
            char what[64];                                                                                 \
            snprintf(what, sizeof what, "truncated to %zu bytes", len);                                    \
            s_expect_malformed(s_decode_##name(&rec, &out), #name, what);                                  \
            free(bytes);                                                                                   \
        }                                                                                                  \
        msgpack_zone zone;                                                                                 \
        msgpack_zone_init(&zone, 4096);                                                                    \
        msgpack_object o;                                                                                  \
        s_unpack(&w, &zone, &o);                                                                           \
        rec = s_packed(&o, &bytes);                                                                        \
        cr_assert_eq(s_decode_##name(&rec, &out), 0, "%s", dt_last_error());                               \
        free(bytes);                                                                                       \
        /* an element missing, one extra, not an array at all, no bytes at all */                          \
        o.via.array.size--;                                                                                \
        rec = s_packed(&o, &bytes);                                                                        \
        s_expect_malformed(s_decode_##name(&rec, &out), #name, "with an element missing");                 \
        free(bytes);                                                                                       \
        msgpack_object extra[64];                                                                          \
        memcpy(extra, o.via.array.ptr, (o.via.array.size + 1) * sizeof *extra);                            \
        extra[o.via.array.size + 1] = (msgpack_object){.type = MSGPACK_OBJECT_NIL};                        \
        msgpack_object longer = {.type = MSGPACK_OBJECT_ARRAY,                                             \
                                 .via.array = {o.via.array.size + 2, extra}};                              \
        rec = s_packed(&longer, &bytes);                                                                   \
        s_expect_malformed(s_decode_##name(&rec, &out), #name, "with an extra element");                   \
        free(bytes);                                                                                       \
        o.via.array.size++;                                                                                \
        msgpack_object scalar = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = 3};                   \
        rec = s_packed(&scalar, &bytes);                                                                   \
        s_expect_malformed(s_decode_##name(&rec, &out), #name, "that is not an array");                    \
        free(bytes);                                                                                       \
        rec = mb_cursor_of(w.data, 0);                                                                     \
        s_expect_malformed(s_decode_##name(&rec, &out), #name, "that is missing");                         \
        if ((code) >= 0) {                                                                                 \
            msgpack_object code0 = o.via.array.ptr[0];                                                     \
            o.via.array.ptr[0].via.u64 = (code) + 100;                                                     \
            rec = s_packed(&o, &bytes);                                                                    \
            s_expect_malformed(s_decode_##name(&rec, &out), #name, "with another code");                   \
            free(bytes);                                                                                   \
            o.via.array.ptr[0] = (msgpack_object){.type = MSGPACK_OBJECT_STR, .via.str = {1, "x"}};        \
            rec = s_packed(&o, &bytes);                                                                    \
            s_expect_malformed(s_decode_##name(&rec, &out), #name, "with a string for its code");          \
            free(bytes);                                                                                   \
            o.via.array.ptr[0] = code0;                                                                    \
        }                                                                                                  \
        msgpack_zone_destroy(&zone);                                                                       \
        /* every field replaced by values of every other kind */                                           \
        for (uint32_t f = 0; f < nfields; f++)                                                             \
            for (int r = 0; r < S_NREPLACEMENTS; r++) {                                                    \
                mb_writer bad = {0};                                                                       \
                s_write_##name##_with(&bad, &s, f + (first), r);                                           \
                rec = s_record(bad.data, bad.size, &bytes);                                                \
                int rc = s_decode_##name(&rec, &out);                                                      \
                char what[160];                                                                            \
                snprintf(what, sizeof what, "with %s as %s", s_replacement_names[r], fields[f]);           \
                if (accepts[f] & S_BIT(r))                                                                 \
                    cr_expect_eq(rc, 0, "%s record %s: %s", #name, what, dt_last_error());                 \
                else                                                                                       \
                    s_expect_malformed(rc, #name, what);                                                   \
                if (rc == DT_EPROTO)                                                                       \
                    cr_expect(strstr(dt_last_error(), fields[f]), "%s: message '%s' names no field", what, \
                              dt_last_error());                                                            \
                free(bytes);                                                                               \
                free(bad.data);                                                                            \
            }                                                                                              \
        free(w.data);                                                                                      \
    }                                                                                                      \
    Test(corrupted, name)                                                                                  \
    {                                                                                                      \
        srand(12345 + (unsigned)(first));                                                                  \
        for (int round = 0; round < 400; round++) {                                                        \
            s_sample_##name s;                                                                             \
            memset(&s, 0, sizeof s);                                                                       \
            s_make_##name(&s, round);                                                                      \
            mb_writer w = {0};                                                                             \
            s_write_##name(&w, &s);                                                                        \
            for (int flips = 1 + rand() % 3; flips > 0; flips--)                                           \
                w.data[rand() % w.size] = (char)rand();                                                    \
            mb_##name##_rec out;                                                                           \
            /* straight on the damaged bytes, as a body hands a record out before it is checked */         \
            uint8_t *bytes = s_exact(w.data, w.size);                                                      \
            mb_cursor c = mb_cursor_of(bytes, w.size);                                                     \
            int rc = mb_read_##name(&c, &out);                                                             \
            cr_expect(rc == 0 || rc == DT_EPROTO, "rc %d", rc);                                            \
            cr_expect(c.p >= bytes && c.p <= bytes + w.size);                                              \
            free(bytes);                                                                                   \
            size_t used;                                                                                   \
            if (mb_validate(w.data, w.size, &used) == 0) {                                                 \
                /* a well-formed object: msgpack-c reads the same, and the decoder, on exactly */          \
                /* its bytes, says what it said with the rest after them */                                \
                msgpack_zone zone;                                                                         \
                msgpack_zone_init(&zone, 4096);                                                            \
                msgpack_object o;                                                                          \
                size_t off = 0;                                                                            \
                cr_expect_eq(msgpack_unpack(w.data, used, &off, &zone, &o), MSGPACK_UNPACK_SUCCESS);       \
                cr_expect_eq(off, used);                                                                   \
                msgpack_zone_destroy(&zone);                                                               \
                mb_cursor rec = s_record(w.data, used, &bytes);                                            \
                cr_expect_eq(s_decode_##name(&rec, &out), rc, "round %d", round);                          \
                free(bytes);                                                                               \
            }                                                                                              \
            free(w.data);                                                                                  \
        }                                                                                                  \
    }

#define S_TESTS_CODED(NAME, name, code) S_TESTS(NAME, name, code, 1)
#define S_TESTS_PLAIN(NAME, name) S_TESTS(NAME, name, -1, 0)

MB_OP_RECORDS(S_TESTS_CODED)
MB_COMPLETION_RECORDS(S_TESTS_CODED)
MB_PLAIN_RECORDS(S_TESTS_PLAIN)

/* ---- what the tables declare ------------------------------------------------------------------ */

Test(schema, codes_and_names)
{
    cr_expect_eq(MB_OP_FREE, 1);
    cr_expect_eq(MB_OP_COMPUTE, 11);
    cr_expect_eq(MB_OP_STATS, 12);
    cr_expect_eq(MB_C_CREDIT, 1);
    cr_expect_eq(MB_C_ERROR, 3);
    cr_expect_str_eq(mb_op_name(MB_OP_FILL), "fill");
    cr_expect_str_eq(mb_op_name(MB_OP_ASSEMBLE), "assemble");
    cr_expect_str_eq(mb_op_name(0), "?");
    cr_expect_str_eq(mb_op_name(MB_OP_STATS), "stats");
    cr_expect_str_eq(mb_op_name(MB_OP_DEFINE), "define");
    cr_expect_str_eq(mb_op_name(MB_OP_DROP), "drop");
    cr_expect_str_eq(mb_op_name(MB_OP_TRACE), "trace");
    cr_expect_eq(MB_OP_TRACE, 16);
    cr_expect_str_eq(mb_op_name(17), "?");
}

Test(schema, record_code)
{
    mb_writer w = {0};
    mb_encode_sync(&w, 9, 2);
    uint8_t *bytes;
    mb_cursor rec = s_record(w.data, w.size, &bytes);
    int64_t code;
    cr_expect_eq(mb_record_code(&rec, &code), 0);
    cr_expect_eq(code, MB_OP_SYNC);
    free(bytes);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 1024);
    msgpack_object o;
    s_unpack(&w, &zone, &o);
    o.via.array.size = 0;
    rec = s_packed(&o, &bytes);
    cr_expect_eq(mb_record_code(&rec, &code), DT_EPROTO, "an empty array");
    free(bytes);
    msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
    rec = s_packed(&nil, &bytes);
    cr_expect_eq(mb_record_code(&rec, &code), DT_EPROTO, "nil");
    free(bytes);
    msgpack_object first[2] = {{.type = MSGPACK_OBJECT_STR, .via.str = {1, "x"}},
                               {.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = 1}};
    msgpack_object str_first = {.type = MSGPACK_OBJECT_ARRAY, .via.array = {2, first}};
    rec = s_packed(&str_first, &bytes);
    cr_expect_eq(mb_record_code(&rec, &code), DT_EPROTO, "a string first");
    free(bytes);
    rec = mb_cursor_of(w.data, 0);
    cr_expect_eq(mb_record_code(&rec, &code), DT_EPROTO, "no bytes");
    msgpack_zone_destroy(&zone);
    free(w.data);
}

/* Element i of a record as an unsigned integer: what names the tensor of a record too malformed
 * to decode. */
Test(schema, field_u64)
{
    mb_writer w = {0};
    mb_w_array(&w, 4); /* an EMPTY with a dtype past the last one */
    mb_w_int(&w, MB_OP_EMPTY);
    mb_w_uint(&w, UINT64_MAX);
    mb_w_int(&w, DT_NDTYPES);
    mb_w_i64s(&w, (int64_t[]){2}, 1);
    uint8_t *bytes;
    mb_cursor rec = s_record(w.data, w.size, &bytes);
    const mb_cursor before = rec;
    mb_empty_rec empty;
    s_expect_malformed(mb_decode_empty(&rec, &empty), "empty", "with dtype DT_NDTYPES");
    uint64_t u;
    cr_expect(mb_field_u64(&rec, 0, &u) && u == MB_OP_EMPTY);
    cr_expect(mb_field_u64(&rec, 1, &u) && u == UINT64_MAX, "the tensor it was to make");
    cr_expect(mb_field_u64(&rec, 2, &u) && u == (uint64_t)DT_NDTYPES);
    cr_expect(!mb_field_u64(&rec, 3, &u), "an array is no integer");
    cr_expect(!mb_field_u64(&rec, 4, &u), "past the last element");
    cr_expect(!mb_field_u64(&rec, UINT32_MAX, &u));
    cr_expect(rec.p == before.p && rec.end == before.end, "the record's cursor stays");
    free(bytes);
    /* a negative integer, and an element after one that is not well formed */
    const unsigned char neg[] = {0x92, 0x01, 0xff}, broken[] = {0x93, 0x01, 0xc1, 0x05};
    bytes = s_exact(neg, sizeof neg);
    rec = mb_cursor_of(bytes, sizeof neg);
    cr_expect(!mb_field_u64(&rec, 1, &u), "-1 is not unsigned");
    free(bytes);
    bytes = s_exact(broken, sizeof broken);
    rec = mb_cursor_of(bytes, sizeof broken);
    cr_expect(mb_field_u64(&rec, 0, &u) && u == 1);
    cr_expect(!mb_field_u64(&rec, 2, &u), "not stepped over a reserved byte");
    free(bytes);
    const unsigned char nil[] = {0xc0};
    rec = mb_cursor_of(nil, 1);
    cr_expect(!mb_field_u64(&rec, 0, &u), "not an array");
    free(w.data);
}

/* Fields whose values are checked beyond their msgpack type. */
Test(schema, ranges)
{
    mb_writer w = {0};
    mb_empty_rec empty;
    uint8_t *bytes;
    mb_cursor rec;
    /* a dtype past the last one */
    mb_w_array(&w, 4);
    mb_w_int(&w, MB_OP_EMPTY);
    mb_w_uint(&w, 1);
    mb_w_int(&w, DT_NDTYPES);
    mb_w_i64s(&w, (int64_t[]){2}, 1);
    rec = s_record(w.data, w.size, &bytes);
    s_expect_malformed(s_decode_empty(&rec, &empty), "empty", "with dtype DT_NDTYPES");
    cr_expect(strstr(dt_last_error(), "dtype"), "%s", dt_last_error());
    free(bytes);
    /* a negative size, and one that makes more than 2^48 elements */
    const int64_t bad_shapes[][2] = {{2, -1}, {INT64_C(1) << 24, (INT64_C(1) << 24) + 1}};
    for (int i = 0; i < 2; i++) {
        w.size = 0;
        mb_encode_empty(&w, 1, DT_FLOAT32, 2, bad_shapes[i]);
        rec = s_record(w.data, w.size, &bytes);
        s_expect_malformed(s_decode_empty(&rec, &empty), "empty", "with a bad shape");
        cr_expect(strstr(dt_last_error(), "shape"), "%s", dt_last_error());
        free(bytes);
    }
    /* a part mode and a reduce op past the last ones */
    mb_part_rec part;
    for (int which = 0; which < 2; which++) {
        w.size = 0;
        mb_w_array(&w, 8);
        mb_w_int(&w, which == 0 ? MB_PART_DIV + 1 : MB_PART_COPY);
        mb_w_int(&w, which == 1 ? DT_REDUCE_MIN + 1 : DT_REDUCE_SUM);
        mb_w_int(&w, 0);
        mb_w_uint(&w, 0);
        for (int d = 0; d < 3; d++)
            mb_w_i64s(&w, NULL, 0);
        mb_w_int(&w, 1);
        rec = s_record(w.data, w.size, &bytes);
        s_expect_malformed(s_decode_part(&rec, &part), "part", which == 0 ? "with mode 3" : "with reduce op 4");
        free(bytes);
    }
    free(w.data);
}

/* The per-op encoders write plain msgpack, in its smallest forms. */
Test(schema, encoding_is_compact)
{
    mb_writer w = {0};
    mb_encode_free(&w, 5);
    cr_expect_eq(w.size, 3);
    cr_expect_eq(memcmp(w.data, "\x92\x01\x05", 3), 0);
    w.size = 0;
    mb_encode_error(&w, 1, 0, DT_EKERNEL, "no");
    cr_expect_eq(memcmp(w.data, "\x95\x03\x01\x00\xf9\xa2no", 8), 0);
    free(w.data);
}

/* A strided view, [input, first, -rank, sizes..., strides...], and where the elements it reads end
 * (hand-computed: the far corner's element + 1; none for an empty view; -1 past int64). */
Test(schema, strided_views_and_their_extent)
{
    mb_views v = {.n = 7, .v = {0, 5, -2, 2, 3, 4, 0}};
    mb_view got;
    int at = 0;
    cr_assert_eq(mb_view_next(&v, &at, 1, &got), 1);
    cr_expect(got.strided && got.input == 0 && got.first == 5 && got.shape.n == 2 && got.shape.v[0] == 2 &&
              got.shape.v[1] == 3 && got.strides[0] == 4 && got.strides[1] == 0);
    cr_expect_eq(at, 7);
    cr_expect_eq(mb_view_extent(&got), 5 + 4 + 0 + 1, "the corner (1, 2) is element 9");
    mb_view run = {.first = 6, .shape = {2, {3, 4}}};
    cr_expect_eq(mb_view_extent(&run), 18);
    mb_view empty = {.first = 100, .shape = {2, {0, 4}}, .strided = true, .strides = {1, 1}};
    cr_expect_eq(mb_view_extent(&empty), 0);
    mb_view huge = {.first = 1, .shape = {2, {3, 2}}, .strided = true, .strides = {INT64_MAX / 2, 1}};
    cr_expect_eq(mb_view_extent(&huge), -1, "a corner past int64");
    /* a dim of one element is never stepped along: its stride reads as 0, whatever it says */
    mb_views one = {.n = 7, .v = {0, 2, -2, 1, 3, INT64_MAX, 1}};
    at = 0;
    cr_assert_eq(mb_view_next(&one, &at, 1, &got), 1);
    cr_expect(got.strides[0] == 0 && got.strides[1] == 1, "strides %lld %lld", (long long)got.strides[0],
              (long long)got.strides[1]);
    cr_expect_eq(mb_view_extent(&got), 5, "elements 2, 3, 4");
}

/* A COMPUTE's views: [input, first, rank, sizes...] each, read in turn; integers that do not make
 * a view (an input outside the op's, a negative first element, a rank past DT_MAX_DIMS or past the
 * integers left, a size < 0) are refused. */
Test(schema, views)
{
    mb_views v = {.n = 11, .v = {1, 6, 2, 3, 4, 0, 0, 0, 0, 2, 0}};
    mb_view got;
    int at = 0;
    cr_assert_eq(mb_view_next(&v, &at, 2, &got), 1);
    cr_expect(got.input == 1 && got.first == 6 && got.shape.n == 2 && got.shape.v[0] == 3 && got.shape.v[1] == 4);
    cr_assert_eq(mb_view_next(&v, &at, 2, &got), 1);
    cr_expect(got.input == 0 && got.first == 0 && got.shape.n == 0);
    cr_assert_eq(mb_view_next(&v, &at, 2, &got), 1);
    cr_expect(got.input == 0 && got.first == 2 && got.shape.n == 0);
    cr_expect_eq(at, 11);
    cr_expect_eq(mb_view_next(&v, &at, 2, &got), 0, "the end");
    const struct {
        int n;
        int64_t v[6];
        const char *why;
    } bad[] = {
        {3, {2, 0, 0}, "an input past the op's"},
        {3, {-1, 0, 0}, "a negative input"},
        {3, {0, -4, 0}, "a negative first element"},
        {4, {0, 0, 2, 1}, "a rank past the integers left"},
        {3, {0, 0, 9}, "a rank past DT_MAX_DIMS"},
        {4, {0, 0, 1, -1}, "a negative size"},
        {2, {0, 0}, "a truncated view"},
        {5, {0, 0, -2, 3, 4}, "a strided view without its strides"},
        {5, {0, 0, -1, 3, -1}, "a negative stride"},
        {3, {0, 0, -9}, "a strided rank past DT_MAX_DIMS"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mb_views b = {.n = bad[i].n};
        memcpy(b.v, bad[i].v, sizeof bad[i].v);
        at = 0;
        cr_expect_eq(mb_view_next(&b, &at, 2, &got), DT_EPROTO, "%s", bad[i].why);
    }
}
