"""An OpenAI-compatible server (as vLLM's) for several models at once, each on its own devices, over
continuous batching: ``dtorch-serve`` (dtorch.serve) builds it from the command line.

    GET  /v1/models                 the models served
    POST /v1/completions            a prompt (text or token ids, or a list of them)
    POST /v1/chat/completions       messages, through the model's chat template
    GET  /health                    200, or 503 naming the models whose devices failed
    GET  /metrics                   Prometheus text (vLLM's metric names)

Each model is a ``ServedModel``: its mesh, its tokenizer and a ContinuousBatcher. One driver thread
steps every model that has work, all models' steps in flight together, while aiohttp answers HTTP
on the event loop; a request's tokens come back through the batcher's ``on_token`` (on the driver
thread), which hands each one to the request's handler. Requests are checked by the schemas of
serving.protocol: a field the server does not run is a 400 naming it. A model whose device fails
ends its requests with a 503 naming it and takes no more, while the other models keep serving; on
SIGTERM the server stops taking requests, finishes those in flight and exits."""
import asyncio
import json
import os
import threading
import time
import uuid

import numpy as np
from aiohttp import web

from .batcher import ContinuousBatcher
from .protocol import CHAT_COMPLETIONS, COMPLETIONS, RequestError, parse

# vLLM's buckets for its latency histograms (seconds)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                960.0, 1920.0, 7680.0)
# the sampling fields of generation_config.json that are a model's defaults (as vLLM reads them)
_GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class ServedModel:
    """One model: its batcher, tokenizer (None: the directory has none; prompts are token ids),
    context length, end tokens and sampling defaults, and whether its devices work (``error``)."""

    def __init__(self, name, directory, mesh, max_num_seqs=16, max_model_len=None, capture=True):
        from ..models import AutoModelForCausalLM, AutoTokenizer
        self.name, self.directory, self.mesh = name, directory, mesh
        self.model = AutoModelForCausalLM.from_pretrained(directory, device_mesh=mesh)
        config = self.model.config
        self.tokenizer = None
        if any(os.path.exists(os.path.join(directory, f)) for f in _TOKENIZER_FILES):
            self.tokenizer = AutoTokenizer.from_pretrained(directory)
        limit = config.max_position_embeddings
        self.context = min(limit, int(max_model_len) if max_model_len else min(limit, 4096))
        self.batcher = ContinuousBatcher(self.model, max_batch=max_num_seqs, max_len=self.context, capture=capture,
                                         tokenizer=self.tokenizer)
        # generation_config.json's settings (the model's own: only those the file sets are not None)
        generation = self.model.generation_config
        self.defaults = {k: getattr(generation, k) for k in _GENERATION_DEFAULTS if getattr(generation, k) is not None}
        self.eos = set(self.batcher.eos)
        for source in (generation.eos_token_id, self.tokenizer and self.tokenizer.eos_token_id):
            if source is not None and source is not False:
                self.eos.update(int(t) for t in np.atleast_1d(source).tolist())
        self.error = None
        self.created = int(time.time())
        self._failed = False
        self._watch = mesh.on_failure(self._device_failed)
        self.wake = None

    def _device_failed(self, device, reason):
        if self.error is None:
            self.error = f"device {device} failed: {reason}"
        if self.wake is not None:
            self.wake.set()

    def token_text(self, token):
        if self.tokenizer is None:
            return f"token_id:{token}"
        return self.tokenizer.decode([token])


class Driver(threading.Thread):
    """Steps every healthy model with work, their steps in flight together; sleeps when none has
    any. Each model's next step is issued before its step before lands (ContinuousBatcher.launch):
    the host takes in one step's tokens while the devices compute the next. A model whose step
    fails (a device died) is failed: its requests end with an error."""

    def __init__(self, models):
        super().__init__(name="dtorch-serve-driver", daemon=True)
        self.models = models
        self.wake = threading.Event()
        self.stopping = False
        for m in models.values():
            m.wake = self.wake

    def _fail(self, m, error=None):
        if m.error is None:
            m.error = f"{type(error).__name__}: {error}"
        if not m._failed:
            m._failed = True
            m.batcher.fail(m.error)

    def run(self):
        while not self.stopping:
            launched = []
            for m in self.models.values():
                if m.error is not None:
                    self._fail(m)
                    continue
                try:
                    pending = m.batcher.launch()
                except Exception as e:         # noqa: BLE001  (a device failed: the model's requests end)
                    self._fail(m, e)
                    continue
                launched.append((m, pending))
            busy = False
            for m, pending in launched:
                try:
                    # the steps before this one (every one left when the model has no next step)
                    busy |= m.batcher.land_before(pending) > 0 or pending is not None
                except Exception as e:         # noqa: BLE001
                    self._fail(m, e)
            if not busy:
                self.wake.wait(0.5)
                self.wake.clear()


