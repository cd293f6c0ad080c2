/* mb_codec — strict msgpack encoding and decoding of actor message headers and bodies. */
#include "mb_codec.h"

#include <msgpack.h>
#include <string.h>

#include "dt_error.h"

/* Steps over one object at *pp without reading past end, checking every declared length against
 * the bytes left before any of it is trusted, so no count can make a reader loop past the bytes:
 * each array element needs at least one byte, each map entry two. Iterative, with the objects
 * still to step over at each level of nesting on a stack of MB_MAX_DEPTH. */
static int s_walk(const uint8_t **pp, const uint8_t *end)
{
    const uint8_t *p = *pp;
    uint64_t todo[MB_MAX_DEPTH + 1]; /* objects left at each level; level 0 is the one object */
    int level = 0;
    todo[0] = 1;
    for (;;) {
        while (todo[level] == 0) {
            if (level == 0) {
                *pp = p;
                return 0;
            }
            level--;
        }
        todo[level]--;
        if (p >= end)
            return dt_err(DT_EPROTO, "msgpack: truncated object");
        uint8_t b = *p++;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
            continue; /* fixint, nil, bool: the type byte is the whole object */
        size_t left = (size_t)(end - p);
        int lenbytes = 0;     /* size of an explicit length or count field */
        uint64_t skip = 0;    /* bytes of scalar data after the length field */
        uint64_t items = 0;   /* objects inside a container */
        bool container = false;
        if (b <= 0x9f) {
            container = true; /* fixmap, fixarray */
            items = b <= 0x8f ? 2u * (b & 0x0f) : (b & 0x0f);
        } else if (b <= 0xbf) {
            skip = b & 0x1f; /* fixstr */
        } else if (b == 0xc1) {
            return dt_err(DT_EPROTO, "msgpack: reserved byte 0xc1");
        } else if (b >= 0xc4 && b <= 0xc6) {
            lenbytes = 1 << (b - 0xc4); /* bin 8/16/32 */
        } else if ((b >= 0xc7 && b <= 0xc9) || (b >= 0xd4 && b <= 0xd8)) {
            return dt_err(DT_EPROTO, "msgpack: ext type 0x%02x is not supported", b);
        } else if (b == 0xca || b == 0xcb) {
            skip = b == 0xca ? 4 : 8;
        } else if (b >= 0xcc && b <= 0xd3) {
            skip = 1u << ((b - 0xcc) & 3); /* uint and int 8/16/32/64 */
        } else if (b >= 0xd9 && b <= 0xdb) {
            lenbytes = 1 << (b - 0xd9); /* str 8/16/32 */
        } else {
            container = true; /* array16/32 (0xdc, 0xdd), map16/32 */
            lenbytes = (b & 1) ? 4 : 2;
        }
        if ((size_t)lenbytes > left)
            return dt_err(DT_EPROTO, "msgpack: truncated length of type 0x%02x", b);
        if (lenbytes) {
            uint64_t n = mb_be(p, lenbytes);
            p += lenbytes;
            left -= (size_t)lenbytes;
            if (!container)
                skip = n;
            else
                items = b >= 0xde ? 2 * n : n;
        }
        if (skip > left)
            return dt_err(DT_EPROTO, "msgpack: object of type 0x%02x declares %llu bytes, %zu left",
                          b, (unsigned long long)skip, left);
        p += skip;
        if (container) {
            if (level >= MB_MAX_DEPTH)
                return dt_err(DT_EPROTO, "msgpack: nesting deeper than %d", MB_MAX_DEPTH);
            if (items > left)
                return dt_err(DT_EPROTO, "msgpack: container declares %llu items, %zu bytes left",
                              (unsigned long long)items, left);
            todo[++level] = items;
        }
    }
}

int mb_skip(mb_cursor *c)
{
    const uint8_t *p = c->p;
    int rc = s_walk(&p, c->end);
    if (rc == 0)
        c->p = p;
    return rc;
}

bool mb_elem(mb_cursor c, uint32_t i, mb_cursor *at)
{
    uint32_t n;
    if (!mb_read_array(&c, &n) || i >= n)
        return false;
    for (uint32_t k = 0; k < i; k++)
        if (mb_skip(&c) != 0)
            return false;
    *at = c;
    return true;
}

