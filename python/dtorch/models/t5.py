"""T5's encoder (Raffel et al. 2020), as Stable Diffusion 3 and FLUX use it for their long text
embeddings: a shared token embedding, pre-norm blocks with T5's LayerNorm (root mean square, no mean
subtracted, no bias), attention without the 1/sqrt(d) scaling whose scores get a learned bias by
bucketed relative position (bidirectional; only the first block holds the table, every block uses
it), a feed-forward "relu" (wi, wo) or gated "gated-gelu" (gelu_new(wi_0 x) * wi_1 x, then wo), and
a final norm.

Module tree, parameter names and semantics are those of transformers 5.25's ``T5EncoderModel``:
``shared`` is the token embedding, and ``encoder.embed_tokens`` the same module (tied, as
transformers ties them: its checkpoints hold ``shared.weight`` only, older ones both names; either
loads). Single-device code: text_encoder_parallel.py lays it out over a mesh. Shapes in comments:
B batch, L tokens, H heads, Dk d_kv, D d_model, NB relative_attention_num_buckets.
"""
import math

import numpy as np

from .. import _dtype
from .._factory import distribute_tensor
from ..nn import functional as F
from ..nn.containers import ModuleList
from ..nn.layers import Embedding, Linear, RMSNorm
from ..nn.module import Module
from .clip import ACTIVATIONS
from .config_fields import count, flag, number, optional, text
from .llama import _on_mesh_like
from .text_encoder import BaseModelOutput, PreTrainedTextEncoder, TextEncoderConfig, add_alias


class T5Config(TextEncoderConfig):
    """transformers' T5Config fields and defaults; ``feed_forward_proj`` "ACT" or "gated-ACT" sets
    ``dense_act_fn`` and ``is_gated_act`` as transformers derives them ("gated-gelu": gelu_new)."""

    model_types = ("t5",)
    defaults = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                    relative_attention_num_buckets=32, relative_attention_max_distance=128, layer_norm_epsilon=1e-6,
                    feed_forward_proj="relu", is_decoder=False, pad_token_id=0, eos_token_id=1)
    kinds = dict(vocab_size=count(), d_model=count(), d_kv=count(), d_ff=count(), num_layers=count(0),
                 num_heads=count(), relative_attention_num_buckets=count(), relative_attention_max_distance=count(),
                 layer_norm_epsilon=number(low=0), feed_forward_proj=text, is_decoder=flag,
                 pad_token_id=optional(count(-(1 << 63))), eos_token_id=optional(count(-(1 << 63))))

    def _derive(self):
        owner = type(self).__name__
        parts = self.feed_forward_proj.split("-")
        if len(parts) > 2 or len(parts) == 2 and parts[0] != "gated":
            raise ValueError(f"{owner}: feed_forward_proj {self.feed_forward_proj!r} is not 'ACT' or 'gated-ACT'")
        act = "gelu_new" if self.feed_forward_proj == "gated-gelu" else parts[-1]
        if act not in ACTIVATIONS:
            raise ValueError(f"{owner}: feed_forward_proj {self.feed_forward_proj!r}: activation {act!r} is not "
                             f"supported (supported: {', '.join(ACTIVATIONS)})")
        dict.__setitem__(self, "dense_act_fn", act)
        dict.__setitem__(self, "is_gated_act", parts[0] == "gated")
        if self.relative_attention_num_buckets < 4:
            raise ValueError(f"{owner}: relative_attention_num_buckets must be at least 4 (half of each direction's "
                             f"buckets are exact), got {self.relative_attention_num_buckets}")


