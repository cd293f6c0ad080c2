"""safetensors checkpoints: reading straight into each device's slice, and writing.

The format: an 8-byte little-endian header length N, N bytes of JSON ({name: {"dtype", "shape",
"data_offsets": [begin, end]}, optionally "__metadata__"}), then the tensors' raw bytes, offsets
counted from the end of the header. A model directory holds one ``model.safetensors`` or several
shards listed by ``model.safetensors.index.json`` ({"weight_map": {name: file}}); diffusers names
the same files ``diffusion_pytorch_model.*`` (``weights_name=``).

Reading opens each file once (a regular file only: a FIFO, device or directory is refused before
anything is read from it), checks the header against the file's size, and reads each tensor's bytes
with pread, one large read per tensor, into one buffer that ``distribute_bits`` copies each device's
piece out of (bfloat16 as uint16: numpy has none). Not a memory map: a file that shrinks while it is
mapped (another process saving into the same directory truncates it) kills the process with SIGBUS
at the first touch of a page past its new end, which no size check made before the touch can rule
out; pread returns short instead, which is an error naming the file and the tensor. What it costs
against a map: one more copy of each byte (page cache to the buffer, by the kernel, without a page
fault per 4 KiB) and the buffer, as large as the largest tensor, allocated once per load; no more
bytes are read from the file (each of a tensor's bytes goes to some device either way).
"""
import json
import math
import os
import stat
import struct
import sys

import numpy as np

from . import _dtype

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DIFFUSERS_WEIGHTS = "diffusion_pytorch_model"  # diffusers' weights_name: its files' common stem
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit
_MAX_ELEMENTS = 1 << 48          # a DTensor's limit (dt_layout_check_shape)

# safetensors dtype -> (dtorch dtype, numpy dtype of the stored items); I8 and U8 hold the bytes of
# quantized weights (dtorch.quantization), which no DTensor has as its dtype: None
_DTYPES = {
    "F32": (_dtype.float32, np.dtype("<f4")),
    "F16": (_dtype.float16, np.dtype("<f2")),
    "BF16": (_dtype.bfloat16, np.dtype("<u2")),
    "I64": (_dtype.int64, np.dtype("<i8")),
    "I32": (_dtype.int32, np.dtype("<i4")),
    "BOOL": (_dtype.bool, np.dtype("bool")),
    "I8": (None, np.dtype("i1")),
    "U8": (None, np.dtype("u1")),
}
_NAMES = {dt.name: name for name, (dt, _) in _DTYPES.items() if dt is not None}


class CheckpointError(ValueError, OSError):
    """A checkpoint that cannot be read as it should: the message names the file and the tensor.
    An OSError, as transformers and diffusers raise for a model directory, config or weights file
    that is missing or unreadable; a ValueError for what is wrong inside a file."""


