"""AutoencoderKL against the independent numpy VAE (vae_reference.py): state_dict keys and shapes
equal a diffusers checkpoint's (tiny configs, and SD's and FLUX's full ones built without values);
decode and encode (mean, logvar, std, var) within 1e-4 relative (float32) on one device and with an
uneven batch (3 rows) split over 2 devices; with and without the quant convs and the mid-block
attention; the posterior's sample (by seed, the same on any mesh); inputs from numpy or from
another mesh laid out onto the VAE's; save_pretrained / from_pretrained; bfloat16 and float16
weights; bad input; worker processes."""
import json

import numpy as np
import pytest

import dtorch
import vae_reference as ref
from dtorch import Replicate, Shard
from dtorch.models import AutoencoderKL, DiagonalGaussianDistribution

TOL = 1e-4
TINY = dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, latent_channels=4)
VARIANTS = {
    "sd": {},
    "flux": dict(latent_channels=8, use_quant_conv=False, use_post_quant_conv=False, layers_per_block=2,
                 scaling_factor=0.3611, shift_factor=0.1159),
    "no_attention": dict(mid_block_add_attention=False),
}
FULL = {
    "sd": dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
               block_out_channels=(128, 256, 512, 512), layers_per_block=2),
}
FULL["flux"] = dict(FULL["sd"], latent_channels=16, use_quant_conv=False, use_post_quant_conv=False)

pytestmark = pytest.mark.usefixtures("thread_runtime")


def tiny(variant):
    return dict(TINY, **VARIANTS[variant])


def mesh_of(n):
    return dtorch.DeviceMesh("cpu", list(range(n)))


def perturbed(model, seed):
    """The model's weights from from_config, its norms moved off their ones and zeros so that they
    take part in the comparison too."""
    rng = np.random.default_rng(seed)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    for k, v in sd.items():
        if "norm" in k:
            sd[k] = (v + 0.2 * rng.standard_normal(v.shape)).astype(np.float32)
    return sd


def build(cfg, n_devices, sd=None, seed=0):
    """(AutoencoderKL on a mesh of n devices, its weights as numpy)."""
    dtorch.manual_seed(seed)
    model = AutoencoderKL.from_config(cfg, device_mesh=mesh_of(n_devices))
    sd = perturbed(model, seed) if sd is None else sd
    model.load_state_dict(sd)
    return model, sd


def rel(got, want):
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def batch_of(n_devices):
    return (Shard(0),) if n_devices > 1 else (Replicate(),)


