/* dtn_layout — placement checks and the local block of every mesh coordinate, against tables
 * computed by hand from torch.chunk semantics (DTENSOR-SEMANTICS 1.2 and 1.3); and the core's id
 * map. */
#include <criterion/criterion.h>

#include "dt_idmap.h"
#include "dt_layout.h"

/* Local size and offset of rank r when one mesh dim of k devices shards a dim of n. */
static void s_block_1d(int64_t n, int64_t k, int64_t r, int64_t *size, int64_t *offset)
{
    int64_t mesh_shape[1] = {k}, coord[1] = {r}, global[1] = {n};
    dt_placement pl[1] = {dt_shard(0)};
    dt_layout_block(1, mesh_shape, coord, pl, 1, global, size, offset);
}

/* ---- 1-D meshes ----------------------------------------------------------------------------- */

Test(layout_1d, chunk_table_over_4)
{
    /* the table of DTENSOR-SEMANTICS 1.2; offsets are r*ceil(n/4) clamped to n */
    static const struct {
        int64_t n;
        int64_t sizes[4];
        int64_t offsets[4];
    } rows[] = {
        {8, {2, 2, 2, 2}, {0, 2, 4, 6}},  {7, {2, 2, 2, 1}, {0, 2, 4, 6}},   {6, {2, 2, 2, 0}, {0, 2, 4, 6}},
        {5, {2, 2, 1, 0}, {0, 2, 4, 5}},  {9, {3, 3, 3, 0}, {0, 3, 6, 9}},   {10, {3, 3, 3, 1}, {0, 3, 6, 9}},
        {13, {4, 4, 4, 1}, {0, 4, 8, 12}}, {2, {1, 1, 0, 0}, {0, 1, 2, 2}},  {1, {1, 0, 0, 0}, {0, 1, 1, 1}},
        {0, {0, 0, 0, 0}, {0, 0, 0, 0}},  {31, {8, 8, 8, 7}, {0, 8, 16, 24}},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (int r = 0; r < 4; r++) {
            int64_t size, offset;
            s_block_1d(rows[i].n, 4, r, &size, &offset);
            cr_expect_eq(size, rows[i].sizes[r], "N=%lld rank %d: size %lld, expected %lld", (long long)rows[i].n, r,
                         (long long)size, (long long)rows[i].sizes[r]);
            cr_expect_eq(offset, rows[i].offsets[r], "N=%lld rank %d: offset %lld, expected %lld",
                         (long long)rows[i].n, r, (long long)offset, (long long)rows[i].offsets[r]);
        }
}

Test(layout_1d, chunk_32_over_3)
{
    static const int64_t sizes[3] = {11, 11, 10}, offsets[3] = {0, 11, 22};
    for (int r = 0; r < 3; r++) {
        int64_t size, offset;
        s_block_1d(32, 3, r, &size, &offset);
        cr_expect_eq(size, sizes[r], "rank %d", r);
        cr_expect_eq(offset, offsets[r], "rank %d", r);
    }
}

Test(layout_1d, shard_inner_dim_keeps_others)
{
    int64_t mesh_shape[1] = {3}, global[3] = {2, 7, 4}, local[3], offset[3];
    dt_placement pl[1] = {dt_shard(1)};
    static const int64_t sizes[3] = {3, 3, 1}, offsets[3] = {0, 3, 6};
    for (int64_t r = 0; r < 3; r++) {
        dt_layout_block(1, mesh_shape, &r, pl, 3, global, local, offset);
        cr_expect(local[0] == 2 && local[1] == sizes[r] && local[2] == 4, "rank %lld", (long long)r);
        cr_expect(offset[0] == 0 && offset[1] == offsets[r] && offset[2] == 0, "rank %lld", (long long)r);
    }
}

Test(layout_1d, replicate_and_partial_keep_full_shape)
{
    int64_t mesh_shape[1] = {4}, global[2] = {5, 3}, local[2], offset[2];
    dt_placement kinds[3] = {dt_replicate(), dt_partial(DT_REDUCE_SUM), dt_partial(DT_REDUCE_MAX)};
    for (int k = 0; k < 3; k++)
        for (int64_t r = 0; r < 4; r++) {
            dt_layout_block(1, mesh_shape, &r, &kinds[k], 2, global, local, offset);
            cr_expect(local[0] == 5 && local[1] == 3, "placement %d rank %lld", k, (long long)r);
            cr_expect(offset[0] == 0 && offset[1] == 0, "placement %d rank %lld", k, (long long)r);
        }
}

Test(layout_1d, scalar_tensor)
{
    /* a 0-d tensor only takes Replicate/Partial; its block is the (empty) shape */
    int64_t mesh_shape[1] = {2}, coord[1] = {1}, unused = -7;
    dt_placement pl[1] = {dt_replicate()};
    dt_layout_block(1, mesh_shape, coord, pl, 0, NULL, &unused, &unused);
    cr_expect_eq(unused, -7, "wrote a dim a 0-d tensor does not have");
}

/* ---- N-D meshes ----------------------------------------------------------------------------- */

Test(layout_nd, mesh_coord_row_major)
{
    int64_t shape2[2] = {2, 3}, coord[3];
    for (int64_t f = 0; f < 6; f++) {
        dt_layout_coord(2, shape2, f, coord);
        cr_expect(coord[0] == f / 3 && coord[1] == f % 3, "flat %lld", (long long)f);
    }
    int64_t shape3[3] = {2, 2, 2};
    for (int64_t f = 0; f < 8; f++) {
        dt_layout_coord(3, shape3, f, coord);
        cr_expect(coord[0] == (f >> 2) && coord[1] == ((f >> 1) & 1) && coord[2] == (f & 1), "flat %lld",
                  (long long)f);
    }
    int64_t shape1[1] = {5};
    dt_layout_coord(1, shape1, 4, coord);
    cr_expect_eq(coord[0], 4);
}

/* Checks every coordinate of a 2x2 mesh sharding a 1-D tensor of n twice on dim 0. */
static void s_check_s0s0(int64_t n, const int64_t starts[4], const int64_t sizes[4])
{
    int64_t mesh_shape[2] = {2, 2}, coord[2], local, offset;
    dt_placement pl[2] = {dt_shard(0), dt_shard(0)};
    for (int64_t f = 0; f < 4; f++) {
        dt_layout_coord(2, mesh_shape, f, coord);
        dt_layout_block(2, mesh_shape, coord, pl, 1, &n, &local, &offset);
        cr_expect_eq(local, sizes[f], "N=%lld (%lld,%lld): size %lld, expected %lld", (long long)n,
                     (long long)coord[0], (long long)coord[1], (long long)local, (long long)sizes[f]);
        cr_expect_eq(offset, starts[f], "N=%lld (%lld,%lld): offset %lld, expected %lld", (long long)n,
                     (long long)coord[0], (long long)coord[1], (long long)offset, (long long)starts[f]);
    }
}

Test(layout_nd, shard0_shard0_nested)
{
    /* N=5: 3|2 then 3->2|1, 2->1|1 — not the flat chunk over 4 (2,2,1,0) */
    s_check_s0s0(5, (int64_t[]){0, 2, 3, 4}, (int64_t[]){2, 1, 1, 1});
    /* N=3: 2|1 then 2->1|1, 1->1|0; the empty piece's offset is its parent's end */
    s_check_s0s0(3, (int64_t[]){0, 1, 2, 3}, (int64_t[]){1, 1, 1, 0});
    s_check_s0s0(8, (int64_t[]){0, 2, 4, 6}, (int64_t[]){2, 2, 2, 2});
    s_check_s0s0(0, (int64_t[]){0, 0, 0, 0}, (int64_t[]){0, 0, 0, 0});
}

Test(layout_nd, shard0_shard1_mixed)
{
    int64_t mesh_shape[2] = {2, 2}, global[2] = {31, 3}, coord[2], local[2], offset[2];
    dt_placement pl[2] = {dt_shard(0), dt_shard(1)};
    static const int64_t want[4][4] = {
        /* rows, cols, row offset, col offset */
        {16, 2, 0, 0}, {16, 1, 0, 2}, {15, 2, 16, 0}, {15, 1, 16, 2},
    };
    for (int64_t f = 0; f < 4; f++) {
        dt_layout_coord(2, mesh_shape, f, coord);
        dt_layout_block(2, mesh_shape, coord, pl, 2, global, local, offset);
        cr_expect(local[0] == want[f][0] && local[1] == want[f][1], "flat %lld: %lldx%lld", (long long)f,
                  (long long)local[0], (long long)local[1]);
        cr_expect(offset[0] == want[f][2] && offset[1] == want[f][3], "flat %lld: offset (%lld,%lld)",
                  (long long)f, (long long)offset[0], (long long)offset[1]);
    }
}

Test(layout_nd, shard_then_replicate_and_partial)
{
    /* Replicate/Partial mesh dims leave the piece an earlier Shard made untouched */
    int64_t mesh_shape[2] = {2, 2}, global[2] = {5, 4}, coord[2], local[2], offset[2];
    dt_placement pl[2] = {dt_shard(0), dt_partial(DT_REDUCE_SUM)};
    for (int64_t f = 0; f < 4; f++) {
        dt_layout_coord(2, mesh_shape, f, coord);
        dt_layout_block(2, mesh_shape, coord, pl, 2, global, local, offset);
        cr_expect(local[0] == (coord[0] ? 2 : 3) && local[1] == 4, "flat %lld", (long long)f);
        cr_expect(offset[0] == (coord[0] ? 3 : 0) && offset[1] == 0, "flat %lld", (long long)f);
    }
    pl[0] = dt_replicate();
    pl[1] = dt_shard(1);
    for (int64_t f = 0; f < 4; f++) {
        dt_layout_coord(2, mesh_shape, f, coord);
        dt_layout_block(2, mesh_shape, coord, pl, 2, global, local, offset);
        cr_expect(local[0] == 5 && local[1] == 2, "flat %lld", (long long)f);
        cr_expect(offset[0] == 0 && offset[1] == 2 * coord[1], "flat %lld", (long long)f);
    }
}

Test(layout_nd, mesh_2x2x2_shard0_three_times)
{
    /* N=7: 4|3; 4->2|2, 3->2|1; then 2->1|1 (x3) and 1->1|0 */
    int64_t mesh_shape[3] = {2, 2, 2}, n = 7, coord[3], local, offset;
    dt_placement pl[3] = {dt_shard(0), dt_shard(0), dt_shard(0)};
    static const int64_t sizes[8] = {1, 1, 1, 1, 1, 1, 1, 0}, starts[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int64_t f = 0; f < 8; f++) {
        dt_layout_coord(3, mesh_shape, f, coord);
        dt_layout_block(3, mesh_shape, coord, pl, 1, &n, &local, &offset);
        cr_expect_eq(local, sizes[f], "flat %lld: size %lld", (long long)f, (long long)local);
        cr_expect_eq(offset, starts[f], "flat %lld: offset %lld", (long long)f, (long long)offset);
    }
}

Test(layout_nd, mesh_2x2x2_mixed)
{
    /* mesh dim 0 splits the 3 columns 2|1, mesh dim 1 replicates, mesh dim 2 splits 5 rows 3|2 */
    int64_t mesh_shape[3] = {2, 2, 2}, global[2] = {5, 3}, coord[3], local[2], offset[2];
    dt_placement pl[3] = {dt_shard(1), dt_replicate(), dt_shard(0)};
    for (int64_t f = 0; f < 8; f++) {
        dt_layout_coord(3, mesh_shape, f, coord);
        dt_layout_block(3, mesh_shape, coord, pl, 2, global, local, offset);
        cr_expect(local[0] == (coord[2] ? 2 : 3) && local[1] == (coord[0] ? 1 : 2), "flat %lld: %lldx%lld",
                  (long long)f, (long long)local[0], (long long)local[1]);
        cr_expect(offset[0] == (coord[2] ? 3 : 0) && offset[1] == (coord[0] ? 2 : 0), "flat %lld", (long long)f);
    }
}

/* ---- placement checks ----------------------------------------------------------------------- */

Test(placements, normalised)
{
    dt_placement in[4] = {dt_shard(-1), {DT_SHARD, -2, 3}, {DT_REPLICATE, 5, 2}, {DT_PARTIAL, 7, DT_REDUCE_AVG}};
    dt_placement out[4];
    cr_assert_eq(dt_layout_check_placements("t", 4, in, 2, out), 0, "%s", dt_last_error());
    cr_expect(out[0].kind == DT_SHARD && out[0].dim == 1 && out[0].reduce_op == 0);
    cr_expect(out[1].kind == DT_SHARD && out[1].dim == 0 && out[1].reduce_op == 0);
    cr_expect(out[2].kind == DT_REPLICATE && out[2].dim == 0 && out[2].reduce_op == 0);
    cr_expect(out[3].kind == DT_PARTIAL && out[3].dim == 0 && out[3].reduce_op == DT_REDUCE_AVG);
}

Test(placements, null_means_replicate)
{
    dt_placement out[3] = {dt_shard(0), dt_shard(0), dt_shard(0)};
    cr_assert_eq(dt_layout_check_placements("t", 3, NULL, 1, out), 0);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(out[i].kind, DT_REPLICATE, "mesh dim %d", i);
}

Test(placements, shard_dim_out_of_range)
{
    dt_placement out[2];
    static const int32_t bad[] = {2, 3, -3, 100};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_placement in[2] = {dt_replicate(), dt_shard(bad[i])};
        cr_expect_eq(dt_layout_check_placements("t", 2, in, 2, out), DT_EINDEX, "Shard(%d)", bad[i]);
        cr_expect_eq(dt_last_error_code(), DT_EINDEX);
    }
    /* a 0-d tensor has no dim to shard */
    dt_placement s0 = dt_shard(0);
    cr_expect_eq(dt_layout_check_placements("t", 1, &s0, 0, out), DT_EINDEX);
}

