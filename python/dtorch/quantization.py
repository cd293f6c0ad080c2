"""Quantized weights: the storage formulas, QuantizedLinear, and how a causal LM's decoder Linears
become quantized ones (``from_pretrained(..., quantization="int8" | "int4")``).

- int8, per output channel, symmetric: ``scale = max|w_row| / 127``, ``q = clip(round(w / scale),
  -127, 127)`` (one float32 scale per row).
- int4, groups of 32 consecutive input features per output row: ``scale = max|w_group| / 7``,
  ``q = clip(round(w / scale), -8, 7)``, two per byte (byte j holds feature 2j in its low four bits
  and 2j + 1 in its high four, two's complement; the last group of a row may be short).

``round`` is numpy's (half to even, as torch.round); a row or group of zeros has scale 0 and q 0.
The product divides by the stored float32 scale, so ``q * scale`` is the weight the kernels use.

On the devices a row's bytes are padded to whole int32 words, so ``qweight`` is an int32 DTensor
(N, ceil(K / 4)) for int8 and (N, ceil(K / 8)) for int4: the tensors keep types every op already
moves and only the products (the linear_int8 and linear_int4 ops) read the bytes. The checkpoint
layout (save_pretrained) stores the bytes themselves: ``<name>.qweight`` I8 (N, K) or U8
(N, ceil(K / 2)), ``<name>.scale`` F32 (N,) or (N, ceil(K / 32)), ``<name>.bias`` as it was, and
``quantization_config`` in config.json: ``{"quant_method": "dtorch", "bits": 8 | 4,
"group_size": None | 32}``.
"""
import numpy as np

from . import _C, _dtype
from ._ops import ids
from .nn.layers import Linear
from .nn.module import Module, new_parameter

GROUP = 32   # int4: input features per scale
METHODS = {"int8": 8, "int4": 4}


def bits_of(quantization):
    """8 or 4 for "int8" or "int4", None for None; any other value is a ValueError naming it."""
    if quantization is None:
        return None
    if isinstance(quantization, str) and quantization in METHODS:
        return METHODS[quantization]
    raise ValueError(f"quantization must be None, 'int8' or 'int4', got {quantization!r}")


# ---- the formulas ---------------------------------------------------------------------------------

def _scaled(w, amax, levels, lo, hi):
    scale = (amax / levels).astype(np.float32)
    safe = np.where(scale > 0, scale, 1).astype(np.float64)
    q = np.clip(np.round(w / safe), lo, hi)
    return np.where(scale > 0, q, 0).astype(np.int8), scale


