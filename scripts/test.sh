#!/usr/bin/env bash
# Install what the tests need into .venv (and, from Debian, headless Chromium for the report test
# and QEMU's user mode for the emulated Intel CPU of tests/determinism/test_isa_emulated.py), then
# run the linters and the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh dev
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ "$(uname -m)" != x86_64 ] || [ -x /usr/bin/qemu-x86_64 ] || missing+=(qemu-user)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian's ${missing[*]} for the tests..." >&2
    if [ "$(id -u)" = 0 ]; then
        sudo=""
    elif command -v sudo >/dev/null; then
        sudo="sudo"
    else
        echo "scripts/test.sh: the tests need Debian's ${missing[*]}, not installed here, and installing" >&2
        echo "them needs root: this user is not root and there is no sudo. As root, run" >&2
        echo "  apt-get install ${missing[*]}" >&2
        echo "then run this again." >&2
        exit 1
    fi
    if ! command -v apt-get >/dev/null; then
        echo "scripts/test.sh: the tests need ${missing[*]} (Debian's packages), not installed here, and" >&2
        echo "there is no apt-get to install them: install them with this system's package manager." >&2
        exit 1
    fi
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two jobs run beside the suite, which keeps about 1.1 of 2 cores busy: mypy (one core, 2.5 minutes
# on a 2-core AMD EPYC with AVX2 only) and installing the floors' environment (4.5 minutes). Each
# has its own process group (a failed check ends it, children and all) and its output in a file:
# mypy's is shown after the suite, the install's only if it fails.
# The floors: the oldest versions pyproject.toml allows (src/reprotune/stacks/floor.txt), on which
# a focused part of the suite runs. Only with no arguments (REPROTUNE_FLOOR=1: always, =0: never).
floor="${REPROTUNE_FLOOR:-}"
mypy_log="$(mktemp)" floor_log="$(mktemp)" mypy_pid="" floor_pid=""
# shellcheck disable=SC2154  # pid is the trap's own loop variable
trap 'for pid in $mypy_pid $floor_pid; do kill -- -"$pid" 2>/dev/null || true; done; rm -f "$mypy_log" "$floor_log"' EXIT
if [ "$floor" = 1 ] || { [ $# -eq 0 ] && [ "$floor" != 0 ]; }; then
    setsid ./scripts/install.sh floor >"$floor_log" 2>&1 </dev/null &
    floor_pid=$!
fi
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
setsid .venv/bin/mypy >"$mypy_log" 2>&1 </dev/null &
mypy_pid=$!
echo "mypy runs beside the tests; its verdict follows them"
pytest_rc=0 mypy_rc=0
# tests/proof/test_cross_stack.py needs both environments: it runs in the floors' part, after
# their install, and here only when an argument names it.
cross_stack=(--ignore=tests/proof/test_cross_stack.py)
for arg in "$@"; do
    case "$arg" in *test_cross_stack*) cross_stack=() ;; esac
done
.venv/bin/pytest "${cross_stack[@]}" "$@" || pytest_rc=$?
wait "$mypy_pid" || mypy_rc=$?
cat "$mypy_log"
[ "$pytest_rc" = 0 ] || exit "$pytest_rc"
[ "$mypy_rc" = 0 ] || exit "$mypy_rc"
if [ -n "$floor_pid" ]; then
    if ! wait "$floor_pid"; then
        cat "$floor_log" >&2
        echo "installing the floors' environment (.venv-floor) failed: its log is above" >&2
        exit 1
    fi
    .venv-floor/bin/pytest -p no:cacheprovider \
        tests/train/test_run.py tests/train/test_resume.py tests/train/test_smollm2_e2e.py \
        tests/integrations/test_trainer_callback.py tests/integrations/test_verify_command.py \
        tests/integrations/test_sft_callback.py tests/integrations/test_trainer_resume.py \
        tests/proof/test_compare.py tests/proof/test_report.py \
        tests/trackers/test_mlflow.py tests/run/test_stack.py tests/test_install.py \
        tests/proof/test_cross_stack.py
fi
