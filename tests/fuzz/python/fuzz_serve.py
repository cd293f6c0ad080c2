"""Fuzzes dtorch-serve's request handling (dtorch.serving.server): the bodies of POST
/v1/completions and /v1/chat/completions, their parsing and checking by the schemas of
dtorch.serving.protocol. The app is the server's own (Server over a ServedModel and its driver
thread), on a tiny random-weight Llama written once beside a byte-level tokenizer fixture (so text
prompts, chat templates and stop strings run), answered by aiohttp's test server in this process.

The contract: any body gets a 4xx answer with a JSON error ({"error": {"message", "type"}}) or a
good reply (status 200: choices whose text is a string, whose token ids when asked are in the
vocabulary and at most as many as asked, finished by "stop" or "length", and usage counts that add
up; streamed: server-sent events ending in [DONE]), never a 500, a traceback, a dropped connection
or a hang, and the driver thread keeps running.

The input's first byte picks the endpoint (bit 1) and whether the rest is the body itself (bit 0
clear: raw, byte mutations of good bodies, with a dictionary of the fields' names) or the choices
that build one (structured: the fields given any JSON value, good ones more often).
"""
import asyncio
import json
import os
import shutil
import sys

import atheris

import fuzzlib

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "fixtures", "tokenizers",
                       "bytelevel")

# Coverage of the request's checks alone: the driver thread's steps run beside the handler, and
# their coverage would depend on timing, so that one run's inputs would not be the next's.
with atheris.instrument_imports(include=["dtorch.serving.protocol"]):
    import dtorch.serving.protocol  # noqa: F401

import dtorch
from dtorch.models import LlamaConfig, LlamaForCausalLM
from dtorch.serving.server import ServedModel, Server

from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

VOCAB = 406                     # the byte-level fixture's tokens
CONFIG = dict(vocab_size=VOCAB, hidden_size=8, intermediate_size=12, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, max_position_embeddings=48, bos_token_id=400, eos_token_id=404)
MAX_LEN = 40
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "stream",
          "stream_options", "top_p", "top_k", "min_p", "seed", "stop", "n", "logprobs", "top_logprobs", "echo",
          "presence_penalty", "frequency_penalty", "repetition_penalty", "return_token_ids", "best_of", "suffix",
          "logit_bias", "user", "tools", "ignore_eos"]
STRINGS = ["tiny", "", "hi", "Once upon", "other", "\u00e9\u4e2d", "user", "assistant", "text"]
GOOD = [{"model": "tiny", "prompt": "hi", "max_tokens": 3},
        {"model": "tiny", "prompt": [1, 5, 9], "max_tokens": 2, "stream": True, "return_token_ids": True},
        {"model": "tiny", "prompt": "Once", "max_tokens": 4, "temperature": 0.7, "top_k": 3, "seed": 1, "n": 2,
         "logprobs": 2, "echo": True, "stop": ["e"]},
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True,
         "top_logprobs": 1, "stream": True, "stream_options": {"include_usage": True}}]
ENDPOINTS = ["/v1/completions", "/v1/chat/completions"]


class App:
    """The server's app over one model, and a client on an event loop of its own."""

    def __init__(self):
        directory = fuzzlib.scratch_dir("serve")
        dtorch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**CONFIG)).save_pretrained(directory)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(FIXTURE, f), directory)
        mesh = dtorch.DeviceMesh("cpu", [0])
        self.server = Server({"tiny": ServedModel("tiny", directory, mesh, max_num_seqs=2, max_model_len=MAX_LEN)})
        self.driver = self.server.driver
        self.driver.start()
        self.loop = asyncio.new_event_loop()
        self.client = TestClient(TestServer(self.server.app()), loop=self.loop, timeout=ClientTimeout(total=120))
        self.loop.run_until_complete(self.client.start_server())

    def close(self):
        self.loop.run_until_complete(self.client.close())
        self.server.close()
        dtorch.shutdown()

    def post(self, path, body):
        async def go():
            # through the client's session: TestClient.post keeps every response until it closes
            async with self.client.session.post(self.client.make_url(path), data=body,
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


def _check_choice(choice, limit, chat):
    text = choice["delta"].get("content", "") if "delta" in choice else \
        choice["message"]["content"] if chat else choice["text"]
    if not isinstance(text, str) or not isinstance(choice["index"], int):
        raise fuzzlib.Finding(f"a choice {choice!r}")
    ids = choice.get("token_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) > limit or
                            any(not isinstance(t, int) or not 0 <= t < VOCAB for t in ids)):
        raise fuzzlib.Finding(f"token_ids {ids!r} (at most {limit} in [0, {VOCAB}) asked)")
    if choice.get("finish_reason") not in (None, "stop", "length"):
        raise fuzzlib.Finding(f"finish_reason {choice['finish_reason']!r}")


def _check_usage(usage):
    if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
        raise fuzzlib.Finding(f"usage {usage!r}")


def test_one_input(data):
    if not data:
        return
    chat = bool(data[0] & 2)
    body = _structured(atheris.FuzzedDataProvider(data[1:])) if data[0] & 1 else data[1:]
    try:
        status, kind, raw = APP.post(ENDPOINTS[chat], body)
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
        limit = sent.get("max_completion_tokens") or sent.get("max_tokens") or MAX_LEN
        if "text/event-stream" in kind:
            events = [line[6:] for line in raw.decode().split("\n\n") if line]
            if events[-1] != "[DONE]" or len(events) < 2:
                raise fuzzlib.Finding(f"a stream that ends {events[-2:]!r}")
            seen, finished = set(), set()
            for event in events[:-1]:
                chunk = json.loads(event)
                for choice in chunk["choices"]:
                    _check_choice(choice, limit, chat)
                    seen.add(choice["index"])
                    if choice["finish_reason"] is not None:
                        finished.add(choice["index"])
                if chunk.get("usage"):
                    _check_usage(chunk["usage"])
            if not seen or finished != seen:
                raise fuzzlib.Finding(f"a stream whose choices {sorted(seen)} finished {sorted(finished)}")
            return
        reply = json.loads(raw)
        for choice in reply["choices"]:
            _check_choice(choice, limit, chat)
            if choice["finish_reason"] is None:
                raise fuzzlib.Finding(f"an unfinished choice {choice!r}")
        _check_usage(reply["usage"])
        if all("token_ids" in c for c in reply["choices"]) and \
                reply["usage"]["completion_tokens"] != sum(len(c["token_ids"]) for c in reply["choices"]):
            raise fuzzlib.Finding(f"usage {reply['usage']!r} for {reply['choices']!r}")
    except fuzzlib.Finding:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise fuzzlib.Finding(f"status {status}: a malformed answer {raw[:300]!r} to {body!r}: {e!r}") from e


if __name__ == "__main__":
    dtorch.init(workers="thread")
    APP = App()
    fuzzlib.at_exit(APP.close)
    fuzzlib.main(test_one_input, [bytes([2 * ("messages" in b)]) + json.dumps(b).encode() for b in GOOD]
                 + [b"\x01" + bytes(range(i, i + 40)) for i in range(0, 160, 16)],
                 dictionary=[f'"{f}"' for f in FIELDS] + [f'"{s}"' for s in STRINGS] + [
                     "true", "false", "null", "NaN", "Infinity", "-1", "0", "1e999", "[]", "{}",
                     "18446744073709551616"])
