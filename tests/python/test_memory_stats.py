"""dtorch.memory_stats: each device's bytes in use, at peak and kept by its memory pool, against the
sizes of the pieces a test makes and frees (hand-computed)."""
import gc

import numpy as np
import pytest

import dtorch
from dtorch import Replicate, Shard


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


def _in_use(mesh):
    return [s["bytes_in_use"] for s in dtorch.memory_stats(mesh)]


@pytest.mark.parametrize("mesh_ids", [[0], [0, 1], [0, 1, 2]])
def test_views_share_their_input_s_bytes_on_the_devices(mode, mesh_ids):
    """A reshape, a slice, a strided view (until an op reads it) hold no bytes of their own: device
    memory stays what the source took, the view keeps it alive after the source is gone, and writes
    in place on either side leave the other's value as it was (numpy copies are the reference)."""
    mesh = dtorch.DeviceMesh("cpu", mesh_ids)
    n = len(mesh_ids)
    a = np.arange(4 * 512 * 256, dtype=np.float32).reshape(4, 512, 256)
    base = _in_use(mesh)
    x = dtorch.distribute_tensor(a, mesh, [Shard(1)])
    rows = [len(r) for r in np.array_split(np.arange(512), n)]            # torch.chunk's pieces of 512
    piece = [4 * r * 256 * 4 for r in rows]
    assert [u - b for u, b in zip(_in_use(mesh), base)] == piece
    flat = x.reshape(4, 512, 16, 16)          # Shard(1) kept: each piece is its input's bytes
    one = x[1]                                # one contiguous run of each piece, at its own offset
    two = x.narrow(0, 1, 2)
    assert flat.placements == (Shard(1),) and one.placements == (Shard(0),)
    assert [u - b for u, b in zip(_in_use(mesh), base)] == piece
    column = x[:, :, 0]                       # strided: a view too, no bytes until an op reads it
    assert [u - b for u, b in zip(_in_use(mesh), base)] == piece
    twice = column * 2                        # a fresh piece of 4 x rows floats (the gather is freed)
    assert [u - b for u, b in zip(_in_use(mesh), base)] == [p + 4 * r * 4 for p, r in zip(piece, rows)]
    np.testing.assert_array_equal(twice.numpy(), a[:, :, 0] * 2)
    del x, column, twice
    gc.collect()
    assert [u - b for u, b in zip(_in_use(mesh), base)] == piece      # the views keep x's bytes alive
    np.testing.assert_array_equal(flat.numpy(), a.reshape(4, 512, 16, 16))
    np.testing.assert_array_equal(one.numpy(), a[1])
    np.testing.assert_array_equal(two.numpy(), a[1:3])
    del flat, one, two
    gc.collect()
    assert _in_use(mesh) == base

    # writes in place: shared bytes are copied first, so each side keeps its own value
    x = dtorch.distribute_tensor(a, mesh, [Shard(1)])
    one, two = x[1], x.narrow(0, 1, 2)
    x[:, :, 0:2] = 7.0
    two[0] = -1.0
    want = a.copy()
    want[:, :, 0:2] = 7.0
    np.testing.assert_array_equal(x.numpy(), want)
    np.testing.assert_array_equal(one.numpy(), a[1])
    np.testing.assert_array_equal(two.numpy(), np.concatenate([np.full((1, 512, 256), -1.0, np.float32), a[2:3]]))
    np.testing.assert_array_equal(x[1].numpy(), want[1])
    del x, one, two
    gc.collect()
    assert _in_use(mesh) == base

    # a slice of a later dim keeps one run when the dims before it have size 1 (here after x[1] or
    # x[1:2]); Replicate: every device holds the whole (3, 4, 5)
    c = np.arange(60, dtype=np.int64).reshape(3, 4, 5)
    r = dtorch.distribute_tensor(c, mesh, [Replicate()])
    held = _in_use(mesh)
    assert [h - b for h, b in zip(held, base)] == [60 * 8] * n
    runs = [r[1, 2:4], r[1:2, 2:4], r[2, :, 1], r[1:2, 3], r[..., 0:5]]
    assert _in_use(mesh) == held                                   # r[2, :, 1], strided, is a view too
    for got, want in zip(runs, [c[1, 2:4], c[1:2, 2:4], c[2, :, 1], c[1:2, 3], c[..., 0:5]]):
        np.testing.assert_array_equal(got.numpy(), want)
    assert _in_use(mesh) == [h + 4 * 8 for h in held]              # fetched, it holds its 4 int64 gathered
    strided = r[:, 2:4]
    assert _in_use(mesh) == [h + 4 * 8 for h in held]
    np.testing.assert_array_equal(strided.numpy(), c[:, 2:4])
    assert _in_use(mesh) == [h + 4 * 8 + 3 * 2 * 5 * 8 for h in held]


