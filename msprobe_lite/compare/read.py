"""Reading dumps: resolve what the user pointed at, load dump.json/stack.json/construct.json, fail clearly.

Accepts a dump.json file, a rank folder (`rank`, `rank{R}`, the reference's `proc<pid>`), a step folder (all its
ranks) or a dump root (all its steps). The only parser of the dump format in msprobe_lite. Also MindSpore's own
Dump (the `path` of its config, or a rank_{id} folder): each iteration is read as a step by `native_read`.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.small_file import SmallFileError, file_kind, open_regular, read_small_text


class DumpError(ValueError):
    """A dump that cannot be read, named with its path and what is wrong."""


_RANK = re.compile(r"^(rank(\d*)|proc\d+)$")
_STEP = re.compile(r"^step(\d+)$")


@dataclass
class Dump:
    """One rank of one step."""

    path: str                          # the dump.json file
    step: int | None
    rank: int | None
    task: str
    level: str
    framework: str
    data_dir: str | None
    records: dict                      # name -> record, in execution order
    stacks: dict = field(default_factory=dict)     # record name -> frames
    parents: dict = field(default_factory=dict)    # record name -> parent record name
    _rows: dict = field(default_factory=dict, repr=False)
    _roles: frozenset | None = field(default=None, repr=False)

    def rows(self, name: str) -> list:
        """The record flattened into rows, computed once (pairing, precision and judging all use them)."""
        rows = self._rows.get(name)
        if rows is None:
            from .rows import RowError, record_rows
            try:
                rows = self._rows[name] = record_rows(name, self.records[name])
            except RowError as exc:
                raise DumpError(f"{self.path}: record {name!r}: {exc}") from None
        return rows

    def parent_chain(self, name: str) -> list:
        """The record's parent modules from construct.json, innermost first (a cycle is cut)."""
        chain, parent = [], self.parents.get(name)
        while isinstance(parent, str) and parent not in chain:
            chain.append(parent)
            parent = self.parents.get(parent)
        return chain

    def roles(self) -> frozenset:
        """The parts (input, output) that the dump's call records hold: one only in a dump made with a
        `data_mode` filter. Decided for the whole dump, not per record: a backward record without input
        gradients in an unfiltered dump is a difference, not a filter's choice."""
        if self._roles is None:
            from .pair import split_name
            from .rows import PART_ROLES
            found: set = set()
            for name, record in self.records.items():
                if split_name(name)[1] is not None:  # calls; parameter gradients hold outputs only
                    # a part's key, even empty (`"output": []` of a call that returns nothing): it was dumped
                    found.update(PART_ROLES[key] for key in record if key in PART_ROLES)
                    if len(found) == 2:
                        break
            # no call records (a debug.json of save() entries): nothing tells of a filter
            self._roles = frozenset(found) if found else frozenset(("input", "output"))
        return self._roles


