"""dtorch.nn: Module's torch surface (registration, walking, state_dict / load_state_dict, hooks,
to, eval/train, repr), the layers against numpy, the containers, meta_device, and
DeviceMesh.__getitem__ / submeshes."""
import collections
import math

import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from conftest import mesh_1d
from dtorch import Replicate, Shard


pytestmark = pytest.mark.usefixtures("thread_runtime")


rng = np.random.default_rng(7)


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


class Block(nn.Module):
    def __init__(self, mesh=None):
        super().__init__()
        self.fc = nn.Linear(4, 3, device_mesh=mesh)
        self.norm = nn.RMSNorm(3, device_mesh=mesh)
        self.register_buffer("scale", dtorch.ones(3, device_mesh=mesh or nn.module.default_mesh()))
        self.register_buffer("tmp", dtorch.zeros(3, device_mesh=mesh or nn.module.default_mesh()), persistent=False)

    def forward(self, x):
        return self.norm(self.fc(x)) * self.scale


class Net(nn.Module):
    def __init__(self, mesh=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(mesh), Block(mesh)])
        self.head = nn.Linear(3, 2, bias=False, device_mesh=mesh)

    def forward(self, x):
        for b in self.blocks:
            x = b(nn.functional.linear(x, dtorch.ones(4, 3, device_mesh=x.device_mesh)) if x.shape[-1] == 3 else x)
        return self.head(x)


# ---- registration and walking ------------------------------------------------------------------

def test_names_like_torch():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == [
        "blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.0.norm.weight",
        "blocks.1.fc.weight", "blocks.1.fc.bias", "blocks.1.norm.weight", "head.weight"]
    assert [n for n, _ in net.named_buffers()] == ["blocks.0.scale", "blocks.0.tmp", "blocks.1.scale", "blocks.1.tmp"]
    # torch's order: a module's own parameters and buffers, then its children's
    assert list(net.state_dict()) == [
        "blocks.0.scale", "blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.0.norm.weight",
        "blocks.1.scale", "blocks.1.fc.weight", "blocks.1.fc.bias", "blocks.1.norm.weight", "head.weight"]
    assert [n for n, _ in net.named_modules()] == ["", "blocks", "blocks.0", "blocks.0.fc", "blocks.0.norm",
                                                   "blocks.1", "blocks.1.fc", "blocks.1.norm", "head"]
    assert [n for n, _ in net.named_children()] == ["blocks", "head"]
    assert list(net.children()) == [net.blocks, net.head]
    assert len(list(net.parameters())) == 7 and len(list(net.buffers())) == 4
    assert all(isinstance(p, dtorch.DTensor) for p in net.parameters())
    assert net.get_submodule("blocks.1.fc") is net.blocks[1].fc
    assert [n for n, _ in net.blocks[0].named_parameters(prefix="x", recurse=False)] == []
    assert [n for n, _ in net.blocks[0].fc.named_parameters(prefix="x")] == ["x.weight", "x.bias"]


def test_setattr_registers_like_torch():
    m = nn.Module()
    m.w = dtorch.zeros(2, device_mesh=nn.module.default_mesh())
    m.child = nn.Identity()
    m.plain = 3
    assert list(m._parameters) == ["w"] and list(m._modules) == ["child"] and m.plain == 3
    m.w = None
    assert m.w is None and "w" in m._parameters and list(m.named_parameters()) == []
    with pytest.raises(TypeError, match="parameter 'w'"):
        m.w = 5
    with pytest.raises(TypeError, match="child module 'child'"):
        m.child = 5
    m.register_buffer("b", None)
    with pytest.raises(TypeError, match="buffer 'b'"):
        m.b = 1.0
    with pytest.raises(KeyError, match="already exists"):
        m.register_parameter("plain", None)
    with pytest.raises(KeyError):
        m.register_buffer("a.b", None)
    m.register_module("other", nn.ReLU())
    assert m.other is m._modules["other"]
    del m.other
    assert "other" not in m._modules and not hasattr(m, "other")

    class Early(nn.Module):
        def __init__(self):
            self.w = dtorch.zeros(2, device_mesh=nn.module.default_mesh())

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Early()


