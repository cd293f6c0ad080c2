"""dtorch.parallel against torch's documented behaviour of each style, with placements written out
by hand from torch.distributed.tensor.parallel's docs:

- ColwiseParallel, nn.Linear: weight Shard(0), bias Shard(0), input Replicate, output Shard(-1).
- RowwiseParallel, nn.Linear: weight Shard(1), bias Replicate, input Shard(-1), output Replicate
  (the Partial product all-reduced), or Shard(d) with output_layouts (a reduce-scatter).
- ColwiseParallel, nn.Embedding: weight Shard(1), output Shard(-1).
- RowwiseParallel, nn.Embedding: weight Shard(0), input Replicate, output Replicate (from Partial).
- SequenceParallel: parameters Replicate, input and output Shard(1).
- PrepareModuleInput / PrepareModuleOutput: inputs / outputs redistributed to the desired layouts.
On a (dp, tp) mesh with mesh["tp"], tensors live on the whole mesh: Replicate on dp for parameters,
activations keep their dp placement. Values are checked against numpy every time.
"""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from conftest import mesh_1d
from dtorch import Partial, Replicate, Shard
from dtorch.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, ReplicateHeadsParallel,
                             RowwiseParallel, SequenceParallel, parallelize_module)

R = Replicate()
rng = np.random.default_rng(3)


pytestmark = pytest.mark.usefixtures("thread_runtime")


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


def tp_mesh(n=2):
    return dtorch.init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))


def host(x):
    return rng.standard_normal(x).astype(np.float32)


@pytest.mark.parametrize("n", [2, 3])
def test_colwise_linear(n):
    mesh = tp_mesh(n)
    lin = nn.Linear(8, 7, device_mesh=mesh)   # 7 outputs: uneven over 2 and 3
    w, b = lin.weight.numpy(), lin.bias.numpy()
    assert parallelize_module(lin, mesh, ColwiseParallel()) is lin
    assert lin.weight.placements == (Shard(0),) and lin.bias.placements == (Shard(0),)
    x = host((2, 3, 8))
    y = lin(x)                                  # a host array is the whole input: distributed Replicate
    assert y.placements == (Shard(2),) and y.shape == (2, 3, 7)
    close(y.numpy(), x @ w.T + b)
    y = lin(dtorch.distribute_tensor(x, mesh, [Shard(1)]))   # other input layouts are redistributed
    assert y.placements == (Shard(2),)
    lin2 = nn.Linear(8, 7, device_mesh=mesh)
    parallelize_module(lin2, mesh, ColwiseParallel(output_layouts=Replicate()))
    assert lin2(x).placements == (R,)


def test_rowwise_linear():
    mesh = tp_mesh(2)
    lin = nn.Linear(8, 5, device_mesh=mesh)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    parallelize_module(lin, mesh, RowwiseParallel())
    assert lin.weight.placements == (Shard(1),) and lin.bias.placements == (R,)
    x = host((3, 8))
    dx = dtorch.distribute_tensor(x, mesh)
    seen = []
    lin.register_forward_pre_hook(lambda m, args: seen.append(args[0].placements))
    y = lin(dx)
    assert seen == [(Shard(1),)]                 # the input was laid out Shard(-1)
    assert y.placements == (R,)
    close(y.numpy(), x @ w.T + b)
    scatter = nn.Linear(8, 4, device_mesh=mesh)
    w2, b2 = scatter.weight.numpy(), scatter.bias.numpy()
    parallelize_module(scatter, mesh, RowwiseParallel(output_layouts=Shard(0)))
    y = scatter(dx)
    assert y.placements == (Shard(0),)
    close(y.numpy(), x @ w2.T + b2)


def test_embeddings():
    mesh = tp_mesh(2)
    ids = rng.integers(0, 9, (2, 5))
    col, row = nn.Embedding(9, 6, device_mesh=mesh), nn.Embedding(9, 6, device_mesh=mesh)
    wc, wr = col.weight.numpy(), row.weight.numpy()
    parallelize_module(col, mesh, ColwiseParallel())
    parallelize_module(row, mesh, RowwiseParallel())
    assert col.weight.placements == (Shard(1),) and row.weight.placements == (Shard(0),)
    assert [p.shape for p in row.weight.to_local()] == [(5, 6), (4, 6)]
    yc, yr = col(ids), row(ids)
    assert yc.placements == (Shard(2),) and yr.placements == (R,)
    close(yc.numpy(), wc[ids])
    close(yr.numpy(), wr[ids])
    raw = nn.Embedding(9, 6, device_mesh=mesh)
    wraw = raw.weight.numpy()
    parallelize_module(raw, mesh, RowwiseParallel(output_layouts=Shard(1)))
    assert raw(ids).placements == (Shard(1),)
    close(raw(ids).numpy(), wraw[ids])


def test_megatron_mlp_on_dp_tp_mesh():
    mesh = dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mlp = nn.Sequential(nn.Linear(6, 10, device_mesh=mesh), nn.ReLU(), nn.Linear(10, 6, device_mesh=mesh))
    w1, b1, w2, b2 = (t.numpy() for t in (mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias))
    parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert mlp[0].weight.placements == (R, Shard(0)) and mlp[0].weight.device_mesh == mesh
    assert mlp[2].weight.placements == (R, Shard(1)) and mlp[2].bias.placements == (R, R)
    x = host((5, 6))                               # 5 rows: uneven over dp
    y = mlp(dtorch.distribute_tensor(x, mesh, [Shard(0), R]))
    assert y.placements == (Shard(0), R)           # the batch stays split on dp
    close(y.numpy(), np.maximum(x @ w1.T + b1, 0) @ w2.T + b2)


