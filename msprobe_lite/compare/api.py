"""compare(): the whole pipeline for every step/rank pair, and its summary."""
from __future__ import annotations

import contextlib
import difflib
import gc
import json
import os
import sys
import time
from dataclasses import dataclass, field

from ..core.writer import write_atomic
from . import columnar, console, html_report, report, sequence, tensors
from .frameworks import class_free, module_class, namespace_free, translations
from .judge import AMPLIFICATION, ERROR, PASS, WARNING, Judge, across_ranks, record_eps, same_dtype
from .metrics import eps_of
from .pair import is_module, pair_records, split_name
from .runs import join_runs
from .read import DumpError, NativeRef, has_hierarchy, load_dump, pair_inputs, place, resolve, table_dump
from .table import read_tables


CSV_BACKGROUND_MIN = 20000   # record pairs from which the table is written by a second process
PARALLEL_READ_MIN = 1 << 22  # bytes of dump.json from which the two are read in two processes


class CompareError(ValueError):
    """Bad input to compare: a missing or unreadable dump, a bad mapping file, a missing tensor file."""


@dataclass
class Summary:
    mode: str
    pairs: list = field(default_factory=list)
    files: list = field(default_factory=list)
    # (step, rank) dumped by one side only, not compared: {"target": [{"step", "rank"}], "golden": [...]}
    not_compared: dict = field(default_factory=lambda: {"target": [], "golden": []})
    across_ranks: list = field(default_factory=list)  # judge.across_ranks: where a distributed run parted
    failed: list = field(default_factory=list)  # {"step", "rank", "error"}: pairs that could not be compared

    def to_json(self) -> dict:
        return {"mode": self.mode, "pairs": self.pairs, "not_compared": self.not_compared,
                "across_ranks": self.across_ranks, "failed": self.failed}

    @property
    def nothing_paired(self) -> bool:
        """Whether some step/rank pair compared nothing: no record of one dump met one of the other (an
        empty target against a full golden). The command exits 1 then: a run that compared nothing is no
        evidence that the runs agree."""
        return any(pair["nothing_paired"] for pair in self.pairs)


def _mode(target, golden) -> str:
    if target.task == "tensor" and golden.task == "tensor":
        return "tensor"

    def has_md5(dump):  # the first records tell: summary_mode is one setting for the whole dump
        return any("md5" in row.obj for name in list(dump.records)[:50] for row in dump.rows(name))
    return "md5" if has_md5(target) and has_md5(golden) else "statistics"


def _load_mapping(path):
    if path is None:
        return _as_is
    import yaml

    from ..core.small_file import SmallFileError, read_small_text

    try:
        mapping = yaml.safe_load(read_small_text(path)) or {}
    except SmallFileError as exc:
        raise CompareError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise CompareError(f"{path}: cannot read the mapping: {exc}") from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in mapping.items()):
        raise CompareError(f"{path}: expected a mapping of target name fragments to golden name fragments, "
                           f"e.g. {{'Module.encoder_new': 'Module.encoder'}}")
    items = sorted(mapping.items(), key=lambda kv: -len(kv[0]))

    def rename(name):
        for old, new in items:
            if old in name:
                name = name.replace(old, new)
        return name
    rename.fragments = [old for old, _ in items]  # to say which match no record (a typo maps nothing)
    return rename


def _closest_fragments(fragments, names) -> dict:
    """{fragment: the closest leading part of a record name} for mapping fragments that matched no name (a typo:
    'Modul.fc9' -> 'Module.fc1'); a fragment with nothing close is left out."""
    if not fragments:
        return {}
    heads = {".".join(parts[:i]) for parts in (n.split(".") for n in names) for i in range(2, len(parts) - 1)}
    close = {f: difflib.get_close_matches(_in_targets_kind(f, heads), heads, n=1, cutoff=0.6) for f in fragments}
    return {f: c[0] for f, c in close.items() if c}


def _in_targets_kind(fragment: str, heads) -> str:
    """`fragment` with the module kind of the target's names: `Module.ln2` -> `Cell.ln2` for a MindSpore
    target, whose cells a PyTorch user writes as modules."""
    for mine, theirs in (("Module.", "Cell."), ("Cell.", "Module.")):
        if fragment.startswith(mine) and not any(h.startswith(mine) for h in heads) \
                and any(h.startswith(theirs) for h in heads):
            return theirs + fragment[len(mine):]
    return fragment


