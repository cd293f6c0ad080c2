"""Tokenizers from the files that come before tokenizer.json: vocab.json + merges.txt, spiece.model.

Stable Diffusion 3 and FLUX.1 repositories ship their CLIP tokenizers as vocab.json + merges.txt
and their T5 tokenizers as a sentencepiece spiece.model, often with no tokenizer.json. transformers
builds the tokenization pipeline from them by the class tokenizer_config.json names; this module
builds the same one from the `tokenizers` library's parts:
- CLIPTokenizer: byte-level BPE with the end-of-word suffix "</w>"; NFC, runs of whitespace to one
  space, lowercase; CLIP's split regex (matches kept, the rest dropped) then byte level; the
  decoder undoes the byte level, and decode turns each "</w>" into a space and strips the ends;
  the post-processor puts bos first and eos last.
- GPT2Tokenizer: byte-level BPE without a suffix (GPT-2's split), no special tokens added unless
  add_bos_token / add_eos_token say so.
- T5Tokenizer: a unigram model of spiece.model's pieces (<unk> at id 2, as T5Tokenizer fixes it),
  followed by ``extra_ids`` sentinels <extra_id_N> (N from extra_ids-1 down to 0, so <extra_id_0>
  is the last id); the model's precompiled normalization table (sentencepiece's charsmap, passed
  as it is to the `tokenizers` Precompiled normalizer, as transformers does); whitespace split and
  "▁" before each word; "</s>" appended.

spiece.model is read by a small protobuf reader here (no sentencepiece or protobuf package): the
pieces (piece, score, type), trainer_spec.model_type and normalizer_spec.precompiled_charsmap.
Every file is untrusted: a truncated or corrupt one is a CheckpointError (an OSError and a
ValueError) naming it.
"""
import math
import os
import struct

import numpy as np

from .._safetensors import CheckpointError, open_regular, read_json_object

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
SPIECE_FILE = "spiece.model"
SPECIAL_MAP_FILE = "special_tokens_map.json"
_MAX_ID = 2 ** 32 - 1
_MAX_FILE = 1 << 30

# transformers' defaults for what tokenizer_config.json does not name
CLASS_DEFAULTS = {
    "CLIPTokenizer": dict(unk_token="<|endoftext|>", bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                          pad_token="<|endoftext|>"),
    "GPT2Tokenizer": dict(unk_token="<|endoftext|>", bos_token="<|endoftext|>", eos_token="<|endoftext|>"),
    "T5Tokenizer": dict(unk_token="<unk>", eos_token="</s>", pad_token="<pad>"),
}
_FILES = {"CLIPTokenizer": (VOCAB_FILE, MERGES_FILE), "GPT2Tokenizer": (VOCAB_FILE, MERGES_FILE),
          "T5Tokenizer": (SPIECE_FILE,)}
_CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
CLIP_SUFFIX = "</w>"


def missing_tokenizer_error(directory, kind):
    """The error for a directory with no tokenizer.json and no files this module reads for ``kind``."""
    have = sorted(n for n in os.listdir(directory) if not n.startswith("."))
    if kind in _FILES:
        lack = [n for n in _FILES[kind] if not os.path.exists(os.path.join(directory, n))]
        return CheckpointError(f"{directory}: tokenizer_class {kind} needs tokenizer.json or "
                               f"{' + '.join(_FILES[kind])}; missing: {', '.join(lack)} (found: {', '.join(have)})")
    known = ", ".join(f"{k} ({' + '.join(v)})" for k, v in _FILES.items())
    return CheckpointError(f"{directory}: no tokenizer.json, and tokenizer_class {kind!r} is not one dtorch builds "
                           f"from other files: {known} (found: {', '.join(have)})")


def can_build(directory, kind):
    return kind in _FILES and all(os.path.exists(os.path.join(directory, n)) for n in _FILES[kind])


