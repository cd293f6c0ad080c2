"""What the Python fuzz harnesses share (atheris: libFuzzer driving Python code, its coverage taken
from the instrumented bytecode of the dtorch package).

A harness runs as ``python fuzz_NAME.py CORPUS_DIR [libFuzzer flags]``: it writes its seeds into
CORPUS_DIR when that is empty, then fuzzes from them; ``python fuzz_NAME.py FILE`` runs one input
again (a finding's crash-* file). tools/run.sh passes ``-runs=N -seed=1``: the same count and the
same random choices on every machine (the config, api and serve harnesses repeat their inputs one
for one; the safetensors one drifts from its earlier runs after some hundreds of inputs, from
something in its executions not pinned down yet). A finding is an exception that escapes the
harness's TestOneInput (atheris prints it and writes the input as crash-*), a signal (a crash in
C), or a timeout (a hang); libFuzzer then exits non-zero.
"""
import json
import linecache
import os
import resource
import sys
import traceback

import atheris

if os.environ.get("PYTHONHASHSEED") != "0":
    # the order of sets and dicts of strings, and so the paths taken, would change from run to run
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

_DTORCH = os.sep + "dtorch" + os.sep


class Finding(AssertionError):
    """A contract broken: raised out of TestOneInput so that the fuzzer stops and keeps the input."""


def raised_by_dtorch(exc):
    """Whether ``exc`` comes from a ``raise`` statement in the dtorch package (or the C extension,
    which raises at its Python call site): a check that names what is wrong. An exception the
    interpreter or a library raised deep inside (an AttributeError on a None, a TypeError of
    'str' * 'int', numpy refusing a shape) is not."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if _DTORCH not in code.co_filename:
        return False
    line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
    return line.startswith("raise") or "_C." in line


def _wrapped(exc):
    """The ValueError a CheckpointError wraps (``except ValueError as e: raise CheckpointError(...)``):
    one the JSON reader raised is the file's fault, any other must be clear itself."""
    inner = exc.__context__
    if type(exc).__name__ != "CheckpointError" or not isinstance(inner, ValueError):
        return None
    if isinstance(inner, (json.JSONDecodeError, UnicodeDecodeError)) or type(inner).__name__ == "CheckpointError":
        return None
    return inner


def expect_clear(exc, kinds, what):
    """Raises Finding unless ``exc`` is one of ``kinds``, raised by a dtorch check, with a message."""
    inner = _wrapped(exc)
    if inner is not None and not raised_by_dtorch(inner):
        exc = inner
    if not isinstance(exc, kinds) or not raised_by_dtorch(exc) or not str(exc).strip():
        where = "".join(traceback.format_exception(exc)[-6:])
        raise Finding(f"{what}: {type(exc).__name__} is not a clear error of {[k.__name__ for k in kinds]}: "
                      f"{exc!r}\n{where}") from exc


_AT_EXIT = []


def at_exit(fn):
    """Calls ``fn()`` when the process exits: libFuzzer ends it with C's exit() after the last
    input, where Python's atexit never runs, and a runtime whose worker threads still use their
    sockets when the C library's own exit handlers close them can crash. Handlers run in the
    reverse order of registration, so one registered after dtorch.init runs before those."""
    import ctypes
    handler = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: fn())
    _AT_EXIT.append(handler)   # kept alive until then
    if ctypes.CDLL(None).__cxa_atexit(handler, None, None) != 0:
        raise OSError("__cxa_atexit failed")


def limit_memory(gib):
    """Caps the address space, so that an allocation the input sized shows as a MemoryError (a
    finding) instead of swapping the machine."""
    limit = gib << 30
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard if hard != resource.RLIM_INFINITY else hard))


def scratch_dir(name):
    """An empty folder for the files the inputs make, ``fuzz-scratch-NAME`` in the working
    directory: a path of its own each run (a temporary folder's random name) would reach the
    fuzzer through the comparisons of the code under test, and change the inputs it tries."""
    path = f"fuzz-scratch-{name}"
    if os.path.isdir(path):
        clear_dir(path)
    os.makedirs(path, exist_ok=True)
    return path


def clear_dir(path):
    for entry in os.listdir(path):
        full = os.path.join(path, entry)
        if os.path.isdir(full) and not os.path.islink(full):
            clear_dir(full)
            os.rmdir(full)
        else:
            os.unlink(full)


def main(test_one_input, seeds, dictionary=None, flags=()):
    """Writes ``seeds`` (a list of bytes) into the corpus folder (the first argument not starting
    with '-') when it is empty, then fuzzes. ``dictionary``: tokens for libFuzzer's -dict, written
    next to the corpus; ``flags``: libFuzzer flags of the harness's own."""
    argv = list(sys.argv) + list(flags)
    folders = [a for a in argv[1:] if not a.startswith("-") and not os.path.isfile(a)]  # a file: rerun that input
    if folders:
        corpus = folders[0]
        os.makedirs(corpus, exist_ok=True)
        if not os.listdir(corpus):
            for i, seed in enumerate(seeds):
                with open(os.path.join(corpus, f"seed-{i:03d}"), "wb") as f:
                    f.write(seed)
        if dictionary and not any(a.startswith("-dict=") for a in argv):
            path = os.path.abspath(corpus.rstrip(os.sep)) + ".dict"
            with open(path, "w") as f:
                for token in dictionary:
                    f.write('"' + "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else f"\\x{ord(c):02x}"
                                          for c in token) + '"\n')
            argv.append(f"-dict={path}")
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


# ---- values for structured inputs ------------------------------------------------------------

INTS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 24, -1, -2, 2**31 - 1, 2**31, 2**32, 2**48, 2**62, 2**63 - 1, 2**63, 2**64,
        -2**63, -2**63 - 1, 10**30]


def pick_int(fdp, small=8, ints=INTS):
    """Mostly a small int (0..small), else one from ``ints`` (the edges of C's integer types)."""
    if fdp.ConsumeIntInRange(0, 3):
        return fdp.ConsumeIntInRange(0, small)
    return fdp.PickValueInList(ints)


def json_value(fdp, strings=("", "a"), depth=2, ints=INTS):
    """Any JSON value (as Python's json reads it, NaN and Infinity included), small."""
    kind = fdp.ConsumeIntInRange(0, 9 if depth > 0 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind in (2, 3):
        return pick_int(fdp, ints=ints)
    if kind == 4:
        return fdp.PickValueInList([0.0, 0.5, 1.5, -1.0, 1e300, float("inf"), float("-inf"), float("nan"), 2.0])
    if kind in (5, 6):
        return fdp.PickValueInList(list(strings)) if fdp.ConsumeBool() else fdp.ConsumeUnicodeNoSurrogates(4)
    if kind in (7, 8):
        return [json_value(fdp, strings, depth - 1, ints) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {fdp.PickValueInList(list(strings)): json_value(fdp, strings, depth - 1, ints)
            for _ in range(fdp.ConsumeIntInRange(0, 2))}


_TALLY = {}


def tally(outcome):
    """Counts the outcomes of the inputs; with FUZZ_STATS=1 in the environment, prints them every
    1000 inputs (to see that the inputs reach past the first checks)."""
    _TALLY[outcome] = _TALLY.get(outcome, 0) + 1
    if os.environ.get("FUZZ_STATS") and sum(_TALLY.values()) % 1000 == 0:
        print("outcomes:", dict(sorted(_TALLY.items(), key=lambda kv: -kv[1])), file=sys.stderr, flush=True)