def _tensor_measurer(measured: dict):
    """The judge's tensor measure: what tensors.measure_all computed beforehand, or measured now."""
    def measure(t_dump, t, g_dump, g):
        key = (tensors.tensor_path(t_dump, t["data_name"]), tensors.tensor_path(g_dump, g["data_name"]))
        found = measured.get(key)
        if found is None:
            eps = max(eps_of(str(t.get("dtype"))), eps_of(str(g.get("dtype"))))
            found = tensors.measure(key + (t_dump.path, g_dump.path, eps))
        return found
    return measure


def _measure_tensors(pairs, target, golden, workers: int, show_progress: bool) -> dict:
    """Every tensor row pair of this step/rank pair measured up front, in `workers` processes."""
    bar = tensors.Progress("measuring tensors") if show_progress else None
    try:
        return tensors.measure_all(tensors.jobs(pairs, target, golden), workers, bar)
    finally:
        if bar:
            bar.close()


def _inner_eps(pairs, target, golden) -> dict:
    """record -> the coarsest precision of it and of every call made inside it (via construct.json)."""
    eps: dict = {}
    for pair in pairs:
        if pair.target and pair.golden:
            e = record_eps(target.rows(pair.target), golden.rows(pair.golden))
            eps[pair.target] = max(eps.get(pair.target, 0.0), e)
            for parent in target.parent_chain(pair.target):
                eps[parent] = max(eps.get(parent, 0.0), e)
    if not target.parents:  # no hierarchy written: any low precision anywhere makes it a mixed comparison
        coarsest = max(eps.values(), default=0.0)
        eps = dict.fromkeys(eps, coarsest)
    return eps


@contextlib.contextmanager
def _gc_paused():
    """Loading and judging a dump builds millions of small dicts and lists, none of them in a cycle. The
    cyclic collector would walk them again and again while they are built (a third of the time of a large
    comparison) and free nothing, so it is paused; reference counting still frees everything."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def compare_one(step, rank, target_path, golden_path, output_dir, rename, timestamp, xlsx,
                show_progress=False, workers=1, native_csv=True):
    """Compare one step/rank pair: (mode, summary pair, files written, details for the HTML report).
    `workers`: processes for measuring tensor files (tensor mode). `native_csv`: the table may be written by
    polars (not in a process forked from one whose polars threads ran: see report.CsvSink)."""
    try:
        with _gc_paused():
            return _compare_one(step, rank, target_path, golden_path, output_dir, rename, timestamp, xlsx,
                                show_progress, workers, native_csv)
    except (DumpError, tensors.TensorFileError) as exc:
        raise CompareError(str(exc)) from None


def _tables(target_path: str, golden_path: str, parallel: bool):
    """Both dumps read into columns (compare/table.py), in two processes when `parallel`; None where either is
    not a dump.json that the columns hold (load_dump then reads it, and says what is wrong with it)."""
    if isinstance(target_path, NativeRef) or isinstance(golden_path, NativeRef) or \
            has_hierarchy(target_path) or has_hierarchy(golden_path):  # modules (L0, mix): not the columns' kind
        return None
    from concurrent.futures.process import BrokenProcessPool

    paths = [target_path, golden_path]
    try:
        tables = read_tables(paths, parallel and sum(map(os.path.getsize, paths)) >= PARALLEL_READ_MIN)
    except (OSError, BrokenProcessPool):  # a file gone, a reader killed (memory): load_dump says what it meets
        return None
    return tables if all(tables) else None


def _other_place(target_path: str, golden_path: str):
    """What differs between the step and rank folders of two dumps named one each ("the golden is step 0"):
    the line is labelled with the target's, and comparing another step or rank is more often a slip than
    a plan."""
    (t_step, t_rank, _), (g_step, g_rank, _) = resolve(target_path)[0], resolve(golden_path)[0]
    said = [f"{what} differ: target {what[:-1]} {t}, golden {what[:-1]} {g}"
            for what, t, g in (("steps", t_step, g_step), ("ranks", t_rank, g_rank))
            if t is not None and g is not None and t != g]
    return "; ".join(said) or None


def _row_tails(t_names, g_names) -> tuple:
    """(target's, golden's) row-name translation across frameworks: the MindSpore side's names into
    PyTorch's, the PyTorch side's keyword arguments into positions (see frameworks.Translation); (None, None)
    within one framework."""
    names = t_names or g_names
    if names is None:
        return None, None
    return (names.row_tail, names.torch_row_tail) if t_names else (names.torch_row_tail, names.row_tail)


def _odd_parameter_dtypes(pairs, target, golden) -> dict:
    """{module record: "weight torch.float16 / torch.float32", ...} for the few modules whose parameters are of
    another dtype than the golden's while most modules' keep theirs: one layer cast on its own (`.half()`, a
    `.to()` that missed it). A whole model cast (bf16 weights against fp32) is the precision under test, and
    under autocast the parameters keep their dtype: neither is said."""
    differing, same = {}, 0
    for pair in pairs:
        if not (pair.target and pair.golden and is_module(pair.target) and split_name(pair.target)[1] == "forward"):
            continue
        t_params, g_params = _parameter_dtypes(target, pair.target), _parameter_dtypes(golden, pair.golden)
        odd = [f"{tail.rsplit('.', 1)[-1]} {t_params[tail]} / {g_params[tail]}" for tail in sorted(t_params)
               if tail in g_params and same_dtype(t_params[tail]) != same_dtype(g_params[tail])]
        if odd:
            differing[pair.target] = ", ".join(odd)
        elif t_params:
            same += 1
    return differing if len(differing) < same else {}


def _parameter_dtypes(dump, name: str) -> dict:
    """{row tail after the record (`.parameters.weight`): dtype} of a module record's parameters."""
    return {r.name[len(name):]: r.dtype for r in dump.rows(name) if ".parameters." in r.name}


