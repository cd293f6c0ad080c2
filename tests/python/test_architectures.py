"""Mistral and Qwen2 run from Llama's module code, and the registry that picks the class.

Against two independent references: checkpoints written by HF transformers 5.25 (fixtures/<name>/,
made by make_arch_fixtures.py: config.json, model.safetensors, and transformers' logits and greedy
tokens for fixed left-padded ids) loaded with dtorch on 1 device, tp2, tp2 x pp2, dp2, ulysses2 and
ring2 (refused where the window would hide keys), in both worker modes for one case: logits within
1e-4 relative, greedy tokens equal; and the numpy Llama of llama_reference.py, extended with q/k/v
biases and the sliding window from HF's semantics, on sequences longer than the window (prefill,
cache decode, captured greedy generation, continuous batching). The fixtures and the numpy
reference are checked against each other, and the window is shown to change the logits (so the
tests cannot pass without it). The registry: config.json's architectures (model_type without
them) choose the class, an unknown architecture is a ValueError naming it (also through
LlamaForCausalLM.from_pretrained), a checkpoint of another known architecture is refused by
LlamaForCausalLM naming the class to use, save_pretrained writes architectures and model_type."""
import json
import os
import struct

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch.models import (AutoConfig, AutoModelForCausalLM, ContinuousBatcher, LlamaConfig, LlamaForCausalLM,
                           MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, StaticCache,
                           parallelize_llama)

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TOL = 1e-4
WINDOWS = {"mistral": 5, "qwen2": None, "qwen2_window": 4}   # the fixtures' sliding windows
CLASSES = {"mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen2_window": Qwen2ForCausalLM}
MESHES = {
    "1": ((1,), None),
    "tp2": ((2,), ("tp",)),
    "tp2xpp2": ((2, 2), ("tp", "pp")),
    "dp2": ((2,), ("dp",)),
    "ulysses2": ((2,), ("ulysses",)),
    "ring2": ((2,), ("ring",)),
}

pytestmark = pytest.mark.usefixtures("thread_runtime")


def mesh_of(name):
    shape, names = MESHES[name]
    return dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def read_safetensors(path):
    """{name: array} of a .safetensors file, read here from the format (8-byte header length, JSON
    header, raw little-endian data), not by dtorch's reader."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    kinds = {"F32": np.float32, "F16": np.float16}
    out = {}
    for name, info in header.items():
        if name != "__metadata__":
            a, b = info["data_offsets"]
            out[name] = np.frombuffer(data[8 + n + a:8 + n + b], kinds[info["dtype"]]).reshape(info["shape"])
    return out


def fixture(name):
    directory = os.path.join(FIXTURES, name)
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    expected = dict(np.load(os.path.join(directory, "expected.npz")))
    return directory, cfg, read_safetensors(os.path.join(directory, "model.safetensors")), expected


def real_logits(logits, mask):
    """The logits of the real (not padding) positions, flattened (B * real, V)."""
    return logits[np.asarray(mask) != 0]


# ---- transformers' checkpoints ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_fixture_agrees_with_the_numpy_reference_and_needs_the_window(name):
    """The two references agree (the numpy one read from the same weights), and the window changes
    the logits past it: a model without the window would fail the fixture tests."""
    _, cfg, weights, expected = fixture(name)
    ids, mask = expected["input_ids"], expected["attention_mask"]
    got = ref.logits(weights, cfg, ids, mask, positions(mask))
    assert rel(real_logits(got, mask), real_logits(expected["logits"], mask)) < TOL
    if WINDOWS[name] is not None:
        unwindowed = ref.logits(weights, dict(cfg, sliding_window=None), ids, mask, positions(mask))
        assert rel(real_logits(unwindowed, mask), real_logits(expected["logits"], mask)) > 1e-2
    if name.startswith("qwen2"):
        assert {k for k in weights if k.endswith(".bias")} == {
            f"model.layers.{i}.self_attn.{p}_proj.bias" for i in range(2) for p in "qkv"}


def positions(mask):
    """HF's position ids for left padding: the count of real tokens before, 1 on padding."""
    mask = np.asarray(mask)
    return np.where(mask != 0, np.cumsum(mask, axis=1) - 1, 1)


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_fixture_logits_and_greedy_tokens(name, mesh_name):
    directory, cfg, _, expected = fixture(name)
    ids, mask = expected["input_ids"], expected["attention_mask"]
    model = AutoModelForCausalLM.from_pretrained(directory, device_mesh=mesh_of(mesh_name))
    assert type(model) is CLASSES[name]
    window = WINDOWS[name]
    if mesh_name == "ring2" and window is not None:
        # ring attention decides by positions and applies no window: refused once it would hide keys
        with pytest.raises(ValueError, match=f"sliding_window={window}"):
            model(ids, attention_mask=mask)
        short = ids[:, :window]
        assert model(short).logits.shape == (2, window, cfg["vocab_size"])
        return
    logits = model(ids, attention_mask=mask).logits.numpy()
    assert rel(real_logits(logits, mask), real_logits(expected["logits"], mask)) < TOL
    out = model.generate(ids, attention_mask=mask, max_new_tokens=expected["generated"].shape[1])
    np.testing.assert_array_equal(out[:, ids.shape[1]:], expected["generated"])


