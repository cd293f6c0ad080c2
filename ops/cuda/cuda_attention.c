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
const char *cuda_k_sdpa(op_kernel *k)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    op_sdpa_dims d;
    if ((why = op_sdpa_layout(k, &d)))
        return why;
    const op_local *q = &k->in[0], *mask = k->nin == 4 ? &k->in[3] : NULL;
    op_local *o = &k->out[0];
    if (!dt_dtype_is_float(q->dtype) || k->in[1].dtype != q->dtype || k->in[2].dtype != q->dtype ||
        !dt_dtype_is_float(o->dtype) || (mask && mask->dtype != DT_BOOL && !dt_dtype_is_float(mask->dtype)))
        return "the local pieces of the operands do not fit together";
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

static bool s_shape_is(const op_local *t, int ndim, const int64_t *shape)
{
    return t->ndim == ndim && !memcmp(t->shape, shape, (size_t)ndim * sizeof *shape);
}

static bool s_index_fits(const op_local *idx, int64_t batch, int64_t n)
{
    return idx->dtype == DT_INT64 && idx->ndim == 2 && (idx->shape[0] == 1 || idx->shape[0] == batch) &&
           idx->shape[1] == n;
}

/* attention_block: (q, k, v, q_index, k_index[, o_acc, lse_acc]) -> (o, lse); ints [is_causal],
 * floats [scale] */
const char *cuda_k_attention_block(op_kernel *k)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    const op_local *q = &k->in[0], *kk = &k->in[1], *v = &k->in[2], *qi = &k->in[3], *ki = &k->in[4];
    bool acc = k->nin == 7;
    if ((k->nin != 5 && !acc) || k->nout != 2 || k->attrs->nints < 1 || k->attrs->nfloats < 1 || q->ndim != 4 ||
        kk->ndim != 4 || v->ndim != 4)
        return "the local pieces of the operands do not fit together";
    int64_t B = q->shape[0], Hq = q->shape[1], L = q->shape[2], H = kk->shape[1], S = kk->shape[2];
    int64_t o_shape[4] = {B, Hq, L, v->shape[3]};
    bool fits = kk->shape[0] == B && kk->shape[3] == q->shape[3] && v->shape[0] == B && v->shape[1] == H &&
                v->shape[2] == S && (H ? Hq % H == 0 : Hq == 0) && dt_dtype_is_float(q->dtype) &&
                kk->dtype == q->dtype && v->dtype == q->dtype && s_index_fits(qi, B, L) && s_index_fits(ki, B, S) &&
                s_shape_is(&k->out[0], 4, o_shape) && s_shape_is(&k->out[1], 3, o_shape) &&
                k->out[0].dtype == DT_FLOAT32 && k->out[1].dtype == DT_FLOAT32;
    if (acc)
        fits = fits && s_shape_is(&k->in[5], 4, o_shape) && s_shape_is(&k->in[6], 3, o_shape) &&
               k->in[5].dtype == DT_FLOAT32 && k->in[6].dtype == DT_FLOAT32;
    if (!fits)
        return "the local pieces of the operands do not fit together";
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
const char *cuda_k_attention_merge(op_kernel *k)
{
    const char *why;
    cuda_ctx *c = cuda_ctx_get(&why);
    if (!c)
        return why;
    const op_local *parts_o = &k->in[0], *parts_lse = &k->in[1];
    int64_t P = k->attrs->nints > 0 ? k->attrs->ints[0] : 0;
    if (k->nin != 2 || P < 1 || parts_o->ndim != 4 || parts_o->shape[0] % P != 0 || k->nout != 2 ||
        parts_o->dtype != DT_FLOAT32 || parts_lse->dtype != DT_FLOAT32)
        return "the local pieces of the operands do not fit together";
    int64_t o_shape[4] = {parts_o->shape[0] / P, parts_o->shape[1], parts_o->shape[2], parts_o->shape[3]};
    int64_t lse_parts_shape[3] = {parts_o->shape[0], parts_o->shape[1], parts_o->shape[2]};
    if (!s_shape_is(parts_lse, 3, lse_parts_shape) || !s_shape_is(&k->out[0], 4, o_shape) ||
        !s_shape_is(&k->out[1], 3, o_shape))
        return "the local pieces of the operands do not fit together";
    int64_t rows = o_shape[0] * o_shape[1] * o_shape[2];
    return cuda_check(cuda_attention_merge(k->out[0].data, k->out[1].data, parts_o->data, parts_lse->data, P, rows,
                                           o_shape[3], c->compute),
                      "attention merge kernel");
}
