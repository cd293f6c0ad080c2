"""Making DTensors: factories with torch's signatures, distribute_tensor and from_local. The C
runtime checks every argument, picks torch's default dtypes and refuses requires_grad=True
(DTorch is inference-only)."""
from . import _C, _placement


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


def _like_placements(input):
    """The placements of a new tensor laid out as input: Partial becomes Replicate (a Partial
    factory would hold the value on every device, counted once per device)."""
    return [_placement.Replicate() if p.is_partial() else p for p in input.placements]


def _new_like(kind, input, size, dtype, fill_value=None):
    """new_zeros and its kin: size on input's mesh, laid out as input when the shapes match."""
    if len(size) == 1 and not isinstance(size[0], int):
        size = tuple(size[0])
    placements = _like_placements(input) if tuple(size) == input.shape else None
    dtype = input.dtype if dtype is None else dtype
    return _C._make(kind, size, input.device_mesh, placements, dtype, False, fill_value)


def _like(kind, input, dtype, fill_value=None):
    if not isinstance(input, _C.DTensor):
        raise TypeError(f"{kind}_like(): expected a DTensor, got {type(input).__name__}")
    return _C._make(kind, input.shape, input.device_mesh, _like_placements(input),
                    input.dtype if dtype is None else dtype, False, fill_value)


def zeros_like(input, *, dtype=None):
    """Zeros of input's shape, dtype, mesh and placements (Partial becomes Replicate), as torch's
    DTensor gives."""
    return _like("zeros", input, dtype)


def ones_like(input, *, dtype=None):
    """As zeros_like, of ones."""
    return _like("ones", input, dtype)


def empty_like(input, *, dtype=None):
    """As zeros_like, uninitialised."""
    return _like("empty", input, dtype)


def full_like(input, fill_value, *, dtype=None):
    """As zeros_like, every element fill_value; of input's dtype unless given, as torch."""
    return _like("full", input, dtype, fill_value)


def rand_like(input, *, dtype=None):
    """As zeros_like, uniform [0, 1) values (counter-based, as rand)."""
    return _like("rand", input, dtype)


def randn_like(input, *, dtype=None):
    """As zeros_like, standard normal values (counter-based, as randn)."""
    return _like("randn", input, dtype)


def distribute_tensor(tensor, device_mesh, placements=None):
    """Lays the global array ``tensor`` (numpy, the buffer protocol, __array__ or DLPack) out over
    ``device_mesh``: every device gets its piece."""
    return _C._distribute(tensor, device_mesh, placements)


def from_local(local_tensor, device_mesh, placements=None, shape=None, *, run_check=False, stride=None):
    """A DTensor from every device's own piece: ``local_tensor`` is a list of arrays in row-major
    mesh order (one array alone stands for every device). Without ``shape`` the global shape
    assumes even shards, as torch does; give it for uneven ones."""
    return _C._from_local(local_tensor, device_mesh, placements, shape)
