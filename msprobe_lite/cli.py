"""``msprobe-lite``: the command line of msprobe_lite.

Each subcommand is one ``_add_<name>(subparsers)`` function that declares its arguments and sets ``run`` to a
function ``(args) -> exit status``; add it to ``SUBCOMMANDS``. Exit status 0 means success and 2 a user error,
so scripts and CI can trust the status instead of parsing the output.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, List, Optional

from .config import ConfigError, config_schema, load_config


def _config_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    print(f"{args.file}: valid (task={config.task}, level={config.level})")
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


SUBCOMMANDS: List[Callable[[argparse._SubParsersAction], None]] = [_add_config]


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
    return args.run(args)
