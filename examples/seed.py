import dtorch

mesh = dtorch.DeviceMesh("cpu", [0, 1])
x = dtorch.rand((4, 3), device_mesh=mesh, placements=[dtorch.Shard(0)])
print(f"{x=}")
