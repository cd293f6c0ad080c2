"""LlamaForCausalLM against the independent numpy Llama (llama_reference.py): logits within 1e-4
relative (float32) on every mesh (single, dp2, tp2, dp2 x tp2, tp4), with an uneven batch (3 rows on
dp2), GQA and MQA (k/v heads split, or replicated when tp is a multiple of them), tied and untied
embeddings, biases and llama3 rope scaling; the KV cache (decode equals a full recompute); greedy
generation (equals the argmax of recomputed logits); sampling (reproducible by seed, the same on
every mesh); left padding (equals the prompts run one by one); eos, streamers and bad input."""
import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch import Replicate, Shard
from dtorch.models import LlamaConfig, LlamaForCausalLM, StaticCache, parallelize_llama

MESHES = {
    "1": ((1,), None),
    "dp2": ((2,), ("dp",)),
    "tp2": ((2,), ("tp",)),
    "dp2xtp2": ((2, 2), ("dp", "tp")),
    "tp4": ((4,), ("tp",)),
}
LLAMA3 = dict(rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                     high_freq_factor=4.0, original_max_position_embeddings=16))
VARIANTS = {
    "gqa": {},
    "mqa": dict(num_key_value_heads=1),
    "mha": dict(num_key_value_heads=4),
    "tied": dict(tie_word_embeddings=True),
    "bias": dict(attention_bias=True, mlp_bias=True),
    "llama3": LLAMA3,
}
TOL = 1e-4


pytestmark = pytest.mark.usefixtures("thread_runtime")


def mesh_of(name):
    shape, names = MESHES[name]
    return dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)


def build(cfg, mesh_name, seed=1):
    """(model on the mesh, its weights as numpy)."""
    sd = ref.random_weights(cfg, seed)
    mesh = mesh_of(mesh_name)
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg), device_mesh=mesh)
    parallelize_llama(model, mesh)
    model.load_state_dict(sd, strict=not cfg.get("tie_word_embeddings"))
    model.tie_weights()
    return model, sd


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def tokens(shape, seed=0, vocab=61):
    return np.random.default_rng(seed).integers(0, vocab, shape)


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_reference(variant, mesh_name):
    cfg = ref.tiny_config(**VARIANTS[variant])
    model, sd = build(cfg, mesh_name)
    ids = tokens((3, 7))
    logits = model(ids).logits
    assert logits.shape == (3, 7, 61)
    assert rel(logits.numpy(), ref.logits(sd, cfg, ids)) < TOL
    dp = mesh_name.startswith("dp")
    tp = "tp" in mesh_name
    want = tuple(p for p, on in ((Shard(0), dp), (Shard(2), tp)) if on) or (Replicate(),)
    assert logits.placements == want


def test_variants_are_not_vacuous():
    ids = tokens((1, 12))
    base = ref.tiny_config()
    sd = ref.random_weights(base, 1)
    assert rel(ref.logits(sd, ref.tiny_config(**LLAMA3), ids), ref.logits(sd, base, ids)) > 1e-3
    assert rel(ref.logits(sd, ref.tiny_config(tie_word_embeddings=True), ids), ref.logits(sd, base, ids)) > 1e-1


def test_parameter_layouts_on_dp_tp():
    model, _ = build(ref.tiny_config(num_key_value_heads=1), "dp2xtp2")
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.placements == (Replicate(), Shard(0))
    assert attn.k_proj.weight.placements == (Replicate(), Replicate())   # MQA: the one k/v head replicated
    assert attn.o_proj.weight.placements == (Replicate(), Shard(1))
    assert model.model.layers[0].mlp.down_proj.weight.placements == (Replicate(), Shard(1))
    assert model.model.embed_tokens.weight.placements == (Replicate(), Shard(0))
    assert model.lm_head.weight.placements == (Replicate(), Shard(0))
    assert model.model.norm.weight.placements == (Replicate(), Replicate())
    assert all(p.device_mesh.shape == (2, 2) for p in model.parameters())
    tied, _ = build(ref.tiny_config(tie_word_embeddings=True), "tp2")
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


def test_uneven_batch_and_process_workers(process_mode):
    cfg = ref.tiny_config()
    model, sd = build(cfg, "tp2")
    ids = tokens((3, 6), seed=4)
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL
    model, sd = build(cfg, "dp2")
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL
    assert model.generate(ids[:, :3], 3).shape == (3, 6)


