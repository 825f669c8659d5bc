"""``msprobe-lite``: the command line of msprobe_lite.

Each subcommand is one ``_add_<name>(subparsers)`` function that declares its arguments and sets ``run`` to a
function ``(args) -> exit status``; add it to ``SUBCOMMANDS``. Exit status 0 means success and 2 a user error,
so scripts and CI can trust the status instead of parsing the output.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, List, Optional

from .config import ConfigError, config_schema, load_config, msprobe_note


def _config_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    print(f"{args.file}: valid (task={config.task}, level={config.level})")
    for setting in config.unused_settings():
        print(f"note: {setting} is set but task {config.task} does not read it (each task reads its own block)")
    note = msprobe_note(config.not_acted_on)
    if note:
        print(f"note: {note}")
    return 0


def _config_schema(args: argparse.Namespace) -> int:
    print(json.dumps(config_schema(), indent=2))
    return 0


def _add_config(subparsers: argparse._SubParsersAction) -> None:
    config = subparsers.add_parser("config", help="check a config.json, or print its JSON Schema")
    actions = config.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate FILE and list every problem in it")
    check.add_argument("file", metavar="FILE", help="path of a config.json")
    check.set_defaults(run=_config_check)
    actions.add_parser("schema", help="print the JSON Schema of config.json").set_defaults(run=_config_schema)


def _compare(args: argparse.Namespace) -> int:
    from .compare import CompareError, compare

    try:
        summary = compare(args.target_path, args.golden_path, args.output_path, xlsx=args.xlsx,
                          html=not args.no_html, mapping=args.mapping, workers=args.workers, explain=args.explain,
                          scheduler=args.scheduler)
    except CompareError as error:
        print(f"msprobe-lite compare: {error}", file=sys.stderr)
        return 2
    tables = sum(f.endswith(".csv") for f in summary.files)
    rest = [os.path.basename(f) for f in summary.files if not f.endswith(".csv")]
    print(f"results in {args.output_path}: {tables} CSV table{'s' if tables != 1 else ''}, {', '.join(rest)}")
    if summary.failed:  # said in their places: the others were compared and written
        print(f"msprobe-lite compare: {len(summary.failed)} step/rank pair{'s' if len(summary.failed) > 1 else ''} "
              f"could not be compared (said above, and in summary.json's \"failed\")", file=sys.stderr)
        return 2
    return 1 if summary.nothing_paired else 0  # compared nothing: no evidence that the runs agree


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _add_compare(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("compare", help="compare a target dump with a golden dump")
    cmd.add_argument("-tp", "--target_path", required=True,
                     help="target dump: dump.json, rank folder, step folder or dump root")
    cmd.add_argument("-gp", "--golden_path", required=True, help="golden dump, same kinds as -tp")
    cmd.add_argument("-o", "--output_path", default="compare_output", help="output folder (default %(default)s)")
    cmd.add_argument("--xlsx", action="store_true", help="also write .xlsx with error/warning rows highlighted")
    cmd.add_argument("--explain", action="store_true",
                     help="print each step's whole reasoning (as summary.json holds it) instead of its verdict block")
    html = cmd.add_mutually_exclusive_group()
    html.add_argument("--html", action="store_true", help="write report.html (the default)")
    html.add_argument("--no-html", action="store_true", help="skip report.html")
    cmd.add_argument("-dm", "--mapping", help="YAML mapping of target name fragments to golden name fragments")
    where = cmd.add_mutually_exclusive_group()  # a cluster's workers are set where they are started
    where.add_argument("-n", "--workers", type=_positive_int, default=None,
                       help="processes for step/rank pairs and tensor files (default: one per CPU)")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="compare the step/rank pairs on the workers of this Dask scheduler (tcp://host:8786), "
                            "which see the dumps and the output folder under the same paths; needs "
                            "msprobe_lite[distributed]")
    cmd.set_defaults(run=_compare)


def _overflow_check(args: argparse.Namespace) -> int:
    from .compare.overflow import analyse
    from .compare.read import DumpError
    from .compare.report import OutputError

    try:
        analyse(args.input_path, args.output_path)
    except (DumpError, OutputError) as error:
        print(f"msprobe-lite overflow_check: {error}", file=sys.stderr)
        return 2
    return 0


def _add_overflow_check(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("overflow_check", help="first call turning finite inputs into NaN/Inf, per rank")
    cmd.add_argument("-i", "--input_path", required=True, help="a step folder (or rank folder, dump root)")
    cmd.add_argument("-o", "--output_path", default=".", help="where overflow_summary.json goes")
    cmd.set_defaults(run=_overflow_check)


def _ckpt_convert(args: argparse.Namespace) -> int:
    try:
        from .mindspore.checkpoint import convert_checkpoint, load_name_map
    except ImportError as error:
        print(f"msprobe-lite ckpt convert: needs mindspore and torch installed ({error})", file=sys.stderr)
        return 2
    for path in (args.input, args.template):
        if not os.path.isfile(path):
            print(f"msprobe-lite ckpt convert: {path}: no such file", file=sys.stderr)
            return 2
    try:
        name_map = load_name_map(args.name_map) if args.name_map else None
        report = convert_checkpoint(args.input, args.output, args.template, name_map=name_map,
                                    trust=args.trust_checkpoint)
    except Exception as error:  # noqa: BLE001 - torch/MindSpore raise many types for a bad file
        print(f"msprobe-lite ckpt convert: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    if report.complete:
        print(f"wrote {args.output}")
        return 0
    # a partial checkpoint would load into a network that keeps its initial weights where no source was found
    left = len(report.missing) + len(report.mismatched)
    why = "no parameter converted" if not report.converted else \
        f"{left} of {left + len(report.converted)} MindSpore parameters without a PyTorch source of their shape"
    print(f"msprobe-lite ckpt convert: nothing written to {args.output}: {why}; attributes named otherwise in "
          f"the port are mapped with --name-map FILE (YAML, old: new; see docs/mindspore.md)", file=sys.stderr)
    return 1


def _ckpt_compare(args: argparse.Namespace) -> int:
    from .compare.weights import WeightsError, compare_weights

    try:
        rows = compare_weights(args.first, args.second, trust=args.trust_checkpoint)
    except WeightsError as error:
        print(f"msprobe-lite ckpt compare: {error}", file=sys.stderr)
        return 2
    for row in rows:
        numbers = "" if row.max_abs is None else \
            f"  max|diff| {row.max_abs:.3g}  rel_l2 {row.rel_l2:.3g}  cosine {row.cosine:.9f}"
        print(f"{row.result:15s} {row.name} {row.shape}{numbers}")
    counts = {}
    for row in rows:
        counts[row.result] = counts.get(row.result, 0) + 1
    print(", ".join(f"{n} {k}" for k, n in counts.items()))
    return 0 if all(r.result in ("equal", "close") for r in rows) else 1


TRUST_HELP = ("load PyTorch files with weights_only=False, for checkpoints holding objects such as "
              "argparse.Namespace: this runs the pickled code in the file, so only for files you made")


def _add_ckpt(subparsers: argparse._SubParsersAction) -> None:
    ckpt = subparsers.add_parser("ckpt", help="convert PyTorch weights to a MindSpore checkpoint; compare weights")
    actions = ckpt.add_subparsers(dest="action", metavar="ACTION", required=True)
    convert = actions.add_parser("convert", help="a PyTorch state_dict -> a MindSpore checkpoint (exit 1, and "
                                                 "nothing written, when a parameter has no source or a shape "
                                                 "differs)")
    convert.add_argument("-i", "--input", required=True, help="PyTorch weights (.pt/.pth): a state_dict, or a "
                                                              "training checkpoint holding one ({'model': ...}); "
                                                              "DDP's 'module.' prefix is removed")
    convert.add_argument("-o", "--output", required=True, help="MindSpore checkpoint to write (.ckpt)")
    convert.add_argument("-t", "--template", required=True,
                         help="a MindSpore checkpoint of the target network (mindspore.save_checkpoint(net, ...)): "
                              "gives the names, shapes and dtypes to produce")
    convert.add_argument("-m", "--name-map", metavar="FILE",
                         help="YAML of old: new name parts, for attributes the port named otherwise "
                              "(attn: attention renames that part of every PyTorch name)")
    convert.add_argument("--trust-checkpoint", action="store_true", help=TRUST_HELP)
    convert.set_defaults(run=_ckpt_convert)
    compare = actions.add_parser("compare", help="compare two weight files (.pt/.pth, .ckpt, .npz) parameter by "
                                                 "parameter (exit 1 when any differs or is unpaired)")
    compare.add_argument("first")
    compare.add_argument("second")
    compare.add_argument("--trust-checkpoint", action="store_true", help=TRUST_HELP)
    compare.set_defaults(run=_ckpt_compare)


def _compare_npy(args: argparse.Namespace) -> int:
    from .compare.npy_dirs import NpyDirError, compare_npy_dirs

    try:
        rows = compare_npy_dirs(args.target_path, args.golden_path, rtol=args.rtol, atol=args.atol)
    except NpyDirError as error:
        print(f"msprobe-lite compare_npy: {error}", file=sys.stderr)
        return 2
    for row in rows:
        print(row.line())
    counts = {}
    for row in rows:
        counts[row.result] = counts.get(row.result, 0) + 1
    print(", ".join(f"{n} {k}" for k, n in counts.items()) + f" (rtol {args.rtol:g}, atol {args.atol:g})")
    return 0 if all(r.allclose for r in rows) else 1


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of at least 0, got {text!r}")
    return value


def _add_compare_npy(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("compare_npy", help="compare two folders of .npy files matched by name (outputs or "
                                                    "gradients saved on each side; exit 1 when any is not allclose)")
    cmd.add_argument("-tp", "--target_path", required=True, help="folder of the target's .npy files (the port's)")
    cmd.add_argument("-gp", "--golden_path", required=True, help="folder of the golden's .npy files")
    cmd.add_argument("--rtol", type=_tolerance, default=1e-4,
                     help="relative tolerance of allclose (default %(default)g)")
    cmd.add_argument("--atol", type=_tolerance, default=1e-4,
                     help="absolute tolerance of allclose (default %(default)g)")
    cmd.set_defaults(run=_compare_npy)


def _acc_check(args: argparse.Namespace) -> int:
    from .acc_check import AccCheckError, acc_check

    try:
        summary = acc_check(args.input_path, args.output_path)
    except AccCheckError as error:
        print(f"msprobe-lite acc_check: {error}", file=sys.stderr)
        return 2
    c = summary["counts"]
    print(f"results in {args.output_path}: acc_check_summary.json, acc_check_result.csv"
          f"{', a section of report.html' if summary.get('report_section') else ''}")
    return 1 if c["pass"] + c["warning"] + c["error"] == 0 else 0  # replayed nothing: no evidence either way


def _add_acc_check(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("acc_check", help="replay every API call of a dump of task tensor in float64 and "
                                                  "name the first that loses more precision than its dtype explains")
    cmd.add_argument("-i", "--input_path", required=True, help="a dump of task tensor: dump.json, rank or step "
                                                               "folder, or dump root")
    cmd.add_argument("-o", "--output_path", default="acc_check_output",
                     help="output folder (default %(default)s); a report.html there gets a section")
    cmd.set_defaults(run=_acc_check)


SUBCOMMANDS: List[Callable[[argparse._SubParsersAction], None]] = [_add_config, _add_compare, _add_overflow_check,
                                                                    _add_ckpt, _add_compare_npy, _add_acc_check]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="msprobe-lite", description="Precision debugger for deep-learning training.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Console entry point: run one subcommand and return its exit status (2 for bad arguments)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help (0) and on bad arguments (2)
        return int(exit_.code or 0)
    try:
        return args.run(args)
    except BrokenPipeError:  # `msprobe-lite compare ... | head -1`: the reader left; no traceback for it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush of stdout at exit would raise again
        return 128 + 13  # as a command killed by SIGPIPE
