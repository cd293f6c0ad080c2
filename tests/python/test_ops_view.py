"""Views and data movement: a differential harness against numpy.

Every op runs over meshes of 1, 2, 3, 4 devices and 2x2, with every legal input placement
(Shard on each dim, Replicate, Partial built with from_local), uneven and empty shards, and all
dtypes. Values are small integers, so every comparison is exact (bfloat16 comes back as float32).
Besides the whole value, each device's piece is checked against the piece its output placements
call for (so a kernel that produced the wrong local shape or values would show), and where torch
has a no-communication rule the output placement is asserted and the op is run in strict mode
(which raises if any redistribute were needed).
"""
import itertools

import numpy as np
import pytest

import dtorch
from conftest import MESHES, _start, local_slices, reference_locals
from dtorch import Partial, Replicate, Shard

MESH_NAMES = ["1", "2", "3", "4", "2x2"]
DTYPES = ["float32", "float16", "bfloat16", "int32", "int64", "bool"]
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32, "int32": np.int32,
       "int64": np.int64, "bool": np.bool_}


@pytest.fixture
def thread():
    _start("thread")
    yield "thread"
    dtorch.set_strict(False)
    dtorch.shutdown()


@pytest.fixture
def process():
    _start("process")
    yield "process"
    dtorch.set_strict(False)
    dtorch.shutdown()


# ---- inputs -----------------------------------------------------------------------------------

def values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    return rng.integers(-20, 21, size=shape).astype(_NP[dtype])


def placements_for(ndim, mesh_ndim, partial=True):
    """Every placement tuple: per mesh dim Shard(0..ndim-1), Replicate, Partial."""
    options = [Shard(d) for d in range(ndim)] + [Replicate()] + ([Partial("sum")] if partial else [])
    return list(itertools.product(options, repeat=mesh_ndim))


def make(a, mesh, placements, dtype, seed=0, reduce_op="sum"):
    """A DTensor of value a (numpy, in the storage dtype's numpy type) laid out with placements;
    Partial mesh dims get random contributions that combine exactly to a."""
    if dtype == "bfloat16":
        reduce_op = "sum"  # made as float32 and converted: the cast keeps only a linear Partial
    placements = [Partial(reduce_op) if isinstance(p, Partial) else p for p in placements]
    pm = [m for m, p in enumerate(placements) if isinstance(p, Partial)]
    src = a.astype(np.float32) if dtype == "bfloat16" else a
    if not pm:
        x = dtorch.distribute_tensor(src, mesh, placements)
    else:
        rng = np.random.default_rng(seed + 1)
        combos = list(itertools.product(*[range(mesh.shape[m]) for m in pm]))
        contrib = {}
        if src.dtype == np.bool_:
            for i, c in enumerate(combos):
                contrib[c] = src if i == 0 else src & (rng.integers(0, 2, size=src.shape) > 0)
        elif reduce_op == "sum":
            rest = src.copy()
            for c in combos[1:]:
                r = rng.integers(-20, 21, size=src.shape).astype(src.dtype)
                contrib[c] = r
                rest = rest - r
            contrib[combos[0]] = rest
        else:  # max
            for i, c in enumerate(combos):
                contrib[c] = src if i == 0 else (src - rng.integers(0, 6, size=src.shape)).astype(src.dtype)
        pieces = []
        for coord in np.ndindex(*mesh.shape):
            full = contrib[tuple(coord[m] for m in pm)]
            sl = local_slices(src.shape, mesh.shape, placements, coord)
            pieces.append(np.array(np.asarray(full)[tuple(slice(lo, hi) for lo, hi in sl)], copy=True))
        x = dtorch.from_local(pieces, mesh, placements, shape=src.shape)
    if dtype == "bfloat16":
        x = x.to(dtorch.bfloat16)
    assert x.placements == tuple(placements)
    return x


def check(out, ref, mesh, dtype=None):
    """The whole value equals ref exactly; each device's piece is the one its placements give."""
    ref = np.asarray(ref)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    if dtype is not None:
        assert out.dtype == getattr(dtorch, dtype)
    got = out.numpy()
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref.astype(got.dtype))
    pl = out.placements
    locs = out.to_local()
    want = reference_locals(ref, mesh.shape, pl)
    partial = any(isinstance(p, Partial) for p in pl)
    for g, w in zip(locs, want):
        assert g.shape == w.shape, (pl, g.shape, w.shape)
        if not partial:
            np.testing.assert_array_equal(g, w.astype(g.dtype))


def renumber(pl, mapping, others=Replicate()):
    """Expected output placements of a no-communication rule: Shard(d) -> Shard(mapping[d]),
    a shard of an unmapped dim -> others (None: not asserted), Partial and Replicate unchanged.
    Second value: whether no input moves."""
    out, free = [], True
    for p in pl:
        if isinstance(p, Shard):
            if mapping.get(p.dim) is None:
                out.append(others)
                free = False
            else:
                out.append(Shard(mapping[p.dim]))
        else:
            out.append(p)
    return tuple(out), free


def run(fn, x, expected=None):
    """fn(x); with an expected (placements, free) rule, asserts the placements, and that a free
    rule needs no redistribute (strict mode). On a mesh dim of size 1 every piece is whole, so a
    shard torch would drop may stay there."""
    if expected is None:
        return fn(x)
    pl, free = expected
    if free:
        dtorch.set_strict(True)
        try:
            y = fn(x)
        finally:
            dtorch.set_strict(False)
    else:
        y = fn(x)
    sizes = x.device_mesh.shape
    got = tuple(q if p is None or (sizes[m] == 1 and isinstance(x.placements[m], Shard) and p == Replicate()) else p
                for m, (p, q) in enumerate(zip(pl, y.placements)))
    assert y.placements == got, (x.placements, y.placements, pl)
    return y


# ---- single-input ops: (name, shape, dtorch fn, numpy fn, rule(placements) or None) -----------

