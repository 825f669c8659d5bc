"""Judging a step/rank pair of the usual kind on whole columns: the route of large comparisons.

Most large comparisons are one framework, statistics mode, API calls (L1) that the two runs made alike: the
same calls in the same order. For such a pair (`walk` says which; None for any other, which sequence.walk
judges call by call) every row's measures, every call's input and output difference and the state that
carries from call to call are computed on numpy columns (compare/table.py reads them). A call that the
columns show to pass is a pass. Each other call gets its verdict from judge.Judge: from its measures
(`Judge.measured`), or from its rows (`Judge.judge`) where they are not plain (NaN/Inf, integer statistics,
a shape or a setting that differs), with the state that the calls before it leave. Same rules, same numbers:
the two routes give the same verdicts, reasons and table (tests/test_compare_columnar.py runs both).
"""
from __future__ import annotations

import math

import numpy as np

from . import html_report, quantities, report
from .judge import (AMPLIFICATION, ERROR, NO_GRAD_INPUTS, PASS, TOLERANCE_EPS, WARNING, files_only, same_dtype,
                    scalar_value)
from .metrics import eps_of
from .pair import Pair, dtype_kind, signature, split_name
from .sequence import Walk, found_call, first_warning_kind, nonfinite_origin, one_line, place_of, requires_grad

FORWARD, BACKWARD, OTHER = 0, 1, 2
_DIRECTION = {"forward": FORWARD, "backward": BACKWARD}
_RESULT = {PASS: 0, WARNING: 1, ERROR: 2}
_EXACT_COUNT = 2 ** 53  # counts of values that float64 holds exactly: numpy then divides and roots as Python
_BLOCK = 4096  # records written to the table at a time
_CHUNK = 1 << 16  # rows measured at a time


def walk(t_tab, g_tab, target, golden, judge, step, rename_t, rename_g, open_sink) -> Walk | None:
    """Judge the pair on columns and write its table to the sink that `open_sink()` makes; None, with nothing
    written, when the pair is not of this route's kind. `rename_t`, `rename_g`: the names' meeting (None: the
    names meet as they are)."""
    calls = _calls(t_tab, g_tab, target, golden, judge, rename_t, rename_g)
    if calls is None:
        return None
    # sequence._forward_pass_bounded: a backward record, or no value that requires grad
    apis_asked = bool((calls.direction == BACKWARD).any()) or not (
        t_tab.grad.any() or any(requires_grad(obj) for obj in t_tab.objs.values()))
    state = _State(calls, _Rows(t_tab, g_tab, calls.n), target, golden, judge, step, apis_asked)
    if not state.pairs_alike():
        return None
    sink = open_sink()  # its writer readies itself while the calls are judged
    state.native = sink.native
    state.judge_irregular()
    state.judge_regular()
    state.write(sink, judge.columns)
    sink.close()
    return state.walked()


class _Calls:
    """The target's records as calls: each one's direction, whether it is judged alone, and a backward
    record's forward call, from the target's names; `golden_names` are those the records pair with."""

    def __init__(self, names: list, golden_names: list):
        self.names, self.golden_names, self.n = names, golden_names, len(names)
        keys, direction, alone = [], [], []
        by_base: dict = {}  # (base, direction) -> whether its records are judged alone, their names aside
        for name in names:
            # pair.split_name, its usual case (`Functional.linear.3.forward`) first
            base, index, word = name.rsplit(".", 2) if name.count(".") >= 2 else (name, "", "")
            if word in _DIRECTION and index.isdecimal():
                index = int(index)
            else:
                base, word, index = split_name(name)
            keys.append((base, index))
            direction.append(_DIRECTION.get(word, OTHER))
            judged = by_base.get((base, word))
            if judged is None:
                judged = by_base[base, word] = _judged_alone(base, direction[-1])
            alone.append(judged or name.startswith("Distributed."))
        self.direction = np.array(direction, dtype=np.int8)
        self.alone = np.array(alone, dtype=bool)
        # each backward record's forward call (its index), where judged before it: what it also depends on
        n = self.n
        forward_at = {key: k for k, (key, d) in enumerate(zip(keys, direction)) if d == FORWARD}
        self.forward_of = np.array([forward_at.get(key, n) if d == BACKWARD else n for key, d in zip(keys, direction)],
                                   dtype=np.int64)
        self.forward_of[self.forward_of >= np.arange(n)] = -1


