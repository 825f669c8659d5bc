"""Plain data that flows from a hook to the writer: tensor summaries and call records.

A record is kept compact (slots, statistics as a tuple or a pending device value) until it is written; only
the writer turns it into JSON, through `to_json`.
"""
from __future__ import annotations

STAT_KEYS = ("Max", "Min", "Mean", "Norm")
NO_STATS = (None, None, None, None)


class TensorSummary:
    """What the dump says about one tensor at one moment.

    `stats` is a (Max, Min, Mean, Norm) tuple, or a `Pending` placeholder when the numbers still live on a
    device: it is resolved in one batch before writing, so no hook ever waits for the device.
    """

    __slots__ = ("type", "dtype", "shape", "stats", "requires_grad", "md5", "data_name")

    def __init__(self, type_name, dtype, shape, stats=NO_STATS, requires_grad=None, md5=None, data_name=None):
        self.type = type_name
        self.dtype = dtype
        self.shape = shape
        self.stats = stats
        self.requires_grad = requires_grad
        self.md5 = md5
        self.data_name = data_name

    def to_json(self) -> dict:
        out = {"type": self.type, "dtype": self.dtype, "shape": self.shape}
        if self.stats is not None:
            out.update(zip(STAT_KEYS, self.stats))
        if self.requires_grad is not None:
            out["requires_grad"] = self.requires_grad
        if self.data_name is not None:
            out["data_name"] = self.data_name
        if self.md5 is not None:
            out["md5"] = self.md5
        return out


class Pending:
    """Statistics that are still a device value; the adapter fills `values` when the step is written."""

    __slots__ = ("device_value", "values")

    def __init__(self, device_value):
        self.device_value = device_value
        self.values = None


class Record:
    """One dumped call (forward, backward), one parameter-gradient set, or one `save()` entry.

    `data` maps the spec's keys (`input_args`, `input_kwargs`, `output`, `parameters`, `input`, ...) to
    encoded values whose tensor leaves are `TensorSummary` objects.
    """

    __slots__ = ("name", "data")

    def __init__(self, name: str, data: dict | None = None):
        self.name = name
        self.data = data if data is not None else {}

    def is_empty(self) -> bool:
        return not self.data


def json_default(obj):
    """`json.dumps(default=...)` hook: summaries know their own JSON form."""
    if isinstance(obj, TensorSummary):
        return obj.to_json()
    raise TypeError(f"cannot encode {type(obj).__name__}")
