/* mb_codec — the msgpack wire format of actor messages, decoded strictly.
 *
 * A message is a multi-part ZeroMQ message:
 *   frame 0  header   msgpack array [version, kind, seq, sender, count]
 *   frame 1  body     `count` msgpack objects back to back (op records or completions)
 *   frame 2+ payloads raw tensor bytes, referenced from the body by frame index
 * A ROUTER socket sees the peer's routing id as an extra first frame.
 *
 * The records of a body are declared in mb_schema.h.
 *
 * Decoding never trusts the input: truncated, oversized, wrong-version or garbage bytes give
 * DT_EPROTO with a message in dt_last_error(), never a crash or an unbounded allocation.
 */
#ifndef MB_CODEC_H
#define MB_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MB_VERSION 2                /* bumped on any incompatible change of the wire format */
#define MB_MAX_HEADER 64            /* bytes; a header is 5 small integers */
#define MB_MAX_BODY (64u << 20)     /* bytes of op records or completions in one message */
#define MB_MAX_PIECE (UINT64_C(8) << 48) /* bytes of the largest piece a record can name: 2^48 elements of 8 */
#define MB_MAX_DEPTH 16             /* nesting of msgpack containers in one record */
#define MB_SENDER_CONTROLLER 0xffffffffu /* sender id of the controller; devices send their id */

typedef enum {
    MB_HELLO = 1,       /* worker -> controller: one HELLO record (mb_schema.h) */
    MB_OPS = 2,         /* controller -> worker: op records */
    MB_COMPLETIONS = 3, /* worker -> controller: completion records */
    MB_BYE = 4,         /* controller -> worker: stop; worker -> controller: stopped. No body */
    MB_PEER = 5,        /* worker -> worker: one REGION record, the region as its payload frame or a handle */
    MB_ABORT = 6,       /* controller -> worker: one ABORT record */
    MB_HEARTBEAT = 7,   /* worker process -> controller, from its own socket: still alive; controller ->
                         * worker on another host: the controller still is. No body */
    MB_PROCESS = 8,     /* controller -> worker: one PROCESS record */
    MB_RELEASE = 9,     /* controller or worker -> the worker that lent by handle: one RELEASE record */
    MB_ENDPOINT = 10,   /* controller -> worker on another host: one ENDPOINT record */
    MB_KIND_MAX = 10,
} mb_kind;

typedef struct {
    uint32_t version; /* MB_VERSION */
    uint32_t kind;    /* mb_kind */
    uint64_t seq;     /* per-sender message counter, starting at 0 */
    uint32_t sender;  /* device id, or MB_SENDER_CONTROLLER */
    uint32_t count;   /* number of msgpack objects in the body */
} mb_header;

/* Encodes h into buf (at least MB_MAX_HEADER bytes); returns the encoded size. */
size_t mb_header_encode(const mb_header *h, char *buf);
/* Strict decode: exactly one array of 5 unsigned integers, known kind, MB_VERSION. 0 or DT_EPROTO. */
int mb_header_decode(const void *data, size_t size, mb_header *out);

/* ---- reading: a cursor over msgpack bytes -------------------------------------------------
 * Records are read straight from the bytes into their decoded structs (mb_schema.h): no object
 * tree, no allocation. Every read checks the bytes left before it trusts a length, takes one whole
 * object of the type asked for, and advances past it; on false the cursor is left where it was.
 * Values keep msgpack-c's reading: an integer of any encoding whose value is >= 0 is unsigned. */
typedef struct {
    const uint8_t *p, *end;
} mb_cursor;

static inline mb_cursor mb_cursor_of(const void *data, size_t size)
{
    const uint8_t *p = data;
    return (mb_cursor){p, size ? p + size : p}; /* an empty frame's data may be NULL */
}

static inline size_t mb_left(const mb_cursor *c) { return (size_t)(c->end - c->p); }

/* The next object's first byte, 0xc1 (a byte msgpack never uses) at the end. */
static inline uint8_t mb_peek(const mb_cursor *c) { return c->p < c->end ? *c->p : 0xc1; }

