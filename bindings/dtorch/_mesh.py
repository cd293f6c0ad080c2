"""DeviceMesh: an N-D array of device ids that DTensors are laid out over."""
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
