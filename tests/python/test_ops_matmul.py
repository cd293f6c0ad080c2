"""Matmul family against numpy: matmul (1-D to N-D, broadcast batch dims), mm, bmm, the @
operator, linear (with and without bias), embedding and scaled_dot_product_attention (masks,
causal, scale, grouped-query heads), over meshes of 1-4 devices and 2x2 with every legal input
placement (Shard on each dim, Replicate, Partial through from_local), uneven and empty shards,
and every supported dtype.

Values: float32 within a normalised MSE of 1e-6, float16 1e-5 and bfloat16 1e-4 (references
are computed in float64 from the values the 16-bit inputs really hold); integers exactly.
Placements: wherever PyTorch's einsum rules (or our query-sequence rule for attention) need no
communication, the op runs in strict mode (which refuses any redistribute) and the output
placements are checked against an independent per-mesh-dim reference written here.
"""
import itertools

import numpy as np
import pytest

import dtorch
from conftest import local_slices, mesh_1d, mesh_2x2, mesh_3d
from dtorch import Partial, Replicate, Shard

MESHES = {"1": lambda: mesh_1d(1), "2": lambda: mesh_1d(2), "3": lambda: mesh_1d(3), "4": lambda: mesh_1d(4),
          "2x2": mesh_2x2, "2x1x2": mesh_3d}
R = Replicate()
PSUM, PAVG, PMAX = Partial("sum"), Partial("avg"), Partial("max")
BOUND = {dtorch.float32: 1e-6, dtorch.float16: 1e-5, dtorch.bfloat16: 1e-4}


@pytest.fixture(scope="module")
def rt():
    """Thread workers for the whole module (the process subset restarts them itself)."""
    dtorch.shutdown()
    dtorch.init(workers="thread")
    yield
    dtorch.set_strict(False)
    dtorch.shutdown()


rng = np.random.default_rng(20240611)

# ---- inputs: any placements, Partial included -----------------------------------------------


def _split(value, ops, sizes, gen):
    """Contributions with one leading axis per Partial mesh dim whose nested reduction (outer
    mesh dim first) gives value."""
    if not ops:
        return value
    op, n = ops[0], sizes[0]
    if op == "max":
        parts = [value - np.abs(gen.standard_normal(value.shape)) for _ in range(n)]
        parts[int(gen.integers(n))] = value
    else:
        noise = gen.standard_normal((n,) + value.shape)
        noise -= noise.mean(axis=0)
        base = value if op == "avg" else value / n
        parts = [base + noise[i] for i in range(n)]
    return np.stack([_split(p, ops[1:], sizes[1:], gen) for p in parts])


def make(value, mesh, placements, dtype=dtorch.float32):
    """A DTensor of value (float64 or integer numpy) with the given placements; Partial ones are
    built from random contributions with from_local. Returns (tensor, the value it holds)."""
    placements = list(placements)
    mshape = mesh.shape
    np_dtype = {dtorch.int64: np.int64, dtorch.int32: np.int32}.get(dtype, np.float32)
    pdims = [m for m, p in enumerate(placements) if isinstance(p, Partial)]
    if not pdims:
        x = dtorch.distribute_tensor(np.ascontiguousarray(value.astype(np_dtype)), mesh, placements)
    else:
        contrib = _split(value.astype(np.float64), [placements[m].reduce_op for m in pdims],
                         [mshape[m] for m in pdims], rng)
        if np_dtype is not np.float32:
            contrib = np.rint(contrib)
            # integer contributions: make the nested reduction exact again
            assert [placements[m].reduce_op for m in pdims] == ["sum"] * len(pdims), "test bug"
            flat = contrib.reshape((-1,) + value.shape)
            flat[-1] += value - flat.sum(axis=0)
        pieces = []
        for coord in np.ndindex(*mshape):
            c = contrib[tuple(coord[m] for m in pdims)]
            sl = local_slices(value.shape, mshape, placements, coord)
            pieces.append(np.ascontiguousarray(c[tuple(slice(a, b) for a, b in sl)].astype(np_dtype)))
        x = dtorch.from_local(pieces, mesh, placements, shape=value.shape)
    if dtype in (dtorch.float16, dtorch.bfloat16):
        x = x.to(dtype)
    return x, x.numpy().astype(np.float64)


