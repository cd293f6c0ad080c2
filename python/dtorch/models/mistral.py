"""Mistral (Jiang et al. 2023): Llama's layers with sliding-window attention, each layer seeing only
the last ``sliding_window`` positions (its keys beyond them hidden by the mask, as transformers'
sliding_window_causal_mask hides them). It runs on Llama's module code (llama.py); this file holds
what differs, the config: transformers' MistralConfig fields and defaults, its model_type and
architecture. Its projections have no biases (transformers' Mistral has no attention_bias or
mlp_bias field)."""
import dataclasses
from typing import ClassVar, Optional

from .llama import LlamaConfig, LlamaForCausalLM


@dataclasses.dataclass
class MistralConfig(LlamaConfig):
    """transformers' MistralConfig: every layer slides when ``sliding_window`` is set (null: none
    does)."""

    model_type: ClassVar[str] = "mistral"
    architecture: ClassVar[str] = "MistralForCausalLM"
    _absent: ClassVar[dict] = dict(attention_bias=False, mlp_bias=False, layer_types=None)

    intermediate_size: int = 14336
    num_key_value_heads: Optional[int] = 8
    max_position_embeddings: int = 4096 * 32
    sliding_window: Optional[int] = 4096


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral with its language-model head: LlamaForCausalLM's code, read with a MistralConfig."""

    config_class = MistralConfig
