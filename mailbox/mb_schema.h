/* mb_schema — every record the actors exchange, declared once: its fields and their types.
 * From these tables come, for each record `name`:
 *   mb_name_rec                 the decoded record, one member per field;
 *   mb_encode_name(w, fields)   its encoder into an inline writer (mb_writer.h): the per-op path;
 *   mb_decode_name(rec, &out)   its strict decoder, straight from the bytes at the cursor rec: wrong
 *                               arity, a field of the wrong type or out of range gives DT_EPROTO
 *                               "malformed <name> record: ...", never a crash;
 *   mb_read_name(&c, &out)      the same, advancing c past the record (a list's elements).
 * Nothing from a socket is trusted: decode first, then use.
 *
 * A record is a msgpack array. Op records (the body of an MB_OPS message, controller -> worker)
 * and completions (MB_COMPLETIONS, worker -> controller) start with their code; a message that
 * carries one record (MB_HELLO, MB_ABORT, MB_PEER, MB_PROCESS, MB_RELEASE) has none, its header's
 * kind says which, and nested records (an ASSEMBLE's parts, a COMPUTE's outputs) have none either.
 * MB_BYE and MB_HEARTBEAT messages have no body at all (mb_codec.h).
 *
 * Shapes are local: the controller has already worked out each device's piece, a worker never
 * re-infers. Tensor ids, future ids and transfer ids are separate id spaces (act_runtime).
 *
 * A list field (PARTS, OUTS) is an array of nested records and comes last: its encoder
 * parameter is the number of elements, which the caller encodes right after with the element's
 * encoder. PARTS (as many as a redistribute needs) decodes to a cursor over the elements, each
 * read in turn with mb_read_part; OUTS (at most MB_MAX_OUTS) decodes to the OUT records themselves.
 *
 * Any change to a record bumps MB_PROTOCOL; HELLO carries it (with the op registry's hash) and the
 * controller refuses a worker that speaks another.
 */
#ifndef MB_SCHEMA_H
#define MB_SCHEMA_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "dtorch.h"
#include "mb_codec.h"
#include "mb_writer.h"

#define MB_PROTOCOL 12       /* the records below; bumped on any change to them */
#define MB_MAX_IDS 32        /* tensor ids in an IDS field (a COMPUTE's inputs) */
#define MB_MAX_INTS 16       /* integers in an INTS field (dt_op_attrs.ints) */
#define MB_MAX_FLOATS 4      /* floats in a FLOATS field (dt_op_attrs.floats) */
#define MB_MAX_VIEW_INTS 80  /* integers in a VIEWS field: room for 4 strided views of 8 dims */
#define MB_MAX_OUTS 2        /* OUT records in an OUTS field (a COMPUTE's outputs) */

/* TRACE actions, and an event's fields: the record's code, its op (a COMPUTE's op number, else
 * -1), and when it began and ended (CLOCK_MONOTONIC, ns) */
enum { MB_TRACE_START = 0, MB_TRACE_STOP = 1, MB_TRACE_SEND = 2 };
enum { MB_TRACE_CODE, MB_TRACE_OP, MB_TRACE_BEGIN, MB_TRACE_END, MB_TRACE_FIELDS };

/* How an ASSEMBLE part lands in the new piece. */
typedef enum {
    MB_PART_COPY = 0,   /* write the region into place */
    MB_PART_REDUCE = 1, /* combine the region into what is in place with op */
    MB_PART_DIV = 2,    /* divide the whole piece by divisor (the end of an avg) */
} mb_part_mode;

