"""Text <-> token ids as transformers' AutoTokenizer gives them, on the same files.

A model directory's ``tokenizer.json`` is the whole tokenization pipeline (normalizer,
pre-tokenizer, model, post-processor that adds the special tokens, decoder); the `tokenizers`
library runs it. ``tokenizer_config.json`` adds what transformers keeps around it: the named
special tokens (bos, eos, pad, unk, ... as strings or AddedToken dicts), the padding side, the
model's maximum length, the chat template (or a ``chat_template.jinja`` file beside it). Loading
follows transformers 5 where it differs from the file alone:
- a named special token, or an entry of ``added_tokens_decoder``, that the tokenizer does not have
  is added to it (new ids past the end of the vocabulary);
- ``add_bos_token`` / ``add_eos_token`` are ignored beside a tokenizer.json: its post-processor
  alone says which special tokens encoding adds;
- ``tokenizer_class`` LlamaTokenizer (Llama 2, Mistral) on a sentencepiece-style file replaces the
  file's normalizer, pre-tokenizer and decoder with its own (a Metaspace that prefixes "▁" to the
  first word only, unless ``legacy``) and pads on the left by default; Qwen2Tokenizer puts its own
  (NFC, Qwen2's split regex, byte level) in place of the file's, and its default special tokens
  (<|endoftext|> for unk, eos and pad) where the config names none;
- ``clean_up_tokenization_spaces`` is not applied to BPE vocabularies.

A directory without tokenizer.json is read from the files before it, as transformers converts
them (tokenizer_files.py): vocab.json + merges.txt under tokenizer_class CLIPTokenizer or
GPT2Tokenizer, spiece.model under T5Tokenizer (with special_tokens_map.json when the config has no
added_tokens_decoder). CLIPTokenizer's decode (from either kind of file) turns the end-of-word
suffix "</w>" into spaces and strips the ends, as transformers' does.

Chat templates are rendered with jinja2 as transformers renders them (chat_template.py).

Both libraries are the optional extra ``dtorch[text]``, imported when a tokenizer is first loaded.
"""
import functools
import os
import threading
import warnings

import numpy as np

from .._safetensors import CheckpointError, open_regular, read_json_object
from . import tokenizer_files
from .chat_template import render_chat

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"

VERY_LARGE_INTEGER = int(1e30)   # model_max_length when the config has none, as transformers
LARGE_INTEGER = int(1e20)        # above it, model_max_length means "no limit"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_MAX_ID = 2 ** 32 - 1            # token ids are u32 in `tokenizers`

