"""Starting and stopping the runtime: the controller actor and the device actors."""
import atexit
import operator
import os
import subprocess
from typing import NamedTuple

from . import _C

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dtorch-worker")
if os.access(_WORKER, os.X_OK) and not os.environ.get("DTORCH_WORKER_PATH"):
    # process workers run the executable that ships with the package
    os.environ["DTORCH_WORKER_PATH"] = _WORKER


def init(workers=None, *, listen=None, key=None, worker_key=None, insecure=False):
    """Starts the runtime now. ``workers``: "thread" (device actors are threads of this process,
    the default) or "process" (each device actor is a child process); None reads
    DTORCH_WORKERS. Ops start it lazily otherwise.

    ``listen="tcp://ADDR:PORT"`` (ADDR a numeric IPv4 address or 0.0.0.0, PORT ``*`` for any)
    starts no worker: the controller listens there, and ``dtorch-worker --connect tcp://HOST:PORT
    --devices cpu:IDS --key FILE --server-key KEY`` started on any host serves the device ids it
    names (see docs/LAUNCH.md). The links use CURVE: ``worker_key`` is the workers' public key (40
    characters, or the key file ``generate_keypair`` wrote; the workers hold its secret) and the
    only one admitted; ``key`` a key pair file for the controller, None for a fresh one per run
    (``controller_public_key()`` is what workers pass as --server-key). ``insecure=True`` listens in
    plaintext with no authentication, for a network nobody else can reach."""
    if listen is None and (key is not None or worker_key is not None or insecure):
        raise ValueError("init: key, worker_key and insecure go with listen=")
    if workers is None:
        workers = os.environ.get("DTORCH_WORKERS") or "thread"
    if workers not in ("thread", "process"):
        raise ValueError(f"init: workers must be 'thread' or 'process', got {workers!r}")
    for name, value in (("listen", listen), ("key", key), ("worker_key", worker_key)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"init: {name} must be a str, got {type(value).__name__}")
    _C.init(0 if workers == "thread" else 1, os.environ.get("DTORCH_WORKER_PATH"),
            None if listen is None else os.fspath(listen), None if key is None else os.fspath(key),
            None if worker_key is None else os.fspath(worker_key), bool(insecure))


class WorkerInfo(NamedTuple):
    """What the runtime knows of one device's worker."""
    device: int
    state: str      # "waiting" (no worker yet), "serving" or "dead"
    remote: bool    # it came to a listening controller
    host: str       # as its worker said ("" before it did)
    pid: int        # its worker's process on that host (0 for a thread of this one)
    peer: str       # remote: where other workers reach it ("tcp://A.B.C.D:PORT")
    reason: str     # why it died ("" otherwise)


_STATES = ("waiting", "serving", "dead")


def worker_info(device):
    """The ``WorkerInfo`` of ``device`` (an id a mesh named, or one waited for)."""
    state, remote, host, pid, peer, reason = _C.worker_info(operator.index(device))
    return WorkerInfo(int(device), _STATES[state], remote, host, pid, peer, reason)


def listen_address():
    """Where a listening runtime listens, the port filled in (``tcp://ADDR:PORT``)."""
    return _C.listen_info()[0]


def controller_public_key():
    """The controller's public CURVE key: what workers pass as ``--server-key`` ("" when insecure)."""
    return _C.listen_info()[1]


def wait_for_workers(devices, timeout=60.0):
    """Waits until the workers of ``devices`` (ids, or a count n for 0..n-1) have connected to this
    listening runtime; returns their ``WorkerInfo``. TimeoutError naming a device that has none
    after ``timeout`` seconds (None: forever). Ops wait the same way by themselves (up to
    DTORCH_CONNECT_TIMEOUT, 60 s)."""
    ids = list(range(operator.index(devices))) if not isinstance(devices, (list, tuple, range)) else \
        [operator.index(d) for d in devices]
    _C.wait_workers(ids, -1.0 if timeout is None else float(timeout))
    return [worker_info(d) for d in ids]


def generate_keypair(path):
    """Writes a new CURVE key pair, ``path`` (the public key) and ``path_secret`` (both halves, mode
    0600), as ``dtorch-worker --keygen`` does; returns the public key."""
    worker = os.environ.get("DTORCH_WORKER_PATH") or "dtorch-worker"
    done = subprocess.run([worker, "--keygen", os.fspath(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"generate_keypair: {done.stderr.strip() or 'dtorch-worker --keygen failed'}")
    return done.stdout.strip()


def shutdown():
    """Stops every actor. Pending futures fail; tensors made before cannot be used after.
    The runtime can be started again."""
    _C.shutdown()


def is_initialized():
    return _C.is_running()


def synchronize():
    """Waits until every device has run every op sent so far."""
    _C.synchronize()


def device_stats(mesh, reset_peak=False):
    """What every device of ``mesh`` has counted, once it has run everything sent to it before: a
    list in mesh order of dicts with ``device`` (its id), ``bytes_in_use`` (bytes of the pieces it
    holds now), ``peak_bytes`` (the most it has held since the last reset), and
    ``peer_messages_sent``/``peer_bytes_sent``, ``peer_messages_received``/``peer_bytes_received``
    (regions exchanged with other devices, since it started), ``shm_bytes_sent``/``shm_bytes_received``
    (the part of those bytes that worker processes read from each other's shared memory) and
    ``shm_bytes_fetched`` (bytes of fetched values the controller read from the device's shared
    memory), ``loads``/``loaded_bytes`` (pieces the controller sent it whole, as ``distribute_tensor``,
    ``from_local`` and checkpoint loading do, and their bytes), ``peer_messages_refused`` (messages on
    its peer socket that came from no worker of the run, or not from the device they named, dropped
    unread), ``peer_regions_dropped`` (regions dropped because too many were waiting to be
    assembled) and ``huge_page_bytes`` (of ``bytes_in_use``: pieces in 2 MiB-aligned memory advised
    for transparent huge pages, MADV_HUGEPAGE, where the kernel took the advice: those of 1 MiB and
    more that the controller sent whole, as checkpoint loading does, in both worker modes, and a
    worker thread's computed ones; whether the kernel then backs them with huge pages is up to its
    state) and ``onednn_convs`` (conv2d kernels the device ran through oneDNN: a CPU device of a
    build that found it; 0 where im2col and sgemm ran them all), ``peer_handoffs`` (of
    ``peer_messages_sent``: regions handed to a worker thread of the same process as they lie, without
    a message) and ``onednn_matmuls`` (bfloat16 products that ran on the CPU's bfloat16 units, AMX or
    AVX512_BF16, through oneDNN: a linear of more than 16 rows, and attention's two products per head
    and block of a prompt's rows; 0 on CPUs without them, where the operands are widened to
    float32). ``reset_peak=True`` starts each peak again from what the device holds, after reading
    it."""
    return _C._device_stats(mesh, bool(reset_peak))


def memory_stats(mesh, reset_peak=False):
    """Each device's memory, once it has run everything sent to it before: a list in mesh order of
    dicts with ``device``, ``bytes_in_use`` (its pieces now), ``peak_bytes`` (the most since the
    last reset; ``reset_peak=True`` restarts it) and ``pooled_bytes`` (freed buffers and shared
    memory segments its process keeps for reuse; worker threads of one process share them, so
    they report the same)."""
    keys = ("device", "bytes_in_use", "peak_bytes", "pooled_bytes")
    return [{k: s[k] for k in keys} for s in device_stats(mesh, reset_peak)]


def manual_seed(seed):
    """Seeds the random factories and restarts their stream."""
    _C.manual_seed(int(seed))


atexit.register(_C.shutdown)
