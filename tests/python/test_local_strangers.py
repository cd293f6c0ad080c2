"""Worker processes of this host (dtorch.init(workers="process")) and other processes of the same
user that reach the run's directory: a stranger that connects to the controller's socket under a
device's name before that device's worker says hello is not heard; the run's own workers are, and
compute as before."""
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
