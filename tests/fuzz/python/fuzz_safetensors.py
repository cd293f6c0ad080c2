"""Fuzzes the safetensors reader (dtorch._safetensors: SafetensorsFile and Checkpoint) with hostile
files: the 8-byte header length, the JSON header, dtypes, shapes, data_offsets, and a sharded
directory's index.

The contract: a file that is not a good checkpoint raises CheckpointError, OSError or another
ValueError, from a check in dtorch that says what is wrong; never another exception type, a hang, a
crash, or an allocation the file sized (the address space is capped at 2 GiB). A file that reads
gives every tensor with its declared shape and dtype, and its bytes are the ones the header points
at (read back with plain file reads, not the reader's mapping).

The input's first byte picks the form (its low two bits) and whether the rest is the content itself
(raw: libFuzzer's byte mutations of the seeds, with a dictionary of the format's words) or the
choices that build it (structured: headers of any JSON values where the reader expects numbers,
lists and names, with offsets mostly consistent so that the later checks are reached):
  0  one file, read by SafetensorsFile
  1  one file, read by Checkpoint(path)
  2  a sharded directory: model.safetensors.index.json, then its shards a.safetensors,
     b.safetensors, ... (raw: the parts split at SPLIT)
  3  a diffusers directory holding diffusion_pytorch_model.safetensors
"""
import json
import os
import struct
import sys

import atheris

import fuzzlib

with atheris.instrument_imports(include=["dtorch"]):
    from dtorch import _safetensors as st

SPLIT = b"\x00\x00SHARD\x00\x00"
WORK = fuzzlib.scratch_dir("safetensors")
KINDS = (st.CheckpointError, OSError, ValueError)
_ITEMS = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "BOOL": 1, "I8": 1, "U8": 1}


def _file(entries, data, metadata=True, pad=0):
    """safetensors bytes: entries {name: (dtype, shape, begin, end)} over data."""
    header = {"__metadata__": {"format": "pt"}} if metadata else {}
    for name, (dtype, shape, begin, end) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    raw = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(raw)) + raw + data


def seeds():
    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    one = _file({"w": ("F32", [2, 3], 0, 24)}, f32)
    mixed = _file({"a": ("F16", [2], 0, 4), "b": ("BF16", [1, 2], 4, 8), "c": ("I64", [1], 8, 16),
                   "d": ("I32", [], 16, 20), "e": ("BOOL", [3], 20, 23), "z": ("F32", [0, 4], 23, 23)},
                  bytes(range(23)), pad=3)
    index = json.dumps({"metadata": {"total_size": 40}, "weight_map": {"w": "a.safetensors", "v": "b.safetensors",
                                                                      "u": "b.safetensors"}}).encode()
    shard_b = _file({"v": ("I32", [2], 0, 8), "u": ("F32", [2], 8, 16)}, bytes(16))
    structured = [bytes([4 + form]) + bytes(range(i, 64 + i)) for form in range(4) for i in range(0, 40, 8)]
    return structured + [b"\x00" + one, b"\x00" + mixed, b"\x01" + one, b"\x01" + mixed, b"\x00" + _file({}, b"", metadata=False),
            b"\x02" + index + SPLIT + one + SPLIT + shard_b,
            b"\x03" + mixed, b"\x00" + struct.pack("<Q", 2) + b"{}", b"\x00" + b"\x08" + bytes(7)]


_NAMES = ["w", "v", "u", "__metadata__", ""]
_DTYPE_NAMES = list(_ITEMS) + ["F64", "f32", "U16", ""]


def _structured_file(fdp):
    """A header of 0..3 entries (any JSON where the reader expects its fields) and its data."""
    header, offset = {}, 0
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        name = fdp.PickValueInList(_NAMES)
        if fdp.ConsumeIntInRange(0, 7) == 0:
            header[name] = fuzzlib.json_value(fdp, _NAMES + _DTYPE_NAMES)
            continue
        dtype = fdp.PickValueInList(_DTYPE_NAMES) if fdp.ConsumeIntInRange(0, 7) else \
            fuzzlib.json_value(fdp, _DTYPE_NAMES)
        if fdp.ConsumeIntInRange(0, 5):
            shape = [fuzzlib.pick_int(fdp, 4) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        else:
            shape = fuzzlib.json_value(fdp, _DTYPE_NAMES)
        size = _ITEMS.get(dtype, 4) if isinstance(dtype, str) else 4
        for s in shape if isinstance(shape, list) else ():
            size *= s if isinstance(s, int) else 1
        size = size % (1 << 64)
        if fdp.ConsumeIntInRange(0, 5):
            offsets = [offset, offset + size]
        else:
            offsets = [fuzzlib.pick_int(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))] \
                if fdp.ConsumeBool() else fuzzlib.json_value(fdp)
        info = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        for key in list(info):
            if fdp.ConsumeIntInRange(0, 15) == 0:
                del info[key]
        header[name] = info
        if isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets):
            offset = max(offset, min(offsets[1], 1 << 12))
    raw = json.dumps(header).encode() + b" " * fdp.ConsumeIntInRange(0, 7)
    data_size = offset if fdp.ConsumeIntInRange(0, 3) else fdp.ConsumeIntInRange(0, 2 * offset + 8)
    n = len(raw) if fdp.ConsumeIntInRange(0, 7) else fuzzlib.pick_int(fdp, len(raw) + 8) % (1 << 64)
    return struct.pack("<Q", n) + raw + fdp.ConsumeBytes(data_size).ljust(data_size, b"\x00")


