"""FLUX (diffusers' FluxPipeline): from prompts through CLIP and T5, or from precomputed prompt
embeddings; and the packing of its latents into 2 x 2 patch tokens."""
import numpy as np

from .._safetensors import _progress
from .._ops_view import cat
from .pipeline_utils import DiffusionPipeline, ImagePipelineOutput, calculate_shift, laid_out_like, repeat_rows
from .prompt_encoding import CLIP_TOKENIZERS, T5_TOKENIZERS, as_list, check_sequence_length, to_mesh, token_ids


class FluxPipeline(DiffusionPipeline):
    """diffusers' FluxPipeline. From prompts: CLIP (``text_encoder``) gives the pooled embedding (its
    pooler output), T5 (``text_encoder_2``) the sequence (its last hidden state). Or from
    embeddings: ``prompt_embeds`` (B, T, 4096) and ``pooled_prompt_embeds`` (B, 768). The latents
    are packed in 2 x 2 patches into a sequence of (H/16 * W/16) tokens with their (0, row, col)
    ids; FLUX-dev's guidance goes in as an embedding (``guidance_scale``), so a step is one forward.
    ``true_cfg_scale`` > 1 with a negative prompt (or negative embeddings) adds classifier-free
    guidance: the negative and positive rows then run as one batch, which the transformer's ``dp``
    dim splits."""

    from ..models.transformer_flux import FluxTransformer2DModel as transformer_class

    components = {"transformer": ("FluxTransformer2DModel",), "vae": ("AutoencoderKL",),
                  "scheduler": ("FlowMatchEulerDiscreteScheduler",),
                  "text_encoder": ("CLIPTextModel",), "tokenizer": CLIP_TOKENIZERS,
                  "text_encoder_2": ("T5EncoderModel",), "tokenizer_2": T5_TOKENIZERS}
    text_pairs = (("text_encoder", "tokenizer"), ("text_encoder_2", "tokenizer_2"))
    default_sample_size = 128

    def _encode(self, prompt, prompt_2, num_images_per_prompt, max_sequence_length):
        if not self.has_text_encoders:
            raise ValueError("FluxPipeline: this pipeline has no text encoders (its directory's model_index.json "
                             "names none): pass prompt_embeds and pooled_prompt_embeds instead of a prompt")
        if len(prompt) != len(prompt_2):
            raise ValueError(f"prompt and prompt_2 must be as many, got {len(prompt)} and {len(prompt_2)}")
        pooled = self.text_encoder(token_ids(self.tokenizer, prompt, self.tokenizer.model_max_length)).pooler_output
        embeds = self.text_encoder_2(token_ids(self.tokenizer_2, prompt_2, max_sequence_length)).last_hidden_state
        embeds, pooled = to_mesh(embeds, self.mesh), to_mesh(pooled, self.mesh)
        if num_images_per_prompt > 1:
            embeds, pooled = repeat_rows(embeds, num_images_per_prompt), repeat_rows(pooled, num_images_per_prompt)
        return embeds, pooled

    def encode_prompt(self, prompt, prompt_2=None, device=None, num_images_per_prompt=1, prompt_embeds=None,
                      pooled_prompt_embeds=None, max_sequence_length=512, lora_scale=None):
        """diffusers' encode_prompt: (prompt_embeds, pooled_prompt_embeds, text_ids), the first two
        DTensors on the transformer's mesh (each prompt's rows repeated ``num_images_per_prompt``
        times; embeddings given are returned as they are), text_ids a float32 numpy array of zeros
        (T, 3). ``prompt_2`` (for T5) defaults to ``prompt``. ``device`` is accepted for diffusers'
        signature and unused (the meshes say where); LoRA scales are not supported."""
        if lora_scale is not None:
            raise ValueError("FluxPipeline.encode_prompt: lora_scale is not supported")
        self._check_images_per_prompt(num_images_per_prompt)
        max_sequence_length = check_sequence_length(max_sequence_length, 512)
        if prompt_embeds is None:
            if prompt is None:
                raise ValueError("FluxPipeline.encode_prompt: pass prompt or prompt_embeds")
            prompt = as_list(prompt, "prompt")
            prompt_embeds, pooled_prompt_embeds = self._encode(prompt, as_list(prompt_2 or prompt, "prompt_2"),
                                                               num_images_per_prompt, max_sequence_length)
        return prompt_embeds, pooled_prompt_embeds, np.zeros((prompt_embeds.shape[1], 3), np.float32)

    def _embeds(self, prompt, prompt_2, prompt_embeds, pooled_prompt_embeds, num_images_per_prompt,
                max_sequence_length, names=("prompt_embeds", "pooled_prompt_embeds")):
        if prompt is not None:
            return self._encode(prompt, as_list(prompt_2 or prompt, names[0].replace("_embeds", "_2")),
                                num_images_per_prompt, max_sequence_length)
        return self._prompts(prompt_embeds, pooled_prompt_embeds, num_images_per_prompt, *names)

    def __call__(self, prompt=None, prompt_2=None, negative_prompt=None, negative_prompt_2=None, true_cfg_scale=1.0,
                 height=None, width=None, num_inference_steps=28, sigmas=None, guidance_scale=3.5,
                 num_images_per_prompt=1, *, latents=None, prompt_embeds=None, pooled_prompt_embeds=None,
                 negative_prompt_embeds=None, negative_pooled_prompt_embeds=None, output_type="np",
                 return_dict=True, max_sequence_length=None, seed=None, progress=None):
        """Images from ``prompt`` (a string or a list; ``prompt_2`` for T5) or from ``prompt_embeds``
        and ``pooled_prompt_embeds``, as diffusers' pipeline. ``latents`` are packed (B, H/16 * W/16,
        C * 4), else N(0, 1) noise from ``seed``. ``output_type`` "np": float32 (B, H, W, 3) in
        [0, 1]; "uint8"; "latent": the final packed latents."""
        if output_type not in ("np", "uint8", "latent"):
            raise ValueError(f"output_type must be 'np', 'uint8' or 'latent', got {output_type!r}")
        self._check_prompt_or_embeds(prompt, prompt_embeds, (prompt_2, "prompt_2"))
        self._check_negative_or_embeds(negative_prompt, negative_prompt_embeds, negative_prompt_2)
        self._check_images_per_prompt(num_images_per_prompt)
        max_sequence_length = check_sequence_length(max_sequence_length, 512)
        if prompt is not None:
            prompt = as_list(prompt, "prompt")
        prompt_embeds, pooled_prompt_embeds = self._embeds(prompt, prompt_2, prompt_embeds, pooled_prompt_embeds,
                                                           num_images_per_prompt, max_sequence_length)
        batch = prompt_embeds.shape[0]
        true_cfg = true_cfg_scale > 1 and (negative_prompt is not None or (
            negative_prompt_embeds is not None and negative_pooled_prompt_embeds is not None))
        if true_cfg:
            if negative_prompt is not None:
                rows = batch // num_images_per_prompt
                negative_prompt = rows * [negative_prompt] if isinstance(negative_prompt, str) else \
                    as_list(negative_prompt, "negative_prompt")
                if len(negative_prompt) != rows:
                    raise ValueError(f"negative_prompt has {len(negative_prompt)} prompts, but prompt has {rows}: "
                                     "they must match")
                if isinstance(negative_prompt_2, str):
                    negative_prompt_2 = rows * [negative_prompt_2]
            negative = self._embeds(negative_prompt, negative_prompt_2, negative_prompt_embeds,
                                    negative_pooled_prompt_embeds, num_images_per_prompt, max_sequence_length,
                                    ("negative_prompt_embeds", "negative_pooled_prompt_embeds"))
            prompt_embeds, pooled_prompt_embeds = self._with_negative(prompt_embeds, pooled_prompt_embeds, *negative)

        height = height or self.default_sample_size * self.vae_scale_factor
        width = width or self.default_sample_size * self.vae_scale_factor
        multiple = self.vae_scale_factor * 2
        self._check_size(height, width, multiple)
        transformer = self.transformer
        config = transformer.config
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
