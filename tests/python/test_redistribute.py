"""redistribute: every single-mesh-dim transition on 1-D to 3-D meshes, across meshes, many at
once, randomized cases, collective counts against torch's planner, bad input, concurrency and a
worker death in the middle of a redistribute.

Every result is compared exactly: the whole value with the source value, and every device's
piece with both distribute_tensor(global, mesh, target) and an independent nested torch.chunk
reference written here. Partial sources come from from_local with integer-valued
contributions (multiples of the avg group sizes) so that every reduction is exact.

The randomized test takes its seed from DTORCH_TEST_SEED (default: time-based) and prints it
(run pytest with -s to see it; it is in every failure message too).
"""
import itertools
import os
import signal
import time

import numpy as np
import pytest

import dtorch
from conftest import PATIENCE_S, worker_pids
from dtorch import Partial, Replicate, Shard

OPS = ("sum", "avg", "max", "min")
F32, I64, BF16 = "float32", "int64", "bfloat16"

# ---- independent reference --------------------------------------------------------------------


def _chunk(n, k, r):
    """[start, stop) of chunk r when torch.chunk cuts n items into k: chunk size ceil(n/k);
    trailing chunks short or empty."""
    c = -(-n // k)
    start = min(r * c, n)
    return start, min(start + c, n)


def _block(shape, mesh_shape, placements, coord):
    """Slices of the piece at mesh coordinate `coord`: mesh dim 0 cuts first, each later mesh
    dim cuts what the earlier ones left."""
    lo, hi = [0] * len(shape), list(shape)
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim % len(shape)
            a, b = _chunk(hi[d] - lo[d], mesh_shape[m], coord[m])
            lo[d], hi[d] = lo[d] + a, lo[d] + b
    return tuple(slice(a, b) for a, b in zip(lo, hi))


def _normalise(placements, ndim):
    return tuple(Shard(p.dim % ndim) if isinstance(p, Shard) else p for p in placements)


def _reduce(values, axis, op):
    if op == "sum":
        return values.sum(axis=axis, dtype=values.dtype)
    if op == "avg":
        n = values.shape[axis]
        total = values.sum(axis=axis, dtype=values.dtype)
        assert (total % n == 0).all(), "test bug: an avg that does not divide exactly"
        return total // n if values.dtype.kind == "i" else total / n
    if op == "max":
        return values.max(axis=axis)
    return values.min(axis=axis)


class Source:
    """A DTensor made for a test, and what its value and every device's piece must be after
    redistributing it. contrib has one leading axis per Partial mesh dim (its coordinate)."""

    def __init__(self, mesh, placements, contrib, dtype, tensor):
        self.mesh, self.dtype, self.tensor = mesh, dtype, tensor
        self.placements = _normalise(placements, contrib.ndim - self._npartial(placements))
        self.contrib = contrib
        self.pdims = [i for i, p in enumerate(self.placements) if isinstance(p, Partial)]
        self.value = self.reduced(keep=())

    @staticmethod
    def _npartial(placements):
        return sum(isinstance(p, Partial) for p in placements)

    @property
    def shape(self):
        return self.contrib.shape[len(self.pdims):]

    def reduced(self, keep, coord=None):
        """op over the Partial mesh dims not in `keep` (innermost first); kept ones indexed at
        coord."""
        v = self.contrib
        for k in reversed(range(len(self.pdims))):
            i = self.pdims[k]
            if i in keep:
                v = np.take(v, coord[i], axis=k)
            else:
                v = _reduce(v, k, self.placements[i].reduce_op)
        return v

    def expected_locals(self, mesh, target):
        """Every device's piece of the result on mesh with (normalised) target placements."""
        same = mesh == self.mesh
        keep = tuple(i for i in self.pdims if same and target[i] == self.placements[i])
        out = []
        for coord in np.ndindex(*mesh.shape):
            v = self.reduced(keep, coord) if keep else self.value
            out.append(v[_block(v.shape, mesh.shape, target, coord)])
        return out


def _np_dtype(dtype):
    return np.int64 if dtype == I64 else np.float32


def make_source(mesh, placements, shape, dtype, rng):
    """A DTensor of `shape` on mesh with placements (Partial ones via from_local)."""
    shape = tuple(shape)
    placements = tuple(placements)
    partial = [i for i, p in enumerate(placements) if isinstance(p, Partial)]
    if dtype == BF16:
        assert not partial, "no way to give bfloat16 contributions without ml_dtypes"
        t = dtorch.rand(shape, device_mesh=mesh, placements=list(placements), dtype=dtorch.bfloat16)
        return Source(mesh, placements, t.numpy(), dtype, t)
    npd = _np_dtype(dtype)
    if not partial:
        g = rng.integers(-1000, 1000, size=shape).astype(npd)
        return Source(mesh, placements, g, dtype, dtorch.distribute_tensor(g, mesh, list(placements)))
    scale = int(np.prod([mesh.shape[i] for i in partial if placements[i].reduce_op == "avg"], dtype=np.int64))
    lead = tuple(mesh.shape[i] for i in partial)
    contrib = (rng.integers(-20, 21, size=lead + shape) * scale).astype(npd)
    pieces = []
    norm = _normalise(placements, len(shape))
    for coord in np.ndindex(*mesh.shape):
        c = contrib[tuple(coord[i] for i in partial)]
        pieces.append(np.ascontiguousarray(c[_block(shape, mesh.shape, norm, coord)]))
    t = dtorch.from_local(pieces, mesh, list(placements), shape=shape)
    return Source(mesh, placements, contrib, dtype, t)


def check(src, y, mesh, target, what=""):
    """y = src redistributed to (mesh, target): value, placements and every piece, exactly."""
    target = _normalise(target, len(src.shape))
    assert y.placements == target, what
    assert y.dtype == src.tensor.dtype, what
    assert y.shape == tuple(src.shape), what
    assert y.device_mesh == mesh, what
    full = y.future().result(timeout=30)
    want_dtype = np.int64 if src.dtype == I64 else np.float32
    assert full.dtype == want_dtype and full.shape == src.value.shape, what
    np.testing.assert_array_equal(full, src.value, err_msg=f"value {what}")
    locs = y.to_local()
    mine = src.expected_locals(mesh, target)
    assert len(locs) == len(mine) == mesh.size(), what
    for k, (got, want) in enumerate(zip(locs, mine)):
        assert got.shape == want.shape, f"device #{k} shape {got.shape}, expected {want.shape}: {what}"
        np.testing.assert_array_equal(got, want, err_msg=f"device #{k} {what}")
    if not any(isinstance(p, Partial) for p in target):
        direct = dtorch.distribute_tensor(src.value, mesh, list(target)).to_local()
        for k, (got, want) in enumerate(zip(locs, direct)):
            assert got.shape == want.shape, f"device #{k} vs distribute_tensor: {what}"
            np.testing.assert_array_equal(got, want, err_msg=f"device #{k} vs distribute_tensor {what}")


# ---- meshes -------------------------------------------------------------------------------------

MESH_SPECS = {
    "1": [0],
    "2": [0, 1],
    "3": [0, 1, 2],
    "4": [0, 1, 2, 3],
    "2x2": [[0, 1], [2, 3]],
    "2x3": [[0, 1, 2], [3, 4, 5]],
    "2x2x2": [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
}


def _mesh(name):
    return dtorch.DeviceMesh("cpu", MESH_SPECS[name])


# ---- every single-mesh-dim transition -----------------------------------------------------------

# 1 to 4 dims; 6 and 5 over 4 (2,2,2,0 / 2,2,1,0), sizes below the mesh size (empty shards), zero
SHAPES = [(6,), (5, 4), (6, 5, 3), (3, 5, 1, 2), (0, 3)]


def _transitions(ndim):
    """(from, to) placement pairs on one mesh dim, every kind the brief lists."""
    dims = range(ndim)
    out = [(Shard(d), Replicate()) for d in dims]
    out += [(Partial(op), Replicate()) for op in OPS]
    out += [(Partial(op), Shard(d)) for op in OPS for d in dims]
    out += [(Replicate(), Shard(d)) for d in dims]
    out += [(Shard(i), Shard(j)) for i in dims for j in dims if i != j]
    out += [(Shard(d), Shard(d)) for d in dims] + [(Replicate(), Replicate())]
    out += [(Partial(op), Partial(op)) for op in OPS]
    return out


@pytest.mark.parametrize("mesh_name", list(MESH_SPECS))
def test_single_mesh_dim_transitions(mode, mesh_name):
    mesh = _mesh(mesh_name)
    rng = np.random.default_rng(1000 + len(mesh_name))
    cases = []
    n = 0
    for k in range(mesh.ndim):
        for shape in SHAPES:
            ndim = len(shape)
            for a, b in _transitions(ndim):
                for dtype in (F32, I64, BF16):
                    if dtype == BF16 and isinstance(a, Partial):
                        continue
                    n += 1
                    # other mesh dims: a mix of Shard and Replicate, varied per case
                    others = [Replicate(), Shard(0), Shard(ndim - 1), Shard(-1)]
                    src_pl, dst_pl = [], []
                    for m in range(mesh.ndim):
                        if m == k:
                            src_pl.append(a), dst_pl.append(b)
                        else:
                            o = others[(n + m) % len(others)]
                            src_pl.append(o), dst_pl.append(o)
                    cases.append((k, shape, dtype, src_pl, dst_pl))
    # issue every redistribute before fetching anything
    issued = []
    for k, shape, dtype, src_pl, dst_pl in cases:
        src = make_source(mesh, src_pl, shape, dtype, rng)
        issued.append((src, src.tensor.redistribute(placements=dst_pl), src_pl, dst_pl, shape, dtype, k))
    for src, y, src_pl, dst_pl, shape, dtype, k in issued:
        what = f"mesh {mesh_name} dim {k} {src_pl} -> {dst_pl} shape {shape} {dtype}"
        check(src, y, mesh, dst_pl, what)
        if src_pl == dst_pl:
            # identity: the same tensor back (no comm)
            assert dtorch.redistribute_plan(src.tensor, placements=dst_pl) == [], what


def test_negative_shard_dim_is_normalised(mode):
    mesh = _mesh("2x2")
    rng = np.random.default_rng(3)
    src = make_source(mesh, [Shard(0), Replicate()], (5, 3, 2), F32, rng)
    y = src.tensor.redistribute(placements=[Shard(-1), Shard(-2)])
    assert y.placements == (Shard(2), Shard(1))
    check(src, y, mesh, [Shard(2), Shard(1)])


def test_redistribute_chain_returns_to_start(mode):
    mesh = _mesh("2x3")
    rng = np.random.default_rng(4)
    src = make_source(mesh, [Partial("sum"), Shard(1)], (7, 5), I64, rng)
    x = src.tensor
    path = [[Shard(0), Shard(1)], [Shard(1), Shard(0)], [Replicate(), Shard(0)], [Shard(0), Shard(0)],
            [Replicate(), Replicate()], [Shard(1), Replicate()]]
    for pl in path:
        x = x.redistribute(placements=pl)
    check(src, x, mesh, path[-1])


# ---- across meshes -------------------------------------------------------------------------------

def test_cross_mesh_1d_to_2d(mode):
    a = dtorch.DeviceMesh("cpu", [0, 1])
    b = dtorch.DeviceMesh("cpu", [[2, 3], [4, 5]])
    rng = np.random.default_rng(5)
    for shape, dtype in (((6, 4), F32), ((5, 3), I64), ((3, 7, 2), BF16), ((1, 1), F32), ((0, 5), I64)):
        src = make_source(a, [Shard(0)], shape, dtype, rng)
        y = src.tensor.redistribute(b, [Replicate(), Shard(1)])
        check(src, y, b, [Replicate(), Shard(1)], f"{shape} {dtype}")
    # and back, onto overlapping devices
    src = make_source(b, [Shard(1), Shard(0)], (9, 5), F32, rng)
    for target_mesh, pl in ((a, [Shard(1)]), (dtorch.DeviceMesh("cpu", [3, 4, 5]), [Shard(0)]),
                            (dtorch.DeviceMesh("cpu", [5, 4, 3, 2]), [Replicate()])):
        check(src, src.tensor.redistribute(target_mesh, pl), target_mesh, pl, f"{target_mesh} {pl}")


def test_cross_mesh_to_three_devices_and_overlapping(mode):
    rng = np.random.default_rng(6)
    meshes = {
        "01": dtorch.DeviceMesh("cpu", [0, 1]),
        "12": dtorch.DeviceMesh("cpu", [1, 2]),
        "210": dtorch.DeviceMesh("cpu", [2, 1, 0]),
        "345": dtorch.DeviceMesh("cpu", [3, 4, 5]),
        "0123": dtorch.DeviceMesh("cpu", [[0, 1], [2, 3]]),
        "3210": dtorch.DeviceMesh("cpu", [[3, 2], [1, 0]]),
        "2x2x2": dtorch.DeviceMesh("cpu", MESH_SPECS["2x2x2"]),
        "7": dtorch.DeviceMesh("cpu", [7]),
    }
    placements_1d = [[Shard(0)], [Shard(1)], [Replicate()]]
    issued = []
    for (na, a), (nb, b) in itertools.product(meshes.items(), repeat=2):
        if na == nb:
            continue
        src_opts = [[Shard(0)] * a.ndim, [Replicate()] * a.ndim, [Shard(1)] + [Shard(0)] * (a.ndim - 1)]
        dst_opts = placements_1d if b.ndim == 1 else [[Shard(0)] * b.ndim, [Replicate()] + [Shard(1)] * (b.ndim - 1)]
        for i, (sp, dp) in enumerate(itertools.product(src_opts, dst_opts)):
            shape = ((5, 3), (6, 2, 3), (2, 7))[i % 3]
            src = make_source(a, sp, shape, (F32, I64)[i % 2], rng)
            issued.append((src, src.tensor.redistribute(b, dp), b, dp, f"{na}{sp} -> {nb}{dp} {shape}"))
    for src, y, b, dp, what in issued:
        check(src, y, b, dp, what)


def test_cross_mesh_from_partial(mode):
    rng = np.random.default_rng(7)
    a2 = dtorch.DeviceMesh("cpu", [[0, 1], [2, 3]])
    a1 = dtorch.DeviceMesh("cpu", [1, 2, 3])
    b1 = dtorch.DeviceMesh("cpu", [4, 5])
    b2 = dtorch.DeviceMesh("cpu", [[3, 4, 5], [0, 1, 2]])
    for op in OPS:
        for dtype in (F32, I64):
            for src_mesh, src_pl in ((a2, [Partial(op), Shard(0)]), (a2, [Partial(op), Partial(op)]),
                                     (a1, [Partial(op)]), (a2, [Shard(1), Partial(op)])):
                src = make_source(src_mesh, src_pl, (5, 4), dtype, rng)
                for dst_mesh, dst_pl in ((b1, [Replicate()]), (b1, [Shard(0)]), (b2, [Shard(1), Shard(0)]),
                                         (b2, [Replicate(), Replicate()])):
                    y = src.tensor.redistribute(dst_mesh, dst_pl)
                    check(src, y, dst_mesh, dst_pl, f"{op} {dtype} {src_pl} -> {dst_mesh} {dst_pl}")
    # mixed reduce ops on one source: inner mesh dim first
    src = make_source(a2, [Partial("max"), Partial("sum")], (3, 3), I64, rng)
    check(src, src.tensor.redistribute(b1, [Shard(1)]), b1, [Shard(1)])
    src = make_source(a2, [Partial("avg"), Partial("min")], (4, 2), F32, rng)
    check(src, src.tensor.redistribute(b2, [Shard(0), Replicate()]), b2, [Shard(0), Replicate()])


def test_keeping_an_inner_partial_of_another_op(mode):
    """[P(a), P(b)] means a over mesh dim 0 of (b over mesh dim 1). Reducing mesh dim 0 alone while
    keeping P(b) is only value-preserving when a and b commute; otherwise it is refused at the call
    site (it used to change the value silently: min over rows of maxes became max of mins)."""
    m = _mesh("2x2")
    rng = np.random.default_rng(11)
    for a, b in (("min", "max"), ("max", "sum"), ("sum", "min"), ("avg", "max")):
        for dtype in (F32, I64):
            src = make_source(m, [Partial(a), Partial(b)], (3, 4), dtype, rng)
            for target in ([Replicate(), Partial(b)], [Shard(0), Partial(b)]):
                with pytest.raises(RuntimeError, match="do not commute"):
                    src.tensor.redistribute(placements=target)
                with pytest.raises(RuntimeError, match="do not commute"):
                    dtorch.redistribute_plan(src.tensor, placements=target)
                with pytest.raises(RuntimeError, match="do not commute"):
                    dtorch.redistribute_many([src.tensor], placements=[target])
            # reducing both, or keeping the outer one, is fine
            check(src, src.tensor.redistribute(placements=[Replicate(), Shard(1)]), m, [Replicate(), Shard(1)])
            check(src, src.tensor.redistribute(placements=[Partial(a), Replicate()]), m, [Partial(a), Replicate()])
    # ops that commute: the same op, or sum with avg on floats
    for a, b, dtype in (("max", "max", I64), ("min", "min", F32), ("sum", "sum", I64), ("avg", "avg", I64),
                        ("sum", "avg", F32), ("avg", "sum", F32)):
        src = make_source(m, [Partial(a), Partial(b)], (5, 2), dtype, rng)
        check(src, src.tensor.redistribute(placements=[Shard(0), Partial(b)]), m, [Shard(0), Partial(b)])
    # with integers, avg truncates, so sum and avg do not commute there
    src = make_source(m, [Partial("avg"), Partial("sum")], (2, 2), I64, rng)
    with pytest.raises(RuntimeError, match="do not commute"):
        src.tensor.redistribute(placements=[Replicate(), Partial("sum")])
    _still_works()


def test_redistribute_many_to_another_mesh(mode):
    rng = np.random.default_rng(8)
    a = dtorch.DeviceMesh("cpu", [[0, 1], [2, 3]])
    b = dtorch.DeviceMesh("cpu", [[4, 5, 6], [7, 1, 2]])
    src_choices = [[Shard(0), Shard(1)], [Replicate(), Shard(0)], [Shard(0), Shard(0)], [Partial("sum"), Shard(0)],
                   [Partial("max"), Replicate()], [Replicate(), Replicate()], [Shard(1), Partial("avg")]]
    dst_choices = [[Shard(0), Replicate()], [Replicate(), Shard(1)], [Shard(1), Shard(0)], [Replicate(), Replicate()],
                   [Shard(0), Shard(0)]]
    sources, targets = [], []
    for i in range(100):
        ndim = 2 + i % 3
        shape = tuple(int(s) for s in rng.integers(0, 8, size=ndim))
        sources.append(make_source(a, src_choices[i % len(src_choices)], shape, (F32, I64)[i % 2], rng))
        targets.append(dst_choices[i % len(dst_choices)])
    outs = dtorch.redistribute_many([s.tensor for s in sources], b, targets)
    assert len(outs) == 100
    for i, (src, y, pl) in enumerate(zip(sources, outs, targets)):
        check(src, y, b, pl, f"tensor {i} {src.placements} -> {pl}")
    # one placements list for all, and the tensors' own mesh by default
    same = dtorch.redistribute_many([s.tensor for s in sources[:10]], placements=[Replicate(), Replicate()])
    for src, y in zip(sources, same):
        check(src, y, a, [Replicate(), Replicate()])
    assert dtorch.redistribute_many([], b, [Replicate(), Replicate()]) == []


# ---- randomized ----------------------------------------------------------------------------------

SEED = int(os.environ.get("DTORCH_TEST_SEED", str(int(time.time() * 1000) % (2 ** 31))))
print(f"\n[test_redistribute] randomized seed DTORCH_TEST_SEED={SEED}")

RANDOM_POOL = [
    [0], [3], [0, 1], [1, 2], [2, 0, 1], [0, 1, 2, 3], [4, 5, 6, 7],
    [[0, 1], [2, 3]], [[1, 2, 3], [4, 5, 6]], [[5, 4], [3, 2], [1, 0]], [[0], [1]],
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[[2], [3]], [[0], [1]]],
]


def _commute(a, b, dtype):
    return a == b or ({a, b} <= {"sum", "avg"} and dtype != I64)


def _reorders_partials(src_pl, dst_pl, dtype):
    """True when a Partial is reduced while an inner (later) mesh dim keeps a Partial whose op does
    not commute with it: the runtime refuses that (the value would change)."""
    for i, p in enumerate(src_pl):
        if not isinstance(p, Partial) or dst_pl[i] == p:
            continue
        for q in dst_pl[i + 1:]:
            if isinstance(q, Partial) and not _commute(p.reduce_op, q.reduce_op, dtype):
                return True
    return False


def _random_placement(rng, ndim, partial):
    r = rng.integers(0, 5 if partial else 3)
    if r >= 3:
        return Partial(OPS[rng.integers(0, 4)])
    if r == 2 or ndim == 0:
        return Replicate()
    d = int(rng.integers(0, ndim))
    return Shard(d - ndim if rng.integers(0, 4) == 0 else d)


def test_randomized(mode):
    ncases = 200 if mode == "thread" else 40
    seed = SEED + (0 if mode == "thread" else 1)
    print(f"[test_redistribute] test_randomized[{mode}] seed {seed} (DTORCH_TEST_SEED={SEED}), {ncases} cases")
    rng = np.random.default_rng(seed)
    meshes = [dtorch.DeviceMesh("cpu", spec) for spec in RANDOM_POOL]
    issued = []
    for case in range(ncases):
        ndim = int(rng.integers(1, 5))
        shape = tuple(int(s) for s in rng.integers(0, 8, size=ndim))
        dtype = (F32, I64)[rng.integers(0, 2)]
        a = meshes[rng.integers(0, len(meshes))]
        b = a if rng.integers(0, 2) else meshes[rng.integers(0, len(meshes))]
        src_pl = [_random_placement(rng, ndim, True) for _ in range(a.ndim)]
        dst_pl = [_random_placement(rng, ndim, False) for _ in range(b.ndim)]
        if b == a:
            for i, p in enumerate(src_pl):  # keep some Partials (allowed only when identical)
                if isinstance(p, Partial) and rng.integers(0, 3) == 0:
                    dst_pl[i] = p
        src = make_source(a, src_pl, shape, dtype, rng)
        what = (f"seed {seed} (DTORCH_TEST_SEED={SEED}) case {case}: {shape} {dtype} {a.tolist()} {src_pl} -> "
                f"{b.tolist()} {dst_pl}")
        if _reorders_partials(src_pl, dst_pl, dtype) if b == a else False:
            with pytest.raises(RuntimeError, match="do not commute"):
                src.tensor.redistribute(b, dst_pl)
            continue
        issued.append((src, src.tensor.redistribute(b, dst_pl), b, dst_pl, what))
    for src, y, b, dst_pl, what in issued:
        check(src, y, b, dst_pl, what)


# ---- collective counts ---------------------------------------------------------------------------

def _collectives(plan):
    return sum(1 for s in plan if s.elements > 0)


TORCH_COUNTS = [  # DTENSOR-SEMANTICS 2.3
    ("2x2", [Shard(0), Shard(1)], [Shard(0), Shard(0)], 1),
    ("2x2", [Shard(0), Shard(1)], [Shard(1), Shard(0)], 2),
    ("2x2", [Shard(0), Shard(0)], [Shard(1), Shard(1)], 2),
    ("2x2", [Shard(0), Shard(0)], [Replicate(), Shard(0)], 2),
    ("2x2x2", [Shard(0), Shard(1), Shard(2)], [Shard(2), Shard(1), Shard(0)], 2),
    ("2x2x2", [Shard(1), Shard(0), Shard(0)], [Replicate(), Shard(0), Shard(0)], 1),
    ("2x2x2", [Shard(1), Replicate(), Shard(0)], [Replicate(), Shard(0), Shard(0)], 2),
    ("2x2x2", [Shard(0), Shard(0), Shard(1)], [Shard(0), Shard(1), Shard(2)], 2),
    ("2x2x2", [Shard(0), Shard(0), Shard(0)], [Shard(1), Shard(1), Shard(1)], 3),
]


def test_collective_counts_not_above_torch():
    dtorch.shutdown()
    dtorch.init(workers="thread")
    try:
        rng = np.random.default_rng(9)
        for mesh_name, a, b, torch_count in TORCH_COUNTS:
            mesh = _mesh(mesh_name)
            for shape in ((8, 8, 8), (5, 7, 3), (16, 4, 2)):
                src = make_source(mesh, a, shape, F32, rng)
                plan = dtorch.redistribute_plan(src.tensor, placements=b)
                assert all(isinstance(s, dtorch.PlanStep) for s in plan)
                assert _collectives(plan) <= torch_count, f"{mesh_name} {a} -> {b} {shape}: {plan}"
                check(src, src.tensor.redistribute(placements=b), mesh, b)
        m4 = _mesh("4")
        g = make_source(m4, [Shard(0)], (8, 6), F32, rng)
        # R -> S: local; identical: nothing
        r = make_source(m4, [Replicate()], (8, 6), F32, rng)
        assert _collectives(dtorch.redistribute_plan(r.tensor, placements=[Shard(1)])) == 0
        assert dtorch.redistribute_plan(g.tensor, placements=[Shard(0)]) == []
        # S0 -> R over 4 devices: each device receives the 3/4 it lacks
        plan = dtorch.redistribute_plan(g.tensor, placements=[Replicate()])
        assert [(s.kind, s.mesh_dim) for s in plan] == [("all_gather", 0)]
        assert plan[0].elements == 3 * 8 * 6
        plan = dtorch.redistribute_plan(g.tensor, placements=[Shard(1)])
        # S0 -> S1: device r keeps its 2 x c_r block and receives the other 6 rows of column chunk r
        assert [(s.kind, s.elements) for s in plan] == [("all_to_all", 6 * 6)]
        # Partial sum -> R: one all_reduce when small, reduce_scatter + all_gather when >= 256 KiB
        small = dtorch.from_local([np.ones((4, 4), np.float32)] * 4, m4, [Partial()])
        assert [s.kind for s in dtorch.redistribute_plan(small, placements=[Replicate()])] == ["all_reduce"]
        assert [s.kind for s in dtorch.redistribute_plan(small, placements=[Shard(0)])] == ["reduce_scatter"]
        big = dtorch.from_local([np.ones((256, 256), np.float32)] * 4, m4, [Partial()])
        assert [s.kind for s in dtorch.redistribute_plan(big, placements=[Replicate()])] == ["reduce_scatter",
                                                                                           "all_gather"]
        np.testing.assert_array_equal(big.redistribute(placements=[Replicate()]).numpy(),
                                      np.full((256, 256), 4, np.float32))
        # size-1 mesh dims are free
        m12 = dtorch.DeviceMesh("cpu", [[0, 1]])
        x = make_source(m12, [Shard(0), Shard(1)], (6, 5), F32, rng)
        assert _collectives(dtorch.redistribute_plan(x.tensor, placements=[Replicate(), Shard(1)])) == 0
        p = dtorch.from_local([np.ones((2, 3), np.float32)] * 2, m12, [Partial(), Replicate()])
        assert _collectives(dtorch.redistribute_plan(p, placements=[Replicate(), Replicate()])) == 0
        np.testing.assert_array_equal(p.redistribute(placements=[Replicate(), Shard(0)]).numpy(), np.ones((2, 3)))
        # across meshes: a step with mesh_dim -1
        other = dtorch.DeviceMesh("cpu", [4, 5])
        plan = dtorch.redistribute_plan(g.tensor, other, [Shard(0)])
        assert len(plan) == 1 and plan[0].mesh_dim == -1 and plan[0].elements == 8 * 6
    finally:
        dtorch.shutdown()


# ---- bad input -----------------------------------------------------------------------------------

def _still_works():
    m = dtorch.DeviceMesh("cpu", [0, 1])
    g = np.arange(10, dtype=np.float32).reshape(5, 2)
    x = dtorch.distribute_tensor(g, m, [Shard(0)])
    np.testing.assert_array_equal(x.redistribute(placements=[Shard(1)]).to_local()[1], g[:, 1:2])


def test_bad_input(mode):
    m22 = _mesh("2x2")
    m2 = _mesh("2")
    x = dtorch.distribute_tensor(np.arange(12, dtype=np.float32).reshape(4, 3), m22, [Shard(0), Replicate()])
    p = dtorch.from_local([np.ones((4, 3), np.float32)] * 4, m22, [Partial(), Replicate()])

    # wrong number of placements
    for pl in ([Shard(0)], [Shard(0), Replicate(), Replicate()], []):
        with pytest.raises(ValueError):
            x.redistribute(placements=pl)
        with pytest.raises(ValueError):
            dtorch.redistribute_many([x], placements=[pl])
        with pytest.raises(ValueError):
            dtorch.redistribute_plan(x, placements=pl)
    with pytest.raises(ValueError):
        x.redistribute(m2, [Shard(0), Shard(0)])
    _still_works()

    # Partial target from a non-identical source
    for src, pl in ((x, [Partial(), Replicate()]), (x, [Shard(0), Partial("max")]), (p, [Partial("max"), Replicate()]),
                    (p, [Partial(), Partial()])):
        with pytest.raises(RuntimeError, match="Partial"):
            src.redistribute(placements=pl)
        with pytest.raises(RuntimeError, match="Partial"):
            dtorch.redistribute_plan(src, placements=pl)
        with pytest.raises(RuntimeError, match="Partial"):
            dtorch.redistribute_many([x, src], placements=[[Replicate(), Replicate()], pl])
    # the identical Partial is fine (no comm)
    same = p.redistribute(placements=[Partial(), Shard(1)])
    np.testing.assert_array_equal(same.numpy(), np.full((4, 3), 2, np.float32))
    # Partial target across meshes, even when the source has that Partial
    other = dtorch.DeviceMesh("cpu", [[4, 5], [6, 7]])
    with pytest.raises(RuntimeError, match="Partial"):
        p.redistribute(other, [Partial(), Replicate()])
    with pytest.raises(RuntimeError, match="Partial"):
        x.redistribute(dtorch.DeviceMesh("cpu", [4, 5]), [Partial()])
    _still_works()

    # Shard dim out of range
    for pl in ([Shard(2), Replicate()], [Replicate(), Shard(5)], [Shard(-3), Replicate()]):
        with pytest.raises(IndexError):
            x.redistribute(placements=pl)
        with pytest.raises(IndexError):
            dtorch.redistribute_plan(x, placements=pl)
        with pytest.raises(IndexError):
            dtorch.redistribute_many([x], placements=[pl])
    with pytest.raises(IndexError):
        x.redistribute(m2, [Shard(2)])
    _still_works()

    # non-DTensor arguments
    for bad in (np.ones(3), [1, 2], None, 3.0):
        with pytest.raises(TypeError):
            dtorch.redistribute_many([x, bad], placements=[Replicate(), Replicate()])
    with pytest.raises(TypeError):
        dtorch.redistribute_plan(np.ones(3), placements=[Replicate()])
    with pytest.raises(TypeError):
        x.redistribute("not a mesh", [Replicate(), Replicate()])
    with pytest.raises(TypeError):
        x.redistribute(placements=["R", Replicate()])

    # placements=None
    with pytest.raises(RuntimeError, match="placements is needed"):
        x.redistribute()
    with pytest.raises(RuntimeError, match="placements is needed"):
        x.redistribute(m22)
    with pytest.raises(RuntimeError, match="placements is needed"):
        dtorch.redistribute_many([x])
    with pytest.raises(RuntimeError, match="placements is needed"):
        dtorch.redistribute_plan(x)

    # a target mesh of another device type
    try:
        cuda = dtorch.DeviceMesh("cuda", [0, 1])
    except Exception as e:
        assert isinstance(e, RuntimeError) and "cuda" in str(e), e
    else:  # pragma: no cover - only with a CUDA backend
        with pytest.raises((ValueError, RuntimeError), match="device type"):
            x.redistribute(cuda, [Replicate()])

    # every refused call left the runtime and the tensors usable
    _still_works()
    np.testing.assert_array_equal(x.redistribute(placements=[Replicate(), Shard(1)]).numpy(),
                                  np.arange(12, dtype=np.float32).reshape(4, 3))


# ---- concurrency ---------------------------------------------------------------------------------

def test_many_in_flight_on_overlapping_meshes(mode):
    meshes = [dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [1, 2]),
              dtorch.DeviceMesh("cpu", [[0, 1], [2, 3]])]
    rng = np.random.default_rng(10)
    chains = []
    for i in range(20):
        m = meshes[i % 3]
        first = [Shard(i % 2)] * m.ndim
        src = make_source(m, first if i % 4 else [Partial("sum")] + [Shard(0)] * (m.ndim - 1), (5 + i % 3, 4, 3),
                          (F32, I64)[i % 2], rng)
        # a few hops, on its own mesh and onto the next one, all issued before any fetch
        y = src.tensor.redistribute(placements=[Replicate()] * m.ndim)
        y = y.redistribute(placements=[Shard(1)] + [Shard(0)] * (m.ndim - 1))
        nxt = meshes[(i + 1) % 3]
        y = y.redistribute(nxt, [Shard(2)] * nxt.ndim)
        z = y.redistribute(m, [Shard(0)] * m.ndim)
        chains.append((src, y, nxt, [Shard(2)] * nxt.ndim, z, m, [Shard(0)] * m.ndim))
    futures = [(c, c[1].future(), c[4].future()) for c in chains]
    for c, fy, fz in futures:
        np.testing.assert_array_equal(fy.result(timeout=20), c[0].value)
        np.testing.assert_array_equal(fz.result(timeout=20), c[0].value)
    for src, y, nxt, ypl, z, m, zpl in chains:
        check(src, y, nxt, ypl)
        check(src, z, m, zpl)


