"""In-place writes (x[...] = y) and the fused rotary embedding, against numpy."""
import numpy as np
import pytest

import dtorch
from conftest import MESHES, chunk_range
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


@pytest.mark.parametrize("mesh_name", ["1", "2x2"])
def test_rotary_embedding_takes_host_positions_and_frequencies(mode, mesh_name):
    """position_ids and inv_freq as numpy arrays or lists, as they are accepted as DTensors: laid out
    on x's mesh; anything else is a TypeError naming the argument."""
    mesh = MESHES[mesh_name]()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 3, 6)).astype(np.float32)
    pos = np.array([[0, 1, 2], [5, 6, 9]], np.int64)
    inv_freq = (1.0 / 500 ** (np.arange(0, 6, 2) / 6)).astype(np.float32)
    want = _rope_reference(x, pos, inv_freq)
    dx = dtorch.distribute_tensor(x, mesh, [Shard(1)] + [Replicate()] * (mesh.ndim - 1))
    rope = dtorch.nn.functional.rotary_embedding
    for p, f in ((pos, inv_freq), (pos.astype(np.int32), inv_freq.astype(np.float64)), (pos.tolist(), inv_freq),
                 (dtorch.distribute_tensor(pos, mesh), inv_freq)):
        out = rope(dx, p, f)
        assert out.placements == dx.placements
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="inv_freq"):
        rope(dx, pos, "abc")
    with pytest.raises(TypeError, match="position_ids"):
        rope(dx, pos.astype(np.float32), inv_freq)
    with pytest.raises(TypeError, match="x must be a DTensor"):
        rope(x, pos, inv_freq)


def _pieces_reference(dst, src, dim, offset, k):
    """shard_assign_ from its definition: piece r of src (torch.chunk into k) lands at `offset`
    within piece r of dst, both split on dim over k devices."""
    out = dst.copy()
    for r in range(k):
        d0, _ = chunk_range(dst.shape[dim], k, r)
        s0, s1 = chunk_range(src.shape[dim], k, r)
        index = [slice(None)] * dst.ndim
        index[dim] = slice(d0 + offset, d0 + offset + s1 - s0)
        take = [slice(None)] * src.ndim
        take[dim] = slice(s0, s1)
        out[tuple(index)] = src[tuple(take)]
    return out


@pytest.mark.parametrize("k,dst_len,src_len,offset", [(1, 6, 4, 2), (2, 10, 7, 1), (3, 9, 5, 1), (4, 12, 3, 2)])
def test_write_pieces_writes_each_piece_in_its_own_piece(mode, k, dst_len, src_len, offset):
    """Pieces of uneven and empty sizes (3 over 4: 1, 1, 1, 0), on a 1-D mesh and with a second mesh
    dim splitting the batch; no byte crosses devices."""
    from dtorch._ops_write import write_pieces_
    rng = np.random.default_rng(k)
    base = rng.standard_normal((2, dst_len, 3)).astype(np.float32)
    src = rng.standard_normal((2, src_len, 3)).astype(np.float32)
    want = _pieces_reference(base, src, 1, offset, k)
    for mesh, split in ((dtorch.DeviceMesh("cpu", list(range(k))), [Shard(1)]),
                        (dtorch.init_device_mesh("cpu", (2, k)), [Shard(0), Shard(1)])):
        x = dtorch.distribute_tensor(base, mesh, split)
        before = [s["peer_bytes_sent"] for s in dtorch.device_stats(mesh)]
        write_pieces_(x, 1, offset, dtorch.distribute_tensor(src, mesh, split))
        np.testing.assert_array_equal(x.numpy(), want)
        assert [s["peer_bytes_sent"] for s in dtorch.device_stats(mesh)] == before
    # not split on dim: a plain write at the offset
    x = dtorch.distribute_tensor(base, dtorch.DeviceMesh("cpu", [0, 1]), [Shard(0)])
    write_pieces_(x, 1, offset, dtorch.distribute_tensor(src, x.device_mesh, [Shard(0)]))
    plain = base.copy()
    plain[:, offset:offset + src_len] = src
    np.testing.assert_array_equal(x.numpy(), plain)


