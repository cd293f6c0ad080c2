"""Text-to-image pipelines with diffusers' names and arguments, from precomputed prompt embeddings
(text encoders are not part of DTorch): the denoising loop with classifier-free guidance over a
diffusion transformer, the flow-matching scheduler, and the VAE's decoder, returning a numpy image.

The transformer and the VAE each live on a mesh of their own choosing (``device_mesh`` and
``vae_mesh``: the VAE may sit on one device, a sub-mesh, or the transformer's mesh); the latents
cross from one to the other once, after the last step."""
import dataclasses
import json
import os
import struct
import zlib

import numpy as np

from . import _dtype
from ._factory import distribute_tensor, randn
from ._runtime import manual_seed
from ._safetensors import _progress
from ._tensor import DTensor
from ._ops_view import cat
from .models.modeling_diffusers import read_config
from .schedulers import FlowMatchEulerDiscreteScheduler


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
    (``transformer/``, ``vae/``, ``scheduler/``; text encoders are not loaded), the latents' noise,
    and decoding."""

    transformer_class = None

    def __init__(self, transformer, scheduler, vae):
        self.transformer, self.scheduler, self.vae = transformer, scheduler, vae
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)

    @classmethod
    def from_pretrained(cls, path, device_mesh=None, vae_mesh=None, dtype=None, progress=None):
        """The pipeline of a diffusers directory: the transformer laid out over ``device_mesh`` (by its
        dim names: dp, ulysses, ring), the VAE on ``vae_mesh`` (default: the transformer's mesh)."""
        from .models.autoencoder_kl import AutoencoderKL
        transformer = cls.transformer_class.from_pretrained(path, subfolder="transformer", device_mesh=device_mesh,
                                                             dtype=dtype, progress=progress)
        vae = AutoencoderKL.from_pretrained(path, subfolder="vae", device_mesh=vae_mesh or transformer.parallel.mesh,
                                            dtype=dtype, progress=progress)
        scheduler = FlowMatchEulerDiscreteScheduler(**read_config(os.path.join(path, "scheduler",
                                                                               "scheduler_config.json")))
        return cls(transformer, scheduler, vae)

    def save_pretrained(self, directory):
        """Writes the components in diffusers' layout (model_index.json and one folder each)."""
        os.makedirs(directory, exist_ok=True)
        self.transformer.save_pretrained(os.path.join(directory, "transformer"))
        self.vae.save_pretrained(os.path.join(directory, "vae"))
        self.scheduler.save_pretrained(os.path.join(directory, "scheduler"))
        index = {"_class_name": type(self).__name__,
                 "transformer": ["diffusers", type(self.transformer).__name__],
                 "vae": ["diffusers", "AutoencoderKL"], "scheduler": ["diffusers", type(self.scheduler).__name__]}
        with open(os.path.join(directory, "model_index.json"), "w") as f:
            json.dump(index, f, indent=2)

    @property
    def mesh(self):
        return self.transformer.parallel.mesh

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
            raise ValueError(f"{type(self).__name__}: {name} is required (DTorch runs no text encoder: pass the "
                             "prompt's embeddings)")
        if not isinstance(x, DTensor):
            x = distribute_tensor(np.ascontiguousarray(x, dtype=np.float32), self.mesh)
        if x.ndim != ndim:
            raise ValueError(f"{type(self).__name__}: {name} must have {ndim} dims, got shape {tuple(x.shape)}")
        return x

    @staticmethod
    def _check_size(height, width, multiple):
        if height % multiple or width % multiple:
            raise ValueError(f"height and width must be multiples of {multiple}, got {height} x {width}")

    def _prompts(self, prompt_embeds, pooled_prompt_embeds, num_images_per_prompt):
        """The prompt's embeddings on the transformer's mesh, each row repeated per image."""
        prompt_embeds = self._host(prompt_embeds, "prompt_embeds", 3)
        pooled_prompt_embeds = self._host(pooled_prompt_embeds, "pooled_prompt_embeds", 2)
        if num_images_per_prompt > 1:
            prompt_embeds = _repeat_rows(prompt_embeds, num_images_per_prompt)
            pooled_prompt_embeds = _repeat_rows(pooled_prompt_embeds, num_images_per_prompt)
        return prompt_embeds, pooled_prompt_embeds

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


class StableDiffusion3Pipeline(DiffusionPipeline):
    """diffusers' StableDiffusion3Pipeline from prompt embeddings: ``prompt_embeds`` (B, T, 4096) and
    ``pooled_prompt_embeds`` (B, 2048), with their negative counterparts for classifier-free guidance
    (zeros when not given, as SD3 does for an empty negative prompt). With guidance the unconditional
    and conditional rows run as one batch of 2B, which the transformer's ``dp`` dim splits."""

    from .models.transformer_sd3 import SD3Transformer2DModel as transformer_class

    def __call__(self, prompt_embeds=None, pooled_prompt_embeds=None, negative_prompt_embeds=None,
                 negative_pooled_prompt_embeds=None, height=None, width=None, num_inference_steps=28, sigmas=None,
                 guidance_scale=7.0, num_images_per_prompt=1, latents=None, seed=None, output_type="np",
                 return_dict=True, mu=None, progress=None):
        if output_type not in ("np", "uint8", "latent"):
            raise ValueError(f"output_type must be 'np', 'uint8' or 'latent', got {output_type!r}")
        transformer = self.transformer
        config = transformer.config
        height = height or config.sample_size * self.vae_scale_factor
        width = width or config.sample_size * self.vae_scale_factor
        self._check_size(height, width, self.vae_scale_factor * config.patch_size)
        prompt_embeds, pooled_prompt_embeds = self._prompts(prompt_embeds, pooled_prompt_embeds, num_images_per_prompt)
        batch = prompt_embeds.shape[0]
        guidance = guidance_scale > 1
        if guidance:  # an empty negative prompt's embeddings are zeros for SD3
            if negative_prompt_embeds is None:
                negative_prompt_embeds = np.zeros(prompt_embeds.shape, np.float32)
            if negative_pooled_prompt_embeds is None:
                negative_pooled_prompt_embeds = np.zeros(pooled_prompt_embeds.shape, np.float32)
            prompt_embeds, pooled_prompt_embeds = self._with_negative(prompt_embeds, pooled_prompt_embeds,
                                                                      negative_prompt_embeds,
                                                                      negative_pooled_prompt_embeds)

        shape = (batch, config.in_channels, height // self.vae_scale_factor, width // self.vae_scale_factor)
        latents = self._latents(shape, latents, seed)
        scheduler = self.scheduler
        if scheduler.config.use_dynamic_shifting and mu is None:
            tokens = (shape[2] // config.patch_size) * (shape[3] // config.patch_size)
            mu = calculate_shift(tokens, scheduler.config.base_image_seq_len, scheduler.config.max_image_seq_len,
                                 scheduler.config.base_shift, scheduler.config.max_shift)
        scheduler.set_timesteps(num_inference_steps, sigmas=sigmas, mu=mu)
        bar = _progress(len(scheduler.timesteps), "Denoising", progress, unit="step")
        try:
            for t in scheduler.timesteps:
                model_input = cat([latents, latents], dim=0) if guidance else latents
                timestep = np.full((model_input.shape[0],), t, dtype=np.float32)
                noise_pred = transformer(hidden_states=model_input, timestep=timestep,
                                         encoder_hidden_states=prompt_embeds, pooled_projections=pooled_prompt_embeds,
                                         return_dict=False)[0]
                if guidance:
                    uncond, text = noise_pred[:batch], noise_pred[batch:]
                    noise_pred = uncond + (text - uncond) * float(guidance_scale)
                latents = scheduler.step(noise_pred, t, _like(latents, noise_pred), return_dict=False)[0]
                bar.update(1)
        finally:
            bar.close()
        images = latents if output_type == "latent" else self.decode(latents, output_type)
        if not return_dict:
            return (images,)
        return ImagePipelineOutput(images=images)


class FluxPipeline(DiffusionPipeline):
    """diffusers' FluxPipeline from prompt embeddings: ``prompt_embeds`` (B, T, 4096) and
    ``pooled_prompt_embeds`` (B, 768). The latents are packed in 2 x 2 patches into a sequence of
    (H/16 * W/16) tokens with their (0, row, col) ids; FLUX-dev's guidance goes in as an embedding
    (``guidance_scale``), so a step is one forward. ``true_cfg_scale`` > 1 with negative embeddings
    adds classifier-free guidance: the negative and positive rows then run as one batch, which the
    transformer's ``dp`` dim splits."""

    from .models.transformer_flux import FluxTransformer2DModel as transformer_class

    def __call__(self, prompt_embeds=None, pooled_prompt_embeds=None, negative_prompt_embeds=None,
                 negative_pooled_prompt_embeds=None, true_cfg_scale=1.0, height=None, width=None,
                 num_inference_steps=28, sigmas=None, guidance_scale=3.5, num_images_per_prompt=1, latents=None,
                 seed=None, output_type="np", return_dict=True, progress=None):
        if output_type not in ("np", "uint8", "latent"):
            raise ValueError(f"output_type must be 'np', 'uint8' or 'latent', got {output_type!r}")
        transformer = self.transformer
        config = transformer.config
        height = height or 1024
        width = width or 1024
        multiple = self.vae_scale_factor * 2
        self._check_size(height, width, multiple)
        prompt_embeds, pooled_prompt_embeds = self._prompts(prompt_embeds, pooled_prompt_embeds, num_images_per_prompt)
        batch = prompt_embeds.shape[0]
        true_cfg = true_cfg_scale > 1 and negative_prompt_embeds is not None
        if true_cfg:
            prompt_embeds, pooled_prompt_embeds = self._with_negative(prompt_embeds, pooled_prompt_embeds,
                                                                      negative_prompt_embeds,
                                                                      negative_pooled_prompt_embeds)

        h, w = height // multiple, width // multiple                 # tokens per column and row
        channels = config.in_channels // 4
        shape = (batch, h * w, config.in_channels)
        if latents is None:
            latents = pack_latents(self._latents((batch, channels, 2 * h, 2 * w), None, seed))
        else:
            latents = self._latents(shape, latents, seed)
        img_ids = latent_image_ids(h, w)
        txt_ids = np.zeros((prompt_embeds.shape[1], 3), dtype=np.float32)
        scheduler = self.scheduler
        if sigmas is None:
            sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
        mu = calculate_shift(h * w, scheduler.config.base_image_seq_len, scheduler.config.max_image_seq_len,
                             scheduler.config.base_shift, scheduler.config.max_shift)
        scheduler.set_timesteps(sigmas=sigmas, mu=mu)
        rows = prompt_embeds.shape[0]
        guidance = np.full((rows,), guidance_scale, dtype=np.float32) if config.guidance_embeds else None
        bar = _progress(len(scheduler.timesteps), "Denoising", progress, unit="step")
        try:
            for t in scheduler.timesteps:
                model_input = cat([latents, latents], dim=0) if true_cfg else latents
                timestep = np.full((rows,), t / 1000.0, dtype=np.float32)
                noise_pred = transformer(hidden_states=model_input, timestep=timestep, guidance=guidance,
                                         pooled_projections=pooled_prompt_embeds,
                                         encoder_hidden_states=prompt_embeds, txt_ids=txt_ids, img_ids=img_ids,
                                         return_dict=False)[0]
                if true_cfg:
                    negative_pred, positive_pred = noise_pred[:batch], noise_pred[batch:]
                    noise_pred = negative_pred + (positive_pred - negative_pred) * float(true_cfg_scale)
                latents = scheduler.step(noise_pred, t, _like(latents, noise_pred), return_dict=False)[0]
                bar.update(1)
        finally:
            bar.close()
        if output_type == "latent":
            images = latents
        else:
            images = self.decode(unpack_latents(latents, 2 * h, 2 * w), output_type)
        if not return_dict:
            return (images,)
        return ImagePipelineOutput(images=images)


def pack_latents(latents):
    """(B, C, H, W) -> (B, H/2 * W/2, 4C): each 2 x 2 patch one token, channels outermost."""
    B, C, H, W = latents.shape
    return latents.reshape(B, C, H // 2, 2, W // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(B, (H // 2) * (W // 2), C * 4)


def unpack_latents(latents, height, width):
    """pack_latents undone: (B, H/2 * W/2, 4C) -> (B, C, H, W)."""
    B, _, channels = latents.shape
    x = latents.reshape(B, height // 2, width // 2, channels // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, channels // 4, height, width)


def latent_image_ids(h, w):
    """(h * w, 3) ids of the packed tokens: (0, row, column), row-major."""
    ids = np.zeros((h, w, 3), dtype=np.float32)
    ids[..., 1] = np.arange(h, dtype=np.float32)[:, None]
    ids[..., 2] = np.arange(w, dtype=np.float32)[None, :]
    return ids.reshape(h * w, 3)


def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5, max_shift=1.15):
    """mu of the dynamic shift: linear in the image's token count, base_shift at base_seq_len and
    max_shift at max_seq_len."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + base_shift - m * base_seq_len


def _repeat_rows(x, n):
    """Each row of x repeated n times in place (torch's repeat_interleave on dim 0)."""
    return cat([x[i:i + 1] for i in range(x.shape[0]) for _ in range(n)], dim=0)


def _like(x, like):
    """x laid out as ``like`` (the scheduler's step combines them elementwise)."""
    return x if list(x.placements) == list(like.placements) else x.redistribute(like.device_mesh, like.placements)


__all__ = ["DiffusionPipeline", "FluxPipeline", "ImagePipelineOutput", "StableDiffusion3Pipeline", "calculate_shift",
           "latent_image_ids", "pack_latents", "postprocess", "save_png", "unpack_latents"]
