"""`save()`, the single-point dump of level `debug`: a named value, and its gradient when it arrives.

Records are `{name}.{k}.debug` and `{name}_grad.{k}.debug` (k counts the saves of that name in the step),
written to debug.json. The gradient record mirrors the value's nesting, each tensor replaced by its gradient
(null where a tensor has none), and appears when the first gradient arrives.
"""
from __future__ import annotations

from .naming import debug_record
from .records import Record
from .safety import log, report_failure


def _grad_slots(value, holder, key, path, slots, framework) -> None:
    """Mirror `value` into holder[key] with None at every tensor; collect (holder, key, tensor, path)."""
    if framework.is_tensor(value):
        holder[key] = None
        if framework.may_get_grad(value):
            slots.append((holder, key, value, path))
    elif isinstance(value, (list, tuple)):
        holder[key] = items = [None] * len(value)
        for i, v in enumerate(value):
            _grad_slots(v, items, i, path + (i,), slots, framework)
    elif isinstance(value, dict):
        holder[key] = fields = {}
        for k, v in value.items():
            _grad_slots(v, fields, str(k), path + (str(k),), slots, framework)
    else:
        holder[key] = None


class DebugSaver:
    """Level `debug`: records what the user passes to `save()`, and its gradient."""

    def __init__(self, session, summarizer, recorder):
        self.session = session
        self.summarizer = summarizer
        self.recorder = recorder   # owns the per-step gradient hook handles
        self._said_outside = False  # a save() outside start() ... step() was said

    def save(self, variable, name: str, save_backward: bool = True) -> None:
        session = self.session
        if not session.step_open:
            if not self._said_outside and not session.finished and session.dumps_here():
                self._said_outside = True  # (a step or rank that is not dumped stays quiet)
                log.warning("save(%r) outside start() ... step(): not recorded; save() records from start() "
                            "until step() (said once)", name)
            return
        k = session.next_index(("debug", name))
        record_name = debug_record(name, k)
        save_as = record_name if session.saves_tensors(record_name) else None
        session.add(Record(record_name, self.summarizer.encode(variable, (), save_as)))
        if save_backward and self.recorder.framework.recording_gradients():
            self._watch_gradients(variable, debug_record(f"{name}_grad", k))

    def _watch_gradients(self, variable, record_name: str) -> None:
        root, slots = [None], []
        framework = self.recorder.framework
        _grad_slots(variable, root, 0, (), slots, framework)
        session, summarizer = self.session, self.summarizer
        save_as = record_name if session.saves_tensors(record_name) else None
        state = {"record": None}

        def hook_for(holder, key, path):
            def on_grad(grad):
                try:
                    if not session.step_open:
                        return
                    holder[key] = summarizer.summarize(grad, save_as=save_as, path=path)
                    if state["record"] is None:
                        state["record"] = session.add(Record(record_name))
                    state["record"].data = root[0]
                    session.touch()
                except Exception as exc:  # noqa: BLE001
                    report_failure(f"gradient of {record_name}", exc, site="save() gradient hook")
            return on_grad

        for holder, key, tensor, path in slots:
            self.recorder.grad_handles.append(framework.on_grad(tensor, hook_for(holder, key, path)))