def _judged_alone(base: str, direction: int) -> bool:
    """Whether the records of an API and direction get their verdict from more than their measures: not a
    call (no direction), a dropout (its verdict names it), a record two tools write for two quantities. (A
    collective's, named by its record's name, too.)"""
    return direction == OTHER or "dropout" in base.lower() or \
        quantities.may_differ(base, "backward" if direction == BACKWARD else "forward")


def _calls(t_tab, g_tab, target, golden, judge, rename_t, rename_g) -> _Calls | None:
    """The records, when the pair is of the route's kind: statistics mode within one framework, no module
    hierarchy (L1: no modules, no parameter gradients), both parts (inputs and outputs) in both dumps, and
    the same calls on both sides in the same order (so that pair.pair_records pairs each record with the
    golden's of its name: _Rows checks the rest, their rows)."""
    if judge.mode != "statistics" or judge.tail or judge.golden_tail or target.parents or golden.parents \
            or target.level != golden.level or target.roles() != golden.roles() \
            or target.roles() != {"input", "output"}:
        return None
    names, golden_names = t_tab.names, g_tab.names
    if not names or len(names) != len(golden_names):
        return None
    if rename_t is None:
        if names != golden_names:
            return None
    elif [rename_t(n) for n in names] != [rename_g(n) for n in golden_names]:
        return None
    for side in (names,) if rename_t is None else (names, golden_names):
        if any(n.startswith(("Module.", "Cell.")) or "parameters_grad" in n for n in side):
            return None
    return _Calls(names, golden_names)


