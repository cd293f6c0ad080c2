"""Pipeline and context parallelism on the Llama, each figure beside its reference from the same run.

    .venv/bin/python bench/bench_parallel.py [--parts pp,cp,controller] [--shape 110M] [--repeats 3]
                                             [--pp-batch 32] [--pp-seq 128] [--pp-decode-batch 8]
                                             [--pp-modes thread,process]
                                             [--cp-seq 1024]

It imports the installed ``dtorch`` and the random-weight checkpoints of bench_llama.py (written once
into ``bench/.cache/``). It prints figures and never asserts on them. Medians of ``--repeats``,
spread min-max.

  * pp: a pp2 mesh (thread and process workers, ``--pp-modes``) with 1, 2, 4 and 8 micro-batches:
    prefill of a batch of ``--pp-batch`` sequences of ``--pp-seq`` tokens and greedy decode of
    ``--pp-decode-batch`` sequences (tokens/s), and each stage's busy fraction (its worker's CPU
    time over the wall time, from /proc: the process, or the thread named dtorch-dev<id>; idle
    workers block, so CPU time is work). Reference: the same pp2 mesh with 1 micro-batch
    (stages take turns), and one device. Each call waits for its logits, so the pipeline fills
    and drains in every run (its bubble is in the figure).
  * cp: prefill of ``--cp-seq`` tokens on one device, ring2 and ulysses2 (thread workers): tokens/s
    and the peak bytes each device held (dtorch.device_stats).
  * controller: the user thread's CPU time per decode step on dp2 x tp2 x pp2 (8 devices) beside one
    device, and DTorch ops per step: it should grow with the devices touched, not faster.
"""
import argparse
import os
import statistics
import time

import numpy as np

import dtorch
from bench_llama import _checkpoint, _ops_submitted
from dtorch.models import LlamaForCausalLM


def _median(fn, repeats):
    runs = [fn() for _ in range(repeats)]
    if isinstance(runs[0], tuple):
        return tuple(statistics.median(r[i] for r in runs) for i in range(len(runs[0]))), runs
    return statistics.median(runs), runs


def _spread(runs, i=None):
    values = [r[i] if i is not None else r for r in runs]
    return f"{min(values):.1f}-{max(values):.1f}"


