"""Writes the tokenizer fixtures of test_tokenizer.py: small tokenizers trained here with the
`tokenizers` library, saved as model directories are (tokenizer.json + tokenizer_config.json),
and what transformers' AutoTokenizer makes of them (ids, padding, decodes, chat-template strings
and ids, special token ids) in expected.json beside each.

Not part of the default run (its name does not start with test_): it needs transformers, which
DTorch does not. The files it writes are committed; rerun it from tests/python only to change them:

    /work/refvenv/bin/python make_text_fixtures.py      # a Python with transformers, tokenizers, jinja2

Training breaks some ties in an order that changes from run to run (the sentencepiece-style
alphabet), so a rerun may renumber tokens: each directory's three files go together.

Four directories under fixtures/tokenizers/:
- bytelevel: a GPT-2 / Llama 3 style byte-level BPE (Llama 3's split regex, ByteLevel pre-tokenizer
  and decoder, a TemplateProcessing post-processor that adds <|begin_of_text|>), special tokens at
  the end of the vocabulary as Llama 3 has them, a Llama-3 chat template, padding on the left.
- qwen2: a byte-level BPE under tokenizer_class Qwen2Tokenizer with Qwen2-Instruct's config (no
  bos, ChatML tokens), which transformers 5 loads with Qwen2's own normalizer (NFC) and split
  regex in place of the file's.
- spm: a sentencepiece-style BPE with byte fallback <0x00>..<0xFF>, written as Llama 2's
  tokenizer.json is (a normalizer that prefixes "▁" and turns spaces into "▁"; the
  Replace/ByteFallback/Fuse/Strip decoder; a TemplateProcessing that adds <s>), tokenizer_class
  LlamaTokenizer (which transformers 5 loads with its own pre-tokenizer in place of the normalizer,
  and its own padding side, left), ChatML tokens and a ChatML chat template.
- spm_bare: the same kind of vocabulary written as newer files are (a Metaspace pre-tokenizer that
  prefixes the first word only), no post-processor, add_bos_token and add_eos_token in
  tokenizer_config.json (which transformers 5 ignores beside a tokenizer.json), special tokens
  written as AddedToken dicts, a pad token the vocabulary lacks (which loading adds), a
  non-special added token, clean_up_tokenization_spaces (which transformers skips for BPE).
The vocabularies are small (a few hundred entries) so that most words, and every CJK character
and emoji, split over several tokens, many of them in the middle of a UTF-8 character.
"""
import json
import os
import shutil

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "tokenizers")

CORPUS = """\
The quick brown fox jumps over the lazy dog. A tokenizer turns text into numbers, and back again.
Once upon a time, there was a little model that wanted to talk. It read every book in the library,
learned the words people use, and then it answered questions: what is the weather like today?
Numbers such as 3.14159, 2024, 1,000,000 and 42 appear in text too; so do e-mail addresses, URLs and
code like `def f(x): return x * 2`. Don't forget contractions: it's, we're, they've, I'm, you'll.
Café, crème brûlée, déjà vu, naïve, façade, señor, jalapeño, Ærøskøbing, Zürich, Straße, Øresund.
Ελληνικά γράμματα, русский текст, العربية, עברית, हिन्दी, ภาษาไทย, 한국어 문장입니다.
日本語の文章です。東京は大きな都市です。中文句子：我们今天去公园散步。天气很好。
Emoji: 😀 😂 🎉 👍🏽 ❤️ 🇫🇷 🇯🇵 👩‍💻 🚀 — and symbols: ©, ®, ™, €, £, ¥, ∑, ∞, ≈, ≠, ±.
    Indented lines,\ttabs\tand
multiple
newlines are whitespace as well.
"""

