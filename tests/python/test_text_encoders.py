"""CLIPTextModel, CLIPTextModelWithProjection and T5EncoderModel against transformers 5.25.

The reference: checkpoints and outputs written by transformers (fixtures/<name>/, made by
make_encoder_fixtures.py: tiny random weights at order-1 scales, fixed ids with padding, and
transformers' last_hidden_state, hidden_states, pooler_output / text_embeds). Loaded with dtorch on
one device, dp2, tp2 and dp2 x tp2, in both worker modes: every output within 1e-4 of transformers'
(relative to its largest value). The fixtures cover CLIP's two eos rules (the legacy eos_token_id 2:
the largest id; a real eos: its first position, position 0 in a row without one), quick_gelu and
gelu, T5's gated-gelu and relu feed-forwards, right and left padding, and T5's relative positions
past max_distance. Also: state_dict keys equal the checkpoint's, a save/load round trip, checkpoints
spelled as older transformers wrote them, the tp and dp layouts, the errors (unknown mesh dim, a tp
that does not divide the heads, missing files, bad ids), and AutoTokenizer on a CLIP BPE and a T5
unigram tokenizer saved by transformers, which must give transformers' ids."""
import json
import os
import shutil
import struct
import warnings

import numpy as np
import pytest

import dtorch
from dtorch import Shard
from dtorch.models import AutoTokenizer, CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TOL = 1e-4
CLASSES = {"clip": CLIPTextModel, "clip_eos": CLIPTextModel, "clip_proj": CLIPTextModelWithProjection,
           "t5": T5EncoderModel, "t5_relu": T5EncoderModel}
MESHES = {"1": ((1,), None), "dp2": ((2,), ("dp",)), "tp2": ((2,), ("tp",)), "dp2xtp2": ((2, 2), ("dp", "tp"))}

pytestmark = pytest.mark.usefixtures("thread_runtime")


def mesh_of(name):
    shape, names = MESHES[name]
    return dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)


def read_safetensors(path):
    """{name: array} of a float32 .safetensors file, read here from the format, not by dtorch's reader."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name != "__metadata__":
            assert info["dtype"] == "F32"
            a, b = info["data_offsets"]
            out[name] = np.frombuffer(data[8 + n + a:8 + n + b], np.float32).reshape(info["shape"])
    return out


def write_safetensors(tensors, path):
    """A float32 .safetensors file of {name: array}, written here from the format."""
    header, blobs, at = {}, [], 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array, np.float32).tobytes()
        header[name] = dict(dtype="F32", shape=list(array.shape), data_offsets=[at, at + len(raw)])
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def fixture(name):
    directory = os.path.join(FIXTURES, name)
    return directory, dict(np.load(os.path.join(directory, "expected.npz")))


def rel(got, want):
    return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


def check_outputs(model, expected, name):
    ids, mask = expected["input_ids"], expected["attention_mask"]
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    assert out.last_hidden_state.shape == expected["last_hidden_state"].shape
    assert rel(out.last_hidden_state.numpy(), expected["last_hidden_state"]) < TOL
    assert len(out.hidden_states) == len(expected["hidden_states"])
    for got, want in zip(out.hidden_states, expected["hidden_states"]):
        assert rel(got.numpy(), want) < TOL
    for key in ("pooler_output", "text_embeds"):
        if key in expected:
            assert rel(getattr(out, key).numpy(), expected[key]) < TOL
    if "unmasked" in expected:
        assert rel(model(ids).last_hidden_state.numpy(), expected["unmasked"]) < TOL
    assert model(ids, attention_mask=mask).hidden_states is None
    return out


# ---- transformers' outputs ---------------------------------------------------------------------------

@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_outputs_equal_transformers(name, mesh_name):
    directory, expected = fixture(name)
    model = CLASSES[name].from_pretrained(directory, device_mesh=mesh_of(mesh_name))
    check_outputs(model, expected, name)


def test_the_fixtures_tell_the_rules_apart():
    """What the outputs above could not pass without: CLIP's hidden_states end before
    final_layer_norm and T5's after it; each eos rule picks positions the other would not; padding
    and the relative bias change T5's states."""
    _, clip = fixture("clip_eos")
    assert rel(clip["hidden_states"][-1], clip["last_hidden_state"]) > 1e-2
    _, t5 = fixture("t5")
    np.testing.assert_array_equal(t5["hidden_states"][-1], t5["last_hidden_state"])
    assert rel(t5["unmasked"], t5["last_hidden_state"]) > 1e-2
    # transformers' choice, computed here: the pooled state is the final state at these positions
    for name, rule in (("clip", lambda ids, eos: ids.argmax(-1)),
                       ("clip_eos", lambda ids, eos: (ids == eos).argmax(-1))):
        directory, e = fixture(name)
        with open(os.path.join(directory, "config.json")) as f:
            eos = json.load(f)["eos_token_id"]
        at = rule(e["input_ids"], eos)
        np.testing.assert_array_equal(e["pooler_output"], e["last_hidden_state"][np.arange(len(at)), at])
        other = (e["input_ids"] == eos).argmax(-1) if eos == 2 else e["input_ids"].argmax(-1)
        assert (other != at).any()


