"""Workers that come to a listening controller (dtorch.init(listen=...)): dtorch-worker processes
started by hand, over tcp on this host's loopback, with CURVE on every link. The same across real
separate network stacks is test_netns.py."""
import os
import re
import socket
import stat
import subprocess
import time

import numpy as np
import pytest

import dtorch
from conftest import wait_for
from remote_tools import (WORKER, RawZmtp, Stranger, curve_keypair, forged_hello, forged_region, peer_messages_received,
                          start_worker, stop_all, wait_exit)


@pytest.fixture
def keys(tmp_path):
    """The workers' key pair, and another one nobody admits."""
    good, bad = str(tmp_path / "worker.key"), str(tmp_path / "stranger.key")
    return {"good": good, "good_public": dtorch.generate_keypair(good),
            "bad": bad, "bad_public": dtorch.generate_keypair(bad)}


@pytest.fixture
def cluster(keys):
    """A controller listening on loopback and two worker processes of two devices each."""
    dtorch.shutdown()
    dtorch.init(listen="tcp://127.0.0.1:*", worker_key=keys["good"])
    endpoint, server_key = dtorch.listen_address(), dtorch.controller_public_key()
    procs = [start_worker(endpoint, "cpu:0-1", keys["good"], server_key),
             start_worker(endpoint, "cpu:2-3", keys["good"], server_key)]
    infos = dtorch.wait_for_workers(4, timeout=30)
    yield {"endpoint": endpoint, "server_key": server_key, "procs": procs, "infos": infos, **keys}
    dtorch.shutdown()
    stop_all(procs)


def _key_in(path):
    with open(path) as f:
        return re.search(r'public-key = "(.{40})"', f.read()).group(1)


def test_keygen_writes_a_public_file_and_a_private_secret(tmp_path, keys):
    assert len(keys["good_public"]) == 40 and keys["good_public"] != keys["bad_public"]
    assert _key_in(keys["good"]) == keys["good_public"]
    assert _key_in(keys["good"] + "_secret") == keys["good_public"]
    assert stat.S_IMODE(os.stat(keys["good"] + "_secret").st_mode) == 0o600
    with open(keys["good"] + "_secret") as f:
        assert "secret-key" in f.read()
    with open(keys["good"]) as f:
        assert "secret-key" not in f.read()


def test_the_worker_command_says_how_it_is_used():
    done = subprocess.run([WORKER, "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: dtorch-worker --connect tcp://HOST:PORT --devices TYPE:IDS") and not done.stderr


@pytest.mark.parametrize("argv, says", [
    (["--connect", "inproc://x", "--device", "0"], "--connect takes tcp://HOST:PORT"),
    (["--connect", "ipc:///tmp/dtorch-none/control-1", "--device", "0"], "started by the controller"),
    (["--connect", "tcp://127.0.0.1:1", "--device", "0"], "serves the devices that --devices names"),
    (["--connect", "inproc://x", "--devices", "cpu:0"], "--devices serves a listening controller"),
    (["--device", "0"], "--connect tcp://HOST:PORT is required"),
])
def test_the_worker_command_refuses_what_it_cannot_serve(argv, says):
    """An endpoint no worker run by hand can reach (inproc, a run directory's ipc socket, which
    only the controller's own children are let into) is refused at once with status 2, not waited on."""
    done = subprocess.run([WORKER, *argv], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert says in done.stderr and "usage:" in done.stderr, done.stderr


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(listen="ipc:///tmp/x"), ValueError, "tcp://A.B.C.D:PORT"),
    (dict(listen="tcp://example.org:5000"), ValueError, "tcp://A.B.C.D:PORT"),
    (dict(listen="tcp://127.0.0.1:70000"), ValueError, "tcp://A.B.C.D:PORT"),
    (dict(listen="tcp://127.0.0.1:*"), ValueError, "worker_key="),
    (dict(listen="tcp://127.0.0.1:*", worker_key="not a key"), ValueError, "neither a key"),
    (dict(listen="tcp://127.0.0.1:*", worker_key="WORKER", key="/nonexistent/ctl.key"), ValueError, "secret key file"),
    (dict(listen=5000), TypeError, "listen must be a str"),
    (dict(worker_key="WORKER"), ValueError, "go with listen="),
    (dict(insecure=True), ValueError, "go with listen="),
])
def test_bad_listen_arguments_raise_at_the_call_site(keys, kwargs, error, match):
    dtorch.shutdown()
    kwargs = {k: keys["good"] if v == "WORKER" else v for k, v in kwargs.items()}
    with pytest.raises(error, match=re.escape(match)):
        dtorch.init(**kwargs)
    # nothing was started by halves: an ordinary runtime comes up and computes
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.distribute_tensor(np.arange(6, dtype=np.float32), mesh, [dtorch.Shard(0)])
    np.testing.assert_array_equal((x + 1).numpy(), np.arange(6, dtype=np.float32) + 1)
    dtorch.shutdown()


