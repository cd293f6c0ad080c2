"""Fuzzes the HTTP handler of examples/serve.py: the body of POST /v1/completions, its parsing and
validation. The app is the example's own (make_app over a Served model and its Driver thread), on
a tiny random-weight Llama written once, answered by aiohttp's test server in this process.

The contract: any body gets a 4xx answer with a JSON error ({"error": {"message", "type"}}) or a
good completion (status 200: as many new ids as asked at most, each in the vocabulary, and the
usage counts; streamed: server-sent events ending in [DONE]), never a 500, a traceback, a dropped
connection or a hang, and the driver thread keeps running.

The input's first byte picks whether the rest is the body itself (raw: byte mutations of good
bodies, with a dictionary of the fields' names) or the choices that build one (structured: the
fields given any JSON value, good ones more often).
"""
import asyncio
import json
import os
import sys

import atheris

import fuzzlib

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples")
sys.path.insert(0, os.path.abspath(EXAMPLES))

import dtorch
from dtorch.models import LlamaConfig, LlamaForCausalLM
import serve

# Coverage of the request's checks alone: the driver thread's steps run beside the handler, and
# their coverage would depend on timing, so that one run's inputs would not be the next's.
serve.parse_request = atheris.instrument_func(serve.parse_request)

from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

CONFIG = dict(vocab_size=64, hidden_size=8, intermediate_size=12, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, max_position_embeddings=16, bos_token_id=1, eos_token_id=2)
MAX_LEN = 10
FIELDS = ["model", "prompt", "max_tokens", "temperature", "stream", "top_p", "top_k", "n", "best_of", "echo"]
STRINGS = ["tiny", "", "hi", "Once upon", "other", "\u00e9\u4e2d"]
GOOD = [{"model": "tiny", "prompt": "hi", "max_tokens": 3},
        {"model": "tiny", "prompt": [1, 5, 9], "max_tokens": 2, "stream": True},
        {"model": "tiny", "prompt": "Once", "max_tokens": 1, "temperature": 0.7, "top_k": 0, "n": 1}]


class App:
    """The example's app over one model, and a client on an event loop of its own."""

    def __init__(self):
        directory = fuzzlib.scratch_dir("serve")
        dtorch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(directory)
        self.served = {"tiny": serve.Served("tiny", directory, [0], max_batch=2, max_len=MAX_LEN)}
        self.driver = serve.Driver(self.served)
        self.driver.start()
        self.loop = asyncio.new_event_loop()
        self.client = TestClient(TestServer(serve.make_app(self.served, self.driver)), loop=self.loop,
                                 timeout=ClientTimeout(total=120))
        self.loop.run_until_complete(self.client.start_server())

    def close(self):
        self.loop.run_until_complete(self.client.close())
        self.driver.stopping = True
        self.driver.wake.set()
        self.driver.join(60)
        dtorch.shutdown()

    def post(self, body):
        async def go():
            # through the client's session: TestClient.post keeps every response until it closes
            async with self.client.session.post(self.client.make_url("/v1/completions"), data=body,
                                                headers={"Content-Type": "application/json"}) as r:
                return r.status, r.headers.get("Content-Type", ""), await r.read()
        return self.loop.run_until_complete(go())


def _structured(fdp):
    body = dict(GOOD[fdp.ConsumeIntInRange(0, len(GOOD) - 1)]) if fdp.ConsumeIntInRange(0, 3) else {}
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        key = fdp.PickValueInList(FIELDS)
        k = fdp.ConsumeIntInRange(0, 3)
        if k == 0 and key == "prompt":
            body[key] = [fuzzlib.pick_int(fdp, 70) for _ in range(fdp.ConsumeIntInRange(0, 12))]
        elif k == 0:
            body[key] = fuzzlib.pick_int(fdp, 12)
        else:
            body[key] = fuzzlib.json_value(fdp, STRINGS)
    if fdp.ConsumeIntInRange(0, 15) == 0:
        return json.dumps(fuzzlib.json_value(fdp, STRINGS)).encode()
    return json.dumps(body).encode()


def _check_choice(choice, limit):
    ids = choice["token_ids"]
    if not isinstance(ids, list) or len(ids) > limit or any(not isinstance(t, int) or not 0 <= t < 64 for t in ids):
        raise fuzzlib.Finding(f"token_ids {ids!r} (at most {limit} in [0, 64) asked)")
    if not isinstance(choice["text"], str):
        raise fuzzlib.Finding(f"text {choice['text']!r}")


def test_one_input(data):
    if not data:
        return
    body = _structured(atheris.FuzzedDataProvider(data[1:])) if data[0] & 1 else data[1:]
    try:
        status, kind, raw = APP.post(body)
    except asyncio.TimeoutError as e:
        raise fuzzlib.Finding(f"no answer in 120 s to {body!r}") from e
    fuzzlib.tally(status)
    if not APP.driver.is_alive():
        raise fuzzlib.Finding(f"the driver thread died on {body!r}")
    try:
        if 400 <= status < 500:
            error = json.loads(raw)["error"]
            if not isinstance(error["message"], str) or not error["message"] or not isinstance(error["type"], str):
                raise fuzzlib.Finding(f"{status}: error {error!r}")
            return
        if status != 200:
            raise fuzzlib.Finding(f"status {status} for {body!r}: {raw[:300]!r}")
        sent = json.loads(body)
        limit = sent.get("max_tokens", 16)
        if "text/event-stream" in kind:
            events = [line[6:] for line in raw.decode().split("\n\n") if line]
            if events[-1] != "[DONE]" or len(events) < 2:
                raise fuzzlib.Finding(f"a stream that ends {events[-2:]!r}")
            chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
            for c in chunks:
                _check_choice(c, 1)
            if len(chunks) - 1 > limit or chunks[-1]["finish_reason"] not in ("stop", "length"):
                raise fuzzlib.Finding(f"{len(chunks) - 1} tokens streamed for max_tokens {limit}, then {chunks[-1]!r}")
            return
        reply = json.loads(raw)
        _check_choice(reply["choices"][0], limit)
        usage = reply["usage"]
        if usage["completion_tokens"] != len(reply["choices"][0]["token_ids"]) or \
                usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
            raise fuzzlib.Finding(f"usage {usage!r} for {reply['choices'][0]!r}")
    except fuzzlib.Finding:
        raise
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise fuzzlib.Finding(f"status {status}: a malformed answer {raw[:300]!r} to {body!r}: {e!r}") from e


if __name__ == "__main__":
    dtorch.init(workers="thread")
    APP = App()
    fuzzlib.at_exit(APP.close)
    fuzzlib.main(test_one_input, [b"\x00" + json.dumps(b).encode() for b in GOOD]
                 + [b"\x01" + bytes(range(i, i + 40)) for i in range(0, 160, 16)],
                 dictionary=[f'"{f}"' for f in FIELDS] + [f'"{s}"' for s in STRINGS] + [
                     "true", "false", "null", "NaN", "Infinity", "-1", "0", "1e999", "[]", "{}",
                     "18446744073709551616"])
