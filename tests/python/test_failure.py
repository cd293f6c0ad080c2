"""A dead worker: its futures fail quickly and name the device; other meshes keep working."""
import asyncio
import os
import signal
import stat
import time

import numpy as np
import pytest

import dtorch
from conftest import PATIENCE_S, worker_pids
from dtorch import Replicate, Shard


def _kill(device):
    pids = worker_pids()
    assert device in pids, f"no dtorch-worker child for device {device}: {pids}"
    os.kill(pids[device], signal.SIGKILL)
    return pids[device]


def test_sigkill_worker(process_mode, sigcont_guard):
    dead_mesh = dtorch.DeviceMesh("cpu", [0, 1])
    other = dtorch.DeviceMesh("cpu", [2, 3])
    full = np.arange(10, dtype=np.float32).reshape(5, 2)
    x = dtorch.distribute_tensor(full, dead_mesh, [Shard(0)])
    y = dtorch.distribute_tensor(full, other, [Shard(0)])
    np.testing.assert_array_equal(x.numpy(), full)
    np.testing.assert_array_equal(y.numpy(), full)

    # a fetch left pending on the victim (stopped first, so it cannot answer), then the kill
    pid = worker_pids()[1]
    os.kill(pid, signal.SIGSTOP)
    sigcont_guard.append(pid)
    pending = x.future()
    assert not pending.done()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="device 1") as info:
        pending.result(timeout=PATIENCE_S)
    assert not isinstance(info.value, TimeoutError)
    assert "device 1" in str(info.value)
    assert pending.done()
    exc = pending.exception()
    assert exc is not None and "device 1" in str(exc)

    # a new fetch on that mesh fails too, naming the device
    with pytest.raises(RuntimeError, match="device 1") as info:
        x.future().result(timeout=PATIENCE_S)

    # awaiting a fetch on that mesh raises the failure too
    async def fetch():
        return await x.future()

    with pytest.raises(Exception, match="device 1"):
        asyncio.run(asyncio.wait_for(fetch(), timeout=PATIENCE_S))

    # factories on the dead mesh raise at the call site
    with pytest.raises(Exception, match="device 1"):
        dtorch.zeros(4, device_mesh=dead_mesh)
    with pytest.raises(Exception, match="device 1"):
        dtorch.rand(4, device_mesh=dead_mesh, placements=[Shard(0)])

    # another mesh on other device ids keeps working
    np.testing.assert_array_equal(y.numpy(), full)
    z = dtorch.arange(7, device_mesh=other, placements=[Shard(0)])
    np.testing.assert_array_equal(z.numpy(), np.arange(7))
    # a mesh sharing only the live device 0 keeps working too
    only0 = dtorch.DeviceMesh("cpu", [0])
    np.testing.assert_array_equal(dtorch.ones(3, device_mesh=only0).numpy(), np.ones(3, np.float32))

    # shutdown, then a fresh start: the old mesh's devices work again
    dtorch.shutdown()
    dtorch.init(workers="process")
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    np.testing.assert_array_equal(dtorch.distribute_tensor(full, mesh, [Shard(0)]).numpy(), full)
    np.testing.assert_array_equal(dtorch.full((2, 2), 3, device_mesh=dead_mesh, placements=[Replicate()]).numpy(),
                                  np.full((2, 2), 3, np.int64))
    assert 1 in worker_pids()


def test_sigkill_idle_worker_new_fetch(process_mode):
    """Killed while idle: the next fetch on that mesh fails, naming the device."""
    mesh = dtorch.DeviceMesh("cpu", [5, 6])
    x = dtorch.ones(4, 3, device_mesh=mesh, placements=[Shard(1)])
    dtorch.synchronize()
    _kill(6)
    with pytest.raises(RuntimeError, match="device 6"):
        x.future().result(timeout=PATIENCE_S)
    # synchronize skips dead devices (act_runtime_submit.c): it returns instead of hanging
    dtorch.synchronize()
    # a 2x2 mesh elsewhere works
    m2 = dtorch.DeviceMesh("cpu", [[0, 1], [2, 3]])
    np.testing.assert_array_equal(dtorch.arange(6, device_mesh=m2, placements=[Shard(0), Shard(0)]).numpy(),
                                  np.arange(6))