def _perm_rule(perm):
    inv = {d: i for i, d in enumerate(perm)}
    return lambda pl, shape: renumber(pl, inv)


def _same_rule(pl, shape):
    return tuple(pl), True


def _dims_rule(mapping, others=Replicate()):
    return lambda pl, shape: renumber(pl, mapping, others)


def _keep_rule(mapping):
    """Only the shards of the mapped (unchanged) dims are asserted."""
    return _dims_rule(mapping, None)


def _slice_rule(dim, whole=False, drop=False):
    def rule(pl, shape):
        m = {d: (d - 1 if drop and d > dim else d) for d in range(len(shape)) if d != dim or whole}
        return renumber(pl, m)
    return rule


def _expand_rule(lead, in_shape, out_shape):
    def rule(pl, shape):
        m = {d: d + lead for d in range(len(in_shape)) if in_shape[d] == out_shape[d + lead]}
        return renumber(pl, m)
    return rule


CASES = [
    # reshape / view: an unchanged dim keeps its shard, even uneven
    ("reshape_keep0", (5, 6), lambda x: x.reshape(5, 2, 3), lambda a: a.reshape(5, 2, 3), _keep_rule({0: 0})),
    ("view_keep0", (5, 2, 3), lambda x: x.view(5, 6), lambda a: a.reshape(5, 6), _keep_rule({0: 0})),
    ("reshape_keep_last", (4, 6), lambda x: x.reshape(2, 2, 6), lambda a: a.reshape(2, 2, 6), _keep_rule({1: 2})),
    ("reshape_minus1", (6, 2, 3), lambda x: dtorch.reshape(x, (-1, 3)), lambda a: a.reshape(-1, 3), None),
    ("reshape_all", (5, 6), lambda x: x.reshape(30), lambda a: a.reshape(30), None),
    ("reshape_regroup", (6, 2, 3), lambda x: x.reshape(3, 12), lambda a: a.reshape(3, 12), None),
    ("reshape_split", (8, 3), lambda x: x.reshape(2, 4, 3), lambda a: a.reshape(2, 4, 3), None),
    ("reshape_empty", (0, 3), lambda x: x.reshape(3, 0), lambda a: a.reshape(3, 0), None),
    ("flatten", (6, 2, 3), lambda x: x.flatten(), lambda a: a.reshape(-1), None),
    ("flatten_1", (6, 2, 3), lambda x: dtorch.flatten(x, 1), lambda a: a.reshape(6, 6), _keep_rule({0: 0})),
    ("flatten_01", (4, 2, 3), lambda x: x.flatten(0, 1), lambda a: a.reshape(8, 3), _keep_rule({2: 1})),
    ("unsqueeze0", (5, 6), lambda x: x.unsqueeze(0), lambda a: a[None], _dims_rule({0: 1, 1: 2})),
    ("unsqueeze_last", (5, 6), lambda x: dtorch.unsqueeze(x, -1), lambda a: a[..., None], _dims_rule({0: 0, 1: 1})),
    ("unsqueeze_mid", (5, 6), lambda x: x.unsqueeze(1), lambda a: a[:, None], _dims_rule({0: 0, 1: 2})),
    ("squeeze_all", (5, 1, 3), lambda x: x.squeeze(), lambda a: a.squeeze(), _dims_rule({0: 0, 2: 1})),
    ("squeeze_dim", (5, 1, 3), lambda x: dtorch.squeeze(x, 1), lambda a: a.squeeze(1), _dims_rule({0: 0, 2: 1})),
    ("squeeze_noop", (5, 1, 3), lambda x: x.squeeze(0), lambda a: a, _dims_rule({0: 0, 1: 1, 2: 2})),
    ("squeeze_tuple", (1, 4, 1), lambda x: x.squeeze((0, 2)), lambda a: a.reshape(4), _dims_rule({1: 0})),
    # permutations
    ("transpose", (5, 6), lambda x: x.transpose(0, 1), lambda a: a.T, _perm_rule((1, 0))),
    ("T", (5, 6), lambda x: x.T, lambda a: a.T, _perm_rule((1, 0))),
    ("t", (5, 6), lambda x: dtorch.t(x), lambda a: a.T, _perm_rule((1, 0))),
    ("mT", (6, 2, 3), lambda x: x.mT, lambda a: a.swapaxes(-1, -2), _perm_rule((0, 2, 1))),
    ("mT_4d", (4, 2, 3, 5), lambda x: x.mT, lambda a: a.swapaxes(-1, -2), _perm_rule((0, 1, 3, 2))),
    ("T_3d", (6, 2, 3), lambda x: x.T, lambda a: a.T, _perm_rule((2, 1, 0))),
    ("permute", (6, 2, 3), lambda x: x.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), _perm_rule((2, 0, 1))),
    ("permute_neg", (6, 2, 3), lambda x: dtorch.permute(x, (-1, -3, -2)), lambda a: a.transpose(2, 0, 1),
     _perm_rule((2, 0, 1))),
    ("transpose_02", (6, 2, 3), lambda x: dtorch.transpose(x, 0, 2), lambda a: a.transpose(2, 1, 0),
     _perm_rule((2, 1, 0))),
    ("movedim", (6, 2, 3), lambda x: x.movedim(0, -1), lambda a: np.moveaxis(a, 0, -1), _perm_rule((1, 2, 0))),
    ("contiguous", (5, 6), lambda x: x.contiguous(), lambda a: a, _same_rule),
    # expand
    ("expand_col", (5, 1), lambda x: x.expand(5, 4), lambda a: np.broadcast_to(a, (5, 4)),
     _expand_rule(0, (5, 1), (5, 4))),
    ("expand_lead", (5, 1), lambda x: x.expand(2, -1, 3), lambda a: np.broadcast_to(a, (2, 5, 3)),
     _expand_rule(1, (5, 1), (2, 5, 3))),
    ("expand_row", (1, 6), lambda x: x.expand(3, 6), lambda a: np.broadcast_to(a, (3, 6)),
     _expand_rule(0, (1, 6), (3, 6))),
    ("expand_1d", (6,), lambda x: x.expand((2, 6)), lambda a: np.broadcast_to(a, (2, 6)),
     _expand_rule(1, (6,), (2, 6))),
    ("expand_zero", (1, 3), lambda x: x.expand(0, 3), lambda a: np.broadcast_to(a, (0, 3)),
     _expand_rule(0, (1, 3), (0, 3))),
    # narrow / select: along a sharded dim Replicate first unless the whole dim
    ("narrow0", (5, 6), lambda x: x.narrow(0, 1, 3), lambda a: a[1:4], _slice_rule(0)),
    ("narrow1", (5, 6), lambda x: dtorch.narrow(x, 1, -4, 2), lambda a: a[:, 2:4], _slice_rule(1)),
    ("narrow_whole", (5, 6), lambda x: x.narrow(0, 0, 5), lambda a: a, _slice_rule(0, whole=True)),
    ("narrow_empty", (5, 6), lambda x: x.narrow(1, 6, 0), lambda a: a[:, 6:6], _slice_rule(1)),
    ("select1", (5, 6), lambda x: x.select(1, 2), lambda a: a[:, 2], _slice_rule(1, drop=True)),
    ("select0", (6, 2, 3), lambda x: dtorch.select(x, 0, -1), lambda a: a[-1], _slice_rule(0, drop=True)),
    # indexing
    ("getitem_int", (5, 6), lambda x: x[1], lambda a: a[1], _slice_rule(0, drop=True)),
    ("getitem_cols", (5, 6), lambda x: x[:, 2:5], lambda a: a[:, 2:5], _slice_rule(1)),
    ("getitem_none_last", (5, 6), lambda x: x[..., None], lambda a: a[..., None], _dims_rule({0: 0, 1: 1})),
    ("getitem_step", (5, 6), lambda x: x[::2], lambda a: a[::2], _slice_rule(0)),
    ("getitem_mixed", (5, 6), lambda x: x[-1, ..., 1:], lambda a: a[-1, ..., 1:], None),
    ("getitem_mixed3", (6, 2, 3), lambda x: x[None, 1:, ::2, -1], lambda a: a[None, 1:, ::2, -1], None),
    ("getitem_full", (5, 6), lambda x: x[:], lambda a: a, _same_rule),
    ("getitem_ellipsis", (6, 2, 3), lambda x: x[...], lambda a: a, _same_rule),
    ("getitem_negcol", (5, 6), lambda x: x[:, -1], lambda a: a[:, -1], _slice_rule(1, drop=True)),
    ("getitem_emptyslice", (5, 6), lambda x: x[2:2], lambda a: a[2:2], _slice_rule(0)),
    ("getitem_pastend", (5, 6), lambda x: x[10:], lambda a: a[10:], _slice_rule(0)),
    ("getitem_combo", (6, 2, 3), lambda x: x[1::2, None, -2], lambda a: a[1::2, None, -2], None),
    ("getitem_step_big", (6, 2, 3), lambda x: x[..., ::5], lambda a: a[..., ::5], _slice_rule(2)),
    ("getitem_ell_mid", (6, 2, 3), lambda x: x[0, ..., 0], lambda a: a[0, ..., 0], None),
    ("getitem_negslice", (6, 2, 3), lambda x: x[-4:-1, :, 1:], lambda a: a[-4:-1, :, 1:], None),
    # triangles: any sharding, no communication
    ("triu", (5, 6), lambda x: x.triu(), lambda a: np.triu(a), _same_rule),
    ("triu_1", (5, 6), lambda x: dtorch.triu(x, 1), lambda a: np.triu(a, 1), _same_rule),
    ("triu_neg", (5, 6), lambda x: x.triu(-2), lambda a: np.triu(a, -2), _same_rule),
    ("tril", (5, 6), lambda x: x.tril(), lambda a: np.tril(a), _same_rule),
    ("tril_2", (6, 5), lambda x: dtorch.tril(x, 2), lambda a: np.tril(a, 2), _same_rule),
    ("tril_far", (5, 6), lambda x: x.tril(-10), lambda a: np.tril(a, -10), _same_rule),
    ("triu_batched", (6, 2, 3), lambda x: x.triu(1), lambda a: np.triu(a, 1), _same_rule),
    ("tril_batched", (3, 5, 4), lambda x: x.tril(-1), lambda a: np.tril(a, -1), _same_rule),
]


