/* Shared memory between worker processes: the bounds check of a region named by a message, and
 * the checks that mapping another process's segment makes. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dt_error.h"
#include "dt_shm.h"

/* ---- dt_shm_region_check ---------------------------------------------------------------------- */

Test(shm, region_check_bounds)
{
    const int64_t shape[2] = {3, 4}, strides[2] = {16, 4};
    /* the last byte is 2 * 16 + 3 * 4 + 4 = 48 bytes from the start */
    cr_expect_null(dt_shm_region_check(48, 0, 2, shape, strides, 4));
    cr_expect_null(dt_shm_region_check(100, 52, 2, shape, strides, 4));
    cr_expect_not_null(dt_shm_region_check(47, 0, 2, shape, strides, 4));
    cr_expect_not_null(dt_shm_region_check(100, 53, 2, shape, strides, 4));
    cr_expect_not_null(dt_shm_region_check(100, UINT64_MAX, 2, shape, strides, 4));
    /* a strided region: rows 64 bytes apart */
    const int64_t wide[2] = {64, 4};
    cr_expect_null(dt_shm_region_check(2 * 64 + 16, 0, 2, shape, wide, 4));
    cr_expect_not_null(dt_shm_region_check(2 * 64 + 15, 0, 2, shape, wide, 4));
    /* a scalar (no dims) is one element */
    cr_expect_null(dt_shm_region_check(8, 4, 0, NULL, NULL, 4));
    cr_expect_not_null(dt_shm_region_check(8, 5, 0, NULL, NULL, 4));
}

Test(shm, region_check_never_overflows)
{
    const int64_t huge[2] = {INT64_MAX, 2}, strides[2] = {8, 4};
    cr_expect_not_null(dt_shm_region_check(SIZE_MAX, 0, 2, huge, strides, 4));
    const int64_t shape[2] = {3, 2}, big[2] = {INT64_MAX, 4};
    cr_expect_not_null(dt_shm_region_check(SIZE_MAX, 0, 2, shape, big, 4));
    cr_expect_not_null(dt_shm_region_check(SIZE_MAX, UINT64_MAX - 4, 2, shape, strides, 4));
    const int64_t negative[2] = {-8, 4};
    cr_expect_not_null(dt_shm_region_check(1 << 20, 1 << 10, 2, shape, negative, 4));
    const int64_t minus[2] = {-1, 2};
    cr_expect_not_null(dt_shm_region_check(1 << 20, 0, 2, minus, strides, 4));
}

Test(shm, region_check_empty)
{
    const int64_t shape[2] = {0, 5}, strides[2] = {INT64_MAX, 4};
    cr_expect_null(dt_shm_region_check(16, 16, 2, shape, strides, 4)); /* no byte is read */
    cr_expect_not_null(dt_shm_region_check(16, 17, 2, shape, strides, 4));
}

/* ---- dt_shm_peer_map on this process's own segments ----------------------------------------- */

Test(shm, map_checks_what_it_opens)
{
    dt_shm_seg *seg = dt_shm_seg_new(300 << 10);
    cr_assert_not_null(seg, "%s", dt_last_error());
    cr_expect_geq(seg->size, 300u << 10);
    memset(seg->data, 0x5a, seg->size);
    dt_shm_peer *p = dt_shm_peer_new(getpid());
    const char *base;
    size_t size;
    cr_assert_null(dt_shm_peer_map(p, seg->fd, seg->serial, &base, &size));
    cr_expect_eq(size, seg->size);
    cr_expect_eq(base[0], 0x5a);
    cr_expect_eq(base[size - 1], 0x5a);
    const char *again;
    cr_expect_null(dt_shm_peer_map(p, seg->fd, seg->serial, &again, &size));
    cr_expect_eq(again, base, "a segment is mapped once");
    cr_expect_eq(dt_shm_peer_count(p), 1);

    const char *why = dt_shm_peer_map(p, seg->fd, seg->serial + 1000, &base, &size);
    cr_expect(why && strstr(why, "is not its shared segment"), "another serial: %s", why ? why : "(none)");
    int null_fd = open("/dev/null", O_RDONLY);
    why = dt_shm_peer_map(p, null_fd, seg->serial, &base, &size);
    cr_expect(why && strstr(why, "is not its shared segment"), "not a segment: %s", why ? why : "(none)");
    close(null_fd);
    why = dt_shm_peer_map(p, -1, seg->serial, &base, &size);
    cr_expect_not_null(why);
    why = dt_shm_peer_map(p, (int64_t)1 << 40, seg->serial, &base, &size);
    cr_expect_not_null(why);
    why = dt_shm_peer_map(p, 1000000, seg->serial, &base, &size); /* no such descriptor */
    cr_expect_not_null(why);

    /* named like a segment, but it could shrink under a reader (which would then fault) */
    char name[64];
    snprintf(name, sizeof name, "dtorch-%d-%" PRIu64, (int)getpid(), (uint64_t)999999999);
    int unsealed = memfd_create(name, MFD_CLOEXEC);
    cr_assert_geq(unsealed, 0);
    cr_assert_eq(ftruncate(unsealed, 1 << 16), 0);
    why = dt_shm_peer_map(p, unsealed, 999999999, &base, &size);
    cr_expect(why && strstr(why, "not sealed"), "unsealed: %s", why ? why : "(none)");
    close(unsealed);
    cr_expect_eq(dt_shm_peer_count(p), 1, "nothing refused was kept");
    dt_shm_peer_destroy(&p);
    cr_expect_null(p);
    dt_shm_seg_free(seg);
    dt_shm_trim();
}

Test(shm, closed_segments_are_unmapped_on_the_next_miss)
{
    dt_shm_seg *a = dt_shm_seg_new(64 << 10), *b = dt_shm_seg_new(128 << 10);
    cr_assert(a && b);
    dt_shm_peer *p = dt_shm_peer_new(getpid());
    const char *base;
    size_t size;
    cr_assert_null(dt_shm_peer_map(p, a->fd, a->serial, &base, &size));
    dt_shm_trim();
    dt_shm_seg_free(a);
    dt_shm_trim(); /* a is closed: its serial never comes again */
    cr_assert_null(dt_shm_peer_map(p, b->fd, b->serial, &base, &size));
    cr_expect_eq(dt_shm_peer_count(p), 1, "the closed segment's mapping went on the miss");
    dt_shm_peer_destroy(&p);
    dt_shm_seg_free(b);
    dt_shm_trim();
}

Test(shm, freed_segments_are_reused)
{
    dt_shm_trim();
    dt_shm_seg *a = dt_shm_seg_new(1 << 20);
    cr_assert_not_null(a);
    uint64_t serial = a->serial;
    dt_shm_seg_free(a);
    dt_shm_seg *b = dt_shm_seg_new((1 << 20) - 100);
    cr_assert_not_null(b);
    cr_expect_eq(b->serial, serial, "a kept segment of the same rounded size comes back");
    dt_shm_seg_free(b);
    dt_shm_trim();
}
