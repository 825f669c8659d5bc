"""From call arguments to encoded values with `TensorSummary` leaves: the framework-neutral half of summarising.

A tensor that is the output of one call and the input of the next is summarised once: summaries are cached
by (object identity, version) for the step. Only a framework whose tensors carry a version counter that every
in-place change bumps (PyTorch's `_version`) gets the cache; without one, a cached summary could be stale, so
each sighting is summarised anew. Tensor files (task `tensor`, `tensor_list`) are named after the value's
place in its record; a value already saved this step gets a hard link instead of a second copy.

Some writes pass the version counter by: through an alias of the memory (PyTorch's `.data`, a numpy array or
DLPack capsule of the tensor) or by rebinding a tensor's memory (`t.data = other`). The API capture reports
each such alias as it is made (`taint`): from then on until the step ends, a tensor whose memory lies in that
storage is summarised, and saved, anew at each sighting. Both are also forgotten at `stop()`, since between
two collecting windows of a step no alias is seen.

An adapter subclasses `Summarizer` and supplies how to summarise one tensor, how to copy and write one,
`quiet()`, which keeps the debugger's own tensor work out of the API capture, and `synchronize()` when its
framework runs operators asynchronously: `settle()` runs it under `safety.users_work`, so that an operator of
the user's that failed is raised as the user's error, not taken for a failure of the debugger's read.
"""
from __future__ import annotations

import contextlib
import functools
import os
import weakref

from .naming import data_file_name
from .records import NO_STATS, SavedTensor, TensorSummary
from .safety import guarded, report_failure, report_unwritable, users_work
from .writer import link_or_copy, make_dirs

# Storages tainted in one step beyond which every tensor is summarised anew (the check on each cached sighting
# goes through the list)
MAX_TAINTED = 64
EVERYWHERE = (0, 2 ** 64)   # the extent of a tainted tensor whose storage cannot be read: all memory


def resolve_pending(pending: list, group_of, fetch, size_of, as_stats) -> None:
    """Fill every PendingStats with one device-to-host transfer per group (device and dtype): `fetch` turns
    a group's device values into one flat Python list, `as_stats` a slice of it into the four statistics."""
    groups: dict = {}
    for p in pending:
        groups.setdefault(group_of(p.device_value), []).append(p)
    for items in groups.values():
        flat = fetch([p.device_value for p in items])
        at = 0
        for p in items:
            size = size_of(p.device_value)
            p.summary.stats = as_stats(flat[at:at + size], p.kind)
            at += size
            p.device_value = None


