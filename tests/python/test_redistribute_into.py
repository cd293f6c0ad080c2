"""redistribute_many(..., out=): each tensor's value lands in an existing DTensor, in that tensor's
own mesh and placements, in place (RL weight sync into a rollout group's own weights).

Every result is compared exactly with the source value and with every device's expected piece
(test_redistribute's independent nested-chunk reference). What was issued before the write (a
future, an op, a view made on the controller) must see the old value; the destination's devices
must not hold a second copy of it; bad input is refused with the runtime still working after.
"""
import numpy as np
import pytest

import dtorch
from dtorch import Partial, Replicate, Shard
from test_redistribute import F32, I64, check, make_source


def _zeros_like_layout(src, mesh, placements):
    """A destination of src's shape and dtype on mesh, every element -7 (never a source value: the
    sources' values are integers in [-1000, 1000) or sums of a few in [-20, 20] times a scale)."""
    dtype = dtorch.int64 if src.dtype == I64 else dtorch.float32
    return dtorch.full(tuple(src.shape), -7777, device_mesh=mesh, placements=list(placements), dtype=dtype)


def _cases():
    m1, m2, m3, m4 = ([0], [0, 1], [1, 2, 3], [0, 1, 2, 3])
    return [
        # (source mesh ids or grid, source placements, destination grid, destination placements, shape)
        (m2, [Shard(0)], [4, 5, 6], [Shard(1)], (7, 5)),                       # across meshes, uneven
        (m2, [Shard(0)], m1, [Replicate()], (7, 5)),                           # into one device
        (m4, [Shard(0)], m3, [Shard(0)], (2, 3)),                              # empty shards on both sides
        (m2, [Shard(0)], m2, [Shard(0)], (7, 5)),                              # same layout: a copy
        (m2, [Shard(1)], m2, [Replicate()], (4, 9)),                           # all-gather into it
        (m3, [Replicate()], m3, [Shard(0)], (8, 2)),                           # local slices
        ([[0, 1], [2, 3]], [Shard(0), Shard(1)], [[0, 1], [2, 3]], [Shard(1), Shard(0)], (6, 10)),  # 2-D, two steps
        ([[0, 1], [2, 3]], [Replicate(), Shard(0)], [4, 5], [Shard(1)], (5, 6)),
        ([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [Shard(0), Replicate(), Shard(1)], [[0, 1], [2, 3]],
         [Replicate(), Shard(0)], (4, 6)),                                     # from a 3-D mesh
    ]


@pytest.mark.parametrize("dtype", [F32, I64])
def test_into_gives_what_a_fresh_redistribute_gives(mode, dtype):
    rng = np.random.default_rng(11)
    for src_ids, src_pl, dst_ids, dst_pl, shape in _cases():
        src_mesh, dst_mesh = dtorch.DeviceMesh("cpu", src_ids), dtorch.DeviceMesh("cpu", dst_ids)
        src = make_source(src_mesh, src_pl, shape, dtype, rng)
        dst = _zeros_like_layout(src, dst_mesh, dst_pl)
        got = dtorch.redistribute_many([src.tensor], out=[dst])
        assert len(got) == 1 and got[0] is dst
        check(src, dst, dst_mesh, dst_pl, f"{src_ids} {src_pl} -> {dst_ids} {dst_pl}")
        np.testing.assert_array_equal(src.tensor.numpy(), src.value)   # the source is left as it was


def test_partial_sources_are_reduced_into_it(mode):
    rng = np.random.default_rng(12)
    two, other = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3, 4])
    grid = dtorch.DeviceMesh("cpu", [[0, 1], [2, 3]])
    for op in ("sum", "avg", "max", "min"):
        for mesh, pl, dst_mesh, dst_pl in ((two, [Partial(op)], two, [Shard(0)]),
                                           (two, [Partial(op)], other, [Replicate()]),
                                           (grid, [Partial(op), Shard(1)], grid, [Shard(0), Replicate()]),
                                           (grid, [Shard(0), Partial(op)], other, [Shard(1)])):
            src = make_source(mesh, pl, (5, 4), I64, rng)
            dst = _zeros_like_layout(src, dst_mesh, dst_pl)
            dtorch.redistribute_many([src.tensor], out=[dst])
            check(src, dst, dst_mesh, dst_pl, f"Partial({op}) {pl} -> {dst_pl}")
    # an identical Partial on the same mesh is copied as it is
    src = make_source(two, [Partial("sum")], (3, 2), I64, rng)
    dst = dtorch.from_local([np.zeros((3, 2), np.int64)] * 2, two, [Partial("sum")])
    dtorch.redistribute_many([src.tensor], out=[dst])
    check(src, dst, two, [Partial("sum")], "Partial(sum) copied")


def test_many_at_once_each_into_its_own_layout(mode):
    rng = np.random.default_rng(13)
    a, b = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3, 4, 5])
    srcs = [make_source(a, [Shard(i % 2)], (6 + i, 3 + i), F32, rng) for i in range(5)]
    layouts = [(b, [Shard(0)]), (b, [Replicate()]), (a, [Replicate()]), (b, [Shard(1)]), (a, [Shard(1)])]
    dsts = [_zeros_like_layout(s, m, pl) for s, (m, pl) in zip(srcs, layouts)]
    got = dtorch.redistribute_many([s.tensor for s in srcs], out=dsts)
    assert all(g is d for g, d in zip(got, dsts))
    for s, d, (m, pl) in zip(srcs, dsts, layouts):
        check(s, d, m, pl)


