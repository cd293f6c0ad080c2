"""Tensor ops with torch's names. The elementwise ops of the registry (ops/op_table.h) come from
the C runtime as they are: one callable per op, which checks its arguments in C; the rows name
where each goes (dtorch.<name> here, DTensor.<name> on the type, dtorch.nn.functional.<name>).
The few ops with a signature of their own (gelu, where, masked_fill, clamp, to) map it onto the
op's attributes below."""
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
    """input limited to [min, max] (either bound may be None)."""
    flags = (min is not None) | ((max is not None) << 1)
    float_bound = any(isinstance(b, float) for b in (min, max) if b is not None)
    bounds = (0.0 if min is None else min, 0.0 if max is None else max)
    return _C._op(ids["clamp"], (input,), (flags, int(float_bound)), bounds, None)


clip = clamp


def to(input, dtype):
    """input converted to dtype."""
    return _C._op(ids["to"], (input,), (_dtype._resolve(dtype)._code,), None, None)


__all__ = sorted(functions) + ["clamp", "clip", "divide", "gelu", "masked_fill", "multiply", "negative", "subtract",
                               "to", "true_divide", "where"]