def test_shared_parameters_are_listed_once_and_stay_shared():
    a, b = nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False)
    m = nn.Sequential(a, b)
    b.weight = a.weight
    assert [n for n, _ in m.named_parameters()] == ["0.weight"]
    assert list(m.state_dict()) == ["0.weight", "1.weight"]
    w = rng.standard_normal((3, 3)).astype(np.float32)
    m.load_state_dict({"0.weight": w, "1.weight": w})
    assert m[0].weight is m[1].weight
    m.to(dtorch.float16)
    assert m[0].weight is m[1].weight and m[0].weight.dtype == dtorch.float16


# ---- state dicts -------------------------------------------------------------------------------

class FromDLPack:
    """Exposes only DLPack (no __array__, no buffer protocol)."""

    def __init__(self, array):
        self._a = array

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_load_state_dict_value_kinds_and_layout_kept():
    mesh = mesh_1d(2)
    lin = nn.Linear(4, 6, device_mesh=mesh)
    lin.weight = lin.weight.redistribute(mesh, [Shard(0)])
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    for wv, bv in ((w, b), (memoryview(w), FromDLPack(b)), (w.astype(np.float64), b.tolist()),
                   (dtorch.distribute_tensor(w, mesh_1d(3), [Shard(1)]), dtorch.distribute_tensor(b, mesh_1d(1)))):
        result = lin.load_state_dict({"weight": wv, "bias": bv})
        assert result.missing_keys == [] and result.unexpected_keys == []
        assert lin.weight.placements == (Shard(0),) and lin.weight.device_mesh == mesh
        assert lin.bias.placements == (Replicate(),) and lin.weight.dtype == dtorch.float32
        close(lin.weight.numpy(), w)
        close(lin.bias.numpy(), b)
        assert [p.shape for p in lin.weight.to_local()] == [(3, 4), (3, 4)]
    half = nn.Linear(4, 6, dtype=dtorch.bfloat16)
    half.load_state_dict({"weight": w, "bias": b})
    assert half.weight.dtype == dtorch.bfloat16
    close(half.weight.numpy(), w, tol=1e-2)


def test_load_state_dict_errors_like_torch():
    lin = nn.Linear(4, 6)
    w, b = np.zeros((6, 4), np.float32), np.zeros(6, np.float32)
    with pytest.raises(RuntimeError) as e:
        lin.load_state_dict({"weight": w})
    assert str(e.value) == 'Error(s) in loading state_dict for Linear:\n\tMissing key(s) in state_dict: "bias". '
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "extra"'):
        lin.load_state_dict({"weight": w, "bias": b, "extra": b})
    result = lin.load_state_dict({"weight": w, "extra": b}, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["extra"]
    assert isinstance(result, tuple) and result == (["bias"], ["extra"])
    with pytest.raises(RuntimeError, match="size mismatch for weight: copying a param with shape \\(4, 6\\) from "
                                           "checkpoint, the shape in current model is \\(6, 4\\)"):
        lin.load_state_dict({"weight": w.T, "bias": b}, strict=False)
    with pytest.raises(TypeError):
        lin.load_state_dict([("weight", w)])
    assert repr(lin.load_state_dict({"weight": w, "bias": b})) == "<All keys matched successfully>"


def test_state_dict_round_trip_and_non_persistent_buffers():
    a, b = Net(), Net()
    sd = {k: v.numpy() for k, v in a.state_dict().items()}
    assert "blocks.0.tmp" not in sd
    b.load_state_dict(sd)
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd[k])


# ---- calling, hooks, dtype, mode ----------------------------------------------------------------

def test_hooks():
    lin = nn.Linear(2, 2)
    calls = []
    h1 = lin.register_forward_pre_hook(lambda m, args: calls.append("pre") or (args[0] * 2,))
    h2 = lin.register_forward_hook(lambda m, args, out: calls.append("post") or out + 1)
    h3 = lin.register_forward_pre_hook(lambda m, args, kwargs: calls.append("first") or None, prepend=True,
                                       with_kwargs=True)
    x = dtorch.distribute_tensor(np.ones((1, 2), np.float32), nn.module.default_mesh())
    w, b = lin.weight.numpy(), lin.bias.numpy()
    close(lin(x).numpy(), (2 * np.ones((1, 2))) @ w.T + b + 1)
    assert calls == ["first", "pre", "post"]
    for h in (h1, h2, h3):
        h.remove()
    close(lin(x).numpy(), np.ones((1, 2)) @ w.T + b)


