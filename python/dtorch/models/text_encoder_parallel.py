"""parallelize_text_encoder: CLIPTextModel, CLIPTextModelWithProjection and T5EncoderModel laid out
over a mesh from outside, by the mesh's dim names, with dtorch.parallel's styles (the model files
are single-device code):

- ``dp``: the batch. The ids are split (Shard(0)) where they enter the token embedding; every state
  after follows, and the masks are laid out like the states. Weights replicated.
- ``tp``: Megatron column/row parallelism in every layer: the q/k/v projections and the first MLP
  matrices (CLIP's fc1, T5's wi / wi_0 / wi_1) ColwiseParallel, which splits the heads and the MLP
  hidden dim, and the output projections (out_proj / o, fc2 / wo) RowwiseParallel (one all-reduce
  each per layer). T5's relative position bias table (buckets x heads) is split by heads
  (ColwiseParallel of an embedding), so each device adds the bias of its own heads. The token
  embedding is split by vocabulary (RowwiseParallel: each device looks up the rows it holds, one
  all-reduce), as parallelize_llama does; CLIP's position embedding and text_projection are small and
  stay whole.

They compose (dp2 x tp2 on 4 devices). An absent name means size 1; an unknown name, an unnamed
mesh of more than one device, or a tp size that does not divide the attention heads is a ValueError
naming it.
"""
from .._placement import Replicate, Shard
from ..parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module
from ..parallel.style import named_dim_sizes
from .diffusion_parallel import _own_root, _replicate

KNOWN_DIMS = ("dp", "tp")


def parallelize_text_encoder(model, device_mesh):
    """Lays ``model`` (a CLIPTextModel, CLIPTextModelWithProjection or T5EncoderModel, with values or
    MetaTensors) out over ``device_mesh`` by its dim names (dp, tp); returns the model."""
    from .clip import CLIPTextModel, CLIPTextModelWithProjection
    from .t5 import T5EncoderModel
    who = type(model).__name__
    if not isinstance(model, (CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel)):
        raise TypeError(f"parallelize_text_encoder: expected a CLIP or T5 text encoder, got {who}")
    sizes = named_dim_sizes(device_mesh, KNOWN_DIMS, who)
    tp = sizes.get("tp", 1)
    if isinstance(model, T5EncoderModel):
        heads, plan = model.config.num_heads, _t5_plan(model)
    else:
        heads, plan = model.config.num_attention_heads, _clip_plan(model)
    if heads % tp:
        raise ValueError(f"{who}: tp={tp} does not divide num_attention_heads={heads}")
    mesh = _own_root(device_mesh, device_mesh.mesh_dim_names) if sizes else device_mesh
    _replicate(model, mesh)
    if tp > 1:
        parallelize_module(model, mesh["tp"], plan["tp"])
    if sizes.get("dp", 1) > 1:
        batch = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(0))
        parallelize_module(model, mesh["dp"], {plan["ids"]: batch})
    return model


def _clip_plan(model):
    """{"tp": {path: style}, "ids": the path of the module the ids enter}."""
    from .clip import CLIPTextModelWithProjection
    prefix = "text_model." if isinstance(model, CLIPTextModelWithProjection) else ""
    text = model.text_model if prefix else model
    tp = {prefix + "embeddings.token_embedding": RowwiseParallel(input_layouts=Replicate())}
    for i in range(len(text.encoder.layers)):
        layer = f"{prefix}encoder.layers.{i}."
        tp.update({layer + "self_attn.q_proj": ColwiseParallel(), layer + "self_attn.k_proj": ColwiseParallel(),
                   layer + "self_attn.v_proj": ColwiseParallel(), layer + "self_attn.out_proj": RowwiseParallel(),
                   layer + "mlp.fc1": ColwiseParallel(), layer + "mlp.fc2": RowwiseParallel()})
    return {"tp": tp, "ids": prefix + "embeddings"}


def _t5_plan(model):
    tp = {"shared": RowwiseParallel(input_layouts=Replicate())}
    for i, block in enumerate(model.encoder.block):
        attn, ff = f"encoder.block.{i}.layer.0.SelfAttention.", f"encoder.block.{i}.layer.1.DenseReluDense."
        tp.update({attn + "q": ColwiseParallel(), attn + "k": ColwiseParallel(), attn + "v": ColwiseParallel(),
                   attn + "o": RowwiseParallel(), ff + "wo": RowwiseParallel()})
        if hasattr(block.layer[0].SelfAttention, "relative_attention_bias"):
            tp[attn + "relative_attention_bias"] = ColwiseParallel()
        for name in ("wi", "wi_0", "wi_1"):
            if hasattr(block.layer[1].DenseReluDense, name):
                tp[ff + name] = ColwiseParallel()
    return {"tp": tp, "ids": "shared"}
