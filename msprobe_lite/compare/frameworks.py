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
_SECTIONS = ("cells", "parameters", "apis", "arguments")
_PREFIXES = {"Mint": "Torch", "MintFunctional": "Functional"}   # default API prefix correspondence
_NUMBERED = ("forward", "backward", "parameters_grad")
# state_dict entries that are PyTorch bookkeeping, not weights: no MindSpore counterpart, never compared
TORCH_BOOKKEEPING = ("num_batches_tracked",)


class NameMapError(ValueError):
    """A mapping file that is not a mapping of the four known sections to name -> name tables."""


@functools.lru_cache(maxsize=8)
def load_names(path: str = MAPPING) -> dict:
    """{section: {mindspore name: pytorch name}} from a mapping YAML (checked, parsed once per path)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            content = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise NameMapError(f"{path}: cannot read the name mapping: {exc}") from None
    if not isinstance(content, dict) or set(content) - set(_SECTIONS):
        raise NameMapError(f"{path}: expected sections {list(_SECTIONS)}, got "
                           f"{sorted(content) if isinstance(content, dict) else type(content).__name__}")
    names = {}
    for section in _SECTIONS:
        table = content.get(section) or {}
        if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in table.items()):
            raise NameMapError(f"{path}: section {section!r} must map names to names (strings)")
        names[section] = dict(table)
    return names


class Translation:
    """Renames MindSpore record names and row tails to PyTorch's."""

    def __init__(self, path: str = MAPPING):
        names = load_names(path)
        self.cells, self.params = names["cells"], names["parameters"]
        self.apis, self.arguments = names["apis"], names["arguments"]

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

    def row_tail(self, tail: str) -> str:
        """The part of a row name after its record: `.parameters.gamma` -> `.parameters.weight`, `.beta` (a
        parameter gradient) -> `.bias`, `.input.axis` -> `.input.dim`."""
        parts = tail.split(".")
        if len(parts) >= 3 and parts[1] == "parameters":
            parts[2] = self.params.get(parts[2], parts[2])
        elif len(parts) >= 3 and parts[1] == "input" and not parts[2].isdigit():
            parts[2] = self.arguments.get(parts[2], parts[2])
        elif len(parts) >= 2 and not parts[1].isdigit() and parts[1] not in ("input", "output"):
            parts[1] = self.params.get(parts[1], parts[1])
        return ".".join(parts)


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


def translations(target_framework: str, golden_framework: str, path: str = MAPPING) -> tuple:
    """(target's Translation or None, golden's Translation or None): a MindSpore side is translated when the
    other side writes PyTorch names (PyTorch, or MSAdapter's "mindtorch")."""
    family = {"pytorch": "pytorch", "mindtorch": "pytorch", "mindspore": "mindspore"}
    t, g = family.get(target_framework), family.get(golden_framework)
    if t is None or g is None or t == g:
        return None, None
    return (Translation(path), None) if t == "mindspore" else (None, Translation(path))
