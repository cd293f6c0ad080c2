"""Views made on the controller alone: a reshape, a slice, a permute or an expand sends nothing
(a contiguous run of every device's piece, or a strided view that reads every piece the same way);
ops, fetches and redistributes read the view's part of its base's pieces. Values are numpy's (views of numpy copies of the same arrays); writes in place keep DTorch's
value semantics: a view keeps the value its tensor had when it was made."""
import gc
import threading

import numpy as np
import pytest

import dtorch
from dtorch import Partial, Replicate, Shard

MESHES = {
    "1": [0],
    "2": [0, 1],
    "3": [0, 1, 2],
    "4": [0, 1, 2, 3],
    "2x2": [[0, 1], [2, 3]],
    "2x1x2": [[[0, 1]], [[2, 3]]],
}


def _submitted():
    return dtorch._C._ops_submitted()


def _in_use(mesh):
    return [s["bytes_in_use"] for s in dtorch.memory_stats(mesh)]


def test_a_view_sends_nothing_and_a_copy_does(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    a = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    r = dtorch.distribute_tensor(a, mesh, [Replicate()])
    before = _submitted()
    views = [x.reshape(2, 12), x.view(2, 3, 2, 2), x.flatten(1), x.unsqueeze(0), x.unsqueeze(1).squeeze(1),
             x[:, :, :], x[..., :], x.narrow(0, 0, 2), r[1], r.narrow(0, 1, 1), r[1, 1:], r.view(24)[4:9]]
    assert _submitted() == before
    wants = [a.reshape(2, 12), a.reshape(2, 3, 2, 2), a.reshape(2, 12), a[None], a, a, a, a, a[1], a[1:2],
             a[1, 1:], a.reshape(24)[4:9]]
    assert [tuple(v.shape) for v in views] == [w.shape for w in wants]
    strided = [r[:, 0], x[..., 1], x.transpose(1, 2), r.permute(2, 0, 1)[1], x[:, ::2], r[:, :1].expand(2, 5, 4),
               x.mT[:, 1:3], r[1].t()[2]]
    assert _submitted() == before                # strided views too: each piece is read the same way
    swants = [a[:, 0], a[..., 1], a.swapaxes(1, 2), a.transpose(2, 0, 1)[1], a[:, ::2],
              np.broadcast_to(a[:, :1], (2, 5, 4)), a.swapaxes(1, 2)[:, 1:3], a[1].T[2]]
    assert [tuple(v.shape) for v in strided] == [w.shape for w in swants]
    flat = x.transpose(1, 2).reshape(2, 12)      # a reshape that merges strided dims: a copy
    assert _submitted() == before + 1
    for v, w in zip(views + strided + [flat], wants + swants + [a.swapaxes(1, 2).reshape(2, 12)]):
        np.testing.assert_array_equal(v.numpy(), w)


def _cases():
    """(name, numpy array, placement on mesh dim 0, [(view of a DTensor, the same view of an array)]):
    uneven shards, empty ones (a size-1 dim over several devices), a sharded trailing dim, Replicate."""
    return [
        ("uneven rows", np.arange(7 * 6, dtype=np.float32).reshape(7, 6), Shard(0), [
            (lambda t: t.reshape(7, 2, 3), lambda a: a.reshape(7, 2, 3)),
            (lambda t: t.unsqueeze(1)[2:5, 0], lambda a: a[:, None][2:5, 0]),
            (lambda t: t.flatten(), lambda a: a.reshape(-1)),
        ]),
        ("one row, sharded", np.arange(1 * 5 * 4, dtype=np.int64).reshape(1, 5, 4), Shard(0), [
            (lambda t: t[:, 1:3], lambda a: a[:, 1:3]),
            (lambda t: t[:, 2], lambda a: a[:, 2]),
            (lambda t: t.narrow(1, 4, 1), lambda a: a[:, 4:5]),
        ]),
        ("trailing dim sharded", np.arange(3 * 10, dtype=np.int32).reshape(3, 10), Shard(1), [
            (lambda t: t.reshape(3, 10, 1), lambda a: a.reshape(3, 10, 1)),
            (lambda t: t.unsqueeze(0), lambda a: a[None]),
            (lambda t: t[1], lambda a: a[1]),           # a copy: each device's row is part of its piece
        ]),
        ("replicated", np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2), Replicate(), [
            (lambda t: t[2], lambda a: a[2]),
            (lambda t: t[1:3], lambda a: a[1:3]),
            (lambda t: t[3, 1:], lambda a: a[3, 1:]),
            (lambda t: t[1:2, 2], lambda a: a[1:2, 2]),
            (lambda t: t.view(-1)[5:17].reshape(3, 4)[1], lambda a: a.reshape(-1)[5:17].reshape(3, 4)[1]),
        ]),
    ]