def test_to_eval_train():
    net = Net()
    assert net.to(dtorch.float16) is net
    assert all(p.dtype == dtorch.float16 for p in net.parameters())
    assert all(b.dtype == dtorch.float16 for b in net.buffers())
    net.bfloat16()
    assert all(p.dtype == dtorch.bfloat16 for p in net.parameters())
    with pytest.raises(TypeError):
        net.to(dtorch.int64)
    assert net.eval() is net and not net.training and not net.blocks[0].fc.training
    assert net.train(False) is net
    with pytest.raises(RuntimeError, match="inference only"):
        net.train()
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()()


def test_repr_like_torch():
    assert repr(nn.Linear(4, 3)) == "Linear(in_features=4, out_features=3, bias=True)"
    assert repr(nn.Embedding(10, 3)) == "Embedding(10, 3)"
    assert repr(nn.RMSNorm(3)) == "RMSNorm((3,), eps=1e-06, elementwise_affine=True)"
    assert repr(nn.LayerNorm(3)) == "LayerNorm((3,), eps=1e-05, elementwise_affine=True)"
    assert repr(nn.GELU("tanh")) == "GELU(approximate='tanh')"
    assert repr(nn.SiLU()) == "SiLU()"
    assert repr(nn.ModuleList()) == "ModuleList()"
    assert repr(Net()) == """Net(
  (blocks): ModuleList(
    (0-1): 2 x Block(
      (fc): Linear(in_features=4, out_features=3, bias=True)
      (norm): RMSNorm((3,), eps=1e-06, elementwise_affine=True)
    )
  )
  (head): Linear(in_features=3, out_features=2, bias=False)
)"""
    assert repr(nn.Sequential(nn.ReLU(), nn.Linear(2, 2), nn.ReLU())) == """Sequential(
  (0): ReLU()
  (1): Linear(in_features=2, out_features=2, bias=True)
  (2): ReLU()
)"""


# ---- layers against numpy ----------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2])
def test_layers_against_numpy(n):
    mesh = mesh_1d(n)
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    dx = dtorch.distribute_tensor(x, mesh, [Shard(0)])

    lin = nn.Linear(8, 6, device_mesh=mesh)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    bound = 1 / math.sqrt(8)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound and w.std() > bound / 4   # kaiming uniform
    close(lin(dx).numpy(), x @ w.T + b)
    close(nn.Linear(8, 6, bias=False, device_mesh=mesh)(dx).shape, (3, 5, 6))

    emb = nn.Embedding(11, 4, device_mesh=mesh)
    ids = rng.integers(0, 11, (3, 5))
    close(emb(dtorch.distribute_tensor(ids, mesh)).numpy(), emb.weight.numpy()[ids])

    rms = nn.RMSNorm(8, eps=1e-5, device_mesh=mesh)
    rw = rng.standard_normal(8).astype(np.float32)
    rms.load_state_dict({"weight": rw})
    close(rms(dx).numpy(), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * rw)
    np.testing.assert_array_equal(nn.RMSNorm(8, device_mesh=mesh).weight.numpy(), np.ones(8))

    ln = nn.LayerNorm(8, device_mesh=mesh)
    np.testing.assert_array_equal(ln.bias.numpy(), np.zeros(8))
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    close(ln(dx).numpy(), (x - mu) / np.sqrt(var + 1e-5))
    assert nn.LayerNorm(8, bias=False).bias is None and nn.LayerNorm(8, elementwise_affine=False).weight is None

    from math import erf
    close(nn.SiLU()(dx).numpy(), x / (1 + np.exp(-x)))
    close(nn.ReLU()(dx).numpy(), np.maximum(x, 0))
    close(nn.GELU()(dx).numpy(), 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2))))
    close(nn.GELU(approximate="tanh")(dx).numpy(),
          0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))))
    assert nn.Identity(3, foo=1)(dx) is dx
    with pytest.raises(ValueError):
        nn.GELU("fast")


