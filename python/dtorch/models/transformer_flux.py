"""FLUX.1 (Black Forest Labs 2024): a rectified-flow transformer over packed image latents and T5
text tokens, in diffusers' format. Double-stream blocks give image and text tokens their own
weights and one joint attention; single-stream blocks share one set of weights over both, with
attention and an MLP side by side; 3-axis rotary embeddings from the token ids.

Module tree, parameter names and semantics are diffusers' ``transformer_flux.py``, so
``state_dict()`` keys equal a checkpoint's. Unlike diffusers, the single-stream blocks keep the text
and image tokens as two tensors (everything there is per token but attention, which takes the text
as its context), so that a plan may split the image stream on the sequence from ``x_embedder`` to
the output and keep the text whole. The file is single-device code: ``parallelize_flux``
(diffusion_parallel.py) lays the model out from outside by the mesh's dim names (dp, tp, ulysses,
ring). Shapes in comments: B batch, N image tokens, T text tokens, C inner dim (heads * head_dim),
D head_dim.
"""
import numpy as np

from .. import _dtype
from .._factory import distribute_tensor
from .._ops_view import cat
from .._tensor import DTensor
from ..nn.containers import ModuleList
from ..nn.layers import GELU, LayerNorm, Linear
from ..nn.module import Module
from .config_fields import count, flag, listing, optional
from .diffusion_layers import (AdaLayerNormContinuous, AdaLayerNormZero, AdaLayerNormZeroSingle, Attention,
                               CombinedTimestepGuidanceTextProjEmbeddings, CombinedTimestepTextProjEmbeddings,
                               FeedForward, modulate, on_mesh)
from .diffusion_parallel import mesh_dim_sizes, parallelize_flux
from .modeling_diffusers import DiffusersModel, Transformer2DModelOutput

_FLOAT16_MAX = 65504.0


def rotary_table(axes_dim, ids, theta=10000):
    """FLUX's rotary (cos, sin) (L, sum(axes_dim)) float32 of ids (L, len(axes_dim)): for each axis
    the angles position * theta^(-2i/dim) in float64, each repeated twice (interleaved pairs), the
    axes side by side, as diffusers' FluxPosEmbed computes them."""
    pos = np.asarray(ids).astype(np.float32).astype(np.float64)
    cos, sin = [], []
    for axis, dim in enumerate(axes_dim):
        freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64)[: dim // 2] / dim)
        angles = np.outer(pos[:, axis], freqs)
        cos.append(np.repeat(np.cos(angles), 2, axis=1))
        sin.append(np.repeat(np.sin(angles), 2, axis=1))
    return np.concatenate(cos, -1).astype(np.float32), np.concatenate(sin, -1).astype(np.float32)


class FluxPosEmbed(Module):
    """No weights: the rotary tables of the image and the text tokens, computed on the host from
    their ids (N, 3) and (T, 3): (cos, sin, context_cos, context_sin), float32 (1, 1, N | T, D) as
    the queries (B, H, N | T, D) they rotate."""

    def __init__(self, theta, axes_dim):
        super().__init__()
        self.theta, self.axes_dim = theta, tuple(axes_dim)

    def forward(self, img_ids, txt_ids):
        tables = rotary_table(self.axes_dim, img_ids, self.theta) + rotary_table(self.axes_dim, txt_ids, self.theta)
        return tuple(t[None, None] for t in tables)


def _clip_float16(x):
    return x.clamp(-_FLOAT16_MAX, _FLOAT16_MAX) if x.dtype == _dtype.float16 else x


class FluxTransformerBlock(Module):
    """Double-stream block: per-stream adaptive norms, one joint attention (text first in the
    sequence), per-stream gated feed-forwards."""

    def __init__(self, dim, num_attention_heads, attention_head_dim, qk_norm="rms_norm", eps=1e-6, device_mesh=None,
                 dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.norm1 = AdaLayerNormZero(dim, **kw)
        self.norm1_context = AdaLayerNormZero(dim, **kw)
        self.attn = Attention(query_dim=dim, added_kv_proj_dim=dim, dim_head=attention_head_dim,
                              heads=num_attention_heads, out_dim=dim, context_pre_only=False, bias=True,
                              qk_norm=qk_norm, eps=eps, **kw)
        self.norm2 = LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim=dim, dim_out=dim, activation_fn="gelu-approximate", **kw)
        self.norm2_context = LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff_context = FeedForward(dim=dim, dim_out=dim, activation_fn="gelu-approximate", **kw)

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None):
        """Image (B, N, C) and text (B, T, C) tokens, temb (B, C) -> (text, image) as diffusers orders them."""
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, temb)
        norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
            encoder_hidden_states, temb)
        attn_output, context_attn_output = self.attn(norm_hidden_states, norm_encoder_hidden_states,
                                                     image_rotary_emb=image_rotary_emb, context_first=True)

        hidden_states = hidden_states + gate_msa.unsqueeze(1) * attn_output
        ff_output = self.ff(modulate(self.norm2(hidden_states), scale_mlp, shift_mlp))
        hidden_states = hidden_states + gate_mlp.unsqueeze(1) * ff_output

        encoder_hidden_states = encoder_hidden_states + c_gate_msa.unsqueeze(1) * context_attn_output
        context_ff_output = self.ff_context(modulate(self.norm2_context(encoder_hidden_states), c_scale_mlp,
                                                     c_shift_mlp))
        encoder_hidden_states = encoder_hidden_states + c_gate_mlp.unsqueeze(1) * context_ff_output
        return _clip_float16(encoder_hidden_states), hidden_states


