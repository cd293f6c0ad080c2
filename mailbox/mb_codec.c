/* mb_codec — strict msgpack encoding and decoding of actor message headers and bodies. */
#include "mb_codec.h"

#include <string.h>

#include "dt_error.h"

/* Big-endian unsigned integer of n (1, 2, 4 or 8) bytes. */
static uint64_t s_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Walks one object at *pp without reading past end and, when o is not NULL, decodes it into o
 * (arrays and maps in zone, strings and bins pointing into the bytes), as msgpack_unpack would.
 * Checks every declared length against the bytes left before any of it is trusted, so no count
 * can make it allocate more than the bytes could hold: each array element needs at least one
 * byte, each map entry two. One pass both validates and decodes, with no allocation of its own
 * beyond the zone's bump pointer: msgpack_unpack after a separate validation was a third of a
 * worker's time for small ops. */
static int s_walk(const uint8_t **pp, const uint8_t *end, int depth, msgpack_zone *zone, msgpack_object *o)
{
    const uint8_t *p = *pp;
    if (p >= end)
        return dt_err(DT_EPROTO, "msgpack: truncated object");
    uint8_t b = *p++;
    size_t left = (size_t)(end - p);
    int lenbytes = 0;     /* size of an explicit length or count field */
    uint64_t skip = 0;    /* bytes of scalar data after the length field */
    uint64_t children = 0;
    msgpack_object_type type = MSGPACK_OBJECT_NIL;

    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        /* fixint, nil, bool: the type byte is the whole object */
    } else if (b <= 0x9f) {
        type = b <= 0x8f ? MSGPACK_OBJECT_MAP : MSGPACK_OBJECT_ARRAY; /* fixmap, fixarray */
        children = b & 0x0f;
    } else if (b <= 0xbf) {
        type = MSGPACK_OBJECT_STR; /* fixstr */
        skip = b & 0x1f;
    } else if (b == 0xc1) {
        return dt_err(DT_EPROTO, "msgpack: reserved byte 0xc1");
    } else if (b >= 0xc4 && b <= 0xc6) {
        type = MSGPACK_OBJECT_BIN;
        lenbytes = 1 << (b - 0xc4); /* bin 8/16/32 */
    } else if ((b >= 0xc7 && b <= 0xc9) || (b >= 0xd4 && b <= 0xd8)) {
        return dt_err(DT_EPROTO, "msgpack: ext type 0x%02x is not supported", b);
    } else if (b == 0xca || b == 0xcb) {
        skip = b == 0xca ? 4 : 8;
    } else if (b >= 0xcc && b <= 0xd3) {
        skip = 1u << ((b - 0xcc) & 3); /* uint and int 8/16/32/64 */
    } else if (b >= 0xd9 && b <= 0xdb) {
        type = MSGPACK_OBJECT_STR;
        lenbytes = 1 << (b - 0xd9); /* str 8/16/32 */
    } else {
        type = b <= 0xdd ? MSGPACK_OBJECT_ARRAY : MSGPACK_OBJECT_MAP; /* array16/32 (0xdc, 0xdd), map16/32 */
        lenbytes = (b & 1) ? 4 : 2;
    }
    bool container = type == MSGPACK_OBJECT_ARRAY || type == MSGPACK_OBJECT_MAP;

    if ((size_t)lenbytes > left)
        return dt_err(DT_EPROTO, "msgpack: truncated length of type 0x%02x", b);
    if (lenbytes) {
        uint64_t n = s_be(p, lenbytes);
        p += lenbytes;
        left -= (size_t)lenbytes;
        if (container)
            children = n;
        else
            skip = n;
    }
    if (skip > left)
        return dt_err(DT_EPROTO, "msgpack: object of type 0x%02x declares %llu bytes, %zu left",
                      b, (unsigned long long)skip, left);
    const uint8_t *data = p;
    p += skip;
    uint64_t items = type == MSGPACK_OBJECT_MAP ? 2 * children : children;
    if (container) {
        if (depth >= MB_MAX_DEPTH)
            return dt_err(DT_EPROTO, "msgpack: nesting deeper than %d", MB_MAX_DEPTH);
        if (items > left)
            return dt_err(DT_EPROTO, "msgpack: container declares %llu items, %zu bytes left",
                          (unsigned long long)items, left);
    }
    if (o) {
        o->type = type;
        if (b <= 0x7f) {
            *o = (msgpack_object){.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = b};
        } else if (b >= 0xe0) {
            *o = (msgpack_object){.type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = (int8_t)b};
        } else if (b == 0xc2 || b == 0xc3) {
            *o = (msgpack_object){.type = MSGPACK_OBJECT_BOOLEAN, .via.boolean = b == 0xc3};
        } else if (b == 0xca) {
            uint32_t bits = (uint32_t)s_be(data, 4);
            float f;
            memcpy(&f, &bits, sizeof f);
            *o = (msgpack_object){.type = MSGPACK_OBJECT_FLOAT32, .via.f64 = f};
        } else if (b == 0xcb) {
            uint64_t bits = s_be(data, 8);
            double d;
            memcpy(&d, &bits, sizeof d);
            *o = (msgpack_object){.type = MSGPACK_OBJECT_FLOAT64, .via.f64 = d};
        } else if (b >= 0xcc && b <= 0xcf) {
            *o = (msgpack_object){.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = s_be(data, (int)skip)};
        } else if (b >= 0xd0 && b <= 0xd3) {
            /* sign-extend from the top bit of the skip bytes; a non-negative one is positive, as msgpack-c has it */
            int shift = 64 - 8 * (int)skip;
            int64_t v = (int64_t)(s_be(data, (int)skip) << shift) >> shift;
            *o = v < 0 ? (msgpack_object){.type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = v}
                       : (msgpack_object){.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = (uint64_t)v};
        } else if (type == MSGPACK_OBJECT_STR) {
            o->via.str = (msgpack_object_str){(uint32_t)skip, (const char *)data};
        } else if (type == MSGPACK_OBJECT_BIN) {
            o->via.bin = (msgpack_object_bin){(uint32_t)skip, (const char *)data};
        } else if (container) {
            size_t bytes = (size_t)children * (type == MSGPACK_OBJECT_MAP ? sizeof(msgpack_object_kv) : sizeof(msgpack_object));
            void *kids = children ? msgpack_zone_malloc(zone, bytes) : NULL;
            if (children && !kids)
                return dt_err(DT_ENOMEM, "msgpack: out of memory decoding %llu items", (unsigned long long)items);
            if (type == MSGPACK_OBJECT_MAP)
                o->via.map = (msgpack_object_map){(uint32_t)children, kids};
            else
                o->via.array = (msgpack_object_array){(uint32_t)children, kids};
        }
    }
    for (uint64_t i = 0; i < items; i++) {
        msgpack_object *child = NULL;
        if (o && type == MSGPACK_OBJECT_MAP)
            child = i % 2 ? &o->via.map.ptr[i / 2].val : &o->via.map.ptr[i / 2].key;
        else if (o)
            child = &o->via.array.ptr[i];
        /* a one-byte integer (most of a record: codes, ids, sizes, dtypes) without the call */
        if (p < end && (*p <= 0x7f || *p >= 0xe0)) {
            if (child)
                *child = *p <= 0x7f ? (msgpack_object){.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = *p}
                                    : (msgpack_object){.type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = (int8_t)*p};
            p++;
            continue;
        }
        int rc = s_walk(&p, end, depth + 1, zone, child);
        if (rc)
            return rc;
    }
    *pp = p;
    return 0;
}

