"""The CUDA backend from Python: elementwise ops and products on cuda meshes against numpy, with
thread and process workers. Where a cuda mesh cannot run an op (a build without the CUDA backend,
or no usable GPU: then every op fails with "no CUDA device: <reason>") the value tests skip and
say why; test_without_a_device_ops_say_why checks that reason instead of skipping."""
import time

import numpy as np
import pytest

import dtorch
import llama_reference
import vae_reference
from dtorch import Replicate, Shard
from dtorch.models import AutoencoderKL, LlamaConfig, LlamaForCausalLM, parallelize_llama


def _why_cuda_cannot_run():
    """None when a cuda mesh runs ops here, else why not."""
    try:
        mesh = dtorch.DeviceMesh("cuda", [0])
        dtorch.ones(2, device_mesh=mesh).numpy()
    except Exception as e:  # a build without the backend, or no device
        return str(e)
    return None


def _cuda_mesh(ids):
    why = _why_cuda_cannot_run()
    if why is not None:
        pytest.skip(f"a cuda mesh cannot run an op here: {why}")
    return dtorch.DeviceMesh("cuda", ids)


def test_without_a_device_ops_say_why(mode):
    try:
        mesh = dtorch.DeviceMesh("cuda", [0])
    except RuntimeError as e:
        assert "not available in this build" in str(e), e
        pytest.skip(f"no CUDA backend in this build: {e}")
    x = dtorch.arange(6, device_mesh=mesh, dtype=dtorch.float32)
    try:
        got = (x * 2).numpy()
    except RuntimeError as e:
        assert "no CUDA device" in str(e), e  # the worker's reason, not a crash or a hang
    else:
        np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32) * 2)


@pytest.mark.parametrize("ids", [[0], [0, 1]])
def test_elementwise(mode, ids):
    mesh = _cuda_mesh(ids)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 7)).astype(np.float32)
    b = rng.standard_normal((7,)).astype(np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    y = dtorch.distribute_tensor(b, mesh, [Replicate()])
    np.testing.assert_array_equal((x * y + 1).numpy(), a * b + np.float32(1))  # exactly rounded on both
    np.testing.assert_allclose(dtorch.tanh(x).numpy(), np.tanh(a), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal((x > y).numpy(), a > b)
    h = x.to(dtorch.float16)
    np.testing.assert_array_equal((h + h).numpy(), a.astype(np.float16) * 2)


@pytest.mark.parametrize("ids", [[0, 1], [0, 1, 2, 3]])
def test_redistribute_between_actors(mode, ids):
    """Regions between actors: thread workers on one GPU read each other's pieces in place, others
    (processes, actors on other GPUs) send them as frames. All-gather, all-to-all and the sum of
    Partial pieces over uneven shards, each against numpy, again after the sources are gone."""
    mesh = _cuda_mesh(ids)
    n = len(ids)
    rng = np.random.default_rng(n)
    a = rng.standard_normal((2 * n + 1, 3 * n - 1)).astype(np.float32)
    for _ in range(3):  # pieces freed by one actor while another read them are reused safely
        x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
        for piece in x.redistribute(mesh, [Replicate()]).to_local():  # every actor's copy
            np.testing.assert_array_equal(piece, a)
        np.testing.assert_array_equal(x.redistribute(mesh, [Shard(1)]).numpy(), a)
        s = x.sum(0)  # Partial over the mesh, combined on each actor from the others' pieces
        assert s.placements[0].is_partial()
        for piece in s.redistribute(mesh, [Replicate()]).to_local():
            np.testing.assert_allclose(piece, a.sum(0), rtol=1e-5, atol=1e-5)
        del x, s
    dtorch.synchronize()


@pytest.mark.parametrize("dtype,tol", [(dtorch.float32, 1e-5), (dtorch.float16, 2e-3), (dtorch.bfloat16, 2e-2)])
def test_matmul(mode, dtype, tol):
    mesh = _cuda_mesh([0, 1])
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 9, 64)).astype(np.float32)
    b = rng.standard_normal((64, 5)).astype(np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)]).to(dtype)
    y = dtorch.distribute_tensor(b, mesh, [Replicate()]).to(dtype)
    # the reference from the values the 16-bit inputs really hold
    ref = x.to(dtorch.float32).numpy().astype(np.float64) @ y.to(dtorch.float32).numpy().astype(np.float64)
    got = (x @ y).to(dtorch.float32).numpy()
    assert got.shape == (2, 9, 5)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * 8)


