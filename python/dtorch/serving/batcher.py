"""Continuous batching: the requests of many clients share one model's decode steps.

A ``ContinuousBatcher`` keeps ``max_batch`` rows, each serving one request at a time, over one
StaticCache whose ``max_len`` slots are used as a ring. Every step feeds each busy row one token,
its request's next prompt token or the token it made last, at that row's own position, and writes
every row's keys at the same slot, ``step % max_len``: a row's tokens therefore sit in the slots of
the steps it was fed on, and the step's 4-D attention mask lets each row see only those (a model
laid out for ring attention, which decides by positions, gets instead its slots' positions cleared
when a row starts a request). So a request that arrives while others decode takes a free row at
the next step, a finished one frees its row at once, and no step ever moves keys.

A step computes only the rows up to the highest busy one, rounded up to a bucket (1, 2, 4, ... up
to ``max_batch``, as vLLM sizes its graphs): one client costs a one-row step. A new request takes
the lowest free row, so the batch grows with the load and shrinks as the high rows finish. Each
bucket's step has one shape whatever its rows hold, so it is captured (dtorch.capture) per bucket
and replayed: one small record per device and step. A new request's prompt, all but its last token,
is computed at admission in forwards of up to ``prefill_chunk`` tokens (its keys written straight
into its row at the slots of the steps just before, as if it had been fed a token per step), one
chunk beside each decode step of the others (chunked prefill); the last prompt token goes through
the step that makes its first token. Requests of one prompt admitted together (the ``n`` choices
of one HTTP request) share its chunks, and the prompts admitted at one step that fit one chunk go
through one forward together (a batch of them, right-aligned: they all end at the slot before
their last token's), so a burst of new clients costs one pass over the weights, not one each; a
chunk runs the decoder alone (its logits would cost the lm_head's whole weight). A model whose rows cannot be taken apart so (pipelined, laid
out for ring attention, or with its batch split over dp) runs every row each step and takes
prompts a token per step, as does a request that asks for prompt log-probabilities or a repetition
penalty (which counts the prompt's tokens as the steps feed them). The mask is
every layer's: for a model whose layers all slide (Mistral) it shows each row only its last
``sliding_window`` tokens; a model whose layers differ (Qwen2 with max_window_layers) takes only
requests the window cannot cut.

Each row chooses its token by its own request's parameters (``SamplingParams``: temperature,
top-k, top-p, min-p, penalties, seed; serving.sampling does it on the devices), so a greedy
request's tokens are those of ``generate`` for the same prompt alone whatever else runs beside it.
The step is captured once per kind of batch (greedy only, with penalties, sampling, ranking,
log-probabilities: what any of its rows needs), and only the chosen ids come back each step, with
the log-probabilities when a row asked for them.

The host's work on a step's tokens overlaps the devices' work on the next (vLLM's async
scheduling): ``launch`` may be called while the step before is still pending, and then issues the
next step at once. A row that the pending step makes a token for is fed that token on the devices:
its id goes in as -1 and the captured step takes the pending step's token output (a DTensor it
already returned) in its place, in the sampling table's fed-token column too (the penalties);
its position, slots and token count (the seed's counter) are advanced by the pending step on the
host. ``land_before`` then fetches the pending step's tokens and runs the requests' bookkeeping
(callbacks, text, stop strings, streams) while the devices compute. A row whose request surely
ends with the pending step (its max_new_tokens) is not fed, and a waiting request may take it at
once (that step still lands the old request's last token); one that ends there by an end token
or a stop string was fed anyway, and that token is dropped when its step lands (never shown nor
counted): each launched step keeps its own rows, so a row freed and taken by a waiting request
meanwhile never gets another's token. The step before is landed first where this cannot apply: a
model whose steps run every row (see above), a step of another bucket, waiting requests that
need a row past the pending step's bucket. ``step`` launches one and lands the one before
(``run_until_idle`` lands all).

With a tokenizer the batcher also gives each request its text as it grows
(models.IncrementalDetokenizer: the pieces join to the decode of all its tokens, special tokens
skipped, the end token left out) and ends it at the first of its stop strings, the text cut
before it; ``Request.text_ready()`` is the text a stream may show (what could still become a stop
string held back). The engine knows nothing of HTTP: dtorch.serving.server serves it."""
import collections
import itertools
import random
import threading

import numpy as np

