"""Generation for causal language models: ``generate`` and ``stream`` with transformers'
arguments and generation_config.json. The next token is chosen on the devices over the
(vocabulary-sharded) logits (logits_process.py); only the chosen token ids travel to the controller
each step, where eos and stop strings are checked."""

import numpy as np

from .. import _runtime
from .._capture import CapturedFunction
from .._factory import arange, distribute_tensor
from .._safetensors import _progress
from ..parallel.pipeline import schedule_of
from .cache_utils import StaticCache
from .generation_config import FIELDS, GenerationConfig, Settings
from .logits_process import _Sampler
from .stopping_criteria import StopStringCriteria

_UNSET = object()
# generate's own keywords besides the generation config's fields
_CALL = ("input_ids", "attention_mask", "tokenizer", "seed", "capture", "progress")


class GenerationMixin:
    """``generate`` and ``stream`` for a model whose forward takes (input_ids, attention_mask,
    position_ids, past_key_values, logits_to_keep) and returns ``.logits``. Its caches are of the
    model's ``cache_class`` (a parallelize function may choose another); a pipelined model's rows
    run in the groups its schedule gives (dtorch.parallel.ScheduleGPipe). ``generation_config``:
    the model's generation settings (from_pretrained reads generation_config.json; otherwise they
    are made from the config's token ids, as transformers makes them)."""

    cache_class = StaticCache

    @property
    def generation_config(self):
        config = self.__dict__.get("_generation_config")
        if config is None:
            config = self.__dict__["_generation_config"] = GenerationConfig.from_model_config(self.config)
        return config

    @generation_config.setter
    def generation_config(self, value):
        if not isinstance(value, GenerationConfig):
            raise TypeError(f"generation_config must be a GenerationConfig, got {type(value).__name__}")
        self.__dict__["_generation_config"] = value

    def generate(self, inputs=None, max_new_tokens=_UNSET, *, generation_config=None, streamer=None, **kwargs):
        """The prompts (B, P) followed by the new tokens, as numpy int64 (B * num_return_sequences,
        P + n), with transformers' arguments and semantics (transformers 5's
        ``GenerationMixin.generate``):

        - Settings: the fields of ``generation_config`` (a GenerationConfig; it may also come second
          in place of max_new_tokens), where unset the model's ``generation_config``, then
          transformers' defaults (max_length 20, top_k 50, ...); keyword arguments override all
          (``eos_token_id=None`` turns the model's eos ids off). Fields dtorch does not implement
          (num_beams, typical_p, ...) are accepted at their neutral value and a ValueError otherwise;
          an unknown keyword is a TypeError naming it.
        - Length: ``max_new_tokens`` new tokens, else up to ``max_length`` tokens with the prompt;
          with neither set anywhere, 20 new tokens (within max_position_embeddings). ``min_new_tokens``
          (or ``min_length``, counting the prompt): the eos ids' logits are -inf until then.
        - ``eos_token_id`` (an int or a list): a row that made one is done; it gets ``pad_token_id``
          afterwards (default: the first eos id), and generation stops when every row is done.
          ``stop_strings`` (a string or a list) with ``tokenizer=``: a row is done when its text ends
          a stop string in its last token (transformers' StopStringCriteria); without eos ids such a
          row goes on with real tokens until every row is done, as transformers has it.
        - Greedy, or with ``do_sample`` a sample after ``temperature``, ``top_k``, ``top_p`` and
          ``min_p`` (in transformers' order) by the Gumbel-max trick with dtorch's counter-based
          random numbers: ``seed`` (which reseeds dtorch.manual_seed) gives the same tokens on every
          mesh. ``repetition_penalty`` applies in both (the CTRL rule over each row's tokens so far,
          its prompt without the left padding included). ``num_return_sequences`` (with
          do_sample): each prompt's row repeated that many times, next to each other.
        - Rows of different lengths: left padding with ``attention_mask`` (1 token, 0 pad); without
          one, a prompt holding ``pad_token_id`` (other than an eos id) is masked where it does.
        - ``streamer``: ``put(ids)`` gets the prompts, then each step's tokens (B,); ``end()`` at the end.
        - ``capture`` (default True): the decode step is recorded once (dtorch.capture) and replayed,
          one record per device and step, with every argument above: what changes from step to
          step on the devices (positions, the cache slot, the seen-token masks of the repetition
          penalty, whether eos is still blocked) is state the step itself updates. Generation goes op
          by op only where the cache is laid out per device (ring attention) or with capture=False;
          the tokens are the same either way. ``progress``: a bar over the new tokens on stderr
          (tqdm when it is installed); None shows it when stderr is a terminal."""
        prompt, steps, total = self._start("generate", inputs, max_new_tokens, generation_config, kwargs)
        if streamer is not None:
            streamer.put(prompt)
        out = [prompt]
        bar = _progress(total, "Generating", kwargs.get("progress"), unit="token")
        for tokens in steps:
            out.append(tokens[:, None])
            bar.update(1)
            if streamer is not None:
                streamer.put(tokens)
        bar.close()
        if streamer is not None:
            streamer.end()
        return np.concatenate(out, axis=1)

    def stream(self, inputs=None, max_new_tokens=_UNSET, *, generation_config=None, **kwargs):
        """An iterator over the new tokens, one numpy (B,) array per step, as ``generate`` makes them
        (the same arguments, but for ``streamer``)."""
        return self._start("stream", inputs, max_new_tokens, generation_config, kwargs)[1]

    def _start(self, where, inputs, max_new_tokens, generation_config, kwargs):
        """(the prompts as generated from (B * num_return_sequences, P), the iterator over the steps,
        the most new tokens)."""
        if isinstance(max_new_tokens, GenerationConfig) and generation_config is None:
            generation_config, max_new_tokens = max_new_tokens, _UNSET
        fields = {}
        for name, value in kwargs.items():
            if name in FIELDS:
                fields[name] = value
            elif name not in _CALL:
                raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
        if max_new_tokens is not _UNSET:
            fields["max_new_tokens"] = max_new_tokens
        if inputs is not None and kwargs.get("input_ids") is not None:
            raise TypeError("generate: give the prompts as inputs or as input_ids, not both")
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        defaults = self.generation_config
        if ids is None:          # transformers: generation from the bos token alone
            bos = getattr(generation_config, "bos_token_id", None)
            bos = fields["bos_token_id"] if "bos_token_id" in fields else defaults.bos_token_id if bos is None else bos
            if bos is None:
                raise ValueError("generate: no input_ids, and no bos_token_id to start from")
            ids = [[bos]]
        prompt = self._prompt(ids)
        B, P = prompt.shape
        settings = Settings(defaults, generation_config, fields, P,
                            getattr(self.config, "max_position_embeddings", None))
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is not None:
            mask = np.asarray(attention_mask)
            if mask.shape != (B, P):
                raise ValueError(f"generate: attention_mask has shape {mask.shape}, input_ids {prompt.shape}")
        elif settings.pad is not None and settings.pad not in settings.eos and (prompt == settings.pad).any():
            mask = prompt != settings.pad       # transformers infers the mask from the pad token
        else:
            mask = np.ones((B, P), np.int64)
        n = settings.num_return_sequences
        if n > 1:                                # each prompt's copies next to each other, as transformers
            prompt, mask = np.repeat(prompt, n, axis=0), np.repeat(mask, n, axis=0)
        sampler = _Sampler(settings.do_sample, settings.temperature, settings.top_k, settings.top_p, settings.min_p,
                           settings.repetition_penalty, settings.eos, settings.min_new, P)
        stops = None
        if settings.stop_strings:
            stops = StopStringCriteria(kwargs.get("tokenizer"), settings.stop_strings)
        steps = self._steps(prompt, mask != 0, settings.max_new, sampler, kwargs.get("seed"), settings.eos,
                            settings.pad, bool(kwargs.get("capture", True)), stops)
        return prompt, steps, settings.max_new

    def _prompt(self, input_ids):
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"generate: input_ids must be integer token ids of shape (batch, seq) with seq > 0, "
                             f"got {ids.dtype} {ids.shape}")
        return self._checked_ids(ids)

    def _steps(self, prompt, real, max_new_tokens, sampler, seed, eos, pad, capture=False, stops=None):
        """The decode loop. The rows run in the groups of the model's pipeline schedule (one group
        without a pipeline), each with its own cache and next token: a group's next step is queued as soon
        as its token is chosen, so while the last stage finishes one group the first stage already
        runs the next one's step. With ``capture`` the step of every group (choose the tokens,
        then the forward of each) is recorded once and replayed (``_DecodeStep``). The ids that
        come back are checked here: eos ids and ``stops`` (StopStringCriteria) end rows."""
        B, P = prompt.shape
        if max_new_tokens <= 0:
            return
        # transformers 5's positions from the mask: a masked token's is 0 (what follows it counts from there)
        positions = np.where(real, np.cumsum(real, axis=1) - 1, 0).astype(np.int64)
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
            logits = out.logits[:, -1]
            groups.append(_Group(rows, cache, logits, positions[rows, -1:] + 1,
                                 sampler.seen(logits, prompt[rows], real[rows])))
        done = np.zeros(B, bool)
        history = [prompt] if stops is not None else None
        decode = _DecodeStep(call, sampler, groups, B, P, padded) if capture and max_new_tokens > 1 else None
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
                noise = sampler.noise(B, groups[0].logits)   # one draw for the whole batch: the same on any split
                pending = []
                for group in groups:
                    rows = group.rows
                    token, group.seen = sampler.choose(group.logits, noise if noise is None or len(groups) == 1
                                                       else noise[rows], group.seen, step)   # (b,)
                    pending.append(token.future())
                    if step + 1 < max_new_tokens:   # the next step is queued before this one's ids arrive
                        b = rows.stop - rows.start
                        out = call(token.view(b, 1), position_ids=group.position if padded else None,
                                   past_key_values=group.cache, logits_to_keep=1)
                        group.logits, group.position = out.logits[:, -1], group.position + 1
            tokens = np.concatenate([p.result() for p in pending]).astype(np.int64)
            _check_chosen(tokens, done, groups[0].logits.shape[-1], step)
            if eos:            # transformers pads the rows that are done only when there are eos ids
                tokens[done] = pad
            yield tokens
            if eos:
                done |= np.isin(tokens, eos)
            if stops is not None:
                history.append(tokens[:, None])
                so_far = np.concatenate(history, axis=1)
                history = [so_far]
                for row in np.flatnonzero(~done):
                    done[row] = stops(so_far[row])
            if (eos or stops is not None) and done.all():
                # the step queued ahead is not needed; wait for it so that nothing of this
                # generation is still in flight when the caller goes on (or shuts down)
                _runtime.synchronize()
                return