def nmse(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != {ref.shape}"
    return float(np.sum((got - ref) ** 2) / max(np.sum(ref ** 2), 1e-30))


def check(y, ref, dtype, what=""):
    got = y.numpy()
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    if dtype in (dtorch.int64, dtorch.int32):
        assert np.array_equal(got, ref.astype(got.dtype)), what
    else:
        e = nmse(got, ref)
        assert e <= BOUND[dtype], f"{what}: nmse {e:.3g} above {BOUND[dtype]}"


def options(ndim, partial=False):
    """Placements one input may have on a mesh dim."""
    return [R] + [Shard(d) for d in range(ndim)] + ([PSUM] if partial else [])


def norm(p, ndim):
    return Shard(p.dim % ndim) if isinstance(p, Shard) else p


def run_expecting(fn, natural, what):
    """Runs fn; where the reference says no communication is needed, in strict mode (which
    refuses any redistribute) and checks the output placements."""
    if natural is None:
        return fn()
    dtorch.set_strict(True)
    try:
        y = fn()
    finally:
        dtorch.set_strict(False)
    assert tuple(y.placements) == tuple(natural), f"{what}: placements {y.placements}, expected {natural}"
    return y


# ---- matmul, mm, bmm, linear -------------------------------------------------------------------


def mm_dims(and_, bnd, linear):
    """Positions of the rows, contraction and columns dims (torch.matmul's promotion rules)."""
    d = {"a_nb": max(and_ - 2, 0), "a_m": and_ - 2 if and_ >= 2 else None, "a_k": and_ - 1}
    if linear:
        d.update(b_nb=0, b_k=bnd - 1, b_n=0 if bnd == 2 else None)
    else:
        d.update(b_nb=max(bnd - 2, 0), b_k=bnd - 2 if bnd >= 2 else 0, b_n=bnd - 1 if bnd >= 2 else None)
    d["nb"] = max(d["a_nb"], d["b_nb"])
    d["o_m"] = d["nb"] if d["a_m"] is not None else None
    d["o_n"] = d["nb"] + (d["a_m"] is not None) if d["b_n"] is not None else None
    return d


def mm_natural_dim(pa, pb, ashape, bshape, oshape, linear):
    """PyTorch's einsum candidates for one mesh dim that need no communication: the output
    placement, or None."""
    d = mm_dims(len(ashape), len(bshape), linear)
    if pa == R and pb == R:
        return R
    if pa == Shard(d["a_k"]) and pb == Shard(d["b_k"]):
        return PSUM
    if d["a_m"] is not None and pa == Shard(d["a_m"]) and pb == R:
        return Shard(d["o_m"])
    if d["b_n"] is not None and pa == R and pb == Shard(d["b_n"]):
        return Shard(d["o_n"])
    if isinstance(pa, Partial) and pa.reduce_op in ("sum", "avg") and pb == R:
        return pa
    if isinstance(pb, Partial) and pb.reduce_op in ("sum", "avg") and pa == R:
        return pb
    for j in range(d["nb"]):
        ja, jb = j - (d["nb"] - d["a_nb"]), j - (d["nb"] - d["b_nb"])
        wa = Shard(ja) if ja >= 0 and ashape[ja] == oshape[j] else R
        wb = Shard(jb) if jb >= 0 and bshape[jb] == oshape[j] else R
        if pa == wa and pb == wb:
            return Shard(j)
    return None


def bias_natural(pout, bias_pl, bshape, oshape):
    if isinstance(pout, Shard):
        d = pout.dim - (len(oshape) - len(bshape))
        want = Shard(d) if d >= 0 and bshape[d] == oshape[pout.dim] else R
    elif isinstance(pout, Partial):
        want = bias_pl if bias_pl == pout else R
    else:
        want = R
    return bias_pl == want


def natural(pas, pbs, ashape, bshape, oshape, linear=False, bias=None):
    out = []
    for m, (pa, pb) in enumerate(zip(pas, pbs)):
        p = mm_natural_dim(pa, pb, ashape, bshape, oshape, linear)
        if p is None or (bias is not None and not bias_natural(p, bias[0][m], bias[1], oshape)):
            return None
        out.append(p)
    return out


def np_matmul(a, b):
    return np.matmul(a, b)


MATMUL_SHAPES = {
    "2x2": ((5, 6), (6, 3)),
    "1x1": ((6,), (6,)),
    "1x2": ((6,), (6, 3)),
    "2x1": ((5, 6), (6,)),
    "3x2": ((2, 5, 6), (6, 3)),
    "1x3": ((4,), (3, 4, 2)),
    "3x1": ((3, 2, 5), (5,)),
    "bcast": ((2, 1, 5, 4), (3, 4, 2)),
    "emptyM": ((0, 4), (4, 3)),
    "emptyK": ((3, 0), (0, 2)),
}


def _sample(combos, limit, seed):
    combos = list(combos)
    if len(combos) <= limit:
        return combos
    g = np.random.default_rng(seed)
    keep = sorted(g.choice(len(combos), limit, replace=False))
    return [combos[i] for i in keep]


@pytest.mark.parametrize("mesh_name", MESHES)
@pytest.mark.parametrize("case", MATMUL_SHAPES)
def test_matmul_every_placement(rt, mesh_name, case):
    mesh = MESHES[mesh_name]()
    ashape, bshape = MATMUL_SHAPES[case]
    a = rng.standard_normal(ashape)
    b = rng.standard_normal(bshape)
    partial = case in ("2x2", "3x2", "1x1")
    pa_opts = list(itertools.product(options(len(ashape), partial), repeat=mesh.ndim))
    pb_opts = list(itertools.product(options(len(bshape), partial), repeat=mesh.ndim))
    combos = _sample(itertools.product(pa_opts, pb_opts), 400 if mesh.ndim > 1 else 1000, len(case) * 7919)
    for pas, pbs in combos:
        x, xv = make(a, mesh, pas)
        w, wv = make(b, mesh, pbs)
        ref = np_matmul(xv, wv)
        what = f"{ashape}{pas} @ {bshape}{pbs} on {mesh_name}"
        y = run_expecting(lambda: dtorch.matmul(x, w), natural(pas, pbs, ashape, bshape, ref.shape), what)
        check(y, ref, dtorch.float32, what)
        assert y.dtype == dtorch.float32


@pytest.mark.parametrize("dtype", [dtorch.float16, dtorch.bfloat16, dtorch.int64, dtorch.int32])
def test_matmul_dtypes(rt, dtype):
    integer = dtype in (dtorch.int64, dtorch.int32)
    for mesh_name, (ashape, bshape) in (("3", ((5, 6), (6, 3))), ("2x2", ((2, 5, 6), (6, 3))), ("4", ((6,), (6,))),
                                        ("2", ((2, 1, 5, 4), (3, 4, 2)))):
        mesh = MESHES[mesh_name]()
        # 16-bit floats: positive values, so that no cancellation magnifies the rounding of the
        # 16-bit Partial contributions beyond the bound
        a = rng.integers(-50, 50, ashape) if integer else rng.random(ashape) + 0.5
        b = rng.integers(-50, 50, bshape) if integer else rng.random(bshape) + 0.5
        opts_a = options(len(ashape), partial=dtype == dtorch.int64)
        opts_b = options(len(bshape))
        combos = _sample(itertools.product(itertools.product(opts_a, repeat=mesh.ndim),
                                           itertools.product(opts_b, repeat=mesh.ndim)), 25, 7)
        for pas, pbs in combos:
            x, xv = make(a, mesh, pas, dtype)
            w, wv = make(b, mesh, pbs, dtype)
            y = dtorch.matmul(x, w)
            assert y.dtype == dtype
            ref = np.matmul(xv.astype(np.int64), wv.astype(np.int64)) if integer else np.matmul(xv, wv)
            check(y, ref, dtype, f"{dtype} {ashape}{pas} @ {bshape}{pbs} on {mesh_name}")


def test_integer_matmul_wraps_like_torch(rt):
    mesh = mesh_1d(2)
    big = np.full((2, 2), 2 ** 62, np.int64)
    x = dtorch.distribute_tensor(big, mesh, [Shard(1)])
    w = dtorch.distribute_tensor(np.full((2, 1), 3, np.int64), mesh, [Shard(0)])
    with np.errstate(over="ignore"):
        ref = big @ np.full((2, 1), 3, np.int64)
    assert np.array_equal(dtorch.matmul(x, w).numpy(), ref)
    x32 = dtorch.distribute_tensor(np.full((1, 3), 2 ** 30, np.int32), mesh, [R])
    w32 = dtorch.distribute_tensor(np.full((3, 1), 5, np.int32), mesh, [R])
    got = dtorch.matmul(x32, w32).numpy()
    assert got.dtype == np.int32 and got[0, 0] == np.array([15 * 2 ** 30], np.int64).astype(np.int32)[0]


def test_mm_bmm_operator_and_methods(rt):
    mesh = mesh_1d(3)
    a, b = rng.standard_normal((5, 4)), rng.standard_normal((4, 7))
    x = dtorch.distribute_tensor(a.astype(np.float32), mesh, [Shard(0)])
    w = dtorch.distribute_tensor(b.astype(np.float32), mesh, [R])
    ref = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    for y in (dtorch.mm(x, w), x.mm(w), x @ w, x.matmul(w), w.__rmatmul__(x)):
        check(y, ref, dtorch.float32)
        assert y.placements == (Shard(0),)
    ba, bb = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 5, 2))
    for pl in ([Shard(0)], [Shard(1)], [Shard(2)], [R]):
        x = dtorch.distribute_tensor(ba.astype(np.float32), mesh, pl)
        w = dtorch.distribute_tensor(bb.astype(np.float32), mesh, pl)
        check(dtorch.bmm(x, w), ba @ bb, dtorch.float32)
        check(x.bmm(w), ba @ bb, dtorch.float32)
    # the rules of section 3.1, by name
    x = dtorch.distribute_tensor(ba.astype(np.float32), mesh, [Shard(0)])
    w = dtorch.distribute_tensor(bb.astype(np.float32), mesh, [Shard(0)])
    assert dtorch.bmm(x, w).placements == (Shard(0),)
    x = dtorch.distribute_tensor(ba.astype(np.float32), mesh, [Shard(2)])
    w = dtorch.distribute_tensor(bb.astype(np.float32), mesh, [Shard(1)])
    assert dtorch.bmm(x, w).placements == (PSUM,)


