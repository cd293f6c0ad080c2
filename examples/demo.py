"""The main demo: the seed example, then placements, pieces and futures on a few meshes."""
import asyncio

import numpy as np

import dtorch
from dtorch import Partial, Replicate, Shard

# The seed example: a 4x3 random tensor split by rows over two CPU devices.
mesh = dtorch.DeviceMesh("cpu", [0, 1])
x = dtorch.rand((4, 3), device_mesh=mesh, placements=[dtorch.Shard(0)])
print(f"{x=}")

# Counter-based random numbers: the same seed gives the same tensor whatever the layout.
dtorch.manual_seed(0)
a = dtorch.rand(6, 4, device_mesh=mesh, placements=[Shard(1)])
grid = dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
dtorch.manual_seed(0)
b = dtorch.rand(6, 4, device_mesh=grid, placements=[Shard(0), Replicate()])
print("same values on [0, 1] with Shard(1) and on 2x2 with (Shard(0), Replicate()):",
      np.array_equal(a.numpy(), b.numpy()))

# torch.chunk layout: 5 rows over 4 devices give 2, 2, 1, 0 rows.
four = dtorch.DeviceMesh("cpu", [0, 1, 2, 3])
r = dtorch.arange(10, device_mesh=four, placements=[Shard(0)]).to_local()
print("arange(10) over 4 devices, pieces:", [p.tolist() for p in r])
rows = dtorch.ones(5, 2, device_mesh=four, placements=[Shard(0)])
print("5 rows over 4 devices, local shapes:", [p.shape for p in rows.to_local()])

# A numpy array laid out on a 2-D mesh: rows over 'dp', columns over 'tp'.
w = np.arange(24, dtype=np.float32).reshape(4, 6)
dw = dtorch.distribute_tensor(w, grid, [Shard(0), Shard(1)])
print(f"{dw.shape=} {dw.placements=}")
print("piece on device 3:\n", dw.to_local()[3])

# Partial: each device holds a contribution; the value is their sum.
p = dtorch.from_local([np.full(3, i + 1.0, dtype=np.float32) for i in range(2)], mesh, [Partial("sum")])
print("Partial(sum) of [1,1,1] and [2,2,2]:", p.numpy())

# Ops run where the pieces are: a row-sharded input through a replicated layer needs no traffic.
F = dtorch.nn.functional
xs = dtorch.randn(6, 8, device_mesh=four, placements=[Shard(0)])
w1 = dtorch.randn(16, 8, device_mesh=four)
logits = F.linear(xs, w1)
probs = F.softmax(logits, dim=-1)
print(f"{logits.placements=} {probs.placements=}")
ref = xs.numpy() @ w1.numpy().T
ref = np.exp(ref - ref.max(-1, keepdims=True)); ref /= ref.sum(-1, keepdims=True)
print("softmax(linear(x)) matches numpy:", np.allclose(probs.numpy(), ref, rtol=1e-5, atol=1e-6))

# Redistribute: gather the rows everywhere, or move the tensor to another group of devices.
gathered = probs.redistribute(placements=[Replicate()])
elsewhere = probs.redistribute(dtorch.DeviceMesh("cpu", [10, 11]), [Shard(1)])
print(f"{gathered.placements=} {elsewhere.device_mesh=} {elsewhere.placements=}")
print("plan of Shard(0) -> Replicate():", dtorch.redistribute_plan(probs, placements=[Replicate()]))

# Futures: values arrive asynchronously; await them from asyncio.
async def main():
    f1 = dtorch.full((2, 2), 7, device_mesh=mesh).future()
    f2 = dtorch.randn(3, device_mesh=mesh, placements=[Shard(0)]).future()
    v1, v2 = await asyncio.gather(f1, f2)
    print("awaited:", v1.tolist(), v2.shape)

asyncio.run(main())
dtorch.shutdown()
