"""Modules whose inside Python hooks must not see: compiled by torch.compile, or TorchScript.

torch.compile traces Python code into graphs: a hook or the API capture's mode inside a compiled module would be
traced too (dynamo cannot trace them: the frame falls back to eager, and the numbers change). So the debugger
hooks a compiled module only at its boundary, where the code is still eager: an `OptimizedModule` (what
`torch.compile(module)` returns) through its own hooks, which run before dynamo takes over, and a module compiled
in place (`module.compile()`, which compiles the call that runs the hooks) through its `_compiled_call_impl`.
Inside it only parameters are hooked (core/module_calls.py): gradients are accumulated outside compiled code.
TorchScript modules run in C++ and accept no hooks at all. Each kind is said once, with the paths it covers.
"""
from __future__ import annotations

import sys
import threading
import weakref

import torch

from ..core.safety import guarded, log

COMPILED = "compiled"
SCRIPTED = "scripted"

COMPILED_MESSAGE = (
    "%s runs compiled by torch.compile: the debugger cannot record inside compiled code yet, so the modules and "
    "API calls inside it are not recorded, only the modules' parameter gradients (a compiled submodule is "
    "recorded as one call, under its uncompiled name; the code around it, such as the loss and the optimizer, "
    "is recorded as usual). It trains compiled, with the same graphs and numbers as without the debugger")
FALLBACK_MESSAGE = (
    "a function compiled by torch.compile ran while the API capture was on (level %s): dynamo cannot trace the "
    "capture, so it ran that code eagerly, and its numbers may differ in their last bits from a compiled run "
    "without the debugger. Compile the module that calls it (torch.compile(module) or module.compile()) and pass "
    "the model to start(), or dump at L0")
SCRIPTED_MESSAGE = (
    "%s runs as TorchScript (torch.jit.script or trace), where Python hooks do not run: it and the modules and "
    "API calls inside it are not recorded; the calls around it are")


def _optimized_module_type():
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # a PyTorch without dynamo: nothing is compiled
        return ()
    return OptimizedModule


OPTIMIZED = _optimized_module_type()


def kind(module):
    """COMPILED, SCRIPTED, or None for a module whose inside runs eagerly."""
    if isinstance(module, torch.jit.ScriptModule):
        return SCRIPTED
    if (OPTIMIZED and isinstance(module, OPTIMIZED)) or module.__dict__.get("_compiled_call_impl") is not None:
        return COMPILED
    return None


def original(module):
    """The module that `torch.compile(module)` wrapped (its class names the records), else `module`."""
    while OPTIMIZED and isinstance(module, OPTIMIZED):
        module = module._orig_mod
    return module


def walk(root):
    """(path, module) of `root` and every module under it in `named_modules` order, paths as in the uncompiled
    model: the inside of a `torch.compile(module)` wrapper is listed under the wrapper's path (never as
    `..._orig_mod`), its wrapped module not at all (the wrapper stands for it). The inside of a TorchScript
    module is not listed: nothing of it can be hooked."""
    seen = set()
    stack = [("", root)]
    while stack:
        path, module = stack.pop()
        if module in seen:
            continue
        seen.add(module)
        yield path, module
        if kind(module) == SCRIPTED:
            continue
        inner = original(module)
        seen.add(inner)
        children = [(f"{path}.{name}" if path else name, child)
                    for name, child in inner._modules.items() if child is not None]
        stack.extend(reversed(children))


def hook_call(module, pre, post) -> list:
    """`pre(module, args, kwargs)` before and `post(module, args, kwargs, output)` after each call (post also
    when it raises, output None), outside compiled code; returns handles with `remove()`.

    A module compiled in place compiles the very call that runs its hooks, so there the compiled call itself is
    wrapped (an instance attribute of torch's, restored by the handle)."""
    compiled = module.__dict__.get("_compiled_call_impl")
    if compiled is None:
        return [module.register_forward_pre_hook(pre, with_kwargs=True),
                module.register_forward_hook(post, with_kwargs=True, always_call=True)]

    def call(*args, **kwargs):
        pre(module, args, kwargs)
        output = None
        try:
            output = compiled(*args, **kwargs)
        finally:
            post(module, args, kwargs, output)
        return output
    call.__wrapped__ = compiled
    module._compiled_call_impl = call
    return [_Restore(module, call, compiled)]


