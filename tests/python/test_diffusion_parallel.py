"""The diffusion models' parallel plans (parallelize_sd3, parallelize_flux, parallelize_vae). Joint
image-text attention as the plan puts it in an attention slot, on every layout the mesh dim names
give, against numpy over the concatenated sequence; ring_attention's joint block on its own; the
plans' errors; and the plans applied from outside to a model already built and run on one device,
which then gives the reference's values over dp x ulysses x ring (the model files are
single-device code: they name no placement that splits and no mesh dim)."""
import ast
import inspect

import numpy as np
import pytest

import dtorch
from dtorch.models import (AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel, parallelize_flux,
                           parallelize_sd3, parallelize_vae)
from dtorch.models import autoencoder_kl, diffusion_layers, transformer_flux, transformer_sd3
from dtorch.models.diffusion_layers import joint_attention
from dtorch.nn import functional as F

import flux_reference
import sd3_reference
import vae_reference
from diffusion_reference import attention, batch_placements, image_placements

H, LT, D = 4, 3, 8
SD3 = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=D, num_attention_heads=H,
           joint_attention_dim=12, caption_projection_dim=H * D, pooled_projection_dim=10, out_channels=4,
           pos_embed_max_size=8)

# (mesh shape, dim names, batch, image tokens): uneven sequence pieces, an empty batch piece on dp
LAYOUTS = [
    ((1,), None, 2, 5),
    ((2,), ("dp",), 1, 6),
    ((2,), ("ulysses",), 2, 7),
    ((2,), ("ring",), 2, 7),
    ((3,), ("ring",), 2, 5),
    ((2,), ("ring",), 1, 1),
    ((2, 2), ("ulysses", "ring"), 2, 9),
    ((2, 2), ("dp", "ring"), 1, 3),
    ((2, 2, 2), ("dp", "ulysses", "ring"), 3, 7),
]


def _mesh(shape, names):
    return dtorch.DeviceMesh("cpu", np.arange(int(np.prod(shape))).reshape(shape).tolist(), mesh_dim_names=names)


def _inputs(rng, B, L):
    return [rng.standard_normal(s).astype(np.float32) for s in [(B, H, L, D)] * 3 + [(B, H, LT, D)] * 3]


def _sd3(mesh):
    """A small SD3 transformer made on ``mesh`` without any plan (its constructor alone)."""
    return SD3Transformer2DModel(SD3Transformer2DModel.make_config(SD3), device_mesh=mesh)


def _planned_attention(mesh):
    """The attention slot of an SD3 block after parallelize_sd3 over ``mesh``."""
    model = parallelize_sd3(_sd3(dtorch.DeviceMesh("cpu", [0])), mesh)
    return model.transformer_blocks[0].attn.attention


@pytest.mark.parametrize("shape,names,B,L", LAYOUTS)
@pytest.mark.parametrize("context_first", [False, True])
def test_joint_attention_matches_numpy(thread_runtime, shape, names, B, L, context_first):
    rng = np.random.default_rng(L * 10 + B)
    arrays = _inputs(rng, B, L)
    mesh = _mesh(shape, names)
    slot = _planned_attention(mesh)
    image, text = image_placements(names, sequence_dim=2), batch_placements(names)
    tensors = [dtorch.distribute_tensor(a, mesh, image if i < 3 else text) for i, a in enumerate(arrays)]
    out, context_out = slot(*tensors, context_first=context_first)
    q, k, v = (np.concatenate([arrays[i + 3], arrays[i]] if context_first else [arrays[i], arrays[i + 3]], axis=2)
               for i in range(3))
    want = attention(q, k, v)
    want_image, want_text = (want[:, :, LT:], want[:, :, :LT]) if context_first else (want[:, :, :L], want[:, :, L:])
    assert list(out.placements) == image and list(context_out.placements) == text
    np.testing.assert_allclose(out.numpy(), want_image, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context_out.numpy(), want_text, rtol=1e-5, atol=1e-6)


