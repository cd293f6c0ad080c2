/* dt_ring — ring attention (context parallelism): attention over a sequence split along one mesh
 * dim, the ring, without ever gathering it on a device.
 *
 * Prefill (query split along the ring like the keys): every device keeps its queries, and the
 * blocks of keys, values and their positions travel around the ring worker to worker. At step s
 * (0 .. n-1) the device at ring position r holds the block that started at position (r - s) mod n;
 * it sends that block on to r + 1, runs attention_block on it (merging into its accumulators)
 * while the block travels, then receives the next one from r - 1 and frees what it no longer
 * needs. Each device holds its own block, the one it works on and the one arriving: memory stays
 * O(local block). Empty blocks (uneven or empty torch.chunk pieces) are neither sent nor computed,
 * on both sides of the ring, since sender and receiver work out the same block shapes.
 *
 * Decode (query Replicate along the ring, e.g. one new token against a KV cache split by slots):
 * every device attends to its own block only, then the partial results (o, lse) — a few floats per
 * query row — go to every other device of the ring, which stacks them and merges them with
 * attention_merge: the output is Replicate along the ring. No key or value moves.
 *
 * On the other mesh dims each line of devices along the ring dim is a ring of its own; there the
 * inputs follow attention_block's own rule (ops/op_attention.c): all Replicate, or query, key and
 * value split alike on batch or heads. Visibility comes from the positions (q_index, k_index), so
 * any layout of the sequence is correct. Per step, every device's SENDs are queued before any
 * device's ASSEMBLE (dt_redistribute.c's rule): a device never waits for a block it has still to
 * send, and no cycle of waits can form.
 *
 * A joint block (joint_key, joint_value, joint_index: Replicate along the ring, e.g. the text tokens
 * of a diffusion transformer, whole on every device) is attended to once per query: in prefill every
 * device merges it into its accumulators before its own block; in decode the device at ring
 * position 0 does, and the merge across the ring counts it once. It never travels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "act_runtime.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dtn_op.h"
#include "dtn_tensor.h"
#include "mb_schema.h"
#include "op_registry.h"

enum { S_Q, S_K, S_V, S_QI, S_KI, S_NIN, S_JK = S_NIN, S_JV, S_JI, S_NALL };

static const char *const s_input_names[S_NALL] = {"query",     "key",       "value",       "query_index",
                                                  "key_index", "joint_key", "joint_value", "joint_index"};
static const int s_block_inputs[3] = {S_K, S_V, S_KI}; /* what travels around the ring */

typedef struct {
    op_def def;           /* attention_block's rules, under this function's name */
    op_call c;            /* the inputs as the rules see them; want[] what the ring needs */
    dt_mesh *mesh;
    int64_t n;            /* devices along the ring's mesh dim */
    int64_t stride;       /* flat mesh index distance between ring neighbours */
    bool decode;          /* query Replicate along the ring */
    bool joint;           /* a joint block is given */
    uint64_t ins[S_NALL]; /* the inputs' ids */
    dt_tensor *out;
} s_ring;

/* ---- where things are --------------------------------------------------------------------------- */

static int64_t s_position(const s_ring *g, int64_t d) { return d / g->stride % g->n; }

/* The flat mesh index of ring position p (taken mod n) on device d's ring. */
static int64_t s_at(const s_ring *g, int64_t d, int64_t p)
{
    return d + ((p % g->n + g->n) % g->n - s_position(g, d)) * g->stride;
}

static int64_t s_id(const s_ring *g, int64_t d) { return g->mesh->ids[d]; }

/* The local shape of input i on device d. */
static void s_local(const s_ring *g, int i, int64_t d, int64_t *shape)
{
    int64_t coord[DT_MAX_DIMS], offset[DT_MAX_DIMS];
    const op_arg *a = &g->c.in[i];
    dt_layout_coord(g->mesh->ndim, g->mesh->shape, d, coord);
    dt_layout_block(g->mesh->ndim, g->mesh->shape, coord, a->pl, a->ndim, a->shape, shape, offset);
}

