"""A record flattened into rows, one per tensor or value, named as the reference tool names them.

`{record}.input.{i}` (positional args; for backward, gradients w.r.t. outputs), `.input.{kwarg}`,
`.parameters.{name}`, `.output.{i}`, `{params_grad record}.{name}`, and `.{j}` per nesting level. Each row
knows whether it is an input (what the call was given) or an output (what it produced): the judge needs that.
"""
from __future__ import annotations

import re

INPUT, OUTPUT = "input", "output"


class RowError(ValueError):
    """A tensor or value object that cannot be a row; the reader adds which file and record it is in."""


def _is_shape(shape) -> bool:
    """A list of integers. sum() checks that in C, cheaply enough for every tensor of a large dump: it fails
    on text, lists and objects, and gives a float when a dimension is one."""
    if shape.__class__ is not list:
        return False
    try:
        return sum(shape).__class__ is int
    except TypeError:
        return False


class Row:
    """One tensor or value of a record. Its dtype, shape and kind are read once here: pairing, precision and
    judging all ask for them, hundreds of thousands of times on a large dump."""

    __slots__ = ("name", "role", "obj", "is_tensor", "dtype", "shape")

    def __init__(self, name: str, role: str, obj: dict):
        self.name = name
        self.role = role          # input / output
        self.obj = obj            # the dump's tensor object or {"type", "value"} object
        self.is_tensor = "dtype" in obj and "shape" in obj
        self.dtype = str(obj.get("dtype", obj.get("type", "")))
        self.shape = obj.get("shape")  # None: a tensor whose shape could not be read when it was dumped
        if self.is_tensor and self.shape is not None and not _is_shape(self.shape):
            raise RowError(f"row {name}: the tensor's \"shape\" is {self.shape!r}, expected a list of integers "
                           f"(or null: a tensor that could not be read when it was dumped)")

    def __repr__(self) -> str:
        return f"Row({self.name!r}, {self.role!r}, {self.obj!r})"


def _is_leaf(value: dict) -> bool:
    """A tensor or value object: it names its type. Whatever else it holds (a value, statistics, a process
    group's ranks) is the value's; a dict whose "type" is not a string is a container (a kwarg named type)."""
    return value.get("type").__class__ is str


def _leaves(value, name: str, role: str, out: list) -> None:
    """Append a Row per tensor or value found in `value`, named by its path. A list of leaves (the usual
    args and outputs) is handled without recursing into each."""
    if isinstance(value, dict):
        if _is_leaf(value):
            out.append(Row(name, role, value))
            return
        for key, v in value.items():
            _leaves(v, f"{name}.{key}", role, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if v.__class__ is dict and v.get("type").__class__ is str:   # _is_leaf, inlined
                out.append(Row(f"{name}.{i}", role, v))
            else:
                _leaves(v, f"{name}.{i}", role, out)


# key in a record -> (row infix, role); order = the row order the spec asks for. `grad_output` / `grad_input`:
# backward records of the reference tool's 1.0 versions (what flows into the backward, and what it produces)
_PARTS = (("input_args", "input", INPUT), ("input_kwargs", "input", INPUT), ("input", "input", INPUT),
          ("grad_output", "input", INPUT), ("parameters", "parameters", INPUT), ("output", "output", OUTPUT),
          ("grad_input", "output", OUTPUT))
_PART_KEYS = frozenset(key for key, _, _ in _PARTS)
PART_ROLES = {key: role for key, _, role in _PARTS if key != "parameters"}  # a call's parts, as data_mode keeps them
_PARAMS_GRAD = re.compile(r"^(.+)\.parameters_grad(\.\d+)?$")


def params_grad_owner(name: str):
    """The module record a parameter-gradient record belongs to (`Module.fc.Linear` for
    `Module.fc.Linear.parameters_grad.0`, and for the reference's older `...parameters_grad` without an
    index), or None for any other record."""
    m = _PARAMS_GRAD.match(name)
    return m.group(1) if m else None


def record_rows(name: str, record) -> list:
    rows: list = []
    if isinstance(record, dict) and not _PART_KEYS.isdisjoint(record):
        for key, infix, role in _PARTS:
            if key in record:
                _leaves(record[key], f"{name}.{infix}", role, rows)
    elif isinstance(record, dict) and params_grad_owner(name):
        for pname, value in record.items():
            values = value if isinstance(value, list) else [value]
            if len(values) == 1:
                _leaves(values[0], f"{name}.{pname}", OUTPUT, rows)
            else:
                _leaves(values, f"{name}.{pname}", OUTPUT, rows)
    else:  # save() records: the value itself
        _leaves(record, name, OUTPUT, rows)
    return rows
