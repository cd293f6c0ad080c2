"""Tensor ops with torch's names: functions here, methods and operators on DTensor. Each one
is a thin call into the C op registry, which checks arguments, works out shapes, dtypes and
placements, and sends each device its part."""
import numbers

import numpy as np

from . import _C, _dtype
from ._tensor import DTensor


def _number(x):
    """A Python number operand, or None when x is not one."""
    if isinstance(x, (bool, np.bool_)):
        return int(x)
    if isinstance(x, (numbers.Integral, np.integer)):
        return int(x)
    if isinstance(x, (numbers.Real, np.floating)):
        return float(x)
    return None


def _mixed(name, x):
    raise TypeError(f"{name}: expected a DTensor or a number, got {type(x).__name__} "
                    "(distribute arrays with dtorch.distribute_tensor first)")


def _unary(name):
    def op(input):
        if not isinstance(input, DTensor):
            _mixed(name, input)
        return _C._op(name, (input,), None, None, None)
    op.__name__ = name
    op.__doc__ = f"Elementwise {name}, as torch.{name}."
    return op


def _binary(name):
    def op(input, other):
        if isinstance(input, DTensor):
            if isinstance(other, DTensor):
                return _C._op(name, (input, other), None, None, None)
            number = _number(other)
            if number is None:
                _mixed(name, other)
            return _C._op(name, (input,), None, None, number)
        number = _number(input)
        if number is None or not isinstance(other, DTensor):
            _mixed(name, input if number is None else other)
        return _C._op(name, (other,), (1,), None, number)
    op.__name__ = name
    op.__doc__ = f"Elementwise {name} with broadcasting and Python numbers, as torch.{name}."
    return op


neg, abs, exp, log, sqrt, rsqrt = (_unary(n) for n in ("neg", "abs", "exp", "log", "sqrt", "rsqrt"))
sin, cos, tanh, sigmoid, relu, silu = (_unary(n) for n in ("sin", "cos", "tanh", "sigmoid", "relu", "silu"))
reciprocal, logical_not = _unary("reciprocal"), _unary("logical_not")
add, sub, mul, div, pow = (_binary(n) for n in ("add", "sub", "mul", "div", "pow"))
maximum, minimum = _binary("maximum"), _binary("minimum")
eq, ne, lt, le, gt, ge = (_binary(n) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
logical_and, logical_or = _binary("logical_and"), _binary("logical_or")
negative, multiply, divide, subtract, true_divide = neg, mul, div, sub, div


def gelu(input, approximate="none"):
    """GELU, exact (erf) or with approximate="tanh"."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu" if approximate == "none" else "gelu_tanh")(input)


def where(condition, input, other):
    """Elements of input where condition holds, else of other (either may be a number)."""
    if not isinstance(condition, DTensor):
        _mixed("where", condition)
    tensors, number, at = [condition], None, 0
    for position, x in ((1, input), (2, other)):
        if isinstance(x, DTensor):
            tensors.append(x)
        elif number is None and _number(x) is not None:
            number, at = _number(x), position
        else:
            _mixed("where", x)
    return _C._op("where", tuple(tensors), (at,) if number is not None else None, None, number)


def masked_fill(input, mask, value):
    """input with value wherever mask (broadcast to input) is True."""
    number = _number(value)
    if number is None:
        if isinstance(value, DTensor) and value.ndim == 0:
            number = value.item()
        else:
            _mixed("masked_fill", value)
    return _C._op("masked_fill", (input, mask), None, None, number)


def clamp(input, min=None, max=None):
    """input limited to [min, max] (either bound may be None)."""
    flags = (min is not None) | ((max is not None) << 1)
    bounds = [float(_number(min)) if min is not None else 0.0, float(_number(max)) if max is not None else 0.0]
    float_bound = any(isinstance(b, float) for b in (min, max) if b is not None)
    return _C._op("clamp", (input,), (flags, int(float_bound)), bounds, None)


clip = clamp


def to(input, dtype):
    """input converted to dtype."""
    return _C._op("to", (input,), (_dtype._resolve(dtype)._code,), None, None)


def _install():
    """Methods and Python operators on DTensor."""
    methods = dict(neg=neg, abs=abs, exp=exp, log=log, sqrt=sqrt, rsqrt=rsqrt, sin=sin, cos=cos, tanh=tanh,
                   sigmoid=sigmoid, relu=relu, reciprocal=reciprocal, logical_not=logical_not, add=add, sub=sub,
                   mul=mul, div=div, pow=pow, maximum=maximum, minimum=minimum, eq=eq, ne=ne, lt=lt, le=le,
                   gt=gt, ge=ge, logical_and=logical_and, logical_or=logical_or, masked_fill=masked_fill,
                   clamp=clamp, clip=clamp, where=lambda self, condition, other: where(condition, self, other))
    for name, fn in methods.items():
        setattr(DTensor, name, fn)

    def to_method(self, dtype):
        return to(self, dtype)

    def cast(dtype):
        return lambda self: to(self, dtype)

    DTensor.to = to_method
    DTensor.float, DTensor.half, DTensor.bfloat16 = cast(_dtype.float32), cast(_dtype.float16), cast(_dtype.bfloat16)
    DTensor.int, DTensor.long, DTensor.bool = cast(_dtype.int32), cast(_dtype.int64), cast(_dtype.bool)
    # Python operators (+, -, *, /, **, @, comparisons, &, |, ~) are C slots of DTensor: the per-op path

_install()