# Python operators on tensors, as the reference tool names them (`Tensor.__mul__`) and as msprobe_lite does
# (the Tensor method the operator calls: `Tensor.mul`)
_OPERATORS = {"__add__": "add", "__sub__": "sub", "__mul__": "mul", "__truediv__": "div", "__matmul__": "matmul",
              "__pow__": "pow", "__neg__": "neg", "__mod__": "remainder", "__floordiv__": "floor_divide"}


def _operator_names(records, other) -> tuple:
    """(records' renaming, other's renaming) of operator calls (`Tensor.__mul__.0.forward`) to the method's
    name (`Tensor.mul.0.forward`) where the other dump names them so and this one has no call of that name:
    one run written by the reference tool, the other by msprobe_lite."""
    mine, theirs = _tensor_apis(records), _tensor_apis(other)
    return _operator_renaming(mine, theirs), _operator_renaming(theirs, mine)


def _tensor_api(name):
    if not name.startswith("Tensor."):
        return None
    parts = name.split(".")
    return parts[1] if len(parts) >= 4 else None


def _tensor_apis(names) -> set:
    return {_tensor_api(n) for n in names if n.startswith("Tensor.")}


def _operator_renaming(mine: set, theirs: set):
    renamed = {dunder: plain for dunder, plain in _OPERATORS.items()
               if dunder in mine and plain in theirs and plain not in mine and dunder not in theirs}
    if not renamed:
        return _as_is
    return lambda name: f"Tensor.{renamed[_tensor_api(name)]}.{name.split('.', 2)[2]}" \
        if _tensor_api(name) in renamed else name


def _classes_differ(pairs, t_names, g_names) -> str:
    """Modules and cells paired by path whose classes differ (after the name mapping's own classes): said,
    not a difference (a port names its classes its own way)."""
    seen = {}
    for pair in pairs:
        if pair.target and pair.golden:
            t = module_class(t_names.record(pair.target) if t_names else pair.target)
            g = module_class(g_names.record(pair.golden) if g_names else pair.golden)
            if t and g and t[0] == g[0] and t[1] != g[1]:
                seen.setdefault(t[0], (module_class(pair.target)[1], module_class(pair.golden)[1]))
    if not seen:
        return ""
    shown = ", ".join(f"{path} ({t} / {g})" for path, (t, g) in list(seen.items())[:3])
    more = f" and {len(seen) - 3} more" if len(seen) > 3 else ""
    return f"paired by path, classes named differently: {shown}{more}"


