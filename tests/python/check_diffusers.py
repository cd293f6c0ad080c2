"""dtorch's diffusion models, scheduler and SD3 pipeline against diffusers itself. Not part of the
default run (its name does not start with test_): it needs torch, diffusers and (for diffusers'
pipeline class) transformers, which DTorch does not. Run it from tests/python with an interpreter
where they and dtorch are installed:

    python -m pytest -q check_diffusers.py

Each model is made by diffusers with random weights and written with its save_pretrained; DTorch
loads that directory (so the parameter names are checked too) on one device and on a mesh that
splits the work, and both run the same inputs."""
import numpy as np
import pytest
import torch
import diffusers

import dtorch
from dtorch.models import FluxTransformer2DModel, SD3Transformer2DModel
from dtorch.models.autoencoder_kl import AutoencoderKL
from dtorch.pipelines import StableDiffusion3Pipeline
from dtorch.schedulers import FlowMatchEulerDiscreteScheduler

SD3 = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
           joint_attention_dim=12, caption_projection_dim=16, pooled_projection_dim=10, out_channels=4,
           pos_embed_max_size=8, qk_norm="rms_norm")
FLUX = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=12, pooled_projection_dim=10, guidance_embeds=True,
            axes_dims_rope=(4, 6, 6))
VAE = dict(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
           up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4, layers_per_block=1,
           scaling_factor=1.5, shift_factor=0.1, use_quant_conv=False, use_post_quant_conv=False)
MESHES = {"one": ((1,), None), "dp2xulysses2": ((2, 2), ("dp", "ulysses")), "ring2": ((2,), ("ring",)),
          "ulysses2xring2": ((2, 2), ("ulysses", "ring"))}


@pytest.fixture(scope="module", autouse=True)
def rt():
    dtorch.init(workers="thread")
    yield
    dtorch.shutdown()


def _mesh(name):
    shape, names = MESHES[name]
    return dtorch.DeviceMesh("cpu", np.arange(int(np.prod(shape))).reshape(shape).tolist(), mesh_dim_names=names)


