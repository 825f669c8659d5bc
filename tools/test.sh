#!/usr/bin/env bash
# The whole test suite (what CI runs): the main lane (Python 3.11, PyTorch, MindSpore 2.10) twice, with the C
# routes and with MSPROBE_LITE_PURE_PYTHON=1 (every record from the Python routes: what a machine without a
# C compiler runs), then the MSAdapter lane (Python 3.9, MindSpore 2.0 + MSAdapter; tools/test_msadapter.sh).
# Arguments go to both runs of the main lane.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# report.html is tested in headless Chromium (tests/test_report_html.py): Debian's package where it is missing
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  echo "installing chromium for the report.html test..." >&2
  (apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium) \
    || sudo apt-get install -y -q chromium) >/dev/null 2>&1 \
    || echo "could not install chromium (needs apt-get as root): tests/test_report_html.py will fail" >&2
fi
python="${MSPROBE_LITE_VENV:-.venv}/bin/python"
# every lane runs, whatever an earlier one found; the run fails at the end if any did, naming them
failed=()
echo "== main lane, C routes" >&2
"$python" -m pytest -q "$@" || failed+=("main lane, C routes")
echo "== main lane, Python routes (MSPROBE_LITE_PURE_PYTHON=1)" >&2
MSPROBE_LITE_PURE_PYTHON=1 "$python" -m pytest -q "$@" || failed+=("main lane, Python routes")
echo "== MSAdapter lane" >&2
bash tools/test_msadapter.sh || failed+=("MSAdapter lane")
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