def _across_free(name: str) -> str:
    return class_free(namespace_free(name))


def _compose(first, second):
    return lambda name: second(first(name))


def _as_is(name):
    return name


def _levels(target_level: str, golden_level: str) -> tuple:
    """(note, by_parent): what a compare of dumps of two levels pairs, in words for the answer line (None for
    one level), and whether calls pair within their parent modules (an L1 dump keeps none). L0 records
    modules and L1 APIs: such dumps have nothing in common, which is bad input."""
    if target_level == golden_level or not target_level or not golden_level:
        return None, True
    both = {target_level, golden_level}
    said = f"levels differ (target {target_level}, golden {golden_level})"
    if both == {"L0", "L1"}:
        raise CompareError(f"the target is an {target_level} dump and the golden an {golden_level} dump: L0 "
                           f"records modules and L1 records APIs, so they have no record in common (expected "
                           f"two dumps of one level, or mix against either)")
    if both == {"L1", "mix"}:
        return said + ": API calls paired without their modules, module records left unmatched", False
    if both == {"L0", "mix"}:
        return said + ": module records paired, API calls left unmatched", True
    return said, "L1" not in both


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _some_part_in_common(target, golden) -> None:
    """Dumps made with `data_mode` filters that left them no part in common (one holds only inputs, the other
    only outputs) have nothing to compare: bad input, said as such, rather than every call reading as a pass."""
    t_roles, g_roles = target.roles(), golden.roles()
    if t_roles and g_roles and not t_roles & g_roles:
        def parts(roles):
            return " and ".join(sorted(f"{role}s" for role in roles))
        raise CompareError(f"the target dump holds only its calls' {parts(t_roles)} and the golden only their "
                           f"{parts(g_roles)} (data_mode filters): no part in common to compare (expected two "
                           f"dumps that both hold inputs or both hold outputs)")


def _values_in_both(target, golden) -> None:
    """A `structure` dump holds record names, stacks and hierarchy, no numbers: against anything its calls
    read as unmatched or, against another structure dump, as passing with nothing compared. Bad input."""
    bare = [(side, dump) for side, dump in (("target", target), ("golden", golden)) if dump.task == "structure"]
    if bare:
        named = " and ".join(f"the {side} ({dump.path})" for side, dump in bare)
        kind = "is a structure dump" if len(bare) == 1 else "are structure dumps"
        raise CompareError(f"{named} {kind} (task \"structure\": names, stacks and hierarchy, no numbers): nothing "
                           f"to compare (expected dumps of task statistics or tensor)")


MD5_ACROSS = ("md5 not compared across frameworks (their kernels are not bitwise the same): judged by the "
              "statistics; dump with summary_mode statistics")


