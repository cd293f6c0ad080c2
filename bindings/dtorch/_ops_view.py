"""Views and data movement with torch's names: reshape/view, transpose/permute/t/T, unsqueeze,
squeeze, flatten, expand, contiguous, cat/concat/concatenate, stack, split, chunk, unbind,
narrow, select, indexing (ints, slices, None, Ellipsis, an integer DTensor), index_select,
triu and tril. Every op returns a new DTensor whose pieces are fresh C-contiguous copies
(tensors are immutable on devices); contiguous() returns the tensor itself."""
import numbers
import operator

import numpy as np

from . import _C, _dtype
from ._placement import Replicate, Shard
from ._tensor import DTensor

_MAX_INPUTS = 32  # tensors one op call takes (OP_MAX_INPUTS)


def _check(name, x):
    if not isinstance(x, DTensor):
        raise TypeError(f"{name}: expected a DTensor, got {type(x).__name__}")


def _int(name, what, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}: {what} must be an int, got {type(v).__name__}")
    return int(v)


def _sizes(name, args):
    """A shape given as separate ints or as one sequence: (2, 3), ((2, 3),), ([2, 3],)."""
    if len(args) == 1 and not isinstance(args[0], (numbers.Integral, np.integer)):
        if isinstance(args[0], DTensor) or not hasattr(args[0], "__iter__"):
            raise TypeError(f"{name}: sizes must be ints or a sequence of ints, got {type(args[0]).__name__}")
        args = tuple(args[0])
    return tuple(_int(name, "size", s) for s in args)


def _dims(name, args):
    return _sizes(name, args)


def _op(name, x, ints):
    return _C._op(name, (x,), tuple(ints), None, None)


# ---- reshape-like ----------------------------------------------------------------------------

def reshape(input, shape):
    """input with another shape of the same number of elements (one size may be -1)."""
    _check("reshape", input)
    return _op("reshape", input, _sizes("reshape", (shape,)))


def _view(self, *shape):
    if len(shape) == 1 and isinstance(shape[0], (_dtype.dtype, np.dtype, type)):
        raise TypeError("view: reinterpreting the bytes as another dtype is not supported; use .to(dtype)")
    return _op("reshape", self, _sizes("view", shape))


def flatten(input, start_dim=0, end_dim=-1):
    """input with dims start_dim..end_dim merged into one."""
    _check("flatten", input)
    return _op("flatten", input, (_int("flatten", "start_dim", start_dim), _int("flatten", "end_dim", end_dim)))


def unsqueeze(input, dim):
    """input with a new size-1 dim at dim."""
    _check("unsqueeze", input)
    return _op("unsqueeze", input, (_int("unsqueeze", "dim", dim),))


def squeeze(input, dim=None):
    """input without its size-1 dims (all of them, or those among dim: an int or a tuple)."""
    _check("squeeze", input)
    if dim is None:
        dims = ()
    elif isinstance(dim, (tuple, list)):
        dims = tuple(_int("squeeze", "dim", d) for d in dim)
        if not dims:
            return input
    else:
        dims = (_int("squeeze", "dim", dim),)
    return _op("squeeze", input, dims)


# ---- permutations ----------------------------------------------------------------------------

def permute(input, dims):
    """input with its dims reordered: output dim i is input dim dims[i]."""
    _check("permute", input)
    return _op("permute", input, _dims("permute", (dims,)))


def transpose(input, dim0, dim1):
    """input with dims dim0 and dim1 swapped."""
    _check("transpose", input)
    n = max(input.ndim, 1)
    d0, d1 = _int("transpose", "dim0", dim0), _int("transpose", "dim1", dim1)
    for d in (d0, d1):
        if not -n <= d < n:
            raise IndexError(f"transpose: Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                             f"but got {d})")
    if input.ndim == 0:
        return input
    order = list(range(input.ndim))
    order[d0 % n], order[d1 % n] = order[d1 % n], order[d0 % n]
    return _op("permute", input, order)


swapaxes = swapdims = transpose


def t(input):
    """The transpose of a tensor of at most 2 dims."""
    _check("t", input)
    if input.ndim > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dimensions, but self is {input.ndim}D")
    return transpose(input, 0, 1) if input.ndim == 2 else input


def movedim(input, source, destination):
    """input with dims source moved to positions destination (ints or sequences)."""
    _check("movedim", input)
    src = (source,) if isinstance(source, (numbers.Integral, np.integer)) else tuple(source)
    dst = (destination,) if isinstance(destination, (numbers.Integral, np.integer)) else tuple(destination)
    if len(src) != len(dst):
        raise ValueError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain "
                         f"the same number of dims as destination ({list(dst)} dims)")
    n = input.ndim
    src = [_norm_dim("movedim", d, n) for d in src]
    dst = [_norm_dim("movedim", d, n) for d in dst]
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

def _expand(self, *sizes):
    return _op("expand", self, _sizes("expand", sizes))


def _expand_as(self, other):
    _check("expand_as", other)
    return _op("expand", self, other.shape)


