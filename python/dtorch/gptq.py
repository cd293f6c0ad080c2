"""GPTQ checkpoints (4-bit, as AutoGPTQ, GPTQModel and transformers write them) read into DTorch's
int4 layout (dtorch.quantization) without requantizing: the same dequantized weights, bit for bit.

A quantized Linear (out_features N, in_features K) of such a checkpoint is

- ``<name>.qweight`` I32 (K / 8, N): word r of column o holds input features 8r .. 8r + 7 of output
  row o, feature 8r + j in bits 4j .. 4j + 3 (lowest first), each an unsigned q in [0, 15];
- ``<name>.qzeros`` I32 (G, N / 8): the zero point of group g, output o, in nibble o % 8 of word
  (g, o // 8);
- ``<name>.scales`` F16 (G, N); ``<name>.g_idx`` I32 (K,): the group of each input feature (older
  checkpoints without act-order may lack it: then i // group_size); ``<name>.bias`` optional.

and stands for ``w[o, i] = scales[g, o] * (q[i, o] - zero[g, o])`` with ``g = g_idx[i]``. The
classic format (``checkpoint_format`` "gptq" or absent) stores every zero point minus one, so that
``zero = stored + 1`` (AutoGPTQ's packing subtracts one and its kernels add it back); GPTQModel's
"gptq_v2" stores the zero itself. Symmetric 4-bit quantization has every zero at 8: stored 7, or 8
in v2.

It maps exactly onto the int4 layout when the quantization is symmetric (every zero 8), the groups
are consecutive (``g_idx[i] == i // group_size``: no act-order permutation) and group_size is a
multiple of 32 (or -1, one group of all K features, with K a multiple of 32): our q is GPTQ's q - 8
(the nibble XOR 8, the same bit order in the same int32 words, transposed), and each of our groups of
32 takes its GPTQ group's scale, widened exactly from float16 to float32. Anything else (other bits,
asymmetric zeros, a permuting g_idx, another group size, ``dynamic`` per-module overrides, other
quant_methods) is a ValueError naming the field or tensor and its value.
"""
import json
import os

import numpy as np

from . import _dtype
from .quantization import GROUP

FORMATS = ("gptq", "gptq_v2")
# quant_methods a Hub checkpoint may name that DTorch does not read: named in the refusal
_OTHER_METHODS = ("awq", "fp8", "bitsandbytes", "compressed-tensors", "aqlm", "eetq", "hqq", "quanto", "torchao")


class GPTQConfig:
    """The checked settings of a GPTQ checkpoint: ``group_size`` (None: one group per row),
    ``zero_offset`` (1 for the classic format, whose stored zeros are zero - 1; 0 for gptq_v2),
    ``desc_act`` and the file they came from."""

    def __init__(self, group_size, zero_offset, desc_act, file):
        self.group_size, self.zero_offset, self.desc_act, self.file = group_size, zero_offset, desc_act, file


def _refuse(file, field, value, why):
    raise ValueError(f"{file}: GPTQ {field}={value!r} is not supported: {why}")