def _compare_one(step, rank, target_path, golden_path, output_dir, rename, timestamp, xlsx, show_progress,
                 workers, native_csv=True):
    tables = None if xlsx else _tables(target_path, golden_path, workers > 1)
    target, golden = (table_dump(tables[0], step, rank), table_dump(tables[1], step, rank)) if tables else \
        (load_dump(target_path, step, rank), load_dump(golden_path, step, rank))
    mode = _mode(target, golden)
    t_names, g_names = translations(target.framework, golden.framework)
    across = bool(t_names or g_names)  # two frameworks, met in PyTorch's names
    rename_t = (lambda n: t_names.record(rename(n))) if t_names else rename
    rename_g = g_names.record if g_names else _as_is
    if across:  # API namespaces and a port's own class names do not take part in pairing
        rename_t, rename_g = _compose(rename_t, _across_free), _compose(rename_g, _across_free)
    t_operators, g_operators = _operator_names(target.records, golden.records)
    names_as_they_are = rename is _as_is and not across and t_operators is _as_is and g_operators is _as_is
    rename_t, rename_g = _compose(rename_t, t_operators), _compose(rename_g, g_operators)
    note, by_parent = _levels(target.level, golden.level)
    if across and mode == "md5":  # two frameworks' kernels are never bitwise the same: every row would differ
        mode = "statistics"
        note = "; ".join(filter(None, [MD5_ACROSS, note]))
    if _same_file(target.path, golden.path):  # everything passes, which proves nothing: most likely a slip
        note = "; ".join(filter(None, ["target and golden are the same dump", note]))
    note = "; ".join(filter(None, [_other_place(target_path, golden_path), note])) or None
    _values_in_both(target, golden)
    _some_part_in_common(target, golden)
    tag = f"rank{'' if rank is None else rank}_step{'' if step is None else step}"
    csv_path = os.path.join(output_dir, f"compare_result_{tag}_{timestamp}.csv")
    if tables:
        judge = Judge(mode, None, *_row_tails(t_names, g_names), distributed=rank is not None, later_step=bool(step))
        walked = columnar.walk(*tables, target, golden, judge, step, None if names_as_they_are else rename_t,
                               rename_g, lambda: report.CsvSink(csv_path, judge.columns, native=native_csv,
                                                                threads=2 if native_csv else 0))
        if walked is not None:
            return _finish(walked, mode, note, step, rank, target, golden, target_path, golden_path, rename,
                           csv_path, [csv_path], judge.files_not_read)
        # not of the columnar route's kind: the whole dumps, judged call by call
        target, golden = load_dump(target_path, step, rank), load_dump(golden_path, step, rank)
    pairs = pair_records(target, golden, rename_t, rename_g, by_parent, across)
    if across:
        pairs = join_runs(pairs, target, golden)
        note = "; ".join(filter(None, [_classes_differ(pairs, t_names, g_names), note])) or None
    measured = _measure_tensors(pairs, target, golden, workers, show_progress) if mode == "tensor" else {}
    judge = Judge(mode, _tensor_measurer(measured), *_row_tails(t_names, g_names),
                  distributed=rank is not None, later_step=bool(step),
                  odd_dtypes={} if across else _odd_parameter_dtypes(pairs, target, golden))
    inner = _inner_eps(pairs, target, golden)
    sink = report.CsvSink(csv_path, judge.columns, background=workers > 1 and len(pairs) >= CSV_BACKGROUND_MIN)
    walked = sequence.walk(pairs, target, golden, judge, inner, sink, step, across, xlsx, show_progress)
    sink.close()
    files = [csv_path]
    if xlsx:
        xlsx_path = csv_path[:-4] + ".xlsx"
        try:
            report.write_xlsx(xlsx_path, judge.columns, walked.rows)
        except RuntimeError as exc:
            raise CompareError(str(exc)) from None
        files.append(xlsx_path)
    return _finish(walked, mode, note, step, rank, target, golden, target_path, golden_path, rename, csv_path,
                   files, judge.files_not_read)


