"""A record flattened into rows, one per tensor or value, named as the reference tool names them.

`{record}.input.{i}` (positional args; for backward, gradients w.r.t. outputs), `.input.{kwarg}`,
`.parameters.{name}`, `.output.{i}`, `{params_grad record}.{name}`, and `.{j}` per nesting level. Each row
knows whether it is an input (what the call was given) or an output (what it produced): the judge needs that.
"""
from __future__ import annotations

INPUT, OUTPUT = "input", "output"


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
        self.shape = obj.get("shape")

    def __repr__(self) -> str:
        return f"Row({self.name!r}, {self.role!r}, {self.obj!r})"


def _is_leaf(value: dict) -> bool:
    return "type" in value and ("dtype" in value or "value" in value or "Max" in value)


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
            if v.__class__ is dict and _is_leaf(v):
                out.append(Row(f"{name}.{i}", role, v))
            else:
                _leaves(v, f"{name}.{i}", role, out)


# key in a record -> (row infix, role); order = the row order the spec asks for
_PARTS = (("input_args", "input", INPUT), ("input_kwargs", "input", INPUT), ("input", "input", INPUT),
          ("parameters", "parameters", INPUT), ("output", "output", OUTPUT))


def record_rows(name: str, record) -> list:
    rows: list = []
    if isinstance(record, dict) and any(k in record for k, _, _ in _PARTS):
        for key, infix, role in _PARTS:
            if key in record:
                _leaves(record[key], f"{name}.{infix}", role, rows)
    elif ".parameters_grad." in name and isinstance(record, dict):
        for pname, value in record.items():
            values = value if isinstance(value, list) else [value]
            if len(values) == 1:
                _leaves(values[0], f"{name}.{pname}", OUTPUT, rows)
            else:
                _leaves(values, f"{name}.{pname}", OUTPUT, rows)
    else:  # save() records: the value itself
        _leaves(record, name, OUTPUT, rows)
    return rows
