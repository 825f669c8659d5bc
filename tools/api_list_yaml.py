"""Writing an API list YAML (shared by make_api_list.py and make_ms_api_list.py): comment lines, then one
section per namespace with one name per line, so that users can edit the file by hand."""
from __future__ import annotations

import os


def write_api_list(path: str, comments: list, sections: dict) -> None:
    lines = [f"# {c}" for c in comments]
    for section, items in sections.items():
        lines.append(f"{section}:")
        lines.extend(f"  - {n}" for n in items)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print({k: len(v) for k, v in sections.items()}, "->", os.path.normpath(path))
