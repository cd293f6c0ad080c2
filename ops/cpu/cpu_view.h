/* cpu_view — CPU kernels of the view and data-movement family (ops/op_view.c). Every kernel
 * writes a fresh C-contiguous output; the op's infer/shard/local hooks settle shapes and
 * placements on the controller, so a kernel only moves bytes of its local pieces. */
#ifndef CPU_VIEW_H
#define CPU_VIEW_H

#include "op_registry.h"

/* reshape / view / flatten / unsqueeze / squeeze: the local output is the local input in the
 * same row-major order (the sharding rule guarantees it), so one memcpy. */
const char *cpu_view_copy(op_kernel *k);
/* permute: attrs.ints = the permutation (negative dims allowed). */
const char *cpu_view_permute(op_kernel *k);
/* expand: size-1 local dims broadcast to the output's local shape (right-aligned). */
const char *cpu_view_expand(op_kernel *k);
/* cat (stack when `stack`): attrs.ints[0] = dim (negative allowed, of the output); inputs are
 * converted to the output dtype and laid side by side along dim. */
const char *cpu_view_cat(op_kernel *k, bool stack);
/* slice / narrow / select: ctx = {dim, start, step} (normalised); the output takes elements
 * start, start + step, ... along dim of the local input; `drop` when the dim is removed. */
const char *cpu_view_slice(op_kernel *k, bool drop);
/* index_select(x, idx): attrs.ints = {dim, wrap}: idx holds int32/int64 positions along dim
 * of the local x (which is whole along dim); wrap = 1 accepts negative positions (x[idx]). */
const char *cpu_view_index_select(op_kernel *k);
/* triu / tril on the last two dims: attrs.ints[0] = diagonal; ctx = {row offset, column
 * offset} of this piece in the global matrix. */
const char *cpu_view_tri(op_kernel *k, bool upper);

#endif