@pytest.mark.parametrize("bits,K", [(8, 37), (4, 70)])
def test_quantized_products(mode, bits, K):
    """linear_int8 and linear_int4 on one and two cuda devices (rows split) against the float64 product of
    the dequantized weights, for decode's one row and a prompt's 17."""
    from dtorch import quantization as Q
    from dtorch._C import _op
    from dtorch._ops import ids as op_ids
    rng = np.random.default_rng(bits)
    w = rng.standard_normal((7, K)).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    stored, scale = Q.quantize(w, bits)
    deq = Q.dequantize(stored, scale, bits, K)
    for ids, pl in (([0], Replicate()), ([0, 1], Shard(0))):
        mesh = _cuda_mesh(ids)
        for M in (1, 17):
            x = rng.standard_normal((M, K)).astype(np.float32)
            tensors = (dtorch.distribute_tensor(x, mesh, [Replicate()]),
                       dtorch.distribute_tensor(Q.to_words(stored), mesh, [pl]),
                       dtorch.distribute_tensor(scale, mesh, [pl]), dtorch.distribute_tensor(bias, mesh, [pl]))
            got = _op(op_ids[f"linear_int{bits}"], tensors, None, None, None).numpy()
            np.testing.assert_allclose(got, x.astype(np.float64) @ deq.T + bias, rtol=1e-5, atol=1e-4)


def test_reductions_softmax_and_norms(mode):
    """A Llama block's reductions on a cuda mesh: sums split over devices (Partial), arg-extremes
    with ties, softmax and rms_norm along rows, against numpy."""
    mesh = _cuda_mesh([0, 1])
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 5, 40)).astype(np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    np.testing.assert_allclose(dtorch.sum(x, dim=(0, 2)).numpy(), a.sum(axis=(0, 2)), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(x.mean(dim=1).numpy(), a.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dtorch.amax(x, dim=-1).numpy(), a.max(axis=-1))
    ints = np.array([[3, 1, 3, 0], [2, 2, -1, 2]], dtype=np.int64)  # ties go to the first
    y = dtorch.distribute_tensor(ints, mesh, [Replicate()])
    np.testing.assert_array_equal(y.argmax(dim=1).numpy(), ints.argmax(axis=1))
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(dtorch.softmax(x, dim=-1).numpy(), e / e.sum(axis=-1, keepdims=True), rtol=1e-5,
                               atol=1e-7)
    w = rng.standard_normal(40).astype(np.float32)
    ref = a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + np.finfo(np.float32).eps) * w
    got = dtorch.nn.functional.rms_norm(x, (40,), dtorch.distribute_tensor(w, mesh, [Replicate()])).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_embedding_and_views(mode):
    """Rows gathered from a vocabulary split over devices, a bad index failing with the CPU's
    message, and data movement on a cuda mesh."""
    mesh = _cuda_mesh([0, 1])
    rng = np.random.default_rng(3)
    table = rng.standard_normal((10, 6)).astype(np.float32)
    ids = np.array([[9, 0, 4], [4, 7, 1]], dtype=np.int64)
    w = dtorch.distribute_tensor(table, mesh, [Shard(0)])
    idx = dtorch.distribute_tensor(ids, mesh, [Replicate()])
    np.testing.assert_array_equal(dtorch.nn.functional.embedding(idx, w).numpy(), table[ids])
    bad = dtorch.distribute_tensor(np.array([10], dtype=np.int64), mesh, [Replicate()])
    with pytest.raises(Exception, match="index out of range in embedding"):
        dtorch.nn.functional.embedding(bad, w).numpy()
    a = rng.standard_normal((4, 3, 5)).astype(np.float32)
    x = dtorch.distribute_tensor(a, mesh, [Shard(0)])
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(x.reshape(4, 15).numpy(), a.reshape(4, 15))
    np.testing.assert_array_equal(dtorch.cat([x, x], dim=2).numpy(), np.concatenate([a, a], axis=2))
    np.testing.assert_array_equal(x[:, 1:, ::2].numpy(), a[:, 1:, ::2])
    np.testing.assert_array_equal(dtorch.triu(x).numpy(), np.triu(a))


def _attention_reference(q, k, v, visible):
    """softmax(q k^T / sqrt(E), keys hidden where visible is False) v in float64, grouped-query heads;
    rows that see no key are zeros. q (B, Hq, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev), visible
    broadcasting to (B, Hq, L, S)."""
    group = q.shape[1] // k.shape[1]
    k, v = (np.repeat(x.astype(np.float64), group, axis=1) for x in (k, v))
    scores = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    visible = np.broadcast_to(visible, scores.shape)
    scores = np.where(visible, scores, -np.inf)
    top = np.where(visible.any(-1, keepdims=True), scores.max(-1, keepdims=True), 0)
    w = np.where(visible, np.exp(scores - top), 0)
    return np.divide(w, w.sum(-1, keepdims=True), out=np.zeros_like(w), where=visible.any(-1, keepdims=True)) @ v


def test_attention(mode):
    """A Llama forward's attention on a cuda mesh, against numpy: causal grouped-query attention with
    the heads split over the devices, and with the query rows split (the second device's rows start
    at 3), a decode step under a bool mask, and ring attention (its blocks and merges)."""
    mesh = _cuda_mesh([0, 1])
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 4, 6, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 6, 16)).astype(np.float32)
    v = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    causal = np.tril(np.ones((6, 6), dtype=bool))
    ref = _attention_reference(q, k, v, causal)
    F = dtorch.nn.functional
    for q_pl, kv_pl in (([Shard(1)], [Shard(1)]), ([Shard(2)], [Replicate()])):
        x, kk, vv = (dtorch.distribute_tensor(a, mesh, pl) for a, pl in ((q, q_pl), (k, kv_pl), (v, kv_pl)))
        got = F.scaled_dot_product_attention(x, kk, vv, is_causal=True, enable_gqa=True).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    mask = np.array([True, False, True, True, False, True])
    x, kk, vv = (dtorch.distribute_tensor(a, mesh, [Replicate()]) for a in (q[:, :, -1:], k, v))
    got = F.scaled_dot_product_attention(x, kk, vv, attn_mask=dtorch.distribute_tensor(mask, mesh, [Replicate()]),
                                         enable_gqa=True).numpy()
    np.testing.assert_allclose(got, _attention_reference(q[:, :, -1:], k, v, mask), rtol=1e-5, atol=1e-5)
    ring = dtorch.DeviceMesh("cuda", [0, 1], mesh_dim_names=("cp",))
    pos = np.arange(6, dtype=np.int64)[None]
    t = [dtorch.distribute_tensor(a, ring, pl) for a, pl in
         ((q, [Shard(2)]), (k, [Shard(2)]), (v, [Shard(2)]), (pos, [Shard(1)]), (pos, [Shard(1)]))]
    np.testing.assert_allclose(F.ring_attention(*t, "cp", is_causal=True).numpy(), ref, rtol=1e-5, atol=1e-5)


