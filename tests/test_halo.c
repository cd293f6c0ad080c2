/* dtn_halo — the windows of rows dt_halo.c fetches for each device, against a brute-force count of
 * the rows each output row reads: a convolution's (kernel, stride, padding; uneven and empty output
 * shares) and nearest upsampling's by powers of two. */
#include <criterion/criterion.h>

#include "dtn_halo.h"

/* The conv window of output rows [o0, o1) by enumeration: every input row a tap of an output row
 * reads, split into rows inside the image and rows of padding above and below. */
static void s_conv_brute(int64_t in, int64_t k, int64_t s, int64_t p, int64_t o0, int64_t o1, dtn_halo_window *w)
{
    *w = (dtn_halo_window){0};
    if (o1 <= o0)
        return;
    w->used = 1;
    int64_t first = o0 * s - p, last = (o1 - 1) * s + k - 1 - p; /* the rows read, first and last */
    w->lo = in, w->hi = 0;
    for (int64_t r = first; r <= last; r++) {
        if (r < 0)
            w->pad_lo++;
        else if (r >= in)
            w->pad_hi++;
        else {
            w->lo = r < w->lo ? r : w->lo;
            w->hi = r + 1 > w->hi ? r + 1 : w->hi;
        }
    }
    if (w->hi <= w->lo) /* every row read is padding */
        w->lo = w->hi = first < 0 ? 0 : in;
}

Test(halo, conv_windows_match_enumeration)
{
    for (int64_t in = 1; in <= 12; in++)
        for (int64_t k = 1; k <= 4; k++)
            for (int64_t s = 1; s <= 3; s++)
                for (int64_t p = 0; p <= 2; p++) {
                    if (in + 2 * p < k)
                        continue;
                    int64_t out = (in + 2 * p - k) / s + 1;
                    for (int64_t o0 = 0; o0 <= out; o0++)
                        for (int64_t o1 = o0; o1 <= out; o1++) {
                            dtn_halo_window got, want;
                            dtn_halo_conv_window(in, k, s, p, o0, o1, &got);
                            s_conv_brute(in, k, s, p, o0, o1, &want);
                            cr_assert(got.used == want.used && got.lo == want.lo && got.hi == want.hi &&
                                          got.pad_lo == want.pad_lo && got.pad_hi == want.pad_hi,
                                      "in %lld k %lld s %lld p %lld rows [%lld, %lld): got [%lld, %lld) pads %lld %lld, "
                                      "want [%lld, %lld) pads %lld %lld", (long long)in, (long long)k, (long long)s,
                                      (long long)p, (long long)o0, (long long)o1, (long long)got.lo,
                                      (long long)got.hi, (long long)got.pad_lo, (long long)got.pad_hi,
                                      (long long)want.lo, (long long)want.hi, (long long)want.pad_lo,
                                      (long long)want.pad_hi);
                            /* the local convolution of the window gives exactly the device's rows */
                            if (got.used)
                                cr_assert_eq((got.hi - got.lo + got.pad_lo + got.pad_hi - k) / s + 1, o1 - o0);
                        }
                }
}

Test(halo, upsample_windows_hold_each_output_rows_source)
{
    for (int64_t scale = 1; scale <= 8; scale *= 2)
        for (int64_t in = 1; in <= 9; in++)
            for (int64_t o0 = 0; o0 <= in * scale; o0++)
                for (int64_t o1 = o0; o1 <= in * scale; o1++) {
                    dtn_halo_window w;
                    dtn_halo_upsample_window(scale, o0, o1, &w);
                    cr_assert_eq(w.used, o1 > o0);
                    if (!w.used)
                        continue;
                    /* the window is the source rows of [o0, o1), no more, and the device's rows
                     * start skip rows into the window's upsampling */
                    cr_assert_eq(w.lo, o0 / scale);
                    cr_assert_eq(w.hi, (o1 - 1) / scale + 1);
                    cr_assert(w.hi <= in);
                    for (int64_t o = o0; o < o1; o++)
                        cr_assert_eq((w.skip + (o - o0)) / scale + w.lo, o / scale);
                }
}
