"""overflow_check analysis: per rank, the first call whose inputs are finite and whose outputs hold NaN/Inf."""
from __future__ import annotations

import json
import os

from ..core.writer import make_dirs, write_atomic
from .metrics import finite
from .read import DumpError, load_dump, place, resolve
from .rows import INPUT, OUTPUT


def first_overflow(dump) -> dict | None:
    for name in dump.records:
        rows = dump.rows(name)   # a malformed record is a DumpError naming the file
        inputs_ok = all(finite(r.obj) for r in rows if r.role == INPUT and r.is_tensor)
        bad = [r.name for r in rows if r.role == OUTPUT and r.is_tensor and not finite(r.obj)]
        if bad and inputs_ok:
            chain, parent = [], dump.parents.get(name)
            while isinstance(parent, str) and parent not in chain:
                chain.append(parent)
                parent = dump.parents.get(parent)
            return {"name": name, "outputs": bad, "stack": dump.stacks.get(name, []), "parents": chain}
    return None


def analyse(path: str, output_dir: str | None = None, quiet: bool = False) -> dict:
    result = {"ranks": []}
    for step, rank, dump_json in resolve(path):
        found = first_overflow(load_dump(dump_json, step, rank))
        result["ranks"].append({"step": step, "rank": rank, "dump": dump_json, "first_overflow": found})
        if not quiet:
            where = place(step, rank)  # `step 0`, not `step 0 rank None`, for a single-process run
            if found:
                at = f" at {found['stack'][0]}".replace(", \n ", ": ") if found["stack"] else ""
                print(f"[{where}] first overflow: {found['name']} ({', '.join(found['outputs'])}){at}")
            else:
                print(f"[{where}] no call turns finite inputs into NaN/Inf")
    output_dir = output_dir or "."
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DumpError(f"{output_dir}: exists and is not a folder (expected the output folder)")
    make_dirs(output_dir)
    write_atomic(os.path.join(output_dir, "overflow_summary.json"), json.dumps(result, indent=1))
    return result
