"""Per-request sampling for the continuous batcher, on the devices: every row of a step has its own
parameters, so one captured step serves a greedy request beside a sampled one with its own
temperature, top-k, top-p, min-p, penalties and seed.

The host sends two small tables a step, a float32 (B, len(F)) and an int64 (B, len(I)) one (their
columns below), and gets back the chosen ids (B,) and, for rows that asked, log-probabilities. What
a row has seen lives on the devices and the step updates it: ``seen`` (B, V) bool, the tokens of its
prompt and output so far (the repetition penalty), and ``counts`` (B, V) float32, how many times
each token was made (the presence and frequency penalties). The token a step feeds is added first
(the prompt's tokens as they are fed, the made ones as they come back), so the step that chooses a
row's k-th token sees all before it; a row's first step clears what the row's last request left.

The order is vLLM's and transformers': penalties on the raw logits (repetition as CTRL and
transformers' RepetitionPenaltyLogitsProcessor; then minus frequency x count and presence x
(count > 0), as OpenAI documents them), then for sampled rows temperature, top-k, top-p, min-p,
then a sample by the Gumbel-max trick: the argmax of logits / T plus Gumbel noise. The processors
are generate's own (models/logits_process.py), given a column of per-row values where generate
gives one number; top-k here ranks whole rows once and cuts each at its own k. A greedy row takes
the argmax of its penalized logits, which no warp changes (each keeps the best token).
Log-probabilities are the model's raw ones, log_softmax of the logits before any of this (vLLM's
default).

The noise of a row is a function of its request's seed, the number of tokens it made so far and
the token id alone (a counter-based hash in int64 arithmetic on the devices): the same seed gives
the same text whatever else the batch holds, on any mesh."""
import dataclasses
import math
import numbers

import numpy as np

from .. import _dtype, _ops
from .._placement import Replicate
from ..models.logits_process import (_MIN_TEMPERATURE as MIN_TEMPERATURE, first_argmax, min_p_filter,
                                     repetition_penalty, top_p_filter, vocab_positions, whole_rows)

# columns of the float table
F_SCALE, F_NOISE, F_TEMPERATURE, F_TOP_P, F_MIN_P, F_PRESENCE, F_FREQUENCY, F_REPETITION = range(8)
F_COLUMNS = 8
# columns of the int table
I_FED, I_RESET, I_OUTPUT, I_KEY, I_STEP, I_TOP_K, I_TARGET = range(7)
I_COLUMNS = 7

# The most top log-probabilities a token may ask for (OpenAI's chat top_logprobs, vLLM's max_logprobs).
MAX_LOGPROBS = 20

# Temperatures and repetition penalties beyond float32's range are taken as the bound they pass (at
# T = 1e30 every token has the same chance already; below MIN_TEMPERATURE only the best one), so
# that no row's table holds an infinity or a zero.
_MAX_FACTOR = 1e30

