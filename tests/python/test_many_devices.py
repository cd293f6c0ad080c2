"""Meshes of many devices: 32 and 512 thread workers, 32 and 512 worker processes, and a process
that runs out of file descriptors gets a Python exception, never an abort, and keeps working."""
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dtorch
from conftest import worker_pids
from dtorch import Replicate, Shard


def test_32_devices_gather_both_dims(mode):
    """Shard x Shard -> Replicate on a (4, 8) mesh: every device sends to the 31 others."""
    mesh = dtorch.init_device_mesh("cpu", (4, 8))
    full = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    y = x.redistribute(mesh, [Replicate(), Replicate()])
    local = y.to_local()
    assert len(local) == 32 and all((piece == full).all() for piece in local)


@pytest.mark.usefixtures("thread_runtime")
def test_512_thread_devices():
    """512 worker threads: a reduction, and an all-gather in which each sends to the 511 others
    (worker threads share one ROUTER each, not a socket per peer)."""
    mesh = dtorch.DeviceMesh("cpu", list(range(512)))
    assert dtorch.ones((512,), device_mesh=mesh, placements=[Shard(0)]).sum().item() == 512.0
    values = np.arange(1024, dtype=np.float32)
    gathered = dtorch.distribute_tensor(values, mesh, [Shard(0)]).redistribute(mesh, [Replicate()]).to_local()
    assert len(gathered) == 512 and all((piece == values).all() for piece in gathered)


def test_512_process_devices(process_mode, monkeypatch):
    """512 worker processes on this host: a reduction over all of them, a pair of them exchanging
    pieces, and a shutdown that leaves none behind. 512 processes starting on 2 cores may each wait
    seconds for a page or a core (once, in CI, one was silent for 3 s, the default bound): this test
    is about their number, so their liveness bound is generous here (test_failure.py tests it)."""
    monkeypatch.setenv("DTORCH_SILENT_TIMEOUT", "30")
    dtorch.shutdown()
    dtorch.init(workers="process")
    mesh = dtorch.DeviceMesh("cpu", list(range(512)))
    assert dtorch.ones((512,), device_mesh=mesh, placements=[Shard(0)]).sum().item() == 512.0
    pids = worker_pids()
    assert sorted(pids) == list(range(512)) and len(set(pids.values())) == 512
    pair = dtorch.DeviceMesh("cpu", [0, 511])
    values = np.arange(10, dtype=np.float32)
    gathered = dtorch.distribute_tensor(values, pair, [Shard(0)]).redistribute(pair, [Replicate()]).to_local()
    assert all((piece == values).all() for piece in gathered)
    dtorch.shutdown()
    assert worker_pids() == {}


def test_out_of_file_descriptors_is_an_exception():
    """With 200 descriptors a mesh of 300 thread workers cannot start: the op raises at once naming
    the limit, the process is not aborted, and a small mesh works after."""
    script = textwrap.dedent("""
        import time, dtorch
        t0 = time.monotonic()
        try:
            dtorch.ones((300,), device_mesh=dtorch.DeviceMesh("cpu", list(range(300))),
                        placements=[dtorch.Shard(0)]).sum().item()
            print("no error")
        except RuntimeError as e:
            print("raised:", e)
        print("seconds:", round(time.monotonic() - t0, 1))
        print("after:", dtorch.ones(3, device_mesh=dtorch.DeviceMesh("cpu", [0])).sum().item())
    """)

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         preexec_fn=limit)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert "cannot create a socket" in lines["raised"] and "ulimit -n" in lines["raised"]
    # worker threads start in device order, each once its sockets are open: the first that
    # cannot have them is named, and the ones before it (device 0 among them) keep serving
    assert lines["raised"].startswith("ones: device ") and "its worker thread could not start" in lines["raised"]
    assert 0 < int(lines["raised"].split()[2].rstrip(":")) < 300
    assert float(lines["seconds"]) < 10
    assert lines["after"] == "3.0"


def test_a_worker_thread_that_could_not_start_is_started_by_the_next_op():
    """With every descriptor taken, the first op on a new mesh raises naming the device whose worker
    could not start; once descriptors are free again the same op starts it and computes."""
    script = textwrap.dedent("""
        import os, dtorch
        assert dtorch.ones(2, device_mesh=dtorch.DeviceMesh("cpu", [5])).sum().item() == 2.0  # the runtime is up
        mesh = dtorch.DeviceMesh("cpu", [0, 1, 2])
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        try:
            dtorch.arange(6, device_mesh=mesh, placements=[dtorch.Shard(0)]).sum().item()
            print("first: no error")
        except RuntimeError as e:
            print("first:", e)
        for fd in held:
            os.close(fd)
        x = dtorch.arange(6, device_mesh=mesh, placements=[dtorch.Shard(0)])
        print("again:", x.sum().item(), x.redistribute(mesh, [dtorch.Replicate()]).to_local()[2].tolist())
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200)))
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert lines["first"].startswith("arange: device 0: its worker thread could not start: cannot create a socket")
    assert lines["again"] == "15 [0, 1, 2, 3, 4, 5]"
