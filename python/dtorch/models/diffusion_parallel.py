"""parallelize_sd3, parallelize_flux and parallelize_vae: the diffusion models laid out over a mesh
from outside, by the mesh's dim names, with dtorch.parallel's styles (torchtitan's shape: the model
files are single-device code and know nothing of this file but its name in ``parallelize``).

- ``dp``: the batch, which in a pipeline is the classifier-free-guidance pair (unconditional and
  conditional rows): Shard(0) where the inputs enter (PrepareModuleInput on the patch embedding,
  the text projection and the timestep, guidance and pooled-text embeddings); weights replicated.
- ``tp``: Megatron tensor parallelism inside each block: the q/k/v projections of both streams
  (``to_q``/``to_k``/``to_v`` and ``add_q_proj``/``add_k_proj``/``add_v_proj``) ColwiseParallel, so
  each device holds and computes its heads (the per-head q/k norms run on them where they are);
  the output projections (``to_out.0``, ``to_add_out``) RowwiseParallel; each feed-forward's first
  linear ColwiseParallel and its second RowwiseParallel (one all-reduce per projection out). SD3.5's
  second attention (``attn2``) is split the same way. FLUX's single-stream blocks split q/k/v and
  ``proj_mlp`` likewise; their ``proj_out`` reads the concatenation [attention, MLP], whose
  per-device pieces are not one contiguous block of its columns, so attention's and the MLP's
  outputs are gathered whole there and ``proj_out`` is ColwiseParallel over its output channels,
  gathered after (its weight still split, at two all-gathers instead of one all-reduce). The
  adaptive norms' modulation linears, the embedders and the final projection stay replicated.
- ``ulysses``: the image tokens and the text tokens split on the sequence; around attention an
  all-to-all turns each stream's sequence split into a split of the heads (whole sequences, some
  heads per device) and back (UlyssesJointAttention in every attention slot).
- ``ring``: the image tokens split on the sequence; attention runs as a true ring, the key/value
  blocks passed device to device (RingJointAttention in every attention slot).

They compose (``dp2 x ulysses2 x ring2`` on 8 devices, ``dp2 x tp2``, ``tp2 x ring2``, ``tp2 x
ulysses2``): tp splits the heads first, and Ulysses and the ring work within each tp slice of
heads (Ulysses splits that slice further). The text tokens (SD3's and FLUX's context stream)
split with the image's over ulysses, at ``context_embedder``'s input: FLUX's 512 T5 tokens are
half a 512x512 image's, and kept whole they would cost every device their whole products. Along
the ring they stay whole and take part in attention as a joint block that every query sees.
Between attentions everything is per token, so the image stream is split once, where it enters
(SD3: the patch embedding's patch tokens and position-table rows, before its projection, so that
each device embeds only its own tokens; FLUX: ``x_embedder``'s input, the packed tokens, before
its projection likewise), and gathered once, at ``proj_out``'s output; the text stream is never
gathered (the output is the image's). FLUX's rotary tables (``pos_embed``'s outputs) are laid out
like the queries they rotate: the image's split on the sequence, the text's split over ulysses and
whole along the ring. An absent name means size 1; an unknown name, a tp size that does not divide
the heads, or a ulysses size that does not divide each tp device's heads, is a ValueError naming
it.

The VAE splits the batch (Shard(0)) over every mesh dim of size > 1, each of dp, tp, ulysses and
ring alike, or every dim of an unnamed mesh. A VAE's mesh may also have a dim named ``height``: the
decoder splits the image along its height over it (Shard(2) of (batch, channels, height, width),
each device its torch.chunk share of the rows at every resolution), so that one large image decodes
on several devices with the memory per device falling with their number. The latents enter the
decoder split by rows; each convolution fetches the few rows above and below its own that it reads
from its neighbours, worker to worker; each nearest upsampling keeps the rows of the output the
device owns; each group norm sums its statistics (a few floats per sample and group) across the
devices; the image comes out split by rows. Encoding splits the batch over ``height`` as over the
other dims.

A model is laid out once: its weights move onto the mesh (replicated) where they live elsewhere, so
a model made on one device can be parallelized afterwards; laying it out a second time is refused.
"""
from .. import _dtype
from .._factory import zeros
from .._mesh import DeviceMesh
from .._placement import Replicate, Shard
from ..parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RingJointAttention,
                        RowwiseParallel, UlyssesJointAttention, parallelize_module)
from ..nn import functional as F
from ..parallel.style import named_dim_sizes, place