/* ---- field types: wire form -> decoded member (encoder parameters) ------------------------ */
/* U64     unsigned integer            -> uint64_t      (uint64_t)
 * I64     integer                     -> int64_t       (int64_t)
 * BOOL    true or false               -> bool          (bool)
 * DTYPE   integer, a dt_dtype         -> dt_dtype      (dt_dtype)
 * REDUCE  integer, a dt_reduce_op     -> dt_reduce_op  (dt_reduce_op)
 * MODE    integer, an mb_part_mode    -> mb_part_mode  (mb_part_mode)
 * SCALAR  integer or float            -> dt_scalar     (dt_scalar)
 * OSCALAR nil, integer or float       -> mb_oscalar    (const dt_scalar *, NULL: nil)
 * STR     string                      -> mb_str        (const char *)
 * OSTR    nil or string               -> mb_str, ptr NULL for nil (const char *, NULL: nil)
 * SHAPE   <= DT_MAX_DIMS sizes >= 0, at most 2^48 elements -> mb_dims (int n, const int64_t *)
 * DIMS    <= DT_MAX_DIMS integers     -> mb_dims       (int n, const int64_t *)
 * IDS     <= MB_MAX_IDS unsigned      -> mb_ids        (int n, const uint64_t *)
 * INTS    <= MB_MAX_INTS integers     -> mb_ints       (int n, const int64_t *)
 * FLOATS  <= MB_MAX_FLOATS numbers    -> mb_floats     (int n, const double *)
 * VIEWS   <= MB_MAX_VIEW_INTS integers -> mb_views     (int n, const int64_t *): per input read as
 *         a view, [input, first element, rank, sizes...] (a contiguous run) or [input, first element,
 *         -rank, sizes..., strides...] (strided, in elements; read by mb_view_next)
 * PARTS   array of PART records       -> mb_list       (uint32_t n, then n mb_encode_part)
 * OUTS    <= MB_MAX_OUTS OUT records  -> mb_outs       (uint32_t n, then n mb_encode_out) */

typedef struct { int n; int64_t v[DT_MAX_DIMS]; } mb_dims;
typedef struct { int n; uint64_t v[MB_MAX_IDS]; } mb_ids;
typedef struct { int n; int64_t v[MB_MAX_INTS]; } mb_ints;
typedef struct { int n; double v[MB_MAX_FLOATS]; } mb_floats;
typedef struct { int n; int64_t v[MB_MAX_VIEW_INTS]; } mb_views;
typedef struct { bool present; dt_scalar value; } mb_oscalar;
typedef struct { const char *ptr; uint32_t len; } mb_str;              /* inside the record, not NUL-terminated */
typedef struct { uint32_t n; mb_cursor items; } mb_list;   /* inside the record: n elements, checked whole */

/* ---- op records: controller -> worker, [code, fields...] ---------------------------------- */
#define MB_OP_RECORDS(X)                                                                             \
    X(FREE, free, 1)          /* the tensor is gone: drop the device's piece */                    \
    X(EMPTY, empty, 2)        /* a piece with whatever memory holds */                             \
    X(FILL, fill, 3)          /* a piece filled with one value */                                   \
    X(RANDOM, random, 4)      /* a piece of a counter-based random tensor */                        \
    X(ARANGE, arange, 5)      /* a 1-D piece of a range */                                          \
    X(LOAD, load, 6)          /* a piece whose bytes travel as a payload frame */                   \
    X(FETCH, fetch, 7)        /* send the piece to the controller -> VALUE or ERROR */              \
    X(SYNC, sync, 8)          /* answer once everything before has run -> VALUE without a value */ \
    X(SEND, send, 9)          /* send a region of a piece to a peer (a REGION message) */          \
    X(ASSEMBLE, assemble, 10) /* a new piece from regions of local and received pieces */           \
    X(COMPUTE, compute, 11)   /* a registered op's kernel (ops/op_registry.h) */                   \
    X(STATS, stats, 12)       /* send the device's counters -> VALUE (MB_STATS) */             \
    X(DEFINE, define, 13)     /* keep a captured sequence of op records for replays */          \
    X(REPLAY, replay, 14)     /* run a kept sequence again, on new inputs into new ids */        \
    X(DROP, drop, 15)         /* forget a kept sequence */                                       \
    X(TRACE, trace, 16)       /* the device's timeline of records: start, stop, send -> VALUE */

#define MB_FIELDS_FREE(F) F(U64, id)
#define MB_FIELDS_EMPTY(F) F(U64, id) F(DTYPE, dtype) F(SHAPE, shape)
#define MB_FIELDS_FILL(F) F(U64, id) F(DTYPE, dtype) F(SHAPE, shape) F(SCALAR, value)
/* offset: where the piece starts in the tensor of global_shape; normal: randn, else rand */
#define MB_FIELDS_RANDOM(F)                                                                          \
    F(U64, id) F(DTYPE, dtype) F(SHAPE, shape) F(DIMS, offset) F(SHAPE, global_shape) F(U64, seed)  \
    F(U64, stream) F(BOOL, normal)
