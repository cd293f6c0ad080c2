"""Shutdown racing other threads, what pending futures say when the runtime stops, and what a
controller's process killed before it could stop leaves behind."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import dtorch
from conftest import process_gone, run_dirs_of, worker_pids


def test_pending_fetch_at_shutdown_names_the_shutdown(process_mode, sigcont_guard):
    """A fetch left pending at shutdown fails because of the shutdown, not because a worker that
    said bye and exited 'died'."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.arange(8, device_mesh=mesh, placements=[dtorch.Shard(0)])
    x.numpy()
    pid = worker_pids()[1]
    os.kill(pid, signal.SIGSTOP)
    sigcont_guard.append(pid)
    pending = x.future()
    dtorch.shutdown()
    exc = pending.exception(timeout=5)
    assert exc is not None
    assert "shut down" in str(exc), str(exc)
    assert "died" not in str(exc), str(exc)


_RACE = textwrap.dedent("""
    import os, signal, sys, threading, time
    sys.path.insert(0, {here!r})
    import numpy as np
    import dtorch
    from conftest import worker_pids

    dtorch.init(workers="process")
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.arange(8, device_mesh=mesh, placements=[dtorch.Shard(0)])
    x.numpy()
    victim = worker_pids()[1]
    os.kill(victim, signal.SIGSTOP)  # the shutdown now waits its whole bye timeout
    pending = x.future()
    failed = threading.Event()

    def hold():  # on the controller thread, as it fails the pending futures
        failed.set()
        time.sleep(0.3)

    pending._add_done_callback(hold)
    outcome = {{}}

    def sync():
        failed.wait()
        try:
            dtorch.synchronize()
            outcome["sync"] = "ok"
        except RuntimeError as e:
            outcome["sync"] = str(e)

    syncer = threading.Thread(target=sync, daemon=True)
    syncer.start()
    stopper = threading.Thread(target=dtorch.shutdown)
    stopper.start()
    time.sleep(0.3)
    dtorch.shutdown()  # a second shutdown, while the first is under way
    assert not dtorch.is_initialized()
    assert worker_pids() == {{}}, "the second shutdown returned with workers still running"
    assert pending.done(), "the second shutdown returned with a future still pending"
    syncer.join(30)
    assert not syncer.is_alive(), "synchronize() during shutdown never returned"
    stopper.join(30)
    assert not stopper.is_alive()
    y = dtorch.arange(4, device_mesh=mesh, placements=[dtorch.Shard(0)])
    assert np.array_equal(y.numpy(), np.arange(4)), "a fresh start after both shutdowns"
    dtorch.shutdown()
    print("RACE-OK", outcome)
""")


def test_shutdown_races_shutdown_and_synchronize():
    """Two shutdowns at once: the second waits for the first. synchronize() during a shutdown
    returns (or raises) instead of waiting forever for a future nobody settles."""
    script = _RACE.format(here=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "RACE-OK" in proc.stdout, proc.stdout + proc.stderr


_EXIT_WITH_REDISTRIBUTES_QUEUED = """
import sys
import numpy as np
import dtorch
from dtorch import Replicate, Shard
dtorch.init(workers=sys.argv[1])
mesh = dtorch.DeviceMesh("cpu", [0, 1])
x = dtorch.distribute_tensor(np.ones((64, 64), np.float32), mesh, [Shard(1)])
w = dtorch.distribute_tensor(np.ones((64, 64), np.float32), mesh, [Shard(1)])
for _ in range(200):
    y = dtorch.nn.functional.linear(x, w).redistribute(mesh, [Replicate()])
print("issued")
"""


@pytest.mark.parametrize("workers", ["thread", "process"])
def test_exit_with_redistributes_still_queued(workers):
    """A script that ends while transfers are still queued exits: a worker whose peer has already
    left gives its sends up instead of waiting for that peer forever (it hung at exit once)."""
    done = subprocess.run([sys.executable, "-c", _EXIT_WITH_REDISTRIBUTES_QUEUED, workers], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "issued"


_CONTROLLER = """
import sys, dtorch
dtorch.init(workers="process")
mesh = dtorch.DeviceMesh("cpu", [0, 1])
print(float(dtorch.arange(4, device_mesh=mesh, placements=[dtorch.Shard(0)]).numpy().sum()), flush=True)
sys.stdin.read()   # until the test kills it
"""


def _controller():
    return subprocess.Popen([sys.executable, "-c", _CONTROLLER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _wait_gone(pids, timeout):
    until = time.monotonic() + timeout
    while time.monotonic() < until and not all(process_gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not process_gone(p)]


def test_a_killed_runs_directory_goes_at_the_next_start():
    """The run directory of a controller killed before it could remove it is removed when another
    process of the user makes its own; a live process's directory, and a directory of the same
    pattern that no owner file claims, stay."""
    killed, alive = _controller(), _controller()
    unclaimed = os.path.join("/tmp", "dtorch-" + os.urandom(3).hex())   # 6 characters, as mkdtemp makes them
    os.mkdir(unclaimed, 0o700)
    try:
        assert killed.stdout.readline().strip() == "6.0"
        assert alive.stdout.readline().strip() == "6.0"
        stale, live = run_dirs_of(killed.pid), run_dirs_of(alive.pid)
        assert len(stale) == 1 and len(live) == 1, (stale, live)
        workers = list(worker_pids(killed.pid).values())
        killed.kill()
        killed.wait()
        assert _wait_gone(workers, 30) == []
        assert os.path.isdir(stale[0]), "nothing removed it yet"
        dtorch.shutdown()
        dtorch.init(workers="process")
        try:
            np.testing.assert_array_equal(dtorch.ones((2,), device_mesh=dtorch.DeviceMesh("cpu", [0])).numpy(),
                                          np.ones(2, np.float32))
            assert not os.path.exists(stale[0])
            assert os.path.isdir(live[0]) and os.path.isdir(unclaimed)
            assert alive.poll() is None
        finally:
            dtorch.shutdown()
    finally:
        for p in (killed, alive):
            if p.poll() is None:
                p.kill()
                p.wait()
        os.rmdir(unclaimed)