# Texts each fixture encodes and decodes: ASCII, accents, CJK, emoji (several code points joined),
# whitespace runs, special tokens written in the text, an empty string.
TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Café déjà vu: naïve façade, señor jalapeño.",
    "日本語の文章です。中文句子。",
    "Emoji 😀🎉 👍🏽 and flags 🇫🇷🇯🇵, family 👩‍💻!",
    "  two leading spaces, a tab\there and\nnew lines\n\n",
    "ünïcödé wörds at the start",
    "한국어 문장입니다 and Ελληνικά",
    "",
    " ",
    "a",
    "Numbers 3.14159 and 1,000,000; code `x * 2`.",
    "It's what they've said, isn't it ?",
    "zzqx unseen wörds ♞♜ ꙮ",
    "cafe\u0301 and Ångström written decomposed: A\u030angstro\u0308m",
    # special and added tokens written in the text
    "<s>Hello</s> world <s> again",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "a<|user|>b <|user|> c",
]

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# ChatML as Qwen2 writes it, with the block-trimming settings at work (the newlines after block tags
# and the indentation before them are not output), tojson on a tool call (non-ASCII, no HTML escapes),
# raise_exception for a role it does not know, a namespace, loop controls.
CHATML_TEMPLATE = """\
{%- set ns = namespace(system=false) %}
{%- for message in messages %}
    {%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}
        {{- raise_exception('Unknown role: ' + message['role']) }}
    {%- endif %}
    {%- if message['role'] == 'system' %}
        {%- set ns.system = true %}
    {%- endif %}
{%- endfor %}
{%- if not ns.system %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{%- for message in messages %}
<|im_start|>{{ message['role'] }}
    {% if message['content'] is string %}
{{ message['content'] }}
    {%- else %}
        {%- for part in message['content'] %}
            {%- if part['type'] != 'text' %}{% continue %}{% endif %}
{{ part['text'] }}
        {%- endfor %}
    {%- endif %}
    {%- if message.tool_calls is defined %}
        {%- for call in message.tool_calls %}

<tool_call>{{ call | tojson }}</tool_call>
        {%- endfor %}
    {%- endif %}
<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""

CHATS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You answer in French. Réponds en français."},
     {"role": "user", "content": "  What is 2 + 2?  "},
     {"role": "assistant", "content": "Quatre. 四. 😀"},
     {"role": "user", "content": "And 日本語?"}],
    [{"role": "user", "content": [{"type": "text", "text": "Parts: "}, {"type": "image"},
                                  {"type": "text", "text": "ünïcödé"}]},
     {"role": "assistant", "content": "Calling a tool.", "name": None,
      "tool_calls": [{"name": "météo", "arguments": {"ville": "Zürich", "html": "<b>&</b>"}}]}],
    [{"role": "narrator", "content": "A role the ChatML template refuses with raise_exception."}],
    [{"role": "user", "content": "Finish my sentence."}, {"role": "assistant", "content": "Once upon a time "}],
]

# Templates given as chat_template= with template variables, tools and documents: the sandbox's
# helpers (tojson's arguments, dict, namespace, loop controls, {% generation %}, strftime_now).
EXTRA_TEMPLATES = [
    ("{% for m in messages %}{% generation %}{{ m.role | upper }}: {{ m.content }}{% endgeneration %}\n{% endfor %}"
     "{{ greeting }} {{ tools | tojson(indent=2) }} {{ documents | tojson(sort_keys=true, separators=(',', ':')) }}",
     dict(greeting="Grüß Gott", tools=[{"type": "function", "function": {"name": "f", "description": "é <&>"}}],
          documents=[{"title": "T", "text": "日本"}])),
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
     "{% set ns.n = ns.n + 1 %}{{ ns.n }}={{ m.content }};{% if ns.n >= 2 %}{% break %}{% endif %}{% endfor %}"
     "{{ dict(a=1, b=[2, 3]) | tojson }} {{ strftime_now('%Y') | length }} {{ eos_token }}{{ pad_token }}", {}),
    ("{{ messages[0].content | trim }}|{{ messages | length }}|{{ add_generation_prompt }}", {}),
]


def byte_fallback_vocab(trained, specials):
    """The trained BPE vocabulary renumbered as sentencepiece orders it: the special tokens, then the
    256 byte tokens <0x00>..<0xFF> that byte fallback needs, then the learned pieces."""
    vocab = {token: i for i, token in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for token, _ in sorted(trained.items(), key=lambda item: item[1]):
        if token not in vocab:
            vocab[token] = len(vocab)
    return vocab


def bytelevel_tokenizer(specials):
    """A byte-level BPE with Llama 3's split regex (digits in runs of up to three), the special
    tokens added after the vocabulary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([CORPUS] * 3, trainer)
    tok.add_special_tokens(specials)
    return tok