KNOWN_DIMS = ("dp", "tp", "ulysses", "ring")
CONTEXT_PARALLEL = ("ulysses", "ring")
VAE_DIMS = KNOWN_DIMS + ("height",)


def mesh_dim_sizes(device_mesh, who):
    """{dim name: size} of a mesh for the diffusion models; an unknown name is a ValueError naming it
    (``who`` says whose), as is an unnamed mesh of more than one device."""
    return named_dim_sizes(device_mesh, KNOWN_DIMS, who)


def vae_mesh_dim_sizes(device_mesh, who):
    """{dim name: size} of a VAE's mesh: the diffusion models' names and ``height``; an unknown name
    is a ValueError naming it."""
    return named_dim_sizes(device_mesh, VAE_DIMS, who)


def parallelize_sd3(model, device_mesh):
    """Lays an SD3Transformer2DModel out over ``device_mesh`` by its dim names (dp, tp, ulysses,
    ring); returns the model."""
    from .transformer_sd3 import SD3Transformer2DModel
    mesh, sizes = _begin(model, device_mesh, SD3Transformer2DModel, "parallelize_sd3")
    _split_batch(model, mesh, ["pos_embed", "context_embedder", "time_text_embed.timestep_embedder",
                               "time_text_embed.text_embedder"])
    tokens = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
    text = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1))
    # the patch tokens and their position-table rows split before the projection: each device
    # projects and positions its own tokens only; over ulysses the text tokens split as well
    image = {"pos_embed.patches": tokens, "pos_embed.positions": tokens}
    _split_image_tokens(model, mesh, image, "proj_out", ulysses={**image, "context_embedder": text})
    attentions = [f"transformer_blocks.{i}.attn" for i in range(len(model.transformer_blocks))]
    attentions += [f"transformer_blocks.{i}.attn2" for i, block in enumerate(model.transformer_blocks)
                   if block.attn2 is not None]
    if sizes.get("tp", 1) > 1:
        plan = {}
        for i, block in enumerate(model.transformer_blocks):
            plan.update(_megatron_block(f"transformer_blocks.{i}", block))
            if block.attn2 is not None:
                plan.update(_megatron_attention(f"transformer_blocks.{i}.attn2", block.attn2))
        parallelize_module(model, mesh["tp"], plan)
    _joint_attention(model, mesh, sizes, attentions)
    return _done(model, mesh)


def parallelize_flux(model, device_mesh):
    """Lays a FluxTransformer2DModel out over ``device_mesh`` by its dim names (dp, tp, ulysses,
    ring); returns the model."""
    from .transformer_flux import FluxTransformer2DModel
    mesh, sizes = _begin(model, device_mesh, FluxTransformer2DModel, "parallelize_flux")
    embedders = ["timestep_embedder", "text_embedder"] + (["guidance_embedder"] if model.config.guidance_embeds else [])
    _split_batch(model, mesh, ["x_embedder", "context_embedder"] + [f"time_text_embed.{e}" for e in embedders])
    tokens = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1))
    # pos_embed gives (cos, sin) of the image tokens, then of the text tokens, as (1, 1, L, D)
    rotary = (Shard(2), Shard(2), None, None)
    both = (Shard(2),) * 4   # over ulysses the text tokens split too (see the module's docstring)
    _split_image_tokens(model, mesh, {"x_embedder": tokens, "pos_embed": PrepareModuleOutput(
        output_layouts=rotary, desired_output_layouts=rotary)}, "proj_out",
        ulysses={"x_embedder": tokens, "context_embedder": tokens, "pos_embed": PrepareModuleOutput(
            output_layouts=both, desired_output_layouts=both)})
    if sizes.get("tp", 1) > 1:
        plan = {}
        for i, block in enumerate(model.transformer_blocks):
            plan.update(_megatron_block(f"transformer_blocks.{i}", block))
        for i, block in enumerate(model.single_transformer_blocks):
            plan.update(_megatron_single_block(f"single_transformer_blocks.{i}", block))
        parallelize_module(model, mesh["tp"], plan)
    _joint_attention(model, mesh, sizes,
                     [f"transformer_blocks.{i}.attn" for i in range(len(model.transformer_blocks))]
                     + [f"single_transformer_blocks.{i}.attn" for i in range(len(model.single_transformer_blocks))])
    model._rotary.clear()   # tables made before were laid out without the plan
    return _done(model, mesh)