@pytest.mark.parametrize("mesh_name", MESH_NAMES)
def test_single_input_ops(thread, mesh_name):
    mesh = MESHES[mesh_name]()
    i = 0
    for name, shape, fn, ref_fn, rule in CASES:
        for pl in placements_for(len(shape), mesh.ndim):
            dtype = DTYPES[i % len(DTYPES)]
            i += 1
            a = values(shape, dtype, seed=i)
            x = make(a, mesh, pl, dtype, seed=i, reduce_op="max" if i % 3 == 0 else "sum")
            expected = rule(x.placements, shape) if rule else None
            try:
                y = run(fn, x, expected)
                check(y, ref_fn(a), mesh, dtype)
            except AssertionError as e:
                raise AssertionError(f"{name} on mesh {mesh_name} with {pl} ({dtype}): {e}") from e


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_dtypes(thread, dtype):
    """Every case in every dtype on the 4-device and 2x2 meshes, sharded on dim 0."""
    for mesh_name in ("4", "2x2"):
        mesh = MESHES[mesh_name]()
        for k, (name, shape, fn, ref_fn, rule) in enumerate(CASES):
            a = values(shape, dtype, seed=k)
            pl = [Shard(0)] + [Shard(len(shape) - 1)] * (mesh.ndim - 1)
            x = make(a, mesh, pl, dtype)
            try:
                check(run(fn, x, rule(x.placements, shape) if rule else None), ref_fn(a), mesh, dtype)
            except AssertionError as e:
                raise AssertionError(f"{name} on mesh {mesh_name} ({dtype}): {e}") from e


