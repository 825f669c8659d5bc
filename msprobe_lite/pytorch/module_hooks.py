"""Module-level (L0) capture for PyTorch: forward records, backward records and parameter gradients.

Why tensor hooks and not `register_full_backward_hook`: full backward hooks wrap a module's inputs and
outputs in an identity autograd Function. That forbids in-place ops on them (`nn.ReLU(inplace=True)`,
`y.relu_()` on a module output: "Output 0 of BackwardHookFunction is a view and is being modified inplace")
and regroups gradient sums, which can change gradients bitwise. Tensor hooks change nothing in the graph:

- backward `input` (gradients w.r.t. the module's outputs): a hook on each output tensor;
- backward `output` (gradients w.r.t. the module's inputs): a hook on each input tensor, registered before
  the forward runs, so an in-place change inside the module still reports the gradient of the value the
  module received. It is d(loss)/d(input), the input's whole gradient, the same as `input.retain_grad()`.
- parameter gradients: `register_post_accumulate_grad_hook`, i.e. after accumulation into `.grad`.
"""
from __future__ import annotations

import sys
import threading
import weakref

import torch

from ..core.naming import BACKWARD, FORWARD, module_record, params_grad_record
from ..core.records import Record
from ..core.safety import guarded
from ..core.values import tensor_leaves


def _is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


class _Call:
    """A module call in flight: its record, and what its backward record will need."""

    __slots__ = ("name", "record", "backward")

    def __init__(self, name, record, backward):
        self.name = name
        self.record = record
        self.backward = backward


class BackwardCall:
    """Collects the gradients of one forward call as they arrive; the record appears with the first one."""

    __slots__ = ("name", "session", "summarizer", "record", "n_in", "n_out")

    def __init__(self, name, session, summarizer, n_in):
        self.name = name
        self.session = session
        self.summarizer = summarizer
        self.record = None
        self.n_in = n_in
        self.n_out = 0

    def hook_inputs(self, tensors, handles) -> None:
        for i, t in enumerate(tensors):
            if t.requires_grad:
                handles.append(t.register_hook(self._hook("output", i)))

    def hook_outputs(self, tensors, handles) -> None:
        self.n_out = len(tensors)
        for i, t in enumerate(tensors):
            if t.requires_grad:
                handles.append(t.register_hook(self._hook("input", i)))

    def _hook(self, key, index):
        @guarded(f"backward hook of {self.name}")
        def on_grad(grad):
            self.fill(key, index, grad)
        return on_grad

    def fill(self, key, index, grad) -> None:
        session = self.session
        if not session.step_open:
            return
        if self.record is None:
            data = {}
            if session.filter.wants_part("input"):
                data["input"] = [None] * self.n_out
            if session.filter.wants_part("output"):
                data["output"] = [None] * self.n_in
            self.record = session.add(Record(self.name, data))
        slots = self.record.data.get(key)
        if slots is not None and index < len(slots):
            slots[index] = self.summarizer.summarize(grad)
            session.touch()