class Summarizer:
    tensor_ext = ".pt"
    tensor_type = "tensor"   # `type` of a summary made here when the adapter's `_summarize` failed

    def __init__(self, session, encoder):
        self.session = session
        self.encoder = encoder
        config = session.config
        self.md5 = config.task == "statistics" and config.statistics.summary_mode == "md5"
        self.defer = config.async_dump   # device values and files wait for the end of the step
        self._cache: dict = {}
        # (start, end) addresses of storages with an alias that writes past the version counter, this step;
        # shared with a fast encoder, which keeps the same rule
        self._tainted: list = []
        self._snapshots: dict = {}       # id -> (weakref, version, first file): a value is saved once a step
        self._folders: set = set()       # tensor folders already created
        self._deferred_files: list = []  # (write, path), async_dump: queued when the step is written
        # an adapter's faster `value -> encoded` for records that save no tensor file (a C route), or None
        self.fast_encode = None
        # an adapter's `seal(record)`, or None: takes a finished forward record out of the garbage collector's
        # lists when its summaries are (see pytorch/_fast_encode.c): fewer full collections of the process
        self.seal = None

    # -- what an adapter provides ----------------------------------------------------------------------------
    def quiet(self):
        """Context in which the debugger's own framework calls are neither captured nor slowed down."""
        return contextlib.nullcontext()

    @staticmethod
    def version(t):
        """A value that changes with every in-place change of `t`, or None when the framework has none."""
        return None

    def _summarize(self, t) -> TensorSummary:
        raise NotImplementedError

    @staticmethod
    def grad_flag(t):
        """What a new summary of `t` would hold as `requires_grad`: a cached summary that holds the flag is
        reused only while it still says the same, since `requires_grad_()` moves no version."""
        return None

    @staticmethod
    def extent(t):
        """(start, end) addresses of the storage under `t`, or None when unknown (then all memory counts)."""
        return None

    @staticmethod
    def address(t):
        """The address of `t`'s first value, read on each cached sighting while a storage is tainted."""
        return None

    def _snapshot(self, t):
        """A copy of `t`'s value now (it may change in place later); may stay on the device."""
        raise NotImplementedError

    def _write(self, copy, path: str) -> None:
        """Save `copy` (from `_snapshot`) as the tensor file `path`, atomically; runs on the writer thread."""
        raise NotImplementedError

    def _resolve_device(self) -> None:
        """Fetch whatever statistics still live on a device (one batch per step)."""

    @staticmethod
    def synchronize() -> None:
        """Have the framework finish the operators queued so far (nothing to do where it runs them at once)."""

    def settle(self) -> None:
        """Before the debugger reads values (or does what makes the framework synchronise): the user's queued
        operators run now, and the exception of one that failed is marked as the user's (`users_work`): it
        reaches the user from the call being recorded, as it would from the user's own next read. What fails
        after this, in the read itself, is the debugger's."""
        with users_work:
            self.synchronize()

    # -- the step's end --------------------------------------------------------------------------------------
    def resolve(self) -> None:
        """Before the step is written: fetch pending device values, queue deferred files."""
        with self.quiet():
            self._resolve_device()
        for write, path in self._deferred_files:
            self.session.files.submit(write, path)
        self._deferred_files = []

    def forget_all(self) -> None:
        """At stop(): writes made before the next start() are not seen (no alias is reported meanwhile)."""
        self._cache.clear()
        self._snapshots.clear()

    def reset(self) -> None:
        self.forget_all()
        self._tainted.clear()

    @guarded("the alias watch")
    def taint(self, args, result=None) -> None:
        """A call has made an alias of the tensors in `args` (`.data`, `.numpy()`, a DLPack capsule), rebound
        their memory (`t.data = other`), or made `result` over memory that something else owns
        (`torch.as_tensor(array)`): writes through those will not move a version counter, so for the rest of
        the step no tensor in those storages is summarised from the cache."""
        is_tensor = self.encoder.is_tensor
        # a result over memory that something else owns: made from an array, not from a tensor (an alias
        # of it, tainted as an argument) nor from Python numbers (a copy: as_tensor(0.5) in torch's own code)
        foreign = bool(args) and not is_tensor(args[0]) and not isinstance(args[0],
                                                                           (int, float, complex, list, tuple))
        with self.quiet():
            for value in (*args, result) if foreign else args:
                if is_tensor(value):
                    extent = self.extent(value) or EVERYWHERE
                    if extent not in self._tainted:
                        self._tainted.append(extent)
        if len(self._tainted) > MAX_TAINTED:
            self._tainted[:] = [EVERYWHERE]

    def _trusted_version(self, t):
        """`t`'s version when what was kept for it this step (a summary, a saved file) may be reused: None
        without a version counter, or when an alias may have written its memory."""
        version = self.version(t)
        if version is not None and self._tainted:
            address = self.address(t)
            if address is None or any(start <= address < end for start, end in self._tainted):
                return None
        return version

    def forget(self, tensors) -> None:
        """Drop the cached summaries and saved files of tensors changed without a version bump (collectives
        write in place, batch_norm its running statistics): a later sighting is summarised and saved anew."""
        for t in tensors:
            self._cache.pop(id(t), None)
            self._snapshots.pop(id(t), None)

    # -- entry points (hooks call these) --------------------------------------------------------------------
    # `save_as` (a record name) also saves each tensor to a file named after its place in that record.
    def encode(self, value, path: tuple = (), save_as: str | None = None):
        with self.quiet():
            if save_as is None and self.fast_encode is not None:
                return self.fast_encode(value)
            return self.encoder.encode(value, self._leaf(save_as), path)

    def encode_call(self, args, kwargs, save_as: str | None = None) -> tuple:
        """(input_args, input_kwargs) of a call, encoded in one pass."""
        with self.quiet():
            if save_as is None and self.fast_encode is not None:
                fast = self.fast_encode
                return fast(args), fast(kwargs)
            leaf = self._leaf(save_as)
            return (self.encoder.encode(args, leaf, ("input_args",)),
                    self.encoder.encode(kwargs, leaf, ("input_kwargs",)))

    def encode_output(self, output, save_as: str | None = None) -> list:
        """`output` is always a list: a tuple/list result is encoded item by item, anything else is wrapped."""
        if isinstance(output, (list, tuple)) and not hasattr(output, "_fields"):
            return self.encode(output, ("output",), save_as)
        return [self.encode(output, ("output", 0), save_as)]

    def summarize(self, t, fresh: bool = False, save_as: str | None = None, path: tuple = ()):
        """Summary of `t` now; `fresh` skips the cache (for buffers changed behind autograd's back)."""
        with self.quiet():
            if save_as is None and not fresh and self.fast_encode is not None:
                return self.fast_encode(t)  # a tensor is its own leaf
            summary = self._cached(t, fresh)
            return self._saved(t, summary, save_as, path) if save_as is not None else summary

    # -- internals --------------------------------------------------------------------------------------------
    def _leaf(self, save_as):
        if save_as is None:
            return self._tensor_leaf
        return lambda t, path: self._saved(t, self._cached(t), save_as, path)

    def _tensor_leaf(self, t, path):
        return self._cached(t)

    def _cached(self, t, fresh: bool = False) -> TensorSummary:
        """The summary of `t` cached for this step while `t` is alive, its version unchanged and its
        `requires_grad` the same (a fast encoder keeps the same cache, with the same rule), else a new one,
        cached."""
        version = self._trusted_version(t)
        if version is None:
            return self._fresh(t)
        key = id(t)
        cached = self._cache.get(key)
        if not fresh and cached is not None and cached[0]() is t and cached[1] == version \
                and cached[2].requires_grad in (None, self.grad_flag(t)):
            return cached[2]
        summary = self._fresh(t)
        try:
            self._cache[key] = (weakref.ref(t), version, summary)
        except TypeError:  # tensor types that refuse weak references are simply not cached
            pass
        return summary

    def _fresh(self, t) -> TensorSummary:
        try:
            return self._summarize(t)
        except Exception as exc:  # noqa: BLE001 - see _unsummarizable
            return self._unsummarizable(t, exc)

    def _unsummarizable(self, t, exc) -> TensorSummary:
        """A tensor whose statistics cannot be computed (a sparse, quantized or nested tensor, a wrapper
        subclass, a dtype without kernels): reported once, and recorded with what is known and no statistics,
        so the call's record, and the rest of the step, are kept."""
        self.settle()  # a device that failed the user's work fails every read: then the error is the user's
        kind = type(t)  # MindSpore makes Parameter's class at run time: its module reads "abc"
        name = kind.__qualname__ if kind.__module__ in ("abc", "builtins") else f"{kind.__module__}.{kind.__qualname__}"
        report_failure(f"statistics of a tensor of type {name}", exc, site="tensor statistics")

        def known(get):
            try:
                return get()
            except Exception:  # noqa: BLE001
                return None
        return TensorSummary(self.tensor_type, known(lambda: str(t.dtype)), known(lambda: list(t.shape)), NO_STATS)

    def _saved(self, t, summary, record: str, path: tuple) -> SavedTensor:
        """Save the value of `t` now as `{record}.{category}.{index}{ext}`. A value already saved this step
        (the output of one call is the input of the next) is not copied or serialised again: its file gets
        a second name (a hard link)."""
        name = data_file_name(record, path, self.tensor_ext)
        folder = self.session.tensor_folder()
        target = os.path.join(folder, name)
        if folder not in self._folders:
            try:
                make_dirs(folder)
            except OSError as exc:  # the file system's refusal: said plainly; the summary is kept
                report_unwritable(folder, exc)
                return summary
            self._folders.add(folder)
        key, version = id(t), self._trusted_version(t)
        cached = self._snapshots.get(key)
        if version is not None and cached is not None and cached[0]() is t and cached[1] == version:
            write = functools.partial(link_or_copy, cached[2], target)
        else:
            try:
                copy = self._snapshot(t)
            except Exception as exc:  # noqa: BLE001 - a meta tensor has no value to save: keep the summary
                report_failure(f"saving a {type(t).__qualname__} to {name}", exc, site="tensor file")
                return summary
            write = functools.partial(self._write, copy, target)
            if version is not None:
                try:
                    self._snapshots[key] = (weakref.ref(t), version, target)
                except TypeError:
                    pass
        self.session.tensor_files.setdefault(record, []).append(target)
        if self.defer:  # keep the (device) copy until the step ends; no transfer now
            self._deferred_files.append((write, target))
        else:
            self.session.files.submit(write, target)
        return SavedTensor(summary, name)