def test_layouts_split_heads_and_batch():
    """tp splits the attention and MLP matrices, the vocabulary and T5's bias table by heads; dp
    splits the states by batch rows."""
    mesh = mesh_of("dp2xtp2")
    t5 = T5EncoderModel.from_pretrained(fixture("t5")[0], device_mesh=mesh)
    attn = t5.encoder.block[0].layer[0].SelfAttention
    assert attn.q.weight.placements[1] == Shard(0) and attn.o.weight.placements[1] == Shard(1)
    assert attn.relative_attention_bias.weight.placements[1] == Shard(1)
    assert t5.encoder.block[1].layer[1].DenseReluDense.wi_0.weight.placements[1] == Shard(0)
    assert t5.shared.weight.placements[1] == Shard(0) and t5.encoder.embed_tokens is t5.shared
    _, e = fixture("t5")
    assert t5(e["input_ids"]).last_hidden_state.placements[0] == Shard(0)
    clip = CLIPTextModelWithProjection.from_pretrained(fixture("clip_proj")[0], device_mesh=mesh)
    layer = clip.text_model.encoder.layers[1]
    assert layer.self_attn.k_proj.weight.placements[1] == Shard(0)
    assert layer.mlp.fc2.weight.placements[1] == Shard(1)
    assert all(p.is_replicate() for p in clip.text_projection.weight.placements)


@pytest.mark.parametrize("name", ["clip_proj", "t5"])
def test_half_precision(name):
    """dtype= casts the float32 checkpoint as it loads; the states stay within bfloat16's rounding."""
    directory, expected = fixture(name)
    model = CLASSES[name].from_pretrained(directory, dtype="bfloat16", device_mesh=mesh_of("dp2xtp2"))
    out = model(expected["input_ids"], attention_mask=expected["attention_mask"])
    assert out.last_hidden_state.dtype == dtorch.bfloat16
    assert rel(out.last_hidden_state.numpy(), expected["last_hidden_state"]) < 5e-2


# ---- checkpoints --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["clip", "clip_proj", "t5_relu"])
def test_state_dict_keys_equal_the_checkpoint_and_save_round_trips(name, tmp_path):
    directory, expected = fixture(name)
    weights = read_safetensors(os.path.join(directory, "model.safetensors"))
    model = CLASSES[name].from_pretrained(directory)
    tied = {"encoder.embed_tokens.weight"} if name.startswith("t5") else set()   # T5's alias of shared.weight
    assert set(model.state_dict()) == set(weights) | tied
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), weights.get(key, weights.get("shared.weight")))
    model.save_pretrained(tmp_path)
    assert set(read_safetensors(tmp_path / "model.safetensors")) == set(weights)
    with open(tmp_path / "config.json") as f:
        saved = json.load(f)
    assert saved["architectures"] == [CLASSES[name].__name__]
    check_outputs(CLASSES[name].from_pretrained(str(tmp_path)), expected, name)