def test_joint_attention_without_context(thread_runtime):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, H, 7, D)).astype(np.float32) for _ in range(3))
    mesh = _mesh((2, 2), ("ulysses", "ring"))
    pl = [dtorch.Shard(2), dtorch.Shard(2)]
    out, context_out = _planned_attention(mesh)(*(dtorch.distribute_tensor(a, mesh, pl) for a in (q, k, v)))
    assert context_out is None
    np.testing.assert_allclose(out.numpy(), attention(q, k, v), rtol=1e-5, atol=1e-6)


def test_ring_joint_block_in_both_modes(mode):
    """Prefill (queries split along the ring) and decode (queries whole) with a joint block, worker
    threads and processes."""
    rng = np.random.default_rng(11)
    B, L = 2, 5
    q, k, v, _, jk, jv = _inputs(rng, B, L)
    mesh = _mesh((2,), ("ring",))
    split, whole = [dtorch.Shard(2)], [dtorch.Replicate()]
    zeros = lambda n, pl: dtorch.zeros((1, n), dtype=dtorch.int64, device_mesh=mesh, placements=pl)
    tk, tv = (dtorch.distribute_tensor(a, mesh, split) for a in (k, v))
    tjk, tjv = (dtorch.distribute_tensor(a, mesh, whole) for a in (jk, jv))
    want = attention(q, np.concatenate([jk, k], 2), np.concatenate([jv, v], 2))
    for q_pl, q_index_pl in ((split, [dtorch.Shard(1)]), (whole, whole)):
        out = F.ring_attention(dtorch.distribute_tensor(q, mesh, q_pl), tk, tv, zeros(L, q_index_pl),
                               zeros(L, [dtorch.Shard(1)]), "ring", is_causal=False, joint_key=tjk, joint_value=tjv,
                               joint_index=zeros(LT, whole))
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="joint_key has placements"):
        F.ring_attention(dtorch.distribute_tensor(q, mesh, split), tk, tv, zeros(L, [dtorch.Shard(1)]),
                         zeros(L, [dtorch.Shard(1)]), "ring", is_causal=False, joint_key=tk, joint_value=tv,
                         joint_index=zeros(L, [dtorch.Shard(1)]))


def test_layout_errors(thread_runtime):
    one = dtorch.DeviceMesh("cpu", [0])
    with pytest.raises(ValueError, match="unknown mesh dim name 'pp'"):
        parallelize_sd3(_sd3(one), _mesh((2,), ("pp",)))
    with pytest.raises(ValueError, match="tp size 3 does not divide the 4 attention heads"):
        parallelize_sd3(_sd3(one), _mesh((3,), ("tp",)))
    with pytest.raises(ValueError, match="ulysses size 4 does not divide the 2 attention heads of each tp device"):
        parallelize_sd3(_sd3(one), _mesh((2, 4), ("tp", "ulysses")))
    with pytest.raises(ValueError, match="ulysses size 3 does not divide the 4 attention heads"):
        parallelize_sd3(_sd3(one), _mesh((3,), ("ulysses",)))
    with pytest.raises(ValueError, match="name the dims"):
        parallelize_sd3(_sd3(one), dtorch.DeviceMesh("cpu", [0, 1]))


# ---- the plans applied from outside -------------------------------------------------------------------

FLUX = dict(in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=12, pooled_projection_dim=10, axes_dims_rope=(4, 6, 6), guidance_embeds=True)
VAE = dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
           block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, latent_channels=4)
GRID = ((2, 2, 2), ("dp", "ulysses", "ring"))


