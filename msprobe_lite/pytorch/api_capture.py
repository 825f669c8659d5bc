"""API-level (L1) capture for PyTorch, without patching torch.

A `TorchFunctionMode` sees every call of torch.*, torch.Tensor methods and operators and
torch.nn.functional, whatever name it was imported under (`from torch import tanh` included), and replaces
no attribute: identity and isinstance checks in user code behave as without the debugger. The mode is pushed
at `start()` and popped at `stop()`, so outside collection PyTorch runs untouched.

Inside `__torch_function__` PyTorch disables the mode for the duration of the call, so an API called inside
another captured API is neither a record nor counted: only outermost calls are. Which functions count as
APIs comes from `apis.yaml` (identity lookup, one dict probe per call).

When the C handler is built (`_fast_capture.c`), it is a base class of the mode and its `__torch_function__`
runs first: calls that only pass through never reach Python, and captured calls are recorded there, their
gradient hooks too (what `CallRecorder.gradients_before`/`gradients_after` do, for tensors in plain
containers), with the record filter asked by name as the Python route asks it, unless tensors are saved to
files; those runs come to the Python method below, which covers all cases. The debugger's reads of tensors
are never dispatched to a torch-function mode or tensor subclass of the user's.

A few functions make an alias through which a tensor's memory can be written without its version counter
moving (`.data`, `.numpy()`, `__array__`, `__dlpack__`, its storage), rebind its memory (`t.data = x`), or
make a tensor over an array's memory (`torch.as_tensor`, `torch.asarray`). They are not records: the mode
hands their tensors and result to `Summarizer.taint`, so that no summary of memory in those storages comes
from the step's cache afterwards (see core/summary.py). `torch.from_numpy`, `torch.frombuffer` and
`torch.utils.dlpack`'s functions take no tensor and never reach a mode: they are not seen.

torch.distributed's collectives do not go through `__torch_function__`; they are wrapped while collecting
and restored at `stop()` (so `from torch.distributed import all_reduce` made before `start()` is not seen).
Their `output` holds their tensor arguments after the operation (for `async_op=True`, once the work is done).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from threading import get_ident
from weakref import WeakSet

import torch
import torch.nn.functional as F
import yaml
from torch.overrides import TorchFunctionMode

from ..core.calls import BackwardCall, Call, _GradSlot
from ..core.records import Record
from ..core.safety import guarded, log, report_failure
from ..core.seed import ORIGINAL
from ..core.values import MAX_DEPTH, tensor_leaves
from .framework import _KEYS, PLAIN_TENSORS, TorchFramework, _HookHandle
from ..core import native

try:  # the C side of __torch_function__; optional like the other C routes
    native.require("_fast_capture")
    from ._fast_capture import Handler as FastHandler
except ImportError:  # built without a C compiler
    FastHandler = None

API_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "apis.yaml")
# Later sections win when two names are the same object (F.conv2d is torch.conv2d): the most specific name.
SECTIONS = (("tensor", "Tensor", torch.Tensor), ("torch", "Torch", torch), ("functional", "Functional", F))
OPTIMIZER = "optimizer"
# APIs that write some of their tensor arguments without moving their version counters: in training,
# batch_norm updates its running statistics in place and their `_version` stays, so the step's summary cache
# would show a later call the statistics as they were before. Their entries carry a third item; such calls take
# the Python route, which forgets their arguments' summaries after the call (forgets, not taints: a ResNet has
# more BatchNorm layers than the taint list holds storages).
UNVERSIONED_WRITES = {("Functional", "batch_norm"), *(("Torch", name) for name in (
    "batch_norm", "native_batch_norm", "_native_batch_norm_legit", "batch_norm_update_stats",
    "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts", "cudnn_batch_norm", "miopen_batch_norm"))}
FORGETS = "forgets its arguments' summaries"
# Collectives that must stay torch's own objects: `P2POp(op, ...)` checks by identity that `op` is
# torch.distributed's isend or irecv, so a wrapper in their place breaks the user's batched exchanges.
# (`batch_isend_irecv` itself is captured.)
UNWRAPPABLE = {name: "torch.distributed.P2POp accepts only torch's own function" for name in ("isend", "irecv")}
_said_unwrappable: set = set()
# The functions that make a version-free alias of a tensor's memory or rebind it (see the module's docstring):
# `.data` reaches the mode as its getter's and setter's method-wrappers, equal to these
ALIASES = {name: func for name, func in (
    ("Tensor.data", torch.Tensor.data.__get__), ("Tensor.data (set)", torch.Tensor.data.__set__),
    *((f"Tensor.{name}", getattr(torch.Tensor, name, None))
      for name in ("numpy", "__array__", "__dlpack__", "untyped_storage", "storage")),
    # their result may be an array's own memory
    *((f"Torch.{name}", getattr(torch, name, None)) for name in ("as_tensor", "asarray")))
    if func is not None}


def load_api_list(path: str = API_LIST):
    """(table {function: (prefix, name)}, [distributed names]) from an API list YAML (parsed once)."""
    if path not in _TABLES:
        _TABLES[path] = _read_api_list(path)
    return _TABLES[path]


_TABLES: dict = {}  # API list path -> load_api_list's answer


def _read_api_list(path: str):
    with open(path, encoding="utf-8") as f:
        spec = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    known = {s for s, _, _ in SECTIONS} | {"distributed"}
    if not isinstance(spec, dict) or set(spec) - known:
        raise ValueError(f"{path}: expected a mapping with sections {sorted(known)}, "
                         f"got {sorted(spec) if isinstance(spec, dict) else type(spec).__name__}")
    table, missing = {}, []
    for section, prefix, namespace in SECTIONS:
        for name in spec.get(section) or []:
            func = getattr(namespace, str(name), None)
            if callable(func):
                table[func] = (prefix, str(name))
                # seed_all's dropout removal in place: the calls reach the mode as the function it replaced
                # once that is put back (NetDifferenceFinder removes dropout for its run only)
                if callable(getattr(func, ORIGINAL, None)):
                    table[getattr(func, ORIGINAL)] = (prefix, str(name))
            else:
                missing.append(f"{section}.{name}")
    if missing:
        log.warning("%s: %d names are not in this PyTorch and are not captured: %s", path, len(missing),
                    ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else ""))
    return table, tuple(str(n) for n in spec.get("distributed") or [])


_LIVE: WeakSet = WeakSet()  # every ApiCapture made: see_through updates their tables


def see_through(replaced) -> None:
    """Functions put in place of captured ones after the API list was read (seed_all's dropout removal, called
    after a debugger was made): their calls reach the capture as the new function, recorded as the old one.
    `replaced`: (namespace, name, new function, old function) as core.seed.replace_function lists them."""
    for capture_table in [*(table for table, _ in _TABLES.values()), *(capture.table for capture in list(_LIVE))]:
        for _, _, new, old in replaced:
            if old is not None and old in capture_table:
                capture_table[new] = capture_table[old]


class ApiCapture(TorchFunctionMode):
    """Records outermost API calls while pushed; `modules` (mix level) gives each call its parent module.

    `ApiCapture.make` adds the C handler in front when it is built; the class itself is the Python route."""

    @classmethod
    def make(cls, session, recorder, summarizer, modules=None, api_list: str = API_LIST):
        if FastHandler is None:
            return cls(session, recorder, summarizer, modules, api_list)
        capture = _WithFastHandler(session, recorder, summarizer, modules, api_list)
        encode = summarizer.fast_encode
        stacks = session.stacks
        if recorder.filtered:  # scope, list or a direction left out: the C route asks the filter by name
            flt = session.filter
            capture.bind_filter(flt.on_start, flt.wants, flt.on_end, recorder._end_places, recorder._slots)
        capture.bind(capture.table, session, encode, summarizer.seal, Record, recorder.recording_gradients,
                     stacks.file_known if recorder.extra else None, stacks.file_new if recorder.extra else None,
                     summarizer.quiet, report_failure, ApiCapture.__torch_function__,
                     Call, recorder.gradients_before, recorder.gradients_after, recorder.abandon,
                     modules.current if modules is not None else None,
                     # the C route records what CallRecorder records when no saved tensor is in play and the
                     # C value encoder is built
                     encode is not None and not session.saving,
                     modules is not None, recorder.inputs, recorder.outputs, session.numbers)
        mode_count = getattr(torch._C, "_len_torch_function_stack", None)
        if encode is not None and mode_count is not None:
            capture.bind_quiet(encode.bare, mode_count)  # no quiet while no other torch-function mode is active
        if recorder.framework.tensor_hooks:
            # CallRecorder's gradient half (gradients_before/after, _hook, on_grad) in C too, for plain
            # tensors in plain containers; anything else still goes through those methods
            # (False when a class's slots no longer match the C tables: the Python route then; tested)
            capture.grads_in_c = capture.bind_gradients(
                Call, BackwardCall, _GradSlot, _HookHandle, recorder._slots, recorder.grad_handles, recorder,
                torch.Tensor, PLAIN_TENSORS, OrderedDict, _KEYS, TorchFramework.on_grad, MAX_DEPTH)
        return capture

    def __init__(self, session, recorder, summarizer, modules=None, api_list: str = API_LIST):
        super().__init__()
        _LIVE.add(self)
        self.session = session
        self.recorder = recorder
        self.summarizer = summarizer
        self.modules = modules
        table, self.distributed = load_api_list(api_list)
        self.table = dict(table)  # the parsed list is shared by every debugger of the process
        for func, entry in table.items():
            if entry in UNVERSIONED_WRITES:
                self.table[func] = (*entry, FORGETS)
        for name, func in ALIASES.items():
            if func in self.table:
                log.warning("%s is in the API list but is not captured: it makes an alias of a tensor's memory, "
                            "which the debugger watches instead", name)
            self.table[func] = summarizer.taint  # not a (prefix, name) entry: see __torch_function__
        self.in_optimizer = False
        self.active = False
        self._patched = {}
        self._optimizer_hooks = []
        if modules is not None:
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
            self._optimizer_hooks = [register_optimizer_step_pre_hook(self._enter_optimizer),
                                     register_optimizer_step_post_hook(self._leave_optimizer)]

    # -- switching on and off ------------------------------------------------------------------------------
    def activate(self) -> None:
        if self.active:
            return
        self.__enter__()
        self.active = True
        self.in_optimizer = False
        self._wrap_distributed()

    def deactivate(self) -> None:
        if not self.active:
            return
        self.active = False
        self._unwrap_distributed()
        self.__exit__(None, None, None)

    def suspend(self) -> bool:
        """Off for the call of a compiled module (compiled.CompiledRegions): dynamo would trace the mode, which it
        cannot, and run the module eagerly. True when it was switched off (then `activate()` after the call);
        False in another thread or when a mode of the user's sits above it (popping would take theirs)."""
        if not self.active or get_ident() != self.session.thread:
            return False
        depth = torch._C._len_torch_function_stack()
        if not depth or torch._C._get_function_stack_at(depth - 1) is not self:
            return False
        self.deactivate()
        return True

    def remove(self) -> None:
        """For good: also the optimizer hooks."""
        self.deactivate()
        for handle in self._optimizer_hooks:
            handle.remove()
        self._optimizer_hooks = []

    def _enter_optimizer(self, *_):
        self.in_optimizer = True

    def _leave_optimizer(self, *_):
        self.in_optimizer = False

    # -- interception ----------------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        """Runs for every torch call while collecting, attribute reads of tensors included: one dict probe
        decides. The debugger's own failures are reported and swallowed here, inline: a decorator would add
        two calls, and two frames to every stack walk, for each captured call."""
        if kwargs is None:
            kwargs = {}
        entry = self.table.get(func)
        if entry is None:
            return func(*args, **kwargs)
        if entry.__class__ is not tuple:  # an alias is made: the call, then Summarizer.taint (guarded)
            out = func(*args, **kwargs)
            entry(args, out)
            return out
        if not self.session.forward_on:
            return func(*args, **kwargs)
        try:
            call = self._open(entry, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - never break the user's call
            report_failure("API capture", exc, site="ApiCapture._begin")
            call = None
        try:
            out = func(*args, **kwargs)
        except BaseException:
            if call is not None:
                self._abandon(call)
            raise
        if call is not None:
            try:
                self.recorder.end_api(call, entry[1], args, out)
            except Exception as exc:  # noqa: BLE001
                report_failure("API capture", exc, site="ApiCapture._end")
        if len(entry) == 3:  # UNVERSIONED_WRITES
            self._forget_arguments(args, kwargs)
        return out

    @guarded("API capture")
    def _forget_arguments(self, args, kwargs) -> None:
        self.summarizer.forget(tensor_leaves((args, kwargs), TorchFramework.is_tensor))

    @guarded("API capture")
    def _begin(self, entry, args, kwargs):
        if not self.session.forward_on:
            return None
        return self._open(entry, args, kwargs)

    @guarded("API capture")
    def _abandon(self, call) -> None:
        self.recorder.abandon(call.name, call)

    def _open(self, entry, args, kwargs):
        parent = None
        if self.modules is not None and self.in_optimizer:
            parent = OPTIMIZER
            self.session.set_parent(OPTIMIZER, None)
        return self.recorder.begin_api(entry, args, kwargs, self.modules, parent)

    # -- torch.distributed -------------------------------------------------------------------------------
    def _wrap_distributed(self) -> None:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        for name in self.distributed:
            if name in UNWRAPPABLE:
                if name not in _said_unwrappable:
                    _said_unwrappable.add(name)
                    log.warning("torch.distributed.%s is in the API list but is not captured: %s", name,
                                UNWRAPPABLE[name])
                continue
            original = getattr(dist, name, None)
            if callable(original):
                self._patched[name] = original
                setattr(dist, name, self._collective(name, original))

    def _unwrap_distributed(self) -> None:
        for name, original in self._patched.items():
            setattr(torch.distributed, name, original)
        self._patched = {}

    def _collective(self, name, original):
        entry = ("Distributed", name)

        def collective(*args, **kwargs):
            # the wrapper is global, the capture is the collecting thread's (as the mode's stack is)
            call = self._begin(entry, args, kwargs) if get_ident() == self.session.thread else None
            with torch._C.DisableTorchFunction():  # its internals are not API calls of the user's
                result = original(*args, **kwargs)
            if call is not None:
                self._after_collective(call, args, kwargs, result)
            return result
        collective.__wrapped__ = original
        return collective

    @guarded("distributed capture")
    def _after_collective(self, call, args, kwargs, result) -> None:
        """The record's output: the tensor arguments after the operation, once it is complete. Completion of
        an async op may come on the backend's thread and after the step ended: then nothing is recorded,
        and within the step the session's lock keeps it from racing a flush."""
        session, step = self.session, self.session.step

        def finish(_=None):
            with session._lock:
                if session.step != step or not session.step_open:
                    return
                self._forget_arguments(args, kwargs)  # changed in place
                # the buffers after the operation: the arguments that hold tensors, positional ones first
                # (all_reduce(t, op=...), all_reduce(tensor=t), gather(t, gather_list=g)); `op` and `group`
                # are input arguments only (recorded as outputs too, a changed op read "differs by inf")
                buffers = [v for v in (*args, *kwargs.values())
                           if next(tensor_leaves(v, TorchFramework.is_tensor), None) is not None]
                self.recorder.end(call, None, recorded_output=buffers)

        future = getattr(result, "get_future", None)
        if callable(future):
            future().then(guarded("distributed capture")(finish))
        else:
            finish()


if FastHandler is not None:
    class _WithFastHandler(FastHandler, ApiCapture):
        """ApiCapture with the C `__torch_function__` first (see the module): made by `ApiCapture.make`."""

        def deactivate(self) -> None:
            super().deactivate()
            self.release()  # the bound __torch_function__ kept for PyTorch's lookups refers to the mode