def test_write_pieces_bad_input(mode):
    from dtorch._ops_write import write_pieces_
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.zeros((2, 10), device_mesh=mesh, placements=[Shard(1)])
    src = dtorch.ones((2, 7), device_mesh=mesh, placements=[Shard(1)])
    with pytest.raises(ValueError, match="device 0 of the mesh holds 4 of src's positions on dim 1; they do not "
                                         "fit at 2 in its piece of dst of 5"):
        write_pieces_(x, 1, 2, src)
    with pytest.raises(TypeError, match="src is int64 but dst is float32"):
        write_pieces_(x, 1, 0, dtorch.ones((2, 3), device_mesh=mesh, dtype=dtorch.int64))
    with pytest.raises(ValueError, match="does not fit"):
        write_pieces_(x, 1, 0, dtorch.ones((3, 3), device_mesh=mesh))
    write_pieces_(x, 1, 1, src)                      # the runtime goes on
    assert x.numpy()[0].tolist() == [0, 1, 1, 1, 1, 0, 1, 1, 1, 0]


@pytest.mark.parametrize("mesh_name", ["1", "2", "3", "2x2", "2x1x2"])
def test_index_copy_writes_the_rows_the_index_names(mode, mesh_name):
    """dst.index_copy_(dim, index, src) as torch: row i of src lands at row index[i] along dim, in
    place, with dst split on the other dims (uneven pieces) and src laid out in any way."""
    mesh = MESHES[mesh_name]()
    rng = np.random.default_rng(1)
    base = rng.standard_normal((3, 5, 7)).astype(np.float32)
    for dim in (0, 1, 2):
        others = [d for d in range(3) if d != dim]
        for split in others + [None]:
            placements = [Replicate() if split is None else Shard(split)] + [Replicate()] * (mesh.ndim - 1)
            x = dtorch.distribute_tensor(base, mesh, placements)
            before = x.future()
            index = np.array([base.shape[dim] - 1, 0])
            shape = list(base.shape)
            shape[dim] = 2
            src = rng.standard_normal(shape).astype(np.float32)
            out = x.index_copy_(dim, dtorch.distribute_tensor(index, mesh),
                                dtorch.distribute_tensor(src, mesh, [Shard(others[0])] * mesh.ndim))
            want = base.copy()
            for i, at in enumerate(index):
                sl = [slice(None)] * 3
                sl[dim] = at
                ssl = [slice(None)] * 3
                ssl[dim] = i
                want[tuple(sl)] = src[tuple(ssl)]
            assert out is x and x.placements == tuple(placements)
            np.testing.assert_array_equal(x.numpy(), want)
            np.testing.assert_array_equal(before.result(), base)
            copy = dtorch.distribute_tensor(base, mesh, placements).index_copy(
                dim, dtorch.distribute_tensor(index, mesh), dtorch.distribute_tensor(src, mesh))
            np.testing.assert_array_equal(copy.numpy(), want)


def test_index_copy_bad_input(mode):
    mesh = MESHES["2"]()
    x = dtorch.zeros(4, 6, device_mesh=mesh, placements=[Shard(1)])
    i64 = dtorch.distribute_tensor(np.array([1]), mesh)
    row = dtorch.ones(4, 1, device_mesh=mesh)
    with pytest.raises(RuntimeError, match="split on dim 1, the dim it indexes"):
        x.index_copy_(1, i64, row)
    with pytest.raises(ValueError, match="1-D int64"):
        x.index_copy_(0, i64.to(dtorch.int32), dtorch.ones(1, 6, device_mesh=mesh))
    with pytest.raises(TypeError, match="same dtype"):
        x.index_copy_(0, i64, dtorch.ones(1, 6, device_mesh=mesh, dtype=dtorch.int64))
    with pytest.raises(ValueError, match="source must have self's shape"):
        x.index_copy_(0, i64, dtorch.ones(2, 6, device_mesh=mesh))
    with pytest.raises(IndexError):
        x.index_copy_(3, i64, row)
    with pytest.raises(TypeError, match="DTensor of int64"):
        x.index_copy_(0, 1, dtorch.ones(1, 6, device_mesh=mesh))
    x.index_copy_(0, dtorch.distribute_tensor(np.array([7]), mesh), dtorch.ones(1, 6, device_mesh=mesh))
    with pytest.raises(RuntimeError, match="index 7 is out of bounds for dimension 0 with size 4"):
        x.numpy()
    y = dtorch.zeros(4, 6, device_mesh=mesh, placements=[Shard(1)])   # the runtime goes on
    y.index_copy_(0, dtorch.distribute_tensor(np.array([3]), mesh), dtorch.ones(1, 6, device_mesh=mesh))
    np.testing.assert_array_equal(y.numpy()[3], np.ones(6))
