"""FluxTransformer2DModel against the independent numpy reference (flux_reference.py, diffusers'
joint-sequence form) on one device and over dp, ulysses and ring and their products, with image
token counts that split unevenly and an empty dp shard; the rotary tables; a checkpoint round trip;
bad inputs and layouts."""
import json
import os

import numpy as np
import pytest

import dtorch
from dtorch.models import FluxTransformer2DModel
from dtorch.models.transformer_flux import rotary_table

import flux_reference as ref
from diffusion_reference import batch_placements, image_placements

pytestmark = pytest.mark.usefixtures("thread_runtime")

CONFIG = dict(in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
              joint_attention_dim=12, pooled_projection_dim=10, axes_dims_rope=(4, 6, 6))
INNER = 2 * 16

# name -> (mesh shape, dim names); None: one unnamed device
MESHES = {
    "one": None,
    "dp2": ((2,), ("dp",)),
    "ulysses2": ((2,), ("ulysses",)),
    "ring2": ((2,), ("ring",)),
    "ulysses2xring2": ((2, 2), ("ulysses", "ring")),
    "dp2xulysses2xring2": ((2, 2, 2), ("dp", "ulysses", "ring")),
    "tp2": ((2,), ("tp",)),
    "tp2xring2": ((2, 2), ("tp", "ring")),
    "dp2xtp2": ((2, 2), ("dp", "tp")),
}


def make_mesh_dims(shape, names):
    return dtorch.DeviceMesh("cpu", np.arange(int(np.prod(shape))).reshape(shape).tolist(), mesh_dim_names=names)


def make_mesh(name):
    return dtorch.DeviceMesh("cpu", [0]) if MESHES[name] is None else make_mesh_dims(*MESHES[name])


_models = {}


def model_on(name, guidance_embeds):
    """A model with fresh weights on mesh ``name`` and its state dict as numpy, made once per module."""
    key = (name, guidance_embeds)
    if key not in _models:
        model = FluxTransformer2DModel.from_config(CONFIG, guidance_embeds=guidance_embeds, device_mesh=make_mesh(name))
        _models[key] = model, {k: v.numpy() for k, v in model.state_dict().items()}
    return _models[key]


def inputs(batch, n_image, n_text=5, guidance=True, seed=0):
    """Random inputs; image ids on a 3-wide grid as FLUX packs them, text ids nonzero so that the
    text's rotary embedding is exercised too."""
    rng = np.random.default_rng(seed)
    img_ids = np.zeros((n_image, 3), np.float32)
    img_ids[:, 1], img_ids[:, 2] = np.arange(n_image) // 3, np.arange(n_image) % 3
    return dict(hidden_states=rng.standard_normal((batch, n_image, CONFIG["in_channels"])).astype(np.float32),
                encoder_hidden_states=rng.standard_normal((batch, n_text, CONFIG["joint_attention_dim"])).astype(
                    np.float32),
                pooled_projections=rng.standard_normal((batch, CONFIG["pooled_projection_dim"])).astype(np.float32),
                timestep=rng.uniform(0, 1, batch).astype(np.float32),
                img_ids=img_ids,
                txt_ids=rng.integers(0, 4, (n_text, 3)).astype(np.float32),
                guidance=np.full(batch, 3.5, np.float32) if guidance else None)


def relative_error(got, want):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)) if want.size else 0.0


def check(got, want, tol=1e-4):
    err = relative_error(got, want)
    assert err < tol, f"relative error {err:.2e}"


def reference_output(sd, model, x):
    return ref.model(sd, dict(model.config), x["hidden_states"], x["encoder_hidden_states"],
                     x["pooled_projections"], x["timestep"], x["img_ids"], x["txt_ids"], x["guidance"])


# ---- rotary tables -------------------------------------------------------------------------------------

