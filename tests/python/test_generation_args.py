"""generate's transformers arguments against transformers itself: fixtures/generation holds a tiny
Llama saved by transformers' save_pretrained (generation_config.json with two eos ids) and
transformers 5's own ``generate`` outputs (cases.json, written by make_generation_fixtures.py) for
the eos ids of generation_config.json, max_length, max_new_tokens over max_length, min_new_tokens,
min_length, repetition_penalty (above and below 1, with left padding), pad_token_id, the attention
mask inferred from the pad token, num_return_sequences, min_p with temperature, a
``generation_config=`` object with keyword arguments over it, stop strings with the tokenizer
(dtorch's AutoTokenizer on the fixture's tokenizer.json). dtorch loads the same files on one device,
tp2 and dp2 (and tp2 on worker processes) and must give the same ids, captured and op by op.
Stop strings are also checked against transformers' StopStringCriteria decisions on every prefix of
a few token sequences, for a byte-level and a sentencepiece-style (byte fallback) vocabulary.

Sampling settings that transformers cannot be compared with (its random numbers differ) are checked
against a numpy reference of transformers' processors and warpers on the logits of the numpy Llama
(llama_reference.py): every sampled token lies in the set the reference allows, over many seeds,
and that set leaves out tokens the unwarped distribution would give often (so that ignoring the
setting fails the test)."""
import json
import os
import shutil
import struct

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch.models import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
from dtorch.models.stopping_criteria import StopStringCriteria
from dtorch.parallel.pipeline import schedule_of

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "generation")
with open(os.path.join(FIXTURE, "cases.json")) as _f:
    FIXTURES = json.load(_f)
CASES = {c["name"]: c for c in FIXTURES["cases"]}
MESHES = {"1": ((1,), None), "tp2": ((2,), ("tp",)), "dp2": ((2,), ("dp",))}

pytestmark = pytest.mark.usefixtures("thread_runtime")


def load(mesh_name="1"):
    shape, names = MESHES[mesh_name]
    return LlamaForCausalLM.from_pretrained(FIXTURE, device_mesh=dtorch.init_device_mesh("cpu", shape,
                                                                                         mesh_dim_names=names))


def run(model, case, **extra):
    kwargs = dict(case["kwargs"], **extra)
    if "stop_strings" in kwargs:
        kwargs["tokenizer"] = AutoTokenizer.from_pretrained(FIXTURE)
    if isinstance(kwargs.get("generation_config"), dict):
        kwargs["generation_config"] = GenerationConfig(**kwargs["generation_config"])
    mask = case["attention_mask"]
    return model.generate(np.array(case["input_ids"]), attention_mask=None if mask is None else np.array(mask),
                          **kwargs)


def numpy_weights():
    """The fixture's weights read with numpy alone (safetensors: a length, a JSON header, the bytes)."""
    with open(os.path.join(FIXTURE, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def reference_config():
    with open(os.path.join(FIXTURE, "config.json")) as f:
        cfg = json.load(f)
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    return cfg


# ---- reading generation_config.json -------------------------------------------------------------

def test_generation_config_json_is_read():
    model = load()
    config = model.generation_config
    assert (config.eos_token_id, config.bos_token_id, config.pad_token_id) == ([276, 148], 0, None)
    assert config.max_length is None and config.do_sample is None


def test_without_generation_config_json_the_config_ids_are_used(tmp_path):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(FIXTURE, name), tmp_path / name)
    model = LlamaForCausalLM.from_pretrained(str(tmp_path))
    assert (model.generation_config.eos_token_id, model.generation_config.bos_token_id) == (1, 0)
    built = LlamaForCausalLM(LlamaConfig.from_dict(ref.tiny_config(eos_token_id=[5, 7], pad_token_id=3)))
    assert (built.generation_config.eos_token_id, built.generation_config.pad_token_id) == ([5, 7], 3)


def test_bad_generation_config_json_names_the_file(tmp_path):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(FIXTURE, name), tmp_path / name)
    for text, match in (("{", "not JSON"), ("[1]", "not a JSON object"), ('{"eos_token_id": "x"}', "eos_token_id"),
                        ('{"top_p": 2.0}', "top_p")):
        (tmp_path / "generation_config.json").write_text(text)
        with pytest.raises(OSError, match="generation_config.json") as info:
            LlamaForCausalLM.from_pretrained(str(tmp_path))
        assert match in str(info.value)


