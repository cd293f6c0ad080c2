"""Pipeline parallelism: a model's layers split over stages, each stage a mesh of its own, and the
batch run in micro-batches so that the stages work at the same time.

A stage is ``mesh.unbind("pp")[i]``: the user's mesh with the pipeline dim removed at index i, so
every stage has the same shape and dim names (dp, tp, ...) and a tensor keeps its placements when
it moves from one stage to the next. ``PipelineStage`` marks the modules of a stage: their
inputs that live on another mesh (the previous stage's activations, the position ids, the mask) are
moved onto the stage by a cross-mesh redistribute, worker to worker (the controller only writes
the records), once per forward for all the stage's modules.

The schedule (``ScheduleGPipe``) wraps the model from outside, as torch.distributed.pipelining's
schedules do: the model class knows nothing of micro-batches. It needs no threads. Every op call
returns at once and each device runs its own queue in order, so issuing micro-batch 0 through every
stage, then micro-batch 1, and so on, is GPipe's schedule: while the last stage runs micro-batch 0,
the first already runs micro-batch 1. In decode each micro-batch is a group of sequences with its
own cache and its own next token (generation asks the schedule for the groups), so stage 0 starts a
group's next step while the later stages finish the other groups' current one.
"""
import dataclasses
import inspect

import numpy as np

from .._ops_view import cat
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


def rows_of(kwargs, rows, batch):
    """The arguments of one micro-batch: every array or DTensor with the batch's ``batch`` rows as
    dim 0 of two or more dims cut to ``rows``; the rest as they are (position ids (1, L) serve every
    row, cache slots (L,) every row)."""
    out = {}
    for name, value in kwargs.items():
        if isinstance(value, (list, tuple)):
            value = np.asarray(value)
        if value is not None and len(getattr(value, "shape", ())) > 1 and value.shape[0] == batch > 1:
            value = value[rows]
        out[name] = value
    return out


class ScheduleGPipe(ParallelStyle):
    """GPipe's schedule on a model's forward: a batch of B rows runs as ``n_microbatches`` groups of
    rows (torch.chunk's split of the batch; fewer when B is smaller), one forward each, issued one
    after another; the outputs' tensors are concatenated on the batch dim again. Applied to a module
    (``ScheduleGPipe(4)._apply(model)``), it wraps that module's forward and becomes its
    ``pipeline_schedule``.

    What the forward takes is split by rows (every array or DTensor with more than one row; see
    ``rows_of``); a key/value cache (``past_key_values``) by its ``split(slices)``, one cache per
    group kept from call to call; with ``use_cache`` and no cache, each group makes its own and the
    output's cache is the cache of their groups (``of_groups``)."""

    def __init__(self, n_microbatches):
        if isinstance(n_microbatches, bool) or int(n_microbatches) != n_microbatches or n_microbatches < 1:
            raise ValueError(f"ScheduleGPipe: n_microbatches must be a positive int, got {n_microbatches!r}")
        self.n_microbatches = int(n_microbatches)
        self._whole = False

    def _apply(self, module, device_mesh=None):
        forward = module.forward
        names = list(inspect.signature(forward).parameters)

        def scheduled(*args, **kwargs):
            kwargs.update(zip(names, args))
            return self._step(forward, kwargs)

        module.forward = scheduled
        module.pipeline_schedule = self
        return module

    def microbatches(self, batch):
        """The row slices of the groups a batch of ``batch`` rows runs in."""
        return microbatch_slices(batch, self.n_microbatches)

    def call_microbatch(self, module, **kwargs):
        """``module(**kwargs)`` for the rows of one group, as they are (not split again)."""
        self._whole = True
        try:
            return module(**kwargs)
        finally:
            self._whole = False

    def _step(self, forward, kwargs):
        if self._whole:
            return forward(**kwargs)
        ids = kwargs.get("input_ids")
        if isinstance(ids, (list, tuple)):
            ids = kwargs["input_ids"] = np.asarray(ids)
        groups = self.microbatches(ids.shape[0]) if len(getattr(ids, "shape", ())) > 1 else [None]
        if len(groups) == 1:
            return forward(**kwargs)
        cache = kwargs.pop("past_key_values", None)
        caches = cache.split(groups) if cache is not None else [None] * len(groups)
        outs = [forward(**rows_of(kwargs, rows, ids.shape[0]), **({} if c is None else {"past_key_values": c}))
                for rows, c in zip(groups, caches)]
        made = [getattr(o, "past_key_values", None) for o in outs]
        if cache is None and made[0] is not None:
            cache = type(made[0]).of_groups(groups, made)
        return _joined(outs, made, cache)

    def __repr__(self):
        return f"ScheduleGPipe(n_microbatches={self.n_microbatches})"


class NoPipeline:
    """The schedule of a model that is not pipelined: one group, the plain call."""

    n_microbatches = 1

    def microbatches(self, batch):
        return [slice(0, batch)]

    def call_microbatch(self, module, **kwargs):
        return module(**kwargs)


def schedule_of(module):
    """The pipeline schedule a parallelize function put on ``module``, else NoPipeline's."""
    return getattr(module, "pipeline_schedule", None) or NoPipeline()


def _joined(outs, group_caches, cache):
    """The groups' outputs as one: tensors concatenated on the batch dim, the groups' caches replaced
    by the cache of them all."""
    first = outs[0]
    if isinstance(first, DTensor):
        return cat(outs, dim=0)
    if dataclasses.is_dataclass(first):
        fields = {}
        for f in dataclasses.fields(first):
            values = [getattr(o, f.name) for o in outs]
            if values[0] is not None and values[0] is group_caches[0]:
                fields[f.name] = cache
            elif all(isinstance(v, DTensor) for v in values):
                fields[f.name] = cat(values, dim=0)
            else:
                fields[f.name] = values[0]
        return dataclasses.replace(first, **fields)
    raise TypeError(f"ScheduleGPipe: cannot join outputs of type {type(first).__name__}")
