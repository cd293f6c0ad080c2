"""An OpenAI-style completions server for several Llama checkpoints at once, each on its own devices,
with continuous batching.

    pip install -r examples/requirements-serve.txt
    python serve.py --model small=DIR1 --devices small=0,1 --model big=DIR2 --devices big=2,3,4,5 --port 8000

Each model is an actor group: a tp mesh of the device ids given (default: one device each, in
order) and a ContinuousBatcher of --max-batch rows. One driver thread steps every model that has
work, all groups' steps in flight together, while aiohttp answers HTTP on the event loop.

    POST /v1/completions  {"model": NAME, "prompt": TEXT or [ids], "max_tokens": 16, "stream": false}
    GET  /v1/models

A text prompt becomes ids through the checkpoint's tokenizer.json with the `tokenizers` package,
else its UTF-8 bytes as Llama's byte-fallback ids (3 + byte) after BOS; the reply's text is decoded
the same way, and `token_ids` (an addition to OpenAI's fields) lists the new ids. `temperature` 0
(the default here) decodes greedily, a positive one samples; top_p, top_k and n are refused (400).
`stream: true` sends server-sent events,
one per token, then `data: [DONE]`. Without --model, two random-weight checkpoints (llama2.c's 15M
shape and a smaller one) are written once and served as "15M" and "tiny".
"""
import argparse
import asyncio
import json
import math
import os
import sys
import threading
import time

import numpy as np

import dtorch
from dtorch.models import ContinuousBatcher, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama import TINY_15M, Tokens  # noqa: E402  (the demo's byte-fallback tokens and 15M shape)

SMALL = dict(TINY_15M, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4)


def random_checkpoint(name, shape):
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "dtorch", f"llama-{name}-random")
    if not os.path.exists(os.path.join(directory, "model.safetensors")):
        dtorch.manual_seed(len(name))
        LlamaForCausalLM(LlamaConfig(**shape)).save_pretrained(directory)
    return directory


class Served:
    """One model: its batcher and its tokens."""

    def __init__(self, name, directory, devices, max_batch, max_len):
        mesh = dtorch.DeviceMesh("cpu", list(devices), mesh_dim_names=("tp",))
        self.name = name
        self.model = LlamaForCausalLM.from_pretrained(directory, device_mesh=mesh)
        self.tokens = Tokens(directory, self.model.config)
        self.batcher = ContinuousBatcher(self.model, max_batch=max_batch, max_len=max_len)

    def text(self, ids):
        text = self.tokens.decode(ids)
        if text is not None:
            return text
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")


class Driver(threading.Thread):
    """Steps every model with work, their steps in flight together; sleeps when none has any."""

    def __init__(self, served):
        super().__init__(name="serve-driver", daemon=True)
        self.served = served
        self.wake = threading.Event()
        self.stopping = False

    def run(self):
        while not self.stopping:
            launched = [(s, s.batcher.launch()) for s in self.served.values()]
            launched = [(s, p) for s, p in launched if p is not None]
            for s, pending in launched:
                s.batcher.land(pending)
            if not launched:
                self.wake.wait(0.5)
                self.wake.clear()


def _error(status, message, kind="invalid_request_error"):
    from aiohttp import web
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


