/* mb_codec: headers and bodies round trip, and truncated, oversized, nested, ext-typed or random
 * bytes are refused with DT_EPROTO before msgpack-c sees them; typed field access checks types. */
#include <criterion/criterion.h>
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
    mb_body_reader r;
    cr_assert_eq(mb_body_init(&r, sb.data, sb.size, 3), 0);
    msgpack_object o;

    cr_assert_eq(mb_body_next(&r, &o), 1);
    cr_assert(mb_arr(&o, 6));
    int64_t i;
    uint64_t u;
    double d;
    const char *s;
    uint32_t len, n;
    int64_t dims[4];
    cr_assert(mb_get_i64(&o, 0, &i) && i == 7);
    cr_assert(mb_get_u64(&o, 0, &u) && u == 7);
    cr_assert(mb_get_i64(&o, 1, &i) && i == -3);
    cr_assert(mb_get_f64(&o, 2, &d) && d == 2.5);
    cr_assert(mb_get_str(&o, 3, &s, &len) && len == 3 && memcmp(s, "add", 3) == 0);
    cr_assert(mb_get_i64s(&o, 4, dims, 4, &n) && n == 2 && dims[0] == 4 && dims[1] == 3);
    const msgpack_object *nested = &o.via.array.ptr[5];
    cr_assert(mb_arr(nested, 2));
    cr_assert(mb_get_i64s(nested, 0, dims, 4, &n) && n == 1 && dims[0] == 1);
    cr_assert(mb_get_i64s(nested, 1, dims, 4, &n) && n == 0);

    cr_assert_eq(mb_body_next(&r, &o), 1);
    cr_assert(mb_get_i64(&o, 0, &i) && i == INT64_MIN);
    cr_assert(mb_get_u64(&o, 1, &u) && u == UINT64_MAX);
    cr_assert(mb_get_f64(&o, 2, &d) && d == 1.5);
    cr_assert(mb_get_str(&o, 3, &s, &len) && len == 0);
    cr_assert_eq(o.via.array.ptr[4].type, MSGPACK_OBJECT_NIL);
    cr_assert(o.via.array.ptr[5].type == MSGPACK_OBJECT_BOOLEAN && o.via.array.ptr[5].via.boolean);

    cr_assert_eq(mb_body_next(&r, &o), 1);
    cr_assert(o.type == MSGPACK_OBJECT_POSITIVE_INTEGER && o.via.u64 == 42);
    cr_assert_eq(mb_body_next(&r, &o), 0);
    mb_body_destroy(&r);
    msgpack_sbuffer_destroy(&sb);
}

Test(body, rejects_missing_and_trailing_objects)
{
    msgpack_sbuffer sb;
    s_pack_records(&sb);
    mb_body_reader r;
    msgpack_object o;
    cr_assert_eq(mb_body_init(&r, sb.data, sb.size, 4), 0);
    for (int k = 0; k < 3; k++)
        cr_assert_eq(mb_body_next(&r, &o), 1);
    s_expect_proto(mb_body_next(&r, &o));
    cr_assert(strstr(dt_last_error(), "truncated"));
    mb_body_destroy(&r);

    cr_assert_eq(mb_body_init(&r, sb.data, sb.size, 2), 0);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(mb_body_next(&r, &o), 1);
    s_expect_proto(mb_body_next(&r, &o));
    cr_assert(strstr(dt_last_error(), "trailing"));
    mb_body_destroy(&r);

    /* the last record cut short by one byte */
    cr_assert_eq(mb_body_init(&r, sb.data, sb.size - 1, 3), 0);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(mb_body_next(&r, &o), 1);
    s_expect_proto(mb_body_next(&r, &o));
    mb_body_destroy(&r);
    msgpack_sbuffer_destroy(&sb);
}