# ---- a worker dies in the middle ----------------------------------------------------------------

def test_death_mid_redistribute(process_mode, sigcont_guard):
    mesh = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
    others = dtorch.DeviceMesh("cpu", [4, 5])
    full = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    w = dtorch.distribute_tensor(full, others, [Shard(1)])
    np.testing.assert_array_equal(x.numpy(), full)
    np.testing.assert_array_equal(w.numpy(), full)
    pids = worker_pids()
    assert 2 in pids, pids
    os.kill(pids[2], signal.SIGSTOP)
    sigcont_guard.append(pids[2])

    y = x.redistribute(placements=[Replicate()])
    value = y.future()
    pieces = y._locals_future()
    time.sleep(0.3)  # the live devices are now waiting for device 2's region
    assert not value.done()
    os.kill(pids[2], signal.SIGKILL)
    with pytest.raises(Exception) as info:
        value.result(timeout=PATIENCE_S)
    assert not isinstance(info.value, TimeoutError)
    assert "device 2" in str(info.value)
    with pytest.raises(Exception) as info:
        pieces._wait(PATIENCE_S)
    assert not isinstance(info.value, TimeoutError)
    assert "device" in str(info.value)

    # the dead mesh refuses new work at the call site
    with pytest.raises(Exception, match="device 2"):
        x.redistribute(placements=[Shard(1)])
    # another mesh of other devices still works, redistributes included
    np.testing.assert_array_equal(w.numpy(), full)
    np.testing.assert_array_equal(w.redistribute(placements=[Shard(0)]).to_local()[1], full[4:])
    # a 2-device mesh of surviving devices works, as does moving data onto it
    live = dtorch.DeviceMesh("cpu", [0, 1])
    z = dtorch.distribute_tensor(full, live, [Shard(0)])
    np.testing.assert_array_equal(z.redistribute(placements=[Shard(1)]).numpy(), full)
    np.testing.assert_array_equal(w.redistribute(live, [Shard(1)]).to_local()[0], full[:, :2])
    np.testing.assert_array_equal(z.redistribute(others, [Replicate()]).to_local()[1], full)
