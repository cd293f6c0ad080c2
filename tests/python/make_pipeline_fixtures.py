"""Writes the fixtures of test_prompt_pipelines.py with diffusers itself (not part of the default test
run; run it with a Python that has diffusers, transformers, tokenizers and torch, from this directory):

    /work/refvenv/bin/python make_pipeline_fixtures.py

Three tiny random diffusers pipeline directories under fixtures/pipelines/, each written by the
pipeline's own ``save_pretrained`` (model_index.json and one folder per component, as users have
them):
- sd3: StableDiffusion3Pipeline with two CLIPTextModelWithProjection (CLIP-L style with quick_gelu,
  CLIP-G style with gelu and "!" as its tokenizer's pad token) and a T5EncoderModel (gated-gelu, as
  T5 v1.1), their tokenizers, an SD3Transformer2DModel with qk RMS-norm, an AutoencoderKL and a
  FlowMatchEulerDiscreteScheduler (shift 3);
- sd3_no_t5: the same pipeline saved without text_encoder_3 and tokenizer_3 (null in model_index.json);
- flux: FluxPipeline with a CLIPTextModel, a T5EncoderModel, their tokenizers, a FLUX-dev style
  transformer (guidance embedding), an AutoencoderKL with a shift factor and the dynamic-shift scheduler.
The tokenizers are trained here on a few sentences (a CLIP byte-level BPE with "</w>" word ends, a
T5 Unigram), then built and saved through transformers' CLIPTokenizer and T5Tokenizer, so the files
are what those classes write. CLIP's model_max_length is 16 (77 in real checkpoints) to keep the
fixture small; long prompts are truncated to it.

Weights are redrawn at scales that keep activations of order 1 (the libraries' own inits make most
outputs nearly zero). Each directory's expected.npz holds what diffusers computes on it:
``encode_prompt`` for the cases of SD3_CASES / FLUX_CASES (prefix ``<case>.``), and the images of
2-step runs from fixed latents (``<run>.latents`` in, ``<run>.images`` out), all float32; cases.json
beside it the arguments of each (``encode``: the encode_prompt cases; ``run``, ``cfg``: the runs).
"""
import json
import os
import shutil

import numpy as np
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers, Regex
from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer, T5Config,
                          T5EncoderModel, T5Tokenizer)
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel,
                       SD3Transformer2DModel, StableDiffusion3Pipeline)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "pipelines")

CORPUS = """\
A photograph of a red fox sitting in the snow at sunset, highly detailed.
The quick brown fox jumps over the lazy dog near the river bank.
An astronaut riding a horse on the moon, digital art, trending.
A bowl of fruit on a wooden table: apples, pears, grapes and one banana.
Blurry, dark, low quality, jpeg artifacts, watermark, text, ugly.
A cat wearing sunglasses reads a newspaper in a cafe in Paris!
Mountains under a starry night sky, oil painting in the style of an old master.
"""
CLIP_MAX = 16                      # the CLIP tokenizers' model_max_length (and position embeddings)
T5_WIDTH = 24                      # T5's d_model: the transformer's joint_attention_dim


def clip_vocab():
    """A byte-level BPE with CLIP's normalizer and split, trained on CORPUS: (vocab, merges)."""
    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>", continuing_subword_prefix=""))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|"""
                                   r"""[\p{N}]|[^\s\p{L}\p{N}]+"""), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|startoftext|>", "<|endoftext|>"],
                                  initial_alphabet=alphabet + [a + "</w>" for a in alphabet],
                                  end_of_word_suffix="</w>", show_progress=False)
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    state = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    return state["vocab"], merges


def t5_vocab():
    """A Unigram trained on CORPUS with T5's pre-tokenization, renumbered as T5 orders it
    (<pad>, </s>, <unk>, then the pieces)."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    pieces = json.loads(tok.to_str())["model"]["vocab"]
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    return specials + [(p, s) for p, s in pieces if p not in ("<pad>", "</s>", "<unk>")]


def randomize(model, seed):
    """Order-1 weights: matrices and kernels N(0, 1/fan_in), embeddings N(0, 1), norm scales
    1 + N(0, 0.1^2), biases and other vectors N(0, 0.2^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * noise)
            elif p.ndim == 1:
                p.copy_(0.2 * noise)
            elif "embedding" in name or "relative_attention_bias" in name or name.endswith("shared.weight"):
                p.copy_(noise)
            else:
                p.copy_(noise / np.sqrt(np.prod(p.shape[1:])))
    return model.eval()


