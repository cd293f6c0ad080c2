/* mb_codec: headers and bodies round trip, and truncated, oversized, nested, ext-typed or random
 * bytes are refused with DT_EPROTO; the cursor's typed readers take exactly the objects of their
 * type, whole and in range, and leave the cursor where it was otherwise; mb_skip accepts what
 * msgpack-c's own unpacker accepts (within our limits), and the readers read the values it does. */
#include <criterion/criterion.h>
#include <math.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "dt_error.h"
#include "mb_codec.h"

/* Packs an array of n int64 (shapes, offsets) with msgpack-c's packer. */
static void s_pack_i64s(msgpack_packer *pk, const int64_t *v, int n)
{
    msgpack_pack_array(pk, (size_t)n);
    for (int k = 0; k < n; k++)
        msgpack_pack_int64(pk, v[k]);
}

static mb_header s_decode_ok(const char *buf, size_t n)
{
    mb_header out;
    cr_assert_eq(mb_header_decode(buf, n, &out), 0, "%s", dt_last_error());
    return out;
}

static void s_expect_proto(int rc)
{
    cr_assert_eq(rc, DT_EPROTO, "rc %d", rc);
    cr_assert_eq(dt_last_error_code(), DT_EPROTO);
    cr_assert_neq(dt_last_error()[0], '\0');
}

static void s_header_proto(const void *buf, size_t n)
{
    mb_header out;
    s_expect_proto(mb_header_decode(buf, n, &out));
}

Test(header, round_trip_all_kinds)
{
    const uint64_t seqs[] = {0, 1, 127, 65536, UINT32_MAX + 1ull, UINT64_MAX};
    for (uint32_t kind = 1; kind <= MB_KIND_MAX; kind++)
        for (size_t s = 0; s < sizeof seqs / sizeof *seqs; s++) {
            mb_header h = {MB_VERSION, kind, seqs[s], kind == 1 ? MB_SENDER_CONTROLLER : 7,
                           s == 0 ? 0 : UINT32_MAX};
            char buf[MB_MAX_HEADER];
            size_t n = mb_header_encode(&h, buf);
            cr_assert(n > 0 && n <= MB_MAX_HEADER);
            mb_header out = s_decode_ok(buf, n);
            cr_assert_eq(memcmp(&out, &h, sizeof h), 0);
        }
}

Test(header, truncated_at_every_length)
{
    mb_header h = {MB_VERSION, MB_OPS, UINT64_MAX, 65535, 1000};
    char buf[MB_MAX_HEADER];
    size_t n = mb_header_encode(&h, buf);
    for (size_t len = 0; len < n; len++)
        s_header_proto(buf, len);
}

Test(header, rejects_bad_fields)
{
    char buf[MB_MAX_HEADER];
    mb_header h = {MB_VERSION + 1, MB_OPS, 0, 0, 0};
    s_header_proto(buf, mb_header_encode(&h, buf));
    cr_assert(strstr(dt_last_error(), "version"));
    h = (mb_header){MB_VERSION, 0, 0, 0, 0};
    s_header_proto(buf, mb_header_encode(&h, buf));
    h.kind = MB_KIND_MAX + 1;
    s_header_proto(buf, mb_header_encode(&h, buf));
    cr_assert(strstr(dt_last_error(), "kind"));
}

Test(header, rejects_trailing_bytes)
{
    char buf[MB_MAX_HEADER + 1];
    mb_header h = {MB_VERSION, MB_BYE, 3, 4, 5};
    size_t n = mb_header_encode(&h, buf);
    buf[n] = 0;
    s_header_proto(buf, n + 1);
    cr_assert(strstr(dt_last_error(), "trailing"));
}

/* Packs a header-like object with the given layout through msgpack-c. */
static size_t s_pack(msgpack_sbuffer *sb, int arity, int64_t first, int neg_at)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, (size_t)arity);
    for (int i = 0; i < arity; i++)
        msgpack_pack_int64(&pk, i == neg_at ? -1 : i == 0 ? first : 1);
    return sb->size;
}