/* The output's local shape (B, Hq, Lq, Dv) on device d; its first 3 dims are lse's. */
static void s_out_shape(const s_ring *g, int64_t d, int64_t *shape)
{
    s_local(g, S_Q, d, shape);
    shape[3] = g->c.in[S_V].shape[3];
}

/* The shapes of the block (key, value, key_index) that device d holds at step s: the one that
 * started at ring position r - s. Whether it has any key to attend to. */
static bool s_block(const s_ring *g, int64_t d, int64_t s, int64_t (*shapes)[DT_MAX_DIMS])
{
    int64_t from = s_at(g, d, s_position(g, d) - s);
    for (int t = 0; t < 3; t++)
        s_local(g, s_block_inputs[t], from, shapes[t]);
    return shapes[0][0] * shapes[0][1] * shapes[0][2] > 0;
}

/* ---- records ---------------------------------------------------------------------------------- */

static const int64_t s_origin[DT_MAX_DIMS];

/* Device `from` sends the whole of its piece id to device `to`; the transfer's id. */
static uint64_t s_send(int64_t from, uint64_t id, int64_t to, int ndim, const int64_t *shape)
{
    uint64_t transfer = act_runtime_new_transfer_id();
    mb_encode_send(act_runtime_record(from), id, transfer, to, ndim, s_origin, ndim, shape);
    return transfer;
}

/* Device receives a whole piece as id, sent by device `from` as transfer. */
static void s_receive(int64_t device, uint64_t id, dt_dtype dtype, int ndim, const int64_t *shape, int64_t from,
                      uint64_t transfer)
{
    mb_writer *pk = act_runtime_record(device);
    mb_encode_assemble(pk, id, dtype, ndim, shape, 0, false, 1);
    mb_encode_part(pk, MB_PART_COPY, DT_REDUCE_SUM, from, transfer, ndim, s_origin, ndim, s_origin, ndim, shape, 0);
}

static void s_free(int64_t device, uint64_t id) { mb_encode_free(act_runtime_record(device), id); }

/* n fresh tensor ids, one for each device's piece of a tensor the ring makes. */
static void s_new_ids(int n, uint64_t *ids)
{
    for (int i = 0; i < n; i++)
        ids[i] = act_runtime_new_tensor_id();
}

/* The accumulators o, lse of device d become the output: cast to q's dtype (o is the output
 * itself when that is float32). */
static void s_finish(const s_ring *g, int64_t d, uint64_t o, uint64_t lse)
{
    dt_dtype dtype = g->out->dtype;
    if (dtype != DT_FLOAT32) {
        int64_t shape[DT_MAX_DIMS];
        s_out_shape(g, d, shape);
        op_attrs to = {.nints = 1, .ints = {dtype}};
        dtn_out out = {g->out->id, dtype, 4, shape};
        dtn_op_compute(s_id(g, d), OP_ID_to, 1, &o, &to, 0, NULL, 1, &out);
        s_free(s_id(g, d), o);
    }
    s_free(s_id(g, d), lse);
}

/* The id the accumulated o gets: the output's own when no cast follows and it is the last. */
static uint64_t s_o_id(const s_ring *g, bool last, uint64_t fresh)
{
    return last && g->out->dtype == DT_FLOAT32 ? g->out->id : fresh;
}

/* Device d attends to the joint block: fresh accumulators o, lse (ids from `fresh`). */
static void s_attend_joint(const s_ring *g, int64_t d, const uint64_t *fresh, uint64_t *o, uint64_t *lse)
{
    int64_t shape[DT_MAX_DIMS];
    s_out_shape(g, d, shape);
    uint64_t ins[5] = {g->ins[S_Q], g->ins[S_JK], g->ins[S_JV], g->ins[S_QI], g->ins[S_JI]};
    dtn_out outs[2] = {{fresh[0], DT_FLOAT32, 4, shape}, {fresh[1], DT_FLOAT32, 3, shape}};
    dtn_op_compute(s_id(g, d), OP_ID_attention_block, 5, ins, &g->c.attrs, 0, NULL, 2, outs);
    *o = fresh[0];
    *lse = fresh[1];
}

