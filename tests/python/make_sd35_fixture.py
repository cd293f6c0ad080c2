"""Writes fixtures/sd35/ for test_sd3.py with diffusers (not part of the default test run; run it with
a Python that has diffusers and torch, from this directory):

    /path/to/venv/bin/python make_sd35_fixture.py

A tiny SD3.5-medium-shaped SD3Transformer2DModel: two layers, the first with dual attention (a
second attention over the image tokens alone), q/k RMS norms on every attention. fixtures/sd35/
gets what diffusers' save_pretrained writes (config.json, diffusion_pytorch_model.safetensors) and
expected.npz: fixed inputs (two rows, an image of 3 x 5 patches, 5 text tokens) and diffusers'
output for them. The weights are drawn at order 1 (diffusers zero-initialises the modulation and
output projections, which would hide every block), so that each part changes the output.
"""
import os

import numpy as np
import torch
from diffusers import SD3Transformer2DModel

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=4,
              joint_attention_dim=12, caption_projection_dim=16, pooled_projection_dim=10, out_channels=4,
              pos_embed_max_size=8, dual_attention_layers=(0,), qk_norm="rms_norm")


def randomize(model, seed):
    """Matrices N(0, 1/fan_in) (a convolution's fan-in is its channels times its kernel), norm
    weights 1 + N(0, 0.2^2), biases N(0, 0.3^2); the position table stays as diffusers made it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith(".weight") and p.ndim == 1:
                p.copy_(1 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(noise / float(np.prod(p.shape[1:])) ** 0.5)


def main():
    out = os.path.join(HERE, "fixtures", "sd35")
    model = SD3Transformer2DModel(**CONFIG).eval()
    randomize(model, 35)
    rng = np.random.default_rng(35)
    inputs = dict(hidden_states=rng.standard_normal((2, 4, 6, 10)).astype(np.float32),
                  encoder_hidden_states=rng.standard_normal((2, 5, 12)).astype(np.float32),
                  pooled_projections=rng.standard_normal((2, 10)).astype(np.float32),
                  timestep=np.array([999.0, 3.5], np.float32))
    with torch.no_grad():
        sample = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).sample.numpy()
    model.save_pretrained(out, safe_serialization=True)
    np.savez(os.path.join(out, "expected.npz"), sample=sample, **inputs)
    print(f"wrote {out}: output std {sample.std():.3f}, range [{sample.min():.3f}, {sample.max():.3f}]")


if __name__ == "__main__":
    main()
