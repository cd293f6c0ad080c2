"""Continuous batching: the requests of many clients share one model's decode steps.

A ``ContinuousBatcher`` keeps ``max_batch`` rows, each serving one request at a time, over one
StaticCache whose ``max_len`` slots are used as a ring. Every step feeds each busy row one token,
its request's next prompt token or the token it made last, at that row's own position, and writes
every row's keys at the same slot, ``step % max_len``: a row's tokens therefore sit in the slots of
the steps it was fed on, and the step's 4-D attention mask lets each row see only those. So a
request that arrives while others decode takes a free row at the next step (its prompt goes in a
token per step, beside the others' decoding), a finished one frees its row at once, and no step
ever moves keys. The step has one shape whatever the rows hold, so it is captured once
(dtorch.capture) and replayed: one small record per device and step. The mask is every layer's: for
a model whose layers all slide (Mistral) it shows each row only its last ``sliding_window`` tokens;
a model whose layers differ (Qwen2 with max_window_layers) takes only requests the window cannot
cut.

Each request is decoded greedily (its tokens are those of ``generate`` for the same prompt alone)
or sampled at its own temperature T, by the Gumbel-max trick on the devices: the argmax of
logits / T plus Gumbel noise drawn by dtorch's counter-based random numbers (below T = 1 that of
logits plus T times the noise, the same argmax, which tends to the greedy token as T -> 0).
"""
import collections
import itertools
import threading

import numpy as np

from .. import _dtype
from .._capture import capture as _capture
from .._factory import distribute_tensor, rand
from .._placement import Replicate
from ..models.cache_utils import StaticCache
from ..models.generation import _MIN_TEMPERATURE


class Request:
    """One prompt being served: ``tokens`` grows by a token per step once the prompt is in;
    ``finish_reason`` is "stop" (an end token) or "length" once it is done."""

    _ids = itertools.count()

    def __init__(self, prompt, max_new_tokens, eos, on_token, temperature=0.0):
        self.id = next(Request._ids)
        self.temperature = temperature
        self.prompt = list(prompt)
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.on_token = on_token
        self.tokens = []
        self.finish_reason = None
        self.fed = 0            # tokens of it in the cache so far
        self.start = None       # the step it was first fed on
        self._done = threading.Event()

    @property
    def done(self):
        return self.finish_reason is not None

    def wait(self, timeout=None):
        """Waits until it is done; returns its tokens."""
        self._done.wait(timeout)
        return self.tokens


