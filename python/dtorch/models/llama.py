"""Llama (Touvron et al. 2023; Llama 2 and 3): a decoder-only transformer with RMSNorm before each
block, rotary position embeddings (RoPE), grouped-query attention and a SwiGLU feed-forward.

Module tree, parameter names and semantics are those of HF transformers' ``modeling_llama.py``, so
``state_dict()`` keys equal a checkpoint's. The architectures that differ from Llama by settings
only run on this code too: their config classes (mistral.py, qwen2.py) subclass LlamaConfig and
the layers read the settings (which projections have biases, the sliding window of each layer).
The file is single-device code: it holds no parallel logic. ``parallelize_llama``
(llama_parallel.py) lays the parameters out over a mesh from outside, and every op here follows
the placements its inputs have. Shapes in comments: B batch, L new tokens,
S key slots (L, or the cache's length), H query heads, Hkv key/value heads (as many as the k/v
projections give: a parallel style may widen them), D head_dim, E hidden size, V vocabulary.
"""
import dataclasses
import json
import math
import os
import warnings
from typing import ClassVar, Optional

import numpy as np

from .. import _dtype, _ops_view
from .._factory import arange, distribute_tensor, ones
from .._placement import Replicate
from .._safetensors import Checkpoint, CheckpointError, load_checkpoint, read_json_object, save_checkpoint
from .._tensor import DTensor
from ..nn import functional as F
from ..nn.layers import GELU, Embedding, Linear, ReLU, RMSNorm, SiLU
from ..nn.module import Module, default_mesh, meta_device
from ..nn.containers import ModuleList
from . import config_fields
from .config_fields import count, either, flag, listing, mapping, number, optional, text
from .cache_utils import StaticCache
from .generation import GenerationMixin
from .generation_config import load_generation_config

_ACTIVATIONS = {"silu": SiLU, "swish": SiLU, "relu": ReLU, "gelu": GELU,
                "gelu_pytorch_tanh": lambda: GELU("tanh"), "gelu_new": lambda: GELU("tanh")}
_TOKEN = optional(count(-(1 << 63)))   # token ids: any int (old files give pad_token_id -1)
_CONFIG_KINDS = dict(vocab_size=count(), hidden_size=count(), intermediate_size=count(), num_hidden_layers=count(),
                     num_attention_heads=count(), num_key_value_heads=optional(count()), head_dim=optional(count()),
                     hidden_act=text, max_position_embeddings=count(), rms_norm_eps=number(low=0),
                     rope_theta=number(above=0), rope_scaling=optional(mapping), attention_bias=flag, mlp_bias=flag,
                     tie_word_embeddings=flag, torch_dtype=optional(text), bos_token_id=_TOKEN,
                     eos_token_id=optional(either(count(-(1 << 63)), listing(count(-(1 << 63))))),
                     pad_token_id=_TOKEN, sliding_window=optional(count()), layer_types=optional(listing(text)))
LAYER_TYPES = ("full_attention", "sliding_attention")   # transformers' names of what a layer attends to
# what each rope_scaling type reads, beside its type
_ROPE_KINDS = {"default": {}, "linear": dict(factor=number(above=0)),
               "llama3": dict(factor=number(above=0), low_freq_factor=number(above=0),
                              high_freq_factor=number(above=0), original_max_position_embeddings=count())}
_DTYPE_NAMES = {"float32": _dtype.float32, "float16": _dtype.float16, "bfloat16": _dtype.bfloat16,
                "float": _dtype.float32, "half": _dtype.float16}


