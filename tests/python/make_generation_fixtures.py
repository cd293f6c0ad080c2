"""Writes tests/python/fixtures/generation/: a tiny random LlamaForCausalLM saved by transformers
(config.json, generation_config.json with two eos ids, model.safetensors), a byte-level BPE
tokenizer trained here on text written here (tokenizer.json, tokenizer_config.json), and
cases.json: transformers' own ``generate`` outputs for the generation arguments that
test_generation_args.py replays with dtorch.

Not part of the default run (it needs torch, transformers and tokenizers, which DTorch does not):
the files it writes are committed, and the test reads them. Rerun it from tests/python with a
Python that has them, e.g.

    /work/refvenv/bin/python make_generation_fixtures.py

Every greedy case is checked here to have a margin of at least MARGIN between the chosen token's
processed score and the next best one at every step, so that float32 rounding differences of a
few 1e-6 between two implementations cannot flip a token. The eos ids are chosen among the tokens
the model makes early, so that the eos paths (stopping, padding, min_new_tokens) are exercised.
"""
import json
import os

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "generation")
MARGIN = 1e-3
# stop strings checked against StopStringCriteria on the tokens of these texts
TEXTS = ["Grüße aus Köln! Naïve café", "the boats stayed home, and she drew maps", "東京 and Zürich",
         "Numbers: 12, 345, 6789."]
STOPS = ["ü", "Köln", "ats st", "she", "京 a", "345", "9.", "e", "xyz", "é"]

TEXT = """The river ran past the old mill, and the miller's daughter counted the boats.
Every morning she wrote their names in a small green book: Heron, Lantern, Patience, Quill.
When the water rose in spring the boats stayed home, and she drew maps of the flooded fields.
Grüße aus Köln! Naïve café owners serve crème brûlée at noon; 東京 and Zürich are far apart.
Numbers: 12, 345, 6789. Punctuation -- dashes, "quotes", (parens) and [brackets]; done.
She asked the ferryman why the river never stopped, and he said rivers only stop at the sea.
"""


