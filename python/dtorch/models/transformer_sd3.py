"""Stable Diffusion 3's transformer (MMDiT), diffusers' SD3Transformer2DModel: its config, module tree
and parameter names, so a diffusers checkpoint loads as it is.

Image latents (B, C, H, W) are cut into patches and embedded (plus a 2-D sin-cos position table
cropped to the image); the text tokens are projected to the same width; a conditioning vector
comes from the timestep and the pooled text embedding. Each joint block modulates both streams by
that vector (adaptive layer norm: shift, scale and gate per sub-layer), lets image and text tokens
attend to each other in one softmax, and runs an MLP per stream; the last block keeps only the
image stream. A final modulated norm and a projection give each patch's prediction, which is put
back together as an image. SD3.5 adds per-head RMS norms on the queries and keys (``qk_norm``,
both streams) and, in the blocks ``dual_attention_layers`` names (SD3.5 medium), a second
attention over the image tokens alone, modulated by its own shift, scale and gate.

Single-device code: every op follows the placements of its inputs, and attention runs in each
block's attention slot. ``parallelize_sd3`` (diffusion_parallel.py) lays the model out from outside
by the mesh's dim names: ``dp`` splits the batch (the guidance pair), ``tp`` the heads and MLP
channels inside each block, ``ulysses`` and ``ring`` the image tokens."""
import numpy as np

from .._factory import distribute_tensor
from .._tensor import DTensor
from ..nn import functional as F
from ..nn.containers import ModuleList
from ..nn.layers import Conv2d, LayerNorm, Linear
from ..nn.module import MetaTensor, Module
from .config_fields import count, listing, optional, text
from .diffusion_layers import (AdaLayerNormContinuous, AdaLayerNormZero, Attention,
                               CombinedTimestepTextProjEmbeddings, FeedForward, SD35AdaLayerNormZeroX, modulate)
from .diffusion_parallel import mesh_dim_sizes, parallelize_sd3
from .modeling_diffusers import DiffusersModel, Transformer2DModelOutput