def test_cost_based_choice(rt):
    """S(0) @ S(1): the cheaper operand is gathered (S(0) output on a tie); S(0) @ S(0): gather the
    right operand when it is the smaller one."""
    mesh = mesh_1d(2)
    a, b = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    w = dtorch.distribute_tensor(b, mesh, [Shard(1)])
    y = x @ w
    assert y.placements == (Shard(0),)  # tie: the first candidate (rows)
    check(y, ref, dtorch.float32)
    big = rng.standard_normal((64, 4)).astype(np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    w = dtorch.distribute_tensor(big.T.copy(), mesh, [Shard(1)])  # (4, 64): gathering x is cheaper
    y = x @ w
    assert y.placements == (Shard(1),)
    check(y, a.astype(np.float64) @ big.T.astype(np.float64), dtorch.float32)
    x = dtorch.distribute_tensor(big, mesh, [Shard(0)])
    w = dtorch.distribute_tensor(rng.standard_normal((4, 3)).astype(np.float32), mesh, [Shard(0)])
    assert (x @ w).placements == (Shard(0),)  # all-gathers the small right operand


def test_partial_rules(rt):
    mesh = mesh_1d(3)
    a, b = rng.standard_normal((4, 5)), rng.standard_normal((5, 6))
    for op in (PSUM, PAVG):
        x, xv = make(a, mesh, [op])
        w, wv = make(b, mesh, [R])
        y = run_expecting(lambda: dtorch.matmul(x, w), [op], "Partial @ Replicate stays Partial")
        check(y, xv @ wv, dtorch.float32)
        ones = dtorch.distribute_tensor(np.ones((2, 4), np.float32), mesh, [R])
        y = run_expecting(lambda: dtorch.matmul(ones, x), [op], "Replicate @ Partial stays Partial")
        check(y, np.ones((2, 4)) @ xv, dtorch.float32)
    # Partial(max) is not linear: reduced first
    x, xv = make(a, mesh, [PMAX])
    w, wv = make(b, mesh, [R])
    y = dtorch.matmul(x, w)
    assert not any(isinstance(p, Partial) for p in y.placements)
    check(y, xv @ wv, dtorch.float32)
    # two Partials: one is reduced
    x, xv = make(a, mesh, [PSUM])
    w, wv = make(b, mesh, [PSUM])
    check(dtorch.matmul(x, w), xv @ wv, dtorch.float32)
    # strict mode names the op when a redistribute is needed
    dtorch.set_strict(True)
    try:
        with pytest.raises(RuntimeError, match="matmul"):
            dtorch.matmul(x, w)
    finally:
        dtorch.set_strict(False)


LINEAR_CASES = {
    "2d": ((5, 6), (3, 6), (3,)),
    "3d": ((2, 5, 6), (7, 6), (7,)),
    "1d": ((6,), (3, 6), (3,)),
    "nobias": ((5, 6), (4, 6), None),
    "bias2d": ((5, 6), (3, 6), (5, 3)),
    "w1d": ((5, 6), (6,), ()),
}


@pytest.mark.parametrize("mesh_name", MESHES)
@pytest.mark.parametrize("case", LINEAR_CASES)
def test_linear_every_placement(rt, mesh_name, case):
    mesh = MESHES[mesh_name]()
    xs, ws, bs = LINEAR_CASES[case]
    a, wt = rng.standard_normal(xs), rng.standard_normal(ws)
    bias = rng.standard_normal(bs) if bs is not None else None
    partial = case in ("2d", "3d")
    xo = list(itertools.product(options(len(xs), partial), repeat=mesh.ndim))
    wo = list(itertools.product(options(len(ws)), repeat=mesh.ndim))
    bo = list(itertools.product(options(len(bs)), repeat=mesh.ndim)) if bias is not None else [None]
    combos = _sample(itertools.product(xo, wo, bo), 300 if mesh.ndim > 1 else 1000, len(case))
    for pxs, pws, pbs in combos:
        x, xv = make(a, mesh, pxs)
        w, wv = make(wt, mesh, pws)
        ref = np.matmul(xv, wv.T)
        if bias is not None:
            bt, bv = make(bias, mesh, pbs)
            ref = ref + bv
            fn = lambda: dtorch.nn.functional.linear(x, w, bt)  # noqa: E731
            nat = natural(pxs, pws, xs, ws, ref.shape, linear=True, bias=(pbs, bs))
        else:
            fn = lambda: dtorch.nn.functional.linear(x, w)  # noqa: E731
            nat = natural(pxs, pws, xs, ws, ref.shape, linear=True)
        what = f"linear {xs}{pxs} W{ws}{pws} b{bs}{pbs} on {mesh_name}"
        y = run_expecting(fn, nat, what)
        check(y, ref, dtorch.float32, what)


def test_linear_tensor_parallel_rules(rt):
    """Column-parallel (W S(0)) gives S(-1) with a S(0) bias; row-parallel (x S(-1), W S(1))
    gives Partial(sum) and the bias is counted once, with no communication at all."""
    for n in (2, 3, 4):
        mesh = mesh_1d(n)
        a, wt, b = rng.standard_normal((2, 3, 6)), rng.standard_normal((5, 6)), rng.standard_normal(5)
        x, xv = make(a, mesh, [R])
        w, wv = make(wt, mesh, [Shard(0)])
        bt, bv = make(b, mesh, [Shard(0)])
        dtorch.set_strict(True)
        try:
            y = dtorch.nn.functional.linear(x, w, bt)
            assert y.placements == (Shard(2),)
            x2, x2v = make(a, mesh, [Shard(2)])
            w2, w2v = make(wt, mesh, [Shard(1)])
            b2, b2v = make(b, mesh, [R])
            z = dtorch.nn.functional.linear(x2, w2, b2)
            assert z.placements == (PSUM,)
        finally:
            dtorch.set_strict(False)
        check(y, xv @ wv.T + bv, dtorch.float32)
        check(z, x2v @ w2v.T + b2v, dtorch.float32)
        # the contributions: only device 0 adds the bias
        locals_ = z.to_local()
        without = [np.asarray(p, np.float64) for p in dtorch.nn.functional.linear(x2, w2).to_local()]
        assert np.allclose(locals_[0] - without[0], b2v, atol=1e-5)
        for p, q in zip(locals_[1:], without[1:]):
            assert np.allclose(p, q, atol=1e-6)
    # on 2x2: [Partial(sum), Partial(avg)] bias added on the devices at coordinate 0 of the sum dim
    mesh = mesh_2x2()
    a, wt, b = rng.standard_normal((4, 6)), rng.standard_normal((3, 6)), rng.standard_normal(3)
    x, xv = make(a, mesh, [Shard(1), PAVG])
    w, wv = make(wt, mesh, [Shard(1), R])
    bt, bv = make(b, mesh, [R, R])
    y = dtorch.nn.functional.linear(x, w, bt)
    assert y.placements == (PSUM, PAVG)
    check(y, xv @ wv.T + bv, dtorch.float32)
    bt, bv = make(b, mesh, [PSUM, R])
    y = dtorch.nn.functional.linear(x, w, bt)
    assert y.placements == (PSUM, PAVG)
    check(y, xv @ wv.T + bv, dtorch.float32)


@pytest.mark.parametrize("dtype", [dtorch.float16, dtorch.bfloat16, dtorch.int64, dtorch.int32])
def test_linear_dtypes(rt, dtype):
    integer = dtype in (dtorch.int64, dtorch.int32)
    mesh = mesh_2x2()
    gen = (lambda s: rng.integers(-20, 20, s)) if integer else rng.standard_normal
    a, wt, b = gen((3, 5, 6)), gen((4, 6)), gen((4,))
    for pxs, pws, pbs in ([[Shard(0), R], [R, Shard(0)], [R, Shard(0)]], [[Shard(2), R], [Shard(1), R], [R, R]],
                          [[R, Shard(1)], [R, R], [Shard(0), R]], [[Shard(2), Shard(2)], [Shard(1), Shard(1)], [R, R]]):
        x, xv = make(a, mesh, pxs, dtype)
        w, wv = make(wt, mesh, pws, dtype)
        bt, bv = make(b, mesh, pbs, dtype)
        y = dtorch.nn.functional.linear(x, w, bt)
        assert y.dtype == dtype
        ref = np.matmul(xv.astype(np.int64), wv.T.astype(np.int64)) + bv.astype(np.int64) if integer else \
            xv @ wv.T + bv
        check(y, ref, dtype, f"linear {dtype} {pxs} {pws} {pbs}")


def _bf16_units():
    """Whether prompts' bfloat16 products should run on the CPU's bfloat16 units (device_stats'
    onednn_matmuls): a build with oneDNN, a CPU whose flags (read here, not from DTorch) name
    AVX512_BF16, and no DTORCH_GEMM=openblas."""
    import os
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read().split()
    except OSError:
        flags = []
    return bool(dtorch._C._HAVE_ONEDNN) and "avx512_bf16" in flags and os.environ.get("DTORCH_GEMM") != "openblas"


def _bf16_prompt_cases():
    """bfloat16 linears with more rows than decode's (16): each case's mesh, x's shape and
    placements, the weight's rows and placements, a bias or not, and how many of these products
    each device runs on the bfloat16 units (an empty weight shard runs none; nor do 16 rows)."""
    R1 = [R]
    return [
        ("1", (37, 72), R1, 45, R1, True, [1]),
        ("2", (2, 20, 72), R1, 45, [Shard(0)], False, [1, 1]),
        ("2", (37, 72), [Shard(0)], 45, R1, True, [1, 1]),          # 19 and 18 rows
        ("3", (37, 72), R1, 45, [Shard(0)], True, [1, 1, 1]),       # 15 weight rows each
        ("4", (33, 40), R1, 3, [Shard(0)], True, [1, 1, 1, 0]),     # the last weight shard is empty
        ("4", (16, 72), R1, 45, [Shard(0)], True, [0, 0, 0, 0]),    # decode's rows: the streaming kernel
        ("2x2", (2, 24, 72), [Shard(0), R], 45, [R, Shard(0)], True, [1, 1, 1, 1]),
    ]


def _check_bf16_prompt(mesh_name, xs, px, n, pw, bias, per_device):
    mesh = MESHES[mesh_name]()
    units = _bf16_units()
    x, xv = make(rng.standard_normal(xs), mesh, px, dtorch.bfloat16)
    w, wv = make(rng.standard_normal((n, xs[-1])), mesh, pw, dtorch.bfloat16)
    bt, bv = make(rng.standard_normal(n), mesh, [R] * mesh.ndim, dtorch.bfloat16) if bias else (None, 0.0)
    before = [s["onednn_matmuls"] for s in dtorch.device_stats(mesh)]
    y = dtorch.nn.functional.linear(x, w, bt)
    assert y.dtype == dtorch.bfloat16
    got = y.numpy().astype(np.float64)
    ref = xv @ wv.T + bv
    # each product exact, sums in float32, then one rounding to bfloat16 (8 significant bits)
    bound = 2.0 ** -8 * np.abs(ref) + 1e-5 * (np.abs(xv) @ np.abs(wv).T + np.abs(bv))
    assert got.shape == ref.shape
    worst = float(np.max(np.abs(got - ref) - bound))
    assert worst <= 0, f"{mesh_name} {xs} {px} {pw}: past the bound by {worst:.3g}"
    after = [s["onednn_matmuls"] for s in dtorch.device_stats(mesh)]
    expect = [c if units else 0 for c in per_device]
    assert [a - b for a, b in zip(after, before)] == expect, (mesh_name, xs, px, pw)


@pytest.mark.parametrize("case", range(len(_bf16_prompt_cases())))
def test_linear_bf16_prompt_rows(rt, case):
    """A prompt's bfloat16 linear (more rows than decode's) against float64 from the values the
    inputs hold, element by element within one bfloat16 rounding and float32 sums, on 1-4 devices,
    2x2, uneven and empty weight shards; on a CPU with bfloat16 units each device's product runs
    there (device_stats' onednn_matmuls counts it), elsewhere through float32 (the count stays)."""
    _check_bf16_prompt(*_bf16_prompt_cases()[case])


# ---- embedding --------------------------------------------------------------------------------


def emb_natural(pis, pws, ind):
    out = []
    for pi, pw in zip(pis, pws):
        if pi == R and pw == R:
            out.append(R)
        elif pi == R and pw == Shard(1):
            out.append(Shard(ind))
        elif pi == R and pw == Shard(0):
            out.append(PSUM)
        elif pi == R and isinstance(pw, Partial):
            out.append(pw)
        elif isinstance(pi, Shard) and pw == R:
            out.append(pi)
        else:
            return None
    return out


@pytest.mark.parametrize("mesh_name", MESHES)
@pytest.mark.parametrize("ishape", [(7,), (2, 5), (0, 3)])
def test_embedding_every_placement(rt, mesh_name, ishape):
    mesh = MESHES[mesh_name]()
    V, D = 6, 5
    table = rng.standard_normal((V, D))
    idx = rng.integers(0, V, ishape)
    io = list(itertools.product(options(len(ishape)), repeat=mesh.ndim))
    wo = list(itertools.product([R, Shard(0), Shard(1), PSUM], repeat=mesh.ndim))
    for pis, pws in _sample(itertools.product(io, wo), 300 if mesh.ndim > 1 else 1000, 3):
        ind = dtorch.distribute_tensor(idx.astype(np.int64), mesh, list(pis))
        w, wv = make(table, mesh, pws)
        what = f"embedding idx{ishape}{pis} W{pws} on {mesh_name}"
        y = run_expecting(lambda: dtorch.nn.functional.embedding(ind, w), emb_natural(pis, pws, len(ishape)), what)
        check(y, wv[idx], dtorch.float32, what)


@pytest.mark.parametrize("dtype", [dtorch.float16, dtorch.bfloat16, dtorch.int64, dtorch.int32])
def test_embedding_dtypes(rt, dtype):
    mesh = mesh_2x2()
    table = rng.integers(-9, 9, (7, 4)) if dtype in (dtorch.int64, dtorch.int32) else rng.standard_normal((7, 4))
    for idx_dtype in (np.int64, np.int32):
        idx = rng.integers(0, 7, (3, 4)).astype(idx_dtype)
        for pis, pws in (([R, R], [Shard(0), Shard(1)]), ([Shard(0), R], [R, Shard(0)]),
                         ([Shard(1), Shard(0)], [R, R])):
            ind = dtorch.distribute_tensor(idx, mesh, pis)
            w, wv = make(table, mesh, pws, dtype)
            y = dtorch.nn.functional.embedding(ind, w)
            assert y.dtype == dtype
            check(y, wv[idx.astype(np.int64)], dtype)


def test_embedding_partial_max_and_options(rt):
    mesh = mesh_2x2()
    table = rng.standard_normal((6, 3))
    idx = rng.integers(0, 6, (4,))
    ind = dtorch.distribute_tensor(idx, mesh, [R, R])
    for pws in ([PMAX, Shard(0)], [Shard(0), PMAX], [PMAX, R]):
        w, wv = make(table, mesh, pws)
        dtorch.set_strict(True)
        try:
            y = dtorch.nn.functional.embedding(ind, w, padding_idx=0)
        finally:
            dtorch.set_strict(False)
        assert y.placements == tuple(PSUM if p == Shard(0) else p for p in pws)
        check(y, wv[idx], dtorch.float32)
    w, _ = make(table, mesh, [R, R])
    with pytest.raises(AssertionError, match="Padding_idx"):
        dtorch.nn.functional.embedding(ind, w, padding_idx=6)
    with pytest.raises(NotImplementedError):
        dtorch.nn.functional.embedding(ind, w, max_norm=1.0)


def test_embedding_index_out_of_range(rt):
    mesh = mesh_1d(3)
    w = dtorch.distribute_tensor(np.ones((4, 2), np.float32), mesh, [Shard(0)])
    for bad in (4, -1):
        ind = dtorch.distribute_tensor(np.array([0, bad, 1], np.int64), mesh, [R])
        y = dtorch.nn.functional.embedding(ind, w)  # the call itself cannot see the values
        with pytest.raises(Exception, match="index out of range in embedding"):
            y.numpy()
        z = y + 1  # poisoned downstream, naming the root
        with pytest.raises(Exception, match="index out of range in embedding"):
            z.numpy()
    # the runtime keeps working
    ind = dtorch.distribute_tensor(np.array([3, 0], np.int64), mesh, [Shard(0)])
    check(dtorch.nn.functional.embedding(ind, w), np.ones((2, 2)), dtorch.float32)


# ---- scaled_dot_product_attention --------------------------------------------------------------


def ref_sdpa(q, k, v, mask=None, causal=False, scale=None, gqa=False):
    """float64 reference: softmax over keys, rows that see nothing give zeros."""
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    if gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * (1 / np.sqrt(E) if scale is None else scale)
    bias = np.zeros((L, S))
    if causal:
        bias = np.where(np.tril(np.ones((L, S), bool)), 0.0, -np.inf)
    if mask is not None:
        bias = bias + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask)
    s = s + bias
    top = np.max(s, axis=-1, keepdims=True)
    dead = ~np.isfinite(top)
    e = np.exp(s - np.where(dead, 0.0, top))
    e = np.where(dead, 0.0, e)
    den = e.sum(axis=-1, keepdims=True)
    p = e / np.where(den == 0, 1.0, den)
    return np.matmul(p, v)


