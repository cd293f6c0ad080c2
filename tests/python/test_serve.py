"""The ContinuousBatcher (dtorch.serving), the engine behind dtorch-serve (test_openai_server.py drives
the server over HTTP): requests join and leave running batches on meshes of every kind (tp, dp, pp,
ulysses, ring), with the ring of cache slots wrapping around, each greedy request equal to
`generate` of its prompt alone; per-request sampling against numpy (the frequencies of samples
against the softmax of the model's logits, with temperature, top-k, top-p and min-p), penalties
and log-probabilities against numpy over the model's logits, seeds that repeat whatever else
runs, stop strings and text through a real tokenizer, abort and failure."""
import os

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch.models import (AutoTokenizer, ContinuousBatcher, LlamaConfig, LlamaForCausalLM, MistralConfig,
                           MistralForCausalLM, parallelize_llama)
from dtorch.serving import SamplingParams

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tokenizers")

MESHES = {"1 device": {"tp": 1}, "tp2": {"tp": 2}, "dp2": {"dp": 2}, "pp2": {"pp": 2}, "ulysses2": {"ulysses": 2},
          "ring2": {"ring": 2}, "dp2 x tp2": {"dp": 2, "tp": 2}}


def _model(dims, seed=3, **overrides):
    cfg = ref.tiny_config(**overrides)
    mesh = dtorch.init_device_mesh("cpu", tuple(dims.values()), mesh_dim_names=tuple(dims))
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg), device_mesh=mesh)
    parallelize_llama(model, mesh)
    model.load_state_dict(ref.random_weights(cfg, seed))
    return model


@pytest.mark.parametrize("dims, window", [({"tp": 1}, None), ({"tp": 2}, None), ({"tp": 2}, 3)],
                         ids=["1 device", "tp2", "tp2, a window of 3"])
def test_prompts_admitted_together_go_through_one_forward(mode, dims, window):
    """Prompts admitted at one step that fit one chunk are computed in one forward, right-aligned in
    a batch (the shorter ones' columns hidden), their keys written to their rows: each request equal
    to generate of its prompt alone, the choices of one prompt sharing its row of the batch, with
    a sliding window (Mistral) too; a prompt longer than the chunk goes apart."""
    if window is None:
        model = _model(dims, seed=7)
    else:
        cfg = ref.tiny_config(model_type="mistral", sliding_window=window)
        mesh = dtorch.init_device_mesh("cpu", tuple(dims.values()), mesh_dim_names=tuple(dims))
        model = MistralForCausalLM(MistralConfig.from_dict(cfg), device_mesh=mesh)
        parallelize_llama(model, mesh)
        model.load_state_dict(ref.random_weights(cfg, 7))
    batcher = ContinuousBatcher(model, max_batch=8, max_len=20, prefill_chunk=5)
    rng = np.random.default_rng(9)
    prompts = [rng.integers(3, 61, n).tolist() for n in (2, 6, 4, 1, 3, 9)]
    requests = [batcher.submit(p, 6, eos_token_id=[], logprobs=0) for p in prompts]
    requests.append(batcher.submit(prompts[2], 6, eos_token_id=[], temperature=1.0, seed=4))   # beside its twin
    batcher.run_until_idle()
    # prompts of 1, 5, 3 and 2 tokens before their last in one forward; the 8 of the 9-token one in 2
    assert batcher.prefills == 1 + 2
    alone = ContinuousBatcher(model, max_batch=1, max_len=20)       # one at a time: each prompt apart
    for p, r in zip(prompts, requests):
        assert r.tokens == model.generate(np.array([p]), max_new_tokens=6, eos_token_id=None)[0, len(p):].tolist()
        again = alone.submit(p, 6, eos_token_id=[], logprobs=0)
        alone.run_until_idle()
        assert np.allclose([lp for lp, _ in r.logprobs], [lp for lp, _ in again.logprobs], atol=1e-5), p
    twin = alone.submit(prompts[2], 6, eos_token_id=[], temperature=1.0, seed=4)
    alone.run_until_idle()
    assert requests[-1].tokens == twin.tokens


