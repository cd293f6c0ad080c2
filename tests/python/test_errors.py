"""Bad input: a clear exception at the call site, and the runtime keeps working afterwards."""
import os
import re

import numpy as np
import pytest

import dtorch
from conftest import MESHES
from dtorch import Partial, Replicate, Shard


def _still_works(mesh):
    """A good op after each bad one: values still come back right."""
    pl = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
    x = dtorch.arange(5, device_mesh=mesh, placements=pl)
    np.testing.assert_array_equal(x.numpy(), np.arange(5))


def test_placements_count_mismatch(mode):
    m1, m2 = MESHES["2"](), MESHES["2x2"]()
    with pytest.raises(ValueError, match="placements"):
        dtorch.zeros(4, device_mesh=m1, placements=[Shard(0), Replicate()])
    _still_works(m1)
    with pytest.raises(ValueError, match="placements"):
        dtorch.rand(4, 4, device_mesh=m2, placements=[Shard(0)])
    _still_works(m2)
    with pytest.raises(ValueError, match="placements"):
        dtorch.distribute_tensor(np.zeros(4, np.float32), m2, [])
    _still_works(m2)
    with pytest.raises(ValueError, match="placements"):
        dtorch.from_local([np.zeros(2, np.float32)] * 4, m2, [Shard(0)])
    _still_works(m2)
    with pytest.raises(ValueError, match="placements"):
        dtorch.arange(4, device_mesh=m1, placements=[])
    _still_works(m1)


def test_shard_dim_out_of_range(mode):
    mesh = MESHES["2"]()
    for dim in (2, 3, -3):
        with pytest.raises(IndexError, match="[Dd]im"):
            dtorch.zeros(4, 4, device_mesh=mesh, placements=[Shard(dim)])
        _still_works(mesh)
        with pytest.raises(IndexError, match="[Dd]im"):
            dtorch.distribute_tensor(np.zeros((4, 4), np.float32), mesh, [Shard(dim)])
        _still_works(mesh)
    with pytest.raises(IndexError, match="[Dd]im"):
        dtorch.distribute_tensor(np.float32(1.0), mesh, [Shard(0)])  # 0-d cannot be sharded
    _still_works(mesh)
    with pytest.raises(IndexError, match="[Dd]im"):
        dtorch.from_local([np.zeros(2, np.float32)] * 2, mesh, [Shard(1)])
    _still_works(mesh)
    m3 = MESHES["2x1x2"]()
    with pytest.raises(IndexError, match="[Dd]im"):
        dtorch.rand(3, device_mesh=m3, placements=[Shard(0), Replicate(), Shard(1)])
    _still_works(m3)


def test_duplicate_device_ids(mode):
    with pytest.raises(ValueError, match="more than once|duplicate"):
        dtorch.DeviceMesh("cpu", [0, 1, 0])
    with pytest.raises(ValueError, match="more than once|duplicate") as info:
        dtorch.DeviceMesh("cpu", [[0, 1], [1, 2]])
    assert "1" in str(info.value)
    _still_works(MESHES["3"]())


def test_bad_mesh_input(mode):
    with pytest.raises(ValueError):
        dtorch.DeviceMesh("cpu", [])
    with pytest.raises(ValueError, match="device"):
        dtorch.DeviceMesh("cpu", [0, -1])
    with pytest.raises(ValueError, match="device type|device_type|cpu"):
        dtorch.DeviceMesh("tpu", [0, 1])
    with pytest.raises(TypeError):
        dtorch.DeviceMesh("cpu", [0.5, 1.5])
    with pytest.raises(ValueError, match="positive"):
        dtorch.init_device_mesh("cpu", (2, 0))
    with pytest.raises(TypeError, match="DeviceMesh"):
        dtorch.zeros(3, device_mesh=[0, 1])
    with pytest.raises(TypeError, match="DeviceMesh"):
        dtorch.zeros(3)
    _still_works(MESHES["2"]())


def test_negative_size(mode):
    mesh = MESHES["2"]()
    for fn in (dtorch.zeros, dtorch.ones, dtorch.empty, dtorch.rand, dtorch.randn):
        with pytest.raises(ValueError, match="negative|size"):
            fn(3, -1, device_mesh=mesh)
        _still_works(mesh)
    with pytest.raises(ValueError, match="negative|size"):
        dtorch.full((-2,), 1.0, device_mesh=mesh)
    _still_works(mesh)


