"""safetensors files and indexes that the fuzzer (tests/fuzz/python/fuzz_safetensors.py) found the
reader mishandling: each is refused with a CheckpointError naming the file and what is wrong,
where it raised a TypeError or OverflowError from inside, or took a tensor whose element count
wrapped around in int64."""
import json
import struct

import pytest

from dtorch._safetensors import CheckpointError, Checkpoint, SafetensorsFile


def _file(path, header, data=b""):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize("entry, message", [
    # 2**32 * 2**32 float32 elements: a product in int64 wraps to 0 bytes, which [0, 0] holds
    ({"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}, "bad shape .*: more than 2\\*\\*48 elements"),
    # a dim past int64: np.prod raised OverflowError
    ({"dtype": "F32", "shape": [2**70], "data_offsets": [0, 4]}, "bad shape .*: more than 2\\*\\*48 elements"),
    # empty, but a dim numpy cannot make an array of
    ({"dtype": "F32", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]},
     "bad shape .*: more than 2\\*\\*48 elements"),
    # a dtype that is no string: `in _DTYPES` raised TypeError (unhashable)
    ({"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}, "unsupported dtype \\['F32'\\]"),
    ({"dtype": {"F32": 1}, "shape": [1], "data_offsets": [0, 4]}, "unsupported dtype"),
    # JSON true is no size or offset
    ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "bad shape \\[True\\]"),
    ({"dtype": "BOOL", "shape": [1], "data_offsets": [False, True]}, "bad data_offsets \\[False, True\\]"),
])
def test_bad_entries_are_refused(tmp_path, entry, message):
    path = _file(tmp_path / "x.safetensors", {"w": entry}, b"\0" * 8)
    with pytest.raises(CheckpointError, match=f"x.safetensors: tensor 'w': {message}"):
        SafetensorsFile(path)


def test_an_empty_tensor_with_large_dims_reads(tmp_path):
    """The bound is on the dims other than 0: an empty tensor of dims numpy takes still reads."""
    path = _file(tmp_path / "x.safetensors", {"w": {"dtype": "F32", "shape": [0, 2**20, 2**20], "data_offsets": [0, 0]}})
    f = SafetensorsFile(path)
    assert f.shape("w") == (0, 2**20, 2**20) and f.bits("w").shape == (0, 2**20, 2**20)


@pytest.mark.parametrize("shard", [5, None, ["a.safetensors"], {"a": 1}, "", "/etc/passwd", "../a.safetensors",
                                   "sub/../../a.safetensors"])
def test_index_names_only_files_of_the_directory(tmp_path, shard):
    """A weight_map value that is no file name of the directory: os.path.join raised TypeError for
    a number, set() for a list, and an absolute or ".." path was read wherever it pointed."""
    _file(tmp_path / "a.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: bad index: tensor 'w' is in .*, which is "
                                              "not the name of a file in the directory"):
        Checkpoint(tmp_path)


def test_index_of_plain_names_still_reads(tmp_path):
    _file(tmp_path / "a.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
          struct.pack("<f", 2.5))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "a.safetensors"}}))
    assert Checkpoint(tmp_path).file("w").numpy("w").tolist() == [2.5]