class _Restore:
    """Puts a module's own compiled call back, unless something else replaced it since."""

    __slots__ = ("module", "ours", "theirs")

    def __init__(self, module, ours, theirs):
        self.module, self.ours, self.theirs = weakref.ref(module), ours, theirs

    def remove(self) -> None:
        module = self.module()
        if module is not None and module.__dict__.get("_compiled_call_impl") is self.ours:
            module._compiled_call_impl = self.theirs


class CompiledRegions:
    """Says each compiled or scripted module of the models given to start() once, and keeps the API capture's
    mode off while a compiled module runs (dynamo would trace the mode, which it cannot, and run eagerly)."""

    def __init__(self, capture=None):
        self.capture = capture
        self._said = set()          # (kind, path) said
        self._hooked = weakref.WeakKeyDictionary()  # module -> handles: boundaries that switch the capture off
        self._local = threading.local()
        self._breaks = 0            # dynamo's graph breaks at the capture's mode when the capture began
        self._said_fallback = False

    @guarded("start()")
    def scan(self, models) -> None:
        """Each start(): says the compiled and scripted modules not said yet, and puts the capture's switch on
        the edge of each compiled module not switched yet."""
        from .framework import TorchFramework  # the framework imports this module

        found = {COMPILED: [], SCRIPTED: []}
        for index, given in enumerate(models):
            root = TorchFramework.unwrap(given)
            prefix = f"{index}." if len(models) > 1 else ""
            outer = []  # compiled modules' paths: one compiled inside them is compiled into their graph
            for path, module in walk(root):
                what = kind(module)
                if what is None or any(path.startswith(p) for p in outer):
                    continue
                outer.append(f"{path}." if path else "")
                name = prefix + path if path else f"the model {type(original(module)).__name__}"
                if (what, name) not in self._said:
                    self._said.add((what, name))
                    found[what].append(name)
                if what == COMPILED and self.capture is not None and module not in self._hooked:
                    self._hooked[module] = hook_call(module, self._suspend, self._resume)
        for what, message in ((COMPILED, COMPILED_MESSAGE), (SCRIPTED, SCRIPTED_MESSAGE)):
            if found[what]:
                log.warning(message, ", ".join(found[what]))

    def _breaks_at_capture(self) -> int:
        """Dynamo's count of graph breaks at the capture's mode (its counters name the mode's class): a
        compiled function that ran while the capture was on. Nothing to count before dynamo is imported."""
        utils = sys.modules.get("torch._dynamo.utils")
        breaks = getattr(utils, "counters", {}).get("graph_break") if utils is not None else None
        if not breaks:
            return 0
        name = f"class `{type(self.capture).__name__}`"
        return sum(count for reason, count in list(breaks.items()) if name in reason)

    @guarded("start()")
    def began(self) -> None:
        if self.capture is not None and not self._said_fallback:
            self._breaks = self._breaks_at_capture()

    @guarded("stop()")
    def ended(self, level) -> None:
        """Says once that compiled code fell back to eager because of the capture (then numbers may differ)."""
        if self.capture is not None and not self._said_fallback and self._breaks_at_capture() > self._breaks:
            self._said_fallback = True
            log.warning(FALLBACK_MESSAGE, level)

    def remove(self) -> None:
        for handles in list(self._hooked.values()):
            for handle in handles:
                handle.remove()
        self._hooked.clear()

    def _suspended(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    @guarded("a compiled module's pre-hook")
    def _suspend(self, module, args, kwargs) -> None:
        self._suspended().append(self.capture.suspend())

    @guarded("a compiled module's hook")
    def _resume(self, module, args, kwargs, output) -> None:
        stack = self._suspended()
        if stack and stack.pop():
            self.capture.activate()