def open_regular(path):
    """``path`` opened for reading in binary, when it is a regular file; anything else (a FIFO, whose
    open would wait for a writer, a device, a directory) is a CheckpointError naming it. Opened
    without blocking and checked on the descriptor itself, so the file checked is the file read.
    Failing to open it raises the OSError as it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket")
            raise CheckpointError(f"{path}: not a regular file ({kind})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_json(path):
    """The JSON value of a regular file (``open_regular``)."""
    with open_regular(path) as f:
        return json.loads(f.read())


def read_json_object(file, what="config"):
    """The JSON object (a dict) of the regular file ``file``, a model's ``what``: a file that cannot
    be read, is no JSON or holds something else is a CheckpointError (an OSError) naming it."""
    try:
        value = read_json(file)
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read the {what}: {e.strerror or e}") from None
    except ValueError as e:
        raise CheckpointError(f"{file}: bad {what}: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file}: the {what} is not a JSON object")
    return value


class SafetensorsFile:
    """One .safetensors file: its header parsed and checked against the file's size, the file kept
    open to read the tensors from (``bits``)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._file = open_regular(self.path)
            size = os.fstat(self._file.fileno()).st_size
            head = self._file.read(8)
            if size < 8:
                raise CheckpointError(f"{self.path}: not a safetensors file ({size} bytes, shorter than the 8-byte "
                                      "header length)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"{self.path}: bad header: its length {n} runs past the end of the file "
                                      f"({size} bytes): the file is truncated or not safetensors")
            raw = self._file.read(n)
        except CheckpointError:
            raise
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read: {e.strerror or e}") from None
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{self.path}: bad header: not JSON ({e})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: bad header: expected a JSON object, got {type(header).__name__}")
        self.metadata = header.pop("__metadata__", None) or {}
        self._start, self._size = 8 + n, size
        self.entries = {name: self._entry(name, info) for name, info in header.items()}

    def _entry(self, name, info):
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise CheckpointError(f"{where}: bad header entry {info!r} (needs dtype, shape and data_offsets)")
        if not isinstance(info["dtype"], str) or info["dtype"] not in _DTYPES:
            raise CheckpointError(f"{where}: unsupported dtype {info['dtype']!r} (supported: {', '.join(_DTYPES)})")
        shape, offsets = info["shape"], info["data_offsets"]
        if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
            raise CheckpointError(f"{where}: bad shape {shape!r}")
        # counted exactly (a product in int64 wraps: [2**32, 2**32] would need 0 bytes); the dims
        # other than 0 bound too, as numpy and dtorch take no tensor past them even when empty
        if math.prod(s for s in shape if s) > _MAX_ELEMENTS:
            raise CheckpointError(f"{where}: bad shape {shape!r}: more than 2**48 elements")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"{where}: bad data_offsets {offsets!r}")
        items = _DTYPES[info["dtype"]][1]
        want = math.prod(shape) * items.itemsize
        if offsets[1] - offsets[0] != want:
            raise CheckpointError(f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, but "
                                  f"{info['dtype']} {tuple(shape)} needs {want}")
        if self._start + offsets[1] > self._size:
            raise CheckpointError(f"{where}: its bytes end at {self._start + offsets[1]} but the file has "
                                  f"{self._size}: the file is truncated")
        return info["dtype"], tuple(shape), offsets[0]

    def dtype(self, name):
        return _DTYPES[self.entries[name][0]][0]

    def shape(self, name):
        return self.entries[name][1]

    def nbytes(self, name):
        code, shape, _ = self.entries[name]
        return int(np.prod(shape, dtype=np.int64)) * _DTYPES[code][1].itemsize

    def bits(self, name, scratch=None):
        """The stored items of ``name`` (bfloat16 as uint16), read from the file into an array of their
        own, or into the front of ``scratch`` (a uint8 array of at least ``nbytes(name)``: the result
        is a view of it, good until the next read into it). A file that shrank below them since it
        was opened is a CheckpointError naming it."""
        code, shape, begin = self.entries[name]
        items = _DTYPES[code][1]
        size = self.nbytes(name)
        raw = np.empty(size, np.uint8) if scratch is None else scratch[:size]
        buffer = memoryview(raw)
        at, end = self._start + begin, self._start + begin + size
        while at < end:
            try:
                n = os.preadv(self._file.fileno(), [buffer[at - self._start - begin:]], at)
            except OSError as e:
                raise CheckpointError(f"{self.path}: tensor {name!r}: cannot read: {e.strerror or e}") from None
            if n == 0:
                raise CheckpointError(f"{self.path}: tensor {name!r}: its bytes end at {end} but the file shrank to "
                                      f"{os.fstat(self._file.fileno()).st_size} bytes after it was opened")
            at += n
        return raw.view(items).reshape(shape)

    def numpy(self, name):
        """The values of ``name`` as a numpy array (bfloat16 widened to float32, exactly)."""
        bits = self.bits(name)
        if self.dtype(name) == _dtype.bfloat16:
            return (bits.astype(np.uint32) << 16).view(np.float32)
        return bits