def _state(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


def _relative_error(got, want):
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _profiled(fn):
    """(fn(), {op or record name: count} of what devices 0-7 ran, the devices that ran something)."""
    with dtorch.profiler.profile(*range(8)) as prof:
        out = fn()
    events = prof.events()
    names = {}
    for e in events:
        names[e["name"]] = names.get(e["name"], 0) + 1
    return out, names, {e["device"] for e in events}


def test_sd3_built_on_one_device_then_parallelized(mode):
    """The model made by its constructor alone runs on its one device as single-device code; the same
    object laid out afterwards by parallelize_sd3 over dp x ulysses x ring runs on all 8 devices,
    attention as a ring inside the Ulysses head split, and gives the same values (both against the
    numpy reference), the output's batch split on dp."""
    rng = np.random.default_rng(4)
    x = dict(hidden_states=rng.standard_normal((2, 4, 6, 10)).astype(np.float32),
             encoder_hidden_states=rng.standard_normal((2, 5, 12)).astype(np.float32),
             pooled_projections=rng.standard_normal((2, 10)).astype(np.float32),
             timestep=np.array([999.0, 3.5], np.float32))
    model = _sd3(dtorch.DeviceMesh("cpu", [3]))
    sd = _state(model)
    want = sd3_reference.transformer(sd, dict(model.config), x["hidden_states"], x["encoder_hidden_states"],
                                     x["pooled_projections"], x["timestep"])
    out, ops, devices = _profiled(lambda: model(**x).sample.numpy())
    assert devices == {3} and "scaled_dot_product_attention" in ops
    assert _relative_error(out, want) < 1e-4

    mesh = _mesh(*GRID)
    assert parallelize_sd3(model, mesh) is model
    assert model.device_mesh == mesh and all(p.device_mesh == mesh for p in model.parameters())
    sample = model(**x).sample
    assert list(sample.placements) == batch_placements(GRID[1])
    out, ops, devices = _profiled(lambda: model(**x).sample.numpy())
    assert devices == set(range(8))
    assert ops.get("attention_block", 0) > 0 and "scaled_dot_product_attention" not in ops
    assert _relative_error(out, want) < 1e-4
    with pytest.raises(ValueError, match="SD3Transformer2DModel: already laid out over"):
        parallelize_sd3(model, mesh)


def test_flux_built_on_one_device_then_parallelized(thread_runtime):
    rng = np.random.default_rng(6)
    n_image, n_text = 7, 5
    img_ids = np.zeros((n_image, 3), np.float32)
    img_ids[:, 1], img_ids[:, 2] = np.arange(n_image) // 3, np.arange(n_image) % 3
    x = dict(hidden_states=rng.standard_normal((2, n_image, 8)).astype(np.float32),
             encoder_hidden_states=rng.standard_normal((2, n_text, 12)).astype(np.float32),
             pooled_projections=rng.standard_normal((2, 10)).astype(np.float32),
             timestep=np.array([0.9, 0.2], np.float32), img_ids=img_ids,
             txt_ids=rng.integers(0, 4, (n_text, 3)).astype(np.float32), guidance=np.full(2, 3.5, np.float32))
    model = FluxTransformer2DModel(FluxTransformer2DModel.make_config(FLUX), device_mesh=dtorch.DeviceMesh("cpu", [0]))
    sd = _state(model)
    want = flux_reference.model(sd, dict(model.config), x["hidden_states"], x["encoder_hidden_states"],
                                x["pooled_projections"], x["timestep"], x["img_ids"], x["txt_ids"], x["guidance"])
    assert _relative_error(model(**x).sample.numpy(), want) < 1e-4

    mesh = _mesh(*GRID)
    parallelize_flux(model, mesh)
    (cos, _), (context_cos, _) = model._rotary_emb(img_ids, x["txt_ids"], n_image, n_text)
    assert list(cos.placements) == [dtorch.Replicate(), dtorch.Shard(2), dtorch.Shard(2)] and cos.device_mesh == mesh
    # the text's tables split with its tokens over ulysses, whole along the ring
    assert list(context_cos.placements) == [dtorch.Replicate(), dtorch.Shard(2), dtorch.Replicate()]
    out, ops, devices = _profiled(lambda: model(**x).sample)
    assert devices == set(range(8)) and ops.get("attention_block", 0) > 0
    assert list(out.placements) == batch_placements(GRID[1])
    assert _relative_error(out.numpy(), want) < 1e-4


def test_vae_built_on_one_device_then_parallelized(thread_runtime):
    z = np.random.default_rng(2).standard_normal((5, 4, 8, 8)).astype(np.float32)
    for mesh, placements in ((_mesh((2, 2), ("dp", "ring")), [dtorch.Shard(0)] * 2),
                             (dtorch.DeviceMesh("cpu", [0, 1, 2]), [dtorch.Shard(0)])):
        vae = AutoencoderKL(AutoencoderKL.make_config(VAE), device_mesh=dtorch.DeviceMesh("cpu", [0]))
        want = vae_reference.decode(_state(vae), VAE, z)
        out = vae.decode(z).sample
        assert list(out.placements) == [dtorch.Replicate()]
        assert _relative_error(out.numpy(), want) < 1e-4
        parallelize_vae(vae, mesh)
        out = vae.decode(z).sample
        assert out.device_mesh == mesh and list(out.placements) == placements
        assert _relative_error(out.numpy(), want) < 1e-4


@pytest.mark.parametrize("build,parallelize", [
    (lambda mesh: _sd3(mesh), parallelize_sd3),
    (lambda mesh: FluxTransformer2DModel(FluxTransformer2DModel.make_config(FLUX), device_mesh=mesh), parallelize_flux),
    (lambda mesh: AutoencoderKL(AutoencoderKL.make_config(VAE), device_mesh=mesh), parallelize_vae)])
def test_every_plan_refuses_unknown_dim_names(thread_runtime, build, parallelize):
    model = build(dtorch.DeviceMesh("cpu", [0]))
    with pytest.raises(ValueError, match=f"{type(model).__name__}: unknown mesh dim name 'pp'"):
        parallelize(model, _mesh((2, 2), ("dp", "pp")))
    with pytest.raises(ValueError, match=f"{type(model).__name__}: unknown mesh dim name 'pp'"):
        type(model).from_config(dict(model.config), device_mesh=_mesh((2,), ("pp",)))
    with pytest.raises(ValueError, match=f"{type(model).__name__}: unknown mesh dim name 'pp'"):
        build(_mesh((2,), ("pp",)))                                   # at construction, as every model
    wrong = parallelize_vae if parallelize is not parallelize_vae else parallelize_sd3
    with pytest.raises(TypeError, match="expected a"):
        wrong(model, _mesh((2,), ("dp",)))


@pytest.mark.parametrize("module", [diffusion_layers, transformer_sd3, transformer_flux, autoencoder_kl])
def test_model_files_hold_no_parallel_logic(module):
    """The model files import nothing from dtorch.parallel and of diffusion_parallel only the plan
    functions (for ``parallelize``) and the dim-name check, hold no layout object (``parallel``),
    never split a tensor (Shard, Partial) and never name a mesh dim: where a style puts its hooks
    and slots is diffusion_parallel's."""
    tree = ast.parse(inspect.getsource(module))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    plan = {"parallelize_sd3", "parallelize_flux", "parallelize_vae", "mesh_dim_sizes", "vae_mesh_dim_sizes"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "diffusion_parallel":
            assert {alias.name for alias in node.names} <= plan
        elif isinstance(node, ast.ImportFrom):
            assert "parallel" not in (node.module or ""), node.module
        if isinstance(node, (ast.Name, ast.alias, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.name if isinstance(node, ast.alias) else node.attr
            assert name not in ("Shard", "Partial", "parallel", "DiffusionParallel"), name
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            assert node.value not in ("dp", "ulysses", "ring", "tp"), node.value


# ---- tensor parallelism -----------------------------------------------------------------------------

SD35 = dict(SD3, qk_norm="rms_norm", dual_attention_layers=(0,))
TP_LAYOUTS = [((2,), ("tp",)), ((2, 2), ("tp", "ring")), ((2, 2), ("tp", "ulysses")), ((2, 2), ("ulysses", "tp")),
              ((2, 2), ("dp", "tp"))]


def _sd3_inputs(seed):
    rng = np.random.default_rng(seed)
    return dict(hidden_states=rng.standard_normal((2, 4, 6, 10)).astype(np.float32),
                encoder_hidden_states=rng.standard_normal((2, 5, 12)).astype(np.float32),
                pooled_projections=rng.standard_normal((2, 10)).astype(np.float32),
                timestep=np.array([999.0, 3.5], np.float32))


def _flux_inputs(seed, n_image=7, n_text=5):
    rng = np.random.default_rng(seed)
    img_ids = np.zeros((n_image, 3), np.float32)
    img_ids[:, 1], img_ids[:, 2] = np.arange(n_image) // 3, np.arange(n_image) % 3
    return dict(hidden_states=rng.standard_normal((2, n_image, 8)).astype(np.float32),
                encoder_hidden_states=rng.standard_normal((2, n_text, 12)).astype(np.float32),
                pooled_projections=rng.standard_normal((2, 10)).astype(np.float32),
                timestep=np.array([0.9, 0.2], np.float32), img_ids=img_ids,
                txt_ids=rng.integers(0, 4, (n_text, 3)).astype(np.float32), guidance=np.full(2, 3.5, np.float32))


def _on_layout(cls, config, state, shape, names):
    model = cls.from_config(config, device_mesh=_mesh(shape, names))
    model.load_state_dict({k: dtorch.distribute_tensor(v, model.device_mesh) for k, v in state.items()})
    return model


def _sd3_want(model, sd, x):
    return sd3_reference.transformer(sd, dict(model.config), x["hidden_states"], x["encoder_hidden_states"],
                                     x["pooled_projections"], x["timestep"])


def _flux_want(model, sd, x):
    return flux_reference.model(sd, dict(model.config), x["hidden_states"], x["encoder_hidden_states"],
                                x["pooled_projections"], x["timestep"], x["img_ids"], x["txt_ids"], x["guidance"])


def test_tp_layouts_match_one_device_and_numpy(mode):
    """SD3.5 medium's shape (dual attention, q/k norms) over tp2, tp2 x ring2, tp2 x ulysses2 (both
    dim orders) and dp2 x tp2, and FLUX over tp2, tp2 x ring2 and dp2 x tp2: the same output as the
    model on one device and as the numpy reference, in both worker modes."""
    one = dtorch.DeviceMesh("cpu", [0])
    sd3 = SD3Transformer2DModel.from_config(SD35, device_mesh=one)
    sd3_state, x = _state(sd3), _sd3_inputs(8)
    single = sd3(**x).sample.numpy()
    want = _sd3_want(sd3, sd3_state, x)
    assert _relative_error(single, want) < 1e-4
    for shape, names in TP_LAYOUTS:
        out = _on_layout(SD3Transformer2DModel, SD35, sd3_state, shape, names)(**x).sample
        assert list(out.placements) == batch_placements(names), names
        assert _relative_error(out.numpy(), single) < 1e-4 and _relative_error(out.numpy(), want) < 1e-4, names

    flux = FluxTransformer2DModel.from_config(FLUX, device_mesh=one)
    flux_state, x = _state(flux), _flux_inputs(9)
    single = flux(**x).sample.numpy()
    want = _flux_want(flux, flux_state, x)
    assert _relative_error(single, want) < 1e-4
    for shape, names in (((2,), ("tp",)), ((2, 2), ("tp", "ring")), ((2, 2), ("dp", "tp"))):
        out = _on_layout(FluxTransformer2DModel, FLUX, flux_state, shape, names)(**x).sample
        assert list(out.placements) == batch_placements(names), names
        assert _relative_error(out.numpy(), single) < 1e-4 and _relative_error(out.numpy(), want) < 1e-4, names


def test_tp3_on_three_heads(thread_runtime):
    """Three heads over tp3 (each device one head, a third of every MLP), alone and with the ring."""
    sd3_config = dict(SD35, num_attention_heads=3, caption_projection_dim=3 * D)
    flux_config = dict(FLUX, num_attention_heads=3)
    for cls, config, inputs, want_of in ((SD3Transformer2DModel, sd3_config, _sd3_inputs(10), _sd3_want),
                                         (FluxTransformer2DModel, flux_config, _flux_inputs(11), _flux_want)):
        model = cls.from_config(config, device_mesh=dtorch.DeviceMesh("cpu", [0]))
        state = _state(model)
        want = want_of(model, state, inputs)
        for shape, names in (((3,), ("tp",)), ((3, 2), ("tp", "ring"))):
            out = _on_layout(cls, config, state, shape, names)(**inputs).sample.numpy()
            assert _relative_error(out, want) < 1e-4, (cls.__name__, names)


def test_tp_splits_the_weights(thread_runtime):
    """On tp2 every device holds half of each q/k/v projection's rows (its heads) and half of each
    output projection's columns, half of each MLP's hidden channels, and of FLUX's single-block
    proj_out half the output rows; the modulation linears and the per-head q/k norms stay whole.
    Each piece is checked against the numpy split of the whole weight."""
    mesh = _mesh((2,), ("tp",))
    one = dtorch.DeviceMesh("cpu", [0])
    sd3 = SD3Transformer2DModel.from_config(SD35, device_mesh=one)
    flux = FluxTransformer2DModel.from_config(FLUX, device_mesh=one)
    for model, split_rows, split_columns, whole in (
            (sd3, ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_k_proj",
                   "transformer_blocks.0.attn2.to_v", "transformer_blocks.1.ff.net.0.proj",
                   "transformer_blocks.0.ff_context.net.0.proj"],
             ["transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.attn.to_add_out",
              "transformer_blocks.0.attn2.to_out.0", "transformer_blocks.1.ff.net.2"],
             ["transformer_blocks.0.norm1.linear.weight", "transformer_blocks.0.attn.norm_q.weight",
              "transformer_blocks.0.attn2.norm_k.weight", "proj_out.weight", "context_embedder.weight"]),
            (flux, ["transformer_blocks.0.attn.to_k", "single_transformer_blocks.0.attn.to_q",
                    "single_transformer_blocks.0.proj_mlp", "single_transformer_blocks.0.proj_out"],
             ["transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.ff_context.net.2"],
             ["single_transformer_blocks.0.norm.linear.weight", "single_transformer_blocks.0.attn.norm_k.weight",
              "transformer_blocks.0.attn.norm_added_q.weight"])):
        state = _state(model)
        (parallelize_sd3 if model is sd3 else parallelize_flux)(model, mesh)
        params = dict(model.named_parameters())
        for path in split_rows:
            w, b = state[path + ".weight"], state[path + ".bias"]
            pieces = params[path + ".weight"].to_local()
            assert [p.shape for p in pieces] == [(w.shape[0] // 2, w.shape[1])] * 2, path
            np.testing.assert_array_equal(np.concatenate(pieces, 0), w)
            np.testing.assert_array_equal(np.concatenate(params[path + ".bias"].to_local(), 0), b)
        for path in split_columns:
            w = state[path + ".weight"]
            pieces = params[path + ".weight"].to_local()
            assert [p.shape for p in pieces] == [(w.shape[0], w.shape[1] // 2)] * 2, path
            np.testing.assert_array_equal(np.concatenate(pieces, 1), w)
        for key in whole:
            assert [p.shape for p in params[key].to_local()] == [state[key].shape] * 2, key