/* element i is start + (first + i) * step */
#define MB_FIELDS_ARANGE(F) F(U64, id) F(DTYPE, dtype) F(SHAPE, shape) F(I64, first) F(SCALAR, start) F(SCALAR, step)
/* frame: index of the payload frame that holds the piece's bytes */
#define MB_FIELDS_LOAD(F) F(U64, id) F(DTYPE, dtype) F(SHAPE, shape) F(I64, frame)
/* piece: which of the future's pieces this is */
#define MB_FIELDS_FETCH(F) F(U64, id) F(U64, future) F(I64, piece)
#define MB_FIELDS_SYNC(F) F(U64, future) F(I64, piece)
/* the region of piece id at offset, of shape, to device `to` as transfer `transfer` */
#define MB_FIELDS_SEND(F) F(U64, id) F(U64, transfer) F(I64, to) F(DIMS, offset) F(SHAPE, shape)
/* piece id of dtype and shape made from parts of local piece `source` and received regions; into:
 * id is a piece this device holds already, of that dtype and shape, whose value the parts replace
 * (written in its own storage when nothing else holds that) */
#define MB_FIELDS_ASSEMBLE(F)                                                                        \
    F(U64, id) F(DTYPE, dtype) F(SHAPE, shape) F(U64, source) F(BOOL, into) F(PARTS, parts)
/* op: the op's number (op_index); ins: input tensor ids; ints, floats, scalar: the attributes;
 * ctx: per-device integers of the op's `local` hook; views: the inputs read as a view of the
 * piece their id names (a contiguous run of it: its first element and its own shape; a view
 * DTensor that never got pieces of its own); outs: one OUT per output */
#define MB_FIELDS_COMPUTE(F)                                                                         \
    F(I64, op) F(IDS, ins) F(INTS, ints) F(FLOATS, floats) F(OSCALAR, scalar) F(INTS, ctx)           \
    F(VIEWS, views) F(OUTS, outs)

/* piece: which of the future's pieces this is; reset_peak: after answering, peak_bytes starts
 * again from bytes_in_use */
#define MB_FIELDS_STATS(F) F(U64, future) F(I64, piece) F(BOOL, reset_peak)
/* action MB_TRACE_START: forget what was recorded and record every record run from now on ->
 * VALUE int64 (1,) 0; MB_TRACE_STOP: stop -> VALUE int64 (1,) the events kept; MB_TRACE_SEND: the
 * events -> VALUE int64 (n, MB_TRACE_FIELDS), forgotten then */
#define MB_FIELDS_TRACE(F) F(U64, future) F(I64, piece) F(I64, action)

/* A captured sequence (actors/worker/act_replay.c): `count` op records (FREE, EMPTY, FILL, RANDOM,
 * ARANGE, SEND, ASSEMBLE, COMPUTE) back to back in payload frame `frame`, as they were packed
 * while the controller captured; `name` says what made them (for errors). Ids the capture made
 * are [tensor_lo, tensor_hi), its transfers [transfer_lo, transfer_hi), its random streams
 * [stream_lo, stream_hi); `ins` are the tensors it takes as inputs, `outs` the ones it returns.
 * Every other tensor id it names is a constant the device keeps until the DROP. */
#define MB_FIELDS_DEFINE(F)                                                                          \
    F(U64, graph) F(STR, name) F(U64, tensor_lo) F(U64, tensor_hi) F(U64, transfer_lo) F(U64, transfer_hi) \
    F(U64, stream_lo) F(U64, stream_hi) F(IDS, ins) F(IDS, outs) F(I64, count) F(I64, frame)
/* graph's records with input i read from ins[i], each id the capture made at tensor_base +
 * (id - tensor_lo), its transfers at transfer_base + ..., its random streams at stream_base + ...
 * of seed */
#define MB_FIELDS_REPLAY(F)                                                                          \
    F(U64, graph) F(IDS, ins) F(U64, tensor_base) F(U64, transfer_base) F(U64, seed) F(U64, stream_base)
#define MB_FIELDS_DROP(F) F(U64, graph)