Test(header, rejects_shape_and_sign)
{
    msgpack_sbuffer sb;
    s_pack(&sb, 4, MB_VERSION, -1);
    s_header_proto(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    s_pack(&sb, 6, MB_VERSION, -1);
    s_header_proto(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    for (int i = 0; i < 5; i++) {
        s_pack(&sb, 5, MB_VERSION, i);
        s_header_proto(sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
    }
    s_pack(&sb, 5, MB_VERSION, -1);
    s_decode_ok(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);

    const char not_array[] = {0x05};
    s_header_proto(not_array, 1);
    const char map[] = {(char)0x81, 0x01, 0x02};
    s_header_proto(map, sizeof map);
    const char float_field[] = {(char)0x95, 0x01, 0x02, (char)0xca, 0, 0, 0, 0, 0x00, 0x00};
    s_header_proto(float_field, sizeof float_field);
    const char sender_u64[] = {(char)0x95, 0x01, 0x02, 0x00, (char)0xcf, 0, 0, 0, 1, 0, 0, 0, 0, 0x00};
    s_header_proto(sender_u64, sizeof sender_u64);
}

Test(header, random_garbage)
{
    srand(12345);
    int accepted = 0;
    for (int iter = 0; iter < 10000; iter++) {
        char buf[MB_MAX_HEADER];
        size_t n = (size_t)(rand() % (MB_MAX_HEADER + 1));
        for (size_t i = 0; i < n; i++)
            buf[i] = (char)rand();
        /* steer some buffers towards plausible headers so the deeper checks run too */
        if (n > 0 && iter % 2)
            buf[0] = (char)(0x90 | (rand() % 8));
        mb_header out;
        int rc = mb_header_decode(buf, n, &out);
        if (rc == 0) {
            accepted++;
            cr_assert_eq(out.version, MB_VERSION);
            cr_assert(out.kind >= 1 && out.kind <= MB_KIND_MAX);
            char again[MB_MAX_HEADER];
            size_t m = mb_header_encode(&out, again);
            mb_header back = s_decode_ok(again, m);
            cr_assert_eq(memcmp(&back, &out, sizeof out), 0);
        } else {
            cr_assert_eq(rc, DT_EPROTO);
        }
        size_t used;
        rc = mb_validate(buf, n, &used);
        cr_assert(rc == DT_EPROTO || (rc == 0 && used >= 1 && used <= n));
    }
    cr_log_info("%d random headers accepted", accepted);
}

/* ---- helpers of the reader tests ------------------------------------------------------- */

/* A heap copy of exactly n bytes, so that ASan sees any read past the end of a cursor's bytes. */
static uint8_t *s_exact(const void *data, size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    cr_assert_not_null(p);
    if (n)
        memcpy(p, data, n);
    return p;
}

/* The typed readers, as bits of a mask. */
enum {
    S_INT = 1 << 0,
    S_U64 = 1 << 1,
    S_I64 = 1 << 2,
    S_FLOAT = 1 << 3,
    S_F64 = 1 << 4,
    S_BOOL = 1 << 5,
    S_NIL = 1 << 6,
    S_STR = 1 << 7,
    S_ARRAY = 1 << 8,
};
#define S_UNSIGNED (S_INT | S_U64 | S_I64 | S_F64) /* an integer in [0, INT64_MAX] */
#define S_NEGATIVE (S_INT | S_I64 | S_F64)

/* Which typed readers take the object at c, each tried on a copy of c: one that refuses must
 * leave its cursor where it was, and one that takes a scalar must end where mb_skip does, past
 * the whole object (mb_read_array takes only the header, its elements are read after it). */
static unsigned s_takes(const mb_cursor *c)
{
    mb_cursor whole = *c;
    bool skips = mb_skip(&whole) == 0;
    unsigned mask = 0;
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    const char *s;
    uint32_t n;
    for (unsigned bit = 1; bit <= S_ARRAY; bit <<= 1) {
        mb_cursor at = *c;
        bool took = false;
        switch (bit) {
        case S_INT: took = mb_read_int(&at, &u, &b); break;
        case S_U64: took = mb_read_u64(&at, &u); break;
        case S_I64: took = mb_read_i64(&at, &i); break;
        case S_FLOAT: took = mb_read_float(&at, &d); break;
        case S_F64: took = mb_read_f64(&at, &d); break;
        case S_BOOL: took = mb_read_bool(&at, &b); break;
        case S_NIL: took = mb_read_nil(&at); break;
        case S_STR: took = mb_read_str(&at, &s, &n); break;
        case S_ARRAY: took = mb_read_array(&at, &n); break;
        }
        cr_assert(at.end == c->end, "reader 0x%x moved the end of its cursor", bit);
        if (!took) {
            cr_assert(at.p == c->p, "reader 0x%x refused but moved the cursor", bit);
            continue;
        }
        mask |= bit;
        cr_assert(at.p > c->p && at.p <= c->end, "reader 0x%x took no bytes or too many", bit);
        if (bit != S_ARRAY)
            cr_assert(skips && at.p == whole.p, "reader 0x%x did not take exactly the object mb_skip steps over", bit);
    }
    return mask;
}

/* The same over bytes alone, in an exact copy; also checks that every shorter prefix of them is
 * taken by no reader and refused by mb_skip, which leaves its cursor where it was. */
static unsigned s_takes_bytes(const void *data, size_t n)
{
    for (size_t len = 0; len < n; len++) {
        uint8_t *cut = s_exact(data, len);
        mb_cursor c = mb_cursor_of(cut, len), at = c;
        cr_assert_eq(s_takes(&c), 0u, "%zu of %zu bytes are read as an object", len, n);
        cr_assert_eq(mb_skip(&at), DT_EPROTO, "%zu of %zu bytes are skipped as an object", len, n);
        cr_assert(at.p == c.p && at.end == c.end);
        free(cut);
    }
    uint8_t *all = s_exact(data, n);
    mb_cursor c = mb_cursor_of(all, n);
    unsigned mask = s_takes(&c);
    free(all);
    return mask;
}

/* An array of at most max integers, as a record's shapes and offsets are read. */
static bool s_read_i64s(mb_cursor *c, int64_t *v, uint32_t max, uint32_t *n)
{
    mb_cursor at = *c;
    if (!mb_read_array(&at, n) || *n > max)
        return false;
    for (uint32_t k = 0; k < *n; k++)
        if (!mb_read_i64(&at, &v[k]))
            return false;
    *c = at;
    return true;
}

/* ---- body ---------------------------------------------------------------------------- */

static void s_pack_records(msgpack_sbuffer *sb)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    /* [7, -3, 2.5, "add", [4, 3], [[1], []]] */
    msgpack_pack_array(&pk, 6);
    msgpack_pack_uint64(&pk, 7);
    msgpack_pack_int64(&pk, -3);
    msgpack_pack_double(&pk, 2.5);
    msgpack_pack_str_with_body(&pk, "add", 3);
    s_pack_i64s(&pk, (int64_t[]){4, 3}, 2);
    msgpack_pack_array(&pk, 2);
    s_pack_i64s(&pk, (int64_t[]){1}, 1);
    msgpack_pack_array(&pk, 0);
    /* [INT64_MIN, UINT64_MAX, 1.5f, "", nil, true] */
    msgpack_pack_array(&pk, 6);
    msgpack_pack_int64(&pk, INT64_MIN);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    msgpack_pack_float(&pk, 1.5f);
    msgpack_pack_str_with_body(&pk, "", 0);
    msgpack_pack_nil(&pk);
    msgpack_pack_true(&pk);
    /* 42 */
    msgpack_pack_int(&pk, 42);
}

Test(body, round_trip_mixed_records)
{
    msgpack_sbuffer sb;
    s_pack_records(&sb);
    uint8_t *data = s_exact(sb.data, sb.size);
    const uint8_t *end = data + sb.size;
    mb_body_reader r;
    cr_assert_eq(mb_body_init(&r, data, sb.size, 3), 0);
    mb_cursor rec, c, at;
    int64_t i;
    uint64_t u;
    double d;
    const char *s;
    uint32_t len, n;
    int64_t dims[4];

    /* a record is handed out as a cursor from its first byte to the body's end */
    cr_assert_eq(mb_body_next(&r, &rec), 1);
    cr_assert(rec.p == data && rec.end == end);
    c = rec;
    cr_assert(mb_read_array(&c, &n) && n == 6);
    at = c; /* the first element both ways: 7 is an int64 and a uint64 */
    cr_assert(mb_read_i64(&at, &i) && i == 7);
    cr_assert(mb_read_u64(&c, &u) && u == 7);
    cr_assert(at.p == c.p);
    cr_assert(mb_read_i64(&c, &i) && i == -3);
    cr_assert(mb_read_f64(&c, &d) && d == 2.5);
    cr_assert(mb_read_str(&c, &s, &len) && len == 3 && memcmp(s, "add", 3) == 0);
    cr_assert(s > (const char *)rec.p && s + len <= (const char *)c.p, "the string stays in the record");
    cr_assert(s_read_i64s(&c, dims, 4, &n) && n == 2 && dims[0] == 4 && dims[1] == 3);
    cr_assert(mb_read_array(&c, &n) && n == 2);
    cr_assert(s_read_i64s(&c, dims, 4, &n) && n == 1 && dims[0] == 1);
    cr_assert(s_read_i64s(&c, dims, 4, &n) && n == 0);
    at = rec;
    cr_assert_eq(mb_skip(&at), 0);
    cr_assert(c.p == at.p, "the readers end where the record does");
    /* read whole: the body reader is told where it ended, and the next record starts there */
    mb_body_read(&r, &c);
    const uint8_t *next = c.p;

    cr_assert_eq(mb_body_next(&r, &rec), 1);
    cr_assert(rec.p == next && rec.end == end);
    c = rec;
    cr_assert(mb_read_array(&c, &n) && n == 6);
    cr_assert(mb_read_i64(&c, &i) && i == INT64_MIN);
    cr_assert(mb_read_u64(&c, &u) && u == UINT64_MAX);
    at = c; /* a float32 as a float and as a number */
    cr_assert(mb_read_float(&at, &d) && d == 1.5);
    cr_assert(mb_read_f64(&c, &d) && d == 1.5);
    cr_assert(at.p == c.p);
    cr_assert(mb_read_str(&c, &s, &len) && len == 0);
    cr_assert(mb_read_nil(&c));
    bool t = false;
    cr_assert(mb_read_bool(&c, &t) && t);
    /* this one is not told: the body reader steps over it itself */
    next = c.p;

    cr_assert_eq(mb_body_next(&r, &rec), 1);
    cr_assert(rec.p == next && rec.end == end && mb_left(&rec) == 1);
    c = rec;
    cr_assert(mb_read_u64(&c, &u) && u == 42);
    mb_body_read(&r, &c);
    cr_assert_eq(mb_body_next(&r, &rec), 0);
    cr_assert_eq(mb_body_next(&r, &rec), 0, "the end stays the end");
    free(data);
    msgpack_sbuffer_destroy(&sb);
}

Test(body, rejects_missing_and_trailing_objects)
{
    msgpack_sbuffer sb;
    s_pack_records(&sb);
    mb_body_reader r;
    mb_cursor rec;
    cr_assert_eq(mb_body_init(&r, sb.data, sb.size, 4), 0);
    for (int k = 0; k < 3; k++)
        cr_assert_eq(mb_body_next(&r, &rec), 1);
    s_expect_proto(mb_body_next(&r, &rec));
    cr_assert(strstr(dt_last_error(), "truncated"));

    cr_assert_eq(mb_body_init(&r, sb.data, sb.size, 2), 0);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(mb_body_next(&r, &rec), 1);
    s_expect_proto(mb_body_next(&r, &rec));
    cr_assert(strstr(dt_last_error(), "trailing"));

    /* the last record cut short by one byte */
    cr_assert_eq(mb_body_init(&r, sb.data, sb.size - 1, 3), 0);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(mb_body_next(&r, &rec), 1);
    s_expect_proto(mb_body_next(&r, &rec));

    /* the second record cut short: the first is handed out, the cut one too (its cursor ends
     * where the body does, so no reader can go past it), and nothing after */
    size_t used;
    cr_assert_eq(mb_validate(sb.data, sb.size, &used), 0);
    uint8_t *cut = s_exact(sb.data, used + 12); /* its header, INT64_MIN and part of UINT64_MAX */
    cr_assert_eq(mb_body_init(&r, cut, used + 12, 3), 0);
    cr_assert_eq(mb_body_next(&r, &rec), 1);
    cr_assert_eq(mb_body_next(&r, &rec), 1);
    cr_assert(rec.p == cut + used && mb_left(&rec) == 12);
    cr_assert_eq(s_takes(&rec), (unsigned)S_ARRAY, "only its header is whole");
    s_expect_proto(mb_body_next(&r, &rec));
    s_expect_proto(mb_body_next(&r, &rec)); /* and it stays refused */
    free(cut);

    /* an empty body of no records */
    cr_assert_eq(mb_body_init(&r, sb.data, 0, 0), 0);
    cr_assert_eq(mb_body_next(&r, &rec), 0);
    msgpack_sbuffer_destroy(&sb);
}

/* A record that tells the body reader nothing leaves it to mb_body_next; so does a cursor that
 * never moved off its first byte. */
Test(body, steps_over_records_not_read)
{
    msgpack_sbuffer sb;
    s_pack_records(&sb);
    size_t lens[3], used, off = 0;
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(mb_validate(sb.data + off, sb.size - off, &used), 0);
        lens[k] = used;
        off += used;
    }
    cr_assert_eq(off, sb.size);
    for (int tell = 0; tell < 2; tell++) {
        mb_body_reader r;
        mb_cursor rec;
        cr_assert_eq(mb_body_init(&r, sb.data, sb.size, 3), 0);
        const uint8_t *at = (const uint8_t *)sb.data;
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(mb_body_next(&r, &rec), 1, "%s", dt_last_error());
            cr_assert(rec.p == at && rec.end == (const uint8_t *)sb.data + sb.size, "record %d", k);
            if (tell)
                mb_body_read(&r, &rec); /* a cursor still on the record's first byte */
            at += lens[k];
        }
        cr_assert_eq(mb_body_next(&r, &rec), 0);
    }
    msgpack_sbuffer_destroy(&sb);
}

