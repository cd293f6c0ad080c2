"""Factories: zeros / ones / full / empty / arange / rand / randn, dtypes, defaults, value access."""
import numpy as np
import pytest

import dtorch
from conftest import MESHES, is_bf16_representable
from dtorch import Replicate, Shard

ALL_DTYPES = [dtorch.float32, dtorch.float16, dtorch.bfloat16, dtorch.int32, dtorch.int64, dtorch.bool]
FLOAT_DTYPES = [dtorch.float32, dtorch.float16, dtorch.bfloat16]
# numpy type the fetched value has (bfloat16 comes back as float32)
NP = {dtorch.float32: np.float32, dtorch.float16: np.float16, dtorch.bfloat16: np.float32,
      dtorch.int32: np.int32, dtorch.int64: np.int64, dtorch.bool: np.bool_}


def _meshes():
    return [MESHES[n]() for n in ("1", "3", "2x2")]


def test_dtype_objects():
    assert [d.name for d in ALL_DTYPES] == ["float32", "float16", "bfloat16", "int32", "int64", "bool"]
    assert [d.itemsize for d in ALL_DTYPES] == [4, 2, 2, 4, 8, 1]
    assert [d.is_floating_point for d in ALL_DTYPES] == [True, True, True, False, False, False]
    assert repr(dtorch.bfloat16) == "dtorch.bfloat16"


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_zeros_ones_full_every_dtype(mode, dt):
    fill = {dtorch.bool: True, dtorch.int32: -7, dtorch.int64: 2**40 + 3}.get(dt, 2.5)
    for mesh in _meshes():
        pl = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
        for size_args in [((5, 3),), (5, 3)]:  # tuple or separate ints
            z = dtorch.zeros(*size_args, device_mesh=mesh, placements=pl, dtype=dt)
            o = dtorch.ones(*size_args, device_mesh=mesh, placements=pl, dtype=dt)
            assert z.shape == o.shape == (5, 3)
            assert z.dtype is dt and o.dtype is dt
            zv, ov = z.numpy(), o.numpy()
            assert zv.dtype == NP[dt] and ov.dtype == NP[dt]
            np.testing.assert_array_equal(zv, np.zeros((5, 3), NP[dt]))
            np.testing.assert_array_equal(ov, np.ones((5, 3), NP[dt]))
        f = dtorch.full((4, 2), fill, device_mesh=mesh, placements=pl, dtype=dt)
        assert f.dtype is dt
        np.testing.assert_array_equal(f.numpy(), np.full((4, 2), fill, NP[dt]))
        # every local piece holds the fill value too
        for p in f.to_local():
            assert (p == np.asarray(fill).astype(NP[dt])).all()


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_empty_shape_only(mode, dt):
    for mesh in _meshes():
        e = dtorch.empty(6, 2, device_mesh=mesh, dtype=dt)
        assert e.shape == (6, 2) and e.dtype is dt
        v = e.numpy()
        assert v.shape == (6, 2) and v.dtype == NP[dt]
        e2 = dtorch.empty((0, 4), device_mesh=mesh, placements=[Shard(1)] * mesh.ndim, dtype=dt)
        assert e2.numpy().shape == (0, 4)


def test_default_dtypes(mode):
    mesh = MESHES["2"]()
    assert dtorch.zeros(2, device_mesh=mesh).dtype is dtorch.float32
    assert dtorch.ones(2, device_mesh=mesh).numpy().dtype == np.float32
    assert dtorch.empty(2, device_mesh=mesh).dtype is dtorch.float32
    assert dtorch.rand(2, device_mesh=mesh).dtype is dtorch.float32
    assert dtorch.randn(2, device_mesh=mesh).dtype is dtorch.float32
    assert dtorch.full((2,), 3, device_mesh=mesh).dtype is dtorch.int64
    assert dtorch.full((2,), 3.0, device_mesh=mesh).dtype is dtorch.float32
    assert dtorch.full((2,), True, device_mesh=mesh).dtype is dtorch.bool
    assert dtorch.full((2,), np.int32(3), device_mesh=mesh).dtype is dtorch.int64
    assert dtorch.arange(5, device_mesh=mesh).dtype is dtorch.int64
    assert dtorch.arange(0, 5, 2, device_mesh=mesh).dtype is dtorch.int64
    assert dtorch.arange(0.0, 5, device_mesh=mesh).dtype is dtorch.float32
    assert dtorch.arange(0, 5, 0.5, device_mesh=mesh).dtype is dtorch.float32
    np.testing.assert_array_equal(dtorch.full((3,), True, device_mesh=mesh).numpy(), [True] * 3)
    np.testing.assert_array_equal(dtorch.full((2, 2), -4, device_mesh=mesh).numpy(),
                                  np.full((2, 2), -4, np.int64))
    # dtype given by name or numpy type resolves to the same dtorch dtype
    assert dtorch.zeros(2, device_mesh=mesh, dtype="int32").dtype is dtorch.int32
    assert dtorch.zeros(2, device_mesh=mesh, dtype=np.float16).dtype is dtorch.float16


def test_full_large_int64_exact(mode):
    mesh = MESHES["3"]()
    v = 2**62 + 12345
    x = dtorch.full((3, 2), v, device_mesh=mesh, placements=[Shard(0)])
    assert x.numpy().tolist() == [[v, v]] * 3


