"""The configuration of a msprobe_lite run: the model of ``config.json``, its loader and ``ConfigError``.

Why it is strict: a debugger that ignores a misspelt key (``"stpe"`` dumps every step) or reads ``"true"`` as a
bool collects the wrong data, and the user finds out after a long training run. So every key must be known,
every type must be exact, and every problem in a file is reported at once, with its path, the value given and
what is allowed, before anything is created on disk. ``docs/config.md`` is the user's reference.

Validators inside the models raise ``ConfigError`` with paths relative to the value they check (``""`` for the
value itself, ``"[2]"`` for one of its elements); ``_problems`` prefixes them with pydantic's location, so a
rule is written once and reported with its full path (``statistics.data_mode[1]``).
"""
from __future__ import annotations

import bisect
import difflib
import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Collection, Dict, FrozenSet, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, WithJsonSchema,
                      field_validator, model_validator)
from pydantic_core import core_schema

from .core.naming import BACKWARD, PARAMS_GRAD, direction_of
from .core.paths import file_in_the_way
from .core.small_file import SmallFileError, read_small_text

__all__ = [
    "DEFAULT_CONFIG_PATH", "ConfigError", "DebuggerConfig", "IndexSet", "OverflowCheckConfig", "Problem",
    "SelectionConfig", "StatisticsConfig", "config_schema", "load_config", "msprobe_note",
]

DEFAULT_CONFIG_PATH = Path(__file__).with_name("config.json")

Task = Literal["statistics", "tensor", "overflow_check", "structure"]
Level = Literal["L0", "L1", "mix", "debug"]
DataMode = Literal["all", "forward", "backward", "input", "output"]
SummaryMode = Literal["statistics", "md5"]
DIRECTIONS: FrozenSet[str] = frozenset({"forward", "backward"})
PARTS: FrozenSet[str] = frozenset({"input", "output"})


# ---------------------------------------------------------------------------------------------- errors