/* The object is refused by mb_skip, which leaves its cursor where it was, and by the body reader
 * when it steps over it (before anything after it is handed out; dt_last_error() then says why). */
static void s_body_proto(const void *buf, size_t n, uint32_t count)
{
    uint8_t *data = s_exact(buf, n);
    mb_cursor c = mb_cursor_of(data, n), at = c;
    s_expect_proto(mb_skip(&at));
    cr_assert(at.p == c.p && at.end == c.end, "a refused mb_skip moved the cursor");
    mb_body_reader r;
    mb_cursor rec;
    cr_assert_eq(mb_body_init(&r, data, n, count), 0);
    cr_assert_eq(mb_body_next(&r, &rec), 1, "the record is handed out, to be read or stepped over");
    cr_assert(rec.p == data && rec.end == data + n);
    s_expect_proto(mb_body_next(&r, &rec));
    free(data);
}

Test(body, huge_declared_lengths_fail_fast)
{
    const unsigned char str32[10] = {0xdb, 0xff, 0xff, 0xff, 0xf0, 'a', 'b', 'c', 'd', 'e'};
    const unsigned char arr32[10] = {0xdd, 0xf0, 0, 0, 0, 1, 2, 3, 4, 5};
    const unsigned char map32[10] = {0xdf, 0x80, 0, 0, 0, 1, 2, 3, 4, 5};
    const unsigned char bin32[10] = {0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5};
    const unsigned char arr16[3] = {0xdc, 0x00, 0x03};       /* 3 items, 0 bytes */
    const unsigned char map[4] = {0x82, 0x01, 0x02, 0x03};   /* 2 entries, 3 bytes */
    const unsigned char cut_len[2] = {0xda, 0x01};           /* str16 with half a length */
    s_body_proto(str32, sizeof str32, 1);
    s_body_proto(arr32, sizeof arr32, 1);
    s_body_proto(map32, sizeof map32, 1);
    s_body_proto(bin32, sizeof bin32, 1);
    s_body_proto(arr16, sizeof arr16, 1);
    s_body_proto(map, sizeof map, 1);
    s_body_proto(cut_len, sizeof cut_len, 1);
    /* no reader trusts those lengths either */
    cr_assert_eq(s_takes_bytes(str32, sizeof str32), 0u);
    cr_assert_eq(s_takes_bytes(arr32, sizeof arr32), 0u);
    cr_assert_eq(s_takes_bytes(arr16, sizeof arr16), 0u);
    cr_assert_eq(s_takes_bytes(cut_len, sizeof cut_len), 0u);
}