def parallelize_vae(vae, device_mesh):
    """Lays an AutoencoderKL out over ``device_mesh``: encode and decode split the batch over every
    mesh dim of size > 1 (dims named dp, ulysses or ring; an unnamed mesh: all of them), except that
    decode splits the image's height over a dim named ``height`` (encode its batch); returns the VAE."""
    from .autoencoder_kl import AutoencoderKL
    who = _check_model(vae, AutoencoderKL, "parallelize_vae")
    names = device_mesh.mesh_dim_names
    if names is not None:
        vae_mesh_dim_sizes(device_mesh, who)
    split = [d for d, size in enumerate(device_mesh.shape) if size > 1]
    if not split:
        _replicate(vae, device_mesh)
        return vae
    mesh = _own_root(device_mesh, names or tuple(f"batch{d}" for d in range(device_mesh.ndim)))
    _replicate(vae, mesh)
    decode = ["decoder"] + (["post_quant_conv"] if vae.post_quant_conv is not None else [])
    batch = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(0))
    rows = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(2))
    for d in split:
        name = mesh.mesh_dim_names[d]
        plan = {"encoder": batch}
        plan.update({path: rows if name == "height" else batch for path in decode})
        if name == "height" and vae.post_quant_conv is not None:
            del plan["post_quant_conv"]   # the decoder's input is split by rows where it enters
        parallelize_module(vae, mesh[name], plan)
        if name == "height":
            for attention in vae.decoder.mid_block.attentions:
                attention.attention = _RowsAttention(mesh, d)
    return _done(vae, mesh)


class _RowsAttention:
    """The VAE decoder's mid-block attention over an image split by rows: a non-causal ring over the
    ``height`` dim (the key/value blocks passed device to device, never gathered) where the tokens
    are split along it in torch.chunk layout (the rows divide evenly); scaled_dot_product_attention
    otherwise (the tokens came whole: the latent's few rows, gathered)."""

    def __init__(self, mesh, dim):
        self.mesh, self.dim, self._positions = mesh, dim, {}

    def __call__(self, query, key, value):
        if query.placements[self.dim] != Shard(2):
            return F.scaled_dot_product_attention(query, key, value)
        length = query.shape[2]
        if length not in self._positions:
            placements = [Replicate()] * self.mesh.ndim
            placements[self.dim] = Shard(1)
            self._positions = {length: zeros((1, length), dtype=_dtype.int64, device_mesh=self.mesh, placements=placements)}
        index = self._positions[length]
        return F.ring_attention(query, key, value, index, index, self.dim, is_causal=False)

    def __repr__(self):
        return f"RowsAttention(mesh_dim={self.dim})"


# ---- the steps every plan shares ------------------------------------------------------------------------

def _check_model(model, cls, function):
    if not isinstance(model, cls):
        raise TypeError(f"{function}: expected a {cls.__name__}, got {type(model).__name__}")
    who = type(model).__name__
    if getattr(model, "_laid_out_over", None) is not None:
        raise ValueError(f"{who}: already laid out over {model._laid_out_over}; build it again to lay it out "
                         "another way")
    return who


def _begin(model, device_mesh, cls, function):
    """(the mesh to lay the transformer out on, {dim name: size}) after the checks, with the weights
    moved onto it."""
    who = _check_model(model, cls, function)
    sizes = mesh_dim_sizes(device_mesh, who)
    heads, ulysses, tp = model.config.num_attention_heads, sizes.get("ulysses", 1), sizes.get("tp", 1)
    if heads % tp:
        raise ValueError(f"{who}: the tp size {tp} does not divide the {heads} attention heads")
    if heads % (tp * ulysses):
        raise ValueError(f"{who}: the ulysses size {ulysses} does not divide the {heads // tp} attention heads of "
                         f"each tp device ({heads} heads, tp size {tp})" if tp > 1 else
                         f"{who}: the ulysses size {ulysses} does not divide the {heads} attention heads")
    mesh = _own_root(device_mesh, device_mesh.mesh_dim_names) if sizes else device_mesh
    _replicate(model, mesh)
    return mesh, sizes


def _own_root(device_mesh, names):
    """``device_mesh`` as a root mesh named ``names``: the styles take its 1-D sub-meshes, which must
    come from it (a sub-mesh of a bigger mesh, or an unnamed one, becomes a mesh of the same devices)."""
    if device_mesh._get_root_mesh() is device_mesh and device_mesh.mesh_dim_names == tuple(names):
        return device_mesh
    return DeviceMesh(device_mesh.device_type, device_mesh.mesh, mesh_dim_names=names)


def _replicate(model, mesh):
    """Every parameter and buffer that lives on another mesh moves onto ``mesh``, whole."""
    moved = {}
    for module in model.modules():
        for registry in (module._parameters, module._buffers):
            for name, t in list(registry.items()):
                if t is None or t.device_mesh == mesh:
                    continue
                if id(t) not in moved:   # a tensor shared by several modules moves once
                    moved[id(t)] = place(t, mesh, 0, Replicate())
                setattr(module, name, moved[id(t)])


