#!/usr/bin/env bash
# The C routes under AddressSanitizer and UndefinedBehaviorSanitizer: builds the extensions with
# -fsanitize=address,undefined into a scratch copy of the working tree and runs there the tests that go
# through C routes. Any report fails the run (halt_on_error). Leak checking is off: CPython itself keeps
# memory until exit. Needs GCC with libasan (Debian: gcc); arguments go to pytest.
#     bash tools/sanitize.sh                 # the C-route tests
#     bash tools/sanitize.sh tests/test_statistics.py -x   # other tests or options (replace the list)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="$root/${MSPROBE_LITE_VENV:-.venv}/bin/python"
asan="$(gcc -print-file-name=libasan.so)"
cxx="$(gcc -print-file-name=libstdc++.so)" # loaded with it: its C++ exception interceptor needs the real one
[ -f "$asan" ] || { echo "sanitize.sh: libasan.so not found (install gcc with AddressSanitizer)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# the package and its tests, without build outputs or virtual environments
tar -C "$root" --exclude='./.venv*' --exclude='./build' --exclude='*.so' --exclude='./demo_output' \
    --exclude='./.git' -cf - pyproject.toml config.json msprobe_lite tests tools | tar -C "$work" -xf -
cd "$work"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
CFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined" \
    "$python" -c 'from setuptools import setup; setup()' build_ext --inplace -q >/dev/null
[ "$(ls msprobe_lite/*/_fast_*.so | wc -l)" -ge 6 ] || { echo "sanitize.sh: the extensions did not build" >&2; exit 1; }
tests=(tests/test_statistics.py tests/test_pytorch_l1.py tests/test_pytorch_l0.py tests/test_reliability.py
       tests/test_bitwise.py tests/test_tasks.py tests/test_user_errors.py tests/test_crash_safety.py
       tests/test_compare_table.py)
[ $# -gt 0 ] && tests=("$@")
# libasan must come first in the process; its interceptors then serve the uninstrumented interpreter too.
# Reports go to files (pytest captures stderr, and an aborted test takes it along).
mkdir -p "$work/reports"
status=0
LD_PRELOAD="$asan $cxx" ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:log_path=$work/reports/asan" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$work/reports/ubsan" PYTHONPATH="$work" \
    "$python" -m pytest -q -p no:cacheprovider "${tests[@]}" || status=$?
if compgen -G "$work/reports/*" >/dev/null; then
    cat "$work"/reports/* >&2
    status=1
fi
exit $status
