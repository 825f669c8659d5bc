"""acc_check of one rank: every API record replayed in float64 and judged, in the dump's order."""
from __future__ import annotations

import logging
import time

from ..compare.pair import is_module, split_name
from ..core.naming import PARAMS_GRAD, counterpart
from .judge import ERROR, SKIPPED, NotReplayable, judge_call

log = logging.getLogger("msprobe_lite")
VERDICTS = ("pass", "warning", "error", "skipped")


def replayer_for(dump):
    """The replayer of the dump's framework. Raises AccCheckError for a dump no replayer here reads."""
    from . import AccCheckError
    if dump.task != "tensor":
        raise AccCheckError(f"{dump.path}: task {dump.task!r}, expected \"tensor\" (only a tensor dump saves the "
                            f"inputs to replay)")
    if dump.framework in ("pytorch", ""):
        from ..pytorch.replay import TorchReplayer
        return TorchReplayer(dump)
    if dump.framework == "mindspore":
        try:
            from ..mindspore.replay import MindSporeReplayer
        except ImportError as exc:
            raise AccCheckError(f"{dump.path}: a MindSpore dump: its replay needs mindspore installed ({exc})") \
                from None
        return MindSporeReplayer(dump)
    raise AccCheckError(f"{dump.path}: \"framework\" is {dump.framework!r}: acc_check replays dumps of pytorch "
                        f"or mindspore")


def _kind(name: str) -> str:
    """`call` for an API record; what else the record is (module, parameter_gradient, other) otherwise."""
    if is_module(name):
        return "parameter_gradients" if f".{PARAMS_GRAD}." in name else "modules"
    return "call" if split_name(name)[1] in ("forward", "backward") else "other"


def check_rank(dump, replayer=None) -> dict:
    """{"calls": [...], "first_failure": ..., "counts": {verdict: n}, "not_calls": {kind: n}, "seconds": s}."""
    replayer = replayer or replayer_for(dump)
    calls, not_calls = [], {}
    first = None
    started = time.perf_counter()
    for name in dump.records:
        kind = _kind(name)
        if kind != "call":
            not_calls[kind] = not_calls.get(kind, 0) + 1
            continue
        try:
            verdict, reason, error = judge_call(replayer.replay(name))
        except NotReplayable as why:
            verdict, reason, error = SKIPPED, str(why), {}
        except Exception as exc:  # noqa: BLE001 - one call that fails to replay is that call's skip, not the run's
            log.debug("acc_check: %s", name, exc_info=True)
            verdict, reason, error = SKIPPED, f"the replay failed: {type(exc).__name__}: {str(exc)[:200]}", {}
        calls.append({"name": name, "verdict": verdict, "error": error, "reason": reason})
        if verdict == ERROR and first is None:
            first = {"name": name, "reason": reason, "stack": stack_of(dump, name)}
    counts = {v: sum(c["verdict"] == v for c in calls) for v in VERDICTS}
    return {"calls": calls, "first_failure": first, "counts": counts, "not_calls": not_calls,
            "seconds": time.perf_counter() - started}


def stack_of(dump, name: str) -> list:
    """The call's stack: its own, or (a backward record) its forward's."""
    return dump.stacks.get(name) or dump.stacks.get(counterpart(name)) or []
