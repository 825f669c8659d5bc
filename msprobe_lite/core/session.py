"""The state of one debugging run: which step, whether collecting, call counters, records, stacks, hierarchy.

Adapters call into a Session from their hooks; the session owns the decisions (is this step and rank
selected, is this record wanted) and hands finished steps to the writer. What was
collected survives the end of the process (exits.py: at exit and on SIGTERM every live session writes what it
holds). A forked child (a DataLoader worker) inherits the sessions but never records or writes through them:
only the process that created a session writes its dump.
"""
from __future__ import annotations

import os
import threading

from . import exits, writer
from .filters import RecordFilter, matches_fragment
from .naming import counterpart, params_grad_calls
from .records import Record, all_finite, mark_unwritten, summaries_in
from .safety import log, report_failure, report_unwritable
from .stacks import StackCollector


# record names to show in a filter's warning, in the vocabulary of the framework dumped: (API, module)
NAME_EXAMPLES = {"pytorch": ("Functional.linear.0.forward", "Module.fc1.Linear.forward.0"),
                 "mindspore": ("Functional.matmul.0.forward", "Cell.fc1.Dense.forward.0")}


def name_examples(framework: str, level: str) -> str:
    """Record names of the kinds a dump of `level` holds, for a filter's warning: module names given to an
    L1 run (copied from an L0 result) are the usual mistake, and the level's own kind is what to write."""
    api, module = NAME_EXAMPLES.get(framework, NAME_EXAMPLES["pytorch"])
    if level == "L1":
        return f"such as {api}; an L1 dump has no {module.split('.')[0]} records, L0 and mix have"
    if level == "L0":
        return f"such as {module}; an L0 dump has no API records, L1 and mix have"
    return f"such as {api} or {module}"


EXIT_WAIT_S = 10.0  # how long the exit path waits for another thread's write of a session


