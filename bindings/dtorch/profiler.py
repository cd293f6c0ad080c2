"""dtorch.profiler: what every device ran and when, as a Chrome / Perfetto trace.

    with dtorch.profiler.profile() as prof:
        ...                                   # ops, fetches, redistributes, generation
    prof.export_chrome_trace("trace.json")    # open in chrome://tracing or ui.perfetto.dev

While the block runs, each device's worker timestamps every op record it runs (a kernel, a send or
an assembly of a redistribute, a fetch, a captured sequence's replay and the records inside it) on
the worker's side, and the controller timestamps every batch of records it sends to a device. The
times are CLOCK_MONOTONIC of each worker's host: devices on other hosts have clocks of their own. On
a GPU an event's times are when the GPU ran the work the record queued (CUDA events on the device's
compute stream, counted from one made when the block began), not when the worker queued it: the
first 65,536 events of each device in a block; later ones keep the worker's times.
"""
import json
import time

import numpy as np

from . import _C
from ._mesh import DeviceMesh
from ._ops import ids as _op_ids

_KINDS = {"send": "transfer", "assemble": "transfer", "load": "transfer", "fetch": "transfer", "compute": "kernel",
          "replay": "replay"}


class profile:
    """Records the timelines of ``devices`` (device ids or DeviceMeshes; default: every device a
    mesh has started by the time the block starts, its worker serving or still starting). After the block: ``events()``, and
    ``export_chrome_trace(path)``."""

    def __init__(self, *devices):
        self._wanted = devices
        self._meshes = []
        self._events = []
        self._host = []

    def __enter__(self):
        ids = []
        for d in self._wanted:
            ids += np.asarray(d.mesh).ravel().tolist() if isinstance(d, DeviceMesh) else [int(d)]
        if not self._wanted:
            ids = _C._started_devices()
        ids = list(dict.fromkeys(ids))
        if not ids:
            raise RuntimeError("profiler: no device to profile: give device ids or meshes, or use a mesh first")
        by_type = {}  # the trace goes to each device type's devices on a mesh of that type
        for i in ids:
            by_type.setdefault(_C._device_type(i) or "cpu", []).append(i)
        self._meshes = [DeviceMesh(t, group) for t, group in by_type.items()]
        self._start = time.monotonic_ns()
        for mesh in self._meshes:
            _C._trace_start(mesh)
        return self

    def __exit__(self, *exc):
        rows, devices = [], []
        for mesh in self._meshes:
            counts = _C._trace_stop(mesh)
            rows += np.frombuffer(_C._trace_events(mesh, counts), np.int64).reshape(-1, 4).tolist()
            devices += np.repeat(np.asarray(mesh.mesh).ravel(), counts).tolist()
        names = {v: k for k, v in _op_ids.items()}
        records = {code: _C._record_name(code) for code in {row[0] for row in rows}}
        self._events = []
        for device, (code, op, begin, end) in zip(devices, rows):
            record = records[code]
            name = names.get(op, f"op {op}") if record == "compute" else record
            self._events.append({"device": device, "name": name, "record": record, "begin_ns": begin,
                                 "end_ns": end})
        self._host = [{"device": d, "records": n, "ns": t}
                      for d, n, t in np.frombuffer(_C._trace_host(), np.int64).reshape(-1, 3).tolist()]
        return False

    def events(self):
        """Every device event: dicts of device, name (the op, or the record's kind), record,
        begin_ns and end_ns (CLOCK_MONOTONIC of the device's host), in each device's order."""
        return list(self._events)

    def controller_events(self):
        """The controller's batches: dicts of device, records and ns (when it sent them)."""
        return list(self._host)

    def export_chrome_trace(self, path):
        """Writes the trace-event JSON: one process per device (its events as complete events)
        and one for the controller (its batches as instant events), times in µs from the start."""
        t0 = self._start
        out = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "controller"}}]
        for device in dict.fromkeys(e["device"] for e in self._events):
            out.append({"ph": "M", "name": "process_name", "pid": device + 1, "tid": 0,
                        "args": {"name": f"device {device}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": device + 1, "tid": 0,
                        "args": {"sort_index": device + 1}})
        for e in self._events:
            out.append({"ph": "X", "name": e["name"], "cat": _KINDS.get(e["record"], "other"), "pid": e["device"] + 1,
                        "tid": 0, "ts": (e["begin_ns"] - t0) / 1e3, "dur": (e["end_ns"] - e["begin_ns"]) / 1e3,
                        "args": {"record": e["record"]}})
        for h in self._host:
            out.append({"ph": "i", "s": "t", "name": f"send {h['records']} records to device {h['device']}",
                        "cat": "controller", "pid": 0, "tid": 0, "ts": (h["ns"] - t0) / 1e3,
                        "args": {"device": h["device"], "records": h["records"]}})
        with open(path, "w") as f:
            json.dump({"traceEvents": out, "displayTimeUnit": "ms"}, f)
        return path