class _Group:
    """One group of rows of the schedule: its cache, its last logits (b, V), the positions of its
    next tokens (b, 1) and its seen-token mask (repetition penalty; None without)."""

    def __init__(self, rows, cache, logits, position, seen):
        self.rows, self.cache, self.logits, self.position, self.seen = rows, cache, logits, position, seen


class _DecodeStep:
    """One decode step of every group, captured (dtorch.capture) on its first call and replayed
    after: the sampling noise for the batch, then per group the token chosen from its logits and
    the forward of that token, which writes the cache at the step's slot. The step's slot
    (``cache_position``, which also tells the sampler the step's number), with padding the
    positions, and with a repetition penalty the seen-token masks are DTensors that the step itself
    moves on, so the replays take nothing from the host. Calling it runs a step and returns each
    group's tokens; ``groups`` then hold the new logits and masks."""

    def __init__(self, call, sampler, groups, batch, prompt_len, padded):
        self.call, self.sampler, self.groups, self.batch, self.padded = call, sampler, groups, batch, padded
        self.usable = all(g.cache.slots_by_index() for g in groups)
        if not self.usable:
            return
        for group in groups:                 # what the step keeps between calls is made outside it
            sampler.prepare(group.logits)
        mesh = groups[0].logits.device_mesh
        self.slot = arange(prompt_len, prompt_len + 1, device_mesh=mesh)     # (1,): the cache slot
        self.positions = tuple(distribute_tensor(np.ascontiguousarray(g.position), mesh) if padded else None
                               for g in groups)
        self._step = CapturedFunction(self._run)
        self._step.__qualname__ = "decode step"

    def _run(self, logits, positions, seen, slot):
        noise = self.sampler.noise(self.batch, logits[0])
        tokens, new_logits, new_positions, new_seen = [], [], [], []
        for group, group_logits, position, group_seen in zip(self.groups, logits, positions, seen):
            rows = group.rows
            token, group_seen = self.sampler.choose(group_logits, noise if noise is None or len(self.groups) == 1
                                                    else noise[rows], group_seen, slot)
            out = self.call(token.view(rows.stop - rows.start, 1), position_ids=position,
                            past_key_values=group.cache, logits_to_keep=1, cache_position=slot)
            tokens.append(token)
            new_logits.append(out.logits[:, -1])
            new_positions.append(None if position is None else position + 1)
            new_seen.append(group_seen)
        return tokens, new_logits, tuple(new_positions), tuple(new_seen), slot + 1

    def __call__(self):
        tokens, logits, self.positions, seen, self.slot = self._step(
            tuple(g.logits for g in self.groups), self.positions, tuple(g.seen for g in self.groups), self.slot)
        for group, group_logits, group_seen in zip(self.groups, logits, seen):
            group.logits, group.seen = group_logits, group_seen
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
