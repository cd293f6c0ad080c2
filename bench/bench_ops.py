"""Per-op cost of DTorch on the user's Python thread, beside numpy measured in the same run.

    /path/to/venv/bin/python bench/bench_ops.py [--n 100000] [--repeats 5] [--fetches 5000]
                                                [--modes thread,process] [--device cpu]

It imports the installed ``dtorch`` (nothing is added to sys.path), so build and install the
package first. It prints figures and never asserts on them.

Figures, for thread workers and then process workers (``dtorch.init(workers=...)``):
  * ``dtorch.full((4,), 1.0, device_mesh=mesh)`` on a 2-device mesh, n times in a loop: µs per op
    for the loop alone (what the user's thread pays) and including the closing
    ``dtorch.synchronize()`` (what the devices need to keep up); beside ``np.full((4,), 1.0)``.
    Best of ``--repeats`` runs: noise on a shared machine only ever adds time.
  * ``c = a + b`` of two 1-element DTensors on a 2-device mesh (the per-op path of every op:
    a Python operator into the op registry), loop alone and with ``synchronize()``, beside
    numpy's own ``a + b`` on 1-element arrays; the ops/s the mesh sustains end to end follow.
  * ``c = a @ b`` of two (4, 4) float32 DTensors on the same mesh (Replicate): the same path with
    a product, beside numpy's ``a @ b``.
  * ``x.numpy()`` of an existing 4-element DTensor: the fetch round trip, median and p90.
  * ``dtorch.full(...).numpy()``: one op plus its fetch, median and p90.
  * A chain of k ``x + 1.0`` on a 1-element DTensor (k = 10, 100, 1000), called as a Python
    function (k ops issued one by one) and replayed by ``dtorch.capture`` (one record per device):
    µs per call: the user thread's CPU time in the loop, and the wall time with ``synchronize()``,
    beside numpy's k adds on a 1-element array.

With ``--activations``, instead: silu and gelu_tanh (``F.gelu(x, approximate="tanh")``) of 1M and
16M float32 elements on a 1-device mesh, each call with its ``synchronize()``, median ms of
``--repeats`` calls after one warm-up (set ``--repeats`` to 11 or so), beside numpy's float32
``x / (1 + exp(-x))`` (silu) in the same run.
"""
import argparse
import os
import statistics
import time

import numpy as np

import dtorch


def _best(fn, repeats):
    """The smallest of ``repeats`` results of fn() (a tuple is compared element by element,
    each element keeping its own best)."""
    runs = [fn() for _ in range(repeats)]
    if isinstance(runs[0], tuple):
        return tuple(min(r[i] for r in runs) for i in range(len(runs[0])))
    return min(runs)


def _numpy_loop(n):
    full = np.full
    t0 = time.perf_counter()
    for _ in range(n):
        full((4,), 1.0)
    return time.perf_counter() - t0


def _empty_loop(n):
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - t0


def _dtorch_loop(n, mesh):
    # each result is dropped at once, as in a training loop: its devices free it as they go
    full = dtorch.full
    t0 = time.perf_counter()
    for _ in range(n):
        full((4,), 1.0, device_mesh=mesh)
    t1 = time.perf_counter()
    dtorch.synchronize()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0


def _numpy_add_loop(n):
    a, b = np.ones(1, np.float32), np.ones(1, np.float32)
    t0 = time.perf_counter()
    for _ in range(n):
        c = a + b
    return time.perf_counter() - t0


def _dtorch_add_loop(n, mesh):
    a, b = dtorch.ones(1, device_mesh=mesh), dtorch.ones(1, device_mesh=mesh)
    dtorch.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        c = a + b
    t1 = time.perf_counter()
    dtorch.synchronize()
    t2 = time.perf_counter()
    if c.numpy().tolist() != [2.0]:
        raise SystemExit("bench_ops: a + b gave a wrong value")
    return t1 - t0, t2 - t0


def _numpy_matmul_loop(n):
    a, b = np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)
    t0 = time.perf_counter()
    for _ in range(n):
        c = a @ b
    return time.perf_counter() - t0


def _dtorch_matmul_loop(n, mesh):
    a, b = dtorch.ones(4, 4, device_mesh=mesh), dtorch.ones(4, 4, device_mesh=mesh)
    dtorch.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        c = a @ b
    t1 = time.perf_counter()
    dtorch.synchronize()
    t2 = time.perf_counter()
    if c.numpy().tolist() != [[4.0] * 4] * 4:
        raise SystemExit("bench_ops: a @ b gave a wrong value")
    return t1 - t0, t2 - t0


CHAINS = (10, 100, 1000)


def _chain(x, k):
    for _ in range(k):
        x = x + 1.0
    return x


def _numpy_chain(k, calls):
    x = np.zeros(1, np.float32)
    t0 = time.perf_counter()
    for _ in range(calls):
        _chain(x, k)
    return time.perf_counter() - t0


