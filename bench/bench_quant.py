"""Decode tokens/s of quantized Llamas beside the float32 model, measured in one run.

    .venv/bin/python bench/bench_quant.py [--shapes 15M,110M] [--tp 1,2] [--formats fp32,int8,int4]
                                          [--batch 1] [--tokens 32] [--repeats 3] [--quantize-lm-head]
                                          [--prefill 16,512]

It imports the installed ``dtorch`` and bench_llama.py's random-weight checkpoints (llama2.c's 15M
and 110M shapes, written once into ``bench/.cache/``). For every shape and tp size (a ``(tp,)`` cpu
mesh, thread workers) it loads the model in each format (``quantization=None``, ``"int8"``,
``"int4"``; with ``--quantize-lm-head`` the quantized formats take lm_head too) and prints, side
by side: greedy decode tokens/s (``model.stream`` from a 16-token prompt, the first new token to
the last, median of ``--repeats``, the spread beside it) and the
bytes device 0 holds after loading (``dtorch.memory_stats``); a tp size that would cut an int4 group
of 32 input features (a ValueError from from_pretrained) says so in its cell. With ``--prefill``
(prompt lengths, a comma list) each cell also has the prefill tokens/s of a batch-1 prompt of each
length (bench_llama.py's prefill: one forward up to the last position's logits, the median of
``--repeats`` after one untimed forward). It never asserts on the figures.
"""
import argparse
import gc
import os
import sys

import dtorch
from dtorch.models import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_llama import _checkpoint, _median, _spread, dtorch_decode, dtorch_prefill  # noqa: E402

FORMATS = {"fp32": None, "int8": "int8", "int4": "int4"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="15M,110M")
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--formats", default="fp32,int8,int4")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quantize-lm-head", action="store_true",
                    help="int8 / int4 quantize lm_head too (quantize_lm_head=True)")
    ap.add_argument("--prefill", default="",
                    help="prompt lengths whose prefill tok/s each cell shows too (e.g. 16,512)")
    args = ap.parse_args()
    formats = args.formats.split(",")
    lengths = [int(t) for t in args.prefill.split(",") if t]
    dtorch.init(workers="thread")
    print(f"decode tok/s, batch {args.batch}, {args.tokens} tokens, median of {args.repeats} (spread); "
          "MiB held by device 0 after loading"
          + "".join(f"; prefill {T} tok/s" for T in lengths))
    print(f"{'shape':>6} {'tp':>3} " + " ".join(f"{f + ' tok/s':>22} {f + ' MiB':>9}"
                                                + "".join(f" {f + ' pf' + str(T):>22}" for T in lengths)
                                                for f in formats))
    for shape in args.shapes.split(","):
        directory = _checkpoint(shape)
        for tp in (int(t) for t in args.tp.split(",")):
            mesh = dtorch.init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
            dtorch.ones(1, device_mesh=mesh).numpy()
            cells = []
            for name in formats:
                gc.collect()
                before = dtorch.memory_stats(mesh)[0]["bytes_in_use"]
                try:
                    model = LlamaForCausalLM.from_pretrained(directory, device_mesh=mesh,
                                                             quantization=FORMATS[name], progress=False,
                                                             quantize_lm_head=args.quantize_lm_head and FORMATS[name] is not None)
                except ValueError:   # tp would cut an int4 group (15M's 288 features are 9 groups)
                    cells.append(f"{'cuts a group':>22} {'':>9}" + f" {'':>22}" * len(lengths))
                    continue
                held = (dtorch.memory_stats(mesh)[0]["bytes_in_use"] - before) / 2**20
                dtorch_decode(model, args.batch, 4)                       # warm-up: capture, pools
                (rate, _, _), runs = _median(lambda: dtorch_decode(model, args.batch, args.tokens), args.repeats)
                cell = f"{rate:8.1f} ({_spread(runs, 0):>11}) {held:9.1f}"
                for T in lengths:
                    dtorch_prefill(model, T)                              # warm-up
                    rate, runs = _median(lambda: dtorch_prefill(model, T), args.repeats)
                    cell += f" {rate:8.1f} ({_spread(runs):>11})"
                cells.append(cell)
                del model
            print(f"{shape:>6} {tp:>3} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
