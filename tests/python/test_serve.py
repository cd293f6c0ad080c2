"""examples/serve.py driven over HTTP by a real client (urllib): two models on disjoint meshes,
requests of both interleaved and more of them than the batch has rows, so that requests join and
leave running batches; every reply's tokens equal `generate` of the same prompt alone. Also
streaming (server-sent events), the OpenAI fields, and bad requests. And the ContinuousBatcher
itself, on meshes of 1 and 2 devices, with the ring of cache slots wrapping around."""
import concurrent.futures
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch.models import ContinuousBatcher, LlamaConfig, LlamaForCausalLM, parallelize_llama

SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "serve.py")


def _checkpoint(path, seed, **overrides):
    cfg = ref.tiny_config(**overrides)
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    model.load_state_dict(ref.random_weights(cfg, seed))
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    dtorch.shutdown()
    dtorch.init(workers="thread")
    root = tmp_path_factory.mktemp("serve")
    dirs = {"a": _checkpoint(root / "a", 1), "b": _checkpoint(root / "b", 2, num_hidden_layers=3)}
    dtorch.shutdown()
    proc = subprocess.Popen([sys.executable, SERVE, "--model", f"a={dirs['a']}", "--devices", "a=0,1",
                             "--model", f"b={dirs['b']}", "--devices", "b=2", "--max-batch", "3", "--max-len", "24",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line}{proc.stderr.read()}")
    yield {"url": line.split(" at ")[1].strip(), "dirs": dirs}
    proc.terminate()
    proc.communicate(timeout=30)


def _post(url, body, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url + "/v1/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _expected(dirs, cases):
    """generate() of each prompt alone, greedy, on one device of this process."""
    dtorch.shutdown()
    dtorch.init(workers="thread")
    models = {n: LlamaForCausalLM.from_pretrained(d) for n, d in dirs.items()}
    want = [models[n].generate(np.array([p]), max_new_tokens=k, eos_token_id=models[n].config.eos_token_id)[0, len(p):]
            for n, p, k in cases]
    dtorch.shutdown()
    # generate pads after an end token; the server stops at it
    out = []
    for (n, _, _), w in zip(cases, want):
        w = w.tolist()
        eos = models[n].config.eos_token_id
        out.append(w[:w.index(eos) + 1] if eos in w else w)
    return out


def test_concurrent_requests_to_two_models_match_generate(server):
    rng = np.random.default_rng(0)
    cases = [("a" if i % 3 else "b", rng.integers(3, 61, rng.integers(1, 8)).tolist(), int(rng.integers(1, 12)))
             for i in range(10)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda c: _post(server["url"], {"model": c[0], "prompt": c[1], "max_tokens": c[2]}),
                                cases))
    want = _expected(server["dirs"], cases)
    for (name, prompt, k), (status, text), w in zip(cases, replies, want):
        assert status == 200, text
        reply = json.loads(text)
        choice = reply["choices"][0]
        assert reply["object"] == "text_completion" and reply["model"] == name
        assert choice["token_ids"] == w, (name, prompt, k)
        assert choice["finish_reason"] == ("stop" if len(w) < k else "length")
        assert reply["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(w),
                                  "total_tokens": len(prompt) + len(w)}


def test_streaming_sends_each_token_then_done(server):
    status, plain = _post(server["url"], {"model": "a", "prompt": [5, 9, 11], "max_tokens": 6})
    req = urllib.request.Request(server["url"] + "/v1/completions",
                                 data=json.dumps({"model": "a", "prompt": [5, 9, 11], "max_tokens": 6,
                                                  "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in r.read().decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed == json.loads(plain)["choices"][0]["token_ids"]
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == json.loads(plain)["choices"][0]["finish_reason"]


@pytest.mark.parametrize("body, status, message", [
    ({"model": "zzz", "prompt": [1]}, 404, "not served here"),
    ({"model": "a", "prompt": []}, 400, "prompt must be"),
    ({"model": "a", "prompt": [1, 99]}, 400, "token ids must be in [0, 61)"),
    ({"model": "a", "prompt": [1], "max_tokens": 0}, 400, "max_tokens must be"),
    ({"model": "a", "prompt": [1] * 20, "max_tokens": 10}, 400, "do not fit"),
    ({"model": "a", "prompt": [1], "temperature": -1}, 400, "temperature must be"),
    ({"model": "a", "prompt": [1], "top_p": 0.5}, 400, "top_p is not served"),
    (b"{not json", 400, "not JSON"),
    # bodies the fuzzer (tests/fuzz/python/fuzz_serve.py) found answered 500
    ({"model": ["a"], "prompt": [1]}, 400, "model must be a string"),             # unhashable in `in served`
    ({"model": "a", "prompt": [1, 2**64]}, 400, "token ids must be in [0, 61), got 18446744073709551616"),
    ({"model": "a", "prompt": "\ud800"}, 400, "prompt is not text"),                # UTF-8 encoding failed
    (b"[" * 5000, 400, "not JSON"),                                                # RecursionError
    (b'{"model": "a", "max_tokens": 1' + b"0" * 5000 + b"}", 400, "not JSON"),     # past json's 4300 digits
    ({"model": "a", "prompt": [1], "temperature": float("inf")}, 400, "temperature must be a finite number"),
    ({"model": "a", "prompt": [1], "stream": "no"}, 400, "stream must be true or false"),   # streamed before
    ({"model": "a", "prompt": [1], "n": [1]}, 400, "n is not served"),
])
def test_bad_requests_get_a_clear_error(server, body, status, message):
    got, text = _post(server["url"], body, raw=isinstance(body, bytes))
    assert got == status and message in json.loads(text)["error"]["message"], text
    ok, _ = _post(server["url"], {"model": "b", "prompt": [1, 2], "max_tokens": 2})
    assert ok == 200


@pytest.mark.parametrize("ids", [(0,), (0, 1)], ids=["1 device", "tp2"])
def test_batcher_matches_generate_as_rows_come_and_go(mode, ids):
    cfg = ref.tiny_config()
    mesh = dtorch.DeviceMesh("cpu", list(ids), mesh_dim_names=("tp",))
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg), device_mesh=mesh)
    parallelize_llama(model, mesh)
    model.load_state_dict(ref.random_weights(cfg, 3))
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


def test_sampled_rows_beside_greedy_ones(mode):
    """Rows sampled at a temperature share steps with greedy rows without changing them; a tiny
    temperature samples the argmax, a large one other tokens too."""
    cfg = ref.tiny_config()
    mesh = dtorch.DeviceMesh("cpu", [0, 1], mesh_dim_names=("tp",))
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg), device_mesh=mesh)
    parallelize_llama(model, mesh)
    model.load_state_dict(ref.random_weights(cfg, 6))
    batcher = ContinuousBatcher(model, max_batch=4, max_len=32)
    prompt = [5, 17, 29]
    greedy = model.generate(np.array([prompt]), max_new_tokens=20, eos_token_id=None)[0, 3:].tolist()
    hot = [batcher.submit(prompt, 20, eos_token_id=[], temperature=100.0) for _ in range(2)]
    cold = batcher.submit(prompt, 20, eos_token_id=[], temperature=1e-6)
    plain = batcher.submit(prompt, 20, eos_token_id=[])
    batcher.run_until_idle()
    assert plain.tokens == greedy and cold.tokens == greedy
    for r in hot:
        assert len(r.tokens) == 20 and all(0 <= t < cfg["vocab_size"] for t in r.tokens)
        assert sum(a != b for a, b in zip(r.tokens, greedy)) >= 5     # at T=100 over 61 tokens: nearly uniform
    assert hot[0].tokens != hot[1].tokens                             # each row draws its own noise
    # as T -> 0 the sample is the argmax, also for temperatures whose inverse overflows float32
    colder = [batcher.submit(prompt, 20, eos_token_id=[], temperature=t) for t in (1e-46, 1e-40, 1e-38, 1e-30)]
    batcher.run_until_idle()
    assert [r.tokens for r in colder] == [greedy] * 4
    with pytest.raises(ValueError, match="temperature"):
        batcher.submit(prompt, 2, temperature=-0.5)
