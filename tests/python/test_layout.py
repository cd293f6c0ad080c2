"""Layout: to_local() pieces follow torch.chunk, nested over mesh dims, on 1-D, 2-D and 3-D meshes."""
import itertools

import numpy as np
import pytest

import dtorch
from conftest import MESHES, chunk_range, local_slices, reference_locals
from dtorch import Partial, Replicate, Shard


# ---- the reference itself against torch's documented tables ------------------------------------

@pytest.mark.parametrize("n,k,sizes", [
    (8, 4, [2, 2, 2, 2]), (7, 4, [2, 2, 2, 1]), (6, 4, [2, 2, 2, 0]), (5, 4, [2, 2, 1, 0]),
    (9, 4, [3, 3, 3, 0]), (10, 4, [3, 3, 3, 1]), (13, 4, [4, 4, 4, 1]), (2, 4, [1, 1, 0, 0]),
    (1, 4, [1, 0, 0, 0]), (0, 4, [0, 0, 0, 0]), (31, 4, [8, 8, 8, 7]), (32, 3, [11, 11, 10]),
])
def test_reference_chunk_table(n, k, sizes):
    got = [b - a for a, b in (chunk_range(n, k, r) for r in range(k))]
    assert got == sizes
    # the pieces tile [0, n) in order
    assert sum(got) == n


def _check_layout(x, full, placements):
    mesh = x.device_mesh
    locs = x.to_local()
    ref = reference_locals(full, mesh.shape, placements)
    assert len(locs) == mesh.size() == len(ref)
    for i, (got, want) in enumerate(zip(locs, ref)):
        assert got.shape == want.shape, (i, placements, got.shape, want.shape)
        np.testing.assert_array_equal(got, want, err_msg=f"device #{i} placements {placements}")


def _combos(ndim_mesh, tensor_ndim):
    choices = [Replicate()] + [Shard(d) for d in range(tensor_ndim)]
    return list(itertools.product(choices, repeat=ndim_mesh))


# ---- hand-computed tables through the runtime ---------------------------------------------------

@pytest.mark.parametrize("rows,sizes", [(6, [2, 2, 2, 0]), (5, [2, 2, 1, 0]), (8, [2, 2, 2, 2]),
                                        (1, [1, 0, 0, 0]), (0, [0, 0, 0, 0])])
def test_uneven_and_empty_shards_1d(mode, rows, sizes):
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    full = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    locs = x.to_local()
    assert [p.shape for p in locs] == [(s, 3) for s in sizes]
    start = 0
    for p, s in zip(locs, sizes):
        np.testing.assert_array_equal(p, full[start:start + s])
        start += s
    np.testing.assert_array_equal(x.numpy(), full)
    # a factory allocates the same local shapes
    z = dtorch.zeros(rows, 3, device_mesh=mesh, placements=[Shard(0)])
    assert [p.shape for p in z.to_local()] == [(s, 3) for s in sizes]


def test_nested_shard0_shard0_5_rows_on_2x2(mode):
    mesh = dtorch.init_device_mesh("cpu", (2, 2))
    full = np.arange(10, dtype=np.int64).reshape(5, 2)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0), Shard(0)])
    locs = x.to_local()
    # mesh dim 0: 3 | 2 rows; then 3 -> 2 | 1 and 2 -> 1 | 1 (not a flat chunk over 4: 2,2,1,0)
    assert [p.shape[0] for p in locs] == [2, 1, 1, 1]
    np.testing.assert_array_equal(locs[0], full[0:2])
    np.testing.assert_array_equal(locs[1], full[2:3])
    np.testing.assert_array_equal(locs[2], full[3:4])
    np.testing.assert_array_equal(locs[3], full[4:5])
    np.testing.assert_array_equal(x.numpy(), full)


def test_nested_3_rows_on_2x2_last_empty(mode):
    mesh = dtorch.DeviceMesh("cpu", [[4, 5], [6, 7]])
    full = np.array([1.5, 2.5, 3.5], dtype=np.float32)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0), Shard(0)])
    assert [p.tolist() for p in x.to_local()] == [[1.5], [2.5], [3.5], []]


def test_mixed_shard0_shard1_31x3_on_2x2(mode):
    mesh = dtorch.init_device_mesh("cpu", (2, 2))
    full = np.arange(93, dtype=np.int32).reshape(31, 3)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    locs = x.to_local()
    assert [p.shape for p in locs] == [(16, 2), (16, 1), (15, 2), (15, 1)]
    np.testing.assert_array_equal(locs[0], full[:16, :2])
    np.testing.assert_array_equal(locs[1], full[:16, 2:])
    np.testing.assert_array_equal(locs[2], full[16:, :2])
    np.testing.assert_array_equal(locs[3], full[16:, 2:])


