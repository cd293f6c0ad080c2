"""What the text encoders (clip.py: CLIPTextModel, CLIPTextModelWithProjection; t5.py: T5EncoderModel)
share: their config read from transformers' ``config.json``, ``from_pretrained`` / ``save_pretrained``
on transformers' safetensors format, the checks of the ids, and the output records transformers
returns. The models are single-device code; text_encoder_parallel.py lays them out over a mesh.
"""
import dataclasses
import json
import os
import warnings
from typing import Optional

import numpy as np

from .. import _dtype
from .._factory import distribute_tensor
from .._safetensors import Checkpoint, CheckpointError, load_checkpoint, read_json_object, save_checkpoint
from .._tensor import DTensor
from ..nn.module import Module, default_mesh, meta_device
from . import config_fields


class TextEncoderConfig(dict):
    """A text encoder's config: config.json's fields (those the model does not read kept as they
    are, for save_pretrained) over transformers' defaults, read as attributes too. A subclass names
    its ``model_types`` (config.json's ``model_type`` values it takes), ``defaults`` and ``kinds``
    (config_fields), checked when the config is made; ``_derive`` fills the fields transformers
    derives from others."""

    model_types = ()
    defaults = {}
    kinds = {}

    def __init__(self, values=None, **overrides):
        merged = dict(self.defaults)
        merged.update(values or {})
        merged.update(overrides)
        super().__init__(merged)
        config_fields.check(type(self).__name__, self, self.kinds)
        self._derive()

    def _derive(self):
        pass

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no {name!r}") from None

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        """The config of a model directory's config.json (``path``, or ``path/subfolder``). A missing
        directory or file is a CheckpointError (an OSError); a config of another model type a
        ValueError naming it."""
        directory = os.path.join(path, subfolder) if subfolder else path
        file = directory if os.path.isfile(directory) else os.path.join(directory, "config.json")
        raw = read_json_object(file)
        raw = cls._unwrap(raw)
        kind = raw.get("model_type")
        if kind is not None and kind not in cls.model_types:
            raise ValueError(f"{file}: model_type {kind!r} is not a {cls.__name__} (expected "
                             f"{' or '.join(map(repr, cls.model_types))})")
        try:
            return cls(raw)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{file}: bad config: {e}") from None

    @classmethod
    def _unwrap(cls, raw):
        return raw


@dataclasses.dataclass
class _Output:
    """transformers' ModelOutput manners: fields by name, or the ones that are set by index."""

    def __getitem__(self, key):
        if isinstance(key, str):
            return getattr(self, key)
        return self.to_tuple()[key]

    def to_tuple(self):
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None)


@dataclasses.dataclass
class BaseModelOutput(_Output):
    """``last_hidden_state`` (B, L, D); ``hidden_states``: (embeddings, every layer's output) when asked."""

    last_hidden_state: DTensor
    hidden_states: Optional[tuple] = None


@dataclasses.dataclass
class BaseModelOutputWithPooling(_Output):
    """CLIPTextModel's: beside the states, ``pooler_output`` (B, D), the state at each row's eos."""

    last_hidden_state: DTensor
    pooler_output: Optional[DTensor] = None
    hidden_states: Optional[tuple] = None


@dataclasses.dataclass
class CLIPTextModelOutput(_Output):
    """CLIPTextModelWithProjection's: ``text_embeds`` (B, projection_dim), the projected pooled state."""

    text_embeds: DTensor
    last_hidden_state: DTensor
    hidden_states: Optional[tuple] = None


def add_alias(checkpoint, key, stored):
    """Lets ``checkpoint`` answer for ``key`` with its tensor ``stored`` (a checkpoint spelling the
    model's parameter another way: older CLIP files prefix ``text_model.``, T5 files hold the tied
    embedding under one of its two names)."""
    f = checkpoint.file(stored)
    f.entries[key] = f.entries[stored]
    checkpoint._where[key] = checkpoint._where[stored]


