"""Context parallelism: the sequence split over devices, attention over all of it.

Two ways, each on a mesh dim of its own, and both at once:

- Ulysses (``UlyssesParallel`` on the q/k/v/o projections): activations are split on the sequence;
  an all-to-all after each of the q, k and v projections turns the sequence split into a split of
  the heads, attention runs over the whole sequence for the heads a device holds, and one before
  the o projection turns it back. The KV cache holds the device's heads.
- Ring (``RingAttention`` in a layer's attention slot): q stays where it is; the key/value blocks
  travel around the ring of devices, worker to worker, each device merging the partial attention
  of every block by the log-sum-exp rule (ops: dtorch.nn.functional.ring_attention). Visibility
  goes by positions, so the sequence may be laid out in any order: ``ContextParallelInput`` lays
  it out zig-zag (device i holds the i-th and the (2n-1-i)-th pieces), which gives every device the
  same causal work. The KV cache is split on its slots along the ring; in decode the one new token
  is on every device of the ring and each attends to its own slots.

A forward of fewer tokens than the context-parallel devices (decode) keeps its activations
replicated on those dims.
"""
import dataclasses

import numpy as np

from .._factory import distribute_tensor
from .._ops import where
from .._placement import Replicate, Shard
from .._tensor import DTensor
from ..nn.functional import ring_attention
from .style import ParallelStyle, mesh_dim, place, repeat_heads


