"""Checkpoints: save_pretrained / from_pretrained round trips (one file and a sharded index, on
meshes whose devices read only their slices), the safetensors bytes checked by hand against the
format, float32 / float16 / bfloat16 tensors (16-bit models within a stated bound of the numpy
reference on the same rounded weights), tied embeddings, config.json in both spellings, every bad
input (missing tensor, shape disagreeing with the config, truncated file, bad header, broken index)
with an error naming the key and the file, and what each worker process holds after loading."""
import io
import json
import os
import struct

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from conftest import bf16_round, chunk_range
from dtorch._safetensors import CheckpointError, SafetensorsFile, _LineBar, _progress, save_file
from dtorch.models import LlamaConfig, LlamaForCausalLM

TOL = 1e-4
# 16-bit models: every op rounds its output to the model's dtype (as torch does); against the
# float64 reference on the same rounded weights the logits stay within these (max error over the
# largest logit); measured on the tiny config over four seeds: float16 0.9-1.1e-3, bfloat16 4.8-8.4e-3
BOUND_16 = {"float16": 5e-3, "bfloat16": 2e-2}


pytestmark = pytest.mark.usefixtures("thread_runtime")


def mesh(shape, names):
    return dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def write_checkpoint(directory, cfg, sd, dtype="float32"):
    """An HF directory written without dtorch's model: config.json and model.safetensors."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(cfg, torch_dtype=dtype, architectures=["LlamaForCausalLM"], model_type="llama"), f)
    save_file(sd, os.path.join(directory, "model.safetensors"), {"format": "pt"})


def rounded(sd, dtype):
    if dtype == "float16":
        return {k: v.astype(np.float16) for k, v in sd.items()}
    import ml_dtypes
    return {k: bf16_round(v).astype(ml_dtypes.bfloat16) for k, v in sd.items()}


IDS = np.random.default_rng(1).integers(0, 61, (3, 6))


@pytest.mark.parametrize("where", [((1,), None), ((2,), ("tp",)), ((2, 2), ("dp", "tp")), ((4,), ("tp",))],
                         ids=["1", "tp2", "dp2xtp2", "tp4"])
def test_round_trip(tmp_path, where):
    cfg = ref.tiny_config()
    sd = ref.random_weights(cfg, 3)
    write_checkpoint(tmp_path / "a", cfg, sd)
    m = mesh(*where)
    model = LlamaForCausalLM.from_pretrained(tmp_path / "a", device_mesh=m)
    assert model.model.embed_tokens.weight.dtype == dtorch.float32
    assert set(model.state_dict()) == set(sd)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), sd[key], err_msg=key)
    assert rel(model(IDS).logits.numpy(), ref.logits(sd, cfg, IDS)) < TOL
    q = model.model.layers[0].self_attn.q_proj.weight
    tp = where[0][-1] if where[1] and "tp" in where[1] else 1
    assert {p.shape for p in q.to_local()} == {(32 // tp, 32)}   # each device holds its slice only
    model.save_pretrained(tmp_path / "b")
    assert sorted(os.listdir(tmp_path / "b")) == ["config.json", "generation_config.json", "model.safetensors"]
    again = LlamaForCausalLM.from_pretrained(tmp_path / "b")
    for key, value in again.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), sd[key], err_msg=key)


def test_sharded_index(tmp_path):
    cfg = ref.tiny_config(tie_word_embeddings=True)
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    model.save_pretrained(tmp_path, max_shard_size="12KB")
    names = sorted(os.listdir(tmp_path))
    assert "model.safetensors.index.json" in names and "model.safetensors" not in names
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    with open(tmp_path / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert set(index["weight_map"]) == set(model.state_dict()) - {"lm_head.weight"}   # tied: not written
    assert index["metadata"]["total_size"] == sum(v.numel() * 4 for k, v in model.state_dict().items()
                                                  if k != "lm_head.weight")
    for shard in shards:
        assert os.path.getsize(tmp_path / shard) < 12_000 + 4 * 61 * 32 + 4096
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=mesh((2,), ("tp",)))
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    np.testing.assert_allclose(loaded(IDS).logits.numpy(), model(IDS).logits.numpy(), rtol=1e-5, atol=1e-5)


def test_file_layout_follows_the_format(tmp_path):
    import ml_dtypes
    tensors = {"b": np.arange(6, dtype=np.float16).reshape(2, 3), "a": np.ones((3,), np.float32),
               "c": np.array([1.5, -2.0], ml_dtypes.bfloat16), "d": np.zeros((0, 4), np.float32),
               "e": np.arange(3, dtype=np.int64)}
    path = tmp_path / "t.safetensors"
    save_file(tensors, path, {"format": "pt"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and 8 + n <= len(raw)
    header = json.loads(raw[8:8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))          # contiguous, no holes
    assert {k: v["dtype"] for k, v in header.items()} == {"a": "F32", "b": "F16", "c": "BF16", "d": "F32", "e": "I64"}
    for key, v in header.items():
        begin, end = v["data_offsets"]
        item = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8}[v["dtype"]]
        assert begin % item == 0                                         # every tensor starts aligned
    b0, b1 = header["b"]["data_offsets"]
    np.testing.assert_array_equal(np.frombuffer(raw[8 + n + b0:8 + n + b1], "<f2").reshape(2, 3), tensors["b"])
    c0, c1 = header["c"]["data_offsets"]
    assert np.frombuffer(raw[8 + n + c0:8 + n + c1], "<u2").tolist() == [0x3FC0, 0xC000]
    f = SafetensorsFile(path)
    assert f.shape("d") == (0, 4) and f.dtype("c") == dtorch.bfloat16
    np.testing.assert_array_equal(f.numpy("c"), [1.5, -2.0])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_checkpoints(tmp_path, dtype):
    cfg = ref.tiny_config()
    sd = rounded(ref.random_weights(cfg, 4), dtype)
    write_checkpoint(tmp_path, cfg, sd, dtype)
    want = ref.logits({k: np.asarray(v, np.float32) for k, v in sd.items()}, cfg, IDS)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=mesh((2,), ("tp",)))
    assert all(p.dtype == getattr(dtorch, dtype) for p in model.parameters())
    logits = model(IDS).logits
    assert logits.dtype == getattr(dtorch, dtype)
    assert rel(logits.numpy(), want) < BOUND_16[dtype]
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), np.asarray(sd[key], np.float32), err_msg=key)
    wide = LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=mesh((2, 2), ("dp", "tp")), dtype=dtorch.float32)
    assert wide.lm_head.weight.dtype == dtorch.float32
    assert rel(wide(IDS).logits.numpy(), want) < TOL
    model.save_pretrained(tmp_path / "again")
    f = SafetensorsFile(tmp_path / "again" / "model.safetensors")
    key = "model.layers.0.self_attn.q_proj.weight"
    assert f.dtype(key) == getattr(dtorch, dtype)
    np.testing.assert_array_equal(f.numpy(key), np.asarray(sd[key], np.float32))
    with open(tmp_path / "again" / "config.json") as fh:
        assert json.load(fh)["torch_dtype"] == dtype


def test_newer_config_spelling_from_a_file(tmp_path):
    cfg = ref.tiny_config(**{"rope_scaling": None})
    sd = ref.random_weights(cfg, 5)
    write_checkpoint(tmp_path, cfg, sd)
    newer = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
    newer.update(dtype="float32", rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16})
    with open(tmp_path / "config.json", "w") as f:
        json.dump(newer, f)
    model = LlamaForCausalLM.from_pretrained(tmp_path)
    want_cfg = dict(cfg, rope_theta=500000.0, rope_scaling=newer["rope_parameters"])
    assert rel(model(IDS).logits.numpy(), ref.logits(sd, want_cfg, IDS)) < TOL


# ---- bad input ---------------------------------------------------------------------------------

@pytest.fixture
def good(tmp_path):
    cfg = ref.tiny_config()
    sd = ref.random_weights(cfg, 6)
    write_checkpoint(tmp_path, cfg, sd)
    return tmp_path, cfg, sd


def test_missing_tensor(good):
    path, cfg, sd = good
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="'model.layers.1.mlp.up_proj.weight' is missing.*model.safetensors"):
        LlamaForCausalLM.from_pretrained(path)


def test_shape_disagreeing_with_the_config(good):
    path, cfg, sd = good
    with open(path / "config.json", "w") as f:
        json.dump(dict(cfg, intermediate_size=44), f)
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has "
                                              r"shape \(40, 32\) but the model \(from its config\) expects \(44, 32\)"):
        LlamaForCausalLM.from_pretrained(path)


def test_truncated_file(good):
    path, _, _ = good
    raw = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(raw[:-10])
    with pytest.raises(CheckpointError, match="model.safetensors: tensor '.*': its bytes end at .* the file is truncated"):
        LlamaForCausalLM.from_pretrained(path)
    (path / "model.safetensors").write_bytes(raw[:100])
    with pytest.raises(CheckpointError, match="model.safetensors: bad header: its length .* runs past the end"):
        LlamaForCausalLM.from_pretrained(path)
    (path / "model.safetensors").write_bytes(raw[:5])
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        LlamaForCausalLM.from_pretrained(path)


@pytest.mark.parametrize("header, message", [
    (b"{not json", "bad header: not JSON"),
    (b"[1, 2]", "bad header: expected a JSON object"),
    (b'{"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}', "tensor 'w': unsupported dtype 'F64'"),
    (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', "tensor 'w': data_offsets .* hold 4 bytes"),
    (b'{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', "tensor 'w': bad shape"),
    (b'{"w": {"dtype": "F32", "shape": [1]}}', "tensor 'w': bad header entry"),
])
def test_bad_header(tmp_path, header, message):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(CheckpointError, match=message) as e:
        SafetensorsFile(path)
    assert str(path) in str(e.value)


def test_broken_index_and_directory(tmp_path):
    cfg = ref.tiny_config()
    LlamaForCausalLM(LlamaConfig.from_dict(cfg)).save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    index["weight_map"]["model.extra.weight"] = shard
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"{shard}: tensor 'model.extra.weight' is listed in "
                                              "model.safetensors.index.json but not in the file"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    os.remove(tmp_path / shard)
    with pytest.raises(CheckpointError, match=f"{shard}: listed in model.safetensors.index.json but missing"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(CheckpointError, match="bad index"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    os.remove(tmp_path / "model.safetensors.index.json")
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="config.json: cannot read the config"):
        LlamaForCausalLM.from_pretrained(tmp_path / "nowhere")


def _model_classes():
    from dtorch.models import AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel
    from dtorch.pipelines import FluxPipeline, StableDiffusion3Pipeline
    from dtorch.schedulers import FlowMatchEulerDiscreteScheduler
    return {"LlamaForCausalLM": (LlamaForCausalLM, "config.json"),
            "SD3Transformer2DModel": (SD3Transformer2DModel, "config.json"),
            "FluxTransformer2DModel": (FluxTransformer2DModel, "config.json"),
            "AutoencoderKL": (AutoencoderKL, "config.json"),
            "StableDiffusion3Pipeline": (StableDiffusion3Pipeline, "transformer/config.json"),
            "FluxPipeline": (FluxPipeline, "transformer/config.json"),
            "FlowMatchEulerDiscreteScheduler": (FlowMatchEulerDiscreteScheduler, "scheduler_config.json")}


@pytest.mark.parametrize("name", ["LlamaForCausalLM", "SD3Transformer2DModel", "FluxTransformer2DModel",
                                  "AutoencoderKL", "StableDiffusion3Pipeline", "FluxPipeline",
                                  "FlowMatchEulerDiscreteScheduler"])
def test_missing_directory_config_or_weights_is_an_os_error(tmp_path, name):
    """As transformers and diffusers raise it: an OSError (the checkpoint errors stay ValueErrors too)
    naming what is missing, for a missing directory, a directory without the config, and one with the
    config (every argument its default) but no weights."""
    cls, config = _model_classes()[name]
    missing = tmp_path / "nowhere"
    with pytest.raises(OSError, match=str(missing)):
        cls.from_pretrained(str(missing))
    with pytest.raises(OSError, match="config.json"):
        cls.from_pretrained(str(tmp_path))
    if name == "FlowMatchEulerDiscreteScheduler":
        return   # a config and nothing else
    (tmp_path / config).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / config).write_text(json.dumps(ref.tiny_config() if name == "LlamaForCausalLM" else {}))
    with pytest.raises(OSError, match="safetensors"):
        cls.from_pretrained(str(tmp_path))


def test_checkpoint_errors_are_value_and_os_errors(good):
    path, _, _ = good
    (path / "model.safetensors").write_bytes(b"\0" * 5)
    for kind in (ValueError, OSError, CheckpointError):
        with pytest.raises(kind, match="model.safetensors: not a safetensors file"):
            LlamaForCausalLM.from_pretrained(path)


def _load_in_thread(path):
    """LlamaForCausalLM.from_pretrained(path) in a thread: (the thread, a list that gets its
    exception). A load that hangs leaves the thread alive."""
    import threading
    errors = []

    def load():
        try:
            LlamaForCausalLM.from_pretrained(path)
        except Exception as e:
            errors.append(e)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.parametrize("which", ["shard", "single", "index", "config"])
def test_only_regular_files_are_read(good, which):
    """A FIFO (which would block the open until someone writes) or a directory where a config, an
    index or a weights file should be is an OSError naming it, raised without opening it to read."""
    path, cfg, sd = good
    if which == "shard":
        save_file(sd, path / "model-00001-of-00002.safetensors")
        (path / "model.safetensors").unlink()
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict(
            {k: "model-00001-of-00002.safetensors" for k in sd}, extra="model-00002-of-00002.safetensors")}))
        odd = path / "model-00002-of-00002.safetensors"
    else:
        odd = path / {"single": "model.safetensors", "index": "model.safetensors.index.json",
                      "config": "config.json"}[which]
        if odd.exists():
            odd.unlink()
    for make in (os.mkfifo, os.mkdir):
        make(odd)
        thread, errors = _load_in_thread(path)
        thread.join(60)
        if thread.is_alive():
            fd = os.open(odd, os.O_RDWR)   # lets the blocked open go on, then ends its read
            os.close(fd)
            thread.join(60)
            pytest.fail(f"loading with a {make.__name__[2:]} at {odd.name} hung")
        (error,) = errors
        assert isinstance(error, OSError) and f"{odd}: not a regular file" in str(error), error
        os.rmdir(odd) if make is os.mkdir else odd.unlink()


def test_scheduler_config_must_be_a_regular_file(tmp_path):
    from dtorch.schedulers import FlowMatchEulerDiscreteScheduler
    os.mkfifo(tmp_path / "scheduler_config.json")
    with pytest.raises(OSError, match="scheduler_config.json: not a regular file"):
        FlowMatchEulerDiscreteScheduler.from_pretrained(str(tmp_path))


SHRINK = """
import os, sys
import numpy as np
import dtorch
from dtorch._safetensors import Checkpoint, CheckpointError, load_checkpoint
from dtorch.models import LlamaConfig, LlamaForCausalLM
path = sys.argv[1]
dtorch.init(workers="thread")
checkpoint = Checkpoint(path)                   # parsed and checked while the file is whole
file = os.path.join(path, "model.safetensors")
os.truncate(file, os.path.getsize(file) // 2)  # then someone shrinks it
model = LlamaForCausalLM(LlamaConfig.from_pretrained(path))
try:
    load_checkpoint(model, checkpoint)
except CheckpointError as e:
    print("refused:", e)
x = dtorch.distribute_tensor(np.arange(4.0, dtype=np.float32), dtorch.DeviceMesh("cpu", [0]))
print("still working:", (x * 2).numpy().tolist())
"""


def test_file_shrinking_after_it_was_opened(good):
    """A weights file truncated after its header was read and checked: the load fails naming the
    file and the tensor whose bytes are gone (before: SIGBUS killed the process, so it runs in one
    of its own), and the process goes on."""
    import subprocess
    import sys
    path, _, _ = good
    run = subprocess.run([sys.executable, "-c", SHRINK, str(path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert f"refused: {path / 'model.safetensors'}: tensor '" in run.stdout, run.stdout
    assert "the file shrank to" in run.stdout, run.stdout
    assert "still working: [0.0, 2.0, 4.0, 6.0]" in run.stdout


def test_unused_tensors_warn(good):
    path, cfg, sd = good
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)   # old files carry it: ignored
    sd["vision_tower.weight"] = np.ones(2, np.float32)
    save_file(sd, path / "model.safetensors")
    with pytest.warns(UserWarning, match=r"not used: \['vision_tower.weight'\]"):
        LlamaForCausalLM.from_pretrained(path)


def test_progress_bar():
    assert type(_progress(3, "x", False)).__name__ == "_NoBar"
    stream = io.StringIO()
    bar = _LineBar(4, "Loading weights", stream)
    for _ in range(4):
        bar.update(1)
    bar.close()
    assert stream.getvalue().split("\r")[-1] == "Loading weights [" + "#" * 30 + "] 4/4\n"


# ---- what each device holds --------------------------------------------------------------------

# tp's rule per parameter, written from the Megatron layout (not read from the model): the dim each
# weight splits along, None for one every device holds whole
TP_SPLIT = {"embed_tokens": 0, "q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 0,
            "up_proj": 0, "down_proj": 1, "lm_head": 0, "norm": None, "input_layernorm": None,
            "post_attention_layernorm": None}


@pytest.mark.parametrize("tp,hidden,intermediate,vocab", [(4, 256, 256, 8192), (3, 96, 200, 1000)])
def test_each_worker_receives_only_its_slices(tmp_path, mode, tp, hidden, intermediate, vocab):
    """Loading a checkpoint onto tp devices sends each device its slices of the split matrices and
    the whole of the small replicated ones, and nothing more: the bytes each worker counts as sent
    to it (device_stats' loaded_bytes) and the bytes of the pieces it holds (bytes_in_use) both equal
    the sum of its torch.chunk slices, exactly. tp=3 splits the vocabulary and the MLP unevenly
    (1000 rows: 334, 334, 332; 200: 67, 67, 66)."""
    cfg = ref.tiny_config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=1,
                          num_attention_heads=tp, num_key_value_heads=tp, tie_word_embeddings=False)
    sd = ref.random_weights(cfg, 7)
    write_checkpoint(tmp_path, cfg, sd)
    m = mesh((tp,), ("tp",))
    dtorch.ones(4, device_mesh=m).numpy()                  # start the workers
    before = dtorch.device_stats(m)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=m)
    after = dtorch.device_stats(m)
    for d in range(tp):
        want = 0
        for key, value in sd.items():
            split = TP_SPLIT[key.split(".")[-2]]
            if split is None:
                want += value.nbytes
            else:
                lo, hi = chunk_range(value.shape[split], tp, d)
                want += value.nbytes // value.shape[split] * (hi - lo)
        assert after[d]["loaded_bytes"] - before[d]["loaded_bytes"] == want, (d, after[d], before[d], want)
        assert after[d]["loads"] - before[d]["loads"] == len(sd), (d, after[d], before[d])
        assert after[d]["bytes_in_use"] - before[d]["bytes_in_use"] == want, (d, after[d], before[d], want)
    del model
