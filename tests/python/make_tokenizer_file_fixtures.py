"""Writes the fixtures of test_tokenizer_files.py: tokenizer directories as the Hub's Stable
Diffusion 3 and FLUX.1 repositories ship them, with no tokenizer.json, and what transformers'
AutoTokenizer makes of them (ids and attention masks with and without padding to max_length,
decodes with and without the special tokens, special token ids) in expected.json beside each.

Not part of the default run (its name does not start with test_): it needs transformers,
tokenizers and sentencepiece, which DTorch does not. The files it writes are committed; rerun it
from tests/python only to change them:

    /work/refvenv/bin/python make_tokenizer_file_fixtures.py

Directories under fixtures/tokenizer_files/:
- clip: a byte-level BPE with CLIP's "</w>" end-of-word suffix, trained here on a few sentences,
  written as CLIP's vocab.json + merges.txt ("#version: 0.2" first), with SD3's tokenizer/
  tokenizer_config.json (added_tokens_decoder, tokenizer_class CLIPTokenizer, model_max_length 77)
  and special_tokens_map.json.
- clip_pad: the same vocabulary with SD3's tokenizer_2/ config, whose pad token is "!" (a token
  of the vocabulary, id 0 in CLIP's).
- clip_legacy: the same vocabulary with Stable Diffusion 1's config: special tokens as
  {"__type": "AddedToken", ...} dicts, no added_tokens_decoder, so that transformers reads
  special_tokens_map.json (here with a pad token the config lacks).
- gpt2: a plain GPT-2 byte-level BPE (no "</w>") under tokenizer_class GPT2Tokenizer.
- t5: a sentencepiece unigram model (spiece.model) trained here with T5's special pieces (<pad> 0,
  </s> 1, <unk> 2, no <s>) and a small normalization rule table (so the precompiled charsmap is
  a few hundred bytes, not the megabyte-sized NFKC one), with SD3's tokenizer_3/ config (100
  extra ids, added_tokens_decoder, model_max_length 512).
- t5_bare: the same spiece.model with a config that names only tokenizer_class and extra_ids 3.
"""
import json
import os
import shutil
import tempfile

import sentencepiece as spm
import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "tokenizer_files")

SENTENCES = [
    "A photo of a cat sitting on a red chair in the sun.",
    "An astronaut riding a horse on the moon, digital art, highly detailed.",
    "The quick brown fox jumps over the lazy dog; it's a classic sentence.",
    "Two dogs playing in the snow near a wooden cabin at night.",
    "A painting of a lighthouse by the sea, oil on canvas, 1890.",
    "Close-up portrait of an old man with a white beard, photograph.",
    "A bowl of ramen with eggs and green onions, food photography!",
    "City street at dusk with neon signs and rain reflections (cinematic).",
    "We'll see the mountains and the river; they're beautiful in spring.",
    "Numbers like 12, 345 and 6789 appear here too: 3.14 and 2024.",
    "Café au lait and croissants in Paris; naïve art, déjà vu.",
    "東京 の 夜景 and Kyoto temples, watercolor style.",
]

CASES = [
    "A photo of a cat",
    "An ASTRONAUT Riding a Horse!!",
    "it's   a   dog,\tin the\nsnow...",
    "  leading and trailing spaces  ",
    "café 東京 naïve déjà",
    "ﬁne ＡＢＣ fullwidth",
    "<|startoftext|>a cat<|endoftext|>",
    "",
    "zebra quokka xylophone jumping",
    " ".join(SENTENCES),
]

CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def added(content, normalized, special=True):
    return {"content": content, "lstrip": False, "normalized": normalized, "rstrip": False,
            "single_word": False, "special": special}


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=None if "cases" in value else 2, ensure_ascii=False)
        f.write("\n")