def test_what_was_issued_before_sees_the_old_value(mode):
    a, b = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    for big in (False, True):   # regions lent by handle (>= 256 KiB) and sent as frames
        shape = (512, 256) if big else (4, 6)
        value = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        new = dtorch.distribute_tensor(value, a, [Shard(0)])
        old = np.full(shape, 5.0, np.float32)
        dst = dtorch.distribute_tensor(old, b, [Shard(1)])
        pending = dst.future()          # a fetch issued before
        plus = dst + 1                  # an op issued before
        row, t = dst[1], dst.T          # views made on the controller before
        ahead = dst.sum()               # a reduction issued before
        dtorch.redistribute_many([new], out=[dst])
        np.testing.assert_array_equal(pending.result(timeout=30), old)
        np.testing.assert_array_equal(plus.numpy(), old + 1)
        np.testing.assert_array_equal(row.numpy(), old[1])
        np.testing.assert_array_equal(t.numpy(), old.T)
        assert ahead.item() == old.sum()
        np.testing.assert_array_equal(dst.numpy(), value)
        np.testing.assert_array_equal((dst * 2).numpy(), value * 2)   # and what comes after, the new one
        np.testing.assert_array_equal(dst[1].numpy(), value[1])


def test_the_destination_holds_no_second_copy(mode):
    """A sync writes the destination's own pieces: its devices hold what they held before, and
    their process frees nothing (the memory it keeps for reuse stays as it was). A sync into fresh
    tensors that are then swapped in frees a whole set of old pieces into that memory."""
    a, b = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2])
    shape, nbytes = (1024, 1024), 4 * 1024 * 1024   # 4 MiB a tensor
    srcs = [dtorch.rand(shape, device_mesh=a, placements=[Shard(0)]) for _ in range(4)]
    dsts = [dtorch.zeros(shape, device_mesh=b, placements=[Replicate()]) for _ in range(4)]
    before = dtorch.memory_stats(b)[0]
    dtorch.redistribute_many(srcs, out=dsts)
    after = dtorch.memory_stats(b)[0]
    assert after["bytes_in_use"] == before["bytes_in_use"] >= 4 * nbytes, (before, after)
    assert after["pooled_bytes"] - before["pooled_bytes"] < nbytes, (before, after)
    for s, d in zip(srcs, dsts):
        np.testing.assert_array_equal(d.numpy(), s.numpy())
    # the control: the same sync into fresh tensors, swapped in for the old ones
    fresh = dtorch.redistribute_many(srcs, b, [Replicate()])
    dsts[:] = fresh
    del fresh, s, d
    swapped = dtorch.memory_stats(b)[0]
    assert swapped["bytes_in_use"] == before["bytes_in_use"], (before, swapped)
    assert swapped["pooled_bytes"] - after["pooled_bytes"] >= 4 * nbytes, (after, swapped)


def test_bad_input_is_refused_and_the_runtime_goes_on(mode):
    a, b = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    x = dtorch.distribute_tensor(np.arange(12, dtype=np.float32).reshape(3, 4), a, [Shard(0)])
    y = dtorch.zeros((3, 4), device_mesh=b, placements=[Shard(1)])
    with pytest.raises(ValueError, match="shape"):
        dtorch.redistribute_many([x], out=[dtorch.zeros((4, 3), device_mesh=b)])
    with pytest.raises(TypeError, match="int64"):
        dtorch.redistribute_many([x], out=[dtorch.zeros((3, 4), device_mesh=b, dtype=dtorch.int64)])
    with pytest.raises(ValueError, match="same pieces"):
        dtorch.redistribute_many([x], out=[x])
    with pytest.raises(ValueError, match="same pieces"):
        dtorch.redistribute_many([x.T, x * 2], out=[dtorch.zeros((4, 3), device_mesh=b), x])   # x.T reads x
    with pytest.raises(ValueError, match="same pieces"):
        dtorch.redistribute_many([x, x * 2], out=[y, y])                 # one destination twice
    with pytest.raises(ValueError, match="2 tensors but 1"):
        dtorch.redistribute_many([x, x], out=[y])
    with pytest.raises(ValueError, match="neither device_mesh nor placements"):
        dtorch.redistribute_many([x], b, [Shard(0)], out=[y])
    with pytest.raises(TypeError):
        dtorch.redistribute_many([x], out=[np.zeros((3, 4), np.float32)])
    with pytest.raises(RuntimeError, match="Partial"):                   # a Partial from elsewhere
        dtorch.redistribute_many([x], out=[dtorch.from_local([np.zeros((3, 4), np.float32)] * 2, b, [Partial()])])
    with pytest.raises(RuntimeError, match="capture"):
        dtorch.capture(lambda t: dtorch.redistribute_many([t], out=[y])[0] + 0, x)
    # nothing was written by any of them, and both meshes still work
    np.testing.assert_array_equal(y.numpy(), np.zeros((3, 4)))
    dtorch.redistribute_many([x], out=[y])
    np.testing.assert_array_equal(y.numpy(), np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal((x + x).numpy(), 2 * np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal((y + y).numpy(), 2 * np.arange(12).reshape(3, 4))
