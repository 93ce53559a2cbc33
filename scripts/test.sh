#!/usr/bin/env bash
# Install what the tests need into .venv (and headless Chromium for the report test), then run
# the linters and the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh dev
if [ ! -x /usr/bin/chromium ]; then
    echo "installing Debian's chromium for the HTML report test..." >&2
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
.venv/bin/pytest "$@"
