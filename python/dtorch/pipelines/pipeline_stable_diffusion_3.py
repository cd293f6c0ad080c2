"""Stable Diffusion 3 (diffusers' StableDiffusion3Pipeline): from prompts through its three text
encoders, or from precomputed prompt embeddings."""
import numpy as np

from .._factory import zeros
from .._safetensors import _progress
from .._ops_view import cat
from .pipeline_utils import DiffusionPipeline, ImagePipelineOutput, calculate_shift, laid_out_like, repeat_rows
from .prompt_encoding import CLIP_TOKENIZERS, T5_TOKENIZERS, as_list, check_sequence_length, to_mesh, token_ids


class StableDiffusion3Pipeline(DiffusionPipeline):
    """diffusers' StableDiffusion3Pipeline. From prompts: two CLIP text encoders with projection
    (``text_encoder``, ``text_encoder_2``) give the penultimate hidden states (concatenated on
    features, padded to T5's width) and the pooled projections (concatenated), T5
    (``text_encoder_3``; zeros where the pipeline has none, as diffusers) the rest of the sequence.
    Or from embeddings: ``prompt_embeds`` (B, T, 4096) and ``pooled_prompt_embeds`` (B, 2048), with
    their negative counterparts for classifier-free guidance (encoded from ``negative_prompt`` or ""
    where the pipeline has text encoders and none are given; zeros where it has none). With guidance
    the unconditional and conditional rows run as one batch of 2B, which the transformer's ``dp``
    dim splits."""

    from ..models.transformer_sd3 import SD3Transformer2DModel as transformer_class

    components = {"transformer": ("SD3Transformer2DModel",), "vae": ("AutoencoderKL",),
                  "scheduler": ("FlowMatchEulerDiscreteScheduler",),
                  "text_encoder": ("CLIPTextModelWithProjection",), "tokenizer": CLIP_TOKENIZERS,
                  "text_encoder_2": ("CLIPTextModelWithProjection",), "tokenizer_2": CLIP_TOKENIZERS,
                  "text_encoder_3": ("T5EncoderModel",), "tokenizer_3": T5_TOKENIZERS}
    text_pairs = (("text_encoder", "tokenizer"), ("text_encoder_2", "tokenizer_2"), ("text_encoder_3", "tokenizer_3"))

    @property
    def has_text_encoders(self):
        """Whether prompts can be encoded: the two CLIP encoders are there (T5 may be absent)."""
        return all(getattr(self, n) is not None for n in ("text_encoder", "tokenizer", "text_encoder_2",
                                                          "tokenizer_2"))

    # ---- prompts
    def _clip(self, tokenizer, encoder, prompts, clip_skip, max_length):
        out = encoder(token_ids(tokenizer, prompts, max_length), output_hidden_states=True)
        hidden = out.hidden_states[-2 if clip_skip is None else -(clip_skip + 2)]
        return hidden, out.text_embeds

    def _encode(self, prompt, prompt_2, prompt_3, num_images_per_prompt, clip_skip, max_sequence_length):
        """(embeddings, pooled) of lists of prompts, on the transformer's mesh, each row repeated per image."""
        if not self.has_text_encoders:
            raise ValueError("StableDiffusion3Pipeline: this pipeline has no text encoders (its directory's "
                             "model_index.json names none): pass prompt_embeds and pooled_prompt_embeds instead "
                             "of a prompt")
        if clip_skip is not None and (type(clip_skip) is not int or clip_skip < 0):
            raise ValueError(f"clip_skip must be a non-negative int, got {clip_skip!r}")
        if not len(prompt) == len(prompt_2) == len(prompt_3):
            raise ValueError(f"prompt, prompt_2 and prompt_3 must be as many, got {len(prompt)}, {len(prompt_2)} "
                             f"and {len(prompt_3)}")
        clip_length = self.tokenizer.model_max_length
        first, pooled = self._clip(self.tokenizer, self.text_encoder, prompt, clip_skip, clip_length)
        second, pooled_2 = self._clip(self.tokenizer_2, self.text_encoder_2, prompt_2, clip_skip, clip_length)
        clip = cat([first, to_mesh(second, first.device_mesh)], dim=-1)
        batch = len(prompt)
        if self.text_encoder_3 is None:
            t5 = zeros(batch, max_sequence_length, self.transformer.config.joint_attention_dim,
                       device_mesh=clip.device_mesh, dtype=clip.dtype)
        else:
            t5 = to_mesh(self.text_encoder_3(token_ids(self.tokenizer_3, prompt_3, max_sequence_length))
                         .last_hidden_state, clip.device_mesh)
        width, clip_width = t5.shape[-1], clip.shape[-1]
        if clip_width < width:    # padded to T5's width with zeros (torch's pad; a wider CLIP is cut)
            clip = cat([clip, zeros(batch, clip.shape[1], width - clip_width, device_mesh=clip.device_mesh,
                                    dtype=clip.dtype)], dim=-1)
        elif clip_width > width:
            clip = clip[..., :width]
        embeds = to_mesh(cat([clip, t5], dim=1), self.mesh)
        pooled = to_mesh(cat([pooled, to_mesh(pooled_2, pooled.device_mesh)], dim=-1), self.mesh)
        if num_images_per_prompt > 1:
            embeds, pooled = repeat_rows(embeds, num_images_per_prompt), repeat_rows(pooled, num_images_per_prompt)
        return embeds, pooled

    def _negative_prompts(self, negative_prompt, negative_prompt_2, negative_prompt_3, batch):
        negative_prompt = negative_prompt or ""
        negatives = [negative_prompt, negative_prompt_2 or negative_prompt, negative_prompt_3 or negative_prompt]
        names = ("negative_prompt", "negative_prompt_2", "negative_prompt_3")
        out = []
        for value, name in zip(negatives, names):
            value = batch * [value] if isinstance(value, str) else as_list(value, name)
            if len(value) != batch:
                raise ValueError(f"{name} has {len(value)} prompts, but prompt has {batch}: they must match")
            out.append(value)
        return out

    def encode_prompt(self, prompt, prompt_2=None, prompt_3=None, device=None, num_images_per_prompt=1,
                      do_classifier_free_guidance=True, negative_prompt=None, negative_prompt_2=None,
                      negative_prompt_3=None, prompt_embeds=None, negative_prompt_embeds=None,
                      pooled_prompt_embeds=None, negative_pooled_prompt_embeds=None, clip_skip=None,
                      max_sequence_length=256, lora_scale=None):
        """diffusers' encode_prompt: (prompt_embeds, negative_prompt_embeds, pooled_prompt_embeds,
        negative_pooled_prompt_embeds), DTensors on the transformer's mesh. ``prompt_2`` and
        ``prompt_3`` (for CLIP-G and T5) default to ``prompt``; each prompt's rows repeat
        ``num_images_per_prompt`` times. With guidance and no negative embeddings the negatives are
        encoded from ``negative_prompt`` (default "", without clip_skip, as diffusers); embeddings
        given are returned as they are. ``device`` is accepted for diffusers' signature and unused
        (the meshes say where); LoRA scales are not supported."""
        if lora_scale is not None:
            raise ValueError("StableDiffusion3Pipeline.encode_prompt: lora_scale is not supported")
        self._check_images_per_prompt(num_images_per_prompt)
        max_sequence_length = check_sequence_length(max_sequence_length, 256)
        if prompt is not None:
            prompt = as_list(prompt, "prompt")
            batch = len(prompt)
        elif prompt_embeds is not None:
            batch = prompt_embeds.shape[0]
        else:
            raise ValueError("StableDiffusion3Pipeline.encode_prompt: pass prompt or prompt_embeds")
        if prompt_embeds is None:
            prompt_embeds, pooled_prompt_embeds = self._encode(
                prompt, as_list(prompt_2 or prompt, "prompt_2"), as_list(prompt_3 or prompt, "prompt_3"),
                num_images_per_prompt, clip_skip, max_sequence_length)
        if do_classifier_free_guidance and negative_prompt_embeds is None:
            negatives = self._negative_prompts(negative_prompt, negative_prompt_2, negative_prompt_3, batch)
            negative_prompt_embeds, negative_pooled_prompt_embeds = self._encode(
                *negatives, num_images_per_prompt, None, max_sequence_length)
        return prompt_embeds, negative_prompt_embeds, pooled_prompt_embeds, negative_pooled_prompt_embeds

    # ---- generation
    def __call__(self, prompt=None, prompt_2=None, prompt_3=None, height=None, width=None, num_inference_steps=28,
                 sigmas=None, guidance_scale=7.0, negative_prompt=None, negative_prompt_2=None,
                 negative_prompt_3=None, num_images_per_prompt=1, *, latents=None, prompt_embeds=None,
                 negative_prompt_embeds=None, pooled_prompt_embeds=None, negative_pooled_prompt_embeds=None,
                 output_type="np", return_dict=True, clip_skip=None, max_sequence_length=None, mu=None, seed=None,
                 progress=None):
        """Images from ``prompt`` (a string or a list; ``prompt_2``/``prompt_3`` for CLIP-G and T5) or
        from ``prompt_embeds`` and ``pooled_prompt_embeds``, as diffusers' pipeline. ``latents`` (B, C,
        H/8, W/8) start the run, else N(0, 1) noise from ``seed``. ``output_type`` "np": float32 (B,
        H, W, 3) in [0, 1]; "uint8"; "latent": the final latents."""
        if output_type not in ("np", "uint8", "latent"):
            raise ValueError(f"output_type must be 'np', 'uint8' or 'latent', got {output_type!r}")
        self._check_prompt_or_embeds(prompt, prompt_embeds, (prompt_2, "prompt_2"), (prompt_3, "prompt_3"))
        self._check_negative_or_embeds(negative_prompt, negative_prompt_embeds, negative_prompt_2, negative_prompt_3)
        self._check_images_per_prompt(num_images_per_prompt)
        max_sequence_length = check_sequence_length(max_sequence_length, 256)
        transformer = self.transformer
        config = transformer.config
        height = height or config.sample_size * self.vae_scale_factor
        width = width or config.sample_size * self.vae_scale_factor
        self._check_size(height, width, self.vae_scale_factor * config.patch_size)
        if prompt is not None:
            prompt = as_list(prompt, "prompt")
            prompt_embeds, pooled_prompt_embeds = self._encode(
                prompt, as_list(prompt_2 or prompt, "prompt_2"), as_list(prompt_3 or prompt, "prompt_3"),
                num_images_per_prompt, clip_skip, max_sequence_length)
        else:
            prompt_embeds, pooled_prompt_embeds = self._prompts(prompt_embeds, pooled_prompt_embeds,
                                                                num_images_per_prompt)
        batch = prompt_embeds.shape[0]
        guidance = guidance_scale > 1
        if guidance:
            if negative_prompt_embeds is not None:
                negative_prompt_embeds, negative_pooled_prompt_embeds = self._prompts(
                    negative_prompt_embeds, negative_pooled_prompt_embeds, num_images_per_prompt,
                    "negative_prompt_embeds", "negative_pooled_prompt_embeds")
            elif self.has_text_encoders:
                negatives = self._negative_prompts(negative_prompt, negative_prompt_2, negative_prompt_3,
                                                   batch // num_images_per_prompt)
                negative_prompt_embeds, negative_pooled_prompt_embeds = self._encode(
                    *negatives, num_images_per_prompt, None, max_sequence_length)
            elif negative_prompt is None:   # no text encoders: an empty negative prompt's embeddings are zeros
                negative_prompt_embeds = np.zeros(prompt_embeds.shape, np.float32)
                negative_pooled_prompt_embeds = np.zeros(pooled_prompt_embeds.shape, np.float32)
            else:
                raise ValueError("StableDiffusion3Pipeline: this pipeline has no text encoders: pass "
                                 "negative_prompt_embeds instead of negative_prompt")
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
