/* op_view — what the view family's files share: op_view.c (the ops' shapes and shardings, and
 * their op_defs), op_view_alias.c (the hooks by which an output needs no copy) and op_view_local.c
 * (the pieces on a device). */
#ifndef OP_VIEW_H
#define OP_VIEW_H

#include "op_registry.h"

/* slice, narrow, select: the normalised (dim, start, length, step) their infer worked out */
void op_slice_derived(const op_call *c, int *dim, int64_t *start, int64_t *len, int64_t *step);

/* op_def.alias: a device's output is its input's bytes (reshape-likes; slices of one contiguous run) */
bool op_alias_whole(const op_kernel *k, size_t *offset);
bool op_alias_slice(const op_kernel *k, size_t *offset);
/* op_def.view: no device needs to hear of the output (the same cases, with the placements chosen) */
bool op_view_whole(const op_call *c, int64_t *first);
bool op_view_slice(const op_call *c, int64_t *first);
/* op_def.strided: the output is a strided view of what the input reads */
bool op_strided_ones(const op_call *c, const op_strided *in, op_strided *out);
bool op_strided_permute(const op_call *c, const op_strided *in, op_strided *out);
bool op_strided_expand(const op_call *c, const op_strided *in, op_strided *out);
bool op_strided_slice(const op_call *c, const op_strided *in, op_strided *out);

#endif
