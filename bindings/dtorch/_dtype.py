"""Element types of DTensors, with torch's names."""
import numpy as np


class dtype:
    """An element type: ``dtorch.float32``, ``dtorch.bfloat16``, ..."""

    __slots__ = ("name", "itemsize", "is_floating_point", "_code", "_numpy")

    def __init__(self, name, code, itemsize, is_floating_point, numpy_type):
        self.name = name
        self._code = code
        self.itemsize = itemsize
        self.is_floating_point = is_floating_point
        self._numpy = numpy_type

    def __repr__(self):
        return f"dtorch.{self.name}"

    def __reduce__(self):
        return self.name


# codes match dt_dtype in dtorch.h
float32 = dtype("float32", 0, 4, True, np.float32)
float16 = dtype("float16", 1, 2, True, np.float16)
bfloat16 = dtype("bfloat16", 2, 2, True, None)  # numpy has none: values come back as float32
int32 = dtype("int32", 3, 4, False, np.int32)
int64 = dtype("int64", 4, 8, False, np.int64)
bool = dtype("bool", 5, 1, False, np.bool_)

float = float32
half = float16
int = int32
long = int64

_BY_CODE = (float32, float16, bfloat16, int32, int64, bool)
_BY_NAME = {d.name: d for d in _BY_CODE}
_BY_NUMPY = {np.dtype(d._numpy): d for d in _BY_CODE if d._numpy is not None}


def _resolve(value, default=float32):
    """A dtorch dtype from a dtype, its name, or a numpy dtype; None gives default."""
    if value is None:
        return default
    if isinstance(value, dtype):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    try:
        found = _from_numpy(np.dtype(value))
    except TypeError:
        found = None
    if found is None:
        raise TypeError(
            f"unknown dtype {value!r}; expected one of "
            + ", ".join(f"dtorch.{n}" for n in _BY_NAME))
    return found


def _code_of(value):
    """The code of a dtype given as a dtype, its name or a numpy dtype (the C runtime asks)."""
    return _resolve(value)._code


def _from_numpy(np_dtype):
    """The dtorch dtype of a numpy dtype, or None when there is none."""
    if np_dtype.name == "bfloat16":  # ml_dtypes' bfloat16
        return bfloat16
    return _BY_NUMPY.get(np_dtype)


def _to_numpy_array(buffer, code, shape):
    """Wraps a fetched piece (a buffer) as a numpy array without copying, but for bfloat16."""
    if code == bfloat16._code:
        bits = np.frombuffer(buffer, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    return np.frombuffer(buffer, dtype=_BY_CODE[code]._numpy).reshape(shape)