Test(body, depth_limit)
{
    unsigned char buf[MB_MAX_DEPTH + 2];
    memset(buf, 0x91, sizeof buf); /* [[[...]]] */
    buf[MB_MAX_DEPTH] = 0x01;
    size_t used;
    cr_assert_eq(mb_validate(buf, MB_MAX_DEPTH + 1, &used), 0, "%s", dt_last_error());
    cr_assert_eq(used, MB_MAX_DEPTH + 1);
    mb_cursor c = mb_cursor_of(buf, MB_MAX_DEPTH + 1);
    cr_assert_eq(mb_skip(&c), 0);
    cr_assert_eq(mb_left(&c), 0);
    buf[MB_MAX_DEPTH] = 0x91;
    buf[MB_MAX_DEPTH + 1] = 0x01;
    s_body_proto(buf, sizeof buf, 1);
    cr_assert(strstr(dt_last_error(), "nesting"));
    /* the limit counts from where the skip starts: one level in, the same bytes are shallow enough */
    c = mb_cursor_of(buf + 1, sizeof buf - 1);
    cr_assert_eq(mb_skip(&c), 0, "%s", dt_last_error());
}

Test(body, rejects_reserved_ext_and_oversize)
{
    const unsigned char c1[] = {0xc1};
    const unsigned char in_array[] = {0x92, 0x01, 0xc1};
    const unsigned char fixext[] = {0xd4, 0x01, 0x00};
    const unsigned char ext8[] = {0xc7, 0x01, 0x05, 0x00};
    s_body_proto(c1, sizeof c1, 1);
    s_body_proto(in_array, sizeof in_array, 1);
    s_body_proto(fixext, sizeof fixext, 1);
    s_body_proto(ext8, sizeof ext8, 1);
    cr_assert_eq(s_takes_bytes(c1, sizeof c1), 0u);
    cr_assert_eq(s_takes_bytes(fixext, sizeof fixext), 0u);

    mb_body_reader r;
    mb_cursor rec;
    s_expect_proto(mb_body_init(&r, c1, (size_t)MB_MAX_BODY + 1, 1));
    cr_assert_eq(mb_body_next(&r, &rec), 0, "a refused body is left with nothing to read");
}

Test(body, every_scalar_format_validates)
{
    const unsigned char all[] = {
        0xc0, 0xc2, 0xc3, 0x00, 0x7f, 0xe0, 0xff,                   /* nil bool fixint */
        0xcc, 1, 0xcd, 1, 2, 0xce, 1, 2, 3, 4, 0xcf, 1, 2, 3, 4, 5, 6, 7, 8,
        0xd0, 1, 0xd1, 1, 2, 0xd2, 1, 2, 3, 4, 0xd3, 1, 2, 3, 4, 5, 6, 7, 8,
        0xca, 0, 0, 0, 0, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0,             /* float32/64 */
        0xa1, 'x', 0xd9, 1, 'x', 0xda, 0, 1, 'x', 0xdb, 0, 0, 0, 1, 'x',
        0xc4, 1, 9, 0xc5, 0, 1, 9, 0xc6, 0, 0, 0, 1, 9,
        0x90, 0xdc, 0, 1, 0x01, 0xdd, 0, 0, 0, 1, 0x01,
        0x80, 0xde, 0, 1, 0x01, 0x02, 0xdf, 0, 0, 0, 1, 0x01, 0x02,
    };
    /* each object's length, and the readers that take it */
    static const struct {
        size_t len;
        unsigned takes;
    } objects[] = {
        {1, S_NIL}, {1, S_BOOL}, {1, S_BOOL}, {1, S_UNSIGNED}, {1, S_UNSIGNED}, {1, S_NEGATIVE}, {1, S_NEGATIVE},
        {2, S_UNSIGNED}, {3, S_UNSIGNED}, {5, S_UNSIGNED}, {9, S_UNSIGNED},
        {2, S_UNSIGNED}, {3, S_UNSIGNED}, {5, S_UNSIGNED}, {9, S_UNSIGNED},
        {5, S_FLOAT | S_F64}, {9, S_FLOAT | S_F64},
        {2, S_STR}, {3, S_STR}, {4, S_STR}, {6, S_STR},
        {3, 0}, {4, 0}, {6, 0},
        {1, S_ARRAY}, {4, S_ARRAY}, {6, S_ARRAY},
        {1, 0}, {5, 0}, {7, 0},
    };
    const uint32_t count = sizeof objects / sizeof *objects;
    cr_assert_eq(count, 7 + 8 + 2 + 4 + 3 + 3 + 3);
    uint8_t *data = s_exact(all, sizeof all);
    /* once with every record stepped over by the body reader, once told where each ended */
    for (int tell = 0; tell < 2; tell++) {
        mb_body_reader r;
        mb_cursor rec;
        cr_assert_eq(mb_body_init(&r, data, sizeof all, count), 0);
        const uint8_t *at = data;
        for (uint32_t k = 0; k < count; k++) {
            cr_assert_eq(mb_body_next(&r, &rec), 1, "object %u: %s", k, dt_last_error());
            cr_assert(rec.p == at && rec.end == data + sizeof all, "object %u", k);
            cr_assert_eq(s_takes(&rec), objects[k].takes, "object %u", k);
            mb_cursor c = rec;
            cr_assert_eq(mb_skip(&c), 0);
            cr_assert(c.p == at + objects[k].len, "object %u: %td bytes", k, c.p - at);
            if (tell)
                mb_body_read(&r, &c);
            at = c.p;
        }
        cr_assert_eq(mb_body_next(&r, &rec), 0);
    }
    free(data);
}

