"""dtorch.memory_stats: each device's bytes in use, at peak and kept by its memory pool, against the
sizes of the pieces a test makes and frees (hand-computed)."""
import gc

import numpy as np
import pytest

import dtorch
from dtorch import Shard


def test_bytes_in_use_peak_and_pool(mode):
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    base = dtorch.memory_stats(mesh, reset_peak=True)
    assert [s["device"] for s in base] == [0, 1]
    assert all(set(s) == {"device", "bytes_in_use", "peak_bytes", "pooled_bytes"} for s in base)
    x = dtorch.zeros((1024, 1024), device_mesh=mesh, placements=[Shard(0)])    # 2 MiB on each device
    held = dtorch.memory_stats(mesh)
    for b, h in zip(base, held):
        assert h["bytes_in_use"] - b["bytes_in_use"] == 512 * 1024 * 4
        assert h["peak_bytes"] >= h["bytes_in_use"]
    del x
    gc.collect()
    after = dtorch.memory_stats(mesh)
    for b, h, a in zip(base, held, after):
        assert a["bytes_in_use"] == b["bytes_in_use"]
        assert a["peak_bytes"] == h["peak_bytes"]                      # the peak stays until a reset
        if mode == "thread":
            assert a["pooled_bytes"] >= 512 * 1024 * 4                  # the freed 2 MiB kept for reuse
        assert a["pooled_bytes"] >= 0
    again = dtorch.memory_stats(mesh, reset_peak=True)
    assert dtorch.memory_stats(mesh)[0]["peak_bytes"] == again[0]["bytes_in_use"]


def test_memory_stats_needs_a_mesh(mode):
    with pytest.raises(TypeError):
        dtorch.memory_stats([0, 1])


def test_generation_draws_a_bar_when_asked(mode, capfd):
    import llama_reference as ref
    from dtorch.models import LlamaConfig, LlamaForCausalLM
    cfg = ref.tiny_config()
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    model.load_state_dict(ref.random_weights(cfg, 0))
    quiet = model.generate(np.array([[1, 2, 3]]), max_new_tokens=4, progress=False)
    assert capfd.readouterr().err == ""
    shown = model.generate(np.array([[1, 2, 3]]), max_new_tokens=4, progress=True)
    err = capfd.readouterr().err
    assert "Generating" in err and ("4/4" in err)
    np.testing.assert_array_equal(quiet, shown)


def test_redistribute_many_waits_with_a_bar_when_asked(mode, capfd):
    src, dst = dtorch.DeviceMesh("cpu", [0, 1]), dtorch.DeviceMesh("cpu", [2, 3, 4])
    arrays = [np.arange(n * 6, dtype=np.float32).reshape(n, 6) for n in (4, 7, 9)]
    tensors = [dtorch.distribute_tensor(a, src, [Shard(0)]) for a in arrays]
    moved = dtorch.redistribute_many(tensors, dst, [Shard(1)], progress=True)
    err = capfd.readouterr().err
    assert "Moving tensors" in err and "3/3" in err
    for a, t in zip(arrays, moved):
        assert t.device_mesh == dst and t.placements == (Shard(1),)
        np.testing.assert_array_equal(t.numpy(), a)
    quiet = dtorch.redistribute_many(tensors, dst, [Shard(0)])
    assert capfd.readouterr().err == ""
    np.testing.assert_array_equal(quiet[2].numpy(), arrays[2])