def relative_position_buckets(length, num_buckets, max_distance):
    """(L, L) int64 bucket of key j for query i (relative position j - i), bidirectional, as
    transformers' T5Attention._relative_position_bucket computes it (float32 logarithms): half the
    buckets per direction, the first half of those exact distances, the rest logarithmic up to
    max_distance and clamped past it."""
    position = np.arange(length, dtype=np.int64)
    relative = position[None, :] - position[:, None]
    half = num_buckets // 2
    buckets = (relative > 0).astype(np.int64) * half
    distance = np.abs(relative)
    max_exact = half // 2
    with np.errstate(divide="ignore"):
        far = (np.log(distance.astype(np.float32) / np.float32(max_exact))
               / np.float32(math.log(max_distance / max_exact)) * np.float32(half - max_exact))
    far = max_exact + np.where(distance < max_exact, 0, far).astype(np.int64)
    far = np.minimum(far, half - 1)
    return buckets + np.where(distance < max_exact, distance, far)


class T5Attention(Module):
    def __init__(self, config, has_relative_attention_bias=False, device_mesh=None, dtype=None):
        super().__init__()
        D, inner = config.d_model, config.num_heads * config.d_kv
        self.d_kv = config.d_kv
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.q = Linear(D, inner, bias=False, device_mesh=device_mesh, dtype=dtype)
        self.k = Linear(D, inner, bias=False, device_mesh=device_mesh, dtype=dtype)
        self.v = Linear(D, inner, bias=False, device_mesh=device_mesh, dtype=dtype)
        self.o = Linear(inner, D, bias=False, device_mesh=device_mesh, dtype=dtype)
        if has_relative_attention_bias:
            self.relative_attention_bias = Embedding(self.num_buckets, config.num_heads, device_mesh=device_mesh,
                                                     dtype=dtype)

    def compute_bias(self, length, mesh):
        """(1, H, L, L): the learned bias of each head by the bucket of each key's relative position
        (the bucket table made on the host, the lookup on the devices)."""
        buckets = distribute_tensor(relative_position_buckets(length, self.num_buckets, self.max_distance), mesh)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def forward(self, x, bias):
        B, L, _ = x.shape                                                       # x: (B, L, D)
        q = self.q(x).view(B, L, -1, self.d_kv).transpose(1, 2)                # (B, H, L, Dk)
        k = self.k(x).view(B, L, -1, self.d_kv).transpose(1, 2)
        v = self.v(x).view(B, L, -1, self.d_kv).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)  # T5 does not scale the scores
        return self.o(o.transpose(1, 2).reshape(B, L, -1))                      # (B, L, D)


class T5LayerSelfAttention(Module):
    def __init__(self, config, has_relative_attention_bias=False, device_mesh=None, dtype=None):
        super().__init__()
        self.SelfAttention = T5Attention(config, has_relative_attention_bias, device_mesh, dtype)
        self.layer_norm = RMSNorm(config.d_model, eps=config.layer_norm_epsilon, device_mesh=device_mesh, dtype=dtype)

    def forward(self, h, bias):
        return h + self.SelfAttention(self.layer_norm(h), bias)


class T5DenseActDense(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.wi = Linear(config.d_model, config.d_ff, bias=False, device_mesh=device_mesh, dtype=dtype)
        self.wo = Linear(config.d_ff, config.d_model, bias=False, device_mesh=device_mesh, dtype=dtype)
        self.act = ACTIVATIONS[config.dense_act_fn]()

    def forward(self, x):
        return self.wo(self.act(self.wi(x)))


class T5DenseGatedActDense(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.wi_0 = Linear(config.d_model, config.d_ff, bias=False, device_mesh=device_mesh, dtype=dtype)
        self.wi_1 = Linear(config.d_model, config.d_ff, bias=False, device_mesh=device_mesh, dtype=dtype)
        self.wo = Linear(config.d_ff, config.d_model, bias=False, device_mesh=device_mesh, dtype=dtype)
        self.act = ACTIVATIONS[config.dense_act_fn]()

    def forward(self, x):
        return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))