def sdpa_natural(pq, pk, pv, pm, qshape, kshape, mshape, mesh_shape):
    nd = len(qshape)
    out = []
    gqa_ways = 1
    def mask_ok(m, d):
        """The mask follows an output shard on dim d where its own dim has that size."""
        if pm is None:
            return True
        md = None if d is None else d - (nd - len(mshape))
        return pm[m] == (Shard(md) if md is not None and md >= 0 and mshape[md] == qshape[d] else R)

    for m, (a, b, c) in enumerate(zip(pq, pk, pv)):
        if a == R and b == R and c == R and mask_ok(m, None):
            out.append(R)
        elif isinstance(a, Shard) and a.dim < nd - 2 and a == b == c and mask_ok(m, a.dim):
            if qshape[a.dim] != kshape[a.dim]:
                gqa_ways *= mesh_shape[m]
            out.append(a)
        elif a == Shard(nd - 2) and b == R and c == R and mask_ok(m, nd - 2):
            out.append(a)
        elif a == R and b == R and isinstance(c, Partial) and (pm is None or pm[m] == R):
            out.append(c)
        else:
            return None
    if gqa_ways > 1 and kshape[nd - 3] % gqa_ways:
        return None
    return out


SDPA_CASES = {
    # name: q shape, k shape, v shape, mask shape (None / bool / float), causal, gqa, scale
    "plain": ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 3), None, False, False, None),
    "causal": ((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4), None, True, False, None),
    "causal_LneS": ((1, 3, 6, 4), (1, 3, 4, 4), (1, 3, 4, 2), None, True, False, 0.7),
    "bool_mask": ((2, 2, 5, 4), (2, 2, 6, 4), (2, 2, 6, 4), ("bool", (2, 1, 5, 6)), False, False, None),
    "float_mask": ((3, 5, 4), (3, 6, 4), (3, 6, 4), ("float", (5, 6)), False, False, None),
    "gqa": ((2, 4, 5, 4), (2, 2, 6, 4), (2, 2, 6, 4), None, False, True, None),
    "gqa_causal": ((1, 6, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4), None, True, True, None),
    "2d": ((5, 4), (6, 4), (6, 3), ("bool", (5, 6)), False, False, None),
    # a static cache: each row sees a prefix of the slots (one sees none), the last slots no row sees
    "cache_prefix": ((2, 3, 4, 4), (2, 3, 9, 4), (2, 3, 9, 3), ("prefix", (4, 9)), False, False, None),
    # decode over a ring of slots: one query row, the slots each row sees scattered, grouped heads,
    # head dims past the vector width (20: 16 + a tail) and of another size for the values
    "decode_scattered": ((2, 4, 1, 20), (2, 2, 9, 20), (2, 2, 9, 11), ("bool", (2, 1, 1, 9)), False, True, 0.3),
}


