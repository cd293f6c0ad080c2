"""Fuzzes the C extension's argument conversion (bindings/dtpy_*.c) through the public API: the
factories' sizes, fill values, dtypes, placements and meshes; arange's bounds; DeviceMesh and
init_device_mesh; indexing keys; reshape, view, permute and transpose; redistribute's mesh and
placements; distribute_tensor and from_local with odd arrays and pieces. Workers are threads of
this process on CPU devices 0..7.

The contract: any argument gives a result or a Python exception of a documented kind (TypeError,
ValueError, IndexError, RuntimeError, OverflowError; KeyError for a mesh dim name, as torch), never a
crash, an abort, a SystemError or a hang, and the runtime works after it (each input ends with an
op whose value is checked). Where a call succeeds, its value is checked against numpy: an index, a
view, a redistribute, distribute_tensor, from_local of shards, and the factories' shapes.

Sizes pass huge, negative and overflowing values, but a call that would be accepted and allocate
more than 10**6 elements is not made (the point is the conversion, not the allocator).

Each input is 1 to 4 calls, every choice read from it (atheris.FuzzedDataProvider).
"""
import faulthandler
import math
import operator
import sys

import atheris
import numpy as np

import fuzzlib

with atheris.instrument_imports(include=["dtorch"]):
    import dtorch

KINDS = (TypeError, ValueError, IndexError, RuntimeError, OverflowError)
MAX_ELEMENTS = 10**6
LIMIT = 1 << 48          # a DTensor's most elements: a size past it is refused before any allocation
IDS = [0, 1, 2, 3, 4, 5, 6, 7, -1, 65535 + 1, 2**31, 2**63, 2**64, -2**63]


class Hostile(Exception):
    """What the hostile arguments below raise: theirs to propagate, no finding."""


class BadIndex:
    """An object whose __index__ raises."""

    def __index__(self):
        raise Hostile("__index__")


class HugeIndex:
    def __index__(self):
        return 2**70