def test_generation_config_round_trip(tmp_path):
    config = GenerationConfig(eos_token_id=[3, 4], do_sample=True, top_p=0.9, custom_field="kept")
    config.save_pretrained(tmp_path)
    again = GenerationConfig.from_pretrained(tmp_path)
    assert again == config and again.custom_field == "kept" and again.top_k is None
    assert json.loads((tmp_path / "generation_config.json").read_text()) == dict(
        eos_token_id=[3, 4], do_sample=True, top_p=0.9, custom_field="kept")


def test_save_pretrained_writes_the_generation_config(tmp_path):
    """A model saved and loaded again keeps its generation settings (the fixture's two eos ids and a
    setting changed after loading), as transformers' save_pretrained writes generation_config.json;
    a model without the file writes its config's generation fields."""
    model = load()
    model.generation_config.top_k = 7
    model.save_pretrained(str(tmp_path / "saved"))
    written = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    with open(os.path.join(FIXTURE, "generation_config.json")) as f:
        want = {k: v for k, v in json.load(f).items() if k != "transformers_version"}
    assert {k: written[k] for k in want} == want and written["top_k"] == 7
    again = LlamaForCausalLM.from_pretrained(str(tmp_path / "saved"))
    assert again.generation_config == model.generation_config
    plain = LlamaForCausalLM(LlamaConfig(**ref.tiny_config(eos_token_id=5, bos_token_id=1)))
    plain.save_pretrained(str(tmp_path / "plain"))
    assert json.loads((tmp_path / "plain" / "generation_config.json").read_text()) == \
        {"bos_token_id": 1, "eos_token_id": 5}


# ---- transformers' outputs ----------------------------------------------------------------------

@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_same_ids_as_transformers(mesh_name):
    model = load(mesh_name)
    for name, case in CASES.items():
        got = run(model, case)
        assert got.tolist() == case["output"], name
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", ["min_new_tokens blocks eos", "repetition_penalty > 1",
                                  "left padding, repetition_penalty ignores the pads", "stop_strings without eos",
                                  "min_p=1 keeps only the best after temperature and penalty"])
def test_same_ids_op_by_op(name):
    model = load("tp2")
    assert run(model, CASES[name], capture=False).tolist() == CASES[name]["output"]


def test_the_cases_are_not_vacuous():
    """The fixture's cases differ where their arguments should make them differ."""
    out = {name: case["output"] for name, case in CASES.items()}
    plain = out["explicit eos_token_id=None: no eos"]
    assert out["repetition_penalty > 1"][0][:len(plain[0])] != plain[0]
    assert out["min_new_tokens blocks eos"] != plain and len(out["defaults: eos list from generation_config, "
                                                                  "20 new tokens"][0]) < len(plain[0])
    padded = out["left padding with pad_token_id"]
    assert padded[0][-1] == FIXTURES["pad"] and out["left padding, repetition_penalty ignores the pads"] != padded
    assert len(out["num_return_sequences (top_k=1 sampling)"]) == 6
    # a row that met its stop string: without eos it goes on with real tokens, with eos it is padded
    stopped = out["stop_strings without eos"]
    assert len(stopped[0]) < len(plain[0]) + 7 and stopped[1][-1] != FIXTURES["pad"]
    assert out["stop_strings with eos, padded"][0][-2:] == [FIXTURES["pad"]] * 2


@pytest.mark.parametrize("table, folder", [("stop_string_checks", ""),
                                           ("sentencepiece_stop_string_checks", "sentencepiece")])
def test_stop_strings_stop_where_transformers_stops(table, folder):
    """StopStringCriteria's decision on every prefix of each sequence equals transformers' (stored):
    stop strings inside one token, over several, running off the first token's start, multi-byte
    characters split over byte tokens, and matches that end before the last token (no stop)."""
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(FIXTURE, folder))
    checks = FIXTURES[table]
    for check in checks:
        criteria = StopStringCriteria(tokenizer, check["stop_strings"])
        got = [criteria(check["ids"][:n]) for n in range(1, len(check["ids"]) + 1)]
        assert got == check["stops_at"], check
    assert sum(sum(c["stops_at"]) for c in checks) >= 15 and sum(len(c["stops_at"]) for c in checks) > 500


