"""Ring attention (dtorch.nn.functional.ring_attention) against an independent numpy reference of
the definition, softmax(q k^T * scale + mask) v over the whole sequence, with the mask from the
positions; and the per-device statistics that show the keys travelled around a ring: each device
sends exactly the blocks it forwards, and never holds the whole sequence."""
import ml_dtypes
import numpy as np
import pytest

import dtorch
from dtorch import Replicate, Shard
from conftest import chunk_range

F = dtorch.nn.functional


def reference(q, k, v, q_pos, k_pos, causal, scale=None):
    """softmax(q k^T * scale + mask) v in float64 per (batch, head), the mask hiding key j from
    query i unless k_pos[j] >= 0 and (not causal or k_pos[j] <= q_pos[i]); rows that see no key
    are zeros. Hidden keys take no part at all (whatever their k and v hold, NaN included).
    q (B, Hq, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv); positions (B or 1, n)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, heads, _, dim = q.shape
    group = heads // k.shape[1]
    scale = 1.0 / np.sqrt(dim) if scale is None else scale
    out = np.zeros(q.shape[:3] + (v.shape[3],))
    for b in range(batch):
        qp, kp = q_pos[b % len(q_pos)], k_pos[b % len(k_pos)]
        visible = (kp[None, :] >= 0) & ((not causal) | (kp[None, :] <= qp[:, None]))
        for h in range(heads):
            for i in range(q.shape[2]):
                seen = visible[i]
                if seen.any():
                    scores = q[b, h, i] @ k[b, h // group][seen].T * scale
                    w = np.exp(scores - scores.max())
                    out[b, h, i] = w / w.sum() @ v[b, h // group][seen]
    return out


def ring_mesh(n):
    return dtorch.DeviceMesh("cpu", list(range(n)), mesh_dim_names=("cp",))


def arrays(shape_q, shape_kv, dv=None, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    b, hkv, s, d = shape_kv
    q = rng.standard_normal(shape_q).astype(dtype)
    k = rng.standard_normal(shape_kv).astype(dtype)
    v = rng.standard_normal((b, hkv, s, dv or d)).astype(dtype)
    return q, k, v


def run(mesh, q, k, v, q_pos, k_pos, q_pl, kv_pl, qi_pl, ki_pl, mesh_dim=0, causal=True, scale=None):
    t = [dtorch.distribute_tensor(x, mesh, pl) for x, pl in
         ((q, q_pl), (k, kv_pl), (v, kv_pl), (q_pos, qi_pl), (k_pos, ki_pl))]
    out = F.ring_attention(*t, mesh_dim, is_causal=causal, scale=scale)
    assert out.placements == tuple(q_pl)
    assert tuple(out.shape) == q.shape[:3] + (v.shape[3],)
    return out


def check(got, want, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


# ---- prefill ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_on_rings(mode, n, causal):
    q, k, v = arrays((2, 2, 16, 8), (2, 2, 16, 8), dv=6, seed=n)
    pos = np.arange(16, dtype=np.int64)[None]
    out = run(ring_mesh(n), q, k, v, pos, pos, [Shard(2)], [Shard(2)], [Shard(1)], [Shard(1)], causal=causal)
    assert out.dtype is dtorch.float32
    check(out.numpy(), reference(q, k, v, pos, pos, causal))


@pytest.mark.parametrize("n", [1, 2])
def test_a_nan_query_row_comes_out_nan(mode, n):
    """As torch's softmax gives it: a NaN in query row 5 makes that row NaN on every device's block
    (once it came out zeros, as a row that sees no key); every other row keeps its value."""
    q, k, v = arrays((1, 2, 12, 8), (1, 2, 12, 8), seed=7)
    q[0, 1, 5, 2] = np.nan
    pos = np.arange(12, dtype=np.int64)[None]
    got = run(ring_mesh(n), q, k, v, pos, pos, [Shard(2)], [Shard(2)], [Shard(1)], [Shard(1)], causal=False).numpy()
    assert np.isnan(got[0, 1, 5]).all()
    rest = np.ones(got.shape[:3], bool)
    rest[0, 1, 5] = False
    clean = q.copy()
    clean[0, 1, 5] = 0
    check(got[rest], reference(clean, k, v, pos, pos, False)[rest])


@pytest.mark.parametrize("seq, n", [(13, 2), (13, 4), (3, 4)])
@pytest.mark.parametrize("causal", [True, False])
def test_uneven_and_empty_blocks(mode, seq, n, causal):
    """13 tokens over 2 (7, 6) and over 4 (4, 4, 4, 1); 3 over 4 leaves the last device empty."""
    q, k, v = arrays((1, 2, seq, 4), (1, 2, seq, 4), seed=seq + n)
    pos = np.arange(seq, dtype=np.int64)[None]
    out = run(ring_mesh(n), q, k, v, pos, pos, [Shard(2)], [Shard(2)], [Shard(1)], [Shard(1)], causal=causal)
    check(out.numpy(), reference(q, k, v, pos, pos, causal), 1e-5)
    assert [p.shape[2] for p in out.to_local()] == [b - a for a, b in (chunk_range(seq, n, r) for r in range(n))]


@pytest.mark.parametrize("n", [2, 4])
def test_zigzag_layout(mode, n):
    """The load-balanced layout: ring device i holds chunks i and 2n-1-i of the sequence (each
    does the same causal work); the positions say where each token is."""
    seq = 4 * n * 2
    chunks = np.arange(seq).reshape(2 * n, -1)
    perm = np.concatenate([np.concatenate([chunks[i], chunks[2 * n - 1 - i]]) for i in range(n)])
    q, k, v = arrays((2, 2, seq, 8), (2, 2, seq, 8), seed=7)
    pos = perm.astype(np.int64)[None]
    qp, kp, vp = q[:, :, perm], k[:, :, perm], v[:, :, perm]
    out = run(ring_mesh(n), qp, kp, vp, pos, pos, [Shard(2)], [Shard(2)], [Shard(1)], [Shard(1)])
    natural = np.arange(seq, dtype=np.int64)[None]
    check(out.numpy(), reference(q, k, v, natural, natural, True)[:, :, perm])


def test_grouped_query_heads(mode):
    q, k, v = arrays((2, 4, 12, 8), (2, 2, 12, 8), dv=5, seed=3)
    pos = np.arange(12, dtype=np.int64)[None]
    for causal in (True, False):
        out = run(ring_mesh(3), q, k, v, pos, pos, [Shard(2)], [Shard(2)], [Shard(1)], [Shard(1)], causal=causal,
                  scale=0.3)
        check(out.numpy(), reference(q, k, v, pos, pos, causal, 0.3))


def test_padding_by_negative_key_positions(mode):
    """Batch row 1 is left-padded by 3 keys (position -1): nobody sees them; its first 3 queries
    (padding too, position -1) see nothing and give zeros."""
    q, k, v = arrays((2, 2, 10, 4), (2, 2, 10, 4), seed=5)
    pos = np.stack([np.arange(10), np.r_[[-1] * 3, np.arange(7)]]).astype(np.int64)
    k[1, :, :3] = v[1, :, :3] = np.nan  # what padding holds must not matter
    out = run(ring_mesh(4), q, k, v, pos, pos, [Shard(2)], [Shard(2)], [Shard(1)], [Shard(1)])
    got = out.numpy()
    check(got, reference(q, k, v, pos, pos, True))
    assert not np.isnan(got).any() and (got[1, :, :3] == 0).all()


def test_bfloat16_inputs(mode):
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in arrays((1, 2, 24, 16), (1, 2, 24, 16), seed=11))
    pos = np.arange(24, dtype=np.int64)[None]
    out = run(ring_mesh(3), q, k, v, pos, pos, [Shard(2)], [Shard(2)], [Shard(1)], [Shard(1)])
    assert out.dtype is dtorch.bfloat16
    want = reference(*(x.astype(np.float32) for x in (q, k, v)), pos, pos, True)
    check(out.numpy(), want, rtol=2e-2, atol=2e-2)


# ---- two mesh dims ---------------------------------------------------------------------------------

def test_ring_by_heads_on_a_2d_mesh(mode):
    """cp x tp: each tp column is a ring of its own over its heads (grouped: 4 query heads over 2)."""
    mesh = dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
    q, k, v = arrays((2, 4, 11, 8), (2, 2, 11, 8), seed=13)
    pos = np.arange(11, dtype=np.int64)[None]
    out = run(mesh, q, k, v, pos, pos, [Shard(2), Shard(1)], [Shard(2), Shard(1)], [Shard(1), Replicate()],
              [Shard(1), Replicate()], mesh_dim="cp")
    check(out.numpy(), reference(q, k, v, pos, pos, True))


def test_ring_by_batch_on_a_2d_mesh(mode):
    """dp x cp: each dp row is a ring over its batch rows, each with positions of its own."""
    mesh = dtorch.init_device_mesh("cpu", (2, 3), mesh_dim_names=("dp", "cp"))
    q, k, v = arrays((4, 2, 14, 8), (4, 2, 14, 8), seed=17)
    pos = np.stack([np.arange(14) + b for b in range(4)]).astype(np.int64)
    pos[3, :2] = -1
    out = run(mesh, q, k, v, pos, pos, [Shard(0), Shard(2)], [Shard(0), Shard(2)], [Shard(0), Shard(1)],
              [Shard(0), Shard(1)], mesh_dim=1, causal=True)
    check(out.numpy(), reference(q, k, v, pos, pos, True))
    # positions shared by the batch stay Replicate on dp
    shared = pos[:1]
    out = run(mesh, q, k, v, shared, shared, [Shard(0), Shard(2)], [Shard(0), Shard(2)], [Replicate(), Shard(1)],
              [Replicate(), Shard(1)], mesh_dim=-1, causal=False)
    check(out.numpy(), reference(q, k, v, shared, shared, False))


# ---- decode ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 4])
def test_decode_against_a_sharded_cache(mode, n):
    """One new token (position 9) against a cache of 16 slots split on the ring, 10 filled (slots
    10.. are -1, and hold NaN); grouped-query heads, Dv != D."""
    q, k, v = arrays((2, 4, 1, 8), (2, 2, 16, 8), dv=6, seed=19)
    slots = np.r_[np.arange(10), [-1] * 6].astype(np.int64)[None]
    k[:, :, 10:] = v[:, :, 10:] = np.nan  # empty slots hold whatever memory held (empty() can hold NaN)
    now = np.array([[9]], dtype=np.int64)
    mesh = ring_mesh(n)
    out = run(mesh, q, k, v, now, slots, [Replicate()], [Shard(2)], [Replicate()], [Shard(1)])
    check(out.numpy(), reference(q, k, v, now, slots, True))
    for piece in out.to_local():  # Replicate on the ring: every device has the whole answer
        check(piece, reference(q, k, v, now, slots, True))


# ---- bad input -------------------------------------------------------------------------------------

def test_bad_placements_and_shapes_raise(mode):
    mesh = ring_mesh(2)
    q, k, v = arrays((1, 2, 8, 4), (1, 2, 8, 4))
    pos = np.arange(8, dtype=np.int64)[None]
    d = dtorch.distribute_tensor
    tq, tk, tv = (d(x, mesh, [Shard(2)]) for x in (q, k, v))
    ti = d(pos, mesh, [Shard(1)])
    with pytest.raises(ValueError, match=r"ring_attention: key has placements \(Replicate\(\),\) but needs "
                                         r"\(Shard\(dim=2\),\)"):
        F.ring_attention(tq, d(k, mesh, [Replicate()]), tv, ti, ti, 0)
    with pytest.raises(ValueError, match=r"ring_attention: query_index has placements \(Replicate\(\),\) but needs "
                                         r"\(Shard\(dim=1\),\).*prefill"):
        F.ring_attention(tq, tk, tv, d(pos, mesh, [Replicate()]), ti, 0)
    with pytest.raises(ValueError, match=r"ring_attention: query has placements \(Shard\(dim=1\),\)"):
        F.ring_attention(d(q, mesh, [Shard(1)]), tk, tv, ti, ti, 0)
    with pytest.raises(TypeError, match="ring_attention: query_index must be int64 positions, got int32"):
        F.ring_attention(tq, tk, tv, d(pos.astype(np.int32), mesh, [Shard(1)]), ti, 0)
    with pytest.raises(TypeError, match="same floating dtype"):
        F.ring_attention(tq, d(k.astype(ml_dtypes.bfloat16), mesh, [Shard(2)]), tv, ti, ti, 0)
    with pytest.raises(ValueError, match=r"ring_attention: expected query \(B, Hq, Lq, D\)"):
        F.ring_attention(tq, d(k[..., :3].copy(), mesh, [Shard(2)]), tv, ti, ti, 0)
    with pytest.raises(ValueError, match=r"key/value heads \(2\) must divide the query heads \(3\)"):
        F.ring_attention(d(np.zeros((1, 3, 8, 4), np.float32), mesh, [Shard(2)]), tk, tv, ti, ti, 0)
    with pytest.raises(ValueError, match=r"key_index must have shape \(1, 8\), got \[1, 5\]"):
        F.ring_attention(tq, tk, tv, ti, d(pos[:, :5].copy(), mesh, [Shard(1)]), 0)
    with pytest.raises(ValueError, match="mesh_dim 'tp' is not a dim"):
        F.ring_attention(tq, tk, tv, ti, ti, "tp")
    with pytest.raises(ValueError, match="mesh_dim 1 is out of range for a mesh of 1 dims"):
        F.ring_attention(tq, tk, tv, ti, ti, 1)
    with pytest.raises(TypeError, match="mesh_dim must be an int or a mesh dim name"):
        F.ring_attention(tq, tk, tv, ti, ti, 0.0)
    with pytest.raises(TypeError, match="expected a DTensor at position 1"):
        F.ring_attention(tq, k, tv, ti, ti, 0)
    with pytest.raises(TypeError, match="expected a DTensor at position 0"):
        F.ring_attention(q, tk, tv, ti, ti, "cp")
    with pytest.raises(TypeError, match="scale must be a number"):
        F.ring_attention(tq, tk, tv, ti, ti, 0, scale="big")


def test_bad_placements_on_other_mesh_dims_raise(mode):
    mesh = dtorch.init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
    q, k, v = arrays((2, 4, 8, 4), (2, 1, 8, 4))
    pos = np.arange(8, dtype=np.int64)[None]
    d = dtorch.distribute_tensor
    ti = d(pos, mesh, [Shard(1), Replicate()])
    # one key/value head cannot be split over 2 tp devices in whole groups
    with pytest.raises(ValueError, match=r"ring_attention: query has placements \(Shard\(dim=2\), Shard\(dim=1\)\) "
                                         r"but needs \(Shard\(dim=2\), Replicate\(\)\).*whole groups"):
        F.ring_attention(*(d(x, mesh, [Shard(2), Shard(1)]) for x in (q, k, v)), ti, ti, "cp")
    # the sequence split on the other mesh dim as well
    kv = [d(x, mesh, [Shard(2), Replicate()]) for x in (k, v)]
    with pytest.raises(ValueError, match=r"ring_attention: query has placements \(Shard\(dim=2\), Shard\(dim=2\)\)"):
        F.ring_attention(d(q, mesh, [Shard(2), Shard(2)]), *kv, ti, ti, "cp")
    # batch split on tp but the keys not
    with pytest.raises(ValueError, match=r"ring_attention: key has placements \(Shard\(dim=2\), Replicate\(\)\) "
                                         r"but needs \(Shard\(dim=2\), Shard\(dim=0\)\)"):
        F.ring_attention(d(q, mesh, [Shard(2), Shard(0)]), *kv, ti, ti, "cp")


# ---- the proof that it is a ring -------------------------------------------------------------------

def block_bytes(pieces):
    """Bytes of each ring device's block: its key, value and key_index pieces."""
    return [sum(p.nbytes for p in device) for device in zip(*pieces)]