def inputs(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def latents(cfg, batch=3, size=8):
    return inputs((batch, cfg["latent_channels"], size, size))


def images(cfg, batch=3, size=16):
    return inputs((batch, 3, size, size), seed=2)


@pytest.mark.parametrize("name", [*(f"tiny-{v}" for v in VARIANTS), *(f"full-{v}" for v in FULL)])
def test_state_dict_keys_and_shapes_match_diffusers(name):
    kind, variant = name.split("-")
    cfg = tiny(variant) if kind == "tiny" else FULL[variant]
    with dtorch.nn.meta_device():
        model = AutoencoderKL(AutoencoderKL.make_config(cfg), device_mesh=mesh_of(1))
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == ref.weight_shapes(ref.config(**{k: v for k, v in cfg.items() if k in ref.DEFAULTS}))
    assert ("quant_conv.weight" in got) == AutoencoderKL.make_config(cfg).use_quant_conv


@pytest.mark.parametrize("n_devices", [1, 2])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decode_matches_reference(variant, n_devices):
    cfg = tiny(variant)
    model, sd = build(cfg, n_devices)
    z = latents(cfg)
    out = model.decode(z).sample
    assert out.shape == (3, 3, 16, 16)
    assert out.placements == batch_of(n_devices)
    assert rel(out.numpy(), ref.decode(sd, cfg, z)) < TOL
    (plain,) = model.decode(z, return_dict=False)
    assert np.array_equal(plain.numpy(), out.numpy())


@pytest.mark.parametrize("n_devices", [1, 2])
@pytest.mark.parametrize("variant", ["sd", "flux"])
def test_encode_matches_reference(variant, n_devices):
    cfg = tiny(variant)
    model, sd = build(cfg, n_devices)
    x = images(cfg)
    posterior = model.encode(x).latent_dist
    mean, logvar, std, var = ref.encode(sd, cfg, x)
    assert posterior.mean.shape == (3, cfg["latent_channels"], 8, 8)
    assert posterior.mean.placements == batch_of(n_devices)
    for got, want in ((posterior.mean, mean), (posterior.logvar, logvar), (posterior.std, std),
                      (posterior.var, var), (posterior.mode(), mean)):
        assert rel(got.numpy(), want) < TOL
    (plain,) = model.encode(x, return_dict=False)
    assert np.array_equal(plain.mean.numpy(), posterior.mean.numpy())


def test_forward_and_posterior_sample():
    cfg = tiny("sd")
    model, sd = build(cfg, 2)
    x = images(cfg)
    mean, _, std, _ = ref.encode(sd, cfg, x)
    assert rel(model(x).sample.numpy(), ref.decode(sd, cfg, mean)) < TOL
    posterior = model.encode(x).latent_dist
    a, b = posterior.sample(seed=7).numpy(), posterior.sample(seed=7).numpy()
    assert np.array_equal(a, b) and not np.array_equal(a, posterior.sample(seed=8).numpy())
    dtorch.manual_seed(7)
    noise = dtorch.randn(*mean.shape, device_mesh=mesh_of(1)).numpy()
    assert rel(a, mean + std * noise) < TOL
    one, _ = build(cfg, 1, sd)
    assert rel(one.encode(x).latent_dist.sample(seed=7).numpy(), a) < TOL
    sampled = model(x, sample_posterior=True, seed=7).sample
    assert rel(sampled.numpy(), ref.decode(sd, cfg, mean + std * noise)) < TOL
    fixed = DiagonalGaussianDistribution(posterior.parameters, deterministic=True)
    assert not fixed.std.numpy().any() and not fixed.var.numpy().any()
    assert np.array_equal(fixed.sample(seed=7).numpy(), posterior.mean.numpy())


def test_inputs_are_laid_out_on_the_vae_mesh():
    """numpy (any float dtype) and DTensors on another mesh or in other placements come in with the
    batch split over the VAE's devices; a batch of 1 leaves the second device an empty piece; on a
    2-D mesh (a transformer's dp x ulysses) the batch is split over both dims."""
    cfg = tiny("sd")
    model, sd = build(cfg, 2)
    z = latents(cfg)
    want = ref.decode(sd, cfg, z)
    elsewhere = dtorch.distribute_tensor(z, dtorch.DeviceMesh("cpu", [5]))
    replicated = dtorch.distribute_tensor(z, model.device_mesh, [Replicate()])
    for given in (elsewhere, replicated, z.astype(np.float64)):
        out = model.decode(given).sample
        assert out.device_mesh == model.device_mesh and out.placements == (Shard(0),)
        assert rel(out.numpy(), want) < TOL
    single = model.decode(z[:1]).sample
    assert single.shape == (1, 3, 16, 16)
    assert rel(single.numpy(), want[:1]) < TOL
    on_grid = AutoencoderKL.from_config(cfg, device_mesh=dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=(
        "dp", "ulysses")))
    on_grid.load_state_dict(sd)
    out = on_grid.decode(z).sample
    assert out.placements == (Shard(0), Shard(0))
    assert rel(out.numpy(), want) < TOL


def test_save_and_load_round_trip(tmp_path):
    cfg = tiny("flux")
    model, sd = build(cfg, 1)
    model.save_pretrained(tmp_path / "vae")
    loaded = AutoencoderKL.from_pretrained(str(tmp_path), subfolder="vae", device_mesh=mesh_of(2))
    assert loaded.config == json.loads(json.dumps(model.config))   # tuples come back as lists, as in diffusers
    assert loaded.config.shift_factor == 0.1159 and loaded.config.use_quant_conv is False
    state = loaded.state_dict()
    assert list(state) == list(model.state_dict())
    assert all(np.array_equal(state[k].numpy(), v) for k, v in sd.items())
    z, x = latents(cfg), images(cfg)
    assert rel(loaded.decode(z).sample.numpy(), model.decode(z).sample.numpy()) < 1e-6
    assert rel(loaded.encode(x).latent_dist.mean.numpy(), model.encode(x).latent_dist.mean.numpy()) < 1e-6