def test_rotary_tables_match_the_reference():
    ids = np.concatenate([inputs(1, 9)["txt_ids"], inputs(1, 9)["img_ids"], [[0, 40, 63]]]).astype(np.float32)
    cos, sin = rotary_table(CONFIG["axes_dims_rope"], ids)
    want_cos, want_sin = ref.rope(CONFIG["axes_dims_rope"], ids)
    assert cos.dtype == np.float32 and cos.shape == (len(ids), 16)
    np.testing.assert_allclose(cos, want_cos, atol=1e-6)
    np.testing.assert_allclose(sin, want_sin, atol=1e-6)


def test_rotary_tables_made_once_per_ids():
    model, _ = model_on("ulysses2xring2", False)
    x = inputs(2, 7, guidance=False)
    first = model._rotary_emb(x["img_ids"], x["txt_ids"], 7, 5)
    assert model._rotary_emb(x["img_ids"].copy(), x["txt_ids"].copy(), 7, 5) is first
    cos = first[0][0]
    assert tuple(cos.shape) == (1, 1, 7, 16)
    assert cos.placements == (dtorch.Shard(2), dtorch.Shard(2))
    text_cos = first[1][0]   # the text tokens split over ulysses too, whole along the ring
    assert text_cos.placements == (dtorch.Shard(2), dtorch.Replicate())


# ---- blocks ----------------------------------------------------------------------------------------------

def text_placements(names):
    """How parallelize_flux lays out the text tokens: the batch Shard(0) on dp, the sequence
    Shard(1) on ulysses (split with the image's), whole on ring (a joint block every device sees)
    and tp."""
    if not names:
        return [dtorch.Replicate()]
    return [{"dp": dtorch.Shard(0), "ulysses": dtorch.Shard(1)}.get(n, dtorch.Replicate()) for n in names]


def block_inputs(model, batch, n_image, n_text=5, seed=1):
    """Image and text tokens, temb and the rotary tables laid out on the model's mesh, and as numpy."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((batch, n_image, INNER)).astype(np.float32)
    c = rng.standard_normal((batch, n_text, INNER)).astype(np.float32)
    temb = rng.standard_normal((batch, INNER)).astype(np.float32)
    x = inputs(batch, n_image, n_text)
    mesh, names = model.device_mesh, model.device_mesh.mesh_dim_names
    image, batch = image_placements(names), batch_placements(names)
    placed = (dtorch.distribute_tensor(h, mesh, image), dtorch.distribute_tensor(c, mesh, text_placements(names)),
              dtorch.distribute_tensor(temb, mesh, batch),
              model._rotary_emb(x["img_ids"], x["txt_ids"], n_image, n_text))
    cos, sin = ref.rope(CONFIG["axes_dims_rope"], np.concatenate([x["txt_ids"], x["img_ids"]]))
    return placed, (h, c, temb, cos, sin)


@pytest.mark.parametrize("name", list(MESHES))
def test_double_block(name):
    model, sd = model_on(name, False)
    (h, c, temb, rotary), (nh, nc, ntemb, cos, sin) = block_inputs(model, 2, 7)
    got_c, got_h = model.transformer_blocks[0](h, c, temb, rotary)
    assert got_h.placements == h.placements and got_c.placements == c.placements
    want_c, want_h = ref.double_block(sd, "transformer_blocks.0", nh, nc, ntemb, 2, cos, sin)
    check(got_h.numpy(), want_h)
    check(got_c.numpy(), want_c)


@pytest.mark.parametrize("name", list(MESHES))
def test_single_block(name):
    model, sd = model_on(name, False)
    (h, c, temb, rotary), (nh, nc, ntemb, cos, sin) = block_inputs(model, 2, 9)
    got_c, got_h = model.single_transformer_blocks[1](h, c, temb, rotary)
    assert got_h.placements == h.placements and got_c.placements == c.placements
    want = ref.single_block(sd, "single_transformer_blocks.1", np.concatenate([nc, nh], axis=1), ntemb, 2, cos, sin)
    check(got_c.numpy(), want[:, :5])
    check(got_h.numpy(), want[:, 5:])


# ---- the whole model ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("guidance", [False, True], ids=["schnell", "dev"])
@pytest.mark.parametrize("name", list(MESHES))
def test_model(name, guidance):
    model, sd = model_on(name, guidance)
    for batch, n_image in ((2, 7), (2, 9)):
        x = inputs(batch, n_image, guidance=guidance, seed=n_image)
        out = model(**x)
        assert isinstance(out, dtorch.models.modeling_diffusers.Transformer2DModelOutput)
        sample = out.sample
        assert isinstance(sample, dtorch.DTensor) and tuple(sample.shape) == (batch, n_image, 8)
        assert sample.placements == tuple(batch_placements(model.device_mesh.mesh_dim_names))
        check(sample.numpy(), reference_output(sd, model, x))


@pytest.mark.parametrize("name", ["ulysses2", "dp2xulysses2xring2"])
def test_text_tokens_split_over_ulysses_with_an_empty_piece(name):
    """The text tokens split over ulysses with the image's: one text token leaves the second
    device of each ulysses pair with none (an empty piece through the all-to-all and back), and
    three split 2 and 1; the sample is the reference's either way."""
    model, sd = model_on(name, True)
    for n_text in (1, 3):
        x = inputs(2, 7, n_text=n_text, seed=n_text)
        check(model(**x).sample.numpy(), reference_output(sd, model, x))


