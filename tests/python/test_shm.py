"""Worker processes of one host exchange large regions, and lend large fetched values to the
controller, through shared memory (memfd segments, actors/worker/act_shm.c); thread workers read each
other's pieces in place as before.

Every value is compared with numpy: collectives on 2, 3 and 4 devices with uneven shards,
every device's piece, and fetches of Replicate, Shard and Partial tensors. ``device_stats``' shm
counters prove which path the bytes took (every region by handle in process mode, none in thread
mode; with DTORCH_SHM=0, frames). A worker killed with SIGKILL leaves nothing in /dev/shm and no
mapping of its memory behind, in the controller or in its peer, and its device is reported dead.
"""
import os
import signal
import time

import numpy as np
import pytest

import dtorch
from conftest import mesh_1d, reference_locals, wait_for, worker_pids
from dtorch import Partial, Replicate, Shard

SHM_MIN = 256 << 10  # ACT_SHM_MIN (actors/worker/act_worker.h): pieces and regions from this size up go by handle
SHAPE = (2051, 1029)  # uneven over 2, 3 and 4 devices on both dims; every all_to_all block above SHM_MIN


def _values(shape, seed):
    """Integer-valued float32 (sums of a few are exact in any order)."""
    return np.random.default_rng(seed).integers(-50, 50, size=shape).astype(np.float32)


def _stats(mesh):
    return dtorch.device_stats(mesh)


def _delta(after, before, key):
    return [a[key] - b[key] for a, b in zip(after, before)]


def _source(kind, mesh, n):
    """The source of a collective on mesh (n devices) and its whole value."""
    if kind in ("all_gather", "all_to_all"):
        full = _values(SHAPE, n)
        return dtorch.distribute_tensor(full, mesh, [Shard(0)]), full
    pieces = [_values(SHAPE, 10 * n + d) for d in range(n)]
    return dtorch.from_local(pieces, mesh, [Partial("sum")]), np.sum(pieces, axis=0, dtype=np.float32)


TARGETS = {"all_gather": Replicate(), "all_to_all": Shard(1), "reduce_scatter": Shard(0), "all_reduce": Replicate()}


@pytest.mark.parametrize("kind", list(TARGETS))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_large_collective(mode, kind, n):
    mesh = mesh_1d(n)
    x, full = _source(kind, mesh, n)
    before = _stats(mesh)  # every worker has started: each knows its peers' processes
    y = x.redistribute(mesh, [TARGETS[kind]])
    after = _stats(mesh)
    np.testing.assert_array_equal(y.numpy(), full)
    for got, want in zip(y.to_local(), reference_locals(full, (n,), [TARGETS[kind]])):
        np.testing.assert_array_equal(got, want)
    moved = sum(_delta(after, before, "peer_bytes_received"))
    assert moved > 0
    assert sum(_delta(after, before, "peer_bytes_sent")) == moved
    if mode == "process":
        # every region is above SHM_MIN: all of them were read from the sender's shared memory
        assert sum(_delta(after, before, "shm_bytes_received")) == moved
        assert sum(_delta(after, before, "shm_bytes_sent")) == moved
    else:
        assert sum(_delta(after, before, "shm_bytes_received")) == 0
        assert sum(_delta(after, before, "shm_bytes_sent")) == 0


def _piece_bytes(shape, n, placement):
    return [p.nbytes for p in reference_locals(np.empty(shape, np.float32), (n,), [placement])]


@pytest.mark.parametrize("placement", [Replicate(), Shard(0), Shard(1)])
def test_large_fetch(mode, placement):
    mesh = mesh_1d(3)
    full = _values(SHAPE, 7)
    x = dtorch.distribute_tensor(full, mesh, [placement])
    before = _stats(mesh)
    np.testing.assert_array_equal(x.numpy(), full)
    np.testing.assert_array_equal(x.numpy(), full)  # the segments are mapped once; the second reads them again
    after = _stats(mesh)
    fetched = _delta(after, before, "shm_bytes_fetched")
    if mode == "thread":
        assert fetched == [0, 0, 0]
    elif isinstance(placement, Replicate):
        assert fetched == [2 * full.nbytes, 0, 0]  # the first replica answers
    else:
        assert fetched == [2 * b for b in _piece_bytes(SHAPE, 3, placement)]


def test_large_fetch_partial_and_locals(mode):
    mesh = mesh_1d(2)
    pieces = [_values((1000, 300), 3), _values((1000, 300), 4)]
    x = dtorch.from_local(pieces, mesh, [Partial("sum")])
    before = _stats(mesh)
    np.testing.assert_array_equal(x.numpy(), pieces[0] + pieces[1])
    for got, want in zip(x.to_local(), pieces):
        np.testing.assert_array_equal(got, want)
    after = _stats(mesh)
    expect = [2 * p.nbytes for p in pieces] if mode == "process" else [0, 0]
    assert _delta(after, before, "shm_bytes_fetched") == expect


def test_small_pieces_travel_as_frames(process_mode):
    mesh = mesh_1d(2)
    full = _values((64, 512), 1)  # 128 KiB: pieces and regions below SHM_MIN
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    before = _stats(mesh)
    y = x.redistribute(mesh, [Replicate()])
    np.testing.assert_array_equal(y.numpy(), full)
    after = _stats(mesh)
    assert sum(_delta(after, before, "peer_bytes_received")) == full.nbytes
    for key in ("shm_bytes_sent", "shm_bytes_received", "shm_bytes_fetched"):
        assert _delta(after, before, key) == [0, 0]