def _row_blocks(N, K):
    """Row ranges of about a million weights: the float64 arithmetic's temporaries stay a few MB
    (reused by the allocator) instead of the whole weight's size, which made loading spend most of
    its time having the kernel zero fresh pages."""
    step = max(1, (1 << 20) // max(K, 1))
    return ((r, min(r + step, N)) for r in range(0, N, step))


def quantize_int8(weight):
    """(q int8 (N, K), scale float32 (N,)) of a float weight (N, K)."""
    w = np.asarray(weight)
    N, K = w.shape
    q, scale = np.empty((N, K), np.int8), np.empty(N, np.float32)
    for r0, r1 in _row_blocks(N, K):
        part = np.asarray(w[r0:r1], np.float64)
        amax = np.abs(part).max(axis=1, keepdims=True) if K else np.zeros((r1 - r0, 1))
        q[r0:r1], block_scale = _scaled(part, amax, 127, -127, 127)
        scale[r0:r1] = block_scale[:, 0]
    return q, scale


def dequantize_int8(q, scale):
    """The weight (N, K) float64 that int8 q and scale stand for."""
    return np.asarray(q, np.float64) * np.asarray(scale, np.float64)[:, None]


def quantize_int4(weight):
    """(packed uint8 (N, ceil(K / 2)), scale float32 (N, ceil(K / 32))) of a float weight (N, K)."""
    w = np.asarray(weight)
    N, K = w.shape
    G = -(-K // GROUP)
    packed, scale = np.empty((N, -(-K // 2)), np.uint8), np.empty((N, G), np.float32)
    for r0, r1 in _row_blocks(N, G * GROUP):
        padded = np.zeros((r1 - r0, G * GROUP))
        padded[:, :K] = w[r0:r1]
        groups = padded.reshape(r1 - r0, G, GROUP)
        q, block_scale = _scaled(groups, np.abs(groups).max(axis=2, keepdims=True), 7, -8, 7)
        packed[r0:r1] = pack_int4(q.reshape(r1 - r0, G * GROUP)[:, :K])
        scale[r0:r1] = block_scale[:, :, 0]
    return packed, scale


def pack_int4(q):
    """Values in [-8, 7] (N, K) two per byte: (N, ceil(K / 2)) uint8, even features low."""
    q = np.asarray(q, np.int64)
    N, K = q.shape
    nib = np.zeros((N, K + K % 2), np.uint8)
    nib[:, :K] = (q & 0xF).astype(np.uint8)
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)


def unpack_int4(packed, K):
    """The (N, K) values in [-8, 7] of packed (N, ceil(K / 2)) uint8."""
    packed = np.asarray(packed, np.uint8)
    nib = np.empty((packed.shape[0], packed.shape[1] * 2), np.int64)
    nib[:, 0::2] = packed & 0xF
    nib[:, 1::2] = packed >> 4
    nib = nib[:, :K]
    return np.where(nib >= 8, nib - 16, nib)


def dequantize_int4(packed, scale, K):
    """The weight (N, K) float64 that packed int4 values and their group scales stand for."""
    q = unpack_int4(packed, K).astype(np.float64)
    return q * np.repeat(np.asarray(scale, np.float64), GROUP, axis=1)[:, :K]


def quantize(weight, bits):
    """(stored bytes, scale) of a float weight: int8 q or packed int4."""
    return quantize_int8(weight) if bits == 8 else quantize_int4(weight)


def dequantize(stored, scale, bits, K):
    return dequantize_int8(stored, scale) if bits == 8 else dequantize_int4(stored, scale, K)


def stored_shapes(out_features, in_features, bits):
    """(the bytes' shape, the scale's shape) a checkpoint holds for an (N, K) weight."""
    N, K = out_features, in_features
    if bits == 8:
        return (N, K), (N,)
    return (N, -(-K // 2)), (N, -(-K // GROUP))


def to_words(stored):
    """A checkpoint's bytes (N, B) as the int32 words (N, ceil(B / 4)) the devices hold."""
    raw = np.ascontiguousarray(stored).view(np.uint8)
    N, B = raw.shape
    padded = np.zeros((N, -(-B // 4) * 4), np.uint8)
    padded[:, :B] = raw
    return padded.view("<i4")


def from_words(words, nbytes, bits):
    """The checkpoint's bytes (N, nbytes) of the devices' int32 words (int8 for bits 8, else uint8)."""
    raw = np.ascontiguousarray(np.asarray(words, "<i4")).view(np.uint8)[:, :nbytes]
    return np.ascontiguousarray(raw.view(np.int8) if bits == 8 else raw)


# ---- the module -----------------------------------------------------------------------------------

def _zeros(shape, mesh, dtype):
    from . import _factory
    return _factory.zeros(shape, device_mesh=mesh, dtype=dtype)


class QuantizedLinear(Module):
    """y = x @ dequantized(qweight).T + bias, computed from the quantized bytes (linear_int8 or
    linear_int4): ``qweight`` int32 words (out_features, ceil(in_features / 4 or 8)), ``scale``
    float32 (out_features,) for int8 or (out_features, ceil(in_features / 32)) for int4, ``bias``
    float32 or None. An input of another floating dtype is computed in float32 and the result cast
    back to it."""

    def __init__(self, in_features, out_features, bits, bias=True, device_mesh=None):
        super().__init__()
        if bits not in (8, 4):
            raise ValueError(f"QuantizedLinear: bits must be 8 or 4, got {bits!r}")
        self.in_features, self.out_features, self.bits = int(in_features), int(out_features), bits
        N, K = self.out_features, self.in_features
        words = -(-K // (4 if bits == 8 else 8))
        self.qweight = new_parameter((N, words), _dtype.int32, device_mesh, _zeros)
        self.scale = new_parameter((N,) if bits == 8 else (N, -(-K // GROUP)), _dtype.float32, device_mesh, _zeros)
        if bias:
            self.bias = new_parameter((N,), _dtype.float32, device_mesh, _zeros)
        else:
            self.register_parameter("bias", None)

    @property
    def op_name(self):
        return "linear_int8" if self.bits == 8 else "linear_int4"

    def forward(self, input):
        dtype = input.dtype
        x = input if dtype == _dtype.float32 else input.to(_dtype.float32)
        tensors = (x, self.qweight, self.scale) + (() if self.bias is None else (self.bias,))
        y = _C._op(ids[self.op_name], tensors, None, None, None)
        return y if dtype == _dtype.float32 else y.to(dtype)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int{self.bits}")


def quantize_modules(model, bits, quantize_lm_head=False, only=None):
    """Replaces every Linear of ``model.model.layers`` (and lm_head with ``quantize_lm_head``) for
    which ``only(name)`` holds (every one without ``only``) by a QuantizedLinear of the same shape on
    the same mesh (MetaTensors inside meta_device()); returns their dotted names."""
    names = [name for name, m in model.named_modules()
             if isinstance(m, Linear) and (name.startswith("model.layers.") or (quantize_lm_head and name == "lm_head"))
             and (only is None or only(name))]
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, attr)
        setattr(parent, attr, QuantizedLinear(old.in_features, old.out_features, bits, bias=old.bias is not None,
                                              device_mesh=old.weight.device_mesh))
    return names


def check_group_split(module, size):
    """A ValueError naming the split when laying an int4 module's input features out over ``size``
    devices (torch's chunks of its int32 words and of its scales) would cut a group of 32."""
    if module.bits != 4 or size == 1:
        return
    K = module.in_features
    W, G = -(-K // 8), -(-K // GROUP)
    cw, cg = -(-W // size), -(-G // size)
    for i in range(size):
        w0, g0 = min(i * cw, W), min(i * cg, G)
        wn, gn = min(cw, W - w0), min(cg, G - g0)
        feats = min(wn * 8, K - w0 * 8)
        if (wn or gn) and (w0 * 8 != g0 * GROUP or gn != -(-feats // GROUP)):
            raise ValueError(f"int4 weights: splitting in_features={K} ({G} groups of {GROUP}) over tp={size} "
                             f"devices would cut a group of {GROUP} input features: device {i} would start at "
                             f"feature {w0 * 8}; choose a tp size that gives every device whole groups")


# ---- checkpoints ----------------------------------------------------------------------------------

def config_of(bits):
    """The quantization_config config.json records for a model quantized to ``bits``."""
    return {"quant_method": "dtorch", "bits": bits, "group_size": GROUP if bits == 4 else None}


def bits_of_config(config, file):
    """The bits of a config.json's quantization_config (None without one); one that is not this
    layout's is a ValueError naming the file."""
    if config is None:
        return None
    want = {8: config_of(8), 4: config_of(4)}
    if isinstance(config, dict):
        for bits, fields in want.items():
            if config == fields:
                return bits
    raise ValueError(f"{file}: quantization_config {config!r} is not one DTorch reads (its own: "
                     f"{want[8]!r} or {want[4]!r})")


def load_quantized(model, checkpoint, names, bits, stored, aliases=None):
    """Gives every QuantizedLinear of ``names`` its qweight and scale, laid out into the placements
    the parallel styles gave their MetaTensors: from the checkpoint's ``<name>.qweight`` and
    ``<name>.scale`` (``stored``: a quantized checkpoint) or by quantizing ``<name>.weight`` here, on
    the host, so that each device receives only its quantized slices (``aliases``: {module: the module
    whose weight it shares when the checkpoint has none of its own}, a tied lm_head's embedding). A
    tensor of the wrong dtype or
    shape is a CheckpointError (a ValueError) naming it and the file. Returns the keys read."""
    from ._safetensors import CheckpointError
    from .nn.module import distribute_bits
    used = []
    for name in names:
        module = model.get_submodule(name)
        N, K = module.out_features, module.in_features
        q_shape, s_shape = stored_shapes(N, K, bits)
        if stored:
            keys = (f"{name}.qweight", f"{name}.scale")
            expect = ((("I8" if bits == 8 else "U8"), q_shape), ("F32", s_shape))
            for key, (code, shape) in zip(keys, expect):
                if key not in checkpoint:
                    raise CheckpointError(f"tensor {key!r} is missing from the checkpoint ({checkpoint.describe()})")
                f = checkpoint.file(key)
                if f.entries[key][0] != code or f.shape(key) != shape:
                    raise CheckpointError(f"{f.path}: tensor {key!r} is {f.entries[key][0]} {f.shape(key)} but an int{bits} "
                                          f"{N}x{K} weight needs {code} {shape}")
            q = checkpoint.file(keys[0]).bits(keys[0])
            scale = checkpoint.file(keys[1]).bits(keys[1])
            if not np.all(np.isfinite(scale)):
                raise CheckpointError(f"{checkpoint.file(keys[1]).path}: tensor {keys[1]!r} holds a scale that is not "
                                      "finite")
            used += keys
        else:
            key = f"{name}.weight"
            if key not in checkpoint and name in (aliases or {}):
                key = f"{aliases[name]}.weight"
            if key not in checkpoint:
                raise CheckpointError(f"tensor {key!r} is missing from the checkpoint ({checkpoint.describe()})")
            f = checkpoint.file(key)
            if f.shape(key) != (N, K) or f.dtype(key) is None or not f.dtype(key).is_floating_point:
                raise CheckpointError(f"{f.path}: tensor {key!r} is {f.entries[key][0]} {f.shape(key)} but the model "
                                      f"(from its config) expects a floating ({N}, {K})")
            q, scale = quantize(f.numpy(key), bits)
            used.append(key)
        module.qweight = distribute_bits(to_words(q), _dtype.int32, module.qweight.device_mesh,
                                         module.qweight.placements)
        module.scale = distribute_bits(np.ascontiguousarray(scale, np.float32), _dtype.float32,
                                       module.scale.device_mesh, module.scale.placements)
    return used


def stored_state(model, names, bits):
    """{key: host array} of the quantized modules' checkpoint layout (qweight bytes, scale)."""
    out = {}
    for name in names:
        module = model.get_submodule(name)
        q_shape, _ = stored_shapes(module.out_features, module.in_features, bits)
        out[f"{name}.qweight"] = from_words(module.qweight.numpy(), q_shape[1], bits)
        out[f"{name}.scale"] = np.ascontiguousarray(module.scale.numpy(), np.float32)
    return out
