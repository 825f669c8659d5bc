"""A dump's recorded values back into call arguments, for a replay. Framework-neutral: a replayer gives how a
tensor file becomes its tensor, and how its framework spells dtypes, devices and its own types."""
from __future__ import annotations

from ..compare.rows import plain_file_name
from ..compare.tensors import UNWRITTEN, TensorFileError, load_tensor, tensor_path
from .judge import NotReplayable

TENSOR_TYPES = ("torch.Tensor", "torch.nn.parameter.Parameter", "numpy.ndarray", "mindspore.Tensor",
                "mindspore.Parameter", "mindspore.common.parameter.Parameter")


def is_tensor_object(value) -> bool:
    return isinstance(value, dict) and "dtype" in value and "shape" in value and value.get("type") in TENSOR_TYPES


def saved(dump, obj: dict, label: str):
    """The file of tensor object `obj` as compare's load_tensor gives it (a numpy array, or a torch tensor for
    16-bit floats); NotReplayable when there is none."""
    if UNWRITTEN in obj:
        raise NotReplayable(f"{label}: its file was not written when dumped ({obj[UNWRITTEN]})")
    name = obj.get("data_name")
    if not plain_file_name(name):
        raise NotReplayable(f"{label}: no tensor file (a dump of task tensor saves each one)")
    try:
        return load_tensor(tensor_path(dump, name), dump.path)
    except TensorFileError as exc:
        raise NotReplayable(str(exc)) from None


def tensor_objects(value, label: str) -> list:
    """[(label, tensor object)] of the tensor objects in a recorded value, in the order the encoder visits them."""
    out = []
    if isinstance(value, list):
        for i, v in enumerate(value):
            out += tensor_objects(v, f"{label}.{i}")
    elif isinstance(value, dict):
        if is_tensor_object(value):
            out.append((label, value))
        elif "type" not in value:
            for k, v in value.items():
                out += tensor_objects(v, f"{label}.{k}")
    return out


def map_tensors(value, is_tensor, fn):
    """`value` with fn(tensor) in place of each tensor, through lists, tuples and dicts (a replay's arguments)."""
    if is_tensor(value):
        return fn(value)
    if isinstance(value, list):
        return [map_tensors(v, is_tensor, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(map_tensors(v, is_tensor, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, is_tensor, fn) for k, v in value.items()}
    return value


class Decoder:
    """Recorded values (docs/format.md "Other values") back into arguments.

    `tensor(obj, label)`: the framework's tensor for a tensor object, widened for the replay; `dtype(text)`: the
    framework's dtype named `text` (widened when a float), None when unknown; `device`: what a device becomes;
    `types`: {type name: recorded object -> argument} for the framework's own types (torch.Size)."""

    def __init__(self, tensor, dtype, device=None, types=None):
        self.tensor, self.dtype, self.device, self.types = tensor, dtype, device, dict(types or {})

    def value(self, v, label: str):
        if v is None:
            return None
        if isinstance(v, list):
            return [self.value(x, f"{label}.{i}") for i, x in enumerate(v)]
        if not isinstance(v, dict):
            raise NotReplayable(f"{label}: {v!r} is not a recorded value")
        kind = v.get("type")
        if is_tensor_object(v) or (isinstance(kind, str) and "data_name" in v):
            return self.tensor(v, label)
        if kind in ("int", "float", "bool", "str"):
            return v.get("value")
        if kind == "slice" and isinstance(v.get("value"), list) and len(v["value"]) == 3:
            return slice(*v["value"])
        if kind == "ellipsis":
            return Ellipsis
        if kind in self.types:
            return self.types[kind](v)
        if isinstance(kind, str) and kind.endswith(".dtype"):
            dtype = self.dtype(str(v.get("value")))
            if dtype is None:
                raise NotReplayable(f"{label}: unknown dtype {v.get('value')!r}")
            return dtype
        if isinstance(kind, str) and kind.endswith(".device"):
            return self.device
        if kind is None:  # a dict, namedtuple or dataclass, written as its fields
            return {k: self.value(x, f"{label}.{k}") for k, x in v.items()}
        if isinstance(v.get("value"), (bool, int, float)):  # a numpy scalar
            return v["value"]
        raise NotReplayable(f"{label}: a {kind}, which the dump does not keep enough of to rebuild")
