"""One recorded call, the same way for a module and for an API, in either framework: the forward record and
its backward record.

Why tensor hooks and not module backward hooks (`register_full_backward_hook` in PyTorch): full backward hooks wrap a module's inputs and
outputs in an identity autograd Function. That forbids in-place ops on them (`nn.ReLU(inplace=True)`,
`y.relu_()` on a module output: "Output 0 of BackwardHookFunction is a view and is being modified inplace")
and regroups gradient sums, which can change gradients bitwise. Tensor hooks change nothing in the graph:

- backward `input` (gradients w.r.t. the call's outputs): a hook on each output tensor;
- backward `output` (gradients w.r.t. the call's inputs): a hook on each input tensor, registered before the
  call runs, so an in-place change inside the call still reports the gradient of the value it received. It is
  d(loss)/d(input), the input's whole gradient, the same as `input.retain_grad()` would show.
"""
from __future__ import annotations

import sys
import weakref

from .naming import BACKWARD, FORWARD, api_record
from .records import Record
from .safety import report_failure
from .values import tensors_in


class Call:
    """A call in flight: its forward record (None when filtered out) and its backward collector.

    `save_as` is the record name when its tensors are also saved to files (task tensor, tensor_list). The
    backward collector exists once an input or an output can receive a gradient; until then `bwd_name`,
    `bwd_parent` and `n_in` (how many tensors the call received) say how to make it. `backward_name` is the
    backward record's name whether or not it is recorded: the backward parent of the calls made inside this
    one (a filter that leaves this call's backward out must not leave theirs without a parent)."""

    __slots__ = ("name", "record", "backward", "save_as", "bwd_name", "bwd_parent", "n_in", "backward_name")

    def __init__(self, name, record=None, backward=None, save_as=None):
        self.name = name
        self.record = record
        self.backward = backward
        self.save_as = save_as
        self.bwd_name = None  # set when gradients are recorded for this call
        self.backward_name = None


class BackwardCall:
    """Collects the gradients of one forward call as they arrive; the record appears with the first one.
    What the config fixes for the run (which parts, stacks) is the recorder's, decided once."""

    __slots__ = ("name", "recorder", "record", "n_in", "n_out", "parent", "save_as", "abandoned")

    def __init__(self, name, recorder, n_in, parent):
        self.name = name
        self.recorder = recorder
        self.record = None
        self.n_in = n_in
        self.n_out = 0
        self.parent = parent  # construct.json parent, written only if the record appears
        self.save_as = name if recorder.session.saves_tensors(name) else None
        # its forward call raised, or no output of it can get a gradient: gradients that reach its inputs
        # are not its
        self.abandoned = False

    def fill(self, key, index, grad) -> None:
        recorder = self.recorder
        session = recorder.session
        if not session.step_open or grad is None or self.abandoned:  # MindSpore may report no gradient as None
            return
        if self.record is None:
            data = {}
            if recorder.inputs:
                data["input"] = [None] * self.n_out
            if recorder.outputs:
                data["output"] = [None] * self.n_in
            self.record = session.add(Record(self.name, data))
            if recorder.parents:
                session.set_parent(self.name, self.parent)
        slots = self.record.data.get(key)
        if slots is not None and index < len(slots):
            slots[index] = recorder.summarizer.summarize(grad, save_as=self.save_as, path=(key, index))
            session.touch()


class _GradSlot:
    """The hook on one tensor: when its gradient arrives, fills each place the tensor holds, as (backward call,
    key, index). A tensor that is one call's output and the next call's input has two places and one hook:
    torch's `register_hook` is costly, and every hook is a Python call in backward.

    Every backward pass that reaches the tensor fills the places again: the last pass wins (the training
    loss's, after an `autograd.grad` made in the forward). But a call that takes the tensor as an input after
    a pass has reached it ends the places of the calls that took it as an input before (`restart`): they keep
    that pass's gradient. So with micro-batches accumulating gradients, each call that used a weight keeps
    its own micro-batch's gradient, while the call that made an activation still gets later passes'.

    One small object rather than a closure (a function and three cells): a step makes hundreds, alive until
    backward, and every object that outlives a young collection brings the next full one closer."""

    __slots__ = ("places", "tensor", "version", "fired")

    def __init__(self, place):
        self.places = [place]
        self.tensor = None   # weak reference to the hooked tensor, and its version when hooked
        self.version = None
        self.fired = False   # its gradient came since the places were started

    def restart(self, place) -> None:
        self.end(place[1])
        self.places.append(place)

    def end(self, key) -> None:
        """The places of `key` are done with: they keep the gradient that came."""
        self.places = [p for p in self.places if p[1] != key]
        self.fired = False

    def __call__(self, grad):  # the guard is inline: no decorator layer for every gradient
        self.fired = True
        for backward, key, index in self.places:
            try:
                backward.fill(key, index, grad)
            except Exception as exc:  # noqa: BLE001 - never break the user's backward
                report_failure(f"backward hook of {backward.name}", exc, site="backward hook")


