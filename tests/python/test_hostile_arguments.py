"""Arguments that the fuzzer of the C argument conversion (tests/fuzz/python/fuzz_api.py) found
mishandled: an array of big-endian items was read as little-endian values (a silently wrong
tensor), and the Placement base class given as a placement raised an AttributeError from inside
the extension."""
import numpy as np
import pytest

import dtorch
from conftest import mesh_1d


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">i4", ">f2"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_distribute_big_endian_arrays(mode, dtype, n):
    values = np.array([[1.5, -2, 3], [4, 5, -6.25]]).astype(dtype)
    mesh = mesh_1d(n)
    for placements in ([dtorch.Replicate()], [dtorch.Shard(1)]):
        x = dtorch.distribute_tensor(values, mesh, placements)
        assert x.dtype.name == np.dtype(dtype).name
        np.testing.assert_array_equal(x.numpy(), values.astype(np.dtype(dtype).newbyteorder("=")))
    flipped = values[::-1, ::2]   # strided and big-endian
    np.testing.assert_array_equal(dtorch.distribute_tensor(flipped, mesh, [dtorch.Shard(0)]).numpy(),
                                  flipped.astype(np.dtype(dtype).newbyteorder("=")))


def test_from_local_big_endian_pieces(mode):
    pieces = [np.array([1.0, 2.0], dtype=">f4"), np.array([3.0], dtype=">f4")]
    x = dtorch.from_local(pieces, mesh_1d(2), [dtorch.Shard(0)], shape=(3,))
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0, 3.0])


def test_placement_base_class_is_no_layout(mode):
    mesh = mesh_1d(2)
    x = dtorch.arange(4, device_mesh=mesh)
    calls = [lambda: dtorch.zeros(4, device_mesh=mesh, placements=[dtorch.Placement()]),
             lambda: x.redistribute(mesh, [dtorch.Placement()]),
             lambda: dtorch.distribute_tensor(np.zeros(4, np.float32), mesh, [dtorch.Placement()])]
    for call in calls:
        with pytest.raises(TypeError, match="placements must hold Shard, Replicate or Partial, got Placement"):
            call()
    np.testing.assert_array_equal((x + 1).numpy(), [1, 2, 3, 4])


@pytest.mark.parametrize("key", [slice(None, None, 2**63 - 1), slice(1, 4, 2**62), slice(0, None, 2**70),
                                 slice(-3, 2**64, 2**63), slice(3, None, 2**62 + 1)])
def test_slice_with_a_huge_step(mode, key):
    """A step past the size picks the first element of the range: its length was counted as
    (stop - start + step - 1) / step, which overflowed int64 and gave an empty slice."""
    ref = np.arange(20).reshape(4, 5)
    for mesh, placements in ((mesh_1d(1), [dtorch.Replicate()]), (mesh_1d(2), [dtorch.Shard(0)]),
                             (mesh_1d(3), [dtorch.Shard(1)])):
        x = dtorch.distribute_tensor(ref, mesh, placements)
        np.testing.assert_array_equal(x[key].numpy(), ref[key])
        np.testing.assert_array_equal(x[:, key].numpy(), ref[:, key])