int mb_validate(const void *data, size_t size, size_t *used)
{
    const uint8_t *p = data;
    int rc = s_walk(&p, p + size, 0, NULL, NULL);
    if (rc == 0)
        *used = (size_t)(p - (const uint8_t *)data);
    return rc;
}

int mb_decode_object(const void *data, size_t size, msgpack_zone *zone, msgpack_object *out, size_t *used)
{
    const uint8_t *p = data;
    int rc = s_walk(&p, p + size, 0, zone, out);
    if (rc == 0)
        *used = (size_t)(p - (const uint8_t *)data);
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
    msgpack_zone zone;
    if (!msgpack_zone_init(&zone, 256))
        return dt_err(DT_ENOMEM, "header: out of memory");
    msgpack_object o;
    uint64_t f[5];
    size_t used;
    int rc = mb_decode_object(data, size, &zone, &o, &used);
    if (rc == 0 && used != size)
        rc = dt_err(DT_EPROTO, "header: %zu trailing bytes", size - used);
    if (rc == 0 && !mb_arr(&o, 5))
        rc = dt_err(DT_EPROTO, "header: not an array of 5 fields");
    if (rc == 0 && o.via.array.size != 5)
        rc = dt_err(DT_EPROTO, "header: %u fields, expected 5", o.via.array.size);
    for (uint32_t i = 0; rc == 0 && i < 5; i++)
        if (!mb_get_u64(&o, i, &f[i]))
            rc = dt_err(DT_EPROTO, "header: field %u is not a non-negative integer", i);
    msgpack_zone_destroy(&zone);
    if (rc)
        return rc;

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
    memset(r, 0, sizeof *r);
    if (size > MB_MAX_BODY)
        return dt_err(DT_EPROTO, "body: %zu bytes, at most %u allowed", size, MB_MAX_BODY);
    if (!msgpack_zone_init(&r->zone, MSGPACK_ZONE_CHUNK_SIZE)) {
        memset(&r->zone, 0, sizeof r->zone);
        return dt_err(DT_ENOMEM, "body: out of memory");
    }
    r->data = data;
    r->size = size;
    r->remaining = count;
    return 0;
}

