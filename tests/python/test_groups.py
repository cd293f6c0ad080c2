"""Actor groups side by side: meshes on disjoint devices progress independently (a long
computation on one never delays another's ops and fetches), futures of any group can be awaited
together with asyncio, and dtorch.wait waits on many as concurrent.futures.wait does."""
import asyncio
import threading
import time

import numpy as np
import pytest

import dtorch
from conftest import PATIENCE_S
from dtorch import Replicate, Shard


def _round_trip(mesh):
    """A 1-element op and its fetch on mesh."""
    x = dtorch.full((1,), 2.0, device_mesh=mesh, placements=[Replicate()])
    assert float((x * 3).future().result(timeout=PATIENCE_S)[0]) == 6.0


def _long_chain(mesh, seconds):
    """A matmul chain on mesh that keeps its devices busy about that long; its pending value."""
    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32) / 32
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
    w = dtorch.distribute_tensor(np.eye(1024, dtype=np.float32), mesh, [Replicate()] * mesh.ndim)
    x.numpy()
    t0 = time.perf_counter()
    y = x @ w
    y.numpy()
    per = max(time.perf_counter() - t0, 1e-3)
    for _ in range(int(seconds / per) + 1):
        y = y @ w
    return y.sum().future(), a.sum()


def test_a_long_computation_does_not_delay_another_group(mode):
    """While one group runs a chain of products that keeps it busy for seconds, another group's
    ops and fetches come back, one after another, before that chain ends: the controller never
    makes a group wait behind another's work. The chain's length is worked out from one product
    timed under the same load, so that it outlasts 20 round trips many times over on any machine."""
    busy, other = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    _round_trip(other)
    pending, want = _long_chain(busy, 3.0)
    for _ in range(20):
        _round_trip(other)
    assert not pending.done(), "the other group's ops waited for the long chain"
    np.testing.assert_allclose(float(pending.result(timeout=PATIENCE_S)), want, rtol=1e-3)


def test_asyncio_gathers_futures_of_several_groups(mode):
    meshes = [dtorch.DeviceMesh("cpu", [2 * g, 2 * g + 1]) for g in range(3)]
    arrays = [np.arange(6, dtype=np.float32) * (g + 1) for g in range(3)]

    async def main():
        futures = [(dtorch.distribute_tensor(a, m, [Shard(0)]) * 2).future() for a, m in zip(arrays, meshes)]
        return await asyncio.gather(*futures)

    for got, a in zip(asyncio.run(main()), arrays):
        np.testing.assert_array_equal(got, a * 2)


def test_wait_returns_when_asked(mode):
    busy, quick = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    slow, _ = _long_chain(busy, 1.0)
    fast = dtorch.arange(4, device_mesh=quick, placements=[Shard(0)]).sum().future()
    done, not_done = dtorch.wait([slow, fast], return_when=dtorch.FIRST_COMPLETED)
    assert done == {fast} and not_done == {slow}
    assert float(fast.result()) == 6.0
    early = dtorch.wait([slow], timeout=0.01)
    assert early.done == set() and early.not_done == {slow}
    done, not_done = dtorch.wait([slow, fast])
    assert done == {slow, fast} and not_done == set()


def test_wait_for_the_first_exception(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    ok = dtorch.arange(4, device_mesh=mesh, placements=[Shard(0)]).future()
    bad = dtorch.nn.functional.embedding(
        dtorch.full((2,), 99, dtype=dtorch.int64, device_mesh=mesh, placements=[Replicate()]),
        dtorch.ones((4, 3), device_mesh=mesh, placements=[Replicate()])).future()
    slow, _ = _long_chain(dtorch.DeviceMesh("cpu", [2, 3]), 1.0)
    done, not_done = dtorch.wait([ok, bad, slow], return_when=dtorch.FIRST_EXCEPTION)
    assert bad in done and slow in not_done
    assert "index out of range" in str(bad.exception())
    assert dtorch.wait([], timeout=0) == (set(), set())
    with pytest.raises(TypeError, match="x.future"):
        dtorch.wait([dtorch.arange(2, device_mesh=mesh, placements=[Shard(0)])])
    with pytest.raises(ValueError, match="return_when"):
        dtorch.wait([ok], return_when="SOMETIMES")


def test_done_callbacks_run_once_with_the_future(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    seen, fired = [], threading.Event()
    f = (dtorch.arange(4, device_mesh=mesh, placements=[Shard(0)]) + 1).future()
    f.add_done_callback(lambda fut: (seen.append(fut), fired.set()))
    assert fired.wait(30)
    np.testing.assert_array_equal(f.result(), np.arange(4) + 1)
    f.add_done_callback(seen.append)   # already settled: at once
    assert seen == [f, f]
    with pytest.raises(TypeError, match="callable"):
        f.add_done_callback(5)
