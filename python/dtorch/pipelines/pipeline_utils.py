"""What the text-to-image pipelines share: loading and saving a diffusers pipeline directory, the
starting noise, prompt embeddings onto the mesh, the VAE's decode and the image's postprocessing.

The transformer and the VAE each live on a mesh of their own choosing (``device_mesh`` and
``vae_mesh``: the VAE may sit on one device, a sub-mesh, or the transformer's devices, by default as
one ``height`` dim that splits the decoded image's rows); the latents cross from one to the other
once, after the last step."""
import dataclasses
import json
import os
import shutil
import struct
import zlib

import numpy as np

from .. import _dtype
from .._factory import distribute_tensor, randn
from .._mesh import DeviceMesh
from .._runtime import manual_seed
from .._tensor import DTensor
from .._ops_view import cat
from ..models.modeling_diffusers import read_config
from ..schedulers import FlowMatchEulerDiscreteScheduler
from .prompt_encoding import MODEL_INDEX, encoder_mesh, load_text_components, read_model_index, to_mesh


def rows_mesh(mesh):
    """The devices of ``mesh`` as one dim named ``height``: the VAE's default mesh, over which its
    decoder splits the image's rows (a batch of one image uses every device; dp would leave all but
    one idle)."""
    ids = np.asarray(mesh.mesh).ravel()
    if ids.size == 1:
        return mesh
    return DeviceMesh(mesh.device_type, ids.tolist(), mesh_dim_names=("height",))


@dataclasses.dataclass
class ImagePipelineOutput:
    """``images``: float32 (B, H, W, 3) in [0, 1] (``output_type="np"``), uint8 (``"uint8"``), or the
    final latents (``"latent"``)."""
    images: object


def postprocess(image, output_type="np"):
    """The VAE's output (B, 3, H, W) in [-1, 1] -> (B, H, W, 3) in [0, 1] (float32, or uint8)."""
    array = image.numpy() if isinstance(image, DTensor) else np.asarray(image)
    array = np.clip(array.astype(np.float32) / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1)
    if output_type == "uint8":
        return (array * 255).round().astype(np.uint8)
    return array


def save_png(image, path):
    """Writes one image (H, W, 3) (uint8, or float in [0, 1]) as an 8-bit RGB PNG."""
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"save_png: expected an (H, W, 3) image, got shape {array.shape}")
    height, width, _ = array.shape
    rows = b"".join(b"\x00" + array[y].tobytes() for y in range(height))  # filter type 0 on every row

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6))
                + chunk(b"IEND", b""))


