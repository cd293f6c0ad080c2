"""Weight sync between actor groups: a whole Llama's weights from one group's layout into another's.

    .venv/bin/python bench/bench_weight_sync.py [--shape 110M] [--workers thread,process] [--runs 5]

Group A holds the model with tp=2 on devices [0, 1]; it is synced (examples/rl_loop.py's `sync`: one
`redistribute_many` of every parameter into the other group's placements, worker to worker) into
group B with tp=1 on [2] and with tp=4 on [2, 3, 4, 5]. The time runs from the call until every
device has its pieces (dtorch.synchronize). The reference is numpy copying the same bytes into a
buffer written before (memcpy into a written buffer), measured in the same run. Median of
`--runs` runs and the spread (lowest-highest). It prints figures and never asserts on them.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

import dtorch
from dtorch.models import LlamaConfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import rl_loop  # noqa: E402

SHAPES = {
    "15M": dict(vocab_size=32000, hidden_size=288, intermediate_size=768, num_hidden_layers=6, num_attention_heads=6,
                num_key_value_heads=6, max_position_embeddings=256, tie_word_embeddings=False),
    "110M": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=1024,
                 tie_word_embeddings=False),
}


def _memcpy(nbytes, runs):
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)     # written: its pages exist
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return times


def _fmt(name, nbytes, times):
    med = statistics.median(times)
    return (f"  {name:34s} {med * 1e3:8.1f} ms  {nbytes / med / 1e9:6.2f} GB/s  "
            f"(spread {min(times) * 1e3:.1f}-{max(times) * 1e3:.1f} ms)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="110M", choices=sorted(SHAPES))
    ap.add_argument("--workers", default="thread,process")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    config = LlamaConfig(**SHAPES[args.shape])
    for workers in args.workers.split(","):
        dtorch.shutdown()
        dtorch.init(workers=workers)
        source = rl_loop.build(config, dtorch.DeviceMesh("cpu", [0, 1]))
        nbytes = sum(t.numel() * t.dtype.itemsize for t in source.state_dict().values())
        print(f"{args.shape} ({nbytes / 1e6:.0f} MB of float32 weights), {workers} workers, from tp=2 on [0, 1]:")
        print(_fmt("reference: memcpy, written buffer", nbytes, _memcpy(nbytes, args.runs)))
        for ids in ((2,), (2, 3, 4, 5)):
            target = rl_loop.build(config, dtorch.DeviceMesh("cpu", list(ids)))
            dtorch.synchronize()
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                rl_loop.sync(source, target)
                dtorch.synchronize()
                times.append(time.perf_counter() - t0)
            got = target.lm_head.weight.numpy()
            assert np.array_equal(got, source.lm_head.weight.numpy())
            print(_fmt(f"sync into tp={len(ids)} on {list(ids)}", nbytes, times))
            del target
    dtorch.shutdown()


if __name__ == "__main__":
    main()
