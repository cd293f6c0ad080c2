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


def test_512_process_devices(process_mode):
    """512 worker processes on this host: a reduction over all of them, a pair of them exchanging
    pieces, and a shutdown that leaves none behind."""
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
    assert float(lines["seconds"]) < 10
    assert lines["after"] == "3.0"
