"""PrecisionDebugger for MindSpore (PyNative mode): `core.debugger.Debugger` with cell hooks, MindSpore
summaries and the wrapping API capture.

Graph mode compiles the network: Python hooks and wrappers do not run inside a compiled graph. The
debugger says so once, loudly, and collects what still runs in Python; it never fails the training.
"""
from __future__ import annotations

import mindspore as ms

from ..core.debugger import Debugger
from ..core.safety import guarded, log
from . import jit, mindtorch
from .api_capture import ApiCapture, Quiet, _Depth
from .framework import MindSporeFramework, is_jit
from .summary import MindSporeSummarizer

# each at most 160 characters with the log's prefix: docs/mindspore.md says the rest
GRAPH_MODE_MESSAGE = ("MindSpore is in GRAPH_MODE: nothing is captured (hooks cannot run in a graph); debug steps in "
                      "mindspore.PYNATIVE_MODE")
JIT_MESSAGE = "%s runs under mindspore.jit: its own forward and backward are recorded (L0, mix), not its sub-cells or APIs"
# step N: what was seen (the same words at every level): ...
COMPILED_MESSAGE = "step %d: %s: mindspore.jit code runs as a graph, where the debugger sees nothing; MS_JIT=0 records it"


def graph_mode() -> bool:
    return ms.get_context("mode") == ms.GRAPH_MODE


class PrecisionDebugger(Debugger):
    """`start(model)`, `stop()`, `step()` around each training step; `config.json` says what is dumped.

    Arguments other than `config_path` override the file's fields of the same name when not None.
    """

    framework = MindSporeFramework
    framework_packages = ("mindspore",)

    def __init__(self, *args, **kwargs):
        self._depth = _Depth()   # shared by the capture and the summarizer: "this is the debugger's call"
        self._warned = set()
        self._compiled_seen = jit.compiled.count  # cells compiled before this debugger are not its news
        self._torch_like = mindtorch.torch_namespace()   # MSAdapter / MindTorch scenario
        if self._torch_like is not None:
            self.framework = mindtorch.framework_for(self._torch_like)
        super().__init__(*args, **kwargs)
        if self._torch_like is not None:
            log.info("MSAdapter scenario (%s): PyTorch names, framework 'mindtorch'", self._torch_like.__name__)

    @staticmethod
    def current_rank():
        """The rank in MindSpore's communication group once `init()` ran, else None."""
        from mindspore.communication import GlobalComm, get_rank

        return get_rank() if GlobalComm.INITED else None

    @staticmethod
    def current_world_size():
        from mindspore.communication import GlobalComm, get_group_size

        return get_group_size() if GlobalComm.INITED else None

    def make_summarizer(self):
        return MindSporeSummarizer(self.session, Quiet(self._depth))

    def make_api_capture(self):
        entries = mindtorch.api_entries(self._torch_like) if self._torch_like is not None else None
        return ApiCapture(self.session, self.recorder, self.modules, self._depth, entries)

    def start(self, model=None) -> None:
        if graph_mode():
            if "graph" not in self._warned:
                self._warned.add("graph")
                log.warning(GRAPH_MODE_MESSAGE)
            return
        self._warn_jit(model)
        super().start(model)

    def stop(self) -> None:
        self._say_what_ran_compiled()
        super().stop()

    forward_backward_dump_end = stop

    def step(self) -> None:
        self._say_what_ran_compiled()
        super().step()

    @guarded("stop()")
    def _say_what_ran_compiled(self) -> None:
        """Once: that hooked cells were compiled (the compiler noted it, see jit.py), or that a collected step
        saw no call at all, which is what a step run inside a compiled function looks like (at L1 nothing of
        the debugger's is compiled that could note it)."""
        if "compiled" in self._warned:
            return
        session = self.session
        if jit.compiled.count > self._compiled_seen:
            what = f"the {jit.compiled.latest} cells were compiled"
        elif session.step_open and not session.counters and not session.records and self.config.level != "debug":
            what = "no call was recorded"
        else:
            return
        self._warned.add("compiled")
        log.warning(COMPILED_MESSAGE, session.step, what)

    def _warn_jit(self, model) -> None:
        cells = model if isinstance(model, (list, tuple)) else [model]
        for root in cells:
            if not isinstance(root, ms.nn.Cell):
                continue
            for path, cell in root.cells_and_names():
                if is_jit(cell) and path not in self._warned:
                    self._warned.add(path)
                    log.warning(JIT_MESSAGE, f"cell {path or type(cell).__name__!r}")