def test_fixture_in_process_workers(process_mode):
    directory, _, _, expected = fixture("mistral")
    ids, mask = expected["input_ids"], expected["attention_mask"]
    for mesh_name in ("1", "tp2"):
        model = AutoModelForCausalLM.from_pretrained(directory, device_mesh=mesh_of(mesh_name))
        logits = model(ids, attention_mask=mask).logits.numpy()
        assert rel(real_logits(logits, mask), real_logits(expected["logits"], mask)) < TOL
        out = model.generate(ids, attention_mask=mask, max_new_tokens=expected["generated"].shape[1])
        np.testing.assert_array_equal(out[:, ids.shape[1]:], expected["generated"])


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_state_dict_keys_equal_the_checkpoint(name, tmp_path):
    directory, cfg, weights, _ = fixture(name)
    model = AutoModelForCausalLM.from_pretrained(directory)
    keys = set(model.state_dict())
    if cfg["tie_word_embeddings"]:
        keys.discard("lm_head.weight")      # not in the file (tied), as transformers writes it
    assert keys == set(weights)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["architectures"], saved["model_type"]) == (cfg["architectures"], cfg["model_type"])
    assert set(read_safetensors(tmp_path / "model.safetensors")) == set(weights)
    for field in ("sliding_window", "use_sliding_window", "max_window_layers"):
        if field in cfg:
            assert saved[field] == cfg[field], field
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(again) is CLASSES[name] and again.config == model.config


# ---- the numpy reference: biases and windows on longer sequences --------------------------------

MISTRAL = ref.tiny_config(model_type="mistral", sliding_window=6)
QWEN2 = ref.tiny_config(model_type="qwen2", use_sliding_window=True, sliding_window=5, max_window_layers=1,
                        num_hidden_layers=3)
CONFIGS = {"mistral": (MistralConfig, MistralForCausalLM, MISTRAL), "qwen2": (Qwen2Config, Qwen2ForCausalLM, QWEN2)}
REF_MESHES = dict(MESHES, tp4=((4,), ("tp",)), **{"dp2xtp2": ((2, 2), ("dp", "tp"))})


def build(kind, mesh_name, **plan):
    config_cls, model_cls, cfg = CONFIGS[kind]
    sd = ref.random_weights(cfg, 3)
    shape, names = REF_MESHES[mesh_name]
    mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = model_cls(config_cls.from_dict(cfg), device_mesh=mesh)
    parallelize_llama(model, mesh, **plan)
    model.load_state_dict(sd)
    return model, sd, cfg


def tokens(shape, seed=0, vocab=61):
    return np.random.default_rng(seed).integers(0, vocab, shape)