def test_silent_worker_is_declared_dead(sigcont_guard, monkeypatch):
    """A worker process that stops answering (here: SIGSTOP) fails its futures once it has been
    silent for DTORCH_SILENT_TIMEOUT seconds; a slow kernel does not count as silence."""
    monkeypatch.setenv("DTORCH_SILENT_TIMEOUT", "1.0")
    dtorch.shutdown()
    dtorch.init(workers="process")
    try:
        mesh = dtorch.DeviceMesh("cpu", [0, 1])
        other = dtorch.DeviceMesh("cpu", [2, 3])
        x = dtorch.arange(8, device_mesh=mesh, placements=[dtorch.Shard(0)])
        y = dtorch.ones(4, device_mesh=other)
        dtorch.synchronize()
        time.sleep(1.5)  # idle but alive: heartbeats keep the devices up
        assert np.array_equal(x.numpy(), np.arange(8))
        # busy, not silent: a chain of products that keeps device 0 in kernels for longer than the
        # timeout (its heartbeat thread still beats); each product of these keeps every entry 2^-11
        n, k = 2048, 8
        w = dtorch.full((n, n), 2.0 ** -11, device_mesh=dtorch.DeviceMesh("cpu", [0]))
        while True:
            t0 = time.monotonic()
            prod = w
            for _ in range(k):
                prod = prod @ w
            corner = prod[:2, :2].numpy()
            if time.monotonic() - t0 > 1.5:
                break
            k *= 2
        np.testing.assert_array_equal(corner, np.full((2, 2), 2.0 ** -11, np.float32))
        pid = worker_pids()[1]
        os.kill(pid, signal.SIGSTOP)
        sigcont_guard.append(pid)
        with pytest.raises(RuntimeError, match=r"device 1 .*silent"):
            x.future().result(timeout=PATIENCE_S)
        with pytest.raises(RuntimeError, match="device 1"):
            dtorch.ones(2, device_mesh=mesh)
        assert np.array_equal(y.numpy(), np.ones(4)), "other devices keep working"
    finally:
        dtorch.shutdown()


def test_worker_sockets_live_in_a_private_directory_that_goes_with_the_run(process_mode):
    """The ipc sockets of worker processes are in a directory only this user can enter, under a
    random name; a killed worker's socket file does not outlive the run."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.arange(4, device_mesh=mesh, placements=[dtorch.Shard(0)])
    np.testing.assert_array_equal(x.redistribute(mesh, [dtorch.Replicate()]).numpy(), np.arange(4))
    pids = worker_pids()
    argv = open(f"/proc/{pids[0]}/cmdline").read().split("\0")
    endpoint = argv[argv.index("--connect") + 1]
    assert endpoint.startswith("ipc://")
    directory = os.path.dirname(endpoint[len("ipc://"):])
    assert str(os.getpid()) not in os.path.basename(directory)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert os.stat(directory).st_uid == os.getuid()
    assert any("peer" in name for name in os.listdir(directory)), os.listdir(directory)
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="device 1"):
        x.redistribute(mesh, [dtorch.Replicate()]).numpy()
    dtorch.shutdown()
    assert not os.path.exists(directory)


def test_on_failure_calls_back_once_for_the_meshes_that_hold_the_device(process_mode):
    """DeviceMesh.on_failure: a killed worker calls the callbacks of the meshes that hold its device,
    once each, with the device and why; the others are not called; from the callback a new mesh on
    other devices computes, while the failed mesh's tensors name the dead device."""
    import threading
    mesh, other, overlap = (dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3]),
                            dtorch.DeviceMesh("cpu", [1, 2]))
    x = dtorch.arange(4, device_mesh=mesh, placements=[dtorch.Shard(0)])
    dtorch.ones(2, device_mesh=other).numpy()
    dtorch.ones(2, device_mesh=overlap).numpy()
    calls, done = [], threading.Event()

    def on_mesh(device, reason):
        fresh = dtorch.DeviceMesh("cpu", [4, 5])       # carry on elsewhere, from the callback itself
        value = dtorch.arange(6, device_mesh=fresh, placements=[dtorch.Shard(0)]).numpy()
        calls.append(("mesh", device, reason, value))
        done.set()

    handles = [mesh.on_failure(on_mesh),
               other.on_failure(lambda device, reason: calls.append(("other", device, reason, None))),
               overlap.on_failure(lambda device, reason: calls.append(("overlap", device, reason, None)))]
    removed = mesh.on_failure(lambda device, reason: calls.append(("removed", device, reason, None)))
    removed.remove()
    try:
        _on_failure_checks(mesh, x, calls, done)
    finally:
        for h in handles:
            h.remove()