/* A STATS record's answer: a VALUE of MB_NSTATS int64 counters (shape [MB_NSTATS]), in this order. */
#define MB_STATS(X)                                                                                  \
    X(bytes_in_use)           /* bytes of the pieces the device holds now */                        \
    X(peak_bytes)             /* the most bytes_in_use has been since the last reset */              \
    X(peer_messages_sent)     /* regions sent to other devices */                                   \
    X(peer_bytes_sent)        /* ... and their bytes */                                             \
    X(peer_messages_received) /* regions received from other devices */                             \
    X(peer_bytes_received)    /* ... and their bytes */                                             \
    X(shm_bytes_sent)         /* of peer_bytes_sent: lent by handle (read from this device's segments) */ \
    X(shm_bytes_received)     /* of peer_bytes_received: read in place from the sender's segments */ \
    X(shm_bytes_fetched)      /* bytes of fetched values the controller read from this device's segments */ \
    X(pooled_bytes)           /* freed buffers kept for reuse by the memory pool of the device's process */ \
    X(loads)                  /* pieces the controller sent whole (LOAD records: distribute_tensor, from_local) */ \
    X(loaded_bytes)           /* ... and their bytes */ \
    X(peer_messages_refused)  /* peer messages from no worker of the run, or not the device they name */ \
    X(peer_regions_dropped)   /* regions past what may wait for their ASSEMBLE (act_worker.h, ACT_RECV_MAX) */ \
    X(huge_page_bytes)        /* of bytes_in_use: in the pool's memory advised for huge pages (dt_pool_advised) */ \
    X(onednn_convs)           /* conv2d kernels that ran through oneDNN (ops/cpu/cpu_dnnl.h; 0 in a build without) */ \
    X(peer_handoffs)          /* of peer_messages_sent: handed to a worker thread's inbox, no message made (act_inbox.h) */ \
    X(onednn_matmuls)         /* bfloat16 products on the CPU's bfloat16 units through oneDNN (ops/cpu/cpu_gemm.h) */

#define MB_GEN_STAT(name) MB_STAT_##name,
typedef enum { MB_STATS(MB_GEN_STAT) MB_NSTATS } mb_stat;

/* ---- completions: worker -> controller, [code, fields...] --------------------------------- */
#define MB_COMPLETION_RECORDS(X)                                                                     \
    X(CREDIT, credit, 1)      /* returns send credit: records of one batch run */                   \
    X(VALUE, value, 2)        /* a fetched piece (or a SYNC's answer) */                            \
    X(ERROR, error, 3)        /* a fetch that failed */

#define MB_FIELDS_CREDIT(F) F(U64, records)
/* frame: index of the payload frame with the piece's bytes, -1 for none (SYNC, or a piece lent by
 * handle). segment >= 0: the piece is `offset` bytes into the worker's shared segment of that
 * descriptor and serial (dt_shm.h), C-contiguous, lent as `hold` until the controller sends a
 * RELEASE of it; -1: no segment (serial, offset and hold 0) */
#define MB_FIELDS_VALUE(F)                                                                           \
    F(U64, future) F(I64, piece) F(DTYPE, dtype) F(SHAPE, shape) F(I64, frame) F(I64, segment) F(U64, serial) \
    F(U64, offset) F(U64, hold)
/* status: the dt error code */
#define MB_FIELDS_ERROR(F) F(U64, future) F(I64, piece) F(I64, status) F(STR, message)

/* ---- records without a code: a message's only record, or nested ------------------------- */
#define MB_PLAIN_RECORDS(X)                                                                          \
    X(HELLO, hello)           /* MB_HELLO, worker -> controller: who it is and what it speaks */   \
    X(ABORT, abort)           /* MB_ABORT, controller -> worker: a device died, stop waiting on it */ \
    X(REGION, region)         /* MB_PEER, worker -> worker: one transfer of a redistribute */       \
    X(PROCESS, process)       /* MB_PROCESS, controller -> worker: the process a device runs as */  \
    X(RELEASE, release)       /* MB_RELEASE, to the lender: done with what it lent by handle */     \
    X(ENDPOINT, endpoint)     /* MB_ENDPOINT, controller -> worker on another host: a peer's socket */ \
    X(PART, part)             /* an element of ASSEMBLE's parts */                                  \
    X(OUT, out)               /* an element of COMPUTE's outs */