def read_config(path, raw, file):
    """The GPTQConfig of a model directory when its config.json's quantization_config (or, without
    one, a quantize_config.json beside it, AutoGPTQ's habit) says ``quant_method: "gptq"`` (a
    quantize_config.json naming no method is GPTQ); None when neither is there or config.json's
    quantization_config is DTorch's own. Another quant_method, or GPTQ settings that do not map
    exactly onto the int4 layout, are a ValueError naming the field and its value."""
    config = raw.get("quantization_config")
    if config is None:
        side = os.path.join(path, "quantize_config.json") if os.path.isdir(path) else None
        if side is None or not os.path.isfile(side):
            return None
        from ._safetensors import read_json_object
        config, file = read_json_object(side, "quantize_config"), side
        config = dict(config)
        config.setdefault("quant_method", "gptq")
    if not isinstance(config, dict):
        raise ValueError(f"{file}: quantization_config must be an object, got {config!r}")
    method = config.get("quant_method")
    if method == "dtorch":
        return None
    if method != "gptq":
        known = " (a format DTorch does not read)" if method in _OTHER_METHODS else ""
        raise ValueError(f"{file}: quantization_config quant_method={method!r}{known}: DTorch reads its own "
                         "('dtorch') and 4-bit symmetric GPTQ ('gptq')")
    bits = config.get("bits")
    if bits != 4 or isinstance(bits, bool):
        _refuse(file, "bits", bits, "DTorch reads 4-bit GPTQ only")
    if config.get("sym", True) is not True:
        _refuse(file, "sym", config.get("sym"), "asymmetric zero points do not map onto DTorch's symmetric int4")
    fmt = config.get("checkpoint_format", config.get("format", "gptq"))
    if fmt not in FORMATS:
        _refuse(file, "checkpoint_format", fmt, f"DTorch reads {' and '.join(FORMATS)}")
    pack = config.get("pack_dtype", "int32")
    if pack != "int32":
        _refuse(file, "pack_dtype", pack, "DTorch reads int32 words")
    if config.get("dynamic"):
        _refuse(file, "dynamic", config["dynamic"], "per-module settings are not read")
    group = config.get("group_size", 128)
    if isinstance(group, bool) or not isinstance(group, int) or not (group == -1 or (group > 0 and group % GROUP == 0)):
        _refuse(file, "group_size", group, f"DTorch's int4 groups are {GROUP} input features: a GPTQ group must "
                f"be a multiple of {GROUP} (or -1)")
    desc_act = config.get("desc_act", False)
    if not isinstance(desc_act, bool):
        _refuse(file, "desc_act", desc_act, "it must be true or false")
    return GPTQConfig(None if group == -1 else group, 1 if fmt == "gptq" else 0, desc_act, file)


# ---- the layout -----------------------------------------------------------------------------------

def unpack_columns(words):
    """The unsigned nibbles of int32 words (R, C) packed 8 per word along the first dim, lowest
    first: (8R, C) values in [0, 15] (qweight's layout)."""
    w = np.asarray(words).astype("<i4").view("<u4")
    shifts = (4 * np.arange(8, dtype=np.uint32))[None, :, None]
    return ((w[:, None, :] >> shifts) & 0xF).reshape(-1, w.shape[1]).astype(np.int64)


def unpack_rows(words):
    """The unsigned nibbles of int32 words (R, C) packed 8 per word along the last dim, lowest
    first: (R, 8C) values in [0, 15] (qzeros' layout)."""
    w = np.asarray(words).astype("<i4").view("<u4")
    shifts = (4 * np.arange(8, dtype=np.uint32))[None, None, :]
    return ((w[:, :, None] >> shifts) & 0xF).reshape(w.shape[0], -1).astype(np.int64)


def _tensor(checkpoint, key, code, shape, what):
    from ._safetensors import CheckpointError
    if key not in checkpoint:
        raise CheckpointError(f"tensor {key!r} is missing from the checkpoint ({checkpoint.describe()})")
    f = checkpoint.file(key)
    if f.entries[key][0] != code or f.shape(key) != shape:
        raise CheckpointError(f"{f.path}: tensor {key!r} is {f.entries[key][0]} {f.shape(key)} but {what} needs "
                              f"{code} {shape}")
    return f.bits(key), f.path


