"""dtorch.models.AutoTokenizer against what transformers' AutoTokenizer gave on the same files.

The fixtures (fixtures/tokenizers/<name>/: tokenizer.json, tokenizer_config.json, and
expected.json with transformers 5's outputs) are written by make_text_fixtures.py: a byte-level
BPE as Llama 3 ships it, a sentencepiece-style BPE with byte fallback as Llama 2 ships it (under
LlamaTokenizer), the same without post-processor and with its special tokens written as
AddedToken dicts, and a byte-level BPE under Qwen2Tokenizer. Their vocabularies are small, so that CJK characters and emoji split over several
tokens mid-character: the incremental detokenizer is checked on them against decode.
"""
import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from dtorch.models import AutoTokenizer, IncrementalDetokenizer

# the byte-level fixture's model_max_length is small on purpose (truncation=True uses it)
pytestmark = pytest.mark.filterwarnings("ignore:a sequence of .* tokens is longer")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tokenizers")
NAMES = ("bytelevel", "spm", "spm_bare", "qwen2")


def load(name):
    with open(os.path.join(FIXTURES, name, "expected.json"), encoding="utf-8") as f:
        return AutoTokenizer.from_pretrained(os.path.join(FIXTURES, name)), json.load(f)


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    return load(request.param)


def test_special_tokens_and_sizes(fixture):
    tok, expected = fixture
    for name, value in expected["special"].items():
        assert getattr(tok, name) == value, name
    assert (len(tok), tok.vocab_size) == (expected["len"], expected["vocab_size"])


def test_encode(fixture):
    tok, expected = fixture
    assert [tok.encode(t) for t in expected["texts"]] == expected["encode"]
    assert [tok.encode(t, add_special_tokens=False) for t in expected["texts"]] == expected["encode_plain"]
    assert tok(expected["texts"][2]) == expected["call_single"]
    assert tok.encode(expected["texts"]) == expected["encode"]   # a list gives a list of lists


def test_decode(fixture):
    tok, expected = fixture
    for entry in expected["decode"]:
        assert tok.decode(entry["ids"]) == entry["text"]
        assert tok.decode(np.array(entry["ids"])) == entry["text"]
    for entry in expected["decode_skip"]:
        assert tok.decode(entry["ids"], skip_special_tokens=True) == entry["text"]
    rows = [e["ids"] for e in expected["decode"]]
    assert tok.batch_decode(rows) == [e["text"] for e in expected["decode"]]
    assert tok.decode(rows) == [e["text"] for e in expected["decode"]]
    assert tok.batch_decode(rows, skip_special_tokens=True) == [e["text"] for e in expected["decode_skip"]]
    assert tok.decode(expected["decode_unknown"]["ids"]) == expected["decode_unknown"]["text"]
    assert tok.batch_decode([]) == []


def test_padding_and_truncation(fixture):
    tok, expected = fixture
    for case in expected["batches"]:
        kwargs, want = case["kwargs"], case["result"]
        if "error" in want:
            with pytest.raises(ValueError):
                tok(case["texts"], **kwargs)
            continue
        ignored = kwargs == dict(padding=True, max_length=6)   # transformers warns that max_length is ignored
        with pytest.warns(UserWarning, match="max_length") if ignored else _nothing():
            got = tok(case["texts"], **kwargs)
        assert got == want, kwargs
        assert got.input_ids is got["input_ids"]
        if len({len(row) for row in want["input_ids"]}) == 1:
            with pytest.warns(UserWarning, match="max_length") if ignored else _nothing():
                arrays = tok(case["texts"], return_tensors="np", **kwargs)
            for key in want:
                assert arrays[key].dtype == np.int64 and arrays[key].tolist() == want[key], (kwargs, key)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_padding_side_argument_and_single_text_arrays():
    tok, expected = load("bytelevel")
    assert tok.padding_side == "left"
    left = tok(expected["texts"][:2], padding=True)["input_ids"]
    right = tok(expected["texts"][:2], padding=True, padding_side="right")["input_ids"]
    for row_left, row_right, ids in zip(left, right, expected["encode"][:2]):
        pad = [tok.pad_token_id] * (len(row_left) - len(ids))
        assert row_left == pad + ids and row_right == ids + pad
    one = tok(expected["texts"][0], return_tensors="np")
    assert one["input_ids"].shape == (1, len(expected["encode"][0]))
    assert one["input_ids"][0].tolist() == expected["encode"][0]
    assert one["attention_mask"].tolist() == [[1] * len(expected["encode"][0])]


