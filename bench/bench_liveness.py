"""How fast a dead or silent worker process fails what waits on it, over many trials.

    .venv/bin/python bench/bench_liveness.py [--kills 100] [--stops 20] [--ops 10000]

Process workers, a 2-device mesh [0, 1] and another mesh [2, 3] beside it. Each trial:
  * kill: 10k ops queued on the first mesh, a fetch of their result pending, then SIGKILL of
    device 1's worker: the time from the kill until the fetch fails (naming device 1), and the
    other mesh's value checked right after;
  * stop: the same queue and pending fetch, then SIGSTOP of device 1's worker: the time until the
    fetch fails as silent (the bound is DTORCH_SILENT_TIMEOUT, 3 s by default).
A trial that waits more than 30 s counts as a hang; one whose work was done before the signal
landed counts apart. The runtime restarts between trials. It
prints figures (median, max, hangs) and never asserts on them.
"""
import argparse
import os
import signal
import statistics
import time

import numpy as np

import dtorch
from bench_parallel import _worker_pids


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
