"""Parallel styles with torch.distributed.tensor.parallel's names and semantics.

A style lays a module's parameters out over one dim of a mesh and adds forward hooks that lay
its inputs and outputs out as the style needs. Given a 1-D mesh, that is torch exactly. Given a
sub-mesh (``mesh["tp"]`` of a (dp, tp) mesh), tensors live on the whole root mesh: a style sets
the placement on its own dim and leaves the others as they are (parameters: Replicate; activations:
whatever they had, e.g. Shard(0) of the batch on dp).

Every tensor here is already a DTensor, so ``use_local_output`` (torch: hand the module's caller
the local shard) has no local tensor to give: outputs always stay DTensors with the style's
output layout, and the argument is accepted for torch compatibility only. A host array (numpy,
buffer protocol, DLPack) given as input is the whole value: it is distributed with the desired
layout. A DTensor input is redistributed when its placement on the style's dim differs from the
desired one (torch trusts the declared ``input_layouts`` instead; here the tensor says what it is).
"""
from .._factory import distribute_tensor
from .._placement import _SHARD, Partial, Placement, Replicate, Shard
from .._tensor import DTensor
from ..nn.layers import Embedding, Linear
from ..nn.module import MetaTensor
from ..quantization import QuantizedLinear, check_group_split


class ParallelStyle:
    """Base of the styles: ``_apply(module, device_mesh)`` parallelizes one module in place."""

    src_data_rank = 0

    def _apply(self, module, device_mesh):
        raise NotImplementedError


def mesh_dim(device_mesh):
    """(root mesh, dim of it) that a 1-D mesh or sub-mesh stands for."""
    if device_mesh.ndim != 1:
        raise ValueError(f"Tensor Parallel only accepts a 1D DeviceMesh, but found {device_mesh.ndim}D! If you have "
                         'a 2-D or N-D device_mesh, consider passing in device_mesh["tp"]')
    return device_mesh._get_root_mesh(), device_mesh._root_dims[0]


def named_dim_sizes(device_mesh, known, who):
    """{dim name: size} of ``device_mesh`` for a plan that knows the dim names ``known``; an unnamed
    mesh must be all ones, and an unknown name is a ValueError naming it (``who`` says whose)."""
    names = device_mesh.mesh_dim_names
    if names is None:
        if all(s == 1 for s in device_mesh.shape):
            return {}
        raise ValueError(f"{who}: name the dims of the {device_mesh.ndim}-D mesh (mesh_dim_names from {known})")
    for name in names:
        if name not in known:
            raise ValueError(f"{who}: unknown mesh dim name {name!r} (known: {', '.join(known)})")
    return dict(zip(names, device_mesh.shape))


def _normalize(p, ndim):
    return Shard(p.dim % ndim) if isinstance(p, Shard) and ndim and p.dim < 0 else p


def place(x, root, dim, placement):
    """x laid out on ``root`` with ``placement`` on mesh dim ``dim``; its other mesh dims keep their
    placements (a host array or a tensor from another mesh: Replicate there)."""
    if type(x) is DTensor and x.device_mesh is root:
        # every hook of every layer asks, and the answer is nearly always "as it is": compare the
        # handle's raw placement with the wanted one, without making Placement objects
        raw = placement._raw()
        if raw[0] == _SHARD and raw[1] < 0 and x.ndim:
            raw = (_SHARD, raw[1] % x.ndim, 0)
        if x._placements_raw[dim] == raw:
            return x
    if isinstance(x, (DTensor, MetaTensor)):
        ndim = x.ndim
        want = _normalize(placement, ndim)
        mesh = x.device_mesh
        if mesh is root or mesh == root:
            current = list(x.placements)
            if _normalize(current[dim], ndim) == want:
                return x
        else:
            current = [Replicate()] * root.ndim
        current[dim] = want
        if isinstance(want, Partial):
            raise ValueError(f"cannot lay a tensor out as {want}: redistributing into Partial is not allowed")
        return x.redistribute(root, current)
    if x is None:
        return None
    placements = [Replicate()] * root.ndim
    placements[dim] = placement
    return distribute_tensor(x, root, placements)


def distribute_module(module, device_mesh, partition_fn=None, input_fn=None, output_fn=None):
    """torch's distribute_module: ``partition_fn(name, module, device_mesh)`` lays the parameters
    out (default: every parameter and buffer Replicate on the mesh dim), ``input_fn(module, inputs,
    device_mesh)`` and ``output_fn(module, outputs, device_mesh)`` become forward hooks."""
    root, dim = mesh_dim(device_mesh)
    if partition_fn is None:
        for _, sub in module.named_modules():
            for name, t in list(sub._parameters.items()) + list(sub._buffers.items()):
                if t is not None:
                    setattr(sub, name, place(t, root, dim, Replicate()))
    else:
        for name, sub in module.named_modules():
            partition_fn(name, sub, device_mesh)
    if input_fn is not None:
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, device_mesh))
    if output_fn is not None:
        module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, device_mesh))
    return module