int mb_body_next(mb_body_reader *r, msgpack_object *out)
{
    size_t left = r->size - r->offset;
    if (r->remaining == 0) {
        if (left)
            return dt_err(DT_EPROTO, "body: %zu trailing bytes after the declared objects", left);
        return 0;
    }
    if (left == 0)
        return dt_err(DT_EPROTO, "body: truncated, %u declared objects missing", r->remaining);
    /* the previous object is documented to die here, so its memory is recycled */
    if (!r->keep)
        msgpack_zone_clear(&r->zone);
    size_t used;
    int rc = mb_decode_object(r->data + r->offset, left, &r->zone, out, &used);
    if (rc)
        return rc;
    r->offset += used;
    r->remaining--;
    return 1;
}

void mb_body_destroy(mb_body_reader *r)
{
    /* a reader whose init failed has no chunk list, and msgpack_zone_destroy needs one */
    if (r->zone.chunk_list.head)
        msgpack_zone_destroy(&r->zone);
    memset(r, 0, sizeof *r);
}

/* ---- typed access ---------------------------------------------------------------------- */

bool mb_arr(const msgpack_object *o, uint32_t min_len)
{
    return o && o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size >= min_len;
}

static const msgpack_object *s_at(const msgpack_object *arr, uint32_t i)
{
    return mb_arr(arr, 0) && i < arr->via.array.size ? &arr->via.array.ptr[i] : NULL;
}

static bool s_i64(const msgpack_object *o, int64_t *out)
{
    if (o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
        *out = (int64_t)o->via.u64;
        return true;
    }
    if (o && o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return true;
    }
    return false;
}

bool mb_get_i64(const msgpack_object *arr, uint32_t i, int64_t *out)
{
    return s_i64(s_at(arr, i), out);
}

bool mb_get_u64(const msgpack_object *arr, uint32_t i, uint64_t *out)
{
    const msgpack_object *o = s_at(arr, i);
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *out = o->via.u64;
    return true;
}

bool mb_get_f64(const msgpack_object *arr, uint32_t i, double *out)
{
    const msgpack_object *o = s_at(arr, i);
    if (!o)
        return false;
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; return true;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; return true;
    default: return false;
    }
}

bool mb_get_str(const msgpack_object *arr, uint32_t i, const char **ptr, uint32_t *len)
{
    const msgpack_object *o = s_at(arr, i);
    if (!o || o->type != MSGPACK_OBJECT_STR)
        return false;
    *ptr = o->via.str.ptr;
    *len = o->via.str.size;
    return true;
}

bool mb_get_i64s(const msgpack_object *arr, uint32_t i, int64_t *out, uint32_t max, uint32_t *n)
{
    const msgpack_object *o = s_at(arr, i);
    if (!mb_arr(o, 0) || o->via.array.size > max)
        return false;
    for (uint32_t k = 0; k < o->via.array.size; k++)
        if (!s_i64(&o->via.array.ptr[k], &out[k]))
            return false;
    *n = o->via.array.size;
    return true;
}