class BadRequest(Exception):
    """A request the server refuses: its HTTP status, message and OpenAI error type."""

    def __init__(self, status, message, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def parse_request(body, served):
    """The fields of a /v1/completions body (a parsed JSON value), checked: (served model, prompt
    ids, max_tokens, temperature, stream). Anything else is a BadRequest: every value arrives from
    the network, so each is checked for its type before it is used."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    name = body.get("model")
    if not isinstance(name, str):
        raise BadRequest(400, f"model must be a string, one of: {', '.join(served)}")
    if name not in served:
        raise BadRequest(404, f"model {name!r} is not served here (models: {', '.join(served)})", "not_found_error")
    s = served[name]
    prompt, max_tokens = body.get("prompt", ""), body.get("max_tokens", 16)
    temperature = body.get("temperature", 0)
    if temperature is None:
        temperature = 0
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature < math.inf:
        raise BadRequest(400, "temperature must be a finite number >= 0 (0: greedy)")
    for field, default in (("top_p", 1), ("top_k", -1), ("n", 1), ("best_of", 1)):
        value = body.get(field)
        if value is not None and not (type(value) in (int, float) and (value == default or
                                                                          field == "top_k" and value == 0)):
            raise BadRequest(400, f"{field} is not served here (only temperature sampling and greedy decoding)")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(400, "stream must be true or false")
    if isinstance(prompt, str):
        try:
            ids = s.tokens.encode(prompt)
        except UnicodeError:
            raise BadRequest(400, "prompt is not text (it holds a lone surrogate)") from None
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        ids = prompt
    else:
        raise BadRequest(400, "prompt must be a string or a non-empty list of token ids")
    vocab = s.model.config.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise BadRequest(400, f"prompt: token ids must be in [0, {vocab}), got {bad[0]}")
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest(400, "max_tokens must be a positive integer")
    return s, ids, max_tokens, temperature, bool(stream)


def make_app(served, driver):
    from aiohttp import web

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": n, "object": "model", "owned_by": "dtorch"}
                                                             for n in served]})

    async def completions(request):
        try:
            body = await request.json()
        except (ValueError, RecursionError):   # not UTF-8, not JSON, nested or numbers past json's limits
            return _error(400, "the body is not JSON")
        try:
            s, ids, max_tokens, temperature, stream = parse_request(body, served)
        except BadRequest as e:
            return _error(e.status, str(e), e.kind)
        name = s.name
        loop = asyncio.get_running_loop()
        queue = asyncio.Queue()
        try:
            req = s.batcher.submit(ids, max_tokens, temperature=temperature,
                                   on_token=lambda r, t: loop.call_soon_threadsafe(queue.put_nowait, t))
        except ValueError as e:
            return _error(400, str(e))
        driver.wake.set()
        rid, created = f"cmpl-{req.id}", int(time.time())

        def chunk(text, token_ids, finish):
            return {"id": rid, "object": "text_completion", "created": created, "model": name,
                    "choices": [{"index": 0, "text": text, "token_ids": token_ids, "finish_reason": finish,
                                 "logprobs": None}]}

        if not stream:
            while await queue.get() is not None:
                pass
            reply = chunk(s.text(req.tokens), req.tokens, req.finish_reason)
            reply["usage"] = {"prompt_tokens": len(ids), "completion_tokens": len(req.tokens),
                              "total_tokens": len(ids) + len(req.tokens)}
            return web.json_response(reply)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        while (token := await queue.get()) is not None:
            await response.write(f"data: {json.dumps(chunk(s.text([token]), [token], None))}\n\n".encode())
        await response.write(f"data: {json.dumps(chunk('', [], req.finish_reason))}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def parse(args):
    models = dict(m.split("=", 1) for m in args.model) if args.model else \
        {"15M": random_checkpoint("15m", TINY_15M), "tiny": random_checkpoint("small", SMALL)}
    devices = {n: [int(d) for d in ids.split(",")] for n, ids in (d.split("=", 1) for d in args.devices)}
    next_free = 0
    for name in models:
        if name not in devices:
            devices[name] = [next_free]
        next_free = max(next_free, max(devices[name]) + 1)
    return models, devices


def main():
    from aiohttp import web
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=[], help="NAME=DIR (again for more models)")
    ap.add_argument("--devices", action="append", default=[], help="NAME=ID,ID,...: the model's tp mesh")
    ap.add_argument("--max-batch", type=int, default=16, help="rows each model decodes at once (1: one at a time)")
    ap.add_argument("--max-len", type=int, default=256, help="cache slots: a request's prompt and new tokens")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    ap.add_argument("--workers", choices=["thread", "process"], default="thread")
    args = ap.parse_args()
    dtorch.init(workers=args.workers)
    models, devices = parse(args)
    served = {n: Served(n, d, devices[n], args.max_batch, args.max_len) for n, d in models.items()}
    driver = Driver(served)
    driver.start()

    async def serve():
        runner = web.AppRunner(make_app(served, driver))
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = runner.addresses[0][1]
        print(f"serving {', '.join(f'{n} on devices {devices[n]}' for n in served)} at http://{args.host}:{port}",
              flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    finally:
        driver.stopping = True
        driver.wake.set()
        driver.join(5)
        dtorch.shutdown()


if __name__ == "__main__":
    main()
