"""Llama decode on DTorch beside llama2.c's run.c (float32) and runq.c (int8), measured in one run.

    .venv/bin/python bench/bench_llama2c.py --llama2c DIR [--shapes 15M,110M] [--formats fp32,bf16,int8,int4]
                                            [--tp 2] [--tokens 256] [--repeats 3] [--threads 2]
                                            [--check 32] [--quantize-lm-head]

DIR is a checkout of llama2.c (``git clone https://github.com/karpathy/llama2.c``) holding run.c and
runq.c; nothing of it is part of DTorch. Both are built from DIR with ``gcc -Ofast -march=native
-fopenmp`` into ``bench/.cache/llama2c/`` (again when a source is newer than its binary) and run with
``OMP_NUM_THREADS=--threads``.

The weights are bench_llama.py's random-weight HF checkpoints (llama2.c's 15M and 110M shapes, written
once into ``bench/.cache/``), written out once more in llama2.c's two formats:
  * run.c's legacy file: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size
    (negative: the classifier is not the embedding), seq_len), then float32 tensors: the embedding,
    every layer's attention norm, wq, wk, wv, wo, ffn norm, w1 (gate), w2 (down), w3 (up), the final
    norm, two (seq_len, head_dim / 2) tables of RoPE's cos and sin (older run.c versions read them,
    newer ones skip them), and the classifier;
  * runq.c's version 2 file: a 256-byte header (magic "ak42", version 2, the 7 ints, a byte saying
    whether the classifier is shared, the group size), the float32 norms (attention norms, ffn
    norms, final norm), then each matrix in Q8_0: its int8 values, then one float32 scale
    (max |w| / 127) per group of group-size consecutive values (64, halved until it divides dim and
    hidden_dim) -- the embedding, every layer's wq, wk, wv, wo, w1, w2, w3, then the classifier.
HF's q_proj and k_proj rows are in the rotate-half layout (feature j of a head turns with feature
j + head_dim/2) and llama2.c turns adjacent pairs (2j, 2j+1) by the same angle, so each head's rows
are interleaved for llama2.c: row 2j is HF's row j and row 2j+1 is HF's row j + head_dim/2.

The conversion is checked: llama2.c's runs generate greedily (``-t 0``) from BOS alone (no prompt:
run.c starts from token 1, runq.c encodes the empty prompt as BOS alone), and a tokenizer.bin written
here gives every token the piece ``[id]``, so the printed text is the token ids. Their first
``--check`` tokens are compared with DTorch float32's greedy tokens from the prompt [BOS] (the count
that agree, from the first on), twice: on the benchmark's weights (the first timed run's tokens),
and on a small check checkpoint per shape (``bench/.cache/llama-<shape>-check``: the shape's dim,
heads and hidden size, 2 layers, 512 tokens, q_proj and k_proj 5x larger than the rest). The second
is the one that can fail: with the benchmark's weights attention is nearly uniform, and llama2.c
given q/k rows in HF's order makes the same tokens; on the check checkpoint attention picks few
positions, and rows left in HF's order agree on 3 of 32 tokens (15M). runq.c quantizes activations
to int8 as well, so its tokens may part from float32's sooner. llama2.c stops early if it makes
token 1 (BOS); that is reported.

Per shape, one table: decode tokens/s, median of ``--repeats`` with the spread, for run.c, runq.c
and DTorch in each ``--formats`` entry (fp32, bf16 = ``dtype=dtorch.bfloat16``, int8 and int4 =
``quantization=...``; ``--quantize-lm-head`` quantizes lm_head too, as runq.c does its classifier),
loaded on a ``(tp,)`` cpu mesh of thread workers, and each DTorch figure's ratio to run.c and to
runq.c. Each repeat runs run.c, runq.c, then every DTorch format, so load drifts touch all of them.
llama2.c's figure is its own "achieved tok/s" over ``-n --tokens`` steps from BOS (the steps after
the first, after one untimed run of 4 steps); DTorch's is bench_llama.py's: greedy ``model.stream``
from a 16-token prompt, ``--tokens`` new tokens, timed from the first new token to the last (after
one untimed decode). Both time --tokens - 1 steps. It prints figures and never asserts on them.
"""
import argparse
import os
import re
import statistics
import struct
import subprocess
import sys

