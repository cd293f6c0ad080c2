"""An image split along its height (or width) over devices, through the VAE decoder's ops and the
whole decoder: conv2d (stride 1 and 2, padding 0 and 1, uneven and empty shards), nearest
interpolate by a power of two and group_norm keep the split and equal the numpy references
(vae_reference.py); each device's piece is its torch.chunk share of the output rows. The decode
split over 2 and 3 devices (uneven rows) equals the one-device decode and the numpy VAE within
1e-4, and each device's peak memory (a counter, dtorch.memory_stats) on 2 devices is below the one
device's. Both worker modes for the ops."""
import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
import vae_reference as ref
from conftest import reference_locals
from dtorch import Replicate, Shard
from dtorch.models import AutoencoderKL, parallelize_vae

TOL = 1e-4


def rel(got, want):
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def split(a, mesh, placements):
    return dtorch.distribute_tensor(np.ascontiguousarray(a), mesh, list(placements))


def whole(a, mesh):
    return split(a, mesh, [Replicate()] * mesh.ndim)


def check_pieces(t, want, tol=1e-5):
    """Each device's own piece is its torch.chunk block of ``want`` (the numpy result), within tol
    relative; returns the whole tensor."""
    assert tuple(t.shape) == want.shape
    blocks = reference_locals(want, t.device_mesh.shape, t.placements)
    for i, (got, block) in enumerate(zip(t.to_local(), blocks)):
        assert got.shape == block.shape, (i, got.shape, block.shape)
        if block.size:
            assert rel(got, block) <= tol * np.abs(want).max() / max(np.abs(block).max(), 1e-30), i
    return t.numpy()


# ---- conv2d --------------------------------------------------------------------------------------

CONV_CASES = [  # (kernel, stride, padding)
    (3, 1, 1), (3, 1, 0), (3, 2, 0), (3, 2, 1), (1, 1, 0), (2, 2, 0),
]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_conv2d_split_on_height(mode, n):
    rng = np.random.default_rng(n)
    mesh = dtorch.DeviceMesh("cpu", list(range(n)))
    for H in (9, 2 * n - 1, 2):   # uneven, and fewer rows than devices (empty shards)
        x = rng.standard_normal((2, 3, H, 5)).astype(np.float32)
        for k, stride, padding in CONV_CASES:
            if H + 2 * padding < k:
                continue
            w = rng.standard_normal((4, 3, k, k)).astype(np.float32)
            b = rng.standard_normal(4).astype(np.float32)
            got = F.conv2d(split(x, mesh, [Shard(2)]), whole(w, mesh), whole(b, mesh), stride=stride, padding=padding)
            want = ref.conv2d(x, w, b, stride, padding)
            what = f"n={n} H={H} k={k} stride={stride} padding={padding}"
            assert got.placements == (Shard(2),), what
            assert rel(check_pieces(got, want), want) < 1e-5, what


def test_conv2d_split_window_all_padding(mode):
    """A device whose output rows read only padding (a 1x1 kernel with padding 2 over 1 row)."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2])
    x = np.random.default_rng(4).standard_normal((1, 2, 1, 3)).astype(np.float32)
    w = np.random.default_rng(5).standard_normal((3, 2, 1, 1)).astype(np.float32)
    b = np.arange(3, dtype=np.float32)
    got = F.conv2d(split(x, mesh, [Shard(2)]), whole(w, mesh), whole(b, mesh), padding=2)
    want = ref.conv2d(x, w, b, 1, 2)
    assert rel(check_pieces(got, want), want) < 1e-5


def test_conv2d_split_on_width_and_batch(mode):
    """A 2-D mesh: the batch over one dim, the width over the other; and a 1-D width split."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 4, 7)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    mesh = dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "height"))
    for stride, padding in ((1, 1), (2, 1), (2, 0)):
        for pl in ([Shard(0), Shard(3)], [Shard(0), Shard(2)], [Replicate(), Shard(3)]):
            got = F.conv2d(split(x, mesh, pl), whole(w, mesh), None, stride=stride, padding=padding)
            assert got.placements == tuple(pl)
            want = ref.conv2d(x, w, None, stride, padding)
            assert rel(got.numpy(), want) < 1e-5, (stride, padding, pl)


