/* cpu_rope — the rotary embedding kernel (ops/op_rope.c's op): one cos/sin table per (batch,
 * position), applied to every head there. */
#include "cpu_rope.h"

#include <math.h>
#include <stdlib.h>

#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "dt_dtype.h"
#include "dt_layout.h"

static inline void s_set(void *x, dt_dtype dtype, int64_t i, float v)
{
    if (dtype == DT_FLOAT32)
        ((float *)x)[i] = v;
    else
        ((uint16_t *)x)[i] = dtype == DT_BFLOAT16 ? dt_f32_to_bf16(v) : dt_f32_to_f16(v);
}

const char *cpu_rope(void *out, const void *x, dt_dtype dtype, int64_t B, int64_t H, int64_t S, int64_t D,
              const int64_t *positions, int64_t pos_batch, const float *inv_freq, float scaling)
{
    int64_t half = D / 2;
    float stack[2 * 256];
    float *table = half <= 256 ? stack : malloc((size_t)(2 * half) * sizeof *table);
    if (!table)
        return "out of memory on the device";
    float *cs = table, *sn = table + half;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t s = 0; s < S; s++) {
            float p = (float)positions[(pos_batch == 1 ? 0 : b) * S + s];
            for (int64_t i = 0; i < half; i++) {
                float angle = inv_freq[i] * p;
                cs[i] = cosf(angle) * scaling;
                sn[i] = sinf(angle) * scaling;
            }
            for (int64_t h = 0; h < H; h++) {
                int64_t row = ((b * H + h) * S + s) * D;
                if (dtype == DT_FLOAT32) {
                    const float *xr = (const float *)x + row;
                    float *o = (float *)out + row;
                    for (int64_t i = 0; i < half; i++) {
                        float x1 = xr[i], x2 = xr[i + half];
                        o[i] = x1 * cs[i] - x2 * sn[i];
                        o[i + half] = x2 * cs[i] + x1 * sn[i];
                    }
                    continue;
                }
                for (int64_t i = 0; i < half; i++) {
                    float x1 = cpu_widen(x, dtype, row + i), x2 = cpu_widen(x, dtype, row + i + half);
                    s_set(out, dtype, row + i, x1 * cs[i] - x2 * sn[i]);
                    s_set(out, dtype, row + i + half, x2 * cs[i] + x1 * sn[i]);
                }
            }
        }
    }
    if (table != stack)
        free(table);
    return NULL;
}

const char *cpu_k_rope(op_kernel *k)
{
    const op_local *x = &k->in[0], *pos = &k->in[1];
    const char *why = op_rope_local(k);
    if (why || dt_layout_numel(x->ndim, x->shape) == 0)
        return why;
    return cpu_rope(k->out[0].data, x->data, x->dtype, x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                    pos->data, pos->shape[0], k->in[2].data, (float)k->attrs->floats[0]);
}