def _check_layout(v, want, msg):
    """v is contiguous as numpy's view is (dims of one element do not count, in both); contiguous()
    is v itself when it is, else a copy that is; clone() is always a copy."""
    assert v.is_contiguous() == want.flags.c_contiguous, msg
    c, k = v.contiguous(), v.clone()
    assert (c is v) == want.flags.c_contiguous and c.is_contiguous() and k is not v, msg
    for copy in (c, k):
        assert copy.placements == v.placements, msg
        np.testing.assert_array_equal(copy.numpy(), want, err_msg=msg)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_views_read_the_right_part_of_every_piece(mode, mesh_name):
    mesh = dtorch.DeviceMesh("cpu", MESHES[mesh_name])
    for name, a, placement, takes in _cases():
        pl = [placement] + [Replicate()] * (mesh.ndim - 1)
        x = dtorch.distribute_tensor(a, mesh, pl)
        for take, ref in takes:
            v, want = take(x), ref(a)
            msg = f"{name} on {mesh_name}"
            np.testing.assert_array_equal(v.numpy(), want, err_msg=msg)
            # read by ops (the records say where the view lies), by a view of it, moved, twice in one op
            np.testing.assert_array_equal((v * 2 + 1).numpy(), want * 2 + 1, err_msg=msg)
            np.testing.assert_array_equal(v.sum().numpy(), want.sum(), err_msg=msg)
            np.testing.assert_array_equal(v.reshape(-1).numpy(), want.reshape(-1), err_msg=msg)
            moved = v.redistribute(mesh, [Replicate()] * mesh.ndim)
            np.testing.assert_array_equal(moved.numpy(), want, err_msg=msg)
            _check_layout(v, want, msg)
            np.testing.assert_array_equal((v + v).numpy(), want + want, err_msg=msg)


def _strided_cases():
    """(name, array, placements by mesh ndim, [(DTensor view, numpy view)]): strided views whose cut
    dims are not sharded, over uneven shards, empty ones (a dim of 1 or 2 over 3-4 devices), a
    sharded middle dim, two mesh dims sharding two tensor dims, views of views (the attention
    pattern: a contiguous reshape, then a transpose, then a slice), broadcasts."""
    a = np.arange(5 * 6 * 4, dtype=np.float32).reshape(5, 6, 4)
    b = np.arange(2 * 7 * 3, dtype=np.int64).reshape(2, 7, 3)
    takes_a = [
        (lambda t: t[:, 0], lambda n: n[:, 0]),
        (lambda t: t[..., 1], lambda n: n[..., 1]),
        (lambda t: t[:, 1:5:2], lambda n: n[:, 1:5:2]),
        (lambda t: t.transpose(1, 2), lambda n: n.swapaxes(1, 2)),
        (lambda t: t.permute(2, 0, 1)[3], lambda n: n.transpose(2, 0, 1)[3]),
        (lambda t: t.transpose(1, 2).transpose(1, 2), lambda n: n),
        (lambda t: t[:, 2:3].expand(5, 4, 4), lambda n: np.broadcast_to(n[:, 2:3], (5, 4, 4))),
        (lambda t: t.unsqueeze(0).expand(2, 5, 6, 4)[:, :, 1], lambda n: np.broadcast_to(n[None], (2, 5, 6, 4))[:, :, 1]),
        (lambda t: t.reshape(5, 2, 3, 4).transpose(1, 2)[:, 1:], lambda n: n.reshape(5, 2, 3, 4).swapaxes(1, 2)[:, 1:]),
        (lambda t: t[:, ::5], lambda n: n[:, ::5]),
        (lambda t: t[:, 0].unsqueeze(1).squeeze(1), lambda n: n[:, 0]),
    ]
    takes_b = [
        (lambda t: t[:, 2], lambda n: n[:, 2]),
        (lambda t: t.permute(2, 1, 0), lambda n: n.transpose(2, 1, 0)),
        (lambda t: t[..., 1:].mT, lambda n: n[..., 1:].swapaxes(1, 2)),
    ]
    return [
        ("rows", a, {1: [Shard(0)], 2: [Shard(0), Replicate()], 3: [Replicate(), Shard(0), Replicate()]}, takes_a),
        ("replicated", a, {1: [Replicate()], 2: [Replicate(), Replicate()], 3: [Replicate()] * 3}, takes_a),
        ("two dims", a, {1: [Shard(2)], 2: [Shard(0), Shard(2)], 3: [Shard(0), Replicate(), Shard(2)]},
         [tk for tk in takes_a if tk not in takes_a[1:2] + takes_a[4:5] + takes_a[6:9]]),
        ("empty pieces", b, {1: [Shard(0)], 2: [Shard(0), Shard(0)], 3: [Shard(0), Replicate(), Shard(0)]}, takes_b),
    ]


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_strided_views_send_nothing_and_read_the_right_elements(mode, mesh_name):
    mesh = dtorch.DeviceMesh("cpu", MESHES[mesh_name])
    for name, a, pls, takes in _strided_cases():
        x = dtorch.distribute_tensor(a, mesh, pls[mesh.ndim])
        for take, ref in takes:
            msg = f"{name} on {mesh_name}"
            before = _submitted()
            v, want = take(x), ref(a)
            assert _submitted() == before, msg
            assert tuple(v.shape) == want.shape, msg
            np.testing.assert_array_equal(v.numpy(), want, err_msg=msg)
            # read inline by ops (each device gathers its part), twice in one op, by a reshape that
            # copies, a reduction, and moved
            np.testing.assert_array_equal((v * 2 + 1).numpy(), want * 2 + 1, err_msg=msg)
            np.testing.assert_array_equal((v + v).numpy(), want + want, err_msg=msg)
            np.testing.assert_array_equal(v.reshape(-1).numpy(), want.reshape(-1), err_msg=msg)
            np.testing.assert_array_equal(v.sum().numpy(), want.sum(), err_msg=msg)
            moved = v.redistribute(mesh, [Replicate()] * mesh.ndim)
            np.testing.assert_array_equal(moved.numpy(), want, err_msg=msg)
            _check_layout(v, want, msg)


