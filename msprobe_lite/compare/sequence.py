"""Judging a step's calls in execution order: what carries from one call to the next.

A call is judged against what came before it: how far the earlier calls' outputs already differ (which explains
its inputs), its forward call's inputs (for a backward), the calls made inside a module before its record, whether
the backward pass has begun. `walk` goes through the pairs once, judges each (judge.Judge), writes its rows and
keeps the first call of each kind that the answer names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.naming import counterpart
from . import html_report, nonfinite, report, tensors
from .judge import (AMPLIFICATION, ERROR, NO_GRAD_INPUTS, PASS, TOLERANCE_EPS, UNMATCHED, WARNING, files_only,
                    worse)
from .metrics import eps_of
from .pair import dtype_kind, is_module, split_name
from .rows import INPUT, OUTPUT, params_grad_owner


@dataclass
class Walk:
    """What judging a step's pairs in order found (api._compare_one turns it into the summary)."""
    counts: dict
    errors: list = field(default_factory=list)       # each paired call's output difference, in order
    modules: dict = field(default_factory=dict)      # module -> (worst output difference, worst result)
    departing: dict = field(default_factory=dict)    # call -> (input, output difference): outputs beyond 10x
    largest: float = 0.0       # the largest output difference of the model's calls (not the updates after)
    named_rows: dict = field(default_factory=dict)   # call named by the answer -> its rows, for report.html
    first_at: int | None = None   # the first divergence's place in `errors`
    first: dict | None = None
    extra: dict | None = None
    missing_call: dict | None = None
    left_out: int = 0
    paired_forward: int = 0
    first_error: dict | None = None
    first_warning: dict | None = None
    first_seen: dict | None = None
    rows: list = field(default_factory=list)         # every row, kept only for the .xlsx


def place_of(name: str) -> str:
    """The record whose stack and parents say where `name` happened in the code: a backward call's forward
    call; a module's parameter gradients' first call of the module (they are summed over its calls)."""
    owner = params_grad_owner(name)
    return f"{owner}.forward.0" if owner else counterpart(name)


def _module_of(dump, name):
    parent = dump.parents.get(name)
    if is_module(name):
        return name
    return parent if isinstance(parent, str) else None


def _upstream(name: str, seen_err: dict) -> float:
    """What a record depends on besides its own inputs: a backward call depends on its forward call's
    inputs; parameter gradients depend on every call of their module."""
    base, direction, index = split_name(name)
    if direction == "backward":
        return seen_err.get((base, "forward", index), 0.0)
    owner = params_grad_owner(name)
    if owner:  # a module never called itself (its weight used directly): all so far
        return seen_err.get(owner, seen_err.get("*", 0.0))
    return 0.0


def one_line(frames: list) -> str:
    return " | ".join(f.replace(", \n ", ": ") for f in frames)


def _changes_numbers(dump, name: str) -> bool:
    """Whether a call could make two runs' numbers part if one left it out: not one on integers only (a
    counter: BatchNorm's num_batches_tracked += 1), nor one whose every output has the statistics of one of
    its inputs (a copy or a view: `.contiguous()`, `.clone()`, `.detach()`, a reshape, dropout in eval), which
    a port may drop without changing a value."""
    tensors = [row for row in dump.rows(name) if row.is_tensor]
    if not any(dtype_kind(row.dtype) == "float" for row in tensors):
        return False
    given = [row for row in tensors if row.role == INPUT]
    made = [row for row in tensors if row.role == OUTPUT]
    return not made or not given or any(not any(_same_values(o, i) for i in given) for o in made)


def _same_values(a, b) -> bool:
    """Statistics of one tensor's values, read in another order or layout: Max and Min equal, Mean and Norm
    within their summation's rounding (a transposed tensor and its contiguous copy sum in other orders)."""
    x, y = a.obj, b.obj
    if a.dtype != b.dtype or x.get("Max") != y.get("Max") or x.get("Min") != y.get("Min"):
        return False
    try:
        scale, tol = max(abs(x["Max"]), abs(x["Min"])), TOLERANCE_EPS * eps_of(a.dtype)
        return abs(x["Mean"] - y["Mean"]) <= tol * scale and abs(x["Norm"] - y["Norm"]) <= tol * abs(y["Norm"])
    except (KeyError, TypeError):  # md5 mode, statistics not taken: equal Max and Min are all there is
        return x == y


def _left_out_by_level(name: str, target_level: str, golden_level: str) -> bool:
    """A record of a kind that the other dump's level does not record: a module's against an L1 dump, an
    API call's against an L0 one. Unmatched by design (see _levels), not a call added in the target."""
    other = golden_level if target_level == "mix" else None
    return (other == "L1" and is_module(name)) or (other == "L0" and not is_module(name))


