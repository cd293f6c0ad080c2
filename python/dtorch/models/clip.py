"""CLIP's text encoder (Radford et al. 2021), as Stable Diffusion 3 and FLUX use it to turn a prompt
into token states and a pooled vector: token and position embeddings, pre-LayerNorm transformer
layers under a causal mask (and'ed with the padding mask), a final LayerNorm, and the state at each
row's end-of-text token. CLIPTextModelWithProjection projects that pooled state (no bias).

Module tree, parameter names and semantics are those of transformers 5.25's ``modeling_clip.py``:
CLIPTextModel holds ``embeddings``, ``encoder`` and ``final_layer_norm`` itself, and
CLIPTextModelWithProjection holds a CLIPTextModel as ``text_model`` beside ``text_projection``, so
``state_dict()`` keys equal what transformers writes. Checkpoints written by older transformers
prefix CLIPTextModel's keys with ``text_model.`` (every diffusers pipeline's ``text_encoder`` of that
class): they load too. Single-device code: text_encoder_parallel.py lays it out over a mesh.
Shapes in comments: B batch, L tokens, H heads, Dh head_dim, D hidden size.
"""
from .. import _dtype
from .._factory import arange
from .._ops_matmul import matmul
from ..nn import functional as F
from ..nn.containers import ModuleList
from ..nn.layers import GELU, Embedding, LayerNorm, Linear, ReLU, SiLU
from ..nn.module import Module
from .config_fields import count, number, optional, text
from .llama import _on_mesh_like, key_mask_from
from .text_encoder import (BaseModelOutputWithPooling, CLIPTextModelOutput, PreTrainedTextEncoder, TextEncoderConfig,
                           add_alias)


class QuickGELU(Module):
    """x * sigmoid(1.702 x): CLIP's own approximation of GELU (``quick_gelu``)."""

    def forward(self, x):
        return x * F.sigmoid(x * 1.702)


ACTIVATIONS = {"quick_gelu": QuickGELU, "gelu": GELU, "gelu_new": lambda: GELU("tanh"),
               "gelu_pytorch_tanh": lambda: GELU("tanh"), "relu": ReLU, "silu": SiLU}
_TOKEN = optional(count(-(1 << 63)))


class CLIPTextConfig(TextEncoderConfig):
    """transformers' CLIPTextConfig fields and defaults. A full CLIPConfig (model_type "clip") gives
    its ``text_config``. ``eos_token_id`` 2 is the legacy value: the pooled state is then at the
    largest id of each row (the end-of-text token was the vocabulary's last), as transformers keeps."""

    model_types = ("clip_text_model", "clip")
    defaults = dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, projection_dim=512,
                    num_hidden_layers=12, num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu",
                    layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=49406, eos_token_id=49407)
    kinds = dict(vocab_size=count(), hidden_size=count(), intermediate_size=count(), projection_dim=count(),
                 num_hidden_layers=count(0), num_attention_heads=count(), max_position_embeddings=count(),
                 hidden_act=text, layer_norm_eps=number(low=0), pad_token_id=_TOKEN, bos_token_id=_TOKEN,
                 eos_token_id=_TOKEN)

    @classmethod
    def _unwrap(cls, raw):
        if raw.get("model_type") == "clip" and isinstance(raw.get("text_config"), dict):
            return dict(raw["text_config"], model_type="clip_text_model")
        return raw

    def _derive(self):
        owner = type(self).__name__
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{owner}: hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"{owner}: hidden_act {self.hidden_act!r} is not supported (supported: "
                             f"{', '.join(ACTIVATIONS)})")


