/* cpu_rope — rotary position embedding as HF Llama applies it (the rotate-half convention):
 * out = x * cos + rotate_half(x) * sin, where the angle of position p in frequency i is
 * p * inv_freq[i] (float32, as HF computes it) and rotate_half(x) = cat(-x[D/2:], x[:D/2]). */
#ifndef CPU_ROPE_H
#define CPU_ROPE_H

#include <stdint.h>

#include "dtorch.h"

/* x and out: (B, H, S, D) C-contiguous in dtype (float32, float16 or bfloat16; computed in float32,
 * rounded once); positions: (pos_batch, S) int64 with pos_batch 1 (shared by the batch) or B;
 * inv_freq: D/2 floats; cos and sin are multiplied by scaling (HF's attention_scaling). D even.
 * NULL, or why it could not run (its cos/sin table, pos_batch * S * D floats, did not fit in
 * memory). The calling thread keeps its last table (cpu_rope.c). */
const char *cpu_rope(void *out, const void *x, dt_dtype dtype, int64_t B, int64_t H, int64_t S, int64_t D,
                     const int64_t *positions, int64_t pos_batch, const float *inv_freq, float scaling);

#endif
