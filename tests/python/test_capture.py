"""dtorch.capture: ops recorded once, kept on the devices, replayed by one record per device.
Every replay is checked against numpy computing the same function on the same inputs."""
import threading

import numpy as np
import pytest

import dtorch
from conftest import MESHES

R, S = dtorch.Replicate, dtorch.Shard


def _put(a, mesh, placements):
    return dtorch.distribute_tensor(np.ascontiguousarray(a), mesh, placements)


def _split(mesh, dim):
    """Shard(dim) on the first mesh dim, Replicate on the others."""
    return [S(dim)] + [R()] * (mesh.ndim - 1)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_replays_compute_the_function_on_new_inputs(mode, mesh_name):
    """A function with a sharded matmul (a Partial sum all-reduced), elementwise ops, a reduction
    and a redistribute, on inputs with uneven shards: each replay equals numpy on its inputs."""
    mesh = MESHES[mesh_name]()
    rng = np.random.default_rng(0)
    W = rng.standard_normal((5, 7)).astype(np.float32)
    w = _put(W, mesh, _split(mesh, 0))                                      # rows split: x @ w is Partial

    def f(x, b):
        h = (x @ w).redistribute(mesh, [R()] * mesh.ndim)                   # all-reduce of the partial sums
        y = (h * 2.0 + b).relu()
        return y.sum(-1), y.redistribute(mesh, _split(mesh, 0))

    def ref(X, B):
        Y = np.maximum(X @ W * 2.0 + B, 0)
        return Y.sum(-1), Y

    X0 = rng.standard_normal((3, 5)).astype(np.float32)
    B0 = rng.standard_normal((7,)).astype(np.float32)
    g = dtorch.capture(f, _put(X0, mesh, _split(mesh, 1)), _put(B0, mesh, [R()] * mesh.ndim))
    for _ in range(3):
        X = rng.standard_normal((3, 5)).astype(np.float32)
        B = rng.standard_normal((7,)).astype(np.float32)
        total, y = g(_put(X, mesh, _split(mesh, 1)), _put(B, mesh, [R()] * mesh.ndim))
        want_total, want_y = ref(X, B)
        np.testing.assert_allclose(total.numpy(), want_total, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-5, atol=1e-5)
        assert y.placements == tuple(_split(mesh, 0))
    assert g.num_captures == 1


def test_a_replay_is_one_submission_whatever_the_ops(mode):
    """The user thread sends one record per device for a replay: the runtime counts one submission
    for it, for 10 ops or 200."""
    mesh = MESHES["2"]()
    x = _put(np.ones(4, np.float32), mesh, [S(0)])
    for n in (10, 200):
        def chain(t, n=n):
            for _ in range(n):
                t = t + 1.0
            return t

        g = dtorch.capture(chain, x)
        assert g.num_records == 2 * (2 * n - 1)        # n adds, n - 1 frees of the intermediates, on 2 devices
        before = dtorch._C._ops_submitted()
        y = g(x)
        assert dtorch._C._ops_submitted() - before == 1
        np.testing.assert_array_equal(y.numpy(), np.full(4, 1.0 + n, np.float32))


def test_random_factories_draw_anew_like_the_ops_issued_again(mode):
    """With the same seed, replays give the numbers the uncaptured ops give, call after call; the
    capture itself draws nothing."""
    mesh = MESHES["2"]()

    def noisy(x):
        return x + dtorch.rand((6,), device_mesh=mesh, placements=[S(0)])

    x = _put(np.zeros(6, np.float32), mesh, [S(0)])
    dtorch.manual_seed(7)
    plain = [noisy(x).numpy() for _ in range(3)]
    dtorch.manual_seed(7)
    g = dtorch.capture(noisy, x)
    replayed = [g(x).numpy() for _ in range(3)]
    for a, b in zip(plain, replayed):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(replayed[0], replayed[1])