# ---- cat / stack -----------------------------------------------------------------------------

def _tensor_list(name, tensors):
    if isinstance(tensors, DTensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{name}(): argument 'tensors' must be a tuple or list of DTensors, "
                        f"not {type(tensors).__name__}")
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{name}(): expected a non-empty list of Tensors")
    for i, x in enumerate(tensors):
        if not isinstance(x, DTensor):
            raise TypeError(f"{name}(): expected a DTensor at position {i}, got {type(x).__name__}")
    return tensors


def cat(tensors, dim=0):
    """The tensors joined along dim (their dtypes promoted as torch does)."""
    tensors = _tensor_list("cat", tensors)
    dim = _int("cat", "dim", dim)
    if any(x.ndim != 1 for x in tensors):
        # torch skips legacy empty 1-D tensors of shape (0,) when concatenating others
        kept = [x for x in tensors if x.shape != (0,)]
        tensors = kept or tensors[:1]
    if len(tensors) > _MAX_INPUTS:
        tensors = [cat(tensors[i:i + _MAX_INPUTS], dim) for i in range(0, len(tensors), _MAX_INPUTS)]
        return cat(tensors, dim)
    return _C._op("cat", tuple(tensors), (dim,), None, None)


concat = concatenate = cat


def stack(tensors, dim=0):
    """The tensors (all of one shape) stacked along a new dim."""
    tensors = _tensor_list("stack", tensors)
    dim = _int("stack", "dim", dim)
    if len(tensors) > _MAX_INPUTS:
        n = tensors[0].ndim + 1
        if not -n <= dim < n:
            raise IndexError(f"stack: Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                             f"but got {dim})")
        parts = [stack(tensors[i:i + _MAX_INPUTS], dim) for i in range(0, len(tensors), _MAX_INPUTS)]
        return cat(parts, dim)
    return _C._op("stack", tuple(tensors), (dim,), None, None)


# ---- slicing ---------------------------------------------------------------------------------

def narrow(input, dim, start, length):
    """The length elements of input along dim that begin at start."""
    _check("narrow", input)
    return _op("narrow", input, (_int("narrow", "dim", dim), _int("narrow", "start", start),
                                 _int("narrow", "length", length)))


def select(input, dim, index):
    """input at position index of dim (that dim removed)."""
    _check("select", input)
    return _op("select", input, (_int("select", "dim", dim), _int("select", "index", index)))


def _gathered(x, dim, pieces):
    """x with any shard of dim replaced by Replicate when it will be cut into several pieces:
    one all-gather instead of one per piece (strict mode leaves it to the ops to refuse)."""
    if pieces <= 1 or _C.get_strict():
        return x
    pl = x.placements
    if not any(isinstance(p, Shard) and p.dim == dim for p in pl):
        return x
    return x.redistribute(x.device_mesh, [Replicate() if isinstance(p, Shard) and p.dim == dim else p for p in pl])


def _norm_dim(name, dim, ndim):
    dim = _int(name, "dim", dim)
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{name}: Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def split(tensor, split_size_or_sections, dim=0):
    """Pieces of tensor along dim: of split_size each (the last may be shorter), or of the
    given section sizes."""
    _check("split", tensor)
    if tensor.ndim == 0:
        raise IndexError("split: cannot split a 0-dim tensor")
    d = _norm_dim("split", dim, tensor.ndim)
    size = tensor.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [_int("split", "split size", s) for s in split_size_or_sections]
        if any(s < 0 for s in sizes) or sum(sizes) != size:
            raise ValueError(f"split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's size at "
                             f"dimension {d}), but got split_sizes={sizes}")
    else:
        step = _int("split", "split_size", split_size_or_sections)
        if step < 0:
            raise ValueError(f"split expects split_size be non-negative, but got split_size={step}")
        if step == 0:
            if size != 0:
                raise ValueError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {size}")
            sizes = [0]
        else:
            sizes = [min(step, size - s) for s in range(0, size, step)] or [0]
    x = _gathered(tensor, d, len(sizes))
    out, start = [], 0
    for s in sizes:
        out.append(_op("narrow", x, (d, start, s)))
        start += s
    return tuple(out)