/* ---- prefill: the blocks travel ------------------------------------------------------------------ */

typedef struct {
    uint64_t block[3];    /* the block it holds: key, value, key_index (the inputs at step 0) */
    uint64_t transfer[3]; /* ... and the transfers bringing the next one */
    uint64_t o, lse;      /* its accumulators (0 before the first block) */
    int64_t last;         /* the last step that computes */
} s_held;

/* Device d attends to the block it holds at step s, merging into its accumulators. */
static void s_accumulate(const s_ring *g, int64_t d, int64_t s, s_held *h, const uint64_t *fresh)
{
    int64_t shape[DT_MAX_DIMS];
    s_out_shape(g, d, shape);
    uint64_t ins[7] = {g->ins[S_Q], h->block[0], h->block[1], g->ins[S_QI], h->block[2], h->o, h->lse};
    dtn_out outs[2] = {{s_o_id(g, s == h->last, fresh[0]), DT_FLOAT32, 4, shape}, {fresh[1], DT_FLOAT32, 3, shape}};
    dtn_op_compute(s_id(g, d), OP_ID_attention_block, h->o ? 7 : 5, ins, &g->c.attrs, 0, NULL, 2, outs);
    if (h->o) {
        s_free(s_id(g, d), h->o);
        s_free(s_id(g, d), h->lse);
    }
    h->o = outs[0].id;
    h->lse = outs[1].id;
}

static int s_prefill(const s_ring *g)
{
    int64_t size = g->mesh->size, n = g->n, shapes[3][DT_MAX_DIMS];
    s_held *held = calloc((size_t)size, sizeof *held);
    if (!held)
        return dt_err(DT_ENOMEM, "ring_attention: out of memory");
    uint64_t joint[2];
    s_new_ids(2, joint);
    for (int64_t d = 0; d < size; d++) {
        for (int t = 0; t < 3; t++)
            held[d].block[t] = g->ins[s_block_inputs[t]];
        for (int64_t s = n - 1; s > 0 && !held[d].last; s--)
            if (s_block(g, d, s, shapes))
                held[d].last = s;
        if (g->joint)
            s_attend_joint(g, d, joint, &held[d].o, &held[d].lse);
    }
    for (int64_t s = 0; s < n; s++) {
        /* the block goes on to the next device before it is worked on, so the two overlap */
        for (int64_t d = 0; s + 1 < n && d < size; d++) {
            if (!s_block(g, d, s, shapes))
                continue;
            int64_t next = s_at(g, d, s_position(g, d) + 1);
            for (int t = 0; t < 3; t++)
                held[next].transfer[t] = s_send(s_id(g, d), held[d].block[t], s_id(g, next), t < 2 ? 4 : 2, shapes[t]);
        }
        uint64_t acc[2], next_block[3];
        s_new_ids(2, acc);
        s_new_ids(3, next_block);
        for (int64_t d = 0; d < size; d++) {
            s_held *h = &held[d];
            bool full = s_block(g, d, s, shapes);
            if (s == 0 || full)
                s_accumulate(g, d, s, h, acc);
            for (int t = 0; s > 0 && full && t < 3; t++)
                s_free(s_id(g, d), h->block[t]); /* a received block, sent on and worked on */
            if (s + 1 < n && s_block(g, d, s + 1, shapes)) {
                int64_t prev = s_at(g, d, s_position(g, d) - 1);
                for (int t = 0; t < 3; t++) {
                    const op_arg *a = &g->c.in[s_block_inputs[t]];
                    s_receive(s_id(g, d), next_block[t], a->dtype, a->ndim, shapes[t], s_id(g, prev), h->transfer[t]);
                    h->block[t] = next_block[t];
                }
            }
        }
    }
    for (int64_t d = 0; d < size; d++)
        s_finish(g, d, held[d].o, held[d].lse);
    free(held);
    return 0;
}