@pytest.mark.parametrize("mesh_name", ["tp2", "dp2"])
def test_a_captured_step_with_every_processor_is_one_replay(mesh_name):
    """With a repetition penalty and min_new_tokens the captured step is still recorded once and
    replayed: each step past the first costs one replay and one fetch per group."""
    model = load(mesh_name)
    groups = schedule_of(model).n_microbatches
    ids = np.array(CASES["repetition_penalty > 1"]["input_ids"])
    kw = dict(repetition_penalty=1.3, min_new_tokens=3, eos_token_id=[299], do_sample=True, min_p=0.2, seed=1)
    counts = {}
    for n in (4, 8):
        model.generate(ids, n, **kw)
        before = dtorch._C._ops_submitted()
        out = model.generate(ids, n, **kw)
        counts[n] = dtorch._C._ops_submitted() - before
        assert out.shape == (2, ids.shape[1] + n)
    assert counts[8] - counts[4] == 4 * (1 + groups)


# ---- arguments -------------------------------------------------------------------------------------

def test_unknown_keyword_is_a_type_error_naming_it():
    model = load()
    ids = np.array([[5, 6, 7]])
    with pytest.raises(TypeError, match="'temprature'"):
        model.generate(ids, 3, temprature=0.5)
    with pytest.raises(TypeError, match="'logits_processor'"):
        model.stream(ids, 3, logits_processor=[])
    assert model.generate(ids, 3, use_cache=True, num_beams=1).shape == (1, 6)   # known, without effect


def test_unsupported_settings_and_bad_values():
    model = load()
    ids = np.array([[5, 6, 7]])
    with pytest.raises(ValueError, match="num_beams=4 is not supported"):
        model.generate(ids, 3, num_beams=4)
    with pytest.raises(ValueError, match="num_return_sequences=2 needs do_sample=True"):
        model.generate(ids, 3, num_return_sequences=2)
    with pytest.raises(ValueError, match="the prompt has 3 tokens, but max_length is 3"):
        model.generate(ids, max_length=3)
    with pytest.raises(ValueError, match="min_p"):
        model.generate(ids, 3, do_sample=True, min_p=1.5)
    with pytest.raises(ValueError, match="repetition_penalty"):
        model.generate(ids, 3, repetition_penalty=0.0)
    with pytest.raises(TypeError, match="eos_token_id"):
        model.generate(ids, 3, eos_token_id="x")
    with pytest.raises(ValueError, match="tokenizer"):
        model.generate(ids, 3, stop_strings=["a"])
    with pytest.raises(TypeError, match="tokenizer= must be a tokenizer with convert_ids_to_tokens"):
        model.generate(ids, 3, stop_strings=["a"], tokenizer=object())
    with pytest.raises(TypeError, match="generation_config must be a GenerationConfig"):
        model.generate(ids, 3, generation_config=dict(max_new_tokens=2))
    assert model.generate(ids, 2).shape == (1, 5)                  # the model still works after


def test_lengths_and_defaults():
    """20 new tokens by default; max_length counts the prompt; generation_config second in place of
    max_new_tokens; no prompt: generation from the bos token."""
    model = load()
    ids = np.array([[5, 6, 7]])
    assert model.generate(ids, eos_token_id=None).shape == (1, 23)
    assert model.generate(ids, max_length=7, eos_token_id=None).shape == (1, 7)
    assert model.generate(ids, GenerationConfig(max_new_tokens=4, eos_token_id=[])).shape == (1, 7)
    model.generation_config = GenerationConfig(max_length=10, eos_token_id=[], bos_token_id=4)
    try:
        assert model.generate(ids).shape == (1, 10)                   # the model's max_length counts the prompt
        out = model.generate(max_new_tokens=3)
        assert out.shape == (1, 4) and out[0, 0] == 4
        with pytest.raises(ValueError, match="no bos_token_id"):
            model.generate(max_new_tokens=3, bos_token_id=None)
    finally:
        model.generation_config = GenerationConfig.from_pretrained(FIXTURE)


# ---- sampling against a numpy reference of transformers' processors and warpers --------------------