def _finish(walked, mode, note, step, rank, target, golden, target_path, golden_path, rename, csv_path, files,
            files_not_read) -> tuple:
    """(mode, summary pair, files written, details for report.html) of a step/rank pair judged."""
    counts, first = walked.counts, walked.first
    unused = [f for f in getattr(rename, "fragments", ()) if not any(f in name for name in target.records)]
    low = _low_precision(target, golden)
    if low and first is None and not counts[ERROR]:  # said: that autocast or a .to() took effect, and passed
        note = "; ".join(filter(None, [f"one run computes in {low}, the other finer: its rounding is expected and "
                                       f"passes", note]))
    left_out_few = walked.left_out <= max(3, walked.paired_forward // 10)
    summary_pair = {"step": step, "rank": rank, "target": target_path, "golden": golden_path,
                    "mapping_unused": unused, "mapping_close": _closest_fragments(unused, target.records),
                    "counts": counts, "first_divergence": first, "first_only_in_target": walked.extra,
                    "first_only_in_golden": walked.missing_call if left_out_few else None,
                    "first_error": walked.first_error, "first_seen": walked.first_seen,
                    "first_warning": walked.first_warning,
                    "note": note, "records": {"target": len(target.records), "golden": len(golden.records)},
                    "tensor_files_not_read": files_not_read,
                    # no record of one run met one of the other: nothing was compared (exit status 1)
                    "nothing_paired": not (counts[PASS] or counts[WARNING] or counts[ERROR]),
                    "result_file": csv_path}
    return mode, summary_pair, files, {"pair": summary_pair, "errors": walked.errors, "modules": walked.modules,
                                       "departing": walked.departing, "largest": walked.largest,
                                       "low_precision": low, "rows": walked.named_rows,
                                       "first_at": walked.first_at,
                                       "tree": {m: target.parents.get(m) for m in walked.modules}}


class Failed(tuple):
    """(step, rank, why) of a step/rank pair that could not be compared (a damaged dump): said in its place,
    the others still compared. Only where there are several pairs: a lone pair's error is the command's."""


def _one_in_worker(args):
    step, rank, t_path, g_path, output_dir, mapping, timestamp, xlsx, native_csv = args
    try:
        return compare_one(step, rank, t_path, g_path, output_dir, _load_mapping(mapping), timestamp, xlsx,
                           native_csv=native_csv)
    except CompareError as exc:
        return Failed((step, rank, str(exc)))


def _run_all(inputs, output_dir, mapping, rename, timestamp, xlsx, show_progress, workers, scheduler=None):
    """Each step/rank pair is independent: several pairs are compared in parallel processes. A single pair
    gets the processes for its tensor files instead (one level of processes, never a pool inside a pool).
    With `scheduler`, every pair on that Dask cluster's workers instead (compare.cluster)."""
    if scheduler:
        from .cluster import run_on

        if workers:  # as the CLI's -n and --scheduler: a cluster's processes are set where its workers start
            raise CompareError(f"workers={workers} and scheduler={scheduler!r}: give one, not both")
        # absolute paths: a worker runs in a folder of its own, often on another machine that mounts the same paths
        absolute = os.path.abspath
        yield from run_on(scheduler, _one_in_worker, [
            (s, r, absolute(t), absolute(g), absolute(output_dir), mapping and absolute(mapping), timestamp, xlsx,
             True) for s, r, t, g in inputs])
        return
    workers = workers or os.cpu_count() or 1
    if len(inputs) == 1 or workers <= 1:
        for step, rank, t_path, g_path in inputs:
            try:
                yield compare_one(step, rank, t_path, g_path, output_dir, rename, timestamp, xlsx, show_progress,
                                  workers)
            except CompareError as exc:
                if len(inputs) == 1:
                    raise
                yield Failed((step, rank, str(exc)))
        return
    from concurrent.futures import ProcessPoolExecutor

    # polars waits for ever in a process forked after its threads ran here (an earlier compare in this process)
    native_csv = "polars" not in sys.modules
    jobs = [(s, r, t, g, output_dir, mapping, timestamp, xlsx, native_csv) for s, r, t, g in inputs]
    with ProcessPoolExecutor(min(workers, len(inputs)), initializer=tensors.init_worker) as pool:
        yield from pool.map(_one_in_worker, jobs)


def compare(target: str, golden: str, output_dir: str | None = None, *, xlsx: bool = False, html: bool = True,
            mapping: str | None = None, quiet: bool = False, workers: int | None = None,
            explain: bool = False, scheduler: str | None = None) -> Summary:
    """Compare a target dump with a golden dump (dump.json, rank folder, step folder or dump root).

    Writes compare_result_rank{R}_step{N}_{timestamp}.csv per pair, summary.json and report.html to
    `output_dir` (default ./compare_output), says a verdict block per pair (the whole reasoning with
    `explain`) through the `msprobe_lite.answer` logger, and returns the summary. Several
    step/rank pairs are compared in up to `workers` processes (default: one per CPU); a single pair in
    tensor mode measures its tensor files in that many processes instead. On a terminal, a progress bar.
    `scheduler` ("tcp://host:8786"), not with `workers`: the pairs are compared on that Dask cluster's workers,
    which must see the dumps and `output_dir` under the same paths; the results are the same."""
    output_dir = output_dir or "compare_output"
    rename = _load_mapping(mapping)
    try:
        inputs, left = pair_inputs(target, golden)
    except DumpError as exc:
        raise CompareError(str(exc)) from None
    try:
        report.output_folder(output_dir)
        return _compare_all(inputs, left, output_dir, xlsx, html, mapping, rename, quiet, workers, explain,
                            scheduler)
    except report.OutputError as exc:
        raise CompareError(str(exc)) from None
    except BrokenPipeError:  # the console's reader left (`| head`): the command's business, not the folder's
        raise
    except OSError as exc:  # reading raises DumpError: what is left is writing the results
        raise CompareError(str(report.unwritable(exc, output_dir))) from None


WEIGHTS_DIFFER = ("weights are not the golden's", "as a weight does", "its parameters differ")


def _about_weights(found) -> str | None:
    """The part of a finding's reason that says how far the weights differ, before its list of causes (which
    the step-to-step rules below replace), or None when the finding is not about weights."""
    if found is None or not any(text in found["reason"] for text in WEIGHTS_DIFFER):
        return None
    return found["reason"].split(": the weights are not the golden's")[0]


def _updated_between(before, pair) -> None:
    """A step whose first finding is its weights, after a step that agreed in every record, gradients
    included, by far less than the weights now differ: what changed them is the update between the two
    steps, the optimizer (named as the place). Not where the step before differed by as much as a tenth of
    it (bf16 against fp32: Adam turns the gradients' rounding into steps of the learning rate's size)."""
    if before is None or not _clean(before[0], pair):
        return
    found = pair["first_divergence"] or pair["first_seen"]
    head = _about_weights(found)
    if head is None or found.get("input_difference", 0.0) <= AMPLIFICATION * before[1]:
        return
    step = before[0]["step"]
    found["reason"] = (f"{head}: the optimizer's update after step {step} differs (step {step} agreed in every "
                       f"record, gradients included): another optimizer, learning rate, weight decay or eps")
    found["place"] = "optimizer"


LOW_PRECISION = {eps_of("bfloat16"): "bf16", eps_of("float16"): "fp16"}


def _low_precision(target, golden):
    """"bf16" or "fp16" where one run computes in it and the other in a finer dtype (its first records tell),
    else None."""
    def coarsest(dump):
        return max((eps_of(r.dtype or "") for name in list(dump.records)[:300] for r in dump.rows(name)
                    if r.is_tensor), default=0.0)
    t, g = coarsest(target), coarsest(golden)
    return LOW_PRECISION.get(max(t, g)) if t != g else None


def _low_precision_drift(before, pair, dtype, departing: dict) -> bool:
    """At a step after one that agreed as well as its precision allows, in a low-precision run (bf16 or fp16
    against a finer one), weights that differ by no more than ten times that step's differences are the
    expected drift of low-precision training (Adam turns each step's rounding into steps of the learning
    rate's size): said so, with where it grows fastest, instead of weights loaded or converted wrongly.
    Returns whether it said so."""
    found = pair["first_seen"]
    head = _about_weights(found)
    if before is None or dtype is None or head is None or pair["first_divergence"] \
            or not _clean(before[0], pair, drifting=True) or found["input_difference"] > AMPLIFICATION * before[1]:
        return False
    fastest = max(departing.items(), key=lambda kv: kv[1][1] / max(kv[1][0], 1e-30), default=None)
    where = f"; it grows fastest at {fastest[0]} (outputs {fastest[1][1]:.3g}, inputs {fastest[1][0]:.3g})" \
        if fastest else ""
    found["reason"] = (f"{head}: the expected drift of {dtype} training (step {before[0]['step']} agreed as well as "
                       f"{dtype} allows, and each update rounds differently): the weights differ by "
                       f"{found['input_difference']:.3g} of their magnitude{where}")
    return True


def _clean(earlier, pair, drifting: bool = False) -> bool:
    """Whether `earlier`, the step just before `pair`'s, named nothing and erred nowhere (`drifting`: but for
    weights that already drifted, a first difference seen that is the expected drift of low precision)."""
    named = ("first_divergence", "first_error", "first_only_in_target") + (() if drifting else ("first_seen",))
    return isinstance(pair["step"], int) and earlier["step"] == pair["step"] - 1 and earlier["counts"]["pass"] \
        and not earlier["counts"]["error"] and not any(earlier[k] for k in named)


def _still_departing(earlier, pair, departing: dict) -> None:
    """A step without a divergence of its own whose call named at an earlier step still departs more than ten
    times its inputs (weights included): that call is named again. At a later step every weight carries the
    earlier steps' drift, so inputs never quite agree and the modules early in the network read first."""
    if earlier is None or pair["first_divergence"] is not None:
        return
    step, found = earlier
    hit = departing.get(found["name"])
    if hit is None:
        return
    pair["first_divergence"] = dict(found, since_step=step, input_difference=hit[0], output_difference=hit[1], reason=(
        f"still departing as at step {step}: outputs differ by {hit[1]:.3g} of their magnitude, inputs by "
        f"{hit[0]:.3g}, weights included (they carry the earlier steps' drift)"))


def _compare_all(inputs, left, output_dir, xlsx, html, mapping, rename, quiet, workers, explain=False,
                 scheduler=None) -> Summary:
    """Every step/rank pair compared and written to `output_dir`, with summary.json and report.html."""
    timestamp = time.strftime("%Y%m%d%H%M%S")
    tty = sys.stderr.isatty() and not quiet
    summary, details = None, []
    blocks = console.Blocks()
    # many step/rank pairs: a bar over them on a terminal, cleared before each answer is said
    bar = tensors.Progress("comparing step/rank pairs") if tty and len(inputs) > 1 else None
    before = {}  # rank -> the pair of its latest step
    named = {}   # rank -> (step, first divergence) of its latest step that had one
    failed = []  # {"step", "rank", "error"} of the pairs that could not be compared
    try:  # the answers buffered are said even when a later pair fails
        for result in _run_all(inputs, output_dir, mapping, rename, timestamp, xlsx, tty, workers, scheduler):
            if bar:
                bar.close()
            if isinstance(result, Failed):
                step, rank, why = result
                failed.append({"step": step, "rank": rank, "error": why})
                if not quiet:
                    blocks.close()
                    console.say(console.wrapped(f"not compared: {why}", first=f"[{place(step, rank)}] "))
                continue
            mode, pair, files, detail = result
            if not _low_precision_drift(before.get(pair["rank"]), pair, detail["low_precision"], detail["departing"]):
                _updated_between(before.get(pair["rank"]), pair)
            _still_departing(named.get(pair["rank"]), pair, detail["departing"])
            before[pair["rank"]] = (pair, detail["largest"])
            first = pair["first_divergence"]
            if first:
                named[pair["rank"]] = (first.get("since_step", pair["step"]), first)
            summary = summary or Summary(mode)
            summary.pairs.append(pair)
            summary.files += files
            details.append(detail)
            if not quiet and explain:
                console.say(console.explained(pair))
            elif not quiet:
                blocks.add(pair)
            if bar:
                bar(len(details) + len(failed), len(inputs))
    finally:
        if bar:
            bar.close()
        blocks.close()
    if summary is None:  # no pair could be compared: the first one's error is the command's
        raise CompareError(f"{place(failed[0]['step'], failed[0]['rank'])}: {failed[0]['error']}"
                           + (f" (and {len(failed) - 1} more step/rank pairs)" if len(failed) > 1 else ""))
    summary.failed = failed
    unused = set.intersection(*(set(p["mapping_unused"]) for p in summary.pairs))
    if unused and not quiet:
        close = {}
        for p in summary.pairs:
            close.update({f: c for f, c in p["mapping_close"].items() if f in unused and f not in close})
        said = ", ".join(repr(f) + (f" (did you mean {close[f]!r}?)" if f in close else "") for f in sorted(unused))
        console.say(console.wrapped(
            f"mapping: {said} matched no record name of the target (expected fragments of its names, such as "
            f"'Module.encoder_v2' in 'Module.encoder_v2.Linear.forward.0', 'Cell.encoder_v2' in a MindSpore "
            f"dump's): nothing was renamed by them"))
    summary.across_ranks = across_ranks(summary.pairs)
    for verdict in summary.across_ranks if not quiet else ():
        console.say(console.wrapped(report.across_ranks_line(verdict)))
    summary.not_compared = {side: [{"step": s, "rank": r} for s, r in places] for side, places in left.items()}
    for side, places in left.items():
        if places and not quiet:  # a step or rank of one side only: said, never dropped without a word
            console.say(console.wrapped(f"only in {side}, not compared: {', '.join(place(s, r) for s, r in places)}"))
    write_atomic(os.path.join(output_dir, "summary.json"), json.dumps(summary.to_json(), indent=1))
    summary.files.append(os.path.join(output_dir, "summary.json"))
    if html:
        html_report.write_html(os.path.join(output_dir, "report.html"), summary.to_json(), details)
        summary.files.append(os.path.join(output_dir, "report.html"))
    return summary
