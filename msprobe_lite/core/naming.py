"""Record names, in the one place that knows the spec's (slightly irregular) word order.

APIs put the call index before the direction (`Functional.linear.0.forward`); modules put it after
(`Module.fc1.Linear.forward.0`). Both forms are built and parsed here only.
"""
from __future__ import annotations

import hashlib

FORWARD = "forward"
BACKWARD = "backward"
PARAMS_GRAD = "parameters_grad"


def api_record(prefix: str, api: str, index: int, direction: str) -> str:
    return f"{prefix}.{api}.{index}.{direction}"


def module_record(kind: str, path: str, cls: str, direction: str, index: int) -> str:
    """kind is `Module` (PyTorch, MSAdapter) or `Cell` (MindSpore)."""
    return f"{kind}.{path}.{cls}.{direction}.{index}"


def params_grad_record(kind: str, path: str, cls: str, index: int) -> str:
    return f"{kind}.{path}.{cls}.{PARAMS_GRAD}.{index}"


def params_grad_calls(name: str, names) -> tuple:
    """(forward records, backward records) among `names` of every call of the module whose parameter
    gradients `name` holds (`Module.fc.Linear.parameters_grad.0`: `Module.fc.Linear.forward.N`,
    `...backward.N`), or None for another record. Parameter gradients are summed over the module's calls, and
    made of each call's forward inputs and backward input gradients (grad_out^T x for a linear layer)."""
    parts = name.split(".")
    if len(parts) < 3 or parts[-2] != PARAMS_GRAD:
        return None
    owner = ".".join(parts[:-2])
    forward, backward = f"{owner}.{FORWARD}.", f"{owner}.{BACKWARD}."
    return [n for n in names if n.startswith(forward)], [n for n in names if n.startswith(backward)]


def debug_record(name: str, index: int) -> str:
    return f"{name}.{index}.debug"


def counterpart(name: str) -> str:
    """The same call seen from the other direction (forward <-> backward), or the name itself."""
    parts = name.split(".")
    for i in (-1, -2):
        if len(parts) >= 2 and parts[i] in (FORWARD, BACKWARD):
            parts[i] = BACKWARD if parts[i] == FORWARD else FORWARD
            return ".".join(parts)
    return name


def direction_of(name: str) -> str | None:
    """forward / backward / parameters_grad for a record name, None for anything else (debug)."""
    parts = name.split(".")
    for token in parts[-2:]:
        if token in (FORWARD, BACKWARD):
            return token
    if len(parts) >= 2 and parts[-2] == PARAMS_GRAD:
        return PARAMS_GRAD
    return None


# where a value sits in a record -> the category in its tensor file name (docs/format.md, tensor files)
_CATEGORY = {"input_args": "input", "input_kwargs": "kwargs", "output": "output", "parameters": "parameters",
             "input": "input"}
# separators, NUL and control characters never reach a file name
_UNSAFE = {**{c: "_" for c in range(32)}, ord("/"): "_", ord("\\"): "_", 0x7F: "_"}
NAME_MAX = 200  # bytes of a file name: leaves room for the writer's `.tmp-{pid}-{thread}` under the usual 255


def safe_file_name(name: str) -> str:
    """`name` itself when it is a plain file name; otherwise a safe one that is still unique to `name`.

    Separators, NUL and control characters become `_`, and a name longer than NAME_MAX bytes keeps its
    start and end; either way `~` and a hash of the original name are added, so two names that differ only
    in what was replaced ("a/b", "a_b") never share a file.
    """
    safe = name.translate(_UNSAFE)
    try:
        size = len(safe.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no file system takes it
        safe = safe.encode("utf-8", "replace").decode("utf-8")  # differs from `name`: gets the hash
        size = len(safe.encode("utf-8"))
    if size <= NAME_MAX and safe == name and safe not in ("", ".", ".."):
        return name
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    if size <= NAME_MAX - len(digest) - 1:
        return f"{safe}~{digest}"
    raw = safe.encode("utf-8")
    head = raw[:120].decode("utf-8", "ignore")
    tail = raw[-60:].decode("utf-8", "ignore")
    return f"{head}~{digest}~{tail}"


def data_file_name(record: str, path: tuple, ext: str) -> str:
    """`{record}.{category}.{index or key}[.{j}...]{ext}` for the tensor at `path` in `record`.

    Parameter gradients have no category: `{Module...}.parameters_grad.{k}.{param}{ext}`. Names come from
    user code (dict keys, module names, save() names): `safe_file_name` keeps them inside the tensor folder.
    """
    parts = [record]
    if path:
        head = _CATEGORY.get(path[0])
        parts += [head] if head else [str(path[0])]
        parts += [str(p) for p in path[1:]]
    return safe_file_name(".".join(parts)) + ext