int mb_validate(const void *data, size_t size, size_t *used)
{
    mb_cursor c = mb_cursor_of(data, size);
    int rc = mb_skip(&c);
    if (rc == 0)
        *used = (size_t)(c.p - (const uint8_t *)data);
    return rc;
}

/* ---- header ---------------------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len;
} s_fixed_buf;

/* The header has a known bound (MB_MAX_HEADER), so the packer writes straight into the caller's
 * buffer instead of growing an sbuffer. */
static int s_fixed_write(void *data, const char *buf, size_t len)
{
    s_fixed_buf *fb = data;
    memcpy(fb->buf + fb->len, buf, len);
    fb->len += len;
    return 0;
}

size_t mb_header_encode(const mb_header *h, char *buf)
{
    s_fixed_buf fb = {buf, 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &fb, s_fixed_write);
    msgpack_pack_array(&pk, 5);
    msgpack_pack_uint32(&pk, h->version);
    msgpack_pack_uint32(&pk, h->kind);
    msgpack_pack_uint64(&pk, h->seq);
    msgpack_pack_uint32(&pk, h->sender);
    msgpack_pack_uint32(&pk, h->count);
    return fb.len;
}

int mb_header_decode(const void *data, size_t size, mb_header *out)
{
    if (size > MB_MAX_HEADER)
        return dt_err(DT_EPROTO, "header: %zu bytes, at most %d allowed", size, MB_MAX_HEADER);
    mb_cursor c = mb_cursor_of(data, size);
    uint32_t n;
    uint64_t f[5];
    int rc = mb_skip(&(mb_cursor){c.p, c.end});
    if (rc)
        return rc;
    if (!mb_read_array(&c, &n))
        return dt_err(DT_EPROTO, "header: not an array of 5 fields");
    if (n != 5)
        return dt_err(DT_EPROTO, "header: %u fields, expected 5", n);
    for (uint32_t i = 0; i < 5; i++)
        if (!mb_read_u64(&c, &f[i]))
            return dt_err(DT_EPROTO, "header: field %u is not a non-negative integer", i);
    if (mb_left(&c))
        return dt_err(DT_EPROTO, "header: %zu trailing bytes", mb_left(&c));

    if (f[0] != MB_VERSION)
        return dt_err(DT_EPROTO, "header: wire version %llu, expected %d",
                      (unsigned long long)f[0], MB_VERSION);
    if (f[1] < 1 || f[1] > MB_KIND_MAX)
        return dt_err(DT_EPROTO, "header: unknown message kind %llu", (unsigned long long)f[1]);
    if (f[3] > UINT32_MAX || f[4] > UINT32_MAX)
        return dt_err(DT_EPROTO, "header: sender or count out of range");
    *out = (mb_header){.version = (uint32_t)f[0], .kind = (uint32_t)f[1], .seq = f[2],
                       .sender = (uint32_t)f[3], .count = (uint32_t)f[4]};
    return 0;
}

/* ---- body ------------------------------------------------------------------------------ */

int mb_body_init(mb_body_reader *r, const void *data, size_t size, uint32_t count)
{
    *r = (mb_body_reader){.at = mb_cursor_of(data, 0), .remaining = 0};
    if (size > MB_MAX_BODY)
        return dt_err(DT_EPROTO, "body: %zu bytes, at most %u allowed", size, MB_MAX_BODY);
    r->at = mb_cursor_of(data, size);
    r->remaining = count;
    return 0;
}

int mb_body_next(mb_body_reader *r, mb_cursor *rec)
{
    if (r->pending) {
        int rc = mb_skip(&r->at);
        if (rc)
            return rc;
        r->pending = false;
    }
    size_t left = mb_left(&r->at);
    if (r->remaining == 0) {
        if (left)
            return dt_err(DT_EPROTO, "body: %zu trailing bytes after the declared objects", left);
        return 0;
    }
    if (left == 0)
        return dt_err(DT_EPROTO, "body: truncated, %u declared objects missing", r->remaining);
    *rec = r->at;
    r->pending = true;
    r->remaining--;
    return 1;
}
