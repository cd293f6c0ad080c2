"""Neural-network functions with torch.nn.functional's names and signatures."""
from .._ops import gelu, relu, sigmoid, silu, tanh

__all__ = ["gelu", "relu", "sigmoid", "silu", "tanh"]
