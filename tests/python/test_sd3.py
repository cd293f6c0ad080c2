"""SD3Transformer2DModel against the numpy reference (sd3_reference.py) on every layout its mesh
dim names give, with uneven sequence pieces; its checkpoints; its errors."""
import json
import os

import numpy as np
import pytest

import dtorch
from dtorch.models import SD3Transformer2DModel
from dtorch.models.transformer_sd3 import sincos_2d

import sd3_reference
from test_architectures import read_safetensors
from diffusion_reference import batch_placements, image_placements

pytestmark = pytest.mark.usefixtures("thread_runtime")

CONFIG = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
              joint_attention_dim=12, caption_projection_dim=16, pooled_projection_dim=10, out_channels=4,
              pos_embed_max_size=8)

MESHES = [((1,), None), ((2,), ("dp",)), ((2,), ("ulysses",)), ((2,), ("ring",)), ((3,), ("ring",)),
          ((2, 2), ("ulysses", "ring")), ((2, 2, 2), ("dp", "ulysses", "ring")),
          ((2,), ("tp",)), ((2, 2), ("tp", "ring")), ((2, 2), ("dp", "tp"))]


def _mesh(shape, names):
    return dtorch.DeviceMesh("cpu", np.arange(int(np.prod(shape))).reshape(shape).tolist(), mesh_dim_names=names)


def _inputs(B, H=6, W=10, T=5, seed=0):
    """A latent of 3 x 5 patches (15 image tokens: uneven on 2, 3 and 4 devices) and 5 text tokens."""
    rng = np.random.default_rng(seed)
    return dict(hidden_states=rng.standard_normal((B, 4, H, W)).astype(np.float32),
                encoder_hidden_states=rng.standard_normal((B, T, 12)).astype(np.float32),
                pooled_projections=rng.standard_normal((B, 10)).astype(np.float32),
                timestep=np.array([999.0, 3.5, 500.0][:B], dtype=np.float32))