/* ---- decode: the partial results travel ------------------------------------------------------------ */

/* Which transfer, counted from the first of the exchange, carries part t (0: o, 1: lse) from device
 * `from` to ring position p: they were taken device by device, then position by position (skipping
 * the sender's own), then part by part. */
static uint64_t s_exchange_index(const s_ring *g, int64_t from, int64_t p, int t)
{
    int64_t r = s_position(g, from);
    return (uint64_t)((from * (g->n - 1) + (p < r ? p : p - 1)) * 2 + t);
}

static int s_decode(const s_ring *g)
{
    int64_t size = g->mesh->size, n = g->n, shape[DT_MAX_DIMS];
    uint64_t part[2], stacked[2], merged[2], joint[2];
    s_new_ids(2, part);
    s_new_ids(2, joint);
    for (int64_t d = 0; d < size; d++) {
        s_out_shape(g, d, shape);
        dtn_out outs[2] = {{s_o_id(g, n == 1, part[0]), DT_FLOAT32, 4, shape}, {part[1], DT_FLOAT32, 3, shape}};
        uint64_t ins[7];
        memcpy(ins, g->ins, S_NIN * sizeof ins[0]);
        bool with_joint = g->joint && s_position(g, d) == 0; /* counted once in the merge */
        if (with_joint)
            s_attend_joint(g, d, joint, &ins[5], &ins[6]);
        dtn_op_compute(s_id(g, d), OP_ID_attention_block, with_joint ? 7 : S_NIN, ins, &g->c.attrs, 0, NULL, 2, outs);
        if (with_joint) {
            s_free(s_id(g, d), joint[0]);
            s_free(s_id(g, d), joint[1]);
        }
    }
    if (n == 1) {
        for (int64_t d = 0; d < size; d++)
            s_finish(g, d, s_o_id(g, true, part[0]), part[1]);
        return 0;
    }
    uint64_t first = 0;
    for (int64_t d = 0; d < size; d++) {
        s_out_shape(g, d, shape);
        for (int64_t p = 0; p < n; p++)
            for (int t = 0; p != s_position(g, d) && t < 2; t++) {
                uint64_t transfer = s_send(s_id(g, d), part[t], s_id(g, s_at(g, d, p)), 4 - t, shape);
                first = first ? first : transfer;
            }
    }
    s_new_ids(2, stacked);
    s_new_ids(2, merged);
    for (int64_t d = 0; d < size; d++) {
        int64_t dev = s_id(g, d), r = s_position(g, d), batch, all[DT_MAX_DIMS], at[DT_MAX_DIMS] = {0};
        s_out_shape(g, d, shape);
        batch = shape[0];
        memcpy(all, shape, sizeof all);
        all[0] = n * batch;
        /* the partial results stacked along dim 0 in ring order, as attention_merge takes them */
        for (int t = 0; t < 2; t++) {
            mb_writer *pk = act_runtime_record(dev);
            mb_encode_assemble(pk, stacked[t], DT_FLOAT32, 4 - t, all, part[t], false, (uint32_t)n);
            for (int64_t p = 0; p < n; p++) {
                int64_t from = s_at(g, d, p);
                at[0] = p * batch;
                mb_encode_part(pk, MB_PART_COPY, DT_REDUCE_SUM, s_id(g, from),
                               p == r ? 0 : first + s_exchange_index(g, from, r, t), 4 - t, s_origin, 4 - t, at, 4 - t,
                               shape, 0);
            }
            s_free(dev, part[t]);
        }
        op_attrs parts = {.nints = 1, .ints = {n}};
        dtn_out outs[2] = {{s_o_id(g, true, merged[0]), DT_FLOAT32, 4, shape}, {merged[1], DT_FLOAT32, 3, shape}};
        dtn_op_compute(dev, OP_ID_attention_merge, 2, stacked, &parts, 0, NULL, 2, outs);
        s_free(dev, stacked[0]);
        s_free(dev, stacked[1]);
        s_finish(g, d, outs[0].id, merged[1]);
    }
    return 0;
}

