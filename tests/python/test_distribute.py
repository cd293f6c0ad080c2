"""distribute_tensor: every dtype, non-contiguous and odd-shaped inputs, the buffer protocol."""
import array

import numpy as np
import pytest

import dtorch
from conftest import MESHES, bf16_round, is_bf16_representable, mesh_1d, reference_locals
from dtorch import Replicate, Shard

NUMPY_DTYPES = [np.float32, np.float16, np.int32, np.int64, np.bool_]
DT_OF = {np.float32: dtorch.float32, np.float16: dtorch.float16, np.int32: dtorch.int32,
         np.int64: dtorch.int64, np.bool_: dtorch.bool}


def _sample(np_dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np_dtype is np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(np_dtype, np.integer):
        info = np.iinfo(np_dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=np_dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(np_dtype)


def _check(x, full, placements):
    np.testing.assert_array_equal(x.numpy(), full)
    for got, want in zip(x.to_local(), reference_locals(full, x.device_mesh.shape, placements)):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("np_dtype", NUMPY_DTYPES, ids=lambda t: np.dtype(t).name)
def test_every_dtype(mode, np_dtype):
    full = _sample(np_dtype, (5, 6))
    for name in ("1", "2", "3", "4", "2x2", "2x1x2"):
        mesh = MESHES[name]()
        for placements in ([Shard(0)] * mesh.ndim, [Shard(1)] + [Replicate()] * (mesh.ndim - 1)):
            x = dtorch.distribute_tensor(full, mesh, placements)
            assert x.dtype is DT_OF[np_dtype]
            assert x.numpy().dtype == np.dtype(np_dtype)
            _check(x, full, placements)


def test_bfloat16_from_ml_dtypes(mode):
    import ml_dtypes  # a test dependency (tools/run.sh installs it): bfloat16 arrays as users make them

    full = np.array([[1.5, -2.25], [3.0e10, 0.0078125], [-0.0, 7.0]], dtype=ml_dtypes.bfloat16)
    mesh = MESHES["3"]()
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    assert x.dtype is dtorch.bfloat16
    np.testing.assert_array_equal(x.numpy(), full.astype(np.float32))


def test_bfloat16_values_are_representable(mode):
    """Without ml_dtypes, bfloat16 tensors come from factories; their float32 view must round-trip
    through bfloat16 bits without loss."""
    dtorch.manual_seed(0)
    mesh = MESHES["2x2"]()
    for fn in (dtorch.rand, dtorch.randn):
        x = fn(33, 7, device_mesh=mesh, placements=[Shard(0), Shard(1)], dtype=dtorch.bfloat16)
        v = x.numpy()
        assert v.dtype == np.float32 and is_bf16_representable(v)
        np.testing.assert_array_equal(bf16_round(v), v)  # bits -> bfloat16 -> float32 loses nothing
        for piece in x.to_local():
            assert is_bf16_representable(piece)
    f = dtorch.full((3,), 1.0 + 2**-10, device_mesh=mesh, dtype=dtorch.bfloat16).numpy()
    np.testing.assert_array_equal(f, bf16_round(np.float32(1.0 + 2**-10)).repeat(3))
    np.testing.assert_array_equal(f, np.ones(3, np.float32))  # 1 + 2^-10 rounds to 1 in bfloat16


def test_non_contiguous_inputs(mode):
    base = np.arange(7 * 9, dtype=np.float32).reshape(7, 9)
    inputs = {
        "transposed": base.T,
        "step-sliced": base[::2, 1::3],
        "reversed rows": base[::-1],
        "reversed both": base[::-1, ::-2],
        "fortran": np.asfortranarray(base),
        "column": base[:, 4],
        "int64 transposed": np.arange(12, dtype=np.int64).reshape(3, 4).T,
        "broadcast (zero strides)": np.broadcast_to(np.arange(3, dtype=np.int32), (5, 3)),
    }
    for name in ("2", "3", "2x2"):
        mesh = MESHES[name]()
        for label, arr in inputs.items():
            for placements in ([Shard(0)] * mesh.ndim, [Shard(-1)] * mesh.ndim):
                x = dtorch.distribute_tensor(arr, mesh, placements)
                assert x.shape == arr.shape, label
                norm = [Shard(p.dim % arr.ndim) for p in placements]
                _check(x, np.ascontiguousarray(arr), norm)


def test_input_copied_at_call(mode):
    arr = np.arange(6, dtype=np.float32)
    x = dtorch.distribute_tensor(arr, MESHES["3"](), [Shard(0)])
    arr[:] = -1
    np.testing.assert_array_equal(x.numpy(), np.arange(6, dtype=np.float32))


def test_zero_dim_arrays(mode):
    for name in ("1", "2x2"):
        mesh = MESHES[name]()
        for v in (np.array(3.25, np.float32), np.array(-9, np.int64), np.array(True)):
            x = dtorch.distribute_tensor(v, mesh)
            assert x.shape == () and x.ndim == 0
            assert x.item() == v.item()
            assert all(p.shape == () and p == v for p in x.to_local())
            assert x.placements == (Replicate(),) * mesh.ndim


def test_empty_arrays(mode):
    for name in ("1", "4", "2x2"):
        mesh = MESHES[name]()
        for placements in ([Shard(0)] * mesh.ndim, [Shard(1)] * mesh.ndim, [Replicate()] * mesh.ndim):
            e = np.zeros((0, 3), np.float32)
            x = dtorch.distribute_tensor(e, mesh, placements)
            assert x.shape == (0, 3)
            assert x.numpy().shape == (0, 3)
            _check(x, e, placements)


def test_buffer_protocol_inputs(mode):
    mesh = MESHES["2"]()
    a = array.array("f", [1.0, 2.5, -3.0, 4.0, 5.5])
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    assert x.dtype is dtorch.float32
    np.testing.assert_array_equal(x.numpy(), np.array(a, np.float32))
    assert [p.tolist() for p in x.to_local()] == [[1.0, 2.5, -3.0], [4.0, 5.5]]

    q = array.array("q", [10, -20, 30])
    xq = dtorch.distribute_tensor(q, mesh, [Shard(0)])
    assert xq.dtype is dtorch.int64 and xq.tolist() == [10, -20, 30]

    i = array.array("i", [7, 8, 9, 10])
    assert dtorch.distribute_tensor(i, mesh, [Shard(0)]).dtype is dtorch.int32

    backing = np.arange(12, dtype=np.int32).reshape(3, 4)
    mv = memoryview(backing)
    xm = dtorch.distribute_tensor(mv, mesh, [Shard(1)])
    assert xm.dtype is dtorch.int32 and xm.shape == (3, 4)
    np.testing.assert_array_equal(xm.numpy(), backing)

    mv_strided = memoryview(backing)[::2]
    np.testing.assert_array_equal(dtorch.distribute_tensor(mv_strided, mesh, [Shard(0)]).numpy(), backing[::2])

    # bytes: no supported element type (numpy reads them as |S3, their buffer as uint8)
    with pytest.raises(TypeError, match="unsupported dtype"):
        dtorch.distribute_tensor(b"\x01\x02\x03", mesh)
    with pytest.raises(TypeError, match="uint8"):
        dtorch.distribute_tensor(memoryview(b"\x01\x02\x03"), mesh)
    with pytest.raises(TypeError, match="uint8"):
        dtorch.distribute_tensor(bytearray(4), mesh)
    # still working
    np.testing.assert_array_equal(dtorch.distribute_tensor(a, mesh).numpy(), np.array(a, np.float32))


def test_python_lists_and_scalars(mode):
    mesh = MESHES["2"]()
    x = dtorch.distribute_tensor(np.array([[1, 2], [3, 4]], dtype=np.int32), mesh, [Shard(0)])
    assert x.tolist() == [[1, 2], [3, 4]]
    xf = dtorch.distribute_tensor(np.float32(2.0), mesh)
    assert xf.shape == () and xf.item() == 2.0


def test_default_placements_replicate(mode):
    full = np.arange(10, dtype=np.float32).reshape(5, 2)
    for name in ("3", "2x2", "2x1x2"):
        mesh = MESHES[name]()
        x = dtorch.distribute_tensor(full, mesh)
        assert x.placements == (Replicate(),) * mesh.ndim
        locs = x.to_local()
        assert len(locs) == mesh.size()
        for p in locs:
            np.testing.assert_array_equal(p, full)
        # factories too
        z = dtorch.zeros(3, device_mesh=mesh)
        assert z.placements == (Replicate(),) * mesh.ndim
        assert all(p.shape == (3,) for p in z.to_local())


def test_shard_negative_normalised(mode):
    full = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    mesh = MESHES["2x2"]()
    x = dtorch.distribute_tensor(full, mesh, [Shard(-1), Shard(-3)])
    assert x.placements == (Shard(2), Shard(0))
    assert all(p.dim >= 0 for p in x.placements)
    _check(x, full, [Shard(2), Shard(0)])
    r = dtorch.rand(4, 6, device_mesh=mesh, placements=[Shard(-2), Shard(-1)])
    assert r.placements == (Shard(0), Shard(1))
    assert "Shard(dim=1)" in repr(r) and "Shard(dim=-1)" not in repr(r)


def test_distribute_existing_dtensor(mode):
    mesh = MESHES["2"]()
    x = dtorch.distribute_tensor(np.ones(4, np.float32), mesh, [Shard(0)])
    assert dtorch.distribute_tensor(x, mesh, [Shard(0)]) is x
    with pytest.raises(ValueError, match="redistribute"):
        dtorch.distribute_tensor(x, mesh, [Replicate()])


def test_dlpack_both_ways(mode):
    mesh = mesh_1d(2)
    x = dtorch.arange(6, device_mesh=mesh, placements=[dtorch.Shard(0)]).reshape(2, 3)
    assert np.array_equal(np.from_dlpack(x), np.arange(6).reshape(2, 3))
    assert x.__dlpack_device__() == (1, 0)

    class OnlyDLPack:  # an array-like that speaks DLPack and nothing else
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    y = dtorch.distribute_tensor(OnlyDLPack(a), mesh, [dtorch.Shard(0)])
    assert np.array_equal(y.numpy(), a)
