/* cuda_attention — the drivers of attention on the GPU: scaled_dot_product_attention (a row of the
 * products' family, ops/op_matmul.c, whose CPU kernel is in cpu_matmul.c), attention_block and
 * attention_merge (ops/op_attention.c, cpu_attention.c). One fused kernel per op, no scores in
 * memory (cuda_attention_kernels.cu); q, k, v and the mask are read in place in their dtypes.
 *
 * A block of the kernel holds a query row and the row's weighted values in shared memory, so heads
 * whose E + Ev floats do not fit in the GPU's shared memory per block are refused with the sizes
 * (a kernel that tiles the head dims is left for later). */
#include <stdio.h>
#include <string.h>

#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

static _Thread_local char s_why[200];

/* NULL when a block for heads of E and Ev elements fits in the device's shared memory. */
static const char *s_fits(cuda_ctx *c, const char *op, int64_t E, int64_t Ev)
{
    int most = 0;
    const char *why = cuda_check(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlock, c->ordinal),
                                 "shared memory size");
    if (why)
        return why;
    size_t need = cuda_attention_smem(E, Ev);
    if (need <= (size_t)most)
        return NULL;
    snprintf(s_why, sizeof s_why,
             "%s: heads of %lld (query, key) and %lld (value) elements need %zu bytes of shared memory per block, "
             "more than the GPU's %d (no CUDA kernel for such heads yet)",
             op, (long long)E, (long long)Ev, need, most);
    return s_why;
}

/* scaled_dot_product_attention: (q, k, v[, mask]); the dims as the CPU reads them (op_sdpa_layout) */
const char *cuda_k_sdpa(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    op_sdpa_dims d;
    if ((why = op_sdpa_layout(k, &d)))
        return why;
    const op_local *q = &k->in[0], *mask = k->nin == 4 ? &k->in[3] : NULL;
    op_local *o = &k->out[0];
    if (d.nbatch * d.L == 0 || d.Ev == 0)
        return NULL;
    if ((why = s_fits(c, k->def->name, d.E, d.Ev)))
        return why;
    cuda_sdpa_args a = {.q = q->data, .k = k->in[1].data, .v = k->in[2].data, .dtype = q->dtype, .out = o->data,
                        .out_dtype = o->dtype, .mask = mask ? mask->data : NULL,
                        .mask_dtype = mask ? mask->dtype : DT_BOOL, .nd = d.nd, .nbatch = d.nbatch, .L = d.L,
                        .S = d.S, .E = d.E, .Ev = d.Ev, .Hq = d.Hq, .H = d.H, .group = d.group, .row0 = d.row0,
                        .causal = d.causal, .scale = d.scale};
    for (int i = 0; i < d.nd; i++) {
        a.batch_shape[i] = q->shape[i];
        a.mask_stride[i] = d.mask_stride[i];
    }
    return cuda_check(cuda_sdpa(&a, c->compute), "attention kernel");
}

/* attention_block: (q, k, v, q_index, k_index[, o_acc, lse_acc]) -> (o, lse); ints [is_causal],
 * floats [scale] */
const char *cuda_k_attention_block(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2], *qi = &k->in[3], *ki = &k->in[4];
    bool acc = k->nin == 7;
    if (!op_attention_block_fits(k))
        return "the local pieces of the operands do not fit together";
    int64_t B = q->shape[0], Hq = q->shape[1], L = q->shape[2], H = kk->shape[1], S = kk->shape[2];
    if (B * Hq * L == 0)
        return NULL;
    if ((why = s_fits(c, k->def->name, q->shape[3], v->shape[3])))
        return why;
    cuda_block_args a = {.q = q->data, .k = kk->data, .v = v->data, .dtype = q->dtype, .q_pos = qi->data,
                         .k_pos = ki->data, .q_pos_batch = qi->shape[0], .k_pos_batch = ki->shape[0],
                         .o_acc = acc ? k->in[5].data : NULL, .lse_acc = acc ? k->in[6].data : NULL,
                         .o = k->out[0].data, .lse = k->out[1].data, .B = B, .Hq = Hq, .H = H, .L = L, .S = S,
                         .D = q->shape[3], .Dv = v->shape[3], .causal = k->attrs->ints[0] != 0,
                         .scale = (float)k->attrs->floats[0]};
    return cuda_check(cuda_attention_block(&a, c->compute), "attention kernel");
}

/* attention_merge: (o_parts (P*B, H, L, Dv), lse_parts (P*B, H, L)) -> (o, lse); ints [P] */
const char *cuda_k_attention_merge(cuda_ctx *c, op_kernel *k)
{
    const char *why;
    const op_local *parts_o = &k->in[0], *parts_lse = &k->in[1];
    int64_t P, rows, Dv;
    if ((why = op_attention_merge_layout(k, &P, &rows, &Dv)))
        return why;
    return cuda_check(cuda_attention_merge(k->out[0].data, k->out[1].data, parts_o->data, parts_lse->data, P, rows,
                                           Dv, c->compute),
                      "attention merge kernel");
}