def train_bpe(suffix, size):
    """vocab (token -> id) and merges of a byte-level BPE trained on SENTENCES, with CLIP's
    normalizer and split when ``suffix`` is "</w>" (and its order: the bytes, the bytes with the
    suffix, the merges, then the special tokens), GPT-2's otherwise."""
    tok = tokenizers.Tokenizer(models.BPE(end_of_word_suffix=suffix))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if suffix:
        tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                               normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=size, initial_alphabet=alphabet, show_progress=False,
                                  **({"end_of_word_suffix": suffix} if suffix else {}))
    tok.train_from_iterator(SENTENCES * 3, trainer)
    state = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    vocab = {}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    if suffix:
        for ch in alphabet:
            vocab[ch + suffix] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    # merges whose parts the layout above lacks (a suffixed piece of a merged token) are kept as
    # the trainer made them: the parts are in its vocab, so put them in ours
    for token in sorted(state["vocab"], key=state["vocab"].get):
        vocab.setdefault(token, len(vocab))
    if suffix:
        vocab[BOS] = len(vocab)
        vocab[EOS] = len(vocab)
    else:
        vocab["<|endoftext|>"] = len(vocab)
    return vocab, merges


def write_bpe(directory, vocab, merges, config, special_map):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.writelines(f"{a} {b}\n" for a, b in merges)
    write_json(os.path.join(directory, "tokenizer_config.json"), config)
    if special_map is not None:
        write_json(os.path.join(directory, "special_tokens_map.json"), special_map)


def clip_dirs():
    vocab, merges = train_bpe("</w>", 900)
    bos, eos = vocab[BOS], vocab[EOS]
    base = {"add_prefix_space": False, "bos_token": BOS, "clean_up_tokenization_spaces": True, "do_lower_case": True,
            "eos_token": EOS, "errors": "replace", "model_max_length": 77, "pad_token": EOS,
            "tokenizer_class": "CLIPTokenizer", "unk_token": EOS}
    special_map = {"bos_token": added(BOS, True), "eos_token": added(EOS, False), "pad_token": EOS,
                   "unk_token": added(EOS, False)}
    for d in special_map.values():
        if isinstance(d, dict):
            d.pop("special")
    write_bpe(os.path.join(OUT, "clip"), vocab, merges,
              {**base, "added_tokens_decoder": {str(bos): added(BOS, True), str(eos): added(EOS, False)}}, special_map)
    pad_map = dict(special_map, pad_token="!")
    write_bpe(os.path.join(OUT, "clip_pad"), vocab, merges,
              {**base, "pad_token": "!", "added_tokens_decoder": {"0": added("!", False), str(bos): added(BOS, True),
                                                                  str(eos): added(EOS, False)}}, pad_map)
    legacy = {k: v for k, v in base.items() if k not in ("clean_up_tokenization_spaces", "pad_token")}
    for name, normalized in (("bos_token", True), ("eos_token", True), ("unk_token", True)):
        content = BOS if name == "bos_token" else EOS
        legacy[name] = {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": normalized,
                        "rstrip": False, "single_word": False}
    legacy.update(name_or_path="openai/clip-vit-large-patch14", special_tokens_map_file="./special_tokens_map.json")
    write_bpe(os.path.join(OUT, "clip_legacy"), vocab, merges, legacy, special_map)


def gpt2_dir():
    vocab, merges = train_bpe("", 600)
    config = {"add_prefix_space": False, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
              "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>",
              "pad_token": "<|endoftext|>"}
    write_bpe(os.path.join(OUT, "gpt2"), vocab, merges, config, None)


# a few NFKC-like rules: ligatures and fullwidth letters to ASCII (source and target as hex code points)
RULES = [("FB01", "66 69"), ("FB02", "66 6C"), ("3000", "20")] + \
        [(f"{0xFF21 + i:X}", f"{0x41 + i:X}") for i in range(26)] + \
        [(f"{0xFF41 + i:X}", f"{0x61 + i:X}") for i in range(26)]