def chunk(input, chunks, dim=0):
    """input cut into at most `chunks` pieces along dim, as torch.chunk (pieces of
    ceil(size / chunks); trailing ones short, fewer pieces when they run out)."""
    _check("chunk", input)
    chunks = _int("chunk", "chunks", chunks)
    if chunks <= 0:
        raise ValueError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    if input.ndim == 0:
        raise IndexError("chunk: cannot chunk a 0-dim tensor")
    d = _norm_dim("chunk", dim, input.ndim)
    size = input.shape[d]
    step = -(-size // chunks)
    if step == 0:
        return split(input, [0] * chunks, d)
    return split(input, step, d)


def unbind(input, dim=0):
    """Every slice of input along dim, that dim removed."""
    _check("unbind", input)
    if input.ndim == 0:
        raise IndexError("unbind: Dimension specified as 0 but tensor has no dimensions")
    d = _norm_dim("unbind", dim, input.ndim)
    x = _gathered(input, d, input.shape[d])
    return tuple(_op("select", x, (d, i)) for i in range(input.shape[d]))


def _is_int(v):
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _getitem(self, index):
    """x[index] with ints, slices (step > 0), None and Ellipsis, as torch; or one integer
    DTensor (x[idx] = index_select along dim 0, negative positions allowed)."""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(it, DTensor) for it in items):
        if len(items) != 1:
            raise TypeError("indexing with a DTensor together with other indices is not supported")
        idx = items[0]
        if idx.dtype not in (_dtype.int32, _dtype.int64) or idx.ndim > 1:
            raise TypeError(f"indexing with a DTensor needs a 0-d or 1-D integer DTensor, got {idx.ndim}-D "
                            f"{idx.dtype}")
        if self.ndim == 0:
            raise IndexError("too many indices for tensor of dimension 0")
        out = _C._op("index_select", (self, idx), (0, 1), None, None)
        return out if idx.ndim == 1 else _op("squeeze", out, (0,))
    for it in items:
        if not (it is None or it is Ellipsis or isinstance(it, slice) or _is_int(it)):
            raise TypeError("only integers, slices (`:`), ellipsis (`...`), None and integer DTensors are valid "
                            f"indices (got {type(it).__name__})")
    if sum(1 for it in items if it is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for it in items if it is not None and it is not Ellipsis)
    if consumed > self.ndim:
        raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
    fill = [slice(None)] * (self.ndim - consumed)
    if Ellipsis in items:
        at = next(i for i, it in enumerate(items) if it is Ellipsis)
        items[at:at + 1] = fill
    else:
        items += fill
    steps = []  # (dim of self, "select" | "slice", ints)
    final, d = [], 0
    for it in items:
        if it is None:
            final.append(1)
            continue
        size = self.shape[d]
        if _is_int(it):
            i = int(it)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
            steps.append((d, "select", (d, i % size)))
        else:
            step = 1 if it.step is None else operator.index(it.step)
            if step <= 0:
                raise ValueError("step must be greater than zero")
            start, stop, step = slice(it.start, it.stop, step).indices(size)
            length = max(0, -(-(stop - start) // step))
            final.append(length)
            if not (start == 0 and length == size and (step == 1 or size <= 1)):
                steps.append((d, "slice", (d, start, stop, step)))
        d += 1
    x = self
    for _, name, ints in sorted(steps, key=lambda s: -s[0]):  # last dims first: earlier dims keep their numbers
        x = _op(name, x, ints)
    if tuple(final) != x.shape:
        x = _op("reshape", x, final)
    return x


def index_select(input, dim, index):
    """The entries of input at positions index (a 0-d or 1-D int32/int64 DTensor) along dim."""
    _check("index_select", input)
    if not isinstance(index, DTensor):
        raise TypeError(f"index_select(): argument 'index' must be a DTensor, not {type(index).__name__}")
    return _C._op("index_select", (input, index), (_int("index_select", "dim", dim), 0), None, None)


def triu(input, diagonal=0):
    """The upper triangle of the matrices in the last two dims (elements below the diagonal zeroed)."""
    _check("triu", input)
    return _op("triu", input, (_int("triu", "diagonal", diagonal),))


def tril(input, diagonal=0):
    """The lower triangle of the matrices in the last two dims (elements above the diagonal zeroed)."""
    _check("tril", input)
    return _op("tril", input, (_int("tril", "diagonal", diagonal),))


def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return iter(unbind(self, 0))


def _install():
    """Methods on DTensor, with torch's signatures."""
    DTensor.reshape = lambda self, *shape: _op("reshape", self, _sizes("reshape", shape))
    DTensor.view = _view
    DTensor.flatten = flatten
    DTensor.unsqueeze = unsqueeze
    DTensor.squeeze = squeeze
    DTensor.permute = lambda self, *dims: _op("permute", self, _dims("permute", dims))
    DTensor.transpose = transpose
    DTensor.swapaxes = DTensor.swapdims = transpose
    DTensor.t = t
    DTensor.T = property(lambda self: self if self.ndim < 2 else _op("permute", self, range(self.ndim - 1, -1, -1)))
    DTensor.mT = property(lambda self: transpose(self, -2, -1))
    DTensor.movedim = movedim
    DTensor.expand = _expand
    DTensor.expand_as = _expand_as
    DTensor.contiguous = lambda self, memory_format=None: self
    DTensor.is_contiguous = lambda self, memory_format=None: True
    DTensor.split = split
    DTensor.chunk = chunk
    DTensor.unbind = unbind
    DTensor.narrow = narrow
    DTensor.select = select
    DTensor.index_select = index_select
    DTensor.triu = triu
    DTensor.tril = tril
    DTensor.__getitem__ = _getitem
    DTensor.__iter__ = _iter


_install()