def make_mask(kind, shape):
    if kind == "prefix":
        seen = np.array([3, 6, 0, 5])[:shape[0]]
        return np.arange(shape[1]) < seen[:, None]
    if kind == "bool":
        m = rng.random(shape) < 0.7
        m.reshape(-1, shape[-1])[0, :] = False  # a fully masked row: zeros, not NaN
        return m
    return rng.standard_normal(shape)


@pytest.mark.parametrize("mesh_name", MESHES)
@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_every_placement(rt, mesh_name, case):
    mesh = MESHES[mesh_name]()
    qs, ks, vs, mk, causal, gqa, scale = SDPA_CASES[case]
    q, k, v = rng.standard_normal(qs), rng.standard_normal(ks), rng.standard_normal(vs)
    mask = make_mask(*mk) if mk else None
    nd = len(qs)
    opts = [R] + [Shard(d) for d in range(nd)]
    per_dim = [(a, b, c) for a in opts for b in opts for c in opts if a == b == c or (b == c and b == R)]
    per_dim += [(R, R, PSUM), (Shard(nd - 2), Shard(nd - 2), Shard(nd - 2)), (R, Shard(nd - 2), R)]
    mopts = [None] if mask is None else [R] + [Shard(d) for d in range(mask.ndim)]
    combos = list(itertools.product(itertools.product(per_dim, repeat=mesh.ndim),
                                    itertools.product(mopts, repeat=mesh.ndim)))
    for qkv, pm in _sample(combos, 150 if mesh.ndim > 1 else 400, len(case) + mesh.ndim):
        pq, pk, pv = ([t[i] for t in qkv] for i in range(3))
        x, qv = make(q, mesh, pq)
        kk, kv = make(k, mesh, pk)
        vv, vvv = make(v, mesh, pv)
        args = {}
        if mask is not None:
            args["attn_mask"] = dtorch.distribute_tensor(mask if mask.dtype == bool else mask.astype(np.float32),
                                                         mesh, list(pm))
        mv = None if mask is None else (mask if mask.dtype == bool else mask.astype(np.float32).astype(np.float64))
        ref = ref_sdpa(qv, kv, vvv, mv, causal, scale, gqa)
        what = f"sdpa {case} q{pq} k{pk} v{pv} mask{pm} on {mesh_name}"
        nat = sdpa_natural(pq, pk, pv, None if mask is None else pm, qs, ks, mask.shape if mask is not None else (),
                           mesh.shape)
        y = run_expecting(lambda: dtorch.nn.functional.scaled_dot_product_attention(
            x, kk, vv, is_causal=causal, scale=scale, enable_gqa=gqa, **args), nat, what)
        check(y, ref, dtorch.float32, what)


