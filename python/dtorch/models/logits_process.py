"""The next token from a model's logits, on the devices, as transformers' logits processors,
warpers and sampling choose it (transformers/generation/logits_process.py and
``GenerationMixin._get_logits_processor``, whose order this keeps): the repetition penalty and the
minimum length (which hold even in greedy decoding), then with ``do_sample`` the temperature,
top-k, top-p and min-p, then the argmax (greedy) or a sample. The logits may be split over the
devices along the vocabulary (a tensor-parallel lm_head): every step here is elementwise or a
reduction over that split, except top-k and top-p, which gather whole rows; only the chosen ids
come back to the controller.

State that changes from step to step lives on the devices and is updated by the step itself, so
that a captured decode step (dtorch.capture) replays it: the per-row mask of the tokens seen so far
(repetition penalty), and the step's number, which the caller gives either as an int (a step run op
by op) or as the (1,) DTensor of the cache slot being written, ``prompt_len + step``."""
import numpy as np

from .. import _ops
from .._factory import arange, distribute_tensor, rand
from .._placement import Replicate, Shard
from .cache_utils import _no_partial

# Temperatures below this sample as it does: float32 noise scaled by it stays nonzero, and it already
# leaves only the best token (and exact ties) any chance, as the limit T -> 0 does.
_MIN_TEMPERATURE = 1e-30


# ---- the processors, as functions of the logits (b, V) -------------------------------------------
# Their parameters are numbers, or (b, 1) DTensors of one value per row (the continuous batcher's
# requests each have their own: dtorch.serving.sampling).

def repetition_penalty(logits, seen, penalty):
    """CTRL's rule (transformers' RepetitionPenaltyLogitsProcessor): where ``seen`` (b, V), a logit
    divided by ``penalty`` where positive, multiplied where negative."""
    return _ops.where(seen, _ops.where(logits < 0, logits * penalty, logits / penalty), logits)


def top_p_filter(logits, ranked, top_p, temperature=None):
    """logits with the tokens outside each row's top-p at -inf: the smallest set of best tokens
    whose probability at ``temperature`` (None: 1) reaches ``top_p``. ``ranked``: the rows' whole
    logits sorted largest first (-inf where top-k already cut). The best token always stays (the
    mass before it is 0), even for top_p = 0."""
    # softmax(ranked / T), from the distances to the best token: <= 0, so no T overflows them
    scaled = ranked if temperature is None else (ranked - ranked[:, :1]) / temperature
    probs = scaled.softmax(-1)
    before = probs.cumsum(-1) - probs                                           # mass of the better tokens
    lowest = ranked.masked_fill(before >= top_p, float("inf")).amin(-1, keepdim=True)
    return logits.masked_fill(logits < lowest, float("-inf"))


def min_p_filter(logits, min_p, temperature):
    """logits with the tokens whose probability at ``temperature`` is below ``min_p`` times the
    best one's at -inf, as exp((l_i - l_best) / T) < min_p: one max over the shards, no sum."""
    return logits.masked_fill(((logits - row_max(logits)) / temperature).exp() < min_p, float("-inf"))


def whole_rows(x):
    """x (b, V) with its vocabulary shards gathered among the devices (ranking needs whole rows)."""
    placements = [Replicate() if isinstance(p, Shard) and p.dim in (-1, x.ndim - 1) else p
                  for p in _no_partial(x.placements)]
    return x if list(x.placements) == placements else x.redistribute(x.device_mesh, placements)


def row_max(x):
    """The max of each row of x (b, V), all-reduced over the vocabulary's shards: (b, 1)."""
    best = x.amax(-1, keepdim=True)                                            # Partial(max) over shards
    if any(p.is_partial() for p in best.placements):
        best = best.redistribute(best.device_mesh, _no_partial(best.placements))
    return best


def first_argmax(x, positions):
    """The first index of the largest value along the last dim (``positions``: arange(V) split as
    x's vocabulary is): a max and a min over the (sharded) vocabulary, so only one number per row
    crosses devices."""
    return _ops.where(x == row_max(x), positions, x.shape[-1]).amin(-1)


def vocab_positions(x, made):
    """arange(V) split as x's vocabulary (last) dim is, kept in the dict ``made`` per layout."""
    V = x.shape[-1]
    split = tuple(Shard(0) if isinstance(p, Shard) and p.dim in (-1, x.ndim - 1) else Replicate()
                  for p in x.placements)
    key = (x.device_mesh, V, split)
    if key not in made:
        made[key] = arange(V, device_mesh=x.device_mesh, placements=list(split))
    return made[key]