class ModuleHooks:
    """Hooks every submodule of the models given to `start()`, once; removed when the run finishes."""

    def __init__(self, session, summarizer, kind: str = "Module"):
        self.session = session
        self.summarizer = summarizer
        self.kind = kind
        self._hooked = weakref.WeakSet()  # root models already hooked (ids could be reused)
        self._handles = []          # module and parameter hook handles
        self.grad_handles = []      # per-step tensor hooks, removed at the end of each step
        self._local = threading.local()

    # -- the module stack, per thread (construct.json parents, and API attribution at mix level) -------------
    def calls(self) -> list:
        stack = getattr(self._local, "calls", None)
        if stack is None:
            stack = self._local.calls = []
        return stack

    def current(self):
        stack = self.calls()
        return stack[-1].name if stack else None

    # -- installing ----------------------------------------------------------------------------------------
    def attach(self, model) -> None:
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        for index, root in enumerate(models):
            if not isinstance(root, torch.nn.Module):
                raise TypeError(f"start(model=...) expects a torch.nn.Module or a list/tuple of them, "
                                f"got {type(root).__name__}")
            if root in self._hooked:
                continue
            self._hooked.add(root)
            prefix = f"{index}." if len(models) > 1 else ""
            for path, module in root.named_modules():
                if module is not root:
                    self._hook_module(module, prefix + path)

    def detach(self) -> None:
        for handle in self._handles + self.grad_handles:
            handle.remove()
        self._handles.clear()
        self.grad_handles.clear()
        self._hooked.clear()

    def end_step(self) -> None:
        for handle in self.grad_handles:
            handle.remove()
        self.grad_handles.clear()

    def _hook_module(self, module, path: str) -> None:
        cls = type(module).__name__
        params = list(module.named_parameters(recurse=False))
        handles = self._handles
        handles.append(module.register_forward_pre_hook(self._pre_hook(path, cls, params), with_kwargs=True))
        handles.append(module.register_forward_hook(self._post_hook(), with_kwargs=True, always_call=True))
        grad_record = params_grad_record(self.kind, path, cls, 0)
        for pname, param in params:
            if param.requires_grad:
                handles.append(param.register_post_accumulate_grad_hook(self._param_hook(grad_record, pname)))

    # -- hook bodies -----------------------------------------------------------------------------------------
    def _pre_hook(self, path, cls, params):
        session, summarizer, kind = self.session, self.summarizer, self.kind
        key = (kind, path)

        @guarded(f"forward pre-hook of {kind}.{path}")
        def pre_hook(module, args, kwargs):
            if not session.forward_on:
                return None
            n = session.next_index(key)
            name = module_record(kind, path, cls, FORWARD, n)
            flt = session.filter
            flt.on_start(name)
            parent = self.current()
            call = _Call(name, None, None)
            self.calls().append(call)  # first: the post-hook pops it even if the rest of this hook fails
            if flt.wants(name):
                call.record = record = Record(name)
                if flt.wants_part("input"):
                    record.data["input_args"] = summarizer.encode(args, ("input_args",))
                    record.data["input_kwargs"] = summarizer.encode(kwargs, ("input_kwargs",))
                    record.data["parameters"] = {p: summarizer.summarize(t) for p, t in params}
                if session.config.extra_info:
                    session.set_parent(name, parent)
                    session.stacks.add(name, session.stacks.capture(2))
            bwd_name = module_record(kind, path, cls, BACKWARD, n)
            if torch.is_grad_enabled() and flt.wants(bwd_name):
                inputs = list(tensor_leaves((args, kwargs), _is_tensor))
                call.backward = BackwardCall(bwd_name, session, summarizer, len(inputs))
                call.backward.hook_inputs(inputs, self.grad_handles)
                if session.config.extra_info:
                    calls = self.calls()
                    outer = calls[-2] if len(calls) > 1 else None
                    session.set_parent(bwd_name, outer.backward.name if outer and outer.backward else None)
            return None
        return pre_hook

    def _post_hook(self):
        session, summarizer = self.session, self.summarizer

        @guarded("forward hook")
        def post_hook(module, args, kwargs, output):
            calls = self.calls()
            if not calls:
                return None
            call = calls.pop()
            if output is None and sys.exc_info()[0] is not None:
                return None  # the forward raised: no output to record
            if call.record is not None:
                if session.filter.wants_part("output"):
                    call.record.data["output"] = summarizer.encode_output(output)
                if not call.record.is_empty():
                    session.add(call.record)
            if call.backward is not None:
                outs = [t for t in tensor_leaves(output, _is_tensor)]
                call.backward.hook_outputs(outs, self.grad_handles)
            session.filter.on_end(call.name)
            return None
        return post_hook

    def _param_hook(self, record_name, pname):
        session, summarizer = self.session, self.summarizer

        @guarded(f"parameter-gradient hook of {record_name}")
        def on_accumulated(param):
            if not session.step_open or param.grad is None:
                return
            record = session.records.get(record_name)
            if record is None:
                if not session.filter.wants(record_name):
                    return
                record = session.add(Record(record_name))
            record.data[pname] = [summarizer.summarize(param.grad)]
            session.touch()
        return on_accumulated
