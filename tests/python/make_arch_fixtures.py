"""Writes the fixtures of test_architectures.py with HF transformers (not part of the default test run;
run it with a Python that has transformers and torch, from this directory):

    /path/to/venv/bin/python make_arch_fixtures.py

For each tiny architecture below, fixtures/<name>/ gets what transformers' save_pretrained writes
(config.json, model.safetensors) and expected.npz: fixed input ids with left padding (input_ids,
attention_mask), transformers' logits for them, and the tokens of transformers' greedy ``generate``
(max_new_tokens new ones after the prompt). The weights are drawn at scales that keep activations
of order 1 (transformers' own init, std 0.02, makes nearly uniform logits whose argmax is noise),
with biases large enough to matter; the script checks that every greedy choice wins by a clear
margin, so the tokens do not depend on rounding.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = dict(vocab_size=48, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rope_parameters=dict(rope_type="default",
                                                                                      rope_theta=10000.0),
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
# name -> (config class, model class, config fields beside SHAPE)
ARCHS = {
    # every layer sees the last 5 positions: the prompt (8) and generation (16 in all) run past it
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=5)),
    # q/k/v biases, no window
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    # a window of 4 on the layers from max_window_layers (1) on: layer 0 full, layer 1 sliding
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=4,
                                                             max_window_layers=1)),
}
PROMPT = 8
NEW_TOKENS = 8
MARGIN = 2e-3   # the least gap between the best and the second logit of a greedy choice, relative to the
               # largest logit (float32 runs differ by about 1e-6)


def randomize(model, seed):
    """Weights of order 1: matrices N(0, 1/fan_in), the embedding N(0, 1), norms 1 + N(0, 0.1^2),
    biases N(0, 0.3^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.3 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)


def inputs(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, SHAPE["vocab_size"], (2, PROMPT))
    mask = np.ones((2, PROMPT), np.int64)
    mask[1, :3] = 0           # row 1: left padding
    ids[1, :3] = 0
    return ids, mask


def write(name, seed):
    config_cls, model_cls, fields = ARCHS[name]
    config = getattr(transformers, config_cls)(**SHAPE, **fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    randomize(model, seed)
    ids, mask = inputs(seed)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
        out = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False,
                             max_new_tokens=NEW_TOKENS, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
    steps = np.stack([s.numpy() for s in out.logits], axis=1)            # (B, NEW_TOKENS, V)
    top2 = np.sort(steps, axis=-1)[..., -2:]
    gap = float(((top2[..., 1] - top2[..., 0]) / np.abs(steps).max(-1)).min())
    if gap < MARGIN:
        return False
    directory = os.path.join(HERE, "fixtures", name)
    model.save_pretrained(directory)
    np.savez(os.path.join(directory, "expected.npz"), input_ids=ids, attention_mask=mask,
             logits=logits.astype(np.float32), generated=out.sequences.numpy()[:, PROMPT:])
    with open(os.path.join(directory, "config.json")) as f:
        saved = json.load(f)
    print(f"{name}: {saved['architectures']} {saved['model_type']}, greedy margin {gap:.3f}, "
          f"{sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))} bytes, seed {seed}")
    return True


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for n, name in enumerate(sys.argv[1:] or ARCHS):
        seed = 100 * (n + 1)   # the first seed from here whose greedy choices all win clearly
        while not write(name, seed):
            seed += 1


if __name__ == "__main__":
    main()
