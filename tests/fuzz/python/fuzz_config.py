"""Fuzzes the config.json every model class reads in from_pretrained: LlamaForCausalLM (both
spellings: top-level rope_theta / rope_scaling / torch_dtype, and rope_parameters / dtype),
SD3Transformer2DModel, FluxTransformer2DModel and AutoencoderKL, each beside a tiny checkpoint of
its own written once.

The contract: a config that is not good raises ValueError, TypeError (NotImplementedError for a
value the format allows but dtorch does not run) or CheckpointError, from a check in dtorch that
says what is wrong, never an AttributeError, KeyError, ZeroDivisionError or a TypeError of an
operation deep inside, a hang or a crash. A good config that does not match the checkpoint is a
CheckpointError naming the tensor.

The input's first byte picks the model (its low two bits) and whether the rest is config.json
itself (raw: byte mutations of the good config's text) or the choices that change 1 to 4 of the
good config's fields (structured) to any JSON value. Ints are small or past int64: a config of a
model with 2**40 layers is a good config (the checkpoint then lacks its tensors), but building its
description would loop over them before the checkpoint says so.
"""
import json
import os
import shutil
import sys
import warnings

import atheris

import fuzzlib

with atheris.instrument_imports(include=["dtorch"]):
    import dtorch
    from dtorch._safetensors import CheckpointError
    from dtorch.models import (AutoencoderKL, FluxTransformer2DModel, LlamaConfig, LlamaForCausalLM,
                               SD3Transformer2DModel)

KINDS = (ValueError, TypeError, NotImplementedError, CheckpointError)
INTS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 16, -1, -2, 2**63, 2**64, -2**63 - 1, 10**30]
STRINGS = ["", "silu", "swish", "gelu", "relu", "gelu_pytorch_tanh", "default", "linear", "llama3", "dynamic",
           "rope_type", "type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
           "rope_theta", "float32", "bfloat16", "float16", "int8", "rms_norm", "layer_norm", "DownEncoderBlock2D",
           "UpDecoderBlock2D", "LlamaForCausalLM"]

LLAMA = dict(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=16, rms_norm_eps=1e-6, rope_theta=10000.0,
             rope_scaling=None, hidden_act="silu", tie_word_embeddings=False, torch_dtype="float32",
             bos_token_id=1, eos_token_id=2)
LLAMA_NEW = dict({k: v for k, v in LLAMA.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")},
                 rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8}, dtype="float32")
SD3 = dict(sample_size=4, patch_size=2, in_channels=2, num_layers=1, attention_head_dim=4, num_attention_heads=2,
           joint_attention_dim=6, caption_projection_dim=8, pooled_projection_dim=4, out_channels=2,
           pos_embed_max_size=4)
FLUX = dict(in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=1,
            joint_attention_dim=6, pooled_projection_dim=4, axes_dims_rope=[2, 2, 4])
VAE = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"], up_block_types=["UpDecoderBlock2D"],
           block_out_channels=[4], layers_per_block=1, latent_channels=2, norm_num_groups=2, sample_size=8)

# model -> (class, good config(s), extra keys a file may hold)
MODELS = [(LlamaForCausalLM, [LLAMA, LLAMA_NEW], ["rope_parameters", "dtype", "architectures", "model_type",
                                                  "head_dim", "attention_bias", "mlp_bias", "pad_token_id"]),
          (SD3Transformer2DModel, [SD3], ["dual_attention_layers", "qk_norm", "_class_name"]),
          (FluxTransformer2DModel, [FLUX], ["guidance_embeds", "out_channels", "patch_size"]),
          (AutoencoderKL, [VAE], ["scaling_factor", "shift_factor", "latents_mean", "use_quant_conv",
                                  "use_post_quant_conv", "mid_block_add_attention", "act_fn", "force_upcast"])]
WORK = fuzzlib.scratch_dir("config")


def _checkpoints():
    """One directory per model: its weights (of the first good config) and config.json."""
    dirs = []
    for i, (cls, configs, _) in enumerate(MODELS):
        directory = os.path.join(WORK, f"model{i}")
        if cls is LlamaForCausalLM:
            cls(LlamaConfig.from_dict(configs[0])).save_pretrained(directory)
        else:
            cls.from_config(configs[0]).save_pretrained(directory)
        dirs.append(directory)
    return dirs


def seeds():
    out = []
    for i, (_, configs, _) in enumerate(MODELS):
        for config in configs:
            out.append(bytes([i]) + json.dumps(config).encode())      # raw
        out += [bytes([4 + i]) + bytes(range(j, j + 24)) for j in range(0, 64, 16)]   # structured
    return out


def _structured(model, fdp):
    _, configs, extra = MODELS[model]
    config = dict(configs[fdp.ConsumeIntInRange(0, len(configs) - 1)])
    keys = sorted(set(config) | set(extra)) + ["unknown_argument"]
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        key = fdp.PickValueInList(keys)
        if fdp.ConsumeIntInRange(0, 9) == 0:
            config.pop(key, None)
        else:
            config[key] = fuzzlib.json_value(fdp, STRINGS, ints=INTS)
    return json.dumps(config).encode()


def test_one_input(data):
    if not data:
        return
    model = data[0] & 3
    cls = MODELS[model][0]
    text = _structured(model, atheris.FuzzedDataProvider(data[1:])) if data[0] & 4 else data[1:]
    with open(os.path.join(DIRS[model], "config.json"), "wb") as f:
        f.write(text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls.from_pretrained(DIRS[model], progress=False)
    except fuzzlib.Finding:
        raise
    except Exception as e:   # noqa: BLE001: any other exception is judged here
        fuzzlib.expect_clear(e, KINDS, f"{cls.__name__}.from_pretrained")


if __name__ == "__main__":
    dtorch.init(workers="thread")
    fuzzlib.at_exit(dtorch.shutdown)
    DIRS = _checkpoints()
    fuzzlib.limit_memory(8)
    fuzzlib.main(test_one_input, seeds(),
                 dictionary=[f'"{k}"' for _, configs, extra in MODELS for k in list(configs[0]) + extra]
                 + [f'"{s}"' for s in STRINGS] + ["null", "true", "false", "NaN", "-Infinity", "[]", "{}", "0",
                                                  "-1", "1e999", "18446744073709551616"])
