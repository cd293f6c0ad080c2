/* dtn_op — running registered ops as the other dtensor modules do it (dt_op.c): the checked call
 * the op's rules work on, and the COMPUTE record one device gets. */
#ifndef DTN_OP_H
#define DTN_OP_H

#include <stdint.h>

#include "dtorch.h"
#include "op_registry.h"

/* Fills c for a call of def on n tensors, as its infer and shard rules see it (every input kept
 * where it is in want[]): checks the arity and the attributes, that every input lives on in[0]'s
 * mesh and comes from the running runtime. 0, or an error naming def->name. */
int dtn_op_call(const op_def *def, int n, dt_tensor *const *in, const op_attrs *attrs, op_call *c);

/* An output of a COMPUTE record: the tensor id, its dtype and local shape. */
typedef struct {
    uint64_t id;
    dt_dtype dtype;
    int ndim;
    const int64_t *shape;
} dtn_out;

/* Between act_runtime_begin and _end: device's COMPUTE record of op (its id) on the tensors ins,
 * with the attributes, the op's per-device integers ctx and the outputs. */
void dtn_op_compute(int64_t device, int op, int nin, const uint64_t *ins, const op_attrs *a, int nctx,
                    const int64_t *ctx, int nout, const dtn_out *outs);

#endif
