"""TensorFuture: result / done / exception, asyncio, timeouts and Ctrl-C while a worker is stopped."""
import asyncio
import os
import signal
import threading
import time

import numpy as np
import pytest

import dtorch
from conftest import MESHES, PATIENCE_S, worker_pids
from dtorch import Partial, Replicate, Shard


def test_result_done_exception(mode):
    mesh = MESHES["3"]()
    full = np.arange(20, dtype=np.float32).reshape(5, 4) * 0.5
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    fut = x.future()
    assert isinstance(fut, dtorch.TensorFuture)
    np.testing.assert_array_equal(fut.result(), full)
    assert fut.done() is True
    assert fut.exception() is None
    np.testing.assert_array_equal(fut.result(timeout=5), full)  # again, from the settled future
    assert "done" in repr(fut)


def test_done_becomes_true(mode):
    mesh = MESHES["2x2"]()
    full = np.arange(300 * 301, dtype=np.float32).reshape(300, 301)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    fut = x.future()
    deadline = time.monotonic() + PATIENCE_S
    while not fut.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert fut.done()
    np.testing.assert_array_equal(fut.result(timeout=0), full)


def test_asyncio_await(mode):
    mesh = MESHES["4"]()
    a = dtorch.arange(10, device_mesh=mesh, placements=[Shard(0)])
    b = dtorch.full((3, 3), 2.5, device_mesh=mesh)
    c = dtorch.from_local([np.full(2, i, np.int32) for i in range(4)], mesh, [Partial("sum")])

    async def one():
        return await a.future()

    np.testing.assert_array_equal(asyncio.run(one()), np.arange(10))

    async def many():
        return await asyncio.gather(a.future(), b.future(), c.future(), a.future())

    ra, rb, rc, ra2 = asyncio.run(many())
    np.testing.assert_array_equal(ra, np.arange(10))
    np.testing.assert_array_equal(rb, np.full((3, 3), 2.5, np.float32))
    np.testing.assert_array_equal(rc, np.full(2, 6, np.int32))
    np.testing.assert_array_equal(ra2, ra)


def _stop_worker(device, stopped):
    pids = worker_pids()
    assert device in pids, f"no dtorch-worker child for device {device}: {pids}"
    os.kill(pids[device], signal.SIGSTOP)
    stopped.append(pids[device])
    return pids[device]


def test_timeout_then_usable(process_mode, sigcont_guard):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    full = np.arange(12, dtype=np.int64).reshape(6, 2)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    dtorch.synchronize()
    pid = _stop_worker(1, sigcont_guard)
    fut = x.future()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.2)
    assert time.monotonic() - t0 >= 0.15      # it waited its timeout (a loaded machine may wait longer)
    assert fut.done() is False
    with pytest.raises(TimeoutError):
        fut.exception(timeout=0.05)
    assert "pending" in repr(fut)
    os.kill(pid, signal.SIGCONT)
    np.testing.assert_array_equal(fut.result(timeout=30), full)
    assert fut.done() and fut.exception() is None
    np.testing.assert_array_equal(x.numpy(), full)


def test_await_woken_by_runtime(process_mode, sigcont_guard):
    """An await on a future that cannot finish yet completes once the worker resumes."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.arange(0, 8, device_mesh=mesh, placements=[Shard(0)])
    y = dtorch.ones(4, device_mesh=mesh, placements=[Replicate()])
    dtorch.synchronize()
    pid = _stop_worker(0, sigcont_guard)

    async def main():
        loop = asyncio.get_running_loop()
        f1, f2 = x.future(), y.future()
        assert not f1.done()
        loop.call_later(0.3, os.kill, pid, signal.SIGCONT)
        return await asyncio.wait_for(asyncio.gather(f1, f2), timeout=30)

    rx, ry = asyncio.run(main())
    np.testing.assert_array_equal(rx, np.arange(8))
    np.testing.assert_array_equal(ry, np.ones(4, np.float32))


def test_ctrl_c_interrupts_result(process_mode, sigcont_guard, ctrl_c):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    full = np.arange(8, dtype=np.float32)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    dtorch.synchronize()
    pid = _stop_worker(1, sigcont_guard)
    fut = x.future()
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            fut.result()   # with its worker stopped, nothing but the interrupt can end this wait
    finally:
        try:
            timer.join()
        except KeyboardInterrupt:  # only if result() returned before the signal came
            pytest.fail("result() returned while its worker was stopped")
    assert fut.done() is False
    os.kill(pid, signal.SIGCONT)
    np.testing.assert_array_equal(fut.result(timeout=30), full)
    # the runtime keeps working
    np.testing.assert_array_equal(dtorch.arange(5, device_mesh=mesh, placements=[Shard(0)]).numpy(), np.arange(5))
    dtorch.synchronize()


def test_many_futures_of_one_tensor(mode):
    mesh = MESHES["2x2"]()
    full = np.arange(25, dtype=np.float32).reshape(5, 5) - 12.5
    x = dtorch.distribute_tensor(full, mesh, [Shard(0), Shard(0)])
    futs = [x.future() for _ in range(20)]
    for f in futs:
        np.testing.assert_array_equal(f.result(), full)


def test_ctrl_c_interrupts_backpressure(process_mode, sigcont_guard, ctrl_c):
    """With a device stopped, ops pile up until the user's thread is held back; Ctrl-C ends that
    wait with KeyboardInterrupt, and the runtime works once the device runs again."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    a = dtorch.ones(1, device_mesh=mesh)
    dtorch.synchronize()
    _stop_worker(1, sigcont_guard)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in range(10_000_000):   # held back long before the last (the stopped device runs none)
                a = a + 1
    finally:
        timer.cancel()
    for pid in sigcont_guard:
        os.kill(pid, signal.SIGCONT)
    b = dtorch.ones(3, device_mesh=mesh) * 2
    np.testing.assert_array_equal(b.numpy(), np.full(3, 2.0, np.float32))
