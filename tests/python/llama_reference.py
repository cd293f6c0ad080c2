"""An independent Llama in numpy (float64), written from HF transformers' semantics (modeling_llama.py
and modeling_rope_utils.py), not from dtorch's model code; and random weights to feed both.

HF semantics followed here: RMSNorm x / sqrt(mean(x^2) + eps) * w; RoPE with the rotate-half
convention, q * cos + rotate_half(q) * sin, cos/sin of position * inv_freq repeated over both
halves; inv_freq = theta^(-2i/D), llama3 scaling by wavelength bands; grouped-query attention by
repeating each k/v head for its group; causal softmax(q k^T / sqrt(D)) with padded keys hidden;
SwiGLU MLP down(silu(gate(x)) * up(x)); final norm; lm_head (the embedding when tied).

The variants that share Llama's layers (config.json's model_type): Mistral, whose every layer sees
only the last ``sliding_window`` positions (query i sees key j iff j <= i and i - j < sliding_window,
the columns counted as the cache's slots, left padding included: masking_utils'
sliding_window_overlay); Qwen2, with biases on the q/k/v projections (none on o_proj or the MLP) and
the same window on layers max_window_layers and up when use_sliding_window is on (or where an
explicit layer_types says "sliding_attention").
"""
import math

import numpy as np


