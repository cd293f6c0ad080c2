"""dtorch.models: models with HF transformers' module trees, parameter names and checkpoints."""
from .generation import GenerationMixin, StaticCache
from .llama import CausalLMOutputWithPast, LlamaConfig, LlamaForCausalLM, LlamaModel
from .llama_parallel import parallelize_llama

__all__ = ["CausalLMOutputWithPast", "GenerationMixin", "LlamaConfig", "LlamaForCausalLM", "LlamaModel",
           "StaticCache", "parallelize_llama", "ContinuousBatcher", "Request"]
from .serving import ContinuousBatcher, Request
from .transformer_flux import FluxTransformer2DModel

__all__ += ["FluxTransformer2DModel"]