def _forward_pass_bounded(dump) -> bool:
    """Whether the forward pass's API calls can be told from the optimizer's: a backward record marks where
    the forward pass ends. A dump without one (data_mode ["forward"]) of a run that trains (a tensor requires
    grad) holds the optimizer's calls with nothing before them to say so, and their inputs are gradients."""
    if any(split_name(name)[1] == "backward" for name in dump.records):
        return True
    return not any(requires_grad(record) for record in dump.records.values())


def requires_grad(value) -> bool:
    if isinstance(value, dict):
        return value.get("requires_grad") is True or any(requires_grad(v) for v in value.values())
    if isinstance(value, list):
        return any(requires_grad(v) for v in value)
    return False


def _unpaired_forward(pair, target_level: str, golden_level: str) -> bool:
    """A forward call of either dump that paired with nothing, other than one the other level never records."""
    if pair.target and pair.golden:
        return False
    name, mine, other = (pair.target, target_level, golden_level) if pair.target else \
        (pair.golden, golden_level, target_level)
    return split_name(name)[1] == "forward" and not _left_out_by_level(name, mine, other)


def nonfinite_origin(verdict, target, name, step, follows: bool, forward_pass: bool) -> None:
    """The step's first NaN/Inf that only the target holds decides (compare/nonfinite.py): a forward call
    taking it as an input, made by no earlier call, is where it came in (a weight: the first divergence;
    input data: the first error); a call after it that makes NaN/Inf from finite inputs only follows from it."""
    if follows:
        verdict.introduced = verdict.introduced and not verdict.nonfinite_out
    elif verdict.nonfinite_in and forward_pass:
        reason, weight = nonfinite.origin(target, name, verdict.nonfinite_in, step)
        verdict.introduced = weight
        verdict.result = ERROR
        verdict.reasons = [reason]


def first_warning_kind(verdict, after_backward: bool) -> bool:
    """Whether a warning may be the answer's first warning: not an amplification after the backward pass (the
    optimizer's update from a gradient that is zero in exact arithmetic, attention's key bias, a bias before
    BatchNorm, is rounding noise that Adam scales to a full step: in the table only; a setting that differs
    still is one)."""
    return verdict.result == WARNING and verdict.comparable and not (
        after_backward and all(r.startswith(("amplified", "aligned with")) for r in verdict.reasons))


def found_call(name: str, golden_name: str, verdict, stack: list, target) -> dict:
    """A call the answer names: summary.json's first_divergence, first_error, first_warning, first_seen."""
    return {"name": name, "golden_name": golden_name, "reason": "; ".join(verdict.reasons), "stack": stack,
            "parents": target.parent_chain(name) or target.parent_chain(place_of(name)),
            "input_difference": verdict.in_err, "output_difference": verdict.out_err}


