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

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MB_VERSION 1                /* bumped on any incompatible change of the wire format */
#define MB_MAX_HEADER 64            /* bytes; a header is 5 small integers */
#define MB_MAX_BODY (64u << 20)     /* bytes of op records or completions in one message */
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

/* Checks that data begins with one well-formed msgpack object whose declared lengths fit in
 * size and whose nesting is at most MB_MAX_DEPTH; stores its length in *used. 0 or DT_EPROTO. */
int mb_validate(const void *data, size_t size, size_t *used);
/* Validates as mb_validate does and decodes the object into *out as msgpack_unpack would: arrays
 * and maps allocated in zone, strings and bins pointing into data (which must outlive *out). */
int mb_decode_object(const void *data, size_t size, msgpack_zone *zone, msgpack_object *out, size_t *used);

/* Iterates the `count` objects of a body; each object lives until the next call, or with `keep`
 * set (after init) until mb_body_destroy. */
typedef struct {
    const char *data;
    size_t size;
    size_t offset;
    uint32_t remaining;
    bool keep;
    msgpack_zone zone;
} mb_body_reader;

int mb_body_init(mb_body_reader *r, const void *data, size_t size, uint32_t count);
/* 1: *out is the next object; 0: all count objects read and no bytes left over; DT_EPROTO. */
int mb_body_next(mb_body_reader *r, msgpack_object *out);
void mb_body_destroy(mb_body_reader *r);

/* Typed access to the fields of a record (an array); each returns false on a wrong type or
 * an index out of range, so decoders can reject bad records with one check per field. */
bool mb_arr(const msgpack_object *o, uint32_t min_len);
bool mb_get_i64(const msgpack_object *arr, uint32_t i, int64_t *out);
bool mb_get_u64(const msgpack_object *arr, uint32_t i, uint64_t *out);
bool mb_get_f64(const msgpack_object *arr, uint32_t i, double *out);  /* float or integer */
bool mb_get_str(const msgpack_object *arr, uint32_t i, const char **ptr, uint32_t *len);
/* an array of at most max integers: */
bool mb_get_i64s(const msgpack_object *arr, uint32_t i, int64_t *out, uint32_t max, uint32_t *n);

#endif