def test_topk_and_cumsum(mode):
    """Sampling's ranking on a cuda mesh, against numpy: topk with ties (the lower index first),
    largest and smallest, and cumsum along the vocabulary."""
    mesh = _cuda_mesh([0, 1])
    rng = np.random.default_rng(5)
    logits = rng.integers(-4, 4, (2, 300)).astype(np.float32)  # many ties
    x = dtorch.distribute_tensor(logits, mesh, [Replicate()])
    values, indices = dtorch.topk(x, 20, dim=-1)
    order = np.argsort(-logits, axis=-1, kind="stable")[:, :20]
    np.testing.assert_array_equal(indices.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(logits, order, axis=-1))
    smallest = dtorch.topk(x, 7, dim=-1, largest=False).indices.numpy()
    np.testing.assert_array_equal(smallest, np.argsort(logits, axis=-1, kind="stable")[:, :7])
    probs = rng.random((2, 300)).astype(np.float32)
    y = dtorch.distribute_tensor(probs, mesh, [Shard(0)])
    np.testing.assert_allclose(y.cumsum(-1).numpy(), np.cumsum(probs, axis=-1), rtol=1e-5, atol=1e-5)


# ---- the Llama on cuda meshes ------------------------------------------------------------------------

# name -> (mesh shape, dim names): one actor, and two actors with the weights split (tp) or the
# layers split (pp); every layout fits on one GPU (actors may share it)
LLAMA_LAYOUTS = {"one": ((1,), ("tp",)), "tp2": ((2,), ("tp",)), "pp2": ((2,), ("pp",))}


# The device ids of each model: a device id is one actor of one type for the runtime's life, so the
# cpu models that the cuda ones are compared with run on other ids, and a second cuda model on the
# same ids shares their actors.
FIRST_ID = {"cuda": 0, "cpu": 4}


def _llama(device_type, layout, dtype=None):
    """(model on a `device_type` mesh of the layout, its float32 weights as numpy, its config)."""
    cfg = llama_reference.tiny_config(num_hidden_layers=2)
    sd = llama_reference.random_weights(cfg, 1)
    shape, names = LLAMA_LAYOUTS[layout]
    ids = FIRST_ID[device_type] + np.arange(int(np.prod(shape))).reshape(shape)
    if device_type == "cuda":
        _cuda_mesh(ids.ravel().tolist())  # skips, saying why, where cuda meshes cannot run
    mesh = dtorch.DeviceMesh(device_type, ids, mesh_dim_names=names)
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg), device_mesh=mesh, dtype=dtype)
    parallelize_llama(model, mesh)
    model.load_state_dict(sd)
    return model, sd, cfg


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("layout", list(LLAMA_LAYOUTS))
def test_llama_logits(mode, layout):
    """A whole Llama forward on a cuda mesh: logits against the numpy Llama (llama_reference.py) and
    against the same model on a cpu mesh of the same layout, within 1e-4 relative in float32."""
    model, sd, cfg = _llama("cuda", layout)
    ids = np.random.default_rng(4).integers(0, cfg["vocab_size"], (2, 9))
    got = model(ids).logits.numpy()
    assert got.shape == (2, 9, cfg["vocab_size"])
    assert _rel(got, llama_reference.logits(sd, cfg, ids)) < 1e-4
    on_cpu, _, _ = _llama("cpu", layout)
    assert _rel(got, on_cpu(ids).logits.numpy()) < 1e-4