class ContinuousBatcher:
    """Serves ``model`` (a LlamaForCausalLM on its mesh) to many requests at once. ``submit``
    from any thread; ``step`` (or ``run_until_idle``) from the one that drives the model."""

    def __init__(self, model, max_batch=16, max_len=None, capture=True):
        config = model.config
        self.model, self.B = model, int(max_batch)
        self.M = int(max_len or config.max_position_embeddings)
        if self.B < 1 or self.M < 2:
            raise ValueError(f"ContinuousBatcher: max_batch must be >= 1 and max_len >= 2, got {max_batch}, {max_len}")
        self.eos = set(np.atleast_1d(config.eos_token_id).tolist()) if config.eos_token_id is not None else set()
        self.mesh = model.model.embed_tokens.weight.device_mesh
        types = set(model.model.layer_types)
        # the window the mask applies (every layer slides), or the one requests must stay within
        self.window = model.model.sliding_window if types == {"sliding_attention"} else None
        self.mixed_window = model.model.sliding_window if len(types) > 1 else None
        self.cache = StaticCache(self.M)
        self.rows = [None] * self.B
        self.waiting = collections.deque()
        self.lock = threading.Lock()
        self.steps = 0
        # one plain step first: it makes the cache's tensors (all rows idle, each seeing its own slot);
        # then the step captured twice: greedy rows only, and with noise for rows that sample
        idle = self._inputs([None] * self.B, 0)
        self._greedy(*idle[:4])
        self._steps = {False: _capture(self._greedy, *idle[:4]) if capture else self._greedy,
                       True: _capture(self._forward, *idle) if capture else self._forward}

    # ---- the client's side -------------------------------------------------------------------

    def submit(self, prompt, max_new_tokens=16, eos_token_id=None, on_token=None, temperature=0.0):
        """Queues a prompt (token ids) for up to max_new_tokens new tokens; returns its Request.
        ``on_token(request, token)`` runs on the driving thread for each new token (and once more
        with None when it is done). ``eos_token_id``: the config's end token(s) by default.
        ``temperature``: 0 decodes greedily, a positive one samples."""
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature >= 0:
            raise ValueError(f"submit: temperature must be a number >= 0, got {temperature!r}")
        prompt = [int(t) for t in np.asarray(prompt, dtype=np.int64).ravel()]
        vocab = self.model.config.vocab_size
        if not prompt:
            raise ValueError("submit: the prompt is empty")
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"submit: token ids must be in [0, {vocab}), got {min(prompt)}..{max(prompt)}")
        if max_new_tokens < 1 or len(prompt) + max_new_tokens > self.M + 1:
            raise ValueError(f"submit: a prompt of {len(prompt)} tokens and {max_new_tokens} new ones do not fit the "
                             f"{self.M} slots a request may use")
        if self.mixed_window is not None and len(prompt) + max_new_tokens - 1 > self.mixed_window:
            raise ValueError(f"submit: a prompt of {len(prompt)} tokens and {max_new_tokens} new ones run past the "
                             f"sliding_window={self.mixed_window} of some of the model's layers, and the batcher's "
                             "mask serves every layer alike: use generate() for it")
        eos = self.eos if eos_token_id is None else set(np.atleast_1d(eos_token_id).tolist())
        request = Request(prompt, int(max_new_tokens), eos, on_token, float(temperature))
        with self.lock:
            self.waiting.append(request)
        return request

    def busy(self):
        with self.lock:
            return bool(self.waiting) or any(r is not None for r in self.rows)

    # ---- the driver's side -------------------------------------------------------------------

    def launch(self):
        """Admits waiting requests into free rows and issues one step; returns its pending tokens
        (B,) (a TensorFuture), or None when no row is busy. ``land`` takes them."""
        with self.lock:
            for b in range(self.B):
                if self.rows[b] is None and self.waiting:
                    request = self.waiting.popleft()
                    request.start = self.steps
                    self.rows[b] = request
            rows = list(self.rows)
        if all(r is None for r in rows):
            return None
        inputs = self._inputs(rows, self.steps)
        sampling = any(r is not None and r.temperature > 0 for r in rows)
        pending = self._steps[sampling](*(inputs if sampling else inputs[:4])).future()
        self._launched = rows
        return pending

    def land(self, pending):
        """The tokens of a launched step: each row that was fed its last prompt token or a made one
        gets a new token; finished requests leave their rows."""
        made = np.asarray(pending.result()).ravel()
        rows, self._launched = self._launched, None
        finished = []
        for b, request in enumerate(rows):
            if request is None:
                continue
            request.fed += 1
            if request.fed < len(request.prompt):
                continue                                   # still reading its prompt
            token = int(made[b])
            request.tokens.append(token)
            if request.on_token:
                request.on_token(request, token)
            if token in request.eos:
                request.finish_reason = "stop"
            elif len(request.tokens) >= request.max_new_tokens:
                request.finish_reason = "length"
            if request.done:
                finished.append((b, request))
        with self.lock:
            for b, request in finished:
                self.rows[b] = None
        for _, request in finished:
            if request.on_token:
                request.on_token(request, None)
            request._done.set()
        self.steps += 1

    def step(self):
        """One step: launch and land. False when there was nothing to do."""
        pending = self.launch()
        if pending is None:
            return False
        self.land(pending)
        return True

    def run_until_idle(self):
        while self.step():
            pass

    # ---- the step ----------------------------------------------------------------------------

    def _inputs(self, rows, step):
        """The step's inputs on the model's mesh: each row's token (B, 1) and position (B, 1), the
        4-D mask (B, 1, 1, M) of the slots it may see, the slot written (1,), and how each row
        chooses: its logits' scale and its noise's, (1 / T, 1) from temperature T = 1 up, (1, T)
        below it and (1, 0) for greedy."""
        slot = step % self.M
        ids = np.zeros((self.B, 1), np.int64)
        pos = np.zeros((self.B, 1), np.int64)
        mask = np.zeros((self.B, 1, 1, self.M), bool)
        scale = np.ones((self.B, 1), np.float32)
        noise = np.zeros((self.B, 1), np.float32)
        for b, request in enumerate(rows):
            if request is None:
                mask[b, 0, 0, slot] = True                 # an idle row sees only its own slot
                continue
            n = request.fed                                # tokens before this one
            ids[b, 0] = request.prompt[n] if n < len(request.prompt) else request.tokens[-1]
            pos[b, 0] = n
            seen = np.arange(n + 1) if self.window is None else np.arange(max(0, n + 1 - self.window), n + 1)
            mask[b, 0, 0, (request.start + seen) % self.M] = True
            T = request.temperature
            if T >= 1.0:
                scale[b, 0], noise[b, 0] = 1.0 / T, 1.0
            elif T > 0:     # the same argmax, and no overflow however small T is (generation._Sampler.choose)
                noise[b, 0] = max(T, _MIN_TEMPERATURE)
        rep = [Replicate()] * self.mesh.ndim
        put = lambda a: distribute_tensor(a, self.mesh, rep)
        return (put(ids), put(pos), put(mask), put(np.array([slot], np.int64)), put(scale), put(noise))

    def _logits(self, ids, pos, mask, slot):
        out = self.model(ids, attention_mask=mask, position_ids=pos, past_key_values=self.cache, cache_position=slot)
        return out.logits[:, -1, :]                                             # (B, V)

    def _greedy(self, ids, pos, mask, slot):
        return self._logits(ids, pos, mask, slot).argmax(dim=-1).to(_dtype.int64)

    def _forward(self, ids, pos, mask, slot, scale, noise):
        logits = self._logits(ids, pos, mask, slot)
        u = rand(logits.shape, device_mesh=logits.device_mesh,
                 placements=[Replicate() if p.is_partial() else p for p in logits.placements])
        gumbel = -(-(u * (1 - 2e-7) + 1e-7).log()).log()                       # finite: u is kept off 0 and 1
        return (logits * scale + gumbel * noise).argmax(dim=-1).to(_dtype.int64)   # (B,)