class T5LayerFF(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        dense = T5DenseGatedActDense if config.is_gated_act else T5DenseActDense
        self.DenseReluDense = dense(config, device_mesh, dtype)
        self.layer_norm = RMSNorm(config.d_model, eps=config.layer_norm_epsilon, device_mesh=device_mesh, dtype=dtype)

    def forward(self, h):
        return h + self.DenseReluDense(self.layer_norm(h))


class T5Block(Module):
    def __init__(self, config, has_relative_attention_bias=False, device_mesh=None, dtype=None):
        super().__init__()
        self.layer = ModuleList([T5LayerSelfAttention(config, has_relative_attention_bias, device_mesh, dtype),
                                 T5LayerFF(config, device_mesh, dtype)])

    def forward(self, h, bias):
        return self.layer[1](self.layer[0](h, bias))


def padding_bias(attention_mask, h):
    """(B, 1, 1, L) additive mask of the keys: 0 on tokens, the dtype's lowest value on padding (as
    transformers adds it). ``attention_mask``: host (B, L) or a DTensor."""
    B, L, _ = h.shape
    low = float(np.finfo(np.float16).min) if h.dtype == _dtype.float16 else float(np.finfo(np.float32).min)
    if not hasattr(attention_mask, "device_mesh"):
        keep = PreTrainedTextEncoder._host_mask(attention_mask, (B, L))
        bias = np.where(keep, 0.0, low).astype(np.float32).reshape(B, 1, 1, L)
        return _on_mesh_like(bias, h, h.device_mesh).to(h.dtype)
    keep = attention_mask if attention_mask.dtype == _dtype.bool else attention_mask != 0
    keep = _on_mesh_like(keep, h, h.device_mesh)
    return ((keep.to(_dtype.float32) - 1.0) * -low).to(h.dtype).view(B, 1, 1, L)


class T5Stack(Module):
    """The encoder: ``embed_tokens`` (the model's ``shared``), ``block``s, ``final_layer_norm``."""

    def __init__(self, config, embed_tokens, device_mesh=None, dtype=None):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.block = ModuleList([T5Block(config, i == 0, device_mesh, dtype) for i in range(config.num_layers)])
        self.final_layer_norm = RMSNorm(config.d_model, eps=config.layer_norm_epsilon, device_mesh=device_mesh,
                                        dtype=dtype)

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        h = self.embed_tokens(input_ids)                                       # (B, L, D)
        L = h.shape[1]
        states = [h]
        if self.block:
            bias = self.block[0].layer[0].SelfAttention.compute_bias(L, input_ids.device_mesh)   # (1, H, L, L)
            if attention_mask is not None:
                bias = bias + padding_bias(attention_mask, h)                  # (B, H, L, L)
        for block in self.block:
            h = block(h, bias)
            states.append(h)
        h = self.final_layer_norm(h)
        # transformers' hidden_states: the embeddings, then each block's output, the last one normed
        states[-1] = h
        return BaseModelOutput(h, tuple(states) if output_hidden_states else None)


class T5EncoderModel(PreTrainedTextEncoder):
    """T5's encoder: ``model(input_ids, attention_mask=None, output_hidden_states=False)`` ->
    ``.last_hidden_state`` (B, L, D, after final_layer_norm) and ``.hidden_states`` when asked (the
    embeddings and every block's output, the last one after final_layer_norm, as transformers
    returns them)."""

    config_class = T5Config
    tied_keys = {"encoder.embed_tokens.weight": "shared.weight"}

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        if not isinstance(config, T5Config):
            config = T5Config(config)
        self.config = config
        self.shared = Embedding(config.vocab_size, config.d_model, device_mesh=device_mesh, dtype=dtype)
        self.encoder = T5Stack(config, self.shared, device_mesh, dtype)

    def input_embeddings(self):
        return self.shared

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        return self.encoder(self._ids(input_ids), attention_mask, output_hidden_states)

    @classmethod
    def _adapt_checkpoint(cls, checkpoint):
        """The tied embedding under whichever of its two names the file lacks."""
        for alias, key in cls.tied_keys.items():
            for want, have in ((alias, key), (key, alias)):
                if want not in checkpoint and have in checkpoint:
                    add_alias(checkpoint, want, have)
                    return {want}
        return set()
