"""dtorch.profiler: every device's timeline as Chrome trace-event JSON. The ops of a block, and only
they, show on the devices that ran them, in the order they ran, inside the block's time; the
controller's batches show too."""
import json
import time

import numpy as np
import pytest

import dtorch
from dtorch import Replicate, Shard


def test_the_trace_holds_each_devices_ops_in_order(mode, tmp_path):
    m, other = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3])
    a = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) / 100
    x = dtorch.distribute_tensor(a, m, [Shard(0)])
    y = dtorch.ones((8,), device_mesh=other, placements=[Shard(0)])
    before = (x.exp() * 3).numpy()                  # before the block: not in the trace
    t_enter = time.monotonic_ns()
    with dtorch.profiler.profile(m, other) as prof:
        z = (x @ x.T).redistribute(m, [Replicate()]) + 1
        got, doubled = z.numpy(), (y * 2).numpy()
    t_exit = time.monotonic_ns()
    np.testing.assert_allclose(got, a @ a.T + 1, rtol=1e-5)
    np.testing.assert_allclose(before, np.exp(a) * 3, rtol=1e-6)
    events = prof.events()
    by_device = {d: [e for e in events if e["device"] == d] for d in range(4)}
    for d in (0, 1):
        names = [e["name"] for e in by_device[d]]
        mm, add = names.index("matmul"), names.index("add")
        # x.T is gathered for the matmul, its product gathered after it, then the add runs
        assert "assemble" in names[:mm] and "assemble" in names[mm:add] and "send" in names[mm:add], names
        assert mm < add
        assert "exp" not in names and "mul" not in names
    for d in (2, 3):
        assert "mul" in [e["name"] for e in by_device[d]] and "matmul" not in [e["name"] for e in by_device[d]]
    for d, evs in by_device.items():
        for e in evs:
            assert t_enter <= e["begin_ns"] <= e["end_ns"] <= t_exit
        for e, f in zip(evs, evs[1:]):
            assert e["end_ns"] <= f["begin_ns"], (d, e, f)        # a device runs its records one by one
    host = prof.controller_events()
    assert {h["device"] for h in host} >= {0, 1, 2, 3} and all(h["records"] > 0 for h in host)

    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    with open(path) as f:
        trace = json.load(f)
    assert trace["displayTimeUnit"] == "ms"
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(events)
    for e in complete:
        assert set(e) >= {"name", "cat", "pid", "tid", "ts", "dur", "args"} and e["dur"] >= 0 and e["ts"] >= 0
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"controller", "device 0", "device 1", "device 2", "device 3"}
    assert {e["cat"] for e in complete} >= {"kernel", "transfer"}
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert len(instants) == len(host) and all(e["pid"] == 0 for e in instants)


def test_a_replay_and_the_ops_inside_it_show(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.ones((4,), device_mesh=mesh, placements=[Shard(0)])

    @dtorch.capture
    def f(v):
        return (v * 2 + 1).exp()

    f(x)
    with dtorch.profiler.profile(mesh) as prof:
        np.testing.assert_allclose(f(x).numpy(), np.exp(np.full(4, 3.0)), rtol=1e-6)
    names = [e["name"] for e in prof.events() if e["device"] == 0]
    replay = [e for e in prof.events() if e["device"] == 0 and e["name"] == "replay"]
    assert len(replay) == 1 and {"mul", "add", "exp"} <= set(names)
    inside = [e for e in prof.events() if e["device"] == 0 and e["name"] in ("mul", "add", "exp")]
    assert all(replay[0]["begin_ns"] <= e["begin_ns"] <= e["end_ns"] <= replay[0]["end_ns"] for e in inside)


def test_profiling_nothing_is_an_error(mode):
    with pytest.raises(RuntimeError, match="no device to profile"):
        with dtorch.profiler.profile():
            pass


def test_the_default_takes_devices_still_starting(mode):
    """Without devices named, the block traces every device a mesh has started, the ones whose
    workers are still starting too (a process worker takes a while): ops issued before the block and
    inside it, nothing fetched before it, show on both devices."""
    mesh = dtorch.DeviceMesh("cpu", [7, 8])
    x = dtorch.ones((6,), device_mesh=mesh, placements=[Shard(0)])
    with dtorch.profiler.profile() as prof:
        np.testing.assert_allclose((x * 5).numpy(), np.full(6, 5.0))
    assert sorted({e["device"] for e in prof.events() if e["name"] == "mul"}) == [7, 8]


def test_each_device_is_traced_on_a_mesh_of_its_own_type(mode):
    """The trace reaches a device on a mesh of the type a mesh gave it; a device no mesh has named
    is traced as cpu."""
    x = dtorch.ones((4,), device_mesh=dtorch.DeviceMesh("cpu", [5, 6]))
    assert dtorch._C._device_type(5) == "cpu" and dtorch._C._device_type(6) == "cpu"
    assert dtorch._C._device_type(40) is None
    with dtorch.profiler.profile(5, 6) as prof:
        (x + 1).numpy()
    assert sorted({e["device"] for e in prof.events() if e["name"] == "add"}) == [5, 6]
