"""Key/value caches of the causal language models (transformers' cache_utils): ``StaticCache``, slot
i holding position i, and ``RingStaticCache``, the cache of ring attention, whose slots know their
positions and may be laid out per device. A parallelize function names the class a model's caches
take (``model.cache_class``)."""
from .. import _dtype
from .._factory import full, zeros
from .._ops_write import write_pieces_, write_slice_
from .._placement import Partial, Replicate, Shard
from .._tensor import DTensor


class StaticCache:
    """Keys and values of every layer, pre-allocated for ``max_cache_len`` slots and laid out like the
    keys and values themselves (heads split where they are split): (B, Hkv, max_cache_len, D) per
    layer, made on the first write; slot i holds position i. ``key_mask`` (B, 1, 1, max_cache_len)
    marks the slots that hold real tokens (left padding) once a forward was given an attention_mask.

    A parallel strategy that lays the slots out otherwise brings a subclass of its own (ring
    attention's RingStaticCache, dtorch.parallel.context), which the parallelize function names as
    the model's ``cache_class``."""

    def __init__(self, max_cache_len):
        if isinstance(max_cache_len, bool) or int(max_cache_len) < 1:
            raise ValueError(f"StaticCache: max_cache_len must be positive, got {max_cache_len}")
        self.max_cache_len = int(max_cache_len)
        self.key_cache, self.value_cache = {}, {}
        self.key_mask = None
        self._filled = 0
        self._groups_key, self._groups = None, []   # split(): the micro-batches' rows and caches

    def get_seq_length(self, layer_idx=0):
        """Slots written so far (by the fullest group, when the cache is split into groups)."""
        return max([self._filled] + [g.get_seq_length() for g in self._groups])

    def get_max_cache_shape(self):
        return self.max_cache_len

    def _check_room(self, start, n):
        if start + n > self.max_cache_len:
            raise ValueError(f"StaticCache: slots up to {start + n} needed, the cache holds {self.max_cache_len}")

    def update(self, layer_idx, key_states, value_states, start):
        """Writes keys and values (B, Hkv, L, D) of layer ``layer_idx`` at slots [start, start + L)
        and returns the layer's whole keys and values (B, Hkv, slots, D). ``start`` may be the slots
        themselves, an (L,) int64 DTensor (the forward's ``cache_position``): then the devices write
        where it says, so a captured step writes the right slots on every replay.

        The one place the cache is written: in place, each device into its own slots."""
        L = key_states.shape[2]
        if not isinstance(start, DTensor):
            self._check_room(start, L)
        if layer_idx not in self.key_cache:
            self.key_cache[layer_idx] = _slots_like(key_states, self.max_cache_len)
            self.value_cache[layer_idx] = _slots_like(value_states, self.max_cache_len)
        if isinstance(start, DTensor):
            self.key_cache[layer_idx].index_copy_(2, start, key_states)
            self.value_cache[layer_idx].index_copy_(2, start, value_states)
            if layer_idx == min(self.key_cache):
                # counted as if the slots continue the filled ones, as generation gives them
                self._filled = min(self.max_cache_len, self._filled + L)
        else:
            write_slice_(self.key_cache[layer_idx], 2, start, key_states)
            write_slice_(self.value_cache[layer_idx], 2, start, value_states)
            self._filled = max(self._filled, start + L)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def slots_by_index(self):
        """Whether the slots can be written at positions held by a tensor (``update`` with a DTensor
        start): no cache tensor split along the slots."""
        return not any(isinstance(p, Shard) and p.dim == 2 for t in list(self.key_cache.values())
                       + list(self.value_cache.values()) for p in t.placements)

    def split(self, slices):
        """One cache per group of rows (the micro-batches of a pipeline), made once and kept; the
        groups must be the same on every call."""
        key = tuple((s.start, s.stop) for s in slices)
        if self._groups_key != key:
            if self._groups_key is not None:
                raise ValueError("StaticCache: the batch was split into other micro-batches than before")
            self._groups_key, self._groups = key, [type(self)(self.max_cache_len) for _ in slices]
        return self._groups

    @classmethod
    def of_groups(cls, slices, caches):
        """The cache of a batch whose groups of rows (``slices``) made their own ``caches``."""
        cache = cls(caches[0].max_cache_len)
        cache._groups_key, cache._groups = tuple((s.start, s.stop) for s in slices), list(caches)
        return cache


def _slots_like(x, slots, placements=None):
    """Zeros (B, H, slots, D) laid out like x (B, H, L, D), or with ``placements``."""
    B, H, _, D = x.shape
    return zeros(B, H, slots, D, device_mesh=x.device_mesh,
                 placements=placements if placements is not None else _no_partial(x.placements), dtype=x.dtype)


def _no_partial(placements):
    return [Replicate() if isinstance(p, Partial) else p for p in placements]


