"""Tensor ops with torch's names. The elementwise ops of the registry (ops/op_table.h) come from
the C runtime as they are: one callable per op, which checks its arguments in C; the rows name
where each goes (dtorch.<name> here, DTensor.<name> on the type, dtorch.nn.functional.<name>).
The few ops with a signature of their own (gelu, where, masked_fill, clamp, to) map it onto the
op's attributes below."""
import numbers

from . import _C, _dtype

_FN, _METHOD, _NN = 1, 2, 4  # DT_PY_* of dtorch.h

# name -> id of every registered op, for the hand-written wrappers' _C._op calls
ids = {name: op_id for name, op_id, *_ in _C._registry()}
functions = {name: fn for name, _, _, _, _, exports, _, fn in _C._registry() if exports & _FN}
nn_functions = {name: fn for name, _, _, _, _, exports, _, fn in _C._registry() if exports & _NN}
globals().update(functions)

negative, multiply, divide, subtract, true_divide = neg, mul, div, sub, div  # noqa: F821 (from the registry)


def gelu(input, approximate="none"):
    """GELU, exact (erf) or with approximate="tanh"."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _C._op(ids["gelu" if approximate == "none" else "gelu_tanh"], (input,), None, None, None)


def where(condition, input, other):
    """Elements of input where condition holds, else of other (either may be a number)."""
    tensors, number, at = [condition], None, 0
    for position, x in ((1, input), (2, other)):
        if isinstance(x, _C.DTensor) or number is not None:
            tensors.append(x)
        else:
            number, at = x, position
    return _C._op(ids["where"], tensors, (at,) if at else None, None, number)


def masked_fill(input, mask, value):
    """input with value wherever mask (broadcast to input) is True."""
    if isinstance(value, _C.DTensor) and value.ndim == 0:
        value = value.item()
    return _C._op(ids["masked_fill"], (input, mask), None, None, value)


def clamp(input, min=None, max=None):
    """input limited to [min, max] as torch.clamp: min(max(input, min), max), so a min above max
    gives max everywhere; NaN in input or a bound gives NaN. Either bound may be None, a number or a
    DTensor (broadcast, and promoted with input as torch's maximum and minimum are)."""
    if min is None and max is None:
        raise _C.DTorchValueError("clamp: At least one of 'min' or 'max' must not be None")
    if isinstance(min, _C.DTensor) or isinstance(max, _C.DTensor):
        out = input if min is None else maximum(input, min)  # noqa: F821 (from the registry)
        return out if max is None else minimum(out, max)  # noqa: F821
    for what, b in (("min", min), ("max", max)):
        if b is not None and not isinstance(b, numbers.Real):
            raise TypeError(f"clamp(): {what} must be a number or a DTensor, got {type(b).__name__}")
    given = [b for b in (min, max) if b is not None]
    flags = (min is not None) | ((max is not None) << 1)
    float_bound = not all(isinstance(b, numbers.Integral) for b in given)
    bounds = (0.0 if min is None else float(min), 0.0 if max is None else float(max))
    # integer bounds also travel exactly (a double holds integers to 2^53 only); one beyond int64 is
    # left to the range check of the float ones, which refuses it
    exact = () if float_bound or not all(-2 ** 63 <= b < 2 ** 63 for b in given) else \
        tuple(0 if b is None else int(b) for b in (min, max))
    return _C._op(ids["clamp"], (input,), (flags, int(float_bound)) + exact, bounds, None)


def clamp_min(input, min):
    """clamp(input, min=min)."""
    return clamp(input, min=min)


def clamp_max(input, max):
    """clamp(input, max=max)."""
    return clamp(input, max=max)


clip = clamp


def to(input, dtype):
    """input converted to dtype."""
    return _C._op(ids["to"], (input,), (_dtype._resolve(dtype)._code,), None, None)


__all__ = sorted(functions) + ["clamp", "clamp_max", "clamp_min", "clip", "divide", "gelu", "masked_fill", "multiply",
                               "negative", "subtract", "to", "true_divide", "where"]
