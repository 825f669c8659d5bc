"""The weights inside a PyTorch checkpoint as users have them, under the names of the network they belong to.

Training scripts rarely save a bare state_dict: `{"model": sd, "epoch": 3}`, `{"state_dict": sd}` and
`{"model_state_dict": sd, "optimizer_state_dict": ...}` are the common layouts, and a model wrapped in DDP or
DataParallel (or `torch.compile`) prefixes every name with `module.` (`_orig_mod.`). A port may also rename
attributes (`self.attn` here, `self.attention` there): a name map `old: new` renames whole parts of names.
Framework-free: a tensor is recognised by the `is_tensor` the caller passes.
"""
from __future__ import annotations

import re
import warnings
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

from .small_file import SmallFileError, read_small_text

# where training scripts put the weights, looked at in this order (then: the only mapping of tensors)
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network")
# prefixes a wrapper gives every name: DDP / DataParallel, torch.compile
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_MAX_DEPTH = 4  # {"model": {"module": sd}} is as deep as real checkpoints go


class StateDictError(ValueError):
    """No weights where a state_dict was expected, or a name map that cannot be used: the message is one line."""


def _refused(names: Sequence[str]) -> str:
    """What the globals a weights-only load refused are, in a user's words: `argparse.Namespace`, `a numpy scalar`."""
    numpy = [n for n in names if n.startswith("numpy.")]
    other = [n for n in names if not n.startswith("numpy.")]
    parts = other[:2] + ([f"{len(other) - 2} more classes"] if len(other) > 2 else [])
    if numpy:
        kinds = [kind for kind, ends in (("scalar", (".scalar",)), ("array", (".ndarray", "._reconstruct")))
                 if any(n.endswith(ends) for n in numpy)]
        parts.append("numpy values" if len(kinds) == 2 else f"a numpy {kinds[0] if kinds else 'dtype'}")
    return " and ".join(parts)


def load_torch_checkpoint(path: str, trust: bool = False) -> Any:
    """What a .pt/.pth file holds. Without `trust`, loaded with weights_only=True (tensors and plain Python
    values: nothing in the file runs); a refusal names the file and the refused classes in one line. `trust`
    (the CLI's --trust-checkpoint) loads with weights_only=False, which runs the pickled code in the file:
    only for files the user made. Raises StateDictError."""
    import torch

    try:
        with warnings.catch_warnings():  # torch's notes on pickle protocols are no news to the user
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=not trust)
    except OSError as exc:
        raise StateDictError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (ImportError, AttributeError) as exc:  # a trusted load of a class the saving script defined
        cause = re.sub(r" on <module .*", "", " ".join(str(exc).split()))[:80] or type(exc).__name__
        raise StateDictError(f"{path}: a class it holds is not importable here ({cause}); save only the state_dict")\
            from None
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a file it cannot load
        text = "" if trust else str(exc)
    names: List[str] = []
    if "GLOBAL" in text:
        try:
            names = list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception:  # noqa: BLE001 - older torch: the name torch's message gives
            names = re.findall(r"GLOBAL (\S+) was not an allowed global", text)
    if not names:
        raise StateDictError(f"{path}: not a PyTorch checkpoint (expected a file that torch.save wrote)")
    raise StateDictError(f"{path}: refused {_refused(names)} (unsafe to load); save only the state_dict, or if you "
                         f"made it: --trust-checkpoint")


def _is_weights(value: Any, is_tensor: Callable[[Any], bool]) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(is_tensor(v) for v in value.values())


def _show_keys(value: Any) -> str:
    if not isinstance(value, Mapping):
        return f"a {type(value).__name__}"
    keys = [repr(k) for k in list(value)[:8]]
    return "an empty mapping" if not keys else "keys " + ", ".join(keys) + (", ..." if len(value) > 8 else "")


def find_state_dict(loaded: Any, is_tensor: Callable[[Any], bool], source: str) -> Tuple[Dict[str, Any], List[str]]:
    """(the mapping of names to tensors in `loaded`, the keys walked to reach it). Raises StateDictError."""
    found, walked = loaded, []
    for _ in range(_MAX_DEPTH):
        if _is_weights(found, is_tensor):
            return {str(k): v for k, v in found.items()}, walked
        if not isinstance(found, Mapping):
            break
        key = next((k for k in WRAPPER_KEYS if isinstance(found.get(k), Mapping)), None)
        if key is None:
            inner = [k for k, v in found.items() if _is_weights(v, is_tensor)]
            if len(inner) != 1:
                break
            key = inner[0]
        walked.append(key)
        found = found[key]
    where = "".join(f"[{k!r}]" for k in walked) or "its top level"
    raise StateDictError(f"{source}: no state_dict (a mapping of parameter names to tensors) found: {where} holds "
                         f"{_show_keys(found)}; expected the state_dict itself or under one of "
                         f"{', '.join(map(repr, WRAPPER_KEYS))}")


def strip_wrapper_prefixes(state: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """(`state` without the wrapper prefixes that every name carries, the prefixes removed)."""
    state, removed = dict(state), []
    while state:
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state)), None)
        if prefix is None:
            break
        state = {k[len(prefix):]: v for k, v in state.items()}
        removed.append(prefix)
    return state, removed


def rename(name: str, name_map: Mapping[str, str]) -> str:
    """`name` with each run of whole dot-separated parts equal to a map key replaced by its value, longest key
    first, in one pass (a new name is never renamed again): `attn: attention` turns `blocks.0.attn.weight` into
    `blocks.0.attention.weight` and leaves `attn_out.weight` alone."""
    if not name_map:
        return name
    keys = sorted(((tuple(old.split(".")), new) for old, new in name_map.items()), key=lambda kv: -len(kv[0]))
    parts, out, i = name.split("."), [], 0
    while i < len(parts):
        hit = next(((old, new) for old, new in keys if tuple(parts[i:i + len(old)]) == old), None)
        if hit is None:
            out.append(parts[i])
            i += 1
        else:
            out.append(hit[1])
            i += len(hit[0])
    return ".".join(out)


def load_name_map(path: str) -> Dict[str, str]:
    """`old: new` pairs from a YAML file (old: a part of PyTorch's names, new: what it is in the port)."""
    import yaml

    try:
        content = yaml.safe_load(read_small_text(path))
    except SmallFileError as exc:
        raise StateDictError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise StateDictError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(content, dict) or not content:
        raise StateDictError(f"{path}: expected a mapping of old: new names (such as `attn: attention`), got "
                             f"{type(content).__name__}")
    for old, new in content.items():
        for name in (old, new):
            if not isinstance(name, str) or "" in name.split("."):
                raise StateDictError(f"{path}: {old!r}: {new!r}: expected names such as `attn` or "
                                     f"`encoder.layers` on both sides (dot-separated, no empty part), got {name!r}")
    return dict(content)
