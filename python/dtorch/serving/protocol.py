"""The OpenAI API's request bodies as this server takes them (vLLM's protocol.py): one schema per
endpoint, a table from each field to the check of its value. A body is a JSON object from the
network: every field is checked for its type and range before anything uses it, a field the
table does not hold is refused by name (a 400, never ignored), and null stands for a field's
default, as in OpenAI's API. A few of OpenAI's fields that change nothing at the value given
(``best_of`` 1, ``logit_bias`` {}, ``tools`` [], ...) are taken at that value only."""
import math
import numbers
import reprlib

from .sampling import MAX_LOGPROBS


class RequestError(Exception):
    """A request the server refuses: the HTTP status, the message, the OpenAI error type and the
    field it is about."""

    def __init__(self, message, param=None, status=400, kind="BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self):
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


# ---- value checks: check(name, value) -> the value to use, or a RequestError naming the field --------

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def integer(low=None, high=None):
    def check(name, v):
        if not _is_int(v) or low is not None and v < low or high is not None and v > high:
            bounds = " and ".join(s for s in (f">= {low}" if low is not None else "",
                                              f"<= {high}" if high is not None else "") if s)
            raise RequestError(f"{name} must be an integer{' ' + bounds if bounds else ''}, got {_show(v)}", name)
        return v
    return check


def number(low, high=math.inf, low_open=False):
    def check(name, v):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or \
                not (v > low if low_open else v >= low) or v > high:
            interval = f"{'(' if low_open else '['}{low}, {high}{']' if math.isfinite(high) else ')'}"
            raise RequestError(f"{name} must be a finite number in {interval}, got {_show(v)}", name)
        return float(v)
    return check


def boolean(name, v):
    if not isinstance(v, bool):
        raise RequestError(f"{name} must be true or false, got {_show(v)}", name)
    return v


def string(name, v):
    if not isinstance(v, str):
        raise RequestError(f"{name} must be a string, got {_show(v)}", name)
    _check_text(name, v)
    return v


def only(*values):
    """A field taken at the listed values only (where it changes nothing here)."""
    def check(name, v):
        if not any(type(v) is type(ok) and v == ok for ok in values):
            raise RequestError(f"{name}: only {' or '.join(map(repr, values))} is supported here, got {_show(v)}", name)
        return v
    return check


def stop(name, v):
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or len(items) > 16 or not all(isinstance(s, str) and s for s in items):
        raise RequestError(f"{name} must be a non-empty string or a list of at most 16 of them, got {_show(v)}", name)
    for s in items:
        _check_text(name, s)
    return tuple(items)


def stream_options(name, v):
    if not isinstance(v, dict):
        raise RequestError(f"{name} must be an object, got {_show(v)}", name)
    return _fields(v, {"include_usage": boolean, "continuous_usage_stats": only(False)}, name + ".")


def prompt(name, v):
    """A list of prompts, each a string or a list of token ids (checked against the vocabulary later)."""
    if isinstance(v, str):
        return [_check_text(name, v)]
    if isinstance(v, list) and v:
        if all(_is_int(t) for t in v):
            return [v]
        if all(isinstance(p, str) for p in v):
            return [_check_text(f"{name}[{i}]", p) for i, p in enumerate(v)]
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in v):
            return v
    raise RequestError(f"{name} must be a string, a non-empty list of token ids, or a non-empty list of either, "
                       f"got {_show(v)}", name)


_ROLES = ("system", "developer", "user", "assistant")


def messages(name, v):
    """A list of {role, content} with content a string or a list of text parts, as a chat
    template takes them (text parts joined)."""
    if not isinstance(v, list) or not v:
        raise RequestError(f"{name} must be a non-empty list of messages, got {_show(v)}", name)
    out = []
    for i, m in enumerate(v):
        at = f"{name}[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{at} must be an object with role and content, got {_show(m)}", at)
        m = _fields(m, {"role": string, "content": _content}, at + ".")
        if m.get("role") not in _ROLES:
            raise RequestError(f"{at}.role must be one of {', '.join(_ROLES)}, got {_show(m.get('role'))}", at + ".role")
        if m.get("content") is None:
            raise RequestError(f"{at}.content is required", at + ".content")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _content(name, v):
    if isinstance(v, str):
        return _check_text(name, v)
    if isinstance(v, list):
        texts = []
        for j, part in enumerate(v):
            at = f"{name}[{j}]"
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(f"{at}: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported, got "
                                   f"{_show(part)}", at)
            texts.append(_fields(part, {"type": string, "text": string}, at + ".").get("text") or "")
        return "\n".join(texts)
    raise RequestError(f"{name} must be a string or a list of text parts, got {_show(v)}", name)


def _check_text(name, text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{name} is not text (it holds a lone surrogate)", name) from None
    return text


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 3, 40, 40, 6, 4


def _show(v):
    """A short repr of a value from the network (however long or deeply nested)."""
    return _SHORT.repr(v)


def _fields(body, schema, prefix=""):
    """The body's fields checked by ``schema`` (null: absent); an unknown field is refused by name."""
    for field in body:
        if field not in schema:
            raise RequestError(f"{prefix}{field}: this field is not supported by this server", prefix + field)
    return {field: schema[field](prefix + field, value) for field, value in body.items() if value is not None}


# ---- the endpoints ---------------------------------------------------------------------------

_SAMPLING = {
    "model": string,
    "stream": boolean,
    "stream_options": stream_options,
    "temperature": number(0.0),
    "top_p": number(0.0, 1.0, low_open=True),
    "top_k": integer(-1),
    "min_p": number(0.0, 1.0),
    "seed": integer(-2 ** 63, 2 ** 63 - 1),
    "stop": stop,
    "n": integer(1, 64),
    "presence_penalty": number(-2.0, 2.0),
    "frequency_penalty": number(-2.0, 2.0),
    "repetition_penalty": number(0.0, low_open=True),
    "user": string,
    "return_token_ids": boolean,     # vLLM's: the ids of the prompt and of each choice in the reply
    "logit_bias": only({}),
}

COMPLETIONS = dict(_SAMPLING, **{
    "prompt": prompt,
    "max_tokens": integer(1),
    "logprobs": integer(0, MAX_LOGPROBS),
    "echo": boolean,
    "best_of": only(1),
    "suffix": only(""),
})

CHAT_COMPLETIONS = dict(_SAMPLING, **{
    "messages": messages,
    "max_tokens": integer(1),
    "max_completion_tokens": integer(1),
    "logprobs": boolean,
    "top_logprobs": integer(0, MAX_LOGPROBS),
    "tools": only([]),
    "tool_choice": only("none"),
    "response_format": only({"type": "text"}),
})


def parse(body, schema, required):
    """The checked fields of a request body (a parsed JSON value) by an endpoint's schema; the
    ``required`` fields must be there."""
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    fields = _fields(body, schema)
    for name in required:
        if name not in fields:
            raise RequestError(f"{name} is required", name)
    if "stream_options" in fields and not fields.get("stream"):
        raise RequestError("stream_options: only with stream true", "stream_options")
    if fields.get("top_logprobs") and not fields.get("logprobs"):
        raise RequestError("top_logprobs: only with logprobs true", "top_logprobs")
    return fields