import numpy as np

import dtorch
from dtorch._safetensors import Checkpoint
from dtorch.models import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_llama import SHAPES, _checkpoint, _spread, dtorch_decode  # noqa: E402

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "llama2c")
FORMATS = {"fp32": dict(quantization=None, dtype=None), "bf16": dict(quantization=None, dtype="bfloat16"),
           "int8": dict(quantization="int8", dtype=None), "int4": dict(quantization="int4", dtype=None)}
HOW_TO = """bench_llama2c.py needs a checkout of llama2.c (its run.c and runq.c), which DTorch does not ship:

    git clone https://github.com/karpathy/llama2.c /path/to/llama2.c
    .venv/bin/python bench/bench_llama2c.py --llama2c /path/to/llama2.c
"""
CHECK_POSITIONS = 256
ENGINES = ("run.c fp32", "runq.c int8")
PIECE = re.compile(rb"\[(\d+)\]")
RATE = re.compile(rb"achieved tok/s: ([0-9.]+)")


# ---- llama2.c's files, written from the HF checkpoint ---------------------------------------------

class _Weights:
    """The HF checkpoint's tensors by llama2.c's names, as float32 numpy arrays, read one at a time."""

    def __init__(self, directory):
        self.config = LlamaConfig.from_pretrained(directory)
        self._checkpoint = Checkpoint(directory)
        c = self.config
        self.dim, self.hidden, self.layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
        self.heads, self.kv_heads, self.vocab = c.num_attention_heads, c.num_key_value_heads, c.vocab_size
        self.head_dim = self.dim // self.heads
        self.seq_len = c.max_position_embeddings
        self.shared = c.tie_word_embeddings or "lm_head.weight" not in self._checkpoint
        if c.head_dim != self.head_dim or abs(c.rms_norm_eps - 1e-5) > 1e-12 or c.rope_theta != 10000.0 \
                or c.rope_scaling or c.attention_bias or c.mlp_bias or c.hidden_act != "silu":
            raise SystemExit(f"{directory}: llama2.c fixes head_dim = dim / n_heads, rms_norm_eps 1e-5, RoPE theta "
                             "10000 without scaling, SiLU and no biases; this checkpoint differs")

    def _get(self, name):
        return np.ascontiguousarray(self._checkpoint.file(name).numpy(name), dtype=np.float32)

    def _interleave(self, w, heads):
        """HF's rotate-half rows of each head, (heads * head_dim, dim), in llama2.c's pair order."""
        half = self.head_dim // 2
        return np.ascontiguousarray(w.reshape(heads, 2, half, -1).transpose(0, 2, 1, 3).reshape(w.shape))

    def layer(self, kind, i):
        p = f"model.layers.{i}."
        if kind == "wq":
            return self._interleave(self._get(p + "self_attn.q_proj.weight"), self.heads)
        if kind == "wk":
            return self._interleave(self._get(p + "self_attn.k_proj.weight"), self.kv_heads)
        return self._get(p + {"attention_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
                              "wv": "self_attn.v_proj.weight", "wo": "self_attn.o_proj.weight",
                              "w1": "mlp.gate_proj.weight", "w2": "mlp.down_proj.weight",
                              "w3": "mlp.up_proj.weight"}[kind])

    def embedding(self):
        return self._get("model.embed_tokens.weight")

    def classifier(self):
        return self._get("lm_head.weight")

    def final_norm(self):
        return self._get("model.norm.weight")

    def params(self, negative_unshared):
        """The 7 int32 of llama2.c's Config; run.c's file says an unshared classifier by a negative
        vocab_size, runq.c's by a flag of its own."""
        vocab = -self.vocab if negative_unshared and not self.shared else self.vocab
        return struct.pack("<7i", self.dim, self.hidden, self.layers, self.heads, self.kv_heads, vocab, self.seq_len)

    def group_size(self):
        group = 64
        while self.dim % group or self.hidden % group:
            group //= 2
        return group


