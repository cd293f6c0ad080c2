"""How a diffusion transformer is laid out over a mesh, by the mesh's dim names:

- ``dp``: the batch, which in a pipeline is the classifier-free-guidance pair (unconditional and
  conditional rows): every activation Shard(0) on dp, weights replicated.
- ``ulysses``: the image tokens split on the sequence; around attention an all-to-all turns the
  sequence split into a split of the heads (whole sequence, some heads per device) and back.
- ``ring``: the image tokens split on the sequence; attention runs as a true ring, the key/value
  blocks passed device to device (dtorch.nn.functional.ring_attention, non-causal).

They compose (``dp2 x ulysses2 x ring2`` on 8 devices). The text tokens (SD3's and FLUX's context
stream) are few: they stay whole on the context-parallel dims and take part in attention as a
joint block that every query sees (split by heads on ulysses, a block every ring device holds).
Between attentions everything is per token, so the image stream stays split end to end and is
gathered once, at the output. An absent name means size 1; an unknown name, or a ulysses size that
does not divide the heads, is a ValueError naming it.
"""
import numpy as np

from .. import _dtype
from .._factory import distribute_tensor, zeros
from .._placement import Replicate, Shard
from ..nn import functional as F
from .._ops_view import cat
from ..parallel.style import named_dim_sizes

KNOWN_DIMS = ("dp", "ulysses", "ring")


class DiffusionParallel:
    """The layout of one diffusion transformer over ``device_mesh``: where activations live
    (``batch``, ``image``, ``gather``) and joint attention over image and text tokens
    (``attention``). ``num_heads``: the model's attention heads (ulysses splits them)."""

    def __init__(self, device_mesh, num_heads, who):
        self.mesh = device_mesh
        self.who = who
        self.sizes = named_dim_sizes(device_mesh, KNOWN_DIMS, who)
        names = list(device_mesh.mesh_dim_names or ())
        self.dp = names.index("dp") if "dp" in names else None
        self.ulysses = names.index("ulysses") if "ulysses" in names else None
        self.ring = names.index("ring") if "ring" in names else None
        u = self.sizes.get("ulysses", 1)
        if num_heads % u:
            raise ValueError(f"{who}: the ulysses size {u} does not divide the {num_heads} attention heads")
        self._index = {}

    def __repr__(self):
        return f"DiffusionParallel({', '.join(f'{k}={v}' for k, v in self.sizes.items()) or 'one device'})"

    # ---- layouts ----------------------------------------------------------------------------------

    def _placements(self, sequence_dim):
        """Shard(0) on dp, Shard(sequence_dim) on the context-parallel dims (None: Replicate)."""
        out = [Replicate()] * self.mesh.ndim
        if self.dp is not None:
            out[self.dp] = Shard(0)
        for d in (self.ulysses, self.ring):
            if d is not None and sequence_dim is not None:
                out[d] = Shard(sequence_dim)
        return out

    def _to(self, x, placements):
        if x.device_mesh != self.mesh:
            raise ValueError(f"{self.who}: an input lives on {x.device_mesh}, not on the model's mesh {self.mesh}")
        return x if list(x.placements) == placements else x.redistribute(self.mesh, placements)

    def batch(self, x):
        """x (B, ...) split on the batch over dp, whole elsewhere: text tokens, timestep and
        pooled embeddings."""
        return self._to(x, self._placements(None))

    def image(self, x):
        """Image tokens (B, L, C): the batch over dp, the sequence over ulysses and ring."""
        return self._to(x, self._placements(1))

    def gather(self, x):
        """Image tokens (B, L, C) whole on the context-parallel dims again (the batch stays split)."""
        return self._to(x, self._placements(None))

    def rotary(self, table, image):
        """A host rotary table (L, D) as (1, 1, L, D) on the mesh, laid out like the (B, H, L, D)
        queries of its tokens: split on the sequence over ulysses and ring for the image tokens
        (``image``), whole for the text; whole on dp either way."""
        placements = [Replicate()] * self.mesh.ndim
        for d in (self.ulysses, self.ring):
            if d is not None and image:
                placements[d] = Shard(2)
        return distribute_tensor(np.ascontiguousarray(table)[None, None], self.mesh, placements)

    # ---- attention ----------------------------------------------------------------------------------

    def attention(self, query, key, value, context_query=None, context_key=None, context_value=None,
                  context_first=False, scale=None):
        """Joint attention of the image tokens (query, key, value: (B, H, L, D), the sequence split
        as ``image`` lays it) and the text tokens (context_*: (B, H, Lt, D), whole), every query
        seeing every key, as one softmax over the concatenated sequence. Returns the image part
        (laid out like query) and the text part (whole; None without a context)."""
        has_context = context_query is not None
        u, r = self.sizes.get("ulysses", 1), self.sizes.get("ring", 1)
        if u > 1:  # the sequence split becomes a split of the heads (an all-to-all)
            query, key, value = (self._move(t, self.ulysses, Shard(1)) for t in (query, key, value))
            if has_context:  # whole on every device: taking its heads is a local slice
                context_query, context_key, context_value = (
                    self._move(t, self.ulysses, Shard(1)) for t in (context_query, context_key, context_value))
        if r > 1:
            out, context_out = self._ring(query, key, value, context_query, context_key, context_value, scale)
        elif has_context:
            first, second = (query, key, value), (context_query, context_key, context_value)
            if context_first:
                first, second = second, first
            q, k, v = (cat([a, b], dim=2) for a, b in zip(first, second))
            o = F.scaled_dot_product_attention(q, k, v, scale=scale)
            n = first[0].shape[2]
            o_first, o_second = o[:, :, :n], o[:, :, n:]
            out, context_out = (o_second, o_first) if context_first else (o_first, o_second)
        else:
            out, context_out = F.scaled_dot_product_attention(query, key, value, scale=scale), None
        if u > 1:  # and back: the image tokens split on the sequence, the text whole
            out = self._move(out, self.ulysses, Shard(2))
            if context_out is not None:
                context_out = self._move(context_out, self.ulysses, Replicate())
        return out, context_out

    def _move(self, x, dim, placement):
        if x.placements[dim] == placement:
            return x
        placements = list(x.placements)
        placements[dim] = placement
        return x.redistribute(self.mesh, placements)

    def _positions(self, length, sequence_split):
        """Zeros (1, length) int64 as ring_attention's positions (non-causal: every key visible),
        split on the ring like the tokens they stand for or whole; made once per length."""
        key = (length, sequence_split)
        if key not in self._index:
            placements = [Replicate()] * self.mesh.ndim
            if sequence_split:
                placements[self.ring] = Shard(1)
            self._index[key] = zeros((1, length), dtype=_dtype.int64, device_mesh=self.mesh, placements=placements)
        return self._index[key]

    def _ring(self, query, key, value, context_query, context_key, context_value, scale):
        """The ring: image queries stay where they are while the image key/value blocks travel; the
        text keys/values are a joint block every device of the ring attends to once. The text
        queries, whole on the ring, attend to each device's block and the partial results merge."""
        ring = self.ring
        L, S = query.shape[2], key.shape[2]
        joint = {}
        if context_key is not None:
            joint = dict(joint_key=context_key, joint_value=context_value,
                         joint_index=self._positions(context_key.shape[2], False))
        out = F.ring_attention(query, key, value, self._positions(L, True), self._positions(S, True), ring,
                               is_causal=False, scale=scale, **joint)
        context_out = None
        if context_query is not None:
            context_out = F.ring_attention(context_query, key, value, self._positions(context_query.shape[2], False),
                                           self._positions(S, True), ring, is_causal=False, scale=scale, **joint)
        return out, context_out

