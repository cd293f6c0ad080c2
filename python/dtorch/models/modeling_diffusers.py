"""What the diffusers-format models share: a config read from ``config.json`` (the arguments of
diffusers' ``__init__``, with its defaults for the ones a file leaves out), weights from
``diffusion_pytorch_model.safetensors`` (single or sharded), ``from_pretrained`` /
``from_config`` / ``save_pretrained``, and the output records diffusers returns."""
import dataclasses
import json
import os
import warnings

from .. import _dtype
from .._safetensors import (DIFFUSERS_WEIGHTS, Checkpoint, load_checkpoint, read_json_object,
                             save_checkpoint)
from ..nn.module import Module, default_mesh, meta_device
from . import config_fields


class FrozenConfig(dict):
    """A model's config: a dict that also reads as attributes (``config.num_layers``), as diffusers'
    FrozenDict; keys starting with "_" (``_class_name``, ``_diffusers_version``) are kept but are no
    arguments."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError("the config is frozen")


@dataclasses.dataclass
class Transformer2DModelOutput:
    """A diffusion transformer's prediction: SD3 (B, C, H, W), FLUX (B, N, C)."""
    sample: object


@dataclasses.dataclass
class DecoderOutput:
    """The VAE decoder's image (B, C, H, W)."""
    sample: object


@dataclasses.dataclass
class AutoencoderKLOutput:
    """The VAE encoder's posterior: a DiagonalGaussianDistribution over the latents."""
    latent_dist: object


def read_config(path, subfolder=None, name="config.json"):
    """The dict of the config file ``name`` in directory ``path`` (or ``path/subfolder``), or of the file."""
    directory = os.path.join(path, subfolder) if subfolder else path
    file = directory if os.path.isfile(directory) else os.path.join(directory, name)
    return read_json_object(file)


class DiffusersModel(Module):
    """Base class of the diffusers-format models. A subclass names its config arguments and their
    defaults (``config_defaults``, diffusers' ``__init__`` signature) and builds itself from
    ``self.config`` in ``__init__(config, device_mesh=None, dtype=None)`` as single-device code;
    ``parallelize(mesh)`` calls its family's parallelize function (diffusion_parallel.py), which
    lays it out from outside (the default: every parameter replicated over the mesh, as it is made).
    ``config_kinds``: each argument's kind (config_fields), checked before the model is built."""

    config_defaults = {}
    config_kinds = {}

    @classmethod
    def make_config(cls, config=None, **overrides):
        """The full config: the defaults, then ``config`` (a dict), then the keyword arguments. An
        argument the model does not know is a TypeError naming it."""
        merged = dict(cls.config_defaults)
        given = dict(config or {})
        given.update(overrides)
        for key, value in given.items():
            if key.startswith("_"):
                merged[key] = value
                continue
            if key not in cls.config_defaults:
                raise TypeError(f"{cls.__name__}: unknown config argument {key!r} (known: "
                                f"{', '.join(sorted(cls.config_defaults))})")
            merged[key] = value
        merged["_class_name"] = cls.__name__
        config_fields.check(cls.__name__, merged, cls.config_kinds)
        return FrozenConfig(merged)

    @classmethod
    def from_config(cls, config=None, device_mesh=None, dtype=None, **overrides):
        """A model of the config with freshly initialised weights (torch's initialisation of each
        layer), laid out over ``device_mesh``."""
        mesh = device_mesh if device_mesh is not None else default_mesh()
        model = cls(cls.make_config(config, **overrides), device_mesh=mesh, dtype=_dtype._resolve(dtype or "float32"))
        model.parallelize(mesh)
        return model.eval()

    @classmethod
    def from_pretrained(cls, path, subfolder=None, device_mesh=None, dtype=None, progress=None):
        """The model of a diffusers directory (``path``, or ``path/subfolder`` as a pipeline keeps it:
        config.json and diffusion_pytorch_model.safetensors, single or sharded), laid out over
        ``device_mesh`` (default one CPU device), each device reading only its slices of every
        tensor. ``dtype=None`` keeps the checkpoint's."""
        directory = os.path.join(path, subfolder) if subfolder else path
        config = cls.make_config(read_config(directory))
        checkpoint = Checkpoint(directory, weights_name=DIFFUSERS_WEIGHTS)
        if dtype is None:
            dtype = checkpoint.floating_dtype()
        mesh = device_mesh if device_mesh is not None else default_mesh()
        with meta_device():
            model = cls(config, device_mesh=mesh, dtype=_dtype._resolve(dtype))
        model.parallelize(mesh)
        unused = load_checkpoint(model, checkpoint, progress=progress)
        if unused:
            warnings.warn(f"Some weights of the checkpoint at {directory} were not used: {unused}")
        return model.eval()

    def parallelize(self, device_mesh):
        """Lays the model out over ``device_mesh`` by its dim names (subclasses); returns self."""
        return self

    @property
    def device_mesh(self):
        """The mesh the model's weights live on, where its inputs go."""
        return next(iter(self.parameters())).device_mesh

    def save_pretrained(self, save_directory, max_shard_size="10GB"):
        """Writes config.json and diffusion_pytorch_model.safetensors (or shards and an index past
        ``max_shard_size``) in the parameters' dtypes, as diffusers does."""
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, "config.json"), "w") as f:
            json.dump(dict(self.config), f, indent=2, sort_keys=True)
        save_checkpoint(self.state_dict(), save_directory, max_shard_size, weights_name=DIFFUSERS_WEIGHTS)
