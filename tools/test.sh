#!/usr/bin/env bash
# The whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec "${MSPROBE_LITE_VENV:-.venv}/bin/python" -m pytest -q "$@"
