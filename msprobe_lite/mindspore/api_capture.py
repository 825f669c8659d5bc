"""API-level (L1) capture for MindSpore: the listed APIs are wrapped in place while collecting, and only then.

MindSpore has no dispatch hook like PyTorch's `TorchFunctionMode`, so `activate()` (at `start()`) replaces
each listed attribute of `mindspore.ops`, `mindspore.mint`, `mindspore.mint.nn.functional` and
`mindspore.Tensor`, and the `__call__` of each listed primitive class (what `nn` layers run), with a wrapper;
`deactivate()` (at `stop()`) puts every original back, so with the debugger idle MindSpore runs untouched.
Names imported before `start()` (`from mindspore.ops import relu`) still point at the originals and are
not seen; the docs say so.

Only outermost calls are records: a per-thread depth counter, raised for the whole of a wrapped call and
for the debugger's own work (`quiet()`), makes every nested call a plain call of the original. The counter
is restored in `finally`, so an API that raises inside a user's `try` does not disturb later capture.
Operators are named as the PyTorch adapter names them (`x + y` is `Tensor.add`), so that a MindSpore dump
and a PyTorch dump of the same code pair by name.
"""
from __future__ import annotations

import functools
import os
import threading

import importlib

import mindspore as ms
import yaml
from mindspore import ops

from ..core.safety import guarded, log
from .jit import stand_aside_api, tracing

API_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "apis.yaml")


def _optional(module: str):
    """A namespace that older MindSpore lacks (mindspore.mint arrived in 2.3), or None."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


# section of apis.yaml -> (record prefix, where the names live, the names are primitive classes)
SECTIONS = {"ops": ("Functional", ops, False), "tensor": ("Tensor", ms.Tensor, False),
            "mint": ("Mint", _optional("mindspore.mint"), False),
            "mint.nn.functional": ("MintFunctional", _optional("mindspore.mint.nn.functional"), False),
            "primitive": ("Primitive", ops, True)}
# Tensor operators under the names PyTorch's capture gives them, so both frameworks' dumps pair by name.
OPERATOR_NAMES = {"__add__": "add", "__radd__": "add", "__iadd__": "add_", "__sub__": "sub", "__isub__": "sub_",
                  "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul_", "__truediv__": "div",
                  "__rtruediv__": "__rdiv__", "__itruediv__": "div_", "__matmul__": "matmul", "__gt__": "gt",
                  "__ge__": "ge", "__lt__": "lt", "__le__": "le", "__abs__": "abs", "__neg__": "neg",
                  "__mod__": "remainder", "__pow__": "__pow__", "__rpow__": "__rpow__", "__rsub__": "__rsub__",
                  "__floordiv__": "__floordiv__"}
OPTIMIZER = "optimizer"


def _cpu_batch_norm_unwritten(prim) -> tuple:
    """MindSpore's CPU kernel of `BatchNorm` (2.10 and before) leaves outputs 1 and 2 unwritten in training,
    and 1 to 4 in inference: they hold what their reused memory held (another op's values, an earlier
    step's batch statistics), so recording them would make two identical runs differ there."""
    return (1, 2) if getattr(prim, "is_training", True) else (1, 2, 3, 4)


# primitive -> {device: the indices of its outputs that hold no result there}, recorded as null (not read)
UNWRITTEN_OUTPUTS = {("Primitive", "BatchNorm"): {"CPU": _cpu_batch_norm_unwritten}}


def unwritten_outputs(key, prim) -> tuple:
    rules = UNWRITTEN_OUTPUTS.get(key)  # the device is asked only of these (asking is slow)
    rule = rules.get(ms.get_context("device_target")) if rules else None
    return rule(prim) if rule is not None else ()


def load_api_list(path: str = API_LIST, sections=None, ignored=(), tensor_type=None) -> tuple:
    """((owner, attribute, prefix, record api name, is primitive class), ...) from an API list YAML.

    `sections` maps YAML sections to (prefix, namespace, primitive) (default: MindSpore's own); sections in
    `ignored` may appear and are skipped. The operators of `tensor_type` (default mindspore.Tensor) are
    always included, under PyTorch's names."""
    return _load_api_list(path, tuple((sections or SECTIONS).items()), tuple(ignored), tensor_type or ms.Tensor)


@functools.lru_cache(maxsize=8)
def _load_api_list(path, sections, ignored, tensor_type) -> tuple:
    with open(path, encoding="utf-8") as f:
        spec = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    known = {section for section, _ in sections} | set(ignored)
    if not isinstance(spec, dict) or set(spec) - known:
        raise ValueError(f"{path}: expected a mapping with sections {sorted(known)}, "
                         f"got {sorted(spec) if isinstance(spec, dict) else type(spec).__name__}")
    entries, missing, seen = [], [], set()
    for section, (prefix, namespace, primitive) in sections:
        if namespace is None:
            continue  # not in this MindSpore
        names = [str(n) for n in spec.get(section) or []]
        if namespace is tensor_type:
            names += [n for n in OPERATOR_NAMES if n not in names]
        for name in names:
            value = getattr(namespace, name, None)
            if (id(namespace), name) in seen:
                continue
            if primitive:
                if isinstance(value, type) and callable(getattr(value, "__call__", None)):
                    entries.append((value, "__call__", prefix, name, True))
                    seen.add((id(namespace), name))
                    continue
            elif callable(value):
                api = OPERATOR_NAMES.get(name, name) if namespace is tensor_type else name
                entries.append((namespace, name, prefix, api, False))
                seen.add((id(namespace), name))
                continue
            missing.append(f"{section}.{name}")
    if missing:
        log.warning("%s: %d names are not in this MindSpore and are not captured: %s", path, len(missing),
                    ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else ""))
    return tuple(entries)


