"""Generation for causal language models: a key/value cache and ``generate`` / ``stream`` with
transformers' arguments. Sampling runs on the devices over the (vocabulary-sharded) logits; only
the chosen token ids travel to the controller each step."""
import numbers

import numpy as np

from .. import _ops, _runtime
from .._capture import CapturedFunction
from .._factory import arange, distribute_tensor, rand
from .._placement import Replicate, Shard
from .._safetensors import _progress
from ..parallel.pipeline import schedule_of
from .cache_utils import StaticCache, _no_partial


class GenerationMixin:
    """``generate`` and ``stream`` for a model whose forward takes (input_ids, attention_mask,
    position_ids, past_key_values, logits_to_keep) and returns ``.logits``. Its caches are of the
    model's ``cache_class`` (a parallelize function may choose another); a pipelined model's rows
    run in the groups its schedule gives (dtorch.parallel.ScheduleGPipe)."""

    cache_class = StaticCache

    def generate(self, input_ids, max_new_tokens=20, do_sample=False, temperature=1.0, top_k=None, top_p=None,
                 seed=None, eos_token_id=None, attention_mask=None, streamer=None, pad_token_id=None, capture=True,
                 progress=None):
        """The prompts (B, P) followed by up to max_new_tokens new tokens each, as numpy int64
        (B, P + n). Greedy, or with ``do_sample`` sampled after temperature, top-k and top-p (in
        transformers' order) by the Gumbel-max trick on the devices with dtorch's counter-based
        random numbers: ``seed`` (which reseeds dtorch.manual_seed) gives the same tokens on every
        mesh. Rows of different lengths: left padding with ``attention_mask`` (1 token, 0 pad).
        ``eos_token_id`` (an int or a list): a row that made it gets ``pad_token_id`` afterwards
        (default: the config's pad, else the eos), and generation stops when every row has.
        ``streamer``: ``put(ids)`` gets the prompts, then each step's tokens (B,); ``end()`` at the end.
        ``capture``: the decode step is recorded once (dtorch.capture) and replayed, one record per
        device and step, where the cache allows it (not with a cache laid out per device, as ring
        attention lays it out); the tokens are the same either way. ``progress``: a bar over the new
        tokens on stderr (tqdm when it is installed); None shows it when stderr is a terminal."""
        prompt = self._prompt(input_ids)
        steps = self.stream(prompt, max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, eos_token_id=eos_token_id, attention_mask=attention_mask,
                            pad_token_id=pad_token_id, capture=capture)
        if streamer is not None:
            streamer.put(prompt)
        out = [prompt]
        bar = _progress(max_new_tokens, "Generating", progress, unit="token")
        for tokens in steps:
            out.append(tokens[:, None])
            bar.update(1)
            if streamer is not None:
                streamer.put(tokens)
        bar.close()
        if streamer is not None:
            streamer.end()
        return np.concatenate(out, axis=1)

    def _prompt(self, input_ids):
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"generate: input_ids must be integer token ids of shape (batch, seq) with seq > 0, "
                             f"got {ids.dtype} {ids.shape}")
        return self._checked_ids(ids)

    def stream(self, input_ids, max_new_tokens=20, do_sample=False, temperature=1.0, top_k=None, top_p=None,
               seed=None, eos_token_id=None, attention_mask=None, pad_token_id=None, capture=True):
        """An iterator over the new tokens, one numpy (B,) array per step, as ``generate`` makes them."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
            raise TypeError(f"generate: max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
        if max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
        prompt = self._prompt(input_ids)
        B, P = prompt.shape
        mask = np.ones((B, P), np.int64) if attention_mask is None else np.asarray(attention_mask)
        if mask.shape != (B, P):
            raise ValueError(f"generate: attention_mask has shape {mask.shape}, input_ids {prompt.shape}")
        warp = _Sampler(do_sample, temperature, top_k, top_p)
        eos = _token_set(eos_token_id)
        if pad_token_id is None:
            pad_token_id = self.config.pad_token_id
        if pad_token_id is None:
            pad_token_id = min(eos) if eos else 0
        return self._steps(prompt, mask != 0, int(max_new_tokens), warp, seed, eos, int(pad_token_id), bool(capture))

    def _steps(self, prompt, real, max_new_tokens, warp, seed, eos, pad, capture=False):
        """The decode loop. The rows run in the groups of the model's pipeline schedule (one group
        without a pipeline), each with its own cache and next token: a group's next step is queued as soon
        as its token is chosen, so while the last stage finishes one group the first stage already
        runs the next one's step. With ``capture`` the step of every group (choose the tokens,
        then the forward of each) is recorded once and replayed (``_DecodeStep``)."""
        B, P = prompt.shape
        if max_new_tokens <= 0:
            return
        positions = np.where(real, np.cumsum(real, axis=1) - 1, 1).astype(np.int64)   # HF's, from the mask
        padded = not real.all()
        if seed is not None:
            _runtime.manual_seed(seed)
        schedule = schedule_of(self)

        def call(*args, **kwargs):   # the forward of one group's rows
            return schedule.call_microbatch(self, **dict(zip(("input_ids",), args)), **kwargs)

        groups = []
        for rows in schedule.microbatches(B):
            cache = self.cache_class(P + max_new_tokens)
            out = call(prompt[rows], attention_mask=real[rows] if padded else None,
                       position_ids=positions[rows] if padded else None, past_key_values=cache, logits_to_keep=1)
            # [rows, cache, logits (b, V), next positions (b, 1)]
            groups.append([rows, cache, out.logits[:, -1], positions[rows, -1:] + 1])
        done = np.zeros(B, bool)
        decode = _DecodeStep(call, warp, groups, B, P, padded) if capture and max_new_tokens > 1 else None
        if decode is not None and not decode.usable:
            decode = None
        ahead = None   # the tokens' futures of the captured step queued one step ahead
        for step in range(max_new_tokens):
            if decode is not None and step + 1 < max_new_tokens:
                # A replay is one record: its tokens come back only when the whole step is done.
                # The next step's replay is queued before they are awaited, so the devices go
                # from one step straight into the next instead of waiting for the host.
                pending = ahead if ahead is not None else [token.future() for token in decode()]
                ahead = [token.future() for token in decode()] if step + 2 < max_new_tokens else None
            else:
                noise = warp.noise(B, groups[0][2])      # one draw for the whole batch: the same on any split
                pending = []
                for group in groups:
                    rows, cache, logits, position = group
                    token = warp.choose(logits, noise if noise is None or len(groups) == 1 else noise[rows])   # (b,)
                    pending.append(token.future())
                    if step + 1 < max_new_tokens:   # the next step is queued before this one's ids arrive
                        b = rows.stop - rows.start
                        out = call(token.view(b, 1), position_ids=position if padded else None,
                                   past_key_values=cache, logits_to_keep=1)
                        group[2], group[3] = out.logits[:, -1], position + 1
            tokens = np.concatenate([p.result() for p in pending]).astype(np.int64)
            _check_chosen(tokens, done, groups[0][2].shape[-1], step)
            tokens[done] = pad
            yield tokens
            if eos:
                done |= np.isin(tokens, list(eos))
                if done.all():
                    # the step queued ahead is not needed; wait for it so that nothing of this
                    # generation is still in flight when the caller goes on (or shuts down)
                    _runtime.synchronize()
                    return


class _DecodeStep:
    """One decode step of every group, captured (dtorch.capture) on its first call and replayed
    after: the sampling noise for the batch, then per group the token chosen from its logits and
    the forward of that token, which writes the cache at the step's slot. The step's slot
    (``cache_position``) and, with padding, the positions are DTensors that the step itself moves
    on, so the replays take nothing from the host. Calling it runs a step and returns each
    group's tokens; ``groups`` then holds the new logits."""

    def __init__(self, call, warp, groups, batch, prompt_len, padded):
        self.call, self.warp, self.groups, self.batch, self.padded = call, warp, groups, batch, padded
        self.usable = all(g[1].slots_by_index() for g in groups)
        if not self.usable:
            return
        for group in groups:                 # what the step keeps between calls is made outside it
            warp.prepare(group[2])
        mesh = groups[0][2].device_mesh
        self.slot = arange(prompt_len, prompt_len + 1, device_mesh=mesh)     # (1,): the cache slot
        self.positions = tuple(distribute_tensor(np.ascontiguousarray(g[3]), mesh) if padded else None
                               for g in groups)
        self._step = CapturedFunction(self._run)
        self._step.__qualname__ = "decode step"

    def _run(self, logits, positions, slot):
        noise = self.warp.noise(self.batch, logits[0])
        tokens, new_logits, new_positions = [], [], []
        for (rows, cache, _, _), group_logits, position in zip(self.groups, logits, positions):
            token = self.warp.choose(group_logits, noise if noise is None or len(self.groups) == 1 else noise[rows])
            out = self.call(token.view(rows.stop - rows.start, 1), position_ids=position, past_key_values=cache,
                            logits_to_keep=1, cache_position=slot)
            tokens.append(token)
            new_logits.append(out.logits[:, -1])
            new_positions.append(None if position is None else position + 1)
        return tokens, new_logits, tuple(new_positions), slot + 1

    def __call__(self):
        tokens, logits, self.positions, self.slot = self._step(tuple(g[2] for g in self.groups), self.positions,
                                                               self.slot)
        for group, group_logits in zip(self.groups, logits):
            group[2] = group_logits
        return tokens


