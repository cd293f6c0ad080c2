/* op_quant — how the kernels of the products with quantized weights (linear_int8, linear_int4:
 * ops/op_table.h's OP_QUANT) read their local pieces, the same on every backend. */
#ifndef OP_QUANT_H
#define OP_QUANT_H

#include <stdint.h>

#include "op_registry.h"

#define OP_QUANT_GROUP 32 /* linear_int4: input features per scale */

/* A device's piece of out (M, N) = x (M, K_x)[:, k0:k0 + K] @ dequantized(qweight (N, K))^T + bias. */
typedef struct {
    int bits;             /* 8 or 4 */
    int64_t M, N;         /* rows of the input, output features of this piece */
    int64_t K_x;          /* the input piece's features (its row stride) */
    int64_t k0, K;        /* the features this weight piece holds: K_x's [k0, k0 + K) */
    int64_t row_bytes;    /* bytes of one weight row (its int32 words * 4) */
    int64_t groups;       /* scales per row: 1 (int8), ceil(K / 32) (int4) */
    bool bias;            /* add in[3] (N,) */
} op_quant_dims;

/* The dims of kernel k's pieces: NULL, or why they do not fit together (a record from a socket can
 * name any shapes and any ctx: nothing outside the pieces is ever read). */
const char *op_quant_layout(const op_kernel *k, op_quant_dims *d);

/* Weight element k of a row's bytes, as the integer it holds. */
static inline int op_quant_int8(const uint8_t *row, int64_t k) { return (int8_t)row[k]; }
static inline int op_quant_int4(const uint8_t *row, int64_t k)
{
    int v = (row[k >> 1] >> ((k & 1) * 4)) & 0xf;
    return (v ^ 8) - 8;
}

#endif
