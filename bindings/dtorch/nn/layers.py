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