def test_layer_dtype_and_mesh():
    mesh = mesh_1d(2)
    lin = nn.Linear(4, 4, dtype=dtorch.bfloat16, device_mesh=mesh)
    assert lin.weight.dtype == dtorch.bfloat16 and lin.weight.device_mesh == mesh
    assert lin.weight.placements == (Replicate(),)
    assert nn.Linear(4, 4).weight.device_mesh == dtorch.DeviceMesh("cpu", [0])


# ---- containers --------------------------------------------------------------------------------

def test_containers():
    layers = nn.ModuleList([nn.ReLU(), nn.SiLU()])
    layers.append(nn.Identity())
    layers.extend([nn.ReLU()])
    layers.insert(0, nn.SiLU())
    assert len(layers) == 5 and isinstance(layers[-1], nn.ReLU) and isinstance(layers[0], nn.SiLU)
    assert [type(m).__name__ for m in layers[1:3]] == ["ReLU", "SiLU"]
    del layers[0]
    assert list(layers._modules) == ["0", "1", "2", "3"]
    with pytest.raises(IndexError):
        layers[4]
    d = nn.ModuleDict({"a": nn.ReLU()})
    d["b"] = nn.Linear(2, 2)
    assert list(d) == ["a", "b"] and "b" in d and len(d) == 2
    assert [n for n, _ in d.named_parameters()] == ["b.weight", "b.bias"]
    assert isinstance(d.pop("a"), nn.ReLU) and list(d.keys()) == ["b"]
    seq = nn.Sequential(collections.OrderedDict(fc=nn.Linear(3, 2), act=nn.ReLU()))
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w, b = seq.fc.weight.numpy(), seq.fc.bias.numpy()
    close(seq(dtorch.distribute_tensor(x, nn.module.default_mesh())).numpy(), np.maximum(x @ w.T + b, 0))
    assert list(seq.state_dict()) == ["fc.weight", "fc.bias"] and len(seq) == 2 and seq[1] is seq.act


def test_meta_device():
    with nn.meta_device():
        lin = nn.Linear(4, 6, device_mesh=mesh_1d(2))
    assert isinstance(lin.weight, nn.MetaTensor) and lin.weight.shape == (6, 4)
    lin.weight = lin.weight.redistribute(mesh_1d(2), [Shard(0)])
    w, b = rng.standard_normal((6, 4)).astype(np.float32), np.zeros(6, np.float32)
    lin.load_state_dict({"weight": w, "bias": b})
    assert isinstance(lin.weight, dtorch.DTensor) and lin.weight.placements == (Shard(0),)
    close(lin.weight.numpy(), w)
    assert isinstance(nn.Linear(2, 2).weight, dtorch.DTensor)


# ---- DeviceMesh.__getitem__ --------------------------------------------------------------------

def test_mesh_getitem():
    mesh = dtorch.init_device_mesh("cpu", (2, 3), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    assert tp.tolist() == [0, 1, 2] and tp.mesh_dim_names == ("tp",)
    assert tp._get_root_mesh() is mesh and tp._root_dims == (1,)
    dp = mesh["dp"]
    assert dp.tolist() == [0, 3] and dp._root_dims == (0,)
    assert mesh["dp", "tp"] is mesh and mesh._get_root_mesh() is mesh
    assert [m.tolist() for m in mesh.submeshes("tp")] == [[0, 1, 2], [3, 4, 5]]
    assert [m.tolist() for m in mesh.submeshes("dp")] == [[0, 3], [1, 4], [2, 5]]
    cube = dtorch.init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    sub = cube["dp", "tp"]
    assert sub.tolist() == [[0, 1], [2, 3]] and sub["tp"]._get_root_mesh() is cube and sub["tp"]._root_dims == (2,)
    with pytest.raises(KeyError, match="Invalid mesh_dim_name 'ep'"):
        mesh["ep"]
    with pytest.raises(KeyError):
        mesh["tp", "dp"]
    with pytest.raises(RuntimeError, match="without mesh_dim_names"):
        mesh_1d(2)["tp"]