def convert(checkpoint, name, N, K, config):
    """(int32 words (N, ceil(K / 8)) of DTorch's int4 layout, float32 scales (N, ceil(K / 32)), the
    keys read) of the GPTQ Linear ``name`` (N, K). A tensor of the wrong dtype or shape, a zero
    point that is not the symmetric 8, an act-order g_idx or a scale that is not finite is a
    ValueError naming the tensor."""
    from ._safetensors import CheckpointError
    group = config.group_size or K
    if K % 8 or N % 8:
        raise CheckpointError(f"{checkpoint.describe()}: GPTQ Linear {name!r} is {N}x{K}: its in_features and "
                              "out_features must be multiples of 8 (8 values per int32 word)")
    if group % GROUP:
        raise CheckpointError(f"{config.file}: GPTQ group_size=-1 makes {name!r} one group of its {K} input "
                              f"features, which is not a multiple of {GROUP}")
    G = -(-K // group)
    what = f"a 4-bit GPTQ {N}x{K} weight in groups of {group}"
    qweight, _ = _tensor(checkpoint, f"{name}.qweight", "I32", (K // 8, N), what)
    qzeros, zpath = _tensor(checkpoint, f"{name}.qzeros", "I32", (G, N // 8), what)
    scales, spath = _tensor(checkpoint, f"{name}.scales", "F16", (G, N), what)
    keys = [f"{name}.qweight", f"{name}.qzeros", f"{name}.scales"]
    consecutive = np.arange(K) // group
    if f"{name}.g_idx" in checkpoint:
        g_idx, gpath = _tensor(checkpoint, f"{name}.g_idx", "I32", (K,), what)
        keys.append(f"{name}.g_idx")
        if not np.array_equal(g_idx, consecutive):
            i = int(np.flatnonzero(g_idx != consecutive)[0])
            raise CheckpointError(f"{gpath}: tensor '{name}.g_idx' puts input feature {i} in group {int(g_idx[i])}, "
                                  f"not {i // group} (desc_act={config.desc_act}): act-order GPTQ permutes the "
                                  "groups, which DTorch's int4 layout cannot hold")
    elif config.desc_act:
        raise CheckpointError(f"{config.file}: GPTQ desc_act=True but '{name}.g_idx', the act-order groups, is "
                              "missing from the checkpoint")
    zeros = unpack_rows(qzeros) + config.zero_offset
    if not np.all(zeros == 8):
        g, o = (int(v[0]) for v in np.nonzero(zeros != 8))
        raise CheckpointError(f"{zpath}: tensor '{name}.qzeros' holds zero point {int(zeros[g, o])} for group {g}, "
                              f"output {o} (stored {int(zeros[g, o]) - config.zero_offset}): DTorch reads symmetric "
                              "4-bit GPTQ, whose zero points are all 8")
    scales = np.asarray(scales, np.float32)      # float16 -> float32: exact
    if not np.all(np.isfinite(scales)):
        raise CheckpointError(f"{spath}: tensor '{name}.scales' holds a scale that is not finite")
    # (q - 8) & 0xF == q ^ 8 for q in [0, 15], nibble by nibble; feature 8r + j sits in bits 4j of
    # word r in both layouts, so each GPTQ column of words is one of our rows
    words = np.ascontiguousarray((np.asarray(qweight, "<i4").view("<u4") ^ np.uint32(0x88888888)).T).view("<i4")
    ours = scales.T[:, (np.arange(-(-K // GROUP)) * GROUP) // group]
    return words, np.ascontiguousarray(ours), keys


def load(model, checkpoint, names, config):
    """Gives every QuantizedLinear of ``names`` its qweight and scale converted from the GPTQ
    checkpoint, laid out into the placements the parallel styles gave them. Returns the keys read."""
    from .nn.module import distribute_bits
    used = []
    for name in names:
        module = model.get_submodule(name)
        words, scale, keys = convert(checkpoint, name, module.out_features, module.in_features, config)
        module.qweight = distribute_bits(words, _dtype.int32, module.qweight.device_mesh, module.qweight.placements)
        module.scale = distribute_bits(scale, _dtype.float32, module.scale.device_mesh, module.scale.placements)
        used += keys
    return used


def weights_name(path):
    """The weights' file stem: AutoGPTQ's quantize_config.json may name its own
    (``model_file_base_name``, e.g. gptq_model-4bit-128g) where no model.safetensors is."""
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "model.safetensors")) or \
            os.path.exists(os.path.join(path, "model.safetensors.index.json")):
        return "model"
    side = os.path.join(path, "quantize_config.json")
    try:
        with open(side) as f:
            base = json.load(f).get("model_file_base_name")
    except (OSError, ValueError, AttributeError):
        return "model"
    return base if isinstance(base, str) and base and "/" not in base and ".." not in base else "model"
