"""The SD3 and FLUX pipelines end to end on tiny random-weight models, against a numpy pipeline
written here from diffusers' semantics (the schedule by its formulas, classifier-free guidance,
FLUX's latent packing and ids) over the numpy transformers and VAE of the other references, on
every layout the transformer's mesh dim names give; the VAE on one device or on the whole mesh."""
import numpy as np
import pytest

import dtorch
from dtorch.models import FluxTransformer2DModel, SD3Transformer2DModel
from dtorch.models.autoencoder_kl import AutoencoderKL
from dtorch.pipelines import FluxPipeline, StableDiffusion3Pipeline, save_png
from dtorch.schedulers import FlowMatchEulerDiscreteScheduler

import flux_reference
import sd3_reference
import vae_reference

pytestmark = pytest.mark.usefixtures("thread_runtime")

SD3 = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
           joint_attention_dim=12, caption_projection_dim=16, pooled_projection_dim=10, out_channels=4,
           pos_embed_max_size=8, qk_norm="rms_norm")
FLUX = dict(in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=12, pooled_projection_dim=10, axes_dims_rope=(4, 6, 6), guidance_embeds=True)
VAE = dict(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
           up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4, layers_per_block=1,
           scaling_factor=1.5, shift_factor=0.1, use_quant_conv=False, use_post_quant_conv=False)

MESHES = [((1,), None), ((2,), ("dp",)), ((2,), ("ulysses",)), ((2,), ("ring",)), ((2, 2), ("ulysses", "ring")),
          ((2, 2, 2), ("dp", "ulysses", "ring"))]
STEPS = 3


def _mesh(shape, names):
    return dtorch.DeviceMesh("cpu", np.arange(int(np.prod(shape))).reshape(shape).tolist(), mesh_dim_names=names)


def _state(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def weights():
    dtorch.manual_seed(9)
    return (_state(SD3Transformer2DModel.from_config(SD3)), _state(FluxTransformer2DModel.from_config(FLUX)),
            _state(AutoencoderKL.from_config(VAE)))


def _on(cls, config, state, mesh):
    model = cls.from_config(config, device_mesh=mesh)
    model.load_state_dict({k: dtorch.distribute_tensor(v, mesh) for k, v in state.items()})
    return model


def _embeds(rng, B, T=5):
    return dict(prompt_embeds=rng.standard_normal((B, T, 12)).astype(np.float32),
                pooled_prompt_embeds=rng.standard_normal((B, 10)).astype(np.float32))


def _shifted(sigmas, shift):
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def _image(vae_state, latents):
    z = latents / VAE["scaling_factor"] + VAE["shift_factor"]
    image = vae_reference.decode(vae_state, vae_reference.config(**VAE), z)
    return np.clip(image / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)


def sd3_reference_pipeline(state, vae_state, latents, embeds, negative, guidance_scale, shift):
    """Euler steps over SD3's static-shift schedule with classifier-free guidance."""
    sigma_min = _shifted(1 / 1000, shift)
    sigmas = np.append(_shifted(np.linspace(1.0, sigma_min, STEPS), shift), 0.0)
    x, B = latents.astype(np.float64), latents.shape[0]
    context = np.concatenate([negative["prompt_embeds"], embeds["prompt_embeds"]])
    pooled = np.concatenate([negative["pooled_prompt_embeds"], embeds["pooled_prompt_embeds"]])
    for i in range(STEPS):
        v = sd3_reference.transformer(state, SD3, np.concatenate([x, x]), context, pooled,
                                      np.full(2 * B, sigmas[i] * 1000))
        v = v[:B] + guidance_scale * (v[B:] - v[:B])
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    return _image(vae_state, x)


def flux_reference_pipeline(state, vae_state, noise, embeds, guidance_scale, h, w):
    """FLUX: the latents packed in 2 x 2 patches, sigmas 1 .. 1/steps under the dynamic shift of the
    token count, the guidance as an embedding."""
    B, C = noise.shape[:2]
    x = noise.reshape(B, C, h, 2, w, 2).transpose(0, 2, 4, 1, 3, 5).reshape(B, h * w, 4 * C).astype(np.float64)
    img_ids = np.stack([np.zeros((h, w)), np.arange(h)[:, None] + np.zeros((h, w)),
                        np.arange(w)[None, :] + np.zeros((h, w))], -1).reshape(h * w, 3)
    txt_ids = np.zeros((embeds["prompt_embeds"].shape[1], 3))
    m = (1.15 - 0.5) / (4096 - 256)
    mu = h * w * m + 0.5 - m * 256
    t = np.linspace(1.0, 1 / STEPS, STEPS)
    sigmas = np.append(np.exp(mu) / (np.exp(mu) + (1 / t - 1)), 0.0)
    for i in range(STEPS):
        v = flux_reference.model(state, FLUX, x, embeds["prompt_embeds"], embeds["pooled_prompt_embeds"],
                                 np.full(B, sigmas[i]), img_ids, txt_ids, np.full(B, guidance_scale))
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    latents = x.reshape(B, h, w, C, 2, 2).transpose(0, 3, 1, 4, 2, 5).reshape(B, C, 2 * h, 2 * w)
    return _image(vae_state, latents)


@pytest.mark.parametrize("shape,names", MESHES)
def test_sd3_pipeline_matches_numpy(weights, shape, names):
    sd3_state, _, vae_state = weights
    mesh = _mesh(shape, names)
    vae_mesh = dtorch.DeviceMesh("cpu", [0]) if len(shape) > 1 else mesh
    pipe = StableDiffusion3Pipeline(_on(SD3Transformer2DModel, SD3, sd3_state, mesh),
                                    FlowMatchEulerDiscreteScheduler(shift=3.0),
                                    _on(AutoencoderKL, VAE, vae_state, vae_mesh))
    rng = np.random.default_rng(1)
    embeds, negative = _embeds(rng, 1), _embeds(rng, 1)
    latents = rng.standard_normal((1, 4, 6, 10)).astype(np.float32)          # 3 x 5 patches: uneven pieces
    out = pipe(**embeds, negative_prompt_embeds=negative["prompt_embeds"],
               negative_pooled_prompt_embeds=negative["pooled_prompt_embeds"], height=12, width=20,
               num_inference_steps=STEPS, guidance_scale=4.0, latents=latents).images
    want = sd3_reference_pipeline(sd3_state, vae_state, latents, embeds, negative, 4.0, 3.0)
    assert out.shape == (1, 12, 20, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, atol=2e-4)


@pytest.mark.parametrize("shape,names", MESHES)
def test_flux_pipeline_matches_numpy(weights, shape, names):
    _, flux_state, vae_state = weights
    mesh = _mesh(shape, names)
    pipe = FluxPipeline(_on(FluxTransformer2DModel, FLUX, flux_state, mesh),
                        FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift=3.0),
                        _on(AutoencoderKL, VAE, vae_state, dtorch.DeviceMesh("cpu", [0])))
    rng = np.random.default_rng(2)
    embeds = _embeds(rng, 2)
    noise = rng.standard_normal((2, 4, 6, 10)).astype(np.float32)           # 3 x 5 packed tokens
    # the noise as FLUX draws it: (B, C, H, W) in the latent space, packed by the pipeline
    from dtorch.pipelines import pack_latents
    latents = pack_latents(dtorch.distribute_tensor(noise, pipe.mesh))
    out = pipe(**embeds, height=12, width=20, num_inference_steps=STEPS, guidance_scale=3.5, latents=latents).images
    want = flux_reference_pipeline(flux_state, vae_state, noise, embeds, 3.5, 3, 5)
    assert out.shape == (2, 12, 20, 3)
    np.testing.assert_allclose(out, want, atol=2e-4)


