"""The only code that touches dump files.

Every file is written whole to a temporary name beside its target and renamed into place, so a reader (or a
crash mid-write) never sees half a file. dump.json holds one record per line: still plain JSON, but cheap to
produce, diff and grep.
"""
from __future__ import annotations

import json
import os
import tempfile

from .records import json_default

DIR_MODE = 0o750
FILE_MODE = 0o640


def make_dirs(path: str) -> None:
    """Create `path` (and parents) with the dump's folder mode."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` so that readers see either the old file or the whole new one."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def rank_folder(rank) -> str:
    """`rank{R}` under torch.distributed / MindSpore communication, `rank` in a single-process run."""
    return "rank" if rank is None else f"rank{rank}"


def step_rank_dir(dump_path: str, step: int, rank) -> str:
    return os.path.join(dump_path, f"step{step}", rank_folder(rank))


def dump_json_text(header: dict, records) -> str:
    """dump.json: the header's keys, then `data` with one record per line, in execution order."""
    head = json.dumps(header)[:-1]  # drop the closing brace, `data` goes last
    lines = [f"{json.dumps(r.name)}: {json.dumps(r.data, default=json_default)}" for r in records]
    body = ",\n".join(lines)
    return f'{head}, "data": {{\n{body}\n}}}}\n' if lines else f'{head}, "data": {{}}}}\n'


def write_step(folder: str, header: dict, records, stack: dict | None, construct: dict | None,
               data_file: str = "dump.json") -> None:
    """Write one rank folder of one step: dump.json (or debug.json), and stack/construct when given."""
    make_dirs(folder)
    write_atomic(os.path.join(folder, data_file), dump_json_text(header, records))
    if stack is not None:
        write_atomic(os.path.join(folder, "stack.json"), json_lines(stack))
    if construct is not None:
        write_atomic(os.path.join(folder, "construct.json"), json_lines(construct))


def json_lines(mapping: dict) -> str:
    """A JSON object with one entry per line: readable, and made by the C encoder (`indent` is pure Python)."""
    if not mapping:
        return "{}\n"
    return "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in mapping.items()) + "\n}\n"
