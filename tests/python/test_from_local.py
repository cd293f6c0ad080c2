"""from_local: per-device pieces, even-shard shape inference, shape= for uneven, Partial reductions."""
import numpy as np
import pytest

import dtorch
from conftest import MESHES
from dtorch import Partial, Replicate, Shard

REDUCE = {"sum": lambda a: np.sum(a, axis=0), "avg": lambda a: np.mean(a, axis=0),
          "max": lambda a: np.max(a, axis=0), "min": lambda a: np.min(a, axis=0)}


def _pieces(n, shape, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 50, size=shape).astype(dtype) for _ in range(n)]


def _assert_locals(x, pieces):
    locs = x.to_local()
    assert len(locs) == len(pieces)
    for got, want in zip(locs, pieces):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_shard_even_shape_inferred(mode):
    for name, k in (("1", 1), ("2", 2), ("3", 3), ("4", 4)):
        mesh = MESHES[name]()
        pieces = _pieces(k, (2, 3), k)
        x = dtorch.from_local(pieces, mesh, [Shard(0)])
        assert x.shape == (2 * k, 3) and x.placements == (Shard(0),)
        np.testing.assert_array_equal(x.numpy(), np.concatenate(pieces, axis=0))
        _assert_locals(x, pieces)
        y = dtorch.from_local(pieces, mesh, [Shard(1)])
        assert y.shape == (2, 3 * k)
        np.testing.assert_array_equal(y.numpy(), np.concatenate(pieces, axis=1))


def test_shard_uneven_with_shape(mode):
    mesh = MESHES["4"]()
    full = np.arange(15, dtype=np.int64).reshape(5, 3)
    pieces = [full[0:2], full[2:4], full[4:5], full[5:5]]  # 2,2,1,0
    x = dtorch.from_local(pieces, mesh, [Shard(0)], shape=(5, 3))
    assert x.shape == (5, 3)
    np.testing.assert_array_equal(x.numpy(), full)
    _assert_locals(x, pieces)
    # 6 rows over 4: 2,2,2,0
    full6 = np.arange(12, dtype=np.float32).reshape(6, 2)
    p6 = [full6[0:2], full6[2:4], full6[4:6], full6[6:6]]
    x6 = dtorch.from_local(p6, mesh, [Shard(0)], shape=[6, 2])
    np.testing.assert_array_equal(x6.numpy(), full6)


def test_nested_shard_on_2x2_with_shape(mode):
    mesh = MESHES["2x2ids4567"]()
    full = np.arange(10, dtype=np.float32).reshape(5, 2)
    pieces = [full[0:2], full[2:3], full[3:4], full[4:5]]
    x = dtorch.from_local(pieces, mesh, [Shard(0), Shard(0)], shape=(5, 2))
    np.testing.assert_array_equal(x.numpy(), full)
    _assert_locals(x, pieces)
    # even, inferred: global rows = local rows * 2 * 2
    even = [np.full((1, 2), i, np.int32) for i in range(4)]
    y = dtorch.from_local(even, mesh, [Shard(0), Shard(0)])
    assert y.shape == (4, 2)
    assert y.numpy()[:, 0].tolist() == [0, 1, 2, 3]


def test_replicate_single_array(mode):
    mesh = MESHES["2x2"]()
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    x = dtorch.from_local(a, mesh, [Replicate(), Replicate()])
    assert x.shape == (2, 3)
    np.testing.assert_array_equal(x.numpy(), a)
    _assert_locals(x, [a] * 4)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
@pytest.mark.parametrize("k", [2, 3])
def test_partial_1d(mode, op, k):
    mesh = MESHES[str(k)]()
    pieces = _pieces(k, (4, 3), seed=k * 10 + len(op))
    x = dtorch.from_local(pieces, mesh, [Partial(op)])
    assert x.shape == (4, 3) and x.placements == (Partial(op),)
    want = REDUCE[op](np.stack(pieces)).astype(np.float32)
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)
    _assert_locals(x, pieces)  # contributions unchanged
    # calling twice gives the same value (the reduction does not consume the contributions)
    np.testing.assert_allclose(x.full_tensor(), want, rtol=1e-6)
    _assert_locals(x, pieces)


def test_partial_hand_computed(mode):
    mesh = MESHES["3"]()
    pieces = [np.array([1.0, -2.0, 5.0], np.float32), np.array([4.0, 0.0, -1.0], np.float32),
              np.array([-3.0, 8.0, 2.0], np.float32)]
    assert dtorch.from_local(pieces, mesh, [Partial("sum")]).tolist() == [2.0, 6.0, 6.0]
    np.testing.assert_allclose(dtorch.from_local(pieces, mesh, [Partial("avg")]).numpy(), [2 / 3, 2.0, 2.0],
                               rtol=1e-6)
    assert dtorch.from_local(pieces, mesh, [Partial("max")]).tolist() == [4.0, 8.0, 5.0]
    assert dtorch.from_local(pieces, mesh, [Partial("min")]).tolist() == [-3.0, -2.0, -1.0]
    ints = [np.array([3, -7], np.int32), np.array([-4, 9], np.int32), np.array([10, 1], np.int32)]
    assert dtorch.from_local(ints, mesh, [Partial("sum")]).tolist() == [9, 3]
    assert dtorch.from_local(ints, mesh, [Partial("max")]).tolist() == [10, 9]
    assert dtorch.from_local(ints, mesh, [Partial("min")]).tolist() == [-4, -7]