def forwarded(sizes, blocks, n):
    """What ring device r sends: the blocks that start at r, r-1, ..., r-n+2 (each goes on until
    it reaches the device before its owner), those that hold keys."""
    msgs, nbytes = [], []
    for r in range(n):
        held = [(r - s) % n for s in range(n - 1)]
        msgs.append(3 * sum(1 for b in held if sizes[b]))
        nbytes.append(sum(blocks[b] for b in held if sizes[b]))
    return msgs, nbytes


def delta(after, before, key):
    return [a[key] - b[key] for a, b in zip(after, before)]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_each_device_forwards_its_blocks_around_the_ring(mode, n):
    mesh = ring_mesh(n)
    seq = 6 * n
    q, k, v = arrays((1, 2, seq, 8), (1, 2, seq, 8), dv=4, seed=n)
    pos = np.arange(seq, dtype=np.int64)[None]
    t = [dtorch.distribute_tensor(x, mesh, [Shard(2)]) for x in (q, k, v)]
    ti = dtorch.distribute_tensor(pos, mesh, [Shard(1)])
    before = dtorch.device_stats(mesh)
    out = F.ring_attention(*t, ti, ti, "cp")
    check(out.numpy(), reference(q, k, v, pos, pos, True))
    after = dtorch.device_stats(mesh)
    assert [s["device"] for s in after] == list(range(n))
    # k, v and k_index, once per step but the last
    assert delta(after, before, "peer_messages_sent") == [3 * (n - 1)] * n
    assert delta(after, before, "peer_messages_received") == [3 * (n - 1)] * n
    one_block = 6 * 2 * 8 * 4 + 6 * 2 * 4 * 4 + 6 * 8
    assert delta(after, before, "peer_bytes_sent") == [(n - 1) * one_block] * n
    assert delta(after, before, "peer_bytes_received") == [(n - 1) * one_block] * n
    assert (n - 1) * one_block < seq * (2 * 8 * 4 + 2 * 4 * 4 + 8), "less than the whole K/V, even all together"