Test(body, random_garbage)
{
    srand(777);
    int handed_out = 0;
    for (int iter = 0; iter < 10000; iter++) {
        unsigned char buf[48];
        size_t n = (size_t)(rand() % (int)sizeof buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = (unsigned char)rand();
        uint8_t *data = s_exact(buf, n);
        mb_body_reader r;
        mb_cursor rec;
        cr_assert_eq(mb_body_init(&r, data, n, (uint32_t)(rand() % 4)), 0);
        const uint8_t *at = data;
        bool broken = false;
        int rc;
        while ((rc = mb_body_next(&r, &rec)) == 1) {
            /* right after the one before, which was whole, up to the body's end */
            cr_assert(!broken, "a record was handed out after one that is not well formed");
            cr_assert(rec.p == at && rec.end == data + n && rec.p < rec.end);
            s_takes(&rec); /* no reader may read past the body (ASan) or move a cursor it refuses */
            mb_cursor c = rec;
            broken = mb_skip(&c) != 0;
            if (!broken && iter % 2)
                mb_body_read(&r, &c);
            at = c.p;
            handed_out++;
        }
        cr_assert(rc == 0 || rc == DT_EPROTO);
        if (rc == 0)
            cr_assert(!broken && at == data + n, "the end comes after the last byte, every record whole");
        mb_cursor c = mb_cursor_of(data, n);
        s_takes(&c);
        free(data);
    }
    cr_assert_gt(handed_out, 1000);
}

/* ---- the typed readers ------------------------------------------------------------------- */

Test(read, integers_of_every_encoding)
{
    static const struct {
        unsigned char bytes[9];
        size_t len;
        bool neg;
        uint64_t bits; /* the value, two's complement when neg */
    } ints[] = {
        {{0x00}, 1, false, 0},
        {{0x7f}, 1, false, 127},
        {{0xe0}, 1, true, (uint64_t)-32},
        {{0xff}, 1, true, (uint64_t)-1},
        {{0xcc, 0xff}, 2, false, 255},
        {{0xcd, 0xff, 0xff}, 3, false, 65535},
        {{0xce, 0xff, 0xff, 0xff, 0xff}, 5, false, UINT32_MAX},
        {{0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 9, false, INT64_MAX},
        {{0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0}, 9, false, (uint64_t)INT64_MAX + 1},
        {{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 9, false, UINT64_MAX},
        {{0xd0, 0x80}, 2, true, (uint64_t)-128},
        {{0xd0, 0x7f}, 2, false, 127}, /* a signed encoding of a value >= 0 reads as unsigned */
        {{0xd1, 0x80, 0x00}, 3, true, (uint64_t)-32768},
        {{0xd1, 0x01, 0x02}, 3, false, 0x0102},
        {{0xd2, 0x80, 0, 0, 0}, 5, true, (uint64_t)(int64_t)INT32_MIN},
        {{0xd2, 0xff, 0xff, 0xff, 0xfe}, 5, true, (uint64_t)-2},
        {{0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}, 9, true, (uint64_t)INT64_MIN},
        {{0xd3, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 9, false, INT64_MAX},
        {{0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 9, true, (uint64_t)-1},
        {{0xd3, 0, 0, 0, 0, 0, 0, 0, 5}, 9, false, 5},
    };
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++) {
        bool huge = !ints[k].neg && ints[k].bits > INT64_MAX;
        unsigned want = ints[k].neg ? S_NEGATIVE : huge ? S_UNSIGNED & ~(unsigned)S_I64 : S_UNSIGNED;
        cr_assert_eq(s_takes_bytes(ints[k].bytes, ints[k].len), want, "integer %zu", k);
        /* the values, with a byte after the integer that no reader takes */
        unsigned char buf[10];
        memcpy(buf, ints[k].bytes, ints[k].len);
        buf[ints[k].len] = 0xc1;
        mb_cursor c = mb_cursor_of(buf, ints[k].len + 1), at = c;
        uint64_t bits = 0;
        bool neg = !ints[k].neg;
        cr_assert(mb_read_int(&at, &bits, &neg), "integer %zu", k);
        cr_assert(bits == ints[k].bits && neg == ints[k].neg, "integer %zu: %llx", k, (unsigned long long)bits);
        cr_assert(at.p == buf + ints[k].len && mb_left(&at) == 1);
        uint64_t u = 0;
        at = c;
        cr_assert_eq(mb_read_u64(&at, &u), !ints[k].neg, "integer %zu", k);
        if (!ints[k].neg)
            cr_assert(u == ints[k].bits && at.p == buf + ints[k].len);
        int64_t i = 0;
        at = c;
        cr_assert_eq(mb_read_i64(&at, &i), !huge, "integer %zu", k);
        if (!huge)
            cr_assert(i == (int64_t)ints[k].bits && at.p == buf + ints[k].len);
        double d;
        at = c;
        cr_assert(mb_read_f64(&at, &d) && at.p == buf + ints[k].len);
        cr_assert(d == (ints[k].neg ? (double)(int64_t)ints[k].bits : (double)ints[k].bits), "integer %zu: %g", k, d);
    }
}

Test(read, floats)
{
    const unsigned char f32[] = {0xca, 0x3f, 0xc0, 0x00, 0x00};               /* 1.5f */
    const unsigned char f32_neg[] = {0xca, 0xc2, 0x28, 0x00, 0x00};           /* -42.0f */
    const unsigned char f32_nan[] = {0xca, 0x7f, 0xc0, 0x00, 0x00};
    const unsigned char f64[] = {0xcb, 0x40, 0x04, 0, 0, 0, 0, 0, 0};         /* 2.5 */
    const unsigned char f64_max[] = {0xcb, 0x7f, 0xef, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const unsigned char f64_negzero[] = {0xcb, 0x80, 0, 0, 0, 0, 0, 0, 0};
    const struct {
        const unsigned char *bytes;
        size_t len;
        double want;
    } fs[] = {
        {f32, sizeof f32, 1.5}, {f32_neg, sizeof f32_neg, -42.0}, {f32_nan, sizeof f32_nan, NAN},
        {f64, sizeof f64, 2.5}, {f64_max, sizeof f64_max, 1.7976931348623157e308},
        {f64_negzero, sizeof f64_negzero, -0.0},
    };
    for (size_t k = 0; k < sizeof fs / sizeof *fs; k++) {
        cr_assert_eq(s_takes_bytes(fs[k].bytes, fs[k].len), (unsigned)(S_FLOAT | S_F64), "float %zu", k);
        mb_cursor c = mb_cursor_of(fs[k].bytes, fs[k].len), at = c;
        double d, e;
        cr_assert(mb_read_float(&at, &d) && mb_left(&at) == 0);
        at = c;
        cr_assert(mb_read_f64(&at, &e) && mb_left(&at) == 0);
        if (isnan(fs[k].want))
            cr_assert(isnan(d) && isnan(e), "float %zu", k);
        else
            cr_assert(d == fs[k].want && e == fs[k].want && signbit(d) == signbit(fs[k].want), "float %zu: %g", k, d);
    }
}

Test(read, strings)
{
    unsigned char buf[300];
    const struct {
        unsigned char head[5];
        size_t headlen, len;
    } strs[] = {
        {{0xa0}, 1, 0}, {{0xa3}, 1, 3}, {{0xbf}, 1, 31},
        {{0xd9, 0x00}, 2, 0}, {{0xd9, 0xc8}, 2, 200},
        {{0xda, 0x00, 0x01}, 3, 1}, {{0xda, 0x01, 0x00}, 3, 256},
        {{0xdb, 0, 0, 0, 0x02}, 5, 2},
    };
    for (size_t k = 0; k < sizeof strs / sizeof *strs; k++) {
        size_t n = strs[k].headlen + strs[k].len;
        memcpy(buf, strs[k].head, strs[k].headlen);
        for (size_t i = 0; i < strs[k].len; i++)
            buf[strs[k].headlen + i] = (unsigned char)('a' + i % 26);
        cr_assert_eq(s_takes_bytes(buf, n), (unsigned)S_STR, "string %zu", k);
        mb_cursor c = mb_cursor_of(buf, n);
        const char *s;
        uint32_t len;
        cr_assert(mb_read_str(&c, &s, &len) && mb_left(&c) == 0);
        cr_assert(s == (const char *)buf + strs[k].headlen && len == strs[k].len, "string %zu: its bytes in place", k);
    }
    /* lengths past the bytes, and a bin, which is no string */
    const unsigned char fix_short[] = {0xa3, 'a', 'b'};
    const unsigned char str8_short[] = {0xd9, 0x05, 'a', 'b'};
    const unsigned char str16_short[] = {0xda, 0x01, 0x00, 'a'};
    const unsigned char bin8[] = {0xc4, 0x01, 'a'};
    cr_assert_eq(s_takes_bytes(fix_short, sizeof fix_short), 0u);
    cr_assert_eq(s_takes_bytes(str8_short, sizeof str8_short), 0u);
    cr_assert_eq(s_takes_bytes(str16_short, sizeof str16_short), 0u);
    cr_assert_eq(s_takes_bytes(bin8, sizeof bin8), 0u);
    mb_cursor c = mb_cursor_of(bin8, sizeof bin8);
    cr_assert_eq(mb_skip(&c), 0, "a bin is well formed, only no reader's");
    cr_assert_eq(mb_left(&c), 0);
}

Test(read, arrays)
{
    const unsigned char empty[] = {0x90};
    const unsigned char fix3[] = {0x93, 0x01, 0x02, 0x03};
    const unsigned char arr16[] = {0xdc, 0x00, 0x03, 0x01, 0x02, 0x03};
    const unsigned char arr32[] = {0xdd, 0x00, 0x00, 0x00, 0x02, 0xa1, 'x', 0xc0};
    const struct {
        const unsigned char *bytes;
        size_t len, head;
        uint32_t n;
    } arrs[] = {{empty, 1, 1, 0}, {fix3, 4, 1, 3}, {arr16, 6, 3, 3}, {arr32, 8, 5, 2}};
    for (size_t k = 0; k < sizeof arrs / sizeof *arrs; k++) {
        /* the prefixes that end inside the elements still have a whole header: those are refused
         * only when the count could not fit in the bytes left, so they are checked one by one */
        mb_cursor c = mb_cursor_of(arrs[k].bytes, arrs[k].len);
        cr_assert_eq(s_takes(&c), (unsigned)S_ARRAY, "array %zu", k);
        uint32_t n;
        cr_assert(mb_read_array(&c, &n) && n == arrs[k].n, "array %zu", k);
        cr_assert(c.p == arrs[k].bytes + arrs[k].head, "array %zu: past its header only", k);
        for (uint32_t i = 0; i < n; i++)
            cr_assert_eq(mb_skip(&c), 0);
        cr_assert_eq(mb_left(&c), 0);
        for (size_t len = 0; len < arrs[k].len; len++) {
            uint8_t *cut = s_exact(arrs[k].bytes, len);
            mb_cursor at = mb_cursor_of(cut, len);
            bool room = len >= arrs[k].head && len - arrs[k].head >= arrs[k].n;
            cr_assert_eq(mb_read_array(&at, &n), room, "array %zu cut to %zu bytes", k, len);
            size_t used;
            cr_assert_eq(mb_validate(cut, len, &used), DT_EPROTO, "array %zu cut to %zu bytes", k, len);
            free(cut);
        }
    }
    const unsigned char too_many[] = {0x93, 0x01, 0x02};       /* 3 elements in 2 bytes */
    const unsigned char arr16_many[] = {0xdc, 0x00, 0x03, 0x01, 0x02};
    const unsigned char arr32_huge[] = {0xdd, 0xf0, 0x00, 0x00, 0x00, 0x01};
    const unsigned char arr16_cut[] = {0xdc, 0x00};
    const unsigned char map[] = {0x81, 0x01, 0x02};
    cr_assert_eq(s_takes_bytes(too_many, sizeof too_many), 0u);
    cr_assert_eq(s_takes_bytes(arr16_many, sizeof arr16_many), 0u);
    cr_assert_eq(s_takes_bytes(arr32_huge, sizeof arr32_huge), 0u);
    cr_assert_eq(s_takes_bytes(arr16_cut, sizeof arr16_cut), 0u);
    cr_assert_eq(s_takes_bytes(map, sizeof map), 0u, "a map is no array");
    /* the header reader trusts the count only as far as the bytes could hold it: an element that
     * is not well formed is mb_skip's to find */
    const unsigned char bad_element[] = {0x91, 0xc1};
    mb_cursor c = mb_cursor_of(bad_element, sizeof bad_element), at = c;
    cr_assert_eq(s_takes(&c), (unsigned)S_ARRAY);
    s_expect_proto(mb_skip(&at));
    cr_assert(at.p == c.p);
}

Test(read, bool_nil_and_the_end)
{
    const unsigned char f[] = {0xc2}, t[] = {0xc3}, nil[] = {0xc0};
    cr_assert_eq(s_takes_bytes(f, 1), (unsigned)S_BOOL);
    cr_assert_eq(s_takes_bytes(t, 1), (unsigned)S_BOOL);
    cr_assert_eq(s_takes_bytes(nil, 1), (unsigned)S_NIL);
    bool b = true;
    mb_cursor c = mb_cursor_of(f, 1);
    cr_assert(mb_read_bool(&c, &b) && !b && mb_left(&c) == 0);
    c = mb_cursor_of(t, 1);
    cr_assert(mb_read_bool(&c, &b) && b);
    /* at the end: nothing to peek at, no reader takes anything, mb_skip refuses */
    cr_assert_eq(mb_peek(&c), 0xc1);
    cr_assert_eq(mb_left(&c), 0);
    cr_assert_eq(s_takes(&c), 0u);
    s_expect_proto(mb_skip(&c));
    /* a cursor's end is where its bytes end, whatever follows in memory */
    const unsigned char two[] = {0xcd, 0x01, 0x02, 0x92, 0x01, 0x02};
    c = mb_cursor_of(two, 2);
    cr_assert_eq(mb_peek(&c), 0xcd);
    cr_assert_eq(s_takes(&c), 0u);
    c = mb_cursor_of(two + 3, 2);
    cr_assert_eq(s_takes(&c), 0u, "2 elements do not fit in 1 byte");
    s_expect_proto(mb_skip(&c));
}

/* The readers on the fields of a record, one after another: each takes its own type only. */
Test(read, type_checks)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 7);
    msgpack_pack_str_with_body(&pk, "s", 1);
    msgpack_pack_int64(&pk, -5);
    msgpack_pack_uint64(&pk, (uint64_t)INT64_MAX + 1);
    msgpack_pack_double(&pk, 0.25);
    s_pack_i64s(&pk, (int64_t[]){1, 2, 3}, 3);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_str_with_body(&pk, "x", 1);
    msgpack_pack_nil(&pk);

    uint8_t *data = s_exact(sb.data, sb.size);
    mb_body_reader r;
    mb_cursor rec;
    cr_assert_eq(mb_body_init(&r, data, sb.size, 1), 0);
    cr_assert_eq(mb_body_next(&r, &rec), 1);
    mb_cursor c = rec;
    int64_t i;
    uint64_t u;
    double d;
    const char *s;
    uint32_t len, n;
    int64_t v[3];

    cr_assert_eq(s_takes(&c), (unsigned)S_ARRAY);
    cr_assert(mb_read_array(&c, &n) && n == 7);
    cr_assert_eq(s_takes(&c), (unsigned)S_STR);
    cr_assert(mb_read_str(&c, &s, &len) && len == 1 && s[0] == 's');
    cr_assert_eq(s_takes(&c), (unsigned)S_NEGATIVE, "-5 is no uint64 and no array");
    mb_cursor at = c;
    cr_assert(mb_read_f64(&at, &d) && d == -5.0);
    cr_assert(mb_read_i64(&c, &i) && i == -5);
    cr_assert_eq(s_takes(&c), (unsigned)(S_INT | S_U64 | S_F64), "2^63 is out of int64's range");
    at = c;
    cr_assert(mb_read_f64(&at, &d) && d == 9223372036854775808.0);
    cr_assert(mb_read_u64(&c, &u) && u == (uint64_t)INT64_MAX + 1);
    cr_assert_eq(s_takes(&c), (unsigned)(S_FLOAT | S_F64), "0.25 is no integer and no string");
    cr_assert(mb_read_f64(&c, &d) && d == 0.25);
    cr_assert_eq(s_takes(&c), (unsigned)S_ARRAY);
    cr_assert(s_read_i64s(&c, v, 3, &n) && n == 3 && v[0] == 1 && v[1] == 2 && v[2] == 3);
    at = c;
    cr_assert(!s_read_i64s(&at, v, 3, &n), "an array with a string is not one of integers");
    cr_assert(at.p == c.p);
    cr_assert(mb_read_array(&c, &n) && n == 2);
    cr_assert(mb_read_i64(&c, &i) && i == 1);
    cr_assert_eq(s_takes(&c), (unsigned)S_STR);
    cr_assert(mb_read_str(&c, &s, &len) && len == 1 && s[0] == 'x');
    cr_assert_eq(s_takes(&c), (unsigned)S_NIL);
    cr_assert(mb_read_nil(&c));
    /* past the last element: nothing is read from beyond the record */
    cr_assert(c.p == rec.end);
    cr_assert_eq(s_takes(&c), 0u);
    cr_assert_eq(mb_body_next(&r, &rec), 0);
    free(data);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- against msgpack-c's unpacker -------------------------------------------------------- */

/* One random object of every msgpack format (the signed formats also with non-negative values,
 * which msgpack-c decodes as positive integers), nested to depth 3; ext types only when ext. */
static void s_pack_random(msgpack_sbuffer *sb, msgpack_packer *pk, int depth, bool ext)
{
    unsigned char raw[9];
    int kind = rand() % (depth < 3 ? 14 : 12);
    if (ext && rand() % 6 == 0)
        kind = 14;
    switch (kind) {
    case 0: msgpack_pack_nil(pk); break;
    case 1: rand() % 2 ? msgpack_pack_true(pk) : msgpack_pack_false(pk); break;
    case 2: msgpack_pack_uint64(pk, (uint64_t)rand() << (rand() % 40)); break;
    case 3: msgpack_pack_int64(pk, -(int64_t)((uint64_t)rand() << (rand() % 32)) - 1); break;
    case 4: { /* int 8/16/32/64 with any bits, written by hand */
        int width = 1 << (rand() % 4);
        raw[0] = (unsigned char)(0xd0 + __builtin_ctz((unsigned)width));
        for (int i = 1; i <= width; i++)
            raw[i] = (unsigned char)rand();
        msgpack_sbuffer_write(sb, (const char *)raw, (size_t)width + 1);
        break;
    }
    case 5: msgpack_pack_float(pk, (float)rand() / 7.0f - 1000.0f); break;
    case 6: msgpack_pack_double(pk, (double)rand() / 3.0 - 1e6); break;
    case 7:
    case 8: {
        char text[300];
        size_t n = (size_t)(rand() % (kind == 7 ? 40 : 300));
        for (size_t i = 0; i < n; i++)
            text[i] = (char)('a' + rand() % 26);
        if (kind == 7)
            msgpack_pack_str_with_body(pk, text, n);
        else
            msgpack_pack_bin_with_body(pk, text, n);
        break;
    }
    case 9: msgpack_pack_int(pk, rand() % 256 - 128); break;
    case 10: msgpack_pack_uint16(pk, (uint16_t)rand()); break;
    case 11: msgpack_pack_int32(pk, rand() - RAND_MAX / 2); break;
    case 12: {
        int n = rand() % (rand() % 8 ? 6 : 40);
        msgpack_pack_array(pk, (size_t)n);
        for (int i = 0; i < n; i++)
            s_pack_random(sb, pk, depth + 1, ext);
        break;
    }
    case 13: {
        int n = rand() % (rand() % 8 ? 4 : 20);
        msgpack_pack_map(pk, (size_t)n);
        for (int i = 0; i < 2 * n; i++)
            s_pack_random(sb, pk, depth + 1, ext);
        break;
    }
    default: { /* fixext 1/2/4/8/16 or ext 8 */
        static const size_t lens[] = {1, 2, 4, 8, 16, 3};
        char body[16] = {0};
        msgpack_pack_ext_with_body(pk, body, lens[rand() % 6], (int8_t)(rand() % 100));
        break;
    }
    }
}

static bool s_has_ext(const msgpack_object *o)
{
    if (o->type == MSGPACK_OBJECT_EXT)
        return true;
    if (o->type == MSGPACK_OBJECT_ARRAY)
        for (uint32_t i = 0; i < o->via.array.size; i++)
            if (s_has_ext(&o->via.array.ptr[i]))
                return true;
    if (o->type == MSGPACK_OBJECT_MAP)
        for (uint32_t i = 0; i < o->via.map.size; i++)
            if (s_has_ext(&o->via.map.ptr[i].key) || s_has_ext(&o->via.map.ptr[i].val))
                return true;
    return false;
}

/* containers nested in o, o included: 0 for a scalar */
static int s_depth(const msgpack_object *o)
{
    int deepest = 0;
    if (o->type == MSGPACK_OBJECT_ARRAY)
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            int d = s_depth(&o->via.array.ptr[i]);
            deepest = d > deepest ? d : deepest;
        }
    else if (o->type == MSGPACK_OBJECT_MAP)
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            int k = s_depth(&o->via.map.ptr[i].key), v = s_depth(&o->via.map.ptr[i].val);
            deepest = k > deepest ? k : deepest;
            deepest = v > deepest ? v : deepest;
        }
    else
        return 0;
    return deepest + 1;
}

/* msgpack-c allocates an array's or a map's objects before it reads them, so a 32-bit count
 * larger than the bytes (which we refuse unread) would make it try gigabytes: such bytes are not
 * given to it unless we accepted them (then every count fits). A conservative scan of every byte. */
static bool s_huge_count(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i + 4 < n; i++)
        if ((p[i] == 0xdd || p[i] == 0xdf) && mb_be(p + i + 1, 4) > n)
            return true;
    return false;
}

/* Reads the object o at c with the typed readers, which must give what msgpack-c gave (strings
 * in place in the same bytes, arrays element by element); c ends past it. */
static void s_reads_as(mb_cursor *c, const msgpack_object *o, int iter)
{
    unsigned takes = s_takes(c);
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    const char *s;
    uint32_t n;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        cr_assert_eq(takes, (unsigned)S_NIL, "iteration %d", iter);
        cr_assert(mb_read_nil(c));
        return;
    case MSGPACK_OBJECT_BOOLEAN:
        cr_assert_eq(takes, (unsigned)S_BOOL, "iteration %d", iter);
        cr_assert(mb_read_bool(c, &b) && b == o->via.boolean, "iteration %d", iter);
        return;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: {
        bool huge = o->via.u64 > INT64_MAX;
        cr_assert_eq(takes, huge ? S_UNSIGNED & ~(unsigned)S_I64 : S_UNSIGNED, "iteration %d", iter);
        mb_cursor at = *c;
        cr_assert(mb_read_f64(&at, &d) && d == (double)o->via.u64, "iteration %d", iter);
        at = *c;
        if (!huge)
            cr_assert(mb_read_i64(&at, &i) && i == (int64_t)o->via.u64, "iteration %d", iter);
        cr_assert(mb_read_u64(c, &u) && u == o->via.u64, "iteration %d: %llu, not %llu", iter,
                  (unsigned long long)u, (unsigned long long)o->via.u64);
        return;
    }
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: {
        cr_assert_eq(takes, (unsigned)S_NEGATIVE, "iteration %d", iter);
        mb_cursor at = *c;
        cr_assert(mb_read_f64(&at, &d) && d == (double)o->via.i64, "iteration %d", iter);
        cr_assert(mb_read_i64(c, &i) && i == o->via.i64, "iteration %d: %lld, not %lld", iter, (long long)i,
                  (long long)o->via.i64);
        return;
    }
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        cr_assert_eq(takes, (unsigned)(S_FLOAT | S_F64), "iteration %d", iter);
        cr_assert(mb_read_float(c, &d), "iteration %d", iter);
        cr_assert(d == o->via.f64 || (isnan(d) && isnan(o->via.f64)), "iteration %d: %g, not %g", iter, d, o->via.f64);
        return;
    case MSGPACK_OBJECT_STR: {
        const uint8_t *start = c->p;
        cr_assert_eq(takes, (unsigned)S_STR, "iteration %d", iter);
        cr_assert(mb_read_str(c, &s, &n), "iteration %d", iter);
        cr_assert_eq(n, o->via.str.size, "iteration %d", iter);
        /* in place, where msgpack-c has it too (it gives an empty string no pointer) */
        cr_assert((const uint8_t *)s > start && (const uint8_t *)s + n == c->p, "iteration %d", iter);
        cr_assert(n == 0 || s == o->via.str.ptr, "iteration %d: not the string msgpack-c reads", iter);
        return;
    }
    case MSGPACK_OBJECT_ARRAY:
        cr_assert_eq(takes, (unsigned)S_ARRAY, "iteration %d", iter);
        cr_assert(mb_read_array(c, &n) && n == o->via.array.size, "iteration %d", iter);
        for (uint32_t k = 0; k < n; k++)
            s_reads_as(c, &o->via.array.ptr[k], iter);
        return;
    default: /* a bin or a map: no reader's, stepped over whole */
        cr_assert(o->type == MSGPACK_OBJECT_BIN || o->type == MSGPACK_OBJECT_MAP, "iteration %d: type %d", iter, o->type);
        cr_assert_eq(takes, 0u, "iteration %d", iter);
        cr_assert_eq(mb_skip(c), 0);
        return;
    }
}