class FluxSingleTransformerBlock(Module):
    """Single-stream block: one adaptive norm, then attention and an MLP side by side, their outputs
    concatenated on the channels into one gated projection; the same weights for text and image."""

    def __init__(self, dim, num_attention_heads, attention_head_dim, mlp_ratio=4.0, device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.mlp_hidden_dim = int(dim * mlp_ratio)
        self.norm = AdaLayerNormZeroSingle(dim, **kw)
        self.proj_mlp = Linear(dim, self.mlp_hidden_dim, **kw)
        self.act_mlp = GELU(approximate="tanh")
        self.proj_out = Linear(dim + self.mlp_hidden_dim, dim, **kw)
        self.attn = Attention(query_dim=dim, dim_head=attention_head_dim, heads=num_attention_heads, out_dim=dim,
                              bias=True, qk_norm="rms_norm", eps=1e-6, pre_only=True, **kw)

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None):
        """Image (B, N, C) and text (B, T, C) tokens, temb (B, C) -> (text, image); diffusers runs
        this on their concatenation [text, image], which is the same per token."""
        # the norm's modulation once for both streams (AdaLayerNormZeroSingle's forward, split)
        shift_msa, scale_msa, gate = self.norm.linear(self.norm.silu(temb)).chunk(3, dim=1)
        norm_hidden_states = modulate(self.norm.norm(hidden_states), scale_msa, shift_msa)
        norm_encoder_hidden_states = modulate(self.norm.norm(encoder_hidden_states), scale_msa, shift_msa)
        attn_output, context_attn_output = self.attn(norm_hidden_states, norm_encoder_hidden_states,
                                                     image_rotary_emb=image_rotary_emb, context_first=True)
        gate = gate.unsqueeze(1)
        out = []
        for x, norm_x, attn_x in ((encoder_hidden_states, norm_encoder_hidden_states, context_attn_output),
                                  (hidden_states, norm_hidden_states, attn_output)):
            mlp_x = self.act_mlp(self.proj_mlp(norm_x))
            out.append(_clip_float16(x + gate * self.proj_out(cat([attn_x, mlp_x], dim=2))))
        return out[0], out[1]