class _Rows:
    """The rows of records that pair row for row (the same row names, in the same order), as columns, with
    the measures of metrics.stat_measures and metrics.magnitude computed by the same float operations.
    `ok`: a row pair that the columns judge (two tensors of equal shape and agreeing dtypes with finite
    statistics, or two equal scalar values); a record with any other row goes to Judge.judge."""

    def __init__(self, t_tab, g_tab, n: int):
        self.t_tab, self.g_tab = t_tab, g_tab
        t_counts, g_counts = np.diff(t_tab.first_row), np.diff(g_tab.first_row)
        self.same_count = t_counts == g_counts
        # row indices fit int32 (a dump.json of 2**31 rows would be hundreds of GB); half of int64's memory
        self.t = np.flatnonzero(np.repeat(self.same_count, t_counts)).astype(np.int32)
        self.g = np.flatnonzero(np.repeat(self.same_count, g_counts)).astype(np.int32)
        self.rec = np.repeat(np.arange(n, dtype=np.int32), np.where(self.same_count, t_counts, 0))
        t_code = {s: k for k, s in enumerate(t_tab.suffixes)}
        g_in_t = _array([t_code.get(s, -1) for s in g_tab.suffixes], np.int64)
        ok = t_tab.suffix[self.t] == g_in_t[g_tab.suffix[self.g]]
        ok &= ~_array([s.startswith(".parameters.") for s in t_tab.suffixes], bool)[t_tab.suffix[self.t]]
        tk, gk = t_tab.kind[self.t], g_tab.kind[self.g]
        self.tensor, value = (tk == 0) & (gk == 0), (tk == 2) & (gk == 2)
        self.input = t_tab.role[self.t] == 0
        ok &= self.tensor | value
        ok &= ~self.tensor | self._shapes()
        ok &= ~self.tensor | self._dtypes()
        # scalar arguments: equal value objects are one object (compare/table.py), so each pair of objects met
        # is judged once; `pair` numbers them, `pairs` holds them
        self.pair, self.pairs = np.full(len(self.t), -1), []
        scalars = np.flatnonzero(value & ok)
        t_objs = list(map(t_tab.objs.__getitem__, self.t[scalars].tolist()))
        g_objs = list(map(g_tab.objs.__getitem__, self.g[scalars].tolist()))
        seen: dict = {}  # (id, id) -> its number, in the order first met
        pair = np.array([seen.setdefault((id(t), id(g)), len(seen)) for t, g in zip(t_objs, g_objs)], dtype=np.int64)
        for i in np.unique(pair, return_index=True)[1].tolist():
            t_obj, g_obj = t_objs[i], g_objs[i]
            tv, gv = scalar_value(t_obj), scalar_value(g_obj)
            same = tv == gv or (isinstance(tv, float) and isinstance(gv, float) and tv != tv and gv != gv)
            self.pairs.append((t_obj, g_obj, same))
        ok[scalars] = np.array([same for _, _, same in self.pairs], dtype=bool)[pair]
        self.pair[scalars] = pair
        self.ok = ok
        self.t_grad = t_tab.grad[self.t] & self.tensor
        self.g_grad = g_tab.grad[self.g]
        self.err, self.values, self.g_size, self.t_size = (np.empty(len(self.t)) for _ in range(4))
        for lo in range(0, len(self.t), _CHUNK):  # a chunk at a time: the temporaries of a large pair stay small
            self._measure(lo, min(lo + _CHUNK, len(self.t)))
        ok &= ~self.tensor | self.finite
        del self.finite

    def _shapes(self):
        """Whether the two rows' shapes are equal (and countable exactly); their counts of values and roots."""
        code: dict = {}
        t_code = _array([code.setdefault(s, len(code)) for s in self.t_tab.shapes], np.int64)
        g_code = _array([code.setdefault(s, len(code)) for s in self.g_tab.shapes], np.int64)
        shapes = list(code)
        counts = [math.prod(s) if s is not None else 1 for s in shapes]
        usable = _array([s is not None and c < _EXACT_COUNT for s, c in zip(shapes, counts)], bool)
        self.shape_text = [report.cell(list(s)) if s is not None else None for s in shapes]
        self.t_shape, self.g_shape = t_code[self.t_tab.shape[self.t]], g_code[self.g_tab.shape[self.g]]
        self.numel = _array([float(c) if c < _EXACT_COUNT else 1.0 for c in counts], float)[self.g_shape]
        self.root = _array([math.sqrt(max(c, 1)) for c in counts], float)[self.g_shape]
        return (self.t_shape == self.g_shape) & usable[self.g_shape]

    def _dtypes(self):
        """Whether the two rows' dtypes agree as Judge._row has them (the same, or both floats, both
        integers); each pair's precision, and whether the golden's is a float. Each pair of dtypes once."""
        t_types, g_types = self.t_tab.dtypes, self.g_tab.dtypes
        pairs = [(t, g) for t in t_types for g in g_types]  # a few dtypes a side
        where = self.t_tab.dtype[self.t].astype(np.int64) * max(len(g_types), 1) + self.g_tab.dtype[self.g]
        self.eps = _array([max(eps_of(t), eps_of(g)) for t, g in pairs], float)[where]
        self.golden_float = _array([dtype_kind(g) == "float" for _, g in pairs], bool)[where]
        return _array([t == g or same_dtype(t) == same_dtype(g) or dtype_kind(t) == dtype_kind(g) in ("float", "int")
                       for t, g in pairs], bool)[where]

    def _measure(self, lo: int, hi: int) -> None:
        t, g = self._stats(lo, hi)
        if lo == 0:
            self.finite = np.empty(len(self.t), dtype=bool)
        self.finite[lo:hi] = _all4(np.isfinite(t)) & _all4(np.isfinite(g))
        diffs, rels = _differences(t, g)
        a = np.abs(diffs)
        root = self.root[lo:hi]
        with np.errstate(all="ignore"):
            # a row's largest of four, column by column: numpy's max(axis=1) over four is thirty times slower
            values = np.maximum(np.maximum(a[:, 0], a[:, 1]), a[:, 2])
            worst = np.maximum(values, a[:, 3])
            g_size, self.t_size[lo:hi] = _magnitude(g, root), _magnitude(t, root)
            err = np.where(g_size > 0, values / g_size, np.where(values != 0, np.inf, 0.0))
            err = np.where(rels[:, 3] != 0, np.maximum(err, rels[:, 3]), err)
            err = np.where(worst == np.inf, np.inf, err)
        self.err[lo:hi] = np.where(self.tensor[lo:hi] & (worst != 0), err, 0.0)
        self.values[lo:hi], self.g_size[lo:hi] = values, g_size

    def table_numbers(self, lo: int, hi: int):
        """The table's numbers of rows lo..hi: each statistic's difference and relative error, then both
        runs' statistics (computed again here, so that a large pair never holds them all)."""
        t, g = self._stats(lo, hi)
        return np.concatenate((*_differences(t, g), t, g), axis=1)

    def _stats(self, lo: int, hi: int) -> tuple:
        """Rows lo..hi's statistics on each side (take: a fancy index is several times slower)."""
        return self.t_tab.stats.take(self.t[lo:hi], axis=0), self.g_tab.stats.take(self.g[lo:hi], axis=0)

    def coarsest(self) -> float:
        """The coarsest precision of every tensor of both dumps (Judge's inner precision of every call at L1)."""
        return max(_coarsest(self.t_tab), _coarsest(self.g_tab))