def _show(value: Any, limit: int = 80) -> str:
    """repr of a user's value, cut short so that one huge value cannot flood the message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _join(prefix: str, path: str) -> str:
    """Path `path` (relative, e.g. ``[1]`` or ``list``) seen from the value at `prefix`."""
    if not prefix or not path:
        return prefix or path
    return prefix + (path if path.startswith("[") else "." + path)


@dataclass(frozen=True)
class Problem:
    """One invalid value: where it is (``statistics.data_mode[1]``), what was given, what is allowed."""

    path: str
    value: Any
    expected: str

    def __str__(self) -> str:
        return f"{self.path}: got {_show(self.value)}; expected {self.expected}"


class ConfigError(ValueError):
    """Every problem of one configuration, reported together so the user fixes them in one edit.

    `source` names where the values came from: the config file's path, or ``"arguments"``.
    """

    def __init__(self, problems: Iterable[Problem], source: str = "arguments") -> None:
        self.problems: List[Problem] = list(problems)
        self.source = source
        super().__init__(self.problems, source)  # args rebuild the error when it is pickled

    def __str__(self) -> str:
        count = len(self.problems)
        head = f"Invalid msprobe_lite config from {self.source} ({count} problem{'s' if count != 1 else ''}):"
        return "\n".join([head, *(f"  {problem}" for problem in self.problems)])


def _invalid(value: Any, expected: str, path: str = "") -> ConfigError:
    """The error a validator raises for one bad value; `path` is relative to the value it validates."""
    return ConfigError([Problem(path, value, expected)])


# ---------------------------------------------------------------------------------------------- IndexSet

_INDEX_RE = re.compile(r"\s*([0-9]{1,18})\s*(?:-\s*([0-9]{1,18})\s*)?")
_INDEX_EXPECTED = 'a non-negative integer, or a string "a" or "a-b" with a <= b (numbers of up to 18 digits)'


def _span(item: Any) -> Optional[Tuple[int, int]]:
    """(first, last) of one ``rank``/``step`` element, or None when it is not one."""
    if isinstance(item, int) and not isinstance(item, bool):
        return (item, item) if item >= 0 else None
    match = _INDEX_RE.fullmatch(item) if isinstance(item, str) else None
    if not match:
        return None
    first, last = int(match[1]), int(match[2] or match[1])
    return (first, last) if first <= last else None


def _merge(spans: Iterable[Tuple[int, int]]) -> Tuple[Tuple[int, int], ...]:
    """Sorted, disjoint, non-adjacent spans covering the same numbers."""
    merged: List[Tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return tuple(merged)


class IndexSet:
    """The ranks or steps to dump, as merged intervals: ``[0, "4-6"]`` holds 0, 4, 5 and 6; ``[]`` holds all.

    Intervals, not a set of numbers, so that ``"0-1000000000"`` costs two integers. Immutable and hashable.
    """

    __slots__ = ("spans",)
    spans: Tuple[Tuple[int, int], ...]

    def __init__(self, items: Iterable[Union[int, str]] = ()) -> None:
        items = list(items)
        spans = [_span(item) for item in items]
        bad = [Problem(f"[{i}]", item, _INDEX_EXPECTED) for i, (item, span) in enumerate(zip(items, spans)) if not span]
        if bad:
            raise ConfigError(bad)
        object.__setattr__(self, "spans", _merge(spans))  # type: ignore[arg-type]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("IndexSet is immutable")

    @property
    def everything(self) -> bool:
        """True when the list was empty: every rank or step is dumped."""
        return not self.spans

    @property
    def last(self) -> Optional[int]:
        """Largest listed value (after it the debugger stops for good), or None when everything is listed."""
        return self.spans[-1][1] if self.spans else None

    def __contains__(self, number: int) -> bool:
        if not self.spans:
            return True
        i = bisect.bisect_right(self.spans, (number, math.inf)) - 1
        return i >= 0 and number <= self.spans[i][1]

    def to_list(self) -> List[Union[int, str]]:
        """The JSON form, normalised: ``[0, "4-6"]``."""
        return [first if first == last else f"{first}-{last}" for first, last in self.spans]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IndexSet) and self.spans == other.spans

    def __hash__(self) -> int:
        return hash(self.spans)

    def __repr__(self) -> str:
        return f"IndexSet({self.to_list()!r})"

    @classmethod
    def _validate(cls, value: Any) -> "IndexSet":
        if isinstance(value, cls):
            return value
        if not isinstance(value, list):
            raise _invalid(value, f"a list whose elements are each {_INDEX_EXPECTED}")
        return cls(value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(cls.to_list))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> Dict[str, Any]:
        return {"type": "array", "items": {"anyOf": [
            {"type": "integer", "minimum": 0},
            {"type": "string", "pattern": r"^\s*[0-9]+\s*(-\s*[0-9]+\s*)?$", "description": '"a" or "a-b", a <= b'},
        ]}}


# ---------------------------------------------------------------------------------------------- dump_path

def _absolute(given: str) -> str:
    """`given` with `~` expanded, made absolute against the working folder, without `.` parts or repeated
    separators. A `..` is kept for the kernel to resolve (by hand, `link/..` would name another folder than the
    kernel's), and must follow an existing folder: making the folders of `a/missing/../d` leaves a stray
    `a/missing`, and below `a_file` nothing can be made."""
    expanded = os.path.expanduser(given)
    try:
        here = os.getcwd()
    except OSError as exc:
        raise _invalid(given, f"an absolute path: the working folder is gone ({exc.strerror})") from None
    parts = expanded.split(os.sep)
    for i, part in enumerate(parts):
        before = os.sep.join(parts[:i])
        if part != ".." or not before.strip("." + os.sep):  # "..", "./.." and "/.." step out of a real folder
            continue
        if not os.path.isdir(os.path.join(here, before)):
            what = "is a file" if os.path.lexists(os.path.join(here, before)) else "does not exist"
            raise _invalid(given, f"a folder path whose every '..' follows an existing folder, but {before!r} "
                                  f"{what} (stepping out of it needs it made first, and it would stay behind)")
    kept = [part for part in os.path.join(here, expanded).split(os.sep) if part not in ("", ".")]
    return os.sep + os.sep.join(kept)


# ---------------------------------------------------------------------------------------------- msprobe's own keys

# Keys of the config.json of msprobe (mindstudio-probe), the tool whose dump format msprobe_lite writes, that
# msprobe_lite does not act on: taken from msprobe's config guide and its 26.2 package (and the releases before),
# so that a user's msprobe config loads as it is. Each is accepted only where msprobe reads it (a key of its
# tensor block inside `tensor`), with any value; a key nobody defines stays an error.
MSPROBE_TOP_KEYS: FrozenSet[str] = frozenset({
    # blocks of msprobe's other tasks
    "acc_check", "run_ut", "free_benchmark", "grad_probe", "nan_check", "diff_check", "exception_dump", "structure",
    "load",
    # switches
    "seed", "is_deterministic", "enable_dataloader", "acl_config", "precision", "risk_level", "dump_enable",
    "custom_op_namespaces",
})
MSPROBE_BLOCK_KEYS: Mapping[str, FrozenSet[str]] = {
    "statistics": frozenset({"device", "precision", "slice", "request_id"}),
    "tensor": frozenset({"backward_input", "file_format", "bench_path", "online_run_ut", "nfs_path", "host", "port",
                         "slice", "request_id"}),
    "overflow_check": frozenset({"check_mode"}),
}
# what msprobe_lite offers instead, where it has something
_MSPROBE_INSTEAD = {"seed": "use seed_all()", "is_deterministic": "use seed_all()",
                    "enable_dataloader": "step() ends a step"}
_NOTE_WIDTH = 136  # 160 characters with the log's "[msprobe_lite] WARNING: " in front


def _set_aside(data: Any, fields: Collection[str]) -> Tuple[Any, Tuple[str, ...]]:
    """(`data` without msprobe's keys that are not `fields`, their paths in the order given)."""
    if not isinstance(data, dict):
        return data, ()
    kept, aside = dict(data), []
    for key in data:
        if key in MSPROBE_TOP_KEYS and key not in fields:
            aside.append(key)
            del kept[key]
        elif key in MSPROBE_BLOCK_KEYS and isinstance(data[key], dict):
            block = {k: v for k, v in data[key].items() if k not in MSPROBE_BLOCK_KEYS[key]}
            aside += [f"{key}.{k}" for k in data[key] if k not in block]
            kept[key] = block
    return kept, tuple(aside)


def msprobe_note(paths: Sequence[str]) -> Optional[str]:
    """The one line that says which of msprobe's keys were accepted and are not acted on (None for none)."""
    if not paths:
        return None
    instead = list(dict.fromkeys(text for key, text in _MSPROBE_INSTEAD.items() if key in paths))
    tail = f" ({'; '.join(instead)})" if instead else ""
    shown = len(paths)
    while True:  # as many names as one line holds, then how many more
        names = ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if shown < len(paths) else "")
        note = f"msprobe's {names} {'is' if len(paths) == 1 else 'are'} accepted and not acted on by msprobe_lite{tail}"
        if len(note) <= _NOTE_WIDTH or shown == 1:
            return note
        shown -= 1


# ---------------------------------------------------------------------------------------------- models

def _name(value: str) -> str:
    if not value.strip():
        raise _invalid(value, "a non-empty name")
    return value


Name = Annotated[str, AfterValidator(_name), WithJsonSchema({"type": "string", "minLength": 1})]


class _Strict(BaseModel):
    """Unknown keys and loose types are errors; a validated config never changes."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _chosen(modes: Sequence[str], kinds: FrozenSet[str]) -> FrozenSet[str]:
    """The `kinds` named in `modes`; none named (or ``all``) means every kind."""
    return kinds.intersection(modes) or kinds


class SelectionConfig(_Strict):
    """Which records a task keeps. Every filter empty (the default) keeps everything."""

    scope: List[Name] = Field([], description=(
        "An inclusive range [first, last] of record names (API or module) to dump; [] for no range."))
    list: List[Name] = Field([], description=(
        'Names or name fragments to dump ("linear" matches every *.linear.*; a full name matches one record).'))
    data_mode: List[DataMode] = Field(["all"], json_schema_extra={"minItems": 1, "uniqueItems": True}, description=(
        '["all"], or any of "forward", "backward", "input", "output": which parts of each call are dumped.'))

    @field_validator("scope")
    @classmethod
    def _scope_pair(cls, scope: List[str]) -> List[str]:
        if len(scope) not in (0, 2):
            raise _invalid(scope, "0 or 2 names: [] or [first, last]")
        if scope and direction_of(scope[0]) in (BACKWARD, PARAMS_GRAD):
            # the range opens when its first call starts, and a backward record's call does not start as a
            # forward one does (the decision to hook a call's gradients is made in its forward call)
            raise _invalid(scope[0], "the name of a forward record (such as Functional.linear.0.forward or "
                           "Module.fc1.Linear.forward.0) to open the range: backward records follow their forward "
                           "calls, so the range of forward calls also gives their backward records; to dump "
                           "backward records only, add data_mode [\"backward\"] (a range of backward records as "
                           "such is not supported)", path="[0]")
        return scope

    @field_validator("data_mode")
    @classmethod
    def _data_mode(cls, modes: List[str]) -> List[str]:
        if not modes:
            raise _invalid(modes, '["all"] or a non-empty list of "forward", "backward", "input", "output"')
        repeat = next((i for i, mode in enumerate(modes) if mode in modes[:i]), None)
        if repeat is not None:
            raise _invalid(modes[repeat], "each mode at most once", path=f"[{repeat}]")
        if "all" in modes and len(modes) > 1:
            raise _invalid(modes, '"all" alone, or modes without "all"')
        return modes

    @property
    def directions(self) -> FrozenSet[str]:
        """``forward``/``backward`` kept by data_mode (``all`` or neither named: both)."""
        return _chosen(self.data_mode, DIRECTIONS)

    @property
    def parts(self) -> FrozenSet[str]:
        """``input``/``output`` kept by data_mode (``all`` or neither named: both)."""
        return _chosen(self.data_mode, PARTS)


class StatisticsConfig(SelectionConfig):
    """Settings of task statistics: the selection, plus how tensors are summarised."""

    summary_mode: SummaryMode = Field("statistics", description=(
        '"statistics" (Max/Min/Mean/Norm per tensor), or "md5" to add a CRC-32 of each tensor.'))
    tensor_list: List[Name] = Field([], description=(
        "Record names or name fragments whose tensors are also saved to files."))


class OverflowCheckConfig(_Strict):
    """Settings of task overflow_check."""

    overflow_nums: int = Field(1, json_schema_extra={"anyOf": [{"const": -1}, {"minimum": 1}]},
                               description="Stop after this many overflowing calls; -1 = never stop.")

    @field_validator("overflow_nums")
    @classmethod
    def _count(cls, count: int) -> int:
        if count != -1 and count < 1:
            raise _invalid(count, "-1 (never stop) or an integer >= 1")
        return count


class DebuggerConfig(_Strict):
    """One msprobe_lite run: what is collected, where it is written, and for which ranks and steps."""

    task: Task = Field("statistics", description=(
        "What is collected: statistics, tensor (statistics + every tensor saved), overflow_check (only calls "
        "whose outputs hold NaN/Inf) or structure (names, stacks and hierarchy only)."))
    dump_path: str = Field("./dump_path", validate_default=True, description=(
        "Root folder of the dump tree; created if missing. `~` is the home folder; a relative path is taken from "
        "the working folder of when the config is read (the debugger is made)."))
    rank: IndexSet = Field(IndexSet(), description='Ranks to dump, e.g. [0, "4-6"]; [] = all.')
    step: IndexSet = Field(IndexSet(), description=(
        'Steps to dump, e.g. [0, "4-6"]; [] = all. After the last listed step collection stops for good.'))
    level: Level = Field("L1", description=(
        "Granularity: L0 modules, L1 APIs, mix both (with the API->module hierarchy), debug only save()."))
    extra_info: bool = Field(True, description="Also write stack.json and construct.json.")
    async_dump: bool = Field(False, description=(
        "Collect without synchronising the device per call; write at stop()/step()."))
    statistics: StatisticsConfig = Field(StatisticsConfig(), description="Settings of task statistics.")
    tensor: SelectionConfig = Field(SelectionConfig(), description="Settings of task tensor.")
    overflow_check: OverflowCheckConfig = Field(OverflowCheckConfig(), description="Settings of task overflow_check.")
    _not_acted_on: Tuple[str, ...] = PrivateAttr(())

    @model_validator(mode="wrap")
    @classmethod
    def _msprobe_keys(cls, data: Any, handler: Any) -> "DebuggerConfig":
        """msprobe's own keys are set aside before the strict validation, and kept to be named in a note."""
        kept, aside = _set_aside(data, cls.model_fields)
        config = handler(kept)
        config._not_acted_on = aside
        return config

    @property
    def not_acted_on(self) -> Tuple[str, ...]:
        """Paths of the keys of msprobe's config that were given, accepted, and do nothing here."""
        return self._not_acted_on

    @field_validator("dump_path")
    @classmethod
    def _dump_path(cls, given: str) -> str:
        """The folder as an absolute path, fixed now: a later `os.chdir` of the script must not move the dump."""
        if not given.strip():
            raise _invalid(given, "a non-empty folder path")
        if "\0" in given:
            raise _invalid(given, "a folder path without NUL characters")
        path = _absolute(given)
        if os.path.islink(path):
            raise _invalid(given, f"a real folder, but this is a symbolic link to {os.readlink(path)!r}: "
                                  "give the folder it points to, or another path")
        if os.path.exists(path) and not os.path.isdir(path):
            raise _invalid(given, "a folder path, but this is an existing file")
        above = file_in_the_way(path)
        if above is not None:
            raise _invalid(given, f"a folder path, but {above!r} on the way to it is a file")
        return path

    @model_validator(mode="after")
    def _async_tensor(self) -> "DebuggerConfig":
        if self.async_dump and self.task == "tensor" and not self.tensor.list:
            raise _invalid(self.tensor.list, "a non-empty list when async_dump is true and task is 'tensor' "
                                             "(the tensors stay in memory until the step ends)", path="tensor.list")
        return self

    def unused_settings(self) -> List[str]:
        """Settings given a value other than their default in a block that the task does not read
        (`statistics.list` with task tensor): taken for a filter by the user, and ignored by the run."""
        blocks = {"statistics": self.statistics, "tensor": self.tensor, "overflow_check": self.overflow_check}
        unused = []
        for name, block in blocks.items():
            if name == self.task:
                continue
            default = type(block)()
            unused += [f"{name}.{field}" for field in type(block).model_fields
                       if getattr(block, field) != getattr(default, field)]
        return unused

    @property
    def selection(self) -> SelectionConfig:
        """The settings block of the active task; tasks without one keep everything."""
        block = {"statistics": self.statistics, "tensor": self.tensor}.get(self.task)
        return block if block is not None else SelectionConfig()

    @property
    def directions(self) -> FrozenSet[str]:
        """Directions (``forward``/``backward``) the active task dumps."""
        return self.selection.directions

    @property
    def parts(self) -> FrozenSet[str]:
        """Parts of a call (``input``/``output``) the active task dumps."""
        return self.selection.parts


# ---------------------------------------------------------------------------------------------- validation

_TYPE_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "bool_type": "true or false",
    "list_type": "a list",
    "model_type": "an object {...}",
}