class _Depth(threading.local):
    value = 0


class Quiet:
    """`with quiet:` marks the debugger's own MindSpore calls: the wrappers pass them straight through."""

    __slots__ = ("depth",)

    def __init__(self, depth: _Depth):
        self.depth = depth

    def __call__(self):
        return self

    def __enter__(self):
        self.depth.value += 1

    def __exit__(self, *exc):
        self.depth.value -= 1


class ApiCapture:
    """Wraps the listed APIs between activate() and deactivate(); `modules` (mix) gives each call its parent."""

    def __init__(self, session, recorder, modules=None, depth: _Depth | None = None, entries=None):
        self.session = session
        self.recorder = recorder
        self.modules = modules
        self.depth = depth if depth is not None else _Depth()
        self.entries = entries if entries is not None else load_api_list()
        self.active = False
        self._wrappers = None   # made once, on first activation
        self._saved = []        # (owner, attribute, what its own __dict__ held, or _ABSENT)

    # -- switching on and off ------------------------------------------------------------------------------
    def activate(self) -> None:
        if self.active:
            return
        if self._wrappers is None:
            self._wrappers = [self._wrap(entry) for entry in self.entries]
        for (owner, attribute, *_), wrapper in zip(self.entries, self._wrappers):
            self._saved.append((owner, attribute, owner.__dict__.get(attribute, _ABSENT)))
            setattr(owner, attribute, wrapper)
        self.active = True

    def deactivate(self) -> None:
        """Every wrapped attribute back to exactly what it was (inherited ones are deleted again)."""
        if not self.active:
            return
        self.active = False
        for owner, attribute, original in reversed(self._saved):
            if original is _ABSENT:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, original)
        self._saved = []

    remove = deactivate

    # -- interception ----------------------------------------------------------------------------------------
    def _wrap(self, entry):
        owner, attribute, prefix, api, primitive = entry
        original = getattr(owner, attribute)
        key = (prefix, api)
        depth, session = self.depth, self.session

        if primitive:  # the primitive instance is not an argument of the user's call
            def wrapper(prim, *args, **kwargs):
                if depth.value or not session.forward_on:
                    return original(prim, *args, **kwargs)
                return self._record(key, functools.partial(original, prim), args, kwargs, prim)
        else:
            def wrapper(*args, **kwargs):
                if depth.value or not session.forward_on:
                    return original(*args, **kwargs)
                return self._record(key, original, args, kwargs)
        stand_aside_api(wrapper, original)  # a graph compiler compiles the API in its place (see jit.py)
        wrapper.__name__ = getattr(original, "__name__", attribute)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        return wrapper

    def _record(self, key, original, args, kwargs, prim=None):
        if tracing():  # recording a graph (jit capture_mode "trace"): nothing of the debugger's goes into it
            return original(*args, **kwargs)
        depth = self.depth
        depth.value += 1
        try:
            call = self._begin(key, args, kwargs)
            try:
                out = original(*args, **kwargs)
            except BaseException:
                if call is not None:
                    self._abandon(call)
                raise
            if call is not None:
                self._end(call, key, args, out, prim)
            return out
        finally:
            depth.value -= 1

    @guarded("API capture")
    def _begin(self, key, args, kwargs):
        return self.recorder.begin_api(key, args, kwargs, self.modules)

    @guarded("API capture")
    def _abandon(self, call) -> None:
        self.recorder.abandon(call.name, call)

    @guarded("API capture")
    def _end(self, call, key, args, out, prim=None):
        unwritten = unwritten_outputs(key, prim) if prim is not None else ()
        if unwritten and isinstance(out, tuple):
            self.recorder.end(call, out, recorded_output=tuple(
                None if i in unwritten else value for i, value in enumerate(out)))
        else:
            self.recorder.end_api(call, key[1], args, out)


_ABSENT = object()