def train_tokenizer(vocab_size):
    """A byte-level BPE (the kind Llama 3 and Qwen2 use) with <s>, </s> and <pad>."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def train_sentencepiece_style():
    """A BPE of Llama 2's and Mistral's kind: spaces as "▁", bytes of unknown characters as
    <0xNN> tokens (byte fallback), a decoder that strips the leading space."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)])
    tok.train_from_iterator([TEXT] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def build_model(vocab_size):
    torch.manual_seed(20240611)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                      rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.35, bos_token_id=0,
                      eos_token_id=1, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def generate(model, ids, mask=None, **kwargs):
    """transformers' generate, with its processed scores: the ids and the smallest margin between the
    chosen token and the runner-up over the steps of rows still generating."""
    with torch.no_grad():
        out = model.generate(torch.tensor(ids), attention_mask=None if mask is None else torch.tensor(mask),
                             return_dict_in_generate=True, output_scores=True, **kwargs)
    seq, P = out.sequences, len(ids[0])
    margin = float("inf")
    for step, scores in enumerate(out.scores):
        top = torch.topk(scores.float(), 2, dim=-1).values
        for row in range(seq.shape[0]):
            if seq[row, P + step] == scores[row].argmax() and torch.isfinite(top[row, 1]):
                margin = min(margin, float(top[row, 0] - top[row, 1]))
    return seq.tolist(), margin


def stop_string_checks(tokenizer, texts, stops):
    """transformers' StopStringCriteria on every prefix of a few token sequences: whether it stops
    there. Multi-byte characters split over byte-level tokens, stop strings inside one token, over
    several, running off the start of the sequence's tail, and ones that end before the last token
    (no match: the stop string must end in the final token)."""
    from transformers.generation.stopping_criteria import StopStringCriteria
    checks = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for stop in stops:
            criteria = StopStringCriteria(tokenizer, [stop])
            hits = [bool(criteria(torch.tensor([ids[:n]]), None)[0]) for n in range(1, len(ids) + 1)]
            checks.append(dict(ids=ids, stop_strings=[stop], stops_at=hits))
        criteria = StopStringCriteria(tokenizer, ["Köln", "9."])
        checks.append(dict(ids=ids, stop_strings=["Köln", "9."],
                           stops_at=[bool(criteria(torch.tensor([ids[:n]]), None)[0]) for n in range(1, len(ids) + 1)]))
    return checks


def main():
    tokenizer = train_tokenizer(300)
    V = len(tokenizer)
    model = build_model(V)
    prompts = [tokenizer.encode("The river ran"), tokenizer.encode("She wrote maps of")]
    P = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    batch = [[pad] * (P - len(p)) + p for p in prompts]
    mask = [[0] * (P - len(p)) + [1] * len(p) for p in prompts]
    square = [p[:min(len(q) for q in prompts)] for p in prompts]      # two prompts of one length

    # the free greedy continuation of each prompt, to choose eos ids among its tokens: row 0 makes
    # eos[0] at its 4th new token (and not before), row 1 makes eos[1] later, neither makes the other's
    free, _ = generate(model, square, max_new_tokens=20, eos_token_id=None, pad_token_id=pad, do_sample=False)
    Ps = len(square[0])
    made = [row[Ps:] for row in free]
    first = made[0][3]
    assert first not in made[0][:3] and first not in made[1][:8], made
    second = next(t for t in made[1][4:] if t not in made[0] and t != first and t not in made[1][:4])
    eos = [first, second]
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos)
    model.config.pad_token_id = None

    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    tokenizer.save_pretrained(OUT)
    spm = train_sentencepiece_style()
    spm.save_pretrained(os.path.join(OUT, "sentencepiece"))

    cases = []

    def case(name, inputs, attention_mask=None, sampled=False, **kwargs):
        call = dict(kwargs)
        if isinstance(call.get("generation_config"), dict):
            call["generation_config"] = GenerationConfig(**call["generation_config"])
        if "stop_strings" in call:
            call["tokenizer"] = tokenizer
        ids, margin = generate(model, inputs, attention_mask, **call)
        if not sampled:
            assert margin >= MARGIN, (name, margin)
        cases.append(dict(name=name, input_ids=inputs, attention_mask=attention_mask, kwargs=kwargs, output=ids))
        print(f"{name:40s} margin {margin:.4f}  {[r[len(inputs[0]):] for r in ids]}")

    case("defaults: eos list from generation_config, 20 new tokens", square)
    case("max_length counts the prompt", square, max_length=Ps + 6)
    case("max_new_tokens wins over max_length", square, max_length=Ps + 3, max_new_tokens=7)
    case("explicit eos_token_id=None: no eos", square, max_new_tokens=9, eos_token_id=None)
    case("explicit eos int and pad", square, max_new_tokens=9, eos_token_id=made[1][2], pad_token_id=pad)
    case("min_new_tokens blocks eos", square, max_new_tokens=10, min_new_tokens=6)
    case("min_length counts the prompt", square, max_new_tokens=10, min_length=Ps + 5)
    case("repetition_penalty > 1", square, max_new_tokens=14, repetition_penalty=1.6, eos_token_id=None)
    case("repetition_penalty < 1", square, max_new_tokens=10, repetition_penalty=0.6, eos_token_id=None)
    case("left padding with pad_token_id", batch, mask, max_new_tokens=12, pad_token_id=pad)
    case("left padding, repetition_penalty ignores the pads", batch, mask, max_new_tokens=12,
         repetition_penalty=0.5, pad_token_id=pad, eos_token_id=None)
    # padded with the token the short row makes first: counting its padding would penalize it
    first_made = generate(model, batch, mask, max_new_tokens=1, pad_token_id=pad, eos_token_id=None)[0][0][P]
    assert first_made not in prompts[0], first_made
    likely = [[first_made] * (P - len(p)) + p for p in prompts]
    case("left padding with a token the row makes, repetition_penalty", likely, mask, max_new_tokens=8,
         repetition_penalty=1.6, pad_token_id=first_made, eos_token_id=None)
    case("attention mask inferred from pad_token_id", batch, None, max_new_tokens=8, pad_token_id=pad)
    # a pad token at the end of a row: masked too, its position 0, the next ones counting on from it
    ends = [p[:Ps] for p in prompts]
    ends[1] = ends[1][:-1] + [pad]
    case("a pad token at the end of a row is masked", ends, None, max_new_tokens=6, pad_token_id=pad,
         eos_token_id=None)
    case("num_return_sequences (top_k=1 sampling)", square, sampled=True, max_new_tokens=6, do_sample=True,
         top_k=1, num_return_sequences=3)
    case("min_p=1 keeps only the best after temperature and penalty", square, sampled=True, max_new_tokens=10,
         do_sample=True, temperature=0.5, min_p=1.0, repetition_penalty=1.3, top_k=0, eos_token_id=None)
    late = made[0][6]
    assert late not in made[0][:6] and late not in made[1][:6], late
    case("generation_config object", square,
         generation_config=dict(max_new_tokens=9, repetition_penalty=1.25, eos_token_id=[late]))
    case("generation_config object with kwargs over it", square, min_new_tokens=7,
         generation_config=dict(max_new_tokens=9, eos_token_id=[late], pad_token_id=pad))
    case("generation_config max_length counts the prompt", square, generation_config=dict(max_length=Ps + 5))
    # row 1 makes "iver" inside one token, row 0 makes "MZ" over two; without eos a row that
    # matched goes on with real tokens until every row has (transformers pads only with eos)
    text = [tokenizer.decode(row) for row in made]
    assert "iver" in text[1] and "MZ" in text[0] and "iver" not in text[0] and "MZ" not in text[1], text
    case("stop_strings without eos", square, max_new_tokens=16, stop_strings=["iver", "MZ"], eos_token_id=None)
    # row 0 makes "MN" over its 2nd and 3rd tokens, before row 1 reaches its eos: padded after it
    assert "MN" in tokenizer.decode(made[0][:3]) and "MN" not in tokenizer.decode(made[1][:6]), text
    case("stop_strings with eos, padded", square, max_new_tokens=16, stop_strings=["MN", "zz"], pad_token_id=pad)

    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(dict(transformers_version=transformers.__version__, eos=eos, pad=pad, cases=cases,
                       stop_string_checks=stop_string_checks(tokenizer, TEXTS, STOPS),
                       sentencepiece_stop_string_checks=stop_string_checks(spm, TEXTS + ["price: 5€, ok"],
                                                                           STOPS + ["€", " ok"])), f)
    total = sum(os.path.getsize(os.path.join(folder, n)) for folder, _, names in os.walk(OUT) for n in names)
    print(f"eos {eos} pad {pad}; {total} bytes in {OUT}")


if __name__ == "__main__":
    main()
