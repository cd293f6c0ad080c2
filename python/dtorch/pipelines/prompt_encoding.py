"""A diffusers pipeline directory's model_index.json, and the text encoders and tokenizers it names.

model_index.json maps each component to ``[library, class name]`` (``[null, null]`` for one the
pipeline was saved without). Loading checks every class name against what DTorch runs for that
component and refuses another by name; a component that is named but whose folder is missing is an
error naming the folder. ``image_encoder`` and ``feature_extractor`` (IP-Adapter inputs, which the
text-to-image pipelines do not use) are not loaded.

The text encoders run on a mesh of their own (``text_encoder_mesh``); by default that is one device,
the first of the transformer's mesh, which is where diffusers keeps them (the pipeline's device).
Their outputs reach the transformer's mesh worker to worker (``DTensor.redistribute`` across meshes),
replicated there."""
import json
import os

from .._mesh import DeviceMesh
from .._placement import Replicate
from .._tensor import DTensor
from .._safetensors import CheckpointError

MODEL_INDEX = "model_index.json"
# components a text-to-image pipeline may carry and DTorch ignores
IGNORED = ("image_encoder", "feature_extractor")
CLIP_TOKENIZERS = ("CLIPTokenizer", "CLIPTokenizerFast")
T5_TOKENIZERS = ("T5Tokenizer", "T5TokenizerFast")


def read_model_index(path, pipeline, components):
    """``path``'s model_index.json as {component: class name or None}, checked: ``components`` maps
    each name the pipeline knows to the class names it accepts, and ``required`` ones must be there.
    A name the pipeline does not know (other than IGNORED) with a class is refused. A directory
    without model_index.json is read as transformer/, vae/ and scheduler/ alone (no text encoders)."""
    file = os.path.join(os.fspath(path), MODEL_INDEX)
    if not os.path.isdir(os.fspath(path)):
        raise FileNotFoundError(f"{pipeline}.from_pretrained: {path}: no such pipeline directory")
    if not os.path.exists(file):   # as DTorch's pipelines were first saved: the three folders alone
        return {"transformer": None, "vae": None, "scheduler": None}
    try:
        with open(file, encoding="utf-8") as f:
            index = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: not JSON: {e}") from None
    if not isinstance(index, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(index).__name__}")
    found = {}
    for name, entry in index.items():
        if name.startswith("_") or name in IGNORED:
            continue
        if entry is None or (isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[1] is None):
            found[name] = None
            continue
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], str)):
            raise CheckpointError(f"{file}: {name!r} must be [library, class name], got {entry!r}")
        if name not in components:
            raise ValueError(f"{pipeline}.from_pretrained: {file} names a component {name!r} ({entry[1]}) that "
                             f"{pipeline} does not have (it has {', '.join(components)})")
        if entry[1] not in components[name]:
            raise ValueError(f"{pipeline}.from_pretrained: {file}: {name} is a {entry[1]}, which DTorch cannot "
                             f"load there (it loads {' or '.join(components[name])})")
        found[name] = entry[1]
    for name in ("transformer", "vae", "scheduler"):
        if name not in found or found[name] is None:
            raise ValueError(f"{pipeline}.from_pretrained: {file} names no {name}, which the pipeline needs")
    for name, cls in found.items():
        if cls is not None and not os.path.isdir(os.path.join(os.fspath(path), name)):
            raise FileNotFoundError(f"{pipeline}.from_pretrained: model_index.json names a {cls} as {name!r}, "
                                    f"but the folder {os.path.join(os.fspath(path), name)} is missing")
    return found


def encoder_mesh(transformer_mesh, text_encoder_mesh):
    """The text encoders' mesh: as given, else the transformer mesh's first device alone."""
    if text_encoder_mesh is not None:
        if not isinstance(text_encoder_mesh, DeviceMesh):
            raise TypeError(f"text_encoder_mesh must be a DeviceMesh, got {type(text_encoder_mesh).__name__}")
        return text_encoder_mesh
    return DeviceMesh(transformer_mesh.device_type, [int(transformer_mesh.mesh.ravel()[0])])


def load_text_components(path, index, pairs, mesh, dtype, pipeline):
    """{name: model or tokenizer or None} for each (encoder, tokenizer) pair of ``pairs``: both
    loaded, or both None when model_index.json has neither. One without the other is an error."""
    from ..models.tokenization import AutoTokenizer
    from .. import models
    for encoder, tokenizer in pairs:     # all checked before anything loads
        if (index.get(encoder) is None) != (index.get(tokenizer) is None):
            have, lack = (encoder, tokenizer) if index.get(encoder) is not None else (tokenizer, encoder)
            raise ValueError(f"{pipeline}.from_pretrained: {path} has a {have} but no {lack}: a text encoder "
                             "needs its tokenizer")
    out = {}
    for encoder, tokenizer in pairs:
        cls = index.get(encoder)
        if cls is None:
            out[encoder] = out[tokenizer] = None
            continue
        out[tokenizer] = AutoTokenizer.from_pretrained(path, subfolder=tokenizer)
        out[encoder] = getattr(models, cls).from_pretrained(path, subfolder=encoder, device_mesh=mesh, dtype=dtype)
    return out


def as_list(prompt, name):
    """A prompt argument as a list of strings (a string is a batch of one)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, (list, tuple)) and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    raise TypeError(f"{name} must be a string or a list of strings, got {type(prompt).__name__}")


def token_ids(tokenizer, prompts, max_length):
    """transformers' call as diffusers makes it: padded to ``max_length``, truncated to it."""
    return tokenizer(prompts, padding="max_length", max_length=max_length, truncation=True,
                     return_tensors="np")["input_ids"]


def to_mesh(x, mesh):
    """A DTensor moved onto ``mesh`` (replicated there) worker to worker, or left where it is."""
    return x if x.device_mesh == mesh else x.redistribute(mesh, [Replicate()] * mesh.ndim)


def check_sequence_length(max_sequence_length, default):
    if max_sequence_length is None:
        return default
    if type(max_sequence_length) is not int or not 0 < max_sequence_length <= 512:
        raise ValueError(f"max_sequence_length must be an int in 1..512, got {max_sequence_length!r}")
    return max_sequence_length