def sincos_1d(embed_dim, positions):
    """[sin, cos] of positions * 1 / 10000^(2i / embed_dim), (len(positions), embed_dim), float64."""
    omega = 1.0 / 10000 ** (np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0))
    angles = np.outer(np.asarray(positions, dtype=np.float64).reshape(-1), omega)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_2d(embed_dim, grid_size, base_size, interpolation_scale=1.0):
    """The (grid_size^2, embed_dim) position table of a square grid, row-major over (h, w): the first
    half of the channels encode the column, the second half the row, as diffusers lays them out."""
    coords = np.arange(grid_size, dtype=np.float64) / (grid_size / base_size) / interpolation_scale
    col, row = np.meshgrid(coords, coords, indexing="xy")
    return np.concatenate([sincos_1d(embed_dim // 2, col), sincos_1d(embed_dim // 2, row)], axis=1)


class Patches(Module):
    """Latents (B, C, H, W) -> their patches as tokens (B, H/p * W/p, C * p * p), row-major over the
    patch grid, each token's values in the order of the patch embedding's kernel (C, p, p). No
    weights: a module so that a layout can split its output (the tokens) from outside."""

    def __init__(self, patch_size):
        super().__init__()
        self.patch_size = patch_size

    def forward(self, latent):
        B, C, H, W = latent.shape
        p = self.patch_size
        grid = latent.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
        return grid.reshape(B, (H // p) * (W // p), C * p * p)


class PatchPositions(Module):
    """(height, width) in patches -> (1, height * width) indices into the flattened position table of
    ``max_size`` x ``max_size``: the rows of the table cropped around its centre, row-major. No
    weights: a module so that a layout can split its output like the tokens; the indices are kept
    per image size and mesh (they are constants)."""

    def __init__(self, max_size):
        super().__init__()
        self.max_size = max_size
        object.__setattr__(self, "_made", {})

    def forward(self, height, width, device_mesh):
        size = self.max_size
        if height > size or width > size:
            raise ValueError(f"PatchEmbed: the image is {height} x {width} patches, larger than the position table's "
                             f"{size} x {size} (pos_embed_max_size)")
        key = (height, width, device_mesh)
        if key not in self._made:
            top, left = (size - height) // 2, (size - width) // 2
            rows = (np.arange(top, top + height)[:, None] * size + np.arange(left, left + width)[None, :])
            self._made.clear()
            self._made[key] = distribute_tensor(rows.reshape(1, -1).astype(np.int64), device_mesh)
        return self._made[key]


class PatchEmbed(Module):
    """Latents (B, C, H, W) -> patch tokens (B, H/p * W/p, embed_dim) plus the position table
    cropped around the image's centre (``pos_embed``: (1, max^2, embed_dim), in the checkpoint).

    diffusers' convolution with kernel and stride p is, token by token, the product of the patch's
    values with the kernel: the latent is cut into patch tokens (``patches``), projected by the
    kernel's weight as a linear map, and the position rows are picked by index (``positions``).
    Every op from there on is per token, so where a layout splits the tokens (``patches``' and
    ``positions``' outputs, as parallelize_sd3 does over ulysses and ring), each device projects and
    positions only its own tokens."""

    def __init__(self, height=224, width=224, patch_size=16, in_channels=3, embed_dim=768, pos_embed_max_size=None,
                 interpolation_scale=1, device_mesh=None, dtype=None):
        super().__init__()
        if pos_embed_max_size is None:
            raise NotImplementedError("PatchEmbed: only SD3's cropped position table (pos_embed_max_size) is supported")
        self.patch_size, self.embed_dim = patch_size, embed_dim
        self.pos_embed_max_size = pos_embed_max_size
        self.proj = Conv2d(in_channels, embed_dim, kernel_size=patch_size, stride=patch_size, bias=True,
                           device_mesh=device_mesh, dtype=dtype)
        self.patches = Patches(patch_size)
        self.positions = PatchPositions(pos_embed_max_size)
        shape = (1, pos_embed_max_size ** 2, embed_dim)
        table = sincos_2d(embed_dim, pos_embed_max_size, height // patch_size, interpolation_scale)
        if isinstance(self.proj.weight, MetaTensor):
            self.register_buffer("pos_embed", MetaTensor(shape, self.proj.weight.dtype, self.proj.weight.device_mesh))
        else:
            pos = distribute_tensor(table.astype(np.float32)[None], self.proj.weight.device_mesh)
            self.register_buffer("pos_embed", pos.to(self.proj.weight.dtype))

    def cropped_pos_embed(self, height, width):
        """The table for an image of height x width patches, taken from the centre of the grid."""
        rows = self.positions(height, width, self.pos_embed.device_mesh)
        return F.embedding(rows, self.pos_embed.reshape(self.pos_embed_max_size ** 2, self.embed_dim))

    def forward(self, latent):
        B, C, H, W = latent.shape
        p = self.patch_size
        if H % p or W % p:
            raise ValueError(f"PatchEmbed: the latent's height and width ({H}, {W}) must be multiples of the patch "
                             f"size {p}")
        weight = self.proj.weight
        tokens = F.linear(self.patches(latent), weight.reshape(weight.shape[0], C * p * p), self.proj.bias)
        return tokens + self.cropped_pos_embed(H // p, W // p)


class JointTransformerBlock(Module):
    """One MMDiT block: both streams modulated, joint attention, an MLP per stream (the text
    stream's output only where the block is not the last: ``context_pre_only``). With
    ``use_dual_attention`` (SD3.5 medium) the image stream also runs a second attention over its own
    tokens only (``attn2``), its input and gate from the extra chunks of ``norm1``
    (SD35AdaLayerNormZeroX), added after the joint attention's output."""

    def __init__(self, dim, num_attention_heads, attention_head_dim, context_pre_only=False, qk_norm=None,
                 use_dual_attention=False, device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.context_pre_only, self.use_dual_attention = context_pre_only, use_dual_attention
        self.norm1 = SD35AdaLayerNormZeroX(dim, **kw) if use_dual_attention else AdaLayerNormZero(dim, **kw)
        if context_pre_only:
            self.norm1_context = AdaLayerNormContinuous(dim, dim, elementwise_affine=False, eps=1e-6, **kw)
        else:
            self.norm1_context = AdaLayerNormZero(dim, **kw)
        self.attn = Attention(query_dim=dim, heads=num_attention_heads, dim_head=attention_head_dim,
                              added_kv_proj_dim=dim, out_dim=dim, context_pre_only=context_pre_only, bias=True,
                              qk_norm=qk_norm, eps=1e-6, **kw)
        if use_dual_attention:
            self.attn2 = Attention(query_dim=dim, heads=num_attention_heads, dim_head=attention_head_dim, out_dim=dim,
                                   bias=True, qk_norm=qk_norm, eps=1e-6, **kw)
        else:
            object.__setattr__(self, "attn2", None)
        self.norm2 = LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate", **kw)
        if not context_pre_only:
            self.norm2_context = LayerNorm(dim, elementwise_affine=False, eps=1e-6)
            self.ff_context = FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate", **kw)

    def forward(self, hidden_states, encoder_hidden_states, temb):
        if self.use_dual_attention:
            norm_hidden, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm_hidden2, gate_msa2 = self.norm1(
                hidden_states, emb=temb)
        else:
            norm_hidden, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
        if self.context_pre_only:
            norm_context = self.norm1_context(encoder_hidden_states, temb)
        else:
            norm_context, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(encoder_hidden_states,
                                                                                                emb=temb)
        attn_output, context_attn_output = self.attn(norm_hidden, encoder_hidden_states=norm_context)

        hidden_states = hidden_states + gate_msa.unsqueeze(1) * attn_output
        if self.use_dual_attention:
            attn_output2, _ = self.attn2(norm_hidden2)
            hidden_states = hidden_states + gate_msa2.unsqueeze(1) * attn_output2
        ff_output = self.ff(modulate(self.norm2(hidden_states), scale_mlp, shift_mlp))
        hidden_states = hidden_states + gate_mlp.unsqueeze(1) * ff_output

        if self.context_pre_only:
            return None, hidden_states
        encoder_hidden_states = encoder_hidden_states + c_gate_msa.unsqueeze(1) * context_attn_output
        context_ff_output = self.ff_context(modulate(self.norm2_context(encoder_hidden_states), c_scale_mlp,
                                                     c_shift_mlp))
        encoder_hidden_states = encoder_hidden_states + c_gate_mlp.unsqueeze(1) * context_ff_output
        return encoder_hidden_states, hidden_states


class SD3Transformer2DModel(DiffusersModel):
    """diffusers' SD3Transformer2DModel. ``forward(hidden_states (B, C, H, W), encoder_hidden_states
    (B, T, joint_attention_dim), pooled_projections (B, pooled_projection_dim), timestep (B,))``
    returns ``Transformer2DModelOutput(sample=(B, out_channels, H, W))``."""

    config_defaults = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=18, attention_head_dim=64,
                           num_attention_heads=18, joint_attention_dim=4096, caption_projection_dim=1152,
                           pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=96,
                           dual_attention_layers=(), qk_norm=None)
    config_kinds = dict(sample_size=count(), patch_size=count(), in_channels=count(), num_layers=count(),
                        attention_head_dim=count(), num_attention_heads=count(), joint_attention_dim=count(),
                        caption_projection_dim=count(), pooled_projection_dim=count(), out_channels=optional(count()),
                        pos_embed_max_size=optional(count()), dual_attention_layers=optional(listing(count(0))),
                        qk_norm=optional(text))

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.config = config
        if device_mesh is not None and device_mesh.mesh_dim_names is not None:
            mesh_dim_sizes(device_mesh, type(self).__name__)     # an unknown dim name, refused at once
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.out_channels = config.out_channels if config.out_channels is not None else config.in_channels
        self.inner_dim = config.num_attention_heads * config.attention_head_dim
        if config.caption_projection_dim != self.inner_dim:
            raise ValueError(f"SD3Transformer2DModel: caption_projection_dim ({config.caption_projection_dim}) must "
                             f"equal num_attention_heads * attention_head_dim ({self.inner_dim})")
        if config.sample_size < config.patch_size:
            raise ValueError(f"SD3Transformer2DModel: sample_size ({config.sample_size}) holds no patch of "
                             f"patch_size ({config.patch_size})")
        self.pos_embed = PatchEmbed(height=config.sample_size, width=config.sample_size, patch_size=config.patch_size,
                                    in_channels=config.in_channels, embed_dim=self.inner_dim,
                                    pos_embed_max_size=config.pos_embed_max_size, **kw)
        self.time_text_embed = CombinedTimestepTextProjEmbeddings(self.inner_dim, config.pooled_projection_dim, **kw)
        self.context_embedder = Linear(config.joint_attention_dim, config.caption_projection_dim, **kw)
        dual = tuple(config.dual_attention_layers or ())
        self.transformer_blocks = ModuleList([
            JointTransformerBlock(self.inner_dim, config.num_attention_heads, config.attention_head_dim,
                                  context_pre_only=i == config.num_layers - 1, qk_norm=config.qk_norm,
                                  use_dual_attention=i in dual, **kw)
            for i in range(config.num_layers)])
        self.norm_out = AdaLayerNormContinuous(self.inner_dim, self.inner_dim, elementwise_affine=False, eps=1e-6, **kw)
        self.proj_out = Linear(self.inner_dim, config.patch_size ** 2 * self.out_channels, bias=True, **kw)

    def parallelize(self, device_mesh):
        """``parallelize_sd3(self, device_mesh)``: the layout by the mesh's dim names (dp, tp,
        ulysses, ring); returns self."""
        return parallelize_sd3(self, device_mesh)

    def forward(self, hidden_states, encoder_hidden_states=None, pooled_projections=None, timestep=None,
                block_controlnet_hidden_states=None, joint_attention_kwargs=None, return_dict=True,
                skip_layers=None):
        if block_controlnet_hidden_states is not None or skip_layers is not None:
            raise NotImplementedError("SD3Transformer2DModel: controlnet residuals and skip_layers are not supported")
        if encoder_hidden_states is None or pooled_projections is None or timestep is None:
            raise TypeError("SD3Transformer2DModel.forward needs encoder_hidden_states, pooled_projections and "
                            "timestep")
        latent = self._on_mesh(hidden_states, "hidden_states", 4)
        B, _, height, width = latent.shape
        p = self.config.patch_size

        hidden_states = self.pos_embed(latent)                                  # (B, L, inner)
        temb = self.time_text_embed(timestep, self._on_mesh(pooled_projections, "pooled_projections", 2))
        encoder_hidden_states = self.context_embedder(self._on_mesh(encoder_hidden_states, "encoder_hidden_states",
                                                                    3))       # (B, T, inner)
        for block in self.transformer_blocks:
            encoder_hidden_states, hidden_states = block(hidden_states, encoder_hidden_states, temb)
        hidden_states = self.proj_out(self.norm_out(hidden_states, temb))      # (B, L, p*p*c)

        # the patches back together: (B, h*w, p*p*c) -> (B, c, h*p, w*p)
        h, w = height // p, width // p
        patches = hidden_states.reshape(B, h, w, p, p, self.out_channels)
        output = patches.permute(0, 5, 1, 3, 2, 4).reshape(B, self.out_channels, h * p, w * p)
        if not return_dict:
            return (output,)
        return Transformer2DModelOutput(sample=output)

    def _on_mesh(self, x, name, ndim):
        """An input as a DTensor on the model's mesh (a host array is put there whole)."""
        mesh = self.device_mesh
        if not isinstance(x, DTensor):
            x = distribute_tensor(np.ascontiguousarray(x, dtype=np.float32), mesh)
        if x.ndim != ndim:
            raise ValueError(f"SD3Transformer2DModel: {name} must have {ndim} dims, got shape {tuple(x.shape)}")
        if x.device_mesh != mesh:
            raise ValueError(f"SD3Transformer2DModel: {name} lives on {x.device_mesh}, not on the model's mesh "
                             f"{mesh}")
        dtype = self.proj_out.weight.dtype
        return x if x.dtype == dtype else x.to(dtype)