def test_non_integer_size(mode):
    mesh = MESHES["2"]()
    for bad in ((2.0, 3), (2, "3"), (None,), (True, 2), ((2, 3), 4)):
        with pytest.raises(TypeError, match="size|int"):
            dtorch.zeros(*bad, device_mesh=mesh)
        _still_works(mesh)
    with pytest.raises(TypeError, match="size|int"):
        dtorch.rand((2.5,), device_mesh=mesh)
    with pytest.raises(TypeError, match="size|int"):
        dtorch.full((1.5, 2), 0, device_mesh=mesh)
    with pytest.raises(TypeError, match="number"):
        dtorch.full((2,), "x", device_mesh=mesh)
    with pytest.raises(TypeError, match="number"):
        dtorch.arange("5", device_mesh=mesh)
    _still_works(mesh)
    # numpy integers are fine sizes
    assert dtorch.zeros(np.int64(2), np.int32(3), device_mesh=mesh).shape == (2, 3)


def test_unknown_dtype(mode):
    mesh = MESHES["2"]()
    for bad in ("float64", np.float64, np.complex64, "nope", 5, object):
        with pytest.raises(TypeError, match="dtype"):
            dtorch.zeros(3, device_mesh=mesh, dtype=bad)
        _still_works(mesh)
    with pytest.raises(TypeError, match="dtype"):
        dtorch.arange(3, device_mesh=mesh, dtype="uint8")
    _still_works(mesh)


@pytest.mark.parametrize("dt", [dtorch.int64, dtorch.int32, dtorch.bool], ids=lambda d: d.name)
def test_rand_integer_dtype(mode, dt):
    mesh = MESHES["2"]()
    with pytest.raises(TypeError, match="rand|float|dtype"):
        dtorch.rand(4, device_mesh=mesh, dtype=dt)
    _still_works(mesh)
    with pytest.raises(TypeError, match="randn|float|dtype"):
        dtorch.randn(4, device_mesh=mesh, dtype=dt)
    _still_works(mesh)


def test_distribute_unsupported_dtype(mode):
    mesh = MESHES["2"]()
    for arr in (np.zeros(4, np.complex64), np.zeros(4, np.float64), np.array([1, "a", None], dtype=object),
                np.zeros(4, np.uint8), np.zeros(4, np.int16), np.array(["ab", "cd"])):
        with pytest.raises(TypeError, match="dtype"):
            dtorch.distribute_tensor(arr, mesh, [Shard(0)])
        _still_works(mesh)
    with pytest.raises(TypeError, match="dtype"):
        dtorch.from_local([np.zeros(2, np.float64)] * 2, mesh, [Shard(0)])
    _still_works(mesh)
    with pytest.raises(TypeError):
        dtorch.distribute_tensor(object(), mesh)
    _still_works(mesh)


def test_from_local_shape_disagreement(mode):
    mesh = MESHES["3"]()
    with pytest.raises(ValueError, match="piece|shape"):
        dtorch.from_local([np.zeros((2, 2), np.float32)] * 3, mesh, [Shard(0)], shape=(5, 2))  # wants 2,2,1
    _still_works(mesh)
    with pytest.raises(ValueError, match="piece|shape"):
        dtorch.from_local([np.zeros((2, 2), np.float32)] * 3, mesh, [Replicate()], shape=(2, 3))
    _still_works(mesh)
    with pytest.raises(ValueError, match="piece|shape|dims"):
        dtorch.from_local([np.zeros((2, 2), np.float32)] * 3, mesh, [Replicate()], shape=(2, 2, 1))
    _still_works(mesh)
    with pytest.raises(ValueError, match="piece|shape"):
        dtorch.from_local([np.zeros((2, 2), np.float32)] * 2, mesh, [Shard(0)])
    _still_works(mesh)
    m2 = MESHES["2x2"]()
    with pytest.raises(ValueError, match="piece|shape"):
        dtorch.from_local([np.zeros((2, 2), np.float32)] * 3 + [np.zeros((1, 2), np.float32)], m2,
                          [Partial("sum"), Shard(0)])
    _still_works(m2)


