"""Independent actor groups: does a long computation on one group delay another group's ops?

    .venv/bin/python bench/bench_groups.py [--workers thread|process] [--trips 200] [--runs 5]

Group A is the mesh [0, 1], group B the mesh [2, 3]. B's round trip is one 1-element op and its
fetch (`(full((1,), 2.0) * 3).numpy()`), measured (1) with A idle and (2) while A runs a matmul
chain of about 2 s (1024 x 1024, float32, Shard(0)); the reference is a hand-off to a Python
thread and back (threading.Event ping-pong, what any runtime thread costs a round trip) measured
in the same run. Also A's chain alone and with B's trips beside it. Median, p99 and max over
`--runs` runs of `--trips` trips (the spread is the runs' lowest and highest median). It prints
figures and never asserts on them.
"""
import argparse
import statistics
import threading
import time

import numpy as np

import dtorch
from dtorch import Replicate, Shard


def _trip(mesh):
    t0 = time.perf_counter()
    x = dtorch.full((1,), 2.0, device_mesh=mesh, placements=[Replicate()])
    (x * 3).numpy()
    return time.perf_counter() - t0


def _event_pingpong(trips):
    ping, pong, out = threading.Event(), threading.Event(), []

    def peer():
        for _ in range(trips):
            ping.wait()
            ping.clear()
            pong.set()

    t = threading.Thread(target=peer)
    t.start()
    for _ in range(trips):
        t0 = time.perf_counter()
        ping.set()
        pong.wait()
        pong.clear()
        out.append(time.perf_counter() - t0)
    t.join()
    return out


def _chain(mesh, steps):
    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32) / 32
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    w = dtorch.distribute_tensor(np.eye(1024, dtype=np.float32), mesh, [Replicate()])
    x.numpy()
    for _ in range(steps):
        x = x @ w
    return x.sum().future()


def _stats(samples):
    s = sorted(samples)
    return statistics.median(s), s[min(len(s) - 1, int(0.99 * len(s)))], s[-1]


def _line(name, runs):
    medians = [_stats(r)[0] for r in runs]
    flat = [v for r in runs for v in r]
    med, p99, mx = _stats(flat)
    print(f"  {name:44s} median {med * 1e6:8.1f} us  p99 {p99 * 1e6:8.1f} us  max {mx * 1e6:9.1f} us  "
          f"(run medians {min(medians) * 1e6:.1f}-{max(medians) * 1e6:.1f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="thread", choices=["thread", "process"])
    ap.add_argument("--trips", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    dtorch.init(workers=args.workers)
    a, b = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    for _ in range(20):
        _trip(b)
    t0 = time.perf_counter()
    _chain(a, 10).result()
    per = (time.perf_counter() - t0) / 10
    steps = max(1, int(2.0 / per))
    print(f"Actor groups side by side ({args.workers} workers); A's chain: {steps} matmuls of ~{per * 1e3:.0f} ms")
    ref = [_event_pingpong(args.trips) for _ in range(args.runs)]
    idle = [[_trip(b) for _ in range(args.trips)] for _ in range(args.runs)]
    busy, chain_alone, chain_with = [], [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        _chain(a, steps).result()
        chain_alone.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pending = _chain(a, steps)
        trips = []
        while not pending.done():
            trips.append(_trip(b))
        pending.result()
        chain_with.append(time.perf_counter() - t0)
        busy.append(trips)
    _line("reference: Python thread hand-off and back", ref)
    _line("B's op + fetch, A idle", idle)
    _line("B's op + fetch, A running its chain", busy)
    print(f"  B's trips during each chain: {[len(t) for t in busy]}")
    print(f"  A's chain: alone median {statistics.median(chain_alone):.2f} s, with B's trips beside it "
          f"{statistics.median(chain_with):.2f} s")
    dtorch.shutdown()


if __name__ == "__main__":
    main()
