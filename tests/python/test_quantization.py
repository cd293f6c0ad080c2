"""Quantized weights (dtorch.quantization; DESIGN.md's contract): the formulas against numpy written
from the contract and a row by hand; the linear_int8 and linear_int4 ops against float64 products
of the dequantized weights on 1 to 4 devices, split every way, in both worker modes; quantized tiny
Llamas against the float64 numpy Llama with the dequantized weights on 1 device, tp2 and dp2 x
tp2; greedy generation; the bytes the devices hold; save/load round trips; and bad input."""
import json
import os

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch import Replicate, Shard
from dtorch import quantization as Q
from dtorch._C import _op
from dtorch._ops import ids as OP_IDS
from dtorch._safetensors import SafetensorsFile, save_file
from dtorch.models import AutoModelForCausalLM, LlamaForCausalLM

MESHES = {"1": ((1,), None), "tp2": ((2,), ("tp",)), "dp2xtp2": ((2, 2), ("dp", "tp"))}


def mesh_of(name):
    shape, names = MESHES[name]
    return dtorch.init_device_mesh("cpu", shape, mesh_dim_names=names)


# ---- the formulas, written again from the contract ------------------------------------------------

def int8_from_contract(w):
    q, scales = np.zeros(w.shape, np.int64), np.zeros(w.shape[0])
    for n, row in enumerate(np.asarray(w, np.float64)):
        scale = np.float32(np.abs(row).max() / 127)
        scales[n] = scale
        q[n] = np.clip(np.round(row / np.float64(scale)), -127, 127) if scale > 0 else 0
    return q, scales