def test_scalar_tensors(thread):
    for mesh_name in MESH_NAMES:
        mesh = MESHES[mesh_name]()
        a = np.array(7, np.int64)
        # (no Partial: from_local turns 0-d pieces into 1-D ones with np.ascontiguousarray)
        for pl in placements_for(0, mesh.ndim, partial=False):
            x = make(a, mesh, pl, "int64")
            check(x.reshape(1), a.reshape(1), mesh)
            check(x.unsqueeze(0), a.reshape(1), mesh)
            check(x.flatten(), a.reshape(1), mesh)
            check(x.reshape(1, 1).squeeze(), a, mesh)
            check(x[None, ..., None], a.reshape(1, 1), mesh)
            check(x.expand(2, 3), np.broadcast_to(a, (2, 3)), mesh)
            assert x[...] is x and x.T is x and x.t() is x and x.contiguous() is x
            check(x.reshape(1, 1, 1).reshape(()), a, mesh)
            check(x.transpose(0, -1), a, mesh)


# ---- reshape sharding rules (3.6) ----------------------------------------------------------------

def test_reshape_rules(thread):
    m2, m4, m22 = MESHES["2"](), MESHES["4"](), MESHES["2x2"]()
    a = np.arange(24, dtype=np.float32)
    # flattening: the leftmost dim keeps its shard when the chunks line up
    x = dtorch.distribute_tensor(a.reshape(4, 3, 2), m2, [Shard(0)])
    assert x.flatten().placements == (Shard(0),)
    assert x.reshape(4, 6).placements == (Shard(0),)
    x = dtorch.distribute_tensor(a.reshape(4, 3, 2), m2, [Shard(1)])
    y = x.flatten()  # a later flattened dim cannot keep it
    assert y.placements == (Replicate(),)
    check(y, a, m2)
    x = dtorch.distribute_tensor(a[:15].reshape(5, 3), m2, [Shard(0)])  # 3|2 rows vs 8|7 elements
    assert x.flatten().placements == (Replicate(),)
    check(x.flatten(), a[:15], m2)
    # splitting: the first piece keeps the shard only when divisible
    x = dtorch.distribute_tensor(a.reshape(8, 3), m2, [Shard(0)])
    assert x.reshape(2, 4, 3).placements == (Shard(0),)
    x = dtorch.distribute_tensor(a[:18].reshape(6, 3), m4, [Shard(0)])
    y = x.reshape(2, 3, 3)
    assert y.placements == (Replicate(),)
    check(y, a[:18].reshape(2, 3, 3), m4)
    # an unchanged uneven dim keeps its shard (x(5,2,2,2) S0 on 4 -> view(5,8))
    b = np.arange(40, dtype=np.int32).reshape(5, 2, 2, 2)
    x = dtorch.distribute_tensor(b, m4, [Shard(0)])
    for shape in ((5, 8), (5, 2, 4), (5, 4, 2)):
        dtorch.set_strict(True)
        y = x.reshape(*shape)
        dtorch.set_strict(False)
        assert y.placements == (Shard(0),)
        check(y, b.reshape(shape), m4)
    # nested shards of one dim on a 2-D mesh
    x = dtorch.distribute_tensor(a.reshape(8, 3), m22, [Shard(0), Shard(0)])
    y = x.reshape(2, 4, 3)
    check(y, a.reshape(2, 4, 3), m22)
    assert Replicate() in y.placements
    y = x.reshape(8, 3, 1)
    assert y.placements == (Shard(0), Shard(0))
    # Partial passes through
    x = dtorch.from_local([a.reshape(4, 6), a.reshape(4, 6)], m2, [Partial()])
    y = x.reshape(6, 4).T.flatten()
    assert y.placements == (Partial(),)
    np.testing.assert_array_equal(y.numpy(), 2 * a.reshape(6, 4).T.reshape(-1))


def _factorings(n, rng, ndim):
    """A random shape of ndim dims whose sizes multiply to n."""
    shape = [1] * ndim
    m = n
    for p in (2, 3, 5, 7):
        while m % p == 0:
            m //= p
            shape[rng.integers(0, ndim)] *= p
    shape[rng.integers(0, ndim)] *= m
    return tuple(int(v) for v in shape)


@pytest.mark.parametrize("mesh_name", ["3", "4", "2x2"])
def test_reshape_fuzz(thread, mesh_name):
    """Random reshapes of random layouts: values and every device's piece stay exact, whichever
    shards the rule keeps."""
    mesh = MESHES[mesh_name]()
    rng = np.random.default_rng(len(mesh_name) * 7 + mesh.ndim)
    for k in range(150):
        n = int(rng.choice([0, 1, 6, 12, 24, 30, 36, 60]))
        src = _factorings(n, rng, int(rng.integers(1, 5))) if n else (0, 3)
        dst = _factorings(n, rng, int(rng.integers(1, 5))) if n else (3, 0, 2)
        pls = placements_for(len(src), mesh.ndim)
        pl = pls[int(rng.integers(0, len(pls)))]
        a = np.arange(n, dtype=np.int64).reshape(src)
        x = make(a, mesh, pl, "int64", seed=k)
        y = x.reshape(dst)
        check(y, a.reshape(dst), mesh)
        for p_in, p_out in zip(x.placements, y.placements):
            assert isinstance(p_out, Shard) or p_out == p_in or (isinstance(p_in, Shard) and p_out == Replicate())


# ---- cat / stack ------------------------------------------------------------------------------

CAT_CASES = [
    # (shapes, dim)
    (((5, 6), (3, 6)), 0),
    (((5, 6), (5, 2)), 1),
    (((5, 6), (5, 1), (5, 3)), -1),
    (((2, 3, 4), (2, 1, 4)), 1),
    (((5, 6), (0, 6)), 0),
]