def _log_softmax(model, ids):
    logits = model(np.array([ids])).logits.numpy()[0].astype(np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


@pytest.mark.parametrize("dims", MESHES.values(), ids=MESHES.keys())
def test_batcher_matches_generate_as_rows_come_and_go(mode, dims):
    model = _model(dims)
    batcher = ContinuousBatcher(model, max_batch=2, max_len=10)      # 5 requests, 2 rows, 10 slots: it wraps
    rng = np.random.default_rng(1)
    cases = [(rng.integers(3, 61, n), k) for n, k in ((3, 6), (5, 3), (2, 8), (7, 4), (1, 9))]
    requests = [batcher.submit(p, k, eos_token_id=[]) for p, k in cases]
    batcher.run_until_idle()
    assert batcher.steps > 10
    for (p, k), r in zip(cases, requests):
        assert r.tokens == model.generate(p[None], max_new_tokens=k, eos_token_id=None)[0, len(p):].tolist()
        assert r.finish_reason == "length"
    with pytest.raises(ValueError, match="do not fit"):
        batcher.submit([1] * 8, 4)
    with pytest.raises(ValueError, match="empty"):
        batcher.submit([], 4)


@pytest.mark.parametrize("dims", [{"tp": 1}, {"tp": 2}], ids=["1 device", "tp2"])
def test_steps_compute_the_busy_rows_and_prompts_go_in_by_chunks(mode, dims):
    """A step computes the rows up to the highest busy one rounded up to a bucket (one client, one
    row), and a prompt but its last token is computed apart in chunks of prefill_chunk tokens: each
    request still equal to generate of its prompt alone (penalized ones to numpy), as rows are
    reused, the ring of slots wraps and other rows decode beside the chunks."""
    model = _model(dims, seed=5)
    batcher = ContinuousBatcher(model, max_batch=8, max_len=24, prefill_chunk=3)
    # a chunk runs the decoder alone: its keys are all it is for, and the lm_head would read its
    # whole weight for logits nobody uses
    heads, chunks_run = [], []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: heads.append(1))
    prefill = batcher._prefill
    batcher._prefill = lambda members: (chunks_run.append(len(heads)), prefill(members), chunks_run.append(len(heads)))
    alone = batcher.submit([5, 9, 13, 17, 21, 25, 29], 5, eos_token_id=[])
    batcher.run_until_idle()
    hook.remove()
    del batcher._prefill
    assert len(chunks_run) == 4 and chunks_run[0::2] == chunks_run[1::2], chunks_run    # no lm_head in a chunk
    assert alone.tokens == model.generate(np.array([[5, 9, 13, 17, 21, 25, 29]]), max_new_tokens=5,
                                          eos_token_id=None)[0, 7:].tolist()
    assert batcher.prefills == 2                                  # 6 prompt tokens apart, 3 at a time
    assert batcher.rows_computed == batcher.steps - 2 == 5        # 5 one-row steps; 2 steps were chunks only
    rng = np.random.default_rng(4)
    cases = [(rng.integers(3, 61, n).tolist(), k) for n, k in ((9, 4), (1, 6), (4, 12), (2, 3), (8, 5), (3, 7))]
    requests = [batcher.submit(p, k, eos_token_id=[]) for p, k in cases[:3]]
    penalized = batcher.submit(cases[0][0], 6, eos_token_id=[], presence_penalty=1.5, frequency_penalty=0.5)
    before = batcher.rows_computed, batcher.steps
    for _ in range(4):
        batcher.step()
    requests += [batcher.submit(p, k, eos_token_id=[]) for p, k in cases[3:]]   # while the others decode
    again = batcher.submit(cases[2][0], 6, eos_token_id=[], presence_penalty=1.5, frequency_penalty=0.5)
    batcher.run_until_idle()
    for (p, k), r in zip(cases, requests):
        assert r.tokens == model.generate(np.array([p]), max_new_tokens=k, eos_token_id=None)[0, len(p):].tolist()
    assert penalized.tokens == _penalized(model, cases[0][0], 6, presence=1.5, frequency=0.5)
    assert again.tokens == _penalized(model, cases[2][0], 6, presence=1.5, frequency=0.5)
    # `penalized` was admitted with the request of the same prompt (cases[0]): they share its 3
    # chunks, beside cases[2]'s one; of the four admitted later, the three prompts that fit one chunk
    # (cases[3], cases[5] and `again`'s, 1 to 3 tokens apart) go through one forward together, beside
    # cases[4]'s 3 chunks
    assert batcher.prefills == 2 + (3 + 1) + (3 + 1)
    assert batcher.rows_computed - before[0] < 8 * (batcher.steps - before[1])   # never all rows every step
    assert batcher.rows == [None] * 8
    # the choices of one prompt admitted together share its chunks, then sample apart
    chunks = batcher.prefills
    prompt = cases[4][0]
    choices = [batcher.submit(prompt, 5, eos_token_id=[], temperature=1.0, seed=s) for s in (1, 2, 3)]
    greedy = batcher.submit(prompt, 5, eos_token_id=[])
    batcher.run_until_idle()
    assert batcher.prefills - chunks == -(-(len(prompt) - 1) // 3)
    assert greedy.tokens == model.generate(np.array([prompt]), max_new_tokens=5, eos_token_id=None)[0, 8:].tolist()
    alone = ContinuousBatcher(model, max_batch=1, max_len=24)        # each seed alone: the same tokens
    for s, r in zip((1, 2, 3), choices):
        again = alone.submit(prompt, 5, eos_token_id=[], temperature=1.0, seed=s)
        alone.run_until_idle()
        assert r.tokens == again.tokens
    assert len({tuple(r.tokens) for r in choices}) > 1


def test_sampled_rows_beside_greedy_ones(mode):
    """Rows sampled at a temperature share steps with greedy rows without changing them; a tiny
    temperature samples the argmax, a large one other tokens too."""
    model = _model({"tp": 2}, seed=6)
    batcher = ContinuousBatcher(model, max_batch=4, max_len=32)
    prompt = [5, 17, 29]
    greedy = model.generate(np.array([prompt]), max_new_tokens=20, eos_token_id=None)[0, 3:].tolist()
    hot = [batcher.submit(prompt, 20, eos_token_id=[], temperature=100.0) for _ in range(2)]
    cold = batcher.submit(prompt, 20, eos_token_id=[], temperature=1e-6)
    plain = batcher.submit(prompt, 20, eos_token_id=[])
    batcher.run_until_idle()
    assert plain.tokens == greedy and cold.tokens == greedy
    for r in hot:
        assert len(r.tokens) == 20 and all(0 <= t < 61 for t in r.tokens)
        assert sum(a != b for a, b in zip(r.tokens, greedy)) >= 5     # at T=100 over 61 tokens: nearly uniform
    assert hot[0].tokens != hot[1].tokens                             # each row draws its own noise
    # as T -> 0 the sample is the argmax, also for temperatures whose inverse overflows float32
    colder = [batcher.submit(prompt, 20, eos_token_id=[], temperature=t) for t in (1e-46, 1e-40, 1e-38, 1e-30)]
    # temperatures and repetition penalties past float32's range sample (uniformly, at T -> inf)
    extreme = [batcher.submit(prompt, 20, eos_token_id=[], temperature=1e300, top_k=30, top_p=0.5, min_p=0.5),
               batcher.submit(prompt, 20, eos_token_id=[], repetition_penalty=1e300),
               batcher.submit(prompt, 20, eos_token_id=[], repetition_penalty=1e-300, temperature=1e-300)]
    batcher.run_until_idle()
    assert [r.tokens for r in colder] == [greedy] * 4
    assert [r.finish_reason for r in extreme] == ["length"] * 3            # no NaN: a token every step
    assert all(0 <= t < 61 for r in extreme for t in r.tokens)
    with pytest.raises(ValueError, match="temperature"):
        batcher.submit(prompt, 2, temperature=-0.5)


def test_a_seed_repeats_its_tokens_whatever_runs_beside_it_on_any_mesh(mode):
    prompt = [5, 17, 29]
    runs = []
    for dims, traffic in (({"tp": 1}, 0), ({"tp": 2}, 3), ({"dp": 2}, 2)):
        model = _model(dims, seed=6)
        batcher = ContinuousBatcher(model, max_batch=4, max_len=32)
        for i in range(traffic):         # other rows first, so the seeded one runs in another row
            batcher.submit([7, 8 + i], 12, eos_token_id=[], temperature=1.0)
        seeded = [batcher.submit(prompt, 12, eos_token_id=[], temperature=0.9, top_k=20, seed=s) for s in (7, 8)]
        batcher.run_until_idle()
        runs.append([r.tokens for r in seeded])
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][0] != runs[0][1]