def test_conv2d_split_without_gathering(thread_runtime):
    """A device receives its halo rows, not the image: the bytes the 3 devices receive are a few
    rows' worth (2 boundaries, 1 row each way, of a 3x3 conv), far below a gather's."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2])
    x = split(np.ones((1, 4, 30, 8), np.float32), mesh, [Shard(2)])
    w = whole(np.ones((4, 4, 3, 3), np.float32), mesh)
    before = _received(mesh)
    out = F.conv2d(x, w, padding=1)
    dtorch.synchronize()
    moved = _received(mesh) - before
    row = 4 * 8 * 4
    assert 0 < moved <= 4 * row, moved
    assert out.placements == (Shard(2),)


def _received(mesh):
    stats = dtorch.device_stats(mesh)
    key = next(k for k in ("peer_bytes_received", "bytes_received") if k in stats[0])
    return sum(s[key] for s in stats)


def test_conv2d_split_bad_input(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = split(np.ones((1, 2, 4, 4), np.float32), mesh, [Shard(2)])
    w = whole(np.ones((3, 5, 3, 3), np.float32), mesh)
    with pytest.raises(ValueError, match="channels"):
        F.conv2d(x, w)
    with pytest.raises(ValueError, match="mesh_dim"):
        dtorch._C._halo_conv2d(x, whole(np.ones((3, 2, 3, 3), np.float32), mesh), None, (1,) * 9, 3)
    with pytest.raises(ValueError, match="spatial dim"):
        dtorch._C._halo_conv2d(split(np.ones((2, 2, 4, 4), np.float32), mesh, [Shard(0)]),
                               whole(np.ones((3, 2, 3, 3), np.float32), mesh), None, (1, 1, 1, 1, 1, 1, 1, 1, 1), 0)
    # the runtime keeps working
    got = F.conv2d(x, whole(np.ones((3, 2, 3, 3), np.float32), mesh), padding=1)
    assert rel(got.numpy(), ref.conv2d(np.ones((1, 2, 4, 4)), np.ones((3, 2, 3, 3)), None, 1, 1)) < 1e-6


@pytest.mark.parametrize("n", [2, 3])
def test_conv2d_and_upsample_of_views(mode, n):
    """Inputs that are views made on the controller (channels 1-3 of an image of 5, and the weight's
    output channels 2-5 of 6): the split ops read pieces made for them, the values copies give."""
    rng = np.random.default_rng(20 + n)
    mesh = dtorch.DeviceMesh("cpu", list(range(n)))
    x = rng.standard_normal((2, 5, 7, 4)).astype(np.float32)
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    xs, ws = split(x, mesh, [Shard(2)]), whole(w, mesh)
    got = F.conv2d(xs[:, 1:4], ws[2:], whole(b[2:], mesh), padding=1)
    want = ref.conv2d(x[:, 1:4], w[2:], b[2:], 1, 1)
    assert got.placements == (Shard(2),)
    assert rel(check_pieces(got, want), want) < 1e-5
    up = F.interpolate(xs[:, 1:4], scale_factor=2.0)
    assert np.array_equal(check_pieces(up, np.repeat(np.repeat(x[:, 1:4], 2, 2), 2, 3), tol=0),
                          np.repeat(np.repeat(x[:, 1:4], 2, 2), 2, 3))
    assert np.array_equal(xs.numpy(), x)   # the tensor the views were made of is unchanged


# ---- interpolate and group_norm -------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4])
def test_nearest_upsample_split(mode, n):
    rng = np.random.default_rng(10 + n)
    mesh = dtorch.DeviceMesh("cpu", list(range(n)))
    for H in (5, 2, 7):
        x = rng.standard_normal((2, 3, H, 3)).astype(np.float32)
        for kw, fy, fx in ((dict(scale_factor=2.0), 2, 2), (dict(scale_factor=4.0, mode="nearest-exact"), 4, 4),
                           (dict(size=(2 * H, 3)), 2, 1)):
            got = F.interpolate(split(x, mesh, [Shard(2)]), **kw)
            want = np.repeat(np.repeat(x, fy, axis=2), fx, axis=3)
            assert got.placements == (Shard(2),), kw
            assert np.array_equal(check_pieces(got, want, tol=0), want), (H, kw)


@pytest.mark.parametrize("n", [2, 3])
def test_group_norm_split(mode, n):
    rng = np.random.default_rng(20 + n)
    mesh = dtorch.DeviceMesh("cpu", list(range(n)))
    for H in (7, 2):
        x = (3 + 2 * rng.standard_normal((2, 8, H, 5))).astype(np.float32)
        g, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
        got = F.group_norm(split(x, mesh, [Shard(2)]), 4, whole(g, mesh), whole(b, mesh), eps=1e-6)
        assert got.placements == (Shard(2),)
        assert rel(got.numpy(), ref.group_norm(x, 4, g, b, 1e-6)) < 1e-5


# ---- the decoder ------------------------------------------------------------------------------------

CFG = dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
           block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, latent_channels=4)


def _weights(seed=0):
    dtorch.manual_seed(seed)
    model = AutoencoderKL.from_config(CFG, device_mesh=dtorch.DeviceMesh("cpu", [0]))
    rng = np.random.default_rng(seed)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    return {k: (v + 0.2 * rng.standard_normal(v.shape)).astype(np.float32) if "norm" in k else v
            for k, v in sd.items()}


def _decoder(sd, mesh):
    model = AutoencoderKL.from_config(CFG, device_mesh=mesh)
    model.load_state_dict(sd)
    return model


@pytest.mark.parametrize("n", [2, 3])
def test_decode_split_on_height(thread_runtime, n):
    sd = _weights()
    z = np.random.default_rng(1).standard_normal((2, 4, 5, 6)).astype(np.float32)   # 5 rows: uneven
    one = _decoder(sd, dtorch.DeviceMesh("cpu", [0])).decode(z).sample.numpy()
    model = _decoder(sd, dtorch.DeviceMesh("cpu", list(range(n)), mesh_dim_names=("height",)))
    out = model.decode(z).sample
    assert out.placements == (Shard(2),)
    got = out.numpy()
    assert rel(got, one) < TOL
    assert rel(got, ref.decode(sd, CFG, z)) < TOL


def test_decode_split_on_height_and_batch(thread_runtime):
    sd = _weights()
    z = np.random.default_rng(2).standard_normal((3, 4, 5, 4)).astype(np.float32)
    mesh = dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "height"))
    out = _decoder(sd, mesh).decode(z).sample
    assert out.placements == (Shard(0), Shard(2))
    assert rel(out.numpy(), ref.decode(sd, CFG, z)) < TOL


def test_parallelize_vae_bad_names(thread_runtime):
    dtorch.manual_seed(0)
    model = AutoencoderKL.from_config(CFG, device_mesh=dtorch.DeviceMesh("cpu", [0]))
    with pytest.raises(ValueError, match="rows"):
        parallelize_vae(model, dtorch.DeviceMesh("cpu", [0, 1], mesh_dim_names=("rows",)))


def _decode_peak(sd, mesh, z):
    model = _decoder(sd, mesh)
    zt = dtorch.distribute_tensor(z, mesh)
    dtorch.synchronize()
    base = [s["bytes_in_use"] for s in dtorch.memory_stats(mesh, reset_peak=True)]
    out = model.decode(zt).sample
    dtorch.synchronize()
    peaks = [s["peak_bytes"] - b for s, b in zip(dtorch.memory_stats(mesh), base)]
    del out
    return peaks


def test_decode_split_peak_memory_falls(thread_runtime):
    """The most any device holds while decoding (above what it held before: weights, latents) on 2
    devices split by height is below what one device holds for the same decode."""
    sd = _weights()
    z = np.random.default_rng(3).standard_normal((1, 4, 16, 16)).astype(np.float32)
    (one,) = _decode_peak(sd, dtorch.DeviceMesh("cpu", [0]), z)
    two = _decode_peak(sd, dtorch.DeviceMesh("cpu", [0, 1], mesh_dim_names=("height",)), z)
    assert max(two) < 0.75 * one, (two, one)