@pytest.mark.parametrize("mesh_name", ["1", "tp2", "dp2xtp2", "tp4"])
@pytest.mark.parametrize("variant", ["gqa", "mqa"])
def test_cache_decode_equals_full_recompute(variant, mesh_name):
    cfg = ref.tiny_config(**VARIANTS[variant])
    model, sd = build(cfg, mesh_name)
    ids = tokens((3, 9), seed=2)
    want = ref.logits(sd, cfg, ids)
    cache = StaticCache(12)
    out = model(ids[:, :5], past_key_values=cache)
    assert out.past_key_values is cache and cache.get_seq_length() == 5
    assert rel(out.logits.numpy(), want[:, :5]) < TOL
    for t in range(5, 9):
        step = model(ids[:, t:t + 1], past_key_values=cache).logits.numpy()
        assert rel(step[:, 0], want[:, t]) < TOL
    assert cache.get_seq_length() == 9
    heads = {"gqa": 2, "mqa": 1}[variant]
    if mesh_name == "tp4" or (mesh_name != "1" and variant == "mqa"):
        heads = 4 if mesh_name == "tp4" else 2          # k/v heads replicated: one per tp device
    assert cache.key_cache[0].shape == (3, heads, 12, cfg["hidden_size"] // cfg["num_attention_heads"])
    with pytest.raises(ValueError, match="cache"):
        model(ids[:, :4], past_key_values=cache)
    out = model(ids[:, :4], use_cache=True)
    assert out.past_key_values.max_cache_len == 4


def greedy_reference(sd, cfg, ids, n):
    seq = np.asarray(ids)
    for _ in range(n):
        seq = np.concatenate([seq, ref.logits(sd, cfg, seq)[:, -1].argmax(-1)[:, None]], axis=1)
    return seq


@pytest.mark.parametrize("mesh_name", ["1", "tp2", "dp2xtp2", "tp4"])
def test_greedy_generate_equals_argmax_of_recomputed_logits(mesh_name):
    cfg = ref.tiny_config()
    model, sd = build(cfg, mesh_name)
    ids = tokens((3, 4), seed=5)
    out = model.generate(ids, max_new_tokens=6)
    assert out.dtype == np.int64 and out.shape == (3, 10)
    np.testing.assert_array_equal(out, greedy_reference(sd, cfg, ids, 6))
    np.testing.assert_array_equal(model.generate(ids[0], max_new_tokens=2), out[:1, :6])


def test_sampling_reproducible_and_the_same_on_every_mesh():
    cfg = ref.tiny_config()
    ids = tokens((3, 4), seed=6)
    settings = [dict(), dict(temperature=0.7), dict(top_k=5), dict(top_p=0.8), dict(temperature=1.3, top_k=20, top_p=0.9)]
    results = {}
    for mesh_name in ("1", "tp2", "dp2xtp2", "tp4"):
        model, sd = build(cfg, mesh_name)
        results[mesh_name] = [model.generate(ids, 8, do_sample=True, seed=11, **s) for s in settings]
        again = model.generate(ids, 8, do_sample=True, seed=11, **settings[-1])
        np.testing.assert_array_equal(again, results[mesh_name][-1])
        other = model.generate(ids, 8, do_sample=True, seed=12, **settings[-1])
        assert not np.array_equal(other, again)
        greedy = model.generate(ids, 8)
        np.testing.assert_array_equal(model.generate(ids, 8, do_sample=True, seed=3, top_k=1), greedy)
        np.testing.assert_array_equal(model.generate(ids, 8, do_sample=True, seed=3, top_p=0.0), greedy)
    for mesh_name, got in results.items():
        for a, b in zip(got, results["1"]):
            np.testing.assert_array_equal(a, b, err_msg=mesh_name)
    assert not np.array_equal(results["1"][0], model.generate(ids, 8))


def test_top_k_keeps_only_the_k_best():
    cfg = ref.tiny_config()
    model, sd = build(cfg, "tp2")
    ids = tokens((1, 3), seed=8)
    best = np.argsort(-ref.logits(sd, cfg, ids)[0, -1])[:3]
    picked = {int(model.generate(ids, 1, do_sample=True, seed=s, top_k=3, temperature=5.0)[0, -1])
              for s in range(40)}
    assert picked <= set(best.tolist()) and len(picked) > 1


@pytest.mark.parametrize("mesh_name", ["1", "dp2xtp2"])
def test_left_padding_equals_prompts_one_by_one(mesh_name):
    cfg = ref.tiny_config()
    model, sd = build(cfg, mesh_name)
    prompts = [tokens(3, seed=1), tokens(6, seed=2), tokens(1, seed=3)]
    P = 6
    batch, mask = np.zeros((3, P), np.int64), np.zeros((3, P), np.int64)
    for i, p in enumerate(prompts):
        batch[i, P - len(p):], mask[i, P - len(p):] = p, 1
    out = model.generate(batch, 5, attention_mask=mask)
    for i, p in enumerate(prompts):
        alone = model.generate(p[None], 5)
        np.testing.assert_array_equal(out[i, P:], alone[0, len(p):])
        np.testing.assert_array_equal(alone, greedy_reference(sd, cfg, p[None], 5))
    positions = np.where(mask, np.cumsum(mask, 1) - 1, 1)
    logits = model(batch, attention_mask=mask, position_ids=positions).logits.numpy()
    want = ref.logits(sd, cfg, batch, attention_mask=mask, position_ids=positions)
    real = mask.astype(bool)
    assert rel(logits[real], want[real]) < TOL


def test_eos_pad_and_streamers():
    cfg = ref.tiny_config()
    model, sd = build(cfg, "tp2")
    ids = tokens((2, 3), seed=9)
    free = model.generate(ids, 6)
    eos = int(free[0, 4])                                  # row 0 makes it at its second new token
    out = model.generate(ids, 6, eos_token_id=eos, pad_token_id=0)
    assert out[0, 4] == eos and (out[0, 5:] == 0).all()
    stops = [int(np.argmax(row[3:] == eos)) if (row[3:] == eos).any() else None for row in free]
    for r, stop in enumerate(stops):
        if stop is None:
            np.testing.assert_array_equal(out[r], free[r, :out.shape[1]])
    both = model.generate(ids, 6, eos_token_id=[int(free[0, 3]), int(free[1, 3])])
    assert both.shape == (2, 4)                            # every row done after one token: stop

    class Recorder:
        def __init__(self):
            self.put_calls, self.ended = [], 0

        def put(self, value):
            self.put_calls.append(np.array(value))

        def end(self):
            self.ended += 1

    rec = Recorder()
    out = model.generate(ids, 4, streamer=rec)
    np.testing.assert_array_equal(rec.put_calls[0], ids)
    np.testing.assert_array_equal(np.stack(rec.put_calls[1:], 1), out[:, 3:])
    assert rec.ended == 1
    steps = list(model.stream(ids, 4))
    assert len(steps) == 4 and all(s.shape == (2,) for s in steps)
    np.testing.assert_array_equal(np.stack(steps, 1), out[:, 3:])


def test_bad_input():
    cfg = ref.tiny_config()
    model, _ = build(cfg, "1")
    with pytest.raises(ValueError, match="token id 61 is out of range"):
        model(np.array([[1, 61]]))
    with pytest.raises(ValueError, match="token id -1"):
        model.generate(np.array([[-1, 2]]), 2)
    with pytest.raises(ValueError, match="shape"):
        model(np.zeros((1, 2, 3), np.int64))
    with pytest.raises(ValueError, match="temperature"):
        model.generate(np.array([[1]]), 2, do_sample=True, temperature=0)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(np.array([[1]]), 2, do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match="attention_mask"):
        model.generate(np.array([[1, 2]]), 2, attention_mask=np.ones((1, 3)))
    assert model.generate(np.array([[1, 2]]), 0).shape == (1, 2)
    for bad in (-1, -5):
        with pytest.raises(ValueError, match=f"max_new_tokens must be >= 0, got {bad}"):
            model.generate(np.array([[1, 2]]), bad)
        with pytest.raises(ValueError, match="max_new_tokens"):
            model.stream(np.array([[1, 2]]), max_new_tokens=bad)
    with pytest.raises(TypeError, match="max_new_tokens must be an int"):
        model.generate(np.array([[1, 2]]), 2.5)
    for bad in (-1.0, float("nan"), float("-inf")):
        with pytest.raises(ValueError, match="temperature must be a positive float"):
            model.generate(np.array([[1]]), 2, do_sample=True, temperature=bad)


@pytest.mark.parametrize("mesh_name", ["1", "tp2"])
def test_tiny_and_huge_temperatures(mesh_name):
    """The sample of softmax(logits / T) tends to the argmax as T -> 0: a positive temperature far
    below float32's range samples the greedy tokens (numpy's argmax), with top-k and top-p too and
    captured or not; a huge one samples every token of the vocabulary alike (valid ids, not the
    argmax's)."""
    cfg = ref.tiny_config()
    model, sd = build(cfg, mesh_name)
    ids = tokens((3, 4), seed=5)
    want = greedy_reference(sd, cfg, ids, 6)
    for T in (1e-46, 1e-40, 1e-38, 1e-30, 1e-8):
        for extra in (dict(), dict(top_k=5), dict(top_p=0.9), dict(top_k=7, top_p=0.5, capture=False)):
            got = model.generate(ids, 6, do_sample=True, temperature=T, seed=2, **extra)
            np.testing.assert_array_equal(got, want, err_msg=f"T={T} {extra}")
    hot = model.generate(ids, 12, do_sample=True, temperature=1e30, seed=2)[:, 4:]
    assert hot.min() >= 0 and hot.max() < cfg["vocab_size"]
    assert len(set(hot.ravel().tolist())) > 12          # 36 draws of nearly uniform over 61 tokens
    assert (hot != greedy_reference(sd, cfg, ids, 12)[:, 4:]).sum() > 18


@pytest.mark.parametrize("capture", [True, False])
def test_nan_logits_name_the_step(capture):
    """NaN in the logits (here from a NaN embedding row of a token row 0 makes and nothing else
    holds: the logits after it) is a RuntimeError naming the new token and the row, in greedy and
    sampled decoding; the runtime and the model keep working after."""
    cfg = ref.tiny_config()
    model, sd = build(cfg, "tp2")
    prompt = tokens((2, 4), seed=5)
    want = greedy_reference(sd, cfg, prompt, 6)
    made = want[0, 4:]
    i = next(i for i, t in enumerate(made) if t not in prompt[0] and t not in made[:i] and t not in want[1])
    broken = dict(sd)
    broken["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"].copy()
    broken["model.embed_tokens.weight"][made[i], 3] = np.nan
    model.load_state_dict(broken)
    for kw in (dict(), dict(do_sample=True, temperature=0.7, seed=1)):
        with pytest.raises(RuntimeError, match=rf"new token {i + 2}: the logits of row\(s\) \[0\] hold NaN"):
            model.generate(prompt, 6, capture=capture, **kw) if not kw else \
                model.generate(prompt[:1], 6, capture=capture, top_k=1, **kw)
    dtorch.synchronize()
    model.load_state_dict(sd)
    np.testing.assert_array_equal(model.generate(prompt, 6, capture=capture), want)


def test_parallelize_errors():
    cfg = LlamaConfig.from_dict(ref.tiny_config(num_attention_heads=4, num_key_value_heads=2))

    def on(shape, names, config=cfg):
        model = LlamaForCausalLM(config, device_mesh=dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names))
        return parallelize_llama(model, dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names))

    with pytest.raises(ValueError, match="'ep'"):
        on((2,), ("ep",))
    on((1, 2), ("pp", "tp"))                               # dims of size 1 are fine
    with pytest.raises(ValueError, match="tp=3 does not divide num_attention_heads=4"):
        on((3,), ("tp",))
    six = LlamaConfig.from_dict(ref.tiny_config(hidden_size=48, num_attention_heads=6, num_key_value_heads=3))
    with pytest.raises(ValueError, match="tp=2 neither divides num_key_value_heads=3"):
        on((2,), ("tp",), six)
    with pytest.raises(ValueError, match="name the dims"):
        parallelize_llama(LlamaForCausalLM(cfg), dtorch.init_device_mesh("cpu", (2, 2)))


def test_config_both_spellings():
    old = dict(ref.tiny_config(), rope_theta=500000.0, torch_dtype="bfloat16",
               rope_scaling=dict(LLAMA3["rope_scaling"], type="llama3"))
    new = dict(ref.tiny_config(), dtype="bfloat16",
               rope_parameters=dict(LLAMA3["rope_scaling"], rope_theta=500000.0))
    a, b = LlamaConfig.from_dict(old), LlamaConfig.from_dict(new)
    assert a.rope_theta == b.rope_theta == 500000.0 and a.torch_dtype == b.torch_dtype == "bfloat16"
    assert a.rope_scaling["factor"] == b.rope_scaling["factor"] == 8.0
    plain = LlamaConfig.from_dict(dict(ref.tiny_config(), rope_parameters={"rope_type": "default",
                                                                           "rope_theta": 1e4}))
    assert plain.rope_scaling is None and plain.head_dim == 8 and plain.num_key_value_heads == 2
    with pytest.raises(ValueError, match="'yarn'"):
        LlamaConfig.from_dict(dict(ref.tiny_config(), rope_scaling={"rope_type": "yarn", "factor": 2.0}))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=3)