class PreTrainedTextEncoder(Module):
    """Base of the text encoders: loading, saving, the ids' checks. A subclass names its
    ``config_class``, builds itself from the config as single-device code, and says which of its
    embeddings takes the ids (``input_embeddings``) and which keys are tied aliases (``tied_keys``:
    {alias: key}, written once, as transformers writes them)."""

    config_class = TextEncoderConfig
    tied_keys = {}

    def input_embeddings(self):
        raise NotImplementedError

    @property
    def device_mesh(self):
        """The mesh the model's weights live on (the ids go there)."""
        return self.input_embeddings().weight.device_mesh

    def _ids(self, input_ids):
        """input_ids as an int64 DTensor (B, L) on the model's mesh: host ids are checked (integers,
        2-D or one row, within the vocabulary), a DTensor is taken as it is."""
        if isinstance(input_ids, DTensor):
            if input_ids.ndim != 2:
                raise ValueError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
            return input_ids
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
            raise ValueError(f"input_ids must be integers of shape (batch, seq), got {ids.dtype} {ids.shape}")
        vocab = self.config.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            bad = ids[(ids < 0) | (ids >= vocab)][0]
            raise ValueError(f"input_ids: token id {int(bad)} is out of range for the vocabulary of {vocab}")
        return distribute_tensor(np.ascontiguousarray(ids, dtype=np.int64), self.device_mesh)

    @staticmethod
    def _host_mask(attention_mask, shape):
        """A host attention_mask as a bool array of the ids' shape (1: a token, 0: padding)."""
        mask = np.asarray(attention_mask)
        if mask.ndim == 1:
            mask = mask[None, :]
        if mask.shape != tuple(shape):
            raise ValueError(f"attention_mask must have the shape of input_ids {tuple(shape)}, got {mask.shape}")
        return mask != 0

    @classmethod
    def _adapt_checkpoint(cls, checkpoint):
        """Aliases for the keys a checkpoint spells differently (subclasses, by add_alias); the keys
        they used, each alias and the key it stands for (no unused weights)."""
        return set()

    @classmethod
    def from_pretrained(cls, path, device_mesh=None, dtype=None, subfolder=None, progress=None):
        """The model of a transformers directory (``path``, or ``path/subfolder`` as a diffusers
        pipeline keeps it: config.json and model.safetensors, single or sharded), laid out over
        ``device_mesh`` (mesh dims dp and tp; default one CPU device) by parallelize_text_encoder,
        each device reading only its slices of every tensor. ``dtype=None`` keeps the checkpoint's.
        A missing directory, config or weights file is an OSError."""
        from .text_encoder_parallel import parallelize_text_encoder
        directory = os.path.join(path, subfolder) if subfolder else path
        config = cls.config_class.from_pretrained(directory)
        checkpoint = Checkpoint(directory)
        aliases = cls._adapt_checkpoint(checkpoint)
        if dtype is None:
            dtype = checkpoint.floating_dtype()
        mesh = device_mesh if device_mesh is not None else default_mesh()
        with meta_device():
            model = cls(config, device_mesh=mesh, dtype=_dtype._resolve(dtype))
        parallelize_text_encoder(model, mesh)
        unused = load_checkpoint(model, checkpoint, progress=progress)
        unused = [k for k in unused if k not in aliases]
        if unused:
            warnings.warn(f"Some weights of the checkpoint at {directory} were not used: {unused}")
        return model.eval()

    def save_pretrained(self, save_directory, max_shard_size="5GB"):
        """Writes config.json (architectures, model_type and dtype set) and model.safetensors (or
        shards and an index past ``max_shard_size``) in the parameters' dtype, tied aliases once, as
        transformers writes them."""
        os.makedirs(save_directory, exist_ok=True)
        config = dict(self.config)
        config.update(architectures=[type(self).__name__],
                      dtype=self.input_embeddings().weight.dtype.name)
        config.setdefault("model_type", self.config_class.model_types[0])
        with open(os.path.join(save_directory, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        state = self.state_dict()
        for alias in self.tied_keys:
            state.pop(alias, None)
        save_checkpoint(state, save_directory, max_shard_size)