@pytest.mark.parametrize("mesh_name", MESH_NAMES)
def test_cat(thread, mesh_name):
    mesh = MESHES[mesh_name]()
    i = 0
    for shapes, dim in CAT_CASES:
        ndim = len(shapes[0])
        pls = placements_for(ndim, mesh.ndim)
        for pl0 in pls:
            for pl1 in (pl0, (Replicate(),) * mesh.ndim, pls[(i * 7) % len(pls)]):
                i += 1
                dtype = DTYPES[i % len(DTYPES)]
                arrays = [values(s, dtype, seed=i * 10 + j) for j, s in enumerate(shapes)]
                xs = [make(a, mesh, pl0 if j == 0 else pl1, dtype, seed=i + j) for j, a in enumerate(arrays)]
                ref = np.concatenate(arrays, axis=dim)
                y = dtorch.cat(xs, dim) if i % 2 else dtorch.concat(xs, dim=dim)
                check(y, ref, mesh, dtype)
                if pl1 == pl0:
                    # all inputs alike: no communication unless the cat dim is sharded
                    d = dim % ndim
                    want, free = renumber(pl0, {e: e for e in range(ndim) if e != d})
                    assert y.placements == want
                    if free:
                        dtorch.set_strict(True)
                        try:
                            dtorch.cat(xs, dim)
                        finally:
                            dtorch.set_strict(False)


@pytest.mark.parametrize("mesh_name", MESH_NAMES)
def test_stack(thread, mesh_name):
    mesh = MESHES[mesh_name]()
    i = 0
    for shape, n in (((5, 6), 2), ((6, 2, 3), 3), ((4,), 2)):
        ndim = len(shape)
        pls = placements_for(ndim, mesh.ndim)
        for dim in range(-ndim - 1, ndim + 1):
            for pl0 in pls:
                for pl1 in (pl0, pls[(i * 5) % len(pls)]):
                    i += 1
                    dtype = DTYPES[i % len(DTYPES)]
                    arrays = [values(shape, dtype, seed=i * 10 + j) for j in range(n)]
                    xs = [make(a, mesh, pl0 if j == 0 else pl1, dtype, seed=i + j) for j, a in enumerate(arrays)]
                    y = dtorch.stack(xs, dim)
                    check(y, np.stack(arrays, axis=dim), mesh, dtype)
                    if pl1 == pl0:
                        d = dim % (ndim + 1)
                        want, free = renumber(pl0, {e: (e + 1 if e >= d else e) for e in range(ndim)})
                        assert y.placements == want


def test_cat_stack_promotion_and_many(thread):
    mesh = MESHES["3"]()
    a = values((5, 2), "int32", 1)
    b = values((5, 3), "float16", 2)
    c = values((5, 1), "bool", 3)
    xs = [make(a, mesh, [Shard(0)], "int32"), make(b, mesh, [Shard(0)], "float16"),
          make(c, mesh, [Replicate()], "bool")]
    y = dtorch.cat(xs, 1)
    assert y.dtype == dtorch.float16 and y.placements == (Shard(0),)
    check(y, np.concatenate([a.astype(np.float16), b, c.astype(np.float16)], 1), mesh)
    y = dtorch.cat([xs[0], make(values((5, 2), "int64", 4), mesh, [Shard(1)], "int64")], 0)
    assert y.dtype == dtorch.int64
    bf = make(values((5, 2), "bfloat16", 5), mesh, [Shard(0)], "bfloat16")
    assert dtorch.stack([bf, make(b[:, :2].copy(), mesh, [Shard(0)], "float16")]).dtype == dtorch.float32
    # more tensors than one op call takes
    arrays = [values((2, 3), "int64", 10 + k) for k in range(70)]
    xs = [make(v, mesh, [Shard(1)], "int64") for v in arrays]
    y = dtorch.cat(xs, 0)
    assert y.placements == (Shard(1),)
    check(y, np.concatenate(arrays, 0), mesh)
    check(dtorch.stack(xs, 1), np.stack(arrays, 1), mesh)
    # legacy empty 1-D tensors are skipped
    e = dtorch.distribute_tensor(np.zeros((0,), np.int64), mesh)
    check(dtorch.cat([xs[0], e, xs[1]], 1), np.concatenate(arrays[:2], 1), mesh)


# ---- split / chunk / unbind ---------------------------------------------------------------------

@pytest.mark.parametrize("mesh_name", MESH_NAMES)
def test_split_chunk_unbind(thread, mesh_name):
    mesh = MESHES[mesh_name]()
    i = 0
    for shape in ((5, 6), (6, 2, 3), (0, 4)):
        for pl in placements_for(len(shape), mesh.ndim):
            i += 1
            dtype = DTYPES[i % len(DTYPES)]
            a = values(shape, dtype, seed=i)
            x = make(a, mesh, pl, dtype, seed=i)
            for dim in range(len(shape)):
                n = shape[dim]
                cases = [
                    (x.split(2, dim), [a.take(range(s, min(s + 2, n)), axis=dim) for s in range(0, n, 2)] or [a]),
                    (dtorch.split(x, [1, n - 1], dim) if n else dtorch.split(x, [0], dim),
                     np.split(a, [1], axis=dim) if n else [a]),
                    (x.chunk(4, dim), _chunk_ref(a, 4, dim)),
                    (dtorch.chunk(x, 1, dim), [a]),
                ]
                if n and i % 3 == 0:
                    cases.append((x.unbind(dim), [a.take(k, axis=dim) for k in range(n)]))
                for got, want in cases:
                    assert len(got) == len(want), (len(got), len(want))
                    for g, w in zip(got, want):
                        check(g, w, mesh, dtype)
                        for p_in, p_out in zip(x.placements, g.placements):
                            # pieces keep every placement but a shard of the split dim
                            if not (isinstance(p_in, Shard) and p_in.dim == dim):
                                if isinstance(p_in, Shard) and len(want[0].shape) < len(shape):
                                    continue  # unbind renumbers
                                assert p_out == p_in


