"""Compiled MindSpore (GRAPH_MODE, `mindspore.jit`) dumped through MindSpore's own Dump (seed 002).

Hooks do not run in a compiled graph; MindSpore's kernel Dump does. The debugger writes the native config from
config.json into `{dump_path}/native_dump.json`, names it in `MINDSPORE_DUMP_CONFIG`, and has MindSpore write
under `{dump_path}/native/`. At each `step()` it converts the kernels written since the last one into
`step{N}/rank{R}/dump.json` (plus construct.json and stack.json), with `core.mindspore_dump`.

MindSpore reads MINDSPORE_DUMP_CONFIG once per process, at the first graph compile (tested with 2.10, CPU): set
after it, nothing is dumped; the config's file changed after it, the first one still holds. So the debugger
must be created before the first call of a GRAPH_MODE cell or a jit function (after `import mindspore` is
fine). A MINDSPORE_DUMP_CONFIG the user set already is kept, and converted from.
"""
from __future__ import annotations

import json
import os

import mindspore as ms
import numpy as np

from ..core import mindspore_dump as native_read
from ..core import writer
from ..core.safety import log

ENV = "MINDSPORE_DUMP_CONFIG"
CONFIG_FILE = "native_dump.json"
NATIVE_FOLDER = "native"
NET_NAME = "Net"
NOTHING_WRITTEN = ("step %d: MindSpore's Dump wrote nothing: create the PrecisionDebugger before the first graph "
                   "compile (MINDSPORE_DUMP_CONFIG is read once, then)")


def iteration_text(steps) -> str:
    """config `step` -> Dump `iteration`: "all", or "0|3-5"."""
    if steps.everything:
        return "all"
    return "|".join(str(a) if a == b else f"{a}-{b}" for a, b in steps.spans)


def kernels_of(selection) -> list:
    """config `list`/`scope` entries -> Dump `kernels`: a cell record's path -> a regex of the kernels in its
    scope (`Cell.conv.Conv2d.forward.0` -> kernels under `conv-Conv2d/`); an entry without a dot -> an op type
    (MindSpore matches it in kernel names, case-insensitive). Others have no kernel to name."""
    out = []
    for entry in list(selection.list) + list(selection.scope):
        parts = entry.split(".")
        if parts[0] == "Cell" and len(parts) >= 3:
            path = parts[1:-1] if parts[-1] in ("forward", "backward") or parts[-1].isdigit() else parts[1:]
            while path and (path[-1] in ("forward", "backward") or path[-1].isdigit()):
                path = path[:-1]
            cells, cls = path[:-1], path[-1] if path else ""
            if cells:
                out.append("name-regex(.*" + "/".join(f"{c}-[^/]+" for c in cells[:-1]) +
                           ("/" if len(cells) > 1 else "") + f"{cells[-1]}-{cls}/.*)")
        elif "." not in entry:
            out.append(entry)
    return out


def native_config(config, device: str) -> dict:
    """The Dump config for config.json: statistics -> "statistic" on GPU/Ascend, "tensor" on the CPU (which
    refuses "statistic" and "full"; the statistics are then computed from the tensors)."""
    sel = config.selection
    kernels = kernels_of(sel)
    saved = "tensor" if config.task == "tensor" or device == "CPU" else "statistic"
    parts = sel.parts
    input_output = 0 if len(parts) != 1 else (1 if "input" in parts else 2)
    return {"common_dump_settings": {
        "dump_mode": 1 if kernels else 0, "path": os.path.abspath(os.path.join(config.dump_path, NATIVE_FOLDER)),
        "net_name": NET_NAME, "iteration": iteration_text(config.step), "saved_data": saved,
        "input_output": input_output, "kernels": kernels, "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
        "op_debug_mode": 0, "statistic_category": ["max", "min", "avg", "l2norm"]},
        "e2e_dump_settings": {"enable": True, "trans_flag": True}}