Test(placements, bad_kind_or_reduce_op)
{
    dt_placement out[1];
    static const dt_placement bad[] = {
        {3, 0, 0}, {-1, 0, 0}, {DT_PARTIAL, 0, 4}, {DT_PARTIAL, 0, -1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(dt_layout_check_placements("t", 1, &bad[i], 2, out), DT_EINVAL, "case %zu", i);
        cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    }
}

/* ---- shape checks --------------------------------------------------------------------------- */

Test(shape, valid)
{
    int64_t shape[DT_MAX_DIMS] = {2, 0, 3, 1, 1, 1, 1, 1};
    cr_expect_eq(dt_layout_check_shape("t", 0, NULL), 0);
    cr_expect_eq(dt_layout_check_shape("t", 2, shape), 0);
    cr_expect_eq(dt_layout_check_shape("t", DT_MAX_DIMS, shape), 0);
    cr_expect_eq(dt_layout_numel(3, shape), 0);
    cr_expect_eq(dt_layout_numel(0, NULL), 1);
}

Test(shape, invalid)
{
    int64_t shape[DT_MAX_DIMS + 1] = {2, 3, 1, 1, 1, 1, 1, 1, 1};
    cr_expect_eq(dt_layout_check_shape("t", DT_MAX_DIMS + 1, shape), DT_EINVAL, "ndim > DT_MAX_DIMS");
    cr_expect_eq(dt_layout_check_shape("t", -1, shape), DT_EINVAL, "negative ndim");
    int64_t negative[2] = {3, -1};
    cr_expect_eq(dt_layout_check_shape("t", 2, negative), DT_EINVAL, "negative size");
    cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    /* numel past 2^48 would overflow byte counts further on */
    int64_t huge[2] = {INT64_C(1) << 30, INT64_C(1) << 30};
    cr_expect_eq(dt_layout_check_shape("t", 2, huge), DT_EINVAL, "too many elements");
    /* the bound is inclusive: 2^48 elements pass, one row more does not */
    int64_t at_bound[3] = {INT64_C(1) << 16, INT64_C(1) << 16, INT64_C(1) << 16};
    cr_expect_eq(dt_layout_check_shape("t", 3, at_bound), 0, "exactly 2^48 elements");
    int64_t past_bound[3] = {(INT64_C(1) << 16) + 1, INT64_C(1) << 16, INT64_C(1) << 16};
    cr_expect_eq(dt_layout_check_shape("t", 3, past_bound), DT_EINVAL, "2^48 + 2^32 elements");
    /* a product past int64 itself, and one size past the bound alone */
    int64_t wraps[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    cr_expect_eq(dt_layout_check_shape("t", 2, wraps), DT_EINVAL, "2^80 elements");
    int64_t one_huge[1] = {INT64_MAX};
    cr_expect_eq(dt_layout_check_shape("t", 1, one_huge), DT_EINVAL, "INT64_MAX elements");
    /* an empty dim makes any later size an empty tensor, as in torch */
    int64_t empty_then_huge[2] = {0, INT64_C(1) << 60};
    cr_expect_eq(dt_layout_check_shape("t", 2, empty_then_huge), 0, "0 x 2^60 elements");
}

/* A region named by a message: offsets and sizes of any value, near INT64_MAX included, where
 * `offset + size <= piece` would wrap negative and pass. */
Test(shape, region_inside)
{
    const int64_t piece[2] = {2, 3};
    cr_expect(dt_layout_region_inside(2, piece, (const int64_t[]){0, 0}, piece), "the whole piece");
    cr_expect(dt_layout_region_inside(2, piece, (const int64_t[]){1, 1}, (const int64_t[]){1, 2}), "its corner");
    cr_expect(dt_layout_region_inside(2, piece, (const int64_t[]){2, 3}, (const int64_t[]){0, 0}),
              "an empty region at the far end");
    cr_expect_not(dt_layout_region_inside(2, piece, (const int64_t[]){1, 2}, (const int64_t[]){1, 2}), "one past");
    cr_expect_not(dt_layout_region_inside(2, piece, (const int64_t[]){-1, 0}, (const int64_t[]){1, 3}), "before");
    cr_expect_not(dt_layout_region_inside(2, piece, (const int64_t[]){3, 0}, (const int64_t[]){0, 3}),
                  "an empty region past the end");
    cr_expect_not(dt_layout_region_inside(2, piece, (const int64_t[]){0, INT64_MAX - 1}, (const int64_t[]){2, 2}),
                  "INT64_MAX - 1 + 2 wraps");
    cr_expect_not(dt_layout_region_inside(2, piece, (const int64_t[]){INT64_MAX, INT64_MAX}, (const int64_t[]){1, 1}),
                  "INT64_MAX + 1 wraps");
    cr_expect_not(dt_layout_region_inside(2, piece, (const int64_t[]){INT64_MIN, 0}, (const int64_t[]){INT64_MAX, 3}),
                  "INT64_MIN + INT64_MAX is -1");
    cr_expect_not(dt_layout_region_inside(2, piece, (const int64_t[]){0, 0}, (const int64_t[]){-1, 3}), "a negative size");
    cr_expect(dt_layout_region_inside(0, NULL, NULL, NULL), "a scalar's one element");
}

/* ---- the id map (core/dt_idmap.c): ids come from sockets, so any value must be safe ---------- */

Test(idmap, marker_ids_are_refused_and_found_nowhere)
{
    dt_idmap m;
    dt_idmap_init(&m);
    int a = 1, b = 2;
    cr_assert_eq(dt_idmap_put(&m, 5, &a), 0);
    cr_expect_eq(dt_idmap_put(&m, 0, &b), DT_EINVAL);
    cr_expect_eq(dt_idmap_put(&m, UINT64_MAX, &b), DT_EINVAL);
    cr_expect_null(dt_idmap_get(&m, 0));
    cr_expect_null(dt_idmap_get(&m, UINT64_MAX));
    cr_expect_null(dt_idmap_take(&m, 0), "an empty slot is not an entry");
    cr_expect_null(dt_idmap_take(&m, UINT64_MAX), "a tombstone is not an entry");
    cr_expect_eq(m.count, 1);
    cr_expect_eq(dt_idmap_take(&m, 5), &a);
    cr_expect_null(dt_idmap_take(&m, UINT64_MAX), "nor the tombstone 5 left");
    cr_expect_eq(m.count, 0);
    /* churn: many ids made and freed keep the map small and every id findable */
    for (uint64_t id = 1; id <= 10000; id++) {
        cr_assert_eq(dt_idmap_put(&m, id, &a), 0);
        if (id > 3)
            cr_assert_eq(dt_idmap_take(&m, id - 3), &a);
    }
    cr_expect_eq(m.count, 3);
    cr_expect(m.cap <= 64, "tombstones are dropped, not kept: cap %zu", m.cap);
    for (uint64_t id = 9998; id <= 10000; id++)
        cr_expect_eq(dt_idmap_get(&m, id), &a);
    dt_idmap_destroy(&m);
}