/* protocol: MB_PROTOCOL; registry: op_registry_hash(); device_type: the backend it runs; host: its
 * host's name (for messages); peer: where other workers reach it, "tcp://A.B.C.D:PORT" for a worker
 * that connected over tcp, "" for one the controller started (its peer socket is the run's) */
#define MB_FIELDS_HELLO(F)                                                                           \
    F(I64, device) F(I64, pid) F(U64, protocol) F(U64, registry) F(STR, device_type) F(STR, host) F(STR, peer)
#define MB_FIELDS_ABORT(F) F(I64, device)
/* status 0: the region's bytes are
 *   the message's payload frame (storage 0, segment -1);
 *   between threads of one process: at address `data` (byte strides `strides`) inside the sender's
 *   storage `storage`, kept alive by the message's one (empty) payload frame, which lets it go
 *   when the message dies (the receiver takes a reference of its own first);
 *   between processes of one host: `offset` bytes into the sender's shared segment of descriptor
 *   `segment` and `serial` (dt_shm.h), byte strides `strides`, lent as `hold` until the receiver
 *   sends a RELEASE of it;
 * otherwise the dt error code and its message */
#define MB_FIELDS_REGION(F)                                                                          \
    F(U64, transfer) F(I64, status) F(DTYPE, dtype) F(SHAPE, shape) F(OSTR, error) F(U64, storage)   \
    F(U64, data) F(DIMS, strides) F(I64, segment) F(U64, serial) F(U64, offset) F(U64, hold)
/* device runs as process pid of this host, whose segments the receiver may map (by
 * /proc/<pid>/fd); pid 0: it lends nothing, its regions come as frames. Told about itself, a worker
 * may lend its pieces by handle; a worker never told so sends frames */
#define MB_FIELDS_PROCESS(F) F(I64, device) F(I64, pid)
/* device's peer socket is at endpoint ("tcp://A.B.C.D:PORT", read again by the worker) */
#define MB_FIELDS_ENDPOINT(F) F(I64, device) F(STR, endpoint)
/* hold: what a REGION or VALUE lent by handle; the lender's storage is free again */
#define MB_FIELDS_RELEASE(F) F(U64, hold)
/* the region of shape at src_offset in the source (device `from`: local piece when transfer is 0,
 * else the region received as transfer) lands at dst_offset; divisor: DIV's */
#define MB_FIELDS_PART(F)                                                                            \
    F(MODE, mode) F(REDUCE, op) F(I64, from) F(U64, transfer) F(DIMS, src_offset) F(DIMS, dst_offset)  \
    F(SHAPE, shape) F(I64, divisor)
#define MB_FIELDS_OUT(F) F(U64, id) F(DTYPE, dtype) F(SHAPE, shape)

/* ---- what the tables generate --------------------------------------------------------------- */

#define MB_GEN_OP_CODE(NAME, name, code) MB_OP_##NAME = code,
typedef enum { MB_OP_RECORDS(MB_GEN_OP_CODE) } mb_op_code;
#define MB_GEN_C_CODE(NAME, name, code) MB_C_##NAME = code,
typedef enum { MB_COMPLETION_RECORDS(MB_GEN_C_CODE) } mb_completion_code;

/* decoded member of each field type */
#define MB_CT_U64 uint64_t
#define MB_CT_I64 int64_t
#define MB_CT_BOOL bool
#define MB_CT_DTYPE dt_dtype
#define MB_CT_REDUCE dt_reduce_op
#define MB_CT_MODE mb_part_mode
#define MB_CT_SCALAR dt_scalar
#define MB_CT_OSCALAR mb_oscalar
#define MB_CT_STR mb_str
#define MB_CT_OSTR mb_str
#define MB_CT_SHAPE mb_dims
#define MB_CT_DIMS mb_dims
#define MB_CT_IDS mb_ids
#define MB_CT_INTS mb_ints
#define MB_CT_FLOATS mb_floats
#define MB_CT_VIEWS mb_views
#define MB_CT_PARTS mb_list
#define MB_CT_OUTS mb_outs