def reference_allowed(logits, seen, penalty, temperature, top_k, min_p):
    """The token ids that transformers' processors (RepetitionPenaltyLogitsProcessor) and warpers
    (TemperatureLogitsWarper, TopKLogitsWarper, MinPLogitsWarper, in that order) leave a nonzero
    probability, and the probabilities of the distribution without min_p."""
    x = np.asarray(logits, np.float64)
    x = np.where(seen, np.where(x < 0, x * penalty, x / penalty), x)
    x = x / temperature
    if top_k:
        x = np.where(x < np.sort(x)[-top_k], -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    keep = p >= min_p * p.max()
    return set(np.flatnonzero(keep).tolist()), p


@pytest.mark.parametrize("mesh_name", ["1", "tp2"])
def test_min_p_top_k_penalty_sample_only_what_the_reference_allows(mesh_name):
    model = load(mesh_name)
    weights, cfg = numpy_weights(), reference_config()
    ids = np.array(CASES["repetition_penalty > 1"]["input_ids"][:1])
    kw = dict(do_sample=True, temperature=1.5, top_k=40, min_p=0.3, repetition_penalty=1.8, eos_token_id=None)
    seen = np.zeros(cfg["vocab_size"], bool)
    seen[ids[0]] = True
    allowed, p = reference_allowed(ref.logits(weights, cfg, ids)[0, -1], seen, 1.8, 1.5, 40, 0.3)
    assert 1 < len(allowed) < 40 and p[sorted(set(range(len(p))) - allowed)].sum() > 0.3   # min_p matters
    firsts, seconds = set(), set()
    for seed in range(40):
        out = model.generate(ids, 2, seed=seed, **kw)
        first, second = int(out[0, -2]), int(out[0, -1])
        assert first in allowed, (seed, first)
        firsts.add(first)
        # the second token: the penalty now also covers the first (the captured step's mask update)
        seen_after = seen.copy()
        seen_after[first] = True
        allowed2, _ = reference_allowed(ref.logits(weights, cfg, out[:, :-1])[0, -1], seen_after, 1.8, 1.5, 40, 0.3)
        assert second in allowed2, (seed, second)
        seconds.add(second)
    assert len(firsts) > 1 and len(seconds) > 1


def test_top_k_defaults_to_50_when_sampling():
    """transformers' default top_k is 50: at a temperature that makes the rest uniform every sampled
    token is among the 50 best, and turning top_k off (None) samples beyond them."""
    model = load()
    weights, cfg = numpy_weights(), reference_config()
    ids = np.array([[5, 6, 7]])
    best = set(np.argsort(-ref.logits(weights, cfg, ids)[0, -1])[:50].tolist())
    plain = {int(model.generate(ids, 1, do_sample=True, temperature=1e6, seed=s)[0, -1]) for s in range(60)}
    assert plain <= best and len(plain) > 20
    free = {int(model.generate(ids, 1, do_sample=True, temperature=1e6, top_k=None, seed=s)[0, -1]) for s in range(60)}
    assert free - best


def test_num_return_sequences_sampled():
    model = load("dp2")
    ids = np.array(CASES["repetition_penalty > 1"]["input_ids"])
    out = model.generate(ids, 6, do_sample=True, num_return_sequences=3, seed=5, eos_token_id=None)
    assert out.shape == (6, ids.shape[1] + 6)
    np.testing.assert_array_equal(out[:, :ids.shape[1]], np.repeat(ids, 3, axis=0))
    assert len({tuple(r) for r in out[:3, ids.shape[1]:].tolist()}) > 1          # the copies sample apart
    np.testing.assert_array_equal(out, model.generate(ids, 6, do_sample=True, num_return_sequences=3, seed=5,
                                                      eos_token_id=None))


# ---- worker processes (last: the runtime restarts) ------------------------------------------------

def test_same_ids_as_transformers_on_worker_processes(process_mode):
    model = load("tp2")
    for name in ("defaults: eos list from generation_config, 20 new tokens", "min_new_tokens blocks eos",
                 "left padding, repetition_penalty ignores the pads", "generation_config object with kwargs over it",
                 "stop_strings with eos, padded"):
        assert run(model, CASES[name]).tolist() == CASES[name]["output"], name
