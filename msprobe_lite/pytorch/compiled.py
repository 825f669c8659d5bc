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

import gc
import sys
import threading
import types
import weakref

import torch

from ..core.safety import guarded, log
from . import compiled_capture

COMPILED = "compiled"
SCRIPTED = "scripted"

# One line each, at most 160 characters: the names of a message are cut to NAMES_WIDTH characters (names())
COMPILED_MESSAGE = ("%s is compiled by torch.compile: its inside is not recorded, only parameter gradients; "
                    "training is unchanged")
# at L1 and mix, where compiled_capture.py records the API calls of the graphs
CAPTURED_MESSAGE = ("%s is compiled by torch.compile: its graphs' API calls recorded, not its modules;"
                    " training unchanged")
FALLBACK_MESSAGE = ("a function compiled by torch.compile ran eagerly (level %s: dynamo cannot trace the API "
                    "capture): its numbers may differ. Compile its module or dump at L0")
SCRIPTED_MESSAGE = ("%s runs as TorchScript (no Python hooks): it and the calls inside it are not recorded, the "
                    "calls around it are")
LATE_MESSAGE = ("%s ran eagerly this step (the API capture was on): compiled from the next step, with its graphs' "
                "API calls")
NAMES_WIDTH = 50


def names(listed) -> str:
    """`a, b and 3 more`, within NAMES_WIDTH characters (a single long name is cut)."""
    shown = []
    for i, name in enumerate(listed):
        rest = len(listed) - i - 1
        tail = f" and {rest} more" if rest else ""
        if len(", ".join(shown + [name])) + len(tail) > NAMES_WIDTH:
            break
        shown.append(name)
    if not shown:
        first = listed[0]
        tail = f" and {len(listed) - 1} more" if len(listed) > 1 else ""
        return first[:NAMES_WIDTH - len(tail) - 3] + "..." + tail
    rest = len(listed) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def _optimized():
    """The class `torch.compile(module)` returns, or None while dynamo is not imported: nothing is compiled
    before it is (torch.compile imports it), and importing it here would make every run pay for dynamo."""
    return getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)


def is_wrapper(module) -> bool:
    """Whether `module` is what `torch.compile(module)` returned."""
    cls = _optimized()
    return cls is not None and isinstance(module, cls)

# module -> weak references to the `torch.compile(module)` wrappers that hold it and that are not in the model
# given to start() (`model = torch.compile(net)`, then `start(model=net)`): the module is compiled as if the
# wrapper had been given. Filled by find_wrappers().
_WRAPPERS = weakref.WeakKeyDictionary()


def wrappers_of(module) -> list:
    """The live `torch.compile` wrappers found for `module` outside the model (find_wrappers)."""
    refs = _WRAPPERS.get(module) if _WRAPPERS else None
    return [w for w in (ref() for ref in refs) if w is not None] if refs else []


def find_wrappers() -> list:
    """Every live `OptimizedModule` (one pass over the objects that the garbage collector tracks, costly in a
    large process (docs/performance.md), so only at the first start(), when a model's tree changed, and after
    compiled code fell back to eager); the modules they wrap are recorded in _WRAPPERS. Returns the wrappers."""
    cls = _optimized()
    if cls is None:
        return []
    from .framework import TorchFramework  # the framework imports this module

    found = [obj for obj in gc.get_objects() if type(obj) is cls]
    _WRAPPERS.clear()
    for wrapper in found:
        inner = wrapper.__dict__.get("_modules", {}).get("_orig_mod")
        if isinstance(inner, torch.nn.Module):  # torch.compile(ddp) compiles the network that start(ddp) hooks
            for module in {inner, TorchFramework.unwrap(inner)}:
                _WRAPPERS.setdefault(module, []).append(weakref.ref(wrapper))
    return found


def kind(module):
    """COMPILED, SCRIPTED, or None for a module whose inside runs eagerly."""
    if isinstance(module, torch.jit.ScriptModule):
        return SCRIPTED
    if is_wrapper(module) or module.__dict__.get("_compiled_call_impl") is not None:
        return COMPILED
    if _WRAPPERS and wrappers_of(module):
        return COMPILED
    return None