/* mb_skip against msgpack-c's own unpacker: on well-formed and damaged bytes alike, it accepts
 * exactly what msgpack-c decodes, less our limits (no ext type, nesting at most MB_MAX_DEPTH),
 * and steps over the same bytes; the typed readers then read the values msgpack-c read. */
Test(skip, accepts_what_msgpack_c_does)
{
    srand(4242);
    int compared = 0, damaged_accepted = 0, damaged_refused = 0, ext_refused = 0, deep_refused = 0, deepest = 0;
    for (int iter = 0; iter < 6000; iter++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        /* some objects inside arrays to around the depth limit */
        int wrap = iter % 4 == 3 ? MB_MAX_DEPTH - 3 + rand() % 5 : 0;
        for (int k = 0; k < wrap; k++)
            msgpack_pack_array(&pk, 1);
        s_pack_random(&sb, &pk, 0, iter % 8 == 5);
        bool damage = iter % 2;
        if (damage && sb.size > 0)
            for (int k = 0; k < 1 + rand() % 3; k++)
                sb.data[rand() % sb.size] = (char)rand();
        uint8_t *data = s_exact(sb.data, sb.size);
        size_t size = sb.size;
        msgpack_sbuffer_destroy(&sb);

        size_t used = 0;
        int rc = mb_validate(data, size, &used);
        cr_assert(rc == 0 || rc == DT_EPROTO, "iteration %d: rc %d", iter, rc);
        mb_cursor c = mb_cursor_of(data, size), at = c;
        cr_assert_eq(mb_skip(&at), rc, "iteration %d: mb_skip and mb_validate differ", iter);
        cr_assert(rc == 0 ? at.p == data + used : at.p == data, "iteration %d", iter);
        if (rc != 0 && s_huge_count(data, size)) {
            free(data);
            continue;
        }
        msgpack_zone zone;
        cr_assert(msgpack_zone_init(&zone, 1024));
        msgpack_object o;
        size_t off = 0;
        msgpack_unpack_return ret = msgpack_unpack((const char *)data, size, &off, &zone, &o);
        bool theirs = ret == MSGPACK_UNPACK_SUCCESS || ret == MSGPACK_UNPACK_EXTRA_BYTES;
        bool ext = theirs && s_has_ext(&o);
        int depth = theirs ? s_depth(&o) : 0;
        cr_assert_eq(rc == 0, theirs && !ext && depth <= MB_MAX_DEPTH,
                     "iteration %d: we %s, msgpack-c returns %d (ext %d, depth %d): %s", iter,
                     rc == 0 ? "accept" : "refuse", ret, ext, depth, rc ? dt_last_error() : "");
        compared++;
        if (rc == 0) {
            cr_assert_eq(off, used, "iteration %d: msgpack-c reads %zu bytes, we %zu", iter, off, used);
            s_reads_as(&c, &o, iter);
            cr_assert(c.p == data + used, "iteration %d: the readers end where mb_skip does", iter);
            damaged_accepted += damage;
            deepest = depth > deepest ? depth : deepest;
        } else {
            damaged_refused += damage && !theirs;
            ext_refused += ext;
            deep_refused += theirs && !ext && depth > MB_MAX_DEPTH;
        }
        msgpack_zone_destroy(&zone);
        free(data);
    }
    cr_log_info("%d compared: %d damaged accepted, %d damaged refused, %d ext, %d too deep", compared,
                damaged_accepted, damaged_refused, ext_refused, deep_refused);
    cr_assert_gt(compared, 5900, "almost every object is compared");
    cr_assert_gt(damaged_accepted, 100, "damaged objects that still decode are compared too");
    cr_assert_gt(damaged_refused, 100, "and damaged ones that msgpack-c refuses too");
    cr_assert_gt(ext_refused, 50, "ext types, which msgpack-c reads and we refuse");
    cr_assert_gt(deep_refused, 50, "nesting past our limit, which msgpack-c reads and we refuse");
    cr_assert_eq(deepest, MB_MAX_DEPTH, "nesting up to the limit is accepted");
}
