"""GenerationConfig: transformers' generation settings (``generation_config.json``) with its field
names, and how ``generate`` combines them with its arguments, as transformers 5's ``generate``
does (``GenerationMixin._prepare_generation_config``, ``_prepare_special_tokens``,
``_prepare_generated_length``): the fields of a ``generation_config=`` argument, then the model's
``generation_config`` for the fields still unset, then transformers' global defaults, then the
keyword arguments over all of them (an explicit ``eos_token_id=None`` turns the model's eos off)."""
import copy
import json
import os

import numpy as np

from .._safetensors import CheckpointError, read_json
from . import config_fields
from .config_fields import count, either, flag, listing, number, optional, text

# What dtorch's generate does with each field transformers has.
# Implemented: they steer the tokens as transformers' processors, warpers and stopping criteria do.
SUPPORTED = ("max_length", "max_new_tokens", "min_length", "min_new_tokens", "stop_strings", "do_sample",
             "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "num_return_sequences",
             "pad_token_id", "bos_token_id", "eos_token_id")
# Not implemented: accepted at the value that leaves the tokens as they are (transformers' default),
# a ValueError naming the field otherwise (beam search, other warpers, extra outputs, ...).
NEUTRAL = dict(num_beams=1, num_beam_groups=1, diversity_penalty=0.0, typical_p=1.0, epsilon_cutoff=0.0,
               eta_cutoff=0.0, top_h=None, penalty_alpha=None, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
               encoder_repetition_penalty=1.0, guidance_scale=1.0, bad_words_ids=None, force_words_ids=None,
               constraints=None, suppress_tokens=None, begin_suppress_tokens=None, forced_bos_token_id=None,
               forced_eos_token_id=None, sequence_bias=None, exponential_decay_length_penalty=None,
               remove_invalid_values=False, max_time=None, token_healing=False, watermarking_config=None,
               dola_layers=None, prompt_lookup_num_tokens=None, assistant_early_exit=None, output_scores=False,
               output_logits=False, output_attentions=False, output_hidden_states=False,
               return_dict_in_generate=False)
# Without effect on the tokens of greedy or sampled decoding (caches, compilation, beam-only
# settings, log-normalised scores, assisted decoding's knobs): accepted and ignored.
INERT = ("use_cache", "cache_implementation", "cache_config", "max_cache_len", "early_stopping", "length_penalty",
         "renormalize_logits", "decoder_start_token_id", "compile_config", "disable_compile", "prefill_chunk_size",
         "low_memory", "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
         "assistant_lookbehind", "target_lookbehind", "is_assistant", "max_matching_ngram_size", "use_mtp",
         "speculation_type", "assistant_ensemble_weight", "continuous_batching_config", "transformers_version")
FIELDS = SUPPORTED + tuple(NEUTRAL) + INERT

# transformers' GenerationConfig._get_default_generation_params, for the fields dtorch reads
DEFAULTS = dict(max_length=20, min_length=0, do_sample=False, temperature=1.0, top_k=50, top_p=1.0,
                repetition_penalty=1.0, num_return_sequences=1)



def _real(owner, name, value):
    """Any number (the sampler says which temperatures it takes, when it samples)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be a number, got {value!r}")


_TOKEN = count(-(1 << 63))    # token ids: any int (transformers warns about negative ones, and never meets them)
_KINDS = dict(max_length=optional(count(0)), max_new_tokens=optional(count(0)), min_length=optional(count(0)),
              min_new_tokens=optional(count(0)), stop_strings=optional(either(text, listing(text, nonempty=True))),
              do_sample=optional(flag), temperature=optional(_real), top_k=optional(count(0)),
              top_p=optional(number(low=0)), min_p=optional(number(low=0)),
              repetition_penalty=optional(number(above=0)),
              num_return_sequences=optional(count(1)), pad_token_id=optional(_TOKEN), bos_token_id=optional(_TOKEN),
              eos_token_id=optional(either(_TOKEN, listing(_TOKEN))))
_AT_MOST_ONE = ("top_p", "min_p")


def plain(value):
    """numpy scalars and arrays (ids taken from an array) as Python numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def check_fields(owner, values):
    """The kinds of the implemented fields ``values`` (a dict) holds: a TypeError or ValueError
    naming ``owner`` and the field."""
    config_fields.check(owner, values, _KINDS)
    for name in _AT_MOST_ONE:
        if values.get(name) is not None and values[name] > 1:
            raise ValueError(f"{owner}: {name} must be in [0, 1], got {values[name]!r}")


