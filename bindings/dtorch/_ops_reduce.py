"""Reductions and normalisation with torch's names and signatures: sum, mean, max, min, amax,
amin, argmax, argmin, softmax, log_softmax, cumsum, topk, layer_norm, rms_norm. Each is a thin
call into the C op registry (ops/op_reduce.c), which checks arguments, works out shapes, dtypes
and placements (a reduction over a sharded dim gives a Partial result) and sends each device its
part."""
import builtins
import collections
import numbers
import warnings

from . import _C, _dtype
from ._ops import ids, maximum, minimum
from ._placement import Replicate

# torch.return_types.{max,min,topk}: tuples whose fields are also named
max_result = collections.namedtuple("max", ["values", "indices"])
min_result = collections.namedtuple("min", ["values", "indices"])
topk_result = collections.namedtuple("topk", ["values", "indices"])


def _dims(dim):
    """dim as a tuple: None and () mean every dim."""
    if dim is None:
        return ()
    return tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)


def _dtype_code(dtype):
    return -1 if dtype is None else _dtype._resolve(dtype)._code


def _list_reduce(name, input, dim, keepdim, dtype=None):
    return _C._op(ids[name], (input,), (int(bool(keepdim)), _dtype_code(dtype)) + _dims(dim), None, None)


def sum(input, dim=None, keepdim=False, *, dtype=None):
    """Sum over dim (an int or a tuple of ints; None: every dim). bool and integer inputs sum to
    int64; dtype= converts the input first."""
    return _list_reduce("sum", input, dim, keepdim, dtype)


def mean(input, dim=None, keepdim=False, *, dtype=None):
    """Mean over dim (an int or a tuple of ints; None: every dim); floating inputs only, or a
    floating dtype=."""
    return _list_reduce("mean", input, dim, keepdim, dtype)


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance over dim (an int or a tuple of ints; None: every dim): the mean squared distance
    from the mean, over N - correction (default 1, Bessel's; ``unbiased=False`` is 0), as torch;
    N - correction <= 0 gives inf or nan. Floating inputs only; float16 and bfloat16 are computed
    in float32 and rounded once, as torch's are."""
    return _var(input, dim, unbiased, keepdim, correction, False)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Standard deviation: the square root of var (same arguments)."""
    return _var(input, dim, unbiased, keepdim, correction, True)


def _var(input, dim, unbiased, keepdim, correction, root):
    if isinstance(dim, bool):  # var(x, False): torch's older signature, unbiased first
        dim, unbiased = None, dim
    if unbiased is not None:
        if correction is not None:
            raise TypeError("var(): give unbiased or correction, not both")
        if not isinstance(unbiased, bool):
            raise TypeError(f"var(): unbiased must be a bool, got {type(unbiased).__name__}")
        correction = int(unbiased)
    correction = 1 if correction is None else correction
    if not input.dtype.is_floating_point:
        raise _C.DTorchTypeError(f"var(): floating inputs only (got {input.dtype}), as torch's std and var")
    # 16-bit squares and their sum overflow (float16) or lose bits (bfloat16) where the variance
    # itself does not: torch accumulates in float32 and rounds the result once
    wide = input if input.dtype == _dtype.float32 else input.to(_dtype.float32)
    centred = wide - mean(wide, dim, keepdim=True)  # checks dim
    dims = _dims(dim) or range(input.ndim)
    n = 1
    for d in dims:
        n *= input.shape[d]
    # torch divides by max(0, N - correction): a positive sum over 0 is inf, 0 over 0 is nan
    out = sum(centred * centred, dim, keepdim=keepdim) / float(builtins.max(0, n - correction))
    if root:
        out = out.sqrt()
    if out.dtype == input.dtype:
        return out
    if any(p.is_partial() for p in out.placements):
        # a cast keeps a Partial sum, rounding each device's contribution: round the sum once
        out = out.redistribute(placements=[Replicate() if p.is_partial() else p for p in out.placements])
    return out.to(input.dtype)


def amax(input, dim=(), keepdim=False):
    """Largest value over dim (an int or a tuple of ints; (): every dim)."""
    return _list_reduce("amax", input, dim, keepdim)


def amin(input, dim=(), keepdim=False):
    """Smallest value over dim (an int or a tuple of ints; (): every dim)."""
    return _list_reduce("amin", input, dim, keepdim)


def _extreme(name, pointwise, result, input, dim, keepdim):
    if isinstance(dim, _C.DTensor):
        return pointwise(input, dim)
    if dim is None:
        if keepdim:
            raise TypeError(f"{name}(): keepdim needs a dim")
        return _C._op(ids[name], (input,), None, None, None)
    values, indices = _C._op(ids[name + "_dim"], (input,), (dim, int(bool(keepdim))), None, None)
    return result(values, indices)


def max(input, dim=None, keepdim=False):
    """max(input): the largest value. max(input, dim, keepdim=False): (values, indices) along dim.
    max(input, other): the elementwise maximum."""
    return _extreme("max", maximum, max_result, input, dim, keepdim)


def min(input, dim=None, keepdim=False):
    """min(input): the smallest value. min(input, dim, keepdim=False): (values, indices) along dim.
    min(input, other): the elementwise minimum."""
    return _extreme("min", minimum, min_result, input, dim, keepdim)


def _arg(name, input, dim, keepdim):
    ints = (int(bool(keepdim)),) + (() if dim is None else (dim,))
    return _C._op(ids[name], (input,), ints, None, None)


def argmax(input, dim=None, keepdim=False):
    """int64 index of the largest value along dim (None: into the flattened tensor)."""
    return _arg("argmax", input, dim, keepdim)


def argmin(input, dim=None, keepdim=False):
    """int64 index of the smallest value along dim (None: into the flattened tensor)."""
    return _arg("argmin", input, dim, keepdim)


def _softmax(name, input, dim, dtype):
    return _C._op(ids[name], (input,), (dim, _dtype_code(dtype)), None, None)


def softmax(input, dim, dtype=None):
    """softmax along dim, computed in float32 (dtype= converts the input first)."""
    return _softmax("softmax", input, dim, dtype)


def log_softmax(input, dim, dtype=None):
    """log of softmax along dim, computed in float32 without forming the softmax."""
    return _softmax("log_softmax", input, dim, dtype)


def _implicit_dim(name, input, dim, stacklevel):
    """torch.nn.functional's legacy choice when dim is None (deprecated there, with a warning)."""
    if dim is not None:
        return dim
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  "as an argument.", stacklevel=stacklevel)
    ndim = input.ndim if isinstance(input, _C.DTensor) else 0  # not a DTensor: the op call says so
    return 0 if ndim in (0, 1, 3) else 1


