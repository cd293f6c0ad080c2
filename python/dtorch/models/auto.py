"""The registry of causal language models (transformers' AutoModelForCausalLM, vLLM's model
registry): one table from config.json's architecture to the class that runs it. config.json's
``architectures`` decide (the first one listed that the table holds), its ``model_type`` where it
lists none; anything else is a ValueError naming it, never a run of another model's code."""
from .config_fields import listing, optional, text
from .llama import LlamaForCausalLM, read_config
from .mistral import MistralForCausalLM
from .qwen2 import Qwen2ForCausalLM

# config.json's architecture -> the class; the class's config_class reads the rest of the file
MODEL_FOR_CAUSAL_LM = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
}
_BY_MODEL_TYPE = {cls.config_class.model_type: name for name, cls in MODEL_FOR_CAUSAL_LM.items()}


def architecture_of(config, file="config.json"):
    """The architecture (a key of MODEL_FOR_CAUSAL_LM) of a config.json's values, by its
    ``architectures`` or else its ``model_type``; None when it gives neither. An architecture or
    model_type the table does not hold is a ValueError naming it."""
    architectures, model_type = config.get("architectures"), config.get("model_type")
    listing(text)(file, "architectures", [] if architectures is None else architectures)
    optional(text)(file, "model_type", model_type)
    supported = ", ".join(MODEL_FOR_CAUSAL_LM)
    if architectures:
        for name in architectures:
            if name in MODEL_FOR_CAUSAL_LM:
                return name
        raise ValueError(f"{file}: architecture {', '.join(map(repr, architectures))} is not supported "
                         f"(supported: {supported})")
    if model_type is not None:
        if model_type not in _BY_MODEL_TYPE:
            raise ValueError(f"{file}: model_type {model_type!r} is not supported (supported: {supported}; model "
                             f"types {', '.join(_BY_MODEL_TYPE)})")
        return _BY_MODEL_TYPE[model_type]
    return None


def check_architecture(config, file, architecture):
    """Refuses (ValueError) a config.json whose architecture is not ``architecture``: a class loads
    the checkpoints of its own architecture, or of none named. transformers would build the class
    asked for and warn (a Qwen2 checkpoint read as Llama then runs without its biases)."""
    found = architecture_of(config, file)
    if found is not None and found != architecture:
        model_type = MODEL_FOR_CAUSAL_LM[found].config_class.model_type
        raise ValueError(f"{file}: the checkpoint is a {found} (model_type {model_type!r}), not a {architecture}: "
                         f"load it with {found} or AutoModelForCausalLM")


def _class_of(path):
    config, file = read_config(path)
    found = architecture_of(config, file)
    if found is None:
        raise ValueError(f"{file}: the config names no architecture (no architectures nor model_type); load it with "
                         f"the class of its model ({', '.join(MODEL_FOR_CAUSAL_LM)})")
    return MODEL_FOR_CAUSAL_LM[found]


class AutoConfig:
    """The config class of a model directory's architecture (transformers' AutoConfig)."""

    def __init__(self):
        raise OSError("AutoConfig is made by AutoConfig.from_pretrained(path)")

    @classmethod
    def from_pretrained(cls, path):
        return _class_of(path).config_class.from_pretrained(path)


class AutoModelForCausalLM:
    """The causal language model of a directory, of the class its config.json's architecture names
    (``MODEL_FOR_CAUSAL_LM``)."""

    def __init__(self):
        raise OSError("AutoModelForCausalLM is made by AutoModelForCausalLM.from_pretrained(path, ...) or "
                      "from_config(config, ...)")

    @classmethod
    def from_pretrained(cls, path, device_mesh=None, dtype=None, quantization=None, **kwargs):
        """``<class>.from_pretrained(path, device_mesh, dtype, quantization, **kwargs)`` of the class of
        the checkpoint's architecture (see LlamaForCausalLM.from_pretrained for the arguments)."""
        return _class_of(path).from_pretrained(path, device_mesh=device_mesh, dtype=dtype, quantization=quantization,
                                               **kwargs)

    @classmethod
    def from_config(cls, config, device_mesh=None, dtype=None):
        """A model of ``config``'s architecture with uninitialized weights, on ``device_mesh``."""
        for model_cls in MODEL_FOR_CAUSAL_LM.values():
            if type(config) is model_cls.config_class:
                return model_cls(config, device_mesh=device_mesh, dtype=dtype)
        raise ValueError(f"AutoModelForCausalLM: no model takes a {type(config).__name__} "
                         f"(supported: {', '.join(MODEL_FOR_CAUSAL_LM)})")
