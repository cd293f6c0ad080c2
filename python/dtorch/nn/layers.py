"""Layers with torch.nn's names, signatures, parameter names and initialisation. Each takes
``device_mesh=`` (default: one CPU device) and ``dtype=`` (default float32); parameters are DTensors
replicated over the mesh until a parallel style lays them out otherwise."""
import math
import numbers

from .. import _factory
from . import functional as F
from .module import Module, new_parameter


def _uniform(bound):
    def init(shape, mesh, dtype):
        return (_factory.rand(shape, device_mesh=mesh) * (2.0 * bound) - bound).to(dtype)
    return init


def _normal(shape, mesh, dtype):
    return _factory.randn(shape, device_mesh=mesh, dtype=dtype)


def _ones(shape, mesh, dtype):
    return _factory.ones(shape, device_mesh=mesh, dtype=dtype)


def _zeros(shape, mesh, dtype):
    return _factory.zeros(shape, device_mesh=mesh, dtype=dtype)


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features), torch's kaiming-uniform init."""

    def __init__(self, in_features, out_features, bias=True, device_mesh=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        self.weight = new_parameter((self.out_features, self.in_features), dtype, device_mesh, _uniform(bound))
        if bias:
            self.bias = new_parameter((self.out_features,), dtype, device_mesh, _uniform(bound))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """Rows of weight (num_embeddings, embedding_dim) picked by integer indices; N(0, 1) init."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, device_mesh=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None:
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx %= self.num_embeddings
        self.padding_idx = padding_idx
        self.weight = new_parameter((self.num_embeddings, self.embedding_dim), dtype, device_mesh, _normal)

    def forward(self, input):
        return F.embedding(input, self.weight)

    def extra_repr(self):
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the trailing normalized_shape dims (float32 inside)."""

    def __init__(self, normalized_shape, eps=1e-6, elementwise_affine=True, device_mesh=None, dtype=None):
        super().__init__()
        self.normalized_shape, self.eps = _shape(normalized_shape), eps
        self.elementwise_affine = bool(elementwise_affine)
        if self.elementwise_affine:
            self.weight = new_parameter(self.normalized_shape, dtype, device_mesh, _ones)
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LayerNorm(Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing normalized_shape dims."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device_mesh=None,
                 dtype=None):
        super().__init__()
        self.normalized_shape, self.eps = _shape(normalized_shape), eps
        self.elementwise_affine = bool(elementwise_affine)
        if self.elementwise_affine:
            self.weight = new_parameter(self.normalized_shape, dtype, device_mesh, _ones)
            if bias:
                self.bias = new_parameter(self.normalized_shape, dtype, device_mesh, _zeros)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class SiLU(Module):
    def __init__(self, inplace=False, device_mesh=None, dtype=None):
        super().__init__()

    def forward(self, input):
        return F.silu(input)


class ReLU(Module):
    def __init__(self, inplace=False, device_mesh=None, dtype=None):
        super().__init__()

    def forward(self, input):
        return F.relu(input)


class GELU(Module):
    """GELU, exact (erf) or approximate="tanh"."""

    def __init__(self, approximate="none", device_mesh=None, dtype=None):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Dropout(Module):
    """Dropout at inference: the identity (DTorch runs no training); ``p`` is kept for the repr."""

    def __init__(self, p=0.5, inplace=False, device_mesh=None, dtype=None):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, input):
        return input

    def extra_repr(self):
        return f"p={self.p}, inplace=False"


class Identity(Module):
    def __init__(self, *args, device_mesh=None, dtype=None, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


def _pair(v):
    return (int(v), int(v)) if isinstance(v, numbers.Integral) else tuple(int(i) for i in v)


class Conv2d(Module):
    """A 2-D convolution: weight (out_channels, in_channels / groups, kH, kW) and bias
    (out_channels,), torch's kaiming-uniform init (bounds 1 / sqrt(fan_in)). padding_mode "zeros",
    "reflect" or "replicate" (the input padded first, as torch does)."""

    _PADDING_MODES = ("zeros", "reflect", "replicate", "circular")

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device_mesh=None, dtype=None):
        super().__init__()
        if not isinstance(groups, numbers.Integral) or groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode not in self._PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {list(self._PADDING_MODES)}, but got "
                             f"padding_mode='{padding_mode}'")
        if padding_mode == "circular":
            raise NotImplementedError("Conv2d: padding_mode='circular' is not supported")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride, self.dilation = _pair(kernel_size), _pair(stride), _pair(dilation)
        self.groups, self.padding_mode = int(groups), padding_mode
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string '{padding}', should be one of {{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _pair(padding)
        # F.pad's (left, right, top, bottom) for a padding_mode other than zeros
        if self.padding == "valid":
            self._reversed_padding_repeated_twice = (0, 0, 0, 0)
        elif self.padding == "same":
            pads = []
            for d, k in zip(reversed(self.dilation), reversed(self.kernel_size)):
                total = d * (k - 1)
                pads += [total // 2, total - total // 2]
            self._reversed_padding_repeated_twice = tuple(pads)
        else:
            self._reversed_padding_repeated_twice = (self.padding[1], self.padding[1], self.padding[0],
                                                     self.padding[0])
        fan_in = self.in_channels // self.groups * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        self.weight = new_parameter((self.out_channels, self.in_channels // self.groups) + self.kernel_size, dtype,
                                    device_mesh, _uniform(bound))
        if bias:
            self.bias = new_parameter((self.out_channels,), dtype, device_mesh, _uniform(bound))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(input, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class GroupNorm(Module):
    """Group normalisation over num_groups groups of the num_channels channels; weight ones and
    bias zeros (num_channels,) when affine."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device_mesh=None, dtype=None):
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps, self.affine = int(num_groups), int(num_channels), eps, affine
        if affine:
            self.weight = new_parameter((self.num_channels,), dtype, device_mesh, _ones)
            self.bias = new_parameter((self.num_channels,), dtype, device_mesh, _zeros)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class Upsample(Module):
    """F.interpolate as a layer: to size, or by scale_factor, in mode nearest, nearest-exact,
    linear or bilinear."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                 device_mesh=None, dtype=None):
        super().__init__()
        self.size = size
        self.scale_factor = float(scale_factor) if isinstance(scale_factor, numbers.Real) else \
            (tuple(float(s) for s in scale_factor) if scale_factor is not None else None)
        self.mode, self.align_corners, self.recompute_scale_factor = mode, align_corners, recompute_scale_factor

    def forward(self, input):
        return F.interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                             recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self):
        info = f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None else f"size={self.size!r}"
        return info + f", mode={self.mode!r}"
