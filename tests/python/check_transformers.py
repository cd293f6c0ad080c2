"""dtorch's Llama against transformers.LlamaForCausalLM itself: logits and greedy generation of
grouped-query, multi-query (tied) and llama3-scaled models on one device, dp2 x tp2 and tp2 x
ulysses2; generate with random combinations of transformers' generation arguments on the Llama,
Mistral and Qwen2 checkpoints of fixtures/ on tp2. Not part of the default run (its name does not start with test_): it needs torch and
transformers, which DTorch does not. Run it from tests/python with a Python that has torch,
transformers and pytest, and dtorch importable: installed there as into .venv, or built into a
folder of its own and put on the paths, e.g. with a separate venv /work/refvenv:

    /work/refvenv/bin/pip install torch transformers numpy safetensors pytest meson-python meson ninja
    PATH=/work/refvenv/bin:$PATH /work/refvenv/bin/pip install --no-build-isolation --no-deps \
        --target /tmp/dtorch-ref --config-settings=build-dir=$PWD/build-ref \
        --config-settings=setup-args=-Dcuda=disabled .                     # from the repository root
    PYTHONPATH=/tmp/dtorch-ref /work/refvenv/bin/python -m pytest -q check_transformers.py
"""
import os

import numpy as np
import pytest
import torch
import transformers

import dtorch
from dtorch.models import LlamaForCausalLM

CONFIGS = {
    "gqa": dict(),
    "mqa-tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "llama3": dict(rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                          high_freq_factor=4.0, original_max_position_embeddings=16)),
}


@pytest.fixture(scope="module", autouse=True)
def rt():
    dtorch.init(workers="thread")
    yield
    dtorch.shutdown()


BASE = dict(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)

MESHES = {"1": ((1, 1), ("dp", "tp")), "dp2xtp2": ((2, 2), ("dp", "tp")), "tp2xulysses2": ((2, 2), ("tp", "ulysses"))}


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_as_transformers(tmp_path, name, mesh_name):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**dict(BASE, **CONFIGS[name]))
    theirs = transformers.LlamaForCausalLM(cfg).eval()
    theirs.save_pretrained(tmp_path, safe_serialization=True)
    shape, names = MESHES[mesh_name]
    mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
    ours = LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=mesh)
    ids = np.random.default_rng(0).integers(0, 61, (3, 7))
    with torch.no_grad():
        want = theirs(torch.from_numpy(ids)).logits.numpy()
    got = ours(ids).logits.numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    with torch.no_grad():
        greedy = theirs.generate(torch.from_numpy(ids[:, :4]), max_new_tokens=6, do_sample=False,
                                 eos_token_id=None, pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours.generate(ids[:, :4], 6, eos_token_id=None), greedy)


@pytest.mark.parametrize("fixture", ["generation", "mistral", "qwen2"])
def test_generation_arguments_same_as_transformers(fixture):
    """generate with random combinations of transformers' generation arguments (lengths, eos ids
    among the tokens the model makes, pad, repetition penalty, min_new_tokens and min_length, left
    padding, sampling that top_k=1 or min_p=1 makes deterministic, num_return_sequences, stop
    strings) gives transformers' ids on the checkpoints of tests/python/fixtures."""
    import random
    from dtorch.models import AutoModelForCausalLM, AutoTokenizer
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", fixture)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    mesh = dtorch.init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    ours = AutoModelForCausalLM.from_pretrained(folder, device_mesh=mesh)
    texts = (AutoTokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)) \
        if fixture == "generation" else None
    rng, V = random.Random(0), theirs.config.vocab_size

    def hf(ids, mask, **kw):
        with torch.no_grad():
            return theirs.generate(torch.from_numpy(ids), attention_mask=None if mask is None else
                                   torch.from_numpy(mask), **kw).numpy()

    for _ in range(60):
        B, P = rng.choice([1, 2, 3]), rng.randint(2, 7)
        ids = np.array([[rng.randrange(3, V) for _ in range(P)] for _ in range(B)])
        mask = None
        if B > 1 and rng.random() < 0.5:
            mask = np.ones((B, P), np.int64)
            mask[0, :rng.randint(1, P - 1)] = 0
        kw = {}
        if rng.random() < 0.5:
            kw["max_new_tokens"] = rng.randint(1, 12)
        elif rng.random() < 0.5:
            kw["max_length"] = P + rng.randint(1, 12)
        if rng.random() < 0.4:
            kw["repetition_penalty"] = rng.choice([0.7, 1.2, 1.5, 2.0])
        if rng.random() < 0.3:
            kw["min_new_tokens"] = rng.randint(1, 6)
        if rng.random() < 0.3:
            kw["min_length"] = P + rng.randint(1, 6)
        if rng.random() < 0.5:
            free = hf(ids, mask, max_new_tokens=8, eos_token_id=None, pad_token_id=0)[:, P:].ravel().tolist()
            eos = rng.sample(free, rng.randint(1, 2))
            kw["eos_token_id"] = eos if rng.random() < 0.5 else eos[0]
        if rng.random() < 0.3:
            kw["pad_token_id"] = rng.randrange(0, V)
        if rng.random() < 0.3:
            kw.update(rng.choice([dict(top_k=1), dict(min_p=1.0, top_k=0), dict(min_p=1.0, temperature=0.6)]),
                      do_sample=True)
            if rng.random() < 0.5:
                kw["num_return_sequences"] = rng.randint(2, 3)
        extra = {}
        if texts and rng.random() < 0.3:
            made = hf(ids, None, max_new_tokens=6, eos_token_id=None, pad_token_id=0)[0, P + 2:P + 4].tolist()
            stop = texts[1].decode(made)
            if stop and "\ufffd" not in stop:
                kw["stop_strings"] = [stop]
                extra = dict(ours=dict(tokenizer=texts[0]), theirs=dict(tokenizer=texts[1]))
        want = hf(ids, mask, **kw, **extra.get("theirs", {}))
        got = ours.generate(ids, attention_mask=mask, **kw, **extra.get("ours", {}))
        np.testing.assert_array_equal(got, want, err_msg=f"{ids.tolist()} {mask} {kw}")
