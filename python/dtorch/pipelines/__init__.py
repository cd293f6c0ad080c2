"""dtorch.pipelines: text-to-image pipelines with diffusers' names and arguments, from prompts (through
the text encoders of a diffusers pipeline directory) or from precomputed prompt embeddings. The
transformer, the VAE and the text encoders each live on a mesh of their own choosing
(``device_mesh``, ``vae_mesh``, ``text_encoder_mesh``); the prompt's embeddings cross to the
transformer's mesh once, and the latents to the VAE's once, after the last step."""
from .pipeline_flux import FluxPipeline, latent_image_ids, pack_latents, unpack_latents
from .pipeline_stable_diffusion_3 import StableDiffusion3Pipeline
from .pipeline_utils import DiffusionPipeline, ImagePipelineOutput, calculate_shift, postprocess, save_png

__all__ = ["DiffusionPipeline", "FluxPipeline", "ImagePipelineOutput", "StableDiffusion3Pipeline", "calculate_shift",
           "latent_image_ids", "pack_latents", "postprocess", "save_png", "unpack_latents"]
