"""The three calls a user adds to a training loop, the same for every framework.

`Debugger` wires the framework-neutral Session (what to collect, when to write) to an adapter's hooks (how to
see calls and tensors). An adapter subclasses it and says which Framework object, summarizer and API capture
it uses. Construction validates the config and creates nothing on disk.
"""
from __future__ import annotations

from ..config import load_config, msprobe_note
from . import exits, native, stacks, statistics, writer
from .calls import CallRecorder
from .debug_save import DebugSaver
from .module_calls import ModuleHooks
from .safety import guarded, log, set_rank
from .session import Session

MODULE_LEVELS = ("L0", "mix")
API_LEVELS = ("L1", "mix")
_c_routes_warned = False


def _warn_once_without_c_routes(adapter_routes=()) -> None:
    """pip says nothing when the optional C routes fail to build (no compiler): the user hears it here.
    `adapter_routes`: (what, the built object or None) pairs of the adapter's own C routes."""
    global _c_routes_warned
    routes = (("the one-pass statistics kernel (core/_fast_stats.c)", statistics.one_pass),
              ("dump.json text (core/_fast_json.c)", writer._record_lines_c),
              ("the stack walk (core/_fast_stack.c)", stacks._walk_c)) + tuple(adapter_routes)
    missing = [name for name, route in routes if route is None]
    if missing and not _c_routes_warned and not native.LEFT_OUT:  # left out by MSPROBE_LITE_PURE_PYTHON: a choice
        _c_routes_warned = True
        log.warning("%s of msprobe_lite %s not built when the package was installed (no C compiler?): the "
                    "same records come from the Python routes, several times slower (without the kernel, "
                    "Mean and Norm may differ in their last digits). Reinstall with a C compiler to build "
                    "them.", ", ".join(missing), "was" if len(missing) == 1 else "were")


