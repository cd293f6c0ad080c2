"""parallelize_llama: data, tensor, pipeline and context parallelism for LlamaForCausalLM, applied
from outside the model with parallelize_module (torchtitan's shape). The mesh's dim names say what
is on, in any combination:

- ``tp``: Megatron column/row parallelism. q/k/v/gate/up ColwiseParallel (heads and the MLP hidden
  dim split), o/down RowwiseParallel (one all-reduce each per block). Key/value heads are split when
  tp divides num_key_value_heads; when tp is a multiple of it, each k/v head is replicated over
  tp / num_key_value_heads devices (ReplicateHeadsParallel), as vLLM does. With ulysses the same
  holds for tp x ulysses, the devices attention splits the heads over.
  Vocabulary parallel at both ends: embed_tokens RowwiseParallel (each device holds V/tp rows and
  looks up those; one all-reduce of the hidden states) and lm_head ColwiseParallel with the logits
  left Shard(-1) over the vocabulary. Replicating them would cost every device the full V x E
  (the largest matrices of small models) and the lm_head's full matmul per token; sharded, sampling
  works on each device's vocabulary slice and only one number per row crosses devices (a max and
  a min reduction), never the logits. A tied lm_head keeps sharing the embedding: both are Shard(0).
- ``dp``: the batch (input_ids, attention_mask, position_ids) Shard(0) on dp, weights replicated.
- ``pp``: pipeline stages, ``mesh.unbind("pp")``. The decoder layers go to the stages in contiguous
  runs (earlier stages take the remainder, or ``layers_per_stage``); embed_tokens lives on the first
  stage, norm and lm_head on the last (a tied lm_head holds a copy there). Each parameter lives on its
  stage's devices only; activations hop to the next stage worker to worker. The batch runs in
  ``num_microbatches`` groups (default: the number of stages) so that the stages overlap: a
  ScheduleGPipe wraps the model's forward.
- ``ulysses``: context parallel by all-to-all (sequence split <-> heads split around attention).
- ``ring``: context parallel by a true ring (k/v blocks passed device to device, zig-zag layout):
  RingAttention in every layer's attention slot, ring_attention_inputs (positions, not a mask) in the
  decoder's attention_inputs slot, and RingStaticCache as the model's cache_class.

An absent name means size 1; an unnamed 1-D mesh is taken as tp.
"""
from .._mesh import DeviceMesh
from .._placement import Replicate, Shard
from ..parallel import (ColwiseParallel, PrepareModuleInput, ReplicateHeadsParallel, RowwiseParallel,
                        parallelize_module)
from ..parallel.context import ContextParallelInput, RingAttention, UlyssesParallel, ring_attention_inputs
from ..parallel.pipeline import PipelineStage, ScheduleGPipe, forget_moved_per_forward, stage_layers
from ..parallel.style import named_dim_sizes, place
from .cache_utils import RingStaticCache

KNOWN_DIMS = ("dp", "tp", "pp", "ulysses", "ring")


def mesh_sizes(device_mesh):
    """{dim name: size} of a mesh for the Llama plan; unknown names are ValueErrors naming them."""
    if device_mesh.mesh_dim_names is None and device_mesh.ndim == 1:
        return {"tp": device_mesh.size()}
    return named_dim_sizes(device_mesh, KNOWN_DIMS, "parallelize_llama")


def parallelize_llama(model, device_mesh, *, num_microbatches=None, layers_per_stage=None):
    """Lays ``model`` (a LlamaForCausalLM, with values or MetaTensors) out over ``device_mesh`` by its
    dim names; returns the model. Every parameter ends up on the mesh of its stage (the whole mesh
    without ``pp``), Replicate where the plan says nothing. ``num_microbatches`` (default: the number
    of stages): the groups of rows a batch runs in (ScheduleGPipe); ``layers_per_stage``: the decoder
    layers of each stage (default: an even split, the earlier stages taking the remainder)."""
    sizes = mesh_sizes(device_mesh)
    mesh = device_mesh
    if mesh._get_root_mesh() is not mesh or mesh.mesh_dim_names is None and "tp" in sizes:
        mesh = DeviceMesh(mesh.device_type, mesh.mesh, mesh_dim_names=["tp"] if mesh.mesh_dim_names is None
                          else mesh.mesh_dim_names)
    config = model.config
    tp, ulysses, ring = sizes.get("tp", 1), sizes.get("ulysses", 1), sizes.get("ring", 1)
    kv_style, kv_repeat = _check_heads(config, tp, ulysses)
    n_microbatches = _microbatches(num_microbatches, "pp" in sizes and sizes["pp"])
    stages = mesh.unbind("pp") if "pp" in sizes else [mesh]
    layers = stage_layers(config.num_hidden_layers, len(stages), layers_per_stage)
    decoder, first, last = model.model, stages[0], len(stages) - 1

    entries = [PipelineStage(stage) for stage in stages] if len(stages) > 1 else []
    if entries:   # the decoder's own inputs (positions, slots, mask) move onto the first stage
        forget_moved_per_forward(decoder, entries)
        entries[0]._apply(decoder)
    for s, stage in enumerate(stages):
        paths = ((["model.embed_tokens"] if s == 0 else []) + [f"model.layers.{i}" for i in layers[s]]
                 + (["model.norm", "lm_head"] if s == last else []))
        _replicate([model.get_submodule(p) for p in paths], stage)
        if tp > 1:
            _tensor_parallel(model, stage["tp"], s == 0, s == last, layers[s], kv_style)
        for i in layers[s]:
            _context_parallel(model.model.layers[i].self_attn, stage, sizes, kv_repeat, config.head_dim)
        for path in paths if entries else ():
            entries[s]._apply(model.get_submodule(path))
    if "dp" in sizes:
        batch = {name: Replicate() for name in ("input_ids", "attention_mask", "position_ids")}
        parallelize_module(decoder, first["dp"], PrepareModuleInput(
            input_kwarg_layouts=batch, desired_input_kwarg_layouts={name: Shard(0) for name in batch}))
    if ulysses > 1 or ring > 1:
        dims = [first.mesh_dim_names.index(n) for n in ("ring", "ulysses") if n in first.mesh_dim_names]
        ContextParallelInput(first, dims, ring)._apply(decoder)
    if ring > 1:
        decoder.attention_inputs = ring_attention_inputs
        model.cache_class = RingStaticCache
    model.tie_weights()
    if n_microbatches > 1:
        ScheduleGPipe(n_microbatches)._apply(model)
    return model