/* ---- checking the call ------------------------------------------------------------------------------ */

/* Fills g from the inputs: shapes and dtypes by attention_block's own checks, placements by its
 * rule on the other mesh dims and the ring's on mesh_dim. */
/* Whether input i of call c has the placements c wants; if not, the error that says so. */
static int s_placed(const op_call *c, int i, const char *name, int mesh_dim)
{
    if (op_same_placements(c->in[i].pl, c->want[i], c->mesh_ndim))
        return 0;
    char have[256], want[256];
    dt_layout_format_placements(c->mesh_ndim, c->in[i].pl, have, sizeof have);
    dt_layout_format_placements(c->mesh_ndim, c->want[i], want, sizeof want);
    return dt_err(DT_EINVAL, "ring_attention: %s has placements %s but needs %s. Along the ring (mesh dim %d) "
                  "key and value are Shard(2) and key_index Shard(1), with query Shard(2) and query_index "
                  "Shard(1) (prefill) or both Replicate (decode), and a joint block Replicate; on every other mesh "
                  "dim query, key and value (and the joint block) are all Replicate, all Shard(0) (batch) or all "
                  "Shard(1) (heads, in whole groups of query heads), with the indices Shard(0) where query, key and "
                  "value are and their batch is above 1, otherwise Replicate", name, have, want, mesh_dim);
}

/* The joint block (in[S_JK..S_JI]) checked against the query as attention_block checks any block,
 * and Replicate along the ring. */
static int s_check_joint(s_ring *g, dt_tensor *const *in, int mesh_dim)
{
    int given = (in[S_JK] != NULL) + (in[S_JV] != NULL) + (in[S_JI] != NULL);
    if (given == 0)
        return 0;
    if (given != 3)
        return dt_err(DT_EINVAL, "ring_attention: give joint_key, joint_value and joint_index together");
    enum { J_Q, J_K, J_V, J_QI, J_KI, J_N };
    dt_tensor *joint[J_N] = {in[S_Q], in[S_JK], in[S_JV], in[S_QI], in[S_JI]};
    static const int names[J_N] = {S_Q, S_JK, S_JV, S_QI, S_JI};
    op_call c;
    int rc = dtn_op_call(&g->def, J_N, joint, &g->c.attrs, &c);
    if (rc != 0 || (rc = g->def.infer(&c)) != 0)
        return rc;
    if (c.in[J_K].shape[2] == 0)
        return dt_err(DT_EINVAL, "ring_attention: the joint block has no keys (give none instead)");
    /* the query's side as the ring has it; the block as the rule wants it for that query, whole
     * along the ring */
    memcpy(c.in[J_Q].pl, g->c.want[S_Q], sizeof c.in[J_Q].pl);
    memcpy(c.in[J_QI].pl, g->c.want[S_QI], sizeof c.in[J_QI].pl);
    if ((rc = g->def.shard(&c)) != 0)
        return rc;
    for (int t = J_K; t < J_N; t++) {
        if (t == J_QI)
            continue;
        c.want[t][mesh_dim] = dt_replicate();
        if ((rc = s_placed(&c, t, s_input_names[names[t]], mesh_dim)) != 0)
            return rc;
    }
    g->joint = true;
    for (int i = S_JK; i < S_NALL; i++)
        g->ins[i] = in[i]->id;
    return 0;
}

