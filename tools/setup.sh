#!/usr/bin/env bash
# Builds .venv once with everything the demo and the tests need; later runs return at once.
# torch is pinned to the CPU wheel that this machine (and CI) has on disk: an unpinned torch would download
# a multi-GB CUDA build. MindSpore 2.10.0 (CPU, about 800 MB from the registry) needs numpy<2.
# Users' own installs stay unpinned (see pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MSPROBE_LITE_VENV:-.venv}"
stamp="$VENV/.ready-$(cat pyproject.toml tools/setup.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "setting up $VENV (first run only)..." >&2
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q "torch==2.13.0" "mindspore==2.10.0" "numpy<2" -e ".[test]"
  rm -f "$VENV"/.ready-*
  touch "$stamp"
fi