def original(module):
    """The module that `torch.compile(module)` wrapped (its class names the records), else `module`."""
    while is_wrapper(module):
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
    wrapped (an instance attribute of torch's, restored by the handle). A module held by `torch.compile` wrappers
    outside the model is hooked on those wrappers (the module's own hooks would be compiled)."""
    compiled = module.__dict__.get("_compiled_call_impl")
    if compiled is None:
        targets = [module] if is_wrapper(module) else wrappers_of(module) or [module]
        return [handle for target in targets for handle in (
            target.register_forward_pre_hook(pre, with_kwargs=True),
            target.register_forward_hook(post, with_kwargs=True, always_call=True))]

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


# The reason dynamo's graph break names when it meets the Python route's __torch_function__ (keep_dynamo_out)
NOT_TRACED = "msprobe_lite's API capture is not traced"
_kept_out = []  # the dynamo whose skip rules name msprobe_lite


def keep_dynamo_out(mode_class) -> None:
    """Once dynamo is imported: it never traces the debugger's own code, as it cannot trace the C handler.

    Without the C routes the capture's `__torch_function__` is Python, which dynamo would inline into a
    compiled function, and then the recorder's and summarizer's frames (compiled with graph breaks, or failing
    inside dynamo) instead of falling back to eager at the mode. Marked as torch.compiler.disable marks a
    function (without wrapping it: no frame added to each call), the mode's method is a graph break like the C
    one; msprobe_lite's files among dynamo's skipped ones keep the frames it calls eager."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None or dynamo in _kept_out:
        return
    _kept_out.append(dynamo)
    method = getattr(mode_class, "__torch_function__", None)
    if isinstance(method, types.FunctionType):  # the C handler's is no Python function: dynamo stops there
        method._torchdynamo_disable = True
        method._torchdynamo_disable_msg = NOT_TRACED
    add = getattr(getattr(dynamo, "trace_rules", None), "add", None)
    if add is not None:
        add(__name__.split(".")[0])


class CompiledRegions:
    """Says each compiled or scripted module of the models given to start() once, and keeps the API capture's
    mode off while a compiled module runs (dynamo would trace the mode, which it cannot, and run eagerly).

    A `torch.compile(module)` wrapper outside the model given (`model = torch.compile(net)`, then
    `start(model=net)`; or no model at L1) is found among the live objects (find_wrappers) at the first start(),
    when a given model's tree changed, and after a stop() whose step fell back to eager at the capture: the module
    it wraps is then compiled for the debugger as if the wrapper had been given, and at L1 and mix the capture is
    switched off while any wrapper runs."""

    def __init__(self, capture=None):
        self.capture = capture
        self._said = set()          # (kind, path) said
        self._hooked = weakref.WeakKeyDictionary()  # module -> handles: boundaries that switch the capture off
        self._local = threading.local()
        self._breaks = 0            # dynamo's graph breaks at the capture's mode when the capture began
        self._said_fallback = False
        self._shape = None          # the identities of the given models' modules when wrappers were looked for
        self._loose = weakref.WeakSet()  # wrappers found whose module is in no given model

    @guarded("start()")
    def scan(self, models) -> None:
        """Each start(): says the compiled and scripted modules not said yet, and puts the capture's switch on
        the edge of each compiled module not switched yet."""
        from .framework import TorchFramework  # the framework imports this module

        roots = [TorchFramework.unwrap(given) for given in models]
        trees = [list(walk(root)) for root in roots]
        shape = [id(module) for tree in trees for _, module in tree]
        if shape != self._shape:  # the first start(), or a model changed: wrappers made outside it are looked for
            self._shape = shape
            self._look(trees)
            trees = [list(walk(root)) for root in roots]  # modules wrapped outside the model are compiled now
        found = {COMPILED: [], SCRIPTED: []}
        for index, tree in enumerate(trees):
            prefix = f"{index}." if len(trees) > 1 else ""
            outer = []  # compiled modules' paths: one compiled inside them is compiled into their graph
            for path, module in tree:
                what = kind(module)
                if what is None or any(path.startswith(p) for p in outer):
                    continue
                outer.append(f"{path}." if path else "")
                self._found(found, what, prefix + path if path else f"the model {type(original(module)).__name__}",
                            module)
        if self.capture is not None:  # wrappers outside the models: only the capture's switch is theirs
            for wrapper in list(self._loose):
                self._found(found, COMPILED, f"the model {type(original(wrapper)).__name__}", wrapper)
        compiled_message = COMPILED_MESSAGE if self.capture is None else CAPTURED_MESSAGE
        for what, message in ((COMPILED, compiled_message), (SCRIPTED, SCRIPTED_MESSAGE)):
            if found[what]:
                log.warning(message, names(found[what]))

    def _found(self, found, what, name, module) -> None:
        if (what, name) not in self._said:
            self._said.add((what, name))
            found[what].append(name)
        if what == COMPILED and self.capture is not None and module not in self._hooked:
            self._hooked[module] = hook_call(module, self._suspend, self._resume)

    def _look(self, trees) -> None:
        """Looks for the live wrappers (find_wrappers); those of no given model's module are kept as loose."""
        inside = {id(module) for tree in trees for _, module in tree}
        self._loose = weakref.WeakSet(w for w in find_wrappers() if id(w) not in inside
                                      and id(original(w)) not in inside)

    def _breaks_at_capture(self) -> int:
        """Dynamo's count of graph breaks at the capture's mode (its counters name the C handler's class, or
        the reason keep_dynamo_out gave the Python route's method): a compiled function that ran while the
        capture was on. Nothing to count before dynamo is imported."""
        utils = sys.modules.get("torch._dynamo.utils")
        breaks = getattr(utils, "counters", {}).get("graph_break") if utils is not None else None
        if not breaks:
            return 0
        marks = (f"class `{type(self.capture).__name__}`", NOT_TRACED)
        return sum(count for reason, count in list(breaks.items()) if any(mark in reason for mark in marks))

    @guarded("start()")
    def began(self) -> None:
        if self.capture is not None:
            keep_dynamo_out(type(self.capture))
            if compiled_capture.install(self.capture):  # L1/mix: the API calls inside compiled graphs
                compiled_capture.activate(self.capture)
        if self.capture is not None and not self._said_fallback:
            self._breaks = self._breaks_at_capture()

    @guarded("stop()")
    def ended(self, level) -> None:
        """Compiled code fell back to eager because of the capture: a wrapper made since the last look (switched
        at the next start(), said now), else said once (then numbers may differ)."""
        if self.capture is not None:
            compiled_capture.deactivate(self.capture)
        if self.capture is None or self._said_fallback or self._breaks_at_capture() <= self._breaks:
            return
        self._shape = None  # the next start() looks again
        late = [w for w in find_wrappers() if w not in self._hooked and original(w) not in self._hooked]
        if late:
            said = [f"the model {type(original(w)).__name__}" for w in late]
            self._said.update((COMPILED, name) for name in said)
            log.warning(LATE_MESSAGE, names(said))
            return
        self._said_fallback = True
        log.warning(FALLBACK_MESSAGE, level)

    def remove(self) -> None:
        if self.capture is not None:
            compiled_capture.deactivate(self.capture)
            compiled_capture.uninstall()
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