static int s_check(s_ring *g, dt_tensor *const *in, int mesh_dim, bool is_causal, bool has_scale, double scale)
{
    for (int i = 0; i < S_NIN; i++)
        if (!in[i])
            return dt_err(DT_EINVAL, "ring_attention: %s is missing", s_input_names[i]);
    g->def = *op_by_id(OP_ID_attention_block);
    g->def.name = "ring_attention";
    op_attrs attrs = {.nints = 1, .ints = {is_causal}, .nfloats = 1, .floats = {scale}};
    op_call *c = &g->c;
    int rc = dtn_op_call(&g->def, S_NIN, in, &attrs, c);
    if (rc != 0 || (rc = g->def.infer(c)) != 0)
        return rc;
    if (mesh_dim < 0 || mesh_dim >= c->mesh_ndim)
        return dt_err(DT_EINVAL, "ring_attention: mesh_dim %d is out of range for a mesh of %d dims", mesh_dim,
                      c->mesh_ndim);
    if (!has_scale)
        c->attrs.floats[0] = 1.0 / sqrt((double)(c->in[S_Q].shape[3] > 0 ? c->in[S_Q].shape[3] : 1));
    if ((rc = g->def.shard(c)) != 0)
        return rc;
    dt_placement q = c->in[S_Q].pl[mesh_dim];
    g->decode = q.kind == DT_REPLICATE;
    c->want[S_Q][mesh_dim] = g->decode ? dt_replicate() : dt_shard(2);
    c->want[S_QI][mesh_dim] = g->decode ? dt_replicate() : dt_shard(1);
    c->want[S_K][mesh_dim] = c->want[S_V][mesh_dim] = dt_shard(2);
    c->want[S_KI][mesh_dim] = dt_shard(1);
    for (int i = 0; i < S_NIN; i++)
        if ((rc = s_placed(c, i, s_input_names[i], mesh_dim)) != 0)
            return rc;
    g->mesh = in[S_Q]->mesh;
    g->n = g->mesh->shape[mesh_dim];
    g->stride = 1;
    for (int m = mesh_dim + 1; m < g->mesh->ndim; m++)
        g->stride *= g->mesh->shape[m];
    for (int i = 0; i < S_NIN; i++)
        g->ins[i] = in[i]->id;
    g->joint = false;
    return s_check_joint(g, in, mesh_dim);
}

static int s_plan(void *arg)
{
    const s_ring *g = arg;
    return g->decode ? s_decode(g) : s_prefill(g);
}

_Static_assert(S_NALL <= DTN_PLAN_MAX_INPUTS, "ring_attention's inputs fit a plan");

dt_tensor *dt_ring_attention(dt_tensor *q, dt_tensor *k, dt_tensor *v, dt_tensor *q_index, dt_tensor *k_index,
                             int mesh_dim, bool is_causal, bool has_scale, double scale)
{
    return dt_ring_attention_joint(q, k, v, q_index, k_index, NULL, NULL, NULL, mesh_dim, is_causal, has_scale, scale);
}

dt_tensor *dt_ring_attention_joint(dt_tensor *q, dt_tensor *k, dt_tensor *v, dt_tensor *q_index, dt_tensor *k_index,
                                   dt_tensor *joint_key, dt_tensor *joint_value, dt_tensor *joint_index, int mesh_dim,
                                   bool is_causal, bool has_scale, double scale)
{
    s_ring *g = malloc(sizeof *g);
    dt_tensor *out = g ? dtn_tensor_alloc() : NULL;
    if (!out) {
        free(g);
        dt_err(DT_ENOMEM, "ring_attention: out of memory");
        return NULL;
    }
    dt_tensor *in[S_NALL] = {q, k, v, q_index, k_index, joint_key, joint_value, joint_index};
    if (s_check(g, in, mesh_dim, is_causal, has_scale, scale) != 0) {
        dtn_tensor_free(out);
        free(g);
        return NULL;
    }
    const op_arg *o = &g->c.out[0];
    out->mesh = dt_mesh_ref(g->mesh);
    out->dtype = q->dtype;
    out->ndim = o->ndim;
    memcpy(out->shape, o->shape, sizeof out->shape);
    memcpy(out->placements, q->placements, sizeof out->placements);
    g->out = out;
    out = dtn_op_run_plan("ring_attention", g->mesh, out, in, S_NALL, g->ins, s_plan, g);
    free(g);
    return out;
}