@pytest.mark.parametrize("L", [40, 3])
def test_sdpa_long_rows_and_nan_as_torch(rt, L):
    """Blocks of many query rows (40) or a few scored key by key (3, as decode) over 37 keys (whole
    vectors of 8 and a tail) against numpy; a NaN in a query row makes that row NaN, a NaN in a key
    every row of its head, as torch gives them (once a NaN query row came out zeros), and every
    other row keeps its value."""
    mesh = mesh_1d(1)
    q, k, v = rng.standard_normal((2, L, 16)), rng.standard_normal((2, 37, 16)), rng.standard_normal((2, 37, 8))
    q[0, 1, 3] = np.nan
    k[1, 30, 0] = np.nan
    y = dtorch.nn.functional.scaled_dot_product_attention(*(dtorch.distribute_tensor(t.astype(np.float32), mesh, [R])
                                                            for t in (q, k, v))).numpy()
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(16)
    with np.errstate(invalid="ignore"):
        e = np.exp(scores - scores.max(-1, keepdims=True))
        want = (e / e.sum(-1, keepdims=True)) @ v
    assert np.isnan(want[0, 1]).all() and np.isnan(want[1]).all()
    assert np.isnan(y[0, 1]).all() and np.isnan(y[1]).all()
    rows = np.arange(L) != 1
    np.testing.assert_allclose(y[0, rows], want[0, rows], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [dtorch.float16, dtorch.bfloat16])
def test_sdpa_16bit(rt, dtype):
    mesh = mesh_2x2()
    q, k, v = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 2, 7, 8)), rng.standard_normal((2, 2, 7, 8))
    for pl in ([Shard(0), Shard(1)], [Shard(1), R], [R, R]):
        x, qv = make(q, mesh, pl, dtype)
        kk, kv = make(k, mesh, pl, dtype)
        vv, vvv = make(v, mesh, pl, dtype)
        y = dtorch.nn.functional.scaled_dot_product_attention(x, kk, vv, is_causal=True, enable_gqa=True)
        assert y.dtype == dtype
        check(y, ref_sdpa(qv, kv, vvv, causal=True, gqa=True), dtype)
    mask = dtorch.distribute_tensor(rng.standard_normal((5, 7)).astype(np.float32), mesh, [R, R]).to(dtype)
    x, qv = make(q, mesh, [Shard(2), R], dtype)
    kk, kv = make(k, mesh, [R, R], dtype)
    vv, vvv = make(v, mesh, [R, R], dtype)
    y = dtorch.scaled_dot_product_attention(x, kk, vv, attn_mask=mask, enable_gqa=True)
    check(y, ref_sdpa(qv, kv, vvv, mask.numpy().astype(np.float64), gqa=True), dtype)
    # decode's few query rows read the 16-bit keys and values as they are (odd head sizes: vector tails)
    k, v = rng.standard_normal((2, 2, 37, 21)), rng.standard_normal((2, 2, 37, 19))
    for L in (1, 4):
        x, qv = make(rng.standard_normal((2, 4, L, 21)), mesh, [Shard(1), R], dtype)
        kk, kv = make(k, mesh, [Shard(1), R], dtype)
        vv, vvv = make(v, mesh, [Shard(1), R], dtype)
        y = dtorch.nn.functional.scaled_dot_product_attention(x, kk, vv, enable_gqa=True)
        check(y, ref_sdpa(qv, kv, vvv, gqa=True), dtype)