/* n big-endian bytes at p as an unsigned value: one load and a byte swap for the widths msgpack
 * uses (1, 2, 4, 8: every id is 8), a loop for any other. */
static inline uint64_t mb_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint16_t v16;
    uint32_t v32;
    switch (n) {
    case 1: return p[0];
    case 2: memcpy(&v16, p, 2); return __builtin_bswap16(v16);
    case 4: memcpy(&v32, p, 4); return __builtin_bswap32(v32);
    case 8: memcpy(&v, p, 8); return __builtin_bswap64(v);
    default: break;
    }
#endif
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* An integer of any encoding: its value as 64 bits, negative when *neg. */
static inline bool mb_read_int(mb_cursor *c, uint64_t *bits, bool *neg)
{
    uint8_t b = mb_peek(c);
    if (b <= 0x7f || b >= 0xe0) {
        *bits = (uint64_t)(int64_t)(int8_t)b;
        *neg = b >= 0xe0;
        c->p++;
        return true;
    }
    if (b < 0xcc || b > 0xd3)
        return false;
    int n = 1 << ((b - 0xcc) & 3);
    if (mb_left(c) < (size_t)n + 1)
        return false;
    uint64_t v = mb_be(c->p + 1, n);
    if (b >= 0xd0) { /* int 8/16/32/64: sign-extend from the top bit of its n bytes */
        int shift = 64 - 8 * n;
        v = (uint64_t)((int64_t)(v << shift) >> shift);
        *neg = (int64_t)v < 0;
    } else {
        *neg = false;
    }
    *bits = v;
    c->p += 1 + n;
    return true;
}

/* The readers of the per-op path (ids, sizes, array headers) take their one-byte forms first and
 * are inlined wherever they are used: a call costs more than the read. */
#define MB_HOT static inline __attribute__((always_inline))

/* an integer >= 0 */
MB_HOT bool mb_read_u64(mb_cursor *c, uint64_t *out)
{
    if (c->p < c->end && *c->p <= 0x7f) {
        *out = *c->p++;
        return true;
    }
    mb_cursor at = *c;
    uint64_t v;
    bool neg;
    if (!mb_read_int(&at, &v, &neg) || neg)
        return false;
    *out = v;
    *c = at;
    return true;
}

/* an integer in int64's range */
MB_HOT bool mb_read_i64(mb_cursor *c, int64_t *out)
{
    if (c->p < c->end && *c->p <= 0x7f) {
        *out = *c->p++;
        return true;
    }
    mb_cursor at = *c;
    uint64_t v;
    bool neg;
    if (!mb_read_int(&at, &v, &neg) || (!neg && v > INT64_MAX))
        return false;
    *out = (int64_t)v;
    *c = at;
    return true;
}

/* a float32 or float64 (not an integer) */
static inline bool mb_read_float(mb_cursor *c, double *out)
{
    uint8_t b = mb_peek(c);
    size_t n = b == 0xca ? 4 : b == 0xcb ? 8 : 0;
    if (!n || mb_left(c) < n + 1)
        return false;
    uint64_t bits = mb_be(c->p + 1, (int)n);
    if (n == 4) {
        uint32_t b32 = (uint32_t)bits;
        float f;
        memcpy(&f, &b32, sizeof f);
        *out = f;
    } else {
        memcpy(out, &bits, sizeof *out);
    }
    c->p += 1 + n;
    return true;
}

/* a float, or an integer taken as a double */
static inline bool mb_read_f64(mb_cursor *c, double *out)
{
    uint64_t v;
    bool neg;
    if (mb_read_float(c, out))
        return true;
    if (!mb_read_int(c, &v, &neg))
        return false;
    *out = neg ? (double)(int64_t)v : (double)v;
    return true;
}

static inline bool mb_read_bool(mb_cursor *c, bool *out)
{
    uint8_t b = mb_peek(c);
    if (b != 0xc2 && b != 0xc3)
        return false;
    *out = b == 0xc3;
    c->p++;
    return true;
}

/* true, past it, when the next object is nil */
static inline bool mb_read_nil(mb_cursor *c)
{
    if (mb_peek(c) != 0xc0)
        return false;
    c->p++;
    return true;
}

