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
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
.venv/bin/pytest "$@"
# The floors: the oldest versions pyproject.toml allows (src/reprotune/stacks/floor.txt), on which
# a focused part of the suite runs. Only with no arguments (REPROTUNE_FLOOR=1: always, =0: never).
floor="${REPROTUNE_FLOOR:-}"
if [ "$floor" = 1 ] || { [ $# -eq 0 ] && [ "$floor" != 0 ]; }; then
    ./scripts/install.sh floor
    .venv-floor/bin/pytest -p no:cacheprovider \
        tests/train/test_run.py tests/train/test_resume.py tests/train/test_smollm2_e2e.py \
        tests/integrations/test_trainer_callback.py tests/integrations/test_verify_command.py \
        tests/integrations/test_sft_callback.py tests/integrations/test_trainer_resume.py \
        tests/proof/test_compare.py tests/proof/test_report.py \
        tests/trackers/test_mlflow.py tests/run/test_stack.py tests/test_install.py
fi