def _layout_chains():
    """(DTensor chain, numpy chain): view ops, one after another, whose contiguity numpy's views
    decide; under some placements each step is a copy, under others a view."""
    return [
        (lambda t: t.t(), lambda n: n.T),
        (lambda t: t[:, 2], lambda n: n[:, 2]),
        (lambda t: t[:, 2:3], lambda n: n[:, 2:3]),
        (lambda t: t[:, 1:3], lambda n: n[:, 1:3]),
        (lambda t: t[::2], lambda n: n[::2]),
        (lambda t: t[1:3], lambda n: n[1:3]),
        (lambda t: t[0], lambda n: n[0]),
        (lambda t: t.t()[0], lambda n: n.T[0]),
        (lambda t: t.t()[1:3], lambda n: n.T[1:3]),
        (lambda t: t.t().t(), lambda n: n),
        (lambda t: t.t()[:, 1:3].t(), lambda n: n.T[:, 1:3].T),
        (lambda t: t.t().unsqueeze(0), lambda n: n.T[None]),
        (lambda t: t[:1].expand(3, 6), lambda n: np.broadcast_to(n[:1], (3, 6))),
        (lambda t: t.t().reshape(24), lambda n: np.ascontiguousarray(n.T).reshape(24)),  # torch copies
    ]