class FluxTransformer2DModel(DiffusersModel):
    """FLUX.1's transformer (dev with ``guidance_embeds=True``, schnell without). ``forward`` takes
    the packed latents (B, N, in_channels), the T5 tokens (B, T, joint_attention_dim), CLIP's pooled
    embedding (B, pooled_projection_dim), the timestep (B,) in [0, 1] and the ids (N, 3), (T, 3)."""

    config_defaults = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
                           attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                           pooled_projection_dim=768, guidance_embeds=False, axes_dims_rope=(16, 56, 56))
    config_kinds = dict(patch_size=count(), in_channels=count(), out_channels=optional(count()), num_layers=count(0),
                        num_single_layers=count(0), attention_head_dim=count(), num_attention_heads=count(),
                        joint_attention_dim=count(), pooled_projection_dim=count(), guidance_embeds=flag,
                        axes_dims_rope=listing(count(0), nonempty=True))

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.config = config
        if device_mesh is not None and device_mesh.mesh_dim_names is not None:
            mesh_dim_sizes(device_mesh, type(self).__name__)     # an unknown dim name, refused at once
        if sum(config.axes_dims_rope) != config.attention_head_dim or any(d % 2 for d in config.axes_dims_rope):
            raise ValueError(f"FluxTransformer2DModel: axes_dims_rope {tuple(config.axes_dims_rope)} must be even "
                             f"and add up to attention_head_dim {config.attention_head_dim}")
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.out_channels = config.out_channels or config.in_channels
        self.inner_dim = config.num_attention_heads * config.attention_head_dim
        heads = dict(num_attention_heads=config.num_attention_heads, attention_head_dim=config.attention_head_dim)

        self.pos_embed = FluxPosEmbed(theta=10000, axes_dim=config.axes_dims_rope)
        embeddings = (CombinedTimestepGuidanceTextProjEmbeddings if config.guidance_embeds
                      else CombinedTimestepTextProjEmbeddings)
        self.time_text_embed = embeddings(embedding_dim=self.inner_dim,
                                          pooled_projection_dim=config.pooled_projection_dim, **kw)
        self.context_embedder = Linear(config.joint_attention_dim, self.inner_dim, **kw)
        self.x_embedder = Linear(config.in_channels, self.inner_dim, **kw)
        self.transformer_blocks = ModuleList(
            [FluxTransformerBlock(self.inner_dim, **heads, **kw) for _ in range(config.num_layers)])
        self.single_transformer_blocks = ModuleList(
            [FluxSingleTransformerBlock(self.inner_dim, **heads, **kw) for _ in range(config.num_single_layers)])
        self.norm_out = AdaLayerNormContinuous(self.inner_dim, self.inner_dim, elementwise_affine=False, eps=1e-6,
                                               **kw)
        self.proj_out = Linear(self.inner_dim, config.patch_size * config.patch_size * self.out_channels, **kw)
        self._rotary = {}

    def parallelize(self, device_mesh):
        """``parallelize_flux(self, device_mesh)``: the layout by the mesh's dim names (dp, tp,
        ulysses, ring); returns self."""
        return parallelize_flux(self, device_mesh)

    def forward(self, hidden_states, encoder_hidden_states=None, pooled_projections=None, timestep=None,
                img_ids=None, txt_ids=None, guidance=None, return_dict=True):
        """The prediction (B, N, patch_size**2 * out_channels). Inputs are DTensors on the model's
        mesh or host arrays; ``timestep`` and ``guidance`` are scaled by 1000 before their
        embeddings, as diffusers does."""
        if (guidance is not None) != bool(self.config.guidance_embeds):
            raise ValueError(f"FluxTransformer2DModel: guidance_embeds is {self.config.guidance_embeds}: "
                             f"{'give' if self.config.guidance_embeds else 'give no'} guidance")
        mesh = self.device_mesh
        hidden_states = self.x_embedder(self._on_mesh(hidden_states))                    # (B, N, C)
        dtype = hidden_states.dtype
        timestep = on_mesh(timestep, mesh, dtype) * 1000.0
        pooled_projections = self._on_mesh(pooled_projections)
        if guidance is None:
            temb = self.time_text_embed(timestep, pooled_projections)                       # (B, C)
        else:
            guidance = on_mesh(guidance, mesh, dtype) * 1000.0
            temb = self.time_text_embed(timestep, guidance, pooled_projections)
        encoder_hidden_states = self.context_embedder(self._on_mesh(encoder_hidden_states))  # (B, T, C)

        image_rotary_emb = self._rotary_emb(img_ids, txt_ids, hidden_states.shape[1], encoder_hidden_states.shape[1])
        for block in self.transformer_blocks:
            encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states, temb, image_rotary_emb)
        for block in self.single_transformer_blocks:
            encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states, temb, image_rotary_emb)

        output = self.proj_out(self.norm_out(hidden_states, temb))
        if not return_dict:
            return (output,)
        return Transformer2DModelOutput(sample=output)

    def _on_mesh(self, x, dtype=None):
        """A DTensor on the model's mesh as it is; a host array put there whole, in ``dtype`` (default
        the weights': numpy has no bfloat16)."""
        mesh = self.device_mesh
        if isinstance(x, DTensor):
            if x.device_mesh != mesh:
                raise ValueError(f"FluxTransformer2DModel: an input lives on {x.device_mesh}, not on the model's "
                                 f"mesh {mesh}")
            return x
        x = distribute_tensor(np.ascontiguousarray(x, dtype=np.float32), mesh)
        dtype = self.x_embedder.weight.dtype if dtype is None else dtype
        return x if x.dtype == dtype else x.to(dtype)

    def _rotary_emb(self, img_ids, txt_ids, n_image, n_text):
        """((cos, sin) of the image tokens, (cos, sin) of the text tokens), each (1, 1, L, D) float32
        on the model's mesh, from ``pos_embed``: made once per pair of ids (a denoising loop passes
        the same ones every step)."""
        img_ids, txt_ids = self._ids(img_ids, n_image, "img_ids"), self._ids(txt_ids, n_text, "txt_ids")
        key = tuple((ids.dtype.str, ids.shape, ids.tobytes()) for ids in (img_ids, txt_ids))
        if key not in self._rotary:
            if len(self._rotary) >= 8:  # another resolution or prompt length: forget the old tables
                self._rotary.clear()
            cos, sin, context_cos, context_sin = (self._on_mesh(t, _dtype.float32)
                                                  for t in self.pos_embed(img_ids, txt_ids))
            self._rotary[key] = ((cos, sin), (context_cos, context_sin))
        return self._rotary[key]

    def _ids(self, ids, length, name):
        """Token ids (L, 3) as a host array, checked against the tokens they stand for."""
        ids = ids.numpy() if isinstance(ids, DTensor) else np.asarray(ids)
        if ids.ndim == 3:  # diffusers' older (1, L, 3) spelling
            ids = ids[0]
        axes = len(self.config.axes_dims_rope)
        if ids.shape != (length, axes):
            raise ValueError(f"FluxTransformer2DModel: {name} must be ({length}, {axes}) for {length} tokens, "
                             f"got {tuple(ids.shape)}")
        return ids
