/* dtn_halo — the windows of rows dt_halo.c fetches for each device (pure arithmetic, tested on its
 * own in tests/test_ops.c). */
#ifndef DTN_HALO_H
#define DTN_HALO_H

#include <stdint.h>

/* A device's input window: rows [lo, hi) of the input along the split dim; pad_lo and pad_hi the
 * zero rows its convolution adds above and below them (the parts of its window outside the image);
 * skip the upsampled rows before its own (interpolate); used: whether it has output rows (else all 0,
 * and the caller clears it too where the output has no elements for another reason). */
typedef struct {
    int used;
    int64_t lo, hi;
    int64_t pad_lo, pad_hi;
    int64_t skip;
} dtn_halo_window;

/* The window of a convolution's output rows [o0, o1) over an input of `in` rows: kernel is the
 * dilated kernel's extent (dilation * (k - 1) + 1), pad the padding before the first row. */
void dtn_halo_conv_window(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t o0, int64_t o1,
                          dtn_halo_window *w);
/* The window of nearest upsampling by `scale` for the output rows [o0, o1). */
void dtn_halo_upsample_window(int64_t scale, int64_t o0, int64_t o1, dtn_halo_window *w);

#endif
