"""Shutdown racing other threads, what pending futures say when the runtime stops, worker processes
that outlive the threads that started them but not the controller's process, and what a killed
controller leaves behind."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

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


@pytest.mark.parametrize("how", ["thread", "pool"])
def test_workers_outlive_the_thread_that_started_them(process_mode, how):
    """A worker process is started by whichever thread first names its device; it lives until the
    runtime stops, whatever becomes of that thread (it was killed when the thread ended)."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])

    def first_op():
        return dtorch.ones((2,), device_mesh=mesh).numpy()

    if how == "thread":
        got = []
        t = threading.Thread(target=lambda: got.append(first_op()))
        t.start()
        t.join()
        got = got[0]
    else:
        with ThreadPoolExecutor(max_workers=1) as pool:   # its thread ends with the with block
            got = pool.submit(first_op).result()
    np.testing.assert_array_equal(got, np.ones(2, np.float32))
    pids = worker_pids()
    assert sorted(pids) == [0, 1], pids
    time.sleep(1.0)   # what the end of the thread did to the workers has happened by now
    assert not any(process_gone(p) for p in pids.values()), pids
    np.testing.assert_array_equal(dtorch.arange(4, device_mesh=mesh, placements=[dtorch.Shard(0)]).numpy(),
                                  np.arange(4))
    assert worker_pids() == pids, "the same workers serve"


_CONTROLLER = """
import sys, threading, dtorch
dtorch.init(workers="process")
mesh = dtorch.DeviceMesh("cpu", [0, 1])
if sys.argv[1] == "from-a-thread":   # its workers are started by a thread that then ends
    t = threading.Thread(target=lambda: dtorch.ones((2,), device_mesh=mesh).numpy())
    t.start()
    t.join()
print(float(dtorch.arange(4, device_mesh=mesh, placements=[dtorch.Shard(0)]).numpy().sum()), flush=True)
sys.stdin.read()   # until the test kills it
"""


def _controller(how="here"):
    return subprocess.Popen([sys.executable, "-c", _CONTROLLER, how], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _wait_gone(pids, timeout):
    until = time.monotonic() + timeout
    while time.monotonic() < until and not all(process_gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not process_gone(p)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_leave_when_the_controllers_process_is_killed(sig):
    """Killed, the controller's process leaves no worker behind: each watches a pipe only that
    process holds open, whose end comes with the process, however it ends (kill -9 included)."""
    ctl = _controller("from-a-thread")
    try:
        assert ctl.stdout.readline().strip() == "6.0"
        pids = worker_pids(ctl.pid)
        assert sorted(pids) == [0, 1], pids
        ctl.send_signal(sig)
        ctl.wait(timeout=30)
        assert _wait_gone(list(pids.values()), 30) == [], "workers outlived the controller's process"
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()


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
