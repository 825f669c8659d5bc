"""PrecisionDebugger for MindSpore (PyNative mode): `core.debugger.Debugger` with cell hooks, MindSpore
summaries and the wrapping API capture.

Graph mode compiles the network: Python hooks and wrappers do not run inside a compiled graph. The
debugger says so once, loudly, and collects what still runs in Python; it never fails the training.
"""
from __future__ import annotations

import mindspore as ms

from ..core.debugger import Debugger
from ..core.safety import log
from . import mindtorch
from .api_capture import ApiCapture, Quiet, _Depth
from .framework import MindSporeFramework, is_jit
from .summary import MindSporeSummarizer

GRAPH_MODE_MESSAGE = (
    "MindSpore is in GRAPH_MODE: the network is compiled, and MindSpore would compile Python hooks into the "
    "graph (and fail), so nothing is captured while it is: no hook or wrapper is installed and training runs "
    "as without the debugger. For a call-by-call dump, run the steps to debug with "
    "mindspore.set_context(mode=mindspore.PYNATIVE_MODE).")
JIT_MESSAGE = (
    "%s runs under mindspore.jit: what happens inside it is compiled and is not captured call by call "
    "(neither its sub-cells nor its APIs); its own forward and backward records are, at L0 and mix.")


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

    def _warn_jit(self, model) -> None:
        cells = model if isinstance(model, (list, tuple)) else [model]
        for root in cells:
            if not isinstance(root, ms.nn.Cell):
                continue
            for path, cell in root.cells_and_names():
                if is_jit(cell) and path not in self._warned:
                    self._warned.add(path)
                    log.warning(JIT_MESSAGE, f"cell {path or type(cell).__name__!r}")

