"""Llama prefill on DTorch beside HF transformers' LlamaForCausalLM, measured in one run.

    .venv/bin/python bench/bench_prefill.py --hf-python PY [--shapes 15M,110M] [--dtypes float32,bfloat16]
                                            [--lengths 512] [--tp 2] [--threads 2] [--repeats 3]

PY is a Python with torch and transformers (a venv of its own: DTorch does not need them), run as a
subprocess as bench_serve.py's --hf-python; without it the benchmark says how to make one and exits
with status 2. The weights are bench_llama.py's random-weight HF checkpoints (llama2.c's 15M and
110M shapes, written once into ``bench/.cache/``); DTorch loads one with
``LlamaForCausalLM.from_pretrained(dir, device_mesh=..., dtype=...)`` on a ``(tp,)`` cpu mesh of
thread workers (one core each), HF loads the same directory with
``LlamaForCausalLM.from_pretrained(dir, dtype=...)`` (eval, ``torch.inference_mode``, its default
attention, printed) on ``torch.set_num_threads(--threads)``.

What is timed is bench_llama.py's prefill: one forward over a batch-1 prompt of ``length`` random
token ids (the same ids for both; no KV cache on either side: ``use_cache=False`` for HF, DTorch's
default), only the last position's logits computed (``logits_to_keep=1``), up to those logits on
the host (DTorch: ``.numpy()`` of them; HF: the CPU tensor); tok/s is length / seconds. Each engine
runs one untimed forward at each length first. The HF process is started once per shape and dtype
and stays alive across lengths and repeats: it answers one JSON line per request (a forward over
the ids sent, timed by itself with the same clock), so the engines alternate at every forward --
each repeat runs DTorch's forward, then HF's -- and load drifts touch both. Figures are medians of
``--repeats`` with the spread (min-max).

Both computed the same thing: the last position's logits of the warm-up forwards are compared,
max |DTorch - HF| / max |HF| (float32: about 1e-6 to 1e-5; bfloat16 rounds every activation and
weight to 8 bits of mantissa, in different places in each engine, so more). When float32 ran
first in the same run, a bfloat16 row also gives each engine's logits against HF's float32 ones on
the same ids, so that a bfloat16 gap can be told from a wrong result: both should be about as far.

One table per dtype: shape, length, DTorch tok/s and HF tok/s (median, spread), their ratio, the
logits' agreement. It prints figures and never asserts on them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import dtorch
from dtorch.models import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_llama import SHAPES, _checkpoint, _spread  # noqa: E402

DTYPES = ("float32", "bfloat16")
HOW_TO = """bench_prefill.py needs a Python with torch and transformers (a venv of its own; DTorch does not
depend on them):

    python3 -m venv /path/to/refvenv
    /path/to/refvenv/bin/pip install torch transformers safetensors numpy
    .venv/bin/python bench/bench_prefill.py --hf-python /path/to/refvenv/bin/python
"""

# Run by --hf-python, once per shape and dtype: argv is the checkpoint directory, the dtype and the
# thread count. It prints one JSON line when loaded ({"torch", "transformers", "attention",
# "missing"}), then answers each request line {"ids": [...], "logits": bool} with one JSON line:
# [seconds of the forward, the last position's logits as float32 or null].
_HF = """
import json, sys, time
import torch, transformers
directory, dtype, threads = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
model, info = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=dtype, output_loading_info=True)
model.eval()
print(json.dumps(dict(torch=torch.__version__, transformers=transformers.__version__,
                      attention=model.config._attn_implementation, missing=sorted(info["missing_keys"]))), flush=True)
with torch.inference_mode():
    for line in sys.stdin:
        request = json.loads(line)
        ids = torch.tensor([request["ids"]], dtype=torch.long)
        t0 = time.perf_counter()
        logits = model(ids, use_cache=False, logits_to_keep=1).logits[0, -1]
        seconds = time.perf_counter() - t0
        print(json.dumps([seconds, logits.float().tolist() if request["logits"] else None]), flush=True)
