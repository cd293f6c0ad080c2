/* cuda_rope — the driver of the rotary embedding on the GPU (ops/op_rope.c's op; cpu_rope.c's
 * kernel on device memory, cuda_rope_kernels.cu): x (B, H, S, D) of a floating dtype read and
 * written as such, positions (B or 1, S) int64, inv_freq (D/2) float32, floats[0] = scaling. */
#include "cuda_kernels.h"
#include "cuda_ops.h"
#include "dt_dtype.h"

const char *cuda_k_rope(cuda_ctx *c, op_kernel *k)
{
    const op_local *x = &k->in[0], *pos = &k->in[1], *freq = &k->in[2];
    op_local *out = &k->out[0];
    const char *why = op_rope_local(k);
    if (why)
        return why;
    return cuda_check(cuda_rope(out->data, x->data, x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                                pos->data, pos->shape[0], freq->data, (float)k->attrs->floats[0], c->compute),
                      "rope kernel");
}