def _frequencies(batcher, prompt, n, **params):
    requests = [batcher.submit(prompt, 1, eos_token_id=[], seed=s, **params) for s in range(n)]
    batcher.run_until_idle()
    return np.bincount([r.tokens[0] for r in requests], minlength=61) / n


def test_samples_follow_the_softmax_of_the_warped_logits():
    """The first token of many seeded requests: its frequencies against numpy's probabilities of
    transformers' warps (temperature, then top-k, top-p, min-p) over the model's logits."""
    dtorch.shutdown()
    dtorch.init(workers="thread")
    try:
        model = _model({"tp": 2}, seed=4)
        batcher = ContinuousBatcher(model, max_batch=16, max_len=8)
        prompt = [5, 17]
        logits = model(np.array([prompt])).logits.numpy()[0, -1].astype(np.float64)
        order = np.argsort(-logits)
        n = 1500

        def softmax(x):
            e = np.exp(x - x.max())
            return e / e.sum()

        def check(freq, p):
            assert freq[p == 0].sum() == 0                             # nothing outside what the warp keeps
            worst = (np.abs(freq - p) / (np.sqrt(p * (1 - p) / n) + 1e-12)).max()
            assert worst <= 5, f"a frequency {worst:.1f} standard deviations off its probability"
            assert 0.5 * np.abs(freq - p).sum() < 0.1

        check(_frequencies(batcher, prompt, n, temperature=1.0), softmax(logits))
        check(_frequencies(batcher, prompt, n, temperature=0.5), softmax(logits / 0.5))
        kept = np.full(61, -np.inf)
        kept[order[:5]] = logits[order[:5]] / 0.7
        check(_frequencies(batcher, prompt, n, temperature=0.7, top_k=5), softmax(kept))
        p = softmax(logits / 1.5)
        nucleus = order[:np.searchsorted(np.cumsum(p[order]), 0.6) + 1]
        kept = np.full(61, -np.inf)
        kept[nucleus] = logits[nucleus] / 1.5
        check(_frequencies(batcher, prompt, n, temperature=1.5, top_p=0.6), softmax(kept))
        p = softmax(logits / 2.0)
        kept = np.where(p >= 0.3 * p.max(), logits / 2.0, -np.inf)
        check(_frequencies(batcher, prompt, n, temperature=2.0, min_p=0.3), softmax(kept))
    finally:
        dtorch.shutdown()


