"""Plain data that flows from a hook to the writer: tensor summaries and call records.

A record is kept compact (slots, statistics as a tuple or a pending device value) until it is written; only
the writer turns it into JSON, through `json_text` (the same text as `json.dumps(to_json())`, made faster).
"""
from __future__ import annotations

import json

STAT_KEYS = ("Max", "Min", "Mean", "Norm")
NO_STATS = (None, None, None, None)


class TensorSummary:
    """What the dump says about one tensor at one moment.

    `stats` is a (Max, Min, Mean, Norm) tuple, or None while a `PendingStats` when the numbers still live on a
    device: it is resolved in one batch before writing, so no hook ever waits for the device.
    """

    __slots__ = ("type", "dtype", "shape", "stats", "requires_grad", "md5")

    def __init__(self, type_name, dtype, shape, stats=NO_STATS, requires_grad=None, md5=None):
        self.type = type_name
        self.dtype = dtype
        self.shape = shape
        self.stats = stats
        self.requires_grad = requires_grad
        self.md5 = md5

    def to_json(self, data_name: str | None = None) -> dict:
        shape = list(self.shape) if isinstance(self.shape, tuple) else self.shape
        out = {"type": self.type, "dtype": self.dtype, "shape": shape}
        if self.stats is not None:
            out.update(zip(STAT_KEYS, self.stats))
        if self.requires_grad is not None:
            out["requires_grad"] = self.requires_grad
        if data_name is not None:
            out["data_name"] = data_name
        if self.md5 is not None:
            out["md5"] = self.md5
        return out

    def json_text(self, data_name: str | None = None) -> str:
        """`json.dumps(self.to_json(data_name))`, byte for byte, built directly: formatting summaries is most
        of the cost of writing a step. The head (type, dtype, shape) recurs across calls and steps and is
        formatted once per process; four finite floats, the usual statistics, take one `%` operation."""
        shape = self.shape
        if type(shape) is tuple and SHAPES.get(shape) is shape:  # a canonical shape (ints only): the memo's
            key = (self.type, self.dtype, shape)                 # equality is exact for it
            text = _HEADS.get(key)
            if text is None:
                text = _HEAD % (json_str(self.type), json_str(self.dtype), json_shape(list(shape)))
                if len(_HEADS) < _HEADS_MAX:
                    _HEADS[key] = text
        else:
            text = _HEAD % (json_str(self.type), json_str(self.dtype),
                            json_shape(list(shape) if isinstance(shape, tuple) else shape))
        stats = self.stats
        if stats is not None:
            a, b, c, d = stats
            if type(a) is float and type(b) is float and type(c) is float and type(d) is float \
                    and (a - a) + (b - b) + (c - c) + (d - d) == 0.0:  # all finite: float.__repr__, as json
                text += _FINITE_STATS % (a, b, c, d)
            else:
                text += "".join([f', "{key}": {json_scalar(v)}' for key, v in zip(STAT_KEYS, stats)])
        if self.requires_grad is not None:
            text += _REQUIRES_GRAD[self.requires_grad] if type(self.requires_grad) is bool else \
                f', "requires_grad": {json_scalar(self.requires_grad)}'
        if data_name is not None:
            text += f', "data_name": {json.dumps(data_name)}'
        if self.md5 is not None:
            text += f', "md5": {json.dumps(self.md5)}'
        return text + "}"

    def finite(self) -> bool:
        """False when the tensor held NaN or an infinity (Max/Min carry them; Norm may overflow alone)."""
        return all(v is None or isinstance(v, bool) or v - v == 0 for v in self.stats[:2]) \
            if self.stats is not None else True


class SavedTensor:
    """A summary at one place in one record whose values were also saved to `data_name`.

    The summary itself is shared (one tensor value, summarised once); the file name belongs to the place."""

    __slots__ = ("summary", "data_name")

    def __init__(self, summary: TensorSummary, data_name: str):
        self.summary = summary
        self.data_name = data_name

    def to_json(self) -> dict:
        return self.summary.to_json(self.data_name)

    def json_text(self) -> str:
        return self.summary.json_text(self.data_name)

    def finite(self) -> bool:
        return self.summary.finite()


class UnwrittenTensor(SavedTensor):
    """A saved tensor whose file is not on disk when the step is written (a full disk, its folder deleted
    mid-step): the record keeps the file's name and says why in `data_error` (docs/format.md), so compare
    errs on that record alone instead of giving up on the dump. Formatted through `to_json` by both routes
    (it is not a SavedTensor to the C route's exact type check)."""

    __slots__ = ("error",)

    def __init__(self, saved: SavedTensor, error: str):
        super().__init__(saved.summary, saved.data_name)
        self.error = error

    def to_json(self) -> dict:
        return {**self.summary.to_json(self.data_name), "data_error": self.error}

    def json_text(self) -> str:
        return json.dumps(self.to_json())


