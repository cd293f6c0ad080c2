"""How fast a dead or silent worker process fails what waits on it, over many trials.

    .venv/bin/python bench/bench_liveness.py [--kills 100] [--stops 20] [--ops 10000]

Process workers, a 2-device mesh [0, 1] and another mesh [2, 3] beside it. Each trial:
  * kill: 10k ops queued on the first mesh, a fetch of their result pending, then SIGKILL of
    device 1's worker: the time from the kill until the fetch fails (naming device 1), and the
    other mesh's value checked right after;
  * stop: a fetch pending on the first mesh, then SIGSTOP of device 1's worker: the time until the
    fetch fails as silent (the bound is DTORCH_SILENT_TIMEOUT, 3 s by default).
A trial that waits more than 30 s counts as a hang. The runtime restarts between trials. It
prints figures (median, max, hangs) and never asserts on them.
"""
import argparse
import os
import signal
import statistics
import time

import numpy as np

import dtorch


def _worker_pid(device):
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline") as f:
                argv = f.read().split("\0")
        except OSError:
            continue
        if ppid == me and "--device" in argv and argv[argv.index("--device") + 1] == str(device):
            return int(entry)
    raise RuntimeError(f"no worker process for device {device}")


def _trial(kind, ops):
    """(seconds until the pending fetch failed or None for a hang, the other mesh was right)."""
    dtorch.shutdown()
    dtorch.init(workers="process")
    mesh, other = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    x = dtorch.zeros(64, device_mesh=mesh, placements=[dtorch.Shard(0)])
    y = dtorch.arange(6, device_mesh=other, placements=[dtorch.Shard(0)])
    dtorch.synchronize()
    pid = _worker_pid(1)
    if kind == "kill":
        for _ in range(ops):
            x = x + 1.0
    pending = x.future()
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    try:
        pending.result(timeout=30)
        took = None                      # finished: the kill came too late to matter
    except TimeoutError:
        took = None
    except RuntimeError as e:
        took = time.monotonic() - t0 if "device 1" in str(e) else None
    ok = np.array_equal(y.numpy(), np.arange(6))
    if kind == "stop":
        os.kill(pid, signal.SIGKILL)
    return took, ok


def _report(kind, results):
    times = [t for t, _ in results if t is not None]
    hangs = sum(1 for t, _ in results if t is None)
    wrong = sum(1 for _, ok in results if not ok)
    if times:
        print(f"  {kind:5s} {len(results):4d} trials: failed after median {statistics.median(times) * 1e3:7.1f} ms, "
              f"max {max(times) * 1e3:7.1f} ms; hangs {hangs}; other mesh wrong {wrong}")
    else:
        print(f"  {kind:5s} {len(results):4d} trials: no failure seen; hangs {hangs}; other mesh wrong {wrong}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--stops", type=int, default=20)
    ap.add_argument("--ops", type=int, default=10_000)
    args = ap.parse_args()
    print(f"Liveness of worker processes (DTORCH_SILENT_TIMEOUT={os.environ.get('DTORCH_SILENT_TIMEOUT', '3 (default)')})")
    _report("kill", [_trial("kill", args.ops) for _ in range(args.kills)])
    _report("stop", [_trial("stop", args.ops) for _ in range(args.stops)])
    dtorch.shutdown()


if __name__ == "__main__":
    main()