def _coarsest(tab) -> float:
    eps = _array([eps_of(d) for d in tab.dtypes], float)
    tensors = tab.dtype[tab.kind != 2]
    return float(eps[tensors].max()) if tensors.size else 0.0


def _array(values: list, dtype) -> np.ndarray:
    """np.array of a list that may be empty (then one harmless element, never indexed)."""
    return np.array(values or [0], dtype=dtype)


def _differences(t, g) -> tuple:
    """metrics.stat_measures' differences and relative errors of the four statistics (rows of t against g)."""
    with np.errstate(all="ignore"):
        diffs = np.where(t == g, 0.0, t - g)
        return diffs, np.where(diffs == 0, 0.0, np.where(g != 0, np.abs(diffs) / np.abs(g), np.inf))


def _magnitude(stats, root):
    return np.maximum(np.maximum(np.abs(stats[:, 0]), np.abs(stats[:, 1])), np.abs(stats[:, 3] / root))


def _all4(flags) -> np.ndarray:
    """Whether each row of a C-ordered (rows, 4) bool array is all True: its four bytes read as one number."""
    return flags.view(np.uint32).ravel() == 0x01010101


def _segment_max(values, rec, n: int, default: float) -> np.ndarray:
    """The largest of `default` and each record's `values` (rows in record order, `rec` their records; NaN
    wins, as np.maximum has it). By segments (reduceat): np.maximum.at is ten times slower."""
    out = np.full(n, default)
    if len(rec):
        starts = np.flatnonzero(np.concatenate(([True], rec[1:] != rec[:-1])))
        at = rec[starts]
        with np.errstate(invalid="ignore"):  # NaN of rows that are not plain: their records are judged on their rows
            out[at] = np.maximum(out[at], np.maximum.reduceat(values, starts))
    return out


