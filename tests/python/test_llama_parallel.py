"""Pipeline and context parallelism on the Llama, against the independent numpy Llama
(llama_reference.py): logits within 1e-4 relative and greedy generation equal to one device's, for
pp2, pp3 (3 layers on 3 stages and 4 on 3), ulysses2, ring2/3/4 and their combinations with dp and
tp (up to 16 devices), with 1, 2 and 4 key/value heads under ulysses, uneven batches and sequences; stage meshes, layer assignment, the zig-zag
order (hand tables); proof that Ulysses attends whole sequences on split heads; a stage's worker
killed mid-generation fails the pending futures naming the device while other meshes keep working."""
import os
import signal

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from conftest import worker_pids
from dtorch import Replicate, Shard
from dtorch.models import LlamaConfig, LlamaForCausalLM, StaticCache, parallelize_llama
from dtorch.models.cache_utils import RingStaticCache
from dtorch.parallel.context import zigzag_order
from dtorch.parallel import ScheduleGPipe
from dtorch.parallel.pipeline import microbatch_slices, stage_layers

TOL = 1e-4

# name -> (mesh shape, dim names, config overrides)
MESHES = {
    "pp2": ((2,), ("pp",), {}),
    "pp2-4layers": ((2,), ("pp",), dict(num_hidden_layers=4)),
    "pp3-3layers": ((3,), ("pp",), dict(num_hidden_layers=3)),
    "pp3-4layers": ((3,), ("pp",), dict(num_hidden_layers=4)),
    "ulysses2": ((2,), ("ulysses",), dict(num_key_value_heads=4)),
    "dp2-tp2-pp2": ((2, 2, 2), ("dp", "tp", "pp"), dict(num_hidden_layers=4)),
    "pp2-tp2-ulysses2": ((2, 2, 2), ("pp", "tp", "ulysses"), dict(num_key_value_heads=4)),
    "tp2-ulysses2": ((2, 2), ("tp", "ulysses"), dict(num_key_value_heads=4)),
    "ring2": ((2,), ("ring",), {}),
    "ring3": ((3,), ("ring",), {}),
    "ring4": ((4,), ("ring",), {}),
    "tp2-ring2": ((2, 2), ("tp", "ring"), {}),
    "ulysses2-ring2": ((2, 2), ("ulysses", "ring"), dict(num_key_value_heads=4)),
    "pp2-ring2": ((2, 2), ("pp", "ring"), dict(num_hidden_layers=4)),
    "dp2-pp2-ring2-ulysses2": ((2, 2, 2, 2), ("dp", "pp", "ring", "ulysses"), dict(num_key_value_heads=4)),
    # fewer k/v heads than tp x ulysses: each repeated over the devices whose query heads read it
    "ulysses2-kv1": ((2,), ("ulysses",), dict(num_key_value_heads=1)),
    "ulysses2-kv2": ((2,), ("ulysses",), {}),
    "tp2-ulysses2-kv1": ((2, 2), ("tp", "ulysses"), dict(num_key_value_heads=1)),
    "tp2-ulysses2-kv2": ((2, 2), ("tp", "ulysses"), {}),
    "ulysses2-tp2-kv2": ((2, 2), ("ulysses", "tp"), {}),
    "pp2-tp2-ulysses2-kv1": ((2, 2, 2), ("pp", "tp", "ulysses"), dict(num_key_value_heads=1)),
    "pp2-tp2-ulysses2-kv2": ((2, 2, 2), ("pp", "tp", "ulysses"), {}),
    "ring2-ulysses2-kv1": ((2, 2), ("ring", "ulysses"), dict(num_key_value_heads=1)),
    "ulysses2-ring2-kv2": ((2, 2), ("ulysses", "ring"), {}),
}


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def tokens(shape, seed=0, vocab=61):
    return np.random.default_rng(seed).integers(0, vocab, shape)


def build(shape, names, overrides=None, **plan):
    cfg = ref.tiny_config(**(overrides or {}))
    sd = ref.random_weights(cfg, 1)
    mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg), device_mesh=mesh)
    parallelize_llama(model, mesh, **plan)
    model.load_state_dict(sd, strict=not cfg.get("tie_word_embeddings"))
    model.tie_weights()
    return model, sd, cfg


# ---- pieces, against hand tables ------------------------------------------------------------------