def inv_freq(head_dim, theta, scaling=None):
    freq = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "linear":
        return freq / scaling["factor"]
    if kind != "llama3":
        return freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    out = []
    for f in freq:
        wavelen = 2 * math.pi / f
        if wavelen < context / high:
            out.append(f)                       # high frequencies: unchanged
        elif wavelen > context / low:
            out.append(f / factor)              # low frequencies: interpolated by factor
        else:                                   # in between: a smooth blend
            smooth = (context / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _silu(x):
    return x / (1 + np.exp(-x))


def logits(weights, cfg, ids, attention_mask=None, position_ids=None, inputs=None):
    """Logits (B, L, V) in float64. ``weights``: the HF state dict as numpy arrays; ``cfg``: a dict
    of config.json fields. Query rows whose every key is padding give zeros (they are padding).
    ``inputs(name, h)``, when given, is what the linear layer ``name`` (e.g. "model.layers.0.mlp.
    up_proj", "lm_head") multiplies instead of its input h: a product that quantizes its input."""
    x = hidden_states(weights, cfg, ids, attention_mask, position_ids, inputs)
    head = weights["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else weights["lm_head.weight"]
    return (inputs("lm_head", x) if inputs else x) @ np.asarray(head, np.float64).T


def hidden_states(weights, cfg, ids, attention_mask=None, position_ids=None, inputs=None):
    """The last hidden states (B, L, E) after the final norm, in float64 (what lm_head reads);
    ``inputs`` as in logits."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    ids = np.asarray(ids)
    B, L = ids.shape
    H, E = cfg["num_attention_heads"], cfg["hidden_size"]
    Hkv = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or E // H
    eps = cfg.get("rms_norm_eps", 1e-6)
    mask = np.ones((B, L), bool) if attention_mask is None else np.asarray(attention_mask) != 0
    if position_ids is None:
        position_ids = np.broadcast_to(np.arange(L), (B, L))
    angles = np.asarray(position_ids)[..., None] * inv_freq(D, cfg.get("rope_theta", 10000.0),
                                                             cfg.get("rope_scaling"))[None, None, :]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None]   # (B, 1, L, D)
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None]
    causal = np.tril(np.ones((L, L), bool))
    allowed_full = causal[None, None] & mask[:, None, None, :]                    # (B, 1, L, L)
    windows = layer_windows(cfg)

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."

        def proj(name, h):
            y = (inputs(p + name, h) if inputs else h) @ w[p + name + ".weight"].T
            return y + w[p + name + ".bias"] if p + name + ".bias" in w else y

        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = proj("self_attn.q_proj", h).reshape(B, L, H, D).transpose(0, 2, 1, 3)
        k = proj("self_attn.k_proj", h).reshape(B, L, Hkv, D).transpose(0, 2, 1, 3)
        v = proj("self_attn.v_proj", h).reshape(B, L, Hkv, D).transpose(0, 2, 1, 3)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
        allowed = allowed_full
        if windows[i] is not None:
            near = np.subtract.outer(np.arange(L), np.arange(L)) < windows[i]   # query i - key j < window
            allowed = allowed_full & near[None, None]
        scores = np.where(allowed, q @ k.transpose(0, 1, 3, 2) / math.sqrt(D), -np.inf)
        top = scores.max(-1, keepdims=True)
        e = np.where(allowed, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
        probs = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
        o = (probs @ v).transpose(0, 2, 1, 3).reshape(B, L, H * D)
        x = x + proj("self_attn.o_proj", o)
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + proj("mlp.down_proj", _silu(proj("mlp.gate_proj", h)) * proj("mlp.up_proj", h))
    return _rms(x, w["model.norm.weight"], eps)


# ---- int4 products' inputs -------------------------------------------------------------------------

def int4_inputs_from_contract(x):
    """The input as the int4 product uses it on the CPU (activations quantized, as the contract
    allows): per group of 32 features, scale = max|x_group| / 127 and values rint(x * 127 /
    max|x_group|), in float32 arithmetic; features past the last whole group as given."""
    x = np.asarray(x, np.float32)
    used = x.astype(np.float64)
    for g in range(0, x.shape[-1] - x.shape[-1] % 32, 32):
        part = x[..., g:g + 32]
        amax = np.abs(part).max(axis=-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        used[..., g:g + 32] = np.rint(part * inv) * (amax / np.float32(127)).astype(np.float32)
    return used


def int4_inputs(lm_head=False):
    """logits' ``inputs`` for a model whose decoder projections (and lm_head, when quantized) are int4."""
    return lambda name, h: int4_inputs_from_contract(h) if lm_head or name != "lm_head" else h


def layer_windows(cfg):
    """The sliding window of each layer (None: it sees every earlier position), from config.json's
    fields as HF's Mistral and Qwen2 read them; Llama has none."""
    n, kind = cfg["num_hidden_layers"], cfg.get("model_type", "llama")
    window = cfg.get("sliding_window")
    if kind == "mistral":
        return [window] * n
    if kind == "qwen2":
        if not cfg.get("use_sliding_window", False):
            window = None
        types = cfg.get("layer_types") or ["sliding_attention" if window is not None and i >= cfg.get(
            "max_window_layers", 28) else "full_attention" for i in range(n)]
        return [window if t == "sliding_attention" else None for t in types]
    return [None] * n


def random_weights(cfg, seed=0, dtype=np.float32):
    """An HF Llama state dict with random values that keep activations of order 1 (Qwen2's: with
    q/k/v biases)."""
    rng = np.random.default_rng(seed)
    H, E, I, V = cfg["num_attention_heads"], cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    Hkv = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or E // H

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(dtype)

    def vec(n, scale=0.1, base=0.0):
        return (base + scale * rng.standard_normal(n)).astype(dtype)

    sd = {"model.embed_tokens.weight": rng.standard_normal((V, E)).astype(dtype)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, rows, cols in (("self_attn.q_proj", H * D, E), ("self_attn.k_proj", Hkv * D, E),
                                 ("self_attn.v_proj", Hkv * D, E), ("self_attn.o_proj", E, H * D)):
            sd[p + name + ".weight"] = mat(rows, cols)
            qwen2_bias = cfg.get("model_type") == "qwen2" and name != "self_attn.o_proj"
            if qwen2_bias or cfg.get("attention_bias") and cfg.get("model_type", "llama") == "llama":
                sd[p + name + ".bias"] = vec(rows, scale=0.3 if qwen2_bias else 0.1)
        for name, rows, cols in (("mlp.gate_proj", I, E), ("mlp.up_proj", I, E), ("mlp.down_proj", E, I)):
            sd[p + name + ".weight"] = mat(rows, cols)
            if cfg.get("mlp_bias") and cfg.get("model_type", "llama") == "llama":
                sd[p + name + ".bias"] = vec(rows)
        sd[p + "input_layernorm.weight"] = vec(E, base=1.0)
        sd[p + "post_attention_layernorm.weight"] = vec(E, base=1.0)
    sd["model.norm.weight"] = vec(E, base=1.0)
    if not cfg.get("tie_word_embeddings"):
        sd["lm_head.weight"] = mat(V, E)
    return sd


def tiny_config(**overrides):
    """A config small enough for tests that run in seconds: 4 query heads, 2 k/v heads, vocab 61
    (uneven over 2 and 4 devices)."""
    cfg = dict(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
               tie_word_embeddings=False, hidden_act="silu", bos_token_id=1, eos_token_id=2)
    cfg.update(overrides)
    return cfg
