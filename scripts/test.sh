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
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The floors: the oldest versions pyproject.toml allows (src/reprotune/stacks/floor.txt), on which
# a focused part of the suite runs. Only with no arguments (REPROTUNE_FLOOR=1: always, =0: never).
# Their environment is installed in the background, beside mypy and the suite (one core each: 4.5
# minutes, where one after the other took 6.6 on a 2-core AMD EPYC), its log shown only if it fails.
floor="${REPROTUNE_FLOOR:-}"
floor_pid=""
if [ "$floor" = 1 ] || { [ $# -eq 0 ] && [ "$floor" != 0 ]; }; then
    floor_log="$(mktemp)"
    setsid ./scripts/install.sh floor >"$floor_log" 2>&1 </dev/null &
    floor_pid=$!  # its own process group: a failed check ends it, pip and all
    trap 'kill -- -"$floor_pid" 2>/dev/null || true; rm -f "$floor_log"' EXIT
fi
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
.venv/bin/pytest "$@"
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
        tests/trackers/test_mlflow.py tests/run/test_stack.py tests/test_install.py
fi