def train_bytelevel():
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|finetune_right_pad_id|>"]
    tok = bytelevel_tokenizer(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "pad_token": "<|finetune_right_pad_id|>",
        "padding_side": "left",
        "model_max_length": 24,
        "clean_up_tokenization_spaces": True,
        "chat_template": LLAMA3_TEMPLATE,
        "added_tokens_decoder": {str(tok.token_to_id(t)): added_token_entry(t) for t in specials},
    }
    return tok, config


def train_qwen2():
    """Qwen2-Instruct's special tokens and config (no bos, no unk: Qwen2Tokenizer's defaults fill
    unk), its ChatML template; the file keeps Llama 3's regex and no NFC normalizer, which
    Qwen2Tokenizer replaces with its own (digits one by one, NFC)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = bytelevel_tokenizer(specials)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 40,
        "split_special_tokens": False,
        "errors": "replace",
        "chat_template": CHATML_TEMPLATE,
        "added_tokens_decoder": {str(tok.token_to_id(t)): added_token_entry(t) for t in specials},
    }
    return tok, config


def spm_tokenizer(legacy):
    """A sentencepiece-style BPE: with legacy, written as Llama 2's tokenizer.json is (a normalizer that
    prefixes "▁" and turns spaces into "▁", no pre-tokenizer); else as newer files are (a Metaspace
    pre-tokenizer that prefixes the first word only)."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    # few characters in the alphabet: anything else (accents, CJK, emoji) falls back to bytes
    trainer = trainers.BpeTrainer(vocab_size=200, limit_alphabet=60, show_progress=False)
    tok.train_from_iterator([CORPUS] * 3, trainer)
    specials = ["<unk>", "<s>", "</s>"]
    trained = json.loads(tok.to_str())
    trained["model"]["vocab"] = byte_fallback_vocab(trained["model"]["vocab"], specials)
    trained["added_tokens"] = [dict(id=i, **added_token_entry(t)) for i, t in enumerate(specials)]
    if legacy:
        trained["pre_tokenizer"] = None
        trained["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    return Tokenizer.from_str(json.dumps(trained))


def train_spm():
    tok = spm_tokenizer(legacy=True)
    chatml = ["<|im_start|>", "<|im_end|>"]
    tok.add_special_tokens(chatml)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", 1)])
    config = {   # no padding_side: LlamaTokenizer's own (left)
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "pad_token": "</s>",
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": CHATML_TEMPLATE,
        "added_tokens_decoder": {str(tok.token_to_id(t)): added_token_entry(t)
                                 for t in ["<unk>", "<s>", "</s>"] + chatml},
    }
    return tok, config


def train_spm_bare():
    tok = spm_tokenizer(legacy=False)
    tok.add_tokens(["<|user|>"])   # an added token that is not special: kept by skip_special_tokens
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": added_token_dict("<s>", True),
        "eos_token": added_token_dict("</s>", True),
        "unk_token": {"__type": "AddedToken", "content": "<unk>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False},
        "pad_token": "<pad>",
        "add_bos_token": True,
        "add_eos_token": True,
        "clean_up_tokenization_spaces": True,
        "model_max_length": 1000000000000000019884624838656,
        "chat_template": "{% for m in messages %}{{ bos_token }}<|user|>{{ m['content'] }}{{ eos_token }}{% endfor %}",
        "added_tokens_decoder": {str(i): added_token_entry(t) for i, t in enumerate(["<unk>", "<s>", "</s>"])},
    }
    return tok, config


def added_token_dict(content, special):
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}