@pytest.mark.parametrize("seq, n", [(13, 4), (3, 4)])
def test_uneven_and_empty_blocks_are_forwarded_exactly(mode, seq, n):
    mesh = ring_mesh(n)
    q, k, v = arrays((1, 2, seq, 4), (1, 2, seq, 4), seed=seq)
    pos = np.arange(seq, dtype=np.int64)[None]
    t = [dtorch.distribute_tensor(x, mesh, [Shard(2)]) for x in (q, k, v)]
    ti = dtorch.distribute_tensor(pos, mesh, [Shard(1)])
    before = dtorch.device_stats(mesh)
    out = F.ring_attention(*t, ti, ti, 0)
    check(out.numpy(), reference(q, k, v, pos, pos, True))
    after = dtorch.device_stats(mesh)
    sizes = [b - a for a, b in (chunk_range(seq, n, r) for r in range(n))]
    blocks = block_bytes([t[1].to_local(), t[2].to_local(), ti.to_local()])
    msgs, nbytes = forwarded(sizes, blocks, n)
    if seq == 3:
        # block 3 is empty: devices 3, 0 and 1 would forward it and skip it; device 2 never holds it
        assert msgs == [6, 6, 9, 6]
    else:
        assert msgs == [9] * 4
    assert delta(after, before, "peer_messages_sent") == msgs
    assert delta(after, before, "peer_bytes_sent") == nbytes
    assert sum(delta(after, before, "peer_messages_received")) == sum(msgs)


