"""Pointwise ops against numpy: unary math, binary arithmetic and comparisons with broadcasting
and Python numbers, where, masked_fill, clamp and casts, over meshes of 1-4 devices and 2x2 with
every legal placement (uneven and empty shards included), and the placements PyTorch's rules
give without communication."""
import itertools
import math
import re
import warnings

import numpy as np
import pytest

import dtorch
from conftest import mesh_1d, mesh_2x2
from dtorch import Partial, Replicate, Shard

MESHES = {"1": lambda: mesh_1d(1), "2": lambda: mesh_1d(2), "3": lambda: mesh_1d(3), "4": lambda: mesh_1d(4),
          "2x2": mesh_2x2}


@pytest.fixture
def thread():
    dtorch.shutdown()
    dtorch.init(workers="thread")
    yield
    dtorch.shutdown()


def placements_for(mesh, ndim):
    """Every combination of Shard(d) / Replicate over the mesh dims."""
    options = [Replicate()] + [Shard(d) for d in range(ndim)]
    return [list(p) for p in itertools.product(options, repeat=mesh.ndim)]


def nmse(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(got), finite), "non-finite values differ"
    err = np.sum((got[finite] - ref[finite]) ** 2)
    return err / max(np.sum(ref[finite] ** 2), 1e-30)


def close(got, ref, dtype=dtorch.float32):
    bound = {dtorch.float32: 1e-6, dtorch.float16: 1e-5, dtorch.bfloat16: 1e-4}[dtype]
    assert nmse(got, ref) <= bound, f"nmse {nmse(got, ref):.3g} above {bound}"


def bf16(a):
    """float32 values rounded to bfloat16 (ties to even), as float32."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


rng = np.random.default_rng(1234)
X54 = rng.standard_normal((5, 4)).astype(np.float32)
POS54 = (rng.random((5, 4)) + 0.1).astype(np.float32)

UNARY = {
    "neg": (np.negative, X54), "abs": (np.abs, X54), "exp": (np.exp, X54), "log": (np.log, POS54),
    "sqrt": (np.sqrt, POS54), "rsqrt": (lambda a: 1 / np.sqrt(a), POS54), "sin": (np.sin, X54),
    "cos": (np.cos, X54), "tanh": (np.tanh, X54), "sigmoid": (lambda a: 1 / (1 + np.exp(-a)), X54),
    "relu": (lambda a: np.maximum(a, 0), X54), "silu": (lambda a: a / (1 + np.exp(-a)), X54),
    "reciprocal": (lambda a: 1 / a, POS54), "erf": (np.vectorize(math.erf), X54),
}


def np_softplus(a, beta=1.0, threshold=20.0):
    """torch.nn.functional.softplus in float64: linear where beta * x exceeds the threshold."""
    a = np.asarray(a, np.float64)
    return np.where(a * beta > threshold, a, np.log1p(np.exp(a * beta)) / beta)


@pytest.mark.parametrize("mesh_name", MESHES)
@pytest.mark.parametrize("name", UNARY)
def test_unary_every_placement(thread, mesh_name, name):
    mesh = MESHES[mesh_name]()
    ref_fn, data = UNARY[name]
    fn = getattr(dtorch, name)
    for pl in placements_for(mesh, 2):
        x = dtorch.distribute_tensor(data, mesh, pl)
        y = fn(x)
        close(y.numpy(), ref_fn(data.astype(np.float64)))
        assert y.placements == x.placements, "pointwise ops keep shards without communication"


def test_gelu_exact_and_tanh(thread):
    mesh = mesh_1d(3)
    x = dtorch.distribute_tensor(X54, mesh, [Shard(0)])
    a = X54.astype(np.float64)
    exact = 0.5 * a * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))
    approx = 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
    close(dtorch.nn.functional.gelu(x).numpy(), exact)
    close(dtorch.nn.functional.gelu(x, approximate="tanh").numpy(), approx)
    with pytest.raises(ValueError):
        dtorch.nn.functional.gelu(x, approximate="fast")


@pytest.mark.parametrize("mesh_name", ["1", "3", "2x2"])
def test_erf_and_softplus(mode, mesh_name):
    """Two ops added by the recipe in docs/ADDING-AN-OP.md: a row, a kernel, a test entry."""
    mesh = MESHES[mesh_name]()
    wide = np.linspace(-30, 30, 20, dtype=np.float32).reshape(5, 4)  # both sides of the threshold
    a = wide.astype(np.float64)
    for pl in placements_for(mesh, 2):
        x = dtorch.distribute_tensor(wide, mesh, pl)
        close(dtorch.erf(x).numpy(), np.vectorize(math.erf)(a))
        close(x.erf().numpy(), np.vectorize(math.erf)(a))
        F = dtorch.nn.functional
        close(F.softplus(x).numpy(), np_softplus(a))
        close(F.softplus(x, beta=2, threshold=5).numpy(), np_softplus(a, 2, 5))
        close(F.softplus(x, 0.5, 1.0).numpy(), np_softplus(a, 0.5, 1.0))
        assert F.softplus(x).placements == x.placements == dtorch.erf(x).placements
    i = dtorch.distribute_tensor(np.arange(-3, 3, dtype=np.int64), mesh)
    assert dtorch.erf(i).dtype == dtorch.float32, "a float function of integers gives float32"
    close(dtorch.erf(i).numpy(), [math.erf(v) for v in range(-3, 3)])
    h = dtorch.distribute_tensor(X54, mesh).to(dtorch.bfloat16)
    assert dtorch.nn.functional.softplus(h).dtype == dtorch.bfloat16
    close(dtorch.nn.functional.softplus(h).numpy(), np_softplus(h.numpy()), dtorch.bfloat16)
    with pytest.raises(TypeError, match="beta must be a number"):
        dtorch.nn.functional.softplus(x, beta="2")
    with pytest.raises(TypeError, match="expected a DTensor"):
        dtorch.erf(wide)
    assert not hasattr(dtorch, "softplus") and not hasattr(dtorch.DTensor, "softplus"), "torch has neither"


# The activations' exponential (ops/op_pointwise_math.h, op_ew_exp) over a dense sweep: every
# hundredth of [-110, 110], magnitudes from 1e-45 to 3e38 of both signs, and the named extremes.
_MAGS = np.logspace(-45, 38.5, 4000)
SWEEP = np.concatenate([np.linspace(-110, 110, 22001), _MAGS, -_MAGS,
                        [0.0, -0.0, 1e-45, -1e-45, 1e-3, -1e-3, 10, -10, 88, -88, 88.72, 88.73, -88.73,
                         -103.9, -104, 100, -100, np.inf, -np.inf, np.nan]]).astype(np.float32)
GELU_TANH_2U = lambda a: 2 * math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)
# name: (the function in double precision, the argument of its exponential, the op). gelu_tanh's
# reference is x / (1 + exp(-2u)), the same function as 0.5 x (1 + tanh(u)), which loses every digit
# to cancellation in double precision where tanh(u) is near -1.
ACTIVATIONS = {
    "exp": (np.exp, lambda a: a, dtorch.exp),
    "sigmoid": (lambda a: 1 / (1 + np.exp(-a)), np.negative, dtorch.sigmoid),
    "silu": (lambda a: a / (1 + np.exp(-a)), np.negative, dtorch.nn.functional.silu),
    "gelu_tanh": (lambda a: a / (1 + np.exp(-GELU_TANH_2U(a))), lambda a: -GELU_TANH_2U(a),
                  lambda x: dtorch.nn.functional.gelu(x, approximate="tanh")),
    "softplus": (np_softplus, lambda a: a, dtorch.nn.functional.softplus),
}


def ulp32(v):
    """The spacing of float32 at each value of v (2^-149 below the normal range)."""
    f = np.abs(np.asarray(v, np.float64)).astype(np.float32)
    return np.where(f < 2.0 ** -126, 2.0 ** -149, np.nextafter(f, np.float32(np.inf)).astype(np.float64) - f)


def activation_bound(name, a, ref):
    """How far the float32 result may lie from the double one: 3 ulp (exp: 1.25; measured: 1.1 for
    exp, 2.3 for sigmoid and silu, 1.5 for softplus), plus what the formula itself gives up, as it
    does with libm's expf and in torch: the rounding of gelu_tanh's argument u, relative 2^-22 |2u|
    (178 ulp at x = -9.7, where 2u = -81); and where the exponential of -x (of -2u) overflows float32,
    x / (1 + exp(-x)) is 0 for a result below 3e-37."""
    with np.errstate(all="ignore"):
        arg = ACTIVATIONS[name][1](a)
        bound = (1.25 if name == "exp" else 3.0) * ulp32(ref)
        if name == "gelu_tanh":
            bound += 2.0 ** -22 * np.abs(arg) * np.abs(ref)
        if name in ("sigmoid", "silu", "gelu_tanh"):
            bound += np.where(arg > 88.72, 3e-37, 0.0)
    return bound


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activations_dense_sweep_against_double(thread, name):
    """Each activation against numpy in double precision within its bound, and NaN and the
    infinities where torch gives them: exp(-inf) = 0, exp(inf) = inf, sigmoid(-inf) = 0, softplus(-inf)
    = 0; silu(-inf) and gelu_tanh(-inf) are NaN (-inf / inf, as torch's x / (1 + exp(-x)))."""
    ref_fn, _, op = ACTIVATIONS[name]
    a = SWEEP.astype(np.float64)
    for mesh in (mesh_1d(1), mesh_1d(2)):
        got = op(dtorch.distribute_tensor(SWEEP, mesh, [Shard(0)])).numpy().astype(np.float64)
        with np.errstate(all="ignore"):
            ref = ref_fn(a)
            ref32 = ref.astype(np.float32).astype(np.float64)
            err = np.abs(got - ref)
        special = ~np.isfinite(ref32)
        assert np.array_equal(got[special], ref32[special], equal_nan=True), \
            f"{name}{list(SWEEP[special][got[special] != ref32[special]])}"
        err = err[~special]
        bound = activation_bound(name, a, ref)[~special]
        worst = np.argmax(err / bound)
        assert np.all(err <= bound), f"{name}({SWEEP[~special][worst]!r}) = {got[~special][worst]!r}, want {ref[~special][worst]!r}"
    extremes = {"exp": [(-np.inf, 0.0), (np.inf, np.inf), (np.nan, np.nan), (-0.0, 1.0)],
                "sigmoid": [(-np.inf, 0.0), (np.inf, 1.0), (np.nan, np.nan)],
                "silu": [(-np.inf, np.nan), (np.inf, np.inf), (np.nan, np.nan), (-0.0, -0.0)],
                "gelu_tanh": [(-np.inf, np.nan), (np.inf, np.inf), (np.nan, np.nan), (-0.0, -0.0)],
                "softplus": [(-np.inf, 0.0), (np.inf, np.inf), (np.nan, np.nan)]}[name]
    x = np.array([v for v, _ in extremes], np.float32)
    got = op(dtorch.distribute_tensor(x, mesh_1d(1))).numpy()
    want = np.array([w for _, w in extremes], np.float32)
    assert np.array_equal(got, want, equal_nan=True), f"{name}({list(x)}) = {list(got)}, want {list(want)}"
    number = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[number]), np.signbit(want[number])), "the sign of a zero"


@pytest.mark.parametrize("dtype", [dtorch.float16, dtorch.bfloat16])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activations_sweep_16bit(thread, name, dtype):
    """16-bit inputs, computed in float32: within the float32 bound of the stored 16-bit input's
    value, plus half an ulp of the 16-bit result (its rounding), NaN and infinities as the float32
    reference rounds them."""
    ref_fn, _, op = ACTIVATIONS[name]
    mesh = mesh_1d(2)
    x = dtorch.distribute_tensor(SWEEP, mesh, [Shard(0)]).to(dtype)
    a = x.numpy().astype(np.float64)  # the 16-bit values, exactly
    got = op(x)
    assert got.dtype == dtype
    got = got.numpy().astype(np.float64)
    with np.errstate(all="ignore"):
        ref = ref_fn(a)
        ref16 = dtorch.distribute_tensor(ref.astype(np.float32), mesh, [Shard(0)]).to(dtype).numpy().astype(np.float64)
    special = ~np.isfinite(ref16)
    assert np.array_equal(got[special], ref16[special], equal_nan=True)
    mant, tiny = (10, 2.0 ** -24) if dtype == dtorch.float16 else (7, 2.0 ** -133)
    with np.errstate(all="ignore"):
        half_ulp = np.maximum(2.0 ** (np.floor(np.log2(np.abs(ref))) - mant - 1), tiny / 2)
        err = np.abs(got - ref)[~special]
    bound = (activation_bound(name, a, ref) + half_ulp)[~special]
    worst = np.argmax(err / bound)
    assert np.all(err <= bound), f"{name}({a[~special][worst]!r}) = {got[~special][worst]!r}, want {ref[~special][worst]!r}"


@pytest.mark.parametrize("dtype", [dtorch.float16, dtorch.bfloat16])
def test_unary_16bit(thread, dtype):
    mesh = mesh_1d(2)
    x = dtorch.distribute_tensor(X54, mesh, [Shard(0)]).to(dtype)
    assert x.dtype == dtype
    stored = x.numpy().astype(np.float64)  # the 16-bit values, exactly
    for name in ("exp", "tanh", "silu", "neg"):
        y = getattr(dtorch, name)(x)
        assert y.dtype == dtype
        close(y.numpy(), UNARY[name][0](stored), dtype)


def test_unary_integer_rules(thread):
    mesh = mesh_1d(3)
    i = dtorch.arange(-3, 4, device_mesh=mesh, placements=[Shard(0)])
    ref = np.arange(-3, 4)
    assert (-i).dtype == dtorch.int64 and np.array_equal((-i).numpy(), -ref)
    assert np.array_equal(dtorch.abs(i).numpy(), np.abs(ref))
    assert np.array_equal(dtorch.relu(i).numpy(), np.maximum(ref, 0))
    e = dtorch.exp(i)
    assert e.dtype == dtorch.float32, "float functions of integers give float32, as torch"
    close(e.numpy(), np.exp(ref))
    b = i > 0
    with pytest.raises(TypeError):
        -b
    assert np.array_equal((~b).numpy(), ref <= 0)


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
    "minimum": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}
SHAPES = [((5, 4), (5, 4)), ((5, 4), (4,)), ((5, 1), (1, 4)), ((6, 1, 3), (2, 1)), ((), (5, 4))]


def values(shape, seed):
    r = np.random.default_rng(seed)
    return np.round(r.standard_normal(shape) * 4).astype(np.float32)  # integral: exact comparisons


@pytest.mark.parametrize("mesh_name", ["1", "3", "4", "2x2"])
@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcasting(thread, mesh_name, name):
    mesh = MESHES[mesh_name]()
    fn = getattr(dtorch, name)
    for sa, sb in SHAPES:
        a, b = values(sa, 1), values(sb, 2)
        b = np.where(b == 0, 1, b) if name == "div" else b
        for pa in placements_for(mesh, len(sa))[:6]:
            for pb in placements_for(mesh, len(sb))[:4]:
                x, y = dtorch.distribute_tensor(a, mesh, pa), dtorch.distribute_tensor(b, mesh, pb)
                got = fn(x, y)
                ref = BINARY[name](a, b)
                assert got.shape == ref.shape
                if ref.dtype == np.bool_:
                    assert got.dtype == dtorch.bool and np.array_equal(got.numpy(), ref)
                else:
                    close(got.numpy(), ref)


def test_binary_keeps_shards_without_communication(thread):
    mesh = mesh_1d(4)
    a, b = values((6, 4), 3), values((4,), 4)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    bias = dtorch.distribute_tensor(b, mesh, [Replicate()])
    assert (x + bias).placements == (Shard(0),)
    y = dtorch.distribute_tensor(a, mesh, [Shard(1)])
    col_bias = dtorch.distribute_tensor(b, mesh, [Shard(0)])
    assert (y * col_bias).placements == (Shard(1),), "S1 + S0 of a 1-D bias lines up with broadcasting"
    assert np.array_equal((y * col_bias).numpy(), a * b)
    # mismatched shards: the output follows one input and the other is moved
    z = x + y
    assert z.placements in ((Shard(0),), (Shard(1),))
    assert np.array_equal(z.numpy(), 2 * a)


def test_numbers_on_either_side(thread):
    mesh = mesh_1d(3)
    a = values((5, 4), 5)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    close((x + 1.5).numpy(), a + 1.5)
    close((2 - x).numpy(), 2 - a)
    close((x * 3).numpy(), a * 3)
    close((1 / (x + 100)).numpy(), 1 / (a + 100))
    close((x ** 2).numpy(), a ** 2)
    close((2 ** (x / 4)).numpy(), 2 ** (a / 4))
    assert np.array_equal((x >= 0).numpy(), a >= 0)
    assert np.array_equal((0 < x).numpy(), 0 < a)
    close(dtorch.maximum(x, dtorch.distribute_tensor(np.zeros(4, np.float32), mesh)).numpy(), np.maximum(a, 0))


def test_type_promotion(thread):
    mesh = mesh_1d(2)
    i = dtorch.arange(6, device_mesh=mesh, placements=[Shard(0)])
    f = dtorch.ones(6, device_mesh=mesh, placements=[Shard(0)])
    i32 = i.to(dtorch.int32)
    assert (i + 1).dtype == dtorch.int64
    assert (i + 1.5).dtype == dtorch.float32
    assert (i + f).dtype == dtorch.float32
    assert (i32 + i).dtype == dtorch.int64
    assert (i32 * 2).dtype == dtorch.int32
    assert (i / 2).dtype == dtorch.float32 and np.array_equal((i / 2).numpy(), np.arange(6) / 2)
    assert (i // 1 if False else i ** 2).dtype == dtorch.int64
    h = f.to(dtorch.float16)
    assert (h + f).dtype == dtorch.float32
    assert (h + 1).dtype == dtorch.float16
    assert (h + f.to(dtorch.bfloat16)).dtype == dtorch.float32
    b = i > 2
    assert (b + b).dtype == dtorch.bool and np.array_equal((b + b).numpy(), np.arange(6) > 2)
    assert (b * i).dtype == dtorch.int64
    assert np.array_equal((b & (i < 5)).numpy(), (np.arange(6) > 2) & (np.arange(6) < 5))
    assert np.array_equal((b | (i < 1)).numpy(), (np.arange(6) > 2) | (np.arange(6) < 1))
    with pytest.raises(TypeError):
        b - b


@pytest.mark.parametrize("mesh_name,placement", [("1", Replicate()), ("3", Shard(1)), ("2x2", Shard(0))])
def test_converted_operands_in_blocks(thread, mesh_name, placement):
    """Operands of the output's shape in dtypes other than the one the op computes in (16-bit
    floats and int32 computed in float32, a 16-bit result) go through in blocks of 1024 elements:
    4500 elements per tensor (uneven blocks and shards), each result exactly the float32 arithmetic
    on the stored values, rounded once to the output's dtype (numpy's own float32 and float16 and a
    bfloat16 rounding written here)."""
    mesh = MESHES[mesh_name]()
    pl = [placement] * mesh.ndim if placement == Replicate() else [placement] + [Replicate()] * (mesh.ndim - 1)
    a32 = (rng.standard_normal((3, 1500)) * 4).astype(np.float32)
    b32 = (rng.standard_normal((3, 1500)) * 4).astype(np.float32)
    n32 = rng.integers(-50, 50, (3, 1500)).astype(np.int32)
    a = dtorch.distribute_tensor(a32, mesh, pl)
    b = dtorch.distribute_tensor(b32, mesh, pl)
    n = dtorch.distribute_tensor(n32, mesh, pl)
    ab, bb, bh = a.to(dtorch.bfloat16), b.to(dtorch.bfloat16), b.to(dtorch.float16)
    av, bv, hv = (t.numpy().astype(np.float32) for t in (ab, bb, bh))
    cases = [
        ("bf16 + bf16", ab + bb, dtorch.bfloat16, bf16(av + bv)),
        ("bf16 * bf16", ab * bb, dtorch.bfloat16, bf16(av * bv)),
        ("bf16 - 2.5", ab - 2.5, dtorch.bfloat16, bf16(av - np.float32(2.5))),
        ("3 / bf16", 3 / ab, dtorch.bfloat16, bf16(np.float32(3) / av)),
        ("int32 + bf16", n + bb, dtorch.bfloat16, bf16(n32.astype(np.float32) + bv)),
        ("f16 * bf16", bh * bb, dtorch.float32, hv * bv),
        ("f16 + f16", bh + bh, dtorch.float16, (hv + hv).astype(np.float16)),
        ("bf16 > bf16", ab > bb, dtorch.bool, av > bv),
        ("int32 <= f16", n <= bh, dtorch.bool, n32.astype(np.float32) <= hv),
    ]
    for what, got, dtype, ref in cases:
        assert got.dtype == dtype, what
        g = got.numpy()
        assert g.shape == ref.shape, what
        assert np.array_equal(g.astype(np.float64), np.asarray(ref).astype(np.float64)), what


def test_integer_arithmetic_exact(thread):
    mesh = mesh_1d(4)
    a = np.array([-7, -3, 0, 2, 5, 9, 2 ** 40], np.int64)
    b = np.array([2, 3, 1, -4, 5, 2, 3], np.int64)
    x, y = dtorch.distribute_tensor(a, mesh, [Shard(0)]), dtorch.distribute_tensor(b, mesh, [Shard(0)])
    assert np.array_equal((x + y).numpy(), a + b)
    assert np.array_equal((x - y).numpy(), a - b)
    assert np.array_equal((x * y).numpy(), a * b)
    assert np.array_equal(dtorch.maximum(x, y).numpy(), np.maximum(a, b))
    assert np.array_equal((y ** 2).numpy(), b ** 2)


def test_partial_rules(thread):
    mesh = mesh_1d(3)
    parts = [np.full((2, 3), i + 1.0, np.float32) for i in range(3)]  # value: 6 everywhere
    p = dtorch.from_local(parts, mesh, [Partial("sum")])
    q = dtorch.from_local(parts, mesh, [Partial("sum")])
    r = dtorch.distribute_tensor(np.full((2, 3), 2.0, np.float32), mesh)
    assert (p + q).placements == (Partial("sum"),) and np.array_equal((p + q).numpy(), np.full((2, 3), 12.0))
    assert (p * r).placements == (Partial("sum"),) and np.array_equal((p * r).numpy(), np.full((2, 3), 12.0))
    assert (p * 2).placements == (Partial("sum"),) and np.array_equal((p * 2).numpy(), np.full((2, 3), 12.0))
    assert (p / r).placements == (Partial("sum"),) and np.array_equal((p / r).numpy(), np.full((2, 3), 3.0))
    assert (-p).placements == (Partial("sum"),) and np.array_equal((-p).numpy(), np.full((2, 3), -6.0))
    # non-linear: reduced first, the value is exact
    assert (p + 1).placements == (Replicate(),) and np.array_equal((p + 1).numpy(), np.full((2, 3), 7.0))
    assert dtorch.relu(p - 7).placements == (Replicate(),)
    close(dtorch.exp(p).numpy(), np.exp(np.full((2, 3), 6.0)))
    assert np.array_equal((p * q).numpy(), np.full((2, 3), 36.0)), "P * P reduces one operand"
    assert np.array_equal((r / p).numpy(), np.full((2, 3), 2 / 6, np.float32))
    m = dtorch.from_local(parts, mesh, [Partial("max")])
    assert np.array_equal((m + 1).numpy(), np.full((2, 3), 4.0))


def test_partial_times_infinity_and_over_zero(mode):
    """A Partial sum times an infinite number, or over the number 0, is reduced first: per device,
    a zero contribution would give nan where the whole value gives inf (torch on the whole value:
    [1, 0] / 0 is [inf, nan]). Finite numbers keep the Partial (linear, no communication)."""
    mesh = mesh_1d(2)
    p = dtorch.from_local([np.array([1.0, 0.0], np.float32), np.zeros(2, np.float32)], mesh, [Partial("sum")])
    with np.errstate(divide="ignore", invalid="ignore"):
        whole = np.array([1.0, 0.0], np.float32)
        for got, want in ((p / 0.0, whole / np.float32(0)), (p / 0, whole / np.float32(0)),
                          (p * math.inf, whole * np.float32(math.inf)), (-math.inf * p, whole * np.float32(-math.inf)),
                          (p * math.nan, whole * np.float32(math.nan))):
            np.testing.assert_array_equal(got.numpy(), want)
            assert got.placements == (Replicate(),)
    for linear in (p / 4.0, p * 3, 0.5 * p):
        assert linear.placements == (Partial("sum"),)
    np.testing.assert_array_equal((p / 4.0).numpy(), [0.25, 0.0])


def test_partial_on_2d_mesh(thread):
    mesh = mesh_2x2()
    base = values((4, 3), 7)
    pieces = [base[0:2] * (j + 1) if i == 0 else base[2:4] * (j + 1) for i in range(2) for j in range(2)]
    p = dtorch.from_local(pieces, mesh, [Shard(0), Partial("sum")])
    assert np.array_equal(p.numpy(), base * 3)
    y = p * 2 + p
    assert y.placements == (Shard(0), Partial("sum"))
    assert np.array_equal(y.numpy(), base * 9)


def test_where_masked_fill_clamp(thread):
    for mesh in (mesh_1d(1), mesh_1d(4), mesh_2x2()):
        a = values((5, 4), 8)
        for pl in placements_for(mesh, 2)[:5]:
            x = dtorch.distribute_tensor(a, mesh, pl)
            cond = x > 0
            assert np.array_equal(dtorch.where(cond, x, -x).numpy(), np.abs(a))
            assert np.array_equal(dtorch.where(cond, x, 0.0).numpy(), np.where(a > 0, a, 0))
            assert np.array_equal(dtorch.where(cond, 1.0, x).numpy(), np.where(a > 0, 1.0, a))
            for idt in (np.int64, np.int32):   # the greedy argmax's where(x == max, positions, V)
                xi = dtorch.distribute_tensor((a * 4).astype(idt), mesh, pl)
                assert np.array_equal(dtorch.where(cond, xi, 77).numpy(), np.where(a > 0, (a * 4).astype(idt), 77))
                assert np.array_equal(dtorch.where(cond, -5, xi).numpy(), np.where(a > 0, -5, (a * 4).astype(idt)))
            assert np.array_equal(x.masked_fill(cond, -1).numpy(), np.where(a > 0, -1, a))
            row = dtorch.distribute_tensor(np.array([True, False, True, False]), mesh)
            assert np.array_equal(x.masked_fill(row, 9).numpy(), np.where([True, False, True, False], 9, a))
            assert np.array_equal(dtorch.clamp(x, -2, 3).numpy(), np.clip(a, -2, 3))
            assert np.array_equal(x.clamp(min=0).numpy(), np.maximum(a, 0))
            assert np.array_equal(x.clamp(max=1.5).numpy(), np.minimum(a, 1.5))
    i = dtorch.arange(8, device_mesh=mesh_1d(3), placements=[Shard(0)])
    assert np.array_equal(i.clamp(2, 5).numpy(), np.clip(np.arange(8), 2, 5))
    assert i.clamp(2, 5).dtype == dtorch.int64
    with pytest.raises(ValueError):
        dtorch.clamp(i)


@pytest.mark.parametrize("src", [dtorch.float32, dtorch.float16, dtorch.bfloat16, dtorch.int32, dtorch.int64,
                                 dtorch.bool])
def test_casts(thread, src):
    mesh = mesh_1d(3)
    a = np.array([-2.75, -1.0, 0.0, 0.5, 1.5, 3.0, 100.25], np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)]).to(src)
    ref = {dtorch.float32: a, dtorch.float16: a.astype(np.float16).astype(np.float32), dtorch.bfloat16: bf16(a),
           dtorch.int32: np.trunc(a), dtorch.int64: np.trunc(a), dtorch.bool: a != 0}[src]
    assert x.dtype == src
    assert np.array_equal(x.numpy().astype(np.float64), np.asarray(ref, np.float64))
    for dst in (dtorch.float32, dtorch.int64, dtorch.bool):
        y = x.to(dst)
        assert y.dtype == dst and y.placements == (Shard(0),)
        want = np.asarray(ref, np.float64)
        want = want != 0 if dst == dtorch.bool else np.trunc(want) if dst == dtorch.int64 else want
        assert np.array_equal(y.numpy().astype(np.float64), np.asarray(want, np.float64))


@pytest.mark.parametrize("src", [dtorch.float32, dtorch.float16, dtorch.bfloat16])
def test_casts_of_values_no_integer_holds(thread, src):
    """NaN, the infinities and values beyond the integer type's range convert to its minimum, as
    torch's conversion gives on x86 (a hand table); the rest truncate toward zero. Also inside a
    reduction's dtype= conversion."""
    mesh = mesh_1d(2)
    a = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e9, -3e9, 2.5, -2.5, 0.0], np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)]).to(src)
    lo64, lo32 = np.iinfo(np.int64).min, np.iinfo(np.int32).min
    held = x.to(dtorch.float32).numpy().astype(np.float64)  # 3e9 is 3003121664 in bfloat16, inf in float16
    with np.errstate(invalid="ignore"):
        want64 = [int(v) if np.isfinite(v) and abs(v) < 2.0**63 else lo64 for v in held]
        want32 = [int(v) if np.isfinite(v) and -2.0**31 - 1 < v < 2.0**31 else lo32 for v in held]
    assert want64[:5] == [lo64] * 5 and want32[5:] == [lo32, lo32, 2, -2, 0]  # the table's shape
    assert x.to(dtorch.int64).numpy().tolist() == want64
    assert x.to(dtorch.int32).numpy().tolist() == want32
    ints = dtorch.distribute_tensor(np.array([np.nan, 2.5, 1.5], np.float32), mesh, [Shard(0)])
    assert int(dtorch.sum(ints, dtype=dtorch.int64).numpy()) == lo64 + 3


def test_bad_input(thread):
    mesh = mesh_1d(2)
    x = dtorch.ones(5, 4, device_mesh=mesh, placements=[Shard(0)])
    with pytest.raises(ValueError, match="size of tensor"):
        x + dtorch.ones(3, device_mesh=mesh)
    with pytest.raises(TypeError):
        x + "one"
    with pytest.raises(TypeError):
        x + np.ones(4)
    with pytest.raises(TypeError, match="bool"):
        dtorch.where(x, x, x)
    other = mesh_1d(3)
    with pytest.raises(RuntimeError, match="cross-mesh"):
        x + dtorch.ones(5, 4, device_mesh=other)
    with pytest.raises(TypeError):
        x.masked_fill(x, 0)
    assert np.array_equal((x + 1).numpy(), np.full((5, 4), 2.0)), "the runtime keeps working"


def test_strict_mode_names_op_and_placements(thread):
    mesh = mesh_1d(2)
    x = dtorch.ones(4, 4, device_mesh=mesh, placements=[Shard(0)])
    y = dtorch.ones(4, 4, device_mesh=mesh, placements=[Shard(1)])
    dtorch.set_strict(True)
    try:
        with pytest.raises(RuntimeError, match=r"add.*Shard\(dim=1\)"):
            x + y
        assert (x + x).placements == (Shard(0),), "no redistribute needed: fine in strict mode"
    finally:
        dtorch.set_strict(False)
    assert np.array_equal((x + y).numpy(), np.full((4, 4), 2.0))


def test_process_mode_subset():
    dtorch.shutdown()
    dtorch.init(workers="process")
    try:
        mesh = mesh_2x2()
        a = values((5, 4), 9)
        x = dtorch.distribute_tensor(a, mesh, [Shard(0), Shard(1)])
        b = dtorch.distribute_tensor(a[0], mesh)
        assert np.array_equal((x * b - 1).numpy(), a * a[0] - 1)
        close(dtorch.sigmoid(x).numpy(), 1 / (1 + np.exp(-a.astype(np.float64))))
        assert np.array_equal(dtorch.where(x > 0, x, 0).numpy(), np.maximum(a, 0))
    finally:
        dtorch.shutdown()


# Python's // and % on these: floor division and a remainder with the divisor's sign
SIGNED = np.array([[-7, -6, -5, -1], [0, 1, 5, 6], [7, 11, -11, 3], [-3, 2, -2, 9], [4, -4, 8, -8]])
DIVISORS = np.array([3, -3, 2, -5])


@pytest.mark.parametrize("mesh_name", MESHES)
def test_floor_divide_and_remainder_as_python(mode, mesh_name):
    """x // y and x % y (floor_divide, remainder) give Python's values, which numpy's follow: on
    int64, int32 and float32, with a row broadcast, a number on either side, every placement."""
    mesh = MESHES[mesh_name]()
    for np_dtype in (np.int64, np.int32, np.float32):
        a, b = SIGNED.astype(np_dtype), DIVISORS.astype(np_dtype)
        if np_dtype == np.float32:
            a, b = a / 2, b / 4  # halves and quarters: exact in float32
        for pl in placements_for(mesh, 2):
            x = dtorch.distribute_tensor(a, mesh, pl)
            y = dtorch.distribute_tensor(b, mesh)
            what = f"{np_dtype.__name__} {pl}"
            for got, want in ((x // y, a // b), (x % y, a % b), (dtorch.floor_divide(x, y), a // b),
                              (x.remainder(y), a % b), (x // 3, a // 3), (x % -3, a % -3), (17 // x[0], 17 // a[0]),
                              (-17 % x[0], -17 % a[0])):
                assert got.dtype == dtorch.float32 if np_dtype == np.float32 else got.dtype.itemsize == want.itemsize
                np.testing.assert_array_equal(got.numpy(), want, err_msg=what)
            assert (x // y).placements == x.placements, what
    assert (dtorch.arange(5, device_mesh=mesh) // 2.0).dtype == dtorch.float32, "a float number promotes"
    f = dtorch.distribute_tensor(np.array([3.5, -3.5, 0.0], np.float32), mesh)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal((f // 0.0).numpy(), np.array([3.5, -3.5, 0.0], np.float32) // np.float32(0))
        np.testing.assert_array_equal((f % 0.0).numpy(), np.array([np.nan] * 3, np.float32))


def test_integer_division_by_zero_raises(mode):
    """An integer // 0 or % 0 fails with ZeroDivisionError in its message, as torch's CPU kernels,
    not with a value; the runtime works after."""
    mesh = mesh_1d(3)
    x = dtorch.distribute_tensor(np.arange(6, dtype=np.int64), mesh, [Shard(0)])
    zero_on_one = dtorch.distribute_tensor(np.array([1, 1, 1, 1, 0, 1]), mesh, [Shard(0)])
    for bad in (lambda: x // 0, lambda: x % 0, lambda: x // zero_on_one, lambda: 5 % zero_on_one):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            bad().numpy()
    np.testing.assert_array_equal((x // 2).numpy(), np.arange(6) // 2)


@pytest.mark.parametrize("mesh_name", ["1", "3", "2x2"])
def test_floor_ceil_round_trunc(mode, mesh_name):
    """Rounding ops: floats as numpy's (round: halves to even, as torch); integers unchanged, of
    their own dtype; bool refused."""
    mesh = MESHES[mesh_name]()
    a = (np.arange(-12, 12, dtype=np.float32) / 4).reshape(6, 4)  # quarters, halves and wholes
    want = {"floor": np.floor(a), "ceil": np.ceil(a), "round": np.round(a), "trunc": np.trunc(a)}
    assert want["round"][0, 2] == -2.0 and want["round"][4, 2] == 2.0, "halves go to even"
    for pl in placements_for(mesh, 2):
        x = dtorch.distribute_tensor(a, mesh, pl)
        for name, ref in want.items():
            np.testing.assert_array_equal(getattr(dtorch, name)(x).numpy(), ref, err_msg=f"{name} {pl}")
            np.testing.assert_array_equal(getattr(x, name)().numpy(), ref, err_msg=f"{name} {pl}")
        h = x.to(dtorch.bfloat16)
        assert h.round().dtype == dtorch.bfloat16
        np.testing.assert_array_equal(h.floor().numpy(), np.floor(a))
    i = dtorch.distribute_tensor(np.array([-3, 0, 7], np.int32), mesh)
    for name in want:
        assert getattr(i, name)().dtype == dtorch.int32
        np.testing.assert_array_equal(getattr(i, name)().numpy(), [-3, 0, 7])
    flags = dtorch.distribute_tensor(np.array([True, False]), mesh)
    for bad in (flags.floor, flags.round, lambda: flags // flags, lambda: flags % True):
        with pytest.raises(TypeError, match="not supported on"):
            bad()


def test_python_conversions_of_one_element(mode):
    """bool(), float(), int() and an index from a one-element DTensor, as torch's; more or fewer
    elements are ambiguous."""
    mesh = mesh_1d(2)
    x = dtorch.distribute_tensor(np.array([2.5, -1.0, 4.0], np.float32), mesh, [Shard(0)])
    assert bool(x.sum() > 5) is True and bool(x[1] > 0) is False
    assert float(x[0]) == 2.5 and int(x[0]) == 2 and int(x[1]) == -1
    n = dtorch.arange(4, device_mesh=mesh)[2]
    assert ["a", "b", "c"][n] == "c" and range(10)[n:] == range(2, 10)
    with pytest.raises(TypeError, match="only integer tensors"):
        ["a", "b", "c"][x[0]]
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        bool(x)
    with pytest.raises(RuntimeError, match="no values is ambiguous"):
        bool(x[3:])
    with pytest.raises(RuntimeError, match="3 elements cannot be converted"):
        float(x)
    assert (x if x[0] > 0 else None) is x


@pytest.mark.parametrize("mesh_name", ["1", "2", "3", "2x2"])
def test_var_and_std(mode, mesh_name):
    """var and std against numpy's with ddof = correction (Bessel's by default, unbiased=False is
    0), over every dim, one dim and two, keepdim, on every placement."""
    mesh = MESHES[mesh_name]()
    a = (np.arange(60, dtype=np.float32).reshape(3, 4, 5) ** 1.5 % 7) - 3
    for pl in [[Replicate()] * mesh.ndim, [Shard(0)] + [Shard(2)] * (mesh.ndim - 1), [Shard(1)] * mesh.ndim]:
        x = dtorch.distribute_tensor(a, mesh, pl)
        what = str(pl)
        close(x.var().numpy(), np.var(a, ddof=1))
        close(dtorch.std(x).numpy(), np.std(a, ddof=1))
        close(x.var(1).numpy(), np.var(a, axis=1, ddof=1))
        close(x.var(-1, keepdim=True).numpy(), np.var(a, axis=-1, ddof=1, keepdims=True))
        close(x.std((0, 2), unbiased=False).numpy(), np.std(a, axis=(0, 2)))
        close(x.var(dim=1, correction=2).numpy(), np.var(a, axis=1, ddof=2))
        close(x.var(False).numpy(), np.var(a))
        assert x.var(1, keepdim=True).shape == (3, 1, 5), what
    one = dtorch.distribute_tensor(np.ones((1, 3), np.float32), mesh)
    assert np.isnan(one.var(0).numpy()).all(), "N - correction = 0: 0/0"
    with pytest.raises(TypeError, match="floating"):
        dtorch.arange(5, device_mesh=mesh).var()
    with pytest.raises(TypeError, match="not both"):
        x.var(0, unbiased=True, correction=1)


@pytest.mark.parametrize("mesh_name", ["1", "3", "2x2"])
def test_like_factories_and_new_ones(mode, mesh_name):
    """zeros_like and its kin keep the input's shape, dtype (unless given), mesh and placements,
    Partial becoming Replicate (torch's DTensor rule); new_* make the size asked for on the same
    mesh, laid out as the input when the shapes match, else replicated."""
    mesh = MESHES[mesh_name]()
    x = dtorch.distribute_tensor(np.arange(35, dtype=np.int32).reshape(7, 5), mesh,
                                 [Shard(1)] + [Shard(0)] * (mesh.ndim - 1))
    for fn, value in ((dtorch.zeros_like, 0), (dtorch.ones_like, 1), (lambda t, **k: dtorch.full_like(t, 3, **k), 3)):
        y = fn(x)
        assert (y.shape, y.dtype, y.placements, y.device_mesh) == (x.shape, x.dtype, x.placements, x.device_mesh)
        np.testing.assert_array_equal(y.numpy(), np.full((7, 5), value, np.int32))
        assert fn(x, dtype=dtorch.bfloat16).dtype == dtorch.bfloat16
    assert dtorch.empty_like(x).shape == (7, 5)
    r = dtorch.rand_like(x, dtype=dtorch.float32).numpy()
    assert r.shape == (7, 5) and (r >= 0).all() and (r < 1).all() and len(np.unique(r)) > 30
    assert abs(float(dtorch.randn_like(dtorch.zeros(100, 100, device_mesh=mesh)).numpy().mean())) < 0.05
    partial = dtorch.from_local([np.ones(1, np.float32)] * mesh.size(), mesh, [Partial()] * mesh.ndim)
    z = dtorch.ones_like(partial)
    assert z.placements == tuple([Replicate()] * mesh.ndim)
    np.testing.assert_array_equal(z.numpy(), [1.0])
    same = x.new_zeros(7, 5)
    assert same.placements == x.placements and same.dtype == dtorch.int32
    other = x.new_ones((2, 3), dtype=dtorch.float32)
    assert other.placements == tuple([Replicate()] * mesh.ndim) and other.device_mesh == mesh
    np.testing.assert_array_equal(other.numpy(), np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(x.new_full((2,), 9).numpy(), [9, 9])
    assert x.new_empty(3).shape == (3,)
    with pytest.raises(TypeError, match="expected a DTensor"):
        dtorch.zeros_like(np.zeros(3))


def torch_clamp(a, lo=None, hi=None):
    """torch.clamp's values: min(max(a, lo), hi), NaN from the input or from a bound propagating,
    so a lower bound above the upper gives the upper one (numpy's maximum and minimum agree)."""
    with np.errstate(invalid="ignore"):
        if lo is not None:
            a = np.maximum(a, lo)
        if hi is not None:
            a = np.minimum(a, hi)
    return a


@pytest.mark.parametrize("mesh_name", MESHES)
def test_clamp_as_torch(mode, mesh_name):
    """clamp, clip, clamp_min and clamp_max with number and tensor bounds: a lower bound above the
    upper gives the upper one everywhere (arange(6).clamp(5, 2) is all 2), NaN in the input or a
    bound gives NaN, type promotion and range checks as torch's, integers exact to 2^63, on every
    placement."""
    mesh = MESHES[mesh_name]()
    a = values((5, 4), 21)
    a[1, 2] = a[4, 0] = np.nan
    lo_row = values((4,), 22) - 1
    hi_col = values((5, 1), 23)
    lo_row[3], hi_col[2, 0] = np.nan, -9  # a NaN bound, and an upper bound below every lower one
    nan = float("nan")
    for pl in placements_for(mesh, 2):
        x = dtorch.distribute_tensor(a, mesh, pl)
        lo, hi = dtorch.distribute_tensor(lo_row, mesh), dtorch.distribute_tensor(hi_col, mesh)
        what = str(pl)
        cases = ((x.clamp(5, 2), torch_clamp(a, 5, 2)), (dtorch.clamp(x, -2, 3), torch_clamp(a, -2, 3)),
                 (x.clip(min=0), torch_clamp(a, 0)), (x.clamp(max=1.5), torch_clamp(a, None, 1.5)),
                 (x.clamp(min=nan), torch_clamp(a, nan)), (x.clamp(-1, nan), torch_clamp(a, -1, nan)),
                 (dtorch.clamp_min(x, 0.5), torch_clamp(a, 0.5)),
                 (x.clamp_max(-0.5), torch_clamp(a, None, -0.5)),
                 (x.clamp(lo, hi), torch_clamp(a, lo_row, hi_col)), (x.clamp(min=lo), torch_clamp(a, lo_row)),
                 (dtorch.clamp(x, max=hi), torch_clamp(a, None, hi_col)), (x.clamp_min(lo), torch_clamp(a, lo_row)))
        for got, want in cases:
            assert got.dtype == dtorch.float32, what
            np.testing.assert_array_equal(got.numpy(), want, err_msg=what)
        assert np.isnan(x.clamp(5, 2).numpy()[1, 2]) and (x.clamp(5, 2).numpy()[0] == 2).all()
    # integers: the same rule, exact; a float bound makes the result float32, as torch's promotion
    i = dtorch.arange(6, device_mesh=mesh, placements=[Shard(0)] + [Replicate()] * (mesh.ndim - 1))
    np.testing.assert_array_equal(i.clamp(min=5, max=2).numpy(), [2, 2, 2, 2, 2, 2])
    assert i.clamp(5, 2).dtype == dtorch.int64
    np.testing.assert_array_equal(i.clamp_min(4).numpy(), [4, 4, 4, 4, 4, 5])
    np.testing.assert_array_equal(dtorch.clamp_max(i, 1).numpy(), [0, 1, 1, 1, 1, 1])
    big = 2 ** 60 + 1  # not a double: exact only if the bound travels as an integer
    assert i.clamp(min=big).numpy().tolist() == [big] * 6
    assert i.clamp(max=-big).numpy().tolist() == [-big] * 6
    f = i.clamp(min=2.5)
    assert f.dtype == dtorch.float32
    np.testing.assert_array_equal(f.numpy(), np.maximum(np.arange(6), 2.5).astype(np.float32))
    i32 = i.to(dtorch.int32)
    assert i32.clamp(1, 3).dtype == dtorch.int32
    np.testing.assert_array_equal(i32.clamp(1, 3).numpy(), np.clip(np.arange(6), 1, 3))
    with pytest.raises(ValueError, match="cannot be converted to type int32 without overflow"):
        i32.clamp(min=2 ** 40)
    with pytest.raises(ValueError, match="cannot be converted to type float16 without overflow"):
        i.to(dtorch.float16).clamp(max=1e10)
    flags = dtorch.distribute_tensor(np.array([True, False, True]), mesh)
    assert flags.clamp(0, 0).dtype == dtorch.int64
    np.testing.assert_array_equal(flags.clamp(0, 0).numpy(), [0, 0, 0])
    # tensor bounds promote with the input: int32 clamped by float32 is float32
    lo_t = dtorch.distribute_tensor(np.array([0.5, 4.5, 1.0, 9.0, -1.0, 2.0], np.float32), mesh)
    t = i32.clamp(min=lo_t)
    assert t.dtype == dtorch.float32
    np.testing.assert_array_equal(t.numpy(), np.maximum(np.arange(6), [0.5, 4.5, 1.0, 9.0, -1.0, 2.0]))
    with pytest.raises(ValueError, match="At least one of 'min' or 'max' must not be None"):
        x.clamp()


@pytest.mark.parametrize("mesh_name", MESHES)
def test_var_std_with_correction_of_n_or_more(mode, mesh_name):
    """torch divides by max(0, N - correction), as numpy's ddof: N - correction <= 0 gives inf for
    a nonzero sum of squares and nan for a zero one, never a negative variance; a negative
    correction divides by more than N; dim=() is every dim. Over sharded and replicated dims."""
    mesh = MESHES[mesh_name]()
    a = np.array([[0, 1, 2, 3, 4, 5], [2, 2, 2, 2, 2, 2], [1, -1, 3, 0, 0, 7]], np.float32)
    for pl in [[Replicate()] * mesh.ndim, [Shard(1)] * mesh.ndim, [Shard(0)] + [Shard(1)] * (mesh.ndim - 1)]:
        x = dtorch.distribute_tensor(a, mesh, pl)
        row = dtorch.distribute_tensor(a[0], mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
        what = str(pl)
        assert row.var(correction=10).item() == math.inf, what  # the reported case: 17.5 / 0
        assert row.std(correction=10).item() == math.inf, what
        assert row.var(correction=6).item() == math.inf, what
        assert row.var(correction=-2).item() == 17.5 / 8, what
        with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for correction in (5, 6, 9, -1, 0):
                want = np.var(a, axis=1, ddof=correction)
                # inf and nan where numpy has them, close elsewhere
                np.testing.assert_allclose(x.var(1, correction=correction).numpy(), want, rtol=1e-6, err_msg=what)
                np.testing.assert_allclose(x.std(dim=-1, correction=correction).numpy(), np.sqrt(want), rtol=1e-6,
                                           err_msg=what)
            got = x.var(1, correction=6).numpy()
            assert got[0] == got[2] == math.inf and np.isnan(got[1]), "x / 0 is inf, 0 / 0 is nan"
            np.testing.assert_allclose(x.var(0, correction=3).numpy(), np.var(a, axis=0, ddof=3), rtol=1e-6,
                                       err_msg=what)
            close(x.var(dim=()).numpy(), np.var(a, ddof=1))


@pytest.mark.parametrize("mesh_name", ["1", "3", "4", "2x2"])
def test_integer_pow_negative_exponents(mode, mesh_name):
    """An integer tensor to a negative integer number raises as torch does ("Integers to negative
    integer powers are not allowed."), bool too; a float exponent promotes; an integer tensor of
    exponents gives torch's integer values (0 for |base| > 1 and for 0, 1 for 1, +-1 for -1)."""
    mesh = MESHES[mesh_name]()
    pl = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
    base = np.array([0, 1, -1, 2, -1, 3, -3, 5], np.int64)
    exps = np.array([-1, -1, -1, -1, -2, 2, 3, -7], np.int64)
    want = np.array([0, 1, -1, 0, 1, 9, -27, 0], np.int64)  # torch's powi
    for dt in (dtorch.int64, dtorch.int32):
        x = dtorch.distribute_tensor(base, mesh, pl).to(dt)
        e = dtorch.distribute_tensor(exps, mesh, pl).to(dt)
        for bad in (lambda: x ** -1, lambda: dtorch.pow(x, -2), lambda: x.pow(-1), lambda: (x > 0) ** -1):
            with pytest.raises(ValueError, match=re.escape("Integers to negative integer powers are not allowed.")):
                bad()
        with pytest.raises(RuntimeError):  # and a RuntimeError, as torch's
            x ** -1
        got = x ** e
        assert got.dtype == dt
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal((2 ** e).numpy(), [0, 0, 0, 0, 0, 4, 8, 0])
        np.testing.assert_array_equal((x ** 2).numpy(), base ** 2)
        f = x ** -1.0
        assert f.dtype == dtorch.float32
        with np.errstate(divide="ignore"):
            np.testing.assert_array_equal(f.numpy(), base.astype(np.float32) ** np.float32(-1))
    floats = dtorch.distribute_tensor(base, mesh, pl).to(dtorch.float32)
    np.testing.assert_array_equal((floats ** -1).numpy()[1:4], [1, -1, 0.5])


@pytest.mark.parametrize("mesh_name", ["1", "3", "2x2"])
def test_var_std_of_16bit_floats_accumulate_in_float32(mode, mesh_name):
    """torch computes float16 and bfloat16 variances in float32 and rounds once: 1000 values of
    +-100 in float16 have squares summing past float16's 65504, but a variance of 10010.01 (10008
    in float16), not inf."""
    mesh = MESHES[mesh_name]()
    alt = np.tile(np.array([100, -100], np.float32), 500)
    want = np.var(alt.astype(np.float64), ddof=1)
    for pl in ([Replicate()] * mesh.ndim, [Shard(0)] * mesh.ndim):
        x = dtorch.distribute_tensor(alt, mesh, pl)
        h, b = x.to(dtorch.float16), x.to(dtorch.bfloat16)
        assert h.var().dtype == dtorch.float16 and b.std().dtype == dtorch.bfloat16
        assert h.var().item() == float(np.float16(np.float32(want))) == 10008.0
        assert h.std().item() == float(np.float16(np.sqrt(np.float32(want))))
        assert b.var().item() == float(bf16(np.float32(want)))
        assert b.std(0).item() == float(bf16(np.sqrt(np.float32(want))))
        rows = np.full(10, np.float16(np.var(alt[:100], ddof=1)))
        np.testing.assert_array_equal(h.reshape(10, 100).var(1).numpy(), rows)
