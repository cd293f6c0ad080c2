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

/* Views made on the controller (t->base set: dtn_tensor.h) have no pieces of their own. An op reads
 * one as it is (its records name the base's pieces and where the view lies in them); whatever reads
 * pieces by id gets some first, sharing the base's bytes (no copy):
 * dtn_op_view_piece: between act_runtime_begin and _end, pieces for t under a fresh id, which the
 * caller frees when done (what a redistribute or a captured op does);
 * dtn_op_settle: outside any session and any capture, t gets pieces of its own (t->id) and lets go
 * of its base (a fetch, an in-place write). Nothing to do for a tensor with pieces of its own. 0, or
 * the error naming op (t is then unchanged). */
uint64_t dtn_op_view_piece(const dt_tensor *t);
int dtn_op_settle(dt_tensor *t, const char *op);
/* Runs a plan that emits its records itself (dt_halo's and dt_ring's ops) for out, a new tensor on
 * mesh: begins the runtime's session named name, gives out its id and epoch, gives each view among
 * in[0..n) (NULL entries skipped) pieces of its own whose id replaces ids[i], calls run(arg), frees
 * those pieces and ends the session. out, or NULL with the error (out released, no device holding
 * it) when the session could not begin or run returned non-zero. n is at most
 * DTN_PLAN_MAX_INPUTS. */
#define DTN_PLAN_MAX_INPUTS 8
dt_tensor *dtn_op_run_plan(const char *name, dt_mesh *mesh, dt_tensor *out, dt_tensor *const *in, int n,
                           uint64_t *ids, int (*run)(void *arg), void *arg);
/* t (pieces of its own) is about to be written in place outside any session: it is marked written,
 * and when live views made of it on the controller read its pieces, it moves to new pieces that
 * share those bytes (the worker copies them before the write), the old ones left to the views.
 * 0, or the error naming op. */
int dtn_op_written(dt_tensor *t, const char *op);
/* The same move without the mark: a capture's input, whose id the replays rewrite, must not be the
 * id its views read (they keep the value it has now). */
int dtn_op_unshare(dt_tensor *t, const char *op);

#endif
