/* op_image_math — the image ops' per-element arithmetic that every backend computes the same way
 * (the CPU's kernels in ops/cpu/cpu_image.c, CUDA's in ops/cuda/cuda_image_kernels.cu): where a
 * resampled output position reads its input, and where a padded position does. */
#ifndef OP_IMAGE_MATH_H
#define OP_IMAGE_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define OP_IMAGE_FN static __host__ __device__ __forceinline__
#else
#define OP_IMAGE_FN static inline
#endif

/* interpolate: the scale of one axis of in -> out positions, as torch's upsample kernels compute it
 * in float32: mode 0 nearest, 1 linear, 2 nearest-exact; 1 / scale_factor when one was given (> 0),
 * else in / out; linear with align_corners (in - 1) / (out - 1). */
OP_IMAGE_FN float op_resample_scale(int64_t in, int64_t out, int mode, int align_corners, double scale_factor)
{
    if (mode == 1 && align_corners)
        return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    return scale_factor > 0 ? (float)(1.0 / scale_factor) : (float)in / (float)out;
}

/* ... and where output position o reads: i0 with weight 1 - l1 and i1 with weight l1 (nearest:
 * floor(o * scale), nearest-exact floor((o + 0.5) * scale); linear at half-pixel centres, negative
 * sources clamped to 0, unless align_corners). */
OP_IMAGE_FN void op_resample_source(int64_t o, int64_t in, int64_t out, int mode, int align_corners, float scale,
                                    int64_t *i0, int64_t *i1, float *l1)
{
    if (mode != 1) {
        float src = mode == 0 ? scale * (float)o : scale * ((float)o + 0.5f);
        int64_t i = (int64_t)floorf(src);
        *i0 = *i1 = i < in - 1 ? i : in - 1;
        *l1 = 0.0f;
        return;
    }
    if (in == out) {
        *i0 = *i1 = o;
        *l1 = 0.0f;
        return;
    }
    float src = align_corners ? scale * (float)o : scale * ((float)o + 0.5f) - 0.5f;
    if (!align_corners && src < 0)
        src = 0;
    int64_t h = (int64_t)floorf(src);
    h = h < in - 1 ? h : in - 1;
    float lam = src - (float)h;
    *i0 = h;
    *i1 = h + (h < in - 1);
    *l1 = lam < 0 ? 0.0f : lam > 1 ? 1.0f : lam;
}

/* pad: the source index of padded position i of a dim of n elements, or -1 (the fill value); mode
 * 0 constant, 1 reflect about the edge (excluding it), 2 replicate the edge. */
OP_IMAGE_FN int64_t op_pad_source(int64_t i, int64_t n, int mode)
{
    if (i >= 0 && i < n)
        return i;
    if (mode == 0 || n == 0)
        return -1;
    if (mode == 2)
        return i < 0 ? 0 : n - 1;
    return i < 0 ? -i : 2 * (n - 1) - i;
}

#endif