def test_older_spellings_load(tmp_path):
    """CLIPTextModel keys under text_model. (older transformers, every diffusers pipeline's CLIP
    text_encoder) and T5 files with both names of the tied embedding, loaded from a subfolder."""
    for name, rename in (("clip_eos", lambda w: {"text_model." + k: v for k, v in w.items()}),
                         ("t5", lambda w: dict(w, **{"encoder.embed_tokens.weight": w["shared.weight"]}))):
        directory, expected = fixture(name)
        target = tmp_path / "pipe" / "text_encoder"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        shutil.copy(os.path.join(directory, "config.json"), target)
        write_safetensors(rename(read_safetensors(os.path.join(directory, "model.safetensors"))),
                          target / "model.safetensors")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = CLASSES[name].from_pretrained(str(tmp_path / "pipe"), subfolder="text_encoder",
                                                  device_mesh=mesh_of("tp2"))
        assert not [w for w in caught if "not used" in str(w.message)]
        check_outputs(model, expected, name)


def test_missing_files_are_oserrors(tmp_path):
    for cls in (CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel):
        with pytest.raises(OSError):
            cls.from_pretrained(str(tmp_path / "nowhere"))
        with pytest.raises(OSError):
            cls.from_pretrained(str(tmp_path), subfolder="text_encoder")
    shutil.copy(os.path.join(FIXTURES, "t5", "config.json"), tmp_path)
    with pytest.raises(OSError, match="model.safetensors"):
        T5EncoderModel.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="clip_text_model"):
        T5EncoderModel.from_pretrained(fixture("clip")[0])


# ---- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["clip_proj", "t5"])
def test_bad_meshes_are_value_errors_naming_them(name):
    directory, _ = fixture(name)
    for shape, names, message in (((2,), ("pp",), "'pp'"), ((2, 2), ("dp", "cp"), "'cp'"),
                                  ((3,), ("tp",), "tp=3 does not divide num_attention_heads=4")):
        with pytest.raises(ValueError, match=message):
            CLASSES[name].from_pretrained(directory, device_mesh=dtorch.init_device_mesh("cpu", shape,
                                                                                        mesh_dim_names=names))


def test_bad_inputs_are_value_errors():
    clip = CLIPTextModel.from_pretrained(fixture("clip")[0])
    with pytest.raises(ValueError, match="token id 64"):
        clip([[1, 64]])
    with pytest.raises(ValueError, match="attention_mask"):
        clip([[1, 2, 3]], attention_mask=[[1, 1]])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        clip(np.ones((1, 17), np.int64))
    t5 = T5EncoderModel.from_pretrained(fixture("t5")[0])
    with pytest.raises(ValueError, match="integers"):
        t5(np.ones((1, 3), np.float32))
    # the runtime keeps working
    _, e = fixture("t5")
    assert rel(t5(e["input_ids"]).last_hidden_state.numpy(), e["unmasked"]) < TOL


# ---- tokenizers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["clip_bpe", "t5_unigram"])
def test_tokenizers_give_transformers_ids(name):
    directory = os.path.join(FIXTURES, "tokenizers", name)
    with open(os.path.join(directory, "expected.json")) as f:
        expected = json.load(f)
    tok = AutoTokenizer.from_pretrained(directory)
    batch = tok(expected["texts"], padding="max_length", truncation=True, max_length=expected["max_length"])
    assert batch["input_ids"] == expected["input_ids"]
    assert batch["attention_mask"] == expected["attention_mask"]
    assert [tok.encode(t) for t in expected["texts"]] == expected["encode"]
    array = tok(expected["texts"], padding="max_length", truncation=True, max_length=expected["max_length"],
                return_tensors="np")["input_ids"]
    np.testing.assert_array_equal(array, expected["input_ids"])


# ---- process workers (last: it restarts the runtime) -------------------------------------------------

def test_outputs_in_process_workers(process_mode):
    for name in ("clip_proj", "t5"):
        directory, expected = fixture(name)
        model = CLASSES[name].from_pretrained(directory, device_mesh=mesh_of("dp2xtp2"))
        check_outputs(model, expected, name)