def test_constants_written_in_place_every_replay(mode):
    """A tensor the function writes in place without taking it (a cache) is the same tensor in
    every replay; the write position can come in as a tensor computed on the devices."""
    mesh = MESHES["2"]()
    acc = _put(np.zeros((2, 4), np.float32), mesh, [S(1)])

    def accumulate(v):
        acc[0] = acc[0] + v
        acc[1] = v * 2.0
        return acc[0] * 1.0

    g = dtorch.capture(accumulate, _put(np.zeros(4, np.float32), mesh, [S(0)]))
    total = np.zeros(4, np.float32)
    for k in range(4):
        v = np.arange(4, dtype=np.float32) + k
        total += v
        out = g(_put(v, mesh, [S(0)]))
        np.testing.assert_array_equal(out.numpy(), total)
        np.testing.assert_array_equal(acc.numpy(), np.stack([total, v * 2.0]))


def test_constants_outlive_their_python_objects_while_the_capture_lives(mode):
    mesh = MESHES["2"]()
    holder = {"w": _put(np.full((3,), 5.0, np.float32), mesh, [S(0)])}

    def scale(x):
        return x * holder["w"]

    g = dtorch.capture(scale, _put(np.ones(3, np.float32), mesh, [S(0)]))
    del holder["w"]   # the controller frees it; the devices keep it for the capture
    np.testing.assert_array_equal(g(_put(np.arange(3, dtype=np.float32), mesh, [S(0)])).numpy(),
                                  np.arange(3, dtype=np.float32) * 5.0)


def test_memory_does_not_grow_over_replays_and_goes_with_the_capture(mode):
    """Intermediates the capture made and kept (here one stored outside) are freed after each
    replay; dropping the capture frees its constants."""
    mesh = MESHES["2"]()
    stash = []

    def f(x):
        h = x * 3.0
        stash.append(h * 1.0)        # made inside, kept by nothing on the devices after a replay
        return h + 1.0

    x = _put(np.ones((256, 256), np.float32), mesh, [S(0)])
    w = _put(np.ones((256, 256), np.float32), mesh, [S(0)])
    g = dtorch.capture(lambda t: f(t) * w, x)
    base = [s["bytes_in_use"] for s in dtorch.device_stats(mesh)]
    for _ in range(5):
        y = g(x)
        np.testing.assert_array_equal(y.numpy()[:2, :2], np.full((2, 2), 4.0, np.float32))
        del y
    assert [s["bytes_in_use"] for s in dtorch.device_stats(mesh)] == base
    del w                              # now only the capture keeps it
    assert [s["bytes_in_use"] for s in dtorch.device_stats(mesh)] == base
    del g
    piece = 128 * 256 * 4
    assert [s["bytes_in_use"] for s in dtorch.device_stats(mesh)] == [b - piece for b in base]
    with pytest.raises(RuntimeError, match="made inside dtorch.capture"):
        stash[0].numpy()


def test_outputs_in_any_structure(mode):
    """Outputs: made inside, an input passed through, a constant, a non-tensor, in tuples, lists,
    dicts; the same tensor twice comes back as one."""
    mesh = MESHES["2"]()
    const = _put(np.full(2, 9.0, np.float32), mesh, [R()])

    def f(x, scale=2.0):
        y = x * scale
        return {"y": y, "again": [y, x], "const": const, "n": 3}

    x0 = _put(np.ones(2, np.float32), mesh, [R()])
    g = dtorch.capture(f)
    x = _put(np.array([1.0, 2.0], np.float32), mesh, [R()])
    out = g(x)
    np.testing.assert_array_equal(out["y"].numpy(), [2.0, 4.0])
    assert out["again"][0] is out["y"] and out["again"][1] is x and out["const"] is const and out["n"] == 3
    np.testing.assert_array_equal(g(x0, scale=3.0)["y"].numpy(), [3.0, 3.0])   # another value: another capture
    assert g.num_captures == 2


def test_a_new_shape_is_a_new_capture_and_a_direct_replay_checks(mode):
    mesh = MESHES["2"]()
    g = dtorch.capture(lambda t: t + 1.0)
    for n in (4, 6, 4):
        np.testing.assert_array_equal(g(_put(np.zeros(n, np.float32), mesh, [S(0)])).numpy(), np.ones(n))
    assert g.num_captures == 2
    entry = next(iter(g._captures.values()))
    with pytest.raises(ValueError, match=r"input 0 has shape \(5,\), it was captured with \(4,\)"):
        entry.replay([_put(np.zeros(5, np.float32), mesh, [S(0)])])
    with pytest.raises(ValueError, match="placements"):
        entry.replay([_put(np.zeros(4, np.float32), mesh, [R()])])


