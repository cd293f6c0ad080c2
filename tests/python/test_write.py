"""In-place writes (x[...] = y) and the fused rotary embedding, against numpy."""
import numpy as np
import pytest

import dtorch
from conftest import MESHES
from dtorch import Replicate, Shard


def _layouts(mesh):
    if mesh.ndim == 1:
        return [[Shard(0)], [Shard(1)], [Shard(2)], [Replicate()]]
    return [[Shard(1), Shard(0)], [Shard(2), Shard(1)], [Replicate(), Shard(2)], [Shard(2), Shard(2)]]


@pytest.mark.parametrize("mesh_name", ["1", "2", "3", "2x2"])
def test_setitem_writes_in_place(mode, mesh_name):
    mesh = MESHES[mesh_name]()
    rng = np.random.default_rng(0)
    base = rng.standard_normal((3, 4, 7)).astype(np.float32)
    for placements in _layouts(mesh):
        x = dtorch.distribute_tensor(base, mesh, placements)
        before = x.future()                         # issued before the writes: sees the old value
        want = base.copy()
        y = rng.standard_normal((3, 4, 2)).astype(np.float32)
        x[..., 5:7] = dtorch.distribute_tensor(y, mesh)
        want[..., 5:7] = y
        x[:, 1] = 2.5                               # a number, an int index
        want[:, 1] = 2.5
        row = rng.standard_normal((3, 7)).astype(np.float32)
        x[:, 3] = dtorch.distribute_tensor(row, mesh)   # the value lacks the int-indexed dim
        want[:, 3] = row
        x[1:2] = dtorch.distribute_tensor(np.ones((1, 4, 7), np.float32), mesh).to(dtorch.int64)  # converted
        want[1:2] = 1
        assert x.placements == tuple(placements)
        np.testing.assert_array_equal(x.numpy(), want)
        np.testing.assert_array_equal(before.result(), base)


def test_setitem_bad_input(mode):
    mesh = MESHES["2"]()
    x = dtorch.zeros(4, 6, device_mesh=mesh, placements=[Shard(1)])
    with pytest.raises(NotImplementedError):
        x[1:3, 2:4] = 1.0
    with pytest.raises(IndexError):
        x[:, 6] = 1.0
    with pytest.raises(ValueError):
        x[:, 1:3] = dtorch.ones(4, 3, device_mesh=mesh)      # does not broadcast to (4, 2)
    with pytest.raises(TypeError):
        x[:, 0] = "a"
    np.testing.assert_array_equal(x.numpy(), np.zeros((4, 6), np.float32))  # still usable, unchanged


def _rope_reference(x, pos, inv_freq):
    """HF: emb = cat(freqs, freqs); x * cos(emb) + rotate_half(x) * sin(emb)."""
    freqs = pos[:, :, None].astype(np.float32) * inv_freq[None, None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None], np.sin(emb)[:, None]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


@pytest.mark.parametrize("mesh_name", ["1", "2", "4", "2x2"])
def test_rotary_embedding_matches_hf(mode, mesh_name):
    mesh = MESHES[mesh_name]()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5, 8)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11], [2, 2, 3, 4, 5]], np.int64)
    inv_freq = (1.0 / 10000 ** (np.arange(0, 8, 2) / 8)).astype(np.float32)
    want = _rope_reference(x, pos, inv_freq)
    lays = [[Shard(0)], [Shard(1)], [Shard(2)], [Replicate()]] if mesh.ndim == 1 else \
        [[Shard(0), Shard(1)], [Shard(2), Shard(0)], [Replicate(), Shard(3)]]
    for placements in lays:
        dx = dtorch.distribute_tensor(x, mesh, placements)
        out = dtorch.nn.functional.rotary_embedding(dx, dtorch.distribute_tensor(pos, mesh),
                                                    dtorch.distribute_tensor(inv_freq, mesh))
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    shared = dtorch.nn.functional.rotary_embedding(dtorch.distribute_tensor(x, mesh),
                                                   dtorch.distribute_tensor(pos[:1], mesh),
                                                   dtorch.distribute_tensor(inv_freq, mesh))
    np.testing.assert_allclose(shared.numpy(), _rope_reference(x, np.repeat(pos[:1], 3, 0), inv_freq),
                               rtol=1e-5, atol=1e-5)