class RingStaticCache(StaticCache):
    """The key/value cache of ring attention: a StaticCache whose slots also know their positions
    (``key_index`` (B|1, slots): -1 for an empty slot or padding), since ring attention decides
    visibility by positions, and whose slots are laid out per device when the first keys come split
    on the sequence along one mesh dim (``_SlotBlocks``): each device keeps its own block of the
    keys where it already is and the later tokens spread over the devices, so no write moves keys
    between devices. parallelize_llama makes it the model's ``cache_class``."""

    def __init__(self, max_cache_len):
        super().__init__(max_cache_len)
        self.key_index = None
        self._blocks = None     # _SlotBlocks when the slots are laid out per device
        self._writes = None     # (start, the writes of this forward) in that layout

    def update(self, layer_idx, key_states, value_states, start):
        """As StaticCache's, where the per-device layout puts the keys: after their positions were
        written (``update_key_index``) in the same forward."""
        blocks = self._blocks
        if blocks is None:
            return super().update(layer_idx, key_states, value_states, start)
        if isinstance(start, DTensor):
            raise ValueError(_BY_INDEX)
        self._check_room(start, key_states.shape[2])
        if layer_idx not in self.key_cache:
            placements = _no_partial(key_states.placements)
            placements[blocks.dim] = Shard(2)
            self.key_cache[layer_idx] = _slots_like(key_states, blocks.slots, placements)
            self.value_cache[layer_idx] = _slots_like(value_states, blocks.slots, placements)
        if self._writes is None or self._writes[0] != start:
            raise ValueError("StaticCache: laid out per device, keys are written after their positions "
                             "(update_key_index) in the same forward")
        for x, cache in ((key_states, self.key_cache), (value_states, self.value_cache)):
            blocks.write(cache[layer_idx], 2, x, self._writes[1])
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def update_key_index(self, index, start):
        """Writes the positions (B|1, L) of the keys of a forward (before its layers write the keys);
        returns every slot's (B|1, slots): -1 where nothing was written."""
        L = index.shape[1]
        if not isinstance(start, DTensor):
            self._check_room(start, L)
        if self.key_index is not None and self.key_index.shape[0] != index.shape[0]:
            raise ValueError(f"StaticCache: key positions for {index.shape[0]} rows, the cache holds them for "
                             f"{self.key_index.shape[0]} (give position_ids of the same batch on every step)")
        if self.key_index is None:
            self._blocks = _SlotBlocks.for_first(index, self.max_cache_len)
            slots = self._blocks.slots if self._blocks else self.max_cache_len
            self.key_index = full((index.shape[0], slots), -1, device_mesh=index.device_mesh,
                                  placements=_no_partial(index.placements), dtype=_dtype.int64)
        if isinstance(start, DTensor):
            if self._blocks:
                raise ValueError(_BY_INDEX)
            self.key_index.index_copy_(1, start, index)
        elif self._blocks:
            self._writes = (start, self._blocks.plan(index, 1))
            self._blocks.write(self.key_index, 1, index, self._writes[1])
            self._filled = start + L
        else:
            write_slice_(self.key_index, 1, start, index)
        return self.key_index

    def slots_by_index(self):
        return self._blocks is None and super().slots_by_index() and not (
            self.key_index is not None and any(isinstance(p, Shard) and p.dim == 1 for p in self.key_index.placements))


_BY_INDEX = ("StaticCache: slots given as a tensor (cache_position) need the plain layout; this cache is laid out "
             "per device (ring attention)")


class _SlotBlocks:
    """Cache slots laid out per device along mesh dim ``dim`` (n devices): device r holds slots
    [r * per_device, (r + 1) * per_device), filled from the start of its block. A write of keys
    split on the sequence along ``dim`` puts each device's piece in its own block (shard_assign_:
    nothing moves); any other write spreads its tokens over the emptiest blocks, in at most n
    contiguous runs (each a write_slice_ that only the block's device does). Attention by
    positions reads the slots in any order."""

    def __init__(self, mesh, dim, capacity):
        self.dim = dim
        self.n = mesh.shape[dim]
        self.per_device = -(-capacity // self.n)
        self.slots = self.n * self.per_device
        self.fill = [0] * self.n

    @classmethod
    def for_first(cls, index, capacity):
        """The layout for a cache whose first positions are ``index``: per device when they are split
        on the sequence along exactly one mesh dim, else None (slot i holds position i)."""
        split = [m for m, p in enumerate(index.placements) if isinstance(p, Shard) and p.dim == 1]
        return cls(index.device_mesh, split[0], capacity) if len(split) == 1 and index.shape[1] > 0 else None

    def _split_here(self, x, seq_dim):
        return [m for m, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim == seq_dim] == [self.dim]

    def plan(self, index, seq_dim):
        """The writes of L new positions: ("pieces", offset) or [(slot, a, b), ...] runs of tokens."""
        L = index.shape[seq_dim]
        size = -(-L // self.n) if L else 0
        pieces = [max(0, min(size, L - r * size)) for r in range(self.n)]
        if self._split_here(index, seq_dim) and len(set(self.fill)) == 1 and \
                self.fill[0] + size <= self.per_device:
            offset = self.fill[0]
            self.fill = [f + p for f, p in zip(self.fill, pieces)]
            return ("pieces", offset)
        counts = [0] * self.n
        for _ in range(L):   # water-filling: each token to the emptiest block with room
            r = min((r for r in range(self.n) if self.fill[r] + counts[r] < self.per_device),
                    key=lambda r: self.fill[r] + counts[r])
            counts[r] += 1
        runs, a = [], 0
        for r, k in enumerate(counts):
            if k:
                runs.append((r * self.per_device + self.fill[r], a, a + k))
                self.fill[r] += k
                a += k
        return runs

    def write(self, dst, seq_dim, x, writes):
        """Carries out ``plan``'s writes of x (its new positions on ``seq_dim``) into dst."""
        if writes and writes[0] == "pieces":
            write_pieces_(dst, seq_dim, writes[1], x)
            return
        if any(isinstance(p, Shard) and p.dim == seq_dim for p in x.placements):   # gathered once, not per run
            x = x.redistribute(x.device_mesh, [Replicate() if isinstance(p, Shard) and p.dim == seq_dim else p
                                               for p in _no_partial(x.placements)])
        for slot, a, b in writes:
            write_slice_(dst, seq_dim, slot, x if (a, b) == (0, x.shape[seq_dim]) else x.narrow(seq_dim, a, b - a))