def _chunk_ref(a, chunks, dim):
    n = a.shape[dim]
    step = -(-n // chunks)
    if step == 0:
        return [a] * chunks
    return [a.take(range(s, min(s + step, n)), axis=dim) for s in range(0, n, step)]


def test_chunk_counts(thread):
    mesh = MESHES["4"]()
    for n, k in ((6, 4), (5, 4), (1, 3), (7, 3), (0, 2), (10, 4)):
        a = np.arange(n, dtype=np.int64)
        x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
        got = x.chunk(k)
        want = _chunk_ref(a, k, 0)
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            check(g, w, mesh)


# ---- index_select -------------------------------------------------------------------------------

@pytest.mark.parametrize("mesh_name", MESH_NAMES)
def test_index_select(thread, mesh_name):
    mesh = MESHES[mesh_name]()
    i = 0
    for shape in ((5, 6), (6, 2, 3)):
        for dim in range(len(shape)):
            for pl in placements_for(len(shape), mesh.ndim):
                for idx_pl in itertools.product([Shard(0), Replicate()], repeat=mesh.ndim):
                    i += 1
                    dtype = DTYPES[i % len(DTYPES)]
                    a = values(shape, dtype, seed=i)
                    rng = np.random.default_rng(i)
                    idx = rng.integers(0, shape[dim], size=(i % 7))  # lengths 0..6: uneven and empty shards
                    idx_dtype = "int32" if i % 2 else "int64"
                    x = make(a, mesh, pl, dtype, seed=i)
                    ix = make(idx.astype(_NP[idx_dtype]), mesh, idx_pl, idx_dtype)
                    y = x.index_select(dim, ix) if i % 2 else dtorch.index_select(x, dim - len(shape), ix)
                    check(y, np.take(a, idx, axis=dim), mesh, dtype)
                    # no-communication rules: x S(e != dim) with idx R keeps S(e); x R with idx S(0) -> S(dim)
                    for m in range(mesh.ndim):
                        px, pi = x.placements[m], ix.placements[m]
                        if isinstance(px, Shard) and px.dim != dim and isinstance(pi, Replicate):
                            assert y.placements[m] == px
                        if isinstance(px, Partial) and isinstance(pi, Replicate):
                            assert y.placements[m] == px
                        if isinstance(px, Replicate) and isinstance(pi, Shard):
                            assert y.placements[m] == Shard(dim)


def test_getitem_with_index_tensor(thread):
    mesh = MESHES["3"]()
    a = np.arange(30, dtype=np.float32).reshape(5, 6)
    x = dtorch.distribute_tensor(a, mesh, [Shard(1)])
    idx = np.array([4, -1, 0, -5, 2], np.int64)
    ix = dtorch.distribute_tensor(idx, mesh, [Replicate()])
    y = x[ix]
    assert y.placements == (Shard(1),)
    check(y, a[idx], mesh)
    check(x[dtorch.distribute_tensor(np.array(-2, np.int32), mesh)], a[-2], mesh)
    x0 = dtorch.distribute_tensor(a, mesh, [Replicate()])
    y = x0[dtorch.distribute_tensor(idx, mesh, [Shard(0)])]
    assert y.placements == (Shard(0),)
    check(y, a[idx], mesh)


@pytest.mark.parametrize("mesh_name", ["1", "3", "4", "2x2"])
def test_getitem_with_a_list_of_ints(mode, mesh_name):
    """x[[i, j, ...]] picks rows as numpy's a[[i, j, ...]] (negative, repeated and no positions
    included), on every layout of rows and columns; a list of anything but ints, or a position
    out of bounds, raises at the call site."""
    mesh = MESHES[mesh_name]()
    a = np.arange(30, dtype=np.float32).reshape(5, 6)
    for pl in ([Replicate()] * mesh.ndim, [Shard(0)] * mesh.ndim, [Shard(1)] + [Shard(0)] * (mesh.ndim - 1)):
        x = dtorch.distribute_tensor(a, mesh, pl)
        for rows in ([4, -1, 0], [2, 2, 2, 2], [3], []):
            y = x[rows]
            assert y.shape == a[rows].shape, (pl, rows)
            np.testing.assert_array_equal(y.numpy(), a[rows], err_msg=f"{pl} {rows}")
        np.testing.assert_array_equal(x[[1, 0]][0].numpy(), a[1])
    with pytest.raises(TypeError, match="ints only"):
        x[[True, False]]
    with pytest.raises(TypeError, match="ints only"):
        x[[0.5]]
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 5"):
        x[[0, 5]]
    with pytest.raises(IndexError, match="out of bounds"):
        x[[-6]]
    np.testing.assert_array_equal(x[[-5]].numpy(), a[[-5]])



@pytest.mark.parametrize("mesh_name", ["1", "2", "3", "2x2"])
def test_getitem_with_a_list_among_other_indices(mode, mesh_name):
    """One list of ints (or integer DTensor) among ints, slices, None and Ellipsis picks along the
    dim it stands for, as numpy does; where ints stand apart from it (a slice between), numpy puts
    the picked dim first, and so must the result (a[0, :, [1, 2]] has shape (2, 5))."""
    mesh = MESHES[mesh_name]()
    a = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    keys = [(slice(None), [0, 4]), ([3, 1], 1), (..., [2, -1]), (None, [1]), (0, slice(None), [1, 2]),
            (slice(1, 3), [4, 0], slice(None, None, 2)), (1, [0, 2], 3), (None, 0, None, [3]),
            (slice(None), []), (..., [5], None), (0, ..., [1]), (slice(None), slice(None), [5, 5, 0])]
    for pl in ([Replicate()] * mesh.ndim, [Shard(0)] * mesh.ndim, [Shard(2)] + [Shard(1)] * (mesh.ndim - 1)):
        x = dtorch.distribute_tensor(a, mesh, pl)
        for k in keys:
            y = x[k]
            assert y.shape == a[k].shape, (pl, k)
            np.testing.assert_array_equal(y.numpy(), a[k], err_msg=f"{pl} {k}")
        idx = dtorch.distribute_tensor(np.array([4, -2], np.int64), mesh)
        np.testing.assert_array_equal(x[0, :, idx].numpy(), a[0, :, [4, -2]])
        np.testing.assert_array_equal(x[:, dtorch.distribute_tensor(np.array(3, np.int64), mesh)].numpy(), a[:, 3])
    assert a[0, :, [1, 2]].shape == (2, 5)  # the rule the result follows, checked on numpy itself
    with pytest.raises(TypeError, match="more than one DTensor or list index"):
        x[[0], :, [1]]
    with pytest.raises(IndexError, match="index 6 is out of bounds for dimension 2 with size 6"):
        x[:, :, [0, 6]]
    with pytest.raises(IndexError, match="index -6 is out of bounds for dimension 1 with size 5"):
        x[..., [-6], 1]
    with pytest.raises(IndexError, match="index -7 is out of bounds for dimension 2 with size 6"):
        x[0, ..., [-7]]
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 5"):
        x[None, 1, [5]]
    with pytest.raises(RuntimeError, match="index 6 is out of bounds for dimension 2 with size 6"):
        x[:, :, dtorch.distribute_tensor(np.array([0, 6], np.int64), mesh)].numpy()
    np.testing.assert_array_equal(x[:, [1]].numpy(), a[:, [1]])  # the runtime goes on

def test_iteration(thread):
    mesh = MESHES["2"]()
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    rows = list(x)
    assert len(rows) == 3
    for r, w in zip(rows, a):
        check(r, w, mesh)
    with pytest.raises(TypeError):
        iter(dtorch.distribute_tensor(np.array(1.0, np.float32), mesh))


def test_big_pieces(thread):
    """Large enough pieces that copies run over many rows (and redistributes go by chunks)."""
    mesh = MESHES["2x2"]()
    a = np.random.default_rng(0).standard_normal((300, 257)).astype(np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0), Shard(1)])
    check(x.T, a.T, mesh)
    check(x[7:290:3, 1:], a[7:290:3, 1:], mesh)
    check(x.triu(5), np.triu(a, 5), mesh)
    check(dtorch.cat([x, x[:, :10]], 1), np.concatenate([a, a[:, :10]], 1), mesh)
    check(x.reshape(300, 257, 1).expand(300, 257, 2), np.broadcast_to(a[..., None], (300, 257, 2)), mesh)


