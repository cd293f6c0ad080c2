"""dtorch.nn: the functional ops of neural networks (dtorch.nn.functional)."""
from . import functional

__all__ = ["functional"]