@pytest.mark.parametrize("mesh_name", ["1", "2", "3", "4", "2x2"])
def test_view_ops_are_contiguous_as_torch_views_whatever_they_copy(mode, mesh_name):
    """is_contiguous() follows the view ops a tensor came from, as torch's does, whether the
    placements let each be a view made on the controller or make it a copy (a column of a tensor
    split on its columns is copied on each device; torch's x[:, 2] is not contiguous either): the
    reference is numpy's flags on the same views of an array. A strided view given pieces of its
    own by a fetch answers as before, and so do the views made of it."""
    mesh = dtorch.DeviceMesh("cpu", MESHES[mesh_name])
    a = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    for pl in (Replicate(), Shard(0), Shard(1)):
        pls = [pl] + [Shard(1) if pl == Shard(0) else Replicate()] * (mesh.ndim - 1)
        x = dtorch.distribute_tensor(a, mesh, pls)
        for take, ref in _layout_chains():
            v, want = take(x), ref(a)
            msg = f"{pls} on {mesh_name}: {tuple(v.shape)}"
            np.testing.assert_array_equal(v.numpy(), want, err_msg=msg)  # the fetch gives a view pieces
            assert v.is_contiguous() == want.flags.c_contiguous, msg
            for again, ref2 in ((lambda t: t[1:], lambda n: n[1:]), (lambda t: t.t(), lambda n: n.T)):
                if v.ndim == 2:
                    w, wn = again(v), ref2(want)
                    assert w.is_contiguous() == wn.flags.c_contiguous, msg
                    np.testing.assert_array_equal(w.numpy(), wn, err_msg=msg)
        x3 = dtorch.distribute_tensor(a.reshape(2, 3, 4), mesh, pls)
        for take, ref in ((lambda t: t.permute(2, 0, 1)[1], lambda n: n.transpose(2, 0, 1)[1]),
                          (lambda t: t.transpose(1, 2)[:, 1:], lambda n: n.swapaxes(1, 2)[:, 1:]),
                          (lambda t: t.transpose(0, 2).transpose(0, 2)[1], lambda n: n[1])):
            v, want = take(x3), ref(a.reshape(2, 3, 4))
            assert v.is_contiguous() == want.flags.c_contiguous, f"{pls} on {mesh_name}: {tuple(v.shape)}"
            np.testing.assert_array_equal(v.numpy(), want)


