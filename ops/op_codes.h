/* op_codes — the op records a controller sends a device and the completions it gets back.
 * Every record is a msgpack array whose first element is its code. Shapes are local: the
 * controller has already worked out each device's piece, a worker never re-infers. */
#ifndef OP_CODES_H
#define OP_CODES_H

typedef enum {
    OP_FREE = 1,   /* [FREE, id] */
    OP_EMPTY = 2,  /* [EMPTY, id, dtype, shape] */
    OP_FILL = 3,   /* [FILL, id, dtype, shape, value (int or float)] */
    OP_RANDOM = 4, /* [RANDOM, id, dtype, shape, offset, global_shape, seed, stream, normal] */
    OP_ARANGE = 5, /* [ARANGE, id, dtype, n, first, start, step] (start/step int or float) */
    OP_LOAD = 6,   /* [LOAD, id, dtype, shape, payload frame index] */
    OP_FETCH = 7,  /* [FETCH, id, future id, piece] -> C_VALUE or C_ERROR */
    OP_SYNC = 8,   /* [SYNC, future id, piece] -> C_VALUE with an empty value */
    OP_SEND = 9,   /* [SEND, id, transfer id, to device, region offset, region shape]: a region of
                      a local piece to a peer (redistribute) */
    OP_ASSEMBLE = 10, /* [ASSEMBLE, id, dtype, shape, source id, parts]: a new piece from regions
                         of local and received pieces; part = [mode, op, from device,
                         transfer id (0: local), src offset, dst offset, shape, divisor] */
    OP_COMPUTE = 11, /* [COMPUTE, op index, out ids, [[dtype, local shape] per output], in ids,
                        [ints, floats, scalar or nil], ctx ints]: a registered op (ops/op_registry.h) */
    OP_MAX = 11,
} op_code;

/* How an ASSEMBLE part lands in the new piece. */
typedef enum {
    OP_PART_COPY = 0,   /* write the region into place */
    OP_PART_REDUCE = 1, /* combine the region into what is in place with op */
    OP_PART_DIV = 2,    /* divide the whole piece by divisor (the end of an avg) */
} op_part_mode;

typedef enum {
    C_CREDIT = 1,  /* [CREDIT, records executed] returns send credit to the controller */
    C_VALUE = 2,   /* [VALUE, future id, piece, dtype, shape, payload frame index] */
    C_ERROR = 3,   /* [ERROR, future id, piece, code, message] */
} op_completion;

static inline const char *op_name(int code)
{
    static const char *names[] = {"?",     "free",  "empty", "fill", "random", "arange",
                                  "load",  "fetch", "sync",  "send", "redistribute", "compute"};
    return code >= 1 && code <= OP_MAX ? names[code] : "?";
}

#endif
