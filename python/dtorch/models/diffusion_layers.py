"""The layers the diffusion transformers share, with diffusers' module trees and parameter names:
timestep and pooled-text embeddings, adaptive layer norms (modulation by the conditioning
vector), the feed-forward block, joint attention over image and text tokens, and FLUX's rotary
embedding. Inference only; every layer takes ``device_mesh=`` and ``dtype=``.

Single-device code: every op follows the placements of its inputs. Attention calls its
``attention`` slot for the joint attention, by default ``joint_attention`` here (one device);
``diffusion_parallel.py`` puts a Ulysses or ring one there (dtorch.parallel.sequence) from outside."""
import math

import numpy as np

from .. import _dtype
from .._factory import distribute_tensor, zeros
from .._tensor import DTensor
from .._ops_view import cat, stack
from ..nn import functional as F
from ..nn.containers import ModuleList
from ..nn.layers import Dropout, LayerNorm, Linear, RMSNorm, SiLU
from ..nn.module import Module


# ---- timesteps ---------------------------------------------------------------------------------------

def timestep_frequencies(embedding_dim, downscale_freq_shift=1.0, max_period=10000):
    """exp(-log(max_period) * i / (half - shift)) for i < half = embedding_dim // 2, float32."""
    half = embedding_dim // 2
    exponent = -math.log(max_period) * np.arange(half, dtype=np.float32) / np.float32(half - downscale_freq_shift)
    return np.exp(exponent).astype(np.float32)


def get_timestep_embedding(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1.0, scale=1.0,
                           max_period=10000):
    """diffusers' sinusoidal timestep embedding (B,) -> (B, embedding_dim): [sin, cos] of t * freqs
    ([cos, sin] with flip_sin_to_cos), zero-padded when embedding_dim is odd. ``timesteps`` is a
    DTensor (computed on its devices) or host numbers (computed here, float32)."""
    freqs = timestep_frequencies(embedding_dim, downscale_freq_shift, max_period)
    if isinstance(timesteps, DTensor):
        angles = timesteps.to(_dtype.float32).unsqueeze(1) * distribute_tensor(freqs[None, :], timesteps.device_mesh)
        angles = angles * float(scale)
        parts = [angles.cos(), angles.sin()] if flip_sin_to_cos else [angles.sin(), angles.cos()]
        if embedding_dim % 2:
            parts.append(zeros((timesteps.shape[0], 1), device_mesh=timesteps.device_mesh, dtype=_dtype.float32,
                               placements=angles.placements))
        return cat(parts, dim=-1)
    t = np.asarray(timesteps, dtype=np.float32).reshape(-1)
    angles = (t[:, None] * freqs[None, :] * np.float32(scale)).astype(np.float32)
    parts = [np.cos(angles), np.sin(angles)] if flip_sin_to_cos else [np.sin(angles), np.cos(angles)]
    emb = np.concatenate(parts, axis=-1)
    if embedding_dim % 2:
        emb = np.pad(emb, ((0, 0), (0, 1)))
    return emb.astype(np.float32)


class Timesteps(Module):
    """No weights: the sinusoidal embedding of the timesteps."""

    def __init__(self, num_channels, flip_sin_to_cos, downscale_freq_shift, scale=1, device_mesh=None, dtype=None):
        super().__init__()
        self.num_channels, self.flip_sin_to_cos = num_channels, flip_sin_to_cos
        self.downscale_freq_shift, self.scale = downscale_freq_shift, scale

    def forward(self, timesteps):
        return get_timestep_embedding(timesteps, self.num_channels, self.flip_sin_to_cos, self.downscale_freq_shift,
                                      self.scale)


class TimestepEmbedding(Module):
    """linear_1 -> SiLU -> linear_2."""

    def __init__(self, in_channels, time_embed_dim, device_mesh=None, dtype=None):
        super().__init__()
        self.linear_1 = Linear(in_channels, time_embed_dim, device_mesh=device_mesh, dtype=dtype)
        self.act = SiLU()
        self.linear_2 = Linear(time_embed_dim, time_embed_dim, device_mesh=device_mesh, dtype=dtype)

    def forward(self, sample):
        return self.linear_2(self.act(self.linear_1(sample)))


