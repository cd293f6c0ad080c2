"""Module: torch.nn.Module's surface for inference over DTensors.

Parameters and buffers are DTensors (or MetaTensors: shapes waiting for values, made inside
``dtorch.nn.meta_device()``). Registering works as in torch: assigning a DTensor or a Module to an
attribute registers it; ``register_buffer`` registers a buffer. Tensors are immutable on the
devices, so loading, casting and parallel styles replace a parameter by a new DTensor instead of
copying into it; parameters shared by several modules (tied weights) stay shared.
"""
import collections
import contextlib
import itertools

import numpy as np

from .. import _C, _dtype
from .._factory import distribute_tensor
from .._mesh import DeviceMesh
from .._placement import Replicate
from .._tensor import DTensor

_IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
_IncompatibleKeys.__repr__ = lambda self: ("<All keys matched successfully>" if not self.missing_keys
                                           and not self.unexpected_keys else
                                           f"_IncompatibleKeys(missing_keys={self.missing_keys}, "
                                           f"unexpected_keys={self.unexpected_keys})")

_META = [False]
_DEFAULT_MESH = []


def default_mesh():
    """The mesh of modules made without ``device_mesh=``: one CPU device, DeviceMesh("cpu", [0])."""
    if not _DEFAULT_MESH:
        _DEFAULT_MESH.append(DeviceMesh("cpu", [0]))
    return _DEFAULT_MESH[0]


