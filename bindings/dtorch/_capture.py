"""dtorch.capture: the ops a function issues, recorded once and kept on the devices, then
replayed by one small record per device, so that a replay costs the user's thread the same
whatever the number of ops in it."""
import dataclasses
import functools

from . import _C
from ._tensor import DTensor


def capture(fn=None, *example_args, **example_kwargs):
    """A ``CapturedFunction`` that replays the ops ``fn`` issues.

    ``dtorch.capture(fn, *example_args, **example_kwargs)`` records ``fn`` on those arguments at
    once; ``dtorch.capture(fn)`` or ``@dtorch.capture`` records it on its first call. Recording
    runs ``fn``'s Python code once without running its ops: the devices keep the op records, and
    every call then replays them on the arguments given, returning fresh DTensors (the first call
    too: recording alone computes nothing).

    What is fixed per capture: the DTensor arguments' shapes, dtypes, meshes and placements, and
    every other argument's value (arguments that differ from the ones recorded make a new
    capture, kept beside the first). Python code inside ``fn`` runs only while recording: its
    side effects happen once, and values it computes from the arguments are frozen in the
    records. DTensors that ``fn`` uses without taking them as arguments (weights, a cache it writes
    in place) are the same tensors in every replay, kept on the devices as long as the capture
    lives. Random factories draw new numbers on every replay, as if the ops were issued again.

    Inside ``fn`` anything that needs the controller is refused with a RuntimeError: fetches
    (``.numpy()``, ``.item()``, printing a value), ``dtorch.synchronize()``, tensors made from host
    data (``distribute_tensor`` of an array), device stats, and replays of other captures. DTensors
    made inside hold no value: use the ones a replay returns. An op that fails on a device during a
    replay poisons its outputs with a message that names it and its place in the capture."""
    if fn is None:
        return functools.partial(capture)
    if not callable(fn):
        raise TypeError(f"capture: expected a function, got {type(fn).__name__}")
    captured = CapturedFunction(fn)
    if example_args or example_kwargs:
        captured._capture(example_args, example_kwargs)
    return captured


class CapturedFunction:
    """``fn`` with its captures, one per kind of arguments (see ``dtorch.capture``)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "captured")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self._captures = {}

    def __repr__(self):
        return f"<dtorch.capture of {self.__qualname__}: {len(self._captures)} capture(s)>"

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    @property
    def num_captures(self):
        return len(self._captures)

    @property
    def num_records(self):
        """Op records the devices keep for the most recent capture (over all devices)."""
        return next(reversed(self._captures.values())).graph.num_records if self._captures else 0

    def __call__(self, *args, **kwargs):
        leaves, tree = _flatten((args, kwargs))
        key = (tree, tuple(_key_of(leaf) for leaf in leaves))
        entry = self._captures.get(key)
        if entry is None:
            entry = self._capture(args, kwargs, leaves, tree, key)
        return entry.replay(leaves)

    def _capture(self, args, kwargs, leaves=None, tree=None, key=None):
        if leaves is None:
            leaves, tree = _flatten((args, kwargs))
            key = (tree, tuple(_key_of(leaf) for leaf in leaves))
        inputs = [leaf for leaf in leaves if isinstance(leaf, DTensor)]
        _C._capture_begin(self.__qualname__, inputs)
        try:
            result = self.fn(*args, **kwargs)
            out_leaves, out_tree = _flatten(result)
        except BaseException:
            _C._capture_abort()
            raise
        slot_of_input = {id(t): i for i, t in enumerate(inputs)}
        # how each output leaf comes back from a replay: a new tensor, an input, or a constant
        plan, made, seen = [], [], {}
        for leaf in out_leaves:
            if isinstance(leaf, DTensor) and _C._capture_made(leaf):
                if id(leaf) not in seen:
                    seen[id(leaf)] = len(made)
                    made.append(leaf)
                plan.append(("made", seen[id(leaf)]))
            elif isinstance(leaf, DTensor) and id(leaf) in slot_of_input:
                plan.append(("input", slot_of_input[id(leaf)]))
            else:
                plan.append(("constant", leaf))
        graph = _C._capture_end(made)
        entry = _Capture(graph, plan, out_tree)
        self._captures[key] = entry
        return entry


class _Capture:
    def __init__(self, graph, plan, out_tree):
        self.graph, self.plan, self.out_tree = graph, plan, out_tree

    def replay(self, leaves):
        inputs = [leaf for leaf in leaves if isinstance(leaf, DTensor)]
        made = self.graph._replay(inputs)
        out = [made[v] if kind == "made" else inputs[v] if kind == "input" else v for kind, v in self.plan]
        return _unflatten(self.out_tree, iter(out))


# ---- argument trees: tuples, lists and dicts of leaves -------------------------------------

def _flatten(value):
    leaves = []

    def walk(v):
        if isinstance(v, (tuple, list)):
            return (type(v), tuple(walk(x) for x in v))
        if isinstance(v, dict):
            return (dict, tuple((k, walk(v[k])) for k in v))
        if dataclasses.is_dataclass(v) and not isinstance(v, type):   # e.g. a model's output
            return (type(v), tuple((f.name, walk(getattr(v, f.name))) for f in dataclasses.fields(v)), "fields")
        leaves.append(v)
        return None

    return leaves, walk(value)


def _unflatten(tree, leaves):
    if tree is None:
        return next(leaves)
    kind, items = tree[0], tree[1]
    if kind is dict:
        return {k: _unflatten(sub, leaves) for k, sub in items}
    if len(tree) == 3:
        return kind(**{k: _unflatten(sub, leaves) for k, sub in items})
    values = [_unflatten(sub, leaves) for sub in items]
    return kind(values) if kind in (tuple, list) else kind(*values)


def _key_of(leaf):
    """What decides a capture: a DTensor's kind (its values are the replay's inputs); any other
    argument's value."""
    if isinstance(leaf, DTensor):
        return ("dtensor", leaf.device_mesh, leaf._dtype_code, leaf.shape, leaf._placements_raw)
    try:
        hash(leaf)
    except TypeError:
        raise TypeError(f"capture: an argument of type {type(leaf).__name__} is neither a DTensor nor hashable: "
                        f"its value would be frozen into the capture unseen; pass it as a DTensor, or inside "
                        f"the function") from None
    return ("value", type(leaf), leaf)