class CallRecorder:
    """Begins and ends recorded calls; module hooks and the API capture both go through here.

    This runs for every captured call, so what the config fixes for the whole run (is anything filtered,
    which parts are dumped, are stacks kept) is decided once, here."""

    def __init__(self, session, summarizer, framework):
        self.framework = framework
        self.session = session
        self.summarizer = summarizer
        self.grad_handles = []   # tensor hooks of this step, removed when the step ends
        self._slots = {}         # id(tensor) -> its _GradSlot this step, while the tensor is unchanged
        flt, config = session.filter, session.config
        self.filtered = not flt.everything
        self.inputs = session.numbers and flt.wants_part("input")
        self.outputs = session.numbers and flt.wants_part("output")
        self.extra = config.extra_info
        # construct.json's parents: a module hierarchy exists at L0 and mix; at L1 the file is written empty
        self.parents = self.extra and config.level != "L1"
        # without tensor hooks (MindSpore 2.0) the module backward hook fills every backward call it reaches
        self._always_backward = not framework.tensor_hooks
        # bound once: each attribute lookup and wrapper call below is paid by every captured call
        self._encode_call = summarizer.encode_call
        self.recording_gradients = framework.recording_gradients
        self._is_tensor = framework.is_tensor
        self._may_get_grad = framework.may_get_grad
        self._version = summarizer.version
        self._seal = summarizer.seal
        self._quiet = summarizer.quiet

    def begin(self, name: str, bwd_name: str, args, kwargs, parent, bwd_parent, params=None) -> Call:
        session, filtered = self.session, self.filtered
        if filtered:
            session.filter.on_start(name)
        call = Call(name)
        call.backward_name = bwd_name
        if not filtered or session.filter.wants(name):
            call.record = record = Record(name)
            save_as = call.save_as = name if session.saving and session.saves_tensors(name) else None
            if self.inputs:
                data = record.data
                data["input_args"], data["input_kwargs"] = self._encode_call(args, kwargs, save_as)
                if params is not None:
                    data["parameters"] = {p: self.summarizer.summarize(t, save_as=save_as, path=("parameters", p))
                                          for p, t in params}
            if self.parents:
                session.construct[name] = parent  # session.set_parent, inline: this runs for every call
            if self.extra:
                session.stacks.file(name, sys._getframe())  # the debugger's own frames are not in stacks
        if self.recording_gradients():
            if not filtered or session.filter.wants(bwd_name):
                with self._quiet():  # reading tensors and hooking them is the debugger's, not the user's
                    self.gradients_before(call, bwd_name, bwd_parent, args, kwargs)
            elif self._slots:
                with self._quiet():
                    self._end_places(args, kwargs)
        return call

    # The gradient half of a call, for begin()/end() and for the C API handler (pytorch/_fast_capture.c).
    def gradients_before(self, call: Call, bwd_name: str, bwd_parent, args, kwargs) -> None:
        """Before the call runs, with gradients recorded: its inputs are hooked for its backward `output`."""
        inputs = self._inputs(args, kwargs)
        call.bwd_name, call.bwd_parent, call.n_in = bwd_name, bwd_parent, len(inputs)
        if self._always_backward or any(map(self._may_get_grad, inputs)):
            self._hook(self._backward(call), inputs, "output")

    def _end_places(self, args, kwargs) -> None:
        """A call whose backward a filter leaves out still takes its inputs: as when it is recorded, a tensor
        (a weight) that a backward pass reached since its hook's places were started ends the places of the
        calls that took it before (see _GradSlot). Otherwise, with micro-batches, a kept call of the first
        would get the gradient of the second, whose calls are filtered out."""
        for t in self._inputs(args, kwargs):
            slot = self._live_slot(t, self._version(t))
            if slot is not None and slot.fired:
                slot.end("output")

    def _inputs(self, args, kwargs) -> list:
        """The tensors a call takes, in the order of its backward record's `output`."""
        inputs = tensors_in(args, self._is_tensor, 1)
        if kwargs:
            inputs += tensors_in(kwargs, self._is_tensor, 1)
        return inputs

    def _live_slot(self, t, version):
        """The hook put on `t` this step, while `t` is unchanged since (the same version: the same autograd
        node), or None."""
        slot = self._slots.get(id(t))
        if slot is not None and version is not None and slot.version == version and slot.tensor() is t:
            return slot
        return None

    def gradients_after(self, call: Call, output) -> None:
        """After the call returned (`gradients_before` ran): its outputs are hooked for its backward `input`."""
        outputs = tensors_in(output, self._is_tensor)
        backward = call.backward
        if backward is None:
            if any(map(self._may_get_grad, outputs)):  # e.g. a factory with requires_grad=True
                self._hook(self._backward(call), outputs, "input")
        elif not self._hook(backward, outputs, "input") and outputs and not self._always_backward:
            # nothing flows into its backward (x > 0, x.detach()): no record. Not when no tensor was seen in
            # the output (a module's dataclass), nor without tensor hooks (MindSpore 2.0: never "may get")
            backward.abandoned = True

    def _hook(self, backward: BackwardCall, tensors, key: str) -> int:
        """Hooks `tensors` for `backward`: key `output` for the call's inputs, `input` for its outputs (the
        backward sees them reversed). A tensor hooked already this step, and not changed in place since
        (the same version: the same autograd node), gets a second place in its hook, not a second hook.
        Returns how many may get a gradient (are hooked)."""
        if key == "input":
            backward.n_out = len(tensors)
        framework, slots, version_of, may_get_grad = self.framework, self._slots, self._version, self._may_get_grad
        hooked = 0
        for i, t in enumerate(tensors):
            if not may_get_grad(t):
                continue
            hooked += 1
            version = version_of(t)
            slot = self._live_slot(t, version)
            if slot is not None:
                if slot.fired:   # a backward pass reached it since: the calls of this key are done
                    slot.restart((backward, key, i))
                else:
                    slot.places.append((backward, key, i))
                continue
            slot = _GradSlot((backward, key, i))
            self.grad_handles.append(framework.on_grad(t, slot))
            if version is not None:
                try:
                    slot.tensor = weakref.ref(t)
                except TypeError:  # a tensor type without weak references: one hook per place
                    continue
                slot.version = version
                slots[id(t)] = slot
        return hooked

    def _backward(self, call: Call) -> BackwardCall:
        backward = call.backward = BackwardCall(call.bwd_name, self, call.n_in, call.bwd_parent)
        return backward

    def end(self, call: Call, output, recorded_output=None) -> None:
        """`recorded_output` replaces `output` in the record (an in-place `x[i] = y` records x, not None)."""
        record = call.record
        if record is not None:
            if self.outputs:
                shown = output if recorded_output is None else recorded_output
                record.data["output"] = self.summarizer.encode_output(shown, call.save_as)
            session = self.session
            if not session.numbers or record.data:
                session.records[record.name] = record  # session.add, inline
                session.dirty = True
                # finished: out of the collector's lists (see Summarizer.seal). Nothing may put a value into
                # a forward record's lists from here on: an untracked list is not tracked again, so a cycle
                # through it would never be collected. (Backward and parameter-gradient records fill later:
                # they are never sealed.)
                if self._seal is not None:
                    self._seal(record)
        if call.bwd_name is not None:
            with self._quiet():
                self.gradients_after(call, output)
        if self.filtered:
            self.session.filter.on_end(call.name)

    def abandon(self, name: str, call: Call | None = None) -> None:
        """A call that raised (the user may catch it) leaves nothing but its used index: no parent in
        construct.json, no stack, no tensor files, and no backward record from gradients that later reach its
        inputs (hooked before it ran). (A module call's children, recorded before it raised, get the call
        around it as their parent: ModuleHooks.) `call` is None when it was begun without gradients (the C API
        handler)."""
        session = self.session
        session.construct.pop(name, None)
        session.stacks.unfile(name)
        if session.saving:
            session.abandon_files(name)
        backward = call.backward if call is not None else None
        if backward is not None:
            backward.abandoned = True

    def begin_api(self, key, args, kwargs, modules=None, parent=None) -> Call:
        """An API call, `key` = (prefix, api): records `{prefix}.{api}.{n}.forward` and `.backward`. Its
        parent is `parent` when given, else (mix level) the innermost module call of `modules`."""
        prefix, api = key[0], key[1]  # a third item marks an API of api_capture.UNVERSIONED_WRITES
        counters = self.session.counters  # session.next_index, inline
        n = counters.get(key, 0)
        counters[key] = n + 1
        stem = api_record(prefix, api, n, "")  # `{prefix}.{api}.{n}.`: both names from one format
        bwd_parent = None
        if parent is None and modules is not None:
            outer = modules.current()
            if outer is not None:
                parent = outer.name
                bwd_parent = outer.backward_name  # its name even when its backward is not recorded
        return self.begin(stem + FORWARD, stem + BACKWARD, args, kwargs, parent, bwd_parent)

    def end_api(self, call: Call, api: str, args, output) -> None:
        if api == "__setitem__" and args:
            self.end(call, args[0])  # x[i] = y: the output is x, changed (recorded, and hooked for its gradient)
        else:
            self.end(call, output)

    def end_step(self) -> None:
        self._slots.clear()
        for handle in self.grad_handles:
            handle.remove()
        self.grad_handles.clear()