def test_memory_stays_below_the_whole_sequence(mode):
    """S = 512, D = 64, 2 heads over 4 devices: the keys and values of the whole sequence are
    512 KiB; no device ever holds that much."""
    mesh = ring_mesh(4)
    q, k, v = arrays((1, 2, 512, 64), (1, 2, 512, 64), seed=23)
    pos = np.arange(512, dtype=np.int64)[None]
    t = [dtorch.distribute_tensor(x, mesh, [Shard(2)]) for x in (q, k, v)]
    ti = dtorch.distribute_tensor(pos, mesh, [Shard(1)])
    dtorch.device_stats(mesh, reset_peak=True)
    out = F.ring_attention(*t, ti, ti, 0)
    check(out.numpy(), reference(q, k, v, pos, pos, True), 1e-4, 1e-5)
    stats = dtorch.device_stats(mesh)
    whole_kv = k.nbytes + v.nbytes
    local_inputs = (q.nbytes + k.nbytes + v.nbytes) // 4
    for s in stats:
        assert local_inputs < s["peak_bytes"] < whole_kv, s


def test_decode_moves_only_partial_results(mode):
    n = 4
    mesh = ring_mesh(n)
    q, k, v = arrays((2, 4, 1, 8), (2, 2, 32, 8), dv=6, seed=29)
    slots = np.arange(32, dtype=np.int64)[None]
    now = np.array([[31]], dtype=np.int64)
    t = [dtorch.distribute_tensor(q, mesh, [Replicate()])] + [dtorch.distribute_tensor(x, mesh, [Shard(2)])
                                                              for x in (k, v)]
    before = dtorch.device_stats(mesh)
    out = F.ring_attention(*t, dtorch.distribute_tensor(now, mesh, [Replicate()]),
                           dtorch.distribute_tensor(slots, mesh, [Shard(1)]), 0)
    check(out.numpy(), reference(q, k, v, now, slots, True))
    after = dtorch.device_stats(mesh)
    partial = 2 * 4 * 1 * (6 + 1) * 4  # o and lse of every query row, float32
    assert delta(after, before, "peer_messages_sent") == [2 * (n - 1)] * n
    assert delta(after, before, "peer_bytes_sent") == [(n - 1) * partial] * n
    assert delta(after, before, "peer_bytes_received") == [(n - 1) * partial] * n
    assert (n - 1) * partial < k.nbytes // n, "less than one device's block of keys"


@pytest.mark.parametrize("n", [2, 3])
def test_views_as_inputs(mode, n):
    """q, k and v as views made on the controller (heads 1-2 of a tensor of 4, whose sequence dim is
    split on the ring): the ring reads pieces made for them, the same values as copies give."""
    q4, k4, v4 = arrays((1, 4, 11, 8), (1, 4, 11, 8), dv=6, seed=n)
    pos = np.arange(11, dtype=np.int64)[None]
    mesh = ring_mesh(n)
    t = [dtorch.distribute_tensor(x, mesh, [Shard(2)]) for x in (q4, k4, v4)]
    qi, ki = (dtorch.distribute_tensor(pos, mesh, [Shard(1)]) for _ in range(2))
    out = F.ring_attention(t[0][:, 1:3], t[1][:, 1:3], t[2][:, 1:3], qi, ki, 0, is_causal=True)
    check(out.numpy(), reference(q4[:, 1:3], k4[:, 1:3], v4[:, 1:3], pos, pos, True))
    assert np.array_equal(t[0].numpy(), q4)   # the tensors the views were made of are unchanged