class Debugger:
    """`start(model)`, `stop()`, `step()` around each training step; `config.json` says what is dumped.

    Arguments other than `config_path` override the file's fields of the same name when not None.
    """

    framework = None          # a core.framework.Framework subclass
    framework_packages = ()   # their frames are left out of stacks

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None):
        self.config = load_config(config_path, task=task, dump_path=dump_path, level=level, step=step)
        self._tag_rank()  # every rank of a job says the lines below: each says which it is
        for setting in self.config.unused_settings():
            log.warning("%s is set but task %s does not read it (each task reads its own block): it changes "
                        "nothing in this run", setting, self.config.task)
        note = msprobe_note(self.config.not_acted_on)
        if note:
            log.warning("%s", note)
        self.session = Session(self.config, self.framework.name, self.framework.module_kind,
                               self.framework_packages, self.current_rank, world_fn=self.current_world_size)
        self.summarizer = self.make_summarizer()
        self.session.resolver = self.summarizer.resolve
        self.session.settle = self.summarizer.settle
        self.recorder = CallRecorder(self.session, self.summarizer, self.framework)
        level = self.config.level
        self.modules = (ModuleHooks(self.session, self.summarizer, self.recorder, self.framework)
                        if level in MODULE_LEVELS else None)
        self.apis = self.make_api_capture() if level in API_LEVELS else None
        self.saver = DebugSaver(self.session, self.summarizer, self.recorder)
        self._warned_save = False
        _warn_once_without_c_routes(self.c_routes())

    # -- what an adapter provides ---------------------------------------------------------------------------
    @staticmethod
    def c_routes() -> tuple:
        """The adapter's own optional C routes, as (what, the built object or None) pairs."""
        return ()

    @staticmethod
    def current_rank():
        """The rank of this process in the framework's distributed group, or None when there is none."""
        return None

    @staticmethod
    def current_world_size():
        """The number of ranks in that group, or None when there is none."""
        return None

    def make_summarizer(self):
        raise NotImplementedError

    def make_api_capture(self):
        """An object with activate() (at start), deactivate() (at stop) and remove() (for good)."""
        raise NotImplementedError

    # -- the user's calls -----------------------------------------------------------------------------------
    def start(self, model=None) -> None:
        """Begin (or resume) collecting for the current step. Hooks are installed once per model."""
        if self.session.finished:
            return
        self._tag_rank()  # the process group may have come after the debugger
        if self.config.level in MODULE_LEVELS:
            if model is None:
                raise ValueError(f"level {self.config.level!r} dumps modules: call start(model=your_model)")
            self.modules.check(model)  # a wrong argument is the user's to see, as a missing one is
            self._attach(model)
        self._start()

    @guarded("start()")
    def _attach(self, model) -> None:
        self.modules.attach(model)

    def _tag_rank(self) -> None:
        try:
            set_rank(self.current_rank())
        except Exception:  # noqa: BLE001 - a tag of log lines: without it they are untagged, nothing more
            pass

    @guarded("start()")
    def _start(self) -> None:
        if self.session.start():
            if self.modules is not None:
                self.modules.abandon_open()
            if self.apis is not None:
                self.apis.activate()

    def _users_failure(self):
        """At stop() and step() of a collected step, before the debugger reads values and removes hooks (which
        makes MindSpore synchronise): the framework finishes the user's queued operators, and the exception of
        one that failed is returned, to be raised to the user once the debugger has done its own part of the
        call, as it would be raised, without the debugger, from the user's next read."""
        if not self.session.step_open:
            return None
        try:
            self.summarizer.settle()
        except Exception as exc:  # noqa: BLE001 - marked as the user's by settle(): raised by the caller
            return exc
        return None

    def _end(self, work) -> None:
        """stop() and step(): the debugger's `work`, then the user's error met at its synchronisation, if any.
        A SIGTERM meanwhile is handled once the work is done (exits.writing), so that what the user's handler
        raises leaves the debugger between two steps, not in the middle of one."""
        with exits.writing():
            failure = self._users_failure()
            self.session.users_failure = failure
            try:
                work()
            finally:
                self.session.users_failure = None
            if failure is not None:
                raise failure

    def stop(self) -> None:
        """Stop collecting forward calls and write what the step holds so far."""
        self._end(self._stop)

    forward_backward_dump_end = stop

    @guarded("stop()")
    def _stop(self) -> None:
        if self.modules is not None:
            self.modules.abandon_open()
        if self.apis is not None:
            self.apis.deactivate()
        self.session.stop()
        self.summarizer.forget_all()

    def save(self, variable, name: str, save_backward: bool = True) -> None:
        """Level `debug`: dump `variable` (tensors, scalars, nested lists/tuples/dicts) as `{name}.{k}.debug`,
        and its gradient as `{name}_grad.{k}.debug` when it arrives. Between start() and step()."""
        if self.config.level != "debug":
            if not self._warned_save:
                self._warned_save = True
                log.warning("save(%r) ignored: save() records only at level 'debug' (this config has level %r)",
                            name, self.config.level)
            return
        if not isinstance(name, str) or not name:
            raise ValueError(f"save(): name must be a non-empty string, got {name!r}")
        self._save(variable, name, save_backward)

    @guarded("save()")
    def _save(self, variable, name, save_backward) -> None:
        self.saver.save(variable, name, save_backward)

    def step(self) -> None:
        """End the step: write it (backward records included) and move to the next one."""
        self._end(self._step)

    @guarded("step()")
    def _step(self) -> None:
        if self.session.finished:
            return
        if self.apis is not None:
            self.apis.deactivate()
        self.session.next_step()
        self.summarizer.reset()
        self.recorder.end_step()
        if self.modules is not None:
            self.modules.end_step()
        if self.session.finished:
            self.release()
            log.info("last selected step dumped: hooks removed, nothing more is collected")

    def release(self) -> None:
        """Take the hooks off the model and the API capture out, for good: after the last selected step, or
        when a program built on the debugger (NetDifferenceFinder) ends its run early."""
        if self.modules is not None:
            self.modules.detach()
        if self.apis is not None:
            self.apis.remove()
