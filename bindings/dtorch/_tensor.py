"""DTensor and TensorFuture: the handles live in C; this adds torch's conveniences. DTensor is the C
type itself (``_C.DTensor``): its C methods (the registry's ops, Python's operators and indexing)
are its own, and the ones written here are set on it, not on a subclass, so that the DTensor an op
returns is a plain C object (a subclass's instances are tracked by the cycle collector and freed
through Python's generic deallocation, which costs a view as much as making it)."""
import asyncio

import numpy as np

from . import _C, _dtype, _factory, _ops, _ops_matmul as _mm, _ops_reduce as _red, _ops_view as _view
from ._placement import _from_raw

# error codes of dtorch.h -> the exception a Python user expects
_EXCEPTIONS = {-1: _C.DTorchValueError, -2: _C.DTorchTypeError, -3: IndexError, -5: TimeoutError, -8: _C.OutOfMemoryError,
               -10: KeyboardInterrupt}


class TensorFuture(_C.TensorFuture):
    """The whole value of a DTensor, on its way: ``result()``, ``done()``, ``exception()``,
    or ``await`` it."""

    __slots__ = ()

    def result(self, timeout=None):
        """The value as a numpy array; waits up to ``timeout`` seconds (None: forever).
        Raises TimeoutError if it expires (the future stays usable), or the op's failure."""
        self._wait(timeout)
        buffer, code, shape = self._pieces()[0]
        return _dtype._to_numpy_array(buffer, code, shape)

    def exception(self, timeout=None):
        """The failure as an exception once settled, or None if the value arrived."""
        try:
            self._wait(timeout)
        except Exception:  # the failure itself is returned below; only a wait that expired raises
            if not self.done():
                raise
        err = self._error()
        if err is None:
            return None
        code, message = err
        return _EXCEPTIONS.get(code, RuntimeError)(message)

    def add_done_callback(self, fn):
        """Calls ``fn(future)`` once the future settles (at once if it has), as
        concurrent.futures does; it runs on a runtime thread, so it should be quick and must not
        wait on other futures. An exception it raises is printed, not raised."""
        if not callable(fn):
            raise TypeError(f"add_done_callback: expected a callable, got {type(fn).__name__}")
        self._add_done_callback(lambda: fn(self))

    def __await__(self):
        if not self.done():
            loop = asyncio.get_running_loop()
            settled = loop.create_future()

            def wake():  # runs on a runtime thread
                try:
                    loop.call_soon_threadsafe(_set_once, settled)
                except RuntimeError:  # the loop closed meanwhile
                    pass

            self._add_done_callback(wake)
            yield from settled.__await__()
        return self.result()

    def __repr__(self):
        state = "done" if self.done() else "pending"
        return f"<TensorFuture {state}>"


def _set_once(fut):
    if not fut.done():
        fut.set_result(None)


DTensor = _C.DTensor


