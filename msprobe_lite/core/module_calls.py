"""Module-level (L0) capture, for PyTorch modules and MindSpore cells alike: forward records, backward records
and parameter gradients.

Forward pre/post hooks on every submodule (inputs are summarised before the module runs, so in-place
modules show what they received); backward records through the tensor hooks of `calls.py`; parameter
gradients through the framework's parameter hook (PyTorch: after accumulation into `.grad`). The module
stack kept here (per thread) gives construct.json its parents and tells the API capture which module runs.
Both frameworks offer the same forward-hook signatures (`with_kwargs`, `always_call`).
"""
from __future__ import annotations

import sys
import threading
from threading import get_ident
import weakref

from .calls import Call
from .naming import BACKWARD, FORWARD, module_record, params_grad_record
from .records import Record
from .safety import guarded, report_failure


class ModuleHooks:
    """Hooks every submodule of the models given to `start()`, once; removed when the run finishes."""

    def __init__(self, session, summarizer, recorder, framework):
        self.session = session
        self.summarizer = summarizer
        self.recorder = recorder
        self.framework = framework
        self.kind = framework.module_kind
        self._hooked = weakref.WeakSet()  # root models already hooked (ids could be reused)
        self._handles = []                # module and parameter hook handles
        self._local = threading.local()

    # -- the module stack, per thread -------------------------------------------------------------------------
    def calls(self) -> list:
        stack = getattr(self._local, "calls", None)
        if stack is None:
            stack = self._local.calls = []
        return stack

    def current(self):
        """The innermost module call running in this thread, or None."""
        stack = self.calls()
        return stack[-1] if stack else None

    # -- installing ----------------------------------------------------------------------------------------
    def attach(self, model) -> None:
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        expected = self.framework.module_type
        for index, root in enumerate(models):
            if not isinstance(root, expected):
                raise TypeError(f"start(model=...) expects a {expected.__module__}.{expected.__name__} or a "
                                f"list/tuple of them, got {type(root).__name__}")
            if root in self._hooked:
                continue
            prefix = f"{index}." if len(models) > 1 else ""
            for path, module in self.framework.submodules(root):
                if module is not root:
                    try:
                        self._hook_module(module, prefix + path)
                    except Exception as exc:  # noqa: BLE001 - one odd module must not leave the rest unhooked
                        report_failure(f"hooking {prefix + path}", exc, site="hooking a module")
            self._hooked.add(root)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._hooked = weakref.WeakSet()

    def _hook_module(self, module, path: str) -> None:
        cls = type(module).__name__
        params = self.framework.own_parameters(module)
        handles = self._handles
        handles.append(module.register_forward_pre_hook(self._pre_hook(path, cls, params), with_kwargs=True))
        handles.append(module.register_forward_hook(self._post_hook(), with_kwargs=True, always_call=True))
        grad_record = params_grad_record(self.kind, path, cls, 0)
        for pname, param in params:
            handles.append(self.framework.on_param_grad(param, self._param_hook(grad_record, pname)))

    # -- hook bodies -----------------------------------------------------------------------------------------
    def _pre_hook(self, path, cls, params):
        session, kind = self.session, self.kind
        key = (kind, path)

        @guarded(f"forward pre-hook of {kind}.{path}")
        def pre_hook(module, args, kwargs):
            if not session.forward_on or get_ident() != session.thread:
                return None  # not collecting, or another thread (a data loader): not this run's calls
            n = session.next_index(key)
            name = module_record(kind, path, cls, FORWARD, n)
            stack = self.calls()
            stack.append(Call(name))  # first: the post-hook pops it even if the rest of this hook fails
            outer = stack[-2] if len(stack) > 1 else None
            stack[-1] = self.recorder.begin(
                name, module_record(kind, path, cls, BACKWARD, n), args, kwargs,
                outer.name if outer else None, outer.backward.name if outer and outer.backward else None, params)
            return None
        return pre_hook

    def _post_hook(self):
        @guarded("forward hook")
        def post_hook(module, args, kwargs, output):
            stack = self.calls()
            if not stack:
                return None
            call = stack.pop()
            if output is None and sys.exc_info()[0] is not None:
                return None  # the forward raised: no output to record
            self.recorder.end(call, output)
            return None
        return post_hook

    def _param_hook(self, record_name, pname):
        session, summarizer = self.session, self.summarizer

        @guarded(f"parameter-gradient hook of {record_name}")
        def on_grad(grad):
            if not session.step_open or grad is None:
                return
            record = session.records.get(record_name)
            if record is None:
                if not session.filter.wants(record_name):
                    return
                record = session.add(Record(record_name))
            if session.numbers:
                save_as = record_name if session.saves_tensors(record_name) else None
                record.data[pname] = [summarizer.summarize(grad, save_as=save_as, path=(pname,))]
            session.touch()
        return on_grad