def _dtorch_chain(k, calls, mesh, replay):
    """(user-thread CPU s of the loop, wall s of loop + synchronize) for `calls` calls of the k-op
    chain (CPU time: on 2 cores the device threads preempt the user's, which wall time would count)."""
    x = dtorch.full((1,), 0.0, device_mesh=mesh)
    fn = dtorch.capture(lambda t: _chain(t, k)) if replay else (lambda t: _chain(t, k))
    fn(x).numpy()                      # recorded (and checked) before the timing
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(calls):
        y = fn(x)
    c1 = time.thread_time()
    dtorch.synchronize()
    t2 = time.perf_counter()
    assert float(y.numpy()[0]) == k
    return c1 - c0, t2 - t0


def _percentiles(samples):
    samples = sorted(samples)
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def _fetch_samples(n, mesh):
    x = dtorch.full((4,), 1.0, device_mesh=mesh)
    for _ in range(min(n, 500)):  # warm-up: connections, pools, caches
        x.numpy()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        value = x.numpy()
        out.append(time.perf_counter() - t0)
    if value.shape != (4,) or not (value == 1.0).all():
        raise SystemExit(f"bench_ops: fetched a wrong value {value!r}")
    return _percentiles(out)


def _op_fetch_samples(n, mesh):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        dtorch.full((4,), 1.0, device_mesh=mesh).numpy()
        out.append(time.perf_counter() - t0)
    return _percentiles(out)


