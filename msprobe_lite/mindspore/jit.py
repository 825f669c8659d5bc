"""What MindSpore's graph compiler sees of the debugger: nothing that changes the graph.

`mindspore.jit` (its default capture mode, "ast") and GRAPH_MODE do not run a network's Python code: the
compiler parses it into a graph, and with it every forward hook of a cell it compiles, every hook of a
Parameter whose gradient it computes, and every function a name resolves to (an API the capture wrapped).
A debugger hook parsed there would be compiled into the user's graph, and fails (MindSpore calls compiled
forward hooks with other arguments). The parser compiles `inspect.unwrap(f)` for a function `f`, so each
hook and each API wrapper carries in `__wrapped__` what the compiler is to see instead: for a hook, a
function that returns None, so the graph is as without it; for a wrapper, the API itself.

The capture mode "trace" does run the Python code, once, to record a graph: `tracing()` tells the hooks and
wrappers to stand aside then, so that nothing of the debugger's is traced into the graph.
"""
from __future__ import annotations

import types

from mindspore.ops.primitive import constexpr

try:  # where MindSpore 2.10 keeps the tracer's state
    from mindspore.graph import jit_context as _trace_state
except ImportError:  # pragma: no cover - older MindSpore
    try:
        from mindspore.common import jit_context as _trace_state
    except ImportError:  # MindSpore 2.0 has no tracer
        _trace_state = None


class compiled:
    """Hooked cells that the compiler compiled in this process (read by the debugger): how many, and the
    class of the latest one. Two numbers, whatever the number of compiles."""

    count = 0
    latest = ""


def tracing() -> bool:
    """Whether `mindspore.jit(capture_mode="trace")` is recording a graph from the Python code running now."""
    return _trace_state is not None and _trace_state.jit_context() is not None


try:  # evaluated at each compile, with no warning about its constant argument
    _at_compile_time = constexpr(reuse_result=False, check=False)
except TypeError:  # pragma: no cover - MindSpore before 2.0 has neither option (one note is all it needs)
    _at_compile_time = constexpr


@_at_compile_time
def _note_compiled(cls_name):
    """Runs in Python while the compiler infers the graph (not when the graph runs): the debugger learns that
    a cell it hooks runs compiled, where it sees nothing. Its value is the constant None."""
    compiled.count += 1
    compiled.latest = cls_name


def stand_aside(module, pre, post) -> None:
    """What the compiler compiles for a cell's forward pre-hook and forward hook: nothing but a note."""
    cls_name = type(module).__name__

    def compiled_pre_hook(cell, inputs):
        return _note_compiled(cls_name)

    def compiled_hook(cell, inputs, output):
        return None

    pre.__wrapped__ = compiled_pre_hook
    post.__wrapped__ = compiled_hook


def _compiled_grad_hook(grad):
    return None  # MindSpore's compiled hook wrapper passes the gradient on unchanged when a hook returns None


def stand_aside_grad(hook) -> None:
    """What the compiler compiles for a Parameter's gradient hook: a hook that changes nothing."""
    hook.__wrapped__ = _compiled_grad_hook


def stand_aside_api(wrapper, original) -> None:
    """What the compiler compiles for a wrapped API: the API. It parses a function's own code; anything else
    (a primitive instance such as `ops.make_range`, a MultitypeFuncGraph) is reached through a function
    that calls it, which the compiler inlines."""
    if isinstance(original, types.FunctionType):
        wrapper.__wrapped__ = original
        return

    def compiled_api(*args, **kwargs):
        return original(*args, **kwargs)
    wrapper.__wrapped__ = compiled_api