class _DTensorMethods:
    """DTensor's methods written in Python: set on DTensor below."""

    # numpy must not take over `dtensor + ndarray` (it would fetch the value and compute locally):
    # mixing a DTensor with an array is an error, as mixing a DTensor with a torch.Tensor is
    __array_ufunc__ = None

    @property
    def dtype(self):
        return _dtype._BY_CODE[self._dtype_code]

    @property
    def placements(self):
        return _from_raw(self._placements_raw)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def dim(self):
        return self.ndim

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def numpy(self):
        """The whole value as a numpy array (Partial pieces reduced); waits for it."""
        return self.future().result()

    full_tensor = numpy

    def __array__(self, dtype=None, copy=None):
        value = self.numpy()
        return value if dtype is None else value.astype(dtype)

    def redistribute(self, device_mesh=None, placements=None):
        """The same value laid out with ``placements`` on ``device_mesh`` (default: this
        tensor's mesh). Devices exchange exactly the regions they lack, among themselves.
        Redistributing into Partial is refused unless the tensor already has that Partial."""
        return _C._redistribute(self, device_mesh, placements)

    def __dlpack__(self, **kwargs):
        """DLPack export of the whole value, fetched to this host (CPU meshes)."""
        return self.numpy().__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: the fetched value lives in host memory

    def to_local(self):
        """Every device's own piece (shard, replica or partial contribution), as numpy arrays in
        row-major mesh order."""
        fut = self._locals_future()
        fut._wait(None)
        return [_dtype._to_numpy_array(b, code, shape) for b, code, shape in fut._pieces()]

    def __setitem__(self, index, value):
        """``x[..., a:b] = y``: writes into x in place (one dim indexed by a slice or an int)."""
        from ._ops_write import setitem
        setitem(self, index, value)

    def index_copy_(self, dim, index, source):
        """``self[..., index[i], ...] = source[..., i, ...]`` along dim, in place (torch's)."""
        from ._ops_write import index_copy_
        return index_copy_(self, dim, index, source)

    def index_copy(self, dim, index, source):
        from ._ops_write import index_copy
        return index_copy(self, dim, index, source)

    def item(self):
        n = self.numel()
        if n != 1:
            raise RuntimeError(f"a Tensor with {n} elements cannot be converted to Scalar")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    # Python's conversions of a one-element tensor, as torch's: each fetches the value
    def __bool__(self):
        n = self.numel()
        if n != 1:
            raise RuntimeError(f"Boolean value of Tensor with {'no values' if n == 0 else 'more than one value'} "
                               "is ambiguous")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.dtype.is_floating_point or self.dtype == _dtype.bool or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def new_zeros(self, *size, dtype=None):
        """A tensor of zeros of ``size`` on this tensor's mesh, of its dtype unless given: laid
        out as this tensor (Partial as Replicate) when the shapes match, else replicated."""
        return _factory._new_like("zeros", self, size, dtype)

    def new_ones(self, *size, dtype=None):
        """As new_zeros, of ones."""
        return _factory._new_like("ones", self, size, dtype)

    def new_empty(self, *size, dtype=None):
        """As new_zeros, uninitialised."""
        return _factory._new_like("empty", self, size, dtype)

    def new_full(self, size, fill_value, *, dtype=None):
        """As new_zeros, every element fill_value."""
        return _factory._new_like("full", self, (size,), dtype, fill_value)

    def __repr__(self):
        mesh, placements = self.device_mesh, self.placements
        try:
            value = _format_values(self.numpy(), self.dtype)
        except Exception as e:  # a repr never raises: show why the value is missing
            value = f"<value unavailable: {e}>"
        dtype = "" if self.dtype in (_dtype.float32, _dtype.int64, _dtype.bool) else f", dtype={self.dtype}"
        return f"DTensor({value}{dtype}, device_mesh={mesh!r}, placements={placements!r})"

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(_view.unbind(self, 0))

    # ---- ops with a signature of their own (the registry's elementwise ones are on the C type) ----
    masked_fill = _ops.masked_fill
    clamp = clip = _ops.clamp
    clamp_min, clamp_max = _ops.clamp_min, _ops.clamp_max

    def where(self, condition, other):
        return _ops.where(condition, self, other)

    to = _ops.to

    # reshape and view are the C type's own methods (the per-op path)
    flatten = _view.flatten
    unsqueeze = _view.unsqueeze
    squeeze = _view.squeeze
    swapaxes = swapdims = _C.DTensor.transpose   # permute, transpose and t are the C type's own
    movedim = _view.movedim
    expand = _view.expand
    expand_as = _view.expand_as
    split = _view.split
    chunk = _view.chunk
    unbind = _view.unbind
    narrow = _view.narrow
    select = _view.select
    index_select = _view.index_select
    triu = _view.triu
    tril = _view.tril

    def clone(self, memory_format=None):
        """A copy of the value with pieces of its own, laid out as this one."""
        return _ops.to(self, self.dtype)

    def contiguous(self, memory_format=None):
        """Itself when its elements are in row-major order, else a copy that is."""
        return self if self._contiguous else self.clone()

    def is_contiguous(self, memory_format=None):
        """False for a view that reads its base out of row-major order (a transpose, a column, a
        stepped slice, a broadcast), as torch: dims of one element do not count. Chains of view
        ops answer as torch's views do (``x.t().t()`` is contiguous, ``x.t()[0]`` is not), also
        where the placements made a copy. Other ops' outputs are row-major: unlike torch, an
        elementwise op on a transpose gives a contiguous tensor."""
        return self._contiguous

    matmul = _mm.matmul
    mm = _mm.mm
    bmm = _mm.bmm

    sum = _red.sum
    mean = _red.mean
    var = _red.var
    std = _red.std
    max = _red.max
    min = _red.min
    amax = _red.amax
    amin = _red.amin
    argmax = _red.argmax
    argmin = _red.argmin
    softmax = _red.softmax
    log_softmax = _red.log_softmax
    cumsum = _red.cumsum
    topk = _red.topk

    # last: these names shadow builtins in the rest of the class body
    def float(self):
        return _ops.to(self, _dtype.float32)

    def half(self):
        return _ops.to(self, _dtype.float16)

    def bfloat16(self):
        return _ops.to(self, _dtype.bfloat16)

    def int(self):
        return _ops.to(self, _dtype.int32)

    def long(self):
        return _ops.to(self, _dtype.int64)

    def bool(self):
        return _ops.to(self, _dtype.bool)


for _name, _value in vars(_DTensorMethods).items():
    if _name not in ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"):
        setattr(DTensor, _name, _value)
del _name, _value


def _format_values(value, dt):
    """Values laid out like torch prints them: 4 decimals for floats, ', ' between items."""
    opts = dict(separator=", ", prefix="DTensor(", threshold=1000, edgeitems=3)
    if dt.is_floating_point:
        opts.update(precision=4, floatmode="fixed", suppress_small=False)
    if value.ndim == 0:
        return np.array2string(value, **opts)
    return np.array2string(value, **opts)