@pytest.mark.parametrize("what", ["fetch", "synchronize", "host data", "stats"])
def test_what_needs_the_controller_is_refused_and_the_runtime_goes_on(mode, what):
    mesh = MESHES["2"]()
    x = _put(np.ones(4, np.float32), mesh, [S(0)])

    def f(t):
        y = t + 1.0
        if what == "fetch":
            y.numpy()
        elif what == "synchronize":
            dtorch.synchronize()
        elif what == "host data":
            y = y + _put(np.ones(4, np.float32), mesh, [S(0)])
        else:
            dtorch.device_stats(mesh)
        return y

    with pytest.raises(RuntimeError, match="not allowed inside dtorch.capture"):
        dtorch.capture(f, x)
    np.testing.assert_array_equal((x * 2.0).numpy(), np.full(4, 2.0))   # nothing was left half-captured
    g = dtorch.capture(lambda t: t - 1.0, x)
    np.testing.assert_array_equal(g(x).numpy(), np.zeros(4))


def test_an_exception_in_the_function_ends_the_capture(mode):
    mesh = MESHES["2"]()
    x = _put(np.ones(4, np.float32), mesh, [S(0)])

    def bad(t):
        t + 1.0
        raise KeyError("boom")

    with pytest.raises(KeyError):
        dtorch.capture(bad, x)
    np.testing.assert_array_equal((x + 1.0).numpy(), np.full(4, 2.0))


def test_other_threads_wait_for_the_capture(mode):
    mesh = MESHES["2"]()
    x = _put(np.ones(4, np.float32), mesh, [S(0)])
    seen = []

    def f(t):
        th = threading.Thread(target=lambda: seen.append(_try(lambda: t * 2.0)))
        th.start()
        th.join()
        return t + 1.0

    g = dtorch.capture(f, x)
    assert "another thread is capturing" in seen[0]
    np.testing.assert_array_equal(g(x).numpy(), np.full(4, 2.0))


def _try(fn):
    try:
        fn()
        return "ran"
    except RuntimeError as e:
        return str(e)


def test_a_kernel_failure_in_a_replay_names_the_op_and_the_capture(mode):
    mesh = MESHES["2"]()
    table = _put(np.arange(12, dtype=np.float32).reshape(6, 2), mesh, [R()])

    def lookup(ids):
        h = ids * 1
        return dtorch.embedding(h, table) + 1.0

    g = dtorch.capture(lookup, _put(np.zeros(3, np.int64), mesh, [R()]))
    np.testing.assert_array_equal(g(_put(np.array([1, 5, 0]), mesh, [R()])).numpy(),
                                  np.arange(12, dtype=np.float32).reshape(6, 2)[[1, 5, 0]] + 1.0)
    bad = g(_put(np.array([1, 9, 0]), mesh, [R()]))
    with pytest.raises(RuntimeError, match=r"embedding failed on device \d \(op 2 of captured '.*lookup'\): index "
                                           r"out of range"):
        bad.numpy()
    np.testing.assert_array_equal(g(_put(np.array([2, 2, 2]), mesh, [R()])).numpy()[0], [5.0, 6.0])


def test_unhashable_arguments_and_nesting_are_refused(mode):
    mesh = MESHES["2"]()
    x = _put(np.ones(2, np.float32), mesh, [R()])
    with pytest.raises(TypeError, match="neither a DTensor nor hashable"):
        dtorch.capture(lambda t, a: t, x, np.ones(2))
    inner = dtorch.capture(lambda t: t + 1.0, x)
    with pytest.raises(RuntimeError, match="not allowed inside dtorch.capture"):
        dtorch.capture(lambda t: inner(t), x)
    np.testing.assert_array_equal(inner(x).numpy(), [2.0, 2.0])


def test_replays_after_shutdown_fail_clearly(mode):
    mesh = MESHES["2"]()
    x = _put(np.ones(2, np.float32), mesh, [R()])
    g = dtorch.capture(lambda t: t + 1.0, x)
    dtorch.shutdown()
    dtorch.init(workers=mode)
    y = _put(np.ones(2, np.float32), mesh, [R()])
    with pytest.raises(RuntimeError, match="before dtorch.shutdown"):
        g._captures[next(iter(g._captures))].replay([y])
