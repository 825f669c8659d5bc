"""PrecisionDebugger for PyTorch: `core.debugger.Debugger` with PyTorch's hooks, summaries and API capture."""
from __future__ import annotations

import torch

from ..core.debugger import Debugger
from . import api_capture
from .api_capture import ApiCapture
from .compiled import CompiledRegions
from .framework import TorchFramework
from . import summary
from .summary import TorchSummarizer


class PrecisionDebugger(Debugger):
    """`start(model)`, `stop()`, `step()` around each training step; `config.json` says what is dumped.

    Arguments other than `config_path` override the file's fields of the same name when not None.
    """

    framework = TorchFramework
    framework_packages = ("torch",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.compiled = CompiledRegions(self.apis)

    def start(self, model=None) -> None:
        """As `Debugger.start`; first, compiled and TorchScript modules in `model` are said once, and the API
        capture is kept off inside compiled ones, and inside `torch.compile` wrappers made outside the model
        (`model = torch.compile(net)`, then `start(model=net)`, or no model at L1): compiled.CompiledRegions."""
        if not self.session.finished:
            models = list(model) if isinstance(model, (list, tuple)) else [model] if model is not None else []
            self.compiled.scan([m for m in models if isinstance(m, torch.nn.Module)])
        super().start(model)
        self.compiled.began()

    def stop(self) -> None:
        self.compiled.ended(self.config.level)
        super().stop()

    forward_backward_dump_end = stop

    def step(self) -> None:
        try:
            super().step()  # may raise the user's own error once the step is written
        finally:
            if self.session.finished:
                self.compiled.remove()

    @staticmethod
    def current_rank():
        """The torch.distributed rank when a process group is initialised, else None (a single-process run)."""
        return _of_process_group("get_rank")

    @staticmethod
    def current_world_size():
        return _of_process_group("get_world_size")

    @staticmethod
    def c_routes() -> tuple:
        return (("value encoding (pytorch/_fast_encode.c)", summary.FastEncoder),
                ("the API capture's handler (pytorch/_fast_capture.c)", api_capture.FastHandler))

    def make_summarizer(self):
        return TorchSummarizer(self.session)

    def make_api_capture(self):
        return ApiCapture.make(self.session, self.recorder, self.summarizer, self.modules)


def _of_process_group(getter: str):
    """torch.distributed.<getter>() when a process group is initialised, else None."""
    dist = torch.distributed
    return getattr(dist, getter)() if dist.is_available() and dist.is_initialized() else None
