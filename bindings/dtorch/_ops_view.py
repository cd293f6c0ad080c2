"""Views and data movement with torch's names: reshape/view, transpose/permute/t/T, unsqueeze,
squeeze, flatten, expand, contiguous, cat/concat/concatenate, stack, split, chunk, unbind,
narrow, select, index_select, triu and tril (indexing is DTensor.__getitem__, in C; reshape,
view, permute, transpose and t are the C type's methods). Every op returns a new DTensor with
value semantics: views (reshape, slices, permute, expand) are made on the controller and read
their tensor's pieces as they were, other ops make fresh pieces; contiguous() returns the tensor
itself. The C runtime checks the arguments; split,
chunk and unbind gather a sharded dim once before cutting it (dtensor/dt_index.c)."""
import numbers

import numpy as np

from . import _C
from ._ops import ids

_MAX_INPUTS = 32  # tensors one op call takes (OP_MAX_INPUTS)


def _sizes(args):
    """A shape given as separate ints or as one sequence: (2, 3), ((2, 3),), ([2, 3],)."""
    one = args[0] if len(args) == 1 else None
    if hasattr(one, "__iter__") and not isinstance(one, (_C.DTensor, str)):
        return tuple(one)
    return args


def _op(name, x, ints):
    return _C._op(ids[name], (x,), tuple(ints), None, None)


def _tensor(name, x):
    if not isinstance(x, _C.DTensor):
        raise TypeError(f"{name}(): argument 'input' must be a DTensor, not {type(x).__name__}")
    return x


def _dim(name, dim, ndim):
    """dim normalised for ndim dims, IndexError when out of range."""
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}(): dim must be an int, got {type(dim).__name__}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{name}: Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return int(dim) % n


# ---- reshape-like ----------------------------------------------------------------------------

def reshape(input, shape):
    """input with another shape of the same number of elements (one size may be -1); the method
    (DTensor.reshape, DTensor.view) is the C type's own."""
    return input.reshape(shape) if isinstance(input, _C.DTensor) else _op("reshape", input, _sizes((shape,)))


def flatten(input, start_dim=0, end_dim=-1):
    """input with dims start_dim..end_dim merged into one."""
    return _op("flatten", input, (start_dim, end_dim))


def unsqueeze(input, dim):
    """input with a new size-1 dim at dim."""
    return _op("unsqueeze", input, (dim,))


def squeeze(input, dim=None):
    """input without its size-1 dims (all of them, or those among dim: an int or a tuple)."""
    if isinstance(dim, (tuple, list)) and not dim:
        return input
    return _op("squeeze", input, () if dim is None else tuple(dim) if isinstance(dim, (tuple, list)) else (dim,))


# ---- permutations ----------------------------------------------------------------------------

def permute(input, *dims):
    """input with its dims reordered: output dim i is input dim dims[i] (DTensor.permute, in C)."""
    return _C.DTensor.permute(_tensor("permute", input), *dims)


def transpose(input, dim0, dim1):
    """input with dims dim0 and dim1 swapped (DTensor.transpose, in C)."""
    return _C.DTensor.transpose(_tensor("transpose", input), dim0, dim1)


swapaxes = swapdims = transpose


def t(input):
    """The transpose of a tensor of at most 2 dims (DTensor.t, in C)."""
    return _C.DTensor.t(_tensor("t", input))


def movedim(input, source, destination):
    """input with dims source moved to positions destination (ints or sequences)."""
    src = (source,) if isinstance(source, (numbers.Integral, np.integer)) else tuple(source)
    dst = (destination,) if isinstance(destination, (numbers.Integral, np.integer)) else tuple(destination)
    if len(src) != len(dst):
        raise ValueError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain "
                         f"the same number of dims as destination ({list(dst)} dims)")
    n = input.ndim
    src = [_dim("movedim", d, n) for d in src]
    dst = [_dim("movedim", d, n) for d in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"movedim: repeated dim in `source` ({list(src)}) or `destination` ({list(dst)})")
    if n == 0:
        return input
    order = [None] * n
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(n) if d not in src)
    order = [o if o is not None else next(rest) for o in order]
    return _op("permute", input, order)


# ---- expand ----------------------------------------------------------------------------------

def expand(self, *sizes):
    return _op("expand", self, _sizes(sizes))


def expand_as(self, other):
    return _op("expand", self, other.shape)


# ---- cat / stack -----------------------------------------------------------------------------

def _tensor_list(name, tensors):
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{name}(): argument 'tensors' must be a tuple or list of DTensors, "
                        f"not {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{name}(): expected a non-empty list of Tensors")
    return list(tensors)


def cat(tensors, dim=0):
    """The tensors joined along dim (their dtypes promoted as torch does)."""
    tensors = _tensor_list("cat", tensors)
    if any(isinstance(x, _C.DTensor) and x.ndim != 1 for x in tensors):
        # torch skips legacy empty 1-D tensors of shape (0,) when concatenating others
        kept = [x for x in tensors if not isinstance(x, _C.DTensor) or x.shape != (0,)]
        tensors = kept or tensors[:1]
    if len(tensors) > _MAX_INPUTS:
        return cat([cat(tensors[i:i + _MAX_INPUTS], dim) for i in range(0, len(tensors), _MAX_INPUTS)], dim)
    return _C._op(ids["cat"], tensors, (dim,), None, None)


concat = concatenate = cat


def stack(tensors, dim=0):
    """The tensors (all of one shape) stacked along a new dim."""
    tensors = _tensor_list("stack", tensors)
    if len(tensors) > _MAX_INPUTS:
        d = _dim("stack", dim, tensors[0].ndim + 1)
        return cat([stack(tensors[i:i + _MAX_INPUTS], d) for i in range(0, len(tensors), _MAX_INPUTS)], d)
    return _C._op(ids["stack"], tensors, (dim,), None, None)


# ---- slicing ---------------------------------------------------------------------------------

def narrow(input, dim, start, length):
    """The length elements of input along dim that begin at start."""
    return _op("narrow", input, (dim, start, length))


def select(input, dim, index):
    """input at position index of dim (that dim removed)."""
    return _op("select", input, (dim, index))


def split(tensor, split_size_or_sections, dim=0):
    """Pieces of tensor along dim: of split_size each (the last may be shorter), or of the
    given section sizes."""
    return _C._cut("split", tensor, split_size_or_sections, dim)


def chunk(input, chunks, dim=0):
    """input cut into at most `chunks` pieces along dim, as torch.chunk (pieces of
    ceil(size / chunks); trailing ones short, fewer pieces when they run out)."""
    return _C._cut("chunk", input, chunks, dim)


def unbind(input, dim=0):
    """Every slice of input along dim, that dim removed."""
    return _C._cut("unbind", input, None, dim)


def index_select(input, dim, index):
    """The entries of input at positions index (a 0-d or 1-D int32/int64 DTensor) along dim."""
    return _C._op(ids["index_select"], (input, index), (dim, 0), None, None)


def triu(input, diagonal=0):
    """The upper triangle of the matrices in the last two dims (elements below the diagonal zeroed)."""
    return _op("triu", input, (diagonal,))


def tril(input, diagonal=0):
    """The lower triangle of the matrices in the last two dims (elements above the diagonal zeroed)."""
    return _op("tril", input, (diagonal,))


__all__ = ["cat", "chunk", "concat", "concatenate", "flatten", "index_select", "movedim", "narrow", "permute",
           "reshape", "select", "split", "squeeze", "stack", "swapaxes", "swapdims", "t", "transpose", "tril", "triu",
           "unbind", "unsqueeze"]
