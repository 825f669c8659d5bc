"""A record flattened into rows, one per tensor or value, named as the reference tool names them.

`{record}.input.{i}` (positional args; for backward, gradients w.r.t. outputs), `.input.{kwarg}`,
`.parameters.{name}`, `.output.{i}`, `{params_grad record}.{name}`, and `.{j}` per nesting level. Each row
knows whether it is an input (what the call was given) or an output (what it produced): the judge needs that.
"""
from __future__ import annotations

import math
import re

from .dtypes import KNOWN as _KNOWN_DTYPES, known_dtype

INPUT, OUTPUT = "input", "output"


class RowError(ValueError):
    """A tensor or value object that cannot be a row; the reader adds which file and record it is in."""


# the most values a tensor can hold (int64 sizes); a shape whose product is larger is not a tensor's
MAX_NUMEL = 2 ** 63 - 1
# how deep a record's values may nest (a list of lists of ...): real arguments nest a few levels; a hostile
# dump nested thousands deep would otherwise exhaust Python's recursion while its rows are made
MAX_NESTING = 100
# the types a statistic (Max, Min, Mean, Norm) may have: a number, a bool (bool tensors), null (not taken)
_STAT_TYPES = frozenset((float, int, bool, type(None)))
_STATS = ("Max", "Min", "Mean", "Norm")


def _is_shape(shape) -> bool:
    """A list of sizes (integers >= 0) whose product is a possible number of values. sum() checks the types
    in C, cheaply enough for every tensor of a large dump: it fails on text, lists and objects, and gives a
    float when a dimension is one. The sizes are checked once per distinct shape (a dump has a few hundred)."""
    if shape.__class__ is not list:
        return False
    try:
        if sum(shape).__class__ is not int:
            return False
    except TypeError:
        return False
    key = tuple(shape)
    if key in _SHAPES:
        return True
    if (shape and min(shape) < 0) or math.prod(shape) > MAX_NUMEL:
        return False
    if len(_SHAPES) < 65536:
        _SHAPES.add(key)
    return True


_SHAPES: set = set()  # shapes already found good


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
        shape = self.shape = obj.get("shape")  # None: a tensor whose shape could not be read when it was dumped
        if self.is_tensor:
            # the format's rule for a tensor object (_check_tensor), its usual case tested inline: this runs
            # for every tensor of a dump, so it avoids a further call per row
            ok = _STAT_TYPES
            file_name = obj.get("data_name")
            if not (obj.get("Max").__class__ in ok and obj.get("Min").__class__ in ok and obj.get("Mean").__class__
                    in ok and obj.get("Norm").__class__ in ok and self.dtype in _KNOWN_DTYPES and
                    (file_name is None or plain_file_name(file_name)) and (shape is None or _is_shape(shape))):
                _check_tensor(name, obj, self.dtype, shape)  # says what is wrong, or accepts the rarer case

    def __repr__(self) -> str:
        return f"Row({self.name!r}, {self.role!r}, {self.obj!r})"


def _check_tensor(name: str, obj: dict, dtype: str, shape) -> None:
    """The rule a tensor object must keep to be compared: statistics that are numbers (or null), a dtype that
    a framework or numpy has, a shape of sizes whose product fits int64. Off-format content is an error, not
    a verdict: `"Max": "abc"` read as no statistic, and the call as passing."""
    if not _STAT_TYPES.issuperset(map(type, map(obj.get, _STATS))):
        key = next(k for k in _STATS if type(obj.get(k)) not in _STAT_TYPES)
        raise RowError(f"row {name}: the tensor's \"{key}\" is {obj[key]!r}, expected a number or null")
    if not known_dtype(dtype, obj.get("type")):
        raise RowError(f"row {name}: the tensor's \"dtype\" is {obj.get('dtype')!r}, expected a dtype of PyTorch "
                       f"(torch.float32), MindSpore (Float32) or numpy (float32), or null")
    file_name = obj.get("data_name")
    if file_name is not None and not plain_file_name(file_name):
        raise RowError(f"row {name}: the tensor's \"data_name\" is {_short(file_name)}, expected a plain file name "
                       f"inside the tensor folder (no path separators, no '..')")
    if shape is not None and not _is_shape(shape):
        raise RowError(f"row {name}: the tensor's \"shape\" is {_short(shape)}, expected a list of sizes (integers "
                       f">= 0) of at most 2**63 - 1 values in all (or null: a tensor that could not be read when "
                       f"it was dumped)")


def plain_file_name(name) -> bool:
    """A tensor file's name that stays inside the dump's tensor folder: text, no separators, not `..`. The one
    check of a `data_name`: every row is made through Row, so tensors.tensor_path is only given names that
    keep it."""
    return isinstance(name, str) and bool(name) and name not in (".", "..") and \
        not any(c in name for c in ("/", "\\", "\0"))


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_leaf(value: dict) -> bool:
    """A tensor or value object: it names its type. Whatever else it holds (a value, statistics, a process
    group's ranks) is the value's; a dict whose "type" is not a string is a container (a kwarg named type)."""
    return value.get("type").__class__ is str


def _leaves(value, name: str, role: str, out: list, depth: int = 0) -> None:
    """Append a Row per tensor or value found in `value`, named by its path. A list of leaves (the usual
    args and outputs) is handled without recursing into each. Anything but objects, lists and null where a
    value belongs (`"output": "x"`) is off-format, and so is nesting beyond MAX_NESTING."""
    if depth > MAX_NESTING:
        raise RowError(f"row {name}: values nested more than {MAX_NESTING} levels deep")
    if isinstance(value, dict):
        if _is_leaf(value):
            out.append(Row(name, role, value))
            return
        if value.get("dtype").__class__ is str and "shape" in value:  # a kwarg named dtype holds an object
            raise RowError(f"row {name}: a tensor object without \"type\" (expected e.g. \"torch.Tensor\")")
        for key, v in value.items():
            _leaves(v, f"{name}.{key}", role, out, depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if v.__class__ is dict and v.get("type").__class__ is str:   # _is_leaf, inlined
                out.append(Row(f"{name}.{i}", role, v))
            else:
                _leaves(v, f"{name}.{i}", role, out, depth + 1)
    elif value is not None:
        raise RowError(f"row {name}: {_short(value)} where a value belongs, expected an object such as "
                       f"{{\"type\": \"int\", \"value\": 3}}, a list of them, or null")


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