def zigzag_order(length, n):
    """The order of the sequence positions that gives ring device r, which holds the r-th torch.chunk
    piece of the reordered sequence, one run of positions from the front and one from the back:
    the first half of its piece from the front, the rest from the back (so causal work is even)."""
    if n <= 1 or length == 0:
        return np.arange(length, dtype=np.int64)
    size = -(-length // n)
    front, back = 0, length
    order = []
    for r in range(n):
        piece = max(0, min(size, length - r * size))
        head = (piece + 1) // 2
        order.extend(range(front, front + head))
        order.extend(range(back - (piece - head), back))
        front, back = front + head, back - (piece - head)
    return np.asarray(order, dtype=np.int64)


def _with(placements, dim, placement):
    out = list(placements)
    out[dim] = placement
    return out


def _move(x, mesh, dim, placement):
    """x with ``placement`` on mesh dim ``dim`` (the others as they are)."""
    if x.placements[dim] == placement:
        return x
    return x.redistribute(mesh, _with(x.placements, dim, placement))


class UlyssesParallel(ParallelStyle):
    """On a q/k/v projection (``output=True``): its output (B, L, heads * D), split on the sequence
    over the mesh dim, becomes split on the features (whole heads); on the o projection
    (``output=False``): its input goes back to the sequence split. ``cp_size``: the devices of every
    context-parallel dim together; a forward of fewer tokens stays replicated on the dim.
    ``repeat_heads`` > 1 (k/v projections with fewer heads than the devices that split them, with
    ``head_dim``): each head is first repeated that many times next to itself, so that every device
    gets the whole head its share of the query heads reads (repeat_heads)."""

    def __init__(self, *, output, cp_size, repeat_heads=1, head_dim=None):
        if repeat_heads > 1 and not head_dim:
            raise ValueError("UlyssesParallel: repeat_heads needs head_dim")
        self.output, self.cp_size = output, cp_size
        self.repeat_heads, self.head_dim = int(repeat_heads), head_dim

    def _apply(self, module, device_mesh):
        root, dim = mesh_dim(device_mesh)
        cp = self.cp_size

        def to_heads(mod, inputs, y):
            return place(repeat_heads(y, self.head_dim, self.repeat_heads), root, dim, Shard(2))

        def to_sequence(mod, inputs):
            x = inputs[0]
            return (place(x, root, dim, Shard(1) if x.shape[1] >= cp else Replicate()),) + tuple(inputs[1:])

        if self.output:
            module.register_forward_hook(to_heads)
        else:
            module.register_forward_pre_hook(to_sequence)
        return module


@dataclasses.dataclass
class RingAttentionInputs:
    """What ring attention needs besides q, k and v, built once per forward for every layer: the
    position of each query row (``query_index`` (B|1, L)) and each key slot (``key_index`` (B|1,
    S): -1 for padding or an empty slot). Visibility goes by positions, so the sequence may be laid
    out in any order."""

    query_index: DTensor
    key_index: DTensor


def ring_attention_inputs(attention_mask, position_ids, cache, slots, start, L, S, sliding_window=None):
    """RingAttentionInputs for a forward of L tokens at ``position_ids`` (B|1, L): the new tokens'
    positions, -1 for padding; with a cache, the keys are every slot's, written into the cache here
    once for all layers at ``slots`` (the first new slot ``start``, or the slots as a DTensor). What
    parallelize_llama puts in LlamaModel's ``attention_inputs`` slot with ring attention; as
    causal_attention_inputs, by layer type.

    Ring attention applies no sliding window: a model with one is run as long as its S key slots
    (the cache's, or the L tokens without one) are at most ``sliding_window``, where the window
    hides nothing; past that, a ValueError."""
    if sliding_window is not None and S > sliding_window:
        raise ValueError(f"ring attention applies no sliding window: {S} key slot(s) are more than the model's "
                         f"sliding_window={sliding_window}, so the window would hide some; keep prompt and new "
                         "tokens within the window, or lay the model out without ring (ulysses applies it)")
    if attention_mask is not None and attention_mask.ndim == 4:
        raise ValueError("a 4-D attention_mask needs attention over slots; this model attends by positions "
                         "(ring attention)")
    key_index = position_ids                                                   # (B|1, L)
    if attention_mask is not None:
        K = attention_mask.shape[1]
        if K not in (L, start + L):
            raise ValueError(f"attention_mask covers {K} positions; expected the {L} new tokens or all "
                             f"{start + L} so far")
        real = attention_mask[:, K - L:]                                       # (B, L): the new tokens
        key_index = where(real, position_ids, -1)                              # (B, L)
    if cache is not None:
        if not hasattr(cache, "update_key_index"):
            raise ValueError(f"ring attention needs a cache that knows its slots' positions: make it with the "
                             f"model's cache_class (RingStaticCache), not {type(cache).__name__}")
        key_index = cache.update_key_index(key_index, slots)                   # (B|1, S)
    inputs = RingAttentionInputs(query_index=position_ids, key_index=key_index)
    return {"full_attention": inputs, "sliding_attention": inputs}


class RingAttention:
    """A layer's attention as a ring over mesh dim ``dim`` of ``mesh``: the callable a LlamaAttention
    holds in its ``attention`` slot, ``(q, k, v, inputs, scale) -> o`` with q (B, H, L, D) and k, v
    (B, Hkv, S, D), and ``inputs`` the RingAttentionInputs of the forward."""

    def __init__(self, mesh, dim):
        self.mesh, self.dim = mesh, dim

    def __call__(self, q, k, v, inputs, scale):
        mesh, dim = self.mesh, self.dim
        prefill = isinstance(q.placements[dim], Shard)
        k, v = _move(k, mesh, dim, Shard(2)), _move(v, mesh, dim, Shard(2))
        q_index = self._index(inputs.query_index, q, Shard(1) if prefill else Replicate())
        k_index = self._index(inputs.key_index, q, Shard(1))
        return ring_attention(q, k, v, q_index, k_index, dim, is_causal=True, scale=scale)

    def _index(self, index, q, on_ring):
        """Positions (B|1, N) laid out as ring_attention needs them next to q: ``on_ring`` on the
        ring's dim, the batch split where q's is (and the index has a batch), else Replicate."""
        want = []
        for m, p in enumerate(q.placements):
            if m == self.dim:
                want.append(on_ring)
            elif isinstance(p, Shard) and p.dim == 0 and index.shape[0] > 1:
                want.append(Shard(0))
            else:
                want.append(Replicate())
        return index if list(index.placements) == want else index.redistribute(self.mesh, want)

    def __repr__(self):
        return f"RingAttention(mesh_dim={self.dim})"


class ContextParallelInput(ParallelStyle):
    """On the decoder stack (LlamaModel): lays the sequence out over the context-parallel mesh dims
    ``dims`` (ring and Ulysses) before the forward and back after it. A forward of at least as many
    tokens as those devices is split on the sequence (zig-zag first when ``ring_size`` > 1: the
    tokens, their positions and the new tokens' attention_mask columns alike); a shorter one is
    replicated. Its output, the hidden states (B, L, E), comes back in the sequence's own order."""

    def __init__(self, mesh, dims, ring_size):
        self.mesh, self.dims, self.ring_size = mesh, tuple(dims), ring_size
        self.cp_size = int(np.prod([mesh.shape[d] for d in dims]))

    def _apply(self, module, device_mesh=None):
        state = {}

        def enter(mod, args, kwargs):
            kwargs = dict(kwargs)
            names = ("input_ids", "attention_mask", "position_ids", "past_key_values", "cache_position")
            if len(args) > len(names):
                raise TypeError(f"{type(mod).__name__}.forward: at most {len(names)} positional arguments "
                                f"({', '.join(names)}), got {len(args)}")
            for name, value in zip(names, args):
                kwargs[name] = value
            ids = kwargs["input_ids"]
            B, L = ids.shape
            state["inverse"] = None
            if L >= self.cp_size:
                cache = kwargs.get("past_key_values")
                start = cache.get_seq_length() if cache is not None else 0
                if self.ring_size > 1:
                    kwargs.update(self._zigzag(ids, kwargs.get("attention_mask"), kwargs.get("position_ids"), start))
                    state["inverse"] = np.argsort(kwargs.pop("_order"))
                ids = kwargs["input_ids"]
                for d in self.dims:
                    ids = _move(ids, self.mesh, d, Shard(1))
                kwargs["input_ids"] = ids
            return (), kwargs

        def leave(mod, args, kwargs, h):
            inverse = state.pop("inverse", None)
            if inverse is None:
                return h
            index = distribute_tensor(inverse, h.device_mesh)
            return h.index_select(1, index)

        module.register_forward_pre_hook(enter, with_kwargs=True)
        module.register_forward_hook(leave, with_kwargs=True)
        return module

    def _zigzag(self, ids, attention_mask, position_ids, start):
        """The new tokens (and what goes with them) in zig-zag order for the ring."""
        L = ids.shape[1]
        order = zigzag_order(L, self.ring_size)
        index = distribute_tensor(order, ids.device_mesh)
        out = {"input_ids": ids.index_select(1, index), "_order": order}
        if position_ids is None:
            position_ids = (start + np.arange(L, dtype=np.int64))[None, :]
        out["position_ids"] = _host(position_ids, "position_ids")[:, order]
        if attention_mask is not None:
            mask = _host(attention_mask, "attention_mask")
            mask = np.concatenate([mask[:, :mask.shape[1] - L], mask[:, mask.shape[1] - L:][:, order]], axis=1)
            out["attention_mask"] = mask
        return out

    def __repr__(self):
        return f"ContextParallelInput(mesh_dims={self.dims}, ring_size={self.ring_size})"


def _host(x, name):
    if isinstance(x, DTensor):
        raise NotImplementedError(f"Ring attention: give {name} as a host array (it is reordered zig-zag with the "
                                  "tokens), not a DTensor")
    return np.asarray(x)
