"""Encoding of call arguments and results into the dump's JSON shapes (the spec's "Other values" table).

The walk is framework-neutral; an adapter passes a `tensor` callback (tensor -> TensorSummary) and may
register encoders for its own types (torch.Size, dtypes, devices, process groups). Every leaf is given the
path where it sits (`("input_args", 0, 1)`) because the tensor task names its files after that path.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

MAX_DEPTH = 32

Encoder = Callable[[Any], Any]


def _is_namedtuple(value) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _numpy_encode(value):
    np = _numpy()
    if np is None:
        return None
    if isinstance(value, np.ndarray):
        return numpy_array_summary(value)
    if isinstance(value, np.generic):
        item = value.item()
        if isinstance(item, complex):   # JSON has no complex, datetime or timedelta: their text stands in
            item = str(item)
        elif not isinstance(item, (bool, int, float, str)):
            item = None if isinstance(item, bytes) else str(item)
        return {"type": type(value).__name__, "value": item}
    return None


def _numpy():
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency
        return None
    return numpy


def numpy_array_summary(array) -> dict:
    """Statistics of a numpy array, in the same shape as a tensor's (minus requires_grad)."""
    from .statistics import numpy_stats

    out = {"type": "numpy.ndarray", "dtype": str(array.dtype), "shape": list(array.shape)}
    out.update(zip(("Max", "Min", "Mean", "Norm"), numpy_stats(array)))
    return out


class ValueEncoder:
    """Walks nested Python values; tensors go to the adapter's callback, everything else is encoded here."""

    def __init__(self, is_tensor: Callable[[Any], bool], extra: dict | None = None, tensor_type: type = None):
        self.is_tensor = is_tensor
        self.tensor_type = tensor_type  # exact type checked first, before the general is_tensor test
        self.extra = dict(extra or {})  # exact type -> encoder, for framework objects

    def encode(self, value, tensor: Callable, path: tuple = (), depth: int = 0):
        """`value` encoded, its tensors through `tensor(t, path)`; `depth` is where `value` sits when another
        walk (a C route) hands it over, so nesting limits count from the top."""
        return self._walk(value, tensor, path, depth)

    def _walk(self, value, tensor, path, depth):
        kind = type(value)
        if kind is self.tensor_type:  # the common cases first: this runs for every argument of every call
            return tensor(value, path)
        if value is None:
            return None
        if kind in (bool, int, float, str):
            return {"type": kind.__name__, "value": value}
        if kind is tuple or kind is list:
            if depth >= MAX_DEPTH:
                return None
            tensor_type, walk = self.tensor_type, self._walk  # a tensor item is leafed here: one call less
            return [tensor(v, path + (i,)) if type(v) is tensor_type else walk(v, tensor, path + (i,), depth + 1)
                    for i, v in enumerate(value)]
        if kind is dict and depth < MAX_DEPTH:  # input_kwargs, most often empty
            return {str(k): self._walk(v, tensor, path + (str(k),), depth + 1) for k, v in value.items()}
        if self.is_tensor(value):
            return tensor(value, path)
        if depth >= MAX_DEPTH:
            return None
        if kind in self.extra:
            return self.extra[kind](value)
        if _is_namedtuple(value):
            return {f: self._walk(getattr(value, f), tensor, path + (f,), depth + 1) for f in value._fields}
        if isinstance(value, (list, tuple)):
            return [self._walk(v, tensor, path + (i,), depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {str(k): self._walk(v, tensor, path + (str(k),), depth + 1) for k, v in value.items()}
        if isinstance(value, slice):
            return {"type": "slice", "value": [self._scalar(value.start), self._scalar(value.stop),
                                               self._scalar(value.step)]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        if isinstance(value, (bool, int, float, str)):  # subclasses, e.g. IntEnum
            return {"type": kind.__name__, "value": value if isinstance(value, str) else value.real}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: self._walk(getattr(value, f.name), tensor, path + (f.name,), depth + 1)
                    for f in dataclasses.fields(value)}
        for base, encoder in self.extra.items():
            if isinstance(value, base):
                return encoder(value)
        return _numpy_encode(value)

    @staticmethod
    def _scalar(v):
        return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def tensors_in(value, is_tensor, depth: int = 0) -> list:
    """`list(tensor_leaves(value, is_tensor, depth))`. A lone tensor, and a flat tuple, list or dict of tensors
    and scalars (most calls' arguments and results) are listed here without the recursive generators."""
    if is_tensor(value):
        return [value]
    kind = type(value)
    if (kind is tuple or kind is list or kind is dict) and depth < MAX_DEPTH:
        found = []
        for v in (value.values() if kind is dict else value):
            if is_tensor(v):
                found.append(v)
            elif isinstance(v, (list, tuple, dict)):
                break  # nested: the general walk below
        else:
            return found
    return list(tensor_leaves(value, is_tensor, depth))


def tensor_leaves(value, is_tensor, depth: int = 0):
    """The tensors inside a nested value, in the order the encoder visits them."""
    if is_tensor(value):
        yield value
    elif depth < MAX_DEPTH:
        if isinstance(value, (list, tuple)):
            for v in value:
                yield from tensor_leaves(v, is_tensor, depth + 1)
        elif isinstance(value, dict):
            for v in value.values():
                yield from tensor_leaves(v, is_tensor, depth + 1)
