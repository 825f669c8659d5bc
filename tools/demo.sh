#!/usr/bin/env bash
# The main job: dump a small transformer's training steps and show what was dumped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec "${MSPROBE_LITE_VENV:-.venv}/bin/python" tools/demo.py "$@"