@pytest.mark.parametrize("dtype, tol", [("bfloat16", 3e-2), ("float16", 5e-3)])
def test_16_bit_weights(dtype, tol, tmp_path):
    """A 16-bit VAE against the reference run on its own (rounded) weights; a checkpoint keeps its
    dtype through save_pretrained / from_pretrained."""
    cfg = tiny("sd")
    dtorch.manual_seed(3)
    model = AutoencoderKL.from_config(cfg, device_mesh=mesh_of(2), dtype=dtype)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    z, x = latents(cfg), images(cfg)
    out = model.decode(z).sample
    assert out.dtype == getattr(dtorch, dtype)
    assert rel(out.numpy(), ref.decode(sd, cfg, z)) < tol
    assert rel(model.encode(x).latent_dist.mean.numpy(), ref.encode(sd, cfg, x)[0]) < tol
    model.save_pretrained(tmp_path)
    assert AutoencoderKL.from_pretrained(str(tmp_path)).dtype == getattr(dtorch, dtype)


def test_bad_input_and_config():
    cfg = tiny("sd")
    model, _ = build(cfg, 1)
    with pytest.raises(ValueError, match=r"decode: z must be \(batch, 4, height, width\), got shape \(3, 3, 8, 8\)"):
        model.decode(np.zeros((3, 3, 8, 8), np.float32))
    with pytest.raises(ValueError, match=r"encode: x must be \(batch, 3, height, width\)"):
        model.encode(dtorch.zeros(2, 4, 16, 16, device_mesh=mesh_of(1)))
    with pytest.raises(ValueError, match=r"got shape \(4, 8, 8\)"):
        model.decode(np.zeros((4, 8, 8), np.float32))
    with pytest.raises(TypeError, match="unknown config argument 'latent_dim'"):
        AutoencoderKL.from_config(cfg, latent_dim=4)
    with pytest.raises(NotImplementedError, match="AttnDownEncoderBlock2D"):
        AutoencoderKL.from_config(cfg, down_block_types=("AttnDownEncoderBlock2D", "DownEncoderBlock2D"))
    with pytest.raises(ValueError, match="block_out_channels"):
        AutoencoderKL.from_config(cfg, block_out_channels=(8, 16, 16))


def test_mesh_dim_names():
    """Named dims are the diffusion models' (a pipeline hands the VAE its transformer's mesh): the
    batch is split on each of size > 1; an unknown name is a ValueError naming it, however the VAE
    is made; an unnamed mesh splits the batch on every dim as before."""
    cfg = tiny("sd")
    _, sd = build(cfg, 1)
    z = latents(cfg, batch=5)
    want = ref.decode(sd, cfg, z)
    for names in (("dp", "ulysses"), ("ring", "dp"), None):
        mesh = dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
        model = AutoencoderKL.from_config(cfg, device_mesh=mesh)
        model.load_state_dict(sd)
        out = model.decode(z).sample
        assert out.placements == (Shard(0), Shard(0))
        assert rel(out.numpy(), want) < TOL
    for names in (("pp",), ("dp", "cp")):
        mesh = dtorch.init_device_mesh("cpu", (2,) * len(names), mesh_dim_names=names)
        bad = names[-1]
        with pytest.raises(ValueError, match=f"AutoencoderKL: unknown mesh dim name '{bad}'"):
            AutoencoderKL.from_config(cfg, device_mesh=mesh)
        with pytest.raises(ValueError, match=f"AutoencoderKL: unknown mesh dim name '{bad}'"):
            AutoencoderKL(AutoencoderKL.make_config(cfg), device_mesh=mesh)


def test_unknown_mesh_dim_name_when_loading(tmp_path):
    cfg = tiny("sd")
    model, _ = build(cfg, 1)
    model.save_pretrained(tmp_path)
    mesh = dtorch.init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
    with pytest.raises(ValueError, match="AutoencoderKL: unknown mesh dim name 'pp'"):
        AutoencoderKL.from_pretrained(str(tmp_path), device_mesh=mesh)


def test_two_devices_in_each_worker_mode(mode):
    cfg = tiny("sd")
    model, sd = build(cfg, 2)
    z, x = latents(cfg), images(cfg)
    assert rel(model.decode(z).sample.numpy(), ref.decode(sd, cfg, z)) < TOL
    assert rel(model.encode(x).latent_dist.mean.numpy(), ref.encode(sd, cfg, x)[0]) < TOL