class Session:
    """One run of the debugger (one PrecisionDebugger).

    Life cycle per step: `start()` opens collection (forward and backward), `stop()` closes forward collection
    and writes what is there, `next_step()` writes again if backward records arrived meanwhile, then moves to
    the next step. Backward hooks keep recording between `stop()` and `next_step()`, so `stop()` may sit before
    `loss.backward()` as long as `step()` comes after it.
    """

    def __init__(self, config, framework: str, module_kind: str, framework_packages=(),
                 rank_fn=lambda: None, resolver=None, world_fn=lambda: None):
        self.config = config
        self.framework = framework
        self.module_kind = module_kind
        self.rank_fn = rank_fn
        self.world_fn = world_fn          # the number of ranks of the job, None in a single-process run
        self.resolver = resolver          # adapter callback: fills pending statistics, queues deferred files
        self.settle = None                # adapter callback: the user's queued device work finishes (may raise)
        self.users_failure = None         # the user's error met at this stop()/step(): failed reads are its doing
        self.filter = RecordFilter(config.selection.scope, config.selection.list, config.directions,
                                   config.parts)
        self.stacks = StackCollector(framework_packages)
        self.step = 0
        self.rank = None
        self.forward_on = False           # between start() and stop()
        self.step_open = False            # between start() and step(): backward still recorded
        self._said_no_save = False        # level debug: a step without save() was said
        self._said_restart = False        # start() after stop() in one step was said
        self.finished = False             # past the last selected step: nothing more, ever
        self.thread = None                # the thread that called start(): module calls of others are not ours
        self._said_dumping = False
        self._warned_rank = False
        self._lock = threading.RLock()
        self.files = writer.FileQueue()    # tensor files, written off the training thread
        self.prepared = writer.Prepared(self.files)  # the step's folder and files, made while it runs
        self.numbers = config.task != "structure"
        self.tensor_list = config.statistics.tensor_list if config.task == "statistics" else []
        self.saving = config.task == "tensor" or bool(self.tensor_list)  # are any tensors saved to files
        self._said_filters: set = set()   # unmatched scope/list, said once a run
        self.overflows = 0                 # overflow_check: overflowing calls written so far (all steps)
        self._reset_step()
        exits.register(self)

    # -- per-step state -------------------------------------------------------------------------------------
    def _reset_step(self) -> None:
        self._overflowing = set()
        self.records = {}
        self.counters = {}
        self.construct = {}
        self.stand_ins = {}       # a call that raised -> its own parent: the parent its children are written with
        self.pending = []
        self.tensor_files = {}    # record name -> its tensor files this step (tensor task, tensor_list)
        self.orphan_files = []    # tensor files of calls that raised: removed once the step's files are written
        self.dirty = False
        self._tensor_listed = set()  # the tensor_list entries that matched a dumped record this step
        self.filter.reset()
        self.stacks.reset()

    def step_selected(self) -> bool:
        return self.config.step.everything or self.step in self.config.step

    def dumps_here(self) -> bool:
        """Whether this step is dumped by this rank, asked without start() (and without its log lines)."""
        return self.step_selected() and self._selects(self.rank_fn())

    def _selects(self, rank) -> bool:
        """Whether the config's `rank` selects `rank` (None, a single-process run, counts as rank 0)."""
        selection = self.config.rank
        return selection.everything or (0 if rank is None else rank) in selection

    def _rank_selected(self) -> bool:
        if self._selects(self.rank):
            if not self._said_dumping:  # said once this process dumps: not by a debugger never started, nor
                self._said_dumping = True  # by a rank the config leaves out (that one says so below)
                log.info("dumping task=%s level=%s to %s", self.config.task, self.config.level,
                         self.config.dump_path)
                self._say_earlier_run()
            return True
        selection = self.config.rank
        if not self._warned_rank:
            self._warned_rank = True
            if self.rank is None:
                log.warning("config rank=%s selects no rank of this non-distributed run (it counts as rank 0): "
                            "nothing will be dumped", selection.to_list())
            elif self._selects_none_of_the_job(selection):  # every rank says the same: the list is wrong
                world = self.world_fn()
                log.warning("config rank=%s selects no rank of this %d-rank job (ranks 0 to %d): nothing will be "
                            "dumped", selection.to_list(), world, world - 1)
            else:  # usual for all ranks but the chosen ones
                log.info("config rank=%s does not select rank %d: this process dumps nothing",
                         selection.to_list(), self.rank)
        return False

    def _say_earlier_run(self) -> None:
        """A dump_path that already holds this rank's folders (an earlier run's, before this one wrote any):
        the steps this run writes replace theirs and the others stay, and compare reads them together (a
        3-step run's step2 beside a 2-step run's steps read as the new run's)."""
        root, rank_folder = self.config.dump_path, writer.rank_folder(self.rank)
        try:
            steps = [n for n in os.listdir(root) if n[:4] == "step" and n[4:].isdecimal()
                     and os.path.isdir(os.path.join(root, n, rank_folder))]
        except OSError:  # not made yet: the usual case
            return
        if steps:
            steps.sort(key=lambda n: int(n[4:]))
            shown = ", ".join(steps[:4]) + (", ..." if len(steps) > 4 else "")
            log.warning("dump_path %s already holds %s (%s/) of an earlier run: the steps this run dumps replace "
                        "theirs and the others stay, so compare would read them with this run's; use a new "
                        "dump_path, or remove them first", root, shown, rank_folder)

    def _selects_none_of_the_job(self, selection) -> bool:
        world = self.world_fn()
        return bool(world) and selection.spans[0][0] >= world  # spans: sorted, merged (config.IndexSet)

    # -- life cycle -----------------------------------------------------------------------------------------
    def start(self) -> bool:
        """Open collection for the current step; False when this step or rank is not dumped."""
        if self.finished:
            return False
        self.rank = self.rank_fn()
        if not (self.step_selected() and self._rank_selected()):
            self.forward_on = self.step_open = False
            return False
        if self.step_open and not self.forward_on and not self._said_restart:
            self._said_restart = True  # micro-batches may do this on purpose: said once, not refused
            log.warning("step %d: start() again after stop() without step(): this iteration's calls are numbered "
                        "on in step %d (call debugger.step() at the end of each training step; said once)",
                        self.step, self.step)
        self.thread = threading.get_ident()
        exits.watch_sigterm()  # over a handler the user installed since the last step
        self.forward_on = self.step_open = True
        self.prepared.prepare(self.folder(), writer.step_files(*self._layout()))
        return True

    def stop(self) -> None:
        self.forward_on = False
        self.flush()

    def next_step(self) -> None:
        """Write the step, then move on; past the last listed step the session finishes for good."""
        self.forward_on = False
        with exits.writing():  # a SIGTERM meanwhile is handled once the step's files are settled
            self.flush()
            self.prepared.discard()
        if self.step_open:
            self._say_unmatched_filters()
            if self.config.level == "debug" and not self.records and not self._said_no_save:
                self._said_no_save = True  # a dump folder with nothing in it, and compare's "no dump found"
                log.warning("step %d: level debug recorded nothing: it records only what save(value, name) is "
                            "given between start() and step() (said once)", self.step)
        self.step_open = False
        self.step += 1
        self._reset_step()
        last = self.config.step.last
        if (last is not None and self.step > last) or self._overflow_limit_reached():
            self.finished = True

    def _say_unmatched_filters(self) -> None:
        """A misspelt `scope`, `list` or `tensor_list` name leaves an empty or partial dump and no error: said
        once a run."""
        found = self.filter.unmatched()
        missing = [f for f in self.tensor_list if f not in self._tensor_listed]
        if missing:
            found.append(f"tensor_list entries {missing} matched no dumped record name: no tensor of theirs was "
                         f"saved")
        for what in found:
            if what not in self._said_filters:
                self._said_filters.add(what)
                log.warning("step %d: %s (names as in a dump made without the filter, %s)", self.step, what,
                            name_examples(self.framework, self.config.level))

    # -- used by hooks ---------------------------------------------------------------------------------------
    # CallRecorder (calls.py) and the C API handler (pytorch/_fast_capture.c) do what next_index, add and
    # set_parent do inline for every captured call (a method call each is measurable there): a change to one
    # of them belongs in both too.
    def next_index(self, key) -> int:
        """Call index of `key` (an API or a module path) within the step; filters never change it."""
        n = self.counters.get(key, 0)
        self.counters[key] = n + 1
        return n

    def add(self, record: Record) -> Record:
        self.records[record.name] = record
        self.dirty = True
        return record

    def touch(self) -> None:
        """A record already added was filled in further (a late gradient)."""
        self.dirty = True

    def set_parent(self, name: str, parent) -> None:
        self.construct[name] = parent

    def _stand_in(self, parent):
        """`parent`, or, when that call raised and left no record (a module call inside the user's `try`), the
        nearest call around it that did not."""
        while parent in self.stand_ins:
            parent = self.stand_ins[parent]
        return parent

    def saves_tensors(self, name: str) -> bool:
        """Task tensor saves every dumped tensor; statistics saves those of records named in tensor_list."""
        if not self.saving or self.config.task == "tensor":
            return self.saving
        hits = [f for f in self.tensor_list if matches_fragment(name, f)]
        self._tensor_listed.update(hits)
        return bool(hits)

    def tensor_folder(self) -> str:
        return os.path.join(self.folder(), "dump_tensor_data")

    # -- writing ---------------------------------------------------------------------------------------------
    def _layout(self) -> tuple:
        """(data file, whether stack.json and construct.json are written): debug.json at level debug."""
        debug = self.config.level == "debug"
        return ("debug.json" if debug else "dump.json"), self.config.extra_info and not debug

    def folder(self) -> str:
        return writer.step_rank_dir(self.config.dump_path, self.step, self.rank)

    def header(self) -> dict:
        return {"task": self.config.task, "level": self.config.level, "framework": self.framework,
                "dump_data_dir": self.tensor_folder() if self.saving else None}

    # -- what a step writes, by task ------------------------------------------------------------------------
    def _records_to_write(self) -> list:
        records = list(self.records.values())
        if not self.numbers:
            return records                        # structure: names only, every record
        records = [r for r in records if r.data]  # not an empty record (inline: a method call per record adds up)
        if self.config.task == "overflow_check":
            kept = {r.name for r in records if self._overflow_kept(r)}
            # parameter gradients are written with what they were made of, their call's forward and backward
            # records, as other calls with their inputs: the offline analysis reads them there
            made_of = {n for name in kept for calls in [params_grad_calls(name, self.records) or ()]
                       for names in calls for n in names}
            records = [r for r in records if r.name in kept or r.name in made_of]
        return records

    def _overflow_limit_reached(self) -> bool:
        limit = self.config.overflow_check.overflow_nums
        return self.config.task == "overflow_check" and limit != -1 and self.overflows >= limit

    def _overflow_kept(self, record: Record) -> bool:
        """Calls whose outputs hold NaN/Inf, in execution order, until overflow_nums calls have made them from
        finite inputs and arguments. A call that got them with its inputs, or from a non-finite argument
        (`masked_fill(mask, float("-inf"))`: every causal attention mask), is written but neither counted nor
        logged: counted, the mask took the one overflow of the default overflow_nums and hid a real one,
        and every call after a real one was logged as another."""
        if record.name in self._overflowing:
            return True
        data = record.data
        has_output = isinstance(data, dict) and "output" in data
        outputs = data["output"] if has_output else data
        if all(s.finite() for s in summaries_in(outputs)) or self._overflow_limit_reached():
            return False
        self._overflowing.add(record.name)
        if has_output and not all(all_finite(v) for k, v in data.items() if k != "output"):
            return True
        if not has_output and not self._own_overflow(record.name):
            return True
        self.overflows += 1
        frames = self.stacks.frames_of(record.name)
        where = " at " + frames[0].replace(", \n ", ": ") if frames else ""
        log.warning("overflow %d: %s produced NaN/Inf%s", self.overflows, record.name, where)
        return True

    def _own_overflow(self, name: str) -> bool:
        """Whether a record without inputs (parameter gradients, a save()) made its NaN/Inf itself. Parameter
        gradients (grad_out^T x for a linear layer, summed over the module's calls) are made of each call's
        backward input gradients and forward inputs: theirs only when all are finite, and the backwards'
        outputs too (else a backward record is the one counted). Counted regardless, the gradients of the
        first layer that backward reached would take the overflow of an Inf made in the forward pass between
        modules."""
        calls = params_grad_calls(name, self.records)
        if calls is None:
            return True
        forwards, backwards = calls
        return all(all_finite(self.records[n].data) for n in backwards) and all(
            all_finite(v) for n in forwards for k, v in self.records[n].data.items() if k != "output")

    def flush(self) -> None:
        """Write the current step if anything changed since the last write (one thread at a time; exit and
        signal paths go through `write_on_exit`, which waits for the lock a bounded time). A SIGTERM that
        arrives meanwhile is handled once the write is done (exits.writing): cut short, the write would leave
        its temporary file, and the handler's own write would make a second one."""
        with exits.writing(), self._lock:
            if not self.dirty:
                return
            try:
                if self.resolver is not None:
                    self.resolver()
                records = self._records_to_write()
                overflow = self.config.task == "overflow_check"
                if overflow and not records:  # no overflow in this step: no folder (the step's end removes it)
                    self.dirty = False
                    return
                data_file, extra = self._layout()
                construct = self.construct if extra else None  # empty at L1: no module hierarchy
                if construct and overflow:
                    construct = {r.name: self.construct[r.name] for r in records if r.name in self.construct}
                if construct and self.stand_ins:
                    construct = {name: self._stand_in(parent) for name, parent in construct.items()}
                # a backward record's place is its forward call's: stacks are filed for forward records
                written = {n for r in records for n in (r.name, counterpart(r.name))} if overflow else None
                stacks = self.stacks.to_json(written) if extra else None
                folder = self.folder()
                writer.write_step(folder, self.header(), records, stacks, construct, data_file, self.prepared.take)
                self.files.wait()
                if self.tensor_files and self._mark_unwritten(records):  # dump.json says which files are not there
                    writer.write_step(folder, self.header(), records, stacks, construct, data_file)
                self._remove_orphan_files()
                self.prepared.written(folder)
                self.dirty = False
            except OSError as exc:  # the file system's refusal: the user's to fix, said without a traceback
                report_unwritable(self.folder(), exc)
            except Exception as exc:  # noqa: BLE001 - a failed write must not stop training
                if self.users_failure is not None:  # the device failed the user's work: no read can succeed
                    self._not_written(self.users_failure)
                    return
                # one report for the run (a full disk fails every later step too); the step stays dirty,
                # so the next stop()/step() of this step tries again, and the previous file stays whole
                report_failure(f"writing {self.folder()}", exc, site="writing a step")

    def abandon_files(self, name: str) -> None:
        """The tensor files of the call `name`, which raised (inside the user's `try`, or a checkpoint's
        recomputation stopped early): it has no record, so its files go too, once written."""
        files = self.tensor_files.pop(name, ())
        if files:
            self.orphan_files.extend(files)
            self.dirty = True  # so that the step's flush comes and removes them, even with nothing else new

    def _mark_unwritten(self, records: list) -> bool:
        """Once the writer thread is done: each tensor file of the step that is not on disk (its write failed,
        or its folder was deleted mid-step) marked in its record, so that compare errs on that record alone
        rather than stopping at the missing file. True when a record got a new mark (a stat per file: small
        beside writing the file)."""
        failed, self.files.failed = self.files.failed, {}
        missing: dict = {}
        for name, paths in self.tensor_files.items():
            for path in paths:
                if path in failed or not os.path.lexists(path):
                    missing.setdefault(name, {})[os.path.basename(path)] = _not_written(failed.get(path))
        marked: list = []
        for record in records:
            if record.name in missing:
                record.data = mark_unwritten(record.data, missing[record.name], marked)
        return bool(marked)

    def _remove_orphan_files(self) -> None:
        for path in self.orphan_files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.orphan_files = []

    def write_on_exit(self) -> None:
        """At exit and on SIGTERM's default action: write what the step holds, and remove what was made ahead
        for nothing. A flush running on another thread (training off the main thread) is the step's write: it
        is waited for, EXIT_WAIT_S at most (that thread might wait for something the interrupted one holds)."""
        if not self._lock.acquire(timeout=EXIT_WAIT_S):
            return
        with _Released(self._lock):
            self.forward_on = False  # the debugger's own work from here on is not a user call
            if self._device_failed():
                return
            self.flush()             # the lock is reentrant: this thread holds it already
            self.prepared.discard()

    def _device_failed(self) -> bool:
        """At exit after the user's computation failed on the device (a CUDA device-side assert, say): every read
        of the device fails from then on, so the step cannot be completed. Said plainly, as the user's error
        it is; what the step's earlier writes put on disk stays whole."""
        if self.settle is None or not self.dirty:
            return False
        try:
            self.settle()
        except Exception as exc:  # noqa: BLE001 - the user's failure, which the user has already been shown
            self._not_written(exc)
            self.prepared.discard()
            return True
        return False

    def _not_written(self, users_error: BaseException) -> None:
        """Said once for the step, as the user's failure it is; the step's earlier writes stay whole."""
        text = str(users_error).splitlines()[0] if str(users_error) else type(users_error).__name__
        log.warning("step %s is not written past its last write: the user's computation failed the device (%s)",
                    self.step, text if len(text) <= 60 else text[:59] + "…")
        self.dirty = False

    def write_so_far(self) -> None:
        """On SIGTERM with a handler of the user's: the step so far on disk, in case that handler ends the
        process, and nothing made ahead left behind; recording goes on, and the step's end writes it whole.
        A step recorded by another thread is left to it: writing it here would race its hooks."""
        if self.step_open and self.thread != threading.get_ident():
            return
        if not self._lock.acquire(False):
            return
        with _Released(self._lock):
            recording, self.forward_on = self.forward_on, False  # the write's own calls are not the user's
            try:
                self.flush()
                self.prepared.discard()
            finally:
                self.forward_on = recording

    def disown(self) -> None:
        """In a forked child: this session belongs to the parent; record nothing, write nothing."""
        self.forward_on = self.step_open = self.dirty = False
        self.finished = True
        self.records, self.pending = {}, []
        self._lock = threading.RLock()    # a parent thread may have held it at the fork
        self.files = writer.FileQueue()   # the parent's writer thread does not exist here
        self.prepared.drop()              # what the parent made ahead is the parent's
        self.prepared = writer.Prepared(self.files)


def _not_written(exc) -> str:
    """Why a tensor file is not on disk, for its record's `data_error`."""
    if exc is None:
        return "not on disk when the step was written: its folder was deleted, or the file removed"
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"


class _Released:
    """Releases an already acquired lock on exit (flush acquires it itself, possibly without blocking)."""

    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lock.release()
