"""The kinds of a model config's values, checked before any layer is built from them: a config.json
that gives a field a value of the wrong kind is a TypeError, and one out of range a ValueError,
naming the model and the field (not an AttributeError or a ZeroDivisionError from deep inside a
layer). A model class lists its fields' kinds; ``check(owner, values, kinds)`` checks the fields
``values`` holds, and leaves the relations between fields (heads dividing the hidden size, ...) to
the model."""
import math

_INT64 = 1 << 63   # sizes and counts become int64 dims and loop bounds: none past it


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def count(low=1):
    """An int in [low, 2**63)."""
    def check(owner, name, value):
        if not _int(value):
            raise TypeError(f"{owner}: config {name} must be an int, got {value!r}")
        if not low <= value < _INT64:
            raise ValueError(f"{owner}: config {name} must be an int in [{low}, 2**63), got {value}")
    return check


def number(low=None, above=None):
    """A finite number: at least ``low``, or greater than ``above``, where given."""
    def check(owner, name, value):
        if not _number(value):
            raise TypeError(f"{owner}: config {name} must be a number, got {value!r}")
        if not math.isfinite(value) or (low is not None and value < low) or (above is not None and value <= above):
            bound = f" >= {low}" if low is not None else f" > {above}" if above is not None else ""
            raise ValueError(f"{owner}: config {name} must be a finite number{bound}, got {value!r}")
    return check


def flag(owner, name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: config {name} must be true or false, got {value!r}")


def text(owner, name, value):
    if not isinstance(value, str):
        raise TypeError(f"{owner}: config {name} must be a string, got {value!r}")


def mapping(owner, name, value):
    if not isinstance(value, dict):
        raise TypeError(f"{owner}: config {name} must be an object, got {value!r}")


def optional(kind):
    """None, or a value of ``kind``."""
    def check(owner, name, value):
        if value is not None:
            kind(owner, name, value)
    return check


def listing(kind, nonempty=False):
    """A list (a tuple from Python) of values of ``kind``."""
    def check(owner, name, value):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{owner}: config {name} must be a list, got {value!r}")
        if nonempty and not value:
            raise ValueError(f"{owner}: config {name} must not be empty")
        for i, item in enumerate(value):
            kind(owner, f"{name}[{i}]", item)
    return check


def either(*kinds):
    """A value of the first of ``kinds`` that takes it; the last one's error otherwise."""
    def check(owner, name, value):
        for kind in kinds[:-1]:
            try:
                kind(owner, name, value)
                return
            except (TypeError, ValueError):
                pass
        kinds[-1](owner, name, value)
    return check


def check(owner, values, kinds):
    """Checks every field of ``values`` (a dict) that ``kinds`` names."""
    for name, kind in kinds.items():
        if name in values:
            kind(owner, name, values[name])