class CLIPTextEmbeddings(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        D = config.hidden_size
        self.token_embedding = Embedding(config.vocab_size, D, device_mesh=device_mesh, dtype=dtype)
        self.position_embedding = Embedding(config.max_position_embeddings, D, device_mesh=device_mesh, dtype=dtype)

    def forward(self, input_ids):                                              # (B, L)
        L = input_ids.shape[1]
        if L > self.position_embedding.num_embeddings:
            raise ValueError(f"Sequence length must be less than max_position_embeddings (got `sequence length`: {L} "
                             f"and max_position_embeddings: {self.position_embedding.num_embeddings}")
        positions = arange(L, device_mesh=input_ids.device_mesh).unsqueeze(0)  # (1, L)
        return self.token_embedding(input_ids) + self.position_embedding(positions)   # (B, L, D)


class CLIPAttention(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        D = config.hidden_size
        self.head_dim = D // config.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.k_proj = Linear(D, D, device_mesh=device_mesh, dtype=dtype)
        self.v_proj = Linear(D, D, device_mesh=device_mesh, dtype=dtype)
        self.q_proj = Linear(D, D, device_mesh=device_mesh, dtype=dtype)
        self.out_proj = Linear(D, D, device_mesh=device_mesh, dtype=dtype)

    def forward(self, x, mask):
        B, L, _ = x.shape                                                       # x: (B, L, D)
        q = self.q_proj(x).view(B, L, -1, self.head_dim).transpose(1, 2)       # (B, H, L, Dh)
        k = self.k_proj(x).view(B, L, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, L, -1, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale)
        return self.out_proj(o.transpose(1, 2).reshape(B, L, -1))              # (B, L, D)


class CLIPMLP(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.activation_fn = ACTIVATIONS[config.hidden_act]()
        self.fc1 = Linear(config.hidden_size, config.intermediate_size, device_mesh=device_mesh, dtype=dtype)
        self.fc2 = Linear(config.intermediate_size, config.hidden_size, device_mesh=device_mesh, dtype=dtype)

    def forward(self, x):
        return self.fc2(self.activation_fn(self.fc1(x)))


class CLIPEncoderLayer(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        D, eps = config.hidden_size, config.layer_norm_eps
        self.self_attn = CLIPAttention(config, device_mesh, dtype)
        self.layer_norm1 = LayerNorm(D, eps=eps, device_mesh=device_mesh, dtype=dtype)
        self.mlp = CLIPMLP(config, device_mesh, dtype)
        self.layer_norm2 = LayerNorm(D, eps=eps, device_mesh=device_mesh, dtype=dtype)

    def forward(self, h, mask):
        h = h + self.self_attn(self.layer_norm1(h), mask)
        return h + self.mlp(self.layer_norm2(h))


class CLIPEncoder(Module):
    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        self.layers = ModuleList([CLIPEncoderLayer(config, device_mesh, dtype)
                                  for _ in range(config.num_hidden_layers)])

    def forward(self, h, mask):
        """The last layer's output and every layer's (embeddings first)."""
        states = [h]
        for layer in self.layers:
            h = layer(h, mask)
            states.append(h)
        return h, tuple(states)


def causal_padding_mask(attention_mask, h):
    """The (B, 1, L, L) bool mask of the keys each query sees: the earlier positions that are tokens
    (None: plain causal attention, without padding). ``attention_mask``: host (B, L) or a DTensor."""
    if attention_mask is None:
        return None
    B, L, _ = h.shape
    mesh = h.device_mesh
    if not hasattr(attention_mask, "device_mesh"):
        attention_mask = PreTrainedTextEncoder._host_mask(attention_mask, (B, L))
    keys = key_mask_from(_on_mesh_like(attention_mask, h, mesh), L)            # (B, 1, 1, L)
    positions = arange(L, device_mesh=mesh)
    return (positions <= positions.unsqueeze(1)) & keys                        # (B, 1, L, L)


def eos_positions(input_ids, eos_token_id):
    """(B,) the position of each row's end-of-text token, as transformers picks it: the largest id
    where eos_token_id is the legacy 2, else the first position equal to eos_token_id (0 in a row
    without one)."""
    if eos_token_id == 2:
        return input_ids.argmax(dim=-1)
    return (input_ids == eos_token_id).to(_dtype.int32).argmax(dim=-1)


def take_positions(h, positions):
    """h (B, L, D) at one position per row (B,): a one-hot row times h, which copies the state
    exactly and keeps h's placements."""
    B, L, D = h.shape
    one_hot = (arange(L, device_mesh=positions.device_mesh) == positions.unsqueeze(1)).to(h.dtype)   # (B, L)
    return matmul(one_hot.unsqueeze(1), h).view(B, D)


class CLIPTextModel(PreTrainedTextEncoder):
    """CLIP's text transformer: ``model(input_ids, attention_mask=None, output_hidden_states=False)``
    -> ``.last_hidden_state`` (B, L, D, after final_layer_norm), ``.pooler_output`` (B, D), and
    ``.hidden_states`` when asked: the embeddings and every layer's output (the last one before
    final_layer_norm), as transformers returns them."""

    config_class = CLIPTextConfig

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        if not isinstance(config, CLIPTextConfig):
            config = CLIPTextConfig(config)
        self.config = config
        self.embeddings = CLIPTextEmbeddings(config, device_mesh, dtype)
        self.encoder = CLIPEncoder(config, device_mesh, dtype)
        self.final_layer_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps, device_mesh=device_mesh,
                                          dtype=dtype)
        self.eos_token_id = config.eos_token_id

    def input_embeddings(self):
        return self.embeddings.token_embedding

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        input_ids = self._ids(input_ids)
        h = self.embeddings(input_ids)                                         # (B, L, D)
        last, states = self.encoder(h, causal_padding_mask(attention_mask, h))
        last = self.final_layer_norm(last)
        pooled = take_positions(last, eos_positions(input_ids, self.eos_token_id))   # (B, D)
        return BaseModelOutputWithPooling(last, pooled, states if output_hidden_states else None)

    @classmethod
    def _adapt_checkpoint(cls, checkpoint):
        """Older transformers wrote CLIPTextModel's keys under ``text_model.``."""
        used = set()
        for key in list(checkpoint.keys()):
            if key.startswith("text_model.") and key[len("text_model."):] not in checkpoint:
                add_alias(checkpoint, key[len("text_model."):], key)
                used |= {key, key[len("text_model."):]}
        return used


class CLIPTextModelWithProjection(PreTrainedTextEncoder):
    """A CLIPTextModel (``text_model``) and ``text_projection`` of its pooled state:
    ``model(input_ids, attention_mask=None, output_hidden_states=False)`` -> ``.text_embeds``
    (B, projection_dim), ``.last_hidden_state`` and ``.hidden_states`` as CLIPTextModel's."""

    config_class = CLIPTextConfig

    def __init__(self, config, device_mesh=None, dtype=None):
        super().__init__()
        if not isinstance(config, CLIPTextConfig):
            config = CLIPTextConfig(config)
        self.config = config
        self.text_model = CLIPTextModel(config, device_mesh, dtype)
        self.text_projection = Linear(config.hidden_size, config.projection_dim, bias=False, device_mesh=device_mesh,
                                      dtype=dtype)

    def input_embeddings(self):
        return self.text_model.input_embeddings()

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        out = self.text_model(input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states)
        return CLIPTextModelOutput(self.text_projection(out.pooler_output), out.last_hidden_state, out.hidden_states)