def test_placements_not_placement_objects(mode):
    mesh = MESHES["2"]()
    for bad in (["Shard(0)"], [0], [None], Shard(0), "R", [(0, 0, 0)]):
        with pytest.raises(TypeError, match="[Pp]lacement"):
            dtorch.zeros(4, device_mesh=mesh, placements=bad)
        _still_works(mesh)
        with pytest.raises(TypeError, match="[Pp]lacement"):
            dtorch.distribute_tensor(np.zeros(4, np.float32), mesh, bad)
        _still_works(mesh)
    with pytest.raises(TypeError):
        Shard("0")
    with pytest.raises(TypeError):
        Shard(1.0)


def test_partial_unknown_reduce_op(mode):
    for op in ("prod", "product", "SUM", "", None):
        with pytest.raises(ValueError, match="reduce_op"):
            Partial(op)
    _still_works(MESHES["2"]())


def test_init_bogus_mode():
    dtorch.shutdown()
    try:
        with pytest.raises(ValueError, match="workers"):
            dtorch.init(workers="bogus")
        assert not dtorch.is_initialized()
        dtorch.init(workers="thread")
        _still_works(MESHES["2"]())
    finally:
        dtorch.shutdown()


def test_init_other_mode_while_running(mode):
    other = "process" if mode == "thread" else "thread"
    mesh = MESHES["2"]()
    _still_works(mesh)
    with pytest.raises(ValueError, match="running|already|shutdown"):
        dtorch.init(workers=other)
    _still_works(mesh)
    dtorch.init(workers=mode)  # the same mode again is harmless
    _still_works(mesh)


def test_item_and_len_errors(mode):
    mesh = MESHES["2"]()
    with pytest.raises(RuntimeError, match="elements"):
        dtorch.zeros(2, device_mesh=mesh).item()
    with pytest.raises(TypeError, match="0-d"):
        len(dtorch.full((), 1.0, device_mesh=mesh))
    _still_works(mesh)


@pytest.mark.parametrize("make, dtype, message", [
    (lambda m: dtorch.full((2, 2), 2 ** 40, dtype=dtorch.int32, device_mesh=m), "int32", "1099511627776"),
    (lambda m: dtorch.full((2, 2), -2 ** 31 - 1, dtype=dtorch.int32, device_mesh=m), "int32", "-2147483649"),
    (lambda m: dtorch.full((2,), 1e20, dtype=dtorch.int32, device_mesh=m), "int32", "1e+20"),
    (lambda m: dtorch.full((2,), float("nan"), dtype=dtorch.int64, device_mesh=m), "int64", "nan"),
    (lambda m: dtorch.full((2,), 1e6, dtype=dtorch.float16, device_mesh=m), "float16", "1e+06"),
    (lambda m: dtorch.full((2,), -7e4, dtype=dtorch.float16, device_mesh=m), "float16", "-70000"),
    (lambda m: dtorch.full((2,), 1e39, dtype=dtorch.float32, device_mesh=m), "float32", "1e+39"),
    (lambda m: dtorch.full((2,), 3.4e38, dtype=dtorch.bfloat16, device_mesh=m), "bfloat16", "3.4e+38"),
    (lambda m: dtorch.ones(2, dtype=dtorch.int32, device_mesh=m) + 2 ** 40, "int32", "1099511627776"),
    (lambda m: dtorch.ones(2, dtype=dtorch.float16, device_mesh=m) * 1e6, "float16", "1e+06"),
    (lambda m: dtorch.ones(2, dtype=dtorch.int32, device_mesh=m).masked_fill(
        dtorch.ones(2, dtype=dtorch.bool, device_mesh=m), 2 ** 31), "int32", "2147483648"),
])
def test_numbers_that_overflow_the_dtype_are_refused(mode, make, dtype, message):
    """torch's rule: a number converted to a tensor's dtype must fit (no wrap, no inf)."""
    mesh = MESHES["2"]()
    with pytest.raises(ValueError, match=re.escape(f"value {message} cannot be converted to type {dtype} without overflow")):
        make(mesh)
    _still_works(mesh)