def test_seeded_noise_uint8_and_png(weights, tmp_path):
    sd3_state, _, vae_state = weights
    mesh = _mesh((2,), ("dp",))
    pipe = StableDiffusion3Pipeline(_on(SD3Transformer2DModel, SD3, sd3_state, mesh),
                                    FlowMatchEulerDiscreteScheduler(shift=3.0), _on(AutoencoderKL, VAE, vae_state, mesh))
    embeds = _embeds(np.random.default_rng(3), 2)
    a = pipe(**embeds, height=8, width=8, num_inference_steps=2, seed=7, output_type="uint8").images
    b = pipe(**embeds, height=8, width=8, num_inference_steps=2, seed=7, output_type="uint8").images
    assert a.dtype == np.uint8 and a.shape == (2, 8, 8, 3)
    np.testing.assert_array_equal(a, b)
    latents = pipe(**embeds, height=8, width=8, num_inference_steps=2, seed=7, output_type="latent").images
    assert tuple(latents.shape) == (2, 4, 4, 4)
    save_png(a[0], tmp_path / "image.png")
    data = (tmp_path / "image.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert int.from_bytes(data[16:20], "big") == 8 and int.from_bytes(data[20:24], "big") == 8


def test_save_and_load_pipeline(weights, tmp_path):
    sd3_state, _, vae_state = weights
    one = dtorch.DeviceMesh("cpu", [0])
    pipe = StableDiffusion3Pipeline(_on(SD3Transformer2DModel, SD3, sd3_state, one),
                                    FlowMatchEulerDiscreteScheduler(shift=3.0), _on(AutoencoderKL, VAE, vae_state, one))
    pipe.save_pretrained(tmp_path / "pipe")
    loaded = StableDiffusion3Pipeline.from_pretrained(tmp_path / "pipe", device_mesh=_mesh((2,), ("ring",)),
                                                      vae_mesh=one)
    assert loaded.scheduler.config.shift == 3.0
    embeds = _embeds(np.random.default_rng(4), 1)
    call = dict(embeds, height=8, width=8, num_inference_steps=2, seed=1)
    np.testing.assert_allclose(loaded(**call).images, pipe(**call).images, atol=1e-5)


def test_bad_calls(weights):
    sd3_state, _, vae_state = weights
    one = dtorch.DeviceMesh("cpu", [0])
    pipe = StableDiffusion3Pipeline(_on(SD3Transformer2DModel, SD3, sd3_state, one),
                                    FlowMatchEulerDiscreteScheduler(shift=3.0), _on(AutoencoderKL, VAE, vae_state, one))
    embeds = _embeds(np.random.default_rng(5), 1)
    with pytest.raises(ValueError, match=r"pass prompt \(or prompt_embeds"):
        pipe(height=8, width=8)
    with pytest.raises(ValueError, match="multiples of 4"):
        pipe(**embeds, height=10, width=8)
    with pytest.raises(ValueError, match="latents must have shape"):
        pipe(**embeds, height=8, width=8, latents=np.zeros((1, 4, 2, 2), np.float32))
    with pytest.raises(ValueError, match="output_type"):
        pipe(**embeds, height=8, width=8, output_type="pil")