def test_listening_runtime_refuses_a_second_mode_until_shutdown(cluster):
    with pytest.raises(ValueError, match="already running and listening"):
        dtorch.init(workers="thread")


def test_workers_report_their_host_and_process(cluster):
    pids = {p.pid for p in cluster["procs"]}
    for info in cluster["infos"]:
        assert info.state == "serving" and info.remote
        assert info.host == socket.gethostname()
        assert info.pid in pids
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", info.peer)
    assert cluster["infos"][0].pid == cluster["infos"][1].pid != cluster["infos"][2].pid


def test_remote_workers_compute_and_exchange_directly(cluster):
    a = np.arange(48, dtype=np.float32).reshape(8, 6) / 7
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    before = peer_messages_received(mesh)
    x = dtorch.distribute_tensor(a, mesh, [dtorch.Shard(0)])
    y = (x * 2 + 1).redistribute(mesh, [dtorch.Replicate()])
    np.testing.assert_allclose(y.numpy(), a * 2 + 1, rtol=1e-6)
    # the all-gather moved regions between worker processes, not through the controller
    after = peer_messages_received(mesh)
    assert all(n - b >= 3 for n, b in zip(after, before)), (before, after)
    m2 = dtorch.init_device_mesh("cpu", (2, 2))
    z = dtorch.distribute_tensor(a[:6], m2, [dtorch.Shard(0), dtorch.Shard(1)])
    w = dtorch.distribute_tensor(a[:6].T.copy(), m2, [dtorch.Replicate(), dtorch.Shard(0)])
    np.testing.assert_allclose((z @ w).full_tensor(), a[:6] @ a[:6].T, rtol=1e-5)
    np.testing.assert_allclose(z.sum(dim=1).numpy(), a[:6].sum(axis=1), rtol=1e-5)


def test_a_worker_with_a_wrong_key_is_refused_while_others_compute(cluster):
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    a = np.arange(4000, dtype=np.float32).reshape(40, 100) / 1000
    x = dtorch.distribute_tensor(a, mesh, [dtorch.Shard(0)])
    for _ in range(200):
        x = x * 0.5 + 1
    stranger = start_worker(cluster["endpoint"], "cpu:5", cluster["bad"], cluster["server_key"],
                            extra=["--connect-timeout", "3"])
    rc, took, err = wait_exit(stranger, 30)
    assert rc == 1 and "no word from the controller" in err, err
    with pytest.raises(ValueError, match="no worker in this runtime"):
        dtorch.worker_info(5)
    ref = a.copy()
    for _ in range(200):
        ref = ref * 0.5 + 1
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-5)


def _stranger_hellos(endpoint, server_key):
    """A plaintext client and a CURVE client with keys of its own, each saying hello as a device."""
    plain = Stranger(endpoint, "d6")
    plain.send(*forged_hello(6))
    curved = Stranger(endpoint, "d7", keys=curve_keypair(), server_key=server_key)
    curved.send(*forged_hello(7))
    time.sleep(1.0)
    plain.close()
    curved.close()


def test_strangers_cannot_reach_the_controller(cluster):
    _stranger_hellos(cluster["endpoint"], cluster["server_key"])
    for device in (6, 7):
        with pytest.raises(ValueError, match="no worker in this runtime"):
            dtorch.worker_info(device)
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    x = dtorch.ones((8,), device_mesh=mesh, placements=[dtorch.Shard(0)])
    assert float(x.sum().numpy()) == 8.0


def test_strangers_cannot_reach_a_worker(cluster):
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    before = peer_messages_received(mesh)
    peer = cluster["infos"][2].peer
    plain = Stranger(peer, "w0")
    plain.send(*forged_region(0))
    curved = Stranger(peer, "w1", keys=curve_keypair(), server_key=cluster["good_public"])
    curved.send(*forged_region(1))
    time.sleep(1.0)
    plain.close()
    curved.close()
    assert peer_messages_received(mesh) == before
    x = dtorch.distribute_tensor(np.arange(8, dtype=np.float32), mesh, [dtorch.Shard(0)])
    np.testing.assert_array_equal(x.redistribute(mesh, [dtorch.Replicate()]).numpy(), np.arange(8))


def test_the_probes_do_reach_an_insecure_controller_and_worker(keys):
    """The control for the two tests above: in plaintext the same hello is read (and refused for
    its registry) and the same region is received, so the probes are not what fails."""
    dtorch.shutdown()
    dtorch.init(listen="tcp://127.0.0.1:*", insecure=True)
    procs = [start_worker(dtorch.listen_address(), "cpu:0-1", insecure=True)]
    try:
        infos = dtorch.wait_for_workers([0, 1], timeout=30)
        assert dtorch.controller_public_key() == ""
        mesh = dtorch.DeviceMesh("cpu", [0, 1])
        before = peer_messages_received(mesh)
        probe = Stranger(infos[1].peer, "w0")
        probe.send(*forged_region(0))
        received = wait_for(lambda: peer_messages_received(mesh) == [before[0], before[1] + 1])
        probe.close()
        assert received, (before, peer_messages_received(mesh))
        probe = Stranger(dtorch.listen_address(), "d6")
        probe.send(*forged_hello(6))

        def refused():
            try:
                info = dtorch.worker_info(6)
            except ValueError:   # not heard yet
                return False
            return info.state == "dead" and "rebuild dtorch-worker" in info.reason
        assert wait_for(refused), "the plaintext hello was never read"
        probe.close()
    finally:
        dtorch.shutdown()
        stop_all(procs)


