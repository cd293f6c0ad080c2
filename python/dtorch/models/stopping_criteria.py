"""Stop strings: when generation stops at a string, as transformers' StopStringCriteria decides it
(transformers/generation/stopping_criteria.py). On the controller, from the token ids that come
back each step.

A row stops when one of the stop strings occurs in the text of its last tokens and ends inside the
last token: "stop" stops ["st", "op"], ["sto", "pper"] and ["las", "topper"], not ["stop", "at"]
(the match must reach the token just made, so an old one never stops a row again). The text of a
token is what it adds to a text (without a tokenizer's leading-space conventions), and for
byte-level and byte-fallback vocabularies its bytes, so that a character split over tokens matches
when its last byte comes. Only the last ``max(len(stop string))`` tokens are looked at, counted in
characters or bytes as the vocabulary works, as transformers does."""
import numpy as np

_PREFIX = "abcdef"    # a text put before a token so that its own text comes out as it does mid-text


def _byte_level_alphabet():
    """The byte-level BPE alphabet (GPT-2's): each byte as one printable character, the printable
    Latin-1 bytes as themselves and the others as the characters from U+0100 on, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _matching_mode(tokenizer):
    """"byte_level", "byte_fallback" or None (text): what the tokenizer's decoder says."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return None
    if type(decoder).__name__ == "ByteLevel":
        return "byte_level"
    state = getattr(decoder, "__getstate__", lambda: None)()
    if isinstance(state, (bytes, str)):
        import json
        try:
            state = json.loads(state)
        except ValueError:
            state = None
    for mode, kind in (("byte_fallback", "ByteFallback"), ("byte_level", "ByteLevel")):
        if _has_type(state, kind):
            return mode
    return None


def _has_type(config, kind):
    if isinstance(config, dict):
        return config.get("type") == kind or any(_has_type(v, kind) for v in config.values())
    if isinstance(config, list):
        return any(_has_type(v, kind) for v in config)
    return False


class StopStringCriteria:
    """``criteria(ids)`` for one row's ids (prompt and new tokens, a 1-D sequence): whether it stops
    there. ``tokenizer``: an object with transformers' tokenizer interface (``convert_ids_to_tokens``,
    ``convert_tokens_to_string``, calling it on a text, and ``backend_tokenizer`` when it is a
    ``tokenizers`` one), as dtorch.models.AutoTokenizer and transformers' tokenizers have."""

    def __init__(self, tokenizer, stop_strings):
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        if tokenizer is None:
            raise ValueError("generate: stop_strings need the model's tokenizer: pass tokenizer=")
        for name in ("convert_ids_to_tokens", "convert_tokens_to_string"):
            if not callable(getattr(tokenizer, name, None)):
                raise TypeError(f"generate: tokenizer= must be a tokenizer with {name}(), "
                                f"got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.mode = _matching_mode(tokenizer)
        self.stops = tuple(s.encode("utf-8") if self.mode else s for s in stop_strings)
        if not all(self.stops):
            raise ValueError("generate: stop_strings must not be empty strings")
        self.window = max(len(s) for s in self.stops)
        self._bytes = _byte_level_alphabet() if self.mode == "byte_level" else None
        self._prefix = None
        self._pieces = {}

    def __call__(self, ids):
        ids = [int(t) for t in np.asarray(ids).reshape(-1)[-self.window:]]
        pieces = [self._piece(t) for t in ids]
        if pieces[-1] is None:
            return False
        # the pieces back to the nearest token without a text of its own (it breaks every match)
        start = max((i + 1 for i, p in enumerate(pieces) if p is None), default=0)
        text = pieces[start][:0].join(pieces[start:])
        last = len(text) - len(pieces[-1])
        return any(stop in text[max(0, last - len(stop) + 1):] for stop in self.stops)

    def _piece(self, token_id):
        """What token ``token_id`` adds to a text (bytes when the vocabulary is byte-based); None
        for an id the vocabulary does not hold."""
        if token_id not in self._pieces:
            self._pieces[token_id] = self._text_of(token_id)
        return self._pieces[token_id]

    def _text_of(self, token_id):
        try:
            token = self.tokenizer.convert_ids_to_tokens(token_id)
        except (IndexError, KeyError, ValueError, OverflowError, TypeError):
            return None
        if not isinstance(token, str):
            return None
        if self.mode == "byte_level" and all(c in self._bytes for c in token):
            return bytes(self._bytes[c] for c in token)
        if self.mode == "byte_fallback" and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                return bytes([int(token[3:5], 16)])
            except ValueError:
                pass
        if self._prefix is None:
            ids = self.tokenizer(_PREFIX, add_special_tokens=False)["input_ids"]
            self._prefix = list(self.tokenizer.convert_ids_to_tokens(list(ids)))
        text = self.tokenizer.convert_tokens_to_string(self._prefix + [token])
        text = text[text.index(_PREFIX) + len(_PREFIX):]
        return text.encode("utf-8") if self.mode else text