/* The length in the header at c of a string or an array: a fix form (fix | length, the length in
 * the bits of fixmask) or a long one (tags wide.. wide + nwide - 1, with base << (tag - wide)
 * bytes of length after the tag), in *len, and the bytes after the tag in *head. False for
 * another type, or a length the bytes left could not hold (each unit needs a byte). */
static inline bool s_mb_header(const mb_cursor *c, uint8_t fix, uint8_t fixmask, uint8_t wide, int nwide, int base,
                               uint64_t *len, int *head)
{
    uint8_t b = mb_peek(c);
    if ((b & (uint8_t)~fixmask) == fix && c->p < c->end) {
        *len = b & fixmask;
        *head = 0;
    } else if (b >= wide && b < wide + nwide) {
        *head = base << (b - wide);
        if (mb_left(c) < (size_t)*head + 1)
            return false;
        *len = mb_be(c->p + 1, *head);
    } else {
        return false;
    }
    return *len <= mb_left(c) - 1 - (size_t)*head;
}

/* a string: its bytes stay in the buffer (not NUL-terminated) */
static inline bool mb_read_str(mb_cursor *c, const char **ptr, uint32_t *len)
{
    uint64_t n;
    int head;
    if (!s_mb_header(c, 0xa0, 0x1f, 0xd9, 3, 1, &n, &head))
        return false;
    *ptr = (const char *)c->p + 1 + head;
    *len = (uint32_t)n;
    c->p += 1 + (size_t)head + n;
    return true;
}

/* An array's header: its element count, which the bytes left could hold (each element needs a
 * byte); the elements follow, read one by one. */
MB_HOT bool mb_read_array(mb_cursor *c, uint32_t *n)
{
    uint8_t b = mb_peek(c); /* 0xc1 (never used) past the end */
    if ((b & 0xf0) == 0x90 && (size_t)(b & 0x0f) < mb_left(c)) {
        *n = b & 0x0f;
        c->p++;
        return true;
    }
    uint64_t len;
    int head;
    if (!s_mb_header(c, 0x90, 0x0f, 0xdc, 2, 2, &len, &head))
        return false;
    *n = (uint32_t)len;
    c->p += 1 + head;
    return true;
}

/* Steps over one whole object, checking that it is well formed: its declared lengths fit in the
 * bytes left, its nesting is at most MB_MAX_DEPTH, no reserved byte or ext type. 0 or DT_EPROTO
 * (the cursor is then where it was). */
int mb_skip(mb_cursor *c);
/* The same over the first object of data: its length in *used. */
int mb_validate(const void *data, size_t size, size_t *used);
/* *at: element i of the array at c (its elements before i stepped over); false when c holds no
 * array of more than i elements, or one of them is malformed. */
bool mb_elem(mb_cursor c, uint32_t i, mb_cursor *at);

/* ---- bodies --------------------------------------------------------------------------------- */

/* Iterates the `count` records of a body. Each is handed out as a cursor from its first byte to
 * the body's end; a caller that reads it with the consuming readers (mb_read_<name>) tells the
 * reader where it ended with mb_body_read, and the next record starts there. Otherwise the next
 * mb_body_next steps over the record with mb_skip, checking it whole. Either way no read goes
 * past the body, and every record is checked before anything after it is handed out. */
typedef struct {
    mb_cursor at;        /* the record handed out last, or the next one */
    uint32_t remaining;
    bool pending;        /* at is the record handed out last, still to be stepped over */
} mb_body_reader;

int mb_body_init(mb_body_reader *r, const void *data, size_t size, uint32_t count);
/* 1: *rec is the next record; 0: all count records read and no bytes left over; DT_EPROTO. */
int mb_body_next(mb_body_reader *r, mb_cursor *rec);
/* The record last handed out was read up to rec->p (a record read whole by a consuming reader);
 * a cursor that has not moved off the record's first byte leaves the record to mb_body_next. */
static inline void mb_body_read(mb_body_reader *r, const mb_cursor *rec)
{
    if (r->pending && rec->p > r->at.p && rec->p <= r->at.end) {
        r->at.p = rec->p;
        r->pending = false;
    }
}

#endif
