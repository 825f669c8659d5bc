"""Judging a pair of records: each row gets its measures, each record a Result and its reasons.

Rules (spec/compare.md), with inputs = args, kwargs, parameters and outputs = results:
- error: the target's output holds NaN/Inf where the golden's is finite;
- error: the call *introduced* the divergence:
  - its inputs agree and an output differs by more than the tolerance plus 10x the inputs' difference, and
    by more than 4 tolerances when the inputs are not exactly equal (a matmul turns drifted weights' 2e-7
    into 5e-6 by rounding alone), 64 at a step after the first (every weight drifted);
  - or a scalar argument differs by more than 10x its tensors do (a setting, not a value computed from
    drifted data) and an output by more than the inputs' difference plus the tolerance, however far the
    inputs drifted; for a setting that is not a number (a string, a flag), an output beyond the tolerance;
  - or the spec's coarser rule: inputs within 0.1, an output beyond 0.5.
  "Agree" follows the dtypes compared: within 16 machine epsilons of the coarser dtype (so a 1e-4 change in
  one fp32 op is caught, while bf16 against fp32 is not called divergent everywhere);
- warning: the inputs already differ and an output differs more than 10x as much (the call amplified it);
  or the inputs agree and an output beyond the tolerance differs more than 2x as much as they do;
- tensor mode adds: error when inputs' One Thousandth ratio > 0.9 and an output's < 0.1; warning when the
  inputs' cosine > 0.9 and an output's cosine is more than 0.1 lower;
- error: shapes differ; dtypes differ when they are not both floating (bf16 vs fp32 is expected);
- records or rows on one side only are `unmatched`, never pass.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from . import defaults, nonfinite, quantities
from .dtypes import same_dtype_constant
from .metrics import STATS, eps_of, finite, magnitude, noise_error, numel, stat_error, stat_measures
from .pair import dtype_kind, is_module, split_name
from .rows import INPUT, OUTPUT, params_grad_owner
from .tensors import UNWRITTEN

PASS, WARNING, ERROR, UNMATCHED = "pass", "warning", "error", "unmatched"
_RANK = {PASS: 0, WARNING: 1, ERROR: 2, UNMATCHED: 3}
TOLERANCE_EPS = 16       # inputs "agree" within this many epsilons of the coarser dtype
AMPLIFICATION = 10
# inputs that agree, an output beyond the tolerance but not by more than the inputs' difference plus the
# tolerance (not introduced): still said when the output differs this many times more than the inputs
AMPLIFICATION_OF_AGREEING = 2
DRIFT_MARGIN = 4         # inputs within the tolerance but not equal: an output beyond this many tolerances
# ... and this many times more at a later step, where every weight drifted with the earlier steps' updates:
# statistics see the drift only in part (an element can move more than Max/Min/Mean/Norm show), so a
# normalisation amplifies a drift they hardly show, ahead of the call whose setting really differed
LATER_STEP_DRIFT = 16

# a row of a part (inputs, outputs) that the other dump holds for no call: left out by data_mode
NOT_DUMPED = "not dumped in %s (it holds no call's rows of this kind: a data_mode filter)"
# across frameworks, a scalar argument of one side only: the APIs spell the same call differently (PyTorch's
# F.relu passes inplace=False, MindSpore's cross_entropy passes by position what PyTorch passes by keyword)
ONE_FRAMEWORKS_ARGUMENT = "an argument of the %s's framework only"
# across frameworks, a tensor of one side only: MindSpore's LayerNorm and BatchNorm return their batch statistics
# beside the result, PyTorch's layer_norm and batch_norm the result alone
ONE_FRAMEWORKS_VALUE = "a value of the %s's framework only"
# problems that are a row's own result (unmatched), not its call's: these three, and a row of one side only
_ROWS_OWN = tuple(template.split("%s")[0] for template in (NOT_DUMPED, ONE_FRAMEWORKS_ARGUMENT, ONE_FRAMEWORKS_VALUE))
_ROW_ONLY = "row only in "
# a rank's parameter gradients are read after the backward pass, once DDP (or the user's all-reduce) has
# combined them across ranks: a rank that computed the same gradients as its golden gets another rank's difference
ACROSS_RANKS = ("one rank of a distributed run: parameter gradients are read after the backward pass, when DDP's "
                "all-reduce (no record) has averaged them across ranks, so a difference made on another rank shows "
                "here first; see the other ranks' lines")
ACROSS_RANKS_COLLECTIVE = ("one rank of a distributed run: a collective's result holds the other ranks' values, "
                           "so a difference made on another rank comes in here while this rank's inputs agree; "
                           "see the other ranks' lines (when every rank names this call, the collective itself "
                           "differs)")
ACROSS_RANKS_WEIGHTS = ("one rank of a distributed run: earlier steps updated the weights from gradients that "
                        "DDP's all-reduce (no record) averaged across ranks, so a difference made on another rank "
                        "reaches them; see the other ranks' lines")
_WEIGHTS_DIFFER = ("the weights are not the golden's (converted, loaded or initialised differently), or earlier "
                   "steps updated them differently")
_EARLIER_STEP = ("at a step after the first, the earlier steps' updates are the usual cause: compare the first step "
                 "(step 0) and read its line")
_WEIGHT_ARGUMENT_DIFFERS = _WEIGHTS_DIFFER + (" (or, for an input made to require grad, the input data or code "
                                              "that is not recorded)")
# why the gradients flowing into the step's first backward record differ more than the forward pass explains
_GRADIENTS_CAME_IN = ("they come from the loss and from what ran after this call in the forward pass, which this "
                      "dump does not hold or does not compare (left out by a scope or list filter, code between "
                      "modules at L0, calls outside the API list): the runs parted there")
# why a call's inputs differ more than the earlier calls' outputs explain (Judge.judge, first_seen)
_PARTED_BEFORE_MODULE = ("the runs parted before this call, in code that is not recorded (at L0 what runs "
                         "between modules; at mix calls outside the API list or left out by a filter), in the "
                         "input data or in earlier steps, or such code amplified a smaller difference")
_PARTED_BEFORE_API = ("the runs parted before this call: in the input data, in a weight passed to it (converted, "
                      "loaded or initialised differently, or updated differently by earlier steps), or in code "
                      "that is not recorded (calls outside the API list or left out by a filter), or such code "
                      "amplified a smaller difference")

MD5_DIFFERS = "md5 differs"
# a tensor file that could not be read (not written when dumped, missing, a symbolic link): its record errs
TENSOR_FILE_NOT_READ = "tensor file not read: "

# a module's backward inputs before any is judged: (largest magnitude, largest size, coarsest eps)
NO_GRAD_INPUTS = (0.0, 1, 0.0)

HEAD = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape"]
TAIL = ["Result", "Err_message", "NPU_Stack_Info"]
COLUMNS = {
    "statistics": HEAD + ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr", "MinRelativeErr",
                          "MeanRelativeErr", "NormRelativeErr", "NPU max", "NPU min", "NPU mean", "NPU l2norm",
                          "Bench max", "Bench min", "Bench mean", "Bench l2norm"] + TAIL,
    "md5": HEAD + ["NPU MD5", "BENCH MD5"] + TAIL,
    "tensor": HEAD + ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                      "Five Thousandths Err Ratio", "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max",
                      "Bench min", "Bench mean", "Bench l2norm"] + TAIL,
}
_NPU_STATS = ("NPU max", "NPU min", "NPU mean", "NPU l2norm")
_BENCH_STATS = ("Bench max", "Bench min", "Bench mean", "Bench l2norm")
_DIFF_COLUMNS = ("Max diff", "Min diff", "Mean diff", "L2norm diff")
_REL_COLUMNS = tuple(f"{key}RelativeErr" for key in STATS)


# calls whose axis arguments two frameworks spell differently (MindSpore's Tensor.transpose takes the whole
# permutation, PyTorch's two axes); their statistics do not depend on the order of axes, and the output's
# shape says which moved
_AXES_MOVED = frozenset(("transpose", "permute", "swapaxes", "swapdims", "Transpose"))
DROPOUT_HINT = ("a dropout left active draws its own random mask in each run (each framework its own generator): "
                "compare with dropout off (seed_all(rm_dropout=True) in both scripts, or model.eval())")
AFTER_BACKWARD = ("amplified: an update after the backward pass (the optimizer's, clipping) from gradients or "
                  "weights that already differ (Adam divides by the gradients' own size): the cause is earlier")


@dataclass
class Verdict:
    result: str = PASS
    reasons: list = field(default_factory=list)
    introduced: bool = False    # this call is where the runs part
    first_seen: bool = False    # its inputs differ more than any earlier call's outputs (see Judge.judge)
    inputs_size: float = 0.0    # the largest golden magnitude of its floating-point tensor inputs
    inputs_numel: int = 1       # and the largest number of values among them
    eps: float = 0.0            # the coarsest precision it was judged at
    in_err: float = 0.0
    out_err: float = 0.0
    setting: bool = False       # a scalar argument differs (or only one run passes one)
    comparable: bool = True     # False: the two records hold different quantities (compare/quantities.py)
    nonfinite_out: bool = False  # an output holds NaN/Inf where the golden's is finite
    nonfinite_in: list = field(default_factory=list)  # such inputs: (suffix, nonfinite kind, target statistics)

    def raise_to(self, result: str, reason: str) -> None:
        if _RANK[result] > _RANK[self.result]:
            self.result = result
        if reason not in self.reasons:
            self.reasons.append(reason)


@functools.lru_cache(maxsize=256)
def same_dtype(dtype: str) -> str:
    """One spelling for a dtype across frameworks: `torch.int64`, `Int64` and `int64` are the same."""
    return dtype.lower().replace("torch.", "").replace("mindspore.", "")


def scalar_value(obj: dict):
    """What a non-tensor object holds: its value, a process group's ranks or a memory format's name (these
    two have no "value"). A dtype in one spelling for both frameworks (`Float32`, `torch.float32`)."""
    value = obj.get("value", obj.get("group_ranks", obj.get("format")))
    if isinstance(value, str) and str(obj.get("type", "")).endswith("dtype"):
        return same_dtype(value)
    return value


def _a_setting(value) -> bool:
    """A value that no drift of the data makes differ: not a number (`approximate="tanh"`), or a flag."""
    return isinstance(value, bool) or not isinstance(value, (int, float))


def _passed_by_one_run(t_only: list, g_only: list, arguments: list, base: str = "") -> bool:
    """Says each scalar argument that only one run passes (in `arguments`); True when there is one. A value
    that one run passes by position and the other by keyword (`softmax(-1)`, `softmax(dim=-1)`) is the
    same setting under two names: such a pair cancels (two keywords of equal value are two settings). A
    keyword passed with the API's default value is the argument the other run left out (compare/defaults.py)."""
    t_only = [(suffix, row) for suffix, row in t_only if not _default(base, suffix, row)]
    g_only = [(suffix, row) for suffix, row in g_only if not _default(base, suffix, row)]
    left = list(g_only)
    for suffix, row in t_only:
        twin = next((g for g in left if _by_position(suffix) != _by_position(g[0])
                     and g[1].obj.get("type") == row.obj.get("type")
                     and scalar_value(g[1].obj) == scalar_value(row.obj)), None)
        if twin is not None:
            left.remove(twin)
        else:
            arguments.append(f"argument {suffix.lstrip('.')} differs: target {scalar_value(row.obj)!r}, "
                             f"golden not passed")
    arguments.extend(f"argument {suffix.lstrip('.')} differs: target not passed, golden {scalar_value(row.obj)!r}"
                     for suffix, row in left)
    return len(t_only) != len(g_only) or bool(left)