def test_unbind_gives_stage_meshes():
    mesh = dtorch.init_device_mesh("cpu", (2, 3, 2), mesh_dim_names=("dp", "pp", "tp"))
    stages = mesh.unbind("pp")
    assert [s.tolist() for s in stages] == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 11]]]
    assert all(s.mesh_dim_names == ("dp", "tp") and s._get_root_mesh() is s for s in stages)
    assert [s.tolist() for s in dtorch.DeviceMesh("cpu", [4, 7], mesh_dim_names=("pp",)).unbind("pp")] == [[4], [7]]
    with pytest.raises(KeyError, match="'ep'"):
        mesh.unbind("ep")


def test_stage_layers():
    assert [list(r) for r in stage_layers(4, 3)] == [[0, 1], [2], [3]]
    assert [list(r) for r in stage_layers(3, 3)] == [[0], [1], [2]]
    assert [list(r) for r in stage_layers(5, 2, [1, 4])] == [[0], [1, 2, 3, 4]]
    with pytest.raises(ValueError, match="layers_per_stage"):
        stage_layers(4, 2, [1, 2])
    assert microbatch_slices(5, 2) == [slice(0, 3), slice(3, 5)]
    assert microbatch_slices(2, 4) == [slice(0, 1), slice(1, 2)]


@pytest.mark.usefixtures("thread_runtime")
def test_schedule_gpipe_runs_groups_of_rows():
    """ScheduleGPipe wraps any module's forward from outside: 5 rows in 3 micro-batches run as
    forwards of 2, 2 and 1 rows (torch.chunk's split), row arrays cut and other arguments whole,
    and the outputs join on the batch dim."""
    class Rows(dtorch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = []

        def forward(self, input_ids, scale=1.0, offsets=None):
            self.calls.append((input_ids.shape[0], scale, None if offsets is None else offsets.shape))
            x = dtorch.distribute_tensor(np.asarray(input_ids, np.float32), dtorch.DeviceMesh("cpu", [0]))
            return x * scale + (0 if offsets is None else dtorch.distribute_tensor(offsets, x.device_mesh))

    module = Rows()
    ScheduleGPipe(3)._apply(module)
    ids = np.arange(10, dtype=np.float32).reshape(5, 2)
    offsets = np.ones((1, 2), np.float32)                         # one row: serves every group, not cut
    np.testing.assert_array_equal(module(ids.tolist(), 2.0, offsets=offsets).numpy(), ids * 2 + 1)
    assert module.calls == [(2, 2.0, (1, 2)), (2, 2.0, (1, 2)), (1, 2.0, (1, 2))]
    assert module.pipeline_schedule.microbatches(5) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    module.calls.clear()
    assert module.pipeline_schedule.call_microbatch(module, input_ids=ids).shape == (5, 2)   # one group: whole
    assert module.calls == [(5, 1.0, None)]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n_microbatches must be a positive int"):
            ScheduleGPipe(bad)


@pytest.mark.usefixtures("thread_runtime")
def test_parallelism_is_applied_to_a_built_model_from_outside():
    """One model object, built and loaded on one device and run there, then laid out over dp x pp x
    ring x ulysses by parallelize_llama: the same logits as the reference, and its classes untouched
    (the model's forward is the single-device one; only instances got styles, slots and a schedule)."""
    cfg = ref.tiny_config(num_hidden_layers=4, num_key_value_heads=4)
    sd = ref.random_weights(cfg, 3)
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg), device_mesh=dtorch.DeviceMesh("cpu", [0]))
    model.load_state_dict(sd)
    ids = tokens((4, 8), seed=4)
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL
    mesh = dtorch.init_device_mesh("cpu", (2, 2, 2, 2), mesh_dim_names=("dp", "pp", "ring", "ulysses"))
    parallelize_llama(model, mesh)
    assert model.model.layers[3].self_attn.q_proj.weight.device_mesh == mesh.unbind("pp")[1]
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL
    assert model.cache_class is RingStaticCache and LlamaForCausalLM.cache_class is StaticCache
    with pytest.raises(ValueError, match="ring attention needs a cache that knows its slots' positions"):
        model(ids, past_key_values=StaticCache(9))