def added_token_entry(content):
    """An entry of tokenizer_config.json's added_tokens_decoder, as save_pretrained writes it."""
    entry = added_token_dict(content, True)
    entry.pop("__type")
    return entry


def expected_outputs(path):
    """What transformers' AutoTokenizer gives on the directory: the reference test_tokenizer.py checks."""
    tok = AutoTokenizer.from_pretrained(path)
    out = {
        "class": type(tok).__name__,
        "transformers_version": __import__("transformers").__version__,
        "special": {name: getattr(tok, name) for name in (
            "bos_token", "eos_token", "pad_token", "unk_token", "bos_token_id", "eos_token_id", "pad_token_id",
            "unk_token_id", "model_max_length", "padding_side", "all_special_ids")},
        "len": len(tok),
        "vocab_size": tok.vocab_size,
        "texts": TEXTS,
        "encode": [tok.encode(t) for t in TEXTS],
        "encode_plain": [tok.encode(t, add_special_tokens=False) for t in TEXTS],
        "call_single": {k: list(v) for k, v in tok(TEXTS[2]).items()},
        "decode": [], "decode_skip": [],
        "batches": [],
        "chats": CHATS,
        "chat": [],
    }
    special_ids = sorted(set(tok.all_special_ids) | set(tok.added_tokens_decoder))
    for ids in out["encode"]:
        # the text's ids with special tokens around and among them
        ids = list(special_ids[:2]) + ids + special_ids[2:4] + ids[:3]
        out["decode"].append({"ids": ids, "text": tok.decode(ids)})
        out["decode_skip"].append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=True)})
    batch = TEXTS[:5]
    for kwargs in (dict(padding=True), dict(padding="longest", add_special_tokens=False),
                   dict(padding="max_length", truncation=True, max_length=12),
                   dict(padding="max_length", max_length=40), dict(truncation=True, max_length=5),
                   dict(max_length=7), dict(padding=True, truncation=True), dict(truncation=True),
                   dict(padding=True, max_length=6), dict(padding="max_length", truncation=True)):
        try:
            enc = tok(batch, **kwargs)
            result = {k: [list(map(int, row)) for row in v] for k, v in enc.items()}
        except ValueError as e:
            result = {"error": type(e).__name__}
        out["batches"].append({"kwargs": kwargs, "texts": batch, "result": result})
    for chat in CHATS:
        for kwargs in (dict(add_generation_prompt=False), dict(add_generation_prompt=True),
                       dict(continue_final_message=True)):
            entry = {"chat": chat, "kwargs": kwargs}
            try:
                entry["text"] = tok.apply_chat_template(chat, tokenize=False, **kwargs)
                entry["ids"] = tok.apply_chat_template(chat, return_dict=False, **kwargs)
            except Exception as e:   # a template that raises, a message that cannot be continued
                entry = {"chat": chat, "kwargs": kwargs, "error": type(e).__name__}
            out["chat"].append(entry)
    out["extra_templates"] = []
    for template, kwargs in EXTRA_TEMPLATES:
        text = tok.apply_chat_template(CHATS[1], chat_template=template, tokenize=False, add_generation_prompt=True,
                                       **kwargs)
        out["extra_templates"].append({"template": template, "kwargs": kwargs, "text": text})
    # ids past the vocabulary decode to nothing
    ids = out["encode"][2] + [len(tok) + 7, 2 ** 31]
    out["decode_unknown"] = {"ids": ids, "text": tok.decode(ids)}
    return out


def main():
    for name, make in (("bytelevel", train_bytelevel), ("spm", train_spm), ("spm_bare", train_spm_bare),
                       ("qwen2", train_qwen2)):
        path = os.path.join(OUT, name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        tok, config = make()
        tok.save(os.path.join(path, "tokenizer.json"), pretty=False)
        with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1, ensure_ascii=False)
        expected = expected_outputs(path)
        with open(os.path.join(path, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        sizes = {f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))}
        print(name, expected["class"], sizes)


if __name__ == "__main__":
    main()
