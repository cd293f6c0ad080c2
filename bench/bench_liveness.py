"""How fast a dead or silent worker process fails what waits on it, over many trials.

    .venv/bin/python bench/bench_liveness.py [--kills 100] [--stops 20] [--ops 10000]

Process workers, a 2-device mesh [0, 1] and another mesh [2, 3] beside it. Each trial:
  * kill: 10k ops queued on the first mesh, a fetch of their result pending, then SIGKILL of
    device 1's worker: the time from the kill until the fetch fails (naming device 1), and the
    other mesh's value checked right after;
  * stop: the same queue and pending fetch, then SIGSTOP of device 1's worker: the time until the
    fetch fails as silent (the bound is DTORCH_SILENT_TIMEOUT, 3 s by default).
A trial that waits more than 30 s counts as a hang; one whose work was done before the signal
landed counts apart. The runtime restarts between trials.

Across hosts (--remote-stops, --cuts; root, iproute2): two hosts with network stacks of their own
(namespaces on a bridge, tests/python/netns_hosts.py), a dtorch-worker over tcp with CURVE on each
serving two devices, the controller listening here. Each trial SIGSTOPs host 1's worker (or takes
its link down), then queues ops on a mesh of one device per host and fetches: the time until the
fetch fails as silent, and the other host's mesh checked. Last, the controller itself is killed
(a child process) and the time until both workers have left is measured.

It prints figures (median, max, hangs) and never asserts on them.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import dtorch
from bench_parallel import _worker_pids

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from netns_hosts import Hosts  # noqa: E402  (the tests' hosts of their own and worker starter)
from remote_tools import start_worker, stop_all, wait_exit  # noqa: E402


def _trial(kind, ops):
    """(outcome, seconds until the pending fetch failed, the other mesh was right); outcome is
    "failed", "finished" (the work was done before the signal landed) or "hang"."""
    dtorch.shutdown()
    dtorch.init(workers="process")
    mesh, other = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    x = dtorch.zeros(64, device_mesh=mesh, placements=[dtorch.Shard(0)])
    y = dtorch.arange(6, device_mesh=other, placements=[dtorch.Shard(0)])
    dtorch.synchronize()
    pid = _worker_pids()[1]
    for _ in range(ops):
        x = x + 1.0
    pending = x.future()
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    outcome, took = "finished", None
    try:
        pending.result(timeout=30)
    except TimeoutError:
        outcome = "hang"
    except RuntimeError as e:
        outcome, took = ("failed", time.monotonic() - t0) if "device 1" in str(e) else ("hang", None)
    ok = np.array_equal(y.numpy(), np.arange(6))
    if kind == "stop":
        os.kill(pid, signal.SIGKILL)
    return outcome, took, ok


def _report(kind, results):
    times = [t for outcome, t, _ in results if outcome == "failed"]
    hangs = sum(1 for outcome, _, _ in results if outcome == "hang")
    finished = sum(1 for outcome, _, _ in results if outcome == "finished")
    wrong = sum(1 for _, _, ok in results if not ok)
    failed = (f"failed after median {statistics.median(times) * 1e3:7.1f} ms, max {max(times) * 1e3:7.1f} ms"
              if times else "none failed")
    print(f"  {kind:5s} {len(results):4d} trials: {failed}; finished before the signal {finished}; hangs {hangs}; "
          f"other mesh wrong {wrong}")


def _remote_trial(kind, hosts, keys, ops):
    """One trial across hosts: as _trial, with the signal (or the cut link) before the ops."""
    dtorch.shutdown()
    dtorch.init(listen=f"tcp://{hosts.controller}:*", worker_key=keys)
    endpoint, server_key = dtorch.listen_address(), dtorch.controller_public_key()
    procs = [start_worker(endpoint, f"cpu:{2 * k}-{2 * k + 1}", keys, server_key, prefix=hosts.prefix(k))
             for k in range(2)]
    try:
        dtorch.wait_for_workers(4, timeout=30)
        mesh, other = dtorch.DeviceMesh("cpu", [0, 2]), dtorch.DeviceMesh("cpu", [0, 1])
        y = dtorch.arange(6, device_mesh=other, placements=[dtorch.Shard(0)])
        dtorch.synchronize()
        t0 = time.monotonic()
        if kind == "stop":
            os.kill(procs[1].pid, signal.SIGSTOP)
        else:
            hosts.cut(1)
        x = dtorch.zeros(64, device_mesh=mesh, placements=[dtorch.Shard(0)])
        for _ in range(ops):
            x = x + 1.0
        outcome, took = "finished", None
        try:
            x.future().result(timeout=30)
        except TimeoutError:
            outcome = "hang"
        except RuntimeError as e:
            outcome, took = ("failed", time.monotonic() - t0) if "silent" in str(e) else ("hang", None)
        return outcome, took, np.array_equal(y.numpy(), np.arange(6))
    finally:
        dtorch.shutdown()
        hosts.mend(1)
        stop_all(procs)


_CONTROLLER = """
import sys, dtorch
dtorch.init(listen=sys.argv[1], worker_key=sys.argv[2])
print(dtorch.listen_address(), dtorch.controller_public_key(), flush=True)
dtorch.wait_for_workers(4, timeout=30)
print("ready", flush=True)
sys.stdin.read()
"""


def _orphan_trial(hosts, keys):
    """Seconds from a SIGKILL of the controller until both hosts' workers have left."""
    dtorch.shutdown()
    ctl = subprocess.Popen([sys.executable, "-c", _CONTROLLER, f"tcp://{hosts.controller}:*", keys],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    endpoint, server_key = ctl.stdout.readline().split()
    procs = [start_worker(endpoint, f"cpu:{2 * k}-{2 * k + 1}", keys, server_key, prefix=hosts.prefix(k))
             for k in range(2)]
    ctl.stdout.readline()
    t0 = time.monotonic()
    ctl.kill()
    ctl.wait()
    left = [wait_exit(p, 30)[0] is not None for p in procs]
    took = time.monotonic() - t0
    stop_all(procs)
    return ("failed" if all(left) else "hang"), took, True


def _remote(args):
    hosts = Hosts(2)
    try:
        keys = os.path.join(tempfile.mkdtemp(), "worker.key")
        dtorch.generate_keypair(keys)
        print("Liveness across hosts (tcp + CURVE between network namespaces):")
        _report("stop", [_remote_trial("stop", hosts, keys, args.ops) for _ in range(args.remote_stops)])
        _report("cut", [_remote_trial("cut", hosts, keys, args.ops) for _ in range(args.cuts)])
        results = [_orphan_trial(hosts, keys) for _ in range(args.orphans)]
        times = [t for outcome, t, _ in results if outcome == "failed"]
        print(f"  controller killed {len(results)} trials: workers gone after median {statistics.median(times):.2f} s, "
              f"max {max(times):.2f} s; still running after 30 s {len(results) - len(times)}")
    finally:
        hosts.remove()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--stops", type=int, default=20)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--remote-stops", type=int, default=0, help="SIGSTOP trials across hosts (e.g. 20)")
    ap.add_argument("--cuts", type=int, default=0, help="cut-link trials across hosts (e.g. 20)")
    ap.add_argument("--orphans", type=int, default=5, help="controller kills, with --remote-stops or --cuts")
    args = ap.parse_args()
    print(f"Liveness of worker processes (DTORCH_SILENT_TIMEOUT={os.environ.get('DTORCH_SILENT_TIMEOUT', '3 (default)')})")
    _report("kill", [_trial("kill", args.ops) for _ in range(args.kills)])
    _report("stop", [_trial("stop", args.ops) for _ in range(args.stops)])
    dtorch.shutdown()
    if args.remote_stops or args.cuts:
        _remote(args)


if __name__ == "__main__":
    main()