static void s_body_proto(const void *buf, size_t n, uint32_t count)
{
    mb_body_reader r;
    msgpack_object o;
    cr_assert_eq(mb_body_init(&r, buf, n, count), 0);
    s_expect_proto(mb_body_next(&r, &o));
    mb_body_destroy(&r);
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
}

Test(body, depth_limit)
{
    unsigned char buf[MB_MAX_DEPTH + 2];
    memset(buf, 0x91, sizeof buf); /* [[[...]]] */
    buf[MB_MAX_DEPTH] = 0x01;
    size_t used;
    cr_assert_eq(mb_validate(buf, MB_MAX_DEPTH + 1, &used), 0, "%s", dt_last_error());
    cr_assert_eq(used, MB_MAX_DEPTH + 1);
    buf[MB_MAX_DEPTH] = 0x91;
    buf[MB_MAX_DEPTH + 1] = 0x01;
    s_body_proto(buf, sizeof buf, 1);
    cr_assert(strstr(dt_last_error(), "nesting"));
}

Test(body, rejects_reserved_ext_and_oversize)
{
    const unsigned char c1[] = {0xc1};
    const unsigned char in_array[] = {0x92, 0x01, 0xc1};
    const unsigned char fixext[] = {0xd4, 0x01, 0x00};
    s_body_proto(c1, sizeof c1, 1);
    s_body_proto(in_array, sizeof in_array, 1);
    s_body_proto(fixext, sizeof fixext, 1);

    mb_body_reader r;
    s_expect_proto(mb_body_init(&r, c1, (size_t)MB_MAX_BODY + 1, 1));
    mb_body_destroy(&r);
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
    const uint32_t count = 7 + 8 + 2 + 4 + 3 + 3 + 3;
    mb_body_reader r;
    msgpack_object o;
    cr_assert_eq(mb_body_init(&r, all, sizeof all, count), 0);
    for (uint32_t k = 0; k < count; k++)
        cr_assert_eq(mb_body_next(&r, &o), 1, "object %u: %s", k, dt_last_error());
    cr_assert_eq(mb_body_next(&r, &o), 0);
    mb_body_destroy(&r);
}

Test(body, random_garbage)
{
    srand(777);
    for (int iter = 0; iter < 10000; iter++) {
        unsigned char buf[48];
        size_t n = (size_t)(rand() % (int)sizeof buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = (unsigned char)rand();
        mb_body_reader r;
        msgpack_object o;
        cr_assert_eq(mb_body_init(&r, buf, n, (uint32_t)(rand() % 4)), 0);
        int rc;
        while ((rc = mb_body_next(&r, &o)) == 1)
            ;
        cr_assert(rc == 0 || rc == DT_EPROTO);
        mb_body_destroy(&r);
    }
}

/* One random object of every msgpack format the decoder accepts (the signed formats also with
 * non-negative values, which msgpack-c decodes as positive integers), nested to depth 3. */
static void s_pack_random(msgpack_sbuffer *sb, msgpack_packer *pk, int depth)
{
    unsigned char raw[9];
    int kind = rand() % (depth < 3 ? 14 : 12);
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
            s_pack_random(sb, pk, depth + 1);
        break;
    }
    default: {
        int n = rand() % (rand() % 8 ? 4 : 20);
        msgpack_pack_map(pk, (size_t)n);
        for (int i = 0; i < 2 * n; i++)
            s_pack_random(sb, pk, depth + 1);
        break;
    }
    }
}

/* The decoder against msgpack-c's own unpacker: the same objects from well-formed bytes, and from
 * damaged bytes either a refusal or the same objects. */