def build(directory, kind, config, tk):
    """(backend, config) of the files of ``directory`` for tokenizer_class ``kind``: the
    `tokenizers.Tokenizer` without its post-processor (``finish`` sets it once the special tokens
    have ids), and the config with the class's defaults (and T5's special tokens) merged in."""
    config = dict(config)
    for key, value in CLASS_DEFAULTS[kind].items():
        config.setdefault(key, value)
    if kind == "T5Tokenizer":
        return _t5(directory, config, tk), config
    vocab_file, merges_file = (os.path.join(directory, n) for n in (VOCAB_FILE, MERGES_FILE))
    vocab = _read_vocab(vocab_file)
    merges = _read_merges(merges_file)
    clip = kind == "CLIPTokenizer"
    suffix = CLIP_SUFFIX if clip else ""
    _check_merges_cover(vocab, merges, suffix, config, merges_file)
    options = dict(unk_token=str(config["unk_token"])) if clip and config.get("unk_token") is not None else {}
    try:
        model = tk.models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                              end_of_word_suffix=suffix, fuse_unk=False, **options)
    except Exception as e:   # a merge of tokens the vocabulary lacks
        raise CheckpointError(f"{merges_file}: does not fit {vocab_file}: {e}") from None
    backend = tk.Tokenizer(model)
    if clip:
        backend.normalizer = tk.normalizers.Sequence([
            tk.normalizers.NFC(), tk.normalizers.Replace(tk.Regex(r"\s+"), " "), tk.normalizers.Lowercase()])
        backend.pre_tokenizer = tk.pre_tokenizers.Sequence([
            tk.pre_tokenizers.Split(tk.Regex(_CLIP_SPLIT), behavior="removed", invert=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space")))
    backend.decoder = tk.decoders.ByteLevel()
    return backend, config


def finish(tokenizer, kind, config, tk):
    """Sets the post-processor of a tokenizer ``build`` made, now that its special tokens have ids."""
    backend = tokenizer.backend_tokenizer
    if kind == "CLIPTokenizer":
        if tokenizer.bos_token_id is None or tokenizer.eos_token_id is None:
            raise CheckpointError(f"{tokenizer.name_or_path}: a CLIP tokenizer needs a bos and an eos token")
        backend.post_processor = tk.processors.RobertaProcessing(
            (tokenizer.eos_token, tokenizer.eos_token_id), (tokenizer.bos_token, tokenizer.bos_token_id),
            trim_offsets=False, add_prefix_space=False)
        tokenizer._word_suffix = CLIP_SUFFIX
    elif kind == "T5Tokenizer":
        eos = tokenizer.eos_token_id
        if eos is None:
            raise CheckpointError(f"{tokenizer.name_or_path}: a T5 tokenizer needs an eos token")
        backend.post_processor = tk.processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)])
    else:
        bos = tokenizer.bos_token if config.get("add_bos_token") else None
        eos = tokenizer.eos_token if config.get("add_eos_token") else None
        single = " ".join(filter(None, [bos and f"{bos}:0", "$A:0", eos and f"{eos}:0"]))
        pair = " ".join(filter(None, [single, bos and f"{bos}:1", "$B:1", eos and f"{eos}:1"]))
        specials = [(t, tokenizer.convert_tokens_to_ids(t)) for t in dict.fromkeys(filter(None, [bos, eos]))]
        backend.post_processor = tk.processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


# ---- vocab.json + merges.txt
def _read_bytes(file):
    try:
        with open_regular(file) as f:
            data = f.read(_MAX_FILE + 1)
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read: {e.strerror or e}") from None
    if len(data) > _MAX_FILE:
        raise CheckpointError(f"{file}: larger than {_MAX_FILE} bytes")
    return data


def _read_vocab(file):
    vocab = read_json_object(file, "BPE vocabulary")
    seen = {}
    for token, index in vocab.items():
        if type(index) is not int or not 0 <= index <= _MAX_ID:
            raise CheckpointError(f"{file}: the id of {token!r} must be an int in [0, 2**32), got {index!r}")
        if index in seen:
            raise CheckpointError(f"{file}: {seen[index]!r} and {token!r} have the same id {index}")
        seen[index] = token
    return vocab


def _read_merges(file):
    """merges.txt as the `tokenizers` library reads it: a line per merge, two tokens split by one
    space; lines that start with "#version" are skipped; a CR before the newline is dropped."""
    try:
        text = _read_bytes(file).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{file}: not UTF-8 text ({e})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    merges = []
    for number, line in enumerate(lines, 1):
        line = line.removesuffix("\r")
        if line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise CheckpointError(f"{file}: line {number} is not a merge (two tokens split by a space): {line[:80]!r}")
        merges.append((parts[0], parts[1]))
    return merges