def _write_fp32(w, path):
    """run.c's legacy float32 file."""
    with open(path, "wb") as f:
        f.write(w.params(True))
        f.write(w.embedding().tobytes())
        for kind in ("attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"):
            for i in range(w.layers):
                f.write(w.layer(kind, i).tobytes())
        f.write(w.final_norm().tobytes())
        inv = 1.0 / (10000.0 ** (np.arange(0, w.head_dim, 2, dtype=np.float64) / w.head_dim))
        angles = np.arange(w.seq_len, dtype=np.float64)[:, None] * inv[None, :]
        f.write(np.cos(angles).astype(np.float32).tobytes())
        f.write(np.sin(angles).astype(np.float32).tobytes())
        if not w.shared:
            f.write(w.classifier().tobytes())


def _q80(x, group):
    """x's values in Q8_0: int8 values, then one float32 scale per group of consecutive values."""
    g = x.reshape(-1, group)
    scale = np.abs(g).max(axis=1) / 127.0
    q = np.round(g / np.where(scale == 0, 1.0, scale)[:, None]).astype(np.int8)
    return q.tobytes() + scale.astype(np.float32).tobytes()


def _write_q80(w, path):
    """runq.c's version 2 file."""
    group = w.group_size()
    header = struct.pack("<Ii", 0x616B3432, 2) + w.params(False) + struct.pack("<Bi", 1 if w.shared else 0, group)
    with open(path, "wb") as f:
        f.write(header.ljust(256, b"\0"))
        for kind in ("attention_norm", "ffn_norm"):
            for i in range(w.layers):
                f.write(w.layer(kind, i).tobytes())
        f.write(w.final_norm().tobytes())
        f.write(_q80(w.embedding(), group))
        for kind in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
            for i in range(w.layers):
                f.write(_q80(w.layer(kind, i), group))
        if not w.shared:
            f.write(_q80(w.classifier(), group))


def _write_tokenizer(path, vocab):
    """A tokenizer.bin in llama2.c's format (max_token_length, then per token: float score, int
    length, bytes) whose piece for token i is "[i]"."""
    pieces = [f"[{i}]".encode() for i in range(vocab)]
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(len(p) for p in pieces)))
        for p in pieces:
            f.write(struct.pack("<fi", 0.0, len(p)) + p)


def _stale(target, *sources):
    return not os.path.exists(target) or any(os.path.getmtime(s) > os.path.getmtime(target) for s in sources)


def _check_checkpoint(shape):
    """The directory of a small random-weight checkpoint with shape's layer layout (dim, heads,
    hidden; 2 layers, 512 tokens) whose q_proj and k_proj are 5x larger than the rest: attention
    there picks few positions, so interleaving a head's q/k rows wrongly (or not at all) changes the
    greedy tokens. On the benchmark's checkpoints attention is nearly uniform and hides it."""
    directory = os.path.join(os.path.dirname(CACHE), f"llama-{shape}-check")
    if os.path.exists(os.path.join(directory, "config.json")):
        return directory
    layout = dict(SHAPES[shape], num_hidden_layers=2)
    config = LlamaConfig(vocab_size=512, max_position_embeddings=CHECK_POSITIONS, rms_norm_eps=1e-5, **layout)
    rng = np.random.default_rng(1)
    model = LlamaForCausalLM(config)
    state = {}
    for name, p in model.state_dict().items():
        std = 0.1 if name.endswith(("q_proj.weight", "k_proj.weight")) else 0.02
        state[name] = np.ones(p.shape, np.float32) if name.endswith("norm.weight") else \
            (rng.standard_normal(p.shape) * std).astype(np.float32)
    model.load_state_dict(state)
    model.save_pretrained(directory)
    return directory


