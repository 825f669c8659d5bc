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
from .native_dump import NativeDump
from .summary import MindSporeSummarizer

# each at most 160 characters with the log's prefix: docs/mindspore.md says the rest
GRAPH_MODE_MESSAGE = ("MindSpore is in GRAPH_MODE: nothing is captured (hooks cannot run in a graph); debug steps in "
                      "mindspore.PYNATIVE_MODE")
NATIVE_MESSAGE = "MindSpore is in GRAPH_MODE: its kernels are dumped by MindSpore's Dump into %s, converted at step()"
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

    def __init__(self, *args, native_dump=None, **kwargs):
        """`native_dump`: dump compiled code (GRAPH_MODE, `mindspore.jit`) through MindSpore's own Dump (see
        native_dump.py); None: when the context is in GRAPH_MODE at the debugger's creation."""
        self._native = None
        self._depth = _Depth()   # shared by the capture and the summarizer: "this is the debugger's call"
        self._warned = set()
        self._compiled_seen = jit.compiled.count  # cells compiled before this debugger are not its news
        self._torch_like = mindtorch.torch_namespace()   # MSAdapter / MindTorch scenario
        if self._torch_like is not None:
            self.framework = mindtorch.framework_for(self._torch_like)
        super().__init__(*args, **kwargs)
        if native_dump or (native_dump is None and graph_mode()):
            self._set_up_native()
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

    @guarded("PrecisionDebugger()")
    def _set_up_native(self) -> None:
        if self.config.task in ("statistics", "tensor") and self.config.level != "debug":
            self._native = NativeDump(self.config)
            if graph_mode():
                log.info(NATIVE_MESSAGE, self._native.root)
        else:
            log.warning("MindSpore's Dump of compiled code serves tasks statistics and tensor (not %s, level %s)",
                        self.config.task, self.config.level)

    def start(self, model=None) -> None:
        if self._native is not None and model is not None:
            self._native.model = model
        if graph_mode():
            if self._native is not None:
                return
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
        step, here = self.session.step, not self.session.finished and self.session.dumps_here()
        self._say_what_ran_compiled()
        super().step()
        if self._native is not None and here:
            self._convert(step)

    @guarded("step()")
    def _convert(self, step: int) -> None:
        self._native.convert(step, self.current_rank(), self.config.level)

    @guarded("stop()")
    def _say_what_ran_compiled(self) -> None:
        """Once: that hooked cells were compiled (the compiler noted it, see jit.py), or that a collected step
        saw no call at all, which is what a step run inside a compiled function looks like (at L1 nothing of
        the debugger's is compiled that could note it)."""
        if "compiled" in self._warned or self._native is not None:
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

