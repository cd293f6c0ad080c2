"""Starting and stopping the runtime: the controller actor and the device actors."""
import atexit
import os

from . import _C

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dtorch-worker")
if os.access(_WORKER, os.X_OK) and not os.environ.get("DTORCH_WORKER_PATH"):
    # process workers run the executable that ships with the package
    os.environ["DTORCH_WORKER_PATH"] = _WORKER


def init(workers=None):
    """Starts the runtime now. ``workers``: "thread" (device actors are threads of this process,
    the default) or "process" (each device actor is a child process); None reads
    DTORCH_WORKERS. Ops start it lazily otherwise."""
    if workers is None:
        workers = os.environ.get("DTORCH_WORKERS") or "thread"
    if workers not in ("thread", "process"):
        raise ValueError(f"init: workers must be 'thread' or 'process', got {workers!r}")
    _C.init(0 if workers == "thread" else 1, os.environ.get("DTORCH_WORKER_PATH"))


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
    memory). ``reset_peak=True`` starts each peak again from what the device holds, after reading
    it."""
    return _C._device_stats(mesh, bool(reset_peak))


def manual_seed(seed):
    """Seeds the random factories and restarts their stream."""
    _C.manual_seed(int(seed))


atexit.register(_C.shutdown)