def _check_merges_cover(vocab, merges, suffix, config, merges_file):
    """A trained BPE vocabulary holds single symbols, the tokens its merges make and the special
    tokens: a token that is none of these means merges.txt lost its end (a truncated file)."""
    made = {a + b for a, b in merges}
    special = {str(config[k]) for k in config if k.endswith("_token") and config[k] is not None}
    special |= {str(t) for t in config.get("added_tokens_decoder", {}).values()}
    special |= {str(t) for t in config.get("extra_special_tokens", [])}
    lost = [t for t in vocab if t not in made and t not in special
            and len(t.removesuffix(suffix) if suffix else t) > 1]
    if lost:
        raise CheckpointError(f"{merges_file}: no merge makes {len(lost)} token(s) of {VOCAB_FILE} "
                              f"({', '.join(map(repr, lost[:5]))}): the file is truncated or not this vocabulary's")


def special_map(directory):
    """special_tokens_map.json's named tokens (AddedTokens for dicts), as transformers merges them
    into the config of a directory whose config has no added_tokens_decoder."""
    file = os.path.join(directory, SPECIAL_MAP_FILE)
    if not os.path.exists(file):
        return {}
    from .tokenization import SPECIAL_TOKEN_NAMES, _added_token
    out = {}
    for key, value in read_json_object(file, "special tokens map").items():
        if key in SPECIAL_TOKEN_NAMES:
            out[key] = _added_token(value, key, file)
    return out


# ---- spiece.model
def _varint(data, pos, file):
    value = shift = 0
    while True:
        if pos >= len(data):
            raise CheckpointError(f"{file}: truncated (a number runs past the end)")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise CheckpointError(f"{file}: corrupt (a number longer than 10 bytes)")