/* encoder parameters of each field type */
#define MB_PT_U64(f) uint64_t f
#define MB_PT_I64(f) int64_t f
#define MB_PT_BOOL(f) bool f
#define MB_PT_DTYPE(f) dt_dtype f
#define MB_PT_REDUCE(f) dt_reduce_op f
#define MB_PT_MODE(f) mb_part_mode f
#define MB_PT_SCALAR(f) dt_scalar f
#define MB_PT_OSCALAR(f) const dt_scalar *f
#define MB_PT_STR(f) const char *f
#define MB_PT_OSTR(f) const char *f
#define MB_PT_SHAPE(f) int n_##f, const int64_t *f
#define MB_PT_DIMS(f) int n_##f, const int64_t *f
#define MB_PT_IDS(f) int n_##f, const uint64_t *f
#define MB_PT_INTS(f) int n_##f, const int64_t *f
#define MB_PT_FLOATS(f) int n_##f, const double *f
#define MB_PT_VIEWS(f) int n_##f, const int64_t *f
#define MB_PT_PARTS(f) uint32_t n_##f
#define MB_PT_OUTS(f) uint32_t n_##f

static inline void mb_w_scalar(mb_writer *w, dt_scalar v)
{
    if (v.is_int)
        mb_w_int(w, v.i);
    else
        mb_w_double(w, v.f);
}

static inline void mb_w_ostr(mb_writer *w, const char *s)
{
    if (s)
        mb_w_str(w, s, strlen(s));
    else
        mb_w_nil(w);
}

/* how each field type is written */
#define MB_WT_U64(w, f) mb_w_uint(w, f)
#define MB_WT_I64(w, f) mb_w_int(w, f)
#define MB_WT_BOOL(w, f) mb_w_bool(w, f)
#define MB_WT_DTYPE(w, f) mb_w_int(w, (int64_t)(f))
#define MB_WT_REDUCE(w, f) mb_w_int(w, (int64_t)(f))
#define MB_WT_MODE(w, f) mb_w_int(w, (int64_t)(f))
#define MB_WT_SCALAR(w, f) mb_w_scalar(w, f)
#define MB_WT_OSCALAR(w, f) ((f) ? mb_w_scalar(w, *(f)) : mb_w_nil(w))
#define MB_WT_STR(w, f) mb_w_str(w, f, strlen(f))
#define MB_WT_OSTR(w, f) mb_w_ostr(w, f)
#define MB_WT_SHAPE(w, f) mb_w_i64s(w, f, n_##f)
#define MB_WT_DIMS(w, f) mb_w_i64s(w, f, n_##f)
#define MB_WT_IDS(w, f) mb_w_u64s(w, f, n_##f)
#define MB_WT_INTS(w, f) mb_w_i64s(w, f, n_##f)
#define MB_WT_FLOATS(w, f) mb_w_doubles(w, f, n_##f)
#define MB_WT_VIEWS(w, f) mb_w_i64s(w, f, n_##f)
#define MB_WT_PARTS(w, f) mb_w_array(w, n_##f)
#define MB_WT_OUTS(w, f) mb_w_array(w, n_##f)

#define MB_GEN_MEMBER(T, f) MB_CT_##T f;
#define MB_GEN_PARAM(T, f) , MB_PT_##T(f)
#define MB_GEN_WRITE(T, f) MB_WT_##T(w, f);
#define MB_GEN_COUNT(T, f) +1

/* mb_<name>_rec for every record; the plain ones first, as lists hold them */
#define MB_GEN_STRUCT(NAME, name) typedef struct { MB_FIELDS_##NAME(MB_GEN_MEMBER) } mb_##name##_rec;
#define MB_GEN_STRUCT_CODED(NAME, name, code) MB_GEN_STRUCT(NAME, name)
MB_PLAIN_RECORDS(MB_GEN_STRUCT)
typedef struct { uint32_t n; mb_out_rec v[MB_MAX_OUTS]; } mb_outs;
MB_OP_RECORDS(MB_GEN_STRUCT_CODED)
MB_COMPLETION_RECORDS(MB_GEN_STRUCT_CODED)

