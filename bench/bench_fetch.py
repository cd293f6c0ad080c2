"""What fetching a large DTensor costs (``x.numpy()``), beside numpy copying the same bytes in the
same run.

    /path/to/venv/bin/python bench/bench_fetch.py [--mib 64] [--repeats 15] [--modes thread process]

It imports the installed ``dtorch`` (nothing is added to sys.path), so build and install the
package first. It prints figures and never asserts on them.

For each worker mode, a float32 tensor of ``--mib`` MiB on a 2-device mesh, Replicate (one device
sends the whole value) and Shard(0) (each device sends half), is fetched with ``x.numpy()``
``--repeats`` times after 3 untimed fetches; each result is dropped before the next. The reference
is ``np.copyto(dst, src)`` of the same bytes into a destination written beforehand (single thread),
timed the same way in the same run. Figures are medians; ``DT/copy`` is the copy's time over the
fetch's (above 1: the fetch is faster than one copy of its bytes).
"""
import argparse
import statistics
import time

import numpy as np

import dtorch


def _median_s(fn, repeats, warmups=3):
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy_s(nbytes, repeats):
    src = np.full(nbytes // 4, 1.5, np.float32)
    dst = np.zeros_like(src)
    return _median_s(lambda: np.copyto(dst, src), repeats)


def _fetch_s(x, repeats):
    def once():
        value = x.numpy()
        del value

    return _median_s(once, repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--modes", nargs="+", default=["thread", "process"])
    args = ap.parse_args()
    nbytes = args.mib << 20
    side = int((nbytes // 4) ** 0.5)
    shape = (side, nbytes // 4 // side)
    print(f"x.numpy() of a {args.mib} MiB float32 tensor {shape} on 2 devices; median of {args.repeats}")
    print(f"  {'mode':8} {'placement':10} {'fetch ms':>9} {'GB/s':>7} {'copy ms':>8} {'GB/s':>7} {'DT/copy':>8}")
    for mode in args.modes:
        dtorch.shutdown()
        dtorch.init(workers=mode)
        mesh = dtorch.DeviceMesh("cpu", [0, 1])
        for name, placement in (("Replicate", dtorch.Replicate()), ("Shard(0)", dtorch.Shard(0))):
            x = dtorch.rand(shape, device_mesh=mesh, placements=[placement])
            dtorch.synchronize()
            fetch = _fetch_s(x, args.repeats)
            copy = _copy_s(nbytes, args.repeats)
            print(f"  {mode:8} {name:10} {fetch * 1e3:9.2f} {nbytes / fetch / 1e9:7.2f} {copy * 1e3:8.2f} "
                  f"{nbytes / copy / 1e9:7.2f} {copy / fetch:7.2f}x")
            del x
    dtorch.shutdown()


if __name__ == "__main__":
    main()