class BadSequence:
    """A sequence whose length lies."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        if i >= 1:
            raise IndexError(i)
        return 2


class BadArray:
    """An object whose __array__ raises."""

    def __array__(self, dtype=None, copy=None):
        raise Hostile("__array__")


class FakeDLPack:
    def __dlpack__(self, stream=None):
        return "not a capsule"

    def __dlpack_device__(self):
        return (1, 0)


MESHES = []


def _meshes():
    return [dtorch.DeviceMesh("cpu", [0]), dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [1, 2, 3]),
            dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))]


# ---- odd values -------------------------------------------------------------------------------

def odd_int(fdp):
    """An int-like: mostly a small int, else an edge, a numpy int, a bool, a float, a hostile one."""
    k = fdp.ConsumeIntInRange(0, 15)
    if k < 8:
        return fdp.ConsumeIntInRange(-2, 6)
    if k < 11:
        return fdp.PickValueInList(fuzzlib.INTS)
    return fdp.PickValueInList([np.int64(3), np.uint64(2**64 - 1), np.int32(-1), True, 2.0, float("nan"), "3",
                                None, BadIndex(), HugeIndex(), np.uint8(2)])


def odd_value(fdp, depth=1):
    """Anything an argument might be given."""
    k = fdp.ConsumeIntInRange(0, 19)
    if k < 6:
        return odd_int(fdp)
    if k == 6:
        return fdp.PickValueInList([0.5, -0.0, 1e300, float("inf"), float("-inf"), float("nan"), np.float32(2),
                                    np.float16(1), np.bool_(True), 1 + 2j])
    if k == 7:
        return fdp.PickValueInList(["", "a", "float32", "int64", "bfloat16", "cpu", "cuda", "sum", "dp", "a\0b",
                                    "\ud800"])
    if k == 8:
        return fdp.PickValueInList([dtorch.float32, dtorch.float16, dtorch.bfloat16, dtorch.int32, dtorch.int64,
                                    dtorch.bool, np.float64, np.dtype("uint8"), np.dtype(">f4"), int, float])
    if k == 9:
        return odd_placement(fdp)
    if k == 10 and MESHES:
        return fdp.PickValueInList(MESHES)
    if k == 11:
        return fdp.PickValueInList([None, Ellipsis, slice(None), object(), b"ab", {}, BadSequence(), BadArray(),
                                    FakeDLPack(), np.zeros((2, 2)), np.arange(3), range(3)])
    if k in (12, 13) and depth > 0:
        items = [odd_value(fdp, depth - 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        return tuple(items) if fdp.ConsumeBool() else items
    return odd_int(fdp)


def odd_placement(fdp):
    k = fdp.ConsumeIntInRange(0, 5)
    if k < 3:
        return dtorch.Shard(fdp.ConsumeIntInRange(-3, 4))
    if k == 3:
        return dtorch.Replicate()
    if k == 4:
        return dtorch.Partial(fdp.PickValueInList(["sum", "avg", "max", "min"]))
    return fdp.PickValueInList([dtorch.Placement(), "Shard(0)", None, 0])


def placements(fdp, ndim):
    """Mostly one good-looking placement per mesh dim, else anything."""
    k = fdp.ConsumeIntInRange(0, 7)
    if k == 0:
        return None
    if k == 1:
        return odd_value(fdp)
    n = ndim if k > 2 else fdp.ConsumeIntInRange(0, 9)
    out = [odd_placement(fdp) for _ in range(n)]
    return tuple(out) if fdp.ConsumeBool() else out


def mesh_arg(fdp):
    return fdp.PickValueInList(MESHES) if fdp.ConsumeIntInRange(0, 9) else odd_value(fdp)


def as_int(x):
    try:
        return operator.index(x)
    except Exception:   # noqa: BLE001: not an int: the call refuses it before allocating
        return None


def too_big(dims):
    """Whether a size the call would accept holds more than MAX_ELEMENTS elements."""
    ints = [as_int(d) for d in dims]
    if any(i is None or isinstance(d, bool) or i < 0 or i >= 2**63 for i, d in zip(ints, dims)):
        return False
    n = math.prod(ints)
    return MAX_ELEMENTS < n <= LIMIT


def value_of(t):
    return np.asarray(t.numpy())


# ---- the calls ----------------------------------------------------------------------------------

def call_factory(fdp):
    kind = fdp.PickValueInList(["zeros", "ones", "empty", "rand", "randn", "full"])
    if fdp.ConsumeIntInRange(0, 3):
        dims = [fdp.ConsumeIntInRange(0, 5) if fdp.ConsumeIntInRange(0, 3) else odd_int(fdp)
                for _ in range(fdp.ConsumeIntInRange(0, 9))]
    else:
        dims = odd_value(fdp)
        dims = dims if isinstance(dims, (list, tuple)) else [dims]
    if too_big(dims):
        return
    mesh = mesh_arg(fdp)
    kw = dict(device_mesh=mesh, placements=placements(fdp, getattr(mesh, "ndim", 1)))
    if fdp.ConsumeIntInRange(0, 2) == 0:
        kw["dtype"] = odd_value(fdp) if fdp.ConsumeBool() else fdp.PickValueInList(
            ["float32", "float16", "bfloat16", "int32", "int64", "bool"])
    if fdp.ConsumeIntInRange(0, 7) == 0:
        kw["requires_grad"] = fdp.PickValueInList([False, None, 0]) if fdp.ConsumeBool() else odd_value(fdp)
    packed = fdp.ConsumeBool()
    if kind == "full":
        x = dtorch.full(tuple(dims) if packed else (dims[0] if len(dims) == 1 else dims), odd_value(fdp), **kw)
    else:
        x = getattr(dtorch, kind)(*((tuple(dims),) if packed else dims), **kw)
    want = tuple(operator.index(d) for d in dims)
    if kind == "full" and not packed and len(dims) == 1:
        want = (operator.index(dims[0]),)
    if x.shape != want:
        raise fuzzlib.Finding(f"{kind}{tuple(dims)} made shape {x.shape}")
    v = value_of(x)
    if v.shape != want:
        raise fuzzlib.Finding(f"{kind}{tuple(dims)} fetched shape {v.shape}")
    if any(p.is_partial() for p in x.placements):
        return   # every device holds the value, and a Partial sums them: torch's factories do the same
    if kind in ("zeros", "ones") and v.size and not (v == (kind == "ones")).all():
        raise fuzzlib.Finding(f"{kind}{tuple(dims)} holds {v.ravel()[:8]}")
    if kind == "rand" and v.size and not ((v >= 0) & (v < 1)).all():
        raise fuzzlib.Finding(f"rand{tuple(dims)} holds {v.ravel()[:8]}")


def call_arange(fdp):
    args = [odd_value(fdp) if fdp.ConsumeIntInRange(0, 2) == 0 else fdp.ConsumeIntInRange(-20, 20)
            for _ in range(fdp.ConsumeIntInRange(1, 3))]
    nums = [a for a in args if isinstance(a, (int, float, np.integer, np.floating, np.bool_))]   # bools count 0, 1
    if len(nums) == len(args):
        start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        try:
            n = math.ceil((float(end) - float(start)) / float(step))
        except (ZeroDivisionError, OverflowError, ValueError):
            n = None
        if n is not None and MAX_ELEMENTS < n <= LIMIT:
            return
    mesh = mesh_arg(fdp)
    kw = dict(device_mesh=mesh, placements=placements(fdp, getattr(mesh, "ndim", 1)))
    if fdp.ConsumeIntInRange(0, 3) == 0:
        kw["dtype"] = odd_value(fdp)
    x = dtorch.arange(*args, **kw)
    v = value_of(x)
    if len(nums) == len(args) and all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in args) \
            and "dtype" not in kw \
            and not any(p.is_partial() for p in x.placements):   # a Partial factory sums every device's value
        want = np.arange(*[int(a) for a in args])
        if v.shape != want.shape or not (v == want).all():
            raise fuzzlib.Finding(f"arange{tuple(args)} gives {v[:8]}, numpy {want[:8]}")


def call_mesh(fdp):
    k = fdp.ConsumeIntInRange(0, 3)
    names = None if fdp.ConsumeBool() else odd_value(fdp) if fdp.ConsumeBool() else \
        [fdp.PickValueInList(["dp", "tp", "", "a\0b", "dp"]) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if k == 0:
        shape = odd_value(fdp) if fdp.ConsumeBool() else [odd_int(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))]
        try:   # the dims init_device_mesh reads (any iterable: b"ab" is a 97 x 98 mesh)
            dims = (shape,) if isinstance(shape, int) else tuple(shape)
        except TypeError:
            dims = (shape,)
        ints = [as_int(d) for d in dims]
        if all(i is not None and i > 0 for i in ints) and math.prod(ints) > 8:
            return   # a good shape of more devices than 0..7: threads started for nothing
        mesh = dtorch.init_device_mesh(fdp.PickValueInList(["cpu", "cuda", "", "tpu"]), shape, mesh_dim_names=names)
    else:
        ids = odd_value(fdp) if k == 1 else [
            fdp.PickValueInList(IDS) if fdp.ConsumeIntInRange(0, 3) == 0 else fdp.ConsumeIntInRange(0, 7)
            for _ in range(fdp.ConsumeIntInRange(0, 4))]
        if k == 3 and isinstance(ids, list) and len(ids) % 2 == 0 and ids:
            ids = np.array(ids, dtype=fdp.PickValueInList(["int64", "uint64", "int8", "float32", "object"])).reshape(
                2, -1).tolist() if fdp.ConsumeBool() else [ids[:1], ids[1:]]   # 2-D, or ragged
        mesh = dtorch.DeviceMesh(fdp.PickValueInList(["cpu", "cpu", "cuda", "", "cpu\0"]), ids, mesh_dim_names=names)
    x = dtorch.zeros(2, 3, device_mesh=mesh)
    if not (value_of(x) == 0).all():
        raise fuzzlib.Finding(f"zeros on {mesh} are not zero")
    if mesh.mesh_dim_names and fdp.ConsumeBool():
        key = odd_value(fdp) if fdp.ConsumeBool() else fdp.PickValueInList(list(mesh.mesh_dim_names))
        try:
            mesh[key]
        except KeyError:
            pass


def source(fdp):
    """A small DTensor and its numpy value: arange over a shape of 0..4 dims."""
    shape = tuple(fdp.ConsumeIntInRange(0, 4) for _ in range(fdp.ConsumeIntInRange(0, 4)))
    ref = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    mesh = fdp.PickValueInList(MESHES)
    pls = []
    for _ in range(mesh.ndim):
        k = fdp.ConsumeIntInRange(0, 3)
        pls.append(dtorch.Shard(fdp.ConsumeIntInRange(0, len(shape) - 1)) if k and shape else dtorch.Replicate())
    return dtorch.distribute_tensor(ref, mesh, pls), ref


def index_item(fdp, x):
    k = fdp.ConsumeIntInRange(0, 11)
    if k < 3:
        return odd_int(fdp)
    if k < 6:
        bound = lambda: None if fdp.ConsumeIntInRange(0, 2) == 0 else odd_int(fdp)  # noqa: E731
        return slice(bound(), bound(), bound())
    if k == 6:
        return None
    if k == 7:
        return Ellipsis
    if k == 8:
        return [odd_int(fdp) if fdp.ConsumeIntInRange(0, 3) == 0 else fdp.ConsumeIntInRange(-4, 4)
                for _ in range(fdp.ConsumeIntInRange(0, 4))]
    if k == 9:
        idx = np.array([fdp.ConsumeIntInRange(-4, 4) for _ in range(fdp.ConsumeIntInRange(0, 3))], dtype=np.int64)
        if fdp.ConsumeIntInRange(0, 3) == 0:
            idx = idx.astype(fdp.PickValueInList(["float32", "bool", "int32"]))
        return dtorch.distribute_tensor(idx, x.device_mesh)
    return odd_value(fdp)


def _numpy_key(key):
    if isinstance(key, tuple):
        return tuple(_numpy_key(k) for k in key)
    if isinstance(key, dtorch.DTensor):
        return value_of(key)
    return key


def call_index(fdp):
    x, ref = source(fdp)
    key = tuple(index_item(fdp, x) for _ in range(fdp.ConsumeIntInRange(0, 5))) if fdp.ConsumeIntInRange(0, 3) \
        else index_item(fdp, x)
    got = value_of(x[key])
    try:
        want = ref[_numpy_key(key)]
    except Exception:   # noqa: BLE001: numpy refuses it: dtorch took it where torch does (negative steps aside)
        return
    if got.shape != want.shape or not (got == want).all():
        raise fuzzlib.Finding(f"x{ref.shape}[{key!r}] gives {got.shape} {got.ravel()[:8]}, numpy {want.shape} "
                              f"{np.asarray(want).ravel()[:8]}")


def call_view(fdp):
    x, ref = source(fdp)
    op = fdp.PickValueInList(["reshape", "view", "permute", "transpose"])
    if fdp.ConsumeIntInRange(0, 3):
        args = [fdp.ConsumeIntInRange(-1, 6) if fdp.ConsumeIntInRange(0, 3) else odd_int(fdp)
                for _ in range(fdp.ConsumeIntInRange(0, 5))]
    else:
        args = [odd_value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if op in ("reshape", "view") and too_big([a for a in args if as_int(a) != -1]):
        return
    if fdp.ConsumeBool() and op != "transpose":
        args = [tuple(args)]
    got = value_of(getattr(x, op)(*args))
    try:
        flat = [operator.index(a) for a in (args[0] if args and isinstance(args[0], tuple) else args)]
        if op in ("reshape", "view"):
            want = ref.reshape(flat)
        elif op == "permute":
            want = ref.transpose(flat)
        else:
            want = np.swapaxes(ref, *flat)
    except Exception:   # noqa: BLE001: numpy refuses it (or the arguments are no ints): no reference
        return
    if got.shape != want.shape or not (got == want).all():
        raise fuzzlib.Finding(f"x{ref.shape}.{op}{tuple(args)} gives {got.shape}, numpy {want.shape}")


def call_redistribute(fdp):
    x, ref = source(fdp)
    mesh = None if fdp.ConsumeIntInRange(0, 2) == 0 else mesh_arg(fdp)
    pls = placements(fdp, getattr(mesh if mesh is not None else x.device_mesh, "ndim", 1))
    if fdp.ConsumeIntInRange(0, 3) == 0:
        steps = dtorch.redistribute_plan(x, mesh, pls)
        if not isinstance(steps, list):
            raise fuzzlib.Finding(f"redistribute_plan gives {steps!r}")
        return
    got = value_of(x.redistribute(mesh, pls))
    if got.shape != ref.shape or not (got == ref).all():
        raise fuzzlib.Finding(f"redistribute to {mesh} {pls} changed the value")


def odd_array(fdp):
    k = fdp.ConsumeIntInRange(0, 9)
    shape = tuple(fdp.ConsumeIntInRange(0, 3) for _ in range(fdp.ConsumeIntInRange(0, 3)))
    if k == 9:
        shape = (1,) * fdp.ConsumeIntInRange(8, 10)
    dtype = fdp.PickValueInList(["float32", "int64", "int32", "float16", "bool", ">f4", ">i8", "float64", "uint8",
                                 "uint64", "complex64", "object", "<U1"])
    try:
        a = (np.arange(math.prod(shape)) % 7).astype(dtype).reshape(shape)
    except (TypeError, ValueError):
        a = np.zeros(shape, dtype=dtype)
    if k in (1, 2) and a.ndim:
        a = a[::-1] if k == 1 else a[::2]
    if k == 3 and a.ndim > 1:
        a = a.T
    if k == 4:
        return odd_value(fdp)
    if k == 5:
        return a.tolist()
    if k == 6:
        return memoryview(np.ascontiguousarray(a)) if a.dtype.kind in "fiub" else a
    return a


def call_distribute(fdp):
    a = odd_array(fdp)
    mesh = mesh_arg(fdp)
    pls = placements(fdp, getattr(mesh, "ndim", 1))
    got = value_of(dtorch.distribute_tensor(a, mesh, pls))
    want = np.asarray(a)
    if got.shape != want.shape or not (got == want).all():
        raise fuzzlib.Finding(f"distribute_tensor of {want.dtype} {want.shape} gives {got.dtype} {got.ravel()[:8]}, "
                              f"not {want.ravel()[:8]}")


def call_from_local(fdp):
    mesh = fdp.PickValueInList(MESHES[:3])
    n = mesh.size()
    dim = fdp.ConsumeIntInRange(0, 2)
    k = fdp.ConsumeIntInRange(0, 5)
    if k < 3:   # shards of a real value, maybe uneven
        base = [fdp.ConsumeIntInRange(0, 3) for _ in range(fdp.ConsumeIntInRange(1, 3))]
        dim = min(dim, len(base) - 1)
        pieces = []
        for i in range(n):
            s = list(base)
            s[dim] = fdp.ConsumeIntInRange(0, 3) if k == 2 else base[dim]
            pieces.append((np.arange(math.prod(s)) + 10 * i).astype(np.float32).reshape(s))
        local = pieces
    else:
        local = [odd_array(fdp) for _ in range(fdp.ConsumeIntInRange(0, n + 1))] if k == 3 else odd_array(fdp)
        pieces = None
    pls = [dtorch.Shard(dim)] if fdp.ConsumeIntInRange(0, 3) else placements(fdp, 1)
    shape = None
    if fdp.ConsumeIntInRange(0, 2) == 0:
        shape = [odd_int(fdp) for _ in range(fdp.ConsumeIntInRange(0, 4))] if fdp.ConsumeBool() else odd_value(fdp)
        if isinstance(shape, (list, tuple)) and too_big(shape):
            return
    x = dtorch.from_local(local, mesh, pls, shape=shape)
    got = value_of(x)
    if pieces is not None and pls == [dtorch.Shard(dim)]:
        want = np.concatenate(pieces, axis=dim)
        if got.shape != want.shape or not (got == want).all():
            raise fuzzlib.Finding(f"from_local of {[p.shape for p in pieces]} on Shard({dim}) with shape {shape} "
                                  f"gives {got.shape}, not {want.shape}")


CALLS = [call_factory, call_arange, call_mesh, call_index, call_view, call_redistribute, call_distribute,
         call_from_local]


def _alive():
    x = dtorch.arange(6, device_mesh=MESHES[1], placements=[dtorch.Shard(0)])
    got = value_of(x.reshape(2, 3) + 1)
    if not (got == np.arange(1, 7).reshape(2, 3)).all():
        raise fuzzlib.Finding(f"after the input, the runtime computes {got}")


def test_one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        if not fdp.remaining_bytes():
            break   # no more choices: every later one would read as the first of each list
        call = fdp.PickValueInList(CALLS)
        try:
            call(fdp)
            fuzzlib.tally(call.__name__[5:] + " ok")
        except (fuzzlib.Finding, SystemError):
            raise
        except (Hostile, *KINDS) as e:
            fuzzlib.tally(f"{call.__name__[5:]} {type(e).__name__}")
        except KeyError as e:
            if call is not call_mesh:
                raise fuzzlib.Finding(f"{call.__name__}: KeyError {e}") from e
        except Exception as e:   # noqa: BLE001: anything else is a finding
            raise fuzzlib.Finding(f"{call.__name__}: {type(e).__name__}: {e}") from e
    _alive()


if __name__ == "__main__":
    faulthandler.enable()
    dtorch.init(workers="thread")
    fuzzlib.at_exit(dtorch.shutdown)
    MESHES.extend(_meshes())
    # -use_cmp=0: the runtime's Python code compares values that differ from run to run (a
    # comparison's operands go into the fuzzer's table of words to try), so that one run's inputs
    # would drift from the next's after a few thousand
    fuzzlib.main(test_one_input, [bytes(range(i, i + 48)) for i in range(0, 200, 8)], flags=["-use_cmp=0"])
