"""GPTQ checkpoints (dtorch.gptq): a writer of the format built here from its definition (qweight
(K/8, N) int32, 8 nibbles a word along the input features, lowest first; qzeros (G, N/8) int32 along
the outputs, stored as zero - 1 in the classic format and as the zero in gptq_v2; scales (G, N)
float16; g_idx (K,) int32), a dequantization written again from ``w[o, i] = scales[g, o] * (q[i, o]
- zero[g, o])`` with g = g_idx[i], one group unpacked by hand; tiny GPTQ Llamas against the float64
numpy Llama with those dequantized weights on 1 device, tp2, tp3 and dp2 in both worker modes; and
every variant DTorch does not read refused with a ValueError naming it."""
import json
import os

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch import gptq
from dtorch import quantization as Q
from dtorch._safetensors import Checkpoint, SafetensorsFile, save_file
from dtorch.models import AutoModelForCausalLM, LlamaForCausalLM

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


# ---- the format, written from its definition ----------------------------------------------------

def pack_words(values, axis):
    """Unsigned 4-bit values packed 8 per int32 word along ``axis`` (0: down the rows, as qweight;
    1: along each row, as qzeros), value j of a word in bits 4j .. 4j + 3."""
    v = np.asarray(values, np.int64)
    if axis == 0:
        v = v.T
    R, C = v.shape
    out = np.zeros((R, C // 8), np.int64)
    for r in range(R):
        for c in range(C // 8):
            word = 0
            for j in range(8):
                word |= int(v[r, 8 * c + j]) << (4 * j)
            out[r, c] = word
    out = out.astype(np.uint32).view(np.int32)
    return out.T.copy() if axis == 0 else out


def unpack_word(word):
    """The 8 nibbles of one int32 word, lowest first (Python integers: independent of numpy's shifts)."""
    w = int(word) & 0xFFFFFFFF
    return [(w >> (4 * j)) & 0xF for j in range(8)]


def gptq_tensors(q, zeros, scales, g_idx, fmt="gptq"):
    """{suffix: array} of one GPTQ Linear: q (K, N) in [0, 15], zeros (G, N) the zero points,
    scales (G, N), g_idx (K,) or None."""
    stored = np.asarray(zeros) - (1 if fmt == "gptq" else 0)
    out = {"qweight": pack_words(q, 0), "qzeros": pack_words(stored, 1),
           "scales": np.asarray(scales, np.float16)}
    if g_idx is not None:
        out["g_idx"] = np.asarray(g_idx, np.int32)
    return out


def dequantize_reference(t, fmt="gptq", group_size=None):
    """w (N, K) float64 of a GPTQ Linear's tensors, unpacking every word by Python integer shifts."""
    K8, N = t["qweight"].shape
    K = K8 * 8
    q = np.array([[unpack_word(t["qweight"][r, o]) for o in range(N)] for r in range(K8)])   # (K8, N, 8)
    q = q.transpose(0, 2, 1).reshape(K, N)
    z = np.array([sum((unpack_word(w) for w in row), []) for row in t["qzeros"]]) + (1 if fmt == "gptq" else 0)
    g = t["g_idx"] if "g_idx" in t else np.arange(K) // (group_size or K)
    s = np.asarray(t["scales"], np.float64)
    w = np.empty((N, K))
    for i in range(K):
        w[:, i] = s[g[i]] * (q[i] - z[g[i]])
    return w


def random_linear(rng, N, K, group_size, fmt="gptq", g_idx=True):
    gs = group_size if group_size != -1 else K
    G = -(-K // gs)
    q = rng.integers(0, 16, (K, N))
    scales = (rng.uniform(0.5, 1.5, (G, N)) / (8 * np.sqrt(K))).astype(np.float16)
    return gptq_tensors(q, np.full((G, N), 8), scales, np.arange(K) // gs if g_idx else None, fmt)


def converted(tensors, N, K, config, tmp_path, name="layer"):
    save_file({f"{name}.{k}": v for k, v in tensors.items()}, tmp_path / "one.safetensors")
    words, scale, keys = gptq.convert(Checkpoint(tmp_path / "one.safetensors"), name, N, K, config)
    assert words.dtype == np.int32 and words.shape == (N, K // 8)
    assert scale.dtype == np.float32 and scale.shape == (N, -(-K // 32))
    return Q.dequantize_int4(Q.from_words(words, -(-K // 2), 4), scale, K), keys


# ---- the layout ----------------------------------------------------------------------------------

def test_one_group_by_hand(tmp_path):
    """K = 32 features (4 words), N = 8 outputs, group_size 32, the classic format. Output 0's
    column of qweight is 0x76543210, 0xFEDCBA98, 0x88888888, 0x0000000F: features 0..7 hold q
    0..7, features 8..15 q 8..15, 16..23 q 8, 24 q 15 and 25..31 q 0. Every stored zero nibble is 7
    (word 0x77777777): zero 7 + 1 = 8. scales[0, 0] = 0.5, so w[0, i] = 0.5 * (q - 8): -4, -3.5,
    ..., -0.5, then 0, 0.5, ..., 3.5, then 0 (x 8), 3.5, then -4 (x 7); our int4 values are q - 8."""
    words = np.zeros((4, 8), np.uint32)
    words[:, 0] = [0x76543210, 0xFEDCBA98, 0x88888888, 0x0000000F]
    words[:, 1:] = 0x88888888                                  # every other output: q 8, w 0
    t = {"qweight": words.view(np.int32), "qzeros": np.array([[0x77777777]], np.uint32).view(np.int32),
         "scales": np.full((1, 8), 0.5, np.float16), "g_idx": np.zeros(32, np.int32)}
    w, keys = converted(t, 8, 32, gptq.GPTQConfig(32, 1, False, "config.json"), tmp_path)
    want = [-4, -3.5, -3, -2.5, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5] + [0] * 8 + [3.5] + [-4] * 7
    np.testing.assert_array_equal(w[0], want)
    np.testing.assert_array_equal(w[1:], 0)
    assert keys == ["layer.qweight", "layer.qzeros", "layer.scales", "layer.g_idx"]
    # and the independent dequantization reads the same table
    np.testing.assert_array_equal(dequantize_reference(t)[0], want)
    # in gptq_v2 the stored zero is the zero: 0x88888888 means 8
    t["qzeros"] = np.array([[0x88888888]], np.uint32).view(np.int32)
    w, _ = converted(t, 8, 32, gptq.GPTQConfig(32, 0, False, "config.json"), tmp_path)
    np.testing.assert_array_equal(w[0], want)


def test_writer_packs_as_the_definition_says():
    q = np.arange(16 * 8).reshape(16, 8) % 16                  # (K 16, N 8)
    t = gptq_tensors(q, np.full((1, 8), 8), np.ones((1, 8)), None)
    assert t["qweight"].shape == (2, 8) and t["qzeros"].shape == (1, 1)
    assert unpack_word(t["qweight"][0, 1]) == [q[i, 1] for i in range(8)]
    assert unpack_word(t["qweight"][1, 3]) == [q[i, 3] for i in range(8, 16)]
    assert int(t["qzeros"][0, 0]) & 0xFFFFFFFF == 0x77777777


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("group_size,g_idx", [(32, True), (64, True), (128, False), (-1, True)])
def test_random_linears_dequantize_bit_for_bit(tmp_path, fmt, group_size, g_idx):
    rng = np.random.default_rng(group_size + 7)
    N, K = 24, 256
    t = random_linear(rng, N, K, group_size, fmt, g_idx)
    config = gptq.GPTQConfig(None if group_size == -1 else group_size, 1 if fmt == "gptq" else 0, False, "c")
    w, _ = converted(t, N, K, config, tmp_path)
    np.testing.assert_array_equal(w, dequantize_reference(t, fmt, None if group_size == -1 else group_size))


# ---- tiny GPTQ Llamas -----------------------------------------------------------------------------

def gptq_config(**kw):
    """Input features 192 and 384: groups of 64 split whole over tp2 and tp3; 12 query and 6 k/v heads."""
    return ref.tiny_config(hidden_size=192, intermediate_size=384, num_attention_heads=12, num_key_value_heads=6,
                           **kw)


def write_gptq(directory, cfg, seed, group_size=64, fmt="gptq", quant=None, side_file=False, float_dtype=np.float32,
               weights_name="model"):
    """A GPTQ Llama directory of random int4 values; returns the float64 state dict it stands for
    (the dequantized weights, by dequantize_reference)."""
    rng = np.random.default_rng(seed)
    sd = ref.random_weights(cfg, seed)
    tensors, dense = {}, {}
    for key, v in sd.items():
        name = key[:-len(".weight")]
        if key.startswith("model.layers.") and name.endswith(LINEARS):
            N, K = v.shape
            t = random_linear(rng, N, K, group_size, fmt)
            tensors.update({f"{name}.{k}": a for k, a in t.items()})
            dense[key] = dequantize_reference(t, fmt, None if group_size == -1 else group_size)
        else:
            tensors[key] = np.asarray(v, float_dtype)
            dense[key] = np.asarray(tensors[key], np.float64)
    os.makedirs(directory, exist_ok=True)
    q = dict(quant_method="gptq", bits=4, group_size=group_size, desc_act=False, sym=True, damp_percent=0.01,
             true_sequential=True, checkpoint_format=fmt)
    q.update(quant or {})
    kind = cfg.get("model_type", "llama")
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[kind]
    config = dict(cfg, torch_dtype="float16", architectures=[arch], model_type=kind)
    if side_file:
        q.pop("quant_method")
        with open(os.path.join(directory, "quantize_config.json"), "w") as f:
            json.dump(dict(q, model_file_base_name=weights_name), f)
    else:
        config["quantization_config"] = q
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    save_file(tensors, os.path.join(directory, f"{weights_name}.safetensors"), {"format": "pt"})
    return dense


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


IDS = np.random.default_rng(4).integers(0, 61, (2, 5))
MESHES = {"1": ((1,), None), "tp2": ((2,), ("tp",)), "tp3": ((3,), ("tp",)), "dp2": ((2,), ("dp",))}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gptq")
    return directory, write_gptq(directory, gptq_config(), 1)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_gptq_llama_logits(llama_dir, mode, mesh_name):
    directory, dense = llama_dir
    shape, names = MESHES[mesh_name]
    mesh = dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = LlamaForCausalLM.from_pretrained(directory, device_mesh=mesh, dtype="float32")
    assert isinstance(model.model.layers[1].mlp.down_proj, Q.QuantizedLinear)
    assert model.model.layers[1].mlp.down_proj.bits == 4
    assert model.quantization_config == {"quant_method": "dtorch", "bits": 4, "group_size": 32}
    got = model(IDS).logits.numpy()
    want = ref.logits(dense, gptq_config(), IDS, inputs=ref.int4_inputs())
    assert rel(got, want) < 0.02                       # the contract
    assert rel(got, want) < 1e-4                       # in fact float32's rounding: no requantization


def test_v2_side_file_base_name_and_the_auto_class(tmp_path, thread_runtime):
    """gptq_v2 zeros, settings in AutoGPTQ's quantize_config.json (no quant_method) and weights in
    its own file name; AutoModelForCausalLM and quantization="int4" read it as well."""
    cfg = gptq_config(num_hidden_layers=1)
    dense = write_gptq(tmp_path, cfg, 2, group_size=128, fmt="gptq_v2", side_file=True,
                       weights_name="gptq_model-4bit-128g")
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype="float32", quantization="int4",
                                                 device_mesh=dtorch.init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
    assert rel(model(IDS).logits.numpy(), ref.logits(dense, cfg, IDS, inputs=ref.int4_inputs())) < 1e-4


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_mistral_and_qwen2(tmp_path, thread_runtime, kind):
    """Qwen2's q/k/v biases stay float (float16 in the file, as GPTQ writes them) beside the
    quantized weights; the auto class picks the architecture."""
    cfg = gptq_config(num_hidden_layers=1, model_type=kind)
    dense = write_gptq(tmp_path, cfg, 7, float_dtype=np.float16)
    assert (kind == "qwen2") == ("model.layers.0.self_attn.q_proj.bias" in dense)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype="float32",
                                                 device_mesh=dtorch.init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
    assert type(model).__name__ == {"mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[kind]
    assert rel(model(IDS).logits.numpy(), ref.logits(dense, cfg, IDS, inputs=ref.int4_inputs())) < 1e-4


def test_float16_checkpoint_keeps_its_dtype_and_saves_as_dtorch_int4(tmp_path, thread_runtime):
    """As a Hub checkpoint is: float16 everywhere. dtype=None keeps float16; save_pretrained writes
    DTorch's int4 layout, whose values are GPTQ's q - 8, and loads back to the same logits."""
    cfg = gptq_config(num_hidden_layers=1)
    dense = write_gptq(tmp_path / "g", cfg, 3, float_dtype=np.float16)
    model = LlamaForCausalLM.from_pretrained(tmp_path / "g")
    assert model.model.embed_tokens.weight.dtype == dtorch.float16
    logits = model(IDS).logits.numpy()
    assert rel(logits, ref.logits(dense, cfg, IDS)) < 0.02
    model.save_pretrained(tmp_path / "d")
    f = SafetensorsFile(tmp_path / "d" / "model.safetensors")
    key = "model.layers.0.mlp.down_proj"
    got = Q.dequantize_int4(f.bits(key + ".qweight"), f.bits(key + ".scale"), 384)
    np.testing.assert_array_equal(got, dense[key + ".weight"])
    again = LlamaForCausalLM.from_pretrained(tmp_path / "d")
    np.testing.assert_array_equal(again(IDS).logits.numpy(), logits)


# ---- refused variants ------------------------------------------------------------------------------

REFUSED = [
    ({"bits": 8}, "GPTQ bits=8 is not supported"),
    ({"bits": 3}, "GPTQ bits=3 is not supported"),
    ({"sym": False}, "GPTQ sym=False is not supported: asymmetric"),
    ({"group_size": 48}, "GPTQ group_size=48 is not supported"),
    ({"group_size": 16}, "GPTQ group_size=16 is not supported"),
    ({"checkpoint_format": "marlin"}, "GPTQ checkpoint_format='marlin' is not supported"),
    ({"dynamic": {"-:.*down_proj": {}}}, "GPTQ dynamic="),
    ({"pack_dtype": "int16"}, "GPTQ pack_dtype='int16' is not supported"),
    ({"quant_method": "awq"}, "quant_method='awq' \\(a format DTorch does not read\\)"),
    ({"quant_method": "fp8"}, "quant_method='fp8'"),
    ({"quant_method": "bitsandbytes"}, "quant_method='bitsandbytes'"),
    ({"quant_method": "compressed-tensors"}, "quant_method='compressed-tensors'"),
]


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("small")
    write_gptq(directory, gptq_config(num_hidden_layers=1), 5)
    return directory


def with_config(src, dst, change):
    os.makedirs(dst)
    os.link(src / "model.safetensors", dst / "model.safetensors")
    with open(src / "config.json") as f:
        config = json.load(f)
    config["quantization_config"].update(change)
    with open(dst / "config.json", "w") as f:
        json.dump(config, f)
    return dst


@pytest.mark.parametrize("case", range(len(REFUSED)))
def test_refused_settings(small_dir, tmp_path, thread_runtime, case):
    change, message = REFUSED[case]
    directory = with_config(small_dir, tmp_path / "x", change)
    with pytest.raises(ValueError, match=message):
        LlamaForCausalLM.from_pretrained(directory)


def rewrite(src, dst, key, value):
    os.makedirs(dst)
    os.link(src / "config.json", dst / "config.json")
    f = SafetensorsFile(src / "model.safetensors")
    tensors = {k: f.bits(k) for k in f.entries}
    tensors[key] = value
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_refused_tensors(small_dir, tmp_path, thread_runtime):
    name = "model.layers.0.mlp.up_proj"
    f = SafetensorsFile(small_dir / "model.safetensors")
    # asymmetric zeros: one stored nibble 5 (zero 6) in the classic format
    zeros = f.bits(name + ".qzeros").copy()
    zeros[1, 2] = np.int32(0x77777757)
    with pytest.raises(ValueError, match="'model.layers.0.mlp.up_proj.qzeros' holds zero point 6 for group 1, output 17"):
        LlamaForCausalLM.from_pretrained(rewrite(small_dir, tmp_path / "z", name + ".qzeros", zeros))
    # the legacy off-by-one: zeros stored as 8 (gptq_v2's way) in a classic-format checkpoint are 9
    eights = np.full(zeros.shape, 0x88888888, np.uint32).view(np.int32)
    with pytest.raises(ValueError, match="holds zero point 9 for group 0, output 0 \\(stored 8\\)"):
        LlamaForCausalLM.from_pretrained(rewrite(small_dir, tmp_path / "e", name + ".qzeros", eights))
    # act-order: a g_idx that permutes the groups
    g_idx = np.arange(192, dtype=np.int32) // 64
    g_idx[[3, 100]] = g_idx[[100, 3]]
    with pytest.raises(ValueError, match="up_proj.g_idx' puts input feature 3 in group 1, not 0"):
        LlamaForCausalLM.from_pretrained(rewrite(small_dir, tmp_path / "g", name + ".g_idx", g_idx))
    # a corrupt scale tensor: the wrong shape, and a non-finite scale
    with pytest.raises(ValueError, match="up_proj.scales' is F16 \\(3, 383\\) but a 4-bit GPTQ 384x192 weight"):
        LlamaForCausalLM.from_pretrained(rewrite(small_dir, tmp_path / "s", name + ".scales",
                                                 np.ones((3, 383), np.float16)))
    scales = f.bits(name + ".scales").copy()
    scales[0, 0] = np.inf
    with pytest.raises(ValueError, match="up_proj.scales' holds a scale that is not finite"):
        LlamaForCausalLM.from_pretrained(rewrite(small_dir, tmp_path / "i", name + ".scales", scales))
    assert LlamaForCausalLM.from_pretrained(small_dir, dtype="float32")(IDS).logits.shape == (2, 5, 61)


def test_refused_loads(small_dir, tmp_path, thread_runtime):
    with pytest.raises(ValueError, match="quantized to 4-bit GPTQ \\(read as int4\\); quantization='int8' cannot"):
        LlamaForCausalLM.from_pretrained(small_dir, quantization="int8")
    # hidden size 32 in GPTQ groups of 32 is one of our groups: tp2 would give each device half of it
    write_gptq(tmp_path, ref.tiny_config(), 6, group_size=32)
    tp2 = dtorch.init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    with pytest.raises(ValueError, match="in_features=32 \\(1 groups of 32\\) over tp=2"):
        LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=tp2)
    assert LlamaForCausalLM.from_pretrained(tmp_path, dtype="float32")(IDS).logits.shape == (2, 5, 61)


def test_desc_act_with_groups_in_order(small_dir, tmp_path, thread_runtime):
    """desc_act=True whose g_idx is i // group_size (act-order that left the groups in order) maps
    exactly and loads; without its g_idx it is refused, naming the tensor."""
    want = LlamaForCausalLM.from_pretrained(small_dir, dtype="float32")(IDS).logits.numpy()
    directory = with_config(small_dir, tmp_path / "in_order", {"desc_act": True})
    got = LlamaForCausalLM.from_pretrained(directory, dtype="float32")(IDS).logits.numpy()
    np.testing.assert_array_equal(got, want)
    bare = tmp_path / "bare"
    os.makedirs(bare)
    os.link(directory / "config.json", bare / "config.json")
    f = SafetensorsFile(small_dir / "model.safetensors")
    save_file({k: f.bits(k) for k in f.entries if not k.endswith(".g_idx")}, bare / "model.safetensors")
    with pytest.raises(ValueError, match="desc_act=True but 'model.layers.0.self_attn.q_proj.g_idx'.* is missing"):
        LlamaForCausalLM.from_pretrained(bare)
