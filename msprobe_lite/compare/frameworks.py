"""Cross-framework names: a MindSpore dump read in PyTorch's vocabulary.

The correspondence is data (`mindspore_pytorch.yaml`, which users can extend): cells and their classes,
parameter names (BatchNorm's `gamma`/`beta`/`moving_*`, ...), API records, argument names. Several MindSpore
names may map to one PyTorch name, so the mapping only runs one way: when one side of a compare is
MindSpore, its names are translated and both sides meet in PyTorch's vocabulary, whichever side is the
target. Record names pair through `record`; rows of a paired record meet through `row_tail`
(`.parameters.gamma` -> `.parameters.weight`). dtype names of both frameworks are the same dtypes to the judge.
"""
from __future__ import annotations

import functools
import os

MAPPING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mindspore_pytorch.yaml")
_SECTIONS = ("cells", "parameters", "apis", "arguments", "positions", "keywords")
_PREFIXES = {"Mint": "Torch", "MintFunctional": "Functional"}   # default API prefix correspondence
_NUMBERED = ("forward", "backward", "parameters_grad")
# state_dict entries that are PyTorch bookkeeping, not weights: no MindSpore counterpart, never compared
TORCH_BOOKKEEPING = ("num_batches_tracked",)


def _position(i) -> bool:
    return type(i) is int and i >= 0


# what each section maps a name to: (check, in words for the error); the others map names to names
_NAME_VALUES = (lambda v: isinstance(v, str), "names (strings)")
_SECTION_VALUES = {
    "positions": (lambda v: isinstance(v, list) and all(map(_position, v)),
                  "lists of argument positions (integers >= 0)"),
    "keywords": (lambda v: isinstance(v, dict) and all(isinstance(n, str) and _position(i) for n, i in v.items()),
                 "tables of argument name -> position (an integer >= 0)"),
}


class NameMapError(ValueError):
    """A mapping file that is not a mapping of the known sections to name -> name tables (positions: name ->
    list of argument positions)."""


@functools.lru_cache(maxsize=8)
def load_names(path: str = MAPPING) -> dict:
    """{section: {mindspore name: pytorch name}} from a mapping YAML (checked, parsed once per path)."""
    import yaml

    from ..core.small_file import SmallFileError, read_small_text

    try:
        content = yaml.safe_load(read_small_text(path)) or {}
    except (SmallFileError, yaml.YAMLError) as exc:
        raise NameMapError(f"{path}: cannot read the name mapping: {exc}") from None
    if not isinstance(content, dict) or set(content) - set(_SECTIONS):
        raise NameMapError(f"{path}: expected sections {list(_SECTIONS)}, got "
                           f"{sorted(content) if isinstance(content, dict) else type(content).__name__}")
    names = {}
    for section in _SECTIONS:
        table = content.get(section) or {}
        value_ok, expected = _SECTION_VALUES.get(section, _NAME_VALUES)
        if not isinstance(table, dict) or not all(isinstance(k, str) and value_ok(v) for k, v in table.items()):
            raise NameMapError(f"{path}: section {section!r} must map names to {expected}")
        names[section] = dict(table)
    return names


