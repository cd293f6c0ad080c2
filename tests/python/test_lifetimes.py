"""Lifetimes: dropped handles free device memory; tensors from before a shutdown are unusable."""
import gc
import os
import signal

import numpy as np
import pytest

import dtorch
from conftest import MESHES, worker_pids
from dtorch import Replicate, Shard


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_create_and_drop_20000(mode):
    mesh = MESHES["2"]()
    keep = dtorch.ones(8, device_mesh=mesh, placements=[Shard(0)])
    dtorch.synchronize()
    own_before = _rss_kib(os.getpid())
    # each tensor holds 64 KiB per device: kept alive, 20000 of them would be ~1.3 GB per device
    for i in range(20000):
        t = dtorch.full((2, 8192), i, device_mesh=mesh, placements=[Shard(0)], dtype=dtorch.int32)
        del t
    dtorch.synchronize()
    np.testing.assert_array_equal(keep.numpy(), np.ones(8, np.float32))
    last = dtorch.full((2, 8192), 7, device_mesh=mesh, placements=[Shard(0)], dtype=dtorch.int32)
    assert int(last.numpy().sum()) == 7 * 2 * 8192
    if mode == "process":
        pids = worker_pids()
        assert sorted(pids) == [0, 1]
        for dev, pid in pids.items():
            assert _rss_kib(pid) < 400 * 1024, (dev, _rss_kib(pid))
    else:  # thread workers live in this process
        assert _rss_kib(os.getpid()) - own_before < 400 * 1024


def test_worker_memory_bounded_across_rounds(process_mode):
    """Worker RSS after a second round of allocations is not much above the first round's."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])

    def round_():
        for _ in range(2000):
            dtorch.zeros(64, 1024, device_mesh=mesh, placements=[Shard(0)])
        dtorch.synchronize()
        return {d: _rss_kib(p) for d, p in worker_pids().items()}

    first = round_()
    second = round_()
    third = round_()
    assert set(first) == set(third) == {0, 1}, "both worker processes are measured"
    for d in first:
        # 2000 x 128 KiB per device = 250 MiB if nothing were freed
        assert third[d] - first[d] < 64 * 1024, (first, second, third)


def test_tensor_from_before_shutdown(mode):
    mesh = MESHES["2x2"]()
    x = dtorch.arange(8, device_mesh=mesh, placements=[Shard(0), Replicate()])
    np.testing.assert_array_equal(x.numpy(), np.arange(8))
    fut_done = x.future()
    fut_done.result()
    dtorch.shutdown()
    with pytest.raises(RuntimeError, match="shut"):
        x.numpy()
    dtorch.init(workers=mode)
    with pytest.raises(RuntimeError, match="shut|before"):
        x.numpy()
    with pytest.raises(RuntimeError, match="shut|before"):
        x.to_local()
    # metadata stays readable; a settled future keeps its value
    assert x.shape == (8,) and x.placements == (Shard(0), Replicate())
    np.testing.assert_array_equal(fut_done.result(), np.arange(8))
    # a new tensor on the same mesh object works
    y = dtorch.arange(8, device_mesh=mesh, placements=[Shard(0), Replicate()])
    np.testing.assert_array_equal(y.numpy(), np.arange(8))
    del x
    gc.collect()
    np.testing.assert_array_equal(y.numpy(), np.arange(8))


def test_pending_future_fails_at_shutdown(process_mode, sigcont_guard):
    """shutdown() with a fetch that cannot finish (its worker is stopped): the future fails, and
    shutdown does not hang on the silent worker."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.ones(4, device_mesh=mesh, placements=[Shard(0)])
    dtorch.synchronize()
    pid = worker_pids()[1]
    os.kill(pid, signal.SIGSTOP)
    sigcont_guard.append(pid)
    fut = x.future()
    assert not fut.done()
    dtorch.shutdown()
    assert fut.done()
    exc = fut.exception(timeout=0)
    assert isinstance(exc, RuntimeError) and "shut down before this value arrived" in str(exc), exc
    with pytest.raises(RuntimeError, match="shut down before this value arrived"):
        fut.result()
    dtorch.init(workers="process")
    np.testing.assert_array_equal(dtorch.ones(4, device_mesh=mesh, placements=[Shard(0)]).numpy(),
                                  np.ones(4, np.float32))


def test_restart_many_times(mode):
    for i in range(5):
        dtorch.shutdown()
        assert not dtorch.is_initialized()
        dtorch.init(workers=mode)
        assert dtorch.is_initialized()
        mesh = MESHES["3"]()
        np.testing.assert_array_equal(dtorch.full((4,), i, device_mesh=mesh, placements=[Shard(0)]).numpy(),
                                      np.full(4, i))