class _Sampler:
    """The next token of each row of logits (b, V): processed, warped, then the argmax, or the
    argmax of logits plus Gumbel noise (a sample of their softmax).

    ``repetition_penalty`` p != 1: a token already in the row (its prompt after any left padding,
    and the tokens made so far) has its logit divided by p where it is positive, multiplied by p
    where it is negative (CTRL's rule, transformers' RepetitionPenaltyLogitsProcessor).
    ``min_new`` with ``eos``: the eos ids' logits are -inf while fewer than ``min_new`` new tokens
    are made (MinNewTokensLengthLogitsProcessor; min_length is turned into it by the caller).
    Sampling: temperature, top-k (k best), top-p (the smallest set of best tokens whose probability
    reaches p), min-p (tokens whose probability is below min_p times the best one's are dropped),
    in that order."""

    def __init__(self, do_sample=False, temperature=1.0, top_k=None, top_p=None, min_p=None, repetition_penalty=1.0,
                 eos=(), min_new=0, prompt_len=0):
        self.do_sample = bool(do_sample)
        if self.do_sample:
            if isinstance(temperature, bool) or not (isinstance(temperature, (int, float)) and temperature > 0):
                raise ValueError(f"generate: temperature must be a positive float, got {temperature!r}")
            if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 0):
                raise ValueError(f"generate: top_k must be a non-negative int, got {top_k!r}")
            if top_p is not None and not (isinstance(top_p, (int, float)) and 0.0 <= top_p <= 1.0):
                raise ValueError(f"generate: top_p must be a float in [0, 1], got {top_p!r}")
            if min_p is not None and not (isinstance(min_p, (int, float)) and 0.0 <= min_p <= 1.0):
                raise ValueError(f"generate: min_p must be a float in [0, 1], got {min_p!r}")
        if not (isinstance(repetition_penalty, (int, float)) and repetition_penalty > 0):
            raise ValueError(f"generate: repetition_penalty must be a positive float, got {repetition_penalty!r}")
        self.temperature = float(temperature)
        self.top_k = int(top_k) if top_k else 0
        self.top_p = float(top_p) if top_p is not None else 1.0
        self.min_p = float(min_p) if self.do_sample and min_p else 0.0
        self.penalty = float(repetition_penalty)
        self.eos = tuple(int(t) for t in eos)
        self.min_new = int(min_new) if self.eos else 0
        self.prompt_len = prompt_len
        self._index = {}
        self._eos_masks = {}

    @property
    def penalized(self):
        """Whether choosing keeps a mask of the tokens seen per row (``seen``)."""
        return self.penalty != 1.0

    def noise(self, batch, logits):
        """Uniform noise (batch, V) laid out like logits (b, V), for sampling; None when greedy."""
        if not self.do_sample:
            return None
        return rand((batch, logits.shape[-1]), device_mesh=logits.device_mesh,
                    placements=_no_partial(logits.placements))

    def prepare(self, logits):
        """Makes what choosing from logits like these keeps between steps (the vocabulary's
        positions, the eos mask), so that a captured step finds it made."""
        self._vocab_positions(logits)
        if self.min_new:
            self._eos_mask(logits)

    def seen(self, logits, prompt, real):
        """The (b, V) bool mask of the tokens in each row of ``prompt`` (b, P) (host ids) from its
        first real token on (``real``: the attention mask; transformers leaves out the left
        padding), laid out like logits; None without a repetition penalty."""
        if not self.penalized:
            return None
        b, V = prompt.shape[0], logits.shape[-1]
        first = np.argmax(real, axis=1)                    # transformers: the mask's argmax (0 if all pad)
        mask = np.zeros((b, V), bool)
        for row in range(b):
            ids = prompt[row, first[row]:]
            mask[row, ids[ids < V]] = True
        return distribute_tensor(mask, logits.device_mesh, _no_partial(logits.placements))

    def choose(self, logits, noise=None, seen=None, step=0):
        """(the next token of each row of logits (b, V), the new ``seen``). ``noise``: this step's
        rows of ``noise()`` (drawn here when None); ``seen``: the mask ``seen()`` made or the last
        choice returned; ``step``: the number of new tokens made so far, an int or the cache slot
        DTensor (1,) holding ``prompt_len + step``. Sampling takes argmax(logits / T + g) with
        g ~ Gumbel(0, 1), a sample of softmax(logits / T); below T = 1 as argmax(logits + T * g),
        the same argmax, which cannot overflow however small T is (logits / T would, to a row of
        infinities) and tends to the argmax of the logits as T -> 0."""
        logits = self._process(logits, seen, step)
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
        token = self._argmax(logits)                                                # (b,)
        if seen is not None:
            made = self._vocab_positions(seen) == token.view(token.shape[0], 1)      # (b, V)
            seen = seen | made
        return token, seen

    def _process(self, logits, seen, step):
        """The processors that hold in greedy decoding too: the repetition penalty over ``seen``,
        and the eos ids blocked before ``min_new`` new tokens."""
        if seen is not None:
            logits = repetition_penalty(logits, seen, self.penalty)
        if self.min_new:
            mask = self._eos_mask(logits)                                           # (V,)
            if isinstance(step, int):
                if step < self.min_new:
                    logits = logits.masked_fill(mask, float("-inf"))
            else:   # step is the slot prompt_len + step, on the devices
                logits = logits.masked_fill(mask & (step < self.prompt_len + self.min_new), float("-inf"))
        return logits

    def _warp(self, logits):
        """logits (b, V) with what top-k, top-p and min-p leave out at -inf; the temperature is
        applied by ``choose`` (and to top-p's and min-p's probabilities here)."""
        V = logits.shape[-1]
        T = max(self.temperature, _MIN_TEMPERATURE)
        if (self.top_k and self.top_k < V) or self.top_p < 1.0:
            whole = whole_rows(logits)
        if self.top_k and self.top_k < V:
            kth = whole.topk(self.top_k, -1).values[:, -1:]                         # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
            if self.top_p < 1.0:
                whole = whole.masked_fill(whole < kth, float("-inf"))
        if self.top_p < 1.0:
            ranked = whole.topk(V, -1).values                                       # (B, V), largest first
            logits = top_p_filter(logits, ranked, max(self.top_p, 1e-12), None if self.temperature == 1.0 else T)
        if self.min_p:
            logits = min_p_filter(logits, self.min_p, T)
        return logits

    def _argmax(self, x):
        return first_argmax(x, self._vocab_positions(x))

    def _vocab_positions(self, x):
        return vocab_positions(x, self._index)

    def _eos_mask(self, x):
        """The (V,) bool mask of the eos ids, split as x's vocabulary dim is."""
        positions = self._vocab_positions(x)
        key = id(positions)
        if key not in self._eos_masks:
            mask = np.isin(np.arange(x.shape[-1]), self.eos)
            self._eos_masks[key] = distribute_tensor(mask, positions.device_mesh, positions.placements)
        return self._eos_masks[key]