class Checkpoint:
    """The tensors of a model directory (or of one .safetensors file), by name."""

    def __init__(self, path, weights_name="model"):
        path = os.fspath(path)
        single_file, index_file = f"{weights_name}.safetensors", f"{weights_name}.safetensors.index.json"
        if os.path.isfile(path):
            files = {os.path.basename(path): path}
            self._where = None
            self.directory = os.path.dirname(path)
        else:
            self.directory = path
            index = os.path.join(path, index_file)
            single = os.path.join(path, single_file)
            if os.path.exists(index):
                try:
                    weight_map = read_json(index)["weight_map"]
                    if not isinstance(weight_map, dict):
                        raise TypeError("weight_map is not an object")
                except CheckpointError:
                    raise
                except (OSError, ValueError, KeyError, TypeError) as e:
                    raise CheckpointError(f"{index}: bad index: {e}") from None
                for key, name in weight_map.items():
                    # a shard is a file of this directory: a name that leaves it (an absolute path,
                    # "..") could make the index read any file of the machine, a FIFO or a terminal
                    if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in name.split("/"):
                        raise CheckpointError(f"{index}: bad index: tensor {key!r} is in {name!r}, which is not "
                                              "the name of a file in the directory")
                self._where = dict(weight_map)
                files = {name: os.path.join(path, name) for name in sorted(set(weight_map.values()))}
            elif os.path.exists(single):
                files, self._where = {single_file: single}, None
            else:
                raise CheckpointError(f"{path}: no {single_file} or {index_file} there")
        self.files = {}
        for name, file in files.items():
            if not os.path.exists(file):
                raise CheckpointError(f"{file}: listed in {index_file} but missing")
            self.files[name] = SafetensorsFile(file)
        if self._where is None:
            (only,) = self.files
            self._where = {key: only for key in self.files[only].entries}
        for key, name in self._where.items():
            if key not in self.files[name].entries:
                raise CheckpointError(f"{self.files[name].path}: tensor {key!r} is listed in {index_file} but not "
                                      "in the file")

    def keys(self):
        return self._where.keys()

    def __contains__(self, key):
        return key in self._where

    def file(self, key):
        """The SafetensorsFile that holds ``key``."""
        return self.files[self._where[key]]

    def describe(self):
        """Where the tensors are, for error messages."""
        return ", ".join(f.path for f in self.files.values())

    def dtypes(self, exclude=()):
        """How many tensors of each dtype the checkpoint holds (not counting the keys ``exclude``)."""
        counts = {}
        for key in self._where:
            if key in exclude:
                continue
            dt = self.file(key).dtype(key)
            counts[dt] = counts.get(dt, 0) + 1
        return counts

    def floating_dtype(self):
        """The floating dtype most of its floating tensors have (float32 when it has none): the
        dtype a model loaded with ``dtype=None`` keeps. The tensors of a quantized layer (those
        beside a ``<layer>.qweight``: its scales, float32 in DTorch's layout, float16 in GPTQ's) are
        not counted: they say nothing of the model's dtype."""
        quantized = {key for key in self._where if key.rpartition(".")[0] + ".qweight" in self._where}
        counts = {dt: n for dt, n in self.dtypes(quantized).items() if dt is not None and dt.is_floating_point}
        return max(counts, key=counts.get) if counts else _dtype.float32


def load_checkpoint(module, checkpoint, *, skip=(), progress=None):
    """Gives every parameter and persistent buffer of ``module`` its tensor from ``checkpoint`` (a
    Checkpoint or a path), laid out straight into the tensor's mesh and placements and cast to its
    dtype on the devices. ``skip``: keys not to load (e.g. a tied weight). A missing tensor or a shape
    that disagrees is a CheckpointError naming the key and the file; tensors the module does not have
    are returned (the caller decides whether to warn). ``progress``: a bar on stderr (None: when it
    is a terminal)."""
    from .nn.module import distribute_bits
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(checkpoint)
    entries = [e for e in module._state_entries() if e[0] not in skip]
    current = {}
    for key, owner, name, registry in entries:
        target = getattr(owner, registry)[name]
        if key not in ckpt:
            raise CheckpointError(f"tensor {key!r} is missing from the checkpoint ({ckpt.describe()})")
        f = ckpt.file(key)
        if f.dtype(key) is None:
            raise CheckpointError(f"{f.path}: tensor {key!r} holds {f.entries[key][0]} bytes, which only quantized "
                                  "weights have (their config.json's quantization_config says how to read them)")
        if f.shape(key) != tuple(target.shape):
            raise CheckpointError(f"{f.path}: tensor {key!r} has shape {f.shape(key)} but the model (from its config) "
                                  f"expects {tuple(target.shape)}")
        current[key] = target
    done = {}
    # every tensor is read into this one buffer: distribute_bits has copied each device's piece out
    # of it when it returns, and its pages are faulted in once, not once per tensor
    scratch = np.empty(max([ckpt.file(key).nbytes(key) for key in current] + [0]), np.uint8)
    bar = _progress(len(entries), "Loading weights", progress)
    try:
        for key, owner, name, registry in entries:
            target = current[key]
            if id(target) not in done:
                f = ckpt.file(key)
                value = distribute_bits(f.bits(key, scratch), f.dtype(key), target.device_mesh, target.placements)
                if value.dtype != target.dtype:
                    value = value.to(target.dtype)
                done[id(target)] = (target, value)
            setattr(owner, name, done[id(target)][1])
            bar.update(1)
    finally:
        bar.close()
    expected = {key for key, *_ in module._state_entries()}
    return [key for key in ckpt.keys() if key not in expected]


