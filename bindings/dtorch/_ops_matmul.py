"""Matrix products, linear layers, embeddings and attention with torch's names and signatures.
Each is a thin call into the C op registry (ops/op_matmul.c), which checks shapes and dtypes,
chooses placements (PyTorch's einsum sharding rules) and sends each device its part."""
import numbers

from . import _C
from ._tensor import DTensor


def _need(name, **tensors):
    for what, x in tensors.items():
        if not isinstance(x, DTensor):
            raise TypeError(f"{name}: expected {what} to be a DTensor, got {type(x).__name__} "
                            "(distribute arrays with dtorch.distribute_tensor first)")


def matmul(input, other):
    """Matrix product with torch.matmul's rules: 1-D operands are promoted to matrices and the
    added dim removed again, batch dims broadcast."""
    _need("matmul", input=input, other=other)
    return _C._op("matmul", (input, other), None, None, None)


def mm(input, mat2):
    """Product of two matrices, (n, m) @ (m, p) -> (n, p)."""
    _need("mm", input=input, mat2=mat2)
    return _C._op("mm", (input, mat2), None, None, None)


def bmm(input, mat2):
    """Batched product of two 3-D tensors, (b, n, m) @ (b, m, p) -> (b, n, p) (no broadcasting)."""
    _need("bmm", input=input, mat2=mat2)
    return _C._op("bmm", (input, mat2), None, None, None)


def linear(input, weight, bias=None):
    """input @ weight.T + bias, with weight (out_features, in_features) and bias (out_features,)."""
    _need("linear", input=input, weight=weight)
    if bias is None:
        return _C._op("linear", (input, weight), None, None, None)
    _need("linear", bias=bias)
    return _C._op("linear", (input, weight, bias), None, None, None)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """Rows of weight (num_embeddings, embedding_dim) picked by the integer indices in input.
    padding_idx, scale_grad_by_freq and sparse only matter to gradients and are checked, not used.
    An index outside [0, num_embeddings) fails on the devices; the error surfaces when the value
    is fetched."""
    _need("embedding", input=input, weight=weight)
    if padding_idx is not None:
        if not isinstance(padding_idx, numbers.Integral) or isinstance(padding_idx, bool):
            raise TypeError(f"embedding: padding_idx must be an int, got {type(padding_idx).__name__}")
        rows = weight.shape[0] if weight.ndim >= 1 else 0
        if padding_idx > 0 and padding_idx >= rows:
            raise AssertionError("Padding_idx must be within num_embeddings")
        if padding_idx < 0 and padding_idx < -rows:
            raise AssertionError("Padding_idx must be within num_embeddings")
    if max_norm is not None:
        raise NotImplementedError("embedding: max_norm (renormalising rows in place) is not supported")
    return _C._op("embedding", (input, weight), None, None, None)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(query @ key^T * scale + mask) @ value, computed in float32 with a numerically
    stable softmax; query (..., L, E), key (..., S, E), value (..., S, Ev). attn_mask: bool (True
    takes part) or float (added), broadcast to (..., L, S). is_causal hides keys after each query
    (top-left aligned). enable_gqa lets key and value have fewer heads (dim -3) than query, each
    serving a group of query heads. A query row that sees no key gives zeros."""
    name = "scaled_dot_product_attention"
    _need(name, query=query, key=key, value=value)
    if dropout_p != 0.0:
        raise NotImplementedError(f"{name}: dropout_p={dropout_p!r} is not supported (only 0.0)")
    inputs = (query, key, value)
    if attn_mask is not None:
        _need(name, attn_mask=attn_mask)
        inputs += (attn_mask,)
    ints = (int(bool(is_causal)), int(bool(enable_gqa)), int(scale is not None))
    floats = None
    if scale is not None:
        if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
            raise TypeError(f"{name}: scale must be a number or None, got {type(scale).__name__}")
        floats = (float(scale),)
    return _C._op(name, inputs, ints, floats, None)


def _install():
    """Methods and the @ operator on DTensor."""
    DTensor.matmul = matmul
    DTensor.mm = mm
    DTensor.bmm = bmm

    def rmatmul(self, other):
        _need("matmul", input=other)
        return matmul(other, self)

    DTensor.__matmul__ = matmul
    DTensor.__rmatmul__ = rmatmul


_install()

__all__ = ["bmm", "embedding", "linear", "matmul", "mm", "scaled_dot_product_attention"]