class MetaTensor:
    """A parameter's shape, dtype and layout without values, as torch's "meta" device: modules
    made inside ``meta_device()`` hold these until ``load_state_dict`` gives them values, so a
    checkpoint is laid out straight into its final placements. ``redistribute`` and ``to``
    only change the description."""

    __slots__ = ("shape", "dtype", "device_mesh", "placements")

    def __init__(self, shape, dtype, device_mesh, placements=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device_mesh = device_mesh
        self.placements = tuple(placements) if placements is not None else (Replicate(),) * device_mesh.ndim

    @property
    def ndim(self):
        return len(self.shape)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def redistribute(self, device_mesh=None, placements=None):
        return MetaTensor(self.shape, self.dtype, device_mesh or self.device_mesh, placements)

    def to(self, dtype):
        return MetaTensor(self.shape, _dtype._resolve(dtype), self.device_mesh, self.placements)

    def __repr__(self):
        return (f"MetaTensor(shape={self.shape}, dtype={self.dtype}, device_mesh={self.device_mesh!r}, "
                f"placements={self.placements!r})")


_TENSORS = (DTensor, MetaTensor)


@contextlib.contextmanager
def meta_device():
    """Modules made inside hold MetaTensors instead of values (torch's ``with torch.device("meta")``):
    nothing is allocated on the devices until ``load_state_dict``."""
    before = _META[0]
    _META[0] = True
    try:
        yield
    finally:
        _META[0] = before


def new_parameter(shape, dtype, device_mesh, init):
    """A parameter of ``shape`` on ``device_mesh`` (Replicate): ``init(shape, mesh, dtype)`` makes its
    values, or a MetaTensor inside ``meta_device()``."""
    mesh = device_mesh if device_mesh is not None else default_mesh()
    dt = _dtype._resolve(dtype)
    if _META[0]:
        return MetaTensor(shape, dt, mesh)
    return init(tuple(shape), mesh, dt)


class RemovableHandle:
    """What ``register_forward_hook`` returns: ``remove()`` unregisters the hook."""

    _ids = itertools.count()

    def __init__(self, hooks):
        self._hooks = hooks
        self.id = next(RemovableHandle._ids)

    def remove(self):
        self._hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class Module:
    """Base class of layers and models, with torch.nn.Module's surface (inference only)."""

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments")
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_forward_pre_hooks", {})
        object.__setattr__(self, "_forward_hooks", {})
        object.__setattr__(self, "training", False)

    # ---- calling ---------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        pre, post = self._forward_pre_hooks, self._forward_hooks
        if not pre and not post:
            return self.forward(*args, **kwargs)
        for hook, with_kwargs in list(pre.values()):
            if with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                           f"but got {result!r}.")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        output = self.forward(*args, **kwargs)
        for hook, with_kwargs in list(post.values()):
            result = hook(self, args, kwargs, output) if with_kwargs else hook(self, args, output)
            if result is not None:
                output = result
        return output

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """``hook(module, args)`` (or ``hook(module, args, kwargs)`` with ``with_kwargs``) runs before
        ``forward``; what it returns (other than None) replaces the inputs."""
        return self._add_hook(self._forward_pre_hooks, hook, prepend, with_kwargs)

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False):
        """``hook(module, args, output)`` (or ``hook(module, args, kwargs, output)``) runs after
        ``forward``; what it returns (other than None) replaces the output."""
        return self._add_hook(self._forward_hooks, hook, prepend, with_kwargs)

    @staticmethod
    def _add_hook(hooks, hook, prepend, with_kwargs):
        handle = RemovableHandle(hooks)
        entry = (hook, bool(with_kwargs))
        if prepend:
            rest = dict(hooks)
            hooks.clear()
            hooks[handle.id] = entry
            hooks.update(rest)
        else:
            hooks[handle.id] = entry
        return handle

    # ---- registering -----------------------------------------------------------------------------

    def register_parameter(self, name, param):
        """Adds ``param`` (a DTensor, a MetaTensor or None) as parameter ``name``."""
        self._check_name("parameter", name, self._parameters)
        if param is not None and not isinstance(param, _TENSORS):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(dtorch.DTensor or None required)")
        self._parameters[name] = param
        object.__setattr__(self, name, param)

    def register_buffer(self, name, tensor, persistent=True):
        """Adds ``tensor`` (a DTensor or None) as buffer ``name``; ``persistent=False`` keeps it
        out of ``state_dict``."""
        self._check_name("buffer", name, self._buffers)
        if tensor is not None and not isinstance(tensor, _TENSORS):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(dtorch.DTensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)
        object.__setattr__(self, name, tensor)

    def register_module(self, name, module):
        """Adds ``module`` (or None) as child ``name``."""
        self._check_name("module", name, self._modules)
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._modules[name] = module
        object.__setattr__(self, name, module)

    add_module = register_module

    def _check_name(self, kind, name, own):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if name == "" or "." in name:
            raise KeyError(f'{kind} name can\'t be empty or contain ".", got: {name!r}')
        for other in (self._parameters, self._buffers, self._modules):
            if other is not own and name in other:
                raise KeyError(f"attribute '{name}' already exists")
        if name in self.__dict__ and name not in own:
            raise KeyError(f"attribute '{name}' already exists")

    def __setattr__(self, name, value):
        d = self.__dict__
        if "_parameters" not in d:
            if isinstance(value, (Module,) + _TENSORS):
                raise AttributeError("cannot assign parameters or modules before Module.__init__() call")
            object.__setattr__(self, name, value)
            return
        if name in self._buffers:
            if value is not None and not isinstance(value, _TENSORS):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(dtorch.DTensor or None expected)")
            self._buffers[name] = value
            object.__setattr__(self, name, value)
        elif isinstance(value, _TENSORS):
            self._forget(name)
            self.register_parameter(name, value)
        elif name in self._parameters:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(dtorch.DTensor or None expected)")
            self._parameters[name] = None
            object.__setattr__(self, name, None)
        elif isinstance(value, Module):
            self._forget(name)
            self.register_module(name, value)
        elif name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(dtorch.nn.Module or None expected)")
            self._modules[name] = None
            object.__setattr__(self, name, None)
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name):
        for registry in (self._parameters, self._buffers, self._modules):
            registry.pop(name, None)
        self._non_persistent_buffers_set.discard(name)
        self.__dict__.pop(name, None)

    def __delattr__(self, name):
        if name in self._parameters or name in self._buffers or name in self._modules:
            self._forget(name)
        else:
            object.__delattr__(self, name)

    # ---- walking ---------------------------------------------------------------------------------

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        for _, module in self.named_children():
            yield module

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            yield from module.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def _named_members(self, registry, prefix, recurse, remove_duplicate):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in getattr(module, registry).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                if remove_duplicate:
                    seen.add(id(value))
                yield module_prefix + ("." if module_prefix else "") + name, value

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target):
        """The module at the dotted path ``target`` ("" is this module)."""
        module = self
        for atom in target.split(".") if target else ():
            child = module._modules.get(atom)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no attribute `{atom}`")
            module = child
        return module

    def apply(self, fn):
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # ---- state -----------------------------------------------------------------------------------

    def _state_entries(self):
        """(key, owning module, attribute name, kind) of every parameter and persistent buffer, every
        alias of a shared tensor included (as torch's state_dict)."""
        for prefix, module in self.named_modules(remove_duplicate=False):
            head = prefix + "." if prefix else ""
            for name, value in module._parameters.items():
                if value is not None:
                    yield head + name, module, name, "_parameters"
            for name, value in module._buffers.items():
                if value is not None and name not in module._non_persistent_buffers_set:
                    yield head + name, module, name, "_buffers"

    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        """An ordered dict of every parameter and persistent buffer by dotted name (DTensors)."""
        out = collections.OrderedDict() if destination is None else destination
        for key, module, name, registry in self._state_entries():
            out[prefix + key] = getattr(module, registry)[name]
        return out

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Gives every parameter and persistent buffer its value from ``state_dict`` (numpy arrays,
        anything with the buffer protocol or DLPack, or DTensors). Each value keeps the existing
        tensor's dtype, mesh and placements: a host array is laid out straight into them, a DTensor
        is cast and redistributed. Returns ``_IncompatibleKeys(missing_keys, unexpected_keys)``; a
        shape mismatch, or with ``strict`` a missing or unexpected key, raises RuntimeError as torch
        does (nothing is loaded then). Tensors shared under several keys stay shared; the first
        key's value is used for all of them."""
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        entries = list(self._state_entries())
        expected = {key for key, *_ in entries}
        missing = [key for key, *_ in entries if key not in state_dict]
        unexpected = [key for key in state_dict.keys() if key not in expected]
        errors = []
        for key, module, name, registry in entries:
            if key in state_dict:
                current = getattr(module, registry)[name]
                shape = _shape_of(state_dict[key])
                if shape != tuple(current.shape):
                    errors.append(f"size mismatch for {key}: copying a param with shape {shape} from checkpoint, "
                                  f"the shape in current model is {tuple(current.shape)}.")
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(type(self).__name__,
                                                                                  "\n\t".join(errors)))
        loaded = {}
        for key, module, name, registry in entries:
            current = getattr(module, registry)[name]
            if id(current) in loaded:
                value = loaded[id(current)][1]
            elif key in state_dict:
                value = lay_out(state_dict[key], current, key)
                loaded[id(current)] = (current, value)
            else:
                continue
            getattr(module, registry)[name] = value
            object.__setattr__(module, name, value)
        return _IncompatibleKeys(missing, unexpected)

    # ---- dtype and mode --------------------------------------------------------------------------

    def to(self, dtype):
        """Casts every floating parameter and buffer to ``dtype`` (on the devices); returns self."""
        dt = _dtype._resolve(dtype)
        if not dt.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dt}")
        self._map_tensors(lambda t: t.to(dt) if t.dtype.is_floating_point and t.dtype != dt else t)
        return self

    def float(self):
        return self.to(_dtype.float32)

    def half(self):
        return self.to(_dtype.float16)

    def bfloat16(self):
        return self.to(_dtype.bfloat16)

    def _map_tensors(self, fn):
        """Replaces every parameter and buffer t by fn(t), shared tensors once."""
        done = {}
        for module in self.modules():
            for registry in (module._parameters, module._buffers):
                for name, t in list(registry.items()):
                    if t is None:
                        continue
                    if id(t) not in done:
                        done[id(t)] = (t, fn(t))
                    registry[name] = done[id(t)][1]
                    object.__setattr__(module, name, done[id(t)][1])

    def eval(self):
        return self.train(False)

    def train(self, mode=True):
        if mode:
            raise RuntimeError(f"{type(self).__name__}.train(True): dtorch.nn is inference only (no autograd); "
                               "use eval()")
        for module in self.modules():
            object.__setattr__(module, "training", False)
        return self

    def requires_grad_(self, requires_grad=True):
        if requires_grad:
            raise RuntimeError("dtorch.nn is inference only: parameters cannot require gradients")
        return self

    # ---- printing --------------------------------------------------------------------------------

    def extra_repr(self):
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        lines = self.extra_repr().split("\n") if self.extra_repr() else []
        for name, module in self._modules.items():
            lines.append(f"({name}): " + _indent(repr(module), 2))
        main = self._get_name() + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


