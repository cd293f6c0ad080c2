"""Workers on other hosts, for real: two hosts with network stacks of their own (network namespaces
on a bridge, netns_hosts.py), a dtorch-worker on each serving two devices over tcp with CURVE, the
controller in this process. The seed example, redistributes between hosts and a Llama forward
match what one host computes; a stopped worker, a cut link and a killed controller are each
detected within the bound. Needs root and iproute2 (tools/run.sh installs it)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch.models import LlamaConfig, LlamaForCausalLM, parallelize_llama
from netns_hosts import Hosts
from conftest import wait_for
from remote_tools import WORKER, peer_messages_received, start_worker, stop_all, wait_exit

BOUND_S = 10.0   # liveness: 3 s by default; a wide margin for a loaded machine


@pytest.fixture(scope="module")
def hosts():
    h = Hosts(2)
    yield h
    h.remove()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("keys") / "worker.key")
    dtorch.generate_keypair(path)
    return path


@pytest.fixture
def cluster(hosts, keys):
    """Host 0 serves devices 0-1, host 1 devices 2-3; the controller listens on the bridge."""
    dtorch.shutdown()
    dtorch.init(listen=f"tcp://{hosts.controller}:*", worker_key=keys)
    endpoint, server_key = dtorch.listen_address(), dtorch.controller_public_key()
    procs = [start_worker(endpoint, f"cpu:{2 * k}-{2 * k + 1}", keys, server_key, prefix=hosts.prefix(k))
             for k in range(2)]
    infos = dtorch.wait_for_workers(4, timeout=30)
    yield {"procs": procs, "infos": infos, "endpoint": endpoint, "server_key": server_key}
    dtorch.shutdown()
    stop_all(procs)
    for k in range(2):
        hosts.mend(k)


def test_each_host_serves_its_devices_from_its_own_address(hosts, cluster):
    for info in cluster["infos"]:
        assert info.state == "serving" and info.remote
        assert info.peer.startswith(f"tcp://{hosts.addresses[info.device // 2]}:"), info


def _seed_example():
    dtorch.manual_seed(7)
    mesh = dtorch.DeviceMesh("cpu", [0, 2])
    x = dtorch.rand((4, 3), device_mesh=mesh, placements=[dtorch.Shard(0)])
    return f"{x=}", x.numpy()


def test_seed_example_matches_one_host(hosts, cluster):
    text, across = _seed_example()
    assert "Shard(dim=0)" in text and across.shape == (4, 3)
    dtorch.shutdown()
    dtorch.init(workers="thread")
    _, local = _seed_example()
    dtorch.shutdown()
    np.testing.assert_array_equal(across, local)
    assert 0 <= across.min() and across.max() < 1 and len(np.unique(across)) == 12


def test_redistributes_between_hosts(cluster):
    a = np.arange(96, dtype=np.float32).reshape(8, 12) / 9
    mesh = dtorch.init_device_mesh("cpu", (2, 2))   # rows: the two hosts
    before = peer_messages_received(mesh)
    x = dtorch.distribute_tensor(a, mesh, [dtorch.Shard(0), dtorch.Shard(1)])
    np.testing.assert_allclose(x.redistribute(mesh, [dtorch.Replicate(), dtorch.Replicate()]).numpy(), a)
    flat = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    y = dtorch.distribute_tensor(a, flat, [dtorch.Shard(1)]).redistribute(flat, [dtorch.Shard(0)])
    np.testing.assert_allclose(y.numpy(), a)
    parts = [a * (k + 1) for k in range(4)]
    p = dtorch.from_local([np.ascontiguousarray(q) for q in parts], flat, [dtorch.Partial()])
    np.testing.assert_allclose(p.redistribute(flat, [dtorch.Replicate()]).numpy(), a * 10, rtol=1e-6)
    after = peer_messages_received(mesh)
    assert all(n > b for n, b in zip(after, before)), (before, after)


def test_llama_forward_across_hosts_matches_the_reference(cluster):
    cfg = ref.tiny_config()
    sd = ref.random_weights(cfg, 3)
    ids = np.random.default_rng(5).integers(0, cfg["vocab_size"], (2, 7))
    want = ref.logits(sd, cfg, ids)
    for shape, names in (((2,), ("tp",)), ((2, 2), ("dp", "tp"))):
        mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
        if shape == (2,):
            mesh = dtorch.DeviceMesh("cpu", [1, 2], mesh_dim_names=names)   # one device on each host
        model = LlamaForCausalLM(LlamaConfig.from_dict(cfg), device_mesh=mesh)
        parallelize_llama(model, mesh)
        model.load_state_dict(sd, strict=not cfg.get("tie_word_embeddings"))
        model.tie_weights()
        got = model(ids).logits.numpy()
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4, names


def _pending_fetch(mesh, ops=2000):
    x = dtorch.zeros(64, device_mesh=mesh, placements=[dtorch.Shard(0)])
    for _ in range(ops):
        x = x + 1.0
    return x.future()


@pytest.mark.parametrize("how", ["sigstop", "link down"])
def test_a_silent_host_fails_its_devices_within_the_bound(hosts, cluster, how):
    mesh, other = dtorch.DeviceMesh("cpu", [0, 2]), dtorch.DeviceMesh("cpu", [0, 1])
    y = dtorch.arange(6, device_mesh=other, placements=[dtorch.Shard(0)])
    t0 = time.monotonic()
    if how == "sigstop":
        os.kill(cluster["procs"][1].pid, signal.SIGSTOP)
    else:
        hosts.cut(1)
    pending = _pending_fetch(mesh)   # what it waits for cannot be done now
    with pytest.raises(RuntimeError, match=r"device [23] died: its worker on host \S+ \(process \d+\) has been "
                                           r"silent for \d\.\d s \(the last op sent to it: add\)"):
        pending.result(timeout=30)
    took = time.monotonic() - t0
    assert took < BOUND_S
    print(f"\n{how}: failed after {took:.2f} s")
    np.testing.assert_array_equal(y.numpy(), np.arange(6))   # the other host's devices go on
    with pytest.raises(RuntimeError, match="device 2 is dead"):
        dtorch.ones((2,), device_mesh=mesh, placements=[dtorch.Shard(0)])
    # the failed host's worker, heard from no more, leaves by itself once it can tell. Each device is
    # declared dead by its own silence: its sibling on the host (3, idle) may cross the bound a little
    # later, and a worker process resumed before that would hear heartbeats for it again
    assert wait_for(lambda: all(dtorch.worker_info(d).state == "dead" for d in (2, 3)))
    if how == "sigstop":
        os.kill(cluster["procs"][1].pid, signal.SIGCONT)
    else:
        hosts.mend(1)
    rc, took, err = wait_exit(cluster["procs"][1], 30)
    assert rc == 1 and "has been silent" in err, err


_CONTROLLER = textwrap.dedent("""
    import sys, numpy as np, dtorch
    dtorch.init(listen=sys.argv[1], worker_key=sys.argv[2])
    print(dtorch.listen_address(), dtorch.controller_public_key(), flush=True)
    dtorch.wait_for_workers(4, timeout=30)
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    x = dtorch.distribute_tensor(np.arange(8, dtype=np.float32), mesh, [dtorch.Shard(0)])
    print(float(x.redistribute(mesh, [dtorch.Replicate()]).numpy().sum()), flush=True)
    x = x * 1.0
    sys.stdin.read()   # until the test kills it
""")


def test_workers_leave_when_the_controller_is_killed(hosts, keys):
    dtorch.shutdown()
    ctl = subprocess.Popen([sys.executable, "-c", _CONTROLLER, f"tcp://{hosts.controller}:*", keys],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    procs = []
    try:
        endpoint, server_key = ctl.stdout.readline().split()
        procs = [start_worker(endpoint, f"cpu:{2 * k}-{2 * k + 1}", keys, server_key, prefix=hosts.prefix(k))
                 for k in range(2)]
        assert float(ctl.stdout.readline()) == 28.0
        t0 = time.monotonic()
        ctl.kill()
        ctl.wait()
        for p in procs:
            rc, _, err = wait_exit(p, 30)
            assert rc == 1 and "has been silent" in err, err
        took = time.monotonic() - t0
        assert took < BOUND_S
        print(f"\nworkers left {took:.2f} s after the controller was killed")
    finally:
        if ctl.poll() is None:
            ctl.kill()
        stop_all(procs)
