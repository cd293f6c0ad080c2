"""parallelize_llama: data and tensor parallelism for LlamaForCausalLM, applied from outside the
model with parallelize_module (torchtitan's shape). The mesh's dim names say what is on:

- ``tp``: Megatron column/row parallelism. q/k/v/gate/up ColwiseParallel (heads and the MLP hidden
  dim split), o/down RowwiseParallel (one all-reduce each per block). Key/value heads are split when
  tp divides num_key_value_heads; when tp is a multiple of it, each k/v head is replicated over
  tp / num_key_value_heads devices (ReplicateHeadsParallel), as vLLM does.
  Vocabulary parallel at both ends: embed_tokens RowwiseParallel (each device holds V/tp rows and
  looks up those; one all-reduce of the hidden states) and lm_head ColwiseParallel with the logits
  left Shard(-1) over the vocabulary. Replicating them would cost every device the full V x E
  (the largest matrices of small models) and the lm_head's full matmul per token; sharded, sampling
  works on each device's vocabulary slice and only one number per row crosses devices (a max and
  a min reduction), never the logits. A tied lm_head keeps sharing the embedding: both are Shard(0).
- ``dp``: the batch (input_ids, attention_mask, position_ids) Shard(0) on dp, weights replicated.
- ``pp``, ``ulysses``, ``ring``: reserved (pipeline and context parallelism come next); size 1 only.

An absent name means size 1; an unnamed 1-D mesh is taken as tp.
"""
from .._mesh import DeviceMesh
from .._placement import Replicate, Shard
from ..parallel import (ColwiseParallel, PrepareModuleInput, ReplicateHeadsParallel, RowwiseParallel,
                        parallelize_module)
from ..parallel.style import place

KNOWN_DIMS = ("dp", "tp")
RESERVED_DIMS = ("pp", "ulysses", "ring")


def mesh_sizes(device_mesh):
    """{dim name: size} of a mesh for the Llama plan; unknown names and reserved dims of size > 1
    are ValueErrors naming them."""
    names = device_mesh.mesh_dim_names
    if names is None:
        if device_mesh.ndim == 1:
            return {"tp": device_mesh.size()}
        if all(s == 1 for s in device_mesh.shape):
            return {}
        raise ValueError(f"parallelize_llama: name the dims of the {device_mesh.ndim}-D mesh (mesh_dim_names from "
                         f"{KNOWN_DIMS + RESERVED_DIMS})")
    sizes = dict(zip(names, device_mesh.shape))
    for name, size in sizes.items():
        if name in RESERVED_DIMS:
            if size > 1:
                raise ValueError(f"parallelize_llama: mesh dim {name!r} of size {size} is not supported yet "
                                 "(pipeline and context parallelism are reserved for later; use size 1)")
        elif name not in KNOWN_DIMS:
            raise ValueError(f"parallelize_llama: unknown mesh dim name {name!r} (known: "
                             f"{', '.join(KNOWN_DIMS + RESERVED_DIMS)})")
    return sizes


def parallelize_llama(model, device_mesh):
    """Lays ``model`` (a LlamaForCausalLM, with values or MetaTensors) out over ``device_mesh`` by its
    dim names; returns the model. Every parameter ends up on this mesh (Replicate where the plan
    says nothing)."""
    sizes = mesh_sizes(device_mesh)
    mesh = device_mesh
    if mesh._get_root_mesh() is not mesh or mesh.mesh_dim_names is None and "tp" in sizes:
        mesh = DeviceMesh(mesh.device_type, mesh.mesh, mesh_dim_names=["tp"] if mesh.mesh_dim_names is None
                          else mesh.mesh_dim_names)
    _replicate(model, mesh)
    config = model.config
    tp = sizes.get("tp", 1)
    if tp > 1:
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        if heads % tp:
            raise ValueError(f"parallelize_llama: tp={tp} does not divide num_attention_heads={heads}")
        if kv_heads % tp == 0:
            kv_style = ColwiseParallel()
        elif tp % kv_heads == 0:
            kv_style = ReplicateHeadsParallel(kv_heads, config.head_dim)
        else:
            raise ValueError(f"parallelize_llama: tp={tp} neither divides num_key_value_heads={kv_heads} nor is a "
                             "multiple of it")
        tp_mesh = mesh["tp"]
        parallelize_module(model, tp_mesh, {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1)),
        })
        block = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": kv_style,
            "self_attn.v_proj": kv_style,
            "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        }
        if config.num_hidden_layers:
            parallelize_module(model, tp_mesh, {"model.layers.*." + path: style for path, style in block.items()})
        model.tie_weights()
    if "dp" in sizes:
        batch = {name: Replicate() for name in ("input_ids", "attention_mask", "position_ids")}
        parallelize_module(model, mesh["dp"], PrepareModuleInput(
            input_kwarg_layouts=batch, desired_input_kwarg_layouts={name: Shard(0) for name in batch}))
    return model


def _replicate(model, mesh):
    """Every parameter and buffer not on ``mesh`` moves there, replicated."""
    moved = {}
    for module in model.modules():
        for registry in (module._parameters, module._buffers):
            for name, t in list(registry.items()):
                if t is None or t.device_mesh == mesh and t.device_mesh.ndim == mesh.ndim:
                    continue
                if id(t) not in moved:
                    moved[id(t)] = (t, place(t, mesh, 0, Replicate()))
                setattr(module, name, moved[id(t)][1])