class GenerationConfig:
    """transformers' GenerationConfig: every field None unless given (None: unset, so the model's
    settings and then transformers' defaults apply). Fields of other names are kept as attributes,
    as transformers keeps them, and do nothing."""

    def __init__(self, **kwargs):
        kwargs = {k: plain(v) for k, v in kwargs.items()}
        for name in FIELDS:
            setattr(self, name, kwargs.pop(name, None))
        for name, value in kwargs.items():
            setattr(self, name, value)
        check_fields("GenerationConfig", self.__dict__)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        return cls(**dict(config_dict, **kwargs))

    @classmethod
    def from_model_config(cls, model_config):
        """The settings a model config gives (transformers does this for a model without a
        generation_config.json): its generation fields that are set, the token ids above all."""
        values = model_config if isinstance(model_config, dict) else vars(model_config)
        return cls(**{k: v for k, v in values.items() if k in FIELDS and v is not None})

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, config_file_name=None):
        """``generation_config.json`` (or ``config_file_name``) of a directory; a missing file is
        an OSError, a bad one a CheckpointError (an OSError and a ValueError) naming it."""
        path = os.fspath(pretrained_model_name_or_path)
        file = os.path.join(path, config_file_name or "generation_config.json")
        return cls._read(file)

    @classmethod
    def _read(cls, file, model_config=False):
        try:
            values = read_json(file)
        except CheckpointError:
            raise
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise CheckpointError(f"{file}: cannot read the generation config: {e.strerror or e}") from None
        except ValueError as e:
            raise CheckpointError(f"{file}: not JSON: {e}") from None
        if not isinstance(values, dict):
            raise CheckpointError(f"{file}: the generation config is not a JSON object")
        if model_config:
            values = {k: v for k, v in values.items() if k in FIELDS and v is not None}
        try:
            return cls(**values)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{file}: bad generation config: {e}") from None

    def to_dict(self):
        return copy.deepcopy(self.__dict__)

    def to_diff_dict(self):
        """The fields that are set (what generation_config.json holds)."""
        return {k: v for k, v in self.to_dict().items() if v is not None}

    def to_json_string(self):
        return json.dumps(self.to_diff_dict(), indent=2, sort_keys=True) + "\n"

    def save_pretrained(self, save_directory, config_file_name=None):
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, config_file_name or "generation_config.json"), "w") as f:
            f.write(self.to_json_string())

    def update(self, **kwargs):
        """Sets the fields named (all of them, None too); returns the arguments that are no field."""
        kwargs = {k: plain(v) for k, v in kwargs.items()}
        unused = {k: v for k, v in kwargs.items() if k not in self.__dict__}
        values = dict(self.__dict__, **{k: v for k, v in kwargs.items() if k in self.__dict__})
        check_fields("GenerationConfig", values)
        self.__dict__.update(values)
        return unused

    def __eq__(self, other):
        return isinstance(other, GenerationConfig) and self.to_diff_dict() == other.to_diff_dict()

    def __repr__(self):
        return f"GenerationConfig {self.to_json_string()}"


def load_generation_config(path):
    """The generation config of a model directory, as transformers' from_pretrained reads it:
    ``generation_config.json``, or without one the generation fields of ``config.json`` (its token
    ids). ``path`` may also name a file in the directory."""
    directory = os.fspath(path)
    if not os.path.isdir(directory):
        directory = os.path.dirname(directory) or "."
    try:
        return GenerationConfig._read(os.path.join(directory, "generation_config.json"))
    except FileNotFoundError:
        return GenerationConfig._read(os.path.join(directory, "config.json"), model_config=True)


class Settings:
    """What one ``generate`` call does, resolved from its arguments, the model's generation config
    and transformers' defaults for a prompt of ``prompt_len`` tokens: ``max_new`` and ``min_new``
    tokens, ``eos`` (a tuple in the order given), ``pad`` (None when there is no eos and no pad),
    and the sampling fields."""

    def __init__(self, model_config, generation_config, kwargs, prompt_len, max_position_embeddings=None):
        given = generation_config is not None
        if given and not isinstance(generation_config, GenerationConfig):
            raise TypeError(f"generate: generation_config must be a GenerationConfig, got "
                            f"{type(generation_config).__name__}")
        config = copy.deepcopy(generation_config) if given else GenerationConfig()
        for name, value in model_config.__dict__.items():          # the model's settings where unset
            if getattr(config, name, None) is None:
                setattr(config, name, copy.deepcopy(value))
        for name, value in DEFAULTS.items():
            if getattr(config, name) is None:
                setattr(config, name, value)
        default_max_length = (kwargs.get("max_length") is None and (not given or generation_config.max_length is None)
                              and model_config.max_length is None)
        for name, value in kwargs.items():
            setattr(config, name, plain(value))
        for name, value in dict(DEFAULTS, top_k=0).items():     # an explicit None: the processor is off
            if getattr(config, name) is None:
                setattr(config, name, value)
        max_new = config.max_new_tokens
        if max_new is not None and (isinstance(max_new, bool) or not isinstance(max_new, int)):
            raise TypeError(f"generate: max_new_tokens must be an int, got {type(max_new).__name__}")
        if max_new is not None and max_new < 0:
            raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new}")
        check_fields("generate", config.__dict__)
        for name, neutral in NEUTRAL.items():
            value = getattr(config, name)
            if value is not None and value != neutral:
                raise ValueError(f"generate: {name}={value!r} is not supported (dtorch's generate does greedy and "
                                 f"sampled decoding); leave it unset or pass {name}={neutral!r}")
        self.config = config
        P = prompt_len
        if max_new is None:
            max_length = config.max_length
            if default_max_length:            # transformers: 20 new tokens, within the model's positions
                max_length = max_length + P
                if max_position_embeddings is not None:
                    max_length = min(max_length, max_position_embeddings)
            if P >= max_length:
                raise ValueError(f"generate: the prompt has {P} tokens, but max_length is {max_length}: set "
                                 "max_new_tokens, or a larger max_length (it counts the prompt)")
            max_new = max_length - P
        self.max_new = max_new
        self.min_new = config.min_new_tokens if config.min_new_tokens is not None else max(config.min_length - P, 0)
        eos = config.eos_token_id
        self.eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        self.pad = config.pad_token_id if config.pad_token_id is not None else self.eos[0] if self.eos else None
        self.do_sample = config.do_sample
        self.num_return_sequences = config.num_return_sequences
        if self.num_return_sequences > 1 and not self.do_sample:
            raise ValueError(f"generate: num_return_sequences={self.num_return_sequences} needs do_sample=True "
                             "(greedy decoding gives one sequence per prompt)")
        self.temperature, self.top_k, self.top_p = config.temperature, config.top_k, config.top_p
        self.min_p = config.min_p
        self.repetition_penalty = config.repetition_penalty
        stops = config.stop_strings
        self.stop_strings = None if stops is None else (stops,) if isinstance(stops, str) else tuple(stops)
