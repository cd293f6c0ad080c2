"""SD3's patch embedding on each device's own tokens: where parallelize_sd3 splits the image tokens
(ulysses, ring, with dp beside), each device projects and positions only its torch.chunk share of
the patch tokens. Its output and the whole transformer's are the numpy reference's (and one
device's), in both worker modes, and each device's peak bytes during the embedding fall with the
number of devices the tokens are split over (before, every device embedded the whole latent and
then kept its share)."""
import numpy as np
import pytest

import dtorch
from dtorch.models import SD3Transformer2DModel

import sd3_reference

# width 128 (E) against 4 x 2 x 2 = 16 values per patch token: the embedding's output dominates
CONFIG = dict(sample_size=16, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=32, num_attention_heads=4,
              joint_attention_dim=12, caption_projection_dim=128, pooled_projection_dim=10, out_channels=4,
              pos_embed_max_size=16)
# 10 x 7 patches (70 tokens: uneven rows and tokens on 3 devices, rows that end mid-row on 4)
LATENT = (2, 4, 20, 14)
MESHES = [((2,), ("ulysses",)), ((2,), ("ring",)), ((2, 2), ("dp", "ring")), ((3,), ("ring",)), ((4,), ("ring",))]


def _mesh(shape, names):
    return dtorch.DeviceMesh("cpu", np.arange(int(np.prod(shape))).reshape(shape).tolist(), mesh_dim_names=names)


def _model(mesh, sd):
    model = SD3Transformer2DModel.from_config(CONFIG, device_mesh=mesh)
    model.load_state_dict({k: dtorch.distribute_tensor(v, mesh) for k, v in sd.items()})
    return model


def _peaks(mesh, run):
    """(run()'s result, each device's peak bytes above what it held before)."""
    held = [s["bytes_in_use"] for s in dtorch.device_stats(mesh, reset_peak=True)]
    out = run()
    stats = dtorch.device_stats(mesh)
    return out, [s["peak_bytes"] - h for s, h in zip(stats, held)]


@pytest.mark.parametrize("shape,names", MESHES, ids=lambda v: "x".join(map(str, v)) if v and isinstance(v[0], int)
                         else "_".join(v) if v else "")
def test_patch_embedding_on_own_tokens(mode, shape, names):
    dtorch.manual_seed(3)
    one_mesh = _mesh((1,), None)
    single = SD3Transformer2DModel.from_config(CONFIG, device_mesh=one_mesh)
    sd = {k: v.numpy() for k, v in single.state_dict().items()}
    rng = np.random.default_rng(1)
    latent = rng.standard_normal(LATENT).astype(np.float32)
    B, L, E = LATENT[0], (LATENT[2] // 2) * (LATENT[3] // 2), 128
    want = sd3_reference.patch_embed(sd, latent, 2, CONFIG["pos_embed_max_size"])
    assert want.shape == (B, L, E)

    x = dtorch.distribute_tensor(latent, one_mesh)
    single.pos_embed(x).numpy()                                  # the kernels' first run apart
    one, (one_peak,) = _peaks(one_mesh, lambda: single.pos_embed(x).numpy())
    np.testing.assert_allclose(one, want, rtol=1e-4, atol=1e-5)

    mesh = _mesh(shape, names)
    model = _model(mesh, sd)
    x = dtorch.distribute_tensor(latent, mesh)
    model.pos_embed(x).numpy()
    out, peaks = _peaks(mesh, lambda: model.pos_embed(x))
    cp = int(np.prod([n for n, name in zip(shape, names) if name != "dp"]))
    assert out.placements[names.index("ring" if "ring" in names else "ulysses")] == dtorch.Shard(1)
    np.testing.assert_allclose(out.numpy(), one, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
    # each device embeds its own share of the tokens: at most its share of what one device held
    # at its peak, plus the whole latent's patch tokens (B x L x C*p*p, cut before the projection);
    # embedding the whole latent and then slicing held the whole of it on every device
    own = -(-L // cp) / L
    patches = B * L * 16 * 4
    for device, peak in enumerate(peaks):
        assert peak <= one_peak * own + patches, (device, peak, one_peak, own)

    # the whole transformer: the numpy reference's output, and one device's
    text = rng.standard_normal((B, 5, 12)).astype(np.float32)
    pooled = rng.standard_normal((B, 10)).astype(np.float32)
    t = np.array([999.0, 3.5], dtype=np.float32)
    ref = sd3_reference.transformer(sd, dict(model.config), latent, text, pooled, t)
    got = model(hidden_states=latent, encoder_hidden_states=text, pooled_projections=pooled, timestep=t).sample.numpy()
    base = single(hidden_states=latent, encoder_hidden_states=text, pooled_projections=pooled,
                  timestep=t).sample.numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    np.testing.assert_allclose(got, base, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