def _export(name, directory):
    """(run.c's file, runq.c's file, tokenizer.bin) of the checkpoint, written when missing or older."""
    os.makedirs(CACHE, exist_ok=True)
    source = os.path.join(directory, "model.safetensors")
    weights = None
    paths = []
    for file, writer in ((f"{name}-fp32.bin", _write_fp32), (f"{name}-q80.bin", _write_q80)):
        path = os.path.join(CACHE, file)
        if _stale(path, source):
            weights = weights or _Weights(directory)
            writer(weights, path + ".tmp")
            os.replace(path + ".tmp", path)
        paths.append(path)
    vocab = LlamaConfig.from_pretrained(directory).vocab_size
    tokenizer = os.path.join(CACHE, f"tokenizer-{vocab}.bin")
    if not os.path.exists(tokenizer):
        _write_tokenizer(tokenizer + ".tmp", vocab)
        os.replace(tokenizer + ".tmp", tokenizer)
    return paths[0], paths[1], tokenizer


# ---- llama2.c's programs --------------------------------------------------------------------------

def _build(checkout, name):
    source, binary = os.path.join(checkout, f"{name}.c"), os.path.join(CACHE, name)
    if _stale(binary, source):
        os.makedirs(CACHE, exist_ok=True)
        cmd = ["gcc", "-Ofast", "-march=native", "-fopenmp", "-o", binary, source, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return binary


def _llama2c(binary, model, tokenizer, tokens, threads):
    """(llama2.c's achieved tok/s, the token ids it printed)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run([binary, model, "-t", "0", "-n", str(tokens), "-z", tokenizer],
                          capture_output=True, env=env, timeout=3600)
    rate = RATE.search(done.stderr)
    if done.returncode or not rate:
        raise SystemExit(f"{binary} {model} failed (exit {done.returncode}):\n{done.stderr.decode(errors='replace')}")
    return float(rate.group(1)), [int(t) for t in PIECE.findall(done.stdout)]


def _agree(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---- the run --------------------------------------------------------------------------------------

def _load(directory, mesh, name, quantize_lm_head):
    spec = FORMATS[name]
    extra = {"quantize_lm_head": True} if quantize_lm_head and spec["quantization"] else {}
    dtype = getattr(dtorch, spec["dtype"]) if spec["dtype"] else None
    try:
        return LlamaForCausalLM.from_pretrained(directory, device_mesh=mesh, quantization=spec["quantization"],
                                                dtype=dtype, progress=False, **extra)
    except ValueError as e:   # tp would cut an int4 group (15M's 288 features are 9 groups of 32)
        return str(e).split("\n")[0]


def _greedy(model, n):
    """DTorch's first n greedy tokens from the prompt [BOS]."""
    out = model.generate(np.array([[1]], np.int64), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, 1:].tolist()


def _agreement(printed, ours, n):
    """'k of n' for each llama2.c engine: how many of its first tokens agree with ours."""
    cells = []
    for engine, ids in printed.items():
        stop = f" (stopped at BOS after {len(ids)})" if len(ids) < n else ""
        cells.append(f"{engine} {_agree(ids, ours)} of {n}{stop}")
    return ", ".join(cells)


def _shape(shape, args, binaries, formats, mesh):
    directory = _checkpoint(shape)
    *files, tokenizer = _export(shape, directory)
    files = dict(zip(ENGINES, files))
    models, skipped = {}, {}
    for name in formats:
        model = _load(directory, mesh, name, args.quantize_lm_head)
        (skipped if isinstance(model, str) else models)[name] = model
    for model in models.values():
        dtorch_decode(model, 1, 4)                                    # warm-up: capture, pools
    for engine, file in files.items():                                # warm-up: the page cache
        _llama2c(binaries[engine], file, tokenizer, 4, args.threads)
    rates = {e: [] for e in list(files) + list(models)}
    printed = {}
    for _ in range(args.repeats):
        for engine, file in files.items():
            rate, ids = _llama2c(binaries[engine], file, tokenizer, args.tokens, args.threads)
            rates[engine].append(rate)
            printed.setdefault(engine, ids)
        for name, model in models.items():
            rates[name].append(dtorch_decode(model, 1, args.tokens)[0])

    print(f"\n== {shape} ({directory}), batch 1, {args.tokens} tokens, median of {args.repeats} (spread); "
          f"llama2.c on {args.threads} OpenMP threads, DTorch on tp={args.tp} thread workers"
          + (", lm_head quantized" if args.quantize_lm_head else ""))
    n = min(args.check, args.tokens - 1)
    reference = models.get("fp32") or _load(directory, mesh, "fp32", False)
    print(f"  greedy tokens from BOS agreeing with DTorch fp32, from the first: "
          f"{_agreement(printed, _greedy(reference, n), n)}")
    del reference
    check = _check_checkpoint(shape)
    *check_files, check_tokenizer = _export(f"{shape}-check", check)
    check_files = dict(zip(ENGINES, check_files))
    n = min(n, CHECK_POSITIONS - 1)
    check_printed = {e: _llama2c(binaries[e], f, check_tokenizer, n + 1, args.threads)[1]
                     for e, f in check_files.items()}
    ours = _greedy(LlamaForCausalLM.from_pretrained(check, device_mesh=mesh, progress=False), n)
    print(f"  the same on {os.path.basename(check)} (2 layers, 512 tokens, sharp attention: checks the q/k "
          f"layout): {_agreement(check_printed, ours, n)}")
    run_rate, runq_rate = (statistics.median(rates[e]) for e in ENGINES[:2])
    print(f"  {'engine':<18} {'tok/s':>8} {'(spread)':>15} {'/ run.c':>8} {'/ runq.c':>9}")
    for engine, runs in rates.items():
        label = engine if engine in files else f"dtorch {engine}"
        rate = statistics.median(runs)
        ratios = "" if engine in files else f" {rate / run_rate:8.2f} {rate / runq_rate:9.2f}"
        print(f"  {label:<18} {rate:8.1f} {'(' + _spread(runs) + ')':>15}{ratios}", flush=True)
    for name, why in skipped.items():
        print(f"  {'dtorch ' + name:<18} not loaded: {why}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama2c", metavar="DIR", help="a checkout of llama2.c holding run.c and runq.c")
    ap.add_argument("--shapes", default="15M,110M")
    ap.add_argument("--formats", default="fp32,bf16,int8,int4")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="llama2.c's -n; DTorch decodes as many")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="llama2.c's OMP_NUM_THREADS")
    ap.add_argument("--check", type=int, default=32, help="greedy tokens compared with DTorch fp32")
    ap.add_argument("--quantize-lm-head", action="store_true", help="int8/int4 quantize lm_head too")
    args = ap.parse_args()
    checkout = args.llama2c
    if not checkout or not all(os.path.isfile(os.path.join(checkout, f)) for f in ("run.c", "runq.c")):
        if checkout:
            print(f"{checkout}: no run.c and runq.c there\n", file=sys.stderr)
        print(HOW_TO, file=sys.stderr, end="")
        sys.exit(2)
    formats = [f for f in args.formats.split(",") if f]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        ap.error(f"--formats: unknown {', '.join(unknown)} (known: {', '.join(FORMATS)})")
    if args.tokens < 2:
        ap.error("--tokens must be at least 2")
    binaries = {ENGINES[0]: _build(checkout, "run"), ENGINES[1]: _build(checkout, "runq")}
    dtorch.init(workers="thread")
    mesh = dtorch.init_device_mesh("cpu", (args.tp,), mesh_dim_names=("tp",))
    dtorch.ones(1, device_mesh=mesh).numpy()
    print(f"llama2.c ({os.path.abspath(checkout)}) beside DTorch, {os.cpu_count()} CPUs, formats {', '.join(formats)}")
    for shape in (s for s in args.shapes.split(",") if s):
        _shape(shape, args, binaries, formats, mesh)
    dtorch.shutdown()


if __name__ == "__main__":
    main()