def test_frames_when_shared_memory_is_off(monkeypatch):
    """DTORCH_SHM=0: worker processes never lend; every byte travels as ZeroMQ frames."""
    monkeypatch.setenv("DTORCH_SHM", "0")
    dtorch.shutdown()
    dtorch.init(workers="process")
    try:
        mesh = mesh_1d(3)
        for kind in TARGETS:
            x, full = _source(kind, mesh, 3)
            before = _stats(mesh)
            y = x.redistribute(mesh, [TARGETS[kind]])
            np.testing.assert_array_equal(y.numpy(), full)
            for got, want in zip(y.to_local(), reference_locals(full, (3,), [TARGETS[kind]])):
                np.testing.assert_array_equal(got, want)
            after = _stats(mesh)
            assert sum(_delta(after, before, "peer_bytes_received")) > 0
            for key in ("shm_bytes_sent", "shm_bytes_received", "shm_bytes_fetched"):
                assert _delta(after, before, key) == [0, 0, 0], (kind, key)
    finally:
        dtorch.shutdown()


def test_write_in_place_after_a_region_is_lent(process_mode):
    """A piece written in place while a peer may still read a region of it: the peer gets the
    value from before the write (the lent storage is copied on write), the writer the new one."""
    mesh = mesh_1d(2)
    full = _values((1024, 512), 5)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    dtorch.synchronize()
    y = x.redistribute(mesh, [Replicate()])
    x[..., 0:256] = dtorch.full((1024, 256), 7.0, device_mesh=mesh, placements=[Shard(0)])
    np.testing.assert_array_equal(y.numpy(), full)
    written = full.copy()
    written[:, 0:256] = 7.0
    np.testing.assert_array_equal(x.numpy(), written)
    assert sum(d["shm_bytes_received"] for d in _stats(mesh)) > 0


def _memfd_count(pid):
    """How many shared segments process pid holds descriptors of."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:dtorch-")
        except OSError:
            pass
    return n


def test_lent_storage_comes_back(process_mode):
    """Every hold ends: after many collectives and fetches, each worker holds about as many segments
    as one round needs (freed segments are reused), not one per transfer."""
    mesh = mesh_1d(2)
    x = dtorch.distribute_tensor(_values((1024, 1024), 2), mesh, [Shard(0)])
    dtorch.synchronize()
    for _ in range(3):
        y = x.redistribute(mesh, [Replicate()])
        y.numpy()
        del y
    dtorch.synchronize()
    pids = worker_pids()
    settled = [_memfd_count(pids[d]) for d in (0, 1)]
    for _ in range(40):
        y = x.redistribute(mesh, [Shard(1)])
        y.numpy()
        z = y.redistribute(mesh, [Replicate()])
        z.numpy()
        del y, z
    dtorch.synchronize()
    now = [_memfd_count(pids[d]) for d in (0, 1)]
    assert all(a <= b + 2 for a, b in zip(now, settled)), (settled, now)
    assert sum(d["shm_bytes_received"] for d in _stats(mesh)) > 40 * 2 * (2 << 20)


def _mapped_from(pid, owner):
    """Lines of process pid's memory map that map a segment of process owner."""
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if f"memfd:dtorch-{owner}-" in line]


def _segments_in_dev_shm(pids):
    """Names in /dev/shm of segments processes pids made (dt_shm names them dtorch-<pid>-<serial>;
    other programs, other runs of the suite included, keep theirs there)."""
    return sorted(name for name in os.listdir("/dev/shm")
                  if any(name.startswith(f"dtorch-{pid}-") for pid in pids))


def test_killed_worker_leaves_nothing_behind(process_mode):
    mesh = mesh_1d(2)
    full = _values((1024, 1024), 9)
    x = dtorch.distribute_tensor(full, mesh, [Shard(0)])
    dtorch.synchronize()
    y = x.redistribute(mesh, [Replicate()])  # device 0 maps device 1's segment, and 1 maps 0's
    np.testing.assert_array_equal(x.numpy(), full)  # the controller maps both
    pids = worker_pids()
    victim, survivor = pids[1], pids[0]
    assert _mapped_from(os.getpid(), victim) and _mapped_from(survivor, victim)

    os.kill(victim, signal.SIGKILL)
    with pytest.raises(Exception, match="device 1 (died|is dead).*killed by signal 9"):
        x.numpy()
    # the controller and the surviving worker let go of the dead worker's memory
    assert wait_for(lambda: not _mapped_from(os.getpid(), victim)), _mapped_from(os.getpid(), victim)
    assert wait_for(lambda: not _mapped_from(survivor, victim)), _mapped_from(survivor, victim)
    assert _segments_in_dev_shm([os.getpid(), victim, survivor]) == []
    # the survivor keeps its pieces and works on
    alone = dtorch.DeviceMesh("cpu", [0])
    np.testing.assert_array_equal(dtorch.full((600, 300), 2.0, device_mesh=alone).numpy(),
                                  np.full((600, 300), 2.0, np.float32))
    del y
