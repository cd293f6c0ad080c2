"""AutoTokenizer on tokenizer directories without tokenizer.json, as the Hub's SD3 and FLUX.1
repositories ship them: CLIP's vocab.json + merges.txt, T5's spiece.model. Each fixture directory
(make_tokenizer_file_fixtures.py) holds what transformers 5's AutoTokenizer gave on the same
files: ids, attention masks, padding to max_length with truncation, decodes, special tokens."""
import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from dtorch.models import AutoTokenizer  # noqa: E402
from dtorch.models.tokenizer_files import read_spiece  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = os.path.join(HERE, "fixtures", "tokenizer_files")
DIRS = ["clip", "clip_pad", "clip_legacy", "gpt2", "t5", "t5_bare"]


def expected(name):
    with open(os.path.join(FILES, name, "expected.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("name", DIRS)
def test_fixture_has_no_tokenizer_json(name):
    assert not os.path.exists(os.path.join(FILES, name, "tokenizer.json"))


@pytest.mark.filterwarnings("ignore:a sequence of .* tokens is longer")
@pytest.mark.parametrize("name", DIRS)
def test_ids_masks_and_decodes_match_transformers(name):
    want = expected(name)
    tok = AutoTokenizer.from_pretrained(os.path.join(FILES, name))
    for case in want["cases"]:
        text = case["text"]
        got = tok(text)
        assert got["input_ids"] == case["ids"], text
        assert got["attention_mask"] == case["mask"], text
        assert tok.tokenize(text) == case["tokens"], text
        padded = tok(text, padding="max_length", truncation=True, max_length=77)
        assert padded["input_ids"] == case["padded_ids"], text
        assert padded["attention_mask"] == case["padded_mask"], text
        assert tok.decode(padded["input_ids"]) == case["decode"], text
        assert tok.decode(padded["input_ids"], skip_special_tokens=True) == case["decode_skip"], text
        assert tok.decode(case["ids"], skip_special_tokens=True) == case["decode_plain_skip"], text
    batch = tok([c["text"] for c in want["cases"][:4]], padding=True)
    assert batch["input_ids"] == want["batch_ids"]
    assert batch["attention_mask"] == want["batch_mask"]


@pytest.mark.parametrize("name", DIRS)
def test_special_tokens_and_sizes_match_transformers(name):
    want = expected(name)
    tok = AutoTokenizer.from_pretrained(os.path.join(FILES, name))
    for attr, (token, index) in want["special"].items():
        assert [getattr(tok, attr), getattr(tok, attr + "_id")] == [token, index], attr
    assert len(tok) == want["len"]
    assert tok.vocab_size == want["vocab_size"]
    assert tok.model_max_length == want["model_max_length"]
    assert sorted(tok.all_special_tokens) == want["all_special_tokens"]
    got = {str(i): [t.content, t.special] for i, t in sorted(tok.added_tokens_decoder.items())}
    assert got == want["added"]


def test_clip_prompt_as_the_pipelines_encode_it():
    """A prompt padded to CLIP's 77 tokens: bos, the words, eos, then pad ids (the vocabulary's
    own "<|endoftext|>" for tokenizer/, "!" = id 0 for SD3's tokenizer_2/)."""
    for name, pad in (("clip", 809), ("clip_pad", 0)):
        tok = AutoTokenizer.from_pretrained(FILES, subfolder=name)
        out = tok(["a photo of a cat"], padding="max_length", max_length=77, truncation=True, return_tensors="np")
        ids = out["input_ids"]
        assert ids.shape == (1, 77) and ids.dtype == np.int64
        vocab = json.load(open(os.path.join(FILES, name, "vocab.json"), encoding="utf-8"))
        words = [vocab[w + "</w>"] for w in ("a", "photo", "of", "a", "cat")]
        assert ids[0, :7].tolist() == [vocab["<|startoftext|>"]] + words + [vocab["<|endoftext|>"]]
        assert (ids[0, 7:] == pad).all()
        assert out["attention_mask"][0].tolist() == [1] * 7 + [0] * 70


def test_t5_sentinels_count_down_from_the_end():
    """T5 puts <extra_id_0> at the last id and <extra_id_{n-1}> right after the pieces."""
    pieces = len(read_spiece(os.path.join(FILES, "t5", "spiece.model"))["pieces"])
    tok = AutoTokenizer.from_pretrained(os.path.join(FILES, "t5"))
    assert tok.convert_tokens_to_ids("<extra_id_0>") == pieces + 99
    assert tok.convert_tokens_to_ids("<extra_id_99>") == pieces
    assert tok("a <extra_id_0>")["input_ids"][-2:] == [pieces + 99, tok.eos_token_id]


def test_spiece_reader_reads_the_pieces_sentencepiece_wrote():
    """The pieces as sentencepiece's trainer lays them out for T5: <pad>, </s>, <unk> (control,
    control, unknown) then normal pieces with descending scores, and a charsmap."""
    model = read_spiece(os.path.join(FILES, "t5", "spiece.model"))
    assert [(p, t) for p, _, t in model["pieces"][:3]] == [("<pad>", 3), ("</s>", 3), ("<unk>", 2)]
    assert all(t == 1 for _, _, t in model["pieces"][3:])
    assert model["model_type"] == 1 and len(model["charsmap"]) > 4
    tok = AutoTokenizer.from_pretrained(os.path.join(FILES, "t5"))
    assert tok.tokenize("ﬁne ＡＢＣ") == tok.tokenize("fine ABC")   # the charsmap's rules apply


def copy_dir(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(os.path.join(FILES, name), dst)
    os.remove(dst / "expected.json")
    return dst


@pytest.mark.parametrize("cut", [1, 7, 100, 1000, 2000, 2500, 3000, -1])
def test_truncated_spiece_model_is_a_value_error_naming_it(tmp_path, cut):
    d = copy_dir(tmp_path, "t5_bare")
    data = (d / "spiece.model").read_bytes()
    (d / "spiece.model").write_bytes(data[:cut])
    with pytest.raises(ValueError, match="spiece.model"):
        AutoTokenizer.from_pretrained(d)


def test_corrupt_spiece_model_is_a_value_error_or_a_working_tokenizer(tmp_path):
    """Bytes changed anywhere: a clear error, or a tokenizer that encodes (never a panic)."""
    d = copy_dir(tmp_path, "t5_bare")
    data = (d / "spiece.model").read_bytes()
    rng = np.random.default_rng(0)
    errors = 0
    for _ in range(60):
        bad = bytearray(data)
        for pos in rng.integers(0, len(bad), size=3):
            bad[pos] = int(rng.integers(0, 256))
        (d / "spiece.model").write_bytes(bytes(bad))
        try:
            tok = AutoTokenizer.from_pretrained(d)
        except ValueError as e:
            assert "spiece.model" in str(e)
            errors += 1
            continue
        tok(["ﬁne ＡＢＣ café 東京", "".join(map(chr, range(1, 0x3100, 3)))], padding=True)
    assert errors > 0


def test_not_a_spiece_model(tmp_path):
    d = copy_dir(tmp_path, "t5_bare")
    (d / "spiece.model").write_bytes(b'{"this": "is json"}')
    with pytest.raises(ValueError, match="spiece.model"):
        AutoTokenizer.from_pretrained(d)


@pytest.mark.parametrize("how", ["cut_lines", "cut_mid_line", "blank_line", "three_tokens", "unknown_token"])
def test_bad_merges_is_a_value_error_naming_it(tmp_path, how):
    d = copy_dir(tmp_path, "clip")
    lines = (d / "merges.txt").read_text(encoding="utf-8").split("\n")
    if how == "cut_lines":
        text = "\n".join(lines[:len(lines) // 2]) + "\n"
    elif how == "cut_mid_line":
        text = "\n".join(lines[:40]) + "\n" + lines[40][:1]
    elif how == "blank_line":
        text = "\n".join(lines[:10] + [""] + lines[10:])
    elif how == "three_tokens":
        text = "\n".join(lines[:10] + ["a b c"] + lines[10:])
    else:
        text = "\n".join(lines[:10] + ["q zzzz"] + lines[10:])
    (d / "merges.txt").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="merges.txt"):
        AutoTokenizer.from_pretrained(d)


def test_bad_vocab_is_a_value_error_naming_it(tmp_path):
    d = copy_dir(tmp_path, "clip")
    text = (d / "vocab.json").read_text(encoding="utf-8")
    (d / "vocab.json").write_text(text[:len(text) // 2], encoding="utf-8")
    with pytest.raises(ValueError, match="vocab.json"):
        AutoTokenizer.from_pretrained(d)
    vocab = json.loads(text)
    vocab["a"] = vocab["b"]
    (d / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(ValueError, match="vocab.json"):
        AutoTokenizer.from_pretrained(d)


def test_missing_files_and_unknown_class_are_named(tmp_path):
    d = copy_dir(tmp_path, "clip")
    os.remove(d / "merges.txt")
    with pytest.raises(OSError, match="CLIPTokenizer.*merges.txt"):
        AutoTokenizer.from_pretrained(d)
    d = copy_dir(tmp_path, "t5_bare")
    (d / "tokenizer_config.json").write_text('{"tokenizer_class": "XLMRobertaTokenizer"}')
    with pytest.raises(ValueError, match="no tokenizer.json.*XLMRobertaTokenizer"):
        AutoTokenizer.from_pretrained(d)


def test_sd3_pipeline_fixture_with_hub_style_clip_tokenizers(tmp_path):
    """The SD3 pipeline fixture's CLIP tokenizer folders rewritten as vocab.json + merges.txt
    (from their tokenizer.json's vocabulary and merges) give the same prompt ids."""
    src = os.path.join(HERE, "fixtures", "pipelines", "sd3")
    dst = tmp_path / "sd3"
    shutil.copytree(src, dst)
    from dtorch.pipelines.prompt_encoding import token_ids
    for sub in ("tokenizer", "tokenizer_2"):
        before = AutoTokenizer.from_pretrained(dst, subfolder=sub)
        prompts = ["a photo of a cat", "An Astronaut, riding a horse!!"]
        want = token_ids(before, prompts, 77)
        state = json.load(open(dst / sub / "tokenizer.json", encoding="utf-8"))
        model = state["model"]
        assert model["type"] == "BPE" and model["end_of_word_suffix"] == "</w>"
        with open(dst / sub / "vocab.json", "w", encoding="utf-8") as f:
            json.dump(model["vocab"], f)
        with open(dst / sub / "merges.txt", "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            f.writelines(" ".join(m.split(" ") if isinstance(m, str) else m) + "\n" for m in model["merges"])
        os.remove(dst / sub / "tokenizer.json")
        after = AutoTokenizer.from_pretrained(dst, subfolder=sub)
        np.testing.assert_array_equal(token_ids(after, prompts, 77), want)


def test_clip_tokenizer_json_decodes_end_of_word_suffix_as_spaces():
    """CLIPTokenizer from a tokenizer.json decodes as transformers 5's does: "</w>" to a space,
    the ends stripped (the ids and texts as transformers gave them on this fixture)."""
    tok = AutoTokenizer.from_pretrained(os.path.join(HERE, "fixtures", "pipelines", "sd3"), subfolder="tokenizer")
    ids = tok("a photo of a cat")["input_ids"]
    assert ids == [0, 272, 378, 85, 1, 291, 272, 336, 1]
    assert tok.decode(ids) == "<|startoftext|>a phot<|endoftext|>of a cat <|endoftext|>"
    assert tok.decode(ids, skip_special_tokens=True) == "a photof a cat"