def _render(loc: Sequence[Union[int, str]]) -> str:
    """``statistics.data_mode[1]``; a key that is not a plain name is quoted: ``[""]``, ``["a.b"]``."""
    return "".join(f".{key}" if isinstance(key, str) and key.isidentifier()
                   else f"[{json.dumps(key, ensure_ascii=False)}]" for key in loc).lstrip(".")


def _known_keys(loc: Sequence[Union[int, str]]) -> str:
    """What an unknown key at `loc` should have been: the keys of its object, and the closest one."""
    model: Any = DebuggerConfig
    for key in loc[:-1]:
        model = model.model_fields[key].annotation
    keys = list(model.model_fields)
    msprobes = MSPROBE_TOP_KEYS if len(loc) == 1 else MSPROBE_BLOCK_KEYS.get(str(loc[0]), frozenset())
    close = difflib.get_close_matches(str(loc[-1]), keys + sorted(msprobes), n=1)
    # a setting of a task's block written at the top (`summary_mode` for `statistics.summary_mode`)
    blocks = [name for name, field in model.model_fields.items() if isinstance(field.annotation, type)
              and issubclass(field.annotation, BaseModel) and loc[-1] in field.annotation.model_fields]
    hint = f"; {loc[-1]!r} is a setting of {' and '.join(map(repr, blocks))}: write it inside that block" \
        if blocks else f"; did you mean {close[0]!r}?" if close else ""
    return "a known key: " + ", ".join(map(repr, keys)) + hint


