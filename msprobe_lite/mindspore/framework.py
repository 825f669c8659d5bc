"""MindSpore's side of the hook contract (`core.framework.Framework`), PyNative mode.

MindSpore 2.x offers PyTorch's hook surface on cells (`register_forward_pre_hook(with_kwargs=True)`,
`register_forward_hook(always_call=True)`) and `Tensor.register_hook` for gradients: the hook fires while
a grad function (`mindspore.value_and_grad`, `mindspore.grad`) runs its backward. A non-leaf tensor has no
`requires_grad` flag, so every tensor that a call sees while a grad function runs gets a hook; one that gets
no gradient simply never fires.

MindSpore 2.0 (the MSAdapter stack) has neither: its cell hooks take `(cell_id, inputs[, output])`, and
gradients come only from the cell backward hook `(cell_id, grads w.r.t. outputs, grads w.r.t. inputs)`,
which sees no parameter gradients and no API-level gradients. The class adapts to what the installed
MindSpore offers, once, at import.
"""
from __future__ import annotations

import inspect

import mindspore as ms

try:  # MindSpore 2.9 moved it; 2.0 to 2.8 have it under common
    from mindspore.graph.api import _pynative_executor
except ImportError:  # pragma: no cover - older MindSpore
    from mindspore.common.api import _pynative_executor

from ..core.framework import Framework, NoHandle
from .jit import stand_aside, stand_aside_grad, tracing


TENSOR_HOOKS = hasattr(ms.Tensor, "register_hook")
CELL_HOOKS_WITH_KWARGS = "with_kwargs" in inspect.signature(ms.nn.Cell.register_forward_pre_hook).parameters


class MindSporeFramework(Framework):
    name = "mindspore"
    module_kind = "Cell"
    module_type = ms.nn.Cell
    tensor_hooks = TENSOR_HOOKS

    @staticmethod
    def is_tensor(value) -> bool:
        return isinstance(value, ms.Tensor)

    recording_gradients = staticmethod(getattr(_pynative_executor, "requires_grad", None)
                                       or _pynative_executor.grad_flag)

    @staticmethod
    def may_get_grad(tensor) -> bool:
        return TENSOR_HOOKS and (not isinstance(tensor, ms.Parameter) or tensor.requires_grad)

    # A call that the tracer of `mindspore.jit(capture_mode="trace")` runs to record a graph is no record: the
    # hooks stand aside there as they do in a backward pass (see jit.py).
    in_backward = staticmethod(tracing)

    if CELL_HOOKS_WITH_KWARGS:
        @staticmethod
        def hook_forward(module, pre, post) -> list:
            stand_aside(module, pre, post)  # what a graph compiler compiles in their place (see jit.py)
            return Framework.hook_forward(module, pre, post)
    else:
        @staticmethod
        def hook_forward(module, pre, post) -> list:
            """MindSpore 2.0: hooks receive a cell id, not the cell, and no keyword arguments."""
            pre_hook, hook = (lambda _id, args: pre(module, args, {}),
                              lambda _id, args, output: post(module, args, {}, output))
            stand_aside(module, pre_hook, hook)
            return [module.register_forward_pre_hook(pre_hook), module.register_forward_hook(hook)]

    @staticmethod
    def hook_backward(module, fn):
        """MindSpore 2.0's cell backward hook: (cell id, grads w.r.t. outputs, grads w.r.t. inputs)."""
        return module.register_backward_hook(lambda _id, grads_out, grads_in: fn(grads_out, grads_in))

    @staticmethod
    def on_grad(tensor, fn):
        return tensor.register_hook(fn)

    @staticmethod
    def submodules(root):
        """Every cell, except those that run inside a `mindspore.jit` cell: there they are compiled into the
        graph, and a Python hook would be compiled with them (and fail)."""
        compiled = []
        for path, cell in root.cells_and_names():
            if any(path.startswith(prefix) for prefix in compiled):
                continue
            if is_jit(cell):
                compiled.append(path + ".")
            yield path, cell

    @staticmethod
    def own_parameters(module) -> list:
        """As PyTorch's `named_parameters`: BatchNorm's running statistics (non-trainable `moving_*`
        Parameters here, buffers in PyTorch) are not parameters."""
        return [(name, p) for name, p in module.parameters_and_names(expand=False)
                if p.requires_grad or not name.startswith("moving_")]

    @staticmethod
    def on_param_grad(param, fn):
        """The gradient the grad function returns for this parameter (MindSpore has no `.grad` to fill)."""
        if not param.requires_grad or not TENSOR_HOOKS:
            return NoHandle

        def hook(grad):
            if not tracing():
                fn(grad)  # what it returns is for a framework that reads .grad again; a hook's result replaces grad
        stand_aside_grad(hook)  # a graph compiler compiles a hook that changes nothing (see jit.py)
        return param.register_hook(hook)


def is_jit(cell) -> bool:
    """A cell whose construct is compiled by `mindspore.jit` (decorated, or given a jit config)."""
    construct = type(cell).__dict__.get("construct")
    return getattr(construct, "__wrapped__", None) is not None or bool(getattr(cell, "_jit_config_dict", None))