def test_chat_templates(fixture):
    tok, expected = fixture
    for case in expected["chat"]:
        if "error" in case:
            error = ValueError if case["error"] == "ValueError" else Exception
            with pytest.raises(error) as info:
                tok.apply_chat_template(case["chat"], tokenize=False, **case["kwargs"])
            assert type(info.value).__name__ == case["error"]
            continue
        assert tok.apply_chat_template(case["chat"], tokenize=False, **case["kwargs"]) == case["text"], case["kwargs"]
        assert tok.apply_chat_template(case["chat"], **case["kwargs"]) == case["ids"], case["kwargs"]
    for case in expected["extra_templates"]:
        got = tok.apply_chat_template(expected["chats"][1], chat_template=case["template"], tokenize=False,
                                      add_generation_prompt=True, **case["kwargs"])
        assert got == case["text"]


def test_chat_template_batches_and_dicts():
    tok, expected = load("spm")
    ok = [c for c in expected["chat"] if "error" not in c and c["kwargs"] == {"add_generation_prompt": True}]
    chats = [c["chat"] for c in ok]
    assert tok.apply_chat_template(chats, add_generation_prompt=True, tokenize=False) == [c["text"] for c in ok]
    assert tok.apply_chat_template(chats, add_generation_prompt=True) == [c["ids"] for c in ok]
    enc = tok.apply_chat_template(chats[:2], add_generation_prompt=True, return_dict=True, padding=True)
    longest = max(len(c["ids"]) for c in ok[:2])
    assert tok.padding_side == "left"   # LlamaTokenizer's
    assert enc["input_ids"] == [[tok.pad_token_id] * (longest - len(c["ids"])) + c["ids"] for c in ok[:2]]