# ---- process mode: the same ops with each device in its own process -------------------------------

def test_process_mode_subset(process):
    for mesh_name in ("3", "2x2"):
        mesh = MESHES[mesh_name]()
        for k, (name, shape, fn, ref_fn, rule) in enumerate(CASES[::3]):
            for pl in placements_for(len(shape), mesh.ndim)[::2]:
                dtype = DTYPES[k % len(DTYPES)]
                a = values(shape, dtype, seed=k)
                x = make(a, mesh, pl, dtype, seed=k)
                check(run(fn, x, rule(x.placements, shape) if rule else None), ref_fn(a), mesh, dtype)
        a, b = values((5, 6), "int64", 1), values((2, 6), "int64", 2)
        xs = [make(a, mesh, [Shard(1)] * mesh.ndim, "int64"), make(b, mesh, [Shard(0)] * mesh.ndim, "int64")]
        check(dtorch.cat(xs, 0), np.concatenate([a, b]), mesh)
        check(dtorch.stack([xs[0], xs[0]], 1), np.stack([a, a], 1), mesh)
        idx = np.array([3, 0, 5, 5, 1], np.int64)
        ix = make(idx, mesh, [Shard(0)] * mesh.ndim, "int64")
        check(xs[0].index_select(1, ix), a[:, idx], mesh)
        for g, w in zip(xs[0].chunk(3, 1), np.split(a, 3, 1)):
            check(g, w, mesh)


# ---- bad input --------------------------------------------------------------------------------