def _structured(form, fdp):
    """The files of a structured input: [(name, bytes)], the index first in form 2."""
    if form != 2:
        return [_structured_file(fdp)]
    shards = ["a.safetensors", "b.safetensors", "c.safetensors"]
    weight_map = {fdp.PickValueInList(_NAMES): fdp.PickValueInList(shards) if fdp.ConsumeIntInRange(0, 7) else
                  fuzzlib.json_value(fdp, shards) for _ in range(fdp.ConsumeIntInRange(0, 3))}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    if fdp.ConsumeIntInRange(0, 7) == 0:
        index = fuzzlib.json_value(fdp, ["weight_map"] + shards) if fdp.ConsumeBool() else \
            {"weight_map": fuzzlib.json_value(fdp, shards)}
    return [json.dumps(index).encode()] + [_structured_file(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))]


def _write(name, content):
    with open(os.path.join(WORK, name), "wb") as f:
        f.write(content)


def _check_file(sf):
    """Every tensor of a file that read: its shape, dtype and bytes as declared."""
    with open(sf.path, "rb") as f:
        whole = f.read()
    (n,) = struct.unpack("<Q", whole[:8])
    header = json.loads(whole[8:8 + n])
    for name, (code, shape, begin) in sf.entries.items():
        info = header[name]
        size = _ITEMS[info["dtype"]]
        for s in shape:
            size *= s
        if list(shape) != info["shape"] or any(type(s) is not int for s in shape) or code != info["dtype"]:
            raise fuzzlib.Finding(f"{name}: read as {code} {shape}, the header says {info}")
        bits = sf.bits(name)
        if bits.shape != tuple(shape) or bits.nbytes != size:
            raise fuzzlib.Finding(f"{name}: bits {bits.dtype} {bits.shape} for {code} {shape}")
        start = 8 + n + info["data_offsets"][0]
        if bits.tobytes() != whole[start:start + size]:
            raise fuzzlib.Finding(f"{name}: its bytes are not the file's at {start}")
        values = sf.numpy(name)
        if values.shape != tuple(shape) or (code == "BF16" and values.dtype.name != "float32"):
            raise fuzzlib.Finding(f"{name}: numpy() gives {values.dtype} {values.shape}")
        sf.dtype(name)


def test_one_input(data):
    if not data:
        return
    form, content = data[0] & 3, data[1:]
    if data[0] & 4:
        parts = _structured(form, atheris.FuzzedDataProvider(content))
    else:
        parts = content.split(SPLIT) if form == 2 else [content]
    content = parts[0]
    fuzzlib.clear_dir(WORK)
    try:
        if form == 0:
            _write("x.safetensors", content)
            _check_file(st.SafetensorsFile(os.path.join(WORK, "x.safetensors")))
            return
        if form == 1:
            _write("x.safetensors", content)
            ckpt = st.Checkpoint(os.path.join(WORK, "x.safetensors"))
        elif form == 2:
            _write(st.INDEX_FILE, parts[0])
            for i, part in enumerate(parts[1:27]):
                _write(chr(ord("a") + i) + ".safetensors", part)
            ckpt = st.Checkpoint(WORK)
        else:
            _write(st.DIFFUSERS_WEIGHTS + ".safetensors", content)
            ckpt = st.Checkpoint(WORK, weights_name=st.DIFFUSERS_WEIGHTS)
        for f in ckpt.files.values():
            _check_file(f)
        for key in ckpt.keys():
            if key not in ckpt.file(key).entries:
                raise fuzzlib.Finding(f"{key} is listed but its file does not hold it")
        ckpt.floating_dtype()
        ckpt.describe()
    except fuzzlib.Finding:
        raise
    except Exception as e:   # noqa: BLE001: any other exception is judged here
        fuzzlib.expect_clear(e, KINDS, "reading a safetensors file")


if __name__ == "__main__":
    fuzzlib.limit_memory(2)
    fuzzlib.main(test_one_input, seeds(),
                 dictionary=['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"weight_map"', '"F32"',
                             '"F16"', '"BF16"', '"I64"', '"I32"', '"BOOL"', '"F64"', "a.safetensors",
                             "b.safetensors", "18446744073709551615", "9223372036854775807", "-1", "1e999",
                             "true", "null", "[]", "{}"])