# ---- writing ----------------------------------------------------------------------------------

def _host(value):
    """(safetensors dtype, C-contiguous numpy array of its items) of a DTensor or host array."""
    from ._tensor import DTensor
    if isinstance(value, DTensor):
        array = value.numpy()
        if value.dtype == _dtype.bfloat16:  # fetched as float32 holding bfloat16 values: the top 16 bits
            return "BF16", np.ascontiguousarray((np.ascontiguousarray(array).view(np.uint32) >> 16).astype("<u2"))
        return _NAMES[value.dtype.name], np.ascontiguousarray(array)
    array = np.asarray(value)
    if array.dtype in (np.int8, np.uint8):   # the bytes of quantized weights
        return ("I8" if array.dtype == np.int8 else "U8"), np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":
        return "BF16", np.ascontiguousarray(array).view("<u2")
    dt = _dtype._from_numpy(array.dtype)
    if dt is None:
        raise TypeError(f"save_file: unsupported dtype {array.dtype}")
    return _NAMES[dt.name], np.ascontiguousarray(array)


def save_file(tensors, path, metadata=None):
    """Writes ``tensors`` ({name: DTensor or array}) as one safetensors file: tensors ordered by item
    size (largest first) then name, so every one starts aligned; the header padded with spaces to
    a multiple of 8 bytes, as the safetensors library does."""
    items = [(name,) + _host(value) for name, value in tensors.items()]
    items.sort(key=lambda t: (-t[2].dtype.itemsize, t[0]))
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, code, array in items:
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, array in items:
            if array.nbytes:
                f.write(memoryview(array.reshape(-1)).cast("B"))


def parse_size(size):
    """Bytes from an int or a string such as "5GB", "10MB", "200KiB" (transformers' spelling)."""
    if isinstance(size, int):
        return size
    text = str(size).strip().upper()
    for suffix, factor in (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9), ("MB", 10**6),
                           ("KB", 10**3), ("B", 1)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def save_checkpoint(tensors, directory, max_shard_size="5GB", weights_name="model"):
    """Writes ``tensors`` into ``directory`` as model.safetensors, or as shards
    model-0000i-of-0000n.safetensors with model.safetensors.index.json when they pass
    ``max_shard_size`` (each shard holds whole tensors, in name order, as transformers does);
    ``weights_name`` replaces the stem "model" (diffusers: "diffusion_pytorch_model")."""
    single_file, index_file = f"{weights_name}.safetensors", f"{weights_name}.safetensors.index.json"
    limit = parse_size(max_shard_size)
    host = {name: value for name, value in tensors.items()}
    sizes = {name: int(np.prod(v.shape, dtype=np.int64)) * v.dtype.itemsize for name, v in host.items()}
    shards, current, used = [], {}, 0
    for name in host:
        if current and used + sizes[name] > limit:
            shards.append(current)
            current, used = {}, 0
        current[name] = host[name]
        used += sizes[name]
    shards.append(current)
    os.makedirs(directory, exist_ok=True)
    for stale in (single_file, index_file):
        if os.path.exists(os.path.join(directory, stale)):
            os.remove(os.path.join(directory, stale))
    if len(shards) == 1:
        save_file(shards[0], os.path.join(directory, single_file), {"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"{weights_name}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(directory, name), {"format": "pt"})
        weight_map.update({key: name for key in shard})
    with open(os.path.join(directory, index_file), "w") as f:
        json.dump({"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}, f, indent=2)


# ---- progress ---------------------------------------------------------------------------------

class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


class _LineBar:
    """A one-line bar on a terminal: label [#####.....] done/total."""

    def __init__(self, total, label, stream):
        self.total, self.label, self.stream, self.done = max(total, 1), label, stream, 0
        self._draw()

    def _draw(self):
        width = 30
        filled = width * self.done // self.total
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")
        self.stream.flush()

    def update(self, n):
        self.done += n
        self._draw()

    def close(self):
        self.stream.write("\n")
        self.stream.flush()


def _progress(total, label, enabled=None, unit="tensor"):
    """tqdm when it is installed, else a plain one-line bar on a terminal, else nothing.
    ``enabled``: True or False forces the choice; None shows a bar when stderr is a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _LineBar(total, label, sys.stderr)
    return tqdm(total=total, desc=label, unit=unit)
