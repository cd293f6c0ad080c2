"""The captured decode step: generate records one step of every group once (dtorch.capture) and
replays it. Tokens against the numpy reference's greedy decode, and against the same generation
without capture (sampling, padding, pipelines, Ulysses, Ring's fallback)."""
import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch.models import StaticCache
from dtorch.parallel.pipeline import schedule_of
from test_llama import greedy_reference
from test_llama_parallel import MESHES, build, tokens

pytestmark = pytest.mark.usefixtures("thread_runtime")

CAPTURED = {
    "one": ((1,), None, {}),
    "tp2": ((2,), ("tp",), {}),
    "dp2": ((2,), ("dp",), {}),
    "dp2-tp2": ((2, 2), ("dp", "tp"), {}),
    "pp2": MESHES["pp2"],
    "pp3-4layers": MESHES["pp3-4layers"],
    "dp2-tp2-pp2": MESHES["dp2-tp2-pp2"],
    "ulysses2": MESHES["ulysses2"],
    "tp2-ulysses2": MESHES["tp2-ulysses2"],
    "ring2": MESHES["ring2"],   # a cache laid out per device: generate falls back to the plain loop
}


@pytest.mark.parametrize("name", list(CAPTURED))
def test_captured_generation_equals_the_reference(name):
    shape, names, overrides = CAPTURED[name]
    model, sd, cfg = build(shape, names, overrides)
    ids = tokens((3, 5), seed=5)
    np.testing.assert_array_equal(model.generate(ids, 7, capture=True), greedy_reference(sd, cfg, ids, 7))
    mask = np.ones_like(ids)
    mask[0, :2] = 0
    kw = dict(do_sample=True, temperature=0.9, top_k=15, top_p=0.9, seed=4, attention_mask=mask)
    np.testing.assert_array_equal(model.generate(ids, 6, capture=True, **kw), model.generate(ids, 6, capture=False, **kw))


@pytest.mark.parametrize("name", ["one", "tp2", "pp2"])
def test_captured_generation_of_every_short_length_equals_the_reference(name):
    """generate queues the next captured step before it awaits a step's tokens: the first, the
    last and the one before it are the edges (1, 2 and 3 new tokens have none, one and two
    replays), and a generation that every row ends early (eos) stops with a step queued ahead."""
    shape, names, overrides = CAPTURED[name]
    model, sd, cfg = build(shape, names, overrides)
    ids = tokens((2, 4), seed=9)
    want = greedy_reference(sd, cfg, ids, 5)
    for n in range(1, 6):
        np.testing.assert_array_equal(model.generate(ids, n, capture=True), want[:, :4 + n], err_msg=f"{n} tokens")
    # both rows reach their eos at the second new token, so generation stops there, as the plain
    # loop does
    eos = [int(want[0, 5]), int(want[1, 5])]
    assert not set(eos) & set(want[:, 4].tolist()), "the test needs eos tokens that come second"
    got = model.generate(ids, 5, capture=True, eos_token_id=eos, pad_token_id=0)
    np.testing.assert_array_equal(got, want[:, :6])
    np.testing.assert_array_equal(got, model.generate(ids, 5, capture=False, eos_token_id=eos, pad_token_id=0))


@pytest.mark.parametrize("name", ["one", "tp2", "pp2"])
def test_a_captured_step_is_one_submission_per_group_and_a_fetch(name):
    """Each step past the first costs the user's thread one replay and one fetch per group, whatever
    the number of layers; without capture it is every op of the forward."""
    shape, names, overrides = CAPTURED[name]
    model, _, _ = build(shape, names, overrides)
    groups = schedule_of(model).n_microbatches
    ids = tokens((2, 4), seed=2)
    model.generate(ids, 2)   # what a model places once (RoPE's frequencies) is placed here
    counts = {}
    for capture in (True, False):
        for n in (4, 8):
            before = dtorch._C._ops_submitted()
            model.generate(ids, n, capture=capture)
            counts[capture, n] = dtorch._C._ops_submitted() - before
    assert counts[True, 8] - counts[True, 4] == 4 * (1 + groups)
    assert counts[False, 8] - counts[False, 4] >= 4 * 40     # every op of the forward: 50 a step here


def test_cache_position_writes_the_slots_it_names():
    """A forward with cache_position (host or DTensor) writes those slots and attends to the slots
    before them: the same logits as the forward that fills the cache in order."""
    model, sd, cfg = build((2,), ("tp",), {})
    ids = tokens((2, 6), seed=9)
    plain, slotted = StaticCache(8), StaticCache(8)
    model(ids[:, :4], past_key_values=plain)
    model(ids[:, :4], past_key_values=slotted, cache_position=np.arange(4))
    for t in (4, 5):
        a = model(ids[:, t:t + 1], past_key_values=plain).logits.numpy()
        at = dtorch.arange(t, t + 1, device_mesh=model.lm_head.weight.device_mesh)
        b = model(ids[:, t:t + 1], past_key_values=slotted, cache_position=at).logits.numpy()
        np.testing.assert_array_equal(a, b)
        want = ref.logits(sd, cfg, ids[:, :t + 1])[:, -1:]
        assert float(np.abs(b - want).max() / np.abs(want).max()) < 1e-4
    with pytest.raises(ValueError, match=r"cache_position must give 1 slot\(s\) in \[0, 8\), got \[9\]"):
        model(ids[:, 5:6], past_key_values=slotted, cache_position=[9])


@pytest.mark.parametrize("name", ["tp2", "pp2"])
def test_captured_generation_on_worker_processes(process_mode, name):
    """The same replays with every device a process of its own (records and regions over ipc and
    shared memory)."""
    shape, names, overrides = CAPTURED[name]
    model, sd, cfg = build(shape, names, overrides)
    ids = tokens((2, 5), seed=8)
    np.testing.assert_array_equal(model.generate(ids, 6), greedy_reference(sd, cfg, ids, 6))
