"""AutoencoderKL, the VAE of Stable Diffusion, SDXL, SD3 and FLUX, with diffusers' module tree and
parameter names (``encoder.*``, ``quant_conv``, ``post_quant_conv``, ``decoder.*``), so that
``state_dict()`` keys equal a checkpoint's. SD3's and FLUX's VAEs have 16 latent channels and no
quant convs (``use_quant_conv=False``, ``use_post_quant_conv=False``).

    encode: image (B, in_channels, H, W) -> conv_in -> down blocks (resnets, a stride-2 conv each
            but the last) -> mid block (resnet, attention over the H*W positions, resnet) ->
            group norm, SiLU, conv_out -> quant_conv -> mean and log-variance (B, latent, h, w)
    decode: latents (B, latent, h, w) -> post_quant_conv -> conv_in -> mid block -> up blocks
            (resnets, a nearest x2 upsampling and conv each but the last) -> group norm, SiLU,
            conv_out -> image (B, out_channels, h * 2^k, w * 2^k)

Neither ``scaling_factor`` nor ``shift_factor`` is applied here (a pipeline does, as diffusers').

Single-device code: the VAE runs on the mesh it was made or loaded on, its weights replicated, and
every op follows the placements of its inputs. Inputs (numpy arrays, or DTensors on any mesh) are
moved onto that mesh (whole, from a host or another mesh; as they are, on it) and cast to the VAE's
dtype. ``parallelize_vae`` (diffusion_parallel.py), which ``from_config`` and ``from_pretrained``
call, splits the batch from outside, and the decoded image's height over a mesh dim named
``height`` (each device decodes its own rows, fetching the few its convolutions read from its
neighbours). A mesh's dim names, where it has them, are the diffusion transformers' (dp, ulysses,
ring: a pipeline gives the VAE its transformer's mesh unless given ``vae_mesh``) and ``height``; any
other is a ValueError naming it."""
import numpy as np

from .._factory import distribute_tensor, randn, zeros
from .._placement import Replicate
from .._runtime import manual_seed
from .._tensor import DTensor
from ..nn import functional as F
from ..nn.containers import ModuleList
from ..nn.layers import Conv2d, Dropout, GroupNorm, Linear, SiLU
from ..nn.module import Module
from .config_fields import count, flag, listing, number, optional, text
from .diffusion_parallel import parallelize_vae, vae_mesh_dim_sizes
from .modeling_diffusers import AutoencoderKLOutput, DecoderOutput, DiffusersModel


def _check_act_fn(act_fn):
    if act_fn not in ("silu", "swish"):
        raise NotImplementedError(f"AutoencoderKL: act_fn {act_fn!r} (only 'silu')")


# ---- blocks ----------------------------------------------------------------------------------------

class ResnetBlock2D(Module):
    """norm1 -> SiLU -> conv1 (3x3) -> norm2 -> SiLU -> conv2 (3x3), plus the input (through a 1x1
    ``conv_shortcut`` when the channel count changes)."""

    def __init__(self, in_channels, out_channels=None, groups=32, eps=1e-6, device_mesh=None, dtype=None):
        super().__init__()
        out_channels = out_channels or in_channels
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.norm1 = GroupNorm(groups, in_channels, eps=eps, **kw)       # weight, bias (in_channels,)
        self.conv1 = Conv2d(in_channels, out_channels, 3, padding=1, **kw)   # (out, in, 3, 3)
        self.norm2 = GroupNorm(groups, out_channels, eps=eps, **kw)
        self.dropout = Dropout(0.0)
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1, **kw)  # (out, out, 3, 3)
        self.nonlinearity = SiLU()
        self.conv_shortcut = (Conv2d(in_channels, out_channels, 1, **kw)   # (out, in, 1, 1)
                              if in_channels != out_channels else None)

    def forward(self, input_tensor):
        h = self.conv1(self.nonlinearity(self.norm1(input_tensor)))
        h = self.conv2(self.dropout(self.nonlinearity(self.norm2(h))))
        shortcut = self.conv_shortcut(input_tensor) if self.conv_shortcut is not None else input_tensor
        return shortcut + h


