"""Redistributing many DTensors at once, and the plans redistribute follows."""
from collections import namedtuple

from . import _C

PlanStep = namedtuple("PlanStep", "kind mesh_dim elements")
PlanStep.__doc__ = ("One step of a redistribute: kind names the collective it amounts to ('all_gather', "
                    "'all_to_all', 'all_reduce', 'reduce_scatter', 'p2p', or 'local' when nothing crosses "
                    "devices), mesh_dim the mesh dim it works along (-1: several, or across meshes), "
                    "elements how many elements cross between devices.")


def redistribute_many(tensors, device_mesh=None, placements=None):
    """Redistributes every tensor in one call (e.g. a model's weights to another actor group):
    their transfers travel together. ``placements`` is one sequence for all, or one per tensor."""
    return _C._redistribute_many(list(tensors), device_mesh, None if placements is None else list(placements))


def redistribute_plan(tensor, device_mesh=None, placements=None):
    """The steps ``tensor.redistribute(device_mesh, placements)`` would take, without running them."""
    return [PlanStep(*step) for step in _C._redistribute_plan(tensor, device_mesh, placements)]
