"""Making DTensors: factories with torch's signatures, distribute_tensor and from_local."""
import operator

import numpy as np

from . import _C, _dtype
from ._mesh import DeviceMesh
from ._placement import _raw


def _size(name, size):
    """torch accepts rand(2, 3) and rand((2, 3)) alike."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for pos, s in enumerate(size):
        if isinstance(s, bool) or isinstance(s, float):
            raise TypeError(f"{name}(): argument 'size' must be tuple of ints, but found element of type "
                            f"{type(s).__name__} at pos {pos}")
        try:
            out.append(operator.index(s))
        except TypeError:
            raise TypeError(f"{name}(): argument 'size' must be tuple of ints, but found element of type "
                            f"{type(s).__name__} at pos {pos}") from None
    return tuple(out)


def _mesh(name, device_mesh):
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"{name}(): device_mesh must be a dtorch.DeviceMesh, got {type(device_mesh).__name__}")
    return device_mesh


def _make(kind, name, size, device_mesh, placements, dtype, value=0):
    mesh = _mesh(name, device_mesh)
    return _C._make(kind, mesh, mesh._c, _size(name, size), _dtype._resolve(dtype)._code, _raw(placements), value)


def rand(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """Uniform [0, 1) values. Counter-based: the same seed gives the same whole tensor on any
    mesh and with any placements."""
    return _make("rand", "rand", size, device_mesh, placements, dtype)


def randn(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """Standard normal values, counter-based like rand."""
    return _make("randn", "randn", size, device_mesh, placements, dtype)


def zeros(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    return _make("zeros", "zeros", size, device_mesh, placements, dtype)


def ones(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    return _make("ones", "ones", size, device_mesh, placements, dtype)


def empty(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """Uninitialised values."""
    return _make("empty", "empty", size, device_mesh, placements, dtype)


def full(size, fill_value, *, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """Every element is fill_value; the dtype follows it when not given (bool, int64, float32)."""
    if dtype is None:
        dtype = (_dtype.bool if isinstance(fill_value, (bool, np.bool_))
                 else _dtype.int64 if isinstance(fill_value, (int, np.integer)) else _dtype.float32)
    size = size if isinstance(size, (tuple, list)) else (size,)
    return _make("full", "full", tuple(size), device_mesh, placements, dtype, _scalar(fill_value))


def arange(start, end=None, step=1, *, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """start, start+step, ... below end; int64 when every bound is an int, else float32."""
    if end is None:
        start, end = 0, start
    bounds = [_scalar(v) for v in (start, end, step)]
    if dtype is None:
        dtype = _dtype.int64 if all(isinstance(v, int) for v in bounds) else _dtype.float32
    mesh = _mesh("arange", device_mesh)
    return _C._arange(mesh, mesh._c, *bounds, _dtype._resolve(dtype)._code, _raw(placements))


def _scalar(v):
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    raise TypeError(f"expected a number, got {type(v).__name__}")


def _as_array(name, data):
    """A numpy view of anything with the buffer protocol, __array__ or DLPack."""
    if isinstance(data, np.ndarray):
        return data
    if hasattr(data, "__dlpack__") and not hasattr(data, "__array__"):
        return np.from_dlpack(data)
    try:
        return np.asarray(data)
    except Exception as e:
        raise TypeError(f"{name}: cannot read {type(data).__name__} as an array: {e}") from None


def _dtype_of(name, array):
    found = _dtype._from_numpy(array.dtype)
    if found is None or array.dtype.kind == "O":
        raise TypeError(f"{name}: unsupported dtype {array.dtype}; supported: float32, float16, bfloat16, "
                        "int32, int64, bool (convert first, e.g. array.astype(numpy.float32))")
    return found


def distribute_tensor(tensor, device_mesh, placements=None):
    """Lays the global array ``tensor`` out over ``device_mesh``: every device gets its piece."""
    from ._tensor import DTensor
    if isinstance(tensor, DTensor):
        if tensor.device_mesh == device_mesh and (placements is None or tuple(placements) == tensor.placements):
            return tensor
        raise ValueError("distribute_tensor: the tensor is already a DTensor with other placements; "
                         "use redistribute")
    mesh = _mesh("distribute_tensor", device_mesh)
    array = _as_array("distribute_tensor", tensor)
    dt = _dtype_of("distribute_tensor", array)
    if array.dtype.name == "bfloat16":
        array = array.view(np.uint16)
    return _C._distribute(mesh, mesh._c, array, dt._code, _raw(placements))


def from_local(local_tensor, device_mesh, placements=None, shape=None, *, run_check=False, stride=None):
    """A DTensor from every device's own piece: ``local_tensor`` is a list of arrays in row-major
    mesh order (one array alone stands for every device). Without ``shape`` the global shape
    assumes even shards, as torch does; give it for uneven ones."""
    mesh = _mesh("from_local", device_mesh)
    if isinstance(local_tensor, (list, tuple)):
        pieces = [_as_array("from_local", p) for p in local_tensor]
    else:
        pieces = [_as_array("from_local", local_tensor)] * mesh.size()
    if len(pieces) != mesh.size():
        raise ValueError(f"from_local: {len(pieces)} local pieces for a mesh of {mesh.size()} devices")
    dt = _dtype_of("from_local", pieces[0])
    for p in pieces:
        if p.dtype != pieces[0].dtype:
            raise TypeError(f"from_local: local pieces have different dtypes ({pieces[0].dtype} and {p.dtype})")
    # np.require keeps 0-d pieces 0-d (ascontiguousarray would make them 1-D)
    pieces = [np.require(p.view(np.uint16) if p.dtype.name == "bfloat16" else p, requirements="C") for p in pieces]
    if shape is not None:
        shape = _size("from_local", (shape,))
    return _C._from_local(mesh, mesh._c, pieces, dt._code, _raw(placements), shape)