def _penalized(model, ids, k, presence=0.0, frequency=0.0, repetition=1.0):
    out = []
    for _ in range(k):
        logits = model(np.array([ids + out])).logits.numpy()[0, -1].astype(np.float64)
        seen = np.isin(np.arange(logits.size), ids + out)
        logits = np.where(seen, np.where(logits < 0, logits * repetition, logits / repetition), logits)
        counts = np.bincount(np.array(out, np.int64), minlength=logits.size)
        out.append(int(np.argmax(logits - frequency * counts - presence * (counts > 0))))
    return out


def test_penalties_and_logprobs_per_row(mode):
    """One batch holds a plain greedy row, penalized rows and rows asking for log-probabilities (of
    their prompt too): each gets what it alone would, against numpy over the model's logits."""
    model = _model({"tp": 2}, seed=8)
    batcher = ContinuousBatcher(model, max_batch=4, max_len=32)
    prompt = [5, 17, 29, 5]
    plain = batcher.submit(prompt, 10, eos_token_id=[])
    penalized = [batcher.submit(prompt, 10, eos_token_id=[], **p) for p in (
        dict(repetition_penalty=1.7), dict(presence_penalty=1.5, frequency_penalty=0.5))]
    logged = batcher.submit(prompt, 6, eos_token_id=[], logprobs=3, prompt_logprobs=2)
    batcher.run_until_idle()
    assert plain.tokens == model.generate(np.array([prompt]), max_new_tokens=10, eos_token_id=None)[0, 4:].tolist()
    assert penalized[0].tokens == _penalized(model, prompt, 10, repetition=1.7)
    assert penalized[1].tokens == _penalized(model, prompt, 10, presence=1.5, frequency=0.5)
    assert penalized[0].tokens != plain.tokens and penalized[1].tokens != plain.tokens
    everything = prompt + logged.tokens
    lsm = _log_softmax(model, everything)
    for i, (value, top) in enumerate(logged.prompt_logprobs + logged.logprobs):   # entry i: token i + 1
        assert value == pytest.approx(lsm[i, everything[i + 1]], abs=1e-5)
        k = 2 if i < len(prompt) - 1 else 3
        assert [t for t, _ in top] == np.argsort(-lsm[i], kind="stable")[:k].tolist()
        assert [v for _, v in top] == pytest.approx(np.sort(lsm[i])[::-1][:k], abs=1e-5)
    assert len(logged.prompt_logprobs) == len(prompt) - 1 and len(logged.logprobs) == 6