def clip_tokenizer(vocab, merges, **kw):
    return CLIPTokenizer(vocab=dict(vocab), merges=list(merges), model_max_length=CLIP_MAX, **kw)


def t5_tokenizer(vocab):
    return T5Tokenizer(vocab=list(vocab), extra_ids=4)


def clip_encoder(cls, tokenizer, seed, hidden, projection, act):
    config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                            projection_dim=projection, num_hidden_layers=2, num_attention_heads=2,
                            max_position_embeddings=CLIP_MAX, hidden_act=act,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    return randomize(cls(config), seed)


def t5_encoder(tokenizer, seed):
    config = T5Config(vocab_size=len(tokenizer), d_model=T5_WIDTH, d_kv=8, d_ff=32, num_layers=2, num_heads=3,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)
    return randomize(T5EncoderModel(config), seed)


def vae(seed, shift_factor):
    model = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(4, 8),
                          down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                          latent_channels=4, norm_num_groups=2, layers_per_block=1, scaling_factor=1.5,
                          shift_factor=shift_factor, use_quant_conv=False, use_post_quant_conv=False)
    return randomize(model, seed)


def arrays(prefix, values):
    return {f"{prefix}.{k}": v.detach().float().numpy() for k, v in values.items()}


def save(pipe, name, expected, cases):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    pipe.save_pretrained(path, safe_serialization=True)
    np.savez_compressed(os.path.join(path, "expected.npz"), **expected)
    with open(os.path.join(path, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    print(f"{name}: {size // 1024} KiB")


PROMPTS = ["a red fox sitting in the snow", "An astronaut riding a horse on the moon, digital art, trending "
           "on the old masters' starry night oil painting"]       # the second passes CLIP_MAX tokens


SD3_CASES = {
    # one prompt, guidance from "" (the default negative), the default max_sequence_length (256)
    "enc_default": dict(prompt="a cat wearing sunglasses"),
    # two prompts, per-encoder prompts and negatives, two images each, clip_skip, a short T5 length
    "enc_full": dict(prompt=PROMPTS, prompt_2=["a bowl of fruit", "mountains at night"],
                     negative_prompt=["blurry", "dark, low quality"], negative_prompt_3=["ugly", "watermark"],
                     num_images_per_prompt=2, clip_skip=1, max_sequence_length=10),
    # no guidance: no negatives
    "enc_noguide": dict(prompt=PROMPTS, do_classifier_free_guidance=False, max_sequence_length=7),
    # what the run below encodes
    "enc_run": dict(prompt=PROMPTS, negative_prompt=["blurry", "dark"], max_sequence_length=10),
}
# a 2-step run from prompts with a negative prompt and guidance (latents: run.latents)
SD3_RUN = dict(prompt=PROMPTS, negative_prompt=["blurry", "dark"], height=16, width=16, num_inference_steps=2,
               guidance_scale=4.0, max_sequence_length=10)
FLUX_CASES = {"enc_default": dict(prompt="a cat wearing sunglasses"),
              "enc_full": dict(prompt=PROMPTS, prompt_2=["a bowl of fruit", "mountains at night"],
                               num_images_per_prompt=2, max_sequence_length=10),
              "enc_run": dict(prompt=PROMPTS, max_sequence_length=10)}
FLUX_RUN = dict(prompt=PROMPTS, height=16, width=16, num_inference_steps=2, guidance_scale=3.5, max_sequence_length=10)
# true classifier-free guidance with a negative prompt (latents: cfg.latents)
FLUX_CFG = dict(prompt="a red fox", negative_prompt="blurry", true_cfg_scale=2.0, height=16, width=16,
                num_inference_steps=2, max_sequence_length=10)


def sd3_expected(pipe, latents):
    out = {}
    for case, kw in SD3_CASES.items():
        pe, npe, ppe, nppe = pipe.encode_prompt(**dict(dict(prompt_2=None, prompt_3=None), **kw))
        values = dict(prompt_embeds=pe, pooled_prompt_embeds=ppe)
        if npe is not None:
            values.update(negative_prompt_embeds=npe, negative_pooled_prompt_embeds=nppe)
        out.update(arrays(case, values))
    images = pipe(**SD3_RUN, latents=torch.from_numpy(latents), output_type="np").images
    out["run.latents"], out["run.images"] = latents, np.asarray(images, np.float32)
    return out


def make_sd3(clip, t5):
    clip_tok = clip_tokenizer(*clip)
    clip_tok_2 = clip_tokenizer(*clip, pad_token="!")
    t5_tok = t5_tokenizer(t5)
    transformer = randomize(SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=T5_WIDTH, caption_projection_dim=16, pooled_projection_dim=8 + 12, out_channels=4,
        pos_embed_max_size=8, qk_norm="rms_norm"), 1)
    parts = dict(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae(2, 0.1),
                 text_encoder=clip_encoder(CLIPTextModelWithProjection, clip_tok, 3, 8, 8, "quick_gelu"),
                 tokenizer=clip_tok,
                 text_encoder_2=clip_encoder(CLIPTextModelWithProjection, clip_tok_2, 4, 12, 12, "gelu"),
                 tokenizer_2=clip_tok_2, text_encoder_3=t5_encoder(t5_tok, 5), tokenizer_3=t5_tok)
    latents = np.random.default_rng(6).standard_normal((2, 4, 8, 8)).astype(np.float32)
    with torch.no_grad():
        pipe = StableDiffusion3Pipeline(**parts)
        save(pipe, "sd3", sd3_expected(pipe, latents), dict(encode=SD3_CASES, run=SD3_RUN))
        pipe = StableDiffusion3Pipeline(**dict(parts, text_encoder_3=None, tokenizer_3=None))
        save(pipe, "sd3_no_t5", sd3_expected(pipe, latents), dict(encode=SD3_CASES, run=SD3_RUN))


def make_flux(clip, t5):
    clip_tok = clip_tokenizer(*clip)
    t5_tok = t5_tokenizer(t5)
    transformer = randomize(FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=T5_WIDTH, pooled_projection_dim=8, axes_dims_rope=(2, 2, 4),
        guidance_embeds=True), 11)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxPipeline(transformer=transformer, scheduler=scheduler, vae=vae(12, 0.1),
                        text_encoder=clip_encoder(CLIPTextModel, clip_tok, 13, 8, 8, "quick_gelu"),
                        tokenizer=clip_tok, text_encoder_2=t5_encoder(t5_tok, 14), tokenizer_2=t5_tok)
    out = {}
    with torch.no_grad():
        for case, kw in FLUX_CASES.items():
            pe, ppe, ids = pipe.encode_prompt(**kw)
            out.update(arrays(case, dict(prompt_embeds=pe, pooled_prompt_embeds=ppe, text_ids=ids)))
        rng = np.random.default_rng(15)
        latents = rng.standard_normal((2, 16, 16)).astype(np.float32)        # packed: 4 x 4 tokens of 16
        images = pipe(**FLUX_RUN, latents=torch.from_numpy(latents), output_type="np").images
        out["run.latents"], out["run.images"] = latents, np.asarray(images, np.float32)
        latents = rng.standard_normal((1, 16, 16)).astype(np.float32)
        images = pipe(**FLUX_CFG, latents=torch.from_numpy(latents), output_type="np").images
        out["cfg.latents"], out["cfg.images"] = latents, np.asarray(images, np.float32)
    save(pipe, "flux", out, dict(encode=FLUX_CASES, run=FLUX_RUN, cfg=FLUX_CFG))


def main():
    torch.manual_seed(0)
    clip, t5 = clip_vocab(), t5_vocab()
    make_sd3(clip, t5)
    make_flux(clip, t5)


if __name__ == "__main__":
    main()
