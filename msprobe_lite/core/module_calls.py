"""Module-level (L0) capture, for PyTorch modules and MindSpore cells alike: forward records, backward records
and parameter gradients.

Forward pre/post hooks on every submodule (inputs are summarised before the module runs, so in-place
modules show what they received); backward records through the tensor hooks of `calls.py`; parameter
gradients through the framework's parameter hook (PyTorch: after accumulation into `.grad`). The module
stack kept here (per thread) gives construct.json its parents and tells the API capture which module runs.
Both frameworks offer the same forward-hook signatures (`with_kwargs`, `always_call`).
"""
from __future__ import annotations

import functools
import sys
import threading
from threading import get_ident
import weakref

from .calls import Call
from .naming import BACKWARD, FORWARD, module_record, params_grad_record
from .records import Record
from .safety import guarded, log, report_failure


class ModuleHooks:
    """Hooks every submodule of the models given to `start()`, once; removed when the run finishes."""

    def __init__(self, session, summarizer, recorder, framework):
        self.session = session
        self.summarizer = summarizer
        self.recorder = recorder
        self.framework = framework
        self.kind = framework.module_kind
        # root model -> {path: (weak reference to the module hooked there, its hook handles)}
        self._hooked = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._awaiting = {}               # path -> backward calls waiting for the module backward hook

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
    def check(self, model) -> list:
        """The models of `start(model)` (one, or a list/tuple); TypeError, the user's to see, for anything
        else (a function, a loss object of another framework)."""
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        expected = self.framework.module_type
        for root in models:
            if not isinstance(root, expected):
                raise TypeError(f"start(model=...) expects a {expected.__module__}.{expected.__name__} or a "
                                f"list/tuple of them, got {type(root).__name__}")
        return models

    def attach(self, model) -> None:
        """Hooks the modules of each model, the first time it is given; later, only what changed in its tree
        (a module added, replaced, moved or compiled since: start() runs every step, and an edited model must
        not go unrecorded). The check walks the tree and compares module identities, without hooking anything."""
        models = self.check(model)
        for index, given in enumerate(models):
            root = self.framework.unwrap(given)
            prefix = f"{index}." if len(models) > 1 else ""
            tree = self._hooked.get(root)
            listed = self._listed(root, prefix)
            if tree is not None:
                if len(listed) != len(tree) or any(path not in tree or tree[path][0]() is not module
                                                   or tree[path][2] != state for path, module, state in listed):
                    self._rehook(root, tree, listed)
                continue
            if root is not given:
                log.info("start(model): recording the %s inside the %s: record names as without the wrapper, so "
                         "that a run with it and one without pair", type(root).__name__, type(given).__name__)
            tree = self._hooked[root] = {}
            self._hook_new(tree, listed)
            if not listed and not self.framework.opaque(root):
                log.warning("start(model): the %s has no modules inside it, and module records are of the modules "
                            "inside the model given (not of the model itself): it gives none. Pass the network "
                            "that holds it", type(root).__name__)

    def _listed(self, root, prefix: str) -> list:
        """(path, module, state) of the modules under `root`; state: (inside compiled code, compiled itself).
        Inside a compiled module (`opaque`) only parameter gradients are hooked: forward hooks would be
        compiled with it, and gradients are accumulated outside compiled code."""
        compiled = [prefix] if self.framework.opaque(root) else []
        listed = []
        for path, module in self.framework.submodules(root):
            if module is root:
                continue
            path = prefix + path
            inside = any(path.startswith(outer) for outer in compiled)
            opaque = self.framework.opaque(module)
            if opaque:
                compiled.append(path + ".")
            listed.append((path, module, (inside, opaque)))
        return listed

    def _rehook(self, root, tree: dict, listed: list) -> None:
        """Hooks removed from the modules no longer at their path (or compiled since), and the modules new
        there hooked."""
        now = {path: (module, state) for path, module, state in listed}
        gone = [path for path, (ref, _, state) in tree.items()
                if path not in now or now[path][0] is not ref() or now[path][1] != state]
        for path in gone:
            for handle in tree.pop(path)[1]:
                handle.remove()
        new = self._hook_new(tree, listed)
        log.info("start(model): the %s changed since it was hooked: %d modules newly hooked, %d unhooked",
                 type(root).__name__, len(new), len(gone))

    def _hook_new(self, tree: dict, listed: list) -> list:
        """Hooks the listed modules not in `tree` yet; returns their paths."""
        new = [(path, module, state) for path, module, state in listed if path not in tree]
        for path, module, state in new:
            handles = []
            tree[path] = (weakref.ref(module), handles, state)
            try:
                self._hook_module(module, path, handles, forward=not state[0])
            except Exception as exc:  # noqa: BLE001 - one odd module must not leave the rest unhooked
                report_failure(f"hooking {path}", exc, site="hooking a module")
        return new

    def detach(self) -> None:
        for tree in self._hooked.values():
            for _, handles, _ in tree.values():
                for handle in handles:
                    handle.remove()
        self._hooked = weakref.WeakKeyDictionary()

    def _hook_module(self, module, path: str, handles: list, forward: bool = True) -> None:
        cls = self.framework.class_name(module)
        params = self.framework.own_parameters(module)
        if forward:
            handles.extend(self.framework.hook_forward(module, self._pre_hook(path, cls, params),
                                                       self._post_hook(path, cls)))
        if forward and not self.framework.tensor_hooks:
            handle = self.framework.hook_backward(module, self._backward_hook(path))
            if handle is not None:
                handles.append(handle)
        grad_record = params_grad_record(self.kind, path, cls, 0)
        for pname, param in params:
            handles.append(self.framework.on_param_grad(param, self._param_hook(grad_record, pname)))

    # -- hook bodies -----------------------------------------------------------------------------------------
    def _pre_hook(self, path, cls, params):
        session, kind, quiet = self.session, self.kind, self.summarizer.quiet
        key, in_backward = (kind, path), self.framework.in_backward

        @guarded(f"forward pre-hook of {kind}.{path}")
        def pre_hook(module, args, kwargs):
            if not session.forward_on or get_ident() != session.thread or in_backward():
                return None  # not collecting, another thread (a data loader), or a recomputation in backward
            n = session.next_index(key)
            name = module_record(kind, path, cls, FORWARD, n)
            stack = self.calls()
            stack.append(Call(name))  # first: the post-hook pops it even if the rest of this hook fails
            outer = stack[-2] if len(stack) > 1 else None
            with quiet():  # the hook's own tensor reads are not API calls (and skip the API capture's dispatch)
                stack[-1] = self.recorder.begin(
                    name, module_record(kind, path, cls, BACKWARD, n), args, kwargs,
                    outer.name if outer else None, outer.backward_name if outer else None, params)
            return None
        return pre_hook

    def _post_hook(self, path, cls):
        awaiting, quiet, in_backward = self._awaiting, self.summarizer.quiet, self.framework.in_backward
        # the names its pre-hook gives: a call begun by another module's pre-hook is not this one's to end
        # (a user's pre-hook that raised before this module's ran, or one skipped, still runs this always-call hook)
        own = module_record(self.kind, path, cls, FORWARD, "")

        @guarded("forward hook")
        def post_hook(module, args, kwargs, output):
            stack = self.calls()
            if not stack or in_backward() or not stack[-1].name.startswith(own):
                # the pre-hook began no call (in the backward pass, or it did not run)
                return None
            call = stack.pop()
            if output is None and sys.exc_info()[0] is not None:  # the forward raised: no output to record
                self._abandon(call, stack)
                return None
            with quiet():
                self.recorder.end(call, output)
            if call.backward is not None and not self.framework.tensor_hooks:
                awaiting.setdefault(path, []).append(call.backward)
            return None
        return post_hook

    def _abandon(self, call, stack) -> None:
        """`call` raised: no record; the calls it made before it raised name it as their parent, and get the
        call around it (the top of `stack`) instead."""
        self.recorder.abandon(call.name, call)
        if self.recorder.parents and call.backward_name is not None:
            outer = stack[-1] if stack else None
            self.session.stand_ins[call.name] = outer.name if outer else None
            self.session.stand_ins[call.backward_name] = outer.backward_name if outer else None

    def abandon_open(self) -> None:
        """At start() and stop() no module call runs on this thread: one still listed was ended by an exception
        that runs no always-call hook (a KeyboardInterrupt in forward). It raised, and is abandoned as a call
        that raised an Exception is, so that later calls do not take it for their parent."""
        stack = self.calls()
        while stack:
            self._abandon(stack.pop(), stack)

    def _backward_hook(self, path):
        """Without tensor hooks, a module's backward hook reports each backward call; calls of one module
        run backward in reverse order, so the latest forward call still waiting is the one."""
        awaiting = self._awaiting

        @guarded(f"backward hook of {self.kind}.{path}")
        def backward_hook(grads_wrt_outputs, grads_wrt_inputs):
            waiting = awaiting.get(path)
            if not waiting:
                return
            call = waiting.pop()
            call.n_out = len(grads_wrt_outputs)
            for i, grad in enumerate(grads_wrt_outputs):
                call.fill("input", i, grad)
            for i, grad in enumerate(grads_wrt_inputs):
                call.fill("output", i, grad)
        return backward_hook

    def end_step(self) -> None:
        """Backward calls that never came (a forward without backward) are not carried into the next step."""
        self._awaiting.clear()

    def _param_hook(self, record_name, pname):
        session, summarizer = self.session, self.summarizer

        def fill(record, grad) -> None:
            if session.numbers:
                save_as = record_name if session.saves_tensors(record_name) else None
                record.data[pname] = [summarizer.summarize(grad, save_as=save_as, path=(pname,))]
            session.touch()

        @guarded(f"parameter-gradient hook of {record_name}")
        def on_grad(grad):
            """The gradient as accumulated, into the record (made now: its place in execution order). Returns
            `again`, bound to this record, for an adapter that reads `.grad` once more when the backward pass
            ends (`on_param_grad`); None when nothing was recorded."""
            if not session.step_open or grad is None:
                return None
            record = session.records.get(record_name)
            if record is None:
                if not session.filter.wants(record_name):
                    return None
                record = session.add(Record(record_name))
            fill(record, grad)
            return functools.partial(again, record, grad, summarizer.version(grad))

        @guarded(f"parameter-gradient hook of {record_name}")
        def again(record, first, version, grad) -> None:
            """`.grad` when the backward pass ends (DistributedDataParallel has written the average over ranks
            by then), into the same step's record, when it is another tensor or changed since. A hook of the
            user's that freed it (an optimizer step in backward) leaves the value as accumulated."""
            if grad is None or not session.step_open or session.records.get(record_name) is not record:
                return
            if grad is first and summarizer.version(grad) == version:
                return
            fill(record, grad)
        return on_grad