def test_text_and_stop_strings_through_a_tokenizer():
    dtorch.shutdown()
    dtorch.init(workers="thread")
    try:
        tok = AutoTokenizer.from_pretrained(os.path.join(FIXTURES, "spm"))
        model = _model({"tp": 1}, seed=9, vocab_size=len(tok))
        batcher = ContinuousBatcher(model, max_batch=3, max_len=40, tokenizer=tok)
        prompt = tok.encode("Grüße aus Köln")
        whole = batcher.submit(prompt, 24, eos_token_id=[])
        seen = []
        streamed = batcher.submit(prompt, 24, eos_token_id=[], stop=["\x00never"],
                                  on_token=lambda r, t: seen.append(r.text_ready()))
        batcher.run_until_idle()
        text = tok.decode(whole.tokens, skip_special_tokens=True)
        assert whole.text == text and streamed.text == text
        # what a stream may show grows as a prefix of the text, holding back what could begin a stop string
        assert all(text.startswith(s) for s in seen) and seen[-1] == text
        assert all(len(s) <= len(r) for s, r in zip(seen, seen[1:]))
        at = next(i for i in range(3, len(text) - 2) if text.find(text[i:i + 2]) == i)
        cut = batcher.submit(prompt, 24, eos_token_id=[], stop=[text[at:at + 2]])
        batcher.run_until_idle()
        assert cut.text == text[:at] and cut.finish_reason == "stop"
        assert cut.tokens == whole.tokens[:len(cut.tokens)] and len(cut.tokens) < 24
        with pytest.raises(ValueError, match="stop"):
            ContinuousBatcher(model, max_batch=1, max_len=8).submit(prompt[:2], 2, stop=["x"])
    finally:
        dtorch.shutdown()


@pytest.mark.parametrize("dims", [{"tp": 1}, {"tp": 2}, {"pp": 2}, {"dp": 2}], ids=["1 device", "tp2", "pp2", "dp2"])
def test_the_next_step_is_issued_before_the_last_one_lands(mode, dims):
    """In a steady decode each step is issued while the one before is still pending: a token's
    on_token runs when the step after it is already issued, each row fed on the devices the token
    the pending step makes it; every request equal to generate of its prompt alone. A model that
    runs all its rows every step (pipelined, dp) lands each step before the next."""
    model = _model(dims, seed=2)
    batcher = ContinuousBatcher(model, max_batch=4, max_len=32)
    issued = {}

    def seen(request, token):
        if token is not None:
            issued.setdefault(request.id, []).append(batcher.launched)

    prompts = [[5, 9 + i] for i in range(3)] + [[7]]
    requests = [batcher.submit(p, 10, eos_token_id=[], on_token=seen) for p in prompts]
    batcher.run_until_idle()
    for p, r in zip(prompts, requests):
        assert r.tokens == model.generate(np.array([p]), max_new_tokens=10, eos_token_id=None)[0, len(p):].tolist()
        assert r.finish_reason == "length"
    # step 0 takes the 2-token prompts' first tokens (apart, or fed where all rows run) and the
    # 1-token one's only one; steps 1..10 make tokens 1..10 of the others (9 of the 1-token one)
    assert batcher.steps == batcher.launched == 11
    if "pp" in dims or "dp" in dims:
        assert batcher.overlapped == 0
        assert issued[requests[0].id] == list(range(2, 12))          # step i lands before step i + 1 is issued
        return
    assert batcher.overlapped == 10                                  # every step after the first
    # token j of a 2-token prompt comes from step j + 1, landed once step j + 2 is issued (the
    # last one, which no step after feeds, at the end); of the 1-token prompt from step j, landed
    # once step j + 1 is (its last one beside the others' last step)
    assert issued[requests[0].id] == list(range(3, 12)) + [11]
    assert issued[requests[3].id] == list(range(2, 12))
    assert batcher.dropped == 0


