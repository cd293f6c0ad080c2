"""Waiting on many futures at once, as concurrent.futures.wait does for its own."""
import threading
import time

FIRST_COMPLETED = "FIRST_COMPLETED"
FIRST_EXCEPTION = "FIRST_EXCEPTION"
ALL_COMPLETED = "ALL_COMPLETED"


def _failed(future):
    return future.done() and future._error() is not None


def wait(futures, timeout=None, return_when=ALL_COMPLETED):
    """Waits for TensorFutures (of any meshes) until ``return_when`` holds or ``timeout`` seconds
    pass: FIRST_COMPLETED (one has settled), FIRST_EXCEPTION (one has failed, or all have settled)
    or ALL_COMPLETED. Returns the named tuple ``(done, not_done)`` of sets. The runtime wakes the
    wait when a future settles: nothing polls."""
    from ._tensor import TensorFuture   # the package's modules import each other
    futures = set(futures)
    for f in futures:
        if not isinstance(f, TensorFuture):
            raise TypeError(f"wait: expected TensorFutures, got {type(f).__name__}"
                            + (" (x.future() is its value's future)" if hasattr(f, "future") else ""))
    if return_when not in (FIRST_COMPLETED, FIRST_EXCEPTION, ALL_COMPLETED):
        raise ValueError(f"wait: return_when must be FIRST_COMPLETED, FIRST_EXCEPTION or ALL_COMPLETED, "
                         f"got {return_when!r}")
    settled = threading.Condition()

    def wake():   # on a runtime thread, or here for one already settled
        with settled:
            settled.notify_all()

    def satisfied():
        done = {f for f in futures if f.done()}
        if return_when == FIRST_COMPLETED:
            return done, bool(done)
        if return_when == FIRST_EXCEPTION and any(_failed(f) for f in done):
            return done, True
        return done, len(done) == len(futures)

    for f in futures:
        f._add_done_callback(wake)
    deadline = None if timeout is None else time.monotonic() + timeout
    with settled:
        while True:
            done, ok = satisfied()
            left = None if deadline is None else deadline - time.monotonic()
            if ok or (left is not None and left <= 0):
                break
            settled.wait(left)   # a callback wakes it; Ctrl-C interrupts it
    return DoneAndNotDone(done, futures - done)


class DoneAndNotDone(tuple):
    """(done, not_done), with those names."""
    __slots__ = ()

    def __new__(cls, done, not_done):
        return super().__new__(cls, (done, not_done))

    @property
    def done(self):
        return self[0]

    @property
    def not_done(self):
        return self[1]
