"""dtorch.models: models with HF transformers' and diffusers' module trees, parameter names and
checkpoints."""
from .generation import GenerationMixin, StaticCache
from .llama import CausalLMOutputWithPast, LlamaConfig, LlamaForCausalLM, LlamaModel
from .llama_parallel import parallelize_llama
from .modeling_diffusers import DecoderOutput, Transformer2DModelOutput
from .serving import ContinuousBatcher, Request
from .transformer_flux import FluxTransformer2DModel
from .transformer_sd3 import SD3Transformer2DModel

__all__ = ["CausalLMOutputWithPast", "ContinuousBatcher", "DecoderOutput", "FluxTransformer2DModel", "GenerationMixin",
           "LlamaConfig", "LlamaForCausalLM", "LlamaModel", "Request", "SD3Transformer2DModel", "StaticCache",
           "Transformer2DModelOutput", "parallelize_llama"]
