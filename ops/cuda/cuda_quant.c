/* cuda_quant — the CUDA kernels of linear_int8 and linear_int4 (ops/op_quant.c reads their pieces
 * for every backend; the device code is cuda_quant_kernels.cu). */
#include "cuda_ops.h"
#include "cuda_quant.h"
#include "op_quant.h"

static const char *s_linear(cuda_ctx *c, op_kernel *k)
{
    op_quant_dims d;
    const char *why = op_quant_layout(k, &d);
    if (why)
        return why;
    cuda_quant_args args = {.bits = d.bits, .M = d.M, .N = d.N, .K = d.K, .lda = d.K_x, .row_bytes = d.row_bytes,
                            .groups = d.groups};
    const float *x = (const float *)k->in[0].data + d.k0;
    return cuda_check(cuda_linear_quant(k->out[0].data, x, k->in[1].data, k->in[2].data,
                                        d.bias ? k->in[3].data : NULL, &args, c->compute),
                      k->def->name);
}

const char *cuda_k_linear_int8(cuda_ctx *c, op_kernel *k) { return s_linear(c, k); }
const char *cuda_k_linear_int4(cuda_ctx *c, op_kernel *k) { return s_linear(c, k); }
