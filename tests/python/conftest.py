"""Shared fixtures and independent references for the DTorch Python suite.

Run from this directory (tests/python) so that the source tree's bindings/ does not shadow the
installed package:  ../../.venv/bin/python -m pytest
"""
import os
import signal
import time

import numpy as np
import pytest

import dtorch

MODES = ("thread", "process")

# How long a test waits for something that must happen (a failure reaching a future, a wake-up, a
# process leaving): long enough that a loaded machine cannot break it. Tests assert that it came,
# never how fast; how fast is measured in bench/.
PATIENCE_S = 60.0


def wait_for(condition, timeout=PATIENCE_S):
    """Polls condition() until it holds or timeout seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def _start(mode):
    dtorch.shutdown()
    dtorch.init(workers=mode)


@pytest.fixture(params=MODES)
def mode(request):
    """Restarts the runtime in the given worker mode for the test and stops it afterwards."""
    _start(request.param)
    yield request.param
    dtorch.shutdown()


@pytest.fixture(scope="module")
def thread_runtime():
    """One thread-worker runtime for a whole module (models are slow to build per test); a module
    asks for it with pytestmark = pytest.mark.usefixtures("thread_runtime")."""
    _start("thread")
    yield "thread"
    dtorch.shutdown()


@pytest.fixture
def process_mode():
    """The runtime with one child process per device (for tests that signal workers)."""
    _start("process")
    yield "process"
    dtorch.shutdown()


# ---- meshes ------------------------------------------------------------------------------------

def mesh_1d(n):
    return dtorch.DeviceMesh("cpu", list(range(n)))


def mesh_2x2():
    return dtorch.init_device_mesh("cpu", (2, 2))


def mesh_2x2_explicit():
    return dtorch.DeviceMesh("cpu", [[4, 5], [6, 7]])


def mesh_3d():
    return dtorch.init_device_mesh("cpu", (2, 1, 2))


# name -> builder; builders run inside a test (after the runtime started)
MESHES = {
    "1": lambda: mesh_1d(1),
    "2": lambda: mesh_1d(2),
    "3": lambda: mesh_1d(3),
    "4": lambda: mesh_1d(4),
    "2x2": mesh_2x2,
    "2x2ids4567": mesh_2x2_explicit,
    "2x1x2": mesh_3d,
}


# ---- independent reference of torch.chunk sharding (nested over mesh dims) ---------------------

def chunk_range(length, k, r):
    """[start, stop) of piece r when torch.chunk splits `length` items into k chunks:
    chunk size ceil(length / k); trailing pieces may be short or empty."""
    c = -(-length // k) if length else 0
    start = min(r * c, length)
    stop = min(start + c, length) if c else length
    return start, stop


def local_slices(global_shape, mesh_shape, placements, coord):
    """Per-tensor-dim (start, stop) of the piece the device at mesh coordinate `coord` holds:
    mesh dim 0 splits first, each later mesh dim splits what the earlier ones left."""
    ranges = [(0, n) for n in global_shape]
    ndim = len(global_shape)
    for mdim, p in enumerate(placements):
        if isinstance(p, dtorch.Shard):
            d = p.dim % ndim if ndim else p.dim
            lo, hi = ranges[d]
            a, b = chunk_range(hi - lo, mesh_shape[mdim], coord[mdim])
            ranges[d] = (lo + a, lo + b)
    return ranges


def reference_locals(full, mesh_shape, placements):
    """The list of local numpy pieces, row-major mesh order."""
    out = []
    for coord in np.ndindex(*mesh_shape):
        sl = local_slices(full.shape, mesh_shape, placements, coord)
        out.append(full[tuple(slice(a, b) for a, b in sl)])
    return out


# ---- worker processes --------------------------------------------------------------------------

def worker_pids(parent=None):
    """{device id: pid} of the dtorch-worker children of parent (this process by default)."""
    me = os.getpid() if parent is None else parent
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if not any(b"dtorch-worker" in a for a in argv):
            continue
        dev = None
        if b"--device" in argv:
            dev = int(argv[argv.index(b"--device") + 1])
        found[dev] = int(entry)
    return found


def process_gone(pid):
    """Whether process pid has ended: no such process, or a zombie nobody reaped (a container's
    first process may not reap the orphans it adopts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def run_dirs_of(pid):
    """The run directories (/tmp/dtorch-XXXXXX) whose owner file names process pid."""
    found = []
    for name in os.listdir("/tmp"):
        path = os.path.join("/tmp", name)
        if not (name.startswith("dtorch-") and len(name) == 13):
            continue
        try:
            with open(os.path.join(path, "owner")) as f:
                if int(f.read().split()[0]) == pid:
                    found.append(path)
        except (OSError, ValueError, IndexError):
            pass
    return found


def is_bf16_representable(values):
    """True when every float32 value has zero low 16 bits (a bfloat16 value)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return bool(((bits & 0xFFFF) == 0).all())


def bf16_round(values):
    """Round-to-nearest-even float32 -> bfloat16, returned as float32 (reference)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    out = ((bits + rounding) >> 16 << 16).astype(np.uint32)
    return out.view(np.float32)


@pytest.fixture
def ctrl_c():
    """Ctrl-C as an interactive user's process meets it: Python's own SIGINT handler, which raises
    KeyboardInterrupt. A process started in the background by a shell without job control (as CI
    may start the suite) inherits SIGINT ignored, and Python then leaves it so."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture
def sigcont_guard():
    """Collects pids a test SIGSTOPs and always continues them at teardown."""
    stopped = []
    yield stopped
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