_P = 2 ** 31 - 1    # the hash works modulo this prime: every product of two residues fits in int64
_ROUNDS = (0x2545F491, 0x1B873593, 0x68E31DA4)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request chooses its tokens (vLLM's SamplingParams, the fields this batcher runs).
    ``temperature`` 0 is greedy; ``top_k`` 0 or -1 keeps every token; ``seed`` None draws a seed;
    ``logprobs`` k: the chosen token's log-probability and the k most likely ones, per new token;
    ``prompt_logprobs`` the same for every prompt token after the first; ``stop``: strings that end
    the text (needs the batcher's tokenizer)."""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int = None
    prompt_logprobs: int = None
    stop: tuple = ()

    def __post_init__(self):
        def number(name, low, high, low_open=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or \
                    not (v > low if low_open else v >= low) or v > high:
                raise ValueError(f"submit: {name} must be a number in {'(' if low_open else '['}{low}, {high}], "
                                 f"got {v!r}")
            object.__setattr__(self, name, float(v))

        number("temperature", 0.0, math.inf)
        number("top_p", 0.0, 1.0, low_open=True)
        number("min_p", 0.0, 1.0)
        number("presence_penalty", -2.0, 2.0)
        number("frequency_penalty", -2.0, 2.0)
        number("repetition_penalty", 0.0, math.inf, low_open=True)
        for name, low in (("top_k", -1), ("logprobs", 0), ("prompt_logprobs", 0)):
            v = getattr(self, name)
            if v is None and name != "top_k":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low or \
                    name != "top_k" and v > MAX_LOGPROBS:
                raise ValueError(f"submit: {name} must be an int >= {low}" +
                                 ("" if name == "top_k" else f" and <= {MAX_LOGPROBS}") + f", got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise ValueError(f"submit: seed must be an int, got {self.seed!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"submit: stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)

    @property
    def sampled(self):
        return self.temperature > 0

    @property
    def penalized(self):
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def sorts(self, vocab):
        """Whether the row needs its logits ranked (top-k or top-p; only a sampled row: they keep
        the argmax)."""
        return self.sampled and (0 < self.top_k < vocab or self.top_p < 1.0)


def seed_key(seed):
    """A row's noise key in [0, _P) from any int seed (the same seed, the same key)."""
    h = int(seed) % (1 << 64)
    for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9):   # splitmix64's constants: nearby seeds land far apart
        h = ((h ^ (h >> 31)) * c + 1) % (1 << 64)
    return h % _P


def row_tables(rows, vocab):
    """The float and int tables (B, F_COLUMNS), (B, I_COLUMNS) for ``rows``: per row None (idle) or
    (params, key, fed token, first step of its request, fed token is an output, tokens made so far,
    the prompt token this step predicts or -1)."""
    B = len(rows)
    fl = np.zeros((B, F_COLUMNS), np.float32)
    it = np.zeros((B, I_COLUMNS), np.int64)
    fl[:, F_SCALE], fl[:, F_TEMPERATURE], fl[:, F_TOP_P], fl[:, F_REPETITION] = 1.0, 1.0, 2.0, 1.0
    it[:, I_RESET], it[:, I_TOP_K], it[:, I_TARGET] = 1, vocab, -1
    for b, row in enumerate(rows):
        if row is None:
            continue
        p, key, fed, first, output, made, target = row
        T = min(p.temperature, _MAX_FACTOR)
        if T >= 1.0:
            fl[b, F_SCALE], fl[b, F_NOISE] = 1.0 / T, 1.0
        elif T > 0:     # argmax(logits + T g): the same argmax as of logits / T + g, and no overflow
            fl[b, F_NOISE] = max(T, MIN_TEMPERATURE)
        fl[b, F_TEMPERATURE] = max(T, MIN_TEMPERATURE)
        fl[b, F_TOP_P] = p.top_p if p.top_p < 1.0 else 2.0          # 2: never reached, nothing cut
        fl[b, F_MIN_P] = p.min_p
        fl[b, F_PRESENCE], fl[b, F_FREQUENCY], fl[b, F_REPETITION] = \
            p.presence_penalty, p.frequency_penalty, min(max(p.repetition_penalty, 1 / _MAX_FACTOR), _MAX_FACTOR)
        it[b] = (fed, first, output, key, made, p.top_k if 0 < p.top_k < vocab else vocab, target)
    return fl, it


class RowSampler:
    """The per-row choice of the next token over logits (B, V), possibly split over the devices
    along the vocabulary; ``prepare`` makes what it keeps (outside any capture)."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.K = min(MAX_LOGPROBS, vocab)
        self._index = {}

    def prepare(self, logits):
        self._positions(logits)
        self._positions(whole_rows(logits))

    def choose(self, logits, fl, it, seen, counts, penalize, sample, sort, logprobs):
        """(tokens (B,), (chosen log-prob (B,), top log-probs (B, K), their ids (B, K)) or None, seen,
        counts). The flags say what any row of the step needs; a step without ``penalize`` leaves
        ``seen`` and ``counts`` as they are (no row reads them)."""
        raw = logits
        if penalize:
            logits, seen, counts = self._penalize(logits, fl, it, seen, counts)
        if sample:
            T = fl[:, F_TEMPERATURE:F_TEMPERATURE + 1]
            if sort:
                logits = self._top_k_top_p(logits, fl, it)
            logits = min_p_filter(logits, fl[:, F_MIN_P:F_MIN_P + 1], T)
            gumbel = -(-self._uniform(logits, it).log()).log()
            logits = logits * fl[:, F_SCALE:F_SCALE + 1] + gumbel * fl[:, F_NOISE:F_NOISE + 1]
        token = first_argmax(logits, self._positions(logits))
        if any(p.is_partial() for p in token.placements):
            token = token.redistribute(token.device_mesh, [Replicate() if p.is_partial() else p
                                                           for p in token.placements])
        extra = self._logprobs(raw, it, token) if logprobs else None
        return token, extra, seen, counts

    def _penalize(self, logits, fl, it, seen, counts):
        fed = self._positions(logits) == it[:, I_FED:I_FED + 1]                 # (B, V)
        reset = it[:, I_RESET:I_RESET + 1] != 0                                 # (B, 1)
        seen = seen.logical_and(reset.logical_not()).logical_or(fed)
        made = fed.logical_and(it[:, I_OUTPUT:I_OUTPUT + 1] != 0).to(_dtype.float32)
        counts = counts.masked_fill(reset, 0.0) + made
        logits = repetition_penalty(logits, seen, fl[:, F_REPETITION:F_REPETITION + 1])
        return (logits - counts * fl[:, F_FREQUENCY:F_FREQUENCY + 1]
                - (counts > 0).to(_dtype.float32) * fl[:, F_PRESENCE:F_PRESENCE + 1]), seen, counts

    def _top_k_top_p(self, logits, fl, it):
        """logits with what each row's top-k and top-p leave out at -inf (transformers' order:
        top-p over the probabilities at the row's temperature, among the top-k)."""
        whole = whole_rows(logits)
        ranked = whole.topk(self.vocab, -1).values                              # (B, V), largest first
        cut = self._positions(whole) >= it[:, I_TOP_K:I_TOP_K + 1]              # ranks past each row's k
        kth = ranked.masked_fill(cut, float("inf")).amin(-1, keepdim=True)      # the k-th best
        logits = logits.masked_fill(logits < kth, float("-inf"))
        return top_p_filter(logits, ranked.masked_fill(cut, float("-inf")), fl[:, F_TOP_P:F_TOP_P + 1],
                            fl[:, F_TEMPERATURE:F_TEMPERATURE + 1])

    def _uniform(self, logits, it):
        """Uniform noise in (0, 1), (B, V) laid out like logits, of (row key, row step, token id)."""
        h = (it[:, I_KEY:I_KEY + 1] * 16807 + it[:, I_STEP:I_STEP + 1]) % _P
        h = (h * 48271 + 11) % _P
        h = (h * 69621 + self._positions(logits)) % _P                          # (B, V)
        for c in _ROUNDS:                                                       # squarings: not linear in the id
            h = (h * h + c) % _P
            h = (h * 48271) % _P
        u = (h.to(_dtype.float32) + 0.5) / _P
        return u * (1 - 2e-7) + 1e-7                                            # kept off 0 and 1: finite Gumbel

    def _logprobs(self, raw, it, token):
        whole = whole_rows(raw)
        lp = whole.log_softmax(-1)                                              # (B, V)
        top = lp.topk(self.K, -1)
        target = it[:, I_TARGET:I_TARGET + 1]
        target = _ops.where(target >= 0, target, token.view(token.shape[0], 1))
        chosen = _ops.where(self._positions(whole) == target, lp, 0.0).sum(-1)
        return chosen, top.values, top.indices

    def _positions(self, x):
        """arange(V) split as x's vocabulary is, made once per layout."""
        return vocab_positions(x, self._index)
