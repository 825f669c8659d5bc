#!/usr/bin/env bash
# The MSAdapter test lane: Python 3.9 + MindSpore 2.0.0 + MSAdapter 0.1.0, the one MSAdapter stack that
# installs here (the newer MindTorch does not import with any MindSpore available). Builds .venv39 once
# (about 2.7 GB), then runs tests_msadapter/, which also dump the same script on real PyTorch through the
# main lane's Python (built by tools/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MSPROBE_LITE_VENV39:-.venv39}"
# A Python 3.9 that really runs: pyenv puts a python3.9 shim on PATH that exits 127 when 3.9 is not the
# selected version, so every candidate is tried, not just found.
is_py39() { "$1" -c 'import sys; assert sys.version_info[:2] == (3, 9)' >/dev/null 2>&1; }
if [ -n "${MSPROBE_LITE_PY39:-}" ]; then
  if ! is_py39 "$MSPROBE_LITE_PY39"; then
    echo "MSAdapter lane: MSPROBE_LITE_PY39=$MSPROBE_LITE_PY39 is not a working Python 3.9 interpreter" >&2
    exit 1
  fi
  PY39="$MSPROBE_LITE_PY39"
else
  PY39=""
  for cand in /root/.pyenv/versions/3.9.18/bin/python "$(command -v python3.9 || true)"; do
    if [ -n "$cand" ] && is_py39 "$cand"; then PY39="$cand"; break; fi
  done
  if [ -z "$PY39" ]; then
    echo "MSAdapter lane: no working Python 3.9 (tried /root/.pyenv/versions/3.9.18/bin/python and python3.9" \
         "on PATH); set MSPROBE_LITE_PY39 to a Python 3.9 interpreter" >&2
    exit 1
  fi
fi
bash tools/setup.sh
stamp="$VENV/.ready-$(cat pyproject.toml tools/test_msadapter.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "setting up $VENV for the MSAdapter lane (first run only)..." >&2
  "$PY39" -m venv "$VENV"
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q "mindspore==2.0.0" "msadapter==0.1.0" "numpy<1.24" \
    "pillow<10" "protobuf<4" typing_extensions "pydantic>=2" pyyaml zlib-ng orjson polars pytest
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q --no-deps -e .
  rm -f "$VENV"/.ready-*
  touch "$stamp"
fi
export MSPROBE_LITE_TORCH_PYTHON="$PWD/${MSPROBE_LITE_VENV:-.venv}/bin/python"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests_msadapter "$@"