def test_empty_dp_shard_and_tuple_output():
    """A batch of 1 over dp2 leaves the second row of devices with nothing; 3-D ids (diffusers' older
    spelling) are read as their first row; DTensor inputs are taken as they are laid out."""
    model, sd = model_on("dp2", True)
    x = inputs(1, 7, seed=3)
    want = reference_output(sd, model, x)
    mesh = model.device_mesh
    placed = dict(x, hidden_states=dtorch.distribute_tensor(x["hidden_states"], mesh, [dtorch.Shard(0)]),
                  img_ids=x["img_ids"][None], txt_ids=dtorch.distribute_tensor(x["txt_ids"], mesh))
    (sample,) = model(**placed, return_dict=False)
    assert tuple(sample.shape) == (1, 7, 8)
    check(sample.numpy(), want)


def test_config_defaults_are_diffusers():
    assert FluxTransformer2DModel.config_defaults == dict(
        patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=False,
        axes_dims_rope=(16, 56, 56))


def test_out_channels_and_patch_size():
    model = FluxTransformer2DModel.from_config(CONFIG, out_channels=3, patch_size=2)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    assert sd["proj_out.weight"].shape == (12, INNER)
    x = inputs(2, 4, guidance=False)
    check(model(**x).sample.numpy(), reference_output(sd, model, x))


@pytest.mark.parametrize("dtype, tol", [("bfloat16", 1e-1), ("float16", 1e-2)])
def test_half_precision(dtype, tol):
    """Weights and activations in 16 bits, the rotary tables in float32 as diffusers keeps them."""
    model = FluxTransformer2DModel.from_config(CONFIG, guidance_embeds=True, dtype=dtype,
                                               device_mesh=make_mesh("ulysses2"))
    sd = {k: v.to(dtorch.float32).numpy() for k, v in model.state_dict().items()}
    x = inputs(2, 7, seed=8)
    sample = model(**x).sample
    assert sample.dtype is getattr(dtorch, dtype)
    check(sample.to(dtorch.float32).numpy(), reference_output(sd, model, x), tol)


# ---- checkpoints -------------------------------------------------------------------------------------------

