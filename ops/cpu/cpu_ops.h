/* cpu_ops — the CPU kernel of every op, looked up by its id (ops/op_table.h). Each family's file
 * (ops/cpu/cpu_<family>.c) fills a table of its ops' kernels; cpu_kernel_for looks in them. Also
 * what the families' kernels share to read their pieces. */
#ifndef CPU_OPS_H
#define CPU_OPS_H

#include "cpu_pointwise.h"
#include "op_registry.h"

/* Runs an op on a device's pieces: NULL, or why it failed (bad data such as an index out of
 * range, memory). */
typedef const char *(*cpu_op_kernel)(op_kernel *k);

/* The CPU kernel of op id, or NULL when it has none. */
cpu_op_kernel cpu_kernel_for(int id);

/* A piece as its elements in compute type t (cpu_pointwise.h): the piece itself when it already
 * is, else a converted scratch copy (*scratch set, to be freed). NULL when out of memory. */
const void *cpu_piece_as(const op_local *in, cpu_ctype t, void **scratch);

/* The families' tables, indexed by id (NULL: not the family's). */
extern const cpu_op_kernel cpu_pointwise_kernels[OP_ID_LIMIT];
extern const cpu_op_kernel cpu_reduce_kernels[OP_ID_LIMIT];
extern const cpu_op_kernel cpu_view_kernels[OP_ID_LIMIT];
extern const cpu_op_kernel cpu_matmul_kernels[OP_ID_LIMIT];
extern const cpu_op_kernel cpu_rope_kernels[OP_ID_LIMIT];
extern const cpu_op_kernel cpu_write_kernels[OP_ID_LIMIT];
extern const cpu_op_kernel cpu_attention_kernels[OP_ID_LIMIT];
extern const cpu_op_kernel cpu_image_kernels[OP_ID_LIMIT];

#endif