def walk(pairs, target, golden, judge, inner: dict, sink, step, across: bool, xlsx: bool,
         show_progress: bool) -> Walk:
    """Judge `pairs` in order (`inner`: record -> the coarsest precision inside it), writing each record's rows
    to `sink`."""
    rows, errors, modules = [], [], {}   # rows: kept only for the .xlsx
    seen_err: dict = {}   # input error of calls already judged: backward records depend on them
    # module record -> the largest input difference of the calls made inside it so far (recorded before it):
    # its own parameters are in its record, those of its children are not, and drift there explains it
    inside: dict = {}
    counts = {PASS: 0, WARNING: 0, ERROR: 0, "unmatched_target": 0, "unmatched_golden": 0}
    departing = {}  # model call -> (input, output difference): outputs beyond ten times their inputs'
    largest = 0.0   # the largest output difference of the model's calls (not the updates after the backward)
    named_rows = {}  # call named by the answer -> its rows, for report.html
    first_at = None  # the first divergence's place in `errors`
    first = extra = None  # extra: the first call only in the target, when it comes before any divergence
    # missing_call: the first forward call only in the golden before any divergence that the target left out:
    # between two paired forward calls, with no call only in the target in that gap (one there replaced it: a
    # MindSpore port runs nn.Dense as MatMul and BiasAdd where PyTorch runs one linear). A filtered target
    # leaves many out (a `list`), or only around its range (a `scope`): named only when at most a tenth of the
    # paired forward calls (or 3) are left out so in all
    missing_call, left_out, paired_forward = None, 0, 0
    gap, gap_clean = [], True  # the golden-only forward calls since the last paired one; none only in the target
    # the target-only forward calls since the last paired one: across frameworks, where API calls that do not pair
    # are routine, they are named only when the very next call's inputs are the first to differ (a port's extra op)
    t_gap = []
    first_error = None    # the first error of any kind: said when no call introduced a divergence
    first_warning = None  # the first warning (an amplification): said when nothing above is
    first_seen = None     # the first call whose inputs differ more than earlier outputs explain: said after that
    # the largest output (input) difference of the calls of each direction judged so far
    out_seen, in_seen = {"forward": 0.0, "backward": 0.0}, {"forward": 0.0, "backward": 0.0}
    unpaired_before = 0   # forward calls of either dump so far that paired with nothing (not by design)
    backward_begun = False  # a backward record came: later forward calls are the optimizer's and the like
    apis_asked = _forward_pass_bounded(target)
    # module record -> out_seen["forward"] when the first call inside it was judged (mix: its calls come before it);
    # what explains a module's inputs and parameters is what ran before it, not inside it
    before_inside: dict = {}
    grad_inputs: dict = {}  # module -> (largest magnitude, largest size, coarsest eps) of its backward records' inputs
    # a part that data_mode left out of either dump: what stands in for it is what the earlier calls of the same
    # direction hold. Inputs not dumped: the largest output difference of the calls before (their outputs are
    # what later calls take); outputs not dumped: the largest input difference of the calls before
    held = target.roles() & golden.roles()
    missing = None if not held or held == {INPUT, OUTPUT} else "inputs" if INPUT not in held else "outputs"
    bar = tensors.Progress("judging calls") if show_progress else None
    nonfinite_first = None  # the first record that took or made NaN/Inf where the golden's is finite
    for i, pair in enumerate(pairs):
        # a backward record's place in the code is its forward call's
        stack = (target.stacks.get(pair.target) or target.stacks.get(place_of(pair.target)) or []) \
            if pair.target else []
        upstream = max(_upstream(pair.target, seen_err), inside.get(pair.target, 0.0)) if pair.target else 0.0
        base, direction, index = split_name(pair.target) if pair.target else (None, None, None)
        if missing == "inputs" and direction in out_seen:  # a backward computes from its forward's values too
            upstream = max(upstream, out_seen[direction], out_seen["forward"])
        # whether its inputs differ more than earlier outputs explain: asked of module calls, and of the forward
        # pass's API calls (an API call's weights are among its arguments: one loaded wrongly, or moved
        # differently by earlier steps, shows there, as do input data that differ). Calls after the backward
        # pass (the optimizer's, gradient clipping) take gradients, whose noise only the backward records'
        # judging knows: not asked, nor where no backward record marks the forward pass's end
        # (_forward_pass_bounded). The step's first backward record is asked too: the
        # gradients flowing into it come from the loss and from what ran after it in the forward pass, which a
        # `scope` or `list` left out of the dump (gradients entering a scope already different).
        owner = params_grad_owner(pair.target) if pair.target else None
        chain = target.parent_chain(pair.target) if pair.target else []
        asked = (direction == "forward" and (is_module(pair.target) or (apis_asked and not backward_begun))) or \
            (direction == "backward" and not backward_begun and pair.golden is not None)
        backward_begun_before = backward_begun
        backward_begun = backward_begun or direction == "backward"
        if direction == "forward":
            for parent in chain:
                before_inside.setdefault(parent, out_seen["forward"])
        if missing == "outputs":  # every call: its inputs against those of the calls before it
            explained = in_seen.get(direction)
        else:
            explained = before_inside.get(pair.target, out_seen["forward"]) if asked else None
        # after the backward pass (the optimizer's update) a call amplifies what already differs before it
        after_backward = None if direction != "forward" or not backward_begun_before else \
            "differs" if max(out_seen.values()) > 0 or extra is not None or unpaired_before > 0 else "clean"
        record_rows, verdict = judge.judge(pair, target, golden, one_line(stack), inner.get(pair.target, 0.0),
                                           upstream, explained, grad_inputs.get(owner, NO_GRAD_INPUTS), missing,
                                           unpaired_before, after_backward)
        if verdict.nonfinite_in or verdict.nonfinite_out:
            # at mix a module's record follows the calls inside it: one of those was before it, not earlier
            follows = nonfinite_first is not None and pair.target not in target.parent_chain(nonfinite_first)
            # where no earlier call could have made it unseen: outputs dumped, no call of one run only before
            seen_all = missing != "outputs" and extra is None and not unpaired_before
            nonfinite_origin(verdict, target, pair.target, step, follows, direction == "forward"
                              and not backward_begun_before and seen_all)
            nonfinite_first = nonfinite_first or pair.target
        # a forward call that paired with nothing (not by the levels' design): what it made is in no out_seen
        lone = verdict.result == UNMATCHED and _unpaired_forward(pair, target.level, golden.level)
        if direction in out_seen and verdict.result != UNMATCHED:
            out_seen[direction] = max(out_seen[direction], verdict.out_err)
            in_seen[direction] = max(in_seen[direction], verdict.in_err)
        # a golden-only call before the first paired one is outside a scoped target's range, not a call the
        # target left out: "38 earlier forward calls did not pair" cast doubt on a scoped compare's answer
        unpaired_before += lone and (pair.target is not None or paired_forward > 0)
        if direction == "backward":  # its module's parameter gradients come after it
            size, count, eps = grad_inputs.get(base, NO_GRAD_INPUTS)
            grad_inputs[base] = (max(size, verdict.inputs_size), max(count, verdict.inputs_numel),
                                 max(eps, verdict.eps))
        if pair.target:
            seen_err[(base, direction, index)] = verdict.in_err
            seen_err[base] = max(seen_err.get(base, 0.0), verdict.in_err)
            seen_err["*"] = max(seen_err.get("*", 0.0), verdict.in_err)
            for parent in chain:
                if inside.get(parent, 0.0) < verdict.in_err:
                    inside[parent] = verdict.in_err
        sink.add(record_rows)
        if xlsx:
            rows.extend(record_rows)
        if bar and i % 200 == 0:
            bar(i, len(pairs))
        if across and verdict.first_seen and first is None and extra is None and t_gap:
            extra = {"name": t_gap[0], "stack": target.stacks.get(t_gap[0], []),
                     "parents": target.parent_chain(t_gap[0]),
                     "reason": f"only in the target ({', '.join(t_gap)}), just before {pair.target}, whose inputs "
                               f"are the first to differ"}
        if verdict.result == UNMATCHED:
            if pair.target and direction == "forward":
                t_gap.append(pair.target)
            counts["unmatched_target" if pair.target else "unmatched_golden"] += 1
            # across frameworks, API calls that do not pair are routine (nn.Dense is MatMul and BiasAdd): the
            # call named is the first module or cell only in the target (a GELU where the golden has a ReLU)
            # nor one of the kind that the other dump's level does not record (a module against an L1 dump)
            if pair.target and first is None and extra is None and (not across or is_module(pair.target)) \
                    and not _left_out_by_level(pair.target, target.level, golden.level):
                extra = {"name": pair.target, "stack": stack, "parents": target.parent_chain(pair.target)}
            if lone and not pair.target and paired_forward:
                if _changes_numbers(golden, pair.golden):  # not .contiguous(), not a counter's += 1
                    gap.append(pair.golden if first is None else None)
            elif lone:
                gap_clean = False
            continue
        if direction == "forward":
            paired_forward += 1
            t_gap = []
            if gap and gap_clean:  # the target went from the call before the gap straight to this one
                left_out += len(gap)
                if missing_call is None and gap[0] is not None:
                    missing_call = {"name": gap[0], "stack": golden.stacks.get(gap[0], []),
                                    "parents": golden.parent_chain(gap[0])}
            gap, gap_clean = [], True
        counts[verdict.result] += 1
        errors.append(verdict.out_err)
        if after_backward is None and verdict.comparable and \
                verdict.out_err > max(TOLERANCE_EPS * verdict.eps, AMPLIFICATION * verdict.in_err):
            departing[pair.target] = (verdict.in_err, verdict.out_err)
        if after_backward is None and math.isfinite(verdict.out_err):
            largest = max(largest, verdict.out_err)
        module = _module_of(target, pair.target)
        if module:
            worst, result = modules.get(module, (0.0, PASS))
            modules[module] = (max(worst, verdict.out_err), worse(verdict.result, result))
        warned = first_warning_kind(verdict, direction == "forward" and backward_begun)
        # a record that errs only for a tensor file not read is said apart (console_line), not as the first error
        counts_as_error = verdict.result == ERROR and not files_only(verdict)
        if (first is None and verdict.introduced) or (first_error is None and counts_as_error) or \
                (first_seen is None and verdict.first_seen) or (first_warning is None and warned):
            found = found_call(pair.target, pair.golden, verdict, stack, target)
            named_rows[pair.target] = [{k: row.get(k) for k in html_report.CALL_COLUMNS} for row in record_rows]
            if first is None and verdict.introduced:
                first = found
                first_at = len(errors) - 1
                erred = first_error if first_error and pair.target in first_error["parents"] else None
                if erred and is_module(pair.target):  # mix: a call inside it erred first (NaN from a -inf row)
                    found["reason"] += f"; inside it, {erred['name']} erred first: {erred['reason']}{report.at(erred)}"
            if first_error is None and counts_as_error:
                first_error = found
            if first_warning is None and warned:
                first_warning = found
            if first_seen is None and verdict.first_seen:
                first_seen = found
    if bar:
        bar.close()
    return Walk(counts, errors, modules, departing, largest, named_rows, first_at, first, extra, missing_call,
                left_out, paired_forward, first_error, first_warning, first_seen, rows)
