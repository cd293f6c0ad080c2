"""FLUX from prompt embeddings (diffusers' FluxPipeline), and the packing of its latents into 2 x 2
patch tokens."""
import numpy as np

from .._safetensors import _progress
from .._ops_view import cat
from .pipeline_utils import DiffusionPipeline, ImagePipelineOutput, calculate_shift, laid_out_like


class FluxPipeline(DiffusionPipeline):
    """diffusers' FluxPipeline from prompt embeddings: ``prompt_embeds`` (B, T, 4096) and
    ``pooled_prompt_embeds`` (B, 768). The latents are packed in 2 x 2 patches into a sequence of
    (H/16 * W/16) tokens with their (0, row, col) ids; FLUX-dev's guidance goes in as an embedding
    (``guidance_scale``), so a step is one forward. ``true_cfg_scale`` > 1 with negative embeddings
    adds classifier-free guidance: the negative and positive rows then run as one batch, which the
    transformer's ``dp`` dim splits."""

    from ..models.transformer_flux import FluxTransformer2DModel as transformer_class

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
                latents = scheduler.step(noise_pred, t, laid_out_like(latents, noise_pred), return_dict=False)[0]
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
