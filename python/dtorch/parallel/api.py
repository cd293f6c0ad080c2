"""parallelize_module: apply parallel styles to a module tree by module path, as torch does."""
import warnings
from fnmatch import fnmatch

from .style import ParallelStyle, mesh_dim


def parallelize_module(module, device_mesh=None, parallelize_plan=None, *, src_data_rank=0):
    """Applies ``parallelize_plan`` (one ParallelStyle for ``module`` itself, or a dict from module
    paths to styles) over ``device_mesh``: a 1-D mesh, or the sub-mesh of one dim of a bigger mesh
    (``mesh["tp"]``: tensors then live on the whole mesh, laid out by the style on that dim). A path
    is dotted child names; each component may be an fnmatch pattern (``layers.*.self_attn``). A
    path that matches no module is a ValueError naming it. Returns ``module``."""
    if device_mesh is None:
        raise ValueError("parallelize_module: a device_mesh is needed (a single controller has no current mesh)")
    mesh_dim(device_mesh)
    if parallelize_plan is None:
        warnings.warn("No parallelize_plan is provided and auto-parallel is not supported at the moment, so this "
                      "parallelize_module call will do nothing.")
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan.src_data_rank = src_data_rank
        return parallelize_plan._apply(module, device_mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError("Expect Union[ParallelStyle, Dict[str, ParallelStyle]] for parallelize_plan, "
                        f"{type(parallelize_plan)} found!")
    for path, style in parallelize_plan.items():
        if not isinstance(path, str) or not path:
            raise ValueError(f"Expect module path to be non-empty, but got {path!r}!")
        targets = _matching(module, path.split("."))
        if not targets:
            raise ValueError(f"parallelize_module: no module matches the plan key {path!r}")
        for target in targets:
            parallelize_module(target, device_mesh, style, src_data_rank=src_data_rank)
    return module


def _matching(module, atoms):
    found = []
    for name, child in module.named_children():
        if fnmatch(name, atoms[0]):
            found.extend([child] if len(atoms) == 1 else _matching(child, atoms[1:]))
    return found