def _worker_pids():
    """{device: pid} of this process's dtorch-worker children."""
    me, found = os.getpid(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and any(b"dtorch-worker" in a for a in argv) and b"--device" in argv:
            found[int(argv[argv.index(b"--device") + 1])] = int(entry)
    return found


def _worker_threads():
    """{device: path of its /proc stat} of this process's worker threads (named dtorch-dev<id>)."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith("dtorch-dev"):
            found[int(name[len("dtorch-dev"):])] = f"/proc/self/task/{tid}/stat"
    return found


def _workers():
    """{device: its /proc stat path}: worker processes, else worker threads."""
    return {d: f"/proc/{pid}/stat" for d, pid in _worker_pids().items()} or _worker_threads()


def _cpu_seconds(stat):
    with open(stat) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy(fn, devices):
    """(fn's wall seconds, each device's busy fraction over it)."""
    stats = _workers()
    before = [_cpu_seconds(stats[d]) for d in devices]
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return wall, [(_cpu_seconds(stats[d]) - b) / wall for d, b in zip(devices, before)]


def _load(directory, shape, names, **plan):
    mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
    return LlamaForCausalLM.from_pretrained(directory, device_mesh=mesh, progress=False, **plan)


def bench_pp(directory, args, mode):
    dtorch.shutdown()
    dtorch.init(workers=mode)
    B, T, Bd, new = args.pp_batch, args.pp_seq, args.pp_decode_batch, 16
    ids = np.random.default_rng(0).integers(0, 32000, (max(B, Bd), T))
    print(f"\n== pp: prefill of {B} sequences of {T} tokens, {new}-token greedy decode of {Bd} sequences "
          f"({mode} workers)")

    def prefill(model):
        model(ids[:B], logits_to_keep=1).logits.numpy()

    def decode(model):
        for _ in model.stream(ids[:Bd, :8], new, eos_token_id=None):
            pass

    one = _load(directory, (1,), None)
    prefill(one)
    rate, runs = _median(lambda: B * T / _busy(lambda: prefill(one), [0])[0], args.repeats)
    print(f"  one device              prefill {rate:8.1f} tok/s ({_spread(runs)})")
    rate, runs = _median(lambda: Bd * new / _busy(lambda: decode(one), [0])[0], args.repeats)
    print(f"  one device              decode  {rate:8.1f} tok/s ({_spread(runs)})")
    del one
    base = {}
    for micro in (1, 2, 4, 8):
        model = _load(directory, (2,), ("pp",), num_microbatches=micro)
        prefill(model)
        for what, fn, count in (("prefill", prefill, B * T), ("decode ", decode, Bd * new)):
            runs = [_busy(lambda: fn(model), [0, 1]) for _ in range(args.repeats)]
            rates = [count / wall for wall, _ in runs]
            rate = statistics.median(rates)
            busy = [statistics.median(r[1][s] for r in runs) for s in range(2)]
            base.setdefault(what, rate)
            print(f"  pp2 {micro} micro-batch{'es' if micro > 1 else '  '}  {what} {rate:8.1f} tok/s "
                  f"({_spread(rates)}), {rate / base[what]:.2f}x the 1-micro-batch run; stage busy "
                  f"{busy[0]:.0%} / {busy[1]:.0%}")
        del model


def bench_cp(directory, args):
    dtorch.shutdown()
    dtorch.init(workers="thread")
    T = args.cp_seq
    ids = np.random.default_rng(1).integers(0, 32000, (1, T))
    print(f"\n== cp: prefill of {T} tokens (thread workers); peak bytes held per device during the forward")
    for label, shape, names in (("one device", (1,), None), ("ring2", (2,), ("ring",)),
                                ("ulysses2", (2,), ("ulysses",))):
        model = _load(directory, shape, names)
        mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
        model(ids[:, :64], logits_to_keep=1).logits.numpy()

        def run():
            base = [s["bytes_in_use"] for s in dtorch.device_stats(mesh, reset_peak=True)]
            t0 = time.perf_counter()
            model(ids, logits_to_keep=1).logits.numpy()
            wall = time.perf_counter() - t0
            peaks = [s["peak_bytes"] - b for s, b in zip(dtorch.device_stats(mesh), base)]
            return T / wall, max(peaks) / 2**20

        (rate, peak), runs = _median(run, args.repeats)
        print(f"  {label:10s} {rate:8.1f} tok/s ({_spread(runs, 0)}), peak {peak:7.1f} MiB per device above "
              "the weights")
        del model


def bench_controller(directory, args):
    dtorch.shutdown()
    dtorch.init(workers="thread")
    B, new = 4, 24
    prompt = np.full((B, 8), 7, np.int64)
    print(f"\n== controller: user-thread CPU per decode step (batch {B}, thread workers)")
    rows = []
    for label, shape, names in (("one device", (1,), None), ("dp2 x tp2 x pp2", (2, 2, 2), ("dp", "tp", "pp"))):
        model = _load(directory, shape, names)

        def run():
            steps = model.stream(prompt, new, eos_token_id=None)
            next(steps)
            c0, n0 = time.thread_time(), _ops_submitted()
            made = sum(1 for _ in steps)
            return (time.thread_time() - c0) / made * 1e6, (_ops_submitted() - n0) / made

        run()
        (us, ops), runs = _median(run, args.repeats)
        devices = int(np.prod(shape))
        rows.append((us, devices))
        print(f"  {label:16s} {us:8.0f} µs/step ({_spread(runs, 0)}), {ops:.0f} ops/step, "
              f"{us / ops:.2f} µs/op, {devices} devices")
        del model
    (u1, d1), (u8, d8) = rows
    print(f"  growth: {u8 / u1:.2f}x the user-thread time for {d8 / d1:.0f}x the devices")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="pp,cp,controller")
    ap.add_argument("--shape", default="110M")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pp-batch", type=int, default=32)
    ap.add_argument("--pp-seq", type=int, default=128)
    ap.add_argument("--pp-decode-batch", type=int, default=8)
    ap.add_argument("--pp-modes", default="thread,process")
    ap.add_argument("--cp-seq", type=int, default=1024)
    args = ap.parse_args()
    directory = _checkpoint(args.shape)
    print(f"Llama {args.shape} ({directory}), {os.cpu_count()} CPUs, DTORCH_BLAS_THREADS="
          f"{os.environ.get('DTORCH_BLAS_THREADS', '1')}; medians of {args.repeats}, spread min-max")
    parts = args.parts.split(",")
    if "pp" in parts:
        for mode in args.pp_modes.split(","):
            bench_pp(directory, args, mode)
    if "cp" in parts:
        bench_cp(directory, args)
    if "controller" in parts:
        bench_controller(directory, args)
    dtorch.shutdown()


if __name__ == "__main__":
    main()