def _mode(workers, args):
    dtorch.shutdown()
    dtorch.init(workers=workers)
    mesh = dtorch.DeviceMesh(args.device, [0, 1])
    _dtorch_loop(args.n // 10, mesh)  # warm-up: steady-state pools and credit windows
    loop_s, total_s = _best(lambda: _dtorch_loop(args.n, mesh), args.repeats)
    _dtorch_add_loop(args.n // 10, mesh)
    add_loop_s, add_total_s = _best(lambda: _dtorch_add_loop(args.n, mesh), args.repeats)
    _dtorch_matmul_loop(args.n // 10, mesh)
    mm_loop_s, mm_total_s = _best(lambda: _dtorch_matmul_loop(args.n, mesh), args.repeats)
    fetch = _fetch_samples(args.fetches, mesh)
    op_fetch = _op_fetch_samples(args.fetches, mesh)
    chains = {}
    for k in CHAINS:
        calls = max(20, args.n // (10 * k))
        for replay in (False, True):
            loop, total = _best(lambda: _dtorch_chain(k, calls, mesh, replay), args.repeats)
            chains[k, replay] = (loop / calls * 1e6, total / calls * 1e6)
    dtorch.shutdown()
    return {"loop_us": loop_s / args.n * 1e6, "total_us": total_s / args.n * 1e6,
            "add_us": add_loop_s / args.n * 1e6, "add_total_us": add_total_s / args.n * 1e6,
            "mm_us": mm_loop_s / args.n * 1e6, "mm_total_us": mm_total_s / args.n * 1e6,
            "fetch_us": tuple(v * 1e6 for v in fetch), "op_fetch_us": tuple(v * 1e6 for v in op_fetch),
            "chains": chains}


def _activations(args):
    dtorch.shutdown()
    dtorch.init(workers="thread")
    mesh = dtorch.DeviceMesh(args.device, [0])
    F = dtorch.nn.functional
    ops = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}
    print(f"activations: dtorch {dtorch.__version__} from {os.path.dirname(dtorch.__file__)}, one {args.device} "
          f"device, median of {args.repeats} calls (ms)")
    print(f"  {'op':10} {'elements':>9} {'DTorch':>9} {'numpy silu':>11}")
    for n in (1 << 20, 1 << 24):
        a = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 4
        x = dtorch.distribute_tensor(a, mesh)
        np_times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            a / (np.float32(1) + np.exp(-a))
            np_times.append(time.perf_counter() - t0)
        for name, op in ops.items():
            op(x)
            dtorch.synchronize()
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                y = op(x)
                dtorch.synchronize()
                times.append(time.perf_counter() - t0)
                del y
            print(f"  {name:10} {n:9d} {statistics.median(times) * 1e3:9.2f} {statistics.median(np_times) * 1e3:11.2f}")
    dtorch.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="ops per timed loop")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops; the best is kept")
    parser.add_argument("--fetches", type=int, default=5000, help="timed fetch round trips")
    parser.add_argument("--modes", default="thread,process", help="comma-separated worker modes")
    parser.add_argument("--device", default="cpu", help="the mesh's device type (cuda: two actors per GPU)")
    parser.add_argument("--activations", action="store_true", help="time silu and gelu_tanh of 1M and 16M floats")
    args = parser.parse_args()
    if args.activations:
        _activations(args)
        return

    np_us = _best(lambda: _numpy_loop(args.n), args.repeats) / args.n * 1e6
    np_add_us = _best(lambda: _numpy_add_loop(args.n), args.repeats) / args.n * 1e6
    np_mm_us = _best(lambda: _numpy_matmul_loop(args.n), args.repeats) / args.n * 1e6
    empty_us = _best(lambda: _empty_loop(args.n), args.repeats) / args.n * 1e6
    results = {m: _mode(m, args) for m in args.modes.split(",")}

    print(f"DTorch per-op cost from Python: dtorch {dtorch.__version__} from {os.path.dirname(dtorch.__file__)}, "
          f"a {args.device} mesh of 2 devices")
    print(f"  numpy {np.__version__}; {os.cpu_count()} CPUs; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; loops of {args.n}, best of {args.repeats}; "
          f"{args.fetches} timed fetches")
    print(f"  reference: np.full((4,), 1.0) = {np_us:.3f} us per call; an empty Python loop = "
          f"{empty_us * 1e3:.1f} ns per iteration")
    print()
    print(f"  {'figure (us per op)':46} {'workers':8} {'DTorch':>9} {'numpy':>9} {'DT/numpy':>9}")
    for mode, r in results.items():
        print(f"  {'full((4,), 1.0) loop only (user thread)':46} {mode:8} {r['loop_us']:9.3f} {np_us:9.3f} "
              f"{r['loop_us'] / np_us:8.1f}x")
        print(f"  {'full((4,), 1.0) loop + synchronize()':46} {mode:8} {r['total_us']:9.3f} {np_us:9.3f} "
              f"{r['total_us'] / np_us:8.1f}x")
    print()
    print(f"  reference: numpy a + b on 1-element float32 arrays = {np_add_us:.3f} us per op (target: DTorch <= 3x)")
    print(f"  {'figure (us per op)':46} {'workers':8} {'DTorch':>9} {'numpy':>9} {'DT/numpy':>9}")
    for mode, r in results.items():
        print(f"  {'a + b, 1 element, 2 devices: loop only':46} {mode:8} {r['add_us']:9.3f} {np_add_us:9.3f} "
              f"{r['add_us'] / np_add_us:8.1f}x")
        print(f"  {'a + b, 1 element, 2 devices: + synchronize()':46} {mode:8} {r['add_total_us']:9.3f} "
              f"{np_add_us:9.3f} {r['add_total_us'] / np_add_us:8.1f}x   ({1 / r['add_total_us']:.2f} M ops/s "
              f"end to end)")
    print()
    print(f"  reference: numpy a @ b on (4, 4) float32 arrays = {np_mm_us:.3f} us per op")
    print(f"  {'figure (us per op)':46} {'workers':8} {'DTorch':>9} {'numpy':>9} {'DT/numpy':>9}")
    for mode, r in results.items():
        print(f"  {'a @ b, (4, 4), 2 devices: loop only':46} {mode:8} {r['mm_us']:9.3f} {np_mm_us:9.3f} "
              f"{r['mm_us'] / np_mm_us:8.1f}x")
        print(f"  {'a @ b, (4, 4), 2 devices: + synchronize()':46} {mode:8} {r['mm_total_us']:9.3f} "
              f"{np_mm_us:9.3f} {r['mm_total_us'] / np_mm_us:8.1f}x")
    print()
    print(f"  {'round trip (us)':46} {'workers':8} {'median':>9} {'p90':>9}")
    for mode, r in results.items():
        print(f"  {'x.numpy() of a 4-element DTensor':46} {mode:8} {r['fetch_us'][0]:9.1f} {r['fetch_us'][1]:9.1f}")
        print(f"  {'full((4,), 1.0).numpy(): op + fetch':46} {mode:8} {r['op_fetch_us'][0]:9.1f} "
              f"{r['op_fetch_us'][1]:9.1f}")
    print()
    print("  a chain of k `x + 1.0` (1 element, 2 devices), us per call: issued op by op vs replayed by dtorch.capture;")
    print("  loop = the user thread's CPU time, + sync = wall time to the end of the devices' work")
    print(f"  {'k':>6} {'workers':8} {'numpy':>9} {'ops: loop':>10} {'+ sync':>9} {'replay: loop':>13} {'+ sync':>9} "
          f"{'loop ratio':>11}")
    for k in CHAINS:
        calls = max(20, args.n // (10 * k))
        np_call = _best(lambda: _numpy_chain(k, calls), args.repeats) / calls * 1e6
        for mode, r in results.items():
            (ops_loop, ops_total), (rep_loop, rep_total) = r["chains"][k, False], r["chains"][k, True]
            print(f"  {k:6d} {mode:8} {np_call:9.2f} {ops_loop:10.2f} {ops_total:9.2f} {rep_loop:13.2f} "
                  f"{rep_total:9.2f} {ops_loop / rep_loop:10.1f}x")


if __name__ == "__main__":
    main()