class Translation:
    """Renames MindSpore record names and row tails to PyTorch's."""

    def __init__(self, path: str = MAPPING):
        names = load_names(path)
        self.cells, self.params = names["cells"], names["parameters"]
        self.apis, self.arguments = names["apis"], names["arguments"]
        self.positions, self.keywords = names["positions"], names["keywords"]

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one instance per compare, bounded by its names
    def record(self, name: str) -> str:
        """`Cell.fc.Dense.forward.0` -> `Module.fc.Linear.forward.0`; `Mint.matmul.0.forward` ->
        `Torch.matmul.0.forward`; `Primitive.Dense.3.backward` -> `Functional.linear.3.backward`."""
        parts = name.split(".")
        if parts[0] == "Cell" and len(parts) >= 4:
            for i in (-2, -3):  # the class sits before "{direction}.{n}" / "parameters_grad.{n}"
                if parts[i] in _NUMBERED:
                    parts[i - 1] = self.cells.get(parts[i - 1], parts[i - 1])
                    break
            return ".".join(["Module"] + parts[1:])
        if len(parts) >= 4 and parts[-1] in ("forward", "backward"):
            api = ".".join(parts[:-2])
            mapped = self.apis.get(api)
            if mapped is None:
                prefix, _, rest = api.partition(".")
                mapped = f"{_PREFIXES.get(prefix, prefix)}.{rest}"
            return f"{mapped}.{parts[-2]}.{parts[-1]}"
        return name

    def row_tail(self, tail: str, record: str = "") -> str:
        """The part of a row name after its record: `.parameters.gamma` -> `.parameters.weight`, `.beta` (a
        parameter gradient) -> `.bias`, `.input.axis` -> `.input.dim`; and for an API whose arguments come in
        another order (`positions`: MindSpore's BatchNorm takes x, scale, bias, mean, variance where PyTorch's
        batch_norm takes input, running_mean, running_var, weight, bias), `.input.1` of its forward record and
        `.output.1` of its backward record (the gradient of that argument) -> `.input.3` / `.output.3`. The
        PyTorch positions a list leaves out are taken to hold no tensor (LayerNorm's normalized_shape)."""
        parts = tail.split(".")
        order = self._order(record) if record else None
        if order and len(parts) >= 3 and parts[2].isdecimal() and int(parts[2]) < len(order[0]) \
                and parts[1] == ("input" if order[1] == "forward" else "output"):
            parts[2] = str(order[0][int(parts[2])])
        elif len(parts) >= 3 and parts[1] == "parameters":
            parts[2] = self.params.get(parts[2], parts[2])
        elif len(parts) >= 3 and parts[1] == "input" and not parts[2].isdigit():
            parts[2] = self.arguments.get(parts[2], parts[2])
            # a PyTorch-like API of MindSpore's (mint) passing `weight=` meets PyTorch's by position too
            return self.torch_row_tail(".".join(parts), self.record(record)) if record else ".".join(parts)
        elif len(parts) >= 2 and not parts[1].isdigit() and parts[1] not in ("input", "output"):
            parts[1] = self.params.get(parts[1], parts[1])
        return ".".join(parts)

    def torch_row_tail(self, tail: str, record: str = "") -> str:
        """A row tail in PyTorch's names, met by `row_tail`: an argument of a `keywords` API passed by name is
        named by its position (`F.batch_norm(x, rm, rv, weight=w)`: `.input.weight` -> `.input.3`), as the
        positions table speaks of positions and a call may pass it either way."""
        parts = tail.split(".")
        if len(parts) >= 3 and parts[1] == "input" and record.endswith(".forward"):
            table = self.keywords.get(".".join(record.split(".")[:-2]))
            if table and parts[2] in table:
                parts[2] = str(table[parts[2]])
        return ".".join(parts)

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one instance per compare, bounded by its names
    def _order(self, record: str):
        """(positions, direction) of an API record whose arguments are reordered, else None. A backward
        record's outputs are the gradients of the tensor arguments only, in order: there, the position of
        each among the mapped positions (LayerNorm's [0, 2, 3] around PyTorch's normalized_shape: [0, 1, 2])."""
        parts = record.split(".")
        order = self.positions.get(".".join(parts[:-2])) if len(parts) >= 4 else None
        if not order or parts[-1] not in ("forward", "backward"):
            return None
        if parts[-1] == "backward":
            order = [sorted(order).index(p) for p in order]
        return order, parts[-1]


# PyTorch reaches one operation through several namespaces (`q @ k` is Tensor.matmul, `torch.matmul(q, k)`
# Torch.matmul; F.softmax, torch.softmax and x.softmax are one softmax), and a port spells it through its own
# framework's. Across frameworks API records therefore pair by the operation's name, whatever the namespace.
_TORCH_NAMESPACES = ("Torch.", "Tensor.", "Functional.")


def namespace_free(name: str) -> str:
    """`Tensor.matmul.0.forward` and `Torch.matmul.0.forward` -> `API.matmul.0.forward` (for pairing
    across frameworks only: the names reported stay the dumps' own); other names as they are."""
    for prefix in _TORCH_NAMESPACES:
        if name.startswith(prefix):
            return "API." + name[len(prefix):]
    return name


def class_free(name: str) -> str:
    """`Module.block.PtBlock.forward.0` -> `Module.block.*.forward.0` (for pairing across frameworks only: a
    port names its own classes its own way, `MsBlock` for `PtBlock`, and they pair by path). A framework's
    own layer (`ReLU`, `GELU`, `Linear`) keeps its class: a GELU where the original has a ReLU is another
    layer, not another name."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] in ("Module", "Cell"):
        if len(parts) >= 4 and parts[-2] in _NUMBERED and parts[-1].isdigit() and not _a_layer(parts[-3]):
            return ".".join(parts[:-3] + ["*"] + parts[-2:])
        if parts[-1] == "parameters_grad" and not _a_layer(parts[-2]):
            return ".".join(parts[:-2] + ["*", parts[-1]])
    return name


@functools.lru_cache(maxsize=4096)
def _a_layer(cls: str) -> bool:
    """Whether a class name (read in PyTorch's names) is one of torch.nn's layers."""
    try:
        import torch.nn  # noqa: PLC0415 - imported when a compare across frameworks asks
    except Exception:  # noqa: BLE001 - no PyTorch here: every class pairs by path
        return False
    return isinstance(getattr(torch.nn, cls, None), type)


def module_class(name: str):
    """(path, class) of a module or cell record's name (`Module.block.PtBlock.forward.0`), else None."""
    parts = name.split(".")
    if len(parts) >= 5 and parts[0] in ("Module", "Cell") and parts[-2] in _NUMBERED and parts[-1].isdigit():
        return ".".join(parts[1:-3]), parts[-3]
    return None


def translations(target_framework: str, golden_framework: str, path: str = MAPPING) -> tuple:
    """(target's Translation or None, golden's Translation or None): a MindSpore side is translated when the
    other side writes PyTorch names (PyTorch, or MSAdapter's "mindtorch")."""
    family = {"pytorch": "pytorch", "mindtorch": "pytorch", "mindspore": "mindspore"}
    t, g = family.get(target_framework), family.get(golden_framework)
    if t is None or g is None or t == g:
        return None, None
    return (Translation(path), None) if t == "mindspore" else (None, Translation(path))
