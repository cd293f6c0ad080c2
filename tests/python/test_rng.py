"""Counter-based random factories: the whole value depends only on the seed and the element index."""
import itertools

import numpy as np
import pytest

import dtorch
from conftest import MESHES, is_bf16_representable
from dtorch import Replicate, Shard

SHAPE = (7, 5)  # uneven over 2, 3, 4


def _placement_combos(ndim):
    return list(itertools.product([Shard(0), Shard(1), Replicate()], repeat=ndim))


def _reference(seed, shape=SHAPE, fn=dtorch.rand, dtype=None):
    dtorch.manual_seed(seed)
    return fn(shape, device_mesh=dtorch.DeviceMesh("cpu", [0]), dtype=dtype).numpy()


@pytest.mark.parametrize("fn", [dtorch.rand, dtorch.randn], ids=["rand", "randn"])
def test_same_full_tensor_on_every_mesh_and_placement(mode, fn):
    ref = _reference(1234, fn=fn)
    assert ref.shape == SHAPE
    for name in ("1", "2", "3", "4", "2x2", "2x2ids4567", "2x1x2"):
        mesh = MESHES[name]()
        for placements in _placement_combos(mesh.ndim):
            dtorch.manual_seed(1234)
            x = fn(SHAPE, device_mesh=mesh, placements=list(placements))
            np.testing.assert_array_equal(x.numpy(), ref, err_msg=f"mesh {name} placements {placements}")


def test_reproducible_and_advancing(mode):
    mesh = MESHES["3"]()
    dtorch.manual_seed(7)
    a = dtorch.rand(100, device_mesh=mesh, placements=[Shard(0)]).numpy()
    b = dtorch.rand(100, device_mesh=mesh, placements=[Shard(0)]).numpy()
    assert not np.array_equal(a, b)
    assert np.mean(a == b) < 0.05
    dtorch.manual_seed(7)
    a2 = dtorch.rand(100, device_mesh=mesh, placements=[Replicate()]).numpy()
    b2 = dtorch.rand(100, device_mesh=MESHES["2x2"](), placements=[Shard(0), Shard(0)]).numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    dtorch.manual_seed(8)
    c = dtorch.rand(100, device_mesh=mesh).numpy()
    assert not np.array_equal(a, c)


def test_same_in_thread_and_process_mode():
    """The stream does not depend on where workers live."""
    values = {}
    try:
        for m in ("thread", "process"):
            dtorch.shutdown()
            dtorch.init(workers=m)
            dtorch.manual_seed(99)
            values[m] = (dtorch.rand(9, 4, device_mesh=MESHES["4"](), placements=[Shard(0)]).numpy(),
                         dtorch.randn(9, 4, device_mesh=MESHES["2x2"](), placements=[Shard(1), Shard(0)]).numpy())
    finally:
        dtorch.shutdown()
    np.testing.assert_array_equal(values["thread"][0], values["process"][0])
    np.testing.assert_array_equal(values["thread"][1], values["process"][1])


def test_rand_uniform_in_unit_interval(mode):
    mesh = MESHES["4"]()
    dtorch.manual_seed(3)
    x = dtorch.rand(100_000, device_mesh=mesh, placements=[Shard(0)]).numpy()
    assert x.dtype == np.float32
    assert x.min() >= 0.0 and x.max() < 1.0
    assert abs(x.mean() - 0.5) < 0.01
    assert abs(x.std() - np.sqrt(1 / 12)) < 0.01
    hist, _ = np.histogram(x, bins=10, range=(0, 1))
    assert (np.abs(hist - 10_000) < 600).all(), hist
    assert len(np.unique(x)) > 90_000


def test_randn_moments(mode):
    mesh = MESHES["2x2"]()
    dtorch.manual_seed(5)
    x = dtorch.randn(400, 250, device_mesh=mesh, placements=[Shard(0), Shard(1)]).numpy().ravel()
    assert x.size == 100_000 and np.isfinite(x).all()
    assert abs(x.mean()) < 0.02
    assert abs(x.std() - 1.0) < 0.02
    assert abs(np.mean(np.abs(x) < 1) - 0.6827) < 0.01
    assert 3.5 < np.abs(x).max() < 6.5


@pytest.mark.parametrize("dt", [dtorch.float16, dtorch.bfloat16], ids=lambda d: d.name)
def test_half_precision_rand_in_unit_interval(mode, dt):
    dtorch.manual_seed(11)
    mesh = MESHES["3"]()
    x = dtorch.rand(20_000, device_mesh=mesh, placements=[Shard(0)], dtype=dt).numpy()
    assert (x >= 0).all() and (x < 1).all()
    assert abs(float(x.astype(np.float32).mean()) - 0.5) < 0.02
    if dt is dtorch.bfloat16:
        assert x.dtype == np.float32 and is_bf16_representable(x)
    else:
        assert x.dtype == np.float16
    # also mesh-independent in half precision
    ref = _reference(11, shape=(20_000,), dtype=dt)
    np.testing.assert_array_equal(x, ref)