@pytest.mark.parametrize("args", [
    (10,), (0,), (1,), (2, 9), (3, 20, 4), (10, 0, -1), (10, 0, -3), (-5, 5, 2), (5, 5),
])
def test_arange_int_vs_numpy(mode, args):
    want = np.arange(*args, dtype=np.int64)
    for mesh in _meshes():
        x = dtorch.arange(*args, device_mesh=mesh, placements=[Shard(0)] * mesh.ndim)
        assert x.dtype is dtorch.int64 and x.shape == want.shape
        np.testing.assert_array_equal(x.numpy(), want)


def test_arange_inconsistent_bounds_raise(mode):
    """torch refuses a step whose sign points away from end, and a zero step."""
    mesh = MESHES["2"]()
    with pytest.raises(ValueError, match="step"):
        dtorch.arange(5, 0, device_mesh=mesh)
    with pytest.raises(ValueError, match="step"):
        dtorch.arange(0, 5, -1, device_mesh=mesh)
    with pytest.raises(ValueError, match="step"):
        dtorch.arange(0, 5, 0, device_mesh=mesh)
    np.testing.assert_array_equal(dtorch.arange(3, device_mesh=mesh).numpy(), [0, 1, 2])


@pytest.mark.parametrize("args", [
    (0.0, 1.0, 0.25), (0, 1, 0.1), (1.0, -1.0, -0.5), (2.5,), (-3, 2, 0.7), (5, 0, -1.5), (0, 10, 3.0),
])
def test_arange_float_vs_numpy(mode, args):
    want = np.arange(*args)
    for mesh in _meshes():
        x = dtorch.arange(*args, device_mesh=mesh, placements=[Replicate()] * (mesh.ndim - 1) + [Shard(0)])
        assert x.dtype is dtorch.float32
        assert x.shape == want.shape, (args, x.shape, want.shape)
        np.testing.assert_allclose(x.numpy(), want.astype(np.float32), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dt", [dtorch.float16, dtorch.bfloat16, dtorch.int32, dtorch.float32], ids=lambda d: d.name)
def test_arange_explicit_dtype(mode, dt):
    mesh = MESHES["2"]()
    x = dtorch.arange(0, 12, 3, device_mesh=mesh, placements=[Shard(0)], dtype=dt)
    assert x.dtype is dt
    np.testing.assert_array_equal(x.numpy(), np.array([0, 3, 6, 9], dtype=NP[dt]))


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=lambda d: d.name)
def test_rand_randn_float_dtypes(mode, dt):
    for mesh in _meshes():
        r = dtorch.rand(64, 16, device_mesh=mesh, placements=[Shard(1)] * mesh.ndim, dtype=dt).numpy()
        n = dtorch.randn((64, 16), device_mesh=mesh, dtype=dt).numpy()
        assert r.shape == n.shape == (64, 16)
        assert r.dtype == NP[dt]
        assert (r >= 0).all() and (r < 1).all()
        assert np.isfinite(n).all()
        assert len(np.unique(r)) > 100  # not a constant
        if dt is dtorch.bfloat16:
            assert is_bf16_representable(r) and is_bf16_representable(n)


def test_value_access(mode):
    mesh = MESHES["2x2"]()
    full = np.arange(6, dtype=np.float32).reshape(3, 2) / 4
    x = dtorch.distribute_tensor(full, mesh, [Shard(0), Replicate()])
    np.testing.assert_array_equal(x.numpy(), full)
    np.testing.assert_array_equal(x.full_tensor(), full)
    np.testing.assert_array_equal(np.asarray(x), full)
    assert x.tolist() == full.tolist()
    assert x.size() == (3, 2) and x.size(1) == 2 and x.numel() == 6 and len(x) == 3
    one = dtorch.full((1, 1), 7, device_mesh=mesh)
    assert one.item() == 7 and isinstance(one.item(), int)
    scalar = dtorch.full((), 2.5, device_mesh=mesh)
    assert scalar.shape == () and scalar.ndim == 0
    assert scalar.item() == 2.5 and isinstance(scalar.item(), float)
    assert scalar.tolist() == 2.5
    assert dtorch.full((1,), True, device_mesh=mesh).item() is True
    with pytest.raises(RuntimeError, match="elements"):
        x.item()


def test_repr(mode):
    mesh = MESHES["4"]()
    x = dtorch.distribute_tensor(np.array([[1.25, -2.0], [3.5, 4.0]], np.float32), mesh, [Shard(0)])
    r = repr(x)
    assert "1.2500" in r and "-2.0000" in r and "4.0000" in r
    assert "DeviceMesh" in r and "Shard(dim=0)" in r
    assert "[0, 1, 2, 3]" in r
    xi = dtorch.arange(3, 8, device_mesh=mesh, placements=[Shard(0)])
    ri = repr(xi)
    assert "[3, 4, 5, 6, 7]" in ri and "Shard(dim=0)" in ri
    xh = dtorch.full((2,), 0.5, device_mesh=mesh, dtype=dtorch.float16)
    assert "0.5000" in repr(xh) and "float16" in repr(xh)
    rr = repr(dtorch.ones(2, device_mesh=mesh))
    assert "Replicate()" in rr and "1.0000" in rr
    assert f"{x=}".startswith("x=DTensor(")
