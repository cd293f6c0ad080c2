/* cpu_random — Philox4x32-10 and the counter-based uniform and normal values of the random
 * factories. */
#include "cpu_kernels.h"

#include <assert.h>
#include <math.h>

#include "dt_dtype.h"

#define S_PHILOX_M0 0xD2511F53u
#define S_PHILOX_M1 0xCD9E8D57u
#define S_PHILOX_W0 0x9E3779B9u
#define S_PHILOX_W1 0xBB67AE85u
#define S_TWO_PI 6.283185307179586476925

void cpu_philox(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)S_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)S_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += S_PHILOX_W0;
        k1 += S_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static inline void s_store(void *dst, dt_dtype dtype, int64_t i, const uint32_t w[4], bool normal)
{
    if (normal) {
        double u1 = ((double)(w[0] >> 8) + 1.0) * 0x1p-24;
        double u2 = (double)(w[1] >> 8) * 0x1p-24;
        double z = sqrt(-2.0 * log(u1)) * cos(S_TWO_PI * u2);
        switch (dtype) {
        case DT_FLOAT32: ((float *)dst)[i] = (float)z; break;
        case DT_FLOAT16: ((uint16_t *)dst)[i] = cpu_f64_to_f16(z); break;
        default: ((uint16_t *)dst)[i] = cpu_f64_to_bf16(z); break;
        }
        return;
    }
    /* exact in every dtype: no rounding can reach 1 */
    switch (dtype) {
    case DT_FLOAT32: ((float *)dst)[i] = (float)(w[0] >> 8) * 0x1p-24f; break;
    case DT_FLOAT16: ((uint16_t *)dst)[i] = dt_f32_to_f16((float)(w[0] >> 21) * 0x1p-11f); break;
    default: ((uint16_t *)dst)[i] = dt_f32_to_bf16((float)(w[0] >> 24) * 0x1p-8f); break;
    }
}

void cpu_random(void *dst, dt_dtype dtype, int ndim, const int64_t *shape, const int64_t *offset,
                const int64_t *global_shape, uint64_t seed, uint64_t stream, bool normal)
{
    assert(dt_dtype_is_float(dtype) && ndim >= 0 && ndim <= DT_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0)
            return;
    int64_t gstride[DT_MAX_DIMS];
    uint64_t g = 0;
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        gstride[d] = s;
        g += (uint64_t)(offset[d] * s);
        s *= global_shape[d];
    }
    uint32_t counter[4] = {0, 0, (uint32_t)stream, (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t w[4];
    /* rows along the last dim are runs of consecutive g; an odometer moves g between rows */
    int inner = ndim - 1;
    int64_t row = ndim ? shape[inner] : 1;
    int64_t idx[DT_MAX_DIMS] = {0};
    int64_t i = 0;
    for (;;) {
        for (int64_t j = 0; j < row; j++, i++) {
            uint64_t gj = g + (uint64_t)j;
            counter[0] = (uint32_t)gj;
            counter[1] = (uint32_t)(gj >> 32);
            cpu_philox(counter, key, w);
            s_store(dst, dtype, i, w, normal);
        }
        int d = inner - 1;
        for (; d >= 0; d--) {
            g += (uint64_t)gstride[d];
            if (++idx[d] < shape[d])
                break;
            g -= (uint64_t)(shape[d] * gstride[d]);
            idx[d] = 0;
        }
        if (d < 0)
            break;
    }
}