@pytest.mark.parametrize("mesh_name", ["1", "2", "3"])
def test_sdpa_bf16_prompt_on_units(rt, mesh_name):
    """A bfloat16 prompt's attention (more query rows than decode's): against float64 from the
    values q, k and v hold, element by element, within the weights' rounding to bfloat16 between
    the two products and the output's rounding; causal, a boolean mask with a row that sees
    nothing (zeros), a float mask, grouped heads, keys past the queries, heads split unevenly over
    the devices (5 over 3), head sizes on and off AMX's step of 32. On a CPU with bfloat16 units both products of every head run there
    (device_stats' onednn_matmuls: 2 per head on each device), elsewhere through float32."""
    mesh = MESHES[mesh_name]()
    units = _bf16_units()
    n = mesh.shape[0]
    heads = [b - a for (_, (a, b), _, _) in (local_slices((1, 5, 1, 1), mesh.shape, [Shard(1)], (i,))
                                             for i in range(n))]
    bmask = rng.random((20, 53)) > 0.3
    bmask[3] = False
    fmask = rng.standard_normal((37, 37)).astype(np.float32)
    # query/key features 24 and 48 (zero-padded to AMX's steps of 32 for the scores) and 64 (not)
    cases = [(37, 37, dict(is_causal=True), None, 24),
             (20, 53, dict(attn_mask=bmask), bmask, 64),
             (37, 37, dict(attn_mask=fmask), fmask, 48)]
    for L, S, kw, mref, E in cases:
        x, qv = make(rng.standard_normal((1, 5, L, E)), mesh, [Shard(1)], dtorch.bfloat16)
        kk, kv = make(rng.standard_normal((1, 5, S, E)), mesh, [Shard(1)], dtorch.bfloat16)
        vv, vvv = make(rng.standard_normal((1, 5, S, 40)), mesh, [Shard(1)], dtorch.bfloat16)
        if "attn_mask" in kw:
            m = kw["attn_mask"]
            kw = dict(attn_mask=dtorch.distribute_tensor(m, mesh, [R]).to(dtorch.bfloat16)
                      if m.dtype != bool else dtorch.distribute_tensor(m, mesh, [R]))
            if m.dtype != bool:
                mref = kw["attn_mask"].numpy().astype(np.float64)
        before = [st["onednn_matmuls"] for st in dtorch.device_stats(mesh)]
        y = dtorch.nn.functional.scaled_dot_product_attention(x, kk, vv, **kw)
        assert y.dtype == dtorch.bfloat16
        got = y.numpy().astype(np.float64)
        ref = ref_sdpa(qv, kv, vvv, mref, causal=kw.get("is_causal", False))
        # the weights (at most 1) rounded to bfloat16, then the output once
        mag = ref_sdpa(qv, kv, np.abs(vvv), mref, causal=kw.get("is_causal", False))
        bound = 2.0 ** -8 * mag + 2.0 ** -8 * np.abs(ref) + 1e-6
        assert got.shape == ref.shape
        worst = float(np.max(np.abs(got - ref) - bound))
        assert worst <= 0, f"{mesh_name} L {L} S {S}: past the bound by {worst:.3g}"
        if mref is not None and mref.dtype == bool:
            assert np.all(got[:, :, 3] == 0)
        after = [st["onednn_matmuls"] for st in dtorch.device_stats(mesh)]
        assert [a - b for a, b in zip(after, before)] == [2 * h if units else 0 for h in heads], (mesh_name, L, S)


@pytest.mark.parametrize("dtype", [dtorch.float32, dtorch.bfloat16])
def test_sdpa_decode_wide_heads(rt, dtype):
    """Decode's few query rows against head sizes past 64 features (keys 72; values 70 and 100:
    whole registers of 64, then 32, then a tail of 6 or 4), 45 keys (blocks of 8 and a tail of 5),
    a mask hiding scattered keys and one whole block of 8, on 1 device and with the heads split
    over 2 and 3 (the second and third pieces' heads uneven), against numpy in float64."""
    k = rng.standard_normal((1, 3, 45, 72))
    for ev in (70, 100):
        v = rng.standard_normal((1, 3, 45, ev))
        for L in (1, 2):
            q = rng.standard_normal((1, 3, L, 72))
            hide = rng.random((L, 45)) < 0.3
            hide[:, 16:24] = True
            mask = np.where(hide, -np.inf, rng.standard_normal((L, 45))).astype(np.float32)
            for n in (1, 2, 3):
                mesh = mesh_1d(n)
                x, qv = make(q, mesh, [Shard(1)], dtype)
                kk, kv = make(k, mesh, [Shard(1)], dtype)
                vv, vvv = make(v, mesh, [Shard(1)], dtype)
                m = dtorch.distribute_tensor(mask, mesh, [R])
                y = dtorch.nn.functional.scaled_dot_product_attention(x, kk, vv, attn_mask=m)
                check(y, ref_sdpa(qv, kv, vvv, mask.astype(np.float64)), dtype, f"Ev {ev} L {L} on {n}")


def test_sdpa_sequence_and_gqa_rules(rt):
    mesh = mesh_1d(4)
    q, k, v = rng.standard_normal((1, 4, 9, 4)), rng.standard_normal((1, 2, 9, 4)), rng.standard_normal((1, 2, 9, 4))
    # everything sequence-sharded, no batch dim to move to: k, v are gathered, the query rows
    # stay where they are (torch would gather q too)
    x, qv = make(q[0, 0], mesh, [Shard(0)])
    kk, kv = make(k[0, 0], mesh, [Shard(0)])
    vv, vvv = make(v[0, 0], mesh, [Shard(0)])
    y = dtorch.scaled_dot_product_attention(x, kk, vv, is_causal=True)
    assert y.placements == (Shard(0),)
    check(y, ref_sdpa(qv, kv, vvv, causal=True), dtorch.float32)
    # query rows sharded, keys and values replicated: no communication at all
    x, qv = make(q, mesh, [Shard(2)])
    kk, kv = make(k, mesh, [R])
    vv, vvv = make(v, mesh, [R])
    y = run_expecting(lambda: dtorch.scaled_dot_product_attention(x, kk, vv, is_causal=True, enable_gqa=True),
                      [Shard(2)], "query-sequence shard")
    check(y, ref_sdpa(qv, kv, vvv, causal=True, gqa=True), dtorch.float32)
    # GQA heads: 2 key/value heads over 4 devices cannot keep whole groups: not head-sharded
    x, qv = make(q, mesh, [Shard(1)])
    kk, kv = make(k, mesh, [Shard(1)])
    vv, vvv = make(v, mesh, [Shard(1)])
    y = dtorch.scaled_dot_product_attention(x, kk, vv, enable_gqa=True)
    assert y.placements != (Shard(1),)
    check(y, ref_sdpa(qv, kv, vvv, gqa=True), dtorch.float32)
    # over 2 devices they can
    mesh = mesh_1d(2)
    x, qv = make(q, mesh, [Shard(1)])
    kk, kv = make(k, mesh, [Shard(1)])
    vv, vvv = make(v, mesh, [Shard(1)])
    y = dtorch.scaled_dot_product_attention(x, kk, vv, enable_gqa=True)
    assert y.placements == (Shard(1),)
    check(y, ref_sdpa(qv, kv, vvv, gqa=True), dtorch.float32)


