"""A worker thread stuck inside an op (one that never returns) is found like a silent worker
process: its device is failed within the bound, other devices go on, and shutdown and exit do not
hang on it. The thread is stopped for real, alone of its process, by a tracer process (ptrace
SEIZE + INTERRUPT on its thread id): it neither beats nor uses CPU, which is what a kernel blocked
forever looks like. A long kernel, which uses CPU, is not taken for stuck."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import dtorch

BOUND_S = 10.0   # the bound is set to 3 s here (DTORCH_STUCK_TIMEOUT, 10 by default); a wide margin

_TRACER = textwrap.dedent("""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    SEIZE, INTERRUPT, DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000
    tid = int(sys.argv[1])
    if libc.ptrace(SEIZE, tid, None, None) != 0 or libc.ptrace(INTERRUPT, tid, None, None) != 0:
        print("ptrace failed", ctypes.get_errno(), flush=True)
        sys.exit(1)
    os.waitpid(tid, WALL)
    print("stopped", flush=True)
    sys.stdin.read()                       # until the test lets it go
    libc.ptrace(DETACH, tid, None, None)
""")

def _thread_id(name):
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as f:
            if f.read().strip() == name:
                return int(task)
    raise LookupError(f"no thread named {name}")


def _stop_thread(name):
    tracer = subprocess.Popen([sys.executable, "-c", _TRACER, str(_thread_id(name))], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert tracer.stdout.readline().strip() == "stopped"
    return tracer


def _stop_inside_a_kernel(mesh, name):
    """Starts a matmul of about a second on mesh and stops the thread called name inside it."""
    a = np.random.default_rng(1).standard_normal((3500, 3500)).astype(np.float32)
    x = dtorch.distribute_tensor(a, mesh, [dtorch.Replicate()])
    x.numpy()
    pending = (x @ x).sum().future()
    time.sleep(0.3)
    return _stop_thread(name), pending


def _let_go(tracer):
    if tracer.poll() is None:
        tracer.stdin.close()
        tracer.wait(timeout=10)


@pytest.fixture
def threads(monkeypatch):
    monkeypatch.setenv("DTORCH_STUCK_TIMEOUT", "3")
    dtorch.shutdown()
    dtorch.init(workers="thread")
    yield
    dtorch.shutdown()


def test_a_stuck_worker_thread_fails_its_device_within_the_bound(threads):
    mesh, other = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    y = dtorch.arange(6, device_mesh=other, placements=[dtorch.Shard(0)])
    x = dtorch.zeros(8, device_mesh=mesh, placements=[dtorch.Shard(0)])
    np.testing.assert_array_equal(x.numpy(), np.zeros(8))   # both threads started
    tracer, pending = _stop_inside_a_kernel(dtorch.DeviceMesh("cpu", [1]), "dtorch-dev1")
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"device 1 died: its worker thread has made no progress for \d\.\d s "
                                               r"\(inside an op, using no CPU\)"):
            pending.result(timeout=30)
        took = time.monotonic() - t0
        assert 2.5 < took < BOUND_S, took
        np.testing.assert_array_equal(y.numpy(), np.arange(6))   # the other devices go on
        with pytest.raises(RuntimeError, match="device 1 is dead"):
            dtorch.ones((2,), device_mesh=mesh, placements=[dtorch.Shard(0)])
        t0 = time.monotonic()
        dtorch.shutdown()                         # the thread is still stopped: it is let go, not waited for
        assert time.monotonic() - t0 < BOUND_S
    finally:
        _let_go(tracer)
    dtorch.init(workers="thread")                 # a fresh runtime has every device back
    z = dtorch.full((4,), 2.0, device_mesh=mesh, placements=[dtorch.Shard(0)])
    assert float(z.sum().numpy()) == 8.0


def _timed_square(n, mesh):
    """(a, x @ x fetched, seconds it took) for a random (n, n) float32 a on mesh."""
    a = (np.random.default_rng(n).standard_normal((n, n)) / 50).astype(np.float32)
    x = dtorch.distribute_tensor(a, mesh, [dtorch.Replicate()])
    x.numpy()
    t0 = time.monotonic()
    got = (x @ x).numpy()
    return a, got, time.monotonic() - t0


def test_a_long_kernel_is_not_stuck(threads, monkeypatch):
    """One matmul that keeps a worker thread inside its kernel for several times the bound (0.2 s
    here) uses CPU the whole time: nothing fails, and the value is right. The product's size is
    worked out from a smaller one timed first, so that it lasts about 3 s on any machine (five
    times what it must last to show anything, should the load on the machine fall meanwhile)."""
    dtorch.shutdown()
    monkeypatch.setenv("DTORCH_STUCK_TIMEOUT", "0.2")
    dtorch.init(workers="thread")
    mesh = dtorch.DeviceMesh("cpu", [0])
    _, _, small = _timed_square(1500, mesh)
    n = int(min(9000, max(1500, 1500 * (3.0 / max(small, 1e-3)) ** (1 / 3))))
    a, got, took = _timed_square(n, mesh)
    np.testing.assert_allclose(got[:5], a[:5].astype(np.float64) @ a, rtol=1e-3, atol=1e-4)
    assert took > 0.6, f"the kernel of n = {n} took {took:.2f} s: too short to show anything"


def test_exit_with_a_thread_still_stuck_does_not_hang():
    script = textwrap.dedent("""
        import subprocess, sys, numpy as np, dtorch
        sys.path.insert(0, sys.argv[1])
        from test_stuck_thread import _stop_inside_a_kernel
        dtorch.init(workers="thread")
        tracer, pending = _stop_inside_a_kernel(dtorch.DeviceMesh("cpu", [0]), "dtorch-dev0")
        try:
            pending.result()
        except RuntimeError as e:
            print("failed:", e, flush=True)
        # exits with the thread still stopped; the tracer goes with the test
    """)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, os.path.dirname(os.path.abspath(__file__))],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, DTORCH_STUCK_TIMEOUT="3"))
    assert "failed: device 0 died: its worker thread has made no progress" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 < 30