def test_zigzag_order():
    assert zigzag_order(8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert zigzag_order(13, 2).tolist() == [0, 1, 2, 3, 10, 11, 12, 4, 5, 6, 7, 8, 9]
    assert zigzag_order(8, 4).tolist() == [0, 7, 1, 6, 2, 5, 3, 4]
    assert zigzag_order(3, 4).tolist() == [0, 1, 2]
    assert sorted(zigzag_order(29, 3).tolist()) == list(range(29))


# ---- the model -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def single():
    """Greedy generations of the one-device model, by config overrides."""
    return {}


@pytest.mark.usefixtures("thread_runtime")
@pytest.mark.parametrize("name", list(MESHES))
def test_logits_and_generation(name, single):
    shape, names, overrides = MESHES[name]
    model, sd, cfg = build(shape, names, overrides)
    for ids in (tokens((3, 7)), tokens((2, 13), seed=3)):
        logits = model(ids).logits
        assert logits.shape == ids.shape + (61,)
        assert rel(logits.numpy(), ref.logits(sd, cfg, ids)) < TOL, name
    prompt = tokens((3, 5), seed=5)
    key = tuple(sorted(overrides.items()))
    if key not in single:
        one, _, _ = build((1,), None, overrides)
        single[key] = one.generate(prompt, 6)
    np.testing.assert_array_equal(model.generate(prompt, 6), single[key])


@pytest.mark.usefixtures("thread_runtime")
def test_parameters_live_on_their_stage():
    model, _, _ = build((2, 3), ("tp", "pp"), dict(num_hidden_layers=4))
    stages = [set(m.mesh.ravel().tolist()) for m in dtorch.init_device_mesh(
        "cpu", (2, 3), mesh_dim_names=("tp", "pp")).unbind("pp")]
    assert stages == [{0, 3}, {1, 4}, {2, 5}]
    where = {name: set(p.device_mesh.mesh.ravel().tolist()) for name, p in model.named_parameters()}
    assert where["model.embed_tokens.weight"] == stages[0]
    assert where["model.layers.0.self_attn.q_proj.weight"] == where["model.layers.1.mlp.up_proj.weight"] == stages[0]
    assert where["model.layers.2.input_layernorm.weight"] == stages[1]
    assert where["model.layers.3.self_attn.o_proj.weight"] == stages[2]
    assert where["model.norm.weight"] == where["lm_head.weight"] == stages[2]
    assert model.model.layers[0].self_attn.q_proj.weight.placements == (Shard(0),)
    assert model.pipeline_schedule.n_microbatches == 3


@pytest.mark.usefixtures("thread_runtime")
def test_layers_per_stage_and_microbatches():
    model, sd, cfg = build((2,), ("pp",), dict(num_hidden_layers=4), layers_per_stage=[3, 1], num_microbatches=4)
    assert model.model.layers[2].self_attn.q_proj.weight.device_mesh.tolist() == [0]
    assert model.model.layers[3].self_attn.q_proj.weight.device_mesh.tolist() == [1]
    ids = tokens((5, 6))
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL   # 4 micro-batches of 2, 1, 1, 1 rows
    one, _, _ = build((1,), None, dict(num_hidden_layers=4))
    np.testing.assert_array_equal(model.generate(ids, 4), one.generate(ids, 4))


@pytest.mark.usefixtures("thread_runtime")
@pytest.mark.parametrize("name", ["dp2-pp2", "ring2", "ring3", "ulysses2", "pp2-ring2"])
def test_sampling_and_padding_match_one_device(name):
    shape, names, overrides = {"dp2-pp2": ((2, 2), ("dp", "pp"), {})}.get(name) or MESHES[name]
    model, _, _ = build(shape, names, overrides)
    one, _, _ = build((1,), None, overrides)
    ids = tokens((4, 5), seed=7)
    mask = np.ones_like(ids)
    mask[1, :2] = 0
    mask[3, :1] = 0
    kw = dict(do_sample=True, temperature=0.8, top_k=20, seed=11, attention_mask=mask)
    np.testing.assert_array_equal(model.generate(ids, 5, **kw), one.generate(ids, 5, **kw))


@pytest.mark.usefixtures("thread_runtime")
@pytest.mark.parametrize("kv_heads,k_heads", [(4, 4), (1, 2)])
def test_ulysses_attends_whole_sequences_on_split_heads(kv_heads, k_heads):
    """q and k/v split on whole heads over the whole sequence; one k/v head is repeated so that
    each device holds it whole (k_heads: the heads k has then, over both devices)."""
    model, sd, cfg = build((2,), ("ulysses",), dict(num_key_value_heads=kv_heads))
    seen = []
    attn = model.model.layers[0].self_attn
    inner = attn.attention

    def spy(q, k, v, inputs, scale):
        seen.append((q.shape, q.placements, k.shape, k.placements))
        return inner(q, k, v, inputs, scale)

    attn.attention = spy
    ids = tokens((2, 9))
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL
    # the whole sequence of 9, the 4 heads split over the 2 devices
    assert seen == [((2, 4, 9, 8), (Shard(1),), (2, k_heads, 9, 8), (Shard(1),))]
    h = model.model.embed_tokens(dtorch.distribute_tensor(ids, model.model.embed_tokens.weight.device_mesh))
    assert h.placements == (Replicate(),)   # before the hooks: the sequence is split by the model's input hook


@pytest.mark.usefixtures("thread_runtime")
def test_ring_prefill_is_zigzag_and_decode_reads_slots_in_place():
    model, sd, cfg = build((2,), ("ring",))
    seen = []
    attn = model.model.layers[1].self_attn
    inner = attn.attention

    def spy(q, k, v, inputs, scale):
        seen.append((q.shape[2], q.placements, k.shape[2], k.placements, inputs.query_index.numpy()))
        return inner(q, k, v, inputs, scale)

    attn.attention = spy
    ids = tokens((2, 8))
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL
    L, q_pl, S, k_pl, positions = seen.pop()
    assert (L, S, q_pl, k_pl) == (8, 8, (Shard(2),), (Shard(2),))
    assert positions.tolist() == [[0, 1, 6, 7, 2, 3, 4, 5]]          # device 0: 0 1 6 7, device 1: 2 3 4 5
    out = model.generate(ids[:, :5], 3)
    one, _, _ = build((1,), None)
    np.testing.assert_array_equal(out, one.generate(ids[:, :5], 3))
    prefill, decode = seen[0], seen[1:]
    assert prefill[:4] == (5, (Shard(2),), 8, (Shard(2),))            # the cache's 8 slots split on the ring
    assert [d[:4] for d in decode] == [(1, (Replicate(),), 8, (Shard(2),))] * 2
    assert [d[4].tolist() for d in decode] == [[[5]], [[6]]]


@pytest.mark.usefixtures("thread_runtime")
def test_parallel_plan_errors():
    def on(shape, names, **overrides):
        cfg = LlamaConfig.from_dict(ref.tiny_config(**overrides))
        mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
        return parallelize_llama(LlamaForCausalLM(cfg, device_mesh=mesh), mesh)

    with pytest.raises(ValueError, match="ulysses=3 does not divide the 4 query heads"):
        on((3,), ("ulysses",))
    with pytest.raises(ValueError, match=r"ulysses=2: tp x ulysses = 2 neither divides num_key_value_heads=3"):
        on((2,), ("ulysses",), num_attention_heads=6, num_key_value_heads=3, head_dim=8)
    with pytest.raises(ValueError, match=r"ulysses=4: tp x ulysses = 8 neither divides num_key_value_heads=6"):
        on((2, 4), ("tp", "ulysses"), num_attention_heads=24, num_key_value_heads=6, head_dim=8)
    with pytest.raises(ValueError, match="layers_per_stage"):
        cfg = LlamaConfig.from_dict(ref.tiny_config())
        mesh = dtorch.init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
        parallelize_llama(LlamaForCausalLM(cfg, device_mesh=mesh), mesh, layers_per_stage=[2, 1])
    with pytest.raises(ValueError, match="unknown mesh dim name 'cp'"):
        on((2,), ("cp",))


@pytest.mark.parametrize("name", ["pp2-tp2", "pp2-ring2", "tp2-ulysses2", "ring3", "tp2-ulysses2-kv1",
                                  "ring2-ulysses2-kv1"])
def test_process_workers(process_mode, name):
    shape, names, overrides = {"pp2-tp2": ((2, 2), ("pp", "tp"), {})}.get(name) or MESHES[name]
    model, sd, cfg = build(shape, names, overrides)
    ids = tokens((3, 7))
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL
    one, _, _ = build((1,), None, overrides)
    np.testing.assert_array_equal(model.generate(ids[:, :5], 4), one.generate(ids[:, :5], 4))


def test_stage_killed_mid_generation(process_mode):
    """Stage 1's worker dies while tokens are in flight: the pending futures fail naming the device,
    and meshes of other devices keep working."""
    model, _, _ = build((2,), ("pp",))
    steps = model.stream(tokens((2, 4)), 10_000)
    next(steps)
    os.kill(worker_pids()[1], signal.SIGKILL)
    with pytest.raises(Exception) as info:
        for _ in steps:   # 10,000 steps: far more than a dead stage lets run
            pass
    assert "device 1" in str(info.value)
    other = dtorch.DeviceMesh("cpu", [2, 3])
    x = dtorch.distribute_tensor(np.arange(6, dtype=np.float32), other, [Shard(0)])
    np.testing.assert_array_equal((x * 2).numpy(), np.arange(6) * 2)
    np.testing.assert_array_equal(dtorch.ones(3, device_mesh=dtorch.DeviceMesh("cpu", [0])).numpy(), np.ones(3))


@pytest.mark.usefixtures("thread_runtime")
@pytest.mark.parametrize("shape,names", [((2,), ("pp",)), ((2, 2), ("tp", "pp")), ((2, 2), ("pp", "ring"))])
def test_from_pretrained_tied_on_stages(tmp_path, shape, names):
    """A tied checkpoint (no lm_head.weight in it) on a pipeline: lm_head's copy on the last stage
    holds the embedding's values, each device reading only its slices."""
    cfg = ref.tiny_config(tie_word_embeddings=True)
    sd = ref.random_weights(cfg, 2)
    one = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    one.load_state_dict(sd, strict=False)
    one.tie_weights()
    one.save_pretrained(tmp_path)
    mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=mesh, num_microbatches=3)
    last = mesh.unbind("pp")[-1]
    assert model.lm_head.weight.device_mesh == last and model.model.embed_tokens.weight.device_mesh != last
    ids = tokens((3, 9))
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL


@pytest.mark.usefixtures("thread_runtime")
def test_ring_cache_keeps_each_block_on_its_device():
    """The ring's cache is laid out per device: a device's prefill block stays where it is (no byte
    moves for the write), later tokens go to the emptiest block; logits equal the reference."""
    model, sd, cfg = build((2,), ("ring",))
    mesh = model.model.embed_tokens.weight.device_mesh
    ids = tokens((1, 10), seed=9)
    cache = model.cache_class(11)
    assert isinstance(cache, RingStaticCache)
    before = [s["peer_bytes_sent"] for s in dtorch.device_stats(mesh)]
    cache.update_key_index(dtorch.distribute_tensor(zigzag_order(8, 2)[None], mesh, [Shard(1)]), 0)
    k = dtorch.distribute_tensor(np.ones((1, 2, 8, 8), np.float32), mesh, [Shard(2)])
    cache.update(0, k, k, 0)
    assert [s["peer_bytes_sent"] for s in dtorch.device_stats(mesh)] == before
    assert [p.tolist() for p in cache.key_index.to_local()] == [[[0, 1, 6, 7, -1, -1]], [[2, 3, 4, 5, -1, -1]]]

    cache = model.cache_class(11)
    logits = [model(ids[:, :8], past_key_values=cache).logits[:, -1]]
    for t in (8, 9):
        logits.append(model(ids[:, t:t + 1], past_key_values=cache).logits[:, -1])
    assert [p.tolist() for p in cache.key_index.to_local()] == [[[0, 1, 6, 7, 8, -1]], [[2, 3, 4, 5, 9, -1]]]
    want = ref.logits(sd, cfg, ids[:, :10])
    for got, t in zip(logits, (7, 8, 9)):
        assert rel(got.numpy(), want[:, t]) < TOL


