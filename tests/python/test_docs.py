"""The docs name files that exist: every backquoted repository path in README.md and docs/*.md
(`actors/worker/act_peer.c`, `python/dtorch/models/llama.py`, `ops/op_table.h`) is a file or
folder of the checkout, and every backquoted bare file name (`dt_ring.c`) is the name of one. A
file renamed or moved without its docs fails here. Fenced code blocks are left out (they hold
commands and build outputs), and so are spans that are not plain paths (globs, templates such as
`ops/op_<family>.c`, URLs, absolute paths, commands with arguments)."""
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = ["README.md"] + sorted(os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
                              if name.endswith(".md"))

# A repository path: relative, path characters only, at least one folder.
_PATH = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)+/?$")
# A bare file name of the kinds the sources are made of.
_BARE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*\.(c|h|cu|py|md|sh|build|toml|map)$")
_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)   # also inside a list item
_SPAN = re.compile(r"`([^`\n]+)`")

# What the docs name on purpose and the checkout does not hold: build and install outputs, and
# files of other projects.
OUTPUTS = {
    "bin/dtorch-worker",              # meson install's worker executable
    "bench/bench_cuda_matmul",        # a program of a CUDA build (bench/bench_cuda_matmul.c)
    ".gpu-deps/deps.tar.xz",          # what tools/gpu-deps.sh packs
    "modeling_llama.py",              # transformers' Llama
}


def _spans(text):
    return _SPAN.findall(_FENCE.sub("", text))


def _names():
    """{bare file name} of every file under the checkout's source folders."""
    names = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
        names.update(files)
    return names


def missing_paths(text, root=ROOT, names=None):
    """The backquoted paths and bare file names of a markdown text that name nothing under root."""
    names = _names() if names is None else names
    missing = []
    for span in _spans(text):
        if span in OUTPUTS:
            continue
        if _PATH.match(span):
            if not os.path.exists(os.path.join(root, span)):
                missing.append(span)
        elif _BARE.match(span) and span not in names:
            missing.append(span)
    return missing


@pytest.mark.parametrize("doc", DOCS)
def test_named_files_exist(doc):
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        text = f.read()
    assert _spans(text), f"{doc}: no backquoted span found (is the extraction broken?)"
    assert missing_paths(text) == [], f"{doc} names files that are not in the checkout"


def test_a_wrong_path_is_caught():
    """The check can fail: a moved file, a renamed one and a file that never existed are reported;
    folders, templates, commands and what sits in fenced code are not paths to check."""
    text = ("`actors/act_worker.c` moved to `actors/worker/act_worker.c`; `bindings/dt_python.c` split;\n"
            "`dt_python.c` and `dt_op.c`; `ops/op_<family>.c`, `tools/run.sh test`, `/dev/shm`, `tcp://h:1`,\n"
            "`bindings/dtorch/` and `bin/dtorch-worker`\n"
            "```sh\nbuild-bench/bench/bench_roundtrip\n```\n"
            "1. a step:\n\n   ```c\n   `ops/old_file.c`\n   ```\n")
    assert missing_paths(text) == ["actors/act_worker.c", "bindings/dt_python.c", "dt_python.c"]
