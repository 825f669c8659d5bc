"""msprobe_lite: dump two training runs, compare them, and find the first call where the numbers part.

`msprobe_lite.PrecisionDebugger` picks the framework adapter (PyTorch or MindSpore) from the model given to
`start()`, or from the framework the script imported; `msprobe_lite.pytorch.PrecisionDebugger` and
`msprobe_lite.mindspore.PrecisionDebugger` name one directly. Framework packages are imported only when an
adapter is used.
"""
from __future__ import annotations

import os
import sys

from .core import exits as _exits  # noqa: F401 - SIGTERM watched from the import on the main thread, so that a
                                  # debugger made later in a helper thread is watched too

__version__ = "0.1.0"

FRAMEWORKS = ("pytorch", "mindspore")


def _framework_of(model) -> str | None:
    """"pytorch" for a torch.nn.Module, "mindspore" for a mindspore.nn.Cell (lists: their first item)."""
    if isinstance(model, (list, tuple)) and model:
        model = model[0]
    for cls in type(model).__mro__:
        if cls.__module__ == "torch.nn.modules.module" and cls.__name__ == "Module":
            return "pytorch"
        if cls.__module__ == "mindspore.nn.cell" and cls.__name__ == "Cell":
            return "mindspore"
    return None


def _imported_framework() -> str | None:
    """The one framework the script has imported, or None when it imported both or neither."""
    torch, mindspore = "torch" in sys.modules, "mindspore" in sys.modules
    if torch != mindspore:
        return "pytorch" if torch else "mindspore"
    return None


def _adapter(framework: str):
    if framework == "mindspore":
        from .mindspore import PrecisionDebugger as Adapter
    else:
        from .pytorch import PrecisionDebugger as Adapter
    return Adapter


class PrecisionDebugger:
    """The debugger of the framework in use. With only one of PyTorch and MindSpore imported, that one;
    with both, the one of the model passed to the first `start(model)` (`framework=` names it outright)."""

    def __new__(cls, config_path=None, task=None, dump_path=None, level=None, step=None, framework=None):
        if framework is not None and framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
        chosen = framework or _imported_framework()
        if chosen is None:
            return super().__new__(cls)  # decided at start(model)
        return _adapter(chosen)(config_path, task=task, dump_path=dump_path, level=level, step=step)

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None, framework=None):
        from .config import load_config

        config = load_config(config_path, task=task, dump_path=dump_path, level=level, step=step)  # errors now
        # the adapter is made later: fixed here, so that an os.chdir before start() moves neither the file nor the dump
        config_path = None if config_path is None else os.path.abspath(config_path)
        self._args = (config_path, task, config.dump_path, level, step)
        self._debugger = None

    def _chosen(self, model=None):
        if self._debugger is None:
            framework = _framework_of(model) or _imported_framework()
            if framework is None:  # both imported (neither: PyTorch's adapter says it is missing)
                framework = "pytorch"
                if "mindspore" in sys.modules:
                    from .core.safety import log
                    log.warning("PyTorch and MindSpore are both imported and start() got no model: dumping "
                                "PyTorch's calls. To dump MindSpore's, pass framework='mindspore' to "
                                "PrecisionDebugger (or the network to start())")
            config_path, task, dump_path, level, step = self._args
            self._debugger = _adapter(framework)(config_path, task=task, dump_path=dump_path, level=level,
                                                 step=step)
        return self._debugger

    def start(self, model=None) -> None:
        self._chosen(model).start(model)

    def __getattr__(self, name):  # stop, step, save, config, ... of the chosen adapter
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._chosen(), name)


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout=None) -> None:
    """Seed every framework the script has imported (and `random`, numpy, PYTHONHASHSEED). `rm_dropout=None`
    keeps each framework's own default (MindSpore removes dropout, PyTorch keeps it, as msprobe documents)."""
    chosen = {} if rm_dropout is None else {"rm_dropout": rm_dropout}
    seeded = False
    if "mindspore" in sys.modules:
        from .mindspore import seed_all as mindspore_seed_all

        mindspore_seed_all(seed, mode, **chosen)
        seeded = True
    if "torch" in sys.modules or not seeded:
        from .pytorch import seed_all as torch_seed_all

        torch_seed_all(seed, mode, **chosen)


def __getattr__(name):
    """`msprobe_lite.compare(...)` after a plain `import msprobe_lite`: the subpackage is loaded on first use
    (it imports no framework)."""
    if name == "compare":
        import importlib

        return importlib.import_module(__name__ + ".compare")
    raise AttributeError(f"module 'msprobe_lite' has no attribute {name!r}")


__all__ = ["PrecisionDebugger", "seed_all", "compare", "__version__"]
