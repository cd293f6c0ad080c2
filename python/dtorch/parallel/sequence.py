"""Sequence parallelism for joint attention: a sequence split over devices (a diffusion
transformer's image tokens) attending together with a block of context tokens (its text tokens,
split alike under Ulysses, whole along a ring), as one softmax over both.

A module with a joint attention slot holds in ``module.attention`` a callable

    attention(query, key, value, context_query, context_key, context_value, context_first=False,
              scale=None) -> (out, context_out)

with query, key, value (B, H, L, D) of the sequence and context_* (B, H, T, D) of the context block
(or None), ``context_first`` saying which comes first in the joint sequence. It returns the
sequence's output laid out like query and the context's laid out like context_query (None without
a context). The default the model holds is single-device code: concatenate, attend, split. The
styles here put a parallel one in the slot, each on one mesh dim:

- ``UlyssesJointAttention``: around whatever attention the slot holds, an all-to-all turns the
  sequence split of query, key and value into a split of the heads (every device sees the whole
  sequence for H / n heads); the context goes to the same heads alike (an all-to-all where it
  comes split on its sequence, a local slice where it comes whole). After attention both go back
  to the layouts they came in.
- ``RingJointAttention``: the slot's attention becomes a ring (dtorch.nn.functional.ring_attention,
  non-causal): the sequence's queries stay where they are while its key/value blocks travel device
  to device; the context keys/values are a joint block every device attends to once. The context
  queries, whole, attend to each device's block and the partial results merge.

Both at once: the heads split first (Ulysses on the outside), then the ring on each line of
devices along its dim; ``RingJointAttention`` replaces the attention inside a Ulysses wrapper, so
the order the styles are applied in does not matter. The styles lay nothing else out: splitting
the sequence before the first attention and gathering it after the last is the plan's work
(PrepareModuleInput / PrepareModuleOutput on the modules where the tokens enter and leave).
"""
from .. import _dtype
from .._factory import zeros
from .._placement import Replicate, Shard
from ..nn.functional import ring_attention
from .style import ParallelStyle, mesh_dim, place


def _slot(style, module):
    if not callable(getattr(module, "attention", None)):
        raise ValueError(f"{type(style).__name__}: {type(module).__name__} has no joint attention slot "
                         "(an 'attention' callable)")


class UlyssesJointAttention(ParallelStyle):
    """On a module with a joint attention slot (see the module's docstring): the all-to-all between
    a sequence split and a head split around the attention the slot holds, on the given mesh dim.
    The dim's size must divide the module's ``heads`` (where it says them)."""

    def _apply(self, module, device_mesh):
        root, dim = mesh_dim(device_mesh)
        _slot(self, module)
        size, heads = root.shape[dim], getattr(module, "heads", None)
        if heads is not None and heads % size:
            raise ValueError(f"UlyssesJointAttention: the mesh dim's size {size} does not divide the {heads} "
                             f"attention heads of {type(module).__name__}")
        module.attention = _UlyssesJoint(root, dim, module.attention)
        return module


class _UlyssesJoint:
    """The callable UlyssesJointAttention puts in a slot; ``inner`` is the attention it wraps."""

    def __init__(self, mesh, dim, inner):
        self.mesh, self.dim, self.inner = mesh, dim, inner

    def __call__(self, query, key, value, context_query=None, context_key=None, context_value=None,
                 context_first=False, scale=None):
        mesh, dim = self.mesh, self.dim
        heads = Shard(1)
        sequence_layout = query.placements[dim]
        query, key, value = (place(t, mesh, dim, heads) for t in (query, key, value))
        if context_query is not None:
            context_layout = context_query.placements[dim]
            context_query, context_key, context_value = (place(t, mesh, dim, heads)
                                                         for t in (context_query, context_key, context_value))
        out, context_out = self.inner(query, key, value, context_query, context_key, context_value,
                                      context_first=context_first, scale=scale)
        out = place(out, mesh, dim, sequence_layout)
        if context_out is not None:
            context_out = place(context_out, mesh, dim, context_layout)
        return out, context_out

    def __repr__(self):
        return f"UlyssesJointAttention(mesh_dim={self.dim}, inner={self.inner!r})"


class RingJointAttention(ParallelStyle):
    """On a module with a joint attention slot: the attention as a non-causal ring over the given
    mesh dim, the context a joint block (see the module's docstring). query, key and value come
    split on the sequence (Shard(2)) along the ring, the context whole. One style object applied to
    many modules shares their position tensors (zeros: every key is visible)."""

    def __init__(self):
        self._positions = {}

    def _apply(self, module, device_mesh):
        root, dim = mesh_dim(device_mesh)
        _slot(self, module)
        ring = _RingJoint(root, dim, self._positions)
        holder, name = module, "attention"
        while isinstance(getattr(holder, name), _UlyssesJoint):   # the ring runs inside the head split
            holder, name = getattr(holder, name), "inner"
        setattr(holder, name, ring)
        return module


class _RingJoint:
    """The callable RingJointAttention puts in a slot."""

    def __init__(self, mesh, dim, positions):
        self.mesh, self.dim, self._cache = mesh, dim, positions

    def __call__(self, query, key, value, context_query=None, context_key=None, context_value=None,
                 context_first=False, scale=None):
        # non-causal: the order of the joint sequence (context_first) changes nothing
        L, S = query.shape[2], key.shape[2]
        joint = {}
        if context_key is not None:
            joint = dict(joint_key=context_key, joint_value=context_value,
                         joint_index=self._positions(context_key.shape[2], False))
        out = ring_attention(query, key, value, self._positions(L, True), self._positions(S, True), self.dim,
                             is_causal=False, scale=scale, **joint)
        context_out = None
        if context_query is not None:
            context_out = ring_attention(context_query, key, value, self._positions(context_query.shape[2], False),
                                         self._positions(S, True), self.dim, is_causal=False, scale=scale, **joint)
        return out, context_out

    def _positions(self, length, along_ring):
        """Zeros (1, length) int64 as ring_attention's positions, split along the ring like the
        tokens they stand for (``along_ring``) or whole; made once per length."""
        key = (self.mesh, self.dim, length, along_ring)
        if key not in self._cache:
            if len(self._cache) >= 32:   # other resolutions and prompt lengths: forget the old ones
                self._cache.clear()
            placements = [Replicate()] * self.mesh.ndim
            if along_ring:
                placements[self.dim] = Shard(1)
            self._cache[key] = zeros((1, length), dtype=_dtype.int64, device_mesh=self.mesh, placements=placements)
        return self._cache[key]

    def __repr__(self):
        return f"RingJointAttention(mesh_dim={self.dim})"