def t5_dirs():
    tmp = tempfile.mkdtemp()
    try:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write("\n".join(SENTENCES * 4) + "\n")
        rules = os.path.join(tmp, "rules.tsv")
        with open(rules, "w", encoding="utf-8") as f:
            f.writelines(f"{a}\t{b}\n" for a, b in RULES)
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=os.path.join(tmp, "spiece"), model_type="unigram", vocab_size=160,
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
            normalization_rule_tsv=rules, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
        model = os.path.join(tmp, "spiece.model")
        pieces = spm.SentencePieceProcessor(model_file=model).get_piece_size()
        extra = [f"<extra_id_{i}>" for i in range(100)]
        decoder = {"0": added("<pad>", False), "1": added("</s>", False), "2": added("<unk>", False)}
        decoder.update({str(pieces + 99 - i): added(f"<extra_id_{i}>", False) for i in range(100)})
        config = {"add_prefix_space": True, "added_tokens_decoder": dict(sorted(decoder.items(), key=lambda kv: int(kv[0]))),
                  "additional_special_tokens": extra, "clean_up_tokenization_spaces": True, "eos_token": "</s>",
                  "extra_ids": 100, "legacy": True, "model_max_length": 512, "pad_token": "<pad>",
                  "sp_model_kwargs": {}, "tokenizer_class": "T5Tokenizer", "unk_token": "<unk>"}
        special_map = {"additional_special_tokens": extra, "eos_token": added("</s>", False),
                       "pad_token": added("<pad>", False), "unk_token": added("<unk>", False)}
        for d in special_map.values():
            if isinstance(d, dict):
                d.pop("special")
        for name, cfg, smap in (("t5", config, special_map),
                                ("t5_bare", {"tokenizer_class": "T5Tokenizer", "extra_ids": 3}, None)):
            directory = os.path.join(OUT, name)
            os.makedirs(directory, exist_ok=True)
            shutil.copy(model, os.path.join(directory, "spiece.model"))
            write_json(os.path.join(directory, "tokenizer_config.json"), cfg)
            if smap is not None:
                write_json(os.path.join(directory, "special_tokens_map.json"), smap)
    finally:
        shutil.rmtree(tmp)


def expect(directory):
    assert not os.path.exists(os.path.join(directory, "tokenizer.json"))
    tok = AutoTokenizer.from_pretrained(directory)
    assert not os.path.exists(os.path.join(directory, "tokenizer.json"))
    cases = []
    for text in CASES:
        plain = tok(text)
        padded = tok(text, padding="max_length", truncation=True, max_length=77)
        cases.append({
            "text": text, "ids": plain["input_ids"], "mask": plain["attention_mask"],
            "tokens": tok.tokenize(text),
            "padded_ids": padded["input_ids"], "padded_mask": padded["attention_mask"],
            "decode": tok.decode(padded["input_ids"]),
            "decode_skip": tok.decode(padded["input_ids"], skip_special_tokens=True),
            "decode_plain_skip": tok.decode(plain["input_ids"], skip_special_tokens=True),
        })
    batch = tok(CASES[:4], padding=True)
    special = {name: [getattr(tok, name), getattr(tok, name + "_id")]
               for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
    out = {"class": type(tok).__name__, "len": len(tok), "vocab_size": tok.vocab_size,
           "model_max_length": tok.model_max_length, "special": special,
           "all_special_tokens": sorted(tok.all_special_tokens),
           "added": {str(i): [t.content, t.special] for i, t in sorted(tok.added_tokens_decoder.items())},
           "batch_ids": batch["input_ids"], "batch_mask": batch["attention_mask"], "cases": cases}
    write_json(os.path.join(directory, "expected.json"), out)
    print(directory, out["class"], out["len"], {k: v for k, v in special.items()})


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    clip_dirs()
    gpt2_dir()
    t5_dirs()
    for name in sorted(os.listdir(OUT)):
        expect(os.path.join(OUT, name))


if __name__ == "__main__":
    main()