def _check_chosen(tokens, done, vocab, step):
    """Rows still generating whose token is ``vocab`` (what the argmax gives when no entry of a row
    equals its maximum: the row holds NaN) are a RuntimeError naming the step (1 for the first new
    token) and the rows. The forwards queued after it read that token; their failure (an
    embedding index out of range) is never awaited, and their tensors are dropped with the cache."""
    bad = np.flatnonzero((tokens >= vocab) & ~done)
    if bad.size:
        raise RuntimeError(f"generate: new token {step + 1}: the logits of row(s) {bad.tolist()} hold NaN, so no token "
                           "can be chosen (NaN or infinite values in the model's weights or activations)")


def _token_set(eos_token_id):
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, (int, np.integer)):
        return {int(eos_token_id)}
    return {int(t) for t in eos_token_id}


# Temperatures below this sample as it does: float32 noise scaled by it stays nonzero, and it already
# leaves only the best token (and exact ties) any chance, as the limit T -> 0 does.
_MIN_TEMPERATURE = 1e-30


class _Sampler:
    """The next token from logits (B, V) on the devices: argmax, or after temperature / top-k /
    top-p, the argmax of logits plus Gumbel noise (a sample of softmax(logits))."""

    def __init__(self, do_sample, temperature, top_k, top_p):
        self.do_sample = bool(do_sample)
        if self.do_sample:
            if isinstance(temperature, bool) or not (isinstance(temperature, (int, float)) and temperature > 0):
                raise ValueError(f"generate: temperature must be a positive float, got {temperature!r}")
            if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 0):
                raise ValueError(f"generate: top_k must be a non-negative int, got {top_k!r}")
            if top_p is not None and not (isinstance(top_p, (int, float)) and 0.0 <= top_p <= 1.0):
                raise ValueError(f"generate: top_p must be a float in [0, 1], got {top_p!r}")
        self.temperature = float(temperature)
        self.top_k = int(top_k) if top_k else 0
        self.top_p = float(top_p) if top_p is not None else 1.0
        self._index = {}

    def noise(self, batch, logits):
        """Uniform noise (batch, V) laid out like logits (b, V), for sampling; None when greedy."""
        if not self.do_sample:
            return None
        return rand((batch, logits.shape[-1]), device_mesh=logits.device_mesh,
                    placements=_no_partial(logits.placements))

    def prepare(self, logits):
        """Makes what choosing from logits like these keeps between steps (the vocabulary's
        positions), so that a captured step finds it made."""
        self._vocab_positions(logits)

    def choose(self, logits, noise=None):
        """The next token of each row of logits (b, V); ``noise``: this step's rows of ``noise()``
        (drawn here when None). Sampling takes argmax(logits / T + g) with g ~ Gumbel(0, 1), a sample
        of softmax(logits / T); below T = 1 as argmax(logits + T * g), the same argmax, which cannot
        overflow however small T is (logits / T would, to a row of infinities) and tends to the
        argmax of the logits as T -> 0."""
        if self.do_sample:
            logits = self._warp(logits)
            if noise is None:
                noise = self.noise(logits.shape[0], logits)
            gumbel = -(-noise.log()).log()
            T = self.temperature
            if T >= 1.0:
                logits = (logits / T if T != 1.0 else logits) + gumbel
            else:
                logits = logits + gumbel * max(T, _MIN_TEMPERATURE)
        return self._argmax(logits)

    def _warp(self, logits):
        """logits (b, V) with what top-k and top-p leave out at -inf; the temperature is applied by
        ``choose`` (and to top-p's probabilities here)."""
        V = logits.shape[-1]
        if (self.top_k and self.top_k < V) or self.top_p < 1.0:
            # ranking needs whole rows: the vocabulary shards are gathered among the devices (B x V)
            whole = logits.redistribute(logits.device_mesh, [Replicate() if isinstance(p, Shard) and p.dim == 1
                                                             else p for p in _no_partial(logits.placements)])
        if self.top_k and self.top_k < V:
            kth = whole.topk(self.top_k, -1).values[:, -1:]                         # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
            if self.top_p < 1.0:
                whole = whole.masked_fill(whole < kth, float("-inf"))
        if self.top_p < 1.0:
            ranked = whole.topk(V, -1).values                                       # (B, V), largest first
            # softmax(ranked / T), from the distances to the best token: <= 0, so no T overflows them
            scaled = ranked if self.temperature == 1.0 else \
                (ranked - ranked[:, :1]) / max(self.temperature, _MIN_TEMPERATURE)
            probs = scaled.softmax(-1)
            before = probs.cumsum(-1) - probs                                       # mass of the better tokens
            # the best token always stays (its mass before is 0), even for top_p = 0
            lowest = ranked.masked_fill(before >= max(self.top_p, 1e-12), float("inf")).amin(-1, keepdim=True)
            logits = logits.masked_fill(logits < lowest, float("-inf"))
        return logits

    def _argmax(self, x):
        """The first index of the largest value along the last dim: a max and a min over the
        (sharded) vocabulary, so only one number per row crosses devices."""
        V = x.shape[-1]
        best = x.amax(-1, keepdim=True)                                            # Partial(max) over shards
        if any(p.is_partial() for p in best.placements):
            best = best.redistribute(best.device_mesh, _no_partial(best.placements))   # (B, 1) all-reduced
        return _ops.where(x == best, self._vocab_positions(x), V).amin(-1)

    def _vocab_positions(self, x):
        """arange(V) split as x's vocabulary (last) dim is, made once per layout."""
        V = x.shape[-1]
        split = tuple(Shard(0) if isinstance(p, Shard) and p.dim == x.ndim - 1 else Replicate() for p in x.placements)
        key = (x.device_mesh, V, split)
        if key not in self._index:
            self._index[key] = arange(V, device_mesh=x.device_mesh, placements=list(split))
        return self._index[key]