def _closest_value(value, options: List[str]) -> str:
    """`; did you mean 'L1'?` for 'l1' (case) or 'statistic' (a typo), else nothing."""
    text = str(value)
    same = [o for o in options if o.lower() == text.lower()]
    close = same or difflib.get_close_matches(text, options, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _expected(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return _known_keys(error["loc"])
    if kind == "literal_error":
        expected = error["ctx"]["expected"]
        return "one of " + expected.replace(" or ", ", ") + _closest_value(error["input"],
                                                                          re.findall(r"'([^']*)'", expected))
    return _TYPE_EXPECTED.get(kind, error["msg"])


def _problems(error: ValidationError) -> List[Problem]:
    """pydantic's errors as Problems with plain paths and plain English."""
    problems: List[Problem] = []
    for item in error.errors(include_url=False):
        where = _render(item["loc"])
        cause = item.get("ctx", {}).get("error")
        if isinstance(cause, ConfigError):
            problems += [replace(p, path=_join(where, p.path)) for p in cause.problems]
        else:
            problems.append(Problem(where, item["input"], _expected(item)))
    return problems


def _top_key(path: str) -> str:
    return re.match(r"[^.\[]*", path)[0]


def _validate(data: Mapping[str, Any], source: str, arguments: Collection[str] = ()) -> DebuggerConfig:
    """Validate `data`; problems in the top-level keys `arguments` are marked as coming from arguments."""
    try:
        return DebuggerConfig.model_validate(data)
    except ValidationError as error:
        problems = [replace(p, path=p.path + " (argument)") if _top_key(p.path) in arguments else p
                    for p in _problems(error)]
        raise ConfigError(problems, source) from None


def _read_json(path: Path) -> Dict[str, Any]:
    """The JSON object in `path`; every way of failing is a ConfigError naming the file."""
    def fail(where: str, value: Any, expected: str) -> ConfigError:
        return ConfigError([Problem(where, value, expected)], str(path))

    try:
        text = read_small_text(path)  # a regular file of a few MB at most: never /dev/zero, a FIFO or a huge file
    except SmallFileError as exc:
        raise fail("config_path", str(path), exc.expected) from None
    repeated: list = []  # (the object, key, every value given to it) where an object names a key twice

    def no_repeats(pairs: list) -> dict:  # json keeps the last of a repeated key: an edit that did nothing
        seen: dict = {}
        twice: dict = {}
        for key, value in pairs:
            if key in seen:
                twice.setdefault(key, [seen[key]]).append(value)
            seen[key] = value
        repeated.extend((seen, key, values) for key, values in twice.items())
        return seen

    try:
        data = json.loads(text, object_pairs_hook=no_repeats)
    except json.JSONDecodeError as exc:
        lines = text.splitlines()
        line = lines[exc.lineno - 1].strip() if exc.lineno <= len(lines) else ""
        raise fail(f"line {exc.lineno}, column {exc.colno}", line, f"valid JSON ({exc.msg})") from None
    except RecursionError:
        raise fail("config_path", str(path), "JSON nested a few hundred levels deep at most") from None
    if not isinstance(data, dict):
        raise fail("(top level)", data, 'a JSON object such as {"task": "statistics"}')
    if repeated:
        where = _object_paths(data)
        raise ConfigError([Problem(where.get(id(obj), "") + key, values, "the key once in its object (JSON keeps "
                                                                         "only the last value, and the others would "
                                                                         "be ignored)")
                           for obj, key, values in repeated], str(path))
    return data


def _object_paths(value, prefix: str = "", found: dict | None = None) -> dict:
    """id(object) -> the path its keys are written under (`statistics.`), for the objects of a JSON value."""
    found = {} if found is None else found
    if isinstance(value, dict):
        found[id(value)] = prefix
        for key, item in value.items():
            _object_paths(item, f"{prefix}{key}.", found)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _object_paths(item, f"{prefix[:-1]}[{i}].", found)
    return found


def load_config(config_path: Union[str, os.PathLike, None] = None, *, task: Optional[str] = None,
                dump_path: Union[str, os.PathLike, None] = None, level: Optional[str] = None,
                step: Optional[List[Union[int, str]]] = None) -> DebuggerConfig:
    """Read and validate a config file (None: the packaged default); arguments that are not None override it.

    Raises ConfigError listing every problem of the file and the arguments. Creates nothing on disk.
    """
    path = Path(config_path) if config_path is not None else DEFAULT_CONFIG_PATH
    if isinstance(dump_path, os.PathLike):
        dump_path = os.fspath(dump_path)
    overrides = {key: value for key, value in
                 (("task", task), ("dump_path", dump_path), ("level", level), ("step", step)) if value is not None}
    # without a file of the user's, the source said is the arguments over the packaged defaults
    source = str(path) if config_path is not None else f"the arguments (over the defaults of {path})"
    return _validate({**_read_json(path), **overrides}, source, overrides)


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    """`node` with every ``$ref`` replaced by its definition and pydantic's generated titles dropped."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return {key: value if key == "default" else _inline(value, defs) for key, value in node.items() if key != "title"}


def config_schema() -> Dict[str, Any]:
    """JSON Schema of config.json, self-contained (no ``$ref``) and described field by field."""
    schema = DebuggerConfig.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "msprobe_lite config.json",
            **_inline(schema, defs)}