def test_save_and_load_round_trip(tmp_path):
    mesh = make_mesh_dims((2, 2), ("dp", "ulysses"))
    model = FluxTransformer2DModel.from_config(CONFIG, guidance_embeds=True, device_mesh=mesh)
    model.save_pretrained(str(tmp_path / "transformer"))
    with open(tmp_path / "transformer" / "config.json") as f:
        assert json.load(f)["_class_name"] == "FluxTransformer2DModel"
    loaded = FluxTransformer2DModel.from_pretrained(str(tmp_path), subfolder="transformer", device_mesh=mesh)
    saved, back = model.state_dict(), loaded.state_dict()
    assert list(back) == list(saved)
    for key in saved:
        np.testing.assert_array_equal(back[key].numpy(), saved[key].numpy())
    x = inputs(2, 9, seed=5)
    np.testing.assert_array_equal(loaded(**x).sample.numpy(), model(**x).sample.numpy())


def test_sharded_checkpoint_loads(tmp_path):
    model, sd = model_on("one", False)
    model.save_pretrained(str(tmp_path), max_shard_size="40KB")
    assert os.path.exists(tmp_path / "diffusion_pytorch_model.safetensors.index.json")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
    loaded = FluxTransformer2DModel.from_pretrained(str(tmp_path), device_mesh=make_mesh_dims((2,), ("ulysses",)))
    x = inputs(2, 7, guidance=False, seed=6)
    check(loaded(**x).sample.numpy(), reference_output(sd, model, x))


# ---- bad inputs and layouts -----------------------------------------------------------------------------------

def test_wrong_ids_shape():
    model, _ = model_on("one", False)
    x = inputs(2, 7, guidance=False)
    with pytest.raises(ValueError, match=r"img_ids must be \(7, 3\).*\(7, 2\)"):
        model(**dict(x, img_ids=x["img_ids"][:, :2]))
    with pytest.raises(ValueError, match=r"txt_ids must be \(5, 3\).*\(4, 3\)"):
        model(**dict(x, txt_ids=x["txt_ids"][:4]))
    with pytest.raises(ValueError, match="img_ids"):
        model(**dict(x, img_ids=x["img_ids"].reshape(-1)))


def test_guidance_given_to_the_wrong_model():
    schnell, _ = model_on("one", False)
    with pytest.raises(ValueError, match="give no guidance"):
        schnell(**inputs(2, 7, guidance=True))
    dev, _ = model_on("one", True)
    with pytest.raises(ValueError, match="give guidance"):
        dev(**inputs(2, 7, guidance=False))


def test_tp_not_dividing_heads():
    with pytest.raises(ValueError, match="tp size 3 does not divide the 2 attention heads"):
        FluxTransformer2DModel.from_config(CONFIG, device_mesh=make_mesh_dims((3,), ("tp",)))
    with pytest.raises(ValueError, match="ulysses size 2 does not divide the 1 attention heads of each tp device"):
        FluxTransformer2DModel.from_config(CONFIG, device_mesh=make_mesh_dims((2, 2), ("ulysses", "tp")))
    with pytest.raises(ValueError, match="unknown mesh dim name 'pp'"):
        FluxTransformer2DModel.from_config(CONFIG, device_mesh=make_mesh_dims((2,), ("pp",)))


def test_ulysses_not_dividing_heads():
    with pytest.raises(ValueError, match="ulysses size 4 does not divide the 2 attention heads"):
        FluxTransformer2DModel.from_config(CONFIG, device_mesh=make_mesh_dims((4,), ("ulysses",)))


def test_rotary_axes_not_adding_up_to_head_dim():
    with pytest.raises(ValueError, match="axes_dims_rope"):
        FluxTransformer2DModel.from_config(CONFIG, axes_dims_rope=(4, 6, 4))


# ---- worker processes (restarts the runtime: keep last) --------------------------------------------------------

def test_worker_modes(mode):
    model = FluxTransformer2DModel.from_config(CONFIG, guidance_embeds=True,
                                               device_mesh=make_mesh_dims((2,), ("ulysses",)))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    x = inputs(2, 7, seed=7)
    check(model(**x).sample.numpy(), reference_output(sd, model, x))