# ---- bad input ------------------------------------------------------------------------------


def test_bad_input(rt):
    mesh = mesh_1d(2)
    f = lambda *s: dtorch.distribute_tensor(np.ones(s, np.float32), mesh, [R])  # noqa: E731
    i = dtorch.distribute_tensor(np.ones((2, 3), np.int64), mesh, [R])
    with pytest.raises(ValueError, match=r"mat1 and mat2 shapes cannot be multiplied"):
        f(2, 3) @ f(4, 5)
    with pytest.raises(ValueError, match="inconsistent tensor size"):
        dtorch.matmul(f(3), f(4))
    with pytest.raises(ValueError, match="at least 1D"):
        dtorch.matmul(dtorch.distribute_tensor(np.float32(1), mesh), f(2))
    with pytest.raises(ValueError, match="size of tensor a"):
        dtorch.matmul(f(2, 2, 3), f(3, 3, 4))
    with pytest.raises(ValueError, match="mm: self must be a matrix"):
        dtorch.mm(f(2, 2, 3), f(3, 3))
    with pytest.raises(ValueError, match="bmm"):
        dtorch.bmm(f(2, 2, 3), f(3, 3, 4))
    with pytest.raises(ValueError, match="bmm: batch1 must be a 3D tensor"):
        dtorch.bmm(f(2, 3), f(3, 4))
    with pytest.raises(TypeError, match="same dtype"):
        dtorch.matmul(f(2, 3), dtorch.distribute_tensor(np.ones((3, 2), np.int64), mesh))
    with pytest.raises(TypeError, match="bool"):
        b = dtorch.distribute_tensor(np.ones((2, 2), bool), mesh)
        dtorch.matmul(b, b)
    with pytest.raises(TypeError, match="DTensor"):
        dtorch.matmul(f(2, 2), np.ones((2, 2), np.float32))
    with pytest.raises(TypeError):
        f(2, 2) @ 3
    with pytest.raises(ValueError, match="linear"):
        dtorch.nn.functional.linear(f(2, 3), f(4, 5))
    with pytest.raises(ValueError, match="bias"):
        dtorch.nn.functional.linear(f(2, 3), f(4, 3), f(5))
    with pytest.raises(ValueError, match="weight"):
        dtorch.nn.functional.linear(f(2, 3), f(1, 4, 3))
    with pytest.raises(TypeError, match="indices"):
        dtorch.nn.functional.embedding(f(3), f(4, 2))
    with pytest.raises(ValueError, match="2-D"):
        dtorch.nn.functional.embedding(i, f(4))
    q = f(1, 2, 3, 4)
    sdpa = dtorch.nn.functional.scaled_dot_product_attention
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(f(1, 4, 3, 4), f(1, 2, 3, 4), f(1, 2, 3, 4))
    with pytest.raises(ValueError, match="divide"):
        sdpa(f(1, 4, 3, 4), f(1, 3, 3, 4), f(1, 3, 3, 4), enable_gqa=True)
    with pytest.raises(ValueError, match="is_causal"):
        sdpa(q, q, q, attn_mask=dtorch.distribute_tensor(np.ones((3, 3), bool), mesh), is_causal=True)
    with pytest.raises(ValueError, match="attn_mask"):
        sdpa(q, q, q, attn_mask=dtorch.distribute_tensor(np.ones((3, 3, 3), bool), mesh))
    with pytest.raises(TypeError, match="attn_mask dtype"):
        sdpa(q, q, q, attn_mask=dtorch.distribute_tensor(np.ones((3, 3), np.int64), mesh))
    with pytest.raises(ValueError):
        sdpa(q, f(1, 2, 3, 5), q)
    with pytest.raises(TypeError, match="dtype"):
        sdpa(q, q, q.to(dtorch.float16))
    with pytest.raises(TypeError):
        sdpa(i, i, i)
    other = mesh_1d(3)
    with pytest.raises(RuntimeError, match="cross-mesh"):
        dtorch.matmul(f(2, 3), dtorch.distribute_tensor(np.ones((3, 2), np.float32), other))
    # still working
    check(f(2, 3) @ f(3, 2), np.full((2, 2), 3.0), dtorch.float32)


# ---- process mode ---------------------------------------------------------------------------


def test_process_mode_subset():
    dtorch.shutdown()
    dtorch.init(workers="process")
    try:
        mesh = mesh_2x2()
        a, b = rng.standard_normal((5, 6)), rng.standard_normal((6, 3))
        for pas, pbs in (([Shard(0), Shard(1)], [R, Shard(0)]), ([Shard(1), R], [Shard(0), Shard(1)]),
                         ([PSUM, R], [R, R]), ([R, Shard(0)], [Shard(1), R])):
            x, xv = make(a, mesh, pas)
            w, wv = make(b, mesh, pbs)
            check(x @ w, xv @ wv, dtorch.float32)
        x, xv = make(rng.standard_normal((2, 5, 6)), mesh, [Shard(1), Shard(2)])
        w, wv = make(rng.standard_normal((4, 6)), mesh, [R, Shard(1)])
        bt, bv = make(rng.standard_normal(4), mesh, [R, R])
        y = dtorch.nn.functional.linear(x, w, bt)
        assert y.placements == (Shard(1), PSUM)
        check(y, xv @ wv.T + bv, dtorch.float32)
        idx = rng.integers(0, 6, (3, 2))
        ind = dtorch.distribute_tensor(idx, mesh, [R, Shard(0)])
        w, wv = make(rng.standard_normal((6, 4)), mesh, [Shard(0), R])
        check(dtorch.nn.functional.embedding(ind, w), wv[idx], dtorch.float32)
        q = rng.standard_normal((2, 4, 5, 4))
        k = rng.standard_normal((2, 2, 6, 4))
        x, qv = make(q, mesh, [Shard(0), Shard(2)])
        kk, kv = make(k, mesh, [Shard(0), R])
        vv, vvv = make(k, mesh, [Shard(0), R])
        y = dtorch.scaled_dot_product_attention(x, kk, vv, is_causal=True, enable_gqa=True)
        assert y.placements == (Shard(0), Shard(2))
        check(y, ref_sdpa(qv, kv, vvv, causal=True, gqa=True), dtorch.float32)
        bad = dtorch.distribute_tensor(np.array([7], np.int64), mesh, [R, R])
        with pytest.raises(Exception, match="index out of range in embedding"):
            dtorch.nn.functional.embedding(bad, w).numpy()
        check(x @ dtorch.distribute_tensor(np.eye(4, dtype=np.float32), mesh, [R, R]), qv, dtorch.float32)
        for case in _bf16_prompt_cases()[2:5]:
            _check_bf16_prompt(*case)
    finally:
        dtorch.shutdown()
        dtorch.init(workers="thread")