def _one(layouts, what):
    if layouts is None:
        return None
    if isinstance(layouts, Placement):
        return layouts
    layouts = tuple(layouts)
    if len(layouts) != 1 or not isinstance(layouts[0], Placement):
        raise ValueError(f"{what} must be one Placement (for the module's one input or output), got {layouts!r}")
    return layouts[0]


def _set(module, name, tensor):
    if tensor is not None:
        setattr(module, name, tensor)


class _LinearStyle(ParallelStyle):
    """What ColwiseParallel and RowwiseParallel share: one input, one output, hooks that lay them out."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        self.input_layouts = (_one(input_layouts, "input_layouts") or self._default_input,)
        self.output_layouts = (_one(output_layouts, "output_layouts") or self._default_output,)
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        root, dim = mesh_dim(device_mesh)
        if isinstance(module, Linear):
            weight, bias, desired = self._linear
        elif isinstance(module, QuantizedLinear):
            weight, bias, desired = self._linear
            _place_quantized(module, root, dim, weight)
        elif isinstance(module, Embedding):
            weight, bias, desired = self._embedding, None, Replicate()
        else:
            raise NotImplementedError(f"{type(self).__name__} currently only support nn.Linear and nn.Embedding!")
        if not isinstance(module, QuantizedLinear):
            _set(module, "weight", place(module.weight, root, dim, weight))
        if bias is not None and getattr(module, "bias", None) is not None:
            _set(module, "bias", place(module.bias, root, dim, bias))
        output = self.output_layouts[0]

        def prepare_input(mod, inputs):
            return (place(inputs[0], root, dim, desired),) + tuple(inputs[1:])

        def prepare_output(mod, inputs, outputs):
            return place(outputs, root, dim, output)

        module.register_forward_pre_hook(prepare_input)
        module.register_forward_hook(prepare_output)
        return module

    def __repr__(self):
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
                f"use_local_output={self.use_local_output})")


def _place_quantized(module, root, dim, weight):
    """A QuantizedLinear's qweight laid out as a float weight would be; its scales split with their
    rows (Shard(0)), and over the input features int8's per-row scales stay whole while int4's
    group scales split with their groups (a split that would cut a group is a ValueError)."""
    along_k = isinstance(weight, Shard) and weight.dim == 1
    if along_k:
        check_group_split(module, root.shape[dim])
    scale = Replicate() if along_k and module.bits == 8 else weight
    _set(module, "qweight", place(module.qweight, root, dim, weight))
    _set(module, "scale", place(module.scale, root, dim, scale))


class ColwiseParallel(_LinearStyle):
    """Column-wise sharding. nn.Linear: weight and bias Shard(0) (output features split), input
    Replicate, output Shard(-1). nn.Embedding: weight Shard(1) (embedding dim split), output Shard(-1).
    ``output_layouts`` redistributes the output (e.g. Replicate())."""

    _default_input, _default_output = Replicate(), Shard(-1)
    _linear = (Shard(0), Shard(0), Replicate())
    _embedding = Shard(1)


class RowwiseParallel(_LinearStyle):
    """Row-wise sharding. nn.Linear: weight Shard(1) (input features split), bias Replicate, input
    Shard(-1); the product is Partial(sum) and is all-reduced to the output layout (default
    Replicate; Shard(d) makes it a reduce-scatter). nn.Embedding: weight Shard(0) (vocabulary split),
    input Replicate, each device looks up the rows it holds (Partial), reduced to the output layout."""

    _default_input, _default_output = Shard(-1), Replicate()
    _linear = (Shard(1), Replicate(), Shard(-1))
    _embedding = Shard(0)


class SequenceParallel(ParallelStyle):
    """Parameters replicated; the input is laid out Shard(sequence_dim) and the module (a norm, a
    dropout) runs on each device's part of the sequence; the output stays sharded there."""

    def __init__(self, *, sequence_dim=1, use_local_output=False):
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        root, dim = mesh_dim(device_mesh)
        for _, sub in module.named_modules():
            for name, t in list(sub._parameters.items()):
                _set(sub, name, None if t is None else place(t, root, dim, Replicate()))
        sharding = self.sequence_sharding[0]

        def prepare_input(mod, inputs):
            return (place(inputs[0], root, dim, sharding),) + tuple(inputs[1:])

        module.register_forward_pre_hook(prepare_input)
        return module


def _layouts(value):
    if value is None:
        return None
    return (value,) if isinstance(value, Placement) else tuple(value)