class DiffusionPipeline:
    """What the pipelines share: loading the components of a diffusers pipeline directory
    (model_index.json; ``transformer/``, ``vae/``, ``scheduler/``, and the text encoders with their
    tokenizers where the directory has them), the latents' noise, and decoding."""

    transformer_class = None
    components = {}          # component name -> the class names model_index.json may give it
    text_pairs = ()          # (text encoder, its tokenizer) names, in the pipeline's order

    def __init__(self, transformer, scheduler, vae, **text_components):
        self.transformer, self.scheduler, self.vae = transformer, scheduler, vae
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
        names = [name for pair in self.text_pairs for name in pair]
        unknown = sorted(set(text_components) - set(names))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected component(s): {', '.join(unknown)}")
        for name in names:
            setattr(self, name, text_components.get(name))
        self._source = None      # the directory the text components were read from

    @classmethod
    def from_pretrained(cls, path, device_mesh=None, vae_mesh=None, text_encoder_mesh=None, dtype=None,
                        progress=None):
        """The pipeline of a diffusers directory: the transformer laid out over ``device_mesh`` (by its
        dim names: dp, tp, ulysses, ring), the VAE on ``vae_mesh`` (a dim named ``height`` there splits
        the decoded image's rows over its devices; default: the transformer's devices as one ``height``
        dim, so that the decode of even one image uses them all), the text encoders
        on ``text_encoder_mesh`` (by its dim names dp, tp; default: the first device of the
        transformer's mesh alone, where diffusers keeps them). A directory saved without text
        encoders (``[null, null]`` or no entry in model_index.json, or no model_index.json at all)
        loads without them: the pipeline then runs from prompt embeddings only."""
        from ..models.autoencoder_kl import AutoencoderKL
        name = cls.__name__
        index = read_model_index(path, name, cls.components)
        transformer = cls.transformer_class.from_pretrained(path, subfolder="transformer", device_mesh=device_mesh,
                                                             dtype=dtype, progress=progress)
        vae = AutoencoderKL.from_pretrained(path, subfolder="vae",
                                            device_mesh=vae_mesh or rows_mesh(transformer.device_mesh), dtype=dtype,
                                            progress=progress)
        scheduler = FlowMatchEulerDiscreteScheduler(**read_config(os.path.join(path, "scheduler",
                                                                               "scheduler_config.json")))
        text = load_text_components(path, index, cls.text_pairs,
                                    encoder_mesh(transformer.device_mesh, text_encoder_mesh), dtype, name)
        pipe = cls(transformer, scheduler, vae, **text)
        pipe._source = os.fspath(path)
        return pipe

    @property
    def has_text_encoders(self):
        return all(getattr(self, name) is not None for name in self.text_pairs[0])

    def save_pretrained(self, directory):
        """Writes the components in diffusers' layout (model_index.json and one folder each). Text
        encoders and tokenizers read by from_pretrained are copied from their folders as they were."""
        os.makedirs(directory, exist_ok=True)
        self.transformer.save_pretrained(os.path.join(directory, "transformer"))
        self.vae.save_pretrained(os.path.join(directory, "vae"))
        self.scheduler.save_pretrained(os.path.join(directory, "scheduler"))
        index = {"_class_name": type(self).__name__,
                 "transformer": ["diffusers", type(self.transformer).__name__],
                 "vae": ["diffusers", "AutoencoderKL"], "scheduler": ["diffusers", type(self.scheduler).__name__]}
        for name in (n for pair in self.text_pairs for n in pair):
            if getattr(self, name) is None:
                index[name] = [None, None]
                continue
            source = os.path.join(self._source, name) if self._source else None
            if source is None or not os.path.isdir(source):
                raise ValueError(f"{type(self).__name__}.save_pretrained: {name} was not read from a pipeline "
                                 "directory, and DTorch writes text encoders and tokenizers only by copying theirs")
            if os.path.abspath(source) != os.path.abspath(os.path.join(directory, name)):
                shutil.copytree(source, os.path.join(directory, name), dirs_exist_ok=True)
            with open(os.path.join(self._source, MODEL_INDEX), encoding="utf-8") as f:
                index[name] = json.load(f)[name]
        with open(os.path.join(directory, MODEL_INDEX), "w") as f:
            json.dump(index, f, indent=2)

    @property
    def mesh(self):
        return self.transformer.device_mesh

    def _latents(self, shape, latents, seed):
        """The starting noise: ``latents`` as given (numpy or DTensor), else N(0, 1) from ``seed``."""
        if latents is not None:
            if tuple(latents.shape) != tuple(shape):
                raise ValueError(f"{type(self).__name__}: latents must have shape {tuple(shape)}, got "
                                 f"{tuple(latents.shape)}")
            if isinstance(latents, DTensor):
                return latents.redistribute(self.mesh) if latents.device_mesh != self.mesh else latents
            return distribute_tensor(np.ascontiguousarray(latents, dtype=np.float32), self.mesh)
        if seed is not None:
            manual_seed(seed)
        return randn(*shape, device_mesh=self.mesh, dtype=_dtype.float32)

    def _host(self, x, name, ndim):
        if x is None:
            raise ValueError(f"{type(self).__name__}: {name} is required with prompt embeddings")
        if isinstance(x, DTensor):
            x = to_mesh(x, self.mesh)
        else:
            x = distribute_tensor(np.ascontiguousarray(x, dtype=np.float32), self.mesh)
        if x.ndim != ndim:
            raise ValueError(f"{type(self).__name__}: {name} must have {ndim} dims, got shape {tuple(x.shape)}")
        return x

    @staticmethod
    def _check_size(height, width, multiple):
        if height % multiple or width % multiple:
            raise ValueError(f"height and width must be multiples of {multiple}, got {height} x {width}")

    def _prompts(self, prompt_embeds, pooled_prompt_embeds, num_images_per_prompt, name="prompt_embeds",
                 pooled_name="pooled_prompt_embeds"):
        """The prompt's embeddings on the transformer's mesh, each row repeated per image."""
        prompt_embeds = self._host(prompt_embeds, name, 3)
        pooled_prompt_embeds = self._host(pooled_prompt_embeds, pooled_name, 2)
        if prompt_embeds.shape[0] != pooled_prompt_embeds.shape[0]:
            raise ValueError(f"{type(self).__name__}: {name} has {prompt_embeds.shape[0]} rows and {pooled_name} "
                             f"{pooled_prompt_embeds.shape[0]}: they must match")
        if num_images_per_prompt > 1:
            prompt_embeds = repeat_rows(prompt_embeds, num_images_per_prompt)
            pooled_prompt_embeds = repeat_rows(pooled_prompt_embeds, num_images_per_prompt)
        return prompt_embeds, pooled_prompt_embeds

    def _check_images_per_prompt(self, n):
        if type(n) is not int or n < 1:
            raise ValueError(f"{type(self).__name__}: num_images_per_prompt must be a positive int, got {n!r}")

    def _check_prompt_or_embeds(self, prompt, prompt_embeds, *others):
        """diffusers' rule: a prompt or its embeddings, never both."""
        name = type(self).__name__
        if prompt is not None and prompt_embeds is not None:
            raise ValueError(f"{name}: pass prompt or prompt_embeds, not both")
        if prompt is None and prompt_embeds is None:
            raise ValueError(f"{name}: pass prompt (or prompt_embeds with pooled_prompt_embeds)")
        for value, other in others:
            if value is not None and prompt_embeds is not None:
                raise ValueError(f"{name}: pass {other} or prompt_embeds, not both")

    def _check_negative_or_embeds(self, negative_prompt, negative_prompt_embeds, *others):
        if negative_prompt_embeds is not None and any(p is not None for p in (negative_prompt, *others)):
            raise ValueError(f"{type(self).__name__}: pass negative prompts or negative_prompt_embeds, not both")

    def _with_negative(self, prompt_embeds, pooled_prompt_embeds, negative, negative_pooled):
        """The guidance batch: the negative rows, then the positive ones."""
        negative = self._host(negative, "negative_prompt_embeds", 3)
        negative_pooled = self._host(negative_pooled, "negative_pooled_prompt_embeds", 2)
        return cat([negative, prompt_embeds], dim=0), cat([negative_pooled, pooled_prompt_embeds], dim=0)

    def decode(self, latents, output_type):
        """Latents -> image: undo the VAE's scaling and shift, decode on the VAE's mesh, post-process."""
        config = self.vae.config
        latents = latents / config.scaling_factor
        if config.shift_factor:
            latents = latents + config.shift_factor
        image = self.vae.decode(latents, return_dict=False)[0]
        return postprocess(image, output_type)


def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5, max_shift=1.15):
    """mu of the dynamic shift: linear in the image's token count, base_shift at base_seq_len and
    max_shift at max_seq_len."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + base_shift - m * base_seq_len



def repeat_rows(x, n):
    """Each row of x repeated n times in place (torch's repeat_interleave on dim 0)."""
    return cat([x[i:i + 1] for i in range(x.shape[0]) for _ in range(n)], dim=0)


def laid_out_like(x, like):
    """x laid out as ``like`` (the scheduler's step combines them elementwise)."""
    return x if list(x.placements) == list(like.placements) else x.redistribute(like.device_mesh, like.placements)
