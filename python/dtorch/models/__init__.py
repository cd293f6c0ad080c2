"""dtorch.models: models with HF transformers' and diffusers' module trees, parameter names and
checkpoints, each single-device code laid out over a mesh by its family's parallelize function."""
from .auto import MODEL_FOR_CAUSAL_LM, AutoConfig, AutoModelForCausalLM
from .autoencoder_kl import AutoencoderKL, DiagonalGaussianDistribution
from .cache_utils import RingStaticCache, StaticCache
from .clip import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
from .diffusion_parallel import parallelize_flux, parallelize_sd3, parallelize_vae
from .generation import GenerationMixin
from .generation_config import GenerationConfig
from .llama import CausalLMOutputWithPast, LlamaConfig, LlamaForCausalLM, LlamaModel
from .llama_parallel import parallelize_llama
from .mistral import MistralConfig, MistralForCausalLM
from .modeling_diffusers import AutoencoderKLOutput, DecoderOutput, Transformer2DModelOutput
from .qwen2 import Qwen2Config, Qwen2ForCausalLM
from .t5 import T5Config, T5EncoderModel
from .text_encoder import BaseModelOutput, BaseModelOutputWithPooling, CLIPTextModelOutput
from .text_encoder_parallel import parallelize_text_encoder
from .tokenization import AutoTokenizer, BatchEncoding, IncrementalDetokenizer, PreTrainedTokenizer
from .transformer_flux import FluxTransformer2DModel
from .transformer_sd3 import SD3Transformer2DModel
from ..serving import ContinuousBatcher, Request   # where they lived first: dtorch.models keeps the names

__all__ = ["AutoConfig", "AutoModelForCausalLM", "AutoTokenizer", "AutoencoderKL", "AutoencoderKLOutput",
           "BaseModelOutput", "BaseModelOutputWithPooling", "BatchEncoding", "CLIPTextConfig", "CLIPTextModel",
           "CLIPTextModelOutput", "CLIPTextModelWithProjection", "CausalLMOutputWithPast", "ContinuousBatcher",
           "DecoderOutput", "DiagonalGaussianDistribution", "FluxTransformer2DModel", "GenerationConfig",
           "GenerationMixin", "IncrementalDetokenizer", "LlamaConfig", "LlamaForCausalLM", "LlamaModel",
           "MODEL_FOR_CAUSAL_LM", "MistralConfig", "MistralForCausalLM", "PreTrainedTokenizer", "Qwen2Config",
           "Qwen2ForCausalLM", "Request", "RingStaticCache", "SD3Transformer2DModel", "StaticCache", "T5Config",
           "T5EncoderModel", "Transformer2DModelOutput", "parallelize_flux", "parallelize_llama", "parallelize_sd3",
           "parallelize_text_encoder", "parallelize_vae"]