# transformers' tokenizer classes that load differently from the tokenizer.json alone: their own
# defaults for what tokenizer_config.json does not say
_CLASS_DEFAULTS = {
    "LlamaTokenizer": dict(padding_side="left", unk_token="<unk>", bos_token="<s>", eos_token="</s>"),
    "Qwen2Tokenizer": dict(unk_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"),
}
_INIT_OVERRIDES = {"padding_side", "truncation_side", "model_max_length", "clean_up_tokenization_spaces",
                   "chat_template", *SPECIAL_TOKEN_NAMES}


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError("dtorch's tokenizers need the `tokenizers` package (and jinja2 for chat templates): "
                          "pip install dtorch[text]") from None
    return tokenizers


class BatchEncoding(dict):
    """What calling a tokenizer returns: ``input_ids`` and ``attention_mask`` (lists, or int64 arrays
    with ``return_tensors="np"``), also readable as attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _check_kwargs(where, kwargs):
    if kwargs:
        raise TypeError(f"{where} got unexpected keyword argument(s): {', '.join(sorted(map(str, kwargs)))}")


class PreTrainedTokenizer:
    """A model directory's tokenizer (see the module's doc). Made by ``AutoTokenizer.from_pretrained``."""

    _word_suffix = None   # CLIP's "</w>": decode turns it into a space and strips the text

    def __init__(self, backend, config, name_or_path=""):
        """``backend``: the `tokenizers.Tokenizer` of tokenizer.json; ``config``: tokenizer_config.json's
        dict, its special tokens already AddedTokens or strings (``_read_config``)."""
        tk = _tokenizers()
        self._backend = backend
        self._lock = threading.Lock()   # encoding sets the backend's padding and truncation for the call
        self._warned_long = False
        self.name_or_path = name_or_path
        self.model_max_length = config.get("model_max_length", VERY_LARGE_INTEGER)
        self.padding_side = config.get("padding_side", "right")
        self.truncation_side = config.get("truncation_side", "right")
        for side in ("padding_side", "truncation_side"):
            if getattr(self, side) not in ("left", "right"):
                raise ValueError(f"{side} must be 'left' or 'right', got {getattr(self, side)!r}")
        self.model_input_names = list(config.get("model_input_names", ["input_ids", "attention_mask"]))
        self.clean_up_tokenization_spaces = config.get("clean_up_tokenization_spaces", False)
        self.chat_template = config.get("chat_template")
        self._special = {name: config.get(name) for name in SPECIAL_TOKEN_NAMES}
        self._special.update(config.get("model_specific_tokens", {}))
        self._extra_special = list(config.get("extra_special_tokens", []))

        # tokens the config names that the tokenizer does not have (by content and flags) are added
        present = backend.get_added_tokens_decoder().values()
        have = {repr(t) for t in present}
        to_add = [t for _, t in sorted(config.get("added_tokens_decoder", {}).items()) if repr(t) not in have]
        known = {t.content for t in present} | {str(t) for t in to_add}
        named = {str(t) for t in self._special.values() if t is not None}
        for token in [t for t in self._special.values() if t is not None] + self._extra_special:
            if str(token) not in known and token not in to_add:
                to_add.append(token)
                known.add(str(token))
        added = []
        for token in to_add:
            if isinstance(token, str):
                token = tk.AddedToken(token, special=True)
            elif not token.special and token.content in named:
                token.special = True
            added.append(token)
        if added:
            backend.add_tokens(added)
        if backend.post_processor is None:
            # transformers 5 puts an identity template here (add_bos_token / add_eos_token are not read)
            backend.post_processor = tk.processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1",
                                                                      special_tokens=[])
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        backend.no_padding()
        backend.no_truncation()

    # ---- special tokens
    def _token_attr(self, name):
        token = self._special.get(name)
        return None if token is None else str(token)

    def _id_attr(self, name):
        token = self._special.get(name)
        return None if token is None else self.convert_tokens_to_ids(str(token))

    bos_token = property(lambda self: self._token_attr("bos_token"),
                         lambda self, v: self._set_special("bos_token", v))
    eos_token = property(lambda self: self._token_attr("eos_token"),
                         lambda self, v: self._set_special("eos_token", v))
    unk_token = property(lambda self: self._token_attr("unk_token"),
                         lambda self, v: self._set_special("unk_token", v))
    pad_token = property(lambda self: self._token_attr("pad_token"),
                         lambda self, v: self._set_special("pad_token", v))
    sep_token = property(lambda self: self._token_attr("sep_token"))
    cls_token = property(lambda self: self._token_attr("cls_token"))
    mask_token = property(lambda self: self._token_attr("mask_token"))
    bos_token_id = property(lambda self: self._id_attr("bos_token"))
    eos_token_id = property(lambda self: self._id_attr("eos_token"))
    unk_token_id = property(lambda self: self._id_attr("unk_token"))
    pad_token_id = property(lambda self: self._id_attr("pad_token"))
    sep_token_id = property(lambda self: self._id_attr("sep_token"))
    cls_token_id = property(lambda self: self._id_attr("cls_token"))
    mask_token_id = property(lambda self: self._id_attr("mask_token"))

    def _set_special(self, name, value):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a string or None, got {type(value).__name__}")
        self._special[name] = value

    @property
    def special_tokens_map(self):
        """The named special tokens that are set: {"bos_token": "<s>", ...}."""
        return {name: str(token) for name, token in self._special.items() if token is not None}

    @property
    def all_special_tokens(self):
        tokens = [str(t) for t in self._special.values() if t is not None] + [str(t) for t in self._extra_special]
        return list(dict.fromkeys(tokens))

    @property
    def all_special_ids(self):
        return self.convert_tokens_to_ids(self.all_special_tokens)

    @property
    def added_tokens_decoder(self):
        """{id: tokenizers.AddedToken} of the tokens added to the vocabulary."""
        return self._backend.get_added_tokens_decoder()

    # ---- vocabulary
    @property
    def backend_tokenizer(self):
        """The `tokenizers.Tokenizer` that does the work."""
        return self._backend

    @property
    def vocab_size(self):
        """The size of the base vocabulary (without added tokens)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self):
        return self._backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self):
        return self._backend.get_vocab(with_added_tokens=True)

    @functools.cached_property
    def byte_fallback_ids(self):
        """The ids of the byte tokens <0x00>..<0xFF> of a byte-fallback BPE (an empty set for others)."""
        if not getattr(self._backend.model, "byte_fallback", False):
            return frozenset()
        ids = (self._backend.token_to_id(f"<0x{b:02X}>") for b in range(256))
        return frozenset(i for i in ids if i is not None)

    @property
    def skipped_ids(self):
        """The ids decode(..., skip_special_tokens=True) leaves out: the added tokens marked special."""
        return frozenset(i for i, t in self._backend.get_added_tokens_decoder().items() if t.special)

    def convert_tokens_to_ids(self, tokens):
        """A token's id (the unk token's when it has none), or the list of them for a list."""
        if isinstance(tokens, str):
            index = self._backend.token_to_id(tokens)
            if index is None and self._special.get("unk_token") is not None:
                index = self._backend.token_to_id(str(self._special["unk_token"]))
            return index
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        if isinstance(ids, (int, np.integer)):
            return self._backend.id_to_token(_check_id(ids))
        skip = set(self.all_special_ids) if skip_special_tokens else ()
        return [self._backend.id_to_token(i) for i in map(_check_id, ids) if i not in skip]

    def convert_tokens_to_string(self, tokens):
        decoder = self._backend.decoder
        return decoder.decode(list(tokens)) if decoder is not None else " ".join(tokens)

    def tokenize(self, text, add_special_tokens=False):
        """The token strings of ``text``."""
        return self._encode_batch([_check_text(text)], add_special_tokens)[0].tokens

    # ---- encoding
    def __call__(self, text, add_special_tokens=True, padding=False, truncation=None, max_length=None,
                 return_tensors=None, padding_side=None, return_attention_mask=None, **kwargs):
        """``text`` (a string, or a list of them) -> BatchEncoding(input_ids, attention_mask), a batch
        for a list. As transformers: ``padding`` True / "longest" pads to the longest row,
        "max_length" to ``max_length`` (default model_max_length); ``truncation`` True /
        "longest_first" cuts to ``max_length`` counting the special tokens, on ``truncation_side``;
        ``max_length`` alone truncates; padding goes on ``padding_side`` (default the tokenizer's);
        ``return_tensors="np"`` gives int64 arrays (a single text as a batch of one)."""
        _check_kwargs("tokenizer call", kwargs)
        batched = isinstance(text, (list, tuple))
        texts = [_check_text(t) for t in text] if batched else [_check_text(text)]
        pad, truncate, max_length = self._strategies(padding, truncation, max_length)
        if return_tensors not in (None, "np"):
            raise ValueError(f"return_tensors must be None or 'np', got {return_tensors!r}")
        side = self.padding_side if padding_side is None else padding_side
        if side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
        encodings = self._encode_batch(texts, add_special_tokens, pad, truncate, max_length, side)
        out = BatchEncoding(input_ids=[e.ids for e in encodings])
        if "token_type_ids" in self.model_input_names:
            out["token_type_ids"] = [e.type_ids for e in encodings]
        if return_attention_mask or (return_attention_mask is None and "attention_mask" in self.model_input_names):
            out["attention_mask"] = [e.attention_mask for e in encodings]
        if not self._warned_long and max_length is None and self.model_max_length < LARGE_INTEGER:
            longest = max(map(len, out["input_ids"]), default=0)
            if longest > self.model_max_length:
                self._warned_long = True   # once, as transformers
                warnings.warn(f"a sequence of {longest} tokens is longer than this model's maximum length "
                              f"({self.model_max_length})", stacklevel=2)
        if return_tensors == "np":
            for key, rows in out.items():
                if len({len(r) for r in rows}) > 1:
                    raise ValueError("cannot make an array of rows of different lengths: pass padding=True "
                                     "(and truncation=True) for a batch of equal lengths")
                out[key] = np.array(rows, dtype=np.int64).reshape(len(rows), max(map(len, rows), default=0))
        elif not batched:
            for key in out:
                out[key] = out[key][0]
        return out

    def encode(self, text, add_special_tokens=True, padding=False, truncation=None, max_length=None, **kwargs):
        """The ids of ``text``: a list of ints (a list of lists for a list of texts)."""
        _check_kwargs("encode", kwargs)
        return self(text, add_special_tokens=add_special_tokens, padding=padding, truncation=truncation,
                    max_length=max_length)["input_ids"]

    def _strategies(self, padding, truncation, max_length):
        """(pad, truncate, max_length) as transformers resolves its arguments: pad is None, "longest"
        or "max_length"; truncate a bool."""
        if max_length is not None and (type(max_length) is not int or max_length < 0):
            raise ValueError(f"max_length must be a non-negative int, got {max_length!r}")
        if max_length is not None and padding is False and truncation is None:
            truncation = True
        if padding is True or padding == "longest":
            pad = "longest"
        elif padding is False or padding is None or padding == "do_not_pad":
            pad = None
        elif padding == "max_length":
            pad = "max_length"
        else:
            raise ValueError(f"padding must be True, False, 'longest', 'max_length' or 'do_not_pad', got {padding!r}")
        if truncation is True or truncation in ("longest_first", "only_first"):
            truncate = True
        elif truncation is False or truncation is None or truncation == "do_not_truncate":
            truncate = False
        else:
            raise ValueError(f"truncation must be True, False, 'longest_first', 'only_first' or 'do_not_truncate', "
                             f"got {truncation!r}")
        if pad == "longest" and max_length is not None and not truncate:
            warnings.warn("`max_length` is ignored when `padding`=`True` and there is no truncation strategy. "
                          "To pad to max length, use `padding='max_length'`.", stacklevel=3)
        if max_length is None:
            unlimited = self.model_max_length > LARGE_INTEGER
            if pad == "max_length":
                pad, max_length = (None, None) if unlimited else (pad, self.model_max_length)
            if truncate:
                truncate, max_length = (False, max_length) if unlimited else (True, self.model_max_length)
        if pad is not None and self.pad_token_id is None:
            raise ValueError("padding needs a pad token, and this tokenizer has none: set one "
                             "(tokenizer.pad_token = tokenizer.eos_token, for example)")
        return pad, truncate, max_length

    def _encode_batch(self, texts, add_special_tokens, pad=None, truncate=False, max_length=None, side="right"):
        with self._lock:
            backend = self._backend
            try:
                if truncate:
                    backend.enable_truncation(max_length, stride=0, strategy="longest_first",
                                              direction=self.truncation_side)
                if pad is not None:
                    backend.enable_padding(direction=side, pad_id=self.pad_token_id, pad_type_id=0,
                                           pad_token=self.pad_token,
                                           length=max_length if pad == "max_length" else None)
                return backend.encode_batch(texts, add_special_tokens=bool(add_special_tokens))
            except Exception as e:   # tokenizers raises plain Exception for arguments it refuses
                raise ValueError(f"cannot encode: {e}") from None
            finally:
                backend.no_padding()
                backend.no_truncation()

    # ---- decoding
    def decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        """The text of ``token_ids`` (an int, a list or 1-D array of ints; a list of lists or a 2-D
        array gives a list of texts). Ids the vocabulary lacks decode to nothing, as in
        transformers; a negative id is a ValueError."""
        ids = token_ids.tolist() if isinstance(token_ids, np.ndarray) else token_ids
        if isinstance(ids, (list, tuple)) and ids and isinstance(ids[0], (list, tuple, np.ndarray)):
            return [self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in ids]
        if isinstance(ids, (int, np.integer)):
            ids = [ids]
        if not isinstance(ids, (list, tuple)):
            raise TypeError(f"decode takes token ids (an int, a list of ints or an array), got {type(ids).__name__}")
        text = self._backend.decode([_check_id(i) for i in ids], skip_special_tokens=bool(skip_special_tokens))
        if self._word_suffix:
            text = text.replace(self._word_suffix, " ").strip()
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        if clean and type(self._backend.model).__name__ != "BPE":   # transformers skips it for BPE
            text = clean_up_tokenization(text)
        return text

    def batch_decode(self, sequences, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        """The texts of a batch of id sequences (a list of lists, or a 2-D array)."""
        rows = sequences.tolist() if isinstance(sequences, np.ndarray) else list(sequences)
        if rows and not isinstance(rows[0], (list, tuple, np.ndarray)):
            rows = [rows]
        return [self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in rows]

    # ---- chat
    def get_chat_template(self, chat_template=None, tools=None):
        """The template text to render: ``chat_template`` itself, or the name of one of the
        tokenizer's templates, or the tokenizer's (its "tool_use" one when tools are given)."""
        templates = self.chat_template
        if isinstance(templates, dict):
            if chat_template in templates:
                return templates[chat_template]
            if chat_template is None:
                if tools is not None and "tool_use" in templates:
                    return templates["tool_use"]
                if "default" in templates:
                    return templates["default"]
                raise ValueError(f"this tokenizer has several chat templates and no default: pass chat_template= "
                                 f"one of {sorted(templates)}")
        if chat_template is None:
            if templates is None:
                raise ValueError("this tokenizer has no chat template (tokenizer_config.json has no chat_template "
                                 "and there is no chat_template.jinja): pass chat_template=")
            return templates
        return chat_template

    def apply_chat_template(self, conversation, tools=None, documents=None, chat_template=None,
                            add_generation_prompt=False, continue_final_message=False, tokenize=True,
                            padding=False, truncation=False, max_length=None, return_tensors=None, return_dict=False,
                            tokenizer_kwargs=None, **template_kwargs):
        """A conversation (a list of {"role", "content", ...} messages; a list of them for a batch)
        rendered by the chat template: the list of ids (``tokenize=True``, encoded without adding
        special tokens: the template writes them), or the string. ``add_generation_prompt`` ends
        with the header of an assistant turn; ``continue_final_message`` leaves the last message
        open. Other keyword arguments are template variables, besides the special tokens
        (bos_token, ...). ``return_dict=True`` gives the BatchEncoding."""
        template = self.get_chat_template(chat_template, tools)
        if isinstance(conversation, (list, tuple)) and not conversation:
            raise ValueError("cannot apply a chat template to an empty conversation")
        batched = isinstance(conversation, (list, tuple)) and isinstance(conversation[0], (list, tuple))
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot be used together")
        variables = {**self.special_tokens_map, **template_kwargs}
        rendered = [render_chat(template, chat, tools, documents, add_generation_prompt, continue_final_message,
                                variables) for chat in (conversation if batched else [conversation])]
        if not tokenize:
            return rendered if batched else rendered[0]
        out = self(rendered if batched else rendered[0], add_special_tokens=False, padding=padding,
                   truncation=truncation, max_length=max_length, return_tensors=return_tensors,
                   **(tokenizer_kwargs or {}))
        return out if return_dict else out["input_ids"]

    def __repr__(self):
        return (f"{type(self).__name__}(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size}, "
                f"len={len(self)}, padding_side={self.padding_side!r}, special_tokens={self.special_tokens_map})")


def _check_text(text):
    if not isinstance(text, str):
        raise TextInputError(f"text must be a string or a list of strings, got {type(text).__name__}")
    return text


def _check_id(i):
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
        raise TypeError(f"token ids must be ints, got {type(i).__name__}")
    if not 0 <= i <= _MAX_ID:
        raise ValueError(f"token id {int(i)} is out of range (0 <= id < 2**32)")
    return int(i)


class TextInputError(TypeError, ValueError):
    """Text of the wrong type: a TypeError, and a ValueError as transformers raises."""


def clean_up_tokenization(text):
    """transformers' clean-up of tokenization spaces: no space before punctuation and contractions."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


# ---- loading
class AutoTokenizer:
    """``AutoTokenizer.from_pretrained(path)``: the tokenizer of a model directory, as transformers'."""

    def __init__(self):
        raise TypeError("AutoTokenizer is made by AutoTokenizer.from_pretrained(path)")

    @classmethod
    def from_pretrained(cls, path, subfolder=None, **kwargs):
        """The tokenizer of directory ``path`` (or ``path/subfolder``): its tokenizer.json, with
        tokenizer_config.json and chat_template.jinja when present. Keyword arguments override the
        config's padding_side, truncation_side, model_max_length, clean_up_tokenization_spaces,
        chat_template and named special tokens (bos_token, ...). A missing directory or
        tokenizer.json is an OSError; a file that is not what it should be a CheckpointError (an
        OSError and a ValueError) naming it."""
        unknown = {k: v for k, v in kwargs.items() if k not in _INIT_OVERRIDES}
        _check_kwargs("AutoTokenizer.from_pretrained", unknown)
        tk = _tokenizers()
        directory = os.fspath(path)
        if subfolder:
            directory = os.path.join(directory, subfolder)
        if not os.path.isdir(directory):
            raise CheckpointError(f"{directory}: no such tokenizer directory")
        file = os.path.join(directory, TOKENIZER_FILE)
        config = _read_config(directory)
        kind = config.get("tokenizer_class")
        from_files = not os.path.exists(file)
        if from_files and not tokenizer_files.can_build(directory, kind):
            raise tokenizer_files.missing_tokenizer_error(directory, kind)
        if from_files and "added_tokens_decoder" not in config:   # transformers reads it only then
            config.update(tokenizer_files.special_map(directory))
        if "model_max_length" in kwargs and not (type(kwargs["model_max_length"]) is int
                                                 and kwargs["model_max_length"] >= 0):
            raise ValueError(f"model_max_length must be a non-negative int, got {kwargs['model_max_length']!r}")
        if "chat_template" in kwargs:
            kwargs["chat_template"] = _chat_templates(kwargs["chat_template"], "from_pretrained")
        config.update((k, _added_token(v, k, "from_pretrained") if k in SPECIAL_TOKEN_NAMES else v)
                      for k, v in kwargs.items())
        if from_files:
            backend, config = tokenizer_files.build(directory, kind, config, tk)
            tokenizer = PreTrainedTokenizer(backend, config, name_or_path=directory)
            tokenizer_files.finish(tokenizer, kind, config, tk)
            return tokenizer
        text = _read_text(file)
        try:
            backend = tk.Tokenizer.from_str(text)
        except Exception as e:
            raise CheckpointError(f"{file}: not a tokenizer the `tokenizers` library can read: {e}") from None
        defaults = dict(_CLASS_DEFAULTS.get(kind, {}))
        if kind == "LlamaTokenizer":
            if '"ByteLevel"' in text:   # a Llama 3 file under Llama 2's class name: read as it is
                defaults = {}
            else:
                _llama_pipeline(backend, config, tk)
        elif kind == "Qwen2Tokenizer":
            _qwen2_pipeline(backend, config, tk)
        defaults.update(_backend_settings(backend))   # the class's defaults < the file's < the config's
        for key, value in defaults.items():
            config.setdefault(key, value)
        tokenizer = PreTrainedTokenizer(backend, config, name_or_path=directory)
        if kind == "Qwen2Tokenizer":   # which marks every named special token special
            backend.add_tokens([tk.AddedToken(t, special=True) for t in tokenizer.all_special_tokens])
        if kind == "CLIPTokenizer" and getattr(backend.model, "end_of_word_suffix", None):
            tokenizer._word_suffix = backend.model.end_of_word_suffix
        return tokenizer


def _read_text(file):
    """A regular file's UTF-8 text (open_regular: a FIFO or device is refused before any read)."""
    try:
        with open_regular(file) as f:
            return f.read().decode("utf-8")
    except CheckpointError:
        raise
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{file}: not UTF-8 text ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read: {e.strerror or e}") from None


def _read_config(directory):
    """tokenizer_config.json (empty when absent) with its values checked: special tokens as strings
    or tokenizers.AddedToken, ``added_tokens_decoder`` as {int: AddedToken}, the chat template(s)
    of chat_template.jinja and additional_chat_templates/ in place of the config's."""
    file = os.path.join(directory, CONFIG_FILE)
    config = {}
    if os.path.exists(file):
        config = read_json_object(file, "tokenizer config")
    out = {}
    for key, value in config.items():
        if key in SPECIAL_TOKEN_NAMES:
            out[key] = _added_token(value, key, file)
        elif key == "added_tokens_decoder":
            if not isinstance(value, dict):
                raise CheckpointError(f"{file}: added_tokens_decoder must be an object, got {type(value).__name__}")
            decoder = {}
            for index, token in value.items():
                if not (isinstance(index, str) and index.isdigit() and int(index) <= _MAX_ID):
                    raise CheckpointError(f"{file}: added_tokens_decoder: bad id {index!r}")
                decoder[int(index)] = _added_token(token, f"added_tokens_decoder[{index}]", file, special=None)
                if decoder[int(index)] is None or isinstance(decoder[int(index)], str):
                    raise CheckpointError(f"{file}: added_tokens_decoder[{index}] must be an AddedToken object")
            out[key] = decoder
        elif key in ("additional_special_tokens", "extra_special_tokens") and value is not None:
            if isinstance(value, dict):
                out.setdefault("model_specific_tokens", {}).update(
                    (k, _added_token(v, k, file)) for k, v in value.items())
            elif isinstance(value, list):
                out["extra_special_tokens"] = [_added_token(v, key, file) for v in value]
            else:
                raise CheckpointError(f"{file}: {key} must be a list, got {type(value).__name__}")
        elif key.endswith("_token") and isinstance(value, (str, dict)):
            out.setdefault("model_specific_tokens", {})[key] = _added_token(value, key, file)
        elif key in ("padding_side", "truncation_side"):
            if value not in ("left", "right"):
                raise CheckpointError(f"{file}: {key} must be 'left' or 'right', got {value!r}")
            out[key] = value
        elif key == "model_max_length" and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise CheckpointError(f"{file}: model_max_length must be a non-negative number, got {value!r}")
            out[key] = int(min(value, VERY_LARGE_INTEGER * 10))
        elif key == "extra_ids" and value is not None:
            if type(value) is not int or not 0 <= value <= 100_000:
                raise CheckpointError(f"{file}: extra_ids must be an int in [0, 100000], got {value!r}")
            out[key] = value
        elif key in ("clean_up_tokenization_spaces", "split_special_tokens", "legacy", "add_prefix_space",
                     "add_bos_token", "add_eos_token"):
            if value is not None and not isinstance(value, bool):
                raise CheckpointError(f"{file}: {key} must be true or false, got {value!r}")
            if value is not None:
                out[key] = value
        elif key == "chat_template":
            out[key] = _chat_templates(value, file)
        elif key == "model_input_names":
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise CheckpointError(f"{file}: model_input_names must be a list of names")
            out[key] = value
        elif key == "tokenizer_class" and isinstance(value, str):
            out[key] = value.removesuffix("Fast")
    # the names tokens the config lists in added_tokens_decoder keep that entry's flags
    by_content = {t.content: t for t in out.get("added_tokens_decoder", {}).values()}
    for key in SPECIAL_TOKEN_NAMES:
        if isinstance(out.get(key), str) and out[key] in by_content:
            out[key] = by_content[out[key]]
    templates = {}
    template_file = os.path.join(directory, CHAT_TEMPLATE_FILE)
    if os.path.exists(template_file):
        templates["default"] = _read_text(template_file)
    extra = os.path.join(directory, CHAT_TEMPLATE_DIR)
    if os.path.isdir(extra):
        for name in sorted(os.listdir(extra)):
            if name.endswith(".jinja"):
                templates[name[:-len(".jinja")]] = _read_text(os.path.join(extra, name))
    if templates:
        out["chat_template"] = templates["default"] if list(templates) == ["default"] else templates
    return out


def _added_token(value, name, where, special=True):
    """A special token of the config: None, a string, or a tokenizers.AddedToken for an AddedToken
    dict ({"content": ..., flags}; "__type" is dropped)."""
    if value is None or isinstance(value, str):
        return value
    tk = _tokenizers()
    if isinstance(value, tk.AddedToken):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        flags = {k: v for k, v in value.items() if k in ("single_word", "lstrip", "rstrip", "normalized", "special")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise CheckpointError(f"{where}: {name}: the flags of an AddedToken must be true or false: {value!r}")
        if special is not None:
            flags.setdefault("special", special)
        return tk.AddedToken(value["content"], **flags)
    raise CheckpointError(f"{where}: {name} must be a string or an AddedToken object, got {value!r}")


def _chat_templates(value, file):
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                       and isinstance(t.get("template"), str) for t in value):
        return {t["name"]: t["template"] for t in value}
    raise CheckpointError(f"{file}: chat_template must be a string, a list of {{name, template}} objects or a "
                          "dict of them")


def _backend_settings(backend):
    """The padding side, pad token and truncation side a tokenizer.json sets, which transformers
    takes when tokenizer_config.json does not say."""
    settings = {}
    if backend.padding is not None:
        settings.update(padding_side=backend.padding["direction"], pad_token=backend.padding["pad_token"])
    if backend.truncation is not None:
        settings.update(truncation_side=backend.truncation["direction"])
    return settings


def _llama_pipeline(backend, config, tk):
    """transformers 5's LlamaTokenizer pipeline around the file's BPE: no normalizer, a Metaspace
    pre-tokenizer ("▁" before the first word only, or before each piece with ``legacy``, none
    without ``add_prefix_space``), and the decoder that undoes it."""
    prefix = config.get("add_prefix_space")
    prefix = True if prefix is None else prefix
    scheme = ("always" if config.get("legacy", False) else "first") if prefix else "never"
    backend.normalizer = None
    backend.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    steps = [tk.decoders.Replace("▁", " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
    if prefix:
        steps.append(tk.decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = tk.decoders.Sequence(steps)


# Qwen2Tokenizer's split: as Llama 3's, but digits one by one
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")


def _qwen2_pipeline(backend, config, tk):
    """transformers 5's Qwen2Tokenizer pipeline around the file's BPE: NFC, Qwen2's split regex,
    byte-level pieces (a space before the first word with ``add_prefix_space``) and decoder."""
    backend.normalizer = tk.normalizers.NFC()
    backend.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space")), use_regex=False)])
    backend.decoder = tk.decoders.ByteLevel()


# ---- streams
class IncrementalDetokenizer:
    """Text of a stream of token ids, given out as soon as it is whole.

        stream = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
        for token in generated:
            print(stream.step(token), end="")
        print(stream.finish())

    ``step(id)`` returns the text that id completes: "" while a character is still split across
    byte tokens (no replacement characters), the leading space of a sentencepiece word as decode
    gives it. The pieces (with ``finish()``, which gives what is left even if incomplete) join to
    ``tokenizer.decode(ids, skip_special_tokens)`` of all the ids; with ``prompt_ids`` (ids already
    shown, not given out again) they join to the text decode(prompt + ids) has after decode(prompt).

    Each step decodes two short windows, both from a token before the last text given out (so that
    the decoder sees the same first token in both: a sentencepiece decoder strips the first
    token's leading space) to the end and to the last text given out; the new text is the first's
    end past the second, held back while it ends in U+FFFD. A byte-fallback vocabulary (<0x00> ..
    <0xFF>) decodes a run of byte tokens as a whole (any invalid byte in it turns every byte of
    the run into U+FFFD), so text is also held back while the ids end in such a run."""

    def __init__(self, tokenizer, skip_special_tokens=False, prompt_ids=None):
        self.tokenizer = tokenizer
        self.skip_special_tokens = bool(skip_special_tokens)
        self.token_ids = [_check_id(i) for i in (prompt_ids if prompt_ids is not None else ())]
        self._bytes = tokenizer.byte_fallback_ids
        self._skipped = tokenizer.skipped_ids if skip_special_tokens else frozenset()
        self._read = len(self.token_ids)   # the ids before this are given out as text (or are the prompt)
        self._prefix = self._read          # the windows start here: a token that starts a byte run and text
        ids = self.token_ids
        while self._prefix > 0 and (self._read - self._prefix < 4 or ids[self._prefix - 1] in self._bytes
                                    or not self._decode(ids[self._prefix:self._read])):
            self._prefix -= 1

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _in_byte_run(self):
        for i in reversed(self.token_ids[self._read:]):
            if i not in self._skipped:
                return i in self._bytes
        return False

    def _new_text(self, final):
        if not final and self._in_byte_run():
            return ""
        prefix_text = self._decode(self.token_ids[self._prefix:self._read])
        text = self._decode(self.token_ids[self._prefix:])
        if len(text) <= len(prefix_text) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self.token_ids)
        return text[len(prefix_text):]

    def step(self, token_id):
        """The text that ``token_id`` completes ("" when none yet)."""
        self.token_ids.append(_check_id(token_id))
        return self._new_text(final=False)

    def extend(self, token_ids):
        """The text that ``token_ids`` complete, all together."""
        return "".join(self.step(i) for i in token_ids)

    def finish(self):
        """The text left (a character never completed shows as U+FFFD, as decode gives it)."""
        return self._new_text(final=True) if self._read < len(self.token_ids) else ""