from .._capture import CapturedFunction
from .._factory import distribute_tensor, zeros
from .._ops_view import cat
from .._ops_write import write_slice_
from .._placement import Partial, Replicate, Shard
from .. import _dtype, _ops
from ..models.cache_utils import RingStaticCache, StaticCache
from ..parallel.pipeline import NoPipeline, schedule_of
from .sampling import I_COLUMNS, I_FED, RowSampler, SamplingParams, row_tables, seed_key


class Request:
    """One prompt being served: ``tokens`` grows by a token per step once the prompt is in;
    ``finish_reason`` is "stop" (an end token or a stop string), "length", "abort" (``abort``) or
    "error" (``error`` says why) once it is done. ``logprobs`` (when asked): per new token
    (its log-probability, [(id, log-probability)] of the most likely ones); ``prompt_logprobs`` the
    same for each prompt token after the first. ``text``: the text so far, with a tokenizer."""

    _ids = itertools.count()

    def __init__(self, prompt, max_new_tokens, eos, on_token, params, key, detokenizer=None):
        self.id = next(Request._ids)
        self.prompt = list(prompt)
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.on_token = on_token
        self.params = params
        self.tokens = []
        self.logprobs = [] if params.logprobs is not None else None
        self.prompt_logprobs = [] if params.prompt_logprobs is not None else None
        self.text = ""
        self.finish_reason = None
        self.error = None
        self.fed = 0            # tokens of it in the cache so far
        self.start = None       # the step whose slot holds its first token
        self.prefilling = False  # its prompt is being computed in chunks (ContinuousBatcher._prefill)
        self.stepped = False    # it was in a step
        self.queued = 0         # steps launched that feed it and are not landed yet
        self.queued_made = 0    # of those, the ones that make a token of it
        self._key = key
        self._detokenizer = detokenizer
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self._aborted = False
        self._done = threading.Event()

    @property
    def temperature(self):
        return self.params.temperature

    @property
    def done(self):
        return self.finish_reason is not None

    def text_ready(self):
        """The text a stream may give out so far: all of it once done, else without its last
        characters that could still begin a stop string."""
        return self.text if self.done or not self._hold else self.text[:max(0, len(self.text) - self._hold)]

    def wait(self, timeout=None):
        """Waits until it is done; returns its tokens."""
        self._done.wait(timeout)
        return self.tokens

    def _take(self, token):
        """Adds a token it made; the finish reason that brings, or None. The text grows by what the
        token completes (an end token adds none: the rest of a split character, if any)."""
        self.tokens.append(token)
        detokenizer = self._detokenizer
        if token in self.eos:
            if detokenizer is not None:
                self._add_text(detokenizer.finish())
            return "stop"
        if detokenizer is not None and self._add_text(detokenizer.step(token)):
            return "stop"
        if len(self.tokens) >= self.max_new_tokens:
            return "stop" if detokenizer is not None and self._add_text(detokenizer.finish()) else "length"
        return None

    def _add_text(self, piece):
        """Appends piece to the text; True when that completed a stop string (the text then ends
        before it)."""
        before = len(self.text)
        self.text += piece
        if not piece or not self.params.stop:
            return False
        found = [i for i in (self.text.find(s, max(0, before - len(s) + 1)) for s in self.params.stop) if i >= 0]
        if found:
            self.text = self.text[:min(found)]
        return bool(found)