def _an_update(name: str, needs_grad: bool, dump) -> bool:
    """Whether a call after the backward pass is an update's (the optimizer's, clipping's), not a model's (a
    second micro-batch, activation recompute): called outside every module, and writing in place (`add_`,
    `addcdiv_`, `_foreach_mul_`) or on tensors that need no gradient (the optimizer's state; `needs_grad`: one
    of its tensors requires grad)."""
    parent = dump.parents.get(name)
    if isinstance(parent, str) and is_module(parent):
        return False
    api = split_name(name)[0].rsplit(".", 1)[-1]
    return api.endswith("_") or not needs_grad


def _transposed_gradient(t_row, g_row) -> bool:
    """A matrix's gradient written transposed by one side (the reference tool's addmm gradient of weight.t()):
    the same values, so the same statistics."""
    return t_row.role == OUTPUT and ".backward." in t_row.name and len(t_row.shape or ()) == 2 \
        and list(t_row.shape) == list(reversed(g_row.shape or ()))


def _gradients_by_shape(t_rows, cut: int, g_rows: dict) -> dict:
    """The golden's rows of a backward record, its gradients (`.output.K`) put in the target's order where
    the two list the same tensors in another order: the reference tool writes a call's gradients in its
    autograd node's order (addmm's: bias, input, transposed weight), msprobe_lite in the call's arguments'
    order. Shapes are compared as sets of sizes (a transposed weight has the statistics of the weight); only
    where each such key is one tensor's on both sides, otherwise as they are."""
    for r in t_rows:  # the usual case, the same order on both sides: nothing built
        if r.role == OUTPUT and r.is_tensor:
            g = g_rows.get(r.name[cut:])
            if g is None or g.shape != r.shape:
                break
    else:
        return g_rows
    t_out = {r.name[cut:]: r for r in t_rows if r.role == OUTPUT and r.name[cut:].count(".") == 2 and r.is_tensor}
    g_out = {k: r for k, r in g_rows.items() if r.role == OUTPUT and k.count(".") == 2 and r.is_tensor}
    key = lambda r: (tuple(sorted(r.shape or ())), same_dtype(r.dtype or ""))  # noqa: E731
    if len(t_out) < 2 or all(k in g_out and key(g_out[k]) == key(r) for k, r in t_out.items()):
        return g_rows
    by_key = {}
    for k, r in g_out.items():
        by_key.setdefault(key(r), []).append(k)
    if sorted(map(key, t_out.values())) != sorted(map(key, g_out.values())) or any(len(v) > 1 for v in by_key.values()):
        return g_rows
    moved = {k: r for k, r in g_rows.items() if k not in g_out}
    for k, r in t_out.items():
        moved[k] = g_out[by_key[key(r)][0]]
    return moved