def test_replicate_and_shard_on_2x2_explicit_ids(mode):
    mesh = dtorch.DeviceMesh("cpu", [[4, 5], [6, 7]])
    assert mesh.shape == (2, 2) and mesh.tolist() == [[4, 5], [6, 7]]
    full = np.arange(12, dtype=np.float32).reshape(4, 3)
    x = dtorch.distribute_tensor(full, mesh, [Replicate(), Shard(0)])
    locs = x.to_local()
    # row-major mesh order: devices 4, 5, 6, 7; mesh dim 1 shards, mesh dim 0 replicates
    np.testing.assert_array_equal(locs[0], full[:2])
    np.testing.assert_array_equal(locs[1], full[2:])
    np.testing.assert_array_equal(locs[2], full[:2])
    np.testing.assert_array_equal(locs[3], full[2:])


# ---- every mesh, every placement combination, against the reference ----------------------------

@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_layout_all_placements(mode, mesh_name):
    mesh = MESHES[mesh_name]()
    assert mesh.size() == int(np.prod(mesh.shape))
    shapes = [(6, 5), (5, 3), (3, 7), (0, 3), (1, 1)]
    rng = np.random.default_rng(0)
    for shape in shapes:
        full = rng.standard_normal(shape).astype(np.float32)
        for placements in _combos(mesh.ndim, len(shape)):
            x = dtorch.distribute_tensor(full, mesh, list(placements))
            assert x.shape == shape and x.ndim == 2 and x.dtype == dtorch.float32
            assert x.placements == tuple(placements)
            assert x.device_mesh == mesh
            _check_layout(x, full, placements)
            np.testing.assert_array_equal(x.full_tensor(), full)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_factory_layout_matches_its_own_full_value(mode, mesh_name):
    """rand's pieces are the torch.chunk pieces of rand's full value; zeros/ones/full allocate the
    same local shapes."""
    mesh = MESHES[mesh_name]()
    for shape in [(7, 2), (2, 5), (4, 0)]:
        for placements in _combos(mesh.ndim, 2):
            x = dtorch.rand(shape, device_mesh=mesh, placements=list(placements))
            _check_layout(x, x.numpy(), placements)
            o = dtorch.full(shape, 3, device_mesh=mesh, placements=list(placements), dtype=dtorch.int32)
            _check_layout(o, np.full(shape, 3, np.int32), placements)


@pytest.mark.parametrize("mesh_name", ["3", "4", "2x2", "2x1x2"])
def test_arange_1d_sharded_pieces(mode, mesh_name):
    mesh = MESHES[mesh_name]()
    for n in [0, 1, 5, 6, 10, 13]:
        for placements in _combos(mesh.ndim, 1):
            x = dtorch.arange(n, device_mesh=mesh, placements=list(placements))
            _check_layout(x, np.arange(n, dtype=np.int64), placements)


def test_shard_negative_dim_normalised_layout(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2])
    full = np.arange(20, dtype=np.float32).reshape(2, 10)
    x = dtorch.distribute_tensor(full, mesh, [Shard(-1)])
    assert x.placements == (Shard(1),)
    assert [p.shape for p in x.to_local()] == [(2, 4), (2, 4), (2, 2)]
    _check_layout(x, full, [Shard(1)])


def test_three_d_tensor_on_three_d_mesh(mode):
    mesh = dtorch.init_device_mesh("cpu", (2, 1, 2))
    full = np.arange(5 * 3 * 4, dtype=np.int64).reshape(5, 3, 4)
    for placements in [(Shard(0), Shard(1), Shard(2)), (Shard(2), Replicate(), Shard(0)),
                       (Shard(0), Shard(0), Shard(0)), (Replicate(), Replicate(), Shard(-1))]:
        x = dtorch.distribute_tensor(full, mesh, list(placements))
        norm = tuple(Shard(p.dim % 3) if isinstance(p, Shard) else p for p in placements)
        assert x.placements == norm
        _check_layout(x, full, norm)
        np.testing.assert_array_equal(x.numpy(), full)


def test_local_slices_reference_offsets():
    """The reference's offsets for N=5 on (2,2) with [S0, S0] are the hand-computed ones."""
    got = [local_slices((5,), (2, 2), [Shard(0), Shard(0)], c)[0] for c in [(0, 0), (0, 1), (1, 0), (1, 1)]]
    assert got == [(0, 2), (2, 3), (3, 4), (4, 5)]


def test_placement_objects():
    assert Shard(0) == Shard(0) and Shard(0) != Shard(1) and hash(Shard(1)) == hash(Shard(1))
    assert Replicate() == Replicate() and Replicate() != Shard(0)
    assert Partial() == Partial("sum") and Partial("max") != Partial("min")
    assert Partial().reduce_op == "sum"
    assert repr(Shard(0)) == "Shard(dim=0)" and str(Shard(2)) == "S(2)"
    assert repr(Replicate()) == "Replicate()" and str(Partial("avg")) == "P(avg)"
    for p in (Shard(0), Replicate(), Partial()):
        assert isinstance(p, dtorch.Placement)
    assert Shard(1).is_shard() and Shard(1).is_shard(1) and not Shard(1).is_shard(0)
    assert Replicate().is_replicate() and Partial().is_partial() and not Replicate().is_partial()
