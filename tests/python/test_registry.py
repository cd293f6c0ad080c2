"""The Python face of the op registry: the elementwise ops come from it (dtorch.<name>,
DTensor.<name>, nn.functional.<name>), each registered op answers to its id, methods are
defined on the DTensor type, `@` is the C slot, and requires_grad=True is refused."""
import gc
import inspect

import numpy as np
import pytest

import dtorch
from conftest import mesh_1d
from dtorch import Shard

FN, METHOD, NN = 1, 2, 4


def test_rows_are_exported_where_they_say():
    rows = dtorch._C._registry()
    ids = [row[1] for row in rows]
    assert len(set(ids)) == len(ids), "ids are unique"
    assert len({row[0] for row in rows}) == len(rows), "names are unique"
    for name, op_id, nin, nout, sig, exports, floats, fn in rows:
        assert (fn is not None) == bool(exports), name
        if exports & FN:
            assert getattr(dtorch, name) is fn, name
        if exports & METHOD:
            assert dtorch._C.DTensor.__dict__[name] is fn, f"{name} is defined on the C type"
        if exports & NN:
            assert getattr(dtorch.nn.functional, name) is fn, name
        if fn is not None:
            assert fn.__name__ == name and fn.id == op_id
    assert dtorch.negative is dtorch.neg and dtorch.true_divide is dtorch.div
    for name in ("relu", "sigmoid", "silu", "tanh", "gelu", "linear", "softmax", "rms_norm"):
        assert callable(getattr(dtorch.nn.functional, name)), name


def test_signatures():
    assert str(inspect.signature(dtorch.add)) == "(input, other)"
    assert str(inspect.signature(dtorch.exp)) == "(input)"
    assert str(inspect.signature(dtorch.nn.functional.softplus)) == "(input, beta=1, threshold=20)"


def test_dtensor_is_the_c_type_and_python_adds_methods_without_shadowing_its_own():
    assert dtorch.DTensor is dtorch._C.DTensor, "an op returns the C type itself, not a subclass"
    written_in_python = vars(dtorch._tensor._DTensorMethods)
    for name in ("__matmul__", "__rmatmul__", "__getitem__", "exp", "add", "reshape", "view", "permute", "transpose",
                 "t"):
        assert name not in written_in_python, f"{name} is the C type's own, not set from Python"
    for name in ("sum", "flatten", "numpy", "__repr__", "__len__"):
        assert inspect.isfunction(vars(dtorch.DTensor)[name]), f"{name} is written in Python, set on the type"
    assert type(vars(dtorch.DTensor)["transpose"]).__name__ == "method_descriptor"
    assert type(vars(dtorch.DTensor)["reshape"]).__name__ == "method_descriptor"
    assert type(vars(dtorch.DTensor)["__matmul__"]).__name__ == "wrapper_descriptor"
    assert type(vars(dtorch.DTensor)["__getitem__"]).__name__ == "wrapper_descriptor"


def test_a_dtensor_is_not_tracked_by_the_cycle_collector(mode):
    x = dtorch.ones((2, 3), device_mesh=mesh_1d(2))
    for y in (x, x[0], x.t(), x + 1):
        assert type(y) is dtorch.DTensor and not gc.is_tracked(y)
    assert repr(x[1]).startswith("DTensor([1.0000, 1.0000, 1.0000]") and len(x) == 2


def test_calls_by_id_and_by_name(mode):
    mesh = mesh_1d(2)
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    by_name = dtorch._C._op("add", (x, x), None, None, None)
    by_id = dtorch._C._op(dtorch.add.id, (x, x), None, None, None)
    assert np.array_equal(by_name.numpy(), by_id.numpy()) and np.array_equal(by_id.numpy(), a + a)
    assert np.array_equal(x.add(1).numpy(), a + 1) and np.array_equal(dtorch.sub(1, x).numpy(), 1 - a)
    assert np.array_equal((x @ x.T).numpy(), a @ a.T) and np.array_equal(x.T.__rmatmul__(x).numpy(), a @ a.T)
    with pytest.raises(TypeError, match="expected a DTensor or a number"):
        dtorch.add(x, "one")
    with pytest.raises(TypeError, match="expected a DTensor"):
        dtorch.exp(a)
    with pytest.raises(TypeError, match="unexpected keyword"):
        dtorch.exp(x, alpha=2)
    with pytest.raises(TypeError):
        x @ a


def test_requires_grad_is_refused(mode):
    mesh = mesh_1d(2)
    for make in (lambda: dtorch.zeros(3, device_mesh=mesh, requires_grad=True),
                 lambda: dtorch.ones(3, device_mesh=mesh, requires_grad=True),
                 lambda: dtorch.empty(3, device_mesh=mesh, requires_grad=True),
                 lambda: dtorch.rand(3, device_mesh=mesh, requires_grad=True),
                 lambda: dtorch.randn(3, device_mesh=mesh, requires_grad=True),
                 lambda: dtorch.full((3,), 1.0, device_mesh=mesh, requires_grad=True),
                 lambda: dtorch.arange(3, device_mesh=mesh, requires_grad=True)):
        with pytest.raises(NotImplementedError, match="DTorch is inference-only: requires_grad=True is not supported"):
            make()

    class NeedsGrad:
        requires_grad = True

        def __array__(self, dtype=None, copy=None):
            return np.ones(4, np.float32)

    with pytest.raises(NotImplementedError, match="inference-only"):
        dtorch.distribute_tensor(NeedsGrad(), mesh)
    with pytest.raises(NotImplementedError, match="inference-only"):
        dtorch.from_local([NeedsGrad(), NeedsGrad()], mesh, [Shard(0)])
    x = dtorch.zeros(3, device_mesh=mesh, requires_grad=False)
    assert x.requires_grad is False and x.sum().item() == 0


def test_default_dtypes_come_from_c(mode):
    mesh = mesh_1d(2)
    assert dtorch.full((2,), True, device_mesh=mesh).dtype == dtorch.bool
    assert dtorch.full((2,), np.bool_(True), device_mesh=mesh).dtype == dtorch.bool
    assert dtorch.full((2,), 3, device_mesh=mesh).dtype == dtorch.int64
    assert dtorch.full((2,), np.int32(3), device_mesh=mesh).dtype == dtorch.int64
    assert dtorch.full((2,), 0.5, device_mesh=mesh).dtype == dtorch.float32
    assert dtorch.full(2, 0.5, device_mesh=mesh, dtype=dtorch.float16).dtype == dtorch.float16
    assert dtorch.arange(4, device_mesh=mesh).dtype == dtorch.int64
    assert dtorch.arange(True, 4, device_mesh=mesh).dtype == dtorch.int64
    assert dtorch.arange(0, 2, 0.5, device_mesh=mesh).dtype == dtorch.float32
    assert dtorch.arange(0, 2, 0.5, device_mesh=mesh).tolist() == [0.0, 0.5, 1.0, 1.5]


def test_split_gathers_a_sharded_dim_once(mode):
    mesh = mesh_1d(2)
    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    pieces = x.split(2)
    assert all(p.placements == (dtorch.Replicate(),) for p in pieces), "the split dim was made Replicate first"
    assert [p.tolist() for p in pieces] == [q.tolist() for q in np.split(a, 3)]
    kept = x.split(2, dim=1)
    assert all(p.placements == (Shard(0),) for p in kept), "cutting another dim keeps the shard"
    assert x.split([6])[0].placements == (Shard(0),), "one piece: nothing to gather"
    assert [p.tolist() for p in x.unbind(1)] == [list(c) for c in a.T]
    assert dtorch.zeros(0, 3, device_mesh=mesh).split([]) == ()
