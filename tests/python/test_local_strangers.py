"""Worker processes of this host (dtorch.init(workers="process")) and other processes of the same
user that reach the run's directory: a stranger that connects to the controller's socket under a
device's name before that device's worker says hello, or to a worker's peer socket under another
device's name, is not heard; the run's own workers are, and compute as before."""
import os
import time

import numpy as np
import pytest

import dtorch
from conftest import run_dirs_of, worker_pids
from remote_tools import Stranger, forged_hello, forged_region


def _run_dir():
    found = run_dirs_of(os.getpid())
    assert len(found) == 1, found
    return found[0]


def _socket(directory, peer_of=None):
    """ipc endpoint of the run's control socket, or of device peer_of's peer socket."""
    names = os.listdir(directory)
    want = [n for n in names if n.startswith("control-") and
            (n.endswith(f"-peer-{peer_of}") if peer_of is not None else "-peer-" not in n)]
    assert len(want) == 1, names
    return "ipc://" + os.path.join(directory, want[0])


def _wait(condition, timeout=30.0):
    until = time.monotonic() + timeout
    while time.monotonic() < until and not condition():
        time.sleep(0.05)
    return condition()


def test_a_stranger_cannot_say_hello_for_a_local_worker(tmp_path, monkeypatch, capfd):
    """A stranger that says hello as device 0 before its worker does (the worker is held back here
    until the stranger has spoken) is dropped unread; the real worker is adopted after it and
    answers with the device's values."""
    gate = tmp_path / "go"
    real = os.environ["DTORCH_WORKER_PATH"]
    wrapper = tmp_path / "held-worker"
    wrapper.write_text(f"#!/bin/sh\nwhile [ ! -e '{gate}' ]; do sleep 0.05; done\nexec '{real}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("DTORCH_WORKER_PATH", str(wrapper))
    dtorch.shutdown()
    dtorch.init(workers="process")
    try:
        mesh = dtorch.DeviceMesh("cpu", [0])
        x = dtorch.full((2,), 7.0, device_mesh=mesh)   # device 0's worker is started, held back
        assert dtorch.worker_info(0).state == "waiting"
        stranger = Stranger(_socket(_run_dir()), "d0")
        assert stranger.send(*forged_hello(0, peer=""))
        said = []

        def heard():   # the controller dropped it (said on stderr), or read it (and refused the device)
            said.append(capfd.readouterr().err)
            return "not a worker of this run" in "".join(said) or dtorch.worker_info(0).state != "waiting"

        assert _wait(heard), "the controller never took the stranger's message in"
        stranger.close()
        assert dtorch.worker_info(0).state == "waiting", dtorch.worker_info(0)
        gate.write_text("")
        np.testing.assert_array_equal(x.numpy(), np.full(2, 7.0, np.float32))
        info = dtorch.worker_info(0)
        assert info.state == "serving" and info.pid == worker_pids()[0], info
    finally:
        dtorch.shutdown()


def _refused(mesh):
    return [s["peer_messages_refused"] for s in dtorch.device_stats(mesh)]


def test_a_stranger_cannot_send_regions_to_a_local_worker(process_mode):
    """A peer socket hears only the run's workers, each under its own name: a region from a
    stranger that names itself after device 1, with or without a made-up secret, or that names
    device 2 while connected as device 1, is refused unread and counted; redistributes between
    the run's workers go on."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    full = np.arange(8, dtype=np.float32)
    x = dtorch.distribute_tensor(full, mesh, [dtorch.Shard(0)])
    np.testing.assert_array_equal(x.redistribute(mesh, [dtorch.Replicate()]).numpy(), full)
    before = dtorch.device_stats(mesh)
    assert [s["peer_messages_refused"] for s in before] == [0, 0]
    peer0 = _socket(_run_dir(), peer_of=0)
    strangers = [Stranger(peer0, "w1"), Stranger(peer0, "w1." + "0" * 32), Stranger(peer0, "w1-x")]
    for s in strangers:
        assert s.send(*forged_region(1))
    assert strangers[0].send(*forged_region(2))
    assert _wait(lambda: _refused(mesh)[0] >= 4), _refused(mesh)
    for s in strangers:
        s.close()
    after = dtorch.device_stats(mesh)
    assert [s["peer_messages_refused"] for s in after] == [4, 0]
    assert [s["peer_messages_received"] for s in after] == [s["peer_messages_received"] for s in before]
    y = dtorch.distribute_tensor(full * 3, mesh, [dtorch.Shard(0)])
    np.testing.assert_array_equal(y.redistribute(mesh, [dtorch.Replicate()]).numpy(), full * 3)
    assert [s["peer_messages_refused"] for s in dtorch.device_stats(mesh)] == [4, 0]