def _split_batch(model, mesh, paths):
    """The (one) input of each module at ``paths`` split on the batch over dp."""
    if "dp" in (mesh.mesh_dim_names or ()):
        batch = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(0))
        parallelize_module(model, mesh["dp"], {path: batch for path in paths})


def _split_image_tokens(model, mesh, enter, leave, ulysses=None):
    """The image tokens split on the sequence over ulysses and ring by the styles ``enter`` ({path:
    style}; on ulysses ``ulysses`` where given) and gathered at the output of the module at
    ``leave``: split in the mesh's dim order and gathered in the reverse, so that each step is a
    local slice or an all-gather along one dim."""
    dims = [name for name in mesh.mesh_dim_names or () if name in CONTEXT_PARALLEL]
    for name in dims:
        parallelize_module(model, mesh[name], ulysses if name == "ulysses" and ulysses else enter)
    gather = PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate())
    for name in reversed(dims):
        parallelize_module(model, mesh[name], {leave: gather})


def _megatron_attention(prefix, attn):
    """{path: style} of one attention over tp: the q/k/v projections of both streams split by heads
    (column-parallel: each device computes its heads, the per-head q/k norms on them where they
    are), the output projections row-parallel (one all-reduce each)."""
    plan = {f"{prefix}.{name}": ColwiseParallel() for name in ("to_q", "to_k", "to_v")}
    if attn.added_kv_proj_dim is not None:
        plan.update({f"{prefix}.{name}": ColwiseParallel() for name in ("add_q_proj", "add_k_proj", "add_v_proj")})
        if not attn.context_pre_only:
            plan[f"{prefix}.to_add_out"] = RowwiseParallel()
    if not attn.pre_only:
        plan[f"{prefix}.to_out.0"] = RowwiseParallel()
    return plan


def _megatron_feed_forward(prefix):
    """The MLP's hidden dim split: its first projection column-parallel, its second row-parallel."""
    return {f"{prefix}.net.0.proj": ColwiseParallel(), f"{prefix}.net.2": RowwiseParallel()}


def _megatron_block(prefix, block):
    """{path: style} over tp of an SD3 JointTransformerBlock or a FLUX double-stream block: the joint
    attention and each stream's MLP; the adaptive norms' modulation stays whole."""
    plan = _megatron_attention(f"{prefix}.attn", block.attn)
    plan.update(_megatron_feed_forward(f"{prefix}.ff"))
    if getattr(block, "ff_context", None) is not None:
        plan.update(_megatron_feed_forward(f"{prefix}.ff_context"))
    return plan


def _megatron_single_block(prefix, block):
    """{path: style} over tp of a FLUX single-stream block: q/k/v by heads and ``proj_mlp`` by its
    hidden dim (column-parallel), then attention's and the MLP's outputs gathered whole and
    ``proj_out`` column-parallel over its output channels, gathered once more. Its input is the
    concatenation [attention, MLP], whose per-device pieces (some heads, some hidden channels) are
    not one contiguous block of its columns: a row-parallel proj_out would need its weight's
    columns regrouped, which a checkpoint read by its placements cannot give."""
    plan = _megatron_attention(f"{prefix}.attn", block.attn)
    whole = Replicate()
    plan[f"{prefix}.proj_mlp"] = ColwiseParallel()
    plan[f"{prefix}.act_mlp"] = PrepareModuleOutput(output_layouts=Shard(-1), desired_output_layouts=whole)
    plan[f"{prefix}.attn"] = PrepareModuleOutput(output_layouts=(Shard(-1), Shard(-1)),
                                                 desired_output_layouts=(whole, whole))
    plan[f"{prefix}.proj_out"] = ColwiseParallel(output_layouts=whole)
    return plan


def _joint_attention(model, mesh, sizes, paths):
    """Ulysses and the ring in the attention slots of the modules at ``paths``, where their dims
    have more than one device."""
    plan = {}
    if sizes.get("ring", 1) > 1:
        plan["ring"] = RingJointAttention()
    if sizes.get("ulysses", 1) > 1:
        plan["ulysses"] = UlyssesJointAttention()
    for name, style in plan.items():
        parallelize_module(model, mesh[name], {path: style for path in paths})


def _done(model, mesh):
    if mesh.mesh_dim_names:   # hooks and slots are in place (an unnamed mesh is one device: none are)
        model._laid_out_over = mesh
    return model
