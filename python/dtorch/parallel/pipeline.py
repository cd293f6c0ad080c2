"""Pipeline parallelism: a model's layers split over stages, each stage a mesh of its own, and the
batch run in micro-batches so that the stages work at the same time.

A stage is ``mesh.unbind("pp")[i]``: the user's mesh with the pipeline dim removed at index i, so
every stage has the same shape and dim names (dp, tp, ...) and a tensor keeps its placements when
it moves from one stage to the next. ``PipelineStage`` marks the modules of a stage: their
inputs that live on another mesh (the previous stage's activations, the position ids, the mask) are
moved onto the stage by a cross-mesh redistribute, worker to worker (the controller only writes
the records), once per forward for all the stage's modules.

The schedule needs no threads. Every op call returns at once and each device runs its own queue
in order, so issuing micro-batch 0 through every stage, then micro-batch 1, and so on, is GPipe's
schedule: while the last stage runs micro-batch 0, the first already runs micro-batch 1. In decode
each micro-batch is a group of sequences with its own cache and its own next token, so stage 0
starts a group's next step while the later stages finish the other groups' current one.
"""
import dataclasses

from .._placement import Replicate
from .._tensor import DTensor
from .style import ParallelStyle


def stage_layers(num_layers, num_stages, layers_per_stage=None):
    """The layer indices of each stage, contiguous: ``layers_per_stage`` (one count per stage), or an
    even split in which the earlier stages take the remainder (4 layers on 3 stages: 2, 1, 1)."""
    if num_stages < 1:
        raise ValueError(f"pipeline: the number of stages must be positive, got {num_stages}")
    if layers_per_stage is None:
        base, extra = divmod(num_layers, num_stages)
        counts = [base + (1 if s < extra else 0) for s in range(num_stages)]
    else:
        counts = [int(n) for n in layers_per_stage]
        if len(counts) != num_stages or any(n < 0 for n in counts) or sum(counts) != num_layers:
            raise ValueError(f"pipeline: layers_per_stage={list(layers_per_stage)} must give each of the {num_stages} "
                             f"stages a non-negative number of layers, {num_layers} in all")
    out, first = [], 0
    for n in counts:
        out.append(range(first, first + n))
        first += n
    return out


def to_mesh(x, mesh, memo=None):
    """x (a DTensor, or a tuple, list or dataclass of them) on ``mesh`` with the same placements: a
    cross-mesh redistribute when it lives elsewhere; anything else is returned as it is. ``memo``
    (a dict) remembers the tensors moved, so one moved again costs nothing."""
    if isinstance(x, DTensor):
        if x.device_mesh == mesh:
            return x
        if memo is not None and id(x) in memo:
            return memo[id(x)][1]
        placements = [Replicate() if p.is_partial() else p for p in x.placements]
        if len(placements) != mesh.ndim:
            raise ValueError(f"pipeline: a tensor on {x.device_mesh} cannot move to the stage {mesh}: the meshes "
                             "have different numbers of dims")
        moved = x.redistribute(mesh, placements)
        if memo is not None:
            while len(memo) >= _MEMO:
                memo.pop(next(iter(memo)))
            memo[id(x)] = (x, moved)    # x is kept, so its id is not reused while the entry lives
        return moved
    if isinstance(x, (tuple, list)):
        return type(x)(to_mesh(v, mesh, memo) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: to_mesh(getattr(x, f.name), mesh, memo)
                                         for f in dataclasses.fields(x)})
    return x


_MEMO = 8   # tensors a stage remembers having moved: those of the forward in flight


class PipelineStage(ParallelStyle):
    """Marks the modules of one stage (the embedding, the decoder layers, the final norm and head
    that live there): before each one's forward, every DTensor argument on another mesh moves onto
    ``stage_mesh``. The stage's modules share what was moved: the position ids and mask that every
    layer takes cross once per forward, when the stage's first layer gets them, not once per layer."""

    def __init__(self, stage_mesh):
        self.stage_mesh = stage_mesh
        self._memo = {}

    def _apply(self, module, device_mesh=None):
        mesh, memo = self.stage_mesh, self._memo

        def enter_stage(mod, args, kwargs):
            return to_mesh(tuple(args), mesh, memo), {k: to_mesh(v, mesh, memo) for k, v in kwargs.items()}

        module.register_forward_pre_hook(enter_stage, with_kwargs=True)
        return module

    def forget(self):
        """Drops what was moved: call it when a forward begins, since a tensor may have been written
        in place since (a cache's key positions) and must move anew."""
        self._memo.clear()

    def __repr__(self):
        return f"PipelineStage({self.stage_mesh})"


def forget_moved_per_forward(module, stages):
    """Before every forward of ``module`` (the pipeline's decoder), each PipelineStage in ``stages``
    forgets what it moved in the previous one."""
    def forget(mod, args):
        for stage in stages:
            stage.forget()

    module.register_forward_pre_hook(forget)


def microbatch_slices(batch, num_microbatches):
    """Row slices of the micro-batches as torch.chunk splits a batch: chunks of ceil(B / n) rows,
    fewer chunks when the batch is small (never an empty one)."""
    n = max(1, min(int(num_microbatches), batch))
    size = -(-batch // n) if batch else 0
    return [slice(s, min(s + size, batch)) for s in range(0, batch, size)] if batch else [slice(0, 0)]


def rows_of(kwargs, rows):
    """The arguments of one micro-batch: every array or DTensor with the batch as dim 0 (more than
    one row) cut to ``rows``; the rest as they are (position ids (1, L) serve every row)."""
    out = {}
    for name, value in kwargs.items():
        if value is not None and hasattr(value, "shape") and len(value.shape) > 0 and value.shape[0] > 1:
            value = value[rows]
        out[name] = value
    return out