class Metrics:
    """The server's Prometheus metrics, under vLLM's names (so that what reads vLLM's reads these),
    labelled by model_name."""

    def __init__(self, models):
        import prometheus_client as prom
        self.prom = prom
        self.registry = prom.CollectorRegistry()
        labels = ["model_name"]
        running = prom.Gauge("vllm:num_requests_running", "Requests in the model's batch", labels,
                             registry=self.registry)
        waiting = prom.Gauge("vllm:num_requests_waiting", "Requests waiting for a row of the batch", labels,
                             registry=self.registry)
        for name, m in models.items():
            running.labels(name).set_function(lambda m=m: m.batcher.counts()[0])
            waiting.labels(name).set_function(lambda m=m: m.batcher.counts()[1])
        self.prompt_tokens = prom.Counter("vllm:prompt_tokens", "Prompt tokens taken", labels, registry=self.registry)
        self.generation_tokens = prom.Counter("vllm:generation_tokens", "Tokens generated", labels,
                                              registry=self.registry)
        self.success = prom.Counter("vllm:request_success", "Requests finished", labels + ["finished_reason"],
                                    registry=self.registry)
        self.ttft = prom.Histogram("vllm:time_to_first_token_seconds", "Time to the first token", labels,
                                   buckets=_TTFT_BUCKETS, registry=self.registry)
        self.itl = prom.Histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request", labels,
                                  buckets=_ITL_BUCKETS, registry=self.registry)
        self.e2e = prom.Histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token", labels,
                                  buckets=_E2E_BUCKETS, registry=self.registry)

    def text(self):
        return self.prom.generate_latest(self.registry), self.prom.CONTENT_TYPE_LATEST


class _Choice:
    """One choice of a request on its way: the batcher's Request, and what its stream gave out."""

    def __init__(self, index, prompt, prompt_text):
        self.index, self.prompt, self.prompt_text = index, prompt, prompt_text
        self.request = None
        self.sent = 0           # characters of its text given out


