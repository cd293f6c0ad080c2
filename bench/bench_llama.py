"""Llama inference on DTorch beside a numpy implementation of the same model, measured in one run.

    .venv/bin/python bench/bench_llama.py [--shapes 15M,110M] [--dtypes float32,bfloat16] [--tp 1,2]
                                          [--modes thread,process] [--batches 1,8] [--prefill 128,512]
                                          [--tokens 32] [--repeats 3] [--capture on,off]

It imports the installed ``dtorch`` (build it first with ``bash tools/run.sh demo``) and writes a
random-weight HF-format checkpoint of each shape once into ``bench/.cache/`` (llama2.c's shapes:
15M = dim 288, 6 layers, 6 heads, hidden 768; 110M = dim 768, 12 layers, 12 heads, hidden 2048;
vocabulary 32000). It prints figures and never asserts on them.

For every shape, dtype, tp size and worker mode (a ``(tp,)`` cpu mesh; tp=1 is one device):
  * decode tokens/s at each batch size: greedy ``model.stream`` from a 16-token prompt, the time
    from the first new token to the last (the prefill is not in it), median of ``--repeats``;
  * prefill tokens/s of one prompt of each ``--prefill`` length (one forward, logits of the last
    position fetched);
  * the user thread's CPU time per decode step (``time.thread_time``), and DTorch submissions per
    step (``dtorch._C._ops_submitted()``), with the decode step captured and replayed (``capture``
    on: generate's default) and issued op by op (off).
Beside them, in the same run: the same decode and prefill in numpy (float32 weights, a preallocated
KV cache, numpy's own OpenBLAS and its threads), from the same checkpoint's weights.
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

import dtorch
from dtorch.models import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "15M": dict(hidden_size=288, num_hidden_layers=6, num_attention_heads=6, intermediate_size=768),
    "110M": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=2048),
}
PROMPT = 16


def _checkpoint(shape):
    """The directory of a random-weight checkpoint of shape (written once)."""
    directory = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", f"llama-{shape}")
    if os.path.exists(os.path.join(directory, "config.json")):
        return directory
    config = LlamaConfig(vocab_size=32000, max_position_embeddings=1024, rms_norm_eps=1e-5, **SHAPES[shape])
    rng = np.random.default_rng(0)
    model = LlamaForCausalLM(config)
    state = {name: (rng.standard_normal(p.shape) * 0.02).astype(np.float32) for name, p in model.state_dict().items()}
    for name in state:
        if name.endswith("norm.weight"):
            state[name] = np.ones_like(state[name])
    model.load_state_dict(state)
    model.save_pretrained(directory)
    return directory


# ---- numpy reference: the same Llama, written from HF's semantics ------------------------------

class NumpyLlama:
    def __init__(self, directory):
        from dtorch._safetensors import Checkpoint
        with open(os.path.join(directory, "config.json")) as f:
            self.config = c = LlamaConfig.from_dict(json.load(f))
        checkpoint = Checkpoint(directory)
        self.w = {k: np.ascontiguousarray(checkpoint.file(k).numpy(k), dtype=np.float32) for k in checkpoint.keys()}
        self.H, self.D, self.L = c.num_attention_heads, c.head_dim, c.num_hidden_layers
        self.Hkv = c.num_key_value_heads
        inv = 1.0 / (c.rope_theta ** (np.arange(0, self.D, 2, dtype=np.float32) / self.D))
        freqs = np.arange(c.max_position_embeddings, dtype=np.float32)[:, None] * inv[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        self.cos, self.sin = np.cos(emb), np.sin(emb)

    @staticmethod
    def _linear(x, w):
        """x (..., K) @ w.T, as one 2-D product (numpy's stacked matmul with a transposed operand
        does not reach BLAS)."""
        return (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])

    def _norm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.config.rms_norm_eps) * w

    def _rope(self, x, pos):                      # x (B, H, T, D)
        half = self.D // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * self.cos[pos] + rot * self.sin[pos]

    def forward(self, ids, start, cache):
        """Logits of the last position for ids (B, T) at positions [start, start + T)."""
        B, T = ids.shape
        pos = np.arange(start, start + T)
        h = self.w["model.embed_tokens.weight"][ids]
        for i in range(self.L):
            p = f"model.layers.{i}."
            x = self._norm(h, self.w[p + "input_layernorm.weight"])
            q = self._linear(x, self.w[p + "self_attn.q_proj.weight"]).reshape(B, T, self.H, self.D).transpose(0, 2, 1, 3)
            k = self._linear(x, self.w[p + "self_attn.k_proj.weight"]).reshape(B, T, self.Hkv, self.D).transpose(0, 2, 1, 3)
            v = self._linear(x, self.w[p + "self_attn.v_proj.weight"]).reshape(B, T, self.Hkv, self.D).transpose(0, 2, 1, 3)
            q, k = self._rope(q, pos), self._rope(k, pos)
            kc, vc = cache[i]
            kc[:, :, start:start + T], vc[:, :, start:start + T] = k, v
            S = start + T
            keys = np.repeat(kc[:, :, :S], self.H // self.Hkv, axis=1)
            values = np.repeat(vc[:, :, :S], self.H // self.Hkv, axis=1)
            scores = q @ keys.transpose(0, 1, 3, 2) * (1.0 / np.sqrt(self.D).item())  # a Python float keeps float32
            scores = scores + np.triu(np.full((T, S), -np.inf, np.float32), start + 1)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            o = (scores / scores.sum(-1, keepdims=True)) @ values
            h = h + self._linear(o.transpose(0, 2, 1, 3).reshape(B, T, -1), self.w[p + "self_attn.o_proj.weight"])
            x = self._norm(h, self.w[p + "post_attention_layernorm.weight"])
            g = self._linear(x, self.w[p + "mlp.gate_proj.weight"])
            u = self._linear(x, self.w[p + "mlp.up_proj.weight"])
            h = h + self._linear(g / (1 + np.exp(-g)) * u, self.w[p + "mlp.down_proj.weight"])
        h = self._norm(h[:, -1], self.w["model.norm.weight"])
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        return self._linear(h, head)

    def new_cache(self, B, slots):
        return [(np.zeros((B, self.Hkv, slots, self.D), np.float32),
                 np.zeros((B, self.Hkv, slots, self.D), np.float32)) for _ in range(self.L)]

    def decode_rate(self, B, tokens):
        ids = np.full((B, PROMPT), 7, np.int64)
        cache = self.new_cache(B, PROMPT + tokens)
        token = self.forward(ids, 0, cache).argmax(-1)
        t0 = time.perf_counter()
        for step in range(tokens - 1):
            token = self.forward(token[:, None], PROMPT + step, cache).argmax(-1)
        return B * (tokens - 1) / (time.perf_counter() - t0)

    def prefill_rate(self, T):
        ids = np.full((1, T), 7, np.int64)
        t0 = time.perf_counter()
        self.forward(ids, 0, self.new_cache(1, T))
        return T / (time.perf_counter() - t0)


# ---- DTorch -------------------------------------------------------------------------------------

def _ops_submitted():
    counter = getattr(dtorch._C, "_ops_submitted", None)
    return counter() if counter else None


def dtorch_decode(model, B, tokens, capture=True):
    """(tokens/s, user-thread µs per step, submissions per step) of greedy decode at batch B."""
    prompt = np.full((B, PROMPT), 7, np.int64)
    steps = model.stream(prompt, max_new_tokens=tokens, capture=capture, eos_token_id=None)
    next(steps)                                          # the prefill and the first token
    t0, c0, n0 = time.perf_counter(), time.thread_time(), _ops_submitted()
    made = sum(1 for _ in steps)
    wall, cpu, n1 = time.perf_counter() - t0, time.thread_time() - c0, _ops_submitted()
    ops = (n1 - n0) / made if n0 is not None else None
    return B * made / wall, cpu / made * 1e6, ops


def dtorch_prefill(model, T):
    ids = np.full((1, T), 7, np.int64)
    t0 = time.perf_counter()
    model(ids, logits_to_keep=1).logits.numpy()
    return T / (time.perf_counter() - t0)


def _median(fn, repeats):
    runs = [fn() for _ in range(repeats)]
    if isinstance(runs[0], tuple):
        return tuple(statistics.median(r[i] for r in runs) if runs[0][i] is not None else None
                     for i in range(len(runs[0]))), runs
    return statistics.median(runs), runs


def _spread(runs, i=None):
    values = [r[i] if i is not None else r for r in runs]
    return f"{min(values):.1f}-{max(values):.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="15M,110M")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--modes", default="thread,process")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prefill", default="128,512")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--capture", default="on,off")
    args = ap.parse_args()
    split = lambda s: [x for x in s.split(",") if x]
    batches, prefills = [int(b) for b in split(args.batches)], [int(t) for t in split(args.prefill)]
    print(f"Llama inference: DTorch beside numpy {np.__version__}, {os.cpu_count()} CPUs, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; medians of {args.repeats}, "
          f"spread min-max; decode from a {PROMPT}-token prompt, {args.tokens} new tokens")
    for shape in split(args.shapes):
        directory = _checkpoint(shape)
        ref = NumpyLlama(directory)
        print(f"\n== {shape} ({directory})")
        for B in batches:
            rate, runs = _median(lambda: ref.decode_rate(B, args.tokens), args.repeats)
            print(f"  numpy float32           decode batch {B}: {rate:8.1f} tok/s ({_spread(runs)})")
        for T in prefills:
            rate, runs = _median(lambda: ref.prefill_rate(T), args.repeats)
            print(f"  numpy float32           prefill {T:4d}:   {rate:8.1f} tok/s ({_spread(runs)})")
        for mode in split(args.modes):
            dtorch.shutdown()
            dtorch.init(workers=mode)
            for dtype in split(args.dtypes):
                for tp in [int(t) for t in split(args.tp)]:
                    mesh = dtorch.init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
                    model = LlamaForCausalLM.from_pretrained(directory, device_mesh=mesh, dtype=getattr(dtorch, dtype),
                                                             progress=False)
                    label = f"dtorch {dtype:8s} tp={tp} {mode:7s}"
                    dtorch_decode(model, 1, 4)                                   # warm the pools
                    for B in batches:
                        for capture in split(args.capture):
                            (rate, us, ops), runs = _median(
                                lambda: dtorch_decode(model, B, args.tokens, capture == "on"), args.repeats)
                            extra = f", {ops:.0f} submissions/step" if ops else ""
                            print(f"  {label} decode batch {B} capture {capture:3s}: {rate:8.1f} tok/s "
                                  f"({_spread(runs, 0)}); user thread {us:.0f} µs/step ({_spread(runs, 1)}){extra}")
                    for T in prefills:
                        rate, runs = _median(lambda: dtorch_prefill(model, T), args.repeats)
                        print(f"  {label} prefill {T:4d}:   {rate:8.1f} tok/s ({_spread(runs)})")
                    del model
    dtorch.shutdown()


if __name__ == "__main__":
    main()