"""


class _HFProcess:
    """transformers' LlamaForCausalLM in a process of ``python``'s, alive until closed."""

    def __init__(self, python, directory, dtype, threads):
        self._errors = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([python, "-c", _HF, directory, dtype, str(threads)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._errors, text=True)
        self.info = self._read()

    def _read(self):
        line = self._proc.stdout.readline()
        while line and not line.startswith(("[", "{")):      # anything else the libraries print
            line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            self._errors.seek(0)
            raise SystemExit(f"the HF process ({self._proc.args[0]}) ended (exit {self._proc.returncode}):\n"
                             + self._errors.read().decode(errors="replace"))
        return json.loads(line)

    def forward(self, ids, logits=False):
        """(seconds, the last position's logits or None) of one forward over ids."""
        self._proc.stdin.write(json.dumps({"ids": ids.tolist(), "logits": logits}) + "\n")
        self._proc.stdin.flush()
        seconds, out = self._read()
        return seconds, None if out is None else np.asarray(out, np.float32)

    def close(self):
        self._proc.stdin.close()
        self._proc.wait()
        self._errors.close()


def _dtorch_forward(model, ids):
    """(seconds, the last position's logits) of bench_llama.py's dtorch_prefill over ids."""
    t0 = time.perf_counter()
    logits = model(ids[None, :], logits_to_keep=1).logits.numpy()
    return time.perf_counter() - t0, logits[0, -1].astype(np.float32)


def _agreement(ours, theirs):
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def _shape(shape, dtype, lengths, args, mesh):
    """{length: (DTorch tok/s of each repeat, HF's, DTorch's logits, HF's)} of one shape and dtype,
    and the HF process's first line."""
    directory = _checkpoint(shape)
    limit = LlamaConfig.from_pretrained(directory).max_position_embeddings
    if max(lengths) > limit:
        raise SystemExit(f"--lengths: {shape}'s checkpoint holds {limit} positions")
    model = LlamaForCausalLM.from_pretrained(directory, device_mesh=mesh, dtype=getattr(dtorch, dtype),
                                             progress=False)
    hf = _HFProcess(args.hf_python, directory, dtype, args.threads)
    try:
        if hf.info["missing"]:
            print(f"  HF left {len(hf.info['missing'])} weights of {directory} random: {hf.info['missing'][:4]}")
        rows = {}
        for length in lengths:
            ids = np.random.default_rng(length).integers(0, model.config.vocab_size, length, dtype=np.int64)
            ours, theirs = _dtorch_forward(model, ids)[1], hf.forward(ids, logits=True)[1]   # warm-up
            rates = {"dtorch": [], "hf": []}
            for _ in range(args.repeats):
                rates["dtorch"].append(length / _dtorch_forward(model, ids)[0])
                rates["hf"].append(length / hf.forward(ids)[0])
            rows[length] = (rates["dtorch"], rates["hf"], ours, theirs)
        return rows, hf.info
    finally:
        hf.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hf-python", help="a Python with torch and transformers: HF's prefill beside")
    ap.add_argument("--shapes", default="15M,110M")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--lengths", default="512", help="prompt lengths (comma list)")
    ap.add_argument("--tp", type=int, default=2, help="DTorch's devices: a (tp,) cpu mesh of thread workers")
    ap.add_argument("--threads", type=int, default=2, help="HF's torch.set_num_threads")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not args.hf_python or not os.access(args.hf_python, os.X_OK):
        if args.hf_python:
            print(f"{args.hf_python}: not an executable\n", file=sys.stderr)
        print(HOW_TO, file=sys.stderr, end="")
        sys.exit(2)
    split = lambda s: [x for x in s.split(",") if x]
    shapes, dtypes = split(args.shapes), split(args.dtypes)
    for option, values, known in (("--shapes", shapes, SHAPES), ("--dtypes", dtypes, DTYPES)):
        unknown = [v for v in values if v not in known]
        if unknown:
            ap.error(f"{option}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    try:
        lengths = [int(t) for t in split(args.lengths)]
    except ValueError:
        ap.error("--lengths: a comma list of integers")
    if not lengths or min(lengths) < 1 or args.repeats < 1 or args.tp < 1 or args.threads < 1:
        ap.error("--lengths, --repeats, --tp and --threads must be at least 1")
    dtorch.init(workers="thread")
    mesh = dtorch.init_device_mesh("cpu", (args.tp,), mesh_dim_names=("tp",))
    dtorch.ones(1, device_mesh=mesh).numpy()
    print(f"Llama prefill, DTorch beside HF transformers ({args.hf_python}), {os.cpu_count()} CPUs; load average "
          "before: %.2f %.2f %.2f" % os.getloadavg())
    float32 = {}                            # (shape, length): HF's float32 logits, the yardstick of bfloat16's
    for dtype in dtypes:
        print(f"\n== {dtype}: one forward over a batch-1 prompt, tok/s, median of {args.repeats} (spread min-max); "
              f"DTorch tp={args.tp} thread workers, HF torch {args.threads} threads")
        header = False
        for shape in shapes:
            rows, info = _shape(shape, dtype, lengths, args, mesh)
            if not header:
                print(f"  HF: torch {info['torch']}, transformers {info['transformers']}, attention "
                      f"{info['attention']}")
                print(f"  {'shape':<6} {'length':>6} {'DTorch tok/s':>12} {'(spread)':>17} {'HF tok/s':>10} "
                      f"{'(spread)':>17} {'DTorch/HF':>9}  logits max|diff|/max|HF|")
                header = True
            for length, (ours, theirs, our_logits, their_logits) in rows.items():
                mine, hf = statistics.median(ours), statistics.median(theirs)
                if dtype == "float32":
                    float32[shape, length] = their_logits
                yardstick = float32.get((shape, length)) if dtype != "float32" else None
                each = "" if yardstick is None else f" (against HF float32: DTorch " \
                    f"{_agreement(our_logits, yardstick):.1e}, HF {_agreement(their_logits, yardstick):.1e})"
                print(f"  {shape:<6} {length:6d} {mine:12.1f} {'(' + _spread(ours) + ')':>17} {hf:10.1f} "
                      f"{'(' + _spread(theirs) + ')':>17} {mine / hf:9.2f}  "
                      f"{_agreement(our_logits, their_logits):.1e}{each}", flush=True)
    print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())
    dtorch.shutdown()


if __name__ == "__main__":
    main()