class _State:
    """Every record's measures and verdict, in order: what sequence.walk keeps as it goes."""

    def __init__(self, calls: _Calls, rows: _Rows, target, golden, judge, step, apis_asked: bool):
        self.calls, self.rows, self.target, self.golden = calls, rows, target, golden
        self.judge, self.step = judge, step
        n, r, d = calls.n, rows, calls.direction
        plain = np.bincount(r.rec[~r.ok], minlength=n) == 0
        self.regular = r.same_count & plain & ~calls.alone
        self.coarsest = r.coarsest()
        self.eps = np.maximum(_segment_max(r.eps, r.rec, n, 0.0), self.coarsest)
        self.row_err = self._noise_floor()
        self.data_err = _segment_max(np.where(r.tensor & r.input, self.row_err, 0.0), r.rec, n, 0.0)
        self.out_err = _segment_max(np.where(~r.input, self.row_err, 0.0), r.rec, n, 0.0)
        self.in_err = self.data_err.copy()
        backward_at = np.flatnonzero(d == BACKWARD)
        self.backward_before = np.arange(n) > (int(backward_at[0]) if backward_at.size else n)
        self.asked = ((d == FORWARD) & apis_asked & ~self.backward_before) | ((d == BACKWARD) & ~self.backward_before)
        self.forward_of = calls.forward_of
        self.verdicts: dict = {}   # record -> its Verdict, for every record that is not a plain pass
        self.row_dicts: dict = {}  # record -> its rows as Judge.judge made them (records judged on their rows)
        self._texts = None         # _per_record's
        self.native = True         # polars may run here (report.CsvSink's `native`)

    def pairs_alike(self) -> bool:
        """Whether pair.pair_records pairs the records that are not plain with the golden's of their name too:
        their signatures (tensors' roles, shapes and kinds of dtype) are the same (those of the plain ones are)."""
        c = self.calls
        return all(signature(c.names[k], self.target.rows(c.names[k])) ==
                   signature(c.golden_names[k], self.golden.rows(c.golden_names[k]))
                   for k in np.flatnonzero(~self.regular).tolist())

    def _noise_floor(self):
        """The rows' errors, where a gradient smaller than its inputs' rounding is measured against the largest
        golden magnitude of its record's float tensor inputs (Judge.judge)."""
        r, n = self.rows, self.calls.n
        float_in = r.tensor & r.input & r.golden_float
        size = _segment_max(np.where(float_in, r.g_size, 0.0), r.rec, n, 0.0)
        numel = _segment_max(np.where(float_in, r.numel, 1.0), r.rec, n, 1.0)
        noise = (TOLERANCE_EPS * self.eps * size)[r.rec]
        with np.errstate(all="ignore"):
            summed = np.sqrt(np.maximum(numel[r.rec] / np.maximum(r.numel, 1.0), 1.0))
            floor = noise * summed
            quiet = r.tensor & ~r.input & (self.calls.direction == BACKWARD)[r.rec] & (noise > 0) & \
                (r.g_size < floor) & (r.t_size < 4 * floor) & (r.err != np.inf)
            return np.where(quiet, np.minimum(r.err, r.values / (size[r.rec] * summed)), r.err)

    def stack(self, name: str) -> list:
        stacks = self.target.stacks
        return (stacks.get(name) or stacks.get(place_of(name)) or []) if stacks else []

    def _upstream(self, k: int) -> float:
        """What a backward record also depends on: its forward call's input difference, if judged before it."""
        j = int(self.forward_of[k])
        return float(self.in_err[j]) if j >= 0 else 0.0

    def judge_irregular(self) -> None:
        """The records that are not plain, one by one on their rows, in order: each with the largest output
        difference of the records before it, the plain ones' from the columns, these ones' as judged."""
        c, d = self.calls, self.calls.direction
        seen = {direction: np.maximum.accumulate(np.where(self.regular & (d == direction), self.out_err, 0.0))
                for direction in (FORWARD, BACKWARD)}
        more = {FORWARD: 0.0, BACKWARD: 0.0}
        nonfinite_first = None
        for k in np.flatnonzero(~self.regular).tolist():
            before = {x: max(float(seen[x][k - 1]) if k else 0.0, more[x]) for x in (FORWARD, BACKWARD)}
            direction, name = int(d[k]), c.names[k]
            after = None if direction != FORWARD or not self.backward_before[k] else \
                "differs" if max(before.values()) > 0 else "clean"
            rows, verdict = self.judge.judge(Pair(name, c.golden_names[k], "exact"), self.target, self.golden,
                                             one_line(self.stack(name)), self.coarsest, self._upstream(k),
                                             before[FORWARD] if self.asked[k] else None, NO_GRAD_INPUTS, None, 0,
                                             after)
            if verdict.nonfinite_in or verdict.nonfinite_out:
                nonfinite_origin(verdict, self.target, name, self.step, nonfinite_first is not None,
                                  direction == FORWARD and not self.backward_before[k])
                nonfinite_first = nonfinite_first or name
            self.verdicts[k], self.row_dicts[k] = verdict, rows
            self.in_err[k], self.out_err[k], self.eps[k] = verdict.in_err, verdict.out_err, verdict.eps
            if direction in more:
                more[direction] = max(more[direction], verdict.out_err)

    def judge_regular(self) -> None:
        """The plain records: their state from the columns; a verdict from the judge for each that may not pass."""
        c, r, n, d = self.calls, self.rows, self.calls.n, self.calls.direction
        # a plain backward record's input difference: its forward call's too, when that was judged before it
        backward = np.flatnonzero(self.regular & (self.forward_of >= 0))
        self.in_err[backward] = np.maximum(self.in_err[backward], self.in_err[self.forward_of[backward]])
        seen = {x: np.concatenate(([0.0], np.maximum.accumulate(np.where(d == x, self.out_err, 0.0))[:-1]))
                for x in (FORWARD, BACKWARD)}
        self.after_backward = (d == FORWARD) & self.backward_before
        differs = np.maximum(seen[FORWARD], seen[BACKWARD]) > 0
        tol = TOLERANCE_EPS * self.eps
        # every rule of Judge asks for an output beyond the tolerance, or (first seen) inputs beyond what the
        # earlier calls explain: the records that may not pass are within these, and each gets the judge's verdict
        may_not_pass = self.regular & ((self.out_err > tol) | (
            self.asked & (self.data_err > np.maximum(4 * tol, AMPLIFICATION * seen[FORWARD]))))
        needs_grad = _segment_max(r.t_grad.astype(float), r.rec, n, 0.0) > 0
        # Judge.judge's data_at: the tensor input that differs most, the last of equals
        inputs = r.tensor & r.input
        most = np.flatnonzero(inputs & (self.row_err == self.data_err[r.rec]))
        data_at = np.full(n, -1)
        last = np.flatnonzero(np.concatenate((r.rec[most][1:] != r.rec[most][:-1], [True]))) if most.size else most
        data_at[r.rec[most[last]]] = most[last]  # rows in record order: a record's last is its largest
        tab = r.t_tab
        for k in np.flatnonzero(may_not_pass).tolist():
            after = None if not self.after_backward[k] else "differs" if differs[k] else "clean"
            at = int(data_at[k])
            data = (float(self.row_err[at]), tab.suffixes[int(tab.suffix[r.t[at]])], bool(r.g_grad[at])) \
                if at >= 0 else (0.0, "", False)
            verdict = self.judge.measured(c.names[k], self.target, float(self.in_err[k]), float(self.out_err[k]),
                                          float(self.eps[k]), float(seen[FORWARD][k]) if self.asked[k] else None,
                                          after, data, bool(needs_grad[k]), int(d[k]) == BACKWARD)
            if verdict.result != PASS or verdict.reasons:
                self.verdicts[k] = verdict

    def walked(self) -> Walk:
        c, n, d = self.calls, self.calls.n, self.calls.direction
        result = np.zeros(n, dtype=np.int8)
        comparable = np.ones(n, dtype=bool)
        for k, v in self.verdicts.items():
            result[k], comparable[k] = _RESULT[v.result], v.comparable
        counts = {PASS: int((result == 0).sum()), WARNING: int((result == 1).sum()),
                  ERROR: int((result == 2).sum()), "unmatched_target": 0, "unmatched_golden": 0}
        model = ~self.after_backward
        departing_at = model & comparable & (self.out_err > np.maximum(TOLERANCE_EPS * self.eps,
                                                                       AMPLIFICATION * self.in_err))
        departing = {c.names[k]: (float(self.in_err[k]), float(self.out_err[k]))
                     for k in np.flatnonzero(departing_at).tolist()}
        finite = self.out_err[model & np.isfinite(self.out_err)]
        largest = max(0.0, float(finite.max())) if finite.size else 0.0
        walked = Walk(counts, self.out_err.tolist(), {}, departing, largest, paired_forward=int((d == FORWARD).sum()))
        first: dict = {}
        for k in sorted(self.verdicts):
            v = self.verdicts[k]
            warned = first_warning_kind(v, d[k] == FORWARD and self.backward_before[k])
            slots = [slot for slot, hit in (("first", v.introduced),
                                            ("first_error", v.result == ERROR and not files_only(v)),
                                            ("first_warning", warned), ("first_seen", v.first_seen))
                     if hit and slot not in first]
            if not slots:
                continue
            name = c.names[k]
            found = found_call(name, c.golden_names[k], v, self.stack(name), self.target)
            columns = self.judge.columns
            walked.named_rows[name] = [{key: row[columns.index(key)] for key in html_report.CALL_COLUMNS}
                                       for row in self._record_lines(k, columns)]
            first.update(dict.fromkeys(slots, found))
            if "first" in slots:
                walked.first_at = k
        walked.first, walked.first_error = first.get("first"), first.get("first_error")
        walked.first_warning, walked.first_seen = first.get("first_warning"), first.get("first_seen")
        return walked

    # -- the table -----------------------------------------------------------------------------------------
    def write(self, sink, columns: list) -> None:
        """The table, in record order: the plain records' rows as blocks of columns, the others' as lines."""
        r, n = self.rows, self.calls.n
        start = np.searchsorted(r.rec, np.arange(n + 1))
        k = 0
        for stop in np.flatnonzero(~self.regular).tolist() + [n]:
            while k < stop:  # plain records k..stop, a block at a time
                upto = int(start[min(stop, k + _BLOCK)]) if k + _BLOCK < stop else int(start[stop])
                sink.add_block(self._block(int(start[k]), upto, columns))
                k = min(stop, k + _BLOCK)
            if stop < n:
                sink.add_lines([tuple(row[key] for key in columns) for row in self.row_dicts[stop]])
                k = stop + 1

    def _record_lines(self, k: int, columns: list) -> list:
        """Record k's lines, values in column order, for report.html (shapes as the table's text)."""
        if k in self.row_dicts:
            return [tuple(row[key] for key in columns) for row in self.row_dicts[k]]
        r = self.rows
        lo, hi = (int(x) for x in np.searchsorted(r.rec, [k, k + 1]))
        lines = self._block(lo, hi, columns).lines(columns)
        # the names and dtypes as the judge has them (the block's are the table's cells: '=... for a formula)
        raw = zip((self.calls.names[k] + r.t_tab.suffixes[s] for s in r.t_tab.suffix[r.t[lo:hi]].tolist()),
                  (self.calls.golden_names[k] + r.g_tab.suffixes[s] for s in r.g_tab.suffix[r.g[lo:hi]].tolist()),
                  (r.t_tab.dtypes[d] for d in r.t_tab.dtype[r.t[lo:hi]].tolist()),
                  (r.g_tab.dtypes[d] for d in r.g_tab.dtype[r.g[lo:hi]].tolist()))
        return [(*names, *line[4:]) for names, line in zip(raw, lines)]

    def _block(self, lo: int, hi: int, columns: list) -> report.Block:
        """Rows lo..hi, all of plain records, as Judge._row and Judge._finish_rows make them."""
        r = self.rows
        t_tab, g_tab = r.t_tab, r.g_tab
        rec = r.rec[lo:hi]
        t_rows, g_rows = r.t[lo:hi], r.g[lo:hi]
        per_record, gather, joined = self._per_record(), _gather[self.native], _joined[self.native]
        texts = dict(zip(columns[:6], (
            joined(gather(per_record["names"], rec), gather(per_record["t_suffixes"], t_tab.suffix[t_rows])),
            joined(gather(per_record["golden_names"], rec), gather(per_record["g_suffixes"], g_tab.suffix[g_rows])),
            gather(per_record["t_dtypes"], t_tab.dtype[t_rows]), gather(per_record["g_dtypes"], g_tab.dtype[g_rows]),
            gather(per_record["shapes"], r.t_shape[lo:hi]), gather(per_record["shapes"], r.g_shape[lo:hi]))))
        texts.update((column, gather(per_record[column], rec)) for column in columns[-3:])
        numbers = r.table_numbers(lo, hi)
        number_columns = columns[6:-3]
        empty = np.zeros(numbers.shape, dtype=bool)
        cells: dict = {}
        # a scalar argument: no measures, its value where a tensor's Max goes; each pair of objects done once
        scalars = np.flatnonzero(~r.tensor[lo:hi])
        empty[scalars, :8] = True
        pair = r.pair[lo:hi][scalars]
        for at in np.unique(pair).tolist():
            lines = scalars[pair == at]
            t, g, _ = r.pairs[at]
            for j, v in enumerate((t.get("Max", t.get("value")), t.get("Min"), t.get("Mean"), t.get("Norm"),
                                   g.get("Max", g.get("value")), g.get("Min"), g.get("Mean"), g.get("Norm")), 8):
                if v.__class__ is float:
                    numbers[lines, j] = v
                elif v is None:
                    empty[lines, j] = True
                else:
                    cells.setdefault(number_columns[j], {}).update(dict.fromkeys(lines.tolist(), v))
        return report.Block(texts, numbers, number_columns, empty, cells)

    def _per_record(self) -> dict:
        """Each record's names and verdict cells, and the texts gathered from them, as the table's cells (a
        name's first character is its row's): gathered, they need nothing more. Made once."""
        if self._texts is None:
            c, columns = self.calls, self.judge.columns
            results, messages = [PASS] * c.n, [None] * c.n
            for k, v in self.verdicts.items():
                results[k], messages[k] = v.result, report.text("; ".join(v.reasons))
            few = {"shapes": self.rows.shape_text, "t_dtypes": list(map(report.text, self.rows.t_tab.dtypes)),
                   "g_dtypes": list(map(report.text, self.rows.g_tab.dtypes)), "t_suffixes": self.rows.t_tab.suffixes,
                   "g_suffixes": self.rows.g_tab.suffixes, columns[-3]: results, columns[-2]: messages}
            many = {"names": c.names, "golden_names": c.golden_names,
                    columns[-1]: [one_line(self.stack(name)) for name in c.names] if self.target.stacks else None}
            if self.native:
                import polars as pl

                self._texts = {key: pl.Series(values, dtype=pl.Utf8) for key, values in few.items()}
                self._texts.update({key: pl.repeat(None, c.n, dtype=pl.Utf8, eager=True) if values is None
                                    else report.as_cells(pl.Series(values, dtype=pl.Utf8))
                                    for key, values in many.items()})
            else:
                self._texts = dict(few, **{key: [None] * c.n if values is None else list(map(report.text, values))
                                           for key, values in many.items()})
        return self._texts


def _gather_series(values, codes):
    return values.gather(codes)


def _gather_list(values: list, codes) -> list:
    return [values[i] for i in codes.tolist()]


def _joined_series(a, b):
    import polars as pl

    return pl.select(pl.concat_str([a, b])).to_series()


def _joined_lists(a: list, b: list) -> list:
    return [x + y for x, y in zip(a, b)]


# polars, or lists where it must not run (report.CsvSink's `native`)
_gather = {True: _gather_series, False: _gather_list}
_joined = {True: _joined_series, False: _joined_lists}