class ContinuousBatcher:
    """Serves ``model`` (a causal LM of dtorch.models on its mesh) to many requests at once.
    ``submit`` and ``abort`` from any thread; ``step`` (or ``run_until_idle``, or ``launch`` and
    ``land_before`` / ``land``) from the one that drives the model. ``tokenizer``: a dtorch.models tokenizer, for
    the requests' text and stop strings. ``prefill_chunk``: the most prompt tokens one forward
    computes beside the decode steps."""

    def __init__(self, model, max_batch=16, max_len=None, capture=True, tokenizer=None, prefill_chunk=256):
        config = model.config
        self.model, self.B = model, int(max_batch)
        self.M = int(max_len or config.max_position_embeddings)
        if self.B < 1 or self.M < 2:
            raise ValueError(f"ContinuousBatcher: max_batch must be >= 1 and max_len >= 2, got {max_batch}, {max_len}")
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, (int, np.integer)) or prefill_chunk < 1:
            raise ValueError(f"ContinuousBatcher: prefill_chunk must be a positive int, got {prefill_chunk!r}")
        self.prefill_chunk = int(prefill_chunk)
        self.tokenizer = tokenizer
        self.vocab = config.vocab_size
        self.eos = set(np.atleast_1d(config.eos_token_id).tolist()) if config.eos_token_id is not None else set()
        self.mesh = model.model.embed_tokens.weight.device_mesh      # where the inputs go (the first stage)
        self.out_mesh = model.lm_head.weight.device_mesh            # where the logits come out (the last)
        types = set(model.model.layer_types)
        # the window the mask applies (every layer slides), or the one requests must stay within
        self.window = model.model.sliding_window if types == {"sliding_attention"} else None
        self.mixed_window = model.model.sliding_window if len(types) > 1 else None
        self.by_positions = issubclass(getattr(model, "cache_class", StaticCache), RingStaticCache)
        self.cache = (RingStaticCache if self.by_positions else StaticCache)(self.M)
        self.rows = [None] * self.B
        self.waiting = collections.deque()
        self.lock = threading.Lock()
        self.steps = 0           # steps landed
        self.launched = 0        # steps issued: the next one writes slot launched % max_len
        self.overlapped = 0      # steps issued while the one before was still on the devices
        self.dropped = 0         # tokens made for a request that had ended at the step before
        self._inflight = collections.deque()     # the _Launched steps not landed yet, oldest first
        self.error = None
        self._random = random.Random()
        self.sampler = RowSampler(self.vocab)
        # one plain forward first: it makes the cache's tensors and what the sampler keeps (all rows
        # idle, each seeing its own slot); the captures are made as each kind of step is first needed
        logits = self._logits(*self._inputs([None] * self.B, 0)[:4])
        self.sampler.prepare(logits)
        # whether a step may run only the first rows and prompts be computed apart (see the module)
        caches = list(self.cache.key_cache.values()) + list(self.cache.value_cache.values())
        self.split_rows = (not self.by_positions and isinstance(schedule_of(model), NoPipeline) and
                           isinstance(schedule_of(model.model), NoPipeline) and
                           not any(isinstance(p, Shard) and p.dim == 0 for t in caches for p in t.placements))
        self.buckets = sorted({min(self.B, 1 << i) for i in range(self.B.bit_length() + 1)})
        # whether a step may be issued before the one before it lands, its rows fed on the devices
        # with the tokens that one makes (they come out where the ids go in)
        self.overlap = self.split_rows and self.mesh == self.out_mesh
        self._no_last = {}       # per bucket, the (k,) token input of a step that takes none from the last
        self.prefills = 0        # prompt chunks computed apart
        self.rows_computed = 0   # rows the steps computed, busy or not (counters the tests read)
        placements = [Replicate() if p.is_partial() else p for p in logits.placements]
        # what the rows have seen and made, (B, V) each, laid out like the logits
        self._state_now = (zeros(self.B, self.vocab, device_mesh=self.out_mesh, placements=placements, dtype=_dtype.bool),
                           zeros(self.B, self.vocab, device_mesh=self.out_mesh, placements=placements,
                                 dtype=_dtype.float32))
        self._step = CapturedFunction(self._run) if capture else self._run
        if capture:
            self._step.__qualname__ = "batcher step"

    # ---- the client's side -------------------------------------------------------------------

    def submit(self, prompt, max_new_tokens=16, eos_token_id=None, on_token=None, temperature=0.0, **sampling):
        """Queues a prompt (token ids) for up to max_new_tokens new tokens; returns its Request.
        ``on_token(request, token)`` runs on the driving thread for each new token (and once more
        with None when it is done). ``eos_token_id``: the config's end token(s) by default.
        ``temperature``: 0 decodes greedily, a positive one samples; ``sampling``: the other fields
        of SamplingParams (top_p, top_k, min_p, seed, presence_penalty, frequency_penalty,
        repetition_penalty, logprobs, prompt_logprobs, stop)."""
        unknown = set(sampling) - {f for f in SamplingParams.__dataclass_fields__ if f != "temperature"}
        if unknown:
            raise TypeError(f"submit: unexpected keyword argument {sorted(unknown)[0]!r}")
        params = SamplingParams(temperature=temperature, **sampling)
        prompt = [int(t) for t in np.asarray(prompt, dtype=np.int64).ravel()]
        if not prompt:
            raise ValueError("submit: the prompt is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab:
            raise ValueError(f"submit: token ids must be in [0, {self.vocab}), got {min(prompt)}..{max(prompt)}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
            raise ValueError(f"submit: max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 1 or len(prompt) + max_new_tokens > self.M + 1:
            raise ValueError(f"submit: a prompt of {len(prompt)} tokens and {max_new_tokens} new ones do not fit the "
                             f"{self.M} slots a request may use")
        if self.mixed_window is not None and len(prompt) + max_new_tokens - 1 > self.mixed_window:
            raise ValueError(f"submit: a prompt of {len(prompt)} tokens and {max_new_tokens} new ones run past the "
                             f"sliding_window={self.mixed_window} of some of the model's layers, and the batcher's "
                             "mask serves every layer alike: use generate() for it")
        if params.stop and self.tokenizer is None:
            raise ValueError("submit: stop strings need the batcher's tokenizer")
        eos = self.eos if eos_token_id is None else set(np.atleast_1d(eos_token_id).tolist())
        key = seed_key(self._random.getrandbits(64) if params.seed is None else params.seed)
        detokenizer = None
        if self.tokenizer is not None:
            from ..models.tokenization import IncrementalDetokenizer
            detokenizer = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=True)
        request = Request(prompt, int(max_new_tokens), eos, on_token, params, key, detokenizer)
        with self.lock:
            if self.error is not None:
                raise RuntimeError(f"submit: the model failed: {self.error}")
            self.waiting.append(request)
        return request

    def abort(self, request):
        """Ends ``request`` at the next step with finish_reason "abort" (a client that left); any thread."""
        request._aborted = True

    def busy(self):
        with self.lock:
            return bool(self.waiting) or any(r is not None for r in self.rows)

    def counts(self):
        """(requests running, requests waiting)."""
        with self.lock:
            return sum(r is not None for r in self.rows), len(self.waiting)

    # ---- the driver's side -------------------------------------------------------------------

    def launch(self):
        """Admits waiting requests into free rows and issues one step, with a chunk of a prompt
        computed apart beside it; returns what is pending (for ``land``), or None when no row is
        busy. Called while the step before is still pending (``launch`` then ``land_before``, as
        the server drives it), it issues the next step beside it when it can (see the module):
        the rows that step makes a token for take it on the devices; else it lands that step
        first."""
        while self._inflight and not self._may_overlap():
            self._land_oldest()
        prev = self._inflight[-1] if self._inflight else None
        admitted = []
        with self.lock:
            for request in [r for r in self.waiting if r._aborted]:
                self.waiting.remove(request)
                self._finish(request, "abort")
            # beside a pending step only the rows of its bucket (the next one takes its tokens row for
            # row), and a row whose request ends with that step is free already
            for b in range(self.B if prev is None else prev.k):
                if self._free(self.rows[b]) and self.waiting:
                    request = self.waiting.popleft()
                    request.start = self.launched
                    self.rows[b] = request
                    admitted.append((b, request))
            busy = [b for b, r in enumerate(self.rows) if r is not None]
            k = (next(n for n in self.buckets if n > busy[-1]) if self.split_rows else self.B) if busy else 0
        if prev is not None and k != prev.k:       # (its rows cannot have left: none landed since)
            self._land_before(None)
            prev = None
        if not busy:
            return None
        with self.lock:
            rows = self.rows[:k]
        for b, request in admitted:
            if self._prefilled_apart(request):
                request.prefilling = True
                # its prompt's keys (all but the last token) end in the slots of the steps just
                # before the one that feeds its last token, a step per chunk from now: each chunk
                # is written after the steps that write its slots in every row (see _prefill)
                chunks = -(-(len(request.prompt) - 1) // self.prefill_chunk)
                request.start = self.launched + chunks - (len(request.prompt) - 1)
        prefilling = [(b, r) for b, r in enumerate(rows) if r is not None and r.prefilling]
        # a row whose request ends with the token of the pending step (its max_new_tokens) is not fed
        rows = [None if r is not None and (r.prefilling or self._free(r)) else r for r in rows]
        if prev is not None and not prefilling and all(r is None for r in rows):
            self._land_before(None)                # nothing to do before the pending step lands
            return self.launch()
        record = _Launched(rows, k)
        if any(r is not None for r in rows):
            self.overlapped += prev is not None
            record.token, record.pending = self._launch_step(rows, prev)
            for b, request in enumerate(rows):
                if request is not None:
                    record.makes[b] = request.fed + request.queued >= len(request.prompt) - 1
                    request.queued += 1
                    request.queued_made += record.makes[b]
        # requests of one prompt admitted together (a request's n choices) share its chunks
        groups = {}
        for b, request in prefilling:
            groups.setdefault((tuple(request.prompt), request.start, request.fed), []).append((b, request))
        # prompts whose whole chunk is still ahead and fits one chunk end at the same slot (this
        # step's): they go through one forward together, the rest a chunk each
        whole = [m for m in groups.values() if m[0][1].fed == 0 and len(m[0][1].prompt) - 1 <= self.prefill_chunk]
        if len({m[0][1].start + len(m[0][1].prompt) for m in whole}) > 1:        # (admitted together, they end
            whole = []                                                          # at one slot; else apart)
        if len(whole) > 1:
            self._prefill_together(whole)
        for members in groups.values():
            if len(whole) < 2 or not any(members is m for m in whole):
                self._prefill(members)
        self._inflight.append(record)
        self.launched += 1
        return record

    def _may_overlap(self):
        """Whether the next step may be issued before the pending one lands: one is pending, and
        the waiting requests that would be admitted fit the rows of its bucket."""
        if not self.overlap or len(self._inflight) != 1:
            return False
        k = self._inflight[0].k
        with self.lock:
            waiting = sum(not r._aborted for r in self.waiting)
            return waiting <= sum(self._free(r) for r in self.rows[:k]) or not any(map(self._free, self.rows))

    @staticmethod
    def _free(request):
        """Whether a row holding ``request`` may take another: it holds none, or the step pending
        makes its last token (its max_new_tokens; that step lands it, whoever holds the row)."""
        return request is None or 0 < request.queued_made and len(request.tokens) + request.queued_made >= \
            request.max_new_tokens

    def _prefilled_apart(self, request):
        params = request.params
        return (self.split_rows and len(request.prompt) > 1 and params.prompt_logprobs is None and
                params.repetition_penalty == 1)

    def _launch_step(self, rows, prev):
        """Issues the step of ``rows``; (its tokens, their futures and the log-probabilities')."""
        self.rows_computed += len(rows)
        live = [r for r in rows if r is not None]
        params = [r.params for r in live]
        sample = any(p.sampled for p in params)
        flags = (any(p.penalized for p in params), sample, any(p.sorts(self.vocab) for p in params),
                 any(r.logprobs is not None and r.fed + r.queued >= len(r.prompt) - 1 or
                     r.prompt_logprobs is not None and r.fed + r.queued < len(r.prompt) - 1 for r in live))
        last = None
        if self.overlap:
            # the tokens of the pending step, for the rows that take theirs from it
            last = prev.token if any(r.queued_made for r in live) else self._no_last.get(len(rows))
            if last is None:
                last = self._no_last[len(rows)] = zeros(len(rows), device_mesh=self.out_mesh, dtype=_dtype.int64)
        token, extra, *self._state_now = self._step(*self._inputs(rows, self.launched), last, *self._state_now, *flags)
        return token, [token.future()] + ([t.future() for t in extra] if extra is not None else [])

    def land(self, pending):
        """Lands the launched step ``pending`` (and any launched before it): each row that was fed
        its last prompt token or a made one gets a new token; finished requests leave their rows."""
        while any(r is pending for r in self._inflight):
            self._land_oldest()

    def land_before(self, pending):
        """Lands the steps launched before ``pending`` (every one still pending when it is None),
        leaving ``pending`` on the devices; returns how many it landed."""
        return self._land_before(pending)

    def _land_before(self, pending):
        n = 0
        while self._inflight and self._inflight[0] is not pending:
            self._land_oldest()
            n += 1
        return n

    def _land_oldest(self):
        record = self._inflight.popleft()
        pending = record.pending
        made = np.asarray(pending[0].result()).ravel() if pending else None
        chosen, top, top_ids = (np.asarray(f.result()) for f in pending[1:]) if len(pending) > 1 else (None,) * 3
        finished = []
        for b, request in enumerate(record.rows):
            if request is None:
                continue
            request.queued -= 1
            request.queued_made -= record.makes[b]
            if request.done:            # it ended at the step before (an end token, a stop string,
                self.dropped += record.makes[b]     # an abort): the token of this one is never its
                continue
            if request._aborted:
                finished.append((b, request, "abort"))
                continue
            n = request.fed
            request.fed += 1
            if n < len(request.prompt) - 1:                    # still reading its prompt
                if request.prompt_logprobs is not None:
                    request.prompt_logprobs.append(self._entry(chosen, top, top_ids, b, request.params.prompt_logprobs))
                continue
            token = int(made[b])
            if token >= self.vocab:    # the argmax found no largest value: the row's logits hold NaN
                request.error = "the model's logits hold NaN (NaN or infinite values in its weights or activations)"
                finished.append((b, request, "error"))
                continue
            reason = request._take(token)
            if request.logprobs is not None:
                request.logprobs.append(self._entry(chosen, top, top_ids, b, request.params.logprobs))
            request.finish_reason = reason
            if request.on_token:
                request.on_token(request, token)
            if reason is not None:
                finished.append((b, request, reason))
        for b, request in enumerate(self.rows):
            if request is not None and request.prefilling and request._aborted:
                finished.append((b, request, "abort"))
        with self.lock:
            for b, request, _ in finished:
                if self.rows[b] is request:
                    self.rows[b] = None
        for _, request, reason in finished:
            self._finish(request, reason)
        self.steps += 1

    def fail(self, error):
        """Ends every request, running or waiting, with finish_reason "error" and ``error`` (a
        device of the model failed); later submits raise it."""
        with self.lock:
            self.error = str(error)
            requests = [r for r in self.rows if r is not None] + list(self.waiting)
            self.rows, self.waiting = [None] * self.B, collections.deque()
        # and those whose row another took while their last step was pending
        for step in self._inflight:
            requests += [r for r in step.rows if r is not None and not r.done and r not in requests]
        self._inflight.clear()
        for request in requests:
            request.error = self.error
            self._finish(request, "error")

    def step(self):
        """One step: launch the next, land the one before (it may stay pending while the next one
        computes: ``run_until_idle`` lands all). False when there was nothing to do."""
        pending = self.launch()
        return self._land_before(pending) > 0 or pending is not None

    def run_until_idle(self):
        while self.step():
            pass

    @staticmethod
    def _finish(request, reason):
        if request.finish_reason is None or reason in ("abort", "error"):
            request.finish_reason = reason
        if request.on_token:
            request.on_token(request, None)
        request._done.set()

    @staticmethod
    def _entry(chosen, top, top_ids, b, k):
        return float(chosen[b]), [(int(i), float(v)) for i, v in zip(top_ids[b, :k], top[b, :k])]

    # ---- the step ----------------------------------------------------------------------------

    def _inputs(self, rows, step):
        """The step's inputs: on the model's first mesh each row's token (B, 1) (-1 for a row fed
        the token the pending step makes it: the step takes it from that one's output) and position
        (B, 1), what it may see (the 4-D mask (B, 1, 1, M) of its slots, or with attention by
        positions the rows (B, 1) starting a request, whose slots' positions are cleared), the slot
        written (1,); on the logits' mesh the rows' sampling tables (serving.sampling)."""
        slot = step % self.M
        ids = np.zeros((len(rows), 1), np.int64)
        pos = np.zeros((len(rows), 1), np.int64)
        mask = np.zeros((len(rows), 1, 1, self.M), bool)
        table = []
        for b, request in enumerate(rows):
            if request is None:
                mask[b, 0, 0, slot] = True                 # an idle row sees only its own slot
                table.append(None)
                continue
            n = request.fed + request.queued               # tokens before this one
            prompt = request.prompt
            # a token the pending step makes is taken on the devices (-1: the step's last tokens)
            ids[b, 0] = prompt[n] if n < len(prompt) else -1 if request.queued_made else request.tokens[-1]
            pos[b, 0] = n
            seen = np.arange(n + 1) if self.window is None else np.arange(max(0, n + 1 - self.window), n + 1)
            mask[b, 0, 0, (request.start + seen) % self.M] = True
            target = prompt[n + 1] if n + 1 < len(prompt) else -1
            # the request's first step clears what the row's last request left (its prompt may have
            # been computed apart before it)
            table.append((request.params, request._key, ids[b, 0], not request.stepped, n >= len(prompt),
                          len(request.tokens) + request.queued_made, target))
            request.stepped = True
        fl, it = row_tables(table, self.vocab)
        if self.by_positions:
            mask = np.array([[r is None or r.fed + r.queued == 0] for r in rows])
        put = lambda a, mesh: distribute_tensor(a, mesh, [Replicate()] * mesh.ndim)
        return (put(ids, self.mesh), put(pos, self.mesh), put(mask, self.mesh), put(np.array([slot], np.int64), self.mesh),
                put(fl, self.out_mesh), put(it, self.out_mesh))

    def _prefill(self, members):
        """Computes the next chunk of a prompt (all but its last token) apart from the step for the
        requests ``members`` [(row, request)] that share it (the same prompt, slots and progress):
        its keys go to each one's row at the slots ``request.start`` gave them."""
        rows_of = [b for b, _ in members]
        request = members[0][1]
        lo = request.fed
        hi = min(len(request.prompt) - 1, lo + self.prefill_chunk)
        q = np.arange(lo, hi)[:, None]
        keys = np.arange(hi)[None, :]
        see = keys <= q                                                         # causal over positions
        if self.window is not None:
            see &= keys > q - self.window
        put = lambda a: distribute_tensor(a, self.mesh, [Replicate()] * self.mesh.ndim)
        slots = (request.start + np.arange(hi)) % self.M
        rows = _PromptRows(self.cache, rows_of[0], put(slots[lo:]), put(slots) if lo else None, hi,
                           put(np.isin(np.arange(self.B), rows_of).reshape(self.B, 1, 1, 1)))
        # the decoder alone: a chunk's keys are all it is for, its logits would cost the lm_head's
        # whole weight read (the prompt's last token goes through the step, which makes its logits)
        self.model.model(input_ids=put(np.array([request.prompt[lo:hi]], np.int64)),
                         attention_mask=put(see[None, None]), position_ids=put(q.T.copy()), past_key_values=rows)
        for _, r in members:
            r.fed = hi
            r.prefilling = hi < len(r.prompt) - 1
        self.prefills += 1

    def _prefill_together(self, groups):
        """Computes the prompts of ``groups`` (each [(row, request)] sharing a prompt) in one forward,
        each all but its last token and in one chunk: they all end at this step's slot, so they go
        right-aligned in a batch of one row per prompt, each over its own columns of the causal mask
        (the columns before a shorter prompt hidden), and each prompt's keys go to its requests' rows
        at the slots before this step's."""
        lengths = [len(m[0][1].prompt) - 1 for m in groups]
        L, end = max(lengths), groups[0][0][1].start + lengths[0] - 1      # the slot of every last key
        ids = np.zeros((len(groups), L), np.int64)
        pos = np.zeros((len(groups), L), np.int64)
        mine = np.zeros((len(groups), L), bool)                                # the columns of each prompt
        for g, (members, n) in enumerate(zip(groups, lengths)):
            ids[g, L - n:] = members[0][1].prompt[:n]
            pos[g, L - n:] = np.arange(n)
            mine[g, L - n:] = True
        see = np.tril(np.ones((L, L), bool))[None] & mine[:, None, :]           # (G, L, L)
        if self.window is not None:
            see &= pos[:, None, :] > pos[:, :, None] - self.window
        which = np.zeros(self.B, np.int64)                                     # each batch row's prompt
        keep = np.zeros((self.B, 1, L, 1), bool)                               # and the slots it writes
        for g, members in enumerate(groups):
            for b, _ in members:
                which[b] = g
                keep[b, 0, :, 0] = mine[g]
        put = lambda a: distribute_tensor(a, self.mesh, [Replicate()] * self.mesh.ndim)
        slots = (end + np.arange(1 - L, 1)) % self.M
        rows = _PromptsTogether(self.cache, put(slots), put(which), put(keep), L)
        self.model.model(input_ids=put(ids), attention_mask=put(see[:, None]), position_ids=put(pos),
                         past_key_values=rows)
        for members in groups:
            for _, r in members:
                r.fed = len(r.prompt) - 1
                r.prefilling = False
        self.prefills += 1

    def _logits(self, ids, pos, view, slot):
        if self.by_positions:
            # a row starting a request (or idle) forgets its slots' positions: the slots of its
            # previous request would otherwise be visible to it
            index = self.cache.key_index
            if index is not None:
                write_slice_(index, 0, 0, _ops.where(view, -1, index))
            out = self.model(ids, position_ids=pos, past_key_values=self.cache, cache_position=slot)
        else:
            k = ids.shape[0]
            cache = self.cache if k == self.B else _FirstRows(self.cache, k, self.B)
            out = self.model(ids, attention_mask=view, position_ids=pos, past_key_values=cache, cache_position=slot)
        return out.logits[:, -1, :]                                             # (k, V)

    def _run(self, ids, pos, view, slot, fl, it, last, seen, counts, penalize, sample, sort, logprobs):
        """The step of the first k = ids.shape[0] rows; what the rows have seen and made is kept for
        all B (the idle rows past k start afresh when they are next used). ``last`` (k,): the
        tokens of the step before, fed to the rows whose id (and fed token in ``it``) is -1."""
        k = ids.shape[0]
        if last is not None:
            last = last.unsqueeze(1)
            ids = _ops.where(ids < 0, last, ids)
            fed = it.narrow(1, I_FED, 1)
            pieces = [it.narrow(1, 0, I_FED)] if I_FED else []
            pieces.append(_ops.where(fed < 0, last, fed))
            if I_FED + 1 < I_COLUMNS:
                pieces.append(it.narrow(1, I_FED + 1, I_COLUMNS - I_FED - 1))
            it = cat(pieces, 1)
        logits = self._logits(ids, pos, view, slot)
        first = (seen, counts) if k == self.B else (seen.narrow(0, 0, k), counts.narrow(0, 0, k))
        token, extra, seen_k, counts_k = self.sampler.choose(logits, fl, it, *first, penalize, sample, sort, logprobs)
        if not penalize:
            return token, extra, seen, counts
        if k < self.B:
            seen_k, counts_k = cat([seen_k, seen.narrow(0, k, self.B - k)]), cat([counts_k, counts.narrow(0, k, self.B - k)])
        return token, extra, seen_k, counts_k


class _Launched:
    """A step issued and not landed: the request each of its ``k`` rows fed (None: idle), whether
    it makes a token for it, its tokens (a DTensor (k,), for the step after) and their futures."""

    def __init__(self, rows, k):
        self.rows, self.k = rows, k
        self.makes = [False] * len(rows)
        self.token, self.pending = None, []


class _FirstRows:
    """A step's view of the batcher's cache when it runs only the first ``rows`` of its ``full``
    rows: the new keys are padded with zero rows for the idle rows past them (the one write of a
    step: every row at the step's slot; no idle row's slot is seen by anyone), and attention reads
    the first rows only."""

    def __init__(self, cache, rows, full):
        self.cache, self.rows, self.full = cache, rows, full
        self.max_cache_len = cache.max_cache_len

    def get_seq_length(self, layer_idx=0):
        return self.cache.get_seq_length(layer_idx)

    def update(self, layer_idx, key_states, value_states, start):
        padded = []
        for x in (key_states, value_states):
            _, H, L, D = x.shape
            pad = zeros(self.full - self.rows, H, L, D, device_mesh=x.device_mesh, dtype=x.dtype,
                        placements=[Replicate() if isinstance(p, Partial) else p for p in x.placements])
            padded.append(cat([x, pad]))
        k, v = self.cache.update(layer_idx, *padded, start)
        return k.narrow(0, 0, self.rows), v.narrow(0, 0, self.rows)


class _PromptsTogether:
    """The cache as several prompts computed in one forward see it (ContinuousBatcher's
    _prefill_together): the keys of batch row g (G, H, L, D) go to the cache rows whose ``which``
    (B,) is g, at ``slots`` (L,), where ``keep`` (B, 1, L, 1) is set (the other rows and the columns
    before a shorter prompt keep theirs); attention reads the forward's own keys."""

    def __init__(self, cache, slots, which, keep, length):
        self.cache, self.slots, self.which, self.keep = cache, slots, which, keep
        self.max_cache_len = length

    def get_seq_length(self, layer_idx=0):
        return 0

    def update(self, layer_idx, key_states, value_states, start):
        for x, table in ((key_states, self.cache.key_cache), (value_states, self.cache.value_cache)):
            t = table[layer_idx]
            new = x.to(t.dtype).index_select(0, self.which)
            t.index_copy_(2, self.slots, _ops.where(self.keep, new, t.index_select(2, self.slots)))
        return key_states, value_states


class _PromptRows:
    """The cache as a chunk of a prompt computed apart sees it: the chunk's keys (1, H, L, D) go to
    the rows ``row_mask`` (B, 1, 1, 1) marks at ``slots`` (L,), leaving the other rows' keys there as
    they are, and attention reads row ``row``'s keys of the whole prompt so far (``all_slots``, the
    first ``seen`` positions; None for the first chunk, whose own keys are all)."""

    def __init__(self, cache, row, slots, all_slots, seen, row_mask):
        self.cache, self.row, self.slots, self.all_slots, self.row_mask = cache, row, slots, all_slots, row_mask
        self.max_cache_len = seen
        self._start = seen - slots.shape[0]

    def get_seq_length(self, layer_idx=0):
        return self._start

    def update(self, layer_idx, key_states, value_states, start):
        out = []
        for x, table in ((key_states, self.cache.key_cache), (value_states, self.cache.value_cache)):
            t = table[layer_idx]
            t.index_copy_(2, self.slots, _ops.where(self.row_mask, x.to(t.dtype), t.index_select(2, self.slots)))
            out.append(x if self.all_slots is None else t.narrow(0, self.row, 1).index_select(2, self.all_slots))
        return tuple(out)