def test_strided_views_keep_their_value_and_feed_products(mode):
    """A strided view is a value: writes into its tensor after it was made, or into the view, leave
    the other as it was; a transposed weight goes into a product inline."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    a = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    col, xt = x[:, 1], x.t()
    x[:, 1:2] = -5.0
    want = a.copy()
    want[:, 1:2] = -5.0
    np.testing.assert_array_equal(x.numpy(), want)
    np.testing.assert_array_equal(col.numpy(), a[:, 1])
    np.testing.assert_array_equal(xt.numpy(), a.T)
    col[0] = 100.0                                # a write into the view: x keeps its value
    np.testing.assert_array_equal(col.numpy(), np.concatenate([[100.0], a[1:, 1]]))
    np.testing.assert_array_equal(x.numpy(), want)
    w = dtorch.distribute_tensor(np.arange(6 * 3, dtype=np.float32).reshape(6, 3) / 7, mesh, [Replicate()])
    np.testing.assert_allclose((xt.t() @ w).numpy(), a @ (np.arange(18, dtype=np.float32).reshape(6, 3) / 7),
                               rtol=1e-6)
    np.testing.assert_allclose(dtorch.nn.functional.linear(x, w.t()).numpy(), want @ (np.arange(18).reshape(6, 3) / 7),
                               rtol=1e-6)


def test_partial_views_sum_the_right_parts(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2])
    parts = [np.arange(24, dtype=np.float32).reshape(4, 6) * (r + 1) for r in range(3)]
    x = dtorch.from_local(parts, mesh, [Partial()])
    before = _submitted()
    v = x.reshape(4, 2, 3)[1:3]
    assert _submitted() == before
    want = sum(parts).reshape(4, 2, 3)[1:3]
    np.testing.assert_array_equal(v.full_tensor(), want)
    np.testing.assert_array_equal((v * 3).full_tensor(), want * 3)


def test_a_view_keeps_the_value_its_tensor_had(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    a = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    x = dtorch.distribute_tensor(a, mesh, [Replicate()])
    base = _in_use(mesh)
    before = _submitted()
    row, flat = x[1], x.reshape(24)
    assert _submitted() == before                 # views made on the controller alone
    x[:, 0:2] = -1.0                              # x moves to a copy: the views keep the old bytes
    want = a.copy()
    want[:, 0:2] = -1.0
    np.testing.assert_array_equal(x.numpy(), want)
    np.testing.assert_array_equal(row.numpy(), a[1])
    np.testing.assert_array_equal(flat.numpy(), a.reshape(24))
    assert [u - b for u, b in zip(_in_use(mesh), base)] == [4 * 6 * 4] * 2   # one copy while views live
    after = x[2]                                  # a view of the written tensor: its new value
    np.testing.assert_array_equal(after.numpy(), want[2])
    once = want.copy()
    x[:, 5:6] = 9.0                               # a second write: the old views read the old pieces
    want[:, 5:6] = 9.0
    np.testing.assert_array_equal(row.numpy(), a[1])
    np.testing.assert_array_equal(after.numpy(), once[2])
    np.testing.assert_array_equal(x.numpy(), want)
    row[0:2] = 100.0                              # a write into a view: its tensor keeps its value
    np.testing.assert_array_equal(row.numpy(), np.concatenate([[100.0, 100.0], a[1, 2:]]))
    np.testing.assert_array_equal(x.numpy(), want)
    del row, flat, after
    gc.collect()
    assert _in_use(mesh) == base                  # the old pieces went with the last view
    np.testing.assert_array_equal(x.numpy(), want)


def test_views_in_and_around_a_capture(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    a = np.arange(2 * 8, dtype=np.float32).reshape(2, 8)
    x = dtorch.distribute_tensor(a, mesh, [Replicate()])
    outside = x.reshape(4, 4)                     # made before the capture, read inside it

    def step(t):
        return (t.reshape(2, 2, 4)[1] + outside[0]).sum(0)

    g = dtorch.capture(step, x)
    for k in range(3):
        b = a + k
        y = dtorch.distribute_tensor(b, mesh, [Replicate()])
        got = g(y.reshape(2, 8))                  # a view as a replay's input
        np.testing.assert_array_equal(got.numpy(), (b.reshape(2, 2, 4)[1] + a.reshape(4, 4)[0]).sum(0))

    cache = dtorch.distribute_tensor(np.zeros((3, 4), np.float32), mesh, [Replicate()])

    def write(c, v):
        c[1:2] = v
        return c * 1.0

    w = dtorch.capture(write, cache, dtorch.ones((1, 4), device_mesh=mesh))
    other = dtorch.distribute_tensor(np.full((3, 4), 5.0, np.float32), mesh, [Replicate()])
    seen = other[1]                               # a view of what the replay writes in place
    out = w(other, dtorch.full((1, 4), 7.0, device_mesh=mesh))
    np.testing.assert_array_equal(seen.numpy(), np.full(4, 5.0, np.float32))
    np.testing.assert_array_equal(other.numpy(), np.array([[5] * 4, [7] * 4, [5] * 4], np.float32))
    np.testing.assert_array_equal(out.numpy(), other.numpy())

    # an input's views are unaffected (above); a tensor the capture writes without taking it as an
    # input cannot also be read by a live view made before (its replays would write under it)
    glob = dtorch.distribute_tensor(np.zeros((3, 4), np.float32), mesh, [Replicate()])
    held = glob[0]

    def write_glob(v):
        glob[1:2] = v
        return glob * 1.0

    with pytest.raises(RuntimeError, match="a view made of it before the capture is alive"):
        dtorch.capture(write_glob, dtorch.ones((1, 4), device_mesh=mesh))
    np.testing.assert_array_equal(held.numpy(), np.zeros(4, np.float32))
    del held
    gc.collect()
    wg = dtorch.capture(write_glob, dtorch.ones((1, 4), device_mesh=mesh))
    np.testing.assert_array_equal(wg(dtorch.full((1, 4), 3.0, device_mesh=mesh)).numpy()[1], np.full(4, 3.0))


# The views of one op on tensors alike (op, attributes, shape, dtype, placements, mesh shape) are
# planned once per thread and the plan kept; these check that a kept plan gives what planning it
# afresh gives (a new thread plans afresh), over tensors alike in all but one of those, and that
# what may change between two calls (a write, a capture, a shutdown) is still looked at.
_REPEATED = [
    ("T", lambda t: t.T, lambda n: n.T),
    ("[0]", lambda t: t[0], lambda n: n[0]),
    ("[:, 2]", lambda t: t[:, 2], lambda n: n[:, 2]),
    ("[-1:]", lambda t: t[-1:], lambda n: n[-1:]),
    ("reshape", lambda t: t.reshape(-1, 3), lambda n: n.reshape(-1, 3)),
    ("transpose[2:4]", lambda t: t.transpose(0, 1)[2:4], lambda n: n.swapaxes(0, 1)[2:4]),
    ("expand", lambda t: t.unsqueeze(0).expand(3, -1, -1), lambda n: np.broadcast_to(n[None], (3,) + n.shape)),
    ("flatten[1:5]", lambda t: t.flatten()[1:5], lambda n: n.reshape(-1)[1:5]),
    ("narrow", lambda t: t.narrow(1, 2, 3), lambda n: n[:, 2:5]),
]


def _survey(x):
    """Each view of _REPEATED of x: what it sent, its shape, contiguity and value."""
    seen = []
    for _, take, _ in _REPEATED:
        before = _submitted()
        v = take(x)
        sent = _submitted() - before
        seen.append((sent, tuple(v.shape), v.is_contiguous(), v.numpy()))
    return seen


def _survey_afresh(x):
    out = []
    th = threading.Thread(target=lambda: out.append(_survey(x)))
    th.start()
    th.join()
    return out[0]


def test_repeated_views_give_what_planning_them_afresh_gives(mode):
    layouts = [([0, 1], [[Shard(0)], [Shard(1)], [Replicate()]]),
               ([2, 3], [[Shard(0)], [Replicate()]]),           # the same shape of mesh, other devices
               ([0, 1, 2], [[Shard(0)], [Shard(1)], [Replicate()]]),
               ([[0, 1], [2, 3]], [[Shard(0), Shard(1)], [Replicate(), Shard(0)], [Shard(1), Replicate()]]),
               ([[[0, 1]], [[2, 3]]], [[Shard(0), Replicate(), Shard(1)]])]
    arrays = [np.arange(5 * 6, dtype=np.float32).reshape(5, 6),        # uneven over 2 and 3 devices
              np.arange(1 * 6, dtype=np.int64).reshape(1, 6) - 3,      # empty pieces where rows are sharded
              np.arange(4 * 6, dtype=np.float32).reshape(4, 6)[::-1].copy()]
    for ids, pls in layouts:
        mesh = dtorch.DeviceMesh("cpu", ids)
        for pl in pls:
            for a in arrays:
                for k in range(2):                    # the same layout with other values, twice
                    b = a + k
                    x = dtorch.distribute_tensor(b, mesh, pl)
                    kept, afresh = _survey(x), _survey_afresh(x)
                    for (name, _, ref), got, fresh in zip(_REPEATED, kept, afresh):
                        msg = f"{name} of {b.shape} {b.dtype} {pl} on {ids}"
                        want = ref(b)
                        assert got[:3] == fresh[:3], msg
                        assert got[1] == want.shape, msg
                        if got[0] == 0:               # a view: torch's contiguity (a copy is contiguous)
                            assert got[2] == want.flags.c_contiguous, msg
                        np.testing.assert_array_equal(got[3], want, err_msg=msg)
                        np.testing.assert_array_equal(fresh[3], want, err_msg=msg)


def test_a_kept_view_plan_still_asks_what_may_have_changed(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    a = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    old = x.T                                    # planned and kept
    x[:, 0:1] = 7.0                              # written in place: its views from now on are copies
    want = a.copy()
    want[:, 0:1] = 7.0
    before = _submitted()
    new = x.T
    assert _submitted() > before
    np.testing.assert_array_equal(new.numpy(), want.T)
    np.testing.assert_array_equal(old.numpy(), a.T)
    y = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    before = _submitted()
    yt = y.T                                     # a tensor alike, never written: a view again
    assert _submitted() == before
    np.testing.assert_array_equal(yt.numpy(), a.T)

    g = dtorch.capture(lambda t: t.T * 2.0, y)   # inside a capture the kept plan is not used
    for k in range(3):
        z = dtorch.distribute_tensor(a + k, mesh, [Shard(0)])
        np.testing.assert_array_equal(g(z).numpy(), (a + k).T * 2.0)

    dtorch.shutdown()                            # a tensor of a stopped runtime: the shutdown error
    with pytest.raises(RuntimeError, match="shutdown"):
        y.T
    dtorch.init(workers=mode)
    w = dtorch.distribute_tensor(a, dtorch.DeviceMesh("cpu", [0, 1]), [Shard(0)])
    np.testing.assert_array_equal(w.T.numpy(), a.T)


def test_views_from_several_threads_at_once(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2])
    arrays = [np.arange(7 * 6, dtype=np.float32).reshape(7, 6) * (i + 1) for i in range(4)]
    tensors = [dtorch.distribute_tensor(a, mesh, [Shard(i % 2)]) for i, a in enumerate(arrays)]
    wrong = []

    def work(i):
        for _ in range(30):
            for name, take, ref in _REPEATED:
                got, want = take(tensors[i]).numpy(), ref(arrays[i])
                if got.shape != want.shape or not np.array_equal(got, want):
                    wrong.append((i, name))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrong == []
