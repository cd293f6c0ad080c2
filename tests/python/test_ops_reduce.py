"""Reductions and normalisation (ops/op_reduce.c): sum, mean, amax/amin, max/min, argmax/argmin,
softmax/log_softmax, cumsum, topk, layer_norm, rms_norm.

A differential harness: every op on meshes of 1, 2, 3, 4 devices and 2x2, with every input
placement the op accepts (Shard on each dim, nested shards on 2x2, Replicate, Partial built with
from_local), uneven and empty shards (5 and 6 rows over 4 devices give 2,2,1,0 and 2,2,2,0),
every supported dtype, against numpy in float64. Integer and bool results must match exactly;
floating results within a normalized MSE (sum((got - ref)^2) / sum(ref^2), with sums measured
against the sum of absolute values) of 1e-6 for float32,
1e-5 for float16 and 1e-4 for bfloat16 outputs (one rounding to an 8-bit significand is ~4e-6).
Output placements are checked against the no-communication rules: a reduction over a sharded
dim is Partial, shards of other dims stay (index shifted past dropped dims), Replicate stays.

The big matrix runs with thread workers; a smaller subset runs with process workers.
"""
import itertools
import warnings
import zlib

import numpy as np
import pytest

import dtorch
from conftest import MESHES, bf16_round, local_slices
from dtorch import Partial, Replicate, Shard

NMSE = {"float32": 1e-6, "float16": 1e-5, "bfloat16": 1e-4}
MESH_NAMES = ("1", "2", "3", "4", "2x2")
ALL_DTYPES = (dtorch.float32, dtorch.float16, dtorch.bfloat16, dtorch.int32, dtorch.int64, dtorch.bool)
FLOATS = (dtorch.float32, dtorch.float16, dtorch.bfloat16)
NUMERIC = FLOATS + (dtorch.int32, dtorch.int64)
SHAPES = ((5, 6), (6, 4, 3))  # over 4 devices: 2,2,1,0 and 2,2,2,0 rows
FLOAT_EPS = float(np.finfo(np.float32).eps)

# ---- runtime -----------------------------------------------------------------------------------

_current = [None]


def _ensure(mode):
    if _current[0] != mode or not dtorch.is_initialized():
        dtorch.shutdown()
        dtorch.init(workers=mode)
        _current[0] = mode


@pytest.fixture
def thread_rt():
    _ensure("thread")
    yield "thread"


@pytest.fixture
def process_rt():
    _ensure("process")
    yield "process"


@pytest.fixture(scope="module", autouse=True)
def _stop_at_end():
    yield
    dtorch.set_strict(False)
    dtorch.shutdown()
    _current[0] = None


# ---- inputs ------------------------------------------------------------------------------------

def _values(shape, dtype, rng, integral=False):
    """A float32/int/bool numpy array whose values dtype holds exactly."""
    if dtype == dtorch.bool:
        return rng.random(shape) < 0.5
    if not dtype.is_floating_point or integral:
        a = rng.integers(-9, 10, size=shape)
        return a.astype(np.int32 if dtype == dtorch.int32 else np.int64) if not dtype.is_floating_point \
            else a.astype(np.float32)
    a = (rng.standard_normal(shape) * 2).astype(np.float32)
    if dtype == dtorch.float16:
        return a.astype(np.float16).astype(np.float32)
    if dtype == dtorch.bfloat16:
        return bf16_round(a)
    return a


def _split(g, k, op, rng):
    """k contributions whose reduction by op is g, exactly (g integral)."""
    if op in ("sum", "avg"):
        r = rng.integers(-3, 4, size=(k - 1,) + g.shape).astype(g.dtype)
        last = (g * k if op == "avg" else g) - r.sum(axis=0, dtype=g.dtype)
        return list(r) + [last.astype(g.dtype)]
    owner = rng.integers(0, k, size=g.shape)
    sign = -1 if op == "max" else 1
    return [np.where(owner == j, g, g + sign * rng.integers(1, 4, size=g.shape).astype(g.dtype)) for j in range(k)]


def _make(a, dtype, mesh, placements, rng):
    """A DTensor of value a (numpy) with dtype and placements; Partial ones from from_local."""
    if not any(isinstance(p, Partial) for p in placements):
        if dtype == dtorch.bfloat16:
            return dtorch.distribute_tensor(a, mesh, placements).to(dtorch.bfloat16)
        host = a.astype(np.float16) if dtype == dtorch.float16 else a
        return dtorch.distribute_tensor(host, mesh, placements)
    shape = mesh.shape
    parts = {(): a}
    for m, p in enumerate(placements):
        parts = {key + (j,): piece for key, g in parts.items()
                 for j, piece in enumerate(_split(g, shape[m], p.reduce_op, rng) if isinstance(p, Partial)
                                           else [g] * shape[m])}
    pieces = []
    for coord in np.ndindex(*shape):
        sl = local_slices(a.shape, shape, placements, coord)
        pieces.append(np.ascontiguousarray(parts[coord][tuple(slice(lo, hi) for lo, hi in sl)]))
    return dtorch.from_local(pieces, mesh, placements, shape=a.shape)


def _placements(mesh_shape, ndim, partial_ops=()):
    """Every Shard/Replicate combination (nested shards on 2x2 included), plus Partial ones."""
    singles = [Replicate()] + [Shard(d) for d in range(ndim)]
    if len(mesh_shape) == 1:
        return [[p] for p in singles] + [[Partial(op)] for op in partial_ops]
    out = [list(pq) for pq in itertools.product(singles, singles)]
    for op in partial_ops:
        out += [[Partial(op), Shard(0)], [Shard(ndim - 1), Partial(op)], [Partial(op), Partial(op)],
                [Partial(op), Replicate()]]
    return out


def _partial_ops(dtype, ops=("sum", "avg", "max", "min")):
    """Partial inputs built for dtype (avg of integers truncates, so floats only)."""
    if dtype == dtorch.float32:
        return ops
    if dtype == dtorch.int64:
        return tuple(op for op in ops if op != "avg")
    return ()


# ---- comparisons -------------------------------------------------------------------------------

def _check(got, ref, dtype, what, scale=None):
    """scale: for sums, the same sum of absolute values; a 16-bit Partial contribution is rounded
    to its own magnitude, so cancellation is measured against the terms, not the result."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, want {ref.shape}"
    if not dtype.is_floating_point:
        np.testing.assert_array_equal(got.astype(np.int64), ref.astype(np.int64), err_msg=what)
        return
    g, r = got.astype(np.float64), ref.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(r)), f"{what}: NaN at other places\n{g}\n{r}"
    inf = np.isinf(r)
    assert np.array_equal(g[inf], r[inf]) and not np.isinf(g[~inf]).any(), f"{what}: infinities differ\n{g}\n{r}"
    fin = np.isfinite(r)
    norm = r if scale is None else np.maximum(np.abs(r), np.asarray(scale, np.float64))
    nmse = ((g[fin] - r[fin]) ** 2).sum() / max((norm[fin] ** 2).sum(), 1e-30)
    assert nmse <= NMSE[dtype.name], f"{what}: nmse {nmse:.3g}\n{g}\n{r}"


def _check_locals(out, placements_expected, what):
    """Each device's piece has the shape torch.chunk gives for the output's placements."""
    mesh_shape = out.device_mesh.shape
    locs = out.to_local()
    for coord, loc in zip(np.ndindex(*mesh_shape), locs):
        sl = local_slices(out.shape, mesh_shape, placements_expected, coord)
        assert loc.shape == tuple(hi - lo for lo, hi in sl), f"{what}: local shape {loc.shape} at {coord}"


def _shifted(d, dropped):
    return d - sum(1 for r in dropped if r < d)


# torch's dtype rules
def _sum_dtype(dtype):
    return dtype if dtype.is_floating_point else dtorch.int64


def _np(dtype):
    return {dtorch.int32: np.int64, dtorch.int64: np.int64, dtorch.bool: np.int64}.get(dtype, np.float64)


# ---- list reductions: sum, mean, amax, amin, max(), min() ------------------------------------

REDUCE_REF = {"sum": np.sum, "mean": np.mean, "amax": np.amax, "amin": np.amin, "max": np.amax, "min": np.amin}
PARTIAL_OF = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "max": "max", "min": "min"}


def _list_passes(op, have, in_dtype, out_dtype):
    if op in ("sum", "mean"):
        floats = in_dtype.is_floating_point and out_dtype.is_floating_point
        return (have == "sum" and (floats or in_dtype == out_dtype == dtorch.int64)) or (have == "avg" and floats)
    return have == PARTIAL_OF[op]


def _dim_options(ndim):
    opts = [None, 0, -1, (0, ndim - 1)]
    if ndim == 3:
        opts += [(0, 2), 1, (1, 2)]
    return opts


def _run_list(op, mesh_name, dtypes, rng):
    mesh = MESHES[mesh_name]()
    fn = getattr(dtorch, op)
    count = 0
    for shape, dtype in itertools.product(SHAPES, dtypes):
        for pl in _placements(mesh.shape, len(shape), _partial_ops(dtype)):
            partial = any(isinstance(p, Partial) for p in pl)
            a = _values(shape, dtype, rng, integral=partial)
            x = _make(a, dtype, mesh, pl, rng)
            dim_opts = [None] if op in ("max", "min") else _dim_options(len(shape))
            for i, dim in enumerate(dim_opts):
                keepdim = bool((i + count) % 2) and op not in ("max", "min")
                what = f"{op} mesh={mesh_name} {dtype} shape={shape} pl={pl} dim={dim} keepdim={keepdim}"
                out = fn(x) if op in ("max", "min") else fn(x, dim, keepdim)
                axis = None if dim is None else dim
                ref = REDUCE_REF[op](a.astype(_np(dtype)), axis=axis, keepdims=keepdim)
                out_dtype = _sum_dtype(dtype) if op == "sum" else dtype
                assert out.dtype == out_dtype, what
                if dtype == dtorch.bool and op != "sum":
                    ref = ref.astype(bool)
                scale = REDUCE_REF[op](np.abs(a.astype(_np(dtype))), axis=axis, keepdims=keepdim) \
                    if op in ("sum", "mean") else None
                _check(out.numpy(), ref, out_dtype, what, scale)
                red = set(range(len(shape))) if dim is None else {d % len(shape) for d in np.atleast_1d(dim)}
                want = []
                for p in pl:
                    if isinstance(p, Shard):
                        want.append(Partial(PARTIAL_OF[op]) if p.dim in red
                                    else Shard(p.dim if keepdim else _shifted(p.dim, red)))
                    elif isinstance(p, Partial) and _list_passes(op, p.reduce_op, dtype, out_dtype):
                        want.append(p)
                    else:
                        want.append(Replicate())
                assert out.placements == tuple(want), f"{what}: placements {out.placements}, want {want}"
                if mesh_name == "4" and i == 0:
                    _check_locals(out, want, what)
                count += 1
    return count


@pytest.mark.parametrize("mesh_name", MESH_NAMES)
@pytest.mark.parametrize("op,dtypes", [("sum", ALL_DTYPES), ("mean", FLOATS), ("amax", ALL_DTYPES),
                                       ("amin", ALL_DTYPES), ("max", ALL_DTYPES), ("min", NUMERIC)])
def test_list_reductions(thread_rt, op, dtypes, mesh_name):
    assert _run_list(op, mesh_name, dtypes, np.random.default_rng(zlib.crc32(f"{op}/{mesh_name}".encode()))) > 0


# ---- along one dim: max/min with dim, argmax/argmin, softmax, log_softmax, cumsum, topk -------

def _np_softmax(a, axis, log):
    m = np.max(a, axis=axis, keepdims=True) if a.size else 0
    e = np.exp(a - m)
    s = e.sum(axis=axis, keepdims=True)
    return (a - m) - np.log(s) if log else e / s


def _np_topk(a, k, axis, largest):
    order = np.argsort(-a if largest else a, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(a, idx, axis=axis), idx


def _along_cases(op, ndim):
    """(callable on a DTensor, reference on a float64/int64 array, dim, dims dropped) cases."""
    cases = []
    for dim in range(-1, ndim):
        d = dim % ndim
        if op in ("max", "min"):
            for keepdim in (False, True):
                npf = np.argmax if op == "max" else np.argmin
                red = np.max if op == "max" else np.min
                cases.append((lambda x, dim=dim, keepdim=keepdim: tuple(getattr(dtorch, op)(x, dim, keepdim)),
                              lambda a, d=d, keepdim=keepdim: (red(a, axis=d, keepdims=keepdim),
                                                               npf(a, axis=d, keepdims=keepdim)),
                              d, () if keepdim else (d,)))
        elif op in ("argmax", "argmin"):
            npf = np.argmax if op == "argmax" else np.argmin
            keepdim = dim == 0
            cases.append((lambda x, dim=dim, keepdim=keepdim: getattr(dtorch, op)(x, dim, keepdim),
                          lambda a, d=d, keepdim=keepdim: npf(a, axis=d, keepdims=keepdim),
                          d, () if keepdim else (d,)))
        elif op in ("softmax", "log_softmax"):
            cases.append((lambda x, dim=dim: getattr(dtorch.nn.functional, op)(x, dim),
                          lambda a, d=d: _np_softmax(a, d, op == "log_softmax"), d, ()))
        elif op == "cumsum":
            cases.append((lambda x, dim=dim: x.cumsum(dim), lambda a, d=d: np.cumsum(a, axis=d), d, ()))
        else:  # topk
            for k, largest in ((2, True), (1, False)):
                cases.append((lambda x, dim=dim, k=k, largest=largest: tuple(dtorch.topk(x, k, dim, largest)),
                              lambda a, d=d, k=k, largest=largest: _np_topk(a, k, d, largest), d, ()))
    if op in ("argmax", "argmin"):
        npf = np.argmax if op == "argmax" else np.argmin
        cases.append((lambda x: getattr(x, op)(), lambda a: np.asarray(npf(a)), None, tuple(range(ndim))))
        cases.append((lambda x: getattr(dtorch, op)(x, keepdim=True),
                      lambda a: np.asarray(npf(a)).reshape((1,) * ndim), None, ()))
    return cases


ALONG = [("max", ALL_DTYPES), ("min", NUMERIC), ("argmax", NUMERIC), ("argmin", NUMERIC), ("softmax", FLOATS),
         ("log_softmax", FLOATS), ("cumsum", ALL_DTYPES), ("topk", NUMERIC)]


def _out_dtypes(op, dtype):
    if op in ("max", "min", "topk"):
        return (dtype, dtorch.int64)
    if op in ("argmax", "argmin"):
        return (dtorch.int64,)
    if op == "cumsum":
        return (_sum_dtype(dtype),)
    return (dtype,)


@pytest.mark.parametrize("mesh_name", MESH_NAMES)
@pytest.mark.parametrize("op,dtypes", ALONG)
def test_along_one_dim(thread_rt, op, dtypes, mesh_name):
    rng = np.random.default_rng(zlib.crc32(f"{op}/{mesh_name}".encode()))
    mesh = MESHES[mesh_name]()
    for shape, dtype in itertools.product(SHAPES, dtypes):
        partial_ops = _partial_ops(dtype, ("sum", "avg", "max"))
        for pl in _placements(mesh.shape, len(shape), partial_ops):
            partial = any(isinstance(p, Partial) for p in pl)
            a = _values(shape, dtype, rng, integral=partial or op in ("max", "min", "argmax", "argmin", "topk"))
            x = _make(a, dtype, mesh, pl, rng)
            for i, (call, ref_fn, dim, dropped) in enumerate(_along_cases(op, len(shape))):
                what = f"{op} mesh={mesh_name} {dtype} shape={shape} pl={pl} case={i} dim={dim}"
                got = call(x)
                got = got if isinstance(got, tuple) else (got,)
                ref = ref_fn(a.astype(_np(dtype)))
                ref = ref if isinstance(ref, tuple) else (ref,)
                whole = set(range(len(shape))) if dim is None else {dim}
                want = []
                for p in pl:
                    if isinstance(p, Shard) and p.dim not in whole:
                        want.append(Shard(_shifted(p.dim, dropped)))
                    elif isinstance(p, Partial) and op == "cumsum" and _list_passes("sum", p.reduce_op, dtype,
                                                                                     _sum_dtype(dtype)):
                        want.append(p)
                    else:
                        want.append(Replicate())
                for o, (out, r, out_dtype) in enumerate(zip(got, ref, _out_dtypes(op, dtype))):
                    assert out.dtype == out_dtype, f"{what} output {o}: dtype {out.dtype}"
                    if dtype == dtorch.bool and op == "max" and o == 0:
                        r = r.astype(bool)
                    _check(out.numpy(), r, out_dtype, f"{what} output {o}")
                    assert out.placements == tuple(want), f"{what}: placements {out.placements}, want {want}"
                if mesh_name == "4" and i == 0:
                    _check_locals(got[0], want, what)


# ---- layer_norm, rms_norm --------------------------------------------------------------------

def _np_norm(a, nshape, weight, bias, eps, rms):
    axes = tuple(range(a.ndim - len(nshape), a.ndim))
    mu = 0 if rms else a.mean(axis=axes, keepdims=True)
    var = ((a - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (a - mu) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


@pytest.mark.parametrize("mesh_name", MESH_NAMES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_norms(thread_rt, rms, mesh_name):
    rng = np.random.default_rng(7 + rms + 10 * MESH_NAMES.index(mesh_name))
    mesh = MESHES[mesh_name]()
    F = dtorch.nn.functional
    for shape, dtype in itertools.product(SHAPES, FLOATS):
        for pl in _placements(mesh.shape, len(shape), ("sum", "max") if dtype == dtorch.float32 else ()):
            partial = any(isinstance(p, Partial) for p in pl)
            a = _values(shape, dtype, rng, integral=partial)
            x = _make(a, dtype, mesh, pl, rng)
            for n_norm in (1, 2):
                nshape = shape[-n_norm:]
                w = _values(nshape, dtype, rng)
                b = _values(nshape, dtype, rng)
                # weight and bias laid out some other way: the op replicates them
                wpl = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
                wt, bt = _make(w, dtype, mesh, wpl, rng), _make(b, dtype, mesh, [Replicate()] * mesh.ndim, rng)
                variants = [(None, None), (wt, None)] + ([] if rms else [(wt, bt), (None, bt)])
                for weight, bias in variants:
                    what = f"{'rms' if rms else 'layer'}_norm mesh={mesh_name} {dtype} {shape} pl={pl} " \
                           f"nshape={nshape} w={weight is not None} b={bias is not None}"
                    if rms:
                        eps = None if weight is None else 1e-6
                        out = F.rms_norm(x, nshape, weight, eps=eps)
                        eps = FLOAT_EPS if eps is None else eps
                    else:
                        eps = 1e-5
                        out = F.layer_norm(x, nshape, weight, bias)
                    ref = _np_norm(a.astype(np.float64), nshape, None if weight is None else w.astype(np.float64),
                                   None if bias is None else b.astype(np.float64), eps, rms)
                    assert out.dtype == dtype, what
                    _check(out.numpy(), ref, dtype, what)
                    axis = len(shape) - n_norm
                    want = tuple(p if isinstance(p, Shard) and p.dim < axis else Replicate() for p in pl)
                    assert out.placements == want, f"{what}: placements {out.placements}, want {want}"


# ---- dtypes, special values, edge shapes ------------------------------------------------------

def test_dtype_arguments(thread_rt):
    mesh = MESHES["4"]()
    rng = np.random.default_rng(3)
    a = _values((5, 6), dtorch.float32, rng)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    i = dtorch.distribute_tensor(rng.integers(-5, 5, (5, 6)).astype(np.int32), mesh, [Shard(1)])
    b = dtorch.distribute_tensor(rng.random((5, 6)) < 0.5, mesh, [Shard(0)])
    # sum: dtype= converts first; bool and ints sum to int64
    s = x.sum(1, dtype=dtorch.float16)
    assert s.dtype == dtorch.float16 and s.placements == (Shard(0),)
    _check(s.numpy(), a.astype(np.float16).astype(np.float64).sum(1), dtorch.float16, "sum dtype=float16")
    assert b.sum().dtype == dtorch.int64 and b.sum().item() == int(b.numpy().sum())
    assert i.sum().dtype == dtorch.int64 and i.sum(0).tolist() == i.numpy().astype(np.int64).sum(0).tolist()
    assert i.sum(dtype=dtorch.float32).dtype == dtorch.float32
    # mean of integers needs a floating dtype=
    m = i.mean(0, dtype=dtorch.float32)
    assert m.dtype == dtorch.float32 and m.placements == (Shard(0),)
    _check(m.numpy(), i.numpy().astype(np.float64).mean(0), dtorch.float32, "mean of int32 dtype=float32")
    # softmax with dtype=: float16 result of float32 input (converted first), float32 of int input
    sm = dtorch.softmax(x, 1, dtype=dtorch.float16)
    assert sm.dtype == dtorch.float16
    _check(sm.numpy(), _np_softmax(a.astype(np.float16).astype(np.float64), 1, False), dtorch.float16, "softmax f16")
    ls = dtorch.log_softmax(i, 0, dtype=dtorch.float32)
    _check(ls.numpy(), _np_softmax(i.numpy().astype(np.float64), 0, True), dtorch.float32, "log_softmax of int32")
    # cumsum: bool and ints to int64, dtype= honoured
    assert b.cumsum(1).dtype == dtorch.int64 and b.cumsum(1).tolist() == np.cumsum(b.numpy(), 1).tolist()
    assert i.cumsum(0).dtype == dtorch.int64
    c = x.cumsum(1, dtype=dtorch.bfloat16)
    assert c.dtype == dtorch.bfloat16
    _check(c.numpy(), np.cumsum(bf16_round(a).astype(np.float64), 1), dtorch.bfloat16, "cumsum dtype=bfloat16")


@pytest.mark.parametrize("dtype", [dtorch.bfloat16, dtorch.float16, dtorch.int32])
def test_pieces_larger_than_a_conversion_chunk(thread_rt, dtype):
    """16-bit and int32 pieces are converted a block of rows at a time (16384 elements): results
    must not depend on where the blocks fall, including a NaN in a later block."""
    mesh = MESHES["2"]()
    rng = np.random.default_rng(21)
    a = _values((301, 130), dtype, rng)
    if dtype.is_floating_point:
        a[280, 7] = np.nan  # in the second block of rows
    x = _make(a, dtype, mesh, [Shard(1)], rng)
    a64 = a.astype(_np(dtype))
    sum_dtype = _sum_dtype(dtype)
    with np.errstate(invalid="ignore"):
        for dim in (0, 1, None, (0, 1)):
            _check(x.sum(dim).numpy(), np.sum(a64, axis=dim), sum_dtype, f"sum {dim}",
                   np.sum(np.abs(a64), axis=dim))
            ref = np.max(a64, axis=dim)
            _check(x.amax(dim).numpy(), ref, dtype, f"amax {dim}")
            _check(x.amin(dim).numpy(), np.min(a64, axis=dim), dtype, f"amin {dim}")
        if dtype.is_floating_point:
            _check(x.mean(0).numpy(), a64.mean(0), dtype, "mean 0", np.abs(a64).mean(0))
            _check(x.sum(0, dtype=dtorch.float16).numpy(), a.astype(np.float16).astype(np.float64).sum(0),
                   dtorch.float16, "sum dtype=float16", np.abs(a64).sum(0))
            for dim in (0, 1):
                _check(dtorch.softmax(x, dim).numpy(), _np_softmax(a64, dim, False), dtype, f"softmax {dim}")
            _check(dtorch.nn.functional.rms_norm(x, (130,)).numpy(),
                   _np_norm(a64, (130,), None, None, FLOAT_EPS, True), dtype, "rms_norm")
        _check(x.cumsum(0).numpy(), np.cumsum(a64, 0), sum_dtype, "cumsum 0", np.cumsum(np.abs(a64), 0))
        b = np.nan_to_num(a64, nan=-6e4) if dtype.is_floating_point else a64
        y = _make(np.nan_to_num(a, nan=-6e4).astype(a.dtype), dtype, mesh, [Shard(1)], rng)
        assert y.argmax(0).tolist() == b.argmax(0).tolist()
        rv, ri = _np_topk(b, 3, 0, True)
        tv, ti = y.topk(3, dim=0)
        assert ti.tolist() == ri.tolist()


def test_special_values(thread_rt):
    mesh = MESHES["4"]()
    a = np.array([[1.0, np.nan, 3.0], [-np.inf, 2.0, 2.0], [np.inf, 0.0, -1.0], [5.0, 5.0, 1.0],
                  [0.5, -2.0, np.nan]], dtype=np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(1)])
    # max and min propagate NaN through Partial(max|min) too (dim 1 is sharded here)
    np.testing.assert_array_equal(x.amax(1).numpy(), np.array([np.nan, 2, np.inf, 5, np.nan], np.float32))
    np.testing.assert_array_equal(x.amin(1).numpy(), np.array([np.nan, -np.inf, -1, 1, np.nan], np.float32))
    assert np.isnan(x.max().item()) and np.isnan(x.sum().item())
    # argmax/argmin: a NaN wins, ties give the first index
    assert x.argmax(1).tolist() == [1, 1, 0, 0, 2]
    assert x.argmin(1).tolist() == [1, 0, 2, 2, 2]
    values, indices = x.max(dim=1)
    assert indices.tolist() == [1, 1, 0, 0, 2] and np.isnan(values.numpy()[0])
    # topk: NaN counts as the largest
    tv, ti = x.topk(2, dim=1)
    assert ti.tolist() == [[1, 2], [1, 2], [0, 1], [0, 1], [2, 0]]
    # softmax: a -inf entry gets 0; a row of -inf only is NaN (as torch)
    m = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]], dtype=np.float32)
    sm = dtorch.softmax(dtorch.distribute_tensor(m, mesh, [Shard(0)]), -1).numpy()
    np.testing.assert_allclose(sm[0], _np_softmax(np.array([0.0, -np.inf, 1.0]), 0, False), rtol=1e-6)
    assert np.isnan(sm[1]).all()
    # empty shards contribute the identity: -inf/INT_MIN/False to a max, +inf/INT_MAX/True to a min
    for dtype, lo, hi in ((np.float32, -3.5, 2.5), (np.int32, -(2**31) + 5, 2**31 - 5), (np.int64, -(2**62), 2**62)):
        v = np.array([[lo], [hi], [0]], dtype=dtype)
        t = dtorch.distribute_tensor(v, mesh, [Shard(0)])  # 3 rows over 4: 1,1,1,0
        assert t.amax(0).placements == (Partial("max"),)
        assert t.amax(0).tolist() == [hi] and t.amin(0).tolist() == [lo] and t.max().item() == hi
    bt = dtorch.distribute_tensor(np.array([False, False, True]), mesh, [Shard(0)])
    assert bt.amax().item() is True and bt.amin().item() is False


def test_empty_and_zero_dim(thread_rt):
    mesh = MESHES["3"]()
    z = dtorch.distribute_tensor(np.zeros((0, 4), np.float32), mesh, [Shard(0)])
    assert z.sum(0).tolist() == [0.0] * 4 and z.sum(0).placements == (Partial("sum"),)
    assert np.isnan(z.mean(0).numpy()).all()
    assert z.sum(1).shape == (0,) and z.amax(1).shape == (0,)
    assert z.cumsum(0).shape == (0, 4) and dtorch.softmax(z, 1).shape == (0, 4)
    assert z.topk(0, dim=0).values.shape == (0, 4)
    assert dtorch.nn.functional.layer_norm(z, (4,)).shape == (0, 4)
    s = dtorch.distribute_tensor(np.array(2.5, np.float32), mesh)
    assert s.sum().item() == 2.5 and s.mean(0).item() == 2.5 and s.amax(-1).item() == 2.5
    assert s.sum(0, keepdim=True).shape == () and s.argmax().item() == 0 and s.argmax(0).item() == 0
    assert dtorch.softmax(s, 0).item() == 1.0 and s.cumsum(0).item() == 2.5
    assert s.max(0).indices.item() == 0 and s.topk(1).values.item() == 2.5
    i = dtorch.distribute_tensor(np.array(7, np.int64), mesh)
    assert i.sum().item() == 7 and i.sum().dtype == dtorch.int64


def test_mean_of_uneven_shards_is_exact(thread_rt):
    """mean over 5 rows on 4 devices (2,2,1,0): Partial(sum) of local sums over the global count."""
    mesh = MESHES["4"]()
    a = np.arange(30, dtype=np.float32).reshape(5, 6)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    m = x.mean(0)
    assert m.placements == (Partial("sum"),)
    np.testing.assert_array_equal(m.numpy(), a.mean(0))
    locs = m.to_local()
    np.testing.assert_allclose(np.sum(locs, axis=0), a.mean(0), rtol=1e-6)
    np.testing.assert_array_equal(locs[3], np.zeros(6, np.float32))  # the empty shard contributes 0


def test_large_sum_accuracy(thread_rt):
    mesh = MESHES["2"]()
    rng = np.random.default_rng(11)
    a = rng.standard_normal((3, 400_000)).astype(np.float32) + 1.0
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    ref = a.astype(np.float64).sum(1)
    got = x.sum(1).numpy().astype(np.float64)
    assert np.max(np.abs(got - ref) / np.abs(ref)) < 1e-5
    got_mean = x.mean().item()
    assert abs(got_mean - a.astype(np.float64).mean()) < 1e-5
    # float16 accumulates in float32 (the result, ~20000, fits float16; a float16 running sum would stall)
    h16 = a[:, :20_000].astype(np.float16)
    h = dtorch.distribute_tensor(h16, mesh, [Shard(1)])
    ref16 = h16.astype(np.float64).sum(1)
    assert np.max(np.abs(h.sum(1).numpy().astype(np.float64) - ref16) / ref16) < 1e-3


def test_rms_norm_default_eps_is_float32_epsilon(thread_rt):
    """torch computes rms_norm in float32 for 16-bit inputs and defaults eps to float32's epsilon,
    which matters for small inputs (float16's own epsilon would be 8000 times larger)."""
    mesh = MESHES["2"]()
    a = (np.random.default_rng(5).standard_normal((4, 8)) * 3e-4).astype(np.float16)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    out = dtorch.nn.functional.rms_norm(x, (8,)).numpy().astype(np.float64)
    ref = _np_norm(a.astype(np.float64), (8,), None, None, FLOAT_EPS, True)
    _check(out, ref, dtorch.float16, "rms_norm float16 default eps")


def test_no_communication_in_strict_mode(thread_rt):
    """The placements above come without a redistribute: strict mode lets them through and
    refuses the ops that need one."""
    mesh = MESHES["2x2"]()
    x = dtorch.distribute_tensor(np.arange(24, dtype=np.float32).reshape(4, 6), mesh, [Shard(0), Shard(1)])
    dtorch.set_strict(True)
    try:
        assert x.sum(1).placements == (Shard(0), Partial("sum"))
        assert x.mean((0, 1)).placements == (Partial("sum"), Partial("sum"))
        assert x.amax(0, keepdim=True).placements == (Partial("max"), Shard(1))
        assert dtorch.softmax(x.redistribute(mesh, [Shard(0), Replicate()]), 1).placements == (Shard(0), Replicate())
        with pytest.raises(RuntimeError, match="strict"):
            dtorch.softmax(x, 1)
        with pytest.raises(RuntimeError, match="strict"):
            x.argmax()
        with pytest.raises(RuntimeError, match="strict"):
            dtorch.nn.functional.layer_norm(x, (6,))
    finally:
        dtorch.set_strict(False)
    np.testing.assert_allclose(dtorch.softmax(x, 1).numpy(),
                               _np_softmax(np.arange(24, dtype=np.float64).reshape(4, 6), 1, False), rtol=1e-6)


def test_api_forms(thread_rt):
    mesh = MESHES["2"]()
    a = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    y = dtorch.distribute_tensor(np.full((2, 3), 2.5, np.float32), mesh, [Shard(0)])
    r = dtorch.max(x, 1)
    assert isinstance(r, tuple) and r.values.tolist() == [3.0, 5.0] and r.indices.tolist() == [0, 1]
    values, indices = x.min(dim=0, keepdim=True)
    assert values.tolist() == [[0.0, 1.0, 2.0]] and indices.tolist() == [[1, 0, 0]]
    assert dtorch.max(x, y).tolist() == np.maximum(a, 2.5).tolist()  # max(input, other): elementwise
    assert x.min(y).tolist() == np.minimum(a, 2.5).tolist()
    assert type(r).__name__ == "max" and type(x.topk(1)).__name__ == "topk"
    assert x.sum(dim=[0, 1]).item() == 15.0 and x.sum(()).item() == 15.0 and x.amax(dim=()).item() == 5.0
    assert x.mean(-1, True).shape == (2, 1)
    assert x.softmax(1).shape == (2, 3) and x.log_softmax(dim=0).shape == (2, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        implicit = dtorch.nn.functional.softmax(x)  # torch's legacy choice: dim 1 for 2-D
    assert caught and "Implicit dimension" in str(caught[0].message)
    np.testing.assert_allclose(implicit.numpy(), _np_softmax(a.astype(np.float64), 1, False), rtol=1e-6)
    assert dtorch.softmax(x, 1, dtorch.float16).dtype == dtorch.float16  # torch.softmax(input, dim, dtype)
    assert dtorch.topk(x, 2, largest=False, sorted=True).values.tolist() == [[1.0, 2.0], [0.0, 4.0]]
    w = dtorch.distribute_tensor(np.ones(3, np.float32), mesh)
    ln = dtorch.layer_norm(x, 3, w, None, 1e-5)
    np.testing.assert_allclose(ln.numpy(), _np_norm(a.astype(np.float64), (3,), None, None, 1e-5, False), rtol=1e-5,
                               atol=1e-6)
    assert dtorch.rms_norm(x, [3], w, 1e-6).shape == (2, 3)
    # bfloat16 weight with a float32 input (mixed dtypes, the output keeps the input's)
    assert dtorch.nn.functional.layer_norm(x, (3,), w.bfloat16()).dtype == dtorch.float32


# ---- bad input -------------------------------------------------------------------------------

def test_bad_input(thread_rt):
    mesh, other = MESHES["2"](), MESHES["3"]()
    F = dtorch.nn.functional
    x = dtorch.distribute_tensor(np.ones((4, 3), np.float32), mesh, [Shard(0)])
    i = dtorch.distribute_tensor(np.ones((4, 3), np.int64), mesh, [Shard(0)])
    b = dtorch.distribute_tensor(np.ones((4, 3), bool), mesh)
    empty = dtorch.distribute_tensor(np.ones((0, 3), np.float32), mesh)
    bad = [
        (IndexError, "Dimension out of range", lambda: x.sum(2)),
        (IndexError, "Dimension out of range", lambda: x.mean((0, -3))),
        (ValueError, "appears multiple times", lambda: x.sum((0, -2))),
        (TypeError, "mean\\(\\): could not infer output dtype. Input dtype must be either a floating point",
         lambda: i.mean()),
        (RuntimeError, "mean\\(\\): could not infer output dtype", lambda: i.mean(0)),  # as torch raises it too
        (TypeError, "Optional dtype must be either a floating point", lambda: x.mean(dtype=dtorch.int64)),
        (TypeError, "unknown dtype", lambda: x.sum(dtype="complex64")),
        (IndexError, "amax\\(\\): Expected reduction dim 0 to have non-zero size", lambda: empty.amax(0)),
        (ValueError, "max\\(\\): Expected reduction dim to be specified", lambda: empty.max()),
        (IndexError, "max\\(\\): Expected reduction dim 0 to have non-zero size", lambda: empty.max(0)),
        (ValueError, "argmax\\(\\): Expected reduction dim to be specified", lambda: empty.argmax()),
        (IndexError, "argmin\\(\\): Expected reduction dim 0", lambda: empty.argmin(0)),
        (TypeError, "argmax\\(\\): not implemented for 'Bool'", lambda: b.argmax()),
        (IndexError, "Dimension out of range", lambda: x.argmax(5)),
        (TypeError, "softmax\\(\\): not implemented for 'Long'", lambda: dtorch.softmax(i, 1)),
        (TypeError, "not implemented for 'Bool'", lambda: dtorch.log_softmax(b, 0)),
        (TypeError, "softmax\\(\\): not implemented for 'Long'", lambda: dtorch.softmax(x, 1, dtype=dtorch.int64)),
        (IndexError, "Dimension out of range", lambda: x.cumsum(-3)),
        (ValueError, "selected index k out of range", lambda: x.topk(4)),
        (RuntimeError, "selected index k out of range", lambda: x.topk(-1)),
        (TypeError, "topk\\(\\): not implemented for 'Bool'", lambda: b.topk(1)),
        (ValueError, "Given normalized_shape=\\[4\\], expected input with shape \\[\\*, 4\\], but got input of "
                     "size\\[4, 3\\]", lambda: F.layer_norm(x, (4,))),
        (ValueError, "expected input with shape", lambda: F.rms_norm(x, (2, 4, 3))),
        (ValueError, "at least 1-dimensional", lambda: F.layer_norm(x, ())),
        (ValueError, "Expected weight to be of same shape as normalized_shape",
         lambda: F.layer_norm(x, (3,), dtorch.ones(4, device_mesh=mesh))),
        (ValueError, "Expected bias to be of same shape",
         lambda: F.layer_norm(x, (3,), None, dtorch.ones(3, 1, device_mesh=mesh))),
        (TypeError, "floating point input", lambda: F.layer_norm(i, (3,))),
        (TypeError, "floating point weight", lambda: F.rms_norm(x, (3,), dtorch.ones(3, dtype=dtorch.int64,
                                                                                           device_mesh=mesh))),
        (RuntimeError, "cross-mesh", lambda: F.layer_norm(x, (3,), dtorch.ones(3, device_mesh=other))),
        (TypeError, "must be a DTensor", lambda: F.layer_norm(x, (3,), np.ones(3, np.float32))),
        (TypeError, "must be a DTensor", lambda: dtorch.sum(np.ones(3))),
        (TypeError, "must be an int", lambda: x.sum(1.0)),
        (TypeError, "must be an int", lambda: x.topk(1.5)),
        (TypeError, "normalized_shape", lambda: F.layer_norm(x, "3")),
        (TypeError, "keepdim needs a dim", lambda: x.max(keepdim=True)),
        (ValueError, "weight and bias", lambda: dtorch._C._op("layer_norm", (x,), (1, 3), (1e-5,), None)),
    ]
    for exc, match, call in bad:
        with pytest.raises(exc, match=match):
            call()
    # the runtime still works after the failures
    assert x.sum().item() == 12.0 and x.argmax(0, keepdim=True).tolist() == [[0, 0, 0]]


# ---- process workers: a smaller subset through ipc:// ----------------------------------------

@pytest.mark.parametrize("mesh_name", ["4", "2x2"])
def test_process_workers(process_rt, mesh_name):
    rng = np.random.default_rng(99)
    assert _run_list("sum", mesh_name, (dtorch.float32, dtorch.int32), rng) > 0
    assert _run_list("amax", mesh_name, (dtorch.bfloat16,), rng) > 0
    mesh = MESHES[mesh_name]()
    a = _values((6, 4, 3), dtorch.float32, rng)
    pl = [Shard(0)] + [Shard(2)] * (mesh.ndim - 1)
    x = _make(a, dtorch.float32, mesh, pl, rng)
    _check(dtorch.softmax(x, 2).numpy(), _np_softmax(a.astype(np.float64), 2, False), dtorch.float32, "softmax")
    _check(x.mean((1, 2)).numpy(), a.astype(np.float64).mean((1, 2)), dtorch.float32, "mean")
    v, idx = x.max(0)
    _check(v.numpy(), a.max(0), dtorch.float32, "max values")
    assert idx.tolist() == a.argmax(0).tolist()
    tv, ti = x.topk(2, dim=1, largest=False)
    rv, ri = _np_topk(a, 2, 1, False)
    _check(tv.numpy(), rv, dtorch.float32, "topk")
    assert ti.tolist() == ri.tolist()
    _check(x.cumsum(0).numpy(), np.cumsum(a.astype(np.float64), 0), dtorch.float32, "cumsum")
    w = dtorch.distribute_tensor(np.linspace(0.5, 1.5, 12, dtype=np.float32).reshape(4, 3), mesh)
    _check(dtorch.nn.functional.layer_norm(x, (4, 3), w).numpy(),
           _np_norm(a.astype(np.float64), (4, 3), w.numpy().astype(np.float64), None, 1e-5, False), dtorch.float32,
           "layer_norm")
    p = _make(rng.integers(-5, 5, (5, 6)).astype(np.float32), dtorch.float32, mesh,
              [Partial("sum")] + [Shard(0)] * (mesh.ndim - 1), rng)
    assert p.sum(1).placements[0] == Partial("sum")
    _check(p.sum(1).numpy(), p.numpy().astype(np.float64).sum(1), dtorch.float32, "sum of Partial")
    assert p.argmax(1).tolist() == p.numpy().argmax(1).tolist()
