"""Qwen2 (Qwen Team 2024): Llama's layers with biases on the q, k and v projections (none on o_proj
or the MLP), and optionally a sliding window on the upper layers (``use_sliding_window``: layers
``max_window_layers`` and up see only the last ``sliding_window`` positions, or as ``layer_types``
says). It runs on Llama's module code (llama.py); this file holds what differs, the config:
transformers' Qwen2Config fields and defaults, its model_type and architecture."""
import dataclasses
from typing import ClassVar, Optional

from .config_fields import count, flag
from .llama import _CONFIG_KINDS, LlamaConfig, LlamaForCausalLM


@dataclasses.dataclass
class Qwen2Config(LlamaConfig):
    """transformers' Qwen2Config. As there, ``sliding_window`` is dropped (None) when
    ``use_sliding_window`` is off, and where ``layer_types`` is not given, the layers from
    ``max_window_layers`` on slide."""

    model_type: ClassVar[str] = "qwen2"
    architecture: ClassVar[str] = "Qwen2ForCausalLM"
    _kinds: ClassVar[dict] = dict(_CONFIG_KINDS, use_sliding_window=flag, max_window_layers=count(0))
    # transformers' Qwen2 modeling fixes the biases: q/k/v on, o_proj and the MLP off
    _absent: ClassVar[dict] = dict(attention_bias=False, mlp_bias=False)

    vocab_size: int = 151936
    intermediate_size: int = 22016
    num_key_value_heads: Optional[int] = 32
    max_position_embeddings: int = 32768
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[object] = None
    sliding_window: Optional[int] = 4096
    use_sliding_window: bool = False
    max_window_layers: int = 28

    @property
    def qkv_bias(self):
        return True

    @property
    def o_proj_bias(self):
        return False

    def _settle(self):
        if not self.use_sliding_window:
            self.sliding_window = None

    def _default_layer_type(self, i):
        return "sliding_attention" if self.sliding_window is not None and i >= self.max_window_layers \
            else "full_attention"


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 with its language-model head: LlamaForCausalLM's code, read with a Qwen2Config."""

    config_class = Qwen2Config