def test_a_large_strided_view_is_gathered_once_and_a_small_one_each_time(mode):
    """A strided view of 1 MiB or more gets pieces of its own the first time an op reads it (a weight
    transposed once and read at every step is gathered once); a smaller one is gathered inline,
    into bytes freed after the op."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    a = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024) / 1000
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    base = _in_use(mesh)
    piece = 256 * 1024 * 4
    wt = x.t()                                         # (1024, 512) Shard(1): 1 MiB on each device
    assert _in_use(mesh) == base
    y = wt * 2.0
    assert [u - b for u, b in zip(_in_use(mesh), base)] == [2 * piece] * 2   # wt's pieces, and y
    z = wt + 1.0
    assert [u - b for u, b in zip(_in_use(mesh), base)] == [3 * piece] * 2   # z alone
    np.testing.assert_allclose(y.numpy(), a.T * 2, rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), a.T + 1, rtol=1e-6)
    del y, z, wt
    gc.collect()
    assert _in_use(mesh) == base
    small = x[:, :8].t()                               # (8, 512) Shard(1): 8 KiB on each device
    twice = small * 2.0
    assert [u - b for u, b in zip(_in_use(mesh), base)] == [8 * 256 * 4] * 2  # twice alone
    np.testing.assert_allclose(twice.numpy(), a[:, :8].T * 2, rtol=1e-6)


def _kernel_takes_huge_page_advice():
    """Whether madvise(MADV_HUGEPAGE) succeeds here (a kernel with transparent huge pages), asked of
    a mapping of this test's own: what DTorch's counter should then show."""
    import mmap
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    m = mmap.mmap(-1, 4 << 20)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
        return True
    except OSError:
        return False
    finally:
        m.close()


def test_loaded_pieces_sit_in_memory_advised_for_huge_pages(mode):
    """device_stats' huge_page_bytes: the bytes of a device's pieces that lie in 2 MiB-aligned
    memory advised for transparent huge pages (MADV_HUGEPAGE) before its first touch, where the
    kernel takes the advice. A piece the controller sends whole (distribute_tensor: checkpoint
    loading's path) of 1 MiB or more counts in both worker modes; a 64 KiB one does not. Whether the
    kernel then backs it with huge pages (AnonHugePages) is the machine's state, not asserted."""
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    advised = _kernel_takes_huge_page_advice()
    base = dtorch.device_stats(mesh)
    assert all(s["huge_page_bytes"] >= 0 for s in base)
    big = dtorch.distribute_tensor(np.ones((2048, 1024), np.float32), mesh, [Shard(0)])      # 4 MiB a device
    small = dtorch.distribute_tensor(np.ones((64, 256), np.float32), mesh, [Replicate()])   # 64 KiB
    held = dtorch.device_stats(mesh)
    for b, h in zip(base, held):
        assert h["bytes_in_use"] - b["bytes_in_use"] == (4 << 20) + (64 << 10)
        assert h["huge_page_bytes"] - b["huge_page_bytes"] == ((4 << 20) if advised else 0)
    np.testing.assert_array_equal(big.numpy(), 1)
    del big, small
    gc.collect()
    after = dtorch.device_stats(mesh)
    assert [a["huge_page_bytes"] for a in after] == [b["huge_page_bytes"] for b in base]
