"""Writes into a DTensor in place: ``x[..., a:b] = y`` (the KV cache's update), and the fused
rotary embedding. The devices write into their own pieces; what was issued before the write (a
fetch, a redistribute, another op) still sees the old value."""
import numbers

import numpy as np

from . import _C, _dtype


def _region(x, index):
    """(dim, start, stop) of an index that is full slices, Ellipsis and one slice or int."""
    index = index if isinstance(index, tuple) else (index,)
    if sum(i is Ellipsis for i in index) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        fill = x.ndim - (len(index) - 1)
        index = index[:at] + (slice(None),) * fill + index[at + 1:]
    if len(index) > x.ndim:
        raise IndexError(f"too many indices for a tensor of dimension {x.ndim}")
    index = index + (slice(None),) * (x.ndim - len(index))
    written = [d for d, i in enumerate(index) if i != slice(None)]
    if len(written) > 1:
        raise NotImplementedError("DTensor.__setitem__: only one dim may be indexed (the rest ':'), "
                                  f"got {len(written)}")
    if not written:
        return 0, 0, x.shape[0] if x.ndim else 1
    dim = written[0]
    i = index[dim]
    size = x.shape[dim]
    if isinstance(i, (numbers.Integral, np.integer)) and not isinstance(i, (bool, np.bool_)):
        i = int(i)
        if not -size <= i < size:
            raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
        i %= size
        return dim, i, i + 1
    if isinstance(i, slice):
        start, stop, step = i.indices(size)
        if step != 1:
            raise NotImplementedError("DTensor.__setitem__: slices with a step are not supported")
        return dim, start, max(start, stop)
    raise NotImplementedError(f"DTensor.__setitem__: unsupported index {i!r} (ints, slices, ':' and '...')")


def setitem(x, index, value):
    """x[index] = value, in place: value a number or a DTensor broadcastable to the region."""
    from ._factory import full
    from ._tensor import DTensor
    if x.ndim == 0:
        raise NotImplementedError("DTensor.__setitem__ on a 0-d tensor")
    dim, start, stop = _region(x, index)
    shape = list(x.shape)
    shape[dim] = stop - start
    if stop == start:
        return
    if isinstance(value, DTensor):
        src = value if value.dtype is x.dtype else value.to(x.dtype)
        if src.device_mesh != x.device_mesh:
            raise ValueError("DTensor.__setitem__: the value lives on another mesh (redistribute it first)")
        if tuple(src.shape) != tuple(shape):
            keep = index if isinstance(index, tuple) else (index,)
            # an int index drops its dim in the value's view of the region
            if src.ndim == len(shape) - 1 and any(isinstance(i, (numbers.Integral, np.integer)) for i in keep):
                src = src.unsqueeze(dim)
            src = src.expand(*shape)
    elif isinstance(value, (numbers.Number, np.number, bool)):
        src = full(tuple(shape), value, device_mesh=x.device_mesh, dtype=x.dtype)
    else:
        raise TypeError(f"DTensor.__setitem__: the value must be a DTensor or a number, got {type(value).__name__}")
    write_slice_(x, dim, start, src)


def write_slice_(dst, dim, start, src):
    """dst[..., start:start + n, ...] = src along dim, in place; src has dst's dtype and mesh and
    its shape but n on dim (what x[...] = y comes down to, without parsing an index)."""
    _C._op("slice_assign_", (dst, src), (dim, start), None, None)


def write_pieces_(dst, dim, offset, src):
    """In place, by pieces: where dst is split on ``dim``, every device writes its piece of src
    (split alike on dim) at ``offset`` along dim of its piece of dst, so nothing moves between
    devices; where it is not, this is write_slice_ at ``offset``. For caches laid out per device."""
    _C._op("shard_assign_", (dst, src), (dim, offset), None, None)


def index_copy_(dst, dim, index, source):
    """torch's ``Tensor.index_copy_``: ``dst[..., index[i], ...] = source[..., i, ...]`` along dim,
    in place; index a 1-D int64 DTensor. dst may not be split on dim. An index out of range fails
    on the devices (dst then holds the error)."""
    if isinstance(index, numbers.Integral):
        raise TypeError("index_copy_(): index must be a DTensor of int64 positions")
    _C._op("index_copy_", (dst, index, source), (dim,), None, None)
    return dst


def index_copy(x, dim, index, source):
    """Out of place: a copy of x with index_copy_ applied."""
    return index_copy_(x * 1 if x.dtype is not _dtype.bool else x | False, dim, index, source)


def rotary_embedding(x, position_ids, inv_freq, scaling=1.0):
    """HF Llama's rotary position embedding of x (batch, heads, seq, head_dim), fused: x * cos +
    rotate_half(x) * sin with angles position_ids (batch or 1, seq) * inv_freq (head_dim / 2,).
    position_ids (integers) and inv_freq may be DTensors or host arrays (laid out on x's mesh,
    replicated)."""
    if not isinstance(x, _C.DTensor):
        raise TypeError(f"rotary_embedding: x must be a DTensor, got {type(x).__name__}")
    position_ids = _on_mesh_of(x, position_ids, "position_ids", np.int64)
    inv_freq = _on_mesh_of(x, inv_freq, "inv_freq", np.float32)
    if position_ids.dtype is not _dtype.int64:
        position_ids = position_ids.to(_dtype.int64)
    if inv_freq.dtype is not _dtype.float32:
        inv_freq = inv_freq.to(_dtype.float32)
    return _C._op("rope", (x, position_ids, inv_freq), None, (float(scaling),), None)


def _on_mesh_of(x, value, name, dtype):
    """``value`` as a DTensor: itself, or a host array of numbers (integers for an integer ``dtype``)
    in ``dtype`` replicated on x's mesh; anything else is a TypeError naming it."""
    if isinstance(value, _C.DTensor):
        return value
    from ._factory import distribute_tensor
    try:
        array = np.asarray(value)
    except Exception:
        array = None
    kinds = "iu" if np.dtype(dtype).kind == "i" else "iuf"
    if array is None or array.dtype.kind not in kinds:
        what = "integers" if kinds == "iu" else "numbers"
        raise TypeError(f"rotary_embedding: {name} must be a DTensor or an array of {what}, got "
                        f"{type(value).__name__}" + (f" of {array.dtype}" if array is not None else ""))
    return distribute_tensor(np.ascontiguousarray(array, dtype=dtype), x.device_mesh)