def _fields(data, file):
    """(field number, wire type, value) of a protobuf message: an int for varints, bytes for
    length-delimited fields and fixed-width ones."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos, file)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise CheckpointError(f"{file}: corrupt (field number 0)")
        if wire == 0:
            value, pos = _varint(data, pos, file)
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(data):
                raise CheckpointError(f"{file}: truncated (a field runs past the end)")
            value, pos = data[pos:pos + width], pos + width
        elif wire == 2:
            length, pos = _varint(data, pos, file)
            if pos + length > len(data):
                raise CheckpointError(f"{file}: truncated (a field of {length} bytes runs past the end)")
            value, pos = data[pos:pos + length], pos + length
        else:
            raise CheckpointError(f"{file}: not a sentencepiece model (protobuf wire type {wire})")
        yield number, wire, value


def _expect(wire, want, file, what):
    if wire != want:
        raise CheckpointError(f"{file}: not a sentencepiece model ({what} has protobuf wire type {wire})")


def read_spiece(file):
    """{"pieces": [(piece, score, type)], "model_type": int, "charsmap": bytes} of a sentencepiece
    ModelProto file. Types: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte."""
    data = _read_bytes(file)
    pieces, model_type, charsmap, sections = [], 1, b"", set()
    for number, wire, value in _fields(data, file):
        if number == 1:                       # repeated SentencePiece
            _expect(wire, 2, file, "a piece")
            piece, score, kind = None, 0.0, 1
            for n, w, v in _fields(value, file):
                if n == 1:
                    _expect(w, 2, file, "a piece's text")
                    try:
                        piece = v.decode("utf-8")
                    except UnicodeDecodeError:
                        raise CheckpointError(f"{file}: piece {len(pieces)} is not UTF-8") from None
                elif n == 2:
                    _expect(w, 5, file, "a piece's score")
                    score = struct.unpack("<f", v)[0]
                elif n == 3:
                    _expect(w, 0, file, "a piece's type")
                    kind = v
            if not piece:
                raise CheckpointError(f"{file}: piece {len(pieces)} has no text")
            if not math.isfinite(score) or kind not in range(1, 7):
                raise CheckpointError(f"{file}: piece {len(pieces)} ({piece!r}) has score {score} and type {kind}")
            pieces.append((piece, score, kind))
        elif number in (2, 3):                # TrainerSpec, NormalizerSpec
            _expect(wire, 2, file, "a spec")
            sections.add(number)
            for n, w, v in _fields(value, file):
                if number == 2 and n == 3:
                    _expect(w, 0, file, "model_type")
                    model_type = v
                elif number == 3 and n == 2:
                    _expect(w, 2, file, "precompiled_charsmap")
                    charsmap = v
    # sentencepiece writes the pieces, then the trainer and normalizer specs: a file cut short
    # after some pieces lacks the specs
    if not pieces or sections != {2, 3}:
        raise CheckpointError(f"{file}: not a whole sentencepiece model (pieces: {len(pieces)}, trainer spec: "
                              f"{2 in sections}, normalizer spec: {3 in sections}); truncated?")
    seen = set()
    for piece, _, _ in pieces:
        if piece in seen:
            raise CheckpointError(f"{file}: the piece {piece!r} is there twice")
        seen.add(piece)
    return {"pieces": pieces, "model_type": model_type, "charsmap": charsmap}


def check_charsmap(charsmap, file):
    """Refuses a precompiled charsmap the `tokenizers` Precompiled normalizer would index out of
    bounds on some input (it panics rather than raising). The map is a little-endian u32 byte
    size, a double-array trie of that many bytes (u32 units) and the NUL-terminated replacement
    strings; every node reachable from the root must have all 256 child slots inside the array,
    and every leaf a value that starts a replacement string."""
    if len(charsmap) < 4:
        raise CheckpointError(f"{file}: corrupt precompiled_charsmap ({len(charsmap)} bytes)")
    size = int.from_bytes(charsmap[:4], "little")
    if size % 4 or size == 0 or 4 + size > len(charsmap):
        raise CheckpointError(f"{file}: corrupt precompiled_charsmap (trie of {size} bytes in {len(charsmap)})")
    units = np.frombuffer(charsmap, dtype="<u4", count=size // 4, offset=4).astype(np.int64)
    strings = charsmap[4 + size:]
    n = len(units)
    offsets = (units >> 10) << ((units & (1 << 9)) >> 6)
    labels = units & ((1 << 31) | 0xFF)
    leaf = (units >> 8) & 1
    values = units & ((1 << 31) - 1)
    chars = np.arange(1, 256)
    stack, seen = [int(offsets[0])], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if (node | 0xFF) >= n:
            raise CheckpointError(f"{file}: corrupt precompiled_charsmap (trie node {node} of {n})")
        slots = node ^ chars
        children = slots[labels[slots] == chars]
        nxt = children ^ offsets[children]
        for child, target in zip(leaf[children], nxt):
            if child:
                if target >= n or values[target] >= len(strings) or b"\0" not in strings[values[target]:]:
                    raise CheckpointError(f"{file}: corrupt precompiled_charsmap (a leaf past the end)")
                end = strings.index(b"\0", values[target])
                try:
                    strings[values[target]:end].decode("utf-8")
                except UnicodeDecodeError:
                    raise CheckpointError(f"{file}: corrupt precompiled_charsmap (a replacement is not UTF-8)") from None
        stack.extend(int(t) for t in nxt if t < n)
        if any(t >= n for t in nxt):
            raise CheckpointError(f"{file}: corrupt precompiled_charsmap (trie node past the end)")


def _t5(directory, config, tk):
    file = os.path.join(directory, SPIECE_FILE)
    model = read_spiece(file)
    if model["model_type"] != 1:
        raise CheckpointError(f"{file}: T5Tokenizer needs a unigram sentencepiece model, this one has model_type "
                              f"{model['model_type']} (2 is BPE)")
    if len(model["pieces"]) < 3:
        raise CheckpointError(f"{file}: a T5 vocabulary has <unk> at id 2; this one has {len(model['pieces'])} pieces")
    extra_ids = config.get("extra_ids", 100)
    named = [str(t) for t in config.get("extra_special_tokens", [])]
    sentinels = [t for t in named if "<extra_id_" in t]
    if sentinels and extra_ids > 0 and extra_ids != len(sentinels):
        raise CheckpointError(f"{directory}: extra_ids is {extra_ids} but additional_special_tokens has "
                              f"{len(sentinels)} <extra_id_N> tokens")
    vocab = [(piece, score) for piece, score, _ in model["pieces"]]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(extra_ids - 1, -1, -1)]
    # control pieces (<pad>, </s>) are special tokens, then the sentinels unless the config lists them
    extra = [tk.AddedToken(p, normalized=False, special=True) for p, _, kind in model["pieces"] if kind == 3]
    if not sentinels:
        extra += [f"<extra_id_{i}>" for i in range(extra_ids)]
    config["extra_special_tokens"] = list(config.get("extra_special_tokens", [])) + extra
    if model["charsmap"]:
        check_charsmap(model["charsmap"], file)
    try:
        backend = tk.Tokenizer(tk.models.Unigram(vocab, unk_id=2, byte_fallback=False))
        if model["charsmap"]:
            backend.normalizer = tk.normalizers.Precompiled(model["charsmap"])
    except Exception as e:
        raise CheckpointError(f"{file}: not a tokenizer the `tokenizers` library can build: {e}") from None
    backend.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.WhitespaceSplit(),
        tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)])
    backend.decoder = tk.decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    return backend
