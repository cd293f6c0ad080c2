"""DeviceMesh: an N-D array of device ids that DTensors are laid out over."""
import threading

import numpy as np

from . import _C


class DeviceMesh:
    """``DeviceMesh(device_type, mesh, mesh_dim_names=None)``: ``mesh`` is a (nested) list of
    distinct device ids. ``device_type`` is "cpu" (virtual CPU devices, any number)."""

    def __init__(self, device_type, mesh, *, mesh_dim_names=None):
        ids = np.asarray(mesh)
        if ids.dtype == np.bool_ or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
            raise TypeError(f"DeviceMesh: mesh must hold integer device ids, got {ids.dtype}")
        if ids.ndim == 0:
            ids = ids.reshape(1)
        if ids.size == 0:
            raise ValueError("DeviceMesh: a mesh needs at least one device")
        if mesh_dim_names is not None:
            mesh_dim_names = tuple(mesh_dim_names)
            if len(mesh_dim_names) != ids.ndim:
                raise RuntimeError("mesh_shape and mesh_dim_names should have same length!")
            if len(set(mesh_dim_names)) != len(mesh_dim_names):
                raise RuntimeError("Each mesh_dim_name must be unique.")
            for name in mesh_dim_names:
                if not isinstance(name, str):
                    raise TypeError("mesh_dim_names must be strings")
        self._c = _C.Mesh(str(device_type), ids.shape, [int(i) for i in ids.ravel()], mesh_dim_names)
        self._ids = ids.astype(np.int64)
        self._ids.flags.writeable = False
        self.device_type = str(device_type)
        self.mesh_dim_names = mesh_dim_names
        self._root, self._root_dims = None, tuple(range(ids.ndim))  # None: this mesh is a root

    @property
    def mesh(self):
        """The device ids as a read-only int64 numpy array of the mesh's shape."""
        return self._ids

    @property
    def ndim(self):
        return self._ids.ndim

    @property
    def shape(self):
        return self._ids.shape

    def size(self, mesh_dim=None):
        """Number of devices, or the extent of one mesh dim."""
        return self._ids.size if mesh_dim is None else self._ids.shape[mesh_dim]

    def tolist(self):
        return self._ids.tolist()

    def __getitem__(self, mesh_dim_names):
        """The sub-mesh of the named dim(s), as torch's ``mesh["tp"]`` or ``mesh["dp", "tp"]``.

        torch returns the sub-mesh that holds the calling rank. A single controller has no rank,
        so this returns the sub-mesh through the mesh's first device (coordinate 0 on every other
        dim) and remembers where it came from: ``_get_root_mesh()`` is the mesh it was cut from and
        ``_root_dims`` the dims of that mesh it spans. ``submeshes(names)`` lists every one.
        Parallel styles given a sub-mesh lay tensors out on the root mesh, with their placements
        on these dims and the tensors' own (Replicate for parameters) on the others."""
        dims = self._dims_of(mesh_dim_names)
        if dims == tuple(range(self.ndim)):
            return self
        return self._sub(dims, tuple(0 if d not in dims else slice(None) for d in range(self.ndim)))

    def submeshes(self, mesh_dim_names):
        """Every sub-mesh of the named dim(s), one per coordinate of the other dims, row-major."""
        dims = self._dims_of(mesh_dim_names)
        others = [d for d in range(self.ndim) if d not in dims]
        out = []
        for coord in np.ndindex(*[self.shape[d] for d in others]):
            at = dict(zip(others, coord))
            out.append(self._sub(dims, tuple(at.get(d, slice(None)) for d in range(self.ndim))))
        return out

    def unbind(self, mesh_dim_name):
        """The meshes left when the named dim is removed, one per index along it (as
        ``torch.unbind`` does to a tensor): a (dp, pp, tp) mesh unbound on "pp" gives pp meshes of
        shape (dp, tp), the pipeline's stages. Each is a mesh of its own (not a sub-mesh of this one),
        keeping the other dims' names; unbinding a 1-D mesh gives one-device meshes."""
        (dim,) = self._dims_of(mesh_dim_name)
        names = [n for d, n in enumerate(self.mesh_dim_names) if d != dim]
        out = []
        for i in range(self.shape[dim]):
            ids = np.take(self._ids, i, axis=dim)
            out.append(DeviceMesh(self.device_type, ids, mesh_dim_names=names or None))
        return out

    def _dims_of(self, mesh_dim_names):
        if not self.mesh_dim_names:
            raise RuntimeError("Cannot slice a DeviceMesh without mesh_dim_names!")
        names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        for name in names:
            if name not in self.mesh_dim_names:
                raise KeyError(f"Invalid mesh_dim_name {name!r} specified. Valid mesh_dim_names are "
                               f"{self.mesh_dim_names}")
        dims = tuple(self.mesh_dim_names.index(n) for n in names)
        if not names or list(dims) != sorted(set(dims)):
            raise KeyError(f"Invalid mesh_dim_names {names!r} specified: name distinct dims in the mesh's order "
                           f"{self.mesh_dim_names}")
        return dims

    def _sub(self, dims, index):
        sub = DeviceMesh(self.device_type, self._ids[index], mesh_dim_names=[self.mesh_dim_names[d] for d in dims])
        sub._root, sub._root_dims = self._get_root_mesh(), tuple(self._root_dims[d] for d in dims)
        return sub

    def on_failure(self, callback):
        """Calls ``callback(device, reason)`` once for each failure of one of this mesh's devices
        from now on (a worker that died, was killed or went silent), from a thread of dtorch's own
        ("dtorch-failures"), so the callback may use dtorch: e.g. build a new mesh on other devices
        and carry on, while this mesh's DTensors raise errors naming the device. Workers that stop
        at shutdown are no failure. Returns a handle whose ``remove()`` ends the calls (as torch's
        hooks)."""
        if not callable(callback):
            raise TypeError(f"on_failure: expected a callable, got {type(callback).__name__}")
        return _watcher.watch(set(int(i) for i in self._ids.ravel()), callback)

    def _get_root_mesh(self):
        """The mesh this one was sliced from (itself when it was not)."""
        return self if self._root is None else self._root

    def __eq__(self, other):
        return (isinstance(other, DeviceMesh) and other.device_type == self.device_type
                and other._ids.shape == self._ids.shape and bool((other._ids == self._ids).all()))

    def __hash__(self):
        return hash((self.device_type, self._ids.shape, self._ids.tobytes()))

    def __repr__(self):
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self._ids.tolist()}{names})"


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None):
    """A mesh of ``prod(mesh_shape)`` devices numbered 0.. row-major."""
    shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
    if mesh_dim_names is not None and len(tuple(mesh_dim_names)) != len(shape):
        raise RuntimeError("mesh_shape and mesh_dim_names should have same length!")
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 1:
            raise ValueError(f"init_device_mesh: mesh_shape must hold positive ints, got {mesh_shape!r}")
    ids = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    return DeviceMesh(device_type, ids, mesh_dim_names=mesh_dim_names)