class NativeDump:
    """The Dump of one debugger: set up at its creation, converted at each step()."""

    def __init__(self, config):
        self.config = config
        self.env = None   # the MINDSPORE_DUMP_CONFIG this debugger set
        user = os.environ.get(ENV)
        if user:
            with open(user) as f:
                settings = json.load(f)["common_dump_settings"]
            self.root = settings.get("path") or os.path.join(os.environ.get("MS_DIAGNOSTIC_DATA_PATH", "."),
                                                             "debug_dump")
            log.info("MindSpore Dump: the MINDSPORE_DUMP_CONFIG already set is kept (%s)", user)
        else:
            settings = native_config(config, ms.get_context("device_target"))
            os.makedirs(config.dump_path, exist_ok=True)
            path = os.path.abspath(os.path.join(config.dump_path, CONFIG_FILE))
            with open(path, "w") as f:
                json.dump(settings, f, indent=1)
            os.environ[ENV] = path
            self.env = path
            self.root = settings["common_dump_settings"]["path"]
        self.converted: set = set()   # the tensor files converted already
        self.said_nothing = False
        self.model = None

    def _new_files(self, rank) -> tuple:
        """([iteration folders], {their tensor files not converted yet}) of this process's rank_{id} folder
        (the ranks of a distributed run write beside each other)."""
        if not native_read.is_native(self.root):
            return [], set()
        dirs, new = [], set()
        for _it, found_rank, its in native_read.iterations(self.root):
            if found_rank != (rank or 0):
                continue
            for d in its:
                files = {os.path.join(d, f) for f in os.listdir(d)} - self.converted
                if files:
                    dirs.append(d)
                    new |= files
        return dirs, new

    def _cells(self, names, classes):
        """The cell path and classes of a kernel, relative to the network given to start()."""
        if self.model is None:
            return [(n, c) for n, c in zip(names, classes or [None] * len(names))]
        cur, out = self.model[0] if isinstance(self.model, (list, tuple)) else self.model, []
        for name in names:
            child = cur
            for part in name.split("."):
                child = getattr(child, "_cells", {}).get(part)
                if child is None:
                    break
            if child is not None:
                out.append((name, type(child).__name__))
                cur = child
        return out

    def convert(self, step: int, rank, level: str) -> int:
        """Convert what MindSpore wrote since the last call into step{step}: the number of records added."""
        dirs, new = self._new_files(rank)
        self.converted |= new
        self._release_env()
        if not dirs:
            if not self.said_nothing:
                self.said_nothing = True
                log.warning(NOTHING_WRITTEN, step)
            return 0
        folder = writer.step_rank_dir(self.config.dump_path, step, rank)
        tensors = os.path.join(folder, "dump_tensor_data") if self.config.task == "tensor" else None

        def save(file_name, array):
            os.makedirs(tensors, exist_ok=True)
            np.save(os.path.join(tensors, file_name), array, allow_pickle=False)
            return file_name
        data, parents, stacks = native_read.records(dirs, self._cells, only=new, save=save if tensors else None)
        keep = {"L0": ("Cell.",), "L1": ("Kernel.",)}.get(level, ("Cell.", "Kernel."))
        data = {k: v for k, v in data.items() if k.startswith(keep)}
        parents = {k: (v if v in data else None) for k, v in parents.items() if k in data}
        stacks = {k: v for k, v in stacks.items() if k in data}
        if not data:
            return 0
        os.makedirs(folder, exist_ok=True)
        dump_file = os.path.join(folder, "dump.json")
        content = native_read.dump_content({}, self.config.task, level)
        if os.path.isfile(dump_file):   # what ran in PyNative around the compiled code, recorded by hooks
            with open(dump_file) as f:
                content = json.load(f)
        content["data"].update(data)
        if tensors and os.path.isdir(tensors):
            content["dump_data_dir"] = tensors
        _write(dump_file, content)
        for name, extra in (("construct.json", parents), ("stack.json", _stack_groups(stacks))):
            path = os.path.join(folder, name)
            old = {}
            if os.path.isfile(path):
                with open(path) as f:
                    old = json.load(f)
            if name == "stack.json":
                extra = {str(len(old) + int(k)): v for k, v in extra.items()}
            old.update(extra)
            _write(path, old)
        return len(data)


    def _release_env(self) -> None:
        """MINDSPORE_DUMP_CONFIG is read at the first compile, which a step has passed: removed again, so that
        processes the training starts later (which inherit the environment) do not dump as well."""
        if self.env is not None and os.environ.get(ENV) == self.env:
            del os.environ[ENV]
        self.env = None


def _stack_groups(stacks: dict) -> dict:
    """{"0": [[names], [frames]]}: identical stacks once."""
    groups: dict = {}
    for name, frames in stacks.items():
        groups.setdefault(tuple(frames), []).append(name)
    return {str(i): [names, list(frames)] for i, (frames, names) in enumerate(groups.items())}


def _write(path: str, content) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(content, f)
    os.replace(tmp, path)
