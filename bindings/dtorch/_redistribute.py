"""Redistributing many DTensors at once, and the plans redistribute follows."""
from collections import namedtuple

from . import _C

PlanStep = namedtuple("PlanStep", "kind mesh_dim elements")
PlanStep.__doc__ = ("One step of a redistribute: kind names the collective it amounts to ('all_gather', "
                    "'all_to_all', 'all_reduce', 'reduce_scatter', 'p2p', or 'local' when nothing crosses "
                    "devices), mesh_dim the mesh dim it works along (-1: several, or across meshes), "
                    "elements how many elements cross between devices.")


def redistribute_many(tensors, device_mesh=None, placements=None, progress=False, out=None):
    """Redistributes every tensor in one call (e.g. a model's weights to another actor group):
    their transfers travel together. ``placements`` is one sequence for all, or one per tensor.
    Returns at once; ``progress=True`` (or None: when stderr is a terminal) instead waits until
    every tensor has landed, with a bar on stderr that moves as each does (tqdm when installed).

    ``out``: existing DTensors, one per tensor, of the same shapes and dtypes, each on its own mesh
    and in its own placements (so ``device_mesh`` and ``placements`` are not given): each takes its
    tensor's value in place, and ``out`` is returned. No new tensors are made, and on each device a
    piece's own memory is written when nothing else holds it, so a group that receives weights
    never holds two copies of them. Whatever was issued before sees the old values."""
    if out is not None:
        if device_mesh is not None or placements is not None:
            raise ValueError("redistribute_many: with out, each tensor goes to its destination's own mesh and "
                             "placements: give neither device_mesh nor placements")
        tensors, out = list(tensors), list(out)
        _C._redistribute_into(tensors, out)
        moved = out
    else:
        moved = _C._redistribute_many(list(tensors), device_mesh, None if placements is None else list(placements))
    if progress is not False and moved:
        from ._runtime import device_stats
        from ._safetensors import _progress
        bar = _progress(len(moved), "Moving tensors", progress)
        for t in moved:
            device_stats(t.device_mesh)   # answered once its devices have run what came before: t has landed
            bar.update(1)
        bar.close()
    return moved


def redistribute_plan(tensor, device_mesh=None, placements=None):
    """The steps ``tensor.redistribute(device_mesh, placements)`` would take, without running them."""
    return [PlanStep(*step) for step in _C._redistribute_plan(tensor, device_mesh, placements)]