class PixArtAlphaTextProjection(Module):
    """The pooled text embedding's projection: linear_1 -> SiLU -> linear_2."""

    def __init__(self, in_features, hidden_size, out_features=None, act_fn="silu", device_mesh=None, dtype=None):
        super().__init__()
        if act_fn != "silu":
            raise NotImplementedError(f"PixArtAlphaTextProjection: act_fn {act_fn!r} (only 'silu')")
        self.linear_1 = Linear(in_features, hidden_size, device_mesh=device_mesh, dtype=dtype)
        self.act_1 = SiLU()
        self.linear_2 = Linear(hidden_size, out_features or hidden_size, device_mesh=device_mesh, dtype=dtype)

    def forward(self, caption):
        return self.linear_2(self.act_1(self.linear_1(caption)))


class CombinedTimestepTextProjEmbeddings(Module):
    """SD3's conditioning vector: the timestep's embedding plus the pooled text's projection."""

    def __init__(self, embedding_dim, pooled_projection_dim, device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.time_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.timestep_embedder = TimestepEmbedding(256, embedding_dim, **kw)
        self.text_embedder = PixArtAlphaTextProjection(pooled_projection_dim, embedding_dim, **kw)

    def forward(self, timestep, pooled_projection):
        mesh, dtype = pooled_projection.device_mesh, pooled_projection.dtype
        timesteps_emb = self.timestep_embedder(on_mesh(self.time_proj(timestep), mesh, dtype))
        return timesteps_emb + self.text_embedder(pooled_projection)


class CombinedTimestepGuidanceTextProjEmbeddings(Module):
    """FLUX-dev's conditioning vector: timestep, guidance scale and pooled text, each embedded."""

    def __init__(self, embedding_dim, pooled_projection_dim, device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.time_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.timestep_embedder = TimestepEmbedding(256, embedding_dim, **kw)
        self.guidance_embedder = TimestepEmbedding(256, embedding_dim, **kw)
        self.text_embedder = PixArtAlphaTextProjection(pooled_projection_dim, embedding_dim, **kw)

    def forward(self, timestep, guidance, pooled_projection):
        mesh, dtype = pooled_projection.device_mesh, pooled_projection.dtype
        timesteps_emb = self.timestep_embedder(on_mesh(self.time_proj(timestep), mesh, dtype))
        guidance_emb = self.guidance_embedder(on_mesh(self.time_proj(guidance), mesh, dtype))
        return timesteps_emb + guidance_emb + self.text_embedder(pooled_projection)


def on_mesh(x, mesh, dtype):
    """A host array (put on ``mesh`` whole) or a DTensor on ``mesh``, in ``dtype``."""
    if not isinstance(x, DTensor):
        x = distribute_tensor(np.ascontiguousarray(x), mesh)
    elif x.device_mesh != mesh:
        raise ValueError(f"an input lives on {x.device_mesh}, not on the model's mesh {mesh}")
    return x if x.dtype == dtype else x.to(dtype)


# ---- adaptive layer norms --------------------------------------------------------------------------------

def modulate(x, scale, shift):
    """x * (1 + scale) + shift, the conditioning vectors (B, C) broadcast over the tokens of x (B, L, C)."""
    return x * (scale.unsqueeze(1) + 1.0) + shift.unsqueeze(1)


class AdaLayerNormZero(Module):
    """Layer norm modulated by the conditioning vector, which also gives the gates and the MLP's
    modulation: linear(silu(emb)) chunked into shift, scale, gate (attention) and shift, scale,
    gate (MLP)."""

    def __init__(self, embedding_dim, bias=True, device_mesh=None, dtype=None):
        super().__init__()
        self.silu = SiLU()
        self.linear = Linear(embedding_dim, 6 * embedding_dim, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.norm = LayerNorm(embedding_dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x, emb):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.linear(self.silu(emb)).chunk(6, dim=1)
        return modulate(self.norm(x), scale_msa, shift_msa), gate_msa, shift_mlp, scale_mlp, gate_mlp


class SD35AdaLayerNormZeroX(Module):
    """SD3.5's AdaLayerNormZero for blocks with a second (image-only) attention: linear(silu(emb))
    chunked into nine: shift, scale, gate (attention), shift, scale, gate (MLP) and shift, scale,
    gate (the second attention), whose input is the same normed tokens modulated by its own pair."""

    def __init__(self, embedding_dim, norm_type="layer_norm", bias=True, device_mesh=None, dtype=None):
        super().__init__()
        if norm_type != "layer_norm":
            raise NotImplementedError(f"SD35AdaLayerNormZeroX: norm_type {norm_type!r} (only 'layer_norm')")
        self.silu = SiLU()
        self.linear = Linear(embedding_dim, 9 * embedding_dim, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.norm = LayerNorm(embedding_dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x, emb):
        """(attention input, gate, MLP shift, MLP scale, MLP gate, second attention input, its gate)."""
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_msa2, scale_msa2,
         gate_msa2) = self.linear(self.silu(emb)).chunk(9, dim=1)
        normed = self.norm(x)
        return (modulate(normed, scale_msa, shift_msa), gate_msa, shift_mlp, scale_mlp, gate_mlp,
                modulate(normed, scale_msa2, shift_msa2), gate_msa2)


class AdaLayerNormZeroSingle(Module):
    """FLUX's single-stream block norm: shift, scale and gate from linear(silu(emb))."""

    def __init__(self, embedding_dim, bias=True, device_mesh=None, dtype=None):
        super().__init__()
        self.silu = SiLU()
        self.linear = Linear(embedding_dim, 3 * embedding_dim, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.norm = LayerNorm(embedding_dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x, emb):
        shift_msa, scale_msa, gate_msa = self.linear(self.silu(emb)).chunk(3, dim=1)
        return modulate(self.norm(x), scale_msa, shift_msa), gate_msa


class AdaLayerNormContinuous(Module):
    """The final (and SD3's last context) norm: scale and shift, in that order, from
    linear(silu(conditioning))."""

    def __init__(self, embedding_dim, conditioning_embedding_dim, elementwise_affine=True, eps=1e-5, bias=True,
                 norm_type="layer_norm", device_mesh=None, dtype=None):
        super().__init__()
        if norm_type != "layer_norm":
            raise NotImplementedError(f"AdaLayerNormContinuous: norm_type {norm_type!r} (only 'layer_norm')")
        self.silu = SiLU()
        self.linear = Linear(conditioning_embedding_dim, embedding_dim * 2, bias=bias, device_mesh=device_mesh,
                             dtype=dtype)
        self.norm = LayerNorm(embedding_dim, eps=eps, elementwise_affine=elementwise_affine, bias=bias,
                              device_mesh=device_mesh, dtype=dtype)

    def forward(self, x, conditioning_embedding):
        scale, shift = self.linear(self.silu(conditioning_embedding)).chunk(2, dim=1)
        return modulate(self.norm(x), scale, shift)


# ---- feed-forward ------------------------------------------------------------------------------------------

class GELUProjection(Module):
    """diffusers' GELU activation module: a projection, then GELU (``approximate``)."""

    def __init__(self, dim_in, dim_out, approximate="none", bias=True, device_mesh=None, dtype=None):
        super().__init__()
        self.proj = Linear(dim_in, dim_out, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.approximate = approximate

    def forward(self, hidden_states):
        return F.gelu(self.proj(hidden_states), approximate=self.approximate)


class FeedForward(Module):
    """net.0 (projection + GELU), net.1 (dropout), net.2 (the output projection)."""

    def __init__(self, dim, dim_out=None, mult=4, activation_fn="gelu-approximate", inner_dim=None, bias=True,
                 device_mesh=None, dtype=None):
        super().__init__()
        approximate = {"gelu": "none", "gelu-approximate": "tanh"}.get(activation_fn)
        if approximate is None:
            raise NotImplementedError(f"FeedForward: activation_fn {activation_fn!r} (only 'gelu', 'gelu-approximate')")
        inner_dim = inner_dim or int(dim * mult)
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.net = ModuleList([GELUProjection(dim, inner_dim, approximate, bias=bias, **kw), Dropout(0.0),
                               Linear(inner_dim, dim_out or dim, bias=bias, **kw)])

    def forward(self, hidden_states):
        for module in self.net:
            hidden_states = module(hidden_states)
        return hidden_states


# ---- rotary embedding (FLUX) ----------------------------------------------------------------------------------

def apply_rotary_emb(x, cos, sin):
    """x (B, H, L, D) rotated by angle pairs, the pairs interleaved as FLUX lays them out
    ((x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)); cos, sin (1, 1, L, D), each angle repeated
    twice, laid out like x's tokens. Computed in the tables' dtype (float32), returned in x's, as
    diffusers does."""
    pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = stack([-imag, real], dim=-1).flatten(3)
    out = x * cos + rotated * sin
    return out if out.dtype == x.dtype else out.to(x.dtype)


# ---- attention --------------------------------------------------------------------------------------------------

def joint_attention(query, key, value, context_query=None, context_key=None, context_value=None,
                    context_first=False, scale=None):
    """One softmax over the image tokens (query, key, value: (B, H, L, D)) and the text tokens
    (context_*: (B, H, T, D), or None), every query seeing every key: the two concatenated along
    the sequence (the text first with ``context_first``), attended, and split again. Returns the
    image part and the text part (None without a context). The default of Attention's slot."""
    if context_query is None:
        return F.scaled_dot_product_attention(query, key, value, scale=scale), None
    first, second = (query, key, value), (context_query, context_key, context_value)
    if context_first:
        first, second = second, first
    q, k, v = (cat([a, b], dim=2) for a, b in zip(first, second))
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    n = first[0].shape[2]
    out_first, out_second = out[:, :, :n], out[:, :, n:]
    return (out_second, out_first) if context_first else (out_first, out_second)


def _qk_norm(kind, dim_head, eps, kw):
    if kind is None:
        return None
    if kind == "rms_norm":
        return RMSNorm(dim_head, eps=eps, **kw)
    if kind == "layer_norm":
        return LayerNorm(dim_head, eps=eps, **kw)
    raise NotImplementedError(f"Attention: qk_norm {kind!r} (only None, 'rms_norm', 'layer_norm')")


class Attention(Module):
    """diffusers' joint attention over image tokens (``to_q``, ``to_k``, ``to_v``, ``to_out.0``) and
    text tokens (``add_q_proj``, ``add_k_proj``, ``add_v_proj``, ``to_add_out`` when
    ``added_kv_proj_dim``), with optional per-head q/k norms (``norm_q``, ``norm_k``,
    ``norm_added_q``, ``norm_added_k``). ``context_pre_only``: the text output is not projected
    (SD3's last block). ``pre_only``: no output projection at all (FLUX's single blocks).
    ``attention``: the slot the joint attention runs in (``joint_attention`` here; a parallel plan
    puts another there)."""

    def __init__(self, query_dim, heads=8, dim_head=64, added_kv_proj_dim=None, out_dim=None, bias=True,
                 out_bias=True, added_proj_bias=True, context_pre_only=None, pre_only=False, qk_norm=None, eps=1e-5,
                 device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.heads, self.dim_head = heads, dim_head
        inner_dim = heads * dim_head
        out_dim = out_dim or query_dim
        self.context_pre_only, self.pre_only = context_pre_only, pre_only
        self.to_q = Linear(query_dim, inner_dim, bias=bias, **kw)
        self.to_k = Linear(query_dim, inner_dim, bias=bias, **kw)
        self.to_v = Linear(query_dim, inner_dim, bias=bias, **kw)
        self._set_optional("norm_q", _qk_norm(qk_norm, dim_head, eps, kw))
        self._set_optional("norm_k", _qk_norm(qk_norm, dim_head, eps, kw))
        if not pre_only:
            self.to_out = ModuleList([Linear(inner_dim, out_dim, bias=out_bias, **kw), Dropout(0.0)])
        if added_kv_proj_dim is not None:
            self.add_q_proj = Linear(added_kv_proj_dim, inner_dim, bias=added_proj_bias, **kw)
            self.add_k_proj = Linear(added_kv_proj_dim, inner_dim, bias=added_proj_bias, **kw)
            self.add_v_proj = Linear(added_kv_proj_dim, inner_dim, bias=added_proj_bias, **kw)
            self._set_optional("norm_added_q", _qk_norm(qk_norm, dim_head, eps, kw))
            self._set_optional("norm_added_k", _qk_norm(qk_norm, dim_head, eps, kw))
            if not context_pre_only:
                self.to_add_out = Linear(inner_dim, out_dim, bias=out_bias, **kw)
        self.added_kv_proj_dim = added_kv_proj_dim
        self.attention = joint_attention

    def _set_optional(self, name, module):
        if module is not None:
            setattr(self, name, module)
        else:
            object.__setattr__(self, name, None)

    def _heads(self, x, to, norm):
        """A projection's output (B, L, heads * D) as (B, heads, L, D), normed per head."""
        B, L, _ = x.shape
        x = to(x).view(B, L, self.heads, self.dim_head).transpose(1, 2)
        return norm(x) if norm is not None else x

    def forward(self, hidden_states, encoder_hidden_states=None, image_rotary_emb=None, context_first=False):
        """Image tokens (B, L, C) and text tokens (B, Lt, C) or None -> the attention's outputs for
        both (text None without them). Without added projections the text tokens go through the
        image projections (FLUX's single blocks keep the two apart only for the layout).
        ``image_rotary_emb``: ((cos, sin) of the image tokens, (cos, sin) of the text tokens) or
        None. ``context_first``: the text tokens come first in the joint sequence (FLUX)."""
        query = self._heads(hidden_states, self.to_q, self.norm_q)
        key = self._heads(hidden_states, self.to_k, self.norm_k)
        value = self._heads(hidden_states, self.to_v, None)
        context = [None, None, None]
        if encoder_hidden_states is not None:
            if self.added_kv_proj_dim is not None:
                projections = ((self.add_q_proj, self.norm_added_q), (self.add_k_proj, self.norm_added_k),
                               (self.add_v_proj, None))
            else:
                projections = ((self.to_q, self.norm_q), (self.to_k, self.norm_k), (self.to_v, None))
            context = [self._heads(encoder_hidden_states, to, norm) for to, norm in projections]
        if image_rotary_emb is not None:
            (cos, sin), (context_cos, context_sin) = image_rotary_emb
            query, key = apply_rotary_emb(query, cos, sin), apply_rotary_emb(key, cos, sin)
            if context[0] is not None:
                context[0] = apply_rotary_emb(context[0], context_cos, context_sin)
                context[1] = apply_rotary_emb(context[1], context_cos, context_sin)
        out, context_out = self.attention(query, key, value, *context, context_first=context_first,
                                          scale=1.0 / math.sqrt(self.dim_head))
        out = self._tokens(out)
        context_out = self._tokens(context_out) if context_out is not None else None
        if not self.pre_only:
            out = self.to_out[0](out)
        if context_out is not None and self.added_kv_proj_dim is not None and not self.context_pre_only:
            context_out = self.to_add_out(context_out)
        return out, context_out

    @staticmethod
    def _tokens(x):
        """(B, heads, L, D) back to (B, L, heads * D)."""
        B, H, L, D = x.shape
        return x.transpose(1, 2).reshape(B, L, H * D)

    def extra_repr(self):
        return f"heads={self.heads}, dim_head={self.dim_head}"