def test_numbers_that_fit_are_kept_exactly(mode):
    mesh = MESHES["2"]()
    cases = [(dtorch.full((2,), -2 ** 31, dtype=dtorch.int32, device_mesh=mesh), np.int32(-2 ** 31)),
             (dtorch.full((2,), 2 ** 31 - 1, dtype=dtorch.int32, device_mesh=mesh), np.int32(2 ** 31 - 1)),
             (dtorch.full((2,), 2.9, dtype=dtorch.int32, device_mesh=mesh), np.int32(2)),
             (dtorch.full((2,), 65504.0, dtype=dtorch.float16, device_mesh=mesh), np.float16(65504)),
             (dtorch.full((2,), float("inf"), dtype=dtorch.float16, device_mesh=mesh), np.float16(np.inf)),
             (dtorch.full((2,), 2 ** 62, dtype=dtorch.int64, device_mesh=mesh), np.int64(2 ** 62)),
             (dtorch.ones(2, dtype=dtorch.int32, device_mesh=mesh) + (2 ** 31 - 2), np.int32(2 ** 31 - 1))]
    for x, want in cases:
        np.testing.assert_array_equal(x.numpy(), np.full(2, want))
        assert x.numpy().dtype == want.dtype


def test_out_of_range_integers_are_named(mode):
    mesh = MESHES["2"]()
    with pytest.raises(ValueError, match=r"Shard\(dim\): dim 1099511627776 is out of range"):
        Shard(2 ** 40)
    with pytest.raises(ValueError, match=r"rand\(\): size 9223372036854775808 at pos 0 is out of range"):
        dtorch.rand((2 ** 63,), device_mesh=mesh)
    with pytest.raises(ValueError, match=r"manual_seed: the seed must be an integer in \[-2\*\*63, 2\*\*64\)"):
        dtorch.manual_seed(2 ** 70)
    with pytest.raises(ValueError, match="manual_seed"):
        dtorch.manual_seed(-2 ** 63 - 1)
    with pytest.raises(TypeError, match="clamp"):
        dtorch.clamp(dtorch.ones(3, device_mesh=mesh), min="a")
    # the ends of the seed's range are seeds: -1 is 2**64 - 1, as torch takes it
    dtorch.manual_seed(-1)
    a = dtorch.rand(5, device_mesh=mesh).numpy()
    dtorch.manual_seed(2 ** 64 - 1)
    np.testing.assert_array_equal(dtorch.rand(5, device_mesh=mesh).numpy(), a)
    _still_works(mesh)


def _x(mesh):
    return dtorch.ones((4, 4), device_mesh=mesh, placements=[Shard(0)])


# (what, call on a (4, 4) Shard(0) tensor x over a 2-device mesh m, exception, message)
BAD_CALLS = [
    ("worker_info(-1)", lambda x, m: dtorch.worker_info(-1), ValueError, "device id -1 is out of range"),
    ("worker_info(2**40)", lambda x, m: dtorch.worker_info(2 ** 40), ValueError, "out of range [0, 65535]"),
    ("wait_for_workers(['a'])", lambda x, m: dtorch.wait_for_workers(["a"]), TypeError, "integer"),
    ("init(workers='gpu')", lambda x, m: dtorch.init(workers="gpu"), ValueError, "'thread' or 'process'"),
    ("reshape to 15 elements", lambda x, m: x.reshape(5, 3), ValueError, "invalid for input of size 16"),
    ("permute(0, 0)", lambda x, m: x.permute(0, 0), ValueError, "duplicate dims"),
    ("sum(dim=5)", lambda x, m: x.sum(dim=5), IndexError, "Dimension out of range"),
    ("cat of other widths", lambda x, m: dtorch.cat([x, dtorch.ones((4, 5), device_mesh=m, placements=[Shard(0)])]),
     ValueError, "Sizes of tensors must match except in dimension 0"),
    ("transpose(0, 2)", lambda x, m: x.transpose(0, 2), IndexError, "Dimension out of range"),
    ("matmul (4, 4) @ (5, 2)", lambda x, m: x @ dtorch.ones((5, 2), device_mesh=m, placements=[Replicate()]),
     ValueError, "cannot be multiplied"),
    ("softmax(dim=3)", lambda x, m: x.softmax(dim=3), IndexError, "Dimension out of range"),
    ("embedding with float indices", lambda x, m: dtorch.nn.functional.embedding(x, x), TypeError, "'indices'"),
    ("narrow past the end", lambda x, m: x.narrow(0, 3, 5), ValueError, "exceeds dimension size"),
    ("x[10]", lambda x, m: x[10], IndexError, "index 10 is out of bounds"),
    ("capture(5)", lambda x, m: dtorch.capture(5), TypeError, "expected a function"),
    ("view(-1, -1)", lambda x, m: x.view(-1, -1), ValueError, "only one dimension can be inferred"),
    ("rotary_embedding of odd head_dim", lambda x, m: dtorch.nn.functional.rotary_embedding(
        dtorch.ones((1, 1, 2, 3), device_mesh=m), dtorch.arange(2, device_mesh=m).reshape(1, 2),
        dtorch.ones(1, device_mesh=m)), ValueError, "rope: head_dim must be even, got 3"),
]