class SpatialSelfAttention(Module):
    """diffusers' Attention as the VAE's mid block makes it: a group norm, then single-head (head
    dim = channels) self-attention over the H*W positions (``to_q``, ``to_k``, ``to_v``,
    ``to_out.0``), plus the input. ``attention`` is the slot the attention runs in: (query, key,
    value) of (B, 1, H*W, C) -> the output (B, 1, H*W, C), scaled_dot_product_attention by default
    (parallelize_vae puts a ring over the image's rows there)."""

    def __init__(self, channels, groups=32, eps=1e-6, device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.heads, self.dim_head = 1, channels
        self.group_norm = GroupNorm(groups, channels, eps=eps, **kw)
        self.to_q = Linear(channels, channels, **kw)   # (C, C)
        self.to_k = Linear(channels, channels, **kw)
        self.to_v = Linear(channels, channels, **kw)
        self.to_out = ModuleList([Linear(channels, channels, **kw), Dropout(0.0)])
        self.attention = F.scaled_dot_product_attention

    def forward(self, hidden_states):
        B, C, H, W = hidden_states.shape
        tokens = self.group_norm(hidden_states).view(B, C, H * W).transpose(1, 2)   # (B, L = H*W, C)
        out = self.attention(*(proj(tokens).unsqueeze(1) for proj in (self.to_q, self.to_k, self.to_v)))
        out = self.to_out[1](self.to_out[0](out.squeeze(1)))
        return out.transpose(1, 2).reshape(B, C, H, W) + hidden_states

    def extra_repr(self):
        return f"heads={self.heads}, dim_head={self.dim_head}"


class Downsample2D(Module):
    """Pad one zero row below and one column right, then a 3x3 stride-2 conv: (H, W) -> (H/2, W/2)."""

    def __init__(self, channels, device_mesh=None, dtype=None):
        super().__init__()
        self.conv = Conv2d(channels, channels, 3, stride=2, padding=0, device_mesh=device_mesh, dtype=dtype)

    def forward(self, hidden_states):
        return self.conv(F.pad(hidden_states, (0, 1, 0, 1), mode="constant", value=0))


class Upsample2D(Module):
    """Nearest x2 upsampling, then a 3x3 conv: (H, W) -> (2H, 2W)."""

    def __init__(self, channels, device_mesh=None, dtype=None):
        super().__init__()
        self.conv = Conv2d(channels, channels, 3, padding=1, device_mesh=device_mesh, dtype=dtype)

    def forward(self, hidden_states):
        return self.conv(F.interpolate(hidden_states, scale_factor=2.0, mode="nearest"))


class DownEncoderBlock2D(Module):
    """``num_layers`` resnets, then a Downsample2D (``downsamplers.0``) unless it is the last block."""

    def __init__(self, in_channels, out_channels, num_layers, add_downsample, groups, eps=1e-6, device_mesh=None,
                 dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.resnets = ModuleList([ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, groups, eps,
                                                 **kw) for i in range(num_layers)])
        self.downsamplers = ModuleList([Downsample2D(out_channels, **kw)] if add_downsample else [])

    def forward(self, hidden_states):
        for module in (*self.resnets, *self.downsamplers):
            hidden_states = module(hidden_states)
        return hidden_states


class UpDecoderBlock2D(Module):
    """``num_layers`` resnets, then an Upsample2D (``upsamplers.0``) unless it is the last block."""

    def __init__(self, in_channels, out_channels, num_layers, add_upsample, groups, eps=1e-6, device_mesh=None,
                 dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.resnets = ModuleList([ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, groups, eps,
                                                 **kw) for i in range(num_layers)])
        self.upsamplers = ModuleList([Upsample2D(out_channels, **kw)] if add_upsample else [])

    def forward(self, hidden_states):
        for module in (*self.resnets, *self.upsamplers):
            hidden_states = module(hidden_states)
        return hidden_states


class UNetMidBlock2D(Module):
    """resnets.0 -> attentions.0 (when ``add_attention``) -> resnets.1, at constant channels."""

    def __init__(self, channels, groups, add_attention=True, eps=1e-6, device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.attentions = ModuleList([SpatialSelfAttention(channels, groups, eps, **kw)] if add_attention else [])
        self.resnets = ModuleList([ResnetBlock2D(channels, channels, groups, eps, **kw) for _ in range(2)])

    def forward(self, hidden_states):
        for module in (self.resnets[0], *self.attentions, self.resnets[1]):
            hidden_states = module(hidden_states)
        return hidden_states


def _block_type(kind, expected):
    if kind != expected:
        raise NotImplementedError(f"AutoencoderKL: block type {kind!r} (only {expected!r})")


class Encoder(Module):
    """Image (B, in_channels, H, W) -> moments (B, 2 * out_channels, H / 2^k, W / 2^k), k the number
    of blocks less one."""

    def __init__(self, in_channels, out_channels, down_block_types, block_out_channels, layers_per_block,
                 norm_num_groups, mid_block_add_attention=True, device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.conv_in = Conv2d(in_channels, block_out_channels[0], 3, padding=1, **kw)
        self.down_blocks = ModuleList()
        output_channel = block_out_channels[0]
        for i, kind in enumerate(down_block_types):
            _block_type(kind, "DownEncoderBlock2D")
            input_channel, output_channel = output_channel, block_out_channels[i]
            self.down_blocks.append(DownEncoderBlock2D(input_channel, output_channel, layers_per_block,
                                                       i < len(block_out_channels) - 1, norm_num_groups, **kw))
        self.mid_block = UNetMidBlock2D(block_out_channels[-1], norm_num_groups, mid_block_add_attention, **kw)
        self.conv_norm_out = GroupNorm(norm_num_groups, block_out_channels[-1], eps=1e-6, **kw)
        self.conv_act = SiLU()
        self.conv_out = Conv2d(block_out_channels[-1], 2 * out_channels, 3, padding=1, **kw)

    def forward(self, sample):
        sample = self.conv_in(sample)
        for block in self.down_blocks:
            sample = block(sample)
        sample = self.mid_block(sample)
        return self.conv_out(self.conv_act(self.conv_norm_out(sample)))


class Decoder(Module):
    """Latents (B, in_channels, h, w) -> image (B, out_channels, h * 2^k, w * 2^k); each up block has
    one resnet more than ``layers_per_block``."""

    def __init__(self, in_channels, out_channels, up_block_types, block_out_channels, layers_per_block,
                 norm_num_groups, mid_block_add_attention=True, device_mesh=None, dtype=None):
        super().__init__()
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        self.conv_in = Conv2d(in_channels, block_out_channels[-1], 3, padding=1, **kw)
        self.mid_block = UNetMidBlock2D(block_out_channels[-1], norm_num_groups, mid_block_add_attention, **kw)
        self.up_blocks = ModuleList()
        reversed_channels = list(reversed(block_out_channels))
        output_channel = reversed_channels[0]
        for i, kind in enumerate(up_block_types):
            _block_type(kind, "UpDecoderBlock2D")
            input_channel, output_channel = output_channel, reversed_channels[i]
            self.up_blocks.append(UpDecoderBlock2D(input_channel, output_channel, layers_per_block + 1,
                                                   i < len(block_out_channels) - 1, norm_num_groups, **kw))
        self.conv_norm_out = GroupNorm(norm_num_groups, block_out_channels[0], eps=1e-6, **kw)
        self.conv_act = SiLU()
        self.conv_out = Conv2d(block_out_channels[0], out_channels, 3, padding=1, **kw)

    def forward(self, sample):
        sample = self.mid_block(self.conv_in(sample))
        for block in self.up_blocks:
            sample = block(sample)
        return self.conv_out(self.conv_act(self.conv_norm_out(sample)))


# ---- the latent distribution -------------------------------------------------------------------------

class DiagonalGaussianDistribution:
    """The encoder's posterior: ``parameters`` (B, 2 * latent, h, w) split on the channels into the
    mean and the log-variance (clamped to [-30, 20]); ``std`` and ``var`` from it. ``deterministic``:
    std and var are zeros and ``sample`` gives the mean."""

    def __init__(self, parameters, deterministic=False):
        self.parameters = parameters
        self.mean, logvar = parameters.chunk(2, dim=1)
        self.logvar = logvar.clamp(-30.0, 20.0)
        self.deterministic = deterministic
        if deterministic:
            self.std = self.var = zeros(*self.mean.shape, device_mesh=self.mean.device_mesh,
                                        placements=self.mean.placements, dtype=self.mean.dtype)
        else:
            self.std = (self.logvar * 0.5).exp()
            self.var = self.logvar.exp()

    def sample(self, seed=None):
        """mean + std * noise, the noise from dtorch.randn laid out like the mean (the same values
        on any mesh for one seed); ``seed`` reseeds dtorch.manual_seed first."""
        if seed is not None:
            manual_seed(seed)
        noise = randn(*self.mean.shape, device_mesh=self.mean.device_mesh, placements=self.mean.placements,
                      dtype=self.mean.dtype)
        return self.mean + self.std * noise

    def mode(self):
        return self.mean


# ---- the model --------------------------------------------------------------------------------------

class AutoencoderKL(DiffusersModel):
    """diffusers' AutoencoderKL (encoder, decoder, the optional quant convs); see the module's
    docstring for the layout."""

    config_defaults = dict(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",), block_out_channels=(64,), layers_per_block=1, act_fn="silu",
        latent_channels=4, norm_num_groups=32, sample_size=32, scaling_factor=0.18215, shift_factor=None,
        latents_mean=None, latents_std=None, force_upcast=True, use_quant_conv=True, use_post_quant_conv=True,
        mid_block_add_attention=True,
    )
    config_kinds = dict(
        in_channels=count(), out_channels=count(), down_block_types=listing(text, nonempty=True),
        up_block_types=listing(text, nonempty=True), block_out_channels=listing(count(), nonempty=True),
        layers_per_block=count(), act_fn=text, latent_channels=count(), norm_num_groups=count(), sample_size=count(),
        scaling_factor=number(above=0), shift_factor=optional(number()), latents_mean=optional(listing(number())),
        latents_std=optional(listing(number())), force_upcast=flag, use_quant_conv=flag, use_post_quant_conv=flag,
        mid_block_add_attention=flag,
    )

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.config = config
        c = config
        _check_act_fn(c.act_fn)
        if device_mesh is not None and device_mesh.mesh_dim_names is not None:
            vae_mesh_dim_sizes(device_mesh, type(self).__name__)
        kw = dict(device_mesh=device_mesh, dtype=dtype)
        channels = tuple(c.block_out_channels)
        if len(c.down_block_types) != len(channels) or len(c.up_block_types) != len(channels):
            raise ValueError(f"AutoencoderKL: {len(channels)} block_out_channels need as many down_block_types and "
                             f"up_block_types (got {len(c.down_block_types)} and {len(c.up_block_types)})")
        self.encoder = Encoder(c.in_channels, c.latent_channels, c.down_block_types, channels, c.layers_per_block,
                               c.norm_num_groups, c.mid_block_add_attention, **kw)
        self.decoder = Decoder(c.latent_channels, c.out_channels, c.up_block_types, channels, c.layers_per_block,
                               c.norm_num_groups, c.mid_block_add_attention, **kw)
        latent = c.latent_channels
        self.quant_conv = Conv2d(2 * latent, 2 * latent, 1, **kw) if c.use_quant_conv else None
        self.post_quant_conv = Conv2d(latent, latent, 1, **kw) if c.use_post_quant_conv else None

    def parallelize(self, device_mesh):
        """``parallelize_vae(self, device_mesh)``: the batch split over the mesh; returns self."""
        return parallelize_vae(self, device_mesh)

    @property
    def dtype(self):
        return self.decoder.conv_in.weight.dtype

    def _input(self, x, channels, who, name):
        """``x`` (B, channels, H, W), numpy or a DTensor on any mesh, as a DTensor on the VAE's mesh
        (whole when it comes from elsewhere), in the VAE's dtype."""
        shape = tuple(x.shape) if isinstance(x, DTensor) else np.shape(x)
        if len(shape) != 4 or shape[1] != channels:
            raise ValueError(f"AutoencoderKL.{who}: {name} must be (batch, {channels}, height, width), got shape "
                             f"{tuple(shape)}")
        mesh = self.device_mesh
        if not isinstance(x, DTensor):
            array = np.asarray(x)
            if array.dtype not in (np.float16, np.float32):
                array = array.astype(np.float32)
            x = distribute_tensor(np.ascontiguousarray(array), mesh)
        elif x.device_mesh != mesh:
            x = x.redistribute(mesh, [Replicate()] * mesh.ndim)
        return x if x.dtype == self.dtype else x.to(self.dtype)

    def encode(self, x, return_dict=True):
        """Images (B, in_channels, H, W) -> AutoencoderKLOutput(latent_dist=DiagonalGaussianDistribution),
        its mean and logvar (B, latent_channels, H / 2^k, W / 2^k); ``(posterior,)`` without
        ``return_dict``."""
        h = self.encoder(self._input(x, self.config.in_channels, "encode", "x"))
        moments = self.quant_conv(h) if self.quant_conv is not None else h
        posterior = DiagonalGaussianDistribution(moments)
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    def decode(self, z, return_dict=True):
        """Latents (B, latent_channels, h, w), unscaled -> DecoderOutput(sample=images (B, out_channels,
        h * 2^k, w * 2^k)); ``(sample,)`` without ``return_dict``."""
        z = self._input(z, self.config.latent_channels, "decode", "z")
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        dec = self.decoder(z)
        return DecoderOutput(sample=dec) if return_dict else (dec,)

    def forward(self, sample, sample_posterior=False, return_dict=True, seed=None):
        """decode(encode(sample)): the posterior's mode, or a sample of it (``seed``: see
        DiagonalGaussianDistribution.sample)."""
        posterior = self.encode(sample).latent_dist
        z = posterior.sample(seed=seed) if sample_posterior else posterior.mode()
        return self.decode(z, return_dict=return_dict)

    def extra_repr(self):
        c = self.config
        return f"block_out_channels={tuple(c.block_out_channels)}, latent_channels={c.latent_channels}"