def _state(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


# SD3 medium (no q/k norms), SD3.5 large (RMS q/k norms), SD3.5 medium (those and dual attention in
# the first block)
VARIANTS = [dict(qk_norm=None), dict(qk_norm="rms_norm"), dict(qk_norm="rms_norm", dual_attention_layers=(0,))]


@pytest.fixture(scope="module", params=VARIANTS, ids=["sd3", "sd35_large", "sd35_medium"])
def single(request):
    dtorch.manual_seed(5)
    model = SD3Transformer2DModel.from_config(CONFIG, **request.param)
    return model, _state(model)


def _variant(model):
    return dict(qk_norm=model.config.qk_norm, dual_attention_layers=model.config.dual_attention_layers)


def _reference(sd, model, inputs):
    return sd3_reference.transformer(sd, dict(model.config), inputs["hidden_states"], inputs["encoder_hidden_states"],
                                     inputs["pooled_projections"], inputs["timestep"])


def test_module_tree_and_position_table(single):
    model, sd = single
    keys = set(sd)
    for key in ("pos_embed.proj.weight", "pos_embed.pos_embed", "time_text_embed.timestep_embedder.linear_1.weight",
                "time_text_embed.text_embedder.linear_2.bias", "context_embedder.weight",
                "transformer_blocks.0.norm1.linear.weight", "transformer_blocks.0.norm1_context.linear.weight",
                "transformer_blocks.0.attn.add_q_proj.weight", "transformer_blocks.0.attn.to_add_out.weight",
                "transformer_blocks.0.ff_context.net.2.weight", "transformer_blocks.1.attn.to_out.0.weight",
                "norm_out.linear.weight", "proj_out.bias"):
        assert key in keys, key
    # the last block keeps no text stream
    assert "transformer_blocks.1.attn.to_add_out.weight" not in keys
    assert "transformer_blocks.1.ff_context.net.0.proj.weight" not in keys
    assert sd["transformer_blocks.1.norm1_context.linear.weight"].shape == (32, 16)
    if model.config.qk_norm:
        assert "transformer_blocks.0.attn.norm_added_k.weight" in keys
    if model.config.dual_attention_layers:
        # the second attention: image projections and their q/k norms, no text projections; norm1
        # gives nine chunks (the second attention's shift, scale and gate last)
        for key in ("attn2.to_q.weight", "attn2.to_out.0.bias", "attn2.norm_q.weight", "attn2.norm_k.weight"):
            assert "transformer_blocks.0." + key in keys, key
        assert not any(k.startswith("transformer_blocks.0.attn2.add_") for k in keys)
        assert sd["transformer_blocks.0.norm1.linear.weight"].shape == (9 * 16, 16)
    assert not any(k.startswith("transformer_blocks.1.attn2.") for k in keys)
    table = sd3_reference.pos_table(16, 8, 8 // 2)
    np.testing.assert_allclose(sd["pos_embed.pos_embed"][0], table, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(sincos_2d(16, 8, 4), table, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,names", MESHES)
def test_forward_matches_numpy(single, shape, names):
    model, sd = single
    mesh = _mesh(shape, names)
    on_mesh = SD3Transformer2DModel.from_config(CONFIG, device_mesh=mesh, **_variant(model))
    on_mesh.load_state_dict({k: dtorch.distribute_tensor(v, mesh) for k, v in sd.items()})
    for B, T in ((2, 5), (1, 5), (2, 1)):  # batch 1 on dp, one text token on ulysses: an empty piece
        inputs = _inputs(B, T=T)
        out = on_mesh(**inputs).sample
        assert tuple(out.shape) == (B, 4, 6, 10)
        want = _reference(sd, on_mesh, inputs)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("shape,names", MESHES)
@pytest.mark.parametrize("last", [False, True])
def test_one_joint_block_matches_numpy(single, shape, names, last):
    """One JointTransformerBlock alone (and the last, pre-only one), its streams laid out as the model
    lays them: image tokens split on the sequence, text tokens whole, the batch on dp."""
    model, sd = single
    index = 1 if last else 0
    prefix = f"transformer_blocks.{index}."
    mesh = _mesh(shape, names)
    on_mesh = SD3Transformer2DModel.from_config(CONFIG, device_mesh=mesh, **_variant(model))
    on_mesh.load_state_dict({k: dtorch.distribute_tensor(v, mesh) for k, v in sd.items()})
    block = on_mesh.transformer_blocks[index]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 15, 16)).astype(np.float32)
    c = rng.standard_normal((2, 5, 16)).astype(np.float32)
    temb = rng.standard_normal((2, 16)).astype(np.float32)
    place = lambda a, placements: dtorch.distribute_tensor(a, mesh, placements)
    image, batch = image_placements(names), batch_placements(names)
    context, hidden = block(place(x, image), place(c, batch), place(temb, batch))
    want_context, want_hidden = sd3_reference.joint_block(sd, prefix[:-1], x, c, temb, 2, model.config.qk_norm, last,
                                                          dual=index in (model.config.dual_attention_layers or ()))
    assert list(hidden.placements) == image
    np.testing.assert_allclose(hidden.numpy(), want_hidden, rtol=1e-4, atol=1e-5)
    if last:
        assert context is None
    else:
        np.testing.assert_allclose(context.numpy(), want_context, rtol=1e-4, atol=1e-5)


def test_return_tuple_and_dtensor_inputs(single):
    model, sd = single
    inputs = _inputs(2, seed=3)
    mesh = model.device_mesh
    as_tensors = {k: dtorch.distribute_tensor(v, mesh) for k, v in inputs.items()}
    (out,) = model(**as_tensors, return_dict=False)
    np.testing.assert_allclose(out.numpy(), model(**inputs).sample.numpy(), rtol=1e-6, atol=1e-6)


def test_save_and_load(tmp_path, single):
    model, sd = single
    model.save_pretrained(tmp_path / "sd3", max_shard_size="20KB")
    assert (tmp_path / "sd3" / "diffusion_pytorch_model.safetensors.index.json").exists()
    mesh = _mesh((2, 2), ("dp", "ring"))
    loaded = SD3Transformer2DModel.from_pretrained(tmp_path / "sd3", device_mesh=mesh)
    assert set(loaded.state_dict()) == set(sd)
    inputs = _inputs(2)
    np.testing.assert_allclose(loaded(**inputs).sample.numpy(), model(**inputs).sample.numpy(), rtol=1e-5, atol=1e-5)


def test_bad_input(single):
    model, _ = single
    inputs = _inputs(2)
    with pytest.raises(ValueError, match="multiples of the patch size"):
        model(**dict(inputs, hidden_states=inputs["hidden_states"][:, :, :5]))
    with pytest.raises(ValueError, match="larger than the position table"):
        model(**dict(inputs, hidden_states=np.zeros((2, 4, 18, 2), np.float32)))
    with pytest.raises(ValueError, match="encoder_hidden_states must have 3 dims"):
        model(**dict(inputs, encoder_hidden_states=inputs["encoder_hidden_states"][0]))
    with pytest.raises(TypeError, match="needs encoder_hidden_states"):
        model(inputs["hidden_states"])
    with pytest.raises(ValueError, match="unknown mesh dim name 'pp'"):
        SD3Transformer2DModel.from_config(CONFIG, device_mesh=_mesh((2,), ("pp",)))
    with pytest.raises(ValueError, match="tp size 4 does not divide the 2 attention heads"):
        SD3Transformer2DModel.from_config(CONFIG, device_mesh=_mesh((4,), ("tp",)))
    with pytest.raises(ValueError, match="ulysses size 2 does not divide the 1 attention heads of each tp device"):
        SD3Transformer2DModel.from_config(CONFIG, device_mesh=_mesh((2, 2), ("tp", "ulysses")))
    with pytest.raises(ValueError, match="ulysses size 4 does not divide the 2 attention heads"):
        SD3Transformer2DModel.from_config(CONFIG, device_mesh=_mesh((4,), ("ulysses",)))
    with pytest.raises(TypeError, match="unknown config argument 'num_heads'"):
        SD3Transformer2DModel.from_config(CONFIG, num_heads=3)


# ---- SD3.5 medium against diffusers ----------------------------------------------------------------------

SD35 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "sd35")


def _sd35_expected():
    with np.load(os.path.join(SD35, "expected.npz")) as f:
        return {k: f[k] for k in f.files}


def test_sd35_fixture_agrees_with_the_numpy_reference():
    """The stored diffusers output (make_sd35_fixture.py) is what the numpy reference computes from
    the stored weights: reference and fixture check each other, and the dual attention and the q/k
    norms matter (the output without them is far off)."""
    expected = _sd35_expected()
    sd = read_safetensors(os.path.join(SD35, "diffusion_pytorch_model.safetensors"))
    config = SD3Transformer2DModel.make_config(json.load(open(os.path.join(SD35, "config.json"))))
    assert tuple(config.dual_attention_layers) == (0,) and config.qk_norm == "rms_norm"
    args = [expected[k] for k in ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep")]
    want = sd3_reference.transformer(sd, dict(config), *args)
    np.testing.assert_allclose(want, expected["sample"], rtol=1e-4, atol=1e-4 * np.abs(want).max())
    silent = {k: np.zeros_like(v) if k.startswith("transformer_blocks.0.attn2.to_out") else v for k, v in sd.items()}
    for weights, without in ((silent, {}), (sd, dict(qk_norm=None))):
        other = sd3_reference.transformer(weights, dict(config, **without), *args)
        assert np.abs(other - expected["sample"]).max() > 0.05 * np.abs(want).max()


@pytest.mark.parametrize("shape,names", [((1,), None), ((2,), ("dp",)), ((2,), ("ulysses",)), ((2,), ("ring",)),
                                         ((2,), ("tp",)), ((2, 2), ("tp", "ulysses"))])
def test_sd35_checkpoint_from_diffusers(shape, names):
    """SD3.5-medium-shaped weights as diffusers saved them load by their names and give diffusers'
    output, on one device and split on the batch, by Ulysses, by the ring and by tp (each device
    reading its slices of the checkpoint)."""
    expected = _sd35_expected()
    model = SD3Transformer2DModel.from_pretrained(SD35, device_mesh=_mesh(shape, names))
    inputs = {k: expected[k] for k in ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep")}
    out = model(**inputs).sample.numpy()
    want = expected["sample"]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