Test(body, decodes_as_msgpack_c_does)
{
    srand(4242);
    int damaged_accepted = 0;
    for (int iter = 0; iter < 4000; iter++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        s_pack_random(&sb, &pk, 0);
        bool damage = iter % 2;
        if (damage && sb.size > 0)
            for (int k = 0; k < 1 + rand() % 3; k++)
                sb.data[rand() % sb.size] = (char)rand();
        msgpack_zone ours, theirs;
        cr_assert(msgpack_zone_init(&ours, 1024) && msgpack_zone_init(&theirs, 1024));
        msgpack_object a, b;
        size_t used = 0, off = 0;
        int rc = mb_decode_object(sb.data, sb.size, &ours, &a, &used);
        if (!damage)
            cr_assert_eq(rc, 0, "iteration %d: %s", iter, dt_last_error());
        if (rc == 0) {
            cr_assert_eq(msgpack_unpack(sb.data, used, &off, &theirs, &b), MSGPACK_UNPACK_SUCCESS, "iteration %d", iter);
            cr_assert_eq(off, used, "iteration %d", iter);
            cr_assert(msgpack_object_equal(a, b), "iteration %d: not the object msgpack-c decodes", iter);
            size_t vused;
            cr_assert_eq(mb_validate(sb.data, sb.size, &vused), 0);
            cr_assert_eq(vused, used);
            damaged_accepted += damage;
        } else {
            cr_assert_eq(rc, DT_EPROTO, "iteration %d", iter);
            size_t vused;
            cr_assert_eq(mb_validate(sb.data, sb.size, &vused), DT_EPROTO);
        }
        msgpack_zone_destroy(&ours);
        msgpack_zone_destroy(&theirs);
        msgpack_sbuffer_destroy(&sb);
    }
    cr_assert_gt(damaged_accepted, 100, "damaged objects that still decode are compared too");
}

/* ---- typed access -------------------------------------------------------------------- */

Test(get, type_checks)
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

    mb_body_reader r;
    msgpack_object o;
    cr_assert_eq(mb_body_init(&r, sb.data, sb.size, 1), 0);
    cr_assert_eq(mb_body_next(&r, &o), 1);
    int64_t i;
    uint64_t u;
    double d;
    const char *s;
    uint32_t len, n;
    int64_t v[3];

    cr_assert(mb_arr(&o, 7) && !mb_arr(&o, 8) && !mb_arr(&o.via.array.ptr[1], 0));
    cr_assert(!mb_get_i64(&o, 0, &i) && !mb_get_u64(&o, 0, &u) && !mb_get_f64(&o, 0, &d));
    cr_assert(mb_get_str(&o, 0, &s, &len) && len == 1 && s[0] == 's');
    cr_assert(mb_get_i64(&o, 1, &i) && i == -5);
    cr_assert(!mb_get_u64(&o, 1, &u));
    cr_assert(mb_get_f64(&o, 1, &d) && d == -5.0);
    cr_assert(!mb_get_i64(&o, 2, &i));
    cr_assert(mb_get_u64(&o, 2, &u) && u == (uint64_t)INT64_MAX + 1);
    cr_assert(mb_get_f64(&o, 3, &d) && d == 0.25);
    cr_assert(!mb_get_i64(&o, 3, &i) && !mb_get_str(&o, 3, &s, &len));
    cr_assert(mb_get_i64s(&o, 4, v, 3, &n) && n == 3 && v[2] == 3);
    cr_assert(!mb_get_i64s(&o, 4, v, 2, &n));
    cr_assert(!mb_get_i64s(&o, 5, v, 3, &n));
    cr_assert(!mb_get_i64s(&o, 1, v, 3, &n));
    cr_assert(!mb_get_i64(&o, 6, &i) && !mb_get_str(&o, 6, &s, &len));
    cr_assert(!mb_get_i64(&o, 7, &i) && !mb_get_f64(&o, 7, &d) && !mb_get_str(&o, 7, &s, &len));
    cr_assert(!mb_get_i64(&o, UINT32_MAX, &i));
    cr_assert(!mb_get_i64(&o.via.array.ptr[1], 0, &i));
    cr_assert(!mb_arr(NULL, 0));
    cr_assert_eq(mb_body_next(&r, &o), 0);
    mb_body_destroy(&r);
    msgpack_sbuffer_destroy(&sb);
}
