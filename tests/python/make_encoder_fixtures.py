"""Writes the fixtures of test_text_encoders.py with HF transformers (not part of the default test run;
run it with a Python that has transformers, torch and tokenizers, from this directory):

    /path/to/venv/bin/python make_encoder_fixtures.py

Models: for each tiny text encoder below, fixtures/<name>/ gets what transformers' save_pretrained
writes (config.json, model.safetensors) and expected.npz: fixed input ids with padding (input_ids,
attention_mask) and transformers' outputs for them (last_hidden_state, hidden_states stacked as
(layers + 1, B, L, D), pooler_output and text_embeds where the class gives them). The weights are
drawn at scales that keep activations of order 1 (transformers' own init, std 0.02, makes nearly
constant states that a wrong layer could still match).

Tokenizers: fixtures/tokenizers/clip_bpe and fixtures/tokenizers/t5_unigram get what
transformers' CLIPTokenizer and T5Tokenizer save for vocabularies trained here by `tokenizers` on a
few sentences, and expected.json: the ids transformers gives for a few strings, alone and as a batch
with padding="max_length", truncation=True, max_length=MAX_LENGTH.
"""
import json
import os

import numpy as np
import tokenizers
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
VOCAB = 64
CLIP = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=16, projection_dim=24, bos_token_id=62, pad_token_id=1)
T5 = dict(vocab_size=VOCAB, d_model=32, d_kv=8, num_heads=4, d_ff=48, num_layers=2, relative_attention_num_buckets=8,
          relative_attention_max_distance=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
EOS = 60   # the real eos id of the CLIP fixtures that do not keep the legacy 2
# name -> (model class, config class, config fields beside the family's)
MODELS = {
    # eos_token_id 2: the pooled state is at the argmax of the ids
    "clip": ("CLIPTextModel", "CLIPTextConfig", dict(CLIP, eos_token_id=2, hidden_act="quick_gelu")),
    # a real eos id: the pooled state is at its first position (0 where a row has none)
    "clip_eos": ("CLIPTextModel", "CLIPTextConfig", dict(CLIP, eos_token_id=EOS, hidden_act="gelu")),
    "clip_proj": ("CLIPTextModelWithProjection", "CLIPTextConfig", dict(CLIP, eos_token_id=EOS,
                                                                        hidden_act="quick_gelu")),
    "t5": ("T5EncoderModel", "T5Config", dict(T5, feed_forward_proj="gated-gelu")),
    "t5_relu": ("T5EncoderModel", "T5Config", dict(T5, feed_forward_proj="relu")),
}
LENGTH = 12   # input length: past T5's max_distance (8), so the far buckets are used; within CLIP's 16


def randomize(model, seed):
    """Weights of order 1: matrices N(0, 1/fan_in), embeddings and T5's relative bias N(0, 1), norm
    weights 1 + N(0, 0.1^2), biases N(0, 0.3^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.3 * noise)
            elif "embed" in name or name == "shared.weight" or "relative_attention_bias" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)


def clip_inputs(rng, eos):
    """Rows of ids ending in eos, right-padded with the eos (as CLIP's tokenizers pad): one full row, two
    padded ones. Legacy eos 2: the eos is the largest id (63), so the argmax finds it, and no id is 2.
    A real eos (60): ids above it occur, so the argmax would not find it, a row has a second eos
    inside its tokens (the first counts) and a row has none (position 0)."""
    legacy = eos == 2
    ids = rng.integers(3, 58 if legacy else VOCAB, (4, LENGTH))
    ids[ids == eos] = eos + 1
    mask = np.ones((4, LENGTH), np.int64)
    token = 63 if legacy else eos
    ids[0, -1] = token
    for row, real in ((1, 7), (2, 4)):
        ids[row, real - 1:] = token
        mask[row, real:] = 0
    if legacy:
        ids[3, 5:] = token
        mask[3, 6:] = 0
    else:
        ids[2, 1] = eos
        ids[1, 2] = 63
        mask[3, 9:] = 0
        ids[3, 9:] = 1
    return ids, mask


def t5_inputs(rng):
    """A full row, a right-padded and a left-padded one (T5's relative positions take either)."""
    ids = rng.integers(2, VOCAB, (3, LENGTH))
    mask = np.ones((3, LENGTH), np.int64)
    mask[1, 8:] = 0
    ids[1, 8:] = 0
    mask[2, :5] = 0
    ids[2, :5] = 0
    return ids, mask


def write_model(name, seed):
    model_cls, config_cls, fields = MODELS[name]
    config = getattr(transformers, config_cls)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    randomize(model, seed)
    rng = np.random.default_rng(seed)
    ids, mask = t5_inputs(rng) if name.startswith("t5") else clip_inputs(rng, fields["eos_token_id"])
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
    expected = dict(input_ids=ids, attention_mask=mask, last_hidden_state=out.last_hidden_state.numpy(),
                    hidden_states=np.stack([h.numpy() for h in out.hidden_states]))
    for key in ("pooler_output", "text_embeds"):
        if getattr(out, key, None) is not None:
            expected[key] = getattr(out, key).numpy()
    if name.startswith("t5"):   # without a mask too: every key seen
        with torch.no_grad():
            expected["unmasked"] = model(input_ids=torch.tensor(ids)).last_hidden_state.numpy()
    directory = os.path.join(FIXTURES, name)
    model.save_pretrained(directory)
    np.savez(os.path.join(directory, "expected.npz"), **expected)
    scale = float(np.abs(expected["last_hidden_state"]).max())
    print(f"{name}: {sorted(expected)}; hidden_states {expected['hidden_states'].shape}, max |last| {scale:.3f}")


SENTENCES = [
    "a photo of a cat sitting on a red chair",
    "an astronaut riding a horse on the moon",
    "a painting of a lighthouse at sunset, oil on canvas",
    "two dogs playing in the snow!",
    "the quick brown fox jumps over the lazy dog",
    "a bowl of fruit: apples, pears and grapes",
]
TEXTS = ["a photo of a cat", "An Astronaut riding   a horse on Mars!", "", "the lazy dog jumps over the quick brown "
         "fox on the moon at sunset"]
MAX_LENGTH = 10


def clip_tokenizer():
    """A CLIP tokenizer whose BPE vocabulary and merges are trained on SENTENCES with CLIP's own
    normalizer and pre-tokenizer (the byte-level alphabet and the end-of-word suffix)."""
    base = transformers.CLIPTokenizer()
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(end_of_word_suffix="</w>", continuing_subword_prefix=""))
    bpe.normalizer = base.backend_tokenizer.normalizer
    bpe.pre_tokenizer = base.backend_tokenizer.pre_tokenizer
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, end_of_word_suffix="</w>",
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
                                             special_tokens=["<|startoftext|>", "<|endoftext|>"])
    bpe.train_from_iterator(SENTENCES, trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    return transformers.CLIPTokenizer(vocab=state["vocab"], merges=merges)


def t5_tokenizer():
    """A T5 tokenizer whose unigram vocabulary is trained on SENTENCES with T5's pre-tokenizer;
    <pad>, </s>, <unk> first, as T5's."""
    base = transformers.T5Tokenizer(extra_ids=0)
    uni = tokenizers.Tokenizer(tokenizers.models.Unigram())
    uni.pre_tokenizer = base.backend_tokenizer.pre_tokenizer
    trainer = tokenizers.trainers.UnigramTrainer(vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"],
                                                 unk_token="<unk>")
    uni.train_from_iterator(SENTENCES, trainer)
    vocab = [tuple(v) for v in json.loads(uni.to_str())["model"]["vocab"]]
    return transformers.T5Tokenizer(vocab=vocab, extra_ids=4)


def write_tokenizer(name, tok):
    directory = os.path.join(FIXTURES, "tokenizers", name)
    tok.save_pretrained(directory)
    tok = transformers.AutoTokenizer.from_pretrained(directory)   # what a pipeline loads
    batch = tok(TEXTS, padding="max_length", truncation=True, max_length=MAX_LENGTH)
    expected = dict(texts=TEXTS, max_length=MAX_LENGTH, encode=[tok.encode(t) for t in TEXTS],
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    class_name=type(tok).__name__)
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"tokenizers/{name}: {type(tok).__name__}, {len(tok)} tokens, ids {batch['input_ids'][1]}")


def main():
    for seed, name in enumerate(MODELS):
        write_model(name, seed)
    write_tokenizer("clip_bpe", clip_tokenizer())
    write_tokenizer("t5_unigram", t5_tokenizer())


if __name__ == "__main__":
    main()