def int4_from_contract(w):
    N, K = w.shape
    q, scales = np.zeros((N, K), np.int64), np.zeros((N, -(-K // 32)))
    for n in range(N):
        for g in range(0, K, 32):
            part = np.asarray(w[n, g:g + 32], np.float64)
            scale = np.float32(np.abs(part).max() / 7)
            scales[n, g // 32] = scale
            q[n, g:g + 32] = np.clip(np.round(part / np.float64(scale)), -8, 7) if scale > 0 else 0
    return q, scales


def test_int8_formula_and_a_row_by_hand():
    # max |w| = 1.27: scale 0.01; 0.5 -> 50, -1.27 -> -127, 0.013 -> 1 (1.3), 1.0 -> 100; a zero row: 0
    w = np.array([[0.5, -1.27, 0.013, 1.0], [0, 0, 0, 0]], np.float32)
    q, scale = Q.quantize_int8(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    np.testing.assert_array_equal(q, [[50, -127, 1, 100], [0, 0, 0, 0]])
    np.testing.assert_allclose(scale, [0.01, 0], rtol=1e-7)
    w = np.random.default_rng(0).standard_normal((9, 37)).astype(np.float32)
    q, scale = Q.quantize_int8(w)
    want_q, want_scale = int8_from_contract(w)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(Q.dequantize_int8(q, scale), want_q * want_scale[:, None])


def test_int4_formula_packing_and_a_group_by_hand():
    # one group, max |w| = 0.7: scale 0.1; 0.1 -> 1, -0.2 -> -2, 0.26 -> 3 (2.6), -0.7 -> -7; the
    # bytes hold feature 2j low, 2j + 1 high: (1, -2) -> 0xE1, (3, -7) -> 0x93; a 33rd feature 0.4
    # is a group of its own: scale 0.4 / 7, q 7, in the low half of byte 16 (high half: padding, 0)
    w = np.zeros((1, 33), np.float32)
    w[0, :4] = [0.1, -0.2, 0.26, -0.7]
    w[0, 32] = 0.4
    packed, scale = Q.quantize_int4(w)
    assert packed.dtype == np.uint8 and packed.shape == (1, 17) and scale.shape == (1, 2)
    assert list(packed[0, :2]) == [0xE1, 0x93] and packed[0, 16] == 0x07
    np.testing.assert_allclose(scale[0], [0.1, 0.4 / 7], rtol=1e-7)
    w = np.random.default_rng(1).standard_normal((5, 70)).astype(np.float32)
    packed, scale = Q.quantize_int4(w)
    want_q, want_scale = int4_from_contract(w)
    np.testing.assert_array_equal(Q.unpack_int4(packed, 70), want_q)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(Q.dequantize_int4(packed, scale, 70),
                                  want_q * np.repeat(want_scale, 32, axis=1)[:, :70])


def test_int4_inputs_by_hand():
    # one group: max |x| 2.54, scale 0.02: 2.54 -> 127, 0.333 -> rint(16.65) = 17 -> 0.34, 1 -> 50
    # -> 1.0; a 33rd feature is no whole group and stays 0.333
    x = np.array([[2.54, 0.333] + [1.0] * 30 + [0.333]], np.float32)
    used = ref.int4_inputs_from_contract(x)
    np.testing.assert_allclose(used[0, :3], [2.54, 0.34, 1.0], rtol=1e-6)
    assert used[0, 32] == np.float32(0.333)


# ---- the ops --------------------------------------------------------------------------------------

def op_product(bits, x, w, bias, mesh, x_pl, q_pl, s_pl):
    """linear_int<bits>(x, quantized w, bias) on mesh with those placements, and the float64
    reference of the dequantized weight (int4: over its input as the product uses it)."""
    stored, scale = Q.quantize(w, bits)
    deq = Q.dequantize(stored, scale, bits, w.shape[1])
    tensors = [dtorch.distribute_tensor(x, mesh, x_pl),
               dtorch.distribute_tensor(Q.to_words(stored), mesh, q_pl),
               dtorch.distribute_tensor(scale, mesh, s_pl)]
    if bias is not None:
        tensors.append(dtorch.distribute_tensor(bias, mesh, s_pl if s_pl[0] == Shard(0) else [Replicate()]))
    got = _op(OP_IDS[f"linear_int{bits}"], tuple(tensors), None, None, None).numpy()
    used = ref.int4_inputs_from_contract(x) if bits == 4 else np.asarray(x, np.float64)
    want = used @ deq.T + (0 if bias is None else bias)
    return got, want


# (bits, K, devices, how the weight splits): K 37 and 45 are no multiple of 8 or 16; 7 output rows
# split unevenly over 2, 3 and 4 devices; int4's input-feature splits give whole groups
SPLITS = [(8, 37, n, how) for n in (1, 2, 3, 4) for how in ("rows", "features", "replicated")] + \
         [(4, 45, n, how) for n in (1, 2, 3, 4) for how in ("rows", "replicated")] + \
         [(4, 32 * 12, n, "features") for n in (2, 3, 4)]


@pytest.mark.parametrize("bits,K,n,how", SPLITS)
def test_op_against_float64(mode, bits, K, n, how):
    rng = np.random.default_rng(K + n)
    mesh = dtorch.init_device_mesh("cpu", (n,))
    w = rng.standard_normal((7, K)).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    for M in (1, 3, 8, 17):
        x = rng.standard_normal((M, K)).astype(np.float32)
        if how == "rows":
            pls = ([Replicate()], [Shard(0)], [Shard(0)])
        elif how == "features":
            pls = ([Shard(1)], [Shard(1)], [Replicate()] if bits == 8 else [Shard(1)])
        else:
            pls = ([Shard(0)], [Replicate()], [Replicate()])
        for b in (None, bias):
            got, want = op_product(bits, x, w, b, mesh, *pls)
            assert got.shape == (M, 7)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_op_reads_its_features_out_of_an_input_split_elsewhere(mode):
    """int8 weight words split over 3 devices: K = 24 (6 words: 8, 8, 8 features) where the input's
    split (8, 8, 8) holds each device's features, and K = 30 (8 words: 12, 12, 6 features) where
    the input's split (10, 10, 10) does not: the op replicates the input there, still exact."""
    mesh = dtorch.init_device_mesh("cpu", (3,))
    rng = np.random.default_rng(3)
    for K in (24, 30):
        x = rng.standard_normal((2, K)).astype(np.float32)
        w = rng.standard_normal((5, K)).astype(np.float32)
        got, want = op_product(8, x, w, None, mesh, [Shard(1)], [Shard(1)], [Replicate()])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_op_refuses_a_split_that_cuts_an_int4_group(mode):
    mesh = dtorch.init_device_mesh("cpu", (2,))
    w = np.ones((4, 32), np.float32)
    with pytest.raises(ValueError, match="cuts a group of 32"):
        op_product(4, np.ones((1, 32), np.float32), w, None, mesh, [Shard(1)], [Shard(1)], [Shard(1)])
    assert dtorch.ones(2, device_mesh=mesh).numpy().tolist() == [1, 1]      # the runtime still works


def test_op_refuses_bad_operands(mode):
    mesh = dtorch.init_device_mesh("cpu", (1,))
    x = dtorch.distribute_tensor(np.ones((2, 8), np.float32), mesh, [Replicate()])
    q = dtorch.distribute_tensor(np.zeros((3, 2), np.int32), mesh, [Replicate()])
    with pytest.raises(ValueError, match="scale must be float32 \\(3,\\)"):
        _op(OP_IDS["linear_int8"], (x, q, dtorch.distribute_tensor(np.ones(4, np.float32), mesh, [Replicate()])),
            None, None, None)
    with pytest.raises(ValueError, match="qweight must be int32 \\(out_features, 1\\)"):
        _op(OP_IDS["linear_int4"], (x, q, dtorch.distribute_tensor(np.ones((3, 1), np.float32), mesh,
                                                                   [Replicate()])), None, None, None)


# ---- quantized Llamas ------------------------------------------------------------------------------

def int4_config(**kw):
    """Every decoder input-feature count a multiple of 64, so tp2 splits whole groups."""
    return ref.tiny_config(hidden_size=64, intermediate_size=128, **kw)


def write_checkpoint(directory, cfg, sd):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(cfg, torch_dtype="float32", architectures=["LlamaForCausalLM"], model_type="llama"), f)
    save_file(sd, os.path.join(directory, "model.safetensors"), {"format": "pt"})


def dequantized(sd, bits, lm_head=False):
    """The state dict with every decoder Linear (and lm_head) replaced by its dequantized weight."""
    out = {}
    for key, v in sd.items():
        quantized = key.startswith("model.layers.") and key.endswith("_proj.weight") or \
            lm_head and key == "lm_head.weight"
        if quantized and bits == 8:
            q, scale = int8_from_contract(v)
            v = q * scale[:, None]
        elif quantized:
            q, scale = int4_from_contract(v)
            v = q * np.repeat(scale, 32, axis=1)[:, :v.shape[1]]
        out[key] = np.asarray(v, np.float64)
    return out


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


IDS = np.random.default_rng(4).integers(0, 61, (3, 6))
CASES = [("int8", ref.tiny_config()), ("int4", int4_config()),
         ("int8", ref.tiny_config(attention_bias=True, mlp_bias=True))]


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("case", range(len(CASES)), ids=["int8", "int4", "int8-bias"])
def test_llama_logits_within_the_contract(tmp_path, thread_runtime, case, mesh_name):
    quantization, cfg = CASES[case]
    bits = Q.bits_of(quantization)
    sd = ref.random_weights(cfg, 2)
    write_checkpoint(tmp_path, cfg, sd)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=mesh_of(mesh_name), quantization=quantization)
    assert isinstance(model.model.layers[0].mlp.down_proj, Q.QuantizedLinear)
    assert not isinstance(model.lm_head, Q.QuantizedLinear)
    got = model(IDS).logits.numpy()
    inputs = ref.int4_inputs() if bits == 4 else None
    want = ref.logits(dequantized(sd, bits), cfg, IDS, inputs=inputs)
    assert rel(got, want) < 0.02
    assert rel(got, want) < 1e-4                       # in fact float32's rounding, no more
    # and it is the quantized model that was measured: the float model is farther away than that
    assert rel(ref.logits(sd, cfg, IDS), want) > 1e-3
    out = model.generate(IDS, max_new_tokens=3)
    seq = IDS
    for _ in range(3):
        step = ref.logits(dequantized(sd, bits), cfg, seq, inputs=inputs)
        seq = np.concatenate([seq, step[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out, seq)


def test_quantized_lm_head_and_the_auto_class(tmp_path, thread_runtime):
    cfg = int4_config(tie_word_embeddings=True)
    sd = ref.random_weights(cfg, 3)
    write_checkpoint(tmp_path, cfg, sd)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, device_mesh=mesh_of("tp2"), quantization="int4",
                                                 quantize_lm_head=True)
    assert isinstance(model.lm_head, Q.QuantizedLinear)
    # the reference's untied head: the embedding quantized, while the lookup keeps it in float
    untied = dict(sd, **{"lm_head.weight": sd["model.embed_tokens.weight"]})
    want = ref.logits(dequantized(untied, 4, lm_head=True), dict(cfg, tie_word_embeddings=False), IDS,
                      inputs=ref.int4_inputs(lm_head=True))
    assert rel(model(IDS).logits.numpy(), want) < 1e-4


def test_devices_hold_the_smaller_weights(tmp_path, thread_runtime):
    """bytes_in_use after loading equals the bytes of every piece, written from the shapes: float32
    for the embedding, norms and lm_head; for a quantized Linear (N, K) its rows of ceil(K / 4)
    (int8) or ceil(K / 8) (int4) int32 words and its float32 scales; int4 < int8 < float32."""
    cfg = int4_config(num_hidden_layers=1)
    sd = ref.random_weights(cfg, 4)
    write_checkpoint(tmp_path, cfg, sd)
    mesh = mesh_of("1")
    dtorch.ones(1, device_mesh=mesh).numpy()
    held = {}
    for quantization in (None, "int8", "int4"):
        before = dtorch.memory_stats(mesh)[0]["bytes_in_use"]
        model = LlamaForCausalLM.from_pretrained(tmp_path, device_mesh=mesh, quantization=quantization)
        held[quantization] = dtorch.memory_stats(mesh)[0]["bytes_in_use"] - before
        want = 0
        for key, v in sd.items():
            if quantization and key.endswith("_proj.weight"):
                N, K = v.shape
                bits = Q.bits_of(quantization)
                want += N * -(-K // (4 if bits == 8 else 8)) * 4 + N * (1 if bits == 8 else -(-K // 32)) * 4
            else:
                want += v.size * 4
        assert held[quantization] == want, (quantization, held[quantization], want)
        del model
    assert held["int4"] < held["int8"] < held[None]


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_save_and_load_round_trip(tmp_path, thread_runtime, quantization):
    cfg = int4_config()
    sd = ref.random_weights(cfg, 5)
    write_checkpoint(tmp_path / "float", cfg, sd)
    model = LlamaForCausalLM.from_pretrained(tmp_path / "float", device_mesh=mesh_of("tp2"),
                                             quantization=quantization)
    logits = model(IDS).logits.numpy()
    model.save_pretrained(tmp_path / "q")
    bits = Q.bits_of(quantization)
    with open(tmp_path / "q" / "config.json") as f:
        assert json.load(f)["quantization_config"] == {"quant_method": "dtorch", "bits": bits,
                                                       "group_size": 32 if bits == 4 else None}
    f = SafetensorsFile(tmp_path / "q" / "model.safetensors")
    key = "model.layers.1.mlp.down_proj"
    w = sd[key + ".weight"]
    assert key + ".weight" not in f.entries
    if bits == 8:
        want_q, want_scale = int8_from_contract(w)
        assert f.entries[key + ".qweight"][0] == "I8"
        np.testing.assert_array_equal(f.bits(key + ".qweight"), want_q)
    else:
        want_q, want_scale = int4_from_contract(w)
        assert f.entries[key + ".qweight"][0] == "U8" and f.shape(key + ".qweight") == (64, 64)
        np.testing.assert_array_equal(Q.unpack_int4(f.bits(key + ".qweight"), 128), want_q)
    np.testing.assert_array_equal(f.bits(key + ".scale"), want_scale)
    again = LlamaForCausalLM.from_pretrained(tmp_path / "q", device_mesh=mesh_of("dp2xtp2"))
    assert again.quantization_config["bits"] == bits
    np.testing.assert_allclose(again(IDS).logits.numpy(), logits, rtol=0, atol=1e-5 * np.abs(logits).max())


# ---- bad input -------------------------------------------------------------------------------------

@pytest.fixture
def float_dir(tmp_path):
    cfg = ref.tiny_config()
    write_checkpoint(tmp_path, cfg, ref.random_weights(cfg, 6))
    return tmp_path


@pytest.mark.parametrize("value", ["int3", "INT8", "fp8", 8, True, ""])
def test_unknown_quantization_is_a_value_error(float_dir, thread_runtime, value):
    with pytest.raises(ValueError, match="quantization must be None, 'int8' or 'int4'"):
        LlamaForCausalLM.from_pretrained(float_dir, quantization=value)


def test_a_tp_size_that_splits_an_int4_group(float_dir, thread_runtime):
    # tiny_config's hidden size 32 is one group: tp2 would give each device half of it
    with pytest.raises(ValueError, match="in_features=32 \\(1 groups of 32\\) over tp=2"):
        LlamaForCausalLM.from_pretrained(float_dir, device_mesh=mesh_of("tp2"), quantization="int4")
    model = LlamaForCausalLM.from_pretrained(float_dir, device_mesh=mesh_of("tp2"), quantization="int8")
    assert model(IDS).logits.shape == (3, 6, 61)


def test_corrupt_saved_scale_is_a_value_error(float_dir, tmp_path_factory, thread_runtime):
    model = LlamaForCausalLM.from_pretrained(float_dir, quantization="int8")
    saved = tmp_path_factory.mktemp("saved")
    model.save_pretrained(saved)
    f = SafetensorsFile(saved / "model.safetensors")
    tensors = {k: f.bits(k) for k in f.entries}
    tensors["model.layers.0.self_attn.q_proj.scale"] = np.ones(31, np.float32)
    save_file(tensors, saved / "model.safetensors")
    with pytest.raises(ValueError, match="q_proj.scale' is F32 \\(31,\\) but an int8 32x32 weight needs F32 \\(32,\\)"):
        LlamaForCausalLM.from_pretrained(saved)
    with pytest.raises(ValueError, match="quantized to int8; quantization='int4' cannot change that"):
        LlamaForCausalLM.from_pretrained(saved, quantization="int4")

