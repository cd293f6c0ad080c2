"""How busy a device is during Llama decode at batch 1: the time it spends running the step's work
over the wall time of the decode loop, from the device's own timeline (dtorch.profiler: on a GPU,
CUDA events on the device's compute stream around each record's work; on a cpu device, the
worker's clock around each record).

    .venv/bin/python bench/bench_decode_busy.py [--device cuda] [--shapes 15M,110M] [--tokens 64]
                                                [--dtypes float32,bfloat16] [--capture on,off] [--top 0]

For each shape, dtype and capture setting: one device (a 1-device mesh of --device), the random
checkpoint bench_llama.py writes (bench/.cache/), greedy ``model.stream`` from a 16-token prompt;
after the first new token (the prefill) it profiles the next --tokens steps and prints tokens/s,
the device's busy time (the union of its events' intervals inside the loop) over the loop's wall
time, and the user thread's CPU time per step. With --top K, op by op (capture off), the K record
names with the most device time per step follow: their count and µs per step. A record's interval
runs from its begin mark to its end mark on the device's timeline, so on a device that waits for
its host it holds the host's time to queue the record's work too. A busy fraction well below 1 means the device waits
for the host: the op-by-op Python loop, or the round trip of each step's token. It prints figures
and never asserts on them.
"""
import argparse
import os
import sys
import time

import numpy as np

import dtorch
from dtorch.models import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_llama import PROMPT, _checkpoint  # noqa: E402  (the checkpoints are bench_llama's)


def busy_ns(events, begin, end):
    """The length of the union of the events' [begin_ns, end_ns] intervals, clipped to [begin, end]."""
    spans = sorted((max(e["begin_ns"], begin), min(e["end_ns"], end)) for e in events)
    total, reach = 0, begin
    for a, b in spans:
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def decode(model, tokens, capture):
    """(tokens/s, busy fraction, user-thread µs per step) of `tokens` greedy steps at batch 1."""
    steps = model.stream(np.full((1, PROMPT), 7, np.int64), max_new_tokens=tokens + 1, capture=capture,
                         eos_token_id=None)
    next(steps)  # the prefill and the first token: not timed
    with dtorch.profiler.profile(0) as prof:
        t0, c0 = time.monotonic_ns(), time.thread_time()
        made = sum(1 for _ in steps)
        t1, c1 = time.monotonic_ns(), time.thread_time()
    events = [e for e in prof.events() if e["device"] == 0]
    return made / ((t1 - t0) * 1e-9), busy_ns(events, t0, t1) / (t1 - t0), (c1 - c0) / made * 1e6, events, made


def top_records(events, steps, k):
    """The k record names with the most device time: (name, records per step, µs per step)."""
    by_name = {}
    for e in events:
        n, ns = by_name.get(e["name"], (0, 0))
        by_name[e["name"]] = (n + 1, ns + e["end_ns"] - e["begin_ns"])
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:k]
    return [(name, n / steps, ns / steps / 1e3) for name, (n, ns) in ranked]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--shapes", default="15M,110M")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--capture", default="on,off")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--top", type=int, default=0, help="op by op: the K records with the most device time")
    a = p.parse_args()
    # the checkpoints are written first (bench_llama builds each model on cpu device 0), and the
    # runtime restarted, since a device id is one actor of one type for the runtime's life
    paths = {shape: _checkpoint(shape) for shape in a.shapes.split(",")}
    dtorch.shutdown()
    dtorch.init()
    try:
        dtorch.ones(1, device_mesh=dtorch.DeviceMesh(a.device, [0])).numpy()
    except Exception as e:  # a build without the backend, or no device
        print(f"bench_decode_busy: no {a.device} device can be used here: {e}")
        return 2
    print(f"decode at batch 1 on one {a.device} device, {a.tokens} steps after the prefill")
    print(f"  {'shape':6} {'dtype':9} {'capture':8} {'tok/s':>8} {'busy':>6} {'user us/step':>13}")
    for shape, path in paths.items():
        for dtype in a.dtypes.split(","):
            mesh = dtorch.DeviceMesh(a.device, [0])
            model = LlamaForCausalLM.from_pretrained(path, device_mesh=mesh, dtype=getattr(dtorch, dtype))
            for capture in a.capture.split(","):
                tps, busy, user, events, steps = decode(model, a.tokens, capture == "on")
                print(f"  {shape:6} {dtype:9} {capture:8} {tps:8.1f} {busy:6.0%} {user:13.0f}", flush=True)
                if a.top and capture != "on":
                    for name, count, us in top_records(events, steps, a.top):
                        print(f"      {name:30} {count:6.1f} per step {us:9.1f} us per step")
            del model


if __name__ == "__main__":
    sys.exit(main())