@pytest.mark.usefixtures("thread_runtime")
def test_activations_hop_worker_to_worker():
    """pp2: the hidden states (B, L, E) go from stage 0's device to stage 1's as a peer message; the
    position ids and RoPE's frequencies ride along once (not once per layer)."""
    model, _, cfg = build((2,), ("pp",), dict(num_hidden_layers=4), num_microbatches=1)
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    ids = tokens((2, 5))
    model(ids).logits.numpy()
    before = dtorch.device_stats(mesh)
    model(ids).logits.numpy()
    after = dtorch.device_stats(mesh)
    sent = [a["peer_bytes_sent"] - b["peer_bytes_sent"] for a, b in zip(after, before)]
    received = [a["peer_messages_received"] - b["peer_messages_received"] for a, b in zip(after, before)]
    hidden = 2 * 5 * cfg["hidden_size"] * 4
    positions = 5 * 8                       # (1, 5) int64; plain causal attention: no mask
    inv_freq = cfg["hidden_size"] // cfg["num_attention_heads"] // 2 * 4   # RoPE's (D/2,) float32
    assert sent == [hidden + positions + inv_freq, 0]
    assert received == [0, 3]


@pytest.mark.usefixtures("thread_runtime")
@pytest.mark.parametrize("name", ["ring4", "ulysses2-ring2"])
def test_prompts_shorter_than_the_context_parallel_devices(name):
    """1..3 prompt tokens on 4 context-parallel devices: the forward stays replicated on them (the
    cache then keeps slot = position) and generation equals one device's."""
    shape, names, overrides = MESHES[name]
    model, _, _ = build(shape, names, overrides)
    one, _, _ = build((1,), None, overrides)
    for P in (1, 2, 3):
        ids = tokens((2, P), seed=P)
        np.testing.assert_array_equal(model.generate(ids, 5), one.generate(ids, 5))
