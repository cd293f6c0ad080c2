"""Independent numpy references for the diffusion models, written from diffusers' semantics (float64
inside): the pieces the transformers share. A state dict here is {diffusers key: numpy array}; each
function reads the keys under ``prefix``."""
import math

import numpy as np

DTYPE = np.float64  # what the references compute in (a benchmark may set float32)


def f64(x):
    return np.asarray(x, dtype=DTYPE)


def linear(sd, prefix, x):
    y = f64(x) @ f64(sd[prefix + ".weight"]).T
    if prefix + ".bias" in sd:
        y = y + f64(sd[prefix + ".bias"])
    return y


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, eps, weight=None, bias=None):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if weight is not None:
        y = y * f64(weight)
    if bias is not None:
        y = y + f64(bias)
    return y


def rms_norm(x, eps, weight=None):
    y = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    return y * f64(weight) if weight is not None else y


def softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def attention(q, k, v):
    """softmax(q k^T / sqrt(D)) v over (B, H, L, D), every key visible."""
    return softmax(q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])) @ v


def timestep_embedding(t, dim, flip_sin_to_cos=True, shift=0.0, max_period=10000):
    half = dim // 2
    freqs = np.exp(-math.log(max_period) * np.arange(half) / (half - shift))
    angles = f64(t).reshape(-1)[:, None] * freqs[None, :]
    emb = np.concatenate([np.sin(angles), np.cos(angles)], -1)
    if flip_sin_to_cos:
        emb = np.concatenate([emb[:, half:], emb[:, :half]], -1)
    return np.pad(emb, ((0, 0), (0, dim % 2)))


def timestep_mlp(sd, prefix, x):
    """TimestepEmbedding and PixArtAlphaTextProjection: linear_1 -> silu -> linear_2."""
    return linear(sd, prefix + ".linear_2", silu(linear(sd, prefix + ".linear_1", x)))


def feed_forward(sd, prefix, x):
    return linear(sd, prefix + ".net.2", gelu_tanh(linear(sd, prefix + ".net.0.proj", x)))


def ada_chunks(sd, prefix, emb, n):
    """linear(silu(emb)) split into n (B, C) pieces."""
    return np.split(linear(sd, prefix + ".linear", silu(emb)), n, axis=1)


def modulate(x, scale, shift):
    return x * (1.0 + scale[:, None, :]) + shift[:, None, :]


def heads(x, n):
    """(B, L, n * D) -> (B, n, L, D)."""
    B, L, C = x.shape
    return x.reshape(B, L, n, C // n).transpose(0, 2, 1, 3)


def tokens(x):
    """(B, n, L, D) -> (B, L, n * D)."""
    B, n, L, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, n * D)


def qk_norm(sd, prefix, x, kind, eps=1e-6):
    """A per-head norm of (B, H, L, D) when the state dict has one at ``prefix``."""
    if kind is None or prefix + ".weight" not in sd:
        return x
    if kind == "rms_norm":
        return rms_norm(x, eps, sd[prefix + ".weight"])
    return layer_norm(x, eps, sd[prefix + ".weight"], sd.get(prefix + ".bias"))


def rotate_interleaved(x, cos, sin):
    """FLUX's rotary embedding: pairs (x0, x1) of the last dim -> (x0 c - x1 s, x1 c + x0 s), cos and
    sin (L, D) each angle repeated twice."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    rotated = np.stack([-x1, x0], -1).reshape(x.shape)
    return x * cos + rotated * sin


# ---- layouts ---------------------------------------------------------------------------------------

def image_placements(names, sequence_dim=1):
    """How the diffusion transformers' plans lay out image tokens on a mesh with dim ``names`` (None:
    one unnamed device): the batch Shard(0) on dp, the sequence Shard(sequence_dim) on ulysses and
    ring, whole on tp (which splits the heads and the MLPs' hidden channels inside each block)."""
    import dtorch
    kinds = {"dp": dtorch.Shard(0), "tp": dtorch.Replicate()}
    return [kinds.get(n, dtorch.Shard(sequence_dim)) for n in names] if names else [dtorch.Replicate()]


def batch_placements(names):
    """How the plans lay out text tokens, conditioning vectors and the output: the batch Shard(0) on
    dp, whole elsewhere."""
    import dtorch
    return [dtorch.Shard(0) if n == "dp" else dtorch.Replicate() for n in names] if names else [dtorch.Replicate()]
