"""Matrix products, linear layers, embeddings and attention with torch's names and signatures.
Each is a thin call into the C op registry (ops/op_matmul.c), which checks shapes and dtypes,
chooses placements (PyTorch's einsum sharding rules) and sends each device its part."""
import numbers

from . import _C
from ._ops import ids


def matmul(input, other):
    """Matrix product with torch.matmul's rules: 1-D operands are promoted to matrices and the
    added dim removed again, batch dims broadcast."""
    return _C._op(ids["matmul"], (input, other), None, None, None)


def mm(input, mat2):
    """Product of two matrices, (n, m) @ (m, p) -> (n, p)."""
    return _C._op(ids["mm"], (input, mat2), None, None, None)


def bmm(input, mat2):
    """Batched product of two 3-D tensors, (b, n, m) @ (b, m, p) -> (b, n, p) (no broadcasting)."""
    return _C._op(ids["bmm"], (input, mat2), None, None, None)


def linear(input, weight, bias=None):
    """input @ weight.T + bias, with weight (out_features, in_features) and bias (out_features,)."""
    tensors = (input, weight) if bias is None else (input, weight, bias)
    return _C._op(ids["linear"], tensors, None, None, None)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """Rows of weight (num_embeddings, embedding_dim) picked by the integer indices in input.
    padding_idx, scale_grad_by_freq and sparse only matter to gradients and are checked, not used.
    An index outside [0, num_embeddings) fails on the devices; the error surfaces when the value
    is fetched."""
    if padding_idx is not None:
        if not isinstance(padding_idx, numbers.Integral) or isinstance(padding_idx, bool):
            raise TypeError(f"embedding: padding_idx must be an int, got {type(padding_idx).__name__}")
        rows = weight.shape[0] if isinstance(weight, _C.DTensor) and weight.ndim >= 1 else 0
        if padding_idx > 0 and padding_idx >= rows:
            raise AssertionError("Padding_idx must be within num_embeddings")
        if padding_idx < 0 and padding_idx < -rows:
            raise AssertionError("Padding_idx must be within num_embeddings")
    if max_norm is not None:
        raise NotImplementedError("embedding: max_norm (renormalising rows in place) is not supported")
    return _C._op(ids["embedding"], (input, weight), None, None, None)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(query @ key^T * scale + mask) @ value, computed in float32 with a numerically
    stable softmax; query (..., L, E), key (..., S, E), value (..., S, Ev). attn_mask: bool (True
    takes part) or float (added), broadcast to (..., L, S). is_causal hides keys after each query
    (top-left aligned). enable_gqa lets key and value have fewer heads (dim -3) than query, each
    serving a group of query heads. A query row that sees no key gives zeros."""
    name = "scaled_dot_product_attention"
    if dropout_p != 0.0:
        raise NotImplementedError(f"{name}: dropout_p={dropout_p!r} is not supported (only 0.0)")
    inputs = (query, key, value)
    if attn_mask is not None:
        inputs += (attn_mask,)
    ints = (int(bool(is_causal)), int(bool(enable_gqa)), int(scale is not None))
    return _C._op(ids[name], inputs, ints, None if scale is None else (scale,), None)


__all__ = ["bmm", "embedding", "linear", "matmul", "mm", "scaled_dot_product_attention"]
