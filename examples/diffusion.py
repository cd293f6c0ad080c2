"""Text-to-image with an SD3-style pipeline on a mesh of CPU devices, written to a PNG.

    python diffusion.py --mesh dp=2,ulysses=2 --steps 8 --out image.png
    python diffusion.py --model DIR --prompt "a red fox in the snow" --height 1024 --width 1024
    python diffusion.py --model DIR --prompt-embeds embeds.npz

DIR is a diffusers SD3 pipeline directory (model_index.json; transformer/, vae/, scheduler/, and
the text encoders with their tokenizers). --prompt (and --negative-prompt) go through its text
encoders, which run on the first device; --prompt-embeds names an .npz with prompt_embeds (1, T,
joint_attention_dim) and pooled_prompt_embeds (1, pooled_projection_dim) (negative_* optional) for
a directory without them. Without --model, a small random-weight SD3-shaped pipeline (4 joint
blocks of 4 heads, a 4-level VAE: 8x down, as SD3's; no text encoders) is written once to
~/.cache/dtorch/sd3-tiny-random and used with seeded random embeddings: the image is noise, the
speed and the parallelism are real. The mesh's dims: dp (the guidance pair), ulysses and ring (the
image tokens). The VAE decodes on the first device.
"""
import argparse
import os
import time

import numpy as np

import dtorch
from dtorch.models import SD3Transformer2DModel
from dtorch.models.autoencoder_kl import AutoencoderKL
from dtorch.pipelines import StableDiffusion3Pipeline, save_png
from dtorch.schedulers import FlowMatchEulerDiscreteScheduler

from llama import parse_mesh

TINY_TRANSFORMER = dict(sample_size=32, patch_size=2, in_channels=16, num_layers=4, attention_head_dim=32,
                        num_attention_heads=4, joint_attention_dim=256, caption_projection_dim=128,
                        pooled_projection_dim=128, out_channels=16, pos_embed_max_size=48, qk_norm="rms_norm")
TINY_VAE = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(16, 32, 64, 64),
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                layers_per_block=1, norm_num_groups=8, scaling_factor=1.5305, shift_factor=0.0609,
                use_quant_conv=False, use_post_quant_conv=False)


def random_pipeline():
    """The tiny SD3-shaped pipeline with random weights, written on first use."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "dtorch", "sd3-tiny-random")
    if not os.path.exists(os.path.join(directory, "model_index.json")):
        print(f"writing a random-weight SD3-shaped pipeline to {directory}")
        dtorch.manual_seed(0)
        pipe = StableDiffusion3Pipeline(SD3Transformer2DModel.from_config(TINY_TRANSFORMER),
                                        FlowMatchEulerDiscreteScheduler(shift=3.0), AutoencoderKL.from_config(TINY_VAE))
        pipe.save_pretrained(directory)
    return directory


def prompt_embeddings(path, config, tokens=16):
    if path:
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    rng = np.random.default_rng(0)
    return dict(prompt_embeds=rng.standard_normal((1, tokens, config.joint_attention_dim)).astype(np.float32),
                pooled_prompt_embeds=rng.standard_normal((1, config.pooled_projection_dim)).astype(np.float32))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a diffusers SD3 pipeline directory (default: a tiny random one)")
    parser.add_argument("--mesh", default="dp=2,ulysses=2", help="mesh dims and sizes (dims: dp, ulysses, ring)")
    parser.add_argument("--workers", default="thread", choices=["thread", "process"])
    parser.add_argument("--prompt", help="the prompt (needs a --model directory with text encoders)")
    parser.add_argument("--negative-prompt", help="the negative prompt (with --prompt)")
    parser.add_argument("--prompt-embeds", help=".npz with prompt_embeds and pooled_prompt_embeds (negative_* too)")
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--guidance-scale", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="image.png")
    args = parser.parse_args()
    if args.prompt is not None and (args.prompt_embeds or not args.model):
        parser.error("--prompt needs --model (a directory with text encoders) and no --prompt-embeds")

    dtorch.init(workers=args.workers)
    directory = args.model or random_pipeline()
    mesh = parse_mesh(args.mesh)
    vae_mesh = dtorch.DeviceMesh("cpu", [int(mesh.mesh.reshape(-1)[0])])
    start = time.perf_counter()
    pipe = StableDiffusion3Pipeline.from_pretrained(directory, device_mesh=mesh, vae_mesh=vae_mesh)
    print(f"loaded {directory} in {time.perf_counter() - start:.2f} s: transformer on {mesh}, VAE on {vae_mesh} "
          f"({args.workers} workers)")

    if args.prompt is not None:
        embeds = dict(prompt=args.prompt, negative_prompt=args.negative_prompt)
    else:
        embeds = prompt_embeddings(args.prompt_embeds, pipe.transformer.config)
    call = dict(embeds, height=args.height, width=args.width, guidance_scale=args.guidance_scale, seed=args.seed)
    pipe(**dict(call, num_inference_steps=1, output_type="latent"))       # warm-up: the first step's setup
    start = time.perf_counter()
    latents = pipe(**dict(call, num_inference_steps=args.steps, output_type="latent")).images
    latents.numpy()
    denoise = time.perf_counter() - start
    start = time.perf_counter()
    image = pipe.decode(latents, "uint8")[0]
    decode = time.perf_counter() - start
    save_png(image, args.out)
    tokens = (args.height // 16) * (args.width // 16)
    print(f"{args.steps} steps of {tokens} image tokens in {denoise:.2f} s: {args.steps / denoise:.2f} steps/s; "
          f"VAE decode {decode:.2f} s")
    print(f"wrote {args.out} ({image.shape[1]} x {image.shape[0]})")
    dtorch.shutdown()


if __name__ == "__main__":
    main()
