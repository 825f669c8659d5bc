"""A record flattened into rows, one per tensor or value, named as the reference tool names them.

`{record}.input.{i}` (positional args; for backward, gradients w.r.t. outputs), `.input.{kwarg}`,
`.parameters.{name}`, `.output.{i}`, `{params_grad record}.{name}`, and `.{j}` per nesting level. Each row
knows whether it is an input (what the call was given) or an output (what it produced): the judge needs that.
"""
from __future__ import annotations

from dataclasses import dataclass

INPUT, OUTPUT = "input", "output"


@dataclass
class Row:
    name: str
    role: str          # input / output
    obj: dict          # the dump's tensor object or {"type", "value"} object

    @property
    def is_tensor(self) -> bool:
        return "dtype" in self.obj and "shape" in self.obj

    @property
    def dtype(self) -> str:
        return str(self.obj.get("dtype", self.obj.get("type", "")))

    @property
    def shape(self):
        return self.obj.get("shape")


def _leaves(value, name: str, role: str, out: list) -> None:
    if isinstance(value, dict):
        if "type" in value and ("dtype" in value or "value" in value or "Max" in value):
            out.append(Row(name, role, value))
            return
        for key, v in value.items():
            _leaves(v, f"{name}.{key}", role, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
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