@dataclasses.dataclass
class LlamaConfig:
    """HF's LlamaConfig fields (config.json). Reads both spellings in the wild: older files with
    top-level ``rope_theta``, ``rope_scaling`` and ``torch_dtype``, newer ones with
    ``rope_parameters`` (holding rope_theta and the scaling) and ``dtype``.

    The base of the configs of every architecture that runs on Llama's module code (MistralConfig,
    Qwen2Config): the fields the layers read, with two that Llama itself does not have,
    ``sliding_window`` (each layer of type "sliding_attention" sees only that many last positions)
    and ``layer_types`` (per layer "full_attention" or "sliding_attention"; ``layer_type(i)`` derives
    it where none is given). A subclass names its ``model_type`` and ``architecture`` (config.json's
    keys), its own defaults, and in ``_absent`` the fields its transformers config lacks: a file's
    values for them are ignored, as transformers ignores them, and set by hand they are refused.
    ``qkv_bias`` and ``o_proj_bias`` say which attention projections have biases."""

    model_type: ClassVar[str] = "llama"
    architecture: ClassVar[str] = "LlamaForCausalLM"
    _kinds: ClassVar[dict] = _CONFIG_KINDS
    # fields transformers' LlamaConfig lacks, with the value its modeling code implies (None:
    # derived, for layer_types); a file's values are not read
    _absent: ClassVar[dict] = dict(sliding_window=None, layer_types=None)

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    torch_dtype: Optional[str] = None
    bos_token_id: Optional[int] = 1
    eos_token_id: Optional[object] = 2
    pad_token_id: Optional[int] = None
    sliding_window: Optional[int] = None
    layer_types: Optional[list] = None

    @property
    def qkv_bias(self):
        """Whether q_proj, k_proj and v_proj have biases (Llama: attention_bias)."""
        return self.attention_bias

    @property
    def o_proj_bias(self):
        return self.attention_bias

    def _default_layer_type(self, i):
        """Layer i's type where layer_types gives none: one for every layer, sliding when there is a
        window (Llama has none, Mistral's every layer slides)."""
        return "sliding_attention" if self.sliding_window is not None else "full_attention"

    def layer_type(self, i):
        """What layer i attends to: "full_attention" (every earlier position) or "sliding_attention"
        (the last ``sliding_window`` ones)."""
        return self.layer_types[i] if self.layer_types is not None else self._default_layer_type(i)

    def _settle(self):
        """Fields a subclass derives from others before the checks (Qwen2: no window when
        use_sliding_window is off)."""

    def __post_init__(self):
        owner = type(self).__name__
        config_fields.check(owner, dataclasses.asdict(self), self._kinds)
        self._settle()
        for name, value in self._absent.items():
            given = getattr(self, name)
            derived = name == "layer_types" and given is not None and len(given) == self.num_hidden_layers and all(
                t == self._default_layer_type(i) for i, t in enumerate(given))
            if given != value and not derived:
                raise ValueError(f"{owner}: {name} is not a setting of {self.model_type} models (transformers' {owner} "
                                 f"has no such field; {self.model_type}'s modeling code implies {value!r}), got "
                                 f"{given!r}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(f"{owner}: layer_types names {len(self.layer_types)} layer(s) but num_hidden_layers "
                                 f"is {self.num_hidden_layers}")
            for i, kind in enumerate(self.layer_types):
                if kind not in LAYER_TYPES:
                    raise ValueError(f"{owner}: layer_types[{i}] is {kind!r}; supported: {', '.join(LAYER_TYPES)}")
                if kind == "sliding_attention" and self.sliding_window is None:
                    raise ValueError(f"{owner}: layer_types[{i}] is sliding_attention but there is no sliding_window "
                                     "(null, or use_sliding_window is off)")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"{owner}: hidden_size {self.hidden_size} is not a multiple of "
                                 f"num_attention_heads {self.num_attention_heads}; give head_dim")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{owner}: num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{owner}: head_dim {self.head_dim} must be even for rotary embeddings")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"{owner}: hidden_act {self.hidden_act!r} is not supported "
                             f"(supported: {', '.join(_ACTIVATIONS)})")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if not isinstance(rope_type, str) or rope_type not in _ROPE_KINDS:
                raise ValueError(f"{owner}: rope_scaling type {rope_type!r} is not supported "
                                 "(supported: default, linear, llama3)")
            for key, kind in _ROPE_KINDS[rope_type].items():
                if key not in self.rope_scaling:
                    raise ValueError(f"{owner}: rope_scaling of type {rope_type!r} needs {key}")
                kind(owner, f"rope_scaling {key}", self.rope_scaling[key])
            if rope_type == "llama3" and self.rope_scaling["low_freq_factor"] == self.rope_scaling["high_freq_factor"]:
                raise ValueError(f"{owner}: rope_scaling's low_freq_factor and high_freq_factor must differ")

    @classmethod
    def from_dict(cls, d):
        """The config of config.json's fields (either spelling); fields that transformers' config of
        this architecture does not have are not read (``_absent``), nor any other unknown key."""
        d = dict(d)
        params = d.pop("rope_parameters", None)
        for name, value in (("rope_parameters", params), ("rope_scaling", d.get("rope_scaling"))):
            config_fields.optional(mapping)(cls.__name__, name, value)
        if params:
            params = dict(params)
            if "rope_theta" in params:   # the newer spelling wins where a file has both
                d["rope_theta"] = params.pop("rope_theta")
            if params.get("rope_type", params.get("type", "default")) != "default":
                d["rope_scaling"] = params
        if "dtype" in d:
            d.setdefault("torch_dtype", d.pop("dtype"))
        if d.get("rope_scaling") is not None and d["rope_scaling"].get(
                "rope_type", d["rope_scaling"].get("type")) == "default":
            d["rope_scaling"] = None
        names = {f.name for f in dataclasses.fields(cls)} - set(cls._absent)
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_pretrained(cls, path):
        """The config of a model directory's config.json (or of that file). A file of another
        architecture is a ValueError naming it (the registry, auto.py, says which ones run)."""
        from .auto import check_architecture
        config, file = read_config(path)
        check_architecture(config, file, cls.architecture)
        try:
            return cls.from_dict(config)
        except CheckpointError:
            raise
        except ValueError as e:
            raise CheckpointError(f"{file}: bad config: {e}") from None

    def to_dict(self):
        """config.json's fields: this architecture's (none of ``_absent``), its ``architectures`` and
        ``model_type``."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in self._absent}
        d.update(architectures=[self.architecture], model_type=self.model_type)
        return d

    def save_pretrained(self, directory):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)


def read_config(path):
    """(config.json of a model directory, or the file ``path``, as a dict; the file's path). A file
    that cannot be read or is no JSON object is a CheckpointError (an OSError) naming it."""
    file = path if os.path.isfile(path) else os.path.join(path, "config.json")
    return read_json_object(file), file


def rope_inv_freq(config):
    """RoPE's inverse frequencies (D/2,) in float32, as HF computes them: theta^(-2i/D), then the
    rope_scaling rule ("linear": divided by factor; "llama3": long wavelengths divided by factor,
    short ones kept, a smooth blend between)."""
    dim = config.head_dim
    inv_freq = (1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)))
    inv_freq = inv_freq.astype(np.float32)
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "linear":
        return (inv_freq / np.float32(scaling["factor"])).astype(np.float32)
    if rope_type == "llama3":
        factor = scaling["factor"]
        low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = (2 * math.pi / inv_freq).astype(np.float32)
        scaled = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq).astype(np.float32)
        smooth = ((old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq


class LlamaRotaryEmbedding(Module):
    """What rotating q and k needs: the positions and the inverse frequencies (placed once per
    mesh). They are derived from the config, so they are no buffers (HF's inv_freq is not in
    checkpoints either)."""

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.head_dim = config.head_dim
        self.inv_freq = rope_inv_freq(config)                                   # (D/2,) float32
        self._placed = {}

    def forward(self, x, position_ids, num_positions):
        """(position_ids (B|1, L), inv_freq (D/2,)) on x's mesh."""
        mesh = x.device_mesh
        if mesh not in self._placed:
            self._placed[mesh] = distribute_tensor(self.inv_freq, mesh)
        return position_ids, self._placed[mesh]


@dataclasses.dataclass
class AttentionInputs:
    """What attention needs besides q, k and v, built once per forward for every layer of a type
    (full or sliding attention):

    - ``mask``: the (L, S) or (B, 1, L, S) bool mask of scaled_dot_product_attention; None means
      plain causal attention.
    - ``query_index`` (B|1, L) and ``key_index`` (B|1, S): the position of each query row and each
      key slot (-1: padding or an empty cache slot), for attention that decides visibility by
      positions (Ring attention, whose sequence is laid out in any order); None otherwise.
    """

    mask: Optional[DTensor] = None
    query_index: Optional[DTensor] = None
    key_index: Optional[DTensor] = None


def sdpa_attention(q, k, v, inputs, scale):
    """softmax(q k^T * scale + mask) v: scaled_dot_product_attention over the keys, grouped-query
    heads shared. The default attention of every layer; context parallelism puts its own in the
    layer's ``attention`` slot (dtorch.parallel.context)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask, is_causal=inputs.mask is None, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def apply_rotary_pos_emb(x, rope):
    """x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1) and the angles
    position * inv_freq, as one fused op on x (B, H, L, D)."""
    position_ids, inv_freq = rope
    return F.rotary_embedding(x, position_ids, inv_freq)


class LlamaAttention(Module):
    def __init__(self, config, layer_idx, device_mesh=None, dtype=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = config.head_dim ** -0.5
        E, H, Hkv, D = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = config.qkv_bias                                                  # Llama: attention_bias; Qwen2: on
        self.q_proj = Linear(E, H * D, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.k_proj = Linear(E, Hkv * D, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.v_proj = Linear(E, Hkv * D, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.o_proj = Linear(H * D, E, bias=config.o_proj_bias, device_mesh=device_mesh, dtype=dtype)
        self.attention = sdpa_attention

    def forward(self, x, rope, attn, cache, start):
        B, L, _ = x.shape                                                       # x: (B, L, E)
        q = self.q_proj(x).view(B, L, -1, self.head_dim).transpose(1, 2)       # (B, H, L, D)
        k = self.k_proj(x).view(B, L, -1, self.head_dim).transpose(1, 2)       # (B, Hkv, L, D)
        v = self.v_proj(x).view(B, L, -1, self.head_dim).transpose(1, 2)       # (B, Hkv, L, D)
        q, k = apply_rotary_pos_emb(q, rope), apply_rotary_pos_emb(k, rope)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v, start)                   # (B, Hkv, S, D)
        o = self.attention(q, k, v, attn, self.scaling)                       # (B, H, L, D)
        return self.o_proj(o.transpose(1, 2).reshape(B, L, -1))                 # (B, L, E)


class LlamaMLP(Module):
    """down(act(gate(x)) * up(x)): SwiGLU with silu."""

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        E, I, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = Linear(E, I, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.up_proj = Linear(E, I, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.down_proj = Linear(I, E, bias=bias, device_mesh=device_mesh, dtype=dtype)
        self.act_fn = _ACTIVATIONS[config.hidden_act]()

    def forward(self, x):                                                      # (B, L, E)
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(Module):
    def __init__(self, config, layer_idx, device_mesh=None, dtype=None):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx, device_mesh, dtype)
        self.mlp = LlamaMLP(config, device_mesh, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, device_mesh=device_mesh,
                                       dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps,
                                                device_mesh=device_mesh, dtype=dtype)

    def forward(self, h, rope, attn, cache, start):                           # (B, L, E)
        h = h + self.self_attn(self.input_layernorm(h), rope, attn, cache, start)
        return h + self.mlp(self.post_attention_layernorm(h))


def _on_mesh_like(value, like, mesh, dtype=None):
    """A host array on ``mesh`` with the placements of ``like`` (the batch dim split alike)."""
    if value is None or isinstance(value, DTensor):
        return value
    array = np.asarray(value)
    if dtype is not None:
        array = array.astype(dtype)
    placements = [Replicate() if p.is_partial() else p for p in like.placements]
    return distribute_tensor(np.ascontiguousarray(array), mesh, placements)


def key_mask_from(attention_mask, slots):
    """attention_mask (B, K) (1: a token, 0: padding) as a bool (B, 1, 1, slots) mask of the key
    slots; slots past K count as tokens (they are hidden by causality until written)."""
    mask = attention_mask if attention_mask.dtype == _dtype.bool else attention_mask != 0
    B, K = mask.shape
    if K > slots:
        raise ValueError(f"attention_mask covers {K} positions but there are only {slots} key slots")
    if K < slots:
        mask = _ops_view.cat([mask, ones(B, slots - K, device_mesh=mask.device_mesh, placements=mask.placements,
                                         dtype=_dtype.bool)], dim=1)
    return mask.view(B, 1, 1, slots)


class LlamaModel(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, device_mesh=device_mesh, dtype=dtype)
        self.layers = ModuleList([LlamaDecoderLayer(config, i, device_mesh, dtype)
                                  for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, device_mesh=device_mesh, dtype=dtype)
        self.rotary_emb = LlamaRotaryEmbedding(config, device_mesh, dtype)
        self.layer_types = [config.layer_type(i) for i in range(config.num_hidden_layers)]
        # the window of the sliding layers (None when no layer slides)
        self.sliding_window = config.sliding_window if "sliding_attention" in self.layer_types else None
        self.attention_inputs = causal_attention_inputs   # a slot: context parallelism puts its own

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, cache_position=None):
        """``cache_position`` (L,) int64, HF's: the cache slots the new tokens go to (default: right
        after the filled ones), and their positions when ``position_ids`` is None. As a DTensor it
        is used on the devices only, so a captured decode step (dtorch.capture) takes the step's
        slot as an input."""
        B, L = input_ids.shape                                                 # input_ids: (B, L)
        cache = past_key_values
        start = cache.get_seq_length() if cache is not None else 0
        S = cache.max_cache_len if cache is not None else L
        if start + L > S and cache_position is None:   # slots given are checked below (host) or the caller's
            raise ValueError(f"the cache holds {S} positions: {start} are filled, {L} more do not fit")
        h = self.embed_tokens(input_ids)                                       # (B, L, E)
        mesh = h.device_mesh
        num_positions = start + L
        if cache_position is not None and not isinstance(cache_position, DTensor):
            cache_position = np.asarray(cache_position, dtype=np.int64)
            if cache_position.shape != (L,) or (L and (cache_position.min() < 0 or cache_position.max() >= S)):
                raise ValueError(f"cache_position must give {L} slot(s) in [0, {S}), got {cache_position.tolist()}")
            cache_position = distribute_tensor(cache_position, mesh)
        slots = start if cache_position is None else cache_position          # where the new keys go
        if position_ids is None:
            position_ids = (arange(start, start + L, device_mesh=mesh) if cache_position is None
                            else cache_position).unsqueeze(0)                  # (1, L)
        elif not isinstance(position_ids, DTensor):
            position_ids = np.asarray(position_ids)
            num_positions = max(num_positions, int(position_ids.max(initial=0)) + 1)
            position_ids = _on_mesh_like(position_ids, input_ids, mesh, np.int64)
        rope = self.rotary_emb(h, position_ids, num_positions)
        if attention_mask is not None:
            if not isinstance(attention_mask, DTensor):
                attention_mask = np.asarray(attention_mask) != 0
            attention_mask = _on_mesh_like(attention_mask, input_ids, mesh)    # (B, K) or (B|1, 1, L, S)
        # {layer type: what its attention needs besides q, k and v}
        attn = self.attention_inputs(attention_mask, position_ids, cache, slots, start, L, S, self.sliding_window)
        for layer, layer_type in zip(self.layers, self.layer_types):
            h = layer(h, rope, attn[layer_type], cache, slots)
        return self.norm(h)                                                    # (B, L, E)


def causal_attention_inputs(attention_mask, position_ids, cache, slots, start, L, S, sliding_window=None):
    """What sdpa_attention needs, once per forward, by layer type (transformers' causal_mask_mapping):
    {"full_attention": ..., "sliding_attention": ...}, the same inputs for both where there is no
    ``sliding_window`` (no layer slides) or it hides nothing.

    "full_attention": the (L, S) causal mask over the key slots, and'ed with the (B, 1, 1, S) mask of
    the real tokens when there is padding (None, plain causal attention, without cache or padding).
    "sliding_attention": the same, where moreover query slot i sees key slot j only if
    i - j < sliding_window (transformers' sliding_window_overlay: slots, not positions, so left
    padding counts); the full mask where the slots are too few for the window to hide any.
    A 4-D attention_mask (B|1, 1, L, S), as transformers takes one, is the whole mask of every layer,
    true where a query may attend a key slot, with no causal mask or window of its own (a caller that
    places tokens in the slots itself, such as continuous batching over a ring of slots, says which
    are whose). ``slots``: the first new slot ``start``, or the new slots (L,) as a DTensor. The
    default of LlamaModel's ``attention_inputs`` slot."""
    mesh = position_ids.device_mesh
    if attention_mask is not None and attention_mask.ndim == 4:
        if attention_mask.shape[1] != 1 or attention_mask.shape[2] != L or attention_mask.shape[3] != S:
            raise ValueError(f"a 4-D attention_mask must be (batch, 1, {L}, {S}) for {L} new token(s) over {S} key "
                             f"slots, got {tuple(attention_mask.shape)}")
        whole = AttentionInputs(mask=attention_mask if attention_mask.dtype == _dtype.bool else attention_mask != 0)
        return {"full_attention": whole, "sliding_attention": whole}
    key_mask = key_mask_from(attention_mask, S) if attention_mask is not None else None   # (B, 1, 1, S)
    if cache is not None:
        if key_mask is not None:
            cache.key_mask = key_mask
        key_mask = cache.key_mask
    windowed = sliding_window is not None and S > sliding_window    # else no slot is far enough to hide
    if cache is None and key_mask is None and not windowed:
        return {"full_attention": AttentionInputs(), "sliding_attention": AttentionInputs()}
    keys = arange(S, device_mesh=mesh)                                         # (S,)
    queries = (slots if isinstance(slots, DTensor) else arange(start, start + L, device_mesh=mesh)).unsqueeze(1)
    causal = keys <= queries                                                   # (L, S): causal over the slots
    full = AttentionInputs(mask=causal if key_mask is None else causal & key_mask)   # (B, 1, L, S)
    if not windowed:
        return {"full_attention": full, "sliding_attention": full}
    near = causal & (keys > queries - sliding_window)                         # (L, S): the last `window` slots
    return {"full_attention": full, "sliding_attention": AttentionInputs(mask=near if key_mask is None
                                                                          else near & key_mask)}


@dataclasses.dataclass
class CausalLMOutputWithPast:
    """What LlamaForCausalLM returns, as transformers: ``.logits`` (B, L, V), ``.past_key_values``."""

    logits: DTensor
    past_key_values: Optional[StaticCache] = None

    def __getitem__(self, key):
        if isinstance(key, str):
            return getattr(self, key)
        return tuple(v for v in (self.logits, self.past_key_values) if v is not None)[key]


class LlamaForCausalLM(GenerationMixin, Module):
    """Llama with its language-model head: logits over the vocabulary for every position. The class
    of every architecture that runs on Llama's module code: a subclass only names its config class
    (MistralForCausalLM, Qwen2ForCausalLM); the config's settings do the rest."""

    config_class = LlamaConfig

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, got "
                            f"{type(config).__name__}")
        self.config = config
        self.model = LlamaModel(config, device_mesh, dtype)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False, device_mesh=device_mesh, dtype=dtype)
        if config.tie_word_embeddings:
            self.tie_weights()

    def tie_weights(self):
        """lm_head shares the input embedding's weight (when the config ties them); on a pipeline,
        where they live on different stages, lm_head holds a copy on its own stage."""
        if self.config.tie_word_embeddings and isinstance(self.lm_head, Linear):
            weight, head = self.model.embed_tokens.weight, self.lm_head.weight
            if head is not None and head.device_mesh != weight.device_mesh:
                weight = weight.redistribute(head.device_mesh, head.placements)
            self.lm_head.weight = weight

    def _checked_ids(self, input_ids):
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
            raise ValueError(f"input_ids must be integers of shape (batch, seq), got {ids.dtype} {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.config.vocab_size)][0]
            raise ValueError(f"input_ids: token id {int(bad)} is out of range for the vocabulary of "
                             f"{self.config.vocab_size}")
        return ids.astype(np.int64)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                logits_to_keep=0, cache_position=None):
        """Logits (B, L, V) for input_ids (B, L): host ids (checked against the vocabulary) or a DTensor.
        attention_mask (B, K): 1 for tokens, 0 for (left) padding, over the cache's slots so far
        (K may run to the cache's length). past_key_values: a cache (StaticCache) to read and extend;
        use_cache=True without one makes one just big enough. logits_to_keep=n: only the last n.
        cache_position (L,): the cache slots of the new tokens (LlamaModel.forward)."""
        if not isinstance(input_ids, DTensor):
            input_ids = distribute_tensor(self._checked_ids(input_ids), self.model.embed_tokens.weight.device_mesh)
        if use_cache and past_key_values is None:
            past_key_values = self.cache_class(input_ids.shape[1])
        h = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=past_key_values, cache_position=cache_position)
        if logits_to_keep:
            h = h[:, -logits_to_keep:, :]
        return CausalLMOutputWithPast(self.lm_head(h), past_key_values)          # logits: (B, L, V)

    # ---- checkpoints -----------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path, device_mesh=None, dtype=None, quantization=None, progress=None,
                        num_microbatches=None, layers_per_stage=None, quantize_lm_head=False):
        """The model of an HF directory (config.json, model.safetensors or a sharded index), laid out
        over ``device_mesh`` (named dims dp, tp, pp, ulysses, ring; default one CPU device) by
        parallelize_llama, each device reading only its slices of every tensor. ``dtype=None`` keeps
        the checkpoint's; ``num_microbatches`` and ``layers_per_stage`` go to parallelize_llama.
        ``quantization="int8"`` or ``"int4"`` stores every Linear of the decoder layers quantized
        (dtorch.quantization: QuantizedLinear), and lm_head too with ``quantize_lm_head=True``; a
        checkpoint saved quantized loads as it was saved (its config.json's quantization_config), and
        a 4-bit symmetric GPTQ checkpoint (``quant_method: "gptq"`` in config.json's
        quantization_config or a quantize_config.json) loads into the int4 layout without
        requantizing (dtorch.gptq; ``quantization`` may then be None or "int4"; any other quantized
        format is a ValueError naming it); save_pretrained writes it in DTorch's int4 layout.
        config.json must be of this class's architecture (or name none): any other is a ValueError
        naming it (AutoModelForCausalLM picks the class by it)."""
        from .. import gptq
        from .. import quantization as quant
        from .llama_parallel import parallelize_llama
        bits = quant.bits_of(quantization)
        raw, file = read_config(path)
        gptq_config = gptq.read_config(path, raw, file)
        saved = 4 if gptq_config else quant.bits_of_config(raw.get("quantization_config"), file)
        if saved is not None and bits is not None and bits != saved:
            kind = "4-bit GPTQ (read as int4)" if gptq_config else f"int{saved}"
            raise ValueError(f"{file}: the checkpoint is quantized to {kind}; quantization={quantization!r} "
                             "cannot change that (load it with quantization=None)")
        config = cls.config_class.from_pretrained(path)
        checkpoint = Checkpoint(path, gptq.weights_name(path) if gptq_config else "model")
        if saved is not None:
            bits, quantize_lm_head = saved, "lm_head.qweight" in checkpoint
        if dtype is None:
            dtype = checkpoint.floating_dtype()
        mesh = device_mesh if device_mesh is not None else default_mesh()
        with meta_device():
            model = cls(config, device_mesh=mesh, dtype=_dtype._resolve(dtype))
            # a GPTQ checkpoint may leave Linears in float (modules_in_block_to_quantize): those it has a
            # qweight of are quantized
            only = (lambda name: f"{name}.qweight" in checkpoint) if gptq_config else None
            names = quant.quantize_modules(model, bits, quantize_lm_head, only) if bits else []
        parallelize_llama(model, mesh, num_microbatches=num_microbatches, layers_per_stage=layers_per_stage)
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        stored = {f"{n}.{p}" for n in names for p in ("qweight", "scale")}
        aliases = {"lm_head": "model.embed_tokens"} if config.tie_word_embeddings else {}
        if gptq_config:
            used = set(gptq.load(model, checkpoint, names, gptq_config))
        else:
            used = set(quant.load_quantized(model, checkpoint, names, bits, saved is not None, aliases))
        unused = load_checkpoint(model, checkpoint, skip=tied | stored, progress=progress)
        model.tie_weights()
        model.generation_config = load_generation_config(path)
        model.quantized_modules = tuple(names)
        model.quantization_config = quant.config_of(bits) if bits else None
        unused = [k for k in unused if k not in tied and k not in used and not k.endswith("rotary_emb.inv_freq")]
        if unused:
            warnings.warn(f"Some weights of the checkpoint at {path} were not used: {unused}")
        return model.eval()

    def save_pretrained(self, save_directory, max_shard_size="5GB"):
        """Writes config.json, generation_config.json (``generation_config``: the file it was
        loaded from, else the model config's generation fields, as transformers writes it) and the
        weights (model.safetensors, or shards with an index past max_shard_size), in the parameters'
        dtype; a tied lm_head is not written, as transformers. A quantized model writes its
        quantized layers as ``<name>.qweight`` (their bytes) and ``<name>.scale``, and
        ``quantization_config`` in config.json (dtorch.quantization)."""
        from .. import quantization as quant
        state = self.state_dict()
        names = getattr(self, "quantized_modules", ())
        if self.config.tie_word_embeddings and "lm_head" not in names:
            state.pop("lm_head.weight", None)
        if names:
            for key in [f"{n}.{p}" for n in names for p in ("qweight", "scale")]:
                state.pop(key)
            state.update(quant.stored_state(self, names, self.quantization_config["bits"]))
        config = dataclasses.replace(self.config, torch_dtype=self.model.embed_tokens.weight.dtype.name)
        config.save_pretrained(save_directory)
        self.generation_config.save_pretrained(save_directory)
        if names:
            file = os.path.join(save_directory, "config.json")
            with open(file) as f:
                written = json.load(f)
            written["quantization_config"] = self.quantization_config
            with open(file, "w") as f:
                json.dump(written, f, indent=2, sort_keys=True)
        save_checkpoint(state, save_directory, max_shard_size)