@pytest.mark.parametrize("what, call, error, message", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_more_bad_calls_are_named(mode, what, call, error, message):
    mesh = MESHES["2"]()
    with pytest.raises(error, match=re.escape(message)):
        call(_x(mesh), mesh)
    _still_works(mesh)


# ---- pieces larger than a device's memory -------------------------------------------------------

def _host_bytes():
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _refused(call, op, piece_bytes):
    """call() raises at the call site, before anything is sent: torch's OutOfMemoryError is a
    RuntimeError, and Python's own kind is MemoryError; the message names the op, the piece's
    bytes and the limit (the host's memory, for cpu devices)."""
    with pytest.raises(dtorch.OutOfMemoryError) as err:
        call()
    assert isinstance(err.value, RuntimeError) and isinstance(err.value, MemoryError)
    text = str(err.value)
    assert text.startswith(op + ":"), text
    assert f"takes {piece_bytes} bytes" in text and f"the device has {_host_bytes()} bytes of memory" in text, text


def test_piece_larger_than_memory_is_refused_at_the_call_site(mode):
    """A factory or op whose piece on a device would not fit that device's memory is refused when it
    is called, the same in both worker modes (a worker process would otherwise grow a shared
    segment until the kernel killed it). Sizes follow this host's memory: 4 and 16 times it,
    within the 2^48 elements a tensor may have; nothing that large is ever allocated."""
    host = _host_bytes()
    n = min(4 * host // 4, 2 ** 48)  # float32 elements: 4 times the host's memory
    assert n * 4 > host
    m1, m4, m22 = MESHES["1"](), MESHES["4"](), MESHES["2x2"]()
    for make in (dtorch.zeros, dtorch.ones, dtorch.empty, dtorch.rand, dtorch.randn):
        _refused(lambda: make(n, device_mesh=m1), make.__name__, 4 * n)
    _refused(lambda: dtorch.full((n,), 2.0, device_mesh=m1), "full", 4 * n)
    _refused(lambda: dtorch.arange(n, device_mesh=m1), "arange", 8 * n)  # int64
    # the rule is per piece: sharded over 4 devices, 16 times the host's memory is 4 times it each
    big = min(16 * host // 4, 2 ** 48)
    per = -(-big // 4)  # torch.chunk: device 0 holds ceil(big / 4)
    assert per * 4 > host
    _refused(lambda: dtorch.zeros(big, device_mesh=m4, placements=[Shard(0)]), "zeros", 4 * per)
    rows = 4 * 1024
    cols = -(-big // rows)
    _refused(lambda: dtorch.zeros((rows, cols), device_mesh=m22, placements=[Shard(0), Shard(1)]), "zeros",
             4 * (rows // 2) * -(-cols // 2))
    # a view makes no piece (torch's expand allocates nothing), but an op that writes it out does
    one = dtorch.ones(1, device_mesh=m1)
    view = one.expand(n)
    assert view.shape == (n,)
    _refused(lambda: view + 1, "add", 4 * n)
    _refused(lambda: view.contiguous(), "to", 4 * n)  # contiguous() is to() here
    # ... and so does a redistribute that gathers, or moves an input for an op
    wide = dtorch.ones(1, device_mesh=m4).expand(big)
    _refused(lambda: wide.redistribute(m4, [Shard(0)]), "redistribute", 4 * per)
    for mesh in (m1, m4, m22):
        _still_works(mesh)
