"""Chat templates rendered as transformers renders them: jinja2's sandbox with trim_blocks and
lstrip_blocks, loop controls, ``raise_exception``, ``strftime_now``, a ``tojson`` that escapes
neither HTML nor non-ASCII, ``dict``, a ``namespace`` that refuses "_" names, ``{% generation %}``
blocks; the messages (dicts, or objects with ``model_dump`` such as the openai client's) rebuilt
from plain data, keys whose value is None dropped, reasoning under the names templates read.
jinja2 is part of the optional extra ``dtorch[text]``, imported on first use."""
import datetime
import functools
import json
from collections.abc import Mapping

import numpy as np


def _jinja2():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise ImportError("chat templates need the `jinja2` package: pip install dtorch[text]") from None
    return jinja2


def render_chat(template, chat, tools, documents, add_generation_prompt, continue_final_message, variables):
    """One conversation rendered by ``template`` as transformers renders it (see apply_chat_template)."""
    messages = _plain(_messages(chat))
    messages = [_alias_reasoning(m) for m in messages]
    if tools is not None:
        if not all(isinstance(t, Mapping) for t in tools):
            raise TypeError("tools must be JSON schemas (dicts)")
    if documents is not None and not all(isinstance(d, Mapping) for d in documents):
        raise TypeError("documents must be dicts with 'title' and 'text' keys")
    tag = "CONTINUE_FINAL_MESSAGE_TAG "
    field, final = None, None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = messages[-1].get(field)
        if final is None:
            raise ValueError(f"continue_final_message: the final message has no {field!r} to continue")
        if field not in template:
            raise ValueError(f"continue_final_message: the chat template does not use the field {field!r}")
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final, block["text"] = block["text"], block["text"] + tag
                    break
            else:
                raise ValueError("continue_final_message: the final message has no text to continue")
        else:
            messages[-1][field] = final + tag
    text = _compiled(template).render(messages=messages, tools=_plain(tools), documents=_plain(documents),
                                      add_generation_prompt=add_generation_prompt, **_plain(variables))
    if continue_final_message:
        if final.strip() not in text or tag.strip() not in text:
            raise ValueError("continue_final_message: the final message is not in the rendered chat (the "
                             "template changes it)")
        at = text.rindex(tag.strip())
        text = text[:at] if text[at:at + len(tag)] == tag else text[:at].rstrip()
    return text


def _messages(chat):
    chat = getattr(chat, "messages", chat)
    out = []
    for message in chat:
        if callable(getattr(message, "model_dump", None)):
            message = message.model_dump()
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be dicts, got {type(message).__name__}")
        out.append({k: v for k, v in message.items() if v is not None})
    return out


def _alias_reasoning(message):
    """A message's reasoning under the names templates read it by, as transformers passes it."""
    reasoning = next((message[k] for k in ("reasoning_content", "thinking", "reasoning")
                      if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value):
    """``value`` rebuilt from plain JSON-like types for the sandbox; anything else becomes a
    placeholder string naming its type (templates only test whether such keys are there)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


@functools.lru_cache(maxsize=32)
def _compiled(template):
    try:
        return _environment().from_string(template)
    except Exception as e:
        if type(e).__module__.startswith("jinja2"):
            raise ValueError(f"the chat template does not compile: {e}") from e
        raise


@functools.lru_cache(maxsize=1)
def _environment():
    jinja2 = _jinja2()

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` marks the assistant's text; rendered as its body."""
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class Namespace(jinja2.utils.Namespace):
        """jinja's namespace() refusing attribute names that start with "_"."""

        def __init__(*args, **kwargs):
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    class DictMaker:
        """The template's ``dict``: dict(...) and dict.fromkeys(...) only."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args):
            return dict.fromkeys(*args)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=DictMaker(),
                       namespace=Namespace)
    return env