def _randomize(module):
    """Random values everywhere (diffusers initialises some norms to ones and some layers to zeros)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return module.eval()


def _close(ours, theirs, what):
    ours, theirs = np.asarray(ours), theirs.detach().numpy()
    scale = np.abs(theirs).max()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * scale, err_msg=what)


@pytest.mark.parametrize("mesh", ["one", "dp2xulysses2", "ulysses2xring2"])
def test_sd3_transformer(tmp_path, mesh):
    torch.manual_seed(0)
    theirs = _randomize(diffusers.SD3Transformer2DModel(**SD3))
    theirs.save_pretrained(tmp_path)
    ours = SD3Transformer2DModel.from_pretrained(tmp_path, device_mesh=_mesh(mesh))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 6, 10)).astype(np.float32)
    c = rng.standard_normal((2, 5, 12)).astype(np.float32)
    pooled = rng.standard_normal((2, 10)).astype(np.float32)
    t = np.array([999.0, 20.5], dtype=np.float32)
    with torch.no_grad():
        want = theirs(hidden_states=torch.from_numpy(x), encoder_hidden_states=torch.from_numpy(c),
                      pooled_projections=torch.from_numpy(pooled), timestep=torch.from_numpy(t)).sample
    got = ours(hidden_states=x, encoder_hidden_states=c, pooled_projections=pooled, timestep=t).sample
    _close(got.numpy(), want, f"SD3 on {mesh}")


@pytest.mark.parametrize("mesh", ["one", "ring2", "dp2xulysses2"])
def test_flux_transformer(tmp_path, mesh):
    torch.manual_seed(1)
    theirs = _randomize(diffusers.FluxTransformer2DModel(**FLUX))
    theirs.save_pretrained(tmp_path)
    ours = FluxTransformer2DModel.from_pretrained(tmp_path, device_mesh=_mesh(mesh))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 15, 16)).astype(np.float32)
    c = rng.standard_normal((2, 5, 12)).astype(np.float32)
    pooled = rng.standard_normal((2, 10)).astype(np.float32)
    t = np.array([1.0, 0.3], dtype=np.float32)
    g = np.array([3.5, 3.5], dtype=np.float32)
    img_ids = np.stack([np.zeros(15), np.arange(15) // 5, np.arange(15) % 5], -1).astype(np.float32)
    txt_ids = rng.integers(0, 4, (5, 3)).astype(np.float32)
    with torch.no_grad():
        want = theirs(hidden_states=torch.from_numpy(x), encoder_hidden_states=torch.from_numpy(c),
                      pooled_projections=torch.from_numpy(pooled), timestep=torch.from_numpy(t),
                      img_ids=torch.from_numpy(img_ids), txt_ids=torch.from_numpy(txt_ids),
                      guidance=torch.from_numpy(g)).sample
    got = ours(hidden_states=x, encoder_hidden_states=c, pooled_projections=pooled, timestep=t, img_ids=img_ids,
               txt_ids=txt_ids, guidance=g).sample
    _close(got.numpy(), want, f"FLUX on {mesh}")


@pytest.mark.parametrize("quant", [False, True])
def test_vae(tmp_path, quant):
    torch.manual_seed(2)
    config = dict(VAE, use_quant_conv=quant, use_post_quant_conv=quant)
    theirs = _randomize(diffusers.AutoencoderKL(**config))
    theirs.save_pretrained(tmp_path)
    ours = AutoencoderKL.from_pretrained(tmp_path, device_mesh=dtorch.DeviceMesh("cpu", [0, 1]))
    rng = np.random.default_rng(2)
    z = rng.standard_normal((3, 4, 4, 6)).astype(np.float32)
    image = rng.standard_normal((3, 3, 8, 12)).astype(np.float32)
    with torch.no_grad():
        want = theirs.decode(torch.from_numpy(z)).sample
        posterior = theirs.encode(torch.from_numpy(image)).latent_dist
    _close(ours.decode(z).sample.numpy(), want, "VAE decode")
    dist = ours.encode(image).latent_dist
    _close(dist.mean.numpy(), posterior.mean, "VAE encode mean")
    _close(dist.std.numpy(), posterior.std, "VAE encode std")


def test_scheduler():
    for kwargs, call in [(dict(shift=3.0), dict(num_inference_steps=7)),
                         (dict(use_dynamic_shifting=True), dict(sigmas=np.linspace(1.0, 1 / 6, 6), mu=0.9))]:
        theirs = diffusers.FlowMatchEulerDiscreteScheduler(**kwargs)
        ours = FlowMatchEulerDiscreteScheduler(**kwargs)
        theirs.set_timesteps(**call)
        ours.set_timesteps(**call)
        np.testing.assert_allclose(ours.sigmas, theirs.sigmas.numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(ours.timesteps, theirs.timesteps.numpy(), rtol=1e-6, atol=1e-4)


def test_sd3_pipeline(tmp_path):
    torch.manual_seed(3)
    transformer = _randomize(diffusers.SD3Transformer2DModel(**SD3))
    vae = _randomize(diffusers.AutoencoderKL(**VAE))
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    theirs = diffusers.StableDiffusion3Pipeline(transformer=transformer, scheduler=scheduler, vae=vae,
                                                text_encoder=None, tokenizer=None, text_encoder_2=None,
                                                tokenizer_2=None, text_encoder_3=None, tokenizer_3=None)
    theirs.save_pretrained(tmp_path)
    ours = StableDiffusion3Pipeline.from_pretrained(tmp_path, device_mesh=_mesh("dp2xulysses2"),
                                                    vae_mesh=dtorch.DeviceMesh("cpu", [0]))
    rng = np.random.default_rng(3)
    embeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
              [("prompt_embeds", (1, 5, 12)), ("negative_prompt_embeds", (1, 5, 12)),
               ("pooled_prompt_embeds", (1, 10)), ("negative_pooled_prompt_embeds", (1, 10))]}
    latents = rng.standard_normal((1, 4, 6, 10)).astype(np.float32)
    with torch.no_grad():
        want = theirs(**{k: torch.from_numpy(v) for k, v in embeds.items()}, height=12, width=20,
                      num_inference_steps=3, guidance_scale=4.0, latents=torch.from_numpy(latents),
                      output_type="np").images
    got = ours(**embeds, height=12, width=20, num_inference_steps=3, guidance_scale=4.0, latents=latents).images
    np.testing.assert_allclose(got, want, atol=1e-3)
