"""Stable Diffusion 3 from prompt embeddings (diffusers' StableDiffusion3Pipeline)."""
import numpy as np

from .._safetensors import _progress
from .._ops_view import cat
from .pipeline_utils import DiffusionPipeline, ImagePipelineOutput, calculate_shift, laid_out_like


class StableDiffusion3Pipeline(DiffusionPipeline):
    """diffusers' StableDiffusion3Pipeline from prompt embeddings: ``prompt_embeds`` (B, T, 4096) and
    ``pooled_prompt_embeds`` (B, 2048), with their negative counterparts for classifier-free guidance
    (zeros when not given, as SD3 does for an empty negative prompt). With guidance the unconditional
    and conditional rows run as one batch of 2B, which the transformer's ``dp`` dim splits."""

    from ..models.transformer_sd3 import SD3Transformer2DModel as transformer_class

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
                latents = scheduler.step(noise_pred, t, laid_out_like(latents, noise_pred), return_dict=False)[0]
                bar.update(1)
        finally:
            bar.close()
        images = latents if output_type == "latent" else self.decode(latents, output_type)
        if not return_dict:
            return (images,)
        return ImagePipelineOutput(images=images)
