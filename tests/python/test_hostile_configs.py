"""config.json values that the fuzzer (tests/fuzz/python/fuzz_config.py) found each model class
mishandling: a value of the wrong kind or out of range raised an AttributeError, a
ZeroDivisionError, a KeyError or a TypeError of an operation deep inside a layer (or built a
model from it); each is now a TypeError or ValueError naming the model and the field, from
from_dict / from_config, and through from_pretrained."""
import json

import pytest

import llama_reference as ref
from dtorch._safetensors import CheckpointError
from dtorch.models import (AutoencoderKL, FluxTransformer2DModel, LlamaConfig, LlamaForCausalLM,
                           SD3Transformer2DModel)

pytestmark = pytest.mark.usefixtures("thread_runtime")

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}


@pytest.mark.parametrize("field, value, kind, message", [
    ("hidden_size", "32", TypeError, "config hidden_size must be an int, got '32'"),   # was: '32' % 4
    ("num_attention_heads", 0, ValueError, r"config num_attention_heads must be an int in \[1, 2\*\*63\), got 0"),
    ("num_hidden_layers", 2**64, ValueError, "config num_hidden_layers must be an int in"),   # was: a loop
    ("num_hidden_layers", True, TypeError, "config num_hidden_layers must be an int, got True"),
    ("head_dim", 1.5, TypeError, "config head_dim must be an int"),
    ("rms_norm_eps", "1e-6", TypeError, "config rms_norm_eps must be a number"),
    ("rope_theta", 0, ValueError, "config rope_theta must be a finite number > 0"),
    ("rope_theta", float("nan"), ValueError, "config rope_theta must be a finite number > 0"),
    ("rope_scaling", [], TypeError, "config rope_scaling must be an object"),     # was: [].get
    ("rope_scaling", {"rope_type": ["linear"]}, ValueError, "rope_scaling type \\['linear'\\] is not supported"),
    ("rope_scaling", {"rope_type": "linear"}, ValueError, "rope_scaling of type 'linear' needs factor"),
    ("rope_scaling", dict(LLAMA3, low_freq_factor=4.0), ValueError,   # was: ZeroDivisionError
     "rope_scaling.s low_freq_factor and high_freq_factor must differ"),
    ("rope_scaling", {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}, ValueError,
     "rope_scaling of type .llama3. needs original_max_position_embeddings"),   # was: KeyError when the model was built
    ("rope_scaling", dict(LLAMA3, factor="8"), TypeError, "config rope_scaling factor must be a number"),
    ("rope_parameters", "x", TypeError, "config rope_parameters must be an object"),   # was: dict("x")
    ("tie_word_embeddings", "false", TypeError, "config tie_word_embeddings must be true or false"),
    ("hidden_act", None, TypeError, "config hidden_act must be a string"),
    ("eos_token_id", [2, "3"], TypeError, r"config eos_token_id\[1\] must be an int"),
])
def test_llama_config_refuses(field, value, kind, message):
    with pytest.raises(kind, match="LlamaConfig: " + message):
        LlamaConfig.from_dict(ref.tiny_config(**{field: value}))


def test_llama_config_takes_what_files_hold():
    """Token ids as files give them (pad -1, a list of eos ids), and llama3 scaling, still read."""
    cfg = LlamaConfig.from_dict(ref.tiny_config(pad_token_id=-1, eos_token_id=[2, 5], rope_scaling=LLAMA3))
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.rope_scaling["factor"]) == (-1, [2, 5], 8.0)


def test_llama_from_pretrained_names_the_field(tmp_path):
    LlamaForCausalLM(LlamaConfig.from_dict(ref.tiny_config())).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, num_attention_heads=0)))
    with pytest.raises(CheckpointError, match="config.json: bad config: LlamaConfig: config num_attention_heads must"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(config, rope_scaling="linear")))
    with pytest.raises(TypeError, match="LlamaConfig: config rope_scaling must be an object"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    for other in ("tie_word_embeddings", ["a", "b"], 3):   # was: dict(...) raised ValueError from inside
        (tmp_path / "config.json").write_text(json.dumps(other))
        with pytest.raises(CheckpointError, match="config.json: the config is not a JSON object"):
            LlamaForCausalLM.from_pretrained(tmp_path)


SD3 = dict(sample_size=4, patch_size=2, in_channels=2, num_layers=1, attention_head_dim=4, num_attention_heads=2,
           joint_attention_dim=6, caption_projection_dim=8, pooled_projection_dim=4, out_channels=2, pos_embed_max_size=4)
FLUX = dict(in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=1,
            joint_attention_dim=6, pooled_projection_dim=4, axes_dims_rope=(2, 2, 4))
VAE = dict(down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",), block_out_channels=(4,),
           layers_per_block=1, latent_channels=2, norm_num_groups=2, sample_size=8)


@pytest.mark.parametrize("cls, config, field, value, kind, message", [
    (SD3Transformer2DModel, SD3, "patch_size", "2", TypeError, "config patch_size must be an int"),  # was: int('2'*...)
    (SD3Transformer2DModel, SD3, "sample_size", 1, ValueError,   # was: ZeroDivisionError in the position table
     r"sample_size \(1\) holds no patch of patch_size \(2\)"),
    (SD3Transformer2DModel, SD3, "num_layers", 2**63, ValueError, "config num_layers must be an int in"),
    (SD3Transformer2DModel, SD3, "dual_attention_layers", 0, TypeError, "config dual_attention_layers must be a list"),
    (SD3Transformer2DModel, SD3, "qk_norm", 1, TypeError, "config qk_norm must be a string"),
    (FluxTransformer2DModel, FLUX, "axes_dims_rope", 8, TypeError, "config axes_dims_rope must be a list"),
    (FluxTransformer2DModel, FLUX, "axes_dims_rope", [], ValueError, "config axes_dims_rope must not be empty"),
    (FluxTransformer2DModel, FLUX, "guidance_embeds", "yes", TypeError, "config guidance_embeds must be true or"),
    (FluxTransformer2DModel, FLUX, "num_attention_heads", -1, ValueError, "config num_attention_heads must be an int"),
    (AutoencoderKL, VAE, "block_out_channels", [], ValueError, "config block_out_channels must not be empty"),
    (AutoencoderKL, VAE, "norm_num_groups", 0, ValueError, "config norm_num_groups must be an int in"),  # was: % 0
    (AutoencoderKL, VAE, "down_block_types", "DownEncoderBlock2D", TypeError, "config down_block_types must be a list"),
    (AutoencoderKL, VAE, "scaling_factor", 0, ValueError, "config scaling_factor must be a finite number > 0"),
    (AutoencoderKL, VAE, "latents_mean", [0.1, None], TypeError, r"config latents_mean\[1\] must be a number"),
])
def test_diffusers_config_refuses(cls, config, field, value, kind, message):
    with pytest.raises(kind, match=f"{cls.__name__}: {message}"):
        cls.from_config(dict(config, **{field: value}))


def test_diffusers_from_pretrained_names_the_field(tmp_path):
    SD3Transformer2DModel.from_config(SD3).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, sample_size=1)))
    with pytest.raises(ValueError, match="SD3Transformer2DModel: sample_size"):
        SD3Transformer2DModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(config, num_layers=None)))
    with pytest.raises(TypeError, match="SD3Transformer2DModel: config num_layers must be an int, got None"):
        SD3Transformer2DModel.from_pretrained(tmp_path)