def _default(base: str, suffix: str, row) -> bool:
    parts = suffix.lstrip(".").split(".")
    return len(parts) == 2 and not parts[1].isdigit() and defaults.is_default(base, parts[1], scalar_value(row.obj))


def _scalar_argument(row) -> bool:
    return row.role == INPUT and not row.is_tensor


def _by_position(suffix: str) -> bool:
    """Whether a row's argument was passed by position (`.input.1`, a list's `.input.1.0`) rather than by
    keyword (`.input.dim`, `.input.dim.0`): the part after the role says."""
    parts = suffix.lstrip(".").split(".")
    return len(parts) > 1 and parts[1].isdigit()


def files_only(verdict) -> bool:
    """Whether a verdict's reasons are tensor files that could not be read (and the pairing's note), no
    difference of the numbers."""
    return all(r.startswith((TENSOR_FILE_NOT_READ, "aligned with ")) for r in verdict.reasons)


def worse(a: str, b: str) -> str:
    """The worse of two results (error over warning over pass; unmatched above all)."""
    return a if _RANK[a] >= _RANK[b] else b


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


class Judge:
    """Measures and judges record pairs in one mode (statistics, md5, tensor)."""

    def __init__(self, mode: str, measure=None, tail=None, golden_tail=None, distributed: bool = False,
                 later_step: bool = False, odd_dtypes=None):
        self.mode = mode
        # module record -> its parameters of another dtype than the golden's, where most modules' keep theirs
        self.odd_dtypes = odd_dtypes or {}
        self.distributed = distributed  # one rank of several: its parameter gradients hold the others' too
        self.later_step = later_step    # past step 0: weights were updated from such gradients
        # row names after their record, in one naming for both sides (`.parameters.gamma` of a MindSpore
        # side read as PyTorch's `.parameters.weight`); None: as written
        self.tail = tail
        self.golden_tail = golden_tail
        self._across = tail is not None or golden_tail is not None  # two frameworks: one side is translated
        self.columns = COLUMNS[mode]
        self.measure = measure   # tensor mode: (t_dump, t_obj, g_dump, g_obj) -> tensors.measure() result
        self.files_not_read: list = []  # tensor mode: why each tensor file that could not be read was not
        self._blank = dict.fromkeys(self.columns)

    # -- one row -------------------------------------------------------------------------------------------
    def _row(self, t_row, g_row, t_dump, g_dump) -> tuple:
        """(row dict, row error, row-specific problems)."""
        out = self._blank.copy()
        problems = []
        err = 0.0
        if t_row is not None:
            out["NPU Name"], out["NPU Dtype"], out["NPU Tensor Shape"] = t_row.name, t_row.dtype, t_row.shape
        if g_row is not None:
            out["Bench Name"], out["Bench Dtype"], out["Bench Tensor Shape"] = g_row.name, g_row.dtype, g_row.shape
        if t_row is None or g_row is None:
            return out, 0.0, [_ROW_ONLY + ("golden" if t_row is None else "target")]
        t, g = t_row.obj, g_row.obj
        if self.mode != "md5":
            for columns, obj in ((_NPU_STATS, t), (_BENCH_STATS, g)):
                out[columns[0]] = obj.get("Max", obj.get("value"))
                out[columns[1]], out[columns[2]], out[columns[3]] = obj.get("Min"), obj.get("Mean"), obj.get("Norm")
        if not (t_row.is_tensor and g_row.is_tensor):
            tv, gv = scalar_value(t), scalar_value(g)
            if tv != gv and not (isinstance(tv, float) and isinstance(gv, float) and tv != tv and gv != gv):
                problems.append(f"value differs: {tv!r} vs {gv!r}")
                err = math.inf if not isinstance(tv, (int, float)) or not isinstance(gv, (int, float)) \
                    else (abs(tv - gv) / abs(gv) if gv else math.inf)
            return out, err, problems
        if t_row.shape is None or g_row.shape is None:  # not read when dumped (a framework error at the time)
            sides = [side for side, row in (("target", t_row), ("golden", g_row)) if row.shape is None]
            return out, 0.0, [f"the {' and '.join(sides)} tensor could not be read when it was dumped: not compared"]
        if t_row.shape != g_row.shape and list(t_row.shape or []) != list(g_row.shape or []) and not (
                self.mode == "statistics" and _transposed_gradient(t_row, g_row)):
            return out, math.inf, [f"shape differs: {t_row.shape} vs {g_row.shape}"]
        # a float of another width is the precision under test, an integer of another width (MindSpore's
        # Int32 labels against PyTorch's int64) holds the same values, compared below: neither is a difference
        if t_row.dtype != g_row.dtype and same_dtype(t_row.dtype) != same_dtype(g_row.dtype) \
                and not (dtype_kind(t_row.dtype) == dtype_kind(g_row.dtype) in ("float", "int")):
            problems.append(f"dtype differs: {t_row.dtype} vs {g_row.dtype}")
        if self.mode == "statistics":
            diffs, rels, err = stat_measures(t, g)
            out.update(zip(_DIFF_COLUMNS, diffs))
            out.update(zip(_REL_COLUMNS, rels))
            missing = [side for side, obj in (("target", t), ("golden", g)) if all(obj.get(k) is None for k in STATS)]
            if len(missing) == 1:  # its statistics failed when it was dumped (the other side has them)
                problems.append(f"statistics missing in the {missing[0]}: not compared")
        elif self.mode == "md5":
            out["NPU MD5"], out["BENCH MD5"] = t.get("md5"), g.get("md5")
            if t.get("md5") is None or g.get("md5") is None:
                problems.append("md5 missing on one side")
            elif t.get("md5") != g.get("md5"):  # different bytes: an error, whatever the call's inputs
                err = math.inf
                problems.append(MD5_DIFFERS)
        else:
            err = self._tensor_row(out, t, g, t_dump, g_dump, problems)
        return out, err, problems

    def _tensor_row(self, out, t, g, t_dump, g_dump, problems) -> float:
        if not t.get("data_name") or not g.get("data_name"):
            problems.append("tensor file missing on one side: compared on statistics")
            return stat_error(t, g)
        unwritten = [(side, obj) for side, obj in (("target", t), ("golden", g)) if UNWRITTEN in obj]
        m = {"file_error": "; ".join(f"the {side}'s {obj['data_name']} was not written when it was dumped "
                                     f"({obj[UNWRITTEN]})" for side, obj in unwritten)} if unwritten else \
            self.measure(t_dump, t, g_dump, g)
        if "file_error" in m:  # the record errs with it; the row is still compared on its statistics
            problems.append(TENSOR_FILE_NOT_READ + m["file_error"])
            self.files_not_read.append(m["file_error"])
            return stat_error(t, g)
        if "shapes" in m:
            problems.append(f"tensor files differ in shape: {m['shapes'][0]} vs {m['shapes'][1]}")
            return math.inf
        for key in ("Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                    "Five Thousandths Err Ratio"):
            out[key] = m[key]
        if m["note"]:
            problems.append(m["note"])
        if m["nonfinite"]:
            problems.append(f"{m['nonfinite']} NaN/Inf on one side only")
            return math.inf
        out["_thousandth"], out["_cosine"] = m["One Thousandth Err Ratio"], m["Cosine"]
        return m["rel_l2"]

    # -- one record pair ---------------------------------------------------------------------------------
    def judge(self, pair, t_dump, g_dump, stack: str = "", inner_eps: float = 0.0, upstream: float = 0.0,
              explained: float | None = None, grad_inputs: tuple = NO_GRAD_INPUTS, missing: str | None = None,
              unpaired: int = 0, after_backward: str | None = None) -> tuple:
        """(rows, Verdict) for a Pair. `inner_eps`: the coarsest precision of the calls made inside this one
        (a module under autocast computes in bf16 between fp32 inputs and outputs). `upstream`: how much
        what this call also depends on already differs (a backward depends on its forward's inputs).
        `explained` (forward calls): the largest output difference of the forward calls before this one.
        `grad_inputs` (parameter gradients): (inputs_size, inputs_numel, eps) of their module's backward
        records. `missing`: "inputs" or "outputs" when a data_mode filter left that part out of a dump; then
        `upstream` holds the earlier calls' output difference (inputs missing) and `explained` their input
        difference (outputs missing), and the reasons say so. `unpaired`: forward calls before this one that
        paired with nothing (not compared, so not in `explained`). `after_backward`: a forward call after the
        backward pass (the optimizer's update), "differs" when an earlier call's outputs differ at all (or one
        run made a call the other did not), else "clean"; such a call whose inputs or earlier calls differ
        introduces nothing but a setting of its own (lr, eps): it amplifies (Adam divides by the gradients'
        own size)."""
        if pair.target is None or pair.golden is None:
            side, name, dump = ("target", pair.target, t_dump) if pair.golden is None else \
                ("golden", pair.golden, g_dump)
            reason = (f"unmatched: only in {side}; the other run made no call that aligns with this one "
                      f"(same API or module, same parent, same argument shapes)")
            rows = []
            for r in dump.rows(name):
                row, _, _ = self._row(r if side == "target" else None, r if side == "golden" else None, t_dump, g_dump)
                row.update({"Result": UNMATCHED, "Err_message": reason, "NPU_Stack_Info": stack})
                rows.append(row)
            return rows, Verdict(UNMATCHED, [reason])
        t_rows = t_dump.rows(pair.target)
        cut_t, cut_g = len(pair.target), len(pair.golden)
        g_tail, t_tail = self.golden_tail, self.tail
        g_rows = {(g_tail(r.name[cut_g:], pair.golden) if g_tail else r.name[cut_g:]): r
                  for r in g_dump.rows(pair.golden)}
        base, direction, _ = split_name(pair.target)
        if direction == "backward":
            g_rows = _gradients_by_shape(t_rows, cut_t, g_rows)
        verdict = Verdict()
        if pair.how == "aligned":
            verdict.reasons.append(f"aligned with {pair.golden}")
        if pair.joined:  # runs.py: one call of one run, several of the other
            verdict.reasons.append(f"with {', '.join(pair.joined)} as one call (the first's inputs, the last's "
                                   f"outputs)")
        rows, errs = [], {INPUT: [], OUTPUT: []}
        worst_eps = 0.0
        extra = {INPUT: {}, OUTPUT: {}}
        seen = set()
        row_problems = []
        new_nonfinite = False
        arguments = []
        argument_err = 0.0   # the largest relative difference of a scalar argument (inf: not a number)
        setting = False      # an argument that differs is a setting (a string, a flag), not a derived number
        t_only, g_only = [], []  # (suffix, row) of scalar arguments that one run passes and the other not
        inputs_size = 0.0    # the largest golden magnitude of the floating-point tensor inputs
        inputs_numel = 1     # the largest number of values among them
        outputs = []         # (index in errs[OUTPUT], target, golden) of tensor outputs, statistics mode
        data_err = 0.0       # the largest difference of the tensor inputs that are not the call's parameters
        data_at = ""         # the row suffix of that input (".input.0")
        data_grad = False    # whether that input requires grad in the golden run (an API call's weight)
        blind = []           # tensor inputs holding NaN/Inf in both runs: where they sit, statistics do not say
        param_err = 0.0      # the largest difference of the call's parameters (a module's weights)
        param_eps = 0.0      # the coarsest epsilon of their dtypes (fp32 weights under bf16 autocast)
        outputs_size = 0.0   # the largest golden magnitude of the floating-point tensor outputs
        # the parts (input, output) each dump holds: a dump made with a `data_mode` filter has one only
        t_roles, g_roles = t_dump.roles(), g_dump.roles()
        def dtypes_of():  # each run's tensor dtypes in this call: the only dtypes whose constants it may pass
            return ({same_dtype(r.dtype) for r in t_rows if r.is_tensor and r.dtype},
                    {same_dtype(r.dtype) for r in g_rows.values() if r.is_tensor and r.dtype})

        for t_row in t_rows:
            suffix = t_tail(t_row.name[cut_t:], pair.target) if t_tail else t_row.name[cut_t:]
            g_row = g_rows.get(suffix)
            seen.add(suffix)
            row, err, problems = self._row(t_row, g_row, t_dump, g_dump)
            if g_row is None and t_row.role not in g_roles:
                problems = [NOT_DUMPED % "golden"]
            elif g_row is None and _scalar_argument(t_row):
                problems = self._one_sided(suffix, t_row, t_only, "target")
            elif g_row is None and self._across:
                problems = [ONE_FRAMEWORKS_VALUE % "target"]
            if g_row is not None:
                row["Bench Name"] = g_row.name
                worst_eps = max(worst_eps, eps_of(t_row.dtype), eps_of(g_row.dtype))
                if t_row.is_tensor or t_row.role == OUTPUT:
                    if self.mode == "statistics" and t_row.is_tensor and g_row.is_tensor:
                        if t_row.role == OUTPUT:
                            outputs.append((len(errs[OUTPUT]), t_row.obj, g_row.obj))
                            if dtype_kind(g_row.dtype) == "float":
                                outputs_size = max(outputs_size, magnitude(g_row.obj))
                        elif dtype_kind(g_row.dtype) == "float":  # not indices or masks
                            inputs_size = max(inputs_size, magnitude(g_row.obj))
                            inputs_numel = max(inputs_numel, numel(g_row.shape))
                    errs[t_row.role].append(err)
                    if t_row.role == INPUT and t_row.is_tensor:
                        if g_row.is_tensor and not finite(t_row.obj) and not finite(g_row.obj):
                            blind.append(suffix.lstrip("."))
                        elif g_row.is_tensor and not finite(t_row.obj):
                            verdict.nonfinite_in.append((suffix.lstrip("."), nonfinite.kind(
                                pair.target, suffix.lstrip("."), g_row.obj.get("requires_grad") is True), t_row.obj))
                        if suffix.startswith(".parameters."):
                            param_err = max(param_err, err)
                            param_eps = max(param_eps, eps_of(t_row.dtype), eps_of(g_row.dtype))
                        elif err >= data_err:
                            data_err, data_at, data_grad = err, suffix, g_row.obj.get("requires_grad") is True
                elif problems and self._across and base.rsplit(".", 1)[-1] in _AXES_MOVED:
                    problems = []  # MindSpore's transpose(*perm) is PyTorch's permute, not transpose(d0, d1)
                elif problems and same_dtype_constant(scalar_value(t_row.obj), scalar_value(g_row.obj), *dtypes_of()):
                    problems = []  # finfo(dtype).min of each run's own dtype: the same argument
                elif problems:  # a scalar argument differs: the likely cause, said plainly
                    arguments.append(f"argument {suffix.lstrip('.')} differs: "
                                     f"target {scalar_value(t_row.obj)!r}, golden {scalar_value(g_row.obj)!r}")
                    argument_err = max(argument_err, err)
                    setting = setting or _a_setting(scalar_value(t_row.obj)) or _a_setting(scalar_value(g_row.obj))
                    problems = []
                if "_thousandth" in row:
                    extra[t_row.role].setdefault("thousandth", []).append(row.pop("_thousandth"))
                    extra[t_row.role].setdefault("cosine", []).append(row.pop("_cosine"))
                if t_row.role == OUTPUT and t_row.is_tensor and g_row.is_tensor \
                        and not finite(t_row.obj) and finite(g_row.obj):
                    problems.append("target output has NaN/Inf where golden is finite")
                    new_nonfinite = verdict.nonfinite_out = True
            rows.append(row)
            row_problems.append(problems)
        for suffix, g_row in g_rows.items():
            if suffix not in seen:
                row, _, problems = self._row(None, g_row, t_dump, g_dump)
                if g_row.role not in t_roles:
                    problems = [NOT_DUMPED % "target"]
                elif _scalar_argument(g_row):
                    problems = self._one_sided(suffix, g_row, g_only, "golden")
                elif self._across:
                    problems = [ONE_FRAMEWORKS_VALUE % "golden"]
                rows.append(row)
                row_problems.append(problems)
        errs[INPUT].append(upstream)
        one_sided = _passed_by_one_run(t_only, g_only, arguments, base)
        # A gradient smaller, in both runs, than the rounding of one value of the gradients it was computed
        # from (one that is zero in exact arithmetic: a convolution bias's before BatchNorm, attention's key
        # projection bias's) is noise, and against its own magnitude any two roundings of it differ wildly:
        # it is measured against the magnitude of those gradients instead. The rounding of a gradient that sums
        # many values (a bias's: one per position of the batch) grows with the square root of their number, so
        # the floor does too. Backward records only: a forward output that small is a product or a masked
        # result as often as noise, and a scale set there is a change to be named. A module's parameter
        # gradients (L0, mix) are computed from its backward's inputs (the gradients of its outputs), which
        # their record does not hold: `grad_inputs` describes them.
        # Where the dump holds none (data_mode ["output"], a `list` of parameter gradients), the largest of
        # the record's own gradients stands in: coarser (a small bias gradient passes as noise more easily).
        # Their precision is the backward's: under autocast a convolution's backward runs in bf16 and only
        # its parameter gradients are fp32, so fp32's tolerance would name a bf16 rounding as a divergence.
        gradients = direction == "backward"
        verdict.inputs_size, verdict.inputs_numel = inputs_size, inputs_numel
        eps = verdict.eps = max(worst_eps, inner_eps)
        if params_grad_owner(pair.target):
            gradients = True
            inputs_size, inputs_numel, backward_eps = grad_inputs if grad_inputs[0] else (outputs_size, 1, 0.0)
            eps = max(eps, backward_eps)
        tol = TOLERANCE_EPS * eps
        noise = tol * inputs_size
        if noise > 0 and argument_err == 0 and not one_sided and gradients:
            for at, t_obj, g_obj in outputs:
                summed = math.sqrt(max(inputs_numel / max(numel(g_obj.get("shape")), 1), 1))  # values summed
                floor = noise * summed
                # the golden's under the floor marks a gradient that is zero in exact arithmetic; the target's
                # may round several times more (another kernel sums in another order: MindSpore's BiasAdd
                # gradient against PyTorch's), and both are measured against the scale of the sum's rounding
                if magnitude(g_obj) < floor and magnitude(t_obj) < DRIFT_MARGIN * floor and \
                        errs[OUTPUT][at] != math.inf:
                    errs[OUTPUT][at] = min(errs[OUTPUT][at], noise_error(t_obj, g_obj, inputs_size * summed))
        self._decide(verdict, errs, extra, eps, t_rows, new_nonfinite, argument_err, one_sided, missing, setting)
        different = quantities.not_comparable(base, direction, t_dump.records.get(pair.target),
                                              g_dump.records.get(pair.golden))
        needs_grad = bool(after_backward) and verdict.introduced and \
            any(r.is_tensor and r.obj.get("requires_grad") is True for r in t_rows)  # asked only then
        self._conclude(verdict, pair.target, t_dump, different, after_backward, new_nonfinite, needs_grad, explained,
                       tol, (data_err, data_at, data_grad), (param_err, TOLERANCE_EPS * param_eps), missing,
                       gradients, unpaired, argument_err, blind, arguments)
        self._finish_rows(rows, row_problems, verdict, stack)
        return rows, verdict

    def measured(self, name: str, dump, in_err: float, out_err: float, eps: float, explained: float | None,
                 after_backward: str | None, data: tuple, needs_grad: bool, gradients: bool) -> Verdict:
        """The verdict of a record whose rows are plain (tensors of equal shapes with finite statistics, scalar
        arguments of equal values) from its measures alone: compare/columnar.py measures such records on whole
        columns. The same rules as `judge`, which reaches them with the same numbers."""
        verdict = Verdict(eps=eps)
        self._decide(verdict, {INPUT: [in_err], OUTPUT: [out_err]}, {INPUT: {}, OUTPUT: {}}, eps, [], False)
        self._conclude(verdict, name, dump, None, after_backward, False, needs_grad, explained,
                       TOLERANCE_EPS * eps, data, (0.0, 0.0), None, gradients, 0, 0.0, [], [])
        return verdict

    def _conclude(self, verdict, name, dump, different, after_backward, new_nonfinite, needs_grad, explained, tol,
                  data, params, missing, gradients, unpaired, argument_err, blind, arguments) -> None:
        """What the record's place in the step adds to its measures' verdict (see `judge`)."""
        if different:  # two tools' values of two things under one name: neither agrees nor departs
            verdict.introduced, verdict.result, verdict.reasons = False, WARNING, [different]
            verdict.out_err = verdict.in_err = 0.0
            verdict.comparable = False
        elif after_backward and verdict.introduced and (after_backward == "differs" or verdict.in_err > 0) \
                and not verdict.setting and not new_nonfinite and _an_update(name, needs_grad, dump):
            verdict.introduced = False
            verdict.result = WARNING
            verdict.reasons = [AFTER_BACKWARD]
        if explained is not None and not verdict.introduced and self.mode != "md5":
            self._first_seen(verdict, name, explained, tol, data, params, missing, gradients, unpaired)
        if verdict.introduced and "dropout" in name.lower():
            verdict.raise_to(ERROR, DROPOUT_HINT)
        if self.distributed and verdict.introduced and params_grad_owner(name):
            verdict.raise_to(ERROR, ACROSS_RANKS)
        elif self.distributed and verdict.introduced and name.startswith("Distributed.") and not argument_err:
            verdict.raise_to(ERROR, ACROSS_RANKS_COLLECTIVE)
        if blind and verdict.introduced:
            one = len(blind) == 1
            verdict.raise_to(ERROR, f"{', '.join(blind)} hold{'s' if one else ''} NaN/Inf in both runs: "
                                    f"{'its' if one else 'their'} statistics cannot show where (a -inf mask over "
                                    f"other positions reads as agreeing), so check the calls that made "
                                    f"{'it' if one else 'them'}")
        for argument in arguments:
            verdict.raise_to(WARNING, argument)
        if name in self.odd_dtypes:
            verdict.raise_to(WARNING, f"its parameters are of another dtype than the golden's "
                                      f"({self.odd_dtypes[name]}) while most modules' keep theirs: a layer "
                                      f"cast on its own (.half(), a .to() that missed it)")

    def _first_seen(self, verdict, name, explained, tol, data, params, missing, gradients, unpaired) -> None:
        """Inputs that differ beyond what every earlier call's outputs (`explained`) explain: the runs parted
        before this call, in code that no record covers (at L0, what runs between modules), in the input data,
        or in earlier steps: otherwise two runs that clearly differ could read as all passing. A module's own
        parameters that differ likewise: its weights are not the golden's (converted, loaded or initialised
        differently: the commonest porting bug), or earlier steps updated them differently; its output differs
        as much, which its inputs explain, so only this check names it. `data`: (the largest difference of the
        inputs that are not parameters, its row suffix, whether that input requires grad in the golden run);
        `params`: (the largest difference of the parameters, the tolerance of their dtypes). At the first step
        no update has moved the weights, and nothing computed before explains them: they are judged at their
        own dtype's tolerance, not at the call's (bf16 under autocast would hide a weight loaded wrongly) nor
        against earlier outputs' drift."""
        data_err, data_at, data_grad = data
        param_err, param_tol = params
        floor = max(DRIFT_MARGIN * tol, AMPLIFICATION * explained)
        param_floor = floor if self.later_step or not param_tol else DRIFT_MARGIN * param_tol
        if data_err <= floor and param_err <= param_floor:
            return
        inputs = data_err > floor
        # an API call's argument that requires grad, most likely a weight (data does not, and the outputs of
        # earlier calls, which do, are what `explained` counts; not when a call went unpaired: its output,
        # not compared, may be this input)
        weight = inputs and data_grad and not is_module(name) and not unpaired
        if not inputs:
            what, err, why = "its parameters differ", param_err, _WEIGHTS_DIFFER
        elif split_name(name)[1] == "backward":  # the step's first backward record (see _compare_one)
            what, err, why = "the gradients flowing in already differ", data_err, _GRADIENTS_CAME_IN
        else:
            what, err = "inputs already differ", data_err
            why = _WEIGHT_ARGUMENT_DIFFERS if weight else \
                _PARTED_BEFORE_MODULE if is_module(name) else _PARTED_BEFORE_API
        if missing == "outputs" and inputs:  # no call's outputs: its inputs are all there is
            # (gradients are computed from the forward pass's values as well)
            before = "the forward pass, the backward call before it" if gradients else "the call before it"
            why = (f"outputs are not dumped (data_mode): {before}, code between that is not recorded, or a weight "
                   f"passed to it (an argument, at L1 and mix) made them differ")
        if self.distributed and self.later_step and (weight or not inputs):
            why += "; " + ACROSS_RANKS_WEIGHTS
        elif self.later_step and (weight or not inputs):  # drifted weights hide what the first step showed
            why += "; " + _EARLIER_STEP
        if unpaired:
            why += (f"; {unpaired} earlier forward call{'s' if unpaired > 1 else ''} did not pair with a call of "
                    f"the other run and {'are' if unpaired > 1 else 'is'} not compared: the difference may come "
                    f"from {'them' if unpaired > 1 else 'it'}")
        verdict.first_seen = True
        where = f" (most in {data_at.lstrip('.')}{', which requires grad, as a weight does' if weight else ''})" \
            if inputs else ""
        earlier = "do not" if explained == 0 else f"by at most {_fmt(explained)}"  # not "by at most 0: the ..."
        verdict.raise_to(WARNING, f"{what} by {_fmt(err)} of their magnitude{where}, earlier calls' "
                                  f"{'inputs' if missing == 'outputs' else 'outputs'} {earlier}: {why}")

    def _one_sided(self, suffix, row, only: list, side: str) -> list:
        """The problems of a scalar argument that one run passes and the other does not. In one framework, a
        setting that may differ from the default (`F.gelu(h, approximate="tanh")` against `F.gelu(h)`): kept in
        `only` for _passed_by_one_run, no row problem. Across frameworks, whose APIs spell the same call
        differently, an unmatched row that does not make the call a warning (an identical port read
        "3 warning" at L1)."""
        if not self._across:
            only.append((suffix, row))
            return []
        return [ONE_FRAMEWORKS_ARGUMENT % side]

    @staticmethod
    def _finish_rows(rows, row_problems, verdict, stack) -> None:
        """Result and Err_message of each row: the record's verdict, raised by the row's own problems. A
        row's problem is also the record's (it raises the verdict for the rows after it, as it always has).
        Err_message is every reason so far; it is joined again only when a reason was added."""
        message, joined = "", -1
        for row, problems in zip(rows, row_problems):
            result, own = verdict.result, None
            for p in problems:
                severity = ERROR if p.startswith(("shape", "dtype", "target output has NaN", "tensor files",
                                                  MD5_DIFFERS, TENSOR_FILE_NOT_READ)) \
                    else UNMATCHED if p.startswith((_ROW_ONLY, *_ROWS_OWN)) else WARNING
                result = worse(result, severity)
                if p.startswith(_ROWS_OWN):  # the row's own result, not the call's
                    own = p
                elif p not in verdict.reasons:
                    verdict.raise_to(ERROR if severity == ERROR else WARNING, p)
            if len(verdict.reasons) != joined:
                message, joined = "; ".join(verdict.reasons), len(verdict.reasons)
            row["Result"], row["Err_message"], row["NPU_Stack_Info"] = result, own or message, stack

    def _decide(self, verdict, errs, extra, worst_eps, t_rows, new_nonfinite, argument_err=0.0,
                one_sided=False, missing=None, setting=False) -> None:
        """`argument_err`: the largest relative difference of a scalar argument (0: none differs; inf: one
        that is not a number, `approximate="tanh"`). `one_sided`: a scalar argument is passed by one run only."""
        tol = TOLERANCE_EPS * worst_eps if self.mode != "md5" else 0.0
        in_err = max(errs[INPUT], default=0.0)
        # inputs left out by data_mode: the earlier calls' outputs stand in for them (see Judge.judge)
        ins = "earlier calls' outputs (inputs not dumped)" if missing == "inputs" else "inputs"
        out_err = max(errs[OUTPUT], default=0.0)
        verdict.in_err, verdict.out_err = in_err, out_err
        verdict.setting = argument_err > 0 or one_sided
        if new_nonfinite:
            verdict.raise_to(ERROR, "target output has NaN/Inf where golden is finite")
            if all(finite(r.obj) for r in t_rows if r.role == INPUT and r.is_tensor):
                verdict.introduced = True
            return
        beyond = out_err > in_err + tol  # more than the inputs' difference and rounding explain
        # a scalar argument that differs more than its tensors could make a computed one differ: a setting
        # (eps 1e-5 against 1e-3), not a value derived from drifted data (`x * (0.5 / x.max().item())`)
        set_differently = argument_err > max(AMPLIFICATION * in_err, tol)
        # an argument passed by one run only may be the default written out: weaker evidence, so once the
        # inputs drifted the output must also differ more than twice as much as they do
        set_differently |= one_sided and out_err > AMPLIFICATION_OF_AGREEING * in_err + tol
        # inputs within the tolerance: an output beyond it and beyond ten times their difference. Inputs that
        # differ at all come from runs that parted earlier (weights updated differently in earlier steps), and
        # a matmul over such weights turns their 2e-7 into 5e-6 by rounding alone: then DRIFT_MARGIN too
        drifted = in_err > 0
        margin = DRIFT_MARGIN * (LATER_STEP_DRIFT if self.later_step else 1)
        if self.mode == "md5":  # bytes, not magnitudes: outputs that differ from inputs that do not
            if in_err == 0 and out_err > 0:
                verdict.introduced = True
                verdict.raise_to(ERROR, "introduced: the outputs' md5 differ while the inputs' are equal")
        elif in_err <= tol and out_err > tol + AMPLIFICATION * in_err and (not drifted or out_err > margin * tol):
            verdict.introduced = True
            agree = "tensor inputs agree but a scalar argument differs" if argument_err > 0 or one_sided \
                else f"{ins} agree"
            verdict.raise_to(ERROR, f"introduced: outputs differ by {_fmt(out_err)} of their magnitude while "
                                    f"{agree} ({ins} differ by {_fmt(in_err)}, tolerance {_fmt(tol)})")
        elif set_differently and missing == "outputs":  # no outputs to show it: the setting is the evidence
            verdict.introduced = True
            verdict.raise_to(ERROR, f"introduced: a scalar argument differs while its tensor inputs differ by "
                                    f"{_fmt(in_err)} (outputs not dumped)")
        # inputs drifted (later steps), and this call is set up differently: by a value beyond what its drift
        # could explain, or by a setting that is not a number (`approximate="tanh"`), which no drift makes,
        # with outputs that differ beyond rounding
        elif set_differently and (beyond or (setting and out_err > tol)):
            verdict.introduced = True
            verdict.raise_to(ERROR, f"introduced: a scalar argument differs and outputs differ by {_fmt(out_err)} "
                                    f"of their magnitude, inputs by {_fmt(in_err)}")
        elif in_err < 0.1 and out_err > 0.5:  # the spec's coarse rule: the call introduced the divergence
            verdict.introduced = True
            verdict.raise_to(ERROR, f"introduced: outputs differ by {_fmt(out_err)} of their magnitude while "
                                    f"{ins} differ by only {_fmt(in_err)}")
        elif out_err > tol and (out_err > AMPLIFICATION * in_err or
                                (in_err <= tol and out_err > AMPLIFICATION_OF_AGREEING * in_err)):
            verdict.raise_to(WARNING, f"amplified: outputs differ by {_fmt(out_err)} of their magnitude, {ins} by "
                                      f"{_fmt(in_err)}")
        th_in, th_out = extra[INPUT].get("thousandth"), extra[OUTPUT].get("thousandth")
        # tensor mode: few output elements within 0.1% of the golden's. Only where 0.1% is beyond the rounding
        # of the dtypes involved (not bf16 or fp16), and where the inputs are known to agree: their elements,
        # or for a record without tensor inputs (parameter gradients) its upstream difference in `in_err`
        if th_out and min(th_out) < 0.1 and tol < 1e-3 and (min(th_in) > 0.9 if th_in else in_err <= tol):
            verdict.introduced = True
            verdict.raise_to(ERROR, "fewer than 10% of output elements within 0.1% while inputs agree")
        cos_in, cos_out = extra[INPUT].get("cosine"), extra[OUTPUT].get("cosine")
        if cos_in and cos_out:
            ci = min(c for c in cos_in if c == c) if any(c == c for c in cos_in) else 1.0
            co = min(c for c in cos_out if c == c) if any(c == c for c in cos_out) else 1.0
            if ci > 0.9 and co < ci - 0.1:
                verdict.raise_to(WARNING, f"cosine drops from {ci:.4f} (inputs) to {co:.4f} (outputs)")


def across_ranks(pairs: list) -> list:
    """One verdict per step of a distributed compare whose ranks' lines say a difference came from another
    rank: which ranks name where the runs parted, and which only received it (DDP's all-reduce, a
    collective), so the user need not read it off the rank lines one by one.
    [{"step", "parted": {rank: name}, "received": {rank: name}}], in step order."""
    by_step: dict = {}
    for pair in pairs:
        if pair["rank"] is not None:
            by_step.setdefault(pair["step"], []).append(pair)
    verdicts = []
    for step, ranks in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        parted, received = {}, {}
        for pair in ranks:
            first = pair["first_divergence"]
            if first and any(reason in first["reason"] for reason in (ACROSS_RANKS, ACROSS_RANKS_COLLECTIVE)):
                received[pair["rank"]] = first["name"]
                continue
            seen = pair.get("first_seen")
            named = first or pair.get("first_only_in_target") or pair.get("first_only_in_golden") or \
                (seen if seen and ACROSS_RANKS_WEIGHTS not in seen["reason"] else None)
            if named:
                parted[pair["rank"]] = named["name"]
        if len(ranks) > 1 and received:
            verdicts.append({"step": step, "parted": parted, "received": received})
    return verdicts


def record_eps(*row_lists) -> float:
    """The coarsest machine epsilon among the dtypes of some rows (a record and its partner)."""
    return max((eps_of(r.dtype) for rows in row_lists for r in rows if r.is_tensor), default=0.0)