def test_a_row_ended_by_an_end_token_drops_the_token_of_the_step_after(mode):
    """A request that ends by an end token at step N was fed in step N + 1 already (issued before
    N landed): that token is dropped, never shown to on_token nor counted, and the row, re-used by
    a waiting request while N + 1 is still pending, gives that one only its own tokens."""
    model = _model({"tp": 1}, seed=11)
    prompt, other = [5, 17, 29], [8, 3, 44, 12]
    greedy = model.generate(np.array([prompt]), max_new_tokens=10, eos_token_id=None)[0, 3:].tolist()
    at = next(i for i in range(2, 10) if greedy[i] not in greedy[:i])          # an id first made at token i
    batcher = ContinuousBatcher(model, max_batch=1, max_len=32)
    shown, beside = [], []
    prefill = batcher._prefill          # whether a step that fed `ended` is pending as a prompt goes in
    batcher._prefill = lambda members: (beside.append(any(r is ended for s in batcher._inflight for r in s.rows)),
                                        prefill(members))
    ended = batcher.submit(prompt, 10, eos_token_id=[greedy[at]], on_token=lambda r, t: shown.append(t))
    after = batcher.submit(other, 6, eos_token_id=[])
    batcher.run_until_idle()
    assert beside == [False, True]      # `after` took the row while the step whose token is dropped ran
    assert ended.tokens == greedy[:at + 1] and ended.finish_reason == "stop"
    assert shown == greedy[:at + 1] + [None]
    assert batcher.dropped == 1
    assert after.tokens == model.generate(np.array([other]), max_new_tokens=6, eos_token_id=None)[0, 4:].tolist()
    assert after.finish_reason == "length" and batcher.overlapped > 0


def test_a_row_whose_request_ends_with_the_pending_step_takes_the_next_one_at_once(mode):
    """A request whose last token (its max_new_tokens) the pending step makes leaves its row to a
    waiting request as the next step is issued: that step lands the old request's token, the new
    one gets only its own; a failure then ends both."""
    model = _model({"tp": 1}, seed=12)
    for fail in (False, True):
        batcher = ContinuousBatcher(model, max_batch=1, max_len=32)
        first = batcher.submit([7], 3, eos_token_id=[])
        second = batcher.submit([8, 30], 4, eos_token_id=[])
        for _ in range(3):          # steps 0, 1, 2 issued (each makes a token of `first`), 0 and 1 landed
            batcher.step()
        assert len(first.tokens) == 2 and batcher.rows[0] is first
        pending = batcher.launch()  # step 3: `second` takes the row while step 2 is pending
        assert batcher.rows[0] is second and not first.done
        if fail:
            batcher.fail("device 0 failed")
            assert first.finish_reason == second.finish_reason == "error" and first.wait(0) == first.tokens
            continue
        batcher.land_before(pending)
        assert first.tokens == model.generate(np.array([[7]]), max_new_tokens=3, eos_token_id=None)[0, 1:].tolist()
        assert first.finish_reason == "length" and batcher.rows[0] is second
        batcher.run_until_idle()
        assert second.tokens == model.generate(np.array([[8, 30]]), max_new_tokens=4, eos_token_id=None)[0, 2:].tolist()
        assert batcher.dropped == 0 and batcher.rows == [None]


def test_abort_and_failure_end_requests(mode):
    model = _model({"tp": 1})
    batcher = ContinuousBatcher(model, max_batch=1, max_len=32)
    done = []
    running = batcher.submit([5, 6], 20, eos_token_id=[], on_token=lambda r, t: t is None and done.append(r))
    waiting = batcher.submit([5, 6], 20, eos_token_id=[], on_token=lambda r, t: t is None and done.append(r))
    after = batcher.submit([7, 8], 3, eos_token_id=[])
    for _ in range(4):
        batcher.step()
    batcher.abort(running)
    batcher.abort(waiting)
    batcher.run_until_idle()
    assert running.finish_reason == waiting.finish_reason == "abort"
    assert len(done) == 2 and {id(r) for r in done} == {id(running), id(waiting)}    # each told once
    assert len(running.tokens) < 20 and waiting.tokens == []
    assert after.tokens == model.generate(np.array([[7, 8]]), max_new_tokens=3, eos_token_id=None)[0, 2:].tolist()
    queued = batcher.submit([5, 6], 4, eos_token_id=[])
    batcher.fail("device 0 failed")
    assert queued.finish_reason == "error" and queued.error == "device 0 failed" and queued.wait(0) == []
    with pytest.raises(RuntimeError, match="device 0 failed"):
        batcher.submit([5], 2)


@pytest.mark.parametrize("params, message", [
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"), (dict(min_p=2.0), "min_p"), (dict(presence_penalty=3.0), "presence_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(logprobs=21), "logprobs"), (dict(seed=1.5), "seed"),
    (dict(stop=[""]), "stop"), (dict(top_k=True), "top_k"),
])
def test_sampling_params_are_checked(params, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**params)
    assert SamplingParams(top_k=-1, seed=2 ** 70, stop="x").stop == ("x",)
