"""PyTorch's side of the hook contract (`core.framework.Framework`): tensors, autograd hooks, module trees."""
from __future__ import annotations

import itertools
import operator
from collections import OrderedDict

import torch

from ..core.framework import Framework, NoHandle
from ..core.safety import report_failure
from . import compiled


# The tensor types whose __torch_function__ is torch's own: the debugger's fast routes take these exactly (a
# subclass may handle a call itself). The C value encoder uses the same pair (pytorch/summary.py).
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_KEYS = itertools.count(-1, -1)  # on_grad's keys in tensors' hook dicts


_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)  # -1 outside a backward pass


class _AtBackwardEnd:
    """Reads parameter gradients again when the backward pass ends.

    DistributedDataParallel's reducer writes the gradient averaged over ranks into `.grad` in a callback that
    it queues once the last gradient is ready; at accumulation `.grad` holds this rank's own gradient, which
    is not what the optimizer gets. The record takes the gradient at accumulation (kept if the backward pass
    raises, or a hook of the user's frees `.grad`), and the first accumulation of a backward pass queues a
    callback that queues the second read behind every callback queued by then (the engine runs callbacks
    queued while it runs them): one read a pass serves every parameter pending. A failure here is the
    debugger's: reported, never raised into the user's backward."""

    def __init__(self):
        self.pending = []      # (param, again)
        self.queued_for = -1   # the backward pass (graph task) whose read is queued

    def add(self, param, again) -> None:
        self.pending.append((param, again))
        task = _graph_task_id() if _graph_task_id is not None else None
        if task is None or task != self.queued_for:  # a pass that raised never read: the next one queues anew
            self.queued_for = task
            torch.autograd.Variable._execution_engine.queue_callback(self._queue_read)

    def _queue_read(self) -> None:
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._read)
        except Exception as exc:  # noqa: BLE001 - a callback's exception would end the user's backward
            report_failure("parameter gradients", exc, site="_AtBackwardEnd")

    def _read(self) -> None:
        pending, self.pending = self.pending, []  # entries of a backward pass that raised go with these
        for param, again in pending:
            again(param.grad)  # guarded (module_calls._param_hook)


_AT_BACKWARD_END = _AtBackwardEnd()


class _HookHandle:
    """Removes one hook that `TorchFramework.on_grad` put into a tensor's hook dict."""

    __slots__ = ("hooks", "key")

    def __init__(self, hooks, key):
        self.hooks = hooks
        self.key = key

    def remove(self) -> None:
        self.hooks.pop(self.key, None)


class TorchFramework(Framework):
    name = "pytorch"
    module_kind = "Module"
    module_type = torch.nn.Module

    # Both run for every tensor argument of every captured call: C callables, no Python frame each.
    # `type.__instancecheck__` bound to torch.Tensor is `isinstance(value, torch.Tensor)` itself.
    is_tensor = staticmethod(torch.Tensor.__instancecheck__)
    may_get_grad = staticmethod(operator.attrgetter("requires_grad"))

    recording_gradients = staticmethod(torch.is_grad_enabled)

    @staticmethod
    def in_backward() -> bool:
        return _graph_task_id is not None and _graph_task_id() != -1

    @staticmethod
    def on_grad(tensor, fn):
        """`tensor.register_hook(fn)` for plain tensors, as that method does it (the tensor's hook dict, made
        and registered with its autograd node the first time), without the `RemovableHandle` it makes: a
        Python object with a weak reference and a class counter, plus an import, per hook (a small step
        registers about a hundred). The key is a negative number, which RemovableHandle's ids never are, so
        the dict's other hooks (the user's) run before and after it as with register_hook. The handle holds
        the dict until the step's end removes the hook. Tensor subclasses keep torch's method (their
        __torch_function__ may handle it)."""
        if type(tensor) not in PLAIN_TENSORS:
            return tensor.register_hook(fn)
        if not tensor.requires_grad:  # register_hook's own refusal (an inference tensor included)
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        hooks = tensor._backward_hooks
        if hooks is None:
            hooks = tensor._backward_hooks = OrderedDict()
            node = tensor.grad_fn
            if node is not None:
                node._register_hook_dict(tensor)
        key = next(_KEYS)
        hooks[key] = fn
        return _HookHandle(hooks, key)

    @staticmethod
    def submodules(root):
        """As `named_modules()`, with the paths of the uncompiled model; a TorchScript module's inside is not
        listed (compiled.py). Inside a compiled module (`opaque`), only parameters are hooked."""
        return compiled.walk(root)

    @staticmethod
    def opaque(module) -> bool:
        return compiled.kind(module) is not None

    @staticmethod
    def class_name(module) -> str:
        """`torch.compile(module)` wraps it: its records keep the class of the module wrapped."""
        return type(compiled.original(module)).__name__

    @staticmethod
    def hook_forward(module, pre, post) -> list:
        if compiled.kind(module) == compiled.SCRIPTED:
            return []  # TorchScript refuses hooks: not a record (said once by compiled.CompiledRegions)
        return compiled.hook_call(module, pre, post)

    @staticmethod
    def unwrap(root):
        """DistributedDataParallel and DataParallel hold the user's network as `.module`."""
        wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
        while isinstance(root, wrappers) and isinstance(getattr(root, "module", None), torch.nn.Module):
            root = root.module
        return root

    @staticmethod
    def own_parameters(module) -> list:
        if compiled.kind(module) == compiled.SCRIPTED:
            return []
        return [(name, p) for name, p in compiled.original(module).named_parameters(recurse=False)]

    @staticmethod
    def on_param_grad(param, fn):
        """`.grad` after accumulation, read again when the backward pass ends (_AtBackwardEnd): what the
        optimizer will use, summed over micro-batches and, under DistributedDataParallel, averaged over ranks."""
        if not param.requires_grad:
            return NoHandle

        def accumulated(p):
            again = fn(p.grad)  # guarded: None, or the read to repeat when the backward pass ends
            if again is not None:
                try:
                    _AT_BACKWARD_END.add(p, again)
                except Exception as exc:  # noqa: BLE001 - never into the user's backward
                    report_failure("parameter gradients", exc, site="_AtBackwardEnd")
        return param.register_post_accumulate_grad_hook(accumulated)