class Server:
    """The HTTP side: the app (``app()``), the models, the driver and the metrics."""

    def __init__(self, models):
        self.models = models
        self.driver = Driver(models)
        self.metrics = Metrics(models)
        self.draining = False
        self.in_flight = 0
        self.idle = None            # an asyncio.Event set when nothing is in flight (made on the loop)

    # ---- the app -----------------------------------------------------------------------------

    def app(self):
        app = web.Application(middlewares=[self._errors])
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_text)
        return app

    @staticmethod
    def _json(body, status=200):
        return web.json_response(body, status=status, dumps=lambda v: json.dumps(v, ensure_ascii=False))

    @web.middleware
    async def _errors(self, request, handler):
        """Every refusal as OpenAI's error body."""
        try:
            return await handler(request)
        except RequestError as e:
            return self._json(e.body(), e.status)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return self._json(RequestError(e.reason, status=e.status, kind=type(e).__name__).body(), e.status)

    async def list_models(self, request):
        return self._json({"object": "list", "data": [
            {"id": name, "object": "model", "created": m.created, "owned_by": "dtorch", "root": m.directory,
             "parent": None, "max_model_len": m.context} for name, m in self.models.items()]})

    async def health(self, request):
        failed = {name: m.error for name, m in self.models.items() if m.error is not None}
        if failed:
            raise RequestError("unhealthy: " + "; ".join(f"model {n!r}: {e}" for n, e in failed.items()),
                               status=503, kind="ServiceUnavailableError")
        if self.draining:
            raise RequestError("the server is shutting down", status=503, kind="ServiceUnavailableError")
        return web.Response(status=200)

    async def metrics_text(self, request):
        body, content_type = self.metrics.text()
        return web.Response(body=body, headers={"Content-Type": content_type})

    # ---- requests ----------------------------------------------------------------------------

    async def _body(self, request, schema, required):
        if self.draining:
            raise RequestError("the server is shutting down", status=503, kind="ServiceUnavailableError")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):    # not UTF-8, not JSON, too deep, numbers past json's limits
            raise RequestError("the body is not valid JSON") from None
        fields = parse(body, schema, required)
        m = self.models.get(fields["model"])
        if m is None:
            raise RequestError(f"The model `{fields['model']}` does not exist (models: {', '.join(self.models)})",
                               "model", 404, "NotFoundError")
        self._check_healthy(m)
        return fields, m

    @staticmethod
    def _check_healthy(m):
        if m.error is not None:
            raise RequestError(f"model {m.name!r} is unavailable: {m.error}", "model", 503, "ServiceUnavailableError")

    def _prompts(self, fields, m):
        """[(token ids, text)] of a completions request's prompts."""
        out = []
        for i, p in enumerate(fields["prompt"]):
            if isinstance(p, str):
                if m.tokenizer is None:
                    raise RequestError(f"prompt: model {m.name!r} has no tokenizer: give token ids", "prompt")
                ids = m.tokenizer.encode(p)
                if not ids:
                    raise RequestError("prompt: the prompt is empty", "prompt")
                out.append((ids, p))
            else:
                vocab = m.model.config.vocab_size
                bad = [t for t in p if not 0 <= t < vocab]
                if bad:
                    raise RequestError(f"prompt: token ids must be in [0, {vocab}), got {bad[0]}", "prompt")
                out.append((list(p), m.tokenizer.decode(p) if m.tokenizer is not None else ""))
        return out

    def _chat_prompt(self, fields, m):
        if m.tokenizer is None:
            raise RequestError(f"model {m.name!r} has no tokenizer, so no chat template", "messages")
        try:
            ids = m.tokenizer.apply_chat_template(fields["messages"], add_generation_prompt=True)
        except Exception as e:     # noqa: BLE001  (a template refuses a conversation by raising)
            raise RequestError(f"messages: the chat template failed: {type(e).__name__}: {e}", "messages") from None
        return [(list(ids), "")]

    def _max_tokens(self, fields, m, prompts, chat):
        asked = fields.get("max_completion_tokens", fields.get("max_tokens"))
        longest = max(len(ids) for ids, _ in prompts)
        room = m.context - longest
        if room < 1 or asked is not None and asked > room:
            raise RequestError(f"This model's maximum context length is {m.context} tokens. However, you requested "
                               f"{longest + (asked or 1)} tokens ({longest} in the "
                               f"{'messages' if chat else 'prompt'}, {asked or 1} in the completion). Please reduce "
                               f"the length of the {'messages' if chat else 'prompt'} or completion.",
                               "max_tokens" if asked is not None and room >= 1 else ("messages" if chat else "prompt"))
        if asked is not None:
            return asked
        return room if chat else min(16, room)

    def _sampling(self, fields, m, logprobs, prompt_logprobs):
        """The batcher's keyword arguments of a request's fields (the model's defaults for those absent)."""
        get = lambda k, default: fields.get(k, m.defaults.get(k, default))
        top_k = get("top_k", 0)
        return dict(temperature=get("temperature", 1.0), top_p=get("top_p", 1.0), top_k=0 if top_k < 0 else top_k,
                    min_p=get("min_p", 0.0), presence_penalty=fields.get("presence_penalty", 0.0),
                    frequency_penalty=fields.get("frequency_penalty", 0.0),
                    repetition_penalty=get("repetition_penalty", 1.0), stop=fields.get("stop", ()),
                    logprobs=logprobs, prompt_logprobs=prompt_logprobs)

    async def completions(self, request):
        fields, m = await self._body(request, COMPLETIONS, ("model", "prompt"))
        k = fields.get("logprobs")
        echo = fields.get("echo", False)
        prompts = self._prompts(fields, m)
        return await self._serve(request, fields, m, prompts, self._max_tokens(fields, m, prompts, False),
                                 self._sampling(fields, m, k, k if echo and k is not None else None), chat=False)

    async def chat_completions(self, request):
        fields, m = await self._body(request, CHAT_COMPLETIONS, ("model", "messages"))
        k = fields.get("top_logprobs", 0) if fields.get("logprobs") else None
        prompts = self._chat_prompt(fields, m)
        return await self._serve(request, fields, m, prompts, self._max_tokens(fields, m, prompts, True),
                                 self._sampling(fields, m, k, None), chat=True)

    async def _serve(self, http, fields, m, prompts, max_tokens, sampling, chat):
        """Submits n choices per prompt and answers with them, whole or streamed."""
        loop = asyncio.get_running_loop()
        events = asyncio.Queue()
        n, seed = fields.get("n", 1), fields.get("seed")
        arrived = time.monotonic()
        choices = [_Choice(i * n + j, ids, text) for i, (ids, text) in enumerate(prompts) for j in range(n)]
        self._enter()
        try:
            for c in choices:
                # the first choice of each prompt takes the seed, the others seeds of their own
                choice_seed = None if seed is None else seed % (1 << 64) ^ (c.index % n * 0x9E3779B97F4A7C15 % (1 << 64))
                c.request = self._submit(m, c, max_tokens, sampling, choice_seed, loop, events, arrived)
            self.metrics.prompt_tokens.labels(m.name).inc(sum(len(ids) for ids, _ in prompts))
            self.driver.wake.set()
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
            stream = fields.get("stream", False)
            kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
            head = {"id": rid, "object": kind, "created": int(time.time()), "model": m.name}
            if stream:
                return await self._stream(http, fields, m, choices, events, head, chat)
            left = len(choices)
            while left:
                if (await events.get())[1] is None:
                    left -= 1
            return self._whole(fields, m, choices, head, chat)
        finally:
            for c in choices:
                if c.request is not None and not c.request.done:
                    m.batcher.abort(c.request)
            self.driver.wake.set()
            self._leave()

    def _submit(self, m, choice, max_tokens, sampling, seed, loop, events, arrived):
        """The batcher's request of one choice; its tokens go to ``events`` as (choice, token, text
        ready to give out, logprobs entry), then (choice, None, rest of the text, None)."""
        metrics, name = self.metrics, m.name
        last = [None]

        def post(item):
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:     # the loop closed: nobody waits for it any more
                pass

        def on_token(request, token):     # on the driver thread
            now = time.monotonic()
            if token is None:
                if request.finish_reason != "error":      # stop, length, abort
                    metrics.success.labels(name, request.finish_reason).inc()
                    metrics.e2e.labels(name).observe(now - arrived)
                post((choice, None, None, None))
                return
            metrics.generation_tokens.labels(name).inc()
            (metrics.ttft if last[0] is None else metrics.itl).labels(name).observe(now - (last[0] or arrived))
            last[0] = now
            entry = request.logprobs[-1] if request.logprobs else None
            post((choice, token, request.text_ready(), entry))

        try:
            return m.batcher.submit(choice.prompt, max_tokens, eos_token_id=sorted(m.eos), on_token=on_token,
                                    seed=seed, **sampling)
        except ValueError as e:
            raise RequestError(str(e)) from None
        except RuntimeError:
            self._check_healthy(m)
            raise

    # ---- replies -----------------------------------------------------------------------------

    def _failed(self, m, choices):
        errors = [c.request.error for c in choices if c.request.finish_reason == "error"]
        if errors:
            kind = 503 if m.error is not None else 500
            raise RequestError(f"model {m.name!r} failed: {errors[0]}", "model", kind,
                               "ServiceUnavailableError" if kind == 503 else "InternalServerError")

    def _usage(self, prompts_tokens, choices):
        done = sum(len(c.request.tokens) for c in choices)
        return {"prompt_tokens": prompts_tokens, "completion_tokens": done, "total_tokens": prompts_tokens + done}

    @staticmethod
    def _prompt_tokens(choices, n):
        return sum(len(c.prompt) for c in choices if c.index % n == 0)

    def _whole(self, fields, m, choices, head, chat):
        self._failed(m, choices)
        n, ids = fields.get("n", 1), fields.get("return_token_ids", False)
        out = []
        for c in choices:
            r = c.request
            if chat:
                choice = {"index": c.index, "message": {"role": "assistant", "content": r.text},
                          "logprobs": self._chat_logprobs(m, r.tokens, r.logprobs) if r.logprobs is not None else None,
                          "finish_reason": r.finish_reason, "stop_reason": None}
            else:
                echo = fields.get("echo", False)
                choice = {"index": c.index, "text": (c.prompt_text if echo else "") + r.text,
                          "logprobs": self._completion_logprobs(m, c, r.tokens, r.logprobs, echo)
                          if r.logprobs is not None else None,
                          "finish_reason": r.finish_reason, "stop_reason": None}
            if ids:
                choice.update(prompt_token_ids=c.prompt, token_ids=r.tokens)
            out.append(choice)
        return self._json(dict(head, choices=out, usage=self._usage(self._prompt_tokens(choices, n), choices)))

    async def _stream(self, http, fields, m, choices, events, head, chat):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(http)
        n, ids = fields.get("n", 1), fields.get("return_token_ids", False)
        usage = fields.get("stream_options", {}).get("include_usage", False)
        echo = fields.get("echo", False)

        async def send(choice):
            body = dict(head, choices=[choice])
            if usage:
                body["usage"] = None
            await response.write(f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode())

        for c in choices:
            if chat:
                await send({"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})
        echoed = set()
        left, failed = len(choices), None
        while left:
            c, token, ready, entry = await events.get()
            r = c.request
            if token is None:
                left -= 1
                if r.finish_reason == "error":
                    failed = failed or r.error
                    continue
                if r.finish_reason == "abort":
                    continue
            if echo and c.index not in echoed:
                # the prompt, with its logprobs: all there once the choice made a token (or ended)
                echoed.add(c.index)
                first = {"index": c.index, "text": c.prompt_text, "logprobs": None, "finish_reason": None}
                if r.prompt_logprobs is not None:
                    first["logprobs"] = self._completion_logprobs(m, c, [], [], True)
                if ids:
                    first.update(prompt_token_ids=c.prompt, token_ids=[])
                await send(first)
            if token is None:
                piece = r.text[c.sent:]
                c.sent = len(r.text)
                tokens = []
            else:
                piece = ready[c.sent:]
                c.sent = max(c.sent, len(ready))
                tokens = [token]
            done = token is None
            if chat:
                choice = {"index": c.index, "delta": {"content": piece} if piece or not done else {},
                          "logprobs": self._chat_logprobs(m, tokens, [entry]) if entry is not None and tokens else None,
                          "finish_reason": r.finish_reason if done else None}
            else:
                choice = {"index": c.index, "text": piece,
                          "logprobs": self._completion_logprobs(m, c, tokens, [entry], False, c.sent - len(piece)
                                                                + (len(c.prompt_text) if echo else 0))
                          if entry is not None and tokens else None,
                          "finish_reason": r.finish_reason if done else None}
            if done:
                choice["stop_reason"] = None
            if ids:
                choice["token_ids"] = tokens
            await send(choice)
        if failed is not None:
            error = RequestError(f"model {m.name!r} failed: {failed}", "model", 503, "ServiceUnavailableError")
            await response.write(f"data: {json.dumps(error.body())}\n\n".encode())
        elif usage:
            last = dict(head, choices=[], usage=self._usage(self._prompt_tokens(choices, n), choices))
            await response.write(f"data: {json.dumps(last, ensure_ascii=False)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _completion_logprobs(self, m, c, tokens, entries, echo, offset=0):
        """The legacy completions' logprobs: tokens, token_logprobs, top_logprobs, text_offset; with
        echo the prompt's first (its first token has none)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

        def add(token, entry):
            text = m.token_text(token)
            out["tokens"].append(text)
            out["text_offset"].append(offset + sum(len(t) for t in out["tokens"][:-1]))
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                return
            chosen, top = entry
            out["token_logprobs"].append(chosen)
            top = {m.token_text(i): v for i, v in top}
            top.setdefault(text, chosen)
            out["top_logprobs"].append(top)

        if echo:
            for i, token in enumerate(c.prompt):
                add(token, c.request.prompt_logprobs[i - 1] if i else None)
        for token, entry in zip(tokens, entries):
            add(token, entry)
        return out

    def _chat_logprobs(self, m, tokens, entries):
        def one(token, value):
            text = m.token_text(token)
            return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}
        return {"content": [dict(one(t, chosen), top_logprobs=[one(i, v) for i, v in top])
                            for t, (chosen, top) in zip(tokens, entries)]}

    # ---- running and stopping -----------------------------------------------------------------

    def _enter(self):
        self.in_flight += 1
        if self.idle is not None:
            self.idle.clear()

    def _leave(self):
        self.in_flight -= 1
        if self.in_flight == 0 and self.idle is not None:
            self.idle.set()

    async def serve(self, host, port, on_ready=None, stop=None):
        """Serves until ``stop`` (an asyncio.Event) is set, then drains: no new requests (503), the
        ones in flight finished, and returns. ``on_ready(port)`` once it listens."""
        self.idle = asyncio.Event()
        if self.in_flight == 0:
            self.idle.set()
        self.driver.start()
        runner = web.AppRunner(self.app(), handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        if on_ready is not None:
            on_ready(runner.addresses[0][1])
        try:
            await (stop.wait() if stop is not None else asyncio.Event().wait())
            self.draining = True
            await self.idle.wait()
        finally:
            await runner.cleanup()
            self.close()

    def close(self):
        self.driver.stopping = True
        self.driver.wake.set()
        if self.driver.is_alive():
            self.driver.join()