def test_bad_input(thread):
    mesh = MESHES["2"]()
    a = np.arange(30, dtype=np.float32).reshape(5, 6)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    bad = [
        (ValueError, "invalid for input of size 30", lambda: x.reshape(4, 4)),
        (ValueError, "only one dimension can be inferred", lambda: x.reshape(-1, -1)),
        (ValueError, "invalid shape dimension", lambda: x.view(-2, -15)),
        (TypeError, "must be tuple of ints, but found element of type float at pos 0", lambda: x.reshape(2.5, 12)),
        (TypeError, "must be tuple of ints, not str", lambda: x.view("12")),
        (TypeError, "reinterpreting the bytes", lambda: x.view(dtorch.float16)),
        (ValueError, "more than DTorch tensors have", lambda: x.reshape([1] * 17)),
        (IndexError, "Dimension out of range", lambda: x.flatten(0, 2)),
        (ValueError, "start_dim cannot come after end_dim", lambda: x.flatten(1, 0)),
        (IndexError, "Dimension out of range", lambda: x.unsqueeze(3)),
        (IndexError, "Dimension out of range", lambda: x.squeeze(2)),
        (ValueError, "does not match the length", lambda: x.permute(0)),
        (ValueError, "duplicate dims", lambda: x.permute(1, 1)),
        (IndexError, "Dimension out of range", lambda: x.transpose(0, 2)),
        (IndexError, "expected to be in range of \\[-2, 1\\], but got -3", lambda: x.transpose(-3, 0)),
        (TypeError, "dim must be an int, got bool", lambda: x.transpose(True, 0)),
        (TypeError, "dim must be an int, got float", lambda: x.transpose(0, 1.0)),
        (TypeError, "takes 2 arguments", lambda: x.transpose(0)),
        (TypeError, "argument 'dims' must be tuple of ints, not str", lambda: x.permute("01")),
        (TypeError, "but found element of type bool at pos 1", lambda: x.permute(0, True)),
        (TypeError, "argument 'input' must be a DTensor, not ndarray", lambda: dtorch.transpose(a, 0, 1)),
        (ValueError, "t\\(\\) expects a tensor with <= 2 dimensions", lambda: x.reshape(5, 3, 2).t()),
        (RuntimeError, "tensor.mT is only supported on matrices or batches of matrices. Got 1-D tensor",
         lambda: x[0].mT),
        (ValueError, "must match the existing size", lambda: x.expand(5, 7)),
        (ValueError, "number of sizes provided", lambda: x.expand(6)),
        (ValueError, "leading, non-existing dimension", lambda: x.expand(-1, 5, 6)),
        (ValueError, "Sizes of tensors must match except in dimension 0", lambda: dtorch.cat([x, x.T])),
        (ValueError, "same number of dimensions", lambda: dtorch.cat([x, x[0]])),
        (ValueError, "zero-dimensional tensor", lambda: dtorch.cat([x[0, 0], x[0, 0]])),
        (ValueError, "non-empty list", lambda: dtorch.cat([])),
        (TypeError, "must be a tuple or list", lambda: dtorch.cat(x)),
        (TypeError, "expected a DTensor at position 1", lambda: dtorch.cat([x, a])),
        (IndexError, "Dimension out of range", lambda: dtorch.cat([x, x], 2)),
        (ValueError, "stack expects each tensor to be equal size", lambda: dtorch.stack([x, x[1:]])),
        (IndexError, "Dimension out of range", lambda: dtorch.stack([x, x], 3)),
        (IndexError, "start out of range", lambda: x.narrow(0, 6, 0)),
        (ValueError, "exceeds dimension size", lambda: x.narrow(0, 3, 3)),
        (ValueError, "length must be non-negative", lambda: x.narrow(0, 0, -1)),
        (IndexError, "select\\(\\): index 6 out of range", lambda: x.select(1, 6)),
        (IndexError, "index 5 is out of bounds for dimension 0 with size 5", lambda: x[5]),
        (IndexError, "index -6 is out of bounds for dimension 0 with size 5", lambda: x[-6]),
        (IndexError, "out of bounds for dimension 0", lambda: x[2 ** 70]),
        (IndexError, "index 3 is out of bounds for dimension 0 with size 3", lambda: x[0, 1:4][3]),
        (IndexError, "too many indices for tensor of dimension 0", lambda: x[0, 0][0]),
        (IndexError, "index -7 is out of bounds for dimension 1 with size 6", lambda: x[:, -7]),
        (IndexError, "too many indices for tensor of dimension 2", lambda: x[1, 2, 3]),
        (IndexError, "single ellipsis", lambda: x[..., 1, ...]),
        (ValueError, "step must be greater than zero", lambda: x[::-1]),
        (ValueError, "step must be greater than zero", lambda: x[:, ::0]),
        (TypeError, "ints only", lambda: x[[[0], [1]]]),
        (TypeError, "valid indices", lambda: x[1.5]),
        (TypeError, "Expected dtype int32/int64 for index", lambda: x.index_select(0, x[0])),
        (ValueError, "Index is supposed to be a vector",
         lambda: x.index_select(0, dtorch.zeros(2, 2, dtype=dtorch.int64, device_mesh=mesh))),
        (TypeError, "must be a DTensor", lambda: x.index_select(0, [1, 2])),
        (IndexError, "Dimension out of range",
         lambda: x.index_select(2, dtorch.zeros(2, dtype=dtorch.int64, device_mesh=mesh))),
        (ValueError, "at least 2 dimensions", lambda: x[0].triu()),
        (ValueError, "split_with_sizes expects split_sizes to sum exactly to 5", lambda: x.split([2, 2])),
        (ValueError, "split_size can only be 0", lambda: x.split(0)),
        (ValueError, "chunk expects `chunks` to be greater than 0", lambda: x.chunk(0)),
        (IndexError, "Dimension out of range", lambda: x.chunk(2, 2)),
        (TypeError, "view: reinterpreting", lambda: x.view(dtorch.int32)),
        (IndexError, "Dimension out of range", lambda: x.movedim(0, 5)),
        (ValueError, "repeated dim", lambda: x.movedim((0, 0), (0, 1))),
        (ValueError, "invalid for input of size 30", lambda: x.reshape(())),
        (IndexError, "cannot be applied to a 0-dim tensor", lambda: x[0, 0].narrow(0, 0, 1)),
    ]
    for exc, msg, fn in bad:
        with pytest.raises(exc, match=msg):
            fn()
    # mixing meshes
    other = dtorch.distribute_tensor(a, MESHES["3"](), [Shard(0)])
    with pytest.raises(RuntimeError, match="cross-mesh"):
        dtorch.cat([x, other])
    with pytest.raises(RuntimeError, match="cross-mesh"):
        x.index_select(0, dtorch.zeros(2, dtype=dtorch.int64, device_mesh=MESHES["3"]()))
    # an index out of range is found on the devices: the value raises, naming the op
    bad_idx = dtorch.distribute_tensor(np.array([0, 9], np.int64), mesh, [Replicate()])
    y = x.index_select(1, bad_idx)
    with pytest.raises(Exception, match="index out of range in self"):
        y.numpy()
    with pytest.raises(Exception, match="out of bounds"):
        x[dtorch.distribute_tensor(np.array([-6], np.int64), mesh)].numpy()
    # strict mode refuses an op that would need a redistribute, naming it
    dtorch.set_strict(True)
    try:
        with pytest.raises(RuntimeError, match="strict"):
            x.narrow(0, 1, 2)
    finally:
        dtorch.set_strict(False)
    # the runtime keeps working
    check(x.T[1:, ::2], a.T[1:, ::2], mesh)
