"""What a view of a large DTensor costs its devices, beside numpy's copy of the same bytes.

    .venv/bin/python bench/bench_views.py            # --mib 64 --repeats 21 --modes thread,process

A float32 tensor of ``--mib`` MiB on a 2-device mesh, each device holding half. Every row is one
op issued and waited for (``op; dtorch.synchronize()``), the median and the spread (min-max) of
``--repeats`` after 3 untimed ones, the result dropped before the next:

  * ``x.reshape(...)``, ``x.flatten()``, ``x.unsqueeze(0)`` of a (rows, cols) tensor on Shard(0);
  * ``y[1]`` and ``y.narrow(0, 1, 2)`` of a (4, rows / 4, cols) tensor on Shard(1): one contiguous
    run of each device's piece;
  * ``x[:, 0]``, ``x.t()``, ``x[:, ::2]``: strided views, made on the controller alone;
  * ``x[:, 0] + 0`` and ``x.t() + 0``: an op that reads a strided view (each device gathers its
    part: 0.5 KiB of the column, half the tensor for the transpose) beside ``x + 0``, the same op
    on the contiguous tensor.

Beside them, in the same run: ``np.copyto`` of one device's piece into a buffer written beforehand
(what a device pays to copy its piece), and a round trip that does nothing on the devices
(``dtorch.synchronize()`` alone). ``bytes`` is what ``memory_stats`` says the result holds on
device 0, beyond its input. It imports the installed ``dtorch``; it prints figures, never asserts.
"""
import argparse
import gc
import statistics
import time

import numpy as np

import dtorch
from dtorch import Shard


def _times(fn, repeats):
    """Seconds per call of fn (which waits for its own result): median, min, max."""
    for _ in range(3):
        fn()
    runs = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), min(runs), max(runs)


def _held(mesh):
    return dtorch.memory_stats(mesh)[0]["bytes_in_use"]


def _mode(workers, args):
    dtorch.shutdown()
    dtorch.init(workers=workers)
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    cols = 4096
    rows = args.mib * (1 << 20) // (4 * cols)
    x = dtorch.rand((rows, cols), device_mesh=mesh, placements=[Shard(0)])
    y = dtorch.rand((4, rows // 4, cols), device_mesh=mesh, placements=[Shard(1)])
    dtorch.synchronize()
    piece = np.ones((rows // 2, cols), np.float32)
    dst = np.zeros_like(piece)
    ops = [
        (f"x.reshape({rows}, 64, {cols // 64})", lambda: x.reshape(rows, 64, cols // 64)),
        ("x.flatten()", lambda: x.flatten()),
        ("x.unsqueeze(0)", lambda: x.unsqueeze(0)),
        ("y[1]", lambda: y[1]),
        ("y.narrow(0, 1, 2)", lambda: y.narrow(0, 1, 2)),
        ("x[:, 0] (strided)", lambda: x[:, 0]),
        ("x.t() (strided)", lambda: x.t()),
        ("x[:, ::2] (strided)", lambda: x[:, ::2]),
        ("x + 0", lambda: x + 0),
        ("x[:, 0] + 0 (gathers a column)", lambda: x[:, 0] + 0),
        ("x.t() + 0 (gathers the transpose)", lambda: x.t() + 0),
    ]
    print(f"\n{workers} workers: x ({rows}, {cols}) float32 = {args.mib} MiB on 2 devices, "
          f"{args.mib / 2:g} MiB each; median (min-max) ms of {args.repeats}")
    copy = _times(lambda: np.copyto(dst, piece), args.repeats)
    sync = _times(dtorch.synchronize, args.repeats)
    print(f"  {'np.copyto of one piece':34s} {copy[0] * 1e3:8.3f} ({copy[1] * 1e3:.3f}-{copy[2] * 1e3:.3f})")
    print(f"  {'dtorch.synchronize() alone':34s} {sync[0] * 1e3:8.3f} ({sync[1] * 1e3:.3f}-{sync[2] * 1e3:.3f})")
    for name, op in ops:
        def run():
            z = op()
            dtorch.synchronize()
            del z
        t = _times(run, args.repeats)
        before = _held(mesh)
        z = op()
        extra = _held(mesh) - before
        del z
        print(f"  {name:34s} {t[0] * 1e3:8.3f} ({t[1] * 1e3:.3f}-{t[2] * 1e3:.3f})   bytes {extra}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB of the viewed tensor")
    parser.add_argument("--repeats", type=int, default=21, help="timed calls per row")
    parser.add_argument("--modes", default="thread,process", help="comma-separated worker modes")
    args = parser.parse_args()
    for workers in args.modes.split(","):
        _mode(workers, args)
    dtorch.shutdown()


if __name__ == "__main__":
    main()