@pytest.mark.parametrize("layout", ["one", "tp2"])
def test_llama_bfloat16_and_greedy_decode(mode, layout):
    """bfloat16 weights on a cuda mesh give the logits the cpu mesh gives within bfloat16's
    precision, and greedy generation (prefill, then one token a step through the cache) picks the
    tokens the float32 numpy Llama picks."""
    model, sd, cfg = _llama("cuda", layout, dtype=dtorch.bfloat16)
    on_cpu, _, _ = _llama("cpu", layout, dtype=dtorch.bfloat16)
    ids = np.random.default_rng(5).integers(0, cfg["vocab_size"], (2, 6))
    got = model(ids).logits.to(dtorch.float32).numpy()
    assert _rel(got, on_cpu(ids).logits.to(dtorch.float32).numpy()) < 2e-2
    f32, _, _ = _llama("cuda", layout)
    out = np.asarray(f32.generate(ids, 4, eos_token_id=None))
    seq = ids
    for _ in range(4):  # the reference's greedy tokens, one forward per token
        seq = np.concatenate([seq, llama_reference.logits(sd, cfg, seq)[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out, seq)


VAE_TINY = dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, latent_channels=4)


@pytest.mark.parametrize("ids", [[0], [0, 1]])
def test_vae_decode_and_encode(mode, ids):
    """The image ops on a cuda mesh (conv2d, group_norm, nearest upsampling, the encoder's padding)
    inside a whole AutoencoderKL: decode and encode against the numpy VAE (vae_reference.py),
    within 1e-4 relative in float32, a batch of 3 split over the devices."""
    mesh = _cuda_mesh(ids)
    dtorch.manual_seed(0)
    model = AutoencoderKL.from_config(VAE_TINY, device_mesh=mesh)
    rng = np.random.default_rng(3)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    sd = {k: (v + 0.2 * rng.standard_normal(v.shape)).astype(np.float32) if "norm" in k else v
          for k, v in sd.items()}  # norms off their ones and zeros, so that they count too
    model.load_state_dict(sd)
    placements = [Shard(0)] if len(ids) > 1 else [Replicate()]
    z = rng.standard_normal((3, 4, 8, 8)).astype(np.float32)
    got = model.decode(dtorch.distribute_tensor(z, mesh, placements)).sample.numpy()
    assert got.shape == (3, 3, 16, 16)
    assert _rel(got, vae_reference.decode(sd, VAE_TINY, z)) < 1e-4
    x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    mean, _, std, _ = vae_reference.encode(sd, VAE_TINY, x)
    posterior = model.encode(dtorch.distribute_tensor(x, mesh, placements)).latent_dist
    assert _rel(posterior.mean.numpy(), mean) < 1e-4
    assert _rel(posterior.std.numpy(), std) < 1e-4


def test_profiler_shows_gpu_time(mode):
    """On a cuda mesh the profiler's events are when the GPU ran each record's work (CUDA events),
    inside the block, in order, not overlapping on one device's stream."""
    mesh = _cuda_mesh([0, 1])
    x = dtorch.randn((512, 512), device_mesh=mesh, placements=[Shard(0)])
    w = dtorch.randn((512, 512), device_mesh=mesh, placements=[Replicate()])
    x.numpy()
    t_enter = time.monotonic_ns()
    with dtorch.profiler.profile(mesh) as prof:
        y = x
        for _ in range(8):
            y = dtorch.tanh(y @ w)
        y.numpy()
    t_exit = time.monotonic_ns()
    for d in (0, 1):
        events = [e for e in prof.events() if e["device"] == d]
        assert [e["name"] for e in events if e["record"] == "compute"] == ["matmul", "tanh"] * 8
        for a, b in zip(events, events[1:]):
            assert t_enter <= a["begin_ns"] <= a["end_ns"] <= b["begin_ns"] <= b["end_ns"] <= t_exit
        assert sum(e["end_ns"] - e["begin_ns"] for e in events if e["name"] == "matmul") > 0