def _microbatches(num_microbatches, stages):
    if num_microbatches is None:
        return stages or 1
    if isinstance(num_microbatches, bool) or int(num_microbatches) != num_microbatches or num_microbatches < 1:
        raise ValueError(f"parallelize_llama: num_microbatches must be positive, got {num_microbatches}")
    return int(num_microbatches)


def _check_heads(config, tp, ulysses):
    """(the k/v projections' style for tp, how many times Ulysses repeats each k/v head); ValueErrors
    naming the numbers when the heads do not split. Attention splits the heads over tp x ulysses
    devices: the k/v heads are split when that divides them and each is repeated over its group of
    devices when that is a multiple of them (for tp by ReplicateHeadsParallel, which leaves tp heads;
    for ulysses by repeating each head the tp devices hold before the all-to-all)."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % tp:
        raise ValueError(f"parallelize_llama: tp={tp} does not divide num_attention_heads={heads}")
    if heads % (tp * ulysses):
        raise ValueError(f"parallelize_llama: ulysses={ulysses} does not divide the {heads // tp} query heads of each "
                         f"tp device (num_attention_heads={heads}, tp={tp})")
    if kv_heads % tp == 0:
        style, after_tp = ColwiseParallel(), kv_heads
    elif tp % kv_heads == 0:
        style, after_tp = ReplicateHeadsParallel(kv_heads, config.head_dim), tp
    else:
        raise ValueError(f"parallelize_llama: tp={tp} neither divides num_key_value_heads={kv_heads} nor is a "
                         "multiple of it")
    split = tp * ulysses
    if after_tp % split == 0:
        return style, 1
    if split % kv_heads == 0:
        return style, split // after_tp
    raise ValueError(f"parallelize_llama: ulysses={ulysses}: tp x ulysses = {split} neither divides "
                     f"num_key_value_heads={kv_heads} nor is a multiple of it")


def _tensor_parallel(model, tp_mesh, first, last, layers, kv_style):
    """Megatron column/row styles on one stage's modules."""
    ends = {}
    if first:
        ends["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
    if last:
        ends["lm_head"] = ColwiseParallel(output_layouts=Shard(-1))
    if ends:
        parallelize_module(model, tp_mesh, ends)
    block = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": kv_style,
        "self_attn.v_proj": kv_style,
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for i in layers:
        parallelize_module(model, tp_mesh, {f"model.layers.{i}." + path: style for path, style in block.items()})


def _context_parallel(attn, stage, sizes, kv_repeat, head_dim):
    """Ulysses hooks on the projections (the k/v heads repeated ``kv_repeat`` times first) and the
    ring in the attention slot, where the mesh has them."""
    names = stage.mesh_dim_names or ()
    cp = sizes.get("ulysses", 1) * sizes.get("ring", 1)
    if sizes.get("ulysses", 1) > 1:
        sub = stage["ulysses"]
        UlyssesParallel(output=True, cp_size=cp)._apply(attn.q_proj, sub)
        for name in ("k_proj", "v_proj"):
            UlyssesParallel(output=True, cp_size=cp, repeat_heads=kv_repeat, head_dim=head_dim)._apply(
                getattr(attn, name), sub)
        UlyssesParallel(output=False, cp_size=cp)._apply(attn.o_proj, sub)
    if sizes.get("ring", 1) > 1:
        attn.attention = RingAttention(stage, names.index("ring"))


def _replicate(modules, mesh):
    """Every parameter and buffer of ``modules`` not on ``mesh`` moves there, replicated."""
    moved = {}
    for module in (m for top in modules for m in top.modules()):
        for registry in (module._parameters, module._buffers):
            for name, t in list(registry.items()):
                if t is None or t.device_mesh == mesh and t.device_mesh.ndim == mesh.ndim:
                    continue
                if id(t) not in moved:
                    moved[id(t)] = (t, place(t, mesh, 0, Replicate()))
                setattr(module, name, moved[id(t)][1])