def _load_json(path: str, what: str):
    try:
        with open_regular(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise DumpError(f"{path}: no such file ({what})") from None
    except SmallFileError as exc:  # a FIFO or a device where a dump file belongs: refused without blocking
        raise DumpError(f"{path}: cannot be read ({what}): expected {exc.expected}") from None
    except json.JSONDecodeError as exc:
        message = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg  # "Unterminated string starting at"
        raise DumpError(f"{path}: not valid JSON ({what}): {message} at line {exc.lineno}, "
                        f"column {exc.colno} -- is the file truncated?") from None
    except RecursionError:  # json's C decoder stops at Python's recursion limit (about 1,000 levels)
        raise DumpError(f"{path}: values nested too deep to read ({what}): a dump nests a few levels") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpError(f"{path}: cannot be read ({what}): {exc}") from None


def _texts(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _load_stacks(path: str) -> dict:
    """record name -> frames, from {"0": [[names], [frames]]} (identical stacks stored once) or from the
    older {name: [frames]} of the reference tool's 1.x versions."""
    raw = _load_json(path, "stack.json")
    if not isinstance(raw, dict):
        raise DumpError(f"{path}: expected an object of call stacks, got {type(raw).__name__}")
    stacks = {}
    for key, entry in raw.items():
        if isinstance(entry, list) and len(entry) == 2 and _texts(entry[0]) and isinstance(entry[1], str):
            entry = [entry[0], [entry[1]]]   # a stack written as one text
        if isinstance(entry, list) and len(entry) == 2 and _texts(entry[0]) and _texts(entry[1]):
            stacks.update(dict.fromkeys(entry[0], entry[1]))
        elif _texts(entry):
            stacks[key] = entry
        else:
            raise DumpError(f"{path}: entry {key!r}: expected [[record names], [frames]] or a list of frames, "
                            f"as text")
    return stacks


def _load_parents(path: str) -> dict:
    """record name -> parent record name (or null), from construct.json."""
    raw = _load_json(path, "construct.json")
    if not isinstance(raw, dict):
        raise DumpError(f"{path}: expected an object of record name -> parent name, got {type(raw).__name__}")
    for name, parent in raw.items():
        if parent is not None and not isinstance(parent, str):
            raise DumpError(f"{path}: the parent of {name!r} is {parent!r}, expected a record name or null")
    return raw


class NativeRef(str):
    """Where `resolve` found one iteration of a MindSpore native Dump (seed 002): the text is its first folder,
    `dirs` all its folders (one per graph), read by `core.mindspore_dump` in place of a dump.json."""

    dirs: list = []
    step = rank = None


def _native(path: str) -> list:
    from ..core import mindspore_dump as native_read
    out = []
    for it, rank, dirs in native_read.iterations(path):
        ref = NativeRef(dirs[0])
        ref.dirs, ref.step, ref.rank = dirs, it, rank
        out.append((it, rank, ref))
    if not out:
        raise DumpError(f"{path}: a MindSpore Dump folder with no iteration folder holding tensor files")
    return out


def _load_native(ref: NativeRef, step, rank) -> Dump:
    from ..core import mindspore_dump as native_read
    try:
        data, parents, stacks = native_read.records(ref.dirs)
    except (OSError, ValueError) as exc:
        raise DumpError(f"{ref}: cannot be read as a MindSpore Dump: {exc}") from None
    return Dump(path=str(ref), step=step, rank=rank, task="statistics", level="mix", framework="mindspore",
                data_dir=None, records=data, stacks=stacks, parents=parents)


def load_dump(dump_json: str, step: int | None = None, rank: int | None = None) -> Dump:
    if isinstance(dump_json, NativeRef):
        return _load_native(dump_json, step, rank)
    content = _load_json(dump_json, "dump.json")
    if not isinstance(content, dict) or not isinstance(content.get("data"), dict):
        raise DumpError(f"{dump_json}: not a dump.json: expected an object with a \"data\" object "
                        f"(got {type(content).__name__}{' without data' if isinstance(content, dict) else ''})")
    debug = content.get("level") == "debug"  # save() of a list or tuple: a list record
    if "" in content["data"]:  # a name is where a record sits in the code; an empty one pairs as "no record"
        raise DumpError(f"{dump_json}: a record named \"\" (an empty name): expected a record name such as "
                        f"\"Functional.linear.0.forward\"")
    for name, record in content["data"].items():
        if not isinstance(record, dict) and not (debug and isinstance(record, list)):
            raise DumpError(f"{dump_json}: record {name!r} is a {type(record).__name__}, expected an object")
    return _dump(dump_json, step, rank, content, _by_dependency(content["data"]))


def table_dump(table, step: int | None = None, rank: int | None = None) -> Dump:
    """The Dump of a dump.json read into columns (compare/table.py): its records are read one by one from the
    file when asked (compare/columnar.py judges most of them on the columns and needs few whole)."""
    dump = _dump(table.path, step, rank, table.header, _Records(table))
    dump._roles = _table_roles(table)
    return dump


def _dump(dump_json: str, step, rank, header: dict, records) -> Dump:
    """A Dump of `records`, with the stacks and hierarchy beside its dump.json."""
    folder = os.path.dirname(os.path.abspath(dump_json))
    stack_file = os.path.join(folder, "stack.json")
    stacks = _load_stacks(stack_file) if os.path.lexists(stack_file) else {}
    construct_file = os.path.join(folder, "construct.json")
    parents = _load_parents(construct_file) if os.path.lexists(construct_file) else {}
    task = str(header.get("task", "statistics"))
    return Dump(path=dump_json, step=step, rank=rank, task=task,
                level=str(header.get("level", "")), framework=str(header.get("framework", "")),
                data_dir=_tensor_folder(dump_json, folder, header.get("dump_data_dir"), task),
                records=records, stacks=stacks, parents=parents)


def has_hierarchy(dump_json: str) -> bool:
    """Whether the construct.json beside a dump.json names a parent (modules: L0, mix; an L1 dump's is {}).
    True where it cannot be read here: load_dump then says what is wrong with it."""
    construct = os.path.join(os.path.dirname(os.path.abspath(dump_json)), "construct.json")
    if not os.path.lexists(construct):
        return False
    try:
        return os.path.getsize(construct) > 64 or json.loads(read_small_text(construct) or "{}") != {}
    except (OSError, ValueError, SmallFileError):
        return True


class _Records(Mapping):
    """A dump's records by name, each read from its place in dump.json when asked."""

    def __init__(self, table):
        self._table = table
        self._index = None
        self._fd = None  # opened at the first record asked for, closed with this object

    def __len__(self) -> int:
        return len(self._table.names)

    def __iter__(self):
        return iter(self._table.names)

    def __contains__(self, name) -> bool:
        return name in self._where()

    def _where(self) -> dict:
        if self._index is None:
            self._index = {name: i for i, name in enumerate(self._table.names)}
        return self._index

    def __getitem__(self, name):
        offset, length = (int(v) for v in self._table.spans[self._where()[name]])
        if self._fd is None:
            import weakref

            self._fd = os.open(self._table.path, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fd)
        try:
            return json.loads(os.pread(self._fd, length, offset))
        except ValueError:  # the file changed since it was read
            raise DumpError(f"{self._table.path}: record {name!r} is no longer where it was when read: was "
                            f"the dump rewritten meanwhile?") from None


def _table_roles(table) -> frozenset:
    """Dump.roles() from the parts each record has (compare/table.py), as Dump.roles reads them."""
    from .pair import split_name
    found: set = set()
    for name, parts in zip(table.names, table.parts.tolist()):
        if split_name(name)[1] is not None:
            found.update(role for role, bit in (("input", 1), ("output", 2)) if parts & bit)
            if len(found) == 2:
                break
    return frozenset(found) if found else frozenset(("input", "output"))


def _by_dependency(records: dict) -> dict:
    """`records` in the order their values are made: a module's parameter gradients after the last backward
    record of the module in the step, since they sum its calls' (the reference tool writes
    `Module.fc.Linear.parameters_grad.0` before `Module.fc.Linear.backward.0`, and with gradient accumulation
    a module's backward comes once per micro-batch): judged earlier, they came before gradients that made
    them."""
    last = {}  # module -> its last backward record
    for name in records:
        parts = name.split(".")
        if len(parts) >= 3 and parts[-2] == "backward":
            last[".".join(parts[:-2])] = name
    order, held, emitted = [], {}, set()  # held: last backward record -> parameter gradients waiting for it
    for name in records:
        parts = name.split(".")
        owner = ".".join(parts[:-2]) if len(parts) >= 3 and parts[-2] == "parameters_grad" else None
        if owner is not None and last.get(owner) is not None and last[owner] not in emitted:
            held.setdefault(last[owner], []).append(name)
            continue
        order.append(name)
        emitted.add(name)
        order.extend(held.pop(name, ()))
    if len(order) == len(records) and all(a == b for a, b in zip(order, records)):
        return records
    return {name: records[name] for name in order}


TENSOR_FOLDER = "dump_tensor_data"


def _tensor_folder(dump_json: str, folder: str, named, task: str) -> str:
    """Where the dump's tensor files are: always its own `dump_tensor_data` folder beside dump.json. The
    `dump_data_dir` it names is where the folder was when it was written: the same place, or a place the
    dump has since been moved from. It is never followed elsewhere: a dump must not make compare read files
    outside it. A dump of task tensor (whose files are compared) that names another place and has no folder of
    its own is refused, and so is a folder that is a symbolic link."""
    if named is not None and not isinstance(named, str):
        raise DumpError(f"{dump_json}: \"dump_data_dir\" is {named!r}, expected a folder path or null")
    local = os.path.join(folder, TENSOR_FOLDER)
    if task != "tensor":  # only a dump of task tensor has its files compared
        return local
    if os.path.islink(local):
        raise DumpError(f"{local}: a symbolic link (to {os.readlink(local)}): refused, tensor files are read "
                        f"only from a plain folder inside the dump")
    if named and not os.path.lexists(local) and ("\0" in named or os.path.realpath(named) != os.path.realpath(local)):
        raise DumpError(f"{dump_json}: \"dump_data_dir\" is {named!r}, outside the dump, and the dump has no "
                        f"{TENSOR_FOLDER} folder of its own: refused, tensor files are read only from {local}")
    return local


def _rank_number(name: str):
    m = _RANK.match(name)
    return int(m.group(2)) if m and m.group(2) else None


def _number_procs(found: list) -> list:
    """The reference writes proc<pid> folders with no rank: several in one step are ranks 0, 1, ... in
    sorted order (a lone one stays rank None, like `rank/`)."""
    by_step: dict = {}
    for step, rank, path in found:
        by_step.setdefault(step, []).append((step, rank, path))
    out = []
    for items in by_step.values():
        procs = [i for i in items if os.path.basename(os.path.dirname(i[2])).startswith("proc")]
        if len(procs) > 1:
            procs.sort(key=lambda i: i[2])
            numbered = {i[2]: n for n, i in enumerate(procs)}
            items = [(s, numbered.get(p, r), p) for s, r, p in items]
        out += items
    return out


def _step_number(path: str):
    m = _STEP.match(os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m else None


DATA_FILES = ("dump.json", "debug.json")  # a rank folder's data file: debug.json at level debug


def _data_file(folder: str):
    """The data file in a rank folder, or None."""
    return next((os.path.join(folder, name) for name in DATA_FILES if os.path.isfile(os.path.join(folder, name))),
                None)


def _rank_dirs(step_dir: str) -> list:
    try:
        names = os.listdir(step_dir)
    except FileNotFoundError:  # a step folder of a run still going, removed meanwhile (nothing recorded)
        return []
    # rank folders in rank order (rank2 before rank10); the reference's proc<pid> folders after them by name
    # (_number_procs numbers them in that order)
    return sorted((d for d in names if _RANK.match(d) and _data_file(os.path.join(step_dir, d))),
                  key=lambda d: (1, 0, d) if d.startswith("proc") else (0, len(d), d))


def resolve(path: str) -> list:
    """[(step, rank, dump.json path)] for whatever `path` is."""
    try:
        return _resolve(path)
    except OSError as exc:  # a folder that cannot be listed (its permission), a name too long
        raise DumpError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def _resolve(path: str) -> list:
    if not os.path.exists(path):
        raise DumpError(f"{path}: no such file or folder")
    if not os.path.isfile(path) and not os.path.isdir(path):  # never opened: a FIFO would block
        raise DumpError(f"{path}: {file_kind(os.stat(path).st_mode)}, expected a dump.json, a rank or step folder, "
                        f"or a dump root")
    if os.path.isfile(path):
        folder = os.path.dirname(os.path.abspath(path))
        return [(_step_number(os.path.dirname(folder)), _rank_number(os.path.basename(folder)), path)]
    if isinstance(path, NativeRef):
        return [(path.step, path.rank, path)]
    from ..core.mindspore_dump import is_native
    if is_native(path):   # MindSpore's own Dump: its `path`, or a rank_{id} folder of it
        return _native(path)
    base = os.path.basename(os.path.normpath(path))
    here = _data_file(path)
    if here:
        return [(_step_number(os.path.dirname(os.path.abspath(path))), _rank_number(base), here)]
    steps = sorted((d for d in os.listdir(path) if _STEP.match(d)), key=lambda d: int(d[4:]))
    if _rank_dirs(path):
        step = _step_number(path)
        return [(step, _rank_number(d), _data_file(os.path.join(path, d))) for d in _rank_dirs(path)]
    if steps:
        out = []
        for s in steps:
            out += [(int(s[4:]), _rank_number(d), _data_file(os.path.join(path, s, d)))
                    for d in _rank_dirs(os.path.join(path, s))]
        if out:
            return out
    empty = _rank_folders_without_data(path, steps)
    found = (f" {', '.join(empty[:3])}{', ...' if len(empty) > 3 else ''} "
             f"hold{'s' if len(empty) == 1 else ''} no dump.json (a run that recorded nothing there, or one still "
             f"writing);") if empty else ""
    raise DumpError(f"{path}: no dump found:{found} expected a dump.json (debug.json at level debug), a rank "
                    f"folder (rank, rank<R>, proc<pid>) holding one, a step<N> folder, or a dump root with "
                    f"step<N> folders")


def _rank_folders_without_data(path: str, steps: list) -> list:
    """The rank folders of `path` (a step folder) or of its step folders that hold no data file, relative."""
    out = []
    for step in [""] + steps:
        folder = os.path.join(path, step)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        out += [os.path.join(step, d) for d in names if _RANK.match(d) and os.path.isdir(os.path.join(folder, d))]
    return out


def pair_inputs(target: str, golden: str) -> tuple:
    """([(step, rank, target dump.json, golden dump.json)], {"target": [...], "golden": [...]}): dumps paired by
    step and rank number, not position, and the (step, rank) of each side that has no partner. A step that
    each side dumped from one process only, one of them a single-process run, pairs whatever the rank
    folders are called (`rank/` against `rank1/` of a distributed one)."""
    t, g = _number_procs(resolve(target)), _number_procs(resolve(golden))
    # one dump each: paired when the user named those very dumps (files or rank folders), or when their
    # ranks do not say they are two shards (the rule below for lone ranks)
    named = all(os.path.isfile(p) or _data_file(p) for p in (target, golden))
    if len(t) == 1 and len(g) == 1 and (named or None in (t[0][1], g[0][1]) or t[0][1] == g[0][1]):
        return [(t[0][0], t[0][1], t[0][2], g[0][2])], {"target": [], "golden": []}
    own_step = {}  # the golden's step of a key re-stepped below (for what is said as not compared)
    if len({s for s, _, _ in t}) == 1 and len({s for s, _, _ in g}) == 1 and t[0][0] != g[0][0]:
        # two step folders named, of different steps (a step of the target against another of the golden):
        # their ranks pair; compare's line notes that the steps differ
        own_step = {(t[0][0], r): s for s, r, _ in g}
        g = [(t[0][0], r, p) for _, r, p in g]
    golden_by_key = {(s, r): p for s, r, p in g}
    alone_t, alone_g = _sole_ranks(t), _sole_ranks(g)
    pairs, paired, paired_t = [], set(), set()
    for s, r, p in t:
        # one process each, one of them a single-process run (`rank/`): pair by step. Two numbered ranks that
        # differ are two shards of the data, not the same run's
        lone = s in alone_t and s in alone_g and (r is None or alone_g[s] is None)
        key = (s, r) if (s, r) in golden_by_key else (s, alone_g[s]) if lone else None
        if key is not None:
            pairs.append((s, r, p, golden_by_key[key]))
            paired.add(key)
            paired_t.add((s, r))
    if not pairs:
        raise DumpError(f"no step and rank in common between {target} ({_places(t)}) and {golden} ({_places(g)}): "
                        f"point both at the steps or rank folders to compare")
    left = {"target": [(s, r) for s, r, _ in t if (s, r) not in paired_t],
            "golden": [(own_step.get((s, r), s), r) for s, r, _ in g if (s, r) not in paired]}
    return pairs, left


def _sole_ranks(found: list) -> dict:
    """step -> its rank, for the steps dumped by one process only."""
    ranks: dict = {}
    for s, r, _ in found:
        ranks.setdefault(s, []).append(r)
    return {s: rs[0] for s, rs in ranks.items() if len(rs) == 1}


def place(step, rank) -> str:
    """`step 2 rank 1`, `step 2` (a single-process run), `rank 1` (no step folder)."""
    return " ".join(part for part in (f"step {step}" if step is not None else "",
                                      f"rank {rank}" if rank is not None else "") if part) or "the dump"


def spans(numbers: list) -> str:
    """`0-3, 5, 7-8` for [0, 1, 2, 3, 5, 7, 8]: runs of consecutive numbers joined."""
    runs: list = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _places(found: list) -> str:
    return ", ".join(place(s, r) for s, r, _ in sorted(found, key=lambda i: (i[0] if i[0] is not None else -1,
                                                                              i[1] if i[1] is not None else -1)))
