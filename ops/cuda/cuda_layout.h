/* cuda_layout — the index arithmetic of strided layouts, as device functions for the kernels: an
 * element's offset from its linear index in a block of dims. */
#ifndef CUDA_LAYOUT_H
#define CUDA_LAYOUT_H

#include "cuda_dtype.h"

/* The offset (in the strides' unit) of linear index i, row-major over nd dims of size[] laid out
 * by stride[]; nd 0 is the one element at offset 0. */
CUDA_HD int64_t cuda_offset(int64_t i, int nd, const int64_t *size, const int64_t *stride)
{
    if (nd == 1)
        return i * stride[0];
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (i % size[d]) * stride[d];
        i /= size[d];
    }
    return off;
}

#endif
