"""Redistributing many DTensors at once, and the plans redistribute follows."""
from collections import namedtuple

from . import _C
from ._mesh import DeviceMesh
from ._placement import Placement, _raw
from ._tensor import DTensor

PlanStep = namedtuple("PlanStep", "kind mesh_dim elements")
PlanStep.__doc__ = ("One step of a redistribute: kind names the collective it amounts to ('all_gather', "
                    "'all_to_all', 'all_reduce', 'reduce_scatter', 'p2p', or 'local' when nothing crosses "
                    "devices), mesh_dim the mesh dim it works along (-1: several, or across meshes), "
                    "elements how many elements cross between devices.")


def _check(tensors, device_mesh):
    for t in tensors:
        if not isinstance(t, DTensor):
            raise TypeError(f"expected DTensors, got {type(t).__name__}")
    if device_mesh is not None and not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"device_mesh must be a DeviceMesh, got {type(device_mesh).__name__}")


def redistribute_many(tensors, device_mesh=None, placements=None):
    """Redistributes every tensor in one call (e.g. a model's weights to another actor group):
    their transfers travel together. ``placements`` is one sequence for all, or one per tensor."""
    tensors = list(tensors)
    _check(tensors, device_mesh)
    if placements is None:
        raise RuntimeError("placements is needed for redistribute!")
    placements = list(placements)
    if placements and all(isinstance(p, Placement) for p in placements):
        per_tensor = [_raw(placements)] * len(tensors)
    else:
        if len(placements) != len(tensors):
            raise ValueError(f"redistribute_many: {len(placements)} placement lists for {len(tensors)} tensors")
        per_tensor = [_raw(p) for p in placements]
    return _C._redistribute_many(tensors, device_mesh, device_mesh._c if device_mesh is not None else None,
                                 per_tensor)


def redistribute_plan(tensor, device_mesh=None, placements=None):
    """The steps ``tensor.redistribute(device_mesh, placements)`` would take, without running them."""
    _check([tensor], device_mesh)
    if placements is None:
        raise RuntimeError("placements is needed for redistribute!")
    raw = _C._redistribute_plan(tensor, device_mesh._c if device_mesh is not None else None, _raw(placements))
    return [PlanStep(*step) for step in raw]