def test_partial_sum_shard_on_2x2(mode):
    """[Partial("sum"), Shard(0)]: device (i, j) holds contribution i of row block j."""
    mesh = MESHES["2x2"]()
    pieces = _pieces(4, (2, 3), seed=1)
    x = dtorch.from_local(pieces, mesh, [Partial("sum"), Shard(0)])
    assert x.shape == (4, 3)
    block0 = pieces[0] + pieces[2]  # coordinates (0,0) and (1,0)
    block1 = pieces[1] + pieces[3]  # coordinates (0,1) and (1,1)
    np.testing.assert_array_equal(x.numpy(), np.concatenate([block0, block1]))
    _assert_locals(x, pieces)


def test_partial_sum_shard_uneven_on_2x2(mode):
    mesh = MESHES["2x2ids4567"]()
    rng = np.random.default_rng(2)
    a0, a1 = rng.integers(-9, 9, (3, 2)).astype(np.float32), rng.integers(-9, 9, (2, 2)).astype(np.float32)
    b0, b1 = rng.integers(-9, 9, (3, 2)).astype(np.float32), rng.integers(-9, 9, (2, 2)).astype(np.float32)
    x = dtorch.from_local([a0, a1, b0, b1], mesh, [Partial("sum"), Shard(0)], shape=(5, 2))
    np.testing.assert_array_equal(x.numpy(), np.concatenate([a0 + b0, a1 + b1]))


def test_shard_partial_max_on_2x2(mode):
    """[Shard(0), Partial("max")]: device (i, j) holds contribution j of row block i."""
    mesh = MESHES["2x2"]()
    pieces = _pieces(4, (3, 2), seed=3, dtype=np.int64)
    x = dtorch.from_local(pieces, mesh, [Shard(0), Partial("max")])
    assert x.shape == (6, 2)
    want = np.concatenate([np.maximum(pieces[0], pieces[1]), np.maximum(pieces[2], pieces[3])])
    np.testing.assert_array_equal(x.numpy(), want)
    _assert_locals(x, pieces)


def test_partial_on_both_mesh_dims(mode):
    mesh = MESHES["2x2"]()
    a = np.array([[1.0, 2.0]], np.float32)
    x = dtorch.from_local(a, mesh, [Partial("sum"), Partial("sum")])
    np.testing.assert_array_equal(x.numpy(), a * 4)
    pieces = [np.array([v], np.float32) for v in (1.0, 5.0, -2.0, 3.0)]
    y = dtorch.from_local(pieces, mesh, [Partial("max"), Partial("min")])
    # values chosen so that the order of the two reductions does not matter:
    # max(min(1, 5), min(-2, 3)) = 1 = min(max(1, -2), max(5, 3))
    assert y.item() == 1.0


def test_from_local_bad_shapes(mode):
    mesh = MESHES["2"]()
    good = [np.zeros((2, 3), np.float32)] * 2
    with pytest.raises(ValueError, match="piece|shape"):
        dtorch.from_local([np.zeros((2, 3), np.float32), np.zeros((3, 3), np.float32)], mesh, [Shard(0)])
    with pytest.raises(ValueError, match="piece|shape"):
        dtorch.from_local(good, mesh, [Shard(0)], shape=(7, 3))
    with pytest.raises(ValueError, match="piece|shape"):
        dtorch.from_local([np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)], mesh, [Replicate()])
    with pytest.raises(ValueError, match="piece|shape|dims"):
        dtorch.from_local([np.zeros((2, 3), np.float32), np.zeros((2,), np.float32)], mesh, [Shard(0)])
    with pytest.raises(ValueError, match="piece|shape"):
        dtorch.from_local([np.zeros((2, 3), np.float32)] * 3, mesh, [Shard(0)])
    with pytest.raises(ValueError, match="piece|shape|Partial"):
        dtorch.from_local([np.zeros((2, 3), np.float32), np.zeros((1, 3), np.float32)], mesh, [Partial()])
    with pytest.raises(TypeError, match="dtype"):
        dtorch.from_local([np.zeros(2, np.float32), np.zeros(2, np.int32)], mesh, [Shard(0)])
    x = dtorch.from_local(good, mesh, [Shard(0)])
    assert x.numpy().shape == (4, 3)


def test_from_local_non_contiguous_pieces(mode):
    mesh = MESHES["2"]()
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    pieces = [base.T[:2], base.T[2:]]  # non-contiguous (2, 3) views
    x = dtorch.from_local(pieces, mesh, [Shard(0)])
    np.testing.assert_array_equal(x.numpy(), base.T)