def test_chat_template_files_take_priority(tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "spm_bare"), tmp_path / "t")
    (tmp_path / "t" / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!", encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(tmp_path / "t")
    assert tok.apply_chat_template([{"role": "user", "content": "hé"}], tokenize=False) == "hé!"
    (tmp_path / "t" / "additional_chat_templates").mkdir()
    (tmp_path / "t" / "additional_chat_templates" / "tool_use.jinja").write_text("tools", encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(tmp_path / "t")
    chat = [{"role": "user", "content": "x"}]
    assert tok.apply_chat_template(chat, tokenize=False) == "x!"
    assert tok.apply_chat_template(chat, tokenize=False, tools=[{"name": "f"}]) == "tools"
    assert tok.apply_chat_template(chat, tokenize=False, chat_template="tool_use") == "tools"
    # the subfolder argument (a pipeline directory keeps its tokenizer in one)
    assert AutoTokenizer.from_pretrained(tmp_path, subfolder="t").apply_chat_template(chat, tokenize=False) == "x!"


def test_sandbox():
    tok, _ = load("spm")
    chat = [{"role": "user", "content": "x"}]
    with pytest.raises(Exception, match="namespace"):
        tok.apply_chat_template(chat, tokenize=False, chat_template="{% set ns = namespace(_x=1) %}")
    with pytest.raises(Exception, match="unsafe|not safely|access"):
        tok.apply_chat_template(chat, tokenize=False, chat_template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="does not compile"):
        tok.apply_chat_template(chat, tokenize=False, chat_template="{% for %}")
    # objects that are not JSON data reach the template as a placeholder naming their type
    assert tok.apply_chat_template([{"role": "user", "content": threading.Lock()}], tokenize=False,
                                   chat_template="{{ messages[0].content }}") == "<lock>"


def test_pad_token_can_be_set():
    tok, expected = load("bytelevel")
    tok2 = AutoTokenizer.from_pretrained(os.path.join(FIXTURES, "bytelevel"), pad_token=None, padding_side="right")
    with pytest.raises(ValueError, match="pad token"):
        tok2(expected["texts"][:2], padding=True)
    tok2.pad_token = tok2.eos_token
    ids = tok2(expected["texts"][:2], padding=True)["input_ids"]
    assert ids[0] == expected["encode"][0] + [tok.eos_token_id] * (len(ids[1]) - len(expected["encode"][0]))


def test_concurrent_calls_keep_their_own_padding():
    tok, expected = load("spm")
    texts = expected["texts"][:4]
    want = {kind: tok(texts, **kwargs)["input_ids"] for kind, kwargs in
            (("longest", dict(padding=True)), ("max", dict(padding="max_length", truncation=True, max_length=9)),
             ("none", dict()))}
    failures = []

    def worker(kind, kwargs):
        for _ in range(50):
            if tok(texts, **kwargs)["input_ids"] != want[kind]:
                failures.append(kind)

    threads = [threading.Thread(target=worker, args=args) for args in
               (("longest", dict(padding=True)), ("max", dict(padding="max_length", truncation=True, max_length=9)),
                ("none", dict()))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


# ---- incremental detokenization
def stream_pieces(tok, ids, skip, prompt_ids=None):
    stream = IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_ids=prompt_ids)
    pieces = [stream.step(i) for i in ids]
    return pieces, stream.finish()


def test_the_fixtures_split_characters(fixture):
    """The detokenizer tests below can fail: decoding the fixture texts' tokens one at a time gives
    replacement characters (a character split across tokens) on every fixture."""
    tok, expected = fixture
    alone = [tok.decode([i]) for ids in expected["encode"] for i in ids]
    assert any("\ufffd" in text for text in alone)


def test_stream_joins_to_decode(fixture):
    tok, expected = fixture
    held_back = 0
    sequences = expected["encode"] + [e["ids"] for e in expected["decode"]] + \
        [c["ids"] for c in expected["chat"] if "ids" in c]
    for ids in sequences:
        for skip in (False, True):
            pieces, rest = stream_pieces(tok, ids, skip)
            text = tok.decode(ids, skip_special_tokens=skip)
            assert "".join(pieces) + rest == text, (ids, skip)
            if "\ufffd" not in text:   # else the ids end inside a character: finish() gives it
                assert not any("\ufffd" in p for p in pieces + [rest]), pieces
                # what finish() is left with: a run of byte-fallback tokens at the end, which a
                # later invalid byte would still turn into U+FFFD
                assert rest == "" or ids[-1] in tok.byte_fallback_ids | (tok.skipped_ids if skip else set())
            held_back += pieces.count("")
    assert held_back > 0


def test_stream_after_a_prompt(fixture):
    tok, expected = fixture
    for ids in expected["encode"]:
        for cut in range(1, len(ids)):
            prompt, new = ids[:cut], ids[cut:]
            pieces, rest = stream_pieces(tok, new, True, prompt_ids=prompt)
            whole, before = tok.decode(ids, skip_special_tokens=True), tok.decode(prompt, skip_special_tokens=True)
            if "\ufffd" in before:   # a prompt that ends inside a character
                continue
            assert whole.startswith(before)
            assert "".join(pieces) + rest == whole[len(before):], (prompt, new)


def test_stream_of_arbitrary_ids(fixture):
    """Any ids at all (bytes that never make a character, special tokens anywhere): the pieces and
    what finish() gives join to decode."""
    tok, _ = fixture
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(0, len(tok), size=rng.integers(1, 24)).tolist()
        for skip in (False, True):
            pieces, rest = stream_pieces(tok, ids, skip)
            assert "".join(pieces) + rest == tok.decode(ids, skip_special_tokens=skip), (ids, skip)


# ---- errors
def test_missing_and_bad_files(tmp_path):
    with pytest.raises(OSError, match="no such tokenizer directory"):
        AutoTokenizer.from_pretrained(tmp_path / "absent")
    with pytest.raises(OSError, match="tokenizer.json"):
        AutoTokenizer.from_pretrained(tmp_path)
    shutil.copytree(os.path.join(FIXTURES, "spm_bare"), tmp_path / "t")
    config = tmp_path / "t" / "tokenizer_config.json"
    good = config.read_text(encoding="utf-8")
    for bad, message in (("{", "not JSON"), ("[1]", "JSON object"), ('{"padding_side": "up"}', "padding_side"),
                         ('{"bos_token": 3}', "bos_token"), ('{"added_tokens_decoder": {"x": {}}}', "bad id"),
                         ('{"model_max_length": "big"}', "model_max_length")):
        config.write_text(bad, encoding="utf-8")
        with pytest.raises(OSError, match=message) as info:
            AutoTokenizer.from_pretrained(tmp_path / "t")
        assert isinstance(info.value, ValueError) and "tokenizer_config.json" in str(info.value)
    config.write_text(good, encoding="utf-8")
    (tmp_path / "t" / "tokenizer.json").write_text('{"model": 1}', encoding="utf-8")
    with pytest.raises(OSError, match="tokenizer.json"):
        AutoTokenizer.from_pretrained(tmp_path / "t")
    os.remove(tmp_path / "t" / "tokenizer.json")
    os.mkfifo(tmp_path / "t" / "tokenizer.json")   # refused, not waited on for a writer
    with pytest.raises(OSError, match="FIFO"):
        AutoTokenizer.from_pretrained(tmp_path / "t")


def test_bad_arguments():
    tok, expected = load("spm")
    with pytest.raises(TypeError, match="use_fast"):
        AutoTokenizer.from_pretrained(os.path.join(FIXTURES, "spm"), use_fast=True)
    for bad in (dict(model_max_length="long"), dict(padding_side="up"), dict(chat_template=3), dict(bos_token=1)):
        with pytest.raises(ValueError):
            AutoTokenizer.from_pretrained(os.path.join(FIXTURES, "spm"), **bad)
    with pytest.raises(TypeError, match="return_offsets"):
        tok("x", return_offsets=True)
    with pytest.raises(TypeError, match="max_len\\b"):
        tok.encode("x", max_len=3)
    for bad in (dict(padding="sideways"), dict(truncation="only_second"), dict(max_length=-1),
                dict(return_tensors="pt"), dict(padding_side="up")):
        with pytest.raises(ValueError):
            tok("x", **bad)
    with pytest.raises(ValueError, match="different lengths"):
        tok(["a", "a b c d"], return_tensors="np")
    assert tok([], return_tensors="np")["input_ids"].shape == (0, 0) and tok([])["input_ids"] == []
    for text in (3, None, [b"x"]):
        with pytest.raises(TypeError):
            tok(text)
    with pytest.raises(ValueError):   # transformers raises ValueError for these
        tok(3)
    for ids in ([-1], [2 ** 32], [1.5], "12"):
        with pytest.raises((ValueError, TypeError)):
            tok.decode(ids)
    with pytest.raises(ValueError, match="empty conversation"):
        tok.apply_chat_template([])
    no_template = AutoTokenizer.from_pretrained(os.path.join(FIXTURES, "spm"), chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        no_template.apply_chat_template([{"role": "user", "content": "x"}])
    # the tokenizer still works after all of it
    assert tok.encode(expected["texts"][0]) == expected["encode"][0]


def test_import_without_the_text_extra():
    """`import dtorch.models` needs neither tokenizers nor jinja2; loading a tokenizer says what to install."""
    code = ("import sys; sys.modules['tokenizers'] = None; sys.modules['jinja2'] = None\n"
            "import dtorch, dtorch.models\n"
            "try:\n"
            f"    dtorch.models.AutoTokenizer.from_pretrained({os.path.join(FIXTURES, 'spm')!r})\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install dtorch[text]" in out.stdout


# ---- examples/llama.py
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def test_llama_example_prints_text_as_it_comes(capsys):
    """The demo's printer: the prompt's text, then each new token's text once whole; all of it is
    the decode of prompt and new tokens."""
    sys.path.insert(0, EXAMPLES)
    try:
        import llama as example
    finally:
        sys.path.remove(EXAMPLES)
    tok, expected = load("spm")

    class Config:
        bos_token_id, vocab_size = tok.bos_token_id, len(tok)

    tokens = example.Tokens(os.path.join(FIXTURES, "spm"), Config)
    for ids in expected["encode"][2:6]:
        # a prompt of whole characters, as encoding text gives
        cut = next(k for k in range(3, len(ids)) if "\ufffd" not in tok.decode(ids[:k]))
        prompt, new = ids[:cut], ids[cut:] + [tok.eos_token_id]
        capsys.readouterr()
        show = tokens.printer(prompt)
        for token in new:
            show(token)
        show(None)
        assert capsys.readouterr().out == tok.decode(prompt + new, skip_special_tokens=True) + "\n"
    assert tokens.encode("Hi", chat=True) == tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                                                      add_generation_prompt=True)


WRITE_CHECKPOINT = """
import sys, dtorch
from dtorch.models import LlamaConfig, LlamaForCausalLM
dtorch.init(workers="thread")
dtorch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(vocab_size=406, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             bos_token_id=400, eos_token_id=404)).save_pretrained(sys.argv[1])
dtorch.shutdown()
"""

RUN_WITHOUT_TEXT_EXTRA = """
import runpy, sys
sys.modules["tokenizers"] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_llama_example_with_and_without_the_text_extra(tmp_path):
    """The demo on a checkpoint with a tokenizer prints text; without the text extra, ids."""
    ck = str(tmp_path / "ck")
    subprocess.run([sys.executable, "-c", WRITE_CHECKPOINT, ck], check=True, timeout=300)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, "bytelevel", name), ck)
    args = [os.path.join(EXAMPLES, "llama.py"), "--model", ck, "--mesh", "dp=1,tp=2", "--max-new-tokens", "6",
            "--prompt", "Café 日本"]
    text = subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("prompt ("))
    assert lines[at].endswith(str(AutoTokenizer.from_pretrained(ck).encode("Café 日本")))
    assert lines[at + 1].startswith("Café 日本")
    ids = subprocess.run([sys.executable, "-c", RUN_WITHOUT_TEXT_EXTRA] + args, capture_output=True, text=True,
                         timeout=300)
    assert ids.returncode == 0, ids.stderr
    lines = ids.stdout.splitlines()
    assert any("text extra is not installed" in line for line in lines)
    at = next(i for i, line in enumerate(lines) if line.startswith("prompt ("))
    assert lines[at].endswith(str([400] + [3 + b for b in "Café 日本".encode()]))
    assert all(word.isdigit() for word in lines[at + 1].split()) and lines[at + 1].split()