def test_plan_paths_with_wildcards():
    mesh = tp_mesh(2)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(4, 8, device_mesh=mesh)
            self.down = nn.Linear(8, 4, device_mesh=mesh)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block(), Block()])

    m = Model()
    parallelize_module(m, mesh, {"layers.*.up": ColwiseParallel(), "layers.[02].down": RowwiseParallel()})
    assert all(b.up.weight.placements == (Shard(0),) for b in m.layers)
    assert [b.down.weight.placements for b in m.layers] == [(Shard(1),), (R,), (Shard(1),)]
    with pytest.raises(ValueError, match="'layers.*.nothing'"):
        parallelize_module(m, mesh, {"layers.*.nothing": ColwiseParallel()})
    with pytest.raises(NotImplementedError, match="nn.Linear and nn.Embedding"):
        parallelize_module(nn.RMSNorm(4, device_mesh=mesh), mesh, ColwiseParallel())
    with pytest.raises(ValueError, match="1D DeviceMesh"):
        parallelize_module(nn.Linear(2, 2), dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b")),
                           ColwiseParallel())
    with pytest.raises(TypeError):
        parallelize_module(m, mesh, ["layers.0.up"])
    with pytest.warns(UserWarning, match="No parallelize_plan"):
        parallelize_module(m, mesh)


def test_sequence_parallel():
    mesh = tp_mesh(2)
    norm = nn.RMSNorm(4, device_mesh=mesh)
    parallelize_module(norm, mesh, SequenceParallel())
    assert norm.weight.placements == (R,)
    x = host((2, 6, 4))
    y = norm(x)
    assert y.placements == (Shard(1),)
    close(y.numpy(), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6))
    y = norm(dtorch.distribute_tensor(x, mesh, [Shard(0)]))
    assert y.placements == (Shard(1),)


def test_prepare_module_input_and_output():
    mesh = tp_mesh(2)

    class Two(nn.Module):
        def forward(self, a, b, scale=None):
            self.seen = (a.placements, b if b is None else b.placements, scale.placements)
            return a + 1, a * 2

    m = Two()
    parallelize_module(m, mesh, PrepareModuleInput(input_layouts=(R, None), desired_input_layouts=(Shard(0), None),
                                                   input_kwarg_layouts={"scale": R},
                                                   desired_input_kwarg_layouts={"scale": Shard(1)}))
    parallelize_module(m, mesh, PrepareModuleOutput(output_layouts=(Shard(0), Shard(0)),
                                                    desired_output_layouts=(R, Shard(1))))
    a = host((4, 4))
    x, y = m(a, None, scale=host((4, 4)))
    assert m.seen == ((Shard(0),), None, (Shard(1),))
    assert x.placements == (R,) and y.placements == (Shard(1),)
    close(x.numpy(), a + 1)
    close(y.numpy(), a * 2)
    with pytest.raises(ValueError, match="same length"):
        m(a)
    with pytest.raises(ValueError, match="same length"):
        PrepareModuleInput(input_layouts=(R,), desired_input_layouts=(R, R))
    with pytest.raises(ValueError, match="same length"):
        PrepareModuleOutput(output_layouts=(R,), desired_output_layouts=(R, R))


def test_partial_outputs_reduce_and_cross_mesh_inputs():
    mesh = tp_mesh(2)
    lin = nn.Linear(4, 4, bias=False, device_mesh=mesh)
    w = lin.weight.numpy()
    parallelize_module(lin, mesh, RowwiseParallel(output_layouts=Replicate()))
    x = host((2, 4))
    parts = [x / 2, x / 2]
    y = lin(dtorch.from_local(parts, mesh, [Partial()]))
    close(y.numpy(), x @ w.T)
    elsewhere = dtorch.distribute_tensor(x, mesh_1d(1))   # another mesh: moved onto the style's mesh
    close(lin(elsewhere).numpy(), x @ w.T)


@pytest.mark.parametrize("n", [2, 4])
def test_replicate_heads(n):
    mesh = tp_mesh(n)
    heads, head_dim = 2 if n == 4 else 1, 3
    lin = nn.Linear(5, heads * head_dim, device_mesh=mesh)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    parallelize_module(lin, mesh, ReplicateHeadsParallel(heads, head_dim))
    assert lin.weight.placements == (R,)
    x = host((2, 5))
    y = lin(x)
    assert y.placements == (Shard(1),) and y.shape == (2, n * head_dim)
    want = np.repeat((x @ w.T + b).reshape(2, heads, head_dim), n // heads, axis=1).reshape(2, -1)
    close(y.numpy(), want)
    assert [p.shape for p in y.to_local()] == [(2, head_dim)] * n
    with pytest.raises(ValueError, match="multiple"):
        parallelize_module(nn.Linear(5, 9, device_mesh=tp_mesh(2)), tp_mesh(2), ReplicateHeadsParallel(3, 3))


def test_process_workers_colwise_rowwise(process_mode):
    mesh = tp_mesh(2)
    mlp = nn.Sequential(nn.Linear(6, 10, device_mesh=mesh), nn.Linear(10, 6, device_mesh=mesh))
    w1, b1, w2, b2 = (t.numpy() for t in (mlp[0].weight, mlp[0].bias, mlp[1].weight, mlp[1].bias))
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    x = host((3, 6))
    close(mlp(x).numpy(), (x @ w1.T + b1) @ w2.T + b2)
