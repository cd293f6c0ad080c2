/* cpu_ops — the CPU kernel of every op, looked up by its id: each row of ops/op_table.h names its
 * kernel, cpu_k_<kernel>, which its family's file defines (ops/cpu/cpu_<family>.c; an op without
 * one fails to link). Also what the families' kernels share to read their pieces. */
#ifndef CPU_OPS_H
#define CPU_OPS_H

#include "cpu_pointwise.h"
#include "op_registry.h"

/* Runs an op on a device's pieces: NULL, or why it failed (bad data such as an index out of
 * range, memory). */
typedef const char *(*cpu_op_kernel)(op_kernel *k);

/* The CPU kernel of op id, or NULL when no op has that id (every op has one). */
cpu_op_kernel cpu_kernel_for(int id);

/* A piece as its elements in compute type t (cpu_pointwise.h): the piece itself when it already
 * is, else a converted scratch copy (*scratch set, to be freed). NULL when out of memory. */
const void *cpu_piece_as(const op_local *in, cpu_ctype t, void **scratch);

/* The kernels the rows name (OP_KERNELS). */
#define OP_KERNEL(name, id, kernel) const char *cpu_k_##kernel(op_kernel *k);
OP_KERNELS
#undef OP_KERNEL

#endif
