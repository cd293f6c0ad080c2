"""Placements: how a DTensor is laid out along each dim of its mesh (as torch's DTensor)."""
import functools

_SHARD, _REPLICATE, _PARTIAL = 0, 1, 2
_REDUCE_OPS = ("sum", "avg", "max", "min")


class Placement:
    """Base class of Shard, Replicate and Partial."""

    __slots__ = ()

    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return False

    def is_partial(self):
        return False

    def _raw(self):
        # the base class itself, or a subclass of the user's: no layout the runtime knows
        raise TypeError(f"placements must hold Shard, Replicate or Partial, got {type(self).__name__}")


class Shard(Placement):
    """Split tensor dim ``dim`` across the mesh dim, as torch.chunk does (trailing pieces may be
    short or empty)."""

    __slots__ = ("dim",)

    def __init__(self, dim=0):
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"Shard(dim): dim must be an int, got {type(dim).__name__}")
        if not -2 ** 31 <= dim < 2 ** 31:
            raise ValueError(f"Shard(dim): dim {dim} is out of range (a tensor has at most 8 dims)")
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash((_SHARD, self.dim))

    def __repr__(self):
        return f"Shard(dim={self.dim})"

    def __str__(self):
        return f"S({self.dim})"

    def _raw(self):
        return (_SHARD, self.dim, 0)


class Replicate(Placement):
    """Every device along the mesh dim holds the whole (outer-sharded) tensor."""

    __slots__ = ()

    def is_replicate(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash(_REPLICATE)

    def __repr__(self):
        return "Replicate()"

    def __str__(self):
        return "R"

    def _raw(self):
        return (_REPLICATE, 0, 0)


class Partial(Placement):
    """Devices along the mesh dim hold contributions; the value is their reduction by
    ``reduce_op`` ("sum", "avg", "max" or "min")."""

    __slots__ = ("reduce_op",)

    def __init__(self, reduce_op="sum"):
        if reduce_op not in _REDUCE_OPS:
            raise ValueError(f"Partial: unknown reduce_op {reduce_op!r}; expected one of {_REDUCE_OPS}")
        self.reduce_op = reduce_op

    def is_partial(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op

    def __hash__(self):
        return hash((_PARTIAL, self.reduce_op))

    def __repr__(self):
        return f"Partial({self.reduce_op})"

    def __str__(self):
        return f"P({self.reduce_op})"

    def _raw(self):
        return (_PARTIAL, 0, _REDUCE_OPS.index(self.reduce_op))


@functools.lru_cache(maxsize=4096)
def _from_raw(raw):
    """Placements from the C handle's raw tuples; cached, since every op's rules and every parallel
    style ask for them (placements are never changed in place)."""
    return tuple(
        Shard(dim) if kind == _SHARD else Replicate() if kind == _REPLICATE else Partial(_REDUCE_OPS[op])
        for kind, dim, op in raw)