@pytest.mark.parametrize("mesh_name", ["1", "tp2", "tp4", "dp2xtp2", "tp2xpp2", "ulysses2"])
@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_window_past_its_length_matches_reference(kind, mesh_name):
    """20 tokens through a window of 6 (Mistral, every layer) or 5 (Qwen2, layers 1 and 2 of 3),
    with left padding in one row: the prefill's logits, then a cache filled by a prefill of 9 and
    11 steps of one token."""
    model, sd, cfg = build(kind, mesh_name)
    ids = tokens((3, 20), seed=7)
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    want = ref.logits(sd, cfg, ids, mask, positions(mask))
    got = model(ids, attention_mask=mask, position_ids=positions(mask)).logits.numpy()
    assert rel(real_logits(got, mask), real_logits(want, mask)) < TOL
    cache = StaticCache(20)
    pos = positions(mask)
    step = model(ids[:, :9], attention_mask=mask[:, :9], position_ids=pos[:, :9], past_key_values=cache).logits
    assert rel(real_logits(step.numpy(), mask[:, :9]), real_logits(want[:, :9], mask[:, :9])) < TOL
    for t in range(9, 20):
        step = model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=pos[:, t:t + 1],
                     past_key_values=cache).logits.numpy()
        assert rel(step[:, 0], want[:, t]) < TOL, t


def test_biases_are_read_and_only_on_q_k_v():
    model, sd, cfg = build("qwen2", "1")
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.v_proj.bias is not None
    assert attn.o_proj.bias is None and model.model.layers[0].mlp.down_proj.bias is None
    assert set(model.state_dict()) == set(sd)
    ids = tokens((2, 5), seed=1)
    without = ref.logits({k: v for k, v in sd.items() if not k.endswith(".bias")}, cfg, ids)
    assert rel(model(ids).logits.numpy(), without) > 1e-2      # the biases matter