def mark_unwritten(value, missing: dict, marked: list):
    """`value` (an encoded record part) with each SavedTensor whose file name is in `missing` (name -> why)
    replaced by an UnwrittenTensor, appended to `marked`; lists and dicts are updated in place. One marked
    before keeps its first reason."""
    if isinstance(value, SavedTensor):
        why = missing.get(value.data_name)
        if why is None or isinstance(value, UnwrittenTensor):
            return value
        marked.append(UnwrittenTensor(value, why))
        return marked[-1]
    if isinstance(value, list):
        value[:] = [mark_unwritten(v, missing, marked) for v in value]
    elif isinstance(value, dict):
        for key, v in value.items():
            value[key] = mark_unwritten(v, missing, marked)
    return value


class PendingStats:
    """Statistics that are still a small device tensor (`device_value`, of some `kind` the adapter knows);
    `core.summary.resolve_pending` fills `summary.stats` when the step is written."""

    __slots__ = ("device_value", "kind", "summary")

    def __init__(self, device_value, kind: str, summary: TensorSummary):
        self.device_value = device_value
        self.kind = kind
        self.summary = summary


class Record:
    """One dumped call (forward, backward), one parameter-gradient set, or one `save()` entry.

    `data` maps the spec's keys (`input_args`, `input_kwargs`, `output`, `parameters`, `input`, ...) to
    encoded values whose tensor leaves are `TensorSummary` objects.
    """

    __slots__ = ("name", "data")

    def __init__(self, name: str, data: dict | None = None):
        self.name = name
        self.data = data if data is not None else {}


_HEAD = '{"type": %s, "dtype": %s, "shape": %s'
_HEADS: dict = {}  # (type, dtype, shape) -> formatted head; a model has a few hundred distinct ones
_HEADS_MAX = 65536
_FINITE_STATS = ', "Max": %r, "Min": %r, "Mean": %r, "Norm": %r'
_REQUIRES_GRAD = {True: ', "requires_grad": true', False: ', "requires_grad": false'}
_STR_TEXT: dict = {}  # str -> its JSON text: dtype and type names, keys; a few dozen distinct strings a run


SHAPES: dict = {}  # shape -> the same shape as a plain tuple, one object per distinct shape


def canonical_shape(shape) -> tuple:
    """`tuple(shape)` for a framework's shape (torch.Size), shared by every summary of that shape. A plain
    tuple of ints is not tracked by the garbage collector, a torch.Size is: summaries live for a whole step,
    and every tracked object that outlives a young collection brings the next full (slow) one closer."""
    canonical = SHAPES.get(shape)
    if canonical is None:
        canonical = tuple(shape)
        if len(SHAPES) < _HEADS_MAX:
            SHAPES[canonical] = canonical
    return canonical


def json_str(v) -> str:
    """`json.dumps(v)` for a string (memoised: the same few names recur in every record) or anything else."""
    if type(v) is not str:
        return json.dumps(v)
    text = _STR_TEXT.get(v)
    if text is None:
        text = json.dumps(v)
        if len(_STR_TEXT) < 4096:
            _STR_TEXT[v] = text
    return text


def json_scalar(v) -> str:
    """`json.dumps(v)` for a statistic (float, int, bool or None), without the encoder's per-call setup."""
    kind = type(v)
    if kind is float:
        if v - v == 0.0:  # finite
            return float.__repr__(v)
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    if v is None:
        return "null"
    if kind is bool:
        return "true" if v else "false"
    if kind is int:
        return int.__repr__(v)
    return json.dumps(v)


def json_shape(shape) -> str:
    """`json.dumps(shape)` for a list of ints (a tensor's shape); anything else goes through json."""
    if type(shape) is list and all(type(d) is int for d in shape):
        return str(shape)  # what json writes for a list of ints
    return json.dumps(shape)


def json_default(obj):
    """`json.dumps(default=...)` hook: summaries know their own JSON form."""
    if isinstance(obj, (TensorSummary, SavedTensor)):
        return obj.to_json()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def all_finite(value) -> bool:
    """Whether every tensor and every float inside an encoded value is finite (a `-inf` fill value is not)."""
    if isinstance(value, (TensorSummary, SavedTensor)):
        return value.finite()
    if isinstance(value, list):
        return all(all_finite(v) for v in value)
    if isinstance(value, dict):
        number = value.get("value") if "type" in value else None
        if number.__class__ is float:
            return number - number == 0.0
        return all(all_finite(v) for v in value.values())
    return True


def summaries_in(value):
    """Every TensorSummary/SavedTensor inside an encoded value."""
    if isinstance(value, (TensorSummary, SavedTensor)):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from summaries_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from summaries_in(v)
