"""dtorch.nn: torch.nn's Module, layers and containers over DTensors (inference only), and the
functional ops of neural networks (dtorch.nn.functional)."""
from . import functional
from .containers import ModuleDict, ModuleList, Sequential
from .layers import GELU, Dropout, Embedding, Identity, LayerNorm, Linear, ReLU, RMSNorm, SiLU
from .module import MetaTensor, Module, RemovableHandle, meta_device

__all__ = ["Dropout", "Embedding", "GELU", "Identity", "LayerNorm", "Linear", "MetaTensor", "Module", "ModuleDict",
           "ModuleList", "RMSNorm", "ReLU", "RemovableHandle", "Sequential", "SiLU", "functional", "meta_device"]
