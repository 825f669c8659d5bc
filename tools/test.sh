#!/usr/bin/env bash
# The whole test suite (what CI runs): the main lane (Python 3.11, PyTorch, MindSpore 2.10), then the
# MSAdapter lane (Python 3.9, MindSpore 2.0 + MSAdapter; tools/test_msadapter.sh). Arguments go to the
# main lane's pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
"${MSPROBE_LITE_VENV:-.venv}/bin/python" -m pytest -q "$@"
bash tools/test_msadapter.sh