@pytest.mark.parametrize("capture", [True, False])
@pytest.mark.parametrize("mesh_name", ["1", "tp2", "dp2"])
def test_greedy_generation_past_the_window(mesh_name, capture):
    """Generation runs 14 tokens past a prompt of 4 with a window of 6: equal to the argmax of the
    reference recomputed over the whole sequence each step."""
    model, sd, cfg = build("mistral", mesh_name)
    ids = tokens((2, 4), seed=9)
    out = model.generate(ids, max_new_tokens=14, capture=capture, eos_token_id=None)   # no eos: 14 tokens
    seq = ids
    for _ in range(14):
        seq = np.concatenate([seq, ref.logits(sd, cfg, seq)[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out, seq)


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_ring_applies_no_window_and_refuses_when_it_would_matter(kind):
    model, sd, cfg = build(kind, "ring2")
    window = cfg["sliding_window"]
    ids = tokens((2, window), seed=3)
    assert rel(model(ids).logits.numpy(), ref.logits(sd, cfg, ids)) < TOL   # the window hides nothing yet
    out = model.generate(ids[:, :2], max_new_tokens=window - 2)             # a cache of `window` slots
    assert out.shape == (2, window)
    with pytest.raises(ValueError, match=f"ring attention.*sliding_window={window}"):
        model(tokens((2, window + 1)))
    with pytest.raises(ValueError, match=f"sliding_window={window}"):
        model.generate(ids[:, :2], max_new_tokens=window)
    assert model(ids).logits.shape == (2, window, cfg["vocab_size"])        # still works after


def test_continuous_batching_past_the_window():
    """The batcher's own 4-D mask applies the window of a model whose layers all slide (Mistral):
    each request's tokens equal generate's for it alone; a model whose layers differ (Qwen2 with
    max_window_layers) takes only requests the window cannot cut, and says why otherwise."""
    model, _, _ = build("mistral", "1")
    prompts = [tokens(n, seed=n) for n in (3, 5, 2)]
    batcher = ContinuousBatcher(model, max_batch=2, max_len=24, capture=False)
    requests = [batcher.submit(p, max_new_tokens=12) for p in prompts]
    batcher.run_until_idle()
    for p, r in zip(prompts, requests):
        np.testing.assert_array_equal(r.tokens, model.generate(p, max_new_tokens=12)[0, len(p):])
    mixed, _, _ = build("qwen2", "1")
    batcher = ContinuousBatcher(mixed, max_batch=2, max_len=24, capture=False)
    with pytest.raises(ValueError, match="sliding_window"):
        batcher.submit(prompts[1], max_new_tokens=12)
    short = batcher.submit(prompts[0], max_new_tokens=3)        # 3 + 3 - 1 fed tokens: within the window
    batcher.run_until_idle()
    np.testing.assert_array_equal(short.tokens, mixed.generate(prompts[0], max_new_tokens=3)[0, 3:])


# ---- the registry -------------------------------------------------------------------------------

def write_config(directory, **changes):
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    with open(path, "w") as f:
        json.dump(cfg, f)


def copy_fixture(name, tmp_path):
    directory = tmp_path / name
    directory.mkdir()
    for file in ("config.json", "model.safetensors"):
        (directory / file).write_bytes(open(os.path.join(FIXTURES, name, file), "rb").read())
    return str(directory)


def test_auto_picks_the_class_by_architecture_then_model_type(tmp_path):
    llama = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig.from_dict(ref.tiny_config())).save_pretrained(llama)
    saved = json.loads((llama / "config.json").read_text())
    assert (saved["architectures"], saved["model_type"]) == (["LlamaForCausalLM"], "llama")
    assert "sliding_window" not in saved and "layer_types" not in saved     # not Llama's fields
    assert type(AutoModelForCausalLM.from_pretrained(llama)) is LlamaForCausalLM
    assert type(AutoConfig.from_pretrained(llama)) is LlamaConfig
    directory = copy_fixture("qwen2", tmp_path)
    write_config(directory, architectures=None)                             # model_type alone
    assert type(AutoModelForCausalLM.from_pretrained(directory)) is Qwen2ForCausalLM
    write_config(directory, architectures=["SomethingElse", "Qwen2ForCausalLM"])   # the first one we run
    assert type(AutoModelForCausalLM.from_pretrained(directory)) is Qwen2ForCausalLM
    write_config(directory, architectures=None, model_type=None)
    with pytest.raises(ValueError, match="names no architecture"):
        AutoModelForCausalLM.from_pretrained(directory)
    model = Qwen2ForCausalLM.from_pretrained(directory)                     # a class reads its own without
    assert type(model.config) is Qwen2Config


@pytest.mark.parametrize("loader", [AutoModelForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM, AutoConfig])
def test_unknown_architecture_is_refused_by_name(loader, tmp_path):
    directory = copy_fixture("qwen2", tmp_path)
    write_config(directory, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ValueError, match="GPT2LMHeadModel") as info:
        loader.from_pretrained(directory)
    assert "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM" in str(info.value)
    write_config(directory, architectures=None)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        loader.from_pretrained(directory)


def test_another_known_architecture_is_refused_by_the_wrong_class(tmp_path):
    """transformers builds the class asked for and warns (a Qwen2 checkpoint then runs without its
    biases); here the class asked for refuses it, naming the class that runs it."""
    directory = copy_fixture("qwen2", tmp_path)
    for cls in (LlamaForCausalLM, MistralForCausalLM):
        with pytest.raises(ValueError, match=f"Qwen2ForCausalLM.*not a {cls.__name__}.*AutoModelForCausalLM"):
            cls.from_pretrained(directory)
    with pytest.raises(ValueError, match="Qwen2ForCausalLM"):
        LlamaConfig.from_pretrained(directory)
    write_config(directory, architectures=None)          # the model_type alone says it too
    with pytest.raises(ValueError, match="qwen2"):
        LlamaForCausalLM.from_pretrained(directory)


@pytest.mark.parametrize("field, value, kind, message", [
    ("architectures", "Qwen2ForCausalLM", TypeError, "config architectures must be a list"),
    ("architectures", [3], TypeError, r"config architectures\[0\] must be a string"),
    ("model_type", 7, TypeError, "config model_type must be a string"),
])
def test_malformed_architecture_fields(field, value, kind, message, tmp_path):
    directory = copy_fixture("qwen2", tmp_path)
    write_config(directory, **{field: value})
    for loader in (AutoModelForCausalLM, Qwen2ForCausalLM):
        with pytest.raises(kind, match=message):
            loader.from_pretrained(directory)


def test_auto_model_is_not_built_directly():
    with pytest.raises(OSError, match="from_pretrained"):
        AutoModelForCausalLM()


# ---- the configs --------------------------------------------------------------------------------

def test_config_defaults_are_transformers():
    """Defaults of transformers 5.25's MistralConfig and Qwen2Config (configuration_*.py)."""
    m = MistralConfig()
    assert (m.vocab_size, m.intermediate_size, m.num_key_value_heads, m.max_position_embeddings,
            m.sliding_window, m.bos_token_id, m.eos_token_id) == (32000, 14336, 8, 131072, 4096, 1, 2)
    q = Qwen2Config()
    assert (q.vocab_size, q.intermediate_size, q.num_key_value_heads, q.max_position_embeddings, q.use_sliding_window,
            q.sliding_window, q.max_window_layers, q.bos_token_id, q.eos_token_id) == (
        151936, 22016, 32, 32768, False, None, 28, None, None)
    assert Qwen2Config(use_sliding_window=True).sliding_window == 4096
    assert (m.model_type, q.model_type, LlamaConfig.model_type) == ("mistral", "qwen2", "llama")


def test_layer_types():
    q = Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert [q.layer_type(i) for i in range(4)] == ["full_attention"] * 2 + ["sliding_attention"] * 2
    q = Qwen2Config(num_hidden_layers=3, sliding_window=8, use_sliding_window=True,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    assert [q.layer_type(i) for i in range(3)] == ["sliding_attention", "full_attention", "sliding_attention"]
    m = MistralConfig(num_hidden_layers=2, sliding_window=3)
    assert [m.layer_type(i) for i in range(2)] == ["sliding_attention"] * 2
    assert MistralConfig(num_hidden_layers=2, sliding_window=None).layer_type(1) == "full_attention"
    assert LlamaConfig(num_hidden_layers=2).layer_type(0) == "full_attention"
    huge = Qwen2Config(num_hidden_layers=2**62)             # a config holds no list of every layer
    assert huge.layer_type(2**62 - 1) == "full_attention"


@pytest.mark.parametrize("cls, fields, kind, message", [
    (MistralConfig, dict(sliding_window=0), ValueError, r"MistralConfig: config sliding_window must be an int in \[1"),
    (MistralConfig, dict(sliding_window="4"), TypeError, "MistralConfig: config sliding_window must be an int"),
    (Qwen2Config, dict(use_sliding_window="yes"), TypeError, "Qwen2Config: config use_sliding_window must be true"),
    (Qwen2Config, dict(max_window_layers=-1), ValueError, "Qwen2Config: config max_window_layers must be an int"),
    (Qwen2Config, dict(num_hidden_layers=2, layer_types=["full_attention"]), ValueError,
     "layer_types names 1 layer.*num_hidden_layers is 2"),
    (Qwen2Config, dict(num_hidden_layers=1, layer_types=["chunked_attention"]), ValueError,
     "layer_types.*'chunked_attention'.*full_attention, sliding_attention"),
    (Qwen2Config, dict(num_hidden_layers=1, layer_types=["sliding_attention"]), ValueError,
     "sliding_attention.*no sliding_window"),
    (Qwen2Config, dict(layer_types="full_attention"), TypeError, "config layer_types must be a list"),
    (LlamaConfig, dict(sliding_window=4), ValueError, "LlamaConfig: sliding_window is not a setting of llama"),
    (MistralConfig, dict(attention_bias=True), ValueError, "MistralConfig: attention_bias is not a setting of mistral"),
    (MistralConfig, dict(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"]), ValueError,
     "MistralConfig: layer_types is not a setting of mistral"),
])
def test_config_refuses(cls, fields, kind, message):
    with pytest.raises(kind, match=message):
        cls(**fields)


def test_files_fields_a_model_does_not_have_are_ignored_as_transformers_does():
    """transformers' Llama has no sliding_window and Mistral/Qwen2 no attention_bias (their modeling
    code fixes the biases): a file that holds them anyway runs as transformers runs it."""
    assert LlamaConfig.from_dict(ref.tiny_config(sliding_window=3)).layer_type(1) == "full_attention"
    m = MistralConfig.from_dict(ref.tiny_config(attention_bias=True, mlp_bias=True, sliding_window=3))
    assert (m.qkv_bias, m.o_proj_bias, m.mlp_bias) == (False, False, False)
    q = Qwen2Config.from_dict(ref.tiny_config(attention_bias=False))
    assert (q.qkv_bias, q.o_proj_bias) == (True, False)
    assert (LlamaConfig(attention_bias=True).qkv_bias, LlamaConfig(attention_bias=True).o_proj_bias) == (True, True)


def test_model_class_takes_its_config():
    with pytest.raises(TypeError, match="MistralForCausalLM takes a MistralConfig, got LlamaConfig"):
        MistralForCausalLM(LlamaConfig.from_dict(ref.tiny_config()))