def _on_failure_checks(mesh, x, calls, done):
    os.kill(worker_pids()[1], signal.SIGKILL)
    assert done.wait(10), "the callback was not called"
    time.sleep(0.5)   # any wrong or repeated call has had the time to come
    names = sorted(c[0] for c in calls)
    assert names == ["mesh", "overlap"], calls
    for name, device, reason, value in calls:
        assert device == 1 and "killed by signal 9" in reason, (name, device, reason)
    np.testing.assert_array_equal([c for c in calls if c[0] == "mesh"][0][3], np.arange(6))
    with pytest.raises(RuntimeError, match="device 1"):
        x.numpy()
    dtorch.shutdown()
    dtorch.init(workers="process")
    np.testing.assert_array_equal(dtorch.arange(4, device_mesh=mesh, placements=[dtorch.Shard(0)]).numpy(),
                                  np.arange(4))
    time.sleep(0.3)
    assert len(calls) == 2, f"neither the shutdown nor the restart calls anything: {calls}"


def _wrapped_worker(tmp_path, monkeypatch, before):
    """Process workers that run the shell line `before`, then the real dtorch-worker (exec keeps
    the pid, and the pipe from the controller)."""
    real = os.environ["DTORCH_WORKER_PATH"]
    wrapper = tmp_path / "wrapped-worker"
    wrapper.write_text(f"#!/bin/sh\n{before}\nexec '{real}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("DTORCH_WORKER_PATH", str(wrapper))
    monkeypatch.setenv("DTORCH_SILENT_TIMEOUT", "1.0")
    dtorch.shutdown()
    dtorch.init(workers="process")


def test_a_worker_stopped_before_its_first_word_is_declared_dead(tmp_path, monkeypatch):
    """A worker process that is stopped before it says anything is judged by the silence bound once
    it has had that long to start, not only by the much longer bound on its hello."""
    _wrapped_worker(tmp_path, monkeypatch, "kill -STOP $$")
    try:
        with pytest.raises(RuntimeError, match=r"device 0 .*its worker process \d+ has been stopped and silent for "
                                               r"\d+\.\d s since it was started"):
            dtorch.ones((2,), device_mesh=dtorch.DeviceMesh("cpu", [0])).numpy()
    finally:
        dtorch.shutdown()


def test_a_worker_slow_to_start_is_waited_for(tmp_path, monkeypatch):
    """A worker process that takes longer than the silence bound to say its first word, but is not
    stopped (a loaded host, a slow disk, a wrapper), is waited for."""
    _wrapped_worker(tmp_path, monkeypatch, "sleep 2")
    try:
        mesh = dtorch.DeviceMesh("cpu", [0, 1])
        np.testing.assert_array_equal(dtorch.arange(4, device_mesh=mesh, placements=[Shard(0)]).numpy(), np.arange(4))
    finally:
        dtorch.shutdown()
