"""dtorch's Llama against transformers.LlamaForCausalLM itself: logits and greedy generation of
grouped-query, multi-query (tied) and llama3-scaled models on one device, dp2 x tp2 and tp2 x
ulysses2. Not part of the default run (its name does not start with test_): it needs torch and
transformers, which DTorch does not. Run it from tests/python with a Python that has torch,
transformers and pytest, and dtorch importable: installed there as into .venv, or built into a
folder of its own and put on the paths, e.g. with a separate venv /work/refvenv:

    /work/refvenv/bin/pip install torch transformers numpy safetensors pytest meson-python meson ninja
    PATH=/work/refvenv/bin:$PATH /work/refvenv/bin/pip install --no-build-isolation --no-deps \
        --target /tmp/dtorch-ref --config-settings=build-dir=$PWD/build-ref \
        --config-settings=setup-args=-Dcuda=disabled .                     # from the repository root
    PYTHONPATH=/tmp/dtorch-ref /work/refvenv/bin/python -m pytest -q check_transformers.py
"""
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
    np.testing.assert_array_equal(ours.generate(ids[:, :4], 6), greedy)
