"""Shutdown racing other threads, and what pending futures say when the runtime stops."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import dtorch
from conftest import worker_pids


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