def nn_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """torch.nn.functional.softmax."""
    return softmax(input, _implicit_dim("softmax", input, dim, _stacklevel), dtype)


def nn_log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """torch.nn.functional.log_softmax."""
    return log_softmax(input, _implicit_dim("log_softmax", input, dim, _stacklevel), dtype)


def cumsum(input, dim, *, dtype=None):
    """Running sum along dim; bool and integer inputs sum to int64."""
    return _C._op(ids["cumsum"], (input,), (dim, _dtype_code(dtype)), None, None)


def topk(input, k, dim=-1, largest=True, sorted=True):
    """(values, indices) of the k largest (or smallest) elements along dim, largest first (or
    smallest first)."""
    ints = (k, dim, int(bool(largest)), int(bool(sorted)))
    values, indices = _C._op(ids["topk"], (input,), ints, None, None)
    return topk_result(values, indices)


def _normalized_shape(name, shape):
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        return (int(shape),)
    if isinstance(shape, (str, bytes)) or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool)
                                                  for s in shape):
        raise TypeError(f"{name}(): normalized_shape must be an int or a sequence of ints, "
                        f"got {type(shape).__name__}")
    return tuple(shape)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the trailing normalized_shape dims (biased variance), then
    times weight and plus bias where given; float32 inside."""
    tensors, flags = [input], 0
    if weight is not None:
        tensors.append(weight)
        flags |= 1
    if bias is not None:
        tensors.append(bias)
        flags |= 2
    return _C._op(ids["layer_norm"], tuple(tensors), (flags,) + _normalized_shape("layer_norm", normalized_shape),
                  (float(eps),), None)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """RMS normalisation over the trailing normalized_shape dims, then times weight where given;
    float32 inside. eps=None is torch's default, float32's machine epsilon."""
    tensors = [input] if weight is None else [input, weight]
    return _C._op(ids["rms_norm"], tuple(tensors), (int(weight is not None),)
                  + _normalized_shape("rms_norm", normalized_shape),
                  None if eps is None else (float(eps),), None)