class _FailureWatcher:
    """The callbacks of DeviceMesh.on_failure and the one thread that calls them: it waits in C
    (the GIL released) for the next device failure and calls each callback whose mesh holds the
    device and that was registered before the failure."""

    def __init__(self):
        self._lock = threading.Lock()
        self._watches = []        # (device ids, callback, first failure number it wants)
        self._thread = None

    def watch(self, devices, callback):
        with self._lock:
            first = _C._failure_count() + 1
            entry = (devices, callback, first)
            self._watches.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, args=(first - 1,), name="dtorch-failures",
                                                daemon=True)
                self._thread.start()
        return _FailureHandle(self, entry)

    def _remove(self, entry):
        with self._lock:
            self._watches = [w for w in self._watches if w is not entry]

    def _run(self, seen):
        while True:
            got = _C._next_failure(seen, 0.5)
            if got is None:
                continue
            seen, device, reason = got
            with self._lock:
                due = [cb for devices, cb, first in self._watches if device in devices and seen >= first]
            for callback in due:
                try:
                    callback(device, reason)
                except Exception:   # a callback's error is the callback's: report it, keep watching
                    import traceback
                    traceback.print_exc()


class _FailureHandle:
    """What DeviceMesh.on_failure returns: ``remove()`` ends the calls."""

    def __init__(self, watcher, entry):
        self._watcher, self._entry = watcher, entry

    def remove(self):
        self._watcher._remove(self._entry)


_watcher = _FailureWatcher()