def _dead(device, timeout=30):
    """The worker info of device once the controller has declared it dead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = dtorch.worker_info(device)
            if info.state == "dead":
                return info
        except ValueError:   # not heard of yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"device {device} was not declared dead in {timeout} s")


def test_an_insecure_controller_cuts_off_a_frame_past_its_bound(monkeypatch):
    """Anyone may reach an insecure controller's port. With the bound on a frame set to 64 MiB
    (DTORCH_MAX_FRAME_MB; by default it is the host's memory), a stranger that announces a 512 MiB
    frame is cut off at the frame's header, before anything is allocated, and the runtime goes on
    computing. It first sends a hello that the controller reads (and refuses for its registry), so
    its framing is not what is refused."""
    monkeypatch.setenv("DTORCH_MAX_FRAME_MB", "64")
    dtorch.shutdown()
    dtorch.init(listen="tcp://127.0.0.1:*", insecure=True)
    procs = [start_worker(dtorch.listen_address(), "cpu:0-1", insecure=True)]
    try:
        dtorch.wait_for_workers([0, 1], timeout=30)
        stranger = RawZmtp(dtorch.listen_address(), "d6")
        stranger.send(*forged_hello(6))
        assert "rebuild dtorch-worker" in _dead(6).reason
        stranger.announce((512 << 20) + 1)
        assert stranger.closed_by_peer(30)
        stranger.close()
        mesh = dtorch.DeviceMesh("cpu", [0, 1])
        a = np.arange(1 << 16, dtype=np.float32)
        x = dtorch.distribute_tensor(a, mesh, [dtorch.Shard(0)])
        np.testing.assert_array_equal((x * 2).redistribute(mesh, [dtorch.Replicate()]).numpy(), a * 2)
    finally:
        dtorch.shutdown()
        stop_all(procs)


def test_an_op_waits_for_a_worker_to_connect_then_runs(keys):
    dtorch.shutdown()
    dtorch.init(listen="tcp://127.0.0.1:*", worker_key=keys["good"])
    procs = []
    try:
        mesh = dtorch.DeviceMesh("cpu", [0, 1])
        with pytest.raises(TimeoutError, match=r"no worker has connected for device 0 in 1 s; start one"):
            dtorch.wait_for_workers([0, 1], timeout=1.0)
        assert dtorch.worker_info(0).state == "waiting"
        procs.append(start_worker(dtorch.listen_address(), "cpu:0-1", keys["good"], dtorch.controller_public_key()))
        x = dtorch.full((4,), 3.0, device_mesh=mesh, placements=[dtorch.Shard(0)])   # waits for them
        assert float(x.sum().numpy()) == 12.0
    finally:
        dtorch.shutdown()
        stop_all(procs)


def test_shutdown_says_bye_and_the_workers_leave(cluster):
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    assert float(dtorch.ones((4,), device_mesh=mesh, placements=[dtorch.Shard(0)]).sum().numpy()) == 4.0
    dtorch.shutdown()
    for p in cluster["procs"]:
        rc, took, err = wait_exit(p, 30)
        assert rc == 0, err


def test_a_worker_started_before_its_controller_waits_for_it(tmp_path, keys):
    """Launchers may start workers first: a worker waits for a first word up to --connect-timeout,
    so a controller with a key pair of its own (key=) that listens later still gets it."""
    ctl_key = str(tmp_path / "controller.key")
    ctl_public = dtorch.generate_keypair(ctl_key)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    dtorch.shutdown()
    procs = [start_worker(endpoint, "cpu:0-1", keys["good"], ctl_key)]   # a public key file works too
    try:
        time.sleep(1.5)
        dtorch.init(listen=endpoint, key=ctl_key, worker_key=keys["good_public"])
        assert dtorch.controller_public_key() == ctl_public and dtorch.listen_address() == endpoint
        infos = dtorch.wait_for_workers([0, 1], timeout=30)
        assert [i.state for i in infos] == ["serving", "serving"]
        mesh = dtorch.DeviceMesh("cpu", [0, 1])
        np.testing.assert_array_equal(dtorch.arange(4, device_mesh=mesh, placements=[dtorch.Shard(0)]).numpy(),
                                      np.arange(4))
    finally:
        dtorch.shutdown()
        stop_all(procs)
