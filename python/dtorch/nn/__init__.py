"""dtorch.nn: torch.nn's Module, layers and containers over DTensors (inference only), and the
functional ops of neural networks (dtorch.nn.functional)."""
from . import functional
from .containers import ModuleDict, ModuleList, Sequential
from .layers import (GELU, Conv2d, Dropout, Embedding, GroupNorm, Identity, LayerNorm, Linear, ReLU, RMSNorm, SiLU,
                     Upsample)
from .module import MetaTensor, Module, RemovableHandle, meta_device

__all__ = ["Conv2d", "Dropout", "Embedding", "GELU", "GroupNorm", "Identity", "LayerNorm", "Linear", "MetaTensor",
           "Module", "ModuleDict", "ModuleList", "RMSNorm", "ReLU", "RemovableHandle", "Sequential", "SiLU", "Upsample",
           "functional", "meta_device"]