def _indent(text, spaces):
    first, *rest = text.split("\n")
    return "\n".join([first] + [" " * spaces + line for line in rest])


def _shape_of(value):
    if isinstance(value, _TENSORS):
        return tuple(value.shape)
    shape = getattr(value, "shape", None)
    if shape is not None and not callable(shape):
        return tuple(int(s) for s in shape)
    return tuple(_host_array(value, "value").shape)


def _host_array(value, key):
    if isinstance(value, np.ndarray):
        return value
    try:
        if hasattr(value, "__dlpack__") and not hasattr(value, "__array__"):
            return np.from_dlpack(value)
        return np.asarray(value)
    except Exception as e:
        raise TypeError(f"{key}: cannot read {type(value).__name__} as an array: {e}") from None


def lay_out(value, like, key="value"):
    """``value`` (a host array, anything with the buffer protocol or DLPack, or a DTensor) as a DTensor
    with the dtype, mesh and placements of ``like`` (a DTensor or MetaTensor). A host array is
    distributed straight into the placements: each device's piece is copied out of the array's own
    memory (a memory-mapped file is read only where the pieces are), then cast on the devices."""
    mesh, placements, dt = like.device_mesh, tuple(like.placements), like.dtype
    if isinstance(value, MetaTensor):
        raise TypeError(f"{key}: a MetaTensor has no values to load")
    if isinstance(value, DTensor):
        if tuple(value.shape) != tuple(like.shape):
            raise ValueError(f"{key}: shape {tuple(value.shape)} does not match {tuple(like.shape)}")
        if value.dtype != dt:
            value = value.to(dt)
        if value.device_mesh != mesh or value.placements != placements:
            value = value.redistribute(mesh, placements)
        return value
    array = _host_array(value, key)
    if tuple(array.shape) != tuple(like.shape):
        raise ValueError(f"{key}: shape {tuple(array.shape)} does not match {tuple(like.shape)}")
    if _dtype._from_numpy(array.dtype) is None:
        # e.g. float64: converted on the host to the target's dtype (or float32 for bfloat16)
        array = array.astype(dt._numpy if dt._numpy is not None else np.float32)
    out = distribute_tensor(array, mesh, list(placements))
    return out if out.dtype == dt else out.to(dt)


def distribute_bits(bits, dtype, device_mesh, placements):
    """distribute_tensor for an array of raw elements of ``dtype`` held in an integer array of the
    same item size (bfloat16 read from a file as uint16: numpy has no bfloat16). Each device's piece
    is copied straight out of ``bits`` (strided: a slice of a memory map reads only its pages)."""
    if bits.dtype.itemsize != dtype.itemsize:
        raise TypeError(f"distribute_bits: {bits.dtype} items are not {dtype} items")
    # the bits pass under a numpy dtype of their size (a view, no copy); the dtype code says what they are
    carrier = {1: np.bool_, 2: np.float16, 4: np.float32, 8: np.int64}[bits.dtype.itemsize]
    return _C._distribute(bits.view(carrier), device_mesh, list(placements), dtype._code)
