"""Making DTensors: factories with torch's signatures, distribute_tensor and from_local. The C
runtime checks every argument, picks torch's default dtypes and refuses requires_grad=True
(DTorch is inference-only)."""
from . import _C


def rand(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """Uniform [0, 1) values. Counter-based: the same seed gives the same whole tensor on any
    mesh and with any placements."""
    return _C._make("rand", size, device_mesh, placements, dtype, requires_grad, None)


def randn(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """Standard normal values, counter-based like rand."""
    return _C._make("randn", size, device_mesh, placements, dtype, requires_grad, None)


def zeros(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    return _C._make("zeros", size, device_mesh, placements, dtype, requires_grad, None)


def ones(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    return _C._make("ones", size, device_mesh, placements, dtype, requires_grad, None)


def empty(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """Uninitialised values."""
    return _C._make("empty", size, device_mesh, placements, dtype, requires_grad, None)


def full(size, fill_value, *, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """Every element is fill_value; the dtype follows it when not given (bool, int64, float32)."""
    return _C._make("full", size, device_mesh, placements, dtype, requires_grad, fill_value)


def arange(start, end=None, step=1, *, device_mesh=None, placements=None, dtype=None, requires_grad=False):
    """start, start+step, ... below end; int64 when every bound is an int, else float32."""
    return _C._arange(start, end, step, device_mesh, placements, dtype, requires_grad)


def distribute_tensor(tensor, device_mesh, placements=None):
    """Lays the global array ``tensor`` (numpy, the buffer protocol, __array__ or DLPack) out over
    ``device_mesh``: every device gets its piece."""
    return _C._distribute(tensor, device_mesh, placements)


def from_local(local_tensor, device_mesh, placements=None, shape=None, *, run_check=False, stride=None):
    """A DTensor from every device's own piece: ``local_tensor`` is a list of arrays in row-major
    mesh order (one array alone stands for every device). Without ``shape`` the global shape
    assumes even shards, as torch does; give it for uneven ones."""
    return _C._from_local(local_tensor, device_mesh, placements, shape)
