/* mb_writer — msgpack encoding inlined for the per-op path. The user's thread packs every op
 * record it submits; msgpack-c's packer calls a write callback per item (~6x slower measured),
 * so records are encoded here straight into a growable buffer. The bytes are plain msgpack:
 * integers in their smallest encoding, floats as float64. mb_codec.h reads them back. */
#ifndef MB_WRITER_H
#define MB_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *data;
    size_t size;
    size_t cap;
    bool failed; /* an allocation failed: the buffer holds what fit before */
} mb_writer;

/* Makes room for n more bytes; false (and failed set) when memory ran out. */
static inline bool mb_w_room(mb_writer *w, size_t n)
{
    if (w->size + n <= w->cap)
        return true;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->size + n)
        cap *= 2;
    char *grown = realloc(w->data, cap);
    if (!grown) {
        w->failed = true;
        return false;
    }
    w->data = grown;
    w->cap = cap;
    return true;
}

static inline void s_mb_w_be(mb_writer *w, uint8_t tag, uint64_t v, int bytes)
{
    char *p = w->data + w->size;
    p[0] = (char)tag;
    for (int i = 0; i < bytes; i++)
        p[1 + i] = (char)(v >> (8 * (bytes - 1 - i)));
    w->size += 1 + (size_t)bytes;
}

static inline void mb_w_uint(mb_writer *w, uint64_t v)
{
    if (!mb_w_room(w, 9))
        return;
    if (v < 128)
        w->data[w->size++] = (char)v;
    else if (v <= UINT8_MAX)
        s_mb_w_be(w, 0xcc, v, 1);
    else if (v <= UINT16_MAX)
        s_mb_w_be(w, 0xcd, v, 2);
    else if (v <= UINT32_MAX)
        s_mb_w_be(w, 0xce, v, 4);
    else
        s_mb_w_be(w, 0xcf, v, 8);
}

static inline void mb_w_int(mb_writer *w, int64_t v)
{
    if (v >= 0) {
        mb_w_uint(w, (uint64_t)v);
        return;
    }
    if (!mb_w_room(w, 9))
        return;
    if (v >= -32)
        w->data[w->size++] = (char)(0xe0 | (v + 32));
    else if (v >= INT8_MIN)
        s_mb_w_be(w, 0xd0, (uint64_t)v, 1);
    else if (v >= INT16_MIN)
        s_mb_w_be(w, 0xd1, (uint64_t)v, 2);
    else if (v >= INT32_MIN)
        s_mb_w_be(w, 0xd2, (uint64_t)v, 4);
    else
        s_mb_w_be(w, 0xd3, (uint64_t)v, 8);
}

static inline void mb_w_array(mb_writer *w, uint32_t n)
{
    if (!mb_w_room(w, 5))
        return;
    if (n < 16)
        w->data[w->size++] = (char)(0x90 | n);
    else if (n <= UINT16_MAX)
        s_mb_w_be(w, 0xdc, n, 2);
    else
        s_mb_w_be(w, 0xdd, n, 4);
}

static inline void mb_w_nil(mb_writer *w)
{
    if (mb_w_room(w, 1))
        w->data[w->size++] = (char)0xc0;
}

static inline void mb_w_bool(mb_writer *w, bool v)
{
    if (mb_w_room(w, 1))
        w->data[w->size++] = (char)(v ? 0xc3 : 0xc2);
}

static inline void mb_w_str(mb_writer *w, const char *s, size_t len)
{
    if (!mb_w_room(w, 5 + len))
        return;
    if (len < 32)
        w->data[w->size++] = (char)(0xa0 | len);
    else if (len <= UINT8_MAX)
        s_mb_w_be(w, 0xd9, len, 1);
    else if (len <= UINT16_MAX)
        s_mb_w_be(w, 0xda, len, 2);
    else
        s_mb_w_be(w, 0xdb, len, 4);
    memcpy(w->data + w->size, s, len);
    w->size += len;
}

/* n bytes already encoded (one or more whole objects, e.g. a record written for another device). */
static inline void mb_w_encoded(mb_writer *w, const void *bytes, size_t n)
{
    if (!mb_w_room(w, n))
        return;
    memcpy(w->data + w->size, bytes, n);
    w->size += n;
}

static inline void mb_w_double(mb_writer *w, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    if (mb_w_room(w, 9))
        s_mb_w_be(w, 0xcb, bits, 8);
}

static inline void mb_w_i64s(mb_writer *w, const int64_t *v, int n)
{
    mb_w_array(w, (uint32_t)n);
    for (int i = 0; i < n; i++)
        mb_w_int(w, v[i]);
}

static inline void mb_w_u64s(mb_writer *w, const uint64_t *v, int n)
{
    mb_w_array(w, (uint32_t)n);
    for (int i = 0; i < n; i++)
        mb_w_uint(w, v[i]);
}

static inline void mb_w_doubles(mb_writer *w, const double *v, int n)
{
    mb_w_array(w, (uint32_t)n);
    for (int i = 0; i < n; i++)
        mb_w_double(w, v[i]);
}

/* Hands the bytes over (free them with free()) and leaves the writer empty. */
static inline char *mb_w_release(mb_writer *w)
{
    char *data = w->data;
    w->data = NULL;
    w->size = w->cap = 0;
    return data;
}

#endif