class PrepareModuleInput(ParallelStyle):
    """Lays the module's inputs out before forward: positional input i from ``input_layouts[i]`` to
    ``desired_input_layouts[i]`` (None leaves it alone), keyword inputs by name with
    ``input_kwarg_layouts`` / ``desired_input_kwarg_layouts``."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output=False):
        self.input_layouts = _layouts(input_layouts)
        self.desired_input_layouts = _layouts(desired_input_layouts)
        self.use_local_output = use_local_output
        if self.input_layouts is not None:
            if self.desired_input_layouts is None:
                raise ValueError("desired module inputs should not be None!")
            if len(self.input_layouts) != len(self.desired_input_layouts):
                raise ValueError("input_layouts and desired_input_layouts should have same length!")
        self.with_kwargs = input_kwarg_layouts is not None
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        if self.with_kwargs and len(self.input_kwarg_layouts) != len(self.desired_input_kwarg_layouts):
            raise ValueError("input_kwarg_layouts and desired_input_kwarg_layouts should have same length!")

    @staticmethod
    def _prepare(x, root, dim, layout, desired):
        if layout is None or x is None:
            return x
        if not isinstance(x, DTensor):
            x = place(x, root, dim, Replicate() if isinstance(layout, Partial) else layout)
        return place(x, root, dim, desired if desired is not None else layout)

    def _prepare_args(self, inputs, root, dim):
        if self.input_layouts is None:
            return inputs
        if len(inputs) != len(self.input_layouts):
            raise ValueError("module inputs and input_layouts should have same length!")
        return tuple(self._prepare(x, root, dim, a, b)
                     for x, a, b in zip(inputs, self.input_layouts, self.desired_input_layouts))

    def _apply(self, module, device_mesh):
        root, dim = mesh_dim(device_mesh)
        if self.with_kwargs:
            def hook(mod, args, kwargs):
                kwargs = {k: self._prepare(v, root, dim, self.input_kwarg_layouts.get(k),
                                           self.desired_input_kwarg_layouts.get(k)) for k, v in kwargs.items()}
                return self._prepare_args(args, root, dim), kwargs
            module.register_forward_pre_hook(hook, with_kwargs=True)
        else:
            module.register_forward_pre_hook(lambda mod, args: self._prepare_args(args, root, dim))
        return module


class PrepareModuleOutput(ParallelStyle):
    """Lays the module's outputs out after forward: output i from ``output_layouts[i]`` to
    ``desired_output_layouts[i]`` (None leaves it alone)."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output=True):
        self.output_layouts = _layouts(output_layouts)
        self.desired_output_layouts = _layouts(desired_output_layouts)
        self.use_local_output = use_local_output
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise ValueError("output_layouts and desired_output_layouts should have same length!")

    def _apply(self, module, device_mesh):
        root, dim = mesh_dim(device_mesh)

        def hook(mod, inputs, outputs):
            single = not isinstance(outputs, tuple)
            outs = (outputs,) if single else outputs
            if len(outs) != len(self.output_layouts):
                raise ValueError("module outputs and output_layouts should have same length!")
            prepared = tuple(PrepareModuleInput._prepare(x, root, dim, a, b)
                             for x, a, b in zip(outs, self.output_layouts, self.desired_output_layouts))
            return prepared[0] if len(prepared) == 1 else prepared

        module.register_forward_hook(hook)
        return module


class ReplicateHeadsParallel(ParallelStyle):
    """For a projection onto fewer heads than the mesh dim's size (key/value heads of grouped-query
    attention, as vLLM does): the weight and bias stay Replicate, every device computes all
    ``num_heads`` heads, and the output (..., num_heads * head_dim) is widened to one head per
    device, each head repeated over size / num_heads neighbouring devices, then laid out Shard(-1):
    every device keeps exactly the head its share of query heads needs. The mesh dim's size must be
    a multiple of num_heads."""

    def __init__(self, num_heads, head_dim):
        self.num_heads, self.head_dim = int(num_heads), int(head_dim)

    def _apply(self, module, device_mesh):
        root, dim = mesh_dim(device_mesh)
        size = root.shape[dim]
        if size % self.num_heads:
            raise ValueError(f"ReplicateHeadsParallel: the mesh dim's size {size} is not a multiple of the "
                             f"{self.num_heads} heads")
        repeat = size // self.num_heads
        if not isinstance(module, (Linear, QuantizedLinear)):
            raise NotImplementedError("ReplicateHeadsParallel currently only supports nn.Linear")
        for name in ("weight", "bias", "qweight", "scale"):
            t = getattr(module, name, None)
            _set(module, name, None if t is None else place(t, root, dim, Replicate()))

        def prepare_input(mod, inputs):
            return (place(inputs[0], root, dim, Replicate()),) + tuple(inputs[1:])

        def prepare_output(mod, inputs, y):
            return place(repeat_heads(y, self.head_dim, repeat), root, dim, Shard(-1))

        module.register_forward_pre_hook(prepare_input)
        module.register_forward_hook(prepare_output)
        return module


def repeat_heads(y, head_dim, repeat):
    """y (..., n * head_dim) with each of its n heads repeated ``repeat`` times next to itself:
    (..., n * repeat * head_dim). Query head h of grouped-query attention reads the same values
    through it (its group widens by ``repeat`` as the heads do), so a split of the widened heads
    can give every device whole heads where a split of the n could not."""
    if repeat == 1:
        return y
    lead = y.shape[:-1]
    n = y.shape[-1] // head_dim
    heads = y.reshape(*lead, n, 1, head_dim)
    return heads.expand(*lead, n, repeat, head_dim).reshape(*lead, n * repeat * head_dim)