/* mb_encode_<name>(w, fields...): records with a code write it first */
#define MB_GEN_ENCODE_CODED(NAME, name, code)                                                        \
    static inline void mb_encode_##name(mb_writer *w MB_FIELDS_##NAME(MB_GEN_PARAM))                 \
    {                                                                                                \
        mb_w_array(w, 1 MB_FIELDS_##NAME(MB_GEN_COUNT));                                             \
        mb_w_int(w, code);                                                                           \
        MB_FIELDS_##NAME(MB_GEN_WRITE)                                                               \
    }
#define MB_GEN_ENCODE_PLAIN(NAME, name)                                                              \
    static inline void mb_encode_##name(mb_writer *w MB_FIELDS_##NAME(MB_GEN_PARAM))                 \
    {                                                                                                \
        mb_w_array(w, 0 MB_FIELDS_##NAME(MB_GEN_COUNT));                                             \
        MB_FIELDS_##NAME(MB_GEN_WRITE)                                                               \
    }
MB_OP_RECORDS(MB_GEN_ENCODE_CODED)
MB_COMPLETION_RECORDS(MB_GEN_ENCODE_CODED)
MB_PLAIN_RECORDS(MB_GEN_ENCODE_PLAIN)

/* int mb_read_<name>(&c, &out): the record at c, c then past it; int mb_decode_<name>(&rec, &out):
 * the record at rec, which stays. 0 or DT_EPROTO (out is then partly written). */
#define MB_GEN_DECODE_DECL(NAME, name)                                                               \
    int mb_read_##name(mb_cursor *c, mb_##name##_rec *out);                                          \
    static inline int mb_decode_##name(const mb_cursor *rec, mb_##name##_rec *out)                   \
    {                                                                                                \
        mb_cursor c = *rec;                                                                          \
        return mb_read_##name(&c, out);                                                              \
    }
#define MB_GEN_DECODE_DECL_CODED(NAME, name, code) MB_GEN_DECODE_DECL(NAME, name)
MB_OP_RECORDS(MB_GEN_DECODE_DECL_CODED)
MB_COMPLETION_RECORDS(MB_GEN_DECODE_DECL_CODED)
MB_PLAIN_RECORDS(MB_GEN_DECODE_DECL)

/* One view of a COMPUTE's VIEWS field, from *at (advanced past it): 1 and the view, 0 at the end,
 * DT_EPROTO when the integers do not make a view (an input outside [0, nin), a negative first
 * element, a rank or sizes that are not a shape, a negative stride). Whether the view lies inside
 * its piece is the reader's to check (mb_view_extent). */
typedef struct {
    int input;
    int64_t first;   /* elements from the start of the piece */
    mb_dims shape;
    bool strided;
    int64_t strides[DT_MAX_DIMS]; /* elements between neighbours along each dim (strided only; 0 along
                                   * a dim of one element, whatever the record said) */
} mb_view;
int mb_view_next(const mb_views *views, int *at, int nin, mb_view *out);
/* One past the last element view v reads (first + 1 for a contiguous one of n elements: first + n),
 * 0 when it reads none; -1 when that overflows. */
int64_t mb_view_extent(const mb_view *v);

/* A FREE record in the form mb_encode_free writes ([1, id]: a two-element array header, the code
 * as one byte, the id), read in place with *c moved past it. It is every op's second record, where
 * the strict decoder's generic steps cost more than the record's own work. False, c unmoved, for
 * anything else (another record, or a FREE of another encoding, which mb_read_free still takes). */
_Static_assert(1 MB_FIELDS_FREE(MB_GEN_COUNT) == 2, "mb_read_free_fast knows FREE as [code, id]");
static inline bool mb_read_free_fast(mb_cursor *c, uint64_t *id)
{
    mb_cursor at = {c->p + 2, c->end};
    if (mb_left(c) <= 2 || c->p[0] != 0x92 || c->p[1] != MB_OP_FREE || !mb_read_u64(&at, id))
        return false;
    *c = at;
    return true;
}

/* The code of an op record or a completion (its first element): 0 or DT_EPROTO. */
int mb_record_code(const mb_cursor *rec, int64_t *code);
/* Element i of the record at rec when it is an integer >= 0 (a record too malformed to decode may
 * still name the tensor it was to make); false otherwise. */
bool mb_field_u64(const mb_cursor *rec, uint32_t i, uint64_t *out);
/* The name of an op record's code ("fill", "compute", ...; "?" for an unknown one). */
const char *mb_op_name(int64_t code);

#endif
